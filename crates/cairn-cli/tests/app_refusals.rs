//! A cluster of binaries that are not all the same (issue 22, point 3): the coordinator
//! refuses at submit a job it does not have and parameters that do not validate; a worker
//! whose binary lacks the job, or builds another graph from the same parameters, is refused
//! before any subtask starts and the job fails with that cause; a damaged `_job` record is
//! refused with its path. The other binary is the example `mismatched`
//! (`crates/cairn-cli/examples/mismatched.rs`), which `cargo test` builds.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use common::*;

const DEADLINE: Duration = Duration::from_secs(60);

/// The example binary next to `cairn` (target/<profile>/examples/mismatched).
fn mismatched() -> Command {
    let cairn = PathBuf::from(env!("CARGO_BIN_EXE_cairn"));
    let exe = cairn
        .parent()
        .map(|d| d.join("examples").join("mismatched"))
        .unwrap_or_default();
    assert!(
        exe.is_file(),
        "{} is missing: build the examples too (`cargo test` does; `cargo build --profile ci --examples -p cairn-cli`)",
        exe.display()
    );
    Command::new(exe)
}

/// stderr's single error line of a command that must exit with 1.
fn one_error_line(out: &Output) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line expected: {stderr}");
    lines[0].to_string()
}

/// `POST /jobs` with `body`; the status code and the body of the answer.
fn post_job(rest: SocketAddr, body: &str) -> (u16, String) {
    let mut s = TcpStream::connect(rest).expect("connect to the REST API");
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "POST /jobs HTTP/1.1\r\nHost: {rest}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (status, body)
}

/// `cairn status ID`'s field `key` (e.g. `state`, `failure`).
fn status_field(rest: SocketAddr, jid: &str, key: &str) -> String {
    let out = run_ok(cairn().args(["status", jid, "--rest", &rest.to_string()]));
    let prefix = format!("{key}:");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&prefix).map(|v| v.trim().to_string()))
        .unwrap_or_default()
}

