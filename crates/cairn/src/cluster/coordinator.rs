//! The coordinator process: accepts workers, watches their heartbeats, and runs one job master
//! (the embedded job master loop with a [`ClusterExecutor`]) per submitted job.

use std::collections::{BTreeMap, HashMap};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use tracing::{error, info, warn};

use super::frame::{read_frame, send_or_close as send};
use super::protocol::{secrets_match, DeploySpec, RestoreRef, ToCoordinator, ToWorker, WireEvent};
use super::records::{EndRecord, JobRecord, END_RECORD, JOB_RECORD, LEGACY_FINISHED};
use super::slots::SlotTable;
use super::{JobFactory, JobSubmission};
use crate::checkpoint::coordinator::TaskInfo;
use crate::checkpoint::newest_completed;
use crate::error::TaskError;
use crate::runtime::channel::{ControlMail, MailboxHandle, RemoteMailbox};
use crate::runtime::job::{plan, prepare_job, DeployRequest, Deployed, DeployedTask, Executor};
use crate::runtime::status::{Actor, JobState, JobStatus};
use crate::runtime::task::JobEvent;
use crate::runtime::{InjectSpec, JobError, RestoreFrom, RunOptions};
use crate::storage::layout::checkpoint_dir;
use crate::storage::{Fence, FsStorage};

use super::leader::Leadership;

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
    /// How many ended jobs it keeps (Flink's `jobstore.max-capacity`): listed, with their
    /// state and cause, until newer ones push them out.
    pub history: usize,
    /// Its leadership among coordinators sharing the checkpoint directory (None: it is the
    /// only one and leads unfenced). Everything it writes there — checkpoints, job records —
    /// and every worker it accepts is fenced by it.
    pub leadership: Option<Arc<Leadership>>,
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
    /// It said it leaves on purpose (drained): its jobs' restarts spend no budget.
    leaving: AtomicBool,
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
    /// Slots reserved by jobs that have not ended (lock after `workers`, never with `jobs`).
    slots: Mutex<SlotTable>,
    /// Told the ids of ended jobs the history lets go.
    on_forget: Mutex<Option<ForgetHook>>,
    next_worker: AtomicU32,
    addr: SocketAddr,
}

type ForgetHook = Box<dyn Fn(&str) + Send + Sync>;

impl Inner {
    /// Ok while this coordinator may change what the coordinators share (it leads).
    fn fenced(&self) -> Result<(), String> {
        match &self.opts.leadership {
            Some(l) => l
                .check()
                .map_err(|why| format!("this coordinator is no longer the leader ({why})")),
            None => Ok(()),
        }
    }

    /// The leader epoch its records carry (0 without a leadership contest).
    fn epoch(&self) -> u64 {
        self.opts.leadership.as_ref().map_or(0, |l| l.epoch())
    }

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
            slots: Mutex::new(SlotTable::default()),
            on_forget: Mutex::new(None),
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

    /// Slots live workers offer.
    pub fn slots(&self) -> u32 {
        self.inner
            .workers
            .lock()
            .map(|w| w.values().map(|h| h.slots).sum())
            .unwrap_or(0)
    }

    /// Slots of live workers: offered in all, and reserved by jobs that have not ended.
    pub fn slots_reserved(&self) -> (u32, u32) {
        // A job whose end is visible holds none, even before its thread released them.
        let ended: Vec<String> = self.inner.jobs.lock().map_or_else(
            |_| Vec::new(),
            |jobs| {
                let ended = jobs
                    .iter()
                    .filter(|(_, e)| e.status.view_state().is_ended());
                ended.map(|(id, _)| id.clone()).collect()
            },
        );
        let Ok(workers) = self.inner.workers.lock() else {
            return (0, 0);
        };
        let offered = offered_slots(&workers);
        let reserved = self
            .inner
            .slots
            .lock()
            .map_or(0, |t| t.reserved(&offered, &ended));
        (offered.values().sum(), reserved)
    }

