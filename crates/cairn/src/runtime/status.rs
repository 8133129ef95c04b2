//! The live status of a job, shared between the job master (which updates it) and observers
//! such as the REST API (which read it and may request a cancel).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use crate::checkpoint::CheckpointMetadata;

/// Flink's job states (the subset cairn uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Accepted, not yet deployed.
    Created,
    /// Tasks are running.
    Running,
    /// A failure happened; tasks are being restored.
    Restarting,
    /// All tasks finished.
    Finished,
    /// Failed for good.
    Failed,
    /// Cancelled by the user.
    Canceled,
}

impl JobState {
    /// Whether the job will not change state again.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Canceled
        )
    }
}

/// How many checkpoints are in which state.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CheckpointCounts {
    /// Triggered so far.
    pub triggered: u64,
    /// In flight now.
    pub in_progress: u64,
    /// Completed.
    pub completed: u64,
    /// Failed or aborted.
    pub failed: u64,
}

/// What observers can see of a job.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobStatusView {
    /// Job id.
    pub jid: String,
    /// Job name.
    pub name: String,
    /// Current state.
    pub state: JobState,
    /// Start time (ms since the Unix epoch).
    pub start_time: u64,
    /// End time, once terminal.
    pub end_time: Option<u64>,
    /// Restarts so far.
    pub restarts: u32,
    /// Last failure, if any.
    pub failure_cause: Option<String>,
    /// Checkpoint counts.
    pub checkpoint_counts: CheckpointCounts,
    /// The most recent completed checkpoints, newest last (at most [`HISTORY_MAX`]).
    pub checkpoint_history: Vec<CheckpointMetadata>,
    /// Effective configuration (key, value).
    pub config: Vec<(String, String)>,
    /// The task vertices (chains) of the job, in graph order; empty until the job is planned.
    pub vertices: Vec<VertexView>,
    /// Number of key groups (`pipeline.max-parallelism`); 0 until the job is planned.
    pub max_parallelism: u32,
}

/// One task vertex (a chain of operators) as observers see it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VertexView {
    /// The task's name (as in checkpoint statistics).
    pub name: String,
    /// Its number of subtasks.
    pub parallelism: u32,
}

/// Completed checkpoints kept in the status for observers.
pub const HISTORY_MAX: usize = 100;

/// A job's shared status.
#[derive(Debug)]
pub struct JobStatus {
    view: RwLock<JobStatusView>,
    history: RwLock<VecDeque<CheckpointMetadata>>,
    cancel: AtomicBool,
    completed_seen: std::sync::atomic::AtomicUsize,
}

impl JobStatus {
    /// A status in state CREATED.
    pub fn new(jid: String, name: String, config: Vec<(String, String)>) -> Arc<Self> {
        Arc::new(JobStatus {
            view: RwLock::new(JobStatusView {
                jid,
                name,
                state: JobState::Created,
                start_time: crate::checkpoint::now_ms(),
                end_time: None,
                restarts: 0,
                failure_cause: None,
                checkpoint_counts: CheckpointCounts::default(),
                checkpoint_history: Vec::new(),
                config,
                vertices: Vec::new(),
                max_parallelism: 0,
            }),
            history: RwLock::new(VecDeque::new()),
            cancel: AtomicBool::new(false),
            completed_seen: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    /// A copy of the current status.
    pub fn view(&self) -> JobStatusView {
        let mut v = match self.view.read() {
            Ok(v) => v.clone(),
            Err(p) => p.into_inner().clone(),
        };
        if let Ok(h) = self.history.read() {
            v.checkpoint_history = h.iter().cloned().collect();
        }
        v
    }

    /// Applies a change.
    pub fn update(&self, f: impl FnOnce(&mut JobStatusView)) {
        match self.view.write() {
            Ok(mut v) => f(&mut v),
            Err(p) => f(&mut p.into_inner()),
        }
    }

    /// Sets the state; a terminal state also sets the end time.
    pub fn set_state(&self, state: JobState) {
        self.update(|v| {
            v.state = state;
            if state.is_terminal() {
                v.end_time = Some(crate::checkpoint::now_ms());
            }
        });
    }

    /// Records a completed checkpoint.
    pub fn checkpoint_completed(&self, meta: CheckpointMetadata) {
        if let Ok(mut h) = self.history.write() {
            h.push_back(meta);
            while h.len() > HISTORY_MAX {
                h.pop_front();
            }
        }
    }

    /// How many completed checkpoints the job master has already recorded here.
    pub fn view_completed_count(&self) -> usize {
        self.completed_seen.load(Ordering::Acquire)
    }

    /// Sets how many completed checkpoints are recorded.
    pub fn set_completed_count(&self, n: usize) {
        self.completed_seen.store(n, Ordering::Release);
    }

    /// Asks the job to cancel.
    pub fn request_cancel(&self) {
        self.cancel.store(true, Ordering::Release);
    }

    /// Whether a cancel was requested.
    pub fn cancel_requested(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
}
