//! The job lifecycle: Flink's job states and the transitions between them, as one state
//! machine. Every change of a job's state — by the job master, by a user's cancel, by the
//! coordinator before a job master runs or when it stops — goes through [`Lifecycle::apply`],
//! which refuses a transition the table does not allow and records every other one with its
//! time and cause. Pure: no clock (time is an argument), no I/O.
//!
//! ```text
//!              ┌──────────────── Cancelling ◄──────────── (user, any non-terminal but Suspended)
//!              │                     │
//!              ▼                     ▼
//! Created ──► Running ──► Failing ──► Restarting ──► Running …
//!    │           │           │
//!    │           ▼           ▼
//!    │       Finished      Failed ◄── Created (failure before deployment)
//!    └─► Suspended ◄── (coordinator stops; the job is resumed by the next one)
//! ```

use serde::{Deserialize, Serialize};

/// Flink's job states.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum JobState {
    /// Accepted, not yet deployed (waiting for slots, being deployed).
    Created,
    /// Every task is deployed.
    Running,
    /// A failure happened; the failed tasks are being cancelled.
    Failing,
    /// The failed tasks are cancelled; they are redeployed once the restart's backoff passed.
    Restarting,
    /// A user asked to cancel; the tasks are being cancelled.
    Cancelling,
    /// Cancelled by a user.
    Canceled,
    /// Failed for good.
    Failed,
    /// Every task finished.
    Finished,
    /// The coordinator stopped; a restarted coordinator resumes the job.
    Suspended,
}

impl JobState {
    /// Whether the job will not change state again (Flink's globally terminal states).
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Canceled
        )
    }

    /// Whether the job ended in this process (terminal, or suspended).
    pub fn is_ended(self) -> bool {
        self.is_terminal() || self == JobState::Suspended
    }

    /// Flink's name of the state (`RUNNING`, …).
    pub fn name(self) -> &'static str {
        match self {
            JobState::Created => "CREATED",
            JobState::Running => "RUNNING",
            JobState::Failing => "FAILING",
            JobState::Restarting => "RESTARTING",
            JobState::Cancelling => "CANCELLING",
            JobState::Canceled => "CANCELED",
            JobState::Failed => "FAILED",
            JobState::Finished => "FINISHED",
            JobState::Suspended => "SUSPENDED",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Who causes a transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Actor {
    /// The job master (deployments, task failures, the restart strategy, the job's end).
    JobMaster,
    /// A user (cancel, through the REST API, the command line or a signal).
    User,
    /// The coordinator around the job master (a failure before the job master runs, its
    /// own shutdown).
    Coordinator,
}

/// Whether `actor` may move a job from `from` to `to`: the lifecycle's transition table.
pub fn allowed(from: JobState, to: JobState, actor: Actor) -> bool {
    use Actor::*;
    use JobState::*;
    match (from, to) {
        // Every task deployed (first time, or after a restart).
        (Created | Restarting, Running) => actor == JobMaster,
        // A task failed, a worker was lost, checkpoints failed past the tolerable number, a
        // redeployment failed.
        (Running | Restarting, Failing) => actor == JobMaster,
        // The failed tasks are cancelled and the restart strategy allows a restart.
        (Failing, Restarting) => actor == JobMaster,
        // The restart strategy gave up, or the failure cannot be fixed by a restart; before
        // deployment, any failure (a bad checkpoint, no slots, a refused job check).
        (Failing | Created, Failed) => matches!(actor, JobMaster | Coordinator),
        (Running, Finished) => actor == JobMaster,
        // A user's cancel, in any state that is not an end.
        (Created | Running | Failing | Restarting, Cancelling) => actor == User,
        // What a cancel ends in: cancelled, or what the job reached before the cancel took
        // effect (its tasks had all finished, or it had failed for good).
        (Cancelling, Canceled | Finished | Failed) => matches!(actor, JobMaster | Coordinator),
        // The coordinator stops under a job that has not ended.
        (Created | Running | Failing | Restarting | Cancelling, Suspended) => actor == Coordinator,
        _ => false,
    }
}

/// The transitions by which a job follows its job master's state from `reported` to `now`:
/// a master that restarts or fails for good went through FAILING (with the failure's
/// `cause`), one that was cancelled through CANCELLING (a user's). The job master's shell
/// applies them to the job's status, and the simulation to a lifecycle of its own, so the
/// simulation checks what the shell reports against the transition table.
pub fn master_steps(
    reported: JobState,
    now: JobState,
    cause: Option<&str>,
) -> Vec<(JobState, Actor, Option<String>)> {
    use JobState::*;
    let cause = cause.map(str::to_string);
    match now {
        _ if now == reported => Vec::new(),
        Restarting if reported != Failing => vec![
            (Failing, Actor::JobMaster, cause),
            (Restarting, Actor::JobMaster, None),
        ],
        Failed if reported != Failing => vec![
            (Failing, Actor::JobMaster, cause.clone()),
            (Failed, Actor::JobMaster, cause),
        ],
        Failed => vec![(Failed, Actor::JobMaster, cause)],
        Canceled if reported != Cancelling => vec![
            (Cancelling, Actor::User, None),
            (Canceled, Actor::JobMaster, None),
        ],
        _ => vec![(now, Actor::JobMaster, None)],
    }
}

/// One recorded transition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    /// The state left.
    pub from: JobState,
    /// The state entered.
    pub to: JobState,
    /// When (ms since the Unix epoch).
    pub at_ms: u64,
    /// Why, when there is more to say than the state (a failure's cause, who cancelled).
    #[serde(default)]
    pub cause: Option<String>,
}

