//! Savepoints (issue 8): stop-with-savepoint, resuming from a savepoint at another
//! parallelism, moving a savepoint, and refusing a damaged one.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    assert_exactly_once, assert_no_leftovers, cairn, committed_lines, generated_counts, Watched,
};

const WORDS: u64 = 120_000;
const KEYS: u64 = 300;
/// Words per second: the run lasts about 4 s, so a stop lands in the middle of it.
const RATE: &str = "30000";
const DEADLINE: Duration = Duration::from_secs(120);

/// `cairn run wordcount` over the generated words, stopped with a savepoint on SIGTERM.
fn wordcount(
    out: &Path,
    ck: &Path,
    parallelism: u32,
    from: Option<&Path>,
    rate: &str,
) -> std::process::Command {
    let mut cmd = cairn();
    cmd.args([
        "run",
        "wordcount",
        "--generate",
        &WORDS.to_string(),
        "--keys",
        &KEYS.to_string(),
    ])
    .args(["--rate", rate, "--checkpoint-interval", "200ms"])
    .arg("--output")
    .arg(out)
    .arg("--checkpoint-dir")
    .arg(ck)
    .args(["-p", &parallelism.to_string()]);
    if let Some(from) = from {
        cmd.arg("--from").arg(from);
    }
    cmd
}

fn committed_records(out: &Path) -> u64 {
    committed_lines(out).values().map(|v| v.len() as u64).sum()
}

/// Runs until a checkpoint completed, then stops it with SIGTERM and `--savepoint-on-exit`;
/// returns the savepoint's path.
fn run_and_stop(
    out: &Path,
    ck: &Path,
    sp: &Path,
    parallelism: u32,
    from: Option<&Path>,
) -> PathBuf {
    run_and_stop_with(out, ck, sp, parallelism, from, &[])
}

/// [`run_and_stop`] with more flags.
fn run_and_stop_with(
    out: &Path,
    ck: &Path,
    sp: &Path,
    parallelism: u32,
    from: Option<&Path>,
    extra: &[&str],
) -> PathBuf {
    let mut cmd = wordcount(out, ck, parallelism, from, RATE);
    cmd.arg("--savepoint-on-exit").arg(sp).args(extra);
    let (path, stderr) = Watched::spawn(&mut cmd)
        .stop_with_savepoint_after_a_checkpoint(ck, Instant::now() + DEADLINE);
    assert!(stderr.contains("wordcount finished"), "{stderr}");
    path
}

/// Stop with a savepoint, resume at parallelism 4 from it, stop again, resume at 1 to the end:
/// every word's counts 1..n exactly once across the three runs, and each stop landed mid-run.
#[test]
fn stop_with_savepoint_and_resume_at_other_parallelisms_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (out, sp) = (dir.path().join("out"), dir.path().join("savepoints"));
    let first = run_and_stop(&out, &dir.path().join("ck1"), &sp, 2, None);
    let after_first = committed_records(&out);
    assert!(
        after_first > 0 && after_first < WORDS,
        "the first stop must land mid-run: {after_first} of {WORDS} records committed"
    );
    assert_no_leftovers(&out);
    let second = run_and_stop(&out, &dir.path().join("ck2"), &sp, 4, Some(&first));
    let after_second = committed_records(&out);
    assert!(
        after_second > after_first && after_second < WORDS,
        "the second stop must land mid-run: {after_second} of {WORDS}"
    );
    assert_ne!(first, second);
    let mut last = wordcount(&out, &dir.path().join("ck3"), 1, Some(&second), "0");
    let (status, stderr) = Watched::spawn(&mut last).wait(Instant::now() + DEADLINE);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("restored from"), "{stderr}");
    assert_exactly_once(&out, &generated_counts(WORDS, KEYS));
    assert_no_leftovers(&out);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// A state file of the savepoint (not its `_metadata`).
fn a_state_file(sp: &Path) -> PathBuf {
    std::fs::read_dir(sp)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.file_name().is_some_and(|n| n != "_metadata"))
        .expect("a savepoint has state files")
}

