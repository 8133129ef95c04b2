//! `cairn bench --suite savepoint` at a small key count: it prints its table, with the row of
//! that key count and positive checkpoint and savepoint sizes. Times are not asserted: they
//! are the machine's.

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
