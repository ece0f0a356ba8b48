//! `cargo xtask setup`: idempotent installation of everything the build and tests need.

use std::{
    env, fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::run_checked;

/// The date-pinned nightly that builds the eBPF crate.
const EBPF_NIGHTLY: &str = "nightly-2026-05-20";
/// `commit-date` that nightly's rustc reports (nightlies are dated the day after).
const EBPF_NIGHTLY_COMMIT_DATE: &str = "2026-05-19";
/// The rustup name build.rs uses; linked to the pinned nightly's directory.
const EBPF_TOOLCHAIN_LINK: &str = "stallscope-ebpf";
/// bpf-linker built against the nightly's own LLVM 22.
const BPF_LINKER_VERSION: &str = "0.13.0";

/// Cache directory outside the checkout.
pub fn cache_dir() -> PathBuf {
    env::var_os("STALLSCOPE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/stallscope")
        })
}

/// Installs what is missing, then builds the release binary, the GPU agent next to it (and
/// its glibc 2.28 build in `glibc-2.28/`) and the stand-in libcupti the tests load.
pub fn run() -> Result<()> {
    let nightly_dir = ebpf_toolchain()?;
    bpf_linker(&nightly_dir)?;
    tracefs()?;
    packages()?;
    python_targets()?;
    cpython_314()?;
    tool_venv("perfetto-venv", &PERFETTO)?;
    tool_venv("deploy-venv", &DEPLOY)?;
    tool_venv("s3-venv", &S3)?;
    tool_venv("litserve-venv", &LITSERVE)?;
    crate::cargo(&[
        "build",
        "--release",
        "--package",
        "probe-user",
        "--package",
        "cupti-agent",
        "--package",
        "pyframe-native",
        "--package",
        "cupti-standin",
        "--package",
        "stallscope-tests",
    ])?;
    crate::portable_agent::build()?;
    eprintln!("setup: ready ({})", crate::stallscope_bin().display());
    Ok(())
}

fn output(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn rustup() -> Command {
    let mut c = Command::new("rustup");
    // Never let the toolchain file of this workspace pick the toolchain for these calls.
    c.env_remove("RUSTUP_TOOLCHAIN").current_dir("/");
    c
}

fn commit_date(toolchain: &str) -> Option<String> {
    let vv = output(rustup().args(["run", toolchain, "rustc", "-vV"])).ok()?;
    vv.lines()
        .find_map(|l| l.strip_prefix("commit-date: ").map(str::to_string))
}

/// Finds (or installs) the pinned nightly with rust-src and links it as
/// `stallscope-ebpf`. Returns the toolchain's directory.
fn ebpf_toolchain() -> Result<PathBuf> {
    let home = PathBuf::from(output(rustup().args(["show", "home"]))?.trim());
    let toolchains = home.join("toolchains");
    let host = "x86_64-unknown-linux-gnu";
    // A machine image may ship the pinned nightly as plain `nightly`: use it if it is the one.
    let candidate = if commit_date(EBPF_NIGHTLY).as_deref() == Some(EBPF_NIGHTLY_COMMIT_DATE) {
        EBPF_NIGHTLY.to_string()
    } else if commit_date("nightly").as_deref() == Some(EBPF_NIGHTLY_COMMIT_DATE) {
        "nightly".to_string()
    } else {
        eprintln!("setup: installing {EBPF_NIGHTLY}");
        run_checked(rustup().args([
            "toolchain",
            "install",
            EBPF_NIGHTLY,
            "--profile",
            "minimal",
            "--no-self-update",
        ]))?;
        EBPF_NIGHTLY.to_string()
    };
    let dir = toolchains.join(format!("{candidate}-{host}"));
    if !dir.join("lib/rustlib/src/rust/library/core").is_dir() {
        eprintln!("setup: adding rust-src to {candidate}");
        run_checked(rustup().args(["component", "add", "rust-src", "--toolchain", &candidate]))?;
    }
    let link = toolchains.join(EBPF_TOOLCHAIN_LINK);
    if fs::read_link(&link).ok().as_deref() != Some(dir.as_path()) {
        eprintln!("setup: linking {EBPF_TOOLCHAIN_LINK} -> {}", dir.display());
        let _ = fs::remove_file(&link);
        run_checked(
            rustup()
                .args(["toolchain", "link", EBPF_TOOLCHAIN_LINK])
                .arg(&dir),
        )?;
    }
    Ok(dir)
}

/// bpf-linker, built against the nightly's libLLVM, in the cache.
fn bpf_linker(nightly_dir: &Path) -> Result<()> {
    let root = cache_dir().join("bpf-linker");
    let bin = root.join("bin/bpf-linker");
    // bpf-linker loads the nightly's libLLVM, which rustup puts on the library path when
    // rustc runs it; do the same for the version check.
    let version = Command::new(&bin)
        .arg("--version")
        .env("LD_LIBRARY_PATH", nightly_dir.join("lib"))
        .output();
    if version.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION)) {
        return Ok(());
    }
    let llvm = cache_dir().join("llvm-22");
    fs::create_dir_all(llvm.join("lib"))?;
    let lib = fs::read_dir(nightly_dir.join("lib"))?
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libLLVM.so.22"))
        })
        .context("the pinned nightly has no lib/libLLVM.so.22*")?;
    let so = llvm.join("lib/libLLVM.so");
    let _ = fs::remove_file(&so);
    std::os::unix::fs::symlink(&lib, &so)?;
    eprintln!("setup: building bpf-linker {BPF_LINKER_VERSION} (about 2 minutes)");
    run_checked(
        Command::new(env!("CARGO"))
            .args([
                "install",
                "bpf-linker",
                "--version",
                BPF_LINKER_VERSION,
                "--locked",
            ])
            .args(["--no-default-features", "--features", "llvm-22", "--root"])
            .arg(&root)
            .env("LLVM_PREFIX", &llvm)
            .env_remove("RUSTUP_TOOLCHAIN")
            .current_dir("/"),
    )
}

