//! The Kafka sink end to end: `cairn run wordcount --kafka-output` against a real
//! Kafka-protocol broker with transactions, Tansu from `scripts/service-kafka` on
//! 127.0.0.1:59092 (`CAIRN_TEST_KAFKA_BROKERS` points the tests at another broker). A missing
//! broker fails every test, naming the script that starts it.
//!
//! Tansu hands aborted records to `read_committed` consumers, so the committed output is
//! computed from the raw log (read uncommitted, with its transaction markers) the way a
//! read-committed consumer must see it ([`TopicLog::committed_records`]); the undisturbed run
//! checks that librdkafka's own `read_committed` consumer sees the same records.

mod common;

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn::connectors::kafka::wire::{Marker, TopicLog, TransactionFate, WireClient};
use common::*;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};

/// A record's key and value.
type KeyValue = (Option<Vec<u8>>, Option<Vec<u8>>);

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

/// Every `WORD<TAB>COUNT` record, by word; checks the key is the word.
fn counts_of(records: &[KeyValue]) -> HashMap<String, Vec<u64>> {
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for (key, value) in records {
        let value = String::from_utf8(value.clone().expect("a value")).expect("UTF-8 value");
        let (word, count) = value
            .split_once('\t')
            .unwrap_or_else(|| panic!("bad value {value:?}"));
        assert_eq!(key.as_deref(), Some(word.as_bytes()), "key of {value:?}");
        seen.entry(word.to_string())
            .or_default()
            .push(count.parse().expect("count"));
    }
    seen
}

/// The committed records of `log`, as key and value.
fn committed(log: &TopicLog) -> Vec<KeyValue> {
    log.committed_records()
        .unwrap()
        .into_iter()
        .map(|r| (r.key.map(|b| b.to_vec()), r.value.map(|b| b.to_vec())))
        .collect()
}

/// Duplicates and losses of the counts `seen` against the expected occurrences.
fn check_counts(mut seen: HashMap<String, Vec<u64>>, expected: &HashMap<String, u64>) -> Check {
    let mut check = Check::default();
    for (w, &n) in expected {
        let mut present = vec![0u64; n as usize + 1];
        for c in seen.remove(w).unwrap_or_default() {
            assert!(c >= 1, "word {w}: count {c}");
            if c > n {
                check.duplicates += 1;
            } else {
                present[c as usize] += 1;
            }
        }
        for &times in &present[1..] {
            match times {
                0 => check.missing += 1,
                1 => {}
                more => check.duplicates += more - 1,
            }
        }
    }
    assert!(
        seen.is_empty(),
        "unexpected words: {:?}",
        seen.keys().take(5).collect::<Vec<_>>()
    );
    check
}

/// A record as a consumer delivers it: partition, offset, key and value.
type Delivered = (i32, i64, KeyValue);

/// The committed records of `log` with their partitions and offsets.
fn committed_at(log: &TopicLog) -> Vec<Delivered> {
    let mut out = Vec::new();
    for (p, batches) in log.partitions.iter().enumerate() {
        let only = TopicLog {
            partitions: (0..log.partitions.len())
                .map(|q| if q == p { batches.clone() } else { Vec::new() })
                .collect(),
        };
        for r in only.committed_records().unwrap() {
            let kv = (r.key.map(|b| b.to_vec()), r.value.map(|b| b.to_vec()));
            out.push((p as i32, r.offset, kv));
        }
    }
    out
}

/// What librdkafka's consumer with `isolation.level=read_committed` delivers from `topic`:
/// it reads until every partition delivered the offset `last[p]` (the partition's last
/// committed record), or for 60 s, from offset 0. Not from `Offset::Beginning`: Tansu answers
/// the earliest offset of a partition whose log starts with a transaction with the offset of
/// that transaction's marker now and then (1 run in 3 on a loaded machine), and librdkafka then
/// skips the transaction although the broker serves it from offset 0.
fn read_committed_with_librdkafka(topic: &str, last: &[Option<i64>]) -> Vec<Delivered> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", "cairn-kafka-sink-test")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..last.len() as i32 {
        tpl.add_partition_offset(topic, p, Offset::Offset(0))
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let mut pending: HashSet<i32> = (0..last.len() as i32)
        .filter(|&p| last[p as usize].is_some())
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !pending.is_empty() && Instant::now() < deadline {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                if Some(m.offset()) >= last[m.partition() as usize] {
                    pending.remove(&m.partition());
                }
                let kv = (m.key().map(<[u8]>::to_vec), m.payload().map(<[u8]>::to_vec));
                out.push((m.partition(), m.offset(), kv));
            }
            Some(Err(e)) => panic!("read_committed consumer: {e}"),
            None => {}
        }
    }
    out
}

