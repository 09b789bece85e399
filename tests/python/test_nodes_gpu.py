"""Every node type a torch capture produces, walked on a real GPU (issue 10): copies
(device to device, pinned host to device, device to pinned host), fills, an empty
capture, a fork/join onto a side stream, an NCCL collective in a one-rank process group,
and the same capture recorded by ``instrument()``. Each test captures, walks, checks the
touches against what the code launched, and replays afterwards to show the walk changed
nothing. A recording that used to abort the process runs in a child process here, and the
test asserts that the child exits normally.

Opt-in: runs only with GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA. With
GRAPHCHECK_GPU_OUT=DIR the manifests are written there (fixtures/gpu/ was recorded so).
"""

import gc
import os
import socket
import subprocess
import sys
import textwrap

import graphcheck
import graphcheck.torch as gt
from conftest import save_gpu_document as save, warm_up


def owners_by_tensor(manifest):
    out = {}
    for o in manifest["owners"]:
        out.setdefault(o["tensor"], []).append(o["path"])
    return out


def node_touches(manifest, kind=None):
    """(node name, kind, [(param, owner paths or None)]) per node of ``kind``."""
    owners = owners_by_tensor(manifest)
    out = []
    for g in manifest["graphs"]:
        for n in g["nodes"]:
            if kind is not None and n["kind"] != kind:
                continue
            touched = [
                (t["param"], tuple(sorted(owners.get(t["tensor"], []))) if t.get("tensor") is not None else None)
                for t in n["touches"]
            ]
            out.append((n["name"], n["kind"], touched))
    return out


def all_read(manifest):
    for g in manifest["graphs"]:
        assert g.get("unread", []) == [], g["unread"]
        for n in g["nodes"]:
            assert n.get("opaque") is None, (n["name"], n["opaque"])


def kinds(report):
    return sorted((f.kind, f.subject) for f in report.findings)