    /// The coordinator stops: every job that has not ended is SUSPENDED with `cause` (and
    /// not recorded as ended, so the next coordinator on the checkpoint directory resumes it).
    /// Returns how many.
    pub fn suspend(&self, cause: &str) -> usize {
        let Ok(jobs) = self.inner.jobs.lock() else {
            return 0;
        };
        let suspended = jobs.values().filter(|e| {
            e.status
                .transition(JobState::Suspended, Actor::Coordinator, Some(cause.into()))
                .is_ok()
                && e.status.view_state() == JobState::Suspended
        });
        suspended.count()
    }

    /// Calls `f` with the id of every job the bounded history lets go (so that whoever lists
    /// jobs, the REST API, forgets them too).
    pub fn on_forget(&self, f: impl Fn(&str) + Send + Sync + 'static) {
        if let Ok(mut hook) = self.inner.on_forget.lock() {
            *hook = Some(Box::new(f));
        }
    }

    /// Submits a job; returns its status (the job id is in it). Everything that can be known
    /// before deployment is checked here, and an error says why in one line with nothing
    /// recorded or started: the job must be registered with this coordinator's factory, its
    /// parameters must build, its configuration validate, a `--from` path must be absolute and
    /// hold a checkpoint that verifies and fits the job, `--from latest` must name one job's
    /// checkpoints, and its sinks must initialize (an output that is a file, a savepoint
    /// resumed into another output). `resume`: a restarted coordinator resuming job `resume`.
    pub fn submit(
        &self,
        submission: JobSubmission,
        resume: Option<String>,
    ) -> Result<Arc<JobStatus>, String> {
        if !self.inner.opts.factory.has_job(&submission.job) {
            return Err(format!("unknown job '{}'", submission.job));
        }
        let factory = self.inner.opts.factory.as_ref();
        let graph = factory.build(&submission.job, &submission.params, submission.seed)?;
        if let Some(uid) = graph.stdout_sinks().first() {
            return Err(format!(
                "job '{}' would print its output (sink '{uid}') on a worker's standard output; give it an output (e.g. --output DIR)",
                submission.job
            ));
        }
        let inject = super::inject_spec(factory, &submission)?;
        let mut submission = submission;
        let from = self.resolve_from(&submission, resume.as_deref())?;
        if let Some(RestoreFrom::Path(p)) = &from {
            // Recorded resolved: a restarted coordinator resumes from this very snapshot.
            submission.from = Some(p.display().to_string());
            submission.from_job = None;
        }
        let restore = match resume.clone() {
            Some(job_id) => Some(RestoreFrom::Resume {
                job_id,
                otherwise: from.map(Box::new),
            }),
            None => from,
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
        let job_id = resume.unwrap_or_else(|| format!("{:032x}", fastrand::u128(..)));
        let status = JobStatus::new(job_id.clone(), graph.name().to_string(), config.describe());
        let opts = RunOptions {
            config,
            restore,
            status: Some(status.clone()),
            job_id: Some(job_id.clone()),
            fence: self
                .inner
                .opts
                .leadership
                .clone()
                .map(|l| l as Arc<dyn Fence>),
            ..RunOptions::default()
        };
        // The checkpoint is found, loaded and verified, the sinks initialized — or the job is
        // refused here, before anything is recorded.
        let prepared = prepare_job(&graph, opts).map_err(|e| e.to_string())?;
        let job_id = prepared.job_id().to_string();
        let record = JobRecord {
            submission: submission.clone(),
            fingerprint: fingerprint.clone(),
            epoch: self.inner.epoch(),
        };
        let job_dir = self.inner.opts.checkpoint_dir.join(&job_id);
        self.inner.fenced()?;
        record.write(&job_dir)?;
        self.inner.add_job(&job_id, status.clone())?;
        let mut executor = ClusterExecutor {
            inner: self.inner.clone(),
            job_id: job_id.clone(),
            status: status.clone(),
            job: submission.job.clone(),
            params,
            seed: submission.seed,
            fingerprint,
            inject,
            inject_uid: submission.inject.and_then(|i| i.uid_prefix),
            preparing: BTreeMap::new(),
            cancelling: Arc::default(),
        };
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("job-{}", &job_id[..8.min(job_id.len())]))
            .spawn(move || {
                let result = prepared.run(&graph, &mut executor);
                inner.job_ended(&executor.job_id, &executor.status, result);
            });
        if let Err(e) = spawned {
            let cause = format!("cannot start the job master: {e}");
            self.inner
                .job_ended(&job_id, &status, Err(JobError::Setup(cause.clone())));
            return Err(cause);
        }
        Ok(status)
    }

