//! wordcount reading a Kafka topic, end to end on the real binary.
//!
//! The broker is librdkafka's mock cluster in this test process: it outlives every `cairn`
//! child the test kills. The topic has several partitions filled with lines of words; the
//! job (`--kafka-bounded`, parallelism 2, exactly-once file sink) is stopped at each
//! failpoint of checkpoint progress, SIGKILLed there and resumed with `--from latest`; the
//! committed output must hold every word's counts 1..n exactly once and equal an undisturbed
//! run's. An unreachable broker and a missing topic are one clear error line.

mod common;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn::connectors::kafka::rdkafka::mocking::MockCluster;
use cairn::connectors::kafka::rdkafka::producer::{
    BaseProducer, BaseRecord, DefaultProducerContext, Producer,
};
use cairn::connectors::kafka::rdkafka::ClientConfig;
use common::*;

const TOPIC: &str = "lines";
const PARTITIONS: i32 = 4;
const LINES: u64 = 600_000;
const WORDS_PER_LINE: u64 = 4;
const KEYS: u64 = 5_000;

type Mock = MockCluster<'static, DefaultProducerContext>;

/// A mock cluster with `TOPIC` filled with `LINES` lines of words; returns it with each
/// word's number of occurrences.
fn filled_cluster() -> (Mock, HashMap<String, u64>) {
    let mock = MockCluster::new(1).expect("librdkafka's mock cluster starts");
    mock.create_topic(TOPIC, PARTITIONS, 1).expect("topic");
    let records = word_lines(LINES, WORDS_PER_LINE, KEYS)
        .enumerate()
        .map(|(i, line)| ((i as u64 % PARTITIONS as u64) as i32, line));
    cairn::connectors::kafka::produce(&mock.bootstrap_servers(), TOPIC, records)
        .expect("the topic is filled");
    (mock, generated_counts(LINES * WORDS_PER_LINE, KEYS))
}

fn wordcount(brokers: &str, out_dir: &Path, ck: &Path) -> Command {
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "-p", "2"])
        .args(["--kafka-brokers", brokers, "--kafka-input", TOPIC])
        .arg("--kafka-bounded")
        .arg("--output")
        .arg(out_dir)
        .arg("--checkpoint-dir")
        .arg(ck)
        .args(["--checkpoint-interval", "30ms", "--from", "latest"])
        .stdout(Stdio::null());
    cmd
}

/// Every committed line of `dir`, sorted.
fn sorted_lines(dir: &Path) -> Vec<(String, u64)> {
    let mut lines: Vec<(String, u64)> = committed_lines(dir)
        .into_iter()
        .flat_map(|(w, counts)| counts.into_iter().map(move |c| (w.clone(), c)))
        .collect();
    lines.sort();
    lines
}

#[test]
fn sigkill_at_failpoints_and_resume_keeps_exactly_once_and_equals_an_undisturbed_run() {
    let (mock, expected) = filled_cluster();
    let brokers = mock.bootstrap_servers();
    let tmp = tempfile::tempdir().unwrap();

    // The undisturbed run.
    let calm = tmp.path().join("calm");
    let out =
        run_ok(wordcount(&brokers, &calm.join("out"), &calm.join("ck")).stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("wordcount finished") && stderr.contains(&format!("{LINES} records")),
        "{stderr}"
    );
    assert_exactly_once(&calm.join("out"), &expected);

    // Killed at every failpoint, in a seeded order, each 2 or 3 checkpoints further.
    let (out_dir, ck) = (tmp.path().join("out"), tmp.path().join("ck"));
    let mut next = seeded(7);
    let mut newest: Option<u64> = None;
    let mut kills = Vec::new();
    for (run, point) in shuffled_failpoints(&mut next).into_iter().enumerate() {
        let base = checkpoint_progress(&ck).map_or(0, |(_, highest)| highest);
        let at = base + 2 + next() % 2;
        let marker = tmp.path().join(format!("marker-{run}"));
        let log = tmp.path().join(format!("run-{run}.log"));
        let (name, id) =
            kill_at_failpoint(wordcount(&brokers, &out_dir, &ck), point, at, &marker, &log)
                .unwrap_or_else(|e| panic!("run {run}: {e}"));
        assert_eq!(name, point, "run {run} stopped at another point");
        assert!(id >= at, "{point} fired at {id}, armed for {at}");
        let now = checkpoint_progress(&ck).map(|(id, _)| id);
        let completed = now.unwrap_or(0);
        match point {
            "checkpoint-completed" => assert_eq!(completed, id, "{point} {id}"),
            "sink-committing" => assert!(completed >= id, "{point} {id}"),
            _ => assert!(completed < id, "{point} {id}: {completed} completed"),
        }
        assert!(now >= newest, "completed checkpoints went back");
        newest = now;
        let so_far = check_output(&out_dir, &expected);
        assert_eq!(
            so_far.duplicates, 0,
            "duplicates committed by the run killed at {point} {id}"
        );
        kills.push(format!("{point} at {id}"));
    }
    let id = newest.expect("a checkpoint completed before the last kill");
    let out = run_ok(wordcount(&brokers, &out_dir, &ck).stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("restored from ") && l.contains(&format!("chk-{id}"))),
        "{stderr}"
    );
    eprintln!("SIGKILLs at {}", kills.join(", "));
    assert_no_leftovers(&out_dir);
    assert_exactly_once(&out_dir, &expected);
    assert_eq!(sorted_lines(&out_dir), sorted_lines(&calm.join("out")));
}

