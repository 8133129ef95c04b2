//! Built-in jobs, shipped in the `cairn` binary and buildable by name in every process.

pub mod backpressure;
pub mod nexmark;
mod nexmark_time;
pub mod pipelines;
pub mod wordcount;
