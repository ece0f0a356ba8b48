//! Engines in pods, as a node DaemonSet sees them (the daemon in the host's PID namespace).
//!
//! The engine is the toy (tests/targets/py_engine.py) in a pod made of the kernel's own
//! parts: its own PID, mount, IPC and UTS namespaces, private tmpfs on /dev/shm and /tmp,
//! and a kubelet-shaped cgroup (`kubepods.slice/.../kubepods-burstable-pod<uid>.slice/
//! cri-containerd-<id>.scope`) on the cgroup v2 hierarchy. No kubelet can run here: the
//! node's pod list comes from a stand-in serving a v1 PodList over HTTP, as a kubelet's
//! read-only port does.

use std::{
    io::BufRead,
    net::TcpListener,
    path::{Path, PathBuf},
    process::Command,
    sync::atomic::Ordering,
    time::Duration,
};

use serde_json::Value;

mod common;
use common::daemon::Daemon;
use common::kubelet::{pod_list, pods_section, series_of, stand_in_kubelet, GROUP_LABEL};
use common::{
    daemon::config, expect_json, expect_success, free_port, http_get, python, python_check,
    require_root, stallscope, standin_library, start_hog, toy_step_walls_ms, toy_steps_between,
    Proc, TOY_HOG,
};
use perfetto_writer::read;
use sys_util::clock::monotonic_ns;

const NAMESPACE: &str = "serving";
const CONTAINER: &str = "engine";

/// A test target in a pod of its own, pinned to CPU 0; killed, and its cgroups removed, on
/// drop.
struct Pod {
    proc: Option<Proc>,
    /// The target's pid in the host's PID namespace (in its own, it is 1).
    host_pid: u32,
    spec: sys_util::pod::Pod,
}

impl Pod {
    /// The toy engine, timing its steps into `times`.
    fn toy(python_version: &str, name: &str, times: &Path) -> Pod {
        let times_env = times.to_str().unwrap();
        Pod::start(
            python_version,
            name,
            true,
            times.parent().unwrap(),
            "py_engine.py",
            &[],
            &[("STALLSCOPE_TOY_TIMES", times_env)],
        )
    }

