//! The live status of a job, shared between the job master (which updates it) and observers
//! such as the REST API (which read it and may request a cancel).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use crossbeam_channel::{Receiver, Sender};
use serde::{Deserialize, Serialize};

use crate::checkpoint::CheckpointMetadata;

pub use super::lifecycle::{Actor, JobState, Lifecycle, Transition};

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

/// Where a savepoint request stands (Flink's `IN_PROGRESS` / `COMPLETED` with a failure
/// cause or a location).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub enum SavepointState {
    /// Requested, not written yet.
    InProgress,
    /// Written to `location`.
    Completed { location: String },
    /// Not taken.
    Failed { cause: String },
}

/// A savepoint request of a job.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SavepointStatus {
    /// The request id (Flink's trigger id).
    pub request_id: String,
    /// Stop-with-savepoint.
    pub stop: bool,
    /// When it was requested, in ms since the epoch.
    #[serde(default)]
    pub requested_ms: u64,
    /// Where it stands.
    pub state: SavepointState,
    /// Someone outside the job master (a REST client) waits for the outcome.
    pub watched: bool,
    /// The outcome was handed to whoever waits for it.
    pub reported: bool,
}

/// What a requested savepoint is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SavepointKind {
    /// The job goes on running.
    Intermediate,
    /// Stop-with-savepoint: the sources stop at its barrier and the job ends.
    Stop,
    /// Stop-with-savepoint after the maximum watermark (Flink's `stop --drain`): every
    /// event-time timer and window fires before the savepoint, ending event time for good.
    StopAndDrain,
}

impl SavepointKind {
    /// The job ends with this savepoint.
    pub fn stops(self) -> bool {
        self != SavepointKind::Intermediate
    }
}

/// A request to the job master from outside it (REST API, command line, signal handler).
#[derive(Debug, Clone)]
pub enum JobCommand {
    /// Take a savepoint of `kind` under `target_dir`.
    Savepoint {
        request_id: String,
        target_dir: PathBuf,
        kind: SavepointKind,
    },
}

/// A new id for an asynchronous request (Flink's trigger ids: 32 hex digits).
pub fn new_request_id() -> String {
    format!("{:032x}", fastrand::u128(..))
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
    /// The transitions that led to it, with their times and causes (bounded).
    pub lifecycle: Lifecycle,
    /// Start time (ms since the Unix epoch).
    pub start_time: u64,
    /// End time, once terminal.
    pub end_time: Option<u64>,
    /// Restarts so far.
    pub restarts: u32,
    /// Last failure, if any.
    pub failure_cause: Option<String>,
    /// Restarts by cause (task, injected, worker-lost, checkpoint, job), in name order.
    pub restart_causes: Vec<(String, u64)>,
    /// The job's failures, oldest first (at most [`EXCEPTIONS_MAX`], the newest kept).
    pub exceptions: Vec<ExceptionView>,
    /// Checkpoint counts.
    pub checkpoint_counts: CheckpointCounts,
    /// The most recent completed checkpoints, newest last (at most [`HISTORY_MAX`]).
    pub checkpoint_history: Vec<CheckpointMetadata>,
    /// Effective configuration (key, value).
    pub config: Vec<(String, String)>,
    /// Savepoint requests, oldest first.
    pub savepoints: Vec<SavepointStatus>,
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
    /// The vertices feeding it, in edge order.
    #[serde(default)]
    pub inputs: Vec<VertexInput>,
}

/// An input of a task vertex: the upstream vertex and how records are shipped.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct VertexInput {
    /// Index of the upstream vertex (in graph order).
    pub vertex: usize,
    /// `FORWARD`, `HASH`, `REBALANCE` or `BROADCAST` (Flink's ship strategies).
    pub ship_strategy: String,
}

/// One failure of the job, as observers see it (Flink's exception history entry).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExceptionView {
    /// When it happened (ms since the Unix epoch).
    pub timestamp: u64,
    /// What failed.
    pub cause: String,
    /// Its kind: task, injected, worker-lost, checkpoint or job.
    pub kind: String,
    /// Whether the job restarted (else it failed for good, or the failure was not restarted).
    pub restarted: bool,
}

/// Failures kept in the status for observers.
pub const EXCEPTIONS_MAX: usize = 32;

/// Completed checkpoints kept in the status for observers.
pub const HISTORY_MAX: usize = 100;

