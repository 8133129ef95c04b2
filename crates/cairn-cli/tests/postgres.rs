//! The PostgreSQL sinks end to end, against a real server: the one `scripts/service-postgres`
//! starts on 127.0.0.1:55432 (`CAIRN_TEST_PG_URL` overrides it). Without a server the tests
//! fail and say how to start one.
//!
//! For each mode (2pc, upsert, wal), wordcount at parallelism 2 writes into its own table, is
//! stopped at chosen failpoints — rows in an open transaction (`sink-writing`), between
//! pre-commit and commit (`sink-pre-committed`), checkpoint complete but not committed
//! (`sink-committing`, `checkpoint-completed`), in the middle of the sink's restore
//! (`sink-restoring`) — killed there with SIGKILL, checked to have stopped where it was
//! meant to, and resumed with `--from latest`; the table then equals an undisturbed run's.
//! Each test has its own table and checkpoint directory (so its own job id), so the tests run
//! in parallel. The `kafka_to_postgres_*` tests do the same with the words read from a bounded
//! Kafka topic on the `scripts/service-kafka` broker (`CAIRN_TEST_KAFKA_BROKERS` overrides it).

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn::connectors::kafka::wire::WireClient;
use cairn::connectors::postgres::parse_gid;
use common::*;
use postgres::{Client, NoTls};

const DEFAULT_URL: &str = "postgres://cairn:cairn@127.0.0.1:55432/cairn";

fn url() -> String {
    std::env::var("CAIRN_TEST_PG_URL").unwrap_or_else(|_| DEFAULT_URL.to_string())
}

/// A connection to the test server; fails the test with how to start it if it is not there.
fn db() -> Client {
    let url = url();
    let mut c = Client::connect(&url, NoTls).unwrap_or_else(|e| {
        panic!(
            "PostgreSQL at {url} does not answer ({e}): start it with scripts/service-postgres (or set CAIRN_TEST_PG_URL)"
        )
    });
    // A test never waits for long on a lock (a leftover of a killed earlier run).
    c.batch_execute("SET lock_timeout = '20s'").unwrap();
    c
}

/// Drops `table` and its commit table, after rolling back the prepared transactions that
/// hold locks on the table (what an earlier run of the same test, killed midway, left).
fn reset(db: &mut Client, table: &str) {
    let rows = db
        .query(
            "SELECT DISTINCT p.gid FROM pg_prepared_xacts p \
             JOIN pg_locks x ON x.locktype = 'transactionid' AND x.transactionid = p.transaction \
             JOIN pg_locks r ON r.virtualtransaction = x.virtualtransaction AND r.relation = to_regclass($1) \
             WHERE p.database = current_database()",
            &[&table],
        )
        .unwrap();
    for r in rows {
        let gid: String = r.get(0);
        db.batch_execute(&format!("ROLLBACK PREPARED '{}'", gid.replace('\'', "''")))
            .unwrap();
    }
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table}; DROP TABLE IF EXISTS {table}_cairn_commits"
    ))
    .unwrap();
}

/// 2pc and wal: the counts per word in `table`.
fn appended(db: &mut Client, table: &str) -> HashMap<String, Vec<u64>> {
    let mut m: HashMap<String, Vec<u64>> = HashMap::new();
    for r in db
        .query(&format!("SELECT word, count FROM {table}"), &[])
        .unwrap()
    {
        let (w, c): (String, i64) = (r.get(0), r.get(1));
        m.entry(w).or_default().push(c as u64);
    }
    m
}

/// upsert: the count per word in `table`.
fn upserted(db: &mut Client, table: &str) -> HashMap<String, u64> {
    db.query(&format!("SELECT word, count FROM {table}"), &[])
        .unwrap()
        .into_iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1) as u64))
        .collect()
}

