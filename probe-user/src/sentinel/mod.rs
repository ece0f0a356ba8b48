//! The sentinel: the daemon's loop, the engines it watches and, per engine, the owners of
//! one job each: where iterations come from (the anchor), how they are assembled, the
//! baseline model on disk and its fits, the alerts, the GPU figures and the lost-record
//! account; and the watchdog of the daemon's own loop.

pub mod alert_book;
pub mod anchor;
pub mod attacher;
pub mod daemon;
pub mod dives;
pub mod engine;
pub mod gpu_figures;
pub mod identities;
pub mod iterations;
pub mod loop_watchdog;
pub mod lost_records;
pub mod model_store;
pub mod processes;
pub mod thread_time;
