//! Cluster mode end to end: a coordinator and workers as real processes on 127.0.0.1, a job
//! whose data crosses the network, workers and the coordinator killed with SIGKILL, and the
//! exactly-once property of the committed output.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cairn ARGS`, its stderr appended to `log` (several processes share one log).
fn spawn(args: &[String], log: &Path) -> Proc {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Proc(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    )
}

fn coordinator_with(bind: u16, rest: u16, dir: &Path, log: &Path, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = vec![
        "coordinator".into(),
        "--bind".into(),
        format!("127.0.0.1:{bind}"),
        "--rest".into(),
        format!("127.0.0.1:{rest}"),
        "--checkpoint-dir".into(),
        dir.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn(&args, log)
}

fn coordinator(bind: u16, rest: u16, dir: &Path, log: &Path) -> Proc {
    coordinator_with(bind, rest, dir, log, &[])
}

fn worker_with(bind: u16, log: &Path, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = vec![
        "worker".into(),
        "--coordinator".into(),
        format!("127.0.0.1:{bind}"),
        "--slots".into(),
        "2".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn(&args, log)
}

fn worker(bind: u16, log: &Path) -> Proc {
    worker_with(bind, log, &[])
}

fn http_get(port: u16, path: &str) -> Option<String> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())
}

/// Polls until `f` returns Some, with a deadline; on timeout shows the cluster's log.
fn wait_for<T>(what: &str, log: &Path, deadline: Duration, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + deadline;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "timed out waiting for {what}; log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::park_timeout(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

fn job_state(rest: u16, jid: &str) -> Option<String> {
    let body = http_get(rest, &format!("/jobs/{jid}"))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    v["state"].as_str().map(str::to_string)
}

fn completed_checkpoints(rest: u16, jid: &str) -> u64 {
    http_get(rest, &format!("/jobs/{jid}/checkpoints"))
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| v["counts"]["completed"].as_u64())
        .unwrap_or(0)
}

