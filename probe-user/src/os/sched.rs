//! Scheduling of the daemon's own background threads, which share the engine's cores.

use log::warn;

/// Nice value of the background threads (the sentinel's fit, a deep dive's writer). A fit is
/// short (0.2 s of CPU at 1,000 samples, 2 s at 20,000) and rare (every 5,000 healthy
/// iterations), but it must finish: under SCHED_IDLE (weight 3) a 1,000-sample fit next to an
/// engine that keeps the cores busy waited more than 8 minutes. Nice 10 (weight 110) yields to
/// the engine roughly 10:1 and still finishes in seconds.
const BACKGROUND_NICE: libc::c_int = 10;

/// Puts the calling thread in SCHED_BATCH (it never preempts the engine on wake-up) at
/// [`BACKGROUND_NICE`]: the fit (and a deep dive's writer) shares the engine's cores on a small host.
pub fn lower_cpu_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; param is valid for the call.
    let batch = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) } == 0;
    // SAFETY: plain syscalls on the calling thread (Linux nice values are per thread).
    let niced = unsafe {
        libc::setpriority(
            libc::PRIO_PROCESS,
            libc::gettid() as libc::id_t,
            BACKGROUND_NICE,
        )
    } == 0;
    if !(batch && niced) {
        warn!(
            "cannot lower a background thread's priority: {}",
            std::io::Error::last_os_error()
        );
    }
}
