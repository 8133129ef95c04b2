//! The worker process: registers with the coordinator, heartbeats, runs the subtasks deployed
//! onto its slots, and exchanges channel data with other workers.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use tracing::{info, warn};

use super::frame::{read_frame, write_frame, FrameError};
use super::protocol::{
    secrets_match, DataMsg, DeploySpec, ToCoordinator, ToWorker, WireEvent, WireTaskError,
};
use super::JobFactory;
use crate::checkpoint::{load_checkpoint, load_dir};
use crate::error::TaskError;
use crate::runtime::channel::{
    ChannelSender, Credit, CreditReturn, DataFrame, Element, Mail, RemoteChannel,
};
use crate::runtime::inject::FailureInjector;
use crate::runtime::job::{deploy, plan, DataLinks, DeployRequest, Deployment, Placement};
use crate::runtime::plan::Plan;
use crate::runtime::task::{JobEvent, JobMetrics};
use crate::storage::{CheckpointStorage, FsStorage, MemoryStorage};

/// How to run a worker.
#[derive(Clone)]
pub struct WorkerOptions {
    /// Coordinator address (host:port).
    pub coordinator: String,
    /// Task slots offered.
    pub slots: u32,
    /// Shared cluster secret.
    pub secret: String,
    /// Address to listen on for data connections (port 0: any).
    pub data_bind: String,
    /// Builds jobs by name.
    pub factory: Arc<dyn JobFactory>,
    /// Time between heartbeats.
    pub heartbeat_interval: Duration,
}

/// How often a worker reports its subtasks' metrics to the coordinator.
const METRICS_REPORT_INTERVAL: Duration = Duration::from_secs(1);

type Writer = Arc<Mutex<TcpStream>>;

/// A local subtask's mailbox and priority mailbox.
type Inbox = (Sender<Mail>, Sender<Mail>);

fn send<T: serde::Serialize>(w: &Writer, msg: &T) -> bool {
    match w.lock() {
        Ok(mut s) => write_frame(&mut *s, msg).is_ok(),
        Err(_) => false,
    }
}

/// One attempt's subtasks on this worker and their network endpoints.
struct AttemptRuntime {
    spec: DeploySpec,
    worker_id: u32,
    secret: String,
    receivers: Mutex<HashMap<usize, Inbox>>,
    /// `(task, channel)` of every input channel of a local task fed from another worker: the
    /// only addresses a data frame from the network may name.
    remote_inputs: Mutex<HashSet<(usize, usize)>>,
    out_credits: Mutex<HashMap<(usize, usize), Arc<Credit>>>,
    return_paths: Mutex<HashMap<(usize, usize), Writer>>,
    peers: Mutex<HashMap<u32, Writer>>,
    sockets: Mutex<Vec<TcpStream>>,
    deployment: Mutex<Option<Deployment>>,
    cancelled: AtomicBool,
}

impl AttemptRuntime {
    fn peer(self: &Arc<Self>, worker: u32) -> Result<Writer, TaskError> {
        let mut peers = self.peers.lock().map_err(|_| TaskError::Cancelled)?;
        if let Some(w) = peers.get(&worker) {
            return Ok(w.clone());
        }
        let addr = self
            .spec
            .workers
            .iter()
            .find(|(id, _)| *id == worker)
            .map(|(_, a)| a.clone())
            .ok_or_else(|| TaskError::msg(format!("no address for worker {worker}")))?;
        let stream = TcpStream::connect(&addr).map_err(|e| {
            TaskError::msg(format!("cannot connect to worker {worker} at {addr}: {e}"))
        })?;
        let _ = stream.set_nodelay(true);
        let mut reader = stream
            .try_clone()
            .map_err(|e| TaskError::msg(format!("data connection to {addr}: {e}")))?;
        let writer: Writer = Arc::new(Mutex::new(stream));
        let hello = DataMsg::Hello {
            secret: self.secret.clone(),
            job_id: self.spec.job_id.clone(),
            attempt: self.spec.attempt,
        };
        if !send(&writer, &hello) {
            return Err(TaskError::msg(format!(
                "cannot greet worker {worker} at {addr}"
            )));
        }
        if let Ok(s) = reader.try_clone() {
            if let Ok(mut socks) = self.sockets.lock() {
                socks.push(s);
            }
        }
        // Credits come back on the same connection.
        let me = Arc::downgrade(self);
        std::thread::Builder::new()
            .name(format!("credits-from-{worker}"))
            .spawn(move || {
                let mut buf = Vec::new();
                loop {
                    let msg = read_frame::<_, DataMsg>(&mut reader, &mut buf);
                    let Some(rt) = me.upgrade() else { return };
                    let (task, channel) = match msg {
                        Ok(DataMsg::Credit { task, channel }) => (task, channel),
                        Ok(other) => {
                            warn!("data connection to worker {worker} ({addr}) closed: expected a credit, got {other:?}");
                            return;
                        }
                        Err(FrameError::Closed) => return,
                        Err(e) => {
                            if !rt.cancelled.load(Ordering::Acquire) {
                                warn!("data connection to worker {worker} ({addr}) closed: {e}");
                            }
                            return;
                        }
                    };
                    let credit = rt
                        .out_credits
                        .lock()
                        .ok()
                        .and_then(|m| m.get(&(task as usize, channel as usize)).cloned());
                    match credit {
                        Some(c) => c.release(),
                        None => {
                            warn!("data connection to worker {worker} ({addr}) closed: credit for task {task} channel {channel}, which this worker does not send to");
                            if let Ok(s) = reader.try_clone() {
                                let _ = s.shutdown(Shutdown::Both);
                            }
                            return;
                        }
                    }
                }
            })
            .map_err(|e| TaskError::msg(format!("cannot start a thread: {e}")))?;
        peers.insert(worker, writer.clone());
        Ok(writer)
    }

