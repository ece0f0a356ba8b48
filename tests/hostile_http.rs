//! The HTTP API against a hostile client: a daemon listening on every address (so that the
//! deep-dive and webhook calls need the token) watching the toy engine, and a table of
//! requests no well-behaved client sends. Each is refused with its status (or its connection
//! cut) within its limit; nothing starts a deep dive, the daemon and the engine keep going,
//! and a plain request is answered after every case.

use std::{
    io::{Read, Write},
    net::TcpStream,
    time::{Duration, Instant},
};

mod common;
use common::daemon::{config_on, metric, Daemon};
use common::{free_port, require_root, start_engine, tmpdir};

const TOKEN: &str = "hostile-test-token-0123456789";

/// What came back for one raw request.
#[derive(Debug)]
struct Answer {
    /// The status line's code, if a response came.
    status: Option<u16>,
    body: String,
    /// How long until the answer (or the close).
    took: Duration,
}

/// Sends `head` then `body` (after `pause`) and reads until the server closes or `wait`
/// passes.
fn raw(port: u16, head: &[u8], body: &[u8], pause: Duration, wait: Duration) -> Answer {
    let t = Instant::now();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(wait)).unwrap();
    // A server that closes mid-send answers EPIPE/ECONNRESET: that is the answer.
    let _ = s.write_all(head);
    if !body.is_empty() {
        std::thread::sleep(pause);
        let _ = s.write_all(body);
    }
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                // One full response is enough (the server may keep the connection).
                if complete(&got) {
                    break;
                }
            }
        }
    }
    let text = String::from_utf8_lossy(&got).to_string();
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .or_else(|| text.strip_prefix("HTTP/1.0 "))
        .and_then(|r| r.get(..3))
        .and_then(|c| c.parse().ok());
    let body = text.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    Answer {
        status,
        body,
        took: t.elapsed(),
    }
}

/// Whether `got` holds a whole response (headers and a Content-Length body).
fn complete(got: &[u8]) -> bool {
    let text = String::from_utf8_lossy(got);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        return false;
    };
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length: ")
                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
        })
        .unwrap_or(0);
    body.len() >= len
}

