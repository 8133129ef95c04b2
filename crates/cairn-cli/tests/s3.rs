//! Checkpoints on S3 (`state.checkpoints.dir: s3://bucket/prefix`), against the local S3
//! server that `scripts/service-s3` starts (moto, on 127.0.0.1:55000; `CAIRN_TEST_S3_ENDPOINT`
//! names another). Real processes are SIGKILLed at chosen failpoints while their checkpoints
//! go to S3, and resume from the newest one there; the committed output stays exactly-once,
//! retention leaves exactly the retained checkpoints, and incremental RocksDB checkpoints
//! keep exactly the shared files those reference.

mod common;

use std::collections::BTreeSet;
use std::process::{Command, Stdio};

use cairn::storage::{CheckpointStorage, S3Settings, S3Storage, S3Url};
use common::*;

const RECORDS: u64 = 3_000_000;
const KEYS: u64 = 5_000;
/// Words per second of the runs that are killed: 3M words last them at least 7.5 s.
const KILL_RUN_RATE: u64 = 400_000;

fn endpoint() -> String {
    std::env::var("CAIRN_TEST_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:55000".into())
}

fn settings() -> S3Settings {
    S3Settings {
        endpoint: Some(endpoint()),
        access_key: Some("cairn".into()),
        secret_key: Some("cairn".into()),
        ..S3Settings::default()
    }
}

/// A fresh prefix of the test bucket and the storage there.
fn fresh_prefix(name: &str) -> (String, S3Storage) {
    let url = format!("s3://cairn-test/e2e/{name}-{:016x}", fastrand_u64());
    let storage = S3Storage::open(&S3Url::parse(&url).unwrap(), &settings()).unwrap_or_else(|e| {
        panic!(
            "{e}\nthese tests need a local S3 server at {} with bucket cairn-test: start it with scripts/service-s3",
            endpoint()
        )
    });
    (url, storage)
}

fn fastrand_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .elapsed()
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

fn run(url: &str, out: &std::path::Path, p: u32, extra: &[&str]) -> Command {
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "-p", &p.to_string()])
        .args([
            "--generate",
            &RECORDS.to_string(),
            "--keys",
            &KEYS.to_string(),
        ])
        .arg("--output")
        .arg(out)
        .args(["--checkpoint-dir", url])
        .args(["--checkpoint-interval", "100ms", "--from", "latest"])
        .arg("-D")
        .arg(format!("s3.endpoint={}", endpoint()))
        .args(["-D", "s3.access-key=cairn", "-D", "s3.secret-key=cairn"])
        .args(extra)
        .stdout(Stdio::null());
    cmd
}

/// The job directory under the storage root (the test's runs all resume one job).
fn job_dir(s: &S3Storage) -> Option<String> {
    s.list("").unwrap().into_iter().next()
}

/// Completed checkpoints (those with a `_metadata`) and the highest checkpoint directory.
fn progress(s: &S3Storage) -> (Vec<u64>, u64) {
    let Some(job) = job_dir(s) else {
        return (Vec::new(), 0);
    };
    let mut completed = Vec::new();
    let mut highest = 0;
    for name in s.list(&job).unwrap() {
        let Some(id) = name.strip_prefix("chk-").and_then(|n| n.parse().ok()) else {
            continue;
        };
        highest = highest.max(id);
        if s.exists(&format!("{job}/{name}/_metadata")).unwrap() {
            completed.push(id);
        }
    }
    completed.sort_unstable();
    (completed, highest)
}

