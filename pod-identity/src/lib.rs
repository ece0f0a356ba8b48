//! Which pod and container a process belongs to.
//!
//! The container id and pod UID come from the process's cgroup ([`cgroup`]), the pod's
//! namespace and name and the container's name from the node's kubelet ([`kubelet`]), the
//! pid the process has inside its PID namespace from `/proc/PID/status`. All of it is
//! derived from the process and the node, so one engine process keeps one identity across
//! daemon restarts.

pub mod cgroup;
pub mod kubelet;

use std::{
    collections::{BTreeMap, HashMap},
    net::{SocketAddr, ToSocketAddrs},
    sync::{Arc, Condvar, Mutex},
    time::{Duration, Instant},
};

use log::{info, warn};
use serde::Serialize;

use kubelet::Directory;

/// A process's place in the cluster. Every field is empty for a process outside containers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Identity {
    /// The pod's namespace (from the kubelet).
    pub namespace: Option<String>,
    /// The pod's name (from the kubelet).
    pub pod: Option<String>,
    /// The pod's labels (from the kubelet).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub pod_labels: BTreeMap<String, String>,
    /// The container's name in the pod (from the kubelet).
    pub container: Option<String>,
    /// The pod's UID (from the cgroup, else from the kubelet).
    pub pod_uid: Option<String>,
    /// The container id (from the cgroup).
    pub container_id: Option<String>,
    /// The container runtime, when the cgroup names it.
    pub runtime: Option<&'static str>,
    /// The process's pid in its own PID namespace, when it is in a container or that
    /// namespace is not the daemon's.
    pub pid_in_container: Option<u32>,
}

impl Identity {
    /// `namespace/pod/container`, as much of it as is known; else the short container id.
    pub fn short(&self) -> Option<String> {
        match (&self.namespace, &self.pod) {
            (Some(ns), Some(pod)) => Some(match &self.container {
                Some(c) => format!("{ns}/{pod}/{c}"),
                None => format!("{ns}/{pod}"),
            }),
            _ => self
                .container_id
                .as_ref()
                .map(|id| format!("container {}", &id[..12.min(id.len())])),
        }
    }
}

/// Where pod and container names come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameSource {
    /// Ids only.
    None,
    /// A kubelet's pod list over plain HTTP (its read-only port), `http://HOST:PORT/pods`.
    Kubelet { url: String },
}

/// An error in the name source's settings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadUrl(pub String);

/// `http://HOST:PORT/PATH` split into host:port and path.
pub fn split_http_url(url: &str) -> Result<(String, String), BadUrl> {
    let Some((authority, path)) = sys_util::http::split_url(url) else {
        return Err(BadUrl(format!(
            "kubelet URL {url:?} is not http://HOST:PORT/PATH: only a kubelet's plain-HTTP read-only pod list (port 10255) is read; set [pods] kubelet_url to it, or names = \"none\" for ids only"
        )));
    };
    let path = if path.is_empty() { "/pods" } else { path };
    if !authority.contains(':') || authority.ends_with(':') {
        return Err(BadUrl(format!(
            "kubelet URL {url:?} has no port: write it as http://HOST:10255/pods"
        )));
    }
    Ok((authority.to_string(), path.to_string()))
}

/// How long a pod list is reused, and the least time between two fetches.
const REFRESH: Duration = Duration::from_secs(30);
const RETRY: Duration = Duration::from_secs(5);

/// What a lookup found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The identity, as complete as the node can tell.
    Ready(Identity),
    /// The process is in a pod the pod list does not show yet; a fetch is under way. Ask
    /// again shortly.
    Pending,
}

/// Identifies processes. The node's pod list is fetched on a thread of its own (never on the
/// caller's), every [`REFRESH`] and when a lookup misses, at most every [`RETRY`].
pub struct Resolver {
    source: NameSource,
    shared: Arc<(Mutex<Names>, Condvar)>,
}

#[derive(Default)]
struct Names {
    directory: Option<Directory>,
    /// Completed fetches (successful or not).
    fetches: u64,
    /// Whether the last fetch failed, and it was said.
    failing: bool,
    /// A lookup missed: fetch now (subject to RETRY).
    wanted: bool,
    /// The fetch count when each missing container was first looked up.
    missed: HashMap<String, u64>,
    stop: bool,
}

impl Resolver {
    /// A resolver asking `source`, each request bounded by `timeout`.
    pub fn new(source: NameSource, timeout: Duration) -> Self {
        let shared = Arc::new((Mutex::new(Names::default()), Condvar::new()));
        if let NameSource::Kubelet { url } = &source {
            let (url, shared) = (url.clone(), shared.clone());
            let _ = std::thread::Builder::new()
                .name("stallscope-pods".into())
                .spawn(move || fetch_loop(&url, timeout, &shared));
        }
        Self { source, shared }
    }

    /// The identity of `pid` (as this process's /proc sees it).
    pub fn lookup(&self, pid: u32) -> Lookup {
        let mut id = ids_of(pid);
        let Some(container_id) = &id.container_id else {
            return Lookup::Ready(id);
        };
        if self.source == NameSource::None {
            return Lookup::Ready(id);
        }
        let (lock, wake) = &*self.shared;
        let mut n = lock.lock().expect("pod names lock");
        let found = n
            .directory
            .as_ref()
            .and_then(|d| d.find(container_id, id.pod_uid.as_deref()))
            .cloned();
        match found {
            Some(names) => {
                n.missed.remove(container_id);
                id.pod_uid.get_or_insert(names.uid);
                id.namespace = Some(names.namespace);
                id.pod = Some(names.pod);
                id.container = names.container;
                id.pod_labels = names.labels;
            }
            None => {
                let fetches = n.fetches;
                let first = *n.missed.entry(container_id.clone()).or_insert(fetches);
                // Wait for a fetch that began after the first miss (the one under way then
                // may predate the pod), unless the kubelet does not answer: then the ids alone.
                if !(n.failing || fetches > first + 1) {
                    n.wanted = true;
                    wake.notify_all();
                    return Lookup::Pending;
                }
            }
        }
        Lookup::Ready(id)
    }
}

