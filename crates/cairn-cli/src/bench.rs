//! `cairn bench`: wordcount throughput under several checkpoint settings, measured as whole
//! processes (start to exit) of this same binary, in one run, with ratios; (`nexmark`) every
//! Nexmark query the `nexmark` job offers, against Flink's published per-core figures; (`sql`)
//! the Nexmark queries as Flink SQL scripts against the same queries of the `nexmark` job;
//! (`savepoint`) checkpoints vs savepoints of one embedded job; and (`failover`) the time a job
//! stands still when its leading coordinator is SIGKILLed or SIGSTOPped.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;

use cairn_app::human;

mod failover;
mod kafka;
mod kafka_source;
mod metrics;
mod postgres;
mod s3;
mod savepoint;
mod sql;
mod state;

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Records to generate per run [default: 20000000; `savepoint`: until the benchmark stops
    /// the job; `postgres`: 2000000].
    #[arg(long)]
    records: Option<u64>,
    /// Distinct words [default: 100000; `savepoint`: 100000,10000000, one run each].
    #[arg(long, value_delimiter = ',')]
    keys: Vec<u64>,
    /// Parallelisms to compare.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1u32, 2])]
    parallelism: Vec<u32>,
    /// Checkpoint intervals to compare (0 = off) [default: 0,1s,100ms].
    #[arg(long, value_delimiter = ',')]
    intervals: Vec<String>,
    /// `nexmark`, `sql`: events to generate per run (persons, auctions and bids, 1:3:46)
    /// [default: 20000000].
    #[arg(long)]
    events: Option<u64>,
    /// Runs per configuration (the best is reported) [default: 1; `failover`: rounds per fault,
    /// default 3; `metrics`: default 5].
    #[arg(long = "repeat", value_name = "REPEAT")]
    repeat_flag: Option<u32>,
    /// `--repeat`, 1 when not given (set by [`run`]).
    #[arg(skip)]
    repeat: u32,
    /// `throughput`: wordcount vs checkpoint interval and parallelism; `modes`: checkpoint
    /// modes under backpressure (aligned, unaligned, aligned with timeout) and at-least-once vs
    /// exactly-once throughput; `cluster`: embedded vs cluster throughput and recovery from a
    /// lost worker; `nexmark`: every query of the nexmark job at each parallelism, with
    /// checkpoints, peak RSS and ratios to Flink's per-core figures; `sql`: the Nexmark queries
    /// that are both Flink SQL scripts (sql/nexmark) and queries of the nexmark job, each way at
    /// each parallelism (same events, checkpoints as `nexmark`), with the ratio SQL / Rust;
    /// `savepoint`: a checkpoint vs a savepoint of the same state, and the time a
    /// stop-with-savepoint takes; `state`: the heap and RocksDB backends (throughput,
    /// checkpoint uploads, RSS), the heap's synchronous pause by key count, and state larger
    /// than RocksDB's memory budget; `s3`: checkpoint
    /// durations on the local S3 server against the local filesystem; `postgres`: the
    /// PostgreSQL sink modes (2pc, upsert, wal) with 1s checkpoints against --discard
    /// (CAIRN_BENCH_PG_URL, default: the scripts/service-postgres server) [--records default:
    /// 2000000]; `kafka-source`: wordcount reading a pre-filled topic of librdkafka's mock
    /// cluster, per parallelism; `kafka`: Kafka -> Kafka (a pre-filled topic through the Kafka
    /// source, wordcount and the Kafka sink) with the sink's guarantees
    /// none, at-least-once and exactly-once (1 s checkpoints); `e2e`: `kafka`, `postgres` and
    /// `s3` in one run; `metrics`: wordcount with `metrics.enabled` true and false, alternating
    /// (best of --repeat, default 5); `failover`: a leader and a standby coordinator, two
    /// workers and a long job on 127.0.0.1, the leader SIGKILLed and SIGSTOPped --repeat times
    /// each (default 3): the time until the job runs on the new leader and until its first
    /// checkpoint.
    #[arg(long, default_value = "throughput")]
    suite: String,
    /// `kafka`: the Kafka broker the sink benchmark writes to (HOST:PORT).
    #[arg(
        long,
        value_name = "HOST:PORT",
        env = "CAIRN_TEST_KAFKA_BROKERS",
        default_value = "127.0.0.1:59092"
    )]
    kafka_brokers: String,
}

