//! `wordcount`: reads words, keeps a running count per word in keyed state, and emits
//! `WORD<TAB>COUNT` with the updated count for every input word.
//!
//! Exactly-once means: for every word seen n times, the committed output holds the lines for
//! counts 1..n, each exactly once.

use std::path::PathBuf;
use std::sync::Arc;

use crate::api::{Collector, DataStream, JobGraph, KeyedProcessFunction, StreamEnv};
use crate::connectors::kafka::{KafkaEncoder, KafkaSinkConfig, KafkaSourceConfig};
use crate::connectors::{
    DiscardSink, Encoder, FileSink, FileSource, GeneratorSource, PgMode, PrintSink, RateLimited,
    Word,
};
use crate::error::TaskResult;
use crate::state::{KeyedContext, ValueState};

/// Where the words come from.
#[derive(Debug, Clone)]
pub enum WordInput {
    /// Whitespace-separated words of a text file.
    File(PathBuf),
    /// `count` generated words over `keys` distinct ones.
    Generate { count: u64, keys: u64 },
    /// Lines of words, the values of Kafka records (their offsets are the source's state); needs
    /// the `kafka` feature.
    Kafka(KafkaSourceConfig),
}

/// Where the counts go.
#[derive(Debug, Clone)]
pub enum WordOutput {
    /// The exactly-once file sink.
    Dir(PathBuf),
    /// Nowhere.
    Discard,
    /// Standard output.
    Print,
    /// A PostgreSQL table (wordcount only): `(word, count)` rows, written the way `mode` says;
    /// needs the `postgres` feature.
    Postgres {
        /// `postgres://USER:PASSWORD@HOST:PORT/DATABASE`.
        url: String,
        /// `TABLE` or `SCHEMA.TABLE`; created if it does not exist.
        table: String,
        /// 2pc, upsert or wal.
        mode: PgMode,
    },
    /// A Kafka topic: one record per update, key the word, value `WORD<TAB>COUNT`; needs the
    /// `kafka` feature.
    Kafka(KafkaSinkConfig),
}

/// The running count per word.
#[derive(Clone, Default)]
pub struct Count {
    count: Option<ValueState<u64>>,
}

impl KeyedProcessFunction<Word, Word, (Word, u64)> for Count {
    fn open(&mut self, ctx: &mut KeyedContext<Word>) -> TaskResult {
        self.count = Some(ctx.value_state("count")?);
        Ok(())
    }

    fn process(
        &mut self,
        word: Word,
        ctx: &mut KeyedContext<Word>,
        out: &mut Collector<(Word, u64)>,
    ) -> TaskResult {
        let Some(state) = &self.count else {
            return Ok(());
        };
        let n = state.get_mut(ctx, || 0)?;
        *n += 1;
        out.collect((word, *n));
        Ok(())
    }
}

fn encode_line(r: &(Word, u64), out: &mut Vec<u8>) {
    out.extend_from_slice(r.0.as_bytes());
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(r.1).as_bytes());
    out.push(b'\n');
}

/// The `WORD<TAB>COUNT` line encoder.
pub fn encoder() -> Encoder<(Word, u64)> {
    Arc::new(encode_line)
}

/// The Kafka record of an update: key the word, value `WORD<TAB>COUNT`.
pub fn kafka_encoder() -> KafkaEncoder<(Word, u64)> {
    Arc::new(|r: &(Word, u64), key: &mut Vec<u8>, value: &mut Vec<u8>| {
        key.extend_from_slice(r.0.as_bytes());
        value.extend_from_slice(r.0.as_bytes());
        value.push(b'\t');
        value.extend_from_slice(itoa::Buffer::new().format(r.1).as_bytes());
    })
}

/// Builds the wordcount job graph, its source read at most `rate` records (lines of a file or
/// of Kafka, generated words) per second in all (0: as fast as it goes).
pub fn build(input: &WordInput, rate: u64, output: &WordOutput) -> Result<JobGraph, String> {
    let env = StreamEnv::new();
    let words = match input {
        WordInput::File(path) => env
            .source(RateLimited::new(FileSource::new(path), rate))
            .uid("source")
            .name("file-source")
            .flat_map(|line: String, out: &mut Collector<Word>| {
                for w in line.split_whitespace() {
                    out.collect(Word::new(w));
                }
            })
            .uid("split")
            .name("split"),
        WordInput::Kafka(config) => kafka_lines(&env, config, rate)?
            .uid("source")
            .name("kafka-source")
            .flat_map(|line: String, out: &mut Collector<Word>| {
                for w in line.split_whitespace() {
                    out.collect(Word::new(w));
                }
            })
            .uid("split")
            .name("split"),
        WordInput::Generate { count, keys } => env
            .source(RateLimited::new(GeneratorSource::new(*count, *keys), rate))
            .uid("source")
            .name("generator"),
    };
    let counts = words
        .key_by(|w: &Word| w.clone())
        .process(Count::default())
        .uid("count")
        .name("count");
    let encoder = encoder();
    let sink = match output {
        WordOutput::Dir(dir) => counts.sink(FileSink::new(dir, encoder)).name("file-sink"),
        WordOutput::Discard => counts.sink(DiscardSink).name("discard"),
        WordOutput::Print => counts.sink(PrintSink::new(encoder)).name("print"),
        WordOutput::Postgres { url, table, mode } => {
            to_postgres(counts, url, table, *mode)?.name("postgres-sink")
        }
        WordOutput::Kafka(config) => to_kafka(counts, config)?.name("kafka-sink"),
    };
    sink.uid("sink");
    env.build("wordcount")
}

