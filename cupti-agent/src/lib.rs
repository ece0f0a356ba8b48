//! stallscope's GPU agent, loaded into the live engine (`ctypes.CDLL` run at a Python safe
//! point, or a plain `dlopen`).
//!
//! Its constructor only starts a thread ([`stallscope_gpu_agent_start`] does the same for a
//! re-attach while the library is still loaded). The thread maps the channel the daemon
//! created (`/dev/shm/stallscope-gpu-<pid>`; without it the thread just ends), loads the
//! process's own libcupti, subscribes (sharing CUPTI with other tools where CUPTI >= 13.3
//! can; a slot held by a tool that does not share is reported, never fought), enables
//! kernel, memcpy, memset, runtime/driver API, synchronization and external-correlation
//! records (API records with the kernel's thread ids, and none for the queries that do no GPU
//! work: `QUIET_RUNTIME_API`, `QUIET_DRIVER_API`), and forwards them through the channel with
//! clock calibration samples. It traces only the share of the time the daemon asks for
//! (`cupti_sys::sampling`), letting CUPTI go between stretches and saying each switch in the
//! channel. When the
//! daemon asks to detach, or stops beating for 30 s, it disables, flushes and unsubscribes
//! (and finalizes CUPTI unless it shares it), then ends, after which the library can be
//! unloaded. Nothing here panics across FFI: every entry point catches unwinds.

mod forward;
mod shm;

use std::{
    panic::catch_unwind,
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use cupti_sys::{
    channel::{control, state, Channel, Event},
    kind,
    library::Cupti,
    sampling::Sampling,
    subscription::{self, Subscription},
    FLUSH_FORCED, QUIET_DRIVER_API, QUIET_RUNTIME_API,
};
use sys_util::clock::monotonic_ns;

/// Activity kinds enabled, in this order, and disabled in the reverse one; kernel records
/// ([`REQUIRED`]) are required, the rest best effort. The API kinds come on before the kinds of
/// the work they launch and go off after them, so that every kernel, copy or set recorded has
/// its launching call's record (its correlation): with the kernels first, a launch between
/// the two enables was recorded without its call.
const KINDS: [u32; 7] = [
    kind::RUNTIME,
    kind::DRIVER,
    kind::EXTERNAL_CORRELATION,
    kind::SYNCHRONIZATION,
    kind::CONCURRENT_KERNEL,
    kind::MEMCPY,
    kind::MEMSET,
];
/// The kind without which there is no GPU plane.
const REQUIRED: u32 = kind::CONCURRENT_KERNEL;
/// How often completed CUPTI buffers are flushed to the channel.
const FLUSH_EVERY: Duration = Duration::from_millis(200);
/// How often a clock calibration sample is sent.
const CLOCK_EVERY: Duration = Duration::from_secs(1);
/// Silence from the daemon after which the agent detaches by itself.
const ORPHAN_AFTER_NS: u64 = 30_000_000_000;

/// A tracing thread exists.
static ACTIVE: AtomicBool = AtomicBool::new(false);

#[used]
#[link_section = ".init_array"]
static CONSTRUCTOR: extern "C" fn() = constructor;

extern "C" fn constructor() {
    stallscope_gpu_agent_start();
}

/// Starts the agent thread unless one is running; 1 when started, 0 otherwise.
///
/// The thread is made with `pthread_create`, not `std::thread`: std would give the calling
/// (engine) thread a thread-local with a destructor in this library, and glibc never unloads
/// a library whose thread-local destructors are still pending on a live thread.
#[no_mangle]
pub extern "C" fn stallscope_gpu_agent_start() -> i32 {
    catch_unwind(|| {
        if ACTIVE
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return 0;
        }
        let mut t: libc::pthread_t = 0;
        // SAFETY: `thread_main` has the pthread start signature and takes no argument.
        let rc = unsafe {
            libc::pthread_create(&mut t, std::ptr::null(), thread_main, std::ptr::null_mut())
        };
        if rc != 0 {
            ACTIVE.store(false, Ordering::Release);
            return 0;
        }
        // SAFETY: `t` is the thread just created; nobody joins it.
        unsafe {
            libc::pthread_setname_np(t, c"stallscope-gpu".as_ptr());
            libc::pthread_detach(t);
        }
        1
    })
    .unwrap_or(0)
}

extern "C" fn thread_main(_: *mut libc::c_void) -> *mut libc::c_void {
    agent();
    std::ptr::null_mut()
}

fn agent() {
    let _ = catch_unwind(|| {
        // SAFETY: getpid/gettid cannot fail.
        let (pid, tid) = unsafe { (libc::getpid() as u32, libc::gettid() as u32) };
        let Some(map) = shm::Mapping::open(pid) else {
            return;
        };
        let channel = map.channel();
        channel.set_agent_tid(tid);
        match trace(channel) {
            Ok(()) => channel.set_state(state::DETACHED),
            Err(msg) => channel.fail(&msg),
        }
    });
    ACTIVE.store(false, Ordering::Release);
}

unsafe extern "C" fn ignore_callback(_: *mut libc::c_void, _: u32, _: u32, _: *const libc::c_void) {
}

/// Why a traced stretch ended.
#[derive(PartialEq)]
enum End {
    /// The daemon asked to detach, or went silent.
    Detach,
    /// The sampling's untraced part began.
    Untraced,
}

