//! Cluster mode: one coordinator process (job master, checkpoint coordinator) and worker
//! processes with task slots, connected over TCP.
//!
//! Every process runs the same binary and builds the same job graph from a registered job name
//! and its flags ([`JobFactory`]), so the plan — and with it task indices and channel numbers —
//! is identical everywhere. The coordinator runs the same job master loop as embedded mode with
//! a [`coordinator::ClusterExecutor`] that deploys subtasks onto workers' slots (one subtask of
//! every vertex per slot). Workers run them with the embedded runtime; channels between
//! subtasks of different workers carry serialized batches over one TCP connection per worker
//! pair, with the same credits as local channels (returned over the connection), so
//! backpressure crosses the network. Control mail and task events travel on each worker's
//! control connection. Heartbeats (and a closed connection) detect dead workers.
//!
//! Checkpoint and output directories must be shared by all processes (one machine, or a
//! shared filesystem).

pub mod coordinator;
pub mod frame;
pub mod protocol;
pub mod worker;

use crate::api::JobGraph;
use crate::config::JobConfig;
use crate::runtime::{InjectSpec, InjectTarget, RestoreFrom};

/// A job built from its name and flags.
pub struct BuiltJob {
    /// The job graph.
    pub graph: JobGraph,
    /// Its configuration.
    pub config: JobConfig,
    /// Failures to inject (`--inject-failures`); in a cluster each worker plans them over its
    /// own subtasks and progress.
    pub inject: Option<InjectSpec>,
    /// Which tasks failures go to.
    pub inject_target: InjectTarget,
    /// What to start from (`--from PATH|latest`), if anything.
    pub restore: Option<RestoreFrom>,
}

/// Builds a job by name from `cairn run`-style flags, in every process of a cluster.
pub trait JobFactory: Send + Sync + 'static {
    /// The job, or a one-line error for the user.
    fn build(&self, job: &str, args: &[String]) -> Result<BuiltJob, String>;
}
