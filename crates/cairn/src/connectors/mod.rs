//! Sources and sinks. Those of external systems are Cargo features: `kafka` (the Kafka source
//! and sink) and `postgres` (the PostgreSQL sinks); their configuration types are in every
//! build.
//!
//! Sources are replayable: their read positions are operator state (R15). The file sink is a
//! two-phase-commit participant (R16): in-progress → pending at pre-commit → committed by
//! rename when the checkpoint completes.

mod file_sink;
mod file_source;
mod generator;
pub mod kafka;
mod nexmark;
pub mod postgres;
mod rate;
mod sequence;
mod simple_sinks;
mod throttled;

pub use file_sink::FileSink;
pub use file_source::FileSource;
pub use generator::{GeneratorSource, Word};
pub use nexmark::{
    Auction, Bid, EventKind, NexmarkEvent, NexmarkGenerator, NexmarkSource, Person, BASE_TIME_MS,
    DEFAULT_RATE,
};
pub use postgres::PgMode;
#[cfg(feature = "postgres")]
pub use postgres::PostgresSink;
pub use rate::RateLimited;
pub use sequence::SequenceSource;
pub use simple_sinks::{DiscardSink, PrintSink};
pub use throttled::ThrottledSink;

use std::sync::Arc;

use crate::error::{TaskError, TaskResult};

/// Turns a record into bytes (one line, newline included) for text sinks.
pub type Encoder<T> = Arc<dyn Fn(&T, &mut Vec<u8>) + Send + Sync>;

/// Serializes source splits with their positions (a source's state).
fn encode_splits<S: serde::Serialize>(splits: &[S]) -> TaskResult<Vec<Vec<u8>>> {
    splits
        .iter()
        .map(|s| postcard::to_stdvec(s).map_err(TaskError::msg))
        .collect()
}

/// Restores source splits; `what` names the source in the error.
fn decode_splits<S: serde::de::DeserializeOwned>(
    what: &str,
    splits: &[Vec<u8>],
) -> TaskResult<Vec<S>> {
    splits
        .iter()
        .map(|b| postcard::from_bytes::<S>(b))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TaskError::msg(format!("corrupt {what} position in checkpoint: {e}")))
}
