//! One engine process under the sentinel: its Python probes and the owners that turn their
//! calls into verdicts (the anchor, the model store, the alert book, the GPU figures, the
//! lost-record account), the calls a capture taps, and the status it publishes.

use std::{
    collections::BTreeMap,
    path::Path,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use log::{info, warn};
use model::{Iteration, Sentinel};
use pod_identity::Identity;
use pyframe_tracer::{
    profiles::{self, AnchorFunc},
    ring::Record,
    AttachOptions, Call, Framework, Session,
};

use super::{
    alert_book::AlertBook, anchor::Anchor, gpu_figures::GpuFigures, lost_records::LostRecords,
    model_store::ModelStore,
};
use crate::{
    api::export::IterationCsv,
    api::{board::EngineStatus, metrics::ProcessLabels, state::Shared},
    config::SentinelConfig,
    deep_dive::capture::PythonSource,
    gpu_plane::GpuEvent,
    os::{clock::monotonic_ns, procfs},
};

/// How often the status shown by `/api/v1/status` is refreshed.
const STATUS_PERIOD: Duration = Duration::from_millis(200);

/// An attached engine.
pub struct Engine {
    /// The engine process.
    pub pid: u32,
    identity: Identity,
    labels: ProcessLabels,
    framework: String,
    /// See [`EngineStatus::rank`].
    rank: Option<String>,
    session: Session,
    anchor: Anchor,
    sentinel: Sentinel,
    models: ModelStore,
    alerts: AlertBook,
    gpu: GpuFigures,
    lost: LostRecords,
    records: Vec<Record>,
    /// The doorbell's value read before the last drain (see [`Engine::doorbell`]).
    bell_seen: u32,
    /// The function whose calls ring the doorbell: the anchor, once known.
    bell_after: Option<String>,
    /// Iterations by stage.
    counts: BTreeMap<String, u64>,
    /// Calls kept for a capture in progress (None: not tapped).
    tap: Option<Vec<Call>>,
    /// Since when the engine has been healthy (see [`Engine::healthy`]).
    healthy_since: Option<Instant>,
    status_at: Instant,
}

impl Engine {
    /// Attaches the Python plane to `pid` (placed in the cluster by `identity`) and loads the
    /// model saved under `state_dir` for its fingerprint.
    pub fn attach(
        pid: u32,
        identity: Identity,
        cfg: &SentinelConfig,
        state_dir: &Path,
    ) -> Result<Engine> {
        let framework = match cfg.framework.as_str() {
            "auto" => Framework::Auto,
            name => Framework::Named(name.to_string()),
        };
        let session = Session::attach(
            pid as i32,
            AttachOptions {
                framework,
                specs: cfg.watch_specs()?,
                lease: cfg.probe_lease,
                lane_capacity: cfg.probe_ring_records,
                ..AttachOptions::default()
            },
        )
        .with_context(|| format!("attaching the Python probes to engine pid {pid}"))?;
        let framework = session
            .framework
            .clone()
            .unwrap_or_else(|| "generic".to_string());
        let profile = profiles::by_name(&framework).ok();
        let rank = profile
            .as_ref()
            .and_then(|p| p.rank(&procfs::cmdline(pid).unwrap_or_default()));
        let fields = profile
            .as_ref()
            .map(|p| p.iteration.clone())
            .unwrap_or_default();
        // The attached anchors, with what the profile says of each.
        let known = profile.as_ref().map(|p| p.anchors()).unwrap_or_default();
        let anchors: Vec<AnchorFunc> = session
            .probes
            .iter()
            .filter(|p| p.role == "anchor")
            .map(|p| {
                known
                    .iter()
                    .find(|a| a.func == p.func())
                    .cloned()
                    .unwrap_or_else(|| AnchorFunc::plain(p.func()))
            })
            .collect();
        let anchor = Anchor::new(pid, anchors, fields);
        let bell_after = anchor.func().map(str::to_string);
        session.ring_after(bell_after.as_deref());
        let (models, fingerprint, baseline) = ModelStore::open(state_dir, pid, &framework);
        let labels = ProcessLabels::new(pid, &identity);
        info!(
            "engine {pid}{}{}: attached ({framework}, CPython {}, {} probes, anchor {}, records written by the {} writer{})",
            identity
                .short()
                .map(|s| format!(" ({s})"))
                .unwrap_or_default(),
            rank.as_ref()
                .map(|r| format!(" rank {r}"))
                .unwrap_or_default(),
            session.runtime().version_string(),
            session.probes.len(),
            anchor.func().unwrap_or("to be discovered"),
            session.writer,
            session
                .writer_note
                .as_ref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        );
        Ok(Engine {
            gpu: GpuFigures::attach(pid, labels.clone(), cfg.gpu, cfg.gpu_sample),
            pid,
            framework,
            rank,
            sentinel: Sentinel::new(cfg.params(), fingerprint, baseline),
            session,
            anchor,
            models,
            alerts: AlertBook::new(pid, identity.clone(), labels.clone()),
            lost: LostRecords::new(pid, labels.clone()),
            identity,
            labels,
            records: Vec::with_capacity(4096),
            bell_seen: 0,
            bell_after,
            counts: BTreeMap::new(),
            tap: None,
            healthy_since: None,
            status_at: Instant::now() - STATUS_PERIOD,
        })
    }

    /// The engine's pod and container.
    pub fn identity(&self) -> &Identity {
        &self.identity
    }

    /// The probe ring's doorbell and its value before the last drain, for the daemon's wait
    /// ([`sys_util::futex::wait_any`]): it changes as soon as an anchor call ends, that is, as
    /// soon as an iteration is there to decide on.
    pub fn doorbell(&self) -> (&std::sync::atomic::AtomicU32, u32) {
        (self.session.doorbell(), self.bell_seen)
    }

    /// Drains the probe ring and runs every new iteration through the sentinel. Returns how
    /// many iterations ended.
    pub fn tick(&mut self, shared: &Shared, export: &mut Option<IterationCsv>) -> usize {
        self.bell_seen = self
            .session
            .doorbell()
            .load(std::sync::atomic::Ordering::Acquire);
        self.records.clear();
        self.session.drain(&mut self.records);
        let records = std::mem::take(&mut self.records);
        let mut ended = 0;
        for r in &records {
            let call = self.session.call(r);
            if let Some(tap) = &mut self.tap {
                tap.push(call.clone());
            }
            if let Some(it) = self.anchor.push(call) {
                self.handle(&it, shared, export);
                ended += 1;
            }
        }
        self.records = records;
        self.anchor.settle(self.pid);
        if self.anchor.func() != self.bell_after.as_deref() {
            self.bell_after = self.anchor.func().map(str::to_string);
            self.session.ring_after(self.bell_after.as_deref());
        }
        self.lost.update(
            self.session.lost_records(),
            self.session.ring_resyncs(),
            shared,
        );
        self.gpu.poll(shared);
        self.models.manage(
            &mut self.sentinel,
            &shared
                .metrics
                .state_write_failures
                .with_label_values(&["model"]),
        );
        if self.healthy() {
            self.healthy_since.get_or_insert_with(Instant::now);
        } else {
            self.healthy_since = None;
        }
        if self.status_at.elapsed() >= STATUS_PERIOD {
            self.publish_status(shared);
        }
        ended
    }

    fn handle(&mut self, it: &Iteration, shared: &Shared, export: &mut Option<IterationCsv>) {
        self.gpu.iteration(it.start_ns, it.end_ns);
        let m = &shared.metrics;
        let stage = it.stage.as_str();
        let labels = self.labels.with(&[stage]);
        m.iterations.with_label_values(&labels).inc();
        m.duration
            .with_label_values(&labels)
            .observe(it.duration_us() / 1e6);
        *self.counts.entry(stage.to_string()).or_default() += 1;
        let v = self.sentinel.observe(it);
        let decided_ns = monotonic_ns();
        let pid = self.labels.with(&[]);
        if v.unseen_batch {
            m.unjudged
                .with_label_values(&self.labels.with(&["unseen_batch"]))
                .inc();
        }
        if let (Some(p), Some(e)) = (v.predicted_us, v.error) {
            m.verdict_latency
                .observe(decided_ns.saturating_sub(it.end_ns) as f64 / 1e9);
            m.predicted.with_label_values(&pid).set(p / 1e6);
            m.error.with_label_values(&pid).set(e);
            if let Some(mean) = v.moving_mean {
                m.error_mean.with_label_values(&pid).set(mean);
            }
        }
        self.alerts.observe(it, &v, decided_ns, shared);
        if let Some(out) = export {
            if let Err(e) = out.write(self.pid, it, v.predicted_us) {
                shared
                    .metrics
                    .state_write_failures
                    .with_label_values(&["export"])
                    .inc();
                warn!("iteration export stopped: {e:#} (counted in stallscope_state_write_failures_total)");
                *export = None;
            }
        }
    }

    /// Whether the engine's probes removed themselves (their lease ran out): no record comes
    /// any more until they are attached again.
    pub fn probes_removed(&self) -> bool {
        self.session.probe_removed()
    }

    /// The id of an alert that started since the last call.
    pub fn take_new_alert(&mut self) -> Option<u64> {
        self.alerts.take_new()
    }

    /// Whether the model is fitted and no alert is open: a time to record a normal reference.
    pub fn healthy(&self) -> bool {
        self.sentinel.state() == model::ModelState::Fitted && !self.sentinel.alerting()
    }

    /// How long the engine has been healthy without a break (zero when it is not).
    pub fn healthy_for(&self) -> Duration {
        self.healthy_since.map_or(Duration::ZERO, |t| t.elapsed())
    }

    /// Starts keeping every call for a capture, and describes the probes they come from.
    pub fn start_tap(&mut self) -> PythonSource {
        self.tap = Some(Vec::new());
        PythonSource::Fed {
            framework: self.session.framework.clone(),
            python: self.session.runtime().version_string(),
            probes: self.session.probes.clone(),
            writer: self.session.writer.clone(),
        }
    }

    /// The calls kept since the last call (the tap stays on).
    pub fn drain_tap(&mut self) -> Vec<Call> {
        self.tap.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Stops keeping calls (and GPU events).
    pub fn stop_tap(&mut self) {
        self.tap = None;
        self.gpu.stop_tap();
    }

    /// Starts keeping GPU events for a capture; false when the engine has no GPU plane.
    pub fn start_gpu_tap(&mut self) -> bool {
        self.gpu.start_tap()
    }

    /// The GPU events kept since the last call, per process.
    pub fn drain_gpu_tap(&mut self) -> BTreeMap<u32, Vec<GpuEvent>> {
        self.gpu.drain_tap()
    }

    fn publish_status(&mut self, shared: &Shared) {
        self.status_at = Instant::now();
        self.alerts.publish(shared);
        let m = &shared.metrics;
        let pid = self.labels.with(&[]);
        let state = match self.sentinel.state() {
            model::ModelState::Warming => "warming",
            model::ModelState::Fitting => "fitting",
            model::ModelState::Fitted => "fitted",
        };
        for s in ["warming", "fitting", "fitted"] {
            m.model_state
                .with_label_values(&self.labels.with(&[s]))
                .set(i64::from(s == state));
        }
        m.training_samples
            .with_label_values(&pid)
            .set(self.sentinel.training_samples() as i64);
        let b = self.sentinel.baseline();
        if let Some(b) = b {
            m.model_samples
                .with_label_values(&pid)
                .set(b.samples as i64);
            m.ucl.with_label_values(&pid).set(b.ucl.limit);
        }
        m.anomaly_active
            .with_label_values(&pid)
            .set(i64::from(self.sentinel.alerting()));
        // Counters are exported from the engine's first status on, at 0: rate() and
        // increase() need a sample before the first increment.
        let _ = m.alerts.with_label_values(&pid);
        let _ = m.lost_records.with_label_values(&pid);
        let _ = m.ring_resyncs.with_label_values(&pid);
        let unseen_batches = m
            .unjudged
            .with_label_values(&self.labels.with(&["unseen_batch"]))
            .get();
        m.engines
            .with_label_values(&self.labels.with(&[&self.framework]))
            .set(1);
        let status = EngineStatus {
            pid: self.pid,
            identity: self.identity.clone(),
            framework: self.framework.clone(),
            rank: self.rank.clone(),
            python: self.session.runtime().version_string(),
            anchor: self.anchor.func().map(str::to_string),
            fingerprint: self.sentinel.fingerprint().key(),
            model_state: state.to_string(),
            refitting: self.sentinel.refitting(),
            training_samples: self.sentinel.training_samples(),
            warmup_samples: self.sentinel.params().warmup_samples,
            model_samples: b.map(|b| b.samples),
            model_mape_pct: b.map(|b| b.oof_accuracy.mape_pct),
            ucl: b.map(|b| b.ucl.limit),
            recalibration: b.map(|_| self.sentinel.recalibration()),
            iterations: self.counts.clone(),
            unseen_batch_iterations: unseen_batches,
            lost_records: self.lost.total(),
            anomaly_active: self.sentinel.alerting(),
            gpu_plane: self.gpu.state().to_string(),
            gpu_iterations: self.gpu.iterations(),
            gpu_void_ratio: self.gpu.mean_void(),
        };
        shared.engines.publish(status);
    }

    /// Restores the engine (unless it is gone) and removes its series.
    pub fn detach(self, shared: &Shared, threads: &[(String, String)]) {
        shared.engines.withdraw(self.pid);
        shared
            .metrics
            .forget_engine(&self.labels, &self.framework, threads);
        if !procfs::process_exists(self.pid) {
            return;
        }
        self.gpu.detach();
        match self.session.detach() {
            Ok(_) => info!("engine {}: probes removed", self.pid),
            Err(e) => warn!(
                "engine {}: detach: {e}; its probes remove themselves at the engine's next watched call (their lease is expired)",
                self.pid
            ),
        }
    }
}
