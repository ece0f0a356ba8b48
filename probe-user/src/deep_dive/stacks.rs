//! A capture's stack sampler: py-spy in non-blocking mode (it never pauses the target) on a
//! thread of its own. The thread also sets py-spy up: that reads the target's maps and parses
//! its interpreter's symbols (~27 ms of CPU for vLLM), which on the daemon's loop would hold
//! up the verdicts of the iterations that end meanwhile.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use pyframe_tracer::sampling::{Sampler, ThreadStack};

use crate::os::{clock, worker::Worker};

/// What the sampler made.
#[derive(Debug, Default)]
pub struct Samples {
    /// (ns, stacks) per sample.
    pub samples: Vec<(u64, Vec<ThreadStack>)>,
    /// Samples that failed.
    pub errors: u64,
    /// Why there are none, when py-spy could not be set up.
    pub unavailable: Option<String>,
}

/// Starts sampling every Python thread of `pid` `hz` times a second.
pub fn start(pid: u32, hz: f64) -> std::io::Result<Worker<Samples>> {
    let period = Duration::from_secs_f64(1.0 / hz);
    Worker::spawn("stallscope-stacks", move |stop: &AtomicBool| {
        let mut out = Samples::default();
        let mut sampler = match Sampler::new(pid as i32) {
            Ok(s) => s,
            Err(e) => {
                out.unavailable = Some(format!("no stack samples: {e}"));
                return out;
            }
        };
        let mut next = Instant::now();
        while !stop.load(Ordering::Acquire) {
            let ts = clock::monotonic_ns();
            match sampler.sample() {
                Ok(s) => out.samples.push((ts, s)),
                Err(_) => out.errors += 1,
            }
            next += period;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        out
    })
}
