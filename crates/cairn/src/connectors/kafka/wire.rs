//! A small blocking Kafka client for the requests librdkafka does not expose, spoken through
//! the `kafka-protocol` crate over plain TCP.
//!
//! The exactly-once Kafka sink needs three things no librdkafka API gives:
//! - **`EndTxn` with a stored producer id and epoch**, to commit after a restore a transaction
//!   that a producer of an earlier process pre-committed (librdkafka can only end the
//!   transactions of its own producer instance; Flink resumes the producer by reflection);
//! - **`InitProducerId` on a transactional id**, to fence and abort a transaction a crashed
//!   attempt left open, and to learn from the returned epoch whether the id was ever used;
//! - **`Fetch` (read uncommitted) of a record's batch header**, whose producer id and epoch are
//!   those of the transaction that wrote it (librdkafka does not tell a producer its own).
//!
//! Tests also read transaction markers (control batches) with [`WireClient::fetch`].
//!
//! One connection per broker address, opened on first use, with the API versions the broker
//! announced (`ApiVersions`); every request uses the highest version both sides support within
//! the range this module encodes. Every wait is bounded by the client's request timeout.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::RangeInclusive;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, CreateTopicsRequest, EndTxnRequest, FetchRequest,
    FindCoordinatorRequest, InitProducerIdRequest, ListOffsetsRequest, MetadataRequest,
    RequestHeader, ResponseHeader, TopicName, TransactionalId,
};
use kafka_protocol::protocol::{Decodable, Encodable, HeaderVersion, Request, StrBytes};

/// The largest response frame accepted (a Fetch asks for less).
const FRAME_BYTES_MAX: usize = 64 << 20;
/// How long a Fetch waits for data at its offset.
const FETCH_WAIT_MS: i32 = 20;
/// Pause between retries of a retriable broker error (coordinator loading, concurrent
/// transaction being completed).
const RETRY_BACKOFF: Duration = Duration::from_millis(50);

/// What went wrong talking to a broker.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// No TCP connection (or it broke).
    #[error("cannot reach Kafka broker {addr}: {source}")]
    Io {
        /// The broker's address.
        addr: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The broker answered, with an error code.
    #[error("Kafka broker {addr} answered {api} for {what} with {error:?}: {error}")]
    Broker {
        /// The broker's address.
        addr: String,
        /// The request.
        api: &'static str,
        /// What the request was about (a transactional id, a topic).
        what: String,
        /// The error code.
        error: ResponseError,
    },
    /// The answer could not be used (encoding, framing, a version neither side knows).
    #[error("Kafka broker {addr}: {message}")]
    Protocol {
        /// The broker's address.
        addr: String,
        /// What was wrong.
        message: String,
    },
    /// A retriable condition lasted past the request timeout.
    #[error("Kafka: {what} did not succeed within {timeout:?}: {last}")]
    TimedOut {
        /// What was attempted.
        what: String,
        /// The request timeout.
        timeout: Duration,
        /// The last error.
        last: String,
    },
}

impl WireError {
    /// The broker's error code, if the broker answered with one.
    pub fn broker_error(&self) -> Option<ResponseError> {
        match self {
            WireError::Broker { error, .. } => Some(*error),
            _ => None,
        }
    }
}

/// A producer's identity as the transaction coordinator knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerIdentity {
    /// The producer id.
    pub id: i64,
    /// The producer epoch.
    pub epoch: i16,
}

/// What a control batch marks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Marker {
    /// The transaction's records were aborted.
    Abort,
    /// The transaction's records were committed.
    Commit,
}

/// One record batch (magic 2) of a Fetch answer: its header, and its records undecoded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordBatch {
    /// Offset of its first record.
    pub base_offset: i64,
    /// Offset of its last record.
    pub last_offset: i64,
    /// The producer that wrote it (-1: none).
    pub producer_id: i64,
    /// That producer's epoch.
    pub producer_epoch: i16,
    /// Written inside a transaction.
    pub transactional: bool,
    /// A control batch: its marker (commit or abort of `producer_id`'s transaction).
    pub marker: Option<Marker>,
    /// Number of records.
    pub record_count: i32,
    /// The compression codec (attributes bits 0-2; 0: none).
    compression: i16,
    /// The records, as they follow the header.
    body: Bytes,
}

