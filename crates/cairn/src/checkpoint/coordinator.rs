//! The checkpoint coordinator (R1–R4), as a state machine without I/O of its own.
//!
//! It triggers checkpoint n by queueing a [`TaskMessage::Trigger`] for every source subtask,
//! collects one [`TaskAck`] per subtask, and when all arrived writes `_metadata` last and
//! atomically, queues "complete" for every subtask, and deletes checkpoints beyond the retained
//! count. Checkpoints complete strictly in id order. A checkpoint that a subtask declines, or
//! that exceeds the timeout, is aborted and its directory removed; more consecutive failures
//! than tolerated fail the job. A checkpoint declined because a newer barrier overtook its
//! alignment (subsumed) is aborted too, but does not count as a failure, as in Flink.
//!
//! Time is an input (`now` on every call) and messages to subtasks are outputs
//! ([`CheckpointCoordinator::drain_messages`]): the job master delivers them on the control
//! path, the simulation delivers them whenever its schedule says. Its storage work is an
//! output too ([`CheckpointCoordinator::drain_storage`]): writing `_metadata` (and a savepoint's
//! copy) and deleting what is no longer retained are [`StorageTask`]s the caller runs off its
//! thread, in order; a checkpoint whose acknowledgements are all in is *finalizing* until
//! [`CheckpointCoordinator::on_finalized`] reports its `_metadata` written, and only then
//! complete. Finalizing checkpoints count as in flight and are never aborted: their
//! `_metadata` may be on storage already.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::restore::read_metadata;
use super::{
    Barrier, BarrierKind, CheckpointMetadata, DeclineCause, OperatorMetadata, SubtaskStateHandle,
    TaskAck,
};
use crate::state::rocks::shared_file_checkpoint;
use crate::storage::format::{encode, FileKind};
use crate::storage::layout::{
    checkpoint_dir, metadata_path, parse_checkpoint_dir, shared_dir, METADATA_FILE,
};
use crate::storage::CheckpointStorage;

/// Checkpointing settings (from `execution.checkpointing.*` and `state.checkpoints.*`).
#[derive(Debug, Clone)]
pub struct CheckpointSettings {
    /// Time between checkpoint triggers.
    pub interval: Duration,
    /// A checkpoint not complete after this long is aborted.
    pub timeout: Duration,
    /// Minimum time between the end of one checkpoint and the trigger of the next.
    pub min_pause: Duration,
    /// Checkpoints in flight at once.
    pub max_concurrent: u32,
    /// Consecutive failed checkpoints tolerated before the job fails.
    pub tolerable_failed: u32,
    /// Completed checkpoints kept.
    pub num_retained: u32,
    /// Aligned, aligned with a timeout, or unaligned barriers.
    pub barrier_kind: BarrierKind,
}

/// Deletes a claimed snapshot.
pub type DisposeFn = Box<dyn FnOnce() -> Result<(), String> + Send>;

/// A snapshot the job claimed, outside its own directory.
struct ClaimedSnapshot {
    /// Where it is, for log lines.
    location: String,
    /// Checkpoints completed since the job started from it.
    newer: u32,
    dispose: DisposeFn,
}

/// Storage work of the coordinator, run by its caller off the job master's thread, one at a
/// time and in the order queued.
pub struct StorageTask(StorageWork);

enum StorageWork {
    /// Writes checkpoint `id`'s `_metadata`, which completes it; for a savepoint, copies its
    /// files into the savepoint's directory and writes its `_metadata` there first (and for a
    /// stop-with-savepoint the job's `_metadata` after).
    Finalize {
        id: u64,
        storage: Arc<dyn CheckpointStorage>,
        meta: Arc<CheckpointMetadata>,
        savepoint: Option<SavepointTarget>,
    },
    /// Deletes what is no longer retained (a checkpoint directory, unreferenced shared files,
    /// a claimed snapshot).
    Cleanup(Box<dyn FnOnce() + Send>),
}

/// Where a savepoint is written.
struct SavepointTarget {
    target: Arc<dyn CheckpointStorage>,
    dir: String,
    stop: bool,
}

/// A finalization's result, for [`CheckpointCoordinator::on_finalized`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finalized {
    /// The checkpoint.
    pub id: u64,
    /// Its `_metadata` is written, or why not.
    pub result: Result<(), String>,
}

impl StorageTask {
    /// Runs the work; a finalization's result is for [`CheckpointCoordinator::on_finalized`].
    pub fn run(self) -> Option<Finalized> {
        match self.0 {
            StorageWork::Finalize {
                id,
                storage,
                meta,
                savepoint,
            } => Some(Finalized {
                id,
                result: finalize(storage.as_ref(), &meta, savepoint.as_ref()),
            }),
            StorageWork::Cleanup(f) => {
                f();
                None
            }
        }
    }

    /// Whether it writes a `_metadata` (the simulation may crash the process there).
    pub fn is_finalize(&self) -> bool {
        matches!(self.0, StorageWork::Finalize { .. })
    }
}

impl std::fmt::Debug for StorageTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            StorageWork::Finalize { id, .. } => write!(f, "Finalize({id})"),
            StorageWork::Cleanup(_) => write!(f, "Cleanup"),
        }
    }
}

/// Writes a checkpoint's `_metadata` (after a savepoint's copy, see [`StorageWork::Finalize`]).
fn finalize(
    storage: &dyn CheckpointStorage,
    meta: &CheckpointMetadata,
    savepoint: Option<&SavepointTarget>,
) -> Result<(), String> {
    let Some(sp) = savepoint else {
        return write_metadata(storage, meta);
    };
    write_savepoint(storage, &meta.job_id, meta, sp.target.as_ref(), &sp.dir)?;
    if sp.stop {
        if let Err(reason) = write_metadata(storage, meta) {
            // Without the checkpoint nothing may be committed: the stop fails as a whole.
            let _ = sp.target.delete(&sp.dir);
            return Err(reason);
        }
    }
    Ok(())
}

