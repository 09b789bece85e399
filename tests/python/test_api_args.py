"""Every public function of graphcheck, graphcheck.torch and graphcheck.sleep answers a
wrong argument with GraphcheckError naming it: never a TypeError, UnicodeEncodeError,
AttributeError or ModuleNotFoundError from inside graphcheck. The sweep calls each
function with each wrong value in each parameter; the named cases are the issue's."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import graphcheck
from conftest import REPO

MARLIN = REPO / "fixtures" / "synthetic" / "marlin_workspace_rebuilt"
M, L = str(MARLIN / "manifest.json"), str(MARLIN / "live.json")


class Opaque:
    """An object of a type no parameter takes."""

    def __repr__(self) -> str:
        return "Opaque()"


#: Wrong values of every kind: numbers, flags, bytes, objects, containers of the wrong
#: shape, strings that are not Unicode (a lone surrogate; a surrogate escape), empty.
WRONG = [123, 1.5, True, b"\xff", Opaque(), {"a": 1}, [1, 2], "\ud800", "x\udcff", {1, 2}, ""]


#: What a panic turned into an error says (python/src/lib.rs, guarded()): a bug, never an
#: answer to a wrong argument.
INTERNAL = "internal error"


def only_graphcheck_errors(call):
    """Runs ``call``; success or a GraphcheckError that is not a bug's pass, any other
    exception fails."""
    try:
        call()
    except graphcheck.GraphcheckError as e:
        if INTERNAL in str(e):
            raise AssertionError(f"a bug, not an answer: {e}") from e


def sweep(calls):
    """Runs every ``(label, call)``; fails listing every one that raised anything but
    GraphcheckError, or a GraphcheckError saying it was an internal error."""
    escaped = []
    for label, call in calls:
        try:
            only_graphcheck_errors(call)
        except Exception as e:  # noqa: BLE001 - what the sweep looks for
            escaped.append(f"{label}: {type(e).__name__}: {e}")
    assert not escaped, "not a GraphcheckError:\n" + "\n".join(escaped)


def outcome(call, names, succeeds):
    """None when ``call`` did what its case states: success where ``succeeds``, else a
    GraphcheckError whose message matches ``names`` (the argument, file or JSON path it
    names) and is not a bug's; otherwise what went wrong."""
    try:
        call()
    except graphcheck.GraphcheckError as e:
        if INTERNAL in str(e):
            return f"a bug, not an answer: {e}"
        if succeeds:
            return f"refused a value it takes: {e}"
        if not re.search(names, str(e)):
            return f"does not name /{names}/: {e}"
        return None
    except Exception as e:  # noqa: BLE001 - what the sweep looks for
        return f"not a GraphcheckError: {type(e).__name__}: {e}"
    return None if succeeds else "accepted"


def checked_sweep(bad, cases):
    """Runs every ``(label, call, names, succeeds)``; fails listing each case whose
    outcome is not the one it states."""
    wrong = []
    for label, call, names, succeeds in cases:
        why = outcome(call, names, succeeds)
        if why is not None:
            wrong.append(f"{label} with {bad!r}: {why}")
    assert not wrong, "\n".join(wrong)


def document(name, tag):
    """The error for a wrong document argument names the parameter, the document's tag,
    or the file it could not read."""
    return rf"^({re.escape(name)}(\[0\])?[: ]|<{re.escape(tag)}>(:\d+:\d+)?: |failed to read )"


def flag(name):
    return rf"^{re.escape(name)} is True or False, not "


# -- graphcheck ---------------------------------------------------------------------------