/// One record of a batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record {
    /// Its offset.
    pub offset: i64,
    /// Its key (None: null).
    pub key: Option<Bytes>,
    /// Its value (None: null).
    pub value: Option<Bytes>,
}

impl RecordBatch {
    /// The batch's records. Only uncompressed batches are decoded (this client reads what
    /// cairn's sink writes, which compresses nothing).
    pub fn records(&self) -> Result<Vec<Record>, String> {
        if self.compression != 0 {
            return Err(format!(
                "batch at offset {} is compressed (codec {}); only uncompressed batches are read",
                self.base_offset, self.compression
            ));
        }
        let mut body = self.body.clone();
        let mut out = Vec::with_capacity(usize::try_from(self.record_count).unwrap_or(0));
        for _ in 0..self.record_count {
            let length = varint(&mut body)?;
            let length = usize::try_from(length).map_err(|_| format!("record length {length}"))?;
            if body.remaining() < length {
                return Err(format!("truncated record in batch at {}", self.base_offset));
            }
            let mut rec = body.split_to(length);
            if !rec.has_remaining() {
                return Err(format!("empty record in batch at {}", self.base_offset));
            }
            let _attributes = rec.get_i8();
            let _timestamp_delta = varint(&mut rec)?;
            let offset_delta = varint(&mut rec)?;
            let key = bytes_field(&mut rec)?;
            let value = bytes_field(&mut rec)?;
            out.push(Record {
                offset: self.base_offset + offset_delta,
                key,
                value,
            });
        }
        Ok(out)
    }
}

/// A varint-length-prefixed byte field (-1: null).
fn bytes_field(buf: &mut Bytes) -> Result<Option<Bytes>, String> {
    let len = varint(buf)?;
    if len < 0 {
        return Ok(None);
    }
    let len = usize::try_from(len).map_err(|_| format!("field length {len}"))?;
    if buf.remaining() < len {
        return Err(format!("field of {len} bytes truncated"));
    }
    Ok(Some(buf.split_to(len)))
}

/// One partition's answer to a Fetch.
#[derive(Debug, Clone, Default)]
pub struct FetchedPartition {
    /// The offset after the last replicated record.
    pub high_watermark: i64,
    /// The offset before which no transaction is open (-1 if the broker does not say).
    pub last_stable_offset: i64,
    /// The transactions the broker lists as aborted in the fetched range (read committed only):
    /// producer id and first offset.
    pub aborted: Vec<(i64, i64)>,
    /// The batches, in offset order.
    pub batches: Vec<RecordBatch>,
}

/// A partition's leader, from Metadata.
#[derive(Debug, Clone)]
pub struct TopicMetadata {
    /// Partition index → address of its leader (None: no leader now).
    pub leaders: Vec<Option<String>>,
}

struct Connection {
    stream: TcpStream,
    /// API key → (min, max) version the broker supports.
    versions: HashMap<i16, (i16, i16)>,
    correlation: i32,
}

/// A blocking client over one or more bootstrap brokers.
pub struct WireClient {
    bootstrap: Vec<String>,
    timeout: Duration,
    connections: HashMap<String, Connection>,
}

/// The broker's error code as a `Result`.
fn check(code: i16) -> Result<(), ResponseError> {
    match ResponseError::try_from_code(code) {
        None => Ok(()),
        Some(e) => Err(e),
    }
}

fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

impl WireClient {
    /// A client of the brokers `bootstrap` (`HOST:PORT[,HOST:PORT...]`); `timeout` bounds every
    /// connect, request and retry loop.
    pub fn new(bootstrap: &str, timeout: Duration) -> Self {
        WireClient {
            bootstrap: bootstrap
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
            timeout,
            connections: HashMap::new(),
        }
    }

