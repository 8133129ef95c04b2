//! The coordinator process: accepts workers, watches their heartbeats, and runs one job master
//! (the embedded job master loop with a [`ClusterExecutor`]) per submitted job.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use serde::{Deserialize, Serialize};
use tracing::{error, info, warn};

use super::frame::{read_frame, write_frame};
use super::protocol::{secrets_match, DeploySpec, RestoreRef, ToCoordinator, ToWorker, WireEvent};
use super::{JobFactory, JobSubmission};
use crate::checkpoint::coordinator::TaskInfo;
use crate::error::TaskError;
use crate::runtime::channel::{ControlMail, MailboxHandle, RemoteMailbox};
use crate::runtime::job::{plan, DeployRequest, Deployed, DeployedTask, Executor};
use crate::runtime::status::JobStatus;
use crate::runtime::task::JobEvent;
use crate::runtime::{run_job_with, InjectSpec, JobError, RestoreFrom, RunOptions};

/// How to run a coordinator.
#[derive(Clone)]
pub struct CoordinatorOptions {
    /// Address workers connect to.
    pub bind: String,
    /// Checkpoint directory shared by all processes.
    pub checkpoint_dir: PathBuf,
    /// Shared cluster secret workers must present.
    pub secret: String,
    /// Builds jobs by name.
    pub factory: Arc<dyn JobFactory>,
    /// A worker silent for this long is dead.
    pub heartbeat_timeout: Duration,
    /// How long a (re)deployment waits for enough free slots.
    pub slot_wait: Duration,
}

type Writer = Arc<Mutex<TcpStream>>;

struct WorkerHandle {
    slots: u32,
    data_addr: String,
    writer: Writer,
    /// The connection again, to close it without the writer's lock (which a write to a
    /// stalled worker may hold until its timeout).
    socket: TcpStream,
    last_heartbeat: Mutex<Instant>,
}

struct JobEntry {
    events: Option<Sender<JobEvent>>,
    /// Live deployments: attempt → workers it runs on.
    attempts: HashMap<u32, Vec<u32>>,
    status: Arc<JobStatus>,
    /// (attempt, worker) pairs that confirmed a cancellation.
    cancel_acks: std::collections::HashSet<(u32, u32)>,
    /// Answers to job checks by (attempt, worker): None if the worker can run the attempt.
    checks: HashMap<(u32, u32), Option<String>>,
}

struct Inner {
    opts: CoordinatorOptions,
    workers: Mutex<BTreeMap<u32, Arc<WorkerHandle>>>,
    workers_changed: Condvar,
    jobs: Mutex<HashMap<String, JobEntry>>,
    jobs_changed: Condvar,
    next_worker: AtomicU32,
    addr: SocketAddr,
}

impl Inner {
    /// The ids of the live workers.
    fn live_workers(&self) -> Vec<u32> {
        self.workers
            .lock()
            .map(|w| w.keys().copied().collect())
            .unwrap_or_default()
    }
}

/// A running coordinator.
#[derive(Clone)]
pub struct Coordinator {
    inner: Arc<Inner>,
}

/// Writes one message to a worker; false if the connection is over. A failed write closes
/// it: a frame written in part leaves the stream unreadable, and a write that timed out means
/// the worker takes no bytes.
fn send<T: serde::Serialize>(w: &Writer, msg: &T) -> bool {
    let Ok(mut s) = w.lock() else {
        return false;
    };
    match write_frame(&mut *s, msg) {
        Ok(()) => true,
        Err(_) => {
            let _ = s.shutdown(Shutdown::Both);
            false
        }
    }
}

/// How often the coordinator heartbeats to each worker: several times within the heartbeat
/// timeout, after which a worker that heard nothing gives the coordinator up.
fn heartbeat_interval(timeout: Duration) -> Duration {
    (timeout / 4).max(Duration::from_millis(10))
}

