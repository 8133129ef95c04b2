//! The simulated job: sources → (by key) counters → (forward) two-phase-commit sinks, the
//! channels between them, the uploader, the checkpoint coordinator and the job master, all
//! stepped one event at a time by a seeded scheduler.
//!
//! What is real: the barrier handler ([`InputGate`]) of every task, exactly as the task threads
//! drive it. What is modelled: the operators (a replayable source of keys, a keyed counter, a
//! sink whose transactions are pre-committed at the barrier and committed when the checkpoint
//! completes), the channels (per-channel FIFO, credits, priority barriers that overtake data),
//! the control path (trigger, complete, abort, end of input — another path than data, so any
//! interleaving with data is possible; completions may be lost), the uploader, and the external
//! system the sinks commit to, which survives everything. The checkpoint coordinator is the real
//! one, on the real storage trait (in memory, able to die during a `_metadata` write); a crash
//! replaces it with a new one, as a new process would.

use std::any::Any;
use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::storage::FaultyStorage;
use crate::checkpoint::coordinator::{
    CheckpointCoordinator, CheckpointSettings, TaskInfo, TaskMessage,
};
use crate::checkpoint::{DeclineCause, TaskAck, TaskCheckpointStats};
use crate::runtime::channel::{Barrier, BarrierKind, Element};
use crate::runtime::gate::{AlignmentMode, Flaw, GateAction, InputGate, Now};
use crate::storage::layout::{checkpoint_dir, metadata_path};
use crate::storage::CheckpointStorage;

/// Source subtasks.
pub(crate) const SOURCES: usize = 2;
/// Counter subtasks, each followed by one sink subtask.
pub(crate) const COUNTERS: usize = 2;
const TASKS: usize = SOURCES + 2 * COUNTERS;
/// Batches a channel may have queued at its receiver (processed batches return their credit).
const CREDITS_MAX: usize = 2;
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

/// A deliberately planted bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Planted {
    /// In the barrier handler.
    Handler(Flaw),
    /// The sink commits its transaction at pre-commit instead of on completion.
    CommitAtPreCommit,
    /// A subsumed checkpoint is reported as failed (defect 3.7: the job then fails once more
    /// declines than `tolerable-failed-checkpoints` pile up).
    SubsumedAsFailed,
}

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
    /// Read position.
    Source(usize),
    /// Count per key.
    Counter(BTreeMap<u64, u64>),
    /// Pre-committed, not yet committed transactions: (transaction, output).
    Sink(Vec<(Txn, Vec<(u64, u64)>)>),
}

/// One task's part of a checkpoint.
#[derive(Debug, Clone)]
pub(crate) struct Snap {
    state: State,
    /// In-flight batches per input channel (unaligned), serialized.
    channels: Vec<(usize, Vec<Vec<u8>>)>,
}

/// A sink transaction: the checkpoint that pre-committed it and the attempt (a crashed
/// coordinator's successor may reuse the id of a checkpoint that left no file).
type Txn = (u64, u32);

