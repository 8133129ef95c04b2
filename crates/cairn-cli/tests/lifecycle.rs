//! The job lifecycle of a cluster, end to end (a coordinator and workers as real processes):
//! what can be known wrong before deployment is refused at submit with nothing recorded; a
//! failure while waiting for slots ends FAILED with its cause; a cancel ends any state that is
//! not an end; ended jobs are recorded and never resubmitted by a restarted coordinator;
//! `--from latest` is one named job's latest checkpoint, never another's; slots are reserved
//! per job and `/overview` counts what runs.

mod common;

use std::net::SocketAddr;
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn get(rest: SocketAddr, path: &str) -> Value {
    rest_json(rest, path).unwrap_or_else(|| panic!("GET {path} answered no JSON"))
}

/// Every job the coordinator lists, as (id, state).
fn listed(rest: SocketAddr) -> Vec<(String, String)> {
    let jobs = get(rest, "/jobs")["jobs"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    jobs.iter()
        .map(|j| {
            let text = |k: &str| j[k].as_str().unwrap_or_default().to_string();
            (text("id"), text("status"))
        })
        .collect()
}

/// Waits until job `jid` is in `state`; returns its details.
fn wait_state(cluster: &mut Cluster, jid: &str, state: &str, deadline: Instant) -> Value {
    let rest = cluster.rest;
    let mut job = Value::Null;
    cluster
        .coordinator
        .wait_until(&format!("job {jid} {state}"), deadline, || {
            job = get(rest, &format!("/jobs/{jid}"));
            job["state"] == state
        });
    job
}

fn submit_cmd(rest: SocketAddr, args: &[&str]) -> Output {
    cairn()
        .args(["submit", "--rest", &format!("http://{rest}")])
        .args(args)
        .output()
        .expect("cairn starts")
}

/// `cairn submit ARGS` is refused: exit code 1 and one line starting with `error:`; returns it.
fn refused(rest: SocketAddr, args: &[&str]) -> String {
    let out = submit_cmd(rest, args);
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(
        out.status.code(),
        Some(1),
        "{args:?} must be refused: {stderr}"
    );
    assert!(out.stdout.is_empty(), "no job id is printed: {out:?}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    lines[0].to_string()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// A wordcount of `words` generated words at `rate` per second (0: as fast as it goes).
fn wordcount(words: u64, rate: u64, out: &Path, p: &str) -> Vec<String> {
    [
        "wordcount",
        "--generate",
        &words.to_string(),
        "--keys",
        "50",
        "--rate",
        &rate.to_string(),
        "--output",
        s(out),
        "-p",
        p,
        "--checkpoint-interval",
        "50ms",
    ]
    .iter()
    .map(|x| x.to_string())
    .collect()
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Job directories (those with a `_job` record) under a coordinator's checkpoint directory.
fn recorded_jobs(ck: &Path) -> Vec<String> {
    let mut ids: Vec<String> = std::fs::read_dir(ck)
        .map(|d| {
            d.flatten()
                .filter(|e| e.path().join("_job").is_file())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    ids.sort();
    ids
}

/// A completed checkpoint of an embedded wordcount under `ck` (its `chk-<n>` directory).
fn embedded_checkpoint(ck: &Path, out: &Path, deadline: Instant) -> std::path::PathBuf {
    let mut args = wordcount(100_000_000, 20_000, out, "1");
    args.extend(["--checkpoint-dir".into(), s(ck).into()]);
    let mut run = Watched::spawn(cairn().arg("run").args(&args));
    run.wait_for_a_checkpoint(ck, deadline);
    drop(run);
    let job = std::fs::read_dir(ck)
        .unwrap()
        .flatten()
        .next()
        .unwrap()
        .path();
    std::fs::read_dir(&job)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.join("_metadata").is_file())
        .expect("a completed checkpoint")
}

#[test]
fn failures_known_before_deployment_are_refused_at_submit_and_nothing_is_recorded() {
    let deadline = Instant::now() + Duration::from_secs(120);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut cluster = Cluster::start(&ck, 1, deadline);
    let rest = cluster.rest;

    // The output is a file.
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"not a directory").unwrap();
    let line = refused(rest, &strs(&wordcount(100, 0, &file, "1")));
    assert!(line.contains(s(&file)), "names the output: {line}");

    // --from a checkpoint that does not exist.
    let out = tmp.path().join("out");
    let mut args = wordcount(100, 0, &out, "1");
    let missing = tmp.path().join("no-such/chk-3");
    args.extend(["--from".into(), s(&missing).into()]);
    let line = refused(rest, &strs(&args));
    assert!(
        line.contains("does not exist") && line.contains(s(&missing)),
        "{line}"
    );

    // --from a checkpoint that does not verify.
    let chk = embedded_checkpoint(
        &tmp.path().join("embedded"),
        &tmp.path().join("e-out"),
        deadline,
    );
    let metadata = chk.join("_metadata");
    let mut bytes = std::fs::read(&metadata).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&metadata, bytes).unwrap();
    let mut args = wordcount(100, 0, &out, "1");
    args.extend(["--from".into(), s(&chk).into()]);
    let line = refused(rest, &strs(&args));
    assert!(line.contains(s(&chk)), "names the checkpoint: {line}");

    // A savepoint resumed into another output than its own: its pending files are not there.
    let sp_out = tmp.path().join("sp-out");
    let mut args = wordcount(100_000_000, 20_000, &sp_out, "1");
    args.extend([
        "--checkpoint-dir".into(),
        s(&tmp.path().join("sp-ck")).into(),
        "--savepoint-on-exit".into(),
        s(&tmp.path().join("sp")).into(),
    ]);
    let run = Watched::spawn(cairn().arg("run").args(&args));
    let (savepoint, _) =
        run.stop_with_savepoint_after_a_checkpoint(&tmp.path().join("sp-ck"), deadline);
    let mut args = wordcount(100, 0, &tmp.path().join("another-out"), "1");
    args.extend(["--from".into(), s(&savepoint).into()]);
    let line = refused(rest, &strs(&args));
    assert!(
        line.contains("pending file") && line.contains("another-out"),
        "{line}"
    );

    // A relative --from sent straight to the REST API: the coordinator's directory means
    // nothing to the client.
    let answer = ureq::post(&format!("http://{rest}/jobs"))
        .config()
        .http_status_as_error(false)
        .build()
        .header("Content-Type", "application/json")
        .send(
            serde_json::json!({
                "job": "wordcount",
                "params": {"generate": 10, "output": s(&out)},
                "from": "ck/job/chk-1",
            })
            .to_string(),
        )
        .unwrap();
    assert_eq!(answer.status(), 400);

    // A job that would print on a worker's stdout.
    let line = refused(rest, &["wordcount", "--generate", "10"]);
    assert!(line.contains("--output"), "{line}");

    // Nothing was recorded, nothing runs, no slot is taken.
    assert!(recorded_jobs(&ck).is_empty(), "{:?}", recorded_jobs(&ck));
    assert!(listed(rest).is_empty(), "{:?}", listed(rest));
    let overview = get(rest, "/overview");
    assert_eq!(overview["jobs-running"], 0, "{overview}");
    assert_eq!(
        overview["slots-available"], overview["slots-total"],
        "{overview}"
    );
    cluster.assert_running();
}

#[test]
fn a_slot_shortage_fails_with_its_cause_a_cancel_ends_the_wait_and_neither_comes_back() {
    let deadline = Instant::now() + Duration::from_secs(120);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    // One worker with 2 slots; a job at parallelism 4 cannot run.
    let mut cluster = Cluster::start_with(&ck, 1, &["--slot-wait", "1s"], deadline);
    let rest = cluster.rest;
    let out = tmp.path().join("out");
    let failed = submit(rest, None, &strs(&wordcount(1000, 0, &out, "4")));
    let job = wait_state(&mut cluster, &failed, "FAILED", deadline);
    let cause = job["failure-cause"].as_str().unwrap_or_default();
    assert!(cause.contains("not enough task slots"), "{job}");
    let transitions: Vec<&str> = job["state-transitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["to"].as_str().unwrap())
        .collect();
    assert_eq!(transitions, ["FAILED"], "{job}");
    let exceptions = get(rest, &format!("/jobs/{failed}/exceptions"));
    assert!(
        exceptions.to_string().contains("not enough task slots"),
        "{exceptions}"
    );
    drop(cluster);

    // Now the wait is long: a cancel ends it at once.
    let mut cluster = Cluster::start_with(&ck, 1, &["--slot-wait", "10m"], deadline);
    let rest = cluster.rest;
    // The failed job came back as FAILED, with its cause, and was not resubmitted.
    let back = get(rest, &format!("/jobs/{failed}"));
    assert_eq!(back["state"], "FAILED", "{back}");
    assert!(
        back["failure-cause"]
            .as_str()
            .unwrap_or_default()
            .contains("not enough task slots"),
        "{back}"
    );
    let waiting = submit(rest, None, &strs(&wordcount(1000, 0, &out, "4")));
    let job = get(rest, &format!("/jobs/{waiting}"));
    assert_eq!(job["state"], "CREATED", "{job}");
    let cancelled_at = Instant::now();
    run_ok(cairn().args(["cancel", "--rest", &format!("http://{rest}"), &waiting]));
    wait_state(&mut cluster, &waiting, "CANCELED", deadline);
    assert!(
        cancelled_at.elapsed() < Duration::from_secs(60),
        "the cancel ended the wait"
    );
    let coordinator_log = cluster.coordinator.stderr_so_far();
    drop(cluster);

    let mut cluster = Cluster::start(&ck, 1, deadline);
    let rest = cluster.rest;
    let mut jobs = listed(rest);
    jobs.sort();
    let mut expected = vec![
        (failed.clone(), "FAILED".to_string()),
        (waiting.clone(), "CANCELED".to_string()),
    ];
    expected.sort();
    assert_eq!(jobs, expected);
    let log = cluster.coordinator.stderr_so_far();
    assert!(
        !log.contains("resuming job"),
        "ended jobs are not resumed:\n{coordinator_log}\n{log}"
    );
    cluster.assert_running();
}

#[test]
fn latest_on_a_coordinator_is_the_named_jobs_and_slots_are_reserved_per_job() {
    let deadline = Instant::now() + Duration::from_secs(180);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut cluster = Cluster::start(&ck, 2, deadline);
    let rest = cluster.rest;
    cluster.coordinator.wait_until("two workers", deadline, || {
        get(rest, "/overview")["slots-total"] == 4
    });

    // Two long jobs at parallelism 2: each holds 2 of the 4 slots. Their checkpoints stay
    // when they are cancelled.
    let long = |out: &str| {
        let mut args = wordcount(100_000_000, 5_000, &tmp.path().join(out), "2");
        args.extend([
            "-D".into(),
            "execution.checkpointing.externalized-checkpoint-retention=RETAIN_ON_CANCELLATION"
                .into(),
        ]);
        args
    };
    let a = submit(rest, None, &strs(&long("a")));
    let b = submit(rest, None, &strs(&long("b")));
    wait_state(&mut cluster, &a, "RUNNING", deadline);
    wait_state(&mut cluster, &b, "RUNNING", deadline);
    let overview = get(rest, "/overview");
    assert_eq!(overview["jobs-running"], 2, "{overview}");
    assert_eq!(overview["slots-available"], 0, "{overview}");
    // Both complete checkpoints, then end.
    for jid in [&a, &b] {
        cluster
            .coordinator
            .wait_until("a checkpoint", deadline, || {
                get(rest, &format!("/jobs/{jid}/checkpoints"))["counts"]["completed"]
                    .as_u64()
                    .unwrap_or(0)
                    >= 2
            });
    }
    // A running job's checkpoints are not for another job to take.
    let mut args = wordcount(1000, 0, &tmp.path().join("c"), "2");
    args.extend(["--from".into(), "latest".into(), "--job".into(), a.clone()]);
    let line = refused(rest, &strs(&args));
    assert!(line.contains(&a) && line.contains("RUNNING"), "{line}");
    for jid in [&a, &b] {
        run_ok(cairn().args(["cancel", "--rest", &format!("http://{rest}"), jid]));
        wait_state(&mut cluster, jid, "CANCELED", deadline);
    }
    let overview = get(rest, "/overview");
    assert_eq!(overview["jobs-running"], 0, "{overview}");
    assert_eq!(overview["slots-available"], 4, "{overview}");

    // Two wordcount jobs have checkpoints: `latest` alone is ambiguous.
    let mut args = wordcount(1000, 0, &tmp.path().join("c"), "2");
    args.extend(["--from".into(), "latest".into()]);
    let line = refused(rest, &strs(&args));
    assert!(
        line.contains("ambiguous") && line.contains(&a) && line.contains(&b),
        "{line}"
    );
    // A job that does not exist.
    let mut args = wordcount(1000, 0, &tmp.path().join("c"), "2");
    args.extend([
        "--from".into(),
        "latest".into(),
        "--job".into(),
        "nope".into(),
    ]);
    let line = refused(rest, &strs(&args));
    assert!(line.contains("no job nope"), "{line}");

    // Named: job a's newest completed checkpoint, under a new id.
    let mut args = wordcount(1000, 0, &tmp.path().join("a"), "2");
    args.extend(["--from".into(), "latest".into(), "--job".into(), a.clone()]);
    let c = submit(rest, None, &strs(&args));
    assert_ne!(c, a);
    assert_ne!(c, b);
    wait_state(&mut cluster, &c, "RUNNING", deadline);
    let log = cluster.coordinator.stderr_so_far();
    assert!(
        log.contains(&format!("{a}/chk-")),
        "the checkpoint it started from is job a's:\n{log}"
    );
    let mut ids: Vec<String> = listed(rest).into_iter().map(|(id, _)| id).collect();
    ids.sort();
    let mut expected = vec![a.clone(), b.clone(), c.clone()];
    expected.sort();
    assert_eq!(
        ids, expected,
        "each job listed once, under the id submit printed"
    );
    cluster.assert_running();
}

#[test]
fn a_stopped_coordinator_suspends_its_jobs_and_the_next_one_resumes_them() {
    let deadline = Instant::now() + Duration::from_secs(120);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let mut cluster = Cluster::start(&ck, 1, deadline);
    let rest = cluster.rest;
    let jid = submit(
        rest,
        None,
        &strs(&wordcount(100_000_000, 5_000, &tmp.path().join("out"), "2")),
    );
    wait_state(&mut cluster, &jid, "RUNNING", deadline);
    cluster.coordinator.terminate();
    let line = cluster
        .coordinator
        .wait_for_line_containing("job(s) suspended", deadline);
    assert!(line.contains("SIGTERM: 1 job(s) suspended"), "{line}");
    let Cluster { coordinator, .. } = cluster;
    let (status, stderr) = coordinator.wait(deadline);
    assert!(
        status.success(),
        "a stop on SIGTERM is no failure: {stderr}"
    );
    // Not recorded as ended: the next coordinator resumes it, under its id.
    assert!(!ck.join(&jid).join("_end").exists());
    let mut cluster = Cluster::start(&ck, 1, deadline);
    let job = wait_state(&mut cluster, &jid, "RUNNING", deadline);
    assert_eq!(job["jid"], jid.as_str());
    cluster.assert_running();
}

#[test]
fn the_history_of_ended_jobs_is_bounded_and_their_records_stay() {
    let deadline = Instant::now() + Duration::from_secs(120);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let flags = ["--jobstore-max-capacity", "2"];
    let mut cluster = Cluster::start_with(&ck, 1, &flags, deadline);
    let rest = cluster.rest;
    let mut ids = Vec::new();
    for i in 0..4 {
        let out = tmp.path().join(format!("out-{i}"));
        let jid = submit(rest, None, &strs(&wordcount(100, 0, &out, "1")));
        wait_state(&mut cluster, &jid, "FINISHED", deadline);
        ids.push(jid);
    }
    let newest = |rest: SocketAddr| {
        let mut jobs: Vec<String> = listed(rest).into_iter().map(|(id, _)| id).collect();
        jobs.sort();
        jobs
    };
    let mut expected = ids[2..].to_vec();
    expected.sort();
    cluster
        .coordinator
        .wait_until("the history to let the oldest go", deadline, || {
            newest(rest) == expected
        });
    let gone = ureq::get(&format!("http://{rest}/jobs/{}", ids[0]))
        .config()
        .http_status_as_error(false)
        .build()
        .call()
        .unwrap();
    assert_eq!(gone.status(), 404);
    // Every end is on disk; a restarted coordinator lists the newest ones again.
    assert_eq!(recorded_jobs(&ck).len(), 4);
    for jid in &ids {
        assert!(ck.join(jid).join("_end").is_file(), "{jid}");
    }
    drop(cluster);
    let cluster = Cluster::start_with(&ck, 0, &flags, deadline);
    assert_eq!(newest(cluster.rest), expected);
}
