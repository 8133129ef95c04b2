//! The worker process: registers with the coordinator, heartbeats, runs the subtasks deployed
//! onto its slots, and exchanges channel data with other workers.
//!
//! One control thread reads the coordinator's messages and never blocks on the network or on
//! a deployment: each deployment runs on a thread of its own (control mail for its subtasks
//! waits, in order, until they run), and a cancellation too. Every cluster socket has a write
//! timeout, and every connect a connect timeout; the coordinator heartbeats to the worker as
//! the worker to the coordinator, so either notices the other's silence. An attempt's
//! subtasks, its data connections and their threads are released when its last local subtask
//! ends (the job finished or failed here) or when it is cancelled.

use std::collections::{HashMap, HashSet};
use std::io::{ErrorKind, Write};
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use tracing::{error, info, warn};

use super::frame::{read_frame, send_or_close as send, write_frame, FrameError};
use super::protocol::{
    secrets_match, DataMsg, DeploySpec, ToCoordinator, ToWorker, WireEvent, WireTaskError,
};
use super::JobFactory;
use crate::checkpoint::{load_checkpoint, load_dir};
use crate::error::TaskError;
use crate::runtime::channel::{
    ChannelSender, ControlMail, Credit, CreditReturn, DataFrame, Element, Mail, RemoteChannel,
};
use crate::runtime::inject::FailureInjector;
use crate::runtime::job::{deploy, plan, DataLinks, DeployRequest, Deployment, Placement};
use crate::runtime::plan::Plan;
use crate::runtime::task::{JobEvent, JobMetrics};
use crate::storage::{CheckpointStorage, FsStorage, MemoryStorage};

/// How to run a worker.
#[derive(Clone)]
pub struct WorkerOptions {
    /// Coordinator addresses (host:port): the leader and its standbys, tried in turn; each
    /// is resolved anew at every attempt (a restarted coordinator may have a new address).
    pub coordinators: Vec<String>,
    /// Task slots offered.
    pub slots: u32,
    /// Shared cluster secret.
    pub secret: String,
    /// Address to listen on for data connections (port 0: any).
    pub data_bind: String,
    /// The address other workers dial for this worker's data port, if not the bound one
    /// (a proxy, a NAT, another interface).
    pub data_advertise: Option<String>,
    /// Builds jobs by name.
    pub factory: Arc<dyn JobFactory>,
    /// Time between heartbeats.
    pub heartbeat_interval: Duration,
    /// Set while the worker is registered with a coordinator (its readiness).
    pub registered: Arc<AtomicBool>,
    /// Its planned departure (SIGTERM).
    pub leave: Arc<Leave>,
}

/// A worker's planned departure (SIGTERM: Kubernetes scales it in or moves it): the worker
/// tells its coordinator it leaves, so its subtasks fail over without spending the jobs'
/// restart budgets, and [`run_worker`] returns once the coordinator closed the connection.
#[derive(Default)]
pub struct Leave {
    requested: AtomicBool,
    /// The control connection of the registered session, if any.
    control: Mutex<Option<Writer>>,
}

impl Leave {
    /// Asks the worker to leave: tells the coordinator, if registered. Returns whether one was
    /// told.
    pub fn request(&self) -> bool {
        self.requested.store(true, Ordering::Release);
        let control = self.control.lock().ok().and_then(|c| c.clone());
        control.is_some_and(|w| send(&w, &ToCoordinator::Leaving))
    }

    fn requested(&self) -> bool {
        self.requested.load(Ordering::Acquire)
    }
}

/// How often a worker reports its subtasks' metrics to the coordinator.
const METRICS_REPORT_INTERVAL: Duration = Duration::from_secs(1);
/// How long a connect to the coordinator or to a peer worker may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// How long registration, or a data connection's greeting, may take: before registration the
/// coordinator's heartbeat timeout is not known.
const GREETING_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the coordinator may take to answer a registration: short, since a coordinator
/// answers it on a thread of its own at once, and a paused one (SIGSTOP) — whose kernel still
/// accepts connections — must not hold the worker from the standby that takes over.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(2);
/// The first pause before reconnecting to the coordinator; it doubles on every failure.
const RECONNECT_PAUSE_MIN: Duration = Duration::from_millis(50);
/// The longest pause between attempts to register with a coordinator that answered.
const RECONNECT_PAUSE_MAX: Duration = Duration::from_secs(2);
/// The longest pause between rounds of attempts to reach coordinators none of which accepts
/// a connection (a leader gone, its standby about to listen).
const UNREACHABLE_PAUSE_MAX: Duration = Duration::from_millis(500);
/// The longest pause when the address answers in another protocol (a misconfiguration that
/// only a person fixes).
const WRONG_PEER_PAUSE_MAX: Duration = Duration::from_secs(30);
/// How long a cancellation waits for a deployment in progress to finish starting.
const DEPLOYING_WAIT: Duration = Duration::from_secs(60);
/// A data connection's direction that carried nothing for this fraction of the I/O timeout
/// gets a keepalive: the reader at its other end gives it up after the whole timeout.
const KEEPALIVES_PER_TIMEOUT: u32 = 4;

/// The control connection's writing end.
type Writer = Arc<Mutex<TcpStream>>;

/// A local subtask's mailbox and priority mailbox.
type Inbox = (Sender<Mail>, Sender<Mail>);

/// Connects to `addr` (any of its addresses) within [`CONNECT_TIMEOUT`].
fn connect(addr: &str) -> std::io::Result<TcpStream> {
    let mut last = None;
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, CONNECT_TIMEOUT) {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(ErrorKind::NotFound, "no address")))
}

/// The writing end of a data connection (on either worker: frames go one way, credits the
/// other), shared by what writes on it and by the attempt's keepalive thread.
struct DataWriter {
    /// Locked for a whole frame.
    out: Mutex<Outgoing>,
    /// The connection again, to shut it down without the lock (which a write to a stalled
    /// peer holds until its timeout).
    socket: TcpStream,
}

struct Outgoing {
    stream: TcpStream,
    /// When a frame was last written (the keepalive thread's measure of idleness).
    written: Instant,
}

impl DataWriter {
    /// The writing end of `stream`, whose writes fail after `write_timeout` without progress.
    fn new(stream: &TcpStream, write_timeout: Duration) -> std::io::Result<Arc<DataWriter>> {
        stream.set_write_timeout(Some(write_timeout))?;
        Ok(Arc::new(DataWriter {
            out: Mutex::new(Outgoing {
                stream: stream.try_clone()?,
                written: Instant::now(),
            }),
            socket: stream.try_clone()?,
        }))
    }

