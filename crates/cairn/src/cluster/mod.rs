//! Cluster mode: one coordinator process (job master, checkpoint coordinator) and worker
//! processes with task slots, connected over TCP.
//!
//! Every process runs the same application and builds the same job graph from a registered
//! job name and its parameters as data ([`JobSubmission`], through the app's [`JobFactory`]),
//! so the plan — and with it task indices and channel numbers — is identical everywhere;
//! before a deployment each worker checks that it has the job and plans the same graph (a
//! fingerprint of the plan), and is refused otherwise. The coordinator runs the same job master loop as embedded mode with
//! a [`coordinator::ClusterExecutor`] that deploys subtasks onto workers' slots (one subtask of
//! every vertex per slot). Workers run them with the embedded runtime; channels between
//! subtasks of different workers carry serialized batches over one TCP connection per worker
//! pair, with the same credits as local channels (returned over the connection), so
//! backpressure crosses the network. Control mail and task events travel on each worker's
//! control connection. Heartbeats, both ways, detect a dead or stalled worker and a vanished
//! coordinator; every cluster socket has a write timeout and every connect a connect timeout.
//!
//! Checkpoint and output directories must be shared by all processes (one machine, or a
//! shared filesystem). Several coordinators may share one checkpoint directory: one leads, the
//! others stand by and take over when its lease lapses ([`leader`]).

pub mod coordinator;
pub mod frame;
pub mod leader;
pub mod protocol;
pub mod records;
mod slots;
pub mod worker;

use serde::{Deserialize, Serialize};

use crate::api::JobGraph;
use crate::config::JobConfig;
use crate::runtime::InjectSpec;

/// A job as submitted to a coordinator: which registered job, with which parameters, and how
/// to run it. Plain data (the coordinator records it in `<job-id>/_job` and every worker builds
/// the same graph from it), never command-line words.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JobSubmission {
    /// The registered job's name.
    pub job: String,
    /// Its parameters, as the job's parameter type serializes them.
    pub params: serde_json::Value,
    /// Its configuration (the coordinator sets the checkpoint directory).
    pub config: JobConfig,
    /// Where to start from: a checkpoint or savepoint path, or `latest`.
    #[serde(default)]
    pub from: Option<String>,
    /// With `from: latest`: the job (id) whose latest checkpoint; without it, the one job of
    /// this name that has checkpoints.
    #[serde(default)]
    pub from_job: Option<String>,
    /// Failures to inject (`--inject-failures`).
    #[serde(default)]
    pub inject: Option<InjectRequest>,
    /// The run's seed: of injected failures, and of jobs that generate their data.
    #[serde(default)]
    pub seed: u64,
}

/// `--inject-failures N [--inject-uid PREFIX]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct InjectRequest {
    /// Number of failures.
    pub count: usize,
    /// Only into tasks whose head operator uid starts with this.
    #[serde(default)]
    pub uid_prefix: Option<String>,
}

/// Builds registered jobs by name from their parameters, in every process of a cluster. The
/// app layer implements it over the jobs it registered; nothing below it knows which exist.
pub trait JobFactory: Send + Sync + 'static {
    /// Whether job `job` is registered.
    fn has_job(&self, job: &str) -> bool;
    /// Builds job `job` from its parameters and the run's seed, or says in one line why not
    /// (an unknown job, parameters that do not validate).
    fn build(&self, job: &str, params: &serde_json::Value, seed: u64) -> Result<JobGraph, String>;
    /// How many records the job's sources read in a run without failures, if the job knows
    /// (failures are planned among them); asked only when failures are to be injected.
    fn source_records(
        &self,
        job: &str,
        params: &serde_json::Value,
        seed: u64,
    ) -> Result<Option<u64>, String>;
}

/// The failures a submission asks for, planned among the job's source records.
pub(crate) fn inject_spec(
    factory: &dyn JobFactory,
    submission: &JobSubmission,
) -> Result<Option<InjectSpec>, String> {
    let Some(request) = &submission.inject else {
        return Ok(None);
    };
    let records = factory.source_records(&submission.job, &submission.params, submission.seed)?;
    let Some(expected_records) = records else {
        return Err(format!(
            "--inject-failures plans failures among a known number of records, and job '{}' does not say how many its sources read with these parameters",
            submission.job
        ));
    };
    Ok(Some(InjectSpec {
        count: request.count,
        seed: submission.seed,
        expected_records,
    }))
}
