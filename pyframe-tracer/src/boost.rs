//! Running a borrowed thread first while it is held.
//!
//! A remote call continues the borrowed thread and waits for it to come back: every wait for
//! a CPU on the way is time the thread is held. On a host whose CPUs the engine saturates, a
//! thread continued at the normal policy waits for the running one's slice to end (EEVDF's
//! base slice, about a millisecond: most of a call's hold). [`Boost::raise`] puts the thread
//! at SCHED_FIFO priority 1 for the hold, so it preempts the normal threads as soon as it is
//! continued, and [`Boost::restore`] puts back its own scheduling attributes, nice value
//! included, before it is let go.
//!
//! # Conditions
//! Needs CAP_SYS_NICE over the target (sched_setattr(2)); where it is refused the thread is
//! held at its own policy, as before. A thread already at a real-time or deadline policy is
//! left as it is. The raise and the restore happen while the thread is stopped, so it never
//! runs boosted outside the calls.

/// `struct sched_attr` (include/uapi/linux/sched/types.h), to its first published size
/// (`SCHED_ATTR_SIZE_VER0`, 48 bytes): the utilisation clamps that follow it are left to the
/// kernel's defaults on both calls.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
}

/// `SCHED_FLAG_RESET_ON_FORK`: the one flag the thread's own attributes may carry that
/// sched_setattr takes back.
const RESET_ON_FORK: u64 = 0x01;

/// A thread raised to SCHED_FIFO 1, with what to put back.
#[derive(Debug)]
pub(crate) struct Boost {
    tid: i32,
    own: SchedAttr,
}

impl Boost {
    /// Raises `tid` (stopped) to SCHED_FIFO priority 1; None where it is real-time already or
    /// the kernel refuses.
    pub(crate) fn raise(tid: i32) -> Option<Boost> {
        let mut own = get(tid)?;
        if !sys_util::sched::is_fair(own.policy as i32) {
            return None;
        }
        own.flags &= RESET_ON_FORK;
        let fifo = SchedAttr {
            size: own.size,
            policy: libc::SCHED_FIFO as u32,
            flags: own.flags,
            priority: 1,
            ..SchedAttr::default()
        };
        set(tid, &fifo).then_some(Boost { tid, own })
    }

    /// Puts the thread's own policy, priority and nice value back.
    pub(crate) fn restore(self) -> std::io::Result<()> {
        set(self.tid, &self.own)
            .then_some(())
            .ok_or_else(std::io::Error::last_os_error)
    }
}

/// `tid`'s scheduling attributes, `size` set for a later [`set`].
fn get(tid: i32) -> Option<SchedAttr> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr writes at most `size` bytes into `attr`.
    let got = unsafe { libc::syscall(libc::SYS_sched_getattr, tid, &mut attr, size, 0u32) };
    attr.size = size;
    (got == 0).then_some(attr)
}

fn set(tid: i32, attr: &SchedAttr) -> bool {
    // SAFETY: sched_setattr reads `attr.size` bytes from a valid struct of that size.
    unsafe { libc::syscall(libc::SYS_sched_setattr, tid, attr, 0u32) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy_and_nice(tid: i32) -> (i32, i32) {
        let a = get(tid).unwrap();
        (a.policy as i32, a.nice)
    }

    #[test]
    fn a_raised_thread_gets_its_own_policy_and_nice_back() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: plain syscalls on this thread.
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 5);
                tx.send(libc::gettid()).unwrap();
            }
            done_rx.recv().unwrap();
        });
        let tid = rx.recv().unwrap();
        assert_eq!(policy_and_nice(tid), (libc::SCHED_OTHER, 5));
        let Some(boost) = Boost::raise(tid) else {
            // Without CAP_SYS_NICE the raise is refused and nothing changed.
            assert_eq!(policy_and_nice(tid), (libc::SCHED_OTHER, 5));
            done_tx.send(()).unwrap();
            t.join().unwrap();
            return;
        };
        assert_eq!(policy_and_nice(tid).0, libc::SCHED_FIFO);
        assert!(
            Boost::raise(tid).is_none(),
            "a real-time thread is left alone"
        );
        boost.restore().unwrap();
        assert_eq!(policy_and_nice(tid), (libc::SCHED_OTHER, 5));
        done_tx.send(()).unwrap();
        t.join().unwrap();
    }
}
