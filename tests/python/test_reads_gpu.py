"""The reads view on real captures (GPU, opt-in): one model captured by torch in two
processes, the second with its tensors at other addresses, gives the same reads text (with
and without kernels) while the documents differ; and the graphs replay after the walk."""

import json
import subprocess
import sys

import pytest

import graphcheck

# Each process: a small decoder layer (cuBLAS GEMMs, an elementwise kernel, a plain-attribute
# scale) captured at two batch sizes into a Recorder; SHIFT allocates first, so every
# tensor lands elsewhere. Prints the manifest's JSON and the first data pointer.
CHILD = r"""
import json, sys, torch
import graphcheck.torch as gt
shift = int(sys.argv[1])
pad = torch.empty(shift, dtype=torch.uint8, device="cuda") if shift else None
class Layer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(256, 512)
        self.down = torch.nn.Linear(512, 256)
        self.scale = torch.full((256,), 0.5)   # a plain attribute: unregistered
    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x))) * self.scale
model = Layer().cuda().eval()
model.scale = model.scale.cuda()
rec = gt.Recorder(model)
outs = {}
with torch.no_grad():
    for bs in (1, 8):
        x = torch.randn(bs, 256, device="cuda")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph(keep_graph=True)
        with gt.graph(g, name=f"decode_bs{bs}", recorder=rec, inputs={"x": x}):
            y = model(x)
        g.replay()
        torch.cuda.synchronize()
        assert torch.allclose(y, model(x)), "the replay after the walk differs from eager"
print(json.dumps({"manifest": rec.manifest(), "ptr": model.up.weight.data_ptr()}))
"""


def capture(shift: int) -> dict:
    p = subprocess.run(
        [sys.executable, "-c", CHILD, str(shift)], capture_output=True, text=True, timeout=300
    )
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


def test_two_processes_capturing_one_model_elsewhere_read_the_same(cuda):
    a, b = capture(0), capture(48 << 20)
    assert a["ptr"] != b["ptr"], "the second process did not move the model"
    assert graphcheck.normalized(a["manifest"]) != "" and a["manifest"] != b["manifest"]
    for kernels in (True, False):
        ra = graphcheck.reads(a["manifest"], kernels=kernels)
        rb = graphcheck.reads(b["manifest"], kernels=kernels)
        assert ra == rb, f"kernels={kernels}:\n{ra}\n---\n{rb}"
    text = graphcheck.reads(a["manifest"])
    # What the view must name: the owners the graphs read, the plain attribute, the graphs.
    for line in ("model.up.weight (parameter)", "model.scale (module_attribute)", "decode_bs1", "decode_bs8"):
        assert line in text, text
    assert "0x" not in text, "an address in the reads view"
    print(text)
