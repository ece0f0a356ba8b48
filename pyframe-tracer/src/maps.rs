//! `/proc/PID/maps`: which files are mapped where.

use std::path::PathBuf;

/// One line of `/proc/PID/maps` that maps a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Permissions such as `r-xp`.
    pub perms: String,
    /// Offset of `start` in the file.
    pub offset: u64,
    /// The path as the target sees it (relative to the target's root).
    pub path: String,
}

impl Mapping {
    /// The file through `/proc/PID/map_files/START-END`, readable whatever the target's mount namespace.
    pub fn map_file(&self, pid: i32) -> PathBuf {
        PathBuf::from(format!(
            "/proc/{pid}/map_files/{:x}-{:x}",
            self.start, self.end
        ))
    }

    /// The file name without its directories.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// Parses the text of a maps file, keeping only file-backed mappings.
pub fn parse(text: &str) -> Vec<Mapping> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mapping> {
    let mut it = line.splitn(6, ' ');
    let range = it.next()?;
    let perms = it.next()?.to_string();
    let offset = u64::from_str_radix(it.next()?, 16).ok()?;
    let _dev = it.next()?;
    let inode = it.next()?;
    let path = it.next()?.trim_start();
    if inode == "0" || !path.starts_with('/') {
        return None;
    }
    let (s, e) = range.split_once('-')?;
    Some(Mapping {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        perms,
        offset,
        path: path.trim_end_matches(" (deleted)").to_string(),
    })
}

/// Reads and parses `/proc/PID/maps`.
pub fn read(pid: i32) -> std::io::Result<Vec<Mapping>> {
    Ok(parse(&std::fs::read_to_string(format!(
        "/proc/{pid}/maps"
    ))?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_file_mappings_only() {
        let text = "\
55d0c0a00000-55d0c0a01000 r--p 00000000 08:01 1234   /usr/bin/python3.11
7f0000000000-7f0000021000 rw-p 00000000 00:00 0
7f1000000000-7f1000400000 r-xp 00100000 08:01 99 /opt/py/lib/libpython3.12.so.1.0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
";
        let m = parse(text);
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].path, "/usr/bin/python3.11");
        assert_eq!(m[1].offset, 0x100000);
        assert_eq!(m[1].file_name(), "libpython3.12.so.1.0");
        assert_eq!(
            m[1].map_file(7).to_str().unwrap(),
            "/proc/7/map_files/7f1000000000-7f1000400000"
        );
    }
}
