//! The sleep allocator's bookkeeping: tagged allocations of virtual memory whose physical
//! backing is released at `sleep` and mapped again at the same virtual address on `wake`,
//! with a host copy restored (offloaded tags at level 1) or a poison filled in (everything
//! else). The memory operations come from a [`Backend`]: the CUDA driver's virtual-memory
//! calls (`cuda::vmm`, feature `cuda`), or a host-memory double in the tests, so that the
//! state machine — errors, rollback, no leaks — is tested without a GPU.
//!
//! Semantics, side by side with vLLM's `CuMemAllocator` (`vllm/device_allocator/cumem.py`),
//! are in `docs/sleep.md`.

use std::collections::{BTreeMap, BTreeSet};

/// Why a sleep-allocator operation failed. Every error leaves the allocator in a
/// consistent state: what an operation had done before it failed is undone.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum SleepError {
    #[error("already asleep (level {level}): wake before sleeping again")]
    AlreadyAsleep { level: u8 },
    #[error("not asleep: wake needs a sleep first")]
    NotAsleep,
    #[error("the sleep level is 1 or 2, not {0}")]
    BadLevel(u8),
    #[error(
        "sleep level 2 discards every tag; offload_tags must be empty (got {tags:?}); use level 1 to keep host copies"
    )]
    OffloadAtLevel2 { tags: Vec<String> },
    #[error("unknown tag {tag:?}: the allocator has seen {known:?}")]
    UnknownTag { tag: String, known: Vec<String> },
    #[error("no allocation of this allocator starts at {0:#x}")]
    UnknownAddress(u64),
    #[error("asleep: {what} needs the allocator awake (wake first)")]
    Asleep { what: &'static str },
    #[error(
        "out of device memory on device {device}: {needed} bytes could not be mapped ({mapped} of {total} bytes were, and have been released again); the allocator is still asleep"
    )]
    WakeOutOfMemory {
        device: i32,
        needed: u64,
        mapped: u64,
        total: u64,
    },
    #[error("out of device memory: {size} bytes on device {device}")]
    OutOfMemory { device: i32, size: u64 },
    #[error("out of pinned host memory: {size} bytes for the host copy")]
    HostOutOfMemory { size: u64 },
    #[error("{call} failed: {detail}")]
    Backend { call: &'static str, detail: String },
}

/// The memory operations the allocator needs. All sizes are multiples of the device's
/// granularity (as [`Backend::granularity`] gives it), all addresses reserved by
/// [`Backend::reserve`].
pub trait Backend {
    /// Physical device memory (`CUmemGenericAllocationHandle`).
    type Handle;
    /// A host buffer for a copy of one allocation (pinned host memory).
    type Host;

    /// The allocation granularity of `device`, in bytes.
    fn granularity(&mut self, device: i32) -> Result<u64, SleepError>;
    /// Reserves `size` bytes of virtual address space (for `device`).
    ///
    /// Every call names the device whose memory it concerns, so that a backend can make
    /// that device's context current around it.
    fn reserve(&mut self, size: u64, device: i32) -> Result<u64, SleepError>;
    /// Gives a reservation back.
    fn unreserve(&mut self, va: u64, size: u64, device: i32) -> Result<(), SleepError>;
    /// Creates `size` bytes of physical memory on `device`; [`SleepError::OutOfMemory`]
    /// where the device has none left.
    fn create(&mut self, size: u64, device: i32) -> Result<Self::Handle, SleepError>;
    /// Maps `handle` at `va` and makes it readable and writable from `device`.
    fn map(
        &mut self,
        va: u64,
        size: u64,
        handle: &Self::Handle,
        device: i32,
    ) -> Result<(), SleepError>;
    /// Unmaps `[va, va + size)`.
    fn unmap(&mut self, va: u64, size: u64, device: i32) -> Result<(), SleepError>;
    /// Releases physical memory (after unmapping it).
    fn release(&mut self, handle: Self::Handle, device: i32) -> Result<(), SleepError>;
    /// A host buffer of `size` bytes, for copies of `device`'s memory.
    fn host_alloc(&mut self, size: u64, device: i32) -> Result<Self::Host, SleepError>;
    fn host_free(&mut self, host: Self::Host) -> Result<(), SleepError>;
    /// Starts copying `[va, va + size)` into `host`; done after [`Backend::synchronize`].
    fn copy_out(
        &mut self,
        va: u64,
        host: &mut Self::Host,
        size: u64,
        device: i32,
    ) -> Result<(), SleepError>;
    /// Starts copying `host` to `[va, va + size)`; done after [`Backend::synchronize`].
    fn copy_in(
        &mut self,
        host: &Self::Host,
        va: u64,
        size: u64,
        device: i32,
    ) -> Result<(), SleepError>;
    /// Starts filling `[va, va + size)` with `byte`; done after [`Backend::synchronize`].
    fn fill(&mut self, va: u64, size: u64, byte: u8, device: i32) -> Result<(), SleepError>;
    /// Waits for all work on `device` (the caller's kernels, and the copies above).
    fn synchronize(&mut self, device: i32) -> Result<(), SleepError>;
}

