//! A stand-in for a node's kubelet (none can run here): a PodList served over plain HTTP, as
//! a kubelet's read-only port answers `GET /pods`; and what the tests check of pod labels.

use std::{
    io::{Read, Write},
    net::TcpListener,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
};

/// The label whose value names a pod's serving group in these tests.
pub const GROUP_LABEL: &str = "stallscope.io/serving-group";

/// The v1 PodList of one pod, `pod`, whose container `container` is in namespace `namespace`;
/// the pod's serving group ([`GROUP_LABEL`]) is `<pod name>-group`.
pub fn pod_list(namespace: &str, pod: &sys_util::pod::Pod, container: &str) -> String {
    serde_json::json!({
        "kind": "PodList",
        "apiVersion": "v1",
        "items": [{
            "metadata": {
                "name": pod.name,
                "namespace": namespace,
                "uid": pod.uid,
                "labels": {GROUP_LABEL: format!("{}-group", pod.name)},
            },
            "status": {"containerStatuses": [{
                "name": container,
                "containerID": format!("containerd://{}", pod.container_id),
            }]},
        }],
    })
    .to_string()
}

/// Answers every request with `body` (a PodList) on a loopback port; the port, and the count
/// of `GET /pods` requests.
pub fn stand_in_kubelet(body: String) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let asked = Arc::new(AtomicUsize::new(0));
    let count = asked.clone();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let n = s.read(&mut buf).unwrap_or(0);
            if String::from_utf8_lossy(&buf[..n]).starts_with("GET /pods ") {
                count.fetch_add(1, Ordering::SeqCst);
            }
            let _ = write!(
                s,
                "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        }
    });
    (port, asked)
}

/// The daemon's `[pods]` table reading the stand-in on `port`.
pub fn pods_section(port: u16) -> String {
    format!("\n[pods]\nnames = \"kubelet\"\nkubelet_url = \"http://127.0.0.1:{port}/pods\"\ntimeout = \"2s\"\n")
}

/// The `/metrics` lines of the series labelled with `pid`.
pub fn series_of(metrics: &str, pid: u32) -> Vec<String> {
    let label = format!("pid=\"{pid}\"");
    metrics
        .lines()
        .filter(|l| l.starts_with("stallscope_") && l.contains(&label))
        .map(str::to_string)
        .collect()
}
