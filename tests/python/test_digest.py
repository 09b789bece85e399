"""The gc128 content digest from Python, without a GPU: the native twin against an
independent transcription of the definition (graphcheck::document::digest), fixed vectors,
CPU tensors of every layout read in place, what it must detect, the GPU path's fallback to
host copies, and gc128 as what ``digests=True`` records."""

import ctypes
import random
import warnings

import pytest

import graphcheck
import graphcheck._digest as _digest
import graphcheck._native as native
import graphcheck.torch as gt
from conftest import kernel, walked

M64, M32 = (1 << 64) - 1, (1 << 32) - 1
KEY_A, KEY_B = 0x9E3779B97F4A7C15, 0xD6E8FEB86659FD93
KEY_LEN = 0xC2B2AE3D27D4EB4F


def _fmix(x):
    x ^= x >> 33
    x = (x * 0xFF51AFD7ED558CCD) & M64
    x ^= x >> 33
    x = (x * 0xC4CEB9FE1A85EC53) & M64
    return x ^ (x >> 33)


def reference(data: bytes) -> str:
    """The module docs of graphcheck::document::digest, word by word."""
    a = b = 0
    for i in range(0, len(data), 8):
        w = int.from_bytes(data[i : i + 8].ljust(8, b"\0"), "little")
        j = i // 8 + 1
        k, q = (j * KEY_A) & M64, (j * KEY_B) & M64
        x, y = ((w & M32) + (k & M32)) & M32, ((w >> 32) + (k >> 32)) & M32
        a = (a + x * y) & M64
        b = (b + _fmix(w ^ q)) & M64
    n = len(data)
    fa = _fmix(a ^ (((n + 1) * KEY_LEN) & M64))
    fb = _fmix(((b + n) & M64) ^ KEY_B)
    h1 = (fa + fb) & M64
    return f"gc128:{h1:016x}{fb ^ _fmix(h1):016x}"


def raw(t) -> bytes:
    """A view's elements in row-major order, as bytes (through a contiguous copy)."""
    c = t.detach().contiguous()
    return ctypes.string_at(c.data_ptr(), c.numel() * c.element_size()) if c.numel() else b""


def test_fixed_vectors():
    # The same vectors as src/document/digest/tests.rs.
    assert native.gc128_bytes(b"") == "gc128:f507e3d23ed59d2b2adfdbd3f5af067e"
    assert native.gc128_bytes(b"a") == "gc128:d8176c6070bf755d306ba4f96a5dbe2e"
    assert native.gc128_bytes(b"graphcheck") == "gc128:bd6a24c16fd5111765fc215f776e4c55"
    assert native.gc128_bytes(bytes(64)) == "gc128:44c2a7d8c4093d581190d33add6dbe58"
    assert native.gc128_bytes(bytes(range(256))) == "gc128:8e313adb15acb3327d03c6e7111bbbb5"


def test_the_native_twin_matches_the_definition():
    rng = random.Random(0)
    for n in list(range(0, 70)) + [255, 1000, 4097]:
        data = bytes(rng.getrandbits(8) for _ in range(n))
        assert native.gc128_bytes(data) == reference(data), n


def test_cpu_tensors_of_every_dtype_digest_their_bytes(torch):
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.uint8, torch.int8, torch.bool, torch.int16, torch.bfloat16, torch.float16,
                  torch.int32, torch.float32, torch.int64, torch.float64, torch.complex64,
                  torch.complex128):
        for n in (0, 1, 3, 8, 13, 1000):
            t = torch.randint(0, 256, (n * 16,), dtype=torch.uint8, generator=g)
            t = t[: n * torch.empty((), dtype=dtype).element_size()].view(dtype)
            assert gt.digest(t) == native.gc128_bytes(raw(t)), (dtype, n)