/// What discarded memory holds after `wake`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Poison {
    /// Whatever the new physical memory holds (vLLM's behaviour: undefined).
    None,
    /// Every byte set to this value. `0xFF` is NaN in every floating-point dtype torch has
    /// (f64, f32, f16, bf16, fp8 e4m3 and e5m2) and -1 in every signed integer.
    Byte(u8),
}

impl Poison {
    /// The NaN pattern (`0xFF` bytes).
    pub const NAN: Poison = Poison::Byte(0xFF);
    /// Zeros.
    pub const ZEROS: Poison = Poison::Byte(0);

    /// Parses `nan`, `zeros`, `none`, or a byte (`0`..`255`, decimal or `0x` hex).
    pub fn parse(s: &str) -> Result<Poison, String> {
        match s {
            "nan" => Ok(Poison::NAN),
            "zeros" => Ok(Poison::ZEROS),
            "none" => Ok(Poison::None),
            _ => {
                let v = match s.strip_prefix("0x") {
                    Some(h) => u8::from_str_radix(h, 16),
                    None => s.parse::<u8>(),
                };
                v.map(Poison::Byte).map_err(|_| {
                    format!("poison is `nan`, `zeros`, `none` or a byte 0..=255, not {s:?}")
                })
            }
        }
    }
}

/// Where one allocation's contents are.
enum State<H, X> {
    /// Mapped to this physical memory.
    Mapped(H),
    /// Unmapped; a host copy waits for `wake`.
    Offloaded(X),
    /// Unmapped; the contents are gone.
    Discarded,
}

struct Alloc<H, X> {
    size: u64,
    requested: u64,
    device: i32,
    tag: String,
    state: State<H, X>,
}

/// One allocation, as [`SleepAllocator::allocations`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocationInfo {
    pub base: u64,
    /// The mapped size: the request rounded up to the granularity.
    pub size: u64,
    /// The size the caller asked for.
    pub requested: u64,
    pub device: i32,
    pub tag: String,
    /// `mapped`, `offloaded` or `discarded`.
    pub state: &'static str,
}

/// Counters since the allocator was made.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub mallocs: u64,
    pub frees: u64,
    /// Allocations freed while asleep (their reservation and host copy went at once).
    pub freed_while_asleep: u64,
    /// Live allocations and their mapped sizes.
    pub allocations: u64,
    pub bytes_reserved: u64,
    pub bytes_mapped: u64,
    /// Pinned host bytes: held by host copies, and cached for the next sleep.
    pub host_bytes_held: u64,
    pub host_bytes_cached: u64,
    pub sleeps: u64,
    pub wakes: u64,
}

/// What one `sleep` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SleepReport {
    pub level: u8,
    pub offloaded_bytes: u64,
    pub discarded_bytes: u64,
}

/// What one `wake` did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WakeReport {
    pub restored_bytes: u64,
    pub poisoned_bytes: u64,
    /// Whether every allocation is mapped again (the allocator is awake).
    pub awake: bool,
}

#[derive(Clone, Debug)]
struct Asleep {
    level: u8,
}

/// The allocator: every allocation, its tag and its state; the sleep state.
pub struct SleepAllocator<B: Backend> {
    allocs: BTreeMap<u64, Alloc<B::Handle, B::Host>>,
    tags: BTreeSet<String>,
    asleep: Option<Asleep>,
    /// Pinned host buffers by size, kept from one wake for the next sleep (pinning host
    /// memory costs more than copying into it).
    host_cache: BTreeMap<u64, Vec<B::Host>>,
    granularity: BTreeMap<i32, u64>,
    stats: Stats,
    /// Last, so that it is dropped last: host buffers may need its contexts.
    backend: B,
}

