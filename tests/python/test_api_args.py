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


def outcome(call, names, succeeds):
    """None when ``call`` did what its case states: success where ``succeeds``, else a
    GraphcheckError whose message matches ``names`` (the argument, file or JSON path it
    names) and is not a bug's; otherwise what went wrong."""
    try:
        call()
    except graphcheck.InternalError as e:  # a panic (python/src/guard.rs): a bug, never an answer
        return f"a bug, not an answer: {e}"
    except graphcheck.GraphcheckError as e:
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
    """Each case: (label, call, what the error names, whether the value is one it takes),
    as :func:`core_calls`. The patterns are the messages as written for each kind of
    wrong value, so a wrong value accepted, or refused without naming the argument, fails."""
    import graphcheck.torch as gt

    mod = torch.nn.Linear(2, 2)
    empty = {"node_counts": {}, "unread": [], "nodes": []}
    manifest = gt.Recorder(mod).manifest()
    surrogate = isinstance(bad, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in bad)
    unjson = isinstance(bad, (bytes, Opaque, set))
    integer = type(bad) is int
    listlike = isinstance(bad, (list, set))  # iterated: its first item is judged

    def text(name, empty=None):
        """A string argument: ``empty`` is what "" gives (None: it is taken)."""
        if surrogate:
            return rf"^{re.escape(name)} is not valid Unicode: a lone surrogate at position \d"
        if bad == "":
            return empty
        return rf"^{re.escape(name)} is a string, not "

    root_empty = r'^invalid owner path "" at byte 0: a path starts with a root name$'
    root = text("root", root_empty)
    depth = None if integer else r"^max_depth is an integer, not "
    globs = (r"^runtime_state\[0\] is a string, not 1$" if listlike
             else r"^runtime_state is a list of owner-path globs, not the single string .*: write \["
             if isinstance(bad, (str, bytes))
             else r"^runtime_state is a list of owner-path globs, not ")
    roots = (None if isinstance(bad, dict)
             else r"^roots\[0\] is a \(root name, object\) pair, not 1$" if listlike
             else r"^roots is a mapping of root name to object, or \(name, object\) pairs, not ")
    digests = None if bad is True else r"^digests is one of 'gc128', 'sha256', 'sum64', not "
    producer = None if isinstance(bad, dict) else r"^producer is a mapping \(dict\), not "
    torch_pool = None if isinstance(bad, list) else r"^a torch pool is a MemPool, a graph pool handle "

    def tensors(name):
        return (rf"^{name}\['a'\] is a torch.Tensor, not 1$" if isinstance(bad, dict)
                else rf"^{name} is a mapping of name to tensor, not ")

    def path(name):
        if bad == "":
            return rf"^{name} is an empty string, which names no file or folder$"
        if bad == "x\udcff":  # a surrogate escape: the file name's byte 0xff, a valid path
            return None
        if bad == "\ud800":
            return rf"^{name}: a path the file system cannot encode: "
        return rf"^{name} is a path \(str or os.PathLike\), not "

    def flag(name):
        return None if bad is True else rf"^{name} is True or False, not "

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

    walked = (r"^<build spec>: invalid spec at `graphs\[0\]\.walked\.a`: unknown field `a`"
              if isinstance(bad, dict)
              else r"^walked: " if isinstance(bad, (str, bytes))
              else r"^walked is a walked graph \(_native.Walked, JSON text or dict\), not ")
    walked_x = (r"^walked\.x: cannot be written as JSON" if unjson
                else r"^walked\.x: not valid Unicode: a lone surrogate" if surrogate
                else r"^<build spec>: invalid spec at `graphs\[0\]\.walked\.x`: unknown field `x`")
    pool = (r"^<build spec>: failed to build: .* at `graphs\[0\]\.pool`: no pool has id 123$" if integer
            else r"^pool is a pool id, name or torch pool, not True$" if bad is True
            else rf"^no pool named {re.escape(repr(bad))}$" if isinstance(bad, str)
            else None if isinstance(bad, list)
            else torch_pool)
    snapshot_manifest = (r"^manifest: an empty string is neither a path nor a document$" if bad == ""
                         else r"^<manifest>: invalid document at the top level: missing field `format_version`"
                         if isinstance(bad, dict)
                         else r"^<manifest>: a path the file system cannot encode: " if bad == "\ud800"
                         # The manifest Recorder.write(path) wrote under this name above.
                         else None if bad == "x\udcff"
                         else r"^failed to read " if isinstance(bad, bytes)
                         else r"^manifest: expected a document \(a path, a dict or graphcheck.Text\), got ")
    name_format = (None if isinstance(bad, (dict, set))  # "{{'a': 1}}" formats: braces doubled
                   else text("name") if surrogate
                   else r"^name is a format string with \{index\} and \{pid\}, or a callable: .* does not format")
    directory = (r"^directory 'x\\udcff' exists and is not a folder" if bad == "x\udcff"
                 else path("directory"))
    if torch.cuda.is_available():
        # On a GPU these open a pool, sleep or change the process's allocator, and their
        # messages are those of the GPU tests: here only that no bug escapes.
        sleep_case = lambda _name: r""  # noqa: E731
    else:
        sleep_case = lambda _name: r"^the sleep allocator needs CUDA, and torch sees no GPU$"  # noqa: E731
    offload_tags = (r"^offload_tags\[0\] is a string, not 1$" if listlike
                    else text("offload_tags") if surrogate
                    else sleep_case("offload_tags") if bad == ""
                    else r"^offload_tags is a list of tags, not ")

    return [
        # Any object is a model: one that holds no tensor walks to no owner.
        ("walk(model)", lambda: gt.walk(bad), None),
        ("walk(root)", lambda: gt.walk(mod, root=bad), root),
        ("walk(max_depth)", lambda: gt.walk(mod, max_depth=bad), depth),
        ("walk(runtime_state)", lambda: gt.walk(mod, runtime_state=bad), globs),
        ("walk(runtime_state=[bad])", lambda: gt.walk(mod, runtime_state=[bad]),
         r'^runtime_state\[0\]: invalid owner path "" at byte 0' if bad == "" else text("runtime_state[0]")),
        ("walk_roots(roots)", lambda: gt.walk_roots(bad), roots),
        ("walk_roots([bad])", lambda: gt.walk_roots([bad]),
         r"^roots: a root name is a string, not 1$" if isinstance(bad, list)
         else r"^roots\[0\] is a \(root name, object\) pair, not "),
        ("walk_roots([(bad, mod)])", lambda: gt.walk_roots([(bad, mod)]),
         root_empty if bad == "" else text("roots: a root name")),
        ("digest(t)", lambda: gt.digest(bad), r"^t is a torch.Tensor, not "),
        ("digest(algorithm)", lambda: gt.digest(torch.ones(2), bad),
         r"^algorithm is one of 'gc128', 'sha256', 'sum64', not "),
        ("tensor_spec(t)", lambda: gt.tensor_spec(bad), r"^t is a torch.Tensor, not "),
        ("Recorder(root)", lambda: gt.Recorder(mod, root=bad), root),
        ("Recorder(max_depth)", lambda: gt.Recorder(mod, max_depth=bad).manifest(), depth),
        ("Recorder(runtime_state)", lambda: gt.Recorder(mod, runtime_state=bad).manifest(), globs),
        ("Recorder(digests)", lambda: gt.Recorder(mod, digests=bad).manifest(), digests),
        ("Recorder(producer)", lambda: gt.Recorder(mod, producer=bad).manifest(), producer),
        ("Recorder.add_root(root)", recorder_then(lambda r: r.add_root(object(), bad)), root),
        ("Recorder.add_root(weak)", recorder_then(lambda r: r.add_root(mod, "x", weak=bad)), flag("weak")),
        ("Recorder.add_graph(name)", recorder_then(lambda r: r.add_graph(bad, empty)), text("name")),
        ("Recorder.add_graph(walked)", recorder_then(lambda r: r.add_graph("g", bad)), walked),
        ("Recorder.add_graph(walked holding bad)", recorder_then(lambda r: r.add_graph("g", {**empty, "x": bad})),
         walked_x),
        ("Recorder.add_graph(pool)", recorder_then(lambda r: r.add_graph("g", empty, pool=bad)), pool),
        ("Recorder.add_graph(inputs)", recorder_then(lambda r: r.add_graph("g", empty, inputs=bad)), tensors("inputs")),
        ("Recorder.add_graph(inputs={x: bad})", recorder_then(lambda r: r.add_graph("g", empty, inputs={"x": bad})),
         r"^inputs\['x'\] is a torch.Tensor, not "),
        ("Recorder.add_graph(outputs)", recorder_then(lambda r: r.add_graph("g", empty, outputs=bad)), tensors("outputs")),
        ("Recorder.add_pool(name)", recorder_then(lambda r: r.add_pool(bad)), text("name")),
        ("Recorder.add_pool(kind)", recorder_then(lambda r: r.add_pool("p", kind=bad)),
         r"^pool kind is one of \('default', 'graph', 'weights', 'kv_cache', 'other'\), not "),
        ("Recorder.add_pool(sleep)", recorder_then(lambda r: r.add_pool("p", sleep=bad)),
         r"^pool sleep is one of \('untouched', 'restored', 'discarded'\), not "),
        ("Recorder.add_pool(ranges)", recorder_then(lambda r: r.add_pool("p", ranges=bad)),
         r"^ranges\[0\] is a \(base, size\) pair, not 1$" if listlike
         else r"^ranges is a list of \(base, size\) pairs, not "),
        ("Recorder.add_pool(ranges=[bad])", recorder_then(lambda r: r.add_pool("p", ranges=[bad])),
         None if isinstance(bad, list) else r"^ranges\[0\] is a \(base, size\) pair, not "),
        ("Recorder.add_pool(torch_pool)", recorder_then(lambda r: r.add_pool("p", torch_pool=bad)), torch_pool),
        ("Recorder.record(cuda_graph)", recorder_then(lambda r: r.record(bad, "g")),
         r"^cuda_graph is a torch.cuda.CUDAGraph \(keep_graph=True\), not "),
        ("Recorder.write(path)", recorder_then(lambda r: r.write(bad)), path("path")),
        ("snapshot(manifest)", lambda: gt.snapshot(mod, bad), snapshot_manifest),
        ("snapshot(event)", lambda: gt.snapshot(mod, manifest, event=bad), text("event")),
        ("snapshot(contents)", lambda: gt.snapshot(mod, manifest, contents=bad),
         r"^contents is one of 'preserved', 'updated', not "),
        ("snapshot(digests)", lambda: gt.snapshot(mod, manifest, digests=bad), digests),
        ("snapshot(reference)", lambda: gt.snapshot(mod, manifest, reference=bad),
         r"^reference\['a'\] is a string, not 1$" if isinstance(bad, dict)
         else r"^reference is a model loaded fresh .* holds no tensor$"),
        ("snapshot(reference={path: bad})", lambda: gt.snapshot(mod, manifest, reference={"model.weight": bad}),
         text("reference['model.weight']")),
        ("snapshot(root)", lambda: gt.snapshot(mod, manifest, root=bad), root),
        ("snapshot(max_depth)", lambda: gt.snapshot(mod, manifest, max_depth=bad), depth),
        ("snapshot(runtime_state)", lambda: gt.snapshot(mod, manifest, runtime_state=bad),
         r"^runtime_state\[0\] is a string, not 1$" if listlike
         else r"^runtime_state is a list of owner-path globs, not "),
        ("snapshot(pools)", lambda: gt.snapshot(mod, manifest, pools=bad),
         r"^pools: the manifest has no pool named 1$" if isinstance(bad, dict)
         else r"^pools is a mapping \(dict\), not "),
        ("snapshot(pools={(0, 1): bad})", lambda: gt.snapshot(mod, manifest, pools={(0, 1): bad}),
         rf"^pools: the manifest has no pool named {re.escape(repr(bad))}$"),
        ("snapshot(producer)", lambda: gt.snapshot(mod, manifest, producer=bad), producer),
        ("snapshot(roots)", lambda: gt.snapshot(mod, manifest, roots=bad),
         None if isinstance(bad, dict)
         else r"^roots\[0\] is a \(root name, object\) pair, not 1$" if listlike
         else r"^roots is a mapping of root name to object, or \(name, object\) pairs, not "),
        ("graph(cuda_graph)", lambda: gt.graph(bad, model=mod, name="g").__enter__(),
         r"^cuda_graph is a torch.cuda.CUDAGraph \(made with keep_graph=True\), not "),
        # "" is a name; the object() standing in for the graph is then refused.
        ("graph(name)", lambda: gt.graph(object(), model=mod, name=bad).__enter__(),
         text("name", r"^cuda_graph is a torch.cuda.CUDAGraph \(made with keep_graph=True\), not object$")),
        ("graph(recorder)", lambda: gt.graph(object(), recorder=bad, name="g").__enter__(),
         r"^recorder is a graphcheck.torch.Recorder, not "),
        ("graph(inputs)", lambda: gt.graph(object(), model=mod, name="g", inputs=bad).__enter__(), tensors("inputs")),
        ("instrument(directory)", lambda: gt.instrument(bad).close(), directory),
        ("instrument(root)", instrument(model=mod, root=bad), root),
        ("instrument(name)", instrument(name=bad), text("name")),
        ("instrument(name={bad})", instrument(name="{" + str(bad) + "}"), name_format),
        ("instrument(digests)", instrument(digests=bad), digests),
        ("instrument(runtime_state)", instrument(runtime_state=bad),
         r"^runtime_state\[0\] is a string, not 1$" if listlike
         else r"^runtime_state is a list of owner-path globs, not "),
        ("instrument(max_depth)", instrument(max_depth=bad), depth),
        ("instrument(strict)", instrument(strict=bad), flag("strict")),
        ("instrument(write_every)", instrument(write_every=bad),
         None if integer else r"^write_every is an integer, not "),
        ("Instrumentation.write(path)", lambda: gt.instrument(None).write(bad), path("path")),
        ("register_model(root)", lambda: gt.register_model(mod, bad), root),
        ("uninstrument(instrumentation)", lambda: gt.uninstrument(bad),
         r"^uninstrument takes what instrument\(\) returned \(an Instrumentation\) or nothing, not "),
        # A value that is wrong here can still be a valid tag ("x\udcff"): on a GPU machine
        # these calls then really open a pool, sleep or change the process's allocator,
        # which the GPU tests after this one share. What they did is undone.
        ("sleep_pool(tag)", lambda: _entered_and_left(gt.sleep_pool(bad)), sleep_case("tag")),
        ("sleep(level)", lambda: _slept_and_woken(lambda: gt.sleep(bad)), sleep_case("level")),
        ("sleep(offload_tags)", lambda: _slept_and_woken(lambda: gt.sleep(1, bad)), sleep_case("offload_tags")),
        ("wake(tags)", lambda: gt.wake(bad), sleep_case("tags")),
        ("wake(poison)", lambda: gt.wake(None, bad), sleep_case("poison")),
        ("sleep_allocator(offload_tags)", lambda: _offload_tags_kept(lambda: gt.sleep_allocator(bad)), offload_tags),
        ("SleepAllocator(offload_tags)", lambda: gt.SleepAllocator(bad), sleep_case("offload_tags")),
    ]


