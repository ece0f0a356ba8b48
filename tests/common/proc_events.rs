//! The kernel's process events connector (`cn_proc`, `linux/cn_proc.h`): a netlink socket the
//! kernel tells of every ptrace attach and detach on the node, stamped with its own
//! CLOCK_MONOTONIC (`ktime_get_ns`). Tests wait on it instead of polling `/proc` for a tracer,
//! which misses windows shorter than a poll; the stamps tell whether a detach came before or
//! after a moment the test recorded.
//!
//! Needs CAP_NET_ADMIN (the tests run as root) and a kernel built with CONFIG_PROC_EVENTS.

use std::{
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

/// `NETLINK_CONNECTOR`, `CN_IDX_PROC`, `CN_VAL_PROC`, `PROC_CN_MCAST_LISTEN` and
/// `PROC_EVENT_PTRACE` from `linux/netlink.h`, `linux/connector.h` and `linux/cn_proc.h`.
const NETLINK_CONNECTOR: i32 = 11;
const CN_IDX_PROC: u32 = 1;
const CN_VAL_PROC: u32 = 1;
const PROC_CN_MCAST_LISTEN: u32 = 1;
const PROC_EVENT_PTRACE: u32 = 0x100;
/// `struct nlmsghdr` (16 bytes) then `struct cn_msg` (20 bytes): where `struct proc_event` starts.
const EVENT_AT: usize = 36;

/// One ptrace attach (`tracer_tgid != 0`) or detach (`tracer_tgid == 0`) of thread `pid`.
#[derive(Debug, Clone, Copy)]
pub struct Ptrace {
    /// When the kernel sent it (CLOCK_MONOTONIC ns).
    pub at_ns: u64,
    pub pid: u32,
    pub tgid: u32,
    pub tracer_pid: u32,
    pub tracer_tgid: u32,
}

/// A listening `cn_proc` socket.
pub struct ProcEvents {
    fd: OwnedFd,
}

impl ProcEvents {
    /// Subscribes to the node's process events.
    pub fn listen() -> io::Result<Self> {
        // SAFETY: plain socket calls on a descriptor this function owns; the buffers outlive them.
        unsafe {
            let raw = libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
                NETLINK_CONNECTOR,
            );
            if raw < 0 {
                return Err(io::Error::last_os_error());
            }
            let fd = OwnedFd::from_raw_fd(raw);
            // Forks and exits of a busy node come through too: room for a burst of them.
            let size: libc::c_int = 4 << 20;
            libc::setsockopt(
                raw,
                libc::SOL_SOCKET,
                libc::SO_RCVBUFFORCE,
                (&size as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as u32,
            );
            let mut addr: libc::sockaddr_nl = std::mem::zeroed();
            addr.nl_family = libc::AF_NETLINK as u16;
            addr.nl_groups = CN_IDX_PROC;
            if libc::bind(
                raw,
                (&addr as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as u32,
            ) < 0
            {
                return Err(io::Error::last_os_error());
            }
            let mut msg = Vec::with_capacity(40);
            msg.extend_from_slice(&40u32.to_ne_bytes()); // nlmsg_len
            msg.extend_from_slice(&(libc::NLMSG_DONE as u16).to_ne_bytes());
            msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
            msg.extend_from_slice(&0u32.to_ne_bytes()); // seq
            msg.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel assigns one
            msg.extend_from_slice(&CN_IDX_PROC.to_ne_bytes());
            msg.extend_from_slice(&CN_VAL_PROC.to_ne_bytes());
            msg.extend_from_slice(&[0; 8]); // seq, ack
            msg.extend_from_slice(&4u16.to_ne_bytes()); // len of the payload
            msg.extend_from_slice(&0u16.to_ne_bytes()); // flags
            msg.extend_from_slice(&PROC_CN_MCAST_LISTEN.to_ne_bytes());
            if libc::send(raw, msg.as_ptr().cast(), msg.len(), 0) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(Self { fd })
        }
    }

    /// The next ptrace event that `keep` accepts, or None once `deadline` passes.
    pub fn next_ptrace(
        &self,
        deadline: Instant,
        mut keep: impl FnMut(&Ptrace) -> bool,
    ) -> Option<Ptrace> {
        let mut buf = [0u8; 4096];
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            let mut poll = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.max(Duration::from_millis(1)).as_millis() as i32;
            // SAFETY: one pollfd on the stack, then a read into `buf` of at most its length.
            let n = unsafe {
                if libc::poll(&mut poll, 1, ms) <= 0 {
                    continue;
                }
                libc::recv(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0)
            };
            // ENOBUFS: events were dropped in a burst; the ones after it still come.
            let Ok(n) = usize::try_from(n) else { continue };
            let word = |at: usize| u32::from_ne_bytes(buf[at..at + 4].try_into().unwrap());
            if n < EVENT_AT + 32 || word(EVENT_AT) != PROC_EVENT_PTRACE {
                continue;
            }
            let event = Ptrace {
                at_ns: u64::from_ne_bytes(buf[EVENT_AT + 8..EVENT_AT + 16].try_into().unwrap()),
                pid: word(EVENT_AT + 16),
                tgid: word(EVENT_AT + 20),
                tracer_pid: word(EVENT_AT + 24),
                tracer_tgid: word(EVENT_AT + 28),
            };
            if keep(&event) {
                return Some(event);
            }
        }
    }
}
