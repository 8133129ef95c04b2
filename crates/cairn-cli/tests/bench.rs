//! `cairn bench --suite savepoint` at a small key count: it prints its table, with the row of
//! that key count and positive checkpoint and savepoint sizes; `cairn bench --suite nexmark`
//! at a few events: a row and a script line for every query at p=1 and p=2, with events/s,
//! checkpoints and the peak RSS; `cairn bench --suite sql` at a few events: a script line for
//! q0, q1 and q2 with events/s of the nexmark job and of the SQL script and their ratio;
//! `cairn bench --suite metrics` over few records: records/s and CPU time per record with
//! metrics on and off, and their ratios; `cairn bench --suite failover --repeat 1`: a row per
//! fault (SIGKILL, SIGSTOP) with its times to RUNNING and to the first checkpoint. Times are
//! not asserted: they are the machine's.

mod common;

const COLUMNS: [&str; 8] = [
    "keys",
    "checkpoint ms",
    "checkpoint bytes",
    "savepoint ms",
    "savepoint bytes",
    "sp/cp ms",
    "sp/cp bytes",
    "stop->FINISHED ms",
];

#[test]
fn savepoint_bench_prints_checkpoint_and_savepoint_sizes() {
    let out = common::run_ok(common::cairn().args([
        "bench",
        "--suite",
        "savepoint",
        "--keys",
        "1000",
        "--log",
        "warn",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let mut lines = stdout.lines();
    let header = lines
        .find(|l| l.trim_start().starts_with("keys "))
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"));
    let columns: Vec<&str> = header
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(columns, COLUMNS, "{stdout}");
    let row: Vec<&str> = lines
        .find(|l| l.split_whitespace().next() == Some("1000"))
        .unwrap_or_else(|| panic!("no row for 1000 keys in:\n{stdout}"))
        .split_whitespace()
        .collect();
    assert_eq!(row.len(), COLUMNS.len(), "{stdout}");
    let value = |column: &str| -> f64 {
        let i = COLUMNS.iter().position(|c| *c == column).expect("a column");
        row[i]
            .parse()
            .unwrap_or_else(|e| panic!("{column} {:?}: {e}\n{stdout}", row[i]))
    };
    for column in ["checkpoint bytes", "savepoint bytes", "sp/cp bytes"] {
        assert!(value(column) > 0.0, "{column} is not positive:\n{stdout}");
    }
    for column in ["checkpoint ms", "savepoint ms", "stop->FINISHED ms"] {
        value(column);
    }
}

const NEXMARK_COLUMNS: [&str; 12] = [
    "query",
    "p",
    "events",
    "run s",
    "events/s",
    "per core",
    "vs Flink",
    "vs p=1",
    "ckpts",
    "ckpt ms med/max",
    "ckpt size med/max",
    "peak RSS",
];

/// `833.3k`, `1.11M`, `12`: a count as `human::count` prints it.
fn human_count(text: &str) -> f64 {
    let (digits, scale) = match text.as_bytes().last() {
        Some(b'k') => (&text[..text.len() - 1], 1e3),
        Some(b'M') => (&text[..text.len() - 1], 1e6),
        Some(b'G') => (&text[..text.len() - 1], 1e9),
        _ => (text, 1.0),
    };
    digits
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("count {text:?}: {e}"))
        * scale
}

/// `9.4MiB`: a size as the nexmark table prints it, in bytes.
fn table_bytes(text: &str) -> f64 {
    let units = [
        ("GiB", 1024.0 * 1024.0 * 1024.0),
        ("MiB", 1024.0 * 1024.0),
        ("KiB", 1024.0),
        ("B", 1.0),
    ];
    let (digits, scale) = units
        .iter()
        .find_map(|(unit, scale)| text.strip_suffix(unit).map(|d| (d, *scale)))
        .unwrap_or_else(|| panic!("size {text:?} has no unit"));
    digits
        .parse::<f64>()
        .unwrap_or_else(|e| panic!("size {text:?}: {e}"))
        * scale
}

/// The line of `stdout` for scripts that starts with `prefix`.
fn script_line<'a>(stdout: &'a str, prefix: &str) -> &'a str {
    stdout
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no line {prefix}… in:\n{stdout}"))
}

