//! One engine process under the sentinel: its Python probes, iteration assembly, baseline
//! model (warm-up, fit off-thread, persistence per fingerprint), alerts, and the GPU plane's
//! per-iteration figures where the engine has CUPTI loaded.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    path::{Path, PathBuf},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use log::{info, warn};
use model::{
    anchor::{discover, CallStats},
    Baseline, Fingerprint, Iteration, ModelError, Sentinel,
};
use pyframe_tracer::{
    profiles::{self, IterationFields},
    ring::Record,
    AttachOptions, Call, Framework, Session,
};

use crate::{
    api::export::IterationCsv,
    api::state::{Alert, EngineStatus, Shared},
    config::Config,
    deep_dive::capture::PythonSource,
    gpu_plane::{feed::GpuFeed, GpuEvent},
    os::clock::{monotonic_ns, unix_ms},
    os::procfs,
    sentinel::iterations::Assembler,
};

/// How long an engine without a profile anchor is watched before the anchor is chosen.
const DISCOVERY_WINDOW: Duration = Duration::from_secs(10);
/// How often the status shown by `/api/v1/status` is refreshed.
const STATUS_PERIOD: Duration = Duration::from_millis(200);
/// Lost probe records are warned of at most this often (each warning counts those since the
/// last).
const LOST_WARNING_PERIOD: Duration = Duration::from_secs(10);

/// An attached engine.
pub struct Engine {
    /// The engine process.
    pub pid: u32,
    pid_label: String,
    framework: String,
    /// The profile's workload fields.
    fields: IterationFields,
    session: Session,
    assembler: Option<Assembler>,
    /// Call durations per function while the anchor is being discovered.
    discovery: Option<(Instant, HashMap<String, Vec<u64>>)>,
    sentinel: Sentinel,
    fit: Option<JoinHandle<Result<(Baseline, Duration), ModelError>>>,
    model_path: PathBuf,
    records: Vec<Record>,
    lost_seen: u64,
    /// Lost records not yet in a warning, and when the last warning was.
    lost_unreported: u64,
    lost_warned_at: Option<Instant>,
    counts: BTreeMap<String, u64>,
    open_alert: Option<Alert>,
    /// Id of an alert that started since the daemon last looked.
    new_alert: Option<u64>,
    /// Calls kept for a capture in progress (None: not tapped).
    tap: Option<Vec<Call>>,
    /// Since when the engine has been healthy (see [`Engine::healthy`]).
    healthy_since: Option<Instant>,
    status_at: Instant,
    /// The GPU plane, when the engine has CUDA.
    gpu: Option<GpuFeed>,
    /// `on: ...` or `off: why`.
    gpu_state: String,
    gpu_iterations: u64,
    /// Void shares of the latest iterations with GPU figures.
    gpu_void: VecDeque<f64>,
}

/// Iterations the status's mean void share is taken over.
const VOID_WINDOW: usize = 100;

