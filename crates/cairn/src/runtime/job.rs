//! The job master of embedded mode: turns a job graph into chained tasks, deploys them as
//! threads, runs the checkpoint coordinator, and on a failure cancels every task and restores
//! all of them from the latest completed checkpoint as the restart strategy allows.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use tracing::{info, warn};

use super::channel::{
    BarrierKind, ChannelSender, Credit, CreditReturn, Mail, MailboxHandle, CHANNEL_CREDITS_MAX,
};
use super::gate::{AlignmentMode, InputGate};
use super::inject::FailureInjector;
use super::operators::SINK_PENDING_STATE;
use super::restart::RestartTracker;
use super::status::{JobState, JobStatus};
use super::task::{run_uploader, JobEvent, JobMetrics, TaskRuntime, UploadJob};
use crate::api::{EdgeOutput, EdgePartition, JobGraph, NodeKind, SubtaskInit};
use crate::checkpoint::coordinator::{CheckpointSettings, CompletedCheckpoint, TaskInfo};
use crate::checkpoint::{
    find_latest, load_checkpoint, load_from_path, CheckpointCoordinator, LoadedCheckpoint,
};
use crate::config::{CheckpointingMode, FailoverStrategy, JobConfig, StateBackendKind};
use crate::error::TaskError;
use crate::runtime::chain::{TaskBody, SOURCE_SPLITS_STATE};
use crate::state::ChannelStateData;
use crate::storage::{CheckpointStorage, FsStorage, MemoryStorage};

/// Where a run starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RestoreFrom {
    /// The newest usable checkpoint under the checkpoint directory (fresh if there is none).
    Latest,
    /// A checkpoint directory (`.../<job-id>/chk-<n>`) or its `_metadata`.
    Path(PathBuf),
}

/// Planned failures.
#[derive(Debug, Clone, Copy, serde::Serialize, serde::Deserialize)]
pub struct InjectSpec {
    /// Number of failures.
    pub count: usize,
    /// Seed choosing tasks and records.
    pub seed: u64,
    /// Records each task vertex is expected to see (bounds the chosen record numbers).
    pub expected_records: u64,
}

/// Fail only tasks whose head operator uid starts with this (None: any task).
#[derive(Debug, Clone, Default)]
pub struct InjectTarget(pub Option<String>);

/// A callback receiving progress.
pub type ProgressFn = Arc<dyn Fn(&Progress) + Send + Sync>;

/// How to run a job.
#[derive(Clone, Default)]
pub struct RunOptions {
    /// Configuration.
    pub config: JobConfig,
    /// Start from a checkpoint.
    pub restore: Option<RestoreFrom>,
    /// Failures to inject.
    pub inject: Option<InjectSpec>,
    /// Which tasks failures are injected into.
    pub inject_target: InjectTarget,
    /// Called about once a second with the progress so far.
    pub on_progress: Option<ProgressFn>,
    /// Shared counters (created if None).
    pub metrics: Option<Arc<JobMetrics>>,
    /// Shared live status (created if None); observers read it and may request a cancel.
    pub status: Option<Arc<JobStatus>>,
    /// The job id to use (a new random one if None; a restored checkpoint's when claimed).
    pub job_id: Option<String>,
}

/// Progress of a running job.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    /// Time since the start.
    pub elapsed: Duration,
    /// Records read by sources, replays included.
    pub records: u64,
    /// Checkpoints completed.
    pub checkpoints: usize,
    /// The last completed checkpoint.
    pub last_checkpoint: Option<(u64, u64, u64)>,
    /// Restarts so far.
    pub restarts: u32,
}

/// How a run ended.
#[derive(Debug, Clone)]
pub struct JobSummary {
    /// Job id (the checkpoint directory name).
    pub job_id: String,
    /// Job name.
    pub job_name: String,
    /// Wall time.
    pub elapsed: Duration,
    /// Records read by sources, replays included.
    pub records: u64,
    /// Completed checkpoints.
    pub checkpoints: Vec<CompletedCheckpoint>,
    /// Failed checkpoints.
    pub failed_checkpoints: u64,
    /// Restarts after failures.
    pub restarts: u32,
    /// Failures injected (fired, planned).
    pub injected: Option<(usize, usize)>,
    /// The checkpoint the run started from, if any (location).
    pub restored_from: Option<String>,
    /// `--from latest` found nothing to restore.
    pub started_fresh: bool,
}

/// Why a job did not finish.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// The job cannot start (bad graph, bad configuration, unusable input).
    #[error("{0}")]
    Setup(String),
    /// No usable checkpoint to restore from.
    #[error("{0}")]
    Restore(String),
    /// The job was cancelled.
    #[error("job cancelled")]
    Canceled,
    /// The job failed and the restart strategy gave up.
    #[error("job failed after {restarts} restart(s): {cause} ({reason})")]
    Failed {
        /// Restarts done.
        restarts: u32,
        /// The last failure.
        cause: String,
        /// Why no further restart.
        reason: String,
    },
}

struct Vertex {
    nodes: Vec<usize>,
    parallelism: u32,
    name: String,
    is_source: bool,
}

/// The job graph cut into chained task vertices; computed the same way in every process.
pub struct Plan {
    vertices: Vec<Vertex>,
    node_vertex: Vec<usize>,
    offsets: Vec<usize>,
    total: usize,
    node_parallelism: Vec<u32>,
    max_parallelism: u32,
}

impl Plan {
    /// Number of subtasks of the job.
    pub fn total_tasks(&self) -> usize {
        self.total
    }

    /// The largest vertex parallelism: the slots a job needs (one slot holds one subtask of
    /// every vertex, as Flink's slot sharing).
    pub fn slots_needed(&self) -> u32 {
        self.vertices
            .iter()
            .map(|v| v.parallelism)
            .max()
            .unwrap_or(1)
    }