def core_calls(bad):
    """Each case: (label, call, what the error names, whether the value is one it takes)."""
    g = graphcheck
    entry = {"path": "model.x", "reason": "r"}
    flag_ok = bad is True
    unjson = isinstance(bad, (bytes, Opaque, set))
    # A lone surrogate is named at its JSON path by the Python side, before the core reads it.
    surrogate = isinstance(bad, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in bad)
    return [
        ("verify(manifest)", lambda: g.verify(bad), document("manifest", "manifest"), False),
        ("verify(live)", lambda: g.verify(M, bad), document("live", "live"), False),
        ("verify(allow)", lambda: g.verify(M, L, bad), r"^(allow[ :\[]|failed to read allowlist )", False),
        ("verify(allow=[bad])", lambda: g.verify(M, L, [bad]), r"^(invalid allowlist: )?allow\[0\][ .]", False),
        ("verify(allow kinds)", lambda: g.verify(M, L, [{**entry, "kinds": bad}]), r"^allow\[0\]\.kinds(\[0\])? is a", False),
        ("verify(allow kernels)", lambda: g.verify(M, L, [{"kernels": bad, "reason": "r"}]),
         r"^allow\[0\]\.kernels(\[0\])? is a", False),
        ("verify(allow path)", lambda: g.verify(M, L, [{**entry, "path": bad}]), r"^(invalid allowlist: )?allow\[0\]\.path: ", False),
        ("verify(allow reason)", lambda: g.verify(M, L, [{**entry, "reason": bad}]),
         r"^(invalid allowlist: )?allow\[0\]\.reason: ", False),
        ("verify(normalized)", lambda: g.verify(M, L, normalized=bad), flag("normalized"), flag_ok),
        ("verify(deny_unused_allow)", lambda: g.verify(M, L, deny_unused_allow=bad), flag("deny_unused_allow"), flag_ok),
        ("verify(dict holding bad)", lambda: g.verify({"format_version": 1, "x": [bad]}),
         r"^manifest\.x\[0\]: cannot be written as JSON" if unjson
         else r"^manifest\.x\[0\]: not valid Unicode: a lone surrogate" if surrogate
         else r"^<manifest>:1:\d+: invalid document at the top level: missing field `kind`", False),
        ("assert_clean(manifest)", lambda: g.assert_clean(bad), document("manifest", "manifest"), False),
        ("assert_clean(allow)", lambda: g.assert_clean(M, L, bad), r"^(allow[ :\[]|failed to read allowlist )", False),
        # True is taken, and then the fixture's findings are the error.
        ("assert_clean(deny_unused_allow)", lambda: g.assert_clean(M, L, deny_unused_allow=bad),
         r"^graphcheck verify: 6 findings " if flag_ok else flag("deny_unused_allow"), False),
        ("load(doc)", lambda: g.load(bad), document("document", "string"), False),
        ("load(expect)", lambda: g.load(M, bad), r"^expect is one of 'manifest', 'live', not ", False),
        ("normalized(doc)", lambda: g.normalized(bad), document("document", "string"), False),
        ("summary(doc)", lambda: g.summary(bad), document("document", "string"), False),
        ("build_manifest(spec)", lambda: g.build_manifest(bad), r"^(spec is a dict or JSON text, not |<build spec>: |failed to read )", False),
        ("build_manifest(dict holding bad)", lambda: g.build_manifest({"x": bad}),
         r"^spec\.x: cannot be written as JSON" if unjson
         else r"^spec\.x: not valid Unicode: a lone surrogate" if surrogate
         else r"^<build spec>: invalid spec at `x`: unknown field `x`", False),
        ("explain(manifest)", lambda: g.explain(bad, "model"), document("manifest", "manifest"), False),
        ("explain(target)", lambda: g.explain(M, bad), r"^(the )?target is ", False),
        ("explain(kernel)", lambda: g.explain(M, kernel=bad), r"^(the )?kernel (pattern )?is ", False),
        ("explain(dot)", lambda: g.explain(M, "0x7f2c25200000", dot=bad), flag("dot"), flag_ok),
        ("explain(normalized)", lambda: g.explain(M, "0x7f2c25200000", normalized=bad), flag("normalized"), flag_ok),
        ("diff(a)", lambda: g.diff(bad, M), document("a", "A"), False),
        ("diff(b)", lambda: g.diff(M, bad), document("b", "B"), False),
        ("diff(format)", lambda: g.diff(M, L, format=bad), r"^format is one of 'table', 'markdown', 'json', not ", False),
    ]


@pytest.mark.parametrize("bad", WRONG, ids=repr)
def test_every_core_function_answers_a_wrong_argument_with_graphcheck_error(bad):
    checked_sweep(bad, core_calls(bad))


