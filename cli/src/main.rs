//! The `graphcheck` binary: the command line lives in the library ([`graphcheck_cli::main_impl`]),
//! which the Python console script calls too.

fn main() -> std::process::ExitCode {
    let code = graphcheck_cli::main_impl(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}

/// mimalloc rather than the system allocator: verifying an engine-scale pair makes millions
/// of small allocations (owner paths, shapes, touch lists) and touches about 300 MiB of
/// fresh memory. On the 2-core CPU machine (Intel Xeon, THP `madvise`), 14 alternating
/// runs of `graphcheck verify` on `benches/verify_bench.py`'s documents: 0.536 s median
/// wall against 0.593 s with the system allocator advising huge pages for large blocks,
/// kernel time 0.09 s against 0.19 s (benches/README.md).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
