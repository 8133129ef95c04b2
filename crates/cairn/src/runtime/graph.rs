//! The job graph: operators (nodes) with uids and parallelism, and the edges between them, as
//! the DataStream API builds it and the job master plans and deploys it. Nodes carry type-erased
//! factories that build the typed chain links of a subtask at deployment.

use std::any::Any;
use std::sync::Arc;

use super::chain::TaskBody;
use super::channel::ChannelSender;
use super::operators::SinkOwner;
use crate::error::{TaskError, TaskResult};
use crate::state::{Key, KeyedContext, OperatorStateStore, RestoredState, RocksDbSettings};

/// What one subtask of an operator is built with.
pub struct SubtaskInit {
    /// Job id.
    pub job_id: String,
    /// Operator uid.
    pub uid: String,
    /// Subtask index.
    pub subtask: u32,
    /// Operator parallelism.
    pub parallelism: u32,
    /// Number of key groups.
    pub max_parallelism: u32,
    /// Whether checkpointing is on.
    pub checkpointing: bool,
    /// How often a source emits its watermark (`pipeline.auto-watermark-interval`).
    pub watermark_interval: std::time::Duration,
    /// The operator's state from the restored checkpoint (empty on a fresh start).
    pub restored: RestoredState,
    /// Keyed state lives in RocksDB (`state.backend.type: rocksdb`); None: on the heap.
    pub rocksdb: Option<RocksDbSettings>,
    /// Heap backend: copy-on-write snapshots (`state.backend.heap.copy-on-write`).
    pub heap_copy_on_write: bool,
    /// A sink's pending state of every subtask in the restored checkpoint, as its
    /// `initialize` got it; None on a fresh start, and for operators that are not sinks.
    pub sink_restored: Option<Vec<Vec<u8>>>,
}

impl SubtaskInit {
    /// The keyed state backend of this subtask, with its restored key groups. A backend that
    /// cannot be opened (or restored disk state on the heap backend) fails the operator's
    /// [`KeyedContext::check_restored`].
    pub fn keyed_context<K: Key>(&mut self) -> KeyedContext<K> {
        let keyed = std::mem::take(&mut self.restored.keyed);
        let disk = std::mem::take(&mut self.restored.disk);
        let (subtask, p, mp) = (self.subtask, self.parallelism, self.max_parallelism);
        let settings = match &self.rocksdb {
            None if disk.is_empty() => {
                return KeyedContext::new(subtask, p, mp, keyed)
                    .with_copy_on_write(self.heap_copy_on_write)
            }
            None => Err(TaskError::Unrecoverable(format!(
                "the keyed state of operator '{}' was checkpointed by the rocksdb state backend; restore it with state.backend.type: rocksdb, or move it to another backend with a savepoint",
                self.uid
            ))),
            // Restored files are downloaded from the storage the checkpoint was loaded from.
            Some(s) => match &self.restored.disk_root {
                None => Ok(s.clone()),
                Some(root) => crate::storage::FsStorage::open(root)
                    .map(|fs| RocksDbSettings {
                        storage: Arc::new(fs),
                        ..s.clone()
                    })
                    .map_err(|e| TaskError::msg(e.to_string())),
            },
        };
        match settings {
            Ok(s) => KeyedContext::on_disk(&self.uid, subtask, p, mp, keyed, disk, &s),
            Err(e) => KeyedContext::new(subtask, p, mp, keyed).failed(e),
        }
    }

    /// The operator state of this subtask, with the lists restored for it.
    pub fn operator_state_store(&mut self) -> OperatorStateStore {
        OperatorStateStore::new(
            self.subtask,
            self.parallelism,
            std::mem::take(&mut self.restored.operator),
        )
    }
}

/// How an edge spreads records over the downstream subtasks.
#[derive(Clone)]
pub enum EdgePartition {
    /// Forward when the parallelism is equal, rebalance otherwise (Flink's default).
    Default,
    /// Round robin.
    Rebalance,
    /// Every record to every subtask.
    Broadcast,
    /// By key group; holds an `Arc<dyn Fn(&T) -> u64>` of the upstream record type.
    Hash(Arc<dyn Any + Send + Sync>),
}

impl EdgePartition {
    /// A short name for plans and logs.
    pub fn name(&self) -> &'static str {
        match self {
            EdgePartition::Default => "forward",
            EdgePartition::Rebalance => "rebalance",
            EdgePartition::Broadcast => "broadcast",
            EdgePartition::Hash(_) => "hash",
        }
    }
}