/// A savepoint moved elsewhere restores; one with a truncated file or one byte changed is
/// refused before anything runs, naming the file.
#[test]
fn a_moved_savepoint_restores_and_a_damaged_one_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let taken = run_and_stop(
        &out,
        &dir.path().join("ck1"),
        &dir.path().join("sp"),
        2,
        None,
    );
    let moved = dir.path().join("elsewhere").join("my-savepoint");
    copy_dir(&taken, &moved);
    std::fs::remove_dir_all(&taken).unwrap();

    for damage in ["truncate", "flip"] {
        let broken = dir.path().join(format!("broken-{damage}"));
        copy_dir(&moved, &broken);
        let file = a_state_file(&broken);
        let mut bytes = std::fs::read(&file).unwrap();
        match damage {
            "truncate" => bytes.truncate(bytes.len() / 2),
            _ => {
                let i = bytes.len() - 3;
                bytes[i] ^= 0x40;
            }
        }
        std::fs::write(&file, &bytes).unwrap();
        let before = committed_records(&out);
        let run = wordcount(&out, &dir.path().join("ck-broken"), 2, Some(&broken), "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            !run.status.success(),
            "{damage}: a damaged savepoint must be refused"
        );
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        assert!(
            stderr
                .lines()
                .last()
                .is_some_and(|l| l.starts_with("error:") && l.contains(&name)),
            "{damage}: the error names the file {name}: {stderr}"
        );
        assert_eq!(committed_records(&out), before, "{damage}: nothing ran");
    }

    let mut resume = wordcount(&out, &dir.path().join("ck2"), 3, Some(&moved), "0");
    let (status, stderr) = Watched::spawn(&mut resume).wait(Instant::now() + DEADLINE);
    assert!(status.success(), "{stderr}");
    assert_exactly_once(&out, &generated_counts(WORDS, KEYS));
}

/// The job id `cairn list` shows first.
fn first_job(rest: &str) -> String {
    let out = common::run_ok(cairn().args(["list", "--rest", rest]));
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace()
        .next()
        .unwrap_or_else(|| panic!("no job listed: {text}"))
        .to_string()
}

/// The path a `savepoint stored in PATH` line of stdout names.
fn stored_at(out: &std::process::Output) -> PathBuf {
    let text = String::from_utf8_lossy(&out.stdout);
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("savepoint stored in "))
        .unwrap_or_else(|| panic!("no savepoint path in: {text}"));
    PathBuf::from(path)
}

/// Through the REST API and the command line: an intermediate savepoint while the job runs
/// (it keeps running, and `savepoint info` describes it), then `cairn stop`, which ends the
/// job FINISHED with a final savepoint; resuming from that one is exactly once, and `dispose`
/// deletes the intermediate one.
#[test]
fn savepoint_and_stop_from_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out");
    let mut cmd = wordcount(&out, &dir.path().join("ck1"), 2, None, RATE);
    cmd.args(["--rest", "127.0.0.1:0"]);
    let mut run = Watched::spawn(&mut cmd);
    let until = Instant::now() + DEADLINE;
    let rest = run.rest_addr(until).to_string();
    let jid = first_job(&rest);

    let sp = dir.path().join("manual");
    let taken = common::run_ok(
        cairn()
            .args(["savepoint", &jid])
            .arg(&sp)
            .args(["--rest", &rest]),
    );
    let intermediate = stored_at(&taken);
    assert!(intermediate.starts_with(&sp), "{}", intermediate.display());
    run.assert_running();
    let info = common::run_ok(cairn().args(["savepoint", "info"]).arg(&intermediate));
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.starts_with("savepoint "), "{info}");
    for uid in ["source", "count"] {
        assert!(info.contains(&format!("operator '{uid}'")), "{uid}: {info}");
    }
    // Per state: name, kind and serializer, then each subtask's share.
    assert!(
        info.contains("  state 'count': value state, serializer cairn.serde-postcard v1 of u64"),
        "{info}"
    );
    assert!(info.contains("operator list state 'splits'"), "{info}");
    assert!(info.contains("value state 'count' of u64 ("), "{info}");

    let stopped = common::run_ok(
        cairn()
            .args(["stop", &jid, "--savepoint-dir"])
            .arg(dir.path().join("final"))
            .args(["--rest", &rest]),
    );
    let last = stored_at(&stopped);
    assert!(String::from_utf8_lossy(&stopped.stdout).contains(&format!("job {jid} finished")));
    let (status, stderr) = run.wait(until);
    assert!(status.success(), "{stderr}");
    assert!(committed_records(&out) < WORDS, "the stop landed mid-run");

    let resumed = wordcount(&out, &dir.path().join("ck2"), 2, Some(&last), "0")
        .output()
        .unwrap();
    assert!(
        resumed.status.success(),
        "{}",
        String::from_utf8_lossy(&resumed.stderr)
    );
    assert_exactly_once(&out, &generated_counts(WORDS, KEYS));

    common::run_ok(cairn().args(["savepoint", "dispose"]).arg(&intermediate));
    assert!(!intermediate.exists());
    let again = cairn()
        .args(["savepoint", "dispose"])
        .arg(&intermediate)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("does not exist"));
}

