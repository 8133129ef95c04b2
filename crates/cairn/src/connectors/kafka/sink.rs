//! The Kafka sink: `none`, `at-least-once` (flush at the barrier) and `exactly-once` (Kafka
//! transactions as a two-phase commit, R16).
//!
//! # Exactly-once
//!
//! Each subtask writes into a Kafka transaction of its own. At the barrier of checkpoint c
//! (pre-commit) it flushes the transaction and leaves it open, remembered in the checkpoint
//! with its producer id and epoch; when c completes (commit) it commits every transaction
//! pre-committed up to c with an `EndTxn` carrying that id and epoch, exactly as a restore
//! does (the coordinator does not care which connection ends a transaction; the producer
//! instance is dropped at the pre-commit, and librdkafka never blocks on a producer that was
//! fenced meanwhile). The next records go into the next transaction, which a thread of its own
//! opened ahead.
//!
//! **Transactional ids.** Each transaction has a transactional id of its own,
//! `<prefix>-<subtask>-<n>` (Flink's scheme): `n` counts the subtask's transactions, one more
//! for each transaction that was pre-committed with records in it. The prefix defaults to
//! `cairn-<job id>-<sink uid>`. Ids are numbered by transaction rather than by checkpoint id so
//! that the ids one attempt of a subtask uses are consecutive: checkpoint ids continue after
//! a restore past those a failed attempt used, and a subtask may see no records between two
//! barriers. A restore finds the leftovers of failed attempts by walking those ids.
//!
//! **Producer id and epoch.** Committing after a crash needs the producer id and epoch under
//! which the transaction was opened; librdkafka does not expose them. The sink reads them from
//! Kafka itself: at pre-commit, the first record the transaction wrote (its partition and
//! offset come back in the delivery report) is fetched uncommitted ([`WireClient::fetch`]), and
//! the header of the record batch holding it carries the producer id and epoch that wrote it.
//! That is the ground truth of which producer instance owns the open transaction: one Fetch
//! per pre-committed transaction, none per record.
//!
//! **Restore** ([`Sink::initialize`], before any writer of the attempt exists), given the
//! pre-committed transactions of the restored checkpoint:
//! 1. each is committed with a wire-level `EndTxn(commit)` carrying its stored producer id and
//!    epoch (`FindCoordinator` for its transactional id, then `EndTxn` to the coordinator).
//!    This is idempotent: a transaction committed already (by the writer before the crash, or
//!    by an earlier restore) commits again without harm. If the broker refuses, the partition
//!    it wrote to is read for the transaction's marker: a commit marker means it was committed
//!    already; an abort marker means its records are lost (the broker aborted it, normally
//!    after `transaction.timeout.ms`), and the restore fails saying so rather than going on
//!    with a hole in the output.
//! 2. the transactions that failed attempts opened after the restored checkpoint are aborted:
//!    for every subtask, `InitProducerId` is sent for its ids from the first one the restored
//!    checkpoint does not cover, one after another, until an id has never been used (the
//!    coordinator answers epoch 0). `InitProducerId` fences every older producer of the id and
//!    aborts its open transaction. Subtasks beyond the restored checkpoint's parallelism are
//!    walked the same way until one has used no id (a failed attempt may have run with more
//!    subtasks), as Flink does. The first transaction each writer opens is opened at once, so
//!    that a subtask that never got a record still uses its first id.
//!
//! The writers of the attempt then continue numbering where the walk started, so the next
//! restore walks their ids too. Where that is is a function of the restored checkpoint's
//! cursors alone ([`RestorePlan::of`]), which [`Sink::create_writer`] is given too
//! ([`SinkContext::restored`]): a writer needs nothing [`Sink::initialize`] kept, so the
//! writers can run in other processes than the restore (the workers of a cluster, the
//! restore in the coordinator's job master).
//!
//! **Timeouts.** A broker aborts a transaction open longer than `transaction.timeout.ms`.
//! A pending transaction that reaches [`KafkaSinkConfig::timeout_warning_ratio`] of it (also
//! at restore, after downtime) is named in a warning.
//!
//! **Fencing.** A producer whose transactional id a newer producer took over (a zombie: another
//! instance of the job with the same prefix) gets `ProducerFenced`; the sink fails its task
//! with an error naming the id, never writing on.
//!
//! # At-least-once and none
//!
//! One idempotent producer per subtask; at-least-once flushes it at every barrier (and fails
//! the checkpoint if a record could not be delivered), none does not wait for it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rdkafka::client::ClientContext;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, Producer, ProducerContext};
use serde::{Deserialize, Serialize};
use tracing::{debug, error, info, warn};

use super::client::{check_brokers, client_config};
use super::wire::{Marker, ProducerIdentity, WireClient, WireError};
use super::{KafkaEncoder, KafkaGuarantee, KafkaSinkConfig};
use crate::error::{TaskError, TaskResult};
use crate::failpoint;
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkOwner, SinkWriter};

impl KafkaSinkConfig {
    fn check(&self) -> Result<(), String> {
        check_brokers(&self.brokers)?;
        if self.topic.is_empty() {
            return Err("the Kafka topic name is empty".into());
        }
        let ms = self.transaction_timeout.as_millis();
        if ms == 0 || ms > i32::MAX as u128 {
            return Err(format!(
                "Kafka transaction timeout {:?} is out of range",
                self.transaction_timeout
            ));
        }
        if !(self.timeout_warning_ratio > 0.0 && self.timeout_warning_ratio <= 1.0) {
            return Err(format!(
                "Kafka transaction timeout warning ratio {} is not in (0, 1]",
                self.timeout_warning_ratio
            ));
        }
        if let Some(p) = &self.transactional_id_prefix {
            if p.is_empty() || p.chars().any(char::is_control) {
                return Err(format!("Kafka transactional id prefix {p:?} is not usable"));
            }
        }
        Ok(())
    }

    fn transaction_timeout_ms(&self) -> i32 {
        i32::try_from(self.transaction_timeout.as_millis()).unwrap_or(i32::MAX)
    }
}

/// Whether a record is written as a tombstone: its key and a null value.
type Tombstone<T> = Arc<dyn Fn(&T) -> bool + Send + Sync>;

/// The Kafka sink.
pub struct KafkaSink<T> {
    config: Arc<KafkaSinkConfig>,
    encoder: KafkaEncoder<T>,
    tombstone: Option<Tombstone<T>>,
}

impl<T> KafkaSink<T> {
    /// A sink writing records encoded by `encoder`; the configuration is checked here.
    pub fn new(config: KafkaSinkConfig, encoder: KafkaEncoder<T>) -> Result<Self, String> {
        config.check()?;
        Ok(KafkaSink {
            config: Arc::new(config),
            encoder,
            tombstone: None,
        })
    }

    /// Writes the records `is_tombstone` holds for as tombstones: the key the encoder wrote
    /// and a null value (what a compacted topic deletes a key with), the value ignored.
    pub fn with_tombstones(
        mut self,
        is_tombstone: impl Fn(&T) -> bool + Send + Sync + 'static,
    ) -> Self {
        self.tombstone = Some(Arc::new(is_tombstone));
        self
    }

