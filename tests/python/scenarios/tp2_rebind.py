"""A tensor-parallel model on two GPUs under graphcheck.torch.instrument, one process per
rank (NCCL): a column-parallel linear, a row-parallel linear and an all-reduce captured in
one CUDA graph per rank. After capture, rank 1 alone reloads its row-parallel shard by
rebinding it (a new tensor; the old one freed), both ranks replay and snapshot. Each rank
writes its manifest (instrument's own file) and its live snapshot into OUT_DIR, and prints
one JSON line of facts.

Usage: python3 tp2_rebind.py OUT_DIR   (needs two GPUs)
"""

import json
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank: int, world: int, port: int, out_dir: str) -> None:
    import faulthandler

    import graphcheck
    import graphcheck.torch as gt

    # A hang prints every thread's stack and ends the worker.
    faulthandler.dump_traceback_later(int(os.environ.get("TP2_HANG_S", "90")), exit=True)

    def step(what):
        print(f"[rank {rank}] {what}", file=sys.stderr, flush=True)

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        device_id=torch.device("cuda", rank),
    )
    facts = {"rank": rank}
    try:
        torch.manual_seed(0)  # same full weights on every rank; each keeps its shard
        d, h = 512, 1024
        w1 = torch.randn(h, d) * 0.05
        w2 = torch.randn(d, h) * 0.05
        shard = h // world

        class TPMLP(torch.nn.Module):
            def __init__(self):
                super().__init__()
                # column-parallel: rows of w1; row-parallel: columns of w2
                self.up = torch.nn.Linear(d, shard, bias=False, device="cuda")
                self.down = torch.nn.Linear(shard, d, bias=False, device="cuda")
                with torch.no_grad():
                    self.up.weight.copy_(w1[rank * shard:(rank + 1) * shard])
                    self.down.weight.copy_(w2[:, rank * shard:(rank + 1) * shard])

            def forward(self, x):
                y = self.down(torch.relu(self.up(x)))
                dist.all_reduce(y)
                return y

        model = TPMLP()
        x = torch.randn(8, d, device="cuda")
        dist.broadcast(x, 0)
        ins = gt.instrument(out_dir, model=model, name="decode_bs8")
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(2):
                model(x)
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g):
            y = model(x)
        g.replay()
        torch.cuda.synchronize()
        reference = torch.relu(x.cpu() @ w1.t()) @ w2.t()
        facts["capture_error"] = (y.cpu() - reference).abs().max().item()
        manifest = ins.manifest()
        facts["manifest"] = ins.path
        facts["node_counts"] = manifest["graphs"][0]["node_counts"]
        facts["kernels"] = sorted({n["name"][:80] for n in manifest["graphs"][0]["nodes"]})
        facts["capture_findings"] = sorted({(f.kind, f.subject) for f in graphcheck.verify(manifest).findings})
        # A reload on rank 1 only: its row-parallel shard rebound to a new tensor.
        if rank == 1:
            with torch.no_grad():
                model.down.weight = torch.nn.Parameter(model.down.weight.detach().clone())
        dist.barrier()
        step("snapshot")
        live = gt.snapshot(model, manifest, event="reload_weights() on rank 1 (rebinding)", contents="preserved")
        with open(os.path.join(out_dir, f"live-{rank}.json"), "w") as f:
            json.dump(live, f)
        # What the replay serves now: rank 1's old shard was freed; scribble where it was.
        junk = [torch.full((d, shard), 7.0, device="cuda") for _ in range(4)] if rank == 1 else []
        step("replay after the reload")
        print(json.dumps({"rank": rank, "partial": True, **{k: v for k, v in facts.items() if k != "rank"}}), flush=True)
        g.replay()
        torch.cuda.synchronize()
        step("replayed")
        facts["replay_error_after"] = (y.cpu() - reference).abs().max().item()
        facts["live_findings"] = sorted({(f.kind, f.subject) for f in graphcheck.verify(manifest, live).findings})
        del junk
        gt.uninstrument(ins)
        step("uninstrumented")
        print(json.dumps(facts), flush=True)
        # A graph holding NCCL work still alive at destroy_process_group hung both ranks
        # (torch 2.11, two H200s): the graph goes first.
        del g, y
        torch.cuda.synchronize()
    finally:
        dist.destroy_process_group()
        step("destroyed")


if __name__ == "__main__":
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    world = 2
    mp.spawn(worker, args=(world, free_port(), out), nprocs=world, join=True)
