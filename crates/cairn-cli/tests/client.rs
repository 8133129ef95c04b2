//! The client commands (`submit`, `list`, `status`, `cancel`, `checkpoints ID --rest`) against
//! the REST API of a real `cairn run --rest` process, of an in-process server with a fake
//! submitter (a stand-in coordinator), and of nothing at all.
//!
//! Nothing sleeps for synchronisation: every wait polls with a short backoff until a deadline.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn::runtime::{JobState, JobStatus};
use cairn_rest::{JobRegistry, JobSubmitter, SubmitRequest};
use common::Watched;

const DEADLINE: Duration = Duration::from_secs(30);
const TOKEN: &str = "t0ken-for-the-client-test";
const NO_SUBMISSIONS: &str =
    "error: this server does not accept job submissions (embedded mode); use 'cairn coordinator'";
const TOKEN_REQUIRED: &str = "error: the REST API requires a token (--rest-token)";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// What one client command produced.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// Asserts success; returns stdout.
    fn ok(&self) -> &str {
        assert_eq!(self.code, Some(0), "{self:#?}");
        &self.stdout
    }

    /// Asserts exit code 1 and exactly one non-empty stderr line; returns it.
    fn error_line(&self) -> &str {
        assert_eq!(self.code, Some(1), "{self:#?}");
        let lines: Vec<&str> = self
            .stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect();
        assert_eq!(lines.len(), 1, "one error line expected: {self:#?}");
        lines[0]
    }
}

/// Runs `cairn ARGS` to the end (every client command is bounded by its timeouts).
fn cairn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    let out = Command::new(env!("CARGO_BIN_EXE_cairn"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("cairn starts");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// `cairn CMD --rest URL [--rest-token TOKEN] ARGS..` (the options right after the command,
/// where `submit` needs them).
fn client(cmd: &[&str], url: &str, token: Option<&str>) -> Run {
    cairn(&with_rest(cmd, url, token))
}

fn with_rest<'a>(cmd: &[&'a str], url: &'a str, token: Option<&'a str>) -> Vec<&'a str> {
    let mut args = vec![cmd[0], "--rest", url];
    if let Some(t) = token {
        args.extend(["--rest-token", t]);
    }
    args.extend(&cmd[1..]);
    args
}

/// A `cairn run --rest 127.0.0.1:0` child process and the address its REST API listens on.
struct Cairn {
    process: Watched,
    addr: SocketAddr,
}

impl Cairn {
    /// A long wordcount with 100 ms checkpoints, serving its REST API on a port the system
    /// picks (read back from what the process prints).
    fn start(token: Option<&str>) -> Cairn {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cairn"));
        cmd.args([
            "run",
            "wordcount",
            "--generate",
            "300000000",
            "--keys",
            "1000",
            "--discard",
            "--checkpoint-interval",
            "100ms",
            "--rest",
            "127.0.0.1:0",
        ]);
        if let Some(t) = token {
            cmd.args(["--rest-token", t]);
        }
        let mut process = Watched::spawn(&mut cmd);
        let addr = process.rest_addr(Instant::now() + DEADLINE);
        Cairn { process, addr }
    }

    /// Waits for the process to exit; returns its status and stderr.
    fn wait(self) -> (ExitStatus, String) {
        self.process.wait(Instant::now() + DEADLINE)
    }

    /// Fails the test with the child's stderr if it has exited.
    fn assert_running(&mut self) {
        self.process.assert_running();
    }

    /// Polls the client command `cmd` until `done` finds what it waits for in its stdout.
    fn poll<T>(
        &mut self,
        cmd: &[&str],
        url: &str,
        token: Option<&str>,
        mut done: impl FnMut(&str) -> Option<T>,
    ) -> T {
        let mut backoff = Backoff::new(Instant::now() + DEADLINE);
        loop {
            self.assert_running();
            let run = client(cmd, url, token);
            if run.code == Some(0) {
                if let Some(v) = done(&run.stdout) {
                    return v;
                }
            }
            assert!(
                backoff.pause(),
                "`cairn {cmd:?}` did not succeed within {DEADLINE:?}; last: {run:#?}"
            );
        }
    }