/// Asserts what `mode`'s table may hold at any time: 2pc and wal never a duplicate nor a
/// count past the word's total; upsert never a count past it. With `complete`, the table is
/// also everything an undisturbed run writes: every word's counts 1..n (upsert: n).
fn check_table(
    db: &mut Client,
    mode: &str,
    table: &str,
    expected: &HashMap<String, u64>,
    complete: bool,
) {
    if mode == "upsert" {
        let got = upserted(db, table);
        for (w, &c) in &got {
            let n = expected.get(w).copied().unwrap_or(0);
            assert!(
                c >= 1 && c <= n,
                "{table}: word {w} has count {c}, its total is {n}"
            );
        }
        if complete {
            let wrong: Vec<(&String, Option<&u64>, u64)> = expected
                .iter()
                .filter(|(w, n)| got.get(*w) != Some(n))
                .map(|(w, &n)| (w, got.get(w), n))
                .collect();
            assert!(
                wrong.is_empty() && got.len() == expected.len(),
                "{table} differs from an undisturbed run's in {} of {} words (word, count, expected): {:?}",
                wrong.len(),
                expected.len(),
                &wrong[..wrong.len().min(5)]
            );
        }
        return;
    }
    let got = appended(db, table);
    for (w, counts) in got {
        let n = expected.get(&w).copied().unwrap_or(0);
        let mut sorted = counts.clone();
        sorted.sort_unstable();
        let distinct = {
            let mut d = sorted.clone();
            d.dedup();
            d.len()
        };
        assert_eq!(
            distinct,
            sorted.len(),
            "{table}: word {w} has a count twice"
        );
        assert!(
            sorted.iter().all(|&c| c >= 1 && c <= n),
            "{table}: word {w} has counts outside 1..={n}"
        );
        if complete {
            assert_eq!(sorted.len() as u64, n, "{table}: word {w} misses counts");
        }
    }
    if complete {
        let words: usize = appended(db, table).len();
        assert_eq!(words, expected.len(), "{table}: words missing");
    }
}

/// The gids prepared under `prefix`.
fn prepared(db: &mut Client, prefix: &str) -> Vec<String> {
    db.query(
        "SELECT gid FROM pg_prepared_xacts WHERE starts_with(gid, $1) ORDER BY gid",
        &[&prefix],
    )
    .unwrap()
    .into_iter()
    .map(|r| r.get(0))
    .collect()
}

/// Whether a session is inside a transaction that has written to `table` and is neither
/// prepared nor committed.
fn open_transaction_on(db: &mut Client, table: &str) -> bool {
    let n: i64 = db
        .query_one(
            "SELECT count(*) FROM pg_stat_activity a JOIN pg_locks l ON l.pid = a.pid \
             WHERE a.state = 'idle in transaction' AND l.relation = to_regclass($1)",
            &[&table],
        )
        .unwrap()
        .get(0);
    n > 0
}

/// The one job under checkpoint directory `ck`.
fn job_id(ck: &Path) -> String {
    let jobs: Vec<String> = std::fs::read_dir(ck)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    jobs[0].clone()
}

const RECORDS: u64 = 500_000;
const KEYS: u64 = 1_000;
/// Words per second over both source subtasks: enough for several batches per checkpoint,
/// slow enough that a run lasts past the checkpoints the kills are armed for.
const RATE: u64 = 100_000;

fn wordcount(mode: &str, table: &str, ck: &Path, rate: Option<u64>) -> Command {
    let mut cmd = cairn();
    cmd.args(["run", "wordcount", "-p", "2"])
        .args([
            "--generate",
            &RECORDS.to_string(),
            "--keys",
            &KEYS.to_string(),
        ])
        .args([
            "--pg-output",
            &url(),
            "--pg-table",
            table,
            "--pg-mode",
            mode,
        ])
        .arg("--checkpoint-dir")
        .arg(ck)
        .args(["--checkpoint-interval", "100ms", "--from", "latest"])
        .stdout(Stdio::null());
    if let Some(r) = rate {
        cmd.args(["--rate", &r.to_string()]);
    }
    cmd
}

/// Where the killed wordcount reads its words.
#[derive(Clone, Copy)]
enum Input<'a> {
    /// `--generate RECORDS --keys KEYS`, paced at `RATE` words per second.
    Generated,
    /// A bounded Kafka topic on the `scripts/service-kafka` broker, filled by [`kafka_lines`].
    Kafka(&'a str),
}

