//! The Kafka source: reads one or more topics through librdkafka (crate `rdkafka`); every
//! partition is a split whose next offset is the source's state (R15).
//!
//! **Assignment.** No consumer group decides anything: every source subtask has its own
//! consumer and `assign`s exactly its partitions (no rebalancing). A fresh start gives
//! partition `p` of the `k`-th topic (topics sorted by name) to subtask
//! `(k + p) mod parallelism` — for one topic, partition `p` goes to subtask `p mod
//! parallelism`, and several topics start at different subtasks, as Flink's
//! `KafkaSourceEnumerator` does with a hash of the topic name. The rule depends on the
//! partition alone, not on the whole list, so two subtasks that looked at the topics a moment
//! apart (each subtask computes the splits itself) never both take a partition. After a
//! restore the runtime hands the snapshotted splits out (rescaling redistributes them); the
//! source does not reassign them.
//!
//! **Positions.** A partition split holds the offset of the next record the source has not
//! emitted; records taken from librdkafka but still buffered are not in it. Start positions
//! (earliest, latest, the group's committed offsets, a timestamp) are resolved to offsets at
//! the fresh start, so a split never depends on when it is restored, and restored offsets
//! always win over the start position.
//!
//! **New partitions.** Besides its partitions, the state holds *discovery splits*: per topic
//! and per residue `r` of the fresh start's parallelism `n`, the claim on every partition
//! `p >= known` with `(k + p) mod n == r` — the partitions that did not exist yet. The runtime
//! gives each discovery split to exactly one subtask, also when it redistributes them on a
//! rescaled restore, so each future partition has exactly one owner, whatever each subtask had
//! seen before the checkpoint. The owner looks at the topic's metadata every
//! `discovery_interval` and starts the new partitions it claims at their earliest offset (as
//! Flink does), then raises `known`. A bounded source has no discovery splits.
//!
//! **Event time.** Records are made by the source's deserializer from a [`KafkaMessage`],
//! whose `timestamp` is the Kafka record's; every partition is a split of the runtime's
//! per-split watermarks (`last_split`, `split_count`, `split_finished`), so idleness and the
//! minimum work per partition.
//!
//! **Bounded mode** stops at the end offsets the partitions had at the fresh start (kept in
//! the splits, so a restored run stops at the same records).
//!
//! **Commit back.** When a checkpoint completes, the offsets of *its* snapshot are committed
//! to the consumer group (asynchronously), so that the usual lag monitoring sees progress;
//! cairn never reads them back except for a fresh start from committed offsets.
//!
//! One `poll` drains up to a batch of messages from librdkafka's in-memory queue (librdkafka
//! fetches in large batches on its own threads) into per-partition buffers and emits the
//! fullest one, so a batch is all of one partition and no record costs a system call.

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::{ClientConfig, RDKafkaLogLevel};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::topic_partition_list::{Offset, TopicPartitionList};
use rdkafka::ClientContext;
use serde::{Deserialize, Serialize};

use super::{KafkaSourceConfig, OffsetReset, StartFrom};
use crate::error::{TaskError, TaskResult};
use crate::runtime::chain::{Source, SourceReader, SourceStatus};

/// How long a reader with nothing buffered lets its task serve the mailbox before it looks
/// again (librdkafka keeps fetching meanwhile).
const IDLE_WAIT: Duration = Duration::from_millis(5);
/// Longest single metadata request while the source checks that the brokers answer; between
/// attempts it looks for librdkafka's "all brokers down" (connection refused) to fail fast.
const METADATA_ATTEMPT: Duration = Duration::from_millis(500);
/// Snapshots kept for committing back when their checkpoint completes (older ones are
/// dropped: their checkpoint was aborted or subsumed).
const PENDING_COMMITS_MAX: usize = 32;
/// The group id of a consumer configured without one (see [`consumer`]).
const UNCOMMITTED_GROUP: &str = "cairn-source-uncommitted";
/// A transient consumer error is logged at most once per this interval.
const WARNING_INTERVAL: Duration = Duration::from_secs(10);

