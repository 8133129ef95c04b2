//! Exactly-once end to end: wordcount at parallelism 4 with injected failures, and as a child
//! process stopped at chosen failpoints (`CAIRN_FAILPOINTS`), killed there with SIGKILL and
//! resumed with `--from latest`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};

use common::*;

/// Runs wordcount at parallelism 4 with injected failures in the given checkpoint mode;
/// returns the duplicates and losses in the committed output.
fn injected(extra: &[&str], seeds: &[u64]) -> Vec<Check> {
    let (count, keys) = (400_000u64, 5_000u64);
    let expected = generated_counts(count, keys);
    let mut checks = Vec::new();
    for &seed in seeds {
        let tmp = tempfile::tempdir().unwrap();
        let out_dir = tmp.path().join("out");
        let out = run_ok(
            cairn()
                .args(["run", "wordcount", "--parallelism", "4"])
                .args([
                    "--generate",
                    &count.to_string(),
                    "--keys",
                    &keys.to_string(),
                ])
                .arg("--output")
                .arg(&out_dir)
                .arg("--checkpoint-dir")
                .arg(tmp.path().join("ck"))
                .args(["--checkpoint-interval", "20ms"])
                .args(["--inject-failures", "4", "--seed", &seed.to_string()])
                .args(RESTART_FAST)
                .args(extra),
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("4/4 injected failures"),
            "seed {seed}: {stderr}"
        );
        assert!(stderr.contains(", 4 restarts"), "seed {seed}: {stderr}");
        assert_no_leftovers(&out_dir);
        checks.push(check_output(&out_dir, &expected));
    }
    checks
}

fn assert_all_exactly_once(checks: Vec<Check>) {
    for c in checks {
        assert_eq!((c.duplicates, c.missing), (0, 0), "exactly-once violated");
    }
}

#[test]
fn injected_failures_at_parallelism_4_keep_exactly_once() {
    assert_all_exactly_once(injected(&[], &[1, 7, 42]));
}

#[test]
fn injected_failures_with_unaligned_checkpoints_keep_exactly_once() {
    assert_all_exactly_once(injected(&["--unaligned"], &[2, 8, 43]));
}

/// In-process restarts with RocksDB and incremental checkpoints: each restart restores the
/// subtasks' instances from the newest checkpoint (and the coordinator keeps every shared file
/// it references); aligned and unaligned.
#[test]
fn injected_failures_with_rocksdb_keep_exactly_once() {
    let rocksdb = [
        "-D",
        "state.backend.type=rocksdb",
        "-D",
        "state.backend.incremental=true",
    ];
    assert_all_exactly_once(injected(&rocksdb, &[4, 10]));
    let mut unaligned = rocksdb.to_vec();
    unaligned.push("--unaligned");
    assert_all_exactly_once(injected(&unaligned, &[5]));
}

#[test]
fn injected_failures_with_alignment_timeout_keep_exactly_once() {
    assert_all_exactly_once(injected(&["--aligned-checkpoint-timeout", "2ms"], &[3, 9]));
}

#[test]
fn injected_failures_with_concurrent_checkpoints_keep_exactly_once() {
    assert_all_exactly_once(injected(&["--max-concurrent-checkpoints", "3"], &[4, 10]));
}

#[test]
fn injected_failures_at_least_once_lose_nothing() {
    let checks = injected(&["--mode", "at-least-once"], &[5, 11, 44]);
    let duplicates: u64 = checks.iter().map(|c| c.duplicates).sum();
    for c in &checks {
        assert_eq!(c.missing, 0, "at-least-once lost records");
    }
    eprintln!(
        "at-least-once with injected failures: {duplicates} duplicate output lines over {} runs",
        checks.len()
    );
}