impl Engine {
    /// Attaches the Python plane to `pid` and loads the persisted model of its fingerprint.
    pub fn attach(pid: u32, cfg: &Config) -> Result<Engine> {
        let framework = match cfg.sentinel.framework.as_str() {
            "auto" => Framework::Auto,
            name => Framework::Named(name.to_string()),
        };
        let session = Session::attach(
            pid as i32,
            AttachOptions {
                framework,
                specs: cfg.sentinel.watch_specs()?,
                lease: cfg.sentinel.probe_lease,
                lane_capacity: cfg.sentinel.probe_ring_records,
                ..AttachOptions::default()
            },
        )
        .with_context(|| format!("attaching the Python probes to engine pid {pid}"))?;
        let framework = session
            .framework
            .clone()
            .unwrap_or_else(|| "generic".to_string());
        let fields = profiles::by_name(&framework)
            .map(|p| p.iteration)
            .unwrap_or_default();
        let anchor = session
            .probes
            .iter()
            .find(|p| p.role == "anchor")
            .map(|p| p.func().to_string());
        let (assembler, discovery) = match anchor {
            Some(a) => (Some(Assembler::new(&a, fields.clone())), None),
            None => {
                info!("engine {pid}: no profile anchor; discovering it from call frequency and duration stability over {DISCOVERY_WINDOW:?}");
                (None, Some((Instant::now(), HashMap::new())))
            }
        };
        let fingerprint = Fingerprint {
            framework: framework.clone(),
            model: served_model(pid),
            hardware: hardware(),
        };
        let model_path = cfg
            .state
            .dir
            .join("models")
            .join(format!("{}.json", fingerprint.key()));
        let baseline = load_model(&model_path, &fingerprint);
        if let Some(b) = &baseline {
            info!(
                "engine {pid}: reusing the model fitted on {} samples ({})",
                b.samples,
                model_path.display()
            );
        }
        info!(
            "engine {pid}: attached ({framework}, CPython {}, {} probes, anchor {})",
            session.runtime().version_string(),
            session.probes.len(),
            assembler
                .as_ref()
                .map_or("to be discovered", |a| a.anchor())
        );
        let (gpu, gpu_state) = if !cfg.sentinel.gpu {
            (None, "off: [sentinel] gpu = false".to_string())
        } else {
            match GpuFeed::attach(pid) {
                Ok(g) => {
                    let state = g.describe();
                    info!("engine {pid}: GPU plane {state}");
                    (Some(g), state)
                }
                Err(why) => (None, format!("off: {why}")),
            }
        };
        Ok(Engine {
            gpu,
            gpu_state,
            gpu_iterations: 0,
            gpu_void: VecDeque::with_capacity(VOID_WINDOW),
            pid,
            pid_label: pid.to_string(),
            framework,
            fields,
            sentinel: Sentinel::new(cfg.sentinel.params(), fingerprint, baseline),
            session,
            assembler,
            discovery,
            fit: None,
            model_path,
            records: Vec::with_capacity(4096),
            lost_seen: 0,
            lost_unreported: 0,
            lost_warned_at: None,
            counts: BTreeMap::new(),
            open_alert: None,
            new_alert: None,
            tap: None,
            healthy_since: None,
            status_at: Instant::now() - STATUS_PERIOD,
        })
    }

    /// Drains the probe ring and runs every new iteration through the sentinel.
    pub fn tick(&mut self, shared: &Shared, export: &mut Option<IterationCsv>) {
        self.records.clear();
        self.session.drain(&mut self.records);
        let records = std::mem::take(&mut self.records);
        for r in &records {
            let call = self.session.call(r);
            if let Some(tap) = &mut self.tap {
                tap.push(call.clone());
            }
            if let Some((_, seen)) = &mut self.discovery {
                seen.entry(call.func.clone())
                    .or_default()
                    .push(call.end_ns.saturating_sub(call.start_ns));
                continue;
            }
            if let Some(it) = self.assembler.as_mut().and_then(|a| a.push(call)) {
                self.handle(&it, shared, export);
            }
        }
        self.records = records;
        self.finish_discovery();
        let lost = self.session.lost_records();
        if lost > self.lost_seen {
            shared
                .metrics
                .lost_records
                .with_label_values(&[&self.pid_label])
                .inc_by(lost - self.lost_seen);
            self.lost_unreported += lost - self.lost_seen;
            self.lost_seen = lost;
        }
        if self.lost_unreported > 0
            && self
                .lost_warned_at
                .is_none_or(|t| t.elapsed() >= LOST_WARNING_PERIOD)
        {
            warn!(
                "engine {}: {} probe records lost: a thread's lane of the probe ring was full (the daemon fell more than [sentinel] probe_ring_records records behind it); the iterations in them are missing from the sentinel and the export",
                self.pid, self.lost_unreported
            );
            self.lost_unreported = 0;
            self.lost_warned_at = Some(Instant::now());
        }
        self.gpu_figures(shared);
        self.manage_fit();
        if self.healthy() {
            self.healthy_since.get_or_insert_with(Instant::now);
        } else {
            self.healthy_since = None;
        }
        if self.status_at.elapsed() >= STATUS_PERIOD {
            self.publish_status(shared);
        }
    }

