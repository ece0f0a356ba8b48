//! The HTTP API: `/metrics` (Prometheus text format), `/api/v1/status`, `/api/v1/alerts`,
//! `POST /api/v1/deep-dive` (loopback, or with the configured Bearer token),
//! `/api/v1/deep-dives[/{id}]` and `POST /api/v1/alertmanager` (Alertmanager's webhook, always
//! with the token).

use std::{
    collections::VecDeque,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use axum::{
    body::Bytes,
    extract::{DefaultBodyLimit, Path, State},
    http::{header, HeaderMap, StatusCode},
    response::{IntoResponse, Json, Response},
    routing::{get, post},
    Router,
};
use serde::Deserialize;
use serde_json::json;

use crate::{
    api::{alertmanager, board::EngineStatus, server, state::Shared},
    config::{DeepDiveConfig, FleetConfig, MAX_WINDOW},
    deep_dive::registry::Refusal,
};

/// The largest webhook body taken (Alertmanager sends a group's alerts, truncated to its
/// `max_alerts`); a larger one is refused with 413.
const MAX_WEBHOOK_BODY: usize = 256 * 1024;

struct App {
    shared: Arc<Shared>,
    started: Instant,
    /// Whether the listener is on a loopback address (POST needs no token there).
    loopback: bool,
    deep_dive: DeepDiveConfig,
    fleet: FleetConfig,
    /// When the webhook calls of the last minute came.
    webhook_calls: Mutex<VecDeque<Instant>>,
}

/// Binds `addr` now, so a taken port fails before anything is attached.
pub fn bind(addr: std::net::SocketAddr) -> Result<std::net::TcpListener> {
    let l = std::net::TcpListener::bind(addr).with_context(|| {
        format!("cannot listen on {addr} (is another stallscope or exporter using the port?): pick another address with --listen or [http] listen")
    })?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Serves until SIGINT or SIGTERM, then sets `stop`. Runs on its own thread.
pub fn serve(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    deep_dive: DeepDiveConfig,
    fleet: FleetConfig,
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let loopback = listener.local_addr()?.ip().is_loopback();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let refused = shared.metrics.http_refused_connections.clone();
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let app = router(shared, loopback, deep_dive, fleet);
        let listener = tokio::net::TcpListener::from_std(listener)?;
        // The signals are the only way to stop: the loop stops on the flag this thread sets.
        server::serve(listener, app, refused, async move {
            tokio::select! {
                _ = sigint.recv() => log::info!("SIGINT: stopping"),
                _ = sigterm.recv() => log::info!("SIGTERM: stopping"),
            }
        })
        .await;
        stop.store(true, Ordering::SeqCst);
        Ok(())
    })
}

/// The API's routes over `shared`. `loopback`: whether the listener is on a loopback
/// address (a deep dive needs no token there).
pub fn router(
    shared: Arc<Shared>,
    loopback: bool,
    deep_dive: DeepDiveConfig,
    fleet: FleetConfig,
) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/api/v1/status", get(status))
        .route("/api/v1/alerts", get(alerts))
        .route("/api/v1/deep-dive", post(start_deep_dive))
        .route("/api/v1/deep-dives", get(deep_dives))
        .route("/api/v1/deep-dives/{id}", get(deep_dive_record))
        .route(
            "/api/v1/alertmanager",
            post(alertmanager_webhook).layer(DefaultBodyLimit::max(MAX_WEBHOOK_BODY)),
        )
        .with_state(Arc::new(App {
            shared,
            started: Instant::now(),
            loopback,
            deep_dive,
            fleet,
            webhook_calls: Mutex::new(VecDeque::new()),
        }))
}

async fn metrics(State(app): State<Arc<App>>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        app.shared.metrics.render(),
    )
}

async fn status(State(app): State<Arc<App>>) -> impl IntoResponse {
    let engines = app.shared.engines.statuses();
    let attach_errors = app.shared.engines.attach_errors();
    let capture = app
        .shared
        .deep_dive
        .capture
        .lock()
        .expect("capture lock")
        .clone();
    let references: serde_json::Map<String, serde_json::Value> = app
        .shared
        .deep_dive
        .references
        .lock()
        .expect("references lock")
        .iter()
        .map(|(pid, r)| (pid.to_string(), r.status()))
        .collect();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": app.started.elapsed().as_secs_f64(),
        "engines": engines,
        "attach_errors": attach_errors,
        "capture": capture,
        "normal_references": references,
    }))
}

async fn alerts(State(app): State<Arc<App>>) -> impl IntoResponse {
    Json(app.shared.alerts.recent())
}

async fn deep_dives(State(app): State<Arc<App>>) -> impl IntoResponse {
    Json(
        app.shared
            .deep_dive
            .registry
            .lock()
            .expect("registry lock")
            .records(),
    )
}

async fn deep_dive_record(State(app): State<Arc<App>>, Path(id): Path<u64>) -> Response {
    match app
        .shared
        .deep_dive
        .registry
        .lock()
        .expect("registry lock")
        .get(id)
    {
        Some(r) => Json(r).into_response(),
        None => refuse(StatusCode::NOT_FOUND, format!("no deep dive {id}")),
    }
}

