//! The Prometheus metrics `stallscope run` serves on `/metrics`.

use std::sync::Arc;

use pod_identity::Identity;
use prometheus::{
    exponential_buckets, Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// The labels of every per-process series: the process, and its place in the cluster (empty
/// outside pods): the pod's namespace and name, the container's name, the pod UID, the
/// container id and the process's pid inside its PID namespace.
pub const PROCESS_LABELS: [&str; 7] = [
    "pid",
    "namespace",
    "pod",
    "container",
    "pod_uid",
    "container_id",
    "container_pid",
];

/// One process's values of [`PROCESS_LABELS`].
#[derive(Debug, Clone)]
pub struct ProcessLabels(Arc<[String; 7]>);

impl ProcessLabels {
    /// The labels of `pid`, placed by `id`.
    pub fn new(pid: u32, id: &Identity) -> Self {
        let s = |v: &Option<String>| v.clone().unwrap_or_default();
        ProcessLabels(Arc::new([
            pid.to_string(),
            s(&id.namespace),
            s(&id.pod),
            s(&id.container),
            s(&id.pod_uid),
            s(&id.container_id),
            id.pid_in_container
                .map(|p| p.to_string())
                .unwrap_or_default(),
        ]))
    }

    /// The values, followed by `extra` (the series' own labels, in the order registered).
    pub fn with<'a>(&'a self, extra: &[&'a str]) -> Vec<&'a str> {
        self.0
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect()
    }
}

/// [`PROCESS_LABELS`] followed by a series' own labels.
fn process_and(extra: &[&'static str]) -> Vec<&'static str> {
    PROCESS_LABELS.iter().chain(extra).copied().collect()
}

/// Every metric, registered in one registry. Labels: [`PROCESS_LABELS`] on every per-process
/// series, `stage` (`prefill`, `decode`, `mixed`), `tid`/`comm` (engine threads).
pub struct Metrics {
    registry: Registry,
    /// Engine iterations observed.
    pub iterations: IntCounterVec,
    /// Iteration durations.
    pub duration: HistogramVec,
    /// Last predicted duration of a modelled iteration.
    pub predicted: GaugeVec,
    /// Last positive prediction error E.
    pub error: GaugeVec,
    /// Moving mean of E over the window.
    pub error_mean: GaugeVec,
    /// The UCL in force.
    pub ucl: GaugeVec,
    /// Modelled iterations not judged, by reason (`unseen_batch`).
    pub unjudged: IntCounterVec,
    /// Alerts raised.
    pub alerts: IntCounterVec,
    /// 1 while an alert is open.
    pub anomaly_active: IntGaugeVec,
    /// 1 for the model's current state (`warming`, `fitting`, `fitted`).
    pub model_state: IntGaugeVec,
    /// Healthy samples held for training.
    pub training_samples: IntGaugeVec,
    /// Samples the current model was fitted on.
    pub model_samples: IntGaugeVec,
    /// Probe records lost in the shared-memory ring.
    pub lost_records: IntCounterVec,
    /// Drains that found a lane of the probe ring with its write sequence below its read one.
    pub ring_resyncs: IntCounterVec,
    /// Kernel-accounted time of the engine's threads, by state.
    pub thread_seconds: prometheus::CounterVec,
    /// Engines attached.
    pub engines: IntGaugeVec,
    /// From a modelled iteration's end to its verdict (alert or not).
    pub verdict_latency: prometheus::Histogram,
    /// 1 when the loop thread waits for verdicts at a real-time priority.
    pub verdict_realtime: prometheus::IntGauge,
    /// Wall time of each phase of the daemon's loop, by `phase`.
    pub loop_phase: HistogramVec,
    /// GPU busy time inside each iteration (GPU plane).
    pub gpu_busy: HistogramVec,
    /// Share of each iteration in which the GPU ran nothing.
    pub gpu_void: HistogramVec,
    /// Kernel start minus its launching call's start.
    pub gpu_launch: HistogramVec,
    /// OTLP items (`signal`: `logs`, `spans`) the collector took.
    pub otlp_exported: IntCounterVec,
    /// OTLP items dropped: a full queue while the collector was slow or down, or unsent at
    /// shutdown.
    pub otlp_dropped: IntCounterVec,
    /// Failed OTLP export requests (`signal`: `logs`, `spans`, `metrics`).
    pub otlp_failures: IntCounterVec,
    /// Deep dives uploaded to the store.
    pub store_uploaded: IntCounter,
    /// Deep dives not uploaded: the queue was full while the store was slow or down, or they
    /// were still waiting at shutdown.
    pub store_dropped: IntCounter,
    /// Failed store requests (each retried).
    pub store_failures: IntCounter,
    /// Writes into the state directory that failed (`file`: alert_log, export, model), a full
    /// disk or a read-only directory; the daemon goes on without them.
    pub state_write_failures: IntCounterVec,
    /// Each serving group of this node's engines (`[fleet] group`, or each engine's pod
    /// label), as a label of a series at 1: Prometheus rules join a node's alerts to its
    /// groups through it.
    pub fleet_group: IntGaugeVec,
    /// HTTP connections closed at once because the listener's cap was reached.
    pub http_refused_connections: IntCounter,
    /// The daemon's own heap, read at each scrape.
    pub heap: IntGaugeVec,
}

fn opts(name: &str, help: &str) -> Opts {
    Opts::new(name, help).namespace("stallscope")
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let r = &registry;
        fn reg<T: prometheus::core::Collector + Clone + 'static>(r: &Registry, m: T) -> T {
            r.register(Box::new(m.clone()))
                .expect("metric names are unique");
            m
        }
        let (pid, pid_stage) = (&process_and(&[]), &process_and(&["stage"]));
        Self {
            iterations: reg(r, IntCounterVec::new(opts("iterations_total", "Engine iterations observed"), pid_stage).unwrap()),
            duration: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new("iteration_duration_seconds", "Engine iteration duration")
                        .namespace("stallscope")
                        .buckets(exponential_buckets(0.001, 1.5, 24).unwrap()),
                    pid_stage,
                )
                .unwrap(),
            ),
            predicted: reg(r, GaugeVec::new(opts("iteration_predicted_seconds", "Baseline prediction of the last modelled iteration"), pid).unwrap()),
            error: reg(r, GaugeVec::new(opts("prediction_error_ratio", "Positive prediction error E = max(0, (y - yhat)/(y + eps)) of the last modelled iteration"), pid).unwrap()),
            error_mean: reg(r, GaugeVec::new(opts("prediction_error_moving_mean_ratio", "Moving mean of E over the detector window"), pid).unwrap()),
            ucl: reg(r, GaugeVec::new(opts("ucl_ratio", "Upper control limit of the moving mean of E"), pid).unwrap()),
            unjudged: reg(r, IntCounterVec::new(opts("iterations_unjudged_total", "Modelled iterations the sentinel learned instead of judging (reason unseen_batch: a batch unlike the model's training batches, in size or in sharing a pipeline, while no alert was open)"), &process_and(&["reason"])).unwrap()),
            alerts: reg(r, IntCounterVec::new(opts("alerts_total", "Alerts raised"), pid).unwrap()),
            anomaly_active: reg(r, IntGaugeVec::new(opts("anomaly_active", "1 while an alert is open"), pid).unwrap()),
            model_state: reg(r, IntGaugeVec::new(opts("model_state", "1 for the baseline model's current state"), &process_and(&["state"])).unwrap()),
            training_samples: reg(r, IntGaugeVec::new(opts("model_training_samples", "Healthy iterations held for (re)fitting"), pid).unwrap()),
            model_samples: reg(r, IntGaugeVec::new(opts("model_fitted_samples", "Iterations the current baseline was fitted on"), pid).unwrap()),
            lost_records: reg(r, IntCounterVec::new(opts("probe_lost_records_total", "Python probe records lost because the ring was full"), pid).unwrap()),
            ring_resyncs: reg(r, IntCounterVec::new(opts("probe_ring_resyncs_total", "Drains that found a lane of the probe ring with its write sequence below its read one (the ring's counters were written over); nothing is read from such a lane until it catches up"), pid).unwrap()),
            thread_seconds: reg(r, prometheus::CounterVec::new(opts("thread_seconds_total", "Kernel-accounted time of engine threads by state (on_cpu, runqueue_wait, blocked)"), &process_and(&["tid", "comm", "state"])).unwrap()),
            engines: reg(r, IntGaugeVec::new(opts("engines_attached", "1 per engine process the sentinel is attached to"), &process_and(&["framework"])).unwrap()),
            verdict_latency: reg(
                r,
                prometheus::Histogram::with_opts(
                    HistogramOpts::new(
                        "verdict_latency_seconds",
                        "From a modelled iteration's end to the sentinel's verdict on it (an alert is raised at that moment)",
                    )
                    .namespace("stallscope")
                    .buckets(exponential_buckets(25e-6, 2.0, 12).unwrap()),
                )
                .unwrap(),
            ),
            verdict_realtime: reg(r, prometheus::IntGauge::with_opts(opts("verdict_realtime", "1 when the daemon's loop thread waits for and makes verdicts at SCHED_FIFO ([sentinel] verdict_priority), 0 at the normal policy")).unwrap()),
            loop_phase: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new(
                        "loop_phase_seconds",
                        "Wall time of each pass of the daemon's loop through a phase (rescan, sentinel, deep_dive, capture_start, capture_finish, accounting); an iteration that ends meanwhile waits for its verdict",
                    )
                    .namespace("stallscope")
                    .buckets(exponential_buckets(25e-6, 2.0, 14).unwrap()),
                    &["phase"],
                )
                .unwrap(),
            ),
            gpu_busy: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new("iteration_gpu_busy_seconds", "GPU busy time inside each iteration (union over streams)")
                        .namespace("stallscope")
                        .buckets(exponential_buckets(0.0001, 1.5, 24).unwrap()),
                    pid,
                )
                .unwrap(),
            ),
            gpu_void: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new("iteration_gpu_void_ratio", "Share of each iteration in which the GPU ran nothing")
                        .namespace("stallscope")
                        .buckets(prometheus::linear_buckets(0.05, 0.05, 20).unwrap()),
                    pid,
                )
                .unwrap(),
            ),
            gpu_launch: reg(
                r,
                HistogramVec::new(
                    HistogramOpts::new("gpu_launch_latency_seconds", "Kernel start minus the start of its launching API call")
                        .namespace("stallscope")
                        .buckets(exponential_buckets(1e-6, 2.0, 18).unwrap()),
                    pid,
                )
                .unwrap(),
            ),
            otlp_exported: reg(r, IntCounterVec::new(opts("otlp_exported_total", "OTLP log records and spans the collector took"), &["signal"]).unwrap()),
            otlp_dropped: reg(r, IntCounterVec::new(opts("otlp_dropped_total", "OTLP log records and spans dropped (queue full while the collector was slow or down, or unsent at shutdown)"), &["signal"]).unwrap()),
            otlp_failures: reg(r, IntCounterVec::new(opts("otlp_export_failures_total", "Failed OTLP export requests"), &["signal"]).unwrap()),
            store_uploaded: reg(r, IntCounter::with_opts(opts("store_uploaded_total", "Deep dives uploaded to the shared store")).unwrap()),
            store_dropped: reg(r, IntCounter::with_opts(opts("store_dropped_total", "Deep dives not uploaded to the shared store (queue full while it was slow or down, or waiting at shutdown)")).unwrap()),
            store_failures: reg(r, IntCounter::with_opts(opts("store_failures_total", "Failed requests to the shared store (retried)")).unwrap()),
            state_write_failures: reg(r, IntCounterVec::new(opts("state_write_failures_total", "Writes into the state directory that failed (full disk, read-only directory); the daemon goes on without them"), &["file"]).unwrap()),
            fleet_group: reg(r, IntGaugeVec::new(opts("fleet_group_info", "1 per serving group of this node's engines ([fleet] group or group_pod_label), with this node's name ([fleet] node)"), &["serving_group", "node"]).unwrap()),
            http_refused_connections: reg(r, IntCounter::with_opts(opts("http_refused_connections_total", "HTTP connections closed at once because the listener already served its maximum")).unwrap()),
            heap: reg(r, IntGaugeVec::new(opts("daemon_heap_bytes", "The daemon's malloc heap at this scrape: in_use (allocated), free (in the allocator's free lists: resident unless trimmed)"), &["state"]).unwrap()),
            registry,
        }
    }

    /// Every metric family with at least one series, as the registry gathers them, the
    /// daemon's heap read now: both the scrape and the OTLP export come through here.
    pub fn gather(&self) -> Vec<prometheus::proto::MetricFamily> {
        let heap = crate::os::memory::heap();
        self.heap
            .with_label_values(&["in_use"])
            .set(heap.in_use as i64);
        self.heap.with_label_values(&["free"]).set(heap.free as i64);
        self.registry.gather()
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.gather(), &mut buf)
            .expect("text encoding cannot fail");
        String::from_utf8(buf).expect("the text format is UTF-8")
    }

    /// Removes the kernel-time series of a process's threads (`threads`: the (tid, comm)
    /// labels used).
    pub fn forget_threads(&self, p: &ProcessLabels, threads: &[(String, String)]) {
        for (tid, comm) in threads {
            for state in THREAD_STATES {
                let _ = self
                    .thread_seconds
                    .remove_label_values(&p.with(&[tid, comm, state]));
            }
        }
    }

    /// Removes an engine's series once it is gone (`threads`: the (tid, comm) labels used).
    pub fn forget_engine(&self, p: &ProcessLabels, framework: &str, threads: &[(String, String)]) {
        for stage in ["prefill", "decode", "mixed"] {
            let _ = self.iterations.remove_label_values(&p.with(&[stage]));
            let _ = self.duration.remove_label_values(&p.with(&[stage]));
        }
        for state in ["warming", "fitting", "fitted"] {
            let _ = self.model_state.remove_label_values(&p.with(&[state]));
        }
        self.forget_threads(p, threads);
        let _ = self.engines.remove_label_values(&p.with(&[framework]));
        let pid = p.with(&[]);
        for g in [&self.predicted, &self.error, &self.error_mean, &self.ucl] {
            let _ = g.remove_label_values(&pid);
        }
        for g in [
            &self.anomaly_active,
            &self.training_samples,
            &self.model_samples,
        ] {
            let _ = g.remove_label_values(&pid);
        }
        let _ = self.alerts.remove_label_values(&pid);
        let _ = self
            .unjudged
            .remove_label_values(&p.with(&["unseen_batch"]));
        let _ = self.lost_records.remove_label_values(&pid);
        let _ = self.ring_resyncs.remove_label_values(&pid);
        for h in [&self.gpu_busy, &self.gpu_void, &self.gpu_launch] {
            let _ = h.remove_label_values(&pid);
        }
    }
}

/// `state` label values of `stallscope_thread_seconds_total`.
pub const THREAD_STATES: [&str; 3] = ["on_cpu", "runqueue_wait", "blocked"];
