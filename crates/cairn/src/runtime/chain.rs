//! Operator chains: the operators of one task, called one after the other on whole batches in
//! one thread, with no channel and no copy between them; and the record writer at the end of a
//! chain that partitions batches onto the outgoing channels.

use std::any::Any;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

use super::channel::{Barrier, ChannelSender, Element, BATCH_RECORDS_MAX};
use super::gate::{FlushCredit, ForwardStep, Forwarding};
use super::watermark::{
    SourceWatermarks, TimestampFn, WatermarkOutput, WATERMARK_MAX, WATERMARK_MIN,
};
use crate::error::{TaskError, TaskResult};
use crate::state::keygroup::{key_group_of_hash, subtask_for_key_group};
use crate::state::{OperatorListData, OperatorSnapshot};

/// An event every output channel receives, in order with the records.
#[derive(Debug, Clone, Copy)]
pub enum Event {
    /// Checkpoint barrier, in band.
    Barrier(Barrier),
    /// Unaligned checkpoint barrier: overtakes the data queued at the receiver.
    UnalignedBarrier(Barrier),
    /// Event time advanced (sent after the operators of the chain saw it).
    Watermark(i64),
    /// The task is idle: it does not hold back its receivers' watermarks.
    Idle,
    /// No more records.
    EndOfStream,
}

/// A one-input operator, called on whole batches.
pub trait Operator<I, O>: Send + 'static {
    /// Processes (drains) `input`, appending results to `out`.
    fn process(&mut self, input: &mut Vec<I>, out: &mut Vec<O>) -> TaskResult;
    /// The input ended; may emit final records.
    fn end_input(&mut self, _out: &mut Vec<O>) -> TaskResult {
        Ok(())
    }
    /// Event time advanced to `watermark`: fire event-time timers up to it (at the maximum,
    /// the end of a bounded input, a keyed operator fires its processing-time timers too).
    /// Returns the watermark that goes on to the next operator (by default this one; an
    /// operator that makes its own watermarks swallows it).
    fn on_watermark(&mut self, watermark: i64, _out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        Ok(Some(watermark))
    }
    /// When (ms since the epoch) the operator's next processing-time timer is due, if it has
    /// one: the task calls `on_processing_time` once the wall clock reaches it.
    fn next_processing_timer(&self) -> Option<i64> {
        None
    }
    /// Processing time reached `now_ms`: fire the processing-time timers due. Returns a
    /// watermark to send on, if the operator makes its own.
    fn on_processing_time(&mut self, _now_ms: i64, _out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        Ok(None)
    }
    /// Synchronous part of a snapshot (None: stateless).
    fn snapshot(&mut self, _checkpoint_id: Barrier) -> TaskResult<Option<OperatorSnapshot>> {
        Ok(None)
    }
    /// Checkpoint `id` completed.
    fn notify_complete(&mut self, _checkpoint_id: u64) -> TaskResult {
        Ok(())
    }
    /// Checkpoint `id` was aborted.
    fn notify_aborted(&mut self, _checkpoint_id: u64) -> TaskResult {
        Ok(())
    }
}

/// A two-input operator.
pub trait TwoInputOperator<I1, I2, O>: Send + 'static {
    /// Processes a batch of the first input.
    fn process1(&mut self, input: &mut Vec<I1>, out: &mut Vec<O>) -> TaskResult;
    /// Processes a batch of the second input.
    fn process2(&mut self, input: &mut Vec<I2>, out: &mut Vec<O>) -> TaskResult;
    /// Both inputs ended.
    fn end_input(&mut self, _out: &mut Vec<O>) -> TaskResult {
        Ok(())
    }
    /// Event time (the minimum over both inputs) advanced to `watermark`; returns the
    /// watermark to send on.
    fn on_watermark(&mut self, watermark: i64, _out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        Ok(Some(watermark))
    }
    /// The earliest processing-time timer, if any.
    fn next_processing_timer(&self) -> Option<i64> {
        None
    }
    /// Processing time reached `now_ms`.
    fn on_processing_time(&mut self, _now_ms: i64, _out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        Ok(None)
    }
    /// Synchronous part of a snapshot.
    fn snapshot(&mut self, _checkpoint_id: Barrier) -> TaskResult<Option<OperatorSnapshot>> {
        Ok(None)
    }
    /// Checkpoint `id` completed.
    fn notify_complete(&mut self, _checkpoint_id: u64) -> TaskResult {
        Ok(())
    }
    /// Checkpoint `id` was aborted.
    fn notify_aborted(&mut self, _checkpoint_id: u64) -> TaskResult {
        Ok(())
    }
}

/// The rest of a chain, seen from the operator before it.
pub trait Chain<I>: Send {
    /// Pushes (drains) a batch.
    fn push(&mut self, batch: &mut Vec<I>) -> TaskResult;
    /// The input of the chain ended.
    fn end_input(&mut self) -> TaskResult;
    /// Event time advanced: every operator fires its timers, then the watermark goes out.
    fn watermark(&mut self, watermark: i64) -> TaskResult;
    /// The earliest processing-time timer of the chain's operators.
    fn next_processing_timer(&self) -> Option<i64>;
    /// Processing time reached `now_ms`: every operator fires its due timers.
    fn processing_time(&mut self, now_ms: i64) -> TaskResult;
    /// Collects the synchronous snapshots of every operator.
    fn snapshot(&mut self, checkpoint_id: Barrier, out: &mut Vec<OperatorSnapshot>) -> TaskResult;
    /// Notifies every operator that a checkpoint completed.
    fn notify_complete(&mut self, checkpoint_id: u64) -> TaskResult;
    /// Notifies every operator that a checkpoint was aborted.
    fn notify_aborted(&mut self, checkpoint_id: u64) -> TaskResult;
    /// Flushes partial batches, then sends `event` on every output channel.
    fn emit(&mut self, event: Event) -> TaskResult;
    /// Sends partial batches.
    fn flush(&mut self) -> TaskResult;
}