impl Input<'_> {
    /// The wordcount to kill (`paced`: Kafka's lines read at [`KAFKA_RATE`]) or to run to its
    /// end (generated words are always paced).
    fn wordcount(self, mode: &str, table: &str, ck: &Path, paced: bool) -> Command {
        let Input::Kafka(topic) = self else {
            return wordcount(mode, table, ck, Some(RATE));
        };
        let mut cmd = cairn();
        cmd.args(["run", "wordcount", "-p", "2"])
            .args(["--kafka-brokers", &kafka_brokers()])
            .args(["--kafka-input", topic, "--kafka-bounded"])
            .args([
                "--pg-output",
                &url(),
                "--pg-table",
                table,
                "--pg-mode",
                mode,
            ])
            .arg("--checkpoint-dir")
            .arg(ck)
            .args(["--checkpoint-interval", "100ms", "--from", "latest"])
            .stdout(Stdio::null());
        if paced {
            cmd.args(["--rate", &KAFKA_RATE.to_string()]);
        }
        cmd
    }

    /// How often each word occurs in the input.
    fn expected(self) -> HashMap<String, u64> {
        match self {
            Input::Generated => generated_counts(RECORDS, KEYS),
            Input::Kafka(_) => generated_counts(KAFKA_LINES * KAFKA_WORDS_PER_LINE, KEYS),
        }
    }
}

/// Lines of the Kafka input topic: with 40 words each, 2M words.
const KAFKA_LINES: u64 = 50_000;
const KAFKA_WORDS_PER_LINE: u64 = 40;
/// Lines per second the killed runs read from Kafka: the input lasts 10 s, so every killed run
/// stops at its failpoint long before the source reaches the end, however slow the machine's
/// checkpoints are (unpaced, the source read it all before a kill at checkpoint 8 on CI).
const KAFKA_RATE: u64 = 5_000;

/// The Kafka topic of lines the Kafka -> PostgreSQL tests read, created and filled on the
/// `scripts/service-kafka` broker by the first test that asks (one per test process).
fn kafka_lines() -> &'static str {
    static TOPIC: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    TOPIC.get_or_init(|| {
        let brokers = kafka_brokers();
        let mut w = WireClient::new(&brokers, Duration::from_secs(20));
        let topic = unique_topic("pg-e2e-lines");
        w.create_topic(&topic, 3).unwrap_or_else(|e| {
            panic!("no Kafka broker at {brokers} ({e}): start it with scripts/service-kafka")
        });
        fill_topic(&brokers, &topic, 3, KAFKA_LINES, KAFKA_WORDS_PER_LINE, KEYS);
        topic
    })
}

/// Runs `cmd` armed to stop at `point` from checkpoint `at` on; once the marker says it
/// stopped, runs `check` (point and id reached) while the process is parked there, then kills
/// it with SIGKILL. Returns where it stopped and its stderr.
fn kill_at(
    mut cmd: Command,
    point: &str,
    at: u64,
    scratch: &Path,
    run: usize,
    check: impl FnOnce(&str, u64),
) -> (String, u64, String) {
    let marker = scratch.join(format!("marker-{run}"));
    let log = scratch.join(format!("run-{run}.log"));
    let mut child = cmd
        .env("CAIRN_FAILPOINTS", format!("{point}={at}"))
        .env("CAIRN_FAILPOINT_MARKER", &marker)
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let hit = loop {
        if let Some(hit) = read_marker(&marker) {
            break hit;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!(
                "run {run} ended ({status}) before failpoint {point}={at}: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            panic!("run {run} never reached failpoint {point}={at}");
        }
        std::thread::park_timeout(Duration::from_millis(2));
    };
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(&hit.0, hit.1)));
    let _ = child.kill();
    child.wait().unwrap();
    if let Err(panic) = checked {
        std::panic::resume_unwind(panic);
    }
    let stderr = std::fs::read_to_string(&log).unwrap();
    (hit.0, hit.1, stderr)
}

/// The kills, in order: `sink-writing` first, while the source still emits many words per
/// checkpoint; `sink-restoring` right after `sink-committing`, whose restore has prepared
/// transactions (batches) left to commit.
const POINTS: [&str; 5] = [
    "sink-writing",
    "sink-pre-committed",
    "sink-committing",
    "sink-restoring",
    "checkpoint-completed",
];

