//! The files the binary has mapped now, by address range, for its SIGBUS handler
//! (`cli/src/main.rs`, module `bus`), which names the file a fault is in.
//!
//! Fixed slots of atomics, so looking an address up takes no lock and allocates nothing
//! (async-signal-safe). Each name is a copy of the path leaked when the file is mapped and
//! never freed, so a handler that reads a slot as it is cleared still reads a live name (at
//! worst the name of a file mapped there just before).

use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicUsize, Ordering};

/// A file mapped by `mapped::mapped`, registered here while it lives.
pub(super) struct Mapped {
    map: memmap2::Mmap,
    slot: Option<usize>,
}

impl Mapped {
    pub(super) fn new(map: memmap2::Mmap, path: &Path) -> Mapped {
        let slot = register(map.as_ptr() as usize, map.len(), path);
        Mapped { map, slot }
    }
}

impl AsRef<[u8]> for Mapped {
    fn as_ref(&self) -> &[u8] {
        &self.map
    }
}

impl Drop for Mapped {
    // Runs before the field is dropped: the range leaves the registry before it is
    // unmapped, so a fault in whatever is mapped there next is never named as this file.
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            clear(slot);
        }
    }
}

/// More files than any command maps at once (`verify DIR` maps two per rank); a mapping
/// with no free slot is not named, and a fault in it gives the generic message.
const SLOTS: usize = 256;

struct Slot {
    taken: AtomicBool,
    /// The first address of the mapping; 0 while the slot is empty or being filled.
    start: AtomicUsize,
    len: AtomicUsize,
    name: AtomicPtr<&'static [u8]>,
}

static LIVE: [Slot; SLOTS] = [const {
    Slot {
        taken: AtomicBool::new(false),
        start: AtomicUsize::new(0),
        len: AtomicUsize::new(0),
        name: AtomicPtr::new(std::ptr::null_mut()),
    }
}; SLOTS];

/// Registers `len` bytes mapped at `start` from `path`; the slot to [`clear`], or `None`
/// when every slot is taken.
fn register(start: usize, len: usize, path: &Path) -> Option<usize> {
    let i = LIVE.iter().position(|s| {
        s.taken
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    })?;
    let slot = &LIVE[i];
    let name: &'static [u8] = Box::leak(path.as_os_str().as_bytes().into());
    let name: &'static mut &'static [u8] = Box::leak(Box::new(name));
    slot.name.store(name, Ordering::Relaxed);
    slot.len.store(len, Ordering::Relaxed);
    // Last, and released: a reader that sees `start` sees the name and length with it.
    slot.start.store(start, Ordering::Release);
    Some(i)
}

/// Empties a slot [`register`] returned, before its mapping is unmapped.
fn clear(i: usize) {
    let slot = &LIVE[i];
    slot.start.store(0, Ordering::Release);
    slot.len.store(0, Ordering::Relaxed);
    slot.name.store(std::ptr::null_mut(), Ordering::Relaxed);
    slot.taken.store(false, Ordering::Release);
}

/// The name of the live mapping that holds `addr`: a pointer to a leaked, never-freed byte
/// string, or null where no registered mapping holds it. Async-signal-safe.
pub fn name_at(addr: usize) -> *const &'static [u8] {
    for slot in &LIVE {
        let start = slot.start.load(Ordering::Acquire);
        if start == 0 || addr < start {
            continue;
        }
        if addr - start < slot.len.load(Ordering::Relaxed) {
            return slot.name.load(Ordering::Relaxed);
        }
    }
    std::ptr::null()
}
