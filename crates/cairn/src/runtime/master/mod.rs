//! The job master's event loop: performs what [`MasterCore`] decides on real subtasks.
//!
//! Everything arrives as a [`JobEvent`] on one queue (acks, declines, source exhaustion, task
//! exits, lost workers) or as a deadline of the loop (the next checkpoint trigger, a checkpoint
//! timeout, a scheduled restart). The loop never sleeps: a restart's backoff is a deadline like
//! the others, so acknowledgements of the other regions, their checkpoints' bookkeeping and a
//! cancellation are handled while a failed region waits for its restart. The decisions (what
//! to deploy, cancel, restart, trigger, and when the job ends) are [`MasterCore`]'s, which the
//! simulation drives too; this module only deploys, cancels, delivers mail and reads
//! checkpoints back from storage.

mod core;
mod storage;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use tracing::{debug, info, warn};

#[cfg(test)]
pub(crate) use self::core::MasterFlaw;
pub(crate) use self::core::{MasterAction, MasterCore, Outcome};
use self::storage::{run_sink_inits, sink_inits, SinkInit, StorageDone, StorageJob, StorageThread};
use super::channel::Mail;
use super::deploy::{region_mask, Deployed, DeployedTask, Deployer, Executor};
use super::graph::JobGraph;
use super::job::{JobError, Progress, ProgressFn};
use super::lifecycle::master_steps;
use super::restart::RestartTracker;
use super::status::{Actor, JobCommand, JobState, JobStatus, SavepointKind, SavepointState};
use super::task::{JobEvent, JobMetrics};
use crate::checkpoint::coordinator::{CompletedCheckpoint, TaskInfo};
use crate::checkpoint::{
    CheckpointCoordinator, LoadedCheckpoint, SavepointOutcome, SavepointRequest, TaskMessage,
};
use crate::error::TaskError;
use crate::storage::FsStorage;

/// How often the loop wakes with nothing to do (progress lines).
const IDLE_WAKE: Duration = Duration::from_millis(200);
/// How often the progress callback runs.
const PROGRESS_INTERVAL: Duration = Duration::from_secs(1);

/// What the job master is started with.
pub(crate) struct MasterSetup<'a> {
    pub(crate) graph: &'a JobGraph,
    pub(crate) deployer: Deployer<'a>,
    pub(crate) events: Receiver<JobEvent>,
    pub(crate) coordinator: Option<CheckpointCoordinator>,
    pub(crate) status: Arc<JobStatus>,
    pub(crate) restarts: RestartTracker,
    pub(crate) regions: Vec<Vec<usize>>,
    pub(crate) region_failover: bool,
    pub(crate) restored: Option<LoadedCheckpoint>,
    pub(crate) metrics: Arc<JobMetrics>,
    pub(crate) on_progress: Option<ProgressFn>,
    pub(crate) started: Instant,
}

/// How a job that finished went.
pub(crate) struct Finished {
    pub(crate) checkpoints: Vec<CompletedCheckpoint>,
    pub(crate) completed_checkpoints: u64,
    pub(crate) failed_checkpoints: u64,
    pub(crate) restarts: u32,
}

/// The job master of one job run.
pub(crate) struct JobMaster<'a> {
    graph: &'a JobGraph,
    deployer: Deployer<'a>,
    events: Receiver<JobEvent>,
    /// Ready when the status has a request (savepoint, stop, cancel) for the master.
    nudges: Receiver<()>,
    status: Arc<JobStatus>,
    regions: Vec<Vec<usize>>,
    /// The state regions are deployed from when no checkpoint completed in this run.
    restored: Option<LoadedCheckpoint>,
    metrics: Arc<JobMetrics>,
    on_progress: Option<ProgressFn>,
    started: Instant,
    core: MasterCore,
    executor: &'a mut dyn Executor,
    /// Per region: the running deployment.
    deployments: Vec<Option<Box<dyn Deployed>>>,
    /// Per subtask: its latest deployment (its mailbox may be closed if it is not running).
    tasks: Vec<Option<DeployedTask>>,
    reported_state: JobState,
    last_progress: Instant,
    /// The deployment the core asked for that the executor is not ready for yet.
    pending: Option<PendingDeploy>,
    /// The thread running the master's storage I/O.
    storage: StorageThread,
    /// Numbers the storage work of redeployments (a late result of an abandoned one is
    /// ignored).
    storage_seq: u64,
}

