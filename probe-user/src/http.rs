//! The HTTP API: `/metrics` (Prometheus text format), `/api/v1/status`, `/api/v1/alerts`.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::Instant,
};

use anyhow::{Context, Result};
use axum::{
    extract::State,
    http::header,
    response::{IntoResponse, Json},
    routing::get,
    Router,
};
use serde_json::json;

use crate::shared::Shared;

struct App {
    shared: Arc<Shared>,
    started: Instant,
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
    stop: Arc<AtomicBool>,
) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigint = signal(SignalKind::interrupt())?;
        let mut sigterm = signal(SignalKind::terminate())?;
        let app = Router::new()
            .route("/metrics", get(metrics))
            .route("/api/v1/status", get(status))
            .route("/api/v1/alerts", get(alerts))
            .with_state(Arc::new(App {
                shared,
                started: Instant::now(),
            }));
        let listener = tokio::net::TcpListener::from_std(listener)?;
        let stop_http = stop.clone();
        let server = axum::serve(listener, app).with_graceful_shutdown(async move {
            tokio::select! {
                _ = sigint.recv() => log::info!("SIGINT: stopping"),
                _ = sigterm.recv() => log::info!("SIGTERM: stopping"),
                _ = wait_for(stop_http) => {}
            }
        });
        let result = server.await;
        stop.store(true, Ordering::SeqCst);
        result.context("the HTTP server failed")
    })
}

/// Resolves once `flag` is set (the sentinel loop stopping on its own).
async fn wait_for(flag: Arc<AtomicBool>) {
    while !flag.load(Ordering::SeqCst) {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
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
    let engines: Vec<_> = app
        .shared
        .engines
        .lock()
        .expect("status lock")
        .values()
        .cloned()
        .collect();
    let attach_errors = app.shared.attach_errors.lock().expect("lock").clone();
    Json(json!({
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_s": app.started.elapsed().as_secs_f64(),
        "engines": engines,
        "attach_errors": attach_errors,
    }))
}

async fn alerts(State(app): State<Arc<App>>) -> impl IntoResponse {
    Json(app.shared.alerts())
}
