//! `cairn run JOB`: a built-in job in this process.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use cairn::config::{keys, JobConfig};
use cairn::jobs::wordcount::{self, WordInput, WordOutput};
use cairn::runtime::{run_job, InjectSpec, JobSummary, Progress, RestoreFrom, RunOptions};
use clap::Args;

use crate::human;

/// Built-in jobs.
const JOBS: &[&str] = &["wordcount"];

#[derive(Args, Debug)]
pub struct RunArgs {
    /// The built-in job to run: wordcount.
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
    /// Output directory for the exactly-once file sink (committed files never start with '.' or '_').
    #[arg(long, value_name = "DIR", conflicts_with = "discard")]
    output: Option<PathBuf>,
    /// Discard the output (benchmarks).
    #[arg(long)]
    discard: bool,
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
    /// Seed for --inject-failures.
    #[arg(long, value_name = "S", default_value_t = 0)]
    seed: u64,
    /// Write the run's summary as JSON to this file (for scripts and benchmarks).
    #[arg(long, value_name = "FILE")]
    summary_json: Option<PathBuf>,
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
        line.push_str(&format!(
            " (duration median {} ms, max {max} ms; last #{}: {})",
            median(durations),
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

fn summary_json(s: &JobSummary) -> serde_json::Value {
    serde_json::json!({
        "job_id": s.job_id,
        "job_name": s.job_name,
        "elapsed_ms": s.elapsed.as_millis() as u64,
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
        })).collect::<Vec<_>>(),
    })
}

pub fn run(args: RunArgs) -> Result<()> {
    if !JOBS.contains(&args.job.as_str()) {
        bail!(
            "unknown job '{}'; built-in jobs: {}",
            args.job,
            JOBS.join(", ")
        );
    }
    let config = build_config(&args)?;
    let input = match (&args.input, args.generate) {
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
        _ => bail!("wordcount needs --input FILE or --generate N"),
    };
    let output = match (&args.output, args.discard) {
        (Some(dir), false) => WordOutput::Dir(dir.clone()),
        (None, true) => WordOutput::Discard,
        _ => WordOutput::Print,
    };
    let restore = match args.from.as_deref() {
        None => None,
        Some("latest") => Some(RestoreFrom::Latest),
        Some("") => bail!("--from needs a checkpoint path or 'latest'"),
        Some(p) => Some(RestoreFrom::Path(PathBuf::from(p))),
    };
    let expected_records = match &input {
        WordInput::Generate { count, .. } => *count,
        WordInput::File(p) => std::fs::metadata(p).map(|m| m.len() / 6).unwrap_or(1),
    };
    let graph = wordcount::build(&input, &output).map_err(|e| anyhow!(e))?;
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
        metrics: None,
        status: None,
    };
    let summary = run_job(&graph, opts);
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
    eprintln!("{}", summary_line(&summary));
    if let Some(path) = &args.summary_json {
        std::fs::write(path, summary_json(&summary).to_string())
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}