    /// Where a submission starts from. A path must be absolute (the client resolves a
    /// relative one; the coordinator's directory means nothing to the user). `latest` is the
    /// newest completed checkpoint of one job in this coordinator's directory: the one
    /// `from_job` names, or the one job of the submitted name that has completed checkpoints —
    /// never another job's, never a guess between several. A job that still runs here is
    /// refused (stop or cancel it first). The new job gets its own id (the checkpoint stays
    /// the old job's). A resumed job keeps its recorded path.
    fn resolve_from(
        &self,
        submission: &JobSubmission,
        resume: Option<&str>,
    ) -> Result<Option<RestoreFrom>, String> {
        let latest = match submission.from.as_deref() {
            None => return Ok(None),
            Some("") => {
                return Err("--from needs a checkpoint or savepoint path, or 'latest'".into())
            }
            Some("latest") if resume.is_none() => true,
            Some("latest") => return Ok(None),
            Some(p) => {
                let path = PathBuf::from(p);
                if !path.is_absolute() {
                    return Err(format!(
                        "--from {p}: a path sent to a coordinator must be absolute (`cairn submit` makes it so)"
                    ));
                }
                false
            }
        };
        if !latest {
            return Ok(submission
                .from
                .as_deref()
                .map(|p| RestoreFrom::Path(p.into())));
        }
        let root = &self.inner.opts.checkpoint_dir;
        let storage = FsStorage::open(root).map_err(|e| e.to_string())?;
        let job_id = match &submission.from_job {
            Some(id) => {
                if !root.join(id).join(JOB_RECORD).is_file() {
                    return Err(format!(
                        "--from latest --job {id}: no job {id} under {}",
                        root.display()
                    ));
                }
                id.clone()
            }
            None => self.only_job_with_checkpoints(&storage, &submission.job)?,
        };
        if let Some(state) = self.live_state(&job_id) {
            return Err(format!(
                "--from latest: job {job_id} is {state}; stop it with a savepoint or cancel it first"
            ));
        }
        let Some(id) = newest_completed(&storage, &job_id) else {
            return Err(format!(
                "--from latest: job {job_id} completed no checkpoint under {}; submit without --from to start fresh",
                root.display()
            ));
        };
        let path = root.join(checkpoint_dir(&job_id, id));
        info!(
            "--from latest: job {job_id}'s newest completed checkpoint is {}",
            path.display()
        );
        Ok(Some(RestoreFrom::Path(path)))
    }

    /// The one recorded job named `name` with a completed checkpoint.
    fn only_job_with_checkpoints(&self, storage: &FsStorage, name: &str) -> Result<String, String> {
        let root = &self.inner.opts.checkpoint_dir;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(root)
            .map_err(|e| format!("cannot read {}: {e}", root.display()))?
            .flatten()
        {
            let dir = entry.path();
            let Some(id) = dir.file_name().and_then(|n| n.to_str()).map(str::to_string) else {
                continue;
            };
            let Ok(record) = JobRecord::read(&dir) else {
                continue;
            };
            if record.submission.job == name && newest_completed(storage, &id).is_some() {
                found.push(id);
            }
        }
        found.sort();
        match found.len() {
            0 => Err(format!(
                "--from latest: no job '{name}' under {} completed a checkpoint; submit without --from to start fresh",
                root.display()
            )),
            1 => Ok(found.remove(0)),
            _ => Err(format!(
                "--from latest is ambiguous: jobs {} ('{name}') have checkpoints under {}; name one with --job ID",
                found.join(", "),
                root.display()
            )),
        }
    }

