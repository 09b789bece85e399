"""graphcheck._native and the package's core API without torch: documents as paths, text
or dicts; every bad input is one GraphcheckError naming what and where, never a
PanicException; build_manifest resolves hand-written walked graphs."""

import json
import threading

import pytest

import graphcheck
from conftest import REPO

FIXTURES = REPO / "fixtures"
INDEX = json.loads((FIXTURES / "index.json").read_text())
MARLIN = FIXTURES / "synthetic" / "marlin_workspace_rebuilt"


def test_exception_type_and_constants():
    assert graphcheck.GraphcheckError is graphcheck._native.GraphcheckError
    assert issubclass(graphcheck.GraphcheckError, Exception)
    assert graphcheck.GraphcheckError.__module__ == "graphcheck"
    assert (graphcheck.EXIT_OK, graphcheck.EXIT_FINDINGS, graphcheck.EXIT_BAD_INPUT) == (0, 1, 2)
    assert graphcheck.FORMAT_VERSION == 2
    assert graphcheck.FORMAT_VERSIONS == (1, 2)


@pytest.mark.parametrize("bad", INDEX["bad"], ids=lambda b: b["file"])
def test_bad_fixtures_raise_graphcheck_error_with_file_and_json_path(bad):
    path = FIXTURES / bad["file"]
    with pytest.raises(graphcheck.GraphcheckError) as raised:
        if bad["as"] == "allow":
            graphcheck.verify(MARLIN / "manifest.json", allow=path)
        elif bad["as"] == "live":
            # Verified against the manifest the bad inputs are cut from (the first scenario's):
            # some are valid alone and refused only as a pair.
            graphcheck.verify(FIXTURES / INDEX["scenarios"][0]["manifest"], path)
        else:
            graphcheck.load(path, expect=bad["as"])
    for part in bad["error_contains"]:
        assert part in str(raised.value)


def test_a_dict_of_another_version_is_refused_before_its_body_is_read():
    """Regression: a v1 body under format_version 2 was verified from a dict as if it were v1.
    Now that 2 is a version, a body of either version under 3, 0 or 99 is refused, and a
    format 1 body under 2 is refused where the layouts differ."""
    manifest = json.loads((MARLIN / "manifest.json").read_text())
    live = json.loads((MARLIN / "live.json").read_text())
    assert manifest["format_version"] == 2
    graphcheck.verify(manifest, live)
    expanded = graphcheck.load(manifest)
    graphcheck.verify(expanded, graphcheck.load(live))
    for doc, version in ((manifest, 3), (expanded, 0), (live, 99)):
        doc = dict(doc, format_version=version)
        args = (doc, live) if doc["kind"] == "manifest" else (manifest, doc)
        with pytest.raises(graphcheck.GraphcheckError, match=f"`format_version` is {version}, but"):
            graphcheck.verify(*args)
    with pytest.raises(graphcheck.GraphcheckError, match="must be the number 1 or 2, not the string"):
        graphcheck.verify(dict(manifest, format_version="1"))
    with pytest.raises(graphcheck.GraphcheckError, match="the body is in format 1's layout"):
        graphcheck.verify(dict(expanded, format_version=2))


def test_text_and_dicts_name_themselves_in_errors():
    with pytest.raises(graphcheck.GraphcheckError, match=r"<string>:1:\d+: .*missing field `producer`"):
        graphcheck.load('{"format_version": 1, "kind": "manifest"}')
    with pytest.raises(graphcheck.GraphcheckError, match="<manifest>"):
        graphcheck.verify({"format_version": 1, "kind": "manifest"})
    with pytest.raises(graphcheck.GraphcheckError, match="failed to read"):
        graphcheck.load(REPO / "no such file.json")
    with pytest.raises(graphcheck.GraphcheckError, match="expected a document"):
        graphcheck.load(42)
    with pytest.raises(graphcheck.GraphcheckError, match="`kind` is `live`"):
        graphcheck.load(MARLIN / "live.json", expect="manifest")


