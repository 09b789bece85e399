"""Type stubs of ``graphcheck._native``, the PyO3 module built from ``python/src/`` (the
``#[pyfunction]``s of ``lib.rs``, ``sleep.rs``, ``digest.rs`` and ``build.rs``). Documents are a path (``str``,
``bytes`` or ``os.PathLike``) or JSON text (``Text``, or a ``str`` or ``bytes`` whose first
non-blank characters are ``{"``). ``tests/python/test_native_stubs.py`` fails when these drift from the module.
"""

import os
from collections.abc import Callable, Sequence
from typing import final

# What the module exports, in the order python/src/ adds them (PyO3 keeps `__all__`).
__all__ = [
    "GraphcheckError",
    "InternalError",
    "FORMAT_VERSION",
    "FORMAT_VERSIONS",
    "EXIT_OK",
    "EXIT_FINDINGS",
    "EXIT_BAD_INPUT",
    "LIVE_KINDS",
    "version",
    "main",
    "Text",
    "load",
    "load_objects",
    "manifest_facts",
    "verify",
    "verify_pairs",
    "Verified",
    "normalized",
    "reads",
    "summary",
    "explain",
    "diff",
    "schema",
    "walk_graph",
    "walk",
    "capturing_graph",
    "Walked",
    "glob_match",
    "check_path",
    "write_atomic",
    "SleepError",
    "SleepOutOfMemoryError",
    "SLEEP_MALLOC_SYMBOL",
    "SLEEP_FREE_SYMBOL",
    "sleep_set_tag",
    "sleep_tag",
    "sleep_sleep",
    "sleep_wake",
    "sleep_level",
    "sleep_tags",
    "sleep_allocations",
    "sleep_stats",
    "sleep_take_error",
    "sleep_release_host_cache",
    "sleep_mem_info",
    "GpuDigestUnavailable",
    "TensorViews",
    "tensor_views",
    "gc128_bytes",
    "digest_host",
    "digest_cuda",
    "gpu_digest_info",
    "digest_ranges",
    "build_manifest",
    "build_live",
    "retarget_plan",
    "apply_plan_host",
    "retargeted_manifest",
    "probed_for",
    "apply_plan_cuda",
]

@final
class Text:
    """A document's JSON text, handed over as such: never taken for a path."""

    def __new__(cls, text: str | bytes, name: str | None = None) -> Text: ...
    @property
    def name(self) -> str | None: ...
    @property
    def parsed(self) -> bool: ...
    def __len__(self) -> int: ...

# A document: a path, or JSON text.
_Source = str | bytes | os.PathLike[str] | Text

class GraphcheckError(Exception):
    """A bad document, allowlist or argument: the message says what and where."""

class InternalError(GraphcheckError):
    """A bug in graphcheck, not a bad input: a panic caught at the boundary; please report
    it."""

class SleepError(GraphcheckError):
    """A sleep-allocator call that cannot be done in the allocator's state, or a driver
    failure."""

class SleepOutOfMemoryError(SleepError):
    """The device ran out of memory on wake; the allocator is still asleep."""

class GpuDigestUnavailable(GraphcheckError):
    """NVRTC could not be loaded or could not compile the GPU digest's kernel, or the
    driver could not load it."""

FORMAT_VERSION: int
FORMAT_VERSIONS: list[int]
EXIT_OK: int
EXIT_FINDINGS: int
EXIT_BAD_INPUT: int
#: The finding kinds only a live snapshot gives (the core's ``FindingKind::LIVE``).
LIVE_KINDS: list[str]
SLEEP_MALLOC_SYMBOL: str
SLEEP_FREE_SYMBOL: str

def version() -> str: ...
def main(argv: Sequence[str]) -> int: ...
def load(
    document: _Source,
    expect: str | None = None,
    name: str | None = None,
    format_version: int = 1,
) -> tuple[str, str]: ...
def load_objects(
    document: _Source,
    expect: str | None = None,
    name: str | None = None,
    format_version: int = 1,
) -> tuple[str, dict]: ...
def manifest_facts(
    document: _Source, name: str | None = None, keep: bool = False
) -> tuple[dict[str, int], str | None]: ...
def verify(
    manifest: _Source,
    live: _Source | None = None,
    allow: str | os.PathLike[str] | None = None,
    allow_entries: str | None = None,
    normalized: bool = False,
    deny_unused_allow: bool = False,
) -> Verified:
    """``manifest`` is a manifest, or a path naming a folder of one run's documents (every
    rank's; ``live`` then omitted), verified as ``graphcheck verify DIR`` verifies it."""
def verify_pairs(
    paths: Sequence[str | os.PathLike[str]],
    allow: str | os.PathLike[str] | None = None,
    allow_entries: str | None = None,
    normalized: bool = False,
    deny_unused_allow: bool = False,
) -> Verified:
    """The ranks of one run as pairs, ``paths`` flat (each manifest, then its live
    snapshot), verified as ``graphcheck verify M0 L0 M1 L1 …`` verifies them."""