    /// The state of job `job_id` if it runs here (has not ended).
    fn live_state(&self, job_id: &str) -> Option<JobState> {
        let jobs = self.inner.jobs.lock().ok()?;
        let state = jobs.get(job_id)?.status.view_state();
        (!state.is_ended()).then_some(state)
    }

    /// Resumes the jobs recorded in the checkpoint directory that did not end, and lists the
    /// newest ended ones (up to the history's capacity). A damaged or unreadable `_job` or
    /// `_end` record is refused, with its path, and that job is not resumed. A job whose
    /// resumption fails (its newest checkpoint does not verify, say) ends FAILED with the
    /// cause, recorded, so it is not tried again.
    pub fn resume_recorded_jobs(&self) -> Vec<Arc<JobStatus>> {
        let mut out = Vec::new();
        let root = self.inner.opts.checkpoint_dir.clone();
        let Ok(entries) = std::fs::read_dir(&root) else {
            return out;
        };
        let mut ended = Vec::new();
        for e in entries.flatten() {
            let dir = e.path();
            if !dir.join(JOB_RECORD).is_file() {
                continue;
            }
            let Some(job_id) = dir.file_name().map(|n| n.to_string_lossy().into_owned()) else {
                continue;
            };
            if dir.join(LEGACY_FINISHED).exists() {
                continue;
            }
            let record = JobRecord::read(&dir);
            if dir.join(END_RECORD).exists() {
                match EndRecord::read(&dir) {
                    Ok(end) if record.as_ref().is_ok_and(|r| end.epoch < r.epoch) => warn!(
                        "job {job_id}: the end recorded under leader epoch {} came from a deposed leader after epoch {} resumed the job; resuming it",
                        end.epoch,
                        record.as_ref().map_or(0, |r| r.epoch)
                    ),
                    Ok(end) => {
                        ended.push((end.end_time, job_id, end));
                        continue;
                    }
                    Err(e) => {
                        error!("job {job_id} not resumed: {e}");
                        continue;
                    }
                }
            }
            let record = match record {
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
            match self.submit(record.submission.clone(), Some(job_id.clone())) {
                Ok(s) => out.push(s),
                Err(e) => {
                    error!("cannot resume job {job_id}: {e}");
                    let name = record.submission.job.clone();
                    let status = JobStatus::new(job_id.clone(), name, Vec::new());
                    if self.inner.add_job(&job_id, status.clone()).is_ok() {
                        let cause = format!("cannot resume the job: {e}");
                        let ended = Err(JobError::Setup(cause));
                        self.inner.job_ended(&job_id, &status, ended);
                        out.push(status);
                    }
                }
            }
        }
        // The newest ended jobs, as many as the history keeps.
        ended.sort_by_key(|e| std::cmp::Reverse(e.0));
        ended.truncate(self.inner.opts.history);
        for (_, job_id, end) in ended.into_iter().rev() {
            let status = end.status(job_id.clone());
            if self.inner.add_job(&job_id, status.clone()).is_ok() {
                out.push(status);
            }
        }
        out
    }
}

/// The slots each live worker offers.
fn offered_slots(workers: &BTreeMap<u32, Arc<WorkerHandle>>) -> BTreeMap<u32, u32> {
    workers.iter().map(|(id, h)| (*id, h.slots)).collect()
}

impl Inner {
    /// Adds a job to those the coordinator knows (refused if one with its id has not ended;
    /// an ended one is replaced).
    fn add_job(&self, job_id: &str, status: Arc<JobStatus>) -> Result<(), String> {
        let mut jobs = self
            .jobs
            .lock()
            .map_err(|_| "the coordinator failed".to_string())?;
        if let Some(old) = jobs.get(job_id) {
            let state = old.status.view_state();
            if !state.is_ended() {
                return Err(format!("job {job_id} is {state} on this coordinator"));
            }
        }
        // The end is recorded before anyone sees it: a coordinator killed right after a job
        // showed CANCELED or FAILED never resumes it.
        let dir = self.opts.checkpoint_dir.join(job_id);
        let id = job_id.to_string();
        let leadership = self.opts.leadership.clone();
        status.on_end(move |view| {
            let Some(mut end) = EndRecord::of_view(view) else {
                return;
            };
            if let Some(l) = &leadership {
                end.epoch = l.epoch();
                if let Err(why) = l.check() {
                    error!("job {id} ended {} but this coordinator is no longer the leader ({why}): its end is not recorded; the leader resumes the job", end.state);
                    return;
                }
            }
            if let Err(e) = end.write(&dir) {
                error!("job {id} ended {} but its end could not be recorded ({e}); a restarted coordinator would resume it", end.state);
            }
        });
        jobs.insert(
            job_id.to_string(),
            JobEntry {
                events: None,
                attempts: HashMap::new(),
                status,
                cancel_acks: Default::default(),
                checks: HashMap::new(),
            },
        );
        Ok(())
    }