/// Runs `cairn` with `args`; asserts a failure with exactly one stderr line, which it returns.
fn one_error_line(args: &[&str]) -> String {
    let out = cairn().args(args).output().expect("cairn starts");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    lines[0].to_string()
}

#[test]
fn an_unreachable_broker_a_missing_topic_and_bad_flags_are_one_clear_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let out = out.to_str().unwrap();
    let line = one_error_line(&[
        "run",
        "wordcount",
        "--kafka-brokers",
        "127.0.0.1:1",
        "--kafka-input",
        "t",
        "--kafka-bounded",
        "--output",
        out,
    ]);
    assert!(
        line.starts_with("error: ")
            && line.ends_with("cannot connect to any Kafka broker of 127.0.0.1:1 (is it running?)"),
        "{line}"
    );

    let mock = MockCluster::new(1).expect("mock cluster");
    mock.create_topic("other", 1, 1).unwrap();
    let brokers = mock.bootstrap_servers();
    let line = one_error_line(&[
        "run",
        "wordcount",
        "--kafka-brokers",
        &brokers,
        "--kafka-input",
        "missing",
        "--kafka-bounded",
        "--output",
        out,
    ]);
    assert!(
        line.starts_with("error: ")
            && line.ends_with(&format!(
                "Kafka topic 'missing' does not exist on {brokers}"
            )),
        "{line}"
    );

    let line = one_error_line(&[
        "run",
        "wordcount",
        "--kafka-brokers",
        &brokers,
        "--kafka-input",
        "other",
        "--kafka-start",
        "yesterday",
        "--discard",
    ]);
    assert!(
        line.starts_with("error: --kafka-start: 'yesterday' is not a start position"),
        "{line}"
    );
    let line = one_error_line(&[
        "run",
        "wordcount",
        "--kafka-brokers",
        &brokers,
        "--kafka-input",
        "other",
        "--kafka-discovery-interval",
        "soon",
        "--discard",
    ]);
    assert!(
        line.starts_with("error: --kafka-discovery-interval: "),
        "{line}"
    );
    // The Kafka flags are wordcount's: another job refuses them as clap does (exit 2).
    let out = cairn()
        .args(["run", "backpressure", "--kafka-brokers", &brokers])
        .args(["--kafka-input", "other", "--discard"])
        .output()
        .expect("cairn starts");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: unexpected argument '--kafka-brokers'"),
        "{stderr}"
    );
}

/// `--kafka-start timestamp:MILLIS` against a broker that answers lookups by time (Tansu from
/// `scripts/service-kafka`, or `CAIRN_TEST_KAFKA_BROKERS`; the mock cluster answers none): every
/// partition starts at its first record at or after the time, so exactly the later lines are
/// counted, at parallelism 2 over 3 partitions. Tansu stamps records with their append time,
/// so the lines are written in two rounds with the start time between them.
#[test]
fn a_timestamp_start_reads_from_the_first_record_at_or_after_it_on_a_real_broker() {
    use cairn::connectors::kafka::wire::WireClient;
    let brokers = kafka_brokers();
    let mut w = WireClient::new(&brokers, Duration::from_secs(20));
    let now_ms = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    let topic = unique_topic("ts-start");
    w.create_topic(&topic, 3).unwrap_or_else(|e| {
        panic!("no Kafka broker at {brokers} ({e}): start it with scripts/service-kafka")
    });
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .create()
        .unwrap();
    let write = |lines: std::ops::Range<i64>, timestamp: i64| {
        for i in lines {
            let line = format!("line{i}");
            producer
                .send(
                    BaseRecord::<(), str>::to(&topic)
                        .partition((i % 3) as i32)
                        .payload(line.as_str())
                        .timestamp(timestamp),
                )
                .map_err(|(e, _)| e)
                .unwrap();
        }
        producer.flush(Duration::from_secs(30)).unwrap();
    };
    write(0..45, now_ms());
    // The start time: after every record of the first round, before any of the second.
    let start = now_ms() + 1;
    let deadline = Instant::now() + Duration::from_secs(5);
    while now_ms() <= start {
        assert!(Instant::now() < deadline, "the clock stands still");
        std::thread::park_timeout(Duration::from_millis(1));
    }
    write(45..90, now_ms());
    seal_partitions(&brokers, &topic, 3);

    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(
        cairn()
            .args(["run", "wordcount", "-p", "2", "--kafka-brokers", &brokers])
            .args(["--kafka-input", &topic, "--kafka-bounded"])
            .args(["--kafka-start", &format!("timestamp:{start}")])
            .arg("--output")
            .arg(&out)
            .stdout(Stdio::null()),
    );
    let expected: HashMap<String, u64> = (45..90).map(|i| (format!("line{i}"), 1)).collect();
    assert_exactly_once(&out, &expected);
}