/// Checks that librdkafka's read-committed consumer delivers exactly the committed records
/// of `log` (partition, offset, key and value); on a difference, names the transactions
/// whose records differ and what the broker's own read-committed answer says of them.
fn cross_check_with_librdkafka(w: &mut WireClient, topic: &str, log: &TopicLog) {
    let ours = committed_at(log);
    let mut last: Vec<Option<i64>> = vec![None; log.partitions.len()];
    for (p, offset, _) in &ours {
        last[*p as usize] = last[*p as usize].max(Some(*offset));
    }
    let mut theirs = read_committed_with_librdkafka(topic, &last);
    theirs.sort();
    if theirs == ours {
        return;
    }
    let only_ours: Vec<&Delivered> = ours
        .iter()
        .filter(|r| theirs.binary_search(r).is_err())
        .collect();
    let only_theirs = theirs
        .iter()
        .filter(|r| ours.binary_search(r).is_err())
        .count();
    // The transactions the records missing from librdkafka's read belong to.
    let mut missing: Vec<(i32, i64, i64, u64)> = Vec::new();
    for (p, offset, _) in &only_ours {
        let batch = log.partitions[*p as usize]
            .iter()
            .find(|b| b.base_offset <= *offset && *offset <= b.last_offset)
            .expect("a committed record's batch");
        match missing.last_mut() {
            Some(m) if m.0 == *p && m.2 == batch.producer_id => m.3 += 1,
            _ => missing.push((*p, *offset, batch.producer_id, 1)),
        }
    }
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    let mut broker = Vec::new();
    for &(p, first, producer, _) in missing.iter().take(4) {
        let marks = consumer.fetch_watermarks(topic, p, Duration::from_secs(10));
        broker.push(format!("watermarks of {p}: {marks:?}"));
        let leader = w.leader(topic, p).unwrap();
        let answer = w.fetch(&leader, topic, p, first, 1 << 20, true).unwrap();
        broker.push(format!(
            "partition {p} from {first} (producer {producer}): last stable offset {}, high watermark {}, aborted {:?}",
            answer.last_stable_offset, answer.high_watermark, answer.aborted
        ));
    }
    panic!(
        "read_committed consumer disagrees: it read {} records, the log has {} committed; {only_theirs} only in its, {} only in ours, in (partition, first offset, producer, records) {missing:?}; the broker's read-committed answers: {broker:?}",
        theirs.len(),
        ours.len(),
        only_ours.len(),
    );
}

/// Runs `cmd` with stderr into `log` and kills it with SIGKILL once `cond` holds.
fn kill_when(mut cmd: Command, log: &Path, mut cond: impl FnMut() -> bool) {
    let mut child = cmd
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "ended ({status}) too early: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        assert!(
            Instant::now() < deadline,
            "the condition to kill never held"
        );
        std::thread::park_timeout(Duration::from_millis(5));
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

fn wordcount(
    topic: &str,
    ck: &Path,
    count: u64,
    keys: u64,
    guarantee: &str,
    extra: &[&str],
) -> Command {
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "-p", "2"])
        .args([
            "--generate",
            &count.to_string(),
            "--keys",
            &keys.to_string(),
        ])
        .args(["--kafka-brokers", &kafka_brokers(), "--kafka-output", topic])
        .args(["--kafka-guarantee", guarantee])
        .arg("--checkpoint-dir")
        .arg(ck)
        .args(["--checkpoint-interval", "300ms", "--from", "latest"])
        .args(extra)
        .stdout(Stdio::null());
    cmd
}

