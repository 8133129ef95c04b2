//! The DataStream API: a typed builder of job graphs.
//!
//! ```
//! use cairn::api::StreamEnv;
//! use cairn::connectors::{DiscardSink, GeneratorSource};
//!
//! let env = StreamEnv::new();
//! env.source(GeneratorSource::new(1_000, 10))
//!     .uid("words")
//!     .key_by(|w| w.clone())
//!     .reduce(|a, _| a.clone())
//!     .uid("first-per-word")
//!     .sink(DiscardSink)
//!     .uid("sink");
//! let graph = env.build("example").unwrap();
//! assert_eq!(graph.nodes().len(), 3);
//! ```
//!
//! Every operator gets a stable `uid` (set it explicitly for anything whose state must survive a
//! change of the program) and a parallelism (default: the job's `parallelism.default`).
//! Operators connected forward with equal parallelism are chained into one task at run time.

pub use crate::runtime::functions;

mod dedup;
pub use dedup::{DedupHorizon, Deduplicate, DEDUP_STATE};

use std::cell::RefCell;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::ops::AddAssign;
use std::rc::Rc;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use functions::{
    CoProcessFunction, Collector, KeyedCoProcessFunction, KeyedProcessFunction, ProcessFunction,
};

use crate::error::{TaskError, TaskResult};
use crate::runtime::chain::{
    restored_watermark, Chain, EdgeWriter, Link, NullChain, OneInputBody, Operator, Partitioner,
    RecordWriter, Source, SourceBody, SourceTime, TaskBody, TwoInputBody, SOURCE_WATERMARK_STATE,
};
use crate::runtime::graph::{
    AnyBox, HeadFn, LinkFn, SinkInitFn, SourceFn, SplitsFn, TwoInputFn, WriterFn,
};
pub use crate::runtime::graph::{
    EdgeOutput, EdgePartition, EdgeSpec, JobGraph, NodeKind, NodeSpec, SubtaskInit,
};
use crate::runtime::operators::{
    CoProcessOp, FilterOp, FlatMapOp, IdentityOp, KeyedCoProcessOp, KeyedProcessOp, MapOp,
    ProcessOp, Sink, SinkContext, SinkOp, SinkOwner,
};
use crate::runtime::watermark::SourceWatermarks;
pub use crate::runtime::watermark::{TimestampFn, WatermarkStrategy};
use crate::state::keygroup::stable_hash;
use crate::state::{Key, KeyedContext};
use crate::window::join::{IntervalJoin, WindowCoGroup};
pub use crate::window::WindowOutput;
pub use crate::window::{
    AggregateFunction, ProcessWindowFunction, TimeWindow, Trigger as WindowTrigger, WindowAssigner,
};
use crate::window::{
    CollectAll, Emit, Reduce, ResultsOnly, Trigger, WindowFunction, WindowSpec, WithLate,
};

/// A record type: cloneable (broadcast, several consumers), sendable between threads,
/// shareable (`Sync`: records kept in keyed state are read by a snapshot's asynchronous part
/// while the task goes on) and serializable (between processes).
pub trait Data: Clone + Send + Sync + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Sync + Serialize + DeserializeOwned + 'static> Data for T {}

#[derive(Default)]
struct GraphBuilder {
    nodes: Vec<NodeSpec>,
    edges: Vec<EdgeSpec>,
    /// Problems found while building (bad window sizes): `build` reports the first.
    errors: Vec<String>,
}

/// Builds a job graph with the DataStream API.
#[derive(Clone, Default)]
pub struct StreamEnv {
    graph: Rc<RefCell<GraphBuilder>>,
}

