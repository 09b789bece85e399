"""The seeds' Gemma3n reproducer (vllm #53344, ``../shared/reading/003_*``) in the real
engine, with CUDA graphs on and graphcheck attached by its environment alone: run as

    GRAPHCHECK_DIR=DIR GRAPHCHECK_DIGESTS=1 GRAPHCHECK_VERIFY_ON_REPLAY=warn \
        python tests/python/scenarios/vllm_gemma3n.py shipped|registered

``vllm.LLM`` in-process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``) on a tiny Gemma3n config
with dummy weights, ``enable_sleep_mode=True``, ``attention_backend="TRITON_ATTN"``. Then a
generation, ``sleep(level=2)``, ``wake_up(tags=["weights"])``, the same parameters
reloaded, ``wake_up(tags=["kv_cache"])``, the same generation again. ``shipped``: vLLM
0.24.0 as it is, where ``embed_scale``, ``embed_scale_per_layer``,
``per_layer_input_scale`` and ``per_layer_projection_scale`` are plain attributes made
under the ``weights`` tag; ``registered``: those four made buffers after the decoder is
built (vLLM's fix in #53344 registers them), which the worker's level-2 sleep saves and
restores. Prints one JSON line: graph counts, timings, the four tensors' values before and
after, the generations, and what graphcheck wrote and warned."""

import json
import os
import sys
import tempfile
import time
import warnings

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
variant = sys.argv[1] if len(sys.argv) > 1 else "shipped"
assert variant in ("shipped", "registered"), variant
NAMES = ("embed_scale", "embed_scale_per_layer", "per_layer_input_scale", "per_layer_projection_scale")
out: dict = {"variant": variant, "graphcheck_dir": os.environ.get("GRAPHCHECK_DIR")}
caught: list = []
warnings.showwarning = lambda message, category, *a, **k: caught.append(f"{category.__name__}: {message}"[:400])

import torch  # noqa: E402
from transformers import Gemma3nTextConfig  # noqa: E402

import vllm  # noqa: E402
from vllm import LLM, SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402
from vllm.model_executor.models import gemma3n  # noqa: E402

out["vllm"] = vllm.__version__
if variant == "registered":
    original = gemma3n.Gemma3nSelfDecoder.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        for name in NAMES:
            t = getattr(self, name, None)
            if isinstance(t, torch.Tensor) and name not in self._buffers:
                delattr(self, name)
                self.register_buffer(name, t, persistent=False)

    gemma3n.Gemma3nSelfDecoder.__init__ = init

model_dir = tempfile.mkdtemp(prefix="gemma3n-")
Gemma3nTextConfig(
    architectures=["Gemma3nForCausalLM"],
    vocab_size=128,
    hidden_size=64,
    intermediate_size=[128, 128, 128],
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    max_position_embeddings=256,
    sliding_window=64,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    vocab_size_per_layer_input=128,
    hidden_size_per_layer_input=16,
    num_kv_shared_layers=1,
    laurel_rank=16,
    activation_sparsity_pattern=[0.0, 0.0, 0.0],
).save_pretrained(model_dir)

t0 = time.perf_counter()
llm = LLM(
    model=model_dir,
    load_format="dummy",
    skip_tokenizer_init=True,
    enable_sleep_mode=True,
    attention_backend="TRITON_ATTN",
    max_model_len=256,
    max_num_seqs=1,
    seed=0,
    enable_prefix_caching=False,
    disable_log_stats=True,
)
out["llm_init_s"] = round(time.perf_counter() - t0, 2)
prompt = TokensPrompt(prompt_token_ids=[2, 5, 9, 12, 7, 3])
params = SamplingParams(temperature=0.0, max_tokens=16, logprobs=1)


def signature(outputs):
    c = outputs[0].outputs[0]
    return list(c.token_ids), [lp[t].logprob for t, lp in zip(c.token_ids, c.logprobs)]


def scales(model):
    decoder = next(m for m in model.modules() if type(m).__name__ == "Gemma3nSelfDecoder")
    return {n: [getattr(decoder, n).data_ptr(), float(getattr(decoder, n).float().reshape(-1)[0])] for n in NAMES}


def save(worker):
    worker._saved = [(n, p.detach().cpu().clone()) for n, p in worker.model_runner.model.named_parameters()]


def reload(worker):
    with torch.no_grad():
        worker.reload_weights(weights_iterator=iter(worker._saved), is_checkpoint_format=False)


def graphcheck_state(worker):
    import graphcheck.torch as gt

    ins = gt.instrumented()
    if not ins:
        return None
    i = ins[0]
    i.flush()
    return {"path": str(i.path), "captures": i.captures, "errors": [str(e)[:400] for e in i.errors]}


out["before"] = signature(llm.generate(prompt, params))
out["control_equal"] = signature(llm.generate(prompt, params)) == out["before"]
out["scales_before"] = llm.apply_model(scales)
out["graphcheck_at_capture"] = llm.collective_rpc(graphcheck_state)
llm.collective_rpc(save)
llm.sleep(level=2)
llm.wake_up(tags=["weights"])
llm.collective_rpc(reload)
out["scales_after"] = llm.apply_model(scales)
llm.wake_up(tags=["kv_cache"])
out["after"] = signature(llm.generate(prompt, params))
out["identical"] = out["after"] == out["before"]
out["graphcheck_after"] = llm.collective_rpc(graphcheck_state)
out["warnings"] = [w for w in caught if "graphcheck" in w][:20]
print(json.dumps(out))
