"""The walker's first question for a word it has not seen (GPU): `cuPointerGetAttributes`
(does the driver know this address at all?) before `cuMemGetAddressRange` (which
allocation holds it?), whose failure for a word in no allocation takes the driver's slow
error path. Checks, on every kind of memory one process can make, that every address the
range call finds is one the first question calls known (so it may stand in front), and
times both calls on a known and an unknown address.

  default      torch's caching allocator (small and large blocks) and pinned host memory
  expandable   PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (virtual memory, mapped
               in chunks)
  async        PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync (stream-ordered pools)
  sleep        graphcheck.sleep's allocator (virtual memory per tag)

Each kind runs in a process of its own (the allocator is chosen at CUDA's first use).
Needs examples/walk_ffi.rs built (`cargo build --release --features cuda --example
walk_ffi`) and graphcheck installed (for `sleep`):
    python3 benches/pointer_probe.py --lib target/release/examples/libwalk_ffi.so
Exit 1 where an address was found by the range call but not known.
"""
import argparse
import ctypes
import os
import random
import subprocess
import sys

KINDS = {
    "default": {},
    "expandable": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"},
    "async": {"PYTORCH_CUDA_ALLOC_CONF": "backend:cudaMallocAsync"},
    "sleep": {},
}


def probe(lib_path: str, kind: str) -> int:
    import torch

    lib = ctypes.CDLL(lib_path)
    for f in ("graphcheck_time_range", "graphcheck_time_known"):
        getattr(lib, f).argtypes = [ctypes.c_uint64, ctypes.c_uint32]
        getattr(lib, f).restype = ctypes.c_double
    lib.graphcheck_probe.argtypes = [ctypes.c_uint64]
    sizes = (512, 1 << 20, 3 << 20, 50 << 20, 300 << 20)
    if kind == "sleep":
        import graphcheck.sleep as gs

        gs.allocator()
        with gs.sleep_pool("weights"):
            bufs = [torch.empty(n, device="cuda", dtype=torch.uint8) for n in sizes]
    else:
        bufs = [torch.empty(n, device="cuda", dtype=torch.uint8) for n in sizes]
        if kind == "default":
            bufs.append(torch.empty(1 << 20, dtype=torch.uint8).pin_memory())
    torch.cuda.synchronize()
    rng = random.Random(0)
    addrs = []
    for b in bufs:
        base, n = b.data_ptr(), b.numel()
        addrs += [base + off for off in [0, 1, n // 2, n - 1] + [rng.randrange(n) for _ in range(50)]]
    # Words kernels hold that are no address (packed sizes, a float's bits), and random ones.
    addrs += [0x34000000, 0x1000000010, 0x480000000, 0x8000046522, 0xFFF000003FF, 0x3F800000]
    addrs += [rng.randrange(1 << 16, 1 << 47) for _ in range(2000)]
    missed = [a for a in addrs if lib.graphcheck_probe(a) == 1]
    found = sum(1 for a in addrs if lib.graphcheck_probe(a) & 1)
    inside, none = bufs[0].data_ptr() + 8, 0x8000046522
    t = lambda f, a: getattr(lib, f)(a, 20000)  # noqa: E731
    print(
        f"{kind:<10} {len(addrs)} addresses, {found} in an allocation, {len(missed)} of them not known "
        f"{[hex(a) for a in missed[:4]]}; ns per call: known address range {t('graphcheck_time_range', inside):.0f} "
        f"/ known {t('graphcheck_time_known', inside):.0f}, unknown address range "
        f"{t('graphcheck_time_range', none):.0f} / known {t('graphcheck_time_known', none):.0f}"
    )
    return 1 if missed else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lib", required=True, help="libwalk_ffi.so")
    ap.add_argument("--kind", choices=sorted(KINDS), help="probe one kind in this process")
    args = ap.parse_args()
    if args.kind:
        sys.exit(probe(args.lib, args.kind))
    rc = 0
    for kind, env in KINDS.items():
        r = subprocess.run([sys.executable, __file__, "--lib", args.lib, "--kind", kind], env={**os.environ, **env})
        rc |= r.returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
