//! The job master's failure handling: a restart's backoff is a deadline of the master's loop,
//! never a sleep (defect: cancellation waited behind it), and one lost worker is one failure
//! however many regions it hosted (defect: one failure per region).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use cairn::api::StreamEnv;
use cairn::config::JobConfig;
use cairn::connectors::SequenceSource;
use cairn::error::TaskError;
use cairn::jobs::{pipelines, wordcount};
use cairn::runtime::job::{DeployRequest, Deployed, Executor, LocalExecutor};
use cairn::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkOwner, SinkWriter};
use cairn::runtime::task::JobEvent;
use cairn::runtime::{
    run_job_with, InjectSpec, JobError, JobState, JobStatus, JobSummary, RunOptions, SavepointKind,
    SavepointState,
};

/// Generous: the backoffs these tests configure are an hour long.
const DEADLINE: Duration = Duration::from_secs(120);

fn config(pairs: &[(&str, &str)]) -> JobConfig {
    let mut c = JobConfig::default();
    for (k, v) in pairs {
        c.set(k, v).unwrap_or_else(|e| panic!("{k}: {e}"));
    }
    c
}

/// Runs the job on its own thread: the master's result arrives on the returned channel.
fn spawn_run(
    graph: cairn::api::JobGraph,
    opts: RunOptions,
    mut executor: impl Executor + 'static,
) -> mpsc::Receiver<Result<JobSummary, JobError>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(run_job_with(&graph, opts, &mut executor));
    });
    rx
}

/// Wordcount over 2 M generated words, long enough to be failed and cancelled while it runs.
fn generated_wordcount() -> cairn::api::JobGraph {
    let input = wordcount::WordInput::Generate {
        count: 2_000_000,
        keys: 100,
    };
    wordcount::build(&input, 0, &wordcount::WordOutput::Discard).unwrap()
}

/// Waits until `cond` holds, looking every millisecond (the job's status has no
/// notification to wait on); fails with `what` after [`DEADLINE`].
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + DEADLINE;
    while !cond() {
        assert!(Instant::now() < until, "{what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn wait_for_state(status: &JobStatus, state: JobState) {
    wait_until(&format!("the job never reached {state:?}"), || {
        status.view().state == state
    });
}

/// The options of a run with `config` that fails once, injected after about `expected` records.
fn one_injected_failure(
    config: JobConfig,
    seed: u64,
    expected: u64,
    status: &Arc<JobStatus>,
) -> RunOptions {
    RunOptions {
        config,
        inject: Some(InjectSpec {
            count: 1,
            seed,
            expected_records: expected,
        }),
        status: Some(status.clone()),
        ..RunOptions::default()
    }
}

/// Closed until opened; who waits at it blocks (up to [`DEADLINE`]).
#[derive(Default)]
struct Gate {
    open: Mutex<bool>,
    opened: Condvar,
}

impl Gate {
    fn open(&self) {
        *self.open.lock().unwrap() = true;
        self.opened.notify_all();
    }

    fn is_open(&self) -> bool {
        *self.open.lock().unwrap()
    }

    fn wait(&self) {
        let open = self.open.lock().unwrap();
        let _ = self
            .opened
            .wait_timeout_while(open, DEADLINE, |open| !*open);
    }
}

/// Waits until savepoint request `request` of `status` is answered.
fn savepoint_answer(status: &JobStatus, request: &str) -> SavepointState {
    let state = || {
        status
            .view()
            .savepoints
            .iter()
            .find(|s| s.request_id == request)
            .map(|s| s.state.clone())
            .filter(|s| *s != SavepointState::InProgress)
    };
    wait_until("the savepoint request was never answered", || {
        state().is_some()
    });
    state().expect("answered")
}

/// Asks for a savepoint into a file, not a directory: the master refuses it as soon as it
/// takes the request. Returns the answer.
fn refused_savepoint(status: &JobStatus, tmp: &std::path::Path) -> SavepointState {
    let file = tmp.join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let request = status.request_savepoint(file, SavepointKind::Intermediate, false);
    savepoint_answer(status, &request)
}

#[test]
fn a_cancel_during_the_restart_backoff_is_handled_at_once() {
    let graph = generated_wordcount();
    let config = config(&[
        ("parallelism.default", "2"),
        ("execution.checkpointing.interval", "100ms"),
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "3"),
        ("restart-strategy.fixed-delay.delay", "1h"),
    ]);
    let status = JobStatus::new("job".into(), "wordcount".into(), Vec::new());
    let opts = one_injected_failure(config, 7, 100_000, &status);
    let result = spawn_run(graph, opts, LocalExecutor);
    wait_for_state(&status, JobState::Restarting);
    status.request_cancel();
    // With the backoff slept on the master thread, the cancel would wait an hour.
    let outcome = result
        .recv_timeout(DEADLINE)
        .expect("the job master must handle a cancel while a restart waits for its backoff");
    assert!(
        matches!(outcome, Err(JobError::Canceled)),
        "expected a cancelled job, got {outcome:?}"
    );
    assert_eq!(status.view().state, JobState::Canceled);
}