#[test]
fn injected_failures_from_a_file_input_keep_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.txt");
    let mut text = String::new();
    let mut expected = std::collections::HashMap::new();
    for i in 0..60_000u64 {
        let w = format!("word{}", (i * 31) % 977);
        *expected.entry(w.clone()).or_insert(0u64) += 1;
        text.push_str(&w);
        text.push(if i % 7 == 6 { '\n' } else { ' ' });
    }
    std::fs::write(&input, text).unwrap();
    let out_dir = tmp.path().join("out");
    let out = run_ok(
        cairn()
            .args(["run", "wordcount", "-p", "4", "--input"])
            .arg(&input)
            .arg("--output")
            .arg(&out_dir)
            .args(["--checkpoint-interval", "10ms"])
            .args(["--inject-failures", "3", "--seed", "5"])
            .args(RESTART_FAST),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(", 3 restarts, 3/3 injected failures"),
        "{stderr}"
    );
    assert_exactly_once(&out_dir, &expected);
}

#[test]
fn without_a_restart_strategy_budget_the_job_fails_cleanly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = cairn()
        .args([
            "run",
            "wordcount",
            "-p",
            "2",
            "--generate",
            "200000",
            "--keys",
            "100",
        ])
        .arg("--output")
        .arg(tmp.path().join("out"))
        .args([
            "--checkpoint-interval",
            "20ms",
            "--inject-failures",
            "2",
            "--seed",
            "3",
        ])
        .args([
            "-D",
            "restart-strategy.type=fixed-delay",
            "-D",
            "restart-strategy.fixed-delay.attempts=1",
        ])
        .args(["-D", "restart-strategy.fixed-delay.delay=0ms"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: job failed after 1 restart(s)"),
        "{stderr}"
    );
    assert!(last.contains("injected failure"), "{stderr}");
}

fn wordcount_run(parallelism: u32, out_dir: &Path, ck: &Path, extra: &[&str]) -> Command {
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "-p", &parallelism.to_string()])
        .args([
            "--generate",
            &KILL_RECORDS.to_string(),
            "--keys",
            &KILL_KEYS.to_string(),
        ])
        .arg("--output")
        .arg(out_dir)
        .arg("--checkpoint-dir")
        .arg(ck)
        .args(["--checkpoint-interval", "30ms", "--from", "latest"])
        .args(extra)
        .stdout(Stdio::null());
    cmd
}

const KILL_RECORDS: u64 = 8_000_000;
const KILL_KEYS: u64 = 20_000;

/// Runs wordcount under `--from latest` once per failpoint (in an order the seed chooses), each
/// run stopped at its failpoint 2 or 3 checkpoints past the previous run's and killed with
/// SIGKILL there; then runs it to the end. Asserts that every kill landed at its point, what
/// each point implies about the newest completed checkpoint, and that every run restored the
/// newest completed one; returns the check of the committed output.
fn kill_at_failpoints_and_resume(seed: u64, parallelism: u32, extra: &[&str]) -> Check {
    kill_at_failpoints_and_resume_at(seed, parallelism, parallelism, extra)
}

