//! Checkpoints: what a completed checkpoint records (`_metadata`), the checkpoint coordinator
//! that triggers, collects, completes, aborts and retains them, and finding and loading the
//! checkpoint to restore from.
//!
//! The coordinator owns no thread: the job master calls it from its loop. It does not know how
//! tasks run; it talks to them only through their mailboxes ([`Mail`]).

pub mod coordinator;
pub mod restore;

use serde::{Deserialize, Serialize};

use crate::state::StateDescriptor;

pub use coordinator::{
    CheckpointCoordinator, Finalized, SavepointOutcome, SavepointRequest, StorageTask, TaskMessage,
};
pub use restore::{
    dispose_savepoint, find_latest, find_latest_of, list_checkpoints, load_checkpoint, load_dir,
    load_from_path, newest_completed, unfinished_job, CheckpointInfo, LoadedCheckpoint,
};

/// A checkpoint barrier: marks the point in a stream where checkpoint `id` was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Barrier {
    /// Checkpoint id; ids only grow.
    pub id: u64,
    /// When the coordinator triggered the checkpoint (ms since the Unix epoch).
    pub timestamp_ms: u64,
    /// Never switch this checkpoint to unaligned. Set on the final checkpoint: everything
    /// before it must be processed — and committed by sinks — before the job ends.
    pub aligned_only: bool,
    /// A savepoint: keyed state is written in the backend-independent format, so that it
    /// restores on any state backend and references no file outside its own directory.
    pub savepoint: bool,
}

/// How tasks treat barriers of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum BarrierKind {
    /// In-band, aligned (or tracked in at-least-once mode).
    Aligned,
    /// In-band, aligned, but switch to unaligned once `timeout_ms` passed since the trigger.
    AlignedWithTimeout { timeout_ms: u64 },
    /// Unaligned: overtakes in-flight data, which becomes channel state.
    Unaligned,
    /// Aligned, and the sources stop reading after it: the barrier of a stop-with-savepoint.
    /// Nothing a source reads after it is emitted, so a job resumed from the savepoint
    /// continues exactly once. `drain`: the sources send the maximum watermark in front of it,
    /// so every event-time timer and window fires and its results are in the savepoint.
    Stop { drain: bool },
}

/// Why a subtask declined a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DeclineCause {
    /// A newer checkpoint's barrier overtook this checkpoint's alignment. Not a failure: it
    /// does not count toward `execution.checkpointing.tolerable-failed-checkpoints`.
    Subsumed,
    /// The subtask could not take part (its snapshot or upload failed).
    Failed(String),
}

impl std::fmt::Display for DeclineCause {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DeclineCause::Subsumed => f.write_str("subsumed by a newer checkpoint"),
            DeclineCause::Failed(reason) => f.write_str(reason),
        }
    }
}

/// The state handle of one subtask of one operator.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SubtaskStateHandle {
    /// Subtask index.
    pub subtask: u32,
    /// File holding the state, relative to the checkpoint directory.
    pub file: String,
}

/// The state of one operator in a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OperatorMetadata {
    /// Operator uid.
    pub uid: String,
    /// Parallelism when the checkpoint was taken.
    pub parallelism: u32,
    /// One handle per subtask that has state.
    pub subtasks: Vec<SubtaskStateHandle>,
    /// Name, kind and serializer of each of its states.
    pub states: Vec<StateDescriptor>,
}

/// The states of one operator in a subtask's state file, as a subtask reports them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OperatorStates {
    /// Operator uid.
    pub uid: String,
    /// Its states.
    pub states: Vec<StateDescriptor>,
}

/// Timings of one subtask's part of a checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskCheckpointStats {
    /// Task name (the chain's operator names).
    pub task: String,
    /// Subtask index.
    pub subtask: u32,
    /// Synchronous part (ms).
    pub sync_ms: u64,
    /// Asynchronous part: serialization and upload (ms).
    pub async_ms: u64,
    /// Time from the first barrier to the last barrier of the alignment (ms).
    pub alignment_ms: u64,
    /// From trigger to the barrier reaching this task (ms).
    pub start_delay_ms: u64,
    /// Bytes written.
    pub state_size: u64,
    /// Bytes of in-flight data persisted (unaligned checkpoints).
    pub channel_state_size: u64,
    /// Whether the checkpoint was unaligned at this subtask.
    pub unaligned: bool,
}

/// The `_metadata` of a completed checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointMetadata {
    /// Job id (directory name).
    pub job_id: String,
    /// Job name.
    pub job_name: String,
    /// Checkpoint id.
    pub checkpoint_id: u64,
    /// When it was triggered (ms since the Unix epoch).
    pub trigger_timestamp_ms: u64,
    /// When it completed (ms since the Unix epoch).
    pub completed_timestamp_ms: u64,
    /// Number of key groups of keyed state.
    pub max_parallelism: u32,
    /// Operators with state.
    pub operators: Vec<OperatorMetadata>,
    /// Total bytes of the state files.
    pub state_size: u64,
    /// Per-subtask statistics.
    pub tasks: Vec<TaskCheckpointStats>,
    /// The files in `<job>/shared/` the checkpoint references (incremental checkpoints of
    /// disk state), relative to the storage root. Added in format version 3; last, so that a
    /// version 2 `_metadata` reads with it empty.
    pub shared_files: Vec<String>,
}

impl CheckpointMetadata {
    /// End-to-end duration (ms).
    pub fn duration_ms(&self) -> u64 {
        self.completed_timestamp_ms
            .saturating_sub(self.trigger_timestamp_ms)
    }
}

/// A subtask's acknowledgement of a checkpoint: its state is persisted.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskAck {
    /// Checkpoint id.
    pub checkpoint_id: u64,
    /// Index of the subtask among all the job's subtasks.
    pub task_index: usize,
    /// Attempt the task belongs to (acks of older attempts are ignored).
    pub attempt: u32,
    /// The state file (relative to the checkpoint directory), None if the chain is stateless.
    pub file: Option<String>,
    /// The operators whose state is in the file, with their states.
    pub operators: Vec<OperatorStates>,
    /// Statistics.
    pub stats: TaskCheckpointStats,
    /// The shared files (`<job>/shared/...`) the state file references.
    pub shared_files: Vec<String>,
}

/// Milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