/// A redeployment on its way: its checkpoint is read back (storage thread), the executor made
/// ready (asked again every [`DEPLOY_POLL`]), its sinks initialized (storage thread), then it
/// is deployed. The loop handles everything else meanwhile.
struct PendingDeploy {
    regions: Vec<(usize, u32)>,
    sources_stopped: bool,
    stage: Stage,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// Reading checkpoint back (the storage work numbered so).
    Loading(u64),
    /// Waiting for the executor.
    Polling,
    /// Initializing the sinks (the storage work numbered so).
    InitSinks(u64),
}

/// How often the loop asks the executor again about a pending deployment.
const DEPLOY_POLL: Duration = Duration::from_millis(20);

impl<'a> JobMaster<'a> {
    /// Deploys every region. A deployment failure here is a setup error, not a restart.
    pub(crate) fn start(
        setup: MasterSetup<'a>,
        executor: &'a mut dyn Executor,
    ) -> Result<Self, JobError> {
        let total = setup.deployer.plan.total_tasks();
        let core = MasterCore::new(
            setup.regions.clone(),
            setup.region_failover,
            setup.coordinator,
            setup.restarts,
        );
        let storage = StorageThread::start(setup.deployer.events.clone())?;
        let mut master = JobMaster {
            graph: setup.graph,
            deployer: setup.deployer,
            events: setup.events,
            nudges: setup.status.nudges(),
            status: setup.status,
            deployments: (0..setup.regions.len()).map(|_| None).collect(),
            regions: setup.regions,
            restored: setup.restored,
            metrics: setup.metrics,
            on_progress: setup.on_progress,
            started: setup.started,
            core,
            executor,
            tasks: vec![None; total],
            reported_state: JobState::Created,
            last_progress: Instant::now(),
            pending: None,
            storage,
            storage_seq: 0,
        };
        // The sinks were initialized when the job was prepared (`job::prepare_job`).
        master.core.start();
        let Some(MasterAction::Deploy { regions, .. }) = master.core.next_action() else {
            return Err(JobError::Setup(
                "the job master did not deploy the job".into(),
            ));
        };
        let ready = master.wait_until_ready(&regions);
        let now = Instant::now();
        match ready.and_then(|()| master.deploy(&regions, false)) {
            Ok(infos) if infos.len() == total => master.core.deployed(infos, now),
            Ok(_) => {
                master.cancel(&(0..master.regions.len()).collect::<Vec<_>>());
                return Err(JobError::Setup("some subtasks were not deployed".into()));
            }
            Err(e) => {
                master.cancel(&(0..master.regions.len()).collect::<Vec<_>>());
                if master.status.cancel_requested() {
                    master.status.set_state(JobState::Canceled);
                    return Err(JobError::Canceled);
                }
                let cause = e.to_string();
                master.status.fail(Actor::JobMaster, &cause);
                return Err(JobError::Setup(cause));
            }
        }
        master.perform(now);
        Ok(master)
    }

    /// Runs the loop until the job finished, was cancelled, or failed for good.
    pub(crate) fn run(mut self) -> Result<Finished, JobError> {
        loop {
            let now = Instant::now();
            self.core.poll(now);
            self.perform(now);
            self.take_commands();
            if self.core.outcome().is_none() && self.status.cancel_requested() {
                self.core
                    .cancel(self.deployer.config.retain_on_cancellation);
                self.perform(now);
            }
            if let Some(outcome) = self.core.outcome().cloned() {
                return self.end(outcome);
            }
            let polling = self
                .pending
                .as_ref()
                .is_some_and(|p| p.stage == Stage::Polling);
            let idle = now + if polling { DEPLOY_POLL } else { IDLE_WAKE };
            let wake = self.core.next_wake(now).map_or(idle, |w| w.min(idle));
            // A savepoint, stop or cancel request wakes the loop at once.
            crossbeam_channel::select! {
                recv(self.events) -> e => match e {
                    Ok(e) => self.core.on_event(e, Instant::now()),
                    Err(_) => self
                        .core
                        .on_job_failure("event channel closed".into(), false, Instant::now()),
                },
                recv(self.nudges) -> _ => {}
                recv(self.storage.done) -> d => {
                    if let Ok(d) = d {
                        self.storage_done(d, Instant::now());
                    }
                }
                default(wake.saturating_duration_since(now)) => {}
            }
            self.perform(Instant::now());
            self.report();
        }
    }

