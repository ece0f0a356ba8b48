//! The sentinel's per-iteration loop: warm up on healthy decode iterations, fit, then
//! predict each iteration, track its error against the UCL, and refit periodically on
//! iterations that were not under alert. Fitting itself is left to the caller
//! ([`Sentinel::take_training`] / [`Sentinel::install`]) so it can run off the hot path.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{
    baseline::{positive_error, Baseline, BaselineParams, Fingerprint, Sample},
    detector::{Detector, DetectorParams, Span, Step, Transition},
    features::Workload,
    recalibration::Recalibration,
    stage::Stage,
};

/// Sentinel parameters.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SentinelParams {
    /// Regressor and UCL.
    pub baseline: BaselineParams,
    /// Moving window and hysteresis.
    pub detector: DetectorParams,
    /// Healthy iterations collected before the first fit.
    pub warmup_samples: usize,
    /// Refit once the healthy iterations since the last fit are as many as that fit's
    /// training set (so the set doubles: 1,000, 2,000, 4,000 after a 1,000-sample warm-up),
    /// and at most after this many (0: never refit).
    pub refit_every: usize,
    /// Training set cap (the most recent healthy iterations).
    pub max_training_samples: usize,
    /// Once the training set is full, the time it spans at least, ms (0: the most recent
    /// iterations only): a healthy iteration joins it only `training_span_ms /
    /// max_training_samples` after the last one that did. Counted in iterations alone, a fast
    /// engine's set spans seconds (20,000 steps of 1 ms: 20 s) and is refitted every few
    /// seconds, so a slowdown under the alert threshold that lasts that long becomes most of
    /// what the model learns and its UCL grows with it (an H200 loop's rose 0.155 -> 0.424 over
    /// a 24 s PCIe injection, BENCHMARKS.md); spanning minutes, such a slowdown stays a small
    /// share, and refits come minutes apart. Below the cap every iteration joins, so the
    /// warm-up and the first refits are as quick as the engine.
    pub training_span_ms: u64,
    /// Also model and alert on prefill and mixed iterations (default: decode only).
    pub alert_on_prefill: bool,
    /// Scale the model's predictions by the median observed/predicted ratio of the healthy
    /// iterations of this recent span (a count or a time; `Iterations(0)`: off); see
    /// [`Recalibration`].
    pub recalibrate_over: Span,
    /// Bound of that scale: within `[1, 1+max]`.
    pub recalibrate_max: f64,
    /// While no alert is open, an iteration of a batch the model was not fitted on (a size
    /// outside its range, or a pipelined batch that ran alone where training only had batches
    /// sharing the pipeline, or the reverse: [`crate::baseline::Coverage`]) is not judged but
    /// learned (a tree ensemble predicts it as the nearest batch it saw), and a refit is due
    /// once this many have been (0: judge every batch).
    pub learn_unseen_batches: usize,
}

impl Default for SentinelParams {
    fn default() -> Self {
        Self {
            baseline: BaselineParams::default(),
            detector: DetectorParams::default(),
            warmup_samples: 1000,
            refit_every: 5000,
            max_training_samples: 20_000,
            training_span_ms: 0,
            alert_on_prefill: false,
            recalibrate_over: Span::Iterations(0),
            recalibrate_max: 0.2,
            learn_unseen_batches: 100,
        }
    }
}

/// One engine iteration as the sentinel sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Iteration {
    /// CLOCK_MONOTONIC ns.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC ns.
    pub end_ns: u64,
    /// Prefill, decode or mixed.
    pub stage: Stage,
    /// What it computed.
    pub workload: Workload,
}

impl Iteration {
    /// Duration, µs.
    pub fn duration_us(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e3
    }
}