fn writer_fn<T: Data>() -> WriterFn {
    Arc::new(|outputs: Vec<EdgeOutput>| {
        if outputs.is_empty() {
            let chain: Box<dyn Chain<T>> = Box::new(NullChain);
            return Ok(Box::new(chain) as AnyBox);
        }
        let mut edges = Vec::with_capacity(outputs.len());
        for o in outputs {
            let partitioner = match (&o.partition, o.forward) {
                (_, true) => Partitioner::Forward,
                (EdgePartition::Default, false) | (EdgePartition::Rebalance, false) => {
                    Partitioner::Rebalance
                }
                (EdgePartition::Broadcast, false) => Partitioner::Broadcast,
                (EdgePartition::Hash(h), false) => {
                    let key_hash = h
                        .clone()
                        .downcast::<Arc<dyn Fn(&T) -> u64 + Send + Sync>>()
                        .map_err(|_| TaskError::msg("key selector of an unexpected type"))?;
                    Partitioner::Hash {
                        key_hash: (*key_hash).clone(),
                        max_parallelism: o.max_parallelism,
                    }
                }
            };
            edges.push(EdgeWriter::new(partitioner, o.senders));
        }
        let chain: Box<dyn Chain<T>> = Box::new(RecordWriter::new(edges));
        Ok(Box::new(chain) as AnyBox)
    })
}

fn take_chain<O: 'static>(next: AnyBox) -> TaskResult<Box<dyn Chain<O>>> {
    next.downcast::<Box<dyn Chain<O>>>()
        .map(|b| *b)
        .map_err(|_| TaskError::msg("operators of mismatched types were chained"))
}

fn link_fn<I: Data, O: Data, Op: Operator<I, O>>(
    make: impl Fn(&mut SubtaskInit) -> TaskResult<Op> + Send + Sync + 'static,
) -> NodeKind {
    let link: LinkFn = Arc::new(move |init, next| {
        let next = take_chain::<O>(next)?;
        let op = make(init)?;
        let chain: Box<dyn Chain<I>> = Box::new(Link::<I, O, Op>::new(op, next));
        Ok(Box::new(chain) as AnyBox)
    });
    let head: HeadFn = Arc::new(|chain| {
        let chain = take_chain::<I>(chain)?;
        Ok(Box::new(OneInputBody::new(chain)) as Box<dyn TaskBody>)
    });
    NodeKind::OneInput { link, head }
}

impl StreamEnv {
    /// A new, empty job graph builder.
    pub fn new() -> Self {
        Self::default()
    }

    fn add_node<O: Data>(
        &self,
        kind_name: &str,
        kind: NodeKind,
        sink_init: Option<SinkInitFn>,
    ) -> usize {
        let mut g = self.graph.borrow_mut();
        let id = g.nodes.len();
        g.nodes.push(NodeSpec {
            id,
            uid: format!("{kind_name}-{id}"),
            name: kind_name.to_string(),
            parallelism: None,
            kind,
            writer: writer_fn::<O>(),
            sink_init,
            stdout: false,
        });
        id
    }

    fn add_edge(&self, from: usize, to: usize, port: usize, partition: EdgePartition) {
        self.graph.borrow_mut().edges.push(EdgeSpec {
            from,
            to,
            port,
            partition,
        });
    }

    /// Adds a source.
    pub fn source<T: Data, S: Source<T>>(&self, source: S) -> DataStream<T> {
        self.add_source(source, None)
    }

    /// A source whose records carry event time: timestamps and watermarks are made per split
    /// by `strategy` (Flink's `fromSource(source, strategy, name)`).
    pub fn source_with_watermarks<T: Data, S: Source<T>>(
        &self,
        source: S,
        strategy: WatermarkStrategy<T>,
    ) -> DataStream<T> {
        let timestamps = strategy.timestamp.clone();
        let mut stream = self.add_source(source, Some(strategy));
        stream.timestamps = Some(timestamps);
        stream
    }

    fn add_source<T: Data, S: Source<T>>(
        &self,
        source: S,
        strategy: Option<WatermarkStrategy<T>>,
    ) -> DataStream<T> {
        let source = Arc::new(source);
        let s1 = source.clone();
        let splits: SplitsFn = Arc::new(move |p| s1.create_splits(p));
        let body: SourceFn = Arc::new(move |init, splits, next| {
            let next = take_chain::<T>(next)?;
            let reader = source.create_reader(init.subtask, init.parallelism, splits)?;
            let restored = restored_watermark(&init.restored.take_list(SOURCE_WATERMARK_STATE))?;
            let time = strategy.as_ref().map(|s| SourceTime {
                timestamp: s.timestamp.clone(),
                watermarks: SourceWatermarks::new(
                    s.generator,
                    s.idleness,
                    init.watermark_interval,
                    reader.split_count(),
                    restored,
                    std::time::Instant::now(),
                ),
            });
            let body = SourceBody::new(init.uid.clone(), reader, next, time, restored);
            Ok(Box::new(body) as Box<dyn TaskBody>)
        });
        let id = self.add_node::<T>("source", NodeKind::Source { splits, body }, None);
        DataStream::new(self.clone(), id)
    }