    /// Pipelined regions: sets of global task indices connected by channels. A failure needs
    /// to restart only its region when the failover strategy is `region`.
    pub fn regions(&self, graph: &JobGraph) -> Vec<Vec<usize>> {
        let n = self.vertices.len();
        let mut parent: Vec<usize> = (0..n).collect();
        fn find(p: &mut [usize], x: usize) -> usize {
            let mut r = x;
            while p[r] != r {
                r = p[r];
            }
            p[x] = r;
            r
        }
        for e in graph.edges() {
            let (a, b) = (self.node_vertex[e.from], self.node_vertex[e.to]);
            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
            if ra != rb {
                parent[ra] = rb;
            }
        }
        let mut by_root: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (vi, v) in self.vertices.iter().enumerate() {
            let root = find(&mut parent, vi);
            let tasks = by_root.entry(root).or_default();
            tasks.extend(self.offsets[vi]..self.offsets[vi] + v.parallelism as usize);
        }
        by_root.into_values().collect()
    }

    /// Task vertices whose head operator uid starts with `prefix` (all if None).
    pub fn vertices_with_head_prefix(&self, graph: &JobGraph, prefix: Option<&str>) -> Vec<usize> {
        self.vertices
            .iter()
            .enumerate()
            .filter(|(_, v)| prefix.is_none_or(|p| graph.nodes()[v.nodes[0]].uid.starts_with(p)))
            .map(|(i, _)| i)
            .collect()
    }

    /// (vertex, subtask index) of global task `task`.
    pub fn task(&self, task: usize) -> Option<(usize, u32)> {
        let vi = self.offsets.iter().rposition(|&o| o <= task)?;
        Some((vi, (task - self.offsets[vi]) as u32))
    }

    /// Task infos (without mailboxes) for every subtask, in global order.
    pub fn task_descriptions(&self, graph: &JobGraph) -> Vec<TaskDescription> {
        let mut out = Vec::with_capacity(self.total);
        for v in &self.vertices {
            for i in 0..v.parallelism {
                out.push(TaskDescription {
                    name: v.name.clone(),
                    subtask: i,
                    is_source: v.is_source,
                    operators: v
                        .nodes
                        .iter()
                        .map(|&x| (graph.nodes()[x].uid.clone(), self.node_parallelism[x]))
                        .collect(),
                });
            }
        }
        out
    }
}

/// One subtask as the job master describes it.
#[derive(Debug, Clone)]
pub struct TaskDescription {
    /// Task (chain) name.
    pub name: String,
    /// Subtask index.
    pub subtask: u32,
    /// Whether it is a source.
    pub is_source: bool,
    /// Operators of its chain: (uid, parallelism).
    pub operators: Vec<(String, u32)>,
}

/// Where the subtasks of an attempt run, seen from one process.
pub struct Placement {
    /// Per global task index: whether this process runs it.
    pub hosted: Vec<bool>,
    /// Channels to and from subtasks in other processes (None: everything is local).
    pub links: Option<Arc<dyn DataLinks>>,
}

impl Placement {
    /// Everything in this process.
    pub fn local(total: usize) -> Self {
        Placement {
            hosted: vec![true; total],
            links: None,
        }
    }
}

/// The network side of channels between processes.
pub trait DataLinks: Send + Sync {
    /// A sender into input channel `channel` of remote task `task`; the link releases `credit`
    /// when the receiver returns credits.
    fn channel_to(
        &self,
        task: usize,
        channel: usize,
        credit: Arc<Credit>,
    ) -> Result<ChannelSender, TaskError>;
    /// Where frames for local task `task` go.
    fn register_receiver(&self, task: usize, mailbox: Sender<Mail>, priority: Sender<Mail>);
    /// The credit return of input channel `channel` of local task `task`, fed from another process.
    fn credit_return(&self, task: usize, channel: usize) -> Arc<dyn CreditReturn>;
}

/// Plans the job graph into chained task vertices.
pub fn plan(graph: &JobGraph, config: &JobConfig) -> Result<Plan, JobError> {
    let n = graph.nodes().len();
    let maxp = config.max_parallelism;
    let node_parallelism: Vec<u32> = graph
        .nodes()
        .iter()
        .map(|node| node.parallelism.unwrap_or(config.parallelism))
        .collect();
    for (node, &p) in graph.nodes().iter().zip(&node_parallelism) {
        if p > maxp {
            return Err(JobError::Setup(format!(
                "operator '{}' has parallelism {p}, above max parallelism {maxp} (pipeline.max-parallelism)",
                node.uid
            )));
        }
    }
    let ins = |id: usize| graph.edges().iter().filter(move |e| e.to == id);
    let outs = |id: usize| graph.edges().iter().filter(move |e| e.from == id);
    // Node `id` joins its upstream's chain when the edge is point-to-point.
    let chained_to = |id: usize| -> Option<usize> {
        if !matches!(graph.nodes()[id].kind, NodeKind::OneInput { .. }) {
            return None;
        }
        let mut it = ins(id);
        let e = it.next()?;
        if it.next().is_some() || outs(e.from).count() != 1 {
            return None;
        }
        let (pu, pd) = (node_parallelism[e.from], node_parallelism[id]);
        let point_to_point = match e.partition {
            EdgePartition::Default => pu == pd,
            _ => pu == 1 && pd == 1,
        };
        point_to_point.then_some(e.from)
    };
    let mut node_vertex = vec![usize::MAX; n];
    let mut vertices: Vec<Vertex> = Vec::new();
    #[allow(clippy::needless_range_loop)]
    for id in 0..n {
        if chained_to(id).is_some() {
            continue;
        }
        let v = vertices.len();
        let mut nodes = vec![id];
        let mut cur = id;
        while let Some(next) = (0..n).find(|&d| chained_to(d) == Some(cur)) {
            nodes.push(next);
            cur = next;
        }
        for &x in &nodes {
            node_vertex[x] = v;
        }
        let name = nodes
            .iter()
            .map(|&x| graph.nodes()[x].name.as_str())
            .collect::<Vec<_>>()
            .join(" -> ");
        vertices.push(Vertex {
            parallelism: node_parallelism[id],
            is_source: matches!(graph.nodes()[id].kind, NodeKind::Source { .. }),
            nodes,
            name,
        });
    }
    if node_vertex.contains(&usize::MAX) {
        return Err(JobError::Setup("the job graph has a cycle".into()));
    }
    let mut offsets = Vec::with_capacity(vertices.len());
    let mut total = 0usize;
    for v in &vertices {
        offsets.push(total);
        total += v.parallelism as usize;
    }
    Ok(Plan {
        vertices,
        node_vertex,
        offsets,
        total,
        node_parallelism,
        max_parallelism: maxp,
    })
}

