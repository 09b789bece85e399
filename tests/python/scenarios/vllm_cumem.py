"""vLLM's own sleep allocator (``vllm.device_allocator.cumem.CuMemAllocator``, vLLM
0.24.0) under graphcheck's replay check, in a process of its own: the real allocator, its
tags read into pools with no declaration. Argument: the sleep level, 1 or 2, as vLLM's
worker sleeps (``sleep(offload_tags=("weights",) if level == 1 else ())``).

One model, three graphs, the seeds' classes side by side:

- ``clean``: registered parameters only (under ``weights``): no finding, at either level.
- ``const``: plus a plain-attribute constant made under ``weights`` (Gemma3n's
  ``embed_scale``, vllm #37282): ``unregistered`` at capture; backed up at level 1, so its
  replay is right; lost at level 2, whose reload restores parameters only: ``stale``.
- ``state``: plus a persistent buffer made inside the ``kv_cache`` context (sglang #27140's
  class): ``mispooled`` at capture, ``stale`` after either level.

After the wake (level 2: ``wake_up(["weights"])``, the weights reloaded with
``load_state_dict``, ``wake_up(["kv_cache"])``) each graph is replayed under the check
(refused or let through), then without it, against the eager output of before the sleep.
Prints one JSON line; with ``GRAPHCHECK_GPU_OUT`` set, writes the documents there."""

import dataclasses
import json
import os
import sys

import torch

import graphcheck
import graphcheck.torch as gt
from graphcheck import _caching_allocator
from graphcheck._instrument import transitions

level = int(sys.argv[1])
assert level in (1, 2), "the sleep level is 1 or 2"

import vllm  # noqa: E402
from vllm.device_allocator import AllocationData  # noqa: E402
from vllm.device_allocator.cumem import CuMemAllocator  # noqa: E402

out = {"vllm": vllm.__version__, "level": level}
allocator = CuMemAllocator.get_instance()
H = 512

with allocator.use_memory_pool(tag="weights"):
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(H, H, device="cuda")
    model.scale = torch.full((H,), 0.5, device="cuda")  # a plain attribute: not reloaded
with allocator.use_memory_pool(tag="kv_cache"):
    model.register_buffer("state", torch.full((H,), 3.0, device="cuda"))  # persistent
inputs = torch.nn.Module()  # the engine's static input buffer, outside vLLM's pools
inputs.register_buffer("x", torch.randn(8, H, device="cuda"))
gt.register_model(inputs, root="inputs")

steps = {
    "clean": lambda: model.proj(inputs.x),
    "const": lambda: model.proj(inputs.x) * model.scale,
    "state": lambda: model.proj(inputs.x) + model.state,
}
with torch.no_grad():
    expected = {name: f().clone() for name, f in steps.items()}

order = list(steps)  # captures are numbered from 0
ins = gt.instrument(False, model=model, name=lambda i: order[i], digests=True, verify_on_replay="raise")
graphs, outputs = {}, {}
pool = torch.cuda.graph_pool_handle()
for name, f in steps.items():
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(s):
        f()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g, pool=pool):
        outputs[name] = f()
    graphs[name] = g
torch.cuda.synchronize()
manifest = ins.manifest_json()
doc = graphcheck.load(manifest)
out["pools"] = sorted([p["name"], p["kind"], p["sleep"]] for p in doc["pools"])
out["tensor_pools"] = sorted(
    {(o["path"], doc["pools"][t["pool"]]["name"] if t.get("pool") is not None else None)
     for o in doc["owners"] for t in doc["tensors"] if t["id"] == o["tensor"]}
)
at_capture = graphcheck.verify(manifest)
out["capture"] = sorted({(f.kind, o.path) for f in at_capture.findings for o in f.owners})
out["capture_graphs"] = sorted({(f.kind, g) for f in at_capture.findings for g in f.graphs})

# The allocator's table as graphcheck read it, and as vLLM lays it out (for the CPU test
# that holds graphcheck's reader to this layout: fixtures/gpu/vllm_cumem_layout.json).
regions = _caching_allocator.cumem_regions()
out["regions"] = [(tag, kind, sleep, len(r)) for tag, kind, sleep, r in regions]
entry = next(iter(allocator.pointer_to_data.items()))
out["layout"] = {
    "vllm": vllm.__version__,
    "allocator": f"{CuMemAllocator.__module__}.{CuMemAllocator.__qualname__}",
    "instance_attributes": sorted(vars(allocator)),
    "pointer_to_data": type(allocator.pointer_to_data).__name__,
    "key": type(entry[0]).__name__,
    "allocation_data": f"{AllocationData.__module__}.{AllocationData.__qualname__}",
    "fields": [f.name for f in dataclasses.fields(AllocationData)],
    "handle": [type(x).__name__ for x in entry[1].handle],
    "handle_ptr_is_key": entry[1].handle[2] == entry[0],
    "tags": sorted({d.tag for d in allocator.pointer_to_data.values()}),
}

weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items() if k.startswith("proj.")}
if level == 1:
    allocator.sleep(offload_tags=("weights",))
    allocator.wake_up()  # a transition graphcheck sees by itself
else:
    allocator.sleep(offload_tags=())
    allocator.wake_up(tags=["weights"])
    with torch.no_grad():
        model.load_state_dict(weights, strict=False)  # the engine's reload: parameters
    allocator.wake_up(tags=["kv_cache"])
torch.cuda.synchronize()
out["epoch"] = transitions.epoch()
out["patched"] = getattr(CuMemAllocator.wake_up, "_graphcheck_transition", False)
out["scale_after"] = float(model.scale[0].item())
out["state_after"] = float(model.state[0].item())

out["refused"], out["findings"] = {}, {}
for name, g in graphs.items():
    try:
        g.replay()
        out["refused"][name] = False
    except gt.ReplayCheckError as e:
        out["refused"][name] = True
        out["findings"][name] = sorted({(f.kind, o.path) for f in e.findings for o in f.owners})
out["errors"] = [str(e) for e in ins.errors]

save = os.environ.get("GRAPHCHECK_GPU_OUT")
if save:
    live = gt.snapshot(
        model, manifest, event=f"vllm CuMemAllocator sleep({level}) + wake_up", digests=True,
        roots={"inputs": inputs},
    )
    for kind, document in (("manifest", json.loads(manifest)), ("live", live)):
        with open(os.path.join(save, f"vllm_cumem_l{level}_{kind}.json"), "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
    if level == 1:
        with open(os.path.join(save, "vllm_cumem_layout.json"), "w") as f:
            json.dump(out["layout"], f, indent=1)
            f.write("\n")
gt.uninstrument(ins)

# The same replays unchecked, against the eager output of before the sleep.
out["replay_right"] = {}
for name, g in graphs.items():
    g.replay()
    torch.cuda.synchronize()
    out["replay_right"][name] = bool(torch.equal(outputs[name], expected[name]))
print(json.dumps(out))
sys.exit(0)
