//! Event time end to end, run for real by the embedded runtime.
//!
//! Stop-with-savepoint with and without drain on an event-time job: with drain, the maximum
//! watermark goes in front of the stop barrier, so every window of every record read fires
//! with its exact count and is committed with the savepoint; without it, open windows stay in
//! the savepoint and nothing fires. A job resumed from a drained savepoint has no event time
//! left: it reads nothing and finishes.
//!
//! Idleness across channels: a source subtask whose only split is idle marks its channels
//! idle, so the window downstream fires on the other channel's event time alone.
//!
//! A checkpoint carries the watermark of every record read before it, even when the periodic
//! emission is not yet due.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn::api::{AggregateFunction, Collector, StreamEnv, TimeWindow, WindowAssigner};
use cairn::api::{DataStream, JobGraph, WatermarkStrategy};
use cairn::config::JobConfig;
use cairn::connectors::SequenceSource;
use cairn::runtime::chain::{Source, SourceReader, SourceStatus};
use cairn::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkWriter};
use cairn::runtime::{
    run_job, JobState, JobStatus, RestoreFrom, RunOptions, SavepointKind, SavepointState,
};
use cairn::{TaskError, TaskResult};

#[path = "support/collect.rs"]
mod collect;
use collect::Collect;

const DEADLINE: Duration = Duration::from_secs(120);
/// Records in all: far more than a run reads before it is stopped.
const N: u64 = 4_000_000;
/// Records per second over the whole source.
const RATE: u64 = 200_000;
const KEYS: u64 = 4;
const WINDOW_MS: i64 = 100;

/// Record i: key, event time i ms, value.
type Rec = (u64, i64, u64);

fn rec(i: u64) -> Rec {
    (i % KEYS, i as i64, i)
}

/// (key, window start, records)
type Row = (u64, i64, u64);

/// What an exactly-once sink committed: only what a completed checkpoint covers.
#[derive(Clone, Default)]
struct Committed<T>(Arc<Mutex<Vec<T>>>);

struct CommittedWriter<T> {
    committed: Arc<Mutex<Vec<T>>>,
    current: Vec<T>,
    pending: Vec<(u64, Vec<T>)>,
}

impl<T: Send + 'static> Sink<T> for Committed<T> {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::ExactlyOnce
    }
    fn create_writer(&self, _ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(CommittedWriter {
            committed: self.0.clone(),
            current: Vec::new(),
            pending: Vec::new(),
        }))
    }
}

impl<T: Send> SinkWriter<T> for CommittedWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        self.current.append(batch);
        Ok(())
    }
    fn pre_commit(&mut self, id: u64) -> TaskResult<Vec<Vec<u8>>> {
        // These runs never restore a checkpoint of their own: nothing to keep in it.
        self.pending.push((id, std::mem::take(&mut self.current)));
        Ok(Vec::new())
    }
    fn commit(&mut self, id: u64) -> TaskResult {
        let mut committed = self.committed.lock().unwrap();
        for (_, records) in self.pending.iter_mut().filter(|(p, _)| *p <= id) {
            committed.append(records);
        }
        self.pending.retain(|(p, _)| *p > id);
        Ok(())
    }
    fn finish(&mut self) -> TaskResult {
        if self.current.is_empty() {
            Ok(())
        } else {
            Err(TaskError::msg(format!(
                "{} records written after the final checkpoint",
                self.current.len()
            )))
        }
    }
}

#[derive(Clone)]
struct Count;

impl AggregateFunction<Rec, u64> for Count {
    type Acc = u64;
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _: Rec) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: &u64) {
        *acc += other;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
}

/// The records themselves, and per key a count in tumbling event-time windows.
fn job(raw: Committed<Rec>, windows: Committed<Row>) -> JobGraph {
    let env = StreamEnv::new();
    let records = env
        .source_with_watermarks(
            SequenceSource::new(N, RATE, rec),
            WatermarkStrategy::monotonous(|r: &Rec| r.1),
        )
        .uid("source");
    records.clone().sink(raw).uid("raw");
    count_windows(records, windows);
    env.build("drain").unwrap()
}

