//! Daemon configuration: an embedded default (`config/default.toml`) or a user file.

use std::{net::SocketAddr, path::PathBuf, time::Duration};

use anyhow::{bail, Context, Result};
use cupti_sys::sampling::Sampling;
use model::{
    baseline::BaselineParams,
    detector::{DetectorParams, Span},
    SentinelParams,
};
use serde::Deserialize;

/// The embedded default configuration.
pub const DEFAULT_CONFIG: &str = include_str!("../config/default.toml");

/// The daemon's configuration.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// What to watch.
    pub watch: WatchConfig,
    /// Kernel accounting period.
    pub report: ReportConfig,
    /// The sentinel.
    pub sentinel: SentinelConfig,
    /// The HTTP listener.
    pub http: HttpConfig,
    /// Where state and logs go.
    pub state: StateConfig,
    /// Deep dives taken by the daemon (on alerts and over HTTP).
    #[serde(default)]
    pub deep_dive: DeepDiveConfig,
    /// Where pod and container names come from.
    #[serde(default)]
    pub pods: PodsConfig,
    /// OpenTelemetry export.
    #[serde(default)]
    pub otlp: OtlpConfig,
    /// This node's serving group, for alerts routed to it by Alertmanager.
    #[serde(default)]
    pub fleet: FleetConfig,
    /// The shared store deep dives are uploaded to.
    #[serde(default)]
    pub store: StoreConfig,
}

/// This node's place in a serving group: an Alertmanager alert whose `group_label` names
/// `group` and reaches `POST /api/v1/alertmanager` starts a deep dive here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FleetConfig {
    /// The serving group of this node's engines ("" = none: webhook alerts start nothing);
    /// the `STALLSCOPE_GROUP` environment variable, when set, overrides it (a chart sets it
    /// from a pod label through the downward API).
    pub group: String,
    /// When `group` is empty, an engine's serving group is the value of this label of its pod
    /// (from the kubelet's pod list), such as `stallscope.io/serving-group`; "" = none.
    pub group_pod_label: String,
    /// This node's name in the group's index and merged trace ("" = the host name); the
    /// `STALLSCOPE_NODE` environment variable, when set, overrides it.
    pub node: String,
    /// The alert label that names a serving group.
    pub group_label: String,
    /// Most webhook calls taken per minute; more are refused with 429.
    pub max_calls_per_minute: usize,
    /// A group's deep dive starts this long after its alert's `startsAt`, on every node at
    /// the same wall-clock instant (longer than Alertmanager takes to deliver the call).
    #[serde(with = "duration_text")]
    pub lead: Duration,
}

impl Default for FleetConfig {
    fn default() -> Self {
        Self {
            group: String::new(),
            group_pod_label: String::new(),
            node: String::new(),
            group_label: "serving_group".into(),
            max_calls_per_minute: 60,
            lead: Duration::from_secs(5),
        }
    }
}

impl FleetConfig {
    /// The serving group of an engine placed at `identity`: `group`, else its pod's
    /// `group_pod_label`.
    pub fn group_of(&self, identity: &pod_identity::Identity) -> Option<String> {
        if !self.group.is_empty() {
            return Some(self.group.clone());
        }
        if self.group_pod_label.is_empty() {
            return None;
        }
        identity
            .pod_labels
            .get(&self.group_pod_label)
            .filter(|g| !g.is_empty())
            .cloned()
    }

    /// This node's name: `node`, else the host name.
    pub fn node_name(&self) -> String {
        if !self.node.is_empty() {
            return self.node.clone();
        }
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "node".into())
    }
}

/// The shared store, reached through the S3 API: every finished deep dive's trace and report
/// are uploaded there, and a serving group's deep dive gets one index.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// The S3 endpoint's base URL (`https://s3.us-east-1.amazonaws.com`, `http://minio:9000`);
    /// empty: no upload.
    pub endpoint: String,
    /// The bucket (it must exist).
    pub bucket: String,
    /// The bucket's region (signed into each request).
    pub region: String,
    /// Keys start with this prefix.
    pub prefix: String,
    /// Address the bucket as `BUCKET.HOST` (AWS) instead of `HOST/BUCKET` (most other S3
    /// servers).
    pub virtual_hosted: bool,
    /// Credentials; empty: `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    pub access_key_id: String,
    pub secret_access_key: String,
    /// Bound of one request.
    #[serde(with = "duration_text")]
    pub timeout: Duration,
    /// Deep dives waiting for upload while the store is slow or down; past it the oldest
    /// waiting one is dropped and counted (`stallscope_store_dropped_total`).
    pub queue: usize,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            bucket: String::new(),
            region: "us-east-1".into(),
            prefix: "stallscope".into(),
            virtual_hosted: false,
            access_key_id: String::new(),
            secret_access_key: String::new(),
            timeout: Duration::from_secs(30),
            queue: 16,
        }
    }
}