    /// Performs the core's actions, and what they lead to, until there are none.
    fn perform(&mut self, now: Instant) {
        loop {
            self.perform_actions();
            if !self.advance_deployment(now) {
                break;
            }
        }
        for (request_id, outcome) in self.core.drain_savepoint_outcomes() {
            let state = match outcome {
                SavepointOutcome::Completed { location, .. } => {
                    debug!("savepoint {request_id} completed at {location}");
                    SavepointState::Completed { location }
                }
                SavepointOutcome::Failed(cause) => {
                    warn!("savepoint {request_id} failed: {cause}");
                    SavepointState::Failed { cause }
                }
            };
            self.status.savepoint_ended(&request_id, state);
        }
        self.storage.run(self.core.drain_storage());
        self.sync_state();
    }

    /// Performs the core's actions until there are none; a deployment becomes pending.
    fn perform_actions(&mut self) {
        while let Some(action) = self.core.next_action() {
            match action {
                MasterAction::Deploy {
                    regions,
                    from,
                    sources_stopped,
                } => {
                    self.abandon_pending();
                    let stage = match from {
                        Some(id) => Stage::Loading(self.send_storage_job(|seq| StorageJob::Load {
                            seq,
                            storage: self.deployer.storage.clone(),
                            job_id: self.deployer.job_id.to_string(),
                            id,
                        })),
                        None => {
                            self.log_restore(&regions);
                            Stage::Polling
                        }
                    };
                    self.pending = Some(PendingDeploy {
                        regions,
                        sources_stopped,
                        stage,
                    });
                }
                MasterAction::Cancel { regions } => {
                    if self
                        .pending
                        .as_ref()
                        .is_some_and(|p| p.regions.iter().any(|(r, _)| regions.contains(r)))
                    {
                        self.abandon_pending();
                    }
                    self.cancel(&regions)
                }
                MasterAction::Message { task, message } => self.send(
                    task,
                    match message {
                        TaskMessage::Trigger(b, kind) => Mail::TriggerCheckpoint(b, kind),
                        TaskMessage::Complete(id) => Mail::CheckpointComplete(id),
                        TaskMessage::Aborted(id) => Mail::CheckpointAborted(id),
                    },
                ),
                MasterAction::EndOfInput { task } => self.send(task, Mail::EndOfInput),
            }
        }
    }

    /// Hands the commands requested from outside (savepoints) to the core.
    fn take_commands(&mut self) {
        for command in self.status.take_commands() {
            match command {
                JobCommand::Savepoint {
                    request_id,
                    target_dir,
                    kind,
                } => {
                    match savepoint_request(&request_id, &target_dir, self.deployer.job_id, kind) {
                        Ok(request) => self.core.request_savepoint(request),
                        Err(cause) => self
                            .status
                            .savepoint_ended(&request_id, SavepointState::Failed { cause }),
                    }
                }
            }
        }
    }

    /// Sends mail to a subtask. A closed mailbox means the subtask is gone; its attempt is
    /// failing anyway.
    fn send(&self, task: usize, mail: Mail) {
        if let Some(t) = self.tasks.get(task).and_then(Option::as_ref) {
            let _ = t.mailbox.send(mail);
        }
    }

    fn send_storage_job(&mut self, job: impl FnOnce(u64) -> StorageJob) -> u64 {
        self.storage_seq += 1;
        let seq = self.storage_seq;
        self.storage.send(job(seq));
        seq
    }

    fn log_restore(&self, regions: &[(usize, u32)]) {
        let scope: BTreeSet<usize> = regions.iter().map(|&(r, _)| r).collect();
        match &self.restored {
            Some(c) => info!(
                "restoring regions {scope:?} from checkpoint {} ({})",
                c.id(),
                c.location
            ),
            None => info!("restarting regions {scope:?} without state (no checkpoint completed)"),
        }
    }

