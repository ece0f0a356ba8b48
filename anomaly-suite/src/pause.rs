//! Process pauses: SIGSTOP/SIGCONT of the whole engine (a hang of a few tens of ms).

use std::{
    sync::atomic::AtomicBool,
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{each_period, hold, process_tree, realtime, Onset, Params};

/// One pause cycle without the engine's step.
const PERIOD: Duration = Duration::from_millis(200);

/// One pause cycle in engine steps: a hang of up to 5.4 steps, then the engine runs at least
/// 0.6 steps (200 ms is 6-7 steps of a 30 ms engine).
const PERIOD_STEPS: u32 = 6;

/// Continues the stopped processes on drop, whatever happened.
struct Stopped(Vec<u32>);

impl Drop for Stopped {
    fn drop(&mut self) {
        for &p in &self.0 {
            // SAFETY: kill(2) with a pid we stopped.
            unsafe { libc::kill(p as i32, libc::SIGCONT) };
        }
    }
}

/// Stops the engine's process tree for `intensity` (at most 0.9) of every [`PERIOD_STEPS`]
/// engine steps, or of every 200 ms when the step is not given: the same intensity then
/// stops a fast and a slow engine for the same number of steps. The timing thread runs at
/// SCHED_FIFO 1 so a busy host cannot stretch a pause.
pub fn pauses(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let deadline = Instant::now() + p.duration;
    let period = p.step.map_or(PERIOD, |s| s * PERIOD_STEPS);
    let pause = period.mul_f64(p.intensity.min(0.9));
    let fifo = realtime();
    let mut count = 0;
    each_period(period, deadline, stop, |t| {
        let stopped = Stopped(process_tree(pid));
        for &q in &stopped.0 {
            // SAFETY: kill(2) on the engine's processes; Stopped continues them.
            unsafe { libc::kill(q as i32, libc::SIGSTOP) };
        }
        onset.now();
        hold((t + pause).min(deadline), stop);
        drop(stopped);
        count += 1;
    });
    Ok(format!(
        "{count} pauses of {:.0} ms every {:.0} ms of the engine's process tree{}",
        pause.as_secs_f64() * 1e3,
        period.as_secs_f64() * 1e3,
        if fifo { " (SCHED_FIFO timer)" } else { "" }
    ))
}
