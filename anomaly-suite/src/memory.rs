//! Memory scenarios: pressure (anonymous memory kept hot, the page cache dropped, and on
//! cgroup v2 the engine's cgroup pushed into reclaim) and allocator fragmentation.

use std::{
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use crate::{hold, threads, Params};

/// Largest share of MemAvailable the pressure scenario takes (the engine must never be
/// pushed into the OOM killer).
const MAX_SHARE: f64 = 0.8;

fn meminfo_kib(key: &str) -> Option<u64> {
    std::fs::read_to_string("/proc/meminfo")
        .ok()?
        .lines()
        .find_map(|l| {
            l.strip_prefix(key)?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
}

/// An anonymous mapping, unmapped on drop.
struct Mapping {
    ptr: *mut u8,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Mapping> {
        // SAFETY: a fresh private anonymous mapping; the result is checked.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            bail!(
                "mmap of {} MiB failed: {}",
                len >> 20,
                std::io::Error::last_os_error()
            );
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len,
        })
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are the mapping made in `new`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// The engine's cgroup v2 `memory.high`, lowered for the injection and restored after.
struct MemoryHigh {
    file: std::path::PathBuf,
    old: String,
}

impl MemoryHigh {
    fn lower(pid: u32, intensity: f64) -> Option<MemoryHigh> {
        let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        let path = cg.lines().find_map(|l| l.strip_prefix("0::"))?;
        let dir = std::path::Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
        let file = dir.join("memory.high");
        let old = std::fs::read_to_string(&file).ok()?.trim().to_string();
        let current: f64 = std::fs::read_to_string(dir.join("memory.current"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let high = (current * (1.0 - 0.5 * intensity)) as u64;
        std::fs::write(&file, high.to_string()).ok()?;
        Some(MemoryHigh { file, old })
    }
}

impl Drop for MemoryHigh {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.file, &self.old);
    }
}

/// Takes `intensity` × 80 % of MemAvailable and keeps writing to every page of it, drops
/// the page cache every second (so the engine's file-backed pages must be read again), and
/// on cgroup v2 lowers the engine cgroup's memory.high below its usage.
pub fn pressure(p: &Params, stop: &AtomicBool) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let deadline = Instant::now() + p.duration;
    let available = meminfo_kib("MemAvailable:").unwrap_or(0) << 10;
    let len = ((available as f64 * MAX_SHARE * p.intensity) as usize) & !0xfff;
    if len == 0 {
        bail!("cannot read MemAvailable from /proc/meminfo");
    }
    let map = Mapping::new(len)?;
    // Take the memory at once (the kernel fills the pages without a fault per page), then
    // keep every page hot below.
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    const CHUNK: usize = 256 << 20;
    let mut off = 0;
    while off < len && Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        let n = CHUNK.min(len - off);
        // SAFETY: [off, off + n) lies inside the mapping.
        if unsafe { libc::madvise(map.ptr.add(off).cast(), n, MADV_POPULATE_WRITE) } != 0 {
            break;
        }
        off += n;
    }
    let high = MemoryHigh::lower(pid, p.intensity);
    let mut drops = 0;
    let mut dropped_at = Instant::now() - Duration::from_secs(1);
    let mut page = 0usize;
    let mut passes = 0u64;
    while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
        if dropped_at.elapsed() >= Duration::from_secs(1)
            && std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok()
        {
            drops += 1;
            dropped_at = Instant::now();
        }
        for _ in 0..4096 {
            // SAFETY: page < len, inside the mapping.
            unsafe { map.ptr.add(page).write_volatile(passes as u8) };
            page += 4096;
            if page >= len {
                page = 0;
                passes += 1;
            }
        }
    }
    drop(map);
    let cgroup = if high.is_some() {
        "memory.high of the engine's cgroup lowered to half its usage at full intensity"
    } else {
        "no cgroup v2 memory.high here (cgroup v1 or not permitted)"
    };
    drop(high);
    Ok(format!(
        "{} MiB of anonymous memory mapped, {} MiB populated, written {passes} times over, page cache dropped {drops} times; {cgroup}",
        len >> 20,
        off >> 20
    ))
}

/// A small xorshift generator: the stress only needs varied sizes, not good randomness.
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// On every CPU, for `intensity` of every 60 ms: allocate buffers of random sizes (16 B to
/// 1 MiB), touch them and free random ones, so the allocator and the page allocator churn.
pub fn fragmentation(p: &Params, stop: &AtomicBool) -> Result<String> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let deadline = Instant::now() + p.duration;
    let period = Duration::from_millis(60);
    let busy = period.mul_f64(p.intensity);
    let cycles = std::sync::atomic::AtomicU64::new(0);
    threads(n, deadline, stop, |i, deadline, stop| {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1));
        let mut slots: Vec<Vec<u8>> = (0..4096).map(|_| Vec::new()).collect();
        let mut done = 0u64;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            while t.elapsed() < busy {
                let slot = (rng.next() % slots.len() as u64) as usize;
                let size = 16usize << (rng.next() % 17);
                let mut v = vec![0u8; size];
                v[size - 1] = 1;
                slots[slot] = v;
                done += 1;
            }
            hold((t + period).min(deadline), stop);
        }
        cycles.fetch_add(done, Ordering::Relaxed);
    });
    Ok(format!(
        "{n} threads, {} allocate/free cycles of 16 B..1 MiB, busy {:.0} ms of every 60 ms",
        cycles.into_inner(),
        busy.as_secs_f64() * 1e3
    ))
}
