//! Libraries shipped beside the stallscope binary to be loaded into targets (the Python
//! probe's compiled writer, the GPU agent): where one is, and whether a process maps it.

use std::path::PathBuf;

/// Directory, beside a library's usual place, of its build for old glibc (`cargo xtask setup`
/// builds it with zig): it loads into engines whose glibc is as old as 2.28, where the plain
/// build needs 2.34.
pub const PORTABLE_DIR: &str = "glibc-2.28";

/// The library `file`: the path in environment variable `env` if it is set (None when empty:
/// the library is turned off), else the first that exists of `PORTABLE_DIR/file` and `file`
/// in the running executable's directory, then in the one above it (test binaries run from
/// `target/*/deps`).
pub fn locate(env: &str, file: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(env) {
        return (!p.is_empty()).then(|| PathBuf::from(p));
    }
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(2)
        .flat_map(|d| [d.join(PORTABLE_DIR).join(file), d.join(file)])
        .find(|p| p.is_file())
}

/// Whether process `pid` maps a file whose path contains `needle` (false when its maps
/// cannot be read).
pub fn is_mapped(pid: u32, needle: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/maps"))
        .is_ok_and(|m| m.lines().any(|l| l.contains(needle)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_the_library_or_turns_it_off() {
        // One variable per case: tests run in parallel threads of one process.
        std::env::set_var("SYS_UTIL_SHIPPED_SET", "/opt/x/lib.so");
        std::env::set_var("SYS_UTIL_SHIPPED_OFF", "");
        assert_eq!(
            locate("SYS_UTIL_SHIPPED_SET", "lib.so"),
            Some(PathBuf::from("/opt/x/lib.so"))
        );
        assert_eq!(locate("SYS_UTIL_SHIPPED_OFF", "lib.so"), None);
        assert_eq!(locate("SYS_UTIL_SHIPPED_UNSET", "no-such-library.so"), None);
    }

    #[test]
    fn a_process_maps_its_own_executable() {
        let exe = std::env::current_exe().unwrap();
        let name = exe.file_name().unwrap().to_str().unwrap();
        assert!(is_mapped(std::process::id(), name));
        assert!(!is_mapped(std::process::id(), "/no-such-library.so"));
    }
}