impl Coordinator {
    /// Binds the worker port and starts accepting workers.
    pub fn start(opts: CoordinatorOptions) -> Result<Coordinator, String> {
        let listener = TcpListener::bind(&opts.bind)
            .map_err(|e| format!("cannot listen for workers on {}: {e}", opts.bind))?;
        let addr = listener.local_addr().map_err(|e| e.to_string())?;
        let inner = Arc::new(Inner {
            opts,
            workers: Mutex::new(BTreeMap::new()),
            workers_changed: Condvar::new(),
            jobs: Mutex::new(HashMap::new()),
            jobs_changed: Condvar::new(),
            next_worker: AtomicU32::new(1),
            addr,
        });
        let acc = inner.clone();
        std::thread::Builder::new()
            .name("worker-accept".into())
            .spawn(move || {
                for stream in listener.incoming().flatten() {
                    let inner = acc.clone();
                    let _ = std::thread::Builder::new()
                        .name("worker-conn".into())
                        .spawn(move || serve_worker(inner, stream));
                }
            })
            .map_err(|e| e.to_string())?;
        let mon = inner.clone();
        std::thread::Builder::new()
            .name("heartbeat-monitor".into())
            .spawn(move || monitor(mon))
            .map_err(|e| e.to_string())?;
        Ok(Coordinator { inner })
    }

