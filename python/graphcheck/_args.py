"""Checks of the public API's arguments: a wrong type or value is a :class:`GraphcheckError`
that names the parameter and says what it takes, never the ``TypeError``,
``UnicodeEncodeError`` or ``AttributeError`` that would otherwise escape from deep inside
(``json.dumps``, the native module's conversions, an ``.items()`` call).

The rules, the same across :mod:`graphcheck` and :mod:`graphcheck.torch`:

- a flag is a ``bool`` (``normalized="yes"`` is an error, not ``True``);
- a parameter that takes a list of strings (allowlist ``kinds`` and ``kernels``,
  ``runtime_state``) takes a list (any iterable but a string); a single string is an error,
  never a list of its letters. The sleep allocator's tag parameters are the exception they document: one tag
  as a string is a list of that tag;
- a string that goes to the core is valid Unicode (no lone surrogate); a path is any
  ``str`` or ``os.PathLike`` the file system can encode (surrogate escapes of a non-UTF-8
  name included);
- a mapping is a :class:`~collections.abc.Mapping`, and a dict handed over as JSON must be
  serialisable: the error names the JSON path of the first value that is not.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any, Iterable, Optional

from . import _native
from ._native import GraphcheckError

__all__ = [
    "callable_or_text",
    "choice",
    "flag",
    "integer",
    "iterable",
    "mapping",
    "optional_mapping",
    "optional_text",
    "path",
    "show",
    "strings",
    "text",
    "to_json",
]


def show(value: Any) -> str:
    """``value`` for a message: its type, and a short ``repr`` for small scalars."""
    if isinstance(value, (bool, int, float, str, bytes)) or value is None:
        r = repr(value)
        if len(r) <= 60:
            return r
        if isinstance(value, (str, bytes)):
            return f"{type(value).__name__} of length {len(value)}"
        # A long number: its type alone (len() of it raised TypeError).
    return type(value).__name__


def flag(name: str, value: Any) -> bool:
    """A ``bool``; anything else (``"yes"``, ``1``, ``None``) is an error."""
    if not isinstance(value, bool):
        raise GraphcheckError(f"{name} is True or False, not {show(value)}")
    return value


def text(name: str, value: Any) -> str:
    """A ``str`` that encodes as UTF-8 (the core's strings are)."""
    if not isinstance(value, str):
        raise GraphcheckError(f"{name} is a string, not {show(value)}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise GraphcheckError(
            f"{name} is not valid Unicode: a lone surrogate at position {e.start}"
        ) from None
    return value


def optional_text(name: str, value: Any) -> Optional[str]:
    """``None`` or :func:`text`."""
    return None if value is None else text(name, value)


def choice(name: str, value: Any, options: Iterable[str]) -> str:
    """One of ``options``."""
    options = tuple(options)
    if not isinstance(value, str) or value not in options:
        raise GraphcheckError(
            f"{name} is one of {', '.join(map(repr, options))}, not {show(value)}"
        )
    return value


def strings(name: str, value: Any, what: str = "strings") -> list:
    """A list or tuple (any iterable but a string, bytes or mapping) of valid strings. A
    single string is an error: taken as a list it would be a list of its letters."""
    if isinstance(value, (str, bytes)):
        raise GraphcheckError(
            f"{name} is a list of {what}, not the single string {show(value)}: "
            f"write [{value!r}]"
        )
    if isinstance(value, Mapping) or not iterable(value):
        raise GraphcheckError(f"{name} is a list of {what}, not {show(value)}")
    items = [text(f"{name}[{i}]", v) for i, v in enumerate(value)]
    if what == "owner-path globs":
        # A malformed glob matches nothing: said at once, naming it, not found never.
        for i, g in enumerate(items):
            try:
                _native.glob_match(g, [])
            except GraphcheckError as e:
                raise GraphcheckError(f"{name}[{i}]: {e}") from None
    return items


def mapping(name: str, value: Any, what: str = "a mapping (dict)") -> Mapping:
    """A mapping (``dict``); ``what`` says what it holds, for the message."""
    if not isinstance(value, Mapping):
        raise GraphcheckError(f"{name} is {what}, not {show(value)}")
    return value


def optional_mapping(name: str, value: Any) -> Optional[Mapping]:
    """``None`` or :func:`mapping`."""
    return None if value is None else mapping(name, value)


def integer(name: str, value: Any, minimum: Optional[int] = None) -> int:
    """An ``int`` (not a ``bool``), at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise GraphcheckError(f"{name} is an integer, not {show(value)}")
    if minimum is not None and value < minimum:
        raise GraphcheckError(f"{name} is at least {minimum}, not {value}")
    return value


def path(name: str, value: Any) -> str:
    """A ``str`` or ``os.PathLike`` the file system can encode; returns it as ``str``."""
    if not isinstance(value, str) and not hasattr(value, "__fspath__"):
        raise GraphcheckError(f"{name} is a path (str or os.PathLike), not {show(value)}")
    try:
        p = os.fspath(value)
        os.fsencode(p)
    except (TypeError, UnicodeError) as e:
        raise GraphcheckError(f"{name}: a path the file system cannot encode: {e}") from None
    if not isinstance(p, str):
        raise GraphcheckError(f"{name}: os.fspath gave {show(p)}, not a str path")
    if p == "":
        raise GraphcheckError(f"{name} is an empty string, which names no file or folder")
    return p


def callable_or_text(name: str, value: Any) -> Any:
    """A ``str`` (format string) or a callable."""
    if callable(value):
        return value
    return text(name, value)


def to_json(name: str, value: Any) -> str:
    """``value`` as JSON text; a value JSON cannot hold (a set, bytes, an object, NaN, a
    tuple key, a cycle) is an error naming its JSON path under ``name``."""
    try:
        text = json.dumps(value, allow_nan=False, ensure_ascii=False)
        # A lone surrogate is no Unicode: said here, at its JSON path, rather than as the
        # core's "unexpected end of hex escape" once escaped.
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        where, why = _surrogate(value, name)
        raise GraphcheckError(f"{where}: not valid Unicode: {why}") from None
    except (TypeError, ValueError, RecursionError) as e:
        try:
            where, why = _unserialisable(value, name, set())
        except RecursionError:
            where, why = name, "nested too deeply"
        raise GraphcheckError(
            f"{where}: cannot be written as JSON: {why or e}"
        ) from None


def iterable(value: Any) -> bool:
    """Whether ``value`` can be iterated over."""
    try:
        iter(value)
    except TypeError:
        return False
    return True


def _surrogate(value: Any, at: str) -> tuple:
    """The JSON path of the first string (or key) in ``value`` holding a lone surrogate,
    and where in it; ``(at, "a lone surrogate")`` when none is found."""
    def lone(s: str):
        for i, c in enumerate(s):
            if 0xD800 <= ord(c) <= 0xDFFF:
                return f"a lone surrogate (U+{ord(c):04X}) at position {i}"
        return None
    stack = [(value, at)]
    while stack:
        v, here = stack.pop()
        if isinstance(v, str):
            if (why := lone(v)) is not None:
                return here, why
        elif isinstance(v, Mapping):
            for k, x in reversed(list(v.items())):
                if isinstance(k, str) and (why := lone(k)) is not None:
                    return here, f"the key {ascii(k)} holds {why}"
                stack.append((x, f"{here}.{k}" if isinstance(k, str) else f"{here}[{k!r}]"))
        elif isinstance(v, (list, tuple)):
            stack.extend((x, f"{here}[{i}]") for i, x in reversed(list(enumerate(v))))
    return at, "a lone surrogate"


def _unserialisable(value: Any, at: str, seen: set) -> tuple:
    """The JSON path (``doc.tensors[3].shape``) of the first value in ``value`` that JSON
    cannot hold, and why; ``(at, None)`` when none is found (the caller's error says why)."""
    if value is None or isinstance(value, (str, bool, int)):
        return at, None
    if isinstance(value, float):
        return (at, f"{value!r} is not a JSON number") if not math.isfinite(value) else (at, None)
    if isinstance(value, (Mapping, list, tuple)):
        if id(value) in seen:
            return at, "it contains itself (a cycle)"
        seen = seen | {id(value)}
        if isinstance(value, Mapping):
            for k, v in value.items():
                if not (k is None or isinstance(k, (str, int, float, bool))):
                    return at, f"a key of type {type(k).__name__} (JSON keys are strings)"
                hop = f"{at}.{k}" if isinstance(k, str) else f"{at}[{k!r}]"
                where, why = _unserialisable(v, hop, seen)
                if why:
                    return where, why
        else:
            for i, v in enumerate(value):
                where, why = _unserialisable(v, f"{at}[{i}]", seen)
                if why:
                    return where, why
        return at, None
    return at, f"a {type(value).__name__}, which JSON cannot hold"