    /// Waits until `cairn list` shows the job RUNNING; returns its id.
    fn running_job(&mut self, url: &str, token: Option<&str>) -> String {
        self.poll(&["list"], url, token, |out| {
            let fields: Vec<&str> = out.lines().next()?.split_whitespace().collect();
            (fields.get(1) == Some(&"RUNNING")).then(|| {
                assert_eq!(fields.len(), 3, "id, state, name: {out:?}");
                assert_eq!(fields[2], "wordcount", "{out:?}");
                fields[0].to_string()
            })
        })
    }
}

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

/// A socket bound to a port on 127.0.0.1 but not listening: connecting to it is refused, and
/// no other process can take the port while the socket lives (a port bound and released
/// could be).
fn refusing_addr() -> (socket2::Socket, SocketAddr) {
    let socket =
        socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).expect("socket");
    let any: SocketAddr = ([127, 0, 0, 1], 0).into();
    socket.bind(&any.into()).expect("bind an ephemeral port");
    let addr = socket
        .local_addr()
        .expect("local addr")
        .as_socket()
        .expect("an IP address");
    (socket, addr)
}

/// Asserts the run of a cancelled job failed with `error: job cancelled`.
fn assert_cancelled(run: Cairn) {
    let (status, stderr) = run.wait();
    assert!(!status.success(), "a cancelled job must fail the run");
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    assert_eq!(last, Some("error: job cancelled"), "stderr:\n{stderr}");
}

// ---------------------------------------------------------------------------------------------
// Against `cairn run --rest`
// ---------------------------------------------------------------------------------------------

