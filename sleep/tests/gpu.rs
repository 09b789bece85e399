//! GPU test of the sleep allocator over the driver's virtual-memory calls. Opt-in, as the
//! walker's GPU tests are (`tests/gpu.rs` at the repository root): `#[ignore]`d, so a plain
//! `cargo test` lists it as ignored; it runs with `--include-ignored` and
//! `GRAPHCHECK_GPU_TESTS=1` on a machine with a CUDA driver.

use cudarc::driver::{CudaContext, result};
use graphcheck_driver::DriverError;
use graphcheck_sleep::{Backend, CudaVmm, Poison, SleepAllocator, SleepError};

/// Run only when asked for twice over (`--include-ignored` and the project's switch), so
/// that `--include-ignored` on a machine without a GPU fails with the reason, never passes.
fn require_gpu() {
    assert!(
        std::env::var("GRAPHCHECK_GPU_TESTS").is_ok_and(|v| v == "1"),
        "GPU tests are opt-in: set GRAPHCHECK_GPU_TESTS=1 on a machine with a CUDA driver"
    );
}

// Reading and writing the allocator's memory by address: the allocator hands out device
// addresses (as torch's pluggable allocator interface wants), and no safe API copies to an
// address it did not allocate itself.

/// Copies `data` to device address `va` (mapped for at least as many bytes).
#[allow(unsafe_code)]
fn write_device(va: u64, data: &[u8]) {
    // SAFETY: the caller's `va` is device memory of the allocator, mapped for `data.len()`
    // bytes; the host slice is live for the synchronous copy.
    unsafe { result::memcpy_htod_sync(va, data) }.expect("cuMemcpyHtoD");
}

/// Reads `len` bytes at device address `va` (mapped for at least as many bytes).
#[allow(unsafe_code)]
fn read_device(va: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    // SAFETY: the caller's `va` is device memory of the allocator, mapped for `len` bytes;
    // `out` holds as many, for the synchronous copy.
    unsafe { result::memcpy_dtoh_sync(&mut out, va) }.expect("cuMemcpyDtoH");
    out
}

#[test]
#[ignore = "GPU test (opt-in): GRAPHCHECK_GPU_TESTS=1 cargo test -p graphcheck-sleep --test gpu -- --include-ignored"]
fn sleep_allocator_round_trip_over_the_driver() -> Result<(), DriverError> {
    require_gpu();
    let ctx = CudaContext::new(0)?;
    ctx.bind_to_thread()?;
    let mut a = SleepAllocator::new(CudaVmm::new().expect("the driver loads"));
    let bytes = 3usize << 20; // rounded up to the granularity (2 MiB on the H200)
    let w = a.malloc(bytes as u64, 0, "weights").expect("malloc");
    let kv = a.malloc(bytes as u64, 0, "kv_cache").expect("malloc");
    let pattern: Vec<u8> = (0..bytes).map(|i| (i * 7 % 251) as u8).collect();
    write_device(w, &pattern);
    write_device(kv, &vec![7u8; bytes]);
    let granule = a.backend_mut().granularity(0).expect("granularity");

    let mapped = a.stats().bytes_mapped;
    let (free0, _) = a.backend_mut().mem_info(0).expect("cuMemGetInfo");
    let r = a.sleep(1, &["weights".to_string()]).expect("sleep");
    let (free1, _) = a.backend_mut().mem_info(0).expect("cuMemGetInfo");
    eprintln!("level 1: {r:?}; free {free0} -> {free1}, mapped was {mapped}");
    assert_eq!(r.offloaded_bytes + r.discarded_bytes, mapped);
    assert!(
        (free1 - free0).abs_diff(mapped) <= granule,
        "sleep returns the memory"
    );
    assert!(matches!(
        a.sleep(1, &[]),
        Err(SleepError::AlreadyAsleep { level: 1 })
    ));

    assert!(a.wake(None, Poison::NAN).expect("wake").awake);
    let bases: Vec<u64> = a.allocations().iter().map(|i| i.base).collect();
    assert_eq!(
        bases,
        {
            let mut b = vec![w, kv];
            b.sort();
            b
        },
        "same virtual addresses"
    );
    assert_eq!(
        read_device(w, bytes),
        pattern,
        "level 1 restores the weights bit for bit"
    );
    assert!(
        read_device(kv, bytes).iter().all(|&b| b == 0xFF),
        "the kv cache reads the poison"
    );

    a.free(w).expect("free");
    a.free(kv).expect("free");
    a.release_host_cache().expect("release");
    let s = a.stats();
    assert_eq!(
        (
            s.allocations,
            s.bytes_mapped,
            s.bytes_reserved,
            s.host_bytes_cached
        ),
        (0, 0, 0, 0)
    );
    let (free2, _) = a.backend_mut().mem_info(0).expect("cuMemGetInfo");
    assert!(
        (free0 + mapped).abs_diff(free2) <= granule,
        "teardown returns every byte"
    );
    Ok(())
}