impl StoreConfig {
    pub fn validate(&self) -> Result<()> {
        if self.endpoint.is_empty() {
            return Ok(());
        }
        if !(self.endpoint.starts_with("http://") || self.endpoint.starts_with("https://"))
            || url::Url::parse(&self.endpoint).is_err()
        {
            bail!(
                "store.endpoint {:?} is not an S3 endpoint's base URL: write it as http(s)://HOST[:PORT] (or \"\" for no upload)",
                self.endpoint
            );
        }
        if self.bucket.is_empty() || self.region.is_empty() {
            bail!("store.bucket and store.region must be set when store.endpoint is (such as bucket = \"stallscope\", region = \"us-east-1\")");
        }
        if self.timeout.is_zero() || self.queue == 0 {
            bail!("store.timeout must be above zero (such as \"30s\") and store.queue at least 1");
        }
        Ok(())
    }
}

/// OpenTelemetry export over OTLP/HTTP with protobuf bodies: the metrics, each alert's start
/// and end as a log record, each deep dive as a span.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OtlpConfig {
    /// The collector's base URL (`http://HOST:4318`; `/v1/metrics`, `/v1/logs` and
    /// `/v1/traces` are appended); empty: no export.
    pub endpoint: String,
    /// HTTP headers sent with every export (e.g. an `authorization` token).
    pub headers: std::collections::BTreeMap<String, String>,
    /// Bound of one export request, its retries included.
    #[serde(with = "duration_text")]
    pub timeout: Duration,
    /// Most log records or spans in one request.
    pub batch: usize,
    /// Log records and spans held while the collector is slow or down; past it new ones are
    /// dropped and counted (`stallscope_otlp_dropped_total`).
    pub queue: usize,
    /// How often the metrics are exported.
    #[serde(with = "duration_text")]
    pub metrics_interval: Duration,
}

impl Default for OtlpConfig {
    fn default() -> Self {
        Self {
            endpoint: String::new(),
            headers: Default::default(),
            timeout: Duration::from_secs(5),
            batch: 256,
            queue: 4096,
            metrics_interval: Duration::from_secs(10),
        }
    }
}

impl OtlpConfig {
    pub fn validate(&self) -> Result<()> {
        if self.endpoint.is_empty() {
            return Ok(());
        }
        if self.endpoint.starts_with("https://") {
            bail!(
                "otlp.endpoint {:?}: OTLP export goes over plain HTTP only (https is not tested); point it at a collector's http:// receiver, such as a node-local agent",
                self.endpoint
            );
        }
        if sys_util::http::split_url(&self.endpoint).is_none() {
            bail!(
                "otlp.endpoint {:?} is not a collector's base URL: write it as http://HOST:4318 (or \"\" for no export)",
                self.endpoint
            );
        }
        if self.timeout.is_zero() || self.metrics_interval.is_zero() {
            bail!("otlp.timeout and otlp.metrics_interval must be above zero (such as \"5s\")");
        }
        if self.batch == 0 || self.queue < self.batch {
            bail!(
                "otlp.batch must be at least 1 and otlp.queue at least otlp.batch (batch {}, queue {})",
                self.batch,
                self.queue
            );
        }
        Ok(())
    }
}

/// Pod identity: the ids come from each process's cgroup; the names from here.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PodsConfig {
    /// `kubelet` (the node's pod list at `kubelet_url`) or `none` (ids only).
    pub names: String,
    /// The kubelet's read-only pod list; the `STALLSCOPE_KUBELET_URL` environment variable,
    /// when set, overrides it (a DaemonSet sets it from the node's IP).
    pub kubelet_url: String,
    /// Bound of one pod-list request.
    #[serde(with = "duration_text")]
    pub timeout: Duration,
}

