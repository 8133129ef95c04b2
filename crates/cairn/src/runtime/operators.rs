//! The built-in operators behind the DataStream API, and the sink interface.

use std::marker::PhantomData;

use super::functions::{
    CoProcessFunction, Collector, KeyedCoProcessFunction, KeyedProcessFunction, ProcessFunction,
};
use super::watermark::{TimestampFn, WATERMARK_MAX};
use crate::checkpoint::restore::LoadedCheckpoint;
use crate::checkpoint::Barrier;
use crate::error::TaskResult;
use crate::state::{
    Key, KeyedContext, OperatorListData, OperatorSnapshot, OperatorStateStore, TimeDomain,
};

use super::chain::{Operator, TwoInputOperator};

/// `map`: one record in, one out.
pub struct MapOp<F>(pub F);

impl<I, O, F: FnMut(I) -> O + Send + 'static> Operator<I, O> for MapOp<F> {
    fn process(&mut self, input: &mut Vec<I>, out: &mut Vec<O>) -> TaskResult {
        out.extend(input.drain(..).map(&mut self.0));
        Ok(())
    }
}

/// `filter`: keeps the records the predicate accepts.
pub struct FilterOp<F>(pub F);

impl<T, F: FnMut(&T) -> bool + Send + 'static> Operator<T, T> for FilterOp<F> {
    fn process(&mut self, input: &mut Vec<T>, out: &mut Vec<T>) -> TaskResult {
        out.extend(input.drain(..).filter(|r| (self.0)(r)));
        Ok(())
    }
}

/// `flat_map`: any number of records out per record in.
pub struct FlatMapOp<F>(pub F);

impl<I, O, F: FnMut(I, &mut Collector<O>) + Send + 'static> Operator<I, O> for FlatMapOp<F> {
    fn process(&mut self, input: &mut Vec<I>, out: &mut Vec<O>) -> TaskResult {
        let mut c = Collector::new(out);
        for r in input.drain(..) {
            (self.0)(r, &mut c);
        }
        Ok(())
    }
}

/// Passes records through (the head of a `union`).
pub struct IdentityOp;

impl<T: Send + 'static> Operator<T, T> for IdentityOp {
    fn process(&mut self, input: &mut Vec<T>, out: &mut Vec<T>) -> TaskResult {
        out.append(input);
        Ok(())
    }
}

/// A process function with its operator state.
pub struct ProcessOp<I, O, F> {
    uid: String,
    f: F,
    store: OperatorStateStore,
    _io: PhantomData<fn(I) -> O>,
}

impl<I, O, F: ProcessFunction<I, O>> ProcessOp<I, O, F> {
    /// Opens `f` over its (possibly restored) operator state.
    pub fn new(uid: String, mut f: F, mut store: OperatorStateStore) -> TaskResult<Self> {
        f.open(&mut store)?;
        Ok(ProcessOp {
            uid,
            f,
            store,
            _io: PhantomData,
        })
    }
}

impl<I, O, F> Operator<I, O> for ProcessOp<I, O, F>
where
    I: Send + 'static,
    O: Send + 'static,
    F: ProcessFunction<I, O>,
{
    fn process(&mut self, input: &mut Vec<I>, out: &mut Vec<O>) -> TaskResult {
        let mut c = Collector::new(out);
        for r in input.drain(..) {
            self.f.process(r, &mut self.store, &mut c)?;
        }
        Ok(())
    }
    fn snapshot(&mut self, _id: Barrier) -> TaskResult<Option<OperatorSnapshot>> {
        self.f.snapshot_state(&mut self.store)?;
        Ok(Some(self.store.snapshot(&self.uid)))
    }
}

/// A keyed process function with its keyed state backend and timers.
pub struct KeyedProcessOp<K, I, O, KF, F> {
    uid: String,
    key_of: KF,
    timestamps: Option<TimestampFn<I>>,
    f: F,
    ctx: KeyedContext<K>,
    _io: PhantomData<fn(I) -> O>,
}

