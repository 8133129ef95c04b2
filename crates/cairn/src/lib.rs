//! cairn: a stream processor whose every record affects state and the outside world exactly
//! once, through crashes, kills and restarts.
//!
//! Layers (see `ARCHITECTURE.md`): [`api`] builds job graphs; [`runtime`] runs them; [`checkpoint`]
//! coordinates and restores snapshots; [`state`] holds keyed state; [`storage`] persists
//! checkpoint files; [`connectors`] are sources and sinks; [`jobs`] are the built-in jobs.
//!
//! Cargo features, one per external system, none by default (a crate that enables none builds
//! no C or C++): `rocksdb` (the RocksDB state backend), `kafka` (the Kafka source and sink),
//! `postgres` (the PostgreSQL sinks), `s3` (S3 checkpoint storage); `full` enables them all.
//! Choosing a missing one at run time is an error naming the feature.

pub mod api;
pub mod checkpoint;
pub mod config;
pub mod connectors;
pub mod error;
pub mod failpoint;
pub mod jobs;
pub mod metrics;
pub mod runtime;
#[cfg(feature = "sql")]
pub mod sql;
pub mod state;
pub mod storage;
pub mod window;

pub use error::{TaskError, TaskResult};
pub mod cluster;
#[cfg(test)]
mod sim;
