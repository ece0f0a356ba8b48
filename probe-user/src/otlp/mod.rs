//! OpenTelemetry export over OTLP/HTTP with protobuf bodies (`[otlp]`): the daemon's metrics
//! (periodically, from the Prometheus registry), each alert's start and end as a log record,
//! and each finished deep dive as a span.
//!
//! Nothing here runs on the daemon's loop but a non-blocking hand-over: records and spans go
//! through bounded queues to one export thread ([`worker`]), which also gives new metric
//! families their instruments; the metrics are read and sent by the SDK's periodic reader on
//! its own thread. The resource names the daemon's host, node and
//! (from the downward API's `POD_NAME`/`POD_NAMESPACE`, when set) its own pod; each record and
//! span names its engine (process, pod, container) in its attributes, as a daemon watches
//! several engines under one resource.

mod metrics_bridge;
mod queue;
mod records;
mod worker;

use std::{
    collections::{BTreeSet, HashMap},
    sync::{Arc, Mutex},
    time::Duration,
};

use anyhow::{Context, Result};
use opentelemetry::{
    logs::LoggerProvider as _, metrics::MeterProvider as _, trace::TracerProvider as _, KeyValue,
};
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    logs::{LogExporter as _, SdkLogger, SdkLoggerProvider},
    metrics::{
        data::ResourceMetrics, exporter::PushMetricExporter, PeriodicReader, SdkMeterProvider,
        Temporality,
    },
    trace::{SdkTracer, SdkTracerProvider, SpanExporter as _},
    Resource,
};
use pod_identity::Identity;
use prometheus::IntCounter;

use crate::{
    api::{
        alerts::{Alert, AlertSink},
        state::Shared,
    },
    config::OtlpConfig,
    deep_dive::registry::{Phase, Record},
    os::worker::Worker,
};
use queue::Queue;
use worker::{Counters, Exports};

/// The instrumentation scope of everything stallscope exports.
const SCOPE: &str = "stallscope";

/// A running export. [`Otlp::shutdown`] (or dropping it) sends what it holds, one try, and
/// stops.
pub struct Otlp {
    logger: SdkLogger,
    tracer: SdkTracer,
    logger_provider: SdkLoggerProvider,
    tracer_provider: SdkTracerProvider,
    meter_provider: SdkMeterProvider,
    worker: Mutex<Option<Worker<()>>>,
    /// Deep dives already exported, by id.
    dives_sent: Mutex<BTreeSet<u64>>,
}

