//! Files and directories only their owner may read or write (0600 and 0700): what the daemon
//! writes (the alert log, the iteration export, models, deep-dive traces of the engine's
//! threads and syscalls) describes the engine and its workload. Directories that already
//! exist keep their mode (an operator chose it); files this opens for writing are set to 0600
//! even when they existed.

use std::{
    fs::{DirBuilder, File, OpenOptions},
    io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::Path,
};

/// Creates `dir` and its missing parents, 0700.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)
}

/// Creates or truncates `path`, 0600.
pub fn create_file(path: &Path) -> io::Result<File> {
    owner_only(
        OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(path)?,
    )
}

/// Opens `path` for appending, creating it, 0600.
pub fn append_file(path: &Path) -> io::Result<File> {
    owner_only(
        OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .open(path)?,
    )
}

/// Writes `data` to `path` (created or truncated), 0600.
pub fn write(path: &Path, data: &[u8]) -> io::Result<()> {
    io::Write::write_all(&mut create_file(path)?, data)
}

fn owner_only(f: File) -> io::Result<File> {
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    Ok(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).unwrap().permissions().mode() & 0o777
    }

    #[test]
    fn what_is_created_is_the_owners_alone() {
        let base = std::env::temp_dir().join(format!("stallscope-private-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let nested = base.join("a/b");
        create_dir(&nested).unwrap();
        assert_eq!(
            (mode(&base), mode(&base.join("a")), mode(&nested)),
            (0o700, 0o700, 0o700)
        );
        // A file that existed world-readable is made the owner's when opened for writing.
        let f = nested.join("x.csv");
        std::fs::write(&f, b"old").unwrap();
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
        create_file(&f).unwrap();
        assert_eq!(mode(&f), 0o600);
        assert_eq!(std::fs::read(&f).unwrap(), b"");
        let log = nested.join("alerts.jsonl");
        append_file(&log).unwrap();
        write(&nested.join("m.json"), b"{}").unwrap();
        assert_eq!((mode(&log), mode(&nested.join("m.json"))), (0o600, 0o600));
        std::fs::remove_dir_all(&base).unwrap();
    }
}