/// Deploys locally and, once both regions of the first deployment run, reports that the worker
/// hosting all of them was lost — as the cluster coordinator does for a dead worker.
struct LosesAWorker {
    inner: LocalExecutor,
    deployed: Vec<u32>,
    lost: bool,
}

impl Executor for LosesAWorker {
    fn deploy(&mut self, req: &DeployRequest<'_>) -> Result<Box<dyn Deployed>, TaskError> {
        let d = self.inner.deploy(req)?;
        self.deployed.push(req.attempt);
        if !self.lost && self.deployed.len() == 2 {
            self.lost = true;
            let _ = req.events.send(JobEvent::Lost {
                attempts: self.deployed.clone(),
                reason: "worker 1 lost: simulated".into(),
                planned: false,
            });
        }
        Ok(d)
    }
}

#[test]
fn a_lost_worker_hosting_two_regions_is_one_failure() {
    let graph = pipelines::build(20_000, 50, 0, &wordcount::WordOutput::Discard).unwrap();
    // One restart allowed: counting the lost worker once per region would exceed it.
    let config = config(&[
        ("parallelism.default", "2"),
        ("execution.checkpointing.interval", "50ms"),
        ("jobmanager.execution.failover-strategy", "region"),
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "1"),
        ("restart-strategy.fixed-delay.delay", "10ms"),
    ]);
    let opts = RunOptions {
        config,
        ..RunOptions::default()
    };
    let executor = LosesAWorker {
        inner: LocalExecutor,
        deployed: Vec::new(),
        lost: false,
    };
    let outcome = spawn_run(graph, opts, executor)
        .recv_timeout(DEADLINE)
        .expect("the job must end");
    let summary = outcome.unwrap_or_else(|e| panic!("the job must survive one lost worker: {e}"));
    assert_eq!(summary.restarts, 1, "one lost worker is one failure");
}

#[test]
fn failures_beyond_the_restart_budget_end_the_job_without_waiting() {
    let graph = generated_wordcount();
    let config = config(&[
        ("execution.checkpointing.interval", "100ms"),
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "1"),
        ("restart-strategy.fixed-delay.delay", "10ms"),
    ]);
    let opts = RunOptions {
        config,
        inject: Some(InjectSpec {
            count: 2,
            seed: 3,
            expected_records: 100_000,
        }),
        ..RunOptions::default()
    };
    let outcome = spawn_run(graph, opts, LocalExecutor)
        .recv_timeout(DEADLINE)
        .expect("the job must end");
    match outcome {
        Err(JobError::Failed { restarts, .. }) => assert_eq!(restarts, 1),
        other => panic!("expected the restart strategy to give up, got {other:?}"),
    }
}

/// Deploys locally, but keeps every redeployment waiting (as a cluster waits for free slots)
/// until `release` is set; counts how often the master asked.
struct SlowToRedeploy {
    inner: LocalExecutor,
    release: Arc<Gate>,
    asked: Arc<AtomicU32>,
}

impl Executor for SlowToRedeploy {
    fn poll_ready(&mut self, req: &DeployRequest<'_>) -> Poll<Result<(), TaskError>> {
        if req.attempt == 0 || self.release.is_open() {
            return Poll::Ready(Ok(()));
        }
        self.asked.fetch_add(1, Ordering::SeqCst);
        Poll::Pending
    }

    fn deploy(&mut self, req: &DeployRequest<'_>) -> Result<Box<dyn Deployed>, TaskError> {
        self.inner.deploy(req)
    }
}

