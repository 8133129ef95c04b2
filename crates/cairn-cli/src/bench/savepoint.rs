//! `cairn bench --suite savepoint`: a checkpoint and a savepoint of the same keyed state, and
//! a stop-with-savepoint, in one embedded wordcount run per key count.
//!
//! The job reads generated words with one source subtask, so once it has read `keys` records
//! every key has state (record i is key `(i * 7919) mod keys`, and 7919 is prime). From then
//! on the state no longer grows, whatever the job reads next: the first periodic checkpoint
//! triggered after that point is measured (trigger → complete from its `_metadata`, bytes of
//! its files), then an intermediate savepoint (trigger, from its `_metadata`, → its outcome
//! in the job's status; bytes of its directory, which holds copies of the state files), then
//! the time from a stop-with-savepoint request to the job being FINISHED.
//!
//! Checkpoints come every second with a minimum pause of a second after any completion, so a
//! savepoint or a stop requested right after a completion is triggered at once rather than
//! queued behind a periodic checkpoint: each measurement is of one snapshot alone.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use cairn::api::JobGraph;
use cairn::checkpoint::{now_ms, CheckpointMetadata};
use cairn::config::{keys, JobConfig};
use cairn::jobs::wordcount::{self, WordInput, WordOutput};
use cairn::runtime::task::JobMetrics;
use cairn::runtime::{
    run_job, JobError, JobState, JobStatus, JobSummary, RunOptions, SavepointKind, SavepointState,
};
use cairn::storage::format::{decode, FileKind};
use cairn::storage::layout::{checkpoint_dir, METADATA_FILE};

use super::BenchArgs;

/// Key counts compared when `--keys` is not given.
const DEFAULT_KEYS: [u64; 2] = [100_000, 10_000_000];
const CHECKPOINT_INTERVAL: &str = "1s";
const CHECKPOINT_MIN_PAUSE: &str = "1s";
/// The generator's stride: record i is key `(i * GENERATOR_STRIDE) mod keys` (a prime).
const GENERATOR_STRIDE: u64 = 7919;
/// How long any one condition may take to hold (reading 10M keys takes tens of seconds).
const WAIT_MAX: Duration = Duration::from_secs(600);
/// How often conditions are checked; also the resolution of the savepoint and stop times.
const POLL: Duration = Duration::from_millis(1);

/// One key count's measurements.
struct Row {
    keys: u64,
    checkpoint_ms: u64,
    checkpoint_bytes: u64,
    savepoint_ms: u64,
    savepoint_bytes: u64,
    stop_ms: u64,
}

pub(super) fn run(args: &BenchArgs, scratch: &Path) -> Result<()> {
    let key_counts = if args.keys.is_empty() {
        DEFAULT_KEYS.to_vec()
    } else {
        args.keys.clone()
    };
    // Unbounded unless --records says otherwise: the benchmark ends the job itself.
    let records = args.records.unwrap_or(u64::MAX);
    for &keys in &key_counts {
        if keys == 0 || keys % GENERATOR_STRIDE == 0 {
            bail!(
                "--keys {keys}: every key count must be positive and not a multiple of {GENERATOR_STRIDE}, or the generated words never reach every key"
            );
        }
        if records < keys {
            bail!("--records {records} is less than --keys {keys}: some keys would have no state");
        }
    }
    let generate = match args.records {
        Some(n) => format!("--generate {n}"),
        None => "generated words until stopped".to_string(),
    };
    println!(
        "wordcount, {generate}, --discard, p=1, heap state, filesystem checkpoint storage; checkpoints every {CHECKPOINT_INTERVAL} (min pause {CHECKPOINT_MIN_PAUSE}); measured once every key has state, one embedded run per key count"
    );
    println!(
        "{:>10}  {:>13}  {:>16}  {:>12}  {:>15}  {:>8}  {:>11}  {:>17}",
        "keys",
        "checkpoint ms",
        "checkpoint bytes",
        "savepoint ms",
        "savepoint bytes",
        "sp/cp ms",
        "sp/cp bytes",
        "stop->FINISHED ms"
    );
    for &keys in &key_counts {
        let dir = scratch.join(format!("savepoint-{keys}"));
        let row = measure(keys, records, &dir);
        let _ = std::fs::remove_dir_all(&dir);
        let r = row?;
        println!(
            "{:>10}  {:>13}  {:>16}  {:>12}  {:>15}  {:>8.2}  {:>11.3}  {:>17}",
            r.keys,
            r.checkpoint_ms,
            r.checkpoint_bytes,
            r.savepoint_ms,
            r.savepoint_bytes,
            r.savepoint_ms as f64 / r.checkpoint_ms.max(1) as f64,
            r.savepoint_bytes as f64 / r.checkpoint_bytes.max(1) as f64,
            r.stop_ms
        );
    }
    Ok(())
}

