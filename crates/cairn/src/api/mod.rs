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
    Chain, EdgeWriter, Link, NullChain, OneInputBody, Operator, Partitioner, RecordWriter, Source,
    SourceBody, TaskBody, TwoInputBody,
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
use crate::state::keygroup::stable_hash;
use crate::state::{Key, KeyedContext};

/// A record type: cloneable (broadcast, several consumers), sendable between threads and
/// serializable (between processes).
pub trait Data: Clone + Send + Serialize + DeserializeOwned + 'static {}
impl<T: Clone + Send + Serialize + DeserializeOwned + 'static> Data for T {}

#[derive(Default)]
struct GraphBuilder {
    nodes: Vec<NodeSpec>,
    edges: Vec<EdgeSpec>,
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
        let source = Arc::new(source);
        let s1 = source.clone();
        let splits: SplitsFn = Arc::new(move |p| s1.create_splits(p));
        let body: SourceFn = Arc::new(move |init, splits, next| {
            let next = take_chain::<T>(next)?;
            let reader = source.create_reader(init.subtask, splits)?;
            Ok(Box::new(SourceBody::new(init.uid.clone(), reader, next)) as Box<dyn TaskBody>)
        });
        let id = self.add_node::<T>("source", NodeKind::Source { splits, body }, None);
        DataStream::new(self.clone(), id)
    }

    /// Validates the graph: unique uids, no empty graph.
    pub fn build(&self, name: &str) -> Result<JobGraph, String> {
        let g = self.graph.borrow();
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
    _t: PhantomData<fn() -> T>,
}

impl<T: Data> DataStream<T> {
    fn new(env: StreamEnv, node: usize) -> Self {
        DataStream {
            env,
            node,
            partition: EdgePartition::Default,
            _t: PhantomData,
        }
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
        self.one_input("filter", move |_| Ok(FilterOp(f.clone())))
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
        DataStream::new(self.env.clone(), id)
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
            })?;
            Ok(SinkOp::new(init.uid.clone(), writer))
        });
        let id = self.env.add_node::<()>("sink", kind, Some(init));
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
        let kind = link_fn::<T, O, _>(move |init| {
            let key_of = key_of.clone();
            let ctx = init.keyed_context::<K>();
            KeyedProcessOp::new(init.uid.clone(), move |t: &T| key_of(t), f.clone(), ctx)
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
            )?;
            Ok(Box::new(TwoInputBody::<T1, T2, O, _>::new(op, next)) as Box<dyn TaskBody>)
        });
        let id = env.add_node::<O>("co_process", NodeKind::TwoInput { body }, None);
        env.add_edge(self.first.stream.node, id, 0, p1);
        env.add_edge(self.second.stream.node, id, 1, p2);
        DataStream::new(env, id)
    }
}
