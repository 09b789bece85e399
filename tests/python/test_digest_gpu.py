"""The gc128 GPU kernel from Python: every CUDA digest equals the CPU twin's of the same
view (dtypes, odd lengths, misaligned starts, strided views, empty views, 100,000 small
tensors in one call), on torch's current stream, with no temporary memory from torch's
allocator; a capturing stream is refused.

Opt-in: runs only with GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA (CI has none). NVRTC
comes from GRAPHCHECK_NVRTC, the process, or the nvidia pip packages; where none loads,
these tests fail (the fallback would hide a kernel that never ran)."""

import pytest

import graphcheck
import graphcheck._digest as _digest
import graphcheck._native as native
import graphcheck.torch as gt
from test_digest_views import PINNED, pinned_views


@pytest.fixture
def gpu(cuda):
    """torch on the GPU, with the GPU digest required to run (no silent host fallback)."""
    _digest._GPU_UNAVAILABLE[0] = None
    yield cuda
    # Set where the GPU digest fell back to host copies.
    assert _digest._GPU_UNAVAILABLE[0] is None, _digest._GPU_UNAVAILABLE[0]


def same_on_both(torch, make):
    """``make(base)`` on a CPU buffer and on its copy on the GPU: the digests agree."""
    base = torch.randint(0, 256, (1 << 20,), dtype=torch.uint8)
    views_cpu = make(base)
    views_gpu = make(base.cuda())
    got = gt.digest_all(views_gpu)
    want = gt.digest_all(views_cpu)
    assert got == want


def test_every_dtype_and_length_matches_the_twin(gpu):
    torch = gpu
    dtypes = (torch.uint8, torch.bool, torch.bfloat16, torch.float16, torch.float32,
              torch.int64, torch.float64, torch.complex128, torch.float8_e4m3fn)

    def make(base):
        out = []
        for dtype in dtypes:
            size = torch.empty((), dtype=dtype).element_size()
            for n in (0, 1, 3, 7, 8, 9, 255, 1024, 4097, 16385, 50_001):
                out.append(base[: n * size].view(dtype))
        return out

    same_on_both(torch, make)


def test_misaligned_and_strided_views_match_the_twin(gpu):
    torch = gpu

    def make(base):
        f = base[: 1 << 19].view(torch.float32).reshape(512, 256)
        h = base[: 1 << 19].view(torch.bfloat16).reshape(512, 512)
        out = [base[k : k + 100_003] for k in range(1, 17)]
        out += [base[2 * k :][: 2 * 5001].view(torch.bfloat16) for k in range(1, 8)]
        out += [
            h.t(), h[:, 7], h[3:, 5:300], f[:, :3], f.reshape(8, 64, 256).permute(2, 0, 1),
            f[0, :9].expand(100, 9), f[7, 7], f[:, :0], base[::3], h[::2, ::5],
            base[: 6 * 8 * 16].view(torch.complex128).reshape(6, 8).t(),
        ]
        return out

    same_on_both(torch, make)


def test_a_hundred_thousand_small_tensors_in_one_call(gpu):
    torch = gpu
    n = 100_000
    big = torch.randint(0, 256, (n * 4096,), dtype=torch.uint8, device="cuda")
    small = [big[i * 4096 : (i + 1) * 4096 - (i % 9)] for i in range(n)]
    got = gt.digest_all(small)
    host = big.cpu()
    want = gt.digest_all([host[i * 4096 : (i + 1) * 4096 - (i % 9)] for i in range(n)])
    assert got == want
    assert len(set(got)) == n


def test_the_digest_runs_on_the_current_stream_without_torch_memory(gpu):
    torch = gpu
    x = torch.empty(64 << 20, dtype=torch.bfloat16, device="cuda")
    s = torch.cuda.Stream()
    gt.digest(x)  # compiled and loaded before measuring
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.max_memory_allocated()
    with torch.cuda.stream(s):
        # Written on `s`, digested on `s` without a synchronization in between.
        x.fill_(1.5)
        d = gt.digest(x)
    assert torch.cuda.max_memory_allocated() == before
    torch.cuda.synchronize()
    assert d == gt.digest(x.cpu())
    info = native.gpu_digest_info(torch.cuda.current_device())
    print(info)
    assert info["nvrtc_path"] and info["nvrtc_version"]
    # 48 bytes a view (accumulators and the packed view), kept and grown to a power of two:
    # at most what the 100,000-tensor test asked for.
    assert (1 << 16) <= info["scratch_bytes"] <= (8 << 20) and info["last_kernel_ms"] > 0