impl Default for PodsConfig {
    fn default() -> Self {
        Self {
            names: "kubelet".into(),
            kubelet_url: "http://127.0.0.1:10255/pods".into(),
            timeout: Duration::from_secs(2),
        }
    }
}

impl PodsConfig {
    /// The name source these settings choose.
    pub fn source(&self) -> Result<pod_identity::NameSource> {
        match self.names.as_str() {
            "none" => Ok(pod_identity::NameSource::None),
            "kubelet" => {
                let url = std::env::var("STALLSCOPE_KUBELET_URL")
                    .unwrap_or_else(|_| self.kubelet_url.clone());
                pod_identity::split_http_url(&url).map_err(|e| anyhow::anyhow!("pods.{e}"))?;
                Ok(pod_identity::NameSource::Kubelet { url })
            }
            other => bail!("pods.names must be \"kubelet\" or \"none\", not {other:?}"),
        }
    }
}

/// Deep dives taken by the daemon: policy, what they capture, their bounds.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DeepDiveConfig {
    /// Take one when an alert starts.
    pub on_alert: bool,
    /// What to capture: any of `kernel` (raw sched/syscall events), `python` (the engine's
    /// probe calls), `stacks` (py-spy samples), `telemetry` (host counters).
    pub probes: Vec<String>,
    /// Length of an alert's deep-dive window (and the default of an HTTP request).
    #[serde(with = "duration_text")]
    pub duration: Duration,
    /// No alert-triggered deep dive sooner than this after the previous one started.
    #[serde(with = "duration_text")]
    pub cooldown: Duration,
    /// At most this many deep dives (alert and HTTP) in any hour.
    pub max_per_hour: usize,
    /// Refresh the rolling normal reference this often while the engine is healthy.
    #[serde(with = "duration_text")]
    pub reference_every: Duration,
    /// Length of a normal-reference recording.
    #[serde(with = "duration_text")]
    pub reference_duration: Duration,
    /// A reference is recorded only once the engine has been healthy (fitted, no alert open)
    /// this long: not in the aftermath of an alert or of start-up.
    #[serde(with = "duration_text")]
    pub reference_settle: Duration,
    /// py-spy samples per second.
    pub stack_sample_hz: f64,
    /// Host telemetry samples per second.
    pub telemetry_hz: f64,
    /// Raw kernel events kept per window (the rest are counted as dropped).
    pub max_events: usize,
    /// Trace bytes per deep dive (events past it are counted as dropped).
    pub max_bytes: u64,
    /// Where traces and reports go ("" = `<state.dir>/deep-dives`).
    pub dir: PathBuf,
    /// Bearer token `POST /api/v1/deep-dive` must present when the listener is not loopback
    /// ("" = refused off loopback).
    pub token: String,
}

impl Default for DeepDiveConfig {
    fn default() -> Self {
        Self {
            on_alert: true,
            probes: PROBES.iter().map(|p| p.to_string()).collect(),
            duration: Duration::from_secs(3),
            cooldown: Duration::from_secs(60),
            max_per_hour: 6,
            reference_every: Duration::from_secs(600),
            reference_duration: Duration::from_secs(2),
            reference_settle: Duration::from_secs(30),
            stack_sample_hz: 100.0,
            telemetry_hz: 100.0,
            max_events: 2_000_000,
            max_bytes: 256 << 20,
            dir: PathBuf::new(),
            token: String::new(),
        }
    }
}

/// The probes a deep dive can turn on.
pub const PROBES: [&str; 5] = ["kernel", "python", "stacks", "telemetry", "gpu"];

/// Longest deep-dive or reference window.
pub const MAX_WINDOW: Duration = Duration::from_secs(120);

impl DeepDiveConfig {
    /// Whether `probe` (one of [`PROBES`]) is on.
    pub fn has(&self, probe: &str) -> bool {
        self.probes.iter().any(|p| p == probe)
    }

    /// The directory of traces and reports.
    pub fn dir(&self, state: &StateConfig) -> PathBuf {
        if self.dir.as_os_str().is_empty() {
            state.dir.join("deep-dives")
        } else {
            self.dir.clone()
        }
    }

