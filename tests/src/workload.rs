//! Real workloads for stallscope's end-to-end tests and benchmarks. Each mode prints one
//! JSON line describing itself (pid, thread ids) once it is running.

use std::{
    io::Write,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use clap::{Parser, Subcommand};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// A busy thread and a mostly-sleeping thread, both pinned to `cpu`.
    SchedMix {
        #[arg(long, default_value_t = 1)]
        cpu: usize,
    },
    /// One spinning thread pinned to `cpu`.
    Hog {
        #[arg(long, default_value_t = 1)]
        cpu: usize,
    },
    /// `threads` threads issuing cheap syscalls (getppid) and sendto/recvfrom on a socketpair.
    /// With `go_for`, they wait for a line on stdin (a probe's window is open), storm that
    /// many seconds, and stop at the top of their loop: every count of a window that outlasts
    /// them is whole.
    SyscallStorm {
        #[arg(long, default_value_t = 1)]
        threads: usize,
        #[arg(long)]
        go_for: Option<f64>,
    },
    /// Two threads bouncing a byte over pipes for `seconds` (after `warmup` seconds of
    /// waiting, so a probe can attach first); prints round trips per second.
    Pingpong {
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        #[arg(long, default_value_t = 0.0)]
        warmup: f64,
    },
    /// Starts a few threads that work and sleep, then waits for a line on stdin (a probe's
    /// window is open) and exits `ms` after it.
    ExitAfter {
        #[arg(long)]
        ms: u64,
    },
}

fn gettid() -> u32 {
    // SAFETY: no arguments.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

fn pin(cpu: usize) {
    let _ = sys_util::sched::set_affinity(0, &std::collections::BTreeSet::from([cpu]));
}

fn spin_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

fn announce(v: serde_json::Value) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{v}");
    let _ = out.flush();
}

fn spawn_named(name: &str, f: impl FnOnce() + Send + 'static) -> std::thread::JoinHandle<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .expect("spawn")
}

