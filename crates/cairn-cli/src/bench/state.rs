//! `cairn bench --suite state`: the heap and RocksDB state backends on one job, in one run.
//!
//! 1. wordcount (`--generate R --keys K --discard`, 1 s exactly-once checkpoints, incremental on
//!    RocksDB) at every `--parallelism` on both backends: records/s, checkpoint duration and
//!    synchronous part, bytes each checkpoint uploaded against the state it stands for, and the
//!    process's peak RSS. Every checkpoint is retained for the measurement, and the bytes are
//!    read from the checkpoint directory afterwards: a checkpoint's upload is its own
//!    directory plus the shared files the one before it did not reference; its state is its
//!    directory plus every shared file it references.
//! 2. The heap backend's synchronous pause (the longest synchronous part of a checkpoint) at
//!    100 k, 1 M and 10 M keys, copying the tables against copy-on-write, with the throughput
//!    of each.
//! 3. State larger than memory: wordcount on RocksDB with an 8 MiB memory budget over enough
//!    keys (each read once) for a state of at least 4 times that; its peak RSS against the
//!    budget.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use cairn::checkpoint::CheckpointMetadata;
use cairn::storage::format::{decode, FileKind};

use super::{bytes_token, run_child_peak_rss, BenchArgs};

/// Flink 2.3, RocksDB, incremental 1 s checkpoints, wordcount with 100 k string keys at
/// parallelism 1, measured on this machine (issue 10).
const FLINK_ROCKSDB_P1: f64 = 156_000.0;
const SYNC_KEYS: [u64; 3] = [100_000, 1_000_000, 10_000_000];
const LARGE_BUDGET: &str = "8mb";
const LARGE_BUDGET_BYTES: u64 = 8 << 20;
const LARGE_KEYS: u64 = 5_000_000;
/// What a process needs besides RocksDB's budget (binary, allocator, threads, RocksDB's table
/// readers and the buffers of an upload in flight), measured here at 1 M to 5 M keys.
const LARGE_MARGIN_BYTES: u64 = 48 << 20;

struct Measured {
    rate: f64,
    checkpoints: usize,
    duration: (u64, u64),
    sync: (u64, u64),
    /// Median bytes uploaded per checkpoint, and median state per checkpoint.
    uploaded: u64,
    state: u64,
    /// State of the last checkpoint.
    last_state: u64,
    peak_rss: Option<u64>,
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

fn max(v: &[u64]) -> u64 {
    v.iter().copied().max().unwrap_or(0)
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).map_or(0, |m| m.len())
}

fn dir_size(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| file_size(&e.path()))
        .sum()
}

/// Per completed checkpoint in `job` (in id order): (bytes uploaded, bytes of state).
fn upload_sizes(root: &Path, job: &Path) -> Result<Vec<(u64, u64)>> {
    let mut ids: Vec<u64> = std::fs::read_dir(job)
        .with_context(|| format!("cannot list {}", job.display()))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("chk-")?.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    let mut previous: BTreeSet<String> = BTreeSet::new();
    let mut out = Vec::new();
    for id in ids {
        let dir = job.join(format!("chk-{id}"));
        let Ok(bytes) = std::fs::read(dir.join("_metadata")) else {
            continue;
        };
        let meta: CheckpointMetadata = decode(FileKind::Metadata, &bytes)
            .with_context(|| format!("cannot read {}", dir.display()))?;
        let own = dir_size(&dir);
        let shared: BTreeSet<String> = meta.shared_files.into_iter().collect();
        let new: u64 = shared
            .difference(&previous)
            .map(|p| file_size(&root.join(p)))
            .sum();
        let all: u64 = shared.iter().map(|p| file_size(&root.join(p))).sum();
        out.push((own + new, own + all));
        previous = shared;
    }
    Ok(out)
}

/// One wordcount run; `extra` picks the backend.
fn wordcount(
    exe: &Path,
    scratch: &Path,
    tag: &str,
    (records, keys, p): (u64, u64, u32),
    extra: &[&str],
) -> Result<Measured> {
    let ck: PathBuf = scratch.join(tag);
    let mut a: Vec<String> = [
        "run",
        "wordcount",
        "--discard",
        "--checkpoint-interval",
        "1s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.extend([
        "--generate".into(),
        records.to_string(),
        "--keys".into(),
        keys.to_string(),
        "-p".into(),
        p.to_string(),
        "--checkpoint-dir".into(),
        ck.display().to_string(),
        "-D".into(),
        "state.checkpoints.num-retained=100000".into(),
        "-D".into(),
        format!(
            "state.backend.rocksdb.localdir={}",
            scratch.join(format!("{tag}-rocksdb")).display()
        ),
    ]);
    a.extend(extra.iter().map(|s| s.to_string()));
    let (json, peak_rss) = run_child_peak_rss(exe, scratch, tag, &a)?;
    let cps = json["checkpoints"].as_array().cloned().unwrap_or_default();
    let field = |f: &str| -> Vec<u64> { cps.iter().filter_map(|c| c[f].as_u64()).collect() };
    let job = ck.join(json["job_id"].as_str().unwrap_or_default());
    let sizes = upload_sizes(&ck, &job)?;
    let _ = std::fs::remove_dir_all(&ck);
    let elapsed = json["elapsed_ms"].as_u64().unwrap_or(1).max(1);
    let records = json["records"].as_u64().unwrap_or(0);
    let (durations, syncs) = (field("duration_ms"), field("sync_ms_max"));
    Ok(Measured {
        rate: records as f64 * 1000.0 / elapsed as f64,
        checkpoints: cps.len(),
        duration: (median(durations.clone()), max(&durations)),
        sync: (median(syncs.clone()), max(&syncs)),
        uploaded: median(sizes.iter().map(|s| s.0).collect()),
        state: median(sizes.iter().map(|s| s.1).collect()),
        last_state: sizes.last().map_or(0, |s| s.1),
        peak_rss,
    })
}

