//! Syscall numbers to names for the host architecture.

/// The name of syscall `nr` (`syscall_<nr>` when unknown).
pub fn name(nr: u32) -> String {
    syscalls::Sysno::new(nr as usize)
        .map(|s| s.name().to_string())
        .unwrap_or_else(|| format!("syscall_{nr}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_common_syscalls() {
        assert_eq!(super::name(0), "read");
        assert_eq!(super::name(202), "futex");
        assert_eq!(super::name(100_000), "syscall_100000");
    }
}