fn main() {
    match Cli::parse().mode {
        Mode::SchedMix { cpu } => {
            let (tx, rx) = std::sync::mpsc::channel();
            let t1 = tx.clone();
            spawn_named("busy", move || {
                pin(cpu);
                t1.send(("busy", gettid())).unwrap();
                loop {
                    spin_for(Duration::from_secs(1));
                }
            });
            spawn_named("sleeper", move || {
                pin(cpu);
                tx.send(("sleeper", gettid())).unwrap();
                loop {
                    spin_for(Duration::from_micros(300));
                    std::thread::sleep(Duration::from_millis(2));
                }
            });
            let mut v = serde_json::json!({ "pid": std::process::id() });
            for _ in 0..2 {
                let (name, tid) = rx.recv().unwrap();
                v[format!("{name}_tid")] = tid.into();
            }
            announce(v);
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Mode::Hog { cpu } => {
            pin(cpu);
            announce(serde_json::json!({ "pid": std::process::id() }));
            loop {
                spin_for(Duration::from_secs(1));
            }
        }
        Mode::SyscallStorm { threads, go_for } => {
            static GO: AtomicBool = AtomicBool::new(false);
            static STOP: AtomicBool = AtomicBool::new(false);
            GO.store(go_for.is_none(), Ordering::Relaxed);
            for i in 0..threads {
                spawn_named(&format!("storm{i}"), || {
                    while !GO.load(Ordering::Acquire) {
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    let mut fds = [0; 2];
                    // SAFETY: valid array for two fds.
                    unsafe {
                        libc::socketpair(libc::AF_UNIX, libc::SOCK_DGRAM, 0, fds.as_mut_ptr())
                    };
                    let buf = [7u8; 100];
                    let mut rbuf = [0u8; 100];
                    while !STOP.load(Ordering::Relaxed) {
                        for _ in 0..64 {
                            // SAFETY: plain syscalls on our own fds and buffers.
                            unsafe { libc::getppid() };
                        }
                        // SAFETY: as above.
                        unsafe {
                            libc::sendto(
                                fds[0],
                                buf.as_ptr().cast(),
                                buf.len(),
                                0,
                                std::ptr::null(),
                                0,
                            );
                            libc::recvfrom(
                                fds[1],
                                rbuf.as_mut_ptr().cast(),
                                rbuf.len(),
                                0,
                                std::ptr::null_mut(),
                                std::ptr::null_mut(),
                            );
                            libc::sched_yield();
                        }
                    }
                    // Stopped, not gone: the probe's report keeps the thread.
                    loop {
                        std::thread::sleep(Duration::from_secs(3600));
                    }
                });
            }
            announce(serde_json::json!({ "pid": std::process::id() }));
            if let Some(seconds) = go_for {
                let mut go = String::new();
                let _ = std::io::stdin().read_line(&mut go);
                GO.store(true, Ordering::Release);
                std::thread::sleep(Duration::from_secs_f64(seconds));
                STOP.store(true, Ordering::Relaxed);
            }
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        Mode::Pingpong { seconds, warmup } => pingpong(
            Duration::from_secs_f64(seconds),
            Duration::from_secs_f64(warmup),
        ),
        Mode::ExitAfter { ms } => {
            static STOP: AtomicBool = AtomicBool::new(false);
            for i in 0..3 {
                spawn_named(&format!("worker{i}"), || {
                    while !STOP.load(Ordering::Relaxed) {
                        spin_for(Duration::from_millis(1));
                        std::thread::sleep(Duration::from_millis(1));
                    }
                });
            }
            announce(serde_json::json!({ "pid": std::process::id() }));
            let mut go = String::new();
            let _ = std::io::stdin().read_line(&mut go);
            std::thread::sleep(Duration::from_millis(ms));
            STOP.store(true, Ordering::Relaxed);
            std::process::exit(0);
        }
    }
}

/// Round trips between two threads over a pair of pipes: every trip is two voluntary
/// context switches (a context-switch-heavy workload for overhead measurements).
fn pingpong(d: Duration, warmup: Duration) {
    let mut a = [0; 2];
    let mut b = [0; 2];
    // SAFETY: valid arrays for the pipe fds.
    unsafe {
        libc::pipe(a.as_mut_ptr());
        libc::pipe(b.as_mut_ptr());
    }
    static TRIPS: AtomicU64 = AtomicU64::new(0);
    let (a_read, b_write) = (a[0], b[1]);
    let echo = spawn_named("pong", move || {
        let mut byte = [0u8; 1];
        loop {
            // SAFETY: our own pipe fds and a one-byte buffer.
            if unsafe { libc::read(a_read, byte.as_mut_ptr().cast(), 1) } != 1 || byte[0] == 0 {
                return;
            }
            unsafe { libc::write(b_write, byte.as_ptr().cast(), 1) };
        }
    });
    announce(serde_json::json!({ "pid": std::process::id() }));
    std::thread::sleep(warmup);
    let start = Instant::now();
    let mut byte = [1u8; 1];
    while start.elapsed() < d {
        for _ in 0..100 {
            // SAFETY: as above.
            unsafe {
                libc::write(a[1], [1u8].as_ptr().cast(), 1);
                libc::read(b[0], byte.as_mut_ptr().cast(), 1);
            }
        }
        TRIPS.fetch_add(100, Ordering::Relaxed);
    }
    let secs = start.elapsed().as_secs_f64();
    // SAFETY: a zero byte tells the echo thread to stop.
    unsafe { libc::write(a[1], [0u8].as_ptr().cast(), 1) };
    let _ = echo.join();
    announce(serde_json::json!({
        "round_trips": TRIPS.load(Ordering::Relaxed),
        "seconds": secs,
        "round_trips_per_sec": TRIPS.load(Ordering::Relaxed) as f64 / secs,
    }));
}
