//! `cairn run JOB`: a built-in job in this process.

use std::io::{IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use cairn::api::JobGraph;
use cairn::cluster::{BuiltJob, JobFactory};
use cairn::config::{keys, JobConfig};
use cairn::connectors::kafka::{KafkaSinkConfig, KafkaSourceConfig};
use cairn::jobs::nexmark::{self, NexmarkArgs};
use cairn::jobs::wordcount::{self, WordInput, WordOutput};
use cairn::jobs::{backpressure, pipelines};
use cairn::runtime::{
    run_job, InjectSpec, JobStatus, JobSummary, Progress, RestoreFrom, RunOptions, SavepointKind,
    SavepointState,
};
use cairn_rest::{JobRegistry, RestServer};
use clap::{Args, Parser};

use crate::human;

/// Built-in jobs.
const JOBS: &[&str] = &["wordcount", "backpressure", "pipelines", "nexmark"];

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The built-in job to run: wordcount, backpressure, pipelines or nexmark.
    job: String,
    /// Input text file (whitespace-separated words).
    #[arg(long, value_name = "FILE", conflicts_with = "generate")]
    input: Option<PathBuf>,
    /// Generate N words instead of reading a file: record i is `w` + ((i * 7919) mod K).
    #[arg(long, value_name = "N")]
    generate: Option<u64>,
    /// Number of distinct generated words (K).
    #[arg(long, value_name = "K", requires = "generate")]
    keys: Option<u64>,
    /// wordcount: read at most N records per second (generated words, or lines of --input or
    /// --kafka-input; 0: as fast as possible) [default: 0]; pipelines: N words per second in
    /// each pipeline. nexmark: N events per second of event time (their timestamps are 1/N s
    /// apart; they are emitted as fast as possible) [default: 10000].
    #[arg(long, value_name = "N")]
    rate: Option<u64>,
    /// nexmark: the query to run (q0, q1, q2, q3, q4, q5, q7, q8, q11, q12).
    #[arg(long, value_name = "QUERY")]
    query: Option<String>,
    /// nexmark: generate N events (persons, auctions and bids, 1:3:46).
    #[arg(long, value_name = "N")]
    events: Option<u64>,
    /// backpressure: records per second the throttled sink accepts.
    #[arg(long, value_name = "N", default_value_t = 100_000)]
    sink_rate: u64,
    /// Output directory for the exactly-once file sink (committed files never start with '.' or '_').
    #[arg(long, value_name = "DIR", conflicts_with = "discard")]
    output: Option<PathBuf>,
    /// Discard the output (benchmarks).
    #[arg(long)]
    discard: bool,
    /// wordcount: write the counts into PostgreSQL instead, e.g.
    /// postgres://cairn:cairn@127.0.0.1:55432/cairn (plain TCP, no TLS); needs --pg-table.
    #[arg(long, value_name = "URL", conflicts_with_all = ["output", "discard"], requires = "pg_table")]
    pg_output: Option<String>,
    /// The table --pg-output writes: TABLE or SCHEMA.TABLE, created if it does not exist.
    #[arg(long, value_name = "NAME", requires = "pg_output")]
    pg_table: Option<String>,
    /// How --pg-output writes exactly once: 2pc (prepared transactions committed with the
    /// checkpoint; one row per update), upsert (one row per word with its latest count,
    /// idempotent) or wal (rows kept in state until their checkpoint completes, then written
    /// with a commit record; one row per update).
    #[arg(
        long,
        value_name = "MODE",
        requires = "pg_output",
        default_value = "2pc"
    )]
    pg_mode: String,
    /// Default parallelism of every operator (parallelism.default).
    #[arg(long, short = 'p', value_name = "N")]
    parallelism: Option<u32>,
    /// Checkpoint directory (state.checkpoints.dir). Enables 1s checkpoints unless an interval is set.
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: Option<PathBuf>,
    /// Checkpoint interval, e.g. 500ms, 10s, 1min; 0 disables checkpointing (execution.checkpointing.interval).
    #[arg(long, value_name = "DURATION")]
    checkpoint_interval: Option<String>,
    /// Checkpointing mode: exactly-once or at-least-once (execution.checkpointing.mode).
    #[arg(long, value_name = "MODE")]
    mode: Option<String>,
    /// Unaligned checkpoints: barriers overtake in-flight data, which is persisted (execution.checkpointing.unaligned.enabled).
    #[arg(long)]
    unaligned: bool,
    /// Start checkpoints aligned and switch to unaligned after this long, e.g. 200ms (execution.checkpointing.aligned-checkpoint-timeout; implies --unaligned).
    #[arg(long, value_name = "DURATION")]
    aligned_checkpoint_timeout: Option<String>,
    /// Checkpoints in flight at once (execution.checkpointing.max-concurrent-checkpoints).
    #[arg(long, value_name = "N")]
    max_concurrent_checkpoints: Option<u32>,
    /// Start from a checkpoint: a chk-<n> directory (or its _metadata), or `latest` under --checkpoint-dir.
    #[arg(long, value_name = "PATH|latest")]
    from: Option<String>,
    /// YAML configuration file with Flink's keys.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Set a configuration key, e.g. -D restart-strategy.type=fixed-delay (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    define: Vec<String>,
    /// Inject N failures at random records of random subtasks (recovered by the restart strategy).
    #[arg(long, value_name = "N")]
    inject_failures: Option<usize>,
    /// Inject failures only into tasks whose head operator uid starts with this.
    #[arg(long, value_name = "UID_PREFIX", requires = "inject_failures")]
    inject_uid: Option<String>,
    /// Seed of --inject-failures, and of the events of nexmark.
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Write the run's summary as JSON to this file (for scripts and benchmarks).
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
    /// Serve Flink's REST API (jobs, checkpoints, cancel) while the job runs: HOST:PORT, or PORT on 127.0.0.1.
    #[arg(long, value_name = "ADDR")]
    rest: Option<String>,
    /// Start from a savepoint or checkpoint that holds state of operators this job does not have; that state is dropped (execution.state-recovery.ignore-unclaimed-state).
    #[arg(long, requires = "from")]
    allow_non_restored_state: bool,
    /// On Ctrl-C or SIGTERM, stop with a savepoint under DIR (a second signal cancels): sources
    /// stop, the savepoint is taken, sinks commit everything before it, and the job ends
    /// FINISHED; `--from` the printed path continues exactly once.
    #[arg(long, value_name = "DIR")]
    savepoint_on_exit: Option<PathBuf>,
    /// Require `Authorization: Bearer TOKEN` on every REST request.
    #[arg(long, value_name = "TOKEN", requires = "rest")]
    rest_token: Option<String>,
    /// Kafka bootstrap brokers of --kafka-input and --kafka-output, HOST:PORT[,HOST:PORT...]
    /// (bootstrap.servers, plain TCP).
    #[arg(long, value_name = "HOST:PORT")]
    kafka_brokers: Option<String>,
    /// wordcount: read lines of words from this Kafka topic (the record values); its partitions'
    /// offsets are the source's state.
    #[arg(long, value_name = "TOPIC", requires = "kafka_brokers", conflicts_with_all = ["input", "generate"])]
    kafka_input: Option<String>,
    /// --kafka-input: read up to the end offsets the partitions had when the job started
    /// fresh, then finish (a restored run stops at the same offsets).
    #[arg(long, requires = "kafka_input")]
    kafka_bounded: bool,
    /// --kafka-input: where a fresh start begins: earliest, latest, committed (the group's
    /// offsets, else earliest), committed-or-latest, or timestamp:MILLIS (ms since the epoch).
    /// A restore always resumes at the checkpoint's offsets [default: earliest].
    #[arg(long, value_name = "POSITION", requires = "kafka_input")]
    kafka_start: Option<String>,
    /// --kafka-input: consumer group that completed checkpoints' offsets are committed to (for
    /// lag monitoring only) and that `--kafka-start committed` reads [default: cairn-wordcount].
    #[arg(long, value_name = "GROUP", requires = "kafka_input")]
    kafka_group: Option<String>,
    /// --kafka-input: how often to look for new partitions of the topic, e.g. 30s; 0 never
    /// [default: 5min].
    #[arg(long, value_name = "DURATION", requires = "kafka_input")]
    kafka_discovery_interval: Option<String>,
    /// wordcount: write every update to this Kafka topic, key the word, value WORD<TAB>COUNT.
    #[arg(long, value_name = "TOPIC", requires = "kafka_brokers", conflicts_with_all = ["output", "discard", "pg_output"])]
    kafka_output: Option<String>,
    /// --kafka-output's guarantee: none, at-least-once, or exactly-once (Kafka transactions
    /// committed with the checkpoints) [default: exactly-once].
    #[arg(long, value_name = "GUARANTEE", requires = "kafka_output")]
    kafka_guarantee: Option<String>,
    /// Prefix of --kafka-output's transactional ids (exactly-once) [default: cairn-<job id>-<sink uid>].
    #[arg(long, value_name = "PREFIX", requires = "kafka_output")]
    kafka_transactional_id_prefix: Option<String>,
    /// --kafka-output's transaction.timeout.ms (exactly-once), e.g. 15min: the broker aborts
    /// transactions open longer [default: 15min].
    #[arg(long, value_name = "DURATION", requires = "kafka_output")]
    kafka_transaction_timeout: Option<String>,
}

