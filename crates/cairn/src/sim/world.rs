//! The simulated job: sources → counters → two-phase-commit sinks, the channels between them
//! with their senders, the uploader, the checkpoint coordinator and the job master, all stepped
//! one event at a time by a seeded scheduler.
//!
//! What is real: the barrier handler ([`InputGate`]) of every task and the sending rule
//! ([`Forwarding`]), exactly as the task threads drive them; the job master's decisions
//! ([`MasterCore`]: region failover, the restart strategy and its backoff, the final
//! checkpoint, the end of the job) with the real checkpoint coordinator inside, on the real
//! storage trait (in memory, able to die during a `_metadata` write). What is modelled: the
//! operators (a replayable source of keys, a keyed counter, a sink whose transactions are
//! pre-committed at the barrier and committed when the checkpoint completes), the senders
//! (partial batches flushed when full, when idle and in front of a barrier; a sender without
//! credit blocks its task), the channels (per-channel FIFO, credits, priority barriers that
//! overtake data), the control path (trigger, complete, abort, end of input — another path
//! than data, so any interleaving with data is possible; completions may be lost), the
//! uploader, and the external system the sinks commit to, which survives everything. A crash,
//! or a job the restart strategy gave up on, is a new process: a new master and coordinator
//! that restore from what the storage holds.
//!
//! Two topologies: `Shuffle` (every source to every counter by key: one pipelined region) and
//! `Forward` (source i → counter i → sink i: two regions, so region failover restarts one
//! while the other runs on).

use std::any::Any;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::storage::{FaultyStorage, SimLeadership};
use crate::checkpoint::coordinator::{
    CheckpointCoordinator, CheckpointSettings, TaskInfo, TaskMessage,
};
use crate::checkpoint::restore::read_metadata;
use crate::checkpoint::{
    DeclineCause, OperatorStates, SavepointOutcome, SavepointRequest, TaskAck, TaskCheckpointStats,
};
use crate::checkpoint::{Finalized, StorageTask};
use crate::config::RestartStrategyConfig;
use crate::error::TaskError;
use crate::runtime::channel::{Barrier, BarrierKind, Element};
use crate::runtime::gate::{
    AlignmentMode, Flaw, FlushCredit, ForwardStep, Forwarding, GateAction, InputGate, Now,
};
use crate::runtime::lifecycle::{master_steps, JobState, Lifecycle};
use crate::runtime::master::{MasterAction, MasterCore, MasterFlaw, Outcome as JobOutcome};
use crate::runtime::restart::RestartTracker;
use crate::runtime::task::JobEvent;
use crate::runtime::watermark::{WatermarkOutput, WatermarkValve};
use crate::runtime::SavepointKind;
use crate::state::cow::{CowMap, Frozen};
use crate::state::Timers;
use crate::storage::layout::{checkpoint_dir, metadata_path, parse_checkpoint_dir, shared_dir};
use crate::storage::{CheckpointStorage, FencedStorage, MemoryStorage};

/// Source subtasks.
pub(crate) const SOURCES: usize = 2;
/// Counter subtasks, each followed by one sink subtask.
pub(crate) const COUNTERS: usize = 2;
const TASKS: usize = SOURCES + 2 * COUNTERS;
/// Credits per channel: batches it may have queued at its receiver (processed batches return
/// their credit).
const CREDITS_MAX: isize = 2;
/// Distinct keys.
const KEYS: u64 = 4;
/// A run that has not finished after this many steps is stuck (a liveness failure).
const STEPS_MAX: usize = 40_000;
/// Interval between periodic checkpoint triggers (simulated ms).
const INTERVAL_MS: u64 = 6;
/// A checkpoint not complete after this long is aborted (simulated ms).
const CHECKPOINT_TIMEOUT_MS: u64 = 300;
/// The job's directory in the checkpoint storage.
const JOB: &str = "sim-job";

/// The checkpoint mode of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Exactly-once, aligned barriers, one checkpoint at a time.
    Aligned,
    /// Exactly-once, unaligned barriers.
    Unaligned,
    /// Exactly-once, aligned with a short alignment timeout.
    AlignedTimeout,
    /// Exactly-once, aligned or unaligned, up to three checkpoints in flight.
    Concurrent,
    /// At-least-once (barriers tracked, channels never blocked).
    AtLeastOnce,
}

impl Mode {
    /// Every mode, in the order seeds cycle through them.
    pub(crate) const ALL: [Mode; 5] = [
        Mode::Aligned,
        Mode::Unaligned,
        Mode::AlignedTimeout,
        Mode::Concurrent,
        Mode::AtLeastOnce,
    ];
}

/// How the tasks are connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology {
    /// Every source to every counter, by key: one pipelined region.
    Shuffle,
    /// Source i → counter i → sink i: one region per pipeline.
    Forward,
}

/// A deliberately planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Planted {
    /// In the barrier handler or the sending rule.
    Handler(Flaw),
    /// The sink commits its transaction at pre-commit instead of on completion.
    CommitAtPreCommit,
    /// A subsumed checkpoint is reported as failed (defect 3.7: the job then fails once more
    /// declines than `tolerable-failed-checkpoints` pile up).
    SubsumedAsFailed,
    /// In the job master.
    Master(MasterFlaw),
    /// An intermediate savepoint commits the sinks' output (its completion is broadcast).
    SavepointCommits,
    /// A source sends its watermark before the partial batch in front of it.
    WatermarkBeforeFlush,
    /// A counter's event time is the maximum over its inputs, not the minimum.
    WatermarkMax,
    /// Timers are not restored with the counters' state.
    TimersLost,
    /// A drained stop sends the maximum watermark after its barrier instead of in front.
    DrainAfterBarrier,
    /// A source restored from a drained stop reads on as if event time had not ended.
    DrainedSourceReadsOn,
    /// A restored sink rolls back all of its prepared transactions in the external system
    /// before it commits the restored checkpoint's (the transaction of a checkpoint that
    /// completed before the process died, uncommitted, is lost).
    RollsBackBeforeCommit,
    /// A restored sink commits the restored checkpoint's transactions but leaves the
    /// prepared ones of later, never completed checkpoints in the external system.
    LeavesPreparedTransactions,
    /// The coordinator deletes every unreferenced shared file at a completion, also those a
    /// newer checkpoint in flight just uploaded.
    SharedGcIgnoresInFlight,
    /// A counter references the files of checkpoints that did not complete yet, as if
    /// confirmed.
    ReusesUnconfirmedFiles,
    /// A counter references every upload of the last checkpoint it saw complete, also when a
    /// snapshot taken since uploaded the same file again (the first version of the RocksDB
    /// backend; the simulation found it with concurrent checkpoints).
    ReusesConfirmedOverNewerUploads,
    /// A counter's snapshot reads its counts when it is uploaded, not as they were at the
    /// barrier (copy-on-write that lets later writes into the snapshot).
    SnapshotReadsLive,
    /// The job's status follows a restarting job master straight from RUNNING to RESTARTING,
    /// without FAILING (the lifecycle's transition table refuses it).
    LifecycleSkipsFailing,
    /// A deposed leader's checkpoint storage is not fenced: the `_metadata` it writes after a
    /// standby took over counts, and it tells its sinks to commit.
    DeposedLeaderCommits,
}

/// Event time of the records: a record's time is its position in its source; windows are this
/// many positions long.
const WINDOW: u64 = 3;
/// Marks a window result `(WINDOWED | key << 32 | window, count)` among the sinks' records.
const WINDOWED: u64 = 1 << 63;

/// One run's settings.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Config {
    pub seed: u64,
    pub mode: Mode,
    pub planted: Option<Planted>,
    /// Keep a trace of every step (for printing a failing seed).
    pub trace: bool,
}

/// What a run ended with.
#[derive(Debug, Default)]
pub(crate) struct Outcome {
    pub steps: usize,
    pub restarts: u32,
    pub completed: usize,
    /// How often each interesting thing happened (to see that the runs exercise it).
    pub stats: BTreeMap<&'static str, u64>,
    /// The first broken guarantee or invariant.
    pub violation: Option<String>,
    pub trace: Vec<String>,
}

/// A task's state in a checkpoint.
#[derive(Debug, Clone)]
pub(crate) enum State {
    /// Read position, and whether a stop drained event time (the real source keeps the
    /// maximum watermark it sent).
    Source(usize, bool),
    /// Count per key, count per key and window, event-time timers (key, time).
    Counter(
        BTreeMap<u64, u64>,
        BTreeMap<(u64, u64), u64>,
        Vec<(u64, i64)>,
    ),
    /// Pre-committed, not yet committed transactions: (transaction, output).
    Sink(Vec<(Txn, Vec<(u64, u64)>)>),
}

/// One task's part of a checkpoint.
#[derive(Debug, Clone)]
pub(crate) struct Snap {
    state: State,
    /// A counter's counts as the heap backend snapshots them: frozen at the barrier
    /// (copy-on-write), read into `state` only when the snapshot is uploaded.
    frozen: Option<Frozen<u64, u64>>,
    /// In-flight batches per input channel (unaligned), serialized.
    channels: Vec<(usize, Vec<Vec<u8>>)>,
    /// A counter's disk state (the RocksDB backend, incremental): its live files, each with
    /// its path in the shared directory and whether this checkpoint uploads it (false: it
    /// references an upload of an earlier checkpoint). Empty for a savepoint (the
    /// backend-independent format).
    disk: Vec<(u64, String, bool)>,
}

/// A counter's disk state as the RocksDB backend with incremental checkpoints keeps it: the
/// numbers of its live immutable files (a flush adds one at every snapshot, a compaction
/// replaces two with one), what the last checkpoint it saw complete referenced, and what each
/// snapshot taken since references (`state::rocks`: a file's earlier upload is referenced only
/// if the confirmed checkpoint and every snapshot since reference that same upload).
#[derive(Debug, Default)]
struct Lsm {
    instance: u64,
    next: u64,
    live: Vec<u64>,
    confirmed: BTreeMap<u64, String>,
    decided: BTreeMap<u64, BTreeMap<u64, String>>,
}

/// A sink transaction: the checkpoint that pre-committed it and the attempt (a crashed
/// coordinator's successor may reuse the id of a checkpoint that left no file).
type Txn = (u64, u32);