/// A job's shared status.
pub struct JobStatus {
    view: RwLock<JobStatusView>,
    history: RwLock<VecDeque<CheckpointMetadata>>,
    cancel: AtomicBool,
    commands: Mutex<Vec<JobCommand>>,
    completed_seen: std::sync::atomic::AtomicUsize,
    /// Wakes the job master when a command or a cancel is requested (capacity 1: one pending
    /// nudge is enough, the master takes every command when it wakes).
    nudge: (Sender<()>, Receiver<()>),
    /// Called with the view of the job as it enters a terminal state, before anyone can see
    /// that state (a coordinator records the end durably first).
    on_end: Mutex<Option<EndHook>>,
}

/// See [`JobStatus::on_end`].
pub type EndHook = Box<dyn Fn(&JobStatusView) + Send + Sync>;

impl std::fmt::Debug for JobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobStatus")
            .field("view", &self.view)
            .field("cancel", &self.cancel)
            .finish_non_exhaustive()
    }
}

impl JobStatus {
    /// A status in state CREATED.
    pub fn new(jid: String, name: String, config: Vec<(String, String)>) -> Arc<Self> {
        let now = crate::checkpoint::now_ms();
        Arc::new(JobStatus {
            view: RwLock::new(JobStatusView {
                jid,
                name,
                state: JobState::Created,
                lifecycle: Lifecycle::new(now),
                start_time: now,
                end_time: None,
                restarts: 0,
                failure_cause: None,
                restart_causes: Vec::new(),
                exceptions: Vec::new(),
                checkpoint_counts: CheckpointCounts::default(),
                checkpoint_history: Vec::new(),
                config,
                savepoints: Vec::new(),
                vertices: Vec::new(),
                max_parallelism: 0,
            }),
            history: RwLock::new(VecDeque::new()),
            cancel: AtomicBool::new(false),
            commands: Mutex::new(Vec::new()),
            completed_seen: std::sync::atomic::AtomicUsize::new(0),
            nudge: crossbeam_channel::bounded(1),
            on_end: Mutex::new(None),
        })
    }