#[test]
fn list_status_checkpoints_and_cancel_a_running_job() {
    let mut run = Cairn::start(None);
    let addr = run.addr;
    let url = format!("http://{addr}");

    let jid = run.running_job(&url, None);
    assert_eq!(jid.len(), 32, "job id {jid:?}");
    // HOST:PORT works as well as the URL.
    let out = client(&["list"], &addr.to_string(), None);
    assert!(out.ok().starts_with(&jid), "{out:#?}");

    let rows = run.poll(&["checkpoints", &jid], &url, None, |out| {
        let rows: Vec<String> = out
            .lines()
            .filter(|l| l.trim_end().ends_with("COMPLETED"))
            .map(str::to_string)
            .collect();
        (!rows.is_empty()).then(|| (out.to_string(), rows))
    });
    let (out, rows) = rows;
    assert!(out.starts_with(&format!("job {jid}: ")), "{out}");
    for column in [
        "ID",
        "SIZE",
        "DURATION",
        "SYNC MAX",
        "ASYNC MAX",
        "ALIGN MAX",
        "IN-FLIGHT",
        "UNALIGNED",
    ] {
        assert!(out.contains(column), "no {column} column in:\n{out}");
    }
    for row in &rows {
        let fields: Vec<&str> = row.split_whitespace().collect();
        assert!(fields[0].parse::<u64>().is_ok_and(|id| id >= 1), "{row}");
        assert_eq!(fields.iter().filter(|f| **f == "ms").count(), 4, "{row}");
        assert_eq!(fields[fields.len() - 2], "no", "aligned: {row}");
    }

    let out = client(&["status", &jid], &url, None);
    let text = out.ok();
    for line in [
        format!("job:         {jid}"),
        "name:        wordcount".into(),
        "state:       RUNNING".into(),
        "ended:       -".into(),
        "restarts:    0".into(),
        "failure:     -".into(),
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
    assert!(text.contains("UTC"), "{text}");
    let counts = text
        .lines()
        .find(|l| l.starts_with("checkpoints: "))
        .unwrap_or_else(|| panic!("no checkpoint counts in:\n{text}"));
    assert!(counts.contains(" completed, "), "{counts}");
    assert!(
        text.lines().any(|l| l.starts_with("latest:      #")),
        "{text}"
    );

    for cmd in [
        &["status", "nope"][..],
        &["checkpoints", "nope"],
        &["cancel", "nope"],
    ] {
        assert_eq!(
            client(cmd, &url, None).error_line(),
            "error: job nope not found"
        );
    }

    let out = client(
        &["submit", "wordcount", "--generate", "10", "--discard"],
        &url,
        None,
    );
    assert_eq!(out.error_line(), NO_SUBMISSIONS);

    let out = client(&["cancel", &jid], &url, None);
    assert_eq!(
        out.ok().lines().last(),
        Some(format!("cancellation of job {jid} requested").as_str())
    );
    assert_cancelled(run);
}

#[test]
fn a_token_protected_server_needs_the_token() {
    let mut run = Cairn::start(Some(TOKEN));
    let url = format!("http://{}", run.addr);
    let jid = run.running_job(&url, Some(TOKEN));

    for cmd in [
        &["list"][..],
        &["status", &jid],
        &["checkpoints", &jid],
        &["cancel", &jid],
        &["submit", "wordcount"],
    ] {
        assert_eq!(client(cmd, &url, None).error_line(), TOKEN_REQUIRED);
        let line = client(cmd, &url, Some("wrong")).error_line().to_string();
        assert_eq!(
            line,
            format!("error: the REST API at {url} rejected the token given with --rest-token")
        );
    }
    run.assert_running();
    client(&["status", &jid], &url, Some(TOKEN)).ok();
    assert_eq!(
        client(&["submit", "wordcount"], &url, Some(TOKEN)).error_line(),
        NO_SUBMISSIONS
    );
    client(&["cancel", &jid], &url, Some(TOKEN)).ok();
    assert_cancelled(run);
}

// ---------------------------------------------------------------------------------------------
// Against a stand-in coordinator: the REST server with a fake submitter
// ---------------------------------------------------------------------------------------------

const FAKE_JID: &str = "c0ffee00c0ffee00c0ffee00c0ffee00";

/// Accepts `wordcount` only, records the requests, registers the job as a coordinator would.
struct FakeSubmitter {
    registry: JobRegistry,
    calls: Mutex<Vec<SubmitRequest>>,
}

impl JobSubmitter for FakeSubmitter {
    fn submit(&self, request: SubmitRequest) -> Result<String, String> {
        let job = request.job.clone();
        self.calls
            .lock()
            .map_err(|_| "poisoned".to_string())?
            .push(request);
        if job != "wordcount" {
            return Err(format!("unknown job '{job}'"));
        }
        let status = JobStatus::new(FAKE_JID.into(), job, Vec::new());
        status.set_state(JobState::Running);
        self.registry.register(status);
        Ok(FAKE_JID.into())
    }
}

#[test]
fn submit_sends_the_jobs_typed_parameters_and_options_as_json_and_prints_the_job_id() {
    let registry = JobRegistry::new();
    let fake = Arc::new(FakeSubmitter {
        registry: registry.clone(),
        calls: Mutex::new(Vec::new()),
    });
    registry.set_submitter(fake.clone());
    let srv = cairn_rest::serve(
        "127.0.0.1:0".parse().expect("address"),
        registry,
        Some(TOKEN.into()),
    )
    .expect("server starts");
    let url = format!("http://{}", srv.local_addr());

    // The job's flags are parsed here by the job's own parameter type; the run options become
    // configuration keys; --rest and --rest-token may stand before or after the job.
    let out = cairn(&[
        "submit",
        "--rest",
        &url,
        "wordcount",
        "--generate",
        "10",
        "--keys",
        "3",
        "--output",
        "/x y/ü",
        "-p",
        "2",
        "-D",
        "state.checkpoints.num-retained=3",
        "--seed",
        "7",
        "--rest-token",
        TOKEN,
    ]);
    assert_eq!(out.ok().lines().last(), Some(FAKE_JID), "{out:#?}");
    let calls = fake.calls.lock().expect("lock").clone();
    assert_eq!(calls.len(), 1);
    let request = &calls[0];
    assert_eq!(request.job, "wordcount");
    assert_eq!(request.args, None);
    let params = request.params.clone().unwrap_or_default();
    assert_eq!(params["generate"], 10);
    assert_eq!(params["keys"], 3);
    assert_eq!(params["output"], "/x y/ü");
    assert_eq!(params["discard"], false);
    assert_eq!(
        request
            .config
            .get("parallelism.default")
            .map(String::as_str),
        Some("2")
    );
    assert_eq!(
        request
            .config
            .get("state.checkpoints.num-retained")
            .map(String::as_str),
        Some("3")
    );
    assert_eq!(request.seed, Some(7));

    // The submitted job is listed and has a status.
    let out = client(&["list"], &url, Some(TOKEN));
    assert_eq!(
        out.ok().lines().collect::<Vec<_>>(),
        [format!("{FAKE_JID}  RUNNING     wordcount")]
    );
    let out = client(&["status", FAKE_JID], &url, Some(TOKEN));
    assert!(out.ok().contains("state:       RUNNING"), "{out:#?}");
    let out = client(&["checkpoints", FAKE_JID], &url, Some(TOKEN));
    assert!(out.ok().contains("no completed checkpoints"), "{out:#?}");

    // Relative paths are the client's: sent absolute, against its current directory (that of
    // the test); `latest` and URLs as they are.
    let cwd = std::env::current_dir().expect("a current directory");
    let out = cairn(&[
        "submit",
        "--rest",
        &url,
        "--rest-token",
        TOKEN,
        "wordcount",
        "--input",
        "words.txt",
        "--output",
        "out",
        "--from",
        "ck/chk-1",
        "-D",
        "state.savepoints.dir=sp",
        "-D",
        "state.checkpoints.dir=s3://bucket/ck",
    ]);
    assert_eq!(out.ok().lines().last(), Some(FAKE_JID), "{out:#?}");
    let request = fake.calls.lock().expect("lock")[1].clone();
    let params = request.params.clone().unwrap_or_default();
    let under_cwd = |p: &str| cwd.join(p).display().to_string();
    assert_eq!(params["input"], under_cwd("words.txt"));
    assert_eq!(params["output"], under_cwd("out"));
    assert_eq!(request.from, Some(under_cwd("ck/chk-1")));
    let key = |k: &str| request.config.get(k).cloned();
    assert_eq!(key("state.savepoints.dir"), Some(under_cwd("sp")));
    assert_eq!(
        key("state.checkpoints.dir").as_deref(),
        Some("s3://bucket/ck")
    );
    let out = cairn(&[
        "submit",
        "--rest",
        &url,
        "--rest-token",
        TOKEN,
        "wordcount",
        "--generate",
        "1",
        "--discard",
        "--from",
        "latest",
    ]);
    assert_eq!(out.ok().lines().last(), Some(FAKE_JID), "{out:#?}");
    let request = fake.calls.lock().expect("lock")[2].clone();
    assert_eq!(request.from.as_deref(), Some("latest"));

    // A refusal of the coordinator is its message, and a non-zero exit.
    let out = client(
        &["submit", "pipelines", "--generate", "1", "--discard"],
        &url,
        Some(TOKEN),
    );
    assert_eq!(out.error_line(), "error: unknown job 'pipelines'");
    // A job this binary does not have is refused before anything is sent.
    let out = client(&["submit", "nope", "--x"], &url, Some(TOKEN));
    assert_eq!(
        out.error_line(),
        "error: unknown job 'nope'; jobs: sql, wordcount, backpressure, pipelines, nexmark"
    );
    // A parameter of another job, or a misspelt option, is clap's error (exit 2).
    let out = cairn(&["submit", "--rest", &url, "wordcount", "--query", "q1"]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(
        out.stderr.contains("unexpected argument '--query'"),
        "{out:#?}"
    );
    let out = cairn(&["submit", "--rest", &url, "--rest-tokn", TOKEN, "wordcount"]);
    assert_eq!(out.code, Some(2), "{out:#?}");
    assert!(out.stderr.contains("--rest-tokn"), "{out:#?}");
    assert_eq!(fake.calls.lock().expect("lock").len(), 4);
}

// ---------------------------------------------------------------------------------------------
// Nothing there, something else there, bad arguments
// ---------------------------------------------------------------------------------------------

/// Every client command.
const EVERY_COMMAND: &[&[&str]] = &[
    &["list"],
    &["status", "abc"],
    &["cancel", "abc"],
    &["checkpoints", "abc"],
    &["submit", "wordcount", "--generate", "10", "--discard"],
];

#[test]
fn every_client_command_says_when_the_coordinator_cannot_be_reached() {
    let (_reserved, addr) = refusing_addr();
    for (url, shown) in [
        (format!("http://{addr}"), format!("http://{addr}")),
        (addr.to_string(), format!("http://{addr}")),
        (format!("https://{addr}"), format!("https://{addr}")),
    ] {
        for cmd in EVERY_COMMAND {
            let out = client(cmd, &url, None);
            assert_eq!(
                out.error_line(),
                format!("error: cannot reach coordinator at {shown}: Connection refused"),
                "{cmd:?}"
            );
        }
    }
    // A name that does not resolve (RFC 6761: `.invalid` never does).
    let out = client(&["list"], "http://cairn-test.invalid:8081", None);
    assert!(
        out.error_line()
            .starts_with("error: cannot reach coordinator at http://cairn-test.invalid:8081: "),
        "{out:#?}"
    );
}

#[test]
fn https_to_a_server_that_speaks_plain_http_is_a_tls_error() {
    let srv = cairn_rest::serve(
        "127.0.0.1:0".parse().expect("address"),
        JobRegistry::new(),
        None,
    )
    .expect("server starts");
    let url = format!("https://{}", srv.local_addr());
    let line = client(&["list"], &url, None).error_line().to_string();
    assert!(
        line.starts_with(&format!("error: TLS with coordinator at {url} failed")),
        "{line}"
    );
    // The same server over http answers.
    let out = client(&["list"], &format!("http://{}", srv.local_addr()), None);
    out.ok();
    assert!(out.stderr.starts_with("no jobs at http://"), "{out:#?}");
}

#[test]
fn something_that_is_not_the_rest_api() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr");
    // Answers the first connection with something that is not HTTP, then holds every later one
    // open without a word.
    let server = std::thread::spawn(move || {
        let mut held = Vec::new();
        for (i, conn) in listener.incoming().enumerate() {
            let Ok(mut conn) = conn else { return held };
            if i == 0 {
                // Reads the request first, so that closing does not reset the connection.
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let _ = conn.write_all(b"SSH-2.0-OpenSSH_9.6\r\n");
            } else {
                held.push(conn);
                return held;
            }
        }
        held
    });
    let url = format!("http://{addr}");
    let out = client(&["list"], &url, None);
    assert_eq!(
        out.error_line(),
        format!("error: unexpected answer from coordinator at {url}: not an HTTP answer")
    );
    // The client's own timer ends the wait, and says so: no wall-clock bound needed here.
    let out = client(&["list"], &url, None);
    assert_eq!(
        out.error_line(),
        format!("error: no answer from coordinator at {url} within 5s")
    );
    drop(server.join());
}

#[test]
fn bad_rest_arguments_are_one_line_errors() {
    for cmd in EVERY_COMMAND {
        let out = client(cmd, "ftp://127.0.0.1:8081", None);
        assert!(
            out.error_line()
                .contains("got 'ftp://127.0.0.1:8081': unsupported scheme 'ftp'"),
            "{cmd:?}: {out:#?}"
        );
        let out = client(cmd, "localhost", None);
        assert!(
            out.error_line().starts_with(
                "error: --rest expects http://HOST:PORT, https://HOST:PORT, HOST:PORT or PORT (e.g. http://127.0.0.1:8081), got 'localhost'"
            ),
            "{cmd:?}: {out:#?}"
        );
    }
    let out = cairn(&["list", "--rest-token", ""]);
    assert_eq!(out.error_line(), "error: --rest-token must not be empty");
    // Without --rest, `checkpoints` still reads a directory.
    let out = cairn(&["checkpoints", "/nonexistent/cairn-ckpt"]);
    assert_eq!(
        out.error_line(),
        "error: checkpoint directory /nonexistent/cairn-ckpt does not exist"
    );
}