    /// Validates the graph: unique uids, no empty graph.
    pub fn build(&self, name: &str) -> Result<JobGraph, String> {
        let g = self.graph.borrow();
        if let Some(e) = g.errors.first() {
            return Err(format!("job '{name}': {e}"));
        }
        if g.nodes.is_empty() {
            return Err(format!("job '{name}' has no operators"));
        }
        let mut seen = HashSet::new();
        for n in &g.nodes {
            if !seen.insert(n.uid.as_str()) {
                return Err(format!(
                    "job '{name}': uid '{}' is used by two operators",
                    n.uid
                ));
            }
            if n.parallelism == Some(0) {
                return Err(format!(
                    "job '{name}': operator '{}' has parallelism 0",
                    n.uid
                ));
            }
        }
        Ok(JobGraph::new(
            name.to_string(),
            g.nodes.clone(),
            g.edges.clone(),
        ))
    }
}

/// A stream of records of type `T`.
pub struct DataStream<T> {
    env: StreamEnv,
    node: usize,
    partition: EdgePartition,
    /// The event time of a record, when the stream has one (set at a source with watermarks,
    /// by `assign_timestamps_and_watermarks` or `with_timestamps`, kept by operators that do not
    /// change the record type).
    timestamps: Option<TimestampFn<T>>,
    _t: PhantomData<fn() -> T>,
}

/// A stream may feed several operators: each gets every record.
impl<T> Clone for DataStream<T> {
    fn clone(&self) -> Self {
        DataStream {
            env: self.env.clone(),
            node: self.node,
            partition: self.partition.clone(),
            timestamps: self.timestamps.clone(),
            _t: PhantomData,
        }
    }
}

impl<T: Data> DataStream<T> {
    fn new(env: StreamEnv, node: usize) -> Self {
        DataStream {
            env,
            node,
            partition: EdgePartition::Default,
            timestamps: None,
            _t: PhantomData,
        }
    }

    /// The same stream with `timestamps` as its records' event time.
    fn timed(mut self, timestamps: Option<TimestampFn<T>>) -> Self {
        self.timestamps = timestamps;
        self
    }

    /// Declares the event time of this stream's records (after an operator that changed the
    /// record type, say a window result whose timestamp is its window's end). Watermarks keep
    /// coming from upstream.
    pub fn with_timestamps(self, timestamps: impl Fn(&T) -> i64 + Send + Sync + 'static) -> Self {
        self.timed(Some(Arc::new(timestamps)))
    }

    fn modify(self, f: impl FnOnce(&mut NodeSpec)) -> Self {
        if let Some(n) = self.env.graph.borrow_mut().nodes.get_mut(self.node) {
            f(n);
        }
        self
    }

    /// Sets the stable uid of the operator that produces this stream.
    pub fn uid(self, uid: &str) -> Self {
        self.modify(|n| n.uid = uid.to_string())
    }

    /// Sets the display name of the operator that produces this stream.
    pub fn name(self, name: &str) -> Self {
        self.modify(|n| n.name = name.to_string())
    }

    /// Sets the parallelism of the operator that produces this stream.
    pub fn parallelism(self, parallelism: u32) -> Self {
        self.modify(|n| n.parallelism = Some(parallelism))
    }

    /// Spreads the next edge round robin over the downstream subtasks.
    pub fn rebalance(mut self) -> Self {
        self.partition = EdgePartition::Rebalance;
        self
    }

    /// Sends every record of the next edge to every downstream subtask.
    pub fn broadcast(mut self) -> Self {
        self.partition = EdgePartition::Broadcast;
        self
    }