/// An operator followed by the rest of its chain.
pub struct Link<I, O, Op> {
    op: Op,
    out: Vec<O>,
    next: Box<dyn Chain<O>>,
    _i: std::marker::PhantomData<fn(I)>,
}

impl<I, O, Op> Link<I, O, Op> {
    /// Puts `op` in front of `next`.
    pub fn new(op: Op, next: Box<dyn Chain<O>>) -> Self {
        Link {
            op,
            out: Vec::with_capacity(BATCH_RECORDS_MAX),
            next,
            _i: std::marker::PhantomData,
        }
    }
}

impl<I: 'static, O: Send + 'static, Op: Operator<I, O>> Chain<I> for Link<I, O, Op> {
    fn push(&mut self, batch: &mut Vec<I>) -> TaskResult {
        self.op.process(batch, &mut self.out)?;
        if !self.out.is_empty() {
            self.next.push(&mut self.out)?;
        }
        Ok(())
    }
    fn end_input(&mut self) -> TaskResult {
        self.op.end_input(&mut self.out)?;
        if !self.out.is_empty() {
            self.next.push(&mut self.out)?;
        }
        self.next.end_input()
    }
    fn watermark(&mut self, watermark: i64) -> TaskResult {
        let forward = self.op.on_watermark(watermark, &mut self.out)?;
        if !self.out.is_empty() {
            self.next.push(&mut self.out)?;
        }
        match forward {
            Some(w) => self.next.watermark(w),
            None => Ok(()),
        }
    }
    fn next_processing_timer(&self) -> Option<i64> {
        earliest(
            self.op.next_processing_timer(),
            self.next.next_processing_timer(),
        )
    }
    fn processing_time(&mut self, now_ms: i64) -> TaskResult {
        if self.op.next_processing_timer().is_some_and(|t| t <= now_ms) {
            let made = self.op.on_processing_time(now_ms, &mut self.out)?;
            if !self.out.is_empty() {
                self.next.push(&mut self.out)?;
            }
            if let Some(w) = made {
                self.next.watermark(w)?;
            }
        }
        self.next.processing_time(now_ms)
    }
    fn snapshot(&mut self, id: Barrier, out: &mut Vec<OperatorSnapshot>) -> TaskResult {
        if let Some(s) = self.op.snapshot(id)? {
            out.push(s);
        }
        self.next.snapshot(id, out)
    }
    fn notify_complete(&mut self, id: u64) -> TaskResult {
        self.op.notify_complete(id)?;
        self.next.notify_complete(id)
    }
    fn notify_aborted(&mut self, id: u64) -> TaskResult {
        self.op.notify_aborted(id)?;
        self.next.notify_aborted(id)
    }
    fn emit(&mut self, event: Event) -> TaskResult {
        self.next.emit(event)
    }
    fn flush(&mut self) -> TaskResult {
        self.next.flush()
    }
}

/// The earlier of two optional times.
pub fn earliest(a: Option<i64>, b: Option<i64>) -> Option<i64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The end of a chain with no outgoing channel (after a sink).
pub struct NullChain;

impl<T: Send> Chain<T> for NullChain {
    fn push(&mut self, batch: &mut Vec<T>) -> TaskResult {
        batch.clear();
        Ok(())
    }
    fn end_input(&mut self) -> TaskResult {
        Ok(())
    }
    fn watermark(&mut self, _: i64) -> TaskResult {
        Ok(())
    }
    fn next_processing_timer(&self) -> Option<i64> {
        None
    }
    fn processing_time(&mut self, _: i64) -> TaskResult {
        Ok(())
    }
    fn snapshot(&mut self, _: Barrier, _: &mut Vec<OperatorSnapshot>) -> TaskResult {
        Ok(())
    }
    fn notify_complete(&mut self, _: u64) -> TaskResult {
        Ok(())
    }
    fn notify_aborted(&mut self, _: u64) -> TaskResult {
        Ok(())
    }
    fn emit(&mut self, _: Event) -> TaskResult {
        Ok(())
    }
    fn flush(&mut self) -> TaskResult {
        Ok(())
    }
}

/// How records of one edge are spread over the downstream subtasks.
pub enum Partitioner<T> {
    /// Subtask i sends to subtask i (a single channel).
    Forward,
    /// Round robin, record by record.
    Rebalance,
    /// By key group of the key hash.
    Hash {
        key_hash: Arc<dyn Fn(&T) -> u64 + Send + Sync>,
        max_parallelism: u32,
    },
    /// Every record to every subtask.
    Broadcast,
}

