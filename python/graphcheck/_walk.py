"""The registry walk: every tensor a model (or any object) reaches, with every owner path
that reaches it, read without running user code (:func:`walk`, :func:`walk_roots`), into a
:class:`graphcheck._registry.Registry`: one record per storage view (data pointer, shape,
stride, dtype), with every owner path that reaches it
(``model.layers[0].mlp.quant_method.kernel.workspace``, in the core's path grammar) and how
that path holds it — the ``registration`` of format v1:

- ``parameter``, ``buffer``, ``buffer_non_persistent`` (``_non_persistent_buffers_set``):
  from a module's ``_parameters`` and ``_buffers``;
- ``held``: a buffer named ``_held_*`` (vLLM's ``register_held_tensors``), or a tensor a
  non-module object lists in its ``persistent_tensors()``;
- ``module_attribute``: a plain attribute of a module; ``object_attribute``: an attribute
  of any other object (quant methods, kernel objects, dataclasses);
- ``container``: an element of a dict, list or tuple; ``partial``: an argument or keyword
  of a ``functools.partial``; ``closure``: a closure cell (or default argument) of a
  function;
- ``runtime_state``: any owner whose path matches one of the caller's ``runtime_state``
  globs (KV caches, per-step scratch).

A tensor subclass with ``__tensor_flatten__`` (TorchAO and other traceable wrappers) is
replaced by its inner tensors (``weight.qdata``), which keep the outer registration: they
are what kernels read, and they are restored with the wrapper.

The walk is read-only. It reads ``__dict__`` and ``__slots__`` directly instead of calling
``getattr``, so properties and ``__getattr__`` hooks never run; the only user code it calls
is ``persistent_tensors()``, the protocol whose purpose is to be called, and
``__tensor_flatten__``. Modules are followed through ``_modules`` without a depth limit (the
module tree is what ``named_modules()`` walks); from each module, chains of non-module
objects and containers are followed to ``max_depth`` hops (default 8). Every object is
entered once, so cycles end, and an object reached through two paths is listed under the
first. What the walk could not read is listed in :attr:`Registry.skipped`, as ``(owner path,
why)``: among them any value whose reading raised (``isinstance`` asks a lazy proxy's
``__class__``; a dict subclass's ``items()``, a ``__dict__`` property, a tensor subclass's
properties run their code), with the exception's type and message; the walk goes on past it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Any, Iterable, Mapping, Optional, Union

from . import _args, _native
from ._native import GraphcheckError
from ._paths import attr_hop, child_hop, key_hop
from ._registry import Registry, exception_text, gc_paused
from ._torch_import import import_torch

__all__ = ["DEFAULT_MAX_DEPTH", "root_arg", "root_pairs", "walk", "walk_roots"]

#: Hops of non-module objects and containers followed from each module.
DEFAULT_MAX_DEPTH = 8

# Attribute names `nn.Module.__init__` sets: its registries (walked on their own) and hooks.
_MODULE_INTERNALS = frozenset(
    {
        "training",
        "_parameters",
        "_buffers",
        "_non_persistent_buffers_set",
        "_backward_pre_hooks",
        "_backward_hooks",
        "_is_full_backward_hook",
        "_forward_hooks",
        "_forward_hooks_with_kwargs",
        "_forward_hooks_always_called",
        "_forward_pre_hooks",
        "_forward_pre_hooks_with_kwargs",
        "_state_dict_hooks",
        "_state_dict_pre_hooks",
        "_load_state_dict_pre_hooks",
        "_load_state_dict_post_hooks",
        "_modules",
    }
)

# Values that hold no tensor: never entered.
_ATOMS = (
    type(None),
    bool,
    int,
    float,
    complex,
    str,
    bytes,
    bytearray,
    memoryview,
    range,
    slice,
    type,
    types.ModuleType,
    types.BuiltinFunctionType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    type(Ellipsis),
    type(NotImplemented),
)


_TENSOR, _LEAF, _MODULE, _OTHER = "tensor", "leaf", "module", "other"


def _type_name(obj: Any) -> str:
    return type(obj).__name__


class _Walker:
    def __init__(self, registry: Registry, max_depth: int):
        torch = import_torch()
        self.torch = torch
        self.Tensor = torch.Tensor
        self.Module = torch.nn.Module
        self.reg = registry
        self.max_depth = max_depth
        # Objects entered, by id; the objects themselves are kept so that an id cannot be
        # reused by a temporary (a persistent_tensors() result) during the walk.
        self.entered: dict = {}
        self.strided = torch.strided
        self.plain = frozenset({torch.Tensor, torch.nn.Parameter})
        # Value type -> _TENSOR, _LEAF, _MODULE or _OTHER (isinstance against two dozen
        # leaf types per value is most of a walk's traversal time).
        self.kinds: dict = {}
        # Type -> how container_or_object enters it; type -> its slot descriptors.
        self.shapes: dict = {}
        self.slots: dict = {}
        # Tensor type -> whether it is a wrapper subclass to flatten (__tensor_flatten__);
        # whether it is torch.compile's FakeTensor (metadata without memory).
        self.wrapper_types: dict = {}
        self.fake_types: dict = {}
        self.leaf_types = _ATOMS + (
            torch.dtype,
            torch.device,
            torch.Size,
            torch.layout,
            torch.memory_format,
            torch.Generator,
        )

    def skip(self, path: str, e: BaseException, what: str = "reading it") -> None:
        """Lists what the walk could not read because reading it raised (a lazy proxy, a
        property, a container whose ``items()`` or an object whose ``__dict__`` raises) in
        :attr:`Registry.skipped`; the walk goes on with the next value. One such value
        must not fail every manifest and replay check while it is there."""
        self.reg.skipped.append((path, f"{what} raised {exception_text(e)}"))

    # Modules: the tree first, so that parameters and buffers get their canonical paths
    # even where a plain attribute also reaches the module.
    def module_tree(self, root, path: str) -> None:
        order = []
        stack = [(root, path)]
        while stack:
            mod, p = stack.pop()
            if id(mod) in self.entered:
                continue
            self.entered[id(mod)] = mod
            order.append((mod, p))
            try:
                self.module_tensors(mod, p)
            except Exception as e:  # noqa: BLE001 - listed in skipped, the walk goes on
                self.skip(p, e, "reading its parameters and buffers")
            try:
                children = list((mod.__dict__.get("_modules") or {}).items())
            except Exception as e:  # noqa: BLE001
                self.skip(p, e, "reading its submodules")
                continue
            for name, child in reversed(children):
                if child is not None:
                    stack.append((child, child_hop(p, name)))
        for mod, p in order:
            try:
                self.module_attributes(mod, p)
            except Exception as e:  # noqa: BLE001
                self.skip(p, e, "reading its attributes")

    def module_tensors(self, mod, path: str) -> None:
        d = mod.__dict__
        holder = _type_name(mod)
        plain = self.plain
        strided = self.strided
        add = self.reg.add
        for name, p in (d.get("_parameters") or {}).items():
            if p is None:
                continue
            # The common case inline: a plain strided parameter on a real device.
            if type(p) in plain and p.layout is strided and not p.is_meta:
                add(p, attr_hop(path, name), "parameter", holder)
            else:
                self.tensor(p, attr_hop(path, name), "parameter", holder, 0)
        non_persistent = d.get("_non_persistent_buffers_set") or set()
        for name, b in (d.get("_buffers") or {}).items():
            if b is None:
                continue
            if name.startswith("_held_"):
                registration = "held"
            elif name in non_persistent:
                registration = "buffer_non_persistent"
            else:
                registration = "buffer"
            self.tensor(b, attr_hop(path, name), registration, holder, 0)

    def module_attributes(self, mod, path: str) -> None:
        kinds = self.kinds
        items = [
            (name, value)
            for name, value in mod.__dict__.items()
            if name not in _MODULE_INTERNALS and kinds.get(type(value)) is not _LEAF
        ]
        if not items:
            return
        holder = _type_name(mod)
        for name, value in items:
            self.value(value, attr_hop(path, name), "module_attribute", holder, 0)

    def kind(self, v) -> str:
        cls = type(v)
        k = self.kinds.get(cls)
        if k is None:
            if isinstance(v, self.Tensor):
                k = _TENSOR
            elif isinstance(v, self.leaf_types) or isinstance(v, _enum_type()):
                k = _LEAF
            elif isinstance(v, self.Module):
                k = _MODULE
            else:
                k = _OTHER
            self.kinds[cls] = k
        return k

    def value(self, v, path: str, registration: str, holder: Optional[str], depth: int) -> None:
        # Reading a value runs its type's code (isinstance asks a proxy's __class__; a
        # dict subclass's items(), a __dict__ property): what raises is skipped, saying
        # why, and its siblings are still walked (each nested value catches its own).
        try:
            k = self.kind(v)
            if k is _TENSOR:
                self.tensor(v, path, registration, holder, depth)
                return
            if k is _LEAF:
                return
            if k is _MODULE:
                if id(v) not in self.entered:
                    self.module_tree(v, path)
                return
            if id(v) in self.entered:
                return
            if depth >= self.max_depth:
                self.reg.skipped.append((path, f"deeper than max_depth={self.max_depth}"))
                return
            self.entered[id(v)] = v
            self.container_or_object(v, path, depth + 1)
        except Exception as e:  # noqa: BLE001 - listed in skipped, the walk goes on
            self.skip(path, e)

    def shape(self, v) -> str:
        """How :meth:`container_or_object` enters ``v``, cached per type."""
        cls = type(v)
        shape = self.shapes.get(cls)
        if shape is None:
            if isinstance(v, dict):
                shape = "dict"
            elif isinstance(v, (list, tuple)) or _is_deque(v):
                shape = "sequence"
            elif isinstance(v, (set, frozenset)):
                shape = "set"
            elif isinstance(v, functools.partial):
                shape = "partial"
            elif isinstance(v, types.FunctionType):
                shape = "function"
            elif isinstance(v, types.MethodType):
                shape = "method"
            else:
                shape = "object"
            self.shapes[cls] = shape
        return shape

    def container_or_object(self, v, path: str, depth: int) -> None:
        name = _type_name(v)
        kinds = self.kinds
        shape = self.shape(v)
        if shape == "object":
            self.obj(v, path, depth)
        elif shape == "dict":
            for k, x in list(v.items()):
                if kinds.get(type(x)) is not _LEAF:
                    try:
                        hop = key_hop(path, k)  # str() of the key: its type's code
                    except Exception as e:  # noqa: BLE001 - that entry skipped, not the dict
                        self.skip(path, e, f"naming its key of type {_type_name(k)}")
                        continue
                    self.value(x, hop, "container", name, depth)
        elif shape == "sequence":
            for i, x in enumerate(list(v)):
                if kinds.get(type(x)) is not _LEAF:
                    self.value(x, key_hop(path, i), "container", name, depth)
        elif shape == "set":
            # Unordered: no stable path to give an element.
            if any(isinstance(x, self.Tensor) for x in v):
                self.reg.skipped.append((path, "tensors in a set have no owner path"))
        elif shape == "partial":
            self.value(v.func, attr_hop(path, "func"), "object_attribute", name, depth)
            for i, x in enumerate(v.args):
                self.value(x, key_hop(attr_hop(path, "args"), i), "partial", name, depth)
            for k, x in (v.keywords or {}).items():
                self.value(x, key_hop(attr_hop(path, "keywords"), k), "partial", name, depth)
        elif shape == "function":
            self.function(v, path, depth)
        else:  # a bound method
            self.value(v.__func__, attr_hop(path, "__func__"), "object_attribute", name, depth)
            self.value(v.__self__, attr_hop(path, "__self__"), "object_attribute", name, depth)

    def function(self, f, path: str, depth: int) -> None:
        name = _type_name(f)
        cells = f.__closure__ or ()
        for var, cell in zip(f.__code__.co_freevars, cells):
            try:
                x = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            self.value(x, key_hop(attr_hop(path, "__closure__"), var), "closure", name, depth)
        # Default arguments are captured like closure cells (`lambda x, w=w: …`).
        for i, x in enumerate(f.__defaults__ or ()):
            self.value(x, key_hop(attr_hop(path, "__defaults__"), i), "closure", name, depth)
        for k, x in (f.__kwdefaults__ or {}).items():
            self.value(x, key_hop(attr_hop(path, "__kwdefaults__"), k), "closure", name, depth)

    def obj(self, v, path: str, depth: int) -> None:
        holder = _type_name(v)
        held = self.held_tensors(v, path)
        held_ids = {id(t) for _, t in held}
        attrs = _object_attributes(v, self.slots)
        attr_tensor_ids = set()
        kinds = self.kinds
        for name, x in attrs:
            k = kinds.get(type(x))
            if k is _LEAF:
                continue
            if k is None:
                try:
                    k = self.kind(x)
                except Exception as e:  # noqa: BLE001 - that attribute skipped, not `v`
                    self.skip(attr_hop(path, name), e)
                    continue
            if k is _TENSOR:
                attr_tensor_ids.add(id(x))
                registration = "held" if id(x) in held_ids else "object_attribute"
                self.tensor(x, attr_hop(path, name), registration, holder, depth)
            else:
                self.value(x, attr_hop(path, name), "object_attribute", holder, depth)
        # Listed tensors no attribute holds directly get the protocol's own path.
        for hop, t in held:
            if id(t) not in attr_tensor_ids:
                self.tensor(t, hop, "held", holder, depth)

    def held_tensors(self, v, path: str) -> list:
        """``(path, tensor)`` for what ``v.persistent_tensors()`` lists, if ``v`` has it."""
        method = _class_attribute(type(v), "persistent_tensors")
        if not callable(method):
            return []
        base = attr_hop(path, "persistent_tensors()")
        try:
            listed = v.persistent_tensors()
            self.entered[id(listed)] = listed
            if isinstance(listed, Mapping):
                items = [(key_hop(base, k), t) for k, t in listed.items()]
            else:
                items = [(key_hop(base, i), t) for i, t in enumerate(listed or ())]
            return [(p, t) for p, t in items if isinstance(t, self.Tensor)]
        except Exception as e:  # noqa: BLE001 - a broken protocol method is reported
            self.skip(base, e, "persistent_tensors()")
            return []

    def tensor(self, t, path: str, registration: str, holder: Optional[str], depth: int) -> None:
        # A tensor subclass's properties (layout, is_meta) run its code: what raises is
        # skipped, saying why.
        try:
            cls = type(t)
            wrapper = self.wrapper_types.get(cls)
            if wrapper is None:
                wrapper = self.wrapper_types[cls] = _class_attribute(
                    cls, "__tensor_flatten__"
                ) is not None and cls not in (self.Tensor, self.torch.nn.Parameter)
            if wrapper:
                if depth >= self.max_depth:
                    self.reg.skipped.append((path, f"deeper than max_depth={self.max_depth}"))
                    return
                try:
                    names, _ = t.__tensor_flatten__()
                except Exception as e:  # noqa: BLE001
                    self.skip(path, e, "__tensor_flatten__")
                    return
                for name in names:
                    inner = _instance_attribute(t, name)
                    if isinstance(inner, self.Tensor):
                        self.tensor(inner, attr_hop(path, name), registration, holder, depth + 1)
                return
            if t.layout is not self.strided:
                self.reg.skipped.append((path, f"layout {t.layout} is not strided"))
                return
            fake = self.fake_types.get(cls)
            if fake is None:
                fake = self.fake_types[cls] = _is_fake_class(cls)
            if fake:
                # Reading its storage's address warns and gives 0: there is no memory.
                self.reg.skipped.append((path, "fake tensor (FakeTensorMode): no memory"))
                return
            if t.is_meta:
                self.reg.skipped.append((path, "meta tensor: no storage"))
                return
            self.reg.add(t, path, registration, holder)
        except Exception as e:  # noqa: BLE001 - listed in skipped, the walk goes on
            self.skip(path, e)


def _enum_type():
    import enum

    return enum.Enum


def _is_deque(v) -> bool:
    import collections

    return isinstance(v, collections.deque)


def _class_attribute(cls: type, name: str):
    """``name`` from the class's MRO dicts, without running descriptors."""
    for c in cls.__mro__:
        if name in c.__dict__:
            return c.__dict__[name]
    return None


