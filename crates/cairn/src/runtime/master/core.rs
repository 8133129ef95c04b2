//! The job master's decisions, without I/O: which regions to deploy, cancel and restart and
//! when, which messages the subtasks get, when the final checkpoint is taken and when the job
//! ends. Events and the current time go in ([`MasterCore::on_event`], [`MasterCore::poll`]);
//! [`MasterAction`]s come out. The event loop in the parent module performs them on real
//! subtasks; the simulation (`crate::sim`) performs them on simulated ones.
//!
//! A failure restarts its pipelined region (failover strategy `region`) or the whole job. Its
//! subtasks are cancelled at once and marked as not running, so their late events are
//! ignored; in-flight checkpoints are aborted (they wait for subtasks that are gone). One
//! failure event is one failure for the restart strategy, however many regions it takes down
//! (a lost worker hosting several regions is one failure). A restart's backoff is a deadline
//! ([`MasterCore::next_wake`]), never a sleep.

use std::collections::{BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use tracing::{info, warn};

use super::super::restart::RestartTracker;
use super::super::status::{ExceptionView, JobState, EXCEPTIONS_MAX};
use super::super::task::JobEvent;
use crate::checkpoint::coordinator::TaskInfo;
use crate::checkpoint::coordinator::TooManyFailures;
use crate::checkpoint::{
    CheckpointCoordinator, SavepointOutcome, SavepointRequest, StorageTask, TaskMessage,
};
use crate::error::TaskError;

/// What the job master asks its environment to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum MasterAction {
    /// Deploy these regions, each as `(region, attempt)`, restored from checkpoint `from` (None:
    /// from what the run started with, if anything). Answered by [`MasterCore::deployed`] or
    /// [`MasterCore::on_job_failure`].
    Deploy {
        regions: Vec<(usize, u32)>,
        from: Option<u64>,
        /// The sources start stopped: `from` is a completed stop-with-savepoint, after which
        /// nothing may be read (end of input follows at once).
        sources_stopped: bool,
    },
    /// Cancel the running subtasks of these regions.
    Cancel { regions: Vec<usize> },
    /// Deliver a coordinator message to a subtask, on the control path.
    Message { task: usize, message: TaskMessage },
    /// The final checkpoint completed: this source emits end of stream and finishes.
    EndOfInput { task: usize },
}

/// How the job ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Finished,
    Canceled,
    /// The restart strategy gave up (or nothing can be restored).
    Failed {
        restarts: u32,
        cause: String,
        reason: String,
    },
}

/// A failure and what it takes down.
struct Failure {
    cause: String,
    /// What failed, for the restart counts by cause: task, injected, worker-lost, checkpoint
    /// or job.
    kind: &'static str,
    /// The pipelined regions it is confined to (None: the whole job).
    regions: Option<BTreeSet<usize>>,
    /// No restart can fix it ([`TaskError::Unrecoverable`]): the job fails at once.
    unrecoverable: bool,
    /// Not a fault: a worker left on purpose. The restart spends no restart budget.
    planned: bool,
}

impl Failure {
    fn job(cause: String) -> Self {
        Failure {
            cause,
            kind: "job",
            regions: None,
            unrecoverable: false,
            planned: false,
        }
    }

    /// Checkpoints failed beyond what is tolerated.
    fn checkpoint(cause: String) -> Self {
        Failure {
            kind: "checkpoint",
            ..Failure::job(cause)
        }
    }
}

/// Regions waiting for their restart's backoff to pass.
struct ScheduledRestart {
    at: Instant,
    regions: BTreeSet<usize>,
}

/// Planted job master bugs, switched on only by the simulator's tests to show that it finds
/// them.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MasterFlaw {
    /// A restart restores from the state the run started with, not from the newest completed
    /// checkpoint (the sinks already committed what came after it).
    StaleRestore,
    /// An unrecoverable task failure is restarted like any other (into the same failure).
    RestartsUnrecoverable,
    /// A restart whose backoff passed is requested while another deployment is still
    /// outstanding (the shell performs one deployment at a time).
    RestartsDuringDeployment,
    /// A restart picks the newest completed checkpoint while a newer one is being finalized
    /// (its `_metadata` lands, its transactions are committed, after the restart restored an
    /// older one).
    RestartsDuringFinalization,
}