    fn one_input<O: Data, Op: Operator<T, O>>(
        &self,
        kind_name: &str,
        make: impl Fn(&mut SubtaskInit) -> TaskResult<Op> + Send + Sync + 'static,
    ) -> DataStream<O> {
        let id = self
            .env
            .add_node::<O>(kind_name, link_fn::<T, O, Op>(make), None);
        self.env.add_edge(self.node, id, 0, self.partition.clone());
        DataStream::new(self.env.clone(), id)
    }

    /// One record out per record in.
    pub fn map<O: Data>(self, f: impl Fn(T) -> O + Clone + Send + Sync + 'static) -> DataStream<O> {
        self.one_input("map", move |_| Ok(MapOp(f.clone())))
    }

    /// Keeps the records for which `f` is true.
    pub fn filter(self, f: impl Fn(&T) -> bool + Clone + Send + Sync + 'static) -> DataStream<T> {
        let ts = self.timestamps.clone();
        self.one_input("filter", move |_| Ok(FilterOp(f.clone())))
            .timed(ts)
    }

    /// Any number of records out per record in.
    pub fn flat_map<O: Data>(
        self,
        f: impl Fn(T, &mut Collector<O>) + Clone + Send + Sync + 'static,
    ) -> DataStream<O> {
        self.one_input("flat_map", move |_| Ok(FlatMapOp(f.clone())))
    }

    /// Runs a process function with operator state (named lists of the subtask, split evenly
    /// or given whole to every subtask when the job resumes at another parallelism).
    pub fn process<O: Data>(self, f: impl ProcessFunction<T, O> + Sync) -> DataStream<O> {
        self.one_input("process", move |init| {
            let store = init.operator_state_store();
            ProcessOp::new(init.uid.clone(), f.clone(), store)
        })
    }

    /// Partitions the stream by key: records with equal keys go to the same subtask, whose
    /// keyed state is scoped to that key.
    pub fn key_by<K: Key>(
        self,
        key_of: impl Fn(&T) -> K + Clone + Send + Sync + 'static,
    ) -> KeyedStream<K, T> {
        KeyedStream {
            stream: self,
            key_of: Arc::new(key_of),
        }
    }

    /// Merges streams of the same type.
    pub fn union(self, others: Vec<DataStream<T>>) -> DataStream<T> {
        let id = self.env.add_node::<T>(
            "union",
            link_fn::<T, T, IdentityOp>(|_| Ok(IdentityOp)),
            None,
        );
        self.env.add_edge(self.node, id, 0, self.partition.clone());
        for o in others {
            self.env.add_edge(o.node, id, 0, o.partition.clone());
        }
        DataStream::new(self.env.clone(), id).timed(self.timestamps.clone())
    }

    /// Connects with another stream for a two-input operator.
    pub fn connect<T2: Data>(self, other: DataStream<T2>) -> ConnectedStreams<T, T2> {
        ConnectedStreams {
            first: self,
            second: other,
        }
    }

    /// Writes the stream to a sink; returns the sink's (empty) output for setting uid and parallelism.
    pub fn sink(self, sink: impl Sink<T>) -> DataStream<()> {
        let stdout = sink.writes_to_stdout();
        let sink = Arc::new(sink);
        let s2 = sink.clone();
        let init: SinkInitFn = Arc::new(move |owner, restored| s2.initialize(owner, restored));
        let kind = link_fn::<T, (), SinkOp<T>>(move |init| {
            let writer = sink.create_writer(SinkContext {
                owner: SinkOwner {
                    job_id: init.job_id.clone(),
                    uid: init.uid.clone(),
                },
                subtask: init.subtask,
                parallelism: init.parallelism,
                checkpointing: init.checkpointing,
                restored: init.sink_restored.take(),
            })?;
            Ok(SinkOp::new(init.uid.clone(), writer))
        });
        let id = self.env.add_node::<()>("sink", kind, Some(init));
        self.env.graph.borrow_mut().nodes[id].stdout = stdout;
        self.env.add_edge(self.node, id, 0, self.partition.clone());
        DataStream::new(self.env.clone(), id)
    }
}

