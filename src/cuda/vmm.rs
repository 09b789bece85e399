//! The sleep allocator's [`Backend`] over the driver's virtual-memory calls
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemAddressFree`) and registered (pinned) host memory for the host copies. With
//! [`super::driver`], the fenced unsafe layer: every raw call is here, wrapped in a method
//! that returns `Result`. Each operation runs with the device's primary context current
//! (the one PyTorch's runtime uses), pushed and popped around it.

use std::collections::BTreeMap;

use cudarc::driver::sys;

use crate::sleep::{Backend, SleepError};

fn check(call: &'static str, r: sys::CUresult) -> Result<(), SleepError> {
    if r == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let mut p: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string, or leaves it null.
    let named = unsafe { sys::cuGetErrorName(r, &mut p) } == sys::CUresult::CUDA_SUCCESS;
    let name = if named && !p.is_null() {
        // SAFETY: the driver returned a NUL-terminated static string.
        unsafe { std::ffi::CStr::from_ptr(p) }
            .to_string_lossy()
            .into_owned()
    } else {
        format!("CUresult {}", r as u32)
    };
    Err(SleepError::Backend {
        call,
        detail: format!("{name} ({})", r as u32),
    })
}

fn is_oom(r: sys::CUresult) -> bool {
    r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
}

/// Pinned (page-locked) host memory: page-aligned memory of the Rust allocator, registered
/// with the driver (`cuMemHostRegister`; on the H200 host this pins at about 195 ms/GiB,
/// `cuMemHostAlloc` at 360 to 420), unregistered in the context that registered it and
/// freed on drop.
pub struct PinnedHost {
    ptr: *mut u8,
    size: usize,
    ctx: sys::CUcontext,
}

const PAGE: usize = 4096;

// SAFETY: the buffer is plain memory owned by this value alone; the context is a
// process-wide handle the driver lets any thread make current.
unsafe impl Send for PinnedHost {}

impl PinnedHost {
    fn layout(size: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(size.max(1), PAGE).expect("a page-aligned layout")
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // SAFETY: pushes the (retained, still alive: `CudaVmm` releases its contexts only
        // when dropped, after its buffers) context that registered `ptr`, unregisters
        // it once, and pops.
        let unregistered = unsafe {
            sys::cuCtxPushCurrent_v2(self.ctx) == sys::CUresult::CUDA_SUCCESS && {
                let r = sys::cuMemHostUnregister(self.ptr.cast());
                let mut old: sys::CUcontext = std::ptr::null_mut();
                sys::cuCtxPopCurrent_v2(&mut old);
                r == sys::CUresult::CUDA_SUCCESS
            }
        };
        // Memory the driver still has pinned must not go back to the allocator (it would
        // be handed out, and registered again, while pinned): it is leaked instead.
        if unregistered {
            // SAFETY: allocated in `host_alloc` with this layout, no longer registered.
            unsafe { std::alloc::dealloc(self.ptr, Self::layout(self.size)) };
        }
    }
}

/// The CUDA driver as the sleep allocator's backend.
pub struct CudaVmm {
    /// Retained primary contexts, by device ordinal (released on drop).
    contexts: BTreeMap<i32, (sys::CUdevice, sys::CUcontext)>,
}

// SAFETY: contexts are process-wide handles the driver lets any thread make current.
unsafe impl Send for CudaVmm {}

/// Pops the pushed context when dropped.
struct Current;

impl Drop for Current {
    fn drop(&mut self) {
        let mut old: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context `enter` pushed on this thread.
        unsafe {
            sys::cuCtxPopCurrent_v2(&mut old);
        }
    }
}

impl CudaVmm {
    /// Loads and initializes the driver.
    pub fn new() -> Result<CudaVmm, SleepError> {
        super::driver::init().map_err(|e| SleepError::Backend {
            call: "cuInit",
            detail: e.to_string(),
        })?;
        Ok(CudaVmm {
            contexts: BTreeMap::new(),
        })
    }

    fn enter(&mut self, device: i32) -> Result<Current, SleepError> {
        let ctx = self.context(device)?;
        // SAFETY: `ctx` is a retained primary context; popped by `Current`'s drop.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        Ok(Current)
    }

    /// The device's primary context, retained on first use.
    fn context(&mut self, device: i32) -> Result<sys::CUcontext, SleepError> {
        let ctx = match self.contexts.get(&device) {
            Some(&(_, ctx)) => ctx,
            None => {
                let mut dev: sys::CUdevice = 0;
                // SAFETY: writes one device handle.
                check("cuDeviceGet", unsafe { sys::cuDeviceGet(&mut dev, device) })?;
                let mut ctx: sys::CUcontext = std::ptr::null_mut();
                // SAFETY: writes one context handle; released on drop.
                check("cuDevicePrimaryCtxRetain", unsafe {
                    sys::cuDevicePrimaryCtxRetain(&mut ctx, dev)
                })?;
                self.contexts.insert(device, (dev, ctx));
                ctx
            }
        };
        Ok(ctx)
    }

    /// The device's free and total memory (`cuMemGetInfo`).
    pub fn mem_info(&mut self, device: i32) -> Result<(u64, u64), SleepError> {
        let _c = self.enter(device)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: writes two sizes.
        check("cuMemGetInfo", unsafe {
            sys::cuMemGetInfo_v2(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
    }

    fn prop(device: i32) -> sys::CUmemAllocationProp {
        // Every field spelled out: the struct holds enums, so it is never made by zeroing.
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            win32HandleMetaData: std::ptr::null_mut(),
            allocFlags: sys::CUmemAllocationProp_st__bindgen_ty_1 {
                compressionType: 0,
                gpuDirectRDMACapable: 0,
                usage: 0,
                reserved: [0; 4],
            },
        }
    }
}

impl Drop for CudaVmm {
    fn drop(&mut self) {
        for &(dev, _) in self.contexts.values() {
            // SAFETY: releases the retain made in `enter`, once.
            unsafe {
                sys::cuDevicePrimaryCtxRelease_v2(dev);
            }
        }
    }
}

impl Backend for CudaVmm {
    type Handle = sys::CUmemGenericAllocationHandle;
    type Host = PinnedHost;

    fn granularity(&mut self, device: i32) -> Result<u64, SleepError> {
        let _c = self.enter(device)?;
        let prop = Self::prop(device);
        let mut g = 0usize;
        // SAFETY: `prop` is a valid property struct; writes one size.
        check("cuMemGetAllocationGranularity", unsafe {
            sys::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        })?;
        Ok(g as u64)
    }

    fn reserve(&mut self, size: u64, device: i32) -> Result<u64, SleepError> {
        let _c = self.enter(device)?;
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; no fixed address is asked for.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut va, size as usize, 0, 0, 0)
        })?;
        Ok(va)
    }

    fn unreserve(&mut self, va: u64, size: u64, device: i32) -> Result<(), SleepError> {
        let _c = self.enter(device)?;
        // SAFETY: `[va, va + size)` is a whole reservation of ours with nothing mapped.
        check("cuMemAddressFree", unsafe {
            sys::cuMemAddressFree(va, size as usize)
        })
    }

    fn create(&mut self, size: u64, device: i32) -> Result<Self::Handle, SleepError> {
        let _c = self.enter(device)?;
        let prop = Self::prop(device);
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is valid; writes one handle.
        let r = unsafe { sys::cuMemCreate(&mut h, size as usize, &prop, 0) };
        if is_oom(r) {
            return Err(SleepError::OutOfMemory { device, size });
        }
        check("cuMemCreate", r)?;
        Ok(h)
    }

    fn map(&mut self, va: u64, size: u64, h: &Self::Handle, device: i32) -> Result<(), SleepError> {
        let _c = self.enter(device)?;
        // SAFETY: `va` is our reservation of exactly `size` bytes, unmapped; `h` is live
        // physical memory of the same size.
        check("cuMemMap", unsafe {
            sys::cuMemMap(va, size as usize, 0, *h, 0)
        })?;
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: device,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range was just mapped; `desc` is one valid descriptor.
        let r = unsafe { sys::cuMemSetAccess(va, size as usize, &desc, 1) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: undoes the map above.
            unsafe {
                sys::cuMemUnmap(va, size as usize);
            }
            if is_oom(r) {
                return Err(SleepError::OutOfMemory { device, size });
            }
            check("cuMemSetAccess", r)?;
        }
        Ok(())
    }

    fn unmap(&mut self, va: u64, size: u64, device: i32) -> Result<(), SleepError> {
        let _c = self.enter(device)?;
        // SAFETY: `[va, va + size)` is one mapping of ours; the allocator synchronized the
        // device before, so no kernel is using it.
        check("cuMemUnmap", unsafe { sys::cuMemUnmap(va, size as usize) })
    }

    fn release(&mut self, h: Self::Handle, device: i32) -> Result<(), SleepError> {
        let _c = self.enter(device)?;
        // SAFETY: `h` is ours, released once; unmapped memory is freed at once, memory
        // still mapped (never here) when unmapped.
        check("cuMemRelease", unsafe { sys::cuMemRelease(h) })
    }

    fn host_alloc(&mut self, size: u64, device: i32) -> Result<PinnedHost, SleepError> {
        let ctx = self.context(device)?;
        let _c = self.enter(device)?;
        let layout = PinnedHost::layout(size as usize);
        // SAFETY: a non-zero, page-aligned layout.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return Err(SleepError::HostOutOfMemory { size });
        }
        // SAFETY: `[ptr, ptr + size)` is ours, page-aligned, and not registered yet.
        let r = unsafe {
            sys::cuMemHostRegister_v2(ptr.cast(), size as usize, sys::CU_MEMHOSTREGISTER_PORTABLE)
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            // SAFETY: allocated above with this layout, never registered.
            unsafe { std::alloc::dealloc(ptr, layout) };
            if is_oom(r) {
                return Err(SleepError::HostOutOfMemory { size });
            }
            check("cuMemHostRegister", r)?;
        }
        Ok(PinnedHost {
            ptr,
            size: size as usize,
            ctx,
        })
    }

    fn host_free(&mut self, host: PinnedHost) -> Result<(), SleepError> {
        drop(host);
        Ok(())
    }

    fn copy_out(
        &mut self,
        va: u64,
        host: &mut PinnedHost,
        size: u64,
        device: i32,
    ) -> Result<(), SleepError> {
        assert!(
            size as usize <= host.size,
            "host buffer smaller than the copy"
        );
        let _c = self.enter(device)?;
        // SAFETY: `va` is mapped for `size` bytes; `host` is pinned and holds at least
        // `size` bytes, and outlives the copy (the allocator synchronizes before using
        // or freeing it).
        check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(host.ptr.cast(), va, size as usize, std::ptr::null_mut())
        })
    }

    fn copy_in(
        &mut self,
        host: &PinnedHost,
        va: u64,
        size: u64,
        device: i32,
    ) -> Result<(), SleepError> {
        assert!(
            size as usize <= host.size,
            "host buffer smaller than the copy"
        );
        let _c = self.enter(device)?;
        // SAFETY: as in copy_out, the other way.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(va, host.ptr.cast(), size as usize, std::ptr::null_mut())
        })
    }

    fn fill(&mut self, va: u64, size: u64, byte: u8, device: i32) -> Result<(), SleepError> {
        let _c = self.enter(device)?;
        // SAFETY: `va` is mapped for `size` bytes, all ours.
        check("cuMemsetD8Async", unsafe {
            sys::cuMemsetD8Async(va, byte, size as usize, std::ptr::null_mut())
        })
    }

    fn synchronize(&mut self, device: i32) -> Result<(), SleepError> {
        let _c = self.enter(device)?;
        // SAFETY: no arguments.
        check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() })
    }
}
