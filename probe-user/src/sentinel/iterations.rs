//! Engine iterations from the Python plane's records: one per call of the profile's anchor
//! function, with the workload fields of the anchor and of the phases that ran inside it on
//! the same thread. Records of one thread arrive in exit order (one ring lane per thread), so
//! an iteration's phases always come before its anchor.
//!
//! A pipelined loop (vLLM's batch queue) has anchor calls that only queue a batch: with
//! [`AnchorFunc::completes_with`], such a call is not an iteration; its start opens the one
//! that finishes the next batch.

use std::collections::{BTreeMap, HashMap};

use model::{
    stage::{StageClassifier, StageHints},
    Iteration, Stage, Workload,
};
use pyframe_tracer::{
    profiles::{AnchorFunc, IterationFields},
    session::Call,
};

/// Turns calls into iterations.
pub struct Assembler {
    /// The profile's anchors; an engine runs one of them.
    anchors: Vec<AnchorFunc>,
    /// The anchor whose calls last made an iteration (the first until one does).
    current: usize,
    fields: IterationFields,
    /// Phase calls per thread, waiting for their anchor.
    pending: HashMap<u64, Vec<Call>>,
    /// Per thread, the start of anchor calls that queued work without finishing any.
    opened: HashMap<u64, u64>,
    stages: StageClassifier,
}

/// An engine idle longer than this before an iteration without workload fields is taken to
/// have received new requests (a prefill).
const IDLE_GAP_NS: u64 = 200_000_000;

impl Assembler {
    /// Iterations of `anchors` (at least one), workload named by `fields`.
    pub fn new(anchors: Vec<AnchorFunc>, fields: IterationFields) -> Self {
        assert!(!anchors.is_empty(), "an assembler needs an anchor");
        Self {
            anchors,
            current: 0,
            fields,
            pending: HashMap::new(),
            opened: HashMap::new(),
            stages: StageClassifier::new(IDLE_GAP_NS),
        }
    }

    /// The anchor function the engine runs (the first of the profile's until one made an
    /// iteration).
    pub fn anchor(&self) -> &str {
        &self.anchors[self.current].func
    }

