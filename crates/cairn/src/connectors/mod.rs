//! Sources and sinks.
//!
//! Sources are replayable: their read positions are operator state (R15). The file sink is a
//! two-phase-commit participant (R16): in-progress → pending at pre-commit → committed by
//! rename when the checkpoint completes.

mod file_sink;
mod file_source;
mod generator;
mod sequence;
mod simple_sinks;
mod throttled;

pub use file_sink::FileSink;
pub use file_source::FileSource;
pub use generator::{GeneratorSource, Word};
pub use sequence::SequenceSource;
pub use simple_sinks::{DiscardSink, PrintSink};
pub use throttled::ThrottledSink;

use std::sync::Arc;

/// Turns a record into bytes (one line, newline included) for text sinks.
pub type Encoder<T> = Arc<dyn Fn(&T, &mut Vec<u8>) + Send + Sync>;
