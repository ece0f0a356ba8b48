//! Files whose life is bound to their creator's: created with an exclusive `flock` the kernel
//! drops when the creator dies, so anyone can tell a file still in use from one left behind
//! by a killed process, whatever its age.

use std::{
    fs::{File, OpenOptions},
    io,
    os::{fd::AsRawFd, unix::fs::OpenOptionsExt},
    path::Path,
};

/// A new file at `path` (replacing one there), mode 0600, exclusively `flock`ed before it has
/// its name: it is made unnamed (`O_TMPFILE`) in `path`'s directory, locked, then linked into
/// place, so no other process ever sees it unlocked while its creator lives. On filesystems
/// without `O_TMPFILE` the lock is taken right after the file is created. The lock lasts as
/// long as the returned `File` (and its duplicates) stay open.
pub fn create_locked(path: &Path) -> io::Result<File> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let unnamed = OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(dir);
    match unnamed {
        Ok(file) => {
            lock(&file)?;
            let _ = std::fs::remove_file(path);
            // linkat through /proc/self/fd names an O_TMPFILE file without
            // CAP_DAC_READ_SEARCH (open(2), O_TMPFILE).
            let from = std::ffi::CString::new(format!("/proc/self/fd/{}", file.as_raw_fd()))?;
            let to = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
            // SAFETY: two NUL-terminated paths.
            let rc = unsafe {
                libc::linkat(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::AT_SYMLINK_FOLLOW,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(file)
        }
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EOPNOTSUPP | libc::EISDIR | libc::EINVAL)
            ) =>
        {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(path)?;
            lock(&file)?;
            Ok(file)
        }
        Err(e) => Err(e),
    }
}

fn lock(file: &File) -> io::Result<()> {
    // SAFETY: flock on an open descriptor.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Whether a live process holds the lock of the file at `path`. False when it cannot be
/// opened.
pub fn held(path: &Path) -> bool {
    let Ok(file) = File::open(path) else {
        return false;
    };
    // SAFETY: flock on an open descriptor; a shared lock taken here goes with `file`.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) };
    rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EWOULDBLOCK)
}

/// Removes the file at `path`. In a sticky directory (`/dev/shm`, `/tmp`) a file handed to
/// another user cannot be removed by its creator; it is taken back first (`chown` to this
/// process's user, which the hand-over needed CAP_CHOWN for anyway).
pub fn remove(path: &Path) -> io::Result<()> {
    let dir = File::open(path.parent().unwrap_or(Path::new(".")))?;
    remove_at(&dir, path.file_name().unwrap_or_default())
}

/// [`remove`] of `name` in the open directory `dir`: still reachable when the path the
/// directory was opened by is gone (another process's `/proc/PID/root/...` once it exited).
pub fn remove_at(dir: &File, name: &std::ffi::OsStr) -> io::Result<()> {
    let name = std::ffi::CString::new(name.as_encoded_bytes())?;
    let unlink = || {
        // SAFETY: an open directory and a NUL-terminated name.
        match unsafe { libc::unlinkat(dir.as_raw_fd(), name.as_ptr(), 0) } {
            0 => Ok(()),
            _ => Err(io::Error::last_os_error()),
        }
    };
    match unlink() {
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            // SAFETY: as above; geteuid/getegid take no pointers.
            let rc = unsafe {
                libc::fchownat(
                    dir.as_raw_fd(),
                    name.as_ptr(),
                    libc::geteuid(),
                    libc::getegid(),
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if rc != 0 {
                return Err(io::Error::last_os_error());
            }
            unlink()
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lock_lives_with_the_file_and_dies_with_it() {
        let path = std::env::temp_dir().join(format!("sys-util-lock-{}", std::process::id()));
        std::fs::write(&path, b"old").unwrap();
        assert!(!held(&path), "a plain file is not held");
        let file = create_locked(&path).unwrap();
        assert!(held(&path));
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0, "replaced");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        drop(file);
        assert!(!held(&path));
        remove(&path).unwrap();
        assert!(!path.exists());
        assert!(!held(&path), "a missing file is not held");
    }
}
