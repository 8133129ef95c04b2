//! SQL's `kafka` and `upsert-kafka` connectors end to end, against a real Kafka-protocol
//! broker with transactions: Tansu from `scripts/service-kafka` on 127.0.0.1:59092
//! (`CAIRN_TEST_KAFKA_BROKERS` points the tests at another broker). A missing broker fails
//! the tests that need one, naming the script that starts it.
//!
//! A TUMBLE window aggregation reads a csv topic with a WATERMARK (per-partition watermarks)
//! and writes json into a topic exactly once, SIGKILLed at every checkpoint failpoint and
//! resumed; its committed output (read from the raw log as a read-committed consumer must
//! see it) is a reference computed here, every row once. A two-level GROUP BY writes its
//! changelog into an upsert-kafka topic: the last record per key (tombstones deleting) is the
//! reference table. Bad tables are one-line errors naming what is wrong.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::{Command, Stdio};

use cairn::connectors::kafka::wire::{Marker, Record, TopicLog, WireClient};
use cairn::sql::types::write_timestamp;
use common::*;
use std::time::{Duration, Instant};

/// A client of the test broker; fails the test if no broker answers.
fn broker() -> WireClient {
    let mut w = WireClient::new(&kafka_brokers(), Duration::from_secs(20));
    if let Err(e) = w.topic_metadata("cairn-probe", false) {
        panic!(
            "no Kafka broker answers at {} ({e}): start it with scripts/service-kafka (or point CAIRN_TEST_KAFKA_BROKERS at one)",
            kafka_brokers()
        );
    }
    w
}

/// A new topic of `partitions` partitions, named after `what` and unique to this run.
fn new_topic(w: &mut WireClient, what: &str, partitions: i32) -> String {
    let topic = unique_topic(what);
    w.create_topic(&topic, partitions).unwrap();
    topic
}

/// `cairn sql -e SCRIPT -p P`.
fn sql(script: &str, parallelism: u32) -> Command {
    let mut cmd = cairn();
    cmd.args(["sql", "-e", script, "-p", &parallelism.to_string()])
        .stdout(Stdio::null());
    cmd
}

/// The committed records of `topic`, partition by partition in offset order.
fn committed(w: &mut WireClient, topic: &str) -> (TopicLog, Vec<Record>) {
    let log = w.read_topic(topic).unwrap();
    let records = log.committed_records().unwrap();
    (log, records)
}

/// A record's value as JSON.
fn json_value(r: &Record) -> serde_json::Value {
    let value = r.value.as_ref().expect("a value");
    serde_json::from_slice(value).unwrap_or_else(|e| {
        panic!(
            "value {:?} is not JSON: {e}",
            String::from_utf8_lossy(value)
        )
    })
}

fn timestamp(ms: i64) -> String {
    let mut s = String::new();
    write_timestamp(&mut s, ms);
    s
}

/// Events of the kill test, over one partition per subtask.
const EVENTS: u64 = 3_000_000;
const EVENT_PARTITIONS: i32 = 2;
const KEYS: u64 = 20;
/// Event time of the first event; event `i` is `i` ms later.
const BASE_MS: i64 = 1_700_000_000_000;
const WINDOW_MS: i64 = 10_000;
/// The most killed runs before the test gives up on its faults landing where it means.
const KILL_RUNS_MAX: usize = 16;

/// Event `i`: its key, amount (never 0) and event time.
fn event(i: u64) -> (String, i64, i64) {
    (
        format!("k{}", i * 7919 % KEYS),
        (i * 31 % 101) as i64 + 1,
        BASE_MS + i as i64,
    )
}