    /// Delivers a frame from the network to input channel `channel` of local task `task`.
    fn route(
        &self,
        task: usize,
        channel: usize,
        frame: DataFrame,
        from: &Writer,
    ) -> Result<(), RouteError> {
        // Indices from the network are checked before anything is indexed by them: a task
        // thread trusts the channel numbers of its mail.
        let known = self
            .remote_inputs
            .lock()
            .map_err(|_| RouteError::Stopped)?
            .contains(&(task, channel));
        if !known {
            return Err(RouteError::UnknownChannel);
        }
        if let Ok(mut paths) = self.return_paths.lock() {
            paths.entry((task, channel)).or_insert_with(|| from.clone());
        }
        let Some((mailbox, priority)) = self
            .receivers
            .lock()
            .ok()
            .and_then(|r| r.get(&task).cloned())
        else {
            return Err(RouteError::Stopped);
        };
        let ok = match frame {
            DataFrame::Batch(bytes) => mailbox.send(Mail::Data {
                channel,
                element: Element::Encoded(bytes),
            }),
            DataFrame::Barrier(b) => mailbox.send(Mail::Data {
                channel,
                element: Element::Barrier(b),
            }),
            DataFrame::EndOfStream => mailbox.send(Mail::Data {
                channel,
                element: Element::EndOfStream,
            }),
            DataFrame::Watermark(t) => mailbox.send(Mail::Data {
                channel,
                element: Element::Watermark(t),
            }),
            DataFrame::Idle => mailbox.send(Mail::Data {
                channel,
                element: Element::Idle,
            }),
            DataFrame::PriorityBarrier(barrier, batches_before) => {
                priority.send(Mail::PriorityBarrier {
                    channel,
                    barrier,
                    batches_before,
                })
            }
        };
        ok.map_err(|_| RouteError::Stopped)
    }