    /// Writes one message. A failed write closes the connection: a frame written in part
    /// leaves the stream unreadable, and a write that timed out means the peer takes no bytes.
    fn send(&self, msg: &DataMsg) -> Result<(), FrameError> {
        let mut out = self.out.lock().map_err(|_| FrameError::Closed)?;
        Self::write(&mut out, msg, &self.socket)
    }

    fn write(out: &mut Outgoing, msg: &DataMsg, socket: &TcpStream) -> Result<(), FrameError> {
        match write_frame(&mut out.stream, msg) {
            Ok(()) => {
                out.written = Instant::now();
                Ok(())
            }
            Err(e) => {
                let _ = socket.shutdown(Shutdown::Both);
                Err(e)
            }
        }
    }

    /// Sends a keepalive if nothing was written for `idle`. A writer holding the lock is
    /// writing: the direction is not idle, and the keepalive thread does not wait for it.
    fn keep_alive(&self, idle: Duration) {
        let Ok(mut out) = self.out.try_lock() else {
            return;
        };
        if out.written.elapsed() >= idle {
            let _ = Self::write(&mut out, &DataMsg::Keepalive, &self.socket);
        }
    }

    fn shutdown(&self, how: Shutdown) {
        let _ = self.socket.shutdown(how);
    }
}

/// Where an attempt is on this worker.
enum Phase {
    /// Its deployment thread builds it; control mail for its subtasks waits here, in order.
    Deploying(Vec<(usize, ControlMail)>),
    /// Its subtasks run; data connections may route to them.
    Running,
    /// Cancelled, failed to deploy or released: nothing is delivered to it any more.
    Ended,
}

/// The reader threads of an attempt's data connections that are still running.
#[derive(Default)]
struct Readers {
    count: Mutex<usize>,
    changed: Condvar,
}

/// Counts one reader thread while it lives.
struct ReaderGuard(Arc<Readers>);

impl ReaderGuard {
    fn new(readers: &Arc<Readers>) -> Self {
        if let Ok(mut n) = readers.count.lock() {
            *n += 1;
        }
        ReaderGuard(readers.clone())
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        if let Ok(mut n) = self.0.count.lock() {
            *n -= 1;
            self.0.changed.notify_all();
        }
    }
}

/// One attempt's subtasks on this worker and their network endpoints.
struct AttemptRuntime {
    spec: DeploySpec,
    worker_id: u32,
    secret: String,
    /// Write and read timeout of its data connections (a reader that hears neither data nor
    /// keepalives for this long gives the connection up); also how long a release waits for
    /// peers to close them.
    io_timeout: Duration,
    receivers: Mutex<HashMap<usize, Inbox>>,
    /// `(task, channel)` of every input channel of a local task fed from another worker: the
    /// only addresses a data frame from the network may name.
    remote_inputs: Mutex<HashSet<(usize, usize)>>,
    out_credits: Mutex<HashMap<(usize, usize), Arc<Credit>>>,
    return_paths: Mutex<HashMap<(usize, usize), Arc<DataWriter>>>,
    peers: Mutex<HashMap<u32, Arc<DataWriter>>>,
    /// Every data connection of the attempt: to keep them alive while it runs, and to close
    /// them when it ends.
    connections: Mutex<Vec<Arc<DataWriter>>>,
    readers: Arc<Readers>,
    deployment: Mutex<Option<Deployment>>,
    phase: Mutex<Phase>,
    phase_changed: Condvar,
    /// Set once it is cancelled or released: broken connections are expected from then on.
    ended: AtomicBool,
}

impl AttemptRuntime {
    fn new(spec: DeploySpec, worker_id: u32, secret: String, io_timeout: Duration) -> Self {
        AttemptRuntime {
            spec,
            worker_id,
            secret,
            io_timeout,
            receivers: Mutex::new(HashMap::new()),
            remote_inputs: Mutex::new(HashSet::new()),
            out_credits: Mutex::new(HashMap::new()),
            return_paths: Mutex::new(HashMap::new()),
            peers: Mutex::new(HashMap::new()),
            connections: Mutex::new(Vec::new()),
            readers: Arc::default(),
            deployment: Mutex::new(None),
            phase: Mutex::new(Phase::Deploying(Vec::new())),
            phase_changed: Condvar::new(),
            ended: AtomicBool::new(false),
        }
    }

    fn key(&self) -> (String, u32) {
        (self.spec.job_id.clone(), self.spec.attempt)
    }

    /// Keeps a data connection alive while the attempt runs and closes it when the attempt
    /// ends; closes it at once (false) if the attempt already ended.
    fn track(&self, connection: &Arc<DataWriter>) -> bool {
        let Ok(mut connections) = self.connections.lock() else {
            return false;
        };
        if self.ended.load(Ordering::Acquire) {
            connection.shutdown(Shutdown::Both);
            return false;
        }
        connections.push(connection.clone());
        true
    }

    fn peer(self: &Arc<Self>, worker: u32) -> Result<Arc<DataWriter>, TaskError> {
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
        let stream = connect(&addr).map_err(|e| {
            TaskError::msg(format!("cannot connect to worker {worker} at {addr}: {e}"))
        })?;
        let _ = stream.set_nodelay(true);
        // The peer sends credits or keepalives several times within the timeout.
        let writer = stream
            .set_read_timeout(Some(self.io_timeout))
            .and_then(|()| DataWriter::new(&stream, self.io_timeout))
            .map_err(|e| TaskError::msg(format!("data connection to {addr}: {e}")))?;
        let reader = stream;
        if !self.track(&writer) {
            return Err(TaskError::Cancelled);
        }
        let hello = DataMsg::Hello {
            secret: self.secret.clone(),
            job_id: self.spec.job_id.clone(),
            attempt: self.spec.attempt,
        };
        if writer.send(&hello).is_err() {
            return Err(TaskError::msg(format!(
                "cannot greet worker {worker} at {addr}"
            )));
        }
        // Credits come back on the same connection.
        let me = Arc::downgrade(self);
        let guard = ReaderGuard::new(&self.readers);
        std::thread::Builder::new()
            .name(format!("credits-from-{worker}"))
            .spawn(move || {
                let _guard = guard;
                read_credits(reader, worker, &addr, &me);
            })
            .map_err(|e| TaskError::msg(format!("cannot start a thread: {e}")))?;
        peers.insert(worker, writer.clone());
        Ok(writer)
    }