/// The subtasks of one attempt running in this process.
pub struct Deployment {
    handles: Vec<JoinHandle<()>>,
    mailboxes: Vec<MailboxHandle>,
    credits: Vec<Arc<Credit>>,
    uploaders: Vec<JoinHandle<()>>,
    infos: Vec<TaskInfo>,
}

/// A running attempt, as the job master sees it.
pub trait Deployed: Send {
    /// Every subtask, in global order.
    fn infos(&self) -> &[TaskInfo];
    /// Stops every subtask and waits until they stopped.
    fn cancel(self: Box<Self>);
    /// Waits for subtasks that are finishing on their own.
    fn join(self: Box<Self>);
}

/// Runs the subtasks of attempts: in this process, or on workers.
pub trait Executor: Send {
    /// Deploys every subtask of an attempt.
    fn deploy(&mut self, req: &DeployRequest<'_>) -> Result<Box<dyn Deployed>, TaskError>;
}

/// Runs every subtask in this process (embedded mode).
pub struct LocalExecutor;

impl Executor for LocalExecutor {
    fn deploy(&mut self, req: &DeployRequest<'_>) -> Result<Box<dyn Deployed>, TaskError> {
        let placement = Placement {
            hosted: req
                .tasks
                .map_or_else(|| vec![true; req.plan.total], |t| t.to_vec()),
            links: None,
        };
        Ok(Box::new(deploy(req, &placement)?))
    }
}

impl Deployed for Deployment {
    fn infos(&self) -> &[TaskInfo] {
        &self.infos
    }
    fn cancel(self: Box<Self>) {
        Deployment::cancel(*self)
    }
    fn join(self: Box<Self>) {
        Deployment::join(*self)
    }
}

impl Deployment {
    /// Stops every subtask and waits for their threads.
    pub fn cancel(self) {
        for m in &self.mailboxes {
            let _ = m.send(Mail::Cancel);
        }
        for c in &self.credits {
            c.close();
        }
        self.join();
    }

    /// Waits for every subtask thread.
    pub fn join(self) {
        for h in self.handles {
            let _ = h.join();
        }
        drop(self.mailboxes);
        for u in self.uploaders {
            let _ = u.join();
        }
    }
}

/// A built subtask: (global index, vertex, body, subtask index, in-flight data to replay).
type BuiltTask = (
    usize,
    usize,
    Box<dyn TaskBody>,
    u32,
    Option<ChannelStateData>,
);

/// Everything needed to deploy an attempt.
pub struct DeployRequest<'a> {
    /// The job graph.
    pub graph: &'a JobGraph,
    /// Its plan.
    pub plan: &'a Plan,
    /// Configuration.
    pub config: &'a JobConfig,
    /// The checkpoint to restore.
    pub restored: Option<&'a LoadedCheckpoint>,
    /// Attempt number.
    pub attempt: u32,
    /// Where subtasks report.
    pub events: &'a Sender<JobEvent>,
    /// Checkpoint storage.
    pub storage: &'a Arc<dyn CheckpointStorage>,
    /// Job id.
    pub job_id: &'a str,
    /// Planned failures.
    pub injector: &'a Option<Arc<FailureInjector>>,
    /// Shared counters.
    pub metrics: &'a Arc<JobMetrics>,
    /// The subtasks to deploy (a pipelined region), by global index; None: all.
    pub tasks: Option<&'a [bool]>,
}

