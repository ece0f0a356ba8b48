//! Engines in pods, as a node DaemonSet sees them (the daemon in the host's PID namespace).
//!
//! The engine is the toy (tests/targets/py_engine.py) in a pod made of the kernel's own
//! parts: its own PID, mount, IPC and UTS namespaces, private tmpfs on /dev/shm and /tmp,
//! and a kubelet-shaped cgroup (`kubepods.slice/.../kubepods-burstable-pod<uid>.slice/
//! cri-containerd-<id>.scope`) on the cgroup v2 hierarchy. No kubelet can run here: the
//! node's pod list comes from a stand-in serving a v1 PodList over HTTP, as a kubelet's
//! read-only port does.

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::Ordering,
    time::Duration,
};

use serde_json::Value;

mod common;
use common::daemon::Daemon;
use common::kubelet::{pod_list, pods_section, series_of, stand_in_kubelet};
use common::{
    http_get, python, python_check, require_root, start_hog, toy_steps_between, Proc, TOY_HOG,
};
use perfetto_writer::read;
use sys_util::clock::monotonic_ns;

const NAMESPACE: &str = "serving";
const CONTAINER: &str = "engine";

/// The toy engine in a pod of its own, pinned to CPU 0; killed, and its cgroups removed, on
/// drop.
struct Pod {
    proc: Option<Proc>,
    /// The engine's pid in the host's PID namespace (in its own, it is 1).
    host_pid: u32,
    spec: sys_util::pod::Pod,
}

impl Pod {
    fn start(python_version: &str, name: &str, times: &Path) -> Pod {
        let spec = sys_util::pod::Pod::create(name).unwrap();
        let prefix = spec.prefix();
        // Beside the steps file, outside /tmp: the pod's private /tmp hides the host's, where
        // the checkout may be.
        let script = times.with_file_name("py_engine.py");
        std::fs::copy(
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("targets/py_engine.py"),
            &script,
        )
        .unwrap();
        let (proc, first, _) = Proc::spawn_ready(
            Command::new(&prefix[0])
                .args(&prefix[1..])
                .args(["taskset", "-c", "0"])
                .arg(python(python_version))
                .arg(script)
                .env("STALLSCOPE_TOY_TIMES", times),
            "ready ",
        );
        assert_eq!(first.trim(), "ready 1", "the engine is pid 1 in its pod");
        let procs = std::fs::read_to_string(spec.container_cgroup().join("cgroup.procs")).unwrap();
        let host_pid: u32 = procs
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("one process in the container's cgroup, not {procs:?}"));
        Pod {
            proc: Some(proc),
            host_pid,
            spec,
        }
    }

    /// The v1 PodList a kubelet on this node would answer.
    fn pod_list(&self) -> String {
        pod_list(NAMESPACE, &self.spec, CONTAINER)
    }

    /// Files of stallscope's in the pod's /dev/shm and /tmp, seen from the host.
    fn stallscope_files(&self) -> Vec<String> {
        ["dev/shm", "tmp"]
            .iter()
            .flat_map(|d| {
                std::fs::read_dir(format!("/proc/{}/root/{d}", self.host_pid))
                    .unwrap()
                    .flatten()
                    .map(|e| format!("/{d}/{}", e.file_name().to_string_lossy()))
                    .collect::<Vec<_>>()
            })
            .filter(|f| f.contains("stallscope"))
            .collect()
    }

    fn threads(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/task", self.host_pid))
            .unwrap()
            .count()
    }

    fn maps_mention_stallscope(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/maps", self.host_pid))
            .unwrap()
            .contains("stallscope")
    }
}

impl Drop for Pod {
    fn drop(&mut self) {
        drop(self.proc.take());
        self.spec.remove();
    }
}