/// The output of one edge for one subtask: its channels and a partial batch per channel.
pub struct EdgeWriter<T> {
    partitioner: Partitioner<T>,
    senders: Vec<ChannelSender>,
    buffers: Vec<Vec<T>>,
    /// Batches sent per channel (an unaligned barrier tells the receiver how many preceded it).
    sent: Vec<u64>,
    next_channel: usize,
}

impl<T: Clone + Send + Serialize + 'static> EdgeWriter<T> {
    /// A writer onto `senders` (one per downstream subtask, or one for forward edges).
    pub fn new(partitioner: Partitioner<T>, senders: Vec<ChannelSender>) -> Self {
        let buffers = senders.iter().map(|_| Vec::new()).collect();
        let sent = vec![0; senders.len()];
        EdgeWriter {
            partitioner,
            senders,
            buffers,
            sent,
            next_channel: 0,
        }
    }

    /// Sends channel `ch`'s buffer, serialized once if the channel crosses the network.
    fn send_now(&mut self, ch: usize, overdraft: bool) -> TaskResult {
        let full = std::mem::replace(&mut self.buffers[ch], Vec::with_capacity(BATCH_RECORDS_MAX));
        self.sent[ch] += 1;
        let sender = &self.senders[ch];
        if sender.is_remote() {
            let bytes = postcard::to_stdvec(&full)
                .map_err(|e| TaskError::msg(format!("cannot serialize a batch: {e}")))?;
            crate::metrics::sent(full.len(), bytes.len());
            return sender.send_encoded(bytes, overdraft);
        }
        crate::metrics::sent(full.len(), 0);
        if overdraft {
            sender.send_batch_overdraft(Box::new(full))
        } else {
            sender.send_batch(Box::new(full))
        }
    }

    fn push_one(&mut self, ch: usize, rec: T) -> TaskResult {
        let buf = &mut self.buffers[ch];
        if buf.capacity() == 0 {
            buf.reserve(BATCH_RECORDS_MAX);
        }
        buf.push(rec);
        if buf.len() >= BATCH_RECORDS_MAX {
            self.send_now(ch, false)?;
        }
        Ok(())
    }

    fn push(&mut self, batch: &mut Vec<T>) -> TaskResult {
        let channels = self.senders.len();
        if channels == 1 && !matches!(self.partitioner, Partitioner::Broadcast) {
            // One channel: hand over the whole batch when nothing is buffered.
            if self.buffers[0].is_empty()
                && batch.len() >= BATCH_RECORDS_MAX / 2
                && !self.senders[0].is_remote()
            {
                let full = std::mem::replace(batch, Vec::with_capacity(BATCH_RECORDS_MAX));
                self.sent[0] += 1;
                crate::metrics::sent(full.len(), 0);
                return self.senders[0].send_batch(Box::new(full));
            }
            for rec in batch.drain(..) {
                self.push_one(0, rec)?;
            }
            return Ok(());
        }
        match &self.partitioner {
            Partitioner::Forward => {
                for rec in batch.drain(..) {
                    self.push_one(0, rec)?;
                }
            }
            Partitioner::Rebalance => {
                let mut ch = self.next_channel;
                for rec in batch.drain(..) {
                    self.push_one(ch, rec)?;
                    ch += 1;
                    if ch == channels {
                        ch = 0;
                    }
                }
                self.next_channel = ch;
            }
            Partitioner::Hash {
                key_hash,
                max_parallelism,
            } => {
                let key_hash = key_hash.clone();
                let maxp = *max_parallelism;
                for rec in batch.drain(..) {
                    let kg = key_group_of_hash(key_hash(&rec), maxp);
                    let ch = subtask_for_key_group(kg, maxp, channels as u32) as usize;
                    self.push_one(ch, rec)?;
                }
            }
            Partitioner::Broadcast => {
                for rec in batch.drain(..) {
                    for ch in 1..channels {
                        self.push_one(ch, rec.clone())?;
                    }
                    self.push_one(0, rec)?;
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self) -> TaskResult {
        for ch in 0..self.senders.len() {
            if !self.buffers[ch].is_empty() {
                self.send_now(ch, false)?;
            }
        }
        Ok(())
    }

    fn emit(&mut self, event: Event) -> TaskResult {
        if let Event::Watermark(t) = event {
            crate::metrics::watermark(t);
        }
        let unaligned = matches!(event, Event::UnalignedBarrier(_));
        for step in Forwarding::new().steps(unaligned) {
            match step {
                ForwardStep::FlushPartial(credit) => {
                    for ch in 0..self.senders.len() {
                        if !self.buffers[ch].is_empty() {
                            self.send_now(ch, credit == FlushCredit::Overdraw)?;
                        }
                    }
                }
                ForwardStep::Barrier => {
                    for (ch, s) in self.senders.iter().enumerate() {
                        match event {
                            Event::Barrier(b) => s.send_event(Element::Barrier(b))?,
                            Event::UnalignedBarrier(b) => {
                                s.send_priority_barrier(b, self.sent[ch])?
                            }
                            Event::EndOfStream => s.send_event(Element::EndOfStream)?,
                            Event::Watermark(t) => s.send_event(Element::Watermark(t))?,
                            Event::Idle => s.send_event(Element::Idle)?,
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// The end of a chain that has outgoing edges: writes every record to each edge.
pub struct RecordWriter<T> {
    edges: Vec<EdgeWriter<T>>,
    copy: Vec<T>,
}

impl<T: Clone + Send + Serialize + 'static> RecordWriter<T> {
    /// A writer onto the given edges.
    pub fn new(edges: Vec<EdgeWriter<T>>) -> Self {
        RecordWriter {
            edges,
            copy: Vec::new(),
        }
    }
}

impl<T: Clone + Send + Serialize + 'static> Chain<T> for RecordWriter<T> {
    fn push(&mut self, batch: &mut Vec<T>) -> TaskResult {
        let n = self.edges.len();
        for i in 0..n.saturating_sub(1) {
            self.copy.clear();
            self.copy.extend(batch.iter().cloned());
            self.edges[i].push(&mut self.copy)?;
        }
        match self.edges.last_mut() {
            Some(last) => last.push(batch),
            None => {
                batch.clear();
                Ok(())
            }
        }
    }
    fn end_input(&mut self) -> TaskResult {
        Ok(())
    }
    fn watermark(&mut self, watermark: i64) -> TaskResult {
        self.emit(Event::Watermark(watermark))
    }
    fn next_processing_timer(&self) -> Option<i64> {
        None
    }
    fn processing_time(&mut self, _: i64) -> TaskResult {
        Ok(())
    }
    fn snapshot(&mut self, _: Barrier, _: &mut Vec<OperatorSnapshot>) -> TaskResult {
        Ok(())
    }
    fn notify_complete(&mut self, _: u64) -> TaskResult {
        Ok(())
    }
    fn notify_aborted(&mut self, _: u64) -> TaskResult {
        Ok(())
    }
    fn emit(&mut self, event: Event) -> TaskResult {
        for e in &mut self.edges {
            e.emit(event)?;
        }
        Ok(())
    }
    fn flush(&mut self) -> TaskResult {
        for e in &mut self.edges {
            e.flush()?;
        }
        Ok(())
    }
}

/// What a source poll produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceStatus {
    /// More records may follow.
    More,
    /// Nothing to read before this instant (a throttled source): the task serves its mailbox
    /// meanwhile instead of polling again.
    IdleUntil(std::time::Instant),
    /// Every assigned split is read to its end.
    Exhausted,
}

/// A replayable source of records: its read positions are operator state.
pub trait Source<T>: Send + Sync + 'static {
    /// The splits of a fresh start, each serialized with its start position; split `j` goes to
    /// subtask `j mod parallelism`. Errors here (say, a missing input file) fail the job before
    /// it starts.
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>>;
    /// The reader of subtask `subtask` of `parallelism`, of the given splits (fresh or
    /// restored positions).
    fn create_reader(
        &self,
        subtask: u32,
        parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<T>>>;
}

/// Reads the splits of one source subtask.
pub trait SourceReader<T>: Send {
    /// Appends up to `max` records to `out`, all of one split.
    fn poll(&mut self, out: &mut Vec<T>, max: usize) -> TaskResult<SourceStatus>;
    /// The splits with their current positions (the source's state in a checkpoint).
    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>>;
    /// The split (an index into the splits the reader was given) the last poll read from; its
    /// records' timestamps make that split's watermark.
    fn last_split(&self) -> usize {
        0
    }
    /// How many splits the reader was given.
    fn split_count(&self) -> usize {
        1
    }
    /// Whether split `index` is read to its end (it no longer holds back the watermark).
    fn split_finished(&self, _index: usize) -> bool {
        false
    }
    /// The splits `snapshot()` just returned are checkpoint `checkpoint_id`'s (called right
    /// after it), so that `notify_complete` knows which positions became durable.
    fn snapshot_taken(&mut self, _checkpoint_id: u64) {}
    /// Checkpoint `checkpoint_id` completed: the positions snapshotted for it are durable (a
    /// Kafka source commits them back to its consumer group, for monitoring only).
    fn notify_complete(&mut self, _checkpoint_id: u64) -> TaskResult {
        Ok(())
    }
    /// For a reader whose returned records do not tell what it read (it drops some, as a SQL
    /// source running the filter over it does, or returns them reshaped): what the last poll
    /// read, taken (a second call returns None). The source then counts and times what it
    /// read, not what it returned: its watermark follows every record read.
    fn last_read(&mut self) -> Option<PollRead> {
        None
    }
}

/// What a source reader's poll read ([`SourceReader::last_read`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PollRead {
    /// How many records it read.
    pub records: usize,
    /// The largest event time among them (None: it read none, or the source has no event
    /// time).
    pub event_time: Option<i64>,
}

/// The [`SourceReader`] methods of a reader that wraps another (`self.$inner`) and reads the
/// same splits: its positions, splits and checkpoint notifications are the inner reader's.
/// Each wrapper still says what its polls read ([`SourceReader::last_read`]).
macro_rules! delegate_source_reader {
    ($inner:ident) => {
        fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
            self.$inner.snapshot()
        }
        fn last_split(&self) -> usize {
            self.$inner.last_split()
        }
        fn split_count(&self) -> usize {
            self.$inner.split_count()
        }
        fn split_finished(&self, index: usize) -> bool {
            self.$inner.split_finished(index)
        }
        fn snapshot_taken(&mut self, checkpoint_id: u64) {
            self.$inner.snapshot_taken(checkpoint_id)
        }
        fn notify_complete(&mut self, checkpoint_id: u64) -> TaskResult {
            self.$inner.notify_complete(checkpoint_id)
        }
    };
}
pub(crate) use delegate_source_reader;

/// The type-erased head of a task: a source reader or the first operator of the chain.
pub trait TaskBody: Send {
    /// Processes a batch (a `Vec<I>` of the head's input `port`); returns its record count.
    fn process(&mut self, port: usize, batch: Box<dyn Any + Send>) -> TaskResult<usize>;
    /// All channels of `port` ended.
    fn end_input(&mut self, port: usize) -> TaskResult;
    /// Sources: reads one batch and pushes it down the chain; returns (records, status).
    fn poll_source(&mut self) -> TaskResult<(usize, SourceStatus)>;
    /// Synchronous snapshot of every operator of the chain.
    fn snapshot(&mut self, checkpoint_id: Barrier, out: &mut Vec<OperatorSnapshot>) -> TaskResult;
    /// Checkpoint completed.
    fn notify_complete(&mut self, checkpoint_id: u64) -> TaskResult;
    /// Checkpoint aborted.
    fn notify_aborted(&mut self, checkpoint_id: u64) -> TaskResult;
    /// Flushes and sends an event downstream.
    fn emit(&mut self, event: Event) -> TaskResult;
    /// Sends partial batches downstream.
    fn flush(&mut self) -> TaskResult;
    /// The task's watermark advanced (operator tasks; sources make their own).
    fn watermark(&mut self, watermark: i64) -> TaskResult;
    /// Sources: event time ends now; sends the maximum watermark (a stop with drain).
    fn end_event_time(&mut self) -> TaskResult {
        Err(TaskError::msg("only a source task ends event time"))
    }
    /// The earliest processing-time timer of the task's operators.
    fn next_processing_timer(&self) -> Option<i64>;
    /// Processing time reached `now_ms`.
    fn processing_time(&mut self, now_ms: i64) -> TaskResult;
    /// Serializes a batch of input `port` (in-flight data of an unaligned checkpoint).
    fn encode_batch(&self, port: usize, batch: &(dyn Any + Send)) -> TaskResult<Vec<u8>>;
    /// Deserializes a batch of input `port` (replay of channel state).
    fn decode_batch(&self, port: usize, bytes: &[u8]) -> TaskResult<Box<dyn Any + Send>>;
}

fn encode_typed<T: Serialize + 'static>(batch: &(dyn Any + Send)) -> TaskResult<Vec<u8>> {
    let typed = batch
        .downcast_ref::<Vec<T>>()
        .ok_or_else(|| TaskError::msg("a batch of an unexpected record type reached a task"))?;
    postcard::to_stdvec(typed)
        .map_err(|e| TaskError::msg(format!("cannot serialize in-flight data: {e}")))
}

fn decode_typed<T: DeserializeOwned + Send + 'static>(
    bytes: &[u8],
) -> TaskResult<Box<dyn Any + Send>> {
    let v: Vec<T> = postcard::from_bytes(bytes).map_err(|e| {
        TaskError::msg(format!(
            "cannot restore in-flight data: {e}; was the record type changed?"
        ))
    })?;
    Ok(Box::new(v))
}

fn downcast<T: 'static>(batch: Box<dyn Any + Send>) -> TaskResult<Vec<T>> {
    batch
        .downcast::<Vec<T>>()
        .map(|b| *b)
        .map_err(|_| TaskError::msg("a batch of an unexpected record type reached a task"))
}

/// A chain whose head takes one input.
pub struct OneInputBody<I> {
    chain: Box<dyn Chain<I>>,
}

impl<I> OneInputBody<I> {
    /// Wraps a chain.
    pub fn new(chain: Box<dyn Chain<I>>) -> Self {
        OneInputBody { chain }
    }
}

macro_rules! delegate_chain {
    ($field:ident) => {
        fn snapshot(&mut self, id: Barrier, out: &mut Vec<OperatorSnapshot>) -> TaskResult {
            self.$field.snapshot(id, out)
        }
        fn notify_complete(&mut self, id: u64) -> TaskResult {
            self.$field.notify_complete(id)
        }
        fn notify_aborted(&mut self, id: u64) -> TaskResult {
            self.$field.notify_aborted(id)
        }
        fn emit(&mut self, event: Event) -> TaskResult {
            self.$field.emit(event)
        }
        fn flush(&mut self) -> TaskResult {
            self.$field.flush()
        }
        fn watermark(&mut self, watermark: i64) -> TaskResult {
            self.$field.watermark(watermark)
        }
        fn next_processing_timer(&self) -> Option<i64> {
            self.$field.next_processing_timer()
        }
        fn processing_time(&mut self, now_ms: i64) -> TaskResult {
            self.$field.processing_time(now_ms)
        }
    };
}

impl<I: Send + Serialize + DeserializeOwned + 'static> TaskBody for OneInputBody<I> {
    fn encode_batch(&self, _port: usize, batch: &(dyn Any + Send)) -> TaskResult<Vec<u8>> {
        encode_typed::<I>(batch)
    }
    fn decode_batch(&self, _port: usize, bytes: &[u8]) -> TaskResult<Box<dyn Any + Send>> {
        decode_typed::<I>(bytes)
    }
    fn process(&mut self, _port: usize, batch: Box<dyn Any + Send>) -> TaskResult<usize> {
        let mut batch = downcast::<I>(batch)?;
        let n = batch.len();
        self.chain.push(&mut batch)?;
        Ok(n)
    }
    fn end_input(&mut self, _port: usize) -> TaskResult {
        self.chain.end_input()
    }
    fn poll_source(&mut self) -> TaskResult<(usize, SourceStatus)> {
        Err(TaskError::msg("not a source task"))
    }
    delegate_chain!(chain);
}

