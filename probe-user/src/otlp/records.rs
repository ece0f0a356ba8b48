//! What an alert and a deep dive look like in OpenTelemetry: an alert's start and end are
//! log records (event `stallscope.alert.start` / `stallscope.alert.end`), a deep dive is a
//! span over its windows. Engine identity attributes follow the semantic conventions
//! (`process.pid`, `k8s.*`, `container.id`); stallscope's own are under `stallscope.`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry::{
    logs::{AnyValue, LogRecord as _, Logger as _, Severity as LogSeverity},
    trace::{Span as _, Status, Tracer as _},
    Array, KeyValue, StringValue, Value,
};
use opentelemetry_sdk::{logs::SdkLogger, trace::SdkTracer};
use pod_identity::Identity;

use crate::{
    api::alerts::{Alert, Severity},
    deep_dive::registry::{Phase, Record},
};

fn at_unix_ms(ms: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(ms)
}

/// An identity attribute's value (log records and spans take different value types).
enum Attr {
    Str(String),
    Int(i64),
}

/// The engine's identity as attributes.
fn identity_attributes(pid: u32, id: Option<&Identity>) -> Vec<(&'static str, Attr)> {
    let mut attrs = vec![("process.pid", Attr::Int(i64::from(pid)))];
    let Some(id) = id else {
        return attrs;
    };
    for (key, value) in [
        ("k8s.namespace.name", &id.namespace),
        ("k8s.pod.name", &id.pod),
        ("k8s.pod.uid", &id.pod_uid),
        ("k8s.container.name", &id.container),
        ("container.id", &id.container_id),
    ] {
        if let Some(v) = value {
            attrs.push((key, Attr::Str(v.clone())));
        }
    }
    if let Some(rt) = id.runtime {
        attrs.push(("container.runtime.name", Attr::Str(rt.to_string())));
    }
    if let Some(p) = id.pid_in_container {
        attrs.push(("stallscope.container_pid", Attr::Int(i64::from(p))));
    }
    attrs
}

/// Emits `alert`'s `event` (`alert_start` or `alert_end`) as a log record.
pub fn alert_record(logger: &SdkLogger, event: &str, a: &Alert) {
    let (name, at_ms, what) = match (event, a.ended_unix_ms) {
        ("alert_end", Some(end)) => ("stallscope.alert.end", end, "ended"),
        _ => ("stallscope.alert.start", a.started_unix_ms, "started"),
    };
    let mut r = logger.create_log_record();
    r.set_event_name(name);
    r.set_timestamp(at_unix_ms(at_ms));
    match a.severity {
        Severity::Warning => {
            r.set_severity_number(LogSeverity::Warn);
            r.set_severity_text("WARN");
        }
        Severity::Critical => {
            r.set_severity_number(LogSeverity::Error);
            r.set_severity_text("ERROR");
        }
    }
    r.set_body(AnyValue::from(format!(
        "engine {}: alert {} {what}: {} iterations {:.0}% slower than the baseline predicts (moving mean of E {:.3}, threshold {:.3})",
        a.identity.short().unwrap_or_else(|| format!("pid {}", a.pid)),
        a.id,
        a.stage,
        100.0 * (a.window_slowdown - 1.0),
        a.moving_mean,
        a.ucl
    )));
    for (key, value) in identity_attributes(a.pid, Some(&a.identity)) {
        match value {
            Attr::Str(v) => r.add_attribute(key, v),
            Attr::Int(v) => r.add_attribute(key, v),
        }
    }
    let w = &a.workload;
    let numbers: [(&'static str, f64); 13] = [
        ("stallscope.alert.moving_mean", a.moving_mean),
        ("stallscope.alert.window_slowdown", a.window_slowdown),
        ("stallscope.alert.ucl", a.ucl),
        (
            "stallscope.alert.detection_latency_us",
            a.detection_latency_us,
        ),
        ("stallscope.trigger.duration_us", a.duration_us),
        ("stallscope.trigger.predicted_us", a.predicted_us),
        ("stallscope.workload.batch", w.batch),
        ("stallscope.workload.input_len", w.input_len),
        ("stallscope.workload.output_len", w.output_len),
        ("stallscope.workload.tokens", w.tokens),
        ("stallscope.workload.overlap_tokens", w.overlap_tokens),
        ("stallscope.alert.iterations", a.iterations as f64),
        ("stallscope.alert.slowdown", a.slowdown),
    ];
    for (k, v) in numbers {
        r.add_attribute(k, v);
    }
    r.add_attribute("stallscope.alert.id", a.id as i64);
    r.add_attribute("stallscope.alert.severity", a.severity.as_str());
    r.add_attribute("stallscope.trigger.stage", a.stage);
    // CLOCK_MONOTONIC ns, as an integer (an f64 loses nanoseconds past 2^53).
    r.add_attribute(
        "stallscope.trigger.end_ns",
        a.trigger_iteration_end_ns as i64,
    );
    logger.emit(r);
}

/// Ends a span for deep dive `r` (done or failed) over its windows.
pub fn deep_dive_span(tracer: &SdkTracer, r: &Record, id: Option<&Identity>) {
    let start = at_unix_ms(r.requested_unix_ms);
    let end = at_unix_ms(r.requested_unix_ms + r.baseline_ms + r.duration_ms);
    let mut attrs: Vec<KeyValue> = identity_attributes(r.pid, id)
        .into_iter()
        .map(|(key, value)| match value {
            Attr::Str(v) => KeyValue::new(key, v),
            Attr::Int(v) => KeyValue::new(key, v),
        })
        .collect();
    attrs.push(KeyValue::new("stallscope.deep_dive.id", r.id as i64));
    attrs.push(KeyValue::new(
        "stallscope.deep_dive.trigger",
        r.trigger.clone(),
    ));
    attrs.push(KeyValue::new(
        "stallscope.deep_dive.duration_ms",
        r.duration_ms as i64,
    ));
    for (key, value) in [
        ("stallscope.deep_dive.trace", &r.trace),
        ("stallscope.deep_dive.report", &r.report),
        ("stallscope.deep_dive.summary", &r.summary),
        ("stallscope.deep_dive.category", &r.category),
        ("stallscope.deep_dive.error", &r.error),
    ] {
        if let Some(v) = value {
            attrs.push(KeyValue::new(key, v.clone()));
        }
    }
    let names: Vec<StringValue> = r.suspects.iter().map(|s| s.name.clone().into()).collect();
    let scores: Vec<f64> = r.suspects.iter().map(|s| s.score).collect();
    attrs.push(KeyValue::new(
        "stallscope.deep_dive.suspects",
        Value::Array(Array::String(names)),
    ));
    attrs.push(KeyValue::new(
        "stallscope.deep_dive.suspect_scores",
        Value::Array(Array::F64(scores)),
    ));
    let mut span = tracer
        .span_builder("stallscope.deep_dive")
        .with_start_time(start)
        .with_attributes(attrs)
        .start(tracer);
    span.set_status(match r.state {
        Phase::Failed => Status::error(r.error.clone().unwrap_or_default()),
        _ => Status::Ok,
    });
    span.end_with_timestamp(end);
}