/// A redeployment waiting for its executor (slots) does not hold the job master: a request
/// meanwhile is answered at once (defect: the master waited inside the deployment for up to
/// `--slot-wait`), and the job finishes once the executor is ready.
#[test]
fn the_master_answers_requests_while_a_redeployment_waits() {
    let graph = generated_wordcount();
    let config = config(&[
        ("parallelism.default", "2"),
        ("execution.checkpointing.interval", "100ms"),
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "3"),
        ("restart-strategy.fixed-delay.delay", "10ms"),
    ]);
    let status = JobStatus::new("job".into(), "wordcount".into(), Vec::new());
    let opts = one_injected_failure(config, 7, 100_000, &status);
    let release = Arc::new(Gate::default());
    let asked = Arc::new(AtomicU32::new(0));
    let executor = SlowToRedeploy {
        inner: LocalExecutor,
        release: release.clone(),
        asked: asked.clone(),
    };
    let result = spawn_run(graph, opts, executor);
    wait_until("the redeployment was never asked for", || {
        asked.load(Ordering::SeqCst) >= 3
    });
    let tmp = tempfile::tempdir().unwrap();
    let answered = refused_savepoint(&status, tmp.path());
    assert!(
        matches!(&answered, SavepointState::Failed { cause } if cause.contains("a-file")),
        "{answered:?}"
    );
    assert!(!release.is_open(), "answered while the redeployment waits");
    let asked_before = asked.load(Ordering::SeqCst);
    release.open();
    let outcome = result.recv_timeout(DEADLINE).expect("the job must end");
    let summary = outcome.unwrap_or_else(|e| panic!("the job must finish: {e}"));
    assert_eq!(summary.restarts, 1);
    assert!(asked_before >= 3);
}

/// A sink whose initialization for a redeployment (every call after the first, which the job's
/// preparation makes) blocks until released, as a commit to a slow database would.
struct SlowToInitialize {
    calls: Arc<AtomicU32>,
    release: Arc<Gate>,
}

impl Sink<u64> for SlowToInitialize {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::ExactlyOnce
    }
    fn initialize(&self, _: &SinkOwner, _: Option<Vec<Vec<u8>>>) -> cairn::TaskResult {
        if self.calls.fetch_add(1, Ordering::SeqCst) > 0 {
            self.release.wait();
        }
        Ok(())
    }
    fn create_writer(&self, _: SinkContext) -> cairn::TaskResult<Box<dyn SinkWriter<u64>>> {
        Ok(Box::new(Nothing))
    }
}

struct Nothing;

impl SinkWriter<u64> for Nothing {
    fn write(&mut self, batch: &mut Vec<u64>) -> cairn::TaskResult {
        batch.clear();
        Ok(())
    }
    fn pre_commit(&mut self, _: u64) -> cairn::TaskResult<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }
    fn commit(&mut self, _: u64) -> cairn::TaskResult {
        Ok(())
    }
    fn finish(&mut self) -> cairn::TaskResult {
        Ok(())
    }
}

/// A redeployment's sink initialization (which commits the restored checkpoint's
/// transactions: storage or network I/O) runs off the job master's thread: a request is
/// answered while it blocks (defect: the master initialized sinks itself).
#[test]
fn the_master_answers_requests_while_a_sink_initializes() {
    let calls = Arc::new(AtomicU32::new(0));
    let release = Arc::new(Gate::default());
    let env = StreamEnv::new();
    env.source(SequenceSource::new(2_000_000, 0, |i| i))
        .uid("numbers")
        .sink(SlowToInitialize {
            calls: calls.clone(),
            release: release.clone(),
        })
        .uid("slow-sink");
    let graph = env.build("slow-sink").unwrap();
    let config = config(&[
        ("parallelism.default", "2"),
        ("execution.checkpointing.interval", "50ms"),
        ("restart-strategy.type", "fixed-delay"),
        ("restart-strategy.fixed-delay.attempts", "3"),
        ("restart-strategy.fixed-delay.delay", "10ms"),
    ]);
    let status = JobStatus::new("job".into(), "slow-sink".into(), Vec::new());
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config;
    config
        .set(
            "state.checkpoints.dir",
            &tmp.path().join("ck").display().to_string(),
        )
        .unwrap();
    let opts = one_injected_failure(config, 3, 200_000, &status);
    let result = spawn_run(graph, opts, LocalExecutor);
    wait_until("the sink was never initialized for a restart", || {
        calls.load(Ordering::SeqCst) >= 2
    });
    let answered = refused_savepoint(&status, tmp.path());
    assert!(!release.is_open(), "answered while the sink initializes");
    assert!(
        matches!(&answered, SavepointState::Failed { cause } if cause.contains("a-file")),
        "{answered:?}"
    );
    release.open();
    let outcome = result.recv_timeout(DEADLINE).expect("the job must end");
    let summary = outcome.unwrap_or_else(|e| panic!("the job must finish: {e}"));
    assert_eq!(summary.restarts, 1);
}