    fn prefix(&self, owner: &SinkOwner) -> String {
        self.config
            .transactional_id_prefix
            .clone()
            .unwrap_or_else(|| format!("cairn-{}-{}", owner.job_id, owner.uid))
    }
}

/// The transactional id of transaction `n` of `subtask`.
fn transactional_id(prefix: &str, subtask: u32, n: u64) -> String {
    format!("{prefix}-{subtask}-{n}")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The walk over a subtask's ids stops with an error after this many used ones: far more than
/// any failed attempt opens before a restore.
const PROBE_IDS_MAX: u64 = 100_000;
/// How much of a partition a restore reads looking for a transaction's marker.
const MARKER_SCAN_BYTES_MAX: usize = 256 << 20;

/// One entry of the sink's pending state in a checkpoint.
#[derive(Debug, Clone, Serialize, Deserialize)]
enum PendingEntry {
    /// Subtask `subtask`'s transactions up to `next` - 1 are covered by checkpoint
    /// `checkpoint_id`; any later one a failed attempt opened is to be aborted on restore.
    Cursor {
        subtask: u32,
        checkpoint_id: u64,
        next: u64,
    },
    /// A pre-committed transaction, to be committed on restore.
    Transaction(PreparedTransaction),
}

/// A pre-committed transaction, as the checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct PreparedTransaction {
    /// The checkpoint whose barrier pre-committed it.
    checkpoint_id: u64,
    transactional_id: String,
    producer_id: i64,
    producer_epoch: i16,
    /// Where its first record went: a restore reads the marker there if `EndTxn` is refused.
    partition: i32,
    first_offset: i64,
    records: u64,
    /// When its first record was sent (Unix ms): its age against the transaction timeout.
    opened_at_ms: u64,
}

impl PreparedTransaction {
    fn producer(&self) -> ProducerIdentity {
        ProducerIdentity {
            id: self.producer_id,
            epoch: self.producer_epoch,
        }
    }
}

/// Where each subtask's transaction numbering continues in an attempt.
#[derive(Debug, Clone, Default)]
struct RestorePlan {
    restored_checkpoint: u64,
    next: BTreeMap<u32, u64>,
}

impl RestorePlan {
    /// The plan of a restore of `entries` (the restored checkpoint's pending state of every
    /// subtask; none on a fresh start), and the pre-committed transactions among them, each
    /// once, in the order they are committed.
    fn of(entries: Vec<PendingEntry>) -> (Self, Vec<PreparedTransaction>) {
        let mut plan = RestorePlan::default();
        let mut prepared: Vec<PreparedTransaction> = Vec::new();
        for e in entries {
            match e {
                PendingEntry::Cursor {
                    subtask,
                    checkpoint_id,
                    next,
                } => {
                    plan.restored_checkpoint = plan.restored_checkpoint.max(checkpoint_id);
                    let n = plan.next.entry(subtask).or_insert(next);
                    *n = (*n).max(next);
                }
                PendingEntry::Transaction(t) => {
                    if !prepared.contains(&t) {
                        prepared.push(t);
                    }
                }
            }
        }
        prepared.sort_by_key(|t| (t.checkpoint_id, t.transactional_id.clone()));
        (plan, prepared)
    }

    /// The first transaction number of `subtask`: where the restored checkpoint's cursor
    /// says, or (for a subtask the checkpoint did not have) after the checkpoint's id, above
    /// any number used before it.
    fn first(&self, subtask: u32) -> u64 {
        self.next
            .get(&subtask)
            .copied()
            .unwrap_or(self.restored_checkpoint + 1)
    }
}

fn wire_err(e: WireError) -> TaskError {
    TaskError::msg(format!("Kafka sink: {e}"))
}

/// The sink's pending state entries of a checkpoint, decoded.
fn decode_pending(restored: Option<&[Vec<u8>]>) -> TaskResult<Vec<PendingEntry>> {
    restored
        .unwrap_or_default()
        .iter()
        .map(|b| postcard::from_bytes::<PendingEntry>(b))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TaskError::msg(format!("corrupt Kafka sink state in checkpoint: {e}")))
}

impl<T: Send + 'static> Sink<T> for KafkaSink<T> {
    fn guarantee(&self) -> SinkGuarantee {
        match self.config.guarantee {
            KafkaGuarantee::ExactlyOnce => SinkGuarantee::ExactlyOnce,
            KafkaGuarantee::AtLeastOnce => SinkGuarantee::AtLeastOnce,
            KafkaGuarantee::None => SinkGuarantee::None,
        }
    }

    fn initialize(&self, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
        let mut wire = WireClient::new(&self.config.brokers, self.config.request_timeout);
        if wire
            .topic_metadata(&self.config.topic, true)
            .map_err(wire_err)?
            .is_none()
        {
            return Err(TaskError::msg(format!(
                "Kafka topic '{}' does not exist on {} (create it, or let the broker create topics)",
                self.config.topic, self.config.brokers
            )));
        }
        if self.config.guarantee != KafkaGuarantee::ExactlyOnce {
            return Ok(());
        }
        let entries = decode_pending(restored.as_deref())?;
        let prefix = self.prefix(owner);
        let restore = Restore {
            config: &self.config,
            wire,
            uid: &owner.uid,
        };
        restore.run(&prefix, entries)
    }

    fn create_writer(&self, ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        let client_id = format!("cairn-{}-{}", ctx.owner.uid, ctx.subtask);
        let shared = Shared {
            config: self.config.clone(),
            encoder: self.encoder.clone(),
            tombstone: self.tombstone.clone(),
        };
        if self.config.guarantee != KafkaGuarantee::ExactlyOnce {
            return Ok(Box::new(PlainWriter::new(
                shared,
                &client_id,
                ctx.checkpointing,
            )?));
        }
        let (plan, _) = RestorePlan::of(decode_pending(ctx.restored.as_deref())?);
        let (first, last_barrier) = (plan.first(ctx.subtask), plan.restored_checkpoint);
        let mut writer = TransactionalWriter {
            spare: None,
            wire: WireClient::new(&self.config.brokers, self.config.request_timeout),
            shared,
            prefix: self.prefix(&ctx.owner),
            client_id,
            subtask: ctx.subtask,
            next: first,
            last_barrier,
            current: None,
            pending: Vec::new(),
            checkpointing: ctx.checkpointing,
            key: Vec::new(),
            value: Vec::new(),
        };
        // The first transaction is opened at once (see the module docs).
        writer.start()?;
        Ok(Box::new(writer))
    }
}

/// The restore of an exactly-once sink (see the module docs).
struct Restore<'a> {
    config: &'a KafkaSinkConfig,
    wire: WireClient,
    uid: &'a str,
}

