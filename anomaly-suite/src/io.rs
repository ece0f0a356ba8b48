//! I/O contention: fsync-heavy writers hold the engine's disk while its file-backed pages are
//! paged out, so that it reads them back through the busy disk. An engine that does no disk
//! I/O of its own while it runs (vLLM decoding: weights and code in memory, log lines into the
//! page cache) meets a busy disk this way in production: its code pages, evicted by the
//! kernel's reclaim, come back from a disk queue full of other writers' flushes.

use std::{
    io::{Seek, Write},
    path::PathBuf,
    sync::atomic::{AtomicBool, AtomicU64, Ordering},
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use crate::{reclaim::Reclaim, threads, Onset, Params};

/// Largest write between fsyncs.
const MAX_CHUNK: usize = 4 << 20;
/// A writer starts over at the beginning of its file past this size.
const MAX_FILE: u64 = 256 << 20;

/// A scratch file removed on drop.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// 1 + 3·intensity writers, each writing `intensity` × 4 MiB and fsyncing, in a loop, into
/// a scratch file in the engine's working directory (its filesystem), removed after; and the
/// engine's file-backed pages paged out `intensity` × 10 times a second ([`Reclaim`]).
pub fn contention(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    let pid = p.pid.expect("checked by Scenario::run");
    let cwd = std::fs::read_link(format!("/proc/{pid}/cwd"))
        .with_context(|| format!("reading the working directory of pid {pid}"))?;
    let dir = [
        format!("/proc/{pid}/root{}", cwd.display()),
        "/var/tmp".into(),
    ]
    .into_iter()
    .map(PathBuf::from)
    .find(|d| {
        let probe = d.join(format!(".stallscope-probe-{}", std::process::id()));
        let ok = std::fs::write(&probe, b"").is_ok();
        let _ = std::fs::remove_file(&probe);
        ok
    })
    .context("neither the engine's working directory nor /var/tmp is writable")?;
    let writers = 1 + (3.0 * p.intensity).round() as usize;
    let chunk = ((MAX_CHUNK as f64 * p.intensity) as usize).max(64 << 10);
    let files: Vec<Scratch> = (0..writers)
        .map(|i| Scratch(dir.join(format!(".stallscope-io-{}-{i}.tmp", std::process::id()))))
        .collect();
    let deadline = Instant::now() + p.duration;
    let syncs = AtomicU64::new(0);
    let failed = std::sync::Mutex::new(None);
    let reclaim = Reclaim::open(pid);
    let reclaim_every = Duration::from_secs_f64(0.1 / p.intensity.max(0.01));
    let (mut paged_out, mut passes, mut reclaim_error) = (0u64, 0u64, None);
    onset.now();
    std::thread::scope(|scope| {
        scope.spawn(|| write_and_sync(&files, chunk, deadline, stop, &syncs, &failed));
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            let (n, e) = reclaim.pass(deadline);
            paged_out += n;
            passes += 1;
            reclaim_error = reclaim_error.take().or(e);
            std::thread::sleep(
                reclaim_every.min(deadline.saturating_duration_since(Instant::now())),
            );
        }
    });
    drop(files);
    if let Some(e) = failed.into_inner().expect("lock") {
        anyhow::bail!("cannot write the scratch file {e}");
    }
    Ok(format!(
        "{writers} writers of {} KiB + fdatasync in {} ({} syncs), files removed; the file-backed pages of the engine's {} processes paged out {passes} times ({} MiB advised{})",
        chunk >> 10,
        dir.display(),
        syncs.into_inner(),
        reclaim.processes(),
        paged_out >> 20,
        reclaim_error.map_or(String::new(), |e| format!(", process_madvise: {e}"))
    ))
}

/// Each of `files`' writers writes `chunk` bytes and fdatasyncs, in a loop, until `deadline`.
fn write_and_sync(
    files: &[Scratch],
    chunk: usize,
    deadline: Instant,
    stop: &AtomicBool,
    syncs: &AtomicU64,
    failed: &std::sync::Mutex<Option<String>>,
) {
    threads(files.len(), deadline, stop, |i, deadline, stop| {
        let data = vec![0x5au8; chunk];
        let mut f = match std::fs::File::create(&files[i].0) {
            Ok(f) => f,
            Err(e) => {
                *failed.lock().expect("lock") = Some(format!("{}: {e}", files[i].0.display()));
                return;
            }
        };
        while Instant::now() < deadline && !stop.load(Ordering::Relaxed) {
            if f.write_all(&data).and_then(|()| f.sync_data()).is_err() {
                break;
            }
            syncs.fetch_add(1, Ordering::Relaxed);
            if f.stream_position().unwrap_or(0) > MAX_FILE {
                let _ = f.rewind();
            }
        }
    });
}
