//! GPU tests of the `gc128` kernel (feature `cuda`): every digest the kernel computes equals
//! the CPU twin's of the same bytes, over odd lengths, misaligned starts, strided layouts,
//! empty views and 100,000 small views in one launch. Opt-in like tests/gpu.rs: `#[ignore]`d,
//! run with `GRAPHCHECK_GPU_TESTS=1 cargo test --features cuda --test gpu_digest --
//! --include-ignored` on a machine with a CUDA driver and NVRTC (`GRAPHCHECK_NVRTC` names
//! libnvrtc where it is on no loader path; `--release` makes the CPU twin's side of the
//! 1 GiB case take seconds, not a minute).
#![cfg(feature = "cuda")]

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr};
use graphcheck::cuda::digest::{DeviceView, digests};
use graphcheck::digest::{View, gc128_view};

fn require_gpu() {
    assert!(
        std::env::var("GRAPHCHECK_GPU_TESTS").is_ok_and(|v| v == "1"),
        "GPU tests are opt-in: set GRAPHCHECK_GPU_TESTS=1 on a machine with a CUDA driver"
    );
}

fn nvrtc() -> Option<PathBuf> {
    std::env::var_os("GRAPHCHECK_NVRTC").map(PathBuf::from)
}

/// SplitMix64 words, for repeatable contents.
fn bytes(seed: u64, n: usize) -> Vec<u8> {
    let mut s = seed;
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
    out.truncate(n);
    out
}

struct Device {
    stream: Arc<CudaStream>,
    _ctx: Arc<CudaContext>,
}

fn device() -> Device {
    let ctx = CudaContext::new(0).expect("device 0");
    let stream = ctx.new_stream().expect("a stream");
    Device { stream, _ctx: ctx }
}

fn upload(d: &Device, host: &[u8]) -> (CudaSlice<u8>, u64) {
    let buf = d.stream.clone_htod(host).expect("copy to the device");
    let p = {
        let (p, _sync) = buf.device_ptr(&d.stream);
        p
    };
    (buf, p)
}

/// A view at byte `offset` of the buffer, and its CPU twin's digest.
struct Case {
    offset: usize,
    shape: Vec<u64>,
    stride: Vec<i64>,
    itemsize: u32,
}

fn check(d: &Device, host: &[u8], cases: &[Case]) {
    let (_buf, base) = upload(d, host);
    let views: Vec<DeviceView> = cases
        .iter()
        .map(|c| DeviceView {
            addr: base + c.offset as u64,
            shape: c.shape.clone(),
            stride: c.stride.clone(),
            itemsize: c.itemsize,
        })
        .collect();
    let stream = d.stream.cu_stream() as usize as u64;
    let got = digests(0, stream, &views, nvrtc().as_deref()).expect("the GPU digest runs");
    // One digest per view: `zip` alone would pass a short or empty answer.
    assert_eq!(
        got.len(),
        cases.len(),
        "digests returned for {} views",
        cases.len()
    );
    for (c, g) in cases.iter().zip(&got) {
        let want = gc128_view(
            &host[c.offset..],
            View {
                shape: &c.shape,
                stride: &c.stride,
                itemsize: c.itemsize,
            },
        )
        .unwrap();
        assert_eq!(
            *g, want,
            "offset {} shape {:?} stride {:?} itemsize {}",
            c.offset, c.shape, c.stride, c.itemsize
        );
    }
}

fn flat(offset: usize, n: u64, itemsize: u32) -> Case {
    Case {
        offset,
        shape: vec![n],
        stride: vec![1],
        itemsize,
    }
}

#[test]
#[ignore = "GPU test (opt-in): GRAPHCHECK_GPU_TESTS=1 cargo test --features cuda --test gpu_digest -- --include-ignored"]
fn contiguous_views_of_every_length_and_alignment_match_the_twin() {
    require_gpu();
    let d = device();
    let host = bytes(1, 3 << 20);
    let mut cases = Vec::new();
    for offset in [0, 1, 2, 3, 4, 6, 7, 8, 12, 16, 24, 4096] {
        for len in [
            0u64, 1, 5, 7, 8, 9, 15, 16, 17, 31, 33, 4095, 4096, 16384, 16385,
        ] {
            cases.push(flat(offset, len, 1));
        }
        // Past one chunk (16 KiB), not a multiple of anything.
        cases.push(flat(offset, (1 << 20) + 4093, 1));
        cases.push(flat(offset, 2 * 16384 + 8, 1));
    }
    for itemsize in [2u32, 4, 8, 16] {
        cases.push(flat(0, 1000 / u64::from(itemsize) + 1, itemsize));
        cases.push(flat(itemsize as usize, 777, itemsize));
    }
    check(&d, &host, &cases);
}

