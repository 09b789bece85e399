"""The :class:`Instrumentation` that :func:`graphcheck.torch.instrument` returns: the
recorder every capture of the process goes into (a forked child starts its own), the
roots it walks (named, or discovered at the first capture), the facts of each capture
frozen for its manifest, and the manifest file its writer thread writes."""

from __future__ import annotations

import json
import os
from typing import Callable, Optional, Union

from .. import _args, _discover, _native
from .._native import GraphcheckError
from .._recorder import OwnersNotCurrent, Recorder, fatal
from .._torch_import import import_torch
from .._walk import root_arg
from . import writer
from .host import claim_manifest_path, rank_and_world, warn
from .patch import LOCK, stop
from .replay_check import Checker
from .transitions import epoch
from .writer import ManifestWriter

__all__ = ["DEFAULT_NAME", "Instrumentation"]

#: Graph names where nothing better is known; a torch.compile tree graph is named by its
#: tree instead (``inductor_fn0_graph1[8x256]``).
DEFAULT_NAME = "capture{index}"

_NOT_WRITTEN = "the manifest was not written (the captures are kept; the next write retries)"


def _built(frozen: list) -> str:
    """The manifest of ``frozen`` ([captures, manifest or Frozen, epoch]) as JSON text,
    built from its facts at the first ask and kept."""
    value = frozen[1]
    if isinstance(value, str):
        return value
    text = Recorder.build_frozen(value, late=_not_digested)
    frozen[1] = text  # one list item stored: another thread sees the facts or the text
    return text


def _not_digested(blocks: list) -> list:
    """The build's digests of blocks its freeze did not read (``Recorder.build_frozen``):
    none, said. Read now, they could hold a wake's poison, or be read on a thread with no
    CUDA context; unread, their contents are not compared after a transition."""
    warn(
        f"graphcheck: {len(blocks)} allocator block(s) the graphs read that no owner explains "
        "were not digested at the capture (the manifest records no digest for them, and a "
        "loss of their contents is not reported): "
        + ", ".join(f"{hex(a)}+{n}" for a, n in blocks[:4])
    )
    return [None] * len(blocks)


