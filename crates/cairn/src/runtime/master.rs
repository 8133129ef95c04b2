//! The job master's event loop: deploys the pipelined regions, drives the checkpoint
//! coordinator, the final checkpoint and the end of the job, and handles failures.
//!
//! Everything arrives as a [`JobEvent`] on one queue (acks, declines, source exhaustion, task
//! exits, lost workers) or as a deadline of the loop (the next checkpoint trigger, a checkpoint
//! timeout, a scheduled restart). The loop never sleeps: a restart's backoff is a deadline like
//! the others, so acknowledgements of the other regions, their checkpoints' bookkeeping and a
//! cancellation are handled while a failed region waits for its restart.
//!
//! A failure restarts its pipelined region (failover strategy `region`) or the whole job. Its
//! subtasks are cancelled at once and marked as not running, so their late events are
//! ignored; in-flight checkpoints are aborted (they wait for subtasks that are gone). One
//! failure event is one failure for the restart strategy, however many regions it takes down
//! (a lost worker hosting several regions is one failure).

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError};
use tracing::{info, warn};

use super::channel::Mail;
use super::deploy::{region_mask, Deployed, DeployedTask, Deployer, Executor};
use super::graph::JobGraph;
use super::job::{JobError, Progress, ProgressFn};
use super::operators::{SinkOwner, SINK_PENDING_STATE};
use super::restart::RestartTracker;
use super::status::{JobState, JobStatus};
use super::task::{JobEvent, JobMetrics};
use crate::checkpoint::coordinator::{CompletedCheckpoint, TaskInfo};
use crate::checkpoint::{load_checkpoint, CheckpointCoordinator, LoadedCheckpoint, TaskMessage};
use crate::error::TaskError;

/// How often the loop wakes with nothing to do (progress lines, cancel requests).
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
    pub(crate) failed_checkpoints: u64,
    pub(crate) restarts: u32,
}

/// A failure and what it takes down.
struct Failure {
    cause: String,
    /// The pipelined regions it is confined to (None: the whole job).
    regions: Option<BTreeSet<usize>>,
}

impl Failure {
    fn job(cause: String) -> Self {
        Failure {
            cause,
            regions: None,
        }
    }
}

/// Regions waiting for their restart's backoff to pass.
struct ScheduledRestart {
    at: Instant,
    regions: BTreeSet<usize>,
}

/// A subtask index that runs in no attempt: its events are stale.
const NOT_RUNNING: u32 = u32::MAX;

/// The job master of one job run.
pub(crate) struct JobMaster<'a> {
    setup: MasterSetup<'a>,
    executor: &'a mut dyn Executor,
    region_of_task: Vec<usize>,
    restart_count: u32,
    next_attempt: u32,
    /// Per region: the running deployment.
    deployments: Vec<Option<Box<dyn Deployed>>>,
    /// Per subtask: the latest deployment of it (its mailbox may be closed if it is not running).
    tasks: Vec<DeployedTask>,
    /// Per subtask: the attempt it runs in, or [`NOT_RUNNING`].
    task_attempt: Vec<u32>,
    exhausted: Vec<bool>,
    exited: Vec<bool>,
    final_checkpoint: Option<u64>,
    end_sent: bool,
    restart: Option<ScheduledRestart>,
    last_progress: Instant,
}

impl<'a> JobMaster<'a> {
    /// Deploys every region. A deployment failure here is a setup error, not a restart.
    pub(crate) fn start(
        setup: MasterSetup<'a>,
        executor: &'a mut dyn Executor,
    ) -> Result<Self, JobError> {
        let total = setup.deployer.plan.total_tasks();
        let mut region_of_task = vec![0usize; total];
        for (r, tasks) in setup.regions.iter().enumerate() {
            for &t in tasks {
                region_of_task[t] = r;
            }
        }
        let mut master = JobMaster {
            deployments: (0..setup.regions.len()).map(|_| None).collect(),
            setup,
            executor,
            region_of_task,
            restart_count: 0,
            next_attempt: 0,
            tasks: Vec::new(),
            task_attempt: vec![NOT_RUNNING; total],
            exhausted: vec![false; total],
            exited: vec![false; total],
            final_checkpoint: None,
            end_sent: false,
            restart: None,
            last_progress: Instant::now(),
        };
        let all: BTreeSet<usize> = (0..master.setup.regions.len()).collect();
        let mut deployed: Vec<Option<DeployedTask>> = vec![None; total];
        init_sinks(
            master.setup.graph,
            master.setup.deployer.job_id,
            master.setup.restored.as_ref(),
            |_| true,
        )?;
        if let Err(e) = master.deploy_regions(&all, &mut deployed) {
            master.cancel_all();
            master.setup.status.set_state(JobState::Failed);
            return Err(JobError::Setup(e.to_string()));
        }
        let Some(tasks) = deployed.into_iter().collect::<Option<Vec<_>>>() else {
            master.cancel_all();
            return Err(JobError::Setup("some subtasks were not deployed".into()));
        };
        master.tasks = tasks;
        master.running(Instant::now());
        Ok(master)
    }