/// A source reader feeding a chain.
pub struct SourceBody<T> {
    uid: String,
    reader: Box<dyn SourceReader<T>>,
    buf: Vec<T>,
    chain: Box<dyn Chain<T>>,
    /// Event time, when the source assigns timestamps.
    time: Option<SourceTime<T>>,
    /// The watermark emitted last (`i64::MAX` once every split ended).
    watermark: i64,
    /// The restored watermark still has to go out (after any replayed state).
    announce: bool,
}

/// A source's timestamps and its watermarks over its splits.
pub struct SourceTime<T> {
    /// The event time of a record.
    pub timestamp: TimestampFn<T>,
    /// The watermarks of the splits.
    pub watermarks: SourceWatermarks,
}

/// Name of the operator list state holding a source's splits.
pub const SOURCE_SPLITS_STATE: &str = "splits";
/// Name of the union list state holding the watermark of each source subtask; a restored
/// subtask starts from the smallest one.
pub const SOURCE_WATERMARK_STATE: &str = "watermark";

impl<T> SourceBody<T> {
    /// A source task body; `restored_watermark` is where its event time resumes.
    pub fn new(
        uid: String,
        reader: Box<dyn SourceReader<T>>,
        chain: Box<dyn Chain<T>>,
        time: Option<SourceTime<T>>,
        restored_watermark: i64,
    ) -> Self {
        if restored_watermark == WATERMARK_MAX {
            tracing::warn!(
                "source {uid} was restored with event time ended (a savepoint taken with \
                 drain, or input read to its end): it reads nothing more"
            );
        }
        SourceBody {
            uid,
            reader,
            buf: Vec::with_capacity(BATCH_RECORDS_MAX),
            chain,
            time,
            watermark: restored_watermark,
            announce: restored_watermark > WATERMARK_MIN,
        }
    }

