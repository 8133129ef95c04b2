//! A REST API in the shape of Apache Flink's, over the live status of cairn jobs.
//!
//! The runtime knows nothing about HTTP: a job master updates a shared
//! [`JobStatus`](cairn::runtime::JobStatus); this crate reads it (and may request a cancel)
//! through a [`JobRegistry`], and [`serve`] answers HTTP on its own thread and tokio runtime.
//!
//! Bodies have the field names and types of Flink 2.3's response classes (every field Flink's
//! client requires; cairn's own fields beside them), and every path also answers under
//! `/v1/`, as Flink's clients ask:
//!
//! | Request | Answer (Flink's class) |
//! | --- | --- |
//! | `GET /overview` | workers, slots and job counts (`ClusterOverviewWithVersion`); resources from the [`ClusterResources`] |
//! | `GET /config` | `{"refresh-interval","timezone-name","timezone-offset","flink-version",..}` (`DashboardConfiguration`) |
//! | `GET /jobs` | `{"jobs":[{"id","status"}]}` (`JobIdsWithStatusOverview`) |
//! | `POST /jobs` | body [`SubmitRequest`]: `{"job","params":{..}}` or `{"job","args":[..]}` → `{"jobid"}`; 400 if refused; 501 without a [`JobSubmitter`] |
//! | `GET /jobs/overview` | `{"jobs":[{"jid","name","state","start-time",..,"tasks"}]}` (`MultipleJobsDetails`) |
//! | `GET /jobs/{jid}` | `{"jid","name","state","start-time","end-time","duration","vertices",..}` (`JobDetailsInfo`) |
//! | `GET /jobs/{jid}/checkpoints` | `{"counts","summary","latest","history"}`, newest first (`CheckpointingStatistics`) |
//! | `GET /jobs/{jid}/vertices/{vid}` | a vertex and its subtasks' I/O metrics (`JobVertexDetailsInfo`) |
//! | `GET /jobs/{jid}/vertices/{vid}/backpressure` | back-pressure level and ratios per subtask (`JobVertexBackPressureInfo`) |
//! | `GET /jobs/{jid}/exceptions` | the job's failures, newest first (`JobExceptionsInfoWithHistory`) |
//! | `GET /jobs/{jid}/plan` | the vertices and their inputs (`JobPlanInfo`) |
//! | `GET /jobs/{jid}/checkpoints/config` | `{"mode","interval","timeout","min_pause",..}` (durations in ms) |
//! | `PATCH /jobs/{jid}?mode=cancel` | 202 `{}`; 409 if the job already ended; 400 for another mode |
//! | `GET /jobs/{jid}/config` | the job's configuration as `execution-config.user-config` (`JobConfigInfo`) |
//! | `GET /metrics` | Prometheus (OpenMetrics) text: this process's subtasks and the jobs' status ([`cairn::metrics`]) |
//!
//! `GET /` serves the web dashboard, built into the binary (see `dashboard`).
//!
//! Every error is `{"errors":[message]}` with a 4xx/5xx status, as in Flink. With a token, every
//! request but the dashboard's files must carry `Authorization: Bearer <token>` (401
//! otherwise).
//!
//! Submissions are handed to the [`JobSubmitter`] set with [`JobRegistry::set_submitter`] (the
//! coordinator's); request bodies are limited to 1 MiB (413 past that).

mod body;
mod dashboard;
mod prometheus;
mod registry;
mod resources;
mod server;
mod submit;

pub use registry::JobRegistry;
pub use resources::{ClusterResources, Resources};
pub use server::{
    serve, serve_metrics, serve_standby, Readiness, RestError, RestServer, SUBMIT_BODY_MAX,
};
pub use submit::{JobSubmitter, SubmitRequest};