    /// Runs the loop until the job finished, was cancelled, or failed for good.
    pub(crate) fn run(mut self) -> Result<Finished, JobError> {
        loop {
            let now = Instant::now();
            if self.restart.as_ref().is_some_and(|r| now >= r.at) {
                if let Err(failure) = self.restart_due(now) {
                    self.on_failure(failure, now)?;
                }
                continue;
            }
            if self.setup.status.cancel_requested() {
                self.cancel_all();
                self.setup.status.set_state(JobState::Canceled);
                return Err(JobError::Canceled);
            }
            let wake = self.next_wake(now);
            let event = match self
                .setup
                .events
                .recv_timeout(wake.saturating_duration_since(now))
            {
                Ok(e) => Some(e),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => {
                    self.on_failure(Failure::job("event channel closed".into()), now)?;
                    continue;
                }
            };
            let now = Instant::now();
            if let Some(failure) = event.and_then(|e| self.on_event(e, now)) {
                self.on_failure(failure, now)?;
                continue;
            }
            if self.restart.is_none() && self.exited.iter().all(|&e| e) {
                return Ok(self.finish());
            }
            if let Err(failure) = self.checkpoint_tick(now) {
                self.on_failure(failure, now)?;
            }
            self.report();
        }
    }

    /// The earliest deadline of the loop.
    fn next_wake(&self, now: Instant) -> Instant {
        let mut wake = now + IDLE_WAKE;
        if let Some(r) = &self.restart {
            wake = wake.min(r.at);
        }
        if let Some(c) = &self.setup.coordinator {
            // With max-concurrent checkpoints in flight, the next ack wakes the loop.
            if self.restart.is_none() && self.final_checkpoint.is_none() && c.has_room() {
                wake = wake.min(c.next_trigger_at(now));
            }
            if let Some(t) = c.next_timeout_at() {
                wake = wake.min(t);
            }
        }
        wake
    }

    fn is_current(&self, task: usize, attempt: u32) -> bool {
        attempt != NOT_RUNNING && self.task_attempt.get(task) == Some(&attempt)
    }

    fn running_attempts(&self) -> Vec<u32> {
        let set: BTreeSet<u32> = self
            .task_attempt
            .iter()
            .copied()
            .filter(|&a| a != NOT_RUNNING)
            .collect();
        set.into_iter().collect()
    }

    /// Handles one event; returns the failure it reports, if any.
    fn on_event(&mut self, event: JobEvent, now: Instant) -> Option<Failure> {
        match event {
            JobEvent::Ack(ack) => {
                let c = self.setup.coordinator.as_mut()?;
                let result = c.on_ack(ack, now);
                deliver(c, &self.tasks);
                match result {
                    Ok(done) => {
                        let final_done = self
                            .final_checkpoint
                            .is_some_and(|f| done.iter().any(|&d| d >= f));
                        if final_done && !self.end_sent {
                            self.end_of_input();
                        }
                        None
                    }
                    Err(e) => Some(Failure::job(e.to_string())),
                }
            }
            JobEvent::Decline {
                checkpoint_id,
                attempt,
                cause,
            } => {
                let c = self.setup.coordinator.as_mut()?;
                let result = c.on_decline(checkpoint_id, attempt, &cause, now);
                deliver(c, &self.tasks);
                result.err().map(|e| Failure::job(e.to_string()))
            }
            JobEvent::SourceExhausted { attempt, task } => {
                if self.is_current(task, attempt) {
                    self.exhausted[task] = true;
                }
                None
            }
            JobEvent::Lost { attempts, reason } => {
                let regions: BTreeSet<usize> = (0..self.task_attempt.len())
                    .filter(|&t| attempts.contains(&self.task_attempt[t]))
                    .filter(|&t| self.task_attempt[t] != NOT_RUNNING)
                    .map(|t| self.region_of_task[t])
                    .collect();
                (!regions.is_empty()).then_some(Failure {
                    cause: reason,
                    regions: Some(regions),
                })
            }
            JobEvent::Exited {
                attempt,
                task,
                result,
            } => {
                if !self.is_current(task, attempt) {
                    return None;
                }
                match result {
                    Ok(()) => {
                        self.exited[task] = true;
                        None
                    }
                    Err(e) => Some(Failure {
                        cause: e.to_string(),
                        regions: Some(BTreeSet::from([self.region_of_task[task]])),
                    }),
                }
            }
        }
    }

