//! The sleep allocator's bookkeeping: tagged allocations of virtual memory whose physical
//! backing is released at `sleep` and mapped again at the same virtual address on `wake`,
//! with a host copy restored (offloaded tags at level 1) or a poison filled in (everything
//! else). The memory operations come from a [`Backend`]: the CUDA driver's virtual-memory
//! calls ([`crate::CudaVmm`]), or a host-memory double in the tests (`allocator/tests.rs`),
//! so that the state machine — errors, rollback, no leaks — is tested without a GPU.
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
    #[error(transparent)]
    Driver(#[from] graphcheck_driver::DriverError),
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
    /// Last, so that it is dropped after the allocations and host buffers it made.
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
mod tests;