    fn cancel(&self) {
        self.cancelled.store(true, Ordering::Release);
        let deployment = self.deployment.lock().ok().and_then(|mut d| d.take());
        if let Some(d) = deployment {
            d.cancel();
        }
        if let Ok(socks) = self.sockets.lock() {
            for s in socks.iter() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

/// Why a frame from the network was not delivered.
#[derive(Debug)]
enum RouteError {
    /// No input channel of a local task of this attempt has that (task, channel) address.
    UnknownChannel,
    /// The receiving task has stopped (its mailbox is gone).
    Stopped,
}

struct RemoteChan {
    writer: Writer,
    task: u32,
    channel: u32,
}

impl RemoteChannel for RemoteChan {
    fn send(&self, frame: DataFrame) -> crate::error::TaskResult {
        let msg = DataMsg::Frame {
            task: self.task,
            channel: self.channel,
            frame,
        };
        let mut w = self.writer.lock().map_err(|_| TaskError::Cancelled)?;
        write_frame(&mut *w, &msg)
            .map_err(|e| TaskError::msg(format!("data connection failed: {e}")))
    }
}

struct RemoteCredit {
    rt: Arc<AttemptRuntime>,
    task: u32,
    channel: u32,
}

impl CreditReturn for RemoteCredit {
    fn release(&self) {
        let path = self
            .rt
            .return_paths
            .lock()
            .ok()
            .and_then(|p| p.get(&(self.task as usize, self.channel as usize)).cloned());
        if let Some(w) = path {
            let _ = send(
                &w,
                &DataMsg::Credit {
                    task: self.task,
                    channel: self.channel,
                },
            );
        }
    }
}

struct Links(Arc<AttemptRuntime>);

impl DataLinks for Links {
    fn channel_to(
        &self,
        task: usize,
        channel: usize,
        credit: Arc<Credit>,
    ) -> Result<ChannelSender, TaskError> {
        let worker = *self
            .0
            .spec
            .assignment
            .get(task)
            .ok_or_else(|| TaskError::msg("task outside the assignment"))?;
        let writer = self.0.peer(worker)?;
        if let Ok(mut m) = self.0.out_credits.lock() {
            m.insert((task, channel), credit.clone());
        }
        let chan = RemoteChan {
            writer,
            task: task as u32,
            channel: channel as u32,
        };
        Ok(ChannelSender::remote(Arc::new(chan), credit))
    }

    fn register_receiver(&self, task: usize, mailbox: Sender<Mail>, priority: Sender<Mail>) {
        if let Ok(mut r) = self.0.receivers.lock() {
            r.insert(task, (mailbox, priority));
        }
    }

    fn credit_return(&self, task: usize, channel: usize) -> Arc<dyn CreditReturn> {
        // Deployment asks for the credit return of exactly the local input channels whose
        // sender is remote, before any data connection may route here.
        if let Ok(mut r) = self.0.remote_inputs.lock() {
            r.insert((task, channel));
        }
        Arc::new(RemoteCredit {
            rt: self.0.clone(),
            task: task as u32,
            channel: channel as u32,
        })
    }
}

type JobLocal = (Option<Arc<FailureInjector>>, Arc<JobMetrics>);

#[derive(Default)]
struct Attempts {
    map: Mutex<HashMap<(String, u32), Arc<AttemptRuntime>>>,
    changed: Condvar,
    /// Per job: its failure injector and counters on this worker.
    jobs: Mutex<HashMap<String, JobLocal>>,
}

impl Attempts {
    fn wait_for(&self, job: &str, attempt: u32, deadline: Instant) -> Option<Arc<AttemptRuntime>> {
        let mut map = self.map.lock().ok()?;
        loop {
            if let Some(rt) = map.get(&(job.to_string(), attempt)) {
                return Some(rt.clone());
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            map = self.changed.wait_timeout(map, deadline - now).ok()?.0;
        }
    }
}

fn serve_data_connection(stream: TcpStream, attempts: Arc<Attempts>, secret: String) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let _ = stream.set_nodelay(true);
    let Ok(writer) = stream.try_clone() else {
        return;
    };
    let writer: Writer = Arc::new(Mutex::new(writer));
    let mut reader = stream;
    let mut buf = Vec::new();
    let (job_id, attempt) = match read_frame::<_, DataMsg>(&mut reader, &mut buf) {
        Ok(DataMsg::Hello {
            secret: s,
            job_id,
            attempt,
        }) if secrets_match(&s, &secret) => (job_id, attempt),
        Ok(DataMsg::Hello { .. }) => {
            warn!("data connection from {peer} rejected: wrong cluster secret");
            return;
        }
        Ok(_) => {
            warn!("data connection from {peer} closed: it did not start with a greeting");
            return;
        }
        Err(e) => {
            warn!("data connection from {peer} closed: {e}");
            return;
        }
    };
    // The connecting worker may be a little ahead of our own deployment of the attempt.
    let Some(rt) = attempts.wait_for(&job_id, attempt, Instant::now() + Duration::from_secs(10))
    else {
        warn!("data connection from {peer} closed: attempt {attempt} of job {job_id} is not deployed here");
        return;
    };
    if let Ok(s) = reader.try_clone() {
        if let Ok(mut socks) = rt.sockets.lock() {
            socks.push(s);
        }
    }
    loop {
        match read_frame::<_, DataMsg>(&mut reader, &mut buf) {
            Ok(DataMsg::Frame {
                task,
                channel,
                frame,
            }) => match rt.route(task as usize, channel as usize, frame, &writer) {
                Ok(()) => {}
                Err(RouteError::UnknownChannel) => {
                    warn!("data connection from {peer} closed: frame for task {task} channel {channel}, which is not an input channel of attempt {attempt} of job {job_id} fed from another worker");
                    break;
                }
                Err(RouteError::Stopped) => {
                    if !rt.cancelled.load(Ordering::Acquire) {
                        warn!("data connection from {peer} closed: frame for task {task}, which is not running here");
                    }
                    break;
                }
            },
            Ok(other) => {
                warn!("data connection from {peer} closed: unexpected {other:?}");
                break;
            }
            Err(FrameError::Closed) => break,
            Err(e) => {
                if !rt.cancelled.load(Ordering::Acquire) {
                    warn!("data connection from {peer} closed: {e}");
                    // A broken data connection fails the tasks it fed.
                    if let Ok(r) = rt.receivers.lock() {
                        for (mailbox, _) in r.values() {
                            let _ = mailbox.send(Mail::Cancel);
                        }
                    }
                }
                break;
            }
        }
    }
    // The socket is also held in the attempt's list (to stop it on cancel): dropping the reader
    // alone would leave the connection open, and the peer would not learn it was closed.
    let _ = reader.shutdown(Shutdown::Both);
}

/// Why a deployment did not start.
enum DeployError {
    /// This worker cannot run the job as submitted (it does not have it, its parameters do
    /// not build here, or it plans another graph): no restart can fix that.
    Refused(String),
    /// Anything else (a checkpoint that cannot be read, a thread that cannot start).
    Failed(String),
}

impl From<String> for DeployError {
    fn from(e: String) -> Self {
        DeployError::Failed(e)
    }
}

/// Builds the job of a deployment (or of a check) with this worker's factory and plans it,
/// refusing a job this binary does not have and a plan whose fingerprint differs from the
/// coordinator's. Starts nothing.
fn build_checked(
    spec: &DeploySpec,
    worker_id: u32,
    opts: &WorkerOptions,
) -> Result<(crate::api::JobGraph, crate::config::JobConfig, Plan), String> {
    if !opts.factory.has_job(&spec.job) {
        return Err(format!(
            "worker {worker_id} has no job '{}': every worker must run a binary that registers the coordinator's jobs",
            spec.job
        ));
    }
    let params: serde_json::Value = serde_json::from_str(&spec.params)
        .map_err(|e| format!("the parameters of job '{}' do not decode: {e}", spec.job))?;
    let graph = opts
        .factory
        .build(&spec.job, &params, spec.seed)
        .map_err(|e| format!("worker {worker_id} cannot build job '{}': {e}", spec.job))?;
    let mut config: crate::config::JobConfig = serde_norway::from_str(&spec.config_yaml)
        .map_err(|e| format!("cannot decode the job configuration: {e}"))?;
    if spec.checkpoint_dir.is_some() {
        config.checkpoints_dir = spec.checkpoint_dir.clone();
    }
    let plan = plan(&graph, &config).map_err(|e| e.to_string())?;
    let fingerprint = plan.fingerprint(&graph);
    if fingerprint != spec.fingerprint {
        return Err(format!(
            "worker {worker_id} builds a different graph for job '{}' (plan fingerprint {fingerprint}, the coordinator's {}): every worker must run the same binary as the coordinator",
            spec.job, spec.fingerprint
        ));
    }
    Ok((graph, config, plan))
}

fn deploy_attempt(
    spec: DeploySpec,
    worker_id: u32,
    opts: &WorkerOptions,
    attempts: &Arc<Attempts>,
    control: &Writer,
) -> Result<(), DeployError> {
    let (graph, config, plan) =
        build_checked(&spec, worker_id, opts).map_err(DeployError::Refused)?;
    if plan.total_tasks() != spec.assignment.len() {
        return Err(DeployError::Refused(format!(
            "job '{}' plans {} subtasks here but the coordinator assigned {}; are all processes running the same binary?",
            spec.job,
            plan.total_tasks(),
            spec.assignment.len()
        )));
    }
    // Deployment indexes per-task vectors by these: a mask of another length would panic there.
    if spec.deploy_mask.len() != spec.assignment.len() {
        return Err(DeployError::Refused(format!(
            "deployment of job '{}' masks {} subtasks but assigns {}",
            spec.job,
            spec.deploy_mask.len(),
            spec.assignment.len()
        )));
    }
    let storage: Arc<dyn CheckpointStorage> = match &config.checkpoints_dir {
        Some(dir) => Arc::new(FsStorage::open(dir).map_err(|e| e.to_string())?),
        None => Arc::new(MemoryStorage::new()),
    };
    let restored = match &spec.restore {
        Some(r) if r.savepoint => {
            let root = FsStorage::open(&r.root).map_err(|e| e.to_string())?;
            Some(load_dir(&root, "", None)?)
        }
        Some(r) => {
            let root = FsStorage::open(&r.root).map_err(|e| e.to_string())?;
            Some(load_checkpoint(&root, &r.job_id, r.checkpoint_id)?)
        }
        None => None,
    };
    let rt = Arc::new(AttemptRuntime {
        spec: spec.clone(),
        worker_id,
        secret: opts.secret.clone(),
        receivers: Mutex::new(HashMap::new()),
        remote_inputs: Mutex::new(HashSet::new()),
        out_credits: Mutex::new(HashMap::new()),
        return_paths: Mutex::new(HashMap::new()),
        peers: Mutex::new(HashMap::new()),
        sockets: Mutex::new(Vec::new()),
        deployment: Mutex::new(None),
        cancelled: AtomicBool::new(false),
    });
    let hosted: Vec<bool> = spec
        .assignment
        .iter()
        .zip(&spec.deploy_mask)
        .map(|(&w, &m)| m && w == rt.worker_id)
        .collect();
    // Events of local subtasks go to the coordinator.
    let (events_tx, events_rx) = crossbeam_channel::unbounded::<JobEvent>();
    let control2 = control.clone();
    let job_id = spec.job_id.clone();
    std::thread::Builder::new()
        .name("events-forwarder".into())
        .spawn(move || {
            for e in events_rx {
                let event = match e {
                    JobEvent::Ack(a) => WireEvent::Ack(a),
                    JobEvent::Decline {
                        checkpoint_id,
                        attempt,
                        cause,
                    } => WireEvent::Decline {
                        checkpoint_id,
                        attempt,
                        cause,
                    },
                    JobEvent::SourceExhausted { attempt, task } => {
                        WireEvent::SourceExhausted { attempt, task }
                    }
                    JobEvent::Exited {
                        attempt,
                        task,
                        result,
                    } => WireEvent::Exited {
                        attempt,
                        task,
                        error: result.err().as_ref().map(WireTaskError::from),
                    },
                    JobEvent::Lost { .. } => continue,
                };
                if !send(
                    &control2,
                    &ToCoordinator::Event {
                        job_id: job_id.clone(),
                        event,
                    },
                ) {
                    return;
                }
            }
        })
        .map_err(|e| e.to_string())?;
    // Failure injection and progress live as long as the job on this worker, across attempts.
    let (injector, metrics) = {
        let mut jobs = attempts
            .jobs
            .lock()
            .map_err(|_| "worker state poisoned".to_string())?;
        jobs.entry(spec.job_id.clone())
            .or_insert_with(|| {
                let workers = {
                    let mut w = spec.assignment.clone();
                    w.sort_unstable();
                    w.dedup();
                    w.len().max(1) as u64
                };
                let injector = spec.inject.map(|s| {
                    let candidates =
                        plan.vertices_with_head_prefix(&graph, spec.inject_uid.as_deref());
                    Arc::new(FailureInjector::among(
                        candidates,
                        s.count,
                        s.seed ^ u64::from(worker_id),
                        s.expected_records / workers,
                    ))
                });
                (injector, Arc::new(JobMetrics::default()))
            })
            .clone()
    };
    let req = DeployRequest {
        graph: &graph,
        plan: &plan,
        config: &config,
        restored: restored.as_ref(),
        attempt: spec.attempt,
        events: &events_tx,
        storage: &storage,
        job_id: &spec.job_id,
        injector: &injector,
        metrics: &metrics,
        tasks: None,
        sources_stopped: spec.sources_stopped,
    };
    let placement = Placement {
        hosted,
        links: Some(Arc::new(Links(rt.clone()))),
    };
    let deployment = deploy(&req, &placement).map_err(|e| e.to_string())?;
    if let Ok(mut d) = rt.deployment.lock() {
        *d = Some(deployment);
    }
    // Only now may data connections route frames here: every local receiver is registered.
    if let Ok(mut map) = attempts.map.lock() {
        map.insert((spec.job_id.clone(), spec.attempt), rt.clone());
        attempts.changed.notify_all();
    }
    info!(
        "worker {worker_id}: running attempt {} of job {} ({} subtasks)",
        spec.attempt,
        spec.job_id,
        spec.assignment
            .iter()
            .zip(&spec.deploy_mask)
            .filter(|(&w, &m)| m && w == worker_id)
            .count()
    );
    Ok(())
}

/// Runs a worker until the process is killed. Reconnects when the coordinator goes away.
pub fn run_worker(opts: WorkerOptions) -> Result<(), String> {
    let listener = TcpListener::bind(&opts.data_bind).map_err(|e| {
        format!(
            "cannot listen for data connections on {}: {e}",
            opts.data_bind
        )
    })?;
    let data_addr = listener
        .local_addr()
        .map_err(|e| e.to_string())?
        .to_string();
    let attempts = Arc::new(Attempts::default());
    {
        let attempts = attempts.clone();
        let secret = opts.secret.clone();
        std::thread::Builder::new()
            .name("data-accept".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let attempts = attempts.clone();
                    let secret = secret.clone();
                    let _ = std::thread::Builder::new()
                        .name("data-in".into())
                        .spawn(move || serve_data_connection(stream, attempts, secret));
                }
            })
            .map_err(|e| e.to_string())?;
    }
    let coordinator_addr = opts
        .coordinator
        .to_socket_addrs()
        .map_err(|e| format!("bad coordinator address '{}': {e}", opts.coordinator))?
        .next()
        .ok_or_else(|| format!("bad coordinator address '{}'", opts.coordinator))?;
    let mut warned = false;
    loop {
        let stream = match TcpStream::connect_timeout(&coordinator_addr, Duration::from_secs(2)) {
            Ok(s) => s,
            Err(e) => {
                if !warned {
                    warn!(
                        "cannot reach coordinator at {}: {e}; retrying",
                        opts.coordinator
                    );
                    warned = true;
                }
                std::thread::sleep(Duration::from_millis(300));
                continue;
            }
        };
        warned = false;
        match session(stream, &opts, &data_addr, &attempts) {
            Ok(()) => {}
            Err(SessionEnd::Rejected(reason)) => {
                return Err(format!("the coordinator rejected this worker: {reason}"))
            }
            Err(SessionEnd::Lost(reason)) => warn!("lost the coordinator ({reason}); reconnecting"),
        }
        // Without a coordinator, running subtasks can neither checkpoint nor commit: stop them.
        let all: Vec<Arc<AttemptRuntime>> = attempts
            .map
            .lock()
            .map(|mut m| m.drain().map(|(_, v)| v).collect())
            .unwrap_or_default();
        for rt in all {
            rt.cancel();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

enum SessionEnd {
    Rejected(String),
    Lost(String),
}

fn session(
    stream: TcpStream,
    opts: &WorkerOptions,
    data_addr: &str,
    attempts: &Arc<Attempts>,
) -> Result<(), SessionEnd> {
    let _ = stream.set_nodelay(true);
    let mut reader = stream
        .try_clone()
        .map_err(|e| SessionEnd::Lost(e.to_string()))?;
    let writer: Writer = Arc::new(Mutex::new(stream));
    let register = ToCoordinator::Register {
        secret: opts.secret.clone(),
        slots: opts.slots,
        data_addr: data_addr.to_string(),
    };
    if !send(&writer, &register) {
        return Err(SessionEnd::Lost("cannot send registration".into()));
    }
    let mut buf = Vec::new();
    let worker_id = match read_frame::<_, ToWorker>(&mut reader, &mut buf) {
        Ok(ToWorker::Registered { worker_id }) => worker_id,
        Ok(ToWorker::Rejected { reason }) => return Err(SessionEnd::Rejected(reason)),
        Ok(other) => return Err(SessionEnd::Lost(format!("unexpected {other:?}"))),
        Err(e) => return Err(SessionEnd::Lost(e.to_string())),
    };
    info!(
        "registered with the coordinator as worker {worker_id} ({} slots, data on {data_addr})",
        opts.slots
    );
    let alive = Arc::new(AtomicBool::new(true));
    {
        let writer = writer.clone();
        let alive = alive.clone();
        let interval = opts.heartbeat_interval;
        std::thread::Builder::new()
            .name("heartbeat".into())
            .spawn(move || {
                let mut last_report = Instant::now();
                while alive.load(Ordering::Acquire) {
                    if !send(&writer, &ToCoordinator::Heartbeat) {
                        return;
                    }
                    if last_report.elapsed() >= METRICS_REPORT_INTERVAL {
                        last_report = Instant::now();
                        let snapshots: Vec<_> = crate::metrics::registry()
                            .subtasks()
                            .iter()
                            .map(|m| m.snapshot())
                            .collect();
                        if !snapshots.is_empty()
                            && !send(&writer, &ToCoordinator::Metrics(snapshots))
                        {
                            return;
                        }
                    }
                    std::thread::sleep(interval);
                }
            })
            .map_err(|e| SessionEnd::Lost(e.to_string()))?;
    }
    let result = loop {
        let msg = match read_frame::<_, ToWorker>(&mut reader, &mut buf) {
            Ok(m) => m,
            Err(e) => break Err(SessionEnd::Lost(e.to_string())),
        };
        match msg {
            ToWorker::Deploy(spec) => {
                let spec = *spec;
                let (job_id, attempt) = (spec.job_id.clone(), spec.attempt);
                let assigned: Vec<usize> = spec
                    .assignment
                    .iter()
                    .enumerate()
                    .filter(|(t, &w)| w == worker_id && spec.deploy_mask.get(*t) == Some(&true))
                    .map(|(t, _)| t)
                    .collect();
                if let Err(e) = deploy_attempt(spec, worker_id, opts, attempts, &writer) {
                    let error = match e {
                        DeployError::Refused(e) => WireTaskError::Unrecoverable(e),
                        DeployError::Failed(e) => {
                            WireTaskError::Failed(format!("worker {worker_id} cannot deploy: {e}"))
                        }
                    };
                    warn!("cannot deploy attempt {attempt} of job {job_id}: {error:?}");
                    for task in assigned {
                        let _ = send(
                            &writer,
                            &ToCoordinator::Event {
                                job_id: job_id.clone(),
                                event: WireEvent::Exited {
                                    attempt,
                                    task,
                                    error: Some(error.clone()),
                                },
                            },
                        );
                    }
                }
            }
            ToWorker::CheckJob(spec) => {
                let refusal = build_checked(&spec, worker_id, opts).err();
                if let Some(why) = &refusal {
                    warn!("refusing job {}: {why}", spec.job_id);
                }
                let answer = ToCoordinator::JobChecked {
                    job_id: spec.job_id.clone(),
                    attempt: spec.attempt,
                    refusal,
                };
                if !send(&writer, &answer) {
                    break Err(SessionEnd::Lost("cannot answer a job check".into()));
                }
            }
            ToWorker::Mail {
                job_id,
                attempt,
                task,
                mail,
            } => {
                let rt = attempts
                    .map
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&(job_id, attempt)).cloned());
                if let Some(rt) = rt {
                    let mailbox = rt
                        .receivers
                        .lock()
                        .ok()
                        .and_then(|r| r.get(&task).map(|(m, _)| m.clone()));
                    if let Some(m) = mailbox {
                        let _ = m.send(mail.into_mail());
                    }
                }
            }
            ToWorker::CancelAttempt { job_id, attempt } => {
                let rt = attempts
                    .map
                    .lock()
                    .ok()
                    .and_then(|mut m| m.remove(&(job_id.clone(), attempt)));
                let writer = writer.clone();
                let _ = std::thread::Builder::new()
                    .name("cancel".into())
                    .spawn(move || {
                        if let Some(rt) = rt {
                            rt.cancel();
                        }
                        let _ = send(
                            &writer,
                            &ToCoordinator::AttemptCancelled { job_id, attempt },
                        );
                    });
            }
            ToWorker::Registered { .. } | ToWorker::Rejected { .. } => {}
        }
    };
    alive.store(false, Ordering::Release);
    if let Ok(s) = writer.lock() {
        let _ = s.shutdown(Shutdown::Both);
        let _ = (&*s).flush();
    }
    result
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::net::SocketAddr;

    use crossbeam_channel::Receiver;

    use crate::runtime::channel::Barrier;

    use super::*;

    const SECRET: &str = "s3cret";

    /// Log lines written while a closure runs on this thread.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            if let Ok(mut b) = self.0.lock() {
                b.extend_from_slice(bytes);
            }
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Captured {
        fn text(&self) -> String {
            String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
        }
    }

    /// Attempt 0 of job "j" on worker 2: task 1 runs here with input channel 0 fed from worker 1
    /// and channel 1 fed locally; task 0 runs on worker 1, whose data address is `worker_1`.
    fn attempt(worker_1: &str) -> (Arc<Attempts>, Receiver<Mail>, Receiver<Mail>) {
        let rt = Arc::new(AttemptRuntime {
            spec: DeploySpec {
                job_id: "j".into(),
                attempt: 0,
                job: "test".into(),
                params: "null".into(),
                seed: 0,
                fingerprint: String::new(),
                inject: None,
                inject_uid: None,
                checkpoint_dir: None,
                config_yaml: String::new(),
                restore: None,
                assignment: vec![1, 2],
                deploy_mask: vec![true, true],
                workers: vec![(1, worker_1.to_string())],
                sources_stopped: false,
            },
            worker_id: 2,
            secret: SECRET.into(),
            receivers: Mutex::new(HashMap::new()),
            remote_inputs: Mutex::new(HashSet::new()),
            out_credits: Mutex::new(HashMap::new()),
            return_paths: Mutex::new(HashMap::new()),
            peers: Mutex::new(HashMap::new()),
            sockets: Mutex::new(Vec::new()),
            deployment: Mutex::new(None),
            cancelled: AtomicBool::new(false),
        });
        let links = Links(rt.clone());
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ptx, prx) = crossbeam_channel::unbounded();
        links.register_receiver(1, tx, ptx);
        links.credit_return(1, 0);
        let attempts = Arc::new(Attempts::default());
        attempts.map.lock().unwrap().insert(("j".into(), 0), rt);
        (attempts, rx, prx)
    }