    /// tests/targets/`script` run by CPython `python_version` with `args` and `env`. The
    /// script is copied into `dir`, outside /tmp: the pod's private /tmp hides the host's,
    /// where the checkout may be. Its first line says it is ready (and, if it says a pid,
    /// that it is 1); the rest of its output is read and dropped. With `cpu_controller` the
    /// pod is in the v1 `cpu` hierarchy too, where the host has one (see
    /// `sys_util::pod::Pod::create`).
    fn start(
        python_version: &str,
        name: &str,
        cpu_controller: bool,
        dir: &Path,
        script: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Pod {
        let spec = sys_util::pod::Pod::create(name, cpu_controller).unwrap();
        let prefix = spec.prefix();
        let copy = dir.join(script);
        std::fs::copy(
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("targets")
                .join(script),
            &copy,
        )
        .unwrap();
        let (proc, first, rest) = Proc::spawn_ready(
            Command::new(&prefix[0])
                .args(&prefix[1..])
                .args(["taskset", "-c", "0"])
                .arg(python(python_version))
                .arg(copy)
                .args(args)
                .envs(env.iter().copied()),
            "ready",
        );
        assert!(
            matches!(first.split_whitespace().nth(1), None | Some("1")),
            "the target is pid 1 in its pod: {first}"
        );
        std::thread::spawn(move || rest.lines().for_each(drop));
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

    /// Whether a file of stallscope's (its ring, GPU channel or agent) is mapped in the
    /// target, the probe's compiled writer aside (it stays loaded).
    fn maps_mention_stallscope(&self) -> bool {
        !common::stallscope_mappings(self.host_pid).is_empty()
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

/// Where the daemon runs, as Kubernetes would run it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placement {
    /// A node DaemonSet: in the host's PID namespace (`hostPID`), given the engine's pid.
    DaemonSet,
    /// A sidecar in the engine's pod: in the pod's PID namespace (`shareProcessNamespace`,
    /// no `hostPID`), in a container cgroup of its own with a cgroup namespace rooted there
    /// (the pod's cgroup is hidden from it), and a mount namespace whose /proc is the pod's. It
    /// finds the engine by its command line.
    Sidecar,
}

/// The cgroup of a sidecar container in `pod`, removed on drop (after its process).
struct SidecarCgroup(PathBuf);

impl SidecarCgroup {
    fn create(pod: &Pod) -> SidecarCgroup {
        let dir = pod.spec.container_cgroup().with_file_name(format!(
            "cri-containerd-{}.scope",
            "51dec4".repeat(11).get(..64).unwrap()
        ));
        std::fs::create_dir(&dir).unwrap();
        SidecarCgroup(dir)
    }

    /// The programs that run what follows them as the sidecar (see [`Placement::Sidecar`]).
    /// nsenter forks into the PID namespace; the rest exec.
    fn prefix(&self, pod: &Pod) -> Vec<String> {
        let inside = format!(
            "echo $$ > {} && exec unshare --cgroup --mount --propagation private -- sh -c 'mount -t proc proc /proc && exec \"$@\"' sh \"$@\"",
            self.0.join("cgroup.procs").display()
        );
        let target = pod.host_pid.to_string();
        [
            "nsenter", "--target", &target, "--pid", "--", "sh", "-c", &inside, "sh",
        ]
        .map(str::to_string)
        .to_vec()
    }
}

impl Drop for SidecarCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// The daemon, in the host's PID namespace, follows an engine in a pod: every figure names
/// the pod, the iterations are the engine's own, an alert and its deep dive carry the pod,
/// and detaching leaves nothing in the pod's namespaces.
#[test]
fn a_daemonset_names_the_pod_of_every_figure_and_leaves_the_pod_clean() {
    require_root();
    for (python_version, name) in [("3.10", "toy-310"), ("3.13", "toy-313")] {
        follows_an_engine_in_a_pod(Placement::DaemonSet, python_version, name);
    }
}

/// The same from a sidecar in the engine's pod, which sees the pod's ids only: the kernel
/// plane learns the kernel's ids of the engine's threads, and reports them by the pod's.
#[test]
fn a_sidecar_finds_the_engine_in_its_pod_and_follows_it_by_the_pods_ids() {
    require_root();
    for (python_version, name) in [("3.10", "side-310"), ("3.13", "side-313")] {
        follows_an_engine_in_a_pod(Placement::Sidecar, python_version, name);
    }
}

fn follows_an_engine_in_a_pod(placement: Placement, python_version: &str, name: &str) {
    {
        let dir = var_tmp_dir(&format!("pods-{name}"));
        let times = dir.join("toy-steps.txt");
        let pod = Pod::toy(python_version, name, &times);
        let threads_before = pod.threads();
        let (kubelet, asked) = stand_in_kubelet(pod.pod_list());
        let sidecar = (placement == Placement::Sidecar).then(|| SidecarCgroup::create(&pod));
        // The engine's pid as the daemon sees it.
        let pid = match placement {
            Placement::DaemonSet => pod.host_pid,
            Placement::Sidecar => 1,
        };
        let port = free_port();
        let mut cfg = std::fs::read_to_string(config(&dir, pid, port, 300)).unwrap()
            + &pods_section(kubelet)
            + &format!("\n[fleet]\ngroup_pod_label = \"{GROUP_LABEL}\"\nnode = \"node-a\"\n");
        if placement == Placement::Sidecar {
            cfg = cfg
                .replace(
                    &format!("pids = [{pid}]\nprocess_patterns = []"),
                    "pids = []\nprocess_patterns = [\"py_engine.py\"]",
                )
                .replace(
                    "engine_patterns = []",
                    "engine_patterns = [\"py_engine.py\"]",
                );
        }
        std::fs::write(dir.join("config.toml"), cfg).unwrap();
        let prefix = sidecar.as_ref().map_or(Vec::new(), |s| s.prefix(&pod));
        let mut d = Daemon::start_in(&dir, port, dir.join("config.toml"), &prefix);
        d.wait_for("discovered anchor", Duration::from_secs(30), |d| {
            d.engine()
                .is_some_and(|e| e["anchor"] == "__main__:Engine.step")
        });
        // The status names the pod, the container and the engine's pid in it.
        let e = d.engine().unwrap();
        assert_eq!(e["pid"], pid, "{e}");
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
        // The pod's label makes the engine a member of its serving group.
        let group = format!("{name}-group");
        assert_eq!(id["pod_labels"][GROUP_LABEL], group.as_str(), "{e}");
        let info =
            format!("stallscope_fleet_group_info{{node=\"node-a\",serving_group=\"{group}\"}} 1");
        d.wait_for("the group in the metrics", Duration::from_secs(10), |d| {
            http_get(d.port, "/metrics").lines().any(|l| l == info)
        });
        assert!(asked.load(Ordering::SeqCst) >= 1, "the kubelet was asked");

        // Its iterations are the engine's own: the counter grows by the steps the toy timed
        // between two readings (a step cut by either reading counts on one side). Its main
        // thread's CPU time, from the kernel plane, grows with them, but not past the wall.
        let reading = || {
            let m = http_get(d.port, "/metrics");
            (
                counter(&m, pid, "stallscope_iterations_total"),
                thread_seconds(&m, pid, pid, "on_cpu"),
                monotonic_ns(),
            )
        };
        let (before, cpu_before, from_ns) = reading();
        std::thread::sleep(Duration::from_secs(3));
        let (after, cpu_after, to_ns) = reading();
        std::thread::sleep(Duration::from_secs(1));
        let own = toy_steps_between(&times, from_ns, to_ns) as f64;
        assert!(
            own > 100.0 && (after - before - own).abs() <= 2.0,
            "{python_version}: {} iterations counted, the toy timed {own}",
            after - before
        );
        let wall = (to_ns - from_ns) as f64 / 1e9;
        let on_cpu = cpu_after - cpu_before;
        assert!(
            on_cpu > 0.1 * wall && on_cpu <= wall * 1.05,
            "{python_version}: the main thread (tid {pid}) was on a CPU {on_cpu:.3} s of {wall:.3} s:\n{}",
            http_get(d.port, "/metrics")
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
        // The engine's main thread by the daemon's id, which a DaemonSet gives with the pod's;
        // its scheduler states come from the kernel plane's events.
        let main = decoded
            .tracks
            .values()
            .find(|t| t.kind == (read::TrackKind::Thread { pid, tid: pid }))
            .unwrap_or_else(|| panic!("no track of the engine's main thread {pid}"));
        if placement == Placement::DaemonSet {
            assert!(
                main.name.contains("(tid 1 in its container)"),
                "the engine's main thread is named with its id in the pod: {}",
                main.name
            );
        }
        assert!(
            decoded
                .tracks
                .values()
                .any(|t| t.parent == Some(main.uuid) && t.name.ends_with(&format!(" {pid} state"))),
            "no scheduler states of the main thread {pid}: {:?}",
            decoded.tracks.values().map(|t| &t.name).collect::<Vec<_>>()
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
        drop(sidecar);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A thread's `stallscope_thread_seconds_total` in `state`, seconds.
fn thread_seconds(metrics: &str, pid: u32, tid: u32, state: &str) -> f64 {
    let (tid, state) = (format!("tid=\"{tid}\""), format!("state=\"{state}\""));
    series_of(metrics, pid)
        .iter()
        .filter(|l| l.starts_with("stallscope_thread_seconds_total"))
        .filter(|l| l.contains(&tid) && l.contains(&state))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A kubelet that does not answer leaves the ids from the cgroup, said once in the log.
#[test]
fn without_a_kubelet_the_ids_remain_and_it_is_said_once() {
    require_root();
    let dir = var_tmp_dir("pods-nokubelet");
    let pod = Pod::toy("3.12", "toy-alone", &dir.join("toy-steps.txt"));
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

/// The GPU plane reaches an engine in a pod: its agent is copied into the pod's own /tmp
/// (through /proc/PID/root), loaded there, and gone afterwards. The engine is the stand-in
/// GPU loop (no GPU here), its libcupti copied beside it.
#[test]
fn the_gpu_plane_reaches_an_engine_in_a_pod() {
    require_root();
    let dir = var_tmp_dir("pods-gpu");
    let standin = standin_library();
    let lib = dir.join("libcupti.so.13");
    std::fs::copy(&standin, &lib).unwrap();
    let pod = Pod::start(
        "3.12",
        "gpu-0",
        false,
        &dir,
        "gpu_loop.py",
        &[lib.to_str().unwrap()],
        &[],
    );
    let out = expect_success(stallscope().env("STALLSCOPE_GPU_STANDIN", "1").args([
        "gpu",
        "--pid",
        &pod.host_pid.to_string(),
        "--duration",
        "2s",
        "--json",
    ]));
    let r: Value = serde_json::from_slice(&out).unwrap();
    assert!(r["summary"]["kernels"].as_u64().unwrap() > 200, "{r}");
    assert_eq!(r["agent_unloaded"], true, "{r}");
    assert!(
        pod.stallscope_files().is_empty(),
        "left in the pod: {:?}",
        pod.stallscope_files()
    );
    assert!(!pod.maps_mention_stallscope(), "the agent is still mapped");
    drop(pod);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A hang dump and the Python injectors reach an engine in a pod.
#[test]
fn dumps_and_python_injectors_reach_an_engine_in_a_pod() {
    require_root();
    let dir = var_tmp_dir("pods-inject");
    let times = dir.join("toy-steps.txt");
    let pod = Pod::toy("3.12", "toy-inject", &times);
    let pid = pod.host_pid.to_string();
    // The engine's own frames, wherever the sample finds it (in a step, or in the sleep
    // between two).
    let stacks = expect_json(stallscope().args(["dump", "--pid", &pid, "--json"]));
    let frames = stacks.to_string();
    assert!(
        frames.contains("py_engine.py") && frames.contains("\"func\":\"main\""),
        "the engine's stack is dumped: {stacks}"
    );
    // A synchronous stall injected into the engine's step (a 10 ms sleep before each call at
    // 0.5) stretches every step by the toy's own clock while it is in, and no step after.
    let walls_over = |d: Duration| {
        let (from, to) = toy_window(d);
        toy_step_walls_ms(&times, from, to)
    };
    let mut stall = Proc::spawn(stallscope().args([
        "inject",
        "python-sync-stall",
        "--pid",
        &pid,
        "--intensity",
        "0.5",
        "--duration",
        "4s",
        "--function",
        "__main__:Engine.step",
    ]));
    std::thread::sleep(Duration::from_millis(1000));
    let stalled = walls_over(Duration::from_secs(2));
    assert!(
        stall.child().wait().unwrap().success(),
        "the injector failed"
    );
    std::thread::sleep(Duration::from_millis(500));
    let mut after = walls_over(Duration::from_secs(2));
    assert!(
        !stalled.is_empty() && stalled.iter().all(|&ms| ms >= 10.0),
        "steps under the stall (ms): {stalled:?}"
    );
    after.sort_by(f64::total_cmp);
    assert!(
        !after.is_empty() && after[after.len() / 2] < 10.0,
        "steps after the stall (ms): {after:?}"
    );
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        pod.stallscope_files().is_empty(),
        "{:?}",
        pod.stallscope_files()
    );
    drop(pod);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The CPU-quota injector throttles an engine in a pod in its own container cgroup (as its
/// pod's limit would, without moving it out of its pod) and puts the quota back.
#[test]
fn the_cpu_quota_injector_throttles_a_pod_engine_in_its_own_cgroup() {
    require_root();
    let dir = var_tmp_dir("pods-quota");
    let times = dir.join("toy-steps.txt");
    let pod = Pod::toy("3.12", "toy-quota", &times);
    let pid = pod.host_pid;
    let cgroup = || std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let before = cgroup();
    // The container's cgroup holding the quota: v1's `cpu` where a hybrid host has it.
    let quota_file = pod
        .spec
        .container_cgroups()
        .map(|c| (c.join("cpu.cfs_quota_us"), c.join("cpu.max")))
        .find_map(|(v1, v2)| [v1, v2].into_iter().find(|f| f.exists()))
        .expect("the container's cgroup has a CPU quota file");
    let quota_before = std::fs::read_to_string(&quota_file).unwrap();
    // v1 keeps the period apart; v2's cpu.max holds both.
    let period_file = quota_file.with_file_name("cpu.cfs_period_us");
    let period_before = std::fs::read_to_string(&period_file).ok();
    let steps_in = |d: Duration| {
        let (from, to) = toy_window(d);
        toy_steps_between(&times, from, to)
    };
    let calm = steps_in(Duration::from_secs(2));
    let mut inject = Proc::spawn(stallscope().args([
        "inject",
        "cpu-frequency",
        "--pid",
        &pid.to_string(),
        "--intensity",
        "0.9",
        "--duration",
        "4s",
        // A quarter of it, 5 ms, becomes the quota's period (the pod's is 100 ms).
        "--engine-step",
        "20ms",
    ]));
    std::thread::sleep(Duration::from_millis(500));
    let quota_during = std::fs::read_to_string(&quota_file).unwrap();
    let period_during = std::fs::read_to_string(&period_file).ok();
    let cgroup_during = cgroup();
    let throttled = steps_in(Duration::from_secs(2));
    assert!(
        inject.child().wait().unwrap().success(),
        "the injector failed"
    );
    assert_ne!(
        quota_during,
        quota_before,
        "no quota set in {}",
        quota_file.display()
    );
    assert_eq!(
        cgroup_during, before,
        "the engine left its container's cgroup"
    );
    assert!(
        (throttled as f64) < 0.5 * calm as f64,
        "steps in 2 s: {calm} free, {throttled} throttled"
    );
    assert_eq!(
        std::fs::read_to_string(&quota_file).unwrap(),
        quota_before,
        "the quota is put back"
    );
    // 5 ms, lengthened on one CPU only (0.1 CPUs of 5 ms is under the smallest quota, 1 ms).
    let short = |us: &str| us.trim().parse::<u64>().is_ok_and(|us| us <= 10_000);
    if let Some(before) = period_before {
        assert!(
            period_during.as_deref().is_some_and(short),
            "{period_during:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&period_file).unwrap(),
            before,
            "the period is put back"
        );
    } else {
        assert!(
            quota_during.split_whitespace().nth(1).is_some_and(short),
            "{quota_during}"
        );
    }
    assert_eq!(cgroup(), before);
    drop(pod);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A window of `d` from now (CLOCK_MONOTONIC ns), returned once the toy has flushed the steps
/// that ended in it (it flushes its file every 50 steps).
fn toy_window(d: Duration) -> (u64, u64) {
    let from = monotonic_ns();
    std::thread::sleep(d);
    let to = monotonic_ns();
    std::thread::sleep(Duration::from_millis(800));
    (from, to)
}

/// A scratch directory outside /tmp (the pods' private /tmp hides the host's).
fn var_tmp_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(format!("/var/tmp/stallscope-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
