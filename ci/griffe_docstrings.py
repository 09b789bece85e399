"""A griffe extension for the docs site's Python API page (mkdocs.yml): graphcheck's
docstrings are written for Sphinx (``:class:`Text```, ``:func:`verify```, ``.. code-block::``)
and attributes are documented by ``#:`` comments above them, neither of which mkdocstrings
renders. Roles become code spans, directives their indented code, and a ``#:`` comment the
attribute's docstring, so the page shows what the source says."""

from __future__ import annotations

import re
from pathlib import Path

import griffe

_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|data|attr|exc|obj|const):`~?([^`]+)`")
_DIRECTIVE = re.compile(r"^(\s*)\.\. code-block::.*$", re.M)


def _plain(text: str) -> str:
    text = _ROLE.sub(lambda m: f"`{m.group(1)}`", text)
    # ``code`` (reST) is `code` in Markdown.
    text = re.sub(r"``([^`]+)``", r"`\1`", text)
    return _DIRECTIVE.sub(r"\1", text)


class SphinxDocstrings(griffe.Extension):
    """Rewrites each docstring griffe loads; gives ``#:``-commented attributes theirs."""

    def on_instance(self, *, node, obj, agent, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _plain(obj.docstring.value)

    def on_attribute_instance(self, *, node, attr, agent, **kwargs) -> None:
        if attr.docstring is not None or attr.lineno is None:
            return
        path = attr.filepath
        if isinstance(path, list) or not Path(path).is_file():
            return
        lines = Path(path).read_text(encoding="utf-8").split("\n")
        comment = []
        i = attr.lineno - 2
        while i >= 0 and lines[i].strip().startswith("#:"):
            comment.insert(0, lines[i].strip()[2:].strip())
            i -= 1
        if comment:
            attr.docstring = griffe.Docstring(_plain(" ".join(comment)), parent=attr)