    /// A peer's data connection, greeted.
    fn connect(addr: SocketAddr) -> TcpStream {
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let hello = DataMsg::Hello {
            secret: SECRET.into(),
            job_id: "j".into(),
            attempt: 0,
        };
        write_frame(&mut s, &hello).unwrap();
        s
    }

    fn frame(task: u32, channel: u32, frame: DataFrame) -> DataMsg {
        DataMsg::Frame {
            task,
            channel,
            frame,
        }
    }

    #[test]
    fn a_frame_for_an_unknown_channel_closes_only_its_connection() {
        let (attempts, mailbox, priority) = attempt("127.0.0.1:9");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();

        let mut good = connect(addr);
        let (server, _) = listener.accept().unwrap();
        {
            let attempts = attempts.clone();
            std::thread::spawn(move || serve_data_connection(server, attempts, SECRET.into()));
        }
        write_frame(&mut good, &frame(1, 0, DataFrame::Batch(vec![1, 2, 3]))).unwrap();
        let delivered = mailbox.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(
            matches!(&delivered, Mail::Data { channel: 0, element: Element::Encoded(b) } if b == &[1, 2, 3]),
            "{delivered:?}"
        );

        // Out of range, a local (not network-fed) channel, a task not running here, a task
        // beyond the job: each closes its connection and delivers nothing.
        let bad = [
            (1, 7, DataFrame::EndOfStream),
            (1, 1, DataFrame::EndOfStream),
            (0, 0, DataFrame::Batch(vec![4])),
            (
                u32::MAX,
                u32::MAX,
                DataFrame::PriorityBarrier(
                    Barrier {
                        id: 1,
                        timestamp_ms: 0,
                        aligned_only: false,
                        savepoint: false,
                    },
                    1,
                ),
            ),
        ];
        for (task, channel, f) in bad {
            let mut conn = connect(addr);
            write_frame(&mut conn, &frame(task, channel, f)).unwrap();
            let peer = conn.local_addr().unwrap();
            let (server, _) = listener.accept().unwrap();
            let log = Captured::default();
            let subscriber = tracing_subscriber::fmt()
                .with_writer({
                    let log = log.clone();
                    move || log.clone()
                })
                .with_ansi(false)
                .finish();
            let served = {
                let attempts = attempts.clone();
                std::thread::spawn(move || {
                    tracing::subscriber::with_default(subscriber, || {
                        serve_data_connection(server, attempts, SECRET.into())
                    })
                })
            };
            let mut rest = Vec::new();
            let closed = conn.read_to_end(&mut rest);
            assert!(matches!(closed, Ok(0)), "connection not closed: {closed:?}");
            served.join().unwrap();
            let log = log.text();
            assert!(
                log.contains(&format!(
                    "WARN cairn::cluster::worker: data connection from {peer} closed: frame for task {task} channel {channel}, which is not an input channel of attempt 0 of job j fed from another worker"
                )),
                "{log}"
            );
        }
        assert!(mailbox.try_recv().is_err());
        assert!(priority.try_recv().is_err());

        // The worker still serves the good connection.
        write_frame(&mut good, &frame(1, 0, DataFrame::EndOfStream)).unwrap();
        let delivered = mailbox.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(
            matches!(
                delivered,
                Mail::Data {
                    channel: 0,
                    element: Element::EndOfStream
                }
            ),
            "{delivered:?}"
        );
    }