/// A stream partitioned by key.
pub struct KeyedStream<K, T> {
    stream: DataStream<T>,
    key_of: Arc<dyn Fn(&T) -> K + Send + Sync>,
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    fn hash_partition(&self) -> EdgePartition {
        let key_of = self.key_of.clone();
        let key_hash: Arc<dyn Fn(&T) -> u64 + Send + Sync> =
            Arc::new(move |t: &T| stable_hash(&key_of(t)));
        EdgePartition::Hash(Arc::new(key_hash))
    }

    /// Runs a keyed process function with keyed state.
    pub fn process<O: Data>(self, f: impl KeyedProcessFunction<K, T, O> + Sync) -> DataStream<O> {
        let env = self.stream.env.clone();
        let partition = self.hash_partition();
        let key_of = self.key_of.clone();
        let timestamps = self.stream.timestamps.clone();
        let kind = link_fn::<T, O, _>(move |init| {
            let key_of = key_of.clone();
            let ctx = init.keyed_context::<K>();
            let op = KeyedProcessOp::new(init.uid.clone(), move |t: &T| key_of(t), f.clone(), ctx)?;
            Ok(op.with_timestamps(timestamps.clone()))
        });
        let id = env.add_node::<O>("process", kind, None);
        env.add_edge(self.stream.node, id, 0, partition);
        DataStream::new(env, id)
    }

    /// Folds each key's records with `f`, emitting the running result for every record.
    pub fn reduce(self, f: impl Fn(&T, &T) -> T + Clone + Send + Sync + 'static) -> DataStream<T> {
        let s = self.process(ReduceFn {
            f: Arc::new(f),
            state: None,
        });
        s.name("reduce")
    }

    /// Sums the field `field` per key, emitting the running record (other fields from the first record).
    pub fn sum<N: AddAssign + Copy + 'static>(self, field: fn(&mut T) -> &mut N) -> DataStream<T> {
        self.reduce(move |acc, v| {
            let mut acc = acc.clone();
            let mut v = v.clone();
            let add = *field(&mut v);
            *field(&mut acc) += add;
            acc
        })
        .name("sum")
    }

    /// Connects with another stream keyed by the same key type.
    pub fn connect<T2: Data>(self, other: KeyedStream<K, T2>) -> KeyedConnectedStreams<K, T, T2> {
        KeyedConnectedStreams {
            first: self,
            second: other,
        }
    }
}

type ReduceFnArc<T> = Arc<dyn Fn(&T, &T) -> T + Send + Sync>;

struct ReduceFn<T> {
    f: ReduceFnArc<T>,
    state: Option<crate::state::ValueState<T>>,
}

impl<T> Clone for ReduceFn<T> {
    fn clone(&self) -> Self {
        ReduceFn {
            f: self.f.clone(),
            state: self.state.clone(),
        }
    }
}

impl<K: Key, T: Data> KeyedProcessFunction<K, T, T> for ReduceFn<T> {
    fn open(&mut self, ctx: &mut KeyedContext<K>) -> TaskResult {
        self.state = Some(ctx.value_state("reduce")?);
        Ok(())
    }
    fn process(
        &mut self,
        value: T,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<T>,
    ) -> TaskResult {
        let Some(state) = &self.state else {
            return Err(TaskError::msg("reduce state not opened"));
        };
        let next = match state.value(ctx)? {
            Some(acc) => (self.f)(acc, &value),
            None => value,
        };
        state.update(ctx, next.clone())?;
        out.collect(next);
        Ok(())
    }
}

/// Two streams connected for a two-input operator.
pub struct ConnectedStreams<T1, T2> {
    first: DataStream<T1>,
    second: DataStream<T2>,
}

impl<T1: Data, T2: Data> ConnectedStreams<T1, T2> {
    /// Runs a co-process function over both inputs.
    pub fn process<O: Data>(self, f: impl CoProcessFunction<T1, T2, O> + Sync) -> DataStream<O> {
        let env = self.first.env.clone();
        let body: TwoInputFn = Arc::new(move |_init, next| {
            let next = take_chain::<O>(next)?;
            Ok(Box::new(TwoInputBody::<T1, T2, O, _>::new(
                CoProcessOp(f.clone()),
                next,
            )) as Box<dyn TaskBody>)
        });
        let id = env.add_node::<O>("co_process", NodeKind::TwoInput { body }, None);
        env.add_edge(self.first.node, id, 0, self.first.partition.clone());
        env.add_edge(self.second.node, id, 1, self.second.partition.clone());
        DataStream::new(env, id)
    }
}