    /// The address workers connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.inner.addr
    }

    /// Every job submitted to this coordinator.
    pub fn jobs(&self) -> Vec<Arc<JobStatus>> {
        self.inner
            .jobs
            .lock()
            .map(|j| j.values().map(|e| e.status.clone()).collect())
            .unwrap_or_default()
    }

    /// Live workers.
    pub fn workers(&self) -> usize {
        self.inner.workers.lock().map(|w| w.len()).unwrap_or(0)
    }

    /// Free slots of live workers.
    pub fn slots(&self) -> u32 {
        self.inner
            .workers
            .lock()
            .map(|w| w.values().map(|h| h.slots).sum())
            .unwrap_or(0)
    }

    /// Submits a job; returns its status (the job id is in it). The job must be registered
    /// with this coordinator's factory and its parameters must build; otherwise nothing is
    /// recorded or started and the error says why in one line. `restore` resumes from a
    /// checkpoint (coordinator restart).
    pub fn submit(
        &self,
        submission: JobSubmission,
        restore: Option<RestoreFrom>,
        job_id: Option<String>,
    ) -> Result<Arc<JobStatus>, String> {
        if !self.inner.opts.factory.has_job(&submission.job) {
            return Err(format!("unknown job '{}'", submission.job));
        }
        let factory = self.inner.opts.factory.as_ref();
        let graph = factory.build(&submission.job, &submission.params, submission.seed)?;
        let inject = super::inject_spec(factory, &submission)?;
        let submitted_from = match submission.from.as_deref() {
            None => None,
            Some("latest") => Some(RestoreFrom::Latest),
            Some("") => {
                return Err("--from needs a checkpoint or savepoint path, or 'latest'".into())
            }
            Some(p) => Some(RestoreFrom::Path(PathBuf::from(p))),
        };
        // A resumed job continues from its latest checkpoint, or from its `--from` if it
        // completed none; a new one from its `--from`.
        let restore = match restore {
            Some(RestoreFrom::Resume { job_id, .. }) => Some(RestoreFrom::Resume {
                job_id,
                otherwise: submitted_from.map(Box::new),
            }),
            other => other.or(submitted_from),
        };
        let mut config = submission.config.clone();
        if let Some(url) = &config.checkpoints_s3 {
            return Err(format!(
                "state.checkpoints.dir: {url}: a coordinator keeps checkpoints in its --checkpoint-dir; S3 checkpoint storage is supported by `cairn run` (embedded)"
            ));
        }
        config.checkpoints_dir = Some(self.inner.opts.checkpoint_dir.clone());
        if config.checkpoint_interval.is_none() {
            config.checkpoint_interval = Some(Duration::from_secs(1));
        }
        config.validate().map_err(|e| e.to_string())?;
        let fingerprint = plan(&graph, &config)
            .map_err(|e| e.to_string())?
            .fingerprint(&graph);
        let params = serde_json::to_string(&submission.params).map_err(|e| {
            format!(
                "cannot encode the parameters of job '{}': {e}",
                submission.job
            )
        })?;
        let job_id = job_id.unwrap_or_else(|| format!("{:032x}", fastrand::u128(..)));
        // Remember how to rebuild the job, so a restarted coordinator can resume it.
        let record = JobRecord {
            submission: submission.clone(),
            fingerprint: fingerprint.clone(),
        };
        record.write(&self.inner.opts.checkpoint_dir.join(&job_id))?;
        let status = JobStatus::new(job_id.clone(), graph.name().to_string(), config.describe());
        if let Ok(mut jobs) = self.inner.jobs.lock() {
            jobs.insert(
                job_id.clone(),
                JobEntry {
                    events: None,
                    attempts: HashMap::new(),
                    status: status.clone(),
                    cancel_acks: Default::default(),
                    checks: HashMap::new(),
                },
            );
        }
        let inner = self.inner.clone();
        let status2 = status.clone();
        let mut executor = ClusterExecutor {
            inner: inner.clone(),
            job_id: job_id.clone(),
            job: submission.job.clone(),
            params,
            seed: submission.seed,
            fingerprint,
            inject,
            inject_uid: submission.inject.and_then(|i| i.uid_prefix),
        };
        std::thread::Builder::new()
            .name(format!("job-{}", &job_id[..8.min(job_id.len())]))
            .spawn(move || {
                let opts = RunOptions {
                    config,
                    restore,
                    status: Some(status2),
                    job_id: Some(job_id.clone()),
                    ..RunOptions::default()
                };
                let result = run_job_with(&graph, opts, &mut executor);
                match &result {
                    Ok(s) => {
                        info!(
                            "job {job_id} finished: {} checkpoints, {} restarts",
                            s.checkpoints.len(),
                            s.restarts
                        );
                        let _ = std::fs::write(
                            inner.opts.checkpoint_dir.join(&job_id).join("_finished"),
                            b"",
                        );
                    }
                    Err(JobError::Canceled) => {
                        info!("job {job_id} cancelled");
                        let _ = std::fs::write(
                            inner.opts.checkpoint_dir.join(&job_id).join("_finished"),
                            b"",
                        );
                    }
                    Err(e) => warn!("job {job_id} failed: {e}"),
                }
            })
            .map_err(|e| e.to_string())?;
        Ok(status)
    }

    /// Resumes the jobs recorded in the checkpoint directory that did not finish. A damaged
    /// or unreadable `_job` record is refused, with its path, and that job is not resumed.
    pub fn resume_recorded_jobs(&self) -> Vec<Arc<JobStatus>> {
        let mut out = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.inner.opts.checkpoint_dir) else {
            return out;
        };
        for e in entries.flatten() {
            let dir = e.path();
            if !dir.join(JOB_RECORD).is_file() || dir.join("_finished").exists() {
                continue;
            }
            let Some(job_id) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            let record = match JobRecord::read(&dir) {
                Ok(r) => r,
                Err(e) => {
                    error!("job {job_id} not resumed: {e}");
                    continue;
                }
            };
            info!(
                "resuming job {job_id} ({}) from its latest checkpoint",
                record.submission.job
            );
            let resume = RestoreFrom::Resume {
                job_id: job_id.clone(),
                otherwise: None,
            };
            match self.submit(record.submission, Some(resume), Some(job_id.clone())) {
                Ok(s) => out.push(s),
                Err(e) => error!("cannot resume job {job_id}: {e}"),
            }
        }
        out
    }
}

/// The file in `<checkpoint-dir>/<job-id>/` that records how a job was submitted.
pub const JOB_RECORD: &str = "_job";

