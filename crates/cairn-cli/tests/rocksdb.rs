//! The RocksDB state backend from the command line (issue 10): the shared files of incremental
//! checkpoints are reference-counted across kills, restores and stops.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cairn::checkpoint::CheckpointMetadata;
use cairn::storage::format::{decode, FileKind};
use common::{cairn, kill_at_failpoint, Watched};

const DEADLINE: Duration = Duration::from_secs(240);

fn run(ck: &Path, extra: &[&str]) -> Command {
    let mut cmd = cairn();
    cmd.args([
        "run",
        "wordcount",
        "--generate",
        "2000000000",
        "--keys",
        "20000",
    ])
    .args(["-p", "2", "--discard", "--checkpoint-interval", "5ms"])
    .arg("--checkpoint-dir")
    .arg(ck)
    .args(["--from", "latest"])
    .args(["-D", "state.backend.type=rocksdb"])
    .args(["-D", "state.backend.incremental=true"])
    .args(["-D", "state.checkpoints.num-retained=3"])
    .args(extra);
    cmd
}

/// The one job directory under `ck`.
fn job_dir(ck: &Path) -> PathBuf {
    let jobs: Vec<PathBuf> = std::fs::read_dir(ck)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs[0].clone()
}

/// Ids of the completed checkpoints (with `_metadata`) in a job directory.
fn completed(job: &Path) -> Vec<u64> {
    let mut ids: Vec<u64> = std::fs::read_dir(job)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().join("_metadata").is_file())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("chk-")?.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    ids
}

/// The shared files the completed checkpoints of a job reference.
fn referenced(job: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for id in completed(job) {
        let bytes = std::fs::read(job.join(format!("chk-{id}/_metadata"))).unwrap();
        let meta: CheckpointMetadata = decode(FileKind::Metadata, &bytes).unwrap();
        out.extend(meta.shared_files);
    }
    out
}

/// The files in a job's shared directory, as `_metadata` names them.
fn on_disk(job: &Path) -> BTreeSet<String> {
    let name = job.file_name().unwrap().to_string_lossy().into_owned();
    std::fs::read_dir(job.join("shared"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| format!("{name}/shared/{}", e.file_name().to_string_lossy()))
        .collect()
}

/// A run killed with SIGKILL right after a subtask uploaded its RocksDB files of checkpoint 40
/// (before its state file and acknowledgement) leaves files no
/// completed checkpoint references; the resumed run deletes them, completes more than 100
/// incremental checkpoints and is stopped with a savepoint. Then the shared files on disk are
/// exactly those the 3 retained checkpoints reference: none leaked, none missing.
#[test]
fn shared_files_on_disk_are_exactly_those_the_retained_checkpoints_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (marker, log) = (tmp.path().join("marker"), tmp.path().join("run-1.log"));
    let (point, id) = kill_at_failpoint(run(&ck, &[]), "disk-uploaded", 40, &marker, &log).unwrap();
    assert_eq!(point, "disk-uploaded");
    assert!(id >= 40);
    let job = job_dir(&ck);
    let before = completed(&job);
    assert!(before.iter().all(|&c| c < id), "{before:?}, killed at {id}");
    let orphans: Vec<String> = on_disk(&job)
        .difference(&referenced(&job))
        .cloned()
        .collect();
    assert!(!orphans.is_empty(), "the killed upload left no file behind");
    // The referenced files of every completed checkpoint are all there.
    assert!(referenced(&job).is_subset(&on_disk(&job)));

    let sp = tmp.path().join("sp");
    let mut cmd = run(&ck, &["--savepoint-on-exit"]);
    cmd.arg(&sp);
    let mut resumed = Watched::spawn(&mut cmd);
    let deadline = Instant::now() + DEADLINE;
    resumed.wait_until("checkpoint 100", deadline, || {
        completed(&job).last().is_some_and(|&c| c >= 100)
    });
    resumed.terminate();
    resumed.wait_for_line("savepoint stored in ", deadline);
    let (status, stderr) = resumed.wait(deadline);
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "restoring job from checkpoint {}",
            before.last().unwrap()
        )),
        "{stderr}"
    );

    let retained = completed(&job);
    assert_eq!(retained.len(), 3, "{retained:?}");
    assert!(retained[2] > 100, "{retained:?}");
    for o in &orphans {
        assert!(!on_disk(&job).contains(o), "{o} leaked");
    }
    let (disk, refs) = (on_disk(&job), referenced(&job));
    assert!(!refs.is_empty());
    assert_eq!(
        disk.difference(&refs).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "shared files no retained checkpoint references"
    );
    assert_eq!(
        refs.difference(&disk).collect::<Vec<_>>(),
        Vec::<&String>::new(),
        "shared files referenced but missing"
    );
}
