//! Alertmanager in the loop: a real Alertmanager (Debian's) routes a firing alert for this
//! node's serving group to the daemon's authenticated webhook, which starts a deep dive of its
//! engine; bad and unauthenticated calls are refused with a clear status and change nothing.

use std::{
    path::Path,
    process::Command,
    time::{Duration, SystemTime},
};

use serde_json::Value;

mod common;
use common::daemon::{config_on, Daemon};
use common::{free_port, http_request, require_root, start_engine, tmpdir, Proc};

const TOKEN: &str = "s3cret-webhook-token";
const GROUP: &str = "llama-70b-tp8";

/// Alertmanager, routing every alert to the daemon's webhook with the token.
fn start_alertmanager(dir: &Path, daemon_port: u16) -> (Proc, u16) {
    let port = free_port();
    let config = dir.join("alertmanager.yml");
    std::fs::write(
        &config,
        format!(
            r#"route:
  receiver: stallscope
  group_by: [serving_group]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: stallscope
    webhook_configs:
      - url: http://127.0.0.1:{daemon_port}/api/v1/alertmanager
        send_resolved: false
        http_config:
          authorization:
            type: Bearer
            credentials: {TOKEN}
"#
        ),
    )
    .unwrap();
    let mut c = Command::new("prometheus-alertmanager");
    c.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stderr(std::fs::File::create(dir.join("alertmanager.log")).unwrap());
    let am = Proc::spawn(&mut c);
    let t = std::time::Instant::now();
    while sys_util::http::get(port, "/-/ready", Duration::from_secs(1))
        .map_or(true, |r| r.status != 200)
    {
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "Alertmanager did not become ready"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (am, port)
}

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
    let (_am, am_port) = start_alertmanager(&dir, port);
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
