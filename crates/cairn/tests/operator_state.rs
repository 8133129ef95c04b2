//! Operator state across a stop-with-savepoint and a resume at another parallelism, run for
//! real by the embedded runtime: a list state is split evenly over the new subtasks, a union
//! list state reaches every one of them whole, and a state registered as another kind than it
//! was written as fails the job at once instead of restarting into the same failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cairn::api::{Collector, ProcessFunction, StreamEnv};
use cairn::config::JobConfig;
use cairn::connectors::{DiscardSink, SequenceSource};
use cairn::runtime::{
    run_job, JobError, JobState, JobStatus, RestoreFrom, RunOptions, SavepointKind, SavepointState,
};
use cairn::state::{OperatorListState, OperatorStateStore};
use cairn::TaskResult;

const DEADLINE: Duration = Duration::from_secs(120);

/// What one subtask of a run found restored: its share of the list state and the union list.
#[derive(Debug, Clone, Default)]
struct Restored {
    split: Vec<u64>,
    union: Vec<u32>,
}

#[derive(Default)]
struct Report {
    /// Per subtask: what `open` found restored.
    restored: BTreeMap<u32, Restored>,
    /// Per subtask: the records it had seen at its last snapshot.
    snapshotted: BTreeMap<u32, u64>,
    /// Records processed, over all subtasks.
    processed: u64,
}

/// Counts its subtask's records. The list state "seen" holds counts (split evenly when
/// rescaled); the union list state "owners" holds the subtask index that wrote it.
#[derive(Clone)]
struct Tally {
    union_kind_for_seen: bool,
    report: Arc<Mutex<Report>>,
    seen: u64,
    subtask: u32,
    state: Option<(OperatorListState<u64>, OperatorListState<u32>)>,
}

impl Tally {
    fn new(report: Arc<Mutex<Report>>) -> Self {
        Tally {
            union_kind_for_seen: false,
            report,
            seen: 0,
            subtask: 0,
            state: None,
        }
    }
}

impl ProcessFunction<u64, u64> for Tally {
    fn open(&mut self, store: &mut OperatorStateStore) -> TaskResult {
        let seen = if self.union_kind_for_seen {
            store.union_list_state::<u64>("seen")?
        } else {
            store.list_state::<u64>("seen")?
        };
        let owners = store.union_list_state::<u32>("owners")?;
        let restored = Restored {
            split: seen.get(store)?,
            union: owners.get(store)?,
        };
        self.subtask = store.subtask();
        // A subtask carries on with the counts it was handed.
        self.seen = restored.split.iter().sum();
        self.report
            .lock()
            .unwrap()
            .restored
            .insert(self.subtask, restored);
        self.state = Some((seen, owners));
        Ok(())
    }

    fn process(
        &mut self,
        value: u64,
        _store: &mut OperatorStateStore,
        out: &mut Collector<u64>,
    ) -> TaskResult {
        self.seen += 1;
        self.report.lock().unwrap().processed += 1;
        out.collect(value);
        Ok(())
    }

    fn snapshot_state(&mut self, store: &mut OperatorStateStore) -> TaskResult {
        let Some((seen, owners)) = &self.state else {
            return Ok(());
        };
        // One entry per subtask, so that a rescale has entries to split.
        seen.update(store, &[self.seen])?;
        owners.update(store, &[self.subtask])?;
        self.report
            .lock()
            .unwrap()
            .snapshotted
            .insert(self.subtask, self.seen);
        Ok(())
    }
}

fn job(tally: Tally, parallelism: u32) -> cairn::api::JobGraph {
    let env = StreamEnv::new();
    env.source(SequenceSource::new(u64::MAX, 20_000, |i| i))
        .uid("numbers")
        .parallelism(1)
        .rebalance()
        .process(tally)
        .uid("tally")
        .parallelism(parallelism)
        .sink(DiscardSink)
        .uid("discard")
        .parallelism(1);
    env.build("operator-state").unwrap()
}

fn config(dir: &Path, extra: &[(&str, &str)]) -> JobConfig {
    let mut c = JobConfig::default();
    c.set("execution.checkpointing.interval", "50ms").unwrap();
    c.set(
        "state.checkpoints.dir",
        dir.join("checkpoints").to_str().unwrap(),
    )
    .unwrap();
    for (k, v) in extra {
        c.set(k, v).unwrap();
    }
    c
}

