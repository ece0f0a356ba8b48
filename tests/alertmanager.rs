//! Alertmanager in the loop: a real Alertmanager (Debian's) routes a firing alert for this
//! node's serving group to the daemon's authenticated webhook, which starts a deep dive of its
//! engine; bad and unauthenticated calls are refused with a clear status and change nothing.

use std::{
    path::Path,
    time::{Duration, SystemTime},
};

use serde_json::Value;

mod common;
use common::daemon::{config_on, Daemon};
use common::servers::start_alertmanager;
use common::{
    capture_start_unix_ns, expect_json, free_port, http_request, require_root, stallscope,
    start_engine, tmpdir,
};

const TOKEN: &str = "s3cret-webhook-token";
const GROUP: &str = "llama-70b-tp8";

/// The webhook answer to `body` with `auth` (a full header line, or "").
fn call(port: u16, auth: &str, body: &str) -> (u16, Value) {
    let (code, text) = http_request(port, "POST", "/api/v1/alertmanager", auth, body);
    (
        code,
        serde_json::from_str(&text).unwrap_or(Value::String(text)),
    )
}

fn webhook_message(group: &str) -> String {
    format!(
        r#"{{"version":"4","status":"firing","receiver":"stallscope","groupLabels":{{}},"commonLabels":{{}},"alerts":[{{"status":"firing","labels":{{"alertname":"StallscopeStall","serving_group":"{group}"}}}}]}}"#
    )
}