/// Writes checkpoint `meta`'s `_metadata`, which completes it.
fn write_metadata(
    storage: &dyn CheckpointStorage,
    meta: &CheckpointMetadata,
) -> Result<(), String> {
    let bytes = encode(FileKind::Metadata, meta).map_err(|e| e.to_string())?;
    storage
        .write_atomic(&metadata_path(&meta.job_id, meta.checkpoint_id), &bytes)
        .map_err(|e| e.to_string())
}

/// Removes a checkpoint directory. An upload of an aborted checkpoint may still be adding a
/// file while it is removed; it tries a few times (a late acknowledgement removes it again).
fn remove_checkpoint_dir(storage: &dyn CheckpointStorage, job_id: &str, id: u64) {
    let path = checkpoint_dir(job_id, id);
    let mut last = None;
    for _ in 0..3 {
        match storage.delete(&path) {
            Ok(()) => return,
            Err(e) => last = Some(e),
        }
    }
    if let Some(e) = last {
        debug!("cannot remove checkpoint {id} yet: {e}");
    }
}

/// A checkpoint whose acknowledgements are all in, while its `_metadata` is written.
struct Finalizing {
    meta: Arc<CheckpointMetadata>,
    savepoint: Option<SavepointRequest>,
}

/// One subtask as the coordinator sees it.
#[derive(Debug, Clone)]
pub struct TaskInfo {
    /// Global task index.
    pub index: usize,
    /// Task name.
    pub name: String,
    /// Subtask index.
    pub subtask: u32,
    /// Whether it is a source (receives triggers).
    pub is_source: bool,
    /// Operators of its chain: (uid, parallelism).
    pub operators: Vec<(String, u32)>,
}

/// A message of the coordinator to one subtask (delivered on the control path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TaskMessage {
    /// Sources only: take the checkpoint and emit its barrier.
    Trigger(Barrier, BarrierKind),
    /// The checkpoint is complete: commit what was pre-committed for it (and before it).
    Complete(u64),
    /// The checkpoint was aborted.
    Aborted(u64),
}

struct Pending {
    barrier: Barrier,
    started: Instant,
    acks: Vec<Option<TaskAck>>,
    remaining: usize,
    /// Set when this checkpoint is a savepoint.
    savepoint: Option<SavepointRequest>,
}

/// A savepoint to take: where it goes and what it is for.
pub struct SavepointRequest {
    /// Names the request (the REST API's request id).
    pub request_id: String,
    /// Storage the savepoint is written to (its own directory, not the job's checkpoints).
    pub target: Arc<dyn CheckpointStorage>,
    /// The savepoint's directory in `target`; every file it needs lives under it.
    pub dir: String,
    /// Stop-with-savepoint: the sources stop at its barrier, and its completion commits the
    /// sinks' output (an intermediate savepoint commits nothing: failover restores from
    /// checkpoints, which must not find output committed after them).
    pub stop: bool,
    /// With `stop`: the sources send the maximum watermark in front of the barrier, ending
    /// event time (Flink's `stop --drain`).
    pub drain: bool,
}

impl std::fmt::Debug for SavepointRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SavepointRequest")
            .field("request_id", &self.request_id)
            .field("dir", &self.dir)
            .field("stop", &self.stop)
            .field("drain", &self.drain)
            .finish()
    }
}

/// How a savepoint request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SavepointOutcome {
    /// Written: its checkpoint id and where it is.
    Completed { id: u64, location: String },
    /// Not taken, and why.
    Failed(String),
}

/// Completed checkpoints a coordinator keeps in memory (the metadata of a retained one
/// beyond them is read back from storage when needed).
pub const COMPLETED_KEPT: usize = 100;

/// Summary of a completed checkpoint, for progress lines and statistics.
#[derive(Debug, Clone)]
pub struct CompletedCheckpoint {
    /// Checkpoint id.
    pub id: u64,
    /// End-to-end duration.
    pub duration_ms: u64,
    /// State bytes.
    pub state_size: u64,
    /// The metadata.
    pub metadata: Arc<CheckpointMetadata>,
}

/// The checkpoint coordinator of one job.
pub struct CheckpointCoordinator {
    settings: CheckpointSettings,
    storage: Arc<dyn CheckpointStorage>,
    job_id: String,
    job_name: String,
    max_parallelism: u32,
    next_id: u64,
    attempts: Vec<u32>,
    tasks: Vec<TaskInfo>,
    pending: BTreeMap<u64, Pending>,
    finalizing: BTreeMap<u64, Finalizing>,
    /// Storage work not yet taken by the caller, in order.
    storage_tasks: Vec<StorageTask>,
    retained: VecDeque<u64>,
    last_trigger: Option<Instant>,
    last_completion: Option<Instant>,
    consecutive_failures: u32,
    /// The newest completed checkpoints (between [`COMPLETED_KEPT`] and twice as many once
    /// that many completed: memory stays bounded however long the job runs).
    completed: Vec<CompletedCheckpoint>,
    completed_total: u64,
    failed_total: u64,
    triggered_total: u64,
    /// Messages to subtasks not yet taken by the caller: (global task index, message).
    outbox: Vec<(usize, TaskMessage)>,
    /// Savepoints requested and not triggered yet.
    savepoint_queue: VecDeque<SavepointRequest>,
    /// Savepoint requests that ended, not yet taken by the caller.
    savepoint_outcomes: Vec<(String, SavepointOutcome)>,
    /// A snapshot outside the job's directory the job was started from in `CLAIM` mode.
    claimed: Option<ClaimedSnapshot>,
    /// Planted bug (simulator tests only): intermediate savepoints commit side effects.
    #[cfg(test)]
    savepoints_commit: bool,
    /// Planted bug (simulator tests only): shared files of checkpoints in flight are deleted.
    #[cfg(test)]
    gc_ignores_in_flight: bool,
    /// An instant and the wall-clock time (ms since the epoch) at that instant: barrier and
    /// metadata timestamps derive from `now`, so a simulated clock drives them too.
    epoch_base: (Instant, u64),
}

/// The job must fail: too many checkpoints failed in a row.
#[derive(Debug, thiserror::Error)]
#[error("exceeded the tolerable number of failed checkpoints ({tolerable}); last: checkpoint {id} {reason}")]
pub struct TooManyFailures {
    /// The limit.
    pub tolerable: u32,
    /// The last failed checkpoint.
    pub id: u64,
    /// Why it failed.
    pub reason: String,
}

