//! Running a job: options, the choice of the checkpoint to start from, the checkpoint
//! coordinator's settings, and the summary. Planning is in `plan`, deployment in `deploy`, the
//! job master's event loop in `master`.

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::deploy::{barrier_kind, Deployer};
pub use super::deploy::{
    deploy, DataLinks, DeployRequest, Deployed, DeployedTask, Deployment, Executor, LocalExecutor,
    Placement,
};
use super::graph::JobGraph;
use super::inject::FailureInjector;
use super::master::{JobMaster, MasterSetup};
pub use super::plan::{plan, Plan, TaskDescription};
use super::restart::RestartTracker;
use super::status::{Actor, JobState, JobStatus};
use super::task::{JobEvent, JobMetrics};
use crate::checkpoint::coordinator::{CheckpointSettings, CompletedCheckpoint};
use crate::checkpoint::restore::checkpoint_ids;
use crate::checkpoint::{
    find_latest, find_latest_of, load_from_path, unfinished_job, CheckpointCoordinator,
    LoadedCheckpoint,
};
use crate::config::{CheckpointingMode, FailoverStrategy, JobConfig};
use crate::storage::{CheckpointStorage, FencedStorage, FsStorage, MemoryStorage};

/// Where a run starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreFrom {
    /// The newest usable checkpoint under the checkpoint directory (fresh if there is none).
    Latest,
    /// The newest completed checkpoint of job `0` under the checkpoint directory.
    LatestOf(String),
    /// A checkpoint directory (`.../<job-id>/chk-<n>`) or its `_metadata`.
    Path(PathBuf),
    /// Job `job_id` again (a restarted coordinator resuming its jobs): from its own newest
    /// completed checkpoint, or — when it completed none — from where it was first started.
    Resume {
        /// The job's id; only its checkpoints are candidates.
        job_id: String,
        /// Where the job was first started from (its `--from`), if anywhere.
        otherwise: Option<Box<RestoreFrom>>,
    },
}

/// Planned failures.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct InjectSpec {
    /// Number of failures.
    pub count: usize,
    /// Seed choosing tasks and records.
    pub seed: u64,
    /// Records each task vertex is expected to see (bounds the chosen record numbers).
    pub expected_records: u64,
}

/// Fail only tasks whose head operator uid starts with this (None: any task).
#[derive(Debug, Clone, Default)]
pub struct InjectTarget(pub Option<String>);

/// A callback receiving progress.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// How to run a job.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Configuration.
    pub config: JobConfig,
    /// Start from a checkpoint.
    pub restore: Option<RestoreFrom>,
    /// Failures to inject.
    pub inject: Option<InjectSpec>,
    /// Which tasks failures are injected into.
    pub inject_target: InjectTarget,
    /// Called about once a second with the progress so far.
    pub on_progress: Option<ProgressFn>,
    /// Shared counters (created if None).
    pub metrics: Option<Arc<JobMetrics>>,
    /// Shared live status (created if None); observers read it and may request a cancel.
    pub status: Option<Arc<JobStatus>>,
    /// The job id to use (a new random one if None; a restored checkpoint's when claimed).
    pub job_id: Option<String>,
    /// Asked before every change the job master makes to the checkpoint storage (a
    /// coordinator's leadership): once it refuses, no checkpoint completes or is deleted.
    pub fence: Option<Arc<dyn crate::storage::Fence>>,
}

/// Progress of a running job.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Time since the start.
    pub elapsed: Duration,
    /// Records read by sources, replays included.
    pub records: u64,
    /// Checkpoints completed.
    pub checkpoints: usize,
    /// The last completed checkpoint.
    pub last_checkpoint: Option<(u64, u64, u64)>,
    /// Restarts so far.
    pub restarts: u32,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct JobSummary {
    /// Job id (the checkpoint directory name).
    pub job_id: String,
    /// Job name.
    pub job_name: String,
    /// Wall time.
    pub elapsed: Duration,
    /// Records read by sources, replays included.
    pub records: u64,
    /// The newest completed checkpoints (at least the last
    /// [`COMPLETED_KEPT`](crate::checkpoint::coordinator::COMPLETED_KEPT)), oldest first.
    pub checkpoints: Vec<CompletedCheckpoint>,
    /// How many checkpoints completed.
    pub checkpoints_completed: u64,
    /// Failed checkpoints.
    pub failed_checkpoints: u64,
    /// Restarts after failures.
    pub restarts: u32,
    /// Failures injected (fired, planned).
    pub injected: Option<(usize, usize)>,
    /// The checkpoint the run started from, if any (location).
    pub restored_from: Option<String>,
    /// `--from latest` found nothing to restore.
    pub started_fresh: bool,
    /// The savepoint requests of the run and how they ended.
    pub savepoints: Vec<super::status::SavepointStatus>,
}

