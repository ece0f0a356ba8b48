//! The Kubernetes deployment (deploy/): the Helm chart rendered by Helm's own template engine
//! for its defaults and every toggle, each object validated strictly against the Kubernetes
//! schemas (deploy/check.py); every rendered daemon configuration accepted by the daemon; the
//! alert rules checked and unit-tested by promtool; and every metric the Grafana dashboard
//! queries present in a real scrape of the daemon. No cluster can run here.

use std::{path::PathBuf, process::Command, time::Duration};

use serde_json::Value;

mod common;
use common::daemon::Daemon;
use common::{
    expect_json, expect_success, http_get, require_root, stallscope, start_engine, start_hog,
    tmpdir, tool_python, TOY_HOG,
};

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

#[test]
fn the_chart_renders_validates_and_configures_the_daemon() {
    let out = tmpdir("deploy-render");
    let summary = expect_json(
        Command::new(tool_python("deploy-venv"))
            .arg(deploy_dir().join("check.py"))
            .arg(&out),
    );
    let cases = summary["cases"].as_array().unwrap();
    assert!(cases.len() >= 8, "{summary}");
    assert!(cases.iter().any(|c| c == "example-sidecar"), "{summary}");
    for kind in [
        "DaemonSet",
        "Pod",
        "ConfigMap",
        "PrometheusRule",
        "ServiceMonitor",
        "Secret",
    ] {
        assert!(
            summary["kinds"]
                .as_array()
                .unwrap()
                .iter()
                .any(|k| k == kind),
            "no {kind} rendered: {summary}"
        );
    }
    // The daemon takes every configuration the chart renders, laid over its default.
    for case in cases {
        let file = out.join(format!("{}.toml", case.as_str().unwrap()));
        let shown = String::from_utf8(expect_success(
            stallscope()
                .args(["run", "--check-config", "--config"])
                .arg(&file),
        ))
        .unwrap();
        assert!(
            shown.contains("engine_patterns") && shown.contains("0.0.0.0:"),
            "{case}: {shown}"
        );
    }
}

#[test]
fn the_alert_rules_pass_promtool_and_their_unit_tests() {
    let rules = deploy_dir().join("helm/stallscope/files/rules.yaml");
    expect_success(
        Command::new("promtool")
            .args(["check", "rules"])
            .arg(&rules),
    );
    expect_success(
        Command::new("promtool")
            .args(["test", "rules", "rules_test.yaml"])
            .current_dir(deploy_dir().join("prometheus")),
    );
}

/// The dashboard's queries name series the daemon really exports: a scrape of a daemon that
/// has fitted a baseline on the toy engine and alerted on a CPU hog.
#[test]
fn every_metric_the_dashboard_queries_is_in_a_real_scrape() {
    require_root();
    let out = tmpdir("deploy-dashboard");
    let summary = expect_json(
        Command::new(tool_python("deploy-venv"))
            .arg(deploy_dir().join("check.py"))
            .arg(&out),
    );
    let engine = start_engine();
    let d = Daemon::start(&out, engine.id(), 300);
    d.wait_for("fitted model", Duration::from_secs(60), |d| {
        d.engine().is_some_and(|e| e["model_state"] == "fitted")
    });
    let hog = start_hog("0", TOY_HOG);
    d.wait_for("alert", Duration::from_secs(20), |d| {
        d.engine().is_some_and(|e| e["anomaly_active"] == true)
    });
    drop(hog);
    let scrape = http_get(d.port, "/metrics");
    let missing: Vec<&Value> = summary["dashboard_metrics"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| {
            let m = m.as_str().unwrap();
            !scrape
                .lines()
                .any(|l| l.starts_with(&format!("{m}{{")) || l.starts_with(&format!("{m} ")))
        })
        .collect();
    assert!(
        missing.is_empty(),
        "the dashboard queries {missing:?}, which the daemon does not export:\n{scrape}"
    );
}

/// The daemon's image builds offline from deploy/Containerfile (buildah, from scratch) and
/// starts: the binary answers inside it, with its libraries and nothing else.
#[test]
fn the_image_builds_offline_and_starts() {
    require_root();
    let xtask = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/release/xtask");
    let tag = "stallscope-test:ci";
    let out = Command::new(&xtask)
        .args(["image", "--check", "--tag", tag])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let _ = Command::new("buildah")
        .args(["--storage-driver", "vfs", "rmi", tag])
        .output();
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains(&format!("stallscope {}", env!("CARGO_PKG_VERSION")))
            && text.contains("engine_patterns"),
        "{text}"
    );
}
