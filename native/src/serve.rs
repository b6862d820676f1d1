//! `train --serve [ADDR]`: the run's dashboard, live, over HTTP while it trains (127.0.0.1:6006
//! by default): `/` is the report page (`report::html` without data), which polls
//! `/records?since=V` for the run's records (the bounded set [`RunRecords`] keeps, sent whole
//! when they changed since version V, else `204 No Content`). Read-only, two paths, GET only;
//! everything else is 404 (a path with `..` or an absolute URL included) or 405.
//!
//! The training loop only adds each record to the shared set (a short lock). Each viewer's
//! connection is served by a thread of its own, at most [`MAX_VIEWERS`] at once (more are
//! answered `503` at once), and its request must arrive whole within 2 seconds:
//! a slow or idle client holds only its own thread, never the run or another viewer. Bound to
//! the loopback, only requests whose `Host` names the loopback are answered (a page of another
//! site cannot read the run through DNS rebinding).

use crate::report::RunRecords;
use anyhow::{anyhow, Result};
use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where `--serve` without an address serves (TensorBoard's port).
pub const DEFAULT_ADDR: &str = "127.0.0.1:6006";

/// How long a viewer's whole request may take to arrive.
const REQUEST_DEADLINE: Duration = Duration::from_secs(2);

/// How long the answer may take to leave.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

/// The most bytes of a request read (its line and headers).
const MAX_REQUEST: usize = 16 * 1024;

/// Connections served at once.
pub const MAX_VIEWERS: usize = 256;

/// The records of the run being served, shared with the server's threads.
#[derive(Clone, Default)]
pub struct Records(Arc<Mutex<RunRecords>>);

impl Records {
    /// Adds one record (a JSON object's text).
    pub fn push(&self, line: &str) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push_line(line);
    }

    /// The records' version and, unless it is `since`, the records (one per line).
    fn since(&self, since: Option<u64>) -> (u64, Option<String>) {
        let records = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let version = records.version();
        if since == Some(version) {
            return (version, None);
        }
        (version, Some(records.records().map(|r| format!("{r}\n")).collect()))
    }
}

/// Binds `addr` and serves the dashboard of `records` from a background thread; returns the
/// address bound (port 0 picks a free one). A warning goes to stderr when the address is not
/// the loopback: anyone who can reach it sees the run.
pub fn start(addr: &str, records: Records) -> Result<SocketAddr> {
    let wanted: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| anyhow!("--serve {addr}: not an address to listen on ({e})"))?.collect();
    let listener = TcpListener::bind(&wanted[..]).map_err(|e| anyhow!("--serve {addr}: cannot listen there: {e}"))?;
    let bound = listener.local_addr().map_err(|e| anyhow!("--serve {addr}: {e}"))?;
    let loopback_only = bound.ip().is_loopback();
    if !loopback_only {
        eprintln!("warning: --serve {bound} is reachable from other machines: anyone who can connect sees this run's metrics and samples");
    }
    let page: Arc<str> = crate::report::html(None).into();
    let open = Arc::new(AtomicUsize::new(0));
    std::thread::Builder::new()
        .name("dashboard".into())
        .spawn(move || {
            for mut stream in listener.incoming().flatten() {
                if open.fetch_add(1, Ordering::SeqCst) >= MAX_VIEWERS {
                    open.fetch_sub(1, Ordering::SeqCst);
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                    let _ = stream.write_all(&response("503 Service Unavailable", "text/plain", None, b"too many viewers; try again\n"));
                    continue;
                }
                let (page, records, viewers) = (Arc::clone(&page), records.clone(), Arc::clone(&open));
                let spawned = std::thread::Builder::new().name("viewer".into()).stack_size(64 << 10).spawn(move || {
                    // A viewer's failure (gone, slow, malformed) only ends its own connection.
                    let _ = answer(stream, &page, &records, loopback_only);
                    viewers.fetch_sub(1, Ordering::SeqCst);
                });
                if spawned.is_err() {
                    open.fetch_sub(1, Ordering::SeqCst);
                }
            }
        })
        .map_err(|e| anyhow!("--serve: cannot start the server thread: {e}"))?;
    Ok(bound)
}

/// Reads the request head (its line and headers) within [`REQUEST_DEADLINE`], whatever pace
/// the bytes come at; `None` when it is not whole by then or longer than [`MAX_REQUEST`].
fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<String>> {
    let deadline = Instant::now() + REQUEST_DEADLINE;
    let mut head = Vec::new();
    let mut buf = [0u8; 2048];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() || head.len() > MAX_REQUEST {
            return Ok(None);
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut buf) {
            Ok(0) => return Ok(None),
            Ok(n) => head.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(String::from_utf8_lossy(&head).into_owned()))
}

/// The bytes of an HTTP response.
fn response(status: &str, kind: &str, version: Option<u64>, body: &[u8]) -> Vec<u8> {
    let version = version.map(|v| format!("X-Records-Version: {v}\r\n")).unwrap_or_default();
    let head =
        format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nCache-Control: no-store\r\n{version}Connection: close\r\n\r\n", body.len());
    [head.as_bytes(), body].concat()
}

