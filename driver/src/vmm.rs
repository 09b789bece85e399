//! The driver's virtual-memory calls, for the sleep allocator (`graphcheck-sleep`): device
//! primary contexts made current around each operation ([`PrimaryContext`], [`Current`]),
//! owned address reservations ([`Reservation`]), physical memory ([`Physical`]) and pinned
//! host buffers ([`PinnedHost`]), and the copies between them.
//!
//! Every operation on device memory takes a [`Reservation`], never a raw address: a
//! reservation (`cuMemAddressReserve`) is device address space no host memory lives in, so
//! copies and fills through it can write nothing a Rust value owns. Host buffers are never
//! lent to Rust code at all: only the driver reads and writes them, and a buffer with a copy
//! possibly still in flight waits for it before it is freed.

use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{result, sys};

use crate::raw;
use crate::{DriverError, Error};

/// A device's primary context (the one PyTorch's runtime uses), retained while this lives
/// and released when the last holder drops it.
#[derive(Debug)]
pub struct PrimaryContext {
    ordinal: i32,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Copies enqueued on this context's null stream, counted after each enqueue returns.
    enqueued: AtomicU64,
    /// How many of `enqueued` a finished `cuCtxSynchronize` has waited for.
    completed: AtomicU64,
}

// SAFETY: a primary context is a process-wide handle the driver lets any thread make
// current; the counters are atomics.
unsafe impl Send for PrimaryContext {}
// SAFETY: as above: every method takes `&self` and either calls the driver (which is
// thread-safe) or touches atomics.
unsafe impl Sync for PrimaryContext {}

impl PrimaryContext {
    /// Retains the primary context of device `ordinal` (`cuDevicePrimaryCtxRetain`). The
    /// driver must be initialized ([`crate::init`]).
    pub fn retain(ordinal: i32) -> Result<Arc<PrimaryContext>, DriverError> {
        let device =
            result::device::get(ordinal).map_err(|e| DriverError::from_cudarc("cuDeviceGet", e))?;
        // SAFETY: a device the driver just handed out; released once, by our drop.
        let ctx = unsafe { result::primary_ctx::retain(device) }
            .map_err(|e| DriverError::from_cudarc("cuDevicePrimaryCtxRetain", e))?;
        Ok(Arc::new(PrimaryContext {
            ordinal,
            device,
            ctx,
            enqueued: AtomicU64::new(0),
            completed: AtomicU64::new(0),
        }))
    }

    /// The device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// Makes the context current on this thread (`cuCtxPushCurrent`) until the guard drops.
    pub fn enter(self: &Arc<Self>) -> Result<Current, DriverError> {
        // SAFETY: a retained context (alive while `self` is); popped by `Current`'s drop on
        // this thread (`Current` is not `Send`).
        unsafe { raw::cuCtxPushCurrent_v2(self.ctx) }.check("cuCtxPushCurrent")?;
        Ok(Current {
            ctx: self.clone(),
            _thread: PhantomData,
        })
    }

    /// Waits for every copy enqueued so far on this context, as `cuCtxSynchronize` does,
    /// pushing the context around the call.
    fn synchronize_pushed(self: &Arc<Self>) -> Result<(), DriverError> {
        let current = self.enter()?;
        current.synchronize()
    }
}

impl Drop for PrimaryContext {
    fn drop(&mut self) {
        // SAFETY: releases the retain made in `retain`, once.
        let _ = unsafe { result::primary_ctx::release(self.device) };
    }
}

/// A primary context made current on this thread; popped when dropped. Device operations
/// happen through it, on its device, on the context's null stream.
#[derive(Debug)]
#[must_use = "the context is current only while the guard lives"]
pub struct Current {
    ctx: Arc<PrimaryContext>,
    /// The push is this thread's: the guard must drop on it.
    _thread: PhantomData<*const ()>,
}

impl Drop for Current {
    fn drop(&mut self) {
        let mut old: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: pops the context `enter` pushed on this thread.
        let _ = unsafe { raw::cuCtxPopCurrent_v2(&mut old) };
    }
}

/// Reserved virtual address space (`cuMemAddressReserve`), given back by [`Self::free`].
#[derive(Debug)]
pub struct Reservation {
    va: u64,
    size: u64,
}

