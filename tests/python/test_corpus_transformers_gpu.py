"""The reload corpus with real `transformers` models (issue 6): small Llama, Qwen3 and
Mistral models built from configs with random weights (no download), a forward captured
with graphcheck.torch.graph, and a decode step of each captured with a static KV cache.
An in-place `load_state_dict` reload must verify clean and replay right; rebinding one
derived tensor (the rotary `inv_freq`) must be caught and replay wrong. Opt-in
(GRAPHCHECK_GPU_TESTS=1); GRAPHCHECK_GPU_OUT=DIR keeps the documents."""


import pytest

import graphcheck
import graphcheck.torch as gt
from conftest import CUBLAS_WORKSPACE, save_gpu_document as save, warm_up

LIVE_KINDS = {"drifted", "freed", "reused", "reshaped", "stale", "vanished"}




FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


def small_config(transformers, family, **extra):
    """The model class of ``family`` and a 2-layer config of it (hidden 256), for random
    weights: nothing is downloaded."""
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    cfg = config_cls(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, **extra,
    )
    return model_cls, cfg


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_inplace_reload_is_clean_and_a_rebound_buffer_is_caught(cuda, family):
    torch = cuda
    transformers = pytest.importorskip("transformers")
    model_cls, cfg = small_config(transformers, family)
    model = model_cls(cfg).cuda().eval()
    ids = torch.randint(0, 512, (1, 16), device="cuda")

    def fwd():
        return model(input_ids=ids, use_cache=False).logits

    warm_up(torch, fwd)
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, model=model, name=f"{family}_prefill16", inputs={"ids": ids}) as rec:
        out = fwd()
    manifest = graphcheck.load(rec.manifest())
    save(f"corpus_{family}_manifest.json", manifest)
    capture_report = graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE)
    print(capture_report)
    # Nothing unowned at capture: guards the Qwen3 false positive (stale TensorInfo slots).
    assert not capture_report.of_kind("unowned"), str(capture_report)

    # In-place reload of new weights: every parameter copied into its captured storage.
    fresh = model_cls(cfg).cuda()
    with torch.no_grad():
        model.load_state_dict(fresh.state_dict())
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        err = (out - fwd()).abs().max().item()
    live = gt.snapshot(model, manifest, event="load_state_dict (new weights, in place)", contents="updated")
    save(f"corpus_{family}_inplace_live.json", live)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(f"in-place reload: replay differs by {err}\n{report}")
    assert err < 1e-3
    assert not [f for f in report.findings if f.kind in LIVE_KINDS], str(report)

    # Rebinding a derived buffer (as a post-load hook that rebuilds it would).
    rot = model.model.rotary_emb
    with torch.no_grad():
        rot.inv_freq = rot.inv_freq * 1.5
    g.replay()
    torch.cuda.synchronize()
    with torch.no_grad():
        err = (out - fwd()).abs().max().item()
    live = gt.snapshot(model, manifest, event="inv_freq rebuilt", contents="updated")
    save(f"corpus_{family}_rebound_live.json", live)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(f"rebound inv_freq: replay differs by {err}\n{report}")
    assert err > 1e-3
    assert ("drifted", "model.model.rotary_emb.inv_freq") in {(f.kind, f.subject) for f in report.findings}


def static_cache(torch, transformers, cfg, max_len):
    """A StaticCache across transformers versions (older ones take the batch size, device
    and dtype; newer ones make their tensors on the first update)."""
    import inspect

    params = inspect.signature(transformers.StaticCache.__init__).parameters
    kw = {"config": cfg, "max_cache_len": max_len}
    for name, value in (("max_batch_size", 1), ("batch_size", 1), ("device", "cuda"), ("dtype", torch.float32)):
        if name in params:
            kw[name] = value
    return transformers.StaticCache(**kw)


