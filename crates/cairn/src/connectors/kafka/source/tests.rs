//! The Kafka source against librdkafka's mock cluster (in this process): assignment,
//! start positions, restore and rescaling, discovery, faults, commit back, event time.
//!
//! The tests play the runtime's part by hand: a fresh start hands split `j` to subtask
//! `j mod p`; a restore concatenates the subtasks' snapshots and gives each new subtask a
//! contiguous even share (as `checkpoint::restore` does).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};
use rdkafka::ClientConfig;

use super::*;

const DEADLINE: Duration = Duration::from_secs(60);

/// (topic, partition, offset, value)
type Rec = (String, i32, i64, String);

type Mock = MockCluster<'static, DefaultProducerContext>;

fn mock(brokers: i32) -> Mock {
    MockCluster::new(brokers).expect("librdkafka's mock cluster starts")
}

/// A source of records that say where they came from.
fn tagged(config: KafkaSourceConfig) -> KafkaSource<Rec> {
    KafkaSource::new(config, |m: &KafkaMessage<'_>| {
        Some((
            m.topic.to_string(),
            m.partition,
            m.offset,
            String::from_utf8_lossy(m.payload?).into_owned(),
        ))
    })
}

fn config(mock: &Mock, topics: &[&str]) -> KafkaSourceConfig {
    let mut c = KafkaSourceConfig::new(
        mock.bootstrap_servers(),
        topics.iter().map(|t| t.to_string()).collect(),
    );
    c.bounded = true;
    c.request_timeout = Duration::from_secs(5);
    c
}

/// Produces `(partition, value, timestamp)` records to `topic`.
fn produce(brokers: &str, topic: &str, records: &[(i32, String, Option<i64>)]) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .create()
        .expect("producer");
    for (p, v, ts) in records {
        let mut rec = BaseRecord::<(), str>::to(topic)
            .partition(*p)
            .payload(v.as_str());
        if let Some(ts) = ts {
            rec = rec.timestamp(*ts);
        }
        loop {
            match producer.send(rec) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    producer.poll(Duration::from_millis(10));
                    rec = r;
                }
                Err((e, _)) => panic!("cannot produce to {topic}: {e}"),
            }
        }
    }
    producer
        .flush(Duration::from_secs(30))
        .expect("records are produced");
}

/// Creates `topic` with `partitions` partitions holding `per_partition` records each
/// (`topic/p/i`); returns them.
fn fill(mock: &Mock, topic: &str, partitions: i32, per_partition: usize) -> Vec<Rec> {
    mock.create_topic(topic, partitions, 1).expect("topic");
    let mut records = Vec::new();
    let mut expected = Vec::new();
    for i in 0..per_partition {
        for p in 0..partitions {
            let v = format!("{topic}/{p}/{i}");
            records.push((p, v.clone(), None));
            expected.push((topic.to_string(), p, i as i64, v));
        }
    }
    produce(&mock.bootstrap_servers(), topic, &records);
    expected
}

/// The fresh start's readers at parallelism `p`.
fn fresh<T: Send + 'static>(source: &KafkaSource<T>, p: u32) -> Vec<Box<dyn SourceReader<T>>> {
    let splits = source.create_splits(p).expect("splits");
    (0..p)
        .map(|i| {
            let mine = splits
                .iter()
                .enumerate()
                .filter(|(j, _)| *j as u32 % p == i)
                .map(|(_, s)| s.clone())
                .collect();
            source.create_reader(i, p, mine).expect("reader")
        })
        .collect()
}

/// Restores `snapshots` (one per old subtask) at parallelism `p`, as the runtime does.
fn restore<T: Send + 'static>(
    source: &KafkaSource<T>,
    snapshots: Vec<Vec<Vec<u8>>>,
    p: u32,
) -> Vec<Box<dyn SourceReader<T>>> {
    let all: Vec<Vec<u8>> = snapshots.into_iter().flatten().collect();
    let n = all.len();
    (0..p as usize)
        .map(|i| {
            let share = all[n * i / p as usize..n * (i + 1) / p as usize].to_vec();
            source
                .create_reader(i as u32, p, share)
                .expect("restored reader")
        })
        .collect()
}

