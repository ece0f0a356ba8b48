//! `cargo xtask image`: the daemon's container image (deploy/Containerfile), built offline
//! with buildah from a staged root filesystem: the release binary, the GPU agent builds
//! beside it, and the shared libraries the binary loads (as `ldd` lists them). With
//! `--check`, a container of it is started with crun and asked for its version and its
//! configuration.

use std::{
    fs,
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context, Result};

use crate::{root, run_checked, stallscope_bin};

/// buildah's storage: vfs works wherever the overlay driver cannot (containers, tmpfs).
const STORAGE: [&str; 2] = ["--storage-driver", "vfs"];

/// Stages target/image, builds the image `tag`, and with `check` starts it.
pub fn build(tag: &str, check: bool) -> Result<()> {
    let context = root().join("target/image");
    let rootfs = context.join("rootfs");
    let _ = fs::remove_dir_all(&context);
    let bin = stallscope_bin();
    let agent = bin.with_file_name("libstallscope_cupti_agent.so");
    let portable = bin.with_file_name("glibc-2.28/libstallscope_cupti_agent.so");
    let pyprobe = bin.with_file_name("glibc-2.28/libstallscope_pyprobe.so");
    for f in [&bin, &agent, &portable, &pyprobe] {
        if !f.exists() {
            bail!("{} is missing: run cargo xtask setup", f.display());
        }
    }
    let usr_bin = rootfs.join("usr/bin");
    fs::create_dir_all(usr_bin.join("glibc-2.28"))?;
    fs::copy(&bin, usr_bin.join("stallscope"))?;
    fs::copy(&agent, usr_bin.join("libstallscope_cupti_agent.so"))?;
    fs::copy(
        &portable,
        usr_bin.join("glibc-2.28/libstallscope_cupti_agent.so"),
    )?;
    fs::copy(
        &pyprobe,
        usr_bin.join("glibc-2.28/libstallscope_pyprobe.so"),
    )?;
    for lib in shared_libraries(&bin)? {
        let dest = rootfs.join(lib.strip_prefix("/")?);
        fs::create_dir_all(dest.parent().expect("a library has a directory"))?;
        fs::copy(&lib, &dest).with_context(|| format!("copying {}", lib.display()))?;
    }
    // The daemon's state and its temporary files (the lease directory).
    for dir in ["var/lib/stallscope", "tmp"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::set_permissions(rootfs.join("tmp"), fs::Permissions::from_mode(0o1777))?;
    fs::copy(
        root().join("deploy/Containerfile"),
        context.join("Containerfile"),
    )?;
    run_checked(
        Command::new("buildah")
            .args(STORAGE)
            .args([
                "bud",
                "--isolation",
                "chroot",
                "--pull=never",
                "--layers=false",
                "-t",
                tag,
            ])
            .arg(&context),
    )?;
    eprintln!("image: built {tag} from {}", context.display());
    if check {
        start(tag)?;
    }
    Ok(())
}

/// The shared libraries `bin` loads, with the dynamic loader, as absolute paths.
fn shared_libraries(bin: &Path) -> Result<Vec<PathBuf>> {
    let out = Command::new("ldd")
        .arg(bin)
        .output()
        .context("running ldd")?;
    if !out.status.success() {
        bail!("ldd {} failed", bin.display());
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
            let path = l.split("=>").last()?.split_whitespace().next()?;
            path.starts_with('/').then(|| PathBuf::from(path))
        })
        .collect())
}

/// Starts a container of `tag` (crun, an OCI runtime; where it cannot run, as on a host with
/// cgroups in hybrid mode, buildah's chroot isolation: the image's root filesystem in
/// namespaces of its own) and runs `--version`, then `run --check-config`, in it.
fn start(tag: &str) -> Result<()> {
    let out = Command::new("buildah")
        .args(STORAGE)
        .args(["from", "--pull=never", tag])
        .output()
        .context("running buildah from")?;
    if !out.status.success() {
        bail!(
            "buildah from {tag}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let container = String::from_utf8(out.stdout)?.trim().to_string();
    // crun refuses cgroup v1 controllers mounted beside the v2 hierarchy.
    let isolation = if sys_util::cgroup::hybrid() {
        "chroot"
    } else {
        "oci"
    };
    let run = |args: &[&str]| {
        run_checked(
            Command::new("buildah")
                .args(STORAGE)
                .args(["run", "--runtime", "crun", "--isolation", isolation])
                .args([container.as_str(), "--"])
                .args(args),
        )
    };
    let result = run(&["/usr/bin/stallscope", "--version"])
        .and_then(|()| run(&["/usr/bin/stallscope", "run", "--check-config"]));
    let _ = Command::new("buildah")
        .args(STORAGE)
        .args(["rm", &container])
        .output();
    result?;
    eprintln!(
        "image: {tag} started ({isolation} isolation): --version and run --check-config answered"
    );
    Ok(())
}