/// [`kill_at_failpoints_and_resume`], with the last run (to the end) at `final_parallelism`.
fn kill_at_failpoints_and_resume_at(
    seed: u64,
    parallelism: u32,
    final_parallelism: u32,
    extra: &[&str],
) -> Check {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("out");
    let ck = tmp.path().join("ck");
    let mut next = seeded(seed);
    let mut newest: Option<u64> = None;
    let mut kills = Vec::new();
    let expected = generated_counts(KILL_RECORDS, KILL_KEYS);
    let exactly_once = !extra.contains(&"at-least-once");
    let concurrent = extra.contains(&"--max-concurrent-checkpoints");
    let mut points = shuffled_failpoints(&mut next);
    if extra
        .iter()
        .any(|a| a.contains("state.backend.type=rocksdb"))
    {
        // Between a subtask's RocksDB upload and its state file.
        points.insert((next() % 5) as usize, "disk-uploaded");
    }
    for (run, point) in points.into_iter().enumerate() {
        let base = checkpoint_progress(&ck).map_or(0, |(_, highest)| highest);
        let at = base + 2 + next() % 2;
        let marker = tmp.path().join(format!("marker-{run}"));
        let log = tmp.path().join(format!("run-{run}.log"));
        let cmd = wordcount_run(parallelism, &out_dir, &ck, extra);
        let (name, id) = kill_at_failpoint(cmd, point, at, &marker, &log)
            .unwrap_or_else(|e| panic!("seed {seed}: run {run}: {e}"));
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            restored_checkpoint(&stderr),
            newest,
            "seed {seed}: run {run} did not restore the newest completed checkpoint: {stderr}"
        );
        assert_eq!(
            name, point,
            "seed {seed}: run {run} stopped at another point"
        );
        assert!(
            id >= at,
            "seed {seed}: {point} fired at {id}, armed for {at}"
        );
        let now = checkpoint_progress(&ck).map(|(id, _)| id);
        let completed = now.unwrap_or(0);
        match point {
            // The coordinator stopped right after learning the metadata was written: nothing
            // newer completed, unless checkpoints run concurrently (the storage thread may have
            // written a newer one's metadata meanwhile).
            "checkpoint-completed" if concurrent => {
                assert!(completed >= id, "seed {seed}: {point} {id}")
            }
            "checkpoint-completed" => assert_eq!(completed, id, "seed {seed}: {point} {id}"),
            // The sink learnt that the checkpoint completed; a newer one may have too.
            "sink-committing" => assert!(completed >= id, "seed {seed}: {point} {id}"),
            // A subtask never acknowledged: the checkpoint cannot have completed.
            _ => assert!(
                completed < id,
                "seed {seed}: {point} {id}: {completed} completed"
            ),
        }
        assert!(
            now >= newest,
            "seed {seed}: completed checkpoints went back"
        );
        newest = now;
        if exactly_once {
            // Committed output never holds a duplicate, not even between kills.
            let so_far = check_output(&out_dir, &expected);
            assert_eq!(
                so_far.duplicates, 0,
                "seed {seed}: duplicates committed by the run killed at {point} {id}"
            );
        }
        kills.push(format!("{point} at {id}"));
    }
    let out = run_ok(wordcount_run(final_parallelism, &out_dir, &ck, extra).stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        restored_checkpoint(&stderr),
        newest,
        "seed {seed}: {stderr}"
    );
    let id = newest.expect("a checkpoint completed before the last kill");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("restored from ") && l.contains(&format!("chk-{id}"))),
        "seed {seed}: {stderr}"
    );
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("wordcount finished"))
        .unwrap_or_default();
    eprintln!(
        "seed {seed}: SIGKILLs at {}; then {summary}",
        kills.join(", ")
    );
    assert_no_leftovers(&out_dir);
    check_output(&out_dir, &expected)
}

fn assert_clean(c: Check) {
    assert_eq!((c.duplicates, c.missing), (0, 0), "exactly-once violated");
}

#[test]
fn sigkill_at_failpoints_and_resume_from_latest_keeps_exactly_once_p4() {
    assert_clean(kill_at_failpoints_and_resume(11, 4, &[]));
}

#[test]
fn sigkill_at_failpoints_with_unaligned_checkpoints_keeps_exactly_once() {
    assert_clean(kill_at_failpoints_and_resume(12, 4, &["--unaligned"]));
}

#[test]
fn sigkill_at_failpoints_with_alignment_timeout_keeps_exactly_once() {
    assert_clean(kill_at_failpoints_and_resume(
        13,
        4,
        &["--aligned-checkpoint-timeout", "5ms"],
    ));
}

#[test]
fn sigkill_at_failpoints_with_concurrent_checkpoints_keeps_exactly_once() {
    assert_clean(kill_at_failpoints_and_resume(
        14,
        4,
        &["--max-concurrent-checkpoints", "3"],
    ));
}

