//! `cairn bench --suite kafka`: wordcount from the generator into a Kafka topic with the Kafka
//! sink's three guarantees (none, at-least-once, exactly-once) and 1 s checkpoints, against
//! `--discard`, measured as whole processes of this binary in one run. The broker is the one at
//! `--kafka-brokers` (Tansu from `scripts/service-kafka` by default); every run writes a new
//! topic, and the exactly-once run's committed output is read back and counted.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cairn::connectors::kafka::wire::{Marker, WireClient};

use super::{run_child, stat};
use crate::human;

/// Partitions of each benchmark topic.
const PARTITIONS: i32 = 4;
/// The checkpoint interval of every run.
const INTERVAL: &str = "1s";

struct Measured {
    name: &'static str,
    rate: f64,
    checkpoints: usize,
    median_ms: u64,
}

/// Runs the suite: `records` generated words over `keys` distinct ones at parallelism 2, best
/// of `repeat` runs per configuration; prints records/s and the ratios to `none` and to
/// `--discard`.
pub fn run(
    exe: &Path,
    scratch: &Path,
    brokers: &str,
    records: u64,
    keys: u64,
    repeat: u32,
) -> Result<()> {
    let mut wire = WireClient::new(brokers, Duration::from_secs(30));
    wire.topic_metadata("cairn-bench", false).with_context(|| {
        format!("no Kafka broker at {brokers} (scripts/service-kafka starts one)")
    })?;
    println!(
        "wordcount --generate {records} --keys {keys}, p=2, checkpoints every {INTERVAL}: generator -> Kafka on {brokers} ({PARTITIONS} partitions), best of {}",
        repeat.max(1)
    );
    let configs: [(&'static str, Option<&str>); 4] = [
        ("--discard", None),
        ("kafka none", Some("none")),
        ("kafka at-least-once", Some("at-least-once")),
        ("kafka exactly-once", Some("exactly-once")),
    ];
    let mut rows = Vec::new();
    for (i, (name, guarantee)) in configs.into_iter().enumerate() {
        let mut best: Option<Measured> = None;
        for r in 0..repeat.max(1) {
            let tag = format!("kafka-{i}-{r}");
            let dir = scratch.join(&tag);
            let mut args: Vec<String> = [
                "run",
                "wordcount",
                "-p",
                "2",
                "--checkpoint-interval",
                INTERVAL,
            ]
            .map(String::from)
            .to_vec();
            args.extend([
                "--generate".into(),
                records.to_string(),
                "--keys".into(),
                keys.to_string(),
                "--checkpoint-dir".into(),
                dir.display().to_string(),
            ]);
            let topic = format!("cairn-bench-{}-{tag}", std::process::id());
            match guarantee {
                None => args.push("--discard".into()),
                Some(g) => {
                    wire.create_topic(&topic, PARTITIONS)?;
                    args.extend([
                        "--kafka-brokers".into(),
                        brokers.into(),
                        "--kafka-output".into(),
                        topic.clone(),
                        "--kafka-guarantee".into(),
                        g.into(),
                    ]);
                }
            }
            let (secs, json) = run_child(exe, scratch, &tag, &args)?;
            let _ = std::fs::remove_dir_all(&dir);
            if guarantee == Some("exactly-once") {
                check_committed(&mut wire, &topic, records)?;
            }
            let cps = json["checkpoints"].as_array().cloned().unwrap_or_default();
            let row = Measured {
                name,
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
    let rate_of = |name: &str| rows.iter().find(|r| r.name == name).map(|r| r.rate);
    let (discard, none) = (rate_of("--discard"), rate_of("kafka none"));
    println!(
        "{:<22}  {:>10}  {:>9}  {:>11}  {:>6}  {:>13}",
        "sink", "records/s", "vs none", "vs discard", "ckpts", "ckpt median"
    );
    for r in &rows {
        let ratio = |base: Option<f64>| base.map_or("-".into(), |b| format!("{:.2}", r.rate / b));
        println!(
            "{:<22}  {:>10}  {:>9}  {:>11}  {:>6}  {:>10} ms",
            r.name,
            human::count(r.rate),
            ratio(none),
            ratio(discard),
            r.checkpoints,
            r.median_ms
        );
    }
    Ok(())
}

/// Reads the exactly-once run's topic back: every transaction committed, every record there
/// once.
fn check_committed(wire: &mut WireClient, topic: &str, records: u64) -> Result<()> {
    let log = wire.read_topic(topic)?;
    let txns = log.transactions();
    if let Some(t) = txns.iter().find(|t| t.outcome != Some(Marker::Commit)) {
        bail!("exactly-once run left transaction {t:?} in {topic} uncommitted");
    }
    let committed = log
        .committed_records()
        .map_err(|e| anyhow::anyhow!("{topic}: {e}"))?
        .len() as u64;
    if committed != records {
        bail!("exactly-once run committed {committed} records to {topic}, not {records}");
    }
    println!(
        "  exactly-once output checked: {committed} records in {} committed transactions",
        txns.len()
    );
    Ok(())
}