fn counter(metrics: &str, pid: u32, name: &str) -> f64 {
    series_of(metrics, pid)
        .iter()
        .filter(|l| l.starts_with(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The daemon, in the host's PID namespace, follows an engine in a pod: every figure names
/// the pod, the iterations are the engine's own, an alert and its deep dive carry the pod,
/// and detaching leaves nothing in the pod's namespaces.
#[test]
fn a_daemonset_names_the_pod_of_every_figure_and_leaves_the_pod_clean() {
    require_root();
    for (python_version, name) in [("3.10", "toy-310"), ("3.13", "toy-313")] {
        // Outside /tmp: the pod has a private one.
        let dir = PathBuf::from(format!(
            "/var/tmp/stallscope-pods-{name}-{}",
            std::process::id()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let times = dir.join("toy-steps.txt");
        let pod = Pod::start(python_version, name, &times);
        let pid = pod.host_pid;
        let threads_before = pod.threads();
        let (kubelet, asked) = stand_in_kubelet(pod.pod_list());
        let mut d = Daemon::start_with_sections(&dir, pid, 300, &pods_section(kubelet));
        d.wait_for("discovered anchor", Duration::from_secs(30), |d| {
            d.engine()
                .is_some_and(|e| e["anchor"] == "__main__:Engine.step")
        });
        // The status names the pod, the container and the engine's pid in it.
        let e = d.engine().unwrap();
        let id = &e["identity"];
        for (field, want) in [
            ("namespace", NAMESPACE),
            ("pod", name),
            ("container", CONTAINER),
            ("pod_uid", pod.spec.uid.as_str()),
            ("container_id", pod.spec.container_id.as_str()),
            ("runtime", "containerd"),
        ] {
            assert_eq!(id[field], want, "{python_version}: {field} in {e}");
        }
        assert_eq!(id["pid_in_container"], 1, "{e}");
        assert!(asked.load(Ordering::SeqCst) >= 1, "the kubelet was asked");

        // Its iterations are the engine's own: the counter grows by the steps the toy timed
        // between two readings (a step cut by either reading counts on one side).
        let reading = || {
            let m = http_get(d.port, "/metrics");
            (
                counter(&m, pid, "stallscope_iterations_total"),
                monotonic_ns(),
            )
        };
        let (before, from_ns) = reading();
        std::thread::sleep(Duration::from_secs(3));
        let (after, to_ns) = reading();
        std::thread::sleep(Duration::from_secs(1));
        let own = toy_steps_between(&times, from_ns, to_ns) as f64;
        assert!(
            own > 100.0 && (after - before - own).abs() <= 2.0,
            "{python_version}: {} iterations counted, the toy timed {own}",
            after - before
        );

        // Every series of the engine carries the pod.
        d.wait_for("fitted model", Duration::from_secs(60), |d| {
            d.engine().is_some_and(|e| e["model_state"] == "fitted")
        });
        let metrics = http_get(d.port, "/metrics");
        let series = series_of(&metrics, pid);
        assert!(series.len() > 10, "{metrics}");
        for l in &series {
            for label in [
                format!("namespace=\"{NAMESPACE}\""),
                format!("pod=\"{name}\""),
                format!("container=\"{CONTAINER}\""),
                format!("pod_uid=\"{}\"", pod.spec.uid),
                format!("container_id=\"{}\"", pod.spec.container_id),
                "container_pid=\"1\"".to_string(),
            ] {
                assert!(l.contains(&label), "{label} missing from {l}");
            }
        }

        // A CPU hog on the pod's CPU: the alert, and its deep dive, name the pod.
        d.wait_for("normal reference", Duration::from_secs(30), |d| {
            !d.status()["normal_references"][pid.to_string()].is_null()
        });
        let hog = start_hog("0", TOY_HOG);
        d.wait_for("alert", Duration::from_secs(20), |d| {
            d.engine().is_some_and(|e| e["anomaly_active"] == true)
        });
        let alerts: Value = serde_json::from_str(&http_get(d.port, "/api/v1/alerts")).unwrap();
        assert_eq!(alerts[0]["identity"]["pod"], name, "{alerts}");
        assert_eq!(alerts[0]["identity"]["pod_uid"], pod.spec.uid.as_str());
        let dive = d.deep_dive_done();
        drop(hog);
        let trace = PathBuf::from(dive["trace"].as_str().unwrap());
        let decoded = read::decode(&std::fs::read(&trace).unwrap())
            .unwrap_or_else(|e| panic!("invalid trace:\n{e}"));
        python_check(&trace);
        let place = format!("[{NAMESPACE}/{name}/{CONTAINER}]");
        assert!(
            decoded
                .tracks
                .values()
                .any(|t| t.name.contains(&place) && t.name.contains("(pid 1 in its container)")),
            "no process track names the pod {place}: {:?}",
            decoded.tracks.values().map(|t| &t.name).collect::<Vec<_>>()
        );
        assert!(
            decoded
                .tracks
                .values()
                .any(|t| t.name.contains("(tid 1 in its container)")),
            "the engine's main thread is named with its id in the pod"
        );
        let marker = decoded
            .instants
            .iter()
            .find(|i| i.name == "engine identity")
            .expect("the trace's engine identity");
        assert_eq!(
            marker.args.get("pod_uid"),
            Some(&read::ArgValue::Str(pod.spec.uid.clone())),
            "{marker:?}"
        );
        let report: Value =
            serde_json::from_slice(&std::fs::read(dive["report"].as_str().unwrap()).unwrap())
                .unwrap();
        assert_eq!(report["identity"]["pod"], name, "{report}");

        // Detach: the probes, their ring and their files are gone from the pod; the engine
        // runs on.
        assert!(d.stop().success(), "{}", d.log());
        std::thread::sleep(Duration::from_millis(500));
        assert!(
            pod.stallscope_files().is_empty(),
            "{python_version}: left in the pod: {:?}",
            pod.stallscope_files()
        );
        assert!(
            !pod.maps_mention_stallscope(),
            "a mapping of stallscope's is left"
        );
        assert_eq!(pod.threads(), threads_before, "threads left in the engine");
        let steps = toy_steps_between(&times, to_ns, monotonic_ns());
        std::thread::sleep(Duration::from_secs(1));
        assert!(
            toy_steps_between(&times, to_ns, monotonic_ns()) > steps,
            "the engine runs on after the detach"
        );
        drop(pod);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A kubelet that does not answer leaves the ids from the cgroup, said once in the log.
#[test]
fn without_a_kubelet_the_ids_remain_and_it_is_said_once() {
    require_root();
    let dir = PathBuf::from(format!(
        "/var/tmp/stallscope-pods-nokubelet-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let pod = Pod::start("3.12", "toy-alone", &dir.join("toy-steps.txt"));
    // A port nobody listens on.
    let closed = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let d = Daemon::start_with_sections(&dir, pod.host_pid, 300, &pods_section(closed));
    d.wait_for("attached engine", Duration::from_secs(30), |d| {
        d.engine().is_some()
    });
    let id = d.engine().unwrap()["identity"].clone();
    assert_eq!(id["pod_uid"], pod.spec.uid.as_str(), "{id}");
    assert_eq!(id["container_id"], pod.spec.container_id.as_str(), "{id}");
    assert!(id["pod"].is_null() && id["namespace"].is_null(), "{id}");
    // Rescans go on (every 500 ms) without saying it again.
    std::thread::sleep(Duration::from_secs(3));
    let said = d.log().matches("pod names unavailable").count();
    assert_eq!(said, 1, "{}", d.log());
    let metrics = http_get(d.port, "/metrics");
    assert!(
        series_of(&metrics, pod.host_pid)
            .iter()
            .all(|l| l.contains(&format!("pod_uid=\"{}\"", pod.spec.uid)) && l.contains("pod=\"\"")),
        "{metrics}"
    );
    drop(d);
    drop(pod);
    let _ = std::fs::remove_dir_all(&dir);
}
