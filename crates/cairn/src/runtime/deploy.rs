//! Deployment: builds the subtasks of an attempt (their chains, channels with credits,
//! mailboxes, restored state) and starts them as threads, in this process or — through
//! [`DataLinks`] — with channels to subtasks in other processes.

use std::sync::Arc;
use std::task::Poll;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::chain::{TaskBody, SOURCE_SPLITS_STATE};
use super::channel::{
    BarrierKind, ChannelSender, Credit, CreditReturn, Mail, MailboxHandle, CHANNEL_CREDITS_MAX,
};
use super::gate::{AlignmentMode, InputGate};
use super::graph::{EdgeOutput, EdgePartition, JobGraph, NodeKind, SubtaskInit};
use super::inject::FailureInjector;
use super::plan::Plan;
use super::task::{run_uploader, JobEvent, JobMetrics, TaskRuntime, UploadJob};
use crate::checkpoint::coordinator::TaskInfo;
use crate::checkpoint::LoadedCheckpoint;
use crate::config::{CheckpointingMode, JobConfig, StateBackendKind};
use crate::error::TaskError;
use crate::state::{ChannelStateData, RocksDbSettings};
use crate::storage::CheckpointStorage;

/// A deployed subtask: what the coordinator knows of it, and how to reach its mailbox.
#[derive(Debug, Clone)]
pub struct DeployedTask {
    /// The subtask as the checkpoint coordinator sees it.
    pub info: TaskInfo,
    /// Its mailbox (control path).
    pub mailbox: MailboxHandle,
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

/// The subtasks of one attempt running in this process.
pub struct Deployment {
    handles: Vec<JoinHandle<()>>,
    mailboxes: Vec<MailboxHandle>,
    credits: Vec<Arc<Credit>>,
    uploaders: Vec<JoinHandle<()>>,
    infos: Vec<DeployedTask>,
}

/// A running attempt, as the job master sees it.
pub trait Deployed: Send {
    /// Every subtask, in global order.
    fn infos(&self) -> &[DeployedTask];
    /// Stops every subtask and waits until they stopped.
    fn cancel(self: Box<Self>);
    /// Waits for subtasks that are finishing on their own.
    fn join(self: Box<Self>);
}

/// Runs the subtasks of attempts: in this process, or on workers.
pub trait Executor: Send {
    /// Whether attempt `req` can be deployed now: `Pending` while it waits for something (slots,
    /// workers' answers, the stop of the attempts it replaces), to be asked again later; an
    /// error when it cannot be deployed. Never blocks, so the job master goes on handling
    /// events, requests and deadlines meanwhile. In this process an attempt is always ready.
    fn poll_ready(&mut self, req: &DeployRequest<'_>) -> Poll<Result<(), TaskError>> {
        let _ = req;
        Poll::Ready(Ok(()))
    }
    /// Deploys every subtask of an attempt [`poll_ready`](Executor::poll_ready) found ready.
    fn deploy(&mut self, req: &DeployRequest<'_>) -> Result<Box<dyn Deployed>, TaskError>;
    /// Forgets attempt `attempt`, which was made ready (in part) but will not be deployed.
    fn abandon(&mut self, attempt: u32) {
        let _ = attempt;
    }
    /// Waits (bounded) until every cancelled attempt stopped; called when the job ends.
    fn wait_stopped(&mut self) {}
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
    fn infos(&self) -> &[DeployedTask] {
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
    /// The sources start stopped (restored from a completed stop-with-savepoint).
    pub sources_stopped: bool,
}

/// Where keyed state lives: RocksDB settings when `state.backend.type: rocksdb`.
fn rocksdb_settings(cx: &DeployRequest<'_>) -> Option<RocksDbSettings> {
    if cx.config.state_backend != StateBackendKind::RocksDb {
        return None;
    }
    Some(RocksDbSettings {
        local_dir: cx
            .config
            .rocksdb_local_dir
            .clone()
            .unwrap_or_else(|| std::env::temp_dir().join("cairn-rocksdb")),
        memory_bytes: cx.config.rocksdb_memory,
        incremental: cx.config.incremental,
        storage: cx.storage.clone(),
        job_id: cx.job_id.to_string(),
    })
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
    // Per upstream task, the credits of its output channels (the metrics' output queue fill).
    let mut output_credits: Vec<Vec<Arc<dyn crate::metrics::Queue>>> = vec![Vec::new(); total];
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
                            output_credits[upstream_task].push(credit.clone());
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
                            output_credits[upstream_task].push(credit.clone());
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
    let rocksdb = rocksdb_settings(cx);
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
                    job_id: cx.job_id.to_string(),
                    uid: spec.uid.clone(),
                    subtask: i,
                    parallelism: p,
                    max_parallelism: plan.max_parallelism,
                    checkpointing,
                    watermark_interval: cx.config.auto_watermark_interval,
                    restored: cx
                        .restored
                        .map(|c| c.restored_for(&spec.uid, i, p))
                        .unwrap_or_default(),
                    rocksdb: rocksdb.clone(),
                    heap_copy_on_write: cx.config.heap_copy_on_write,
                    sink_restored: cx
                        .restored
                        .filter(|_| spec.sink_init.is_some())
                        .map(|c| crate::runtime::operators::sink_pending(c, &spec.uid)),
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
            infos.push(DeployedTask {
                info: TaskInfo {
                    index: global,
                    name: v.name.clone(),
                    subtask: i,
                    is_source: v.is_source,
                    operators: plan.chain_operators(graph, v),
                },
                mailbox: MailboxHandle::Local(mailbox),
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
        let io = cx.config.metrics_enabled.then(|| {
            let m = crate::metrics::registry().subtask(
                cx.job_id,
                graph.name(),
                vi,
                &v.name,
                i,
                v.is_source,
            );
            m.attach(
                channel_ports[task].len() * CHANNEL_CREDITS_MAX,
                std::mem::take(&mut output_credits[task]),
            );
            m
        });
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
            io,
            checkpointing,
            stopped: cx.sources_stopped,
        };
        let events = cx.events.clone();
        let attempt = cx.attempt;
        let name = format!("{} #{}", v.name, i);
        let h = std::thread::Builder::new()
            .name(format!("task-{vi}-{i}"))
            .spawn(move || {
                let mut rt = rt;
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
                // Only now drop the task's channels: a peer that sees them close (and exits
                // "cancelled") must not be heard before this task's own cause, or a failure
                // would be counted under the wrong cause.
                drop(rt);
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

/// How the configuration says barriers travel.
pub(crate) fn barrier_kind(config: &JobConfig) -> BarrierKind {
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

/// What every deployment of one job run shares.
pub(crate) struct Deployer<'a> {
    pub(crate) graph: &'a JobGraph,
    pub(crate) plan: &'a Plan,
    pub(crate) config: &'a JobConfig,
    pub(crate) events: &'a Sender<JobEvent>,
    pub(crate) storage: &'a Arc<dyn CheckpointStorage>,
    pub(crate) job_id: &'a str,
    pub(crate) injector: &'a Option<Arc<FailureInjector>>,
    pub(crate) metrics: &'a Arc<JobMetrics>,
}

impl Deployer<'_> {
    /// The request to deploy the subtasks in `mask` (a region) as `attempt`, restored from
    /// `restored`.
    pub(crate) fn request<'r>(
        &'r self,
        restored: Option<&'r LoadedCheckpoint>,
        mask: &'r [bool],
        attempt: u32,
        sources_stopped: bool,
    ) -> DeployRequest<'r> {
        DeployRequest {
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
            sources_stopped,
        }
    }
}

pub(crate) fn region_mask(tasks: &[usize], total: usize) -> Vec<bool> {
    let mut mask = vec![false; total];
    for &t in tasks {
        mask[t] = true;
    }
    mask
}
