//! Cluster mode end to end: a coordinator and workers as real processes on 127.0.0.1, a job
//! whose data crosses the network, workers and the coordinator killed with SIGKILL, and the
//! exactly-once property of the committed output.

mod common;

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `cairn ARGS` with extra environment variables, its stderr appended to `log` (several
/// processes share one log).
fn spawn(args: &[String], log: &Path, env: &[(&str, String)]) -> Proc {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Proc(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .unwrap(),
    )
}

/// A coordinator process and the ports it listens on.
struct Coord {
    _proc: Proc,
    bind: u16,
    rest: u16,
}

/// The `(workers port, REST port)` of every "coordinator listening" line in `log`.
fn listening_lines(log: &Path) -> Vec<(u16, u16)> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once("coordinator listening for workers on ")?;
            let (workers, rest) = rest.split_once(", REST API on http://")?;
            let port = |a: &str| {
                a.trim()
                    .parse::<std::net::SocketAddr>()
                    .ok()
                    .map(|a| a.port())
            };
            Some((port(workers)?, port(rest)?))
        })
        .collect()
}

/// Starts a coordinator on `bind` and `rest` (port 0: one the system picks) and waits for the
/// line saying where it listens; its REST API answers from then on.
fn coordinator_on(
    bind: &str,
    rest: &str,
    dir: &Path,
    log: &Path,
    extra: &[&str],
    env: &[(&str, String)],
) -> Coord {
    let before = listening_lines(log).len();
    let mut args: Vec<String> = vec![
        "coordinator".into(),
        "--bind".into(),
        bind.into(),
        "--rest".into(),
        rest.into(),
        "--checkpoint-dir".into(),
        dir.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let proc = spawn(&args, log, env);
    let (bind, rest) = wait_for(
        "the coordinator to listen",
        log,
        Duration::from_secs(20),
        || listening_lines(log).get(before).copied(),
    );
    Coord {
        _proc: proc,
        bind,
        rest,
    }
}

fn coordinator_with(dir: &Path, log: &Path, extra: &[&str]) -> Coord {
    coordinator_on("127.0.0.1:0", "127.0.0.1:0", dir, log, extra, &[])
}

/// A coordinator on the ports a killed one had: the workers reconnect to that address.
fn coordinator_again(bind: u16, rest: u16, dir: &Path, log: &Path) -> Coord {
    coordinator_on(
        &format!("127.0.0.1:{bind}"),
        &format!("127.0.0.1:{rest}"),
        dir,
        log,
        &[],
        &[],
    )
}

/// Waits until job `jid` of `coord` finished (the test fails if it failed).
fn wait_until_finished(coord: &Coord, jid: &str, log: &Path) {
    wait_for(
        "the resumed job to finish",
        log,
        Duration::from_secs(90),
        || (assert_job_not_failed(coord.rest, jid, log)? == "FINISHED").then_some(()),
    );
}

fn coordinator(dir: &Path, log: &Path) -> Coord {
    coordinator_with(dir, log, &[])
}

fn worker_with(bind: u16, log: &Path, extra: &[&str], env: &[(&str, String)]) -> Proc {
    let mut args: Vec<String> = vec![
        "worker".into(),
        "--coordinator".into(),
        format!("127.0.0.1:{bind}"),
        "--slots".into(),
        "2".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    spawn(&args, log, env)
}

fn worker(bind: u16, log: &Path) -> Proc {
    worker_with(bind, log, &[], &[])
}

/// A worker that stops at failpoint `point` for a checkpoint `>= at`, recording it in `marker`.
fn armed_worker(bind: u16, log: &Path, point: &str, at: u64, marker: &Path) -> Proc {
    worker_with(
        bind,
        log,
        &[],
        &[
            ("CAIRN_FAILPOINTS", format!("{point}={at}")),
            ("CAIRN_FAILPOINT_MARKER", marker.display().to_string()),
        ],
    )
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

/// `(triggered, newest completed id)` of a job's checkpoints, from its REST API.
fn checkpoints(rest: u16, jid: &str) -> Option<(u64, u64)> {
    let body = http_get(rest, &format!("/jobs/{jid}/checkpoints"))?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let triggered = v["counts"]["triggered"].as_u64()?;
    let latest = v["latest"]["completed"]["id"].as_u64().unwrap_or(0);
    Some((triggered, latest))
}

/// The job's state; the test fails if it is FAILED.
fn assert_job_not_failed(rest: u16, jid: &str, log: &Path) -> Option<String> {
    let s = job_state(rest, jid)?;
    assert_ne!(
        s,
        "FAILED",
        "job failed: {}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    Some(s)
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

/// The backpressure job's flags with `records` and `out_dir`.
fn job_args(records: u64, out_dir: &Path) -> Vec<String> {
    let mut args: Vec<String> = JOB_FLAGS.iter().map(|s| s.to_string()).collect();
    args.extend([
        "--generate".into(),
        records.to_string(),
        "--output".into(),
        out_dir.display().to_string(),
    ]);
    args
}

/// Kills a worker at each worker-side failpoint in turn (order chosen by the seed): every round
/// an armed worker stops at its point 2 or 3 checkpoints ahead, the test checks what that point
/// implies for the coordinator's checkpoints, kills it with SIGKILL and starts the next armed
/// worker; a steady, unarmed worker runs throughout.
#[test]
fn workers_killed_at_failpoints_keep_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("cluster.log");
    let c = coordinator(&tmp.path().join("ck"), &log);
    let mut next = seeded(31);
    // checkpoint-completed happens in the coordinator's process, not in a worker.
    let points: Vec<&str> = shuffled_failpoints(&mut next)
        .into_iter()
        .filter(|p| *p != "checkpoint-completed")
        .collect();
    let mut at = 2 + next() % 2;
    let mut marker = tmp.path().join("marker-0");
    let mut armed = armed_worker(c.bind, &log, points[0], at, &marker);
    let _steady = worker(c.bind, &log);
    let records = 500_000u64;
    let out_dir = tmp.path().join("out");
    let args = job_args(records, &out_dir);
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let jid = submit(c.rest, &argv);
    assert_eq!(jid.len(), 32, "job id: {jid}");
    let mut kills = Vec::new();
    for (round, point) in points.iter().enumerate() {
        let (name, id) = wait_for(
            &format!("failpoint {point}={at}"),
            &log,
            Duration::from_secs(60),
            || {
                let state = assert_job_not_failed(c.rest, &jid, &log);
                assert_ne!(
                    state.as_deref(),
                    Some("FINISHED"),
                    "the job finished before failpoint {point}={at}"
                );
                read_marker(&marker)
            },
        );
        assert_eq!(name, *point, "round {round}: stopped at another point");
        assert!(id >= at, "{point} fired at {id}, armed for {at}");
        if *point == "sink-committing" {
            // The sink was notified: the coordinator completed the checkpoint.
            wait_for(
                &format!("checkpoint {id} completed"),
                &log,
                Duration::from_secs(20),
                || (checkpoints(c.rest, &jid)?.1 >= id).then_some(()),
            );
        } else {
            // A subtask on the stopped worker never acknowledged it.
            let (_, latest) = checkpoints(c.rest, &jid).unwrap();
            assert!(latest < id, "{point} {id}: checkpoint {latest} completed");
        }
        kills.push(format!("{point} at {id}"));
        let (triggered, _) = checkpoints(c.rest, &jid).unwrap();
        at = triggered + 2 + next() % 2;
        marker = tmp.path().join(format!("marker-{}", round + 1));
        // Replacing `armed` drops (SIGKILLs) the stopped worker.
        armed = match points.get(round + 1) {
            Some(p) => armed_worker(c.bind, &log, p, at, &marker),
            None => worker(c.bind, &log),
        };
    }
    // `armed` is now an unarmed worker: with the steady one it runs the job to its end.
    wait_for("the job to finish", &log, Duration::from_secs(90), || {
        (assert_job_not_failed(c.rest, &jid, &log)? == "FINISHED").then_some(())
    });
    drop(armed);
    let view: serde_json::Value =
        serde_json::from_str(&http_get(c.rest, &format!("/jobs/{jid}")).unwrap()).unwrap();
    let restarts = view["restarts"].as_u64().unwrap();
    assert!(
        restarts >= kills.len() as u64,
        "{restarts} restarts for {kills:?}"
    );
    eprintln!("worker SIGKILLs at {}", kills.join(", "));
    assert_exactly_once(&out_dir, &backpressure_expected(records, 500));
    assert_no_leftovers(&out_dir);
}

/// The coordinator stops right after writing a checkpoint's `_metadata`, before any sink learns
/// that it completed, and is killed there; the restarted coordinator resumes the job from exactly
/// that checkpoint, whose pending sink files it must commit.
#[test]
fn a_coordinator_killed_after_completing_a_checkpoint_resumes_from_it() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("cluster.log");
    let ck = tmp.path().join("ck");
    let marker = tmp.path().join("marker");
    let at = 2 + seeded(32)() % 2;
    let coord = coordinator_on(
        "127.0.0.1:0",
        "127.0.0.1:0",
        &ck,
        &log,
        &[],
        &[
            ("CAIRN_FAILPOINTS", format!("checkpoint-completed={at}")),
            ("CAIRN_FAILPOINT_MARKER", marker.display().to_string()),
        ],
    );
    let _workers = [worker(coord.bind, &log), worker(coord.bind, &log)];
    let records = 400_000u64;
    let out_dir = tmp.path().join("out");
    let args = job_args(records, &out_dir);
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let jid = submit(coord.rest, &argv);
    let (name, id) = wait_for(
        "the coordinator to stop at its failpoint",
        &log,
        Duration::from_secs(60),
        || read_marker(&marker),
    );
    assert_eq!(
        (name.as_str(), id >= at),
        ("checkpoint-completed", true),
        "{id}"
    );
    let (bind, rest) = (coord.bind, coord.rest);
    drop(coord); // SIGKILL
    let coord2 = coordinator_again(bind, rest, &ck, &log);
    wait_until_finished(&coord2, &jid, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains(&format!("restoring job from checkpoint {id} (")),
        "the job did not resume from checkpoint {id}: {text}"
    );
    assert_exactly_once(&out_dir, &backpressure_expected(records, 500));
    assert_no_leftovers(&out_dir);
}

/// A job submitted `--from` a savepoint whose coordinator is killed before the job completed
/// any checkpoint of its own resumes from that savepoint — not from scratch and not from
/// another job's checkpoint — and its output stays exactly once across both runs.
#[test]
fn a_coordinator_killed_before_a_restored_job_checkpointed_resumes_it_from_its_savepoint() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("cluster.log");
    let (ck, out, sp) = (
        tmp.path().join("ck"),
        tmp.path().join("out"),
        tmp.path().join("sp"),
    );
    let records = 200_000u64;
    let flags = |sink_rate: &str, interval: &str| -> Vec<String> {
        [
            "--generate",
            &records.to_string(),
            "--keys",
            "500",
            "--sink-rate",
            sink_rate,
            "--checkpoint-interval",
            interval,
            "--output",
            &out.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };

    // A savepoint of an embedded run, stopped mid-way.
    let ck0 = tmp.path().join("ck0");
    let mut first = cairn();
    first
        .args(["run", "backpressure", "-p", "2"])
        .args(flags("40000", "100ms"))
        .arg("--checkpoint-dir")
        .arg(&ck0)
        .arg("--savepoint-on-exit")
        .arg(&sp);
    let (savepoint, _) = Watched::spawn(&mut first)
        .stop_with_savepoint_after_a_checkpoint(&ck0, Instant::now() + Duration::from_secs(60));
    let savepoint = savepoint.display().to_string();
    let savepoint_id: u64 = run_ok(cairn().args(["savepoint", "info", &savepoint]))
        .stdout
        .split(|b| *b == b' ')
        .nth(1)
        .and_then(|w| std::str::from_utf8(w).ok()?.parse().ok())
        .expect("`savepoint info` names the savepoint's id");

    // The cluster runs it on from the savepoint at parallelism 4, with no checkpoint of its
    // own before the coordinator dies: an hour's interval, and a slow sink.
    let coord = coordinator(&ck, &log);
    let _workers = [worker(coord.bind, &log), worker(coord.bind, &log)];
    let mut args = vec!["-p".to_string(), "4".into(), "--from".into(), savepoint];
    args.extend(flags("20000", "1h"));
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let jid = submit(coord.rest, &argv);
    // The kill lands once the resumed job wrote output (its sink's uncommitted files exist).
    wait_for(
        "the resumed job to write",
        &log,
        Duration::from_secs(60),
        || {
            std::fs::read_dir(&out)
                .ok()?
                .flatten()
                .any(|e| {
                    let name = e.file_name().to_string_lossy().into_owned();
                    name.starts_with(".part-") && name.contains(&jid[..8])
                })
                .then_some(())
        },
    );
    assert_eq!(checkpoints(coord.rest, &jid).map(|(c, _)| c), Some(0));
    let (bind, rest) = (coord.bind, coord.rest);
    drop(coord); // SIGKILL
    assert!(
        !std::fs::read_dir(ck.join(&jid))
            .is_ok_and(|d| d.flatten().any(|c| c.path().join("_metadata").is_file())),
        "the job completed a checkpoint before the kill"
    );
    let coord2 = coordinator_again(bind, rest, &ck, &log);
    wait_until_finished(&coord2, &jid, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    let restores = text
        .matches(&format!("restoring job from checkpoint {savepoint_id} ("))
        .count();
    assert_eq!(
        restores, 2,
        "both runs of the job restore the savepoint: {text}"
    );
    assert_exactly_once(&out, &backpressure_expected(records, 500));
    assert_no_leftovers(&out);
}

#[test]
fn a_worker_with_the_wrong_secret_is_rejected() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("c.log");
    let c = coordinator(&tmp.path().join("ck"), &log);
    let bind = c.bind;
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
    let log = tmp.path().join("c.log");
    let c = coordinator(&tmp.path().join("ck"), &log);
    let (bind, rest) = (c.bind, c.rest);
    let _w = worker(bind, &log);
    // Garbage, an oversized length prefix, and a frame of another version, each on its own
    // connection, with the reason the coordinator must give for closing it.
    let junks: [(Vec<u8>, String); 3] = [
        (
            b"hello world, not a frame".to_vec(),
            format!(
                "frame of {} bytes exceeds the limit",
                u32::from_le_bytes(*b"hell")
            ),
        ),
        (
            u32::MAX.to_le_bytes().to_vec(),
            format!("frame of {} bytes exceeds the limit", u32::MAX),
        ),
        (
            vec![2, 0, 0, 0, 99, 0],
            "frame of protocol version 99".to_string(),
        ),
    ];
    for (junk, reason) in junks {
        let peer = send_junk(bind, &junk);
        let line = format!("connection from {peer} closed: {reason}");
        wait_for(&line, &log, Duration::from_secs(10), || {
            std::fs::read_to_string(&log)
                .ok()?
                .contains(&line)
                .then_some(())
        });
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
}

/// Connects to `port`, writes `junk`, and waits for the peer to close the connection (EOF, or a
/// reset because the junk was not read to its end); returns this side's address, the one the
/// peer's log names.
fn send_junk(port: u16, junk: &[u8]) -> String {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let local = s.local_addr().unwrap().to_string();
    s.write_all(junk).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest_of = Vec::new();
    match s.read_to_end(&mut rest_of) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the connection from {local} was not closed by its peer: {e}"),
    }
    local
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
    let log = tmp.path().join("cluster.log");
    let c = coordinator(&tmp.path().join("ck"), &log);
    let (bind, rest) = (c.bind, c.rest);
    let _workers = [worker(bind, &log), worker(bind, &log)];
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
    let log = tmp.path().join("c.log");
    let c = coordinator(&tmp.path().join("ck"), &log);
    let (bind, rest) = (c.bind, c.rest);
    // The first worker logs alone, so the data address in its registration line is its own.
    let w1_log = tmp.path().join("w1.log");
    let _w1 = worker_with(bind, &w1_log, &["--data-bind", "127.0.0.1:0"], &[]);
    let _w2 = worker(bind, &log);
    let data: u16 = wait_for(
        "the first worker's data port",
        &w1_log,
        Duration::from_secs(20),
        || {
            let text = std::fs::read_to_string(&w1_log).ok()?;
            let (_, rest) = text.split_once(", data on ")?;
            let addr = rest.split_once(')')?.0;
            addr.parse::<std::net::SocketAddr>().ok().map(|a| a.port())
        },
    );
    let junks: [(&[u8], String); 3] = [
        (
            b"GET / HTTP/1.1\r\n\r\n",
            format!(
                "frame of {} bytes exceeds the limit",
                u32::from_le_bytes(*b"GET ")
            ),
        ),
        (
            &[0xff, 0xff, 0xff, 0xff],
            format!("frame of {} bytes exceeds the limit", u32::MAX),
        ),
        // A frame of the right version whose greeting stops after two empty strings.
        (
            &[3, 0, 0, 0, cairn::cluster::frame::PROTOCOL_VERSION, 0, 0],
            "malformed frame".to_string(),
        ),
    ];
    for (junk, reason) in junks {
        let peer = send_junk(data, junk);
        let line = format!("data connection from {peer} closed: {reason}");
        wait_for(&line, &w1_log, Duration::from_secs(10), || {
            std::fs::read_to_string(&w1_log)
                .ok()?
                .contains(&line)
                .then_some(())
        });
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
}

#[test]
fn a_silent_worker_is_declared_dead_by_its_missing_heartbeats() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("c.log");
    let c = coordinator_with(&tmp.path().join("ck"), &log, &["--heartbeat-timeout", "1s"]);
    let w = worker(c.bind, &log);
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
    let silent = wait_for(
        "the worker to be declared dead",
        &log,
        Duration::from_secs(10),
        || {
            let text = std::fs::read_to_string(&log).ok()?;
            let (_, rest) = text.split_once("missed its heartbeats for ")?;
            rest.split_once(';').map(|(d, _)| d.to_string())
        },
    );
    let _ = Command::new("kill").args(["-CONT", &pid]).status();
    // Declared dead by the heartbeat monitor, not for another reason: it measured at least the
    // timeout of silence.
    let secs = [("ms", 1e-3), ("µs", 1e-6), ("ns", 1e-9), ("s", 1.0)]
        .iter()
        .find_map(|(unit, scale)| {
            let n: f64 = silent.strip_suffix(unit)?.parse().ok()?;
            Some(n * scale)
        })
        .unwrap_or_else(|| panic!("silence {silent:?} is not a duration"));
    assert!(secs >= 1.0, "declared dead after {silent} of silence");
}

#[test]
fn the_coordinator_rest_api_requires_its_token() {
    let tmp = tempfile::tempdir().unwrap();
    let c = coordinator_with(
        &tmp.path().join("ck"),
        &tmp.path().join("c.log"),
        &["--rest-token", "s3cret"],
    );
    let rest = c.rest;
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
    // The coordinator said it listens: its REST API answers from now on.
    let status = |token| status_of(token).expect("the REST API answers");
    assert!(status(None).starts_with("HTTP/1.1 401"), "{}", status(None));
    let wrong = status(Some("wrong"));
    assert!(wrong.starts_with("HTTP/1.1 401"), "{wrong}");
    let right = status(Some("s3cret"));
    assert!(right.starts_with("HTTP/1.1 200"), "{right}");
}

/// `submit … --output out` from a directory of its own: the path is the client's, made
/// absolute before it is sent, so the output lands under the submitting shell's directory and
/// not under the coordinator's or a worker's. The coordinator and the worker take bare ports,
/// as the client commands do (127.0.0.1).
#[test]
fn relative_paths_of_a_submission_are_the_clients() {
    let tmp = tempfile::tempdir().unwrap();
    let servers = tmp.path().join("servers");
    let client = tmp.path().join("client");
    std::fs::create_dir_all(&servers).unwrap();
    std::fs::create_dir_all(&client).unwrap();
    let log = tmp.path().join("cluster.log");
    let in_servers = |args: &[String]| {
        let stderr = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        Proc(
            cairn()
                .args(args)
                .current_dir(&servers)
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .unwrap(),
        )
    };
    let ck = tmp.path().join("ck").display().to_string();
    let _coordinator = in_servers(
        &[
            "coordinator",
            "--bind",
            "0",
            "--rest",
            "0",
            "--checkpoint-dir",
            ck.as_str(),
        ]
        .map(String::from),
    );
    let (bind, rest) = wait_for(
        "the coordinator to listen",
        &log,
        Duration::from_secs(20),
        || listening_lines(&log).first().copied(),
    );
    let bind = bind.to_string();
    let _worker =
        in_servers(&["worker", "--coordinator", bind.as_str(), "--slots", "2"].map(String::from));
    let out = run_ok(
        cairn()
            .current_dir(&client)
            .args(["submit", "--rest", &rest.to_string(), "backpressure"])
            .args([
                "--generate",
                "2000",
                "--keys",
                "10",
                "--sink-rate",
                "1000000",
            ])
            .args(["--output", "out", "-p", "2"]),
    );
    let jid = String::from_utf8_lossy(&out.stdout).trim().to_string();
    wait_for("the job to finish", &log, Duration::from_secs(90), || {
        (assert_job_not_failed(rest, &jid, &log)? == "FINISHED").then_some(())
    });
    assert!(
        !servers.join("out").exists(),
        "the output went to the servers' directory"
    );
    assert_exactly_once(&client.join("out"), &backpressure_expected(2000, 10));
}

/// A port that was free a moment ago (for a standby, whose ports the workers must know before
/// it listens).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The status code of `GET path` on 127.0.0.1:`port` (None: nothing answers).
fn http_status(port: u16, path: &str) -> Option<u16> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.split_whitespace().nth(1)?.parse().ok()
}

/// One of a leader and its standbys: its fixed ports, its own log, its process.
struct Member {
    proc: Option<Proc>,
    bind: u16,
    rest: u16,
    log: std::path::PathBuf,
}

/// Lease and heartbeat flags of the standby tests: workers let a silent leader go after
/// 500 ms, a standby takes over a lease unrenewed for 1 s.
const HA_FLAGS: [&str; 4] = ["--heartbeat-timeout", "500ms", "--leader-lease", "1s"];

impl Member {
    fn new(dir: &Path, name: &str) -> Member {
        Member {
            proc: None,
            bind: free_port(),
            rest: free_port(),
            log: dir.join(format!("{name}.log")),
        }
    }

    /// Starts it on its ports; it leads or stands by.
    fn start(&mut self, ck: &Path) {
        let mut args: Vec<String> = vec![
            "coordinator".into(),
            "--bind".into(),
            format!("127.0.0.1:{}", self.bind),
            "--rest".into(),
            format!("127.0.0.1:{}", self.rest),
            "--checkpoint-dir".into(),
            ck.display().to_string(),
        ];
        args.extend(HA_FLAGS.iter().map(|s| s.to_string()));
        self.proc = Some(spawn(&args, &self.log, &[]));
    }

    fn pid(&self) -> u32 {
        self.proc.as_ref().expect("started").0.id()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until it leads as `epoch` (says so and answers on its REST port).
    fn wait_until_leading(&self, epoch: u64, deadline: Duration) {
        let line = format!(" as epoch {epoch}");
        wait_for("a coordinator to lead", &self.log, deadline, || {
            let text = self.log_text();
            let leads = text
                .lines()
                .any(|l| l.starts_with("leading the coordinators on") && l.ends_with(&line));
            (leads && http_get(self.rest, "/jobs").is_some()).then_some(())
        });
    }
}

/// The workers' `--coordinator` list: every member.
fn members_list(members: &[&Member]) -> String {
    members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.bind))
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until `rest` runs job `jid` and has completed a checkpoint after `after`; returns
/// its id.
fn wait_for_a_checkpoint_after(rest: u16, jid: &str, after: u64, log: &Path) -> u64 {
    wait_for(
        "the leader to complete a checkpoint",
        log,
        Duration::from_secs(60),
        || {
            let (_, latest) = checkpoints(rest, jid)?;
            (assert_job_not_failed(rest, jid, log)? == "RUNNING" && latest > after)
                .then_some(latest)
        },
    )
}

/// Two coordinators share a checkpoint directory: one leads, one stands by. The leader is
/// SIGKILLed mid-job three times (each time after a checkpoint of its own); the standby
/// takes over, the workers find it through their list of coordinators, the job resumes from
/// the latest checkpoint, and the killed coordinator is started again as the next standby.
/// The job ends FINISHED with exactly-once output.
#[test]
fn a_standby_takes_over_from_a_leader_sigkilled_mid_job_again_and_again() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut members = [Member::new(tmp.path(), "a"), Member::new(tmp.path(), "b")];
    members[0].start(&ck);
    members[0].wait_until_leading(1, Duration::from_secs(20));
    members[1].start(&ck);
    wait_for(
        "the second to stand by",
        &members[1].log,
        Duration::from_secs(20),
        || {
            members[1]
                .log_text()
                .contains("standing by: ")
                .then_some(())
        },
    );
    let list = members_list(&[&members[0], &members[1]]);
    let wlog = tmp.path().join("workers.log");
    let worker = |log: &Path| {
        spawn(
            &["worker".into(), "--coordinator".into(), list.clone()],
            log,
            &[],
        )
    };
    let _workers = [worker(&wlog), worker(&wlog)];
    let records = 1_500_000u64;
    let out_dir = tmp.path().join("out");
    let args = job_args(records, &out_dir);
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let mut leader = 0;
    let jid = submit(members[leader].rest, &argv);
    let mut latest = 0;
    for round in 0..3 {
        latest =
            wait_for_a_checkpoint_after(members[leader].rest, &jid, latest, &members[leader].log);
        // SIGKILL, reaped: the standby sees a process of this host that no longer exists.
        drop(members[leader].proc.take());
        let killed = Instant::now();
        let standby = 1 - leader;
        members[standby].wait_until_leading(round + 2, Duration::from_secs(20));
        wait_for(
            "the job to run on the new leader",
            &members[standby].log,
            Duration::from_secs(60),
            || {
                (assert_job_not_failed(members[standby].rest, &jid, &members[standby].log)?
                    == "RUNNING")
                    .then_some(())
            },
        );
        eprintln!(
            "round {round}: the job ran again {:?} after the leader was killed",
            killed.elapsed()
        );
        members[leader].start(&ck);
        leader = standby;
    }
    wait_for(
        "the job to finish",
        &members[leader].log,
        Duration::from_secs(120),
        || {
            (assert_job_not_failed(members[leader].rest, &jid, &members[leader].log)? == "FINISHED")
                .then_some(())
        },
    );
    let text = members[leader].log_text();
    assert!(
        text.contains("as epoch 4"),
        "three takeovers after epoch 1: {text}"
    );
    assert_exactly_once(&out_dir, &backpressure_expected(records, 500));
    assert_no_leftovers(&out_dir);
}

/// The leader is paused (SIGSTOP) past its lease: the workers let it go, the standby takes
/// over once the lease lapsed and resumes the job. Resumed (SIGCONT), the deposed leader
/// refuses its own writes, says it lost leadership and exits 1; nothing it did counts — the
/// job ends FINISHED on the new leader with exactly-once output.
#[test]
fn a_leader_paused_past_its_lease_is_fenced_when_it_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut a = Member::new(tmp.path(), "a");
    let mut b = Member::new(tmp.path(), "b");
    a.start(&ck);
    a.wait_until_leading(1, Duration::from_secs(20));
    b.start(&ck);
    let list = members_list(&[&a, &b]);
    // Kubernetes' probes: both live, only the leader ready; the standby's REST port names
    // the leader.
    wait_for(
        "the standby's health endpoints",
        &b.log,
        Duration::from_secs(20),
        || (http_status(b.rest, "/readyz")? == 503).then_some(()),
    );
    assert_eq!(http_status(b.rest, "/healthz"), Some(200));
    assert_eq!(http_status(a.rest, "/healthz"), Some(200));
    assert_eq!(http_status(a.rest, "/readyz"), Some(200));
    let answer = http_get(b.rest, "/jobs").unwrap();
    assert!(
        answer.contains("standing by") && answer.contains(&format!("127.0.0.1:{}", a.rest)),
        "{answer}"
    );
    let wlog = tmp.path().join("workers.log");
    let metrics = free_port();
    let worker = |log: &Path, extra: &[String]| {
        let mut args = vec!["worker".into(), "--coordinator".into(), list.clone()];
        args.extend(extra.iter().cloned());
        spawn(&args, log, &[])
    };
    let _workers = [
        worker(&wlog, &["--metrics".into(), format!("127.0.0.1:{metrics}")]),
        worker(&wlog, &[]),
    ];
    wait_for(
        "a registered worker to be ready",
        &wlog,
        Duration::from_secs(20),
        || (http_status(metrics, "/readyz")? == 200).then_some(()),
    );
    assert_eq!(http_status(metrics, "/healthz"), Some(200));
    let records = 1_200_000u64;
    let out_dir = tmp.path().join("out");
    let args = job_args(records, &out_dir);
    let argv: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
    let jid = submit(a.rest, &argv);
    let paused_after = wait_for_a_checkpoint_after(a.rest, &jid, 0, &a.log);
    let signal = |sig: &str, pid: u32| {
        run_ok(Command::new("kill").args([sig, &pid.to_string()]));
    };
    signal("-STOP", a.pid());
    let paused = Instant::now();
    b.wait_until_leading(2, Duration::from_secs(20));
    // The lease runs from the leader's last renewal, up to a quarter lease before the pause.
    assert!(
        paused.elapsed() >= Duration::from_millis(750),
        "the standby took over a paused leader before its lease lapsed"
    );
    let resumed_at = wait_for_a_checkpoint_after(b.rest, &jid, paused_after, &b.log);
    assert_eq!(http_status(b.rest, "/readyz"), Some(200));
    signal("-CONT", a.pid());
    let mut proc = a.proc.take().unwrap();
    let status = wait_for(
        "the deposed leader to exit",
        &a.log,
        Duration::from_secs(20),
        || proc.0.try_wait().unwrap(),
    );
    assert_eq!(status.code(), Some(1), "{}", a.log_text());
    let text = a.log_text();
    assert!(
        text.contains("lost leadership of epoch 1"),
        "the deposed leader says why it stopped: {text}"
    );
    wait_for(
        "the job to finish",
        &b.log,
        Duration::from_secs(120),
        || (assert_job_not_failed(b.rest, &jid, &b.log)? == "FINISHED").then_some(()),
    );
    assert!(resumed_at > paused_after);
    assert_exactly_once(&out_dir, &backpressure_expected(records, 500));
    assert_no_leftovers(&out_dir);
}

