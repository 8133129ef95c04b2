//! `cairn bench --suite metrics`: what counting the metrics costs. The same wordcount
//! (generated words, a keyed shuffle at parallelism 2, exactly-once checkpoints every 1 s,
//! `--discard`) runs as whole processes with `metrics.enabled` true and false, alternately,
//! best of `--repeat` (default 5) each, and prints records/s (over the job's own run time)
//! and the on/off ratio.

use std::path::Path;

use anyhow::Result;

use super::{run_child, BenchArgs};
use crate::human;

pub(super) fn run(args: &BenchArgs, exe: &Path, scratch: &Path) -> Result<()> {
    let (records, keys) = (args.records(), args.keys()?);
    let repeat = if args.repeat > 1 { args.repeat } else { 5 };
    println!(
        "wordcount --generate {records} --keys {keys} --discard, p=2, checkpoints every 1s: metrics.enabled true vs false, alternating, best of {repeat}"
    );
    let mut best = [0f64; 2];
    for r in 0..repeat {
        for (i, enabled) in ["true", "false"].into_iter().enumerate() {
            let tag = format!("metrics-{enabled}-{r}");
            let dir = scratch.join(&tag);
            let a: Vec<String> = vec![
                "run".into(),
                "wordcount".into(),
                "-p".into(),
                "2".into(),
                "--generate".into(),
                records.to_string(),
                "--keys".into(),
                keys.to_string(),
                "--discard".into(),
                "--checkpoint-interval".into(),
                "1s".into(),
                "--checkpoint-dir".into(),
                dir.display().to_string(),
                "-D".into(),
                format!("metrics.enabled={enabled}"),
            ];
            let (_, json) = run_child(exe, scratch, &tag, &a)?;
            let _ = std::fs::remove_dir_all(&dir);
            let secs = json["elapsed_ms"].as_u64().unwrap_or(1).max(1) as f64 / 1e3;
            let rate = json["records"].as_u64().unwrap_or(0) as f64 / secs;
            best[i] = best[i].max(rate);
        }
    }
    println!("{:<18}  {:>10}", "metrics.enabled", "records/s");
    println!("{:<18}  {:>10}", "true", human::count(best[0]));
    println!("{:<18}  {:>10}", "false", human::count(best[1]));
    println!(
        "on/off: {:.3} (cost {:+.1} %)",
        best[0] / best[1],
        (1.0 - best[0] / best[1]) * 100.0
    );
    Ok(())
}
