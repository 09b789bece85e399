"""Owner-path hops in the core's path grammar (``model.layers[0].mlp["w.1"]``): how the
registry walk and the recorder spell each step from an owner to what it holds."""

from __future__ import annotations

import re
from typing import Any

__all__ = ["attr_hop", "child_hop", "key_hop"]

# An attribute name the path grammar can spell as `.name`.
_ATTR = re.compile(r'^[^.\[\]"]+$')

# name -> whether it can be spelled as an attribute hop (names repeat across layers).
_ATTR_OK: dict = {}


def attr_hop(path: str, name: str) -> str:
    """``path.name``, or ``path["name"]`` where ``name`` cannot be an attribute hop."""
    ok = _ATTR_OK.get(name)
    if ok is None:
        ok = bool(_ATTR.match(name)) and not name.isdigit()
        if len(_ATTR_OK) < 65536:
            _ATTR_OK[name] = ok
    return f"{path}.{name}" if ok else key_hop(path, name)


def key_hop(path: str, key: Any) -> str:
    """``path[3]`` for an integer key, ``path["k"]`` for any other (its ``str``)."""
    if isinstance(key, int) and not isinstance(key, bool):
        return f"{path}[{key}]"
    text = str(key).replace("\\", "\\\\").replace('"', '\\"')
    return f'{path}["{text}"]'


def child_hop(path: str, name: str) -> str:
    """A submodule's hop: ``layers[0]`` for the numbered children of ``ModuleList`` and
    ``Sequential``, ``.name`` otherwise."""
    return f"{path}[{name}]" if name.isdigit() else attr_hop(path, name)
