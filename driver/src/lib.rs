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
//! - [`patch`]: patching a captured graph in place (retarget): kernel parameter bytes,
//!   memset destinations and memcpy ends, on the template and its executable graph.
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
pub mod patch;
mod raw;
pub mod vmm;

pub use error::{DriverError, Error};
pub use graph::{
    GraphRef, KernelNode, MemcpyEnd, MemcpyNode, MemoryType, MemsetNode, NodeRef,
    can_read_conditional_bodies, disable_event_tracking,
};
pub use patch::{ArgBytes, GraphMut, KernelArgs, NodeId};

use std::ffi::c_void;

use cudarc::driver::{result, sys};

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

/// What `cuStreamGetCaptureInfo` says of a stream: not capturing, capturing into a graph,
/// or a capture the driver invalidated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CaptureState {
    /// `CU_STREAM_CAPTURE_STATUS_NONE`.
    None,
    /// `CU_STREAM_CAPTURE_STATUS_ACTIVE`.
    Active {
        /// The graph being built, as a handle integer.
        graph: u64,
    },
    /// `CU_STREAM_CAPTURE_STATUS_INVALIDATED`, or a status this code does not know (the
    /// number the driver gave).
    Other(u32),
}

/// The capture state of `stream` (a `CUstream` as an integer, torch's
/// `torch.cuda.Stream.cuda_stream`): while a capture is open, the graph it builds, which
/// can be read before `cuStreamEndCapture` hands it over. Needs the stream's context
/// current.
pub fn capture_state(stream: u64) -> Result<CaptureState, DriverError> {
    let (mut status, mut id, mut graph) = (0u32, 0, std::ptr::null_mut());
    let (mut deps, mut count) = (std::ptr::null(), 0usize);
    // SAFETY: writes a status, an id, a graph handle and a borrowed dependency array
    // (not kept); a stream the caller names is asked about, and a bad handle is an error
    // code, not a read.
    unsafe {
        raw::cuStreamGetCaptureInfo_v2(
            stream as usize as sys::CUstream,
            &mut status,
            &mut id,
            &mut graph,
            &mut deps,
            &mut count,
        )
    }
    .check("cuStreamGetCaptureInfo_v2")?;
    Ok(match status {
        0 => CaptureState::None,
        1 if !graph.is_null() => CaptureState::Active {
            graph: graph as usize as u64,
        },
        other => CaptureState::Other(other),
    })
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

/// Whether the driver knows `addr` as memory of its own at all (device, pinned host,
/// managed): `cuPointerGetAttributes` answers an address it does not know with zeros and
/// success, where `cuMemGetAddressRange` fails through the driver's error path (0.8 to 1.5 µs
/// against 60 to 140 ns for an address it knows, on the H200 with driver 580). A cheap first
/// question before asking for the range: every address [`address_range`] finds is one
/// this says is known. Needs a current context.
pub fn is_known_pointer(addr: u64) -> bool {
    use cudarc::driver::sys::CUpointer_attribute as A;
    let mut kind: u32 = 0;
    let attributes = [A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE as u32];
    let mut data = [(&mut kind as *mut u32).cast::<c_void>()];
    // SAFETY: one attribute, MEMORY_TYPE, whose value is a 4-byte CUmemorytype written as
    // the integer it is into `kind`; any address may be asked about.
    let ok =
        unsafe { raw::cuPointerGetAttributes(1, attributes.as_ptr(), data.as_mut_ptr(), addr) }
            .is_success();
    // A failed call says nothing: ask for the range as before.
    !ok || kind != 0
}

/// Whether the device memory `[addr, addr + size)` is mapped now, each byte in a driver
/// allocation of the current context's device: the device's ordinal where it is, `None`
/// where any part is not (unmapped by a sleep, never allocated, another device's, host
/// memory). A range of several driver allocations (expandable segments map a segment in
/// chunks) is followed chunk by chunk. Reading memory the driver does not map here would
/// be an illegal address that poisons the context, so readers ask first. Needs a current
/// context.
pub fn mapped_device_range(addr: u64, size: u64) -> Result<Option<i32>, DriverError> {
    use cudarc::driver::sys::CUpointer_attribute as A;
    let Some(end) = addr.checked_add(size) else {
        return Ok(None);
    };
    let mut current: sys::CUdevice = 0;
    // SAFETY: writes one device handle (an int, which is also the ordinal).
    unsafe { raw::cuCtxGetDevice(&mut current) }.check("cuCtxGetDevice")?;
    let mut at = addr;
    while at < end {
        let Some((base, len)) = address_range(at) else {
            return Ok(None);
        };
        let (mut ordinal, mut kind) = (-1i32, 0u32);
        // SAFETY: each call writes one value of the attribute's documented type
        // (DEVICE_ORDINAL: an int; MEMORY_TYPE: a CUmemorytype, read as an unsigned int).
        let ok = unsafe {
            raw::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                A::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                at,
            )
            .is_success()
                && raw::cuPointerGetAttribute(
                    (&mut kind as *mut u32).cast(),
                    A::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                    at,
                )
                .is_success()
        };
        let device = cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32;
        if !ok || kind != device || ordinal != current || base > at || base + len <= at {
            return Ok(None);
        }
        // A virtual-memory range also says whether it is mapped; a driver that cannot say
        // leaves the range's own answer.
        let mut mapped = 0i32;
        // SAFETY: writes a boolean (CU_POINTER_ATTRIBUTE_MAPPED) of at most an int's size,
        // into a zeroed int: read as nonzero or not whatever its width.
        let asked = unsafe {
            raw::cuPointerGetAttribute(
                (&mut mapped as *mut i32).cast(),
                A::CU_POINTER_ATTRIBUTE_MAPPED,
                at,
            )
        }
        .is_success();
        if asked && mapped == 0 {
            return Ok(None);
        }
        at = base + len;
    }
    Ok(Some(current))
}

/// Copies `len` bytes of device memory from `addr` to the host, synchronously. The caller
/// promises the range is mapped device memory ([`mapped_device_range`]).
pub fn read_device(addr: u64, len: usize) -> Result<Vec<u8>, DriverError> {
    let mut out = vec![0u8; len];
    if len > 0 {
        // SAFETY: `out` is `len` writable bytes; the source is the caller's mapped range.
        unsafe { result::memcpy_dtoh_sync(&mut out, addr) }
            .map_err(|e| DriverError::from_cudarc("cuMemcpyDtoH", e))?;
    }
    Ok(out)
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