/// What `<job-id>/_job` holds: the submission, and the plan fingerprint it had.
#[derive(Debug, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job as submitted.
    pub submission: JobSubmission,
    /// The plan's fingerprint at submission.
    pub fingerprint: String,
}

impl JobRecord {
    /// Writes `dir/_job` atomically: a temporary file, fsynced, renamed over it, the
    /// directory fsynced; a crash leaves the old record or the new one, never a torn one.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        let path = dir.join(JOB_RECORD);
        let fail = |e: std::io::Error| format!("cannot record the job in {}: {e}", path.display());
        std::fs::create_dir_all(dir).map_err(fail)?;
        let text = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        let tmp = dir.join(format!(".{JOB_RECORD}.tmp"));
        {
            let mut file = std::fs::File::create(&tmp).map_err(fail)?;
            file.write_all(&text).map_err(fail)?;
            file.sync_all().map_err(fail)?;
        }
        std::fs::rename(&tmp, &path).map_err(fail)?;
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(fail)
    }

    /// Reads `dir/_job`; an unreadable or damaged record is an error naming its path.
    pub fn read(dir: &Path) -> Result<JobRecord, String> {
        let path = dir.join(JOB_RECORD);
        let text =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_slice(&text)
            .map_err(|e| format!("damaged job record {}: {e}", path.display()))
    }
}

fn notify_jobs_of_lost_worker(inner: &Inner, worker: u32, reason: &str) {
    if let Ok(mut jobs) = inner.jobs.lock() {
        for entry in jobs.values_mut() {
            let lost: Vec<u32> = entry
                .attempts
                .iter()
                .filter(|(_, ws)| ws.contains(&worker))
                .map(|(a, _)| *a)
                .collect();
            if lost.is_empty() {
                continue;
            }
            for attempt in &lost {
                entry.attempts.remove(attempt);
            }
            if let Some(events) = &entry.events {
                // One event for every attempt the worker hosted: one failure, not one per region.
                let _ = events.send(JobEvent::Lost {
                    attempts: lost,
                    reason: format!("worker {worker} lost: {reason}"),
                });
            }
        }
        inner.jobs_changed.notify_all();
    }
}