fn job_state(rest: &str, jid: &str) -> String {
    let out = common::run_ok(cairn().args(["status", jid, "--rest", rest]));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines()
        .find_map(|l| {
            l.trim()
                .strip_prefix("state")
                .map(|s| s.trim_start_matches([' ', ':']).trim().to_string())
        })
        .unwrap_or_else(|| panic!("no state in {text}"))
}

/// Submits wordcount to the cluster; returns the job id.
fn submit(rest: &str, out: &Path, parallelism: u32, from: Option<&Path>, rate: &str) -> String {
    let mut cmd = cairn();
    cmd.args([
        "submit",
        "--rest",
        rest,
        "wordcount",
        "--generate",
        &WORDS.to_string(),
        "--keys",
        &KEYS.to_string(),
        "--rate",
        rate,
        "--checkpoint-interval",
        "200ms",
        "-p",
        &parallelism.to_string(),
        "--output",
    ])
    .arg(out);
    if let Some(from) = from {
        cmd.arg("--from").arg(from);
    }
    let o = common::run_ok(&mut cmd);
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// Waits until job `jid` completed a checkpoint under `ck`, then stops it with a savepoint.
fn stop_after_a_checkpoint(rest: &str, ck: &Path, jid: &str, sp: &Path) -> PathBuf {
    let until = Instant::now() + DEADLINE;
    while !std::fs::read_dir(ck.join(jid))
        .is_ok_and(|d| d.flatten().any(|e| e.path().join("_metadata").is_file()))
    {
        assert_ne!(job_state(rest, jid), "FAILED");
        assert!(
            Instant::now() < until,
            "job {jid} completed no checkpoint in time"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = common::run_ok(
        cairn()
            .args(["stop", jid, "--savepoint-dir"])
            .arg(sp)
            .args(["--rest", rest]),
    );
    assert_eq!(job_state(rest, jid), "FINISHED");
    stored_at(&out)
}

/// In cluster mode: stop with a savepoint, resume at 4, stop, resume at 1 to the end.
#[test]
fn cluster_stop_and_resume_at_other_parallelisms_is_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let (ck, out, sp) = (
        dir.path().join("ck"),
        dir.path().join("out"),
        dir.path().join("sp"),
    );
    let cluster = common::Cluster::start(&ck, 2, Instant::now() + DEADLINE);
    let rest = cluster.rest.to_string();
    let first = submit(&rest, &out, 2, None, RATE);
    let sp1 = stop_after_a_checkpoint(&rest, &ck, &first, &sp);
    let after_first = committed_records(&out);
    assert!(after_first > 0 && after_first < WORDS, "{after_first}");
    let second = submit(&rest, &out, 4, Some(&sp1), RATE);
    let sp2 = stop_after_a_checkpoint(&rest, &ck, &second, &sp);
    assert!(committed_records(&out) < WORDS);
    let third = submit(&rest, &out, 1, Some(&sp2), "0");
    let until = Instant::now() + DEADLINE;
    loop {
        match job_state(&rest, &third).as_str() {
            "FINISHED" => break,
            "FAILED" | "CANCELED" => panic!("the last run failed"),
            _ => assert!(Instant::now() < until, "the last run did not finish"),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_exactly_once(&out, &generated_counts(WORDS, KEYS));
    assert_no_leftovers(&out);
}

/// Operators are matched by uid: a job without some of the savepoint's operators is refused,
/// naming them, unless `--allow-non-restored-state`; its new operators start empty.
#[test]
fn a_changed_job_needs_allow_non_restored_state_for_operators_it_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let sp = run_and_stop(
        &dir.path().join("out"),
        &dir.path().join("ck1"),
        &dir.path().join("sp"),
        2,
        None,
    );
    // `backpressure` has a sink with uid "sink" too, but neither "source" nor "count".
    let other = |extra: &[&str]| {
        cairn()
            .args(["run", "backpressure", "--generate", "2000", "--discard"])
            .arg("--checkpoint-dir")
            .arg(dir.path().join("ck2"))
            .arg("--from")
            .arg(&sp)
            .args(extra)
            .output()
            .unwrap()
    };
    let refused = other(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error:")
            && last.contains("count, source")
            && last.contains("--allow-non-restored-state"),
        "{stderr}"
    );
    let allowed = other(&["--allow-non-restored-state"]);
    let stderr = String::from_utf8_lossy(&allowed.stderr);
    assert!(allowed.status.success(), "{stderr}");
    assert!(
        stderr.contains("dropping the state of operators the job does not have: count, source"),
        "{stderr}"
    );
}

/// Checkpoint directories (`chk-*`) of any job under `ck` that completed.
fn completed_checkpoints(ck: &Path) -> usize {
    let Ok(jobs) = std::fs::read_dir(ck) else {
        return 0;
    };
    jobs.flatten()
        .filter_map(|j| std::fs::read_dir(j.path()).ok())
        .flat_map(|d| d.flatten())
        .filter(|e| e.path().join("_metadata").is_file())
        .count()
}

/// Cancelling deletes the job's checkpoints (DELETE_ON_CANCELLATION), or keeps them with
/// RETAIN_ON_CANCELLATION.
#[test]
fn cancelling_deletes_or_retains_checkpoints_as_configured() {
    for (retention, kept) in [
        ("DELETE_ON_CANCELLATION", false),
        ("RETAIN_ON_CANCELLATION", true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let ck = dir.path().join("ck");
        let mut cmd = wordcount(&dir.path().join("out"), &ck, 2, None, RATE);
        cmd.args(["--rest", "127.0.0.1:0", "-D"]).arg(format!(
            "execution.checkpointing.externalized-checkpoint-retention={retention}"
        ));
        let mut run = Watched::spawn(&mut cmd);
        let until = Instant::now() + DEADLINE;
        let rest = run.rest_addr(until).to_string();
        run.wait_for_a_checkpoint(&ck, until);
        let jid = first_job(&rest);
        common::run_ok(cairn().args(["cancel", &jid, "--rest", &rest]));
        let (status, stderr) = run.wait(until);
        assert!(
            !status.success() && stderr.contains("job cancelled"),
            "{stderr}"
        );
        assert_eq!(
            completed_checkpoints(&ck) > 0,
            kept,
            "{retention}: {stderr}"
        );
    }
}

/// Every file under `dir` (one level: a savepoint or checkpoint directory) with its bytes.
fn files_of(dir: &Path) -> std::collections::BTreeMap<PathBuf, Vec<u8>> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| (e.path(), std::fs::read(e.path()).unwrap()))
        .collect()
}

/// The newest completed checkpoint directory under `ck`.
fn newest_checkpoint(ck: &Path) -> PathBuf {
    let mut dirs: Vec<(u64, PathBuf)> = std::fs::read_dir(ck)
        .unwrap()
        .flatten()
        .filter_map(|j| std::fs::read_dir(j.path()).ok())
        .flatten()
        .flatten()
        .filter(|d| d.path().join("_metadata").is_file())
        .filter_map(|d| {
            let name = d.file_name().to_string_lossy().into_owned();
            Some((name.strip_prefix("chk-")?.parse().ok()?, d.path()))
        })
        .collect();
    dirs.sort();
    dirs.pop().expect("a completed checkpoint").1
}

/// `execution.state-recovery.claim-mode`: with `NO_CLAIM` (the default) a savepoint or a
/// retained checkpoint a job starts from is never modified or deleted, however many
/// checkpoints the job completes after it; with `CLAIM` it becomes the job's and is deleted
/// once subsumed.
#[test]
fn no_claim_never_touches_the_snapshot_and_claim_deletes_it_once_subsumed() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let ck1 = d.join("ck1");
    let sp = run_and_stop(&d.join("out1"), &ck1, &d.join("sp"), 2, None);
    // Every resume writes into the first run's output, where its sink's files are (the output
    // itself is not what this test checks).
    let resume = |ck: &Path, from: &Path, extra: &[&str]| {
        let mut cmd = wordcount(&d.join("out1"), ck, 2, Some(from), "0");
        cmd.args(extra);
        let (status, stderr) = Watched::spawn(&mut cmd).wait(Instant::now() + DEADLINE);
        assert!(status.success(), "{stderr}");
        assert!(stderr.contains("restored from"), "{stderr}");
        stderr
    };

    // NO_CLAIM from the savepoint: it is byte for byte what it was.
    let savepoint = files_of(&sp);
    resume(&d.join("ck2"), &sp, &[]);
    assert_eq!(files_of(&sp), savepoint, "NO_CLAIM modified the savepoint");

    // NO_CLAIM from a retained checkpoint in the same checkpoint directory: the new job takes
    // its checkpoints under its own id, and retention never deletes the one it started from.
    let chk = newest_checkpoint(&ck1);
    let retained = files_of(&chk);
    resume(&ck1, &chk, &[]);
    assert_eq!(files_of(&chk), retained, "NO_CLAIM modified the checkpoint");
    assert_ne!(newest_checkpoint(&ck1).parent(), chk.parent());

    // CLAIM: the savepoint is the job's first retained checkpoint, deleted once subsumed.
    let stderr = resume(
        &d.join("ck4"),
        &sp,
        &["-D", "execution.state-recovery.claim-mode=CLAIM"],
    );
    assert!(stderr.contains("deleted the claimed snapshot"), "{stderr}");
    assert!(!sp.exists(), "the claimed savepoint still exists");

    let bad = wordcount(&d.join("out5"), &d.join("ck5"), 2, None, "0")
        .args(["-D", "execution.state-recovery.claim-mode=MAYBE"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        stderr.contains("execution.state-recovery.claim-mode")
            && stderr.contains("NO_CLAIM or CLAIM"),
        "{stderr}"
    );
}

/// The savepoint fixture: a stop-with-savepoint of `wordcount --generate FIXTURE_WORDS --keys
/// FIXTURE_KEYS` at parallelism 2 taken by this format version, with the output its run had
/// committed. Regenerate (only when the format changes on purpose, bumping the directory's
/// version) with `CAIRN_WRITE_SAVEPOINT_FIXTURE=1 cargo test --release -p cairn-cli --test
/// savepoint committed_savepoint_fixture`.
const FIXTURE: &str = "tests/fixtures/savepoint-v2";
const ROCKSDB: [&str; 4] = [
    "-D",
    "state.backend.type=rocksdb",
    "-D",
    "state.backend.incremental=true",
];

/// Savepoints are in the backend-independent format: a job stopped on the heap backend
/// resumes on RocksDB (at another parallelism), is stopped there, and resumes on the heap
/// again; every word's counts are committed exactly once across the three runs.
#[test]
fn savepoints_move_a_job_between_the_heap_and_rocksdb_backends() {
    let dir = tempfile::tempdir().unwrap();
    let (out, sp) = (dir.path().join("out"), dir.path().join("savepoints"));
    let first = run_and_stop(&out, &dir.path().join("ck1"), &sp, 2, None);
    let after_first = committed_records(&out);
    assert!(after_first > 0 && after_first < WORDS, "{after_first}");
    let second = run_and_stop_with(
        &out,
        &dir.path().join("ck2"),
        &sp,
        3,
        Some(&first),
        &ROCKSDB,
    );
    let after_second = committed_records(&out);
    assert!(
        after_second > after_first && after_second < WORDS,
        "the RocksDB run must stop mid-run: {after_second} of {WORDS}"
    );
    let mut last = wordcount(&out, &dir.path().join("ck3"), 2, Some(&second), "0");
    let (status, stderr) = Watched::spawn(&mut last).wait(Instant::now() + DEADLINE);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("restored from"), "{stderr}");
    assert_exactly_once(&out, &generated_counts(WORDS, KEYS));
    assert_no_leftovers(&out);
}

const FIXTURE_WORDS: u64 = 6_000;
const FIXTURE_KEYS: u64 = 40;

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(FIXTURE)
}