/// Builds and starts the subtasks `placement` puts in this process.
pub fn deploy(cx: &DeployRequest<'_>, placement: &Placement) -> Result<Deployment, TaskError> {
    let graph = cx.graph;
    let plan = cx.plan;
    let checkpointing = cx.config.checkpointing_enabled();
    let offsets = &plan.offsets;
    let total = plan.total;
    let hosted = &placement.hosted;
    let mut mail_tx: Vec<Option<Sender<Mail>>> = vec![None; total];
    let mut mail_rx: Vec<Option<Receiver<Mail>>> = (0..total).map(|_| None).collect();
    let mut prio_tx: Vec<Option<Sender<Mail>>> = vec![None; total];
    let mut prio_rx: Vec<Option<Receiver<Mail>>> = (0..total).map(|_| None).collect();
    for task in 0..total {
        if !hosted[task] {
            continue;
        }
        let (tx, rx) = crossbeam_channel::unbounded::<Mail>();
        let (ptx, prx) = crossbeam_channel::unbounded::<Mail>();
        if let Some(links) = &placement.links {
            links.register_receiver(task, tx.clone(), ptx.clone());
        }
        mail_tx[task] = Some(tx);
        mail_rx[task] = Some(rx);
        prio_tx[task] = Some(ptx);
        prio_rx[task] = Some(prx);
    }
    // Channels: per downstream task, its input channels; per edge and upstream subtask, senders.
    // Channel numbering is the same in every process, so both ends agree without talking.
    let mut channel_ports: Vec<Vec<usize>> = vec![Vec::new(); total];
    let mut channel_credits: Vec<Vec<Arc<dyn CreditReturn>>> = vec![Vec::new(); total];
    let mut edge_senders: Vec<Vec<Vec<ChannelSender>>> = graph
        .edges()
        .iter()
        .map(|e| vec![Vec::new(); plan.node_parallelism[e.from] as usize])
        .collect();
    let mut edge_forward = vec![false; graph.edges().len()];
    let mut all_credits = Vec::new();
    for (vi, v) in plan.vertices.iter().enumerate() {
        let head = v.nodes[0];
        for i in 0..v.parallelism as usize {
            let task = offsets[vi] + i;
            for (ei, e) in graph
                .edges()
                .iter()
                .enumerate()
                .filter(|(_, e)| e.to == head)
            {
                let pu = plan.node_parallelism[e.from] as usize;
                let forward =
                    matches!(e.partition, EdgePartition::Default) && pu == v.parallelism as usize;
                edge_forward[ei] = forward;
                let upstreams: Vec<usize> = if forward { vec![i] } else { (0..pu).collect() };
                for j in upstreams {
                    let upstream_task = offsets[plan.node_vertex[e.from]] + j;
                    let ch = channel_ports[task].len();
                    channel_ports[task].push(e.port);
                    match (hosted[task], hosted[upstream_task], &placement.links) {
                        (true, true, _) => {
                            let credit = Credit::new(CHANNEL_CREDITS_MAX);
                            channel_credits[task].push(credit.clone());
                            all_credits.push(credit.clone());
                            let (Some(m), Some(p)) = (&mail_tx[task], &prio_tx[task]) else {
                                return Err(TaskError::msg("mailbox missing for a local task"));
                            };
                            edge_senders[ei][j].push(ChannelSender::new(
                                ch,
                                m.clone(),
                                p.clone(),
                                credit,
                            ));
                        }
                        (true, false, Some(links)) => {
                            channel_credits[task].push(links.credit_return(task, ch));
                        }
                        (false, true, Some(links)) => {
                            let credit = Credit::new(CHANNEL_CREDITS_MAX);
                            all_credits.push(credit.clone());
                            edge_senders[ei][j].push(links.channel_to(task, ch, credit)?);
                        }
                        (false, false, _) => {}
                        (_, _, None) => {
                            return Err(TaskError::msg("a remote channel without a network"))
                        }
                    }
                }
            }
        }
    }
    let mode = match cx.config.checkpointing_mode {
        CheckpointingMode::ExactlyOnce => AlignmentMode::Aligned,
        CheckpointingMode::AtLeastOnce => AlignmentMode::Tracking,
    };
    let (upload_tx, upload_rx) = crossbeam_channel::unbounded::<UploadJob>();
    let mut bodies: Vec<BuiltTask> = Vec::with_capacity(total);
    let mut infos = Vec::with_capacity(total);
    for (vi, v) in plan.vertices.iter().enumerate() {
        for i in 0..v.parallelism {
            let global = offsets[vi] + i as usize;
            if !hosted[global] {
                continue;
            }
            let init_for = |node: usize| -> SubtaskInit {
                let spec = &graph.nodes()[node];
                let p = plan.node_parallelism[node];
                SubtaskInit {
                    uid: spec.uid.clone(),
                    subtask: i,
                    parallelism: p,
                    max_parallelism: plan.max_parallelism,
                    checkpointing,
                    restored: cx
                        .restored
                        .map(|c| c.restored_for(&spec.uid, i, p))
                        .unwrap_or_default(),
                }
            };
            let tail = *v.nodes.last().unwrap_or(&v.nodes[0]);
            let outputs: Vec<EdgeOutput> = graph
                .edges()
                .iter()
                .enumerate()
                .filter(|(_, e)| e.from == tail)
                .map(|(ei, e)| EdgeOutput {
                    partition: e.partition.clone(),
                    forward: edge_forward[ei],
                    senders: std::mem::take(&mut edge_senders[ei][i as usize]),
                    max_parallelism: plan.max_parallelism,
                })
                .collect();
            let mut next = (graph.nodes()[tail].writer)(outputs)?;
            for &node in v.nodes.iter().skip(1).rev() {
                if let NodeKind::OneInput { link, .. } = &graph.nodes()[node].kind {
                    next = link(&mut init_for(node), next)?;
                }
            }
            let head = v.nodes[0];
            let mut init = init_for(head);
            let restored_channels = init.restored.channel.take();
            let body = match &graph.nodes()[head].kind {
                NodeKind::Source { splits, body } => {
                    let restored_here =
                        cx.restored.is_some_and(|c| c.uids().any(|u| u == init.uid));
                    let my_splits = if restored_here {
                        init.restored.take_list(SOURCE_SPLITS_STATE)
                    } else {
                        splits(v.parallelism)?
                            .into_iter()
                            .enumerate()
                            .filter(|(j, _)| *j as u32 % v.parallelism == i)
                            .map(|(_, s)| s)
                            .collect()
                    };
                    body(&mut init, my_splits, next)?
                }
                NodeKind::OneInput { link, head: wrap } => wrap(link(&mut init, next)?)?,
                NodeKind::TwoInput { body } => body(&mut init, next)?,
            };
            bodies.push((global, vi, body, i, restored_channels));
            let Some(mailbox) = mail_tx[global].clone() else {
                return Err(TaskError::msg("mailbox missing for a local task"));
            };
            infos.push(TaskInfo {
                index: global,
                name: v.name.clone(),
                subtask: i,
                is_source: v.is_source,
                mailbox: MailboxHandle::Local(mailbox),
                operators: v
                    .nodes
                    .iter()
                    .map(|&x| (graph.nodes()[x].uid.clone(), plan.node_parallelism[x]))
                    .collect(),
            });
        }
    }
    let mut handles = Vec::with_capacity(total);
    let aligned_timeout = match barrier_kind(cx.config) {
        BarrierKind::AlignedWithTimeout { timeout_ms } => {
            Some(std::time::Duration::from_millis(timeout_ms))
        }
        _ => None,
    };
    for (task, vi, body, i, restored_channels) in bodies {
        let v = &plan.vertices[vi];
        let rt = TaskRuntime {
            index: task,
            vertex: vi,
            name: v.name.clone(),
            head_uid: graph.nodes()[v.nodes[0]].uid.clone(),
            subtask: i,
            attempt: cx.attempt,
            body,
            mailbox: mail_rx[task]
                .take()
                .ok_or_else(|| TaskError::msg("mailbox taken twice"))?,
            priority: prio_rx[task]
                .take()
                .ok_or_else(|| TaskError::msg("mailbox taken twice"))?,
            aligned_timeout,
            restored_channels,
            held: None,
            inbox: Default::default(),
            gate: (!v.is_source).then(|| InputGate::new(channel_ports[task].len(), mode)),
            channel_ports: std::mem::take(&mut channel_ports[task]),
            credits: std::mem::take(&mut channel_credits[task]),
            events: cx.events.clone(),
            uploader: upload_tx.clone(),
            injector: cx.injector.clone(),
            metrics: cx.metrics.clone(),
            checkpointing,
        };
        let events = cx.events.clone();
        let attempt = cx.attempt;
        let name = format!("{} #{}", v.name, i);
        let h = std::thread::Builder::new()
            .name(format!("task-{vi}-{i}"))
            .spawn(move || {
                let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| rt.run()))
                    .unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        Err(TaskError::msg(format!("panicked: {msg}")))
                    });
                let result = result.map_err(|e| e.context(format!("task '{name}'")));
                let _ = events.send(JobEvent::Exited {
                    attempt,
                    task,
                    result,
                });
            })
            .map_err(|e| TaskError::msg(format!("cannot start a task thread: {e}")))?;
        handles.push(h);
    }
    drop(upload_tx);
    let mut uploaders = Vec::new();
    for n in 0..2 {
        let rx = upload_rx.clone();
        let events = cx.events.clone();
        let storage = cx.storage.clone();
        let job_id = cx.job_id.to_string();
        uploaders.push(
            std::thread::Builder::new()
                .name(format!("snapshot-uploader-{n}"))
                .spawn(move || run_uploader(rx, events, storage, job_id))
                .map_err(|e| TaskError::msg(format!("cannot start an uploader thread: {e}")))?,
        );
    }
    Ok(Deployment {
        handles,
        mailboxes: infos.iter().map(|t| t.mailbox.clone()).collect(),
        credits: all_credits,
        uploaders,
        infos,
    })
}