/// Polls `reader` (batches of at most `max`) until it is exhausted or `enough` holds for
/// what it emitted; returns that and whether it was exhausted. Checks that every batch is
/// of the one split `last_split` names.
fn read(
    reader: &mut dyn SourceReader<Rec>,
    max: usize,
    mut enough: impl FnMut(&[Rec]) -> bool,
) -> (Vec<Rec>, bool) {
    let deadline = Instant::now() + DEADLINE;
    let mut out = Vec::new();
    let mut batch = Vec::new();
    let mut split_of: BTreeMap<(String, i32), usize> = BTreeMap::new();
    loop {
        if enough(&out) {
            return (out, false);
        }
        let status = reader.poll(&mut batch, max).expect("poll");
        assert!(batch.len() <= max);
        if let Some(first) = batch.first() {
            let split = reader.last_split();
            for r in &batch {
                assert_eq!(
                    (&r.0, r.1),
                    (&first.0, first.1),
                    "a batch of two partitions"
                );
            }
            let known = split_of.entry((first.0.clone(), first.1)).or_insert(split);
            assert_eq!(*known, split, "a partition changed its split index");
            assert!(split < reader.split_count());
        }
        out.append(&mut batch);
        if status == SourceStatus::Exhausted {
            return (out, true);
        }
        assert!(
            Instant::now() < deadline,
            "read no more after {} records",
            out.len()
        );
        if matches!(status, SourceStatus::IdleUntil(_)) {
            std::thread::park_timeout(Duration::from_millis(1));
        }
    }
}

fn read_to_end(reader: &mut dyn SourceReader<Rec>, max: usize) -> Vec<Rec> {
    let (out, exhausted) = read(reader, max, |_| false);
    assert!(exhausted);
    out
}

fn sorted(mut v: Vec<Rec>) -> Vec<Rec> {
    v.sort();
    v
}

#[test]
fn a_fresh_start_assigns_each_partition_to_one_subtask_at_parallelism_1_2_3() {
    let mock = mock(1);
    let mut all = fill(&mock, "a", 5, 20);
    all.extend(fill(&mock, "b", 3, 20));
    let source = tagged(config(&mock, &["b", "a", "a"]));
    for p in [1u32, 2, 3] {
        let mut got = Vec::new();
        for (i, mut reader) in fresh(&source, p).into_iter().enumerate() {
            let records = read_to_end(reader.as_mut(), 7);
            let partitions: BTreeSet<(String, i32)> =
                records.iter().map(|r| (r.0.clone(), r.1)).collect();
            // Topic k (sorted: a = 0, b = 1), partition q: subtask (k + q) mod p.
            let want: BTreeSet<(String, i32)> = [("a", 0u32, 5), ("b", 1, 3)]
                .iter()
                .flat_map(|&(t, k, n)| (0..n).map(move |q| (t.to_string(), k, q)))
                .filter(|(_, k, q)| (k + *q as u32) % p == i as u32)
                .map(|(t, _, q)| (t, q))
                .collect();
            assert_eq!(partitions, want, "p={p}, subtask {i}");
            assert_eq!(reader.split_count(), want.len());
            assert!((0..reader.split_count()).all(|s| reader.split_finished(s)));
            got.extend(records);
        }
        assert_eq!(sorted(got), sorted(all.clone()), "p={p}");
    }
}

/// Commits `offsets` (partition, offset) of `topic` for `group`.
fn commit(brokers: &str, group: &str, topic: &str, offsets: &[(i32, i64)]) {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for &(p, o) in offsets {
        tpl.add_partition_offset(topic, p, Offset::Offset(o))
            .expect("partition");
    }
    c.commit(&tpl, CommitMode::Sync).expect("commit");
}

/// Offsets of the first record read per partition (None: nothing read).
fn first_offsets(records: &[Rec], partitions: i32) -> Vec<Option<i64>> {
    (0..partitions)
        .map(|p| records.iter().filter(|r| r.1 == p).map(|r| r.2).min())
        .collect()
}

