//! An attachment to one Python process: ring, probe, watched functions; drain records; detach.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use crate::error::{Error, Result};
use crate::inject::{self, QueueCost};
use crate::lease::LeaseKeeper;
use crate::procfs;
use crate::profiles::{Profile, Role};
use crate::python::{self, PythonRuntime};
use crate::remote_call;
use crate::ring::{Record, Ring};
use crate::watch_spec::WatchSpec;

/// The probe's source, shipped inside the binary.
const PROBE_SOURCE: &str = include_str!("probe.py");

/// Which framework profile to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Framework {
    /// Detect from the target's loaded modules (no profile if none matches).
    Auto,
    /// Apply this profile whatever is loaded.
    Named(String),
}

/// How to attach.
#[derive(Debug, Clone)]
pub struct AttachOptions {
    /// The user's watch specs (all required).
    pub specs: Vec<WatchSpec>,
    /// Framework profile selection.
    pub framework: Framework,
    /// Also watch the profile's deep-dive functions.
    pub deep_dive: bool,
    /// Ring lanes (threads with their own lane + 1 shared).
    pub lanes: usize,
    /// Records per lane.
    pub lane_capacity: usize,
    /// The probe removes itself when stallscope stops reading for this long.
    pub lease: Duration,
    /// How long the target may take to run a request.
    pub response_timeout: Duration,
    /// Thread borrowing limits.
    pub remote: remote_call::Options,
    /// The compiled writer offered to the probe ([`crate::native`]); None: the probe writes
    /// records in Python.
    pub native: Option<PathBuf>,
}

impl Default for AttachOptions {
    fn default() -> Self {
        Self {
            specs: Vec::new(),
            framework: Framework::Auto,
            deep_dive: false,
            lanes: 8,
            lane_capacity: 8192,
            lease: Duration::from_secs(30),
            response_timeout: Duration::from_secs(5),
            remote: remote_call::Options::default(),
            native: crate::native::library(),
        }
    }
}

/// A function the probe watches.
#[derive(Debug, Clone, Deserialize, Serialize)]
pub struct ProbeInfo {
    /// Record probe id.
    pub id: u32,
    /// The watch spec.
    pub spec: String,
    /// `code-swap`, `attr-wrap` or `sys.monitoring`.
    pub mechanism: String,
    /// Whether this attach installed it (false: it was already there).
    pub new: bool,
    /// Extracted field names, in record order.
    pub fields: Vec<String>,
    /// `anchor`, `phase`, `deep_dive` or `watch` (user spec).
    pub role: String,
}

impl ProbeInfo {
    /// The watched function, `module:qualname` (the spec without its field list).
    pub fn func(&self) -> &str {
        crate::watch_spec::func_of(&self.spec)
    }
}

#[derive(Debug, Deserialize)]
struct Response {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    warnings: Vec<String>,
    #[serde(default)]
    framework: Option<String>,
    #[serde(default)]
    probes: Vec<ProbeInfo>,
    #[serde(default)]
    errors: Vec<String>,
    /// Set when another session's probes hold the target (their lease is being renewed).
    #[serde(default)]
    busy: bool,
    /// When that lease runs out if no one renews it, ns from the probe's answer.
    #[serde(default)]
    retry_after_ns: u64,
    /// What writes the records: "native" or "python".
    #[serde(default)]
    writer: Option<String>,
    /// Why the compiled writer is not used, when it is not.
    #[serde(default)]
    writer_note: Option<String>,
}

/// One timed call, decoded.
#[derive(Debug, Clone, Serialize)]
pub struct Call {
    /// The function (`module:qualname`).
    pub func: String,
    /// Native thread id.
    pub tid: u64,
    /// CLOCK_MONOTONIC ns at entry.
    pub start_ns: u64,
    /// CLOCK_MONOTONIC ns at exit.
    pub end_ns: u64,
    /// Extracted fields that could be read.
    pub args: BTreeMap<String, i64>,
    /// Ended with an exception.
    pub exception: bool,
}

