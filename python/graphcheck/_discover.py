"""Finding the model with no ``register_model`` call (zero-code attach): at the first
capture of an instrumentation that has no root, the top-level ``torch.nn.Module`` objects
alive in the process become its roots.

The rule: every ``nn.Module`` the garbage collector tracks that holds at least one
parameter or buffer somewhere in its tree and is no other such module's child (through
``_modules``) is a root. A torch.compile wrapper (``OptimizedModule``) stands for the
module it wraps (``_orig_mod``): the owner paths are the model's own. Names are stable
across runs: the class name in snake case (``LlamaForCausalLM`` → ``llama_for_causal_lm``),
and where two roots share a class, ``_1``, ``_2``… in the order of their size (parameter
and buffer bytes, largest first) and then of their parameter names and shapes.

Discovery reads objects and ``_modules``/``_parameters``/``_buffers`` dictionaries only: no
``getattr``, no property, no user code. Where it picks the wrong objects (a teacher and a
student, a reference copy kept for comparison), name the roots yourself:
``instrument(model=...)`` or ``register_model(obj, root)``; an explicit root replaces the
discovered ones, and ``instrument(discover=False)`` turns discovery off.
"""

from __future__ import annotations

import gc
import re
from typing import Optional

__all__ = ["discover", "snake", "top_level_modules"]


def _module_type(torch):
    return torch.nn.Module


def _children(module) -> list:
    d = getattr(module, "__dict__", {})
    mods = d.get("_modules")
    return [m for m in mods.values() if m is not None] if isinstance(mods, dict) else []


def _own_tensors(module) -> list:
    d = getattr(module, "__dict__", {})
    out: list = []
    for key in ("_parameters", "_buffers"):
        entries = d.get(key)
        if isinstance(entries, dict):
            out.extend((name, t) for name, t in entries.items() if t is not None)
    return out


def _unwrap(module, module_type):
    """A torch.compile ``OptimizedModule`` stands for the module it wraps."""
    for _ in range(4):
        d = getattr(module, "__dict__", {})
        inner = d.get("_orig_mod")
        if inner is None and isinstance(d.get("_modules"), dict):
            inner = d["_modules"].get("_orig_mod")  # set through Module.__setattr__
        if type(module).__name__ == "OptimizedModule" and isinstance(inner, module_type):
            module = inner
        else:
            break
    return module


def snake(name: str) -> str:
    """``LlamaForCausalLM`` → ``llama_for_causal_lm``; a valid owner-path root."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s).lower()
    s = re.sub(r"[^a-z0-9_]", "_", s).strip("_") or "module"
    return s if not s[0].isdigit() else f"m_{s}"


def top_level_modules(torch) -> list:
    """``(root name, module)`` of the top-level modules alive now, named by the rule of
    the module docstring, in name order."""
    module_type = _module_type(torch)
    modules = []
    is_module: dict = {}
    for o in gc.get_objects():
        # type(), not isinstance(): no __class__ hook of a proxy runs; one issubclass per
        # type, not per object (a process holds hundreds of thousands).
        t = type(o)
        hit = is_module.get(t)
        if hit is None:
            hit = is_module[t] = issubclass(t, module_type)
        if hit:
            modules.append(o)
    unwrapped = {}
    for m in modules:
        u = _unwrap(m, module_type)
        unwrapped[id(u)] = u
    child_ids = set()
    for m in unwrapped.values():
        for c in _children(m):
            child_ids.add(id(_unwrap(c, module_type)))
    # A wrapper's inner module is not a child of the wrapper (it stands for it).
    stats = {}
    for key, m in unwrapped.items():
        if key in child_ids:
            continue
        size, signature, seen, stack = 0, [], set(), [("", m)]
        while stack:
            prefix, cur = stack.pop()
            if id(cur) in seen:
                continue
            seen.add(id(cur))
            for name, t in _own_tensors(cur):
                try:
                    size += int(t.numel()) * int(t.element_size())
                    signature.append((prefix + name, tuple(t.shape)))
                except Exception:  # noqa: BLE001 - an odd tensor subclass: not counted
                    pass
            for cname, c in getattr(cur, "__dict__", {}).get("_modules", {}).items():
                if c is not None:
                    stack.append((f"{prefix}{cname}.", c))
        if signature:
            stats[key] = (m, size, sorted(signature))
    by_class: dict = {}
    for m, size, signature in stats.values():
        by_class.setdefault(snake(type(m).__name__), []).append((-size, signature, m))
    out = []
    for base, group in by_class.items():
        group.sort(key=lambda e: (e[0], e[1]))
        for i, (_, _, m) in enumerate(group):
            out.append((base if len(group) == 1 else f"{base}_{i + 1}", m))
    return sorted(out, key=lambda e: e[0])


def discover(torch) -> Optional[list]:
    """:func:`top_level_modules`, or ``None`` where none holds a tensor."""
    found = top_level_modules(torch)
    return found or None