enum Body {
    Source {
        keys: Vec<u64>,
        pos: usize,
        exhausted: bool,
        /// Stopped at this stop-with-savepoint barrier: it reads nothing more unless the
        /// savepoint is aborted.
        stopped: Option<u64>,
        /// A stop drained event time (sent the maximum watermark in front of its barrier):
        /// it stays ended, also in the state, as the real source's restored watermark does.
        drained: bool,
        /// Restored drained: at its first poll it reads nothing and ends its input.
        announce: bool,
    },
    Counter {
        /// Copy-on-write, as the heap backend's tables.
        counts: CowMap<u64, u64>,
        /// Records per key and window not yet fired.
        windows: BTreeMap<(u64, u64), u64>,
        /// One timer per key and window end (the real timer queue).
        timers: Box<Timers<u64>>,
        /// Event time over the inputs (the real valve).
        valve: WatermarkValve,
        /// Per input, the last watermark (for the planted maximum).
        seen: Vec<i64>,
    },
    Sink {
        current: Vec<(u64, u64)>,
        pre_committed: Vec<(Txn, Vec<(u64, u64)>)>,
    },
}

#[derive(Debug, Clone, Copy)]
enum Control {
    Trigger(Barrier, BarrierKind),
    Complete(u64),
    Aborted(u64),
    EndOfInput,
}

/// What a sender puts on a channel.
enum Out {
    Batch(Box<dyn Any + Send>, FlushCredit),
    Barrier(Barrier),
    /// An unaligned barrier: it carries the number of batches sent before it.
    Priority(Barrier),
    Watermark(i64),
    EndOfStream,
}

struct Task {
    body: Body,
    gate: InputGate,
    /// The attempt it runs in.
    attempt: u32,
    held: Option<(u64, Snap)>,
    control: VecDeque<Control>,
    /// Restored in-flight batches, processed before any other input.
    replay: VecDeque<Vec<u8>>,
    /// Per output channel (index into the task's outputs): the partial batch.
    partial: Vec<Vec<(u64, u64)>>,
    /// Sends waiting for credit, in order: the task is blocked until they are out.
    outbox: VecDeque<(usize, Out)>,
    /// Every input ended and end of stream went out.
    ended: bool,
    failed: bool,
    exited: bool,
    /// Cancelled by the master or lost with its worker: it runs no more.
    gone: bool,
    /// A counter's disk state.
    lsm: Lsm,
}

enum Item {
    Data(Element),
    /// An unaligned barrier and the number of batches sent before it on the channel.
    Priority(Barrier, u64),
}

struct Channel {
    from: usize,
    to: usize,
    input: usize,
    queue: VecDeque<Item>,
    /// Batches sent and not yet processed.
    outstanding: usize,
    /// Credits; below zero by overdrafts.
    available: isize,
    sent: u64,
    last_barrier: u64,
}

#[derive(Debug, Clone, Copy)]
enum Choice {
    Poll(usize),
    Data(usize),
    Priority(usize),
    Parked(usize),
    Replay(usize),
    Control(usize),
    Promote(usize),
    Capture(usize),
    Flush(usize),
    Send(usize),
    Upload,
    Master,
    Tick,
    FailTask(usize),
    LoseWorker(u32),
    Crash,
    /// The leader pauses past its lease and a standby takes over: a new process restores
    /// from the latest checkpoint while the deposed one keeps its storage work.
    LeaderChange,
    /// The deposed leader resumes and runs its next storage task.
    Deposed,
    /// A user asks for a savepoint.
    Savepoint(SavepointKind),
    /// The executor is ready for the outstanding deployment, which is performed.
    Deployment,
    /// The job master's storage thread runs its next task (a `_metadata` write, a deletion).
    Storage,
}

/// A deployment the master asked for: regions, checkpoint, sources stopped.
type Deployment = (Vec<(usize, u32)>, Option<u64>, bool);

pub(crate) struct World {
    cfg: Config,
    rng: fastrand::Rng,
    base: Instant,
    now_ms: u64,
    topology: Topology,
    regions: Vec<Vec<usize>>,
    region_failover: bool,
    restart_strategy: RestartStrategyConfig,
    /// Records per batch.
    batch_max: usize,
    tasks: Vec<Task>,
    channels: Vec<Channel>,
    outputs: Vec<Vec<usize>>,
    inputs: Vec<Vec<usize>>,
    input: Vec<Vec<u64>>,
    /// The input as generated, before a drained stop ended it early.
    generated: Vec<Vec<u64>>,
    uploads: VecDeque<(u32, usize, u64, Snap)>,
    events: VecDeque<JobEvent>,
    settings: CheckpointSettings,
    master: MasterCore,
    /// What the current process restored from when it started.
    initial: Option<Vec<Snap>>,
    /// Survives crashes.
    storage: FaultyStorage,
    /// The content of the task state files, by (checkpoint, task): `storage` holds the files.
    files: BTreeMap<(u64, usize), Snap>,
    completed: usize,
    /// What the sinks committed, by (sink, transaction); survives everything.
    external: BTreeMap<(usize, Txn), Vec<(u64, u64)>>,
    /// The external system's prepared transactions (PostgreSQL's `PREPARE TRANSACTION`, a
    /// flushed Kafka transaction), by (sink, transaction): written at pre-commit, they
    /// survive crashes until a sink commits or rolls them back. A commit of one the system
    /// no longer holds, and any left when the job finishes, are violations.
    prepared: BTreeMap<(usize, Txn), Vec<(u64, u64)>>,
    failure_budget: u32,
    /// Savepoints the user still asks for in this run.
    savepoints_left: u32,
    /// Where savepoints go; survives everything.
    savepoint_target: MemoryStorage,
    /// Savepoint requests: request id → (directory, kind).
    savepoint_requests: BTreeMap<String, (String, SavepointKind)>,
    /// The stop-with-savepoint the current process completed: the job ends, and is resumed
    /// from it (unless it drained event time: then the job is over for good).
    stopped_at: Option<(u64, String)>,
    /// Disk state instances opened so far (each gets its own number, as a RocksDB instance
    /// gets its own id).
    instances: u64,
    /// Restarts of earlier processes (the current master counts its own).
    process_restarts: u32,
    /// The deployment the master asked for and the executor is not ready for yet (waiting
    /// for slots or workers, as the shell does): regions, checkpoint, sources stopped.
    deployment: Option<Deployment>,
    /// The checkpoint coordinator's storage work, queued for the storage thread.
    storage_tasks: VecDeque<StorageTask>,
    /// The current process's leadership (its epoch fences its checkpoint storage).
    leadership: Arc<SimLeadership>,
    /// Storage work deposed leaders had queued when a standby took over: they may resume
    /// and run it at any later step.
    deposed: VecDeque<StorageTask>,
    finished: bool,
    /// The job's lifecycle as its status follows the job master, and the master state it
    /// last followed.
    lifecycle: Lifecycle,
    reported: JobState,
    violation: Option<String>,
    trace: Vec<String>,
    stats: BTreeMap<&'static str, u64>,
}

fn is_source(t: usize) -> bool {
    t < SOURCES
}

fn is_counter(t: usize) -> bool {
    (SOURCES..SOURCES + COUNTERS).contains(&t)
}

fn sink_of(counter: usize) -> usize {
    counter + COUNTERS
}

fn uid(task: usize) -> String {
    format!("op-{task}")
}

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).unwrap_or_default()
}

/// A batch, for the trace.
fn describe(batch: &(dyn Any + Send)) -> String {
    if let Some(keys) = batch.downcast_ref::<Vec<u64>>() {
        format!("{keys:?}")
    } else if let Some(records) = batch.downcast_ref::<Vec<(u64, u64)>>() {
        format!("{records:?}")
    } else {
        "?".into()
    }
}

fn task_info(t: usize) -> TaskInfo {
    TaskInfo {
        index: t,
        name: format!("task {t}"),
        subtask: 0,
        is_source: is_source(t),
        operators: vec![(uid(t), 1)],
    }
}

impl World {
    pub(crate) fn new(cfg: Config) -> Self {
        let mut rng = fastrand::Rng::with_seed(cfg.seed);
        let topology = if rng.bool() {
            Topology::Shuffle
        } else {
            Topology::Forward
        };
        // In the forward topology source s reads only keys of counter s, so that the keys'
        // routing is the same in both.
        let input: Vec<Vec<u64>> = (0..SOURCES)
            .map(|s| {
                let n = rng.usize(8..=24);
                (0..n)
                    .map(|_| match topology {
                        Topology::Shuffle => rng.u64(0..KEYS),
                        Topology::Forward => {
                            rng.u64(0..KEYS / COUNTERS as u64) * COUNTERS as u64 + s as u64
                        }
                    })
                    .collect()
            })
            .collect();
        let (kind, max_concurrent) = match cfg.mode {
            Mode::Aligned | Mode::AtLeastOnce => (BarrierKind::Aligned, 1),
            Mode::Unaligned => (BarrierKind::Unaligned, 1),
            Mode::AlignedTimeout => (
                BarrierKind::AlignedWithTimeout {
                    timeout_ms: rng.u64(0..=6),
                },
                1 + rng.usize(0..2),
            ),
            Mode::Concurrent => (
                if rng.bool() {
                    BarrierKind::Aligned
                } else {
                    BarrierKind::Unaligned
                },
                2 + rng.usize(0..2),
            ),
        };
        let mut channels = Vec::new();
        let mut outputs = vec![Vec::new(); TASKS];
        let mut inputs = vec![Vec::new(); TASKS];
        let mut connect = |from: usize, to: usize| {
            let input = inputs[to].len();
            inputs[to].push(channels.len());
            outputs[from].push(channels.len());
            channels.push(Channel {
                from,
                to,
                input,
                queue: VecDeque::new(),
                outstanding: 0,
                available: CREDITS_MAX,
                sent: 0,
                last_barrier: 0,
            });
        };
        for s in 0..SOURCES {
            for k in 0..COUNTERS {
                if topology == Topology::Shuffle || k == s {
                    connect(s, SOURCES + k);
                }
            }
        }
        for k in 0..COUNTERS {
            connect(SOURCES + k, sink_of(SOURCES + k));
        }
        let regions = match topology {
            Topology::Shuffle => vec![(0..TASKS).collect()],
            Topology::Forward => (0..SOURCES)
                .map(|s| vec![s, SOURCES + s, sink_of(SOURCES + s)])
                .collect(),
        };
        let failure_budget = rng.u32(0..=3);
        // Concurrent runs tolerate no failed checkpoint: a subsumed one (declined when a newer
        // barrier overtakes its alignment) must not count as failed.
        let (timeout, tolerable_failed) = if cfg.mode == Mode::Concurrent {
            (Duration::from_secs(3600), 0)
        } else {
            (Duration::from_millis(CHECKPOINT_TIMEOUT_MS), u32::MAX)
        };
        let settings = CheckpointSettings {
            interval: Duration::from_millis(INTERVAL_MS),
            timeout,
            min_pause: Duration::ZERO,
            max_concurrent: max_concurrent as u32,
            tolerable_failed,
            num_retained: 2,
            barrier_kind: kind,
        };
        let ms = Duration::from_millis;
        let restart_strategy = match rng.u32(0..3) {
            0 => RestartStrategyConfig::FixedDelay {
                attempts: rng.u32(1..=3),
                delay: ms(rng.u64(0..=4)),
            },
            1 => RestartStrategyConfig::FailureRate {
                max_failures_per_interval: 2,
                failure_rate_interval: ms(30),
                delay: ms(rng.u64(0..=3)),
            },
            _ => RestartStrategyConfig::ExponentialDelay {
                initial_backoff: ms(1),
                max_backoff: ms(8),
                backoff_multiplier: 2.0,
                reset_backoff_threshold: ms(60),
                jitter_factor: 0.1,
                attempts_before_reset_backoff: rng.u32(2..=4),
            },
        };
        let region_failover = regions.len() > 1 && rng.bool();
        let storage = FaultyStorage::default();
        let base = Instant::now();
        let master = MasterCore::new(
            Vec::new(),
            false,
            None,
            RestartTracker::new(RestartStrategyConfig::None),
        );
        let batch_max = rng.usize(1..=3);
        let savepoints_left = rng.u32(0..=2);
        let mut w = World {
            cfg,
            rng,
            base,
            now_ms: 0,
            topology,
            regions,
            region_failover,
            restart_strategy,
            batch_max,
            tasks: Vec::new(),
            channels,
            outputs,
            inputs,
            generated: input.clone(),
            input,
            uploads: VecDeque::new(),
            events: VecDeque::new(),
            settings,
            master,
            initial: None,
            storage,
            files: BTreeMap::new(),
            completed: 0,
            external: BTreeMap::new(),
            prepared: BTreeMap::new(),
            failure_budget,
            savepoints_left: 0,
            savepoint_target: MemoryStorage::new(),
            savepoint_requests: BTreeMap::new(),
            stopped_at: None,
            instances: 0,
            process_restarts: 0,
            deployment: None,
            storage_tasks: VecDeque::new(),
            leadership: Arc::new(SimLeadership::new(0)),
            deposed: VecDeque::new(),
            finished: false,
            lifecycle: Lifecycle::new(0),
            reported: JobState::Created,
            violation: None,
            trace: Vec::new(),
            stats: BTreeMap::new(),
        };
        w.savepoints_left = savepoints_left;
        w.start_process();
        w
    }

