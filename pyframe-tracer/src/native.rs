//! The probe's compiled writer (`pyframe-native`, `libstallscope_pyprobe.so`): where it is
//! found, and how it reaches a target.
//!
//! The library is copied into the target's own `/tmp` (through `/proc/PID/root`, so a target
//! in another mount namespace sees it), offered to the probe by that path, and removed once the
//! attach has returned: the probe has loaded it by then, or runs its pure-Python writer and
//! says why (`Session::writer_note`). A process that loaded it keeps it (CPython cannot unload
//! an extension module), so a target that already maps it is offered nothing and the probe
//! reuses the loaded module. Like a ring, the copy is created under the attaching process's
//! `flock`, so one left by a daemon killed mid-attach is reaped ([`crate::reap`]).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use sys_util::lock;

/// The library's file name, next to the stallscope binary.
pub const LIBRARY: &str = "libstallscope_pyprobe.so";
/// Prefix of its copies in targets' `/tmp` (`stallscope-pyprobe-<pid>-<nonce>.so`).
pub const COPY_PREFIX: &str = "stallscope-pyprobe-";

/// The library: `STALLSCOPE_PYPROBE` if set (empty: none), else beside the running executable,
/// its glibc 2.28 build first ([`sys_util::shipped::locate`]). None when there is none: probes
/// then use their pure-Python writer.
pub fn library() -> Option<PathBuf> {
    sys_util::shipped::locate("STALLSCOPE_PYPROBE", LIBRARY)
}

/// A copy of the library in a target, removed on drop.
pub struct Offer {
    /// The path the target opens; empty when it already holds the module.
    pub inside: String,
    copy: Option<Copy>,
}

/// The copy's lock, and its directory opened beforehand: the path through /proc/PID/root dies
/// with the target, the open directory does not.
struct Copy {
    _lock: std::fs::File,
    dir: std::fs::File,
    name: std::ffi::OsString,
}

impl Drop for Offer {
    fn drop(&mut self) {
        if let Some(c) = self.copy.take() {
            let _ = lock::remove_at(&c.dir, &c.name);
        }
    }
}

/// Whether `pid` maps a copy of the library (it loaded the module before).
fn loaded(pid: i32) -> bool {
    sys_util::shipped::is_mapped(pid as u32, COPY_PREFIX)
}

/// Offers `library` to `pid`: a copy in its `/tmp`, or nothing to copy when it holds the
/// module already. None when the copy cannot be made (the probe then writes in Python).
pub fn offer(pid: i32, library: &Path, nonce: u64) -> Option<Offer> {
    if loaded(pid) {
        return Some(Offer {
            inside: String::new(),
            copy: None,
        });
    }
    let name = format!("{COPY_PREFIX}{pid}-{nonce:x}.so");
    let inside = format!("/tmp/{name}");
    let path = PathBuf::from(format!("/proc/{pid}/root{inside}"));
    let fail = |what: &str, e: std::io::Error| {
        log::debug!(
            "no compiled writer for {pid}: {what} {}: {e}",
            path.display()
        );
    };
    let dir = std::fs::File::open(format!("/proc/{pid}/root/tmp"))
        .map_err(|e| fail("opening the directory of", e))
        .ok()?;
    let mut file = lock::create_locked(&path)
        .map_err(|e| fail("creating", e))
        .ok()?;
    let offer = Offer {
        inside,
        copy: Some(Copy {
            _lock: file.try_clone().ok()?,
            dir,
            name: name.into(),
        }),
    };
    std::fs::File::open(library)
        .and_then(|mut src| std::io::copy(&mut src, &mut file))
        .and_then(|_| std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o444)))
        .map_err(|e| fail(&format!("copying {} to", library.display()), e))
        .ok()?;
    Some(offer)
}
