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
// Allowed: a C entry point (the workspace's lint list).
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn graphcheck_walk(
    graph: u64,
    nodes: *mut u64,
    words: *mut u64,
    addresses: *mut u64,
    functions: *mut u64,
    json_path: *const std::ffi::c_char,
) -> i32 {
    // The caller vouches for the handle (see above); null is refused.
    match GraphRef::with_raw_handle(graph, walk_graph).unwrap_or_else(|e| Err(e.into())) {
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
                if let Err(e) =
                    graphcheck::document::write::write_atomic(std::path::Path::new(&path), &bytes)
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

/// Times each driver call a walk makes, over every node of `graph`, once: writes the
/// nanoseconds per node of `cuGraphGetNodes` (both calls), `cuGraphNodeGetType`, and
/// `cuGraphKernelNodeGetParams` (kernel nodes), and the kernel-node count. Returns 0 or -1.
///
/// # Safety
/// As [`graphcheck_walk`]; `out` must be valid for four writes.
// Allowed: a C entry point (the workspace's lint list).
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn graphcheck_profile(graph: u64, out: *mut f64) -> i32 {
    use std::time::Instant;
    // The caller vouches for the handle; null is refused.
    let run = |g: GraphRef<'_>| -> Result<[f64; 4], graphcheck::cuda::CudaError> {
        let t = Instant::now();
        let nodes = g.nodes()?;
        let get_nodes = t.elapsed().as_nanos() as f64;
        let n = nodes.len().max(1) as f64;
        let t = Instant::now();
        let types: Vec<u32> = nodes
            .iter()
            .map(|x| x.type_number())
            .collect::<Result<_, _>>()?;
        let get_type = t.elapsed().as_nanos() as f64;
        let kernels: Vec<_> = nodes
            .iter()
            .zip(&types)
            .filter(|(_, t)| **t == 0)
            .map(|(x, _)| *x)
            .collect();
        let t = Instant::now();
        for k in &kernels {
            std::hint::black_box(k.kernel()?.grid);
        }
        let params = t.elapsed().as_nanos() as f64;
        Ok([
            get_nodes / n,
            get_type / n,
            params / (kernels.len().max(1) as f64),
            kernels.len() as f64,
        ])
    };
    match GraphRef::with_raw_handle(graph, run).unwrap_or_else(|e| Err(e.into())) {
        Ok(v) => {
            // SAFETY: four writable slots, per the contract.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 4) };
            0
        }
        Err(e) => {
            eprintln!("graphcheck_profile: {e}");
            -1
        }
    }
}