def _instance_attribute(obj, name: str):
    """An instance attribute read from ``__dict__`` or a slot, never through a property;
    ``None`` when it is neither."""
    d = _instance_dict(obj)
    if d is not None and name in d:
        return d[name]
    slot = _class_attribute(type(obj), name)
    if isinstance(slot, types.MemberDescriptorType):
        try:
            return slot.__get__(obj, type(obj))
        except AttributeError:
            return None
    return None


def _instance_dict(obj) -> Optional[dict]:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except (AttributeError, TypeError):
        return None
    return d if isinstance(d, dict) else None


def _slot_members(cls: type) -> tuple:
    """``(name, member descriptor)`` of every slot along ``cls``'s MRO, first one per
    name."""
    out = []
    seen = set()
    for c in cls.__mro__:
        for name, member in list(c.__dict__.items()):
            if name in seen or not isinstance(member, types.MemberDescriptorType):
                continue
            seen.add(name)
            out.append((name, member))
    return tuple(out)


def _object_attributes(obj, slots_cache: Optional[dict] = None) -> list:
    """``(name, value)`` of an object's instance ``__dict__`` and filled ``__slots__``, in
    definition order. Dataclasses with ``slots=True`` are covered by the slots.
    ``slots_cache`` keeps each type's slot list across calls."""
    cls = type(obj)
    slots = None if slots_cache is None else slots_cache.get(cls)
    if slots is None:
        slots = _slot_members(cls)
        if slots_cache is not None:
            slots_cache[cls] = slots
    d = _instance_dict(obj)
    out = list(d.items()) if d is not None else []
    for name, member in slots:
        if d is not None and name in d:
            continue
        try:
            out.append((name, member.__get__(obj, cls)))
        except AttributeError:  # an unfilled slot
            continue
    return out