    fn validate(&self) -> Result<()> {
        if let Some(p) = self.probes.iter().find(|p| !PROBES.contains(&p.as_str())) {
            bail!("deep_dive.probes: unknown probe {p:?} (known: {PROBES:?})");
        }
        for (key, d) in [
            ("duration", self.duration),
            ("reference_duration", self.reference_duration),
        ] {
            if d.is_zero() || d > MAX_WINDOW {
                bail!(
                    "deep_dive.{key} must be above 0 and at most {MAX_WINDOW:?} (such as \"3s\")"
                );
            }
        }
        if !(self.stack_sample_hz >= 0.0 && self.stack_sample_hz <= 1000.0) {
            bail!("deep_dive.stack_sample_hz must be between 0 and 1000");
        }
        if !(self.telemetry_hz >= 1.0 && self.telemetry_hz <= 1000.0) {
            bail!("deep_dive.telemetry_hz must be between 1 and 1000");
        }
        if self.max_events == 0 || self.max_bytes == 0 {
            bail!("deep_dive.max_events and deep_dive.max_bytes must be above 0");
        }
        Ok(())
    }
}

/// What the daemon watches.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WatchConfig {
    /// Explicit pids.
    #[serde(default)]
    pub pids: Vec<u32>,
    /// Substrings of comm or cmdline that select processes automatically.
    #[serde(default)]
    pub process_patterns: Vec<String>,
    /// Rescan period for `process_patterns`.
    #[serde(with = "duration_text")]
    pub rescan_interval: Duration,
    /// Keep the daemon's threads off the CPUs a watched process pins threads to (absent:
    /// true).
    #[serde(default = "avoid_pinned_cpus")]
    pub avoid_pinned_cpus: bool,
}

fn avoid_pinned_cpus() -> bool {
    true
}

/// Kernel accounting.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportConfig {
    /// Period at which per-thread accounting is read into the metrics.
    #[serde(with = "duration_text")]
    pub interval: Duration,
}

/// The sentinel.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelConfig {
    /// Substrings of comm or cmdline of engine processes.
    pub engine_patterns: Vec<String>,
    /// `auto` or a profile name.
    pub framework: String,
    /// Extra watch specs (`MODULE:QUALNAME[name=EXPR;...]`): for engines without a profile,
    /// the candidates the anchor is discovered from.
    #[serde(default)]
    pub watch: Vec<String>,
    /// Ring drain period when no doorbell rings (an anchor call's end wakes the daemon at once).
    #[serde(with = "duration_text")]
    pub poll_interval: Duration,
    /// SCHED_FIFO priority of the daemon's loop thread from its wait through the verdicts
    /// (1–99; 0 keeps the normal policy; absent: 1): a verdict then does not wait behind the
    /// engine's threads for a CPU.
    #[serde(default = "verdict_priority")]
    pub verdict_priority: u8,
    /// The probes in an engine remove themselves when stallscope has not renewed their lease
    /// for this long (stallscope was killed); the daemon then attaches them again if it is
    /// still there (absent: 30 s).
    #[serde(with = "duration_text", default = "probe_lease")]
    pub probe_lease: Duration,
    /// Records each thread's lane of an engine's probe ring holds: how far the daemon may
    /// fall behind that thread before its records are lost (absent: 32768).
    #[serde(default = "probe_ring_records")]
    pub probe_ring_records: usize,
    /// θmax.
    pub theta_max: f64,
    /// θmin: the UCL never goes below it (0, the default, is no floor).
    #[serde(default)]
    pub theta_min: f64,
    /// k.
    pub k_sigma: f64,
    /// W: a count of iterations (`10`) or a time (`"250ms"`).
    #[serde(with = "span_text")]
    pub window: Span,
    /// How long the moving mean stays above the threshold before an alert starts: a count of
    /// consecutive iterations (`5`) or a time (`"125ms"`).
    #[serde(with = "span_text")]
    pub start_after: Span,
    /// The least slowdown an alert is worth (observed / predicted duration; absent: 1.0, the
    /// UCL alone decides).
    #[serde(default = "one")]
    pub min_slowdown: f64,
    /// Samples before the first fit.
    pub warmup_samples: usize,
    /// Samples between refits.
    pub refit_every: usize,
    /// Training set cap.
    pub max_training_samples: usize,
    /// Once the training set is full, the time it spans at least (absent: "10m"); see
    /// `model::sentinel::SentinelParams::training_span_ms`.
    #[serde(with = "duration_text", default = "training_span")]
    pub training_span: Duration,
    /// Model prefill and mixed iterations too.
    pub alert_on_prefill: bool,
    /// The recent span whose healthy iterations' median observed/predicted ratio scales the
    /// predictions: a time (`"10s"`) or a count of iterations (`200`; 0: off; absent: off).
    #[serde(with = "span_text", default = "no_recalibration")]
    pub recalibrate_over: Span,
    /// Bound of that scale.
    #[serde(default = "recalibrate_max")]
    pub recalibrate_max: f64,
    /// Iterations of a batch size the model was not fitted on that are learned, not judged,
    /// before a refit takes them in (0: judge every batch size; absent: 100).
    #[serde(default = "learn_unseen_batches")]
    pub learn_unseen_batches: usize,
    /// Keep the GPU plane attached to engine processes with CUPTI loaded, for per-iteration
    /// GPU busy time, launch latency and void share (absent: on).
    #[serde(default = "on")]
    pub gpu: bool,
    /// The share of the time that GPU plane traces: `"always"`, or ON/EVERY (`"1s/10s"`):
    /// CUPTI costs the engine per kernel launch while it traces, and the per-iteration
    /// figures come from the traced stretches only (absent: "1s/10s"). Deep dives trace
    /// their whole window.
    #[serde(with = "sampling_text", default = "gpu_sample")]
    pub gpu_sample: Sampling,
}