/// Kubernetes stops a worker with SIGTERM: the worker tells the coordinator it leaves, its
/// subtasks fail over to the other workers, and the restart spends none of the job's restart
/// budget — two workers leave in turn from a job allowed a single restart, and it still ends
/// FINISHED with exactly-once output; each worker exits 0.
#[test]
fn workers_stopped_with_sigterm_leave_without_spending_the_restart_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("cluster.log");
    let ck = tmp.path().join("ck");
    let coord = coordinator(&ck, &log);
    // Three workers of 2 slots, each with its own log; the job (p=2) fits on one, and the
    // test stops the one that runs it, twice.
    let logs: Vec<_> = (0..3)
        .map(|i| tmp.path().join(format!("worker-{i}.log")))
        .collect();
    let mut workers: Vec<Option<Proc>> = logs.iter().map(|l| Some(worker(coord.bind, l))).collect();
    // The worker running an attempt now: one that started more than it released.
    let hosting = |workers: &[Option<Proc>]| {
        (0..workers.len()).find(|&i| {
            let text = std::fs::read_to_string(&logs[i]).unwrap_or_default();
            workers[i].is_some()
                && text.matches(": running attempt").count()
                    > text.matches(": released attempt").count()
        })
    };
    let records = 1_000_000u64;
    let out_dir = tmp.path().join("out");
    let out = out_dir.display().to_string();
    let jid = submit(
        coord.rest,
        &[
            "-p",
            "2",
            "--keys",
            "500",
            "--sink-rate",
            "150000",
            "--checkpoint-interval",
            "50ms",
            "-D",
            "restart-strategy.type=fixed-delay",
            "-D",
            "restart-strategy.fixed-delay.attempts=1",
            "-D",
            "restart-strategy.fixed-delay.delay=0ms",
            "--generate",
            &records.to_string(),
            "--output",
            &out,
        ],
    );
    let mut latest = 0;
    for left in 1..=2u64 {
        latest = wait_for_a_checkpoint_after(coord.rest, &jid, latest, &log);
        let i = wait_for(
            "a worker to run the job",
            &log,
            Duration::from_secs(20),
            || hosting(&workers),
        );
        let mut w = workers[i].take().unwrap();
        run_ok(Command::new("kill").args(["-TERM", &w.0.id().to_string()]));
        let status = wait_for(
            "the worker to leave",
            &logs[i],
            Duration::from_secs(20),
            || w.0.try_wait().unwrap(),
        );
        assert_eq!(
            status.code(),
            Some(0),
            "{}",
            std::fs::read_to_string(&logs[i]).unwrap()
        );
        wait_for(
            "the job to run again",
            &log,
            Duration::from_secs(60),
            || {
                let restarts = rest_job_restarts(([127, 0, 0, 1], coord.rest).into(), &jid)?;
                (restarts >= left && assert_job_not_failed(coord.rest, &jid, &log)? == "RUNNING")
                    .then_some(())
            },
        );
    }
    wait_until_finished(&coord, &jid, &log);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("left on purpose (drained)"), "{text}");
    assert_exactly_once(&out_dir, &backpressure_expected(records, 500));
    assert_no_leftovers(&out_dir);
}
