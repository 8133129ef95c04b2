//! A REST API in the shape of Apache Flink's, over the live status of cairn jobs.
//!
//! The runtime knows nothing about HTTP: a job master updates a shared
//! [`JobStatus`](cairn::runtime::JobStatus); this crate reads it (and may request a cancel)
//! through a [`JobRegistry`], and [`serve`] answers HTTP on its own thread and tokio runtime.
//!
//! | Request | Answer |
//! | --- | --- |
//! | `GET /jobs` | `{"jobs":[{"id","status"}]}` |
//! | `POST /jobs` | body `{"job","args":[..]}` → `{"jobid"}`; 400 if refused; 501 without a [`JobSubmitter`] |
//! | `GET /jobs/overview` | `{"jobs":[..]}`, each as `GET /jobs/{jid}` answers |
//! | `GET /jobs/{jid}` | `{"jid","name","state","start-time","end-time","duration","restarts","failure-cause"}` |
//! | `GET /jobs/{jid}/checkpoints` | `{"counts":{..},"latest":{"completed":{..}\|null},"history":[..]}`, newest first |
//! | `GET /jobs/{jid}/checkpoints/config` | `{"mode","interval","timeout","min_pause",..}` (durations in ms) |
//! | `PATCH /jobs/{jid}?mode=cancel` | 202 `{}`; 409 if the job already ended; 400 for another mode |
//!
//! Every error is `{"errors":[message]}` with a 4xx/5xx status, as in Flink. With a token, every
//! request must carry `Authorization: Bearer <token>` (401 otherwise).
//!
//! Submissions are handed to the [`JobSubmitter`] set with [`JobRegistry::set_submitter`] (the
//! coordinator's); request bodies are limited to 1 MiB (413 past that).

mod body;
mod registry;
mod resources;
mod server;
mod submit;

pub use registry::JobRegistry;
pub use resources::{ClusterResources, Resources};
pub use server::{serve, RestError, RestServer, SUBMIT_BODY_MAX};
pub use submit::JobSubmitter;