/// `--kafka-input` and its flags.
fn kafka_input(args: &RunArgs) -> Result<WordInput> {
    let topic = args.kafka_input.as_deref().unwrap_or_default();
    let brokers = args.kafka_brokers.clone().unwrap_or_default();
    if brokers.trim().is_empty() {
        bail!("--kafka-brokers needs HOST:PORT");
    }
    if topic.trim().is_empty() {
        bail!("--kafka-input needs a topic name");
    }
    let mut config = KafkaSourceConfig::new(brokers, vec![topic.to_string()]);
    if let Some(start) = &args.kafka_start {
        config.start = start
            .parse()
            .map_err(|e: String| anyhow!("--kafka-start: {e}"))?;
    }
    config.group_id = Some(
        args.kafka_group
            .clone()
            .unwrap_or_else(|| "cairn-wordcount".to_string()),
    );
    if config
        .group_id
        .as_deref()
        .is_some_and(|g| g.trim().is_empty())
    {
        bail!("--kafka-group must not be empty");
    }
    if let Some(interval) = &args.kafka_discovery_interval {
        let d = cairn::config::parse_duration(interval)
            .map_err(|e| anyhow!("--kafka-discovery-interval: {e}"))?;
        config.discovery_interval = (!d.is_zero()).then_some(d);
    }
    config.bounded = args.kafka_bounded;
    Ok(WordInput::Kafka(config))
}