/// Physical device memory (`cuMemCreate`), given back by [`Self::release`].
#[derive(Debug)]
pub struct Physical {
    handle: sys::CUmemGenericAllocationHandle,
}

impl Current {
    /// The device ordinal of the current context.
    pub fn ordinal(&self) -> i32 {
        self.ctx.ordinal
    }

    /// The device's free and total memory (`cuMemGetInfo`).
    pub fn mem_info(&self) -> Result<(u64, u64), DriverError> {
        let (free, total) =
            result::mem_get_info().map_err(|e| DriverError::from_cudarc("cuMemGetInfo", e))?;
        Ok((free as u64, total as u64))
    }

    /// Waits for all work of the context (`cuCtxSynchronize`): the caller's kernels and the
    /// copies below.
    pub fn synchronize(&self) -> Result<(), DriverError> {
        // Everything enqueued before this load is covered by the synchronization below.
        let ticket = self.ctx.enqueued.load(Ordering::SeqCst);
        result::ctx::synchronize().map_err(|e| DriverError::from_cudarc("cuCtxSynchronize", e))?;
        self.ctx.completed.fetch_max(ticket, Ordering::SeqCst);
        Ok(())
    }

    /// Pinned device memory on this device, as the allocator maps it. Every field spelled
    /// out: the struct holds enums, so it is never made by zeroing.
    fn prop(&self) -> sys::CUmemAllocationProp {
        sys::CUmemAllocationProp {
            type_: sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
            requestedHandleTypes: sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal(),
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

    /// The device's minimum allocation granularity for such memory, in bytes.
    pub fn granularity(&self) -> Result<u64, DriverError> {
        let prop = self.prop();
        let mut g = 0usize;
        // SAFETY: `prop` is a valid property struct; writes one size.
        unsafe {
            raw::cuMemGetAllocationGranularity(
                &mut g,
                &prop,
                sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
            )
        }
        .check("cuMemGetAllocationGranularity")?;
        Ok(g as u64)
    }

    /// Reserves `size` bytes of virtual address space (a multiple of the granularity).
    pub fn reserve(&self, size: u64) -> Result<Reservation, DriverError> {
        let mut va: sys::CUdeviceptr = 0;
        // SAFETY: writes one address; no fixed address is asked for.
        unsafe { raw::cuMemAddressReserve(&mut va, size as usize, 0, 0, 0) }
            .check("cuMemAddressReserve")?;
        Ok(Reservation { va, size })
    }

    /// Creates `size` bytes of physical memory on the device (a multiple of the
    /// granularity). Out of memory is [`DriverError::is_out_of_memory`].
    pub fn create(&self, size: u64) -> Result<Physical, DriverError> {
        let prop = self.prop();
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `prop` is valid; writes one handle, released by `Physical::release`.
        unsafe { raw::cuMemCreate(&mut handle, size as usize, &prop, 0) }.check("cuMemCreate")?;
        Ok(Physical { handle })
    }

    /// A pinned host buffer of `size` bytes: page-aligned memory of the Rust allocator,
    /// registered with the driver (`cuMemHostRegister`, portable to every context; on the
    /// H200 host this pins at about 195 ms/GiB, `cuMemHostAlloc` at 360 to 420).
    /// [`Error::HostOutOfMemory`] where the allocator or the driver has no memory left.
    pub fn register_host(&self, size: u64) -> Result<PinnedHost, Error> {
        let layout = PinnedHost::layout(size as usize);
        // SAFETY: a non-zero, page-aligned layout.
        let Some(ptr) = NonNull::new(unsafe { std::alloc::alloc(layout) }) else {
            return Err(Error::HostOutOfMemory { size });
        };
        // SAFETY: `[ptr, ptr + size)` is ours, page-aligned, and not registered yet.
        let status = unsafe {
            raw::cuMemHostRegister_v2(
                ptr.as_ptr().cast(),
                size as usize,
                sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        };
        if let Err(e) = status.check("cuMemHostRegister") {
            // SAFETY: allocated above with this layout, never registered.
            unsafe { std::alloc::dealloc(ptr.as_ptr(), layout) };
            return Err(if e.is_out_of_memory() {
                Error::HostOutOfMemory { size }
            } else {
                e.into()
            });
        }
        Ok(PinnedHost {
            ptr,
            size: size as usize,
            registered_in: self.ctx.clone(),
            pending: Mutex::new(None),
        })
    }

    /// Maps `physical` over the whole of `reservation` (`cuMemMap`; the memory is the
    /// reservation's size).
    pub fn map(&self, reservation: &Reservation, physical: &Physical) -> Result<(), DriverError> {
        // SAFETY: our reservation, of its whole size, and live physical memory; the driver
        // refuses a range already mapped or memory of the wrong size.
        unsafe {
            raw::cuMemMap(
                reservation.va,
                reservation.size as usize,
                0,
                physical.handle,
                0,
            )
        }
        .check("cuMemMap")
    }

    /// Makes the mapped `reservation` readable and writable from the device
    /// (`cuMemSetAccess`).
    pub fn set_access(&self, reservation: &Reservation) -> Result<(), DriverError> {
        let desc = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: self.ordinal(),
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: our reservation; `desc` is one valid descriptor.
        unsafe { raw::cuMemSetAccess(reservation.va, reservation.size as usize, &desc, 1) }
            .check("cuMemSetAccess")
    }

    /// Unmaps the whole of `reservation` (`cuMemUnmap`). The caller synchronizes first
    /// where kernels may still use the memory.
    pub fn unmap(&self, reservation: &Reservation) -> Result<(), DriverError> {
        // SAFETY: our reservation; device memory only (no Rust value lives there).
        unsafe { raw::cuMemUnmap(reservation.va, reservation.size as usize) }.check("cuMemUnmap")
    }

    /// Gives physical memory back (`cuMemRelease`): at once where unmapped, else when the
    /// last mapping goes.
    pub fn release(&self, physical: Physical) -> Result<(), DriverError> {
        // SAFETY: ours, released once (this consumes it).
        unsafe { raw::cuMemRelease(physical.handle) }.check("cuMemRelease")
    }

    /// Gives a reservation back (`cuMemAddressFree`); nothing may be mapped in it.
    pub fn free(&self, reservation: Reservation) -> Result<(), DriverError> {
        // SAFETY: ours, freed once (this consumes it); the driver refuses a mapped range.
        unsafe { raw::cuMemAddressFree(reservation.va, reservation.size as usize) }
            .check("cuMemAddressFree")
    }

    /// Starts copying the first `size` bytes of `from` into `to` on the null stream; done
    /// after [`Self::synchronize`].
    ///
    /// # Panics
    /// Where `size` exceeds either end (a bug of the caller).
    pub fn copy_out(
        &self,
        from: &Reservation,
        to: &mut PinnedHost,
        size: u64,
    ) -> Result<(), DriverError> {
        let n = Self::bounded(size, from, to);
        // SAFETY: the buffer is ours alone (`&mut`), `n` bytes long, and no Rust code ever
        // reads it; it is not freed before the copy is waited for (`PinnedHost`'s drop).
        let dst = unsafe { std::slice::from_raw_parts_mut(to.ptr.as_ptr(), n) };
        // SAFETY: device memory of our reservation (the driver refuses it unmapped), into
        // the pinned buffer above, on the current context's null stream.
        let r = unsafe { result::memcpy_dtoh_async(dst, from.va, std::ptr::null_mut()) }
            .map_err(|e| DriverError::from_cudarc("cuMemcpyDtoHAsync", e));
        self.enqueued(to);
        r
    }

    /// Starts copying the first `size` bytes of `from` to `to` on the null stream; done after
    /// [`Self::synchronize`].
    ///
    /// # Panics
    /// Where `size` exceeds either end (a bug of the caller).
    pub fn copy_in(
        &self,
        from: &PinnedHost,
        to: &Reservation,
        size: u64,
    ) -> Result<(), DriverError> {
        let n = Self::bounded(size, to, from);
        // SAFETY: `n` bytes of the buffer, which no Rust code writes (it is only ever lent
        // to the driver) and which is not freed before the copy is waited for.
        let src = unsafe { std::slice::from_raw_parts(from.ptr.as_ptr().cast_const(), n) };
        // SAFETY: from the pinned buffer above into device memory of our reservation, on
        // the current context's null stream.
        let r = unsafe { result::memcpy_htod_async(to.va, src, std::ptr::null_mut()) }
            .map_err(|e| DriverError::from_cudarc("cuMemcpyHtoDAsync", e));
        self.enqueued(from);
        r
    }

    /// Starts filling the first `size` bytes of `reservation` with `byte` on the null
    /// stream; done after [`Self::synchronize`].
    pub fn fill(&self, reservation: &Reservation, byte: u8, size: u64) -> Result<(), DriverError> {
        let n = size.min(reservation.size) as usize;
        // SAFETY: device memory of our reservation; no Rust value lives there.
        unsafe { result::memset_d8_async(reservation.va, byte, n, std::ptr::null_mut()) }
            .map_err(|e| DriverError::from_cudarc("cuMemsetD8Async", e))
    }

    fn bounded(size: u64, device: &Reservation, host: &PinnedHost) -> usize {
        assert!(
            size <= device.size && size as usize <= host.size,
            "a copy of {size} bytes between a {}-byte reservation and a {}-byte host buffer",
            device.size,
            host.size
        );
        size as usize
    }

    /// Notes that a copy touching `host` may be in flight on this context until its next
    /// synchronization. Counted after the enqueue returned, so that a synchronization that
    /// sees the count began after the copy was enqueued.
    fn enqueued(&self, host: &PinnedHost) {
        let ticket = self.ctx.enqueued.fetch_add(1, Ordering::SeqCst) + 1;
        *host.pending.lock().unwrap_or_else(PoisonError::into_inner) =
            Some((self.ctx.clone(), ticket));
    }
}

impl Reservation {
    /// The first address.
    pub fn va(&self) -> u64 {
        self.va
    }

    /// The bytes reserved.
    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Pinned (page-locked) host memory for copies of device memory: page-aligned memory of the
/// Rust allocator, registered with the driver, unregistered in the context that registered
/// it and freed on drop. Its bytes are only ever read and written by the driver's copies.
#[derive(Debug)]
pub struct PinnedHost {
    ptr: NonNull<u8>,
    size: usize,
    registered_in: Arc<PrimaryContext>,
    /// The context and count of the last copy that used the buffer, until freeing it has
    /// made sure that copy is done.
    pending: Mutex<Option<(Arc<PrimaryContext>, u64)>>,
}

const PAGE: usize = 4096;

// SAFETY: the buffer is plain memory owned by this value alone (Rust never reads or writes
// it); the contexts are `Send + Sync`.
unsafe impl Send for PinnedHost {}
// SAFETY: `&PinnedHost` gives no access to the bytes; `pending` is behind a mutex.
unsafe impl Sync for PinnedHost {}

impl PinnedHost {
    fn layout(size: usize) -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(size.max(1), PAGE).expect("a page-aligned layout")
    }

    /// The buffer's size in bytes.
    pub fn size(&self) -> u64 {
        self.size as u64
    }
}

impl Drop for PinnedHost {
    fn drop(&mut self) {
        // A copy enqueued since the last synchronization of its context may still be
        // reading or writing the buffer: wait for it. (The sleep allocator synchronizes
        // before it frees a buffer, so this does nothing there.)
        let pending = self
            .pending
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some((ctx, ticket)) = pending
            && ctx.completed.load(Ordering::SeqCst) < ticket
            && ctx.synchronize_pushed().is_err()
        {
            // Memory a copy may still be using must not go back to the allocator.
            return;
        }
        let unregistered = self.registered_in.enter().is_ok_and(|_current| {
            // SAFETY: registered by `register_host` in this context, unregistered once.
            unsafe { raw::cuMemHostUnregister(self.ptr.as_ptr().cast()) }.is_success()
        });
        // Memory the driver still has pinned must not go back to the allocator (it would
        // be handed out, and registered again, while pinned): it is leaked instead.
        if unregistered {
            // SAFETY: allocated in `register_host` with this layout, no longer registered,
            // no copy in flight.
            unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.size)) };
        }
    }
}
