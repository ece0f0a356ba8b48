//! Cross-checks every offset, kind and result code of this crate against NVIDIA's CUPTI
//! headers: downloads the `nvidia-cuda-cupti-cu12` (CUPTI 12.x) and `nvidia-cuda-cupti`
//! (13.x) wheels plus `nvidia-cuda-runtime-cu12` (for cuda.h) with pip into a cache outside
//! the checkout, compiles an `offsetof` probe against them and runs it. Nothing from the
//! headers is kept in the repository. Without pip, network or a C compiler it skips, saying so.

use std::{
    fmt::Write as _,
    path::{Path, PathBuf},
    process::Command,
};

use cupti_sys::{kind, record::encode::record_len, record::offset as o, result};

fn cache() -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("stallscope/cupti-headers")
}

/// Downloads and unpacks `package`; the directory holding `header` inside it.
fn fetch(package: &str, header: &str) -> Result<PathBuf, String> {
    let dir = cache().join(package);
    let find = || -> Option<PathBuf> {
        walk(&dir)
            .into_iter()
            .find_map(|p| (p.file_name()? == header).then(|| p.parent().map(Path::to_path_buf))?)
    };
    if let Some(found) = find() {
        return Ok(found);
    }
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let run = |c: &mut Command| -> Result<(), String> {
        let out = c.output().map_err(|e| format!("{c:?}: {e}"))?;
        out.status
            .success()
            .then_some(())
            .ok_or_else(|| format!("{c:?}: {}", String::from_utf8_lossy(&out.stderr).trim()))
    };
    run(Command::new("python3")
        .args(["-m", "pip", "download", "--no-deps", "--quiet", "-d"])
        .arg(&dir)
        .arg(package))?;
    for whl in walk(&dir)
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "whl"))
    {
        run(Command::new("python3")
            .args(["-m", "zipfile", "-e"])
            .arg(&whl)
            .arg(&dir))?;
    }
    find().ok_or_else(|| format!("{package} has no {header}"))
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push(p);
            }
        }
    }
    out
}

