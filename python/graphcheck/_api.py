"""The document-level API that :mod:`graphcheck` re-exports: loading and checking
manifests and live snapshots (:func:`load`, :func:`verify`, :func:`explain`, :func:`diff`,
...), the :class:`Report` of a verify and its findings, and the exit codes and format
version of this build, all over the Rust core (``graphcheck._native``).
"""

from __future__ import annotations

import gc
import json
import os
from dataclasses import dataclass, field, fields
from typing import Any, Iterable, Mapping, Optional, Sequence, Union, cast

from . import _args, _native
from ._native import GraphcheckError, Text

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FINDINGS",
    "EXIT_OK",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "Allow",
    "Allowed",
    "DiffResult",
    "Document",
    "Finding",
    "KernelRef",
    "Owner",
    "RankSummary",
    "Report",
    "Text",
    "VerificationFailed",
    "__version__",
    "assert_clean",
    "build_manifest",
    "diff",
    "document_source",
    "explain",
    "load",
    "load_as",
    "normalized",
    "reads",
    "schema",
    "summary",
    "verify",
    "version_arg",
]

#: The version of the core this package was built from.
__version__ = _native.version()

#: The format version this build reads and writes.
FORMAT_VERSION: int = _native.FORMAT_VERSION
"""The format version graphcheck writes unless asked for another (2)."""
FORMAT_VERSIONS: tuple = tuple(_native.FORMAT_VERSIONS)
"""Every format version graphcheck reads, and writes when asked (1 and 2)."""
#: Exit codes of the CLI (API): no finding, findings, bad input or usage.
EXIT_OK: int = _native.EXIT_OK
EXIT_FINDINGS: int = _native.EXIT_FINDINGS
EXIT_BAD_INPUT: int = _native.EXIT_BAD_INPUT

#: A document (manifest or live snapshot): a path (``str``, ``bytes`` or ``os.PathLike``,
#: whatever it starts with: ``"{run}/m.json"`` is a file), the ``dict`` :func:`json.loads`
#: gives, or JSON text as :class:`Text`. A ``str`` or ``bytes`` that starts with ``{"``
#: (blanks aside: an object's first key, as every document's text begins) is taken as JSON
#: text too, as ``json.dumps(doc)`` and ``f.read()`` give it.
Document = Union[str, bytes, "os.PathLike[str]", Mapping[str, Any], Text]
#: An allowlist: a TOML file's path, or a list of entries as dicts with the keys of a TOML
#: entry (``path`` or ``kernel``/``kernels``, ``reason``, optional ``kinds``). ``kinds`` and
#: ``kernels`` are lists, as in TOML: a single string is an error naming ``allow[i].kinds``.
Allow = Union[str, "os.PathLike[str]", Sequence[Mapping[str, Any]]]
#: The ranks of one run as pairs of paths, each a rank's manifest and its live snapshot.
Pairs = Sequence[Sequence[Union[str, "os.PathLike[str]"]]]


def document_source(
    doc: Document, name: str = "document"
) -> Union[str, bytes, "os.PathLike[str]", Text]:
    """What ``_native`` takes: a mapping becomes :class:`Text` (an unserialisable value is
    an error naming its JSON path under ``name``); paths and text pass through, and the
    native module tells a path from text (:data:`Document`) and turns a path or text it
    cannot encode into a ``GraphcheckError`` too."""
    if isinstance(doc, Mapping):
        return Text(_args.to_json(name, doc))
    if isinstance(doc, Text):
        return doc
    if isinstance(doc, (str, bytes)) or hasattr(doc, "__fspath__"):
        if isinstance(doc, (str, bytes)) and not doc.strip():
            raise GraphcheckError(f"{name}: an empty string is neither a path nor a document")
        return doc
    raise GraphcheckError(
        f"{name}: expected a document (a path, a dict or graphcheck.Text), got {_args.show(doc)}"
    )


#: The keys of an allowlist entry whose value is a list of strings.
_ALLOW_LISTS = {"kinds": "finding kinds", "kernels": "kernel-name patterns"}