    /// The status of a job that ended before this process knew it (read back from a record).
    pub fn ended(
        jid: String,
        name: String,
        state: JobState,
        cause: Option<String>,
        (start_time, end_time): (u64, u64),
        restarts: u32,
    ) -> Arc<Self> {
        let status = JobStatus::new(jid, name, Vec::new());
        status.update(|v| {
            v.lifecycle = Lifecycle::recorded(start_time, state, end_time, cause.clone());
            v.state = state;
            v.start_time = start_time;
            v.end_time = Some(end_time);
            v.failure_cause = cause;
            v.restarts = restarts;
        });
        status
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

    /// Moves the job to `state` through its [`Lifecycle`], as `actor`, with `cause`; a
    /// terminal state also sets the end time, a failure its cause. A transition the lifecycle
    /// does not allow changes nothing and is returned as an error (a job that ended stays as it
    /// ended).
    pub fn transition(
        &self,
        state: JobState,
        actor: Actor,
        cause: Option<String>,
    ) -> Result<(), String> {
        let mut result = Ok(());
        self.update(|v| {
            let now = crate::checkpoint::now_ms();
            let failure = matches!(state, JobState::Failing | JobState::Failed);
            if let Err(e) = v.lifecycle.apply(state, actor, cause.clone(), now) {
                result = Err(e);
                return;
            }
            v.state = state;
            if state.is_ended() && v.end_time.is_none() {
                v.end_time = Some(now);
            }
            if failure {
                if let Some(c) = cause {
                    v.failure_cause = Some(c);
                }
            }
            if state.is_terminal() {
                let hook = self.on_end.lock().unwrap_or_else(|p| p.into_inner());
                if let Some(hook) = hook.as_ref() {
                    hook(v);
                }
            }
        });
        result
    }

    /// Calls `hook` with the job's view when it enters a terminal state, before the state is
    /// visible to anyone else (the view's lock is held): whoever must record the end durably
    /// first does it there.
    pub fn on_end(&self, hook: impl Fn(&JobStatusView) + Send + Sync + 'static) {
        let mut slot = self.on_end.lock().unwrap_or_else(|p| p.into_inner());
        *slot = Some(Box::new(hook));
    }

    /// Sets the state as the job master does (the transition must be allowed; a refused one
    /// is logged and changes nothing).
    pub fn set_state(&self, state: JobState) {
        if let Err(e) = self.transition(state, Actor::JobMaster, None) {
            tracing::debug!("job {}: {e}", self.jid());
        }
    }

    /// Fails a job that has not ended, as `actor`, with `cause` as its failure cause and an
    /// entry in its exceptions (a failure before or around the job master: nothing restarts
    /// it). A job that already ended keeps its end. Returns whether the job was failed here.
    pub fn fail(&self, actor: Actor, cause: &str) -> bool {
        let state = self.view_state();
        if state.is_ended() {
            return false;
        }
        if state != JobState::Created && state != JobState::Cancelling {
            let _ = self.transition(JobState::Failing, Actor::JobMaster, Some(cause.into()));
        }
        if self
            .transition(JobState::Failed, actor, Some(cause.into()))
            .is_err()
        {
            return false;
        }
        self.update(|v| {
            v.exceptions.push(ExceptionView {
                timestamp: crate::checkpoint::now_ms(),
                cause: cause.into(),
                kind: "job".into(),
                restarted: false,
            });
            if v.exceptions.len() > EXCEPTIONS_MAX {
                v.exceptions.remove(0);
            }
        });
        true
    }

    /// The job's id.
    pub fn jid(&self) -> String {
        match self.view.read() {
            Ok(v) => v.jid.clone(),
            Err(p) => p.into_inner().jid.clone(),
        }
    }

    /// The job's current state.
    pub fn view_state(&self) -> JobState {
        match self.view.read() {
            Ok(v) => v.state,
            Err(p) => p.into_inner().state,
        }
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

    /// Asks the job master for a savepoint of `kind` under `target_dir`; returns the request
    /// id to follow it by ([`JobStatusView::savepoints`]).
    /// `watched`: a client will fetch the outcome ([`JobStatus::savepoint_reported`]), so an
    /// embedded run keeps answering until it did.
    pub fn request_savepoint(
        &self,
        target_dir: PathBuf,
        kind: SavepointKind,
        watched: bool,
    ) -> String {
        let request_id = new_request_id();
        self.update(|v| {
            v.savepoints.push(SavepointStatus {
                request_id: request_id.clone(),
                stop: kind.stops(),
                requested_ms: crate::checkpoint::now_ms(),
                state: SavepointState::InProgress,
                watched,
                reported: false,
            })
        });
        let command = JobCommand::Savepoint {
            request_id: request_id.clone(),
            target_dir,
            kind,
        };
        match self.commands.lock() {
            Ok(mut c) => c.push(command),
            Err(p) => p.into_inner().push(command),
        }
        let _ = self.nudge.0.try_send(());
        request_id
    }

    /// Takes the commands requested since the last call.
    pub fn take_commands(&self) -> Vec<JobCommand> {
        match self.commands.lock() {
            Ok(mut c) => std::mem::take(&mut *c),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        }
    }

    /// Records how savepoint request `request_id` ended.
    pub fn savepoint_ended(&self, request_id: &str, state: SavepointState) {
        self.update(|v| {
            if let Some(s) = v.savepoints.iter_mut().find(|s| s.request_id == request_id) {
                s.state = state;
            }
        });
    }

    /// The outcome of savepoint request `request_id` was handed to the client waiting for it.
    pub fn savepoint_reported(&self, request_id: &str) {
        self.update(|v| {
            if let Some(s) = v.savepoints.iter_mut().find(|s| s.request_id == request_id) {
                s.reported = true;
            }
        });
    }

    /// Whether every savepoint outcome a client waits for was handed to it.
    pub fn savepoints_reported(&self) -> bool {
        self.view()
            .savepoints
            .iter()
            .all(|s| !s.watched || s.reported || s.state == SavepointState::InProgress)
    }

    /// Asks the job to cancel: a job that has not ended goes to CANCELLING at once (the job
    /// master, or whoever holds the job before it runs, ends it as CANCELED).
    pub fn request_cancel(&self) {
        let _ = self.transition(
            JobState::Cancelling,
            Actor::User,
            Some("cancelled by a user".into()),
        );
        self.cancel.store(true, Ordering::Release);
        let _ = self.nudge.0.try_send(());
    }

    /// Ready when a command or a cancel was requested: the job master waits on it beside its
    /// events, so that it acts on a request at once.
    pub fn nudges(&self) -> Receiver<()> {
        self.nudge.1.clone()
    }

    /// Whether a cancel was requested.
    pub fn cancel_requested(&self) -> bool {
        self.cancel.load(Ordering::Acquire)
    }
}
