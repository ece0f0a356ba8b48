//! Engine iterations from the Python plane's records: one per call of the profile's anchor
//! function, with the workload fields of the anchor and of the phases that ran inside it on
//! the same thread. Records of one thread arrive in exit order (one ring lane per thread), so
//! an iteration's phases always come before its anchor.
//!
//! A pipelined loop (vLLM's batch queue) has anchor calls that only queue a batch: with
//! [`AnchorFunc::completes_with`], such a call is not an iteration; its start opens the one
//! that finishes the next batch.
//!
//! A loop that launches a batch in one call and processes its result in a later one (SGLang's
//! `run_batch`, then `process_batch_result`) has anchor calls that each launch a batch: with
//! [`AnchorFunc::closed_by`], the iteration runs from the launch to the end of the call that
//! processed the batch, paired in order per thread (SGLang's overlap loop processes a batch
//! after launching the next one, so its iterations overlap in time).

use std::collections::{BTreeMap, HashMap, VecDeque};

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
    /// Per thread, the batches launched by an anchor with `closed_by`, oldest first.
    launched: HashMap<u64, VecDeque<Launched>>,
    stages: StageClassifier,
}

/// A batch an anchor call launched, waiting for the call that processes its result.
struct Launched {
    anchor: usize,
    start_ns: u64,
    fields: BTreeMap<String, i64>,
}

