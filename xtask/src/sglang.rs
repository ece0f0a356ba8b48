//! SGLang for tests/sglang_scheduler.rs: its wheel and the modules its scheduler imports,
//! installed without dependencies into `<cache>/sglang-site` for the vLLM venv's CPython
//! 3.12 and torch (the test puts the directory on PYTHONPATH). No SGLang server runs on a CPU
//! from PyPI (its CPU engine needs `sgl_kernel`'s CPU build), but its scheduler does, with a
//! stand-in model worker.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::setup::cache_dir;

/// SGLang (the newest release the profile was checked against) and what importing
/// `sglang.srt.managers.scheduler` needs beyond the vLLM venv (triton is most of the 1.2 GB).
const PACKAGES: [&str; 7] = [
    "sglang==0.5.23",
    "orjson==3.13.0",
    "triton==3.9.0",
    "ipython==9.18.1",
    "traitlets==5.16.1",
    "torchvision==0.29.2",
    "gguf==0.19.0",
];

/// The directory with SGLang and its imports, installed if missing or stale.
pub fn ensure_site() -> Result<PathBuf> {
    let python = crate::vllm::ensure_venv()?;
    let dir = cache_dir().join("sglang-site");
    let recipe = format!("python {}\n{}\n", python.display(), PACKAGES.join(" "));
    if crate::vllm::is_current(&dir, &recipe) {
        return Ok(dir);
    }
    eprintln!(
        "sglang: installing {} into {} (about 1.2 GB)",
        PACKAGES.join(" "),
        dir.display()
    );
    let _ = fs::remove_dir_all(&dir);
    let base = crate::setup::pyenv_python("3.12")
        .context("pyenv CPython 3.12 is missing: run cargo xtask setup")?;
    crate::run_checked(
        Command::new(crate::vllm::uv(&base)?)
            .env("UV_CACHE_DIR", cache_dir().join("uv-cache"))
            .env("UV_PYTHON_DOWNLOADS", "never")
            .args(["pip", "install", "--quiet", "--no-deps", "--python"])
            .arg(&python)
            .arg("--target")
            .arg(&dir)
            .args(PACKAGES),
    )?;
    fs::write(crate::vllm::stamp(&dir), recipe)?;
    Ok(dir)
}
