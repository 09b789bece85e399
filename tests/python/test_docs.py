"""Every page of the docs site and the README is tested as a reader would use it: each
fenced block is run or checked by its language, and every file a page cites exists.

- ``console``: each ``$ command`` runs with bash from the repository root (the installed
  ``graphcheck`` command) and prints exactly the lines after it (stdout, then stderr);
  ``ci/docs-update.py`` writes the real output back after a change.
- ``python``: compiled; run in a fresh interpreter on the CPU unless a skip marker says what
  it needs (a GPU, an engine); every ``graphcheck.*`` / ``gt.*`` name it uses exists.
- ``sh``: run (must exit 0) unless a skip marker says why not.
- ``toml``: parsed; an allowlist is read by graphcheck. ``yaml``, ``json``: parsed.
- ``text``: not run (synopses, trees, a snapshot file); it must not hold a ``$ `` command.
A skipped block is a skipped test with its reason, never a pass (docs_blocks.py).
"""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
import tomllib

import pytest

import docs_blocks
from conftest import GPU
from docs_blocks import REPO, Block

BLOCKS = docs_blocks.all_blocks()

#: The languages a block may carry, and what the test does with each.
RUN = {"console", "python", "sh", "bash"}
PARSED = {"toml", "yaml", "json"}
SHOWN = {"text"}


def by(langs) -> list:
    return [pytest.param(b, id=b.where) for b in BLOCKS if b.lang in langs]


def skip_if_marked(block: Block) -> None:
    if block.skip:
        pytest.skip(f"{block.where}: not run: {block.skip}")


def test_every_block_carries_a_language_the_test_knows():
    bad = [f"{b.where}: {b.lang or '(none)'}" for b in BLOCKS if b.lang not in RUN | PARSED | SHOWN]
    assert not bad, "fenced blocks without a language the docs test runs or checks:\n" + "\n".join(bad)


def test_the_pages_have_blocks_of_every_kind():
    # A parser that found nothing would pass every parametrized test below by having none.
    langs = {b.lang for b in BLOCKS}
    assert {"console", "python", "toml", "text"} <= langs, langs
    assert sum(b.lang == "console" for b in BLOCKS) >= 10


def test_text_blocks_hold_no_command():
    bad = [b.where for b in BLOCKS if b.lang in SHOWN and any(
        line.startswith("$ ") for line in b.text.split("\n"))]
    assert not bad, "a command and its output belong in a `console` block, which is run: " + ", ".join(bad)


@pytest.mark.parametrize("block", by({"console"}))
def test_console_block_prints_what_the_page_shows(block):
    skip_if_marked(block)
    for cmd, want, got in docs_blocks.run_console(block):
        assert got == want, (
            f"{block.where}: `{cmd}` printed something else (ci/docs-update.py writes it back)"
        )