fn serve_worker(inner: Arc<Inner>, stream: TcpStream) {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let _ = stream.set_nodelay(true);
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    // A worker that takes no bytes for a heartbeat timeout is as dead as a silent one.
    let _ = stream.set_write_timeout(Some(inner.opts.heartbeat_timeout));
    let (Ok(mut reader), Ok(socket)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let writer: Writer = Arc::new(Mutex::new(stream));
    let mut buf = Vec::new();
    let (slots, data_addr) = match read_frame::<_, ToCoordinator>(&mut reader, &mut buf) {
        Ok(ToCoordinator::Register {
            secret,
            slots,
            data_addr,
        }) => {
            if !secrets_match(&secret, &inner.opts.secret) {
                warn!("worker at {peer} rejected: wrong cluster secret");
                let _ = send(
                    &writer,
                    &ToWorker::Rejected {
                        reason: "wrong cluster secret".into(),
                    },
                );
                return;
            }
            (slots, data_addr)
        }
        Ok(other) => {
            warn!("connection from {peer} closed: expected a registration, got {other:?}");
            return;
        }
        Err(e) => {
            warn!("connection from {peer} closed: {e}");
            return;
        }
    };
    // Silence is the monitor's to judge, by the heartbeats; the reader waits for what comes.
    let _ = reader.set_read_timeout(None);
    let id = inner.next_worker.fetch_add(1, Ordering::Relaxed);
    let registered = ToWorker::Registered {
        worker_id: id,
        heartbeat_timeout_ms: inner.opts.heartbeat_timeout.as_millis() as u64,
    };
    if !send(&writer, &registered) {
        return;
    }
    let handle = Arc::new(WorkerHandle {
        slots,
        data_addr,
        writer: writer.clone(),
        socket,
        last_heartbeat: Mutex::new(Instant::now()),
    });
    let connected = Arc::new(AtomicBool::new(true));
    {
        let (writer, connected) = (writer.clone(), connected.clone());
        let interval = heartbeat_interval(inner.opts.heartbeat_timeout);
        let _ = std::thread::Builder::new()
            .name(format!("heartbeat-to-{id}"))
            .spawn(move || {
                while connected.load(Ordering::Acquire) && send(&writer, &ToWorker::Heartbeat) {
                    std::thread::sleep(interval);
                }
            });
    }
    if let Ok(mut w) = inner.workers.lock() {
        w.insert(id, handle.clone());
        inner.workers_changed.notify_all();
    }
    info!("worker {id} registered from {peer} with {slots} slots");
    let reason = loop {
        match read_frame::<_, ToCoordinator>(&mut reader, &mut buf) {
            Ok(ToCoordinator::Heartbeat) => {
                if let Ok(mut t) = handle.last_heartbeat.lock() {
                    *t = Instant::now();
                }
            }
            Ok(ToCoordinator::Event { job_id, event }) => route_event(&inner, &job_id, event),
            Ok(ToCoordinator::Metrics(snapshots)) => {
                crate::metrics::remote().report((id, &handle.data_addr), snapshots)
            }
            Ok(ToCoordinator::JobChecked {
                job_id,
                attempt,
                refusal,
            }) => {
                if let Ok(mut jobs) = inner.jobs.lock() {
                    if let Some(j) = jobs.get_mut(&job_id) {
                        j.checks.insert((attempt, id), refusal);
                    }
                    inner.jobs_changed.notify_all();
                }
            }
            Ok(ToCoordinator::AttemptCancelled { job_id, attempt }) => {
                if let Ok(mut jobs) = inner.jobs.lock() {
                    if let Some(j) = jobs.get_mut(&job_id) {
                        j.cancel_acks.insert((attempt, id));
                    }
                    inner.jobs_changed.notify_all();
                }
            }
            Ok(ToCoordinator::Register { .. }) => break "registered twice".to_string(),
            Err(e) => break e.to_string(),
        }
    };
    connected.store(false, Ordering::Release);
    // The monitor may have declared it dead already (and closed the connection, which ended
    // the loop); then it reported.
    if declare_dead(&inner, id, &reason) {
        warn!("worker {id} ({peer}) is gone: {reason}");
    }
    let _ = handle.socket.shutdown(Shutdown::Both);
}

/// Removes worker `id` if it is still live, closes its connection (without its writer's
/// lock) and fails over the jobs it ran. Only the first caller does; false if it was gone.
fn declare_dead(inner: &Inner, id: u32, reason: &str) -> bool {
    let handle = inner.workers.lock().ok().and_then(|mut w| {
        let handle = w.remove(&id);
        inner.workers_changed.notify_all();
        handle
    });
    let Some(handle) = handle else {
        return false;
    };
    let _ = handle.socket.shutdown(Shutdown::Both);
    notify_jobs_of_lost_worker(inner, id, reason);
    true
}

fn route_event(inner: &Inner, job_id: &str, event: WireEvent) {
    let events = inner
        .jobs
        .lock()
        .ok()
        .and_then(|j| j.get(job_id).and_then(|e| e.events.clone()));
    let Some(events) = events else { return };
    let e = match event {
        WireEvent::Ack(a) => JobEvent::Ack(a),
        WireEvent::Decline {
            checkpoint_id,
            attempt,
            cause,
        } => JobEvent::Decline {
            checkpoint_id,
            attempt,
            cause,
        },
        WireEvent::SourceExhausted { attempt, task } => JobEvent::SourceExhausted { attempt, task },
        WireEvent::Exited {
            attempt,
            task,
            error,
        } => JobEvent::Exited {
            attempt,
            task,
            result: error.map_or(Ok(()), |e| Err(TaskError::from(e))),
        },
    };
    let _ = events.send(e);
}

/// Declares dead every worker silent for longer than the heartbeat timeout — also one whose
/// connection stays open without a byte on it, which the operating system would not notice.
fn monitor(inner: Arc<Inner>) {
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let Ok(workers) = inner.workers.lock() else {
            return;
        };
        let silent: Vec<(u32, Duration)> = workers
            .iter()
            .filter_map(|(id, w)| {
                let silent = w.last_heartbeat.lock().map(|t| t.elapsed()).ok()?;
                (silent > inner.opts.heartbeat_timeout).then_some((*id, silent))
            })
            .collect();
        // The jobs are told without the workers' lock (the jobs' lock comes first elsewhere).
        drop(workers);
        for (id, silent) in silent {
            warn!("worker {id} missed its heartbeats for {silent:?}; declaring it dead");
            declare_dead(&inner, id, &format!("no heartbeat for {silent:?}"));
        }
    }
}

