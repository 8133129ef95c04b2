//! The embedded runtime: subtasks as single-threaded mailbox loops over operator chains,
//! channels with credit-based flow control, the input gate that aligns barriers, and the job
//! master that deploys, checkpoints, and restarts.

pub mod chain;
pub mod channel;
pub mod deploy;
pub mod functions;
pub mod gate;
pub mod graph;
pub mod inject;
pub mod job;
pub mod lifecycle;
pub mod master;
pub mod operators;
pub mod plan;
pub mod restart;
pub mod status;
pub mod task;
pub mod watermark;

pub use job::{
    run_job, run_job_with, InjectSpec, InjectTarget, JobError, JobSummary, Progress, RestoreFrom,
    RunOptions,
};
pub use lifecycle::{Actor, Lifecycle, Transition};
pub use status::{
    ExceptionView, JobCommand, JobState, JobStatus, JobStatusView, SavepointKind, SavepointState,
    SavepointStatus, VertexInput, VertexView,
};
