//! The bounded hand-over between the daemon's threads and the export worker: an SDK
//! processor that never blocks its caller. A full queue drops the item, counts it, and says
//! so in the log once per outage.

use std::{
    fmt,
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{Receiver, SyncSender, TrySendError},
    },
    time::Duration,
};

use opentelemetry::InstrumentationScope;
use opentelemetry_sdk::{
    error::OTelSdkResult,
    logs::{LogProcessor, SdkLogRecord},
    trace::{SpanData, SpanProcessor},
};
use prometheus::IntCounter;

/// The sending half for one signal (`logs` or `spans`).
pub struct Queue<T> {
    tx: SyncSender<T>,
    signal: &'static str,
    dropped: IntCounter,
    /// Whether a drop was said since the queue last took an item.
    dropping: AtomicBool,
}

impl<T> Queue<T> {
    /// A queue of `capacity` items and the worker's end of it.
    pub fn new(capacity: usize, signal: &'static str, dropped: IntCounter) -> (Self, Receiver<T>) {
        let (tx, rx) = std::sync::mpsc::sync_channel(capacity);
        let q = Queue {
            tx,
            signal,
            dropped,
            dropping: AtomicBool::new(false),
        };
        (q, rx)
    }

    /// Hands `item` to the worker, or drops and counts it when the queue is full (the
    /// collector is slow or down) or the worker has stopped.
    pub fn offer(&self, item: T) {
        match self.tx.try_send(item) {
            Ok(()) => {
                if self.dropping.swap(false, Ordering::Relaxed) {
                    log::info!("OTLP: the {} queue takes items again", self.signal);
                }
            }
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.dropped.inc();
                if !self.dropping.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "OTLP: the {} queue is full (the collector is slow or down): new {} are dropped and counted in stallscope_otlp_dropped_total until it drains",
                        self.signal,
                        self.signal
                    );
                }
            }
        }
    }
}

impl<T> fmt::Debug for Queue<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Queue({})", self.signal)
    }
}

/// Log records (alerts) go to the worker.
impl LogProcessor for Queue<(SdkLogRecord, InstrumentationScope)> {
    fn emit(&self, data: &mut SdkLogRecord, scope: &InstrumentationScope) {
        self.offer((data.clone(), scope.clone()));
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

/// Ended spans (deep dives) go to the worker.
impl SpanProcessor for Queue<SpanData> {
    fn on_start(&self, _span: &mut opentelemetry_sdk::trace::Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        self.offer(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}