    /// The sinks of `regions`, with what the restored checkpoint holds for them.
    fn region_sinks(&self, regions: &[(usize, u32)]) -> Vec<SinkInit> {
        let scope: BTreeSet<usize> = regions.iter().map(|&(r, _)| r).collect();
        let plan = self.deployer.plan;
        let region_of = |task: usize| self.regions.iter().position(|r| r.contains(&task));
        let in_scope = |node: usize| {
            let task = plan.offsets[plan.node_vertex[node]];
            region_of(task).is_some_and(|r| scope.contains(&r))
        };
        sink_inits(
            self.graph,
            self.deployer.job_id,
            self.restored.as_ref(),
            in_scope,
        )
    }

    /// A redeployment's storage work ended: the next stage, or the deployment, or its failure.
    fn storage_done(&mut self, done: StorageDone, now: Instant) {
        let Some(mut p) = self.pending.take() else {
            return;
        };
        match (p.stage, done) {
            (Stage::Loading(expected), StorageDone::Loaded { seq, id, result })
                if seq == expected =>
            {
                match result {
                    Ok(loaded) => {
                        self.restored = Some(*loaded);
                        self.log_restore(&p.regions);
                        p.stage = Stage::Polling;
                        self.pending = Some(p);
                    }
                    Err(e) => self.deployment_failed(
                        TaskError::msg(format!("cannot read back completed checkpoint {id}: {e}")),
                        now,
                    ),
                }
            }
            (Stage::InitSinks(expected), StorageDone::SinksReady { seq, result })
                if seq == expected =>
            {
                let deployed = result
                    .map_err(TaskError::msg)
                    .and_then(|()| self.deploy(&p.regions, p.sources_stopped));
                match deployed {
                    Ok(infos) => self.core.deployed(infos, now),
                    Err(e) => {
                        let failed: Vec<usize> = p.regions.iter().map(|&(r, _)| r).collect();
                        self.cancel(&failed);
                        let e = match e {
                            TaskError::Unrecoverable(e) => TaskError::Unrecoverable(e),
                            e => TaskError::msg(format!("the job could not be redeployed: {e}")),
                        };
                        self.deployment_failed(e, now)
                    }
                }
            }
            // A result of an abandoned deployment's work.
            _ => self.pending = Some(p),
        }
    }

