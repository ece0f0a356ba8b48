//! The clocks. CLOCK_MONOTONIC is the one every plane stamps with: it is what
//! `bpf_ktime_get_ns` returns and what Python's `time.monotonic()` reads on Linux.

/// `clock_gettime(clock)` in ns.
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; an unknown clock id leaves it zeroed.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Now on CLOCK_MONOTONIC, in ns.
pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_moves_forward_and_matches_std() {
        let a = monotonic_ns();
        let std_before = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(5));
        let b = monotonic_ns();
        assert!(b >= a + 5_000_000, "{a} {b}");
        // Rust's Instant is CLOCK_MONOTONIC on Linux too.
        assert!(std_before.elapsed().as_nanos() as u64 <= b - a + 1_000_000);
    }
}