impl Otlp {
    /// Starts exporting to `cfg.endpoint` (which must not be empty).
    pub fn start(cfg: &OtlpConfig, shared: Arc<Shared>) -> Result<Otlp> {
        let resource = resource();
        let url = |path: &str| format!("{}{path}", cfg.endpoint.trim_end_matches('/'));
        let headers: HashMap<String, String> = cfg.headers.clone().into_iter().collect();
        let m = &shared.metrics;
        let counters = |signal: &str| Counters {
            exported: m.otlp_exported.with_label_values(&[signal]),
            dropped: m.otlp_dropped.with_label_values(&[signal]),
            failures: m.otlp_failures.with_label_values(&[signal]),
        };
        let (log_counters, span_counters) = (counters("logs"), counters("spans"));
        let metric_failures = counters("metrics").failures;

        let mut logs = opentelemetry_otlp::LogExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url("/v1/logs"))
            .with_timeout(cfg.timeout)
            .with_headers(headers.clone())
            .build()
            .context("building the OTLP log exporter")?;
        logs.set_resource(&resource);
        let mut spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url("/v1/traces"))
            .with_timeout(cfg.timeout)
            .with_headers(headers.clone())
            .build()
            .context("building the OTLP span exporter")?;
        spans.set_resource(&resource);
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url("/v1/metrics"))
            .with_timeout(cfg.timeout)
            .with_headers(headers)
            .with_temporality(Temporality::Cumulative)
            .build()
            .context("building the OTLP metric exporter")?;

        let (log_queue, log_rx) = Queue::new(cfg.queue, "logs", log_counters.dropped.clone());
        let (span_queue, span_rx) = Queue::new(cfg.queue, "spans", span_counters.dropped.clone());
        let logger_provider = SdkLoggerProvider::builder()
            .with_resource(resource.clone())
            .with_log_processor(log_queue)
            .build();
        let tracer_provider = SdkTracerProvider::builder()
            .with_resource(resource.clone())
            .with_span_processor(span_queue)
            .build();
        let reader = PeriodicReader::builder(CountingMetrics {
            inner: metrics,
            failures: metric_failures,
        })
        .with_interval(cfg.metrics_interval)
        .build();
        let meter_provider = SdkMeterProvider::builder()
            .with_resource(resource)
            .with_reader(reader)
            .build();
        let bridge = metrics_bridge::Bridge::new(meter_provider.meter(SCOPE), shared.clone());

        let exports = Exports {
            logs,
            log_rx,
            log_counters,
            spans,
            span_rx,
            span_counters,
            batch: cfg.batch,
            bridge,
            metrics_interval: cfg.metrics_interval,
        };
        let worker = Worker::spawn("stallscope-otlp", move |stop| worker::run(exports, stop))
            .context("starting the OTLP export thread")?;
        let otlp = Otlp {
            logger: logger_provider.logger(SCOPE),
            tracer: tracer_provider.tracer(SCOPE),
            logger_provider,
            tracer_provider,
            meter_provider,
            worker: Mutex::new(Some(worker)),
            dives_sent: Mutex::new(BTreeSet::new()),
        };
        log::info!(
            "OTLP export to {} (metrics every {:?}, alerts as log records, deep dives as spans)",
            cfg.endpoint,
            cfg.metrics_interval
        );
        Ok(otlp)
    }

    /// Exports each finished deep dive of `records` once, as a span; `identity` names its
    /// engine.
    pub fn deep_dives(
        &self,
        records: &[Record],
        mut identity: impl FnMut(u32) -> Option<Identity>,
    ) {
        let mut sent = self.dives_sent.lock().expect("otlp dives lock");
        for r in records {
            if matches!(r.state, Phase::Done | Phase::Failed) && sent.insert(r.id) {
                records::deep_dive_span(&self.tracer, r, identity(r.pid).as_ref());
            }
        }
    }
}

impl AlertSink for Otlp {
    fn alert(&self, event: &str, alert: &Alert) {
        records::alert_record(&self.logger, event, alert);
    }
}

impl Otlp {
    /// Exports the metrics a last time, sends the held records and spans (one try each,
    /// counting what does not go as dropped) and stops. Later calls do nothing.
    pub fn shutdown(&self) {
        let Some(w) = self.worker.lock().expect("otlp worker lock").take() else {
            return;
        };
        let _ = self.meter_provider.shutdown();
        let _ = self.logger_provider.shutdown();
        let _ = self.tracer_provider.shutdown();
        let _ = w.stop();
    }
}

impl Drop for Otlp {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// The daemon's own resource: service, host, node, and its pod when the downward API says.
fn resource() -> Resource {
    let mut attrs = vec![KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        attrs.push(KeyValue::new("host.name", host.trim().to_string()));
    }
    for (var, key) in [
        ("NODE_NAME", "k8s.node.name"),
        ("POD_NAME", "k8s.pod.name"),
        ("POD_NAMESPACE", "k8s.namespace.name"),
    ] {
        if let Ok(v) = std::env::var(var) {
            attrs.push(KeyValue::new(key, v));
        }
    }
    Resource::builder_empty()
        .with_service_name("stallscope")
        .with_attributes(attrs)
        .build()
}

/// The OTLP metric exporter, counting failed exports (the SDK's reader only logs them through
/// its own diagnostics). Metrics are cumulative, so a failed export loses no count: the next
/// one carries it.
struct CountingMetrics {
    inner: opentelemetry_otlp::MetricExporter,
    failures: IntCounter,
}

impl PushMetricExporter for CountingMetrics {
    async fn export(&self, metrics: &ResourceMetrics) -> OTelSdkResult {
        let r = self.inner.export(metrics).await;
        if let Err(e) = &r {
            self.failures.inc();
            log::debug!("OTLP: exporting metrics: {e}");
        }
        r
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}