/// Runs the job, and once it processed `records` more records, stops it with a savepoint
/// into `target`; returns the savepoint's path.
fn run_and_stop(
    graph: cairn::api::JobGraph,
    config: JobConfig,
    from: Option<&Path>,
    report: &Arc<Mutex<Report>>,
    records: u64,
    target: &Path,
) -> PathBuf {
    let status = JobStatus::new("job".into(), "operator-state".into(), Vec::new());
    let opts = RunOptions {
        config,
        restore: from.map(|p| RestoreFrom::Path(p.to_path_buf())),
        status: Some(status.clone()),
        ..RunOptions::default()
    };
    let runner = std::thread::spawn(move || run_job(&graph, opts));
    let until = Instant::now() + DEADLINE;
    let start = report.lock().unwrap().processed;
    while report.lock().unwrap().processed < start + records {
        assert!(
            Instant::now() < until,
            "the job never processed {records} records"
        );
        assert!(!runner.is_finished(), "the job ended early");
        std::thread::sleep(Duration::from_millis(5));
    }
    let request = status.request_savepoint(target.to_path_buf(), SavepointKind::Stop, true);
    let summary = runner.join().unwrap().expect("the stopped job finishes");
    assert_eq!(status.view().state, JobState::Finished, "{summary:?}");
    let view = status.view();
    let sp = view
        .savepoints
        .iter()
        .find(|s| s.request_id == request)
        .expect("the savepoint request is listed");
    match &sp.state {
        SavepointState::Completed { location } => PathBuf::from(location),
        other => panic!("the stop-with-savepoint did not complete: {other:?}"),
    }
}

#[test]
fn list_state_is_split_evenly_and_union_list_state_reaches_every_subtask() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("savepoints");

    // Run 1 at parallelism 3, stopped with a savepoint.
    let first = Arc::new(Mutex::new(Report::default()));
    let sp1 = run_and_stop(
        job(Tally::new(first.clone()), 3),
        config(dir.path(), &[]),
        None,
        &first,
        2_000,
        &target,
    );
    let counts1: Vec<u64> = first
        .lock()
        .unwrap()
        .snapshotted
        .values()
        .copied()
        .collect();
    assert_eq!(counts1.len(), 3, "three subtasks snapshotted");
    let total1: u64 = counts1.iter().sum();

    // Run 2 at parallelism 2: the three counts are split as [c0, c1] and [c2]; every subtask
    // gets all three owners.
    let second = Arc::new(Mutex::new(Report::default()));
    let sp2 = run_and_stop(
        job(Tally::new(second.clone()), 2),
        config(dir.path(), &[]),
        Some(&sp1),
        &second,
        2_000,
        &target,
    );
    {
        let r = second.lock().unwrap();
        assert_eq!(r.restored.len(), 2);
        assert_eq!(r.restored[&0].split, counts1[..2].to_vec());
        assert_eq!(r.restored[&1].split, counts1[2..].to_vec());
        for (subtask, got) in &r.restored {
            assert_eq!(got.union, vec![0, 1, 2], "owners at subtask {subtask}");
        }
    }
    let counts2: Vec<u64> = second
        .lock()
        .unwrap()
        .snapshotted
        .values()
        .copied()
        .collect();
    let total2: u64 = counts2.iter().sum();
    assert_eq!(
        total2,
        total1 + second.lock().unwrap().processed,
        "the counts carried on from the savepoint, each exactly once"
    );

    // Run 3 at parallelism 4: two entries for four subtasks; owners [0, 1] everywhere.
    let third = Arc::new(Mutex::new(Report::default()));
    run_and_stop(
        job(Tally::new(third.clone()), 4),
        config(dir.path(), &[]),
        Some(&sp2),
        &third,
        500,
        &target,
    );
    let r = third.lock().unwrap();
    let splits: Vec<Vec<u64>> = (0..4).map(|i| r.restored[&i].split.clone()).collect();
    assert_eq!(
        splits,
        vec![vec![counts2[0]], vec![counts2[1]], vec![], vec![]]
    );
    for (subtask, got) in &r.restored {
        assert_eq!(got.union, vec![0, 1], "owners at subtask {subtask}");
    }
}

#[test]
fn a_state_registered_as_another_kind_fails_the_job_without_restarting() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("savepoints");
    let report = Arc::new(Mutex::new(Report::default()));
    let sp = run_and_stop(
        job(Tally::new(report.clone()), 2),
        config(dir.path(), &[]),
        None,
        &report,
        1_000,
        &target,
    );

    // "seen" was a list state; registered as a union list state it cannot be restored. With
    // restarts allowed, the job must still fail at once.
    let mut changed = Tally::new(Arc::new(Mutex::new(Report::default())));
    changed.union_kind_for_seen = true;
    let config = config(
        dir.path(),
        &[
            ("restart-strategy.type", "fixed-delay"),
            ("restart-strategy.fixed-delay.attempts", "100"),
            ("restart-strategy.fixed-delay.delay", "10ms"),
        ],
    );
    let result = run_job(
        &job(changed, 2),
        RunOptions {
            config,
            restore: Some(RestoreFrom::Path(sp)),
            ..RunOptions::default()
        },
    );
    // Embedded, the first deployment opens the functions and fails to start; on workers the
    // subtask fails as unrecoverable. Either way: at once, naming the state and both kinds.
    let cause = match result {
        Err(JobError::Setup(cause)) => cause,
        Err(JobError::Failed {
            restarts, cause, ..
        }) => {
            assert_eq!(restarts, 0, "an unrecoverable failure is not restarted");
            cause
        }
        other => panic!("expected the job to fail, got {other:?}"),
    };
    assert!(
        cause.contains(
            "state 'seen' was written as operator list state and is now registered as union list state"
        ),
        "{cause}"
    );
}