#[test]
fn every_start_position_and_restored_offsets_winning() {
    let mock = mock(1);
    let brokers = mock.bootstrap_servers();
    fill(&mock, "t", 3, 10);
    commit(&brokers, "g", "t", &[(0, 4), (2, 7)]);
    let start = |start: StartFrom| {
        let mut c = config(&mock, &["t"]);
        c.start = start;
        c.group_id = Some("g".into());
        let source = tagged(c);
        let mut reader = fresh(&source, 1).remove(0);
        let records = read_to_end(reader.as_mut(), 100);
        (first_offsets(&records, 3), records.len())
    };
    assert_eq!(
        start(StartFrom::Earliest),
        (vec![Some(0), Some(0), Some(0)], 30)
    );
    assert_eq!(start(StartFrom::Latest), (vec![None, None, None], 0));
    assert_eq!(
        start(StartFrom::Committed(OffsetReset::Earliest)),
        (vec![Some(4), Some(0), Some(7)], 6 + 10 + 3)
    );
    assert_eq!(
        start(StartFrom::Committed(OffsetReset::Latest)),
        (vec![Some(4), None, Some(7)], 6 + 3)
    );
    // The mock cluster answers no lookup by time (librdkafka's FIXME): "no record at or after
    // it", so every partition starts at its end. Tansu answers them: see the CLI tests.
    assert_eq!(start(StartFrom::Timestamp(0)), (vec![None, None, None], 0));

    // Latest, unbounded: only what is written after the start.
    let mut c = config(&mock, &["t"]);
    c.bounded = false;
    c.start = StartFrom::Latest;
    let source = tagged(c);
    let mut reader = fresh(&source, 1).remove(0);
    let (none, _) = read(reader.as_mut(), 100, |_| true);
    assert!(none.is_empty());
    produce(&brokers, "t", &[(1, "new".into(), None)]);
    let (records, _) = read(reader.as_mut(), 100, |r| !r.is_empty());
    assert_eq!(records, vec![("t".to_string(), 1, 10, "new".to_string())]);

    // A restored reader resumes at its offsets whatever the start position says.
    let snapshot = reader.snapshot().expect("snapshot");
    let mut c = config(&mock, &["t"]);
    c.start = StartFrom::Earliest;
    c.bounded = false;
    let mut restored = tagged(c).create_reader(0, 1, snapshot).expect("restored");
    produce(&brokers, "t", &[(2, "newer".into(), None)]);
    let (records, _) = read(restored.as_mut(), 100, |r| !r.is_empty());
    assert_eq!(records, vec![("t".to_string(), 2, 10, "newer".to_string())]);

    // Committed offsets need a group.
    let mut c = config(&mock, &["t"]);
    c.start = StartFrom::Committed(OffsetReset::Earliest);
    let err = tagged(c).create_splits(1).expect_err("no group");
    assert!(err.to_string().contains("no consumer group"), "{err}");
}

#[test]
fn start_positions_parse_from_their_names() {
    for s in [
        "earliest",
        "latest",
        "committed-or-earliest",
        "committed-or-latest",
        "timestamp:1700000000000",
    ] {
        assert_eq!(s.parse::<StartFrom>().map(|p| p.to_string()), Ok(s.into()));
    }
    assert_eq!(
        "committed".parse::<StartFrom>(),
        Ok(StartFrom::Committed(OffsetReset::Earliest))
    );
    for bad in ["", "begin", "timestamp:", "timestamp:-5", "timestamp:x"] {
        let e = bad.parse::<StartFrom>().expect_err("refused");
        assert!(e.contains("is not a start position"), "{e}");
    }
}

/// Reads `readers` round by round (a few batches each), snapshotting all of them after
/// `rounds` rounds; returns what they emitted before the snapshot and the snapshots.
fn run_until_snapshot(
    readers: &mut [Box<dyn SourceReader<Rec>>],
    rounds: usize,
) -> (Vec<Rec>, Vec<Vec<Vec<u8>>>) {
    let mut emitted = Vec::new();
    for _ in 0..rounds {
        for r in readers.iter_mut() {
            let mut n = 0;
            let (records, _) = read(r.as_mut(), 3, |_| {
                n += 1;
                n > 2
            });
            emitted.extend(records);
        }
    }
    let snapshots = readers
        .iter()
        .map(|r| r.snapshot().expect("snapshot"))
        .collect();
    (emitted, snapshots)
}

