"""The ``graphcheck`` command line of the Python package (``python -m graphcheck``, or the
``graphcheck`` console script a wheel installs).

It runs the commands of the Rust binary (``cli/src/main.rs``) over the same core, with the
same output on stdout and the same exit codes: 0 no finding / equal / found, 1 findings /
the documents differ / nothing matched, 2 bad input or usage. A test
(``tests/python/test_torch_cli_parity.py``) holds the two to each other over the fixture
corpus. Help texts are argparse's, not clap's.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

from . import EXIT_BAD_INPUT, EXIT_FINDINGS, EXIT_OK, GraphcheckError, __version__, _native

EXIT_CODES = """\
Exit codes:
  0  verify: no findings (allowed ones and warnings aside); diff: equal; explain: found
  1  verify: findings; diff: the documents differ; explain: nothing matched
  2  bad input or usage: unreadable or invalid document or allowlist, bad flag"""

FORMATS = ("table", "json", "markdown")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="graphcheck",
        description="Verify that captured CUDA graphs still read the tensors they were captured with.",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"graphcheck {__version__}")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    kw = dict(epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)

    v = sub.add_parser(
        "verify",
        help="check a manifest alone or against a live snapshot",
        description="Check a manifest alone (unregistered, unowned, mispooled) or against "
        "a live snapshot (every finding kind).",
        **kw,
    )
    v.add_argument("manifest", help="the manifest recorded at capture")
    v.add_argument("live", nargs="?", help="the live snapshot taken after sleep/wake or reload")
    v.add_argument("--allow", metavar="FILE", help="an allowlist (TOML: [[allow]] path, kinds, reason)")
    v.add_argument(
        "--deny-unused-allow",
        action="store_true",
        help="fail (exit 1) on an allowlist entry that allowed nothing, instead of warning",
    )
    v.add_argument("--format", choices=FORMATS, default="table")
    v.add_argument("--output", metavar="FILE", help="write the report to FILE (atomically) instead of stdout")
    v.add_argument("--normalized", action="store_true", help="print addresses as symbolic ids (A3+0x40)")

    e = sub.add_parser(
        "explain",
        help="trace an address, an owner path or a kernel through the ownership graph",
        **kw,
    )
    e.add_argument("manifest")
    e.add_argument("target", nargs="?", help="a device address (0x…) or an owner path")
    e.add_argument("--kernel", metavar="PATTERN", help="explain every node whose name contains PATTERN")
    e.add_argument("--dot", action="store_true", help="print Graphviz DOT instead of text")
    e.add_argument("--normalized", action="store_true", help="print addresses as symbolic ids")

    s = sub.add_parser("show", help="summarize a manifest or live snapshot")
    s.add_argument("document")
    s.add_argument(
        "--normalized",
        action="store_true",
        help="the stable text snapshot tests store: symbolic addresses, sorted, complete",
    )

    d = sub.add_parser("diff", help="compare two documents by owner path", **kw)
    d.add_argument("a")
    d.add_argument("b")
    d.add_argument("--format", choices=FORMATS, default="table")

    sub.add_parser("schema", help="print the JSON Schema of format v1")
    return p


def _emit(text: str) -> None:
    """Writes to stdout; a closed pipe (``| head``) is not an error."""
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        pass


def _run(args: argparse.Namespace) -> int:
    if args.command == "verify":
        ok, report_json, table, markdown = _native.verify(
            args.manifest,
            args.live,
            allow=args.allow,
            normalized=args.normalized,
            deny_unused_allow=args.deny_unused_allow,
        )
        text = {"table": table, "markdown": markdown, "json": report_json}[args.format]
        if args.output is not None:
            _native.write_atomic(args.output, text.encode())
        else:
            _emit(text)
        return EXIT_OK if ok else EXIT_FINDINGS
    if args.command == "explain":
        if (args.target is None) == (args.kernel is None):
            raise _Usage("explain takes a TARGET or --kernel PATTERN, exactly one")
        found, text = _native.explain(
            args.manifest, args.target, args.kernel, args.dot, args.normalized
        )
        _emit(text)
        return EXIT_OK if found else EXIT_FINDINGS
    if args.command == "show":
        _emit(_native.normalized(args.document) if args.normalized else _native.summary(args.document))
        return EXIT_OK
    if args.command == "diff":
        same, text = _native.diff(args.a, args.b, args.format)
        _emit(text)
        return EXIT_OK if same else EXIT_FINDINGS
    if args.command == "schema":
        _emit(_native.schema())
        return EXIT_OK
    raise _Usage(f"unknown command {args.command!r}")


class _Usage(Exception):
    pass


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Runs one command; returns its exit code."""
    parser = _parser()
    args = parser.parse_args(argv)  # exits 2 on a usage error, as clap does
    # Paths stay strings: a string starting with `{` would be read as JSON text by
    # `_native`, so a path argument is always handed as a path.
    for name in ("manifest", "live", "document", "a", "b"):
        value = getattr(args, name, None)
        if isinstance(value, str):
            setattr(args, name, _PathArg(value))
    try:
        return _run(args)
    except _Usage as e:
        parser.error(str(e))
        return EXIT_BAD_INPUT  # not reached: parser.error exits
    except GraphcheckError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT


class _PathArg:
    """A command-line path, always a path to ``_native`` (``os.PathLike``), whatever its
    first character."""

    __slots__ = ("path",)

    def __init__(self, path: str):
        self.path = path

    def __fspath__(self) -> str:
        return self.path


if __name__ == "__main__":
    sys.exit(main())