def test_an_unserialisable_dict_document_names_the_json_path():
    # Regression: json.dumps's TypeError escaped, naming neither the document nor where.
    with pytest.raises(graphcheck.GraphcheckError, match=r"manifest\.tensors\[1\]\.shape: .*set"):
        graphcheck.verify({"tensors": [{}, {"shape": {1, 2}}]})
    with pytest.raises(graphcheck.GraphcheckError, match=r"live\.x: .*nan"):
        graphcheck.verify(M, {"x": float("nan")})
    with pytest.raises(graphcheck.GraphcheckError, match=r"document: .*key of type tuple"):
        graphcheck.load({(1, 2): 3})
    cycle: dict = {}
    cycle["self"] = cycle
    with pytest.raises(graphcheck.GraphcheckError, match=r"document\.self: .*cycle"):
        graphcheck.load(cycle)


def test_flags_are_booleans():
    # Regression: normalized="yes" raised TypeError, and deny_unused_allow="no" meant True.
    with pytest.raises(graphcheck.GraphcheckError, match="normalized is True or False, not 'yes'"):
        graphcheck.verify(M, L, normalized="yes")
    with pytest.raises(graphcheck.GraphcheckError, match="deny_unused_allow is True or False"):
        graphcheck.verify(M, L, deny_unused_allow="no")
    with pytest.raises(graphcheck.GraphcheckError, match="dot is True or False"):
        graphcheck.explain(M, "0x7f2c25200000", dot=1)


def test_a_path_with_a_lone_surrogate_is_an_error_naming_it():
    # Regression: UnicodeEncodeError from the native module's conversion.
    for where, call in [
        ("<manifest>", lambda: graphcheck.verify("/tmp/m\ud800.json")),
        ("<manifest>", lambda: graphcheck.verify(pathlib.Path("/tmp/m\ud800.json"))),
        ("<live>", lambda: graphcheck.verify(M, "/tmp/l\ud800.json")),
        ("allow", lambda: graphcheck.verify(M, L, "/tmp/a\ud800.toml")),
        ("<string>", lambda: graphcheck.load("/tmp/d\ud800.json")),
    ]:
        with pytest.raises(graphcheck.GraphcheckError, match=f"{where}: a path the file system cannot encode"):
            call()
    with pytest.raises(graphcheck.GraphcheckError, match="<manifest>: JSON text that is not valid Unicode"):
        graphcheck.verify('{"kind": "\ud800"}')


def test_a_non_utf8_file_name_still_loads(tmp_path):
    # The surrogate escapes of os.fsdecode name a file whose name is not UTF-8: that is a
    # path the file system encodes, not an error.
    name = os.fsencode(tmp_path) + b"/manifest-\xff.json"
    with open(name, "wb") as f:
        f.write(pathlib.Path(M).read_bytes())
    path = os.fsdecode(name)
    assert "\udcff" in path
    assert graphcheck.load(path)["kind"] == "manifest"
    assert graphcheck.verify(path, L).summary == graphcheck.verify(M, L).summary


def test_allowlist_kinds_as_a_string_names_the_entry_and_key():
    # Regression: a string where a list belongs is never split into letters; the error
    # names allow[i].kinds and says what to write.
    entries = [{"path": "model.a", "reason": "r"}, {"path": "model.b", "reason": "r", "kinds": "unowned"}]
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow\[1\]\.kinds is a list of finding kinds, "
                       r"not the single string 'unowned': write \['unowned'\]"):
        graphcheck.verify(M, L, entries)
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow\[0\]\.kernels is a list"):
        graphcheck.verify(M, L, [{"kernels": "nvjet_*", "reason": "r"}])
    # The list form is accepted.
    graphcheck.verify(M, L, [{"path": "model.b", "reason": "r", "kinds": ["unowned"]}])


