//! The libraries loaded into the engine (the GPU agent, the probe's compiled writer) built for
//! old glibc. They must link against the engine's glibc, which in a container can be as old as
//! manylinux_2_28's (2.28; PyTorch's wheels target it). Built on this host, they would need
//! glibc 2.34 (pthread_create, dlopen and friends moved into libc then). `zig cc` links against
//! the glibc 2.28 symbol versions instead; zig comes from PyPI (`ziglang`) into a cached venv.
//! The results go to `target/release/glibc-2.28/`, where `stallscope` looks first.

use std::{fs, path::PathBuf, process::Command};

use anyhow::{Context, Result};

use crate::{run_checked, setup::cache_dir, vllm};

/// Pinned zig (PyPI `ziglang`).
const ZIG: &str = "ziglang==0.13.0";
/// The oldest glibc the agent must run with.
pub const GLIBC: &str = "2.28";

/// The venv holding zig, and a linker wrapper for cargo: `<cache>/zig-venv`.
fn zig_linker() -> Result<PathBuf> {
    let dir = cache_dir().join("zig-venv");
    let linker = dir.join(format!("zig-cc-glibc-{GLIBC}"));
    let base = crate::setup::pyenv_python("3.11").context("pyenv CPython 3.11 is missing")?;
    let recipe = format!("python {}\n{ZIG}\nglibc {GLIBC}\n", base.display());
    if vllm::is_current(&dir, &recipe) {
        return Ok(linker);
    }
    eprintln!("setup: installing {ZIG} into {}", dir.display());
    let _ = fs::remove_dir_all(&dir);
    run_checked(Command::new(&base).args(["-m", "venv"]).arg(&dir))?;
    run_checked(
        Command::new(dir.join("bin/python")).args(["-m", "pip", "install", "--quiet", ZIG]),
    )?;
    // rustc passes flags for its own target triple that zig's driver does not take.
    let script = format!(
        "#!/bin/sh\n# cargo's linker: zig cc for x86_64 glibc {GLIBC} (written by cargo xtask setup)\nfor a in \"$@\"; do\n  case \"$a\" in\n    --target=*|-m64) ;;\n    *) set -- \"$@\" \"$a\" ;;\n  esac\n  shift\ndone\nexec \"{}\" -m ziglang cc -target x86_64-linux-gnu.{GLIBC} \"$@\"\n",
        dir.join("bin/python").display()
    );
    fs::write(&linker, script)?;
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&linker, fs::Permissions::from_mode(0o755))?;
    fs::write(vllm::stamp(&dir), recipe)?;
    Ok(linker)
}

/// The packages built for old glibc and their libraries.
const LIBRARIES: [(&str, &str); 2] = [
    ("cupti-agent", "libstallscope_cupti_agent.so"),
    ("pyframe-native", "libstallscope_pyprobe.so"),
];

/// Builds [`LIBRARIES`] for glibc [`GLIBC`] into `target/release/glibc-<GLIBC>/`.
pub fn build() -> Result<()> {
    let linker = zig_linker()?;
    let target_dir = crate::root().join("target/glibc-".to_string() + GLIBC);
    crate::run_checked(
        Command::new(env!("CARGO"))
            .args(["build", "--release", "--target", "x86_64-unknown-linux-gnu"])
            .args(
                LIBRARIES
                    .iter()
                    .flat_map(|(package, _)| ["--package", package]),
            )
            .arg("--target-dir")
            .arg(&target_dir)
            .env("CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER", &linker)
            .current_dir(crate::root()),
    )?;
    let dest_dir = crate::root().join(format!("target/release/glibc-{GLIBC}"));
    fs::create_dir_all(&dest_dir)?;
    for (_, file) in LIBRARIES {
        let built = target_dir
            .join("x86_64-unknown-linux-gnu/release")
            .join(file);
        let dest = dest_dir.join(file);
        // A new file, not a write through a hard link into cargo's own outputs.
        let _ = fs::remove_file(&dest);
        fs::copy(&built, &dest).with_context(|| format!("copying {}", built.display()))?;
    }
    Ok(())
}
