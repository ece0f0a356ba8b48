//! Builds the eBPF object (crate `probe-ebpf`) with the pinned nightly and embeds it.
//!
//! `cargo xtask setup` installs the nightly's `rust-src` and `bpf-linker` into
//! `$STALLSCOPE_CACHE` (default `~/.cache/stallscope`); this script puts that
//! bpf-linker on PATH so a plain `cargo build` works once setup has run.

use std::{env, path::PathBuf};

/// rustup name of the date-pinned nightly (nightly-2026-05-20) that `cargo xtask setup` links.
const EBPF_TOOLCHAIN: &str = "stallscope-ebpf";

fn main() -> anyhow::Result<()> {
    let cache = env::var_os("STALLSCOPE_CACHE")
        .map(PathBuf::from)
        .or_else(|| env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/stallscope")))
        .unwrap_or_else(|| PathBuf::from("/root/.cache/stallscope"));
    let linker_bin = cache.join("bpf-linker/bin");
    let path = env::var_os("PATH").unwrap_or_default();
    let mut dirs = vec![linker_bin];
    dirs.extend(env::split_paths(&path));
    // SAFETY: build scripts are single-threaded at this point.
    unsafe { env::set_var("PATH", env::join_paths(dirs)?) };
    println!("cargo:rerun-if-env-changed=STALLSCOPE_CACHE");

    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR")?);
    let ebpf_dir = manifest.join("../probe-ebpf");
    let ebpf_dir = ebpf_dir.to_str().expect("utf-8 path");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "probe-ebpf",
            root_dir: ebpf_dir,
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(EBPF_TOOLCHAIN),
    )?;
    println!("cargo:rerun-if-changed=../probe-common/src");
    Ok(())
}