/// `--kafka-output` and its flags.
fn kafka_output(args: &RunArgs) -> Result<Option<WordOutput>> {
    let (Some(brokers), Some(topic)) = (&args.kafka_brokers, &args.kafka_output) else {
        if args.kafka_brokers.is_some() && args.kafka_input.is_none() {
            bail!("--kafka-brokers needs --kafka-input TOPIC or --kafka-output TOPIC");
        }
        return Ok(None);
    };
    let mut config = KafkaSinkConfig::new(brokers, topic);
    if let Some(g) = &args.kafka_guarantee {
        config.guarantee = g
            .parse()
            .map_err(|e| anyhow!("invalid value '{g}' for --kafka-guarantee: {e}"))?;
    }
    config.transactional_id_prefix = args.kafka_transactional_id_prefix.clone();
    if let Some(t) = &args.kafka_transaction_timeout {
        config.transaction_timeout = cairn::config::parse_duration(t)
            .map_err(|e| anyhow!("invalid value '{t}' for --kafka-transaction-timeout: {e}"))?;
    }
    Ok(Some(WordOutput::Kafka(config)))
}

/// Builds the configuration: defaults, then the file, then -D, then the dedicated flags.
fn build_config(args: &RunArgs) -> Result<JobConfig> {
    let mut config = match &args.config {
        Some(path) => JobConfig::from_file(path)?,
        None => JobConfig::default(),
    };
    let mut pairs: Vec<(String, String)> = Vec::new();
    for d in &args.define {
        let (k, v) = d
            .split_once('=')
            .filter(|(k, _)| !k.trim().is_empty())
            .ok_or_else(|| anyhow!("-D expects KEY=VALUE, got '{d}'"))?;
        pairs.push((k.trim().to_string(), v.trim().to_string()));
    }
    if let Some(p) = args.parallelism {
        pairs.push((keys::PARALLELISM.into(), p.to_string()));
    }
    if let Some(d) = &args.checkpoint_dir {
        pairs.push((keys::CHECKPOINTS_DIR.into(), d.display().to_string()));
    }
    if let Some(i) = &args.checkpoint_interval {
        pairs.push((keys::CHECKPOINT_INTERVAL.into(), i.clone()));
    }
    if let Some(m) = &args.mode {
        pairs.push((keys::CHECKPOINTING_MODE.into(), m.clone()));
    }
    if args.unaligned || args.aligned_checkpoint_timeout.is_some() {
        pairs.push((keys::UNALIGNED_ENABLED.into(), "true".into()));
    }
    if let Some(t) = &args.aligned_checkpoint_timeout {
        pairs.push((keys::ALIGNED_CHECKPOINT_TIMEOUT.into(), t.clone()));
    }
    if let Some(n) = args.max_concurrent_checkpoints {
        pairs.push((keys::MAX_CONCURRENT_CHECKPOINTS.into(), n.to_string()));
    }
    if args.allow_non_restored_state {
        pairs.push((keys::IGNORE_UNCLAIMED_STATE.into(), "true".into()));
    }
    config.set_all(pairs)?;
    // `--checkpoint-dir` alone means "checkpoint there": every 1s, unless an interval is set by
    // a flag, by -D, or by a configuration file (which is then authoritative, as in Flink).
    let interval_given = args.checkpoint_interval.is_some()
        || args
            .define
            .iter()
            .any(|d| d.starts_with(keys::CHECKPOINT_INTERVAL))
        || args.config.is_some();
    if args.checkpoint_dir.is_some() && !interval_given {
        config.set(keys::CHECKPOINT_INTERVAL, "1s")?;
    }
    config.validate()?;
    Ok(config)
}