def test_a_capturing_stream_is_refused(gpu):
    torch = gpu
    x = torch.ones(1024, device="cuda")
    gt.digest(x)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(graphcheck.GraphcheckError, match="capturing a CUDA graph"):
        with torch.cuda.graph(g):
            y = x * 2
            gt.digest(y)
    # The process is fine afterwards.
    assert gt.digest(x) == gt.digest(x.cpu())


def test_recorded_digests_are_gc128_read_on_the_gpu(gpu):
    torch = gpu
    model = torch.nn.Linear(256, 256, device="cuda", dtype=torch.bfloat16)
    reg = gt.walk(model)
    specs = reg.tensor_specs("gc128")
    assert [s["digest"] for s in specs] == [gt.digest(r.tensor.cpu()) for r in reg.tensors]


def test_memory_ranges_are_digested_where_mapped_and_only_there(gpu):
    """`_native.digest_ranges` (the memory graphs read that no owner explains): a mapped
    range's digest is its bytes' (the CPU twin's of a host copy); a range the driver does not
    map on this device, or that runs past its allocation, is None and is never read."""
    torch = gpu
    t = torch.randn(1001, device="cuda")
    s = t.untyped_storage()
    host = torch.zeros(64, dtype=torch.uint8).pin_memory()
    ranges = [
        (s.data_ptr(), s.nbytes()),
        (s.data_ptr() + 8, 24),
        (0x1000, 64),  # nothing is mapped there
        (s.data_ptr(), 1 << 40),  # runs past the allocation
        (host.data_ptr(), 64),  # pinned host memory
    ]
    stream = torch.cuda.current_stream().cuda_stream
    digests, fallback = native.digest_ranges(ranges, stream, _digest.nvrtc_path())
    assert fallback is None
    bytes_ = t.cpu().view(torch.uint8)
    assert digests[0] == native.gc128_bytes(bytes(bytes_.numpy())) == gt.digest(t)
    assert digests[1] == native.gc128_bytes(bytes(bytes_[8:32].numpy()))
    assert digests[2:] == [None, None, None]
    torch.cuda.synchronize()  # the context is healthy: nothing unmapped was read
    assert _digest.range_digests(ranges[:1]) == digests[:1]


def test_every_entry_point_gives_mains_digests_on_the_gpu(gpu):
    """The views read natively (`tensor_views`, `TensorViews.from_metas`) and main's tuples
    give the kernel the same views: the digests main pinned on the host."""
    torch = gpu
    views = pinned_views(torch, "cuda")
    tensors, want = list(views.values()), [PINNED[n] for n in views]
    assert gt.digest_all(tensors) == want
    dev = torch.cuda.current_device()
    stream = torch.cuda.current_stream().cuda_stream
    nvrtc = _digest.nvrtc_path()
    assert native.digest_cuda(dev, stream, [_digest._view(t) for t in tensors], nvrtc) == want
    assert native.digest_cuda(dev, stream, native.tensor_views(tensors, torch), nvrtc) == want
    model = torch.nn.Module()
    for i, t in enumerate(tensors):
        setattr(model, f"t{i}", t)
    reg = gt.walk(model)
    specs = {id(r.tensor): s["digest"] for r, s in zip(reg.tensors, reg.tensor_specs("gc128"))}
    assert [specs[id(t)] for t in tensors] == want
    with pytest.raises(graphcheck.GraphcheckError, match="view 0 is not in host memory"):
        native.digest_host(native.tensor_views(tensors[:1], torch))


def test_host_and_device_tensors_in_one_list_keep_their_order(gpu):
    torch = gpu
    host = [torch.arange(5 + i, dtype=torch.int32) for i in range(6)]
    mixed = [t.cuda() if i % 2 else t for i, t in enumerate(host)]
    views = native.tensor_views(mixed, torch)
    assert views.devices() == [None, torch.cuda.current_device()]
    assert gt.digest_all(mixed) == gt.digest_all(host) == [gt.digest(t) for t in host]
