//! An engine's baseline model on disk and its fits: the fingerprint it is kept under
//! (framework, served model, hardware), loading a model fitted before, fitting off the hot
//! path on a background thread (`os::sched::background`), and saving what was fitted.

use std::{
    path::{Path, PathBuf},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use log::{info, warn};
use model::{Baseline, Fingerprint, ModelError, Sentinel};

use crate::os::procfs;

type Fit = JoinHandle<Result<(Baseline, Duration), ModelError>>;

/// The model file of one engine and the fit in progress, if any.
pub struct ModelStore {
    pid: u32,
    path: PathBuf,
    fit: Option<Fit>,
}

impl ModelStore {
    /// The store of engine `pid` running `framework`, under `dir`/models; its fingerprint and
    /// the model fitted for it before, if one was saved.
    pub fn open(
        dir: &Path,
        pid: u32,
        framework: &str,
    ) -> (ModelStore, Fingerprint, Option<Baseline>) {
        let fingerprint = Fingerprint {
            framework: framework.to_string(),
            model: served_model(pid),
            hardware: hardware(),
        };
        let path = dir
            .join("models")
            .join(format!("{}.json", fingerprint.key()));
        let baseline = load(&path, &fingerprint);
        if let Some(b) = &baseline {
            info!(
                "engine {pid}: reusing the model fitted on {} samples ({})",
                b.samples,
                path.display()
            );
        }
        let store = ModelStore {
            pid,
            path,
            fit: None,
        };
        (store, fingerprint, baseline)
    }

    /// Installs (and saves) a fit that is done, and starts one when the sentinel has one due.
    /// A model that cannot be saved is still used, and counted in `failures`.
    pub fn manage(&mut self, sentinel: &mut Sentinel, failures: &prometheus::IntCounter) {
        let pid = self.pid;
        if self.fit.as_ref().is_some_and(|h| h.is_finished()) {
            match self.fit.take().expect("checked").join() {
                Ok(Ok((b, took))) => {
                    info!(
                        "engine {pid}: baseline fitted on {} samples in {:.2} s (out-of-fold MAPE {:.2} %, UCL {:.3})",
                        b.samples,
                        took.as_secs_f64(),
                        b.oof_accuracy.mape_pct,
                        b.ucl.limit
                    );
                    if let Err(e) = save(&self.path, &b) {
                        failures.inc();
                        warn!("{e:#} (the model is used, not kept)");
                    }
                    sentinel.install(b);
                }
                Ok(Err(e)) => {
                    warn!("engine {pid}: {e}");
                    sentinel.fit_failed();
                }
                Err(_) => {
                    warn!("engine {pid}: the fit thread panicked");
                    sentinel.fit_failed();
                }
            }
        }
        if self.fit.is_none() && sentinel.fit_due() {
            let data = sentinel.take_training();
            let params = sentinel.params().baseline;
            let fp = sentinel.fingerprint().clone();
            info!(
                "engine {pid}: fitting the baseline on {} healthy iterations",
                data.len()
            );
            self.fit = Some(std::thread::spawn(move || {
                crate::os::sched::background();
                let t = Instant::now();
                Baseline::fit(&data, &params, fp).map(|b| (b, t.elapsed()))
            }));
        }
    }
}

/// The served model's name: the `--model` argument of the engine or of its parents (vLLM's
/// engine core overwrites its own command line; the API server above it keeps it).
fn served_model(pid: u32) -> String {
    let mut p = pid;
    for _ in 0..4 {
        let cmd = procfs::cmdline(p).unwrap_or_default();
        let args: Vec<&str> = cmd.split(' ').collect();
        for (i, a) in args.iter().enumerate() {
            if let Some(v) = a
                .strip_prefix("--model=")
                .or_else(|| a.strip_prefix("--model-path="))
            {
                return v.to_string();
            }
            if (*a == "--model" || *a == "--model-path") && i + 1 < args.len() {
                return args[i + 1].to_string();
            }
        }
        match procfs::parent(p) {
            Some(pp) if pp > 1 => p = pp,
            _ => break,
        }
    }
    "unknown".to_string()
}

/// CPU model and count, and the GPUs NVML sees.
fn hardware() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let name = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".to_string());
    let n = std::thread::available_parallelism().map_or(1, |n| n.get());
    match crate::gpu_plane::nvml::Gpus::open() {
        Ok(g) => format!("{name} x{n}, {}", g.describe()),
        Err(_) => format!("{name} x{n}"),
    }
}

/// The model at `path` if it was fitted for `fp`; a file that does not parse, or of another
/// format (another version of stallscope wrote it), is moved aside.
fn load(path: &Path, fp: &Fingerprint) -> Option<Baseline> {
    let text = std::fs::read_to_string(path).ok()?;
    match Baseline::from_json(&text) {
        Ok(b) if &b.fingerprint == fp => Some(b),
        Ok(_) => None,
        Err(ModelError::Format { found, supported }) => {
            let aside = path.with_extension(format!("format-{found}"));
            info!(
                "{}: a model of format {found}, written by another version of stallscope (this one reads {supported}); moved to {} and warming up again",
                path.display(),
                aside.display()
            );
            let _ = std::fs::rename(path, aside);
            None
        }
        Err(e) => {
            let aside = path.with_extension("corrupt");
            warn!(
                "{}: {e}; moved to {} and warming up again",
                path.display(),
                aside.display()
            );
            let _ = std::fs::rename(path, aside);
            None
        }
    }
}

/// Writes `b` to `path` whole or not at all (a temporary file renamed into place).
fn save(path: &Path, b: &Baseline) -> Result<()> {
    let dir = path.parent().expect("models live in a directory");
    sys_util::private::create_dir(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    let tmp = path.with_extension("json.tmp");
    sys_util::private::write(&tmp, b.to_json().as_bytes())
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))
}