/// Why a job did not finish.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job cannot start (bad graph, bad configuration, unusable input).
    #[error("{0}")]
    Setup(String),
    /// No usable checkpoint to restore from.
    #[error("{0}")]
    Restore(String),
    /// The job was cancelled.
    #[error("job cancelled")]
    Canceled,
    /// The job failed and the restart strategy gave up.
    #[error("job failed after {restarts} restart(s): {cause} ({reason})")]
    Failed {
        /// Restarts done.
        restarts: u32,
        /// The last failure.
        cause: String,
        /// Why no further restart.
        reason: String,
    },
}

fn new_job_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

/// Runs a job in this process until it finishes or fails for good.
pub fn run_job(graph: &JobGraph, opts: RunOptions) -> Result<JobSummary, JobError> {
    run_job_with(graph, opts, &mut LocalExecutor)
}

/// Runs a job whose subtasks `executor` deploys (in this process, or on workers) until it
/// finishes or fails for good. This thread is the job master. Whatever ends the run other than
/// a cancel leaves the job's status FAILED with the cause.
pub fn run_job_with(
    graph: &JobGraph,
    mut opts: RunOptions,
    executor: &mut dyn Executor,
) -> Result<JobSummary, JobError> {
    let status = opts.status.clone().unwrap_or_else(|| {
        let id = opts.job_id.clone().unwrap_or_else(new_job_id);
        JobStatus::new(id, graph.name().to_string(), opts.config.describe())
    });
    opts.status = Some(status.clone());
    let result = prepare_job(graph, opts).and_then(|job| job.run(graph, executor));
    match &result {
        Err(JobError::Canceled) => {
            let _ = status.transition(JobState::Canceled, Actor::Coordinator, None);
        }
        Err(e) => {
            status.fail(Actor::Coordinator, &e.to_string());
        }
        Ok(_) => {}
    }
    result
}

/// A job ready to run: planned, its checkpoint storage open, the checkpoint it starts from
/// found, loaded, verified and checked against the job, its sinks initialized. Everything
/// that can be known wrong before anything is deployed was checked by [`prepare_job`].
pub struct PreparedJob {
    opts: RunOptions,
    plan: Plan,
    started: Instant,
    storage: Arc<dyn CheckpointStorage>,
    job_id: String,
    restored: Option<LoadedCheckpoint>,
    started_fresh: bool,
    claimed: bool,
    claimed_external: Option<PathBuf>,
    status: Arc<JobStatus>,
}

impl PreparedJob {
    /// The job's id (a restored checkpoint's when the job continues it).
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// The job's live status.
    pub fn status(&self) -> &Arc<JobStatus> {
        &self.status
    }

    /// Where the job starts from, if from a checkpoint or savepoint (its location).
    pub fn restored_from(&self) -> Option<&str> {
        self.restored.as_ref().map(|c| c.location.as_str())
    }
}

