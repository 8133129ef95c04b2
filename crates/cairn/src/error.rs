//! The error a task (and a user function inside it) fails with.
//!
//! A failing task fails its job attempt; the restart strategy then decides whether the job is
//! restored from the latest completed checkpoint or fails for good.

use std::fmt::Display;

/// Why a task stopped before the end of its input.
#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    /// The job attempt is being cancelled (another task failed, or the user cancelled).
    #[error("task cancelled")]
    Cancelled,
    /// A failure injected on purpose by `--inject-failures`.
    #[error("injected failure {index} at record {record} of operator '{uid}'")]
    Injected {
        index: usize,
        record: u64,
        uid: String,
    },
    /// Anything else: user code, I/O, state, storage. The message names what failed.
    #[error("{0}")]
    Failed(String),
    /// A failure no restart can fix, such as restored state the job cannot read (a state whose
    /// kind or type changed): the job fails at once instead of restarting into it again.
    #[error("{0}")]
    Unrecoverable(String),
}

impl TaskError {
    /// A failure described by a message.
    pub fn msg(message: impl Display) -> Self {
        TaskError::Failed(message.to_string())
    }

    /// Prefixes the message of a [`TaskError::Failed`] with context.
    pub fn context(self, what: impl Display) -> Self {
        match self {
            TaskError::Failed(m) => TaskError::Failed(format!("{what}: {m}")),
            TaskError::Unrecoverable(m) => TaskError::Unrecoverable(format!("{what}: {m}")),
            other => other,
        }
    }
}

impl From<std::io::Error> for TaskError {
    fn from(e: std::io::Error) -> Self {
        TaskError::Failed(e.to_string())
    }
}

impl From<crate::storage::StorageError> for TaskError {
    fn from(e: crate::storage::StorageError) -> Self {
        TaskError::Failed(e.to_string())
    }
}

impl From<crate::storage::format::FormatError> for TaskError {
    fn from(e: crate::storage::format::FormatError) -> Self {
        TaskError::Failed(e.to_string())
    }
}

/// Result of a task or user function.
pub type TaskResult<T = ()> = Result<T, TaskError>;

/// The one-line error of a choice made at run time (a configuration key and value, an input or
/// output) that needs a Cargo feature this build of cairn lacks: `{what} needs cairn built with
/// the '{feature}' feature`.
pub fn needs_feature(what: &str, feature: &str) -> String {
    format!("{what} needs cairn built with the '{feature}' feature")
}
