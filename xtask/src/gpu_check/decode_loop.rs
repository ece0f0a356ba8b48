//! The decode loop the check watches (tests/targets/gpu_decode.py) and what it says of itself:
//! its synchronize stamps, its step times and its token rate, all on CLOCK_MONOTONIC.

use std::{
    io::{BufRead, BufReader},
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
};

use anyhow::{bail, Context, Result};

#[derive(Default)]
struct Seen {
    /// (t0, t1) around each torch.cuda.synchronize().
    syncs: Vec<(u64, u64)>,
    /// (start, end) of each step.
    steps: Vec<(u64, u64)>,
    /// (ns, tokens/s).
    tps: Vec<(u64, f64)>,
}

/// The running loop; killed when dropped.
pub struct DecodeLoop {
    child: Child,
    pub pid: u32,
    /// `llama` or `gemv`.
    pub kind: String,
    seen: Arc<Mutex<Seen>>,
}

impl DecodeLoop {
    /// `kind`: `llama` or `gemv` (see the script).
    pub fn start(python: &str, script: &Path, kind: &str) -> Result<DecodeLoop> {
        let mut child = Command::new(python)
            .arg(script)
            .arg(kind)
            .stdout(Stdio::piped())
            .spawn()
            .context("cannot start the decode loop")?;
        let pid = child.id();
        let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
        let ready = lines.next().transpose()?.unwrap_or_default();
        let Some(kind) = ready.strip_prefix("ready ") else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the decode loop did not start: {ready:?}");
        };
        let kind = kind.to_string();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let sink = seen.clone();
        std::thread::spawn(move || {
            for l in lines.map_while(Result::ok) {
                let f: Vec<&str> = l.split_whitespace().collect();
                let (Some(&tag), Some(a), Some(b)) = (f.first(), f.get(1), f.get(2)) else {
                    continue;
                };
                let mut s = sink.lock().expect("lock");
                match (tag, a.parse::<u64>()) {
                    ("sync", Ok(a)) => b.parse().map(|b| s.syncs.push((a, b))).unwrap_or(()),
                    ("step", Ok(a)) => b.parse().map(|b| s.steps.push((a, b))).unwrap_or(()),
                    ("tps", Ok(a)) => b.parse().map(|b| s.tps.push((a, b))).unwrap_or(()),
                    _ => {}
                }
            }
        });
        Ok(DecodeLoop {
            child,
            pid,
            kind,
            seen,
        })
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    pub fn syncs(&self) -> Vec<(u64, u64)> {
        self.seen.lock().expect("lock").syncs.clone()
    }

    /// Durations (ns) of the steps that began in `[a, b]`.
    pub fn steps_between(&self, a: u64, b: u64) -> Vec<u64> {
        self.step_spans(a, b).iter().map(|(s, e)| e - s).collect()
    }

    /// (start, end) of the steps that began in `[a, b]`.
    pub fn step_spans(&self, a: u64, b: u64) -> Vec<(u64, u64)> {
        self.seen
            .lock()
            .expect("lock")
            .steps
            .iter()
            .filter(|(s, _)| (a..=b).contains(s))
            .copied()
            .collect()
    }

    /// Mean tokens/s over the half-second reports that fall in any of `windows`.
    pub fn mean_tps(&self, windows: &[(u64, u64)]) -> Option<f64> {
        let seen = self.seen.lock().expect("lock");
        let v: Vec<f64> = seen
            .tps
            .iter()
            .filter(|(t, _)| windows.iter().any(|(a, b)| a <= t && t <= b))
            .map(|(_, x)| *x)
            .collect();
        (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
    }

    /// Threads, mappings and /dev/shm files that name this process: what a detach must restore.
    pub fn footprint(&self) -> Footprint {
        let comms: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", self.pid))
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .filter_map(|e| std::fs::read_to_string(e.path().join("comm")).ok())
                    .map(|c| c.trim().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let threads = comms.len();
        let stallscope_threads = comms.iter().filter(|c| c.starts_with("stallscope")).count();
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", self.pid)).unwrap_or_default();
        let stallscope_maps = maps
            .lines()
            .filter_map(|l| l.split_whitespace().nth(5))
            .filter(|path| {
                path.rsplit('/')
                    .next()
                    .is_some_and(|f| f.contains("stallscope"))
            })
            .map(str::to_string)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let tag = format!("-{}-", self.pid);
        let shm = std::fs::read_dir("/dev/shm")
            .map(|d| {
                d.filter_map(|e| e.ok())
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with("stallscope") && n.contains(&tag))
                    .collect()
            })
            .unwrap_or_default();
        Footprint {
            threads,
            stallscope_threads,
            stallscope_maps,
            shm,
        }
    }
}

impl Drop for DecodeLoop {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct Footprint {
    pub threads: usize,
    pub stallscope_threads: usize,
    pub stallscope_maps: Vec<String>,
    pub shm: Vec<String>,
}

impl Footprint {
    /// Nothing of stallscope's is left in the process but one copy of the probe's compiled
    /// writer: CPython cannot unload an extension module, so once loaded it stays (idle, its
    /// file deleted) and later attaches reuse it (`pyframe_tracer::native`).
    pub fn clean(&self) -> bool {
        let writer = |m: &String| {
            m.rsplit('/')
                .next()
                .is_some_and(|f| f.starts_with(pyframe_tracer::native::COPY_PREFIX))
        };
        let writers = self.stallscope_maps.iter().filter(|m| writer(m)).count();
        self.stallscope_threads == 0
            && writers <= 1
            && self.stallscope_maps.len() == writers
            && self.shm.is_empty()
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"threads": self.threads, "stallscope_threads": self.stallscope_threads, "stallscope_mappings": self.stallscope_maps, "shm_files": self.shm})
    }
}

/// The median of `v` (None when empty).
pub fn median(v: &[u64]) -> Option<u64> {
    let mut v = v.to_vec();
    v.sort_unstable();
    v.get(v.len() / 2).copied()
}

/// The `q` quantile of a sorted slice.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
        .copied()
}