def walk(
    model,
    *,
    root: str = "model",
    max_depth: int = DEFAULT_MAX_DEPTH,
    runtime_state: Iterable[str] = (),
) -> Registry:
    """The owner registry of ``model`` (an ``nn.Module``, or any object) under the root
    name ``root``. Owners whose path matches a ``runtime_state`` glob (``*`` any run but
    ``.``, ``**`` across hops: the allowlist's rule) get the registration
    ``runtime_state``: a list of globs (a single string is an error, not a list of its
    letters)."""
    return walk_roots(
        [(_args.text("root", root), model)], max_depth=max_depth, runtime_state=runtime_state
    )


def walk_roots(
    roots: Union[Mapping[str, Any], Iterable[tuple]],
    *,
    max_depth: int = DEFAULT_MAX_DEPTH,
    runtime_state: Iterable[str] = (),
) -> Registry:
    """One owner registry over several roots (``{"model": model, "draft": draft}`` or
    ``(root, object)`` pairs), walked in order into one registry: an object two roots reach
    is listed under the first. :func:`walk` is the one-root case."""
    pairs = root_pairs("roots", roots)
    max_depth = _args.integer("max_depth", max_depth, minimum=0)
    globs = _args.strings("runtime_state", runtime_state, "owner-path globs")
    names = [r for r, _ in pairs]
    if len(set(names)) != len(names):
        raise GraphcheckError(f"root names must differ: {names}")
    for r in names:
        _native.check_path(r)
    registry = Registry(names[0] if names else "model")
    walker = _Walker(registry, max_depth)
    with gc_paused():
        for root, model in pairs:
            # A module enters its tree; a root whose reading raises is skipped, saying why.
            walker.value(model, root, "object_attribute", None, 0)
    if globs:
        paths = [o.path for o in registry.owners]
        hits = [False] * len(paths)
        for g in globs:
            hits = [a or b for a, b in zip(hits, _native.glob_match(g, paths))]
        registry.owners = [
            dataclasses.replace(o, registration="runtime_state") if hit else o
            for o, hit in zip(registry.owners, hits)
        ]
    return registry


