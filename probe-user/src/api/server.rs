//! The HTTP listener's accept loop, with the limits a node daemon needs against clients it
//! does not control (it listens on the node's network when the fleet scrapes it):
//! - at most [`MAX_CONNECTIONS`] connections at once; one more is closed at once, so a flood
//!   cannot starve the Prometheus scrape of file descriptors or memory for long;
//! - the request head (line and headers) within [`HEAD_TIMEOUT`] (a slow or endless head is
//!   cut off: slowloris), at most 100 headers (hyper's own limit; 431) and at most
//!   [`MAX_HEAD_BYTES`] of target and headers (431; hyper's read buffer bounds what is read
//!   before that check);
//! - the whole request, body included, answered within [`REQUEST_TIMEOUT`] or refused with
//!   408 (a body trickled byte by byte);
//! - a connection is closed after [`MAX_CONNECTION_AGE`] however busy it keeps itself.
//!
//! Bodies are bounded per route ([`axum::extract::DefaultBodyLimit`], 413 past it).

use std::{
    collections::HashMap,
    future::Future,
    pin::pin,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use axum::{
    body::Body,
    extract::Request,
    http::StatusCode,
    response::{IntoResponse, Response},
    Router,
};
use hyper::body::Incoming;
use hyper_util::{
    rt::{TokioIo, TokioTimer},
    service::TowerToHyperService,
};
use tokio::{net::TcpListener, sync::Semaphore};
use tower::ServiceExt;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest a client may take to send a request's line and headers.
pub const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest request target and headers, in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;
/// Longest a request may take from its head to its answer.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest a connection stays open.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(300);
/// How long open connections get to finish once the server stops.
const DRAIN: Duration = Duration::from_secs(2);

/// Serves `app` on `listener` until `stop` resolves, then lets open connections finish for
/// a moment. `refused` counts the connections closed at the cap.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    refused: prometheus::IntCounter,
    stop: impl Future<Output = ()>,
) {
    let app = with_limits(app);
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    let mut stop = pin!(stop);
    let said = Arc::new(Mutex::new(Throttled::default()));
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    // Out of fds, or the peer reset before accept: wait, do not spin.
                    log::debug!("accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Counted and said: a scrape closed here reads to its client as a dropped
            // connection, with nothing else to tell why.
            refused.inc();
            said.lock().unwrap_or_else(|p| p.into_inner()).say(
                "at the cap",
                log::Level::Warn,
                &format!("closed a connection from {peer} at once: {MAX_CONNECTIONS} are open"),
            );
            drop(stream);
            continue;
        };
        let mut closing = closing.clone();
        let app = app.clone();
        let said = said.clone();
        tokio::spawn(async move {
            let _slot = slot;
            let served = serve_connection(TokioIo::new(stream), app, async move {
                let _ = closing.changed().await;
            })
            .await;
            if let Err(e) = served {
                // A head not received in time closes the connection without an answer
                // (hyper answers 400/431 to one that does not parse): the client sees a
                // dropped connection, the log says why.
                let (kind, why) = why_closed(&e);
                let line = format!("closed the connection from {peer}: {why}");
                said.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .say(kind, log::Level::Info, &line);
            }
        });
    }
    let _ = closing_tx.send(true);
    // Every connection holds a slot until it ends: wait for them all, at most DRAIN longer.
    let all = u32::try_from(MAX_CONNECTIONS).unwrap_or(u32::MAX);
    let _ = tokio::time::timeout(DRAIN + Duration::from_millis(500), slots.acquire_many(all)).await;
}

/// `app` with the per-request limits (head size, request deadline) of [`serve_connection`].
pub fn with_limits(app: Router) -> Router {
    app.layer(axum::middleware::from_fn(limits))
}

/// Serves one connection of `app` (already [`with_limits`]) until the client ends it, it
/// reaches [`MAX_CONNECTION_AGE`] or `closing` resolves; then lets it finish its request for
/// a moment. The accept loop's unit, and what fuzzing feeds bytes to. The error is why the
/// connection ended other than by the client closing it after its answers.
pub async fn serve_connection<I>(
    io: I,
    app: Router,
    closing: impl Future<Output = ()>,
) -> Result<(), hyper::Error>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEAD_TIMEOUT);
    // hyper's head timer also runs while a kept-alive connection waits for its next request
    // and ends it with the same error: after an answer that is the normal idle close.
    let answered = Arc::new(AtomicBool::new(false));
    let service = TowerToHyperService::new(app.map_request({
        let answered = answered.clone();
        move |r: Request<Incoming>| {
            answered.store(true, Ordering::Relaxed);
            r.map(Body::new)
        }
    }));
    let mut conn = pin!(http.serve_connection(io, service));
    tokio::select! {
        served = conn.as_mut() => {
            return match served {
                Err(e) if e.is_timeout() && answered.load(Ordering::Relaxed) => Ok(()),
                served => served,
            }
        }
        _ = tokio::time::sleep(MAX_CONNECTION_AGE) => {}
        _ = closing => {}
    }
    conn.as_mut().graceful_shutdown();
    // A connection still busy after the drain is cut: that is the stop's choice, not an error.
    tokio::time::timeout(DRAIN, conn).await.unwrap_or(Ok(()))
}

/// Why hyper ended a connection, in the terms of the limits above: its kind and the words.
fn why_closed(e: &hyper::Error) -> (&'static str, String) {
    if e.is_timeout() {
        let why =
            format!("its request head was not complete within {HEAD_TIMEOUT:?} of its opening");
        ("head timeout", why)
    } else if e.is_parse() || e.is_parse_too_large() {
        let why = format!("its request did not parse ({e}); answered with an error status");
        ("unparsed", why)
    } else {
        ("other", e.to_string())
    }
}

/// Refuses a head over [`MAX_HEAD_BYTES`] (431) and answers 408 to a request not answered
/// within [`REQUEST_TIMEOUT`] (its body trickled).
async fn limits(req: Request, next: axum::middleware::Next) -> Response {
    let head = req.uri().to_string().len()
        + req
            .headers()
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum::<usize>();
    if head > MAX_HEAD_BYTES {
        return refuse(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!("the request's target and headers take {head} bytes, over {MAX_HEAD_BYTES}"),
        );
    }
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => refuse(
            StatusCode::REQUEST_TIMEOUT,
            format!("the request was not received within {REQUEST_TIMEOUT:?}"),
        ),
    }
}

fn refuse(code: StatusCode, why: String) -> Response {
    (code, axum::Json(serde_json::json!({ "error": why }))).into_response()
}

/// How often a flood of closed connections is said in the log.
const SAY_EVERY: Duration = Duration::from_secs(10);

/// The log's lines about closed connections: of each kind the first, then at most one per
/// [`SAY_EVERY`] with how many of that kind went unsaid since, so that a flood of hostile
/// connections cannot flood the log too.
#[derive(Default)]
struct Throttled(HashMap<&'static str, (Instant, u64)>);

impl Throttled {
    fn say(&mut self, kind: &'static str, level: log::Level, line: &str) {
        let now = Instant::now();
        match self.0.get_mut(kind) {
            Some((at, unsaid)) if now.duration_since(*at) < SAY_EVERY => *unsaid += 1,
            Some((at, unsaid)) => {
                let n = std::mem::take(unsaid);
                *at = now;
                log::log!(level, "{line} ({n} more such since this was last said)");
            }
            None => {
                self.0.insert(kind, (now, 0));
                log::log!(level, "{line}");
            }
        }
    }
}
