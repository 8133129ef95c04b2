//! `pipelines`: two independent wordcount pipelines in one job (two pipelined regions), each
//! into its own output directory (`DIR/a`, `DIR/b`). With the region failover strategy a
//! failure in one pipeline restarts only that pipeline; the other keeps running.

use std::path::Path;

use crate::api::{JobGraph, StreamEnv};
use crate::connectors::{DiscardSink, FileSink, GeneratorSource, RateLimited, Word};

use super::wordcount::{encoder, Count, WordOutput};

/// Builds the job: `count` generated words over `keys` in each pipeline, each source at most
/// `rate` words per second (0: as fast as it goes).
pub fn build(count: u64, keys: u64, rate: u64, output: &WordOutput) -> Result<JobGraph, String> {
    let env = StreamEnv::new();
    for name in ["a", "b"] {
        let counts = env
            .source(RateLimited::new(GeneratorSource::new(count, keys), rate))
            .uid(&format!("{name}-source"))
            .name(&format!("{name}-source"))
            .key_by(|w: &Word| w.clone())
            .process(Count::default())
            .uid(&format!("{name}-count"))
            .name(&format!("{name}-count"));
        let sink = match output {
            WordOutput::Dir(dir) => {
                counts.sink(FileSink::new(Path::new(dir).join(name), encoder()))
            }
            WordOutput::Discard | WordOutput::Print => counts.sink(DiscardSink),
            WordOutput::Postgres { .. } => {
                return Err(
                    "pipelines writes to files or discards: --pg-output is a flag of wordcount"
                        .into(),
                )
            }
            WordOutput::Kafka(_) => {
                return Err("pipelines writes to --output DIR, not Kafka".into())
            }
        };
        sink.uid(&format!("{name}-sink"))
            .name(&format!("{name}-sink"));
    }
    env.build("pipelines")
}