    #[test]
    fn a_credit_for_a_channel_this_worker_does_not_send_to_closes_its_connection() {
        let peer = TcpListener::bind("127.0.0.1:0").unwrap();
        let (attempts, _, _) = attempt(&peer.local_addr().unwrap().to_string());
        let rt = attempts.map.lock().unwrap()[&("j".to_string(), 0)].clone();
        // Task 1's channel 0 on worker 1 is where this worker sends.
        Links(rt).channel_to(0, 0, Credit::new(1)).unwrap();
        let (mut conn, _) = peer.accept().unwrap();
        conn.set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        let mut buf = Vec::new();
        let hello = read_frame::<_, DataMsg>(&mut conn, &mut buf).unwrap();
        assert!(
            matches!(hello, DataMsg::Hello { attempt: 0, .. }),
            "{hello:?}"
        );
        write_frame(
            &mut conn,
            &DataMsg::Credit {
                task: 0,
                channel: 0,
            },
        )
        .unwrap();
        write_frame(
            &mut conn,
            &DataMsg::Credit {
                task: 9,
                channel: 0,
            },
        )
        .unwrap();
        let mut rest = Vec::new();
        let closed = conn.read_to_end(&mut rest);
        assert!(matches!(closed, Ok(0)), "connection not closed: {closed:?}");
    }
}
