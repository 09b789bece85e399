"""A torch_memory_saver engine (SGLang's way) under graphcheck's replay check, in a process
of its own (torch_memory_saver installs its own pluggable allocator). sglang #27140's
class: a persistent recurrent state allocated under the KV-cache tag, which a pause
discards, while the weights are paused with a CPU backup. Prints one JSON line.

Its regions are pools of the manifest by themselves (``weights`` restored, ``kv_cache``
discarded), so the state is ``mispooled`` at capture. With the argument ``preload``, the
same in the package's ``preload`` mode (the test sets ``LD_PRELOAD`` to its hook library).
With the argument ``refit``, the RL framework's order (verl over SGLang): resume the
weights, load new ones (``load_state_dict``, which says what it wrote), then resume the
KV cache; the new weights must be no finding at the last resume, which preserves."""

import json
import os
import sys

import torch
import torch_memory_saver as tms_module

import graphcheck
import graphcheck.torch as gt
from graphcheck._instrument import transitions

saver = tms_module.torch_memory_saver
saver.hook_mode = "preload" if "preload" in sys.argv[1:] else "torch"
out = {}

with saver.region(tag="weights", enable_cpu_backup=True):
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(256, 256, device="cuda")
with saver.region(tag="kv_cache"):
    model.register_buffer("state", torch.full((256,), 3.0, device="cuda"))  # persistent
x = torch.randn(8, 256, device="cuda")


def step():
    return model.proj(x) + model.state


ins = gt.instrument(None, model=model, name="decode_bs8", digests=True, verify_on_replay="raise")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.no_grad(), torch.cuda.stream(s):
    step()
torch.cuda.current_stream().wait_stream(s)
g = torch.cuda.CUDAGraph()
with torch.no_grad(), torch.cuda.graph(g):
    y = step()
g.replay()
torch.cuda.synchronize()
out["patched"] = getattr(type(saver).resume, "_graphcheck_transition", False)
manifest = ins.manifest_json()
out["pools"] = sorted([p["name"], p["kind"], p["sleep"]] for p in graphcheck.load(manifest)["pools"])
at_capture = graphcheck.verify(manifest)
out["capture"] = sorted({(f.kind, o.path) for f in at_capture.findings for o in f.owners})

refit = "refit" in sys.argv[1:]
saver.pause()
if refit:
    saver.resume("weights")
    new = {k: v + 0.25 for k, v in model.proj.state_dict().items()}
    with torch.no_grad():
        model.proj.load_state_dict(new)
    out["weights_changed"] = bool((model.proj.weight == new["weight"]).all().item())
    saver.resume("kv_cache")  # the latest transition: contents preserved
else:
    saver.resume()  # a transition graphcheck sees by itself
out["epoch"] = transitions.epoch()  # transitions marked: 1, or 3 with the refit
out["state_after_resume"] = float(model.state[0].item())
try:
    g.replay()
    out["refused"] = False
except gt.ReplayCheckError as e:
    out["refused"] = True
    out["graph"] = e.graph
    out["findings"] = sorted({(f.kind, o.path) for f in e.findings for o in f.owners})
    out["message"] = str(e).splitlines()[0]
out["errors"] = [str(e) for e in ins.errors]
# The documents, for fixtures/gpu/ (GRAPHCHECK_GPU_OUT): the manifest of the capture and a
# snapshot after the resume (not for `refit`: its check leaves out what the load wrote,
# which a snapshot on file cannot say).
save = os.environ.get("GRAPHCHECK_GPU_OUT")
if save and not refit:
    flow = "preload" if "preload" in sys.argv[1:] else "torch"
    live = gt.snapshot(model, manifest, event="torch_memory_saver.resume()", digests=True)
    for kind, doc in (("manifest", json.loads(manifest)), ("live", live)):
        with open(os.path.join(save, f"tms_{flow}_{kind}.json"), "w") as f:
            json.dump(doc, f, indent=1)
            f.write("\n")
gt.uninstrument(ins)

# graphcheck's own sleep allocator beside it: it maps its memory itself (cuMemCreate), never
# through cudaMalloc, which the preload hook intercepts. A level-1 round trip of an offloaded
# tag, with torch_memory_saver pausing and resuming in between, keeps address and contents.
import graphcheck.sleep as gs

with gs.sleep_pool("draft"):
    extra = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
at = extra.data_ptr()
gs.sleep(1, offload_tags=["draft"])
saver.pause()
saver.resume()
gs.wake()
expect = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
out["sleep_beside"] = [extra.data_ptr() == at, bool(torch.equal(extra, expect))]
print(json.dumps(out))
sys.exit(0)
