//! `/proc/PID/status`, read once and queried by key.

use crate::error::{Error, Result};

/// The text of `/proc/PID/status` (`NoSuchProcess` when it cannot be read).
pub fn status(pid: i32) -> Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/status")).map_err(|_| Error::NoSuchProcess(pid))
}

/// The value of the `KEY:` line of a status text, trimmed (e.g. `"0\t0\t0\t0"` for `Uid`).
pub fn status_field<'a>(status: &'a str, key: &str) -> Option<&'a str> {
    status.lines().find_map(|l| {
        l.strip_prefix(key)
            .and_then(|v| v.strip_prefix(':'))
            .map(str::trim)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_by_key() {
        let s = "Name:\tpython3\nTracerPid:\t42\nUid:\t1000\t1001\t1000\t1000\n";
        assert_eq!(status_field(s, "TracerPid"), Some("42"));
        assert_eq!(status_field(s, "Uid"), Some("1000\t1001\t1000\t1000"));
        assert_eq!(status_field(s, "Gid"), None);
        assert_eq!(status_field(s, "Tracer"), None);
    }
}
