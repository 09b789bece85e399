"""The layout of the Python package: its modules import one way (no circle), as ORDER lists
them, at every depth and in every form; no module reads another's private names; every
module lists its ``__all__``; and importing the package, graphcheck.torch included, does
not import torch."""

import ast
import os
import subprocess
import sys
from pathlib import Path

import graphcheck

PACKAGE = Path(graphcheck.__file__).resolve().parent

#: Every module of the package, each importing only those before it (names relative to
#: the package; a package is its ``__init__``: ``__init__`` is graphcheck itself,
#: ``_instrument`` the instrumentation's). A module on disk that is not here fails.
ORDER = [
    "_native",  # the compiled core, seen through its stub (_native.pyi)
    "_args",
    "_api",
    "__init__",
    "cli",
    "__main__",
    "_torch_import",
    "_producer",
    "_caching_allocator",
    "_sleep_state",
    "sleep",
    "_paths",
    "_tensors",
    "_digest",
    "_ranges",
    "_registry",
    "_lifetimes",
    "_walk",
    "_snapshot",
    "_recorder",
    "_capture",
    "_retarget",
    "_discover",
    "_instrument.host",
    "_instrument.trees",
    "_instrument.transitions",
    "_instrument.replay_check",
    "_instrument.writer",
    "_instrument.patch",
    "_instrument.instrumentation",
    "_instrument",
    "_autoinstrument",
    "torch",
    "syrupy",
    "pytest_plugin",
]


def modules() -> dict:
    """Every module of the package on disk (``__pycache__`` aside), name → file; the
    compiled ``_native`` by its stub."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        out[".".join(parts)] = path
    for stub in PACKAGE.glob("*.pyi"):
        out.setdefault(stub.stem, stub)
    return out


MODULES = modules()


def full_name(name: str) -> str:
    return "graphcheck" if name == "__init__" else f"graphcheck.{name}"


def local_name(full: str):
    """The ORDER name of a module's full name, or ``None`` outside the package."""
    if full == "graphcheck":
        return "__init__"
    if full.startswith("graphcheck."):
        name = full[len("graphcheck.") :]
        return name if name in MODULES else None
    return None


def parse(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text(), str(MODULES[name]))


def package_of(name: str) -> str:
    """The package a module's relative imports start from."""
    full = full_name(name)
    return full if MODULES[name].name == "__init__.py" else full.rpartition(".")[0]


def source_of(node: ast.ImportFrom, package: str) -> str:
    """The full name of the module ``from <module> import ...`` reads."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def statements(name: str) -> list:
    """``(node, full name of the module it reads, alias)`` per name of every import
    statement of ``name`` at any depth (function bodies, ``if`` blocks, ``TYPE_CHECKING``),
    in every form: ``import graphcheck.x [as y]``, ``from graphcheck.x import y``, ``from .
    import x``, ``from .x import y``, ``from .. import x``, ``from ..x import y``."""
    package = package_of(name)
    out = []
    for node in ast.walk(parse(name)):
        if isinstance(node, ast.Import):
            out.extend((node, alias.name, alias) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = source_of(node, package)
            out.extend((node, source, alias) for alias in node.names)
    return out


def imports(name: str) -> list:
    """``(imported module, line)`` for every import of the package's modules in ``name``
    (:func:`statements`): a name that is a module counts as that module, any other name as
    the module it comes from."""
    out = []
    for node, source, alias in statements(name):
        target = local_name(source)
        if isinstance(node, ast.ImportFrom):
            target = local_name(f"{source}.{alias.name}") or target
        if target is not None:
            out.append((target, node.lineno))
    return out


def names_from(name: str) -> list:
    """``(module, imported name, line)`` of every ``from <module> import <name>`` of
    ``name`` whose name is not a module itself."""
    out = []
    for node, source, alias in statements(name):
        if isinstance(node, ast.ImportFrom) and local_name(source) is not None:
            if local_name(f"{source}.{alias.name}") is None:
                out.append((local_name(source), alias.name, node.lineno))
    return out


def bindings(name: str) -> dict:
    """Local name → full name, for the names ``name``'s imports bind to a module of the
    package (``import graphcheck.x`` binds ``graphcheck``)."""
    out = {}
    for node, source, alias in statements(name):
        if isinstance(node, ast.Import):
            full = alias.name if alias.asname else alias.name.split(".")[0]
            if local_name(full) is not None:
                out[alias.asname or full] = full
        elif local_name(f"{source}.{alias.name}") is not None:
            out[alias.asname or alias.name] = f"{source}.{alias.name}"
    return out


def dotted(node: ast.expr):
    """``a.b.c`` of a chain of attributes on a name, else ``None``."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def private(attr: str) -> bool:
    return attr.startswith("_") and not (attr.startswith("__") and attr.endswith("__"))