/// Kills wordcount into `table` (`mode`) at every point of [`POINTS`] and resumes it; then
/// runs it to the end and checks the table against an undisturbed run's.
fn kill_and_resume(mode: &str, table: &str, seed: u64, input: Input) {
    let mut db = db();
    reset(&mut db, table);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let expected = input.expected();
    // 2pc: a prepared transaction of another job's sink of the same uid on the same table,
    // which no restore of this job may touch.
    let other_gid = format!("cairn:{:032x}:sink:0:1", 0xfeed_u128 + u128::from(seed));
    if mode == "2pc" {
        // Two calls: in one, the CREATE would become part of the prepared transaction.
        db.batch_execute(&format!(
            "CREATE TABLE {table} (word text NOT NULL, count bigint NOT NULL)"
        ))
        .unwrap();
        db.batch_execute(&format!(
            "BEGIN; INSERT INTO {table} VALUES ('another-jobs-word', 1); PREPARE TRANSACTION '{other_gid}'"
        ))
        .unwrap();
    }
    let mut next = seeded(seed);
    let mut newest: Option<u64> = None;
    let mut kills = Vec::new();
    for (run, point) in POINTS.into_iter().enumerate() {
        let at = match (point, newest) {
            // The restore of the newest completed checkpoint, whichever of its transactions
            // (batches) is newest.
            ("sink-restoring", Some(_)) => 1,
            _ => {
                let base = if run == 0 {
                    0
                } else {
                    checkpoint_progress(&ck).map_or(0, |p| p.1)
                };
                base + 2 + next() % 2
            }
        };
        let check = |name: &str, id: u64| {
            let job = job_id(&ck);
            let prefix = format!("cairn:{job}:sink:");
            match (name, mode) {
                ("sink-writing", "2pc" | "wal") => assert!(
                    open_transaction_on(&mut db, table),
                    "{mode}: stopped at {name} {id} without an open transaction on {table}"
                ),
                ("sink-pre-committed", "2pc") => {
                    let gids = prepared(&mut db, &prefix);
                    assert!(
                        gids.iter().any(|g| parse_gid(g).is_some_and(|p| p.checkpoint_id == id)),
                        "stopped after pre-committing {id}, but no transaction of it is prepared: {gids:?}"
                    );
                }
                ("sink-committing" | "checkpoint-completed", "2pc") => {
                    let gids = prepared(&mut db, &prefix);
                    assert!(
                        gids.iter().any(|g| parse_gid(g).is_some_and(|p| p.checkpoint_id <= id)),
                        "checkpoint {id} completed and is not committed, but nothing of it is prepared: {gids:?}"
                    );
                }
                _ => {}
            }
        };
        let cmd = input.wordcount(mode, table, &ck, true);
        let (name, id, stderr) = kill_at(cmd, point, at, tmp.path(), run, check);
        assert_eq!(name, point, "{mode}: run {run} stopped at another point");
        assert_eq!(
            restored_checkpoint(&stderr),
            newest,
            "{mode}: run {run} did not restore the newest completed checkpoint: {stderr}"
        );
        let now = checkpoint_progress(&ck).map(|p| p.0);
        let completed = now.unwrap_or(0);
        match point {
            "sink-restoring" => {
                let restored = newest.unwrap_or(0);
                assert!(
                    id >= 1 && id <= restored,
                    "{mode}: restored {restored}, stopped at {id}"
                );
                if mode == "upsert" {
                    assert_eq!(id, restored, "upsert's state names its checkpoint");
                }
                assert_eq!(now, newest, "{mode}: nothing completes during a restore");
            }
            "checkpoint-completed" => assert_eq!(completed, id, "{mode}: {point} {id}"),
            // wal writes a batch once its checkpoint completed.
            "sink-committing" => assert!(completed >= id, "{mode}: {point} {id}"),
            "sink-writing" if mode == "wal" => {
                assert!(id >= at, "{mode}: {point} fired at {id}, armed for {at}");
                assert!(
                    completed >= id,
                    "{mode}: {point} {id}: {completed} completed"
                );
            }
            _ => {
                assert!(id >= at, "{mode}: {point} fired at {id}, armed for {at}");
                assert!(
                    completed < id,
                    "{mode}: {point} {id}: {completed} completed"
                );
            }
        }
        assert!(now >= newest, "{mode}: completed checkpoints went back");
        newest = now;
        // Never a duplicate committed, not even between kills.
        check_table(&mut db, mode, table, &expected, false);
        kills.push(format!("{point} at {id}"));
    }
    let out = run_ok(
        input
            .wordcount(mode, table, &ck, false)
            .stderr(Stdio::piped()),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(restored_checkpoint(&stderr), newest, "{mode}: {stderr}");
    eprintln!("{mode}: SIGKILLs at {}", kills.join(", "));
    check_table(&mut db, mode, table, &expected, true);
    let job = job_id(&ck);
    assert_eq!(
        prepared(&mut db, &format!("cairn:{job}:")),
        Vec::<String>::new(),
        "{mode}: prepared transactions of the job are left"
    );
    if mode == "2pc" {
        assert_eq!(
            prepared(&mut db, &other_gid),
            vec![other_gid.clone()],
            "the other job's prepared transaction was touched"
        );
        db.batch_execute(&format!("ROLLBACK PREPARED '{other_gid}'"))
            .unwrap();
    }
    if mode == "wal" {
        let n: i64 = db
            .query_one(
                &format!("SELECT count(*) FROM {table}_cairn_commits WHERE job = $1"),
                &[&job],
            )
            .unwrap()
            .get(0);
        assert!(n > 0, "wal: no commit recorded for job {job}");
    }
    reset(&mut db, table);
}

#[test]
fn two_phase_commit_sigkilled_at_failpoints_ends_exactly_once() {
    kill_and_resume("2pc", "cairn_test_kill_2pc", 41, Input::Generated);
}

#[test]
fn upsert_sigkilled_at_failpoints_ends_with_the_final_counts() {
    kill_and_resume("upsert", "cairn_test_kill_upsert", 42, Input::Generated);
}

#[test]
fn write_ahead_log_sigkilled_at_failpoints_ends_exactly_once() {
    kill_and_resume("wal", "cairn_test_kill_wal", 43, Input::Generated);
}

/// Kafka -> PostgreSQL, end to end through real services: the same kills, with the words read
/// from a bounded Kafka topic (the source's offsets restored with the sink's transactions).
#[test]
fn kafka_to_postgres_two_phase_commit_sigkilled_at_failpoints_ends_exactly_once() {
    kill_and_resume(
        "2pc",
        "cairn_test_kafka_2pc",
        51,
        Input::Kafka(kafka_lines()),
    );
}

#[test]
fn kafka_to_postgres_upsert_sigkilled_at_failpoints_ends_with_the_final_counts() {
    kill_and_resume(
        "upsert",
        "cairn_test_kafka_upsert",
        52,
        Input::Kafka(kafka_lines()),
    );
}

#[test]
fn kafka_to_postgres_write_ahead_log_sigkilled_at_failpoints_ends_exactly_once() {
    kill_and_resume(
        "wal",
        "cairn_test_kafka_wal",
        53,
        Input::Kafka(kafka_lines()),
    );
}

/// A 2pc job killed before its first checkpoint completed leaves prepared transactions; the
/// resumed job starts fresh under its id and rolls them back before it writes.
#[test]
fn two_phase_commit_rolls_back_its_leftovers_on_a_fresh_start() {
    let table = "cairn_test_fresh_2pc";
    let mut db = db();
    reset(&mut db, table);
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let cmd = wordcount("2pc", table, &ck, Some(RATE));
    let (name, id, _) = kill_at(cmd, "sink-pre-committed", 1, tmp.path(), 0, |_, _| {});
    assert_eq!((name.as_str(), id), ("sink-pre-committed", 1));
    assert_eq!(checkpoint_progress(&ck), None);
    let job = job_id(&ck);
    let left = prepared(&mut db, &format!("cairn:{job}:sink:"));
    assert!(!left.is_empty(), "the killed run prepared nothing");
    let out = run_ok(wordcount("2pc", table, &ck, None).stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "job {job} completed no checkpoint; starting it fresh"
        )),
        "{stderr}"
    );
    check_table(
        &mut db,
        "2pc",
        table,
        &generated_counts(RECORDS, KEYS),
        true,
    );
    assert!(prepared(&mut db, &format!("cairn:{job}:")).is_empty());
    reset(&mut db, table);
}

