//! SQL jobs end to end (`cairn sql`, `cairn submit --sql`): the Nexmark SQL scripts as the
//! Nexmark project publishes them commit what the built-in Rust jobs commit (q0–q3, q11), or a
//! reference computed here (q4, q9, q15–q22); a window aggregation and a join stay exactly-once
//! through SIGKILLs at failpoints, injected failures, a savepoint resumed at another
//! parallelism, and a worker SIGKILLed on a cluster; bad SQL is a one-line error naming what
//! and where.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cairn::connectors::{Auction, Bid, EventKind, NexmarkEvent, NexmarkGenerator};
use common::*;

const SEED: u64 = 42;
const RATE: u64 = 1_000;

/// The directory of the published Nexmark SQL scripts.
fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../sql/nexmark")
}

/// `text` with `from` replaced by `to`; panics if `from` is not there (the script changed).
fn replaced(text: &str, from: &str, to: &str) -> String {
    assert!(text.contains(from), "{from:?} not in the script");
    text.replace(from, to)
}

/// The Nexmark DDL (the `datagen` table and its views) for `events` events at `RATE` events
/// per second of event time, seeded with `SEED`.
fn ddl(events: u64) -> String {
    ddl_at(events, RATE)
}

/// [`ddl`] at `rate` events per second of event time.
fn ddl_at(events: u64, rate: u64) -> String {
    let text = std::fs::read_to_string(scripts().join("ddl.sql")).unwrap();
    let text = replaced(
        &text,
        "'events.num' = '1000000'",
        &format!("'events.num' = '{events}', 'seed' = '{SEED}'"),
    );
    let text = replaced(
        &text,
        "'first-event.rate' = '10000'",
        &format!("'first-event.rate' = '{rate}'"),
    );
    replaced(
        &text,
        "'next-event.rate' = '10000'",
        &format!("'next-event.rate' = '{rate}'"),
    )
}

/// The options of a filesystem sink into `out`: tab-separated lines, as the built-in jobs
/// write them.
fn into_files(out: &Path) -> String {
    format!(
        "'connector' = 'filesystem', 'path' = '{}', 'format' = 'csv', 'csv.field-delimiter' = '\\t'",
        out.display()
    )
}

/// Nexmark query `query` as published (`sql/nexmark/QUERY.sql`) after the DDL, its blackhole
/// sink swapped for files in `out`.
fn nexmark_script(query: &str, events: u64, out: &Path) -> String {
    let text = std::fs::read_to_string(scripts().join(format!("{query}.sql"))).unwrap();
    let text = replaced(&text, "'connector' = 'blackhole'", &into_files(out));
    format!("{}\n{text}", ddl(events))
}

/// `cairn sql -e SCRIPT -p P`.
fn sql(script: &str, parallelism: u32) -> Command {
    let mut cmd = cairn();
    cmd.args(["sql", "-e", script, "-p", &parallelism.to_string()]);
    cmd
}

fn assert_same(what: &str, got: &[String], expected: &[String]) {
    assert!(
        got == expected,
        "{what}: {} lines committed, {} expected; first difference: {:?}",
        got.len(),
        expected.len(),
        got.iter().zip(expected).find(|(g, e)| g != e)
    );
}

#[test]
fn nexmark_q0_q1_q2_q3_q11_in_sql_commit_what_the_built_in_jobs_commit() {
    let events = 50_000;
    for query in ["q0", "q1", "q2", "q3", "q11"] {
        let tmp = tempfile::tempdir().unwrap();
        let (rust, from_sql) = (tmp.path().join("rust"), tmp.path().join("sql"));
        run_ok(
            cairn()
                .args(["run", "nexmark", "--query", query])
                .args(["--events", &events.to_string(), "--seed", &SEED.to_string()])
                .args(["--rate", &RATE.to_string(), "-p", "2", "--output"])
                .arg(&rust),
        );
        run_ok(&mut sql(&nexmark_script(query, events, &from_sql), 2));
        assert_no_leftovers(&from_sql);
        let expected = committed_sorted(&rust);
        assert!(
            !expected.is_empty(),
            "{query}: the built-in job wrote nothing"
        );
        assert_same(query, &committed_sorted(&from_sql), &expected);
    }
}

/// Every bid of the first `events` events.
fn bids(events: u64) -> Vec<Bid> {
    bids_at(events, RATE)
}

/// [`bids`] at `rate` events per second of event time.
fn bids_at(events: u64, rate: u64) -> Vec<Bid> {
    let generator = NexmarkGenerator::new(SEED, rate);
    (0..events)
        .filter(|&n| EventKind::of(n) == EventKind::Bid)
        .map(|n| match generator.event(n) {
            NexmarkEvent::Bid(b) => b,
            _ => panic!("event {n} is not a bid"),
        })
        .collect()
}

/// `REGEXP_EXTRACT(url, '(&|^)channel_id=([^&]*)', 2)`, by hand.
fn channel_id(url: &str) -> Option<&str> {
    let start = if let Some(rest) = url.strip_prefix("channel_id=") {
        rest
    } else {
        let at = url.find("&channel_id=")?;
        &url[at + "&channel_id=".len()..]
    };
    Some(start.split('&').next().unwrap_or(""))
}

#[test]
fn nexmark_q21_and_q22_in_sql_commit_the_reference() {
    let events = 50_000;
    let bids = bids(events);
    let mut q21: Vec<String> = bids
        .iter()
        .filter_map(|b| {
            let id = match b.channel.to_lowercase().as_str() {
                "apple" => "0",
                "google" => "1",
                "facebook" => "2",
                "baidu" => "3",
                _ => channel_id(&b.url)?,
            };
            Some(format!(
                "{}\t{}\t{}\t{}\t{id}",
                b.auction, b.bidder, b.price, b.channel
            ))
        })
        .collect();
    let mut q22: Vec<String> = bids
        .iter()
        .map(|b| {
            let dir = |i| b.url.split('/').nth(i).unwrap_or("");
            format!(
                "{}\t{}\t{}\t{}\t{}\t{}\t{}",
                b.auction,
                b.bidder,
                b.price,
                b.channel,
                dir(3),
                dir(4),
                dir(5)
            )
        })
        .collect();
    q21.sort_unstable();
    q22.sort_unstable();
    assert!(
        q21.len() > 1000 && q21.len() < bids.len(),
        "q21 filters some bids"
    );
    for (query, expected) in [("q21", q21), ("q22", q22)] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        run_ok(&mut sql(&nexmark_script(query, events, &out), 3));
        assert_same(query, &committed_sorted(&out), &expected);
    }
}

/// Events of the window jobs: enough for a run with 30 ms checkpoints to take several.
const WINDOW_EVENTS: u64 = 2_000_000;

