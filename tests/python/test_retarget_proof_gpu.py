"""Retarget on real captures (issue 31), on the GPU: the seeds' classes, every parameter
shape the walker reads, the refusals, and atomicity on the driver.

Each retarget case captures with plain torch (``torch.cuda.CUDAGraph(keep_graph=True)``
under ``graphcheck.torch.graph``), changes what the model holds the way an engine's reload
does, shows the replay wrong against eager, retargets (``graphcheck.torch.retarget``, which
patches the template and torch's executable graph, ``raw_cuda_graph_exec()``), and shows
the replay equal to eager (bitwise: every kernel here is deterministic) and the recorder's
manifest clean against a fresh snapshot. Each refusal leaves the graph exactly as it was:
every word a walk of its template reads is unchanged, and the replay gives the same bytes
as before. With GRAPHCHECK_GPU_OUT set, each case writes its documents (manifest before,
live snapshot, plan, manifest after) for ``fixtures/gpu/``. Opt-in (GRAPHCHECK_GPU_TESTS=1).
"""

import json
import os
import socket

import pytest

import graphcheck
import graphcheck.torch as gt
from graphcheck import _native
from conftest import save_gpu_document, warm_up

N = 1 << 12


def words_of(g):
    """Every (node, param, offset) → address word a new walk of the graph's template reads,
    with each node's kind and name."""
    w = json.loads(_native.walk_graph(g.raw_cuda_graph()))
    out = {}
    for n in w["nodes"]:
        for word in n["words"]:
            addr = word["addr"]
            out[(n["index"], word["param"], word["offset"])] = int(addr, 0) if isinstance(addr, str) else addr
    return out


def live_findings(report):
    return sorted((f.kind, f.subject) for f in report.findings if f.kind in _native.LIVE_KINDS)


def record(torch, model, name, step, inputs=None):
    warm_up(torch, step)
    rec = gt.Recorder(model)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, recorder=rec, name=name, inputs=inputs or {}):
        out = step()
    torch.cuda.synchronize()
    return rec, g, out


def replay(torch, g, out):
    out.zero_() if out.is_floating_point() else out.fill_(0)
    g.replay()
    torch.cuda.synchronize()
    return out.clone()


def eager(torch, step):
    with torch.no_grad():
        y = step()
    torch.cuda.synchronize()
    return y


def save_case(case, manifest, live, plan, after):
    for part, doc in (("manifest", manifest), ("live", live), ("plan", plan), ("after", after)):
        save_gpu_document(f"retarget_{case}_{part}.json", doc)


def note(case, **facts):
    """Facts a case found, for the closing note (GRAPHCHECK_GPU_OUT/retarget_facts.jsonl)."""
    print(case, facts)
    out = os.environ.get("GRAPHCHECK_GPU_OUT")
    if out:
        with open(os.path.join(out, "retarget_facts.jsonl"), "a") as f:
            f.write(json.dumps({"case": case, **facts}) + "\n")


def prove(torch, case, model, step, change, inputs=None, expect=None):
    """Capture, ``change()``, the replay wrong, retarget, the replay right. Returns the
    result, the recorder and the plan's edits."""
    rec, g, out = record(torch, model, case, step, inputs)
    manifest = rec.manifest()
    change()
    wrong = replay(torch, g, out)
    want = eager(torch, step)
    assert not torch.equal(wrong, want), f"{case}: the change must make the replay wrong"
    live = gt.snapshot(None, manifest, roots=rec.roots(), recorder=rec, contents="updated")
    before = graphcheck.verify(manifest, live)
    if expect is not None:
        got = {k for k, _ in live_findings(before)}
        assert expect <= got, (case, live_findings(before))
    res = gt.retarget(rec, live, graphs={case: g})
    assert res.retargeted == (case,), (case, res.refused, res.plan)
    right = replay(torch, g, out)
    diff = (right.double() - want.double()).abs().max().item()
    assert torch.equal(right, want), (case, diff)
    save_case(case, manifest, live, res.plan, res.manifest)
    # The recorder describes the patched graph: walked again, clean against a fresh snapshot.
    res2 = gt.retarget(rec, graphs={case: g})  # a second retarget finds nothing to do
    assert res2.plan["edits"] == 0 and res2.ok, res2.plan
    now = rec.manifest()
    fresh = gt.snapshot(None, now, roots=rec.roots(), recorder=rec)
    assert live_findings(graphcheck.verify(now, fresh)) == [], graphcheck.verify(now, fresh).table
    (gp,) = [x for x in res.plan["graphs"] if x["graph"] == case]
    edits = gp["edits"]
    names = {}
    m = graphcheck.load(manifest)
    for n in m["graphs"][0]["nodes"]:
        names[n["index"]] = n.get("name", "")
    note(
        case,
        findings=live_findings(before),
        edits=len(edits),
        node_kinds=sorted({e["node_kind"] for e in edits}),
        kernels=sorted({names.get(e["node"], "")[:100] for e in edits}),
        wrong_by=(wrong.double() - want.double()).abs().max().item(),
    )
    return res, rec, edits, names


