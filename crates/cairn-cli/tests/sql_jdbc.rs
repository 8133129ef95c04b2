//! The SQL `jdbc` sink with `'sink.delivery-guarantee' = 'exactly-once'`: an append-only
//! result goes into a PostgreSQL table without a primary key by two-phase commit (rows inserted
//! in a transaction prepared at each checkpoint, committed when it completes), exactly once
//! through SIGKILLs at failpoints and resumes; what it cannot take (a changelog, an unknown
//! guarantee) is refused before the job runs, in one line naming the table.
//!
//! Needs the test PostgreSQL server (`scripts/service-postgres`, or `CAIRN_TEST_PG_URL`) with
//! prepared transactions enabled.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use cairn::connectors::EventKind;
use common::*;

const SEED: u64 = 42;
const RATE: u64 = 1_000;
/// Events of the window job: enough for a run with 30 ms checkpoints to take several.
const EVENTS: u64 = 2_000_000;

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
    let text = std::fs::read_to_string(scripts().join("ddl.sql")).unwrap();
    let text = replaced(
        &text,
        "'events.num' = '1000000'",
        &format!("'events.num' = '{events}', 'seed' = '{SEED}'"),
    );
    let text = replaced(
        &text,
        "'first-event.rate' = '10000'",
        &format!("'first-event.rate' = '{RATE}'"),
    );
    replaced(
        &text,
        "'next-event.rate' = '10000'",
        &format!("'next-event.rate' = '{RATE}'"),
    )
}

