//! An OTLP/HTTP receiver for the tests: decodes every request with opentelemetry-proto's
//! messages and keeps them. It can be stopped (its port then refuses connections, and the
//! connections it had are closed) and started again on the same port.

use std::{
    io::{BufRead, BufReader, Read, Write},
    net::{TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::Duration,
};

use opentelemetry_proto::tonic::collector::{
    logs::v1::ExportLogsServiceRequest, metrics::v1::ExportMetricsServiceRequest,
    trace::v1::ExportTraceServiceRequest,
};
use prost::Message;

/// What the receiver has decoded.
#[derive(Default)]
pub struct Got {
    pub logs: Vec<ExportLogsServiceRequest>,
    pub traces: Vec<ExportTraceServiceRequest>,
    pub metrics: Vec<ExportMetricsServiceRequest>,
    /// Requests it could not decode (path, reason).
    pub bad: Vec<(String, String)>,
}

pub struct Receiver {
    pub port: u16,
    pub got: Arc<Mutex<Got>>,
    stop: Arc<AtomicBool>,
}

impl Receiver {
    /// A receiver on a free loopback port.
    pub fn start() -> Receiver {
        Receiver::listen(0, Arc::default())
    }

    fn listen(port: u16, got: Arc<Mutex<Got>>) -> Receiver {
        let listener = TcpListener::bind(("127.0.0.1", port)).unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, store) = (stop.clone(), got.clone());
        std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((s, _)) => {
                        let (flag, store) = (flag.clone(), store.clone());
                        std::thread::spawn(move || serve(s, &flag, &store));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        Receiver { port, got, stop }
    }

    /// Stops answering: the port refuses connections and open ones are closed.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(300));
    }

    /// A receiver on the same port, keeping what this one got.
    pub fn restart(self) -> Receiver {
        self.stop();
        Receiver::listen(self.port, self.got.clone())
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

/// Serves one connection's requests (HTTP/1.1 keep-alive) until it closes or `stop`.
fn serve(s: TcpStream, stop: &AtomicBool, got: &Mutex<Got>) {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut reader = BufReader::new(s.try_clone().unwrap());
    let mut out = s;
    loop {
        let mut head = Vec::new();
        let mut line = String::new();
        loop {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            line.clear();
            match reader.read_line(&mut line) {
                Ok(0) => return,
                Ok(_) if line == "\r\n" => break,
                Ok(_) => head.push(line.trim_end().to_string()),
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => return,
            }
        }
        let path = head
            .first()
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap_or_default()
            .to_string();
        let length: usize = head
            .iter()
            .find_map(|h| {
                let (k, v) = h.split_once(':')?;
                k.eq_ignore_ascii_case("content-length")
                    .then(|| v.trim().parse().ok())?
            })
            .unwrap_or(0);
        let mut body = vec![0; length];
        let mut at = 0;
        while at < length {
            match reader.read(&mut body[at..]) {
                Ok(0) => return,
                Ok(n) => at += n,
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) =>
                {
                    if stop.load(Ordering::SeqCst) {
                        return;
                    }
                }
                Err(_) => return,
            }
        }
        {
            let mut g = got.lock().unwrap();
            let decoded = match path.as_str() {
                "/v1/logs" => ExportLogsServiceRequest::decode(&body[..]).map(|r| g.logs.push(r)),
                "/v1/traces" => {
                    ExportTraceServiceRequest::decode(&body[..]).map(|r| g.traces.push(r))
                }
                "/v1/metrics" => {
                    ExportMetricsServiceRequest::decode(&body[..]).map(|r| g.metrics.push(r))
                }
                _ => {
                    g.bad.push((path.clone(), "unknown path".into()));
                    Ok(())
                }
            };
            if let Err(e) = decoded {
                g.bad.push((path.clone(), e.to_string()));
            }
        }
        let reply =
            "HTTP/1.1 200 OK\r\ncontent-type: application/x-protobuf\r\ncontent-length: 0\r\n\r\n";
        if out.write_all(reply.as_bytes()).is_err() {
            return;
        }
    }
}