def test_copy_device_to_device(cuda):
    torch = cuda
    m = torch.nn.Module()
    m.register_buffer("src", torch.randn(4096, device="cuda"))
    m.register_buffer("dst", torch.zeros(4096, device="cuda"))

    def step():
        m.dst.copy_(m.src)

    warm_up(torch, step)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with gt.graph(g, model=m, name="copy") as rec:
        step()
    manifest = graphcheck.load(rec.manifest())
    save("nodes_memcpy_d2d_manifest.json", manifest)
    print(manifest["graphs"][0]["node_counts"])
    all_read(manifest)
    copies = node_touches(manifest, "memcpy")
    assert len(copies) == 1, copies
    assert copies[0][2] == [(0, ("model.dst",)), (1, ("model.src",))], copies
    report = graphcheck.verify(manifest)
    assert report.ok, report
    # The walk changed nothing: the replay copies what src holds now.
    m.src.fill_(3.0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(m.dst, m.src)


def _pinned_model(torch, n=2048):
    m = torch.nn.Module()
    # Pinned host staging buffers, as engines keep them for inputs and sampled tokens.
    m.register_buffer("host_in", torch.full((n,), 5.0).pin_memory(), persistent=False)
    m.register_buffer("host_out", torch.zeros(n).pin_memory(), persistent=False)
    m.register_buffer("dev_in", torch.zeros(n, device="cuda"), persistent=False)
    m.register_buffer("scale", torch.full((n,), 2.0, device="cuda"))
    return m


def _pinned_step(m):
    m.dev_in.copy_(m.host_in, non_blocking=True)
    y = m.dev_in * m.scale
    m.host_out.copy_(y, non_blocking=True)


def test_copies_through_pinned_host_memory_and_freeing_it(cuda):
    torch = cuda
    m = _pinned_model(torch)
    warm_up(torch, lambda: _pinned_step(m))
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with gt.graph(g, model=m, name="staging") as rec:
        _pinned_step(m)
    manifest = graphcheck.load(rec.manifest())
    save("nodes_memcpy_pinned_manifest.json", manifest)
    print(node_touches(manifest))
    all_read(manifest)
    copies = sorted(c[2] for c in node_touches(manifest, "memcpy"))
    # Host to device reads the pinned input; device to host writes the pinned output: the
    # host ends are touches of the pinned tensors, which are owners like any other.
    assert [(0, ("model.dev_in",)), (1, ("model.host_in",))] in copies, copies
    assert any(c[0] == (0, ("model.host_out",)) for c in copies), copies
    report = graphcheck.verify(manifest)
    assert report.ok, report
    # Replay: the graph reads the pinned input at replay time.
    m.host_in.fill_(7.0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(m.host_out, torch.full_like(m.host_out, 14.0))

    # Freeing the pinned input (rebinding the buffer to a fresh pinned tensor) is reported
    # against the owner, as PyTorch's own liveness checker tracks pinned memory.
    old = m.host_in.data_ptr()
    m.host_in = torch.full((m.host_in.numel(),), 1.0).pin_memory()
    gc.collect()
    live = gt.snapshot(m, manifest)
    save("nodes_memcpy_pinned_rebound_live.json", live)
    report = graphcheck.verify(manifest, live)
    print(report)
    found = kinds(report)
    assert ("drifted", "model.host_in") in found, found
    # The new pinned tensor was made while the old one was alive: another block.
    assert m.host_in.data_ptr() != old
    assert ("freed", "model.host_in") in found, found


def test_zero_and_fill(cuda):
    """torch 2.11 lowers ``zero_``/``fill_`` to fill kernels, not memset nodes (seen on the
    H200); memset nodes come from cuBLAS's workspace (the corpus fixtures) and from the
    native test (tests/gpu.rs)."""
    torch = cuda
    m = torch.nn.Module()
    m.register_buffer("acc", torch.ones(1 << 16, device="cuda", dtype=torch.int32))
    m.register_buffer("flags", torch.ones(1 << 16, device="cuda", dtype=torch.uint8))

    def step():
        m.acc.zero_()
        m.flags.fill_(0)

    warm_up(torch, step)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with gt.graph(g, model=m, name="clear") as rec:
        step()
    manifest = graphcheck.load(rec.manifest())
    save("nodes_fill_manifest.json", manifest)
    counts = manifest["graphs"][0]["node_counts"]
    print(counts, node_touches(manifest))
    all_read(manifest)
    touched = {p for _, _, ts in node_touches(manifest) for _, paths in ts if paths for p in paths}
    assert {"model.acc", "model.flags"} <= touched, touched
    assert graphcheck.verify(manifest).ok
    m.acc.fill_(9)
    m.flags.fill_(9)
    g.replay()
    torch.cuda.synchronize()
    assert int(m.acc.abs().sum()) == 0 and int(m.flags.sum()) == 0


def test_empty_capture_records_an_empty_graph(cuda):
    torch = cuda
    m = torch.nn.Module()
    m.register_buffer("w", torch.ones(8, device="cuda"))
    g = torch.cuda.CUDAGraph(keep_graph=True)
    # torch warns that the graph is empty; graphcheck records it as it is.
    with gt.graph(g, model=m, name="empty") as rec:
        pass
    manifest = graphcheck.load(rec.manifest())
    save("nodes_empty_manifest.json", manifest)
    graph = manifest["graphs"][0]
    assert graph["name"] == "empty"
    assert graph["nodes"] == [] and graph.get("unread", []) == []
    report = graphcheck.verify(manifest)
    assert report.ok and report.findings == (), report
    g.replay()
    torch.cuda.synchronize()


def test_fork_join_onto_a_side_stream(cuda):
    torch = cuda
    m = torch.nn.Module()
    m.register_buffer("x", torch.randn(1 << 14, device="cuda"))
    m.register_buffer("a", torch.zeros(1 << 14, device="cuda"))
    m.register_buffer("b", torch.zeros(1 << 14, device="cuda"))
    side = torch.cuda.Stream()

    def step():
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            torch.mul(m.x, 3.0, out=m.b)
        torch.mul(m.x, 2.0, out=m.a)
        torch.cuda.current_stream().wait_stream(side)

    warm_up(torch, step)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with gt.graph(g, model=m, name="fork_join") as rec:
        step()
    manifest = graphcheck.load(rec.manifest())
    save("nodes_fork_join_manifest.json", manifest)
    print(manifest["graphs"][0]["node_counts"], node_touches(manifest))
    all_read(manifest)
    touched = [set(p for _, paths in ts if paths for p in paths) for _, _, ts in node_touches(manifest, "kernel")]
    assert {"model.x", "model.a"} in touched, touched
    assert {"model.x", "model.b"} in touched, touched
    assert graphcheck.verify(manifest).ok
    m.x.fill_(1.0)
    g.replay()
    torch.cuda.synchronize()
    assert torch.all(m.a == 2.0) and torch.all(m.b == 3.0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_nccl_collectives_in_a_one_rank_group(cuda):
    torch = cuda
    import torch.distributed as dist

    # One group per process: another test of the session (the retarget proof's NCCL
    # refusal) may have made it already; only the one made here is destroyed here.
    made = not dist.is_initialized()
    if made:
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
            device_id=torch.device("cuda", 0),
        )
    try:
        m = torch.nn.Module()
        m.register_buffer("buf", torch.arange(4096, device="cuda", dtype=torch.float32))
        m.register_buffer("gathered", torch.zeros(4096, device="cuda", dtype=torch.float32))

        def step():
            # AVG makes NCCL launch a kernel even for one rank (SUM in place is a no-op);
            # the out-of-place gather is a copy.
            dist.all_reduce(m.buf, op=dist.ReduceOp.AVG)
            dist.all_gather_into_tensor(m.gathered, m.buf)

        warm_up(torch, step)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with gt.graph(g, model=m, name="collectives") as rec:
            step()
        manifest = graphcheck.load(rec.manifest())
        save("nodes_nccl_manifest.json", manifest)
        print(manifest["graphs"][0]["node_counts"])
        for t in node_touches(manifest):
            print(t)
        all_read(manifest)
        touched = {p for _, _, ts in node_touches(manifest) for _, paths in ts if paths for p in paths}
        assert {"model.buf", "model.gathered"} <= touched, touched
        # One rank: NCCL launches its one-rank reduction kernel and a copy, holding only the
        # user's buffers (with two ranks its ring kernels also hold NCCL's own state).
        report = graphcheck.verify(manifest)
        print(report)
        assert report.ok, report
        m.buf.copy_(torch.full_like(m.buf, 4.0))
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(m.gathered == 4.0)
    finally:
        if made:
            dist.destroy_process_group()


def test_instrument_records_copies(cuda, tmp_path):
    torch = cuda
    m = torch.nn.Module()
    m.register_buffer("src", torch.randn(1024, device="cuda"))
    m.register_buffer("dst", torch.zeros(1024, device="cuda"))
    warm_up(torch, lambda: m.dst.copy_(m.src))
    with gt.instrument(tmp_path, model=m) as ins:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            m.dst.copy_(m.src)
            m.dst.mul_(2.0)
    assert ins.errors == [], ins.errors
    manifest = graphcheck.load(ins.manifest())
    copies = node_touches(manifest, "memcpy")
    assert copies and copies[0][2] == [(0, ("model.dst",)), (1, ("model.src",))], copies
    assert graphcheck.verify(manifest).ok
    g.replay()
    torch.cuda.synchronize()
    assert torch.allclose(m.dst, m.src * 2.0)


CHILD = textwrap.dedent(
    """
    import torch, graphcheck, graphcheck.torch as gt
    m = torch.nn.Module()
    m.register_buffer("src", torch.randn(1024, device="cuda"))
    m.register_buffer("dst", torch.zeros(1024, device="cuda"))
    pinned = torch.ones(1024).pin_memory()
    m.dst.copy_(m.src); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with gt.graph(g, model=m, name="copy") as rec:
        m.dst.copy_(m.src)
        m.dst.copy_(pinned, non_blocking=True)
        pinned.copy_(m.src, non_blocking=True)
    graphcheck.load(rec.manifest())
    ins = gt.instrument(None, model=m)
    g2 = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g2):
        m.dst.copy_(m.src)
    assert ins.errors == [], ins.errors
    g.replay(); g2.replay(); torch.cuda.synchronize()
    print("RECORDED", flush=True)
    """
)


def test_recording_copies_never_takes_down_the_process(cuda):
    """Regression: a captured copy_ aborted the process (mem::zeroed of CUDA_MEMCPY3D)."""
    r = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert "RECORDED" in r.stdout
