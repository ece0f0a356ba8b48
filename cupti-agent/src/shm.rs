//! The channel file the daemon created for this process, mapped for the agent's lifetime.

use cupti_sys::channel::{self, Channel};

/// A mapping of `/dev/shm/stallscope-gpu-<pid>`.
pub struct Mapping {
    base: *mut u8,
    len: usize,
    channel: Channel,
}

impl Mapping {
    /// Maps the channel of process `pid`; `None` when the daemon made none (or it is not one).
    pub fn open(pid: u32) -> Option<Mapping> {
        let path = std::ffi::CString::new(format!("/dev/shm/{}", channel::file_name(pid))).ok()?;
        // SAFETY: plain syscalls on a path we own; every failure is checked.
        unsafe {
            let fd = libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC);
            if fd < 0 {
                return None;
            }
            let mut st: libc::stat = std::mem::zeroed();
            let len = if libc::fstat(fd, &mut st) == 0 {
                st.st_size as usize
            } else {
                0
            };
            let base = if len >= channel::HEADER {
                libc::mmap(
                    std::ptr::null_mut(),
                    len,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    fd,
                    0,
                )
            } else {
                libc::MAP_FAILED
            };
            libc::close(fd);
            if base == libc::MAP_FAILED {
                return None;
            }
            let base = base as *mut u8;
            match Channel::open(base, len) {
                Some(channel) => Some(Mapping { base, len, channel }),
                None => {
                    libc::munmap(base.cast(), len);
                    None
                }
            }
        }
    }

    /// The channel.
    pub fn channel(&self) -> &Channel {
        &self.channel
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping; no callback uses it any more (see `forward::uninstall`).
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}