impl<K: Key, I, O, KF, F> KeyedProcessOp<K, I, O, KF, F>
where
    F: KeyedProcessFunction<K, I, O>,
{
    /// Opens `f` over a (possibly restored) backend.
    pub fn new(uid: String, key_of: KF, mut f: F, mut ctx: KeyedContext<K>) -> TaskResult<Self> {
        ctx.check_restored()?;
        f.open(&mut ctx)?;
        Ok(KeyedProcessOp {
            uid,
            key_of,
            timestamps: None,
            f,
            ctx,
            _io: PhantomData,
        })
    }

    /// Records carry event time: `ctx.timestamp()` gives it.
    pub fn with_timestamps(mut self, timestamps: Option<TimestampFn<I>>) -> Self {
        self.timestamps = timestamps;
        self
    }
}

/// Moves a keyed operator's event time to `watermark` and fires the event-time timers due at
/// it through `on_timer`.
///
/// End of input: when the watermark reaches the maximum (`WATERMARK_MAX`, which a bounded
/// source emits once all its input is read, before its final checkpoint), every
/// processing-time timer pending at that moment fires too, after the event-time ones. All the
/// data is there, so a processing-time window has everything it will ever get; without this
/// the processing-time windows of a bounded job that ends before their time would never fire
/// (Flink drops pending processing-time timers at end of input). The event-time timers those
/// firings register fire as well; the processing-time timers they register follow the wall
/// clock, so a function that keeps re-registering one cannot hold the task at end of input.
fn advance_event_time<K: Key, O>(
    ctx: &mut KeyedContext<K>,
    watermark: i64,
    out: &mut Vec<O>,
    mut on_timer: impl FnMut(i64, TimeDomain, &mut KeyedContext<K>, &mut Collector<O>) -> TaskResult,
) -> TaskResult {
    ctx.set_watermark(watermark);
    let mut c = Collector::new(out);
    while let Some(t) = ctx.next_due_timer(TimeDomain::EventTime, watermark)? {
        on_timer(t, TimeDomain::EventTime, ctx, &mut c)?;
    }
    if watermark == WATERMARK_MAX && ctx.has_processing_timers() {
        for (t, key) in ctx.drain_processing_timers()? {
            ctx.set_current_key(key);
            ctx.set_timestamp(Some(t));
            on_timer(t, TimeDomain::ProcessingTime, ctx, &mut c)?;
        }
        while let Some(t) = ctx.next_due_timer(TimeDomain::EventTime, watermark)? {
            on_timer(t, TimeDomain::EventTime, ctx, &mut c)?;
        }
    }
    Ok(())
}

/// When a keyed operator's next processing-time timer is due: once the wall clock has passed
/// its time (at `t + 1` ms), as in Flink, so that a timer at a window's last millisecond fires
/// after every record processed in that millisecond, and a record read after the firing
/// belongs to a later window: with a wall clock that does not go back, a processing-time
/// window never fires twice for the same key.
fn processing_timer_due<K: Key>(ctx: &KeyedContext<K>) -> Option<i64> {
    ctx.next_processing_timer().map(|t| t.saturating_add(1))
}

/// Processing time reached `now_ms`: fires the processing-time timers before it (see
/// [`processing_timer_due`]) through `on_timer`.
fn advance_processing_time<K: Key, O>(
    ctx: &mut KeyedContext<K>,
    now_ms: i64,
    out: &mut Vec<O>,
    mut on_timer: impl FnMut(i64, TimeDomain, &mut KeyedContext<K>, &mut Collector<O>) -> TaskResult,
) -> TaskResult {
    let mut c = Collector::new(out);
    let upto = now_ms.saturating_sub(1);
    while let Some(t) = ctx.next_due_timer(TimeDomain::ProcessingTime, upto)? {
        on_timer(t, TimeDomain::ProcessingTime, ctx, &mut c)?;
    }
    Ok(())
}