/// Counts `records` per key in tumbling event-time windows of `WINDOW_MS` into `out`.
fn count_windows(records: DataStream<Rec>, out: impl Sink<Row>) {
    records
        .key_by(|r: &Rec| r.0)
        .window(WindowAssigner::tumbling(Duration::from_millis(
            WINDOW_MS as u64,
        )))
        .aggregate_process(
            Count,
            |k: &u64, w: TimeWindow, n: u64, out: &mut Collector<Row>| {
                out.collect((*k, w.start, n))
            },
        )
        .uid("window")
        .sink(out)
        .uid("windows");
}

fn config(dir: &Path) -> JobConfig {
    let mut c = JobConfig {
        parallelism: 2,
        auto_watermark_interval: Duration::from_millis(5),
        ..JobConfig::default()
    };
    c.set("execution.checkpointing.interval", "50ms").unwrap();
    c.set(
        "state.checkpoints.dir",
        dir.join("checkpoints").to_str().unwrap(),
    )
    .unwrap();
    c
}

/// The windows of `records`, as the job counts them.
fn reference(records: &[Rec]) -> Vec<Row> {
    let mut m: BTreeMap<(u64, i64), u64> = BTreeMap::new();
    for r in records {
        *m.entry((r.0, r.1 - r.1.rem_euclid(WINDOW_MS))).or_default() += 1;
    }
    m.into_iter().map(|((k, s), n)| (k, s, n)).collect()
}

struct Run {
    raw: Vec<Rec>,
    windows: Vec<Row>,
    savepoint: PathBuf,
}

/// Runs the job until 20 000 records are committed, then stops it with a savepoint of
/// `kind`; returns what was committed, sorted.
fn run_and_stop(dir: &Path, kind: SavepointKind) -> Run {
    let (raw, windows) = (Committed::default(), Committed::default());
    let graph = job(raw.clone(), windows.clone());
    let status = JobStatus::new("job".into(), "drain".into(), Vec::new());
    let opts = RunOptions {
        config: config(dir),
        status: Some(status.clone()),
        ..RunOptions::default()
    };
    let runner = std::thread::spawn(move || run_job(&graph, opts));
    let until = Instant::now() + DEADLINE;
    while raw.0.lock().unwrap().len() < 20_000 {
        assert!(Instant::now() < until, "no checkpoint committed records");
        assert!(!runner.is_finished(), "the job ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    let request = status.request_savepoint(dir.join("savepoints"), kind, true);
    let summary = runner.join().unwrap().expect("the stopped job finishes");
    assert_eq!(status.view().state, JobState::Finished, "{summary:?}");
    let view = status.view();
    let savepoint = match &view
        .savepoints
        .iter()
        .find(|s| s.request_id == request)
        .expect("the savepoint request is listed")
        .state
    {
        SavepointState::Completed { location } => PathBuf::from(location),
        other => panic!("the stop-with-savepoint did not complete: {other:?}"),
    };
    let mut raw = raw.0.lock().unwrap().clone();
    raw.sort();
    let mut windows = windows.0.lock().unwrap().clone();
    windows.sort();
    assert!((raw.len() as u64) < N, "the stop landed mid-run");
    Run {
        raw,
        windows,
        savepoint,
    }
}

#[test]
fn a_drained_stop_fires_every_window_of_the_records_read_and_commits_it_with_the_savepoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_and_stop(dir.path(), SavepointKind::StopAndDrain);
    // Every record read before the stop's barrier is in a fired window, with its exact count,
    // the windows still open at the stop included.
    assert_eq!(run.windows, reference(&run.raw));

    // Event time ended with the drain: a job resumed from the savepoint reads nothing more
    // (every record would be late) and finishes.
    let (raw, windows) = (Committed::default(), Committed::default());
    let status = JobStatus::new("job".into(), "drain".into(), Vec::new());
    let opts = RunOptions {
        config: config(&dir.path().join("resumed")),
        restore: Some(RestoreFrom::Path(run.savepoint.clone())),
        status: Some(status.clone()),
        ..RunOptions::default()
    };
    run_job(&job(raw.clone(), windows.clone()), opts).expect("the resumed job finishes");
    assert_eq!(status.view().state, JobState::Finished);
    assert!(raw.0.lock().unwrap().is_empty(), "a drained job read on");
    assert!(windows.0.lock().unwrap().is_empty(), "windows fired again");
}

#[test]
fn a_stop_without_drain_fires_no_open_window() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_and_stop(dir.path(), SavepointKind::Stop);
    let all = reference(&run.raw);
    // What fired is right, but the windows the watermark had not passed stay in the
    // savepoint: the newest record's window did not fire.
    for w in &run.windows {
        assert!(
            all.contains(w),
            "window {w:?} is not one of {} expected",
            all.len()
        );
    }
    let newest = run.raw.iter().map(|r| r.1).max().unwrap();
    let open = newest - newest.rem_euclid(WINDOW_MS);
    assert!(
        !run.windows.iter().any(|w| w.1 == open),
        "the window at {open} fired without drain"
    );
    assert!(run.windows.len() < all.len());
}

