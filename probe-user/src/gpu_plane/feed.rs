//! The GPU plane kept attached for the sentinel: one agent per engine process that has CUPTI
//! loaded, a short buffer of recent GPU events, and per-iteration GPU figures computed once
//! CUPTI has delivered an iteration's records (they arrive up to a flush period late).
//! Captures in progress get a copy of every event (the tap), so a deep dive of the engine
//! needs no second agent. The agents trace the configured share of the time
//! ([`Sampling`]), all of it while a tap is on; an iteration gets figures only when every
//! agent traced the whole of it.

use std::collections::{BTreeMap, HashMap, VecDeque};

use cupti_sys::sampling::Sampling;

use super::{summary, traced::Traced, GpuEvent, GpuPlane};

/// How long after an iteration's end its GPU records are taken as complete (the agent
/// flushes every 200 ms; kernels are delivered once finished).
const SETTLE_NS: u64 = 600_000_000;
/// Events older than this before the oldest pending iteration are dropped.
const KEEP_NS: u64 = 2_000_000_000;
/// Iterations waiting for their GPU records, at most (older ones are given up).
const MAX_PENDING: usize = 4096;

/// Recent events of one engine process, with the start of each API call by correlation id
/// (kept as events arrive, so an iteration's figures need no pass over the buffer to build it).
#[derive(Default)]
struct Recent {
    events: VecDeque<GpuEvent>,
    api_start: HashMap<u32, u64>,
    traced: Traced,
}

/// The engine's GPU agents and what they delivered.
pub struct GpuFeed {
    planes: Vec<GpuPlane>,
    /// Per plane, in the same order.
    recent: Vec<Recent>,
    pending: VecDeque<(u64, u64)>,
    tap: Option<BTreeMap<u32, Vec<GpuEvent>>>,
    scratch: Vec<GpuEvent>,
    sampling: Sampling,
}

impl GpuFeed {
    /// Attaches an agent to every process of `pid`'s tree that has libcupti mapped, each
    /// tracing `sampling`; the error says why there is none.
    pub fn attach(pid: u32, sampling: Sampling) -> Result<GpuFeed, String> {
        let (planes, failed) = super::attach_tree(pid, sampling).map_err(|e| format!("{e:#}"))?;
        if planes.is_empty() {
            return Err(failed.join("; "));
        }
        Ok(GpuFeed {
            recent: planes.iter().map(|_| Recent::default()).collect(),
            planes,
            pending: VecDeque::new(),
            tap: None,
            scratch: Vec::new(),
            sampling,
        })
    }

    /// One line for the status: the traced processes, their CUPTI versions and how CUPTI is
    /// held.
    pub fn describe(&self) -> String {
        let procs: Vec<String> = self
            .planes
            .iter()
            .map(|g| {
                let held = g.subscription().map_or("", |m| match m {
                    cupti_sys::subscription::Mode::Shared => ", shared",
                    _ => ", exclusive",
                });
                format!("{} (CUPTI {}{held})", g.pid(), g.cupti_version())
            })
            .collect();
        let sampled = if self.sampling.always() {
            String::new()
        } else {
            format!(", tracing {}", self.sampling)
        };
        format!("on: {}{sampled}", procs.join(", "))
    }

    /// Moves new events in (and into the tap).
    pub fn poll(&mut self) {
        for (g, recent) in self.planes.iter_mut().zip(&mut self.recent) {
            self.scratch.clear();
            g.poll(&mut self.scratch);
            if let Some(tap) = &mut self.tap {
                tap.entry(g.pid())
                    .or_default()
                    .extend(self.scratch.iter().cloned());
            }
            for e in self.scratch.drain(..) {
                match e.event {
                    cupti_sys::channel::Event::Api(a) => {
                        summary::note_api_start(&mut recent.api_start, a.correlation_id, a.start)
                    }
                    cupti_sys::channel::Event::Tracing { .. } => {
                        recent.traced.take(&e.event);
                        continue;
                    }
                    _ => {}
                }
                recent.events.push_back(e);
            }
        }
    }

    /// Queues an iteration for its GPU figures.
    pub fn iteration(&mut self, start_ns: u64, end_ns: u64) {
        if self.pending.len() == MAX_PENDING {
            self.pending.pop_front();
        }
        self.pending.push_back((start_ns, end_ns));
    }

    /// The GPU figures of every queued iteration whose records have settled by `now_ns`.
    pub fn settled(&mut self, now_ns: u64) -> Vec<summary::IterationGpu> {
        let mut out = Vec::new();
        while let Some(&(start, end)) = self.pending.front() {
            if end + SETTLE_NS > now_ns {
                break;
            }
            self.pending.pop_front();
            // Not traced all through by every agent: no figures rather than wrong ones.
            if !self.recent.iter().all(|r| r.traced.covers(start, end)) {
                continue;
            }
            out.push(summary::iteration(
                self.recent.iter().map(|r| (&r.events, &r.api_start)),
                start,
                end,
            ));
        }
        let horizon = self
            .pending
            .front()
            .map_or(now_ns.saturating_sub(SETTLE_NS), |p| p.0)
            .saturating_sub(KEEP_NS);
        for r in &mut self.recent {
            r.events.retain(|e| event_end(e) >= horizon);
            r.api_start.retain(|_, start| *start >= horizon);
            r.traced.forget_before(horizon);
        }
        out
    }

    /// Starts copying every event for a capture, tracing all the time until it stops.
    pub fn start_tap(&mut self) {
        self.tap = Some(BTreeMap::new());
        for g in &self.planes {
            g.set_sampling(Sampling::ALWAYS);
        }
    }

    /// The events copied since the last call, per process (the tap stays on).
    pub fn drain_tap(&mut self) -> BTreeMap<u32, Vec<GpuEvent>> {
        self.tap.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Stops copying; back to the configured sampling.
    pub fn stop_tap(&mut self) {
        self.tap = None;
        for g in &self.planes {
            g.set_sampling(self.sampling);
        }
    }

    /// Detaches every agent; returns what went wrong, if anything.
    pub fn detach(self) -> Vec<String> {
        super::detach_all(self.planes, &mut BTreeMap::new())
    }
}

fn event_end(e: &GpuEvent) -> u64 {
    use cupti_sys::channel::Event;
    match e.event {
        Event::Kernel { end, .. } => end,
        Event::Memcpy(m) => m.end,
        Event::Memset(m) => m.end,
        Event::Api(a) => a.end,
        Event::Synchronization(s) => s.end,
        _ => 0,
    }
}