#[test]
#[ignore = "GPU test (opt-in): GRAPHCHECK_GPU_TESTS=1 cargo test --features cuda --test gpu_digest -- --include-ignored"]
fn strided_views_match_the_twin() {
    require_gpu();
    let d = device();
    let host = bytes(2, 1 << 22);
    let c = |offset, shape: &[u64], stride: &[i64], itemsize| Case {
        offset,
        shape: shape.to_vec(),
        stride: stride.to_vec(),
        itemsize,
    };
    let cases = [
        c(0, &[1024, 1024], &[1, 1024], 2), // a transposed bf16 matrix
        c(2, &[1000, 3], &[4, 1], 4),       // rows of 12 bytes out of 16, misaligned
        c(0, &[7, 5, 3], &[1, 7, 35], 8),   // permuted
        c(0, &[64, 33], &[0, 1], 4),        // expanded (stride 0)
        c(1, &[300, 7], &[9, 1], 1),        // bytes, odd rows, odd start
        c(0, &[2, 3, 4, 5], &[60, 1, 15, 3], 2),
        c(0, &[4, 100], &[1, 4], 16), // complex128, transposed
        c(8, &[0, 5], &[1, 7], 4),    // empty
        c(
            0,
            &[2; 12],
            &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048],
            1,
        ),
        c(0, &[3, 1, 1, 5], &[5, 99, 7, 1], 4), // size-1 dimensions, then contiguous
    ];
    check(&d, &host, &cases);
}

#[test]
#[ignore = "GPU test (opt-in): GRAPHCHECK_GPU_TESTS=1 cargo test --features cuda --test gpu_digest -- --include-ignored"]
fn a_hundred_thousand_small_views_in_one_launch_match_the_twin() {
    require_gpu();
    let d = device();
    let host = bytes(3, 100_000 * 64 + 64);
    let cases: Vec<Case> = (0..100_000)
        .map(|i| flat(i * 64 + i % 8, (i % 61) as u64, 1))
        .collect();
    check(&d, &host, &cases);
}

#[test]
#[ignore = "GPU test (opt-in): GRAPHCHECK_GPU_TESTS=1 cargo test --features cuda --test gpu_digest -- --include-ignored"]
fn a_large_view_digests_repeatably_and_matches_the_twin() {
    require_gpu();
    let d = device();
    let n = 1usize << 30;
    let host = bytes(4, n);
    let (_buf, base) = upload(&d, &host);
    let view = [DeviceView {
        addr: base,
        shape: vec![n as u64 / 2],
        stride: vec![1],
        itemsize: 2,
    }];
    let stream = d.stream.cu_stream() as usize as u64;
    let first = digests(0, stream, &view, nvrtc().as_deref()).unwrap();
    assert_eq!(first.len(), 1, "one digest for one view");
    let mut times = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let again = digests(0, stream, &view, nvrtc().as_deref()).unwrap();
        times.push(t.elapsed().as_secs_f64());
        assert_eq!(again, first);
    }
    // A benchmark's figure, printed for whoever runs this on a GPU and asserted nothing of
    // (a test on a shared machine is no place for a speed claim): the bandwidth target is
    // held by benches/digest_bench.py against an int64 sum in the same run (benches/digest.md).
    // What this test asserts is that every call agrees, and agrees with the CPU twin.
    times.sort_by(f64::total_cmp);
    let gbs = n as f64 / times[2] / 1e9;
    eprintln!(
        "gc128 over 1 GiB: median {:.3} ms, {gbs:.0} GB/s (host call included)",
        times[2] * 1e3
    );
    let want = gc128_view(
        &host,
        View {
            shape: &[n as u64 / 2],
            stride: &[1],
            itemsize: 2,
        },
    )
    .unwrap();
    assert_eq!(first[0], want);
}