def _is_fake_class(cls) -> bool:
    """Whether tensors of ``cls`` are FakeTensors (none exist unless torch loaded them)."""
    import sys

    fake = sys.modules.get("torch._subclasses.fake_tensor")
    return fake is not None and issubclass(cls, getattr(fake, "FakeTensor", ()))


def root_arg(name: str, obj: Any) -> Any:
    """``obj`` where it can hold tensors (a module, any object or container); ``None``, a
    number, a string and the like are an error naming ``name``: a root that holds nothing
    would record every address as ownerless without a word."""
    if isinstance(obj, _ATOMS):
        raise GraphcheckError(
            f"{name} is the model or another object holding tensors, not {_args.show(obj)}"
        )
    return obj


def root_pairs(name: str, roots: Any) -> list:
    """``(root name, object)`` pairs from a mapping or an iterable of pairs; a root name is
    a string."""
    pairs: list
    if isinstance(roots, Mapping):
        pairs = list(roots.items())
    elif isinstance(roots, (str, bytes)) or not _args.iterable(roots):
        raise GraphcheckError(
            f"{name} is a mapping of root name to object, or (name, object) pairs, "
            f"not {_args.show(roots)}"
        )
    else:
        pairs = []
        for i, pair in enumerate(roots):
            if not isinstance(pair, (tuple, list)) or len(pair) != 2:
                raise GraphcheckError(
                    f"{name}[{i}] is a (root name, object) pair, not {_args.show(pair)}"
                )
            pairs.append(pair)
    return [(_args.text(f"{name}: a root name", r), obj) for r, obj in pairs]
