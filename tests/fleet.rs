//! A serving group of three nodes, every server a real one: each node a network namespace of
//! its own (veth to a bridge) with a toy engine and a daemon; Prometheus (Debian) scrapes the
//! three daemons and evaluates the chart's rules; Alertmanager (Debian) routes the group's
//! alert to every daemon's webhook; the shared store is an S3 server (moto).
//!
//! A CPU hog on one node's engine raises that node's sentinel alert, Prometheus's group
//! alert, and one deep dive on every node at the group's instant: the captures start within
//! 50 ms of each other by the traces' own clock snapshots; the traces, the nodes' entries and
//! the index are in the store; the index names the hogged node as the first to slow; `stallscope
//! fleet merge` writes one trace of the three nodes that PyPI perfetto's decoder reads.
//!
//! With a vLLM server's JSON in STALLSCOPE_VLLM (`cargo xtask test` runs this file again in its
//! vLLM phase), the last node's engine is the real vLLM engine: a member of the group that takes
//! the group's deep dive with the others (the toys stay the ones whose baselines alert: vLLM
//! serving takes both CPUs of this machine and would slow them, so it is left idle once
//! attached).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use serde_json::Value;

mod common;
use common::daemon::{config_on, Daemon};
use common::netns::Net;
use common::servers::{s3_object, start_alertmanager, start_prometheus, start_s3};
use common::{
    capture_start_unix_ns, expect_json, free_port, pin_this_thread_to_cpu, python_check,
    require_root, stallscope, start_engine_in, start_hog, tmpdir, Proc, TOY_HOG,
};
use perfetto_writer::read;

const TOKEN: &str = "fleet-webhook-token";
const GROUP: &str = "llama-tp3";
const BUCKET: &str = "stallscope-fleet";
const NODES: usize = 3;
/// The node whose engine is hogged; it runs alone on CPU 1, the others share CPU 0.
const HOGGED: usize = 0;