def test_allow_as_a_single_dict_says_so():
    # Regression: a dict was iterated as its keys and reported as unknown keys of letters.
    with pytest.raises(graphcheck.GraphcheckError, match=r"not a single dict: write allow=\[\{\.\.\.\}\]") as e:
        graphcheck.verify(M, L, {"path": "model.x", "reason": "r"})
    assert "unknown" not in str(e.value)
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow is an allowlist file .* not 123"):
        graphcheck.verify(M, L, 123)
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow\[0\] is an entry \(a dict\), not 'path'"):
        graphcheck.verify(M, L, ["path"])


# -- graphcheck.torch ---------------------------------------------------------------------


def torch_calls(torch, bad):
    import graphcheck.torch as gt

    mod = torch.nn.Linear(2, 2)
    empty = {"node_counts": {}, "unread": [], "nodes": []}
    manifest = gt.Recorder(mod).manifest()

    def recorder_then(f):
        def call():
            rec = gt.Recorder(torch.nn.Linear(2, 2))
            f(rec)
            rec.manifest()

        return call

    def instrument(**kw):
        def call():
            try:
                gt.instrument(None, **kw).close()
            finally:
                gt.uninstrument()

        return call

    return [
        ("walk(model)", lambda: gt.walk(bad)),
        ("walk(root)", lambda: gt.walk(mod, root=bad)),
        ("walk(max_depth)", lambda: gt.walk(mod, max_depth=bad)),
        ("walk(runtime_state)", lambda: gt.walk(mod, runtime_state=bad)),
        ("walk(runtime_state=[bad])", lambda: gt.walk(mod, runtime_state=[bad])),
        ("walk_roots(roots)", lambda: gt.walk_roots(bad)),
        ("walk_roots([bad])", lambda: gt.walk_roots([bad])),
        ("walk_roots({bad: mod})", lambda: gt.walk_roots({bad: mod}) if isinstance(bad, (str, int, float, bytes)) else None),
        ("digest(t)", lambda: gt.digest(bad)),
        ("digest(algorithm)", lambda: gt.digest(torch.ones(2), bad)),
        ("tensor_spec(t)", lambda: gt.tensor_spec(bad)),
        ("Recorder(root)", lambda: gt.Recorder(mod, root=bad)),
        ("Recorder(max_depth)", lambda: gt.Recorder(mod, max_depth=bad).manifest()),
        ("Recorder(runtime_state)", lambda: gt.Recorder(mod, runtime_state=bad).manifest()),
        ("Recorder(digests)", lambda: gt.Recorder(mod, digests=bad).manifest()),
        ("Recorder(producer)", lambda: gt.Recorder(mod, producer=bad).manifest()),
        ("Recorder.add_root(root)", recorder_then(lambda r: r.add_root(object(), bad))),
        ("Recorder.add_root(weak)", recorder_then(lambda r: r.add_root(mod, "x", weak=bad))),
        ("Recorder.add_graph(name)", recorder_then(lambda r: r.add_graph(bad, empty))),
        ("Recorder.add_graph(walked)", recorder_then(lambda r: r.add_graph("g", bad))),
        ("Recorder.add_graph(walked holding bad)", recorder_then(lambda r: r.add_graph("g", {**empty, "x": bad}))),
        ("Recorder.add_graph(pool)", recorder_then(lambda r: r.add_graph("g", empty, pool=bad))),
        ("Recorder.add_graph(inputs)", recorder_then(lambda r: r.add_graph("g", empty, inputs=bad))),
        ("Recorder.add_graph(inputs={x: bad})", recorder_then(lambda r: r.add_graph("g", empty, inputs={"x": bad}))),
        ("Recorder.add_graph(outputs)", recorder_then(lambda r: r.add_graph("g", empty, outputs=bad))),
        ("Recorder.add_pool(name)", recorder_then(lambda r: r.add_pool(bad))),
        ("Recorder.add_pool(kind)", recorder_then(lambda r: r.add_pool("p", kind=bad))),
        ("Recorder.add_pool(sleep)", recorder_then(lambda r: r.add_pool("p", sleep=bad))),
        ("Recorder.add_pool(ranges)", recorder_then(lambda r: r.add_pool("p", ranges=bad))),
        ("Recorder.add_pool(ranges=[bad])", recorder_then(lambda r: r.add_pool("p", ranges=[bad]))),
        ("Recorder.add_pool(torch_pool)", recorder_then(lambda r: r.add_pool("p", torch_pool=bad))),
        ("Recorder.record(cuda_graph)", recorder_then(lambda r: r.record(bad, "g"))),
        ("Recorder.write(path)", recorder_then(lambda r: r.write(bad))),
        ("snapshot(manifest)", lambda: gt.snapshot(mod, bad)),
        ("snapshot(event)", lambda: gt.snapshot(mod, manifest, event=bad)),
        ("snapshot(contents)", lambda: gt.snapshot(mod, manifest, contents=bad)),
        ("snapshot(digests)", lambda: gt.snapshot(mod, manifest, digests=bad)),
        ("snapshot(reference)", lambda: gt.snapshot(mod, manifest, reference=bad)),
        ("snapshot(reference={path: bad})", lambda: gt.snapshot(mod, manifest, reference={"model.weight": bad})),
        ("snapshot(root)", lambda: gt.snapshot(mod, manifest, root=bad)),
        ("snapshot(max_depth)", lambda: gt.snapshot(mod, manifest, max_depth=bad)),
        ("snapshot(runtime_state)", lambda: gt.snapshot(mod, manifest, runtime_state=bad)),
        ("snapshot(pools)", lambda: gt.snapshot(mod, manifest, pools=bad)),
        ("snapshot(pools={(0, 1): bad})", lambda: gt.snapshot(mod, manifest, pools={(0, 1): bad})),
        ("snapshot(producer)", lambda: gt.snapshot(mod, manifest, producer=bad)),
        ("snapshot(roots)", lambda: gt.snapshot(mod, manifest, roots=bad)),
        ("graph(cuda_graph)", lambda: gt.graph(bad, model=mod, name="g").__enter__()),
        ("graph(name)", lambda: gt.graph(object(), model=mod, name=bad).__enter__()),
        ("graph(recorder)", lambda: gt.graph(object(), recorder=bad, name="g").__enter__()),
        ("graph(inputs)", lambda: gt.graph(object(), model=mod, name="g", inputs=bad).__enter__()),
        ("instrument(directory)", lambda: gt.instrument(bad).close()),
        ("instrument(root)", instrument(model=mod, root=bad)),
        ("instrument(name)", instrument(name=bad)),
        ("instrument(name={bad})", instrument(name="{" + str(bad) + "}")),
        ("instrument(digests)", instrument(digests=bad)),
        ("instrument(runtime_state)", instrument(runtime_state=bad)),
        ("instrument(max_depth)", instrument(max_depth=bad)),
        ("instrument(strict)", instrument(strict=bad)),
        ("instrument(write_every)", instrument(write_every=bad)),
        ("Instrumentation.write(path)", lambda: gt.instrument(None).write(bad)),
        ("register_model(root)", lambda: gt.register_model(mod, bad)),
        ("uninstrument(instrumentation)", lambda: gt.uninstrument(bad)),
        # A value that is wrong here can still be a valid tag ("x\udcff"): on a GPU machine
        # these calls then really open a pool, sleep or change the process's allocator,
        # which the GPU tests after this one share. What they did is undone.
        ("sleep_pool(tag)", lambda: _entered_and_left(gt.sleep_pool(bad))),
        ("sleep(level)", lambda: _slept_and_woken(lambda: gt.sleep(bad))),
        ("sleep(offload_tags)", lambda: _slept_and_woken(lambda: gt.sleep(1, bad))),
        ("wake(tags)", lambda: gt.wake(bad)),
        ("wake(poison)", lambda: gt.wake(None, bad)),
        ("sleep_allocator(offload_tags)", lambda: _offload_tags_kept(lambda: gt.sleep_allocator(bad))),
        ("SleepAllocator(offload_tags)", lambda: gt.SleepAllocator(bad)),
    ]