def _allow_args(allow: Optional[Allow]) -> dict:
    """An allowlist file goes to the core as a path; entries (dicts) as data, which the core
    reads with the keys of a TOML entry and names in errors (``allow[2].kinds``)."""
    if allow is None:
        return {}
    if isinstance(allow, (str, os.PathLike)):
        return {"allow": _args.path("allow", allow)}
    if isinstance(allow, Mapping):
        raise GraphcheckError(
            "allow is a list of entries (dicts) or an allowlist file, not a single dict: "
            "write allow=[{...}]"
        )
    if isinstance(allow, bytes) or not isinstance(allow, Iterable):
        raise GraphcheckError(
            f"allow is an allowlist file (str or os.PathLike) or a list of entries (dicts), "
            f"not {_args.show(allow)}"
        )
    entries = []
    for i, entry in enumerate(allow):
        entry = _args.mapping(f"allow[{i}]", entry, "an entry (a dict)")
        # The core would read a string here as a type error; say what to write instead.
        for key, what in _ALLOW_LISTS.items():
            if key in entry:
                _args.strings(f"allow[{i}].{key}", entry[key], what)
        entries.append(entry)
    return {"allow_entries": _args.to_json("allow", entries)}


def load(doc: Document, expect: Optional[str] = None, *, format_version: int = 1) -> dict:
    """Loads and checks a manifest or live snapshot of either format version; returns it as
    a dict.

    The dict is in the layout of ``format_version``: 1 (the default) is the expanded form,
    every record an object (``m["graphs"][0]["nodes"][0]["touches"][0]["addr"]``), whatever
    version the document was written in; 2 is the compact layout graphcheck writes (columns,
    node names stored once, touches as ``[param, offset, addr, tensor, allocation]`` arrays
    with ``addr`` an offset from the touch's tensor or allocation). ``expect``
    (``"manifest"`` or ``"live"``) makes the other kind an error."""
    if expect is not None:
        _args.choice("expect", expect, ("manifest", "live"))
    return load_as(doc, "document", None, expect, version_arg(format_version))


def load_as(doc: Document, name: str, label: Optional[str], expect: Optional[str], version: int) -> dict:
    """:func:`load` of an argument ``name`` (errors name it), the text tagged ``label``
    (``<manifest>:1:2: …``; ``None``: ``<string>``)."""
    # The objects are built straight from the core's records (no JSON text). The cyclic
    # collector would walk the growing tree again and again, for nothing: none of it can be
    # garbage yet (json.loads of 126 MiB took 27 s with it, 13 s without).
    collecting = gc.isenabled()
    gc.disable()
    try:
        _, document = _native.load_objects(document_source(doc, name), expect, label, version)
    finally:
        if collecting:
            gc.enable()
    return document


def version_arg(value) -> int:
    """A format version this build writes, or a GraphcheckError naming the argument (a
    float equal to one, ``2.0``, is not a version: the native call takes an integer)."""
    if isinstance(value, bool) or not isinstance(value, int) or value not in FORMAT_VERSIONS:
        raise GraphcheckError(
            f"format_version is one of {', '.join(map(str, FORMAT_VERSIONS))}, "
            f"not {_args.show(value)}"
        )
    return value


def normalized(doc: Document) -> str:
    """The stable text of a document (``graphcheck show --normalized``)."""
    return _native.normalized(document_source(doc))


def reads(doc: Document, *, kernels: bool = True) -> str:
    """The reads view of a manifest: its owners, pools and, per graph (by name), the owner
    paths it reads, the reads no owner explains and its kernels, as sorted text with no
    address, id, pool number, size or timing; equal for two recordings of the same model
    and graphs, so an engine's tests can keep it as a snapshot (:mod:`graphcheck.syrupy`).
    ``kernels=False`` leaves kernel names, and the word counts that depend on them, out:
    they differ between GPU architectures and library versions. A live snapshot is an
    error (``docs/recipes/pytest.md``)."""
    kernels = _args.flag("kernels", kernels)
    return _native.reads(document_source(doc), kernels, "<document>")


def summary(doc: Document) -> str:
    """The summary ``graphcheck show`` prints."""
    return _native.summary(document_source(doc))


def schema(format_version: int = FORMAT_VERSION) -> dict:
    """The JSON Schema of format ``format_version`` (2, what graphcheck writes, or 1)."""
    return json.loads(_native.schema(version_arg(format_version)))


