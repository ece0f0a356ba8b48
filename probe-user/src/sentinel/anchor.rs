//! Where an engine's iterations come from: its profile's anchor function, or, for an engine
//! without a profile, the anchor discovered among the watched calls (the most frequent call
//! with a stable duration, LatencyPrism §4.2.1). No iteration is counted while discovering.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use log::info;
use model::{
    anchor::{discover, CallStats},
    Iteration,
};
use pyframe_tracer::{profiles::IterationFields, Call};

use super::iterations::Assembler;

/// How long an engine without a profile anchor is watched before the anchor is chosen.
pub const DISCOVERY_WINDOW: Duration = Duration::from_secs(10);

/// Calls a candidate needs in the window, and the shortest mean duration (ns) it may have (an
/// iteration runs a model forward, not a helper), to be chosen.
const MIN_CALLS: u64 = 20;
const MIN_MEAN_NS: f64 = 5e5;

/// The anchor of one engine.
pub enum Anchor {
    /// Known: calls become iterations.
    Known(Assembler),
    /// Being discovered: call durations per function since `since`.
    Discovering {
        since: Instant,
        seen: HashMap<String, Vec<u64>>,
        fields: IterationFields,
    },
}

impl Anchor {
    /// The profile's anchor `func`, or discovery when there is none.
    pub fn new(pid: u32, func: Option<String>, fields: IterationFields) -> Anchor {
        match func {
            Some(f) => Anchor::Known(Assembler::new(&f, fields)),
            None => {
                info!("engine {pid}: no profile anchor; discovering it from call frequency and duration stability over {DISCOVERY_WINDOW:?}");
                Anchor::discovering(fields)
            }
        }
    }

    fn discovering(fields: IterationFields) -> Anchor {
        Anchor::Discovering {
            since: Instant::now(),
            seen: HashMap::new(),
            fields,
        }
    }

    /// Feeds one call; the iteration it completes, if any.
    pub fn push(&mut self, call: Call) -> Option<Iteration> {
        match self {
            Anchor::Known(a) => a.push(call),
            Anchor::Discovering { seen, .. } => {
                seen.entry(call.func.clone())
                    .or_default()
                    .push(call.end_ns.saturating_sub(call.start_ns));
                None
            }
        }
    }

    /// The anchor function, once known.
    pub fn func(&self) -> Option<&str> {
        match self {
            Anchor::Known(a) => Some(a.anchor()),
            Anchor::Discovering { .. } => None,
        }
    }

    /// Picks the anchor once the discovery window is over; an idle engine (nothing
    /// iteration-like yet) is looked at again over the next window.
    pub fn settle(&mut self, pid: u32) {
        let Anchor::Discovering {
            since,
            seen,
            fields,
        } = self
        else {
            return;
        };
        if since.elapsed() < DISCOVERY_WINDOW {
            return;
        }
        let stats: Vec<CallStats> = seen
            .iter()
            .map(|(f, d)| CallStats::from_durations(f, d))
            .collect();
        let fields = std::mem::take(fields);
        *self = match discover(&stats, MIN_CALLS, MIN_MEAN_NS) {
            Some(i) => {
                info!(
                    "engine {pid}: anchor discovered: {} ({} calls, mean {:.1} ms, cv {:.2})",
                    stats[i].func,
                    stats[i].calls,
                    stats[i].mean_ns / 1e6,
                    stats[i].cv
                );
                Anchor::Known(Assembler::new(&stats[i].func, fields))
            }
            None => Anchor::discovering(fields),
        };
    }
}