/// Copies the committed files of `from` (not hidden ones) into `to`.
fn copy_committed(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with('.') && !name.starts_with('_') {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// Copies the fixture's committed output and savepoint into `dir` (the fixture stays
/// untouched); returns the output directory and the savepoint.
fn fixture_copy(fixture: &Path, dir: &Path) -> (PathBuf, PathBuf) {
    let (out, sp) = (dir.join("out"), dir.join("sp"));
    copy_committed(&fixture.join("output"), &out);
    copy_dir(&fixture.join("savepoint"), &sp);
    (out, sp)
}

/// The fixture's job resumed from `sp` at parallelism 3, committing into `out`.
fn resume_fixture(out: &Path, ck: &Path, sp: &Path) -> std::process::Command {
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "--generate", &FIXTURE_WORDS.to_string()])
        .args(["--keys", &FIXTURE_KEYS.to_string(), "-p", "3", "--output"])
        .arg(out)
        .arg("--checkpoint-dir")
        .arg(ck)
        .arg("--from")
        .arg(sp);
    cmd
}

fn write_savepoint_fixture(fixture: &Path) {
    let dir = tempfile::tempdir().unwrap();
    let (out, ck) = (dir.path().join("out"), dir.path().join("ck"));
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "--generate", &FIXTURE_WORDS.to_string()])
        .args(["--keys", &FIXTURE_KEYS.to_string(), "--rate", "3000"])
        .args(["--checkpoint-interval", "200ms", "-p", "2", "--output"])
        .arg(&out)
        .arg("--checkpoint-dir")
        .arg(&ck)
        .arg("--savepoint-on-exit")
        .arg(dir.path().join("sp"));
    let (sp, _) = Watched::spawn(&mut cmd)
        .stop_with_savepoint_after_a_checkpoint(&ck, Instant::now() + DEADLINE);
    let _ = std::fs::remove_dir_all(fixture);
    copy_dir(&sp, &fixture.join("savepoint"));
    copy_committed(&out, &fixture.join("output"));
}