impl BenchArgs {
    /// `--records`, for the suites that run a fixed number of records.
    fn records(&self) -> u64 {
        self.records.unwrap_or(20_000_000)
    }

    /// `--keys`, for the suites that take one key count.
    fn keys(&self) -> Result<u64> {
        match self.keys.as_slice() {
            [] => Ok(100_000),
            [keys] => Ok(*keys),
            _ => bail!(
                "--keys takes one value with --suite {}; only --suite savepoint compares several",
                self.suite
            ),
        }
    }

    /// `--intervals`, for `throughput`.
    fn intervals(&self) -> Vec<String> {
        if self.intervals.is_empty() {
            ["0", "1s", "100ms"].map(String::from).to_vec()
        } else {
            self.intervals.clone()
        }
    }

    /// Refuses the flags the chosen suite does not take, before anything runs.
    fn check(&self) -> Result<()> {
        if !matches!(self.suite.as_str(), "nexmark" | "sql") {
            if self.events.is_some() {
                bail!("--events is a flag of --suite nexmark and --suite sql");
            }
            if self.suite != "savepoint" {
                // The other suites take one key count.
                self.keys()?;
            }
            return Ok(());
        }
        if self.records.is_some() || !self.keys.is_empty() {
            bail!(
                "--suite {} runs Nexmark queries: use --events N, not --records or --keys",
                self.suite
            );
        }
        if !self.intervals.is_empty() {
            bail!(
                "--suite {} checkpoints every {NEXMARK_CHECKPOINT_INTERVAL}; --intervals is a flag of --suite throughput",
                self.suite
            );
        }
        if self.events == Some(0) {
            bail!("--events must be at least 1");
        }
        if self.parallelism.contains(&0) {
            bail!("--parallelism must be at least 1");
        }
        Ok(())
    }
}

struct Row {
    parallelism: u32,
    interval: String,
    rate: f64,
    checkpoints: usize,
    median_ms: u64,
    size: u64,
}

/// Runs this binary with `args` and a summary file; returns (seconds, summary).
fn run_child(
    exe: &std::path::Path,
    scratch: &std::path::Path,
    tag: &str,
    args: &[String],
) -> Result<(f64, serde_json::Value)> {
    let summary = scratch.join(format!("{tag}.json"));
    let t0 = Instant::now();
    let out = Command::new(exe)
        .args(args)
        .args(["--log", "warn"])
        .arg("--summary-json")
        .arg(&summary)
        .output()
        .context("cannot start a benchmark run")?;
    let secs = t0.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!(
            "benchmark run {tag} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&summary).with_context(|| format!("cannot read {}", summary.display()))?,
    )?;
    Ok((secs, json))
}

fn stat(cps: &[serde_json::Value], field: &str) -> (u64, u64) {
    let mut v: Vec<u64> = cps.iter().filter_map(|c| c[field].as_u64()).collect();
    v.sort_unstable();
    (
        v.get(v.len() / 2).copied().unwrap_or(0),
        v.last().copied().unwrap_or(0),
    )
}