class Instrumentation:
    """What :func:`instrument` returns: the recorder every capture of the process goes
    into, and the manifest file it writes (``path``, ``None`` until the first capture or
    without a directory). A context manager: leaving it uninstruments."""

    def __init__(
        self,
        directory,
        *,
        name: Union[str, Callable[[int], str]],
        strict: bool,
        recorder_args: dict,
        write_every: int = 1,
        verify_on_replay: Optional[str] = None,
        discover: bool = True,
        keep_templates: bool = False,
    ):
        write_every = _args.integer("write_every", write_every, minimum=1)
        self.directory = None if directory is None else _args.path("directory", directory)
        if self.directory is not None and os.path.exists(self.directory) and not os.path.isdir(
            self.directory
        ):
            # Found at the first write otherwise, after the captures it should have kept.
            raise GraphcheckError(
                f"directory {self.directory!r} exists and is not a folder: instrument() "
                "writes its manifests into a folder (made if missing)"
            )
        #: Rewrite the manifest after every this many captures (and at exit): rebuilding it
        #: costs more as graphs accumulate, and an engine may capture dozens.
        self.write_every = write_every
        self._unwritten = 0
        self.name = name
        self.strict = strict
        self._recorder_args = recorder_args
        #: The :class:`graphcheck.torch.Recorder` every capture goes into (add pools here).
        self.recorder = Recorder(None, **recorder_args)
        #: The manifest file this instrumentation writes, once it has written (``None`` in
        #: memory: ``instrument(False)``, or before the first write).
        self.path: Optional[str] = None
        #: Captures recorded, and errors met (when not ``strict``), in this process.
        self.captures = 0
        #: The errors met while recording (when not ``strict``), each also warned.
        self.errors: list = []
        self._pid = os.getpid()
        #: The replay check (``verify_on_replay``), or None.
        self._checker = (
            None if verify_on_replay is None else Checker(self, verify_on_replay)
        )
        # Graph name -> replay_check.GraphState, for the graphs this instrumentation recorded.
        self._states: dict = {}
        #: Graphs the last :func:`check` left out: torch will not replay them again.
        self.superseded: list = []
        # [captures, manifest, epoch] of the latest capture: the manifest as JSON text, or
        # the facts it is built from (Frozen) until something asks for it (None: built
        # when asked, from the facts of then).
        self._frozen: Optional[list] = None
        self._writer = ManifestWriter(self._write_latest)
        self.discover = discover
        #: Whether graphs made while this instrumentation is live keep their templates
        #: (``keep_graph=True``, for retarget); else each is walked while its capture is
        #: open and torch destroys the template at instantiate.
        self.keep_templates = keep_templates
        #: Root names discovery chose (zero-code attach), empty where roots were named.
        self.discovered: list = []

    # Recording ----------------------------------------------------------------------

    def _fork_check(self) -> None:
        """A forked child starts its own manifest: the parent's graphs are not its own."""
        if os.getpid() != self._pid:
            roots = self.recorder._roots
            self.recorder = Recorder(None, **self._recorder_args)
            self.recorder._roots = list(roots)
            self.path, self.captures, self.errors, self._pid = None, 0, [], os.getpid()
            self._frozen = None
            # The parent's writer thread is not in the child.
            self._writer = ManifestWriter(self._write_latest)

    def _graph_name(self, hint: Optional[str] = None) -> str:
        if callable(self.name):
            return str(self.name(self.captures))
        if hint is not None and self.name == DEFAULT_NAME:
            return hint
        return self.name.format(index=self.captures, pid=os.getpid())

    def _discover_roots(self) -> None:
        """Zero-code attach (:mod:`graphcheck._discover`): at the first capture of an
        instrumentation with no root, the top-level modules alive become its roots."""
        if not self.discover or self.discovered or self.recorder._roots:
            return
        self.discover = False  # once: a process with no module stays bare
        try:
            found = _discover.discover(import_torch())
        except Exception as e:  # noqa: BLE001 - the graph is recorded bare instead
            self._failed(e, f"the model could not be discovered (graphs are recorded without owners): {e}")
            return
        for root, module in found or ():
            self.recorder.add_root(module, root, weak=True)
            self.discovered.append(root)

    def _record(self, walked, pool, state=None, hint: Optional[str] = None) -> None:
        # A graph the recorder took counts as recorded even where what follows fails (its
        # owners' walk, the write): the warning says what was lost, and no more.
        later: list = []
        try:
            with LOCK:
                self._fork_check()
                name = self._graph_name(hint)
                self._discover_roots()
                try:
                    self.recorder.add_graph(name, walked, pool=pool)
                except OwnersNotCurrent as e:
                    later.append((e, str(e)))
                if state is not None:
                    state.names[id(self)] = name
                    state.learn_paths(self.recorder.registry)
                    self._states[name] = state
                    if state.static_ptrs:
                        self.recorder.guard_graph(
                            name, [(p, state.static_paths.get(p, ())) for p in state.static_ptrs]
                        )
                self.captures += 1
                # The facts of the manifest are read now, while the allocator, the owners
                # and the contents are the capture's: one built after a wake would digest
                # the poison, and after a step would see a freed intermediate as free
                # memory. The manifest is built from them when a write or a check asks
                # (with digests, the memory no owner explains is digested at the freeze
                # and the build looks it up). A directory with write_every > 1 (and no
                # check or digest asking for capture-time facts) reads them at the
                # captures it writes at only.
                if (
                    self.directory is None
                    or self._unwritten + 1 >= self.write_every
                    or self._checker is not None
                    or self.recorder.digests
                ):
                    try:
                        self._frozen = [self.captures, self._freeze(), epoch()]
                    except BaseException as e:  # noqa: BLE001 - built when asked instead
                        if fatal(e):
                            raise
                        # Said already where it matters (a failed owner walk above); a
                        # write or a check builds it again and says so if it fails.
                        self._frozen = None
                self._unwritten += 1
                if self.directory is not None and self._unwritten >= self.write_every:
                    try:
                        self._write_later()
                    except BaseException as e:  # noqa: BLE001 - a panic too
                        if fatal(e):
                            raise
                        later.append((e, f"{_NOT_WRITTEN}: {e}"))
        except BaseException as e:  # noqa: BLE001 - a panic too, never into the engine
            if fatal(e):
                raise
            self._failed(e)
        for error, message in later:
            self._failed(error, message)

    def _failed(self, e: BaseException, message: Optional[str] = None) -> None:
        """Keeps a recording failure in :attr:`errors` and warns (``strict``: raises it).
        ``message`` says what was lost (default: the capture, for ``e``)."""
        if self.strict:
            raise e
        self.errors.append(e)
        warn(f"graphcheck: {message or f'a capture was not recorded: {e}'}")

    # Output -------------------------------------------------------------------------

    def manifest_path(self) -> Optional[str]:
        """``<directory>/graphcheck-<rank>-<pid>.json``, fixed at the first write; where
        another instrumentation of this process wrote into the directory before,
        ``<directory>/instrumentation-<n>/graphcheck-<rank>-<pid>.json`` for the n-th, with
        a warning saying so (:func:`instrument`)."""
        with LOCK:
            if self.path is None and self.directory is not None:
                self.path, n = claim_manifest_path(self.directory)
                if n > 1:
                    warn(
                        f"graphcheck: an earlier instrumentation of this process has its "
                        f"manifest in {self.directory!r}; this one writes {self.path!r} "
                        "(each folder holds one manifest per process, as `graphcheck verify "
                        "DIR` takes a run: verify the folders one by one)"
                    )
            return self.path

    def manifest_json(self) -> str:
        """The manifest of every capture recorded so far in this process, as JSON text:
        as built at the latest capture (the facts of then), else built now."""
        return self._manifest_and_epoch()[0]

    def _manifest_and_epoch(self, as_text: bool = False) -> tuple:
        """The manifest and the transition epoch its facts (digests) are of; ``as_text``:
        the manifest as a ``_native.Text``, one object per frozen manifest."""
        with LOCK:
            self._fork_check()
            frozen = self._frozen
            if frozen is None or frozen[0] != self.captures:
                built = self._build_json()
                return (_native.Text(built) if as_text else built), epoch()
        if not as_text:
            return _built(frozen), frozen[2]
        if len(frozen) < 4:
            frozen.append(_native.Text(_built(frozen)))  # one item added: a reader sees it or not
        return frozen[3], frozen[2]

    def _producer_rank(self) -> None:
        rank, world = rank_and_world()
        self.recorder.producer.setdefault("rank", rank)
        self.recorder.producer.setdefault("world_size", world)

    def _freeze(self):
        with LOCK:
            self._producer_rank()
            return self.recorder.freeze()

    def _build_json(self) -> str:
        with LOCK:
            self._producer_rank()
            return self.recorder.manifest_json()

    def _write_later(self) -> None:
        """Has the writer thread write the manifest of the latest capture: the build (the
        core's part without the GIL) and the write leave the capture path, and a writer
        still busy when more captures come writes only the latest once done. A manifest
        not frozen at this capture, or ``strict``, is written here and now."""
        frozen = self._frozen
        if self.strict or frozen is None or frozen[0] != self.captures:
            self.write()
            return
        self.manifest_path()
        self._unwritten = 0
        try:
            self._writer.ask(frozen[0])
        except BaseException:
            self._unwritten = max(self._unwritten, 1)  # no thread: flush writes it
            raise

    def _write_latest(self) -> Optional[int]:
        """The writer thread's write: the manifest of the latest capture, as frozen then;
        returns how many captures it holds (``None``: their facts were not read)."""
        with LOCK:
            frozen, path = self._frozen, self.path
        try:
            if frozen is None:  # the latest capture's facts could not be read
                raise GraphcheckError("the facts of the latest capture were not read")
            assert path is not None  # manifest_path() ran before the writer was asked
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            _native.write_atomic(path, _built(frozen).encode())
        except BaseException as e:  # noqa: BLE001 - a panic too, never into the engine
            if not fatal(e):
                with LOCK:
                    self._unwritten = max(self._unwritten, 1)  # flush tries again
                self._failed(e, f"{_NOT_WRITTEN}: {e}")
        return None if frozen is None else frozen[0]

    def manifest(self) -> dict:
        """The manifest of every capture recorded so far in this process."""
        return json.loads(self.manifest_json())

    def write(self, path=None) -> str:
        """Writes the manifest atomically (to ``path``, or :meth:`manifest_path`); returns
        the path."""
        target = _args.path("path", path) if path is not None else self.manifest_path()
        if target is None:
            raise GraphcheckError("instrument() has no directory: pass write() a path")
        os.makedirs(os.path.dirname(os.path.abspath(target)), exist_ok=True)
        # Compact JSON straight from the core: no Python parse and dump after every capture.
        _native.write_atomic(target, self.manifest_json().encode())
        if path is None:
            self._unwritten = 0
        return target

    def flush(self) -> Optional[str]:
        """Writes the manifest if captures were recorded since the last write (with a
        directory); returns the path written, if any. Runs at interpreter exit, and when
        the instrumentation stops."""
        if os.getpid() != self._pid:
            return None
        waited = writer.FLUSH_WAIT_S  # read at each flush: the tests shorten it
        if not self._writer.wait(waited):
            self._failed(
                GraphcheckError(f"the writer thread did not finish in {waited:g} s"),
                f"the manifest of the latest captures may not be written: the writer thread "
                f"was still busy after {waited:g} s (a stalled file system?)",
            )
        with LOCK:
            # Addresses the recorder's walks left waiting (Recorder.catch_up): walked for
            # now, and the manifest built again with what that walk found.
            try:
                if self.recorder.catch_up():
                    self._frozen = None
                    self._unwritten = max(self._unwritten, 1)
            except BaseException as e:  # noqa: BLE001 - the manifest is written without it
                if fatal(e):
                    raise
                self._failed(e, f"the walk for the addresses left waiting failed: {e}")
        if self.directory is None or self._unwritten == 0:
            return None
        try:
            return self.write()
        except BaseException as e:  # noqa: BLE001 - reported like a failed recording
            if fatal(e):
                raise
            self._failed(e, f"{_NOT_WRITTEN}: {e}")
            return None

    def register_model(self, model, root: str = "model") -> None:
        """Adds a root to this instrumentation's walks (held weakly); a root of the same
        name is replaced (a model loaded again)."""
        root_arg("model", model)
        with LOCK:
            rec = self.recorder
            self._frozen = None  # the next manifest walks the new root
            # A root named explicitly replaces the discovered ones.
            gone = set(self.discovered) | {root}
            self.discovered = []
            self.discover = False
            rec._roots = [(r, x) for r, x in rec._roots if r not in gone]
            if rec.root in gone:
                rec.model = None
            rec.add_root(model, root, weak=True)

    def close(self) -> None:
        """Stops this instrumentation; the patch goes when no other is live."""
        stop(self)

    def __enter__(self) -> "Instrumentation":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