def build_manifest(
    spec: Union[Mapping[str, Any], str], *, format_version: int = FORMAT_VERSION
) -> dict:
    """Builds a manifest from a build spec (producer, pools, pool_ranges, allocations,
    tensors, owners, and graphs as walkers read them); see ``graphcheck::resolve::spec``
    (``src/resolve/spec.rs``). ``spec`` is a dict, or JSON text or a file's path as a
    :data:`Document` is. Returns it in format ``format_version`` (2 by default, as it is
    written; 1, or :func:`load`, for the expanded form)."""
    text = Text(_args.to_json("spec", spec)) if isinstance(spec, Mapping) else spec
    if not isinstance(text, (str, bytes, Text)):
        raise GraphcheckError(f"spec is a dict or JSON text, not {_args.show(spec)}")
    version = version_arg(format_version)
    return json.loads(_native.build_manifest(text, None, version))


def explain(
    manifest: Document,
    target: Optional[str] = None,
    *,
    kernel: Optional[str] = None,
    dot: bool = False,
    normalized: bool = False,
) -> str:
    """Traces an address (``"0x…"``), an owner path, or with ``kernel`` every node whose
    name contains it. Returns the text (DOT with ``dot=True``); raises
    :class:`GraphcheckError` when nothing matched."""
    target = _args.optional_text("target", target)
    kernel = _args.optional_text("kernel", kernel)
    dot = _args.flag("dot", dot)
    normalized = _args.flag("normalized", normalized)
    found, text = _native.explain(document_source(manifest, "manifest"), target, kernel, dot, normalized)
    if not found:
        raise GraphcheckError(text.strip() or f"nothing matches {target or kernel!r}")
    return text


@dataclass(frozen=True)
class DiffResult:
    """Two documents compared by owner path: ``same`` and the text (or JSON)."""

    same: bool
    text: str

    def __bool__(self) -> bool:
        return self.same

    def __str__(self) -> str:
        return self.text


def diff(a: Document, b: Document, *, format: str = "table") -> DiffResult:
    """Compares two documents by owner path (tensor set, registration, layout, digests).
    ``format`` is ``"table"``, ``"markdown"`` or ``"json"``."""
    format = _args.choice("format", format, ("table", "markdown", "json"))
    same, text = _native.diff(document_source(a, "a"), document_source(b, "b"), format)
    return DiffResult(same, text)


@dataclass(frozen=True)
class Owner:
    """An owner path a finding names, and how it holds the tensor."""

    path: str
    registration: str


@dataclass(frozen=True)
class KernelRef:
    """One node parameter word holding the subject's address."""

    graph: str
    node: int
    name: str
    param: int
    offset: int
    addr: str


@dataclass(frozen=True)
class Finding:
    """One finding of :func:`verify` (the fields of the JSON report; see docs/findings.md)."""

    kind: str
    subject: str
    owners: tuple[Owner, ...]
    graphs: tuple[str, ...]
    kernels: tuple[KernelRef, ...]
    detail: str
    #: ``"error"`` fails the run; ``"warning"`` (an unused allowlist entry, unless
    #: ``deny_unused_allow``) is shown but leaves the report ``ok``.
    severity: str = "error"
    new_owners: tuple[str, ...] = ()
    dtype: Optional[str] = None
    shape: Optional[tuple[int, ...]] = None
    stride: Optional[tuple[int, ...]] = None
    captured_addr: Optional[str] = None
    live_addr: Optional[str] = None
    pool: Optional[str] = None
    alloc_site: tuple[dict, ...] = ()
    #: The rank whose documents gave the finding, in a report of several ranks
    #: (``graphcheck verify DIR``); ``None`` for one manifest, and for findings about
    #: several ranks (``rank_mismatch``, ``unused_allow``).
    rank: Optional[int] = None
    #: For a live-check finding of one manifest against its live snapshot: whether
    #: ``graphcheck retarget`` fixes it (every graph holding it patched instead of
    #: recaptured); ``None`` otherwise.
    retarget: Optional[bool] = None

    @classmethod
    def from_json(cls, f: Mapping[str, Any]) -> "Finding":
        get = f.get
        shape, stride = get("shape"), get("stride")
        values = {
            "kind": f["kind"],
            "subject": f["subject"],
            "owners": _owners(get("owners", ())),
            "graphs": tuple(get("graphs", ())),
            "kernels": _kernel_refs(get("kernels", ())),
            "detail": get("detail", ""),
            "severity": get("severity", "error"),
            "new_owners": tuple(get("new_owners", ())),
            "dtype": get("dtype"),
            "shape": None if shape is None else tuple(shape),
            "stride": None if stride is None else tuple(stride),
            "captured_addr": get("captured_addr"),
            "live_addr": get("live_addr"),
            "pool": get("pool"),
            "alloc_site": tuple(get("alloc_site", ())),
            "rank": get("rank"),
            "retarget": get("retarget"),
        }
        if cls is not Finding:
            return cls(**values)
        # The fields as the instance's attributes at once: a report can hold hundreds of
        # thousands of findings, and the frozen dataclass's __init__ sets them one by one.
        finding = _new(cls)
        _set(finding, "__dict__", values)
        return finding