/// A live attachment.
pub struct Session {
    pid: i32,
    runtime: PythonRuntime,
    ring: Arc<Ring>,
    /// Renews the probe's lease while the session lives.
    lease: LeaseKeeper,
    ring_in_target: String,
    seq: u64,
    options: AttachOptions,
    /// Watched functions, by probe id.
    pub probes: Vec<ProbeInfo>,
    /// The profile applied, if any.
    pub framework: Option<String>,
    /// Optional profile functions that could not be watched.
    pub warnings: Vec<String>,
    /// Longest time a request of this session (the attach, so far) stopped a thread of the target.
    pub pause: Duration,
    /// What writes the records in the target: `native` (the compiled writer) or `python`.
    pub writer: String,
    /// Why the compiled writer is not used, when it is not.
    pub writer_note: Option<String>,
}

impl Session {
    /// Attaches to `pid`: finds its runtime, creates the ring, injects the probe and watches the functions.
    pub fn attach(pid: i32, options: AttachOptions) -> Result<Session> {
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            return Err(Error::NoSuchProcess(pid));
        }
        let runtime = python::find(pid)?;
        crate::reap::stale_of(pid);
        let (host_path, ring_in_target, nonce) = ring_location(pid)?;
        // The file goes once the attach request has returned (both sides have it mapped, or
        // the attach failed), and on every early return before that, through its directory
        // opened first (the path through /proc/PID/root dies with the target).
        let unlink = Unlink {
            dir: std::fs::File::open(host_path.parent().unwrap_or(std::path::Path::new("/")))
                .map_err(|e| Error::io(format!("opening {}", host_path.display()), e))?,
            name: host_path.file_name().unwrap_or_default(),
        };
        let ring = Ring::create(&host_path, options.lanes, options.lane_capacity)
            .map_err(|e| Error::io(format!("creating {}", host_path.display()), e))?;
        give_to_target(pid, &host_path)?;
        let ring = Arc::new(ring);
        // Kept from before the attach request: the target may take longer than a short lease
        // to run it, and the probe checks the lease from its first call.
        let lease = LeaseKeeper::start(ring.clone(), options.lease)
            .map_err(|e| Error::io("starting the lease thread", e))?;
        let mut session = Session {
            pid,
            runtime,
            ring,
            lease,
            ring_in_target,
            seq: 0,
            options,
            probes: Vec::new(),
            framework: None,
            warnings: Vec::new(),
            pause: Duration::ZERO,
            writer: String::new(),
            writer_note: None,
        };
        let offer =
            (session.options.native.clone()).and_then(|lib| crate::native::offer(pid, &lib, nonce));
        let result = session.attach_request(offer.as_ref().map(|o| o.inside.as_str()));
        drop(offer);
        drop(unlink);
        let resp = result?;
        session.writer = resp.writer.unwrap_or_else(|| "python".into());
        session.writer_note = resp.writer_note;
        session.framework = resp.framework;
        session.warnings = resp.warnings;
        session.probes = resp.probes;
        if session.probes.is_empty() {
            let why = if session.options.specs.is_empty() && session.framework.is_none() {
                "no framework profile matched the target's modules and no --watch was given: pass --watch MODULE:QUALNAME or --framework".to_string()
            } else {
                format!(
                    "none of the functions could be watched: {}",
                    session.warnings.join("; ")
                )
            };
            let _ = session.detach_request();
            return Err(Error::Probe(why));
        }
        Ok(session)
    }

    /// `native`: the compiled writer's path in the target (empty: it holds the module).
    fn attach_request(&mut self, native: Option<&str>) -> Result<Response> {
        let profiles = self.profiles_for_request()?;
        let specs: Vec<_> = self
            .options
            .specs
            .iter()
            .map(|s| spec_json(s, "watch"))
            .collect();
        let req = json!({
            "op": "attach",
            "ring": self.ring_in_target,
            "lease_ns": self.options.lease.as_nanos() as u64,
            "timing": self.runtime.mechanisms().1.name(),
            "specs": specs,
            "profiles": profiles,
            "native": native,
        });
        let resp = self.request(req)?;
        if resp.busy {
            return Err(Error::Watched {
                why: resp.error.unwrap_or_default(),
                retry_after: Duration::from_nanos(resp.retry_after_ns),
            });
        }
        if !resp.ok {
            return Err(Error::Probe(
                resp.error
                    .unwrap_or_else(|| "the probe refused the request".into()),
            ));
        }
        Ok(resp)
    }

    fn profiles_for_request(&self) -> Result<Vec<serde_json::Value>> {
        let mut roles = vec![Role::Anchor, Role::Phase];
        if self.options.deep_dive {
            roles.push(Role::DeepDive);
        }
        let (profiles, force): (Vec<Profile>, bool) = match &self.options.framework {
            Framework::Auto => (crate::profiles::builtin(), false),
            Framework::Named(name) => (vec![crate::profiles::by_name(name)?], true),
        };
        profiles
            .iter()
            .filter(|p| !p.watch.is_empty())
            .map(|p| {
                let specs: Vec<_> = p
                    .specs(&roles)?
                    .iter()
                    .map(|(s, r)| spec_json(s, role_name(*r)))
                    .collect();
                let detect = if force {
                    vec![String::from("sys")]
                } else {
                    p.detect_modules.clone()
                };
                Ok(json!({"name": p.name, "detect_modules": detect, "specs": specs}))
            })
            .collect()
    }

    /// Sends one request and waits for the probe's answer.
    fn request(&mut self, mut req: serde_json::Value) -> Result<Response> {
        self.seq += 1;
        let seq = self.seq;
        req["seq"] = json!(seq);
        let script = format!("/tmp/stallscope-{}-{}.py", self.pid, seq);
        if self.runtime.delivery() == crate::python::Delivery::Pep768 {
            req["script"] = json!(script);
        }
        let request = req.to_string();
        let build = |page: &str| bootstrap_line(&request, page);
        let (queued, QueueCost { pause }) =
            inject::queue(self.pid, &self.runtime, self.options.remote, &script, build)?;
        self.pause = self.pause.max(pause);
        let text = inject::wait(self.pid, &queued, self.options.response_timeout, || {
            self.ring.response(seq)
        })?;
        serde_json::from_str(&text)
            .map_err(|e| Error::Probe(format!("unreadable probe response {text:?}: {e}")))
    }

    /// Target pid.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The target's CPython.
    pub fn runtime(&self) -> &PythonRuntime {
        &self.runtime
    }

    /// Moves new records into `out` (the lease is renewed by a thread of its own, not here).
    pub fn drain(&self, out: &mut Vec<Record>) -> usize {
        self.ring.drain(out)
    }

    /// The ring's doorbell ([`Ring::doorbell`]): read it before [`Session::drain`], then wait
    /// for it to change.
    pub fn doorbell(&self) -> &std::sync::atomic::AtomicU32 {
        self.ring.doorbell()
    }

    /// Has the probe ring the doorbell after each call of `func` ends (None: after none).
    /// Returns whether a watch of that function exists.
    pub fn ring_after(&self, func: Option<&str>) -> bool {
        let probe = func.and_then(|f| self.probes.iter().find(|p| p.func() == f));
        self.ring.ring_on(probe.map(|p| p.id));
        probe.is_some() || func.is_none()
    }

    /// Records the probe could not write because the ring was full.
    pub fn lost_records(&self) -> u64 {
        self.ring.lost()
    }

    /// Drains that found a lane's write sequence below its read one (see [`Ring::resyncs`]).
    pub fn ring_resyncs(&self) -> u64 {
        self.ring.resyncs()
    }

    /// Whether the probe is still installed (it removes itself if its lease expires).
    pub fn probe_attached(&self) -> bool {
        self.ring.probe_state() == 1
    }

    /// Whether the probe removed itself: its lease ran out (this process stopped for longer
    /// than the lease) or something else detached it. Its records have stopped for good; a
    /// new attach puts it back.
    pub fn probe_removed(&self) -> bool {
        self.ring.probe_state() == 2
    }

    /// Decodes a record with this session's probe table.
    pub fn call(&self, r: &Record) -> Call {
        let probe = self.probes.iter().find(|p| p.id == r.probe);
        let func = probe.map_or_else(|| format!("probe#{}", r.probe), |p| p.func().to_string());
        let args = probe
            .map(|p| {
                p.fields
                    .iter()
                    .enumerate()
                    .filter_map(|(i, name)| r.field(i).map(|v| (name.clone(), v)))
                    .collect()
            })
            .unwrap_or_default();
        Call {
            func,
            tid: r.tid,
            start_ns: r.enter_ns,
            end_ns: r.exit_ns,
            args,
            exception: r.exception,
        }
    }

    /// Restores every watched function, frees the monitoring tool id and unmaps the ring in the target.
    /// Returns the longest time a thread of the target was stopped over the session, detach included.
    /// If the target cannot run the request (its main thread is blocked outside Python, as an idle engine
    /// waiting for work is), the probe's lease is expired instead: it removes itself at its next watched call.
    pub fn detach(mut self) -> Result<Duration> {
        let result = self.detach_request();
        drop(self.lease);
        match result {
            Ok(()) => Ok(self.pause),
            Err(e) => {
                self.ring.heartbeat(1);
                Err(e)
            }
        }
    }

    fn detach_request(&mut self) -> Result<()> {
        if self.probe_removed() {
            return Ok(()); // it already removed itself (lease expired)
        }
        let resp = self.request(json!({"op": "detach", "ring": self.ring_in_target}))?;
        if !resp.errors.is_empty() {
            return Err(Error::Probe(format!(
                "detach left something behind: {}",
                resp.errors.join("; ")
            )));
        }
        Ok(())
    }
}

