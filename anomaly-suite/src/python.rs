//! Python scenarios, run inside the engine through the Python plane: a garbage-collection
//! storm and a sleep added to one function. Both end by themselves at their deadline even if
//! stallscope dies; stopping early asks the target to end them at once.

use std::{
    sync::atomic::AtomicBool,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{hold, Onset, Params};

/// How long the engine's main thread may take to reach a safe point.
const SAFE_POINT: Duration = Duration::from_secs(10);
/// Collections per second at intensity 1.
const MAX_COLLECTIONS: f64 = 100.0;
/// Sleep per call at intensity 1 when the engine's step is not given, seconds.
const MAX_SLEEP_S: f64 = 0.020;
/// Sleep per call at intensity 1 in engine steps: intensity 0.5 doubles a step whose
/// function is called once per step (vLLM's `Scheduler.schedule`).
const MAX_SLEEP_STEPS: f64 = 2.0;
/// The function slowed when none is given: vLLM's scheduler step.
pub const DEFAULT_FUNCTION: &str = "vllm.v1.core.sched.scheduler:Scheduler.schedule";

/// `t` on CLOCK_MONOTONIC, in seconds: the clock of Python's `time.monotonic()` on Linux, so
/// that the code injected ends at the injector's own deadline however long the injection took.
fn monotonic_s(t: Instant) -> f64 {
    let now = sys_util::clock::monotonic_ns() as f64 * 1e-9;
    now + t.saturating_duration_since(Instant::now()).as_secs_f64()
}

fn run(pid: u32, source: &str) -> Result<()> {
    pyframe_tracer::inject::run_source(pid as i32, source, SAFE_POINT)
        .with_context(|| format!("running the scenario's code in process {pid}"))
}

/// A thread inside the engine makes cyclic garbage and runs a full collection up to
/// `intensity` × 100 times a second (each holds the GIL for the whole heap walk).
pub fn gc_storm(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let rate = MAX_COLLECTIONS * p.intensity;
    let deadline = Instant::now() + p.duration;
    let end = monotonic_s(deadline);
    run(
        pid,
        &format!(
            r#"import gc, sys, threading, time
ev = threading.Event()
sys._stallscope_gc_storm = ev
def storm(end={end}, gap=1.0 / {rate}):
    while time.monotonic() < end and not ev.is_set():
        junk = []
        for _ in range(2000):
            a = []
            a.append(a)
            junk.append(a)
        del junk
        gc.collect()
        ev.wait(gap)
threading.Thread(target=storm, name="stallscope-gc-storm", daemon=True).start()
"#
        ),
    )?;
    onset.now();
    if !hold(deadline, stop) {
        let _ = run(
            pid,
            "import sys\ne = getattr(sys, '_stallscope_gc_storm', None)\nif e: e.set()\n",
        );
    }
    Ok(format!(
        "a thread in the engine ran gc.collect() up to {rate:.0} times a second, making 2,000 cycles before each"
    ))
}

/// Wraps `--function` (default [`DEFAULT_FUNCTION`]) so every call first sleeps `intensity`
/// × two engine steps (× 20 ms when the step is not given); a timer thread in the engine puts
/// the original back at the deadline.
pub fn sync_stall(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let function = p.function.as_deref().unwrap_or(DEFAULT_FUNCTION);
    let (module, qualname) = function
        .split_once(':')
        .context("--function must be MODULE:QUALNAME")?;
    let sleep = p
        .step
        .map_or(MAX_SLEEP_S, |s| s.as_secs_f64() * MAX_SLEEP_STEPS)
        * p.intensity;
    let deadline = Instant::now() + p.duration;
    let end = monotonic_s(deadline);
    let locate = format!(
        r#"import importlib, sys
parts = {qualname:?}.split('.')
owner = sys.modules.get({module:?}) or importlib.import_module({module:?})
for part in parts[:-1]:
    owner = getattr(owner, part)
name = parts[-1]
current = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
"#
    );
    run(
        pid,
        &format!(
            r#"{locate}import threading, time
if hasattr(current, '__stallscope_orig__'):
    raise RuntimeError('already stalled by another injection')
if not callable(current) or isinstance(current, (staticmethod, classmethod)):
    raise TypeError('%s is not a plain function' % {function:?})
orig = current
def stalled(*args, __orig=orig, __end={end}, **kwargs):
    if time.monotonic() < __end:
        time.sleep({sleep})
    return __orig(*args, **kwargs)
stalled.__stallscope_orig__ = orig
setattr(owner, name, stalled)
def restore():
    if getattr(owner.__dict__.get(name) if isinstance(owner, type) else getattr(owner, name), '__stallscope_orig__', None) is orig:
        setattr(owner, name, orig)
threading.Timer(max(0.0, {end} - time.monotonic()), restore).start()
"#
        ),
    )?;
    onset.now();
    if !hold(deadline, stop) {
        let _ = run(
            pid,
            &format!(
                "{locate}orig = getattr(current, '__stallscope_orig__', None)\nif orig is not None: setattr(owner, name, orig)\n"
            ),
        );
    }
    Ok(format!(
        "{function} sleeps {:.1} ms before every call, put back after",
        sleep * 1e3
    ))
}
