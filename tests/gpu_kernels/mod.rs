//! The GPU tests' launches of their NVRTC kernels (`tests/gpu.rs`'s `KERNELS`), and the
//! device address of a cudarc buffer.

use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, DevicePtr, DeviceRepr, LaunchConfig, PushKernelArg,
};
use graphcheck::cuda::driver::DriverError;

/// The device address of `s`.
pub fn ptr<T>(s: &CudaSlice<T>, stream: &CudaStream) -> u64 {
    let (p, _sync) = s.device_ptr(stream);
    p
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Pair {
    pub a: u64,
    pub b: u64,
}
// SAFETY: two device pointers, laid out as the kernel's `struct Pair`.
#[allow(unsafe_code)]
unsafe impl DeviceRepr for Pair {}

// The launches: cudarc's launch API is unsafe because the arguments must match the
// kernel's parameters. Each helper passes exactly the kernel's signature; the addresses
// are the callers' device buffers of the sizes given (every caller allocates them itself).

/// `scale(float* out, const float* in, float k, int n)` over `n` floats.
#[allow(unsafe_code)]
pub fn launch_scale(
    s: &CudaStream,
    f: &CudaFunction,
    out: u64,
    input: u64,
    k: f32,
    n: usize,
) -> Result<(), DriverError> {
    let ni = n as i32;
    // SAFETY: arguments match `scale`; both buffers hold `n` floats.
    unsafe {
        s.launch_builder(f)
            .arg(&out)
            .arg(&input)
            .arg(&k)
            .arg(&ni)
            .launch(LaunchConfig::for_num_elems(n as u32))
    }?;
    Ok(())
}

/// `add_pair(Pair p, float* out, int n)` over `n` floats.
#[allow(unsafe_code)]
pub fn launch_add_pair(
    s: &CudaStream,
    f: &CudaFunction,
    pair: Pair,
    out: u64,
    n: usize,
) -> Result<(), DriverError> {
    let ni = n as i32;
    // SAFETY: arguments match `add_pair`; the pair's buffers and `out` hold `n` floats.
    unsafe {
        s.launch_builder(f)
            .arg(&pair)
            .arg(&out)
            .arg(&ni)
            .launch(LaunchConfig::for_num_elems(n as u32))
    }?;
    Ok(())
}

/// `gather(float* const* ptrs, int count, float* out)` with one block of 32 threads.
#[allow(unsafe_code)]
pub fn launch_gather(
    s: &CudaStream,
    f: &CudaFunction,
    table: u64,
    count: i32,
    out: u64,
) -> Result<(), DriverError> {
    let cfg = LaunchConfig {
        grid_dim: (1, 1, 1),
        block_dim: (32, 1, 1),
        shared_mem_bytes: 0,
    };
    // SAFETY: arguments match `gather`; the table holds `count` pointers to device floats
    // and `out` holds `count` floats.
    unsafe {
        s.launch_builder(f)
            .arg(&table)
            .arg(&count)
            .arg(&out)
            .launch(cfg)
    }?;
    Ok(())
}