fn barrier_kind(config: &JobConfig) -> BarrierKind {
    if config.unaligned_enabled && config.aligned_checkpoint_timeout.is_zero() {
        BarrierKind::Unaligned
    } else if config.unaligned_enabled {
        BarrierKind::AlignedWithTimeout {
            timeout_ms: config.aligned_checkpoint_timeout.as_millis() as u64,
        }
    } else {
        BarrierKind::Aligned
    }
}

fn new_job_id() -> String {
    format!("{:032x}", fastrand::u128(..))
}

enum AttemptEnd {
    Finished,
    Failed(String),
    Canceled,
}

/// Runs a job in this process until it finishes or fails for good.
pub fn run_job(graph: &JobGraph, opts: RunOptions) -> Result<JobSummary, JobError> {
    run_job_with(graph, opts, &mut LocalExecutor)
}

/// Runs a job whose subtasks `executor` deploys (in this process, or on workers) until it
/// finishes or fails for good. This thread is the job master.
pub fn run_job_with(
    graph: &JobGraph,
    opts: RunOptions,
    executor: &mut dyn Executor,
) -> Result<JobSummary, JobError> {
    let started = Instant::now();
    let config = &opts.config;
    config
        .validate()
        .map_err(|e| JobError::Setup(e.to_string()))?;
    if config.state_backend == StateBackendKind::RocksDb {
        return Err(JobError::Setup(
            "state.backend.type: 'rocksdb' is not available in this build; use 'hashmap'".into(),
        ));
    }
    if config.unaligned_enabled && config.checkpointing_mode == CheckpointingMode::AtLeastOnce {
        return Err(JobError::Setup(
            "execution.checkpointing.unaligned.enabled: unaligned checkpoints need execution.checkpointing.mode EXACTLY_ONCE".into(),
        ));
    }
    let plan = plan(graph, config)?;
    let checkpointing = config.checkpointing_enabled();
    let metrics = opts.metrics.clone().unwrap_or_default();

    // Checkpoint storage: the configured directory, or coordinator memory.
    let fs_storage: Option<Arc<FsStorage>> = match &config.checkpoints_dir {
        Some(dir) => Some(Arc::new(
            FsStorage::open(dir).map_err(|e| JobError::Setup(e.to_string()))?,
        )),
        None => None,
    };
    let storage: Arc<dyn CheckpointStorage> = match &fs_storage {
        Some(s) => s.clone(),
        None => Arc::new(MemoryStorage::new()),
    };

    // What to start from.
    let mut job_id = opts.job_id.clone().unwrap_or_else(new_job_id);
    let mut restored: Option<LoadedCheckpoint> = None;
    let mut started_fresh = false;
    let mut claimed = false;
    match &opts.restore {
        None => {}
        Some(RestoreFrom::Latest) => {
            let Some(fs) = &fs_storage else {
                return Err(JobError::Restore(
                    "--from latest needs a checkpoint directory (--checkpoint-dir or state.checkpoints.dir)".into(),
                ));
            };
            match find_latest(fs.as_ref()).map_err(JobError::Restore)? {
                Some(c) => {
                    job_id = c.metadata.job_id.clone();
                    claimed = true;
                    restored = Some(c);
                }
                None => {
                    info!(
                        "no completed checkpoint under {}; starting fresh",
                        fs.location("")
                    );
                    started_fresh = true;
                }
            }
        }
        Some(RestoreFrom::Path(p)) => {
            let (c, _) = load_from_path(p).map_err(JobError::Restore)?;
            if let (Some(fs), Some(root)) = (&fs_storage, &c.storage_root) {
                if fs.root() == root.as_path() {
                    job_id = c.metadata.job_id.clone();
                    claimed = true;
                }
            }
            restored = Some(c);
        }
    }
    let restored_from = restored.as_ref().map(|c| c.location.clone());
    let status = opts.status.clone().unwrap_or_else(|| {
        JobStatus::new(job_id.clone(), graph.name().to_string(), config.describe())
    });
    status.update(|v| {
        v.jid = job_id.clone();
        v.name = graph.name().to_string();
        v.config = config.describe();
    });
    if let Some(c) = &restored {
        info!("restoring job from checkpoint {} ({})", c.id(), c.location);
        for node in graph.nodes() {
            let uid = node.uid.as_str();
            let now_p = node.parallelism.unwrap_or(config.parallelism);
            if c.has_channel_state(uid) && c.parallelism_of(uid) != Some(now_p) {
                return Err(JobError::Restore(format!(
                    "checkpoint {} holds in-flight data of operator '{uid}' (unaligned checkpoint) and cannot be restored with a different parallelism",
                    c.location
                )));
            }
        }
        if c.metadata.max_parallelism != plan.max_parallelism {
            return Err(JobError::Restore(format!(
                "checkpoint {} was taken with max parallelism {}, the job has {}; key groups cannot be remapped",
                c.location, c.metadata.max_parallelism, plan.max_parallelism
            )));
        }
    }

    let mut coordinator = checkpointing.then(|| {
        let settings = CheckpointSettings {
            interval: config.checkpoint_interval.unwrap_or(Duration::from_secs(1)),
            timeout: config.checkpoint_timeout,
            min_pause: config.min_pause,
            // Unaligned checkpoints run one at a time (as in Flink).
            max_concurrent: if config.unaligned_enabled {
                1
            } else {
                config.max_concurrent_checkpoints.max(1)
            },
            tolerable_failed: config.tolerable_failed_checkpoints,
            num_retained: config.num_retained.max(1),
            barrier_kind: barrier_kind(config),
        };
        let min_next = restored.as_ref().map_or(1, |c| c.id() + 1);
        let mut c = CheckpointCoordinator::new(
            settings,
            storage.clone(),
            job_id.clone(),
            graph.name().to_string(),
            plan.max_parallelism,
            min_next,
        );
        if claimed {
            if let Some(r) = &restored {
                c.adopt_retained(r.id());
            }
        }
        c
    });

    let candidates = plan.vertices_with_head_prefix(graph, opts.inject_target.0.as_deref());
    let injector = opts.inject.map(|s| {
        Arc::new(FailureInjector::among(
            candidates.clone(),
            s.count,
            s.seed,
            s.expected_records,
        ))
    });
    let mut restarts = RestartTracker::new(config.effective_restart_strategy());
    let mut restart_count = 0u32;
    // Every deployment of a region gets its own attempt number; events carry it.
    let mut next_attempt = 0u32;
    let (events_tx, events_rx) = crossbeam_channel::unbounded::<JobEvent>();
    let mut last_progress = Instant::now();
    let regions = plan.regions(graph);
    let total = plan.total;
    let mut region_of_task = vec![0usize; total];
    for (r, tasks) in regions.iter().enumerate() {
        for &t in tasks {
            region_of_task[t] = r;
        }
    }
    let region_failover = regions.len() > 1 && config.failover_strategy == FailoverStrategy::Region;
    let task_of_node = |node: usize| plan.offsets[plan.node_vertex[node]];
    let deployer = Deployer {
        graph,
        plan: &plan,
        config,
        events: &events_tx,
        storage: &storage,
        job_id: &job_id,
        injector: &injector,
        metrics: &metrics,
    };

    loop {
        // The state to start this attempt from: the newest checkpoint completed by this run, else
        // the one the run was started from. Read back from storage, so a restore is exactly what
        // a new process would see.
        if let Some(c) = coordinator.as_ref().and_then(|c| c.completed().last()) {
            let id = c.id;
            restored = Some(load_checkpoint(storage.as_ref(), &job_id, id).map_err(|e| {
                JobError::Restore(format!("cannot read back completed checkpoint {id}: {e}"))
            })?);
        }
        init_sinks(graph, restored.as_ref(), |_| true)?;
        status.set_state(JobState::Running);
        let mut infos: Vec<Option<TaskInfo>> = vec![None; total];
        let mut task_attempt = vec![u32::MAX; total];
        let mut deployments: Vec<Option<Box<dyn Deployed>>> =
            (0..regions.len()).map(|_| None).collect();
        let mut deploy_failure = None;
        for (r, tasks) in regions.iter().enumerate() {
            let attempt = next_attempt;
            next_attempt += 1;
            let mask = region_mask(tasks, total);
            match deployer.deploy(
                executor,
                restored.as_ref(),
                &mask,
                attempt,
                &mut task_attempt,
            ) {
                Ok(d) => {
                    for info in d.infos() {
                        infos[info.index] = Some(info.clone());
                    }
                    deployments[r] = Some(d);
                }
                Err(e) => {
                    deploy_failure = Some(e);
                    break;
                }
            }
        }
        if let Some(e) = deploy_failure {
            for d in deployments.into_iter().flatten() {
                d.cancel();
            }
            if next_attempt as usize <= regions.len() {
                status.set_state(JobState::Failed);
                return Err(JobError::Setup(e.to_string()));
            }
            let cause = format!("the job could not be redeployed: {e}");
            warn!("{cause}");
            let delay = decide_restart(&mut restarts, &mut restart_count, &status, cause)?;
            std::thread::sleep(delay);
            continue;
        }
        let Some(mut all_infos) = infos.iter().cloned().collect::<Option<Vec<TaskInfo>>>() else {
            return Err(JobError::Setup("some subtasks were not deployed".into()));
        };
        if let Some(c) = coordinator.as_mut() {
            c.set_tasks(all_infos.clone(), task_attempt.clone());
        }
        let sources: Vec<usize> = all_infos
            .iter()
            .filter(|t| t.is_source)
            .map(|t| t.index)
            .collect();
        let mut exhausted = vec![false; total];
        let mut exited = vec![false; total];
        let mut final_checkpoint: Option<u64> = None;
        let mut end_sent = false;

        let end = loop {
            let now = Instant::now();
            let mut wake = now + Duration::from_millis(200);
            if let Some(c) = &coordinator {
                // With max-concurrent checkpoints in flight, the next ack wakes the loop.
                if final_checkpoint.is_none() && c.has_room() {
                    wake = wake.min(c.next_trigger_at(now));
                }
                if let Some(t) = c.next_timeout_at() {
                    wake = wake.min(t);
                }
            }
            let event = match events_rx.recv_timeout(wake.saturating_duration_since(now)) {
                Ok(e) => Some(e),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    break AttemptEnd::Failed("event channel closed".into())
                }
            };
            // A failure, and the region it is confined to (None: the whole job).
            let mut failure: Option<(String, Option<usize>)> = None;
            match event {
                Some(JobEvent::Ack(ack)) => {
                    if let Some(c) = coordinator.as_mut() {
                        match c.on_ack(ack) {
                            Ok(done) => {
                                if let Some(f) = final_checkpoint {
                                    if !end_sent && done.iter().any(|&d| d >= f) {
                                        end_sent = true;
                                        for &s in &sources {
                                            let _ = all_infos[s].mailbox.send(Mail::EndOfInput);
                                        }
                                    }
                                }
                            }
                            Err(e) => failure = Some((e.to_string(), None)),
                        }
                    }
                }
                Some(JobEvent::Decline {
                    checkpoint_id,
                    attempt: a,
                    reason,
                }) => {
                    if let Some(c) = coordinator.as_mut() {
                        if let Err(e) = c.on_decline(checkpoint_id, a, &reason) {
                            failure = Some((e.to_string(), None));
                        }
                    }
                }
                Some(JobEvent::SourceExhausted { attempt: a, task })
                    if task_attempt.get(task) == Some(&a) =>
                {
                    exhausted[task] = true;
                }
                Some(JobEvent::Lost { attempt: a, reason }) => {
                    if let Some(t) = task_attempt.iter().position(|&x| x == a) {
                        failure = Some((reason, Some(region_of_task[t])));
                    }
                }
                Some(JobEvent::Exited {
                    attempt: a,
                    task,
                    result,
                }) if task_attempt.get(task) == Some(&a) => match result {
                    Ok(()) => {
                        exited[task] = true;
                        if exited.iter().all(|&e| e) {
                            break AttemptEnd::Finished;
                        }
                    }
                    Err(e) => failure = Some((e.to_string(), Some(region_of_task[task]))),
                },
                Some(_) | None => {}
            }
            if let Some((cause, region)) = failure {
                match region {
                    // Restart only the failed pipelined region; the others keep running.
                    Some(r) if region_failover && !end_sent && checkpointing => {
                        if let Some(d) = deployments[r].take() {
                            d.cancel();
                        }
                        // Events queued meanwhile are not drained: those of the other regions
                        // (acks, exhaustion) still count; the cancelled attempt's are stale.
                        warn!("region {r} of the job failed: {cause}; restarting that region only");
                        status.update(|v| v.failure_cause = Some(cause.clone()));
                        let delay =
                            decide_restart(&mut restarts, &mut restart_count, &status, cause)?;
                        std::thread::sleep(delay);
                        if let Some(c) = coordinator.as_ref().and_then(|c| c.completed().last()) {
                            let id = c.id;
                            restored = Some(
                                load_checkpoint(storage.as_ref(), &job_id, id).map_err(|e| {
                                    JobError::Restore(format!(
                                        "cannot read back completed checkpoint {id}: {e}"
                                    ))
                                })?,
                            );
                        }
                        let in_region = |node: usize| region_of_task[task_of_node(node)] == r;
                        init_sinks(graph, restored.as_ref(), in_region)?;
                        for &t in &regions[r] {
                            exhausted[t] = false;
                            exited[t] = false;
                        }
                        let attempt = next_attempt;
                        next_attempt += 1;
                        let mask = region_mask(&regions[r], total);
                        match deployer.deploy(
                            executor,
                            restored.as_ref(),
                            &mask,
                            attempt,
                            &mut task_attempt,
                        ) {
                            Ok(d) => {
                                for info in d.infos() {
                                    all_infos[info.index] = info.clone();
                                }
                                deployments[r] = Some(d);
                                final_checkpoint = None;
                                if let Some(c) = coordinator.as_mut() {
                                    c.set_tasks(all_infos.clone(), task_attempt.clone());
                                }
                                status.set_state(JobState::Running);
                            }
                            Err(e) => {
                                break AttemptEnd::Failed(format!(
                                    "region {r} could not be redeployed: {e}"
                                ))
                            }
                        }
                    }
                    _ => break AttemptEnd::Failed(cause),
                }
            }
            if status.cancel_requested() {
                break AttemptEnd::Canceled;
            }
            if let Some(c) = coordinator.as_mut() {
                if let Err(e) = c.check_timeouts() {
                    break AttemptEnd::Failed(e.to_string());
                }
                if let Some(f) = final_checkpoint {
                    // The final checkpoint was aborted: take another one.
                    let completed = c.completed().last().is_some_and(|x| x.id >= f);
                    if !completed && c.pending_count() == 0 {
                        final_checkpoint = None;
                    }
                }
                let all_exhausted = sources.iter().all(|&s| exhausted[s]);
                tracing::trace!(?exhausted, "sources exhausted");
                if all_exhausted && final_checkpoint.is_none() {
                    final_checkpoint = c.maybe_trigger(true);
                } else if final_checkpoint.is_none() {
                    c.maybe_trigger(false);
                }
            }
            if let Some(c) = &coordinator {
                sync_status(&status, c);
            }
            if let Some(cb) = &opts.on_progress {
                if last_progress.elapsed() >= Duration::from_secs(1) {
                    last_progress = Instant::now();
                    cb(&progress(
                        &metrics,
                        coordinator.as_ref(),
                        started,
                        restart_count,
                    ));
                }
            }
        };

        match end {
            AttemptEnd::Canceled => {
                for d in deployments.into_iter().flatten() {
                    d.cancel();
                }
                status.set_state(JobState::Canceled);
                return Err(JobError::Canceled);
            }
            AttemptEnd::Finished => {
                for d in deployments.into_iter().flatten() {
                    d.join();
                }
                if let Some(c) = &coordinator {
                    sync_status(&status, c);
                }
                status.set_state(JobState::Finished);
                let (checkpoints, failed) = coordinator.as_ref().map_or((Vec::new(), 0), |c| {
                    (c.completed().to_vec(), c.failed_total())
                });
                return Ok(JobSummary {
                    job_id,
                    job_name: graph.name().to_string(),
                    elapsed: started.elapsed(),
                    records: metrics.records.load(Ordering::Relaxed),
                    checkpoints,
                    failed_checkpoints: failed,
                    restarts: restart_count,
                    injected: injector.as_ref().map(|i| (i.fired(), i.planned())),
                    restored_from,
                    started_fresh,
                });
            }
            AttemptEnd::Failed(cause) => {
                for d in deployments.into_iter().flatten() {
                    d.cancel();
                }
                // Drain what the cancelled attempts still reported; a more telling cause than
                // "task cancelled" may be among it.
                let mut cause = cause;
                for a in task_attempt
                    .iter()
                    .copied()
                    .collect::<std::collections::BTreeSet<u32>>()
                {
                    cause = drain_cause(&events_rx, a, cause);
                }
                warn!("job failed: {cause}");
                status.update(|v| v.failure_cause = Some(cause.clone()));
                if !checkpointing {
                    status.set_state(JobState::Failed);
                    return Err(JobError::Failed {
                        restarts: restart_count,
                        cause,
                        reason:
                            "checkpointing is disabled, so nothing can be restored (at-most-once)"
                                .into(),
                    });
                }
                let delay = decide_restart(&mut restarts, &mut restart_count, &status, cause)?;
                info!("restarting job in {delay:?} (restart {restart_count})");
                std::thread::sleep(delay);
            }
        }
    }
}

