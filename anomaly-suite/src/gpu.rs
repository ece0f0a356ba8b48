//! GPU scenarios for a GPU machine: a competing GEMM loop, host↔device copy saturation, and
//! peer-to-peer copy saturation, each a PyTorch process (`STALLSCOPE_GPU_PYTHON`, default
//! `python3`) that runs at the given duty cycle until its deadline, killed early on stop and
//! when its parent dies. Clock locking changes device settings and refuses to run unless
//! explicitly allowed.

use std::{
    os::unix::process::CommandExt,
    process::{Command, Stdio},
    sync::atomic::{AtomicBool, Ordering},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use crate::{Onset, Params};

/// Exit code of the workload when torch sees no CUDA device.
const NO_GPU: i32 = 3;
/// Exit code when the scenario needs two devices.
const ONE_GPU: i32 = 4;

/// Duty-cycle loop shared by the workloads: `work()` for `intensity` of every 100 ms.
const PRELUDE: &str = r#"import sys, time
try:
    import torch
except ImportError:
    sys.exit(3)
if not torch.cuda.is_available():
    sys.exit(3)
intensity, deadline = float(sys.argv[1]), time.monotonic() + float(sys.argv[2])
def duty(work):
    while time.monotonic() < deadline:
        t = time.monotonic()
        while time.monotonic() - t < 0.1 * intensity:
            work()
        torch.cuda.synchronize()
        time.sleep(max(0.0, 0.1 - (time.monotonic() - t)))
"#;

fn python() -> String {
    std::env::var("STALLSCOPE_GPU_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// Runs `body` (after [`PRELUDE`]) until the deadline or `stop`.
fn workload(p: &Params, stop: &AtomicBool, body: &str) -> Result<()> {
    let py = python();
    let mut cmd = Command::new(&py);
    cmd.arg("-c")
        .arg(format!("{PRELUDE}{body}"))
        .arg(p.intensity.to_string())
        .arg(p.duration.as_secs_f64().to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: prctl is async-signal-safe; the workload dies with this process.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    let mut child = cmd.spawn().with_context(|| format!("cannot start {py}"))?;
    let deadline = Instant::now() + p.duration + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait()? {
            break s;
        }
        if stop.load(Ordering::Relaxed) || Instant::now() > deadline {
            let _ = child.kill();
            break child.wait()?;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    match status.code() {
        Some(0) | None => Ok(()),
        Some(NO_GPU) => bail!(
            "no CUDA GPU with PyTorch for {py}: the GPU scenarios run on a GPU machine (STALLSCOPE_GPU_PYTHON picks the interpreter)"
        ),
        Some(ONE_GPU) => bail!("this scenario needs two CUDA devices; torch sees one"),
        Some(c) => {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            bail!("the GPU workload exited with {c}: {}", err.trim())
        }
    }
}

/// A bf16 GEMM loop on device 0 competing with the engine's kernels.
pub fn gemm_contention(p: &Params, stop: &AtomicBool, _: &Onset) -> Result<String> {
    workload(
        p,
        stop,
        "a = torch.randn(8192, 8192, device='cuda', dtype=torch.bfloat16)\nb = torch.randn_like(a)\nduty(lambda: a @ b)\n",
    )?;
    Ok(format!(
        "8192x8192 bf16 GEMMs on cuda:0 for {:.0} ms of every 100 ms",
        100.0 * p.intensity
    ))
}

/// Host→device and device→host copies of a pinned 256 MiB buffer.
pub fn pcie_saturation(p: &Params, stop: &AtomicBool, _: &Onset) -> Result<String> {
    workload(
        p,
        stop,
        "h = torch.empty(64 << 20, dtype=torch.float32).pin_memory()\nd = torch.empty_like(h, device='cuda')\ndef copy():\n    d.copy_(h, non_blocking=True)\n    h.copy_(d, non_blocking=True)\nduty(copy)\n",
    )?;
    Ok(format!(
        "256 MiB pinned host<->cuda:0 copies for {:.0} ms of every 100 ms",
        100.0 * p.intensity
    ))
}

/// Copies between devices 0 and 1.
pub fn p2p_saturation(p: &Params, stop: &AtomicBool, _: &Onset) -> Result<String> {
    workload(
        p,
        stop,
        "if torch.cuda.device_count() < 2:\n    sys.exit(4)\nx = torch.empty(64 << 20, device='cuda:0')\ny = torch.empty(64 << 20, device='cuda:1')\ndef copy():\n    y.copy_(x, non_blocking=True)\n    x.copy_(y, non_blocking=True)\nduty(copy)\n",
    )?;
    Ok(format!(
        "256 MiB cuda:0<->cuda:1 copies for {:.0} ms of every 100 ms",
        100.0 * p.intensity
    ))
}

/// Locks the graphics clock of device 0 low (nvidia-smi), and resets it after. Refused
/// unless `allow_device_settings`: lent GPU machines must never have their clocks changed.
pub fn clock_lock(p: &Params, stop: &AtomicBool, onset: &Onset) -> Result<String> {
    if !p.allow_device_settings {
        bail!("clock-lock changes the GPU's clock settings: it runs only with --allow-device-settings, and never on a lent or shared machine");
    }
    let smi = |args: &[&str]| -> Result<String> {
        let out = Command::new("nvidia-smi")
            .args(args)
            .output()
            .context("cannot run nvidia-smi")?;
        if !out.status.success() {
            bail!(
                "nvidia-smi {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let clocks = smi(&[
        "-i",
        "0",
        "--query-supported-clocks=graphics",
        "--format=csv,noheader,nounits",
    ])?;
    let mut mhz: Vec<u32> = clocks
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    mhz.sort_unstable();
    let (Some(&lo), Some(&hi)) = (mhz.first(), mhz.last()) else {
        bail!("nvidia-smi lists no supported graphics clocks");
    };
    let target = hi - ((hi - lo) as f64 * p.intensity) as u32;
    smi(&["-i", "0", "-lgc", &format!("{target},{target}")])?;
    onset.now();
    crate::hold(Instant::now() + p.duration, stop);
    smi(&["-i", "0", "-rgc"])?;
    Ok(format!(
        "graphics clock of GPU 0 locked at {target} MHz (supported {lo}-{hi}), reset after"
    ))
}
