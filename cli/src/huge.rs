//! The system allocator, with large blocks backed by transparent huge pages where the
//! kernel gives them on request (`madvise` mode, the common default). Verifying an
//! engine-scale pair touches about 300 MiB of fresh memory; in 4 KiB pages a third of the
//! run was the kernel's page faults (`benches/verify_bench.py`, benches/verify.md).

use std::alloc::{GlobalAlloc, Layout, System};

/// A huge page on x86-64 and most aarch64 kernels.
const PAGE: usize = 2 << 20;
/// Blocks from this size on are advised: smaller ones rarely span a whole huge page.
const FROM: usize = 4 << 20;

pub struct Alloc;

fn advise(p: *mut u8, size: usize) {
    if p.is_null() || size < FROM {
        return;
    }
    let start = (p as usize).next_multiple_of(PAGE);
    let end = (p as usize + size) / PAGE * PAGE;
    if end > start {
        // SAFETY: [start, end) lies inside the block just allocated, which this
        // process owns; MADV_HUGEPAGE changes how it is backed, never its contents,
        // and a kernel that refuses leaves the block as it was.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_HUGEPAGE);
        }
    }
}

// SAFETY: every call goes to `System` with the caller's arguments unchanged; `advise`
// only adds advice about the memory `System` returned.
unsafe impl GlobalAlloc for Alloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let p = unsafe { System.alloc_zeroed(layout) };
        advise(p, layout.size());
        p
    }

    unsafe fn dealloc(&self, p: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(p, layout) }
    }

    unsafe fn realloc(&self, p: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received.
        let q = unsafe { System.realloc(p, layout, new_size) };
        advise(q, new_size);
        q
    }
}