/// What every deployment of one job run shares.
struct Deployer<'a> {
    graph: &'a JobGraph,
    plan: &'a Plan,
    config: &'a JobConfig,
    events: &'a Sender<JobEvent>,
    storage: &'a Arc<dyn CheckpointStorage>,
    job_id: &'a str,
    injector: &'a Option<Arc<FailureInjector>>,
    metrics: &'a Arc<JobMetrics>,
}

impl Deployer<'_> {
    /// Deploys the subtasks in `mask` (a region) as `attempt`, restored from `restored`.
    fn deploy(
        &self,
        executor: &mut dyn Executor,
        restored: Option<&LoadedCheckpoint>,
        mask: &[bool],
        attempt: u32,
        task_attempt: &mut [u32],
    ) -> Result<Box<dyn Deployed>, TaskError> {
        let req = DeployRequest {
            graph: self.graph,
            plan: self.plan,
            config: self.config,
            restored,
            attempt,
            events: self.events,
            storage: self.storage,
            job_id: self.job_id,
            injector: self.injector,
            metrics: self.metrics,
            tasks: Some(mask),
        };
        let d = executor.deploy(&req)?;
        for info in d.infos() {
            task_attempt[info.index] = attempt;
        }
        Ok(d)
    }
}

fn region_mask(tasks: &[usize], total: usize) -> Vec<bool> {
    let mut mask = vec![false; total];
    for &t in tasks {
        mask[t] = true;
    }
    mask
}