/// A subtask index that runs in no attempt: its events are stale.
const NOT_RUNNING: u32 = u32::MAX;

/// The job master's state machine.
pub(crate) struct MasterCore {
    regions: Vec<Vec<usize>>,
    region_of_task: Vec<usize>,
    region_failover: bool,
    coordinator: Option<CheckpointCoordinator>,
    restarts: RestartTracker,
    restart_count: u32,
    next_attempt: u32,
    /// Per subtask: what the coordinator knows of its latest deployment.
    infos: Vec<Option<TaskInfo>>,
    /// Per subtask: the attempt it runs in, or [`NOT_RUNNING`].
    task_attempt: Vec<u32>,
    exhausted: Vec<bool>,
    exited: Vec<bool>,
    final_checkpoint: Option<u64>,
    end_sent: bool,
    restart: Option<ScheduledRestart>,
    /// The regions of the outstanding [`MasterAction::Deploy`].
    deploying: Option<Vec<(usize, u32)>>,
    /// Whether it starts the sources stopped.
    deploying_stopped: bool,
    /// Attempts cancelled by the last whole-job failure (their reports may tell its cause).
    cancelled: Vec<u32>,
    state: JobState,
    failure_cause: Option<String>,
    /// Restarts by the kind of failure that caused them.
    restart_causes: std::collections::BTreeMap<&'static str, u64>,
    /// The latest failures, oldest first (at most [`EXCEPTIONS_MAX`]).
    exceptions: VecDeque<ExceptionView>,
    outcome: Option<Outcome>,
    actions: VecDeque<MasterAction>,
    /// Savepoint requests refused at once.
    savepoint_refused: Vec<(String, SavepointOutcome)>,
    /// The stop-with-savepoint in flight.
    stopping: Option<u64>,
    /// The completed stop-with-savepoint: the job ends at it, also after a failure.
    stopped_at: Option<u64>,
    #[cfg(test)]
    flaw: Option<MasterFlaw>,
}

impl MasterCore {
    /// A master of `regions` (subtask indices per pipelined region); `coordinator` is None when
    /// checkpointing is disabled.
    pub(crate) fn new(
        regions: Vec<Vec<usize>>,
        region_failover: bool,
        coordinator: Option<CheckpointCoordinator>,
        restarts: RestartTracker,
    ) -> Self {
        let total = regions.iter().map(|r| r.len()).sum::<usize>();
        let mut region_of_task = vec![0usize; total];
        for (r, tasks) in regions.iter().enumerate() {
            for &t in tasks {
                if let Some(slot) = region_of_task.get_mut(t) {
                    *slot = r;
                }
            }
        }
        MasterCore {
            regions,
            region_of_task,
            region_failover,
            coordinator,
            restarts,
            restart_count: 0,
            next_attempt: 0,
            infos: vec![None; total],
            task_attempt: vec![NOT_RUNNING; total],
            exhausted: vec![false; total],
            exited: vec![false; total],
            final_checkpoint: None,
            end_sent: false,
            restart: None,
            deploying: None,
            deploying_stopped: false,
            cancelled: Vec::new(),
            state: JobState::Created,
            failure_cause: None,
            restart_causes: Default::default(),
            exceptions: VecDeque::new(),
            outcome: None,
            actions: VecDeque::new(),
            savepoint_refused: Vec::new(),
            stopping: None,
            stopped_at: None,
            #[cfg(test)]
            flaw: None,
        }
    }

    /// Plants a bug (simulator tests only).
    #[cfg(test)]
    pub(crate) fn plant(&mut self, flaw: MasterFlaw) {
        self.flaw = Some(flaw);
    }

    /// The coordinator, to plant a bug in it (simulator tests only).
    #[cfg(test)]
    pub(crate) fn coordinator_mut(&mut self) -> Option<&mut CheckpointCoordinator> {
        self.coordinator.as_mut()
    }

    /// Asks for the first deployment of every region.
    pub(crate) fn start(&mut self) {
        let all: BTreeSet<usize> = (0..self.regions.len()).collect();
        self.request_deploy(&all, None, false);
    }

    /// The next action to perform.
    pub(crate) fn next_action(&mut self) -> Option<MasterAction> {
        self.actions.pop_front()
    }

    /// How the job ended, once it did.
    pub(crate) fn outcome(&self) -> Option<&Outcome> {
        self.outcome.as_ref()
    }

