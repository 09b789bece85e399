"""The pages of the docs site and the README, read as the docs test runs them: every fenced
block with its language, where it is, and the reason it is not run (a skip marker); and
the files of the repository each page cites.

Shared by ``test_docs.py`` (which runs or checks each block) and ``ci/docs-update.py``
(which writes the real output of each ``console`` block back into its page).

A block is skipped only by the line ``<!-- docs-test: skip: REASON -->`` right before its
fence (blank lines between are allowed): it is then reported as skipped with REASON, and a
``python`` block is still compiled and its graphcheck names looked up. A ``python`` block
that needs nothing but a GPU says ``<!-- docs-test: gpu: REASON -->`` instead: it runs where
``GRAPHCHECK_GPU_TESTS=1`` (after the page's GPU blocks before it, as a reader runs a
tutorial), and is skipped with REASON elsewhere.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[2]

#: Every page a reader sees: the README and the docs site's sources. The generated man
#: pages are roff, not Markdown.
PAGES = sorted([REPO / "README.md", *(REPO / "docs").rglob("*.md")])

_FENCE = re.compile(r"^(?P<indent> *)(?P<fence>```+|~~~+)(?P<info>.*)$")
_SKIP = re.compile(r"^\s*<!--\s*docs-test:\s*(?P<how>skip|gpu):\s*(?P<reason>.+?)\s*-->\s*$")


@dataclass
class Block:
    """One fenced block of a page."""

    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    text: str  # dedented by the fence's indent
    skip: Optional[str]
    #: A ``python`` block that needs a GPU only (``<!-- docs-test: gpu: REASON -->``): run,
    #: after the page's GPU blocks before it, where GRAPHCHECK_GPU_TESTS=1; else skipped.
    gpu: bool = False
    #: (first, end) 0-based line range of the block's content in the page, for rewriting.
    span: tuple = field(default=(0, 0))

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def blocks(page: Path) -> list:
    """Every fenced block of ``page``, in order."""
    lines = page.read_text(encoding="utf-8").split("\n")
    out = []
    i = 0
    pending_skip: Optional[str] = None
    pending_gpu = False
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            s = _SKIP.match(lines[i])
            if s:
                pending_skip = s.group("reason")
                pending_gpu = s.group("how") == "gpu"
            elif lines[i].strip():
                pending_skip, pending_gpu = None, False
            i += 1
            continue
        indent, fence = len(m.group("indent")), m.group("fence")
        lang = m.group("info").strip().split(" ")[0] if m.group("info").strip() else ""
        body = []
        j = i + 1
        while j < len(lines):
            close = lines[j].strip()
            if close.startswith(fence[0] * len(fence)) and not close.strip(fence[0]):
                break
            line = lines[j]
            body.append(line[indent:] if line[:indent].strip() == "" else line)
            j += 1
        text = "\n".join(body) + ("\n" if body else "")
        out.append(Block(page, i + 1, lang, text, pending_skip, pending_gpu, (i + 1, j)))
        pending_skip, pending_gpu = None, False
        i = j + 1
    return out


#: Why the README's first block is not run here: it is the two set-up commands (the main
#: job and the whole test suite, which would run this test again). The "What it prints"
#: console block of the README runs the same verify and compares its output.
SETUP_COMMANDS = "the README's set-up commands: the suite itself, and the verify its console example runs"


def all_blocks() -> list:
    out = []
    for page in PAGES:
        found = blocks(page)
        if page.name == "README.md" and page.parent == REPO and found and not found[0].skip:
            found[0].skip = SETUP_COMMANDS
        out.extend(found)
    return out


# --- console blocks -----------------------------------------------------------------------


def transcript(block: Block) -> list:
    """(command, expected output) for each ``$ `` line of a console block: the output is
    the lines up to the next command, as graphcheck prints them (stdout, then stderr)."""
    steps: list = []
    for line in block.text.split("\n"):
        if line.startswith("$ "):
            steps.append([line[2:], []])
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise ValueError(f"{block.where}: a console block starts with `$ command`, not {line!r}")
    return [(cmd, _tidy("\n".join(out))) for cmd, out in steps]


def _tidy(text: str) -> str:
    """Output as compared: trailing spaces and trailing blank lines dropped."""
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


def environment() -> dict:
    """The commands' environment: the interpreter's own scripts (the installed `graphcheck`
    command) first on PATH; a fixed width and no colour, so output is the same anywhere."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({"COLUMNS": "100", "NO_COLOR": "1", "TERM": "dumb"})
    env.pop("GRAPHCHECK_DIR", None)
    return env


def run_console(block: Block) -> list:
    """Runs each command of a console block from the repository root, in order; returns
    (command, expected, got) for each. ``echo $?`` prints the previous command's exit
    code."""
    results = []
    last = 0
    env = environment()
    for cmd, want in transcript(block):
        if cmd.strip() == "echo $?":
            got = str(last)
        else:
            p = subprocess.run(
                ["bash", "-c", cmd],
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            last = p.returncode
            got = _tidy(p.stdout + p.stderr)
        results.append((cmd, want, got))
    return results


def rewrite_console(block: Block) -> bool:
    """Writes the real output of each command back into the block's page (what
    ``ci/docs-update.py`` does); True where anything changed."""
    results = run_console(block)
    fresh = []
    for cmd, _, got in results:
        fresh.append(f"$ {cmd}")
        if got:
            fresh.extend(got.split("\n"))
    lines = block.page.read_text(encoding="utf-8").split("\n")
    first, end = block.span
    indent = len(lines[first - 1]) - len(lines[first - 1].lstrip(" "))
    new = [(" " * indent + line) if line else "" for line in fresh]
    if lines[first:end] == new:
        return False
    lines[first:end] = new
    block.page.write_text("\n".join(lines), encoding="utf-8")
    return True


# --- files a page cites --------------------------------------------------------------------

#: The repository's top-level entries a cited path may start with.
TOP = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} - {"target"}

_LINK = re.compile(r"\]\((?P<target>[^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SPAN = re.compile(r"(?<!`)`(?P<path>[A-Za-z0-9_./*-]+)`(?!`)")


def cited(page: Path, text: Optional[str] = None) -> list:
    """(what, path) for every link and every code span of ``page`` that names a file of
    this repository: a relative link, resolved from the page's folder; a code span whose
    first part is a top-level entry of the repository (``fixtures/gpu/README.md``),
    resolved from the root. Fenced blocks are left out."""
    text = page.read_text(encoding="utf-8") if text is None else text
    text = re.sub(r"(?ms)^ *(```+|~~~+).*?^ *\1 *$", "", text)
    out = []
    for m in _LINK.finditer(text):
        target = m.group("target").split("#")[0]
        if not target or re.match(r"^[a-z]+:", target):
            continue
        out.append((f"link ({m.group('target')})", (page.parent / target).resolve()))
    for m in _SPAN.finditer(text):
        path = m.group("path").rstrip(".")
        head = path.split("/")[0]
        if "/" not in path or head not in TOP:
            continue
        out.append((f"`{path}`", REPO / path))
    return out


def exists(path: Path) -> bool:
    """A cited path exists: a file or folder, or a glob (``retarget_*``) matching one."""
    if "*" in str(path):
        return any(path.parent.glob(path.name)) if "*" not in str(path.parent) else True
    return path.exists()