/// CPython versions the Python-plane tests attach to (3.9 only to check it is refused).
const PYTHON_TARGETS: [&str; 5] = ["3.9", "3.10", "3.11", "3.12", "3.13"];

/// pyenv's root (PYENV_ROOT or ~/.pyenv).
fn pyenv_root() -> PathBuf {
    env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".pyenv")
        })
}

/// The interpreter of pyenv's `major.minor` install (a release `X.Y.Z`, not a dev or suffixed build).
pub fn pyenv_python(version: &str) -> Option<PathBuf> {
    let prefix = format!("{version}.");
    fs::read_dir(pyenv_root().join("versions"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap_or_default().to_string_lossy();
            name.starts_with(&prefix) && !name[prefix.len()..].contains('.')
        })
        .map(|dir| dir.join("bin/python3"))
}

/// Makes sure pyenv has every test target's CPython, installing the missing ones (latest patch release).
fn python_targets() -> Result<()> {
    let root = pyenv_root();
    for version in PYTHON_TARGETS {
        if pyenv_python(version).is_some() {
            continue;
        }
        let pyenv = root.join("bin/pyenv");
        if !pyenv.exists() {
            bail!(
                "CPython {version} is needed by the Python-plane tests and pyenv is not installed at {}: install pyenv (or set PYENV_ROOT)",
                root.display()
            );
        }
        eprintln!("setup: pyenv install {version} (a few minutes)");
        run_checked(
            Command::new(&pyenv)
                .args(["install", "--skip-existing", version])
                .env("PYENV_ROOT", &root),
        )?;
    }
    Ok(())
}

/// Where a Debian sid root with CPython 3.14 lives: pyenv cannot build 3.14 here and Debian 12's
/// glibc is too old for sid's python3.14, so the tests run 3.14 targets chrooted into it (which
/// also makes them chroot targets).
pub fn sid_root() -> PathBuf {
    cache_dir().join("sid-chroot")
}

