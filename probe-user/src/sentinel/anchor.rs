//! Where an engine's iterations come from: its profile's anchor function, or, for an engine
//! without a profile, the anchor discovered among the watched calls (the most frequent call
//! with a stable duration, LatencyPrism §4.2.1). No iteration is counted while discovering.

use std::{
    collections::HashMap,
    time::{Duration, Instant},
};

use log::info;
use model::{
    anchor::{discover_in, MAX_CV},
    Iteration,
};
use pyframe_tracer::{
    profiles::{AnchorFunc, IterationFields},
    Call,
};

use super::iterations::Assembler;

/// How long an engine without a profile anchor is watched before the anchor is chosen.
const DISCOVERY_WINDOW: Duration = Duration::from_secs(10);

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
    /// The profile's `anchors`, or discovery when there is none.
    pub fn new(pid: u32, anchors: Vec<AnchorFunc>, fields: IterationFields) -> Anchor {
        if anchors.is_empty() {
            info!("engine {pid}: no profile anchor; discovering it from call frequency and duration stability over {DISCOVERY_WINDOW:?}");
            Anchor::discovering(fields)
        } else {
            Anchor::Known(Assembler::new(anchors, fields))
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
        let found = discover_in(seen.iter().map(|(f, d)| (f.as_str(), d.as_slice())), MAX_CV);
        let fields = std::mem::take(fields);
        *self = match found {
            Some(s) => {
                info!(
                    "engine {pid}: anchor discovered: {} ({} calls, mean {:.1} ms, cv {:.2})",
                    s.func,
                    s.calls,
                    s.mean_ns / 1e6,
                    s.cv
                );
                Anchor::Known(Assembler::new(vec![AnchorFunc::plain(&s.func)], fields))
            }
            None => Anchor::discovering(fields),
        };
    }
}