#[test]
fn exactly_once_wordcount_commits_every_count_once() {
    let mut w = broker();
    let topic = new_topic(&mut w, "eo", 3);
    let tmp = tempfile::tempdir().unwrap();
    let (count, keys) = (300_000u64, 2_000u64);
    let out = run_ok(&mut wordcount(
        &topic,
        &tmp.path().join("ck"),
        count,
        keys,
        "exactly-once",
        &[],
    ));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let log = w.read_topic(&topic).unwrap();
    let txns = log.transactions();
    assert!(
        txns.len() >= 4,
        "{} transactions; expected several checkpoints: {stderr}",
        txns.len()
    );
    assert!(
        txns.iter().all(|t| t.outcome == Some(Marker::Commit)),
        "an undisturbed run commits every transaction: {:?}",
        txns.iter()
            .filter(|t| t.outcome != Some(Marker::Commit))
            .collect::<Vec<_>>()
    );
    let records = committed(&log);
    assert_eq!(records.len() as u64, count);
    let c = check_counts(counts_of(&records), &generated_counts(count, keys));
    assert_eq!((c.duplicates, c.missing), (0, 0));
    // librdkafka's read-committed consumer sees the same records.
    cross_check_with_librdkafka(&mut w, &topic, &log);
}

/// A restored run's log lines about the transactions it committed and fenced.
#[derive(Debug, Default)]
struct RestoreLog {
    /// Producer ids whose transactions the restore committed (or found committed).
    committed: HashSet<i64>,
    /// Transactional ids it fenced.
    fenced: Vec<String>,
}

fn producer_id_in(line: &str) -> i64 {
    let rest = line.split_once("(producer id ").expect("a producer id").1;
    rest.split(',').next().unwrap().parse().unwrap()
}

fn restore_log(stderr: &str) -> RestoreLog {
    let mut log = RestoreLog::default();
    for line in stderr.lines().filter(|l| l.contains("Kafka sink 'sink': ")) {
        if line.contains(": committed transaction ") || line.contains(": found transaction ") {
            log.committed.insert(producer_id_in(line));
        } else if let Some(rest) = line.split_once(": fenced transactional id ") {
            log.fenced
                .push(rest.1.split(' ').next().unwrap().to_string());
        }
    }
    log
}

/// The transactions of `before` that were open (records, no marker), with their fate in
/// `after`.
fn fates_of_open(before: &TopicLog, after: &TopicLog) -> Vec<(TransactionFate, Option<Marker>)> {
    let later = after.transactions();
    before
        .transactions()
        .into_iter()
        .filter(|t| t.outcome.is_none())
        .map(|t| {
            let fate = later
                .iter()
                .find(|l| {
                    l.partition == t.partition
                        && l.producer_id == t.producer_id
                        && l.first_offset == t.first_offset
                })
                .and_then(|l| l.outcome);
            (t, fate)
        })
        .collect()
}

/// Kills in all of [`sigkill_at_the_sinks_failpoints_and_mid_transaction_keeps_exactly_once`],
/// counting the repeated mid-transaction kills.
const MID_TRANSACTION_KILLS_MAX: usize = 8;

