//! The one fenced unsafe layer over the CUDA driver: every raw driver call graphcheck makes
//! is here, wrapped in a function that returns `Result`, under safe owners and borrowers.
//!
//! - [`graph`]: reading captured graphs through borrowed handles ([`GraphRef`],
//!   [`NodeRef`]), never destroyed here; driver-written structs read through
//!   `MaybeUninit`, enum fields as integers.
//! - [`owned`]: graphs and memory this process creates and destroys itself (an owned graph,
//!   captures into it, pinned host buffers): what the GPU tests build.
//! - [`nvrtc`]: the CUDA runtime compiler, loaded from a path or a name (source to CUBIN).
//! - [`digest`]: the GPU kernel of the `gc128` content digest, compiled through NVRTC,
//!   loaded per device, and launched over many tensor views on a caller's stream.
//! - [`vmm`]: the virtual-memory calls of the sleep allocator (`graphcheck-sleep`), on owned
//!   reservations, physical memory and pinned host buffers.
//!
//! Calls that cudarc's `result` layer wraps go through it. The others are declared in
//! `raw` with the C `int` result they have, looked up in the library cudarc loaded: cudarc's
//! `sys` declares every result as its `CUresult` enum, and a code a newer driver adds would
//! be an invalid value of that enum (undefined behaviour); read as an integer it is only an
//! error with a number. A call the driver does not export is an error here, not cudarc's
//! panic. Every failed call becomes one [`DriverError`]: the call, the code as an integer,
//! and the driver's name for it.
// The one crate of the workspace allowed unsafe code (see the workspace's `[lints]`).
#![allow(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod digest;
mod error;
pub mod graph;
pub mod nvrtc;
pub mod owned;
mod raw;
pub mod vmm;

pub use error::{DriverError, Error};
pub use graph::{
    GraphRef, KernelNode, MemcpyEnd, MemcpyNode, MemoryType, MemsetNode, NodeRef,
    can_read_conditional_bodies, disable_event_tracking,
};

use cudarc::driver::result;

/// The oldest driver with `cuFuncGetParamInfo` (12.4).
pub const MIN_DRIVER_VERSION: i32 = 12040;

/// Loads the driver, initializes it and checks its version; returns the version. Never
/// panics: cudarc's dynamic loading panics on a missing library, so its presence is
/// checked first.
pub fn init() -> Result<i32, Error> {
    if !raw::driver_present() {
        return Err(Error::NoDriver);
    }
    result::init().map_err(|e| DriverError::from_cudarc("cuInit", e))?;
    let mut v = 0;
    // SAFETY: writes one int.
    unsafe { raw::cuDriverGetVersion(&mut v) }.check("cuDriverGetVersion")?;
    if v < MIN_DRIVER_VERSION {
        return Err(Error::OldDriver { found: v });
    }
    Ok(v)
}

/// Whether the calling thread has a current context (`cuMemGetAddressRange` needs one).
pub fn has_current_context() -> Result<bool, DriverError> {
    result::ctx::get_current()
        .map(|ctx| ctx.is_some_and(|c| !c.is_null()))
        .map_err(|e| DriverError::from_cudarc("cuCtxGetCurrent", e))
}

/// The name of device `ordinal` (for the manifest's producer).
pub fn device_name(ordinal: i32) -> Result<String, DriverError> {
    let dev =
        result::device::get(ordinal).map_err(|e| DriverError::from_cudarc("cuDeviceGet", e))?;
    result::device::get_name(dev).map_err(|e| DriverError::from_cudarc("cuDeviceGetName", e))
}

/// The driver allocation holding `addr`, as (base, size); `None` when no allocation does.
/// Needs a current context.
pub fn address_range(addr: u64) -> Option<(u64, u64)> {
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: writes two integers; any address may be asked about.
    let ok = unsafe { raw::cuMemGetAddressRange_v2(&mut base, &mut size, addr) }.is_success();
    (ok && size > 0).then_some((base, size as u64))
}

/// The allocation holding `addr` as the driver's pointer attributes give it, (base, size):
/// this also answers for pinned and registered host memory, which `cuMemGetAddressRange`
/// does not know. `None` when the driver knows no allocation there.
pub fn pointer_range(addr: u64) -> Option<(u64, u64)> {
    use cudarc::driver::sys::CUpointer_attribute as A;
    let (mut base, mut size) = (0u64, 0usize);
    // SAFETY: each call writes one value of the attribute's documented type
    // (CU_POINTER_ATTRIBUTE_RANGE_START_ADDR: a CUdeviceptr, RANGE_SIZE: a size_t).
    let ok = unsafe {
        raw::cuPointerGetAttribute(
            (&mut base as *mut u64).cast(),
            A::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
            addr,
        )
        .is_success()
            && raw::cuPointerGetAttribute(
                (&mut size as *mut usize).cast(),
                A::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                addr,
            )
            .is_success()
    };
    (ok && size > 0 && base != 0).then_some((base, size as u64))
}