struct RemoteTask {
    writer: Writer,
    job_id: String,
    attempt: u32,
    task: usize,
}

impl RemoteMailbox for RemoteTask {
    fn send(&self, mail: ControlMail) -> bool {
        send(
            &self.writer,
            &ToWorker::Mail {
                job_id: self.job_id.clone(),
                attempt: self.attempt,
                task: self.task,
                mail,
            },
        )
    }
}

/// Deploys a job's subtasks onto workers' slots.
pub struct ClusterExecutor {
    inner: Arc<Inner>,
    job_id: String,
    job: String,
    /// The parameters as JSON text.
    params: String,
    seed: u64,
    fingerprint: String,
    inject: Option<InjectSpec>,
    inject_uid: Option<String>,
}

/// How long a deployment waits for the workers to answer a job check.
const JOB_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

impl ClusterExecutor {
    /// Asks every worker the attempt uses whether it can build the job and plans the same
    /// graph, before anything is deployed; a refusal fails the job at once (no restart can
    /// make a worker's binary have the job).
    fn check_workers(&self, spec: &DeploySpec, workers: &[(u32, Writer)]) -> Result<(), TaskError> {
        for (id, w) in workers {
            if !send(w, &ToWorker::CheckJob(Box::new(spec.clone()))) {
                return Err(TaskError::msg(format!("worker {id} is unreachable")));
            }
        }
        let deadline = Instant::now() + JOB_CHECK_TIMEOUT;
        let mut jobs = self.inner.jobs.lock().map_err(|_| TaskError::Cancelled)?;
        loop {
            let answers = jobs.get(&self.job_id).map(|j| &j.checks);
            let mut missing = Vec::new();
            for (id, _) in workers {
                match answers.and_then(|a| a.get(&(spec.attempt, *id))) {
                    Some(Some(refusal)) => return Err(TaskError::Unrecoverable(refusal.clone())),
                    Some(None) => {}
                    None => missing.push(*id),
                }
            }
            if missing.is_empty() {
                if let Some(j) = jobs.get_mut(&self.job_id) {
                    j.checks.retain(|(attempt, _), _| *attempt != spec.attempt);
                }
                return Ok(());
            }
            let live = self.inner.live_workers();
            if let Some(gone) = missing.iter().find(|id| !live.contains(id)) {
                return Err(TaskError::msg(format!(
                    "worker {gone} was lost before it answered the job check"
                )));
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(TaskError::msg(format!(
                    "workers {missing:?} did not answer the job check within {}s",
                    JOB_CHECK_TIMEOUT.as_secs()
                )));
            }
            jobs = self
                .inner
                .jobs_changed
                .wait_timeout(jobs, (deadline - now).min(Duration::from_millis(100)))
                .map_err(|_| TaskError::Cancelled)?
                .0;
        }
    }
}

struct ClusterDeployment {
    inner: Arc<Inner>,
    job_id: String,
    attempt: u32,
    workers: Vec<(u32, Writer)>,
    infos: Vec<DeployedTask>,
}