/// Split 0 of [`HalfIdle`] emits a record every few ms (key i mod 3, time 10 i ms); split 1
/// emits nothing. Both end once `finish` is set.
#[derive(Clone, Default)]
struct HalfIdle {
    finish: Arc<AtomicBool>,
    emitted: Arc<Mutex<Vec<Rec>>>,
}

struct HalfIdleReader {
    split: u8,
    next: u64,
    source: HalfIdle,
}

impl Source<Rec> for HalfIdle {
    fn create_splits(&self, _parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        Ok(vec![vec![0], vec![1]])
    }
    fn create_reader(
        &self,
        _subtask: u32,
        _parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<Rec>>> {
        let [split] = &splits[..] else {
            return Err(TaskError::msg("one split per subtask"));
        };
        Ok(Box::new(HalfIdleReader {
            split: split[0],
            next: 0,
            source: self.clone(),
        }))
    }
}

impl SourceReader<Rec> for HalfIdleReader {
    fn poll(&mut self, out: &mut Vec<Rec>, _max: usize) -> TaskResult<SourceStatus> {
        if self.source.finish.load(Ordering::Acquire) {
            return Ok(SourceStatus::Exhausted);
        }
        if self.split == 0 {
            let r = (self.next % 3, 10 * self.next as i64, self.next);
            self.next += 1;
            self.source.emitted.lock().unwrap().push(r);
            out.push(r);
        }
        Ok(SourceStatus::IdleUntil(
            Instant::now() + Duration::from_millis(1),
        ))
    }
    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        Ok(vec![vec![self.split]])
    }
}

/// Counts per key in 100 ms tumbling windows of [`HalfIdle`] at parallelism 2 (a source
/// subtask per split), written as they fire.
fn half_idle_job(source: HalfIdle, idleness: Option<Duration>, out: Collect<Row>) -> JobGraph {
    let env = StreamEnv::new();
    let mut strategy = WatermarkStrategy::monotonous(|r: &Rec| r.1);
    if let Some(timeout) = idleness {
        strategy = strategy.with_idleness(timeout);
    }
    count_windows(
        env.source_with_watermarks(source, strategy).uid("source"),
        out,
    );
    env.build("idle").unwrap()
}