/// SIGKILLs wordcount at each of `points` (each 2 checkpoints past the last), resumes it from
/// the newest checkpoint on S3 every time, runs it to the end at `final_p`, and checks the
/// committed output and what is left on S3.
fn kill_and_resume_on_s3(name: &str, p: u32, final_p: u32, points: &[&str], extra: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let (url, s3) = fresh_prefix(name);
    let expected = generated_counts(RECORDS, KEYS);
    let mut newest: Option<u64> = None;
    for (i, point) in points.iter().enumerate() {
        let at = progress(&s3).1 + 2;
        let marker = tmp.path().join(format!("marker-{i}"));
        let log = tmp.path().join(format!("run-{i}.log"));
        // Paced, so that the failpoint comes long before the input's end however slow the
        // S3 server makes checkpoints; the last run goes as fast as it can.
        let mut paced = run(&url, &out, p, extra);
        paced.args(["--rate", &KILL_RUN_RATE.to_string()]);
        let (hit, id) = kill_at_failpoint(paced, point, at, &marker, &log)
            .unwrap_or_else(|e| panic!("run {i}: {e}"));
        assert_eq!((hit.as_str(), id >= at), (*point, true), "run {i}");
        let stderr = std::fs::read_to_string(&log).unwrap();
        if let Some(n) = newest {
            assert!(
                stderr.contains(&format!("restoring job from checkpoint {n} ")),
                "run {i} did not restore checkpoint {n} from S3: {stderr}"
            );
        }
        let completed = progress(&s3).0.last().copied();
        match *point {
            "checkpoint-completed" => assert_eq!(completed, Some(id), "{point} {id}"),
            "sink-committing" => assert!(completed >= Some(id), "{point} {id}"),
            _ => assert!(completed.unwrap_or(0) < id, "{point} {id}: {completed:?}"),
        }
        newest = completed;
        let so_far = check_output(&out, &expected);
        assert_eq!(
            so_far.duplicates, 0,
            "duplicates after the kill at {point} {id}"
        );
    }
    let done = run_ok(run(&url, &out, final_p, extra).stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&done.stderr);
    let n = newest.expect("a checkpoint completed before the last kill");
    assert!(
        stderr.contains(&format!("restoring job from checkpoint {n} ")) && stderr.contains("s3://"),
        "{stderr}"
    );
    assert_exactly_once(&out, &expected);
    assert_no_leftovers(&out);

    // Retention on S3: exactly the one retained checkpoint is left, whole.
    let job = job_dir(&s3).expect("the job's directory");
    let (completed, _) = progress(&s3);
    let dirs: Vec<String> = s3
        .list(&job)
        .unwrap()
        .into_iter()
        .filter(|d| d.starts_with("chk-"))
        .collect();
    assert_eq!(
        completed.len(),
        1,
        "retained: {completed:?}, directories {dirs:?}"
    );
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    // Shared files (incremental RocksDB): exactly those the retained checkpoint references.
    let shared: BTreeSet<String> = s3
        .list(&format!("{job}/shared"))
        .unwrap()
        .into_iter()
        .collect();
    let metadata = s3.read(&format!("{job}/{}/_metadata", dirs[0])).unwrap();
    for f in &shared {
        assert!(
            metadata.windows(f.len()).any(|w| w == f.as_bytes()),
            "shared file {f} is not referenced by the retained checkpoint"
        );
    }
    if extra.iter().any(|a| a.contains("incremental=true")) {
        assert!(
            !shared.is_empty(),
            "incremental checkpoints left no shared files"
        );
    }
    s3.delete(&job).unwrap();
}

#[test]
fn sigkilled_at_every_failpoint_with_checkpoints_on_s3_keeps_exactly_once() {
    kill_and_resume_on_s3("heap", 2, 2, &FAILPOINTS, &[]);
}

#[test]
fn rocksdb_incremental_on_s3_sigkilled_and_rescaled_2_to_3_keeps_exactly_once() {
    kill_and_resume_on_s3(
        "rocksdb",
        2,
        3,
        &["upload", "disk-uploaded", "sink-committing"],
        &[
            "-D",
            "state.backend.type=rocksdb",
            "-D",
            "state.backend.incremental=true",
            "-D",
            "state.backend.rocksdb.memory.fixed-per-slot=16mb",
        ],
    );
}

#[test]
fn an_unreachable_s3_service_or_a_missing_bucket_is_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    for (url, endpoint) in [
        ("s3://cairn-test/x", "http://127.0.0.1:9".to_string()),
        ("s3://no-such-bucket-for-cairn/x", endpoint()),
    ] {
        let out = cairn()
            .args(["run", "wordcount", "--generate", "10", "--keys", "2"])
            .arg("--output")
            .arg(tmp.path().join("out"))
            .args(["--checkpoint-dir", url, "-D"])
            .arg(format!("s3.endpoint={endpoint}"))
            .args(["-D", "s3.access-key=cairn", "-D", "s3.secret-key=cairn"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{url}: {stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(lines.len(), 1, "{url}: {stderr}");
        assert!(lines[0].contains(url), "{url}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}
