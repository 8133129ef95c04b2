//! `cairn bench --suite s3`: checkpoints on S3 against checkpoints on the local filesystem,
//! in one run: the same embedded wordcount (generated words, parallelism 2, 1 s checkpoints)
//! on the heap backend and on RocksDB with incremental checkpoints, once per storage. Prints
//! records/s, checkpoint durations (mean, max) and sizes, and the S3 / filesystem ratios.
//!
//! The S3 side is `s3://cairn-test/bench-<pid>` at `CAIRN_TEST_S3_ENDPOINT` (default the local
//! server `scripts/service-s3` starts, `http://127.0.0.1:55000`); the `AWS_*` variables give
//! credentials for another service.

use std::path::Path;

use anyhow::{anyhow, Result};
use cairn::config::{keys, JobConfig};
use cairn::jobs::wordcount::{self, WordInput, WordOutput};
use cairn::runtime::{run_job, RunOptions};
use cairn::storage::{CheckpointStorage, S3Settings, S3Storage, S3Url};

use super::BenchArgs;

struct Row {
    backend: &'static str,
    storage: &'static str,
    records_per_s: f64,
    checkpoints: usize,
    mean_ms: f64,
    max_ms: u64,
    mean_bytes: f64,
}

fn endpoint() -> String {
    std::env::var("CAIRN_TEST_S3_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:55000".into())
}

/// The local server takes any credentials; without `AWS_ACCESS_KEY_ID` the bench gives it
/// some rather than let the client look for an instance profile.
fn settings() -> S3Settings {
    let mut s = S3Settings {
        endpoint: Some(endpoint()),
        ..S3Settings::default()
    };
    if std::env::var_os("AWS_ACCESS_KEY_ID").is_none() {
        s.access_key = Some("cairn".into());
        s.secret_key = Some("cairn".into());
    }
    s
}

pub(super) fn run(args: &BenchArgs, scratch: &Path) -> Result<()> {
    let (records, key_count) = (args.records(), args.keys()?);
    let s3_url = format!("s3://cairn-test/bench-{}", std::process::id());
    let settings = settings();
    let s3 = S3Storage::open(&S3Url::parse(&s3_url).map_err(|e| anyhow!(e))?, &settings)
        .map_err(|e| anyhow!("{e} (start the local S3 server with scripts/service-s3)"))?;
    println!(
        "wordcount --generate {records} --keys {key_count} --discard, parallelism 2, 1s checkpoints: filesystem vs {s3_url} at {}",
        endpoint()
    );
    let mut rows = Vec::new();
    for (backend, extra) in [
        ("heap", &[][..]),
        (
            "rocksdb incremental",
            &[
                (keys::STATE_BACKEND, "rocksdb"),
                (keys::INCREMENTAL, "true"),
            ][..],
        ),
    ] {
        for storage in ["filesystem", "s3"] {
            let mut config = JobConfig::default();
            let dir = match storage {
                "s3" => s3_url.clone(),
                _ => scratch.join("s3-bench-fs").display().to_string(),
            };
            let mut pairs = vec![
                (keys::PARALLELISM, "2"),
                (keys::CHECKPOINT_INTERVAL, "1s"),
                (keys::CHECKPOINTS_DIR, dir.as_str()),
            ];
            pairs.extend_from_slice(extra);
            config.set_all(pairs)?;
            if storage == "s3" {
                config.s3 = settings.clone();
            }
            let graph = wordcount::build(
                &WordInput::Generate {
                    count: records,
                    keys: key_count,
                },
                0,
                &WordOutput::Discard,
            )
            .map_err(|e| anyhow!(e))?;
            let summary = run_job(
                &graph,
                RunOptions {
                    config,
                    ..RunOptions::default()
                },
            )
            .map_err(|e| anyhow!("{backend} on {storage}: {e}"))?;
            let n = summary.checkpoints.len();
            let durations: Vec<u64> = summary.checkpoints.iter().map(|c| c.duration_ms).collect();
            let sizes: u64 = summary.checkpoints.iter().map(|c| c.state_size).sum();
            let row = Row {
                backend,
                storage,
                records_per_s: summary.records as f64 / summary.elapsed.as_secs_f64(),
                checkpoints: n,
                mean_ms: durations.iter().sum::<u64>() as f64 / n.max(1) as f64,
                max_ms: durations.iter().copied().max().unwrap_or(0),
                mean_bytes: sizes as f64 / n.max(1) as f64,
            };
            println!(
                "  {:<20} {:<10} {:>10.0} records/s  {:>3} checkpoints  mean {:>7.1} ms  max {:>5} ms  mean size {:>9.0} KiB",
                row.backend,
                row.storage,
                row.records_per_s,
                row.checkpoints,
                row.mean_ms,
                row.max_ms,
                row.mean_bytes / 1024.0
            );
            rows.push(row);
            let _ = std::fs::remove_dir_all(scratch.join("s3-bench-fs"));
        }
    }
    for name in s3.list("").unwrap_or_default() {
        let _ = s3.delete(&name);
    }
    for pair in rows.chunks(2) {
        if let [fs, s3] = pair {
            println!(
                "  {}: S3 / filesystem: checkpoint duration {:.2}x, records/s {:.2}x",
                fs.backend,
                s3.mean_ms / fs.mean_ms.max(0.1),
                s3.records_per_s / fs.records_per_s
            );
        }
    }
    Ok(())
}
