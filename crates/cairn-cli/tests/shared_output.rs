//! Two wordcount jobs writing into one `--output` directory: each job's restore removes only
//! its own uncommitted files, so both end exactly once (issue 7, defect 3.8).

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

const COUNT: u64 = 6_000_000;
const KEYS: u64 = 2_000;

/// Starts `wordcount` into `out` with checkpoints in `ck`, resuming from the latest one there.
fn start(out: &Path, ck: &Path) -> Child {
    cairn()
        .args(["run", "wordcount", "-p", "2"])
        .args([
            "--generate",
            &COUNT.to_string(),
            "--keys",
            &KEYS.to_string(),
        ])
        .arg("--output")
        .arg(out)
        .arg("--checkpoint-dir")
        .arg(ck)
        .args(["--checkpoint-interval", "30ms", "--from", "latest"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("cairn starts")
}

/// The id of the one job under checkpoint directory `ck`, once it has one.
fn job_id(ck: &Path) -> Option<String> {
    let mut ids: Vec<String> = std::fs::read_dir(ck)
        .ok()?
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    assert!(ids.len() <= 1, "one job per checkpoint directory: {ids:?}");
    ids.pop()
}

/// The newest completed checkpoint of the job in `ck`, 0 if none (`_metadata` is written
/// last, atomically; older checkpoints are deleted as newer ones complete).
fn latest_checkpoint(ck: &Path) -> u64 {
    let Some(job) = job_id(ck) else { return 0 };
    let Ok(entries) = std::fs::read_dir(ck.join(job)) else {
        return 0;
    };
    entries
        .map(|e| e.expect("entry"))
        .filter(|e| e.path().join("_metadata").exists())
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("chk-")?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Hidden (in-progress or pending) files of job `job` in `out`; field 2 of a name is the job.
fn uncommitted_of(out: &Path, job: &str) -> BTreeSet<String> {
    std::fs::read_dir(out)
        .expect("output dir exists")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n.split('-').nth(2) == Some(job))
        .collect()
}

/// Runs until one more checkpoint than `done` has completed, then SIGKILLs the process: a
/// kill after a chosen point of progress, not after a wall-clock delay. Panics if the job
/// finished first or the checkpoint did not come within a minute.
fn kill_after_next_checkpoint(child: &mut Child, ck: &Path) {
    let target = latest_checkpoint(ck) + 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while latest_checkpoint(ck) < target {
        if let Some(status) = child.try_wait().expect("wait") {
            panic!("the job ended ({status}) before checkpoint {target} completed");
        }
        assert!(
            Instant::now() < deadline,
            "no checkpoint {target} within a minute"
        );
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().expect("SIGKILL");
    child.wait().expect("reaped");
}

/// Kills the job in `ck` after checkpoints until it leaves uncommitted files behind (a kill
/// can land just after a commit, when it has none); returns them.
fn kill_leaving_uncommitted(child: &mut Child, out: &Path, ck: &Path) -> BTreeSet<String> {
    for _ in 0..10 {
        kill_after_next_checkpoint(child, ck);
        let job = job_id(ck).expect("the job has a checkpoint");
        let left = uncommitted_of(out, &job);
        if !left.is_empty() {
            return left;
        }
        *child = start(out, ck);
    }
    panic!("ten kills after a checkpoint left no uncommitted file");
}

fn finish(child: Child) {
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "cairn failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Copies the committed files of `job` into a directory of their own, for `check_output`.
fn committed_of(out: &Path, job: &str, into: PathBuf) -> PathBuf {
    std::fs::create_dir_all(&into).expect("mkdir");
    for e in std::fs::read_dir(out).expect("output dir exists") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && name.split('-').nth(2) == Some(job) {
            std::fs::copy(out.join(&name), into.join(&name)).expect("copy");
        }
    }
    into
}

#[test]
fn two_jobs_sharing_an_output_directory_each_end_exactly_once() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let (ck_a, ck_b) = (tmp.path().join("ck-a"), tmp.path().join("ck-b"));

    // Job A dies after a checkpoint, leaving pending and in-progress files.
    let mut a = start(&out, &ck_a);
    let left_a = kill_leaving_uncommitted(&mut a, &out, &ck_a);
    let job_a = job_id(&ck_a).expect("job a");

    // Job B starts fresh in the same directory: its cleanup must not take A's files.
    let mut b = start(&out, &ck_b);
    let left_b = kill_leaving_uncommitted(&mut b, &out, &ck_b);
    let job_b = job_id(&ck_b).expect("job b");
    assert_ne!(job_a, job_b);
    assert!(
        left_a.is_subset(&uncommitted_of(&out, &job_a)),
        "job b's start removed job a's uncommitted files"
    );

    // A resumes alone: it commits its restored pending files and removes its own leftovers
    // written after that checkpoint (or they would still be there when it finished), and
    // leaves B's alone.
    finish(start(&out, &ck_a));
    assert!(
        uncommitted_of(&out, &job_a).is_empty(),
        "job a's restore left its own uncommitted files behind"
    );
    assert!(
        left_b.is_subset(&uncommitted_of(&out, &job_b)),
        "job a's restore removed job b's uncommitted files"
    );

    // B resumes: its pending files are still there to commit.
    finish(start(&out, &ck_b));
    assert_no_leftovers(&out);
    let expected = generated_counts(COUNT, KEYS);
    assert_exactly_once(&committed_of(&out, &job_a, tmp.path().join("a")), &expected);
    assert_exactly_once(&committed_of(&out, &job_b, tmp.path().join("b")), &expected);
}