    /// The final checkpoint completed: sources emit end of stream and finish.
    fn end_of_input(&mut self) {
        self.end_sent = true;
        for t in self.tasks.iter().filter(|t| t.info.is_source) {
            let _ = t.mailbox.send(Mail::EndOfInput);
        }
    }

    /// Triggers periodic checkpoints and the final one, and aborts timed-out ones.
    fn checkpoint_tick(&mut self, now: Instant) -> Result<(), Failure> {
        if self.restart.is_some() {
            // Not every subtask runs: a checkpoint could not complete.
            return Ok(());
        }
        let Some(c) = self.setup.coordinator.as_mut() else {
            return Ok(());
        };
        let timeouts = c.check_timeouts(now);
        if let Some(f) = self.final_checkpoint {
            // The final checkpoint was aborted: take another one.
            let completed = c.completed().last().is_some_and(|x| x.id >= f);
            if !completed && c.pending_count() == 0 {
                self.final_checkpoint = None;
            }
        }
        let all_exhausted = self
            .tasks
            .iter()
            .filter(|t| t.info.is_source)
            .all(|t| self.exhausted[t.info.index]);
        if timeouts.is_ok() && self.final_checkpoint.is_none() {
            if all_exhausted {
                self.final_checkpoint = c.maybe_trigger(now, true);
            } else {
                c.maybe_trigger(now, false);
            }
        }
        deliver(c, &self.tasks);
        timeouts.map_err(|e| Failure::job(e.to_string()))
    }

    /// Cancels what a failure takes down and schedules its restart after the strategy's
    /// backoff; the job's end if the strategy gives up.
    fn on_failure(&mut self, failure: Failure, now: Instant) -> Result<(), JobError> {
        let checkpointing = self.setup.coordinator.is_some();
        let all: BTreeSet<usize> = (0..self.setup.regions.len()).collect();
        let scope = match failure.regions {
            Some(r) if self.setup.region_failover && !self.end_sent && checkpointing => r,
            _ => all.clone(),
        };
        let mut cause = failure.cause;
        if scope == all {
            let cancelled = self.running_attempts();
            self.cancel_all();
            // What the cancelled attempts still reported: a more telling cause than "task
            // cancelled" may be among it.
            cause = drain_cause(&self.setup.events, &cancelled, cause);
            warn!("job failed: {cause}");
        } else {
            for &r in &scope {
                if let Some(d) = self.deployments[r].take() {
                    d.cancel();
                }
            }
            match scope.iter().collect::<Vec<_>>()[..] {
                [r] => warn!("region {r} of the job failed: {cause}; restarting that region only"),
                _ => warn!(
                    "regions {scope:?} of the job failed: {cause}; restarting those regions only"
                ),
            }
        }
        for &r in &scope {
            for &t in &self.setup.regions[r] {
                self.task_attempt[t] = NOT_RUNNING;
                self.exhausted[t] = false;
                self.exited[t] = false;
            }
        }
        self.final_checkpoint = None;
        self.end_sent = false;
        self.setup
            .status
            .update(|v| v.failure_cause = Some(cause.clone()));
        if !checkpointing {
            self.setup.status.set_state(JobState::Failed);
            return Err(JobError::Failed {
                restarts: self.restart_count,
                cause,
                reason: "checkpointing is disabled, so nothing can be restored (at-most-once)"
                    .into(),
            });
        }
        let delay = self.decide_restart(cause, now)?;
        // In-flight checkpoints wait for subtasks that are gone: this aborts them.
        self.update_coordinator_tasks(now);
        info!(
            "restarting {scope:?} in {delay:?} (restart {})",
            self.restart_count
        );
        let mut regions = scope;
        if let Some(earlier) = self.restart.take() {
            regions.extend(earlier.regions);
        }
        self.restart = Some(ScheduledRestart {
            at: now + delay,
            regions,
        });
        Ok(())
    }

