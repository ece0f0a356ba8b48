//! The stallscope daemon and CLI as a library, one folder per plane or layer; the
//! `stallscope` binary (`main.rs`) parses the command line and calls into it. Lower layers
//! never import higher ones:
//!
//! - [`os`]: process, scheduling and clock facts from the kernel's interfaces;
//! - [`kernel_plane`]: the eBPF programs' loader and their per-thread accounting;
//! - [`python_plane`]: the attach to a live CPython (the `pyframe-tracer` crate) as the
//!   daemon uses it; [`gpu_plane`]: CUPTI through the injected agent, NVML;
//! - [`deep_dive`]: bounded full-stack captures and their ranking;
//! - [`sentinel`]: the daemon's loop (engines, iterations, baseline, alerts);
//! - [`api`], [`otlp`], [`fleet`]: what the daemon serves and sends;
//! - [`config`]: the configuration file; [`cli`]: one module per subcommand.

pub mod api;
pub mod cli;
pub mod config;
pub mod deep_dive;
pub mod fleet;
pub mod gpu_plane;
pub mod kernel_plane;
pub mod os;
pub mod otlp;
pub mod python_plane;
pub mod sentinel;