impl Restore<'_> {
    fn run(mut self, prefix: &str, entries: Vec<PendingEntry>) -> TaskResult {
        let (plan, prepared) = RestorePlan::of(entries);
        for (i, t) in prepared.iter().enumerate() {
            self.commit(t)?;
            if i == 0 {
                failpoint::hit("sink-restoring", plan.restored_checkpoint);
            }
        }
        if prepared.is_empty() && plan.restored_checkpoint > 0 {
            failpoint::hit("sink-restoring", plan.restored_checkpoint);
        }
        let mut aborted = 0;
        for (&subtask, &first) in &plan.next {
            aborted += self.abort_from(prefix, subtask, first)?;
        }
        // Subtasks the restored checkpoint did not have, up to the first that used no id.
        let mut subtask = plan.next.keys().next_back().map_or(0, |s| s + 1);
        loop {
            let n = self.abort_from(prefix, subtask, plan.first(subtask))?;
            if n == 0 {
                break;
            }
            aborted += n;
            subtask += 1;
        }
        if !prepared.is_empty() || aborted > 0 {
            info!(
                "Kafka sink '{}': committed {} transaction(s) of restored checkpoint {}, aborted or fenced {aborted} later transactional id(s) under prefix {prefix}",
                self.uid,
                prepared.len(),
                plan.restored_checkpoint
            );
        }
        Ok(())
    }

    /// Commits a pre-committed transaction of the restored checkpoint (idempotently).
    fn commit(&mut self, t: &PreparedTransaction) -> TaskResult {
        let id = &t.transactional_id;
        let age = Duration::from_millis(now_ms().saturating_sub(t.opened_at_ms));
        warn_if_near_timeout(self.config, id, age, "pre-committed before the restore");
        let already = commit_prepared(&mut self.wire, self.config, t, true)?;
        info!(
            "Kafka sink '{}': {} transaction {id} (producer id {}, epoch {}) of checkpoint {}{}",
            self.uid,
            if already { "found" } else { "committed" },
            t.producer_id,
            t.producer_epoch,
            t.checkpoint_id,
            if already { " committed already" } else { "" }
        );
        Ok(())
    }

    /// Fences (and so aborts) the ids of `subtask` from number `first` on until one was never
    /// used; returns how many were used.
    fn abort_from(&mut self, prefix: &str, subtask: u32, first: u64) -> TaskResult<u64> {
        for n in first..first + PROBE_IDS_MAX {
            let id = transactional_id(prefix, subtask, n);
            let producer = self
                .wire
                .init_producer_id(&id, self.config.transaction_timeout_ms())
                .map_err(wire_err)?;
            if producer.epoch == 0 {
                return Ok(n - first);
            }
            info!(
                "Kafka sink '{}': fenced transactional id {id} (producer id {}, now epoch {}), aborting what a failed attempt left open under it",
                self.uid, producer.id, producer.epoch
            );
        }
        Err(TaskError::msg(format!(
            "Kafka sink: more than {PROBE_IDS_MAX} used transactional ids under {prefix}-{subtask}- after number {first}"
        )))
    }
}

/// Commits the pre-committed transaction `t` with `EndTxn` carrying its stored producer id and
/// epoch, the same way whether its writer is alive (its checkpoint completed) or died before
/// (a restore): the coordinator does not care which connection ends a transaction, and this
/// way librdkafka never waits on a producer that was fenced meanwhile. Idempotent: returns
/// whether it had been committed already. If the coordinator refuses, the marker the
/// transaction got in the partition its first record went to decides: a commit marker is
/// success, an abort marker means its records are lost, and that is an error.
fn commit_prepared(
    wire: &mut WireClient,
    config: &KafkaSinkConfig,
    t: &PreparedTransaction,
    restore: bool,
) -> TaskResult<bool> {
    let id = &t.transactional_id;
    let refused = match wire.end_txn(id, t.producer(), true) {
        Ok(()) => return Ok(false),
        Err(e) => e,
    };
    let outcome = wire
        .transaction_outcome(
            &config.topic,
            t.partition,
            t.first_offset,
            t.producer_id,
            MARKER_SCAN_BYTES_MAX,
        )
        .map_err(wire_err)?;
    match outcome {
        Some(Marker::Commit) => Ok(true),
        Some(Marker::Abort) if !restore => Err(fenced(
            id,
            &format!(
                "its transaction, pre-committed at checkpoint {}, was aborted before the checkpoint's commit ({} record(s) lost)",
                t.checkpoint_id, t.records
            ),
        )),
        Some(Marker::Abort) => {
            let age = Duration::from_millis(now_ms().saturating_sub(t.opened_at_ms));
            Err(TaskError::msg(format!(
                "Kafka sink: transaction {id} of checkpoint {} was aborted, not committed: its {} record(s) are lost. It was opened {:.0} s ago and transaction.timeout.ms is {} ms (a broker aborts older transactions: restore sooner or raise the timeout), or a newer producer of its transactional id fenced it",
                t.checkpoint_id,
                t.records,
                age.as_secs_f64(),
                config.transaction_timeout.as_millis()
            )))
        }
        None => Err(TaskError::msg(format!(
            "Kafka sink: cannot commit transaction {id} of checkpoint {} (producer id {}, epoch {}): {refused}",
            t.checkpoint_id, t.producer_id, t.producer_epoch
        ))),
    }
}

/// Warns once a transaction of `age` comes close to the transaction timeout.
fn warn_if_near_timeout(config: &KafkaSinkConfig, id: &str, age: Duration, what: &str) -> bool {
    let limit = config
        .transaction_timeout
        .mul_f64(config.timeout_warning_ratio);
    if age < limit {
        return false;
    }
    warn!(
        "Kafka sink: transaction {id} ({what}) has been open for {:.1} s, {:.0}% of transaction.timeout.ms ({} ms): the broker aborts it at the timeout, and its records are lost unless it is committed first",
        age.as_secs_f64(),
        100.0 * age.as_secs_f64() / config.transaction_timeout.as_secs_f64(),
        config.transaction_timeout.as_millis()
    );
    true
}

/// What every writer of a sink shares.
struct Shared<T> {
    config: Arc<KafkaSinkConfig>,
    encoder: KafkaEncoder<T>,
    tombstone: Option<Tombstone<T>>,
}

/// The producer context: delivery reports and errors, seen by the writer's own thread (a
/// `BaseProducer` calls back from `poll` and `flush`).
#[derive(Default)]
struct Deliveries {
    /// The first record delivered: its partition and offset.
    first: OnceLock<(i32, i64)>,
    /// The first record that could not be delivered.
    failed: OnceLock<KafkaError>,
    /// The first error that said the producer was fenced (delivery reports of one failed
    /// request can come after those of records librdkafka purged because of it).
    fenced: OnceLock<KafkaError>,
    delivered: AtomicU64,
}

