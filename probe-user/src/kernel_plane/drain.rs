//! Drains the deep-dive event ring. The kernel submits events without waking us, and
//! wakes us only once the ring is a quarter full; otherwise we drain on a timer. This
//! keeps the reader from generating the very scheduler events it reads.

use std::{os::fd::AsFd, sync::atomic::Ordering, time::Duration};

use aya::maps::{MapData, RingBuf};
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use probe_common::Event;

use crate::os::worker::Worker;

/// How often the ring is drained when the kernel has not asked for it.
pub const DRAIN_INTERVAL: Duration = Duration::from_millis(20);

/// Counts of drained events by kind.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct EventCounts {
    /// All events drained.
    pub total: u64,
    /// sched_switch events.
    pub switch: u64,
    /// sched_wakeup / sched_wakeup_new events.
    pub wakeup: u64,
    /// sys_enter events.
    pub sys_enter: u64,
    /// sys_exit events.
    pub sys_exit: u64,
    /// Ends of runs of `sched_yield` calls, each standing for the exits of its calls.
    pub yield_runs: u64,
    /// Thread exit events.
    pub exit: u64,
}

impl EventCounts {
    fn add(&mut self, e: &Event) {
        use probe_common::event::*;
        self.total += 1;
        match u32::from(e.kind) {
            SWITCH => self.switch += 1,
            WAKEUP => self.wakeup += 1,
            SYS_ENTER => self.sys_enter += 1,
            SYS_EXIT => self.sys_exit += 1,
            YIELDS => self.yield_runs += 1,
            EXIT => self.exit += 1,
            _ => {}
        }
    }
}

/// A background thread draining the ring into a sink.
pub struct Drainer(Worker<(RingBuf<MapData>, EventCounts)>);

impl Drainer {
    /// Starts draining `ring`, passing every event to `sink`.
    pub fn start(
        mut ring: RingBuf<MapData>,
        mut sink: impl FnMut(&Event) + Send + 'static,
    ) -> Self {
        let worker = Worker::spawn("stallscope-ring", move |stop| {
            let mut counts = EventCounts::default();
            let timeout = PollTimeout::try_from(DRAIN_INTERVAL).unwrap_or(PollTimeout::NONE);
            loop {
                let stopping = stop.load(Ordering::Acquire);
                {
                    let mut fds = [PollFd::new(ring.as_fd(), PollFlags::POLLIN)];
                    let _ = poll(&mut fds, if stopping { PollTimeout::ZERO } else { timeout });
                }
                while let Some(item) = ring.next() {
                    if item.len() >= size_of::<Event>() {
                        // SAFETY: the kernel writes whole `Event`s; read unaligned.
                        let e = unsafe { (item.as_ptr() as *const Event).read_unaligned() };
                        counts.add(&e);
                        sink(&e);
                    }
                }
                if stopping {
                    return (ring, counts);
                }
            }
        })
        .expect("spawning the ring drainer thread");
        Self(worker)
    }

    /// Asks the thread to drain what is left and stop, without waiting for it.
    pub fn request_stop(&self) {
        self.0.request_stop();
    }

    /// Whether the thread has stopped ([`Drainer::stop`] returns at once then).
    pub fn is_finished(&self) -> bool {
        self.0.is_finished()
    }

    /// Drains what is left, stops the thread, and gives the ring back with the counts.
    pub fn stop(self) -> (RingBuf<MapData>, EventCounts) {
        self.0.stop().expect("ring drainer thread panicked")
    }
}
