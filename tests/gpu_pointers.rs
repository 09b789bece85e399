//! GPU test of the walker's first question for a word it has not seen: the driver's
//! pointer attributes (`is_known_pointer`) know every address `cuMemGetAddressRange` finds,
//! so the walker asks them first and skips the range call's slow failure for words in no
//! allocation. Opt-in, as `tests/gpu.rs` (`GRAPHCHECK_GPU_TESTS=1`, `--include-ignored`);
//! `benches/pointer_probe.py` checks torch's allocators (expandable segments,
//! cudaMallocAsync, graphcheck.sleep) the same way.
#![cfg(feature = "cuda")]

use cudarc::driver::{CudaContext, DevicePtr};
use graphcheck::cuda::driver::owned::{self, StreamAllocation};
use graphcheck::cuda::driver::{address_range, is_known_pointer};

#[test]
#[ignore = "GPU test (opt-in): GRAPHCHECK_GPU_TESTS=1 cargo test --features cuda --test gpu_pointers -- --include-ignored"]
fn every_address_in_an_allocation_is_a_known_pointer() {
    assert!(
        std::env::var("GRAPHCHECK_GPU_TESTS").is_ok_and(|v| v == "1"),
        "GPU tests are opt-in: set GRAPHCHECK_GPU_TESTS=1 on a machine with a CUDA driver"
    );
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.new_stream().expect("a stream");
    graphcheck::cuda::walk::driver_version().expect("the driver loads");
    ctx.bind_to_thread().expect("context current");
    let sizes = [8usize, 4096, 3 << 20, 64 << 20];
    let device: Vec<_> = sizes
        .iter()
        .map(|&n| stream.alloc_zeros::<u8>(n).expect("device memory"))
        .collect();
    let mut spans: Vec<(u64, u64)> = device
        .iter()
        .zip(sizes)
        .map(|(b, n)| (b.device_ptr(&stream).0, n as u64))
        .collect();
    let pinned = owned::pinned_zeroed::<u8>(&ctx, 1 << 20).expect("pinned host memory");
    spans.push((pinned.as_ptr().expect("its address") as u64, 1 << 20));
    let ordered = StreamAllocation::new(&stream, 1 << 20).expect("stream-ordered memory");
    spans.push((ordered.addr(), 1 << 20));
    stream.synchronize().unwrap();
    let mut found = 0;
    for &(base, n) in &spans {
        for a in [base, base + 1, base + n / 2, base + n - 1] {
            if address_range(a).is_some() {
                found += 1;
                assert!(
                    is_known_pointer(a),
                    "{a:#x} is in an allocation but not known"
                );
            }
        }
    }
    // The device and stream-ordered spans at least are the driver's allocations.
    assert!(found >= 20, "only {found} addresses found in an allocation");
    // Words kernels hold that are no address: unknown, and in no allocation.
    for w in [
        0x3400_0000u64,
        0x10_0000_0010,
        0x80_0004_6522,
        0xfff_0000_03ff,
        0x3f80_0000,
    ] {
        assert!(address_range(w).is_none(), "{w:#x}");
        assert!(!is_known_pointer(w), "{w:#x} is known but in no allocation");
    }
    ordered.free(&stream).expect("freed");
    stream.synchronize().unwrap();
}