impl CheckpointCoordinator {
    /// A coordinator writing under `<storage>/<job_id>/`. Checkpoint ids continue after the
    /// highest id present in the job directory, so a resumed job never reuses a directory.
    /// `epoch_base` is an instant and the wall-clock time in ms since the Unix epoch at it.
    pub fn new(
        settings: CheckpointSettings,
        storage: Arc<dyn CheckpointStorage>,
        job_id: String,
        job_name: String,
        max_parallelism: u32,
        min_next_id: u64,
        epoch_base: (Instant, u64),
    ) -> Self {
        let highest = storage
            .list(&job_id)
            .unwrap_or_default()
            .iter()
            .filter_map(|n| parse_checkpoint_dir(n))
            .max()
            .unwrap_or(0);
        CheckpointCoordinator {
            settings,
            storage,
            job_id,
            job_name,
            max_parallelism,
            next_id: (highest + 1).max(min_next_id),
            attempts: Vec::new(),
            tasks: Vec::new(),
            pending: BTreeMap::new(),
            finalizing: BTreeMap::new(),
            storage_tasks: Vec::new(),
            retained: VecDeque::new(),
            last_trigger: None,
            last_completion: None,
            consecutive_failures: 0,
            completed: Vec::new(),
            completed_total: 0,
            failed_total: 0,
            triggered_total: 0,
            outbox: Vec::new(),
            savepoint_queue: VecDeque::new(),
            savepoint_outcomes: Vec::new(),
            #[cfg(test)]
            savepoints_commit: false,
            #[cfg(test)]
            gc_ignores_in_flight: false,
            claimed: None,
            epoch_base,
        }
    }

    /// Queues a savepoint: it is triggered as soon as fewer than max-concurrent checkpoints are
    /// in flight, whatever the interval. Always aligned; never retained, subsumed or deleted by
    /// the coordinator.
    pub fn request_savepoint(&mut self, request: SavepointRequest) {
        self.savepoint_queue.push_back(request);
    }

    /// Plants a bug (simulator tests only): an intermediate savepoint's completion is
    /// broadcast, so sinks commit output a failover from an older checkpoint repeats.
    #[cfg(test)]
    pub(crate) fn plant_savepoints_commit(&mut self) {
        self.savepoints_commit = true;
    }

    /// Plants a bug (simulator tests only): a completion deletes every unreferenced shared
    /// file, also those of checkpoints still in flight.
    #[cfg(test)]
    pub(crate) fn plant_gc_ignores_in_flight(&mut self) {
        self.gc_ignores_in_flight = true;
    }

    /// The job was cancelled and keeps no checkpoints: deletes every checkpoint directory of
    /// the job and a claimed snapshot (savepoints taken by the job live elsewhere and stay).
    pub fn delete_checkpoints(&mut self) {
        self.retained.clear();
        self.dispose_claimed();
        let (storage, job_id) = (self.storage.clone(), self.job_id.clone());
        self.cleanup(move || {
            for name in storage.list(&job_id).unwrap_or_default() {
                if let Some(id) = parse_checkpoint_dir(&name) {
                    remove_checkpoint_dir(storage.as_ref(), &job_id, id);
                }
            }
        });
        self.collect_shared_garbage(u64::MAX);
    }

    fn cleanup(&mut self, f: impl FnOnce() + Send + 'static) {
        self.storage_tasks
            .push(StorageTask(StorageWork::Cleanup(Box::new(f))));
    }

    /// Takes the storage work queued so far, to run in this order off the caller's thread.
    pub fn drain_storage(&mut self) -> Vec<StorageTask> {
        std::mem::take(&mut self.storage_tasks)
    }

    /// Runs the storage work queued so far on this thread and reports the finalizations (at
    /// a job's start, before anything runs; and in tests). Returns the checkpoints completed.
    pub fn run_storage_now(&mut self, now: Instant) -> Result<Vec<u64>, TooManyFailures> {
        let mut done = Vec::new();
        while !self.storage_tasks.is_empty() {
            for task in self.drain_storage() {
                if let Some(f) = task.run() {
                    done.extend(self.on_finalized(f, now)?);
                }
            }
        }
        Ok(done)
    }

    /// Checkpoints whose `_metadata` is being written.
    pub fn finalizing_count(&self) -> usize {
        self.finalizing.len()
    }

    /// Deletes the files of `<job>/shared/` that no retained checkpoint references and that
    /// checkpoints up to `upto` uploaded (a newer checkpoint may be in flight and about to
    /// reference its files). Run after every completion, and with `u64::MAX` when the job
    /// starts (nothing is in flight then; every completed checkpoint left in the directory
    /// counts as referencing its files until retention deletes it) or deletes its
    /// checkpoints. If a retained checkpoint's `_metadata` cannot be read, nothing is deleted.
    pub fn collect_shared_garbage(&mut self, upto: u64) {
        #[cfg(test)]
        let upto = if self.gc_ignores_in_flight {
            u64::MAX
        } else {
            upto
        };
        let retained: Vec<(u64, Option<Arc<CheckpointMetadata>>)> = self
            .retained
            .iter()
            .map(|&id| {
                let known = self.completed.iter().find(|c| c.id == id);
                (id, known.map(|c| c.metadata.clone()))
            })
            .collect();
        let (storage, job_id) = (self.storage.clone(), self.job_id.clone());
        self.cleanup(move || collect_shared_garbage(storage.as_ref(), &job_id, &retained, upto));
    }

    /// Fails every savepoint not taken yet (the job is ending, or cannot take one now).
    pub fn fail_queued_savepoints(&mut self, reason: &str) {
        for r in std::mem::take(&mut self.savepoint_queue) {
            self.savepoint_outcomes
                .push((r.request_id, SavepointOutcome::Failed(reason.to_string())));
        }
    }

    /// Takes the outcomes of savepoint requests that ended since the last call.
    pub fn drain_savepoint_outcomes(&mut self) -> Vec<(String, SavepointOutcome)> {
        std::mem::take(&mut self.savepoint_outcomes)
    }

