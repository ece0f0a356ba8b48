//! What every stallscope crate, xtask and the tests share of the operating system: the
//! clocks, a loopback HTTP/1.0 client and a process-group guard. It depends on libc alone, so
//! that the agent injected into engines can use it too.

pub mod clock;
pub mod http;
pub mod process;