    pub(crate) fn state(&self) -> JobState {
        self.state
    }

    pub(crate) fn restart_count(&self) -> u32 {
        self.restart_count
    }

    pub(crate) fn failure_cause(&self) -> Option<&str> {
        self.failure_cause.as_deref()
    }

    /// Restarts by cause, in name order.
    pub(crate) fn restart_causes(&self) -> Vec<(String, u64)> {
        self.restart_causes
            .iter()
            .map(|(k, v)| (k.to_string(), *v))
            .collect()
    }

    /// The latest failures, oldest first.
    pub(crate) fn exceptions(&self) -> Vec<ExceptionView> {
        self.exceptions.iter().cloned().collect()
    }

    pub(crate) fn coordinator(&self) -> Option<&CheckpointCoordinator> {
        self.coordinator.as_ref()
    }

    /// The final checkpoint in flight, if one was triggered.
    #[cfg(test)]
    pub(crate) fn final_checkpoint(&self) -> Option<u64> {
        self.final_checkpoint
    }

    /// Whether events of `attempt` from `task` are current.
    pub(crate) fn is_current(&self, task: usize, attempt: u32) -> bool {
        attempt != NOT_RUNNING && self.task_attempt.get(task) == Some(&attempt)
    }

    /// The earliest deadline: the scheduled restart, the next checkpoint trigger, the next
    /// checkpoint timeout.
    pub(crate) fn next_wake(&self, now: Instant) -> Option<Instant> {
        // While a checkpoint is finalized, its result (an event) wakes the loop, not the
        // restart's deadline.
        let mut wake: Option<Instant> = self
            .restart
            .as_ref()
            .filter(|_| !self.finalizing())
            .map(|r| r.at);
        let mut earliest = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
        if let Some(c) = &self.coordinator {
            // With max-concurrent checkpoints in flight, the next ack wakes the loop.
            if self.restart.is_none() && self.final_checkpoint.is_none() && c.has_room() {
                earliest(c.next_trigger_at(now));
            }
            if let Some(t) = c.next_timeout_at() {
                earliest(t);
            }
        }
        wake
    }

    /// The regions of the outstanding deployment run: `tasks` are their subtasks.
    pub(crate) fn deployed(&mut self, tasks: Vec<TaskInfo>, now: Instant) {
        let Some(regions) = self.deploying.take() else {
            return;
        };
        for (r, attempt) in regions {
            for &t in &self.regions[r] {
                self.task_attempt[t] = attempt;
            }
        }
        for info in tasks {
            let index = info.index;
            if let Some(slot) = self.infos.get_mut(index) {
                *slot = Some(info);
            }
        }
        self.update_coordinator_tasks(now);
        self.state = JobState::Running;
        if std::mem::take(&mut self.deploying_stopped) {
            self.end_of_input();
        }
    }

    /// A failure of the whole job (the outstanding deployment failed, the event queue closed);
    /// an `unrecoverable` one (a worker refused the job) fails it at once.
    pub(crate) fn on_job_failure(&mut self, cause: String, unrecoverable: bool, now: Instant) {
        self.deploying = None;
        let failure = Failure {
            unrecoverable,
            ..Failure::job(cause)
        };
        self.on_failure(failure, now);
    }

    /// A savepoint was requested (a stop-with-savepoint when `request.stop`): it is taken as
    /// soon as the coordinator has room; its outcome comes out of
    /// [`MasterCore::drain_savepoint_outcomes`].
    pub(crate) fn request_savepoint(&mut self, request: SavepointRequest) {
        let refuse = if self.outcome.is_some() {
            Some("the job has ended")
        } else if self.end_sent || self.final_checkpoint.is_some() {
            Some("the job is finishing")
        } else {
            None
        };
        match (&mut self.coordinator, refuse) {
            (Some(c), None) => c.request_savepoint(request),
            (_, reason) => self.savepoint_refused.push((
                request.request_id,
                SavepointOutcome::Failed(
                    reason
                        .unwrap_or("checkpointing is disabled: no savepoint can be taken")
                        .into(),
                ),
            )),
        }
    }

    /// Savepoint requests that ended since the last call.
    pub(crate) fn drain_savepoint_outcomes(&mut self) -> Vec<(String, SavepointOutcome)> {
        let mut out = std::mem::take(&mut self.savepoint_refused);
        if let Some(c) = &mut self.coordinator {
            if self.outcome.is_some() || self.final_checkpoint.is_some() {
                c.fail_queued_savepoints("the job is finishing");
            }
            out.extend(c.drain_savepoint_outcomes());
        }
        out
    }