/// The probe: one CHECK per field this crate reads, for the record versions of one CUPTI
/// (and the multi-subscriber parameters where that CUPTI has them).
fn probe_source(kernel: &str, memcpy: &str, memset: &str, multi_subscriber: bool) -> String {
    let mut c = String::from(
        "#include <stdio.h>\n#include <stddef.h>\n#include <cupti_activity.h>\n#include <cupti_callbacks.h>\n#include <cupti_driver_cbid.h>\n#include <cupti_runtime_cbid.h>\n#include <cupti_version.h>\n\
         static int bad;\n\
         #define CHECK(T, f, want) do { size_t got = offsetof(T, f); if (got != (want)) { bad++; printf(\"%s.%s at %zu, crate says %d\\n\", #T, #f, got, (int)(want)); } } while (0)\n\
         #define VALUE(name, want) do { if ((long)(name) != (long)(want)) { bad++; printf(\"%s = %ld, crate says %ld\\n\", #name, (long)(name), (long)(want)); } } while (0)\n\
         int main(void) {\n",
    );
    let fields: Vec<(&str, &[(&str, usize)])> = vec![
        (
            kernel,
            &[
                ("registersPerThread", o::kernel::REGISTERS_PER_THREAD),
                ("start", o::kernel::START),
                ("end", o::kernel::END),
                ("deviceId", o::kernel::DEVICE_ID),
                ("contextId", o::kernel::CONTEXT_ID),
                ("streamId", o::kernel::STREAM_ID),
                ("gridX", o::kernel::GRID_X),
                ("gridY", o::kernel::GRID_X + 4),
                ("gridZ", o::kernel::GRID_X + 8),
                ("blockX", o::kernel::BLOCK_X),
                ("blockY", o::kernel::BLOCK_X + 4),
                ("blockZ", o::kernel::BLOCK_X + 8),
                ("staticSharedMemory", o::kernel::STATIC_SHARED_MEMORY),
                ("dynamicSharedMemory", o::kernel::DYNAMIC_SHARED_MEMORY),
                ("correlationId", o::kernel::CORRELATION_ID),
                ("name", o::kernel::NAME),
                ("graphNodeId", o::kernel::GRAPH_NODE_ID),
                ("graphId", o::kernel::GRAPH_ID),
            ],
        ),
        (
            memcpy,
            &[
                ("copyKind", o::memcpy::COPY_KIND),
                ("srcKind", o::memcpy::SRC_KIND),
                ("dstKind", o::memcpy::DST_KIND),
                ("bytes", o::memcpy::BYTES),
                ("start", o::memcpy::START),
                ("end", o::memcpy::END),
                ("deviceId", o::memcpy::DEVICE_ID),
                ("contextId", o::memcpy::CONTEXT_ID),
                ("streamId", o::memcpy::STREAM_ID),
                ("correlationId", o::memcpy::CORRELATION_ID),
            ],
        ),
        (
            memset,
            &[
                ("value", o::memset::VALUE),
                ("bytes", o::memset::BYTES),
                ("start", o::memset::START),
                ("end", o::memset::END),
                ("deviceId", o::memset::DEVICE_ID),
                ("contextId", o::memset::CONTEXT_ID),
                ("streamId", o::memset::STREAM_ID),
                ("correlationId", o::memset::CORRELATION_ID),
                ("memoryKind", o::memset::MEMORY_KIND),
            ],
        ),
        (
            "CUpti_ActivityAPI",
            &[
                ("cbid", o::api::CBID),
                ("start", o::api::START),
                ("end", o::api::END),
                ("processId", o::api::PROCESS_ID),
                ("threadId", o::api::THREAD_ID),
                ("correlationId", o::api::CORRELATION_ID),
                ("returnValue", o::api::RETURN_VALUE),
            ],
        ),
        (
            "CUpti_ActivitySynchronization2",
            &[
                ("type", o::synchronization::TYPE),
                ("start", o::synchronization::START),
                ("end", o::synchronization::END),
                ("correlationId", o::synchronization::CORRELATION_ID),
                ("contextId", o::synchronization::CONTEXT_ID),
                ("streamId", o::synchronization::STREAM_ID),
                ("cudaEventId", o::synchronization::CUDA_EVENT_ID),
            ],
        ),
        (
            "CUpti_ActivityExternalCorrelation",
            &[
                ("externalKind", o::external_correlation::EXTERNAL_KIND),
                ("externalId", o::external_correlation::EXTERNAL_ID),
                ("correlationId", o::external_correlation::CORRELATION_ID),
            ],
        ),
    ];
    for (ty, fs) in fields {
        let _ = writeln!(c, "CHECK({ty}, kind, 0);");
        for (f, want) in fs {
            let _ = writeln!(c, "CHECK({ty}, {f}, {want});");
        }
    }
    for (name, want) in [
        ("CUPTI_ACTIVITY_KIND_MEMCPY", kind::MEMCPY),
        ("CUPTI_ACTIVITY_KIND_MEMSET", kind::MEMSET),
        ("CUPTI_ACTIVITY_KIND_KERNEL", kind::KERNEL),
        ("CUPTI_ACTIVITY_KIND_DRIVER", kind::DRIVER),
        ("CUPTI_ACTIVITY_KIND_RUNTIME", kind::RUNTIME),
        (
            "CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL",
            kind::CONCURRENT_KERNEL,
        ),
        ("CUPTI_ACTIVITY_KIND_SYNCHRONIZATION", kind::SYNCHRONIZATION),
        (
            "CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION",
            kind::EXTERNAL_CORRELATION,
        ),
        ("CUPTI_ACTIVITY_FLAG_FLUSH_FORCED", cupti_sys::FLUSH_FORCED),
        ("CUPTI_SUCCESS", result::SUCCESS),
        ("CUPTI_ERROR_INVALID_PARAMETER", result::INVALID_PARAMETER),
        ("CUPTI_ERROR_MAX_LIMIT_REACHED", result::MAX_LIMIT_REACHED),
        ("CUPTI_ERROR_NOT_COMPATIBLE", result::NOT_COMPATIBLE),
        ("CUPTI_ERROR_NOT_INITIALIZED", result::NOT_INITIALIZED),
        (
            "CUPTI_ERROR_INSUFFICIENT_PRIVILEGES",
            result::INSUFFICIENT_PRIVILEGES,
        ),
        (
            "CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED",
            result::MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED,
        ),
        ("CUPTI_ERROR_UNKNOWN", result::UNKNOWN),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_HTOD", 1),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_DTOH", 2),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_DTOD", 8),
        ("CUPTI_ACTIVITY_MEMCPY_KIND_PTOP", 10),
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_EVENT_SYNCHRONIZE", 1),
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_WAIT_EVENT", 2),
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_STREAM_SYNCHRONIZE", 3),
        ("CUPTI_ACTIVITY_SYNCHRONIZATION_TYPE_CONTEXT_SYNCHRONIZE", 4),
    ] {
        let _ = writeln!(c, "VALUE({name}, {want});");
    }
    // Callback ids: the header's enumerator is the name with its version suffix.
    let runtime_suffix = |name: &str| match name {
        "cudaLaunchKernel" => "_v7000",
        "cudaGraphLaunch" | "cudaStreamIsCapturing" => "_v10000",
        "cudaLaunchKernelExC" => "_v11060",
        _ => "_v3020",
    };
    for (id, name) in cupti_sys::RUNTIME_API {
        let _ = writeln!(
            c,
            "VALUE(CUPTI_RUNTIME_TRACE_CBID_{name}{}, {id});",
            runtime_suffix(name)
        );
    }
    for (id, name) in cupti_sys::DRIVER_API {
        let _ = writeln!(c, "VALUE(CUPTI_DRIVER_TRACE_CBID_{name}, {id});");
    }
    for (ty, k) in [
        (kernel, kind::CONCURRENT_KERNEL),
        (memcpy, kind::MEMCPY),
        (memset, kind::MEMSET),
        ("CUpti_ActivityAPI", kind::RUNTIME),
        ("CUpti_ActivitySynchronization2", kind::SYNCHRONIZATION),
        (
            "CUpti_ActivityExternalCorrelation",
            kind::EXTERNAL_CORRELATION,
        ),
    ] {
        let _ = writeln!(
            c,
            "printf(\"sizeof {ty} %zu (stand-in writes {})\\n\", sizeof({ty}));",
            record_len(k)
        );
    }
    if multi_subscriber {
        use cupti_sys::subscription::{SubscriberParams, OLD_SUBSCRIBER_NAME_MIN_LEN};
        use std::mem::offset_of;
        for (f, want) in [
            ("structSize", offset_of!(SubscriberParams, struct_size)),
            (
                "subscriberName",
                offset_of!(SubscriberParams, subscriber_name),
            ),
            (
                "oldSubscriberName",
                offset_of!(SubscriberParams, old_subscriber_name),
            ),
            (
                "oldSubscriberSize",
                offset_of!(SubscriberParams, old_subscriber_size),
            ),
            (
                "allowMultipleSubscribers",
                offset_of!(SubscriberParams, allow_multiple_subscribers),
            ),
        ] {
            let _ = writeln!(c, "CHECK(CUpti_SubscriberParams, {f}, {want});");
        }
        let _ = writeln!(
            c,
            "VALUE(CUpti_SubscriberParams_STRUCT_SIZE, {});",
            std::mem::size_of::<SubscriberParams>()
        );
        let _ = writeln!(
            c,
            "VALUE(CUPTI_OLD_SUBSCRIBER_NAME_MIN_LEN, {OLD_SUBSCRIBER_NAME_MIN_LEN});"
        );
        let _ = writeln!(
            c,
            "VALUE(CUPTI_API_VERSION >= {}, 1);",
            cupti_sys::library::MULTI_SUBSCRIBER_SINCE
        );
    }
    c.push_str("printf(\"%d mismatches\\n\", bad);\nreturn bad != 0;\n}\n");
    c
}

