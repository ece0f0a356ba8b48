//! A borrowed thread's scheduling policy, raised to SCHED_FIFO for the remote calls and put
//! back before the thread is let go.
//!
//! Each remote call resumes the stopped thread, which then runs the call at its own policy: on
//! a host whose CPUs the engine saturates, a woken thread of the normal policy may wait a time
//! slice or more for a CPU, and the thread stays held all that while (the attach soak beside
//! vLLM's load measured a p99 hold of 4-6 ms with only the helper at SCHED_FIFO). At SCHED_FIFO
//! priority 1 it runs each call as soon as it is resumed. Between calls the thread is stopped
//! and takes no CPU, so the raised policy costs the engine's other threads only the calls'
//! own microseconds.
//!
//! The policy, its flags (`SCHED_RESET_ON_FORK`) and the real-time priority are read before and
//! written back as they were; the nice value survives the round trip (`sched_setscheduler`
//! keeps `static_prio`, kernel/sched/syscalls.c). Threads at a real-time or deadline policy
//! already are not touched. Where raising is refused (no CAP_SYS_NICE; cgroup v1 RT group
//! scheduling with no runtime for the target's group), the thread keeps its policy.

use nix::unistd::Pid;

/// A thread's policy as it was before [`Boost::raise`]; [`Boost::restore`] puts it back.
#[derive(Debug)]
#[must_use = "a raised thread must be restored"]
pub struct Boost {
    tid: Pid,
    /// The policy with its flags, as `sched_getscheduler` returned it.
    policy: libc::c_int,
    param: libc::sched_param,
}

impl Boost {
    /// Raises `tid` to SCHED_FIFO priority 1 if it runs at a normal policy (SCHED_OTHER,
    /// SCHED_BATCH, SCHED_IDLE) and the kernel allows it; None where it was left as it is.
    pub fn raise(tid: Pid) -> Option<Boost> {
        // SAFETY: a plain syscall on a thread id; it returns -1 for a thread that is gone.
        let policy = unsafe { libc::sched_getscheduler(tid.as_raw()) };
        let normal = [libc::SCHED_OTHER, libc::SCHED_BATCH, libc::SCHED_IDLE];
        if policy < 0 || !normal.contains(&(policy & !libc::SCHED_RESET_ON_FORK)) {
            return None;
        }
        let mut param = libc::sched_param { sched_priority: 0 };
        // SAFETY: `param` is valid for the call's write.
        if unsafe { libc::sched_getparam(tid.as_raw(), &mut param) } != 0 {
            return None;
        }
        let fifo = libc::sched_param { sched_priority: 1 };
        // Keep the thread's reset-on-fork flag while raised: a fork inside a call (none of
        // ours forks) would then not hand the child the raised policy either way.
        let flags = policy & libc::SCHED_RESET_ON_FORK;
        // SAFETY: valid policy and parameter for the call; failure changes nothing.
        let raised =
            unsafe { libc::sched_setscheduler(tid.as_raw(), libc::SCHED_FIFO | flags, &fifo) };
        (raised == 0).then_some(Boost { tid, policy, param })
    }

    /// Puts the thread's policy back as it was.
    pub fn restore(self) -> std::io::Result<()> {
        // SAFETY: the policy and parameter read from this thread before it was raised.
        match unsafe { libc::sched_setscheduler(self.tid.as_raw(), self.policy, &self.param) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gettid() -> Pid {
        // SAFETY: gettid has no preconditions.
        Pid::from_raw(unsafe { libc::gettid() })
    }

    fn nice_of(tid: Pid) -> libc::c_int {
        // SAFETY: plain syscall; PRIO_PROCESS with a thread id reads that thread's nice.
        unsafe { libc::getpriority(libc::PRIO_PROCESS, tid.as_raw() as libc::id_t) }
    }

    /// Each normal policy, with and without reset-on-fork, at a nice value: raised to FIFO 1,
    /// then back to exactly the policy, flags and nice it had.
    #[test]
    fn a_raised_thread_gets_its_policy_flags_and_nice_back() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: raising a thread to SCHED_FIFO needs root");
            return;
        }
        let cases = [
            (libc::SCHED_OTHER, 0),
            (libc::SCHED_OTHER | libc::SCHED_RESET_ON_FORK, 5),
            (libc::SCHED_BATCH, 7),
            (libc::SCHED_IDLE, 0),
        ];
        for (policy, nice) in cases {
            std::thread::spawn(move || {
                let tid = gettid();
                let zero = libc::sched_param { sched_priority: 0 };
                // SAFETY: valid policy and parameter on the calling thread.
                assert_eq!(unsafe { libc::sched_setscheduler(0, policy, &zero) }, 0);
                // SAFETY: plain syscall on the calling thread.
                let set = unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, tid.as_raw() as libc::id_t, nice)
                };
                assert_eq!(set, 0);
                let boost = Boost::raise(tid).expect("root may raise a thread");
                // SAFETY: plain syscall.
                let during = unsafe { libc::sched_getscheduler(0) };
                assert_eq!(
                    during,
                    libc::SCHED_FIFO | (policy & libc::SCHED_RESET_ON_FORK),
                    "raised from {policy:#x}"
                );
                boost.restore().unwrap();
                // SAFETY: plain syscall.
                assert_eq!(unsafe { libc::sched_getscheduler(0) }, policy);
                assert_eq!(nice_of(tid), nice, "nice after the round trip");
            })
            .join()
            .unwrap();
        }
    }

    #[test]
    fn a_real_time_thread_is_left_as_it_is() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("SKIP: a SCHED_FIFO thread needs root");
            return;
        }
        std::thread::spawn(|| {
            let rr = libc::sched_param { sched_priority: 3 };
            // SAFETY: valid policy and parameter on the calling thread.
            assert_eq!(
                unsafe { libc::sched_setscheduler(0, libc::SCHED_RR, &rr) },
                0
            );
            assert!(Boost::raise(gettid()).is_none());
            // SAFETY: plain syscall.
            assert_eq!(unsafe { libc::sched_getscheduler(0) }, libc::SCHED_RR);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn a_thread_that_is_gone_is_not_raised() {
        assert!(Boost::raise(Pid::from_raw(i32::MAX)).is_none());
    }
}