/// Undisturbed runs of every mode, with checkpoints and without (the sinks then write at the
/// end of input), write what the contract says.
#[test]
fn undisturbed_runs_write_the_expected_tables() {
    let mut db = db();
    let tmp = tempfile::tempdir().unwrap();
    let (records, keys) = (60_000u64, 500u64);
    let expected = generated_counts(records, keys);
    for mode in ["2pc", "upsert", "wal"] {
        for checkpoints in [true, false] {
            let table = format!("cairn_test_plain_{mode}_{checkpoints}");
            reset(&mut db, &table);
            let mut cmd = cairn();
            cmd.args(["run", "wordcount", "-p", "2"])
                .args([
                    "--generate",
                    &records.to_string(),
                    "--keys",
                    &keys.to_string(),
                ])
                .args([
                    "--pg-output",
                    &url(),
                    "--pg-table",
                    &table,
                    "--pg-mode",
                    mode,
                ]);
            if checkpoints {
                cmd.arg("--checkpoint-dir")
                    .arg(tmp.path().join(&table))
                    .args(["--checkpoint-interval", "50ms"]);
            }
            let out = run_ok(&mut cmd);
            let stderr = String::from_utf8_lossy(&out.stderr);
            if checkpoints {
                assert!(!stderr.contains(", 0 checkpoints completed"), "{stderr}");
            }
            check_table(&mut db, mode, &table, &expected, true);
            reset(&mut db, &table);
        }
    }
}

