//! The PID namespace whose ids this process sees (in `/proc`, from the kernel's calls).
//!
//! A node daemon with `hostPID` sees the kernel's own ids. A sidecar sharing its pod's
//! process namespace (`shareProcessNamespace: true`) sees the pod's: the engine's pid there is
//! not the kernel's, which is what eBPF programs read from `current` and `task_struct`.

use std::{io, os::unix::fs::MetadataExt};

/// The initial PID namespace's inode number, fixed by the kernel (`PROC_PID_INIT_INO`,
/// include/linux/proc_ns.h).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// A PID namespace, named as `bpf_get_ns_current_pid_tgid` takes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidNs {
    /// The nsfs device in the kernel's `dev_t` encoding (major above a 20-bit minor:
    /// `MINORBITS`, include/linux/kdev_t.h), not userspace's.
    pub dev: u64,
    /// The namespace's inode number.
    pub ino: u64,
}

/// This process's PID namespace when it is not the host's; None when it is.
pub fn own_unless_host() -> io::Result<Option<PidNs>> {
    let st = std::fs::metadata("/proc/self/ns/pid")?;
    if st.ino() == INIT_PID_NS_INO {
        return Ok(None);
    }
    let (major, minor) = (libc::major(st.dev()), libc::minor(st.dev()));
    Ok(Some(PidNs {
        dev: u64::from(major) << 20 | u64::from(minor),
        ino: st.ino(),
    }))
}
