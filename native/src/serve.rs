//! `train --serve [ADDR]`: the run's dashboard, live, over HTTP while it trains (127.0.0.1:6006
//! by default): `/` is the report page (`report::html` without data), which polls
//! `/records?from=N` for the metrics records after the N it has. Read-only, two paths, GET
//! only; everything else is 404 (a path with `..` or an absolute URL included) or 405.
//!
//! The training loop only appends each record to a shared list (a short lock); one server
//! thread answers the viewers, each connection with a time limit, so a slow or absent viewer
//! never holds the run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// Where `--serve` without an address serves (TensorBoard's port).
pub const DEFAULT_ADDR: &str = "127.0.0.1:6006";

/// How long one viewer's request may take to arrive or its answer to leave.
const VIEWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The most bytes of a request read (its line and headers).
const MAX_REQUEST: u64 = 64 * 1024;

/// The records of the run being served (JSON lines), shared with the server thread.
#[derive(Clone, Default)]
pub struct Records(Arc<Mutex<Vec<String>>>);

impl Records {
    /// Adds one record (a JSON object's text).
    pub fn push(&self, line: String) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(line);
    }

    /// The records from index `from` on, one per line.
    fn since(&self, from: usize) -> String {
        let all = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        all.get(from..).unwrap_or_default().iter().map(|l| format!("{l}\n")).collect()
    }
}

/// Binds `addr` and serves the dashboard of `records` from a background thread; returns the
/// address bound (port 0 picks a free one). A warning goes to stderr when the address is not
/// the loopback: anyone who can reach it sees the run.
pub fn start(addr: &str, records: Records) -> Result<SocketAddr, String> {
    let wanted: Vec<SocketAddr> = addr.to_socket_addrs().map_err(|e| format!("--serve {addr}: not an address to listen on ({e})"))?.collect();
    let listener = TcpListener::bind(&wanted[..]).map_err(|e| format!("--serve {addr}: cannot listen there: {e}"))?;
    let bound = listener.local_addr().map_err(|e| format!("--serve {addr}: {e}"))?;
    if !bound.ip().is_loopback() {
        eprintln!("warning: --serve {bound} is reachable from other machines: anyone who can connect sees this run's metrics and samples");
    }
    let page = crate::report::html(None);
    std::thread::Builder::new()
        .name("dashboard".into())
        .spawn(move || {
            for stream in listener.incoming().flatten() {
                // A viewer's failure (gone, slow, malformed) only ends its own connection.
                let _ = answer(stream, &page, &records);
            }
        })
        .map_err(|e| format!("--serve: cannot start the server thread: {e}"))?;
    Ok(bound)
}

/// Reads one request from `stream` and answers it.
fn answer(mut stream: TcpStream, page: &str, records: &Records) -> std::io::Result<()> {
    stream.set_read_timeout(Some(VIEWER_TIMEOUT))?;
    stream.set_write_timeout(Some(VIEWER_TIMEOUT))?;
    let mut reader = BufReader::new(stream.try_clone()?).take(MAX_REQUEST);
    let mut request = String::new();
    reader.read_line(&mut request)?;
    // The headers are read and ignored (their end, or the limit, ends the request).
    let mut header = String::new();
    while reader.read_line(&mut header)? > 2 {
        header.clear();
    }
    let (status, kind, body) = route(&request, page, records);
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nCache-Control: no-store\r\nConnection: close\r\n\r\n", body.len());
    stream.write_all(head.as_bytes())?;
    stream.write_all(body.as_bytes())
}

/// The status, content type and body that answer `request` (its first line).
fn route(request: &str, page: &str, records: &Records) -> (&'static str, &'static str, String) {
    let mut parts = request.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let not_found = ("404 Not Found", "text/plain", "not found\n".to_string());
    if method != "GET" {
        return ("405 Method Not Allowed", "text/plain", "read-only: GET only\n".into());
    }
    let (path, query) = target.split_once('?').unwrap_or((target, ""));
    match path {
        "/" => ("200 OK", "text/html; charset=utf-8", page.to_string()),
        "/records" => match query.strip_prefix("from=").map(str::parse::<usize>) {
            None if query.is_empty() => ("200 OK", "application/x-ndjson", records.since(0)),
            Some(Ok(from)) => ("200 OK", "application/x-ndjson", records.since(from)),
            _ => ("400 Bad Request", "text/plain", "from=N, N a record index\n".into()),
        },
        _ => not_found,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_dashboards_paths_are_served() {
        let records = Records::default();
        records.push("{\"type\":\"start\"}".into());
        records.push("{\"type\":\"train\",\"step\":0}".into());
        let status = |req: &str| route(req, "PAGE", &records).0;
        assert_eq!(route("GET / HTTP/1.1", "PAGE", &records).2, "PAGE");
        assert_eq!(route("GET /records?from=1 HTTP/1.1", "PAGE", &records).2, "{\"type\":\"train\",\"step\":0}\n");
        assert_eq!(route("GET /records?from=9 HTTP/1.1", "PAGE", &records).2, "");
        for bad in [
            "GET /../etc/passwd HTTP/1.1",
            "GET /records/../../etc/passwd HTTP/1.1",
            "GET /etc/passwd HTTP/1.1",
            "GET http://x/etc/passwd HTTP/1.1",
            "GET //etc/passwd HTTP/1.1",
            "GET /%2e%2e/ HTTP/1.1",
            "GET",
        ] {
            assert_eq!(status(bad), "404 Not Found", "{bad}");
        }
        assert_eq!(status("POST /records HTTP/1.1"), "405 Method Not Allowed");
        assert_eq!(status("GET /records?from=x HTTP/1.1"), "400 Bad Request");
    }
}