    /// A data connection to `worker` broke while the attempt runs: its senders stop waiting
    /// for credits that will not come (the subtasks fail, and the attempt is restarted).
    fn lost_peer(&self, worker: u32) {
        let credits: Vec<Arc<Credit>> = self
            .out_credits
            .lock()
            .map(|m| {
                m.iter()
                    .filter(|((task, _), _)| self.spec.assignment.get(*task) == Some(&worker))
                    .map(|(_, c)| c.clone())
                    .collect()
            })
            .unwrap_or_default();
        for c in credits {
            c.close();
        }
    }

    /// Delivers a frame from the network to input channel `channel` of local task `task`.
    fn route(
        &self,
        task: usize,
        channel: usize,
        frame: DataFrame,
        from: &Arc<DataWriter>,
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

    /// Control mail for local task `task`: delivered if the attempt runs, kept (in order) while
    /// it deploys, dropped once it ended.
    fn mail(&self, task: usize, mail: ControlMail) {
        let Ok(mut phase) = self.phase.lock() else {
            return;
        };
        match &mut *phase {
            Phase::Deploying(waiting) => waiting.push((task, mail)),
            Phase::Running => self.deliver(task, mail),
            Phase::Ended => {}
        }
    }

    fn deliver(&self, task: usize, mail: ControlMail) {
        let mailbox = self
            .receivers
            .lock()
            .ok()
            .and_then(|r| r.get(&task).map(|(m, _)| m.clone()));
        if let Some(m) = mailbox {
            let _ = m.send(mail.into_mail());
        }
    }

    /// The deployment started: its subtasks get the mail that waited, and data connections may
    /// route to them. Gives the deployment back if the attempt ended meanwhile.
    fn started(&self, deployment: Deployment) -> Result<(), Deployment> {
        let Ok(mut phase) = self.phase.lock() else {
            return Err(deployment);
        };
        let Phase::Deploying(waiting) = std::mem::replace(&mut *phase, Phase::Running) else {
            *phase = Phase::Ended;
            return Err(deployment);
        };
        if let Ok(mut d) = self.deployment.lock() {
            *d = Some(deployment);
        }
        for (task, mail) in waiting {
            self.deliver(task, mail);
        }
        self.phase_changed.notify_all();
        Ok(())
    }

    /// Its deployment failed: nothing will start, and nobody is to wait for it.
    fn abandon(&self) {
        self.ended.store(true, Ordering::Release);
        if let Ok(mut phase) = self.phase.lock() {
            *phase = Phase::Ended;
            self.phase_changed.notify_all();
        }
    }

    /// Marks the attempt ended, once a deployment in progress finished starting (or
    /// [`DEPLOYING_WAIT`] passed); returns the deployment to stop or join.
    fn end(&self) -> Option<Deployment> {
        self.ended.store(true, Ordering::Release);
        if let Ok(phase) = self.phase.lock() {
            let deadline = Instant::now() + DEPLOYING_WAIT;
            let mut phase = wait_while_deploying(&self.phase_changed, phase, deadline);
            *phase = Phase::Ended;
            self.phase_changed.notify_all();
        }
        self.deployment.lock().ok().and_then(|mut d| d.take())
    }

    /// Waits until the attempt's deployment finished starting (true if its subtasks run) or
    /// `deadline` passed.
    fn wait_running(&self, deadline: Instant) -> bool {
        let Ok(phase) = self.phase.lock() else {
            return false;
        };
        let phase = wait_while_deploying(&self.phase_changed, phase, deadline);
        matches!(*phase, Phase::Running)
    }

    /// Stops every subtask. The data connections are closed first: a subtask blocked writing
    /// to one must not keep the cancellation waiting.
    fn cancel(&self) {
        self.ended.store(true, Ordering::Release);
        self.close_sockets(Shutdown::Both);
        if let Some(d) = self.end() {
            d.cancel();
        }
        self.forget_connections();
    }

    /// Releases an attempt whose local subtasks all ended: their threads are joined, its data
    /// connections closed — this side's writing half at once (whatever was written still
    /// arrives), the rest when the peers closed theirs or after the I/O timeout.
    fn release(&self) {
        if let Some(d) = self.end() {
            d.join();
        }
        self.close_sockets(Shutdown::Write);
        let deadline = Instant::now() + self.io_timeout;
        if let Ok(mut n) = self.readers.count.lock() {
            while *n > 0 {
                let now = Instant::now();
                if now >= deadline {
                    break;
                }
                n = match self.readers.changed.wait_timeout(n, deadline - now) {
                    Ok((n, _)) => n,
                    Err(_) => break,
                };
            }
        }
        self.close_sockets(Shutdown::Both);
        self.forget_connections();
    }

    fn close_sockets(&self, how: Shutdown) {
        if let Ok(connections) = self.connections.lock() {
            for c in connections.iter() {
                c.shutdown(how);
            }
        }
    }

    /// Sends a keepalive on every data connection that carried nothing for `idle`.
    fn keep_alive(&self, idle: Duration) {
        let connections = self
            .connections
            .lock()
            .map(|c| c.clone())
            .unwrap_or_default();
        for c in connections {
            c.keep_alive(idle);
        }
    }

    /// Drops this attempt's handles on its connections and mailboxes, so that nothing of them
    /// outlives it.
    fn forget_connections(&self) {
        if let Ok(mut c) = self.connections.lock() {
            c.clear();
        }
        if let Ok(mut p) = self.peers.lock() {
            p.clear();
        }
        if let Ok(mut p) = self.return_paths.lock() {
            p.clear();
        }
        if let Ok(mut r) = self.receivers.lock() {
            r.clear();
        }
        if let Ok(mut c) = self.out_credits.lock() {
            c.clear();
        }
    }
}

fn wait_while_deploying<'a>(
    changed: &Condvar,
    mut phase: MutexGuard<'a, Phase>,
    deadline: Instant,
) -> MutexGuard<'a, Phase> {
    while matches!(*phase, Phase::Deploying(_)) {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        phase = match changed.wait_timeout(phase, deadline - now) {
            Ok((p, _)) => p,
            Err(e) => e.into_inner().0,
        };
    }
    phase
}