def _entered_and_left(context):
    context.__enter__()
    context.__exit__(None, None, None)


def _slept_and_woken(call):
    import graphcheck.sleep as gs

    try:
        call()
    finally:
        if gs._ALLOCATOR is not None and gs._ALLOCATOR.level is not None:
            gs._ALLOCATOR.wake()


def _offload_tags_kept(call):
    import graphcheck.sleep as gs

    before = None if gs._ALLOCATOR is None else gs._ALLOCATOR.offload_tags
    try:
        call()
    finally:
        if before is not None:
            gs._ALLOCATOR.offload_tags = before


@pytest.mark.parametrize("bad", WRONG, ids=repr)
def test_every_torch_function_answers_a_wrong_argument_with_graphcheck_error(
    torch, bad, tmp_path, monkeypatch
):
    import graphcheck.torch as gt

    # A wrong value can still be a valid file name ("x\udcff"): what write() writes lands here.
    monkeypatch.chdir(tmp_path)
    try:
        sweep(torch_calls(torch, bad))
    finally:
        gt.uninstrument()


def test_runtime_state_as_a_string_is_an_error_not_its_letters(torch):
    # The rule of allowlist kinds, for the other list of strings: a single glob as a string
    # would have been a list of one-letter globs.
    import graphcheck.torch as gt

    with pytest.raises(graphcheck.GraphcheckError, match=r"runtime_state is a list of owner-path globs, "
                       r"not the single string 'model\.\*\*'"):
        gt.walk(torch.nn.Linear(2, 2), runtime_state="model.**")


