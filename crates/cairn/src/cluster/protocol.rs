//! Messages between coordinator and workers (control connections) and between workers (data
//! connections). Both travel as [`super::frame`]s.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::checkpoint::{DeclineCause, TaskAck};
use crate::error::TaskError;
use crate::runtime::channel::{ControlMail, DataFrame};

/// Worker → coordinator.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToCoordinator {
    /// First message: who the worker is.
    Register {
        /// Shared cluster secret.
        secret: String,
        /// Task slots offered.
        slots: u32,
        /// Where other workers reach its data port.
        data_addr: String,
    },
    /// Still alive.
    Heartbeat,
    /// Something a subtask reports to its job master.
    Event {
        /// Job id.
        job_id: String,
        /// The event.
        event: WireEvent,
    },
    /// The answer to [`ToWorker::CheckJob`]: None if this worker builds the same plan.
    JobChecked {
        /// Job id.
        job_id: String,
        /// Attempt.
        attempt: u32,
        /// Why this worker cannot run the job (it does not have it, or plans another graph).
        refusal: Option<String>,
    },
    /// Every subtask of the attempt stopped.
    AttemptCancelled {
        /// Job id.
        job_id: String,
        /// Attempt.
        attempt: u32,
    },
    /// The metrics of the worker's subtasks (about once a second, while it has any), for the
    /// coordinator's REST API.
    Metrics(Vec<crate::metrics::SubtaskSnapshot>),
    /// The worker leaves on purpose (SIGTERM: Kubernetes scales it in or moves it): its
    /// subtasks fail over without spending the jobs' restart budgets. The coordinator closes
    /// the connection in answer.
    Leaving,
}

/// A subtask's report, as it crosses the network.
#[derive(Debug, Serialize, Deserialize)]
pub enum WireEvent {
    /// Checkpoint acknowledgement.
    Ack(TaskAck),
    /// Checkpoint declined.
    Decline {
        /// Checkpoint id.
        checkpoint_id: u64,
        /// Attempt.
        attempt: u32,
        /// Why.
        cause: DeclineCause,
    },
    /// A source read all its splits.
    SourceExhausted {
        /// Attempt.
        attempt: u32,
        /// Global task index.
        task: usize,
    },
    /// A subtask ended.
    Exited {
        /// Attempt.
        attempt: u32,
        /// Global task index.
        task: usize,
        /// None on success.
        error: Option<WireTaskError>,
    },
}

/// Why a subtask ended early, as sent to the coordinator.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum WireTaskError {
    /// It was cancelled.
    Cancelled,
    /// It failed; a restart may fix it.
    Failed(String),
    /// It failed in a way no restart can fix.
    Unrecoverable(String),
    /// A failure injected by `--inject-failures` (so the coordinator counts it as one).
    Injected {
        /// Which of the planned failures.
        index: usize,
        /// The record it fired at.
        record: u64,
        /// The operator it fired in.
        uid: String,
    },
}

impl From<&TaskError> for WireTaskError {
    fn from(e: &TaskError) -> Self {
        match e {
            TaskError::Cancelled => WireTaskError::Cancelled,
            TaskError::Unrecoverable(m) => WireTaskError::Unrecoverable(m.clone()),
            TaskError::Injected { index, record, uid } => WireTaskError::Injected {
                index: *index,
                record: *record,
                uid: uid.clone(),
            },
            TaskError::Failed(m) => WireTaskError::Failed(m.clone()),
        }
    }
}

impl From<WireTaskError> for TaskError {
    fn from(e: WireTaskError) -> Self {
        match e {
            WireTaskError::Cancelled => TaskError::Cancelled,
            WireTaskError::Failed(m) => TaskError::Failed(m),
            WireTaskError::Unrecoverable(m) => TaskError::Unrecoverable(m),
            WireTaskError::Injected { index, record, uid } => {
                TaskError::Injected { index, record, uid }
            }
        }
    }
}

/// Where the checkpoint to restore is.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RestoreRef {
    /// Checkpoint storage root directory (shared by all processes).
    pub root: PathBuf,
    /// Job directory name.
    pub job_id: String,
    /// Checkpoint id.
    pub checkpoint_id: u64,
    /// A self-contained savepoint: `root` is its directory (job id and checkpoint id are
    /// whatever its `_metadata` says).
    pub savepoint: bool,
}

