//! OpenTelemetry export, end to end: a daemon on the toy engine exports to a receiver built on
//! opentelemetry-proto's messages (a real OTLP/HTTP decoder). Its metrics, an alert's log
//! record and a deep dive's span arrive with their attributes; with the receiver down for 60 s
//! the daemon's loop goes on, every alert event is either exported or counted as dropped, and
//! the export resumes by itself.

use std::{
    collections::BTreeMap,
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::common::v1::{any_value::Value, AnyValue, KeyValue};

mod common;
use common::daemon::{metric, Daemon};
use common::otlp_receiver::Receiver;
use common::{http_get, require_root, start_engine, start_hog, tmpdir, TOY_HOG};

/// Attributes as strings (numbers printed), by key.
fn attrs(kvs: &[KeyValue]) -> BTreeMap<String, String> {
    kvs.iter()
        .map(|kv| {
            (
                kv.key.clone(),
                kv.value.as_ref().map_or(String::new(), show),
            )
        })
        .collect()
}

fn show(v: &AnyValue) -> String {
    match &v.value {
        Some(Value::StringValue(s)) => s.clone(),
        Some(Value::IntValue(i)) => i.to_string(),
        Some(Value::DoubleValue(d)) => d.to_string(),
        Some(Value::BoolValue(b)) => b.to_string(),
        Some(Value::ArrayValue(a)) => a.values.iter().map(show).collect::<Vec<_>>().join(","),
        other => format!("{other:?}"),
    }
}

/// The log records received so far: (event name, attributes).
fn log_records(rx: &Receiver) -> Vec<(String, BTreeMap<String, String>)> {
    let g = rx.got.lock().unwrap();
    g.logs
        .iter()
        .flat_map(|r| &r.resource_logs)
        .flat_map(|r| &r.scope_logs)
        .flat_map(|s| &s.log_records)
        .map(|l| (l.event_name.clone(), attrs(&l.attributes)))
        .collect()
}

/// Alert events the daemon's alert log holds.
fn alert_events(dir: &std::path::Path) -> usize {
    std::fs::read_to_string(dir.join("alerts.jsonl"))
        .unwrap_or_default()
        .lines()
        .count()
}

/// Hogs the toy's CPU until the daemon alerts, then lets go until the alert ends.
fn alert_cycle(d: &Daemon) {
    let hog = start_hog("0", TOY_HOG);
    d.wait_for("alert", Duration::from_secs(20), |d| {
        d.engine().is_some_and(|e| e["anomaly_active"] == true)
    });
    drop(hog);
    d.wait_for("alert end", Duration::from_secs(30), |d| {
        d.engine().is_some_and(|e| e["anomaly_active"] == false)
    });
}

#[test]
fn otlp_carries_metrics_alerts_and_deep_dives_and_counts_what_a_dead_collector_drops() {
    require_root();
    let rx = Receiver::start();
    let engine = start_engine();
    let pid = engine.id();
    let dir = tmpdir("otlp");
    // A queue of 2 and batches of 1: an outage of a few alert events overflows it.
    let section = format!(
        "\n[otlp]\nendpoint = \"http://127.0.0.1:{}\"\nmetrics_interval = \"1s\"\ntimeout = \"1s\"\nqueue = 2\nbatch = 1\n[otlp.headers]\nx-stallscope-test = \"yes\"\n",
        rx.port
    );
    let d = Daemon::start_with_sections(&dir, pid, 300, &section);
    d.wait_for("fitted model", Duration::from_secs(60), |d| {
        d.engine().is_some_and(|e| e["model_state"] == "fitted")
    });

    // An alert, its deep dive, and the metrics, each with its attributes.
    alert_cycle(&d);
    let dive = d.deep_dive_done();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(20)
        && (rx.got.lock().unwrap().traces.is_empty() || log_records(&rx).len() < 2)
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let records = log_records(&rx);
    let (start_name, start) = records
        .iter()
        .find(|(n, _)| n == "stallscope.alert.start")
        .unwrap_or_else(|| panic!("no alert start record in {records:?}\n{}", d.log()));
    assert_eq!(start_name, "stallscope.alert.start");
    assert_eq!(start["process.pid"], pid.to_string(), "{start:?}");
    for key in [
        "stallscope.alert.id",
        "stallscope.alert.moving_mean",
        "stallscope.alert.window_slowdown",
        "stallscope.alert.ucl",
        "stallscope.alert.severity",
        "stallscope.trigger.end_ns",
        "stallscope.trigger.duration_us",
        "stallscope.trigger.predicted_us",
        "stallscope.trigger.stage",
        "stallscope.workload.batch",
        "stallscope.workload.tokens",
    ] {
        assert!(start.contains_key(key), "{key} missing from {start:?}");
    }
    assert!(
        records.iter().any(|(n, _)| n == "stallscope.alert.end"),
        "{records:?}"
    );
    let spans: Vec<_> = {
        let g = rx.got.lock().unwrap();
        g.traces
            .iter()
            .flat_map(|t| &t.resource_spans)
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| {
                (
                    s.name.clone(),
                    attrs(&s.attributes),
                    s.end_time_unix_nano > s.start_time_unix_nano,
                )
            })
            .collect()
    };
    let (_, span, ordered) = spans
        .iter()
        .find(|(n, _, _)| n == "stallscope.deep_dive")
        .unwrap_or_else(|| panic!("no deep-dive span: {spans:?}"));
    assert!(ordered, "the span ends after it starts");
    assert_eq!(
        span["stallscope.deep_dive.trace"],
        dive["trace"].as_str().unwrap()
    );
    assert_eq!(span["process.pid"], pid.to_string());
    assert!(
        span.contains_key("stallscope.deep_dive.suspects"),
        "{span:?}"
    );
    let (metric_names, resource) = {
        let g = rx.got.lock().unwrap();
        let names: Vec<String> = g
            .metrics
            .iter()
            .flat_map(|m| &m.resource_metrics)
            .flat_map(|r| &r.scope_metrics)
            .flat_map(|s| &s.metrics)
            .map(|m| m.name.clone())
            .collect();
        let resource = g
            .metrics
            .first()
            .and_then(|m| m.resource_metrics.first())
            .and_then(|r| r.resource.clone())
            .map(|r| attrs(&r.attributes))
            .unwrap_or_default();
        (names, resource)
    };
    for name in [
        "stallscope_iterations_total",
        "stallscope_alerts_total",
        "stallscope_iteration_duration_seconds_count",
    ] {
        assert!(
            metric_names.iter().any(|n| n == name),
            "{name} not exported: {metric_names:?}"
        );
    }
    assert_eq!(
        resource.get("service.name").map(String::as_str),
        Some("stallscope"),
        "{resource:?}"
    );
    assert!(resource.contains_key("host.name"), "{resource:?}");
    assert!(
        rx.got.lock().unwrap().bad.is_empty(),
        "undecodable requests"
    );

    // The collector goes away for 60 s while alerts come and go.
    let before_outage = log_records(&rx).len();
    rx.stop();
    let down = Instant::now();
    let iterations_before = d.iterations();
    let mut cycles = 0;
    while down.elapsed() < Duration::from_secs(45) || cycles < 2 {
        alert_cycle(&d);
        cycles += 1;
    }
    while down.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(
        d.iterations() > iterations_before + 1000,
        "the daemon's loop went on while the collector was down"
    );
    let m = http_get(d.port, "/metrics");
    assert!(
        metric(
            &m,
            "stallscope_otlp_export_failures_total{signal=\"metrics\"}"
        ) > 0.0,
        "{m}"
    );
    let dropped = metric(&m, "stallscope_otlp_dropped_total{signal=\"logs\"}");
    assert!(
        dropped > 0.0,
        "{cycles} alert cycles overflowed a queue of 2: {m}"
    );

    // Back: held records go out, and new ones.
    let rx = rx.restart();
    alert_cycle(&d);
    let events = alert_events(&dir);
    let settled = |d: &Daemon| {
        let m = http_get(d.port, "/metrics");
        metric(&m, "stallscope_otlp_exported_total{signal=\"logs\"}")
            + metric(&m, "stallscope_otlp_dropped_total{signal=\"logs\"}")
            == events as f64
    };
    d.wait_for(
        "every alert event exported or dropped",
        Duration::from_secs(30),
        settled,
    );
    let m = http_get(d.port, "/metrics");
    let exported = metric(&m, "stallscope_otlp_exported_total{signal=\"logs\"}");
    let received = log_records(&rx).len();
    eprintln!(
        "alert events {events}: exported {exported}, dropped {dropped_now}; the receiver got {received} ({before_outage} before the {cycles}-cycle outage)",
        dropped_now = metric(&m, "stallscope_otlp_dropped_total{signal=\"logs\"}")
    );
    assert_eq!(
        received as f64, exported,
        "the receiver got every record the daemon counts as exported, once"
    );
    assert!(
        received > before_outage,
        "the export resumed by itself: {received} records, {before_outage} before the outage"
    );
    drop(d);
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}