impl ClientContext for Deliveries {
    fn log(&self, level: RDKafkaLogLevel, fac: &str, message: &str) {
        match level {
            RDKafkaLogLevel::Emerg
            | RDKafkaLogLevel::Alert
            | RDKafkaLogLevel::Critical
            | RDKafkaLogLevel::Error => error!("librdkafka: {fac} {message}"),
            RDKafkaLogLevel::Warning => warn!("librdkafka: {fac} {message}"),
            _ => debug!("librdkafka: {fac} {message}"),
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        warn!("librdkafka: {error}: {reason}");
        if error_code(&error).is_some_and(is_fenced) {
            self.fenced.get_or_init(|| error);
        }
    }
}

impl ProducerContext for Deliveries {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        match result {
            Ok(m) => {
                self.first.get_or_init(|| (m.partition(), m.offset()));
                self.delivered.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                self.failed.get_or_init(|| e.clone());
                if error_code(e).is_some_and(is_fenced) {
                    self.fenced.get_or_init(|| e.clone());
                }
            }
        }
    }
}

type Producer0 = BaseProducer<Deliveries>;

/// Whether `code` says a newer producer took over the transactional id.
fn is_fenced(code: RDKafkaErrorCode) -> bool {
    matches!(
        code,
        RDKafkaErrorCode::ProducerFenced
            | RDKafkaErrorCode::InvalidProducerEpoch
            | RDKafkaErrorCode::Fenced
    )
}

fn error_code(e: &KafkaError) -> Option<RDKafkaErrorCode> {
    match e {
        KafkaError::Transaction(t) => Some(t.code()),
        other => other.rdkafka_error_code(),
    }
}

/// The task error for a producer error; a fencing is named as such.
fn producer_err(id: &str, what: &str, e: &KafkaError) -> TaskError {
    if error_code(e).is_some_and(is_fenced) {
        return fenced(id, &e.to_string());
    }
    TaskError::msg(format!("Kafka sink: {what} ({id}): {e}"))
}

fn fenced(id: &str, detail: &str) -> TaskError {
    TaskError::msg(format!(
        "Kafka sink: the producer of transactional id {id} was fenced: a newer producer took the id over (another instance of this job or sink, or another job sharing its transactional id prefix); stopping instead of writing on: {detail}"
    ))
}

/// Fails if a record could not be delivered or the producer hit a fatal error.
fn check_producer(producer: &Producer0, id: &str) -> TaskResult {
    if let Some((code, reason)) = producer.client().fatal_error() {
        if is_fenced(code) {
            return Err(fenced(id, &reason));
        }
        return Err(TaskError::msg(format!(
            "Kafka sink: fatal producer error ({id}): {code}: {reason}"
        )));
    }
    let deliveries = producer.context();
    if deliveries.fenced.get().is_none()
        && deliveries
            .failed
            .get()
            .is_some_and(|e| e.rdkafka_error_code() == Some(RDKafkaErrorCode::PurgeQueue))
    {
        // Records purged because the transaction failed: the failure's own reports (a fencing,
        // say) may still be queued; take them before naming the cause.
        serve_reports(producer, Duration::from_secs(1));
    }
    if let Some(e) = deliveries.fenced.get().or(deliveries.failed.get()) {
        return Err(producer_err(id, "a record could not be delivered", e));
    }
    Ok(())
}

/// Serves the delivery reports waiting in `producer`'s queue, for at most `limit`.
fn serve_reports(producer: &Producer0, limit: Duration) {
    let deadline = Instant::now() + limit;
    while producer.in_flight_count() > 0 && Instant::now() < deadline {
        producer.poll(POLL_STEP);
    }
}

/// Encodes and sends `batch` (drained) into `producer`'s queue, polling while the queue is
/// full; returns the number of records sent.
fn send_batch<T>(
    producer: &Producer0,
    id: &str,
    shared: &Shared<T>,
    batch: &mut Vec<T>,
    key: &mut Vec<u8>,
    value: &mut Vec<u8>,
) -> TaskResult<u64> {
    let topic = shared.config.topic.as_str();
    let mut sent = 0;
    for r in batch.drain(..) {
        key.clear();
        value.clear();
        (shared.encoder)(&r, key, value);
        let record: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).key(&key[..]);
        let mut record = match &shared.tombstone {
            Some(is_tombstone) if is_tombstone(&r) => record,
            _ => record.payload(&value[..]),
        };
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back)) => {
                    // librdkafka's queue is full: serve delivery reports until there is room.
                    producer.poll(POLL_STEP);
                    check_producer(producer, id)?;
                    record = back;
                }
                Err((e, _)) => {
                    // A transaction in an error state refuses records (librdkafka's `State`);
                    // the delivery reports of the records that failed first tell why.
                    serve_reports(producer, POLL_STEP * 20);
                    check_producer(producer, id)?;
                    return Err(producer_err(id, "cannot send a record", &e));
                }
            }
        }
        sent += 1;
    }
    producer.poll(Duration::ZERO);
    check_producer(producer, id)?;
    Ok(sent)
}

/// How long one wait for librdkafka's events lasts while flushing or while its queue is full.
/// rdkafka's `poll` waits out its whole timeout, and spins through the last millisecond: a
/// few milliseconds keep both the latency and the spinning small (its own `flush` polls in
/// steps of 100 ms, which a barrier would wait out).
const POLL_STEP: Duration = Duration::from_millis(5);

/// Flushes `producer`, then checks every record was delivered.
fn flush(producer: &Producer0, id: &str, timeout: Duration) -> TaskResult {
    let deadline = Instant::now() + timeout;
    loop {
        match producer.flush(Duration::ZERO) {
            Ok(()) => break,
            Err(KafkaError::Flush(RDKafkaErrorCode::OperationTimedOut))
                if Instant::now() < deadline =>
            {
                producer.poll(POLL_STEP);
                // A fenced producer's records may never leave its queue: fail at the first
                // failed one instead of waiting out the timeout.
                check_producer(producer, id)?;
            }
            Err(e) => return Err(producer_err(id, "flush", &e)),
        }
    }
    // librdkafka's flush waits for the acknowledgements only; their delivery reports may
    // still wait in the queue (which `in_flight_count` counts too).
    while producer.in_flight_count() > 0 {
        if Instant::now() >= deadline {
            return Err(TaskError::msg(format!(
                "Kafka sink: flush ({id}): delivery reports still pending after {timeout:?}"
            )));
        }
        producer.poll(POLL_STEP);
    }
    check_producer(producer, id)
}

