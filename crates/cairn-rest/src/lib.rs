//! A REST API in the shape of Apache Flink's, over the live status of cairn jobs.
//!
//! The runtime knows nothing about HTTP: a job master updates a shared
//! [`JobStatus`](cairn::runtime::JobStatus); this crate reads it (and may request a cancel)
//! through a [`JobRegistry`], and [`serve`] answers HTTP on its own thread and tokio runtime.
//!
//! | Request | Answer |
//! | --- | --- |
//! | `GET /jobs` | `{"jobs":[{"id","status"}]}` |
//! | `GET /jobs/{jid}` | `{"jid","name","state","start-time","end-time","duration","restarts","failure-cause"}` |
//! | `GET /jobs/{jid}/checkpoints` | `{"counts":{..},"latest":{"completed":{..}\|null},"history":[..]}`, newest first |
//! | `GET /jobs/{jid}/checkpoints/config` | `{"mode","interval","timeout","min_pause",..}` (durations in ms) |
//! | `PATCH /jobs/{jid}?mode=cancel` | 202 `{}`; 409 if the job already ended; 400 for another mode |
//!
//! Every error is `{"errors":[message]}` with a 4xx/5xx status, as in Flink. With a token, every
//! request must carry `Authorization: Bearer <token>` (401 otherwise).

mod body;
mod registry;
mod server;

pub use registry::JobRegistry;
pub use server::{serve, RestError, RestServer};
