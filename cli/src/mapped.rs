//! The binary's input files of 1 MiB or more, mapped into memory instead of read.

use std::path::Path;

#[cfg(unix)]
use graphcheck::codec::load::SharedBytes;
use graphcheck::codec::load::Source;

#[cfg(unix)]
pub mod live_maps;

/// A path as the binary's own loads take it ([`crate::Inputs::Map`]): on Unix, a regular
/// file of at least [`MAP_FROM`] bytes mapped into memory (its pages are the page cache's,
/// never copied into fresh memory); any other path read by the loader, which also reports
/// why one cannot be. Never for a process that is not the command: the Python API and the
/// console entry point ([`crate::main_impl`]) read.
pub fn mapped_source(path: &Path) -> Source {
    #[cfg(unix)]
    if let Some(map) = mapped(path) {
        let map = live_maps::Mapped::new(map, path);
        pause_after_map(path, map.as_ref().len());
        return Source::Shared {
            bytes: SharedBytes(std::sync::Arc::new(map)),
            name: path.to_path_buf(),
        };
    }
    graphcheck::app::commands::source(path)
}

/// Test-only: with `GRAPHCHECK_TEST_PAUSE_AFTER_MAP_MS=N` set, the binary waits after
/// mapping a file, up to N ms or until the file is shorter than its `len` mapped bytes, so
/// a test can truncate a mapped input before it is read (tests/mapped_inputs.rs). No user
/// has a reason to set it; unset, nothing is asked of the file.
#[cfg(unix)]
fn pause_after_map(path: &Path, len: usize) {
    let Some(ms) = std::env::var_os("GRAPHCHECK_TEST_PAUSE_AFTER_MAP_MS")
        .and_then(|v| v.to_str()?.parse::<u64>().ok())
    else {
        return;
    };
    let until = std::time::Instant::now() + std::time::Duration::from_millis(ms);
    while std::time::Instant::now() < until
        && std::fs::metadata(path).is_ok_and(|m| m.len() >= len as u64)
    {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// Files from this size on are mapped rather than read.
pub const MAP_FROM: u64 = 1 << 20;

/// `path` mapped into memory, read-only, its pages faulted in at once; `None` for what is
/// not a regular file of at least [`MAP_FROM`] bytes or what the system does not map.
#[cfg(unix)]
#[allow(unsafe_code)]
fn mapped(path: &Path) -> Option<memmap2::Mmap> {
    // Asked before opening: opening a FIFO blocks until something writes to it.
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() < MAP_FROM {
        return None;
    }
    let file = std::fs::File::open(path).ok()?;
    // The file may have been replaced between the two: the opened one is what is mapped.
    let meta = file.metadata().ok()?;
    if !meta.is_file() || meta.len() < MAP_FROM {
        return None;
    }
    // SAFETY: a read-only shared mapping of a regular file this process opened and never
    // writes. What it cannot rule out is another process changing the file while the map
    // lives, which Rust counts as undefined behaviour for the `&[u8]` the loader reads:
    // - a rewrite in place can show the loader (which may read the bytes more than once)
    //   a mix of old and new bytes: at worst a wrong report or a parse error, as a `read`
    //   racing the same writer can give;
    // - a truncation makes reads past the new end fault (SIGBUS), which the binary answers
    //   with a message naming the file (registered in `live_maps`) and exit code 2
    //   (main.rs).
    // graphcheck's own writers replace a regular file by renaming a new one over it, which
    // leaves a mapped file whole (`write_atomic`); only a path reached through
    // `/proc/<pid>/fd` or a device is written in place, and no document is such a file.
    unsafe { memmap2::MmapOptions::new().populate().map(&file) }.ok()
}