/// Reads one request from `stream` and answers it.
fn answer(mut stream: TcpStream, page: &str, records: &Records, loopback_only: bool) -> std::io::Result<()> {
    stream.set_write_timeout(Some(WRITE_TIMEOUT))?;
    let Some(head) = read_head(&mut stream)? else {
        return stream.write_all(&response("408 Request Timeout", "text/plain", None, b"the request did not arrive whole in time\n"));
    };
    let Answer { status, kind, version, body } = route(&head, page, records, loopback_only);
    stream.write_all(&response(status, kind, version, body.as_bytes()))
}

/// What answers a request.
struct Answer {
    status: &'static str,
    kind: &'static str,
    /// The records' version, for `/records`.
    version: Option<u64>,
    body: String,
}

/// Whether a `Host` header value names the loopback (`localhost`, `127.0.0.1`, `[::1]`, with
/// or without a port).
fn names_loopback(host: &str) -> bool {
    let name = match host.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host.rsplit_once(':').filter(|(_, port)| port.bytes().all(|b| b.is_ascii_digit())).map_or(host, |(name, _)| name),
    };
    name.eq_ignore_ascii_case("localhost") || name.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The answer to `head` (the request line and headers).
fn route(head: &str, page: &str, records: &Records, loopback_only: bool) -> Answer {
    let plain = |status, body: &str| Answer { status, kind: "text/plain", version: None, body: body.to_string() };
    let mut lines = head.lines();
    let mut parts = lines.next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    if loopback_only {
        let host = lines.filter_map(|l| l.split_once(':')).find(|(name, _)| name.trim().eq_ignore_ascii_case("host")).map(|(_, v)| v.trim());
        if !host.is_some_and(names_loopback) {
            return plain("403 Forbidden", "this dashboard answers requests addressed to this machine's loopback only (Host: localhost or 127.0.0.1)\n");
        }
    }
    if method != "GET" {
        return plain("405 Method Not Allowed", "read-only: GET only\n");
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/" => Answer { status: "200 OK", kind: "text/html; charset=utf-8", version: None, body: page.to_string() },
        "/records" => {
            let since = match query.strip_prefix("since=").map(str::parse::<u64>) {
                None if query.is_empty() => None,
                Some(Ok(v)) => Some(v),
                _ => return plain("400 Bad Request", "since=V, V a version of the records\n"),
            };
            match records.since(since) {
                (version, None) => Answer { status: "204 No Content", kind: "application/x-ndjson", version: Some(version), body: String::new() },
                (version, Some(body)) => Answer { status: "200 OK", kind: "application/x-ndjson", version: Some(version), body },
            }
        }
        _ => plain("404 Not Found", "not found\n"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(target: &str) -> String {
        format!("GET {target} HTTP/1.1\r\nHost: 127.0.0.1:6006\r\n\r\n")
    }

    #[test]
    fn only_the_dashboards_paths_are_served() {
        let records = Records::default();
        records.push("{\"type\":\"start\"}");
        records.push("{\"type\":\"train\",\"step\":0}");
        let status = |req: &str| route(req, "PAGE", &records, true).status;
        assert_eq!(route(&get("/"), "PAGE", &records, true).body, "PAGE");
        let all = route(&get("/records"), "PAGE", &records, true);
        assert_eq!((all.body.as_str(), all.version), ("{\"type\":\"start\"}\n{\"step\":0,\"type\":\"train\"}\n", Some(2)));
        assert_eq!(status(&get("/records?since=2")), "204 No Content");
        assert_eq!(status(&get("/records?since=1")), "200 OK");
        for bad in ["/../etc/passwd", "/records/../../etc/passwd", "/etc/passwd", "http://x/etc/passwd", "//etc/passwd", "/%2e%2e/"] {
            assert_eq!(status(&get(bad)), "404 Not Found", "{bad}");
        }
        assert_eq!(status("GET\r\nHost: localhost\r\n\r\n"), "404 Not Found");
        assert_eq!(status("POST /records HTTP/1.1\r\nHost: localhost\r\n\r\n"), "405 Method Not Allowed");
        assert_eq!(status(&get("/records?since=x")), "400 Bad Request");
    }

    /// Bound to the loopback, a request addressed to another name (a rebound DNS name) or to
    /// none is refused; bound elsewhere, any Host is answered.
    #[test]
    fn only_loopback_hosts_are_answered_on_the_loopback() {
        let records = Records::default();
        for host in ["localhost", "localhost:6006", "127.0.0.1:6006", "127.0.0.2", "[::1]:6006", "LOCALHOST"] {
            assert_eq!(route(&format!("GET / HTTP/1.1\r\nhost: {host}\r\n\r\n"), "P", &records, true).status, "200 OK", "{host}");
        }
        for host in ["evil.example:6006", "127.0.0.1.evil.example", "10.0.0.1", "[::2]"] {
            assert_eq!(route(&format!("GET / HTTP/1.1\r\nHost: {host}\r\n\r\n"), "P", &records, true).status, "403 Forbidden", "{host}");
        }
        assert_eq!(route("GET / HTTP/1.0\r\n\r\n", "P", &records, true).status, "403 Forbidden");
        assert_eq!(route("GET / HTTP/1.1\r\nHost: box.lan:6006\r\n\r\n", "P", &records, false).status, "200 OK");
    }
}
