//! Defect 3.1: with an alignment timeout, the final checkpoint of a bounded job stays aligned,
//! and the job finishes without a restart.

mod common;

use common::*;

#[test]
fn the_final_checkpoint_stays_aligned_under_a_1ms_alignment_timeout() {
    let (count, keys) = (300_000u64, 1_000u64);
    let tmp = tempfile::tempdir().unwrap();
    let (out_dir, ck) = (tmp.path().join("out"), tmp.path().join("ck"));
    let run = run_ok(
        cairn()
            .args(["run", "wordcount", "--parallelism", "2"])
            .args([
                "--generate",
                &count.to_string(),
                "--keys",
                &keys.to_string(),
            ])
            .arg("--output")
            .arg(&out_dir)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .args(["--checkpoint-interval", "20ms"])
            .args(["-D", "execution.checkpointing.unaligned.enabled=true"])
            .args([
                "-D",
                "execution.checkpointing.aligned-checkpoint-timeout=1ms",
            ])
            // Keep every checkpoint, so that the last one listed is the final one.
            .args(["-D", "state.checkpoints.num-retained=1000"]),
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains(", 0 restarts"), "{stderr}");
    assert_exactly_once(&out_dir, &generated_counts(count, keys));
    let list = run_ok(cairn().arg("checkpoints").arg(&ck));
    let list = String::from_utf8_lossy(&list.stdout);
    let last = list.lines().last().unwrap_or_default();
    let columns: Vec<&str> = last.split_whitespace().collect();
    let header: Vec<&str> = list
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(header.get(header.len() - 2), Some(&"UNALIGNED"), "{list}");
    assert_eq!(columns.get(columns.len() - 2), Some(&"no"), "{list}");
}