/// The single line the interpreter runs: decode the probe source and run it with the request
/// and `page`, the `(address, size)` expression of the memory the line lives in.
fn bootstrap_line(request: &str, page: &str) -> String {
    format!(
        "exec(__import__('binascii').a2b_base64('{}'),{{'__name__':'_stallscope_probe','_REQUEST':__import__('binascii').a2b_base64('{}').decode(),'_PAGE':{page}}})",
        base64(PROBE_SOURCE.as_bytes()),
        base64(request.as_bytes())
    )
}

pub(crate) fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for chunk in data.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (b[0] as u32) << 16 | (b[1] as u32) << 8 | b[2] as u32;
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn spec_json(spec: &WatchSpec, role: &str) -> serde_json::Value {
    json!({"text": spec.text, "module": spec.module, "qualname": spec.qualname, "fields": spec.fields, "role": role})
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::Anchor => "anchor",
        Role::Phase => "phase",
        Role::DeepDive => "deep_dive",
    }
}

/// Where the ring file goes: the target's /dev/shm (else /tmp), through /proc/PID/root so it works across mount
/// namespaces. Returns (path for us, path for the target, the name's nonce).
fn ring_location(pid: i32) -> Result<(PathBuf, String, u64)> {
    let nonce = sys_util::clock::monotonic_ns() ^ (std::process::id() as u64) << 32;
    let root = format!("/proc/{pid}/root");
    for dir in crate::reap::RING_DIRS {
        if std::path::Path::new(&format!("{root}{dir}")).is_dir() {
            let inside = format!("{dir}/stallscope-ring-{pid}-{nonce:x}");
            return Ok((PathBuf::from(format!("{root}{inside}")), inside, nonce));
        }
    }
    Err(Error::Probe(format!(
        "process {pid} has neither /dev/shm nor /tmp for the shared-memory ring"
    )))
}