impl<K, I, O, KF, F> Operator<I, O> for KeyedProcessOp<K, I, O, KF, F>
where
    K: Key,
    I: Send + 'static,
    O: Send + 'static,
    KF: Fn(&I) -> K + Send + 'static,
    F: KeyedProcessFunction<K, I, O>,
{
    fn process(&mut self, input: &mut Vec<I>, out: &mut Vec<O>) -> TaskResult {
        let mut c = Collector::new(out);
        for r in input.drain(..) {
            self.ctx.set_current_key((self.key_of)(&r));
            if let Some(ts) = &self.timestamps {
                self.ctx.set_timestamp(Some(ts(&r)));
            }
            self.f.process(r, &mut self.ctx, &mut c)?;
        }
        Ok(())
    }
    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        let f = &mut self.f;
        advance_event_time(&mut self.ctx, watermark, out, |t, d, ctx, c| {
            f.on_timer(t, d, ctx, c)
        })?;
        Ok(Some(watermark))
    }
    fn next_processing_timer(&self) -> Option<i64> {
        processing_timer_due(&self.ctx)
    }
    fn on_processing_time(&mut self, now_ms: i64, out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        let f = &mut self.f;
        advance_processing_time(&mut self.ctx, now_ms, out, |t, d, ctx, c| {
            f.on_timer(t, d, ctx, c)
        })?;
        Ok(None)
    }
    fn snapshot(&mut self, barrier: Barrier) -> TaskResult<Option<OperatorSnapshot>> {
        let snap = self
            .ctx
            .snapshot_for(&self.uid, barrier.id, barrier.savepoint)?;
        Ok(Some(snap))
    }
    fn notify_complete(&mut self, checkpoint_id: u64) -> TaskResult {
        self.ctx.notify_complete(checkpoint_id);
        Ok(())
    }
    fn notify_aborted(&mut self, checkpoint_id: u64) -> TaskResult {
        self.ctx.notify_aborted(checkpoint_id);
        Ok(())
    }
}

/// A keyed co-process function over two keyed inputs.
pub struct KeyedCoProcessOp<K, I1, I2, O, KF1, KF2, F> {
    uid: String,
    key1: KF1,
    key2: KF2,
    ts1: Option<TimestampFn<I1>>,
    ts2: Option<TimestampFn<I2>>,
    f: F,
    ctx: KeyedContext<K>,
    _io: PhantomData<fn(I1, I2) -> O>,
}

impl<K: Key, I1, I2, O, KF1, KF2, F> KeyedCoProcessOp<K, I1, I2, O, KF1, KF2, F>
where
    F: KeyedCoProcessFunction<K, I1, I2, O>,
{
    /// Opens `f` over a (possibly restored) backend.
    pub fn new(
        uid: String,
        key1: KF1,
        key2: KF2,
        mut f: F,
        mut ctx: KeyedContext<K>,
    ) -> TaskResult<Self> {
        ctx.check_restored()?;
        f.open(&mut ctx)?;
        Ok(KeyedCoProcessOp {
            uid,
            key1,
            key2,
            ts1: None,
            ts2: None,
            f,
            ctx,
            _io: PhantomData,
        })
    }
}

impl<K, I1, I2, O, KF1, KF2, F> KeyedCoProcessOp<K, I1, I2, O, KF1, KF2, F> {
    /// The inputs' records carry event time: `ctx.timestamp()` gives it.
    pub fn with_timestamps(
        mut self,
        ts1: Option<TimestampFn<I1>>,
        ts2: Option<TimestampFn<I2>>,
    ) -> Self {
        self.ts1 = ts1;
        self.ts2 = ts2;
        self
    }
}

impl<K, I1, I2, O, KF1, KF2, F> TwoInputOperator<I1, I2, O>
    for KeyedCoProcessOp<K, I1, I2, O, KF1, KF2, F>
