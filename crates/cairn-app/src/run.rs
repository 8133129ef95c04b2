//! `run JOB`: a registered job in this process (embedded mode), and the options every run or
//! submission of a job takes besides the job's own parameters.

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context, Result};
use cairn::config::{keys, JobConfig};
use cairn::runtime::task::JobMetrics;
use cairn::runtime::{
    run_job, InjectSpec, JobError, JobStatus, JobSummary, Progress, RestoreFrom, RunOptions,
    SavepointKind, SavepointState,
};
use cairn_rest::{JobRegistry, RestServer};
use clap::Args;
use nix::sys::signal::{SigSet, Signal};
use serde_json::Value;

use crate::human;
use crate::job::{AnyJob, JobContext};

/// How to run a job, embedded or on a coordinator: what `run JOB` and `submit JOB` take
/// besides the job's own parameters.
#[derive(Args, Debug, Clone, Default)]
pub struct JobOptions {
    /// Default parallelism of every operator (parallelism.default) [default: 1].
    #[arg(long, short = 'p', value_name = "N")]
    pub parallelism: Option<u32>,
    /// Checkpoint interval, e.g. 500ms, 10s, 1min; 0 disables checkpointing (execution.checkpointing.interval) [default: off; 1s with --checkpoint-dir].
    #[arg(long, value_name = "DURATION")]
    pub checkpoint_interval: Option<String>,
    /// Checkpointing mode (execution.checkpointing.mode) [default: exactly-once].
    #[arg(long, value_name = "MODE", ignore_case = true, value_parser = mode_values())]
    pub mode: Option<String>,
    /// Unaligned checkpoints: barriers overtake in-flight data, which is persisted (execution.checkpointing.unaligned.enabled).
    #[arg(long)]
    pub unaligned: bool,
    /// Start checkpoints aligned and switch to unaligned after this long, e.g. 200ms (execution.checkpointing.aligned-checkpoint-timeout; implies --unaligned).
    #[arg(long, value_name = "DURATION")]
    pub aligned_checkpoint_timeout: Option<String>,
    /// Checkpoints in flight at once (execution.checkpointing.max-concurrent-checkpoints).
    #[arg(long, value_name = "N")]
    pub max_concurrent_checkpoints: Option<u32>,
    /// Start from a checkpoint: a chk-<n> directory (or its _metadata), or `latest`: the newest completed checkpoint under --checkpoint-dir (of the job --job names; on a coordinator, of the one job of this name with checkpoints).
    #[arg(long, value_name = "PATH|latest")]
    pub from: Option<String>,
    /// With --from latest: the id of the job whose latest checkpoint to start from.
    #[arg(long = "job", value_name = "JOB_ID", requires = "from")]
    pub from_job: Option<String>,
    /// YAML configuration file with Flink's keys.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set a configuration key, e.g. -D restart-strategy.type=fixed-delay (repeatable).
    #[arg(short = 'D', value_name = "KEY=VALUE")]
    pub define: Vec<String>,
    /// Inject N failures at random records of random subtasks (recovered by the restart strategy).
    #[arg(long, value_name = "N")]
    pub inject_failures: Option<usize>,
    /// Inject failures only into tasks whose head operator uid starts with this.
    #[arg(long, value_name = "UID_PREFIX", requires = "inject_failures")]
    pub inject_uid: Option<String>,
    /// The run's seed: of --inject-failures, and of jobs that generate their data (nexmark's events).
    #[arg(long, value_name = "S", default_value_t = 0)]
    pub seed: u64,
    /// Start from a savepoint or checkpoint that holds state of operators this job does not have; that state is dropped (execution.state-recovery.ignore-unclaimed-state).
    #[arg(long, requires = "from")]
    pub allow_non_restored_state: bool,
}

/// The values `--mode` takes; Flink's spellings of the key (`EXACTLY_ONCE`) are accepted too.
fn mode_values() -> clap::builder::PossibleValuesParser {
    use clap::builder::PossibleValue;
    clap::builder::PossibleValuesParser::new([
        PossibleValue::new("exactly-once").aliases(["exactly_once"]),
        PossibleValue::new("at-least-once").aliases(["at_least_once"]),
    ])
}