impl<B: Backend> SleepAllocator<B> {
    pub fn new(backend: B) -> Self {
        SleepAllocator {
            backend,
            allocs: BTreeMap::new(),
            tags: BTreeSet::new(),
            asleep: None,
            host_cache: BTreeMap::new(),
            granularity: BTreeMap::new(),
            stats: Stats::default(),
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    /// The backend, for queries of its own (`CudaVmm::mem_info`).
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// The sleep level, where asleep.
    pub fn asleep(&self) -> Option<u8> {
        self.asleep.as_ref().map(|a| a.level)
    }

    /// Every tag an allocation was ever made under, sorted.
    pub fn tags(&self) -> Vec<String> {
        self.tags.iter().cloned().collect()
    }

    pub fn stats(&self) -> Stats {
        self.stats.clone()
    }

    /// Every live allocation, by address.
    pub fn allocations(&self) -> Vec<AllocationInfo> {
        self.allocs
            .iter()
            .map(|(&base, a)| AllocationInfo {
                base,
                size: a.size,
                requested: a.requested,
                device: a.device,
                tag: a.tag.clone(),
                state: match a.state {
                    State::Mapped(_) => "mapped",
                    State::Offloaded(_) => "offloaded",
                    State::Discarded => "discarded",
                },
            })
            .collect()
    }

    fn granularity(&mut self, device: i32) -> Result<u64, SleepError> {
        if let Some(&g) = self.granularity.get(&device) {
            return Ok(g);
        }
        let g = self.backend.granularity(device)?.max(1);
        self.granularity.insert(device, g);
        Ok(g)
    }

    /// Allocates `size` bytes on `device` under `tag`: reserved, backed and mapped. Allowed
    /// while asleep (the new allocation is mapped and stays so).
    pub fn malloc(&mut self, size: u64, device: i32, tag: &str) -> Result<u64, SleepError> {
        let g = self.granularity(device)?;
        let rounded = size.max(1).div_ceil(g).saturating_mul(g);
        let va = self.backend.reserve(rounded, device)?;
        let handle = match self.backend.create(rounded, device) {
            Ok(h) => h,
            Err(e) => {
                let _ = self.backend.unreserve(va, rounded, device);
                return Err(e);
            }
        };
        if let Err(e) = self.backend.map(va, rounded, &handle, device) {
            let _ = self.backend.release(handle, device);
            let _ = self.backend.unreserve(va, rounded, device);
            return Err(e);
        }
        self.allocs.insert(
            va,
            Alloc {
                size: rounded,
                requested: size,
                device,
                tag: tag.to_owned(),
                state: State::Mapped(handle),
            },
        );
        self.tags.insert(tag.to_owned());
        self.stats.mallocs += 1;
        self.stats.allocations += 1;
        self.stats.bytes_reserved += rounded;
        self.stats.bytes_mapped += rounded;
        Ok(va)
    }

    /// Frees the allocation at `va`. While asleep an offloaded or discarded allocation
    /// just gives back its reservation and host copy (counted in `freed_while_asleep`).
    pub fn free(&mut self, va: u64) -> Result<(), SleepError> {
        let Some(a) = self.allocs.remove(&va) else {
            return Err(SleepError::UnknownAddress(va));
        };
        self.stats.frees += 1;
        self.stats.allocations -= 1;
        self.stats.bytes_reserved -= a.size;
        let mut first_err = None;
        match a.state {
            State::Mapped(h) => {
                self.stats.bytes_mapped -= a.size;
                // The caller's kernels may still use the memory: torch frees a segment
                // only once its blocks are free, and vLLM's allocator synchronizes too.
                if let Err(e) = self.backend.synchronize(a.device) {
                    first_err.get_or_insert(e);
                }
                if let Err(e) = self.backend.unmap(va, a.size, a.device) {
                    first_err.get_or_insert(e);
                }
                if let Err(e) = self.backend.release(h, a.device) {
                    first_err.get_or_insert(e);
                }
            }
            State::Offloaded(x) => {
                self.stats.freed_while_asleep += 1;
                self.stats.host_bytes_held -= a.size;
                self.cache_host(a.size, x);
            }
            State::Discarded => self.stats.freed_while_asleep += 1,
        }
        if let Err(e) = self.backend.unreserve(va, a.size, a.device) {
            first_err.get_or_insert(e);
        }
        first_err.map_or(Ok(()), Err)
    }

    fn cache_host(&mut self, size: u64, host: B::Host) {
        self.stats.host_bytes_cached += size;
        self.host_cache.entry(size).or_default().push(host);
    }

    fn take_host(&mut self, size: u64, device: i32) -> Result<B::Host, SleepError> {
        if let Some(v) = self.host_cache.get_mut(&size)
            && let Some(h) = v.pop()
        {
            self.stats.host_bytes_cached -= size;
            return Ok(h);
        }
        self.backend.host_alloc(size, device)
    }

    /// Frees the cached host buffers beyond what the live allocations could use: per
    /// size, at most as many as there are mapped allocations of that size.
    fn trim_host_cache(&mut self) -> Result<(), SleepError> {
        let mut wanted: BTreeMap<u64, usize> = BTreeMap::new();
        for a in self.allocs.values() {
            if matches!(a.state, State::Mapped(_)) {
                *wanted.entry(a.size).or_default() += 1;
            }
        }
        let mut first_err = None;
        for (size, hosts) in self.host_cache.iter_mut() {
            let keep = wanted.get(size).copied().unwrap_or(0);
            while hosts.len() > keep {
                let h = hosts.pop().expect("longer than keep");
                self.stats.host_bytes_cached -= size;
                if let Err(e) = self.backend.host_free(h) {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.host_cache.retain(|_, hosts| !hosts.is_empty());
        first_err.map_or(Ok(()), Err)
    }

    /// Frees the cached pinned host buffers.
    pub fn release_host_cache(&mut self) -> Result<u64, SleepError> {
        let mut freed = 0;
        let mut first_err = None;
        for (size, hosts) in std::mem::take(&mut self.host_cache) {
            for h in hosts {
                freed += size;
                if let Err(e) = self.backend.host_free(h) {
                    first_err.get_or_insert(e);
                }
            }
        }
        self.stats.host_bytes_cached = 0;
        first_err.map_or(Ok(freed), Err)
    }

    fn devices(&self) -> BTreeSet<i32> {
        self.allocs.values().map(|a| a.device).collect()
    }

    fn check_tags<'t>(&self, tags: impl IntoIterator<Item = &'t String>) -> Result<(), SleepError> {
        for t in tags {
            if !self.tags.contains(t) {
                return Err(SleepError::UnknownTag {
                    tag: t.clone(),
                    known: self.tags(),
                });
            }
        }
        Ok(())
    }

    /// Puts every allocation to sleep. Level 1 copies the allocations of `offload_tags`
    /// to pinned host memory first; everything else is discarded. Level 2 discards
    /// everything. All physical memory goes back to the driver; the addresses stay
    /// reserved. On error nothing is released (host copies made so far are dropped).
    pub fn sleep(&mut self, level: u8, offload_tags: &[String]) -> Result<SleepReport, SleepError> {
        if let Some(a) = &self.asleep {
            return Err(SleepError::AlreadyAsleep { level: a.level });
        }
        match level {
            1 => {}
            2 if offload_tags.is_empty() => {}
            2 => {
                return Err(SleepError::OffloadAtLevel2 {
                    tags: offload_tags.to_vec(),
                });
            }
            l => return Err(SleepError::BadLevel(l)),
        }
        self.check_tags(offload_tags)?;
        let offload: BTreeSet<&str> = offload_tags.iter().map(String::as_str).collect();
        let devices = self.devices();
        for &d in &devices {
            self.backend.synchronize(d)?;
        }

        // Phase 1: host copies, undone on any failure.
        let targets: Vec<(u64, u64, i32)> = self
            .allocs
            .iter()
            .filter(|(_, a)| {
                matches!(a.state, State::Mapped(_)) && offload.contains(a.tag.as_str())
            })
            .map(|(&va, a)| (va, a.size, a.device))
            .collect();
        let mut copies: Vec<(u64, B::Host)> = Vec::with_capacity(targets.len());
        let mut failed = None;
        for &(va, size, device) in &targets {
            let mut host = match self.take_host(size, device) {
                Ok(h) => h,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            if let Err(e) = self.backend.copy_out(va, &mut host, size, device) {
                self.cache_host(size, host);
                failed = Some(e);
                break;
            }
            copies.push((va, host));
        }
        if failed.is_none() {
            for &d in &devices {
                if let Err(e) = self.backend.synchronize(d) {
                    failed = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = failed {
            // Copies already started may still be writing their buffers: wait for them
            // (best effort) before the buffers can be reused or freed.
            for &d in &devices {
                let _ = self.backend.synchronize(d);
            }
            for (va, host) in copies {
                let size = self.allocs[&va].size;
                self.cache_host(size, host);
            }
            return Err(e);
        }
        // Buffers no allocation could use any more (sizes change with reloads) go back,
        // rather than let pinned memory grow.
        let _ = self.trim_host_cache();

        // Phase 2: release the physical memory. A failure here is the driver's; the
        // allocations released so far are recorded as such, so wake can bring them back.
        let mut copies: BTreeMap<u64, B::Host> = copies.into_iter().collect();
        let mut report = SleepReport {
            level,
            ..SleepReport::default()
        };
        let mut first_err = None;
        let vas: Vec<u64> = self.allocs.keys().copied().collect();
        for va in vas {
            let a = self.allocs.get_mut(&va).expect("key from the map");
            if !matches!(a.state, State::Mapped(_)) {
                continue;
            }
            if let Err(e) = self.backend.unmap(va, a.size, a.device) {
                first_err.get_or_insert(e);
                continue;
            }
            let State::Mapped(h) = std::mem::replace(&mut a.state, State::Discarded) else {
                unreachable!("matched Mapped above")
            };
            let size = a.size;
            if let Some(host) = copies.remove(&va) {
                a.state = State::Offloaded(host);
                report.offloaded_bytes += size;
                self.stats.host_bytes_held += size;
            } else {
                report.discarded_bytes += size;
            }
            self.stats.bytes_mapped -= size;
            if let Err(e) = self.backend.release(h, a.device) {
                first_err.get_or_insert(e);
            }
        }
        for (va, host) in copies {
            // Only where unmapping failed: the allocation stays mapped and intact.
            let size = self.allocs[&va].size;
            self.cache_host(size, host);
        }
        self.asleep = Some(Asleep { level });
        self.stats.sleeps += 1;
        first_err.map_or(Ok(report), Err)
    }

    /// Maps new physical memory at the same addresses for the allocations of `tags`
    /// (every tag where `None`), restores host copies and fills the rest with `poison`.
    /// Any failure (running out of device memory, a failed copy) releases what this call
    /// mapped and leaves the allocator asleep, as before the call, host copies intact.
    pub fn wake(
        &mut self,
        tags: Option<&[String]>,
        poison: Poison,
    ) -> Result<WakeReport, SleepError> {
        if self.asleep.is_none() {
            return Err(SleepError::NotAsleep);
        }
        if let Some(tags) = tags {
            self.check_tags(tags)?;
        }
        let wanted = |tag: &str| tags.is_none_or(|t| t.iter().any(|x| x == tag));
        let targets: Vec<(u64, u64, i32)> = self
            .allocs
            .iter()
            .filter(|(_, a)| !matches!(a.state, State::Mapped(_)) && wanted(&a.tag))
            .map(|(&va, a)| (va, a.size, a.device))
            .collect();
        let total: u64 = targets.iter().map(|t| t.1).sum();

        // Phase 1: back and map every target, undone on any failure.
        let mut mapped: Vec<(u64, u64, i32, B::Handle)> = Vec::with_capacity(targets.len());
        let mut failed = None;
        for &(va, size, device) in &targets {
            let h = match self.backend.create(size, device) {
                Ok(h) => h,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            if let Err(e) = self.backend.map(va, size, &h, device) {
                let _ = self.backend.release(h, device);
                failed = Some(e);
                break;
            }
            mapped.push((va, size, device, h));
        }
        if let Some(e) = failed {
            let done: u64 = mapped.iter().map(|m| m.1).sum();
            self.unmap_all(mapped);
            return Err(match e {
                SleepError::OutOfMemory { device, size } => SleepError::WakeOutOfMemory {
                    device,
                    needed: size,
                    mapped: done,
                    total,
                },
                e => e,
            });
        }

        // Phase 2: contents. A failed copy or fill undoes the whole wake (the host copies
        // are still there); host copies are freed only once every copy is done.
        let mut report = WakeReport::default();
        let mut failed = None;
        for (va, size, device, _) in &mapped {
            let r = match &self.allocs[va].state {
                State::Offloaded(host) => {
                    report.restored_bytes += size;
                    self.backend.copy_in(host, *va, *size, *device)
                }
                State::Discarded => match poison {
                    Poison::Byte(b) => {
                        report.poisoned_bytes += size;
                        self.backend.fill(*va, *size, b, *device)
                    }
                    Poison::None => Ok(()),
                },
                State::Mapped(_) => unreachable!("targets are unmapped"),
            };
            if let Err(e) = r {
                failed = Some(e);
                break;
            }
        }
        for d in self.devices() {
            if let Err(e) = self.backend.synchronize(d) {
                failed.get_or_insert(e);
            }
        }
        if let Some(e) = failed {
            self.unmap_all(mapped);
            return Err(e);
        }
        for (va, size, _, h) in mapped {
            let a = self.allocs.get_mut(&va).expect("target from the map");
            if let State::Offloaded(host) = std::mem::replace(&mut a.state, State::Mapped(h)) {
                self.stats.host_bytes_held -= size;
                self.cache_host(size, host);
            }
            self.stats.bytes_mapped += size;
        }
        report.awake = self
            .allocs
            .values()
            .all(|a| matches!(a.state, State::Mapped(_)));
        if report.awake {
            self.asleep = None;
        }
        self.stats.wakes += 1;
        Ok(report)
    }

    /// Undoes the mappings a failed `wake` made: the allocations stay as they were.
    fn unmap_all(&mut self, mapped: Vec<(u64, u64, i32, B::Handle)>) {
        for (va, size, device, h) in mapped {
            let _ = self.backend.unmap(va, size, device);
            let _ = self.backend.release(h, device);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Host memory standing in for the device: a reservation is a range, physical memory
    /// a byte vector, a mapping binds one to the other. Counts what is live, so tests see
    /// leaks, and runs out of device memory on demand.
    #[derive(Default)]
    struct Mem {
        next_va: u64,
        next_handle: u64,
        reserved: BTreeMap<u64, u64>,
        physical: BTreeMap<u64, Vec<u8>>,
        mapped: BTreeMap<u64, u64>,
        hosts_live: u64,
        /// Device bytes left; creating more is out of memory.
        capacity: u64,
        syncs: u64,
        /// Host buffers that may still be made; `None`: no limit.
        hosts_left: Option<u64>,
        /// Whether copies back to the device fail.
        fail_copy_in: bool,
    }

    const G: u64 = 1 << 16;

    impl Mem {
        fn new(capacity: u64) -> Self {
            Mem {
                next_va: 1 << 40,
                capacity,
                ..Mem::default()
            }
        }
        fn used(&self) -> u64 {
            self.physical.values().map(|p| p.len() as u64).sum()
        }
        fn bytes(&mut self, va: u64) -> &mut Vec<u8> {
            let h = self.mapped[&va];
            self.physical.get_mut(&h).unwrap()
        }
    }

    impl Backend for Mem {
        type Handle = u64;
        type Host = Vec<u8>;
        fn granularity(&mut self, _: i32) -> Result<u64, SleepError> {
            Ok(G)
        }
        fn reserve(&mut self, size: u64, _: i32) -> Result<u64, SleepError> {
            let va = self.next_va;
            self.next_va += size + G;
            self.reserved.insert(va, size);
            Ok(va)
        }
        fn unreserve(&mut self, va: u64, size: u64, _: i32) -> Result<(), SleepError> {
            assert!(!self.mapped.contains_key(&va), "unreserving a mapped range");
            assert_eq!(self.reserved.remove(&va), Some(size));
            Ok(())
        }
        fn create(&mut self, size: u64, device: i32) -> Result<u64, SleepError> {
            if self.used() + size > self.capacity {
                return Err(SleepError::OutOfMemory { device, size });
            }
            self.next_handle += 1;
            // New physical memory holds garbage, as the driver's may.
            self.physical
                .insert(self.next_handle, vec![0xA5; size as usize]);
            Ok(self.next_handle)
        }
        fn map(&mut self, va: u64, size: u64, h: &u64, _: i32) -> Result<(), SleepError> {
            assert_eq!(self.reserved.get(&va), Some(&size));
            assert!(self.mapped.insert(va, *h).is_none(), "double map");
            Ok(())
        }
        fn unmap(&mut self, va: u64, _: u64, _: i32) -> Result<(), SleepError> {
            self.mapped
                .remove(&va)
                .expect("unmapping an unmapped range");
            Ok(())
        }
        fn release(&mut self, h: u64, _: i32) -> Result<(), SleepError> {
            assert!(
                !self.mapped.values().any(|&m| m == h),
                "releasing mapped memory"
            );
            self.physical.remove(&h).expect("double release");
            Ok(())
        }
        fn host_alloc(&mut self, size: u64, _: i32) -> Result<Vec<u8>, SleepError> {
            if let Some(left) = &mut self.hosts_left {
                if *left == 0 {
                    return Err(SleepError::HostOutOfMemory { size });
                }
                *left -= 1;
            }
            self.hosts_live += 1;
            Ok(vec![0; size as usize])
        }
        fn host_free(&mut self, _: Vec<u8>) -> Result<(), SleepError> {
            self.hosts_live -= 1;
            Ok(())
        }
        fn copy_out(
            &mut self,
            va: u64,
            host: &mut Vec<u8>,
            _: u64,
            _: i32,
        ) -> Result<(), SleepError> {
            host.copy_from_slice(self.bytes(va));
            Ok(())
        }
        fn copy_in(&mut self, host: &Vec<u8>, va: u64, _: u64, _: i32) -> Result<(), SleepError> {
            if self.fail_copy_in {
                return Err(SleepError::Backend {
                    call: "cuMemcpyHtoDAsync",
                    detail: "injected".into(),
                });
            }
            self.bytes(va).copy_from_slice(host);
            Ok(())
        }
        fn fill(&mut self, va: u64, _: u64, byte: u8, _: i32) -> Result<(), SleepError> {
            self.bytes(va).fill(byte);
            Ok(())
        }
        fn synchronize(&mut self, _: i32) -> Result<(), SleepError> {
            self.syncs += 1;
            Ok(())
        }
    }

    fn tags(t: &[&str]) -> Vec<String> {
        t.iter().map(|s| s.to_string()).collect()
    }

    /// A weights allocation holding 1s and a kv_cache allocation holding 2s.
    fn two_tags() -> (SleepAllocator<Mem>, u64, u64) {
        let mut a = SleepAllocator::new(Mem::new(16 * G));
        let w = a.malloc(3 * G - 5, 0, "weights").unwrap();
        let kv = a.malloc(10, 0, "kv_cache").unwrap();
        a.backend.bytes(w).fill(1);
        a.backend.bytes(kv).fill(2);
        (a, w, kv)
    }

    #[test]
    fn malloc_rounds_up_to_the_granularity_and_records_the_tag() {
        let (a, w, kv) = two_tags();
        let info = a.allocations();
        assert_eq!(info.len(), 2);
        assert_eq!(
            (info[0].base, info[0].size, info[0].requested),
            (w, 3 * G, 3 * G - 5)
        );
        assert_eq!(
            (info[1].base, info[1].size, info[1].tag.as_str()),
            (kv, G, "kv_cache")
        );
        assert_eq!(a.tags(), tags(&["kv_cache", "weights"]));
        assert_eq!(a.stats().bytes_mapped, 4 * G);
    }

    #[test]
    fn level_1_restores_offloaded_tags_and_poisons_the_rest_at_the_same_address() {
        let (mut a, w, kv) = two_tags();
        let r = a.sleep(1, &tags(&["weights"])).unwrap();
        assert_eq!((r.offloaded_bytes, r.discarded_bytes), (3 * G, G));
        assert_eq!(a.backend.used(), 0, "sleep gives all physical memory back");
        assert_eq!(a.stats().bytes_mapped, 0);
        assert_eq!(a.asleep(), Some(1));
        let r = a.wake(None, Poison::NAN).unwrap();
        assert!(r.awake);
        assert_eq!((r.restored_bytes, r.poisoned_bytes), (3 * G, G));
        assert!(a.backend.bytes(w).iter().all(|&b| b == 1));
        assert!(a.backend.bytes(kv).iter().all(|&b| b == 0xFF));
        assert_eq!(a.asleep(), None);
        assert_eq!(a.stats().host_bytes_held, 0);
        assert_eq!(
            a.stats().host_bytes_cached,
            3 * G,
            "the host buffer is kept for the next sleep"
        );
    }

    #[test]
    fn level_2_discards_everything_and_poison_none_leaves_the_new_memory_as_is() {
        let (mut a, w, _) = two_tags();
        a.sleep(2, &[]).unwrap();
        a.wake(None, Poison::None).unwrap();
        assert!(a.backend.bytes(w).iter().all(|&b| b == 0xA5));
        assert_eq!(a.backend.hosts_live, 0);
    }

    #[test]
    fn waking_one_tag_at_a_time() {
        let (mut a, w, kv) = two_tags();
        a.sleep(1, &tags(&["weights"])).unwrap();
        let r = a.wake(Some(&tags(&["weights"])), Poison::ZEROS).unwrap();
        assert!(!r.awake);
        assert_eq!(a.asleep(), Some(1));
        assert!(a.backend.bytes(w).iter().all(|&b| b == 1));
        assert!(!a.backend.mapped.contains_key(&kv));
        let r = a.wake(Some(&tags(&["kv_cache"])), Poison::ZEROS).unwrap();
        assert!(r.awake);
        assert!(a.backend.bytes(kv).iter().all(|&b| b == 0));
    }

    #[test]
    fn bad_calls_are_errors_that_change_nothing() {
        let (mut a, _, _) = two_tags();
        assert_eq!(a.wake(None, Poison::NAN), Err(SleepError::NotAsleep));
        assert_eq!(a.sleep(3, &[]), Err(SleepError::BadLevel(3)));
        assert!(matches!(
            a.sleep(2, &tags(&["weights"])),
            Err(SleepError::OffloadAtLevel2 { .. })
        ));
        assert!(matches!(
            a.sleep(1, &tags(&["wieghts"])),
            Err(SleepError::UnknownTag { ref tag, .. }) if tag == "wieghts"
        ));
        assert_eq!(a.asleep(), None);
        assert_eq!(a.stats().bytes_mapped, 4 * G);
        a.sleep(1, &tags(&["weights"])).unwrap();
        assert_eq!(a.sleep(1, &[]), Err(SleepError::AlreadyAsleep { level: 1 }));
        assert!(matches!(
            a.wake(Some(&tags(&["kv"])), Poison::NAN),
            Err(SleepError::UnknownTag { ref known, .. }) if *known == tags(&["kv_cache", "weights"])
        ));
        assert_eq!(a.asleep(), Some(1));
        assert_eq!(a.free(12345), Err(SleepError::UnknownAddress(12345)));
    }

    #[test]
    fn out_of_memory_on_wake_releases_what_it_mapped_and_stays_asleep() {
        let (mut a, w, kv) = two_tags();
        a.sleep(1, &tags(&["weights"])).unwrap();
        // Someone else takes the memory while we sleep: only 2 of the 4 granules are left.
        a.backend.capacity = 2 * G;
        let e = a.wake(None, Poison::NAN).unwrap_err();
        assert!(
            matches!(e, SleepError::WakeOutOfMemory { total, .. } if total == 4 * G),
            "{e}"
        );
        assert_eq!(a.backend.used(), 0, "nothing stays mapped");
        assert!(a.backend.mapped.is_empty());
        assert_eq!(a.asleep(), Some(1));
        assert_eq!(a.stats().host_bytes_held, 3 * G, "the host copy survives");
        // The memory comes back: wake succeeds and the weights are intact.
        a.backend.capacity = 16 * G;
        assert!(a.wake(None, Poison::NAN).unwrap().awake);
        assert!(a.backend.bytes(w).iter().all(|&b| b == 1));
        assert!(a.backend.bytes(kv).iter().all(|&b| b == 0xFF));
    }

    #[test]
    fn out_of_memory_on_malloc_leaves_no_reservation() {
        let mut a = SleepAllocator::new(Mem::new(G));
        assert!(matches!(
            a.malloc(2 * G, 0, "w"),
            Err(SleepError::OutOfMemory { .. })
        ));
        assert!(a.backend.reserved.is_empty());
        assert!(a.allocations().is_empty());
    }

    #[test]
    fn freeing_while_asleep_gives_back_the_reservation_and_the_host_copy() {
        let (mut a, w, kv) = two_tags();
        a.sleep(1, &tags(&["weights"])).unwrap();
        a.free(w).unwrap();
        a.free(kv).unwrap();
        assert_eq!(a.stats().freed_while_asleep, 2);
        assert!(a.backend.reserved.is_empty());
        // Nothing is left to wake: waking ends the sleep.
        assert!(a.wake(None, Poison::NAN).unwrap().awake);
        assert_eq!(a.release_host_cache().unwrap(), 3 * G);
        assert_eq!(a.backend.hosts_live, 0);
    }

    #[test]
    fn teardown_leaks_nothing() {
        let (mut a, w, kv) = two_tags();
        for _ in 0..3 {
            a.sleep(1, &tags(&["weights"])).unwrap();
            a.wake(None, Poison::NAN).unwrap();
        }
        assert_eq!(
            a.backend.hosts_live, 1,
            "one cached host buffer, reused by every sleep"
        );
        a.free(w).unwrap();
        a.free(kv).unwrap();
        a.release_host_cache().unwrap();
        let s = a.stats();
        assert_eq!((s.allocations, s.bytes_mapped, s.bytes_reserved), (0, 0, 0));
        assert_eq!((s.host_bytes_held, s.host_bytes_cached), (0, 0));
        assert!(a.backend.physical.is_empty() && a.backend.reserved.is_empty());
        assert_eq!(a.backend.hosts_live, 0);
        assert_eq!((s.sleeps, s.wakes, s.mallocs, s.frees), (3, 3, 2, 2));
    }

    #[test]
    fn allocations_made_while_asleep_stay_mapped() {
        let (mut a, _, _) = two_tags();
        a.sleep(2, &[]).unwrap();
        let x = a.malloc(1, 0, "weights").unwrap();
        a.backend.bytes(x).fill(7);
        a.wake(None, Poison::NAN).unwrap();
        assert!(a.backend.bytes(x).iter().all(|&b| b == 7));
    }

    #[test]
    fn poison_parses_names_and_bytes() {
        assert_eq!(Poison::parse("nan"), Ok(Poison::Byte(0xFF)));
        assert_eq!(Poison::parse("zeros"), Ok(Poison::Byte(0)));
        assert_eq!(Poison::parse("none"), Ok(Poison::None));
        assert_eq!(Poison::parse("0x7f"), Ok(Poison::Byte(0x7F)));
        assert_eq!(Poison::parse("17"), Ok(Poison::Byte(17)));
        assert!(Poison::parse("256").unwrap_err().contains("not \"256\""));
    }

    #[test]
    fn a_failed_copy_on_wake_undoes_the_wake_and_keeps_the_host_copy() {
        let (mut a, w, _) = two_tags();
        a.sleep(1, &tags(&["weights"])).unwrap();
        a.backend.fail_copy_in = true;
        assert!(matches!(
            a.wake(None, Poison::NAN),
            Err(SleepError::Backend { .. })
        ));
        assert_eq!(a.asleep(), Some(1));
        assert!(a.backend.mapped.is_empty() && a.backend.used() == 0);
        assert_eq!(a.stats().host_bytes_held, 3 * G);
        a.backend.fail_copy_in = false;
        assert!(a.wake(None, Poison::NAN).unwrap().awake);
        assert!(a.backend.bytes(w).iter().all(|&b| b == 1));
    }

    #[test]
    fn running_out_of_host_memory_at_sleep_waits_for_started_copies_and_stays_awake() {
        let mut a = SleepAllocator::new(Mem::new(16 * G));
        let x = a.malloc(G, 0, "weights").unwrap();
        a.malloc(G, 0, "weights").unwrap();
        a.backend.bytes(x).fill(4);
        a.backend.hosts_left = Some(1);
        let syncs = a.backend.syncs;
        assert!(matches!(
            a.sleep(1, &tags(&["weights"])),
            Err(SleepError::HostOutOfMemory { .. })
        ));
        assert!(
            a.backend.syncs >= syncs + 2,
            "synchronized before and after the copies"
        );
        assert_eq!(a.asleep(), None);
        assert_eq!(a.stats().bytes_mapped, 2 * G);
        assert!(a.backend.bytes(x).iter().all(|&b| b == 4));
    }

    #[test]
    fn host_buffers_a_sleep_does_not_use_are_given_back() {
        let mut a = SleepAllocator::new(Mem::new(16 * G));
        let w = a.malloc(G, 0, "weights").unwrap();
        a.sleep(1, &tags(&["weights"])).unwrap();
        a.wake(None, Poison::NAN).unwrap();
        // A reload that changes sizes: the cached 1-granule buffer fits nothing now.
        a.free(w).unwrap();
        a.malloc(2 * G, 0, "weights").unwrap();
        a.sleep(1, &tags(&["weights"])).unwrap();
        assert_eq!(a.backend.hosts_live, 1, "the unused buffer went back");
        assert_eq!(a.stats().host_bytes_cached, 0);
        // A level-2 sleep in between keeps the buffer a live allocation can use.
        a.wake(None, Poison::NAN).unwrap();
        a.sleep(2, &[]).unwrap();
        a.wake(None, Poison::NAN).unwrap();
        assert_eq!(
            (a.backend.hosts_live, a.stats().host_bytes_cached),
            (1, 2 * G)
        );
    }
}