/// The body of `POST /api/v1/deep-dive` (all optional).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeepDiveBody {
    /// The engine (optional when exactly one is attached).
    pid: Option<u32>,
    /// Deep-dive window, seconds ([deep_dive] duration when absent).
    duration_s: Option<f64>,
    /// Normal window to record first, seconds (absent: the rolling reference).
    baseline_s: Option<f64>,
}

fn refuse(code: StatusCode, why: String) -> Response {
    (code, Json(json!({ "error": why }))).into_response()
}

/// A window length from the request, within (0, MAX_WINDOW].
fn window(name: &str, secs: f64) -> Result<std::time::Duration, String> {
    if secs > 0.0 && secs <= MAX_WINDOW.as_secs_f64() {
        Ok(std::time::Duration::from_secs_f64(secs))
    } else {
        Err(format!(
            "{name} must be above 0 and at most {} seconds",
            MAX_WINDOW.as_secs()
        ))
    }
}

/// The token of an `Authorization: Bearer <token>` header.
fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
}

/// Whether the request presents `token` (never when none is configured). The bytes are
/// compared in constant time, so the answer's timing does not tell a guesser how much of a
/// token was right (only whether its length was).
fn authorized(headers: &HeaderMap, token: &str) -> bool {
    use subtle::ConstantTimeEq;
    !token.is_empty()
        && bearer(headers).is_some_and(|p| bool::from(p.as_bytes().ct_eq(token.as_bytes())))
}

/// Alertmanager's webhook: a firing alert for this node's serving group asks for a deep dive
/// of its engine. Always needs the token; bounded in size and in calls per minute; a deep
/// dive only within `max_per_hour`. A call that asks for nothing is answered 200 (so that
/// Alertmanager does not retry it).
async fn alertmanager_webhook(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let token = &app.deep_dive.token;
    if token.is_empty() {
        return refuse(
            StatusCode::FORBIDDEN,
            "webhook calls need a token: set [deep_dive] token (or STALLSCOPE_DEEP_DIVE_TOKEN) and give it to Alertmanager's webhook_config as http_config.authorization credentials".into(),
        );
    }
    if !authorized(&headers, token) {
        return refuse(
            StatusCode::UNAUTHORIZED,
            "missing or wrong \"Authorization: Bearer <token>\": the webhook needs the [deep_dive] token".into(),
        );
    }
    {
        let mut calls = app.webhook_calls.lock().expect("webhook calls lock");
        while calls
            .front()
            .is_some_and(|t| t.elapsed() >= Duration::from_secs(60))
        {
            calls.pop_front();
        }
        if calls.len() >= app.fleet.max_calls_per_minute {
            return refuse(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "more than {} webhook calls in the last minute ([fleet] max_calls_per_minute)",
                    app.fleet.max_calls_per_minute
                ),
            );
        }
        calls.push_back(Instant::now());
    }
    let message = match alertmanager::parse(&body) {
        Ok(m) => m,
        Err(e) => return refuse(StatusCode::BAD_REQUEST, e.0),
    };
    // The groups of this node's engines ([fleet] group, or each engine's pod label).
    let label = &app.fleet.group_label;
    let statuses = app.shared.engines.statuses();
    let placed: Vec<(&EngineStatus, String)> = statuses
        .iter()
        .filter_map(|s| Some((s, app.fleet.group_of(&s.identity)?)))
        .collect();
    let groups: std::collections::BTreeSet<String> =
        placed.iter().map(|(_, g)| g.clone()).collect();
    let firing = alertmanager::firing_for(&message, label, &groups);
    let Some(first) = firing.first() else {
        let reason = if statuses.is_empty() {
            "no engine is attached on this node".to_string()
        } else if groups.is_empty() {
            "no engine on this node is in a serving group ([fleet] group or STALLSCOPE_GROUP, or [fleet] group_pod_label)".to_string()
        } else {
            format!("no firing alert has {label} naming one of this node's groups {groups:?}")
        };
        return Json(json!({ "deep_dive": null, "reason": reason })).into_response();
    };
    let group = first.labels[label.as_str()].as_str();
    // The group's engine the alert names by its pod, else the group's first on this node.
    let members: Vec<&EngineStatus> = placed
        .iter()
        .filter(|(_, g)| g == group)
        .map(|(s, _)| *s)
        .collect();
    let pod = firing.iter().find_map(|a| a.labels.get("pod"));
    let engine = members
        .iter()
        .find(|s| pod.is_some() && s.identity.pod.as_ref() == pod)
        .or(members.first())
        .expect("a group is known from one of its engines");
    let alertname = first
        .labels
        .get("alertname")
        .map_or("alert", String::as_str);
    // Every node of the group gets the same alert: its start plus the lead is their common
    // instant. A call that arrives after it starts at once.
    let start_at = first
        .starts_at_unix_ns()
        .map(|t| t + app.fleet.lead.as_nanos() as u64);
    let admitted = {
        let mut registry = app.shared.deep_dive.registry.lock().expect("registry lock");
        let admitted = registry.admit(
            engine.pid,
            format!("alertmanager {alertname} ({label}={group})"),
            app.deep_dive.duration,
            Duration::ZERO,
            app.deep_dive.max_per_hour,
            true,
        );
        if let Ok(id) = &admitted {
            registry.for_group(*id, group, start_at);
        }
        admitted
    };
    match admitted {
        Ok(id) => {
            app.shared.deep_dive.queued.ring();
            let late_ms =
                start_at.map(|t| (crate::os::clock::unix_ns() as i64 - t as i64) / 1_000_000);
            match late_ms {
                Some(late) if late > 0 => log::warn!(
                    "Alertmanager: {alertname} for group {group}: deep dive {id} of engine {} starts now, {late} ms after the group's instant ([fleet] lead {:?} is shorter than the delivery took)",
                    engine.pid,
                    app.fleet.lead
                ),
                _ => log::info!(
                    "Alertmanager: {alertname} for group {group}: deep dive {id} of engine {} at the group's instant {start_at:?} (ns since the epoch)",
                    engine.pid
                ),
            }
            (
                StatusCode::ACCEPTED,
                Json(json!({
                    "deep_dive": id,
                    "pid": engine.pid,
                    "start_at_unix_ns": start_at,
                    "status": format!("/api/v1/deep-dives/{id}"),
                })),
            )
                .into_response()
        }
        Err(Refusal::Busy(id)) => {
            Json(json!({ "deep_dive": id, "reason": "a deep dive is already capturing" }))
                .into_response()
        }
        Err(r) => refuse(StatusCode::TOO_MANY_REQUESTS, r.to_string()),
    }
}