#[test]
fn restores_and_rescaling_2_to_3_and_3_to_2_resume_without_loss_or_duplicates() {
    let mock = mock(1);
    let all = fill(&mock, "t", 6, 40);
    let source = tagged(config(&mock, &["t"]));
    let mut readers = fresh(&source, 2);
    let (mut committed, snapshots) = run_until_snapshot(&mut readers, 4);
    // What they read after the snapshot is lost with the "crash"; the restore replays it.
    run_until_snapshot(&mut readers, 2);
    drop(readers);
    let mut readers = restore(&source, snapshots, 3);
    let (more, snapshots) = run_until_snapshot(&mut readers, 3);
    committed.extend(more);
    drop(readers);
    let mut readers = restore(&source, snapshots, 2);
    for r in &mut readers {
        committed.extend(read_to_end(r.as_mut(), 5));
    }
    assert_eq!(sorted(committed), sorted(all));
}

/// The state a fresh start at parallelism `stride` would have made when `topic` had `known`
/// partitions (all read to `next` = 0): its partition splits and discovery splits, per
/// subtask. Lets a test add partitions to history, which the mock cluster cannot do live.
fn history(topic: &str, known: i32, stride: u32) -> Vec<Vec<Vec<u8>>> {
    (0..stride)
        .map(|s| {
            let mut splits: Vec<Split> = (0..known)
                .filter(|p| *p as u32 % stride == s)
                .map(|partition| {
                    Split::Partition(PartitionSplit {
                        topic: topic.into(),
                        partition,
                        next: 0,
                        stop: None,
                    })
                })
                .collect();
            splits.push(Split::Discovery(DiscoverySplit {
                topic: topic.into(),
                topic_index: 0,
                known,
                stride,
                residue: s,
            }));
            vec![postcard::to_stdvec(&splits).expect("encode")]
        })
        .collect()
}

fn unbounded(mock: &Mock, topic: &str) -> KafkaSource<Rec> {
    let mut c = config(mock, &[topic]);
    c.bounded = false;
    c.discovery_interval = Some(Duration::from_millis(20));
    tagged(c)
}

/// Reads every reader round by round until `want` records were read in all.
fn read_all(readers: &mut [Box<dyn SourceReader<Rec>>], want: usize) -> Vec<Rec> {
    let deadline = Instant::now() + DEADLINE;
    let mut got = Vec::new();
    while got.len() < want {
        for r in readers.iter_mut() {
            let mut polls = 0;
            got.extend(
                read(r.as_mut(), 50, |_| {
                    polls += 1;
                    polls > 3
                })
                .0,
            );
        }
        assert!(Instant::now() < deadline, "read {} of {want}", got.len());
    }
    got
}

#[test]
fn partitions_added_while_running_are_discovered_and_read_once() {
    let mock = mock(1);
    let all = fill(&mock, "t", 7, 15);
    let source = unbounded(&mock, "t");
    // The job started at parallelism 2 when the topic had 3 partitions; 4 were added since.
    let mut readers = restore(&source, history("t", 3, 2), 2);
    let got = read_all(&mut readers, all.len());
    assert_eq!(sorted(got.clone()), sorted(all.clone()));
    // Each new partition went to the subtask whose discovery split claims it: p mod 2.
    for (i, r) in readers.iter().enumerate() {
        assert_eq!(r.split_count(), if i == 0 { 4 } else { 3 }, "subtask {i}");
    }
    // Nothing more comes, and a snapshot now knows all 7 partitions: a restore rescaled to 3
    // discovers nothing again.
    let snapshots: Vec<_> = readers.iter().map(|r| r.snapshot().unwrap()).collect();
    let extra = read_all(&mut readers, 0);
    assert!(extra.is_empty());
    let mut readers = restore(&source, snapshots, 3);
    produce(&mock.bootstrap_servers(), "t", &[(6, "late".into(), None)]);
    let got = read_all(&mut readers, 1);
    assert_eq!(got, vec![("t".to_string(), 6, 15, "late".to_string())]);
}