/// Runs [`half_idle_job`], waits until `ready` holds (with a deadline), checks `while_running`,
/// then ends the input; every window of the records emitted must have fired once, exactly.
fn run_half_idle(
    idleness: Option<Duration>,
    ready: impl Fn(&HalfIdle, &Collect<Row>) -> bool,
    while_running: impl Fn(&Collect<Row>),
) {
    let (source, fired) = (HalfIdle::default(), Collect::<Row>::default());
    let graph = half_idle_job(source.clone(), idleness, fired.clone());
    let config = JobConfig {
        parallelism: 2,
        auto_watermark_interval: Duration::from_millis(2),
        ..JobConfig::default()
    };
    let opts = RunOptions {
        config,
        ..RunOptions::default()
    };
    let runner = std::thread::spawn(move || run_job(&graph, opts));
    let until = Instant::now() + DEADLINE;
    while !ready(&source, &fired) {
        assert!(Instant::now() < until, "the condition never held");
        assert!(!runner.is_finished(), "the job ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    while_running(&fired);
    source.finish.store(true, Ordering::Release);
    runner.join().unwrap().expect("the job finishes");
    let mut got = fired.0.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, reference(&source.emitted.lock().unwrap()));
}

/// An idle split marks its source subtask's channels idle: the window downstream takes its
/// event time from the other channel alone and fires while the idle split is still open.
#[test]
fn an_idle_source_subtask_does_not_hold_back_windows_downstream() {
    run_half_idle(
        Some(Duration::from_millis(20)),
        |_, fired| fired.0.lock().unwrap().len() >= 6,
        |_| {},
    );
}

/// Without idleness the silent subtask's channel holds the window's event time at its start:
/// however much the other split read, nothing fires until the input ends.
#[test]
fn without_idleness_a_silent_source_subtask_holds_back_every_window() {
    run_half_idle(
        None,
        |source, _| source.emitted.lock().unwrap().len() >= 300,
        |fired| assert!(fired.0.lock().unwrap().is_empty(), "a window fired"),
    );
}

/// One split whose reader emits nothing at its first poll, then `SILENT_AFTER` records (key
/// i mod 3, time 10 i ms), then nothing until `finish` is set.
#[derive(Clone, Default)]
struct GoesSilent {
    finish: Arc<AtomicBool>,
}

const SILENT_AFTER: u64 = 300;

struct GoesSilentReader {
    polls: u64,
    next: u64,
    finish: Arc<AtomicBool>,
}

impl Source<Rec> for GoesSilent {
    fn create_splits(&self, _parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        Ok(vec![vec![0]])
    }
    fn create_reader(
        &self,
        _subtask: u32,
        _parallelism: u32,
        _splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<Rec>>> {
        Ok(Box::new(GoesSilentReader {
            polls: 0,
            next: 0,
            finish: self.finish.clone(),
        }))
    }
}

impl SourceReader<Rec> for GoesSilentReader {
    fn poll(&mut self, out: &mut Vec<Rec>, max: usize) -> TaskResult<SourceStatus> {
        if self.finish.load(Ordering::Acquire) {
            return Ok(SourceStatus::Exhausted);
        }
        // Nothing at the first poll, so the records come after the first periodic emission.
        self.polls += 1;
        while self.polls > 1 && self.next < SILENT_AFTER && out.len() < max {
            out.push((self.next % 3, 10 * self.next as i64, self.next));
            self.next += 1;
        }
        Ok(SourceStatus::IdleUntil(
            Instant::now() + Duration::from_millis(1),
        ))
    }
    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        Ok(vec![self.next.to_le_bytes().to_vec()])
    }
}

/// The periodic watermark emission is an hour away, but a checkpoint's watermark covers every
/// record read before it (a restored source does not read them again), so the windows of a
/// source that read its records and went silent fire at its next checkpoint.
#[test]
fn a_checkpoint_carries_the_watermark_of_every_record_read_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let (source, fired) = (GoesSilent::default(), Collect::<Row>::default());
    let env = StreamEnv::new();
    count_windows(
        env.source_with_watermarks(source.clone(), WatermarkStrategy::monotonous(|r: &Rec| r.1))
            .uid("source"),
        fired.clone(),
    );
    let graph = env.build("silent").unwrap();
    let mut config = config(dir.path());
    config.parallelism = 1;
    config.auto_watermark_interval = Duration::from_secs(3600);
    let opts = RunOptions {
        config,
        ..RunOptions::default()
    };
    let runner = std::thread::spawn(move || run_job(&graph, opts));
    let records: Vec<Rec> = (0..SILENT_AFTER)
        .map(|i| (i % 3, 10 * i as i64, i))
        .collect();
    // The watermark is the newest record's time less 1 ms: its window stays open.
    let newest_window = 10 * (SILENT_AFTER as i64 - 1) / WINDOW_MS * WINDOW_MS;
    let closed: Vec<Row> = reference(&records)
        .into_iter()
        .filter(|w| w.1 < newest_window)
        .collect();
    let until = Instant::now() + DEADLINE;
    loop {
        let mut got = fired.0.lock().unwrap().clone();
        got.sort();
        if got == closed {
            break;
        }
        assert!(
            Instant::now() < until,
            "the windows of the records read before a checkpoint did not fire: {} of {}",
            got.len(),
            closed.len()
        );
        assert!(!runner.is_finished(), "the job ended early");
        std::thread::park_timeout(Duration::from_millis(5));
    }
    source.finish.store(true, Ordering::Release);
    runner.join().unwrap().expect("the job finishes");
    let mut got = fired.0.lock().unwrap().clone();
    got.sort();
    assert_eq!(got, reference(&records));
}