#[test]
fn offsets_and_codes_match_the_cupti_headers() {
    let cuda_h = match fetch("nvidia-cuda-runtime-cu12", "cuda.h") {
        Ok(d) => d,
        Err(e) => {
            eprintln!("SKIPPED: cannot download the CUDA runtime headers ({e})");
            return;
        }
    };
    // cupti_callbacks.h includes builtin_types.h, whose device types the records never use;
    // the empty stand-in comes first on the include path.
    let shim = cache().join("shim");
    std::fs::create_dir_all(&shim).unwrap();
    std::fs::write(
        shim.join("builtin_types.h"),
        "/* empty: not needed for activity records */\n",
    )
    .unwrap();
    let versions = [
        (
            "nvidia-cuda-cupti-cu12",
            "CUpti_ActivityKernel9",
            "CUpti_ActivityMemcpy6",
            "CUpti_ActivityMemset4",
        ),
        (
            "nvidia-cuda-cupti",
            "CUpti_ActivityKernel13",
            "CUpti_ActivityMemcpy7",
            "CUpti_ActivityMemset5",
        ),
    ];
    for (package, kernel, memcpy, memset) in versions {
        let include = match fetch(package, "cupti_activity.h") {
            Ok(d) => d,
            Err(e) => {
                eprintln!("SKIPPED {package}: {e}");
                continue;
            }
        };
        let dir = cache().join(format!("probe-{package}"));
        std::fs::create_dir_all(&dir).unwrap();
        let src = dir.join("probe.c");
        let multi_subscriber = package == "nvidia-cuda-cupti";
        std::fs::write(&src, probe_source(kernel, memcpy, memset, multi_subscriber)).unwrap();
        let exe = dir.join("probe");
        let cc = Command::new("cc")
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .arg("-I")
            .arg(&shim)
            .arg("-I")
            .arg(&include)
            .arg("-I")
            .arg(&cuda_h)
            .output();
        let cc = match cc {
            Ok(out) => out,
            Err(e) => {
                eprintln!("SKIPPED: no C compiler ({e})");
                return;
            }
        };
        assert!(
            cc.status.success(),
            "the probe does not compile against {package}: {}",
            String::from_utf8_lossy(&cc.stderr)
        );
        let out = Command::new(&exe).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        eprintln!("{package}:\n{text}");
        assert!(
            out.status.success(),
            "{package} disagrees with cupti-sys:\n{text}"
        );
        if package == "nvidia-cuda-cupti" {
            // The stand-in writes records with CUPTI 13's sizes.
            for line in text.lines().filter(|l| l.starts_with("sizeof")) {
                let f: Vec<&str> = line.split_whitespace().collect();
                assert_eq!(f[2], f[5].trim_end_matches(')'), "{line}");
            }
        }
    }
}