/// The lines of the Kafka records, at most `rate` per second.
#[cfg(feature = "kafka")]
fn kafka_lines(
    env: &StreamEnv,
    config: &KafkaSourceConfig,
    rate: u64,
) -> Result<DataStream<String>, String> {
    use crate::connectors::kafka::KafkaSource;
    Ok(env.source(RateLimited::new(KafkaSource::lines(config.clone()), rate)))
}

/// Kafka input needs the `kafka` feature.
#[cfg(not(feature = "kafka"))]
fn kafka_lines(
    _env: &StreamEnv,
    _config: &KafkaSourceConfig,
    _rate: u64,
) -> Result<DataStream<String>, String> {
    Err(crate::error::needs_feature(
        "Kafka input (--kafka-input)",
        "kafka",
    ))
}

/// The counts into a Kafka topic.
#[cfg(feature = "kafka")]
fn to_kafka(
    counts: DataStream<(Word, u64)>,
    config: &KafkaSinkConfig,
) -> Result<DataStream<()>, String> {
    use crate::connectors::kafka::KafkaSink;
    Ok(counts.sink(KafkaSink::new(config.clone(), kafka_encoder())?))
}

/// Kafka output needs the `kafka` feature.
#[cfg(not(feature = "kafka"))]
fn to_kafka(
    _counts: DataStream<(Word, u64)>,
    _config: &KafkaSinkConfig,
) -> Result<DataStream<()>, String> {
    Err(crate::error::needs_feature(
        "Kafka output (--kafka-output)",
        "kafka",
    ))
}

/// The counts into a PostgreSQL table.
#[cfg(feature = "postgres")]
fn to_postgres(
    counts: DataStream<(Word, u64)>,
    url: &str,
    table: &str,
    mode: PgMode,
) -> Result<DataStream<()>, String> {
    use crate::connectors::PostgresSink;
    Ok(counts.sink(PostgresSink::new(url, table, mode)?))
}

/// PostgreSQL output needs the `postgres` feature.
#[cfg(not(feature = "postgres"))]
fn to_postgres(
    _counts: DataStream<(Word, u64)>,
    _url: &str,
    _table: &str,
    _mode: PgMode,
) -> Result<DataStream<()>, String> {
    Err(crate::error::needs_feature(
        "PostgreSQL output (--pg-output)",
        "postgres",
    ))
}

#[cfg(test)]
mod tests {
    #[cfg(not(all(feature = "kafka", feature = "postgres")))]
    use super::*;

    #[test]
    #[cfg(not(feature = "kafka"))]
    fn kafka_needs_its_feature() {
        let input = WordInput::Kafka(KafkaSourceConfig::new("127.0.0.1:9092", vec!["in".into()]));
        let err = build(&input, 0, &WordOutput::Discard).err().unwrap();
        assert_eq!(
            err,
            "Kafka input (--kafka-input) needs cairn built with the 'kafka' feature"
        );
        let input = WordInput::Generate { count: 1, keys: 1 };
        let output = WordOutput::Kafka(KafkaSinkConfig::new("127.0.0.1:9092", "out"));
        let err = build(&input, 0, &output).err().unwrap();
        assert_eq!(
            err,
            "Kafka output (--kafka-output) needs cairn built with the 'kafka' feature"
        );
    }

    #[test]
    #[cfg(not(feature = "postgres"))]
    fn postgres_needs_its_feature() {
        let input = WordInput::Generate { count: 1, keys: 1 };
        let output = WordOutput::Postgres {
            url: "postgres://cairn:cairn@127.0.0.1:5432/cairn".into(),
            table: "counts".into(),
            mode: PgMode::Upsert,
        };
        let err = build(&input, 0, &output).err().unwrap();
        assert_eq!(
            err,
            "PostgreSQL output (--pg-output) needs cairn built with the 'postgres' feature"
        );
    }
}
