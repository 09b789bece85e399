//! The CUDA side (feature `cuda`): reading captured graphs through the driver layer
//! (`graphcheck-driver`, re-exported as [`driver`]), and capturing graphs from Rust
//! programs on cudarc streams; `gc128` digests of device tensors through the driver layer's
//! kernel; retargeting a captured graph in place ([`retarget`], patching through the
//! driver layer's `GraphMut`). No unsafe code here: every raw driver call is in the driver
//! crate.

pub mod capture;
pub mod digest;
pub mod retarget;
pub mod walk;

pub use graphcheck_driver as driver;
pub use graphcheck_driver::GraphRef;
pub use walk::{WalkStats, walk_graph};

/// Why a CUDA operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CudaError {
    /// The driver layer's: no driver, a driver too old, a failed call (with the driver's
    /// name for its code), a kernel node without a function.
    #[error(transparent)]
    Driver(#[from] graphcheck_driver::Error),
    #[error(
        "no current CUDA context on this thread: make one current (torch does on first CUDA use)"
    )]
    NoContext,
    #[error(transparent)]
    Build(#[from] crate::resolve::manifest::BuildError),
}

impl From<graphcheck_driver::DriverError> for CudaError {
    fn from(e: graphcheck_driver::DriverError) -> Self {
        CudaError::Driver(e.into())
    }
}

/// Errors of cudarc's safe API (streams, copies, launches in native capture and its tests).
impl From<cudarc::driver::DriverError> for CudaError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        CudaError::Driver(e.into())
    }
}