_new, _set = object.__new__, object.__setattr__
#: The keys of a kernel reference and of an owner in the report's JSON: their fields.
_KERNEL_FIELDS = frozenset(f.name for f in fields(KernelRef))
_OWNER_FIELDS = frozenset(f.name for f in fields(Owner))


def _kernel_refs(refs: Sequence[dict]) -> tuple:
    """The KernelRefs of a finding's dicts (the core's records, or its JSON). Each takes its
    dict as its attributes, 2.6 times as fast as the dataclass's ``__init__`` (100,000 of
    them, 0.12 s against 0.32); a dict with other keys goes through ``__init__``, which
    names what is wrong."""
    out = []
    for k in refs:
        if k.keys() == _KERNEL_FIELDS:
            ref = _new(KernelRef)
            _set(ref, "__dict__", k)
        else:
            ref = KernelRef(**k)
        out.append(ref)
    return tuple(out)


def _owners(owners: Sequence[dict]) -> tuple:
    """The Owners of a finding's dicts, made as :func:`_kernel_refs` makes KernelRefs (keys
    other than an Owner's are left out)."""
    out = []
    for o in owners:
        if o.keys() == _OWNER_FIELDS:
            owner = _new(Owner)
            _set(owner, "__dict__", o)
        else:
            owner = Owner(o["path"], o["registration"])
        out.append(owner)
    return tuple(out)


@dataclass(frozen=True)
class Allowed:
    """A finding an allowlist entry silenced."""

    finding: Finding
    allowed_by: str
    reason: str


@dataclass(frozen=True)
class RankSummary:
    """One rank's part of a report of several ranks (:func:`verify` of a folder): whether
    the rank is ``ok``, whether it had a live snapshot, and its own findings' counts."""

    rank: int
    ok: bool
    live: bool
    summary: Mapping[str, int]
    subjects: int
    graphs: int


class _Rendered:
    """The table and Markdown of a report, already rendered: what a :class:`Report` holds
    in place of the native handle once pickled or copied (the handle stays in its
    process)."""

    __slots__ = ("_table", "_markdown")

    def __init__(self, table: str, markdown: str):
        self._table, self._markdown = table, markdown

    def table(self) -> str:
        return self._table

    def markdown(self) -> str:
        return self._markdown


#: The fields of a Report from :func:`verify` built when first read, not before.
_LAZY_FIELDS = ("findings", "allowed", "json")