/// A savepoint taken by this format version, committed in the repository, restores — at
/// another parallelism — and the job continues exactly once from it. A change that breaks
/// savepoint compatibility (the key encoding, the hash, a state's encoding, the file format)
/// fails here.
#[test]
fn committed_savepoint_fixture_restores_and_continues_exactly_once() {
    let fixture = fixture_dir();
    if std::env::var_os("CAIRN_WRITE_SAVEPOINT_FIXTURE").is_some() {
        write_savepoint_fixture(&fixture);
    }
    let info = common::run_ok(
        cairn()
            .args(["savepoint", "info"])
            .arg(fixture.join("savepoint")),
    );
    let info = String::from_utf8_lossy(&info.stdout);
    for line in [
        "max parallelism: 128",
        "operator 'count': parallelism 2",
        "  state 'count': value state, serializer cairn.serde-postcard v1 of u64",
        "  state 'splits': operator list state, serializer cairn.serde-postcard v1 of source split",
        "  state 'pending': operator list state, serializer cairn.serde-postcard v1 of sink transaction",
    ] {
        assert!(info.contains(line), "missing {line:?} in\n{info}");
    }

    // The fixture stays untouched: the run works on copies of it.
    let dir = tempfile::tempdir().unwrap();
    let (out, sp) = fixture_copy(&fixture, dir.path());
    let before = committed_records(&out);
    assert!(
        before > 0 && before < FIXTURE_WORDS,
        "the fixture's run stopped mid-way: {before} of {FIXTURE_WORDS}"
    );
    let resume = || resume_fixture(&out, &dir.path().join("ck"), &sp);

    // Another max parallelism would put keys in other key groups: refused before anything runs.
    let refused = resume()
        .args(["-D", "pipeline.max-parallelism=256"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(
        stderr.contains("was taken with max parallelism 128, the job has 256"),
        "{stderr}"
    );
    assert_eq!(committed_records(&out), before);

    let (status, stderr) = Watched::spawn(&mut resume()).wait(Instant::now() + DEADLINE);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("restored from"), "{stderr}");
    assert_exactly_once(&out, &generated_counts(FIXTURE_WORDS, FIXTURE_KEYS));
    assert_no_leftovers(&out);
}

/// The committed savepoint fixture (written on the heap backend by format version 2) restores
/// on the RocksDB backend at parallelism 3 and continues exactly once.
#[test]
fn committed_savepoint_fixture_restores_on_rocksdb() {
    let dir = tempfile::tempdir().unwrap();
    let (out, sp) = fixture_copy(&fixture_dir(), dir.path());
    let mut cmd = resume_fixture(&out, &dir.path().join("ck"), &sp);
    cmd.args(ROCKSDB);
    let (status, stderr) = Watched::spawn(&mut cmd).wait(Instant::now() + DEADLINE);
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("restored from"), "{stderr}");
    assert_exactly_once(&out, &generated_counts(FIXTURE_WORDS, FIXTURE_KEYS));
    assert_no_leftovers(&out);
}