    /// Polls the GPU plane and records the figures of iterations whose records have settled.
    fn gpu_figures(&mut self, shared: &Shared) {
        let Some(g) = self.gpu.as_mut() else {
            return;
        };
        g.poll();
        let m = &shared.metrics;
        let pid = [self.pid_label.as_str()];
        for f in g.settled(monotonic_ns()) {
            self.gpu_iterations += 1;
            m.gpu_busy.with_label_values(&pid).observe(f.busy_us / 1e6);
            m.gpu_void.with_label_values(&pid).observe(f.void_ratio);
            for l in &f.launch_us {
                m.gpu_launch.with_label_values(&pid).observe(l / 1e6);
            }
            if self.gpu_void.len() == VOID_WINDOW {
                self.gpu_void.pop_front();
            }
            self.gpu_void.push_back(f.void_ratio);
        }
    }

    fn handle(&mut self, it: &Iteration, shared: &Shared, export: &mut Option<IterationCsv>) {
        if let Some(g) = self.gpu.as_mut() {
            g.iteration(it.start_ns, it.end_ns);
        }
        let m = &shared.metrics;
        let stage = it.stage.as_str();
        let labels = [self.pid_label.as_str(), stage];
        m.iterations.with_label_values(&labels).inc();
        m.duration
            .with_label_values(&labels)
            .observe(it.duration_us() / 1e6);
        *self.counts.entry(stage.to_string()).or_default() += 1;
        let v = self.sentinel.observe(it);
        let decided_ns = monotonic_ns();
        let pid = [self.pid_label.as_str()];
        if let (Some(p), Some(e)) = (v.predicted_us, v.error) {
            m.verdict_latency
                .observe(decided_ns.saturating_sub(it.end_ns) as f64 / 1e9);
            m.predicted.with_label_values(&pid).set(p / 1e6);
            m.error.with_label_values(&pid).set(e);
            if let Some(mean) = v.moving_mean {
                m.error_mean.with_label_values(&pid).set(mean);
            }
            if let Some(a) = &mut self.open_alert {
                a.iterations += 1;
            }
        }
        if v.alert_started {
            let alert = Alert {
                id: shared.next_alert_id(self.pid),
                pid: self.pid,
                started_unix_ms: unix_ms(),
                trigger_iteration_end_ns: it.end_ns,
                detection_latency_us: decided_ns.saturating_sub(it.end_ns) as f64 / 1e3,
                moving_mean: v.moving_mean.unwrap_or_default(),
                ucl: v.ucl.unwrap_or_default(),
                duration_us: it.duration_us(),
                predicted_us: v.predicted_us.unwrap_or_default(),
                ended_unix_ms: None,
                iterations: 1,
            };
            warn!(
                "engine {}: ALERT decode iterations {:.0}% slower than the baseline predicts (moving mean of E {:.3} > UCL {:.3})",
                self.pid,
                100.0 * alert.moving_mean,
                alert.moving_mean,
                alert.ucl
            );
            m.alerts.with_label_values(&pid).inc();
            m.anomaly_active.with_label_values(&pid).set(1);
            shared.alert_event("alert_start", &alert);
            self.new_alert = Some(alert.id);
            self.open_alert = Some(alert);
        }
        if v.alert_ended {
            if let Some(mut a) = self.open_alert.take() {
                a.ended_unix_ms = Some(unix_ms());
                info!(
                    "engine {}: alert {} ended after {} iterations",
                    self.pid, a.id, a.iterations
                );
                shared.alert_event("alert_end", &a);
            }
            m.anomaly_active.with_label_values(&pid).set(0);
        }
        if let Some(out) = export {
            if let Err(e) = out.write(self.pid, it, v.predicted_us) {
                warn!("iteration export stopped: {e:#}");
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
        self.new_alert.take()
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
        }
    }

    /// The calls kept since the last call (the tap stays on).
    pub fn drain_tap(&mut self) -> Vec<Call> {
        self.tap.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Stops keeping calls (and GPU events).
    pub fn stop_tap(&mut self) {
        self.tap = None;
        if let Some(g) = self.gpu.as_mut() {
            g.stop_tap();
        }
    }

    /// Starts keeping GPU events for a capture; false when the engine has no GPU plane.
    pub fn start_gpu_tap(&mut self) -> bool {
        self.gpu.as_mut().map(GpuFeed::start_tap).is_some()
    }

    /// The GPU events kept since the last call, per process.
    pub fn drain_gpu_tap(&mut self) -> BTreeMap<u32, Vec<GpuEvent>> {
        self.gpu
            .as_mut()
            .map(GpuFeed::drain_tap)
            .unwrap_or_default()
    }

    /// Picks the anchor once the discovery window is over.
    fn finish_discovery(&mut self) {
        let Some((since, seen)) = &self.discovery else {
            return;
        };
        if since.elapsed() < DISCOVERY_WINDOW {
            return;
        }
        let stats: Vec<CallStats> = seen
            .iter()
            .map(|(f, d)| CallStats::from_durations(f, d))
            .collect();
        match discover(&stats, 20, 5e5) {
            Some(i) => {
                info!(
                    "engine {}: anchor discovered: {} ({} calls, mean {:.1} ms, cv {:.2})",
                    self.pid,
                    stats[i].func,
                    stats[i].calls,
                    stats[i].mean_ns / 1e6,
                    stats[i].cv
                );
                self.assembler = Some(Assembler::new(&stats[i].func, self.fields.clone()));
                self.discovery = None;
            }
            None => {
                // Nothing iteration-like yet (an idle engine): look again over the next window.
                self.discovery = Some((Instant::now(), HashMap::new()));
            }
        }
    }

    /// Starts a fit when one is due and installs it (and persists it) when it is done.
    fn manage_fit(&mut self) {
        if self.fit.as_ref().is_some_and(|h| h.is_finished()) {
            let done = self.fit.take().expect("checked").join();
            match done {
                Ok(Ok((b, took))) => {
                    info!(
                        "engine {}: baseline fitted on {} samples in {:.2} s (out-of-fold MAPE {:.2} %, UCL {:.3})",
                        self.pid,
                        b.samples,
                        took.as_secs_f64(),
                        b.oof_accuracy.mape_pct,
                        b.ucl.limit
                    );
                    if let Err(e) = save_model(&self.model_path, &b) {
                        warn!("{e:#}");
                    }
                    self.sentinel.install(b);
                }
                Ok(Err(e)) => {
                    warn!("engine {}: {e}", self.pid);
                    self.sentinel.fit_failed();
                }
                Err(_) => {
                    warn!("engine {}: the fit thread panicked", self.pid);
                    self.sentinel.fit_failed();
                }
            }
        }
        if self.fit.is_none() && self.sentinel.fit_due() {
            let data = self.sentinel.take_training();
            let params = self.sentinel.params().baseline;
            let fp = self.sentinel.fingerprint().clone();
            info!(
                "engine {}: fitting the baseline on {} healthy iterations",
                self.pid,
                data.len()
            );
            self.fit = Some(std::thread::spawn(move || {
                crate::os::sched::lower_cpu_priority();
                let t = Instant::now();
                Baseline::fit(&data, &params, fp).map(|b| (b, t.elapsed()))
            }));
        }
    }

    fn publish_status(&mut self, shared: &Shared) {
        self.status_at = Instant::now();
        if let Some(a) = &self.open_alert {
            shared.keep_alert(a);
        }
        let m = &shared.metrics;
        let pid = [self.pid_label.as_str()];
        let state = match self.sentinel.state() {
            model::ModelState::Warming => "warming",
            model::ModelState::Fitting => "fitting",
            model::ModelState::Fitted => "fitted",
        };
        for s in ["warming", "fitting", "fitted"] {
            m.model_state
                .with_label_values(&[self.pid_label.as_str(), s])
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
        m.engines
            .with_label_values(&[self.pid_label.as_str(), &self.framework])
            .set(1);
        let status = EngineStatus {
            pid: self.pid,
            framework: self.framework.clone(),
            python: self.session.runtime().version_string(),
            anchor: self.assembler.as_ref().map(|a| a.anchor().to_string()),
            fingerprint: self.sentinel.fingerprint().key(),
            model_state: state.to_string(),
            training_samples: self.sentinel.training_samples(),
            warmup_samples: self.sentinel.params().warmup_samples,
            model_samples: b.map(|b| b.samples),
            model_mape_pct: b.map(|b| b.oof_accuracy.mape_pct),
            ucl: b.map(|b| b.ucl.limit),
            iterations: self.counts.clone(),
            lost_records: self.lost_seen,
            anomaly_active: self.sentinel.alerting(),
            gpu_plane: self.gpu_state.clone(),
            gpu_iterations: self.gpu_iterations,
            gpu_void_ratio: (!self.gpu_void.is_empty())
                .then(|| self.gpu_void.iter().sum::<f64>() / self.gpu_void.len() as f64),
        };
        shared
            .engines
            .lock()
            .expect("status lock")
            .insert(self.pid, status);
    }

    /// Restores the engine (unless it is gone) and removes its series.
    pub fn detach(self, shared: &Shared, threads: &[(String, String)]) {
        shared
            .engines
            .lock()
            .expect("status lock")
            .remove(&self.pid);
        shared
            .metrics
            .forget_engine(&self.pid_label, &self.framework, threads);
        if !procfs::process_exists(self.pid) {
            return;
        }
        if let Some(g) = self.gpu {
            for problem in g.detach() {
                warn!("engine {}: GPU plane: {problem}", self.pid);
            }
        }
        match self.session.detach() {
            Ok(_) => info!("engine {}: probes removed", self.pid),
            Err(e) => warn!(
                "engine {}: detach: {e}; its probes remove themselves at the engine's next watched call (their lease is expired)",
                self.pid
            ),
        }
    }
}

/// The served model's name: the `--model` argument of the engine or of its parents (vLLM's
/// engine core overwrites its own command line; the API server above it keeps it).
fn served_model(pid: u32) -> String {
    let mut p = pid;
    for _ in 0..4 {
        let cmd = procfs::cmdline(p).unwrap_or_default();
        let args: Vec<&str> = cmd.split(' ').collect();
        for (i, a) in args.iter().enumerate() {
            if let Some(v) = a
                .strip_prefix("--model=")
                .or_else(|| a.strip_prefix("--model-path="))
            {
                return v.to_string();
            }
            if (*a == "--model" || *a == "--model-path") && i + 1 < args.len() {
                return args[i + 1].to_string();
            }
        }
        match procfs::parent(p) {
            Some(pp) if pp > 1 => p = pp,
            _ => break,
        }
    }
    "unknown".to_string()
}

/// CPU model and count, and the GPUs NVML sees.
fn hardware() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".to_string());
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    match crate::gpu_plane::nvml::Gpus::open() {
        Ok(g) => format!("{name} x{n}, {}", g.describe()),
        Err(_) => format!("{name} x{n}"),
    }
}

fn load_model(path: &Path, fp: &Fingerprint) -> Option<Baseline> {
    let text = std::fs::read_to_string(path).ok()?;
    match Baseline::from_json(&text) {
        Ok(b) if &b.fingerprint == fp => Some(b),
        Ok(_) => None,
        Err(e) => {
            let aside = path.with_extension("corrupt");
            warn!(
                "{}: {e}; moved to {} and warming up again",
                path.display(),
                aside.display()
            );
            let _ = std::fs::rename(path, aside);
            None
        }
    }
}

fn save_model(path: &Path, b: &Baseline) -> Result<()> {
    let dir = path.parent().expect("models live in a directory");
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, b.to_json()).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