    /// The stop-with-savepoint in flight, if any.
    pub fn stop_in_flight(&self) -> Option<u64> {
        let pending = self
            .pending
            .values()
            .find(|p| p.savepoint.as_ref().is_some_and(|s| s.stop))
            .map(|p| p.barrier.id);
        pending.or_else(|| {
            self.finalizing
                .iter()
                .find(|(_, f)| f.savepoint.as_ref().is_some_and(|s| s.stop))
                .map(|(id, _)| *id)
        })
    }

    /// Wall-clock milliseconds since the Unix epoch at `now`.
    fn epoch_ms(&self, now: Instant) -> u64 {
        let (base, base_ms) = self.epoch_base;
        base_ms + now.saturating_duration_since(base).as_millis() as u64
    }

    /// Takes the messages for subtasks queued so far, in the order they were queued.
    pub fn drain_messages(&mut self) -> Vec<(usize, TaskMessage)> {
        std::mem::take(&mut self.outbox)
    }

    fn broadcast(&mut self, message: TaskMessage) {
        for t in &self.tasks {
            self.outbox.push((t.index, message));
        }
    }

    /// Registers a checkpoint this job restored from (claimed): it counts as retained, so it is
    /// deleted once enough newer ones completed.
    pub fn adopt_retained(&mut self, id: u64) {
        if !self.retained.contains(&id) {
            self.retained.push_back(id);
        }
    }

    /// Claims a snapshot outside the job's directory that the job was started from (`CLAIM`
    /// mode): like a retained checkpoint, it is deleted — by `dispose` — once `num_retained`
    /// newer checkpoints completed, or when a cancelled job deletes its checkpoints.
    pub fn claim_external(&mut self, location: String, dispose: DisposeFn) {
        self.claimed = Some(ClaimedSnapshot {
            location,
            newer: 0,
            dispose,
        });
    }

    fn dispose_claimed(&mut self) {
        if let Some(c) = self.claimed.take() {
            self.cleanup(move || match (c.dispose)() {
                Ok(()) => info!("deleted the claimed snapshot {}", c.location),
                Err(e) => warn!("cannot delete the claimed snapshot {}: {e}", c.location),
            });
        }
    }