@final
class Verified:
    """A verify's documents and report on the Rust side (``verify``): each format is
    rendered when asked for; the table and Markdown are kept once rendered."""

    @property
    def ok(self) -> bool: ...
    @property
    def rendered(self) -> list[str]: ...
    def head(self) -> str: ...
    def findings(self) -> tuple[list[dict], list[dict]] | None: ...
    def json(self) -> str: ...
    def table(self) -> str: ...
    def markdown(self) -> str: ...
    def recapture(self) -> list[str]: ...

def normalized(document: _Source, name: str | None = None) -> str: ...
def reads(manifest: _Source, kernels: bool = True, name: str | None = None) -> str: ...
def summary(document: _Source, name: str | None = None) -> str: ...
def explain(
    manifest: _Source,
    target: str | None = None,
    kernel: str | None = None,
    dot: bool = False,
    normalized: bool = False,
) -> tuple[bool, str]: ...
def diff(a: _Source, b: _Source, format: str = "table") -> tuple[bool, str]: ...
def schema(format_version: int = 2) -> str: ...
# Given the (address, bytes) of each range, a digest "<algorithm>:<hex>" or None for each.
_RangeDigester = Callable[[list[tuple[int, int]]], Sequence[str | None]]

def build_manifest(
    spec: _Source,
    walked: Sequence[Walked] | None = None,
    format_version: int = 2,
    ranges: _RangeDigester | None = None,
) -> str: ...
def build_live(
    spec: _Source,
    manifest: _Source,
    format_version: int = 2,
    ranges: _RangeDigester | None = None,
    keep: bool = False,
) -> str: ...
def glob_match(pattern: str, paths: Sequence[str]) -> list[bool]: ...
def check_path(path: str) -> str: ...
def write_atomic(path: str | os.PathLike[str], data: bytes) -> None: ...
def walk(handle: int) -> Walked: ...
def capturing_graph(stream: int) -> int: ...
def walk_graph(handle: int) -> str: ...
@final
class Walked:
    """A walked graph held on the Rust side (``walk``, ``Walked.from_json``)."""

    @staticmethod
    def from_json(text: str) -> Walked: ...
    def to_json(self) -> str: ...
    def __len__(self) -> int: ...
    @property
    def words(self) -> int: ...
    @property
    def node_counts(self) -> dict[str, int]: ...
    def unexplained(self, known: bytes) -> list[int]: ...

# The sleep allocator (python/src/sleep.rs; graphcheck.sleep wraps these).
def sleep_set_tag(tag: str | None) -> str | None: ...
def sleep_tag() -> str | None: ...
def sleep_sleep(level: int, offload_tags: Sequence[str]) -> dict[str, int]: ...
def sleep_wake(tags: Sequence[str] | None, poison: str) -> dict[str, int]: ...
def sleep_level() -> int | None: ...
def sleep_tags() -> list[str]: ...
def sleep_allocations() -> list[tuple[int, int, int, int, str, str]]: ...
def sleep_stats() -> dict[str, int]: ...
def sleep_take_error() -> str | None: ...
def sleep_release_host_cache() -> int: ...
def sleep_mem_info(device: int) -> tuple[int, int]: ...

# A view for the digest functions: (address of its first element, sizes, strides in
# elements, element size).
_View = tuple[int, Sequence[int], Sequence[int], int]
# Where a view's bytes are read: None (host memory), a CUDA ordinal, or "copy" (through a
# host copy: any other device).
_Place = int | str | None

@final
class TensorViews:
    """Views of tensors read on the native side (``tensor_views``, ``from_metas``)."""

    def __len__(self) -> int: ...
    def devices(self) -> list[_Place]: ...
    def select(self, device: _Place) -> tuple[TensorViews, list[int]]: ...
    @staticmethod
    def from_metas(metas: list[tuple[object, ...]]) -> TensorViews: ...

# The tensors' views, or the position of the first one that is not a strided tensor with
# data. `torch` is the torch module.
def tensor_views(tensors: list[object], torch: object) -> TensorViews | int: ...
def gc128_bytes(data: bytes) -> str: ...
def digest_host(views: TensorViews | Sequence[_View]) -> list[str]: ...
def digest_cuda(
    device: int,
    stream: int,
    views: TensorViews | Sequence[_View],
    nvrtc: str | os.PathLike[str] | None = None,
) -> list[str]: ...
def gpu_digest_info(device: int) -> dict[str, object]: ...
def digest_ranges(
    ranges: Sequence[tuple[int, int]], stream: int, nvrtc: str | os.PathLike[str] | None = None
) -> tuple[list[str | None], str | None]: ...

# Retarget (issue 29): the plan, applying one graph's part, the manifest after.
_Outcome = dict[str, object]  # applied, edits, why, restored
def retarget_plan(
    manifest: _Source,
    live: _Source,
    allow: str | os.PathLike[str] | None = None,
    allow_entries: str | None = None,
) -> str: ...
def apply_plan_host(
    plan: str,
    graph: str,
    words: dict[tuple[int, int, int], int],
    fail_write: int | None = None,
    fail_undo: bool = False,
) -> tuple[_Outcome, dict[tuple[int, int, int], int]]: ...
def retargeted_manifest(manifest: _Source, live: _Source, plan: str, applied: list[str]) -> str: ...
def probed_for(live: _Source, manifest: _Source) -> str: ...
def apply_plan_cuda(plan: str, graphs: list[tuple[str, int, int | None]]) -> list[_Outcome]: ...