where
    K: Key,
    I1: Send + 'static,
    I2: Send + 'static,
    O: Send + 'static,
    KF1: Fn(&I1) -> K + Send + 'static,
    KF2: Fn(&I2) -> K + Send + 'static,
    F: KeyedCoProcessFunction<K, I1, I2, O>,
{
    fn process1(&mut self, input: &mut Vec<I1>, out: &mut Vec<O>) -> TaskResult {
        let mut c = Collector::new(out);
        for r in input.drain(..) {
            self.ctx.set_current_key((self.key1)(&r));
            if let Some(ts) = &self.ts1 {
                self.ctx.set_timestamp(Some(ts(&r)));
            }
            self.f.process1(r, &mut self.ctx, &mut c)?;
        }
        Ok(())
    }
    fn process2(&mut self, input: &mut Vec<I2>, out: &mut Vec<O>) -> TaskResult {
        let mut c = Collector::new(out);
        for r in input.drain(..) {
            self.ctx.set_current_key((self.key2)(&r));
            if let Some(ts) = &self.ts2 {
                self.ctx.set_timestamp(Some(ts(&r)));
            }
            self.f.process2(r, &mut self.ctx, &mut c)?;
        }
        Ok(())
    }
    fn on_watermark(&mut self, watermark: i64, out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        let f = &mut self.f;
        advance_event_time(&mut self.ctx, watermark, out, |t, d, ctx, c| {
            f.on_timer(t, d, ctx, c)
        })?;
        Ok(Some(watermark))
    }
    fn next_processing_timer(&self) -> Option<i64> {
        processing_timer_due(&self.ctx)
    }
    fn on_processing_time(&mut self, now_ms: i64, out: &mut Vec<O>) -> TaskResult<Option<i64>> {
        let f = &mut self.f;
        advance_processing_time(&mut self.ctx, now_ms, out, |t, d, ctx, c| {
            f.on_timer(t, d, ctx, c)
        })?;
        Ok(None)
    }
    fn snapshot(&mut self, barrier: Barrier) -> TaskResult<Option<OperatorSnapshot>> {
        let snap = self
            .ctx
            .snapshot_for(&self.uid, barrier.id, barrier.savepoint)?;
        Ok(Some(snap))
    }
    fn notify_complete(&mut self, checkpoint_id: u64) -> TaskResult {
        self.ctx.notify_complete(checkpoint_id);
        Ok(())
    }
    fn notify_aborted(&mut self, checkpoint_id: u64) -> TaskResult {
        self.ctx.notify_aborted(checkpoint_id);
        Ok(())
    }
}

/// A co-process function over two unkeyed inputs.
pub struct CoProcessOp<F>(pub F);

impl<I1, I2, O, F> TwoInputOperator<I1, I2, O> for CoProcessOp<F>
where
    I1: Send + 'static,
    I2: Send + 'static,
    O: Send + 'static,
    F: CoProcessFunction<I1, I2, O>,
{
    fn process1(&mut self, input: &mut Vec<I1>, out: &mut Vec<O>) -> TaskResult {
        let mut c = Collector::new(out);
        for r in input.drain(..) {
            self.0.process1(r, &mut c)?;
        }
        Ok(())
    }
    fn process2(&mut self, input: &mut Vec<I2>, out: &mut Vec<O>) -> TaskResult {
        let mut c = Collector::new(out);
        for r in input.drain(..) {
            self.0.process2(r, &mut c)?;
        }
        Ok(())
    }
}

/// What a sink adds to the end-to-end guarantee (design R18).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SinkGuarantee {
    /// Two-phase commit tied to checkpoints: exactly-once end to end.
    ExactlyOnce,
    /// Writes may be repeated after a failure.
    AtLeastOnce,
    /// Nothing is promised (print, discard).
    None,
}

/// Which sink of which job: a sink names what it writes after its owner, so that on restore
/// it can tell its own uncommitted leftovers from those of other sinks and jobs sharing the
/// same output (it only ever removes its own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkOwner {
    /// Job id (the job's directory name under the checkpoint directory); kept across restores
    /// from the job's own checkpoints.
    pub job_id: String,
    /// The sink operator's uid, stable across restores.
    pub uid: String,
}