def test_writing_into_a_missing_folder_names_the_folder(torch, tmp_path):
    # Regression: the error named the temporary file that could not be made there
    # (`.graphcheck-5k8Xk2.tmp`), not the folder that does not exist.
    import graphcheck.torch as gt

    missing = tmp_path / "no" / "such"
    with pytest.raises(graphcheck.GraphcheckError) as e:
        gt.Recorder(torch.nn.Linear(2, 2)).write(missing / "m.json")
    assert str(e.value) == f"failed to write {missing / 'm.json'}: the folder {missing} does not exist"


def test_a_malformed_runtime_state_glob_is_an_error_naming_it(torch):
    # Regression: `[[` was accepted and matched nothing.
    import graphcheck.torch as gt

    for glob, why in (("[[", "at byte 0: a path starts with a root name"),
                      ("model..x", "at byte 6: expected an attribute name after '.'")):
        with pytest.raises(graphcheck.GraphcheckError) as e:
            gt.walk(torch.nn.Linear(2, 2), runtime_state=["model.**", glob])
        assert str(e.value) == f'runtime_state[1]: invalid owner path "{glob}" {why}'
    gt.walk(torch.nn.Linear(2, 2), runtime_state=["model.layers[*].*", "**.weight"])


def test_an_instrument_name_that_does_not_format_fails_at_once(torch):
    # Before, it failed at every capture, each time as a warning.
    import graphcheck.torch as gt

    with pytest.raises(graphcheck.GraphcheckError, match=r"name is a format string .* 'bs\{batch\}'"):
        gt.instrument(None, name="bs{batch}")
    assert not gt.instrumented()


# -- without torch ------------------------------------------------------------------------

#: Each public function that needs torch, called in a process where `import torch` fails.
NO_TORCH = """
import sys
sys.modules["torch"] = None  # `import torch` raises ModuleNotFoundError
import graphcheck, graphcheck.torch as gt, graphcheck.sleep as gs
calls = {
    "sleep_pool": lambda: gt.sleep_pool("weights").__enter__(),
    "sleep": lambda: gt.sleep(1),
    "wake": lambda: gt.wake(),
    "sleep_allocator": lambda: gt.sleep_allocator(),
    "SleepAllocator": lambda: gs.SleepAllocator(),
    "graphcheck.sleep.sleep_pool": lambda: gs.sleep_pool("kv_cache").__enter__(),
    "walk": lambda: gt.walk(object()),
    "walk_roots": lambda: gt.walk_roots({"model": object()}),
    "digest": lambda: gt.digest(object()),
    "tensor_spec": lambda: gt.tensor_spec(object()),
    "snapshot": lambda: gt.snapshot(object(), sys.argv[1]),
    "Recorder.manifest": lambda: gt.Recorder(object()).manifest(),
    "graph": lambda: gt.graph(object(), model=object(), name="g").__enter__(),
    "instrument": lambda: gt.instrument(None),
}
for name, call in calls.items():
    try:
        call()
        print(f"{name}: no error")
    except graphcheck.GraphcheckError as e:
        print(f"{name}: GraphcheckError: {e}" if "PyTorch" in str(e) else f"{name}: other message: {e}")
    except BaseException as e:
        print(f"{name}: {type(e).__name__}: {e}")
"""