/// `run JOB`: the job options and what only a run in this process takes.
#[derive(Args, Debug, Clone, Default)]
pub struct RunArgs {
    #[command(flatten)]
    pub job: JobOptions,
    /// Checkpoint directory (state.checkpoints.dir). Enables 1s checkpoints unless an interval is set.
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,
    /// Write the run's summary as JSON to this file (for scripts and benchmarks).
    #[arg(long, value_name = "FILE")]
    pub summary_json: Option<PathBuf>,
    /// Serve Flink's REST API (jobs, checkpoints, cancel) while the job runs: HOST:PORT, or PORT on 127.0.0.1.
    #[arg(long, value_name = "ADDR")]
    pub rest: Option<String>,
    /// On Ctrl-C or SIGTERM, stop with a savepoint under DIR (a second signal cancels): sources
    /// stop, the savepoint is taken, sinks commit everything before it, and the job ends
    /// FINISHED; `--from` the printed path continues exactly once.
    #[arg(long, value_name = "DIR")]
    pub savepoint_on_exit: Option<PathBuf>,
    /// Require `Authorization: Bearer TOKEN` on every REST request.
    #[arg(long, value_name = "TOKEN", requires = "rest")]
    pub rest_token: Option<String>,
}

impl JobOptions {
    /// The configuration keys the flags and `-D` set, in the order they apply (after the
    /// `--config` file).
    pub fn config_pairs(&self) -> Result<Vec<(String, String)>> {
        let mut pairs: Vec<(String, String)> = Vec::new();
        for d in &self.define {
            let (k, v) = d
                .split_once('=')
                .filter(|(k, _)| !k.trim().is_empty())
                .ok_or_else(|| anyhow!("-D expects KEY=VALUE, got '{d}'"))?;
            pairs.push((k.trim().to_string(), v.trim().to_string()));
        }
        if let Some(p) = self.parallelism {
            pairs.push((keys::PARALLELISM.into(), p.to_string()));
        }
        if let Some(i) = &self.checkpoint_interval {
            pairs.push((keys::CHECKPOINT_INTERVAL.into(), i.clone()));
        }
        if let Some(m) = &self.mode {
            pairs.push((keys::CHECKPOINTING_MODE.into(), m.clone()));
        }
        if self.unaligned || self.aligned_checkpoint_timeout.is_some() {
            pairs.push((keys::UNALIGNED_ENABLED.into(), "true".into()));
        }
        if let Some(t) = &self.aligned_checkpoint_timeout {
            pairs.push((keys::ALIGNED_CHECKPOINT_TIMEOUT.into(), t.clone()));
        }
        if let Some(n) = self.max_concurrent_checkpoints {
            pairs.push((keys::MAX_CONCURRENT_CHECKPOINTS.into(), n.to_string()));
        }
        if self.allow_non_restored_state {
            pairs.push((keys::IGNORE_UNCLAIMED_STATE.into(), "true".into()));
        }
        Ok(pairs)
    }

    /// Sets `pairs` ahead of `-D` and the flags (which win over them).
    pub(crate) fn set_first(&mut self, pairs: Vec<(String, String)>) {
        let mut define: Vec<String> = pairs.into_iter().map(|(k, v)| format!("{k}={v}")).collect();
        define.append(&mut self.define);
        self.define = define;
    }

    /// Whether a flag, `-D` or a configuration file sets the checkpoint interval.
    fn interval_given(&self) -> bool {
        self.checkpoint_interval.is_some()
            || self
                .define
                .iter()
                .any(|d| d.starts_with(keys::CHECKPOINT_INTERVAL))
            || self.config.is_some()
    }
}