    /// A cancellation was requested: everything is cancelled and the job ends CANCELED; its
    /// checkpoints are deleted unless `retain_checkpoints`.
    pub(crate) fn cancel(&mut self, retain_checkpoints: bool) {
        if self.outcome.is_some() {
            return;
        }
        self.deploying = None;
        self.cancel_all();
        if !retain_checkpoints {
            if let Some(c) = &mut self.coordinator {
                c.delete_checkpoints();
            }
        }
        self.state = JobState::Canceled;
        self.outcome = Some(Outcome::Canceled);
    }

    /// Time passed: a restart whose backoff passed is requested, the end of the job is
    /// detected, checkpoints are triggered and timed out.
    pub(crate) fn poll(&mut self, now: Instant) {
        #[cfg(test)]
        let deploying =
            self.deploying.is_some() && self.flaw != Some(MasterFlaw::RestartsDuringDeployment);
        #[cfg(not(test))]
        let deploying = self.deploying.is_some();
        if self.outcome.is_some() || deploying {
            return;
        }
        if self.restart.as_ref().is_some_and(|r| now >= r.at) {
            // A checkpoint being finalized may be the newest completed one: the restart
            // waits for its `_metadata` (written, or not).
            #[cfg(test)]
            let finalizing =
                self.finalizing() && self.flaw != Some(MasterFlaw::RestartsDuringFinalization);
            #[cfg(not(test))]
            let finalizing = self.finalizing();
            if !finalizing {
                self.restart_due();
            }
            return;
        }
        if self.restart.is_some() {
            // Not every subtask runs: a checkpoint could not complete.
            return;
        }
        if self.exited.iter().all(|&e| e) {
            self.finish();
            return;
        }
        if let Err(failure) = self.checkpoint_tick(now) {
            self.on_failure(failure, now);
        }
    }

    /// Handles one event.
    pub(crate) fn on_event(&mut self, event: JobEvent, now: Instant) {
        if self.outcome.is_some() {
            if let JobEvent::Exited {
                attempt,
                result: Err(e),
                ..
            } = event
            {
                self.refine_cause(attempt, &e);
            }
            return;
        }
        if let Some(failure) = self.failure_of(event, now) {
            self.on_failure(failure, now);
        }
    }

    /// Handles one event; returns the failure it reports, if any.
    fn failure_of(&mut self, event: JobEvent, now: Instant) -> Option<Failure> {
        match event {
            JobEvent::Ack(ack) => {
                let c = self.coordinator.as_mut()?;
                let result = c.on_ack(ack, now);
                self.completions(result)
            }
            JobEvent::Finalized(finalized) => {
                let c = self.coordinator.as_mut()?;
                let result = c.on_finalized(finalized, now);
                self.completions(result)
            }
            JobEvent::Decline {
                checkpoint_id,
                attempt,
                cause,
            } => {
                let c = self.coordinator.as_mut()?;
                let result = c.on_decline(checkpoint_id, attempt, &cause, now);
                self.deliver();
                result.err().map(|e| Failure::checkpoint(e.to_string()))
            }
            JobEvent::SourceExhausted { attempt, task } => {
                if self.is_current(task, attempt) {
                    self.exhausted[task] = true;
                }
                None
            }
            JobEvent::Lost {
                attempts,
                reason,
                planned,
            } => {
                let regions: BTreeSet<usize> = (0..self.task_attempt.len())
                    .filter(|&t| self.task_attempt[t] != NOT_RUNNING)
                    .filter(|&t| attempts.contains(&self.task_attempt[t]))
                    .map(|t| self.region_of_task[t])
                    .collect();
                (!regions.is_empty()).then_some(Failure {
                    cause: reason,
                    kind: if planned {
                        "worker-left"
                    } else {
                        "worker-lost"
                    },
                    regions: Some(regions),
                    unrecoverable: false,
                    planned,
                })
            }
            JobEvent::Exited {
                attempt,
                task,
                result,
            } => {
                if !self.is_current(task, attempt) {
                    if let Err(e) = result {
                        self.refine_cause(attempt, &e);
                    }
                    return None;
                }
                match result {
                    Ok(()) => {
                        self.exited[task] = true;
                        None
                    }
                    Err(e) => Some(Failure {
                        cause: e.to_string(),
                        kind: if matches!(e, TaskError::Injected { .. }) {
                            "injected"
                        } else {
                            "task"
                        },
                        regions: Some(BTreeSet::from([self.region_of_task[task]])),
                        planned: false,
                        unrecoverable: matches!(e, TaskError::Unrecoverable(_)),
                    }),
                }
            }
        }
    }