fn post(path: &str, auth: &str, body: &str) -> Vec<u8> {
    format!(
        "POST {path} HTTP/1.1\r\nHost: x\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn bearer(token: &str) -> String {
    format!("Authorization: Bearer {token}\r\n")
}

/// The expected outcome of a case.
#[derive(Debug, Clone, Copy)]
enum Expect {
    /// This status.
    Status(u16),
    /// One of these statuses.
    AnyOf(&'static [u16]),
    /// A 4xx status, or the connection closed without one.
    RefusedOrCut,
}

#[test]
fn hostile_requests_are_refused_within_their_limits_and_change_nothing() {
    require_root();
    let engine = start_engine();
    let dir = tmpdir("hostile-http");
    let port = free_port();
    let cfg = config_on(
        &dir,
        engine.id(),
        &format!("0.0.0.0:{port}"),
        100_000,
        TOKEN,
    );
    let d = Daemon::start_with(&dir, port, cfg);
    d.wait_for("attached engine", Duration::from_secs(30), |d| {
        d.engine().is_some()
    });
    let pid = engine.id();
    let short = Duration::from_millis(10);
    let wait = Duration::from_secs(30);
    let dive = |body: &str| post("/api/v1/deep-dive", &bearer(TOKEN), body);
    let big_json = format!("{{\"pid\": {pid}, \"pad\": \"{}\"}}", "x".repeat(3 << 20));
    let big_webhook = format!("{{\"alerts\": [], \"pad\": \"{}\"}}", "x".repeat(300 << 10));
    let many_headers: String = (0..150).map(|i| format!("X-H{i}: v\r\n")).collect();
    let cases: Vec<(&str, Vec<u8>, Vec<u8>, Expect)> = vec![
        ("deep dive without a token, off loopback", post("/api/v1/deep-dive", "", "{}"), vec![], Expect::Status(403)),
        ("deep dive with a wrong token of the same length", post("/api/v1/deep-dive", &bearer(&"h".repeat(TOKEN.len())), "{}"), vec![], Expect::Status(403)),
        ("deep dive with the token's prefix", post("/api/v1/deep-dive", &bearer(&TOKEN[..10]), "{}"), vec![], Expect::Status(403)),
        ("deep dive with the token under another scheme", post("/api/v1/deep-dive", &format!("Authorization: Basic {TOKEN}\r\n"), "{}"), vec![], Expect::Status(403)),
        ("webhook without a token", post("/api/v1/alertmanager", "", "{}"), vec![], Expect::Status(401)),
        // The server answers 413 and closes while the client still sends: the client may see
        // the answer or only the reset.
        ("a 3 MiB deep-dive body", dive(&big_json), vec![], Expect::RefusedOrCut),
        ("a 300 KiB webhook body", post("/api/v1/alertmanager", &bearer(TOKEN), &big_webhook), vec![], Expect::RefusedOrCut),
        ("a body that is not JSON", dive("{\"pid\": "), vec![], Expect::Status(400)),
        ("an unknown field", dive(&format!("{{\"pid\": {pid}, \"evil\": 1}}")), vec![], Expect::Status(400)),
        ("a negative window", dive(&format!("{{\"pid\": {pid}, \"duration_s\": -1}}")), vec![], Expect::Status(400)),
        ("an endless window", dive(&format!("{{\"pid\": {pid}, \"duration_s\": 1e308}}")), vec![], Expect::Status(400)),
        ("a window that is a string", dive(&format!("{{\"pid\": {pid}, \"duration_s\": \"NaN\"}}")), vec![], Expect::Status(400)),
        ("a pid that is not an engine", dive("{\"pid\": 1}"), vec![], Expect::AnyOf(&[400, 404])),
        ("a deep-dive id that climbs out of the directory", b"GET /api/v1/deep-dives/../../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), vec![], Expect::AnyOf(&[400, 404])),
        ("an encoded path in the id", b"GET /api/v1/deep-dives/%2e%2e%2fconfig.toml HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), vec![], Expect::AnyOf(&[400, 404])),
        ("an id past u64", b"GET /api/v1/deep-dives/18446744073709551616 HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), vec![], Expect::AnyOf(&[400, 404])),
        ("a method the route does not take", b"DELETE /api/v1/status HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(), vec![], Expect::Status(405)),
        ("a 100 KiB header", format!("GET /api/v1/status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(100 << 10)).into_bytes(), vec![], Expect::Status(431)),
        ("a 2 MiB header", format!("GET /api/v1/status HTTP/1.1\r\nHost: x\r\nX-Big: {}\r\n\r\n", "a".repeat(2 << 20)).into_bytes(), vec![], Expect::RefusedOrCut),
        ("a 100 KiB target", format!("GET /api/v1/status?{} HTTP/1.1\r\nHost: x\r\n\r\n", "q".repeat(100 << 10)).into_bytes(), vec![], Expect::RefusedOrCut),
        ("150 headers", format!("GET /api/v1/status HTTP/1.1\r\nHost: x\r\n{many_headers}\r\n").into_bytes(), vec![], Expect::RefusedOrCut),
        ("bytes that are not HTTP", vec![0, 1, 2, 0xff, 0xfe, b'\r', b'\n', b'\r', b'\n'], vec![], Expect::RefusedOrCut),
        ("a chunk size past any limit", b"POST /api/v1/deep-dive HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nFFFFFFFFFFFFFFFFFF\r\n".to_vec(), vec![], Expect::RefusedOrCut),
        ("a connection that sends nothing", vec![], vec![], Expect::RefusedOrCut),
        ("a head never finished (slowloris)", b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n".to_vec(), vec![], Expect::RefusedOrCut),
        ("a body trickled and never finished", format!("POST /api/v1/deep-dive HTTP/1.1\r\nHost: x\r\n{}Content-Length: 100\r\n\r\n", bearer(TOKEN)).into_bytes(), b"{\"pid\"".to_vec(), Expect::Status(408)),
    ];
    assert!(cases.len() >= 20);
    let mut failures = Vec::new();
    for (what, head, body, expect) in &cases {
        let a = raw(port, head, body, short, wait);
        let ok = match *expect {
            Expect::Status(c) => a.status == Some(c),
            Expect::AnyOf(cs) => a.status.is_some_and(|s| cs.contains(&s)),
            Expect::RefusedOrCut => a.status.is_none_or(|s| (400..500).contains(&s)),
        };
        println!("{what}: {:?} in {:?}", a.status, a.took);
        if !ok || a.body.contains("root:") {
            failures.push(format!(
                "{what}: expected {expect:?}, got {:?} ({})",
                a.status,
                a.body.chars().take(200).collect::<String>()
            ));
        }
        // The slow cases end within their limit, not at the client's patience.
        if a.took > Duration::from_secs(15) {
            failures.push(format!("{what}: took {:?}", a.took));
        }
        let (code, _) = common::http_request(port, "GET", "/api/v1/status", "", "");
        assert_eq!(code, 200, "after {what}, the API answers");
    }

    // Pipelined requests on one connection, sent at once: all answered, in order. (The
    // client keeps its side open: a half-close lets the server end the connection at EOF
    // before it has read every buffered request.)
    let burst = "GET /api/v1/status HTTP/1.1\r\nHost: x\r\n\r\n".repeat(200);
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    s.write_all(burst.as_bytes()).unwrap();
    let (mut got, mut buf, t) = (Vec::new(), [0u8; 65536], Instant::now());
    let count = |got: &[u8]| String::from_utf8_lossy(got).matches("HTTP/1.1 200").count();
    while count(&got) < 200 && t.elapsed() < Duration::from_secs(20) {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    let answered = count(&got);
    println!("pipelined: {answered} of 200 answered");
    assert_eq!(answered, 200, "pipelined requests are all answered");
    drop(s);

    // A flood of idle connections: past the cap they are closed at once and counted; the
    // idle ones are cut at the head timeout, and then the API answers again.
    let before = metric(
        &d.get("/metrics"),
        "stallscope_http_refused_connections_total",
    );
    let flood: Vec<TcpStream> = (0..96)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let mut cut = 0;
    for mut c in flood {
        c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut b = [0u8; 64];
        // EOF or a reset: the server closed it; a timeout: still held open.
        let closed = match c.read(&mut b) {
            Ok(_) => true,
            Err(e) => !matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ),
        };
        cut += usize::from(closed);
    }
    println!(
        "flood: {cut} of 96 connections closed by the server within {:?}",
        t.elapsed()
    );
    assert_eq!(
        cut, 96,
        "every idle connection is closed: at the cap or at the head timeout"
    );
    assert!(
        t.elapsed() < Duration::from_secs(15),
        "idle connections are cut at the head timeout"
    );
    let after = metric(
        &d.get("/metrics"),
        "stallscope_http_refused_connections_total",
    );
    assert!(
        after - before >= 32.0,
        "refused past the cap: {before} -> {after}"
    );

    // Each kind of close the client cannot tell from a dropped connection is said in the log.
    let log = d.log();
    for said in [
        "its request head was not complete within 5s of its opening",
        "at once: 64 are open",
    ] {
        assert!(log.contains(said), "the log says \"{said}\":\n{log}");
    }

    // What the daemon writes about the engine is its user's alone.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dir.join("iterations.csv"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the iteration export's mode");

    // Nothing was started, the engine is still watched and stepping.
    assert!(
        d.deep_dives().is_empty(),
        "no deep dive: {:?}",
        d.deep_dives()
    );
    let n = d.iterations();
    std::thread::sleep(Duration::from_secs(1));
    assert!(d.iterations() > n, "the engine is still followed");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