    /// The request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn connect(&self, addr: &str) -> Result<Connection, WireError> {
        let io = |source| WireError::Io {
            addr: addr.to_string(),
            source,
        };
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
        let mut stream = None;
        for sa in addr.to_socket_addrs().map_err(io)? {
            match TcpStream::connect_timeout(&sa, self.timeout) {
                Ok(s) => {
                    stream = Some(s);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let stream = stream.ok_or_else(|| io(last))?;
        stream.set_read_timeout(Some(self.timeout)).map_err(io)?;
        stream.set_write_timeout(Some(self.timeout)).map_err(io)?;
        stream.set_nodelay(true).map_err(io)?;
        let mut conn = Connection {
            stream,
            versions: HashMap::new(),
            correlation: 0,
        };
        let answer = roundtrip(addr, &mut conn, &ApiVersionsRequest::default(), 0)?;
        check(answer.error_code).map_err(|error| WireError::Broker {
            addr: addr.to_string(),
            api: "ApiVersions",
            what: "the client".into(),
            error,
        })?;
        conn.versions = answer
            .api_keys
            .iter()
            .map(|k| (k.api_key, (k.min_version, k.max_version)))
            .collect();
        Ok(conn)
    }

    /// Sends `req` to `addr` at the highest version in `ours` the broker supports.
    fn call<R: Request>(
        &mut self,
        addr: &str,
        req: &R,
        ours: RangeInclusive<i16>,
    ) -> Result<R::Response, WireError> {
        if !self.connections.contains_key(addr) {
            let conn = self.connect(addr)?;
            self.connections.insert(addr.to_string(), conn);
        }
        let Some(conn) = self.connections.get_mut(addr) else {
            unreachable!("inserted above");
        };
        let (min, max) = conn.versions.get(&R::KEY).copied().unwrap_or((0, -1));
        let version = (*ours.end()).min(max);
        if version < min.max(*ours.start()) {
            return Err(WireError::Protocol {
                addr: addr.to_string(),
                message: format!(
                    "{:?} versions {min}..={max} are supported, this client speaks {ours:?}",
                    ApiKey::try_from(R::KEY).map_err(|_| ()),
                ),
            });
        }
        let result = roundtrip(addr, conn, req, version);
        if matches!(
            result,
            Err(WireError::Io { .. } | WireError::Protocol { .. })
        ) {
            // A broken or confused connection is not reused.
            self.connections.remove(addr);
        }
        result
    }

    /// Sends `req` to the first bootstrap broker that answers.
    fn call_any<R: Request>(
        &mut self,
        req: &R,
        ours: RangeInclusive<i16>,
    ) -> Result<R::Response, WireError> {
        let mut last = None;
        for addr in self.bootstrap.clone() {
            match self.call(&addr, req, ours.clone()) {
                Ok(r) => return Ok(r),
                Err(e @ (WireError::Io { .. } | WireError::Protocol { .. })) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| WireError::Protocol {
            addr: String::new(),
            message: "no bootstrap broker given".into(),
        }))
    }

    /// Runs `attempt` until it succeeds, fails with a non-retriable error, or the timeout
    /// passes; `retriable` says which broker errors are worth another try.
    fn retrying<T>(
        &mut self,
        what: impl Fn() -> String,
        retriable: impl Fn(ResponseError) -> bool,
        mut attempt: impl FnMut(&mut Self) -> Result<T, WireError>,
    ) -> Result<T, WireError> {
        let deadline = Instant::now() + self.timeout;
        loop {
            match attempt(self) {
                Ok(t) => return Ok(t),
                Err(e) if e.broker_error().is_some_and(&retriable) => {
                    if Instant::now() >= deadline {
                        return Err(WireError::TimedOut {
                            what: what(),
                            timeout: self.timeout,
                            last: e.to_string(),
                        });
                    }
                    std::thread::sleep(RETRY_BACKOFF);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Metadata of `topic`: its partitions' leaders. With `create`, a broker that creates
    /// topics automatically creates it. None if the topic does not exist.
    pub fn topic_metadata(
        &mut self,
        topic: &str,
        create: bool,
    ) -> Result<Option<TopicMetadata>, WireError> {
        let req = MetadataRequest::default()
            .with_topics(Some(vec![
                MetadataRequestTopic::default().with_name(Some(TopicName(str_bytes(topic))))
            ]))
            .with_allow_auto_topic_creation(create);
        let answer = self.call_any(&req, 4..=9)?;
        let brokers: HashMap<i32, String> = answer
            .brokers
            .iter()
            .map(|b| (b.node_id.0, format!("{}:{}", b.host.as_str(), b.port)))
            .collect();
        let Some(t) = answer
            .topics
            .iter()
            .find(|t| t.name.as_ref().is_some_and(|n| n.0.as_str() == topic))
        else {
            return Ok(None);
        };
        match ResponseError::try_from_code(t.error_code) {
            None => {}
            Some(ResponseError::UnknownTopicOrPartition) => return Ok(None),
            Some(error) => {
                return Err(WireError::Broker {
                    addr: self.bootstrap.join(","),
                    api: "Metadata",
                    what: format!("topic {topic}"),
                    error,
                })
            }
        }
        let mut leaders = vec![None; t.partitions.len()];
        for p in &t.partitions {
            if let Some(slot) = usize::try_from(p.partition_index)
                .ok()
                .and_then(|i| leaders.get_mut(i))
            {
                *slot = brokers.get(&p.leader_id.0).cloned();
            }
        }
        Ok(Some(TopicMetadata { leaders }))
    }

    /// Creates `topic` with `partitions` partitions (replication factor 1); fine if it exists.
    pub fn create_topic(&mut self, topic: &str, partitions: i32) -> Result<(), WireError> {
        let req = CreateTopicsRequest::default()
            .with_topics(vec![CreatableTopic::default()
                .with_name(TopicName(str_bytes(topic)))
                .with_num_partitions(partitions)
                .with_replication_factor(1)])
            .with_timeout_ms(i32::try_from(self.timeout.as_millis()).unwrap_or(i32::MAX));
        let answer = self.call_any(&req, 2..=5)?;
        for t in &answer.topics {
            match ResponseError::try_from_code(t.error_code) {
                None | Some(ResponseError::TopicAlreadyExists) => {}
                Some(error) => {
                    return Err(WireError::Broker {
                        addr: self.bootstrap.join(","),
                        api: "CreateTopics",
                        what: format!("topic {topic}"),
                        error,
                    })
                }
            }
        }
        Ok(())
    }

    /// The address of the transaction coordinator of `transactional_id`.
    pub fn transaction_coordinator(&mut self, transactional_id: &str) -> Result<String, WireError> {
        let what = || format!("finding the coordinator of transactional id {transactional_id}");
        let req = FindCoordinatorRequest::default()
            .with_key(str_bytes(transactional_id))
            .with_key_type(1);
        self.retrying(
            what,
            |e| {
                matches!(
                    e,
                    ResponseError::CoordinatorNotAvailable
                        | ResponseError::CoordinatorLoadInProgress
                )
            },
            |c| {
                let answer = c.call_any(&req, 1..=3)?;
                check(answer.error_code).map_err(|error| WireError::Broker {
                    addr: c.bootstrap.join(","),
                    api: "FindCoordinator",
                    what: format!("transactional id {transactional_id}"),
                    error,
                })?;
                Ok(format!("{}:{}", answer.host.as_str(), answer.port))
            },
        )
    }

    /// Sends `req` about `transactional_id` to its coordinator, finding it again (and
    /// retrying) while the broker says it is not the coordinator, is loading, or is still
    /// completing an earlier transaction of the id.
    fn send_to_coordinator<R: Request>(
        &mut self,
        api: &'static str,
        transactional_id: &str,
        req: &R,
        ours: RangeInclusive<i16>,
        error_of: impl Fn(&R::Response) -> i16,
    ) -> Result<R::Response, WireError> {
        let what = || format!("{api} for transactional id {transactional_id}");
        self.retrying(
            what,
            |e| {
                matches!(
                    e,
                    ResponseError::NotCoordinator
                        | ResponseError::CoordinatorNotAvailable
                        | ResponseError::CoordinatorLoadInProgress
                        | ResponseError::ConcurrentTransactions
                )
            },
            |c| {
                let addr = c.transaction_coordinator(transactional_id)?;
                let answer = c.call(&addr, req, ours.clone())?;
                check(error_of(&answer)).map_err(|error| WireError::Broker {
                    addr,
                    api,
                    what: format!("transactional id {transactional_id}"),
                    error,
                })?;
                Ok(answer)
            },
        )
    }

    /// `InitProducerId` for `transactional_id`, as a new transactional producer does: the
    /// coordinator bumps the id's epoch, which fences every producer of an older epoch, and
    /// aborts the transaction that is open under the id, if any. A transactional id the
    /// coordinator has never seen gets epoch 0.
    pub fn init_producer_id(
        &mut self,
        transactional_id: &str,
        transaction_timeout_ms: i32,
    ) -> Result<ProducerIdentity, WireError> {
        let req = InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(str_bytes(transactional_id))))
            .with_transaction_timeout_ms(transaction_timeout_ms);
        let answer =
            self.send_to_coordinator("InitProducerId", transactional_id, &req, 0..=4, |a| {
                a.error_code
            })?;
        Ok(ProducerIdentity {
            id: answer.producer_id.0,
            epoch: answer.producer_epoch,
        })
    }

    /// `EndTxn`: commits (or aborts) the transaction of `transactional_id` that `producer`
    /// opened, whichever process that producer lived in.
    pub fn end_txn(
        &mut self,
        transactional_id: &str,
        producer: ProducerIdentity,
        commit: bool,
    ) -> Result<(), WireError> {
        let req = EndTxnRequest::default()
            .with_transactional_id(TransactionalId(str_bytes(transactional_id)))
            .with_producer_id(producer.id.into())
            .with_producer_epoch(producer.epoch)
            .with_committed(commit);
        self.send_to_coordinator("EndTxn", transactional_id, &req, 0..=3, |a| a.error_code)?;
        Ok(())
    }

    /// Fetches from `topic`/`partition` at `offset` up to `max_bytes` from `leader`: the
    /// batch headers and offsets. `read_committed` asks for the read-committed view (the
    /// broker then lists aborted transactions and stops at the last stable offset).
    pub fn fetch(
        &mut self,
        leader: &str,
        topic: &str,
        partition: i32,
        offset: i64,
        max_bytes: i32,
        read_committed: bool,
    ) -> Result<FetchedPartition, WireError> {
        let req = FetchRequest::default()
            // Some brokers (Tansu) answer `min_bytes: 0` with no partition at all: ask for a
            // byte and wait briefly instead.
            .with_max_wait_ms(FETCH_WAIT_MS)
            .with_min_bytes(1)
            .with_max_bytes(max_bytes)
            .with_isolation_level(i8::from(read_committed))
            .with_topics(vec![FetchTopic::default()
                .with_topic(TopicName(str_bytes(topic)))
                .with_partitions(vec![FetchPartition::default()
                    .with_partition(partition)
                    .with_fetch_offset(offset)
                    .with_partition_max_bytes(max_bytes)])]);
        let answer = self.call(leader, &req, 4..=12)?;
        let broker = |error| WireError::Broker {
            addr: leader.to_string(),
            api: "Fetch",
            what: format!("{topic}/{partition} at offset {offset}"),
            error,
        };
        check(answer.error_code).map_err(broker)?;
        let Some(p) = answer
            .responses
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
        else {
            // Nothing at `offset` within the wait (the broker left the partition out).
            return Ok(FetchedPartition {
                high_watermark: -1,
                last_stable_offset: -1,
                ..FetchedPartition::default()
            });
        };
        check(p.error_code).map_err(broker)?;
        let batches = match &p.records {
            Some(bytes) => parse_batches(bytes.clone()).map_err(|message| WireError::Protocol {
                addr: leader.to_string(),
                message: format!("{topic}/{partition}: {message}"),
            })?,
            None => Vec::new(),
        };
        Ok(FetchedPartition {
            high_watermark: p.high_watermark,
            last_stable_offset: p.last_stable_offset,
            aborted: p
                .aborted_transactions
                .iter()
                .flatten()
                .map(|a| (a.producer_id.0, a.first_offset))
                .collect(),
            batches,
        })
    }

    /// The leader of `topic`/`partition`.
    pub fn leader(&mut self, topic: &str, partition: i32) -> Result<String, WireError> {
        let bootstrap = self.bootstrap.join(",");
        let no_leader = || WireError::Protocol {
            addr: bootstrap.clone(),
            message: format!("no leader for {topic}/{partition}"),
        };
        let meta = self.topic_metadata(topic, false)?.ok_or_else(no_leader)?;
        usize::try_from(partition)
            .ok()
            .and_then(|i| meta.leaders.get(i).cloned().flatten())
            .ok_or_else(no_leader)
    }

    /// The end offset (high watermark) of `topic`/`partition`, from its leader.
    pub fn end_offset(&mut self, topic: &str, partition: i32) -> Result<i64, WireError> {
        let leader = self.leader(topic, partition)?;
        let req = ListOffsetsRequest::default()
            .with_replica_id((-1).into())
            .with_topics(vec![ListOffsetsTopic::default()
                .with_name(TopicName(str_bytes(topic)))
                .with_partitions(vec![ListOffsetsPartition::default()
                    .with_partition_index(partition)
                    .with_timestamp(-1)])]);
        let answer = self.call(&leader, &req, 1..=7)?;
        let p = answer
            .topics
            .iter()
            .flat_map(|t| t.partitions.iter())
            .find(|p| p.partition_index == partition)
            .ok_or_else(|| WireError::Protocol {
                addr: leader.clone(),
                message: format!("ListOffsets answer without {topic}/{partition}"),
            })?;
        check(p.error_code).map_err(|error| WireError::Broker {
            addr: leader.clone(),
            api: "ListOffsets",
            what: format!("{topic}/{partition}"),
            error,
        })?;
        Ok(p.offset)
    }

    /// Every batch of `topic`/`partition` from `from` to its end offset at the call (read
    /// uncommitted: data of open and aborted transactions, and the control batches), stopping
    /// early once `bytes_max` bytes were read.
    pub fn read_partition(
        &mut self,
        topic: &str,
        partition: i32,
        from: i64,
        bytes_max: usize,
    ) -> Result<Vec<RecordBatch>, WireError> {
        let leader = self.leader(topic, partition)?;
        let end = self.end_offset(topic, partition)?;
        let deadline = Instant::now() + self.timeout;
        let (mut offset, mut read, mut out) = (from, 0usize, Vec::new());
        while offset < end && read < bytes_max {
            let fetched = self.fetch(&leader, topic, partition, offset, 1 << 20, false)?;
            let before = offset;
            for b in fetched.batches {
                if b.last_offset >= offset {
                    offset = b.last_offset + 1;
                    read += b.body.len() + BATCH_HEADER_BYTES;
                    out.push(b);
                }
            }
            if offset == before && Instant::now() >= deadline {
                return Err(WireError::TimedOut {
                    what: format!("reading {topic}/{partition} from offset {offset} to {end}"),
                    timeout: self.timeout,
                    last: "no data returned".into(),
                });
            }
        }
        Ok(out)
    }

    /// How the transaction of `producer_id` that wrote at `first_offset` of
    /// `topic`/`partition` ended: the first marker of that producer after it, if any within
    /// `bytes_max` bytes of the log.
    pub fn transaction_outcome(
        &mut self,
        topic: &str,
        partition: i32,
        first_offset: i64,
        producer_id: i64,
        bytes_max: usize,
    ) -> Result<Option<Marker>, WireError> {
        let batches = self.read_partition(topic, partition, first_offset, bytes_max)?;
        Ok(batches
            .iter()
            .filter(|b| b.producer_id == producer_id && b.base_offset > first_offset)
            .find_map(|b| b.marker))
    }

    /// The producer that wrote the record at `offset` of `topic`/`partition`: the producer id
    /// and epoch of the batch holding it (read uncommitted, so an open transaction's records
    /// are seen).
    pub fn producer_of_record(
        &mut self,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Result<ProducerIdentity, WireError> {
        let leader = self.leader(topic, partition)?;
        let fetched = self.fetch(&leader, topic, partition, offset, 64 << 10, false)?;
        fetched
            .batches
            .iter()
            .find(|b| b.base_offset <= offset && offset <= b.last_offset)
            .map(|b| ProducerIdentity {
                id: b.producer_id,
                epoch: b.producer_epoch,
            })
            .ok_or_else(|| WireError::Protocol {
                addr: leader,
                message: format!(
                    "no record batch holds offset {offset} of {topic}/{partition} (high watermark {})",
                    fetched.high_watermark
                ),
            })
    }
}

impl WireClient {
    /// The whole log of `topic` (every partition from offset 0 to its end offset now).
    pub fn read_topic(&mut self, topic: &str) -> Result<TopicLog, WireError> {
        let partitions = self
            .topic_metadata(topic, false)?
            .map_or(0, |m| m.leaders.len());
        let mut out = Vec::with_capacity(partitions);
        for p in 0..partitions {
            let p = i32::try_from(p).unwrap_or(i32::MAX);
            out.push(self.read_partition(topic, p, 0, usize::MAX)?);
        }
        Ok(TopicLog { partitions: out })
    }
}

/// How the records one transaction of a producer wrote into one partition ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransactionFate {
    /// The partition.
    pub partition: i32,
    /// The producer id of its records.
    pub producer_id: i64,
    /// The producer epoch of its records.
    pub producer_epoch: i16,
    /// Offset of its first record in the partition.
    pub first_offset: i64,
    /// Its records in the partition.
    pub records: u64,
    /// Its marker; None: still open.
    pub outcome: Option<Marker>,
}

/// A topic's raw log (read uncommitted), from which the read-committed view is computed the
/// way a consumer with `isolation.level=read_committed` should see it: a transactional
/// producer's records belong to the transaction that the producer's next marker in the
/// partition ends; committed ones are visible, aborted ones are not, open ones not yet.
/// Checked here instead of through a consumer because some brokers (Tansu) hand aborted
/// records to read-committed consumers.
#[derive(Debug, Clone, Default)]
pub struct TopicLog {
    /// Each partition's batches in offset order.
    pub partitions: Vec<Vec<RecordBatch>>,
}

impl TopicLog {
    /// Every transaction per partition, with the batches (indices into the partition) that
    /// belong to it.
    fn fates(&self) -> Vec<(TransactionFate, Vec<usize>)> {
        let mut all = Vec::new();
        for (p, batches) in self.partitions.iter().enumerate() {
            let partition = i32::try_from(p).unwrap_or(i32::MAX);
            let mut open: HashMap<i64, (TransactionFate, Vec<usize>)> = HashMap::new();
            for (i, b) in batches.iter().enumerate() {
                if !b.transactional {
                    continue;
                }
                if let Some(marker) = b.marker {
                    if let Some((mut fate, members)) = open.remove(&b.producer_id) {
                        fate.outcome = Some(marker);
                        all.push((fate, members));
                    }
                    continue;
                }
                let (fate, members) = open.entry(b.producer_id).or_insert_with(|| {
                    (
                        TransactionFate {
                            partition,
                            producer_id: b.producer_id,
                            producer_epoch: b.producer_epoch,
                            first_offset: b.base_offset,
                            records: 0,
                            outcome: None,
                        },
                        Vec::new(),
                    )
                });
                fate.records += u64::try_from(b.record_count).unwrap_or(0);
                members.push(i);
            }
            all.extend(open.into_values());
        }
        all.sort_by_key(|(f, _)| (f.partition, f.first_offset));
        all
    }

    /// Every transaction of every partition, in partition and offset order.
    pub fn transactions(&self) -> Vec<TransactionFate> {
        self.fates().into_iter().map(|(f, _)| f).collect()
    }

    /// The records a read-committed consumer sees: those of committed transactions and of
    /// non-transactional batches (not those of open or aborted transactions).
    pub fn committed_records(&self) -> Result<Vec<Record>, String> {
        let mut visible: Vec<Vec<bool>> = self
            .partitions
            .iter()
            .map(|batches| {
                batches
                    .iter()
                    .map(|b| !b.transactional && b.marker.is_none())
                    .collect()
            })
            .collect();
        for (fate, members) in self.fates() {
            if fate.outcome == Some(Marker::Commit) {
                let p = usize::try_from(fate.partition).unwrap_or(usize::MAX);
                for i in members {
                    visible[p][i] = true;
                }
            }
        }
        let mut out = Vec::new();
        for (batches, visible) in self.partitions.iter().zip(visible) {
            for (b, v) in batches.iter().zip(visible) {
                if v {
                    out.extend(b.records()?);
                }
            }
        }
        Ok(out)
    }
}

/// One request and its response on `conn`.
fn roundtrip<R: Request>(
    addr: &str,
    conn: &mut Connection,
    req: &R,
    version: i16,
) -> Result<R::Response, WireError> {
    let protocol = |message: String| WireError::Protocol {
        addr: addr.to_string(),
        message,
    };
    let io = |source| WireError::Io {
        addr: addr.to_string(),
        source,
    };
    conn.correlation = conn.correlation.wrapping_add(1);
    let header = RequestHeader::default()
        .with_request_api_key(R::KEY)
        .with_request_api_version(version)
        .with_correlation_id(conn.correlation)
        .with_client_id(Some(StrBytes::from_static_str("cairn")));
    let mut buf = BytesMut::with_capacity(256);
    buf.extend_from_slice(&[0; 4]);
    header
        .encode(&mut buf, R::header_version(version))
        .and_then(|()| req.encode(&mut buf, version))
        .map_err(|e| protocol(format!("cannot encode request: {e}")))?;
    let len = u32::try_from(buf.len() - 4).map_err(|_| protocol("request too large".into()))?;
    buf[..4].copy_from_slice(&len.to_be_bytes());
    conn.stream.write_all(&buf).map_err(io)?;
    let mut size = [0u8; 4];
    conn.stream.read_exact(&mut size).map_err(io)?;
    let size = u32::from_be_bytes(size) as usize;
    if size > FRAME_BYTES_MAX {
        return Err(protocol(format!("response of {size} bytes is too large")));
    }
    let mut frame = vec![0u8; size];
    conn.stream.read_exact(&mut frame).map_err(io)?;
    let mut frame = Bytes::from(frame);
    let header = ResponseHeader::decode(&mut frame, R::Response::header_version(version))
        .map_err(|e| protocol(format!("cannot decode response header: {e}")))?;
    if header.correlation_id != conn.correlation {
        return Err(protocol(format!(
            "response to request {} while waiting for {}",
            header.correlation_id, conn.correlation
        )));
    }
    R::Response::decode(&mut frame, version)
        .map_err(|e| protocol(format!("cannot decode response: {e}")))
}

/// Size of a record batch's header (magic 2) up to and including the record count.
const BATCH_HEADER_BYTES: usize = 61;
/// `attributes`: the compression codec.
const ATTR_COMPRESSION: i16 = 0x07;
/// `attributes`: the batch was written inside a transaction.
const ATTR_TRANSACTIONAL: i16 = 0x10;
/// `attributes`: the batch holds a control record (a transaction marker).
const ATTR_CONTROL: i16 = 0x20;

/// The record batches in a Fetch answer's `records`. A trailing partial batch (the broker cuts
/// at the byte limit) is left out.
pub fn parse_batches(mut bytes: Bytes) -> Result<Vec<RecordBatch>, String> {
    let mut out = Vec::new();
    while bytes.len() >= 12 {
        let base_offset = (&bytes[0..8]).get_i64();
        let length = (&bytes[8..12]).get_i32();
        let total = 12 + usize::try_from(length).map_err(|_| format!("batch length {length}"))?;
        if bytes.len() < total {
            break;
        }
        let mut batch = bytes.split_to(total);
        if total < BATCH_HEADER_BYTES {
            return Err(format!("batch at offset {base_offset} is {total} bytes"));
        }
        batch.advance(16);
        let magic = batch.get_i8();
        if magic != 2 {
            return Err(format!(
                "batch at offset {base_offset} has magic {magic}, not 2"
            ));
        }
        let _crc = batch.get_u32();
        let attributes = batch.get_i16();
        let last_offset_delta = batch.get_i32();
        let _base_timestamp = batch.get_i64();
        let _max_timestamp = batch.get_i64();
        let producer_id = batch.get_i64();
        let producer_epoch = batch.get_i16();
        let _base_sequence = batch.get_i32();
        let record_count = batch.get_i32();
        let marker = if attributes & ATTR_CONTROL != 0 {
            let mut body = batch.clone();
            Some(control_marker(&mut body).map_err(|e| format!("offset {base_offset}: {e}"))?)
        } else {
            None
        };
        out.push(RecordBatch {
            base_offset,
            last_offset: base_offset + i64::from(last_offset_delta),
            producer_id,
            producer_epoch,
            transactional: attributes & ATTR_TRANSACTIONAL != 0,
            marker,
            record_count,
            compression: attributes & ATTR_COMPRESSION,
            body: batch,
        });
    }
    Ok(out)
}

/// A zigzag varint.
fn varint(buf: &mut Bytes) -> Result<i64, String> {
    let mut value: u64 = 0;
    for shift in (0..64).step_by(7) {
        if !buf.has_remaining() {
            return Err("truncated varint".into());
        }
        let b = buf.get_u8();
        value |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(((value >> 1) as i64) ^ -((value & 1) as i64));
        }
    }
    Err("varint too long".into())
}

/// The marker of a control batch: its (single) record's key is `version: i16, type: i16`,
/// type 0 abort, 1 commit.
fn control_marker(batch: &mut Bytes) -> Result<Marker, String> {
    let _length = varint(batch)?;
    if !batch.has_remaining() {
        return Err("control batch without a record".into());
    }
    let _attributes = batch.get_i8();
    let _timestamp_delta = varint(batch)?;
    let _offset_delta = varint(batch)?;
    let key_length = varint(batch)?;
    if key_length < 4 || batch.remaining() < 4 {
        return Err(format!("control record key of {key_length} bytes"));
    }
    let _version = batch.get_i16();
    match batch.get_i16() {
        0 => Ok(Marker::Abort),
        1 => Ok(Marker::Commit),
        other => Err(format!("control record of type {other}")),
    }
}
