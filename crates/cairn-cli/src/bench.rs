//! `cairn bench`: wordcount throughput under several checkpoint settings, measured as whole
//! processes (start to exit) of this same binary, in one run, with ratios.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;

use crate::human;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Records to generate per run.
    #[arg(long, default_value_t = 20_000_000)]
    records: u64,
    /// Distinct words.
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    /// Parallelisms to compare.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 2])]
    parallelism: Vec<u32>,
    /// Checkpoint intervals to compare (0 = off).
    #[arg(long, value_delimiter = ',', default_values_t = vec!["0".to_string(), "1s".to_string(), "100ms".to_string()])]
    intervals: Vec<String>,
    /// Runs per configuration (the best is reported).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
}

struct Row {
    parallelism: u32,
    interval: String,
    rate: f64,
    checkpoints: usize,
    median_ms: u64,
    size: u64,
}

pub fn run(args: BenchArgs) -> Result<()> {
    let exe = std::env::current_exe().context("cannot find the cairn binary")?;
    let scratch = std::env::temp_dir().join(format!("cairn-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    let mut rows = Vec::new();
    println!(
        "wordcount --generate {} --keys {} --discard (records/s of the whole process, best of {})",
        args.records, args.keys, args.repeat
    );
    for &p in &args.parallelism {
        for interval in &args.intervals {
            let mut best: Option<Row> = None;
            for r in 0..args.repeat.max(1) {
                let dir = scratch.join(format!("p{p}-{interval}-{r}"));
                let summary: PathBuf = scratch.join(format!("p{p}-{interval}-{r}.json"));
                let mut cmd = Command::new(&exe);
                cmd.args(["run", "wordcount", "--discard", "--log", "warn"])
                    .args(["--generate", &args.records.to_string()])
                    .args(["--keys", &args.keys.to_string()])
                    .args(["--parallelism", &p.to_string()])
                    .args(["--checkpoint-interval", interval])
                    .arg("--summary-json")
                    .arg(&summary);
                if interval != "0" {
                    cmd.arg("--checkpoint-dir").arg(&dir);
                }
                let t0 = Instant::now();
                let out = cmd.output().context("cannot start a benchmark run")?;
                let secs = t0.elapsed().as_secs_f64();
                if !out.status.success() {
                    bail!(
                        "benchmark run p={p} interval={interval} failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                }
                let json: serde_json::Value = serde_json::from_slice(
                    &std::fs::read(&summary)
                        .with_context(|| format!("cannot read {}", summary.display()))?,
                )?;
                let cps = json["checkpoints"].as_array().cloned().unwrap_or_default();
                let mut durations: Vec<u64> = cps
                    .iter()
                    .filter_map(|c| c["duration_ms"].as_u64())
                    .collect();
                durations.sort_unstable();
                let row = Row {
                    parallelism: p,
                    interval: interval.clone(),
                    rate: args.records as f64 / secs,
                    checkpoints: cps.len(),
                    median_ms: durations.get(durations.len() / 2).copied().unwrap_or(0),
                    size: cps
                        .last()
                        .and_then(|c| c["state_size"].as_u64())
                        .unwrap_or(0),
                };
                let _ = std::fs::remove_dir_all(&dir);
                if best.as_ref().is_none_or(|b| row.rate > b.rate) {
                    best = Some(row);
                }
            }
            if let Some(b) = best {
                rows.push(b);
            }
        }
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "{:>3}  {:>9}  {:>12}  {:>9}  {:>11}  {:>14}  {:>10}",
        "p", "interval", "records/s", "vs off", "vs p=first", "checkpoints", "median ms"
    );
    let first_p = args.parallelism.first().copied().unwrap_or(1);
    for r in &rows {
        let off = rows
            .iter()
            .find(|o| o.parallelism == r.parallelism && o.interval == "0")
            .map(|o| o.rate);
        let same_interval_first_p = rows
            .iter()
            .find(|o| o.parallelism == first_p && o.interval == r.interval)
            .map(|o| o.rate);
        println!(
            "{:>3}  {:>9}  {:>12}  {:>9}  {:>11}  {:>14}  {:>10}",
            r.parallelism,
            if r.interval == "0" {
                "off"
            } else {
                &r.interval
            },
            human::count(r.rate),
            off.map_or("-".into(), |o| format!("{:.3}", r.rate / o)),
            same_interval_first_p.map_or("-".into(), |o| format!("{:.2}x", r.rate / o)),
            format!("{} ({})", r.checkpoints, human::bytes(r.size)),
            r.median_ms
        );
    }
    Ok(())
}