fn progress_line(p: &Progress) {
    let secs = p.elapsed.as_secs_f64().max(1e-9);
    let mut line = format!(
        "{} records ({}/s), {} checkpoints",
        human::count(p.records as f64),
        human::count(p.records as f64 / secs),
        p.checkpoints
    );
    if let Some((id, ms, size)) = p.last_checkpoint {
        line.push_str(&format!(" (last #{id}: {ms} ms, {})", human::bytes(size)));
    }
    if p.restarts > 0 {
        line.push_str(&format!(", {} restarts", p.restarts));
    }
    let mut err = std::io::stderr().lock();
    let _ = write!(err, "\r\x1b[2K{line}");
    let _ = err.flush();
}

fn count_lines(path: &std::path::Path) -> Result<u64> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)
        .with_context(|| format!("cannot read input file {}", path.display()))?;
    let mut buf = vec![0u8; 1 << 16];
    let mut lines = 0u64;
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read input file {}", path.display()))?;
        if n == 0 {
            return Ok(lines.max(1));
        }
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
    }
}

fn median(mut v: Vec<u64>) -> u64 {
    if v.is_empty() {
        return 0;
    }
    v.sort_unstable();
    v[v.len() / 2]
}

fn summary_line(s: &JobSummary) -> String {
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    let mut line = format!(
        "{} finished in {:.2}s: {} records ({} records/s)",
        s.job_name,
        secs,
        s.records,
        human::count(s.records as f64 / secs)
    );
    let n = s.checkpoints.len();
    line.push_str(&format!(", {n} checkpoints completed"));
    if n > 0 {
        let durations: Vec<u64> = s.checkpoints.iter().map(|c| c.duration_ms).collect();
        let max = durations.iter().copied().max().unwrap_or(0);
        let last = &s.checkpoints[n - 1];
        let per_task = |f: fn(&cairn::checkpoint::TaskCheckpointStats) -> u64| -> Vec<u64> {
            s.checkpoints
                .iter()
                .map(|c| c.metadata.tasks.iter().map(f).max().unwrap_or(0))
                .collect()
        };
        let align = per_task(|t| t.alignment_ms);
        let sync = per_task(|t| t.sync_ms);
        let asyn = per_task(|t| t.async_ms);
        let inflight: Vec<u64> = s
            .checkpoints
            .iter()
            .map(|c| c.metadata.tasks.iter().map(|t| t.channel_state_size).sum())
            .collect();
        let unaligned = s
            .checkpoints
            .iter()
            .filter(|c| c.metadata.tasks.iter().any(|t| t.unaligned))
            .count();
        line.push_str(&format!(
            " (duration median {} ms, max {max} ms; alignment median {} ms, max {} ms; sync max {} ms; async max {} ms; {unaligned} unaligned, in-flight data max {}; last #{}: {})",
            median(durations),
            median(align.clone()),
            align.iter().max().unwrap_or(&0),
            sync.iter().max().unwrap_or(&0),
            asyn.iter().max().unwrap_or(&0),
            human::bytes(inflight.iter().copied().max().unwrap_or(0)),
            last.id,
            human::bytes(last.state_size)
        ));
    }
    if s.failed_checkpoints > 0 {
        line.push_str(&format!(", {} checkpoints failed", s.failed_checkpoints));
    }
    line.push_str(&format!(", {} restarts", s.restarts));
    if let Some((fired, planned)) = s.injected {
        line.push_str(&format!(", {fired}/{planned} injected failures"));
    }
    line
}

