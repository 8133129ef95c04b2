//! `cairn bench --suite metrics`: what counting the metrics costs. The same wordcount
//! (generated words, a keyed shuffle at parallelism 2, exactly-once checkpoints every 1 s,
//! `--discard`) runs as whole processes with `metrics.enabled` true and false, alternately,
//! best of `--repeat` (default 5) each, and prints records/s (over the job's own run time),
//! the CPU time per record (the process's, from its summary) and the on/off ratios.

use std::path::Path;

use anyhow::Result;

use super::{run_child, BenchArgs};
use cairn_app::human;

pub(super) fn run(args: &BenchArgs, exe: &Path, scratch: &Path) -> Result<()> {
    let (records, keys) = (args.records(), args.keys()?);
    let repeat = if args.repeat > 1 { args.repeat } else { 5 };
    println!(
        "wordcount --generate {records} --keys {keys} --discard, p=2, checkpoints every 1s: metrics.enabled true vs false, alternating, best of {repeat}"
    );
    // Per setting: the best records/s, and the least CPU time per million records (all the
    // process's threads), which the other core's load disturbs less than wall time.
    let mut best = [0f64; 2];
    let mut cpu = [f64::INFINITY; 2];
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
            let n = json["records"].as_u64().unwrap_or(0) as f64;
            best[i] = best[i].max(n / secs);
            if let (Some(ms), true) = (json["cpu_ms"].as_u64(), n > 0.0) {
                cpu[i] = cpu[i].min(ms as f64 * 1e6 / n);
            }
        }
    }
    println!(
        "{:<18}  {:>10}  {:>22}",
        "metrics.enabled", "records/s", "CPU ms per 1M records"
    );
    for (i, enabled) in ["true", "false"].into_iter().enumerate() {
        println!(
            "{enabled:<18}  {:>10}  {:>22.1}",
            human::count(best[i]),
            cpu[i]
        );
    }
    println!(
        "on/off: records/s {:.3} (cost {:+.1} %), CPU per record {:.3} (cost {:+.1} %)",
        best[0] / best[1],
        (1.0 - best[0] / best[1]) * 100.0,
        cpu[0] / cpu[1],
        (cpu[0] / cpu[1] - 1.0) * 100.0
    );
    Ok(())
}