/// Batches in flight per thread beyond which the oldest is dropped (SGLang's overlap loop has
/// two): a launch whose result processing the probes never see must not grow the queue.
const MAX_LAUNCHED: usize = 16;

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
            launched: HashMap::new(),
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
        if self
            .anchors
            .iter()
            .any(|a| a.closed_by.as_ref() == Some(&call.func))
        {
            return self.close(&call);
        }
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
        // A pipelined call that finished a batch may first have dispatched the next one,
        // which shares the pipeline with it: its tokens are those the call's other phases
        // read (the finished batch's are in the `completes_with` phase; its dispatch was in
        // an earlier call). A call dispatches one batch at most, and phases nested in one
        // dispatch (an executor running its worker on the same thread) read the same tokens.
        let mut overlap = 0;
        if let Some(done) = &self.anchors[which].completes_with {
            if !inside.iter().any(|p| p.func == *done) {
                self.opened.insert(call.tid, start_ns);
                return None;
            }
            if let Some(t) = &self.fields.tokens {
                overlap = inside
                    .iter()
                    .filter(|p| p.func != *done)
                    .filter_map(|p| p.args.get(t).copied())
                    .max()
                    .unwrap_or(0);
            }
        }
        if self.anchors[which].closed_by.is_some() {
            let lane = self.launched.entry(call.tid).or_default();
            lane.push_back(Launched {
                anchor: which,
                start_ns,
                fields,
            });
            if lane.len() > MAX_LAUNCHED {
                lane.pop_front();
            }
            return None;
        }
        self.current = which;
        Some(self.iteration(start_ns, call.end_ns, &fields, overlap))
    }

    /// The iteration of the batch `call` processed: the oldest launched on its thread whose
    /// fields agree with the call's (those both read). None when no launch agrees: the batch
    /// was launched before the probes were installed, and pairing it with the next launch
    /// would shift every pair after it. Launches older than the one paired are dropped.
    ///
    /// A missed launch followed by one with the same workload still pairs one batch early
    /// until the workload changes; the probes are installed once per attach.
    fn close(&mut self, call: &Call) -> Option<Iteration> {
        let lane = self.launched.get_mut(&call.tid)?;
        let agrees = |l: &Launched| {
            call.args
                .iter()
                .all(|(k, v)| l.fields.get(k).is_none_or(|x| x == v))
        };
        let at = lane.iter().position(agrees)?;
        let l = lane.drain(..=at).next_back()?;
        self.current = l.anchor;
        Some(self.iteration(l.start_ns, call.end_ns, &l.fields, 0))
    }

    /// The iteration from `start_ns` to `end_ns` with the workload in `fields`, beside
    /// `overlap` tokens of other batches.
    fn iteration(
        &mut self,
        start_ns: u64,
        end_ns: u64,
        fields: &BTreeMap<String, i64>,
        overlap: i64,
    ) -> Iteration {
        let get = |name: &Option<String>| name.as_ref().and_then(|n| fields.get(n)).copied();
        let batch = get(&self.fields.batch);
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
        let stage = self.stages.classify(&hints, start_ns, end_ns);
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
        Iteration {
            start_ns,
            end_ns,
            stage,
            // The live engine exposes the batch's total KV context, not prompt and generated
            // lengths apart: the mean context goes in input_len, so W_kv = B·(L_in + L_out) is
            // the context the attention reads.
            workload: Workload {
                batch: b,
                input_len: context.unwrap_or(0.0) / b,
                output_len: 0.0,
                tokens: t,
                overlap_tokens: overlap as f64,
            },
        }
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
        assert_eq!(it.workload.features(), [4.0, 100.0, 0.0, 400.0, 4.0, 0.0]);
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
            // The worker's phase nested in the dispatch (an executor running it on the same
            // thread) reads the same batch.
            (
                (12, 40),
                vec![
                    ("x:Worker.execute_model", 13, 14, batch(3)),
                    (EXEC, 13, 15, batch(3)),
                    (DONE, 38, 39, batch(2)),
                ],
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
            .map(|i| {
                let w = &i.workload;
                (i.start_ns, i.end_ns, w.batch, w.overlap_tokens)
            })
            .collect();
        // Each batch shares the pipeline with the one its call queued; the last runs alone.
        assert_eq!(
            spans,
            [(10, 40, 2.0, 3.0), (40, 70, 3.0, 4.0), (70, 95, 4.0, 0.0)]
        );
        assert_eq!(a.anchor(), BQ);
        // `step` still makes an iteration of each call.
        a.push(call(EXEC, 101, 102, &batch(1)));
        let it = a
            .push(call("vllm.v1.engine.core:EngineCore.step", 100, 110, &[]))
            .unwrap();
        assert_eq!((it.start_ns, it.end_ns), (100, 110));
        // A loop of one batch at a time has none beside it.
        assert_eq!(it.workload.overlap_tokens, 0.0);
    }

    /// SGLang: `run_batch` launches a batch, `process_batch_result` processes it. The normal
    /// loop processes each batch right after launching it; the overlap loop launches the next
    /// batch first. Either way an iteration runs from a batch's launch to the end of its
    /// processing, with the launch's workload; a processing call whose launch the probes did
    /// not see is no iteration.
    #[test]
    fn a_launched_batch_is_an_iteration_once_its_result_is_processed() {
        const RUN: &str = "sglang.srt.managers.scheduler:Scheduler.run_batch.__wrapped__";
        const PROCESS: &str =
            "sglang.srt.managers.scheduler:Scheduler.process_batch_result.__wrapped__";
        let p = pyframe_tracer::profiles::by_name("sglang").unwrap();
        let anchor = p.anchors();
        assert_eq!(anchor[0].func, RUN);
        assert_eq!(anchor[0].closed_by.as_deref(), Some(PROCESS));
        let (prefill, decode) = (1, 2);
        let batch = |n: i64, mode: i64| vec![("batch", n), ("mode", mode)];
        // (case, calls (function, start, end, fields), iterations (start, end, batch, stage))
        type Case<'a> = (
            &'a str,
            Vec<(&'a str, u64, u64, Vec<(&'a str, i64)>)>,
            Vec<(u64, u64, f64, Stage)>,
        );
        let table: [Case; 3] = [
            (
                "normal loop",
                vec![
                    (RUN, 10, 30, batch(2, prefill)),
                    (PROCESS, 31, 35, batch(2, prefill)),
                    (RUN, 36, 50, batch(2, decode)),
                    (PROCESS, 51, 53, batch(2, decode)),
                ],
                vec![(10, 35, 2.0, Stage::Prefill), (36, 53, 2.0, Stage::Decode)],
            ),
            (
                "overlap loop",
                vec![
                    (RUN, 10, 12, batch(2, prefill)),
                    (RUN, 13, 15, batch(2, decode)),
                    (PROCESS, 16, 30, batch(2, prefill)),
                    (RUN, 31, 33, batch(3, prefill)),
                    (PROCESS, 34, 45, batch(2, decode)),
                    (PROCESS, 46, 60, batch(3, prefill)),
                ],
                vec![
                    (10, 30, 2.0, Stage::Prefill),
                    (13, 45, 2.0, Stage::Decode),
                    (31, 60, 3.0, Stage::Prefill),
                ],
            ),
            (
                "attached between a launch and its processing",
                vec![
                    // The overlap loop: the batch of 4 was launched before the probes were.
                    (RUN, 10, 12, batch(5, decode)),
                    (PROCESS, 13, 20, batch(4, decode)),
                    (RUN, 21, 23, batch(6, decode)),
                    (PROCESS, 24, 30, batch(5, decode)),
                    (PROCESS, 31, 40, batch(6, decode)),
                ],
                vec![(10, 30, 5.0, Stage::Decode), (21, 40, 6.0, Stage::Decode)],
            ),
        ];
        for (name, calls, want) in table {
            let mut a = Assembler::new(p.anchors(), p.iteration.clone());
            let got: Vec<_> = calls
                .into_iter()
                .filter_map(|(f, s, e, args)| a.push(call(f, s, e, &args)))
                .map(|i| (i.start_ns, i.end_ns, i.workload.batch, i.stage))
                .collect();
            assert_eq!(got, want, "{name}");
        }
    }

    /// SGLang's workload: tokens and KV context from `ModelRunner.forward` inside `run_batch`;
    /// a decode forward has no extend count, so its tokens are one per request, whatever the
    /// batch's stale count at launch says.
    #[test]
    fn an_sglang_batch_takes_its_tokens_and_context_from_its_forward() {
        const RUN: &str = "sglang.srt.managers.scheduler:Scheduler.run_batch.__wrapped__";
        const PROCESS: &str =
            "sglang.srt.managers.scheduler:Scheduler.process_batch_result.__wrapped__";
        const FORWARD: &str = "sglang.srt.model_executor.model_runner:ModelRunner.forward";
        let p = pyframe_tracer::profiles::by_name("sglang").unwrap();
        let mut a = Assembler::new(p.anchors(), p.iteration.clone());
        let forward = [
            ("bs", 2),
            ("mode", 1),
            ("seq_lens_sum", 40),
            ("extend_tokens", 40),
        ];
        let launch = [
            ("batch", 2),
            ("mode", 1),
            ("seq_lens_sum", 40),
            ("batch_extend_tokens", 40),
        ];
        assert!(a.push(call(FORWARD, 12, 28, &forward)).is_none());
        assert!(a.push(call(RUN, 10, 30, &launch)).is_none());
        let prefill = a
            .push(call(PROCESS, 31, 35, &[("batch", 2), ("mode", 1)]))
            .unwrap();
        assert_eq!(
            prefill.workload.features(),
            [2.0, 20.0, 0.0, 40.0, 40.0, 0.0]
        );
        let forward = [("bs", 2), ("mode", 2), ("seq_lens_sum", 42)];
        let launch = [("batch", 2), ("mode", 2), ("batch_extend_tokens", 40)];
        assert!(a.push(call(FORWARD, 37, 48, &forward)).is_none());
        assert!(a.push(call(RUN, 36, 50, &launch)).is_none());
        let decode = a
            .push(call(PROCESS, 51, 53, &[("batch", 2), ("mode", 2)]))
            .unwrap();
        assert_eq!(decode.stage, Stage::Decode);
        assert_eq!(decode.workload.tokens, 2.0);
        assert_eq!(decode.workload.input_len * decode.workload.batch, 42.0);
    }
}