/// Kills wordcount (exactly-once into Kafka, parallelism 2) at the sink's failpoints and in
/// mid-transaction, resumes each time from the latest checkpoint, and checks: every kill
/// landed where it was meant to, with transactions open (a mid-transaction kill that found
/// none is repeated); each resume committed the transactions of the restored checkpoint
/// (through `EndTxn` with the stored producer id and epoch) and aborted the later ones (their
/// abort markers in the log); the committed output never holds a duplicate; and at the end it
/// equals an undisturbed run's (every count once).
#[test]
fn sigkill_at_the_sinks_failpoints_and_mid_transaction_keeps_exactly_once() {
    let mut w = broker();
    let topic = new_topic(&mut w, "eo-kill", 3);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (count, keys) = (3_000_000u64, 5_000u64);
    let expected = generated_counts(count, keys);
    let run = || wordcount(&topic, &ck, count, keys, "exactly-once", &[]);
    let mut committed_by_restore = 0;
    let mut aborted_by_restore = 0;
    // (point, log before the kill's successor ran); the successor's stderr tells what it did.
    let mut previous: Option<(String, TopicLog)> = None;
    let mut points = vec!["sink-pre-committed", "sink-committing", "mid-transaction"];
    let mut i = 0;
    while let Some(&point) = points.get(i) {
        let base = checkpoint_progress(&ck).map_or(0, |(_, highest)| highest);
        let marker = tmp.path().join(format!("marker-{i}"));
        let log_path = tmp.path().join(format!("run-{i}.log"));
        if point == "mid-transaction" {
            // No failpoint: killed while records flow, once a checkpoint past the restored
            // one completed, so that open transactions hold records.
            kill_when(run(), &log_path, || {
                checkpoint_progress(&ck).is_some_and(|(id, _)| id > base)
            });
        } else {
            let (name, id) = kill_at_failpoint(run(), point, base + 2, &marker, &log_path)
                .unwrap_or_else(|e| panic!("{point}: {e}"));
            assert_eq!(name, point);
            let completed = checkpoint_progress(&ck).map_or(0, |(c, _)| c);
            if point == "sink-committing" {
                assert!(completed >= id, "{point} {id}: {completed} completed");
            } else {
                assert!(completed < id, "{point} {id}: {completed} completed");
            }
        }
        let log = w.read_topic(&topic).unwrap();
        let open = log
            .transactions()
            .into_iter()
            .filter(|t| t.outcome.is_none() && t.records > 0)
            .count();
        if point == "mid-transaction" && open == 0 && points.len() < MID_TRANSACTION_KILLS_MAX {
            // The kill fell between one transaction's commit and the next one's first records
            // reaching the broker (a slow broker): kill the next run again.
            points.push("mid-transaction");
        } else {
            assert!(open > 0, "the kill at {point} left no transaction open");
        }
        let so_far = check_counts(counts_of(&committed(&log)), &expected);
        assert_eq!(so_far.duplicates, 0, "duplicates committed before {point}");
        if let Some((prev_point, prev_log)) = previous.take() {
            let stderr = std::fs::read_to_string(tmp.path().join(format!("run-{i}.log")))
                .unwrap_or_default();
            let (c, a) = check_restore(&prev_point, &prev_log, &log, &restore_log(&stderr));
            committed_by_restore += c;
            aborted_by_restore += a;
        }
        previous = Some((point.to_string(), log));
        i += 1;
    }
    let out = run_ok(run().stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let (prev_point, prev_log) = previous.expect("three kills");
    let log = w.read_topic(&topic).unwrap();
    let (c, a) = check_restore(&prev_point, &prev_log, &log, &restore_log(&stderr));
    committed_by_restore += c;
    aborted_by_restore += a;
    assert!(
        committed_by_restore > 0,
        "no restore committed a pre-committed transaction"
    );
    assert!(aborted_by_restore > 0, "no restore aborted a transaction");
    assert!(
        log.transactions().iter().all(|t| t.outcome.is_some()),
        "transactions left open at the end"
    );
    let c = check_counts(counts_of(&committed(&log)), &expected);
    assert_eq!((c.duplicates, c.missing), (0, 0), "{stderr}");
    eprintln!(
        "restores committed {committed_by_restore} and aborted {aborted_by_restore} transactions left open by SIGKILLs"
    );
}

/// The transactions a kill at `point` left open (in `before`) all ended in `after`: those the
/// resumed run committed (its log lines name their producer ids) with a commit marker, all
/// others with an abort marker. Returns how many were committed and aborted.
fn check_restore(
    point: &str,
    before: &TopicLog,
    after: &TopicLog,
    restore: &RestoreLog,
) -> (usize, usize) {
    let (mut committed, mut aborted) = (0, 0);
    for (t, fate) in fates_of_open(before, after) {
        if restore.committed.contains(&t.producer_id) {
            assert_eq!(
                fate,
                Some(Marker::Commit),
                "after {point}: the restored checkpoint's transaction {t:?} was not committed"
            );
            committed += 1;
        } else {
            assert_eq!(
                fate,
                Some(Marker::Abort),
                "after {point}: the later transaction {t:?} was not aborted ({restore:?})"
            );
            aborted += 1;
        }
    }
    if point == "sink-committing" {
        // The checkpoint completed but the stopped subtask had not committed: the restore did.
        assert!(
            committed > 0,
            "after {point}: nothing committed by the restore"
        );
    }
    assert!(
        !restore.fenced.is_empty() || aborted == 0,
        "after {point}: aborts without fenced ids: {restore:?}"
    );
    (committed, aborted)
}

#[test]
fn at_least_once_loses_nothing_after_a_sigkill() {
    let mut w = broker();
    let topic = new_topic(&mut w, "alo-kill", 2);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let (count, keys) = (2_000_000u64, 3_000u64);
    let run = || wordcount(&topic, &ck, count, keys, "at-least-once", &[]);
    let (name, _) = kill_at_failpoint(
        run(),
        "sink-pre-committed",
        2,
        &tmp.path().join("marker"),
        &tmp.path().join("run.log"),
    )
    .unwrap();
    assert_eq!(name, "sink-pre-committed");
    run_ok(&mut run());
    let log = w.read_topic(&topic).unwrap();
    let c = check_counts(counts_of(&committed(&log)), &generated_counts(count, keys));
    assert_eq!(c.missing, 0, "at-least-once lost records");
    eprintln!("at-least-once after a SIGKILL: {} duplicates", c.duplicates);
}

/// Two jobs share a transactional id prefix: the second one's start fences the first one's
/// producers (a zombie), which fails with one line naming the fenced id instead of writing on.
#[test]
fn a_fenced_producer_fails_its_job_with_a_clear_error() {
    let mut w = broker();
    let (topic_a, topic_b) = (
        new_topic(&mut w, "zombie-a", 2),
        new_topic(&mut w, "zombie-b", 2),
    );
    let tmp = tempfile::tempdir().unwrap();
    let prefix = format!("cairn-fence-{}", std::process::id());
    let shared = [
        "--kafka-transactional-id-prefix",
        prefix.as_str(),
        "-D",
        "restart-strategy.type=none",
    ];
    let mut a = wordcount(
        &topic_a,
        &tmp.path().join("ck-a"),
        100_000_000,
        100,
        "exactly-once",
        &[&shared[..], &["--rate", "20000"]].concat(),
    );
    let mut zombie = Watched::spawn(&mut a);
    let deadline = Instant::now() + Duration::from_secs(60);
    zombie.wait_for_a_checkpoint(&tmp.path().join("ck-a"), deadline);
    let (count, keys) = (50_000u64, 100u64);
    run_ok(&mut wordcount(
        &topic_b,
        &tmp.path().join("ck-b"),
        count,
        keys,
        "exactly-once",
        &shared,
    ));
    let (status, stderr) = zombie.wait(deadline);
    assert!(!status.success(), "the fenced job went on: {stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("error: ")
            && last.contains("was fenced")
            && last.contains(&format!("transactional id {prefix}-")),
        "{stderr}"
    );
    // The job that took over wrote its output exactly once.
    let log = w.read_topic(&topic_b).unwrap();
    let c = check_counts(counts_of(&committed(&log)), &generated_counts(count, keys));
    assert_eq!((c.duplicates, c.missing), (0, 0));
}

#[test]
fn an_unreachable_broker_fails_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    let out = cairn()
        .args(["run", "wordcount", "--generate", "10"])
        .args(["--kafka-brokers", "127.0.0.1:1", "--kafka-output", "t"])
        .arg("--checkpoint-dir")
        .arg(tmp.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("error: ") && stderr.contains("cannot reach Kafka broker 127.0.0.1:1"),
        "{stderr}"
    );
    for (flags, message) in [
        (
            &["--kafka-brokers", "127.0.0.1", "--kafka-output", "t"][..],
            "'127.0.0.1' is not HOST:PORT",
        ),
        (
            &[
                "--kafka-brokers",
                "127.0.0.1:9",
                "--kafka-output",
                "t",
                "--kafka-guarantee",
                "twice",
            ][..],
            "unknown Kafka guarantee 'twice'",
        ),
        (
            &["--kafka-brokers", "127.0.0.1:9"][..],
            "--kafka-brokers needs --kafka-input TOPIC or --kafka-output TOPIC",
        ),
    ] {
        let out = cairn()
            .args(["run", "wordcount", "--generate", "10"])
            .args(flags)
            .output()
            .unwrap();
        assert!(!out.status.success());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(stderr.contains(message), "{flags:?}: {stderr}");
    }
}

