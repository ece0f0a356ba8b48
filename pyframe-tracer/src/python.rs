//! Finding the CPython runtime inside a target: which file holds it, its version, and the addresses the
//! injection needs.

use crate::error::{Error, Result};
use crate::maps::{self, Mapping};
use crate::memory::{ProcessMemory, RemoteMemory};
use crate::symbols;

/// A CPython runtime found in a target.
#[derive(Debug, Clone)]
pub struct PythonRuntime {
    /// The file that holds it (libpython or the python executable), as the target sees it.
    pub path: String,
    /// (major, minor, micro).
    pub version: (u32, u32, u32),
    /// `Py_AddPendingCall`.
    pub add_pending_call: u64,
    /// `PyRun_SimpleString` (3.10–3.13 export it as a function).
    pub run_simple_string: Option<u64>,
    /// `_PyRuntime` (start of `_Py_DebugOffsets` on 3.14+).
    pub py_runtime: Option<u64>,
}

/// How a request reaches the interpreter's main thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Delivery {
    /// `Py_AddPendingCall(PyRun_SimpleString, page)`, queued by a ptrace remote call.
    PendingCall,
    /// PEP 768's remote-debugger fields, written into the interpreter's memory.
    Pep768,
}

/// How the probe times the watched functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timing {
    /// Swap each function's `__code__` for a timing trampoline (a wrapper for closures).
    CodeSwap,
    /// `sys.monitoring` local events on the watched code objects only.
    Monitoring,
}

impl Timing {
    /// The probe's name for it (`probe.py`).
    pub fn name(self) -> &'static str {
        match self {
            Timing::CodeSwap => "code-swap",
            Timing::Monitoring => "sys.monitoring",
        }
    }
}

impl PythonRuntime {
    /// `"3.12.1"`.
    pub fn version_string(&self) -> String {
        format!("{}.{}.{}", self.version.0, self.version.1, self.version.2)
    }

    /// The one place the mechanisms are chosen by version: 3.10 and 3.11 take pending calls and
    /// code swaps; 3.12 and 3.13 pending calls and `sys.monitoring` (cheaper there, and what
    /// 3.12 made for tools); 3.14+ PEP 768 and `sys.monitoring`.
    pub fn mechanisms(&self) -> (Delivery, Timing) {
        match self.version {
            v if v >= (3, 14, 0) => (Delivery::Pep768, Timing::Monitoring),
            v if v >= (3, 12, 0) => (Delivery::PendingCall, Timing::Monitoring),
            _ => (Delivery::PendingCall, Timing::CodeSwap),
        }
    }

    /// How requests reach this runtime.
    pub fn delivery(&self) -> Delivery {
        self.mechanisms().0
    }
}

/// Finds the runtime of process `pid` and checks that its version is supported.
pub fn find(pid: i32) -> Result<PythonRuntime> {
    let mappings = maps::read(pid).map_err(|e| gone_or(pid, e, "reading its memory map"))?;
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .ok()
        .map(|p| p.to_string_lossy().into_owned());
    let candidate = |m: &Mapping| m.file_name().contains("python") || Some(&m.path) == exe.as_ref();
    let mut seen = Vec::new();
    // A candidate stallscope may not read (another user's process, without CAP_SYS_PTRACE)
    // is reported as such, not as "not Python".
    let mut denied = None;
    for m in mappings.iter().filter(|m| candidate(m)) {
        if seen.contains(&m.path) {
            continue;
        }
        seen.push(m.path.clone());
        let module = match symbols::load_module(pid, &mappings, |x| x.path == m.path) {
            Ok(Some(module)) => module,
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                denied.get_or_insert((m.path.clone(), e));
                continue;
            }
            _ => continue,
        };
        let Some(add_pending_call) = module.symbol("Py_AddPendingCall") else {
            continue;
        };
        let version =
            read_version(pid, module.symbol("Py_Version"), m.file_name()).ok_or_else(|| {
                Error::UnsupportedVersion {
                    pid,
                    version: "unknown (no Py_Version symbol and no version in the file name)"
                        .into(),
                }
            })?;
        let rt = PythonRuntime {
            path: m.path.clone(),
            version,
            add_pending_call,
            run_simple_string: module.symbol("PyRun_SimpleString"),
            py_runtime: module.symbol("_PyRuntime"),
        };
        if rt.version < (3, 10, 0) || rt.version.0 != 3 {
            return Err(Error::UnsupportedVersion {
                pid,
                version: rt.version_string(),
            });
        }
        if rt.delivery() == Delivery::PendingCall && rt.run_simple_string.is_none() {
            return Err(Error::MissingSymbol {
                pid,
                symbol: "PyRun_SimpleString".into(),
            });
        }
        if rt.delivery() == Delivery::Pep768 && rt.py_runtime.is_none() {
            return Err(Error::MissingSymbol {
                pid,
                symbol: "_PyRuntime".into(),
            });
        }
        return Ok(rt);
    }
    if let Some((path, e)) = denied {
        // /proc/PID/root is behind the ptrace access check; the file below it behind its
        // own permissions.
        if let Err(e) = std::fs::read_link(format!("/proc/{pid}/root")) {
            return Err(gone_or(pid, e, "reading its root directory"));
        }
        return Err(Error::io(
            format!(
                "reading {path}, the interpreter of process {pid}, is not permitted: stallscope needs CAP_DAC_READ_SEARCH to read the files of engines run by another user (or run it as root)"
            ),
            e,
        ));
    }
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .unwrap_or_default()
        .trim()
        .to_string();
    Err(Error::NotPython { pid, comm })
}

/// `Py_Version` (3.11+) holds PY_VERSION_HEX; otherwise the file name (`libpython3.10.so.1.0`, `python3.10`).
fn read_version(pid: i32, py_version: Option<u64>, file_name: &str) -> Option<(u32, u32, u32)> {
    if let Some(addr) = py_version {
        if let Ok(hex) = ProcessMemory::new(pid).read_u32(addr) {
            return Some((hex >> 24, (hex >> 16) & 0xff, (hex >> 8) & 0xff));
        }
    }
    version_from_name(file_name)
}

fn version_from_name(name: &str) -> Option<(u32, u32, u32)> {
    let rest = &name[name.find("python")? + "python".len()..];
    let mut it = rest
        .split(|c: char| !c.is_ascii_digit())
        .filter(|s| !s.is_empty());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor, 0))
}

/// Maps an I/O error on `/proc/PID/...` to "no such process" when the process is gone.
pub fn gone_or(pid: i32, e: std::io::Error, what: &str) -> Error {
    if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
        Error::NoSuchProcess(pid)
    } else if e.kind() == std::io::ErrorKind::PermissionDenied {
        Error::PtraceDenied {
            pid,
            reason: format!("{what}: {e}"),
        }
    } else {
        Error::io(format!("process {pid}: {what}"), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn version_from_file_names() {
        assert_eq!(version_from_name("libpython3.10.so.1.0"), Some((3, 10, 0)));
        assert_eq!(version_from_name("python3.13"), Some((3, 13, 0)));
        assert_eq!(version_from_name("python"), None);
    }
}
