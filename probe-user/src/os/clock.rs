//! The one clock every plane shares: CLOCK_MONOTONIC in nanoseconds (what
//! `bpf_ktime_get_ns` returns and what the Python probe stamps with).

pub use sys_util::clock::monotonic_ns;

/// CLOCK_REALTIME minus CLOCK_MONOTONIC, ns: add it to a monotonic stamp for wall-clock time.
pub fn realtime_offset_ns() -> i128 {
    let wall = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as i128);
    wall - monotonic_ns() as i128
}

/// Now, ms since the epoch.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Now, ns since the epoch (CLOCK_REALTIME).
pub fn unix_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
