//! Helpers shared by the end-to-end test files.
// Each test file uses a subset of these helpers.
#![allow(dead_code)]

use std::{path::PathBuf, process::Command};

/// The stallscope binary (`cargo xtask test` builds it and sets STALLSCOPE_BIN).
pub fn stallscope() -> Command {
    let bin = std::env::var_os("STALLSCOPE_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/stallscope")
        });
    assert!(
        bin.exists(),
        "{} is missing: run `cargo xtask test`",
        bin.display()
    );
    let mut c = Command::new(bin);
    c.env("RUST_LOG", "info");
    c
}

/// Fails the test unless it runs as root (eBPF and ptrace of any process need it).
pub fn require_root() {
    // SAFETY: no arguments.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "the end-to-end tests load eBPF programs and ptrace targets: run them as root"
    );
}

/// Runs `cmd`, asserts it failed, returns its stderr.
pub fn expect_failure(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(!out.status.success(), "{cmd:?} should have failed");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// `stallscope` run as nobody with no capabilities at all (setpriv), for the missing-privilege errors.
pub fn stallscope_unprivileged() -> Command {
    let mut c = Command::new("setpriv");
    c.args([
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--inh-caps=-all",
        "--bounding-set=-all",
    ])
    .arg(stallscope().get_program());
    c
}

/// The pyenv interpreter for `major.minor` (PYENV_ROOT or ~/.pyenv).
pub fn python(version: &str) -> PathBuf {
    let root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(std::env::var("HOME").unwrap()).join(".pyenv"));
    let dir = std::fs::read_dir(root.join("versions"))
        .expect("pyenv versions (cargo xtask setup checks them)")
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            name.starts_with(&format!("{version}.")) && !name[version.len() + 1..].contains('.')
        })
        .unwrap_or_else(|| panic!("CPython {version} is not installed in pyenv"));
    dir.join("bin/python3")
}