/// Two keyed streams connected for a keyed two-input operator.
pub struct KeyedConnectedStreams<K, T1, T2> {
    first: KeyedStream<K, T1>,
    second: KeyedStream<K, T2>,
}

impl<K: Key, T1: Data, T2: Data> KeyedConnectedStreams<K, T1, T2> {
    /// Runs a keyed co-process function with keyed state shared by both inputs.
    pub fn process<O: Data>(
        self,
        f: impl KeyedCoProcessFunction<K, T1, T2, O> + Sync,
    ) -> DataStream<O> {
        let env = self.first.stream.env.clone();
        let (p1, p2) = (self.first.hash_partition(), self.second.hash_partition());
        let (k1, k2) = (self.first.key_of.clone(), self.second.key_of.clone());
        let ts1 = self.first.stream.timestamps.clone();
        let ts2 = self.second.stream.timestamps.clone();
        let body: TwoInputFn = Arc::new(move |init, next| {
            let next = take_chain::<O>(next)?;
            let (k1, k2) = (k1.clone(), k2.clone());
            let ctx = init.keyed_context::<K>();
            let op = KeyedCoProcessOp::new(
                init.uid.clone(),
                move |t: &T1| k1(t),
                move |t: &T2| k2(t),
                f.clone(),
                ctx,
            )?
            .with_timestamps(ts1.clone(), ts2.clone());
            Ok(Box::new(TwoInputBody::<T1, T2, O, _>::new(op, next)) as Box<dyn TaskBody>)
        });
        let id = env.add_node::<O>("co_process", NodeKind::TwoInput { body }, None);
        env.add_edge(self.first.stream.node, id, 0, p1);
        env.add_edge(self.second.stream.node, id, 1, p2);
        DataStream::new(env, id)
    }
}

/// A keyed stream cut into windows (Flink's `WindowedStream`): set the trigger and the allowed
/// lateness, then evaluate the windows with `reduce`, `aggregate`, `process` or both.
pub struct WindowedStream<K, T> {
    keyed: KeyedStream<K, T>,
    spec: WindowSpec,
    /// `window_all`: one subtask evaluates every window.
    all: bool,
}

impl<K: Key, T: Data + Sync> KeyedStream<K, T> {
    /// Cuts each key's records into the windows of `assigner`.
    pub fn window(self, assigner: WindowAssigner) -> WindowedStream<K, T> {
        WindowedStream {
            keyed: self,
            spec: WindowSpec {
                assigner,
                trigger: Trigger::default_for_time(),
                allowed_lateness: 0,
            },
            all: false,
        }
    }
}

impl<T: Data + Sync> DataStream<T> {
    /// Cuts the whole (not keyed) stream into windows, evaluated by one subtask.
    pub fn window_all(self, assigner: WindowAssigner) -> WindowedStream<u8, T> {
        let mut w = self.key_by(|_: &T| 0u8).window(assigner);
        w.all = true;
        w
    }

    /// Assigns timestamps and makes watermarks from them here, in this operator's subtasks
    /// (prefer [`StreamEnv::source_with_watermarks`]: per split). Upstream watermarks are
    /// replaced, except the final one.
    pub fn assign_timestamps_and_watermarks(self, strategy: WatermarkStrategy<T>) -> DataStream<T> {
        let ts = Some(strategy.timestamp.clone());
        self.one_input("timestamps", move |init| {
            Ok(TimestampsAndWatermarksOp::new(
                strategy.clone(),
                init.watermark_interval,
            ))
        })
        .timed(ts)
    }
}

impl<K: Key, T: Data + Sync> WindowedStream<K, T> {
    /// Evaluates windows with `trigger` instead of the assigner's default.
    pub fn trigger(mut self, trigger: Trigger) -> Self {
        self.spec.trigger = trigger;
        self
    }