/// A record as read from Kafka, handed to the source's deserializer.
#[derive(Debug, Clone, Copy)]
pub struct KafkaMessage<'a> {
    /// The record's topic.
    pub topic: &'a str,
    /// Its partition.
    pub partition: i32,
    /// Its offset in the partition.
    pub offset: i64,
    /// Its timestamp (ms since the epoch; create or log-append time), if it has one.
    pub timestamp: Option<i64>,
    /// Its key.
    pub key: Option<&'a [u8]>,
    /// Its value (None: a tombstone).
    pub payload: Option<&'a [u8]>,
}

/// Turns a Kafka record into a stream record (None: skip it; its offset still counts as read).
pub type KafkaDeserializer<T> = Arc<dyn Fn(&KafkaMessage<'_>) -> Option<T> + Send + Sync>;

impl KafkaSourceConfig {
    /// The topics sorted, without duplicates: their order numbers the topics (`k`).
    fn sorted_topics(&self) -> TaskResult<Vec<String>> {
        if self.brokers.trim().is_empty() {
            return Err(TaskError::msg("the Kafka source needs brokers (HOST:PORT)"));
        }
        let mut topics = self.topics.clone();
        topics.sort();
        topics.dedup();
        if topics.is_empty() || topics.iter().any(|t| t.is_empty()) {
            return Err(TaskError::msg(
                "the Kafka source needs at least one topic (and no empty name)",
            ));
        }
        Ok(topics)
    }
}

/// A replayable source over Kafka topics (see the module docs).
pub struct KafkaSource<T> {
    config: KafkaSourceConfig,
    deserialize: KafkaDeserializer<T>,
}

impl KafkaSource<String> {
    /// Records are the values as text (invalid UTF-8 replaced by U+FFFD, a trailing newline
    /// removed); tombstones are skipped.
    pub fn lines(config: KafkaSourceConfig) -> Self {
        KafkaSource::new(config, |m: &KafkaMessage<'_>| {
            let mut v = m.payload?;
            if let Some(rest) = v.strip_suffix(b"\n") {
                v = rest.strip_suffix(b"\r").unwrap_or(rest);
            }
            Some(String::from_utf8_lossy(v).into_owned())
        })
    }
}

impl<T> KafkaSource<T> {
    /// A source whose records `deserialize` makes.
    pub fn new(
        config: KafkaSourceConfig,
        deserialize: impl Fn(&KafkaMessage<'_>) -> Option<T> + Send + Sync + 'static,
    ) -> Self {
        KafkaSource {
            config,
            deserialize: Arc::new(deserialize),
        }
    }
}

/// One partition and its position.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PartitionSplit {
    topic: String,
    partition: i32,
    /// Offset of the next record to emit.
    next: i64,
    /// Bounded: the end offset of the fresh start (the partition is read when `next` reaches it).
    stop: Option<i64>,
}

/// The claim on partitions of `topic` created after the fresh start: every `p >= known` with
/// `(topic_index + p) mod stride == residue`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct DiscoverySplit {
    topic: String,
    /// The topic's number at the fresh start (`k`).
    topic_index: u32,
    /// Partitions below this number exist and have owners.
    known: i32,
    /// The fresh start's parallelism.
    stride: u32,
    residue: u32,
}

impl DiscoverySplit {
    fn claims(&self, partition: i32) -> bool {
        partition >= self.known
            && (u64::from(self.topic_index) + partition as u64) % u64::from(self.stride)
                == u64::from(self.residue)
    }
}

/// A source split, as stored in a checkpoint. The state is a list of these (each entry a
/// `Vec<Split>`: the fresh start hands every subtask one entry with all its splits, a
/// snapshot stores one split per entry so a rescale can spread them).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
enum Split {
    Partition(PartitionSplit),
    Discovery(DiscoverySplit),
}

fn kafka_err(what: impl fmt::Display, e: KafkaError) -> TaskError {
    TaskError::msg(format!("{what}: {e}"))
}

/// librdkafka's callbacks: its log lines go to `tracing` at debug level (connection retries
/// would flood the log; the source reports what matters itself), failed commits at warn.
struct SourceContext;

impl ClientContext for SourceContext {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        tracing::debug!("librdkafka ({level:?}) {fac}: {message}");
    }
    fn error(&self, error: KafkaError, reason: &str) {
        tracing::debug!("librdkafka error {error}: {reason}");
    }
}

