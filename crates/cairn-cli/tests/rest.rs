//! `cairn run --rest`: the REST API of a real running job, over HTTP on 127.0.0.1.
//!
//! Nothing sleeps for synchronisation: every wait polls with a short backoff until a deadline.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::Watched;
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(20);
const TOKEN: &str = "t0ken-for-the-test";

/// Polling pauses growing from 5 ms to 200 ms, until a deadline.
struct Backoff {
    next: Duration,
    deadline: Instant,
}

impl Backoff {
    fn new(deadline: Instant) -> Self {
        Backoff {
            next: Duration::from_millis(5),
            deadline,
        }
    }

    /// Pauses before the next poll; false once the deadline has passed.
    fn pause(&mut self) -> bool {
        let now = Instant::now();
        if now >= self.deadline {
            return false;
        }
        std::thread::sleep(self.next.min(self.deadline - now));
        self.next = (self.next * 2).min(Duration::from_millis(200));
        true
    }
}

/// One HTTP/1.1 request; (status, JSON body). Err if the server cannot be reached.
fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    token: Option<&str>,
) -> std::io::Result<(u16, Value)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .unwrap_or_else(|| panic!("no end of headers in {text:?}"));
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "unexpected chunked reply: {head}"
    );
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let body = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body:?}"));
    Ok((status, body))
}

/// Polls `GET path` until `done` returns a value.
fn poll<T>(
    cairn: &mut Watched,
    addr: SocketAddr,
    path: &str,
    what: &str,
    mut done: impl FnMut(&Value) -> Option<T>,
) -> T {
    let mut backoff = Backoff::new(Instant::now() + DEADLINE);
    loop {
        cairn.assert_running();
        let last = match http(addr, "GET", path, Some(TOKEN)) {
            Ok((200, body)) => match done(&body) {
                Some(v) => return v,
                None => body,
            },
            Ok((status, body)) => panic!("GET {path}: {status} {body}"),
            // The server listens before it prints its address.
            Err(e) => panic!("GET {path}: {e}"),
        };
        assert!(
            backoff.pause(),
            "no {what} within {DEADLINE:?}; last answer: {last}"
        );
    }
}

#[test]
fn a_running_job_is_observed_and_cancelled_through_rest() {
    let mut cairn = Watched::spawn(Command::new(env!("CARGO_BIN_EXE_cairn")).args([
        "run",
        "wordcount",
        "--generate",
        "200000000",
        "--keys",
        "1000",
        "--discard",
        "--checkpoint-interval",
        "100ms",
        "--rest",
        "127.0.0.1:0",
        "--rest-token",
        TOKEN,
    ]));
    let addr = cairn.rest_addr(Instant::now() + DEADLINE);
    assert!(addr.ip().is_loopback() && addr.port() != 0, "{addr}");

    let jid = poll(&mut cairn, addr, "/jobs", "RUNNING job", |b| {
        let job = b["jobs"].as_array()?.first()?;
        (job["status"] == "RUNNING").then(|| job["id"].as_str().map(str::to_string))?
    });
    assert_eq!(jid.len(), 32, "job id {jid:?}");

    // The token is enforced by the real server too.
    let (status, body) = http(addr, "GET", "/jobs", None).expect("reachable");
    assert_eq!(status, 401, "{body}");

    let (status, details) =
        http(addr, "GET", &format!("/jobs/{jid}"), Some(TOKEN)).expect("reachable");
    assert_eq!(status, 200, "{details}");
    assert_eq!(details["name"], "wordcount");
    assert_eq!(details["end-time"], -1);

    let newest = poll(
        &mut cairn,
        addr,
        &format!("/jobs/{jid}/checkpoints"),
        "completed checkpoint",
        |b| {
            let completed = b["counts"]["completed"].as_u64()?;
            (completed >= 1).then(|| b["latest"]["completed"].clone())
        },
    );
    assert_eq!(newest["status"], "COMPLETED", "{newest}");
    assert!(newest["id"].as_u64().is_some_and(|id| id >= 1), "{newest}");
    assert!(
        newest["subtasks"].as_array().is_some_and(|t| !t.is_empty()),
        "{newest}"
    );
    // Flink's per-vertex statistics.
    assert!(
        newest["tasks"].as_object().is_some_and(|t| !t.is_empty()),
        "{newest}"
    );

    let (status, config) = http(
        addr,
        "GET",
        &format!("/jobs/{jid}/checkpoints/config"),
        Some(TOKEN),
    )
    .expect("reachable");
    assert_eq!(status, 200, "{config}");
    assert_eq!(config["interval"], 100);
    assert_eq!(config["mode"], "exactly_once");

    let (status, body) = http(
        addr,
        "PATCH",
        &format!("/jobs/{jid}?mode=cancel"),
        Some(TOKEN),
    )
    .expect("reachable");
    assert_eq!(status, 202, "{body}");

    let (status, stderr) = cairn.wait(Instant::now() + DEADLINE);
    assert!(!status.success(), "a cancelled job must fail the run");
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    assert_eq!(last, Some("error: job cancelled"), "stderr:\n{stderr}");
}

/// Runs `cairn run` with arguments that fail before the job starts; returns stderr.
fn run_err(extra: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(["run", "wordcount", "--generate", "10", "--discard"])
        .args(extra)
        .stdin(Stdio::null())
        .output()
        .expect("cairn starts");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line expected:\n{stderr}");
    lines[0].to_string()
}

#[test]
fn rest_address_errors_are_one_line() {
    let line = run_err(&["--rest", "not an address"]);
    assert!(
        line.starts_with("error: --rest expects HOST:PORT"),
        "{line}"
    );

    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let line = run_err(&["--rest", &addr]);
    assert!(
        line.starts_with(&format!("error: cannot listen on {addr}")),
        "{line}"
    );

    let line = run_err(&["--rest", "127.0.0.1:0", "--rest-token", ""]);
    assert_eq!(line, "error: --rest-token must not be empty");
}