fn submit(rest: u16, args: &[&str]) -> String {
    let out = run_ok(
        cairn()
            .args([
                "submit",
                "--rest",
                &format!("http://127.0.0.1:{rest}"),
                "backpressure",
            ])
            .args(args),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn backpressure_expected(records: u64, keys: u64) -> HashMap<String, u64> {
    let mut expected = HashMap::new();
    for i in 0..records {
        *expected
            .entry(format!("k{}", i.wrapping_mul(7919) % keys))
            .or_insert(0u64) += 1;
    }
    for i in 0..records / 10 {
        *expected
            .entry(format!("k{}", i.wrapping_mul(104_729) % keys))
            .or_insert(0u64) += 1;
    }
    expected
}

const JOB_FLAGS: [&str; 14] = [
    "-p",
    "4",
    "--keys",
    "500",
    "--sink-rate",
    "150000",
    "--checkpoint-interval",
    "50ms",
    "-D",
    "restart-strategy.type=fixed-delay",
    "-D",
    "restart-strategy.fixed-delay.attempts=100",
    "-D",
    "restart-strategy.fixed-delay.delay=0ms",
];

#[test]
fn workers_killed_with_sigkill_keep_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest) = (free_port(), free_port());
    let log = tmp.path().join("cluster.log");
    let _c = coordinator(bind, rest, &tmp.path().join("ck"), &log);
    let mut workers = vec![worker(bind, &log), worker(bind, &log)];
    let records = 500_000u64;
    let out_dir = tmp.path().join("out");
    let mut args: Vec<String> = JOB_FLAGS.iter().map(|s| s.to_string()).collect();
    args.extend([
        "--generate".into(),
        records.to_string(),
        "--output".into(),
        out_dir.display().to_string(),
    ]);
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    wait_for(
        "the coordinator's REST API",
        &log,
        Duration::from_secs(20),
        || http_get(rest, "/jobs").map(|_| ()),
    );
    let jid = submit(rest, &argv);
    assert_eq!(jid.len(), 32, "job id: {jid}");
    let mut kills = 0;
    for round in 0..3 {
        // Let the job make progress (a checkpoint completes), then kill a worker mid-run.
        let before = completed_checkpoints(rest, &jid);
        wait_for("a checkpoint", &log, Duration::from_secs(30), || {
            let state = job_state(rest, &jid)?;
            if state == "FINISHED" {
                return Some(());
            }
            (completed_checkpoints(rest, &jid) > before && state == "RUNNING").then_some(())
        });
        if job_state(rest, &jid).as_deref() == Some("FINISHED") {
            break;
        }
        let victim = workers.remove(round % workers.len());
        drop(victim); // SIGKILL
        kills += 1;
        workers.push(worker(bind, &log));
    }
    wait_for("the job to finish", &log, Duration::from_secs(90), || {
        let s = job_state(rest, &jid)?;
        assert_ne!(
            s,
            "FAILED",
            "job failed: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        (s == "FINISHED").then_some(())
    });
    assert!(
        kills >= 2,
        "the job finished after only {kills} worker kills"
    );
    let restarts = http_get(rest, &format!("/jobs/{jid}"))
        .and_then(|b| serde_json::from_str::<serde_json::Value>(&b).ok())
        .and_then(|v| v["restarts"].as_u64())
        .unwrap_or(0);
    assert!(
        restarts >= kills as u64,
        "{restarts} restarts for {kills} kills"
    );
    assert_exactly_once(&out_dir, &backpressure_expected(records, 500));
    assert_no_leftovers(&out_dir);
}

#[test]
fn a_restarted_coordinator_resumes_its_jobs_from_the_checkpoint_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest) = (free_port(), free_port());
    let log = tmp.path().join("cluster.log");
    let ck = tmp.path().join("ck");
    let coord = coordinator(bind, rest, &ck, &log);
    let _workers = [worker(bind, &log), worker(bind, &log)];
    let records = 400_000u64;
    let out_dir = tmp.path().join("out");
    let mut args: Vec<String> = JOB_FLAGS.iter().map(|s| s.to_string()).collect();
    args.extend([
        "--generate".into(),
        records.to_string(),
        "--output".into(),
        out_dir.display().to_string(),
    ]);
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    wait_for(
        "the coordinator's REST API",
        &log,
        Duration::from_secs(20),
        || http_get(rest, "/jobs").map(|_| ()),
    );
    let jid = submit(rest, &argv);
    wait_for("two checkpoints", &log, Duration::from_secs(30), || {
        (completed_checkpoints(rest, &jid) >= 2).then_some(())
    });
    assert_eq!(job_state(rest, &jid).as_deref(), Some("RUNNING"));
    drop(coord); // SIGKILL
    let _coord2 = coordinator(bind, rest, &ck, &log);
    wait_for(
        "the resumed job to finish",
        &log,
        Duration::from_secs(90),
        || {
            let s = job_state(rest, &jid)?;
            assert_ne!(
                s,
                "FAILED",
                "job failed: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            (s == "FINISHED").then_some(())
        },
    );
    assert_exactly_once(&out_dir, &backpressure_expected(records, 500));
    assert_no_leftovers(&out_dir);
}

#[test]
fn a_worker_with_the_wrong_secret_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest) = (free_port(), free_port());
    let log = tmp.path().join("c.log");
    let _c = coordinator(bind, rest, &tmp.path().join("ck"), &log);
    wait_for(
        "the coordinator's REST API",
        &log,
        Duration::from_secs(20),
        || http_get(rest, "/jobs").map(|_| ()),
    );
    let out = cairn()
        .args([
            "worker",
            "--coordinator",
            &format!("127.0.0.1:{bind}"),
            "--secret",
            "wrong",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .trim_end()
            .lines()
            .last()
            .unwrap_or_default()
            .contains("rejected this worker: wrong cluster secret"),
        "{stderr}"
    );
}