async fn start_deep_dive(State(app): State<Arc<App>>, headers: HeaderMap, body: Bytes) -> Response {
    if !app.loopback && !authorized(&headers, &app.deep_dive.token) {
        return refuse(
            StatusCode::FORBIDDEN,
            "deep dives are requested on a loopback listener, or with \"Authorization: Bearer <token>\" matching [deep_dive] token".into(),
        );
    }
    let body: DeepDiveBody = if body.iter().all(u8::is_ascii_whitespace) {
        DeepDiveBody::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(b) => b,
            Err(e) => {
                return refuse(
                    StatusCode::BAD_REQUEST,
                    format!("bad request body ({e}); send JSON such as {{\"pid\": 123, \"duration_s\": 3, \"baseline_s\": 2}}"),
                )
            }
        }
    };
    let duration = match body.duration_s.map(|s| window("duration_s", s)) {
        None => app.deep_dive.duration,
        Some(Ok(d)) => d,
        Some(Err(e)) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    let baseline = match body.baseline_s.map(|s| window("baseline_s", s)) {
        None => std::time::Duration::ZERO,
        Some(Ok(d)) => d,
        Some(Err(e)) => return refuse(StatusCode::BAD_REQUEST, e),
    };
    let engines = app.shared.engines.pids();
    let pid = match (body.pid, engines.as_slice()) {
        (Some(p), _) if engines.contains(&p) => p,
        (Some(p), _) => {
            return refuse(
                StatusCode::NOT_FOUND,
                format!("pid {p} is not an attached engine (attached: {engines:?})"),
            )
        }
        (None, [only]) => *only,
        (None, []) => return refuse(StatusCode::NOT_FOUND, "no engine is attached".into()),
        (None, _) => {
            return refuse(
                StatusCode::BAD_REQUEST,
                format!("several engines are attached ({engines:?}): name one with \"pid\""),
            )
        }
    };
    let admitted = app
        .shared
        .deep_dive
        .registry
        .lock()
        .expect("registry lock")
        .admit(
            pid,
            "api".into(),
            duration,
            baseline,
            app.deep_dive.max_per_hour,
            true,
        );
    match admitted {
        Ok(id) => {
            app.shared.deep_dive.queued.ring();
            (
                StatusCode::ACCEPTED,
                Json(json!({ "id": id, "pid": pid, "status": format!("/api/v1/deep-dives/{id}") })),
            )
                .into_response()
        }
        Err(r) => refuse(StatusCode::TOO_MANY_REQUESTS, r.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_configured_token_is_authorized() {
        let with = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, value.parse().unwrap());
            h
        };
        for (headers, token, ok) in [
            (with("Bearer s3cret"), "s3cret", true),
            (with("Bearer s3cre"), "s3cret", false),
            (with("Bearer s3cret!"), "s3cret", false),
            (with("Bearer S3cret"), "s3cret", false),
            (with("Basic s3cret"), "s3cret", false),
            (with("Bearer "), "", false),
            (HeaderMap::new(), "s3cret", false),
            (HeaderMap::new(), "", false),
        ] {
            assert_eq!(authorized(&headers, token), ok, "{headers:?} vs {token:?}");
        }
    }
}