/// What a worker must run for one attempt.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeploySpec {
    /// Job id.
    pub job_id: String,
    /// Attempt.
    pub attempt: u32,
    /// Registered job name.
    pub job: String,
    /// The job's parameters as JSON text (postcard cannot carry a JSON value).
    pub params: String,
    /// The run's seed.
    pub seed: u64,
    /// The plan's fingerprint as the coordinator computed it; a worker that plans another
    /// refuses the deployment.
    pub fingerprint: String,
    /// Failures to inject (each worker plans them over its own subtasks).
    pub inject: Option<crate::runtime::InjectSpec>,
    /// Only into tasks whose head operator uid starts with this.
    pub inject_uid: Option<String>,
    /// Checkpoint directory.
    pub checkpoint_dir: Option<PathBuf>,
    /// The job's effective configuration as YAML, as the job master runs it (workers must not
    /// derive their own: defaults applied by the coordinator would differ). Text, because the
    /// configuration's serde shape is not one postcard can carry.
    pub config_yaml: String,
    /// Checkpoint to restore from.
    pub restore: Option<RestoreRef>,
    /// Worker id of every global task index.
    pub assignment: Vec<u32>,
    /// The global task indices this deployment starts (a pipelined region, or all).
    pub deploy_mask: Vec<bool>,
    /// Data address of every worker in the assignment.
    pub workers: Vec<(u32, String)>,
    /// The sources start stopped: the checkpoint restored from is a completed
    /// stop-with-savepoint, so nothing after it may be read; end of input follows.
    pub sources_stopped: bool,
}

/// Coordinator → worker.
#[derive(Debug, Serialize, Deserialize)]
pub enum ToWorker {
    /// Registration accepted.
    Registered {
        /// The worker's id.
        worker_id: u32,
        /// The coordinator's heartbeat timeout: it declares a worker silent for this long dead,
        /// and the worker, in turn, a coordinator it hears nothing from for this long gone (the
        /// coordinator heartbeats several times within it). Also the write timeout of the
        /// worker's cluster sockets.
        heartbeat_timeout_ms: u64,
    },
    /// Registration refused.
    Rejected {
        /// Why.
        reason: String,
    },
    /// Run subtasks of an attempt.
    Deploy(Box<DeploySpec>),
    /// Before a deployment: can the worker build this job, and does it plan the same graph?
    /// Answered by [`ToCoordinator::JobChecked`]; nothing is started.
    CheckJob(Box<DeploySpec>),
    /// Control mail for a subtask.
    Mail {
        /// Job id.
        job_id: String,
        /// Attempt.
        attempt: u32,
        /// Global task index.
        task: usize,
        /// The mail.
        mail: ControlMail,
    },
    /// Stop every subtask of an attempt.
    CancelAttempt {
        /// Job id.
        job_id: String,
        /// Attempt.
        attempt: u32,
    },
    /// The coordinator is still alive.
    Heartbeat,
    /// The job reached a terminal state: the worker cancels whatever attempt of it it still
    /// has and forgets it (its failure injector, its counters, its metric series).
    JobEnded {
        /// Job id.
        job_id: String,
    },
}

/// Worker ↔ worker, on a data connection.
#[derive(Debug, Serialize, Deserialize)]
pub enum DataMsg {
    /// First message of the connecting worker.
    Hello {
        /// Shared cluster secret.
        secret: String,
        /// Job id.
        job_id: String,
        /// Attempt.
        attempt: u32,
    },
    /// A channel's frame, towards the receiving task.
    Frame {
        /// Global index of the receiving task.
        task: u32,
        /// Its input channel.
        channel: u32,
        /// The frame.
        frame: DataFrame,
    },
    /// A credit back to the sender of a channel.
    Credit {
        /// Global index of the receiving task.
        task: u32,
        /// Its input channel.
        channel: u32,
    },
    /// Either end is still there: sent in each direction that carried nothing for a while, so
    /// that a reader that hears nothing for the I/O timeout knows the link is dead.
    Keepalive,
}

/// Compares secrets in constant time.
pub fn secrets_match(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The coordinator counts restarts by cause: an injected failure must stay one over the wire.
    #[test]
    fn task_errors_keep_their_kind_over_the_wire() {
        let injected = TaskError::Injected {
            index: 1,
            record: 42,
            uid: "count".into(),
        };
        let back = TaskError::from(WireTaskError::from(&injected));
        assert!(
            matches!(&back, TaskError::Injected { index: 1, record: 42, uid } if uid == "count"),
            "{back:?}"
        );
        assert_eq!(back.to_string(), injected.to_string());
        let failed = TaskError::from(WireTaskError::from(&TaskError::msg("disk full")));
        assert!(matches!(&failed, TaskError::Failed(m) if m == "disk full"));
        let fatal = TaskError::from(WireTaskError::from(&TaskError::Unrecoverable("x".into())));
        assert!(matches!(fatal, TaskError::Unrecoverable(_)));
        assert!(matches!(
            TaskError::from(WireTaskError::from(&TaskError::Cancelled)),
            TaskError::Cancelled
        ));
    }
}