/// The writer of the `none` and `at-least-once` guarantees: one producer.
struct PlainWriter<T> {
    shared: Shared<T>,
    producer: Producer0,
    client_id: String,
    flush_at_barrier: bool,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl<T> PlainWriter<T> {
    fn new(shared: Shared<T>, client_id: &str, checkpointing: bool) -> TaskResult<Self> {
        let at_least_once = shared.config.guarantee == KafkaGuarantee::AtLeastOnce;
        let mut config = client_config(&shared.config.brokers, client_id);
        if at_least_once {
            config.set("enable.idempotence", "true");
        } else {
            config.set("acks", "1");
        }
        let producer: Producer0 = config
            .create_with_context(Deliveries::default())
            .map_err(|e| TaskError::msg(format!("Kafka sink: cannot create a producer: {e}")))?;
        Ok(PlainWriter {
            shared,
            producer,
            client_id: client_id.to_string(),
            flush_at_barrier: at_least_once && checkpointing,
            key: Vec::new(),
            value: Vec::new(),
        })
    }
}

impl<T: Send> SinkWriter<T> for PlainWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        send_batch(
            &self.producer,
            &self.client_id,
            &self.shared,
            batch,
            &mut self.key,
            &mut self.value,
        )?;
        Ok(())
    }

    fn pre_commit(&mut self, _checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        if self.flush_at_barrier {
            flush(
                &self.producer,
                &self.client_id,
                self.shared.config.request_timeout,
            )?;
        }
        Ok(Vec::new())
    }

    fn commit(&mut self, _checkpoint_id: u64) -> TaskResult {
        Ok(())
    }

    fn finish(&mut self) -> TaskResult {
        flush(
            &self.producer,
            &self.client_id,
            self.shared.config.request_timeout,
        )
    }
}

/// An open transaction: a transactional producer of its own id.
struct OpenTransaction {
    producer: Producer0,
    id: String,
    n: u64,
    records: u64,
    /// When its first record was sent (the broker's timer starts about then).
    opened: Option<(Instant, u64)>,
    warned: bool,
}

impl OpenTransaction {
    /// Opens transaction `n` of `subtask`: a producer for its id, `init_transactions` (which
    /// fences older producers of the id and aborts what they left open) and
    /// `begin_transaction`.
    fn open(
        config: &KafkaSinkConfig,
        prefix: &str,
        client_id: &str,
        subtask: u32,
        n: u64,
    ) -> TaskResult<Self> {
        let started = Instant::now();
        let id = transactional_id(prefix, subtask, n);
        let timeout_ms = config.transaction_timeout_ms();
        // Records must not outlive their transaction in librdkafka's queue.
        let message_timeout_ms = timeout_ms.min(300_000);
        let producer: Producer0 = client_config(&config.brokers, client_id)
            .set("transactional.id", &id)
            .set("transaction.timeout.ms", timeout_ms.to_string())
            .set("message.timeout.ms", message_timeout_ms.to_string())
            .create_with_context(Deliveries::default())
            .map_err(|e| TaskError::msg(format!("Kafka sink: cannot create producer {id}: {e}")))?;
        producer
            .init_transactions(config.request_timeout)
            .map_err(|e| producer_err(&id, "init_transactions", &e))?;
        producer
            .begin_transaction()
            .map_err(|e| producer_err(&id, "begin_transaction", &e))?;
        debug!(
            "Kafka sink: opened transaction {id} in {} ms",
            started.elapsed().as_millis()
        );
        Ok(OpenTransaction {
            producer,
            id,
            n,
            records: 0,
            opened: None,
            warned: false,
        })
    }
}

/// A pre-committed transaction. Its producer is gone: the commit is an `EndTxn` with the
/// stored producer id and epoch (see [`commit_prepared`]).
struct Prepared {
    state: PreparedTransaction,
    opened: Instant,
    warned: bool,
}

/// The next transaction, being opened on a thread of its own while the current one takes
/// records: opening one waits for the broker (librdkafka finds the transaction coordinator on
/// a 500 ms timer when its first connection is not up yet), which would stall the subtask
/// after every checkpoint.
struct Spare {
    n: u64,
    opening: std::thread::JoinHandle<TaskResult<OpenTransaction>>,
}

/// The writer of the exactly-once guarantee.
struct TransactionalWriter<T> {
    shared: Shared<T>,
    wire: WireClient,
    prefix: String,
    client_id: String,
    subtask: u32,
    /// The number of the next transaction to open.
    next: u64,
    /// The last checkpoint this writer pre-committed (or the restored one): the records it
    /// writes now belong to the next.
    last_barrier: u64,
    /// The transaction that takes records.
    current: Option<OpenTransaction>,
    /// The transaction that takes over from `current` after its pre-commit.
    spare: Option<Spare>,
    pending: Vec<Prepared>,
    checkpointing: bool,
    key: Vec<u8>,
    value: Vec<u8>,
}

impl<T> TransactionalWriter<T> {
    /// Opens the first transaction (on this thread) and starts opening the next.
    fn start(&mut self) -> TaskResult {
        let config = &self.shared.config;
        let first = OpenTransaction::open(
            config,
            &self.prefix,
            &self.client_id,
            self.subtask,
            self.next,
        )?;
        self.next += 1;
        self.current = Some(first);
        self.open_spare()
    }

    /// Starts opening transaction `next` on a thread of its own.
    fn open_spare(&mut self) -> TaskResult {
        let (config, prefix, client_id) = (
            self.shared.config.clone(),
            self.prefix.clone(),
            self.client_id.clone(),
        );
        let (subtask, n) = (self.subtask, self.next);
        let opening = std::thread::Builder::new()
            .name(format!("kafka-txn-{subtask}"))
            .spawn(move || OpenTransaction::open(&config, &prefix, &client_id, subtask, n))
            .map_err(|e| TaskError::msg(format!("Kafka sink: cannot start a thread: {e}")))?;
        self.spare = Some(Spare { n, opening });
        self.next += 1;
        Ok(())
    }

    /// The transaction that takes records: the current one, or the spare (waiting for it to
    /// be open) while the next spare starts opening.
    fn current(&mut self) -> TaskResult<&mut OpenTransaction> {
        if self.current.is_none() {
            let spare = self
                .spare
                .take()
                .ok_or_else(|| TaskError::msg("Kafka sink: no transaction to write into"))?;
            let opened = spare.opening.join().map_err(|_| {
                TaskError::msg("Kafka sink: the thread opening a transaction panicked")
            })??;
            self.current = Some(opened);
            self.open_spare()?;
        }
        self.current
            .as_mut()
            .ok_or_else(|| TaskError::msg("Kafka sink: no open transaction"))
    }

    /// Flushes the current transaction, if it holds records, and keeps it with its producer
    /// id and epoch for the commit (an empty one stays current for the next records).
    fn prepare(&mut self, checkpoint_id: u64) -> TaskResult {
        if self.current.as_ref().is_none_or(|c| c.records == 0) {
            return Ok(());
        }
        let Some(txn) = self.current.take() else {
            return Ok(());
        };
        let config = &self.shared.config;
        flush(&txn.producer, &txn.id, config.request_timeout)?;
        let Some(&(partition, first_offset)) = txn.producer.context().first.get() else {
            return Err(TaskError::msg(format!(
                "Kafka sink: transaction {} flushed {} record(s) without a delivery report",
                txn.id, txn.records
            )));
        };
        let producer = self
            .wire
            .producer_of_record(&config.topic, partition, first_offset)
            .map_err(wire_err)?;
        let (opened, opened_at_ms) = txn.opened.unwrap_or((Instant::now(), now_ms()));
        debug!(
            "Kafka sink: pre-committed transaction {} (producer id {}, epoch {}) at checkpoint {checkpoint_id}",
            txn.id, producer.id, producer.epoch
        );
        self.pending.push(Prepared {
            state: PreparedTransaction {
                checkpoint_id,
                transactional_id: txn.id,
                producer_id: producer.id,
                producer_epoch: producer.epoch,
                partition,
                first_offset,
                records: txn.records,
                opened_at_ms,
            },
            opened,
            warned: txn.warned,
        });
        Ok(())
    }