    /// Keeps windows for `lateness` after their end: a late record updates its window and
    /// fires it again (event time only).
    pub fn allowed_lateness(mut self, lateness: std::time::Duration) -> Self {
        self.spec.allowed_lateness = i64::try_from(lateness.as_millis()).unwrap_or(i64::MAX);
        self
    }

    /// Folds each window's records with `f`.
    pub fn reduce(self, f: impl Fn(&T, &T) -> T + Send + Sync + 'static) -> DataStream<T> {
        self.aggregate(Reduce::new(f))
    }

    /// Aggregates each window's records incrementally.
    pub fn aggregate<R: Data, A: AggregateFunction<T, R>>(self, agg: A) -> DataStream<R> {
        self.aggregate_process(agg, |_: &K, _: TimeWindow, r: R, out: &mut Collector<R>| {
            out.collect(r)
        })
    }

    /// Evaluates each window with all its records.
    pub fn process<O: Data, P: ProcessWindowFunction<K, Vec<T>, O>>(self, f: P) -> DataStream<O> {
        self.aggregate_process(CollectAll::<T>::default(), f)
    }

    /// Aggregates incrementally, then evaluates the aggregate with the window's key and bounds.
    pub fn aggregate_process<R, O, A, P>(self, agg: A, f: P) -> DataStream<O>
    where
        R: 'static,
        O: Data,
        A: AggregateFunction<T, R>,
        P: ProcessWindowFunction<K, R, O>,
    {
        self.operator::<R, O, A, P, ResultsOnly>(agg, f)
    }

    /// [`WindowedStream::aggregate_process`], keeping the records that came too late for
    /// their windows (Flink's `sideOutputLateData`): set the window operator's uid on the
    /// stream this returns, then [`DataStream::split_late`] it into results and late records.
    pub fn aggregate_process_with_late<R, O, A, P>(
        self,
        agg: A,
        f: P,
    ) -> DataStream<WindowOutput<O, T>>
    where
        R: 'static,
        O: Data,
        A: AggregateFunction<T, R>,
        P: ProcessWindowFunction<K, R, O>,
    {
        self.operator::<R, O, A, P, WithLate>(agg, f)
    }

    fn operator<R, O, A, P, E>(self, agg: A, f: P) -> DataStream<E::Out>
    where
        R: 'static,
        O: Data,
        A: AggregateFunction<T, R>,
        P: ProcessWindowFunction<K, R, O>,
        E: Emit<O, T>,
        E::Out: Data,
    {
        if let Err(e) = self.spec.assigner.validate() {
            self.keyed.stream.env.graph.borrow_mut().errors.push(e);
        }
        let all = self.all;
        let s = self
            .keyed
            .process(WindowFunction::<K, T, R, O, A, P, E>::new(
                self.spec, agg, f,
            ))
            .name("window");
        if all {
            s.parallelism(1)
        } else {
            s
        }
    }
}

impl<K: Key, T1: Data + Sync> KeyedStream<K, T1> {
    /// The interval join with `other` (Flink's `intervalJoin(...).between(lower, upper)`): `f`
    /// sees every pair of records of the same key with
    /// `left.ts + lower_ms <= right.ts <= left.ts + upper_ms`, once.
    pub fn interval_join<T2: Data + Sync, O: Data>(
        self,
        other: KeyedStream<K, T2>,
        lower_ms: i64,
        upper_ms: i64,
        f: impl Fn(&T1, &T2, &mut Collector<O>) + Send + Sync + 'static,
    ) -> DataStream<O> {
        let env = self.stream.env.clone();
        match IntervalJoin::new(lower_ms, upper_ms, Arc::new(f)) {
            Ok(join) => self.connect(other).process(join).name("interval-join"),
            Err(e) => {
                env.graph.borrow_mut().errors.push(e);
                DataStream::new(env.clone(), 0)
            }
        }
    }