    /// Checkpoints completed (`done`): a completed stop-with-savepoint is where the job
    /// ends, a completed final checkpoint ends the input; or checkpoints failed beyond what
    /// is tolerated.
    fn completions(&mut self, result: Result<Vec<u64>, TooManyFailures>) -> Option<Failure> {
        self.deliver();
        match result {
            Ok(done) => {
                if self.stopping.is_some_and(|s| done.contains(&s)) {
                    // The completed stop is the job's last checkpoint, also when a failure
                    // came between its acknowledgements and its `_metadata`.
                    self.stopped_at = self.stopping;
                    self.final_checkpoint = self.stopped_at;
                }
                let final_done = self
                    .final_checkpoint
                    .is_some_and(|f| done.iter().any(|&d| d >= f));
                // With regions down, their redeployment at the stop ends the input.
                let all_running = self.restart.is_none() && self.deploying.is_none();
                if final_done && !self.end_sent && all_running {
                    self.end_of_input();
                }
                None
            }
            Err(e) => Some(Failure::checkpoint(e.to_string())),
        }
    }

    /// Storage work of the coordinator, to run off the master's thread in this order.
    pub(crate) fn drain_storage(&mut self) -> Vec<StorageTask> {
        self.coordinator
            .as_mut()
            .map(CheckpointCoordinator::drain_storage)
            .unwrap_or_default()
    }

    /// A subtask cancelled by a whole-job failure reported its error: a more telling cause
    /// than "task cancelled" (a channel closed under it) may be among them.
    fn refine_cause(&mut self, attempt: u32, err: &TaskError) {
        if !self.cancelled.contains(&attempt) || matches!(err, TaskError::Cancelled) {
            return;
        }
        let cancelled = TaskError::Cancelled.to_string();
        let Some(cause) = &mut self.failure_cause else {
            return;
        };
        if !cause.contains(&cancelled) {
            return;
        }
        *cause = err.to_string();
        warn!("the job's failure was caused by: {cause}");
        if let Some(Outcome::Failed { cause: c, .. }) = &mut self.outcome {
            *c = cause.clone();
        }
    }

    /// The final checkpoint completed: sources emit end of stream and finish.
    fn end_of_input(&mut self) {
        self.end_sent = true;
        for info in self.infos.iter().flatten().filter(|i| i.is_source) {
            self.actions
                .push_back(MasterAction::EndOfInput { task: info.index });
        }
    }

    /// Triggers periodic checkpoints and the final one, and aborts timed-out ones.
    fn checkpoint_tick(&mut self, now: Instant) -> Result<(), Failure> {
        let all_exhausted = self
            .infos
            .iter()
            .flatten()
            .filter(|i| i.is_source)
            .all(|i| self.exhausted[i.index]);
        let end_sent = self.end_sent;
        let Some(c) = self.coordinator.as_mut() else {
            return Ok(());
        };
        let timeouts = c.check_timeouts(now);
        if end_sent {
            // The last checkpoint completed and the sources are ending: no more checkpoints.
            self.deliver();
            return timeouts.map_err(|e| Failure::checkpoint(e.to_string()));
        }
        if let Some(f) = self.final_checkpoint {
            // The final checkpoint was aborted: take another one.
            let completed = c.completed().last().is_some_and(|x| x.id >= f);
            if !completed && c.pending_count() == 0 {
                self.final_checkpoint = None;
            }
        }
        if timeouts.is_ok() && self.final_checkpoint.is_none() {
            if all_exhausted {
                self.final_checkpoint = c.maybe_trigger(now, true);
            } else {
                c.maybe_trigger(now, false);
                // A stop-with-savepoint is the job's last checkpoint: its completion ends
                // the input.
                self.final_checkpoint = c.stop_in_flight();
                if self.final_checkpoint.is_some() {
                    self.stopping = self.final_checkpoint;
                }
            }
        }
        self.deliver();
        timeouts.map_err(|e| Failure::checkpoint(e.to_string()))
    }