/// One run over `key_count` distinct words, with its checkpoints and savepoints under `dir`.
fn measure(key_count: u64, records: u64, dir: &Path) -> Result<Row> {
    let graph = wordcount::build(
        &WordInput::Generate {
            count: records,
            keys: key_count,
        },
        0,
        &WordOutput::Discard,
    )
    .map_err(|e| anyhow!(e))?;
    let checkpoints = dir.join("checkpoints");
    let mut config = JobConfig::default();
    config.set_all([
        (keys::PARALLELISM, "1".to_string()),
        (keys::CHECKPOINTS_DIR, checkpoints.display().to_string()),
        (keys::CHECKPOINT_INTERVAL, CHECKPOINT_INTERVAL.to_string()),
        (keys::MIN_PAUSE, CHECKPOINT_MIN_PAUSE.to_string()),
    ])?;
    let mut job = EmbeddedJob::start(graph, config)?;

    job.wait("every key to be read", |_, metrics| {
        (metrics.records.load(Ordering::Relaxed) >= key_count).then_some(())
    })?;
    let every_key_ms = now_ms();

    let mut recorded = 0;
    let checkpoint = job.wait("a checkpoint of every key", |status, _| {
        // The history is only read when the job master recorded another checkpoint.
        let n = status.view_completed_count();
        if n == recorded {
            return None;
        }
        recorded = n;
        status
            .view()
            .checkpoint_history
            .into_iter()
            .find(|m| m.trigger_timestamp_ms > every_key_ms)
    })?;
    // Retention deletes it only once the next checkpoint completes, a minimum pause later.
    let checkpoint_bytes =
        dir_bytes(&checkpoints.join(checkpoint_dir(&checkpoint.job_id, checkpoint.checkpoint_id)))?;

    let request =
        job.status
            .request_savepoint(dir.join("savepoints"), SavepointKind::Intermediate, false);
    let outcome = job.wait("the savepoint", |status, _| {
        let view = status.view();
        match view
            .savepoints
            .into_iter()
            .find(|s| s.request_id == request)?
            .state
        {
            SavepointState::InProgress => None,
            SavepointState::Completed { location } => Some(Ok(location)),
            SavepointState::Failed { cause } => Some(Err(cause)),
        }
    })?;
    let completed_ms = now_ms();
    let location = outcome.map_err(|cause| anyhow!("the savepoint failed: {cause}"))?;
    let savepoint = Path::new(&location);
    let meta = read_metadata(&savepoint.join(METADATA_FILE))?;
    let savepoint_bytes = dir_bytes(savepoint)?;

    let stop_requested = Instant::now();
    job.status
        .request_savepoint(dir.join("stop"), SavepointKind::Stop, false);
    job.wait("the job to finish after the stop", |status, _| {
        (status.view().state == JobState::Finished).then_some(())
    })?;
    let stop_ms = stop_requested.elapsed().as_millis() as u64;
    let summary = job.join()?;
    for sp in &summary.savepoints {
        if let SavepointState::Failed { cause } = &sp.state {
            bail!("a savepoint failed: {cause}");
        }
    }
    Ok(Row {
        keys: key_count,
        checkpoint_ms: checkpoint.duration_ms(),
        checkpoint_bytes,
        savepoint_ms: completed_ms.saturating_sub(meta.trigger_timestamp_ms),
        savepoint_bytes,
        stop_ms,
    })
}

/// A job running on a thread of this process; cancelled and joined if dropped before it ended.
struct EmbeddedJob {
    status: Arc<JobStatus>,
    metrics: Arc<JobMetrics>,
    thread: Option<JoinHandle<Result<JobSummary, JobError>>>,
}

impl EmbeddedJob {
    fn start(graph: JobGraph, config: JobConfig) -> Result<EmbeddedJob> {
        let status = JobStatus::new(String::new(), graph.name().to_string(), config.describe());
        let metrics = Arc::new(JobMetrics::default());
        let opts = RunOptions {
            config,
            metrics: Some(metrics.clone()),
            status: Some(status.clone()),
            ..RunOptions::default()
        };
        let thread = std::thread::Builder::new()
            .name("bench-job".into())
            .spawn(move || run_job(&graph, opts))
            .context("cannot start the job's thread")?;
        Ok(EmbeddedJob {
            status,
            metrics,
            thread: Some(thread),
        })
    }

    /// Polls `condition` until it holds; fails if the job ends first or `WAIT_MAX` passes.
    fn wait<T>(
        &mut self,
        what: &str,
        mut condition: impl FnMut(&JobStatus, &JobMetrics) -> Option<T>,
    ) -> Result<T> {
        let deadline = Instant::now() + WAIT_MAX;
        loop {
            // Whether the job had ended before the check: then the check saw its last state.
            let ended = self.thread.as_ref().is_none_or(|t| t.is_finished());
            if let Some(v) = condition(&self.status, &self.metrics) {
                return Ok(v);
            }
            if ended {
                return Err(match self.thread.take().map(JoinHandle::join) {
                    Some(Ok(Ok(summary))) => anyhow!(
                        "the job finished after {} records, before {what}: give --records more",
                        summary.records
                    ),
                    Some(Ok(Err(e))) => anyhow!("the job failed before {what}: {e}"),
                    Some(Err(_)) => anyhow!("the job's thread panicked before {what}"),
                    None => anyhow!("the job was already joined before {what}"),
                });
            }
            if Instant::now() > deadline {
                bail!("timed out after {WAIT_MAX:?} waiting for {what}");
            }
            std::thread::park_timeout(POLL);
        }
    }

    /// Waits for the job's end; its summary.
    fn join(mut self) -> Result<JobSummary> {
        let thread = self
            .thread
            .take()
            .ok_or_else(|| anyhow!("the job was already joined"))?;
        thread
            .join()
            .map_err(|_| anyhow!("the job's thread panicked"))?
            .map_err(|e| anyhow!("the job failed: {e}"))
    }
}

impl Drop for EmbeddedJob {
    fn drop(&mut self) {
        if let Some(thread) = self.thread.take() {
            self.status.request_cancel();
            let _ = thread.join();
        }
    }
}

/// A checkpoint's or savepoint's `_metadata`.
fn read_metadata(path: &Path) -> Result<CheckpointMetadata> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    decode(FileKind::Metadata, &bytes).with_context(|| format!("cannot decode {}", path.display()))
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let entry = entry.with_context(|| format!("cannot list {}", dir.display()))?;
        let meta = entry
            .metadata()
            .with_context(|| format!("cannot stat {}", entry.path().display()))?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