/// Transitions kept: the first ones (how the job started) and the newest ones.
pub const TRANSITIONS_MAX: usize = 64;

/// A job's state and the transitions that led to it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lifecycle {
    state: JobState,
    /// When the job was created (ms since the Unix epoch).
    created_ms: u64,
    transitions: Vec<Transition>,
    /// Transitions dropped from the middle of the record (at most [`TRANSITIONS_MAX`] kept).
    dropped: u64,
}

impl Lifecycle {
    /// A job created at `now_ms`.
    pub fn new(now_ms: u64) -> Self {
        Lifecycle {
            state: JobState::Created,
            created_ms: now_ms,
            transitions: Vec::new(),
            dropped: 0,
        }
    }

    /// A job that ended before this process knew it (read back from a record): created at
    /// `created_ms`, ended in `state` at `ended_ms` for `cause`.
    pub fn recorded(
        created_ms: u64,
        state: JobState,
        ended_ms: u64,
        cause: Option<String>,
    ) -> Self {
        Lifecycle {
            state,
            created_ms,
            transitions: vec![Transition {
                from: JobState::Created,
                to: state,
                at_ms: ended_ms,
                cause,
            }],
            dropped: 0,
        }
    }

    /// The current state.
    pub fn state(&self) -> JobState {
        self.state
    }

    /// When the job was created.
    pub fn created_ms(&self) -> u64 {
        self.created_ms
    }

    /// The recorded transitions, oldest first.
    pub fn transitions(&self) -> &[Transition] {
        &self.transitions
    }

    /// How many transitions were dropped from the record to bound it.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// When the job last entered `state`, if it did.
    pub fn entered(&self, state: JobState) -> Option<u64> {
        if state == JobState::Created {
            return Some(self.created_ms);
        }
        self.transitions
            .iter()
            .rev()
            .find(|t| t.to == state)
            .map(|t| t.at_ms)
    }