    /// The number of the first transaction not covered by a checkpoint taken now: the current
    /// one, else the spare. Every later number was, or will be, opened after it.
    fn cursor(&self) -> u64 {
        match (&self.current, &self.spare) {
            (Some(c), _) => c.n,
            (None, Some(s)) => s.n,
            (None, None) => self.next,
        }
    }

    fn warn_pending(&mut self) {
        let config = &self.shared.config;
        for p in self.pending.iter_mut().filter(|p| !p.warned) {
            p.warned = warn_if_near_timeout(
                config,
                &p.state.transactional_id,
                p.opened.elapsed(),
                &format!("pre-committed at checkpoint {}", p.state.checkpoint_id),
            );
        }
    }

    /// Commits the transactions pre-committed up to `checkpoint_id`, in order.
    fn commit_up_to(&mut self, checkpoint_id: u64) -> TaskResult {
        while let Some(p) = self.pending.first() {
            if p.state.checkpoint_id > checkpoint_id {
                break;
            }
            commit_prepared(&mut self.wire, &self.shared.config, &p.state, false)?;
            debug!(
                "Kafka sink: committed transaction {} of checkpoint {}",
                p.state.transactional_id, p.state.checkpoint_id
            );
            self.pending.remove(0);
        }
        Ok(())
    }
}

impl<T: Send> SinkWriter<T> for TransactionalWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        if batch.is_empty() {
            return Ok(());
        }
        self.current()?;
        let TransactionalWriter {
            current,
            shared,
            key,
            value,
            last_barrier,
            ..
        } = self;
        let Some(txn) = current.as_mut() else {
            return Err(TaskError::msg("Kafka sink: no open transaction"));
        };
        if txn.opened.is_none() {
            txn.opened = Some((Instant::now(), now_ms()));
        }
        txn.records += send_batch(&txn.producer, &txn.id, shared, batch, key, value)?;
        failpoint::hit("sink-writing", *last_barrier + 1);
        if !txn.warned {
            if let Some((opened, _)) = txn.opened {
                txn.warned = warn_if_near_timeout(
                    &shared.config,
                    &txn.id,
                    opened.elapsed(),
                    "open, not pre-committed yet",
                );
            }
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        self.prepare(checkpoint_id)?;
        self.last_barrier = checkpoint_id;
        self.warn_pending();
        let cursor = PendingEntry::Cursor {
            subtask: self.subtask,
            checkpoint_id,
            next: self.cursor(),
        };
        std::iter::once(cursor)
            .chain(
                self.pending
                    .iter()
                    .map(|p| PendingEntry::Transaction(p.state.clone())),
            )
            .map(|e| postcard::to_stdvec(&e).map_err(TaskError::msg))
            .collect()
    }

    fn commit(&mut self, checkpoint_id: u64) -> TaskResult {
        self.warn_pending();
        self.commit_up_to(checkpoint_id)
    }

    fn finish(&mut self) -> TaskResult {
        if self.checkpointing {
            // The final checkpoint pre-committed and committed everything before the end.
            if let Some(txn) = &self.current {
                if txn.records > 0 {
                    return Err(TaskError::msg(format!(
                        "Kafka sink: {} record(s) were written into {} after the final checkpoint",
                        txn.records, txn.id
                    )));
                }
            }
            return Ok(());
        }
        // Without checkpoints there is no commit point but the end of input.
        self.prepare(0)?;
        self.commit_up_to(0)
    }
}

#[cfg(test)]
mod tests {
    //! Against a real broker with transactions: Tansu from `scripts/service-kafka` on
    //! 127.0.0.1:59092 (`CAIRN_TEST_KAFKA_BROKERS` overrides). A missing broker fails the
    //! tests that need one, naming the script that starts it.

    use std::collections::HashSet;
    use std::io::Write;
    use std::sync::Mutex;

    use super::*;
    use crate::connectors::kafka::wire::TopicLog;

    fn brokers() -> String {
        std::env::var("CAIRN_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:59092".into())
    }

    fn broker() -> WireClient {
        let mut w = WireClient::new(&brokers(), Duration::from_secs(20));
        if let Err(e) = w.topic_metadata("cairn-probe", false) {
            panic!(
                "no Kafka broker answers at {} ({e}): start it with scripts/service-kafka (or point CAIRN_TEST_KAFKA_BROKERS at one)",
                brokers()
            );
        }
        w
    }

    /// A sink into a new topic under a transactional id prefix of its own. One partition, so
    /// that each transaction is one run of records in the log.
    fn sink(w: &mut WireClient, what: &str, guarantee: KafkaGuarantee) -> KafkaSink<u64> {
        let unique = format!("{what}-{}-{}", std::process::id(), fastrand::u64(..));
        w.create_topic(&unique, 1).unwrap();
        let mut config = KafkaSinkConfig::new(brokers(), unique.clone());
        config.guarantee = guarantee;
        config.transactional_id_prefix = Some(format!("test-{unique}"));
        KafkaSink::new(
            config,
            Arc::new(|r: &u64, key: &mut Vec<u8>, value: &mut Vec<u8>| {
                key.extend_from_slice(&r.to_be_bytes());
                value.extend_from_slice(r.to_string().as_bytes());
            }),
        )
        .unwrap()
    }

    /// A new sink object over the same topic and prefix: another process after a crash.
    fn again(s: &KafkaSink<u64>) -> KafkaSink<u64> {
        KafkaSink::new((*s.config).clone(), s.encoder.clone()).unwrap()
    }

    fn owner() -> SinkOwner {
        SinkOwner {
            job_id: "job".into(),
            uid: "sink".into(),
        }
    }

    /// The writer of subtask 0 of 1 on a fresh start.
    fn writer(s: &KafkaSink<u64>) -> Box<dyn SinkWriter<u64>> {
        writer_after(s, None)
    }

    /// The writer of subtask 0 of 1 after a restore of `restored` (None: a fresh start).
    fn writer_after(s: &KafkaSink<u64>, restored: Option<&[Vec<u8>]>) -> Box<dyn SinkWriter<u64>> {
        s.create_writer(SinkContext {
            owner: owner(),
            subtask: 0,
            parallelism: 1,
            checkpointing: true,
            restored: restored.map(<[Vec<u8>]>::to_vec),
        })
        .unwrap()
    }

    fn write(w: &mut dyn SinkWriter<u64>, records: std::ops::Range<u64>) {
        w.write(&mut records.collect()).unwrap();
    }

