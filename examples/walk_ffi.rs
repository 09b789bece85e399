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
// Allowed: a C entry point.
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
                    graphcheck::app::output::write_atomic(std::path::Path::new(&path), &bytes)
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
// Allowed: a C entry point.
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

/// Times a walk in cumulative phases, each over every node of `graph`, best of `reps`
/// (nanoseconds per node): [0] node list and types; [1] + each kernel node's parameters;
/// [2] + the function-handle cache of a walk (name key read once per handle); [3] + a copy
/// of every kernel's parameter bytes (its layout read once per function): the least a
/// capture must do before the graph can change; [4] the whole walk (`walk_graph`).
/// [5] the distinct function handles, [6] the nodes, [7] the walk's driver range lookups
/// (`cuMemGetAddressRange`, words its cache could not answer), [8] the words scanned.
/// Returns 0 or -1.
///
/// # Safety
/// As [`graphcheck_walk`]; `out` must be valid for nine writes.
// Allowed: a C entry point.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn graphcheck_phases(graph: u64, reps: u32, out: *mut f64) -> i32 {
    use std::collections::HashMap;
    use std::time::Instant;
    let run = |g: GraphRef<'_>| -> Result<[f64; 9], graphcheck::cuda::CudaError> {
        let mut best = [f64::MAX; 5];
        let mut handles = 0usize;
        let mut n = 1usize;
        let mut stats = graphcheck::cuda::WalkStats::default();
        for _ in 0..reps.max(1) {
            #[allow(clippy::needless_range_loop)] // `phase` also picks what is timed
            for phase in 0..5 {
                let t = Instant::now();
                if phase == 4 {
                    let (walked, s) = graphcheck::cuda::walk_graph(g)?;
                    std::hint::black_box(walked);
                    stats = s;
                } else {
                    let nodes = g.nodes()?;
                    n = nodes.len().max(1);
                    let mut funcs: HashMap<(usize, usize), Vec<(usize, usize)>> = HashMap::new();
                    let mut bytes: Vec<u8> = Vec::new();
                    for node in &nodes {
                        if node.type_number()? != 0 || phase == 0 {
                            continue;
                        }
                        let k = node.kernel()?;
                        if phase == 1 {
                            std::hint::black_box(k.grid);
                            continue;
                        }
                        let key = k.function_key();
                        let layout = match funcs.get(&key) {
                            Some(l) => l,
                            None => {
                                std::hint::black_box(k.name_key().ok());
                                let l = k.param_layout().unwrap_or_default();
                                funcs.entry(key).or_insert(l)
                            }
                        };
                        if phase == 3 {
                            if k.has_kernel_params() {
                                for (i, &(_, size)) in layout.iter().enumerate() {
                                    bytes.extend_from_slice(k.param(i, size));
                                }
                            } else if let Some(b) = k.packed_params() {
                                bytes.extend_from_slice(b);
                            }
                        }
                    }
                    handles = funcs.len();
                    std::hint::black_box(&bytes);
                }
                let ns = t.elapsed().as_nanos() as f64 / n as f64;
                best[phase] = best[phase].min(ns);
            }
        }
        Ok([
            best[0],
            best[1],
            best[2],
            best[3],
            best[4],
            handles as f64,
            n as f64,
            stats.driver_lookups as f64,
            stats.words as f64,
        ])
    };
    match GraphRef::with_raw_handle(graph, run).unwrap_or_else(|e| Err(e.into())) {
        Ok(v) => {
            // SAFETY: nine writable slots, per the contract.
            unsafe { std::ptr::copy_nonoverlapping(v.as_ptr(), out, 9) };
            0
        }
        Err(e) => {
            eprintln!("graphcheck_phases: {e}");
            -1
        }
    }
}

/// Nanoseconds per call of `f` on `addr`, over `n` calls; negative where the driver could
/// not be loaded.
fn time_per_call<T>(addr: u64, n: u32, f: impl Fn(u64) -> T) -> f64 {
    if graphcheck::cuda::walk::driver_version().is_err() {
        return -1.0;
    }
    let t = std::time::Instant::now();
    for _ in 0..n {
        std::hint::black_box(f(std::hint::black_box(addr)));
    }
    t.elapsed().as_nanos() as f64 / n.max(1) as f64
}

/// Nanoseconds per `cuMemGetAddressRange` of `addr`, over `n` calls (a current context
/// needed), for `benches/pointer_probe.py`. Returns a negative number where the driver could
/// not be loaded.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn graphcheck_time_range(addr: u64, n: u32) -> f64 {
    time_per_call(addr, n, graphcheck::cuda::driver::address_range)
}

/// Nanoseconds per `is_known_pointer` (`cuPointerGetAttributes`) of `addr`, over `n` calls.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn graphcheck_time_known(addr: u64, n: u32) -> f64 {
    time_per_call(addr, n, graphcheck::cuda::driver::is_known_pointer)
}

/// 1 where `cuMemGetAddressRange` finds `addr`, plus 2 where `is_known_pointer` says known
/// (`benches/pointer_probe.py` checks that 1 never comes without 2).
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn graphcheck_probe(addr: u64) -> i32 {
    if graphcheck::cuda::walk::driver_version().is_err() {
        return -1;
    }
    i32::from(graphcheck::cuda::driver::address_range(addr).is_some())
        | (i32::from(graphcheck::cuda::driver::is_known_pointer(addr)) << 1)
}