/// Prepares a run of `graph` (see [`PreparedJob`]): no thread is started and nothing is
/// deployed, so an error here is the job's whole story.
pub fn prepare_job(graph: &JobGraph, opts: RunOptions) -> Result<PreparedJob, JobError> {
    let started = Instant::now();
    let config = &opts.config;
    config
        .validate()
        .map_err(|e| JobError::Setup(e.to_string()))?;
    if config.unaligned_enabled && config.checkpointing_mode == CheckpointingMode::AtLeastOnce {
        return Err(JobError::Setup(
            "execution.checkpointing.unaligned.enabled: unaligned checkpoints need execution.checkpointing.mode EXACTLY_ONCE".into(),
        ));
    }
    let plan = plan(graph, config)?;

    // Checkpoint storage: the configured directory or S3 location, or coordinator memory.
    let (mut dir_storage, fs_root) = open_checkpoint_storage(config)?;
    if let Some(fence) = &opts.fence {
        dir_storage = dir_storage.map(|inner| {
            Arc::new(FencedStorage::new(inner, fence.clone())) as Arc<dyn CheckpointStorage>
        });
    }
    let storage: Arc<dyn CheckpointStorage> = match &dir_storage {
        Some(s) => s.clone(),
        None => Arc::new(MemoryStorage::new()),
    };

    // What to start from.
    let mut job_id = opts.job_id.clone().unwrap_or_else(new_job_id);
    let mut restored: Option<LoadedCheckpoint> = None;
    let mut started_fresh = false;
    // The restored checkpoint is one of this job's own (same directory, same job id), retained
    // and deleted like the ones it takes.
    let mut claimed = false;
    // A restored snapshot elsewhere that the job owns (CLAIM mode): its directory.
    let mut claimed_external: Option<PathBuf> = None;
    let mut restore = opts.restore.clone();
    let resuming = matches!(opts.restore, Some(RestoreFrom::Resume { .. }));
    if let Some(RestoreFrom::Resume {
        job_id: resumed,
        otherwise,
    }) = &opts.restore
    {
        let Some(fs) = &dir_storage else {
            return Err(JobError::Restore(format!(
                "job {resumed} cannot be resumed without a checkpoint directory"
            )));
        };
        job_id = resumed.clone();
        restore = match find_latest_of(fs.as_ref(), Some(resumed)).map_err(JobError::Restore)? {
            Some(c) => {
                claimed = true;
                restored = Some(c);
                None
            }
            None => otherwise.as_deref().cloned(),
        };
        if restore.is_none() && restored.is_none() {
            info!("job {resumed} completed no checkpoint; starting it fresh");
            started_fresh = true;
        }
    }
    match &restore {
        None | Some(RestoreFrom::Resume { .. }) => {}
        Some(RestoreFrom::Latest) => {
            let Some(fs) = &dir_storage else {
                return Err(JobError::Restore(
                    "--from latest needs a checkpoint directory (--checkpoint-dir or state.checkpoints.dir)".into(),
                ));
            };
            match find_latest(fs.as_ref()).map_err(JobError::Restore)? {
                // A resumed job (first submitted `--from latest`) keeps its own id and
                // directory; the checkpoint it started from stays the other job's.
                Some(c) if resuming => restored = Some(c),
                Some(c) => {
                    job_id = c.metadata.job_id.clone();
                    claimed = true;
                    restored = Some(c);
                }
                None => {
                    started_fresh = true;
                    match unfinished_job(fs.as_ref()).map_err(JobError::Restore)? {
                        Some(j) if !resuming => {
                            info!("job {j} completed no checkpoint; starting it fresh");
                            job_id = j;
                            claimed = true;
                        }
                        _ => info!(
                            "no completed checkpoint under {}; starting fresh",
                            fs.location("")
                        ),
                    }
                }
            }
        }
        Some(RestoreFrom::LatestOf(of)) => {
            let Some(fs) = &dir_storage else {
                return Err(JobError::Restore(
                    "--from latest needs a checkpoint directory (--checkpoint-dir or state.checkpoints.dir)".into(),
                ));
            };
            let Some(c) = find_latest_of(fs.as_ref(), Some(of)).map_err(JobError::Restore)? else {
                return Err(JobError::Restore(format!(
                    "--from latest --job {of}: job {of} has no completed checkpoint under {}",
                    fs.location("")
                )));
            };
            job_id = c.metadata.job_id.clone();
            claimed = true;
            restored = Some(c);
        }
        Some(RestoreFrom::Path(p)) => {
            // NO_CLAIM (default): the snapshot stays the user's — the job gets its own id and
            // directory, so neither retention nor a cancel ever touches it. CLAIM: it becomes
            // the job's first retained checkpoint.
            let (c, _) = load_from_path(p).map_err(JobError::Restore)?;
            if config.claim_restored {
                let own_root = match (&fs_root, &c.storage_root) {
                    (Some(fs), Some(root)) => fs == root && !c.self_contained,
                    _ => false,
                };
                if own_root {
                    job_id = c.metadata.job_id.clone();
                    claimed = true;
                } else {
                    claimed_external = c.snapshot_dir();
                }
            }
            restored = Some(c);
        }
    }
    let status = opts.status.clone().unwrap_or_else(|| {
        JobStatus::new(job_id.clone(), graph.name().to_string(), config.describe())
    });
    let vertices = plan.vertex_views(graph);
    status.update(|v| {
        v.jid = job_id.clone();
        v.name = graph.name().to_string();
        v.config = config.describe();
        v.vertices = vertices;
        v.max_parallelism = plan.max_parallelism;
    });
    if let Some(c) = &restored {
        info!("restoring job from checkpoint {} ({})", c.id(), c.location);
        for node in graph.nodes() {
            let uid = node.uid.as_str();
            let now_p = node.parallelism.unwrap_or(config.parallelism);
            if c.has_channel_state(uid) && c.parallelism_of(uid) != Some(now_p) {
                return Err(JobError::Restore(format!(
                    "checkpoint {} holds in-flight data of operator '{uid}' (unaligned checkpoint) and cannot be restored with a different parallelism",
                    c.location
                )));
            }
        }
        if c.metadata.max_parallelism != plan.max_parallelism {
            return Err(JobError::Restore(format!(
                "checkpoint {} was taken with max parallelism {}, the job has {}; key groups cannot be remapped",
                c.location, c.metadata.max_parallelism, plan.max_parallelism
            )));
        }
        // Operators are matched by uid: new ones start empty; state of removed ones is an
        // error unless the user lets it go (as in Flink, a removed operator whose state is
        // empty loses nothing: a stateless one, or a SQL calc its source now runs).
        let known: std::collections::BTreeSet<&str> =
            graph.nodes().iter().map(|n| n.uid.as_str()).collect();
        let mut unclaimed: Vec<&str> = c
            .uids_holding_state()
            .filter(|u| !known.contains(u))
            .collect();
        unclaimed.sort_unstable();
        if !unclaimed.is_empty() {
            let list = unclaimed.join(", ");
            if !config.ignore_unclaimed_state {
                return Err(JobError::Restore(format!(
                    "checkpoint {} holds state of operators the job does not have: {list}; pass --allow-non-restored-state (execution.state-recovery.ignore-unclaimed-state: true) to start without it",
                    c.location
                )));
            }
            warn!("dropping the state of operators the job does not have: {list}");
        }
    }

    // Commit what the restored checkpoint pre-committed, discard the rest: a sink that cannot
    // (its output is not a directory, a savepoint resumed into another output) fails here.
    super::master::init_sinks(graph, &job_id, restored.as_ref(), |_| true)?;
    Ok(PreparedJob {
        plan,
        started,
        storage,
        job_id,
        restored,
        started_fresh,
        claimed,
        claimed_external,
        status,
        opts,
    })
}