def test_the_same_document_as_path_text_bytes_and_dict():
    path = MARLIN / "manifest.json"
    text = path.read_text()
    as_dict = graphcheck.load(path)
    assert as_dict == graphcheck.load(text) == graphcheck.load(text.encode()) == graphcheck.load(as_dict)
    a = graphcheck.verify(path, MARLIN / "live.json")
    b = graphcheck.verify(json.loads(text), json.loads((MARLIN / "live.json").read_text()))
    assert a.findings == b.findings and a.table == b.table


def test_report_object():
    r = graphcheck.verify(MARLIN / "manifest.json", MARLIN / "live.json")
    assert not r.ok and not r
    assert r.summary == {"drifted": 2, "freed": 2, "unregistered": 2}
    assert str(r) == r.table and "drifted" in r.table
    assert r.markdown.startswith("#") or "|" in r.markdown
    assert json.loads(r.json)["format_version"] == 1
    f = r.of_kind("drifted")[0]
    assert f.owners[0].path == f.subject and f.kernels and f.graphs
    assert r.recapture() == ["decode_bs1", "decode_bs8"]
    normalized = graphcheck.verify(MARLIN / "manifest.json", MARLIN / "live.json", normalized=True)
    assert len(normalized.findings) == len(r.findings)
    assert "0x7f" not in normalized.json


def test_allowlist_errors():
    """Entries go to the core as data: errors name the entry and key, never generated TOML."""
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow\[0\]\.reason: every entry says why"):
        graphcheck.verify(MARLIN / "manifest.json", allow=[{"path": "model.x", "reason": " "}])
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow\[0\]\.why: unknown field `why`"):
        graphcheck.verify(MARLIN / "manifest.json", allow=[{"path": "x", "reason": "r", "why": 1}])
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow\[1\]\.kinds\[0\]: unknown variant `nope`"):
        graphcheck.verify(
            MARLIN / "manifest.json",
            allow=[{"path": "x", "reason": "r"}, {"path": "y", "kinds": ["nope"], "reason": "r"}],
        )
    # A string with TOML's quoting characters is data, not syntax: judged as an owner path
    # (this one is none), never parsed as TOML.
    tricky = 'model."x"\n[[allow]]'
    with pytest.raises(graphcheck.GraphcheckError, match=r"allow\[0\]\.path: invalid owner path") as e:
        graphcheck.verify(MARLIN / "manifest.json", allow=[{"path": tricky, "reason": "r"}])
    assert "TOML" not in str(e.value)
    # A valid key hop holding those characters is data all through: an entry that allows
    # nothing, named by its glob.
    keyed = 'model["x\\"\n[[allow]]"]'
    report = graphcheck.verify(MARLIN / "manifest.json", allow=[{"path": keyed, "reason": "r"}])
    assert any(f.subject == keyed for f in report.findings), report.findings


def test_schema_is_the_committed_one():
    for version in (1, 2):
        committed = json.loads((REPO / "schema" / f"graphcheck-v{version}.schema.json").read_text())
        assert graphcheck.schema(version) == committed
    assert graphcheck.schema() == graphcheck.schema(2)


def producer():
    return {"tool": "test", "tool_version": "0", "rank": 0, "world_size": 1}