/// A job killed before its first checkpoint completed leaves pre-committed files only. `--from
/// latest` finds no completed checkpoint and continues that job fresh under its own id, so its
/// sink discards them (the seed-14 flake: a new job id left them behind).
#[test]
fn a_job_killed_before_its_first_checkpoint_completed_resumes_fresh_under_its_id() {
    let tmp = tempfile::tempdir().unwrap();
    let (out_dir, ck) = (tmp.path().join("out"), tmp.path().join("ck"));
    let (marker, log) = (tmp.path().join("marker"), tmp.path().join("run.log"));
    let cmd = wordcount_run(2, &out_dir, &ck, &[]);
    let hit = kill_at_failpoint(cmd, "sink-pre-committed", 1, &marker, &log).unwrap();
    assert_eq!(hit, ("sink-pre-committed".to_string(), 1));
    assert_eq!(checkpoint_progress(&ck).map(|(id, _)| id), None);
    let pending = std::fs::read_dir(&out_dir)
        .unwrap()
        .filter(|e| {
            let name = e.as_ref().unwrap().file_name();
            name.to_string_lossy().ends_with(".pending")
        })
        .count();
    assert!(pending > 0, "the killed run pre-committed nothing");
    let jobs: Vec<String> = std::fs::read_dir(&ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    let out = run_ok(wordcount_run(2, &out_dir, &ck, &[]).stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "job {} completed no checkpoint; starting it fresh",
            jobs[0]
        )),
        "{stderr}"
    );
    assert_no_leftovers(&out_dir);
    assert_exactly_once(&out_dir, &generated_counts(KILL_RECORDS, KILL_KEYS));
}

#[test]
fn sigkill_at_failpoints_at_least_once_loses_nothing() {
    let c = kill_at_failpoints_and_resume(15, 4, &["--mode", "at-least-once"]);
    assert_eq!(c.missing, 0, "at-least-once lost records");
    eprintln!(
        "at-least-once with SIGKILLs: {} duplicate output lines",
        c.duplicates
    );
}

const ROCKSDB_INCREMENTAL: [&str; 4] = [
    "-D",
    "state.backend.type=rocksdb",
    "-D",
    "state.backend.incremental=true",
];

/// RocksDB with incremental checkpoints, aligned: killed at every failpoint at parallelism 2,
/// and the last run rescaled to 3 (each new subtask opens the old instances overlapping its
/// key groups and keeps only its keys).
#[test]
fn rocksdb_sigkilled_at_failpoints_and_rescaled_2_to_3_keeps_exactly_once() {
    assert_clean(kill_at_failpoints_and_resume_at(
        31,
        2,
        3,
        &ROCKSDB_INCREMENTAL,
    ));
}

/// RocksDB with incremental checkpoints and unaligned checkpoints (in-flight data with disk
/// state), killed at every failpoint.
#[test]
fn rocksdb_with_unaligned_checkpoints_sigkilled_at_failpoints_keeps_exactly_once() {
    let mut extra = ROCKSDB_INCREMENTAL.to_vec();
    extra.push("--unaligned");
    assert_clean(kill_at_failpoints_and_resume(32, 2, &extra));
}

/// RocksDB with full checkpoints (files in the checkpoint's own directory), killed at every
/// failpoint.
#[test]
fn rocksdb_full_checkpoints_sigkilled_at_failpoints_keep_exactly_once() {
    assert_clean(kill_at_failpoints_and_resume(
        33,
        2,
        &["-D", "state.backend.type=rocksdb"],
    ));
}

#[test]
fn sigkill_at_failpoints_and_resume_from_latest_keeps_exactly_once_p2() {
    assert_clean(kill_at_failpoints_and_resume(23, 2, &[]));
}

