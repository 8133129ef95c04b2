//! `cairn bench --suite postgres`: wordcount into PostgreSQL with each sink mode — 2pc,
//! upsert, wal — and 1 s checkpoints, against `--discard` as the ceiling, in one run with
//! ratios. Each configuration is one process of this binary, timed from start to exit; its
//! table is checked afterwards (2pc and wal: one row per update; upsert: the counts add up to
//! the updates), so a figure is never of a run that wrote the wrong thing.
//!
//! The server is `CAIRN_BENCH_PG_URL`, or the test service of `scripts/service-postgres`.
//! Tables `cairn_bench_<mode>` are dropped before and after each run.

use std::path::Path;

use anyhow::{bail, Context, Result};
use postgres::{Client, NoTls};

use super::{run_child, stat, BenchArgs};
use cairn_app::human;

/// Environment variable naming the server to benchmark against.
pub const ENV_URL: &str = "CAIRN_BENCH_PG_URL";
/// The server `scripts/service-postgres` starts.
pub const DEFAULT_URL: &str = "postgres://cairn:cairn@127.0.0.1:55432/cairn";
/// Updates per run unless `--records` says otherwise (PostgreSQL takes far fewer rows per
/// second than `--discard` does records).
const DEFAULT_RECORDS: u64 = 2_000_000;
const CHECKPOINT_INTERVAL: &str = "1s";
/// The configurations, in the order printed: the ceiling, then each sink mode.
const SINKS: [&str; 4] = ["discard", "2pc", "upsert", "wal"];

struct Row {
    parallelism: u32,
    sink: &'static str,
    rate: f64,
    checkpoints: usize,
    median_ms: u64,
}

fn table(sink: &str) -> String {
    format!("cairn_bench_{sink}")
}

fn drop_tables(db: &mut Client, sink: &str) -> Result<()> {
    let t = table(sink);
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS {t}; DROP TABLE IF EXISTS {t}_cairn_commits"
    ))
    .with_context(|| format!("cannot drop the benchmark table {t}"))
}

/// Checks what a run of `sink` left in its table.
fn check_table(db: &mut Client, sink: &str, records: u64) -> Result<()> {
    let t = table(sink);
    let row = db
        .query_one(
            &format!("SELECT count(*), coalesce(sum(count), 0)::bigint FROM {t}"),
            &[],
        )
        .with_context(|| format!("cannot read the benchmark table {t}"))?;
    let (rows, sum): (i64, i64) = (row.get(0), row.get(1));
    let ok = match sink {
        "upsert" => u64::try_from(sum).ok() == Some(records),
        _ => u64::try_from(rows).ok() == Some(records),
    };
    if !ok {
        bail!("the {sink} run left {rows} rows (counts adding up to {sum}) for {records} updates");
    }
    Ok(())
}

/// Runs the suite (see the module docs).
pub fn run(args: &BenchArgs, exe: &Path, scratch: &Path) -> Result<()> {
    let url = std::env::var(ENV_URL).unwrap_or_else(|_| DEFAULT_URL.to_string());
    let mut db = Client::connect(&url, NoTls).with_context(|| {
        format!("cannot connect to PostgreSQL for --suite postgres (start it with scripts/service-postgres, or set {ENV_URL})")
    })?;
    let (records, keys) = (args.records.unwrap_or(DEFAULT_RECORDS), args.keys()?);
    println!(
        "wordcount --generate {records} --keys {keys} into PostgreSQL ({ENV_URL} or the test service), checkpoints every {CHECKPOINT_INTERVAL}; updates/s of the whole process, best of {}",
        args.repeat.max(1)
    );
    let mut rows = Vec::new();
    for &p in &args.parallelism {
        for sink in SINKS {
            let mut best: Option<Row> = None;
            for r in 0..args.repeat.max(1) {
                let tag = format!("pg-{sink}-p{p}-{r}");
                let mut a: Vec<String> = [
                    "run",
                    "wordcount",
                    "--generate",
                    &records.to_string(),
                    "--keys",
                    &keys.to_string(),
                    "--parallelism",
                    &p.to_string(),
                    "--checkpoint-interval",
                    CHECKPOINT_INTERVAL,
                    "--checkpoint-dir",
                    &scratch.join(&tag).display().to_string(),
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if sink == "discard" {
                    a.push("--discard".into());
                } else {
                    drop_tables(&mut db, sink)?;
                    a.extend(
                        [
                            "--pg-output",
                            &url,
                            "--pg-table",
                            &table(sink),
                            "--pg-mode",
                            sink,
                        ]
                        .map(String::from),
                    );
                }
                let (secs, json) = run_child(exe, scratch, &tag, &a)?;
                if sink != "discard" {
                    check_table(&mut db, sink, records)?;
                    drop_tables(&mut db, sink)?;
                }
                let _ = std::fs::remove_dir_all(scratch.join(&tag));
                let cps = json["checkpoints"].as_array().cloned().unwrap_or_default();
                let row = Row {
                    parallelism: p,
                    sink,
                    rate: records as f64 / secs,
                    checkpoints: cps.len(),
                    median_ms: stat(&cps, "duration_ms").0,
                };
                if best.as_ref().is_none_or(|b| row.rate > b.rate) {
                    best = Some(row);
                }
            }
            rows.extend(best);
        }
    }
    println!(
        "{:>3}  {:>8}  {:>12}  {:>10}  {:>8}  {:>11}  {:>10}",
        "p", "sink", "updates/s", "vs discard", "vs 2pc", "checkpoints", "median ms"
    );
    for r in &rows {
        let rate_of = |sink: &str| {
            rows.iter()
                .find(|o| o.parallelism == r.parallelism && o.sink == sink)
                .map(|o| o.rate)
        };
        let ratio = |base: Option<f64>| base.map_or("-".into(), |b| format!("{:.3}", r.rate / b));
        println!(
            "{:>3}  {:>8}  {:>12}  {:>10}  {:>8}  {:>11}  {:>10}",
            r.parallelism,
            r.sink,
            human::count(r.rate),
            ratio(rate_of("discard")),
            ratio(rate_of("2pc")),
            r.checkpoints,
            r.median_ms
        );
    }
    Ok(())
}