/// A sliding-window aggregation over the Nexmark bids into files in `out`: per auction and
/// 10 s window sliding by 5 s, its bids, their total, the top price and the distinct bidders.
fn window_script(out: &Path) -> String {
    format!(
        "{}
CREATE TABLE auction_windows (
    auction BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3),
    bids BIGINT, volume BIGINT, top_price BIGINT, bidders BIGINT
) WITH ({});
INSERT INTO auction_windows
SELECT auction, window_start, window_end, COUNT(*), SUM(price), MAX(price), COUNT(DISTINCT bidder)
FROM TABLE(HOP(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '5' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;",
        ddl(WINDOW_EVENTS),
        into_files(out)
    )
}

/// The window job undisturbed at parallelism 1; checked against the bids: every bid is
/// counted in exactly two windows.
fn undisturbed_windows() -> Vec<String> {
    static LINES: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    LINES
        .get_or_init(|| {
            let tmp = tempfile::tempdir().unwrap();
            let out = tmp.path().join("out");
            run_ok(&mut sql(&window_script(&out), 1));
            let lines = committed_sorted(&out);
            let counted: u64 = lines
                .iter()
                .map(|l| l.split('\t').nth(3).unwrap().parse::<u64>().unwrap())
                .sum();
            // The last bids' second windows close at the end of input too.
            assert_eq!(counted, 2 * bids(WINDOW_EVENTS).len() as u64);
            lines
        })
        .clone()
}

/// Runs the script `script(out)` at parallelism 2 with 30 ms checkpoints, SIGKILLed at each
/// failpoint in turn (order and checkpoints from `seed`), resumed `--from latest` each time
/// and once more to its end; its committed lines must be `expected`.
fn killed_and_resumed(script: &dyn Fn(&Path) -> String, seed: u64, expected: &[String]) {
    let check = |out: &Path| {
        assert_no_leftovers(out);
        assert_same("killed and resumed", &committed_sorted(out), expected);
    };
    killed_at(script, seed, &FAILPOINTS, &check);
}

/// [`killed_and_resumed`] at `points`, the output checked by `check`.
fn killed_at(script: &dyn Fn(&Path) -> String, seed: u64, points: &[&str], check: &dyn Fn(&Path)) {
    let tmp = tempfile::tempdir().unwrap();
    let (out, ck) = (tmp.path().join("out"), tmp.path().join("ck"));
    let text = script(&out);
    let run = || {
        let mut cmd = sql(&text, 2);
        cmd.arg("--checkpoint-dir").arg(&ck).args([
            "--checkpoint-interval",
            "30ms",
            "--from",
            "latest",
        ]);
        cmd
    };
    let mut next = seeded(seed);
    let mut points = points.to_vec();
    for i in (1..points.len()).rev() {
        points.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    for (i, point) in points.into_iter().enumerate() {
        let at = 2 + 2 * i as u64 + next() % 2;
        let marker = tmp.path().join(format!("marker-{i}"));
        let log = tmp.path().join(format!("run-{i}.log"));
        let (name, id) = kill_at_failpoint(run(), point, at, &marker, &log)
            .unwrap_or_else(|e| panic!("run {i}: {e}"));
        assert_eq!(name, point, "run {i}");
        assert!(id >= at, "{point} fired at {id}, armed for {at}");
    }
    let last = run_ok(run().stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&last.stderr);
    assert!(stderr.contains("restored from "), "{stderr}");
    check(&out);
}

const PG_URL: &str = "postgres://cairn:cairn@127.0.0.1:55432/cairn";

/// The test PostgreSQL server (`scripts/service-postgres`, or `CAIRN_TEST_PG_URL`).
fn pg() -> (postgres::Client, String) {
    let url = std::env::var("CAIRN_TEST_PG_URL").unwrap_or_else(|_| PG_URL.to_string());
    let client = postgres::Client::connect(&url, postgres::NoTls).unwrap_or_else(|e| {
        panic!("PostgreSQL at {url} does not answer ({e}): start it with scripts/service-postgres (or set CAIRN_TEST_PG_URL)")
    });
    (client, url)
}

/// An updating aggregation into a jdbc (PostgreSQL upsert) sink, SIGKILLed at every failpoint
/// (one inside the sink's transaction too) and resumed: the table ends as the aggregation of
/// every row, each counted once.
#[test]
fn an_updating_aggregation_into_a_jdbc_table_sigkilled_and_resumed_ends_exactly_right() {
    let rows = 3_000_000u64;
    let (mut db, url) = pg();
    let table = format!("sql_totals_{}", std::process::id());
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} (k BIGINT PRIMARY KEY, cnt BIGINT, total BIGINT, top BIGINT, amounts BIGINT)"
    ))
    .unwrap();
    let jdbc = url.replacen("postgres://cairn:cairn@", "jdbc:postgresql://", 1);
    let script = |_: &Path| {
        format!(
            "CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE TABLE totals (k BIGINT, cnt BIGINT, total BIGINT, top BIGINT, amounts BIGINT, PRIMARY KEY (k) NOT ENFORCED)
  WITH ('connector' = 'jdbc', 'url' = '{jdbc}', 'table-name' = '{table}', 'username' = 'cairn', 'password' = 'cairn');
INSERT INTO totals
SELECT k, COUNT(*), SUM(amount), MAX(amount), COUNT(DISTINCT amount)
FROM (SELECT id % 1000 AS k, id * 7 % 101 AS amount FROM numbers)
GROUP BY k;"
        )
    };
    let mut points = FAILPOINTS.to_vec();
    points.push("sink-writing");
    let check = |_: &Path| {
        let (mut db, _) = pg();
        let got: Vec<(i64, i64, i64, i64, i64)> = db
            .query(
                &format!("SELECT k, cnt, total, top, amounts FROM {table} ORDER BY k"),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
            .collect();
        let mut expected = std::collections::BTreeMap::<
            i64,
            (i64, i64, i64, std::collections::BTreeSet<i64>),
        >::new();
        for id in 0..rows as i64 {
            let e = expected.entry(id % 1000).or_default();
            let amount = id * 7 % 101;
            e.0 += 1;
            e.1 += amount;
            e.2 = e.2.max(amount);
            e.3.insert(amount);
        }
        let expected: Vec<(i64, i64, i64, i64, i64)> = expected
            .into_iter()
            .map(|(k, (c, t, m, d))| (k, c, t, m, d.len() as i64))
            .collect();
        assert!(
            got == expected,
            "{} rows in the table, {} expected; first difference: {:?}",
            got.len(),
            expected.len(),
            got.iter().zip(&expected).find(|(g, e)| g != e)
        );
    };
    killed_at(&script, 41, &points, &check);
    db.batch_execute(&format!("DROP TABLE {table}")).unwrap();
}

#[test]
fn a_window_aggregation_sigkilled_at_failpoints_and_resumed_commits_exactly_the_undisturbed_output()
{
    killed_and_resumed(&window_script, 24, &undisturbed_windows());
}

/// A regular join (Nexmark q3 as published) SIGKILLed at each failpoint commits exactly what
/// the built-in q3 commits: both sides' rows are in keyed state, restored with the job.
#[test]
fn a_join_sigkilled_at_failpoints_and_resumed_commits_exactly_the_built_in_output() {
    // q3 reads persons and auctions only (8 % of the events): enough of them that every run
    // lasts past its failpoint's checkpoint.
    let events = 30 * WINDOW_EVENTS;
    let tmp = tempfile::tempdir().unwrap();
    let rust = tmp.path().join("rust");
    run_ok(
        cairn()
            .args(["run", "nexmark", "--query", "q3"])
            .args(["--events", &events.to_string(), "--seed", &SEED.to_string()])
            .args(["--rate", &RATE.to_string(), "-p", "2", "--output"])
            .arg(&rust),
    );
    let expected = committed_sorted(&rust);
    assert!(expected.len() > 1000, "{} lines", expected.len());
    killed_and_resumed(&|out| nexmark_script("q3", events, out), 33, &expected);
}

/// On RocksDB with incremental checkpoints, set by the script's own `SET` statements.
#[test]
fn a_window_aggregation_on_rocksdb_with_injected_failures_commits_exactly_the_undisturbed_output() {
    let expected = undisturbed_windows();
    let tmp = tempfile::tempdir().unwrap();
    let (out, ck) = (tmp.path().join("out"), tmp.path().join("ck"));
    let script = format!(
        "SET 'state.backend.type' = 'rocksdb';
SET 'state.backend.incremental' = 'true';
SET 'state.backend.rocksdb.localdir' = '{}';
{}",
        tmp.path().join("rocks").display(),
        window_script(&out)
    );
    let run = run_ok(
        sql(&script, 2)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .args(["--checkpoint-interval", "50ms", "--inject-failures", "3"])
            .args(RESTART_FAST),
    );
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains(", 3 restarts, 3/3 injected failures"),
        "{stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("restoring regions") && l.contains(" from checkpoint ")),
        "no failure restored from a checkpoint: they all came before the first one\n{stderr}"
    );
    assert!(
        tmp.path().join("rocks").is_dir(),
        "the script's SET did not choose RocksDB"
    );
    assert_no_leftovers(&out);
    assert_same("injected failures", &committed_sorted(&out), &expected);
}

#[test]
fn a_window_aggregation_resumes_from_a_savepoint_at_another_parallelism_and_a_changed_one_is_refused(
) {
    let expected = undisturbed_windows();
    let tmp = tempfile::tempdir().unwrap();
    let (out, ck, sp) = (
        tmp.path().join("out"),
        tmp.path().join("ck"),
        tmp.path().join("sp"),
    );
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = Watched::spawn(
        sql(&window_script(&out), 2)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .args(["--checkpoint-interval", "30ms"])
            .arg("--savepoint-on-exit")
            .arg(&sp),
    );
    let (savepoint, _) = first.stop_with_savepoint_after_a_checkpoint(&ck, deadline);
    let partial = committed_sorted(&out).len();
    assert!(
        partial < expected.len(),
        "the run ended before it was stopped"
    );

    // The same statements with another aggregate: the window operator's uid changes, and its
    // state in the savepoint cannot be mapped.
    let changed = window_script(&out).replace("MAX(price)", "MIN(price)");
    let refused = sql(&changed, 3)
        .arg("--from")
        .arg(&savepoint)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("holds state of operators the job does not have: auction_windows."),
        "{stderr}"
    );
    assert!(stderr.contains("--allow-non-restored-state"), "{stderr}");

    run_ok(
        sql(&window_script(&out), 3)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .args(["--checkpoint-interval", "200ms"])
            .arg("--from")
            .arg(&savepoint),
    );
    assert_no_leftovers(&out);
    assert_same(
        "2 -> 3 through a savepoint",
        &committed_sorted(&out),
        &expected,
    );
}