const ROCKSDB: [&str; 4] = [
    "-D",
    "state.backend.type=rocksdb",
    "-D",
    "state.backend.incremental=true",
];

fn rss(m: &Measured) -> String {
    m.peak_rss.map_or("-".into(), bytes_token)
}

pub(super) fn run(args: &BenchArgs, exe: &Path, scratch: &Path) -> Result<()> {
    let (records, keys) = (args.records.unwrap_or(30_000_000), args.keys()?);
    println!(
        "wordcount --generate {records} --keys {keys} --discard, exactly-once checkpoints every 1s (RocksDB: incremental); upload and state: medians over the checkpoints, read from the checkpoint directory"
    );
    println!(
        "{:<8} {:>2} {:>10} {:>6} {:>14} {:>12} {:>12} {:>12} {:>8} {:>9}",
        "backend",
        "p",
        "records/s",
        "ckpts",
        "ckpt med/max",
        "sync med/max",
        "upload/ckpt",
        "state",
        "upload%",
        "peak RSS"
    );
    let mut rates: Vec<(String, u32, f64)> = Vec::new();
    for &p in &args.parallelism {
        for (name, extra) in [("heap", &[][..]), ("rocksdb", &ROCKSDB[..])] {
            let m = wordcount(
                exe,
                scratch,
                &format!("{name}-p{p}"),
                (records, keys, p),
                extra,
            )?;
            println!(
                "{:<8} {:>2} {:>10.0} {:>6} {:>14} {:>12} {:>12} {:>12} {:>7.1}% {:>9}",
                name,
                p,
                m.rate,
                m.checkpoints,
                format!("{}/{} ms", m.duration.0, m.duration.1),
                format!("{}/{} ms", m.sync.0, m.sync.1),
                bytes_token(m.uploaded),
                bytes_token(m.state),
                100.0 * m.uploaded as f64 / m.state.max(1) as f64,
                rss(&m),
            );
            rates.push((name.into(), p, m.rate));
        }
    }
    for &p in &args.parallelism {
        let rate = |n: &str| rates.iter().find(|r| r.0 == n && r.1 == p).map(|r| r.2);
        if let (Some(h), Some(r)) = (rate("heap"), rate("rocksdb")) {
            print!("p={p}: rocksdb/heap records/s {:.2}", r / h);
            if p == 1 {
                print!(
                    "; rocksdb vs Flink 2.3 RocksDB incremental ({:.0}k records/s): {:.1}x",
                    FLINK_ROCKSDB_P1 / 1000.0,
                    r / FLINK_ROCKSDB_P1
                );
            }
            println!();
        }
    }

    println!();
    println!(
        "heap backend, synchronous pause of a checkpoint (p=1, 1s checkpoints, --generate 3x keys): full copy of the tables (state.backend.heap.copy-on-write=false) against copy-on-write (the default)"
    );
    println!(
        "{:>10} {:<10} {:>14} {:>14} {:>10} {:>12} {:>9}",
        "keys", "snapshot", "sync med/max", "ckpt med/max", "records/s", "state", "peak RSS"
    );
    for k in SYNC_KEYS {
        let mut sync_max = [0u64; 2];
        let mut rate = [0f64; 2];
        for (i, (mode, cow)) in [("full-copy", "false"), ("cow", "true")].iter().enumerate() {
            let flag = format!("state.backend.heap.copy-on-write={cow}");
            let m = wordcount(
                exe,
                scratch,
                &format!("sync-{k}-{mode}"),
                (3 * k, k, 1),
                &["-D", &flag],
            )?;
            println!(
                "{:>10} {:<10} {:>14} {:>14} {:>10.0} {:>12} {:>9}",
                k,
                mode,
                format!("{}/{} ms", m.sync.0, m.sync.1),
                format!("{}/{} ms", m.duration.0, m.duration.1),
                m.rate,
                bytes_token(m.state),
                rss(&m)
            );
            sync_max[i] = m.sync.1;
            rate[i] = m.rate;
        }
        println!(
            "{:>10} copy-on-write/full-copy: longest synchronous part {} ms -> {} ms, records/s {:.2}",
            k,
            sync_max[0],
            sync_max[1],
            rate[1] / rate[0].max(1.0)
        );
    }

    println!();
    let mut extra = ROCKSDB.to_vec();
    let budget = format!("state.backend.rocksdb.memory.fixed-per-slot={LARGE_BUDGET}");
    extra.extend(["-D", &budget]);
    let m = wordcount(
        exe,
        scratch,
        "larger-than-memory",
        (LARGE_KEYS, LARGE_KEYS, 1),
        &extra,
    )?;
    let within = m
        .peak_rss
        .map(|r| r <= LARGE_BUDGET_BYTES + LARGE_MARGIN_BYTES);
    println!(
        "state larger than memory: rocksdb, memory budget {}, --keys {LARGE_KEYS} (p=1): state (last checkpoint) {} = {:.1}x the budget; peak RSS {} = budget + {} ({} the stated margin of {}); {:.0} records/s",
        bytes_token(LARGE_BUDGET_BYTES),
        bytes_token(m.last_state),
        m.last_state as f64 / LARGE_BUDGET_BYTES as f64,
        rss(&m),
        m.peak_rss
            .map_or("-".into(), |r| bytes_token(r.saturating_sub(LARGE_BUDGET_BYTES))),
        match within {
            Some(true) => "within",
            Some(false) => "OVER",
            None => "unknown against",
        },
        bytes_token(LARGE_MARGIN_BYTES),
        m.rate
    );
    Ok(())
}