fn training_span() -> Duration {
    Duration::from_secs(600)
}

fn gpu_sample() -> Sampling {
    Sampling {
        on_ms: 1000,
        every_ms: 10_000,
    }
}

fn on() -> bool {
    true
}

fn one() -> f64 {
    1.0
}

fn no_recalibration() -> Span {
    Span::Iterations(0)
}

fn recalibrate_max() -> f64 {
    0.2
}

fn learn_unseen_batches() -> usize {
    100
}

fn verdict_priority() -> u8 {
    1
}

fn probe_lease() -> Duration {
    Duration::from_secs(30)
}

fn probe_ring_records() -> usize {
    32768
}

impl SentinelConfig {
    /// The parsed `watch` specs.
    pub fn watch_specs(&self) -> Result<Vec<pyframe_tracer::WatchSpec>> {
        self.watch
            .iter()
            .map(|w| {
                w.parse()
                    .map_err(|e| anyhow::anyhow!("sentinel.watch {w:?}: {e}"))
            })
            .collect()
    }

    /// The model crate's parameters.
    pub fn params(&self) -> SentinelParams {
        SentinelParams {
            baseline: BaselineParams {
                k_sigma: self.k_sigma,
                theta_max: self.theta_max,
                theta_min: self.theta_min,
                ..BaselineParams::default()
            },
            detector: DetectorParams {
                window: self.window,
                start_after: self.start_after,
                min_slowdown: self.min_slowdown,
                ..DetectorParams::default()
            },
            warmup_samples: self.warmup_samples,
            refit_every: self.refit_every,
            max_training_samples: self.max_training_samples,
            training_span_ms: self.training_span.as_millis() as u64,
            alert_on_prefill: self.alert_on_prefill,
            recalibrate_over: self.recalibrate_over,
            recalibrate_max: self.recalibrate_max,
            learn_unseen_batches: self.learn_unseen_batches,
        }
    }
}

/// The HTTP listener.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpConfig {
    /// Address and port.
    pub listen: SocketAddr,
}

/// State and logs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// Directory of fitted models.
    pub dir: PathBuf,
    /// Alert log (empty: `<dir>/alerts.jsonl`).
    pub alerts_log: PathBuf,
    /// Iteration export (empty: off).
    pub iterations_csv: PathBuf,
}

impl StateConfig {
    /// The alert log's path.
    pub fn alerts_log(&self) -> PathBuf {
        if self.alerts_log.as_os_str().is_empty() {
            self.dir.join("alerts.jsonl")
        } else {
            self.alerts_log.clone()
        }
    }
}