/// The sentinel's judgement of one iteration.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Verdict {
    /// Predicted duration, µs (once fitted, for modelled stages).
    pub predicted_us: Option<f64>,
    /// E = max(0, (y − ŷ)/(y + ε)).
    pub error: Option<f64>,
    /// Moving mean of E over the window.
    pub moving_mean: Option<f64>,
    /// The window's summed durations over its summed predictions.
    pub window_slowdown: Option<f64>,
    /// The threshold the moving mean was compared with: the UCL, or `min_slowdown`'s error
    /// when that is larger.
    pub ucl: Option<f64>,
    /// An alert started with this iteration.
    pub alert_started: bool,
    /// An alert ended with this iteration.
    pub alert_ended: bool,
    /// Not judged: its batch is unlike the model's training batches (see
    /// [`SentinelParams::learn_unseen_batches`]); it is learned instead.
    pub unseen_batch: bool,
}

/// Where the model stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelState {
    /// Collecting healthy samples before the first fit.
    Warming,
    /// The first fit is running; nothing predicts yet.
    Fitting,
    /// A model predicts (a refit may be running beside it: [`Sentinel::refitting`]).
    Fitted,
}

/// Per-engine sentinel state.
#[derive(Debug)]
pub struct Sentinel {
    params: SentinelParams,
    fingerprint: Fingerprint,
    baseline: Option<Baseline>,
    detector: Detector,
    training: VecDeque<Sample>,
    /// Recent healthy samples (with the model's uncalibrated prediction, none for an unseen
    /// batch) held back for one window: if an alert starts, they were probably already
    /// abnormal and never reach the training set or the recalibration.
    pending: VecDeque<(Sample, Option<f64>, u64)>,
    /// End of the last iteration that joined the training set.
    last_trained_ns: Option<u64>,
    recalibration: Recalibration,
    since_fit: usize,
    /// Iterations of an unseen batch since the last fit started.
    unseen_since_fit: usize,
    /// Samples the current model was fitted on.
    fitted_on: usize,
    fitting: bool,
}

impl Sentinel {
    /// A sentinel for `fingerprint`, starting from a persisted baseline if there is one.
    pub fn new(
        params: SentinelParams,
        fingerprint: Fingerprint,
        baseline: Option<Baseline>,
    ) -> Self {
        Self {
            detector: Detector::new(params.detector),
            params,
            fingerprint,
            fitted_on: baseline.as_ref().map_or(0, |b| b.samples),
            baseline,
            training: VecDeque::new(),
            pending: VecDeque::new(),
            last_trained_ns: None,
            recalibration: Recalibration::new(params.recalibrate_over, params.recalibrate_max),
            since_fit: 0,
            unseen_since_fit: 0,
            fitting: false,
        }
    }

    /// Whether iterations of `stage` are modelled and alerted on.
    pub fn models(&self, stage: Stage) -> bool {
        stage == Stage::Decode || self.params.alert_on_prefill
    }

    /// Judges one iteration and updates the alert state and the training set.
    pub fn observe(&mut self, it: &Iteration) -> Verdict {
        if !self.models(it.stage) {
            return Verdict::default();
        }
        let sample = Sample {
            workload: it.workload,
            duration_us: it.duration_us(),
        };
        if sample.duration_us <= 0.0 {
            return Verdict::default();
        }
        let Some(b) = &self.baseline else {
            self.add_training(sample, it.end_ns);
            return Verdict::default();
        };
        // An open alert keeps judging them: it can only end on verdicts.
        let unseen = self.params.learn_unseen_batches > 0
            && !self.detector.active()
            && !b.covers(&it.workload);
        if unseen {
            self.unseen_since_fit += 1;
            self.hold_back(sample, None, it.end_ns);
            return Verdict {
                unseen_batch: true,
                ..Verdict::default()
            };
        }
        let raw = b.predict(&it.workload);
        let predicted = raw * self.recalibration.factor();
        let error = positive_error(sample.duration_us, predicted, b.epsilon_us);
        let ucl = b.ucl.limit;
        let step = Step {
            end_ns: it.end_ns,
            observed_us: sample.duration_us,
            predicted_us: predicted,
            error,
        };
        let (window, t) = self.detector.push(step, ucl);
        if t == Transition::Started {
            self.pending.clear();
        }
        if !self.detector.active() {
            self.hold_back(sample, Some(raw), it.end_ns);
        }
        Verdict {
            predicted_us: Some(predicted),
            error: Some(error),
            moving_mean: window.map(|w| w.mean_error),
            window_slowdown: window.map(|w| w.slowdown),
            ucl: Some(self.params.detector.threshold(ucl)),
            alert_started: t == Transition::Started,
            alert_ended: t == Transition::Ended,
            unseen_batch: false,
        }
    }