impl ConsumerContext for SourceContext {
    fn commit_callback(&self, result: KafkaResult<()>, _offsets: &TopicPartitionList) {
        if let Err(e) = result {
            tracing::warn!("Kafka source: committing offsets back to the group failed: {e}");
        }
    }
}

type SourceConsumer = BaseConsumer<SourceContext>;

/// A consumer that commits nothing by itself and assigns partitions by hand.
fn consumer(config: &KafkaSourceConfig, client_id: &str) -> TaskResult<SourceConsumer> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", &config.brokers)
        .set("client.id", client_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("enable.partition.eof", "false")
        // Records removed by retention before they were read: go on from the earliest one.
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", "read_committed")
        // librdkafka compares the whole consumer queue (all partitions) with
        // queued.min.messages and, once it is reached, pauses every partition's fetching for
        // fetch.queue.backoff.ms (default 1 s, which left the source idle most of the time in
        // the benchmark): keep about 20 batches queued and look again soon.
        .set("queued.min.messages", "20000")
        .set("fetch.queue.backoff.ms", "10")
        .set_log_level(RDKafkaLogLevel::Info);
    // librdkafka assigns partitions only to a consumer with a group id; without one configured
    // the source commits nothing, so the name is never used on the brokers.
    c.set(
        "group.id",
        config.group_id.as_deref().unwrap_or(UNCOMMITTED_GROUP),
    );
    for (k, v) in &config.properties {
        c.set(k, v);
    }
    c.create_with_context(SourceContext).map_err(|e| {
        TaskError::msg(format!(
            "cannot create a Kafka consumer for {}: {e}",
            config.brokers
        ))
    })
}