def test_views_digest_their_row_major_elements_in_place(torch):
    base = torch.randint(0, 256, (4096,), dtype=torch.uint8)
    m = base[: 64 * 32].view(torch.bfloat16).reshape(32, 32)
    f = base.view(torch.float32).reshape(64, 16)
    views = {
        "transposed": m.t(),
        "column": m[:, 3],
        "rows of 12 of 16 bytes": f[:, :3],
        "misaligned start": base[3:1003],
        "misaligned bf16": base[2:202].view(torch.bfloat16),
        "permuted 3-d": f.reshape(4, 16, 16).permute(2, 0, 1),
        "expanded": f[0, :5].expand(7, 5),
        "scalar": f[5, 5],
        "empty": f[:, :0],
        "every other": base[::2],
        "complex transposed": torch.randn(6, 4, dtype=torch.complex128).t(),
    }
    for name, v in views.items():
        assert gt.digest(v) == native.gc128_bytes(raw(v)), name
    # All at once: one native call.
    assert gt.digest_all(list(views.values())) == [gt.digest(v) for v in views.values()]


def test_what_gc128_must_detect(torch):
    # A zeroed scalar, a swapped pair, a changed length.
    assert gt.digest(torch.tensor(8.0)) != gt.digest(torch.tensor(0.0))
    rng = random.Random(2)
    x = torch.randn(4096, dtype=torch.bfloat16)
    base = gt.digest(x)
    for _ in range(200):
        i, j = rng.randrange(4096), rng.randrange(4096)
        if x[i].item() == x[j].item():
            continue
        y = x.clone()
        y[i], y[j] = x[j], x[i]
        assert gt.digest(y) != base, (i, j)
    assert gt.digest(x[:-1]) != base
    z = torch.zeros(3, dtype=torch.uint8)
    assert len({gt.digest(z[:n]) for n in range(4)}) == 4


def test_other_algorithms_and_bad_arguments(torch):
    t = torch.arange(10, dtype=torch.int16)
    assert gt.digest_all([t, t], "sha256") == [gt.digest(t, "sha256")] * 2
    assert gt.DEFAULT_DIGEST == "gc128" and "gc128" in gt.DIGEST_ALGORITHMS
    with pytest.raises(graphcheck.GraphcheckError, match="algorithm is one of 'gc128'"):
        gt.digest(t, "md5")
    with pytest.raises(graphcheck.GraphcheckError, match=r"tensors\[1\] is a torch.Tensor"):
        gt.digest_all([t, "x"])
    with pytest.raises(graphcheck.GraphcheckError, match="tensors is a list of torch.Tensor"):
        gt.digest_all(t)
    with pytest.raises(graphcheck.GraphcheckError, match="view 0: the view has 1 sizes but 2"):
        native.digest_host([(t.data_ptr(), (10,), (1, 1), 2)])
    with pytest.raises(graphcheck.GraphcheckError, match="a null address"):
        native.digest_host([(0, (10,), (1,), 2)])


