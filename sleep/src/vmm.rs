//! The sleep allocator's [`Backend`] over the driver's virtual-memory calls
//! (`cuMemAddressReserve`, `cuMemCreate`, `cuMemMap`, `cuMemSetAccess`, `cuMemUnmap`,
//! `cuMemRelease`, `cuMemAddressFree`) and registered (pinned) host memory for the host
//! copies, all through the safe owners of `graphcheck_driver::vmm`. Each operation runs with
//! the device's primary context current (the one PyTorch's runtime uses), pushed and popped
//! around it.

use std::collections::BTreeMap;
use std::sync::Arc;

use graphcheck_driver::vmm::{Current, Physical, PinnedHost, PrimaryContext, Reservation};

use crate::{Backend, SleepError};

/// The CUDA driver as the sleep allocator's backend.
pub struct CudaVmm {
    /// Retained primary contexts, by device ordinal (released when the last holder, this
    /// or a host buffer registered in it, drops).
    contexts: BTreeMap<i32, Arc<PrimaryContext>>,
    /// Our reservations, by address: the allocator names them by address, the driver
    /// layer takes only reservations it handed out.
    reservations: BTreeMap<u64, Reservation>,
}

impl CudaVmm {
    /// Loads and initializes the driver.
    pub fn new() -> Result<CudaVmm, SleepError> {
        graphcheck_driver::init().map_err(|e| SleepError::Backend {
            call: "cuInit",
            detail: e.to_string(),
        })?;
        Ok(CudaVmm {
            contexts: BTreeMap::new(),
            reservations: BTreeMap::new(),
        })
    }

    /// Makes the device's primary context current until the guard drops, retaining it on
    /// first use.
    fn enter(&mut self, device: i32) -> Result<Current, SleepError> {
        let ctx = match self.contexts.get(&device) {
            Some(ctx) => ctx.clone(),
            None => {
                let ctx = PrimaryContext::retain(device)?;
                self.contexts.insert(device, ctx.clone());
                ctx
            }
        };
        Ok(ctx.enter()?)
    }

    fn reservation(&self, va: u64) -> Result<&Reservation, SleepError> {
        self.reservations
            .get(&va)
            .ok_or(SleepError::UnknownAddress(va))
    }

    /// The device's free and total memory (`cuMemGetInfo`).
    pub fn mem_info(&mut self, device: i32) -> Result<(u64, u64), SleepError> {
        Ok(self.enter(device)?.mem_info()?)
    }
}

impl Backend for CudaVmm {
    type Handle = Physical;
    type Host = PinnedHost;

    fn granularity(&mut self, device: i32) -> Result<u64, SleepError> {
        Ok(self.enter(device)?.granularity()?)
    }

    fn reserve(&mut self, size: u64, device: i32) -> Result<u64, SleepError> {
        let r = self.enter(device)?.reserve(size)?;
        let va = r.va();
        self.reservations.insert(va, r);
        Ok(va)
    }

    fn unreserve(&mut self, va: u64, _size: u64, device: i32) -> Result<(), SleepError> {
        let c = self.enter(device)?;
        let r = self
            .reservations
            .remove(&va)
            .ok_or(SleepError::UnknownAddress(va))?;
        Ok(c.free(r)?)
    }

    fn create(&mut self, size: u64, device: i32) -> Result<Physical, SleepError> {
        match self.enter(device)?.create(size) {
            Err(e) if e.is_out_of_memory() => Err(SleepError::OutOfMemory { device, size }),
            r => Ok(r?),
        }
    }

    fn map(&mut self, va: u64, size: u64, h: &Physical, device: i32) -> Result<(), SleepError> {
        let c = self.enter(device)?;
        let r = self.reservation(va)?;
        c.map(r, h)?;
        if let Err(e) = c.set_access(r) {
            let _ = c.unmap(r);
            if e.is_out_of_memory() {
                return Err(SleepError::OutOfMemory { device, size });
            }
            return Err(e.into());
        }
        Ok(())
    }

    fn unmap(&mut self, va: u64, _size: u64, device: i32) -> Result<(), SleepError> {
        let c = self.enter(device)?;
        // The allocator synchronized the device before, so no kernel is using the memory.
        Ok(c.unmap(self.reservation(va)?)?)
    }

    fn release(&mut self, h: Physical, device: i32) -> Result<(), SleepError> {
        Ok(self.enter(device)?.release(h)?)
    }

    fn host_alloc(&mut self, size: u64, device: i32) -> Result<PinnedHost, SleepError> {
        use graphcheck_driver::Error;
        match self.enter(device)?.register_host(size) {
            Ok(h) => Ok(h),
            Err(Error::HostOutOfMemory { size }) => Err(SleepError::HostOutOfMemory { size }),
            Err(Error::Call(e)) => Err(e.into()),
            Err(e) => Err(SleepError::Backend {
                call: "cuMemHostRegister",
                detail: e.to_string(),
            }),
        }
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
        let c = self.enter(device)?;
        // The copy is waited for by the allocator's next synchronization, before it uses
        // or frees the buffer.
        Ok(c.copy_out(self.reservation(va)?, host, size)?)
    }

    fn copy_in(
        &mut self,
        host: &PinnedHost,
        va: u64,
        size: u64,
        device: i32,
    ) -> Result<(), SleepError> {
        let c = self.enter(device)?;
        Ok(c.copy_in(host, self.reservation(va)?, size)?)
    }

    fn fill(&mut self, va: u64, size: u64, byte: u8, device: i32) -> Result<(), SleepError> {
        let c = self.enter(device)?;
        Ok(c.fill(self.reservation(va)?, byte, size)?)
    }

    fn synchronize(&mut self, device: i32) -> Result<(), SleepError> {
        Ok(self.enter(device)?.synchronize()?)
    }
}