/// Builds [`sid_root`] with debootstrap once (a few minutes; about 280 MB).
fn cpython_314() -> Result<()> {
    let root = sid_root();
    if root.join("usr/bin/python3.14").exists() {
        return Ok(());
    }
    eprintln!(
        "setup: debootstrap of Debian sid with python3.14 into {}",
        root.display()
    );
    let partial = root.with_extension("partial");
    let _ = std::fs::remove_dir_all(&partial);
    run_checked(
        Command::new("debootstrap")
            .args(["--variant=minbase", "--include=python3.14", "sid"])
            .arg(&partial)
            .arg("https://deb.debian.org/debian"),
    )?;
    let _ = std::fs::remove_dir_all(&root);
    std::fs::rename(&partial, &root)?;
    Ok(())
}

/// Mounts tracefs where the kernel plane looks for it.
fn tracefs() -> Result<()> {
    let dir = Path::new("/sys/kernel/tracing");
    if dir.join("events").is_dir() {
        return Ok(());
    }
    eprintln!("setup: mounting tracefs on {}", dir.display());
    run_checked(
        Command::new("mount")
            .args(["-t", "tracefs", "none"])
            .arg(dir),
    )
}

/// Debian packages the tests use.
fn packages() -> Result<()> {
    let mut needed: Vec<&str> = [
        ("setpriv", "util-linux"),
        ("promtool", "prometheus"),
        ("prometheus-alertmanager", "prometheus-alertmanager"),
        ("taskset", "util-linux"),
        ("buildah", "buildah"),
        ("crun", "crun"),
        ("debootstrap", "debootstrap"),
    ]
    .into_iter()
    .filter(|(bin, _)| {
        !Command::new("sh")
            .args(["-c", &format!("command -v {bin}")])
            .output()
            .is_ok_and(|o| o.status.success())
    })
    .map(|(_, pkg)| pkg)
    .collect();
    needed.dedup();
    if needed.is_empty() {
        return Ok(());
    }
    eprintln!("setup: installing {needed:?}");
    run_checked(Command::new("apt-get").arg("update").arg("-q"))?;
    run_checked(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(&needed),
    )
}

/// PyPI's `perfetto` package (its bundled `perfetto_trace_pb2` decodes our traces in the
/// deep-dive tests; its trace processor needs a download and is not used).
const PERFETTO: [&str; 2] = ["perfetto==0.59.1", "protobuf==7.36.2"];

/// What deploy/check.py renders and validates the Helm chart with: Helm v4's own template
/// engine (helm-python-sdk wraps its library) and the Kubernetes schemas 1.25-1.37.
const DEPLOY: [&str; 2] = ["helm-python-sdk==0.2.2", "kubernetes-validate==1.37.0"];

/// A real S3 server for the fleet test's shared store: moto in server mode.
const S3: [&str; 1] = ["moto[server]==5.2.5"];

/// A third-party serving loop with no stallscope profile (tests/third_party.rs): LitServe, on
/// CPU, without torch.
const LITSERVE: [&str; 1] = ["litserve==0.2.19"];

/// A venv of `packages` at `<cache>/<name>`, rebuilt only when its recipe changes.
fn tool_venv(name: &str, packages: &[&str]) -> Result<()> {
    let dir = cache_dir().join(name);
    let base = pyenv_python("3.11").context("pyenv CPython 3.11 is missing")?;
    let recipe = format!("python {}\n{}\n", base.display(), packages.join(" "));
    if crate::vllm::is_current(&dir, &recipe) {
        return Ok(());
    }
    eprintln!("setup: building {} ({})", dir.display(), packages.join(" "));
    let uv = crate::vllm::uv(&base)?;
    let _ = std::fs::remove_dir_all(&dir);
    let uv_cmd = || {
        let mut c = Command::new(&uv);
        c.env("UV_CACHE_DIR", cache_dir().join("uv-cache"))
            .env("UV_PYTHON_DOWNLOADS", "never");
        c
    };
    crate::run_checked(
        uv_cmd()
            .args(["venv", "--quiet", "--python"])
            .arg(&base)
            .arg(&dir),
    )?;
    crate::run_checked(
        uv_cmd()
            .args(["pip", "install", "--quiet", "--python"])
            .arg(dir.join("bin/python"))
            .args(packages),
    )?;
    std::fs::write(crate::vllm::stamp(&dir), recipe)?;
    Ok(())
}
