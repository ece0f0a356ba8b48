//! Deep dive: a bounded window of full-stack capture (raw kernel events, wider Python probes,
//! py-spy stack samples, host telemetry), written as one Perfetto trace on CLOCK_MONOTONIC,
//! and a root-cause ranking of the window against a normal reference of the same process.

pub mod analysis;
pub mod book;
pub mod capture;
pub mod cycles;
pub mod job;
pub mod output;
pub mod registry;
pub mod resources;
pub mod stacks;
pub mod telemetry;
pub mod timeline;
pub mod trace;
pub mod tree;
