//! What the daemon needs of the operating system, below every plane: clocks, `/proc`, its
//! capabilities, the scheduling and placement of its own threads, its heap, and stoppable worker
//! threads.

pub mod affinity;
pub mod caps;
pub mod clock;
pub mod memory;
pub mod pidns;
pub mod procfs;
pub mod sched;
pub mod stop_flag;
pub mod worker;