#[test]
fn alertmanager_routes_a_group_alert_to_a_deep_dive_and_bad_calls_change_nothing() {
    require_root();
    let engine = start_engine();
    let dir = tmpdir("alertmanager");
    let port = free_port();
    let cfg = config_on(
        &dir,
        engine.id(),
        &format!("127.0.0.1:{port}"),
        100_000,
        TOKEN,
    );
    let text =
        std::fs::read_to_string(&cfg).unwrap() + &format!("\n[fleet]\ngroup = \"{GROUP}\"\n");
    std::fs::write(&cfg, text).unwrap();
    let d = Daemon::start_with(&dir, port, cfg);
    d.wait_for("attached engine", Duration::from_secs(30), |d| {
        d.engine().is_some()
    });
    let auth = format!("Authorization: Bearer {TOKEN}\r\n");

    // Refused, each with its status and a reason, and no deep dive asked for.
    let huge = format!(
        "{{\"version\":\"4\",\"alerts\":[],\"pad\":\"{}\"}}",
        "x".repeat(300 * 1024)
    );
    for (what, header, body, want) in [
        ("no token", String::new(), webhook_message(GROUP), 401),
        (
            "a wrong token",
            "Authorization: Bearer guess\r\n".to_string(),
            webhook_message(GROUP),
            401,
        ),
        (
            "not a webhook message",
            auth.clone(),
            "{\"hello\": 1}".to_string(),
            400,
        ),
        (
            "an unknown payload version",
            auth.clone(),
            webhook_message(GROUP).replace("\"4\"", "\"3\""),
            400,
        ),
        ("a body over 256 KiB", auth.clone(), huge, 413),
    ] {
        let (code, answer) = call(port, &header, &body);
        assert_eq!(code, want, "{what}: {answer}");
        if want != 413 {
            assert!(
                answer["error"].as_str().is_some_and(|e| e.len() > 20),
                "{what}: {answer}"
            );
        }
    }
    // Another group's alert asks for nothing.
    let (code, answer) = call(port, &auth, &webhook_message("another-group"));
    assert_eq!(
        (code, answer["deep_dive"].clone()),
        (200, Value::Null),
        "{answer}"
    );
    assert!(
        d.deep_dives().is_empty(),
        "a refused call started a deep dive: {:?}",
        d.deep_dives()
    );

    // The real Alertmanager delivers an alert for this group: a deep dive of the engine.
    let (_am, am_port) = start_alertmanager(&dir, &[d.addr()], TOKEN);
    let alert = format!(
        r#"[{{"labels":{{"alertname":"StallscopeStall","serving_group":"{GROUP}","severity":"warning"}},"annotations":{{"summary":"iterations slower than the baseline"}},"startsAt":"{}"}}]"#,
        humantime::format_rfc3339_seconds(SystemTime::now())
    );
    let r = sys_util::http::request(
        am_port,
        "POST",
        "/api/v2/alerts",
        "Content-Type: application/json\r\n",
        &alert,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(r.status, 200, "Alertmanager took the alert: {}", r.body);
    let dive = d.deep_dive_done();
    assert_eq!(dive["pid"], engine.id(), "{dive}");
    assert!(
        dive["trigger"]
            .as_str()
            .unwrap()
            .starts_with("alertmanager StallscopeStall"),
        "{dive}"
    );
    assert!(
        d.log().contains("Alertmanager: StallscopeStall"),
        "{}",
        d.log()
    );
    drop(d);
    drop(engine);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A daemon on `engine` in `dir`, with the token and this group, its deep dives `lead` after
/// a group alert starts.
fn group_node(dir: &Path, engine: u32, lead: &str) -> Daemon {
    std::fs::create_dir_all(dir).unwrap();
    let port = free_port();
    let cfg = config_on(dir, engine, &format!("127.0.0.1:{port}"), 100_000, TOKEN);
    let text = std::fs::read_to_string(&cfg).unwrap()
        + &format!("\n[fleet]\ngroup = \"{GROUP}\"\nlead = \"{lead}\"\n");
    std::fs::write(&cfg, text).unwrap();
    let d = Daemon::start_with(dir, port, cfg);
    d.wait_for("attached engine", Duration::from_secs(30), |d| {
        d.engine().is_some()
    });
    d
}

/// One deep dive of a serving group of two nodes (two daemons, each on its engine), asked for
/// with `stallscope fleet deep-dive` through a real Alertmanager: both captures start at the
/// group's instant, within 50 ms of each other by the traces' own clocks.
#[test]
fn a_group_deep_dive_starts_on_every_node_at_one_instant() {
    require_root();
    let engines = [start_engine(), start_engine()];
    let dir = tmpdir("fleet-sync");
    let nodes: Vec<Daemon> = engines
        .iter()
        .enumerate()
        .map(|(i, e)| group_node(&dir.join(format!("node{i}")), e.id(), "3s"))
        .collect();
    let addrs: Vec<_> = nodes.iter().map(Daemon::addr).collect();
    let (_am, am_port) = start_alertmanager(&dir, &addrs, TOKEN);
    let asked = expect_json(stallscope().args([
        "fleet",
        "deep-dive",
        "--group",
        GROUP,
        "--alertmanager",
        &format!("http://127.0.0.1:{am_port}"),
    ]));
    assert_eq!(asked["group"], GROUP, "{asked}");
    let dives: Vec<Value> = nodes.iter().map(|d| d.deep_dive_done()).collect();
    let instant = dives[0]["start_at_unix_ns"]
        .as_u64()
        .expect("a group instant");
    let starts: Vec<i128> = dives.iter().map(capture_start_unix_ns).collect();
    for (d, start) in dives.iter().zip(&starts) {
        assert_eq!(
            d["start_at_unix_ns"].as_u64(),
            Some(instant),
            "one instant for the group: {d}"
        );
        let after = (start - i128::from(instant)) as f64 / 1e6;
        assert!(
            (-1.0..1000.0).contains(&after),
            "a capture began {after:.1} ms after the group's instant: {d}"
        );
    }
    let apart_ms = (starts[0] - starts[1]).abs() as f64 / 1e6;
    let late: Vec<String> = starts
        .iter()
        .map(|s| format!("{:.2}", (s - i128::from(instant)) as f64 / 1e6))
        .collect();
    eprintln!(
        "group deep dive: captures began {apart_ms:.2} ms apart, {} ms after the group's instant",
        late.join(" and ")
    );
    assert!(
        apart_ms < 50.0,
        "the nodes' captures began {apart_ms:.1} ms apart"
    );
    drop(nodes);
    let _ = std::fs::remove_dir_all(&dir);
}