/// The CPU time (user and system, all threads) this process has used so far.
fn process_cpu_ms() -> Option<u64> {
    use nix::sys::resource::{getrusage, UsageWho};
    let usage = getrusage(UsageWho::RUSAGE_SELF).ok()?;
    let ms = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1000 + t.tv_usec() as u64 / 1000;
    Some(ms(usage.user_time()) + ms(usage.system_time()))
}

fn summary_json(s: &JobSummary) -> serde_json::Value {
    serde_json::json!({
        "job_id": s.job_id,
        "job_name": s.job_name,
        "elapsed_ms": s.elapsed.as_millis() as u64,
        "cpu_ms": process_cpu_ms(),
        "records": s.records,
        "restarts": s.restarts,
        "failed_checkpoints": s.failed_checkpoints,
        "injected_fired": s.injected.map(|i| i.0),
        "restored_from": s.restored_from,
        "checkpoints": s.checkpoints.iter().map(|c| serde_json::json!({
            "id": c.id,
            "duration_ms": c.duration_ms,
            "state_size": c.state_size,
            "alignment_ms_max": c.metadata.tasks.iter().map(|t| t.alignment_ms).max().unwrap_or(0),
            "sync_ms_max": c.metadata.tasks.iter().map(|t| t.sync_ms).max().unwrap_or(0),
            "async_ms_max": c.metadata.tasks.iter().map(|t| t.async_ms).max().unwrap_or(0),
            "start_delay_ms_max": c.metadata.tasks.iter().map(|t| t.start_delay_ms).max().unwrap_or(0),
            "channel_state_size": c.metadata.tasks.iter().map(|t| t.channel_state_size).sum::<u64>(),
            "unaligned": c.metadata.tasks.iter().any(|t| t.unaligned),
        })).collect::<Vec<_>>(),
    })
}

/// What a built-in job reads.
pub enum JobInput {
    /// wordcount, backpressure, pipelines.
    Words(WordInput),
    /// nexmark's generated events.
    Nexmark(NexmarkArgs),
}

/// nexmark's flags.
fn nexmark_args(args: &RunArgs) -> Result<NexmarkArgs> {
    if args.input.is_some() || args.generate.is_some() {
        bail!("nexmark generates its events: use --events N, not --input or --generate");
    }
    if args.kafka_input.is_some() {
        bail!("nexmark generates its events: use --events N, not --kafka-input");
    }
    let Some(query) = &args.query else {
        bail!(
            "nexmark needs --query QUERY; available queries: {}",
            nexmark::QUERIES.join(", ")
        );
    };
    let Some(events) = args.events else {
        bail!("nexmark needs --events N");
    };
    if events == 0 {
        bail!("--events must be at least 1");
    }
    let rate = args.rate.unwrap_or(cairn::connectors::DEFAULT_RATE);
    if rate == 0 {
        bail!("--rate must be at least 1 event per second for nexmark");
    }
    Ok(NexmarkArgs {
        query: query.clone(),
        events,
        seed: args.seed,
        rate,
    })
}

