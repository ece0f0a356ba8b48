//! The daemon (`stallscope run`) as the tests start it: configured for the toy engine (or
//! any generic one), its log in the test's directory, its HTTP API at hand.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus},
    time::{Duration, Instant},
};

use serde_json::Value;

use super::{free_port, stallscope};

/// The daemon, configured for a generic engine, with its log in `dir/daemon.log`.
pub struct Daemon {
    child: Option<Child>,
    pub port: u16,
    /// Where its HTTP API listens (loopback, or its network namespace's address).
    pub host: IpAddr,
    dir: PathBuf,
}

pub fn config(dir: &Path, pid: u32, port: u16, warmup: usize) -> PathBuf {
    config_on(dir, pid, &format!("127.0.0.1:{port}"), warmup, "")
}

/// The configuration with the HTTP listener on `listen` and a deep-dive token.
pub fn config_on(dir: &Path, pid: u32, listen: &str, warmup: usize, token: &str) -> PathBuf {
    let text = format!(
        r#"
[watch]
pids = [{pid}]
process_patterns = []
rescan_interval = "500ms"

[report]
interval = "1s"

[sentinel]
engine_patterns = []
framework = "generic"
watch = ["__main__:Engine.step[batch=len(batch.reqs);context_tokens=batch.context]", "__main__:Engine.housekeeping"]
poll_interval = "1ms"
theta_max = 0.5
# This host's CPU 0 slows the toy engine by 30-50 % for seconds at a time with nothing injected
# (per-request step time swinging between 1.0 and 1.5 ms from one second to the next); the hog
# stretches one step in every six or seven by its 40 ms spin (E of that step 10-60).
theta_min = 0.4
k_sigma = 3.0
window = 10
# The toy's steps last about 3 ms, vLLM's about 25: 40 of them hold an alert back for about as
# long as the default 5 do on vLLM (a blip of 14 toy steps, 50 ms, alerted with 5 here).
start_after = 40
warmup_samples = {warmup}
refit_every = 0
max_training_samples = 20000
alert_on_prefill = false

[deep_dive]
on_alert = true
duration = "3s"
cooldown = "60s"
max_per_hour = 6
reference_every = "1h"
reference_duration = "2s"
reference_settle = "1s"
dir = "{dir}/deep-dives"
token = "{token}"

[http]
listen = "{listen}"

[state]
dir = "{dir}"
alerts_log = ""
iterations_csv = "{dir}/iterations.csv"
"#,
        dir = dir.display()
    );
    let path = dir.join("config.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The shipped default configuration (`probe-user/config/default.toml`), its HTTP API on
/// loopback `port`, its state and iteration export (`iterations.csv`) in `dir`, with `edits`
/// (a line of the default, its replacement) too; written to `dir/config.toml`.
pub fn default_config(dir: &Path, port: u16, edits: &[(&str, &str)]) -> PathBuf {
    let mut cfg = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../probe-user/config/default.toml"),
    )
    .unwrap();
    let ours = [
        (
            "listen = \"127.0.0.1:9464\"".to_string(),
            format!("listen = \"127.0.0.1:{port}\""),
        ),
        (
            "dir = \"/var/lib/stallscope\"".to_string(),
            format!("dir = \"{}\"", dir.display()),
        ),
        (
            "iterations_csv = \"\"".to_string(),
            format!(
                "iterations_csv = \"{}\"",
                dir.join("iterations.csv").display()
            ),
        ),
    ];
    let edits = edits.iter().map(|(a, b)| (a.to_string(), b.to_string()));
    for (from, to) in ours.into_iter().chain(edits) {
        assert!(cfg.contains(&from), "the default config changed: {from}");
        cfg = cfg.replace(&from, &to);
    }
    let path = dir.join("config.toml");
    std::fs::write(&path, cfg).unwrap();
    path
}

impl Daemon {
    pub fn start(dir: &Path, pid: u32, warmup: usize) -> Daemon {
        let port = free_port();
        Daemon::start_with(dir, port, config(dir, pid, port, warmup))
    }

    pub fn start_with(dir: &Path, port: u16, cfg: PathBuf) -> Daemon {
        Daemon::start_in(dir, port, cfg, &[])
    }

    /// The daemon run by the programs of `prefix` (e.g. to enter namespaces), each of which
    /// runs the next or execs it, the daemon last.
    pub fn start_in(dir: &Path, port: u16, cfg: PathBuf, prefix: &[String]) -> Daemon {
        Daemon::start_at(dir, (Ipv4Addr::LOCALHOST.into(), port), cfg, prefix)
    }

    /// As [`Daemon::start_in`], its HTTP API at `host:port`.
    pub fn start_at(
        dir: &Path,
        (host, port): (IpAddr, u16),
        cfg: PathBuf,
        prefix: &[String],
    ) -> Daemon {
        let log = std::fs::File::create(dir.join("daemon.log")).unwrap();
        let daemon = stallscope();
        let mut command = match prefix {
            [] => stallscope(),
            [program, args @ ..] => {
                let mut c = Command::new(program);
                c.args(args).arg(daemon.get_program());
                for (k, v) in daemon.get_envs() {
                    if let Some(v) = v {
                        c.env(k, v);
                    }
                }
                c
            }
        };
        let child = command
            .arg("run")
            .arg("--config")
            .arg(cfg)
            .stderr(log)
            .spawn()
            .unwrap();
        let d = Daemon {
            child: Some(child),
            port,
            host,
            dir: dir.to_path_buf(),
        };
        d.wait_for("the HTTP API", Duration::from_secs(30), |d| {
            TcpStream::connect((d.host, d.port)).is_ok()
        });
        d
    }

    /// A daemon on engine `pid` whose configuration also has `sections` (TOML tables).
    pub fn start_with_sections(dir: &Path, pid: u32, warmup: usize, sections: &str) -> Daemon {
        let port = free_port();
        let cfg = config(dir, pid, port, warmup);
        let text = std::fs::read_to_string(&cfg).unwrap() + sections;
        std::fs::write(&cfg, text).unwrap();
        Daemon::start_with(dir, port, cfg)
    }

    /// A daemon on the toy engine `engine_pid` (no fit: it never leaves warm-up) whose
    /// `[sentinel]` table also has `keys` (TOML lines).
    pub fn start_with_sentinel_keys(dir: &Path, engine_pid: u32, keys: &str) -> Daemon {
        let port = free_port();
        let cfg = config(dir, engine_pid, port, 100_000);
        let text = std::fs::read_to_string(&cfg).unwrap().replace(
            "poll_interval = \"1ms\"",
            &format!("poll_interval = \"1ms\"\n{keys}"),
        );
        std::fs::write(&cfg, text).unwrap();
        Daemon::start_with(dir, port, cfg)
    }

    /// The iterations the first engine's status counts, all stages together.
    pub fn iterations(&self) -> u64 {
        self.engine().map_or(0, |e| {
            e["iterations"]
                .as_object()
                .map_or(0, |m| m.values().filter_map(Value::as_u64).sum())
        })
    }

    /// Stops the daemon's process (SIGSTOP) for `pause`, then lets it go on.
    pub fn freeze(&self, pause: Duration) {
        let end = Instant::now() + pause;
        self.freeze_until(pause, || Instant::now() >= end);
    }

    /// Stops the daemon's process (SIGSTOP) until `done` (polled every 100 ms) or for `limit`,
    /// then lets it go on; whether `done` came.
    pub fn freeze_until(&self, limit: Duration, done: impl Fn() -> bool) -> bool {
        let pid = self.pid();
        let t = Instant::now();
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        while !done() && t.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(100));
        }
        let reached = done();
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGCONT) };
        reached
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("daemon.log")).unwrap_or_default()
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        super::tail(&self.log(), lines)
    }

    /// Where its HTTP API listens.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::new(self.host, self.port)
    }

    /// GET `path` from its API; the body (panics on a non-200).
    pub fn get(&self, path: &str) -> String {
        let r =
            sys_util::http::request_to(self.addr(), "GET", path, "", "", Duration::from_secs(60))
                .unwrap_or_else(|e| {
                    panic!(
                        "GET {path}: no answer within 60 s: {e}; the daemon's log ends:\n{}\nits threads:\n{}",
                        self.log_tail(40),
                        self.threads()
                    )
                });
        assert_eq!(r.status, 200, "GET {path}: {}", r.body);
        r.body
    }

    /// What each of its threads is doing (state, policy, CPU time, kernel wait) and, where gdb
    /// is installed, their stacks, with what competes for the CPUs: for a daemon that stops
    /// answering.
    pub fn threads(&self) -> String {
        let pid = self.pid();
        let mut out = String::new();
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let dir = t.path();
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            // A SCHED_DEADLINE thread's budget and deadline (a reservation the kernel once left
            // throttled for good: sys_util::sched::RESERVATION).
            let deadline: Vec<String> = std::fs::read_to_string(dir.join("sched"))
                .unwrap_or_default()
                .lines()
                .filter(|l| l.starts_with("dl."))
                .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect();
            out += &format!(
                "{} {}: {}{}\n",
                t.file_name().to_string_lossy(),
                comm.trim(),
                sys_util::task_state::doing(&dir.to_string_lossy()),
                if deadline.is_empty() {
                    String::new()
                } else {
                    format!(", {}", deadline.join(", "))
                }
            );
        }
        out += &sys_util::task_state::cpu_contention();
        let stacks = Command::new("timeout")
            .args(["60", "gdb", "-p", &pid.to_string(), "-batch", "-nx"])
            .args(["-ex", "thread apply all bt 30"])
            .output();
        match stacks {
            Ok(o) if o.status.success() => {
                out += "\n";
                out += &String::from_utf8_lossy(&o.stdout);
            }
            Ok(o) => out += &format!("\n(no stacks: gdb {})", o.status),
            Err(e) => out += &format!("\n(no stacks: gdb: {e})"),
        }
        out
    }

    pub fn status(&self) -> Value {
        serde_json::from_str(&self.get("/api/v1/status")).unwrap()
    }

    pub fn deep_dives(&self) -> Vec<Value> {
        serde_json::from_str::<Value>(&self.get("/api/v1/deep-dives"))
            .unwrap()
            .as_array()
            .unwrap()
            .clone()
    }

    /// Waits for the only deep dive to be written; returns its record.
    pub fn deep_dive_done(&self) -> Value {
        self.wait_for("written deep dive", Duration::from_secs(90), |d| {
            d.deep_dives()
                .first()
                .is_some_and(|r| r["state"] == "done" || r["state"] == "failed")
        });
        let r = self.deep_dives()[0].clone();
        assert_eq!(r["state"], "done", "{r}\n{}", self.log());
        r
    }

    pub fn engine(&self) -> Option<Value> {
        self.status()["engines"].as_array()?.first().cloned()
    }

    pub fn wait_for(&self, what: &str, limit: Duration, ok: impl Fn(&Daemon) -> bool) {
        let t = Instant::now();
        while !ok(self) {
            assert!(
                t.elapsed() < limit,
                "no {what} within {limit:?}; daemon log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The daemon's pid (in this process's PID namespace): the child, or below programs of a
    /// prefix that fork rather than exec (nsenter, for a PID namespace), their only child.
    pub fn pid(&self) -> i32 {
        let mut pid = self.child.as_ref().unwrap().id();
        while std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .is_ok_and(|c| c.trim() != "stallscope")
        {
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            match children.split_whitespace().next() {
                Some(c) => pid = c.parse().unwrap(),
                None => break,
            }
        }
        pid as i32
    }

    /// SIGTERM, then the exit status (a prefix's program passes the daemon's on).
    pub fn stop(&mut self) -> ExitStatus {
        let pid = self.pid();
        let mut c = self.child.take().unwrap();
        // SAFETY: plain kill(2) on our descendant.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        c.wait().unwrap()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_some() {
            // SAFETY: plain kill(2) on our descendant.
            unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        }
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