impl Config {
    /// Parses a configuration document; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Self> {
        let c: Config =
            toml::from_str(text).with_context(|| format!("invalid configuration in {origin}"))?;
        c.validate()
            .with_context(|| format!("invalid configuration in {origin}"))?;
        Ok(c)
    }

    /// Checks every setting; the error names the key and the fix.
    pub fn validate(&self) -> Result<()> {
        let s = &self.sentinel;
        if !(s.theta_max > 0.0 && s.theta_max.is_finite()) {
            bail!("sentinel.theta_max must be a positive number (a relative error such as 0.5)");
        }
        if !(0.0..=s.theta_max).contains(&s.theta_min) {
            bail!("sentinel.theta_min must be between 0 and theta_max (a relative error such as 0.15)");
        }
        if !(s.k_sigma > 0.0 && s.k_sigma.is_finite()) {
            bail!("sentinel.k_sigma must be a positive number (such as 3.0)");
        }
        for (key, span) in [("window", s.window), ("start_after", s.start_after)] {
            if matches!(span, Span::Iterations(0) | Span::Micros(0)) {
                bail!("sentinel.{key} must be at least 1 iteration or above zero time (such as 10 or \"250ms\")");
            }
        }
        if !(1.0..=100.0).contains(&s.min_slowdown) {
            bail!(
                "sentinel.min_slowdown must be between 1.0 (off) and 100 (such as 1.2), not {}",
                s.min_slowdown
            );
        }
        if s.warmup_samples < 20 {
            bail!("sentinel.warmup_samples must be at least 20 (the fit uses 5 folds)");
        }
        if s.poll_interval.is_zero() {
            bail!("sentinel.poll_interval must be above zero (such as \"1ms\")");
        }
        if s.verdict_priority > 99 {
            bail!(
                "sentinel.verdict_priority must be between 0 and 99 (SCHED_FIFO priorities; 1 is enough, 0 keeps the normal policy), not {}",
                s.verdict_priority
            );
        }
        if s.probe_lease < Duration::from_secs(1) {
            bail!("sentinel.probe_lease must be at least 1s (such as \"30s\"): the probes check it once a second");
        }
        if !(1024..=1 << 20).contains(&s.probe_ring_records) {
            bail!(
                "sentinel.probe_ring_records must be between 1024 and 1048576 (such as 32768), not {}: each record takes 128 bytes of shared memory per engine thread",
                s.probe_ring_records
            );
        }
        s.watch_specs()?;
        self.deep_dive.validate()?;
        self.otlp.validate()?;
        self.store.validate()?;
        if self.fleet.group_label.is_empty() || self.fleet.max_calls_per_minute == 0 {
            bail!("fleet.group_label must name an alert label (such as \"serving_group\") and fleet.max_calls_per_minute be at least 1");
        }
        self.pods.source()?;
        if self.pods.timeout.is_zero() {
            bail!("pods.timeout must be above zero (such as \"2s\")");
        }
        if s.framework != "auto" {
            pyframe_tracer::profiles::by_name(&s.framework)
                .map_err(|e| anyhow::anyhow!("sentinel.framework: {e}"))?;
        }
        Ok(())
    }

    /// The embedded default, with the file at `path` laid over it: a file holds only the keys
    /// it changes (a table's keys replace the default's one by one; any other value, arrays
    /// included, replaces it whole). Then the environment's overrides:
    /// `STALLSCOPE_DEEP_DIVE_TOKEN` for `[deep_dive] token`, `STALLSCOPE_KUBELET_URL` for
    /// `[pods] kubelet_url`, `STALLSCOPE_GROUP` for `[fleet] group` and `STALLSCOPE_NODE` for
    /// `[fleet] node` (a DaemonSet sets them from a Secret, the node's IP, a pod label and the
    /// node's name).
    pub fn load(path: Option<&std::path::Path>) -> Result<Self> {
        let mut cfg = match path {
            None => Self::parse(DEFAULT_CONFIG, "the embedded default configuration")?,
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read configuration file {}", p.display()))?;
                Self::parse_over_default(&text, &p.display().to_string())?
            }
        };
        if let Ok(token) = std::env::var("STALLSCOPE_DEEP_DIVE_TOKEN") {
            cfg.deep_dive.token = token;
        }
        if let Ok(group) = std::env::var("STALLSCOPE_GROUP") {
            cfg.fleet.group = group;
        }
        if let Ok(node) = std::env::var("STALLSCOPE_NODE") {
            cfg.fleet.node = node;
        }
        Ok(cfg)
    }

    /// Parses `text` laid over the embedded default; `origin` names it in errors.
    pub fn parse_over_default(text: &str, origin: &str) -> Result<Self> {
        // The default's table is parsed once; the merged table is deserialised as it is, not
        // written out and parsed again.
        static DEFAULT_TABLE: std::sync::LazyLock<toml::Table> = std::sync::LazyLock::new(|| {
            toml::from_str(DEFAULT_CONFIG).expect("the embedded default is valid TOML")
        });
        let mut base = DEFAULT_TABLE.clone();
        let over: toml::Table =
            toml::from_str(text).with_context(|| format!("invalid configuration in {origin}"))?;
        lay_over(&mut base, over);
        let c: Config = toml::Value::Table(base)
            .try_into()
            .with_context(|| format!("invalid configuration in {origin}"))?;
        c.validate()
            .with_context(|| format!("invalid configuration in {origin}"))?;
        Ok(c)
    }
}