/// Builds a built-in job's graph and configuration from its flags (also used by cluster
/// processes, which rebuild the job from the flags it was submitted with).
pub fn build_job(args: &RunArgs) -> Result<(JobGraph, JobConfig, JobInput)> {
    if !JOBS.contains(&args.job.as_str()) {
        bail!(
            "unknown job '{}'; built-in jobs: {}",
            args.job,
            JOBS.join(", ")
        );
    }
    let config = build_config(args)?;
    let output = match (&args.output, args.discard) {
        (Some(dir), false) => WordOutput::Dir(dir.clone()),
        (None, true) => WordOutput::Discard,
        _ => WordOutput::Print,
    };
    let output = match &args.pg_output {
        Some(url) => postgres_output(args, url)?,
        None => output,
    };
    let output = kafka_output(args)?.unwrap_or(output);
    if args.job == "nexmark" {
        let nexmark = nexmark_args(args)?;
        let graph = nexmark::build(&nexmark, &output).map_err(|e| anyhow!(e))?;
        return Ok((graph, config, JobInput::Nexmark(nexmark)));
    }
    if args.query.is_some() || args.events.is_some() {
        bail!("--query and --events are flags of the nexmark job");
    }
    if args.rate.is_some() && args.job == "backpressure" {
        bail!("backpressure paces its slow source itself (--sink-rate paces its sink): --rate is not a flag of it");
    }
    let rate = args.rate.unwrap_or(0);
    let input = match (&args.input, args.generate) {
        _ if args.kafka_input.is_some() => kafka_input(args)?,
        (Some(path), None) => {
            std::fs::metadata(path)
                .with_context(|| format!("cannot read input file {}", path.display()))?;
            WordInput::File(path.clone())
        }
        (None, Some(count)) => {
            let keys = args.keys.unwrap_or(1000);
            if keys == 0 {
                bail!("--keys must be at least 1");
            }
            WordInput::Generate { count, keys }
        }
        _ => bail!("wordcount needs --input FILE, --generate N or --kafka-input TOPIC"),
    };
    let graph = match (args.job.as_str(), &input) {
        ("backpressure", WordInput::Generate { count, keys, .. }) => {
            backpressure::build(&backpressure::BackpressureArgs {
                records: *count,
                keys: *keys,
                sink_rate: args.sink_rate,
                output: output.clone(),
            })
        }
        ("backpressure", WordInput::File(_)) | ("pipelines", WordInput::File(_)) => {
            bail!("{} generates its input: use --generate N", args.job)
        }
        ("backpressure" | "pipelines", WordInput::Kafka(_)) => {
            bail!("{} generates its input: use --generate N", args.job)
        }
        ("pipelines", WordInput::Generate { count, keys, .. }) => {
            pipelines::build(*count, *keys, rate, &output)
        }
        _ => wordcount::build(&input, rate, &output),
    }
    .map_err(|e| anyhow!(e))?;
    Ok((graph, config, JobInput::Words(input)))
}

/// `--pg-output URL --pg-table NAME --pg-mode MODE` (wordcount only).
fn postgres_output(args: &RunArgs, url: &str) -> Result<WordOutput> {
    if args.job != "wordcount" {
        bail!("--pg-output is a flag of wordcount, not of {}", args.job);
    }
    let mode: cairn::connectors::PgMode = args.pg_mode.parse().map_err(|e: String| anyhow!(e))?;
    Ok(WordOutput::Postgres {
        url: url.to_string(),
        table: args.pg_table.clone().unwrap_or_default(),
        mode,
    })
}

/// `cairn run`'s flags on their own, to parse a submitted job's flags.
#[derive(clap::Parser, Debug)]
#[command(name = "run")]
struct RunCommand {
    #[command(flatten)]
    args: RunArgs,
}

/// The built-in jobs, for cluster processes.
pub struct BuiltinJobs;

