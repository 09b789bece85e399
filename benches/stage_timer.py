"""Stage timers for a benchmark: named functions wrapped so that every call adds its wall
time to its stage (inclusive: a stage called inside another counts in both). The wrapper
costs well under a microsecond a call and wraps the same functions in every mode, plain
included (torch's own), so modes stay comparable. ``engine_scale.py --split`` uses it to
show where each graph's capture time goes."""
import importlib
import time


class Stages:
    def __init__(self):
        self.acc: dict = {}

    def wrap(self, owner, attr: str, label: str) -> None:
        if isinstance(owner, type):  # the class in the MRO that defines it
            original = next((c.__dict__[attr] for c in owner.__mro__ if attr in c.__dict__), None)
        else:
            original = getattr(owner, attr, None)
        if original is None or isinstance(original, (staticmethod, classmethod)):
            raise SystemExit(f"stage {label}: {owner!r}.{attr} is not a plain function")
        acc = self.acc
        clock = time.perf_counter

        def timed(*args, **kwargs):
            t0 = clock()
            try:
                return original(*args, **kwargs)
            finally:
                n, s = acc.get(label, (0, 0.0))
                acc[label] = (n + 1, s + clock() - t0)

        timed.__wrapped__ = original
        timed.__doc__ = getattr(original, "__doc__", None)
        setattr(owner, attr, timed)

    def watch_gc(self) -> None:
        """Times the garbage collector's passes as stage ``gc: generation N``."""
        import gc

        acc, clock, started = self.acc, time.perf_counter, []

        def callback(phase, info):
            if phase == "start":
                started.append(clock())
            elif started:
                label = f"gc: generation {info.get('generation')}"
                n, s = acc.get(label, (0, 0.0))
                acc[label] = (n + 1, s + clock() - started.pop())

        gc.callbacks.append(callback)

    def take(self) -> dict:
        """{stage: {"calls": n, "ms": total}} since the last take, and reset."""
        out = {k: {"calls": n, "ms": s * 1e3} for k, (n, s) in sorted(self.acc.items())}
        self.acc.clear()
        return out


#: (module, object path or "", attribute, stage) of graphcheck's capture path and torch's.
CAPTURE_PATH = [
    ("graphcheck._instrument.patch", "", "on_capture", "graphcheck: on_capture (all of it)"),
    ("graphcheck._instrument.patch", "", "walk_graph", "walk (driver, Rust)"),
    ("graphcheck._instrument.patch", "", "walk_open_capture", "walk of the open capture (before capture_end)"),
    ("graphcheck._instrument.instrumentation", "Instrumentation", "_record", "record"),
    ("graphcheck._recorder", "Recorder", "add_graph", "record: add_graph"),
    ("graphcheck._recorder", "Recorder", "_keep_current", "record: add_graph: owners current"),
    ("graphcheck._recorder", "Recorder", "_note_unexplained", "record: add_graph: unexplained (digests)"),
    ("graphcheck._recorder", "Recorder", "rewalk", "record: registry walk"),
    ("graphcheck._instrument.replay_check", "GraphState", "learn_paths", "record: learn_paths"),
    ("graphcheck._instrument.instrumentation", "Instrumentation", "_freeze", "record: freeze"),
    ("graphcheck._caching_allocator", "", "memory_segments", "record: freeze: memory_snapshot"),
    ("graphcheck._ranges", "", "frozen_digests", "record: freeze: range digests"),
    ("graphcheck._instrument.instrumentation", "Instrumentation", "_write_later", "record: hand to writer"),
    ("graphcheck._instrument.instrumentation", "", "_built", "build (writer thread or check)"),
    ("graphcheck._instrument.patch", "", "tree_node_of", "capture_begin: tree node lookup"),
    ("graphcheck._instrument.patch", "", "force_keep_graph", "new/init: keep_graph forced"),
]


def install(stages: Stages, torch, cpu: bool) -> None:
    """Wraps torch's capture_end and instantiate (the class instrument() subclasses, before
    it does) and graphcheck's capture path."""
    cls = torch.cuda.CUDAGraph
    if not cpu:
        stages.wrap(cls, "capture_end", "torch: capture_end (instantiates unless the template is kept)")
        stages.wrap(cls, "instantiate", "torch: instantiate")
    for module, path, attr, label in CAPTURE_PATH:
        owner = importlib.import_module(module)
        for part in filter(None, path.split(".")):
            owner = getattr(owner, part)
        stages.wrap(owner, attr, label)
    stages.watch_gc()
