//! What every stallscope crate, xtask and the tests share of the operating system: the
//! clocks, doorbells in shared memory, a plain HTTP/1.0 client, a process-group guard, work
//! that outlives its caller, owner-only files, files locked for their creator's life, the
//! libraries shipped to be loaded into targets, pods made of namespaces and cgroups, a background
//! thread's CPU reservation, and what a stuck process or thread is doing. It depends on libc alone, so that the agent injected into
//! engines can use it too.

pub mod cgroup;
pub mod clock;
pub mod detached;
pub mod futex;
pub mod http;
pub mod lock;
pub mod pod;
pub mod private;
pub mod process;
pub mod sched;
pub mod shipped;
pub mod task_state;
