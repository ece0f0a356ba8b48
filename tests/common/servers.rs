//! The real servers around the daemons, each started by the test and killed with it:
//! Debian's Prometheus and Alertmanager, and PyPI moto's S3 server.

use std::{
    net::{IpAddr, SocketAddr, TcpListener},
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use super::{free_port, tool_python, Proc};

/// Waits until `GET path` at `addr` answers 200, for up to 60 s; `what` and `log` explain a
/// failure.
fn wait_ready(addr: SocketAddr, path: &str, what: &str, log: &Path) {
    let t = Instant::now();
    while sys_util::http::request_to(addr, "GET", path, "", "", Duration::from_secs(2))
        .map_or(true, |r| r.status != 200)
    {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "{what} did not become ready at {addr}: {}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Alertmanager on loopback, routing every alert, grouped by `serving_group`, to the webhook
/// (`POST /api/v1/alertmanager` with `token`) of each daemon at `daemons`.
pub fn start_alertmanager(dir: &Path, daemons: &[SocketAddr], token: &str) -> (Proc, u16) {
    let port = free_port();
    let config = dir.join("alertmanager.yml");
    let webhooks: String = daemons
        .iter()
        .map(|a| {
            format!(
                "      - url: http://{a}/api/v1/alertmanager\n        send_resolved: false\n        http_config:\n          authorization:\n            type: Bearer\n            credentials: {token}\n"
            )
        })
        .collect();
    std::fs::write(
        &config,
        format!(
            "route:\n  receiver: stallscope\n  group_by: [serving_group]\n  group_wait: 0s\n  group_interval: 1s\n  repeat_interval: 1h\nreceivers:\n  - name: stallscope\n    webhook_configs:\n{webhooks}"
        ),
    )
    .unwrap();
    let log = dir.join("alertmanager.log");
    let mut c = Command::new("prometheus-alertmanager");
    c.arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.path={}", dir.join("am-data").display()))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--cluster.listen-address=")
        .stderr(std::fs::File::create(&log).unwrap());
    let am = Proc::spawn(&mut c);
    wait_ready(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "/-/ready",
        "Alertmanager",
        &log,
    );
    (am, port)
}

/// Prometheus on loopback scraping `targets` every second as job `stallscope`, evaluating
/// `rules` every second and sending its alerts to the Alertmanager on `alertmanager`.
pub fn start_prometheus(
    dir: &Path,
    targets: &[SocketAddr],
    rules: Option<&Path>,
    alertmanager: Option<u16>,
) -> (Proc, u16) {
    let port = free_port();
    let list: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
    let mut config = format!(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - job_name: stallscope\n    static_configs:\n      - targets: [{}]\n",
        list.join(", ")
    );
    if let Some(r) = rules {
        config += &format!("rule_files:\n  - {}\n", r.display());
    }
    if let Some(am) = alertmanager {
        config += &format!(
            "alerting:\n  alertmanagers:\n    - static_configs:\n        - targets: ['127.0.0.1:{am}']\n"
        );
    }
    std::fs::write(dir.join("prometheus.yml"), config).unwrap();
    let log = dir.join("prometheus.log");
    let prom = Proc::spawn(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                dir.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    wait_ready(
        SocketAddr::from(([127, 0, 0, 1], port)),
        "/-/ready",
        "Prometheus",
        &log,
    );
    (prom, port)
}

/// An S3 server (moto in server mode, from `cargo xtask setup`'s s3-venv) listening on
/// `host`, with `bucket` created; its address.
pub fn start_s3(dir: &Path, host: IpAddr, bucket: &str) -> (Proc, SocketAddr) {
    let port = TcpListener::bind((host, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = SocketAddr::new(host, port);
    let log = dir.join("s3.log");
    let server = Proc::spawn(
        Command::new(tool_python("s3-venv"))
            .args(["-m", "moto.server", "-H"])
            .arg(host.to_string())
            .args(["-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap()),
    );
    wait_ready(addr, "/moto-api/", "the S3 server", &log);
    let r = sys_util::http::request_to(
        addr,
        "PUT",
        &format!("/{bucket}"),
        "",
        "",
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(r.status, 200, "creating the bucket: {}", r.body);
    (server, addr)
}

/// Object `key` of `bucket` on the S3 server at `addr`, read with boto3 (AWS's own Python
/// client, signed with moto's test credentials); None when absent.
pub fn s3_object(addr: SocketAddr, bucket: &str, key: &str) -> Option<Vec<u8>> {
    let script = "import sys, boto3\n\
        s3 = boto3.client('s3', endpoint_url=sys.argv[1], aws_access_key_id='testing', aws_secret_access_key='testing', region_name='us-east-1')\n\
        try:\n    body = s3.get_object(Bucket=sys.argv[2], Key=sys.argv[3])['Body'].read()\n\
        except s3.exceptions.NoSuchKey:\n    sys.exit(3)\n\
        sys.stdout.buffer.write(body)\n";
    let out = Command::new(tool_python("s3-venv"))
        .args(["-c", script, &format!("http://{addr}"), bucket, key])
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => Some(out.stdout),
        Some(3) => None,
        _ => panic!(
            "reading s3://{bucket}/{key}: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}