/// `cairn sql -e SCRIPT -p P`.
fn sql(script: &str, parallelism: u32) -> Command {
    let mut cmd = cairn();
    cmd.args(["sql", "-e", script, "-p", &parallelism.to_string()]);
    cmd
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

/// The SQL sink table's name; its sink's uid, and so its transactions' ids, start with it.
const SINK: &str = "bid_windows";

/// The columns of the window job's output, in PostgreSQL.
const COLUMNS: &str = "auction bigint, window_start timestamp(3), window_end timestamp(3), bids bigint, volume bigint, top_price bigint";

/// A tumbling-window aggregation over the Nexmark bids — per auction and 10 s window its
/// bids, their total and the top price, an append-only result — into the PostgreSQL table
/// `table` (no primary key) through the exactly-once jdbc sink.
fn window_script(url: &str, table: &str) -> String {
    let jdbc = url.replacen("postgres://cairn:cairn@", "jdbc:postgresql://", 1);
    format!(
        "{}
CREATE TABLE {SINK} (
    auction BIGINT, window_start TIMESTAMP(3), window_end TIMESTAMP(3),
    bids BIGINT, volume BIGINT, top_price BIGINT
) WITH ('connector' = 'jdbc', 'url' = '{jdbc}', 'table-name' = '{table}',
    'username' = 'cairn', 'password' = 'cairn', 'sink.delivery-guarantee' = 'exactly-once');
INSERT INTO {SINK}
SELECT auction, window_start, window_end, COUNT(*), SUM(price), MAX(price)
FROM TABLE(TUMBLE(TABLE bid, DESCRIPTOR(dateTime), INTERVAL '10' SECOND))
GROUP BY auction, window_start, window_end;",
        ddl(EVENTS)
    )
}

/// A fresh table `table` without a key for the window job's rows.
fn fresh_table(db: &mut postgres::Client, table: &str) {
    db.batch_execute(&format!(
        "DROP TABLE IF EXISTS {table}; CREATE TABLE {table} ({COLUMNS})"
    ))
    .unwrap();
}

/// A row of the window job's output as text.
type WindowRow = (i64, String, String, i64, i64, i64);

/// The rows of `table`, sorted.
fn rows(db: &mut postgres::Client, table: &str) -> Vec<WindowRow> {
    db.query(
        &format!("SELECT auction, window_start::text, window_end::text, bids, volume, top_price FROM {table} ORDER BY 1, 2, 3, 4, 5, 6"),
        &[],
    )
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
    .collect()
}

/// The prepared transactions the window job's sink left (committed nor rolled back).
fn prepared_of_the_sink(db: &mut postgres::Client) -> Vec<String> {
    db.query(
        "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND gid LIKE $1",
        &[&format!("cairn:%:{SINK}.sink%")],
    )
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The window job undisturbed at parallelism 1 into its own table; checked against the
/// generator: every bid is counted in exactly one window, and no window appears twice.
fn undisturbed(db: &mut postgres::Client, url: &str, table: &str) -> Vec<WindowRow> {
    fresh_table(db, table);
    run_ok(&mut sql(&window_script(url, table), 1));
    let rows = rows(db, table);
    let counted: i64 = rows.iter().map(|r| r.3).sum();
    let bids = (0..EVENTS)
        .filter(|&n| EventKind::of(n) == EventKind::Bid)
        .count();
    assert_eq!(counted, bids as i64, "bids counted in the windows");
    let windows: std::collections::BTreeSet<_> = rows.iter().map(|r| (r.0, &r.1)).collect();
    assert_eq!(windows.len(), rows.len(), "a window appears twice");
    rows
}

/// Asserts that `got` holds no row more often than `expected` does: what the table holds
/// while the job is down is a part of the result, each row at most once.
fn assert_within(what: &str, got: &[WindowRow], expected: &[WindowRow]) {
    let mut left: BTreeMap<&WindowRow, i64> = BTreeMap::new();
    for row in expected {
        *left.entry(row).or_default() += 1;
    }
    for row in got {
        let n = left.entry(row).or_default();
        *n -= 1;
        assert!(
            *n >= 0,
            "{what}: {row:?} is in the table once too often (or never expected)"
        );
    }
}

/// Runs the window job into `table` at parallelism 2 with 30 ms checkpoints, SIGKILLed at
/// each of `points` in turn (order and checkpoints from `seed`), resumed `--from latest` each
/// time and once more to its end. After every kill the table holds part of `expected`, no row
/// twice; at the end exactly `expected`, and no prepared transaction of the sink is left.
fn killed_at(url: &str, table: &str, seed: u64, points: &[&str], expected: &[WindowRow]) {
    let (mut db, _) = pg();
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let text = window_script(url, table);
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
        assert_within(
            &format!("killed at {point} {id}"),
            &rows(&mut db, table),
            expected,
        );
    }
    let last = run_ok(run().stderr(Stdio::piped()));
    let stderr = String::from_utf8_lossy(&last.stderr);
    assert!(stderr.contains("restored from "), "{stderr}");
    let got = rows(&mut db, table);
    assert!(
        got == expected,
        "killed and resumed: {} rows in the table, {} expected; first difference: {:?}",
        got.len(),
        expected.len(),
        got.iter().zip(expected).find(|(g, e)| g != e)
    );
    assert_eq!(prepared_of_the_sink(&mut db), Vec::<String>::new());
}

/// An append-only window aggregation into a jdbc table without a primary key, exactly once by
/// two-phase commit, at parallelism 2, SIGKILLed at every failpoint (one inside the sink's open
/// transaction too) and resumed: the table ends with exactly the undisturbed run's rows.
#[test]
fn an_append_only_result_into_a_keyless_exactly_once_jdbc_table_sigkilled_and_resumed_ends_exactly_right(
) {
    let (mut db, url) = pg();
    let pid = std::process::id();
    let (reference, table) = (format!("sql_eo_ref_{pid}"), format!("sql_eo_{pid}"));
    let _dropped = Dropped(vec![reference.clone(), table.clone()]);
    let expected = undisturbed(&mut db, &url, &reference);
    assert_eq!(prepared_of_the_sink(&mut db), Vec::<String>::new());
    fresh_table(&mut db, &table);
    let mut points = FAILPOINTS.to_vec();
    points.push("sink-writing");
    killed_at(&url, &table, 43, &points, &expected);
}

/// Tables dropped when the test ends, passed or failed.
struct Dropped(Vec<String>);

impl Drop for Dropped {
    fn drop(&mut self) {
        let (mut db, _) = pg();
        let _ = db.batch_execute(&format!("DROP TABLE IF EXISTS {}", self.0.join(", ")));
    }
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

const ORDERS: &str = "CREATE TABLE orders (id BIGINT, customer STRING, amount DECIMAL(10, 2)) WITH ('connector' = 'datagen', 'number-of-rows' = '100');
";

/// A jdbc table `j` of a server nobody listens on (these scripts are refused or only
/// explained), with a PRIMARY KEY if `key`, and the delivery guarantee if given.
fn jdbc_table(key: bool, guarantee: Option<&str>) -> String {
    format!(
        "CREATE TABLE j (customer STRING, total DECIMAL(38, 2){}) WITH ('connector' = 'jdbc', 'url' = 'jdbc:postgresql://127.0.0.1:1/x', 'table-name' = 't'{});\n",
        if key { ", PRIMARY KEY (customer) NOT ENFORCED" } else { "" },
        guarantee
            .map(|g| format!(", 'sink.delivery-guarantee' = '{g}'"))
            .unwrap_or_default()
    )
}

const CHANGELOG: &str = "INSERT INTO j SELECT customer, SUM(amount) FROM orders GROUP BY customer;";
const APPEND: &str = "INSERT INTO j SELECT customer, amount FROM orders WHERE amount > 0;";

#[test]
fn what_the_exactly_once_jdbc_sink_cannot_take_is_refused_in_one_line_before_it_runs() {
    let cases: &[(String, &[&str])] = &[
        // A changelog into a keyless exactly-once table: updates need a key.
        (
            format!(
                "{ORDERS}{}{CHANGELOG}",
                jdbc_table(false, Some("exactly-once"))
            ),
            &[
                "table 'j'",
                "'sink.delivery-guarantee' = 'exactly-once' only appends rows",
                "changelog",
                "declare a PRIMARY KEY",
            ],
        ),
        // With a key too: a prepared transaction keeps its rows locked until it commits.
        (
            format!(
                "{ORDERS}{}{CHANGELOG}",
                jdbc_table(true, Some("exactly-once"))
            ),
            &[
                "table 'j'",
                "only appends rows",
                "changelog",
                "locked",
                "upsert by the PRIMARY KEY",
            ],
        ),
        // Unknown values name the valid ones.
        (
            format!(
                "{ORDERS}{}{APPEND}",
                jdbc_table(false, Some("exactly_once"))
            ),
            &[
                "table 'j'",
                "option 'sink.delivery-guarantee' must be 'at-least-once'",
                "or 'exactly-once'",
                "got 'exactly_once'",
            ],
        ),
        (
            format!("{ORDERS}{}{APPEND}", jdbc_table(true, Some("none"))),
            &["'sink.delivery-guarantee' must be", "got 'none'"],
        ),
        // At least once (the default, or said) upserts: without a key it is refused, naming
        // the two-phase alternative.
        (
            format!("{ORDERS}{}{APPEND}", jdbc_table(false, None)),
            &[
                "table 'j'",
                "the jdbc sink needs a PRIMARY KEY",
                "'sink.delivery-guarantee' = 'exactly-once' to append rows",
            ],
        ),
        (
            format!(
                "{ORDERS}{}{APPEND}",
                jdbc_table(false, Some("at-least-once"))
            ),
            &["the jdbc sink needs a PRIMARY KEY"],
        ),
    ];
    for (script, needles) in cases {
        let line = refused(script);
        for needle in *needles {
            assert!(
                line.contains(needle),
                "{script}\n-> {line}\n(expected {needle:?})"
            );
        }
    }
    // What it takes plans: an append-only result, with or without a key.
    for key in [false, true] {
        let script = format!(
            "{ORDERS}{}EXPLAIN {APPEND}",
            jdbc_table(key, Some("exactly-once"))
        );
        let out = run_ok(cairn().args(["sql", "-e", &script, "-p", "2"]));
        let plan = String::from_utf8_lossy(&out.stdout);
        assert!(plan.contains("sink: j (jdbc, append-only)"), "{plan}");
    }
}