    /// Sends what the watermark generator decided.
    fn output(&mut self, out: Option<WatermarkOutput>) -> TaskResult {
        match out {
            Some(WatermarkOutput::Watermark(w)) if w > self.watermark || self.announce => {
                self.announce = false;
                self.watermark = w.max(self.watermark);
                self.chain.watermark(self.watermark)
            }
            Some(WatermarkOutput::Idle) => self.chain.emit(Event::Idle),
            _ => Ok(()),
        }
    }

    /// The watermark generator's decision over the records read so far: when the periodic
    /// emission is due, or at once if `now_anyway` (a checkpoint).
    fn decide_watermark(&mut self, now_anyway: bool) -> Option<WatermarkOutput> {
        let time = self.time.as_mut()?;
        let now = std::time::Instant::now();
        time.watermarks
            .ensure_splits(self.reader.split_count(), now);
        if !now_anyway && !time.watermarks.due(now) {
            return None;
        }
        for i in 0..self.reader.split_count() {
            if self.reader.split_finished(i) {
                time.watermarks.on_split_finished(i);
            }
        }
        time.watermarks.emit(now)
    }
}

/// The watermark to resume from: the smallest one the restored subtasks had emitted.
pub fn restored_watermark(entries: &[Vec<u8>]) -> TaskResult<i64> {
    let mut min: Option<i64> = None;
    for e in entries {
        let w: i64 = postcard::from_bytes(e)
            .map_err(|e| TaskError::msg(format!("corrupt source watermark in checkpoint: {e}")))?;
        min = Some(min.map_or(w, |m| m.min(w)));
    }
    Ok(min.unwrap_or(WATERMARK_MIN))
}

