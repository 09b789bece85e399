//! The CUDA side (feature `cuda`): reading captured graphs through the driver API, and
//! capturing graphs from Rust programs on cudarc streams; the sleep allocator's
//! virtual-memory backend. The only unsafe code of the crate is in [`driver`] and [`vmm`].

pub mod capture;
#[allow(unsafe_code)]
pub mod driver;
#[allow(unsafe_code)]
pub mod vmm;
pub mod walk;

pub use driver::GraphRef;
pub use walk::{WalkStats, walk_graph};

/// Why a CUDA operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    #[error("no CUDA driver: libcuda.so could not be loaded")]
    NoDriver,
    #[error(
        "the CUDA driver is version {}.{}, graphcheck needs 12.4 or newer (cuFuncGetParamInfo)",
        found / 1000,
        (found % 1000) / 10
    )]
    OldDriver { found: i32 },
    #[error("{call} failed: {name} ({code})")]
    Call {
        call: &'static str,
        code: u32,
        name: String,
    },
    #[error(
        "no current CUDA context on this thread: make one current (torch does on first CUDA use)"
    )]
    NoContext,
    #[error("the kernel node names neither a function nor a library kernel")]
    NoFunction,
    #[error("{0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error(transparent)]
    Build(#[from] crate::resolve::manifest::BuildError),
}