/// What `pid`'s cgroup and PID namespace tell of it, without names.
pub fn ids_of(pid: u32) -> Identity {
    let container = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .ok()
        .and_then(|t| cgroup::parse(&t));
    let mut id = Identity {
        // A daemon sharing the container's PID namespace (a sidecar) sees the same pid.
        pid_in_container: pid_in_namespace(pid).filter(|&p| p != pid || container.is_some()),
        ..Identity::default()
    };
    if let Some(c) = container {
        id.pod_uid = c.pod_uid;
        id.container_id = Some(c.container_id);
        id.runtime = c.runtime;
    }
    id
}

impl Resolver {
    /// `pid`'s identity, waiting up to `limit` for the pod list; the ids alone after that.
    pub fn wait(&self, pid: u32, limit: Duration) -> Identity {
        let t = Instant::now();
        loop {
            match self.lookup(pid) {
                Lookup::Ready(id) => return id,
                Lookup::Pending if t.elapsed() >= limit => return ids_of(pid),
                Lookup::Pending => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }

    /// The longest [`Resolver::wait`] needs for a pod the node lists: two pod-list fetches
    /// of at most `timeout` and the retry between them.
    pub fn patience(timeout: Duration) -> Duration {
        2 * timeout + RETRY + Duration::from_secs(1)
    }
}

impl Drop for Resolver {
    fn drop(&mut self) {
        let (lock, wake) = &*self.shared;
        lock.lock().expect("pod names lock").stop = true;
        wake.notify_all();
    }
}

fn fetch_loop(url: &str, timeout: Duration, shared: &(Mutex<Names>, Condvar)) {
    let (lock, wake) = shared;
    let mut last: Option<Instant> = None;
    loop {
        {
            let mut n = lock.lock().expect("pod names lock");
            loop {
                if n.stop {
                    return;
                }
                let since = last.map(|t| t.elapsed());
                let due = match since {
                    None => n.wanted,
                    Some(s) => s >= REFRESH || (n.wanted && s >= RETRY),
                };
                if due {
                    break;
                }
                let wait = match since {
                    None => REFRESH,
                    Some(s) if n.wanted => RETRY.saturating_sub(s),
                    Some(s) => REFRESH.saturating_sub(s),
                };
                n = wake.wait_timeout(n, wait).expect("pod names lock").0;
            }
            n.wanted = false;
        }
        last = Some(Instant::now());
        let fetched = fetch_pod_list(url, timeout);
        let mut n = lock.lock().expect("pod names lock");
        n.fetches += 1;
        match fetched {
            Ok(d) => {
                if n.failing {
                    info!("pod names: {url} answers again");
                }
                n.failing = false;
                n.directory = Some(d);
            }
            Err(why) => {
                if !n.failing {
                    warn!("pod names unavailable ({why}): engines are identified by pod UID and container id only until {url} answers");
                }
                n.failing = true;
            }
        }
    }
}

fn fetch_pod_list(url: &str, timeout: Duration) -> Result<Directory, String> {
    let (authority, path) = split_http_url(url).map_err(|e| e.0)?;
    let addr: SocketAddr = authority
        .to_socket_addrs()
        .map_err(|e| format!("resolving {authority}: {e}"))?
        .next()
        .ok_or_else(|| format!("{authority} resolves to no address"))?;
    let r = sys_util::http::request_to(addr, "GET", &path, "", "", timeout)
        .map_err(|e| format!("GET {url}: {e}"))?;
    if r.status != 200 {
        return Err(format!("GET {url}: HTTP {}", r.status));
    }
    Directory::from_pod_list(&r.body).map_err(|e| format!("GET {url}: not a PodList: {e}"))
}

/// The pid `pid` has in its innermost PID namespace (the last `NSpid` field).
pub fn pid_in_namespace(pid: u32) -> Option<u32> {
    last_nspid(&format!("/proc/{pid}/status"))
}

/// The id thread `tid` of `pid` has in its innermost PID namespace.
pub fn tid_in_namespace(pid: u32, tid: u32) -> Option<u32> {
    last_nspid(&format!("/proc/{pid}/task/{tid}/status"))
}

fn last_nspid(status_path: &str) -> Option<u32> {
    let status = std::fs::read_to_string(status_path).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("NSpid:"))?
        .split_whitespace()
        .last()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubelet_urls_are_checked() {
        for (url, ok) in [
            (
                "http://10.0.0.5:10255/pods",
                Some(("10.0.0.5:10255", "/pods")),
            ),
            ("http://node-a:10255", Some(("node-a:10255", "/pods"))),
            ("https://10.0.0.5:10250/pods", None),
            ("http://10.0.0.5/pods", None),
            ("10.0.0.5:10255", None),
        ] {
            let got = split_http_url(url).ok();
            let want = ok.map(|(a, p)| (a.to_string(), p.to_string()));
            assert_eq!(got, want, "{url}");
        }
    }

    #[test]
    fn a_host_process_has_no_identity() {
        let r = Resolver::new(NameSource::None, Duration::from_secs(1));
        let Lookup::Ready(id) = r.lookup(std::process::id()) else {
            panic!("a host process is never pending");
        };
        assert_eq!(id.pid_in_container, None);
        assert_eq!(id.short(), None);
    }
}