impl<T: Send + 'static> TaskBody for SourceBody<T> {
    fn encode_batch(&self, _port: usize, _batch: &(dyn Any + Send)) -> TaskResult<Vec<u8>> {
        Err(TaskError::msg("a source task has no input"))
    }
    fn decode_batch(&self, _port: usize, _bytes: &[u8]) -> TaskResult<Box<dyn Any + Send>> {
        Err(TaskError::msg("a source task has no input"))
    }
    fn process(&mut self, _port: usize, _batch: Box<dyn Any + Send>) -> TaskResult<usize> {
        Err(TaskError::msg("a source task has no input"))
    }
    fn end_input(&mut self, _port: usize) -> TaskResult {
        self.chain.end_input()
    }
    fn poll_source(&mut self) -> TaskResult<(usize, SourceStatus)> {
        if self.announce {
            let w = self.watermark;
            self.output(Some(WatermarkOutput::Watermark(w)))?;
        }
        if self.watermark == WATERMARK_MAX {
            // Event time ended (restored from a drained stop, or from input read to its
            // end): nothing read now could be on time, so the input ends here.
            return Ok((0, SourceStatus::Exhausted));
        }
        let status = self.reader.poll(&mut self.buf, BATCH_RECORDS_MAX)?;
        let n = self.buf.len();
        let read = self.reader.last_read();
        let records = read.map_or(n, |r| r.records);
        if let (Some(time), true) = (&mut self.time, records > 0) {
            let now = std::time::Instant::now();
            // A source may find new splits (a Kafka topic's new partitions) as it runs.
            time.watermarks
                .ensure_splits(self.reader.split_count(), now);
            let split = self.reader.last_split();
            match read {
                Some(r) => {
                    if let Some(t) = r.event_time {
                        time.watermarks.on_record(split, t);
                    }
                }
                None => {
                    for r in &self.buf {
                        time.watermarks.on_record(split, (time.timestamp)(r));
                    }
                }
            }
            time.watermarks.on_batch(split, now);
        }
        let decided = self.decide_watermark(false);
        if n > 0 {
            self.chain.push(&mut self.buf)?;
        }
        self.output(decided)?;
        if status == SourceStatus::Exhausted {
            // A bounded source ends with the maximum watermark, before the final checkpoint,
            // so that every event-time result is in it.
            self.end_event_time()?;
        }
        Ok((records, status))
    }
    fn end_event_time(&mut self) -> TaskResult {
        if self.watermark == WATERMARK_MAX {
            return Ok(());
        }
        if let Some(time) = &mut self.time {
            time.watermarks.end();
        }
        self.output(Some(WatermarkOutput::Watermark(WATERMARK_MAX)))
    }
    fn snapshot(&mut self, id: Barrier, out: &mut Vec<OperatorSnapshot>) -> TaskResult {
        // The watermark the checkpoint records covers every record read before it: a restored
        // source does not read those records again, so a periodic emission still owed for
        // them would otherwise be lost (and with it, at the end of the input, the last
        // windows).
        let decided = self.decide_watermark(true);
        self.output(decided)?;
        let splits = self.reader.snapshot()?;
        self.reader.snapshot_taken(id.id);
        let splits = OperatorListData::connector(SOURCE_SPLITS_STATE, "source split", splits);
        let watermark = postcard::to_stdvec(&self.watermark).map_err(TaskError::msg)?;
        let watermark =
            OperatorListData::union_connector(SOURCE_WATERMARK_STATE, "watermark", vec![watermark]);
        out.push(
            OperatorSnapshot::new(self.uid.clone())
                .with_list(splits)
                .with_list(watermark),
        );
        self.chain.snapshot(id, out)
    }
    fn notify_complete(&mut self, id: u64) -> TaskResult {
        self.reader.notify_complete(id)?;
        self.chain.notify_complete(id)
    }
    fn notify_aborted(&mut self, id: u64) -> TaskResult {
        self.chain.notify_aborted(id)
    }
    fn emit(&mut self, event: Event) -> TaskResult {
        self.chain.emit(event)
    }
    fn flush(&mut self) -> TaskResult {
        self.chain.flush()
    }
    fn watermark(&mut self, _watermark: i64) -> TaskResult {
        Err(TaskError::msg("a source task has no input watermark"))
    }
    fn next_processing_timer(&self) -> Option<i64> {
        self.chain.next_processing_timer()
    }
    fn processing_time(&mut self, now_ms: i64) -> TaskResult {
        self.chain.processing_time(now_ms)
    }
}