    /// Holds a healthy sample (with the model's uncalibrated prediction `raw`) back for one
    /// window, and passes on those older than that to the training set and, where the model
    /// judged them, to the recalibration.
    fn hold_back(&mut self, sample: Sample, raw: Option<f64>, end_ns: u64) {
        self.pending.push_back((sample, raw, end_ns));
        while self
            .pending
            .front()
            .is_some_and(|(_, _, first)| !self.detector.holds(*first, end_ns, self.pending.len()))
        {
            let (s, raw, end_ns) = self.pending.pop_front().expect("non-empty");
            if let Some(raw) = raw {
                self.recalibration.push(end_ns, s.duration_us, raw);
            }
            self.add_training(s, end_ns);
        }
    }

    /// Adds a healthy sample that ended at `end_ns`, unless the set is full and the last one
    /// joined less than its share of `training_span_ms` before.
    fn add_training(&mut self, s: Sample, end_ns: u64) {
        let cap = self.params.max_training_samples.max(1);
        let stride_ns = self.params.training_span_ms * 1_000_000 / cap as u64;
        if self.training.len() >= cap
            && self
                .last_trained_ns
                .is_some_and(|last| end_ns < last.saturating_add(stride_ns))
        {
            return;
        }
        self.last_trained_ns = Some(end_ns);
        self.training.push_back(s);
        self.since_fit += 1;
        while self.training.len() > self.params.max_training_samples.max(1) {
            self.training.pop_front();
        }
    }

    /// Whether a (re)fit should start now. Refits come sooner while the model was fitted on
    /// few samples: the first minutes of load do not span the workload the engine settles
    /// into (contexts grow as requests run), and a tree ensemble does not extrapolate, so a
    /// model fitted on the warm-up alone predicts the settled load low.
    pub fn fit_due(&self) -> bool {
        if self.fitting || self.detector.active() {
            return false;
        }
        let learn = self.params.learn_unseen_batches;
        match self.baseline {
            None => self.training.len() >= self.params.warmup_samples,
            Some(_) => {
                (self.params.refit_every > 0 && self.since_fit >= self.next_refit())
                    || (learn > 0 && self.unseen_since_fit >= learn)
            }
        }
    }

    /// New healthy iterations after which the next refit is due.
    fn next_refit(&self) -> usize {
        let doubled = self.fitted_on.max(self.params.warmup_samples).max(1);
        self.params.refit_every.min(doubled)
    }

    /// Hands out the training set for a fit and marks one as running.
    pub fn take_training(&mut self) -> Vec<Sample> {
        self.fitting = true;
        self.since_fit = 0;
        self.unseen_since_fit = 0;
        self.fitted_on = self.training.len();
        self.training.iter().copied().collect()
    }

    /// Installs a freshly fitted baseline.
    pub fn install(&mut self, baseline: Baseline) {
        self.baseline = Some(baseline);
        self.fitting = false;
        self.detector.reset_window();
        self.recalibration.reset();
    }

    /// The factor the model's predictions are scaled by now (1: none).
    pub fn recalibration(&self) -> f64 {
        self.recalibration.factor()
    }

    /// A fit failed; the previous state stays (it is retried after the next batch of samples).
    pub fn fit_failed(&mut self) {
        self.fitting = false;
    }

    /// Where the model stands.
    pub fn state(&self) -> ModelState {
        match (self.fitting, &self.baseline) {
            (_, Some(_)) => ModelState::Fitted,
            (true, None) => ModelState::Fitting,
            (false, None) => ModelState::Warming,
        }
    }