    fn now(&self) -> Now {
        Now {
            at: self.base + Duration::from_millis(self.now_ms),
            wall_ms: self.now_ms,
        }
    }

    fn count(&mut self, what: &'static str) {
        *self.stats.entry(what).or_insert(0) += 1;
    }

    /// Adds a line to the trace (when tracing).
    fn note(&mut self, line: impl FnOnce() -> String) {
        if self.cfg.trace {
            self.trace.push(format!("    {}", line()));
        }
    }

    fn violate(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(what);
        }
    }

    fn flaw(&self) -> Option<Flaw> {
        match self.cfg.planted {
            Some(Planted::Handler(f)) => Some(f),
            _ => None,
        }
    }

    /// A new process: a new job master and coordinator, which restore from the newest
    /// checkpoint whose `_metadata` exists (as `--from latest`), and deploy every region.
    fn start_process(&mut self) {
        let latest = self.latest_completed();
        self.start_process_from(latest);
    }

    /// A new process restoring from `initial` (None: starting empty).
    fn start_process_from(&mut self, initial: Option<Vec<Snap>>) {
        self.uploads.clear();
        self.events.clear();
        self.deployment = None;
        // A process that died lost the storage work it had not done.
        self.storage_tasks.clear();
        self.initial = initial;
        let min_next = self.files.keys().map(|k| k.0).max().unwrap_or(0) + 1;
        // Every process leads a new epoch; its writes are fenced by it.
        self.leadership = Arc::new(SimLeadership::new(self.leadership_epoch() + 1));
        let storage: Arc<dyn CheckpointStorage> =
            if self.cfg.planted == Some(Planted::DeposedLeaderCommits) {
                Arc::new(self.storage.clone())
            } else {
                Arc::new(FencedStorage::new(
                    Arc::new(self.storage.clone()),
                    self.leadership.clone(),
                ))
            };
        let coordinator = CheckpointCoordinator::new(
            self.settings.clone(),
            storage,
            JOB.into(),
            "sim".into(),
            128,
            min_next,
            (self.base, 0),
        );
        self.master = MasterCore::new(
            self.regions.clone(),
            self.region_failover,
            Some(coordinator),
            RestartTracker::new(self.restart_strategy),
        );
        if let Some(Planted::Master(f)) = self.cfg.planted {
            self.master.plant(f);
        }
        if let Some(c) = self.master.coordinator_mut() {
            match self.cfg.planted {
                Some(Planted::SavepointCommits) => c.plant_savepoints_commit(),
                Some(Planted::SharedGcIgnoresInFlight) => c.plant_gc_ignores_in_flight(),
                _ => {}
            }
        }
        self.stopped_at = None;
        // A new run of the job: a new status.
        self.lifecycle = Lifecycle::new(self.now_ms);
        self.reported = JobState::Created;
        if self.tasks.is_empty() {
            self.tasks = (0..TASKS).map(|t| self.new_task(t, 0, None)).collect();
            for t in &mut self.tasks {
                t.gone = true;
            }
        }
        self.master.start();
        self.perform();
    }

    /// The epoch the current process leads.
    fn leadership_epoch(&self) -> u64 {
        self.leadership.epoch()
    }

    /// The leader pauses past its lease and a standby takes over: the old process is deposed
    /// (its workers let it go, its tasks are gone) but keeps the storage work it had queued,
    /// which it may run when it resumes; the new leader restores from the latest checkpoint.
    fn leader_change(&mut self) {
        self.leadership.depose();
        let queued: Vec<StorageTask> = self.storage_tasks.drain(..).collect();
        self.deposed.extend(queued);
        self.new_process("leader changes");
    }

    /// A deposed leader resumes and runs a storage task it had queued. Fenced, a `_metadata`
    /// write is refused; were it not, the deposed leader would tell its sinks to commit the
    /// checkpoint, as the job master does on a completion.
    fn deposed_store(&mut self) {
        let Some(task) = self.deposed.pop_front() else {
            return;
        };
        self.note(|| format!("deposed leader's storage: {task:?}"));
        match task.run() {
            // An intermediate savepoint's copy is the user's and commits nothing; a checkpoint
            // (or a stop-with-savepoint) is complete once its `_metadata` is written.
            Some(Finalized { id, result: Ok(()) })
                if self
                    .storage
                    .exists(&metadata_path(JOB, id))
                    .unwrap_or(false) =>
            {
                self.count("checkpoints a deposed leader completed");
                let txns: Vec<(usize, Txn)> = self
                    .prepared
                    .keys()
                    .filter(|(_, txn)| txn.0 == id)
                    .copied()
                    .collect();
                for (sink, txn) in txns {
                    self.commit_prepared(sink, txn);
                }
            }
            Some(Finalized { result: Err(_), .. }) => {
                self.count("completions refused to a deposed leader")
            }
            Some(_) => self.count("savepoints a deposed leader wrote"),
            None => {}
        }
    }

    /// The process died, or its job failed for good and is submitted again from the latest
    /// checkpoint.
    fn new_process(&mut self, why: &'static str) {
        self.count(why);
        self.process_restarts += self.master.restart_count() + 1;
        for t in &mut self.tasks {
            t.gone = true;
        }
        self.start_process();
    }

    /// Performs what the job master decided.
    fn perform(&mut self) {
        while let Some(action) = self.master.next_action() {
            self.note(|| format!("master: {action:?}"));
            match action {
                MasterAction::Deploy {
                    regions,
                    from,
                    sources_stopped,
                } => {
                    if self.deployment.is_some() {
                        return self.violate(
                            "a deployment was asked for while another was outstanding".into(),
                        );
                    }
                    self.deployment = Some((regions, from, sources_stopped));
                }
                MasterAction::Cancel { regions } => {
                    // As the shell: a cancel of regions not deployed yet drops their deployment.
                    if self
                        .deployment
                        .as_ref()
                        .is_some_and(|(d, _, _)| d.iter().any(|(r, _)| regions.contains(r)))
                    {
                        self.deployment = None;
                        self.count("deployments abandoned before they were ready");
                    }
                    for r in regions {
                        for t in self.regions[r].clone() {
                            if let Some(task) = self.tasks.get_mut(t) {
                                task.gone = true;
                                task.control.clear();
                                task.outbox.clear();
                            }
                        }
                    }
                }
                MasterAction::Message { task, message } => self.deliver(task, message),
                MasterAction::EndOfInput { task } => self.send_control(task, Control::EndOfInput),
            }
        }
        if self.cfg.mode == Mode::Concurrent
            && self
                .master
                .failure_cause()
                .is_some_and(|c| c.contains("tolerable number of failed checkpoints"))
        {
            self.violate("a checkpoint failed in a run that tolerates none".into());
        }
        for (request, outcome) in self.master.drain_savepoint_outcomes() {
            let Some((dir, kind)) = self.savepoint_requests.get(&request).cloned() else {
                return self.violate(format!(
                    "an outcome for unknown savepoint request {request}"
                ));
            };
            if let SavepointOutcome::Completed { id, .. } = outcome {
                self.count(match kind {
                    SavepointKind::Intermediate => "savepoints",
                    SavepointKind::Stop => "stop savepoints",
                    SavepointKind::StopAndDrain => "drained stop savepoints",
                });
                let path = format!("{dir}/_metadata");
                if !self.savepoint_target.exists(&path).unwrap_or(false) {
                    return self.violate(format!("savepoint {id} completed without {path}"));
                }
                if kind.stops() {
                    self.stopped_at = Some((id, dir));
                }
            }
        }
        self.storage_tasks.extend(self.master.drain_storage());
        self.follow_lifecycle();
        if self.master.outcome().is_some() {
            // The job master ends after its storage work is done.
            self.finish_storage();
        }
        match self.master.outcome() {
            Some(JobOutcome::Finished) if self.stopped_at.is_some() => self.resume_from_savepoint(),
            Some(JobOutcome::Finished) => self.finished = true,
            Some(JobOutcome::Failed { .. }) => self.new_process("jobs failed for good"),
            Some(JobOutcome::Canceled) => self.violate("the job was cancelled".into()),
            None => {}
        }
    }

    /// The job's status follows the job master's state through the lifecycle, as the shell
    /// does; a transition the table refuses is a violation.
    fn follow_lifecycle(&mut self) {
        let now = self.master.state();
        let mut steps = master_steps(self.reported, now, self.master.failure_cause());
        if matches!(self.cfg.planted, Some(Planted::LifecycleSkipsFailing)) {
            steps.retain(|(to, _, _)| *to != JobState::Failing);
        }
        for (to, actor, cause) in steps {
            if let Err(e) = self.lifecycle.apply(to, actor, cause, self.now_ms) {
                return self.violate(format!("lifecycle: {e}"));
            }
        }
        self.reported = now;
    }

    /// The job stopped with a savepoint: a new run resumes from it, as `--from` its path.
    fn resume_from_savepoint(&mut self) {
        let Some((id, dir)) = self.stopped_at.take() else {
            return;
        };
        self.count("runs resumed from a stop savepoint");
        self.process_restarts += self.master.restart_count();
        let snaps: Option<Vec<Snap>> = (0..TASKS)
            .map(|t| self.files.get(&(id, t)).cloned())
            .collect();
        let Some(snaps) = snaps else {
            return self.violate(format!("savepoint {id} in {dir} misses a task's state"));
        };
        for t in &mut self.tasks {
            t.gone = true;
        }
        self.start_process_from(Some(snaps));
    }

    /// The user asks for a savepoint.
    fn request_savepoint(&mut self, kind: SavepointKind) {
        let n = self.savepoint_requests.len();
        let request_id = format!("request-{n}");
        let dir = format!("savepoint-{n}");
        self.savepoint_requests
            .insert(request_id.clone(), (dir.clone(), kind));
        self.master.request_savepoint(SavepointRequest {
            request_id,
            target: Arc::new(self.savepoint_target.clone()),
            dir,
            stop: kind.stops(),
            drain: kind == SavepointKind::StopAndDrain,
        });
        let at = self.now().at;
        self.master.poll(at);
        self.perform();
    }

    /// Deploys regions, each as its attempt, from checkpoint `from` or from what the process
    /// started with; sinks commit the restored checkpoint's pre-committed transactions and
    /// drop the rest.
    fn deploy(&mut self, regions: &[(usize, u32)], from: Option<u64>, sources_stopped: bool) {
        let restored = match from {
            Some(id) => {
                if !self
                    .storage
                    .exists(&metadata_path(JOB, id))
                    .unwrap_or(false)
                {
                    return self.violate(format!(
                        "restore from checkpoint {id}, which has no _metadata"
                    ));
                }
                match (0..TASKS)
                    .map(|t| self.files.get(&(id, t)).cloned())
                    .collect()
                {
                    Some(snaps) => Some(snaps),
                    None => return self.violate(format!("checkpoint {id} misses a task's state")),
                }
            }
            None => self.initial.clone(),
        };
        if self.cfg.trace {
            let input = self.input.clone();
            self.note(|| format!("input: {input:?}"));
            for (t, snap) in restored.iter().flatten().enumerate() {
                let line = format!(
                    "restored task {t}: {:?} channels {:?}",
                    snap.state, snap.channels
                );
                self.note(|| line);
            }
        }
        if self.tasks.is_empty() {
            self.tasks = (0..TASKS).map(|t| self.new_task(t, 0, None)).collect();
            for t in &mut self.tasks {
                t.gone = true;
            }
        }
        if sources_stopped {
            self.count("restarts at a completed stop");
        }
        let mut infos = Vec::new();
        for &(r, attempt) in regions {
            if from.is_some() || self.count_restart(attempt) {
                self.count(
                    if self.regions.len() > 1 && regions.len() == 1 && self.region_failover {
                        "region restarts"
                    } else {
                        "job restarts"
                    },
                );
            }
            for t in self.regions[r].clone() {
                let snap = restored.as_ref().map(|r| r[t].clone());
                self.tasks[t] = self.new_task(t, attempt, snap);
                if let (Body::Source { stopped, .. }, true) =
                    (&mut self.tasks[t].body, sources_stopped)
                {
                    *stopped = Some(0);
                }
                for ch in &mut self.channels {
                    if ch.from == t || ch.to == t {
                        ch.queue.clear();
                        ch.outstanding = 0;
                        ch.available = CREDITS_MAX;
                        ch.sent = 0;
                        ch.last_barrier = 0;
                    }
                }
                infos.push(task_info(t));
            }
        }
        let at = self.now().at;
        self.master.deployed(infos, at);
    }

    /// Whether deploying `attempt` is a restart (the first attempts of a process are not).
    fn count_restart(&self, attempt: u32) -> bool {
        attempt as usize >= self.regions.len()
    }

    /// Task `t` of a new attempt, restored from `snap`.
    fn new_task(&mut self, t: usize, attempt: u32, snap: Option<Snap>) -> Task {
        let state = snap.as_ref().map(|s| s.state.clone());
        let body = if is_source(t) {
            let (pos, drained) = match state {
                Some(State::Source(p, d)) => (p, d),
                _ => (0, false),
            };
            let reads_on = self.cfg.planted == Some(Planted::DrainedSourceReadsOn);
            if drained && !reads_on {
                // Event time ended: the source reads nothing more (as the real one, restored
                // with the maximum watermark), so the job's input ends here.
                self.input[t].truncate(pos);
            }
            Body::Source {
                keys: self.input[t].clone(),
                pos,
                exhausted: false,
                stopped: None,
                drained,
                announce: drained && !reads_on,
            }
        } else if is_counter(t) {
            let (counts, windows, restored_timers) = match state {
                Some(State::Counter(c, w, t)) => (c, w, t),
                _ => (BTreeMap::new(), BTreeMap::new(), Vec::new()),
            };
            let mut timers = Box::new(Timers::new());
            if self.cfg.planted != Some(Planted::TimersLost) {
                for (k, time) in restored_timers {
                    timers.event.register(&k, time);
                }
            }
            let mut live = CowMap::default();
            for (k, n) in counts {
                live.put(&k, n);
            }
            Body::Counter {
                counts: live,
                windows,
                timers,
                valve: WatermarkValve::new(self.inputs[t].len()),
                seen: vec![i64::MIN; self.inputs[t].len()],
            }
        } else {
            let pending = match state {
                Some(State::Sink(pending)) => pending,
                _ => Vec::new(),
            };
            self.restore_sink(t, pending);
            Body::Sink {
                current: Vec::new(),
                pre_committed: Vec::new(),
            }
        };
        let lsm = self.restored_lsm(t, snap.as_ref());
        let replay = snap
            .map(|s| s.channels.into_iter().flat_map(|(_, b)| b).collect())
            .unwrap_or_default();
        let mode = if self.cfg.mode == Mode::AtLeastOnce {
            AlignmentMode::Tracking
        } else {
            AlignmentMode::Aligned
        };
        let timeout = match self.settings.barrier_kind {
            BarrierKind::AlignedWithTimeout { timeout_ms } => {
                Some(Duration::from_millis(timeout_ms))
            }
            _ => None,
        };
        Task {
            body,
            gate: InputGate::new(self.inputs[t].len(), mode)
                .with_aligned_timeout(timeout)
                .with_flaw(self.flaw()),
            attempt,
            held: None,
            control: VecDeque::new(),
            replay,
            partial: vec![Vec::new(); self.outputs[t].len()],
            outbox: VecDeque::new(),
            ended: false,
            failed: false,
            exited: false,
            gone: false,
            lsm,
        }
    }

    /// A new disk state instance for task `t`, restored from `snap`'s files: every one must
    /// still be in the shared directory. This job's files may be referenced again.
    fn restored_lsm(&mut self, t: usize, snap: Option<&Snap>) -> Lsm {
        self.instances += 1;
        let mut lsm = Lsm {
            instance: self.instances,
            ..Lsm::default()
        };
        for (file, path, _) in snap.map_or(&[][..], |s| s.disk.as_slice()) {
            if !self.storage.exists(path).unwrap_or(false) {
                self.violate(format!(
                    "task {t} restores shared file {path}, which was deleted"
                ));
            }
            lsm.live.push(*file);
            lsm.confirmed.insert(*file, path.clone());
            lsm.next = lsm.next.max(file + 1);
        }
        if !lsm.live.is_empty() {
            self.count("disk states restored");
        }
        lsm
    }

    /// The synchronous part of a counter's disk snapshot: a flush (and maybe a compaction),
    /// then which live files checkpoint `id` uploads and which it references.
    fn disk_snapshot(&mut self, t: usize, id: u64, savepoint: bool) -> Vec<(u64, String, bool)> {
        if !is_counter(t) || savepoint {
            return Vec::new();
        }
        let compact = self.rng.u8(..) % 3 == 0;
        let reuse_pending = self.cfg.planted == Some(Planted::ReusesUnconfirmedFiles);
        let naive = self.cfg.planted == Some(Planted::ReusesConfirmedOverNewerUploads);
        let lsm = &mut self.tasks[t].lsm;
        lsm.live.push(lsm.next);
        lsm.next += 1;
        if compact && lsm.live.len() >= 3 {
            lsm.live.drain(..2);
            lsm.live.insert(0, lsm.next);
            lsm.next += 1;
        }
        let dir = shared_dir(JOB);
        let instance = lsm.instance;
        let plan: Vec<(u64, String, bool)> = lsm
            .live
            .iter()
            .map(|&f| {
                let known = if reuse_pending {
                    lsm.decided
                        .values()
                        .rev()
                        .find_map(|m| m.get(&f))
                        .or_else(|| lsm.confirmed.get(&f))
                } else {
                    lsm.confirmed
                        .get(&f)
                        .filter(|p| naive || lsm.decided.values().all(|m| m.get(&f) == Some(*p)))
                };
                match known {
                    Some(path) => (f, path.clone(), false),
                    None => (f, format!("{dir}/{id}-{instance}-{f}"), true),
                }
            })
            .collect();
        let decided = plan.iter().map(|(f, p, _)| (*f, p.clone())).collect();
        lsm.decided.insert(id, decided);
        plan
    }

    /// The end of a run: the shared files in storage are exactly those the completed
    /// checkpoints there reference (none leaked, none missing).
    fn check_shared_files(&mut self) {
        let dir = shared_dir(JOB);
        let on_disk: BTreeSet<String> = self
            .storage
            .list(&dir)
            .unwrap_or_default()
            .into_iter()
            .map(|n| format!("{dir}/{n}"))
            .collect();
        let mut referenced = BTreeSet::new();
        for name in self.storage.list(JOB).unwrap_or_default() {
            let Some(id) = parse_checkpoint_dir(&name) else {
                continue;
            };
            if !self
                .storage
                .exists(&metadata_path(JOB, id))
                .unwrap_or(false)
            {
                continue;
            }
            match read_metadata(&self.storage, JOB, id) {
                Ok(m) => referenced.extend(m.shared_files),
                Err(e) => return self.violate(format!("checkpoint {id}: {e}")),
            }
        }
        if let Some(f) = on_disk.difference(&referenced).next() {
            return self.violate(format!(
                "the job finished with shared file {f} that no checkpoint references"
            ));
        }
        if let Some(f) = referenced.difference(&on_disk).next() {
            self.violate(format!(
                "a retained checkpoint references {f}, which was deleted"
            ));
        }
    }

    /// The task snapshots of the newest checkpoint whose `_metadata` exists.
    fn latest_completed(&self) -> Option<Vec<Snap>> {
        let mut ids: Vec<u64> = self.files.keys().map(|k| k.0).collect();
        ids.dedup();
        let id = ids.into_iter().rev().find(|&id| {
            self.storage
                .exists(&metadata_path(JOB, id))
                .unwrap_or(false)
        })?;
        (0..TASKS)
            .map(|t| self.files.get(&(id, t)).cloned())
            .collect()
    }

    /// Sends control mail to a running task (a gone task's mailbox is closed).
    fn send_control(&mut self, task: usize, c: Control) {
        if let Some(t) = self.tasks.get_mut(task).filter(|t| !t.gone) {
            t.control.push_back(c);
        }
    }

    /// Delivers a coordinator message on the control path; a completion notification other
    /// than the final checkpoint's may be lost (a later one subsumes it).
    fn deliver(&mut self, task: usize, m: TaskMessage) {
        let c = match m {
            TaskMessage::Trigger(b, kind) => Control::Trigger(b, kind),
            TaskMessage::Complete(id) => {
                if self.master.final_checkpoint() != Some(id) && self.rng.u32(0..8) == 0 {
                    self.count("lost completions");
                    return;
                }
                Control::Complete(id)
            }
            TaskMessage::Aborted(id) => Control::Aborted(id),
        };
        self.send_control(task, c);
    }

    /// Whether `out` may go on channel `ch` now.
    fn may_send(&self, ch: usize, out: &Out) -> bool {
        !matches!(out, Out::Batch(_, FlushCredit::Wait)) || self.channels[ch].available > 0
    }

    /// `task` sends `out` on channel `ch`: at once, or after what waits in its outbox.
    fn send(&mut self, task: usize, ch: usize, out: Out) {
        if self.tasks[task].outbox.is_empty() && self.may_send(ch, &out) {
            self.put(ch, out);
        } else {
            self.tasks[task].outbox.push_back((ch, out));
        }
    }

    /// Puts `out` on channel `ch`.
    fn put(&mut self, ch: usize, out: Out) {
        if self.cfg.trace {
            let what = match &out {
                Out::Batch(b, credit) => format!("batch {} {credit:?}", describe(&**b)),
                Out::Barrier(b) => format!("barrier {}", b.id),
                Out::Priority(b) => {
                    format!("priority barrier {} after {}", b.id, self.channels[ch].sent)
                }
                Out::EndOfStream => "end of stream".into(),
                Out::Watermark(t) => format!("watermark {t}"),
            };
            self.note(|| format!("channel {ch}: {what}"));
        }
        let c = &mut self.channels[ch];
        let item = match out {
            Out::Batch(batch, credit) => {
                if credit == FlushCredit::Wait && c.available <= 0 {
                    return self.violate(format!("a batch went on channel {ch} without credit"));
                }
                c.available -= 1;
                c.outstanding += 1;
                c.sent += 1;
                Item::Data(Element::Batch(batch))
            }
            Out::Barrier(b) | Out::Priority(b) if b.id <= c.last_barrier => {
                let last = c.last_barrier;
                return self.violate(format!(
                    "barrier {} sent on channel {ch} after barrier {last}",
                    b.id
                ));
            }
            Out::Barrier(b) => {
                c.last_barrier = b.id;
                Item::Data(Element::Barrier(b))
            }
            Out::Priority(b) => {
                c.last_barrier = b.id;
                Item::Priority(b, c.sent)
            }
            Out::EndOfStream => Item::Data(Element::EndOfStream),
            Out::Watermark(t) => Item::Data(Element::Watermark(t)),
        };
        c.queue.push_back(item);
    }

    /// The front of `task`'s outbox may go out.
    fn may_unblock(&self, task: usize) -> bool {
        self.tasks[task]
            .outbox
            .front()
            .is_some_and(|(ch, out)| self.may_send(*ch, out))
    }

    /// A batch of `records` for `task`'s output `out`.
    fn batch_of(_task: usize, records: Vec<(u64, u64)>) -> Box<dyn Any + Send> {
        // Sources send (key, event time), counters (key, count).
        Box::new(records)
    }

    /// Sends the partial batch of `task`'s output `out`, if it has one.
    fn flush_partial(&mut self, task: usize, out: usize, credit: FlushCredit) {
        let records = std::mem::take(&mut self.tasks[task].partial[out]);
        if records.is_empty() {
            return;
        }
        let ch = self.outputs[task][out];
        if credit == FlushCredit::Overdraw && self.channels[ch].available <= 0 {
            self.count("overdrafts");
        }
        self.send(task, ch, Out::Batch(Self::batch_of(task, records), credit));
    }

    /// `task` emits a record on its output `out`: a full batch goes out, waiting for credit.
    fn emit(&mut self, task: usize, out: usize, record: (u64, u64)) {
        self.tasks[task].partial[out].push(record);
        if self.tasks[task].partial[out].len() >= self.batch_max {
            self.flush_partial(task, out, FlushCredit::Wait);
        }
    }

    /// Forwards a barrier on every output, by the sending rule.
    fn forward(&mut self, task: usize, barrier: Barrier, unaligned: bool) {
        let rule = Forwarding::with_flaw(self.flaw());
        for step in rule.steps(unaligned) {
            for out in 0..self.outputs[task].len() {
                let ch = self.outputs[task][out];
                match step {
                    ForwardStep::FlushPartial(credit) => self.flush_partial(task, out, credit),
                    ForwardStep::Barrier if unaligned => {
                        self.send(task, ch, Out::Priority(barrier))
                    }
                    ForwardStep::Barrier => self.send(task, ch, Out::Barrier(barrier)),
                }
            }
        }
    }

    /// A source's watermark on every output, after the partial batches in front of it.
    fn send_watermark(&mut self, task: usize, t: i64) {
        let early = self.cfg.planted == Some(Planted::WatermarkBeforeFlush);
        for out in 0..self.outputs[task].len() {
            let ch = self.outputs[task][out];
            if early {
                self.send(task, ch, Out::Watermark(t));
                self.flush_partial(task, out, FlushCredit::Wait);
            } else {
                self.flush_partial(task, out, FlushCredit::Wait);
                self.send(task, ch, Out::Watermark(t));
            }
        }
    }

    /// A source read its input to the end: the maximum watermark, then it waits for the
    /// final checkpoint.
    fn end_source_input(&mut self, s: usize) {
        self.send_watermark(s, i64::MAX);
        for out in 0..self.outputs[s].len() {
            self.flush_partial(s, out, FlushCredit::Wait);
        }
        let attempt = self.tasks[s].attempt;
        self.events
            .push_back(JobEvent::SourceExhausted { attempt, task: s });
    }

    fn end_stream(&mut self, task: usize) {
        self.tasks[task].ended = true;
        for out in 0..self.outputs[task].len() {
            self.flush_partial(task, out, FlushCredit::Wait);
            let ch = self.outputs[task][out];
            self.send(task, ch, Out::EndOfStream);
        }
    }

    /// Commits a prepared transaction in the external system (idempotently: one already
    /// committed stays so). One the system no longer holds was rolled back: its output is lost.
    fn commit_prepared(&mut self, sink: usize, txn: Txn) {
        if let Some(out) = self.prepared.remove(&(sink, txn)) {
            self.external.insert((sink, txn), out);
        } else if self.external.contains_key(&(sink, txn)) {
            self.count("repeated commits of a committed transaction");
        } else {
            self.violate(format!(
                "sink {sink} commits transaction {txn:?}, which the external system rolled back"
            ));
        }
    }

    /// A sink subtask starts (fresh or restored): it commits the restored checkpoint's
    /// pre-committed transactions and rolls back its other prepared ones (those of later
    /// checkpoints, which never completed, or of a crashed attempt), as the PostgreSQL and
    /// Kafka sinks do in `Sink::initialize`.
    fn restore_sink(&mut self, sink: usize, pending: Vec<(Txn, Vec<(u64, u64)>)>) {
        let planted = self.cfg.planted;
        let roll_back = |prepared: &mut BTreeMap<(usize, Txn), _>| {
            prepared.retain(|&(s, _), _| s != sink);
        };
        if planted == Some(Planted::RollsBackBeforeCommit) {
            roll_back(&mut self.prepared);
        }
        for (txn, _) in pending {
            if self.prepared.contains_key(&(sink, txn)) {
                // The checkpoint completed but the commit never happened (the process died
                // in between, or before it learnt of the completion).
                self.count("restores that committed a prepared transaction");
            }
            self.commit_prepared(sink, txn);
        }
        let lingering = self.prepared.keys().filter(|(s, _)| *s == sink).count();
        if lingering > 0 {
            self.count("restores that rolled back prepared transactions");
            if planted != Some(Planted::LeavesPreparedTransactions) {
                roll_back(&mut self.prepared);
            }
        }
    }

    fn state_of(&mut self, task: usize, id: u64) -> State {
        let commit_now = self.cfg.planted == Some(Planted::CommitAtPreCommit);
        let txn = (id, self.tasks[task].attempt);
        match &mut self.tasks[task].body {
            Body::Source { pos, drained, .. } => State::Source(*pos, *drained),
            Body::Counter {
                windows, timers, ..
            } => {
                // Sorted: the real queue is a hash set, the simulation must replay exactly.
                let mut timers = timers.event.entries();
                timers.sort_unstable();
                // The counts are frozen (`Snap::frozen`) and read at the upload.
                State::Counter(BTreeMap::new(), windows.clone(), timers)
            }
            Body::Sink {
                current,
                pre_committed,
            } => {
                let out = std::mem::take(current);
                if commit_now {
                    self.external.insert((task, txn), out);
                } else if !out.is_empty() {
                    self.prepared.insert((task, txn), out.clone());
                    pre_committed.push((txn, out));
                }
                State::Sink(pre_committed.clone())
            }
        }
    }

    fn act(&mut self, task: usize, action: GateAction) {
        let attempt = self.tasks[task].attempt;
        self.note(|| format!("task {task}: {action:?}"));
        match action {
            GateAction::Snapshot {
                barrier, unaligned, ..
            } => {
                if barrier.aligned_only && unaligned {
                    self.violate(format!(
                        "task {task} took the final checkpoint {} unaligned",
                        barrier.id
                    ));
                }
                self.count(if unaligned {
                    "unaligned snapshots"
                } else {
                    "aligned snapshots"
                });
                let disk = self.disk_snapshot(task, barrier.id, barrier.savepoint);
                let frozen = match &mut self.tasks[task].body {
                    Body::Counter { counts, .. } => Some(counts.freeze()),
                    _ => None,
                };
                let snap = Snap {
                    frozen,
                    state: self.state_of(task, barrier.id),
                    channels: Vec::new(),
                    disk,
                };
                if unaligned {
                    self.tasks[task].held = Some((barrier.id, snap));
                } else {
                    self.uploads.push_back((attempt, task, barrier.id, snap));
                }
            }
            GateAction::Forward { barrier, unaligned } => self.forward(task, barrier, unaligned),
            GateAction::ChannelState { id, channels, .. } => match self.tasks[task].held.take() {
                Some((held, mut snap)) if held == id => {
                    if !channels.is_empty() {
                        self.count("non-empty channel states");
                    }
                    snap.channels = channels;
                    self.uploads.push_back((attempt, task, id, snap));
                }
                other => self.tasks[task].held = other,
            },
            GateAction::Discard { id } => {
                if self.tasks[task].held.as_ref().is_some_and(|h| h.0 == id) {
                    self.tasks[task].held = None;
                }
                self.tasks[task].lsm.decided.remove(&id);
            }
            GateAction::Decline { id, cause } => {
                if self.tasks[task].held.as_ref().is_some_and(|h| h.0 == id) {
                    self.tasks[task].held = None;
                }
                let cause = match cause {
                    DeclineCause::Subsumed => {
                        self.count("subsumed declines");
                        if self.cfg.planted == Some(Planted::SubsumedAsFailed) {
                            DeclineCause::Failed("planted".into())
                        } else {
                            DeclineCause::Subsumed
                        }
                    }
                    failed => failed,
                };
                self.events.push_back(JobEvent::Decline {
                    checkpoint_id: id,
                    attempt,
                    cause,
                });
            }
            GateAction::NotifyComplete { id } => {
                let lsm = &mut self.tasks[task].lsm;
                if let Some(files) = lsm.decided.remove(&id) {
                    lsm.confirmed = files;
                }
                lsm.decided.retain(|&k, _| k > id);
                if let Body::Sink { pre_committed, .. } = &mut self.tasks[task].body {
                    let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(pre_committed)
                        .into_iter()
                        .partition(|(t, _)| t.0 <= id);
                    *pre_committed = keep;
                    for (txn, _) in done {
                        self.commit_prepared(task, txn);
                    }
                }
            }
            GateAction::FailAbortedAtEnd { .. } => self.fail_task(task),
        }
    }

    fn act_all(&mut self, task: usize, actions: impl IntoIterator<Item = GateAction>) {
        for a in actions {
            self.act(task, a);
        }
    }

    /// The task fails; now and then in a way no restart can fix (restored state the job cannot
    /// read), which must end the job at once.
    fn fail_task(&mut self, task: usize) {
        let error = if self.rng.u32(0..4) == 0 {
            TaskError::Unrecoverable("simulated unreadable state".into())
        } else {
            TaskError::msg("simulated task failure")
        };
        self.fail_with(task, error);
    }

    /// The task fails with a cause a restart fixes.
    fn fail_recoverably(&mut self, task: usize, cause: &str) {
        self.fail_with(task, TaskError::msg(cause));
    }

    fn fail_with(&mut self, task: usize, error: TaskError) {
        let t = &mut self.tasks[task];
        if !t.failed {
            t.failed = true;
            let attempt = t.attempt;
            self.events.push_back(JobEvent::Exited {
                attempt,
                task,
                result: Err(error),
            });
        }
    }

    /// A source at a stop-with-savepoint barrier: it reads nothing more after it, and with
    /// `drain` sends the maximum watermark in front of it.
    fn stop_source(&mut self, t: usize, id: u64, drain: bool) {
        let Body::Source {
            stopped,
            drained,
            exhausted,
            ..
        } = &mut self.tasks[t].body
        else {
            return;
        };
        *stopped = Some(id);
        *drained = drain;
        if drain && !*exhausted {
            self.send_watermark(t, i64::MAX);
        }
    }

    fn maybe_exit(&mut self, task: usize) {
        let t = &mut self.tasks[task];
        let idle = t.outbox.is_empty();
        if t.ended && idle && !t.exited && !t.failed && !t.gone && t.gate.may_exit() {
            t.exited = true;
            let attempt = t.attempt;
            self.events.push_back(JobEvent::Exited {
                attempt,
                task,
                result: Ok(()),
            });
        }
    }

    /// The asynchronous part of a counter's snapshot: reads its frozen counts into its state.
    fn read_frozen(&mut self, task: usize, snap: &mut Snap) {
        let Some(frozen) = snap.frozen.take() else {
            return;
        };
        let mut counts = BTreeMap::new();
        let live_now = match &self.tasks[task].body {
            Body::Counter { counts: live, .. }
                if self.cfg.planted == Some(Planted::SnapshotReadsLive) =>
            {
                Some(live.copy_view())
            }
            _ => None,
        };
        live_now.as_ref().unwrap_or(&frozen).for_each(|k, n| {
            counts.insert(*k, *n);
        });
        if let State::Counter(c, ..) = &mut snap.state {
            *c = counts;
        }
    }

    /// The operator of `task` processes a batch of records.
    fn apply(&mut self, task: usize, batch: Box<dyn Any + Send>) {
        if is_counter(task) {
            let Ok(records) = batch.downcast::<Vec<(u64, u64)>>() else {
                return self.violate(format!("counter {task} got a batch of another type"));
            };
            let Body::Counter {
                counts,
                windows,
                timers,
                valve,
                ..
            } = &mut self.tasks[task].body
            else {
                return;
            };
            // As the heap backend's table at an access: folded back once no snapshot reads it.
            let mut written_frozen = false;
            if counts.is_frozen() {
                for &(k, _) in records.iter() {
                    counts.settle_for(&k);
                }
                written_frozen = counts.is_frozen();
            }
            let mut late = None;
            let out: Vec<(u64, u64)> = records
                .iter()
                .map(|&(k, ts)| {
                    let c = counts.get_or_insert_with(&k, || 0);
                    *c += 1;
                    if ts as i64 <= valve.current() {
                        late = Some((k, ts, valve.current()));
                    }
                    // A window per WINDOW positions; its timer at its last position.
                    let w = ts / WINDOW;
                    *windows.entry((k, w)).or_insert(0) += 1;
                    timers.event.register(&k, (w * WINDOW + WINDOW - 1) as i64);
                    (k, *c)
                })
                .collect();
            if written_frozen {
                self.count("batches written under a frozen snapshot");
            }
            if let Some((k, ts, wm)) = late {
                self.count("late records");
                self.note(|| format!("counter {task}: key {k} at {ts} behind watermark {wm}"));
            }
            for record in out {
                self.emit(task, 0, record);
            }
        } else if let Ok(recs) = batch.downcast::<Vec<(u64, u64)>>() {
            if let Body::Sink { current, .. } = &mut self.tasks[task].body {
                current.extend(recs.iter());
            }
        } else {
            self.violate(format!("sink {task} got a batch of another type"));
        }
    }

    fn encode_batch(_task: usize, batch: &(dyn Any + Send)) -> Vec<u8> {
        batch
            .downcast_ref::<Vec<(u64, u64)>>()
            .map(encode)
            .unwrap_or_default()
    }

    fn decode_batch(_task: usize, bytes: &[u8]) -> Option<Box<dyn Any + Send>> {
        postcard::from_bytes::<Vec<(u64, u64)>>(bytes)
            .ok()
            .map(|v| Box::new(v) as Box<dyn Any + Send>)
    }

    /// A counter's input `input` delivered watermark `t`: fire the windows it completes.
    fn on_watermark(&mut self, task: usize, input: usize, t: i64) {
        let planted_max = self.cfg.planted == Some(Planted::WatermarkMax);
        let Body::Counter {
            windows,
            timers,
            valve,
            seen,
            ..
        } = &mut self.tasks[task].body
        else {
            return self.violate(format!("task {task} got a watermark"));
        };
        let advanced = match valve.on_watermark(input, t) {
            Some(WatermarkOutput::Watermark(w)) => Some(w),
            _ => None,
        };
        seen[input] = seen[input].max(t);
        let upto = if planted_max {
            seen.iter().copied().max()
        } else {
            advanced
        };
        let Some(upto) = upto else { return };
        let mut fired = Vec::new();
        while let Some((time, k)) = timers.event.pop_due(upto) {
            let w = time as u64 / WINDOW;
            let n = windows.remove(&(k, w)).unwrap_or(0);
            fired.push((WINDOWED | k << 32 | w, n));
        }
        for record in fired {
            self.count("windows fired");
            self.emit(task, 0, record);
        }
    }

    /// `task` processes an element of input `input` that the gate let through.
    fn process(&mut self, task: usize, input: usize, element: Element) {
        let now = self.now();
        self.note(|| match &element {
            Element::Batch(b) => format!("task {task} input {input}: batch {}", describe(&**b)),
            Element::Barrier(b) => format!("task {task} input {input}: barrier {}", b.id),
            Element::EndOfStream => format!("task {task} input {input}: end of stream"),
            Element::Encoded(_) => format!("task {task} input {input}: encoded"),
            Element::Watermark(t) => format!("task {task} input {input}: watermark {t}"),
            Element::Idle => format!("task {task} input {input}: idle"),
        });
        match element {
            Element::Batch(batch) => {
                if self.tasks[task].gate.is_blocked(input) {
                    self.violate(format!("task {task} read blocked input {input}"));
                }
                let ch = self.inputs[task][input];
                self.channels[ch].outstanding -= 1;
                self.channels[ch].available += 1;
                let recorded = self.tasks[task]
                    .gate
                    .before_batch(input)
                    .then(|| Self::encode_batch(task, &*batch));
                self.apply(task, batch);
                if let Some(a) = self.tasks[task].gate.after_batch(input, recorded) {
                    self.act(task, a);
                }
            }
            Element::Barrier(b) => {
                let actions = self.tasks[task].gate.on_barrier(input, b, now);
                self.act_all(task, actions);
            }
            Element::EndOfStream => {
                let actions = self.tasks[task].gate.on_end_of_stream(input, now);
                self.act_all(task, actions);
                if self.tasks[task].gate.all_ended() {
                    self.end_stream(task);
                }
            }
            Element::Encoded(_) => self.violate(format!("task {task} got an encoded batch")),
            Element::Watermark(t) => self.on_watermark(task, input, t),
            Element::Idle => self.violate(format!("task {task} got idleness: sources make none")),
        }
        let parked = self.tasks[task].gate.parked();
        if parked > self.inputs[task].len() * (CREDITS_MAX as usize + 6) {
            self.violate(format!("task {task} parks {parked} elements"));
        }
    }

    /// The task runs (it may be blocked on credit).
    fn alive(&self, task: usize) -> bool {
        let t = &self.tasks[task];
        !t.failed && !t.exited && !t.gone
    }

    /// The task runs and is not blocked on credit: it may take input, mail and timers.
    fn runnable(&self, task: usize) -> bool {
        self.alive(task) && self.tasks[task].outbox.is_empty()
    }

    fn choices(&mut self, out: &mut Vec<Choice>) {
        out.clear();
        out.push(Choice::Tick);
        for t in 0..TASKS {
            if !self.alive(t) {
                continue;
            }
            let task = &self.tasks[t];
            if !task.outbox.is_empty() {
                // Blocked in a send: the task thread waits for credit and does nothing else.
                if self.may_unblock(t) {
                    out.push(Choice::Send(t));
                }
                continue;
            }
            if !task.replay.is_empty() {
                out.push(Choice::Replay(t));
                continue;
            }
            if !task.control.is_empty() {
                out.push(Choice::Control(t));
            }
            if task.partial.iter().any(|p| !p.is_empty()) {
                out.push(Choice::Flush(t));
            }
            if let Body::Source {
                exhausted: false,
                stopped: None,
                ..
            } = task.body
            {
                out.push(Choice::Poll(t));
            }
            if is_source(t) {
                continue;
            }
            if task.gate.pending_unaligned().is_some() {
                out.push(Choice::Capture(t));
            }
            if task.gate.promotes() {
                out.push(Choice::Promote(t));
            }
            let ready = task.gate.ready_parked();
            if ready {
                out.push(Choice::Parked(t));
            }
            for &ch in &self.inputs[t] {
                let q = &self.channels[ch].queue;
                if q.iter().any(|i| matches!(i, Item::Priority(..))) {
                    out.push(Choice::Priority(ch));
                }
                // Parked elements go before new mail.
                if !ready && matches!(q.front(), Some(Item::Data(_))) {
                    out.push(Choice::Data(ch));
                }
            }
        }
        if !self.uploads.is_empty() {
            out.push(Choice::Upload);
        }
        if !self.events.is_empty() {
            out.push(Choice::Master);
        }
        // The executor takes its time (slots, workers' answers): failures land meanwhile.
        if self.deployment.is_some() && self.rng.u32(0..8) == 0 {
            out.push(Choice::Deployment);
        }
        if !self.storage_tasks.is_empty() {
            out.push(Choice::Storage);
        }
        if !self.deposed.is_empty() {
            out.push(Choice::Deposed);
        }
    }

    /// A fault, if one is due: a task fails, a worker hosting some tasks is lost, or the
    /// process crashes.
    fn fault(&mut self) -> Option<Choice> {
        // Faults are likelier while a deployment waits, where they must abandon it.
        let odds = if self.deployment.is_some() { 30 } else { 150 };
        if self.failure_budget == 0 || self.rng.u32(0..odds) != 0 {
            return None;
        }
        self.failure_budget -= 1;
        Some(match self.rng.u32(0..4) {
            0 => Choice::Crash,
            1 => Choice::FailTask(self.rng.usize(0..TASKS)),
            2 => Choice::LeaderChange,
            _ => Choice::LoseWorker(self.rng.u32(1..(1 << TASKS))),
        })
    }

    /// A user's savepoint request, now and then.
    fn savepoint_choice(&mut self) -> Option<Choice> {
        if self.savepoints_left == 0 || self.rng.u32(0..120) != 0 {
            return None;
        }
        self.savepoints_left -= 1;
        Some(Choice::Savepoint(match self.rng.u32(0..6) {
            0 | 1 => SavepointKind::Stop,
            2 => SavepointKind::StopAndDrain,
            _ => SavepointKind::Intermediate,
        }))
    }

    pub(crate) fn run(mut self) -> Outcome {
        let mut choices = Vec::new();
        let mut steps = 0;
        while !self.finished && self.violation.is_none() {
            if steps == STEPS_MAX {
                self.violate(format!("the job did not finish within {STEPS_MAX} steps"));
                break;
            }
            steps += 1;
            let c = match self.fault().or_else(|| self.savepoint_choice()) {
                Some(c) => c,
                None => {
                    self.choices(&mut choices);
                    choices[self.rng.usize(0..choices.len())]
                }
            };
            if self.cfg.trace {
                self.trace
                    .push(format!("{steps} t={}ms {c:?}", self.now_ms));
            }
            self.step(c);
        }
        if self.violation.is_none() {
            self.check_output();
        }
        if self.violation.is_none() {
            self.check_shared_files();
        }
        Outcome {
            steps,
            restarts: self.process_restarts + self.master.restart_count(),
            completed: self.completed,
            violation: self.violation,
            trace: self.trace,
            stats: self.stats,
        }
    }

    fn step(&mut self, c: Choice) {
        let now = self.now();
        match c {
            Choice::Tick => self.tick(),
            Choice::Poll(s) => self.poll(s),
            Choice::Replay(t) => {
                if let Some(bytes) = self.tasks[t].replay.pop_front() {
                    self.count("replayed in-flight batches");
                    match Self::decode_batch(t, &bytes) {
                        Some(b) => self.apply(t, b),
                        None => self.violate(format!("task {t} cannot decode its channel state")),
                    }
                }
            }
            Choice::Control(t) => {
                if let Some(c) = self.tasks[t].control.pop_front() {
                    self.control(t, c);
                }
            }
            Choice::Data(ch) => {
                let (to, input) = (self.channels[ch].to, self.channels[ch].input);
                if let Some(Item::Data(e)) = self.channels[ch].queue.pop_front() {
                    if let Some(e) = self.tasks[to].gate.accept(input, e) {
                        self.process(to, input, e);
                    }
                }
            }
            Choice::Parked(t) => {
                if let Some((input, e)) = self.tasks[t].gate.next_parked() {
                    self.process(t, input, e);
                }
            }
            Choice::Priority(ch) => self.priority(ch),
            Choice::Promote(t) => self.promote(t),
            Choice::Capture(t) => self.capture(t),
            Choice::Flush(t) => {
                self.count("idle flushes");
                for out in 0..self.outputs[t].len() {
                    self.flush_partial(t, out, FlushCredit::Wait);
                }
            }
            Choice::Send(t) => {
                if let Some((ch, out)) = self.tasks[t].outbox.pop_front() {
                    self.count("sends that waited for credit");
                    self.put(ch, out);
                }
            }
            Choice::Upload => {
                if let Some((attempt, task, id, mut snap)) = self.uploads.pop_front() {
                    self.read_frozen(task, &mut snap);
                    let path = format!("{}/task-{task}", checkpoint_dir(JOB, id));
                    for (_, shared, new) in &snap.disk {
                        if *new {
                            if let Err(e) = self.storage.write(shared, b"sst") {
                                return self.violate(format!("upload failed: {e}"));
                            }
                            self.count("shared files uploaded");
                        } else {
                            self.count("shared files referenced again");
                        }
                    }
                    if let Err(e) = self.storage.write(&path, b"state") {
                        return self.violate(format!("upload failed: {e}"));
                    }
                    let shared_files: Vec<String> =
                        snap.disk.iter().map(|(_, p, _)| p.clone()).collect();
                    self.files.insert((id, task), snap);
                    self.events.push_back(JobEvent::Ack(TaskAck {
                        checkpoint_id: id,
                        task_index: task,
                        attempt,
                        file: Some(format!("task-{task}")),
                        operators: vec![OperatorStates {
                            uid: uid(task),
                            states: Vec::new(),
                        }],
                        stats: TaskCheckpointStats::default(),
                        shared_files,
                    }));
                }
            }
            Choice::Master => self.master(),
            Choice::FailTask(t) => {
                if self.alive(t) {
                    self.count("task failures");
                    self.fail_task(t)
                }
            }
            Choice::LoseWorker(hosted) => self.lose_worker(hosted),
            Choice::Crash => self.new_process("crashes"),
            Choice::LeaderChange => self.leader_change(),
            Choice::Deposed => self.deposed_store(),
            Choice::Savepoint(kind) => self.request_savepoint(kind),
            Choice::Storage => self.store(),
            Choice::Deployment => {
                if let Some((regions, from, stopped)) = self.deployment.take() {
                    self.deploy(&regions, from, stopped);
                    self.perform();
                }
            }
        }
        for t in 0..TASKS {
            if self.tasks[t].gate.deadline().is_some_and(|d| d <= now.at) && self.runnable(t) {
                let actions = self.tasks[t].gate.on_timer(now);
                self.act_all(t, actions);
            }
            self.maybe_exit(t);
        }
    }

    /// The worker hosting the tasks in bit set `hosted` died with them.
    fn lose_worker(&mut self, hosted: u32) {
        let mut attempts = Vec::new();
        for t in (0..TASKS).filter(|t| hosted & (1 << t) != 0) {
            let task = &mut self.tasks[t];
            if !task.gone {
                task.gone = true;
                if !attempts.contains(&task.attempt) {
                    attempts.push(task.attempt);
                }
            }
        }
        if attempts.is_empty() {
            return;
        }
        self.count("lost workers");
        if attempts.len() > 1 {
            self.count("lost workers hosting several attempts");
        }
        // Now and then the worker left on purpose (drained): the restart spends no budget.
        let planned = self.rng.u32(0..4) == 0;
        if planned {
            self.count("workers that left on purpose");
        }
        self.events.push_back(JobEvent::Lost {
            attempts,
            reason: "simulated worker loss".into(),
            planned,
        });
    }

    /// The storage thread runs its next task; the process may die during a `_metadata` write.
    fn store(&mut self) {
        let Some(task) = self.storage_tasks.pop_front() else {
            return;
        };
        if task.is_finalize() && self.failure_budget > 0 && self.rng.u32(0..30) == 0 {
            self.failure_budget -= 1;
            self.storage.arm_metadata_crash();
        }
        self.note(|| format!("storage: {task:?}"));
        let finalized = task.run();
        if self.storage.crashed() {
            return self.new_process("crashes during a _metadata write");
        }
        if let Some(f) = finalized {
            self.events.push_back(JobEvent::Finalized(f));
        }
    }

    /// Runs the storage work left, as an ending job master does (results go nowhere).
    fn finish_storage(&mut self) {
        while let Some(task) = self.storage_tasks.pop_front() {
            let _ = task.run();
        }
    }

    fn tick(&mut self) {
        self.now_ms += self.rng.u64(1..=3);
        let at = self.now().at;
        self.master.poll(at);
        self.perform();
    }

    fn poll(&mut self, s: usize) {
        if let Body::Source {
            announce,
            exhausted,
            ..
        } = &mut self.tasks[s].body
        {
            if std::mem::take(announce) {
                // Restored after a drain: event time ended, so its input did.
                *exhausted = true;
                self.count("sources restored drained");
                self.end_source_input(s);
                return;
            }
        }
        let n = self.rng.usize(1..=3);
        let Body::Source {
            keys,
            pos,
            exhausted,
            ..
        } = &mut self.tasks[s].body
        else {
            return;
        };
        let start = *pos;
        let end = (*pos + n).min(keys.len());
        let read: Vec<u64> = keys[*pos..end].to_vec();
        *pos = end;
        let now_exhausted = end == keys.len();
        *exhausted = now_exhausted;
        for (i, k) in read.into_iter().enumerate() {
            let counter = (k % COUNTERS as u64) as usize;
            let out = match self.topology {
                Topology::Shuffle => counter,
                Topology::Forward => 0,
            };
            // Event time: the record's position in its source.
            self.emit(s, out, (k, (start + i) as u64));
        }
        // Watermarks now and then, and the maximum one at the end (before the final
        // checkpoint, as a real source does).
        if now_exhausted {
            self.end_source_input(s);
        } else if end > 0 && self.rng.bool() {
            self.send_watermark(s, end as i64 - 1);
        }
    }

    fn control(&mut self, t: usize, c: Control) {
        match c {
            Control::Trigger(b, kind) => {
                let late_drain = self.cfg.planted == Some(Planted::DrainAfterBarrier);
                if let BarrierKind::Stop { drain } = kind {
                    self.stop_source(t, b.id, drain && !late_drain);
                }
                let actions = self.tasks[t].gate.on_trigger(b, kind);
                self.act_all(t, actions);
                if late_drain && kind == (BarrierKind::Stop { drain: true }) {
                    self.stop_source(t, b.id, true);
                }
            }
            Control::Complete(id) => {
                let a = self.tasks[t].gate.on_complete(id);
                self.act(t, a);
            }
            Control::Aborted(id) => {
                let actions = self.tasks[t].gate.on_abort(id);
                self.act_all(t, actions);
                let mut failed = false;
                if let Body::Source {
                    stopped, drained, ..
                } = &mut self.tasks[t].body
                {
                    if *stopped == Some(id) {
                        *stopped = None;
                        // Event time cannot go back: the source fails, and the job restarts
                        // from its last checkpoint (as the real source task does).
                        failed = std::mem::take(drained);
                    }
                }
                if failed {
                    self.count("drained stops aborted");
                    self.fail_recoverably(t, "a drained stop-with-savepoint was aborted");
                }
            }
            Control::EndOfInput => {
                if is_source(t) {
                    self.tasks[t].gate.end_input();
                    self.end_stream(t);
                }
            }
        }
    }

    fn priority(&mut self, ch: usize) {
        let (to, input) = (self.channels[ch].to, self.channels[ch].input);
        let q = &mut self.channels[ch].queue;
        let Some(i) = q.iter().position(|i| matches!(i, Item::Priority(..))) else {
            return;
        };
        if let Some(Item::Priority(b, before)) = q.remove(i) {
            let now = self.now();
            let actions = self.tasks[to]
                .gate
                .on_priority_barrier(input, b, before, now);
            self.act_all(to, actions);
        }
    }

    /// The data mail queued for `task`, in an order the real mailbox could have: channel by
    /// channel. Returns (channel, position in its queue) per entry.
    fn queued(&self, task: usize) -> Vec<(usize, usize)> {
        let mut at = Vec::new();
        for &ch in &self.inputs[task] {
            for (i, item) in self.channels[ch].queue.iter().enumerate() {
                if matches!(item, Item::Data(_)) {
                    at.push((ch, i));
                }
            }
        }
        at
    }

    fn element(&self, at: (usize, usize)) -> Option<(usize, &Element)> {
        match self.channels[at.0].queue.get(at.1) {
            Some(Item::Data(e)) => Some((self.channels[at.0].input, e)),
            _ => None,
        }
    }

    fn promote(&mut self, t: usize) {
        let at = self.queued(t);
        let now = self.now();
        let found = self.tasks[t]
            .gate
            .promotion(at.iter().map(|&a| self.element(a)), now);
        if let Some((i, input, barrier, before)) = found {
            self.count("promoted barriers");
            let (ch, qi) = at[i];
            self.channels[ch].queue.remove(qi);
            let actions = self.tasks[t]
                .gate
                .on_priority_barrier(input, barrier, before, now);
            self.act_all(t, actions);
        }
    }

    fn capture(&mut self, t: usize) {
        // A queued batch may have been sent after its channel's priority barrier: take
        // priority mail first, as the task does.
        for ch in self.inputs[t].clone() {
            while self.channels[ch]
                .queue
                .iter()
                .any(|i| matches!(i, Item::Priority(..)))
            {
                self.priority(ch);
            }
        }
        let parked = self.tasks[t]
            .gate
            .capture_parked(|_, element| match element {
                Element::Batch(b) => Ok::<_, ()>(Some(Self::encode_batch(t, &**b))),
                _ => Ok(None),
            });
        if parked.is_err() {
            return self.violate(format!("task {t} cannot record its parked batches"));
        }
        let at = self.queued(t);
        let mut plan = Vec::new();
        self.tasks[t]
            .gate
            .plan_capture(at.iter().map(|&a| self.element(a)), &mut plan);
        for (i, input, seq) in plan {
            let bytes = match self.element(at[i]) {
                Some((_, Element::Batch(b))) => Self::encode_batch(t, &**b),
                _ => continue,
            };
            self.tasks[t].gate.capture(input, seq, bytes);
            self.count("batches captured while queued");
        }
        if let Some(a) = self.tasks[t].gate.check_channel_state() {
            self.act(t, a);
        }
    }

    /// The job master handles its next event.
    fn master(&mut self) {
        let Some(e) = self.events.pop_front() else {
            return;
        };
        let newest = |w: &World| {
            w.master
                .coordinator()
                .and_then(|c| c.completed().last())
                .map(|c| c.id)
        };
        let before = newest(self);
        let at = self.now().at;
        let unrecoverable = match &e {
            JobEvent::Exited {
                attempt,
                task,
                result: Err(TaskError::Unrecoverable(_)),
            } => self.master.is_current(*task, *attempt) && self.master.outcome().is_none(),
            _ => false,
        };
        let restarts = self.master.restart_count();
        self.master.on_event(e, at);
        if unrecoverable {
            self.count("unrecoverable task failures");
            let failed = matches!(self.master.outcome(), Some(JobOutcome::Failed { .. }));
            if !failed || self.master.restart_count() != restarts {
                return self
                    .violate("an unrecoverable task failure did not end the job at once".into());
            }
        }
        if newest(self) > before {
            self.completed += 1;
        }
        self.master.poll(at);
        self.perform();
    }

    /// Every window of every key fired with its exact count: exactly once, or (at least once:
    /// replayed records may fire a window again, with part of its records) at least once with
    /// all of them.
    fn check_windows(&self, mut fired: BTreeMap<u64, Vec<u64>>) -> Option<String> {
        let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
        for keys in &self.input {
            for (i, &k) in keys.iter().enumerate() {
                *expected
                    .entry(WINDOWED | k << 32 | (i as u64 / WINDOW))
                    .or_insert(0) += 1;
            }
        }
        for (w, n) in expected {
            let got = fired.remove(&w).unwrap_or_default();
            let (key, window) = ((w & !WINDOWED) >> 32, w & 0xffff_ffff);
            let ok = if self.cfg.mode == Mode::AtLeastOnce {
                got.iter().any(|&c| c >= n)
            } else {
                got == [n]
            };
            if !ok {
                return Some(format!(
                    "window {window} of key {key} holds {n} records, committed results {got:?}"
                ));
            }
        }
        // At least once, a checkpoint's state may hold records read after its barrier; when a
        // drained stop ended the input at that checkpoint, their windows fire though the
        // sources never read them again.
        let read_later = |w: &u64| {
            let (key, window) = ((w & !WINDOWED) >> 32, w & 0xffff_ffff);
            self.cfg.mode == Mode::AtLeastOnce
                && self.generated.iter().any(|keys| {
                    keys.iter()
                        .enumerate()
                        .any(|(i, &k)| k == key && i as u64 / WINDOW == window)
                })
        };
        fired.keys().find(|w| !read_later(w)).map(|w| {
            let (key, window) = ((w & !WINDOWED) >> 32, w & 0xffff_ffff);
            format!("a result committed for window {window} of key {key}, which has no records")
        })
    }

    /// The update-sequence property on what the sinks committed, and nothing left
    /// uncommitted when the job finished.
    fn check_output(&mut self) {
        for t in 0..TASKS {
            if let Body::Sink {
                current,
                pre_committed,
            } = &self.tasks[t].body
            {
                if !pre_committed.is_empty() || !current.is_empty() {
                    let (p, c) = (pre_committed.len(), current.len());
                    return self.violate(format!(
                        "the job finished while sink {t} held {p} pre-committed transaction(s) and {c} uncommitted record(s)"
                    ));
                }
            }
        }
        if let Some(((sink, txn), _)) = self.prepared.iter().next() {
            let (sink, txn, n) = (*sink, *txn, self.prepared.len());
            return self.violate(format!(
                "the job finished with {n} prepared transaction(s) left in the external system, e.g. sink {sink}'s {txn:?}"
            ));
        }
        let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
        for keys in &self.input {
            for &k in keys {
                *expected.entry(k).or_insert(0) += 1;
            }
        }
        let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        let mut fired: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for out in self.external.values() {
            for &(k, c) in out {
                if k & WINDOWED != 0 {
                    fired.entry(k).or_default().push(c);
                } else {
                    seen.entry(k).or_default().push(c);
                }
            }
        }
        if let Some(v) = self.check_windows(fired) {
            return self.violate(v);
        }
        for (k, n) in expected {
            let mut counts = seen.remove(&k).unwrap_or_default();
            counts.sort_unstable();
            let ok = if self.cfg.mode == Mode::AtLeastOnce {
                (1..=n).all(|c| counts.binary_search(&c).is_ok())
            } else {
                counts == (1..=n).collect::<Vec<_>>()
            };
            if !ok {
                return self.violate(format!(
                    "key {k} seen {n} times, committed counts {counts:?}"
                ));
            }
        }
        // At least once, a checkpoint's state may hold records read after its sources'
        // positions; a drained stop restored from such a state ends the input at those
        // positions, after records whose effect the state already holds.
        if self.cfg.mode == Mode::AtLeastOnce {
            let generated: BTreeSet<u64> = self.generated.iter().flatten().copied().collect();
            seen.retain(|k, _| !generated.contains(k));
        }
        if let Some(k) = seen.keys().next() {
            let k = *k;
            self.violate(format!(
                "committed output for key {k} that no source produced"
            ));
        }
    }
}