    /// Asks the restart strategy about a failure: the delay before restarting, or the job's end.
    fn decide_restart(&mut self, cause: String, now: Instant) -> Result<Duration, JobError> {
        match self.setup.restarts.on_failure(now) {
            Ok(delay) => {
                self.restart_count += 1;
                let n = self.restart_count;
                self.setup.status.update(|v| {
                    v.state = JobState::Restarting;
                    v.restarts = n;
                });
                Ok(delay)
            }
            Err(reason) => {
                self.cancel_all();
                self.setup.status.set_state(JobState::Failed);
                Err(JobError::Failed {
                    restarts: self.restart_count,
                    cause,
                    reason,
                })
            }
        }
    }

    /// The backoff of a scheduled restart passed: redeploy its regions from the newest
    /// completed checkpoint.
    fn restart_due(&mut self, now: Instant) -> Result<(), Failure> {
        let Some(restart) = self.restart.take() else {
            return Ok(());
        };
        // The state to restart from: the newest checkpoint completed by this run, else the one
        // the run started from. Read back from storage, so a restore is exactly what a new
        // process would see.
        if let Some(id) = self
            .setup
            .coordinator
            .as_ref()
            .and_then(|c| c.completed().last())
            .map(|c| c.id)
        {
            let storage = self.setup.deployer.storage;
            let loaded = load_checkpoint(storage.as_ref(), self.setup.deployer.job_id, id)
                .map_err(|e| {
                    Failure::job(format!("cannot read back completed checkpoint {id}: {e}"))
                })?;
            self.setup.restored = Some(loaded);
        }
        match &self.setup.restored {
            Some(c) => info!(
                "restoring regions {:?} from checkpoint {} ({})",
                restart.regions,
                c.id(),
                c.location
            ),
            None => info!(
                "restarting regions {:?} without state (no checkpoint completed)",
                restart.regions
            ),
        }
        let plan = self.setup.deployer.plan;
        let region_of_task = &self.region_of_task;
        let in_scope = |node: usize| {
            let task = plan.offsets[plan.node_vertex[node]];
            restart.regions.contains(&region_of_task[task])
        };
        init_sinks(
            self.setup.graph,
            self.setup.deployer.job_id,
            self.setup.restored.as_ref(),
            in_scope,
        )
        .map_err(|e| Failure::job(e.to_string()))?;
        let mut deployed: Vec<Option<DeployedTask>> = vec![None; self.tasks.len()];
        self.deploy_regions(&restart.regions, &mut deployed)
            .map_err(|e| Failure::job(format!("the job could not be redeployed: {e}")))?;
        for t in deployed.into_iter().flatten() {
            let index = t.info.index;
            self.tasks[index] = t;
        }
        self.running(now);
        Ok(())
    }

    /// Deploys `regions`, each as a new attempt, recording their subtasks in `deployed`.
    fn deploy_regions(
        &mut self,
        regions: &BTreeSet<usize>,
        deployed: &mut [Option<DeployedTask>],
    ) -> Result<(), TaskError> {
        let total = self.task_attempt.len();
        for &r in regions {
            let attempt = self.next_attempt;
            self.next_attempt += 1;
            let mask = region_mask(&self.setup.regions[r], total);
            let d = self.setup.deployer.deploy(
                self.executor,
                self.setup.restored.as_ref(),
                &mask,
                attempt,
                &mut self.task_attempt,
            )?;
            for t in d.infos() {
                deployed[t.info.index] = Some(t.clone());
            }
            self.deployments[r] = Some(d);
        }
        Ok(())
    }