/// wordcount from Kafka to Kafka, exactly-once, at parallelism `p`: the Kafka source reads a
/// bounded topic of lines (its offsets in the checkpoints) and the exactly-once sink writes the
/// counts into another topic. `paced`: the source reads [`PACED_LINES_PER_S`] lines per second.
fn kafka_to_kafka(input: &str, output: &str, ck: &Path, p: u32, paced: bool) -> Command {
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "-p", &p.to_string()])
        .args(["--kafka-brokers", &kafka_brokers()])
        .args(["--kafka-input", input, "--kafka-bounded"])
        .args([
            "--kafka-output",
            output,
            "--kafka-guarantee",
            "exactly-once",
        ])
        .arg("--checkpoint-dir")
        .arg(ck)
        .args(["--checkpoint-interval", "200ms", "--from", "latest"])
        .stdout(Stdio::null());
    if paced {
        cmd.args(["--rate", &PACED_LINES_PER_S.to_string()]);
    }
    cmd
}

/// The pace of the killed runs: the 50,000 lines last 10 s, so however slow the machine's
/// checkpoints are, no killed run reads its input to the end before its failpoint.
const PACED_LINES_PER_S: u64 = 5_000;

/// End to end through the broker on both sides: Kafka -> wordcount -> Kafka (exactly-once,
/// p=2), SIGKILLed at every checkpoint and sink failpoint in turn, including while records sit
/// in an open transaction and in the middle of a restore's commits, and resumed from the newest
/// checkpoint each time; the last run resumes at parallelism 3 (the partitions' offsets and
/// the sink's transactions rescaled). Every kill lands where it was armed; no duplicate is ever
/// committed; and at the end the committed output equals an undisturbed run's record for
/// record.
#[test]
fn kafka_to_kafka_sigkilled_at_every_failpoint_and_rescaled_equals_an_undisturbed_run() {
    const PARTITIONS: i32 = 3;
    let (lines, per_line, keys) = (50_000u64, 40u64, 5_000u64);
    let mut w = broker();
    let input = new_topic(&mut w, "e2e-lines", PARTITIONS);
    fill_topic(&kafka_brokers(), &input, PARTITIONS, lines, per_line, keys);
    let expected = generated_counts(lines * per_line, keys);
    let tmp = tempfile::tempdir().unwrap();

    let undisturbed_topic = new_topic(&mut w, "e2e-undisturbed", PARTITIONS);
    run_ok(&mut kafka_to_kafka(
        &input,
        &undisturbed_topic,
        &tmp.path().join("ck-undisturbed"),
        2,
        false,
    ));
    let mut undisturbed = committed(&w.read_topic(&undisturbed_topic).unwrap());
    let c = check_counts(counts_of(&undisturbed), &expected);
    assert_eq!((c.duplicates, c.missing), (0, 0), "the undisturbed run");

    let output = new_topic(&mut w, "e2e-counts", PARTITIONS);
    let ck = tmp.path().join("ck");
    let mut newest: Option<u64> = None;
    let mut kills = Vec::new();
    for (i, point) in [
        "sink-writing",
        "sink-pre-committed",
        "sink-committing",
        "sink-restoring",
        "upload",
        "checkpoint-completed",
    ]
    .into_iter()
    .enumerate()
    {
        let at = match point {
            // The restore of the newest checkpoint, whose transactions the kill at
            // sink-committing left pre-committed.
            "sink-restoring" => newest.expect("a completed checkpoint to restore"),
            _ => checkpoint_progress(&ck).map_or(0, |p| p.1) + 2,
        };
        let marker = tmp.path().join(format!("marker-{i}"));
        let log = tmp.path().join(format!("run-{i}.log"));
        let cmd = kafka_to_kafka(&input, &output, &ck, 2, true);
        let (hit, id) = kill_at_failpoint(cmd, point, at, &marker, &log)
            .unwrap_or_else(|e| panic!("run {i} ({point}): {e}"));
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(hit, point, "run {i}");
        assert!(id >= at, "run {i}: {point} fired at {id}, armed for {at}");
        assert_eq!(
            restored_checkpoint(&stderr),
            newest,
            "run {i} did not restore the newest completed checkpoint: {stderr}"
        );
        let now = checkpoint_progress(&ck).map(|p| p.0);
        let completed = now.unwrap_or(0);
        match point {
            "sink-restoring" => {
                assert_eq!(
                    Some(id),
                    newest,
                    "run {i}: restored {newest:?}, stopped at {id}"
                );
                assert_eq!(
                    now, newest,
                    "run {i}: a checkpoint completed during the restore"
                );
            }
            "checkpoint-completed" => assert_eq!(completed, id, "{point} {id}"),
            "sink-committing" => assert!(completed >= id, "{point} {id}: {completed}"),
            _ => assert!(completed < id, "{point} {id}: {completed} completed"),
        }
        newest = now;
        let log = w.read_topic(&output).unwrap();
        let so_far = check_counts(counts_of(&committed(&log)), &expected);
        assert_eq!(
            so_far.duplicates, 0,
            "duplicates committed after the kill at {point} {id}"
        );
        kills.push(format!("{point} at {id}"));
    }
    let done = run_ok(kafka_to_kafka(&input, &output, &ck, 3, false).stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&done.stderr);
    assert_eq!(restored_checkpoint(&stderr), newest, "{stderr}");
    eprintln!("Kafka -> Kafka: SIGKILLs at {}", kills.join(", "));
    let log = w.read_topic(&output).unwrap();
    assert!(
        log.transactions().iter().all(|t| t.outcome.is_some()),
        "transactions left open at the end"
    );
    let mut records = committed(&log);
    let c = check_counts(counts_of(&records), &expected);
    assert_eq!((c.duplicates, c.missing), (0, 0), "{stderr}");
    records.sort();
    undisturbed.sort();
    assert!(
        records == undisturbed,
        "the committed output differs from the undisturbed run's"
    );
}