def spec_tensor(base, nbytes, dtype="float32", itemsize=4):
    return {
        "storage_base": hex(base),
        "storage_nbytes": nbytes,
        "offset": 0,
        "nbytes": nbytes,
        "shape": [nbytes // itemsize],
        "stride": [1],
        "dtype": dtype,
        "itemsize": itemsize,
        "device": "cuda:0",
    }


def build_spec():
    node = {
        "index": 0,
        "kind": "kernel",
        "name": "k",
        "words": [
            {"param": 0, "offset": 0, "addr": "0x10000", "allocation": ["0x10000", 0x10000]},
            {"param": 1, "offset": 8, "addr": "0x20010", "allocation": ["0x20000", 0x1000]},
        ],
    }
    return {
        "producer": producer(),
        "pools": [{"name": "weights", "kind": "weights", "sleep": "restored"}],
        "pool_ranges": [{"base": "0x10000", "size": 0x10000, "pool": 0}],
        "tensors": [spec_tensor(0x10000, 256), spec_tensor(0x10000, 256)],
        "owners": [
            {"path": "model.w", "tensor": 0, "registration": "parameter", "holder": "Linear"},
            {"path": "model.alias", "tensor": 1, "registration": "module_attribute"},
        ],
        "graphs": [{"name": "g", "walked": {"node_counts": {"kernel": 1}, "unread": [], "nodes": [node]}}],
    }


def test_build_manifest_resolves_words():
    compact = graphcheck.build_manifest(build_spec())
    assert compact["format_version"] == 2
    m = graphcheck.build_manifest(build_spec(), format_version=1)
    assert m == graphcheck.load(compact)
    assert len(m["tensors"]) == 1  # two specs of one view
    assert {o["path"] for o in m["owners"]} == {"model.w", "model.alias"}
    touches = m["graphs"][0]["nodes"][0]["touches"]
    assert touches[0]["tensor"] == 0 and "tensor" not in touches[1]
    assert m["tensors"][0]["pool"] == 0
    report = graphcheck.verify(m)
    assert [f.kind for f in report.findings] == ["unowned"]


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda s: s["owners"][0].update(tensor=7), r"owners\[0\]\.tensor: no tensor at position 7"),
        (lambda s: s["owners"][1].update(path="model.w", tensor=0) or s["tensors"].append(spec_tensor(0x30000, 8)) or s["owners"].append({"path": "model.w", "tensor": 2, "registration": "buffer"}), "given twice"),
        (lambda s: s["owners"][0].update(path="model..w"), r"owners\[0\]: invalid owner path"),
        (lambda s: s["pool_ranges"][0].update(pool=5), r"pool_ranges\[0\]: no pool5 was declared"),
        (lambda s: s["graphs"][0].update(pool=9), "no pool has id 9"),
        (lambda s: s["tensors"][0].update(nbytes=1 << 20), r"tensors\[0\]\.nbytes`: `nbytes` is 1048576, but the view float32\[64\] stride \[1\] of 4 bytes per element spans 256"),
        (lambda s: s["tensors"][0].update(storage_nbytes=8), r"tensors\[0\]\.nbytes`: the view \(offset 0, 256 bytes\) lies outside its storage of 8 bytes"),
        (lambda s: s["graphs"][0]["walked"]["nodes"][0]["words"][0].update(addr=12), r"graphs\[0\]\.walked\.nodes\[0\]\.words\[0\]\.addr"),
        (lambda s: s.update(surprise=1), "unknown field `surprise`"),
    ],
    ids=["owner tensor", "duplicate path", "bad path", "pool range", "graph pool", "view", "storage", "addr", "unknown key"],
)
def test_build_manifest_errors(change, message):
    spec = build_spec()
    change(spec)
    with pytest.raises(graphcheck.GraphcheckError, match=message):
        graphcheck.build_manifest(spec)


def test_not_json_is_an_error_not_a_panic():
    # A string that does not parse as a spec is read as a path (the spec is a path or JSON
    # text), so the error names the file; one that parses names the JSON path.
    for bad, message in [
        ("{", "failed to read {: No such file or directory (os error 2)"),
        ("{}", "failed to read {}: No such file or directory (os error 2)"),
        ('{"producer": 1}', "<build spec>: invalid spec at `producer`: invalid type: integer `1`, "
         "expected struct Producer at line 1 column 14"),
        ("[1, 2]", "failed to read [1, 2]: No such file or directory (os error 2)"),
    ]:
        with pytest.raises(graphcheck.GraphcheckError) as e:
            graphcheck._native.build_manifest(bad)
        assert str(e.value) == message
    with pytest.raises(graphcheck.GraphcheckError) as e:
        graphcheck._native.check_path("model..w")
    assert str(e.value) == "invalid owner path \"model..w\" at byte 6: expected an attribute name after '.'"