impl Executor for ClusterExecutor {
    fn deploy(&mut self, req: &DeployRequest<'_>) -> Result<Box<dyn Deployed>, TaskError> {
        let needed = req.plan.slots_needed();
        // Wait for enough slots (a new worker may join at any time).
        let deadline = Instant::now() + self.inner.opts.slot_wait;
        let workers: Vec<(u32, Arc<WorkerHandle>)> = {
            let mut w = self
                .inner
                .workers
                .lock()
                .map_err(|_| TaskError::Cancelled)?;
            loop {
                let have: u32 = w.values().map(|h| h.slots).sum();
                if have >= needed {
                    break w.iter().map(|(id, h)| (*id, h.clone())).collect();
                }
                let now = Instant::now();
                if now >= deadline {
                    return Err(TaskError::msg(format!(
                        "not enough task slots: the job needs {needed}, the live workers offer {have}"
                    )));
                }
                w = self
                    .inner
                    .workers_changed
                    .wait_timeout(w, deadline - now)
                    .map_err(|_| TaskError::Cancelled)?
                    .0;
            }
        };
        // Slot s holds subtask s of every vertex (slot sharing).
        let mut slot_owner = Vec::with_capacity(needed as usize);
        for (id, h) in &workers {
            for _ in 0..h.slots {
                slot_owner.push(*id);
            }
        }
        let descriptions = req.plan.task_descriptions(req.graph);
        let assignment: Vec<u32> = descriptions
            .iter()
            .map(|d| slot_owner[d.subtask as usize])
            .collect();
        let mask: Vec<bool> = req
            .tasks
            .map_or_else(|| vec![true; assignment.len()], |t| t.to_vec());
        let used: Vec<u32> = {
            let mut u: Vec<u32> = assignment
                .iter()
                .zip(&mask)
                .filter(|(_, &m)| m)
                .map(|(&w, _)| w)
                .collect();
            u.sort_unstable();
            u.dedup();
            u
        };
        let restore = req.restored.map(|c| RestoreRef {
            root: c
                .storage_root
                .clone()
                .unwrap_or_else(|| self.inner.opts.checkpoint_dir.clone()),
            job_id: c.metadata.job_id.clone(),
            checkpoint_id: c.id(),
            savepoint: c.self_contained,
        });
        let spec = DeploySpec {
            job_id: self.job_id.clone(),
            attempt: req.attempt,
            job: self.job.clone(),
            params: self.params.clone(),
            seed: self.seed,
            fingerprint: self.fingerprint.clone(),
            inject: self.inject,
            inject_uid: self.inject_uid.clone(),
            checkpoint_dir: Some(self.inner.opts.checkpoint_dir.clone()),
            config_yaml: serde_norway::to_string(req.config)
                .map_err(|e| TaskError::msg(format!("cannot encode the job configuration: {e}")))?,
            restore,
            assignment: assignment.clone(),
            deploy_mask: mask.clone(),
            workers: workers
                .iter()
                .map(|(id, h)| (*id, h.data_addr.clone()))
                .collect(),
            sources_stopped: req.sources_stopped,
        };
        let writers: Vec<(u32, Writer)> = workers
            .iter()
            .filter(|(id, _)| used.contains(id))
            .map(|(id, h)| (*id, h.writer.clone()))
            .collect();
        self.check_workers(&spec, &writers)?;
        if let Ok(mut jobs) = self.inner.jobs.lock() {
            if let Some(j) = jobs.get_mut(&self.job_id) {
                j.events = Some(req.events.clone());
                j.attempts.insert(req.attempt, used.clone());
            }
        }
        for (id, w) in &writers {
            if !send(w, &ToWorker::Deploy(Box::new(spec.clone()))) {
                return Err(TaskError::msg(format!("worker {id} is unreachable")));
            }
        }
        let infos = descriptions
            .into_iter()
            .enumerate()
            .filter(|(task, _)| mask[*task])
            .map(|(task, d)| {
                let writer = writers
                    .iter()
                    .find(|(id, _)| *id == assignment[task])
                    .map(|(_, w)| w.clone())
                    .unwrap_or_else(|| writers[0].1.clone());
                DeployedTask {
                    info: TaskInfo {
                        index: task,
                        name: d.name,
                        subtask: d.subtask,
                        is_source: d.is_source,
                        operators: d.operators,
                    },
                    mailbox: MailboxHandle::Remote(Arc::new(RemoteTask {
                        writer,
                        job_id: self.job_id.clone(),
                        attempt: req.attempt,
                        task,
                    })),
                }
            })
            .collect();
        info!(
            "job {}: attempt {} deployed on workers {used:?}",
            self.job_id, req.attempt
        );
        Ok(Box::new(ClusterDeployment {
            inner: self.inner.clone(),
            job_id: self.job_id.clone(),
            attempt: req.attempt,
            workers: writers,
            infos,
        }))
    }
}

