//! The sentinel: the daemon's loop, the engines it watches (iterations from the probes' calls,
//! the latency baseline, the UCL alerts) and the watchdog of its own loop.

pub mod daemon;
pub mod engine;
pub mod iterations;
pub mod loop_watchdog;