def test_without_nvrtc_cuda_tensors_are_digested_through_host_copies(torch, monkeypatch):
    # The GPU path's fallback, driven with CPU tensors: the native call reports NVRTC
    # missing; the digests are the twin's of host copies, and one warning says so.
    calls = []

    def unavailable(device, stream, views, nvrtc=None):
        calls.append((device, stream, len(views)))
        raise native.GpuDigestUnavailable("NVRTC (libnvrtc) could not be loaded: test")

    monkeypatch.setattr(native, "digest_cuda", unavailable)
    monkeypatch.setattr(_digest, "_current_stream", lambda device: 1234)
    monkeypatch.setattr(_digest, "_GPU_UNAVAILABLE", [None])
    ts = [torch.randn(5, 7).t(), torch.arange(9, dtype=torch.int8)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        views = [_digest._view(t) for t in ts]
        first = _digest._cuda_gc128(0, views, ts)
        second = _digest._cuda_gc128(0, views, ts)
    assert first == second == [gt.digest(t) for t in ts]
    assert calls == [(0, 1234, 2)]  # not tried again
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "host copies" in messages[0], messages


def test_nvrtc_is_found_from_the_environment_first(monkeypatch):
    monkeypatch.setenv(_digest.ENV_NVRTC, "/opt/x/libnvrtc.so.13")
    assert _digest.nvrtc_path() == "/opt/x/libnvrtc.so.13"
    monkeypatch.delenv(_digest.ENV_NVRTC)
    found = _digest._packaged_nvrtc()
    if found is None:
        pytest.skip("no nvidia-cuda-nvrtc pip package here: the search found nothing to check")
    assert "nvrtc" in found and "builtins" not in found


def test_a_registry_digests_its_views_as_walked(torch):
    model = torch.nn.Module()
    w = torch.randn(8, 6)
    model.register_buffer("w", w)
    model.wt = w.t()
    model.col = w[:, 2]
    model.s = torch.tensor(3, dtype=torch.int8)
    reg = gt.walk(model)
    specs = reg.tensor_specs("gc128")
    assert [s["digest"] for s in specs] == [gt.digest(r.tensor) for r in reg.tensors]
    assert len({s["digest"] for s in specs}) == len(specs) == 4


def test_recordings_with_digests_true_are_gc128_and_catch_a_zeroed_weight(torch):
    model = torch.nn.Linear(4, 4)

    def record(digests):
        rec = gt.Recorder(model, digests=digests)
        rec.add_graph("g", walked(kernel(0, "gemv", model.weight, model.bias)))
        return rec, rec.manifest()

    rec, manifest = record(True)
    assert rec.digests == "gc128"
    got = {t["digest"] for t in graphcheck.load(manifest)["tensors"]}
    assert got == {gt.digest(model.weight), gt.digest(model.bias)}
    # A snapshot's True follows the manifest's algorithm.
    live = graphcheck.load(gt.snapshot(model, manifest, digests=True))
    assert {t["digest"].split(":")[0] for t in live["tensors"]} == {"gc128"}
    assert graphcheck.verify(manifest, live).ok
    _, sha = record("sha256")
    live = graphcheck.load(gt.snapshot(model, sha, digests=True))
    assert {t["digest"].split(":")[0] for t in live["tensors"]} == {"sha256"}
    # Contents that must be preserved but were zeroed in place: stale.
    with torch.no_grad():
        model.bias.zero_()
    report = graphcheck.verify(manifest, gt.snapshot(model, manifest, digests=True))
    assert [(f.kind, f.subject) for f in report.findings] == [("stale", "model.bias")]


def test_a_tensor_with_no_strided_data_is_a_graphcheck_error_naming_it():
    """Regression: digest() of a meta, sparse or nested tensor raised torch's
    NotImplementedError or RuntimeError from inside graphcheck ("Cannot copy out of meta
    tensor", "Cannot access data pointer of Tensor that doesn't have storage"), and
    tensor_spec() of a meta tensor gave a spec at address 0x0. The walk skips them, naming
    why; the functions that take one tensor say what is wrong with it."""
    torch = pytest.importorskip("torch")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's beta/prototype warnings
        odd = {
            "a meta tensor": torch.empty(3, device="meta"),
            "a tensor of layout torch.sparse_coo": torch.eye(3).to_sparse(),
            "a tensor of layout torch.sparse_csr": torch.eye(3).to_sparse_csr(),
            "a nested tensor": torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        }
    for what, t in odd.items():
        for algorithm in _digest.DIGEST_ALGORITHMS:
            with pytest.raises(graphcheck.GraphcheckError, match=f"^t is {what}"):
                gt.digest(t, algorithm)
            with pytest.raises(graphcheck.GraphcheckError, match=rf"^tensors\[1\] is {what}"):
                gt.digest_all([torch.ones(2), t], algorithm)
        with pytest.raises(graphcheck.GraphcheckError, match=f"^t is {what}"):
            gt.tensor_spec(t)