@dataclass(frozen=True)
class Report:
    """What :func:`verify` found. ``str(report)`` is the table the CLI prints. ``ok``: no
    finding of severity ``"error"``; ``findings`` holds the warnings too.

    A report builds what is read, when it is read: the counts (``ok``, ``summary``, ...)
    at once; ``findings`` and ``allowed`` at the first read of either, from the core's
    records (a report can hold hundreds of thousands of kernel references); ``json``,
    :attr:`table` and :attr:`markdown` at their first read (at tens of thousands of
    findings the table takes seconds). Each is kept. Until then the report holds the
    verified documents on the Rust side; pickling or copying a report builds every field
    and holds the text."""

    ok: bool
    findings: tuple[Finding, ...]
    allowed: tuple[Allowed, ...]
    checked: tuple[str, ...]
    summary: Mapping[str, int]
    subjects: int
    graphs: int
    json: str = field(repr=False)
    #: The native handle (``_native.Verified``) or a :class:`_Rendered`: where
    #: :attr:`table` and :attr:`markdown` come from.
    _texts: Any = field(repr=False, compare=False)
    #: Nodes whose addresses the walk could not read: what they hold was not checked.
    unread_nodes: int = 0
    #: The graphs some finding names, sorted (the core's ``Report::recapture``).
    _recapture: tuple[str, ...] = field(default=(), repr=False)
    #: With a folder of several ranks' documents (``graphcheck verify DIR``): the run's
    #: world size, each rank's part, and the ranks below the world size with no manifest
    #: (a warning, not verified). ``None``, ``()`` and ``()`` for one manifest.
    world_size: Optional[int] = None
    ranks: tuple[RankSummary, ...] = ()
    missing_ranks: tuple[int, ...] = ()
    #: Graphs left out of every finding: torch's CUDA-graph trees guard a static input of
    #: theirs that its owner now holds at another address, so torch records a new graph
    #: instead of replaying them (the manifest's graph ``guards``).
    superseded: tuple[str, ...] = ()
    #: Graphs ``graphcheck retarget`` would patch instead of recapturing (one manifest
    #: against its live snapshot; ``graphcheck.torch.retarget`` applies it).
    retarget: tuple[str, ...] = ()

    @classmethod
    def _from_native(cls, verified: "_native.Verified") -> "Report":
        r = json.loads(verified.head())
        # Every field but the lazy ones, which __getattr__ reads when first asked for.
        report = object.__new__(cls)
        for name, value in (
            ("ok", verified.ok),
            ("_recapture", tuple(verified.recapture())),
            ("checked", tuple(r["checked"])),
            ("summary", dict(r["summary"])),
            ("subjects", r["subjects"]),
            ("graphs", r["graphs"]),
            ("unread_nodes", r.get("unread_nodes", 0)),
            ("world_size", r.get("world_size")),
            ("ranks", tuple(RankSummary(**x) for x in r.get("ranks", []))),
            ("missing_ranks", tuple(r.get("missing_ranks", []))),
            ("superseded", tuple(r.get("superseded", []))),
            ("retarget", tuple(r.get("retarget", []))),
            ("_texts", verified),
        ):
            object.__setattr__(report, name, value)
        return report

    def __getattr__(self, name: str) -> Any:
        # Called only for an attribute the instance does not hold: a lazy field not read
        # yet (a report from verify), or no attribute at all.
        texts = self.__dict__.get("_texts")
        if name not in _LAZY_FIELDS or texts is None:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if name == "json":
            text = texts.json()
            object.__setattr__(self, "json", text)
            return text
        # Hundreds of thousands of objects, none of which can be garbage yet: the cyclic
        # collector would walk them again and again (it took 2.4 times as long at 42,000
        # findings and 275,000 kernel references).
        collecting = gc.isenabled()
        gc.disable()
        try:
            found = texts.findings()
            if found is None:
                r = json.loads(self.json)
                found = r["findings"], r["allowed"]
            findings = tuple(map(Finding.from_json, found[0]))
            allowed = tuple(
                Allowed(Finding.from_json(a["finding"]), a["allowed_by"], a["reason"])
                for a in found[1]
            )
        finally:
            if collecting:
                gc.enable()
        object.__setattr__(self, "findings", findings)
        object.__setattr__(self, "allowed", allowed)
        return self.__dict__[name]

    @property
    def table(self) -> str:
        """The table ``graphcheck verify`` prints (rendered at the first read)."""
        return self._texts.table()

    @property
    def markdown(self) -> str:
        """The Markdown of ``graphcheck verify --format markdown`` (rendered at the first
        read)."""
        return self._texts.markdown()

    def __reduce__(self):
        # The native handle cannot leave its process: a pickled (or copied) report carries
        # its table and Markdown as text instead.
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values["_texts"] = _Rendered(self.table, self.markdown)
        return (_rebuild_report, (values,))

    def __bool__(self) -> bool:
        return self.ok

    def __str__(self) -> str:
        return self.table

    @property
    def errors(self) -> list[Finding]:
        """The findings that fail the run."""
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        """The findings shown that do not fail the run (an unused allowlist entry)."""
        return [f for f in self.findings if f.severity == "warning"]

    def of_kind(self, kind: str) -> list[Finding]:
        """The findings of one kind."""
        return [f for f in self.findings if f.kind == kind]

    def recapture(self) -> list[str]:
        """Every graph some finding names, sorted: what to recapture."""
        return list(self._recapture)