/// Asks the restart strategy about a failure: the delay before restarting, or the job's end.
fn decide_restart(
    restarts: &mut RestartTracker,
    restart_count: &mut u32,
    status: &JobStatus,
    cause: String,
) -> Result<Duration, JobError> {
    match restarts.on_failure(Instant::now()) {
        Ok(delay) => {
            *restart_count += 1;
            let n = *restart_count;
            status.update(|v| {
                v.state = JobState::Restarting;
                v.restarts = n;
            });
            Ok(delay)
        }
        Err(reason) => {
            status.set_state(JobState::Failed);
            Err(JobError::Failed {
                restarts: *restart_count,
                cause,
                reason,
            })
        }
    }
}

/// Runs the once-per-attempt initialization of the sinks `select`ed: commit the restored
/// checkpoint's pre-committed transactions, discard the rest.
fn init_sinks(
    graph: &JobGraph,
    restored: Option<&LoadedCheckpoint>,
    select: impl Fn(usize) -> bool,
) -> Result<(), JobError> {
    for node in graph.nodes() {
        if let Some(init) = &node.sink_init {
            if !select(node.id) {
                continue;
            }
            let pending = restored.map(|c| c.all_list_entries(&node.uid, SINK_PENDING_STATE));
            init(pending).map_err(|e| JobError::Setup(format!("sink '{}': {e}", node.uid)))?;
        }
    }
    Ok(())
}