#[test]
fn subtasks_that_saw_different_partition_counts_never_read_a_partition_twice_after_a_rescale() {
    let mock = mock(1);
    let all = fill(&mock, "t", 6, 10);
    let source = unbounded(&mock, "t");
    // History: started at parallelism 2 with 2 partitions. Subtask 0 then saw 6 partitions
    // and claimed 2 and 4 (read to offset 3); subtask 1 had not looked yet (still knows 2).
    let mut snapshots = history("t", 2, 2);
    let mut sub0: Vec<Split> = postcard::from_bytes(&snapshots[0][0]).unwrap();
    for s in &mut sub0 {
        if let Split::Discovery(d) = s {
            d.known = 6;
        }
    }
    for partition in [2, 4] {
        sub0.push(Split::Partition(PartitionSplit {
            topic: "t".into(),
            partition,
            next: 3,
            stop: None,
        }));
    }
    snapshots[0] = sub0
        .into_iter()
        .map(|s| postcard::to_stdvec(std::slice::from_ref(&s)).unwrap())
        .collect();
    snapshots[1] = postcard::from_bytes::<Vec<Split>>(&snapshots[1][0])
        .unwrap()
        .into_iter()
        .map(|s| postcard::to_stdvec(std::slice::from_ref(&s)).unwrap())
        .collect();
    // Rescaled to 3: whoever holds subtask 1's discovery split claims 3 and 5, nobody 2 or 4
    // again.
    let mut readers = restore(&source, snapshots, 3);
    let want: Vec<Rec> = all
        .into_iter()
        .filter(|r| !(r.1 == 2 || r.1 == 4) || r.2 >= 3)
        .collect();
    let got = read_all(&mut readers, want.len());
    let extra = read_all(&mut readers, 0);
    assert!(extra.is_empty(), "{extra:?}");
    assert_eq!(sorted(got), sorted(want));
}

#[test]
fn a_lost_broker_and_injected_fetch_errors_are_survived() {
    let mock = mock(3);
    let all = fill(&mock, "t", 6, 300);
    let source = tagged(config(&mock, &["t"]));
    let mut readers = fresh(&source, 2);
    let (mut got, _) = run_until_snapshot(&mut readers, 2);
    // Every partition's leader goes down, then comes back.
    for broker in 1..=3 {
        mock.broker_down(broker).expect("broker down");
    }
    let (more, _) = run_until_snapshot(&mut readers, 3);
    got.extend(more);
    for broker in 1..=3 {
        mock.broker_up(broker).expect("broker up");
    }
    // Retriable errors on the next fetches.
    mock.request_errors(
        RDKafkaApiKey::Fetch,
        &[
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        ],
    );
    for r in &mut readers {
        got.extend(read_to_end(r.as_mut(), 50));
    }
    assert_eq!(sorted(got), sorted(all));
}

#[test]
fn an_unreachable_broker_or_a_missing_topic_is_one_clear_error() {
    // Nothing listens on port 1.
    let mut c = KafkaSourceConfig::new("127.0.0.1:1", vec!["t".into()]);
    c.request_timeout = Duration::from_secs(20);
    let t0 = Instant::now();
    let err = tagged(c).create_splits(2).expect_err("unreachable");
    assert_eq!(
        err.to_string(),
        "cannot connect to any Kafka broker of 127.0.0.1:1 (is it running?)"
    );
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());

    let mock = mock(1);
    fill(&mock, "t", 1, 1);
    let source = tagged(config(&mock, &["t", "missing"]));
    let err = source.create_splits(1).expect_err("missing topic");
    assert_eq!(
        err.to_string(),
        format!(
            "Kafka topic 'missing' does not exist on {}",
            mock.bootstrap_servers()
        )
    );
    // A restored reader checks too.
    let mut c = config(&mock, &["t"]);
    c.topics = vec!["t".into()];
    let snapshot = history("gone", 1, 1).remove(0);
    let err = tagged(c).create_reader(0, 1, snapshot).err().expect("gone");
    assert!(
        err.to_string()
            .contains("Kafka topic 'gone' does not exist"),
        "{err}"
    );
}

/// The group's committed offsets of `topic`'s partitions `0..n` (None: none).
fn committed(brokers: &str, group: &str, topic: &str, n: i32) -> Vec<Option<i64>> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", group)
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..n {
        tpl.add_partition(topic, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(5))
        .expect("committed offsets");
    (0..n)
        .map(|p| match got.find_partition(topic, p).map(|e| e.offset()) {
            Some(Offset::Offset(o)) => Some(o),
            _ => None,
        })
        .collect()
}