impl Deployed for ClusterDeployment {
    fn infos(&self) -> &[DeployedTask] {
        &self.infos
    }

    fn cancel(self: Box<Self>) {
        for (_, w) in &self.workers {
            let _ = send(
                w,
                &ToWorker::CancelAttempt {
                    job_id: self.job_id.clone(),
                    attempt: self.attempt,
                },
            );
        }
        // Wait until every live worker stopped the attempt's subtasks, so that the next attempt
        // never overlaps with this one.
        let deadline = Instant::now() + Duration::from_secs(10);
        let Ok(mut jobs) = self.inner.jobs.lock() else {
            return;
        };
        loop {
            let live = self.inner.live_workers();
            let pending = self.workers.iter().any(|(id, _)| {
                live.contains(id)
                    && !jobs
                        .get(&self.job_id)
                        .is_some_and(|j| j.cancel_acks.contains(&(self.attempt, *id)))
            });
            let now = Instant::now();
            if !pending || now >= deadline {
                if let Some(j) = jobs.get_mut(&self.job_id) {
                    j.attempts.remove(&self.attempt);
                }
                return;
            }
            jobs = match self
                .inner
                .jobs_changed
                .wait_timeout(jobs, (deadline - now).min(Duration::from_millis(100)))
            {
                Ok(g) => g.0,
                Err(_) => return,
            };
        }
    }

    fn join(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> JobRecord {
        JobRecord {
            submission: JobSubmission {
                job: "fraud".into(),
                params: serde_json::json!({"threshold": 500, "output": "/out"}),
                config: crate::config::JobConfig::default(),
                from: Some("latest".into()),
                inject: Some(super::super::InjectRequest {
                    count: 2,
                    uid_prefix: None,
                }),
                seed: 7,
            },
            fingerprint: "0123456789abcdef".into(),
        }
    }

    #[test]
    fn a_job_record_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let job_dir = dir.path().join("job-1");
        record().write(&job_dir).unwrap();
        let back = JobRecord::read(&job_dir).unwrap();
        assert_eq!(back.submission.params["threshold"], 500);
        assert_eq!(back.submission.seed, 7);
        assert_eq!(back.fingerprint, "0123456789abcdef");
        assert_eq!(back.submission.config, crate::config::JobConfig::default());
        // Nothing but the record is left: the temporary file was renamed over it.
        let names: Vec<String> = std::fs::read_dir(&job_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [JOB_RECORD]);
    }

    #[test]
    fn a_damaged_or_missing_job_record_is_refused_naming_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let job_dir = dir.path().join("job-1");
        record().write(&job_dir).unwrap();
        let path = job_dir.join(JOB_RECORD);
        let whole = std::fs::read(&path).unwrap();
        for damaged in [
            &whole[..whole.len() / 2],
            b"wordcount\n--generate\n10\n",
            b"",
        ] {
            std::fs::write(&path, damaged).unwrap();
            let e = JobRecord::read(&job_dir).unwrap_err();
            assert!(
                e.starts_with(&format!("damaged job record {}", path.display())),
                "{e}"
            );
        }
        std::fs::remove_file(&path).unwrap();
        let e = JobRecord::read(&job_dir).unwrap_err();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }
}
