#!/usr/bin/env python3
"""Writes the real output of every `console` block of the README and docs/ back into its
page, as the docs test (tests/python/test_docs.py) runs it: after a change to what a
command prints, run this, then review the diff (`git diff -- docs README.md`).

`ci/docs-update.py PAGE...` rewrites only those pages. Run it with the project's Python, where graphcheck is installed: `. ci/venv.sh && "$PY"
ci/docs-update.py` (the `graphcheck` command it runs is the one beside that Python).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))

import docs_blocks  # noqa: E402


def main() -> int:
    # Pages named on the command line, else every page.
    pages = [Path(p).resolve() for p in sys.argv[1:]] or docs_blocks.PAGES
    changed = 0
    for page in pages:
        # Read again per block: a rewrite above moves the lines below.
        count = sum(b.lang == "console" for b in docs_blocks.blocks(page))
        for i in range(count):
            block = [b for b in docs_blocks.blocks(page) if b.lang == "console"][i]
            if block.skip:
                continue
            if docs_blocks.rewrite_console(block):
                print(f"rewrote {block.where}")
                changed += 1
    print(f"{changed} console blocks rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