    /// The job id (checkpoint directory name).
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Sets the subtasks (all of them, in global order) and the attempt each belongs to, after
    /// a (re)deployment of some or all of them; in-flight checkpoints are aborted, since they
    /// wait for subtasks that are gone.
    pub fn set_tasks(&mut self, tasks: Vec<TaskInfo>, attempts: Vec<u32>, now: Instant) {
        self.attempts = attempts;
        self.tasks = tasks;
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            if let Some(sp) = self.pending.remove(&id).and_then(|p| p.savepoint) {
                self.savepoint_failed(sp, "subtasks failed while it was taken".into());
            }
            self.broadcast(TaskMessage::Aborted(id));
            self.remove_dir(id);
        }
        // The first checkpoint of a (re)deployment comes one interval later, as in Flink.
        self.last_trigger = Some(now);
    }

    /// The newest checkpoints completed during this run (at least the last
    /// [`COMPLETED_KEPT`] of them, at most twice as many), oldest first.
    pub fn completed(&self) -> &[CompletedCheckpoint] {
        &self.completed
    }

    /// How many checkpoints completed during this run.
    pub fn completed_total(&self) -> u64 {
        self.completed_total
    }

    /// Number of failed (aborted) checkpoints during this run.
    pub fn failed_total(&self) -> u64 {
        self.failed_total
    }

    /// Number of checkpoints triggered during this run.
    pub fn triggered_total(&self) -> u64 {
        self.triggered_total
    }

    /// Number of checkpoints in flight.
    pub fn pending_count(&self) -> usize {
        self.pending.len() + self.finalizing.len()
    }

    /// Whether another checkpoint may start now (fewer than max-concurrent in flight).
    pub fn has_room(&self) -> bool {
        self.pending_count() < self.settings.max_concurrent as usize
    }

    /// When the next periodic trigger is due.
    pub fn next_trigger_at(&self, now: Instant) -> Instant {
        if !self.savepoint_queue.is_empty() {
            return now;
        }
        let by_interval = self
            .last_trigger
            .map_or(now, |t| t + self.settings.interval);
        let by_pause = self
            .last_completion
            .map_or(now, |t| t + self.settings.min_pause);
        by_interval.max(by_pause)
    }

    /// Triggers a checkpoint if one is due (or `force`d, for the final checkpoint) and fewer
    /// than max-concurrent are in flight; a requested savepoint goes first, except in front of
    /// the final checkpoint. Returns its id.
    pub fn maybe_trigger(&mut self, now: Instant, force: bool) -> Option<u64> {
        if self.tasks.is_empty() || !self.has_room() {
            return None;
        }
        let savepoint_finalizing = self.finalizing.values().any(|f| f.savepoint.is_some());
        if savepoint_finalizing || self.pending.values().any(|p| p.savepoint.is_some()) {
            // Nothing overtakes a savepoint: a newer barrier would subsume it at the subtasks.
            return None;
        }
        if !force {
            if let Some(sp) = self.savepoint_queue.pop_front() {
                return Some(self.trigger(now, true, Some(sp)));
            }
            if now < self.next_trigger_at(now) {
                return None;
            }
        }
        Some(self.trigger(now, force, None))
    }

    /// Starts checkpoint (or savepoint) `next_id`: its barrier goes to the sources.
    fn trigger(
        &mut self,
        now: Instant,
        aligned_only: bool,
        savepoint: Option<SavepointRequest>,
    ) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let barrier = Barrier {
            id,
            timestamp_ms: self.epoch_ms(now),
            aligned_only,
            savepoint: savepoint.is_some(),
        };
        // The final checkpoint and savepoints are aligned: the final one so that no in-flight
        // data is left to be processed after the sinks' last pre-commit, savepoints so that
        // they hold no in-flight data and restore at any parallelism.
        let kind = match &savepoint {
            Some(sp) if sp.stop => BarrierKind::Stop { drain: sp.drain },
            _ if aligned_only => BarrierKind::Aligned,
            _ => self.settings.barrier_kind,
        };
        self.pending.insert(
            id,
            Pending {
                barrier,
                started: now,
                acks: vec![None; self.tasks.len()],
                remaining: self.tasks.len(),
                savepoint,
            },
        );
        self.last_trigger = Some(now);
        self.triggered_total += 1;
        debug!(checkpoint = id, "triggering checkpoint");
        for t in self.tasks.iter().filter(|t| t.is_source) {
            self.outbox
                .push((t.index, TaskMessage::Trigger(barrier, kind)));
        }
        id
    }

    /// A subtask acknowledged. Returns the ids of checkpoints that completed as a result.
    pub fn on_ack(&mut self, ack: TaskAck, now: Instant) -> Result<Vec<u64>, TooManyFailures> {
        if self.attempts.get(ack.task_index) != Some(&ack.attempt) {
            return Ok(Vec::new());
        }
        let id = ack.checkpoint_id;
        let Some(p) = self.pending.get_mut(&id) else {
            // Late ack of an aborted checkpoint: its file must not survive the abort.
            if ack.file.is_some() {
                self.remove_dir(id);
            }
            return Ok(Vec::new());
        };
        let idx = ack.task_index;
        if idx < p.acks.len() && p.acks[idx].is_none() {
            p.acks[idx] = Some(ack);
            p.remaining -= 1;
        }
        self.complete_ready(now)
    }

    /// A subtask declined checkpoint `id`: subsumed by a newer barrier (not a failure), or it
    /// could not take part (a failure).
    pub fn on_decline(
        &mut self,
        id: u64,
        attempt: u32,
        cause: &DeclineCause,
        now: Instant,
    ) -> Result<(), TooManyFailures> {
        if !self.attempts.contains(&attempt) || !self.pending.contains_key(&id) {
            return Ok(());
        }
        match cause {
            DeclineCause::Subsumed => {
                self.abort_subsumed(id, now);
                Ok(())
            }
            DeclineCause::Failed(reason) => self.abort(id, reason, now),
        }
    }

    /// Aborts checkpoints that exceeded the timeout.
    pub fn check_timeouts(&mut self, now: Instant) -> Result<(), TooManyFailures> {
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.started) > self.settings.timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.abort(id, "expired before completing", now)?;
        }
        Ok(())
    }

    /// When the oldest in-flight checkpoint times out.
    pub fn next_timeout_at(&self) -> Option<Instant> {
        self.pending
            .values()
            .map(|p| p.started + self.settings.timeout)
            .min()
    }

    /// Removes pending checkpoint `id`: tasks are told, its directory goes.
    fn discard(&mut self, id: u64, now: Instant) {
        self.pending.remove(&id);
        self.broadcast(TaskMessage::Aborted(id));
        self.remove_dir(id);
        self.failed_total += 1;
        self.last_completion = Some(now);
    }

    /// A newer checkpoint's barrier overtook `id`'s alignment: `id` cannot complete, but
    /// nothing failed, so the tolerable-failure count is untouched.
    fn abort_subsumed(&mut self, id: u64, now: Instant) {
        if let Some(sp) = self.pending.get_mut(&id).and_then(|p| p.savepoint.take()) {
            self.savepoint_failed(sp, "subsumed by a newer checkpoint".into());
        }
        debug!(
            checkpoint = id,
            "checkpoint {id} subsumed by a newer checkpoint"
        );
        self.discard(id, now);
    }

    fn abort(&mut self, id: u64, reason: &str, now: Instant) -> Result<(), TooManyFailures> {
        if let Some(sp) = self.pending.get_mut(&id).and_then(|p| p.savepoint.take()) {
            // A failed savepoint fails its request, not the job.
            warn!(checkpoint = id, "savepoint {id} failed: {reason}");
            self.savepoint_failed(sp, reason.to_string());
            self.pending.remove(&id);
            self.broadcast(TaskMessage::Aborted(id));
            self.remove_dir(id);
            return Ok(());
        }
        warn!(checkpoint = id, "checkpoint {id} failed: {reason}");
        self.discard(id, now);
        self.consecutive_failures += 1;
        if self.consecutive_failures > self.settings.tolerable_failed {
            return Err(TooManyFailures {
                tolerable: self.settings.tolerable_failed,
                id,
                reason: reason.to_string(),
            });
        }
        Ok(())
    }

    fn remove_dir(&mut self, id: u64) {
        let (storage, job_id) = (self.storage.clone(), self.job_id.clone());
        self.cleanup(move || remove_checkpoint_dir(storage.as_ref(), &job_id, id));
    }

    /// Checkpoints every subtask acknowledged, in id order, start finalizing: their
    /// `_metadata` is queued for writing. None completes here.
    fn complete_ready(&mut self, now: Instant) -> Result<Vec<u64>, TooManyFailures> {
        while let Some(entry) = self.pending.first_entry() {
            if entry.get().remaining > 0 {
                break;
            }
            let mut p = entry.remove();
            let id = p.barrier.id;
            let savepoint = p.savepoint.take();
            let meta = match self.metadata_of(p, now) {
                Ok(meta) => Arc::new(meta),
                Err(reason) => {
                    match savepoint {
                        Some(sp) => {
                            self.savepoint_not_written(id, sp, reason);
                        }
                        None => self.abort(id, &reason, now)?,
                    }
                    continue;
                }
            };
            self.storage_tasks.push(StorageTask(StorageWork::Finalize {
                id,
                storage: self.storage.clone(),
                meta: meta.clone(),
                savepoint: savepoint.as_ref().map(|sp| SavepointTarget {
                    target: sp.target.clone(),
                    dir: sp.dir.clone(),
                    stop: sp.stop,
                }),
            }));
            self.finalizing.insert(id, Finalizing { meta, savepoint });
        }
        Ok(Vec::new())
    }

    /// The storage task finalizing a checkpoint ended: with its `_metadata` written it is
    /// complete (subtasks are told to commit), else it is aborted. Returns the checkpoints
    /// completed.
    pub fn on_finalized(
        &mut self,
        finalized: Finalized,
        now: Instant,
    ) -> Result<Vec<u64>, TooManyFailures> {
        let id = finalized.id;
        let Some(f) = self.finalizing.remove(&id) else {
            return Ok(Vec::new());
        };
        let done = match (f.savepoint, finalized.result) {
            (Some(sp), Ok(())) => self.savepoint_written(f.meta, sp, now),
            (Some(sp), Err(reason)) => self.savepoint_not_written(id, sp, reason),
            (None, Ok(())) => {
                self.completed_checkpoint(f.meta, now);
                true
            }
            (None, Err(reason)) => {
                // The metadata could not be written: the checkpoint does not exist.
                self.abort(id, &reason, now)?;
                false
            }
        };
        Ok(if done { vec![id] } else { Vec::new() })
    }

    /// Savepoint `meta` is written. An intermediate savepoint's job copy goes and nothing is
    /// committed (failover restores from checkpoints, which must not find output committed
    /// after them). A stop-with-savepoint commits the sinks' output, so it also stays a
    /// completed checkpoint of the job (its `_metadata` was written after the savepoint's and
    /// before the commit): a failure or crash before the job finished restores from it, not
    /// from an older one.
    fn savepoint_written(
        &mut self,
        meta: Arc<CheckpointMetadata>,
        sp: SavepointRequest,
        now: Instant,
    ) -> bool {
        let id = meta.checkpoint_id;
        let location = sp.target.location(&sp.dir);
        info!(checkpoint = id, "savepoint {id} written to {location}");
        self.last_completion = Some(now);
        if sp.stop {
            self.completed_checkpoint(meta, now);
        } else {
            self.remove_dir(id);
            #[cfg(test)]
            if self.savepoints_commit {
                self.broadcast(TaskMessage::Complete(id));
            }
        }
        self.savepoint_outcomes
            .push((sp.request_id, SavepointOutcome::Completed { id, location }));
        true
    }

    /// Savepoint `id` could not be written: it is aborted (the sources of a stop resume).
    fn savepoint_not_written(&mut self, id: u64, sp: SavepointRequest, reason: String) -> bool {
        warn!(checkpoint = id, "savepoint {id} failed: {reason}");
        self.remove_dir(id);
        self.broadcast(TaskMessage::Aborted(id));
        self.savepoint_failed(sp, reason);
        false
    }

    /// Checkpoint `meta` is complete: the subtasks commit, it is retained.
    fn completed_checkpoint(&mut self, meta: Arc<CheckpointMetadata>, now: Instant) {
        let id = meta.checkpoint_id;
        crate::failpoint::hit("checkpoint-completed", id);
        self.consecutive_failures = 0;
        self.last_completion = Some(now);
        self.broadcast(TaskMessage::Complete(id));
        debug!(
            checkpoint = id,
            duration_ms = meta.duration_ms(),
            size = meta.state_size,
            "completed checkpoint {id}"
        );
        self.completed.push(CompletedCheckpoint {
            id,
            duration_ms: meta.duration_ms(),
            state_size: meta.state_size,
            metadata: meta,
        });
        self.completed_total += 1;
        if self.completed.len() >= 2 * COMPLETED_KEPT {
            self.completed.drain(..COMPLETED_KEPT);
        }
        self.retained.push_back(id);
        self.apply_retention();
        self.collect_shared_garbage(id);
        let num_retained = self.settings.num_retained.max(1);
        if let Some(c) = &mut self.claimed {
            c.newer += 1;
            if c.newer >= num_retained {
                self.dispose_claimed();
            }
        }
    }

    fn savepoint_failed(&mut self, sp: SavepointRequest, reason: String) {
        self.savepoint_outcomes
            .push((sp.request_id, SavepointOutcome::Failed(reason)));
    }

    /// The `_metadata` of a checkpoint every subtask acknowledged.
    fn metadata_of(&self, p: Pending, now: Instant) -> Result<CheckpointMetadata, String> {
        let id = p.barrier.id;
        let mut operators: BTreeMap<String, OperatorMetadata> = BTreeMap::new();
        let mut tasks = Vec::with_capacity(p.acks.len());
        let mut state_size = 0;
        let mut shared_files = Vec::new();
        for (ack, info) in p.acks.into_iter().zip(&self.tasks) {
            let Some(ack) = ack else {
                return Err("an acknowledgement is missing".into());
            };
            state_size += ack.stats.state_size;
            shared_files.extend(ack.shared_files);
            if let Some(file) = &ack.file {
                for acked in &ack.operators {
                    let uid = &acked.uid;
                    let parallelism = info
                        .operators
                        .iter()
                        .find(|(u, _)| u == uid)
                        .map_or(1, |(_, p)| *p);
                    let op = operators
                        .entry(uid.clone())
                        .or_insert_with(|| OperatorMetadata {
                            uid: uid.clone(),
                            parallelism,
                            subtasks: Vec::new(),
                            states: Vec::new(),
                        });
                    op.subtasks.push(SubtaskStateHandle {
                        subtask: info.subtask,
                        file: file.clone(),
                    });
                    // Subtasks that registered no state of a name do not list it.
                    for d in &acked.states {
                        if !op.states.iter().any(|s| s.name == d.name) {
                            op.states.push(d.clone());
                        }
                    }
                }
            }
            tasks.push(ack.stats);
        }
        shared_files.sort_unstable();
        shared_files.dedup();
        let meta = CheckpointMetadata {
            job_id: self.job_id.clone(),
            job_name: self.job_name.clone(),
            checkpoint_id: id,
            trigger_timestamp_ms: p.barrier.timestamp_ms,
            completed_timestamp_ms: self.epoch_ms(now).max(p.barrier.timestamp_ms),
            max_parallelism: self.max_parallelism,
            operators: operators.into_values().collect(),
            state_size,
            tasks,
            shared_files,
        };
        Ok(meta)
    }

    fn apply_retention(&mut self) {
        while self.retained.len() > self.settings.num_retained.max(1) as usize {
            if let Some(old) = self.retained.pop_front() {
                self.remove_dir(old);
            }
        }
        // Directories older than the oldest retained checkpoint (torn, corrupt, or left by a
        // killed run) are garbage too.
        if let Some(&oldest) = self.retained.front() {
            let in_flight: HashSet<u64> = self
                .pending
                .keys()
                .chain(self.finalizing.keys())
                .copied()
                .collect();
            let (storage, job_id) = (self.storage.clone(), self.job_id.clone());
            self.cleanup(move || {
                for name in storage.list(&job_id).unwrap_or_default() {
                    if let Some(id) = parse_checkpoint_dir(&name) {
                        if id < oldest && !in_flight.contains(&id) {
                            remove_checkpoint_dir(storage.as_ref(), &job_id, id);
                        }
                    }
                }
            });
        }
    }
}