/// A two-input operator heading a chain.
pub struct TwoInputBody<I1, I2, O, Op> {
    op: Op,
    out: Vec<O>,
    next: Box<dyn Chain<O>>,
    ended: [bool; 2],
    _i: std::marker::PhantomData<fn(I1, I2)>,
}

impl<I1, I2, O, Op> TwoInputBody<I1, I2, O, Op> {
    /// `op` in front of `next`.
    pub fn new(op: Op, next: Box<dyn Chain<O>>) -> Self {
        TwoInputBody {
            op,
            out: Vec::with_capacity(BATCH_RECORDS_MAX),
            next,
            ended: [false; 2],
            _i: std::marker::PhantomData,
        }
    }
}

impl<I1, I2, O, Op> TaskBody for TwoInputBody<I1, I2, O, Op>
where
    I1: Send + Serialize + DeserializeOwned + 'static,
    I2: Send + Serialize + DeserializeOwned + 'static,
    O: Send + 'static,
    Op: TwoInputOperator<I1, I2, O>,
{
    fn encode_batch(&self, port: usize, batch: &(dyn Any + Send)) -> TaskResult<Vec<u8>> {
        if port == 0 {
            encode_typed::<I1>(batch)
        } else {
            encode_typed::<I2>(batch)
        }
    }
    fn decode_batch(&self, port: usize, bytes: &[u8]) -> TaskResult<Box<dyn Any + Send>> {
        if port == 0 {
            decode_typed::<I1>(bytes)
        } else {
            decode_typed::<I2>(bytes)
        }
    }
    fn process(&mut self, port: usize, batch: Box<dyn Any + Send>) -> TaskResult<usize> {
        let n = if port == 0 {
            let mut b = downcast::<I1>(batch)?;
            let n = b.len();
            self.op.process1(&mut b, &mut self.out)?;
            n
        } else {
            let mut b = downcast::<I2>(batch)?;
            let n = b.len();
            self.op.process2(&mut b, &mut self.out)?;
            n
        };
        if !self.out.is_empty() {
            self.next.push(&mut self.out)?;
        }
        Ok(n)
    }
    fn end_input(&mut self, port: usize) -> TaskResult {
        if let Some(e) = self.ended.get_mut(port) {
            *e = true;
        }
        if self.ended == [true, true] {
            self.op.end_input(&mut self.out)?;
            if !self.out.is_empty() {
                self.next.push(&mut self.out)?;
            }
            self.next.end_input()?;
        }
        Ok(())
    }
    fn poll_source(&mut self) -> TaskResult<(usize, SourceStatus)> {
        Err(TaskError::msg("not a source task"))
    }
    fn snapshot(&mut self, id: Barrier, out: &mut Vec<OperatorSnapshot>) -> TaskResult {
        if let Some(s) = self.op.snapshot(id)? {
            out.push(s);
        }
        self.next.snapshot(id, out)
    }
    fn notify_complete(&mut self, id: u64) -> TaskResult {
        self.op.notify_complete(id)?;
        self.next.notify_complete(id)
    }
    fn notify_aborted(&mut self, id: u64) -> TaskResult {
        self.op.notify_aborted(id)?;
        self.next.notify_aborted(id)
    }
    fn emit(&mut self, event: Event) -> TaskResult {
        self.next.emit(event)
    }
    fn flush(&mut self) -> TaskResult {
        self.next.flush()
    }
    fn watermark(&mut self, watermark: i64) -> TaskResult {
        let forward = self.op.on_watermark(watermark, &mut self.out)?;
        if !self.out.is_empty() {
            self.next.push(&mut self.out)?;
        }
        match forward {
            Some(w) => self.next.watermark(w),
            None => Ok(()),
        }
    }
    fn next_processing_timer(&self) -> Option<i64> {
        earliest(
            self.op.next_processing_timer(),
            self.next.next_processing_timer(),
        )
    }
    fn processing_time(&mut self, now_ms: i64) -> TaskResult {
        if self.op.next_processing_timer().is_some_and(|t| t <= now_ms) {
            let made = self.op.on_processing_time(now_ms, &mut self.out)?;
            if !self.out.is_empty() {
                self.next.push(&mut self.out)?;
            }
            if let Some(w) = made {
                self.next.watermark(w)?;
            }
        }
        self.next.processing_time(now_ms)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::runtime::watermark::WatermarkGenerator;

    /// Reads the timestamps it was given, a batch per poll, and returns only the even ones
    /// (a source running a filter), reporting the event time of all it read.
    struct Filtering {
        batches: Vec<Vec<i64>>,
        read: Option<PollRead>,
    }

    impl SourceReader<i64> for Filtering {
        fn poll(&mut self, out: &mut Vec<i64>, _max: usize) -> TaskResult<SourceStatus> {
            let batch = self.batches.remove(0);
            self.read = Some(PollRead {
                records: batch.len(),
                event_time: batch.iter().copied().max(),
            });
            out.extend(batch.into_iter().filter(|t| t % 2 == 0));
            Ok(SourceStatus::More)
        }
        fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
            Ok(Vec::new())
        }
        fn last_read(&mut self) -> Option<PollRead> {
            self.read.take()
        }
    }

    /// Records the watermarks that reach it.
    struct Watermarks(Arc<Mutex<Vec<i64>>>);

    impl Chain<i64> for Watermarks {
        fn push(&mut self, batch: &mut Vec<i64>) -> TaskResult {
            batch.clear();
            Ok(())
        }
        fn end_input(&mut self) -> TaskResult {
            Ok(())
        }
        fn watermark(&mut self, watermark: i64) -> TaskResult {
            self.0.lock().unwrap().push(watermark);
            Ok(())
        }
        fn next_processing_timer(&self) -> Option<i64> {
            None
        }
        fn processing_time(&mut self, _: i64) -> TaskResult {
            Ok(())
        }
        fn snapshot(&mut self, _: Barrier, _: &mut Vec<OperatorSnapshot>) -> TaskResult {
            Ok(())
        }
        fn notify_complete(&mut self, _: u64) -> TaskResult {
            Ok(())
        }
        fn notify_aborted(&mut self, _: u64) -> TaskResult {
            Ok(())
        }
        fn emit(&mut self, _: Event) -> TaskResult {
            Ok(())
        }
        fn flush(&mut self) -> TaskResult {
            Ok(())
        }
    }

    #[test]
    fn a_source_counts_and_times_the_records_its_reader_read_not_only_those_it_returned() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let reader = Filtering {
            // The second batch returns nothing, the third only an older record.
            batches: vec![vec![1_000, 2_000], vec![5_001, 7_001], vec![3_000, 9_001]],
            read: None,
        };
        let watermarks = SourceWatermarks::new(
            WatermarkGenerator::BoundedOutOfOrderness(Duration::ZERO),
            None,
            Duration::ZERO,
            1,
            WATERMARK_MIN,
            Instant::now(),
        );
        let time = SourceTime {
            timestamp: Arc::new(|t: &i64| *t),
            watermarks,
        };
        let chain = Box::new(Watermarks(seen.clone()));
        let mut body = SourceBody::new(
            "s".into(),
            Box::new(reader),
            chain,
            Some(time),
            WATERMARK_MIN,
        );
        let mut after = Vec::new();
        for _ in 0..3 {
            // The records counted are those read.
            assert_eq!(body.poll_source().unwrap().0, 2);
            after.push(*seen.lock().unwrap().last().unwrap());
        }
        // Bounded out of orderness by 0: the largest timestamp read, less 1 ms.
        assert_eq!(after, [1_999, 7_000, 9_000]);
    }
}
