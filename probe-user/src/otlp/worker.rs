//! The export worker: takes log records and spans from their queues in batches and sends
//! them with the OTLP exporters, on a thread of its own (the exporters' blocking HTTP client
//! must not run inside the daemon's async runtime, and a slow collector must never hold up
//! the loop).
//!
//! A batch that fails is kept and sent again after a backoff (1 s doubling to 10 s) while the
//! queues fill behind it; the exporter itself retries a network error 3 times within its
//! timeout first. Every item is thus exported, dropped at a full queue and counted there, or
//! counted as dropped at shutdown: nothing is lost silently.

use std::{
    sync::{atomic::AtomicBool, atomic::Ordering, mpsc::Receiver},
    time::{Duration, Instant},
};

use log::{info, warn};
use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::{
    logs::{LogBatch, LogExporter as _, SdkLogRecord},
    trace::{SpanData, SpanExporter as _},
};
use prometheus::IntCounter;

use super::metrics_bridge::Bridge;

/// The counters of one signal.
#[derive(Clone)]
pub struct Counters {
    pub exported: IntCounter,
    pub dropped: IntCounter,
    pub failures: IntCounter,
}

/// What the worker owns.
pub struct Exports {
    pub logs: opentelemetry_otlp::LogExporter,
    pub log_rx: Receiver<(SdkLogRecord, InstrumentationScope)>,
    pub log_counters: Counters,
    pub spans: opentelemetry_otlp::SpanExporter,
    pub span_rx: Receiver<SpanData>,
    pub span_counters: Counters,
    pub batch: usize,
    /// Gives metric families instruments, every `metrics_interval`.
    pub bridge: Bridge,
    pub metrics_interval: Duration,
}

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(10);
/// How long the worker waits for new items before looking at its stop flag again.
const TICK: Duration = Duration::from_millis(100);

/// Runs until `stop` is raised, then sends what is left (one try each) and counts the rest
/// as dropped.
pub fn run(mut x: Exports, stop: &AtomicBool) {
    let mut logs: Vec<(SdkLogRecord, InstrumentationScope)> = Vec::new();
    let mut spans: Vec<SpanData> = Vec::new();
    let mut backoff: Option<(Instant, Duration)> = None;
    let mut refreshed: Option<Instant> = None;
    loop {
        if refreshed.is_none_or(|t| t.elapsed() >= x.metrics_interval) {
            x.bridge.refresh();
            refreshed = Some(Instant::now());
        }
        let stopping = stop.load(Ordering::Acquire);
        fill(&x.log_rx, &mut logs, x.batch);
        fill(&x.span_rx, &mut spans, x.batch);
        let due = backoff.is_none_or(|(at, _)| Instant::now() >= at);
        if due || stopping {
            let ok = send_logs(&mut x, &mut logs) & send_spans(&mut x, &mut spans);
            backoff = match (ok, backoff) {
                (true, Some(_)) => {
                    info!("OTLP: the collector answers again");
                    None
                }
                (true, None) => None,
                (false, b) => {
                    let wait = b.map_or(FIRST_BACKOFF, |(_, w)| (w * 2).min(MAX_BACKOFF));
                    if b.is_none() {
                        warn!("OTLP: export failed; held items are sent again every {FIRST_BACKOFF:?} to {MAX_BACKOFF:?}, new ones queue behind them");
                    }
                    Some((Instant::now() + wait, wait))
                }
            };
        }
        if stopping {
            let left = logs.len() + x.log_rx.try_iter().count();
            x.log_counters.dropped.inc_by(left as u64);
            let left_spans = spans.len() + x.span_rx.try_iter().count();
            x.span_counters.dropped.inc_by(left_spans as u64);
            if left + left_spans > 0 {
                warn!("OTLP: {left} log records and {left_spans} spans not exported at shutdown (counted as dropped)");
            }
            return;
        }
        if logs.is_empty() && spans.is_empty() {
            // Wait for the first item of either signal (spans are rare: polled each tick).
            if let Ok(item) = x.log_rx.recv_timeout(TICK) {
                logs.push(item);
            }
        } else {
            std::thread::sleep(
                TICK.min(
                    backoff.map_or(TICK, |(at, _)| at.saturating_duration_since(Instant::now())),
                ),
            );
        }
    }
}

/// Tops `held` up to `batch` items from `rx`.
fn fill<T>(rx: &Receiver<T>, held: &mut Vec<T>, batch: usize) {
    while held.len() < batch {
        match rx.try_recv() {
            Ok(item) => held.push(item),
            Err(_) => break,
        }
    }
}

impl Counters {
    /// Counts the export of `held` (`what` names its items in the log) and empties it if it
    /// went; whether it went.
    fn account<T>(&self, result: OTelSdkResult, held: &mut Vec<T>, what: &str) -> bool {
        match result {
            Ok(()) => {
                self.exported.inc_by(held.len() as u64);
                held.clear();
                true
            }
            Err(e) => {
                self.failures.inc();
                log::debug!("OTLP: exporting {} {what}: {e}", held.len());
                false
            }
        }
    }
}

/// Sends the held log records; whether they went (or there were none).
fn send_logs(x: &mut Exports, held: &mut Vec<(SdkLogRecord, InstrumentationScope)>) -> bool {
    if held.is_empty() {
        return true;
    }
    let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> =
        held.iter().map(|(r, s)| (r, s)).collect();
    let result = futures_executor::block_on(x.logs.export(LogBatch::new(&refs)));
    x.log_counters.account(result, held, "log records")
}

/// Sends the held spans; whether they went (or there were none).
fn send_spans(x: &mut Exports, held: &mut Vec<SpanData>) -> bool {
    if held.is_empty() {
        return true;
    }
    let result = futures_executor::block_on(x.spans.export(held.clone()));
    x.span_counters.account(result, held, "spans")
}