/// Lays `over` on `base`: tables key by key, any other value whole.
fn lay_over(base: &mut toml::Table, over: toml::Table) {
    for (k, v) in over {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => lay_over(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// A span of the alert rule: an integer is a count of iterations, a string a time.
mod span_text {
    use model::detector::Span;
    use serde::{Deserialize, Deserializer};

    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Text {
        Count(usize),
        Time(String),
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Span, D::Error> {
        match Text::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "expected a count of iterations (such as 10) or a time (such as \"250ms\")",
            )
        })? {
            Text::Count(n) => Ok(Span::Iterations(n)),
            Text::Time(t) => humantime::parse_duration(&t)
                .map(|d| Span::Micros(d.as_micros().min(u64::MAX as u128) as u64))
                .map_err(|e| serde::de::Error::custom(format!("{t:?}: {e}"))),
        }
    }
}

/// Durations written like `2s` or `500ms`.
mod sampling_text {
    use cupti_sys::sampling::Sampling;
    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Sampling, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

mod duration_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_parses() {
        let c = Config::load(None).unwrap();
        assert!(c
            .watch
            .process_patterns
            .iter()
            .any(|p| p.contains("EngineCore")));
        assert_eq!(c.report.interval, Duration::from_secs(1));
        assert_eq!(c.http.listen.to_string(), "127.0.0.1:9464");
        assert_eq!(c.sentinel.params().warmup_samples, 1000);
        assert_eq!(
            c.state.alerts_log(),
            PathBuf::from("/var/lib/stallscope/alerts.jsonl")
        );
    }

    #[test]
    fn bad_values_are_rejected_with_their_key() {
        let bad = DEFAULT_CONFIG.replace("interval = \"1s\"", "interval = \"ten\"");
        assert!(Config::parse(&bad, "x").is_err());
        let extra = format!("{DEFAULT_CONFIG}\n[nonsense]\nx = 1\n");
        assert!(Config::parse(&extra, "x").is_err());
        let e = Config::parse(
            &DEFAULT_CONFIG.replace("theta_max = 0.5", "theta_max = -1"),
            "x",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("theta_max"), "{e:#}");
        let e = Config::parse(
            &DEFAULT_CONFIG.replace("framework = \"auto\"", "framework = \"tgi\""),
            "x",
        )
        .unwrap_err();
        assert!(format!("{e:#}").contains("no profile named"), "{e:#}");
    }

    /// The alert rule's spans: counts of iterations or times; the default is in time.
    #[test]
    fn alert_rule_spans_are_counts_or_times() {
        let d = Config::load(None).unwrap().sentinel.params().detector;
        assert_eq!(d.window, Span::Micros(1_000_000));
        assert_eq!(d.start_after, Span::Micros(750_000));
        assert_eq!(d.min_slowdown, 1.2);
        let c = Config::parse_over_default(
            "[sentinel]\nwindow = 10\nstart_after = \"1s\"\nmin_slowdown = 1.25\n",
            "x",
        )
        .unwrap();
        let d = c.sentinel.params().detector;
        assert_eq!(d.window, Span::Iterations(10));
        assert_eq!(d.start_after, Span::Micros(1_000_000));
        assert_eq!(d.min_slowdown, 1.25);
        // The recalibration's span likewise: in time by default, a count where given.
        let over = |text: &str| {
            Config::parse_over_default(text, "x")
                .unwrap()
                .sentinel
                .params()
                .recalibrate_over
        };
        assert_eq!(over(""), Span::Micros(10_000_000));
        assert_eq!(
            over("[sentinel]\nrecalibrate_over = 200\n"),
            Span::Iterations(200)
        );
        assert_eq!(
            over("[sentinel]\nrecalibrate_over = 0\n"),
            Span::Iterations(0)
        );
        for (over, key) in [
            ("recalibrate_over = \"often\"", "recalibrate_over"),
            ("window = \"soon\"", "window"),
            ("window = 0", "sentinel.window"),
            ("start_after = \"0s\"", "sentinel.start_after"),
            ("window = -3", "window"),
            ("min_slowdown = 0.5", "sentinel.min_slowdown"),
        ] {
            let e = Config::parse_over_default(&format!("[sentinel]\n{over}\n"), "x").unwrap_err();
            assert!(format!("{e:#}").contains(key), "{over}: {e:#}");
        }
    }

    /// Each bad `[otlp]` setting is refused with an error naming its key.
    #[test]
    fn bad_otlp_settings_name_their_key() {
        for (over, key) in [
            ("endpoint = \"https://collector:4318\"", "plain HTTP only"),
            ("endpoint = \"collector:4318\"", "otlp.endpoint"),
            ("endpoint = \"http://\"", "otlp.endpoint"),
            ("endpoint = \"http://c:4318\"\nbatch = 0", "otlp.batch"),
            (
                "endpoint = \"http://c:4318\"\nbatch = 10\nqueue = 5",
                "otlp.queue",
            ),
            (
                "endpoint = \"http://c:4318\"\ntimeout = \"0s\"",
                "otlp.timeout",
            ),
            ("endpoint = \"http://c:4318\"\nflush = 1", "unknown field"),
        ] {
            let e = Config::parse_over_default(&format!("[otlp]\n{over}\n"), "x").unwrap_err();
            assert!(format!("{e:#}").contains(key), "{over}: {e:#}");
        }
        let ok = Config::parse_over_default(
            "[otlp]\nendpoint = \"http://c:4318\"\n[otlp.headers]\nauthorization = \"Bearer t\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(ok.otlp.headers["authorization"], "Bearer t");
    }

    /// An engine's group: the node's when set, else its pod's label when one is named.
    #[test]
    fn an_engine_group_comes_from_the_node_or_its_pod_label() {
        let labelled = pod_identity::Identity {
            pod_labels: [("team/group".to_string(), "tp8".to_string())].into(),
            ..Default::default()
        };
        let plain = pod_identity::Identity::default();
        for (group, label, id, want) in [
            ("g", "", &labelled, Some("g")),
            ("g", "team/group", &labelled, Some("g")),
            ("", "team/group", &labelled, Some("tp8")),
            ("", "team/group", &plain, None),
            ("", "other", &labelled, None),
            ("", "", &labelled, None),
        ] {
            let f = FleetConfig {
                group: group.into(),
                group_pod_label: label.into(),
                ..FleetConfig::default()
            };
            assert_eq!(f.group_of(id).as_deref(), want, "{group:?} {label:?}");
        }
    }

    /// Each bad `[store]` setting is refused with an error naming its key.
    #[test]
    fn bad_store_settings_name_their_key() {
        for (over, key) in [
            ("endpoint = \"s3.local:9000\"", "store.endpoint"),
            ("endpoint = \"ftp://s3.local\"", "store.endpoint"),
            ("endpoint = \"http://s3:9000\"", "store.bucket"),
            (
                "endpoint = \"http://s3:9000\"\nbucket = \"b\"\nregion = \"\"",
                "store.region",
            ),
            (
                "endpoint = \"http://s3:9000\"\nbucket = \"b\"\nqueue = 0",
                "store.queue",
            ),
            ("bucket = \"b\"\nsecret = \"s\"", "unknown field"),
        ] {
            let e = Config::parse_over_default(&format!("[store]\n{over}\n"), "x").unwrap_err();
            assert!(format!("{e:#}").contains(key), "{over}: {e:#}");
        }
        let ok = Config::parse_over_default(
            "[store]\nendpoint = \"https://s3.eu-west-1.amazonaws.com\"\nbucket = \"b\"\nregion = \"eu-west-1\"\n",
            "x",
        )
        .unwrap();
        assert_eq!(ok.store.prefix, "stallscope");
    }
}