    /// Whether every region of `regions` is ready to deploy: the executor's answer for the
    /// first one that is not.
    fn poll_ready(
        &mut self,
        regions: &[(usize, u32)],
        sources_stopped: bool,
    ) -> Poll<Result<(), TaskError>> {
        let total = self.tasks.len();
        for &(r, attempt) in regions {
            let mask = region_mask(&self.regions[r], total);
            let req =
                self.deployer
                    .request(self.restored.as_ref(), &mask, attempt, sources_stopped);
            match self.executor.poll_ready(&req) {
                Poll::Ready(Ok(())) => {}
                other => return other,
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Asks the executor about the pending deployment; once every region is ready, its sinks
    /// are initialized (the attempts it replaces have stopped writing). Returns whether the
    /// core has news (the deployment failed).
    fn advance_deployment(&mut self, now: Instant) -> bool {
        let Some(p) = self.pending.take() else {
            return false;
        };
        if p.stage != Stage::Polling {
            self.pending = Some(p);
            return false;
        }
        match self.poll_ready(&p.regions, p.sources_stopped) {
            Poll::Pending => {
                self.pending = Some(p);
                false
            }
            Poll::Ready(Err(e)) => {
                for &(_, attempt) in &p.regions {
                    self.executor.abandon(attempt);
                }
                self.deployment_failed(e, now);
                true
            }
            Poll::Ready(Ok(())) => {
                let sinks = self.region_sinks(&p.regions);
                let seq = self.send_storage_job(|seq| StorageJob::InitSinks { seq, sinks });
                self.pending = Some(PendingDeploy {
                    stage: Stage::InitSinks(seq),
                    ..p
                });
                false
            }
        }
    }

    /// A redeployment failed: a failure of the job (restarted, or ending it), unless a cancel
    /// interrupted it.
    fn deployment_failed(&mut self, e: TaskError, now: Instant) {
        if self.status.cancel_requested() {
            self.core
                .cancel(self.deployer.config.retain_on_cancellation);
            return;
        }
        let unrecoverable = matches!(e, TaskError::Unrecoverable(_));
        self.core.on_job_failure(e.to_string(), unrecoverable, now);
    }

    /// Drops the pending deployment, if any: its regions were cancelled.
    fn abandon_pending(&mut self) {
        if let Some(p) = self.pending.take() {
            for &(_, attempt) in &p.regions {
                self.executor.abandon(attempt);
            }
        }
    }

    /// The first deployment: waits until the executor is ready (nothing else runs yet), or a
    /// cancel.
    fn wait_until_ready(&mut self, regions: &[(usize, u32)]) -> Result<(), TaskError> {
        loop {
            match self.poll_ready(regions, false) {
                Poll::Ready(r) => return r,
                Poll::Pending if self.status.cancel_requested() => {
                    for &(_, attempt) in regions {
                        self.executor.abandon(attempt);
                    }
                    return Err(TaskError::Cancelled);
                }
                Poll::Pending => {
                    let _ = self.nudges.recv_timeout(DEPLOY_POLL);
                }
            }
        }
    }

    /// Deploys `regions`, each as its attempt; returns their subtasks.
    fn deploy(
        &mut self,
        regions: &[(usize, u32)],
        sources_stopped: bool,
    ) -> Result<Vec<TaskInfo>, TaskError> {
        let total = self.tasks.len();
        let mut infos = Vec::new();
        for &(r, attempt) in regions {
            let mask = region_mask(&self.regions[r], total);
            let req =
                self.deployer
                    .request(self.restored.as_ref(), &mask, attempt, sources_stopped);
            let d = self.executor.deploy(&req)?;
            for t in d.infos() {
                infos.push(t.info.clone());
                let index = t.info.index;
                if let Some(slot) = self.tasks.get_mut(index) {
                    *slot = Some(t.clone());
                }
            }
            self.deployments[r] = Some(d);
        }
        Ok(infos)
    }

    fn cancel(&mut self, regions: &[usize]) {
        for &r in regions {
            if let Some(d) = self.deployments.get_mut(r).and_then(Option::take) {
                d.cancel();
            }
        }
    }

    /// The core's state, restarts and failure cause, for observers.
    fn sync_state(&mut self) {
        let state = self.core.state();
        // A terminal state is reported when the job's end is done (subtasks joined,
        // checkpoints recorded).
        if state != self.reported_state && !state.is_terminal() {
            self.follow(state);
        }
        let restarts = self.core.restart_count();
        let cause = self.core.failure_cause().map(str::to_string);
        let (causes, exceptions) = (self.core.restart_causes(), self.core.exceptions());
        self.status.update(|v| {
            v.restarts = restarts;
            if cause.is_some() {
                v.failure_cause = cause;
            }
            v.restart_causes = causes;
            v.exceptions = exceptions;
        });
    }

    /// Moves the job's status to the core's `state` (see [`master_steps`]).
    fn follow(&mut self, state: JobState) {
        let cause = self.core.failure_cause();
        for (to, actor, cause) in master_steps(self.reported_state, state, cause) {
            let _ = self.status.transition(to, actor, cause);
        }
        self.reported_state = state;
    }

    /// The job ended: joins or cancels what runs and reports how it went.
    fn end(mut self, outcome: Outcome) -> Result<Finished, JobError> {
        self.perform(Instant::now());
        self.abandon_pending();
        // Deletions of a cancelled job's checkpoints, the last retention: done before its
        // end is reported.
        self.storage.finish();
        if outcome != Outcome::Finished {
            self.executor.wait_stopped();
        }
        match outcome {
            Outcome::Finished => {
                let finished = self.finish_and_join();
                self.follow(JobState::Finished);
                Ok(finished)
            }
            Outcome::Canceled => {
                self.follow(JobState::Canceled);
                Err(JobError::Canceled)
            }
            Outcome::Failed { .. } => {
                // What the cancelled subtasks still reported: a more telling cause than "task
                // cancelled" may be among it.
                let now = Instant::now();
                while let Ok(e) = self.events.try_recv() {
                    self.core.on_event(e, now);
                }
                self.sync_state();
                self.follow(JobState::Failed);
                match self.core.outcome().cloned() {
                    Some(Outcome::Failed {
                        restarts,
                        cause,
                        reason,
                    }) => Err(JobError::Failed {
                        restarts,
                        cause,
                        reason,
                    }),
                    _ => Err(JobError::Canceled),
                }
            }
        }
    }

    fn finish_and_join(&mut self) -> Finished {
        for d in self.deployments.iter_mut().filter_map(Option::take) {
            d.join();
        }
        let (checkpoints, completed_checkpoints, failed_checkpoints) = match self.core.coordinator()
        {
            Some(c) => {
                sync_status(&self.status, c);
                (
                    c.completed().to_vec(),
                    c.completed_total(),
                    c.failed_total(),
                )
            }
            None => (Vec::new(), 0, 0),
        };
        Finished {
            checkpoints,
            completed_checkpoints,
            failed_checkpoints,
            restarts: self.core.restart_count(),
        }
    }

    /// Status for observers and the progress callback.
    fn report(&mut self) {
        if let Some(c) = self.core.coordinator() {
            sync_status(&self.status, c);
        }
        if let Some(cb) = &self.on_progress {
            if self.last_progress.elapsed() >= PROGRESS_INTERVAL {
                self.last_progress = Instant::now();
                cb(&progress(
                    &self.metrics,
                    self.core.coordinator(),
                    self.started,
                    self.core.restart_count(),
                ));
            }
        }
    }
}

/// A savepoint request into a new directory `savepoint-<job>-<random>` under `target_dir`.
fn savepoint_request(
    request_id: &str,
    target_dir: &Path,
    job_id: &str,
    kind: SavepointKind,
) -> Result<SavepointRequest, String> {
    std::fs::create_dir_all(target_dir).map_err(|e| {
        format!(
            "cannot create savepoint directory {}: {e}",
            target_dir.display()
        )
    })?;
    let target = FsStorage::open(target_dir).map_err(|e| e.to_string())?;
    let short: String = job_id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .take(6)
        .collect();
    let dir = format!(
        "savepoint-{short}-{:012x}",
        fastrand::u64(..) & 0xffff_ffff_ffff
    );
    Ok(SavepointRequest {
        request_id: request_id.to_string(),
        target: Arc::new(target),
        dir,
        stop: kind.stops(),
        drain: kind == SavepointKind::StopAndDrain,
    })
}

/// Runs the once-per-attempt initialization of the sinks `select`ed: commit the restored
/// checkpoint's pre-committed transactions, discard the rest.
pub(crate) fn init_sinks(
    graph: &JobGraph,
    job_id: &str,
    restored: Option<&LoadedCheckpoint>,
    select: impl Fn(usize) -> bool,
) -> Result<(), JobError> {
    run_sink_inits(sink_inits(graph, job_id, restored, select)).map_err(JobError::Setup)
}

fn sync_status(status: &JobStatus, c: &CheckpointCoordinator) {
    let completed = c.completed();
    let total = c.completed_total();
    let known = status.view_completed_count() as u64;
    let new = usize::try_from(total.saturating_sub(known)).unwrap_or(usize::MAX);
    for cp in &completed[completed.len().saturating_sub(new)..] {
        status.checkpoint_completed((*cp.metadata).clone());
    }
    status.set_completed_count(usize::try_from(total).unwrap_or(usize::MAX));
    status.update(|v| {
        v.checkpoint_counts.triggered = c.triggered_total();
        v.checkpoint_counts.in_progress = c.pending_count() as u64;
        v.checkpoint_counts.completed = total;
        v.checkpoint_counts.failed = c.failed_total();
    });
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
        checkpoints: c.map_or(0, |c| c.completed_total() as usize),
        last_checkpoint: c
            .and_then(|c| c.completed().last())
            .map(|l| (l.id, l.duration_ms, l.state_size)),
        restarts,
    }
}
