//! SIGBUS, which a read of a mapped input file raises when another process truncated the
//! file meanwhile, answered with a message naming the file and the bad-input exit code
//! instead of a crash with none.

const ERROR: &[u8] = b"error: bus error (SIGBUS) while reading ";
/// Where no mapping holds the faulting address (a `kill -BUS`, or a mapping with no
/// slot in the registry).
const ANY_FILE: &[u8] = b"an input file";
const CAUSE: &[u8] = b": most likely another process truncated or rewrote it while \
graphcheck read it; run again once nothing writes it\n";

/// Writes `bytes` to standard error with write(2), the only output a signal handler may
/// use; a short or failed write is not retried, as there is nothing better to do.
fn say(bytes: &[u8]) {
    // SAFETY: write(2) is async-signal-safe; it reads `bytes.len()` bytes of `bytes`.
    unsafe {
        libc::write(2, bytes.as_ptr().cast(), bytes.len());
    }
}

/// The address a fault raised by the kernel was at; `None` for a signal another
/// process sent (whose `siginfo_t` holds a sender, not an address).
///
/// # Safety
/// `info` is the `siginfo_t` the kernel passed a SIGBUS handler installed with
/// `SA_SIGINFO`.
unsafe fn fault_address(info: *const libc::siginfo_t) -> Option<usize> {
    // SAFETY: the caller's; `si_code` is read first, and `si_addr` only for the codes
    // that set it.
    unsafe {
        let code = (*info).si_code;
        [libc::BUS_ADRALN, libc::BUS_ADRERR, libc::BUS_OBJERR]
            .contains(&code)
            .then(|| (*info).si_addr() as usize)
    }
}

extern "C" fn on_bus_error(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    // SAFETY: the kernel's `siginfo_t`, for a handler installed with SA_SIGINFO.
    let addr = unsafe { fault_address(info) };
    let name = addr.map_or(std::ptr::null(), graphcheck_cli::mapped::live_maps::name_at);
    // SAFETY: `name_at` gives null or a pointer to a leaked name never freed.
    let name: &[u8] = unsafe { name.as_ref() }.map_or(ANY_FILE, |n| n);
    say(ERROR);
    say(name);
    say(CAUSE);
    // SAFETY: _exit(2) is async-signal-safe, and runs no destructors or exit handlers
    // that could touch the faulting mapping again.
    unsafe { libc::_exit(graphcheck::exit::BAD_INPUT) }
}

pub fn answer_faults() {
    let handler: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) = on_bus_error;
    let mut action = std::mem::MaybeUninit::<libc::sigaction>::zeroed();
    let a = action.as_mut_ptr();
    // SAFETY: installs a handler that only reads atomics and calls async-signal-safe
    // functions, before any other thread exists. `action` is written field by field
    // through its pointer (zeroed first: every field of `sigaction` is an integer, a
    // pointer or a bit set, none an enum), its mask emptied by sigemptyset, and only
    // then handed to sigaction(2), which reads it.
    unsafe {
        std::ptr::addr_of_mut!((*a).sa_sigaction).write(handler as libc::sighandler_t);
        std::ptr::addr_of_mut!((*a).sa_flags).write(libc::SA_SIGINFO);
        libc::sigemptyset(std::ptr::addr_of_mut!((*a).sa_mask));
        libc::sigaction(libc::SIGBUS, a, std::ptr::null_mut());
    }
}