    /// Every subtask runs again: the coordinator gets them (the first checkpoint of a
    /// deployment comes one interval later).
    fn running(&mut self, now: Instant) {
        self.update_coordinator_tasks(now);
        self.setup.status.set_state(JobState::Running);
    }

    /// Tells the coordinator which subtasks run in which attempt; it aborts the checkpoints in
    /// flight, which wait for subtasks of earlier attempts.
    fn update_coordinator_tasks(&mut self, now: Instant) {
        if let Some(c) = self.setup.coordinator.as_mut() {
            c.set_tasks(
                coordinator_tasks(&self.tasks),
                self.task_attempt.clone(),
                now,
            );
            deliver(c, &self.tasks);
        }
    }

    fn cancel_all(&mut self) {
        for d in self.deployments.iter_mut().filter_map(Option::take) {
            d.cancel();
        }
        for a in &mut self.task_attempt {
            *a = NOT_RUNNING;
        }
    }

    fn finish(mut self) -> Finished {
        for d in self.deployments.iter_mut().filter_map(Option::take) {
            d.join();
        }
        if let Some(c) = &self.setup.coordinator {
            sync_status(&self.setup.status, c);
        }
        self.setup.status.set_state(JobState::Finished);
        let (checkpoints, failed_checkpoints) = self
            .setup
            .coordinator
            .as_ref()
            .map_or((Vec::new(), 0), |c| {
                (c.completed().to_vec(), c.failed_total())
            });
        Finished {
            checkpoints,
            failed_checkpoints,
            restarts: self.restart_count,
        }
    }

    /// Status for observers and the progress callback.
    fn report(&mut self) {
        if let Some(c) = &self.setup.coordinator {
            sync_status(&self.setup.status, c);
        }
        if let Some(cb) = &self.setup.on_progress {
            if self.last_progress.elapsed() >= PROGRESS_INTERVAL {
                self.last_progress = Instant::now();
                cb(&progress(
                    &self.setup.metrics,
                    self.setup.coordinator.as_ref(),
                    self.setup.started,
                    self.restart_count,
                ));
            }
        }
    }
}

/// Runs the once-per-attempt initialization of the sinks `select`ed: commit the restored
/// checkpoint's pre-committed transactions, discard the rest.
fn init_sinks(
    graph: &JobGraph,
    job_id: &str,
    restored: Option<&LoadedCheckpoint>,
    select: impl Fn(usize) -> bool,
) -> Result<(), JobError> {
    for node in graph.nodes() {
        if let Some(init) = &node.sink_init {
            if !select(node.id) {
                continue;
            }
            let pending = restored.map(|c| c.all_list_entries(&node.uid, SINK_PENDING_STATE));
            let owner = SinkOwner {
                job_id: job_id.to_string(),
                uid: node.uid.clone(),
            };
            init(&owner, pending)
                .map_err(|e| JobError::Setup(format!("sink '{}': {e}", node.uid)))?;
        }
    }
    Ok(())
}

/// What the coordinator knows of the deployed subtasks.
fn coordinator_tasks(tasks: &[DeployedTask]) -> Vec<TaskInfo> {
    tasks.iter().map(|t| t.info.clone()).collect()
}

/// Sends the coordinator's queued messages to the subtasks' mailboxes. A closed mailbox means
/// the subtask is gone; its attempt is failing anyway.
fn deliver(c: &mut CheckpointCoordinator, tasks: &[DeployedTask]) {
    for (task, message) in c.drain_messages() {
        let Some(t) = tasks.get(task) else { continue };
        let _ = t.mailbox.send(match message {
            TaskMessage::Trigger(b, kind) => Mail::TriggerCheckpoint(b, kind),
            TaskMessage::Complete(id) => Mail::CheckpointComplete(id),
            TaskMessage::Aborted(id) => Mail::CheckpointAborted(id),
        });
    }
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

/// The most telling cause among what the cancelled `attempts` still reported.
fn drain_cause(events: &Receiver<JobEvent>, attempts: &[u32], cause: String) -> String {
    let mut best = cause;
    while let Ok(e) = events.try_recv() {
        if let JobEvent::Exited {
            attempt,
            result: Err(err),
            ..
        } = e
        {
            if attempts.contains(&attempt)
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