    /// Moves to `to` if the table allows `actor` to; records the transition. Staying in the
    /// current state is no transition (Ok, nothing recorded). A refused transition leaves
    /// everything as it was and says why.
    pub fn apply(
        &mut self,
        to: JobState,
        actor: Actor,
        cause: Option<String>,
        now_ms: u64,
    ) -> Result<(), String> {
        if to == self.state {
            return Ok(());
        }
        if !allowed(self.state, to, actor) {
            return Err(format!(
                "the job cannot go from {} to {} ({actor:?})",
                self.state, to
            ));
        }
        if self.transitions.len() >= TRANSITIONS_MAX {
            // Keep how the job started (the first half) and its recent history.
            self.transitions.remove(TRANSITIONS_MAX / 2);
            self.dropped += 1;
        }
        self.transitions.push(Transition {
            from: self.state,
            to,
            at_ms: now_ms,
            cause,
        });
        self.state = to;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Actor::*;
    use super::JobState::*;
    use super::*;

    const ALL: [JobState; 9] = [
        Created, Running, Failing, Restarting, Cancelling, Canceled, Failed, Finished, Suspended,
    ];

    #[test]
    fn a_job_that_fails_and_restarts_records_each_step_with_its_cause() {
        let mut l = Lifecycle::new(10);
        l.apply(Running, JobMaster, None, 20).unwrap();
        l.apply(Failing, JobMaster, Some("task 3 failed".into()), 30)
            .unwrap();
        l.apply(Restarting, JobMaster, None, 31).unwrap();
        l.apply(Running, JobMaster, None, 40).unwrap();
        l.apply(Finished, JobMaster, None, 50).unwrap();
        let path: Vec<JobState> = l.transitions().iter().map(|t| t.to).collect();
        assert_eq!(path, [Running, Failing, Restarting, Running, Finished]);
        assert_eq!(l.transitions()[1].cause.as_deref(), Some("task 3 failed"));
        assert_eq!(l.entered(Running), Some(40));
        assert_eq!(l.entered(Created), Some(10));
        assert_eq!(l.entered(Failed), None);
    }

    #[test]
    fn a_failure_before_deployment_fails_a_created_job() {
        let mut l = Lifecycle::new(0);
        l.apply(Failed, Coordinator, Some("no such checkpoint".into()), 5)
            .unwrap();
        assert_eq!(l.state(), Failed);
        assert!(l.state().is_terminal());
    }

    #[test]
    fn cancel_is_allowed_in_every_state_that_is_not_an_end() {
        for from in ALL {
            let can = allowed(from, Cancelling, User);
            assert_eq!(can, !from.is_ended() && from != Cancelling, "{from}");
            // Nobody but a user cancels.
            assert!(!allowed(from, Cancelling, JobMaster), "{from}");
        }
    }

    #[test]
    fn nothing_leaves_a_terminal_state() {
        for from in ALL.into_iter().filter(|s| s.is_ended()) {
            for to in ALL {
                for actor in [JobMaster, User, Coordinator] {
                    assert!(!allowed(from, to, actor), "{from} -> {to} by {actor:?}");
                }
            }
            let mut l = Lifecycle {
                state: from,
                created_ms: 0,
                transitions: Vec::new(),
                dropped: 0,
            };
            assert!(l.apply(Running, JobMaster, None, 1).is_err());
            assert_eq!(l.state(), from);
            assert!(l.transitions().is_empty());
        }
    }

    #[test]
    fn a_cancelling_job_ends_as_what_it_reached() {
        for end in [Canceled, Finished, Failed] {
            let mut l = Lifecycle::new(0);
            l.apply(Running, JobMaster, None, 1).unwrap();
            l.apply(Cancelling, User, None, 2).unwrap();
            // A restart that was under way does not bring it back to running.
            assert!(l.apply(Running, JobMaster, None, 3).is_err());
            l.apply(end, JobMaster, None, 4).unwrap();
            assert_eq!(l.state(), end);
        }
    }

    #[test]
    fn the_steps_of_a_job_master_are_all_allowed() {
        // Every move of the job master's core, from a job that reached its first state the
        // way the core does.
        let moves = [
            (Created, Running),
            (Created, Canceled),
            (Running, Restarting),
            (Running, Failed),
            (Running, Canceled),
            (Running, Finished),
            (Restarting, Running),
            (Restarting, Failed),
            (Restarting, Canceled),
        ];
        for (from, to) in moves {
            let mut l = Lifecycle::new(0);
            let reach = master_steps(Created, Running, None)
                .into_iter()
                .chain(master_steps(Running, from, Some("first")))
                .filter(|_| from != Created);
            for (s, a, c) in reach {
                l.apply(s, a, c, 1).unwrap();
            }
            assert_eq!(l.state(), from);
            for (s, a, c) in master_steps(from, to, Some("boom")) {
                l.apply(s, a, c, 2)
                    .unwrap_or_else(|e| panic!("{from} -> {to}: {e}"));
            }
            assert_eq!(l.state(), to);
            if to == Failed {
                let last = l.transitions().last().unwrap();
                assert_eq!(last.cause.as_deref(), Some("boom"));
            }
        }
        // A move the core never makes is refused.
        let mut l = Lifecycle::new(0);
        let refused = master_steps(Created, Finished, None)
            .into_iter()
            .try_for_each(|(s, a, c)| l.apply(s, a, c, 1));
        assert!(refused.is_err());
    }

    #[test]
    fn the_record_is_bounded_and_keeps_the_start() {
        let mut l = Lifecycle::new(0);
        l.apply(Running, JobMaster, None, 1).unwrap();
        for i in 0..1000u64 {
            l.apply(Failing, JobMaster, Some(format!("failure {i}")), 2 + i * 3)
                .unwrap();
            l.apply(Restarting, JobMaster, None, 3 + i * 3).unwrap();
            l.apply(Running, JobMaster, None, 4 + i * 3).unwrap();
        }
        assert_eq!(l.transitions().len(), TRANSITIONS_MAX);
        assert_eq!(l.dropped(), 3001 - TRANSITIONS_MAX as u64);
        assert_eq!(l.transitions()[0].to, Running);
        assert_eq!(l.transitions()[0].at_ms, 1);
        let last_failure = l.transitions().iter().rev().find(|t| t.to == Failing);
        assert_eq!(
            last_failure.and_then(|t| t.cause.as_deref()),
            Some("failure 999")
        );
    }
}