/// Traces in stretches (all the time unless the daemon samples) until told to stop.
///
/// Between stretches CUPTI is let go entirely (unsubscribed and, unless shared, finalized),
/// not just left with its kinds disabled: on an H200 a subscriber with every kind off still
/// cost a GPU-bound loop 2.4 % and an eager one ~14 % (`cargo xtask gpu-check`, BENCHMARKS.md).
fn trace(channel: &Channel) -> Result<(), String> {
    let cupti = Cupti::load().map_err(|e| e.to_string())?;
    channel.set_cupti_version(cupti.version().unwrap_or(0));
    let mut names = forward::SentNames::new();
    // The first stretch starts at once, whatever the sampling, so that a CUPTI that cannot
    // trace fails the attach rather than a later stretch.
    loop {
        if stretch(&cupti, channel, &mut names)? == End::Detach || !untraced(channel) {
            return Ok(());
        }
    }
}

/// Until the next flush, or the sampling's next switch if that comes first.
fn nap(sampling: Sampling, now: u64) -> Duration {
    let until = sampling.next_change(now).map_or(FLUSH_EVERY, |t| {
        Duration::from_nanos(t - now).min(FLUSH_EVERY)
    });
    until.max(Duration::from_millis(1))
}

/// Whether the daemon is gone or asks to detach.
fn told_to_stop(channel: &Channel, now: u64) -> bool {
    let beat = channel.heartbeat();
    channel.control() == control::DETACH
        || (beat != 0 && now.saturating_sub(beat) > ORPHAN_AFTER_NS)
}

/// Waits out the untraced part; false when told to stop meanwhile.
fn untraced(channel: &Channel) -> bool {
    loop {
        let now = monotonic_ns();
        if told_to_stop(channel, now) {
            return false;
        }
        let sampling = channel.sampling();
        if sampling.is_on(now) {
            return true;
        }
        std::thread::sleep(nap(sampling, now));
    }
}

/// One traced stretch: subscribes, traces until the sampling turns off or the daemon asks to
/// stop, and always gives CUPTI back.
fn stretch(
    cupti: &Cupti,
    channel: &Channel,
    names: &mut forward::SentNames,
) -> Result<End, String> {
    let sub = subscription::subscribe(cupti, ignore_callback, c"stallscope")
        .map_err(|e| e.to_string())?;
    channel.set_subscription(sub.mode().code());
    forward::install(sub.reader(), channel, std::mem::take(names));
    let thread_ids = sub.use_system_thread_ids();
    let mut enabled = Vec::new();
    let outcome = run(cupti, &sub, channel, &mut enabled);
    // Give everything back, whatever happened.
    switch_off(&sub, &mut enabled);
    if let Some(previous) = thread_ids {
        sub.restore_thread_ids(previous);
    }
    // SAFETY: documented signature; the forced flush delivers the last buffers to us.
    unsafe { (cupti.activity_flush_all)(FLUSH_FORCED) };
    sub.unsubscribe();
    *names = forward::uninstall();
    outcome
}

fn run(
    cupti: &Cupti,
    sub: &Subscription,
    channel: &Channel,
    enabled: &mut Vec<u32>,
) -> Result<End, String> {
    sub.register_callbacks(
        (forward::buffer_requested, forward::buffer_completed),
        (forward::buffer_requested_v2, forward::buffer_completed_v2),
    )
    .map_err(|e| e.to_string())?;
    switch_on(sub, enabled)?;
    channel.set_state(state::RUNNING);
    let mut last_clock: Option<Instant> = None;
    loop {
        let now = monotonic_ns();
        if told_to_stop(channel, now) {
            return Ok(End::Detach);
        }
        let sampling = channel.sampling();
        if !sampling.is_on(now) {
            return Ok(End::Untraced);
        }
        if last_clock.is_none_or(|t| t.elapsed() >= CLOCK_EVERY) {
            let mono_before_ns = monotonic_ns();
            if let Ok(cupti_ns) = cupti.timestamp() {
                forward::push(&Event::Clock {
                    cupti_ns,
                    mono_before_ns,
                    mono_after_ns: monotonic_ns(),
                });
            }
            last_clock = Some(Instant::now());
        }
        // SAFETY: documented signature; completed buffers come back through our callback.
        unsafe { (cupti.activity_flush_all)(0) };
        std::thread::sleep(nap(sampling, monotonic_ns()));
    }
}

/// Enables [`KINDS`] (the required one must come on) and quiets the queries; then says so.
fn switch_on(sub: &Subscription, enabled: &mut Vec<u32>) -> Result<(), String> {
    for k in KINDS {
        match sub.enable(k) {
            Ok(()) => enabled.push(k),
            Err(e) if k == REQUIRED => return Err(format!("{e} for kernel records")),
            Err(_) => {}
        }
    }
    // Enabling a kind turns each of its functions on.
    let ids = |t: &[(u32, &str)]| t.iter().map(|(id, _)| *id).collect::<Vec<_>>();
    sub.quiet(&ids(&QUIET_RUNTIME_API), &ids(&QUIET_DRIVER_API));
    forward::push(&Event::Tracing {
        on: true,
        at_ns: monotonic_ns(),
    });
    Ok(())
}

/// Says tracing stops, then disables what is enabled, in the reverse order.
fn switch_off(sub: &Subscription, enabled: &mut Vec<u32>) {
    if enabled.is_empty() {
        return;
    }
    forward::push(&Event::Tracing {
        on: false,
        at_ns: monotonic_ns(),
    });
    for k in enabled.drain(..).rev() {
        sub.disable(k);
    }
}
