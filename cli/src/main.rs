//! The `graphcheck` binary: the command line lives in the library ([`graphcheck_cli::main_impl`]),
//! which the Python console script calls too.

fn main() -> std::process::ExitCode {
    let code = graphcheck_cli::main_impl(std::env::args_os());
    std::process::ExitCode::from(u8::try_from(code).unwrap_or(u8::MAX))
}