/// The number of partitions of `topic`, failing fast when no broker can be connected to or
/// the topic does not exist. Only before anything is assigned: it takes (and drops) what the
/// consumer's queue holds.
fn partition_count_at_setup(
    consumer: &SourceConsumer,
    config: &KafkaSourceConfig,
    topic: &str,
) -> TaskResult<i32> {
    let deadline = Instant::now() + config.request_timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let last = match partition_count(consumer, topic, METADATA_ATTEMPT.min(left)) {
            Ok(Some(n)) => return Ok(n),
            Ok(None) => {
                return Err(TaskError::msg(format!(
                    "Kafka topic '{topic}' does not exist on {}",
                    config.brokers
                )))
            }
            Err(e) => e,
        };
        while let Some(event) = consumer.poll(Duration::ZERO) {
            if let Err(e) = event {
                if e.rdkafka_error_code() == Some(RDKafkaErrorCode::AllBrokersDown) {
                    return Err(TaskError::msg(format!(
                        "cannot connect to any Kafka broker of {} (is it running?)",
                        config.brokers
                    )));
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(TaskError::msg(format!(
                "no answer from the Kafka broker(s) {} within {:?}: {last}",
                config.brokers, config.request_timeout
            )));
        }
    }
}

/// The number of partitions of `topic` (None: the topic does not exist).
fn partition_count(
    consumer: &SourceConsumer,
    topic: &str,
    timeout: Duration,
) -> KafkaResult<Option<i32>> {
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    let Some(t) = md.topics().iter().find(|t| t.name() == topic) else {
        return Ok(None);
    };
    match t.error().map(RDKafkaErrorCode::from) {
        None => {}
        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => return Ok(None),
        Some(code) => return Err(KafkaError::MetadataFetch(code)),
    }
    Ok(Some(
        t.partitions().iter().map(|p| p.id() + 1).max().unwrap_or(0),
    ))
}

/// The earliest and end offsets of every partition.
fn watermarks(
    consumer: &SourceConsumer,
    config: &KafkaSourceConfig,
    partitions: &[(String, i32)],
) -> TaskResult<Vec<(i64, i64)>> {
    partitions
        .iter()
        .map(|(t, p)| {
            consumer
                .fetch_watermarks(t, *p, config.request_timeout)
                .map_err(|e| {
                    kafka_err(
                        format!("cannot read the offsets of Kafka partition {t}/{p}"),
                        e,
                    )
                })
        })
        .collect()
}

fn partition_list(
    partitions: &[(String, i32)],
    offsets: Option<&[i64]>,
) -> TaskResult<TopicPartitionList> {
    let mut tpl = TopicPartitionList::with_capacity(partitions.len());
    for (i, (t, p)) in partitions.iter().enumerate() {
        let offset = match offsets {
            Some(o) => Offset::Offset(o[i]),
            None => Offset::Invalid,
        };
        tpl.add_partition_offset(t, *p, offset)
            .map_err(|e| kafka_err("cannot build a partition list", e))?;
    }
    Ok(tpl)
}

/// The offsets in `tpl`, in the order of `partitions` (None where it has no offset).
fn offsets_of(tpl: &TopicPartitionList, partitions: &[(String, i32)]) -> Vec<Option<i64>> {
    partitions
        .iter()
        .map(
            |(t, p)| match tpl.find_partition(t, *p).map(|e| e.offset()) {
                Some(Offset::Offset(o)) => Some(o),
                _ => None,
            },
        )
        .collect()
}

/// Where each partition starts under `start`, as offsets.
fn start_offsets(
    consumer: &SourceConsumer,
    config: &KafkaSourceConfig,
    partitions: &[(String, i32)],
    ends: &[(i64, i64)],
) -> TaskResult<Vec<i64>> {
    let reset = |i: usize, r: OffsetReset| match r {
        OffsetReset::Earliest => ends[i].0,
        OffsetReset::Latest => ends[i].1,
    };
    match config.start {
        StartFrom::Earliest => Ok((0..partitions.len()).map(|i| ends[i].0).collect()),
        StartFrom::Latest => Ok((0..partitions.len()).map(|i| ends[i].1).collect()),
        StartFrom::Committed(fallback) => {
            let Some(group) = &config.group_id else {
                return Err(TaskError::msg(
                    "the Kafka source starts from committed offsets but has no consumer group",
                ));
            };
            let tpl = partition_list(partitions, None)?;
            let committed = consumer
                .committed_offsets(tpl, config.request_timeout)
                .map_err(|e| {
                    kafka_err(
                        format!("cannot read the committed offsets of group '{group}'"),
                        e,
                    )
                })?;
            Ok(offsets_of(&committed, partitions)
                .into_iter()
                .enumerate()
                // A committed offset outside the partition's range (records removed by
                // retention) starts where the range does.
                .map(|(i, o)| match o {
                    Some(o) => o.clamp(ends[i].0, ends[i].1),
                    None => reset(i, fallback),
                })
                .collect())
        }
        StartFrom::Timestamp(ms) => {
            let mut tpl = TopicPartitionList::with_capacity(partitions.len());
            for (t, p) in partitions {
                tpl.add_partition_offset(t, *p, Offset::Offset(ms))
                    .map_err(|e| kafka_err("cannot build a partition list", e))?;
            }
            let found = consumer
                .offsets_for_times(tpl, config.request_timeout)
                .map_err(|e| {
                    kafka_err(format!("cannot look up the offsets at timestamp {ms}"), e)
                })?;
            Ok(offsets_of(&found, partitions)
                .into_iter()
                .enumerate()
                // No record at or after the timestamp: start at the end.
                .map(|(i, o)| o.filter(|&o| o >= 0).unwrap_or(ends[i].1))
                .collect())
        }
    }
}

impl<T: Send + 'static> Source<T> for KafkaSource<T> {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        let p = parallelism.max(1);
        let topics = self.config.sorted_topics()?;
        let consumer = consumer(&self.config, "cairn-source-setup")?;
        let mut counts = Vec::with_capacity(topics.len());
        for topic in &topics {
            counts.push(partition_count_at_setup(&consumer, &self.config, topic)?);
        }
        let partitions: Vec<(String, i32)> = topics
            .iter()
            .zip(&counts)
            .flat_map(|(t, &n)| (0..n).map(move |p| (t.clone(), p)))
            .collect();
        let ends = watermarks(&consumer, &self.config, &partitions)?;
        let starts = start_offsets(&consumer, &self.config, &partitions, &ends)?;
        let mut bundles: Vec<Vec<Split>> = vec![Vec::new(); p as usize];
        let mut i = 0;
        for (k, (topic, &n)) in topics.iter().zip(&counts).enumerate() {
            for partition in 0..n {
                let owner = (k as u64 + partition as u64) % u64::from(p);
                bundles[owner as usize].push(Split::Partition(PartitionSplit {
                    topic: topic.clone(),
                    partition,
                    next: starts[i],
                    stop: self.config.bounded.then_some(ends[i].1),
                }));
                i += 1;
            }
            if !self.config.bounded {
                for residue in 0..p {
                    bundles[residue as usize].push(Split::Discovery(DiscoverySplit {
                        topic: topic.clone(),
                        topic_index: k as u32,
                        known: n,
                        stride: p,
                        residue,
                    }));
                }
            }
        }
        bundles
            .iter()
            .map(|b| postcard::to_stdvec(b).map_err(TaskError::msg))
            .collect()
    }

    fn create_reader(
        &self,
        subtask: u32,
        _parallelism: u32,
        entries: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<T>>> {
        let bundles: Vec<Vec<Split>> = crate::connectors::decode_splits("Kafka source", &entries)?;
        let consumer = consumer(&self.config, &format!("cairn-source-{subtask}"))?;
        let mut reader = KafkaReader {
            consumer,
            deserialize: self.deserialize.clone(),
            commit_back: self.config.group_id.is_some(),
            brokers: self.config.brokers.clone(),
            request_timeout: self.config.request_timeout,
            topics: Vec::new(),
            routes: Vec::new(),
            parts: Vec::new(),
            discovery: Vec::new(),
            discovery_interval: self.config.discovery_interval,
            next_discovery: Instant::now(),
            buffered: 0,
            last_split: 0,
            pending_commits: VecDeque::new(),
            last_warning: None,
        };
        let mut assign = Vec::new();
        for split in bundles.into_iter().flatten() {
            match split {
                Split::Partition(s) => {
                    let i = reader.add_part(s);
                    if !reader.parts[i].finished {
                        assign.push(i);
                    }
                }
                Split::Discovery(d) => reader.discovery.push(d),
            }
        }
        // Fail now, with a clear message, if the brokers do not answer or a topic is gone.
        let mut topics: Vec<&str> = reader
            .parts
            .iter()
            .map(|p| p.topic(&reader.topics))
            .collect();
        topics.extend(reader.discovery.iter().map(|d| d.topic.as_str()));
        topics.sort_unstable();
        topics.dedup();
        for topic in topics {
            partition_count_at_setup(&reader.consumer, &self.config, topic)?;
        }
        reader.assign(&assign)?;
        Ok(Box::new(reader))
    }
}