/// Starts the thread that keeps the attempt's data connections alive until it ends: every
/// direction idle for a fraction of the I/O timeout gets a keepalive, so that the reader at the
/// other end, which gives a connection up after a whole timeout of silence, tells a stalled
/// link from a job that has no data to send.
fn start_keepalives(rt: &Arc<AttemptRuntime>) -> std::io::Result<()> {
    let rt = rt.clone();
    let idle = (rt.io_timeout / KEEPALIVES_PER_TIMEOUT).max(Duration::from_millis(1));
    std::thread::Builder::new()
        .name("data-keepalive".into())
        .spawn(move || loop {
            // Twice per idle period: a direction waits at most one and a half for its keepalive.
            {
                let Ok(phase) = rt.phase.lock() else { return };
                let waited = rt
                    .phase_changed
                    .wait_timeout_while(phase, idle / 2, |p| !matches!(p, Phase::Ended));
                match waited {
                    Ok((phase, _)) if !matches!(*phase, Phase::Ended) => {}
                    _ => return,
                }
            }
            rt.keep_alive(idle);
        })
        .map(|_| ())
}

/// The loop of the thread reading credits from peer `worker` on a connection this worker
/// opened to send it data.
fn read_credits(
    mut reader: TcpStream,
    worker: u32,
    addr: &str,
    rt: &std::sync::Weak<AttemptRuntime>,
) {
    let mut buf = Vec::new();
    loop {
        let msg = read_frame::<_, DataMsg>(&mut reader, &mut buf);
        let Some(rt) = rt.upgrade() else { return };
        let broken = match msg {
            Ok(DataMsg::Credit { task, channel }) => {
                let credit = rt
                    .out_credits
                    .lock()
                    .ok()
                    .and_then(|m| m.get(&(task as usize, channel as usize)).cloned());
                match credit {
                    Some(c) => {
                        c.release();
                        continue;
                    }
                    None => format!("credit for task {task} channel {channel}, which this worker does not send to"),
                }
            }
            Ok(DataMsg::Keepalive) => continue,
            Ok(other) => format!("expected a credit, got {other:?}"),
            // The peer closed the connection: its subtasks ended (and had every frame), or
            // its attempt did. No credit comes any more.
            Err(FrameError::Closed) => {
                if !rt.ended.load(Ordering::Acquire) {
                    rt.lost_peer(worker);
                }
                return;
            }
            // Silence is a broken connection: a live peer sends keepalives when idle.
            Err(e) if e.timed_out() => {
                format!("no data or keepalive for {:?}", rt.io_timeout)
            }
            Err(e) => e.to_string(),
        };
        if !rt.ended.load(Ordering::Acquire) {
            warn!("data connection to worker {worker} ({addr}) closed: {broken}");
            rt.lost_peer(worker);
        }
        let _ = reader.shutdown(Shutdown::Both);
        return;
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
    writer: Arc<DataWriter>,
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
        self.writer
            .send(&msg)
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
            let _ = w.send(&DataMsg::Credit {
                task: self.task,
                channel: self.channel,
            });
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
    /// The attempt once this worker was told to deploy it (it may still be deploying); None
    /// if that did not happen by `deadline`.
    fn find(&self, job: &str, attempt: u32, deadline: Instant) -> Option<Arc<AttemptRuntime>> {
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

    fn insert(&self, rt: Arc<AttemptRuntime>) {
        if let Ok(mut map) = self.map.lock() {
            map.insert(rt.key(), rt);
            self.changed.notify_all();
        }
    }

    /// Forgets attempt `rt` (not another one under its key).
    fn remove(&self, rt: &Arc<AttemptRuntime>) {
        if let Ok(mut map) = self.map.lock() {
            if map.get(&rt.key()).is_some_and(|r| Arc::ptr_eq(r, rt)) {
                map.remove(&rt.key());
            }
        }
    }

    /// Forgets every job's state on this worker (failure injector, counters, metric series).
    fn forget_jobs(&self) {
        let jobs: Vec<String> = self
            .jobs
            .lock()
            .map(|mut j| j.drain().map(|(id, _)| id).collect())
            .unwrap_or_default();
        for job_id in jobs {
            crate::metrics::forget_job(&job_id);
        }
    }

    /// Cancels every attempt (the coordinator is gone: nothing can checkpoint or commit).
    fn cancel_all(&self) {
        let all: Vec<Arc<AttemptRuntime>> = self
            .map
            .lock()
            .map(|mut m| m.drain().map(|(_, v)| v).collect())
            .unwrap_or_default();
        for rt in all {
            rt.cancel();
        }
    }
}

fn serve_data_connection(stream: TcpStream, attempts: Arc<Attempts>, secret: String) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let _ = stream.set_nodelay(true);
    // A connection that does not even greet must not hold this thread.
    let _ = stream.set_read_timeout(Some(GREETING_TIMEOUT));
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
    // The connecting worker may be a little ahead of our own deployment of the attempt. While
    // that deployment finishes starting, keepalives already go back: the peer's reader must
    // not take a slow start for a dead link.
    let deadline = Instant::now() + GREETING_TIMEOUT;
    let Some(rt) = attempts.find(&job_id, attempt, deadline) else {
        warn!("data connection from {peer} closed: attempt {attempt} of job {job_id} is not deployed here");
        return;
    };
    let Ok(writer) = DataWriter::new(&reader, rt.io_timeout) else {
        return;
    };
    if !rt.track(&writer) {
        return;
    }
    if !rt.wait_running(deadline) {
        if !rt.ended.load(Ordering::Acquire) {
            warn!("data connection from {peer} closed: attempt {attempt} of job {job_id} is not deployed here");
        }
        let _ = reader.shutdown(Shutdown::Both);
        return;
    }
    // Data may pause for as long as the job has none, but the peer sends keepalives: silence
    // for the I/O timeout is a dead link.
    let _ = reader.set_read_timeout(Some(rt.io_timeout));
    let _guard = ReaderGuard::new(&rt.readers);
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
                    if !rt.ended.load(Ordering::Acquire) {
                        warn!("data connection from {peer} closed: frame for task {task}, which is not running here");
                    }
                    break;
                }
            },
            Ok(DataMsg::Keepalive) => {}
            Ok(other) => {
                warn!("data connection from {peer} closed: unexpected {other:?}");
                break;
            }
            Err(FrameError::Closed) => break,
            Err(e) => {
                if !rt.ended.load(Ordering::Acquire) {
                    if e.timed_out() {
                        warn!(
                            "data connection from {peer} closed: no data or keepalive for {:?}",
                            rt.io_timeout
                        );
                    } else {
                        warn!("data connection from {peer} closed: {e}");
                    }
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

/// What the threads of a registered worker share: who it is, and where its control
/// connection is.
#[derive(Clone)]
struct Session {
    worker_id: u32,
    opts: WorkerOptions,
    attempts: Arc<Attempts>,
    control: Writer,
    /// The coordinator's heartbeat timeout: silence for this long means it is gone; also the
    /// write timeout of every cluster socket.
    io_timeout: Duration,
}

impl Session {
    /// Starts deploying attempt `spec` on a thread of its own; the control thread goes on.
    /// The attempt is known at once, so that control mail for it waits for its subtasks and a
    /// cancellation stops it even while it deploys.
    fn deploy(&self, spec: DeploySpec) {
        let rt = Arc::new(AttemptRuntime::new(
            spec,
            self.worker_id,
            self.opts.secret.clone(),
            self.io_timeout,
        ));
        self.attempts.insert(rt.clone());
        let session = self.clone();
        let spawned = std::thread::Builder::new().name("deploy".into()).spawn({
            let rt = rt.clone();
            move || session.run_deployment(&rt)
        });
        if let Err(e) = spawned {
            self.deployment_failed(
                &rt,
                DeployError::Failed(format!("cannot start a thread: {e}")),
            );
        }
    }

    fn run_deployment(&self, rt: &Arc<AttemptRuntime>) {
        if let Err(e) = deploy_attempt(rt, self) {
            self.deployment_failed(rt, e);
        }
    }

    /// Reports every subtask the attempt was to run here as failed, and forgets the attempt.
    fn deployment_failed(&self, rt: &Arc<AttemptRuntime>, e: DeployError) {
        let spec = &rt.spec;
        let error = match e {
            DeployError::Refused(e) => WireTaskError::Unrecoverable(e),
            DeployError::Failed(e) => {
                WireTaskError::Failed(format!("worker {} cannot deploy: {e}", self.worker_id))
            }
        };
        if !rt.ended.load(Ordering::Acquire) {
            warn!(
                "cannot deploy attempt {} of job {}: {error:?}",
                spec.attempt, spec.job_id
            );
        }
        rt.abandon();
        rt.cancel();
        self.attempts.remove(rt);
        let assigned = spec
            .assignment
            .iter()
            .enumerate()
            .filter(|(t, &w)| w == self.worker_id && spec.deploy_mask.get(*t) == Some(&true));
        for (task, _) in assigned {
            let _ = send(
                &self.control,
                &ToCoordinator::Event {
                    job_id: spec.job_id.clone(),
                    event: WireEvent::Exited {
                        attempt: spec.attempt,
                        task,
                        error: Some(error.clone()),
                    },
                },
            );
        }
    }

    /// Stops attempt `(job_id, attempt)` on a thread of its own and confirms it to the
    /// coordinator once its subtasks stopped.
    fn cancel(&self, job_id: String, attempt: u32) {
        let rt = self
            .attempts
            .map
            .lock()
            .ok()
            .and_then(|mut m| m.remove(&(job_id.clone(), attempt)));
        let control = self.control.clone();
        let _ = std::thread::Builder::new()
            .name("cancel".into())
            .spawn(move || {
                if let Some(rt) = rt {
                    rt.cancel();
                }
                let _ = send(
                    &control,
                    &ToCoordinator::AttemptCancelled { job_id, attempt },
                );
            });
    }

    /// Job `job_id` ended: on a thread of its own, cancels any attempt of it still here, then
    /// forgets the job (its failure injector, its counters, its subtasks' metric series).
    fn job_ended(&self, job_id: String) {
        let left: Vec<Arc<AttemptRuntime>> = self
            .attempts
            .map
            .lock()
            .map(|mut m| {
                let keys: Vec<(String, u32)> =
                    m.keys().filter(|(j, _)| *j == job_id).cloned().collect();
                keys.iter().filter_map(|k| m.remove(k)).collect()
            })
            .unwrap_or_default();
        let (attempts, worker_id) = (self.attempts.clone(), self.worker_id);
        let _ = std::thread::Builder::new()
            .name("forget-job".into())
            .spawn(move || {
                let cancelled = left.len();
                for rt in left {
                    rt.cancel();
                }
                // After the cancellations: a deployment they waited for may have added it.
                let kept = attempts
                    .jobs
                    .lock()
                    .is_ok_and(|mut jobs| jobs.remove(&job_id).is_some());
                crate::metrics::forget_job(&job_id);
                if kept || cancelled > 0 {
                    info!(
                        "worker {worker_id}: forgot job {job_id} (cancelled {cancelled} attempts still here)"
                    );
                }
            });
    }

    fn mail(&self, job_id: String, attempt: u32, task: usize, mail: ControlMail) {
        let rt = self
            .attempts
            .map
            .lock()
            .ok()
            .and_then(|m| m.get(&(job_id, attempt)).cloned());
        if let Some(rt) = rt {
            rt.mail(task, mail);
        }
    }
}

/// Forwards the events of an attempt's local subtasks to the coordinator until every sender
/// is gone — every local subtask and snapshot uploader ended — then releases the attempt.
fn forward_events(
    events: crossbeam_channel::Receiver<JobEvent>,
    rt: &Arc<AttemptRuntime>,
    session: &Session,
) {
    let mut connected = true;
    for e in events {
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
            JobEvent::Lost { .. } | JobEvent::Finalized(_) => continue,
        };
        let event = ToCoordinator::Event {
            job_id: rt.spec.job_id.clone(),
            event,
        };
        // Without a coordinator the session ends and cancels the attempt; until then the
        // events are drained, so that the end of the attempt is still seen here.
        connected = connected && send(&session.control, &event);
    }
    rt.release();
    session.attempts.remove(rt);
    info!(
        "worker {}: released attempt {} of job {}",
        rt.worker_id, rt.spec.attempt, rt.spec.job_id
    );
}

fn deploy_attempt(rt: &Arc<AttemptRuntime>, session: &Session) -> Result<(), DeployError> {
    let spec = &rt.spec;
    let worker_id = session.worker_id;
    // From the start: peers may connect while this deployment builds the job or reads its
    // checkpoint.
    start_keepalives(rt).map_err(|e| format!("cannot start a thread: {e}"))?;
    let (graph, config, plan) =
        build_checked(spec, worker_id, &session.opts).map_err(DeployError::Refused)?;
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
    let hosted: Vec<bool> = spec
        .assignment
        .iter()
        .zip(&spec.deploy_mask)
        .map(|(&w, &m)| m && w == worker_id)
        .collect();
    // Events of local subtasks go to the coordinator.
    let (events_tx, events_rx) = crossbeam_channel::unbounded::<JobEvent>();
    {
        let (rt, session) = (rt.clone(), session.clone());
        std::thread::Builder::new()
            .name("events-forwarder".into())
            .spawn(move || forward_events(events_rx, &rt, &session))
            .map_err(|e| e.to_string())?;
    }
    // Failure injection and progress live as long as the job on this worker, across attempts.
    let (injector, metrics) = {
        let mut jobs = session
            .attempts
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
    // Only now may data connections route frames here: every local receiver is registered.
    if let Err(late) = rt.started(deployment) {
        // Cancelled while deploying, and the cancellation stopped waiting for it.
        late.cancel();
        return Ok(());
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

/// The pause before the next attempt to reach the coordinator: doubling from
/// [`RECONNECT_PAUSE_MIN`] up to a cap.
struct Backoff(Duration);

impl Backoff {
    fn new() -> Self {
        Backoff(RECONNECT_PAUSE_MIN)
    }

    fn pause(&mut self, cap: Duration) -> Duration {
        let pause = self.0.min(cap);
        self.0 = (self.0 * 2).min(cap);
        pause
    }
}

/// Runs a worker until the process is killed. Reconnects when the coordinator goes away.
pub fn run_worker(opts: WorkerOptions) -> Result<(), String> {
    let listener = TcpListener::bind(&opts.data_bind).map_err(|e| {
        format!(
            "cannot listen for data connections on {}: {e}",
            opts.data_bind
        )
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| e.to_string())?
        .to_string();
    let data_addr = match &opts.data_advertise {
        Some(addr) => {
            info!("listening for data on {bound}, advertised to other workers as {addr}");
            addr.clone()
        }
        None => bound,
    };
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
    if opts.coordinators.is_empty() {
        return Err("no coordinator address".into());
    }
    let mut backoff = Backoff::new();
    // What went wrong last time, logged once until something else happens.
    let mut last_problem: Option<String> = None;
    // The coordinator to try next, and how many were tried since one answered.
    let mut next = 0usize;
    let mut tried = 0usize;
    loop {
        if opts.leave.requested() {
            attempts.cancel_all();
            attempts.forget_jobs();
            info!("left the cluster");
            return Ok(());
        }
        let address = &opts.coordinators[next % opts.coordinators.len()];
        next += 1;
        tried += 1;
        let (problem, cap) = match connect(address) {
            // Cheap to retry: a standby that takes over listens within moments.
            Err(e) => (
                format!("cannot reach coordinator at {address}: {e}; retrying"),
                UNREACHABLE_PAUSE_MAX,
            ),
            Ok(stream) => match session(stream, &opts, &data_addr, &attempts) {
                SessionEnd::Rejected(reason) => {
                    return Err(format!("the coordinator rejected this worker: {reason}"))
                }
                SessionEnd::Lost(_) if opts.leave.requested() => {
                    (String::new(), RECONNECT_PAUSE_MAX)
                }
                SessionEnd::Lost(reason) => {
                    warn!("lost the coordinator ({reason}) at {address}; reconnecting");
                    last_problem = None;
                    backoff = Backoff::new();
                    tried = 0;
                    (String::new(), RECONNECT_PAUSE_MAX)
                }
                SessionEnd::Unregistered { http: true, .. } => (
                    format!(
                        "coordinator at {address} answered in HTTP: is this the REST port? workers connect to the coordinator's --bind port; retrying"
                    ),
                    WRONG_PEER_PAUSE_MAX,
                ),
                SessionEnd::Unregistered {
                    reason,
                    http: false,
                } => (
                    format!(
                        "cannot register with the coordinator at {address}: {reason}; retrying"
                    ),
                    RECONNECT_PAUSE_MAX,
                ),
            },
        };
        if !problem.is_empty() && last_problem.as_ref() != Some(&problem) {
            if cap == WRONG_PEER_PAUSE_MAX {
                error!("{problem}");
            } else {
                warn!("{problem}");
            }
            last_problem = Some(problem);
        }
        // Without a coordinator, running subtasks can neither checkpoint nor commit: stop them,
        // and forget the jobs (their end would never be told to this worker).
        attempts.cancel_all();
        attempts.forget_jobs();
        // The other coordinators first (a standby may lead now); a pause once all were tried.
        if tried >= opts.coordinators.len() {
            tried = 0;
            std::thread::sleep(backoff.pause(cap));
        }
    }
}

enum SessionEnd {
    /// The coordinator refused this worker.
    Rejected(String),
    /// Registration did not happen; `http`: the address answered in HTTP.
    Unregistered { reason: String, http: bool },
    /// The registered session ended.
    Lost(String),
}

/// Registers with the coordinator on `stream`: returns the worker's id and the coordinator's
/// heartbeat timeout.
fn register(
    stream: &TcpStream,
    reader: &mut TcpStream,
    opts: &WorkerOptions,
    data_addr: &str,
) -> Result<(u32, Duration), SessionEnd> {
    let unregistered = |reason: String, http: bool| SessionEnd::Unregistered { reason, http };
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(REGISTER_TIMEOUT));
    let _ = stream.set_write_timeout(Some(REGISTER_TIMEOUT));
    let register = ToCoordinator::Register {
        secret: opts.secret.clone(),
        slots: opts.slots,
        data_addr: data_addr.to_string(),
    };
    let mut w = stream;
    write_frame(&mut w, &register).map_err(|e| unregistered(e.to_string(), false))?;
    let mut buf = Vec::new();
    match read_frame::<_, ToWorker>(reader, &mut buf) {
        Ok(ToWorker::Registered {
            worker_id,
            heartbeat_timeout_ms,
        }) => Ok((
            worker_id,
            Duration::from_millis(heartbeat_timeout_ms.max(1)),
        )),
        Ok(ToWorker::Rejected { reason }) => Err(SessionEnd::Rejected(reason)),
        Ok(other) => Err(unregistered(format!("unexpected {other:?}"), false)),
        Err(e) => {
            let http = e.speaks_http();
            Err(unregistered(e.to_string(), http))
        }
    }
}

fn session(
    stream: TcpStream,
    opts: &WorkerOptions,
    data_addr: &str,
    attempts: &Arc<Attempts>,
) -> SessionEnd {
    let mut reader = match stream.try_clone() {
        Ok(r) => r,
        Err(e) => {
            return SessionEnd::Unregistered {
                reason: e.to_string(),
                http: false,
            }
        }
    };
    let (worker_id, io_timeout) = match register(&stream, &mut reader, opts, data_addr) {
        Ok(r) => r,
        Err(end) => return end,
    };
    // The coordinator heartbeats several times within its timeout: silence for that long
    // means it is gone, even if the connection looks open.
    let _ = stream.set_read_timeout(Some(io_timeout));
    let _ = stream.set_write_timeout(Some(io_timeout));
    info!(
        "registered with the coordinator as worker {worker_id} ({} slots, data on {data_addr})",
        opts.slots
    );
    opts.registered.store(true, Ordering::Release);
    let end = serve_session(stream, reader, opts, attempts, worker_id, io_timeout);
    opts.registered.store(false, Ordering::Release);
    if let Ok(mut c) = opts.leave.control.lock() {
        *c = None;
    }
    end
}

/// The registered session with the coordinator, until it ends.
fn serve_session(
    stream: TcpStream,
    mut reader: TcpStream,
    opts: &WorkerOptions,
    attempts: &Arc<Attempts>,
    worker_id: u32,
    io_timeout: Duration,
) -> SessionEnd {
    let session = Session {
        worker_id,
        opts: opts.clone(),
        attempts: attempts.clone(),
        control: Arc::new(Mutex::new(stream)),
        io_timeout,
    };
    let alive = Arc::new(AtomicBool::new(true));
    if let Err(e) = start_heartbeats(&session, &alive) {
        return SessionEnd::Lost(e);
    }
    if let Ok(mut c) = opts.leave.control.lock() {
        *c = Some(session.control.clone());
    }
    // Asked to leave before the session began: say so now.
    if opts.leave.requested() {
        opts.leave.request();
    }
    let mut buf = Vec::new();
    let reason = loop {
        let msg = match read_frame::<_, ToWorker>(&mut reader, &mut buf) {
            Ok(m) => m,
            Err(e) if e.timed_out() => {
                break format!("no heartbeat from the coordinator for {io_timeout:?}");
            }
            Err(e) => break e.to_string(),
        };
        match msg {
            ToWorker::Deploy(spec) => session.deploy(*spec),
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
                if !send(&session.control, &answer) {
                    break "cannot answer a job check".into();
                }
            }
            ToWorker::Mail {
                job_id,
                attempt,
                task,
                mail,
            } => session.mail(job_id, attempt, task, mail),
            ToWorker::CancelAttempt { job_id, attempt } => session.cancel(job_id, attempt),
            ToWorker::JobEnded { job_id } => session.job_ended(job_id),
            ToWorker::Heartbeat | ToWorker::Registered { .. } | ToWorker::Rejected { .. } => {}
        }
    };
    alive.store(false, Ordering::Release);
    if let Ok(s) = session.control.lock() {
        let _ = s.shutdown(Shutdown::Both);
        let _ = (&*s).flush();
    }
    SessionEnd::Lost(reason)
}

/// Starts the thread that heartbeats (and reports metrics) to the coordinator while `alive`.
fn start_heartbeats(session: &Session, alive: &Arc<AtomicBool>) -> Result<(), String> {
    let writer = session.control.clone();
    let alive = alive.clone();
    let interval = session.opts.heartbeat_interval;
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
                    // Also when empty: a report replaces the last, so the coordinator forgets
                    // the series of subtasks that ended here.
                    if !send(&writer, &ToCoordinator::Metrics(snapshots)) {
                        return;
                    }
                }
                std::thread::sleep(interval);
            }
        })
        .map(|_| ())
        .map_err(|e| e.to_string())
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

        /// A log subscriber writing into this capture.
        fn subscriber(&self) -> impl tracing::Subscriber + Send + Sync {
            let log = self.clone();
            tracing_subscriber::fmt()
                .with_writer(move || log.clone())
                .with_ansi(false)
                .finish()
        }
    }

    /// Attempt 0 of job "j" on worker 2: task 1 runs here with input channel 0 fed from worker 1
    /// and channel 1 fed locally; task 0 runs on worker 1, whose data address is `worker_1`.
    fn attempt(worker_1: &str) -> (Arc<Attempts>, Receiver<Mail>, Receiver<Mail>) {
        attempt_timing_out(worker_1, Duration::from_secs(20))
    }

    /// [`attempt`], with data connections that time out after `io_timeout`.
    fn attempt_timing_out(
        worker_1: &str,
        io_timeout: Duration,
    ) -> (Arc<Attempts>, Receiver<Mail>, Receiver<Mail>) {
        let rt = running(2, vec![(1, worker_1.to_string())], io_timeout);
        let links = Links(rt.clone());
        let (tx, rx) = crossbeam_channel::unbounded();
        let (ptx, prx) = crossbeam_channel::unbounded();
        links.register_receiver(1, tx, ptx);
        links.credit_return(1, 0);
        let attempts = Arc::new(Attempts::default());
        attempts.map.lock().unwrap().insert(("j".into(), 0), rt);
        (attempts, rx, prx)
    }

    /// Attempt 0 of job "j" (task 0 on worker 1, task 1 on worker 2) on worker `worker_id`,
    /// its subtasks running, the data addresses of the other workers `workers`.
    fn running(
        worker_id: u32,
        workers: Vec<(u32, String)>,
        io_timeout: Duration,
    ) -> Arc<AttemptRuntime> {
        let spec = DeploySpec {
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
            workers,
            sources_stopped: false,
        };
        let rt = Arc::new(AttemptRuntime::new(
            spec,
            worker_id,
            SECRET.into(),
            io_timeout,
        ));
        // Its subtasks run: data connections may route to them.
        *rt.phase.lock().unwrap() = Phase::Running;
        rt
    }

    /// Serves every data connection to `listener` for `attempts`, as a worker's data port.
    fn serve_data(listener: TcpListener, attempts: Arc<Attempts>) {
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let attempts = attempts.clone();
                std::thread::spawn(move || serve_data_connection(stream, attempts, SECRET.into()));
            }
        });
    }

    /// Runs `f` on a thread of its own; its result, or None if it takes longer than `limit`.
    fn within<T: Send + 'static>(
        limit: Duration,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let _ = tx.send(f());
        });
        rx.recv_timeout(limit).ok()
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
            let subscriber = log.subscriber();
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
    fn reconnect_pauses_double_up_to_their_cap() {
        let ms = |d: Duration| d.as_millis();
        let mut backoff = Backoff::new();
        let pauses: Vec<u128> = (0..8)
            .map(|_| ms(backoff.pause(RECONNECT_PAUSE_MAX)))
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 800, 1600, 2000, 2000]);
        let mut backoff = Backoff::new();
        let pauses: Vec<u128> = (0..6)
            .map(|_| ms(backoff.pause(UNREACHABLE_PAUSE_MAX)))
            .collect();
        assert_eq!(pauses, [50, 100, 200, 400, 500, 500]);
        let mut backoff = Backoff::new();
        let pauses: Vec<u128> = (0..11)
            .map(|_| ms(backoff.pause(WRONG_PEER_PAUSE_MAX)))
            .collect();
        assert_eq!(
            pauses,
            [50, 100, 200, 400, 800, 1600, 3200, 6400, 12800, 25600, 30000]
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

    /// A data connection that carries no data for many read timeouts (an idle source) stays
    /// up: keepalives flow both ways, and data still passes afterwards.
    #[test]
    fn an_idle_data_connection_stays_up_past_the_read_timeout() {
        let timeout = Duration::from_millis(200);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let (attempts, mailbox, _) = attempt_timing_out("127.0.0.1:9", timeout);
        start_keepalives(&attempts.map.lock().unwrap()[&("j".to_string(), 0)]).unwrap();
        serve_data(listener, attempts);
        let sender_rt = running(1, vec![(2, addr)], timeout);
        start_keepalives(&sender_rt).unwrap();
        let sender = Links(sender_rt.clone())
            .channel_to(1, 0, Credit::new(1))
            .unwrap();

        sender.send_encoded(vec![1], false).unwrap();
        let delivered = mailbox.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(
            matches!(&delivered, Mail::Data { element: Element::Encoded(b), .. } if b == &[1]),
            "{delivered:?}"
        );
        // Five read timeouts without data: the receiving end fails no task...
        let idle = mailbox.recv_timeout(5 * timeout);
        assert!(idle.is_err(), "the idle connection was given up: {idle:?}");
        // ...and the sending end still has the channel (a lost peer closes its credits).
        sender.send_encoded(vec![2], true).unwrap();
        let delivered = mailbox.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(
            matches!(&delivered, Mail::Data { element: Element::Encoded(b), .. } if b == &[2]),
            "{delivered:?}"
        );
        drop(sender_rt);
    }

    /// A data connection that stays open without a byte (a stalled link) is given up by each
    /// end after the read timeout, as a broken one is: the receiving end fails the tasks it
    /// fed, the sending end's senders stop waiting for credits.
    #[test]
    fn a_silent_data_connection_is_given_up_at_both_ends_after_the_read_timeout() {
        let timeout = Duration::from_millis(200);
        let limit = Duration::from_secs(20);

        // The receiving end: the peer greets, then says nothing.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (attempts, mailbox, _) = attempt_timing_out("127.0.0.1:9", timeout);
        let silent = connect(listener.local_addr().unwrap());
        let peer = silent.local_addr().unwrap();
        let (server, _) = listener.accept().unwrap();
        let log = Captured::default();
        let subscriber = log.subscriber();
        let started = Instant::now();
        let served = within(limit, move || {
            tracing::subscriber::with_default(subscriber, || {
                serve_data_connection(server, attempts, SECRET.into())
            })
        });
        assert!(served.is_some(), "the silent connection was not given up");
        assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
        let failed = mailbox.recv_timeout(limit);
        assert!(matches!(failed, Ok(Mail::Cancel)), "{failed:?}");
        let log = log.text();
        assert!(
            log.contains(&format!(
                "WARN cairn::cluster::worker: data connection from {peer} closed: no data or keepalive for 200ms"
            )),
            "{log}"
        );

        // The sending end: the peer accepts, then says nothing; a sender waits for a credit.
        let quiet = TcpListener::bind("127.0.0.1:0").unwrap();
        let rt = running(
            1,
            vec![(2, quiet.local_addr().unwrap().to_string())],
            timeout,
        );
        let sender = Links(rt.clone()).channel_to(1, 0, Credit::new(0)).unwrap();
        let (_accepted, _) = quiet.accept().unwrap();
        let waited = within(limit, move || sender.send_encoded(vec![1], false));
        assert!(
            matches!(waited, Some(Err(TaskError::Cancelled))),
            "the sender still waits for a credit from a silent peer: {waited:?}"
        );
        drop(rt);
    }

    /// A write to a peer that takes no bytes (but is otherwise alive: it sends keepalives)
    /// fails after the write timeout instead of blocking its task forever.
    #[test]
    fn a_write_to_a_peer_that_stops_reading_fails_after_the_write_timeout() {
        let timeout = Duration::from_millis(200);
        let peer = TcpListener::bind("127.0.0.1:0").unwrap();
        let rt = running(
            1,
            vec![(2, peer.local_addr().unwrap().to_string())],
            timeout,
        );
        let writer = rt.peer(2).unwrap();
        let (mut conn, _) = peer.accept().unwrap();
        std::thread::spawn(move || {
            // Keepalives pace themselves (they are what a live peer sends), and end when the
            // worker closes the connection.
            while write_frame(&mut conn, &DataMsg::Keepalive).is_ok() {
                std::thread::park_timeout(timeout / 8);
            }
        });
        let chan = RemoteChan {
            writer,
            task: 1,
            channel: 0,
        };
        let failed = within(Duration::from_secs(30), move || loop {
            if let Err(e) = chan.send(DataFrame::Batch(vec![0; 1 << 20])) {
                break e;
            }
        });
        let Some(e) = failed else {
            panic!("a write to a peer that takes no bytes still blocks");
        };
        assert!(e.to_string().contains("data connection failed"), "{e}");
    }

    /// Cancelling an attempt releases a task blocked writing to a peer that takes no bytes:
    /// its sockets are shut before anything waits for its tasks (the write timeout here is a
    /// minute, the release must come at once).
    #[test]
    fn a_cancel_releases_a_write_blocked_on_a_stalled_peer() {
        let peer = TcpListener::bind("127.0.0.1:0").unwrap();
        let rt = running(
            1,
            vec![(2, peer.local_addr().unwrap().to_string())],
            Duration::from_secs(60),
        );
        let writer = rt.peer(2).unwrap();
        // Accepted and never read: the writes fill the buffers and block.
        let (_conn, _) = peer.accept().unwrap();
        let chan = RemoteChan {
            writer,
            task: 1,
            channel: 0,
        };
        let writes = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let started = writes.clone();
        let (tx, rx) = crossbeam_channel::bounded(1);
        std::thread::spawn(move || {
            let e = loop {
                started.fetch_add(1, Ordering::SeqCst);
                if let Err(e) = chan.send(DataFrame::Batch(vec![0; 1 << 20])) {
                    break e;
                }
            };
            let _ = tx.send(e);
        });
        let until = Instant::now() + Duration::from_secs(30);
        while writes.load(Ordering::SeqCst) < 3 {
            assert!(
                Instant::now() < until,
                "the writes never filled the connection"
            );
            std::thread::yield_now();
        }
        rt.cancel();
        let e = rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the cancel left a write blocked on the stalled peer");
        assert!(e.to_string().contains("data connection failed"), "{e}");
    }
}