    /// The window co-group with `other` on tumbling or sliding event-time windows: `f` sees,
    /// per key and window, the records of both sides.
    pub fn window_co_group<T2: Data + Sync, O: Data>(
        self,
        other: KeyedStream<K, T2>,
        assigner: WindowAssigner,
        f: impl Fn(&K, TimeWindow, &[T1], &[T2], &mut Collector<O>) + Send + Sync + 'static,
    ) -> DataStream<O> {
        let env = self.stream.env.clone();
        match WindowCoGroup::new(assigner, Arc::new(f)) {
            Ok(cg) => self.connect(other).process(cg).name("window-co-group"),
            Err(e) => {
                env.graph.borrow_mut().errors.push(e);
                DataStream::new(env.clone(), 0)
            }
        }
    }

    /// The window join with `other`: `f` sees every pair of records of the same key and window.
    pub fn window_join<T2: Data + Sync, O: Data>(
        self,
        other: KeyedStream<K, T2>,
        assigner: WindowAssigner,
        f: impl Fn(&T1, &T2, &mut Collector<O>) + Send + Sync + 'static,
    ) -> DataStream<O> {
        self.window_co_group(
            other,
            assigner,
            move |_: &K, _: TimeWindow, ls: &[T1], rs: &[T2], out: &mut Collector<O>| {
                for l in ls {
                    for r in rs {
                        f(l, r, out);
                    }
                }
            },
        )
        .name("window-join")
    }
}

impl<O: Data, T: Data> DataStream<WindowOutput<O, T>> {
    /// The results and the late records of a window operator.
    pub fn split_late(self) -> (DataStream<O>, DataStream<T>) {
        let results = self
            .one_input("window-results", |_| {
                Ok(FlatMapOp(|r: WindowOutput<O, T>, c: &mut Collector<O>| {
                    if let WindowOutput::Result(o) = r {
                        c.collect(o);
                    }
                }))
            })
            .name("window-results");
        let late = self
            .one_input("late-data", |_| {
                Ok(FlatMapOp(|r: WindowOutput<O, T>, c: &mut Collector<T>| {
                    if let WindowOutput::Late(t) = r {
                        c.collect(t);
                    }
                }))
            })
            .name("late-data");
        (results, late)
    }
}

/// `assign_timestamps_and_watermarks` on a stream: makes watermarks from its records'
/// timestamps, periodically (a processing-time timer of the operator).
struct TimestampsAndWatermarksOp<T> {
    strategy: WatermarkStrategy<T>,
    watermarks: SourceWatermarks,
    interval_ms: i64,
    next_emit: i64,
}

impl<T> TimestampsAndWatermarksOp<T> {
    fn new(strategy: WatermarkStrategy<T>, interval: std::time::Duration) -> Self {
        let watermarks = SourceWatermarks::new(
            strategy.generator,
            strategy.idleness,
            std::time::Duration::ZERO,
            1,
            crate::runtime::watermark::WATERMARK_MIN,
            std::time::Instant::now(),
        );
        TimestampsAndWatermarksOp {
            strategy,
            watermarks,
            interval_ms: i64::try_from(interval.as_millis()).unwrap_or(i64::MAX),
            next_emit: 0,
        }
    }
}

impl<T: Send + 'static> Operator<T, T> for TimestampsAndWatermarksOp<T> {
    fn process(&mut self, input: &mut Vec<T>, out: &mut Vec<T>) -> TaskResult {
        if !input.is_empty() {
            for r in input.iter() {
                self.watermarks.on_record(0, (self.strategy.timestamp)(r));
            }
            self.watermarks.on_batch(0, std::time::Instant::now());
        }
        out.append(input);
        Ok(())
    }
    fn on_watermark(&mut self, watermark: i64, _out: &mut Vec<T>) -> TaskResult<Option<i64>> {
        // Only the end of the input passes; the rest is this operator's to make.
        Ok((watermark == crate::runtime::watermark::WATERMARK_MAX).then_some(watermark))
    }
    fn next_processing_timer(&self) -> Option<i64> {
        (self.interval_ms > 0).then_some(self.next_emit)
    }
    fn on_processing_time(&mut self, now_ms: i64, _out: &mut Vec<T>) -> TaskResult<Option<i64>> {
        self.next_emit = now_ms.saturating_add(self.interval_ms);
        Ok(match self.watermarks.emit(std::time::Instant::now()) {
            Some(crate::runtime::watermark::WatermarkOutput::Watermark(w)) => Some(w),
            _ => None,
        })
    }
}
