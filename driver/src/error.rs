//! What a failed driver call is ([`DriverError`]: the call, its code, the driver's name for
//! it), and the crate's error ([`Error`]): no driver, a driver too old, a failed call, or a
//! handle that cannot be read.

use std::ffi::CStr;

use crate::raw::{self, Status};

/// A driver call that failed: which call, the `CUresult` as the integer the driver
/// returned, and the driver's name for it (`cuGetErrorName`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{call} failed: {name} ({code})")]
pub struct DriverError {
    call: &'static str,
    code: u32,
    name: String,
}

/// `CUDA_ERROR_INVALID_VALUE`.
const INVALID_VALUE: u32 = 1;
/// `CUDA_ERROR_OUT_OF_MEMORY`.
const OUT_OF_MEMORY: u32 = 2;

impl DriverError {
    /// A failure the driver did not report as a status code (for example a capture that
    /// ended without a graph): `code` and `name` say what happened, in the same shape.
    pub fn new(call: &'static str, code: u32, name: impl Into<String>) -> Self {
        DriverError {
            call,
            code,
            name: name.into(),
        }
    }

    /// The failed status of `call`, named by the driver.
    pub(crate) fn from_status(call: &'static str, status: Status) -> Self {
        if status == Status::NOT_EXPORTED {
            return DriverError {
                call,
                code: Status::NOT_FOUND.code(),
                name: "CUDA_ERROR_NOT_FOUND: this driver does not export the call".into(),
            };
        }
        DriverError {
            call,
            code: status.code(),
            name: error_name(status.code()),
        }
    }

    /// An error of cudarc's `result` layer or safe API, for `call`. cudarc hands the code
    /// over as its `CUresult` enum; it is kept here as the integer it is.
    pub fn from_cudarc(call: &'static str, e: cudarc::driver::DriverError) -> Self {
        let code = e.0 as u32;
        DriverError {
            call,
            code,
            name: error_name(code),
        }
    }

    /// The driver call that failed.
    pub fn call(&self) -> &'static str {
        self.call
    }

    /// The `CUresult` code, as the driver numbered it.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The driver's name for the code (`CUDA_ERROR_…`), or `CUresult N` where it has none.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the driver ran out of memory (`CUDA_ERROR_OUT_OF_MEMORY`).
    pub fn is_out_of_memory(&self) -> bool {
        self.code == OUT_OF_MEMORY
    }

    /// Whether the driver rejected an argument (`CUDA_ERROR_INVALID_VALUE`).
    pub fn is_invalid_value(&self) -> bool {
        self.code == INVALID_VALUE
    }
}

/// Errors that come through cudarc's safe API (streams, launches, copies of the tests and
/// of native capture), where the call is cudarc's to name.
impl From<cudarc::driver::DriverError> for DriverError {
    fn from(e: cudarc::driver::DriverError) -> Self {
        DriverError::from_cudarc("a driver call through cudarc", e)
    }
}

/// The driver's name for `code`, from `cuGetErrorName` (which takes any integer: an
/// unknown code is answered with an error, never misread).
fn error_name(code: u32) -> String {
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or leaves it null.
    let named = unsafe { raw::cuGetErrorName(code, &mut p) }.is_success();
    if named && !p.is_null() {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    } else {
        format!("CUresult {code}")
    }
}

/// Why a driver operation could not be done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No driver library could be loaded.
    #[error("no CUDA driver: libcuda.so could not be loaded")]
    NoDriver,
    /// The driver lacks a call graphcheck needs.
    #[error(
        "the CUDA driver is version {}.{}, graphcheck needs 12.4 or newer (cuFuncGetParamInfo)",
        found / 1000,
        (found % 1000) / 10
    )]
    OldDriver {
        /// The version the driver reports (`cuDriverGetVersion`: 1000 × major + 10 × minor).
        found: i32,
    },
    /// A driver call failed.
    #[error(transparent)]
    Call(#[from] DriverError),
    /// A kernel node whose launch names no function at all.
    #[error("the kernel node names neither a function nor a library kernel")]
    NoFunction,
    /// A raw graph handle of 0.
    #[error("the graph handle is null")]
    NullGraph,
    /// No host memory for a pinned buffer (the allocator, or the driver pinning it).
    #[error("out of pinned host memory: {size} bytes")]
    HostOutOfMemory {
        /// The bytes asked for.
        size: u64,
    },
}

impl From<cudarc::driver::DriverError> for Error {
    fn from(e: cudarc::driver::DriverError) -> Self {
        Error::Call(e.into())
    }
}