@pytest.mark.parametrize("family", ["llama", "mistral", "qwen3"])
def test_decode_step_with_a_static_kv_cache(cuda, family):
    torch = cuda
    transformers = pytest.importorskip("transformers")
    model_cls, cfg = small_config(transformers, family, attn_implementation="sdpa")
    model = model_cls(cfg).cuda().eval()
    cache = static_cache(torch, transformers, cfg, 64)
    prompt = torch.randint(0, 512, (1, 8), device="cuda")
    with torch.no_grad():
        model(input_ids=prompt, past_key_values=cache, cache_position=torch.arange(8, device="cuda"), use_cache=True)
    tok = torch.randint(0, 512, (1, 1), device="cuda")
    pos = torch.tensor([8], device="cuda")

    def step():
        return model(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits

    warm_up(torch, step)
    runtime = ["kv_cache.**"]
    rec = gt.Recorder(model, runtime_state=runtime)
    rec.add_root(cache, "kv_cache")
    g = torch.cuda.CUDAGraph(keep_graph=True)
    name = f"{family}_decode_bs1"
    with torch.no_grad(), gt.graph(g, recorder=rec, name=name, inputs={"tok": tok, "pos": pos}):
        out = step()
    manifest = graphcheck.load(rec.manifest())
    save(f"corpus_{family}_decode_manifest.json", manifest)
    capture_report = graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE)
    print(capture_report)
    kernels = sorted({n["name"].split("<")[0][:60] for gr in manifest["graphs"] for n in gr["nodes"]})
    print("kernels:", kernels)
    cache_paths = [o["path"] for o in manifest["owners"] if o["path"].startswith("kv_cache")]
    assert cache_paths, "the graph's KV-cache tensors are owned by the kv_cache root"
    assert not [f for f in capture_report.findings if f.kind != "unused_allow"], str(capture_report)

    roots = rec.roots()

    # The references are replays of this same graph, and eager steps compared with eager
    # steps: an eager step differs from the replay by ~0.1 even before any reload
    # (transformers 5 takes other mask paths outside a capture).
    # The cache is state the step advances (transformers 5 counts `cumulative_length` on
    # the GPU): every replay and eager step starts from the cache as it was at capture.
    cache_ts = [r.tensor for r in gt.walk(cache, root="kv_cache").tensors if r.tensor is not None]
    cache_at_capture = [t.clone() for t in cache_ts]

    def reset_cache():
        with torch.no_grad():
            for t, saved in zip(cache_ts, cache_at_capture):
                t.copy_(saved)

    def replay():
        reset_cache()
        g.replay()
        torch.cuda.synchronize()
        return out.clone()

    def eager():
        reset_cache()
        with torch.no_grad():
            return step().clone()

    r0 = replay()
    assert torch.equal(replay(), r0), "replays of one graph are deterministic"
    e0 = eager()

    # In-place reload of new weights: the replay follows them, and reloading the original
    # weights in place brings it back bit for bit.
    original = {k: v.clone() for k, v in model.state_dict().items()}
    fresh = model_cls(cfg).cuda()
    with torch.no_grad():
        model.load_state_dict(fresh.state_dict())
    moved = (replay() - r0).abs().max().item()
    live = gt.snapshot(None, manifest, roots=roots, runtime_state=runtime,
                       event="load_state_dict (new weights, in place)", contents="updated")
    save(f"corpus_{family}_decode_inplace_live.json", live)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    with torch.no_grad():
        model.load_state_dict(original)
    back = torch.equal(replay(), r0)
    print(f"decode, in-place reload: replay moved by {moved}; back to the original bit for bit: {back}\n{report}")
    assert moved > 1e-3 and back
    assert not [f for f in report.findings if f.kind != "unused_allow"], str(report)

    # Rebinding a derived buffer: the model's eager output moves, the graph's replay does
    # not (it still reads the old, now freed, inv_freq).
    rot = model.model.rotary_emb
    with torch.no_grad():
        rot.inv_freq = rot.inv_freq * 1.5
    eager_moved = (eager() - e0).abs().max().item()
    replay_moved = (replay() - r0).abs().max().item()
    live = gt.snapshot(None, manifest, roots=roots, runtime_state=runtime, event="inv_freq rebuilt", contents="updated")
    save(f"corpus_{family}_decode_rebound_live.json", live)
    report = graphcheck.verify(manifest, live, allow=CUBLAS_WORKSPACE)
    print(f"decode, rebound inv_freq: eager output moved by {eager_moved}, replay by {replay_moved}\n{report}")
    assert eager_moved > 1e-3
    assert abs(replay_moved - eager_moved) > 1e-3 or replay_moved != replay_moved
    got = {(f.kind, f.subject) for f in report.findings}
    assert ("drifted", "model.model.rotary_emb.inv_freq") in got, str(report)
    assert report.recapture() == [name]