/// Builds the configuration: defaults, then the file, then -D, then the dedicated flags.
pub fn build_config(options: &JobOptions, checkpoint_dir: Option<&Path>) -> Result<JobConfig> {
    let mut config = match &options.config {
        Some(path) => JobConfig::from_file(path)?,
        None => JobConfig::default(),
    };
    let mut pairs = options.config_pairs()?;
    if let Some(d) = checkpoint_dir {
        pairs.push((keys::CHECKPOINTS_DIR.into(), d.display().to_string()));
    }
    config.set_all(pairs)?;
    // `--checkpoint-dir` alone means "checkpoint there": every 1s, unless an interval is set by
    // a flag, by -D, or by a configuration file (which is then authoritative, as in Flink).
    if checkpoint_dir.is_some() && !options.interval_given() {
        config.set(keys::CHECKPOINT_INTERVAL, "1s")?;
    }
    config.validate()?;
    Ok(config)
}

/// The warning Flink gives too: a checkpoint directory without a checkpoint interval takes
/// no checkpoints.
pub(crate) fn checkpointing_off_warning(config: &JobConfig) -> Option<String> {
    (config.checkpoints_dir.is_some() && !config.checkpointing_enabled()).then(|| {
        format!(
            "warning: {} is set but checkpointing is off: set {} (or --checkpoint-interval) to take checkpoints",
            keys::CHECKPOINTS_DIR,
            keys::CHECKPOINT_INTERVAL
        )
    })
}