    /// Cancels what a failure takes down and schedules its restart after the strategy's
    /// backoff; the job's end if the strategy gives up.
    fn on_failure(&mut self, failure: Failure, now: Instant) {
        let checkpointing = self.coordinator.is_some();
        let unrecoverable = failure.unrecoverable;
        #[cfg(test)]
        let unrecoverable = unrecoverable && self.flaw != Some(MasterFlaw::RestartsUnrecoverable);
        let all: BTreeSet<usize> = (0..self.regions.len()).collect();
        let mut scope = match failure.regions {
            Some(r) if self.region_failover && !self.end_sent && checkpointing => r,
            _ => all.clone(),
        };
        self.abandon_deployment(&mut scope);
        let cause = failure.cause;
        let kind = failure.kind;
        if self.exceptions.len() == EXCEPTIONS_MAX {
            self.exceptions.pop_front();
        }
        self.exceptions.push_back(ExceptionView {
            timestamp: crate::checkpoint::now_ms(),
            cause: cause.clone(),
            kind: kind.to_string(),
            restarted: false,
        });
        if scope == all {
            self.cancelled = self.running_attempts();
            self.cancel_all();
            warn!("job failed: {cause}");
        } else {
            self.actions.push_back(MasterAction::Cancel {
                regions: scope.iter().copied().collect(),
            });
            match scope.iter().collect::<Vec<_>>()[..] {
                [r] => warn!("region {r} of the job failed: {cause}; restarting that region only"),
                _ => warn!(
                    "regions {scope:?} of the job failed: {cause}; restarting those regions only"
                ),
            }
        }
        for &r in &scope {
            for &t in &self.regions[r] {
                self.task_attempt[t] = NOT_RUNNING;
                self.exhausted[t] = false;
                self.exited[t] = false;
            }
        }
        self.final_checkpoint = None;
        self.end_sent = false;
        self.failure_cause = Some(cause.clone());
        if !checkpointing {
            self.fail(
                cause,
                "checkpointing is disabled, so nothing can be restored (at-most-once)".into(),
            );
            return;
        }
        if unrecoverable {
            if scope != all {
                self.cancel_all();
            }
            self.fail(cause, "no restart can fix this failure".into());
            return;
        }
        let delay = if failure.planned {
            Some(self.planned_restart())
        } else {
            self.decide_restart(cause, now)
        };
        let Some(delay) = delay else {
            return;
        };
        *self.restart_causes.entry(kind).or_default() += 1;
        if let Some(e) = self.exceptions.back_mut() {
            e.restarted = true;
        }
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
    }

    /// A restart after a planned departure (a drained worker): the strategy's delay, with
    /// nothing counted against its budget.
    fn planned_restart(&mut self) -> Duration {
        self.restart_count += 1;
        self.state = JobState::Restarting;
        self.restarts.delay_without_counting()
    }

    /// Asks the restart strategy about a failure: the delay before restarting, or None when
    /// the job ends.
    fn decide_restart(&mut self, cause: String, now: Instant) -> Option<Duration> {
        match self.restarts.on_failure(now) {
            Ok(delay) => {
                self.restart_count += 1;
                self.state = JobState::Restarting;
                Some(delay)
            }
            Err(reason) => {
                self.cancel_all();
                self.fail(cause, reason);
                None
            }
        }
    }

    fn fail(&mut self, cause: String, reason: String) {
        self.state = JobState::Failed;
        self.outcome = Some(Outcome::Failed {
            restarts: self.restart_count,
            cause,
            reason,
        });
    }

    /// The backoff of a scheduled restart passed: redeploy its regions from the newest
    /// completed checkpoint.
    fn restart_due(&mut self) {
        let Some(restart) = self.restart.take() else {
            return;
        };
        let from = self
            .coordinator
            .as_ref()
            .and_then(|c| c.completed().last())
            .map(|c| c.id);
        #[cfg(test)]
        let from = from.filter(|_| self.flaw != Some(MasterFlaw::StaleRestore));
        match from {
            Some(id) => info!(
                "restoring regions {:?} from checkpoint {id}",
                restart.regions
            ),
            None => info!(
                "restarting regions {:?} from the state the run started with (no checkpoint completed in it)",
                restart.regions
            ),
        }
        // Restored at a completed stop-with-savepoint: the job ends there, reading nothing.
        let stopped = from.is_some() && from == self.stopped_at;
        self.request_deploy(&restart.regions, from, stopped);
    }