#[test]
fn garbage_and_oversized_frames_close_the_connection_but_not_the_process() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest) = (free_port(), free_port());
    let log = tmp.path().join("c.log");
    let _c = coordinator(bind, rest, &tmp.path().join("ck"), &log);
    wait_for(
        "the coordinator's REST API",
        &log,
        Duration::from_secs(20),
        || http_get(rest, "/jobs").map(|_| ()),
    );
    let _w = worker(bind, &log);
    // Garbage, an oversized length prefix, and a frame of another version, each on its own connection.
    for junk in [
        b"hello world, not a frame".to_vec(),
        u32::MAX.to_le_bytes().to_vec(),
        vec![2, 0, 0, 0, 99, 0],
    ] {
        let mut s = TcpStream::connect(("127.0.0.1", bind)).unwrap();
        s.write_all(&junk).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest_of = Vec::new();
        let _ = s.read_to_end(&mut rest_of); // closed by the coordinator
    }
    // The coordinator is alive and still runs jobs.
    let out_dir = tmp.path().join("out");
    let _w2 = worker(bind, &log);
    let jid = run_ok(
        cairn()
            .args([
                "submit",
                "--rest",
                &format!("http://127.0.0.1:{rest}"),
                "wordcount",
                "-p",
                "4",
            ])
            .args(["--generate", "100000", "--keys", "100", "--output"])
            .arg(&out_dir),
    );
    let jid = String::from_utf8_lossy(&jid.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    wait_for("the job to finish", &log, Duration::from_secs(60), || {
        (job_state(rest, &jid)? == "FINISHED").then_some(())
    });
    assert_exactly_once(&out_dir, &generated_counts(100_000, 100));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("closed"),
        "no log line about the closed connections: {text}"
    );
}

fn writer_instances(dir: &Path) -> usize {
    let mut tokens = std::collections::HashSet::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') {
            if let Some(token) = name.split('-').nth(1) {
                tokens.insert(token.to_string());
            }
        }
    }
    tokens.len()
}

#[test]
fn region_failover_in_a_cluster_keeps_the_other_pipeline_running() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest) = (free_port(), free_port());
    let log = tmp.path().join("cluster.log");
    let _c = coordinator(bind, rest, &tmp.path().join("ck"), &log);
    let _workers = [worker(bind, &log), worker(bind, &log)];
    wait_for(
        "the coordinator's REST API",
        &log,
        Duration::from_secs(20),
        || http_get(rest, "/jobs").map(|_| ()),
    );
    let out_dir = tmp.path().join("out");
    let (count, keys) = (400_000u64, 1_000u64);
    let out = run_ok(
        cairn()
            .args([
                "submit",
                "--rest",
                &format!("http://127.0.0.1:{rest}"),
                "pipelines",
                "-p",
                "4",
            ])
            .args([
                "--generate",
                &count.to_string(),
                "--keys",
                &keys.to_string(),
                "--output",
            ])
            .arg(&out_dir)
            .args([
                "--checkpoint-interval",
                "20ms",
                "--inject-failures",
                "2",
                "--seed",
                "3",
                "--inject-uid",
                "a-",
            ])
            .args([
                "-D",
                "restart-strategy.type=fixed-delay",
                "-D",
                "restart-strategy.fixed-delay.attempts=100",
            ])
            .args([
                "-D",
                "restart-strategy.fixed-delay.delay=0ms",
                "-D",
                "jobmanager.execution.failover-strategy=region",
            ]),
    );
    let jid = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    wait_for("the job to finish", &log, Duration::from_secs(90), || {
        let s = job_state(rest, &jid)?;
        assert_ne!(
            s,
            "FAILED",
            "job failed: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        (s == "FINISHED").then_some(())
    });
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("restarting that region only"),
        "no region restart: {text}"
    );
    let expected = generated_counts(count, keys);
    assert_exactly_once(&out_dir.join("a"), &expected);
    assert_exactly_once(&out_dir.join("b"), &expected);
    assert_eq!(
        writer_instances(&out_dir.join("b")),
        4,
        "pipeline b was restarted"
    );
}

