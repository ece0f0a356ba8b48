//! The probe's lease, kept by a thread of its own.
//!
//! The probe in the target removes itself when the ring's heartbeat is older than the lease
//! (stallscope was killed). The heartbeat is written here, on a timer, not by whoever drains the
//! ring: a reader held up for a while (a daemon starved of CPU on a busy host, a slow pass of
//! its loop) must not lose its probes, only a reader that is gone. The thread dies with the
//! process, so a killed stallscope still lets the lease run out.
//!
//! The thread holds a tiny CPU reservation ([`sys_util::sched::HEARTBEAT`]): on a node the
//! engine saturates, a thread at the normal policy can wait longer than the lease for a CPU.

use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Once};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::ring::Ring;
use sys_util::clock::monotonic_ns;

/// Renews the lease of one ring until dropped; the drop returns once the thread has written
/// its last heartbeat.
pub struct LeaseKeeper {
    stop: Sender<()>,
    thread: Option<JoinHandle<()>>,
}

impl LeaseKeeper {
    /// Starts renewing `ring`'s heartbeat often enough for `lease` (ten times per lease, at
    /// most once a second and at least every 10 ms).
    pub fn start(ring: Arc<Ring>, lease: Duration) -> std::io::Result<LeaseKeeper> {
        let period = (lease / 10).clamp(Duration::from_millis(10), Duration::from_secs(1));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("stallscope-lease".into())
            .spawn(move || {
                if let Err(refused) = sys_util::sched::reserve(&sys_util::sched::HEARTBEAT) {
                    static SAID: Once = Once::new();
                    SAID.call_once(|| {
                        log::info!(
                            "the probes' lease is renewed at the normal policy and may wait behind the engine's threads: SCHED_DEADLINE was refused ({refused}; it needs CAP_SYS_NICE and a CPU affinity spanning every CPU)"
                        );
                    });
                }
                loop {
                    ring.heartbeat(monotonic_ns());
                    match stopped.recv_timeout(period) {
                        Err(RecvTimeoutError::Timeout) => continue,
                        Ok(()) | Err(RecvTimeoutError::Disconnected) => break,
                    }
                }
            })?;
        Ok(LeaseKeeper {
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        let _ = self.stop.send(());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renews_until_stopped() {
        let dir = std::env::temp_dir().join(format!("stallscope-lease-{}", std::process::id()));
        let ring = Arc::new(Ring::create(&dir, 2, 4).unwrap());
        let _ = std::fs::remove_file(&dir);
        ring.heartbeat(1);
        // Renewals every 10 ms; waits bounded by seconds, not by the period, so that a loaded
        // host that runs the keeper late does not fail the test.
        let after = |than: u64| {
            let limit = std::time::Instant::now() + Duration::from_secs(5);
            loop {
                let now = ring.read_heartbeat();
                if now > than || std::time::Instant::now() > limit {
                    return now;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        let keeper = LeaseKeeper::start(ring.clone(), Duration::from_millis(100)).unwrap();
        let renewed = after(1);
        assert!(renewed > 1, "never renewed");
        assert!(after(renewed) > renewed, "renewed only once");
        drop(keeper);
        let last = ring.read_heartbeat();
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(ring.read_heartbeat(), last, "renewed after stop");
    }
}