/// The number `key=` says in a script line.
fn script_field(line: &str, key: &str) -> f64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {line:?}"))
        .parse()
        .unwrap_or_else(|e| panic!("{key} in {line:?}: {e}"))
}

#[test]
fn nexmark_bench_prints_every_query_at_both_parallelisms() {
    let out = common::run_ok(common::cairn().args([
        "bench", "--suite", "nexmark", "--events", "20000", "--log", "warn",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let header = stdout
        .lines()
        .find(|l| l.starts_with("query "))
        .unwrap_or_else(|| panic!("no table header in:\n{stdout}"));
    let columns: Vec<&str> = header
        .split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert_eq!(columns, NEXMARK_COLUMNS, "{stdout}");
    let column = |name: &str| -> usize {
        NEXMARK_COLUMNS
            .iter()
            .position(|c| *c == name)
            .expect("a column")
    };
    for query in cairn::jobs::nexmark::QUERIES {
        for p in ["1", "2"] {
            let row: Vec<&str> = stdout
                .lines()
                .map(|l| l.split_whitespace().collect::<Vec<_>>())
                .find(|cells| cells.first() == Some(query) && cells.get(1) == Some(&p))
                .unwrap_or_else(|| panic!("no row for {query} at p={p} in:\n{stdout}"));
            assert_eq!(row.len(), NEXMARK_COLUMNS.len(), "{query} p={p}:\n{stdout}");
            for name in ["events", "events/s", "per core"] {
                let value = human_count(row[column(name)]);
                assert!(value > 0.0, "{query} p={p}: {name} is {value}:\n{stdout}");
            }
            let checkpoints: usize = row[column("ckpts")]
                .parse()
                .unwrap_or_else(|e| panic!("{query} p={p}: ckpts: {e}\n{stdout}"));
            // At least the final checkpoint of the bounded job.
            assert!(checkpoints >= 1, "{query} p={p}: no checkpoint:\n{stdout}");
            let rss = table_bytes(row[column("peak RSS")]);
            assert!(rss > 0.0, "{query} p={p}: no peak RSS:\n{stdout}");

            let line = script_line(&stdout, &format!("nexmark query={query} p={p} "));
            let field = |key: &str| script_field(line, key);
            assert!(field("events_per_s") > 0.0, "{line}");
            assert!(field("checkpoints") >= 1.0, "{line}");
            assert!(field("peak_rss_bytes") > 0.0, "{line}");
            assert_eq!(field("stream_events"), 20000.0, "{line}");
        }
    }
}

#[test]
fn sql_bench_compares_each_query_with_the_nexmark_job() {
    let out = common::run_ok(common::cairn().args([
        "bench",
        "--suite",
        "sql",
        "--events",
        "20000",
        "--parallelism",
        "1",
        "--log",
        "warn",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for query in ["q0", "q1", "q2"] {
        let line = script_line(&stdout, &format!("sql query={query} p=1 "));
        let field = |key: &str| script_field(line, key);
        // Both jobs read every event of the stream.
        assert_eq!(field("events"), 20000.0, "{line}");
        let (rust, sql) = (field("rust_events_per_s"), field("sql_events_per_s"));
        assert!(rust > 0.0 && sql > 0.0, "{line}");
        let ratio = field("ratio");
        assert!((ratio - sql / rust).abs() < 0.01, "{line}");
    }
}

#[test]
fn metrics_bench_prints_both_settings_and_their_ratios() {
    let out = common::run_ok(common::cairn().args([
        "bench",
        "--suite",
        "metrics",
        "--records",
        "200000",
        "--repeat",
        "2",
        "--log",
        "warn",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for setting in ["true", "false"] {
        let row: Vec<&str> = stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(setting))
            .unwrap_or_else(|| panic!("no row for metrics.enabled {setting} in:\n{stdout}"))
            .split_whitespace()
            .collect();
        assert_eq!(row.len(), 3, "{stdout}");
        assert!(
            human_count(row[1]) > 0.0,
            "records/s of {setting}:\n{stdout}"
        );
        let cpu: f64 = row[2].parse().unwrap_or(f64::NAN);
        assert!(
            cpu.is_finite() && cpu > 0.0,
            "CPU per record of {setting}:\n{stdout}"
        );
    }
    let ratios = stdout
        .lines()
        .find(|l| l.starts_with("on/off: "))
        .unwrap_or_else(|| panic!("no ratio line in:\n{stdout}"));
    let numbers: Vec<f64> = ratios
        .split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .filter_map(|t| t.parse().ok())
        .collect();
    // records/s ratio, its cost, CPU ratio, its cost: every one a finite number.
    assert_eq!(numbers.len(), 4, "{ratios}");
    assert!(numbers[0] > 0.0 && numbers[2] > 0.0, "{ratios}");
}

#[test]
fn failover_bench_prints_a_row_per_fault() {
    let out = common::run_ok(common::cairn().args([
        "bench", "--suite", "failover", "--repeat", "1", "--log", "warn",
    ]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.lines().any(|l| l.starts_with("fault ")),
        "no table header in:\n{stdout}"
    );
    for fault in ["SIGKILL", "SIGSTOP"] {
        let row: Vec<&str> = stdout
            .lines()
            // The table's row, not the indented line of each round.
            .find(|l| l.starts_with(&format!("{fault} ")))
            .unwrap_or_else(|| panic!("no row for {fault} in:\n{stdout}"))
            .split_whitespace()
            .collect();
        // fault, rounds, ->RUNNING median and max, ->1st checkpoint median and max.
        assert_eq!(row.len(), 6, "{fault}:\n{stdout}");
        let ms: Vec<u64> = row[1..]
            .iter()
            .map(|c| {
                c.parse()
                    .unwrap_or_else(|e| panic!("{fault} {c:?}: {e}\n{stdout}"))
            })
            .collect();
        assert_eq!(ms[0], 1, "one round of {fault}:\n{stdout}");
        // The first checkpoint after the fault comes after the job runs again.
        assert!(ms[1] > 0 && ms[3] >= ms[1], "{fault}:\n{stdout}");
        let line = script_line(&stdout, &format!("failover fault={fault} "));
        assert_eq!(script_field(line, "rounds"), 1.0, "{line}");
        assert_eq!(script_field(line, "running_ms_max"), ms[2] as f64, "{line}");
    }
}

#[test]
fn bench_refuses_flags_its_suite_does_not_take() {
    let cases: [&[&str]; 8] = [
        &["--suite", "nexmark", "--events", "0"],
        &["--suite", "nexmark", "--keys", "10"],
        &["--suite", "nexmark", "--records", "10"],
        &["--suite", "nexmark", "--intervals", "100ms"],
        &["--suite", "nexmark", "--parallelism", "1,0"],
        &["--suite", "throughput", "--events", "10"],
        &["--suite", "sql", "--records", "10"],
        &["--suite", "sql", "--intervals", "100ms"],
    ];
    for flags in cases {
        let out = common::cairn()
            .arg("bench")
            .args(flags)
            .output()
            .expect("cairn starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        let lines: Vec<&str> = stderr.lines().collect();
        assert_eq!(out.status.code(), Some(1), "{flags:?}: {stderr}");
        assert!(
            lines.len() == 1 && lines[0].starts_with("error: "),
            "{flags:?} must be refused with one error line, got:\n{stderr}"
        );
        assert!(out.stdout.is_empty(), "{flags:?} ran something");
    }
}