fn progress_line(p: &Progress) {
    let secs = p.elapsed.as_secs_f64().max(1e-9);
    let mut line = format!(
        "{} records read by the sources ({}/s), {} checkpoints",
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
        "{} finished in {:.2}s: {} records read by the sources ({} records/s)",
        s.job_name,
        secs,
        s.records,
        human::count(s.records as f64 / secs)
    );
    line.push_str(&format!(
        ", {} checkpoints completed",
        s.checkpoints_completed
    ));
    if let Some(last) = s.checkpoints.last() {
        let durations: Vec<u64> = s.checkpoints.iter().map(|c| c.duration_ms).collect();
        let max = durations.iter().copied().max().unwrap_or(0);
        // A long run keeps only its newest checkpoints' statistics.
        let of = if (s.checkpoints.len() as u64) < s.checkpoints_completed {
            format!("of the last {}: ", s.checkpoints.len())
        } else {
            String::new()
        };
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
            " ({of}duration median {} ms, max {max} ms; alignment median {} ms, max {} ms; sync max {} ms; async max {} ms; {unaligned} unaligned, in-flight data max {}; last #{}: {})",
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
        "checkpoints_completed": s.checkpoints_completed,
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

/// `run JOB`: builds the job from its parameters and runs it in this process. `argv` is the
/// whole command line, for the command that resumes a run stopped by a signal.
pub(crate) fn run(
    job: &dyn AnyJob,
    params: &Value,
    mut args: RunArgs,
    argv: &[OsString],
) -> Result<ExitCode> {
    let ctx = JobContext {
        seed: args.job.seed,
    };
    let graph = job.build(params, &ctx).map_err(|e| anyhow!(e))?;
    args.job
        .set_first(job.config(params).map_err(|e| anyhow!(e))?);
    let config = build_config(&args.job, args.checkpoint_dir.as_deref())?;
    if let Some(warning) = checkpointing_off_warning(&config) {
        eprintln!("{warning}");
    }
    let restore = restore_from(args.job.from.as_deref(), args.job.from_job.as_deref())
        .map_err(|e| anyhow!(e))?;
    let inject = match args.job.inject_failures {
        Some(count) => Some(InjectSpec {
            count,
            seed: args.job.seed,
            expected_records: expected_records(job, params, &ctx)?,
        }),
        None => None,
    };

    // The job master fills in the job id once it knows it (it may adopt a restored one).
    let status = JobStatus::new(String::new(), graph.name().to_string(), config.describe());
    // Before any thread starts, so that every thread inherits the blocked signals.
    let signal = on_signals(args.savepoint_on_exit.clone(), status.clone())?;
    let rest = match &args.rest {
        Some(addr) => Some(start_rest(addr, args.rest_token.clone(), status.clone())?),
        None => None,
    };
    if let Some(server) = &rest {
        announce_job_id(status.clone(), server.local_addr());
    }
    let interactive = std::io::stderr().is_terminal();
    let retained_on_cancel = config.retain_on_cancellation;
    let metrics = Arc::new(JobMetrics::default());
    let opts = RunOptions {
        config,
        restore,
        inject,
        on_progress: interactive
            .then(|| Arc::new(progress_line) as Arc<dyn Fn(&Progress) + Send + Sync>),
        inject_target: cairn::runtime::InjectTarget(args.job.inject_uid.clone()),
        metrics: Some(metrics.clone()),
        status: Some(status.clone()),
        job_id: None,
        fence: None,
    };
    let started = std::time::Instant::now();
    let summary = run_job(&graph, opts);
    // The job has ended: stop answering, once the clients waiting for a savepoint got it.
    if rest.is_some() {
        let until = std::time::Instant::now() + SAVEPOINT_LINGER;
        while !status.savepoints_reported() && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
    drop(rest);
    if interactive {
        eprint!("\r\x1b[2K");
    }
    let summary = match summary {
        Ok(summary) => summary,
        Err(JobError::Canceled) => {
            let signal = signal.load(Ordering::SeqCst);
            eprintln!(
                "{}",
                canceled_line(graph.name(), &status, &metrics, started, signal)
            );
            if let Some(hint) = resume_hint(&status, retained_on_cancel, argv) {
                eprintln!("{hint}");
            }
            if signal > 0 {
                return Ok(ExitCode::from(u8::try_from(128 + signal).unwrap_or(1)));
            }
            bail!("job cancelled");
        }
        Err(e) => return Err(e.into()),
    };
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
    Ok(ExitCode::SUCCESS)
}

/// The summary of a cancelled run: what the job had read and checkpointed when it stopped.
fn canceled_line(
    name: &str,
    status: &JobStatus,
    metrics: &JobMetrics,
    started: std::time::Instant,
    signal: i32,
) -> String {
    let view = status.view();
    let by = match signal {
        0 => String::new(),
        s => format!(" by {}", signal_name(s)),
    };
    let mut line = format!(
        "{name} canceled{by} after {:.2}s: {} records read by the sources, {} checkpoints completed",
        started.elapsed().as_secs_f64(),
        metrics.records.load(Ordering::Relaxed),
        view.checkpoint_counts.completed
    );
    if let Some(last) = view
        .checkpoint_history
        .iter()
        .map(|c| c.checkpoint_id)
        .max()
    {
        line.push_str(&format!(" (last #{last})"));
    }
    line.push_str(&format!(", {} restarts", view.restarts));
    line
}

/// `resume with: …`: the command line that ran the job, with `--from latest`, if the job
/// completed a checkpoint and cancelling it kept its checkpoints; if cancelling deleted them,
/// how to keep them.
fn resume_hint(status: &JobStatus, retained: bool, argv: &[OsString]) -> Option<String> {
    if status.view().checkpoint_counts.completed == 0 {
        return None;
    }
    if !retained {
        return Some(format!(
            "the job's checkpoints were deleted as it was cancelled ({} is DELETE_ON_CANCELLATION); to resume a cancelled run, run it with -D {}=RETAIN_ON_CANCELLATION, or with --savepoint-on-exit DIR",
            keys::CHECKPOINT_RETENTION,
            keys::CHECKPOINT_RETENTION
        ));
    }
    let mut words = Vec::new();
    let mut args = argv.iter().map(|a| a.to_string_lossy());
    while let Some(arg) = args.next() {
        if arg == "--from" {
            args.next();
        } else if !arg.starts_with("--from=") {
            words.push(shell_word(&arg));
        }
    }
    words.extend(["--from".to_string(), "latest".to_string()]);
    Some(format!("resume with: {}", words.join(" ")))
}

/// `word` as a shell reads it back: quoted unless it is plain.
fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

fn signal_name(signal: i32) -> String {
    match Signal::try_from(signal) {
        Ok(s) => s.as_str().to_string(),
        Err(_) => format!("signal {signal}"),
    }
}

/// `run --rest`: prints the job's id and where the REST API shows it, once the job master
/// chose the id (a restored job keeps its own).
fn announce_job_id(status: Arc<JobStatus>, addr: SocketAddr) {
    let spawned = std::thread::Builder::new()
        .name("job-id".into())
        .spawn(move || loop {
            let view = status.view();
            if !view.jid.is_empty() {
                eprintln!("job {} at http://{addr}/jobs/{}", view.jid, view.jid);
                return;
            }
            if view.state.is_terminal() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the thread that prints the job id: {e}");
    }
}

/// The records the job's sources read in a run without failures, among which
/// `--inject-failures` plans its failures.
pub(crate) fn expected_records(job: &dyn AnyJob, params: &Value, ctx: &JobContext) -> Result<u64> {
    job.source_records(params, ctx)
        .map_err(|e| anyhow!(e))?
        .ok_or_else(|| {
            anyhow!(
                "--inject-failures plans failures among a known number of records, and job '{}' does not say how many its sources read with these parameters",
                job.name()
            )
        })
}

/// `--from`: a checkpoint or savepoint path, or `latest` (of the job `--job` names).
fn restore_from(
    from: Option<&str>,
    job: Option<&str>,
) -> std::result::Result<Option<RestoreFrom>, String> {
    if job.is_some() && from != Some("latest") {
        return Err(
            "--job names whose checkpoints --from latest looks at; it takes no other --from".into(),
        );
    }
    match from {
        None => Ok(None),
        Some("latest") => Ok(Some(match job {
            Some(id) => RestoreFrom::LatestOf(id.to_string()),
            None => RestoreFrom::Latest,
        })),
        Some("") => Err("--from needs a checkpoint or savepoint path, or 'latest'".into()),
        Some(p) => Ok(Some(RestoreFrom::Path(PathBuf::from(p)))),
    }
}

/// How long an embedded run keeps its REST API up after the job ended, for a client to fetch
/// the outcome of the savepoint it asked for (a stop-with-savepoint ends the job).
const SAVEPOINT_LINGER: std::time::Duration = std::time::Duration::from_secs(10);

/// Ctrl-C (SIGINT) and SIGTERM: the first one cancels the job, or with `--savepoint-on-exit`
/// stops it with a savepoint (and the next one cancels); one more ends the process at once.
/// Returns the first signal's number once one came (0 before).
///
/// The signals are blocked in this thread, and so in every thread it starts later, and one
/// thread takes them with `sigwait`: it knows which came, for the exit code (128 + number).
fn on_signals(savepoint_dir: Option<PathBuf>, status: Arc<JobStatus>) -> Result<Arc<AtomicI32>> {
    let mut set = SigSet::empty();
    set.add(Signal::SIGINT);
    set.add(Signal::SIGTERM);
    set.thread_block()
        .context("cannot block SIGINT and SIGTERM for their handler")?;
    let first = Arc::new(AtomicI32::new(0));
    let seen = first.clone();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut count = 0u32;
            while let Ok(signal) = set.wait() {
                count += 1;
                let _ = seen.compare_exchange(0, signal as i32, Ordering::SeqCst, Ordering::SeqCst);
                match (&savepoint_dir, count) {
                    (Some(dir), 1) => {
                        eprintln!(
                            "stopping with a savepoint under {} (again to cancel)",
                            dir.display()
                        );
                        status.request_savepoint(dir.clone(), SavepointKind::Stop, false);
                    }
                    (Some(_), 2) | (None, 1) => {
                        eprintln!("cancelling the job (again to exit at once)");
                        status.request_cancel();
                    }
                    _ => std::process::exit(128 + signal as i32),
                }
            }
        })
        .context("cannot start the signal handler thread")?;
    Ok(first)
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
