"""The reload corpus with real `transformers` models (issue 6): small Llama, Qwen3 and
Mistral models built from configs with random weights (no download), a forward captured
with graphcheck.torch.graph.
An in-place `load_state_dict` reload must verify clean and replay right; rebinding one
derived tensor (the rotary `inv_freq`) must be caught and replay wrong. Opt-in
(GRAPHCHECK_GPU_TESTS=1); GRAPHCHECK_GPU_OUT=DIR keeps the documents."""

import os

import pytest

import graphcheck
import graphcheck.torch as gt
from conftest import CUBLAS_WORKSPACE, save_gpu_document as save

GPU = os.environ.get("GRAPHCHECK_GPU_TESTS") == "1"
LIVE_KINDS = {"drifted", "freed", "reused", "reshaped", "stale", "vanished"}




FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
    "mistral": ("MistralConfig", "MistralForCausalLM"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_inplace_reload_is_clean_and_a_rebound_buffer_is_caught(torch, family):
    if not GPU:
        pytest.skip("GPU tests are opt-in: set GRAPHCHECK_GPU_TESTS=1 on a machine with CUDA")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    config_cls, model_cls = (getattr(transformers, n) for n in FAMILIES[family])
    cfg = config_cls(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
    )
    model = model_cls(cfg).cuda().eval()
    ids = torch.randint(0, 512, (1, 16), device="cuda")

    def fwd():
        return model(input_ids=ids, use_cache=False).logits

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        for _ in range(2):
            fwd()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.no_grad(), gt.graph(g, model=model, name=f"{family}_prefill16", inputs={"ids": ids}) as rec:
        out = fwd()
    manifest = rec.manifest()
    save(f"corpus_{family}_manifest.json", manifest)
    print(graphcheck.verify(manifest, allow=CUBLAS_WORKSPACE))

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