impl PreparedJob {
    /// Runs the prepared job until it finishes or fails for good; `executor` deploys its
    /// subtasks. This thread is the job master.
    pub fn run(
        self,
        graph: &JobGraph,
        executor: &mut dyn Executor,
    ) -> Result<JobSummary, JobError> {
        let PreparedJob {
            opts,
            plan,
            started,
            storage,
            job_id,
            restored,
            started_fresh,
            claimed,
            mut claimed_external,
            status,
        } = self;
        let config = &opts.config;
        let checkpointing = config.checkpointing_enabled();
        let metrics = opts.metrics.clone().unwrap_or_default();
        let restored_from = restored.as_ref().map(|c| c.location.clone());
        let coordinator = checkpointing.then(|| {
            let settings = CheckpointSettings {
                interval: config.checkpoint_interval.unwrap_or(Duration::from_secs(1)),
                timeout: config.checkpoint_timeout,
                min_pause: config.min_pause,
                // Unaligned checkpoints run one at a time (as in Flink).
                max_concurrent: if config.unaligned_enabled {
                    1
                } else {
                    config.max_concurrent_checkpoints.max(1)
                },
                tolerable_failed: config.tolerable_failed_checkpoints,
                num_retained: config.num_retained.max(1),
                barrier_kind: barrier_kind(config),
            };
            // Continuing its own directory, the job never reuses the id of a directory there (one
            // newer than the restored checkpoint, when an older one was picked by path).
            let newest_dir = if claimed {
                checkpoint_ids(storage.as_ref(), &job_id).last().copied()
            } else {
                None
            };
            let min_next = restored
                .as_ref()
                .map_or(1, |c| c.id() + 1)
                .max(newest_dir.map_or(0, |n| n + 1));
            let mut c = CheckpointCoordinator::new(
                settings,
                storage.clone(),
                job_id.clone(),
                graph.name().to_string(),
                plan.max_parallelism,
                min_next,
                (Instant::now(), crate::checkpoint::now_ms()),
            );
            if claimed {
                if let Some(r) = &restored {
                    c.adopt_retained(r.id());
                }
            }
            // Shared files left by checkpoints that never completed, or by retained ones deleted
            // before a crash: nothing is in flight yet.
            c.collect_shared_garbage(u64::MAX);
            if let Err(e) = c.run_storage_now(Instant::now()) {
                warn!("{e}");
            }
            if let (Some(dir), Some(r)) = (claimed_external.take(), &restored) {
                info!("claiming {}: it is deleted once subsumed", r.location);
                let fence = opts.fence.clone();
                c.claim_external(
                    r.location.clone(),
                    Box::new(move || {
                        if let Some(fence) = &fence {
                            fence.check().map_err(|why| {
                                format!("refused to delete {}: this coordinator is no longer the leader ({why})", dir.display())
                            })?;
                        }
                        std::fs::remove_dir_all(&dir)
                            .map_err(|e| format!("cannot delete {}: {e}", dir.display()))
                    }),
                );
            }
            c
        });

        let candidates = plan.vertices_with_head_prefix(graph, opts.inject_target.0.as_deref());
        let injector = opts.inject.map(|s| {
            Arc::new(FailureInjector::among(
                candidates.clone(),
                s.count,
                s.seed,
                s.expected_records,
            ))
        });
        let (events_tx, events_rx) = crossbeam_channel::unbounded::<JobEvent>();
        let regions = plan.regions(graph);
        let region_failover =
            regions.len() > 1 && config.failover_strategy == FailoverStrategy::Region;
        let setup = MasterSetup {
            graph,
            deployer: Deployer {
                graph,
                plan: &plan,
                config,
                events: &events_tx,
                storage: &storage,
                job_id: &job_id,
                injector: &injector,
                metrics: &metrics,
            },
            events: events_rx,
            coordinator,
            status: status.clone(),
            restarts: RestartTracker::new(config.effective_restart_strategy()),
            regions,
            region_failover,
            restored,
            metrics: metrics.clone(),
            on_progress: opts.on_progress.clone(),
            started,
        };
        let finished = JobMaster::start(setup, executor)?.run()?;
        Ok(JobSummary {
            job_id: job_id.clone(),
            job_name: graph.name().to_string(),
            elapsed: started.elapsed(),
            records: metrics.records.load(Ordering::Relaxed),
            checkpoints: finished.checkpoints,
            checkpoints_completed: finished.completed_checkpoints,
            failed_checkpoints: finished.failed_checkpoints,
            restarts: finished.restarts,
            injected: injector.as_ref().map(|i| (i.fired(), i.planned())),
            restored_from,
            started_fresh,
            savepoints: status.view().savepoints,
        })
    }
}

/// The checkpoint storage `state.checkpoints.dir` names (a local directory or an S3
/// location), and the local directory's root; `(None, None)` when it is not set.
#[allow(clippy::type_complexity)]
fn open_checkpoint_storage(
    config: &JobConfig,
) -> Result<(Option<Arc<dyn CheckpointStorage>>, Option<PathBuf>), JobError> {
    let setup = |e: crate::storage::StorageError| JobError::Setup(e.to_string());
    if let Some(dir) = &config.checkpoints_dir {
        let fs = FsStorage::open(dir).map_err(setup)?;
        let root = fs.root().to_path_buf();
        return Ok((Some(Arc::new(fs)), Some(root)));
    }
    if let Some(url) = &config.checkpoints_s3 {
        return Ok((
            Some(crate::storage::open_s3(url, &config.s3).map_err(setup)?),
            None,
        ));
    }
    Ok((None, None))
}