impl JobFactory for BuiltinJobs {
    fn build(&self, job: &str, args: &[String]) -> std::result::Result<BuiltJob, String> {
        let argv = ["run", job]
            .into_iter()
            .map(String::from)
            .chain(args.iter().cloned());
        let parsed = RunCommand::try_parse_from(argv)
            .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())?;
        let (graph, config, input) = build_job(&parsed.args).map_err(|e| format!("{e:#}"))?;
        let inject = match parsed.args.inject_failures {
            Some(count) => Some(InjectSpec {
                count,
                seed: parsed.args.seed,
                expected_records: expected_records(&parsed.args, &input)
                    .map_err(|e| format!("{e:#}"))?,
            }),
            None => None,
        };
        Ok(BuiltJob {
            graph,
            config,
            inject,
            inject_target: cairn::runtime::InjectTarget(parsed.args.inject_uid.clone()),
            restore: restore_from(parsed.args.from.as_deref())?,
        })
    }
}

/// The records all sources of the job read in a run without failures (failures are planned
/// among them).
fn expected_records(args: &RunArgs, input: &JobInput) -> Result<u64> {
    let input = match input {
        JobInput::Nexmark(nexmark) => {
            return nexmark::source_records(nexmark).map_err(|e| anyhow!(e));
        }
        JobInput::Words(input) => input,
    };
    Ok(match input {
        WordInput::Generate { count, .. } if args.job == "backpressure" => count + count / 10,
        WordInput::Generate { count, .. } if args.job == "pipelines" => count * 2,
        WordInput::Generate { count, .. } => *count,
        // Failures are planned within the smallest record count any task sees: the lines.
        WordInput::File(p) if args.inject_failures.is_some() => count_lines(p)?,
        WordInput::File(_) => 1,
        WordInput::Kafka(_) if args.inject_failures.is_some() => {
            bail!("--inject-failures plans failures among a known number of records: use --input or --generate, not --kafka-input")
        }
        WordInput::Kafka(_) => 1,
    })
}