#[test]
fn garbage_on_a_worker_data_port_is_refused_and_the_worker_keeps_working() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest, data) = (free_port(), free_port(), free_port());
    let log = tmp.path().join("c.log");
    let _c = coordinator(bind, rest, &tmp.path().join("ck"), &log);
    wait_for(
        "the coordinator's REST API",
        &log,
        Duration::from_secs(20),
        || http_get(rest, "/jobs").map(|_| ()),
    );
    let data_bind = format!("127.0.0.1:{data}");
    let _w1 = worker_with(bind, &log, &["--data-bind", &data_bind]);
    let _w2 = worker(bind, &log);
    wait_for("the data port", &log, Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.1", data)).ok()
    });
    for junk in [
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        u32::MAX.to_le_bytes().to_vec(),
        vec![3, 0, 0, 0, 1, 0, 0],
    ] {
        let mut s = TcpStream::connect(("127.0.0.1", data)).unwrap();
        s.write_all(&junk).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut rest_of = Vec::new();
        let _ = s.read_to_end(&mut rest_of);
    }
    let out_dir = tmp.path().join("out");
    let out = run_ok(
        cairn()
            .args([
                "submit",
                "--rest",
                &format!("http://127.0.0.1:{rest}"),
                "wordcount",
                "-p",
                "4",
            ])
            .args(["--generate", "200000", "--keys", "100", "--output"])
            .arg(&out_dir),
    );
    let jid = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    wait_for("the job to finish", &log, Duration::from_secs(60), || {
        (job_state(rest, &jid)? == "FINISHED").then_some(())
    });
    assert_exactly_once(&out_dir, &generated_counts(200_000, 100));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.matches("data connection from").count() >= 3, "{text}");
}

#[test]
fn a_silent_worker_is_declared_dead_by_its_missing_heartbeats() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest) = (free_port(), free_port());
    let log = tmp.path().join("c.log");
    let _c = coordinator_with(
        bind,
        rest,
        &tmp.path().join("ck"),
        &log,
        &["--heartbeat-timeout", "1s"],
    );
    let w = worker(bind, &log);
    wait_for(
        "the worker to register",
        &log,
        Duration::from_secs(20),
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|t| t.contains("registered from"))
                .map(|_| ())
        },
    );
    // SIGSTOP: the process and its connection stay, only the heartbeats stop.
    let pid = w.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-STOP", &pid])
        .status()
        .unwrap()
        .success());
    let stopped = Instant::now();
    wait_for(
        "the worker to be declared dead",
        &log,
        Duration::from_secs(10),
        || {
            std::fs::read_to_string(&log)
                .ok()
                .filter(|t| t.contains("missed its heartbeats"))
                .map(|_| ())
        },
    );
    let detected = stopped.elapsed();
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    assert!(
        detected < Duration::from_secs(3),
        "detection took {detected:?}"
    );
}

#[test]
fn the_coordinator_rest_api_requires_its_token() {
    let tmp = tempfile::tempdir().unwrap();
    let (bind, rest) = (free_port(), free_port());
    let _c = coordinator_with(
        bind,
        rest,
        &tmp.path().join("ck"),
        &tmp.path().join("c.log"),
        &["--rest-token", "s3cret"],
    );
    let log = tmp.path().join("none.log");
    let status_of = |token: Option<&str>| -> Option<String> {
        let mut s = TcpStream::connect(("127.0.0.1", rest)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        write!(
            s,
            "GET /jobs HTTP/1.1\r\nHost: x\r\n{auth}Connection: close\r\n\r\n"
        )
        .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        out.lines().next().map(str::to_string)
    };
    let first = wait_for("the REST API", &log, Duration::from_secs(20), || {
        status_of(None)
    });
    assert!(first.contains("401"), "{first}");
    assert!(status_of(Some("wrong")).unwrap_or_default().contains("401"));
    assert!(status_of(Some("s3cret"))
        .unwrap_or_default()
        .contains("200"));
}