def test_without_torch_every_torch_function_says_torch_is_needed():
    # Regression: gt.sleep_pool without torch raised a bare ModuleNotFoundError.
    env = dict(os.environ)
    env.pop("GRAPHCHECK_DIR", None)
    package = pathlib.Path(graphcheck.__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(package), env.get("PYTHONPATH", "")) if p)
    r = subprocess.run([sys.executable, "-c", NO_TORCH, M], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 14, r.stdout
    wrong = [line for line in lines if ": GraphcheckError: " not in line]
    assert not wrong, "\n".join(wrong)
    assert all("needs PyTorch" in line for line in lines), r.stdout


def test_a_float_format_version_is_a_graphcheck_error():
    """Regression: ``format_version=2.0`` passed the check (``2.0 in (1, 2)``) and the native
    call raised ``TypeError: 'float' object cannot be interpreted as an integer``."""
    calls = [
        ("load", lambda: graphcheck.load(M, format_version=2.0)),
        ("schema", lambda: graphcheck.schema(2.0)),
        ("build_manifest", lambda: graphcheck.build_manifest({}, format_version=1.0)),
    ]
    for label, call in calls:
        with pytest.raises(graphcheck.GraphcheckError, match=r"format_version is one of 1, 2, not \d\.0"):
            call()


def test_a_value_that_is_no_document_is_named_by_its_parameter():
    """Regression: ``verify(M, 5)`` and ``diff(M, None)`` said "expected a document (path,
    JSON text or dict), got int" without saying which argument was wrong."""
    calls = [
        ("manifest", lambda: graphcheck.verify(123)),
        ("live", lambda: graphcheck.verify(M, 123)),
        ("a", lambda: graphcheck.diff(123, L)),
        ("b", lambda: graphcheck.diff(M, None)),
        ("manifest", lambda: graphcheck.explain(Opaque(), "0x1")),
        ("document", lambda: graphcheck.load(1.5)),
    ]
    for name, call in calls:
        with pytest.raises(graphcheck.GraphcheckError, match=rf"^{name}: expected a document"):
            call()


def test_an_empty_path_says_so():
    # Regression: verify("") said "failed to read : No such file or directory".
    for empty in ("", b"", "  "):
        with pytest.raises(graphcheck.GraphcheckError, match="manifest: an empty string is neither"):
            graphcheck.verify(empty)


def test_a_lone_surrogate_in_data_is_named_at_its_path():
    """Regression (issue 25, item 11): a lone surrogate in an allowlist entry or a build
    spec's owner path said "unexpected end of hex escape" (the core reading Python's
    escaped JSON); it is named at its JSON path, as not valid Unicode."""
    manifest = REPO / "fixtures/synthetic/clean_reload_inplace/manifest.json"
    with pytest.raises(
        graphcheck.GraphcheckError,
        match=re.escape(
            "allow[0].path: not valid Unicode: a lone surrogate (U+D800) at position 6"
        ),
    ):
        graphcheck.verify(manifest, allow=[{"path": "model.\ud800", "reason": "x"}])
    with pytest.raises(
        graphcheck.GraphcheckError,
        match=re.escape("spec.owners[0].path: not valid Unicode: a lone surrogate (U+DC80)"),
    ):
        graphcheck.build_manifest({"owners": [{"path": "m.\udc80"}]})
    with pytest.raises(
        graphcheck.GraphcheckError,
        match=re.escape("spec: not valid Unicode: the key '\\udc80' holds a lone surrogate"),
    ):
        graphcheck.build_manifest({"\udc80": 1})