/// Fills `topic` with the events as csv lines, round-robin over its partitions (each
/// partition in event-time order), then ends every partition with a row of amount 0 (which
/// the query filters out) 2 s of event time after the last event, so every partition's
/// watermark passes the end of the last window and the job commits every window.
fn fill_events(topic: &str, events: u64, partitions: i32) {
    let brokers = kafka_brokers();
    let records = (0..events).map(|i| {
        let (k, amount, ts) = event(i);
        (
            (i % partitions as u64) as i32,
            format!("{k},{amount},{}", timestamp(ts)),
        )
    });
    cairn::connectors::kafka::produce(&brokers, topic, records).unwrap_or_else(|e| panic!("{e}"));
    let end = timestamp(BASE_MS + events as i64 + 2_000);
    for p in 0..partitions {
        cairn::connectors::kafka::produce(&brokers, topic, [(p, format!("seal,0,{end}"))])
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Per key and 10 s window: the events and their total amount.
type Windows = BTreeMap<(String, String, String), (i64, i64)>;

fn reference_windows(events: u64) -> Windows {
    let mut windows = Windows::new();
    for i in 0..events {
        let (k, amount, ts) = event(i);
        let start = ts - ts.rem_euclid(WINDOW_MS);
        let w = windows
            .entry((k, timestamp(start), timestamp(start + WINDOW_MS)))
            .or_default();
        w.0 += 1;
        w.1 += amount;
    }
    windows
}

/// The committed window rows; panics on a row committed twice.
fn committed_windows(records: &[Record]) -> Windows {
    let mut windows = Windows::new();
    for r in records {
        let v = json_value(r);
        let text = |f: &str| {
            v[f].as_str()
                .unwrap_or_else(|| panic!("{f} in {v}"))
                .to_string()
        };
        let number = |f: &str| v[f].as_i64().unwrap_or_else(|| panic!("{f} in {v}"));
        let key = (text("k"), text("window_start"), text("window_end"));
        let row = (number("cnt"), number("total"));
        if let Some(before) = windows.insert(key.clone(), row) {
            panic!("window {key:?} committed twice: {before:?}, then {row:?}");
        }
    }
    windows
}

/// Fails the test at the first window that differs.
fn assert_same_windows(got: &Windows, expected: &Windows) {
    assert_eq!(got.len(), expected.len(), "windows committed");
    let first_difference = expected.iter().find(|(k, v)| got.get(*k) != Some(*v));
    assert!(
        first_difference.is_none(),
        "first difference: expected {first_difference:?}, got {:?}",
        first_difference.map(|(k, _)| got.get(k))
    );
}

/// The window aggregation from `input` into `output`; `bounded` reads `input` to the end
/// offsets of the fresh start.
fn window_script(input: &str, output: &str, prefix: &str, bounded: bool) -> String {
    let brokers = kafka_brokers();
    let bounded = if bounded {
        ", 'scan.bounded.mode' = 'latest-offset'"
    } else {
        ""
    };
    format!(
        "SET 'pipeline.auto-watermark-interval' = '10ms';
CREATE TABLE events (k STRING, amount BIGINT, ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH (
  'connector' = 'kafka', 'topic' = '{input}', 'properties.bootstrap.servers' = '{brokers}',
  'properties.group.id' = '{prefix}-group', 'scan.startup.mode' = 'earliest-offset',
  'format' = 'csv'{bounded});
CREATE TABLE totals (k STRING, window_start TIMESTAMP(3), window_end TIMESTAMP(3), cnt BIGINT, total BIGINT) WITH (
  'connector' = 'kafka', 'topic' = '{output}', 'properties.bootstrap.servers' = '{brokers}',
  'value.format' = 'json', 'sink.delivery-guarantee' = 'exactly-once',
  'sink.transactional-id-prefix' = '{prefix}');
INSERT INTO totals
SELECT k, window_start, window_end, COUNT(*), SUM(amount)
FROM TABLE(TUMBLE(TABLE events, DESCRIPTOR(ts), INTERVAL '10' SECOND))
WHERE amount > 0
GROUP BY k, window_start, window_end;"
    )
}

/// A TUMBLE window aggregation from an unbounded kafka topic into a kafka topic exactly once,
/// at parallelism 2, SIGKILLed at each checkpoint failpoint (in a seeded order, each 16 to 19
/// checkpoints of 50 ms on) and resumed from the latest checkpoint: no window is ever committed
/// twice. The kills go on until every failpoint was hit and one kill fell while windows were
/// being committed (some, not all). A last run commits the rest and is stopped with a
/// savepoint: the committed windows are the reference, each once, and no transaction is left
/// open.
///
/// The source is unbounded, so no killed run can end before its failpoint however fast the
/// machine reads; how far the killed runs get is up to the machine, hence the loop. Each
/// subtask reads one partition: Tansu answers a fetch of several partitions with the records
/// of the first only, and with none once that one is read to its end, so a subtask with two
/// unbounded partitions would stall there (a real Kafka broker fills every partition's share).
/// Several partitions per subtask are the next test's.
#[test]
fn a_window_aggregation_from_kafka_into_kafka_exactly_once_survives_sigkills_at_failpoints() {
    let mut w = broker();
    let input = new_topic(&mut w, "sql-events", EVENT_PARTITIONS);
    let output = new_topic(&mut w, "sql-totals", 3);
    fill_events(&input, EVENTS, EVENT_PARTITIONS);
    let expected = reference_windows(EVENTS);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let script = window_script(&input, &output, &unique_topic("sql-eo"), false);
    let run = || {
        let mut cmd = sql(&script, 2);
        cmd.arg("--checkpoint-dir").arg(&ck).args([
            "--checkpoint-interval",
            "50ms",
            "--from",
            "latest",
        ]);
        cmd
    };
    let mut next = seeded(11);
    let points = shuffled_failpoints(&mut next);
    let mut hit = BTreeSet::new();
    let mut killed_while_committing = false;
    for i in 0.. {
        if hit.len() == points.len() && killed_while_committing {
            break;
        }
        assert!(
            i < KILL_RUNS_MAX,
            "after {i} runs: failpoints hit {hit:?}, a kill while windows were being committed: {killed_while_committing}"
        );
        let point = points[i % points.len()];
        let base = checkpoint_progress(&ck).map_or(0, |(_, highest)| highest);
        let at = base + 16 + next() % 4;
        let marker = tmp.path().join(format!("marker-{i}"));
        let log = tmp.path().join(format!("run-{i}.log"));
        let (name, id) = kill_at_failpoint(run(), point, at, &marker, &log)
            .unwrap_or_else(|e| panic!("run {i}: {e}"));
        assert_eq!(name, point, "run {i} stopped at another point");
        assert!(id >= at, "{point} fired at {id}, armed for {at}");
        let completed = checkpoint_progress(&ck).map_or(0, |(c, _)| c);
        match point {
            "checkpoint-completed" => assert_eq!(completed, id, "{point} {id}"),
            "sink-committing" => assert!(completed >= id, "{point} {id}"),
            _ => assert!(completed < id, "{point} {id}: {completed} completed"),
        }
        // What is committed so far is part of the reference, each window once.
        let (_, records) = committed(&mut w, &output);
        let so_far = committed_windows(&records);
        for (key, row) in &so_far {
            assert_eq!(expected.get(key), Some(row), "after {point}: {key:?}");
        }
        killed_while_committing |= !so_far.is_empty() && so_far.len() < expected.len();
        hit.insert(point);
    }
    let savepoints = tmp.path().join("savepoints");
    let mut last = Watched::spawn(run().arg("--savepoint-on-exit").arg(&savepoints));
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let so_far = committed_windows(&committed(&mut w, &output).1);
        if so_far.len() >= expected.len() {
            break;
        }
        last.assert_running();
        if Instant::now() >= deadline {
            let missing: Vec<_> = expected
                .keys()
                .filter(|k| !so_far.contains_key(*k))
                .take(5)
                .collect();
            panic!(
                "the last run committed {} of {} windows in time; missing e.g. {missing:?}",
                so_far.len(),
                expected.len()
            );
        }
        std::thread::park_timeout(Duration::from_millis(100));
    }
    last.terminate();
    last.wait_for_line("savepoint stored in ", deadline);
    let (status, stderr) = last.wait(deadline);
    assert!(status.success(), "the stopped run must succeed: {stderr}");
    assert!(stderr.contains("restored from "), "{stderr}");
    let (log, records) = committed(&mut w, &output);
    assert!(
        log.transactions().iter().all(|t| t.outcome.is_some()),
        "transactions left open at the end"
    );
    assert!(
        log.transactions()
            .iter()
            .any(|t| t.outcome == Some(Marker::Abort)),
        "no SIGKILL left a transaction to abort"
    );
    let got = committed_windows(&records);
    assert_same_windows(&got, &expected);
}

/// One subtask reads four partitions, each in event-time order, to their end: the windows
/// are the reference. Tansu hands the subtask one partition after another (see above), so
/// with one watermark per subtask instead of per partition, the later partitions' records
/// would all be late and dropped.
#[test]
fn a_subtask_reading_several_partitions_keeps_a_watermark_per_partition() {
    const SMALL: u64 = 400_000;
    let mut w = broker();
    let input = new_topic(&mut w, "sql-events-four", 4);
    let output = new_topic(&mut w, "sql-totals-four", 1);
    fill_events(&input, SMALL, 4);
    let script = window_script(&input, &output, &unique_topic("sql-four"), true);
    run_ok(&mut sql(&script, 1));
    let (_, records) = committed(&mut w, &output);
    let got = committed_windows(&records);
    let expected = reference_windows(SMALL);
    assert_same_windows(&got, &expected);
}

/// A two-level GROUP BY (keys per count: every update of the inner count retracts a row of
/// the outer one, whose groups end deleted) into an upsert-kafka table at parallelism 2: the
/// topic's last record per key, tombstones deleting, is the reference table; keys and values
/// are json of the key columns and of the whole row.
#[test]
fn a_changelog_into_an_upsert_kafka_table_leaves_the_latest_row_per_key() {
    let mut w = broker();
    let topic = new_topic(&mut w, "sql-upsert", 3);
    let (rows, groups) = (30_000u64, 97u64);
    let script = format!(
        "CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE TABLE per_count (cnt BIGINT, keys BIGINT, PRIMARY KEY (cnt) NOT ENFORCED) WITH (
  'connector' = 'upsert-kafka', 'topic' = '{topic}', 'properties.bootstrap.servers' = '{}',
  'key.format' = 'json', 'value.format' = 'json');
INSERT INTO per_count
SELECT cnt, COUNT(*) FROM (SELECT id % {groups} AS k, COUNT(*) AS cnt FROM numbers GROUP BY id % {groups}) GROUP BY cnt;",
        kafka_brokers()
    );
    run_ok(&mut sql(&script, 2));
    let (_, records) = committed(&mut w, &topic);
    let mut table: HashMap<i64, i64> = HashMap::new();
    let mut tombstones = 0;
    for r in &records {
        let key: serde_json::Value = serde_json::from_slice(r.key.as_ref().expect("a key"))
            .unwrap_or_else(|e| panic!("key {:?} is not JSON: {e}", r.key));
        let cnt = key["cnt"].as_i64().unwrap_or_else(|| panic!("key {key}"));
        assert_eq!(key.as_object().map(|o| o.len()), Some(1), "key {key}");
        if r.value.is_none() {
            tombstones += 1;
            table.remove(&cnt);
            continue;
        }
        let value = json_value(r);
        assert_eq!(
            value["cnt"].as_i64(),
            Some(cnt),
            "value {value} under key {key}"
        );
        let keys = value["keys"]
            .as_i64()
            .unwrap_or_else(|| panic!("value {value}"));
        table.insert(cnt, keys);
    }
    let mut expected: HashMap<i64, i64> = HashMap::new();
    for k in 0..groups {
        *expected
            .entry((0..rows).filter(|id| id % groups == k).count() as i64)
            .or_default() += 1;
    }
    assert!(
        tombstones > 0,
        "no group was deleted: {} records",
        records.len()
    );
    assert_eq!(
        table,
        expected,
        "{} records, {tombstones} tombstones",
        records.len()
    );
}

/// Runs `cairn sql -e SCRIPT`, which must fail with exit code 1 and one line of error;
/// returns the line.
fn refused(script: &str) -> String {
    let out = cairn().args(["sql", "-e", script]).output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(1), "{script}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{script}: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

#[test]
fn bad_kafka_tables_are_one_line_errors_naming_what_is_wrong() {
    let numbers = "CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '10');\n";
    let kafka = "'connector' = 'kafka', 'properties.bootstrap.servers' = '127.0.0.1:1'";
    let upsert = "'connector' = 'upsert-kafka', 'properties.bootstrap.servers' = '127.0.0.1:1', 'topic' = 't', 'key.format' = 'json', 'value.format' = 'json'";
    let append = "INSERT INTO out_t SELECT id FROM numbers;";
    let changelog = "INSERT INTO out_t SELECT id % 3, COUNT(*) FROM numbers GROUP BY id % 3;";
    let cases: &[(String, &[&str])] = &[
        (
            format!("CREATE TABLE out_t (id BIGINT) WITH ({kafka}, 'format' = 'csv');\n{append}"),
            &["table 'out_t'", "option 'topic' is required"],
        ),
        (
            format!("CREATE TABLE out_t (id BIGINT) WITH ({kafka}, 'topic' = 't', 'format' = 'csv', 'scan.startup.mod' = 'earliest-offset');\n{append}"),
            &["unsupported option 'scan.startup.mod'", "did you mean 'scan.startup.mode'"],
        ),
        (
            format!("CREATE TABLE out_t (id BIGINT, n BIGINT) WITH ({upsert});\n{changelog}"),
            &["table 'out_t'", "upsert-kafka table needs a PRIMARY KEY"],
        ),
        (
            format!("CREATE TABLE out_t (id BIGINT, n BIGINT) WITH ({kafka}, 'topic' = 't', 'format' = 'json');\n{changelog}"),
            &["table 'out_t'", "doesn't support consuming update changes", "upsert-kafka"],
        ),
        (
            format!("CREATE TABLE out_t (id BIGINT) WITH ({kafka}, 'topic' = 't', 'format' = 'csv', 'sink.delivery-guarantee' = 'twice');\n{append}"),
            &["option 'sink.delivery-guarantee'", "'twice'", "exactly-once"],
        ),
        (
            format!("CREATE TABLE out_t (id BIGINT) WITH ({kafka}, 'topic' = 't', 'format' = 'csv', 'sink.delivery-guarantee' = 'exactly-once');\n{append}"),
            &["option 'sink.transactional-id-prefix' is required"],
        ),
        (
            format!("CREATE TABLE src (id BIGINT) WITH ({kafka}, 'topic' = 't', 'format' = 'csv', 'scan.startup.mode' = 'specific-offsets');\nCREATE TABLE out_t (id BIGINT) WITH ('connector' = 'blackhole');\nINSERT INTO out_t SELECT id FROM src;"),
            &["'scan.startup.mode' = 'specific-offsets' is not supported"],
        ),
        (
            format!("CREATE TABLE src (id BIGINT) WITH ({kafka}, 'topic' = 't', 'format' = 'csv');\nCREATE TABLE out_t (id BIGINT) WITH ('connector' = 'blackhole');\nINSERT INTO out_t SELECT id FROM src;"),
            &["option 'properties.group.id' is required", "group-offsets"],
        ),
        (
            format!("CREATE TABLE src (id BIGINT, n BIGINT, PRIMARY KEY (id) NOT ENFORCED) WITH ({upsert});\nCREATE TABLE out_t (id BIGINT, n BIGINT) WITH ('connector' = 'blackhole');\nINSERT INTO out_t SELECT id, n FROM src;"),
            &["table 'src'", "reading an upsert-kafka table is not supported yet"],
        ),
    ];
    for (script, needles) in cases {
        let script = format!("{numbers}{script}");
        let line = refused(&script);
        for needle in *needles {
            assert!(
                line.contains(needle),
                "{script}\n-> {line}\n(expected {needle:?})"
            );
        }
    }
}