# The seeds' classes -------------------------------------------------------------------


def test_marlin_workspace_rebuilt_after_loading(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(N, N, bias=False, device="cuda")
    model.workspace = torch.ones(N, dtype=torch.int32, device="cuda")  # plain attribute
    x = torch.randn(4, N, device="cuda")

    def step():
        return model.proj(x) + model.workspace.to(x.dtype)

    def change():  # process_weights_after_loading: marlin_make_workspace again
        model.workspace = torch.full((N,), 2, dtype=torch.int32, device="cuda")

    prove(torch, "marlin_workspace", model, step, change, {"x": x}, expect={"drifted"})


def test_cutlass_moe_stride_arrays_rebuilt_with_their_alias(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.table = torch.nn.Parameter(torch.randn(64, N, device="cuda"), requires_grad=False)
    experts = torch.nn.Module()  # a new CutlassExpertsFp8 at every load, in vLLM
    experts.ab_strides1 = torch.arange(8, device="cuda", dtype=torch.int64)
    experts.c_strides2 = experts.ab_strides1  # one tensor, two owner paths
    experts.c_strides1 = torch.arange(8, 16, device="cuda", dtype=torch.int64)
    model.experts = experts

    def step():
        e = model.experts
        a = torch.index_select(model.table, 0, e.ab_strides1)
        c = torch.index_select(model.table, 0, e.c_strides1)
        return a * 2 + c + torch.index_select(model.table, 0, e.c_strides2)

    def change():
        fresh = torch.nn.Module()
        fresh.ab_strides1 = torch.arange(16, 24, device="cuda", dtype=torch.int64)
        fresh.c_strides2 = fresh.ab_strides1
        fresh.c_strides1 = torch.arange(24, 32, device="cuda", dtype=torch.int64)
        model.experts = fresh

    res, _, edits, _ = prove(torch, "cutlass_strides", model, step, change, expect={"drifted"})
    assert len({e["subject"] for e in edits}) >= 2, edits


def test_mla_w_uv_recomputed_after_a_reload(cuda):
    torch = cuda
    bf = torch.bfloat16
    model = torch.nn.Module()
    model.kv_b_proj = torch.nn.Linear(512, 2048, bias=False, device="cuda", dtype=bf)
    # MLAAttention.process_weights_after_loading: W_UV derived from kv_b_proj, kept as a
    # plain attribute.
    model.W_UV = model.kv_b_proj.weight.detach().t().contiguous()
    x = torch.randn(8, 512, device="cuda", dtype=bf)

    def step():  # (8, 512) @ W_UV (512, 2048): a bf16 GEMM, nvjet on the H200
        return torch.matmul(x, model.W_UV)

    def change():
        with torch.no_grad():
            model.kv_b_proj.weight.copy_(torch.randn_like(model.kv_b_proj.weight))
        model.W_UV = model.kv_b_proj.weight.detach().t().contiguous()

    _, _, edits, names = prove(torch, "mla_w_uv", model, step, change, {"x": x}, expect={"drifted"})
    note("mla_w_uv_gemm", gemm_kernels=sorted({names[e["node"]][:60] for e in edits}))


def test_a_parameter_rebound_by_replace_parameter(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(N, N, device="cuda")
    x = torch.randn(4, N, device="cuda")

    def step():
        return model.proj(x)

    def change():  # vLLM's replace_parameter: a new Parameter with new values
        w = model.proj.weight
        model.proj.weight = torch.nn.Parameter(torch.randn_like(w), requires_grad=False)

    prove(torch, "rebound_parameter", model, step, change, {"x": x}, expect={"drifted"})


def test_a_rebind_chain_across_layers_is_followed_link_by_link(cuda):
    # The anchor model's failure: each new RMSNorm weight in the block the previous
    # layer's old one freed. The recorder's storage numbers tell it from a list shift.
    torch = cuda
    layers = 8
    model = torch.nn.Sequential(*[torch.nn.RMSNorm(N, device="cuda") for _ in range(layers)])
    with torch.no_grad():
        for i, norm in enumerate(model):
            norm.weight.fill_(1.0 + i / 8)
    x = torch.randn(4, N, device="cuda")

    def step():
        return model(x)

    chained = []

    def change():
        for norm in model:
            old = norm.weight.data_ptr()
            norm.weight = torch.nn.Parameter(norm.weight.detach() * 1.5)
            chained.append((old, norm.weight.data_ptr()))

    _, _, edits, _ = prove(torch, "rebind_chain", model, step, change, {"x": x}, expect={"drifted"})
    links = sum(1 for (_, new), (old, _) in zip(chained[1:], chained[:-1]) if new == old)
    note("rebind_chain_links", links=links, layers=layers)
    assert len({e["subject"] for e in edits}) == layers, edits


# Parameter shapes ---------------------------------------------------------------------


def test_a_triton_kernel_with_plain_pointer_params(cuda):
    torch = cuda
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def axpy(x_ptr, w_ptr, out_ptr, n, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        m = i < n
        tl.store(out_ptr + i, tl.load(x_ptr + i, mask=m) * tl.load(w_ptr + i, mask=m) + 1.0, mask=m)

    model = torch.nn.Module()
    model.w = torch.full((N,), 2.0, device="cuda")  # plain attribute
    x = torch.randn(N, device="cuda")
    out = torch.empty(N, device="cuda")

    def step():
        axpy[(N // 256,)](x, model.w, out, N, BLOCK=256)
        return out

    def change():
        model.w = torch.full((N,), 3.0, device="cuda")

    _, _, _, names = prove(torch, "triton", model, step, change, {"x": x}, expect={"drifted"})
    assert any("axpy" in n for n in names.values()), names


def test_a_device_memcpy_node_follows_its_source(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.src = torch.full((N,), 2.0, device="cuda")  # plain attribute
    dst = torch.empty(N, device="cuda")

    def step():
        dst.copy_(model.src)
        return dst * 2

    def change():
        model.src = torch.full((N,), 5.0, device="cuda")

    _, _, edits, _ = prove(torch, "memcpy_device", model, step, change, expect={"drifted"})
    assert "memcpy" in {e["node_kind"] for e in edits}, edits


def test_a_pinned_host_memcpy_end_follows_its_buffer(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.host = torch.full((N,), 2.0).pin_memory()  # plain attribute, pinned host
    dev = torch.empty(N, device="cuda")
    keep = []

    def step():
        dev.copy_(model.host, non_blocking=True)
        return dev + 1

    def change():
        keep.append(model.host)  # the old buffer kept: the graph would read its 2.0
        model.host = torch.full((N,), 7.0).pin_memory()

    _, _, edits, _ = prove(torch, "memcpy_host", model, step, change, expect={"drifted"})
    assert "memcpy" in {e["node_kind"] for e in edits}, edits


# Refusals: the graph untouched --------------------------------------------------------


def refused_untouched(torch, case, rec, g, out, change, why):
    """After ``change()``: the plan refuses the graph for ``why``; retarget leaves every
    word and the replay's bytes as they were."""
    manifest = rec.manifest()
    words = words_of(g)
    first = replay(torch, g, out)
    change()
    before = replay(torch, g, out)
    live = gt.snapshot(None, manifest, roots=rec.roots(), recorder=rec, contents="updated")
    res = gt.retarget(rec, live, graphs={case: g})
    assert case in res.refused and not res.retargeted, res.plan
    assert why in res.refused[case], res.refused[case]
    assert words_of(g) == words, "a refused graph's words changed"
    assert torch.equal(replay(torch, g, out), before), "a refused graph's replay changed"
    save_case(case, manifest, live, res.plan, res.manifest)
    note(case, refused=res.refused[case][:300], replay_same_as_before_change=bool(torch.equal(first, before)))


def test_a_graph_with_a_conditional_node_is_refused_untouched(cuda):
    torch = cuda
    if not hasattr(torch.cuda.CUDAGraph, "begin_capture_to_if_node"):
        pytest.skip(f"torch {torch.__version__} has no conditional-node capture (CUDAGraph.begin_capture_to_if_node)")
    model = torch.nn.Module()
    model.scale = torch.full((N,), 2.0, device="cuda")
    x = torch.randn(N, device="cuda")
    pred = torch.tensor(True, device="cuda")
    out = torch.empty(N, device="cuda")
    warm_up(torch, lambda: out.copy_(x * model.scale).add_(1.0))
    rec = gt.Recorder(model)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, recorder=rec, name="conditional", inputs={"x": x}):
        out.copy_(x * model.scale)
        g.begin_capture_to_if_node(pred)
        out.add_(1.0)
        g.end_capture_to_conditional_node()
    torch.cuda.synchronize()
    counts = graphcheck.load(rec.manifest())["graphs"][0]["node_counts"]
    assert counts.get("conditional") == 1, counts

    def change():
        model.scale = torch.full((N,), 3.0, device="cuda")

    refused_untouched(torch, "conditional", rec, g, out, change, "not read")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_nccl_all_reduce_in_a_one_rank_group_is_refused_untouched(cuda):
    torch = cuda
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group(
            "nccl", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
            device_id=torch.device("cuda", 0),
        )
    model = torch.nn.Module()
    model.buf = torch.arange(N, device="cuda", dtype=torch.float32)  # plain attribute
    out = torch.empty(N, device="cuda")

    def step():
        out.copy_(model.buf)
        dist.all_reduce(model.buf, op=dist.ReduceOp.AVG)
        return out

    rec, g, out = record(torch, model, "nccl", step)

    def change():
        model.buf = torch.arange(N, device="cuda", dtype=torch.float32) * 2

    refused_untouched(torch, "nccl", rec, g, out, change, "NCCL")


def test_a_tensor_reshaped_in_place_is_refused_untouched(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(256, 256, bias=False, device="cuda")
    x = torch.randn(4, 256, device="cuda")

    def step():
        return model.proj(x)

    rec, g, out = record(torch, model, "reshape", step, {"x": x})

    def change():
        with torch.no_grad():
            model.proj.weight.data = model.proj.weight.data.t()

    refused_untouched(torch, "reshape", rec, g, out, change, "layout")


# Atomicity on the driver --------------------------------------------------------------


def test_an_edit_the_driver_rejects_partway_leaves_the_graph_as_it_was(cuda):
    torch = cuda
    model = torch.nn.Module()
    model.scale = torch.full((N,), 2.0, device="cuda")  # plain attribute, read by a kernel
    model.src = torch.full((N,), 4.0, device="cuda")  # plain attribute, copied by a memcpy
    x = torch.randn(N, device="cuda")
    dst = torch.empty(N, device="cuda")

    def step():
        y = x * model.scale
        dst.copy_(model.src)
        return y + dst

    rec, g, out = record(torch, model, "atomic", step, {"x": x})
    manifest = rec.manifest()
    keep = (model.scale, model.src)
    model.scale = torch.full((N,), 3.0, device="cuda")
    model.src = torch.full((N,), 5.0, device="cuda")
    live = gt.snapshot(None, manifest, roots=rec.roots(), recorder=rec, contents="updated")
    p = gt.retarget(rec, live, graphs={"atomic": g}, apply=False).plan
    (gp,) = p["graphs"]
    kinds = [e["node_kind"] for e in gp["edits"]]
    assert gp["action"] == "retarget" and "memcpy" in kinds and "kernel" in kinds, gp
    # The kernel edits are good; the memcpy's new source is no memory the driver knows,
    # and the memcpy node comes after the kernel: the driver refuses it partway.
    for e in gp["edits"]:
        if e["node_kind"] == "memcpy":
            e["new"] = hex(0x10)
    words = words_of(g)
    before = replay(torch, g, out)
    exec_handle = int(g.raw_cuda_graph_exec())
    (outcome,) = _native.apply_plan_cuda(json.dumps(p), [("atomic", g.raw_cuda_graph(), exec_handle)])
    outcome = dict(outcome)
    assert not outcome["applied"], outcome
    assert words_of(g) == words, "the template's words changed"
    assert torch.equal(replay(torch, g, out), before), "the executable graph's replay changed"
    note("atomicity", outcome={k: str(v)[:200] for k, v in outcome.items()}, edits=len(gp["edits"]))
    del keep