/// A partition being read.
struct Part<T> {
    /// Index into the reader's `topics`.
    topic: usize,
    partition: i32,
    /// Offset of the next record to emit (the state).
    next: i64,
    stop: Option<i64>,
    /// Offset after the last record taken from librdkafka (`next` once the buffer is emitted).
    fetched: i64,
    /// Records taken but not emitted, with their offsets.
    buffer: Vec<T>,
    offsets: Vec<i64>,
    /// Bounded and read to its stop offset.
    finished: bool,
}

impl<T> Part<T> {
    fn topic<'a>(&self, topics: &'a [String]) -> &'a str {
        &topics[self.topic]
    }
}

struct KafkaReader<T> {
    consumer: SourceConsumer,
    deserialize: KafkaDeserializer<T>,
    commit_back: bool,
    brokers: String,
    request_timeout: Duration,
    /// Topic names of the partitions read.
    topics: Vec<String>,
    /// Per topic, partition number → index into `parts`.
    routes: Vec<Vec<Option<usize>>>,
    /// The partitions, in split order (the runtime's watermark split indices); only grows.
    parts: Vec<Part<T>>,
    discovery: Vec<DiscoverySplit>,
    discovery_interval: Option<Duration>,
    next_discovery: Instant,
    /// Records in all buffers.
    buffered: usize,
    last_split: usize,
    /// Per snapshot taken: its checkpoint id and every part's `next` then.
    pending_commits: VecDeque<(u64, Vec<i64>)>,
    last_warning: Option<Instant>,
}

