//! Job submission: what a server that runs jobs (the coordinator) plugs into the REST API.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The body of `POST /jobs`: a registered job and either its parameters as JSON (in the shape
/// of the job's parameter type) or its command-line words (as `JOB --help` lists them), plus
/// how to run it. Unknown fields are refused, so a misspelt option is never ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitRequest {
    /// The registered job's name.
    pub job: String,
    /// The job's parameters as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub params: Option<Value>,
    /// Or its flags as words, e.g. `["--generate","1000","--output","/x"]`; the job's run
    /// options (`-p`, `-D`, `--from`, ...) may be among them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub args: Option<Vec<String>>,
    /// Configuration keys (Flink's names) and their values, applied over `config_yaml`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub config: BTreeMap<String, String>,
    /// A configuration file's text (YAML with Flink's keys).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_yaml: Option<String>,
    /// Start from this checkpoint or savepoint (a path the coordinator can read), or `latest`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// With `from: latest`: the id of the job whose latest checkpoint (else the one job of
    /// this name with checkpoints).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_job: Option<String>,
    /// Inject this many failures (tests of the restart strategy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject_failures: Option<usize>,
    /// Inject them only into tasks whose head operator uid starts with this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inject_uid: Option<String>,
    /// The run's seed (of injected failures, and of jobs that generate data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// Starts jobs for `POST /jobs`.
///
/// A server without one (an embedded `cairn run`) answers submissions with 501. The
/// implementation decides what a job is, where it runs and how its parameters are validated;
/// it should [`JobRegistry::register`](crate::JobRegistry::register) the new job's status in
/// the registry the server serves, so that the returned id can be looked up at once.
///
/// [`submit`](JobSubmitter::submit) is called on a blocking thread of the server's runtime:
/// it may take its time (validate, plan, deploy), but should return once the job is accepted
/// rather than when it ends.
pub trait JobSubmitter: Send + Sync + 'static {
    /// Submits a job; returns the new job id, or a one-line error for the user.
    fn submit(&self, request: SubmitRequest) -> Result<String, String>;
}