enum Body {
    Source {
        keys: Vec<u64>,
        pos: usize,
        exhausted: bool,
        end_of_input: bool,
    },
    Counter {
        counts: BTreeMap<u64, u64>,
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

struct Task {
    body: Body,
    gate: InputGate,
    held: Option<(u64, Snap)>,
    control: VecDeque<Control>,
    /// Restored in-flight batches, processed before any other input.
    replay: VecDeque<Vec<u8>>,
    /// Every input ended and end of stream went out.
    ended: bool,
    failed: bool,
    exited: bool,
}

enum Item {
    Data(Element),
    /// An unaligned barrier and the number of batches sent before it on the channel.
    Priority(Barrier, u64),
}

struct Channel {
    to: usize,
    input: usize,
    queue: VecDeque<Item>,
    /// Batches sent and not yet processed (credits taken).
    outstanding: usize,
    sent: u64,
    last_barrier: u64,
}

/// What the job master receives.
enum Event {
    Ack {
        attempt: u32,
        task: usize,
        id: u64,
    },
    Decline {
        attempt: u32,
        id: u64,
        cause: DeclineCause,
    },
    Exhausted {
        attempt: u32,
        task: usize,
    },
    Exited {
        attempt: u32,
    },
    Failed {
        attempt: u32,
    },
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
    Upload,
    Master,
    Tick,
    FailTask(usize),
    Crash,
}

pub(crate) struct World {
    cfg: Config,
    rng: fastrand::Rng,
    base: Instant,
    now_ms: u64,
    attempt: u32,
    tasks: Vec<Task>,
    channels: Vec<Channel>,
    outputs: Vec<Vec<usize>>,
    inputs: Vec<Vec<usize>>,
    input: Vec<Vec<u64>>,
    uploads: VecDeque<(u32, usize, u64, Snap)>,
    events: VecDeque<Event>,
    settings: CheckpointSettings,
    coordinator: CheckpointCoordinator,
    /// Survives crashes.
    storage: FaultyStorage,
    /// The content of the task state files, by (checkpoint, task): `storage` holds the files.
    files: BTreeMap<(u64, usize), Snap>,
    completed: usize,
    /// What the sinks committed, by (sink, transaction); survives everything.
    external: BTreeMap<(usize, Txn), Vec<(u64, u64)>>,
    exhausted: Vec<bool>,
    exited: usize,
    final_id: Option<u64>,
    end_sent: bool,
    failure_budget: u32,
    restarts: u32,
    finished: bool,
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

fn new_coordinator(
    settings: &CheckpointSettings,
    storage: &FaultyStorage,
    base: Instant,
) -> CheckpointCoordinator {
    CheckpointCoordinator::new(
        settings.clone(),
        Arc::new(storage.clone()),
        JOB.into(),
        "sim".into(),
        128,
        1,
        (base, 0),
    )
}

fn uid(task: usize) -> String {
    format!("op-{task}")
}

fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
    postcard::to_stdvec(v).unwrap_or_default()
}

impl World {
    pub(crate) fn new(cfg: Config) -> Self {
        let mut rng = fastrand::Rng::with_seed(cfg.seed);
        let input: Vec<Vec<u64>> = (0..SOURCES)
            .map(|_| {
                let n = rng.usize(8..=24);
                (0..n).map(|_| rng.u64(0..KEYS)).collect()
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
        let mut connect = |from: usize, to: usize, channels: &mut Vec<Channel>| {
            let input = inputs[to].len();
            inputs[to].push(channels.len());
            outputs[from].push(channels.len());
            channels.push(Channel {
                to,
                input,
                queue: VecDeque::new(),
                outstanding: 0,
                sent: 0,
                last_barrier: 0,
            });
        };
        for s in 0..SOURCES {
            for k in 0..COUNTERS {
                connect(s, SOURCES + k, &mut channels);
            }
        }
        for k in 0..COUNTERS {
            connect(SOURCES + k, sink_of(SOURCES + k), &mut channels);
        }
        let failure_budget = rng.u32(0..=2);
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
        let base = Instant::now();
        let storage = FaultyStorage::default();
        let coordinator = new_coordinator(&settings, &storage, base);
        let mut w = World {
            cfg,
            rng,
            base,
            now_ms: 0,
            attempt: 0,
            tasks: Vec::new(),
            channels,
            outputs,
            inputs,
            input,
            uploads: VecDeque::new(),
            events: VecDeque::new(),
            settings,
            coordinator,
            storage,
            files: BTreeMap::new(),
            completed: 0,
            external: BTreeMap::new(),
            exhausted: vec![false; SOURCES],
            exited: 0,
            final_id: None,
            end_sent: false,
            failure_budget,
            restarts: 0,
            finished: false,
            violation: None,
            trace: Vec::new(),
            stats: BTreeMap::new(),
        };
        w.deploy();
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

    /// Deploys every task of a new attempt from the latest completed checkpoint; sinks commit
    /// that checkpoint's pre-committed transactions and drop the rest.
    fn deploy(&mut self) {
        let restored = self.latest_completed();
        for ch in &mut self.channels {
            ch.queue.clear();
            ch.outstanding = 0;
            ch.sent = 0;
            ch.last_barrier = 0;
        }
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
        let mut tasks = Vec::with_capacity(TASKS);
        for t in 0..TASKS {
            let snap = restored.as_ref().map(|r| r[t].clone());
            let state = snap.as_ref().map(|s| s.state.clone());
            let body = if is_source(t) {
                let pos = match state {
                    Some(State::Source(p)) => p,
                    _ => 0,
                };
                Body::Source {
                    keys: self.input[t].clone(),
                    pos,
                    exhausted: false,
                    end_of_input: false,
                }
            } else if is_counter(t) {
                Body::Counter {
                    counts: match state {
                        Some(State::Counter(c)) => c,
                        _ => BTreeMap::new(),
                    },
                }
            } else {
                if let Some(State::Sink(pending)) = state {
                    for (txn, out) in pending {
                        self.external.entry((t, txn)).or_insert(out);
                    }
                }
                Body::Sink {
                    current: Vec::new(),
                    pre_committed: Vec::new(),
                }
            };
            let replay = snap
                .map(|s| s.channels.into_iter().flat_map(|(_, b)| b).collect())
                .unwrap_or_default();
            tasks.push(Task {
                body,
                gate: InputGate::new(self.inputs[t].len(), mode)
                    .with_aligned_timeout(timeout)
                    .with_flaw(self.flaw()),
                held: None,
                control: VecDeque::new(),
                replay,
                ended: false,
                failed: false,
                exited: false,
            });
        }
        self.tasks = tasks;
        self.exhausted = vec![false; SOURCES];
        self.exited = 0;
        self.final_id = None;
        self.end_sent = false;
        let infos = (0..TASKS)
            .map(|t| TaskInfo {
                index: t,
                name: format!("task {t}"),
                subtask: 0,
                is_source: is_source(t),
                operators: vec![(uid(t), 1)],
            })
            .collect();
        let at = self.now().at;
        self.coordinator
            .set_tasks(infos, vec![self.attempt; TASKS], at);
        self.deliver();
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

    /// A new attempt after a failure (`crash`: the whole process died, with everything in flight).
    fn restart(&mut self, crash: bool) {
        self.count(if crash { "crashes" } else { "task failures" });
        if crash {
            // A new process: nothing in flight survives, and a new coordinator starts from
            // what the storage holds.
            self.uploads.clear();
            self.coordinator = new_coordinator(&self.settings, &self.storage, self.base);
        }
        self.events.clear();
        self.restarts += 1;
        self.attempt += 1;
        self.deploy();
    }

    fn send_control(&mut self, task: usize, c: Control) {
        self.tasks[task].control.push_back(c);
    }

    /// Delivers the coordinator's messages on the control path; a completion notification
    /// other than the final checkpoint's may be lost (a later one subsumes it).
    fn deliver(&mut self) {
        for (t, m) in self.coordinator.drain_messages() {
            let c = match m {
                TaskMessage::Trigger(b, kind) => Control::Trigger(b, kind),
                TaskMessage::Complete(id) => {
                    if self.final_id != Some(id) && self.rng.u32(0..8) == 0 {
                        self.count("lost completions");
                        continue;
                    }
                    Control::Complete(id)
                }
                TaskMessage::Aborted(id) => {
                    if self.final_id == Some(id) {
                        self.final_id = None;
                    }
                    Control::Aborted(id)
                }
            };
            self.send_control(t, c);
        }
    }

    fn has_credit(&self, task: usize) -> bool {
        self.outputs[task]
            .iter()
            .all(|&c| self.channels[c].outstanding < CREDITS_MAX)
    }

    fn send_batch(&mut self, ch: usize, batch: Box<dyn Any + Send>) {
        let c = &mut self.channels[ch];
        c.outstanding += 1;
        c.sent += 1;
        c.queue.push_back(Item::Data(Element::Batch(batch)));
        if c.outstanding > CREDITS_MAX {
            self.violate(format!("channel {ch} holds more batches than its credits"));
        }
    }

    fn forward(&mut self, task: usize, barrier: Barrier, unaligned: bool) {
        for &ch in &self.outputs[task].clone() {
            let c = &mut self.channels[ch];
            if barrier.id <= c.last_barrier {
                let last = c.last_barrier;
                self.violate(format!(
                    "task {task} sent barrier {} on channel {ch} after barrier {last}",
                    barrier.id
                ));
                return;
            }
            c.last_barrier = barrier.id;
            let item = if unaligned {
                Item::Priority(barrier, c.sent)
            } else {
                Item::Data(Element::Barrier(barrier))
            };
            c.queue.push_back(item);
        }
    }

    fn end_stream(&mut self, task: usize) {
        self.tasks[task].ended = true;
        for &ch in &self.outputs[task].clone() {
            self.channels[ch]
                .queue
                .push_back(Item::Data(Element::EndOfStream));
        }
    }

    fn state_of(&mut self, task: usize, id: u64) -> State {
        let commit_now = self.cfg.planted == Some(Planted::CommitAtPreCommit);
        let txn = (id, self.attempt);
        match &mut self.tasks[task].body {
            Body::Source { pos, .. } => State::Source(*pos),
            Body::Counter { counts } => State::Counter(counts.clone()),
            Body::Sink {
                current,
                pre_committed,
            } => {
                let out = std::mem::take(current);
                if commit_now {
                    self.external.insert((task, txn), out);
                } else if !out.is_empty() {
                    pre_committed.push((txn, out));
                }
                State::Sink(pre_committed.clone())
            }
        }
    }

    fn act(&mut self, task: usize, action: GateAction) {
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
                let snap = Snap {
                    state: self.state_of(task, barrier.id),
                    channels: Vec::new(),
                };
                if unaligned {
                    self.tasks[task].held = Some((barrier.id, snap));
                } else {
                    self.uploads
                        .push_back((self.attempt, task, barrier.id, snap));
                }
            }
            GateAction::Forward { barrier, unaligned } => self.forward(task, barrier, unaligned),
            GateAction::ChannelState { id, channels, .. } => match self.tasks[task].held.take() {
                Some((held, mut snap)) if held == id => {
                    if !channels.is_empty() {
                        self.count("non-empty channel states");
                    }
                    snap.channels = channels;
                    self.uploads.push_back((self.attempt, task, id, snap));
                }
                other => self.tasks[task].held = other,
            },
            GateAction::Discard { id } => {
                if self.tasks[task].held.as_ref().is_some_and(|h| h.0 == id) {
                    self.tasks[task].held = None;
                }
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
                self.events.push_back(Event::Decline {
                    attempt: self.attempt,
                    id,
                    cause,
                });
            }
            GateAction::NotifyComplete { id } => {
                if let Body::Sink { pre_committed, .. } = &mut self.tasks[task].body {
                    let (done, keep): (Vec<_>, Vec<_>) = std::mem::take(pre_committed)
                        .into_iter()
                        .partition(|(t, _)| t.0 <= id);
                    *pre_committed = keep;
                    for (txn, out) in done {
                        self.external.entry((task, txn)).or_insert(out);
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

    fn fail_task(&mut self, task: usize) {
        if !self.tasks[task].failed {
            self.tasks[task].failed = true;
            self.events.push_back(Event::Failed {
                attempt: self.attempt,
            });
        }
    }

    fn maybe_exit(&mut self, task: usize) {
        let t = &mut self.tasks[task];
        if t.ended && !t.exited && !t.failed && t.gate.may_exit() {
            t.exited = true;
            self.events.push_back(Event::Exited {
                attempt: self.attempt,
            });
        }
    }

    /// The operator of `task` processes a batch of records.
    fn apply(&mut self, task: usize, batch: Box<dyn Any + Send>) {
        if is_counter(task) {
            let Ok(keys) = batch.downcast::<Vec<u64>>() else {
                return self.violate(format!("counter {task} got a batch of another type"));
            };
            let Body::Counter { counts } = &mut self.tasks[task].body else {
                return;
            };
            let out: Vec<(u64, u64)> = keys
                .iter()
                .map(|&k| {
                    let c = counts.entry(k).or_insert(0);
                    *c += 1;
                    (k, *c)
                })
                .collect();
            let ch = self.outputs[task][0];
            self.send_batch(ch, Box::new(out));
        } else if let Ok(recs) = batch.downcast::<Vec<(u64, u64)>>() {
            if let Body::Sink { current, .. } = &mut self.tasks[task].body {
                current.extend(recs.iter());
            }
        } else {
            self.violate(format!("sink {task} got a batch of another type"));
        }
    }

    fn encode_batch(task: usize, batch: &(dyn Any + Send)) -> Vec<u8> {
        if is_counter(task) {
            batch
                .downcast_ref::<Vec<u64>>()
                .map(encode)
                .unwrap_or_default()
        } else {
            batch
                .downcast_ref::<Vec<(u64, u64)>>()
                .map(encode)
                .unwrap_or_default()
        }
    }

    fn decode_batch(task: usize, bytes: &[u8]) -> Option<Box<dyn Any + Send>> {
        if is_counter(task) {
            postcard::from_bytes::<Vec<u64>>(bytes)
                .ok()
                .map(|v| Box::new(v) as Box<dyn Any + Send>)
        } else {
            postcard::from_bytes::<Vec<(u64, u64)>>(bytes)
                .ok()
                .map(|v| Box::new(v) as Box<dyn Any + Send>)
        }
    }

    /// `task` processes an element of input `input` that the gate let through.
    fn process(&mut self, task: usize, input: usize, element: Element) {
        let now = self.now();
        match element {
            Element::Batch(batch) => {
                if self.tasks[task].gate.is_blocked(input) {
                    self.violate(format!("task {task} read blocked input {input}"));
                }
                let ch = self.inputs[task][input];
                self.channels[ch].outstanding -= 1;
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
        }
        let parked = self.tasks[task].gate.parked();
        if parked > self.inputs[task].len() * (CREDITS_MAX + 6) {
            self.violate(format!("task {task} parks {parked} elements"));
        }
    }

    fn runnable(&self, task: usize) -> bool {
        let t = &self.tasks[task];
        !t.failed && !t.exited
    }

    fn choices(&mut self, out: &mut Vec<Choice>) {
        out.clear();
        out.push(Choice::Tick);
        for t in 0..TASKS {
            if !self.runnable(t) {
                continue;
            }
            let task = &self.tasks[t];
            if !task.replay.is_empty() {
                if self.has_credit(t) {
                    out.push(Choice::Replay(t));
                }
                continue;
            }
            if !task.control.is_empty() {
                out.push(Choice::Control(t));
            }
            if let Body::Source {
                exhausted: false, ..
            } = task.body
            {
                if self.has_credit(t) {
                    out.push(Choice::Poll(t));
                }
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
            let credit = self.has_credit(t);
            let ready = task.gate.ready_parked();
            if ready && credit {
                out.push(Choice::Parked(t));
            }
            for &ch in &self.inputs[t] {
                let q = &self.channels[ch].queue;
                if q.iter().any(|i| matches!(i, Item::Priority(..))) {
                    out.push(Choice::Priority(ch));
                }
                // Parked elements go before new mail.
                if !ready && credit && matches!(q.front(), Some(Item::Data(_))) {
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
            let c = if self.failure_budget > 0 && self.rng.u32(0..150) == 0 {
                self.failure_budget -= 1;
                if self.rng.bool() {
                    Choice::Crash
                } else {
                    Choice::FailTask(self.rng.usize(0..TASKS))
                }
            } else {
                self.choices(&mut choices);
                choices[self.rng.usize(0..choices.len())]
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
        Outcome {
            steps,
            restarts: self.restarts,
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
            Choice::Upload => {
                if let Some((attempt, task, id, snap)) = self.uploads.pop_front() {
                    let path = format!("{}/task-{task}", checkpoint_dir(JOB, id));
                    if let Err(e) = self.storage.write(&path, b"state") {
                        return self.violate(format!("upload failed: {e}"));
                    }
                    self.files.insert((id, task), snap);
                    self.events.push_back(Event::Ack { attempt, task, id });
                }
            }
            Choice::Master => self.master(),
            Choice::FailTask(t) => {
                if self.runnable(t) {
                    self.fail_task(t)
                }
            }
            Choice::Crash => self.restart(true),
        }
        for t in 0..TASKS {
            if self.tasks[t].gate.deadline().is_some_and(|d| d <= now.at) && self.runnable(t) {
                let actions = self.tasks[t].gate.on_timer(now);
                self.act_all(t, actions);
            }
            self.maybe_exit(t);
        }
    }

    fn tick(&mut self) {
        self.now_ms += self.rng.u64(1..=3);
        let at = self.now().at;
        if let Err(e) = self.coordinator.check_timeouts(at) {
            return self.violate(format!("the job failed: {e}"));
        }
        if self.final_id.is_none() && !self.end_sent {
            if self.exhausted.iter().all(|&e| e) {
                self.final_id = self.coordinator.maybe_trigger(at, true);
            } else {
                self.coordinator.maybe_trigger(at, false);
            }
        }
        self.deliver();
    }

    fn poll(&mut self, s: usize) {
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
        let end = (*pos + n).min(keys.len());
        let mut per: Vec<Vec<u64>> = vec![Vec::new(); COUNTERS];
        for &k in &keys[*pos..end] {
            per[(k % COUNTERS as u64) as usize].push(k);
        }
        *pos = end;
        let now_exhausted = end == keys.len();
        *exhausted = now_exhausted;
        for (k, batch) in per.into_iter().enumerate() {
            if !batch.is_empty() {
                let ch = self.outputs[s][k];
                self.send_batch(ch, Box::new(batch));
            }
        }
        if now_exhausted {
            self.events.push_back(Event::Exhausted {
                attempt: self.attempt,
                task: s,
            });
        }
    }

    fn control(&mut self, t: usize, c: Control) {
        match c {
            Control::Trigger(b, kind) => {
                let actions = self.tasks[t].gate.on_trigger(b, kind);
                self.act_all(t, actions);
            }
            Control::Complete(id) => {
                let a = self.tasks[t].gate.on_complete(id);
                self.act(t, a);
            }
            Control::Aborted(id) => {
                let actions = self.tasks[t].gate.on_abort(id);
                self.act_all(t, actions);
            }
            Control::EndOfInput => {
                if let Body::Source { end_of_input, .. } = &mut self.tasks[t].body {
                    *end_of_input = true;
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

    fn master(&mut self) {
        let Some(e) = self.events.pop_front() else {
            return;
        };
        let current = self.attempt;
        let at = self.now().at;
        match e {
            Event::Ack { attempt, task, id } if attempt == current => {
                // The process may die while the last ack's `_metadata` is being written.
                if self.failure_budget > 0 && self.rng.u32(0..30) == 0 {
                    self.failure_budget -= 1;
                    self.storage.arm_metadata_crash();
                }
                let result = self.coordinator.on_ack(
                    TaskAck {
                        checkpoint_id: id,
                        task_index: task,
                        attempt,
                        file: Some(format!("task-{task}")),
                        uids: vec![uid(task)],
                        stats: TaskCheckpointStats::default(),
                    },
                    at,
                );
                if self.storage.crashed() {
                    self.count("crashes during a _metadata write");
                    return self.restart(true);
                }
                match result {
                    Ok(done) => {
                        self.completed += done.len();
                        self.deliver();
                        let fin = self.final_id;
                        if fin.is_some_and(|f| done.iter().any(|&d| d >= f)) && !self.end_sent {
                            self.end_sent = true;
                            for s in 0..SOURCES {
                                self.send_control(s, Control::EndOfInput);
                            }
                        }
                    }
                    Err(e) => self.violate(format!("the job failed: {e}")),
                }
            }
            Event::Decline { attempt, id, cause } if attempt == current => {
                if let Err(e) = self.coordinator.on_decline(id, attempt, &cause, at) {
                    self.violate(format!("the job failed: {e}"));
                }
                self.deliver();
            }
            Event::Exhausted { attempt, task } if attempt == current => self.exhausted[task] = true,
            Event::Exited { attempt } if attempt == current => {
                self.exited += 1;
                if self.exited == TASKS {
                    self.finished = true;
                }
            }
            Event::Failed { attempt } if attempt == current => self.restart(false),
            _ => {}
        }
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
        let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
        for keys in &self.input {
            for &k in keys {
                *expected.entry(k).or_insert(0) += 1;
            }
        }
        let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
        for out in self.external.values() {
            for &(k, c) in out {
                seen.entry(k).or_default().push(c);
            }
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
        if let Some(k) = seen.keys().next() {
            let k = *k;
            self.violate(format!(
                "committed output for key {k} that no source produced"
            ));
        }
    }
}