impl<T> KafkaReader<T> {
    fn add_part(&mut self, s: PartitionSplit) -> usize {
        let topic = match self.topics.iter().position(|t| *t == s.topic) {
            Some(i) => i,
            None => {
                self.topics.push(s.topic);
                self.routes.push(Vec::new());
                self.topics.len() - 1
            }
        };
        let index = self.parts.len();
        let route = &mut self.routes[topic];
        let slot = usize::try_from(s.partition).unwrap_or(0);
        if route.len() <= slot {
            route.resize(slot + 1, None);
        }
        route[slot] = Some(index);
        self.parts.push(Part {
            topic,
            partition: s.partition,
            next: s.next,
            stop: s.stop,
            fetched: s.next,
            buffer: Vec::new(),
            offsets: Vec::new(),
            finished: s.stop.is_some_and(|stop| s.next >= stop),
        });
        index
    }

    fn list(
        &self,
        parts: &[usize],
        offset: impl Fn(&Part<T>) -> Offset,
    ) -> TaskResult<TopicPartitionList> {
        let mut tpl = TopicPartitionList::with_capacity(parts.len());
        for &i in parts {
            let p = &self.parts[i];
            tpl.add_partition_offset(p.topic(&self.topics), p.partition, offset(p))
                .map_err(|e| kafka_err("cannot build a partition list", e))?;
        }
        Ok(tpl)
    }

    /// Starts reading `parts` at their next offsets.
    fn assign(&mut self, parts: &[usize]) -> TaskResult {
        if parts.is_empty() {
            return Ok(());
        }
        let tpl = self.list(parts, |p| Offset::Offset(p.next))?;
        self.consumer
            .incremental_assign(&tpl)
            .map_err(|e| kafka_err("cannot assign Kafka partitions", e))
    }

    /// The part a message belongs to (None: not one of this reader's partitions).
    fn route(&self, m: &impl Message) -> Option<usize> {
        // With one topic the name (a C string to convert) need not be looked at.
        let t = if self.topics.len() == 1 {
            0
        } else {
            let topic = m.topic();
            self.topics.iter().position(|t| t == topic)?
        };
        *self
            .routes
            .get(t)?
            .get(usize::try_from(m.partition()).ok()?)?
    }

    /// Takes up to `max` messages from librdkafka's queue into the buffers.
    fn fetch(&mut self, max: usize) -> TaskResult {
        while self.buffered < max {
            let Some(event) = self.consumer.poll(Duration::ZERO) else {
                break;
            };
            let m = match event {
                Ok(m) => m,
                Err(e) => {
                    self.on_error(e)?;
                    continue;
                }
            };
            let Some(i) = self.route(&m) else {
                continue;
            };
            let part = &mut self.parts[i];
            let offset = m.offset();
            if part.finished || offset < part.fetched {
                continue;
            }
            if part.stop.is_some_and(|stop| offset >= stop) {
                part.fetched = part.fetched.max(part.stop.unwrap_or(offset));
                continue;
            }
            let message = KafkaMessage {
                topic: &self.topics[part.topic],
                partition: part.partition,
                offset,
                timestamp: m.timestamp().to_millis(),
                key: m.key(),
                payload: m.payload(),
            };
            if let Some(record) = (self.deserialize)(&message) {
                part.buffer.push(record);
                part.offsets.push(offset);
                self.buffered += 1;
            }
            part.fetched = offset + 1;
        }
        Ok(())
    }

    /// A consumer error: fatal ones and authorization failures fail the task (a restart
    /// reports them again if they persist); the rest (a broker lost, a leader moving) librdkafka
    /// retries by itself, and they are logged now and then.
    fn on_error(&mut self, e: KafkaError) -> TaskResult {
        let code = e.rdkafka_error_code();
        let fatal = matches!(e, KafkaError::MessageConsumptionFatal(_))
            || matches!(
                code,
                Some(
                    RDKafkaErrorCode::TopicAuthorizationFailed
                        | RDKafkaErrorCode::GroupAuthorizationFailed
                        | RDKafkaErrorCode::ClusterAuthorizationFailed
                )
            );
        if fatal {
            return Err(TaskError::msg(format!(
                "Kafka source reading from {}: {e}",
                self.brokers
            )));
        }
        let now = Instant::now();
        if self
            .last_warning
            .is_none_or(|t| now.duration_since(t) >= WARNING_INTERVAL)
        {
            self.last_warning = Some(now);
            tracing::warn!(
                "Kafka source reading from {}: {e} (librdkafka retries)",
                self.brokers
            );
        }
        Ok(())
    }

