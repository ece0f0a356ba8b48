//! A plain HTTP/1.0 client: one request per connection, the whole answer read until the
//! server closes it. Enough for the daemon's API, an engine's OpenAI endpoint and a kubelet's
//! read-only pod list, which is all stallscope's tools and tests talk to.

use std::{
    io::{self, Read, Write},
    net::{Ipv4Addr, SocketAddr, TcpStream},
    time::Duration,
};

/// `http://AUTHORITY[/PATH]` split into its authority and its path (`""` when it has none);
/// None for another scheme or an empty authority. Each caller checks what it needs beyond.
pub fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    (!authority.is_empty()).then_some((authority, path))
}

/// An answer: the status code and the body.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub body: String,
}

/// `method path` on 127.0.0.1:`port` with extra `headers` (each ending in CRLF) and `body`;
/// waits up to `timeout` to connect and for each read.
pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
    timeout: Duration,
) -> io::Result<Response> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    request_to(addr, method, path, headers, body, timeout)
}

/// `method path` on `addr`, as [`request`].
pub fn request_to(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &str,
    body: &str,
    timeout: Duration,
) -> io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    // One write: a request split over several segments may reach a server that answers
    // after its first read.
    let head = format!(
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\n{headers}Content-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all([head.as_bytes(), body.as_bytes()].concat().as_slice())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    parse(&String::from_utf8_lossy(&raw))
}

/// `GET path`.
pub fn get(port: u16, path: &str, timeout: Duration) -> io::Result<Response> {
    request(port, "GET", path, "", "", timeout)
}

/// `POST path` with a JSON body.
pub fn post_json(port: u16, path: &str, json: &str, timeout: Duration) -> io::Result<Response> {
    request(
        port,
        "POST",
        path,
        "Content-Type: application/json\r\n",
        json,
        timeout,
    )
}

fn parse(text: &str) -> io::Result<Response> {
    let bad = |what: &str| io::Error::new(io::ErrorKind::InvalidData, what.to_string());
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| bad("an HTTP answer without a header end"))?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| bad(&format!("a bad HTTP status line: {head:.80}")))?;
    Ok(Response {
        status,
        body: body.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    #[test]
    fn a_request_reaches_the_server_and_its_answer_comes_back() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().unwrap();
            // The whole request (its body is the 2 bytes after the header's end), however
            // it was segmented; answering before would reset the connection.
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while String::from_utf8_lossy(&req)
                .split_once("\r\n\r\n")
                .is_none_or(|(_, body)| body.len() < 2)
            {
                let n = c.read(&mut buf).unwrap();
                assert!(n > 0, "the client closed early");
                req.extend_from_slice(&buf[..n]);
            }
            let req = String::from_utf8_lossy(&req).into_owned();
            c.write_all(b"HTTP/1.0 202 Accepted\r\nContent-Type: text/plain\r\n\r\nok")
                .unwrap();
            req
        });
        let r = post_json(port, "/x", "{}", Duration::from_secs(5)).unwrap();
        assert_eq!((r.status, r.body.as_str()), (202, "ok"));
        let req = server.join().unwrap();
        assert!(req.starts_with("POST /x HTTP/1.0\r\n"), "{req}");
        assert!(req.ends_with("Content-Length: 2\r\n\r\n{}"), "{req}");
    }

    #[test]
    fn urls_split_into_authority_and_path() {
        for (url, want) in [
            ("http://h:10255/pods", Some(("h:10255", "/pods"))),
            ("http://h:4318", Some(("h:4318", ""))),
            ("http://h:9093/", Some(("h:9093", "/"))),
            ("http://", None),
            ("http:///x", None),
            ("https://h:4318", None),
            ("h:4318", None),
        ] {
            assert_eq!(split_url(url), want, "{url}");
        }
    }

    #[test]
    fn bad_answers_are_errors() {
        for text in ["HTTP/1.0 200 OK", "garbage\r\n\r\nbody"] {
            assert!(parse(text).is_err(), "{text}");
        }
    }
}