/// Removes file `name` of directory `dir` when dropped.
struct Unlink<'a> {
    dir: std::fs::File,
    name: &'a std::ffi::OsStr,
}

impl Drop for Unlink<'_> {
    fn drop(&mut self) {
        let _ = sys_util::lock::remove_at(&self.dir, self.name);
    }
}

/// Makes the ring file readable and writable by the target's user only.
fn give_to_target(pid: i32, path: &std::path::Path) -> Result<()> {
    let status = procfs::status(pid)?;
    let id = |key: &str| {
        procfs::status_field(&status, key)
            .and_then(|v| v.split_whitespace().nth(1))
            .and_then(|v| v.parse::<u32>().ok())
    };
    let (uid, gid) = (id("Uid"), id("Gid"));
    // Mode first: once the file is the target's, only its owner (or CAP_FOWNER) may change it.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| Error::io(format!("chmod {}", path.display()), e))?;
    let ours =
        std::fs::metadata(path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
    if uid == Some(ours.uid()) && gid == Some(ours.gid()) {
        return Ok(());
    }
    std::os::unix::fs::chown(path, uid, gid).map_err(|e| {
        let what = if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(
                "giving {} to the target's user (uid {}) needs CAP_CHOWN when stallscope runs as another user: grant it, or run stallscope as root",
                path.display(),
                uid.unwrap_or_default()
            )
        } else {
            format!("giving {} to the target's user", path.display())
        };
        Error::io(what, e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_matches_the_standard_alphabet() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"foobar\xff"), "Zm9vYmFy/w==");
    }

    #[test]
    fn the_bootstrap_is_one_line() {
        let line = bootstrap_line("{\"op\":\"detach\"}", "(0x0,0x0)");
        assert!(!line.contains('\n') && line.starts_with("exec("));
    }
}