/// An edge of the job graph.
#[derive(Clone)]
pub struct EdgeSpec {
    /// Upstream node.
    pub from: usize,
    /// Downstream node.
    pub to: usize,
    /// Input port of the downstream node (0, or 1 for the second input of a two-input node).
    pub port: usize,
    /// Partitioning.
    pub partition: EdgePartition,
}

/// The outgoing channels of one edge for one subtask, resolved at deployment.
pub struct EdgeOutput {
    /// How to partition.
    pub partition: EdgePartition,
    /// Whether the edge is point-to-point (forward).
    pub forward: bool,
    /// One sender per reachable downstream subtask.
    pub senders: Vec<ChannelSender>,
    /// Number of key groups.
    pub max_parallelism: u32,
}

/// A type-erased chain or chain end.
pub type AnyBox = Box<dyn Any>;
/// A node factory.
pub type SplitsFn = Arc<dyn Fn(u32) -> TaskResult<Vec<Vec<u8>>> + Send + Sync>;
/// A node factory.
pub type SourceFn = Arc<
    dyn Fn(&mut SubtaskInit, Vec<Vec<u8>>, AnyBox) -> TaskResult<Box<dyn TaskBody>> + Send + Sync,
>;
/// A node factory.
pub type LinkFn = Arc<dyn Fn(&mut SubtaskInit, AnyBox) -> TaskResult<AnyBox> + Send + Sync>;
/// A node factory.
pub type HeadFn = Arc<dyn Fn(AnyBox) -> TaskResult<Box<dyn TaskBody>> + Send + Sync>;
/// A node factory.
pub type TwoInputFn =
    Arc<dyn Fn(&mut SubtaskInit, AnyBox) -> TaskResult<Box<dyn TaskBody>> + Send + Sync>;
/// A node factory.
pub type WriterFn = Arc<dyn Fn(Vec<EdgeOutput>) -> TaskResult<AnyBox> + Send + Sync>;
/// A node factory.
pub type SinkInitFn = Arc<dyn Fn(&SinkOwner, Option<Vec<Vec<u8>>>) -> TaskResult + Send + Sync>;

/// How a node's subtasks are built.
#[derive(Clone)]
pub enum NodeKind {
    /// A source.
    Source {
        /// Initial splits of a fresh start.
        splits: SplitsFn,
        /// Builds the source task body in front of the rest of the chain.
        body: SourceFn,
    },
    /// A one-input operator (also sinks and union heads).
    OneInput {
        /// Builds `Link<I, O>` in front of a `Box<dyn Chain<O>>`, returning a `Box<dyn Chain<I>>`.
        link: LinkFn,
        /// Wraps a `Box<dyn Chain<I>>` into the task body, when this node heads a task.
        head: HeadFn,
    },
    /// A two-input operator (always heads its task).
    TwoInput {
        /// Builds the task body in front of a `Box<dyn Chain<O>>`.
        body: TwoInputFn,
    },
}

/// A node of the job graph: one operator.
#[derive(Clone)]
pub struct NodeSpec {
    /// Index in the graph.
    pub id: usize,
    /// Stable uid: state is matched to operators by it.
    pub uid: String,
    /// Display name.
    pub name: String,
    /// Parallelism, if set on the operator.
    pub parallelism: Option<u32>,
    /// How to build it.
    pub kind: NodeKind,
    /// Builds the chain end for the node's output type: a record writer, or a null chain.
    pub writer: WriterFn,
    /// For sinks: the once-per-attempt commit of restored transactions.
    pub sink_init: Option<SinkInitFn>,
    /// A sink that writes to its process's standard output (`PrintSink`).
    pub stdout: bool,
}

/// A validated job graph, ready to run.
#[derive(Clone)]
pub struct JobGraph {
    name: String,
    nodes: Vec<NodeSpec>,
    edges: Vec<EdgeSpec>,
}

impl JobGraph {
    /// A graph of `nodes` and `edges` (built by the DataStream API).
    pub fn new(name: String, nodes: Vec<NodeSpec>, edges: Vec<EdgeSpec>) -> Self {
        JobGraph { name, nodes, edges }
    }
    /// The job's name.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The operators.
    pub fn nodes(&self) -> &[NodeSpec] {
        &self.nodes
    }
    /// The edges.
    pub fn edges(&self) -> &[EdgeSpec] {
        &self.edges
    }
    /// The uids of the sinks that write to their process's standard output (`PrintSink`):
    /// embedded, the terminal of `run`; on a cluster, the stdout of whichever worker runs
    /// them, which nobody reads.
    pub fn stdout_sinks(&self) -> Vec<String> {
        self.nodes
            .iter()
            .filter(|n| n.stdout)
            .map(|n| n.uid.clone())
            .collect()
    }
}
