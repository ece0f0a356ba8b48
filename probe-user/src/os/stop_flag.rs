//! A flag raised by SIGINT/SIGTERM, for commands that must finish cleanly (undo an injection,
//! detach from a target) instead of dying on the signal.

use std::sync::atomic::{AtomicBool, Ordering};

/// Raised by SIGINT/SIGTERM once [`install`] ran.
pub static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to [`STOP`]; with `parent_death`, the parent's death arrives as
/// SIGTERM too.
pub fn install(parent_death: bool) {
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        if parent_death {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
        }
    }
}

/// Whether a stop was asked for.
pub fn requested() -> bool {
    STOP.load(Ordering::SeqCst)
}