def big_manifest(path, n=20_000):
    """A manifest of ``n`` owned tensors, each read by a node of its own: a verify of it
    takes long enough (about 0.1 s) for another thread to be seen running meanwhile."""
    base = 0x100000
    spec = {
        "producer": producer(),
        "tensors": [spec_tensor(base + i * 256, 256) for i in range(n)],
        "owners": [{"path": f"model.w{i}", "tensor": i, "registration": "parameter"} for i in range(n)],
        "graphs": [{"name": "g", "walked": {"node_counts": {"kernel": n}, "unread": [], "nodes": [
            {"index": i, "kind": "kernel", "name": "k", "words": [
                {"param": 0, "offset": 0, "addr": hex(base + i * 256), "allocation": [hex(base + i * 256), 256]}
            ]} for i in range(n)
        ]}}],
    }
    path.write_text(json.dumps(graphcheck.build_manifest(spec)))
    return path


def test_verify_releases_the_gil(tmp_path):
    """While a verify runs in one thread, another Python thread makes progress: its count
    moves between the moment just before the call and the moment just after. With the GIL
    held through the call the count cannot move (the switch interval is set past the call's
    length, and the counting thread gives the GIL up at every step, so the verifying thread
    holds it from its first read to the call)."""
    import sys
    import time

    manifest = big_manifest(tmp_path / "big.json")
    count = [0]
    stop = threading.Event()

    def counter():
        while not stop.is_set():
            count[0] += 1
            time.sleep(0)  # gives the GIL up, so the verifying thread never waits for it

    seen = {}

    def verifying():
        before = count[0]
        report = graphcheck.verify(manifest)
        seen["moved"] = count[0] - before
        seen["ok"] = report.ok

    interval = sys.getswitchinterval()
    sys.setswitchinterval(30.0)
    try:
        threads = [threading.Thread(target=counter), threading.Thread(target=verifying)]
        threads[0].start()
        while count[0] == 0:
            time.sleep(0)
        threads[1].start()
        threads[1].join()
    finally:
        stop.set()
        threads[0].join()
        sys.setswitchinterval(interval)
    assert seen["ok"] is True
    assert seen["moved"] > 0, "no Python thread ran while verify did: the GIL was held"


def test_walked_objects_build_the_same_manifest_as_walked_json():
    # The capture path keeps walks on the Rust side (`_native.walk` → Walked) and hands
    # them to build_manifest by position: same manifest as the JSON route.
    import json

    from graphcheck import _native

    spec = build_spec()
    inline = json.loads(_native.build_manifest(json.dumps(spec)))
    walked = _native.Walked.from_json(json.dumps(spec["graphs"][0]["walked"]))
    assert len(walked) == 1 and walked.words == 2 and walked.node_counts == {"kernel": 1}
    assert json.loads(walked.to_json())["nodes"][0]["words"][1]["offset"] == 8
    spec["graphs"][0] = {"name": "g", "walked_index": 0}
    by_ref = json.loads(_native.build_manifest(json.dumps(spec), [walked]))
    assert by_ref == inline
    spec["graphs"][0] = {"name": "g", "walked_index": 3}
    with pytest.raises(graphcheck.GraphcheckError, match=r"graphs\[0\]\.walked_index: no walked graph at position 3"):
        _native.build_manifest(json.dumps(spec), [walked])
    spec["graphs"][0] = {"name": "g"}
    with pytest.raises(graphcheck.GraphcheckError, match="exactly one of `walked` and `walked_index`"):
        _native.build_manifest(json.dumps(spec), [walked])
    with pytest.raises(graphcheck.GraphcheckError, match="nodes"):
        _native.Walked.from_json('{"node_counts": {}, "unread": [], "nodes": [{"index": "x"}]}')