    /// Job `job_id` ended with `result`: its status says how (FAILED with the cause for any
    /// error but a cancel), `_end` records it durably, its slots and routing are released,
    /// every live worker is told to forget it, and the history drops the oldest ended jobs
    /// beyond its capacity.
    fn job_ended(
        &self,
        job_id: &str,
        status: &JobStatus,
        result: Result<crate::runtime::JobSummary, JobError>,
    ) {
        match &result {
            Ok(s) => info!(
                "job {job_id} finished: {} checkpoints, {} restarts",
                s.checkpoints_completed, s.restarts
            ),
            Err(JobError::Canceled) => {
                let _ = status.transition(JobState::Canceled, Actor::Coordinator, None);
                info!("job {job_id} cancelled");
            }
            Err(e) => {
                status.fail(Actor::Coordinator, &e.to_string());
                warn!("job {job_id} failed: {e}");
            }
        }
        // Its end was recorded as it entered it (the hook `add_job` set).
        if !status.view_state().is_ended() {
            error!(
                "job {job_id} ended in state {}, which is no end",
                status.view_state()
            );
        }
        if let Ok(mut slots) = self.slots.lock() {
            slots.release(job_id);
        }
        // Its subtasks' series, here and as workers reported them.
        crate::metrics::forget_job(job_id);
        // And what every worker keeps of it.
        let writers: Vec<Writer> = self
            .workers
            .lock()
            .map(|w| w.values().map(|h| h.writer.clone()).collect())
            .unwrap_or_default();
        for w in writers {
            let _ = send(
                &w,
                &ToWorker::JobEnded {
                    job_id: job_id.to_string(),
                },
            );
        }
        self.workers_changed.notify_all();
        let forgotten = {
            let Ok(mut jobs) = self.jobs.lock() else {
                return;
            };
            if let Some(entry) = jobs.get_mut(job_id) {
                entry.events = None;
                entry.attempts.clear();
                entry.cancel_acks.clear();
                entry.checks.clear();
            }
            let mut ended: Vec<(u64, String)> = jobs
                .iter()
                .filter_map(|(id, e)| {
                    let v = e.status.view();
                    v.state
                        .is_ended()
                        .then(|| (v.end_time.unwrap_or(0), id.clone()))
                })
                .collect();
            ended.sort();
            let excess = ended.len().saturating_sub(self.opts.history);
            let forgotten: Vec<String> = ended.into_iter().take(excess).map(|(_, id)| id).collect();
            for id in &forgotten {
                jobs.remove(id);
            }
            forgotten
        };
        if let Ok(hook) = self.on_forget.lock() {
            if let Some(f) = hook.as_ref() {
                for id in &forgotten {
                    f(id);
                }
            }
        }
    }
}

/// Fails over the jobs that ran on `worker`; `planned`: it left on purpose, and their
/// restarts spend no budget.
fn notify_jobs_of_lost_worker(inner: &Inner, worker: u32, reason: &str, planned: bool) {
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
                    planned,
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
            if let Err(why) = inner.fenced() {
                // Closed without a refusal: the worker tries the next coordinator it knows.
                warn!("worker at {peer} turned away: {why}");
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
        leaving: AtomicBool::new(false),
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
            Ok(ToCoordinator::Leaving) => {
                handle.leaving.store(true, Ordering::Release);
                break "it left on purpose (drained)".to_string();
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
    let planned = handle.leaving.load(Ordering::Acquire);
    notify_jobs_of_lost_worker(inner, id, reason, planned);
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
    status: Arc<JobStatus>,
    job: String,
    /// The parameters as JSON text.
    params: String,
    seed: u64,
    fingerprint: String,
    inject: Option<InjectSpec>,
    inject_uid: Option<String>,
    /// Attempts being made ready for deployment (one per region of a deployment).
    preparing: BTreeMap<u32, Preparing>,
    /// Cancelled attempts whose workers have not confirmed yet: the next deployment waits for
    /// them (up to [`CANCEL_WAIT`]), so that two attempts never overlap.
    cancelling: Arc<Mutex<Vec<Cancelling>>>,
}

/// An attempt on its way to deployment: [`Executor::poll_ready`] advances it without blocking.
struct Preparing {
    /// When the master first asked (the slot wait counts from here).
    since: Instant,
    /// Reserved slots, the spec, and when the job check was sent.
    checked: Option<(Reserved, Instant)>,
    /// Every worker answered the job check: it can be deployed.
    ready: bool,
}

/// Slots reserved for an attempt and what deploying it takes.
struct Reserved {
    spec: DeploySpec,
    /// The workers the attempt runs on.
    writers: Vec<(u32, Writer)>,
    used: Vec<u32>,
    descriptions: Vec<crate::runtime::plan::TaskDescription>,
}

struct Cancelling {
    attempt: u32,
    workers: Vec<u32>,
    until: Instant,
}

/// How long a deployment waits for the workers to answer a job check.
const JOB_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a cancellation waits for workers to confirm that an attempt's subtasks stopped.
const CANCEL_WAIT: Duration = Duration::from_secs(10);

impl ClusterExecutor {
    /// Reserves the job's slots (keeping those it holds on live workers) if enough are free.
    /// Returns the worker of each slot and the live workers, or why there are not enough.
    #[allow(clippy::type_complexity)]
    fn try_reserve(
        &self,
        needed: u32,
    ) -> Result<Result<(Vec<u32>, Vec<(u32, Arc<WorkerHandle>)>), String>, TaskError> {
        let workers = self
            .inner
            .workers
            .lock()
            .map_err(|_| TaskError::Cancelled)?;
        let offered = offered_slots(&workers);
        let reserved = match self.inner.slots.lock() {
            Ok(mut t) => t.reserve(&self.job_id, needed, &offered),
            Err(_) => return Err(TaskError::Cancelled),
        };
        Ok(reserved
            .map(|owners| {
                let live = workers.iter().map(|(id, h)| (*id, h.clone())).collect();
                (owners, live)
            })
            .map_err(|shortage| shortage.to_string()))
    }

    /// Whether every cancelled attempt stopped (its live workers confirmed, or it waited
    /// [`CANCEL_WAIT`]); forgets those that did.
    fn cancellations_done(&self) -> bool {
        let live = self.inner.live_workers();
        let now = Instant::now();
        let Ok(mut jobs) = self.inner.jobs.lock() else {
            return true;
        };
        let Ok(mut cancelling) = self.cancelling.lock() else {
            return true;
        };
        let entry = jobs.get_mut(&self.job_id);
        let acked = |c: &Cancelling, id: &u32| {
            entry
                .as_ref()
                .is_some_and(|j| j.cancel_acks.contains(&(c.attempt, *id)))
        };
        let done: Vec<u32> = cancelling
            .iter()
            .filter(|c| {
                now >= c.until
                    || c.workers
                        .iter()
                        .all(|id| !live.contains(id) || acked(c, id))
            })
            .map(|c| c.attempt)
            .collect();
        cancelling.retain(|c| !done.contains(&c.attempt));
        if let Some(j) = entry {
            j.cancel_acks.retain(|(a, _)| !done.contains(a));
        }
        cancelling.is_empty()
    }

    /// The deployment spec of attempt `req` on the reserved slots.
    fn reserved(
        &self,
        req: &DeployRequest<'_>,
        slot_owner: Vec<u32>,
        workers: Vec<(u32, Arc<WorkerHandle>)>,
    ) -> Result<Reserved, TaskError> {
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
            assignment,
            deploy_mask: mask,
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
        Ok(Reserved {
            spec,
            writers,
            used,
            descriptions,
        })
    }

    /// Asks every worker the attempt uses whether it can build the job and plans the same
    /// graph, before anything is deployed.
    fn send_job_check(&self, r: &Reserved) -> Result<(), TaskError> {
        for (id, w) in &r.writers {
            if !send(w, &ToWorker::CheckJob(Box::new(r.spec.clone()))) {
                return Err(TaskError::msg(format!("worker {id} is unreachable")));
            }
        }
        Ok(())
    }

    /// The workers' answers to the job check sent at `sent`: ready when all can run the
    /// attempt; a refusal fails the job at once (no restart can make a worker's binary have the
    /// job).
    fn job_check_answered(&self, r: &Reserved, sent: Instant) -> Poll<Result<(), TaskError>> {
        let attempt = r.spec.attempt;
        let Ok(mut jobs) = self.inner.jobs.lock() else {
            return Poll::Ready(Err(TaskError::Cancelled));
        };
        let answers = jobs.get(&self.job_id).map(|j| &j.checks);
        let mut missing = Vec::new();
        for (id, _) in &r.writers {
            match answers.and_then(|a| a.get(&(attempt, *id))) {
                Some(Some(refusal)) => {
                    return Poll::Ready(Err(TaskError::Unrecoverable(refusal.clone())))
                }
                Some(None) => {}
                None => missing.push(*id),
            }
        }
        if missing.is_empty() {
            if let Some(j) = jobs.get_mut(&self.job_id) {
                j.checks.retain(|(a, _), _| *a != attempt);
            }
            return Poll::Ready(Ok(()));
        }
        drop(jobs);
        let live = self.inner.live_workers();
        if let Some(gone) = missing.iter().find(|id| !live.contains(id)) {
            return Poll::Ready(Err(TaskError::msg(format!(
                "worker {gone} was lost before it answered the job check"
            ))));
        }
        if sent.elapsed() >= JOB_CHECK_TIMEOUT {
            return Poll::Ready(Err(TaskError::msg(format!(
                "workers {missing:?} did not answer the job check within {}s",
                JOB_CHECK_TIMEOUT.as_secs()
            ))));
        }
        Poll::Pending
    }

    /// One step towards deploying `req`; see [`Executor::poll_ready`].
    fn advance(&mut self, req: &DeployRequest<'_>) -> Poll<Result<(), TaskError>> {
        let p = self
            .preparing
            .entry(req.attempt)
            .or_insert_with(|| Preparing {
                since: Instant::now(),
                checked: None,
                ready: false,
            });
        if p.ready {
            return Poll::Ready(Ok(()));
        }
        if !self.cancellations_done() {
            return Poll::Pending;
        }
        let Some(p) = self.preparing.get(&req.attempt) else {
            return Poll::Pending;
        };
        if let Some((r, sent)) = &p.checked {
            let answered = self.job_check_answered(r, *sent);
            if let (Poll::Ready(Ok(())), Some(p)) =
                (&answered, self.preparing.get_mut(&req.attempt))
            {
                p.ready = true;
            }
            return answered;
        }
        let since = p.since;
        let (slot_owner, workers) = match self.try_reserve(req.plan.slots_needed()) {
            Err(e) => return Poll::Ready(Err(e)),
            Ok(Ok(reserved)) => reserved,
            Ok(Err(shortage)) if since.elapsed() >= self.inner.opts.slot_wait => {
                return Poll::Ready(Err(TaskError::msg(format!(
                    "{shortage} (waited {:?}, --slot-wait)",
                    self.inner.opts.slot_wait
                ))))
            }
            Ok(Err(_)) => return Poll::Pending,
        };
        let reserved = match self.reserved(req, slot_owner, workers) {
            Ok(r) => r,
            Err(e) => return Poll::Ready(Err(e)),
        };
        if let Err(e) = self.send_job_check(&reserved) {
            return Poll::Ready(Err(e));
        }
        if let Some(p) = self.preparing.get_mut(&req.attempt) {
            p.checked = Some((reserved, Instant::now()));
        }
        Poll::Pending
    }
}

struct ClusterDeployment {
    inner: Arc<Inner>,
    job_id: String,
    attempt: u32,
    workers: Vec<(u32, Writer)>,
    infos: Vec<DeployedTask>,
    cancelling: Arc<Mutex<Vec<Cancelling>>>,
}

impl Executor for ClusterExecutor {
    /// Waits for nothing: the slots, the workers' answers to the job check and the stop of
    /// the attempts it replaces are looked at, and the master asks again later.
    fn poll_ready(&mut self, req: &DeployRequest<'_>) -> Poll<Result<(), TaskError>> {
        let poll = self.advance(req);
        if let Poll::Ready(Err(_)) = poll {
            self.preparing.remove(&req.attempt);
        }
        poll
    }

    fn deploy(&mut self, req: &DeployRequest<'_>) -> Result<Box<dyn Deployed>, TaskError> {
        let prepared = self
            .preparing
            .remove(&req.attempt)
            .filter(|p| p.ready)
            .and_then(|p| p.checked);
        let Some((r, _)) = prepared else {
            return Err(TaskError::msg(format!(
                "attempt {} was deployed before it was ready",
                req.attempt
            )));
        };
        if let Ok(mut jobs) = self.inner.jobs.lock() {
            if let Some(j) = jobs.get_mut(&self.job_id) {
                j.events = Some(req.events.clone());
                j.attempts.insert(req.attempt, r.used.clone());
            }
        }
        for (id, w) in &r.writers {
            if !send(w, &ToWorker::Deploy(Box::new(r.spec.clone()))) {
                return Err(TaskError::msg(format!("worker {id} is unreachable")));
            }
        }
        let assignment = &r.spec.assignment;
        let mask = &r.spec.deploy_mask;
        let infos = r
            .descriptions
            .into_iter()
            .enumerate()
            .filter(|(task, _)| mask[*task])
            .map(|(task, d)| {
                let writer = r
                    .writers
                    .iter()
                    .find(|(id, _)| *id == assignment[task])
                    .map(|(_, w)| w.clone())
                    .unwrap_or_else(|| r.writers[0].1.clone());
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
            "job {}: attempt {} deployed on workers {:?}",
            self.job_id, req.attempt, r.used
        );
        Ok(Box::new(ClusterDeployment {
            inner: self.inner.clone(),
            job_id: self.job_id.clone(),
            attempt: req.attempt,
            workers: r.writers,
            infos,
            cancelling: self.cancelling.clone(),
        }))
    }

    fn abandon(&mut self, attempt: u32) {
        self.preparing.remove(&attempt);
    }

    /// Waits (up to [`CANCEL_WAIT`] each) until the workers confirmed that the cancelled
    /// attempts stopped, so that the job's end is reported when nothing of it runs.
    fn wait_stopped(&mut self) {
        loop {
            if self.cancellations_done() {
                return;
            }
            let Ok(jobs) = self.inner.jobs.lock() else {
                return;
            };
            let _ = self
                .inner
                .jobs_changed
                .wait_timeout(jobs, Duration::from_millis(100));
        }
    }
}

impl Deployed for ClusterDeployment {
    fn infos(&self) -> &[DeployedTask] {
        &self.infos
    }

    /// Tells the workers to cancel the attempt and returns: the next deployment of the job
    /// (and its end) waits for their confirmations.
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
        if let Ok(mut jobs) = self.inner.jobs.lock() {
            if let Some(j) = jobs.get_mut(&self.job_id) {
                j.attempts.remove(&self.attempt);
            }
        }
        if let Ok(mut c) = self.cancelling.lock() {
            c.push(Cancelling {
                attempt: self.attempt,
                workers: self.workers.iter().map(|(id, _)| *id).collect(),
                until: Instant::now() + CANCEL_WAIT,
            });
        }
    }

    fn join(self: Box<Self>) {}
}