@pytest.mark.parametrize("block", by({"python"}))
def test_python_block_compiles_and_names_what_exists(block):
    tree = ast.parse(block.text, filename=block.where)
    aliases = {"graphcheck": "graphcheck"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("graphcheck"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("graphcheck"):
            for a in node.names:
                _resolve(block, f"{node.module}.{a.name}")
    for node in ast.walk(tree):
        chain = _chain(node)
        if chain and chain[0] in aliases and len(chain) > 1:
            _resolve(block, ".".join([aliases[chain[0]], *chain[1:]]))


def _chain(node) -> list:
    """`a.b.c` as ["a", "b", "c"] for an attribute chain rooted at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name) and parts:
        return [node.id, *reversed(parts)]
    return []


def _resolve(block: Block, dotted: str) -> None:
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
            continue
        try:
            obj = importlib.import_module(".".join(parts[: i + 1]))
        except ImportError:
            pytest.fail(f"{block.where}: `{dotted}`: graphcheck has no `{part}` there")


@pytest.mark.parametrize("block", by({"python"}))
def test_python_block_runs(block, tmp_path):
    code = block.text
    if block.gpu:
        if not GPU:
            pytest.skip(f"{block.where}: not run: {block.skip} (GPU blocks run where GRAPHCHECK_GPU_TESTS=1)")
        # A tutorial's GPU blocks build on each other: run those before this one first.
        before = [b for b in BLOCKS if b.page == block.page and b.gpu and b.line < block.line]
        code = "\n".join(b.text for b in [*before, block])
    else:
        skip_if_marked(block)
    p = subprocess.run(
        [sys.executable, "-c", code],
        # GPU blocks write their documents where they stand: a folder of the test's own.
        cwd=tmp_path if block.gpu else REPO,
        env=docs_blocks.environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, f"{block.where}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"


@pytest.mark.parametrize("block", by({"sh", "bash"}))
def test_shell_block_runs(block):
    skip_if_marked(block)
    p = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", block.text],
        cwd=REPO,
        env=docs_blocks.environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, f"{block.where}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"


@pytest.mark.parametrize("block", by({"toml"}))
def test_toml_block_parses_and_allowlists_are_read_by_graphcheck(block, tmp_path):
    data = tomllib.loads(block.text)
    if "allow" not in data:
        return
    import graphcheck

    path = tmp_path / "allow.toml"
    path.write_text(block.text)
    manifest = REPO / "fixtures/synthetic/marlin_workspace_rebuilt/manifest.json"
    # An allowlist graphcheck refuses is a GraphcheckError naming the entry and key.
    graphcheck.verify(str(manifest), allow=str(path))


@pytest.mark.parametrize("block", by({"yaml"}))
def test_yaml_block_parses(block):
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with mkdocs) is missing")
    assert yaml.safe_load(block.text) is not None, block.where


@pytest.mark.parametrize("block", by({"json"}))
def test_json_block_parses(block):
    skip_if_marked(block)
    try:
        json.loads(block.text)
    except json.JSONDecodeError:
        # A fragment of a document (keys of an object) is shown as it sits in one.
        json.loads("{" + block.text + "}")


@pytest.mark.parametrize("page", [pytest.param(p, id=str(p.relative_to(REPO))) for p in docs_blocks.PAGES])
def test_every_file_a_page_cites_exists(page):
    missing = [what for what, path in docs_blocks.cited(page) if not docs_blocks.exists(path)]
    assert not missing, f"{page.relative_to(REPO)} cites what does not exist: " + ", ".join(missing)


def test_cited_file_check_sees_a_missing_file():
    # Planted: a page citing a file and a link that do not exist fails the check above.
    page = REPO / "docs" / "planted.md"
    text = "See `fixtures/index.json`, `fixtures/no_such_file.json` and [this](no-such-page.md).\n"
    missing = [w for w, p in docs_blocks.cited(page, text) if not docs_blocks.exists(p)]
    assert missing == ["link (no-such-page.md)", "`fixtures/no_such_file.json`"]


def test_every_docs_page_is_in_the_site_nav():
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with mkdocs) is missing")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())

    def pages(nav) -> set:
        out = set()
        for item in nav:
            if isinstance(item, str):
                out.add(item)
            else:
                for value in item.values():
                    out |= pages(value) if isinstance(value, list) else {value}
        return out

    listed = pages(config["nav"])
    on_disk = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert on_disk - listed == set(), "docs pages no reader can reach from the nav"
    assert listed - on_disk == set(), "nav entries with no page"


def test_the_site_build_fails_on_a_broken_link(tmp_path):
    # Planted: the site's own validation settings, over a page with a link to no page, must
    # fail `mkdocs build --strict` (ci/test.sh builds the real site so); without the broken
    # link the same build passes.
    yaml = pytest.importorskip("yaml", reason="PyYAML (installed with mkdocs) is missing")
    pytest.importorskip("mkdocs", reason="mkdocs is missing: ci/requirements-docs.txt")
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    small = {
        "site_name": "planted",
        "docs_dir": "docs",
        "site_dir": "site",
        "validation": config["validation"],
        "nav": ["index.md", "other.md"],
    }
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(small))
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "other.md").write_text("# Other\n")

    def build(index: str) -> subprocess.CompletedProcess:
        (tmp_path / "docs" / "index.md").write_text(index)
        return subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict"],
            cwd=tmp_path,
            env={**docs_blocks.environment(), "NO_MKDOCS_2_WARNING": "1"},
            capture_output=True,
            text=True,
            timeout=120,
        )

    good = build("# Home\n\n[other](other.md)\n")
    assert good.returncode == 0, good.stderr
    bad = build("# Home\n\n[other](other.md), [gone](no-such-page.md)\n")
    assert bad.returncode != 0 and "no-such-page.md" in bad.stderr, bad.stderr


def test_the_exit_codes_page_lists_the_codes_graphcheck_exits_with():
    import re

    import graphcheck

    page = (REPO / "docs/reference/exit-codes.md").read_text()
    listed = [int(c) for c in re.findall(r"^\| (\d+) \|", page, re.M)]
    assert listed == [graphcheck.EXIT_OK, graphcheck.EXIT_FINDINGS, graphcheck.EXIT_BAD_INPUT]