/// Copies the state files of checkpoint `meta` from the job's checkpoint storage into the
/// savepoint's directory, then writes its `_metadata` there, last and atomically. File names in
/// `_metadata` are relative to the directory, so the savepoint can be moved or copied.
fn write_savepoint(
    storage: &dyn CheckpointStorage,
    job_id: &str,
    meta: &CheckpointMetadata,
    target: &dyn CheckpointStorage,
    dir: &str,
) -> Result<(), String> {
    let from = checkpoint_dir(job_id, meta.checkpoint_id);
    let mut files: Vec<&str> = meta
        .operators
        .iter()
        .flat_map(|o| o.subtasks.iter().map(|h| h.file.as_str()))
        .collect();
    files.sort_unstable();
    files.dedup();
    for file in files {
        let bytes = storage
            .read(&format!("{from}/{file}"))
            .map_err(|e| e.to_string())?;
        target
            .write(&format!("{dir}/{file}"), &bytes)
            .map_err(|e| e.to_string())?;
    }
    let bytes = encode(FileKind::Metadata, meta).map_err(|e| e.to_string())?;
    target
        .write_atomic(&format!("{dir}/{METADATA_FILE}"), &bytes)
        .map_err(|e| e.to_string())
}

/// Deletes the files of `<job>/shared/` that no `retained` checkpoint references (its
/// metadata, when known, else read back) and that checkpoints up to `upto` uploaded (see
/// [`CheckpointCoordinator::collect_shared_garbage`]). If a retained checkpoint's `_metadata`
/// cannot be read, nothing is deleted.
fn collect_shared_garbage(
    storage: &dyn CheckpointStorage,
    job_id: &str,
    retained: &[(u64, Option<Arc<CheckpointMetadata>>)],
    upto: u64,
) {
    let dir = shared_dir(job_id);
    let names = match storage.list(&dir) {
        Ok(names) if !names.is_empty() => names,
        _ => return,
    };
    let mut referenced: HashSet<String> = HashSet::new();
    for (id, known) in retained {
        let meta = match known {
            Some(m) => Ok(m.clone()),
            None => read_metadata(storage, job_id, *id).map(Arc::new),
        };
        match meta {
            Ok(meta) => referenced.extend(meta.shared_files.iter().cloned()),
            Err(e) => {
                warn!("keeping every shared file: cannot read checkpoint {id}: {e}");
                return;
            }
        }
    }
    if upto == u64::MAX {
        for name in storage.list(job_id).unwrap_or_default() {
            let Some(id) = parse_checkpoint_dir(&name) else {
                continue;
            };
            if let Ok(meta) = read_metadata(storage, job_id, id) {
                referenced.extend(meta.shared_files);
            }
        }
    }
    let mut deleted = 0usize;
    for name in names {
        let path = format!("{dir}/{name}");
        if referenced.contains(&path) {
            continue;
        }
        if shared_file_checkpoint(&name).is_some_and(|c| c <= upto) {
            match storage.delete(&path) {
                Ok(()) => deleted += 1,
                Err(e) => debug!("cannot delete {path} yet: {e}"),
            }
        }
    }
    if deleted > 0 {
        debug!(
            deleted,
            "deleted shared files no retained checkpoint references"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::restore::checkpoint_ids;
    use crate::storage::layout::metadata_path;
    use crate::storage::MemoryStorage;

    fn settings(tolerable_failed: u32) -> CheckpointSettings {
        CheckpointSettings {
            interval: Duration::from_millis(100),
            timeout: Duration::from_secs(10),
            min_pause: Duration::ZERO,
            max_concurrent: 2,
            tolerable_failed,
            num_retained: 1,
            barrier_kind: BarrierKind::Aligned,
        }
    }

    /// A coordinator over a source (task 0) and a sink (task 1), both of attempt 0.
    fn coordinator(tolerable_failed: u32) -> (CheckpointCoordinator, Arc<MemoryStorage>, Instant) {
        let storage = Arc::new(MemoryStorage::new());
        let t0 = Instant::now();
        let mut c = CheckpointCoordinator::new(
            settings(tolerable_failed),
            storage.clone(),
            "job".into(),
            "test".into(),
            128,
            1,
            (t0, 1_000_000),
        );
        let task = |index, is_source| TaskInfo {
            index,
            name: format!("t{index}"),
            subtask: 0,
            is_source,
            operators: vec![(format!("op{index}"), 1)],
        };
        c.set_tasks(vec![task(0, true), task(1, false)], vec![0, 0], t0);
        (c, storage, t0)
    }

    fn ack(id: u64, task_index: usize) -> TaskAck {
        TaskAck {
            checkpoint_id: id,
            task_index,
            attempt: 0,
            file: None,
            operators: Vec::new(),
            stats: crate::checkpoint::TaskCheckpointStats::default(),
            shared_files: Vec::new(),
        }
    }

    #[test]
    fn a_long_run_keeps_the_newest_completed_checkpoints_only() {
        let (mut c, storage, t0) = coordinator(0);
        let total = 5 * COMPLETED_KEPT as u64 + 7;
        for n in 1..=total {
            let now = t0 + Duration::from_millis(100 * n);
            let id = c.maybe_trigger(now, false).expect("a checkpoint is due");
            c.drain_messages();
            c.on_ack(ack(id, 0), now).unwrap();
            c.on_ack(ack(id, 1), now).unwrap();
            assert_eq!(c.run_storage_now(now).unwrap(), vec![id]);
            c.drain_messages();
            assert!(c.completed().len() < 2 * COMPLETED_KEPT, "bounded at {n}");
        }
        assert_eq!(c.completed_total(), total);
        assert!(c.completed().len() >= COMPLETED_KEPT);
        assert_eq!(c.completed().last().map(|x| x.id), Some(total));
        // Ids are consecutive up to the newest: the newest ones are kept.
        let ids: Vec<u64> = c.completed().iter().map(|x| x.id).collect();
        let first = ids[0];
        assert_eq!(ids, (first..=total).collect::<Vec<_>>());
        // And on storage, only the retained one.
        assert_eq!(checkpoint_ids(storage.as_ref(), "job"), vec![total]);
    }

    #[test]
    fn time_is_an_input_and_triggers_go_to_sources_only() {
        let (mut c, _, t0) = coordinator(0);
        assert_eq!(c.maybe_trigger(t0 + Duration::from_millis(99), false), None);
        let id = c.maybe_trigger(t0 + Duration::from_millis(100), false);
        assert_eq!(id, Some(1));
        let sent = c.drain_messages();
        assert_eq!(sent.len(), 1, "{sent:?}");
        let (task, TaskMessage::Trigger(barrier, BarrierKind::Aligned)) = sent[0] else {
            panic!("expected a trigger, got {sent:?}");
        };
        assert_eq!(task, 0);
        // The barrier's wall-clock time derives from the instant given, not from the machine.
        assert_eq!(barrier.timestamp_ms, 1_000_100);
    }

    #[test]
    fn a_checkpoint_completes_when_every_subtask_acked_and_metadata_comes_last() {
        let (mut c, storage, t0) = coordinator(0);
        let now = t0 + Duration::from_millis(100);
        c.maybe_trigger(now, false);
        c.drain_messages();
        assert!(c.on_ack(ack(1, 1), now).unwrap().is_empty());
        assert!(c.on_ack(ack(1, 0), now).unwrap().is_empty());
        // Every ack is in: the checkpoint is finalizing, its `_metadata` is work for the
        // storage thread, and nothing is committed yet.
        assert_eq!(c.finalizing_count(), 1);
        assert_eq!(c.pending_count(), 1, "a finalizing checkpoint is in flight");
        assert!(!storage.exists(&metadata_path("job", 1)).unwrap());
        assert!(c.drain_messages().is_empty());
        let tasks = c.drain_storage();
        assert_eq!(format!("{tasks:?}"), "[Finalize(1)]");
        let finalized: Vec<Finalized> = tasks.into_iter().filter_map(StorageTask::run).collect();
        assert!(storage.exists(&metadata_path("job", 1)).unwrap());
        assert_eq!(
            c.completed_total(),
            0,
            "complete once the result is reported"
        );
        let done: Vec<u64> = finalized
            .into_iter()
            .flat_map(|f| c.on_finalized(f, now).unwrap())
            .collect();
        assert_eq!(done, vec![1]);
        let sent = c.drain_messages();
        assert_eq!(
            sent,
            vec![(0, TaskMessage::Complete(1)), (1, TaskMessage::Complete(1))]
        );
    }

    /// A `_metadata` write that fails aborts the checkpoint: the subtasks are told, it
    /// counts as a failed checkpoint, and nothing commits.
    #[test]
    fn a_failed_finalization_aborts_the_checkpoint() {
        let (mut c, _, t0) = coordinator(0);
        let now = t0 + Duration::from_millis(100);
        c.maybe_trigger(now, false);
        c.drain_messages();
        c.on_ack(ack(1, 0), now).unwrap();
        c.on_ack(ack(1, 1), now).unwrap();
        c.drain_storage();
        let err = c
            .on_finalized(
                Finalized {
                    id: 1,
                    result: Err("disk full".into()),
                },
                now,
            )
            .unwrap_err();
        assert!(err.reason.contains("disk full"), "{err}");
        assert_eq!(c.pending_count(), 0);
        assert_eq!(c.failed_total(), 1);
        assert_eq!(
            c.drain_messages(),
            vec![(0, TaskMessage::Aborted(1)), (1, TaskMessage::Aborted(1))]
        );
    }

    #[test]
    fn subsumed_declines_do_not_count_as_failed_checkpoints() {
        // No failure tolerated: a single counted failure fails the job.
        let (mut c, _, t0) = coordinator(0);
        let now = t0 + Duration::from_millis(100);
        for id in 1..=3 {
            assert_eq!(
                c.maybe_trigger(now + Duration::from_secs(id), false),
                Some(id)
            );
            c.on_decline(id, 0, &DeclineCause::Subsumed, now)
                .expect("a subsumed checkpoint is not a failure");
        }
        let sent = c.drain_messages();
        assert!(sent.contains(&(1, TaskMessage::Aborted(3))), "{sent:?}");
        let id = c
            .maybe_trigger(now + Duration::from_secs(10), false)
            .unwrap();
        let err = c
            .on_decline(id, 0, &DeclineCause::Failed("disk full".into()), now)
            .unwrap_err();
        assert_eq!(err.id, id);
        assert!(err.reason.contains("disk full"), "{err}");
    }

    #[test]
    fn declines_of_another_attempt_are_ignored() {
        let (mut c, _, t0) = coordinator(0);
        let id = c.maybe_trigger(t0 + Duration::from_secs(1), false).unwrap();
        c.on_decline(id, 7, &DeclineCause::Failed("old".into()), t0)
            .expect("an old attempt's decline is stale");
        assert_eq!(c.pending_count(), 1);
    }

    #[test]
    fn a_checkpoint_past_its_timeout_is_aborted_at_the_given_instant() {
        let (mut c, _, t0) = coordinator(1);
        let start = t0 + Duration::from_secs(1);
        let id = c.maybe_trigger(start, false).unwrap();
        c.check_timeouts(start + Duration::from_secs(10)).unwrap();
        assert_eq!(c.pending_count(), 1, "exactly at the timeout it still runs");
        c.check_timeouts(start + Duration::from_millis(10_001))
            .unwrap();
        assert_eq!(c.pending_count(), 0);
        assert!(c.drain_messages().contains(&(0, TaskMessage::Aborted(id))));
    }
}