#[test]
fn a_sql_job_on_a_cluster_keeps_exactly_once_when_a_worker_is_sigkilled() {
    let expected = undisturbed_windows();
    let tmp = tempfile::tempdir().unwrap();
    let (ck, out) = (tmp.path().join("ck"), tmp.path().join("out"));
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut cluster = Cluster::start(&ck, 0, deadline);
    let marker = tmp.path().join("marker");
    // One slot each: the job's two slots are one on each worker, so the armed one runs a sink.
    let armed = Watched::spawn(
        cluster
            .worker(1)
            .env("CAIRN_FAILPOINTS", "sink-pre-committed=3")
            .env("CAIRN_FAILPOINT_MARKER", &marker),
    );
    let steady = Watched::spawn(&mut cluster.worker(1));
    let script = tmp.path().join("windows.sql");
    std::fs::write(&script, window_script(&out)).unwrap();
    let submitted = run_ok(
        cairn()
            .args(["submit", "--rest", &format!("http://{}", cluster.rest)])
            .arg("--sql")
            .arg(&script)
            .args(["-p", "2", "--checkpoint-interval", "30ms"]),
    );
    let jid = String::from_utf8_lossy(&submitted.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    assert_eq!(jid.len(), 32, "job id: {jid}");
    cluster
        .coordinator
        .wait_until("the armed worker's failpoint", deadline, || {
            assert_ne!(
                rest_job_state(cluster.rest, &jid).as_deref(),
                Some("FINISHED"),
                "the job finished before the armed worker's failpoint"
            );
            read_marker(&marker).is_some()
        });
    let (point, id) = read_marker(&marker).unwrap();
    assert_eq!(point, "sink-pre-committed");
    assert!(id >= 3, "fired at {id}");
    assert_ne!(
        rest_job_state(cluster.rest, &jid).as_deref(),
        Some("FINISHED")
    );
    drop(armed);
    let _replacement = Watched::spawn(&mut cluster.worker(1));
    cluster
        .coordinator
        .wait_until("the job to finish", deadline, || {
            let state = rest_job_state(cluster.rest, &jid);
            assert_ne!(state.as_deref(), Some("FAILED"), "the job failed");
            state.as_deref() == Some("FINISHED")
        });
    drop(steady);
    assert!(rest_job_restarts(cluster.rest, &jid).unwrap() >= 1);
    assert_no_leftovers(&out);
    assert_same("a worker SIGKILLed", &committed_sorted(&out), &expected);
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

const ORDERS: &str = "CREATE TABLE orders (id BIGINT, customer STRING, amount DECIMAL(10, 2), ts TIMESTAMP(3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'datagen', 'number-of-rows' = '100');
CREATE TABLE out_t (customer STRING, total DECIMAL(38, 2)) WITH ('connector' = 'print');
";

#[test]
fn bad_sql_is_a_one_line_error_naming_what_and_where() {
    let cases: &[(&str, &[&str])] = &[
        // Syntax: line and column.
        (
            "CREATE TABLE t (a INT) WITH ('connector' = 'print');\nINSERT INTO t SELEC a FROM t;",
            &["line 2, column 15", "SELEC"],
        ),
        ("SELECT a FROM", &["SQL error at line 1, column 14", "end of the script"]),
        // Unknown names, with a did-you-mean.
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, SUM(amount) FROM order GROUP BY customer;"),
            &["table or view 'order' not found", "did you mean 'orders'"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT custmer, SUM(amount) FROM orders GROUP BY custmer;"),
            &["line 3", "column 'custmer' not found", "did you mean 'customer'"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, SUMM(amount) FROM orders GROUP BY customer;"),
            &["unknown function SUMM", "did you mean 'SUM'"],
        ),
        // Features cairn does not support yet are named.
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT a.customer, a.amount FROM orders a LEFT JOIN orders b USING (id);"),
            &["line 3, column 71", "an outer join without ON is not supported"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT a.customer, a.amount FROM orders a, orders b WHERE a.id < b.id;"),
            &["cross join is not supported"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, amount FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY customer ORDER BY amount DESC) AS rn FROM orders);"),
            &["line 3", "ROW_NUMBER() needs a filter on its result", "rn <= N"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, amount FROM (SELECT *, PERCENT_RANK() OVER (PARTITION BY customer ORDER BY amount DESC) AS rn FROM orders) WHERE rn <= 3;"),
            &["PERCENT_RANK() OVER (…) is not supported", "only ROW_NUMBER(), RANK() and DENSE_RANK()"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, amount FROM (SELECT *, ROW_NUMBER() OVER (PARTITION BY customer ORDER BY amount * 2) AS rn FROM orders) WHERE rn <= 3;"),
            &["must name columns, not 'amount * 2'"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, SUM(amount) OVER (PARTITION BY customer ORDER BY ts) FROM orders;"),
            &["SUM() OVER (…) is not supported"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, SUM(amount) FROM TABLE(CUMULATE(TABLE orders, DESCRIPTOR(ts), INTERVAL '7' MINUTE, INTERVAL '1' HOUR)) GROUP BY customer, window_start, window_end;"),
            &["line 3", "CUMULATE's max size (3600000 ms) must be a multiple of its step (420000 ms)"],
        ),
        // Wrong types.
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, SUM(amount) FROM orders WHERE customer + 1 > 2 GROUP BY customer;"),
            &["operator + does not apply to STRING and INT"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer, SUM(amount) FROM orders GROUP BY customer, TUMBLE(id, INTERVAL '1' MINUTE);"),
            &["'id' is not a time attribute"],
        ),
        (
            &format!("{ORDERS}INSERT INTO out_t SELECT customer FROM orders;"),
            &["gives 1 column(s), table 'out_t' has 2"],
        ),
        // Options.
        (
            &format!("{ORDERS}CREATE TABLE j (customer STRING, total DECIMAL(38, 2)) WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:1/x', 'table-name' = 't');\nINSERT INTO j SELECT customer, SUM(amount) FROM orders GROUP BY customer;"),
            &["the jdbc sink needs a PRIMARY KEY"],
        ),
        (
            &format!("{ORDERS}CREATE TABLE j (customer STRING, total DECIMAL(38, 2), PRIMARY KEY (customer) NOT ENFORCED) WITH ('connector' = 'jdbc', 'url' = 'jdbc:mysql://127.0.0.1/x', 'table-name' = 't');\nINSERT INTO j SELECT customer, SUM(amount) FROM orders GROUP BY customer;"),
            &["'url' must be jdbc:postgresql://"],
        ),
        (
            &format!("{ORDERS}CREATE TABLE t (id BIGINT) WITH ('connector' = 'nosuch');\nINSERT INTO t SELECT id FROM orders;"),
            &["'nosuch'"],
        ),
        (
            &format!("{ORDERS}CREATE TABLE f (customer STRING, total DECIMAL(38, 2)) WITH ('connector' = 'filesystem', 'path' = '/tmp/x', 'format' = 'csv');\nINSERT INTO f SELECT customer, SUM(amount) FROM orders GROUP BY customer;"),
            &["filesystem sink only appends"],
        ),
    ];
    for (script, needles) in cases {
        let line = refused(script);
        for needle in *needles {
            assert!(
                line.to_lowercase().contains(&needle.to_lowercase()),
                "{script}\n-> {line}\n(expected {needle:?})"
            );
        }
    }
    // A script for a cluster: its relative paths would mean another place on the workers.
    let tmp = tempfile::tempdir().unwrap();
    let script = tmp.path().join("relative.sql");
    std::fs::write(
        &script,
        format!("{ORDERS}CREATE TABLE f (customer STRING) WITH ('connector' = 'filesystem', 'path' = 'out', 'format' = 'csv');\nINSERT INTO f SELECT customer FROM orders;"),
    )
    .unwrap();
    let submitted = cairn()
        .args(["submit", "--rest", "http://127.0.0.1:1", "--sql"])
        .arg(&script)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&submitted.stderr);
    assert_eq!(submitted.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("make it absolute: table 'f': 'path' = 'out'"),
        "{stderr}"
    );
    let missing = cairn().args(["sql", "no/such/file.sql"]).output().unwrap();
    assert_eq!(missing.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("no/such/file.sql"), "{stderr}");
}

#[test]
fn explain_prints_the_job_graph_with_parallelism_keys_state_and_uids() {
    let tmp = tempfile::tempdir().unwrap();
    let whole = window_script(&tmp.path().join("out"));
    let (tables, query) = whole.rsplit_once("INSERT INTO").unwrap();
    let script = format!("{tables}\nEXPLAIN INSERT INTO{query}");
    let out = run_ok(cairn().args(["sql", "-e", &script, "-p", "3"]));
    let plan = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "parallelism 3",
        "auction_windows.",
        "HOP",
        "key",
        "state",
        "source: datagen",
    ] {
        assert!(plan.contains(needle), "{needle:?} not in:\n{plan}");
    }
    assert!(!tmp.path().join("out").exists(), "EXPLAIN ran the job");
}

/// The final table a printed changelog describes: `+I`/`+U` add a row, `-U`/`-D` take one
/// back (which must be there).
fn apply_changelog(stdout: &str) -> Vec<String> {
    let mut table: std::collections::BTreeMap<String, u64> = Default::default();
    for line in stdout.lines() {
        let (kind, row) = line.split_at(2);
        let row = row
            .strip_prefix('[')
            .and_then(|r| r.strip_suffix(']'))
            .unwrap_or_else(|| panic!("not a printed row: {line}"))
            .to_string();
        match kind {
            "+I" | "+U" => *table.entry(row).or_default() += 1,
            "-U" | "-D" => {
                let n = table
                    .get_mut(&row)
                    .unwrap_or_else(|| panic!("{line} retracts a row that is not there"));
                *n -= 1;
                if *n == 0 {
                    table.remove(&row);
                }
            }
            _ => panic!("unknown change {line}"),
        }
    }
    table
        .into_iter()
        .flat_map(|(row, n)| std::iter::repeat_n(row, n as usize))
        .collect()
}

#[test]
fn updating_aggregations_retract_what_they_emitted_at_parallelism_2() {
    let rows = 20_000u64;
    let script = format!(
        "CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE VIEW keyed AS SELECT id % 97 AS k, id * 7 % 101 AS amount FROM numbers;
CREATE VIEW per_key AS SELECT k, COUNT(*) AS cnt, SUM(amount) AS total, MAX(amount) AS top, COUNT(DISTINCT amount) AS amounts FROM keyed GROUP BY k;
CREATE TABLE per_key_out (k BIGINT, cnt BIGINT, total BIGINT, top BIGINT, amounts BIGINT) WITH ('connector' = 'print');
BEGIN STATEMENT SET;
INSERT INTO per_key_out SELECT * FROM per_key;
END;"
    );
    let out = run_ok(&mut sql(&script, 2));
    let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    let mut expected: std::collections::BTreeMap<
        u64,
        (u64, u64, u64, std::collections::BTreeSet<u64>),
    > = Default::default();
    for id in 0..rows {
        let e = expected.entry(id % 97).or_default();
        let amount = id * 7 % 101;
        e.0 += 1;
        e.1 += amount;
        e.2 = e.2.max(amount);
        e.3.insert(amount);
    }
    let mut expected: Vec<String> = expected
        .iter()
        .map(|(k, (c, t, m, d))| format!("{k}, {c}, {t}, {m}, {}", d.len()))
        .collect();
    expected.sort_unstable();
    assert_same("per key", &got, &expected);

    // Two levels: the second aggregation counts keys per count, so every update of the first
    // retracts a row of its input.
    let buckets = "CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = 'ROWS', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
SELECT cnt, COUNT(*) AS keys FROM (SELECT id % 97 AS k, COUNT(*) AS cnt FROM numbers GROUP BY id % 97) GROUP BY cnt;"
        .replace("ROWS", &rows.to_string());
    let out = run_ok(&mut sql(&buckets, 2));
    let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    let mut per_count: std::collections::BTreeMap<u64, u64> = Default::default();
    for k in 0..97 {
        *per_count
            .entry((0..rows).filter(|id| id % 97 == k).count() as u64)
            .or_default() += 1;
    }
    let mut expected: Vec<String> = per_count.iter().map(|(c, n)| format!("{c}, {n}")).collect();
    expected.sort_unstable();
    assert_same("keys per count", &got, &expected);
}

/// Nexmark query `query` as published, its blackhole sink swapped for `print`.
fn printed_nexmark(query: &str, events: u64) -> String {
    printed_nexmark_at(query, events, RATE)
}

/// [`printed_nexmark`] at `rate` events per second of event time.
fn printed_nexmark_at(query: &str, events: u64, rate: u64) -> String {
    let text = std::fs::read_to_string(scripts().join(format!("{query}.sql"))).unwrap();
    let text = replaced(&text, "'connector' = 'blackhole'", "'connector' = 'print'");
    format!("{}\n{text}", ddl_at(events, rate))
}

/// A bid as `print` shows its columns.
fn bid_text(b: &Bid) -> String {
    let mut time = String::new();
    cairn::sql::types::write_timestamp(&mut time, b.date_time);
    format!(
        "{}, {}, {}, {}, {}, {time}, {}",
        b.auction, b.bidder, b.price, b.channel, b.url, b.extra
    )
}

#[test]
fn nexmark_q18_and_q19_deduplicate_and_rank_into_the_reference_at_parallelism_2() {
    let events = 50_000;
    let bids = bids(events);

    // q18: the last bid of each bidder on each auction (ties in time: the later one).
    let mut last: std::collections::BTreeMap<(i64, i64), &Bid> = Default::default();
    for b in &bids {
        let e = last.entry((b.bidder, b.auction)).or_insert(b);
        if b.date_time >= e.date_time {
            *e = b;
        }
    }
    let mut expected: Vec<String> = last.values().map(|b| bid_text(b)).collect();
    expected.sort_unstable();
    assert!(
        expected.len() < bids.len(),
        "q18 keeps fewer bids than there are"
    );
    let out = run_ok(&mut sql(&printed_nexmark("q18", events), 2));
    let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    assert_same("q18", &got, &expected);

    // q19: the ten highest bids of each auction with their rank. Which of two bids of the same
    // price ranks first depends on their arrival, so the comparison is on auction, price and
    // rank, and every row printed must be a bid.
    let mut per_auction: std::collections::BTreeMap<i64, Vec<i64>> = Default::default();
    for b in &bids {
        per_auction.entry(b.auction).or_default().push(b.price);
    }
    let mut expected: Vec<String> = Vec::new();
    for (auction, prices) in &mut per_auction {
        prices.sort_unstable_by(|a, b| b.cmp(a));
        for (rank, price) in prices.iter().take(10).enumerate() {
            expected.push(format!("{auction}, {price}, {}", rank + 1));
        }
    }
    expected.sort_unstable();
    assert!(
        per_auction.values().any(|p| p.len() > 10),
        "some auction has more than ten bids"
    );
    let out = run_ok(&mut sql(&printed_nexmark("q19", events), 2));
    let rows = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    let texts: std::collections::HashSet<String> = bids.iter().map(bid_text).collect();
    let mut got: Vec<String> = rows
        .iter()
        .map(|row| {
            let (bid, rank) = row.rsplit_once(", ").unwrap();
            assert!(
                texts.contains(bid),
                "q19 printed a row that is no bid: {row}"
            );
            let f: Vec<&str> = bid.split(", ").collect();
            format!("{}, {}, {rank}", f[0], f[2])
        })
        .collect();
    got.sort_unstable();
    assert_same("q19", &got, &expected);
}

#[test]
fn a_top_n_over_a_changelog_and_a_first_row_deduplication_commit_the_reference() {
    // Top 3 keys of each of 5 buckets by their running total: every update of a total
    // retracts a row of the rank's input, so rows leave and re-enter the top ranks.
    let rows = 20_000u64;
    let script = format!(
        "CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE VIEW totals AS SELECT id % 97 AS k, SUM(id * 7 % 101) AS total FROM numbers GROUP BY id % 97;
CREATE VIEW bucketed AS SELECT k % 5 AS b, k, total FROM totals;
SELECT b, k, total, rn FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY b ORDER BY total DESC, k) AS rn FROM bucketed
) WHERE rn <= 3;"
    );
    let out = run_ok(&mut sql(&script, 2));
    let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    let mut totals = [0u64; 97];
    for id in 0..rows {
        totals[(id % 97) as usize] += id * 7 % 101;
    }
    let mut expected = Vec::new();
    for b in 0..5u64 {
        let mut keys: Vec<u64> = (0..97).filter(|k| k % 5 == b).collect();
        keys.sort_by(|x, y| totals[*y as usize].cmp(&totals[*x as usize]).then(x.cmp(y)));
        for (rank, k) in keys.iter().take(3).enumerate() {
            expected.push(format!("{b}, {k}, {}, {}", totals[*k as usize], rank + 1));
        }
    }
    expected.sort_unstable();
    assert_same("top 3 per bucket", &got, &expected);

    // The first row of each key by processing time appends only, so a filesystem table (which
    // refuses changelogs) takes it.
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let script = format!(
        "CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE TABLE firsts (k BIGINT, id BIGINT) WITH ({});
INSERT INTO firsts SELECT k, id FROM (
  SELECT *, ROW_NUMBER() OVER (PARTITION BY k ORDER BY pt) AS rn
  FROM (SELECT id, id % 10 AS k, PROCTIME() AS pt FROM numbers)
) WHERE rn = 1;",
        into_files(&out)
    );
    run_ok(&mut sql(&script, 1));
    let expected: Vec<String> = (0..10).map(|k| format!("{k}\t{k}")).collect();
    assert_same("first per key", &committed_sorted(&out), &expected);
}

/// Ranks of `rows` sorted by `key` descending: `RANK()` (ties share, the next skips) or
/// `DENSE_RANK()` (ties share, the next does not skip).
fn tied_ranks(keys: &[u64], dense: bool) -> Vec<u64> {
    let mut ranks: Vec<u64> = Vec::with_capacity(keys.len());
    for (i, k) in keys.iter().enumerate() {
        let rank = match ranks.last() {
            Some(&r) if keys[i - 1] == *k => r,
            Some(&r) if dense => r + 1,
            _ => i as u64 + 1,
        };
        ranks.push(rank);
    }
    ranks
}

/// `RANK()` and `DENSE_RANK()` Top-Ns over rows with many ties, over an append-only input
/// (only rows ranked up to N kept) and over a changelog (counts per key, so ties come and go
/// as counts grow), at parallelism 2: the tables they leave are the reference.
#[test]
fn rank_and_dense_rank_top_ns_keep_every_tied_row_at_parallelism_2() {
    let rows = 2_000u64;
    let numbers = format!("CREATE TABLE numbers (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');");
    for (function, dense, n) in [("RANK", false, 40u64), ("DENSE_RANK", true, 3)] {
        let script = format!(
            "{numbers}
SELECT b, v, id, r FROM (
  SELECT b, v, id, {function}() OVER (PARTITION BY b ORDER BY v DESC) AS r
  FROM (SELECT id % 5 AS b, id * 7 % 13 AS v, id FROM numbers)
) WHERE r <= {n};"
        );
        let out = run_ok(&mut sql(&script, 2));
        let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
        let mut expected = Vec::new();
        for b in 0..5u64 {
            let mut ids: Vec<u64> = (0..rows).filter(|id| id % 5 == b).collect();
            ids.sort_by_key(|id| std::cmp::Reverse(id * 7 % 13));
            let values: Vec<u64> = ids.iter().map(|id| id * 7 % 13).collect();
            for ((id, v), r) in ids.iter().zip(&values).zip(tied_ranks(&values, dense)) {
                if r <= n {
                    expected.push(format!("{b}, {v}, {id}, {r}"));
                }
            }
        }
        expected.sort_unstable();
        assert!(
            expected.len() as u64 > 5 * n,
            "{function}: ties must be kept"
        );
        assert_same(&format!("{function} over appends"), &got, &expected);

        let script = format!(
            "{numbers}
CREATE VIEW counts AS SELECT id % 23 AS k, COUNT(*) AS c FROM numbers GROUP BY id % 23;
SELECT b, k, c, r FROM (
  SELECT b, k, c, {function}() OVER (PARTITION BY b ORDER BY c DESC) AS r
  FROM (SELECT k % 2 AS b, k, c FROM counts)
) WHERE r <= 2;"
        );
        let out = run_ok(&mut sql(&script, 2));
        let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
        let mut expected = Vec::new();
        for b in 0..2u64 {
            let count = |k: &u64| (0..rows).filter(|id| id % 23 == *k).count() as u64;
            let mut keys: Vec<u64> = (0..23).filter(|k| k % 2 == b).collect();
            keys.sort_by_key(|k| std::cmp::Reverse(count(k)));
            let counts: Vec<u64> = keys.iter().map(count).collect();
            for ((k, c), r) in keys.iter().zip(&counts).zip(tied_ranks(&counts, dense)) {
                if r <= 2 {
                    expected.push(format!("{b}, {k}, {c}, {r}"));
                }
            }
        }
        expected.sort_unstable();
        assert_same(&format!("{function} over a changelog"), &got, &expected);
    }
}

/// Every auction of the first `events` events.
fn auctions(events: u64) -> Vec<Auction> {
    let generator = NexmarkGenerator::new(SEED, RATE);
    (0..events)
        .filter(|&n| EventKind::of(n) == EventKind::Auction)
        .map(|n| match generator.event(n) {
            NexmarkEvent::Auction(a) => a,
            _ => panic!("event {n} is not an auction"),
        })
        .collect()
}

#[test]
fn nexmark_q9_joins_and_ranks_into_the_winning_bids_at_parallelism_2() {
    let events = 30_000;
    let (auctions, bids) = (auctions(events), bids(events));
    let time = |ms: i64| {
        let mut t = String::new();
        cairn::sql::types::write_timestamp(&mut t, ms);
        t
    };
    let mut expected = Vec::new();
    for a in &auctions {
        let winner = bids
            .iter()
            .filter(|b| b.auction == a.id && (a.date_time..=a.expires).contains(&b.date_time))
            .min_by(|x, y| y.price.cmp(&x.price).then(x.date_time.cmp(&y.date_time)));
        if let Some(b) = winner {
            expected.push(format!(
                "{}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}",
                a.id,
                a.item_name,
                a.description,
                a.initial_bid,
                a.reserve,
                time(a.date_time),
                time(a.expires),
                a.seller,
                a.category,
                a.extra,
                b.auction,
                b.bidder,
                b.price,
                time(b.date_time),
                b.extra
            ));
        }
    }
    expected.sort_unstable();
    assert!(
        expected.len() > 100 && expected.len() < auctions.len(),
        "some auctions have a winning bid, not all: {} of {}",
        expected.len(),
        auctions.len()
    );
    let out = run_ok(&mut sql(&printed_nexmark("q9", events), 2));
    let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    assert_same("q9", &got, &expected);
}

#[test]
fn nexmark_q5_q7_q8_in_sql_append_what_the_built_in_jobs_commit() {
    let events = 50_000;
    for query in ["q5", "q7", "q8"] {
        let tmp = tempfile::tempdir().unwrap();
        let rust = tmp.path().join("rust");
        run_ok(
            cairn()
                .args(["run", "nexmark", "--query", query])
                .args(["--events", &events.to_string(), "--seed", &SEED.to_string()])
                .args(["--rate", &RATE.to_string(), "-p", "2", "--output"])
                .arg(&rust),
        );
        let expected = committed_sorted(&rust);
        assert!(
            !expected.is_empty(),
            "{query}: the built-in job wrote nothing"
        );
        // Each only appends, as in Flink: q5's maximum per window is an aggregation of a
        // window aggregation, one final row per window, and its join is of two append-only
        // inputs.
        let out = run_ok(&mut sql(&printed_nexmark(query, events), 2));
        let printed = String::from_utf8_lossy(&out.stdout);
        if let Some(line) = printed.lines().find(|l| !l.starts_with("+I")) {
            panic!("{query} printed a change that is not an insert: {line}");
        }
        let mut got: Vec<String> = apply_changelog(&String::from_utf8_lossy(&out.stdout))
            .iter()
            .map(|row| {
                let mut f: Vec<&str> = row.split(", ").collect();
                if query == "q7" {
                    // The built-in job writes q7's columns in the order of the earlier text:
                    // auction, price, bidder.
                    f.swap(1, 2);
                }
                f.join("\t")
            })
            .collect();
        got.sort_unstable();
        assert_same(query, &got, &expected);
    }
}

/// A joined row: its left and its right row, if any.
type Pair = (Option<u64>, Option<u64>);

#[test]
fn outer_joins_pad_unmatched_rows_and_retract_them_when_a_match_comes_at_parallelism_2() {
    let tables = "CREATE TABLE a_rows (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '2000', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE TABLE b_rows (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '1000', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE VIEW a AS SELECT id, id % 300 AS k FROM a_rows;
CREATE VIEW b AS SELECT id AS bid, id % 400 AS k FROM b_rows;
";
    // Which pairs join: equal keys, a condition on b alone and one on both.
    let joins = |a: u64, b: u64| a % 300 == b % 400 && b < 900 && a + b > 1500;
    let on = "ON a.k = b.k AND b.bid < 900 AND a.id + b.bid > 1500";
    let text = |a: Option<u64>, b: Option<u64>| {
        let t =
            |v: Option<u64>, f: fn(u64) -> u64| v.map_or("null".to_string(), |v| f(v).to_string());
        format!(
            "{}, {}, {}, {}",
            t(a, |a| a),
            t(a, |a| a % 300),
            t(b, |b| b),
            t(b, |b| b % 400)
        )
    };
    let mut pairs: Vec<Pair> = Vec::new();
    for a in 0..2000 {
        for b in 0..1000 {
            if joins(a, b) {
                pairs.push((Some(a), Some(b)));
            }
        }
    }
    let left_alone = (0..2000u64).filter(|&a| !(0..1000).any(|b| joins(a, b)));
    let right_alone = (0..1000u64).filter(|&b| !(0..2000).any(|a| joins(a, b)));
    let cases: [(&str, Vec<Pair>); 3] = [
        (
            "LEFT JOIN",
            pairs
                .iter()
                .copied()
                .chain(left_alone.clone().map(|a| (Some(a), None)))
                .collect(),
        ),
        (
            "RIGHT OUTER JOIN",
            pairs
                .iter()
                .copied()
                .chain(right_alone.clone().map(|b| (None, Some(b))))
                .collect(),
        ),
        (
            "FULL OUTER JOIN",
            pairs
                .iter()
                .copied()
                .chain(left_alone.map(|a| (Some(a), None)))
                .chain(right_alone.map(|b| (None, Some(b))))
                .collect(),
        ),
    ];
    for (join, rows) in cases {
        let mut expected: Vec<String> = rows.iter().map(|&(a, b)| text(a, b)).collect();
        expected.sort_unstable();
        assert!(
            expected.iter().any(|r| r.contains("null"))
                && expected.iter().any(|r| !r.contains("null")),
            "{join}: some rows match, some do not"
        );
        let script = format!("{tables}SELECT a.id, a.k, b.bid, b.k FROM a {join} b {on};");
        let out = run_ok(&mut sql(&script, 2));
        let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
        assert_same(join, &got, &expected);
    }

    // A changelog on the side that needs a match: every count update retracts the joined row
    // and, for a moment, pads the left row again.
    let script = format!(
        "{tables}SELECT a.id, c.n FROM a LEFT JOIN (SELECT k, COUNT(*) AS n FROM b GROUP BY k) c ON a.k = c.k WHERE a.id < 400;"
    );
    let out = run_ok(&mut sql(&script, 2));
    let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    let mut expected: Vec<String> = (0..400u64)
        .map(|a| {
            let n = (0..1000u64).filter(|b| b % 400 == a % 300).count();
            if n == 0 {
                format!("{a}, null")
            } else {
                format!("{a}, {n}")
            }
        })
        .collect();
    expected.sort_unstable();
    assert_same("left join of a changelog", &got, &expected);
}

#[test]
fn an_interval_join_keeps_rows_while_they_can_join_and_commits_the_reference() {
    // Two throttled sources whose watermarks advance while they run (every 5 ms), so rows
    // are dropped as the join goes: one dropped too early would lose its later matches.
    let rows = 4_000;
    let table = |name: &str, shift: u64| {
        format!(
            "CREATE TABLE {name} (id BIGINT, ts AS TO_TIMESTAMP_LTZ(id * 100 + {shift}, 3), WATERMARK FOR ts AS ts - INTERVAL '1' SECOND) WITH ('connector' = 'datagen', 'number-of-rows' = '{rows}', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '10000');\n"
        )
    };
    let query = "SELECT l.id, r.id FROM l JOIN r ON l.k = r.k AND r.ts BETWEEN l.ts AND l.ts + INTERVAL '3' SECOND;";
    let tables = format!(
        "SET 'pipeline.auto-watermark-interval' = '5 ms';\n{}{}CREATE VIEW l AS SELECT id, id % 10 AS k, ts FROM lt;\nCREATE VIEW r AS SELECT id, id % 10 AS k, ts FROM rt;\n",
        table("lt", 0),
        table("rt", 50)
    );
    let plan = run_ok(&mut sql(&format!("{tables}EXPLAIN {query}"), 2));
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(
        plan.contains("each kept while it can join (l.ts - r.ts within -3000 to 0 ms)"),
        "{plan}"
    );
    let mut expected: Vec<String> = Vec::new();
    for l in 0..rows {
        for r in 0..rows {
            let (lt, rt) = (l * 100, r * 100 + 50);
            if l % 10 == r % 10 && (lt..=lt + 3_000).contains(&rt) {
                expected.push(format!("{l}, {r}"));
            }
        }
    }
    expected.sort_unstable();
    assert!(
        expected.len() > rows as usize,
        "{} joined rows",
        expected.len()
    );
    let out = run_ok(&mut sql(&format!("{tables}{query}"), 2));
    let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
    assert_same("interval join", &got, &expected);
}

#[test]
fn a_cumulate_window_aggregation_commits_the_reference_at_parallelism_2() {
    let events = 30_000;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let script = format!(
        "{}
CREATE TABLE cumulated (
    auction BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3),
    bids BIGINT, volume BIGINT, top_price BIGINT
) WITH ({});
INSERT INTO cumulated
SELECT auction, window_start, window_end, COUNT(*), SUM(price), MAX(price)
FROM TABLE(CUMULATE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND, INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;",
        ddl(events),
        into_files(&out)
    );

    // Each reader's bids are in time order and the watermark trails them by 4 s, so none is
    // late: every bid counts in each window of its 10 s period that ends after it.
    let bids = bids(events);
    assert!(
        bids.windows(2).all(|p| p[0].date_time <= p[1].date_time),
        "the generator's bids are in time order"
    );
    let mut windows: std::collections::BTreeMap<(i64, i64, i64), (u64, i64, i64)> =
        Default::default();
    for b in &bids {
        let start = b.date_time - b.date_time.rem_euclid(10_000);
        for end in (1..=5)
            .map(|n| start + 2_000 * n)
            .filter(|e| *e > b.date_time)
        {
            let w = windows
                .entry((b.auction, start, end))
                .or_insert((0, 0, i64::MIN));
            w.0 += 1;
            w.1 += b.price;
            w.2 = w.2.max(b.price);
        }
    }
    let time = |ms: i64| {
        let mut s = String::new();
        cairn::sql::types::write_timestamp(&mut s, ms);
        s
    };
    let mut expected: Vec<String> = windows
        .iter()
        .map(|(&(auction, start, end), &(n, volume, top))| {
            format!(
                "{auction}\t{}\t{}\t{n}\t{volume}\t{top}",
                time(start),
                time(end)
            )
        })
        .collect();
    expected.sort_unstable();
    let periods: std::collections::BTreeSet<i64> = windows.keys().map(|k| k.1).collect();
    assert!(periods.len() >= 3, "the bids span several periods");
    assert!(
        windows.keys().any(|k| k.2 - k.1 == 2_000) && windows.keys().any(|k| k.2 - k.1 == 10_000),
        "windows of every size"
    );

    let (tables, query) = script.rsplit_once("INSERT INTO").unwrap();
    let plan = run_ok(&mut sql(
        &format!("{tables}\nEXPLAIN INSERT INTO{query}"),
        2,
    ));
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(
        plan.contains("CUMULATE(step 2000 ms, max size 10000 ms, offset 0 ms, event time)"),
        "{plan}"
    );

    run_ok(&mut sql(&script, 2));
    assert_no_leftovers(&out);
    assert_same("cumulate", &committed_sorted(&out), &expected);
}

/// `ms` as `print` shows a `TIMESTAMP(3)`.
fn timestamp_text(ms: i64) -> String {
    let mut t = String::new();
    cairn::sql::types::write_timestamp(&mut t, ms);
    t
}

/// Runs Nexmark query `query` as published, printed, at parallelism 2, and returns the table
/// its changelog ends with, sorted.
fn nexmark_table(query: &str, events: u64, rate: u64) -> Vec<String> {
    let out = run_ok(&mut sql(&printed_nexmark_at(query, events, rate), 2));
    apply_changelog(&String::from_utf8_lossy(&out.stdout))
}

#[test]
fn nexmark_q4_and_q20_join_auctions_and_bids_into_the_reference_at_parallelism_2() {
    let events = 50_000;
    let (auctions, bids) = (auctions(events), bids(events));
    let mut per_auction: std::collections::HashMap<i64, Vec<&Bid>> = Default::default();
    for b in &bids {
        per_auction.entry(b.auction).or_default().push(b);
    }

    // q4: the closing price of an auction is its highest bid while it was open (both ends
    // included); the result is, per category, the average of the closing prices of its
    // auctions with a bid, in BIGINT (truncated).
    let mut closing: std::collections::BTreeMap<i64, (i64, u64)> = Default::default();
    let mut outside = 0;
    for a in &auctions {
        let on_it = per_auction.get(&a.id).map_or(&[][..], |v| v.as_slice());
        let open = |b: &&&Bid| (a.date_time..=a.expires).contains(&b.date_time);
        outside += on_it.iter().filter(|b| !open(b)).count();
        if let Some(price) = on_it.iter().filter(open).map(|b| b.price).max() {
            let c = closing.entry(a.category).or_default();
            c.0 += price;
            c.1 += 1;
        }
    }
    let mut expected: Vec<String> = closing
        .iter()
        .map(|(category, (sum, n))| format!("{category}, {}", sum / *n as i64))
        .collect();
    expected.sort_unstable();
    assert!(
        expected.len() == 5 && outside > 100,
        "every category has a closed auction, and many bids come outside their auction's time: {expected:?}, {outside} outside"
    );
    assert_same("q4", &nexmark_table("q4", events, RATE), &expected);

    // q20: every bid on an auction of category 10, with the auction's columns.
    let mut expected = Vec::new();
    for a in auctions.iter().filter(|a| a.category == 10) {
        for b in per_auction.get(&a.id).into_iter().flatten() {
            expected.push(format!(
                "{}, {}, {}, {}, {}, {}, {}, {}, {}, {}",
                bid_text(b),
                a.item_name,
                a.description,
                a.initial_bid,
                a.reserve,
                timestamp_text(a.date_time),
                timestamp_text(a.expires),
                a.seller,
                a.category,
                a.extra
            ));
        }
    }
    expected.sort_unstable();
    assert!(
        expected.len() > 1000 && expected.len() < bids.len() / 2,
        "q20 keeps some of the bids: {} of {}",
        expected.len(),
        bids.len()
    );
    assert_same("q20", &nexmark_table("q20", events, RATE), &expected);
}

/// The statistics of q15, q16 and q17: bids, and distinct bidders and auctions, in all and
/// in each of the three price ranks of their `FILTER`s.
#[derive(Default)]
struct RankedBids {
    /// In all, then per rank: bids, bidders, auctions.
    bids: [u64; 4],
    bidders: [std::collections::BTreeSet<i64>; 4],
    auctions: [std::collections::BTreeSet<i64>; 4],
}

impl RankedBids {
    fn add(&mut self, b: &Bid) {
        let rank = match b.price {
            p if p < 10_000 => 1,
            p if p < 1_000_000 => 2,
            _ => 3,
        };
        for i in [0, rank] {
            self.bids[i] += 1;
            self.bidders[i].insert(b.bidder);
            self.auctions[i].insert(b.auction);
        }
    }

    /// The bid counts, as the query prints them.
    fn bid_counts(&self) -> String {
        let b = &self.bids;
        format!("{}, {}, {}, {}", b[0], b[1], b[2], b[3])
    }

    /// Every count, as q15 and q16 print them.
    fn counts(&self) -> String {
        let distinct = |s: &[std::collections::BTreeSet<i64>; 4]| {
            format!(
                "{}, {}, {}, {}",
                s[0].len(),
                s[1].len(),
                s[2].len(),
                s[3].len()
            )
        };
        format!(
            "{}, {}, {}",
            self.bid_counts(),
            distinct(&self.bidders),
            distinct(&self.auctions)
        )
    }
}

#[test]
fn nexmark_q15_q16_q17_report_per_day_statistics_into_the_reference_at_parallelism_2() {
    // One event per second of event time: 200,000 events span three days (UTC).
    let (events, rate) = (200_000, 1);
    let bids = bids_at(events, rate);
    // DATE_FORMAT(dateTime, 'yyyy-MM-dd') and DATE_FORMAT(dateTime, 'HH:mm').
    let day = |b: &Bid| timestamp_text(b.date_time)[..10].to_string();
    let minute = |b: &Bid| timestamp_text(b.date_time)[11..16].to_string();

    // q15: per day.
    let mut per_day: std::collections::BTreeMap<String, RankedBids> = Default::default();
    for b in &bids {
        per_day.entry(day(b)).or_default().add(b);
    }
    let days: Vec<&String> = per_day.keys().collect();
    assert_eq!(days, ["2015-07-15", "2015-07-16", "2015-07-17"]);
    for s in per_day.values() {
        assert!(
            s.bids[1..].iter().all(|&n| n > 0)
                && s.bidders[1..].iter().map(|b| b.len()).sum::<usize>() > s.bidders[0].len(),
            "every rank has bids, and some bidders bid in several ranks"
        );
    }
    let mut expected: Vec<String> = per_day
        .iter()
        .map(|(day, s)| format!("{day}, {}", s.counts()))
        .collect();
    expected.sort_unstable();
    assert_same("q15", &nexmark_table("q15", events, rate), &expected);

    // q16: per channel and day, with the day's last minute of the channel's bids.
    let mut per_channel: std::collections::BTreeMap<(String, String), (String, RankedBids)> =
        Default::default();
    for b in &bids {
        let e = per_channel
            .entry((b.channel.to_string(), day(b)))
            .or_default();
        e.0 = std::cmp::max(std::mem::take(&mut e.0), minute(b));
        e.1.add(b);
    }
    let mut expected: Vec<String> = per_channel
        .iter()
        .map(|((channel, day), (minute, s))| format!("{channel}, {day}, {minute}, {}", s.counts()))
        .collect();
    expected.sort_unstable();
    assert!(
        per_channel.values().any(|(_, s)| s.bids[1] == 0)
            && per_channel.values().any(|(_, s)| s.bids[0] > 1000),
        "some channels have no bids of a rank, the hot ones have many"
    );
    assert_same("q16", &nexmark_table("q16", events, rate), &expected);

    // q17: per auction and day, with the price's minimum, maximum, average (BIGINT:
    // truncated) and sum.
    let mut per_auction: std::collections::BTreeMap<(i64, String), (RankedBids, Vec<i64>)> =
        Default::default();
    for b in &bids {
        let e = per_auction.entry((b.auction, day(b))).or_default();
        e.0.add(b);
        e.1.push(b.price);
    }
    let mut expected: Vec<String> = per_auction
        .iter()
        .map(|((auction, day), (s, prices))| {
            let sum: i64 = prices.iter().sum();
            format!(
                "{auction}, {day}, {}, {}, {}, {}, {sum}",
                s.bid_counts(),
                prices.iter().min().unwrap(),
                prices.iter().max().unwrap(),
                sum / prices.len() as i64
            )
        })
        .collect();
    expected.sort_unstable();
    let mut days_of: std::collections::BTreeMap<i64, usize> = Default::default();
    for (auction, _) in per_auction.keys() {
        *days_of.entry(*auction).or_default() += 1;
    }
    assert!(
        days_of.values().any(|&n| n > 1),
        "some auction has bids on two days"
    );
    assert_same("q17", &nexmark_table("q17", events, rate), &expected);
}

/// `WITH` queries are views of one statement: the same rows as with `CREATE VIEW`, a name
/// there hiding a table, and what is not supported refused by name.
#[test]
fn with_queries_plan_as_views_of_their_statement() {
    let tables = "CREATE TABLE n (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '500', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE TABLE out_t (k BIGINT, c BIGINT) WITH ('connector' = 'print');
";
    let as_views = format!(
        "{tables}CREATE VIEW m AS SELECT id % 7 AS k FROM n WHERE id > 10;
CREATE VIEW big AS SELECT k FROM m WHERE k > 2;
INSERT INTO out_t SELECT k, COUNT(*) FROM big GROUP BY k;"
    );
    // `n` in the second query is the first one, not the table.
    let as_with = format!(
        "{tables}INSERT INTO out_t
WITH n AS (SELECT id % 7 AS k FROM n WHERE id > 10), big AS (SELECT k FROM n WHERE k > 2)
SELECT k, COUNT(*) FROM big GROUP BY k;"
    );
    let expected: Vec<String> = (3..7u64)
        .map(|k| {
            let c = (11..500u64).filter(|id| id % 7 == k).count();
            format!("{k}, {c}")
        })
        .collect();
    for script in [as_views, as_with] {
        let out = run_ok(&mut sql(&script, 2));
        let got = apply_changelog(&String::from_utf8_lossy(&out.stdout));
        assert_same("WITH", &got, &expected);
    }
    for (script, needles) in [
        (
            format!("{tables}INSERT INTO out_t WITH RECURSIVE r AS (SELECT id FROM n) SELECT id, id FROM r;"),
            &["WITH RECURSIVE", "not supported"][..],
        ),
        (
            format!("{tables}INSERT INTO out_t WITH r (a) AS (SELECT id FROM n) SELECT a, a FROM r;"),
            &["a column list on WITH query 'r'"][..],
        ),
        (
            format!("{tables}INSERT INTO out_t WITH r AS (SELECT idd FROM n) SELECT id, id FROM r;"),
            &["column 'idd'", "line 3"][..],
        ),
    ] {
        let stderr = refused(&script);
        for needle in needles {
            assert!(stderr.contains(needle), "{needle:?} not in {stderr}");
        }
    }
}

/// `SELECT DISTINCT` over an append-only input only appends (a filesystem table takes it),
/// over a changelog it retracts a row whose last copy goes.
#[test]
fn select_distinct_appends_each_row_once_and_follows_a_changelog() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let rows = "CREATE TABLE n (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '3000', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');\n";
    let script = format!(
        "{rows}CREATE TABLE out_t (a BIGINT, b BIGINT) WITH ({});
INSERT INTO out_t SELECT DISTINCT id % 13, id % 5 FROM n WHERE id % 2 = 0;",
        into_files(&out)
    );
    run_ok(&mut sql(&script, 2));
    let mut expected: Vec<String> = (0..3000u64)
        .filter(|id| id % 2 == 0)
        .map(|id| format!("{}\t{}", id % 13, id % 5))
        .collect();
    expected.sort_unstable();
    expected.dedup();
    assert_eq!(expected.len(), 65);
    assert_same("DISTINCT", &committed_sorted(&out), &expected);
    // Over a changelog: the distinct totals of a running count per key. A total that a key
    // leaves is retracted unless another key still has it.
    let changelog = format!(
        "{rows}CREATE TABLE p (total BIGINT) WITH ('connector' = 'print');
INSERT INTO p SELECT DISTINCT c FROM (SELECT id % 7 AS k, COUNT(*) AS c FROM n GROUP BY id % 7);"
    );
    let got = apply_changelog(&String::from_utf8_lossy(
        &run_ok(&mut sql(&changelog, 2)).stdout,
    ));
    // 3000 rows over 7 keys: 429 for keys 0-4, 428 for keys 5 and 6.
    assert_same(
        "DISTINCT over a changelog",
        &got,
        &["428".into(), "429".into()],
    );
    let stderr = refused(&format!(
        "{rows}CREATE TABLE p (id BIGINT) WITH ('connector' = 'print');
INSERT INTO p SELECT DISTINCT ON (id) id FROM n;"
    ));
    assert!(stderr.contains("SELECT DISTINCT ON"), "{stderr}");
}

/// `ORDER BY … LIMIT n [OFFSET m]` is a Top-N of all rows: a changelog whose final table is
/// the rows ranked `m + 1 ..= m + n`. Without `ORDER BY` it keeps the first rows to arrive
/// and only appends, so a `filesystem` table takes it.
#[test]
fn order_by_limit_keeps_the_top_rows_of_the_whole_stream() {
    let rows = "CREATE TABLE n (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '5000', 'fields.id.kind' = 'sequence', 'fields.id.start' = '0', 'rows-per-second' = '0');
CREATE TABLE p (id BIGINT, v BIGINT) WITH ('connector' = 'print');
";
    for (tail, ids) in [
        ("LIMIT 3", [99u64, 199, 299]),
        ("LIMIT 3 OFFSET 1", [199, 299, 399]),
    ] {
        let script = format!(
            "{rows}INSERT INTO p SELECT id, id % 100 AS v FROM n ORDER BY v DESC, id {tail};"
        );
        let got = apply_changelog(&String::from_utf8_lossy(
            &run_ok(&mut sql(&script, 2)).stdout,
        ));
        let mut expected: Vec<String> = ids.iter().map(|id| format!("{id}, 99")).collect();
        expected.sort_unstable();
        assert_same(tail, &got, &expected);
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let script = format!(
        "{rows}CREATE TABLE f (id BIGINT) WITH ({});
INSERT INTO f SELECT id FROM n LIMIT 3 OFFSET 2;",
        into_files(&out)
    );
    run_ok(&mut sql(&script, 1));
    assert_same(
        "LIMIT 3 OFFSET 2",
        &committed_sorted(&out),
        &["2".into(), "3".into(), "4".into()],
    );
    // At parallelism 2 which rows arrive first is up to timing: three rows of the input,
    // each once, and nothing retracted.
    let script = format!("{rows}INSERT INTO p SELECT id, id % 100 AS v FROM n LIMIT 3;");
    let stdout = String::from_utf8_lossy(&run_ok(&mut sql(&script, 2)).stdout).into_owned();
    assert!(stdout.lines().all(|l| l.starts_with("+I")), "{stdout}");
    let got = apply_changelog(&stdout);
    assert_eq!(got.len(), 3, "{stdout}");
    for row in &got {
        let (id, v) = row.split_once(", ").unwrap();
        let id: u64 = id.parse().unwrap();
        assert!(id < 5000 && v == (id % 100).to_string(), "{row}");
    }
    let mut distinct = got.clone();
    distinct.dedup();
    assert_eq!(distinct, got);
    for (tail, needle) in [
        ("ORDER BY id", "ORDER BY without LIMIT"),
        (
            "ORDER BY id LIMIT 'x'",
            "LIMIT takes a whole number of rows",
        ),
        (
            "ORDER BY id + 1 LIMIT 3",
            "ORDER BY … LIMIT must name columns",
        ),
    ] {
        let stderr = refused(&format!(
            "{rows}INSERT INTO p SELECT id, id % 100 AS v FROM n {tail};"
        ));
        assert!(
            stderr.contains(needle),
            "{tail}: {needle:?} not in {stderr}"
        );
    }
}

/// A DECIMAL beyond its precision is NULL, as in Flink; a CASE of a decimal and an integer
/// is a decimal wide enough for both.
#[test]
fn decimals_beyond_their_precision_are_null_and_mixed_results_widen() {
    let script = "CREATE TABLE n (id BIGINT) WITH ('connector' = 'datagen', 'number-of-rows' = '3', 'fields.id.kind' = 'sequence', 'fields.id.start' = '998', 'rows-per-second' = '0');
CREATE TABLE p (id BIGINT, d DECIMAL(7, 1), c DECIMAL(20, 1)) WITH ('connector' = 'print');
INSERT INTO p SELECT id, CAST(id * 1000.5 AS DECIMAL(7, 1)), CASE WHEN id > 999 THEN 0.5 ELSE id END FROM n;";
    let got = apply_changelog(&String::from_utf8_lossy(
        &run_ok(&mut sql(script, 1)).stdout,
    ));
    let expected = [
        // 1000 * 1000.5 has eight digits.
        "1000, null, 0.5",
        "998, 998499.0, 998.0",
        "999, 999499.5, 999.0",
    ];
    assert_same("decimals", &got, &expected.map(String::from));
}

/// A window aggregation may GROUP BY window_time besides window_start and window_end (Flink
/// allows it), and a second window aggregation over that window_time cascades: 2 s counts per
/// auction summed into 10 s windows (the window columns renamed, as Flink's cascading example
/// does).
#[test]
fn a_window_aggregation_may_group_by_window_time_and_cascade() {
    let events = 30_000;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    let script = format!(
        "{}
CREATE VIEW per_2s AS
SELECT auction, window_start AS start_2s, window_time AS rowtime, COUNT(*) AS bids
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '2' SECOND))
GROUP BY auction, window_start, window_end, window_time;
CREATE TABLE cascaded (
    auction BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3),
    bids BIGINT, windows BIGINT
) WITH ({});
INSERT INTO cascaded
SELECT auction, window_start, window_end, SUM(bids), COUNT(*)
FROM TABLE(TUMBLE(TABLE per_2s, DESCRIPTOR(rowtime), INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;",
        ddl(events),
        into_files(&out)
    );
    let mut per_2s: std::collections::BTreeMap<(i64, i64), u64> = Default::default();
    for b in bids(events) {
        *per_2s
            .entry((b.auction, b.date_time - b.date_time.rem_euclid(2_000)))
            .or_default() += 1;
    }
    let mut per_10s: std::collections::BTreeMap<(i64, i64), (u64, u64)> = Default::default();
    for ((auction, start), n) in per_2s {
        // window_time is the 2 s window's last millisecond.
        let time = start + 2_000 - 1;
        let w = per_10s
            .entry((auction, time - time.rem_euclid(10_000)))
            .or_default();
        w.0 += n;
        w.1 += 1;
    }
    assert!(
        per_10s.values().any(|w| w.1 > 1),
        "some 10 s windows sum several"
    );
    let mut expected: Vec<String> = per_10s
        .iter()
        .map(|(&(auction, start), &(n, windows))| {
            format!(
                "{auction}\t{}\t{}\t{n}\t{windows}",
                timestamp_text(start),
                timestamp_text(start + 10_000)
            )
        })
        .collect();
    expected.sort_unstable();
    run_ok(&mut sql(&script, 2));
    assert_no_leftovers(&out);
    assert_same("cascaded", &committed_sorted(&out), &expected);
}

/// A nexmark source reads only the fields its calc uses (EXPLAIN: `N fields read`), the other
/// kinds' fields NULL: the rows equal those of the same query reading a whole ROW, which
/// cannot be narrowed.
#[test]
fn a_nexmark_source_reads_only_the_fields_its_query_uses_and_the_rows_stay_the_same() {
    let query = "SELECT event_type, person.id, bid.price, auction.seller, dateTime FROM datagen \
                 WHERE event_type <> 1 OR auction.seller % 3 = 0";
    let plan = run_ok(&mut sql(&format!("{}\nEXPLAIN {query};", ddl(20_000)), 1));
    let plan = String::from_utf8_lossy(&plan.stdout);
    assert!(plan.contains("(nexmark, 7 fields read,"), "{plan}");
    let rows = |text: &str| {
        let out = run_ok(&mut sql(&format!("{}\n{text};", ddl(20_000)), 2));
        let mut rows: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| l.replace(", true]", "]").replace(", false]", "]"))
            .collect();
        rows.sort_unstable();
        rows
    };
    let narrowed = rows(query);
    let whole = rows(&query.replace("dateTime FROM", "dateTime, bid IS NULL FROM"));
    assert!(narrowed.len() > 10_000, "{} rows", narrowed.len());
    assert!(narrowed.iter().any(|r| r.starts_with("+I[1, null, null, ")));
    assert_same("narrowed", &narrowed, &whole);

    // A field of a computed ROW is read from that column, not from the source's fields.
    let with_row = replaced(
        &ddl(2_000),
        "    WATERMARK FOR",
        "    b AS bid,\n    WATERMARK FOR",
    );
    let out = run_ok(&mut sql(
        &format!("{with_row}\nSELECT b.price, bid.price FROM datagen WHERE event_type = 2;"),
        1,
    ));
    let out = String::from_utf8_lossy(&out.stdout);
    let pairs: Vec<&str> = out.lines().collect();
    assert!(pairs.len() > 1_000, "{} rows", pairs.len());
    for p in pairs {
        let (a, b) = p
            .trim_start_matches("+I[")
            .trim_end_matches(']')
            .split_once(", ")
            .unwrap();
        assert_eq!(a, b, "{p}");
    }
}
