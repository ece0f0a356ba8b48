//! Bytes from a client the daemon does not control, on one connection of the real API (its
//! routes, body limits and head limits; a daemon with no engine attached). The first byte
//! picks the listener: loopback (no token needed) or the node's address with a token. Every
//! answer is an HTTP/1.x response; nothing panics; the connection ends when the client does.
#![no_main]

use std::{
    future::pending,
    sync::{Arc, LazyLock},
};

use hyper_util::rt::TokioIo;
use libfuzzer_sys::fuzz_target;
use probe_user::{
    api::{http, server, state::Shared},
    config::{DeepDiveConfig, FleetConfig},
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Daemon {
    rt: tokio::runtime::Runtime,
    loopback: axum::Router,
    remote: axum::Router,
}

static DAEMON: LazyLock<Daemon> = LazyLock::new(|| {
    let dir = std::env::temp_dir().join(format!("stallscope-fuzz-http-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("state directory");
    let shared = Arc::new(Shared::new(&dir.join("alerts.jsonl")).expect("alert log"));
    let token = DeepDiveConfig {
        token: "fuzz-token-0123456789".into(),
        ..DeepDiveConfig::default()
    };
    Daemon {
        rt: tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime"),
        loopback: server::with_limits(http::router(
            shared.clone(),
            true,
            DeepDiveConfig::default(),
            FleetConfig::default(),
        )),
        remote: server::with_limits(http::router(shared, false, token, FleetConfig::default())),
    }
});

fuzz_target!(|data: &[u8]| {
    let Some((&pick, request)) = data.split_first() else {
        return;
    };
    let d = &*DAEMON;
    let app = if pick & 1 == 0 {
        &d.loopback
    } else {
        &d.remote
    }
    .clone();
    let request = request.to_vec();
    let answer = d.rt.block_on(async move {
        let (client, daemon) = tokio::io::duplex(16 * 1024);
        let conn = tokio::spawn(server::serve_connection(
            TokioIo::new(daemon),
            app,
            pending(),
        ));
        let (mut rx, mut tx) = tokio::io::split(client);
        let send = tokio::spawn(async move {
            let _ = tx.write_all(&request).await;
            let _ = tx.shutdown().await;
        });
        let mut answer = Vec::new();
        let _ = rx.read_to_end(&mut answer).await;
        let _ = send.await;
        let _ = conn.await.expect("the connection's task does not panic");
        answer
    });
    if !answer.is_empty() {
        assert!(
            answer.starts_with(b"HTTP/1."),
            "{:?}",
            String::from_utf8_lossy(&answer)
        );
    }
});