/// A job's state from the coordinator's REST API at `rest`.
fn job_state(rest: std::net::SocketAddr, jid: &str) -> String {
    let body = ureq::get(&format!("http://{rest}/jobs/{jid}"))
        .call()
        .and_then(|mut r| r.body_mut().read_to_string())
        .unwrap_or_else(|e| panic!("GET /jobs/{jid}: {e}"));
    let job: serde_json::Value = serde_json::from_str(&body).unwrap();
    job["state"].as_str().unwrap_or_default().to_string()
}

/// The exactly-once Kafka sink in a cluster: the coordinator's job master restores it
/// (commits the restored checkpoint's transactions, fences the later ones) and the workers'
/// writers continue the transaction numbering from the checkpoint they restore. Kafka ->
/// wordcount -> Kafka at p=2 on two one-slot workers: one runs throughout, the other is
/// armed at a sink failpoint, SIGKILLed there and replaced by the next, in turn at
/// `sink-pre-committed`, `sink-writing` and `sink-committing`. Every kill lands where it was
/// armed, the job restarts each time and finishes; no duplicate is ever committed, no
/// transaction is left open, and the output holds every count once.
#[test]
fn in_a_cluster_workers_killed_at_the_sinks_failpoints_keep_exactly_once() {
    const PARTITIONS: i32 = 3;
    let (lines, per_line, keys) = (30_000u64, 20u64, 2_000u64);
    let mut w = broker();
    let input = new_topic(&mut w, "cluster-lines", PARTITIONS);
    fill_topic(&kafka_brokers(), &input, PARTITIONS, lines, per_line, keys);
    let output = new_topic(&mut w, "cluster-counts", PARTITIONS);
    let expected = generated_counts(lines * per_line, keys);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let deadline = || Instant::now() + Duration::from_secs(60);
    let mut cluster = Cluster::start(&ck, 0, deadline());
    let _steady = Watched::spawn(&mut cluster.worker(1));
    let points = ["sink-pre-committed", "sink-writing", "sink-committing"];
    let armed = |cluster: &Cluster, i: usize, at: u64| {
        Watched::spawn(
            cluster
                .worker(1)
                .env("CAIRN_FAILPOINTS", format!("{}={at}", points[i]))
                .env(
                    "CAIRN_FAILPOINT_MARKER",
                    tmp.path().join(format!("marker-{i}")),
                ),
        )
    };
    let mut worker = armed(&cluster, 0, 2);
    let jid = submit(
        cluster.rest,
        None,
        &[
            "wordcount",
            "-p",
            "2",
            "--kafka-brokers",
            &kafka_brokers(),
            "--kafka-input",
            &input,
            "--kafka-bounded",
            "--kafka-output",
            &output,
            "--kafka-guarantee",
            "exactly-once",
            "--checkpoint-interval",
            "200ms",
            // The input lasts 6 s of reading per attempt: the job is still reading at every
            // kill, however slow the machine.
            "--rate",
            "5000",
        ],
    );
    let mut kills = Vec::new();
    for (i, point) in points.into_iter().enumerate() {
        let marker = tmp.path().join(format!("marker-{i}"));
        let at = if i == 0 {
            2
        } else {
            checkpoint_progress(&ck).map_or(0, |(_, highest)| highest) + 2
        };
        if i > 0 {
            // Replacing the stopped worker SIGKILLs it.
            worker = armed(&cluster, i, at);
        }
        worker.wait_until(&format!("{point}={at}"), deadline(), || {
            read_marker(&marker).is_some()
        });
        let (hit, id) = read_marker(&marker).unwrap();
        assert_eq!(hit, point);
        assert!(id >= at, "{point} fired at {id}, armed for {at}");
        let completed = checkpoint_progress(&ck).map_or(0, |(c, _)| c);
        match point {
            "sink-committing" => assert!(completed >= id, "{point} {id}: {completed}"),
            _ => assert!(completed < id, "{point} {id}: {completed} completed"),
        }
        let so_far = check_counts(
            counts_of(&committed(&w.read_topic(&output).unwrap())),
            &expected,
        );
        assert_eq!(so_far.duplicates, 0, "duplicates committed at {point} {id}");
        kills.push(format!("{point} at {id}"));
        cluster.assert_running();
    }
    worker = Watched::spawn(&mut cluster.worker(1));
    let end = deadline() + Duration::from_secs(60);
    while job_state(cluster.rest, &jid) != "FINISHED" {
        let state = job_state(cluster.rest, &jid);
        assert!(
            state != "FAILED" && state != "CANCELED",
            "the job ended {state}"
        );
        assert!(
            Instant::now() < end,
            "the job did not finish in time: {state}"
        );
        worker.assert_running();
        std::thread::park_timeout(Duration::from_millis(50));
    }
    eprintln!(
        "cluster Kafka -> Kafka: worker SIGKILLs at {}",
        kills.join(", ")
    );
    let log = w.read_topic(&output).unwrap();
    assert!(
        log.transactions().iter().all(|t| t.outcome.is_some()),
        "transactions left open at the end"
    );
    assert!(
        log.transactions()
            .iter()
            .any(|t| t.outcome == Some(Marker::Abort)),
        "no restore aborted a transaction a killed worker left open"
    );
    // A transactional id (one producer id) commits at most one transaction per partition: the
    // restarted writers continued the numbering from the restored checkpoint (they reuse only
    // the ids of transactions the restore aborted), never an id whose transaction committed.
    let mut seen = HashSet::new();
    for t in log.transactions() {
        if t.outcome == Some(Marker::Commit) && t.records > 0 {
            assert!(
                seen.insert((t.producer_id, t.partition)),
                "producer id {} committed two transactions into partition {}: a committed transactional id was used again",
                t.producer_id,
                t.partition
            );
        }
    }
    let c = check_counts(counts_of(&committed(&log)), &expected);
    assert_eq!((c.duplicates, c.missing), (0, 0));
}
