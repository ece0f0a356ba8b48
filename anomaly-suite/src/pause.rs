//! Process pauses: SIGSTOP/SIGCONT of the whole engine (a hang of a few tens of ms).

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::Result;

use crate::{hold, process_tree, realtime, Onset, Params};

/// One pause cycle.
const PERIOD: Duration = Duration::from_millis(200);

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

/// Stops the engine's process tree for `intensity` of every 200 ms. The timing thread runs
/// at SCHED_FIFO 1 so a busy host cannot stretch a pause.
pub fn pauses(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let deadline = Instant::now() + p.duration;
    let pause = PERIOD.mul_f64(p.intensity.min(0.9));
    let fifo = realtime();
    let mut count = 0;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let tree = process_tree(pid);
        let stopped = Stopped(tree);
        for &q in &stopped.0 {
            // SAFETY: kill(2) on the engine's processes; Stopped continues them.
            unsafe { libc::kill(q as i32, libc::SIGSTOP) };
        }
        onset.now();
        hold((t + pause).min(deadline), stop);
        drop(stopped);
        count += 1;
        hold((t + PERIOD).min(deadline), stop);
    }
    Ok(format!(
        "{count} pauses of {:.0} ms every {} ms of the engine's process tree{}",
        pause.as_secs_f64() * 1e3,
        PERIOD.as_millis(),
        if fifo { " (SCHED_FIFO timer)" } else { "" }
    ))
}
