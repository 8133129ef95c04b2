//! The checkpoint coordinator (R1–R4).
//!
//! It triggers checkpoint n by sending [`Mail::TriggerCheckpoint`] to every source subtask,
//! collects one [`TaskAck`] per subtask, and when all arrived writes `_metadata` last and
//! atomically, notifies every subtask, and deletes checkpoints beyond the retained count.
//! Checkpoints complete strictly in id order. A checkpoint that a subtask declines, or that
//! exceeds the timeout, is aborted and its directory removed; more consecutive failures than
//! tolerated fail the job.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::{debug, warn};

use super::{now_ms, CheckpointMetadata, OperatorMetadata, SubtaskStateHandle, TaskAck};
use crate::runtime::channel::{Barrier, BarrierKind, Mail, MailboxHandle};
use crate::storage::format::{encode, FileKind};
use crate::storage::layout::{checkpoint_dir, metadata_path, parse_checkpoint_dir};
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
    /// Its mailbox.
    pub mailbox: MailboxHandle,
    /// Operators of its chain: (uid, parallelism).
    pub operators: Vec<(String, u32)>,
}

struct Pending {
    barrier: Barrier,
    started: Instant,
    acks: Vec<Option<TaskAck>>,
    remaining: usize,
}

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
    retained: VecDeque<u64>,
    last_trigger: Option<Instant>,
    last_completion: Option<Instant>,
    consecutive_failures: u32,
    completed: Vec<CompletedCheckpoint>,
    failed_total: u64,
    triggered_total: u64,
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
    pub fn new(
        settings: CheckpointSettings,
        storage: Arc<dyn CheckpointStorage>,
        job_id: String,
        job_name: String,
        max_parallelism: u32,
        min_next_id: u64,
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
            retained: VecDeque::new(),
            last_trigger: None,
            last_completion: None,
            consecutive_failures: 0,
            completed: Vec::new(),
            failed_total: 0,
            triggered_total: 0,
        }
    }

    /// Registers a checkpoint this job restored from (claimed): it counts as retained, so it is
    /// deleted once enough newer ones completed.
    pub fn adopt_retained(&mut self, id: u64) {
        if !self.retained.contains(&id) {
            self.retained.push_back(id);
        }
    }

    /// The job id (checkpoint directory name).
    pub fn job_id(&self) -> &str {
        &self.job_id
    }

    /// Sets the subtasks (all of them, in global order) and the attempt each belongs to, after
    /// a (re)deployment of some or all of them; in-flight checkpoints are aborted, since they
    /// wait for subtasks that are gone.
    pub fn set_tasks(&mut self, tasks: Vec<TaskInfo>, attempts: Vec<u32>) {
        let ids: Vec<u64> = self.pending.keys().copied().collect();
        for id in ids {
            self.pending.remove(&id);
            for t in &tasks {
                let _ = t.mailbox.send(Mail::CheckpointAborted(id));
            }
            self.remove_dir(id);
        }
        self.attempts = attempts;
        self.tasks = tasks;
        // The first checkpoint of a (re)deployment comes one interval later, as in Flink.
        self.last_trigger = Some(Instant::now());
    }

    /// Checkpoints completed during this run, oldest first.
    pub fn completed(&self) -> &[CompletedCheckpoint] {
        &self.completed
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
        self.pending.len()
    }

    /// Whether another checkpoint may start now (fewer than max-concurrent in flight).
    pub fn has_room(&self) -> bool {
        self.pending.len() < self.settings.max_concurrent as usize
    }

    /// When the next periodic trigger is due.
    pub fn next_trigger_at(&self, now: Instant) -> Instant {
        let by_interval = self
            .last_trigger
            .map_or(now, |t| t + self.settings.interval);
        let by_pause = self
            .last_completion
            .map_or(now, |t| t + self.settings.min_pause);
        by_interval.max(by_pause)
    }

    /// Triggers a checkpoint if one is due (or `force`d, for the final checkpoint) and fewer
    /// than max-concurrent are in flight. Returns its id.
    pub fn maybe_trigger(&mut self, force: bool) -> Option<u64> {
        if self.tasks.is_empty() || self.pending.len() >= self.settings.max_concurrent as usize {
            return None;
        }
        let now = Instant::now();
        if !force && now < self.next_trigger_at(now) {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let barrier = Barrier {
            id,
            timestamp_ms: now_ms(),
            aligned_only: force,
        };
        // The final checkpoint (forced) is aligned, so that no in-flight data is left to be
        // processed after the sinks' last pre-commit.
        let kind = if force {
            BarrierKind::Aligned
        } else {
            self.settings.barrier_kind
        };
        self.pending.insert(
            id,
            Pending {
                barrier,
                started: now,
                acks: vec![None; self.tasks.len()],
                remaining: self.tasks.len(),
            },
        );
        self.last_trigger = Some(now);
        self.triggered_total += 1;
        debug!(checkpoint = id, "triggering checkpoint");
        for t in self.tasks.iter().filter(|t| t.is_source) {
            // A closed mailbox means the task is gone; the attempt is failing anyway.
            let _ = t.mailbox.send(Mail::TriggerCheckpoint(barrier, kind));
        }
        Some(id)
    }

    /// A subtask acknowledged. Returns the ids of checkpoints that completed as a result.
    pub fn on_ack(&mut self, ack: TaskAck) -> Result<Vec<u64>, TooManyFailures> {
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
        self.complete_ready()
    }

    /// A subtask declined checkpoint `id` (alignment cancelled, snapshot failed).
    pub fn on_decline(
        &mut self,
        id: u64,
        attempt: u32,
        reason: &str,
    ) -> Result<(), TooManyFailures> {
        if !self.attempts.contains(&attempt) || !self.pending.contains_key(&id) {
            return Ok(());
        }
        self.abort(id, reason)
    }

    /// Aborts checkpoints that exceeded the timeout.
    pub fn check_timeouts(&mut self) -> Result<(), TooManyFailures> {
        let expired: Vec<u64> = self
            .pending
            .iter()
            .filter(|(_, p)| p.started.elapsed() > self.settings.timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.abort(id, "expired before completing")?;
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

    fn abort(&mut self, id: u64, reason: &str) -> Result<(), TooManyFailures> {
        self.pending.remove(&id);
        warn!(checkpoint = id, "checkpoint {id} failed: {reason}");
        for t in &self.tasks {
            let _ = t.mailbox.send(Mail::CheckpointAborted(id));
        }
        self.remove_dir(id);
        self.failed_total += 1;
        self.consecutive_failures += 1;
        self.last_completion = Some(Instant::now());
        if self.consecutive_failures > self.settings.tolerable_failed {
            return Err(TooManyFailures {
                tolerable: self.settings.tolerable_failed,
                id,
                reason: reason.to_string(),
            });
        }
        Ok(())
    }

    fn remove_dir(&self, id: u64) {
        // An upload of an aborted checkpoint may still be adding a file while the directory is
        // removed; try again a few times (a late acknowledgement removes it again anyway).
        let path = checkpoint_dir(&self.job_id, id);
        let mut last = None;
        for _ in 0..3 {
            match self.storage.delete(&path) {
                Ok(()) => return,
                Err(e) => last = Some(e),
            }
        }
        if let Some(e) = last {
            debug!("cannot remove checkpoint {id} yet: {e}");
        }
    }

    fn complete_ready(&mut self) -> Result<Vec<u64>, TooManyFailures> {
        let mut done = Vec::new();
        while let Some(entry) = self.pending.first_entry() {
            if entry.get().remaining > 0 {
                break;
            }
            let p = entry.remove();
            let id = p.barrier.id;
            match self.finalize(p) {
                Ok(meta) => {
                    crate::failpoint::hit("checkpoint-completed", id);
                    self.consecutive_failures = 0;
                    self.last_completion = Some(Instant::now());
                    for t in &self.tasks {
                        let _ = t.mailbox.send(Mail::CheckpointComplete(id));
                    }
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
                        metadata: Arc::new(meta),
                    });
                    self.retained.push_back(id);
                    self.apply_retention();
                    done.push(id);
                }
                Err(reason) => {
                    // The metadata could not be written: the checkpoint does not exist.
                    self.abort(id, &reason)?;
                }
            }
        }
        Ok(done)
    }

    fn finalize(&self, p: Pending) -> Result<CheckpointMetadata, String> {
        let id = p.barrier.id;
        let mut operators: BTreeMap<String, OperatorMetadata> = BTreeMap::new();
        let mut tasks = Vec::with_capacity(p.acks.len());
        let mut state_size = 0;
        for (ack, info) in p.acks.into_iter().zip(&self.tasks) {
            let Some(ack) = ack else {
                return Err("an acknowledgement is missing".into());
            };
            state_size += ack.stats.state_size;
            if let Some(file) = &ack.file {
                for uid in &ack.uids {
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
                        });
                    op.subtasks.push(SubtaskStateHandle {
                        subtask: info.subtask,
                        file: file.clone(),
                    });
                }
            }
            tasks.push(ack.stats);
        }
        let meta = CheckpointMetadata {
            job_id: self.job_id.clone(),
            job_name: self.job_name.clone(),
            checkpoint_id: id,
            trigger_timestamp_ms: p.barrier.timestamp_ms,
            completed_timestamp_ms: now_ms().max(p.barrier.timestamp_ms),
            max_parallelism: self.max_parallelism,
            operators: operators.into_values().collect(),
            state_size,
            tasks,
        };
        let bytes = encode(FileKind::Metadata, &meta).map_err(|e| e.to_string())?;
        self.storage
            .write_atomic(&metadata_path(&self.job_id, id), &bytes)
            .map_err(|e| e.to_string())?;
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
            for name in self.storage.list(&self.job_id).unwrap_or_default() {
                if let Some(id) = parse_checkpoint_dir(&name) {
                    if id < oldest && !self.pending.contains_key(&id) {
                        self.remove_dir(id);
                    }
                }
            }
        }
    }
}