/// What a sink writer knows about where it runs.
#[derive(Debug, Clone)]
pub struct SinkContext {
    /// The job and sink the writer writes for.
    pub owner: SinkOwner,
    /// Subtask index.
    pub subtask: u32,
    /// Sink parallelism.
    pub parallelism: u32,
    /// Whether checkpoints run; without them a transactional sink commits at end of input.
    pub checkpointing: bool,
    /// The pending state of every subtask in the restored checkpoint, as
    /// [`Sink::initialize`] got it (None on a fresh start). A writer may run in another
    /// process than `initialize` (a worker of a cluster): what it needs of the restore it
    /// derives from this, never from what `initialize` kept.
    pub restored: Option<Vec<Vec<u8>>>,
}

/// A sink: writes records, and takes part in checkpoints as a two-phase commit participant.
pub trait Sink<T>: Send + Sync + 'static {
    /// The guarantee this sink adds.
    fn guarantee(&self) -> SinkGuarantee;
    /// Called once per job attempt before any writer exists, with the pre-committed
    /// transactions of every subtask in the restored checkpoint (None on a fresh start): commit
    /// them (idempotently) and discard what `owner` left uncommitted in earlier attempts —
    /// never what other sinks or jobs wrote.
    fn initialize(&self, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
        let _ = (owner, restored);
        Ok(())
    }
    /// A writer for one subtask.
    fn create_writer(&self, ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>>;
    /// Whether the sink writes to the standard output of the process its subtasks run in: on
    /// a cluster, some worker's (see [`JobGraph::stdout_sinks`](crate::runtime::graph::JobGraph::stdout_sinks)).
    fn writes_to_stdout(&self) -> bool {
        false
    }
}

/// The writing side of a sink subtask.
pub trait SinkWriter<T>: Send {
    /// Writes (drains) a batch into the current transaction.
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult;
    /// Barrier `checkpoint_id`: flush and pre-commit the current transaction; returns every
    /// pre-committed, not yet committed transaction, to be kept in the checkpoint.
    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>>;
    /// Checkpoint `checkpoint_id` completed: commit the transactions pre-committed up to it.
    fn commit(&mut self, checkpoint_id: u64) -> TaskResult;
    /// End of input.
    fn finish(&mut self) -> TaskResult;
}

/// Name of the operator list state holding a sink's pre-committed transactions.
pub const SINK_PENDING_STATE: &str = "pending";

/// The pending state of every subtask of sink `uid` in checkpoint `restored`: what
/// [`Sink::initialize`] is given, and each writer too ([`SinkContext::restored`]).
pub fn sink_pending(restored: &LoadedCheckpoint, uid: &str) -> Vec<Vec<u8>> {
    restored.all_list_entries(uid, SINK_PENDING_STATE)
}

/// Runs a [`SinkWriter`] as the last operator of a chain.
pub struct SinkOp<T> {
    uid: String,
    writer: Box<dyn SinkWriter<T>>,
}

impl<T> SinkOp<T> {
    /// Wraps a writer.
    pub fn new(uid: String, writer: Box<dyn SinkWriter<T>>) -> Self {
        SinkOp { uid, writer }
    }
}

impl<T: Send + 'static> Operator<T, ()> for SinkOp<T> {
    fn process(&mut self, input: &mut Vec<T>, _out: &mut Vec<()>) -> TaskResult {
        self.writer.write(input)
    }
    fn end_input(&mut self, _out: &mut Vec<()>) -> TaskResult {
        self.writer.finish()
    }
    fn snapshot(&mut self, id: Barrier) -> TaskResult<Option<OperatorSnapshot>> {
        let id = id.id;
        let pending = self.writer.pre_commit(id)?;
        crate::failpoint::hit("sink-pre-committed", id);
        let pending = OperatorListData::connector(SINK_PENDING_STATE, "sink transaction", pending);
        Ok(Some(
            OperatorSnapshot::new(self.uid.clone()).with_list(pending),
        ))
    }
    fn notify_complete(&mut self, id: u64) -> TaskResult {
        crate::failpoint::hit("sink-committing", id);
        self.writer.commit(id)
    }
}