    /// Whether a refit runs while the current model predicts.
    pub fn refitting(&self) -> bool {
        self.fitting && self.baseline.is_some()
    }

    /// The current baseline.
    pub fn baseline(&self) -> Option<&Baseline> {
        self.baseline.as_ref()
    }

    /// Healthy samples held for training.
    pub fn training_samples(&self) -> usize {
        self.training.len()
    }

    /// Whether an alert is open.
    pub fn alerting(&self) -> bool {
        self.detector.active()
    }

    /// What the models are fitted for.
    pub fn fingerprint(&self) -> &Fingerprint {
        &self.fingerprint
    }

    /// The parameters.
    pub fn params(&self) -> &SentinelParams {
        &self.params
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn it(t: u64, batch: f64, ctx: f64, slow: f64) -> Iteration {
        let dur_us = (20_000.0 + 300.0 * batch + 0.05 * batch * ctx) * slow;
        Iteration {
            start_ns: t,
            end_ns: t + (dur_us * 1e3) as u64,
            stage: Stage::Decode,
            workload: Workload {
                batch,
                input_len: ctx,
                output_len: 0.0,
                tokens: batch,
                overlap_tokens: 0.0,
            },
        }
    }

    fn fp() -> Fingerprint {
        Fingerprint {
            framework: "t".into(),
            model: "m".into(),
            hardware: "h".into(),
        }
    }

    #[test]
    fn warms_up_fits_alerts_and_recovers() {
        let params = SentinelParams {
            warmup_samples: 400,
            refit_every: 0,
            ..SentinelParams::default()
        };
        let mut s = Sentinel::new(params, fp(), None);
        let mut t = 0;
        let mut next = |i: u64, slow: f64, s: &mut Sentinel| {
            t += 50_000_000;
            s.observe(&it(t, (1 + i % 32) as f64, (i * 37 % 900) as f64, slow))
        };
        for i in 0..399 {
            assert_eq!(next(i, 1.0, &mut s), Verdict::default());
        }
        assert!(!s.fit_due());
        next(399, 1.0, &mut s);
        assert!(s.fit_due());
        let data = s.take_training();
        assert_eq!(s.state(), ModelState::Fitting);
        s.install(Baseline::fit(&data, &params.baseline, fp()).unwrap());
        assert_eq!(s.state(), ModelState::Fitted);
        let mut started = None;
        let mut ended = None;
        for i in 0..200u64 {
            let slow = if (50..80).contains(&i) { 1.6 } else { 1.0 };
            let v = next(i + 400, slow, &mut s);
            assert!(v.predicted_us.is_some());
            if v.alert_started {
                assert!(started.is_none(), "one alert per episode");
                started = Some(i);
            }
            if v.alert_ended {
                ended = Some(i);
            }
        }
        let started = started.expect("the slowdown raises an alert");
        assert!((50..56).contains(&started), "alert at {started}");
        assert!(ended.expect("the alert ends") > 80);
        assert!(!s.alerting());
    }

    #[test]
    fn refits_come_as_the_training_set_doubles_then_every_refit_every() {
        let params = SentinelParams {
            warmup_samples: 100,
            refit_every: 500,
            ..SentinelParams::default()
        };
        let mut s = Sentinel::new(params, fp(), None);
        let mut t = 0;
        // New healthy iterations until the next fit is due; each fit is installed.
        let mut until_due = |s: &mut Sentinel| {
            let mut n = 0;
            while !s.fit_due() {
                t += 50_000_000;
                s.observe(&it(t, (1 + n % 8) as f64, (n * 37 % 300) as f64, 1.0));
                n += 1;
                assert!(n <= 10_000, "no fit due");
            }
            let first = s.baseline().is_none();
            let data = s.take_training();
            // A refit leaves the model it replaces predicting; the first fit has none.
            let (state, refitting) = if first {
                (ModelState::Fitting, false)
            } else {
                (ModelState::Fitted, true)
            };
            assert_eq!((s.state(), s.refitting()), (state, refitting));
            s.install(Baseline::fit(&data, &params.baseline, fp()).unwrap());
            assert_eq!((s.state(), s.refitting()), (ModelState::Fitted, false));
            n
        };
        // The warm-up, then as many again as the model was fitted on (the detector's window of
        // 10 holds samples back from the training set before they count), then at most 500.
        let gaps: Vec<u64> = (0..5).map(|_| until_due(&mut s)).collect();
        assert_eq!(gaps[0], 100, "{gaps:?}");
        assert!((100..=110).contains(&gaps[1]), "{gaps:?}");
        assert!((200..=220).contains(&gaps[2]), "{gaps:?}");
        assert!((400..=420).contains(&gaps[3]), "{gaps:?}");
        assert!((500..=510).contains(&gaps[4]), "{gaps:?}");
        // A model loaded from disk counts the samples it was fitted on.
        let b = s.baseline().unwrap().clone();
        let loaded = Sentinel::new(params, fp(), Some(b));
        assert_eq!(loaded.next_refit(), 500);
    }

    #[test]
    fn a_full_training_set_spans_its_time_so_a_fast_engine_refits_minutes_apart() {
        // An engine of ~1 ms steps: healthy for 15 s, then 1.1x slower (under the threshold)
        // for 10 s. Counted in iterations, its set of 2,000 spans 2 s and refits every 500
        // (~0.5 s), learning the slowdown as it goes; spanning 60 s once full (a sample every
        // 30 ms), it refits every ~15 s.
        for (span_ms, refits) in [(0u64, 10..40), (60_000, 0..2)] {
            let params = SentinelParams {
                warmup_samples: 250,
                refit_every: 500,
                max_training_samples: 2000,
                training_span_ms: span_ms,
                // As the daemon's default: no alert under 1.2x.
                detector: DetectorParams {
                    min_slowdown: 1.2,
                    ..DetectorParams::default()
                },
                ..SentinelParams::default()
            };
            let mut s = Sentinel::new(params, fp(), None);
            let (mut t, mut n) = (0u64, 0u64);
            let mut run = |s: &mut Sentinel, until_ns: u64, slow: f64| {
                let mut fits = 0;
                while t < until_ns {
                    let batch = (1 + n % 8) as f64;
                    let dur_ns = ((800.0 + 20.0 * batch) * slow * 1e3) as u64;
                    s.observe(&Iteration {
                        start_ns: t,
                        end_ns: t + dur_ns,
                        stage: Stage::Decode,
                        workload: Workload {
                            batch,
                            input_len: (n * 37 % 300) as f64,
                            output_len: 0.0,
                            tokens: batch,
                            overlap_tokens: 0.0,
                        },
                    });
                    (t, n) = (t + dur_ns, n + 1);
                    if s.fit_due() {
                        let data = s.take_training();
                        s.install(Baseline::fit(&data, &params.baseline, fp()).unwrap());
                        fits += 1;
                    }
                }
                fits
            };
            let sec = 1_000_000_000;
            assert!(
                run(&mut s, 15 * sec, 1.0) >= 4,
                "span {span_ms} ms: warm-up fits"
            );
            assert_eq!(s.training_samples(), 2000);
            let during = run(&mut s, 25 * sec, 1.1);
            assert!(
                refits.contains(&during),
                "span {span_ms} ms: {during} refits during the slowdown"
            );
        }
    }

    /// A pipelined engine's two step modes: batches of 1-7 sharing the pipeline with the
    /// rest of the 8 requests, and all of them in one batch that runs alone, waiting for
    /// every stage: twice as long as the shared steps' trend says, at sizes both modes run
    /// (a request that finishes leaves a batch of 7 alone) and past them (8).
    #[test]
    fn a_batch_the_model_never_saw_is_learned_not_alerted_on() {
        // These durations have no noise: the UCL's floor stands for it.
        let params = SentinelParams {
            warmup_samples: 300,
            refit_every: 0,
            learn_unseen_batches: 60,
            baseline: BaselineParams {
                theta_min: 0.15,
                ..BaselineParams::default()
            },
            ..SentinelParams::default()
        };
        let mut s = Sentinel::new(params, fp(), None);
        let mut t = 0;
        let mut next = |batch: f64, overlap: f64, slow: f64, s: &mut Sentinel| {
            t += 30_000_000;
            let mut i = it(t, batch, 400.0, slow);
            i.workload.overlap_tokens = overlap;
            s.observe(&i)
        };
        for i in 0..300u64 {
            let batch = (1 + i % 7) as f64;
            next(batch, 8.0 - batch, 1.0, &mut s);
        }
        let data = s.take_training();
        s.install(Baseline::fit(&data, &params.baseline, fp()).unwrap());
        // The one-batch mode: not judged, learned; the refit is due after 60 of them.
        let alone = |i: usize| if i.is_multiple_of(2) { 8.0 } else { 7.0 };
        for i in 0..60 {
            assert!(!s.fit_due(), "refit due after {i} unseen iterations");
            let v = next(alone(i), 0.0, 2.0, &mut s);
            assert!(v.unseen_batch && v.predicted_us.is_none(), "{v:?}");
        }
        assert!(s.fit_due());
        assert!(!s.alerting());
        // Held back for one window (10 iterations), then in the training set.
        let data = s.take_training();
        assert_eq!(data.len(), 300 + 50);
        s.install(Baseline::fit(&data, &params.baseline, fp()).unwrap());
        // The refit's UCL leaves out the out-of-fold errors of the batches alone: the folds
        // before the last never saw one, as the first model never judged one.
        assert_eq!(s.baseline().unwrap().ucl.limit, 0.15);
        // Now judged, at their own pace: no alert; slowed by half, an alert.
        let calm = (0..100)
            .map(|i| next(alone(i), 0.0, 2.0, &mut s))
            .collect::<Vec<_>>();
        assert!(calm
            .iter()
            .all(|v| !v.unseen_batch && v.predicted_us.is_some()));
        assert!(!s.alerting(), "{:?}", calm.last());
        let slowed = (0..20)
            .map(|i| next(alone(i), 0.0, 3.0, &mut s))
            .collect::<Vec<_>>();
        assert!(
            slowed.iter().any(|v| v.alert_started),
            "{:?}",
            slowed.last()
        );
        // An open alert judges every batch: it ends on verdicts.
        let v = next(9.0, 0.0, 1.0, &mut s);
        assert!(!v.unseen_batch && v.predicted_us.is_some(), "{v:?}");
        let ended = (0..40).any(|_| next(9.0, 0.0, 1.0, &mut s).alert_ended);
        assert!(ended && !s.alerting());
        // Once it has ended, a batch past the range is learned again.
        assert!(next(9.0, 0.0, 1.0, &mut s).unseen_batch);
    }

    /// Judging every batch size (0) is the old rule: the nearest batch's prediction.
    #[test]
    fn learn_unseen_batches_0_judges_every_batch_size() {
        let params = SentinelParams {
            warmup_samples: 100,
            refit_every: 0,
            learn_unseen_batches: 0,
            ..SentinelParams::default()
        };
        let mut s = Sentinel::new(params, fp(), None);
        for i in 0..100u64 {
            s.observe(&it(i * 30_000_000, (1 + i % 4) as f64, 400.0, 1.0));
        }
        let data = s.take_training();
        s.install(Baseline::fit(&data, &params.baseline, fp()).unwrap());
        let v = s.observe(&it(4_000_000_000, 8.0, 400.0, 1.0));
        assert!(!v.unseen_batch && v.predicted_us.is_some(), "{v:?}");
    }

    #[test]
    fn prefill_is_recorded_but_not_modelled_by_default() {
        let mut s = Sentinel::new(SentinelParams::default(), fp(), None);
        let mut p = it(0, 1.0, 100.0, 1.0);
        p.stage = Stage::Prefill;
        s.observe(&p);
        assert_eq!(s.training_samples(), 0);
        s.observe(&it(0, 1.0, 100.0, 1.0));
        assert_eq!(s.training_samples(), 1);
    }
}
