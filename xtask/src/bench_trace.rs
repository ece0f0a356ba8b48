//! `cargo xtask bench --only trace`: the Perfetto writer's rate and size on a deep dive's event
//! mix (thread-state and syscall slices over 16 threads, interned names, telemetry counters),
//! written through a buffered file to /dev/null; then the same mix, shorter, read back and
//! checked, so that the figures are of a trace that decodes.

use std::{
    io::{BufWriter, Write},
    time::Instant,
};

use anyhow::{ensure, Result};
use perfetto_writer::{ClockReadings, Extra, TraceWriter, Unit};

const SLICES_PER_THREAD: u64 = 100_000;
const THREADS: u32 = 16;
const STATES: [&str; 3] = ["running", "runnable", "sleeping"];
const SYSCALLS: [&str; 6] = [
    "futex",
    "read",
    "write",
    "sched_yield",
    "epoll_wait",
    "mmap",
];

pub fn run() -> Result<()> {
    let out = BufWriter::with_capacity(1 << 20, std::fs::File::create("/dev/null")?);
    let t = Instant::now();
    let w = write_mix(out, SLICES_PER_THREAD)?;
    let (events, bytes) = (w.events(), w.bytes());
    w.finish()?;
    let secs = t.elapsed().as_secs_f64();

    let check = write_mix(Vec::new(), 1_000)?.finish()?;
    let decoded = perfetto_writer::read::decode(&check)
        .map_err(|e| anyhow::anyhow!("the bench's trace does not decode:\n{e}"))?;
    let want = 2 * 1_000 * u64::from(THREADS);
    ensure!(
        decoded.slices.len() as u64 == want,
        "the bench's trace decodes to {} slices, not {want}",
        decoded.slices.len()
    );

    println!("\n## Perfetto writer (cargo xtask bench --only trace)\n");
    println!("| what | value |\n|---|---|");
    println!("| events written | {events} |");
    println!("| rate | {:.2} M events/s |", events as f64 / secs / 1e6);
    println!("| size | {:.2} bytes/event |", bytes as f64 / events as f64);
    println!("| read back (1,000 slices per track) | {want} slices, all closed and in order |");
    Ok(())
}

/// Writes the mix with `slices` state slices (each holding a syscall) per thread.
fn write_mix<W: Write>(out: W, slices: u64) -> Result<TraceWriter<W>> {
    let mut w = TraceWriter::new(out, ClockReadings::now())?;
    let base = ClockReadings::now().monotonic_ns;
    w.process(1000, "engine")?;
    let mut counters = Vec::new();
    for name in ["cpu.util", "psi.cpu.some", "psi.memory.some", "psi.io.some"] {
        counters.push(w.counter(None, name, Unit::Plain("%"))?);
    }
    for tid in 0..THREADS {
        let thread = w.thread(1000, 1000 + tid, &format!("worker-{tid}"))?;
        let states = w.child(thread, "state")?;
        let syscalls = w.child(thread, "syscalls")?;
        let mut ts = base;
        for i in 0..slices {
            // A state slice of ~20 µs with a syscall inside it, like a busy engine thread.
            w.begin(states, ts, STATES[(i % 3) as usize], Extra::default())?;
            w.begin(
                syscalls,
                ts + 2_000,
                SYSCALLS[(i % 6) as usize],
                Extra::default(),
            )?;
            w.end(syscalls, ts + 9_000 + i % 97)?;
            ts += 20_000 + (i % 13) * 100;
            w.end(states, ts)?;
        }
    }
    // 100 Hz telemetry over the same span.
    let span = 20_600 * slices;
    for (k, c) in counters.iter().enumerate() {
        let mut ts = base;
        while ts < base + span {
            w.count(*c, ts, (ts % 1000) as f64 / 10.0 + k as f64)?;
            ts += 10_000_000;
        }
    }
    Ok(w)
}