/// Job directories the coordinator recorded under `ck`.
fn recorded_jobs(ck: &Path) -> usize {
    std::fs::read_dir(ck)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("_job").exists())
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn a_job_or_parameters_the_coordinator_cannot_build_are_refused_at_submit() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let c = Cluster::start(&ck, 0, Instant::now() + DEADLINE);
    let rest = c.rest.to_string();

    // A job only the submitting binary has: the coordinator (cairn) refuses it.
    let out = mismatched()
        .args(["submit", "--rest", &rest, "only-here", "--generate", "10"])
        .output()
        .unwrap();
    assert_eq!(
        one_error_line(&out),
        "error: unknown job 'only-here'; jobs: sql, wordcount, backpressure, pipelines, nexmark"
    );

    // Parameters the job refuses, checked by the coordinator as `run` checks them.
    let out = cairn()
        .args([
            "submit",
            "--rest",
            &rest,
            "wordcount",
            "--keys",
            "0",
            "--generate",
            "5",
        ])
        .output()
        .unwrap();
    assert_eq!(one_error_line(&out), "error: --keys must be at least 1");
    let out = cairn()
        .args(["submit", "--rest", &rest, "wordcount"])
        .output()
        .unwrap();
    assert_eq!(
        one_error_line(&out),
        "error: wordcount needs --input FILE, --generate N or --kafka-input TOPIC"
    );
    // A value of the wrong type is the job's own flag parser's error (clap, exit 2).
    let out = cairn()
        .args(["submit", "--rest", &rest, "wordcount", "--generate", "ten"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("'ten'"));

    // The same through the REST API, with the parameters as JSON.
    let refused = [
        (r#"{"job": "nope", "params": {}}"#, "unknown job 'nope'"),
        (
            r#"{"job": "wordcount", "params": {"generate": "ten"}}"#,
            "invalid parameters for job 'wordcount'",
        ),
        (
            r#"{"job": "wordcount", "params": {"generat": 10}}"#,
            "unknown field `generat`",
        ),
        (
            r#"{"job": "wordcount", "params": {"generate": 10, "input": "/x"}}"#,
            "--input and --generate exclude each other",
        ),
        (
            r#"{"job": "wordcount", "args": ["--generate", "10", "--bogus"]}"#,
            "unexpected argument '--bogus'",
        ),
        (
            r#"{"job": "wordcount", "params": {"generate": 10, "output": "/x"}, "config": {"parallelism.default": "0"}}"#,
            "parallelism.default",
        ),
        // Without an output it would print on a worker's stdout (the client refuses it too,
        // when it can build the job).
        (
            r#"{"job": "wordcount", "params": {"generate": 10}}"#,
            "would print its output",
        ),
    ];
    for (body, message) in refused {
        let (status, answer) = post_job(c.rest, body);
        assert_eq!(status, 400, "{body}: {answer}");
        assert!(answer.contains(message), "{body}: {answer}");
    }
    assert_eq!(
        recorded_jobs(&ck),
        0,
        "a refused submission must record nothing"
    );
}

/// Starts a cluster of a `cairn` coordinator and one worker of the `mismatched` binary.
fn mixed_cluster(ck: &Path) -> (Cluster, Watched) {
    let c = Cluster::start(ck, 0, Instant::now() + DEADLINE);
    let worker = Watched::spawn(
        mismatched()
            .args(["worker", "--coordinator", &c.bind, "--slots", "2"])
            .env("RUST_LOG", "info"),
    );
    (c, worker)
}

/// Submits `job` to `c`, waits until it FAILED, returns its failure cause.
fn failure_of(c: &mut Cluster, worker: &mut Watched, job: &[&str]) -> String {
    let rest = c.rest;
    let jid = submit(rest, None, job);
    let deadline = Instant::now() + DEADLINE;
    worker.wait_until("the job to fail", deadline, || {
        status_field(rest, &jid, "state") == "FAILED"
    });
    c.coordinator.assert_running();
    status_field(rest, &jid, "failure")
}

#[test]
fn a_worker_without_the_job_or_with_another_graph_is_refused_before_any_subtask_starts() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (mut c, mut worker) = mixed_cluster(&ck);
    worker.wait_for_line_containing("registered with the coordinator", Instant::now() + DEADLINE);

    let cause = failure_of(
        &mut c,
        &mut worker,
        &["nexmark", "--query", "q0", "--events", "1000", "--discard"],
    );
    assert!(
        cause.contains("has no job 'nexmark'"),
        "the failure must name the missing job: {cause}"
    );
    let cause = failure_of(
        &mut c,
        &mut worker,
        &["wordcount", "--generate", "1000", "--discard", "-p", "2"],
    );
    assert!(
        cause.contains("builds a different graph for job 'wordcount'"),
        "the failure must name the graph mismatch: {cause}"
    );
    let log = worker.stderr_so_far();
    assert!(
        !log.contains("running attempt"),
        "no subtask may start on a refusing worker:\n{log}"
    );
    assert!(log.contains("refusing job"), "{log}");
}

#[test]
fn a_damaged_job_record_is_refused_with_its_path_and_not_resumed() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let job_dir = ck.join("0123456789abcdef0123456789abcdef");
    std::fs::create_dir_all(&job_dir).unwrap();
    let record = job_dir.join("_job");
    std::fs::write(&record, b"{\"submission\": {\"job\": \"wordcount\", \"par").unwrap();
    let mut c = Cluster::start(&ck, 0, Instant::now() + DEADLINE);
    // Recorded jobs are read before the coordinator says it listens.
    let stderr = c.coordinator.stderr_so_far();
    let line = stderr
        .lines()
        .find(|l| l.contains("damaged job record"))
        .unwrap_or_else(|| panic!("no refusal of the damaged record:\n{stderr}"));
    let canonical = record.canonicalize().unwrap();
    assert!(
        line.contains(&canonical.display().to_string()),
        "the refusal must name the record's path: {line}"
    );
    let out = run_ok(cairn().args(["list", "--rest", &c.rest.to_string()]));
    assert!(
        String::from_utf8_lossy(&out.stdout).trim().is_empty(),
        "a job with a damaged record must not be resumed"
    );
    assert_eq!(
        std::fs::read(&record).unwrap().len(),
        40,
        "the record is left as it was"
    );
}
