//! What the Kafka connectors read and write, and how: their configuration, compiled with or
//! without the `kafka` feature (which the source and the sink themselves need).

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// Where a partition without a committed offset starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffsetReset {
    /// At its earliest offset.
    Earliest,
    /// At its end (only records written from now on).
    Latest,
}

/// Where a fresh start begins reading (a restore always resumes at its offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    /// Every partition's earliest offset.
    Earliest,
    /// Every partition's end: only records written from now on.
    Latest,
    /// The consumer group's committed offsets; partitions without one start as given.
    Committed(OffsetReset),
    /// The first record whose timestamp is at or after this many ms since the epoch (the end
    /// of a partition that has none).
    Timestamp(i64),
}

impl FromStr for StartFrom {
    type Err = String;

    /// `earliest`, `latest`, `committed` (else earliest), `committed-or-earliest`,
    /// `committed-or-latest`, `timestamp:MILLIS`.
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "earliest" => Ok(StartFrom::Earliest),
            "latest" => Ok(StartFrom::Latest),
            "committed" | "committed-or-earliest" => {
                Ok(StartFrom::Committed(OffsetReset::Earliest))
            }
            "committed-or-latest" => Ok(StartFrom::Committed(OffsetReset::Latest)),
            other => match other.strip_prefix("timestamp:").map(str::parse::<i64>) {
                Some(Ok(ms)) if ms >= 0 => Ok(StartFrom::Timestamp(ms)),
                _ => Err(format!(
                    "'{other}' is not a start position: earliest, latest, committed, \
                     committed-or-earliest, committed-or-latest or timestamp:MILLIS"
                )),
            },
        }
    }
}

impl fmt::Display for StartFrom {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StartFrom::Earliest => f.write_str("earliest"),
            StartFrom::Latest => f.write_str("latest"),
            StartFrom::Committed(OffsetReset::Earliest) => f.write_str("committed-or-earliest"),
            StartFrom::Committed(OffsetReset::Latest) => f.write_str("committed-or-latest"),
            StartFrom::Timestamp(ms) => write!(f, "timestamp:{ms}"),
        }
    }
}

/// What a Kafka source reads and how.
#[derive(Debug, Clone)]
pub struct KafkaSourceConfig {
    /// `bootstrap.servers`: `HOST:PORT[,HOST:PORT...]`.
    pub brokers: String,
    /// The topics (at least one); their partitions are the splits.
    pub topics: Vec<String>,
    /// The consumer group completed checkpoints' offsets are committed to (and a start from
    /// committed offsets reads). None: nothing is committed.
    pub group_id: Option<String>,
    /// Where a fresh start begins.
    pub start: StartFrom,
    /// Stop at the end offsets the partitions had at the fresh start.
    pub bounded: bool,
    /// How often to look for new partitions (None: never).
    pub discovery_interval: Option<Duration>,
    /// Deadline of each metadata or offset request the source makes itself.
    pub request_timeout: Duration,
    /// More librdkafka settings (`security.protocol`, `fetch.max.bytes`, ...), applied last.
    pub properties: Vec<(String, String)>,
}

impl KafkaSourceConfig {
    /// Reads `topics` from `brokers`: from the earliest offsets, unbounded, no group, new
    /// partitions looked for every 5 minutes (Flink's default), 10 s per request.
    pub fn new(brokers: impl Into<String>, topics: Vec<String>) -> Self {
        KafkaSourceConfig {
            brokers: brokers.into(),
            topics,
            group_id: None,
            start: StartFrom::Earliest,
            bounded: false,
            discovery_interval: Some(Duration::from_secs(300)),
            request_timeout: Duration::from_secs(10),
            properties: Vec::new(),
        }
    }
}

/// What the Kafka sink guarantees end to end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KafkaGuarantee {
    /// Records are handed to the producer; nothing waits for them.
    None,
    /// Every barrier waits until all records before it are acknowledged: nothing is lost,
    /// records after the restored checkpoint are written again.
    AtLeastOnce,
    /// Kafka transactions committed with the checkpoints.
    ExactlyOnce,
}

impl FromStr for KafkaGuarantee {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "none" => Ok(KafkaGuarantee::None),
            "at-least-once" => Ok(KafkaGuarantee::AtLeastOnce),
            "exactly-once" => Ok(KafkaGuarantee::ExactlyOnce),
            other => Err(format!(
                "unknown Kafka guarantee '{other}' (none, at-least-once, exactly-once)"
            )),
        }
    }
}

impl fmt::Display for KafkaGuarantee {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KafkaGuarantee::None => "none",
            KafkaGuarantee::AtLeastOnce => "at-least-once",
            KafkaGuarantee::ExactlyOnce => "exactly-once",
        })
    }
}

/// Where and how the Kafka sink writes.
#[derive(Debug, Clone)]
pub struct KafkaSinkConfig {
    /// `HOST:PORT[,HOST:PORT...]` (librdkafka's `bootstrap.servers`).
    pub brokers: String,
    /// The topic written to (it must exist, or the broker must create topics on demand).
    pub topic: String,
    /// The guarantee.
    pub guarantee: KafkaGuarantee,
    /// Prefix of the transactional ids (exactly-once); None: `cairn-<job id>-<sink uid>`.
    pub transactional_id_prefix: Option<String>,
    /// librdkafka's `transaction.timeout.ms`: the broker aborts a transaction open longer.
    /// It must exceed the longest time between a checkpoint's barrier and its completion,
    /// downtime before a restore included.
    pub transaction_timeout: Duration,
    /// A pending transaction open for this fraction of `transaction_timeout` is named in a
    /// warning.
    pub timeout_warning_ratio: f64,
    /// Bounds every wait on the broker: connect, flush, commit, wire requests.
    pub request_timeout: Duration,
}

impl KafkaSinkConfig {
    /// Exactly-once into `topic` on `brokers`, with a 15-minute transaction timeout (the
    /// largest a Kafka broker accepts by default, `transaction.max.timeout.ms`).
    pub fn new(brokers: impl Into<String>, topic: impl Into<String>) -> Self {
        KafkaSinkConfig {
            brokers: brokers.into(),
            topic: topic.into(),
            guarantee: KafkaGuarantee::ExactlyOnce,
            transactional_id_prefix: None,
            transaction_timeout: Duration::from_secs(15 * 60),
            timeout_warning_ratio: 0.8,
            request_timeout: Duration::from_secs(60),
        }
    }
}

/// Encodes a record as a Kafka key and value into the buffers given (both empty).
pub type KafkaEncoder<T> = Arc<dyn Fn(&T, &mut Vec<u8>, &mut Vec<u8>) + Send + Sync>;
