//! Memory scenarios: pressure (anonymous memory kept hot, the page cache dropped, and on
//! cgroup v2 the engine's cgroup pushed into reclaim) and allocator fragmentation.

use std::{
    sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};

use crate::{duty_period, each_period, reclaim::Reclaim, threads, Onset, Params};

/// Largest share of MemAvailable the pressure scenario takes (the engine must never be
/// pushed into the OOM killer).
const MAX_SHARE: f64 = 0.8;

/// MemAvailable the taking thread always leaves (bytes): what it took is only ever part of
/// the pressure, and near zero the kernel thrashes on file pages and a 4 MiB chunk can take
/// seconds, holding the injection past its deadline.
fn memory_floor() -> u64 {
    let total = meminfo_kib("MemTotal:").unwrap_or(0) << 10;
    (1u64 << 30).max(total / 20)
}

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

/// Takes `intensity` × 80 % of MemAvailable (with swap, keeps its pages recently used), drops
/// the page cache every second (so the engine's file-backed pages must be read again), and
/// pushes the engine itself into reclaim: on cgroup v2 its cgroup's memory.high is lowered
/// below its usage; elsewhere its file-backed pages are paged out `intensity` × 10 times a
/// second ([`Reclaim`]). The memory is taken by a thread at nice 19, so that taking it (the
/// kernel zeroes every page) does not also contend for the engine's CPUs; at the deadline it
/// goes back to nice 0 to finish its last chunk at once (starved, it held the end up by
/// seconds).
pub fn pressure(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let deadline = Instant::now() + p.duration;
    let available = meminfo_kib("MemAvailable:").unwrap_or(0) << 10;
    let len = ((available as f64 * MAX_SHARE * p.intensity) as usize) & !0xfff;
    if len == 0 {
        bail!("cannot read MemAvailable from /proc/meminfo");
    }
    let map = Mapping::new(len)?;
    onset.now();
    let high = MemoryHigh::lower(pid, p.intensity);
    let reclaim = high.is_none().then(|| Reclaim::open(pid));
    let reclaim_every = Duration::from_secs_f64(0.1 / p.intensity.max(0.01));
    let swap = meminfo_kib("SwapTotal:").unwrap_or(0) > 0;
    let progress = Taking::default();
    let (mut reclaimed, mut passes_out, mut reclaim_error) = (0u64, 0u64, None);
    let mut drops = 0;
    std::thread::scope(|scope| {
        let base = map.ptr as usize;
        let progress = &progress;
        scope.spawn(move || take_memory(base, len, swap, deadline, stop, progress));
        let mut dropped_at = Instant::now() - Duration::from_secs(1);
        let mut reclaimed_at = Instant::now() - reclaim_every;
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            if dropped_at.elapsed() >= Duration::from_secs(1)
                && std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok()
            {
                drops += 1;
                dropped_at = Instant::now();
            }
            if let Some(r) = reclaim
                .as_ref()
                .filter(|_| reclaimed_at.elapsed() >= reclaim_every)
            {
                let (n, e) = r.pass(deadline);
                reclaimed += n;
                passes_out += 1;
                reclaim_error = reclaim_error.take().or(e);
                reclaimed_at = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let tid = progress.tid.load(Ordering::Relaxed);
        if tid > 0 {
            set_nice(tid, 0);
        }
    });
    drop(map);
    // Exactly one of memory.high and the targeted reclaim pushed the engine.
    let cgroup = match &reclaim {
        None => "memory.high of the engine's cgroup lowered to half its usage at full intensity"
            .to_string(),
        Some(r) => format!(
            "no cgroup v2 memory.high here: the file-backed pages of the engine's {} processes paged out {passes_out} times ({} MiB advised{})",
            r.processes(),
            reclaimed >> 20,
            reclaim_error.map_or(String::new(), |e| format!(", process_madvise: {e}"))
        ),
    };
    drop(high);
    let taken = progress.taken.load(Ordering::Relaxed);
    if taken == 0 {
        bail!("could not take any memory (madvise MADV_POPULATE_WRITE failed)");
    }
    Ok(format!(
        "{} MiB of anonymous memory mapped, {} MiB taken, written {} times over, page cache dropped {drops} times; {cgroup}",
        len >> 20,
        taken >> 20,
        progress.passes.load(Ordering::Relaxed)
    ))
}

/// What the taking thread of [`pressure`] reports back.
#[derive(Default)]
struct Taking {
    /// Bytes taken so far.
    taken: AtomicUsize,
    /// Passes over the taken memory (with swap).
    passes: AtomicU64,
    /// The thread's tid, once it runs.
    tid: AtomicI32,
}

/// Sets the nice value of thread `tid` of this process (best effort).
fn set_nice(tid: libc::pid_t, nice: i32) {
    // SAFETY: plain syscall; Linux nice values are per thread.
    unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
}

/// The taking thread of [`pressure`]: fills `[base, base + len)` in chunks (the kernel fills
/// a chunk's pages without a fault per page; this VM hands out a few hundred MB a second)
/// while MemAvailable stays above [`memory_floor`],
/// then, with swap, keeps the pages recently used (paced: 16 MiB every 10 ms). Without swap
/// anonymous pages cannot be reclaimed: holding them is the pressure.
fn take_memory(
    base: usize,
    len: usize,
    swap: bool,
    deadline: Instant,
    stop: &AtomicBool,
    progress: &Taking,
) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    const CHUNK: usize = 4 << 20;
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::gettid() };
    progress.tid.store(tid, Ordering::Relaxed);
    set_nice(tid, 19);
    let running = || Instant::now() < deadline && !stop.load(Ordering::Relaxed);
    let floor = memory_floor();
    let mut off = 0;
    while off < len
        && running()
        && meminfo_kib("MemAvailable:").is_some_and(|kib| kib << 10 > floor)
    {
        let n = CHUNK.min(len - off);
        // SAFETY: [off, off + n) lies inside the mapping, which outlives this thread.
        if unsafe { libc::madvise((base + off) as *mut libc::c_void, n, MADV_POPULATE_WRITE) } != 0
        {
            break;
        }
        off += n;
        progress.taken.store(off, Ordering::Relaxed);
    }
    let mut page = 0usize;
    while swap && off > 0 && running() {
        std::thread::sleep(Duration::from_millis(10));
        for _ in 0..4096 {
            // SAFETY: page < off, inside the populated part of the mapping.
            unsafe { ((base + page) as *mut u8).write_volatile(page as u8) };
            page += 4096;
            if page >= off {
                page = 0;
                progress.passes.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// memory-fragmentation's duty-cycle period without the engine's step ([`duty_period`]).
const CHURN_PERIOD: Duration = Duration::from_millis(60);

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

/// On every CPU, for `intensity` of every period ([`duty_period`], at most 60 ms): allocate
/// buffers of random sizes (16 B to 1 MiB), touch them and free random ones, so the allocator
/// and the page allocator churn.
pub fn fragmentation(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    let deadline = Instant::now() + p.duration;
    let period = duty_period(p, CHURN_PERIOD);
    let busy = period.mul_f64(p.intensity);
    let cycles = std::sync::atomic::AtomicU64::new(0);
    threads(n, deadline, stop, |i, deadline, stop| {
        let mut rng = XorShift(0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1));
        let mut slots: Vec<Vec<u8>> = (0..4096).map(|_| Vec::new()).collect();
        let mut done = 0u64;
        onset.now();
        each_period(period, deadline, stop, |t| {
            while t.elapsed() < busy {
                let slot = (rng.next() % slots.len() as u64) as usize;
                let size = 16usize << (rng.next() % 17);
                let mut v = vec![0u8; size];
                v[size - 1] = 1;
                slots[slot] = v;
                done += 1;
            }
        });
        cycles.fetch_add(done, Ordering::Relaxed);
    });
    Ok(format!(
        "{n} threads, {} allocate/free cycles of 16 B..1 MiB, busy {:.1} ms of every {:.1} ms",
        cycles.into_inner(),
        busy.as_secs_f64() * 1e3,
        period.as_secs_f64() * 1e3
    ))
}
