//! The `graphcheck` binary: the command line is the library's ([`graphcheck_cli::main_with`],
//! which the Python console script calls too); this process adds what only the command
//! may do: a SIGBUS answer for its mapped inputs (`bus`) and a huge-page allocator (`huge`).

// Allowed: installing a signal handler, which reads the kernel's siginfo_t.
#[cfg(unix)]
#[allow(unsafe_code)]
mod bus;
// Allowed: a global allocator (`GlobalAlloc` is an unsafe trait).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
mod huge;

#[cfg(target_os = "linux")]
#[global_allocator]
static GLOBAL: huge::Alloc = huge::Alloc;

fn main() -> std::process::ExitCode {
    #[cfg(unix)]
    bus::answer_faults();
    let code = graphcheck_cli::main_with(std::env::args_os(), graphcheck_cli::Inputs::Map);
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