    /// Feeds one call; returns the iteration it completes, if it is an anchor call that did
    /// work (with `require_batch`, an anchor call without a batch is the engine loop running
    /// idle, not an iteration) and, for a pipelined anchor, finished a batch.
    pub fn push(&mut self, call: Call) -> Option<Iteration> {
        let Some(which) = self.anchors.iter().position(|a| a.func == call.func) else {
            let lane = self.pending.entry(call.tid).or_default();
            lane.push(call);
            // Bound the buffer of a thread that never runs the anchor.
            if lane.len() > 4096 {
                lane.drain(..2048);
            }
            return None;
        };
        let phases = self.pending.remove(&call.tid).unwrap_or_default();
        let inside: Vec<&Call> = phases
            .iter()
            .filter(|p| p.start_ns >= call.start_ns && p.end_ns <= call.end_ns)
            .collect();
        let start_ns = self
            .opened
            .remove(&call.tid)
            .unwrap_or(call.start_ns)
            .min(call.start_ns);
        // Fields of the anchor, then of its phases (a phase wins over the anchor).
        let mut fields: BTreeMap<String, i64> = call.args.clone();
        for p in &inside {
            fields.extend(p.args.iter().map(|(k, v)| (k.clone(), *v)));
        }
        let get = |name: &Option<String>| name.as_ref().and_then(|n| fields.get(n)).copied();
        let batch = get(&self.fields.batch);
        if self.fields.require_batch && batch.is_none_or(|b| b <= 0) {
            return None;
        }
        if let Some(done) = &self.anchors[which].completes_with {
            if !inside.iter().any(|p| p.func == *done) {
                self.opened.insert(call.tid, start_ns);
                return None;
            }
        }
        self.current = which;
        let tokens = get(&self.fields.tokens);
        let mode = get(&self.fields.mode).and_then(|m| {
            if self.fields.decode_modes.contains(&m) {
                Some(Stage::Decode)
            } else if self.fields.prefill_modes.contains(&m) {
                Some(Stage::Prefill)
            } else if self.fields.mixed_modes.contains(&m) {
                Some(Stage::Mixed)
            } else {
                None
            }
        });
        let hints = StageHints {
            batch,
            tokens,
            new_requests: get(&self.fields.new_requests),
            mode,
        };
        let stage = self.stages.classify(&hints, start_ns, call.end_ns);
        let b = batch.unwrap_or(1).max(1) as f64;
        let t = tokens.map_or(b, |t| t as f64);
        let context = get(&self.fields.context_tokens).map(|c| {
            c as f64
                + if self.fields.context_excludes_step {
                    t
                } else {
                    0.0
                }
        });
        Some(Iteration {
            start_ns,
            end_ns: call.end_ns,
            stage,
            // The live engine exposes the batch's total KV context, not prompt and generated
            // lengths apart: the mean context goes in input_len, so W_kv = B·(L_in + L_out) is
            // the context the attention reads.
            workload: Workload {
                batch: b,
                input_len: context.unwrap_or(0.0) / b,
                output_len: 0.0,
                tokens: t,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(func: &str, start: u64, end: u64, args: &[(&str, i64)]) -> Call {
        Call {
            func: func.into(),
            tid: 7,
            start_ns: start,
            end_ns: end,
            args: args.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
            exception: false,
        }
    }

    fn vllm() -> Assembler {
        let p = pyframe_tracer::profiles::by_name("vllm").unwrap();
        Assembler::new(p.anchors(), p.iteration)
    }

    #[test]
    fn phases_inside_the_anchor_give_its_workload() {
        let mut a = vllm();
        let exec = [
            ("batch", 4),
            ("tokens", 4),
            ("new_reqs", 0),
            ("kv_tokens", 396),
        ];
        assert!(a
            .push(call("x:MultiprocExecutor.execute_model", 10, 90, &exec))
            .is_none());
        let it = a
            .push(call("vllm.v1.engine.core:EngineCore.step", 5, 100, &[]))
            .unwrap();
        assert_eq!(it.stage, Stage::Decode);
        assert_eq!(it.workload.features(), [4.0, 100.0, 0.0, 400.0, 4.0]);
        assert_eq!((it.start_ns, it.end_ns), (5, 100));
    }

    #[test]
    fn idle_polls_and_stale_phases_are_not_iterations() {
        let mut a = vllm();
        assert!(a
            .push(call("vllm.v1.engine.core:EngineCore.step", 5, 6, &[]))
            .is_none());
        // A phase from before the anchor started does not count.
        a.push(call(
            "x:p",
            1,
            2,
            &[("batch", 3), ("tokens", 300), ("new_reqs", 3)],
        ));
        assert!(a
            .push(call("vllm.v1.engine.core:EngineCore.step", 10, 20, &[]))
            .is_none());
        a.push(call(
            "x:p",
            31,
            39,
            &[("batch", 3), ("tokens", 300), ("new_reqs", 3)],
        ));
        let it = a
            .push(call("vllm.v1.engine.core:EngineCore.step", 30, 40, &[]))
            .unwrap();
        assert_eq!(it.stage, Stage::Prefill);
    }

    /// vLLM's batch queue with two batches in flight: the first call only queues B1; each
    /// later one queues the next batch and finishes the oldest. Iterations are the calls that
    /// finished a batch, the first one from the queueing call's start, each with the finished
    /// batch's workload.
    #[test]
    fn a_batch_queue_call_that_only_queued_opens_the_next_iteration() {
        const BQ: &str = "vllm.v1.engine.core:EngineCore.step_with_batch_queue";
        const EXEC: &str = "x:MultiprocExecutor.execute_model";
        const DONE: &str = "vllm.v1.core.sched.scheduler:Scheduler.update_from_output";
        let mut a = vllm();
        let batch = |n: i64| [("batch", n), ("tokens", n), ("kv_tokens", 100 * n)];
        let mut got = Vec::new();
        let calls = [
            // (call, phases inside it)
            ((10, 12), vec![(EXEC, 11, 12, batch(2))]),
            (
                (12, 40),
                vec![(EXEC, 13, 14, batch(3)), (DONE, 38, 39, batch(2))],
            ),
            (
                (40, 70),
                vec![(EXEC, 41, 42, batch(4)), (DONE, 68, 69, batch(3))],
            ),
            // The queue empties: the last batch finishes, nothing new is queued.
            ((70, 95), vec![(DONE, 93, 94, batch(4))]),
            // Idle: no batch anywhere.
            ((95, 96), vec![]),
        ];
        for ((start, end), phases) in calls {
            for (f, s, e, args) in phases {
                assert!(a.push(call(f, s, e, &args)).is_none());
            }
            got.extend(a.push(call(BQ, start, end, &[])));
        }
        let spans: Vec<_> = got
            .iter()
            .map(|i| (i.start_ns, i.end_ns, i.workload.batch))
            .collect();
        assert_eq!(spans, [(10, 40, 2.0), (40, 70, 3.0), (70, 95, 4.0)]);
        assert_eq!(a.anchor(), BQ);
        // `step` still makes an iteration of each call.
        a.push(call(EXEC, 101, 102, &batch(1)));
        let it = a
            .push(call("vllm.v1.engine.core:EngineCore.step", 100, 110, &[]))
            .unwrap();
        assert_eq!((it.start_ns, it.end_ns), (100, 110));
    }
}
