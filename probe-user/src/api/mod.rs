//! What the daemon serves: the state the sentinel and the deep dives publish, the alerts,
//! Prometheus metrics, the iteration export, and the HTTP API over them.

pub mod alertmanager;
pub mod alerts;
pub mod board;
pub mod export;
pub mod http;
pub mod metrics;
pub mod server;
pub mod state;