def _rebuild_report(values: dict) -> Report:
    """A :class:`Report` from its fields (unpickling)."""
    return Report(**values)


def verify(
    manifest: Union[Document, Pairs],
    live: Optional[Document] = None,
    allow: Optional[Allow] = None,
    *,
    normalized: bool = False,
    deny_unused_allow: bool = False,
) -> Report:
    """Verifies a manifest alone (capture-time checks) or against a live snapshot (every
    kind), under an optional allowlist. ``normalized`` prints addresses as symbolic ids.

    ``manifest`` may instead name a folder (``str`` or ``os.PathLike``, ``live`` omitted)
    holding one run's documents, one manifest and at most one live snapshot per rank (what
    ``instrument()`` writes per rank): every rank is verified against its own live
    snapshot and the manifests against each other, into the one report ``graphcheck verify
    DIR`` prints (the same code). Each finding names its ``rank``; the report has
    ``world_size``, ``ranks`` and ``missing_ranks``. A folder with no manifest, documents
    that are not one run's, or a ``live`` given with a folder are a
    :class:`GraphcheckError` naming the folder and what is wrong.

    An allowlist entry that allowed nothing is an ``unused_allow`` finding of severity
    ``"warning"``: shown, but the report stays ``ok``. ``deny_unused_allow=True`` makes it
    an error, as ``graphcheck verify --deny-unused-allow`` does.

    ``manifest`` may also be a list of ``(manifest, live)`` pairs of paths, one per rank
    (``live`` omitted): the report ``graphcheck verify M0 L0 M1 L1 …`` prints, the same as
    for a folder holding those files. Each pair must be a manifest, then a live snapshot,
    of one rank; pairs that are not one run's are refused as a folder's documents are.

    The table and Markdown are rendered when first read (:class:`Report`); every wrong
    argument is a :class:`GraphcheckError` naming it."""
    flags = dict(
        normalized=_args.flag("normalized", normalized),
        deny_unused_allow=_args.flag("deny_unused_allow", deny_unused_allow),
        **_allow_args(allow),
    )
    if isinstance(manifest, (list, tuple)):
        verified = _native.verify_pairs(_pair_paths(manifest, live), **flags)
    else:
        verified = _native.verify(
            # Not pairs: any other sequence is refused there, as any value not a document.
            document_source(cast(Document, manifest), "manifest"),
            None if live is None else document_source(live, "live"),
            **flags,
        )
    return Report._from_native(verified)


def _pair_paths(pairs: Sequence, live: Optional[Document]) -> list:
    """``verify``'s list of (manifest, live) pairs, flat, each a path, as the command line
    takes them."""
    if live is not None:
        raise GraphcheckError(
            "manifest is a list of (manifest, live) pairs, which hold the live snapshots, "
            "so live is omitted"
        )
    if not pairs:
        raise GraphcheckError("manifest is an empty list: give one (manifest, live) pair or more")
    paths = []
    for i, pair in enumerate(pairs):
        if isinstance(pair, (str, bytes, Mapping)) or not _args.iterable(pair):
            raise GraphcheckError(
                f"manifest[{i}] is a (manifest, live) pair of paths, not {_args.show(pair)}"
            )
        pair = list(pair)
        if len(pair) != 2:
            raise GraphcheckError(
                f"manifest[{i}] is a (manifest, live) pair of paths, not {len(pair)} items"
            )
        paths += [_args.path(f"manifest[{i}][{j}]", p) for j, p in enumerate(pair)]
    return paths


class VerificationFailed(GraphcheckError, AssertionError):
    """Raised by :func:`assert_clean`: the message is the report's table; ``.report`` is
    the :class:`Report`. An ``AssertionError`` too, so test runners show it as a failed
    assertion."""

    def __init__(self, report: Report):
        super().__init__(report.table)
        self.report = report


def assert_clean(
    manifest: Document,
    live: Optional[Document] = None,
    allow: Optional[Allow] = None,
    *,
    deny_unused_allow: bool = False,
) -> Report:
    """Verifies and raises :class:`VerificationFailed` unless the report is ``ok`` (no
    finding but warnings; with ``deny_unused_allow``, an unused allowlist entry fails too)."""
    report = verify(manifest, live, allow, deny_unused_allow=deny_unused_allow)
    if not report.ok:
        raise VerificationFailed(report)
    return report