/// The upsert's guard: rows that carry older counts — as a replay after a failure writes
/// them, here a second job over a prefix of the same words — never move a count back.
#[test]
fn upsert_never_moves_a_count_back() {
    let table = "cairn_test_upsert_guard";
    let mut db = db();
    reset(&mut db, table);
    let keys = 500u64;
    for records in [60_000u64, 20_000] {
        run_ok(
            cairn()
                .args(["run", "wordcount", "-p", "2"])
                .args([
                    "--generate",
                    &records.to_string(),
                    "--keys",
                    &keys.to_string(),
                ])
                .args([
                    "--pg-output",
                    &url(),
                    "--pg-table",
                    table,
                    "--pg-mode",
                    "upsert",
                ]),
        );
    }
    check_table(
        &mut db,
        "upsert",
        table,
        &generated_counts(60_000, keys),
        true,
    );
    reset(&mut db, table);
}

/// Runs `cairn run wordcount` with `args`; asserts it fails with exit code 1 and one line
/// on stderr, which it returns.
fn fails_with_one_line(args: &[&str]) -> String {
    let out = cairn()
        .args(["run", "wordcount", "--generate", "100", "--keys", "10"])
        .args(args)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(stderr.lines().count(), 1, "{args:?}: {stderr}");
    assert!(stderr.starts_with("error: "), "{stderr}");
    stderr
}

#[test]
fn an_unusable_database_or_flag_is_one_clear_line() {
    let mut db = db();
    let e = fails_with_one_line(&[
        "--pg-output",
        "postgres://cairn:cairn@127.0.0.1:1/cairn",
        "--pg-table",
        "t",
    ]);
    assert!(
        e.contains("PostgreSQL 127.0.0.1:1/cairn: cannot connect") && e.contains("refused"),
        "{e}"
    );
    let e = fails_with_one_line(&[
        "--pg-output",
        "postgres://u:secret@h:x/db",
        "--pg-table",
        "t",
    ]);
    assert!(e.contains("--pg-output: not a PostgreSQL URL"), "{e}");
    assert!(!e.contains("secret"), "{e}");
    let e = fails_with_one_line(&["--pg-output", &url(), "--pg-table", "t", "--pg-mode", "xa"]);
    assert!(
        e.contains("--pg-mode 'xa': expected 2pc, upsert or wal"),
        "{e}"
    );
    let e = fails_with_one_line(&["--pg-output", &url(), "--pg-table", "no-dash"]);
    assert!(e.contains("is not a plain identifier"), "{e}");
    // No role may create tables in pg_catalog.
    let e = fails_with_one_line(&["--pg-output", &url(), "--pg-table", "pg_catalog.cairn_t"]);
    assert!(
        e.contains("cannot create table pg_catalog.cairn_t") && e.contains("permission denied"),
        "{e}"
    );
    let table = "cairn_test_no_key";
    reset(&mut db, table);
    db.batch_execute(&format!("CREATE TABLE {table} (word text, count bigint)"))
        .unwrap();
    let e = fails_with_one_line(&[
        "--pg-output",
        &url(),
        "--pg-table",
        table,
        "--pg-mode",
        "upsert",
    ]);
    assert!(e.contains("needs a primary key or unique index on"), "{e}");
    reset(&mut db, table);
    let out = cairn()
        .args(["run", "pipelines", "--generate", "10"])
        .args(["--pg-output", &url(), "--pg-table", "t"])
        .output()
        .unwrap();
    // --pg-output is a parameter of wordcount only: clap refuses it for another job.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: unexpected argument '--pg-output'"),
        "{stderr}"
    );
}