    /// Parts whose buffers are empty have emitted everything they took: their position is
    /// what they fetched. Marks bounded parts that reached their stop offset finished and
    /// stops fetching them.
    fn settle(&mut self) -> TaskResult {
        let mut done = Vec::new();
        for (i, p) in self.parts.iter_mut().enumerate() {
            if p.buffer.is_empty() {
                p.next = p.fetched;
            }
            if !p.finished && p.stop.is_some_and(|s| p.next >= s) {
                p.finished = true;
                done.push(i);
            }
        }
        if !done.is_empty() {
            let tpl = self.list(&done, |_| Offset::Invalid)?;
            self.consumer
                .incremental_unassign(&tpl)
                .map_err(|e| kafka_err("cannot unassign Kafka partitions", e))?;
        }
        Ok(())
    }

    /// Bounded parts whose remaining offsets held no records (transaction markers, compacted
    /// records): librdkafka's position passed them.
    fn check_positions(&mut self) -> TaskResult {
        let open: Vec<usize> = (0..self.parts.len())
            .filter(|&i| {
                let p = &self.parts[i];
                !p.finished && p.stop.is_some() && p.buffer.is_empty()
            })
            .collect();
        if open.is_empty() {
            return Ok(());
        }
        let position = self
            .consumer
            .position()
            .map_err(|e| kafka_err("cannot read the consumer's position", e))?;
        for i in open {
            let p = &mut self.parts[i];
            let topic = &self.topics[p.topic];
            if let Some(Offset::Offset(o)) = position
                .find_partition(topic, p.partition)
                .map(|e| e.offset())
            {
                if o > p.fetched {
                    p.fetched = o.min(p.stop.unwrap_or(o));
                }
            }
        }
        self.settle()
    }

    /// Emits (up to `max` records of) the fullest buffer; returns whether it emitted.
    fn emit(&mut self, out: &mut Vec<T>, max: usize) -> bool {
        let Some((i, _)) = self
            .parts
            .iter()
            .enumerate()
            .filter(|(_, p)| !p.buffer.is_empty())
            .max_by_key(|(_, p)| p.buffer.len())
        else {
            return false;
        };
        let part = &mut self.parts[i];
        let n = part.buffer.len().min(max.max(1));
        if n == part.buffer.len() {
            out.append(&mut part.buffer);
            part.offsets.clear();
            part.next = part.fetched;
        } else {
            out.extend(part.buffer.drain(..n));
            part.next = part.offsets[n - 1] + 1;
            part.offsets.drain(..n);
        }
        self.buffered -= n;
        self.last_split = i;
        true
    }

    fn exhausted(&self) -> bool {
        self.discovery.is_empty() && self.buffered == 0 && self.parts.iter().all(|p| p.finished)
    }

    /// Looks for partitions created since the last look, if it is time to, and starts reading
    /// those this reader's discovery splits claim at their earliest offsets.
    fn discover(&mut self, now: Instant) -> TaskResult {
        let Some(interval) = self.discovery_interval else {
            return Ok(());
        };
        if self.discovery.is_empty() || now < self.next_discovery {
            return Ok(());
        }
        self.next_discovery = now + interval;
        let mut topics: Vec<String> = self.discovery.iter().map(|d| d.topic.clone()).collect();
        topics.sort_unstable();
        topics.dedup();
        for topic in topics {
            let count = match partition_count(&self.consumer, &topic, self.request_timeout) {
                Ok(Some(n)) => n,
                Ok(None) => {
                    self.warn_discovery(&topic, "the topic does not exist (any more)");
                    continue;
                }
                Err(e) => {
                    self.warn_discovery(&topic, &e.to_string());
                    continue;
                }
            };
            let mut new = Vec::new();
            for d in self.discovery.iter().filter(|d| d.topic == topic) {
                new.extend((d.known..count).filter(|&p| d.claims(p)));
            }
            let mut starts = Vec::with_capacity(new.len());
            for &p in &new {
                match self
                    .consumer
                    .fetch_watermarks(&topic, p, self.request_timeout)
                {
                    Ok((low, _)) => starts.push(low),
                    Err(e) => {
                        // Try again at the next look; nothing was claimed yet.
                        self.warn_discovery(&topic, &e.to_string());
                        break;
                    }
                }
            }
            if starts.len() < new.len() {
                continue;
            }
            let added: Vec<usize> = new
                .iter()
                .zip(&starts)
                .map(|(&partition, &next)| {
                    self.add_part(PartitionSplit {
                        topic: topic.clone(),
                        partition,
                        next,
                        stop: None,
                    })
                })
                .collect();
            for d in self.discovery.iter_mut().filter(|d| d.topic == topic) {
                d.known = d.known.max(count);
            }
            if !added.is_empty() {
                tracing::info!(
                    "Kafka source: reading new partitions {new:?} of topic '{topic}' from their earliest offsets"
                );
                self.assign(&added)?;
            }
        }
        Ok(())
    }