    fn log(w: &mut WireClient, s: &KafkaSink<u64>) -> TopicLog {
        w.read_topic(&s.config.topic).unwrap()
    }

    /// The committed records, sorted.
    fn committed(log: &TopicLog) -> Vec<u64> {
        let mut v: Vec<u64> = log
            .committed_records()
            .unwrap()
            .into_iter()
            .map(|r| {
                let value = r.value.unwrap();
                std::str::from_utf8(&value).unwrap().parse().unwrap()
            })
            .collect();
        v.sort_unstable();
        v
    }

    fn transactions(state: &[Vec<u8>]) -> Vec<PreparedTransaction> {
        state
            .iter()
            .filter_map(|b| match postcard::from_bytes(b).unwrap() {
                PendingEntry::Transaction(t) => Some(t),
                PendingEntry::Cursor { .. } => None,
            })
            .collect()
    }

    /// Runs `f` with this thread's log lines captured; returns them.
    fn captured(f: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let subscriber = tracing_subscriber::fmt()
            .with_writer({
                let buf = buf.clone();
                move || buf.clone()
            })
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(subscriber, f);
        let text = buf.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn guarantees_parse_and_print() {
        for g in ["none", "at-least-once", "exactly-once"] {
            assert_eq!(g.parse::<KafkaGuarantee>().unwrap().to_string(), g);
        }
        let e = "exactly_once".parse::<KafkaGuarantee>().unwrap_err();
        assert!(e.contains("unknown Kafka guarantee 'exactly_once'"), "{e}");
    }

    #[test]
    fn bad_configurations_are_refused() {
        let encoder: KafkaEncoder<u64> = Arc::new(|_: &u64, _: &mut Vec<u8>, _: &mut Vec<u8>| {});
        let mut c = KafkaSinkConfig::new("localhost", "t");
        let e = KafkaSink::new(c.clone(), encoder.clone()).err().unwrap();
        assert!(e.contains("'localhost' is not HOST:PORT"), "{e}");
        c.brokers = "localhost:9092".into();
        c.transaction_timeout = Duration::ZERO;
        let e = KafkaSink::new(c.clone(), encoder.clone()).err().unwrap();
        assert!(e.contains("transaction timeout"), "{e}");
        c.transaction_timeout = Duration::from_secs(60);
        c.topic = String::new();
        assert!(KafkaSink::new(c, encoder).is_err());
    }

    #[test]
    fn a_restore_continues_each_subtasks_numbering() {
        let plan = RestorePlan {
            restored_checkpoint: 7,
            next: BTreeMap::from([(0, 3), (1, 5)]),
        };
        assert_eq!((plan.first(0), plan.first(1)), (3, 5));
        // A subtask the checkpoint did not have starts above every number used before it.
        assert_eq!(plan.first(2), 8);
        assert_eq!(RestorePlan::default().first(0), 1);
    }

    #[test]
    fn a_transaction_is_named_in_a_warning_near_its_timeout() {
        let mut config = KafkaSinkConfig::new("localhost:9092", "t");
        config.transaction_timeout = Duration::from_secs(100);
        config.timeout_warning_ratio = 0.8;
        let quiet = captured(|| {
            assert!(!warn_if_near_timeout(
                &config,
                "p-0-1",
                Duration::from_secs(79),
                "open"
            ));
        });
        assert!(quiet.is_empty(), "{quiet}");
        let text = captured(|| {
            assert!(warn_if_near_timeout(
                &config,
                "p-0-1",
                Duration::from_secs(85),
                "open"
            ));
        });
        assert!(
            text.contains("WARN") && text.contains("transaction p-0-1 (open) has been open for 85.0 s, 85% of transaction.timeout.ms (100000 ms)"),
            "{text}"
        );
    }

    /// A pre-committed transaction outlives its writer (the process died between pre-commit
    /// and commit): the next attempt's restore commits it through `EndTxn` with the stored
    /// producer id and epoch; a second restore from the same checkpoint commits it again
    /// without harm; the writers continue with the next transactional id.
    #[test]
    fn a_restore_commits_the_pre_committed_transaction_idempotently() {
        let mut w = broker();
        let s = sink(&mut w, "commit", KafkaGuarantee::ExactlyOnce);
        s.initialize(&owner(), None).unwrap();
        let mut wr = writer(&s);
        write(wr.as_mut(), 0..100);
        let state = wr.pre_commit(1).unwrap();
        drop(wr);
        let before = log(&mut w, &s);
        assert!(committed(&before).is_empty());
        let txns = transactions(&state);
        assert_eq!(txns.len(), 1);
        assert!(txns[0].transactional_id.ends_with("-0-1"), "{txns:?}");
        assert_eq!(
            before
                .transactions()
                .iter()
                .filter(|t| t.outcome.is_none())
                .map(|t| (t.producer_id, t.producer_epoch))
                .collect::<HashSet<_>>(),
            HashSet::from([(txns[0].producer_id, txns[0].producer_epoch)]),
            "the stored producer id and epoch are those of the open transaction's records"
        );

        let s2 = again(&s);
        let text = captured(|| s2.initialize(&owner(), Some(state.clone())).unwrap());
        assert!(
            text.contains(&format!(
                "committed transaction {} (producer id {}, epoch {}) of checkpoint 1",
                txns[0].transactional_id, txns[0].producer_id, txns[0].producer_epoch
            )),
            "{text}"
        );
        let after = log(&mut w, &s);
        assert_eq!(committed(&after), (0..100).collect::<Vec<_>>());
        // Again, as a restart that restores the same checkpoint does.
        let s3 = again(&s);
        s3.initialize(&owner(), Some(state.clone())).unwrap();
        let markers = |l: &TopicLog| {
            l.partitions
                .iter()
                .flatten()
                .filter(|b| b.marker.is_some())
                .count()
        };
        let again_log = log(&mut w, &s);
        assert_eq!(markers(&again_log), markers(&after));
        assert_eq!(committed(&again_log), (0..100).collect::<Vec<_>>());

        // A writer restored from the same checkpoint in another process (no initialize of its
        // own) continues with the same next id.
        let mut wr = writer_after(&again(&s), Some(&state));
        write(wr.as_mut(), 100..150);
        let next = transactions(&wr.pre_commit(2).unwrap());
        assert!(next[0].transactional_id.ends_with("-0-2"), "{next:?}");
        wr.commit(2).unwrap();
        assert_eq!(committed(&log(&mut w, &s)), (0..150).collect::<Vec<_>>());
    }

    /// Transactions of checkpoints that never completed, and the one open when the process
    /// died, are aborted by the restore (abort markers); so are those of an attempt that died
    /// before completing anything after the restore; the output ends exactly once.
    #[test]
    fn a_restore_aborts_the_transactions_after_the_restored_checkpoint() {
        let mut w = broker();
        let s = sink(&mut w, "abort", KafkaGuarantee::ExactlyOnce);
        s.initialize(&owner(), None).unwrap();
        let mut wr = writer(&s);
        write(wr.as_mut(), 0..10);
        let restored = wr.pre_commit(1).unwrap();
        wr.commit(1).unwrap();
        write(wr.as_mut(), 10..20);
        wr.pre_commit(2).unwrap();
        write(wr.as_mut(), 20..30);
        let open = |l: &TopicLog| {
            l.transactions()
                .into_iter()
                .filter(|t| t.outcome.is_none())
                .count()
        };
        // The process dies mid-transaction, once librdkafka sent those records on its own.
        let deadline = Instant::now() + Duration::from_secs(20);
        while open(&log(&mut w, &s)) < 2 {
            assert!(
                Instant::now() < deadline,
                "the open transaction's records never arrived"
            );
            std::thread::park_timeout(Duration::from_millis(10));
        }
        drop(wr);
        assert_eq!(open(&log(&mut w, &s)), 2);

        // Attempt 2 restores checkpoint 1 and dies before completing another.
        let s2 = again(&s);
        let text = captured(|| s2.initialize(&owner(), Some(restored.clone())).unwrap());
        // Transactions 2 and 3, and the next one, opened ahead.
        assert!(
            text.matches("fenced transactional id").count() >= 2,
            "{text}"
        );
        let l = log(&mut w, &s);
        assert_eq!(open(&l), 0);
        assert_eq!(
            l.transactions()
                .iter()
                .filter(|t| t.outcome == Some(Marker::Abort))
                .count(),
            2
        );
        assert_eq!(committed(&l), (0..10).collect::<Vec<_>>());
        let mut wr = writer_after(&s2, Some(&restored));
        write(wr.as_mut(), 10..15);
        // Flushed at a barrier whose checkpoint never completes.
        wr.pre_commit(2).unwrap();
        drop(wr);
        assert_eq!(open(&log(&mut w, &s)), 1);

        // Attempt 3 restores checkpoint 1 again and runs to the end.
        let s3 = again(&s);
        s3.initialize(&owner(), Some(restored.clone())).unwrap();
        assert_eq!(open(&log(&mut w, &s)), 0);
        let mut wr = writer_after(&s3, Some(&restored));
        write(wr.as_mut(), 10..30);
        wr.pre_commit(3).unwrap();
        wr.commit(3).unwrap();
        wr.finish().unwrap();
        assert_eq!(committed(&log(&mut w, &s)), (0..30).collect::<Vec<_>>());
    }

    /// A restore after long downtime names the pre-committed transactions that come close to
    /// the transaction timeout.
    #[test]
    fn a_restore_warns_about_transactions_near_their_timeout() {
        let mut w = broker();
        let s = sink(&mut w, "old", KafkaGuarantee::ExactlyOnce);
        s.initialize(&owner(), None).unwrap();
        let mut wr = writer(&s);
        write(wr.as_mut(), 0..5);
        let state = wr.pre_commit(1).unwrap();
        drop(wr);
        // As if the job had been down for 13 of the transaction timeout's 15 minutes.
        let aged: Vec<Vec<u8>> = state
            .iter()
            .map(|b| match postcard::from_bytes(b).unwrap() {
                PendingEntry::Transaction(mut t) => {
                    t.opened_at_ms -= 13 * 60 * 1000;
                    postcard::to_stdvec(&PendingEntry::Transaction(t)).unwrap()
                }
                cursor => postcard::to_stdvec(&cursor).unwrap(),
            })
            .collect();
        let id = &transactions(&state)[0].transactional_id;
        let text = captured(|| again(&s).initialize(&owner(), Some(aged)).unwrap());
        assert!(
            text.contains(&format!(
                "transaction {id} (pre-committed before the restore) has been open for 780."
            )),
            "{text}"
        );
        assert_eq!(committed(&log(&mut w, &s)), (0..5).collect::<Vec<_>>());
    }

    /// Another producer takes over the writer's transactional id: the writer fails with an
    /// error naming the id as fenced instead of writing on.
    #[test]
    fn a_fenced_writer_fails_naming_its_transactional_id() {
        let mut w = broker();
        let s = sink(&mut w, "fenced", KafkaGuarantee::ExactlyOnce);
        s.initialize(&owner(), None).unwrap();
        let mut wr = writer(&s);
        write(wr.as_mut(), 0..10);
        let id = format!(
            "{}-0-1",
            s.config.transactional_id_prefix.as_deref().unwrap()
        );
        let zombie_killer: Producer0 = client_config(&brokers(), "test")
            .set("transactional.id", &id)
            .create_with_context(Deliveries::default())
            .unwrap();
        zombie_killer
            .init_transactions(Duration::from_secs(30))
            .unwrap();
        let result = wr
            .write(&mut (10..20).collect())
            .and_then(|()| wr.pre_commit(1).map(|_| ()));
        let e = result.unwrap_err().to_string();
        assert!(
            e.contains(&format!("the producer of transactional id {id} was fenced")),
            "{e}"
        );
        assert!(committed(&log(&mut w, &s)).is_empty());
    }

    /// Without checkpoints the exactly-once sink commits its transaction at the end of input.
    #[test]
    fn without_checkpoints_the_end_of_input_commits() {
        let mut w = broker();
        let s = sink(&mut w, "nock", KafkaGuarantee::ExactlyOnce);
        s.initialize(&owner(), None).unwrap();
        let mut wr = s
            .create_writer(SinkContext {
                owner: owner(),
                subtask: 0,
                parallelism: 1,
                checkpointing: false,
                restored: None,
            })
            .unwrap();
        write(wr.as_mut(), 0..100);
        assert!(committed(&log(&mut w, &s)).is_empty());
        wr.finish().unwrap();
        assert_eq!(committed(&log(&mut w, &s)), (0..100).collect::<Vec<_>>());
    }

    /// At-least-once flushes at the barrier: every record before it is in the log when the
    /// pre-commit returns.
    #[test]
    fn at_least_once_flushes_at_the_barrier() {
        let mut w = broker();
        let s = sink(&mut w, "alo", KafkaGuarantee::AtLeastOnce);
        s.initialize(&owner(), None).unwrap();
        let mut wr = writer(&s);
        write(wr.as_mut(), 0..1000);
        assert!(wr.pre_commit(1).unwrap().is_empty());
        assert_eq!(committed(&log(&mut w, &s)), (0..1000).collect::<Vec<_>>());
        wr.finish().unwrap();
    }

    #[test]
    fn an_unreachable_broker_is_named() {
        let mut config = KafkaSinkConfig::new("127.0.0.1:1", "t");
        config.request_timeout = Duration::from_secs(5);
        let s: KafkaSink<u64> = KafkaSink::new(
            config,
            Arc::new(|_: &u64, _: &mut Vec<u8>, _: &mut Vec<u8>| {}),
        )
        .unwrap();
        let e = s.initialize(&owner(), None).unwrap_err().to_string();
        assert!(e.contains("cannot reach Kafka broker 127.0.0.1:1"), "{e}");
    }
}
