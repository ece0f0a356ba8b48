//! The Python plane of stallscope: attach to a live CPython (3.10–3.13 by ptrace and a pending call, 3.14+ by
//! PEP 768) without restarting it, time watched functions exactly and read their workload from arguments.
//!
//! - [`remote_call`]: the ptrace remote-call primitive; [`transaction`]: remote calls in a helper process that
//!   finishes them even if stallscope is killed.
//! - [`python`], [`inject`], [`pep768`]: find the runtime and run Python source at a safe point.
//! - `probe.py` (embedded): the code that runs inside the target; [`native`]: its compiled writer
//!   (`pyframe-native`), offered to the target where the library is found.
//! - [`ring`]: the shared-memory ring the probe writes records into; [`lease`]: its heartbeat;
//!   [`reap`]: ring files left behind by a daemon that died mid-attach.
//! - [`watch_spec`], [`profiles`]: what to watch.
//! - [`session`]: one attachment, end to end.
//! - [`sampling`]: py-spy stack samples (non-blocking) for deep dives and hang dumps.

mod boost;
pub mod error;
pub mod inject;
pub mod lease;
pub mod maps;
pub mod memory;
pub mod native;
pub mod pep768;
pub mod procfs;
pub mod profiles;
pub mod python;
pub mod reap;
pub mod remote_call;
pub mod ring;
pub mod sampling;
pub mod session;
pub mod symbols;
pub mod transaction;
pub mod watch_spec;

pub use error::{Error, Result};
pub use session::{AttachOptions, Call, Framework, Session};
pub use watch_spec::WatchSpec;
