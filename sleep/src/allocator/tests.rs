//! The state machine against a host-memory stand-in for the device: errors, rollback and
//! no leaks, without a GPU.

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
    fn copy_out(&mut self, va: u64, host: &mut Vec<u8>, _: u64, _: i32) -> Result<(), SleepError> {
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