    fn warn_discovery(&self, topic: &str, why: &str) {
        tracing::warn!(
            "Kafka source: cannot look for new partitions of '{topic}' on {}: {why}; trying again later",
            self.brokers
        );
    }
}

impl<T: Send> SourceReader<T> for KafkaReader<T> {
    fn poll(&mut self, out: &mut Vec<T>, max: usize) -> TaskResult<SourceStatus> {
        let now = Instant::now();
        self.discover(now)?;
        if self.buffered == 0 {
            self.fetch(max)?;
            self.settle()?;
        }
        if self.emit(out, max) {
            self.settle()?;
            return Ok(SourceStatus::More);
        }
        self.check_positions()?;
        if self.exhausted() {
            return Ok(SourceStatus::Exhausted);
        }
        Ok(SourceStatus::IdleUntil(now + IDLE_WAIT))
    }

    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        let parts = self.parts.iter().map(|p| {
            Split::Partition(PartitionSplit {
                topic: self.topics[p.topic].clone(),
                partition: p.partition,
                next: p.next,
                stop: p.stop,
            })
        });
        let discovery = self.discovery.iter().cloned().map(Split::Discovery);
        parts
            .chain(discovery)
            .map(|s| postcard::to_stdvec(std::slice::from_ref(&s)).map_err(TaskError::msg))
            .collect()
    }

    fn last_split(&self) -> usize {
        self.last_split
    }

    fn split_count(&self) -> usize {
        // With no partition yet but partitions to come, one split stands for them: it holds
        // back the watermark (or is idle) instead of the reader ending event time.
        if self.parts.is_empty() && !self.discovery.is_empty() {
            1
        } else {
            self.parts.len()
        }
    }

    fn split_finished(&self, index: usize) -> bool {
        self.parts.get(index).is_some_and(|p| p.finished)
    }

    fn snapshot_taken(&mut self, checkpoint_id: u64) {
        if !self.commit_back {
            return;
        }
        if self.pending_commits.len() == PENDING_COMMITS_MAX {
            self.pending_commits.pop_front();
        }
        let positions = self.parts.iter().map(|p| p.next).collect();
        self.pending_commits.push_back((checkpoint_id, positions));
    }

    fn notify_complete(&mut self, checkpoint_id: u64) -> TaskResult {
        let mut completed = None;
        while let Some((id, _)) = self.pending_commits.front() {
            if *id > checkpoint_id {
                break;
            }
            let (id, positions) = self.pending_commits.pop_front().unwrap_or_default();
            if id == checkpoint_id {
                completed = Some(positions);
            }
        }
        let Some(positions) = completed else {
            return Ok(());
        };
        let mut tpl = TopicPartitionList::with_capacity(positions.len());
        for (p, &next) in self.parts.iter().zip(&positions) {
            tpl.add_partition_offset(p.topic(&self.topics), p.partition, Offset::Offset(next))
                .map_err(|e| kafka_err("cannot build a partition list", e))?;
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        // For monitoring only: a failure is logged, never fails the job.
        if let Err(e) = self.consumer.commit(&tpl, CommitMode::Async) {
            tracing::warn!("Kafka source: cannot commit offsets of checkpoint {checkpoint_id} back to the group: {e}");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
