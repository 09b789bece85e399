//! A C entry point to the walker, for `benches/walk_bench.py`: Python (ctypes) hands it the
//! raw handle of a graph torch captured, so the reference ctypes walker and graphcheck's walk
//! the very same graphs in one process. Bench scaffolding, not product API (the product's
//! Python entry is `graphcheck._native`).
//!
//! Build: `cargo build --release --features cuda --example walk_ffi`
//! (`target/release/examples/libwalk_ffi.so`).

use graphcheck::cuda::{GraphRef, walk_graph};

/// Walks `graph`; writes the nodes visited, the words scanned, the address words found and
/// the distinct kernels.
/// With a non-null `json_path` (a NUL-terminated path), also writes the walked graph there
/// as JSON. Returns 0, or -1 after printing the error to stderr.
///
/// # Safety
/// `graph` must be a valid `CUgraph` not used by another thread during the call; the out
/// pointers must be valid for writes; `json_path` null or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn graphcheck_walk(
    graph: u64,
    nodes: *mut u64,
    words: *mut u64,
    addresses: *mut u64,
    functions: *mut u64,
    json_path: *const std::ffi::c_char,
) -> i32 {
    // SAFETY: the caller vouches for the handle (see above).
    let g = unsafe { GraphRef::from_raw(graph as usize as _) };
    match walk_graph(g) {
        Ok((walked, stats)) => {
            // SAFETY: the caller passes writable pointers.
            unsafe {
                *nodes = stats.nodes as u64;
                *words = stats.words as u64;
                *addresses = stats.addresses as u64;
                *functions = stats.functions as u64;
            }
            if !json_path.is_null() {
                // SAFETY: NUL-terminated, per the contract.
                let path = unsafe { std::ffi::CStr::from_ptr(json_path) }
                    .to_string_lossy()
                    .into_owned();
                let mut bytes = serde_json::to_vec_pretty(&walked).expect("serializes");
                bytes.push(b'\n');
                if let Err(e) = graphcheck::load::write_atomic(std::path::Path::new(&path), &bytes)
                {
                    eprintln!("graphcheck_walk: failed to write {path}: {e}");
                    return -1;
                }
            }
            0
        }
        Err(e) => {
            eprintln!("graphcheck_walk: {e}");
            -1
        }
    }
}