fn modes(args: &BenchArgs, exe: &std::path::Path, scratch: &std::path::Path) -> Result<()> {
    let (wc_records, wc_keys) = (args.records(), args.keys()?);
    let records = 1_500_000u64;
    let sink_rate = 150_000u64;
    let interval = "500ms";
    println!(
        "backpressure job: fast source {records} + slow source {} records -> keyed two-input -> sink throttled to {sink_rate}/s; p=2, checkpoint every {interval}",
        records / 10
    );
    println!(
        "{:<26}  {:>10}  {:>6}  {:>16}  {:>16}  {:>13}  {:>14}",
        "mode",
        "records/s",
        "ckpts",
        "e2e median/max",
        "align med/max",
        "unaligned",
        "in-flight med"
    );
    let configs: [(&str, &[&str]); 3] = [
        ("aligned", &[]),
        ("unaligned", &["--unaligned"]),
        (
            "aligned, timeout 100ms",
            &["--aligned-checkpoint-timeout", "100ms"],
        ),
    ];
    for (i, (name, extra)) in configs.iter().enumerate() {
        let dir = scratch.join(format!("bp-{i}"));
        let mut a: Vec<String> = [
            "run",
            "backpressure",
            "--discard",
            "-p",
            "2",
            "--keys",
            "1000",
            "--checkpoint-interval",
            interval,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        a.extend([
            "--generate".into(),
            records.to_string(),
            "--sink-rate".into(),
            sink_rate.to_string(),
        ]);
        a.push("--checkpoint-dir".into());
        a.push(dir.display().to_string());
        a.extend(extra.iter().map(|s| s.to_string()));
        let (secs, json) = run_child(exe, scratch, &format!("bp-{i}"), &a)?;
        let _ = std::fs::remove_dir_all(&dir);
        let cps = json["checkpoints"].as_array().cloned().unwrap_or_default();
        let (e2e_med, e2e_max) = stat(&cps, "duration_ms");
        let (al_med, al_max) = stat(&cps, "alignment_ms_max");
        let (inflight_med, _) = stat(&cps, "channel_state_size");
        let unaligned = cps
            .iter()
            .filter(|c| c["unaligned"].as_bool() == Some(true))
            .count();
        println!(
            "{:<26}  {:>10}  {:>6}  {:>16}  {:>16}  {:>13}  {:>14}",
            name,
            human::count(json["records"].as_u64().unwrap_or(0) as f64 / secs),
            cps.len(),
            format!("{e2e_med}/{e2e_max} ms"),
            format!("{al_med}/{al_max} ms"),
            format!("{unaligned}/{}", cps.len()),
            human::bytes(inflight_med)
        );
    }
    println!();
    println!(
        "wordcount --generate {} --keys {} --discard, p=2: at-least-once vs exactly-once (best of {})",
        wc_records, wc_keys, args.repeat
    );
    let mut rates = Vec::new();
    for interval in ["1s", "100ms"] {
        for mode in ["exactly-once", "at-least-once"] {
            let mut best = 0f64;
            for r in 0..args.repeat.max(1) {
                let dir = scratch.join(format!("wc-{mode}-{interval}-{r}"));
                let a: Vec<String> = vec![
                    "run".into(),
                    "wordcount".into(),
                    "--discard".into(),
                    "-p".into(),
                    "2".into(),
                    "--generate".into(),
                    wc_records.to_string(),
                    "--keys".into(),
                    wc_keys.to_string(),
                    "--checkpoint-interval".into(),
                    interval.into(),
                    "--mode".into(),
                    mode.into(),
                    "--checkpoint-dir".into(),
                    dir.display().to_string(),
                ];
                let (secs, _) = run_child(exe, scratch, &format!("wc-{mode}-{interval}-{r}"), &a)?;
                let _ = std::fs::remove_dir_all(&dir);
                best = best.max(wc_records as f64 / secs);
            }
            rates.push((interval, mode, best));
        }
    }
    for (interval, mode, rate) in &rates {
        let eo = rates
            .iter()
            .find(|(i, m, _)| i == interval && *m == "exactly-once")
            .map_or(1.0, |r| r.2);
        println!(
            "  every {interval:<6} {mode:<14} {:>10} records/s  ({:.3} of exactly-once)",
            human::count(*rate),
            rate / eo
        );
    }
    Ok(())
}

struct Spawned(std::process::Child);

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a coordinator on ports the system picks and reads them back from the line it prints
/// once it listens: `(process, worker address, REST address)`. Ports chosen beforehand (bound
/// and released) could be taken by another process before the coordinator binds them.
fn spawn_coordinator(
    exe: &std::path::Path,
    checkpoint_dir: &std::path::Path,
) -> Result<(Spawned, String, String)> {
    use std::io::BufRead;
    let mut child = Command::new(exe)
        .args([
            "coordinator",
            "--bind",
            "127.0.0.1:0",
            "--rest",
            "127.0.0.1:0",
        ])
        .arg("--checkpoint-dir")
        .arg(checkpoint_dir)
        .args(["--log", "error"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .context("cannot start the coordinator")?;
    let stderr = child
        .stderr
        .take()
        .ok_or_else(|| anyhow::anyhow!("the coordinator's stderr is not piped"))?;
    let coordinator = Spawned(child);
    let mut lines = std::io::BufReader::new(stderr).lines();
    let prefix = "coordinator listening for workers on ";
    let listening = loop {
        match lines.next() {
            Some(Ok(line)) => {
                if let Some(rest) = line.strip_prefix(prefix) {
                    break rest.to_string();
                }
            }
            Some(Err(e)) => bail!("cannot read the coordinator's output: {e}"),
            None => bail!("the coordinator exited before it listened"),
        }
    };
    let (bind, rest) = listening
        .split_once(", REST API on http://")
        .ok_or_else(|| anyhow::anyhow!("unexpected coordinator line: {listening}"))?;
    let (bind, rest) = (bind.to_string(), rest.to_string());
    // Keep reading, so that the coordinator never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Ok((coordinator, bind, rest))
}

fn spawn_quiet(exe: &std::path::Path, args: &[String]) -> Result<Spawned> {
    Ok(Spawned(
        Command::new(exe)
            .args(args)
            .args(["--log", "error"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("cannot start a cluster process")?,
    ))
}

fn poll<T>(
    what: &str,
    timeout: std::time::Duration,
    mut f: impl FnMut() -> Option<T>,
) -> Result<T> {
    let end = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if Instant::now() > end {
            bail!("timed out waiting for {what}");
        }
        std::thread::park_timeout(std::time::Duration::from_millis(5));
    }
}

/// Embedded vs cluster throughput, and the time from a worker's SIGKILL to the job running again.
fn cluster_suite(args: &BenchArgs, exe: &std::path::Path, scratch: &std::path::Path) -> Result<()> {
    use cairn_app::client::Client;
    let (records, keys) = (args.records(), args.keys()?);
    let ck = scratch.join("cluster-ck");
    let (_coord, bind, rest) = spawn_coordinator(exe, &ck)?;
    let worker_args = vec![
        "worker".into(),
        "--coordinator".into(),
        bind,
        "--slots".into(),
        "2".into(),
    ];
    let mut workers = vec![
        spawn_quiet(exe, &worker_args)?,
        spawn_quiet(exe, &worker_args)?,
    ];
    let client = Client::new(&rest, None)?;
    poll(
        "the coordinator",
        std::time::Duration::from_secs(20),
        || client.get("/jobs").ok(),
    )?;
    let submit = |job_args: Vec<String>| -> Result<String> {
        let v = client
            .clone()
            .with_timeout(std::time::Duration::from_secs(60))
            .request(
                cairn_app::client::Method::Post,
                "/jobs",
                Some(&serde_json::json!({"job": "wordcount", "args": job_args})),
            )?;
        v["jobid"]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| anyhow::anyhow!("no job id in {v}"))
    };
    let state =
        |jid: &str| -> Option<serde_json::Value> { client.get(&format!("/jobs/{jid}")).ok() };
    println!(
        "wordcount --generate {} --keys {} --discard, checkpoints every 1s (records/s over the job's own run time, best of {})",
        records, keys, args.repeat
    );
    let mut embedded = 0f64;
    for r in 0..args.repeat.max(1) {
        let a: Vec<String> = vec![
            "run".into(),
            "wordcount".into(),
            "--discard".into(),
            "-p".into(),
            "2".into(),
            "--generate".into(),
            records.to_string(),
            "--keys".into(),
            keys.to_string(),
            "--checkpoint-interval".into(),
            "1s".into(),
            "--checkpoint-dir".into(),
            scratch.join(format!("emb-{r}")).display().to_string(),
        ];
        let (secs, _) = run_child(exe, scratch, &format!("emb-{r}"), &a)?;
        embedded = embedded.max(records as f64 / secs);
    }
    println!(
        "  embedded p=2          {:>10} records/s",
        human::count(embedded)
    );
    for p in [2u32, 4] {
        let mut best = 0f64;
        for _ in 0..args.repeat.max(1) {
            let jid = submit(vec![
                "-p".into(),
                p.to_string(),
                "--discard".into(),
                "--generate".into(),
                records.to_string(),
                "--keys".into(),
                keys.to_string(),
                "--checkpoint-interval".into(),
                "1s".into(),
            ])?;
            let done = poll(
                "the cluster job",
                std::time::Duration::from_secs(600),
                || state(&jid).filter(|v| v["state"] == "FINISHED"),
            )?;
            let ms = done["duration"].as_u64().unwrap_or(1).max(1);
            best = best.max(records as f64 * 1000.0 / ms as f64);
        }
        println!(
            "  cluster p={p} (2 workers) {:>10} records/s  ({:.2} of embedded p=2)",
            human::count(best),
            best / embedded
        );
    }
    // Recovery: a long job; kill a worker, start a fresh one, time until the job runs again.
    let jid = submit(vec![
        "-p".into(),
        "4".into(),
        "--discard".into(),
        "--generate".into(),
        "100000000000".into(),
        "--keys".into(),
        "1000".into(),
        "--checkpoint-interval".into(),
        "200ms".into(),
        "-D".into(),
        "restart-strategy.type=fixed-delay".into(),
        "-D".into(),
        "restart-strategy.fixed-delay.attempts=1000".into(),
        "-D".into(),
        "restart-strategy.fixed-delay.delay=0ms".into(),
    ])?;
    let mut times = Vec::new();
    for round in 0..5 {
        let restarts_before = poll("a running job", std::time::Duration::from_secs(60), || {
            state(&jid)
                .filter(|v| v["state"] == "RUNNING")
                .and_then(|v| v["restarts"].as_u64())
        })?;
        // Let it checkpoint before the kill.
        let completed = |c: &Client| -> u64 {
            c.get(&format!("/jobs/{jid}/checkpoints"))
                .ok()
                .and_then(|v| v["counts"]["completed"].as_u64())
                .unwrap_or(0)
        };
        let before = completed(&client);
        poll("a checkpoint", std::time::Duration::from_secs(60), || {
            (completed(&client) > before).then_some(())
        })?;
        let victim = workers.remove(round % workers.len());
        let t0 = Instant::now();
        drop(victim); // SIGKILL
        workers.push(spawn_quiet(exe, &worker_args)?);
        poll(
            "the job to run again",
            std::time::Duration::from_secs(60),
            || {
                state(&jid).filter(|v| {
                    v["state"] == "RUNNING" && v["restarts"].as_u64() > Some(restarts_before)
                })
            },
        )?;
        times.push(t0.elapsed().as_millis() as u64);
    }
    let _ = client.request(
        cairn_app::client::Method::Patch,
        &format!("/jobs/{jid}?mode=cancel"),
        None,
    );
    times.sort_unstable();
    println!(
        "  recovery from a worker SIGKILL to the job running again (fresh worker started at once): median {} ms, max {} ms over {} kills",
        times[times.len() / 2],
        times[times.len() - 1],
        times.len()
    );
    Ok(())
}

/// Checkpoint interval of `--suite nexmark`.
const NEXMARK_CHECKPOINT_INTERVAL: &str = "1s";
/// `--events` of `--suite nexmark` and `--suite sql` when not given: seconds per run of the
/// queries over bids on two cores (q3 and q8 generate only the persons and auctions among
/// them, and end sooner).
const NEXMARK_EVENTS_DEFAULT: u64 = 20_000_000;
/// How often a run's peak RSS is read while it runs (what it gains in its last interval is
/// missed).
const RSS_POLL: Duration = Duration::from_millis(10);

/// Flink 2.x's per-core Nexmark throughput in events/s, as nexmark/nexmark publishes it, for
/// the queries the nexmark job offers.
const FLINK_EVENTS_PER_S_PER_CORE: &[(&str, f64)] = &[
    ("q0", 379_000.0),
    ("q1", 395_000.0),
    ("q2", 414_000.0),
    ("q3", 219_000.0),
    ("q4", 28_000.0),
    ("q5", 75_000.0),
    ("q7", 23_000.0),
    ("q8", 162_000.0),
    ("q11", 46_000.0),
    ("q12", 194_000.0),
];

/// The peak resident set of a running process in bytes: its `VmHWM` (Linux). `None` once it
/// exited (a zombie has no memory) or where there is no `/proc`.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse::<u64>()
        .ok()?;
    Some(kib * 1024)
}

/// Runs this binary with `args` and a summary file, reading its peak RSS while it runs;
/// returns (summary, peak RSS). One child at a time: the RSS is that child's own.
fn run_child_peak_rss(
    exe: &std::path::Path,
    scratch: &std::path::Path,
    tag: &str,
    args: &[String],
) -> Result<(serde_json::Value, Option<u64>)> {
    let summary = scratch.join(format!("{tag}.json"));
    let stderr_path = scratch.join(format!("{tag}.stderr"));
    let stderr = std::fs::File::create(&stderr_path)
        .with_context(|| format!("cannot create {}", stderr_path.display()))?;
    let mut child = Spawned(
        Command::new(exe)
            .args(args)
            .args(["--log", "warn"])
            .arg("--summary-json")
            .arg(&summary)
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("cannot start a benchmark run")?,
    );
    let pid = child.0.id();
    let mut peak: Option<u64> = None;
    let status = loop {
        // Read before reaping: until `try_wait` reaps the child, its pid is not reused.
        if let Some(rss) = peak_rss(pid) {
            peak = Some(peak.map_or(rss, |p| p.max(rss)));
        }
        if let Some(status) = child
            .0
            .try_wait()
            .context("cannot wait for a benchmark run")?
        {
            break status;
        }
        std::thread::park_timeout(RSS_POLL);
    };
    if !status.success() {
        let stderr = std::fs::read_to_string(&stderr_path).unwrap_or_default();
        bail!("benchmark run {tag} failed ({status}): {}", stderr.trim());
    }
    let json: serde_json::Value = serde_json::from_slice(
        &std::fs::read(&summary).with_context(|| format!("cannot read {}", summary.display()))?,
    )?;
    Ok((json, peak))
}

/// One nexmark query at one parallelism (the best of `--repeat` runs).
struct NexmarkRow {
    query: &'static str,
    parallelism: u32,
    /// Events the job's sources generated.
    events: u64,
    /// The job's own run time (its summary's `elapsed_ms`).
    elapsed_ms: u64,
    restarts: u64,
    failed_checkpoints: u64,
    checkpoints: usize,
    /// Checkpoint duration (median, max).
    duration_ms: (u64, u64),
    /// Checkpoint size (median, max, last).
    size: (u64, u64, u64),
    peak_rss: Option<u64>,
}

impl NexmarkRow {
    fn rate(&self) -> f64 {
        self.events as f64 * 1000.0 / self.elapsed_ms.max(1) as f64
    }

    /// `best` of `--repeat` runs: this one if it is faster (or the first).
    fn keep_if_faster(self, best: &mut Option<NexmarkRow>) {
        if best.as_ref().is_none_or(|b| self.rate() > b.rate()) {
            *best = Some(self);
        }
    }
}

/// Says so when any of `rows` restarted or failed checkpoints.
fn note_disturbed_runs<'a>(mut rows: impl Iterator<Item = &'a NexmarkRow>) {
    if rows.any(|r| r.restarts > 0 || r.failed_checkpoints > 0) {
        println!("some runs restarted or failed checkpoints (see restarts= and failed_checkpoints= below): their figures are not of an undisturbed run");
    }
}

/// `12.3MiB`: a size in one token, so that every cell of a table row is one word.
fn bytes_token(n: u64) -> String {
    human::bytes(n).replace(' ', "")
}

fn ratio_token(r: Option<f64>, digits: usize) -> String {
    r.map_or("-".into(), |r| format!("{r:.digits$}"))
}

/// `run` arguments of the nexmark job running `query` over `events` events, its output
/// discarded.
fn nexmark_job(query: &str, events: u64) -> Vec<String> {
    vec![
        "run".into(),
        "nexmark".into(),
        "--query".into(),
        query.into(),
        "--events".into(),
        events.to_string(),
        "--discard".into(),
    ]
}

/// Runs one Nexmark job (`job`: its `run` arguments) at parallelism `p` with exactly-once
/// checkpoints every [`NEXMARK_CHECKPOINT_INTERVAL`] into a directory of its own (removed
/// after), and reads its figures from its summary.
fn nexmark_run(
    exe: &std::path::Path,
    scratch: &std::path::Path,
    tag: &str,
    query: &'static str,
    p: u32,
    job: &[String],
) -> Result<NexmarkRow> {
    let dir = scratch.join(tag);
    let mut a = job.to_vec();
    a.extend([
        "--parallelism".into(),
        p.to_string(),
        "--mode".into(),
        "exactly-once".into(),
        "--checkpoint-interval".into(),
        NEXMARK_CHECKPOINT_INTERVAL.into(),
        "--checkpoint-dir".into(),
        dir.display().to_string(),
    ]);
    let run = run_child_peak_rss(exe, scratch, tag, &a);
    let _ = std::fs::remove_dir_all(&dir);
    let (json, peak_rss) = run?;
    let field = |name: &str| -> Result<u64> {
        json[name]
            .as_u64()
            .ok_or_else(|| anyhow::anyhow!("no {name} in the summary of {tag}"))
    };
    let cps = json["checkpoints"].as_array().cloned().unwrap_or_default();
    let (size_median, size_max) = stat(&cps, "state_size");
    Ok(NexmarkRow {
        query,
        parallelism: p,
        events: field("records")?,
        elapsed_ms: field("elapsed_ms")?,
        restarts: field("restarts")?,
        failed_checkpoints: field("failed_checkpoints")?,
        checkpoints: cps.len(),
        duration_ms: stat(&cps, "duration_ms"),
        size: (
            size_median,
            size_max,
            cps.last()
                .and_then(|c| c["state_size"].as_u64())
                .unwrap_or(0),
        ),
        peak_rss,
    })
}

/// Every query of the nexmark job at every `--parallelism`, with exactly-once checkpoints,
/// against Flink's per-core figures.
fn nexmark_suite(args: &BenchArgs, exe: &std::path::Path, scratch: &std::path::Path) -> Result<()> {
    use cairn::jobs::nexmark::QUERIES;
    let events = args.events.unwrap_or(NEXMARK_EVENTS_DEFAULT);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
    let first_p = args.parallelism.first().copied().unwrap_or(1);
    println!(
        "nexmark --events {events} --discard, exactly-once checkpoints every {NEXMARK_CHECKPOINT_INTERVAL} into a temporary directory, best of {}; {cores} cores available",
        args.repeat.max(1)
    );
    println!(
        "events/s: events the sources generated / the job's own run time; per core: / min(p, {cores}); vs Flink: per core / Flink 2.x's per-core figure (nexmark/nexmark); peak RSS: the process's VmHWM, read every {} ms",
        RSS_POLL.as_millis()
    );
    let header = format!(
        "{:<5}  {:>3}  {:>8}  {:>6}  {:>9}  {:>9}  {:>8}  {:>8}  {:>5}  {:>15}  {:>19}  {:>9}",
        "query",
        "p",
        "events",
        "run s",
        "events/s",
        "per core",
        "vs Flink",
        format!("vs p={first_p}"),
        "ckpts",
        "ckpt ms med/max",
        "ckpt size med/max",
        "peak RSS"
    );
    println!("{header}");
    let mut rows: Vec<NexmarkRow> = Vec::new();
    let mut lines = Vec::new();
    for &query in QUERIES {
        let flink = FLINK_EVENTS_PER_S_PER_CORE
            .iter()
            .find(|(q, _)| *q == query)
            .map(|(_, rate)| *rate);
        for &p in &args.parallelism {
            let mut best: Option<NexmarkRow> = None;
            for r in 0..args.repeat.max(1) {
                let tag = format!("nexmark-{query}-p{p}-{r}");
                let row = nexmark_run(exe, scratch, &tag, query, p, &nexmark_job(query, events))?;
                row.keep_if_faster(&mut best);
            }
            let Some(row) = best else { continue };
            let per_core = row.rate() / f64::from(p.min(cores));
            let vs_flink = flink.map(|f| per_core / f);
            let vs_first_p = (p != first_p)
                .then(|| {
                    rows.iter()
                        .find(|o| o.query == query && o.parallelism == first_p)
                        .map(|o| row.rate() / o.rate())
                })
                .flatten();
            println!(
                "{:<5}  {:>3}  {:>8}  {:>6.2}  {:>9}  {:>9}  {:>8}  {:>8}  {:>5}  {:>15}  {:>19}  {:>9}",
                query,
                p,
                human::count(row.events as f64),
                row.elapsed_ms as f64 / 1000.0,
                human::count(row.rate()),
                human::count(per_core),
                ratio_token(vs_flink, 2),
                ratio_token(vs_first_p, 2),
                row.checkpoints,
                format!("{}/{}", row.duration_ms.0, row.duration_ms.1),
                format!("{}/{}", bytes_token(row.size.0), bytes_token(row.size.1)),
                row.peak_rss.map_or("-".into(), bytes_token),
            );
            lines.push(format!(
                "nexmark query={query} p={p} cores_used={} stream_events={events} events={} elapsed_ms={} events_per_s={:.0} events_per_s_per_core={per_core:.0} flink_events_per_s_per_core={} vs_flink={} vs_first_p={} checkpoints={} checkpoint_ms_median={} checkpoint_ms_max={} checkpoint_bytes_median={} checkpoint_bytes_max={} checkpoint_bytes_last={} failed_checkpoints={} restarts={} peak_rss_bytes={}",
                p.min(cores),
                row.events,
                row.elapsed_ms,
                row.rate(),
                flink.map_or("-".into(), |f| format!("{f:.0}")),
                ratio_token(vs_flink, 3),
                ratio_token(vs_first_p, 3),
                row.checkpoints,
                row.duration_ms.0,
                row.duration_ms.1,
                row.size.0,
                row.size.1,
                row.size.2,
                row.failed_checkpoints,
                row.restarts,
                row.peak_rss.map_or("-".into(), |b| b.to_string()),
            ));
            rows.push(row);
        }
    }
    let mut partial: Vec<String> = Vec::new();
    for r in rows.iter().filter(|r| r.events < events) {
        let share = format!(
            "{} ({:.1} %)",
            r.query,
            r.events as f64 * 100.0 / events as f64
        );
        if !partial.contains(&share) {
            partial.push(share);
        }
    }
    if !partial.is_empty() {
        println!(
            "{}: the sources generate only the kinds of events the query reads (that share of the {events} events), and events/s counts those; Flink's figures count every event of the stream",
            partial.join(", ")
        );
    }
    note_disturbed_runs(rows.iter());
    println!();
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

pub fn run(args: BenchArgs) -> Result<()> {
    let args = BenchArgs {
        repeat: args.repeat_flag.unwrap_or(1),
        ..args
    };
    args.check()?;
    let exe = std::env::current_exe().context("cannot find the cairn binary")?;
    let scratch = std::env::temp_dir().join(format!("cairn-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)
        .with_context(|| format!("cannot create {}", scratch.display()))?;
    match args.suite.as_str() {
        "throughput" => {}
        "modes" => {
            let r = modes(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "cluster" => {
            let r = cluster_suite(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "nexmark" => {
            let r = nexmark_suite(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "sql" => {
            let r = sql::run(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "savepoint" => {
            let r = savepoint::run(&args, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "state" => {
            let r = state::run(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "s3" => {
            let r = s3::run(&args, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "postgres" => {
            let r = postgres::run(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "kafka-source" => {
            let _ = std::fs::remove_dir_all(&scratch);
            return kafka_source::run(&args);
        }
        "kafka" => {
            let records = args.records.unwrap_or(3_000_000);
            let r = kafka::run(
                &exe,
                &scratch,
                &args.kafka_brokers,
                records,
                args.keys()?,
                args.repeat,
            );
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "metrics" => {
            let r = metrics::run(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "failover" => {
            let r = failover::run(&args, &exe, &scratch);
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        "e2e" => {
            let r = (|| {
                println!("== Kafka -> wordcount -> Kafka");
                let records = args.records.unwrap_or(3_000_000);
                let (brokers, keys) = (&args.kafka_brokers, args.keys()?);
                kafka::run(&exe, &scratch, brokers, records, keys, args.repeat)?;
                println!("\n== wordcount -> PostgreSQL");
                postgres::run(&args, &exe, &scratch)?;
                println!("\n== checkpoints on S3 against the local filesystem");
                s3::run(&args, &scratch)
            })();
            let _ = std::fs::remove_dir_all(&scratch);
            return r;
        }
        other => {
            let _ = std::fs::remove_dir_all(&scratch);
            bail!(
                "unknown benchmark suite '{other}'; suites: throughput, modes, cluster, nexmark, sql, savepoint, state, s3, postgres, kafka-source, kafka, e2e, metrics, failover"
            )
        }
    }
    let (records, keys) = (args.records(), args.keys()?);
    let mut rows = Vec::new();
    println!(
        "wordcount --generate {} --keys {} --discard (records/s of the whole process, best of {})",
        records, keys, args.repeat
    );
    for &p in &args.parallelism {
        for interval in &args.intervals() {
            let mut best: Option<Row> = None;
            for r in 0..args.repeat.max(1) {
                let dir = scratch.join(format!("p{p}-{interval}-{r}"));
                let mut a: Vec<String> = [
                    "run",
                    "wordcount",
                    "--discard",
                    "--generate",
                    &records.to_string(),
                    "--keys",
                    &keys.to_string(),
                    "--parallelism",
                    &p.to_string(),
                    "--checkpoint-interval",
                    interval,
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                if interval != "0" {
                    a.extend(["--checkpoint-dir".to_string(), dir.display().to_string()]);
                }
                let (secs, json) = run_child(&exe, &scratch, &format!("p{p}-{interval}-{r}"), &a)?;
                let cps = json["checkpoints"].as_array().cloned().unwrap_or_default();
                let row = Row {
                    parallelism: p,
                    interval: interval.clone(),
                    rate: records as f64 / secs,
                    checkpoints: cps.len(),
                    median_ms: stat(&cps, "duration_ms").0,
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