/// Node `i`'s configuration: its engine (a toy, or vLLM), its API on its namespace's address,
/// the group, the store, and no deep dive of its own on its alerts (the group's alert takes
/// one on every node; a node's own would hold its capture ring when the group's instant
/// comes).
fn node_config(
    dir: &Path,
    net: &Net,
    i: usize,
    engine: u32,
    vllm: bool,
    port: u16,
    s3: &str,
) -> PathBuf {
    let listen = format!("{}:{port}", net.node_ip(i));
    let cfg = config_on(dir, engine, &listen, 300, TOKEN);
    let mut text = std::fs::read_to_string(&cfg).unwrap();
    if vllm {
        let watch = text
            .lines()
            .find(|l| l.starts_with("watch = "))
            .unwrap()
            .to_string();
        text = text
            .replace("framework = \"generic\"", "framework = \"vllm\"")
            .replace(&watch, "watch = []");
    }
    let text = text
        .replace("on_alert = true", "on_alert = false")
        + &format!(
            "\n[fleet]\ngroup = \"{GROUP}\"\nnode = \"node-{i}\"\nlead = \"4s\"\n\n[store]\nendpoint = \"http://{s3}\"\nbucket = \"{BUCKET}\"\nprefix = \"fleet-test\"\naccess_key_id = \"testing\"\nsecret_access_key = \"testing\"\ntimeout = \"10s\"\n"
        );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

#[test]
fn a_stall_on_one_node_gives_one_group_deep_dive_in_the_store() {
    require_root();
    // Everything this test starts runs on CPU 0 (children inherit the mask) but the hogged
    // node's engine, alone on CPU 1: the hog then takes CPU time from that engine only, instead
    // of pushing the daemons and servers over to the other engines' CPU, where they would slow
    // those engines before the hogged one's alert.
    pin_this_thread_to_cpu(0);
    let dir = tmpdir("fleet");
    let net = Net::new(NODES);
    let (_s3, s3) = start_s3(&dir, net.host_ip(), BUCKET);
    let vllm: Option<Value> = std::env::var("STALLSCOPE_VLLM")
        .ok()
        .map(|v| serde_json::from_str(&v).unwrap());
    let mut engines = Vec::new();
    let mut nodes = Vec::new();
    let mut configs = Vec::new();
    for i in 0..NODES {
        let node_dir = dir.join(format!("node-{i}"));
        std::fs::create_dir_all(&node_dir).unwrap();
        let port = free_port();
        let vllm_pid = vllm
            .as_ref()
            .filter(|_| i == NODES - 1)
            .map(|v| v["engine_pid"].as_u64().unwrap() as u32);
        let pid = match vllm_pid {
            Some(pid) => pid,
            None => {
                let cpu = if i == HOGGED { "1" } else { "0" };
                engines.push(start_engine_in(&net.enter(i), cpu));
                engines.last().unwrap().id()
            }
        };
        let s3 = s3.to_string();
        let cfg = node_config(&node_dir, &net, i, pid, vllm_pid.is_some(), port, &s3);
        configs.push(cfg.clone());
        // An idle vLLM engine waits in a futex and cannot run the attach: a little load
        // until it is attached.
        let load = vllm.as_ref().filter(|_| vllm_pid.is_some()).map(|v| {
            Proc::spawn(
                Command::new(std::env::var_os("STALLSCOPE_XTASK").unwrap())
                    .args(["vllm", "load", "--duration", "600", "--concurrency", "1"])
                    .arg("--port")
                    .arg(v["port"].to_string())
                    .stdout(Stdio::null())
                    .stderr(Stdio::null()),
            )
        });
        let d = Daemon::start_at(&node_dir, (net.node_ip(i), port), cfg, &net.enter(i));
        if load.is_some() {
            d.wait_for("vLLM attached", Duration::from_secs(180), |d| {
                d.engine().is_some_and(|e| e["anchor"].is_string())
            });
            eprintln!("node-{i}: attached to the vLLM engine {pid}");
        }
        drop(load);
        nodes.push(d);
    }
    for d in nodes.iter().take(engines.len()) {
        d.wait_for("fitted model", Duration::from_secs(90), |d| {
            d.engine().is_some_and(|e| e["model_state"] == "fitted")
        });
    }
    let rules = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/helm/stallscope/files/rules.yaml");
    let addrs: Vec<_> = nodes.iter().map(Daemon::addr).collect();
    let (_am, am_port) = start_alertmanager(&dir, &addrs, TOKEN);
    let (_prom, _prom_port) = start_prometheus(&dir, &addrs, Some(&rules), Some(am_port));
    for d in &nodes {
        assert!(
            d.deep_dives().is_empty(),
            "a deep dive before the hog: {:?}",
            d.deep_dives()
        );
    }

    // The hog on the engine's CPU: the node alerts, Prometheus fires the group's alert, and
    // Alertmanager calls every node's webhook.
    let hog = start_hog("1", TOY_HOG);
    let dives: Vec<Value> = nodes.iter().map(Daemon::deep_dive_done).collect();
    drop(hog);
    let instant = dives[0]["start_at_unix_ns"]
        .as_u64()
        .unwrap_or_else(|| panic!("no group instant: {}", dives[0]));
    let starts: Vec<i128> = dives.iter().map(capture_start_unix_ns).collect();
    for (d, start) in dives.iter().zip(&starts) {
        assert_eq!(d["start_at_unix_ns"].as_u64(), Some(instant), "{d}");
        assert_eq!(d["group"], GROUP, "{d}");
        let late_ms = (start - i128::from(instant)) as f64 / 1e6;
        assert!(
            (-1.0..1000.0).contains(&late_ms),
            "a capture began {late_ms:.1} ms after the group's instant: {d}"
        );
        // Its sources were started ahead of the instant, not at it.
        let report: Value =
            serde_json::from_slice(&std::fs::read(d["report"].as_str().unwrap()).unwrap()).unwrap();
        let lead_in_ms = report["lead_in_ms"].as_f64().unwrap();
        assert!(
            lead_in_ms > 0.0,
            "no lead-in before the group's instant: {d}"
        );
        eprintln!(
            "pid {}: its capture's sources were running {lead_in_ms:.1} ms before the instant",
            d["pid"]
        );
    }
    let spread_ms = (starts.iter().max().unwrap() - starts.iter().min().unwrap()) as f64 / 1e6;
    eprintln!("group deep dive: the three windows opened within {spread_ms:.2} ms");
    assert!(
        spread_ms < 50.0,
        "the nodes' windows opened {spread_ms:.1} ms apart"
    );

    // The store: every node's files and entry, and the index naming the hogged node.
    let group_dir = format!("fleet-test/groups/{GROUP}/{instant}");
    let index = {
        let t = std::time::Instant::now();
        loop {
            let index: Option<Value> = s3_object(s3, BUCKET, &format!("{group_dir}/index.json"))
                .map(|t| serde_json::from_slice(&t).unwrap());
            match index {
                Some(i) if i["nodes"].as_array().is_some_and(|n| n.len() == NODES) => break i,
                other => assert!(
                    t.elapsed() < Duration::from_secs(60),
                    "no index of the three nodes in the store within 60 s: {other:?}\n{}",
                    nodes[0].log()
                ),
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    };
    eprintln!("the group's index: {index}");
    assert_eq!(index["first_to_slow"], format!("node-{HOGGED}"), "{index}");
    for (i, entry) in index["nodes"].as_array().unwrap().iter().enumerate() {
        assert_eq!(entry["node"], format!("node-{i}"), "{entry}");
        assert!(entry["clock_offset_ns"].as_i64().is_some(), "{entry}");
        for file in ["trace", "report"] {
            let key = format!("fleet-test/{}", entry[file].as_str().unwrap());
            assert!(
                s3_object(s3, BUCKET, &key).is_some_and(|b| !b.is_empty()),
                "{key} is not in the store"
            );
        }
    }
    assert!(
        index["nodes"][HOGGED]["slowed_unix_ms"].as_u64().is_some(),
        "{index}"
    );

    // One trace of the group, from the store (the engine may slow again after the hog and
    // the group take another deep dive: this one is named by its instant).
    let merged = dir.join("group.pftrace");
    let out = expect_json(stallscope().args([
        "fleet",
        "merge",
        "--config",
        configs[0].to_str().unwrap(),
        "--group",
        GROUP,
        "--instant",
        &instant.to_string(),
        "--out",
        merged.to_str().unwrap(),
    ]));
    assert_eq!(out["instant_unix_ns"], instant, "{out}");
    assert_eq!(out["first_to_slow"], format!("node-{HOGGED}"), "{out}");
    let decoded = read::decode(&std::fs::read(&merged).unwrap())
        .unwrap_or_else(|e| panic!("the merged trace is invalid:\n{e}"));
    let mut processes: Vec<&str> = decoded
        .tracks
        .values()
        .filter(|t| matches!(t.kind, read::TrackKind::Process { .. }))
        .map(|t| t.name.as_str())
        .collect();
    processes.sort();
    assert_eq!(processes, ["node-0", "node-1", "node-2"]);
    let windows = decoded
        .slices
        .iter()
        .filter(|s| s.name == "deep dive")
        .count();
    assert_eq!(windows, NODES, "one deep-dive window per node");
    let checked = python_check(&merged);
    eprintln!("the merged trace, by PyPI perfetto: {checked}");
    drop(nodes);
    drop(engines);
    let _ = std::fs::remove_dir_all(&dir);
}