def test_every_module_is_in_the_order():
    on_disk = set(MODULES)
    missing = sorted(on_disk - set(ORDER))
    gone = sorted(set(ORDER) - on_disk)
    assert not missing, f"modules not in ORDER (place each after what it imports): {missing}"
    assert not gone, f"ORDER names modules that are not in {PACKAGE}: {gone}"
    assert len(ORDER) == len(set(ORDER)), "ORDER names a module twice"


def test_the_modules_import_one_way():
    problems = []
    for i, module in enumerate(ORDER):
        if module not in MODULES:
            continue  # said by test_every_module_is_in_the_order
        for target, line in imports(module):
            if target != module and ORDER.index(target) > i:
                problems.append(
                    f"{full_name(module)} (line {line}) imports {full_name(target)}, which "
                    "comes after it"
                )
    assert not problems, "\n".join(problems) + f"\nORDER: {ORDER}"


def test_no_module_reads_another_modules_private_names():
    problems = []
    for module in MODULES:
        if MODULES[module].suffix != ".py":
            continue
        for source, imported, line in names_from(module):
            if source != module and private(imported):
                problems.append(f"{module} (line {line}) imports {source}.{imported}")
        bound = bindings(module)
        for node in ast.walk(parse(module)):
            chain = dotted(node) if isinstance(node, ast.Attribute) else None
            if not chain or chain[0] not in bound:
                continue
            full = bound[chain[0]].split(".") + chain[1:]
            # The longest part of the chain that is a module; the name read from it.
            for n in range(len(full) - 1, 0, -1):
                owner = local_name(".".join(full[:n]))
                if owner is not None:
                    if owner != module and private(full[n]):
                        problems.append(f"{module} (line {node.lineno}) reads {owner}.{full[n]}")
                    break
    assert not problems, "\n".join(problems)


def declared_all(module: str):
    for node in parse(module).body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            return set(ast.literal_eval(node.value)) if node.value is not None else set()
    return None


def test_every_module_lists_its_all_and_what_others_import_from_it():
    problems = []
    alls = {m: declared_all(m) for m in MODULES if MODULES[m].suffix == ".py"}
    problems += [f"{m} has no __all__" for m, names in alls.items() if names is None]
    for module in alls:
        for source, imported, line in names_from(module):
            listed = alls.get(source)
            if source != module and listed is not None and imported not in listed:
                problems.append(
                    f"{module} (line {line}) imports {imported} from {source}, "
                    f"which does not list it in __all__"
                )
    assert not problems, "\n".join(problems)


def test_importing_the_package_does_not_import_torch():
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(PACKAGE.parent), env.get("PYTHONPATH", "")) if p
    )
    env.pop("GRAPHCHECK_DIR", None)  # the instrument hook would wait for torch, not import it
    code = (
        "import sys, graphcheck, graphcheck.torch, graphcheck.sleep; "
        "assert graphcheck.__file__.startswith(sys.argv[1]), graphcheck.__file__; "
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(PACKAGE)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_everything_the_package_exports_is_in_all():
    # Regression: Allow, Allowed, DiffResult and Document, which the signatures use, were
    # imported but left out of __all__ (``from graphcheck import *`` missed them).
    import graphcheck

    public = {n for n in vars(graphcheck) if not n.startswith("_") and n[0].isupper()}
    missing = sorted(n for n in public if n not in graphcheck.__all__)
    assert missing == [], missing