pub fn run(args: RunArgs) -> Result<()> {
    let (graph, config, input) = build_job(&args)?;
    let restore = restore_from(args.from.as_deref()).map_err(|e| anyhow!(e))?;
    let expected_records = expected_records(&args, &input)?;

    // The job master fills in the job id once it knows it (it may adopt a restored one).
    let status = (args.rest.is_some() || args.savepoint_on_exit.is_some())
        .then(|| JobStatus::new(String::new(), graph.name().to_string(), config.describe()));
    let rest = match (&args.rest, &status) {
        (Some(addr), Some(status)) => {
            Some(start_rest(addr, args.rest_token.clone(), status.clone())?)
        }
        _ => None,
    };
    if let (Some(dir), Some(status)) = (&args.savepoint_on_exit, &status) {
        stop_on_signal(dir.clone(), status.clone())?;
    }
    let interactive = std::io::stderr().is_terminal();
    let opts = RunOptions {
        config,
        restore,
        inject: args.inject_failures.map(|count| InjectSpec {
            count,
            seed: args.seed,
            expected_records,
        }),
        on_progress: interactive
            .then(|| Arc::new(progress_line) as Arc<dyn Fn(&Progress) + Send + Sync>),
        inject_target: cairn::runtime::InjectTarget(args.inject_uid.clone()),
        metrics: None,
        status: status.clone(),
        job_id: None,
    };
    let status_for_rest = status;
    let summary = run_job(&graph, opts);
    // The job has ended: stop answering, once the clients waiting for a savepoint got it.
    if let (Some(_), Some(status)) = (&rest, &status_for_rest) {
        let until = std::time::Instant::now() + SAVEPOINT_LINGER;
        while !status.savepoints_reported() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    drop(rest);
    if interactive {
        eprint!("\r\x1b[2K");
    }
    let summary = summary?;
    if summary.started_fresh {
        eprintln!("no completed checkpoint found: started fresh");
    }
    if let Some(from) = &summary.restored_from {
        eprintln!("restored from {from}");
    }
    for sp in &summary.savepoints {
        match &sp.state {
            SavepointState::Completed { location } => eprintln!("savepoint stored in {location}"),
            SavepointState::Failed { cause } => eprintln!("savepoint failed: {cause}"),
            SavepointState::InProgress => {}
        }
    }
    eprintln!("{}", summary_line(&summary));
    if let Some(path) = &args.summary_json {
        std::fs::write(path, summary_json(&summary).to_string())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

/// `--from`: a checkpoint or savepoint path, or `latest`.
fn restore_from(from: Option<&str>) -> std::result::Result<Option<RestoreFrom>, String> {
    match from {
        None => Ok(None),
        Some("latest") => Ok(Some(RestoreFrom::Latest)),
        Some("") => Err("--from needs a checkpoint or savepoint path, or 'latest'".into()),
        Some(p) => Ok(Some(RestoreFrom::Path(PathBuf::from(p)))),
    }
}

/// How long an embedded run keeps its REST API up after the job ended, for a client to fetch
/// the outcome of the savepoint it asked for (a stop-with-savepoint ends the job).
const SAVEPOINT_LINGER: std::time::Duration = std::time::Duration::from_secs(10);

/// `--savepoint-on-exit`: the first Ctrl-C or SIGTERM asks for a stop-with-savepoint, the next
/// one cancels.
fn stop_on_signal(dir: PathBuf, status: Arc<JobStatus>) -> Result<()> {
    let signals = AtomicU32::new(0);
    ctrlc::set_handler(move || {
        if signals.fetch_add(1, Ordering::SeqCst) == 0 {
            eprintln!(
                "stopping with a savepoint under {} (again to cancel)",
                dir.display()
            );
            status.request_savepoint(dir.clone(), SavepointKind::Stop, false);
        } else {
            status.request_cancel();
        }
    })
    .context("cannot install the signal handler for --savepoint-on-exit")
}

/// Parses `--rest`: `HOST:PORT` (an IP address or a name), or a bare `PORT` (or `:PORT`) on
/// 127.0.0.1.
fn rest_addr(text: &str) -> Result<SocketAddr> {
    let t = text.trim();
    let port_only = t.strip_prefix(':').unwrap_or(t);
    if let Ok(port) = port_only.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    if let Ok(addr) = t.parse::<SocketAddr>() {
        return Ok(addr);
    }
    let bad = || anyhow!("--rest expects HOST:PORT or PORT (e.g. 127.0.0.1:8081), got '{text}'");
    t.to_socket_addrs()
        .map_err(|_| bad())?
        .next()
        .ok_or_else(bad)
}

/// Starts the REST API for one job and says where.
fn start_rest(addr: &str, token: Option<String>, status: Arc<JobStatus>) -> Result<RestServer> {
    let addr = rest_addr(addr)?;
    if token.as_deref().is_some_and(|t| t.trim().is_empty()) {
        bail!("--rest-token must not be empty");
    }
    let registry = JobRegistry::new();
    registry.register(status);
    let open = token.is_none() && !addr.ip().is_loopback();
    let server = cairn_rest::serve(addr, registry, token)?;
    eprintln!("REST API listening on http://{}", server.local_addr());
    if open {
        tracing::warn!(
            "the REST API on {addr} has no --rest-token: anyone who can reach it can cancel the job"
        );
    }
    Ok(server)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn submitted(args: &[&str]) -> std::result::Result<BuiltJob, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        BuiltinJobs.build("nexmark", &args)
    }

    #[test]
    fn a_submitted_nexmark_job_plans_failures_among_its_source_records() {
        let built = submitted(&[
            "--query",
            "q3",
            "--events",
            "1000",
            "--inject-failures",
            "2",
            "--seed",
            "7",
            "--discard",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(built.graph.name(), "nexmark-q3");
        let inject = built
            .inject
            .unwrap_or_else(|| panic!("no failures planned"));
        // q3 reads the 20 persons and 60 auctions of 1000 events.
        assert_eq!(
            (inject.count, inject.seed, inject.expected_records),
            (2, 7, 80)
        );
        let built = submitted(&[
            "--query",
            "q0",
            "--events",
            "1000",
            "--inject-failures",
            "1",
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(built.inject.map(|i| i.expected_records), Some(1000));
    }

    #[test]
    fn a_submitted_nexmark_job_with_bad_flags_is_refused() {
        let refused = |args: &[&str]| submitted(args).err().unwrap_or_default();
        assert_eq!(
            refused(&["--query", "q9", "--events", "5"]),
            "nexmark query 'q9' is not available yet; available queries: q0, q1, q2, q3, q4, q5, q7, q8, q11, q12"
        );
        assert_eq!(refused(&["--query", "q1"]), "nexmark needs --events N");
    }
}