/// The backpressure job (two inputs into a keyed co-process, throttled sink) with unaligned
/// checkpoints and injected failures: in-flight data of both inputs is persisted and replayed.
#[test]
fn two_input_job_under_backpressure_with_unaligned_checkpoints_keeps_exactly_once() {
    let (records, keys) = (200_000u64, 500u64);
    let mut expected = std::collections::HashMap::new();
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
    for (seed, mode) in [(21u64, "--unaligned"), (22, "--aligned-checkpoint-timeout")] {
        let tmp = tempfile::tempdir().unwrap();
        let out_dir = tmp.path().join("out");
        let mut cmd = cairn();
        cmd.args(["run", "backpressure", "-p", "2"])
            .args([
                "--generate",
                &records.to_string(),
                "--keys",
                &keys.to_string(),
            ])
            .args(["--sink-rate", "400000"])
            .arg("--output")
            .arg(&out_dir)
            .args(["--checkpoint-interval", "20ms"])
            .args(["--inject-failures", "3", "--seed", &seed.to_string()])
            .args(RESTART_FAST)
            .arg(mode);
        if mode == "--aligned-checkpoint-timeout" {
            cmd.arg("10ms");
        }
        let out = run_ok(&mut cmd);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("3/3 injected failures"), "{stderr}");
        assert_exactly_once(&out_dir, &expected);
    }
}

/// Distinct sink writer instances (file name tokens) among the committed files of `dir`:
/// one per subtask if the sink was never restarted.
fn writer_instances(dir: &std::path::Path) -> usize {
    let mut tokens = std::collections::HashSet::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if let Some(token) = name.split('-').nth(1) {
            if !name.starts_with('.') {
                tokens.insert(token.to_string());
            }
        }
    }
    tokens.len()
}

#[test]
fn region_failover_restarts_only_the_failed_pipeline() {
    let (count, keys) = (400_000u64, 1_000u64);
    let expected = generated_counts(count, keys);
    for seed in [4u64, 9] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let run = run_ok(
            cairn()
                .args(["run", "pipelines", "-p", "2"])
                .args([
                    "--generate",
                    &count.to_string(),
                    "--keys",
                    &keys.to_string(),
                ])
                .arg("--output")
                .arg(&out)
                .args(["--checkpoint-interval", "20ms"])
                .args([
                    "--inject-failures",
                    "3",
                    "--seed",
                    &seed.to_string(),
                    "--inject-uid",
                    "a-",
                ])
                .args(RESTART_FAST)
                .args(["-D", "jobmanager.execution.failover-strategy=region"]),
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(stderr.contains("3/3 injected failures"), "{stderr}");
        assert_eq!(
            stderr.matches("restarting that region only").count(),
            3,
            "{stderr}"
        );
        assert_exactly_once(&out.join("a"), &expected);
        assert_exactly_once(&out.join("b"), &expected);
        // Pipeline b kept running: its two sink subtasks are the ones it started with.
        assert_eq!(
            writer_instances(&out.join("b")),
            2,
            "pipeline b was restarted"
        );
    }
}

#[test]
fn full_failover_restarts_both_pipelines() {
    let (count, keys) = (400_000u64, 1_000u64);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let run = run_ok(
        cairn()
            .args(["run", "pipelines", "-p", "2"])
            .args([
                "--generate",
                &count.to_string(),
                "--keys",
                &keys.to_string(),
            ])
            .arg("--output")
            .arg(&out)
            .args(["--checkpoint-interval", "20ms"])
            .args([
                "--inject-failures",
                "2",
                "--seed",
                "4",
                "--inject-uid",
                "a-",
            ])
            .args(RESTART_FAST)
            .args(["-D", "jobmanager.execution.failover-strategy=full"]),
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(!stderr.contains("restarting that region only"), "{stderr}");
    assert!(stderr.contains(", 2 restarts"), "{stderr}");
    let expected = generated_counts(count, keys);
    assert_exactly_once(&out.join("a"), &expected);
    assert_exactly_once(&out.join("b"), &expected);
}