fn positions(records: &[Rec], n: i32) -> Vec<Option<i64>> {
    (0..n)
        .map(|p| {
            Some(
                records
                    .iter()
                    .filter(|r| r.1 == p)
                    .map(|r| r.2 + 1)
                    .max()
                    .unwrap_or(0),
            )
        })
        .collect()
}

#[test]
fn a_completed_checkpoint_commits_its_snapshots_offsets_back_to_the_group() {
    let mock = mock(1);
    let brokers = mock.bootstrap_servers();
    fill(&mock, "t", 2, 100);
    let mut c = config(&mock, &["t"]);
    c.group_id = Some("monitor".into());
    let mut reader = fresh(&tagged(c), 1).remove(0);
    let mut seen = Vec::new();
    let step = |reader: &mut Box<dyn SourceReader<Rec>>, seen: &mut Vec<Rec>| {
        let mut polls = 0;
        seen.extend(
            read(reader.as_mut(), 10, |_| {
                polls += 1;
                polls > 3
            })
            .0,
        );
        positions(seen, 2)
    };
    let at_1 = step(&mut reader, &mut seen);
    reader.snapshot().unwrap();
    reader.snapshot_taken(1);
    let at_2 = step(&mut reader, &mut seen);
    reader.snapshot().unwrap();
    reader.snapshot_taken(2);
    step(&mut reader, &mut seen);
    assert_ne!(at_1, at_2);
    assert_eq!(committed(&brokers, "monitor", "t", 2), vec![None, None]);
    let wait_for = |want: &Vec<Option<i64>>, reader: &mut Box<dyn SourceReader<Rec>>| {
        let deadline = Instant::now() + DEADLINE;
        while committed(&brokers, "monitor", "t", 2) != *want {
            // The reader serves librdkafka's commit results as it polls.
            reader.poll(&mut Vec::new(), 1).unwrap();
            assert!(
                Instant::now() < deadline,
                "offsets {want:?} never committed"
            );
        }
    };
    // Checkpoint 1 completes: its snapshot's offsets, not the reader's current ones.
    reader.notify_complete(1).unwrap();
    wait_for(&at_1, &mut reader);
    reader.notify_complete(2).unwrap();
    wait_for(&at_2, &mut reader);
    // A completion of a checkpoint this reader took no snapshot for commits nothing.
    reader.notify_complete(3).unwrap();
    assert_eq!(committed(&brokers, "monitor", "t", 2), at_2);
}

mod event_time {
    //! Per-partition watermarks through the runtime: a subtask reading a partition of late
    //! timestamps and one of early ones loses no record to lateness, and an empty partition
    //! turns idle instead of holding event time back.