    fn request_deploy(
        &mut self,
        regions: &BTreeSet<usize>,
        from: Option<u64>,
        sources_stopped: bool,
    ) {
        let regions: Vec<(usize, u32)> = regions
            .iter()
            .map(|&r| {
                let attempt = self.next_attempt;
                self.next_attempt += 1;
                (r, attempt)
            })
            .collect();
        self.deploying = Some(regions.clone());
        self.deploying_stopped = sources_stopped;
        self.actions.push_back(MasterAction::Deploy {
            regions,
            from,
            sources_stopped,
        });
    }

    /// A failure whose `scope` touches the regions of the outstanding deployment abandons
    /// it: they join the scope (cancelled, restarted with the others) and a later
    /// [`MasterCore::deployed`] is ignored. The shell drops a deployment it has not performed
    /// yet when it is told to cancel its regions, and cancels one it performed.
    fn abandon_deployment(&mut self, scope: &mut BTreeSet<usize>) {
        let Some(deploying) = &self.deploying else {
            return;
        };
        if deploying.iter().any(|(r, _)| scope.contains(r)) {
            scope.extend(deploying.iter().map(|&(r, _)| r));
            self.deploying = None;
            self.deploying_stopped = false;
        }
    }

    /// Whether a checkpoint's `_metadata` is being written.
    fn finalizing(&self) -> bool {
        self.coordinator
            .as_ref()
            .is_some_and(|c| c.finalizing_count() > 0)
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

    /// Tells the coordinator which subtasks run in which attempt; it aborts the checkpoints in
    /// flight, which wait for subtasks of earlier attempts.
    fn update_coordinator_tasks(&mut self, now: Instant) {
        let Some(infos) = self.infos.iter().cloned().collect::<Option<Vec<_>>>() else {
            return;
        };
        if let Some(c) = self.coordinator.as_mut() {
            c.set_tasks(infos, self.task_attempt.clone(), now);
        }
        self.deliver();
    }

    /// Queues the coordinator's messages for delivery.
    fn deliver(&mut self) {
        let Some(c) = self.coordinator.as_mut() else {
            return;
        };
        for (task, message) in c.drain_messages() {
            self.actions
                .push_back(MasterAction::Message { task, message });
        }
    }

    fn cancel_all(&mut self) {
        self.actions.push_back(MasterAction::Cancel {
            regions: (0..self.regions.len()).collect(),
        });
        for a in &mut self.task_attempt {
            *a = NOT_RUNNING;
        }
    }

    fn finish(&mut self) {
        self.state = JobState::Finished;
        self.outcome = Some(Outcome::Finished);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::checkpoint::coordinator::CheckpointSettings;
    use crate::checkpoint::BarrierKind;
    use crate::config::RestartStrategyConfig;
    use crate::storage::MemoryStorage;

    const DELAY: Duration = Duration::from_millis(50);

    /// Two regions of a source and a sink each; fixed-delay restarts.
    fn master(attempts: u32) -> (MasterCore, Instant) {
        let settings = CheckpointSettings {
            interval: Duration::from_secs(3600),
            timeout: Duration::from_secs(3600),
            min_pause: Duration::ZERO,
            max_concurrent: 1,
            tolerable_failed: 0,
            num_retained: 1,
            barrier_kind: BarrierKind::Aligned,
        };
        let t0 = Instant::now();
        let coordinator = CheckpointCoordinator::new(
            settings,
            Arc::new(MemoryStorage::new()),
            "job".into(),
            "test".into(),
            128,
            1,
            (t0, 1_000_000),
        );
        let restarts = RestartTracker::new(RestartStrategyConfig::FixedDelay {
            attempts,
            delay: DELAY,
        });
        let mut m = MasterCore::new(
            vec![vec![0, 2], vec![1, 3]],
            true,
            Some(coordinator),
            restarts,
        );
        m.start();
        let Some(MasterAction::Deploy { regions, from, .. }) = m.next_action() else {
            panic!("the master deploys first");
        };
        assert_eq!((regions, from), (vec![(0, 0), (1, 1)], None));
        let infos = (0..4)
            .map(|t| TaskInfo {
                index: t,
                name: format!("t{t}"),
                subtask: 0,
                is_source: t < 2,
                operators: vec![(format!("op{t}"), 1)],
            })
            .collect();
        m.deployed(infos, t0);
        while m.next_action().is_some() {}
        assert_eq!(m.state(), JobState::Running);
        (m, t0)
    }

    fn actions(m: &mut MasterCore) -> Vec<MasterAction> {
        std::iter::from_fn(|| m.next_action()).collect()
    }

    fn failed(task: usize, attempt: u32) -> JobEvent {
        JobEvent::Exited {
            attempt,
            task,
            result: Err(TaskError::msg("boom")),
        }
    }

    #[test]
    fn a_failed_region_is_cancelled_at_once_and_redeployed_when_its_backoff_passes() {
        let (mut m, t0) = master(3);
        m.on_event(failed(3, 1), t0);
        assert_eq!(
            actions(&mut m),
            vec![MasterAction::Cancel { regions: vec![1] }]
        );
        assert_eq!(m.state(), JobState::Restarting);
        assert_eq!(m.next_wake(t0), Some(t0 + DELAY));
        // Before the deadline nothing is redeployed; the other region's events still count.
        m.poll(t0 + DELAY / 2);
        assert!(actions(&mut m).is_empty());
        assert!(m.is_current(0, 0));
        assert!(!m.is_current(3, 1), "the failed attempt's events are stale");
        m.poll(t0 + DELAY);
        assert_eq!(
            actions(&mut m),
            vec![MasterAction::Deploy {
                regions: vec![(1, 2)],
                from: None,
                sources_stopped: false,
            }]
        );
        assert_eq!(m.restart_count(), 1);
    }

    /// Defect 3.5: a worker hosting subtasks of both regions is one failure.
    #[test]
    fn a_lost_worker_hosting_two_regions_is_one_failure_and_one_restart() {
        let (mut m, t0) = master(1);
        m.on_event(
            JobEvent::Lost {
                attempts: vec![0, 1],
                reason: "worker lost".into(),
                planned: false,
            },
            t0,
        );
        assert_eq!(m.restart_count(), 1);
        assert!(m.outcome().is_none(), "one restart is allowed");
        m.poll(t0 + DELAY);
        let deployed = actions(&mut m);
        assert!(
            deployed.contains(&MasterAction::Deploy {
                regions: vec![(0, 2), (1, 3)],
                from: None,
                sources_stopped: false,
            }),
            "{deployed:?}"
        );
    }

    #[test]
    fn a_refused_deployment_fails_the_job_at_once_and_another_deployment_failure_restarts() {
        let (mut m, t0) = master(3);
        m.on_job_failure("the job could not be redeployed: slots".into(), false, t0);
        assert!(m.outcome().is_none(), "a deployment failure is restarted");
        assert_eq!(m.restart_count(), 1);
        let (mut m, t0) = master(3);
        m.on_job_failure("worker 2 has no job 'x'".into(), true, t0);
        match m.outcome() {
            Some(Outcome::Failed {
                cause, restarts, ..
            }) => {
                assert!(cause.contains("has no job 'x'"), "{cause}");
                assert_eq!(*restarts, 0, "a refusal is not restarted");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(m.state(), JobState::Failed);
    }

    #[test]
    fn the_restart_strategy_giving_up_ends_the_job_with_the_cause() {
        let (mut m, t0) = master(0);
        m.on_event(failed(0, 0), t0);
        match m.outcome() {
            Some(Outcome::Failed {
                cause, restarts, ..
            }) => {
                assert!(cause.contains("boom"), "{cause}");
                assert_eq!(*restarts, 0);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(m.state(), JobState::Failed);
        assert!(actions(&mut m).contains(&MasterAction::Cancel {
            regions: vec![0, 1]
        }));
    }

    #[test]
    fn the_job_finishes_when_every_subtask_exited() {
        let (mut m, t0) = master(1);
        for (task, attempt) in [(0, 0), (1, 1), (2, 0), (3, 1)] {
            m.on_event(
                JobEvent::Exited {
                    attempt,
                    task,
                    result: Ok(()),
                },
                t0,
            );
        }
        m.poll(t0);
        assert_eq!(m.outcome(), Some(&Outcome::Finished));
    }
}