def _entered_and_left(context):
    context.__enter__()
    context.__exit__(None, None, None)


def _slept_and_woken(call):
    from graphcheck import _sleep_state

    try:
        call()
    finally:
        made = _sleep_state.allocator()
        if made is not None and made.level is not None:
            made.wake()


def _offload_tags_kept(call):
    from graphcheck import _sleep_state

    made = _sleep_state.allocator()
    before = None if made is None else made.offload_tags
    try:
        call()
    finally:
        if before is not None:
            _sleep_state.allocator().offload_tags = before


@pytest.mark.parametrize("bad", WRONG, ids=repr)
def test_every_torch_function_answers_a_wrong_argument_with_graphcheck_error(
    torch, bad, tmp_path, monkeypatch
):
    import graphcheck.torch as gt

    # A wrong value can still be a valid file name ("x\udcff"): what write() writes lands here.
    monkeypatch.chdir(tmp_path)
    try:
        cases = [(label, call, names, names is None) for label, call, names in torch_calls(torch, bad)]
        checked_sweep(bad, cases)
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


def test_a_long_number_is_named_by_its_type():
    # Regression (found by mypy): a number whose repr is over 60 characters made the
    # message fail (len() of an int, a TypeError) instead of naming the argument.
    with pytest.raises(graphcheck.GraphcheckError, match=r"^manifest: expected a document .*, got int$"):
        graphcheck.verify(10**70)