/// A throwaway PostgreSQL cluster on a free port, stopped when dropped.
struct TempCluster {
    dir: tempfile::TempDir,
    bin: PathBuf,
    port: u16,
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Runs a server tool, as the `postgres` user when root (the server refuses to run as root).
fn server_tool(bin: &Path, tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(bin.join(tool));
        c
    } else {
        Command::new(bin.join(tool))
    }
}

impl TempCluster {
    /// initdb and start, with `conf` appended to postgresql.conf.
    fn start(conf: &str) -> TempCluster {
        let bin = std::fs::read_dir("/usr/lib/postgresql")
            .ok()
            .and_then(|d| d.flatten().map(|e| e.path().join("bin")).filter(|b| b.join("initdb").exists()).max())
            .unwrap_or_else(|| {
                panic!("PostgreSQL's server binaries are missing (/usr/lib/postgresql/*/bin/initdb): run scripts/service-postgres, which installs them")
            });
        let dir = tempfile::tempdir().unwrap();
        if is_root() {
            assert!(Command::new("chown")
                .args(["postgres:postgres"])
                .arg(dir.path())
                .status()
                .unwrap()
                .success());
        }
        let data = dir.path().join("data");
        let out = server_tool(&bin, "initdb")
            .arg("-D")
            .arg(&data)
            .args(["-U", "postgres", "--auth=trust"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut text = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        text.push_str(&format!(
            "\nlisten_addresses = '127.0.0.1'\nport = {port}\nunix_socket_directories = '{}'\n{conf}\n",
            dir.path().display()
        ));
        std::fs::write(data.join("postgresql.conf"), text).unwrap();
        let out = server_tool(&bin, "pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(dir.path().join("log"))
            .args(["-w", "-t", "60", "start"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pg_ctl start: {}{}",
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(dir.path().join("log")).unwrap_or_default()
        );
        TempCluster { dir, bin, port }
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }
}

impl Drop for TempCluster {
    fn drop(&mut self) {
        let _ = server_tool(&self.bin, "pg_ctl")
            .arg("-D")
            .arg(self.dir.path().join("data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

/// 2pc on a server with prepared transactions disabled stops at once, saying how to fix it;
/// upsert and wal need no prepared transactions and run there.
#[test]
fn two_phase_commit_without_prepared_transactions_is_refused_with_the_fix() {
    let server = TempCluster::start("max_prepared_transactions = 0");
    let e = fails_with_one_line(&[
        "--pg-output",
        &server.url(),
        "--pg-table",
        "t",
        "--pg-mode",
        "2pc",
    ]);
    assert!(
        e.contains("max_prepared_transactions = 0")
            && e.contains("set max_prepared_transactions")
            && e.contains("restart the server"),
        "{e}"
    );
    for mode in ["upsert", "wal"] {
        run_ok(
            cairn()
                .args(["run", "wordcount", "--generate", "1000", "--keys", "10"])
                .args([
                    "--pg-output",
                    &server.url(),
                    "--pg-table",
                    mode,
                    "--pg-mode",
                    mode,
                ]),
        );
    }
    let mut c = Client::connect(&server.url(), NoTls).unwrap();
    let n: i64 = c.query_one("SELECT count(*) FROM wal", &[]).unwrap().get(0);
    assert_eq!(n, 1000);
}