    use super::*;
    use crate::api::{StreamEnv, WatermarkStrategy};
    use crate::config::JobConfig;
    use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkWriter};
    use crate::runtime::{run_job, JobStatus, RunOptions};
    use crate::window::WindowAssigner;

    /// (timestamp, count)
    type Tick = (i64, u64);

    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<Tick>>>);

    struct CollectWriter(Arc<Mutex<Vec<Tick>>>);

    impl Sink<Tick> for Collect {
        fn guarantee(&self) -> SinkGuarantee {
            SinkGuarantee::None
        }
        fn create_writer(&self, _: SinkContext) -> TaskResult<Box<dyn SinkWriter<Tick>>> {
            Ok(Box::new(CollectWriter(self.0.clone())))
        }
    }

    impl SinkWriter<Tick> for CollectWriter {
        fn write(&mut self, batch: &mut Vec<Tick>) -> TaskResult {
            self.0.lock().map_err(TaskError::msg)?.append(batch);
            Ok(())
        }
        fn pre_commit(&mut self, _: u64) -> TaskResult<Vec<Vec<u8>>> {
            Ok(Vec::new())
        }
        fn commit(&mut self, _: u64) -> TaskResult {
            Ok(())
        }
        fn finish(&mut self) -> TaskResult {
            Ok(())
        }
    }

    const WINDOW_MS: i64 = 1_000;

    /// Counts per 1 s window of the source's Kafka timestamps, at parallelism 1.
    fn job(
        config: KafkaSourceConfig,
        idleness: Option<Duration>,
        out: Collect,
    ) -> crate::api::JobGraph {
        let env = StreamEnv::new();
        let source = KafkaSource::new(config, |m: &KafkaMessage<'_>| Some((m.timestamp?, 1u64)));
        let mut strategy = WatermarkStrategy::monotonous(|r: &Tick| r.0);
        if let Some(t) = idleness {
            strategy = strategy.with_idleness(t);
        }
        env.source_with_watermarks(source, strategy)
            .uid("source")
            .window_all(WindowAssigner::tumbling(Duration::from_millis(
                WINDOW_MS as u64,
            )))
            .reduce(|a: &Tick, b: &Tick| (a.0.min(b.0), a.1 + b.1))
            .uid("window")
            .sink(out)
            .uid("sink");
        env.build("kafka-event-time").expect("job graph")
    }

    /// Watermarks every `interval` (zero: after every poll).
    fn options(interval: Duration) -> RunOptions {
        RunOptions {
            config: JobConfig {
                parallelism: 1,
                auto_watermark_interval: interval,
                ..JobConfig::default()
            },
            ..RunOptions::default()
        }
    }

    /// Window start → count.
    fn windows(ticks: &[Tick]) -> BTreeMap<i64, u64> {
        let mut m = BTreeMap::new();
        for t in ticks {
            *m.entry(t.0 - t.0.rem_euclid(WINDOW_MS)).or_default() += t.1;
        }
        m
    }

    #[test]
    fn each_partition_has_its_own_watermark() {
        let mock = mock(1);
        mock.create_topic("t", 2, 1).unwrap();
        // Partition 0 is far ahead in event time; partition 1 behind. One subtask reads both
        // in interleaved batches: with a watermark over the subtask's records rather than per
        // partition, partition 1's records would come after it and be dropped as late.
        let mut records = Vec::new();
        for i in 0..3_000i64 {
            records.push((0, format!("a{i}"), Some(1_000_000 + i * 10)));
            // (librdkafka stamps a record of timestamp 0 with the wall clock.)
            records.push((1, format!("b{i}"), Some(1 + i * 10)));
        }
        produce(&mock.bootstrap_servers(), "t", &records);
        let expected = windows(
            &records
                .iter()
                .map(|r| (r.2.unwrap_or_default(), 1))
                .collect::<Vec<_>>(),
        );
        let out = Collect::default();
        let graph = job(config(&mock, &["t"]), None, out.clone());
        // A watermark after every batch, so one made from both partitions' records would
        // overtake partition 1's.
        run_job(&graph, options(Duration::ZERO)).expect("the bounded job finishes");
        let got = out.0.lock().unwrap().clone();
        assert_eq!(windows(&got), expected);
        // Each window fired once.
        assert_eq!(got.len(), expected.len());
    }

    #[test]
    fn an_empty_partition_turns_idle_instead_of_holding_back_event_time() {
        let mock = mock(1);
        mock.create_topic("t", 2, 1).unwrap();
        let mut c = config(&mock, &["t"]);
        c.bounded = false;
        let out = Collect::default();
        let graph = job(c, Some(Duration::from_millis(100)), out.clone());
        let status = JobStatus::new("job".into(), "kafka-event-time".into(), Vec::new());
        let opts = RunOptions {
            status: Some(status.clone()),
            ..options(Duration::from_millis(5))
        };
        let runner = std::thread::spawn(move || run_job(&graph, opts));
        // Partition 0 gets a record every few ms (event time 100 ms apart), partition 1
        // nothing: only idleness lets the watermark follow partition 0.
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let brokers = mock.bootstrap_servers();
        let producing = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut i = 0i64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    produce(&brokers, "t", &[(0, format!("a{i}"), Some(1 + i * 100))]);
                    i += 1;
                    std::thread::park_timeout(Duration::from_millis(2));
                }
            })
        };
        let deadline = Instant::now() + DEADLINE;
        let want: BTreeMap<i64, u64> = (0..4).map(|w| (w * WINDOW_MS, 10)).collect();
        let fired = loop {
            let got = windows(&out.0.lock().unwrap());
            if want.iter().all(|(w, n)| got.get(w) == Some(n)) {
                break true;
            }
            if Instant::now() >= deadline || runner.is_finished() {
                break false;
            }
            std::thread::park_timeout(Duration::from_millis(5));
        };
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        status.request_cancel();
        let _ = producing.join();
        let _ = runner.join();
        assert!(fired, "windows never fired: {:?}", out.0.lock().unwrap());
    }
}