fn sync_status(status: &JobStatus, c: &CheckpointCoordinator) {
    let completed = c.completed();
    let known = status.view_completed_count();
    for cp in completed.iter().skip(known) {
        status.checkpoint_completed((*cp.metadata).clone());
    }
    status.set_completed_count(completed.len());
    status.update(|v| {
        v.checkpoint_counts.triggered = c.triggered_total();
        v.checkpoint_counts.in_progress = c.pending_count() as u64;
        v.checkpoint_counts.completed = completed.len() as u64;
        v.checkpoint_counts.failed = c.failed_total();
    });
}

fn drain_cause(events: &Receiver<JobEvent>, attempt: u32, cause: String) -> String {
    let mut best = cause;
    while let Ok(e) = events.try_recv() {
        if let JobEvent::Exited {
            attempt: a,
            result: Err(err),
            ..
        } = e
        {
            if a == attempt
                && best.contains("task cancelled")
                && !matches!(err, TaskError::Cancelled)
            {
                best = err.to_string();
            }
        }
    }
    best
}

fn progress(
    metrics: &JobMetrics,
    c: Option<&CheckpointCoordinator>,
    started: Instant,
    restarts: u32,
) -> Progress {
    Progress {
        elapsed: started.elapsed(),
        records: metrics.records.load(Ordering::Relaxed),
        checkpoints: c.map_or(0, |c| c.completed().len()),
        last_checkpoint: c
            .and_then(|c| c.completed().last())
            .map(|l| (l.id, l.duration_ms, l.state_size)),
        restarts,
    }
}
