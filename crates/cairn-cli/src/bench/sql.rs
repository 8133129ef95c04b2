//! `cairn bench --suite sql`: what running a Nexmark query as a Flink SQL script costs against
//! the same query written with the DataStream API. For every query that is both a script of
//! `sql/nexmark` (embedded in the binary, so that the benchmark runs from any directory) and a
//! query of the `nexmark` job, at every `--parallelism`: the `nexmark` job and the script
//! (`ddl.sql` with the events and rate set, then the query) over the same events (`--events`,
//! the generator's default rate, one seed), exactly-once checkpoints as `--suite nexmark`
//! takes them, output discarded (`--discard`; the script's blackhole sink), alternating, best
//! of `--repeat` each. Prints events/s of each (the query's events / the job's own run time)
//! and the ratio SQL / Rust, whose target is 0.80 at least.

use std::path::Path;

use anyhow::{bail, Result};
use cairn_app::human;

use super::{
    bytes_token, nexmark_job, nexmark_run, note_disturbed_runs, BenchArgs, NexmarkRow,
    NEXMARK_CHECKPOINT_INTERVAL, NEXMARK_EVENTS_DEFAULT,
};

/// The Nexmark source table and its views, as the scripts of `sql/nexmark` declare them.
const DDL: &str = include_str!("../../../../sql/nexmark/ddl.sql");

/// Every query script of `sql/nexmark`; the suite runs those the nexmark job also has.
const SCRIPTS: &[(&str, &str)] = &[
    ("q0", include_str!("../../../../sql/nexmark/q0.sql")),
    ("q1", include_str!("../../../../sql/nexmark/q1.sql")),
    ("q2", include_str!("../../../../sql/nexmark/q2.sql")),
    ("q3", include_str!("../../../../sql/nexmark/q3.sql")),
    ("q5", include_str!("../../../../sql/nexmark/q5.sql")),
    ("q7", include_str!("../../../../sql/nexmark/q7.sql")),
    ("q8", include_str!("../../../../sql/nexmark/q8.sql")),
    ("q9", include_str!("../../../../sql/nexmark/q9.sql")),
    ("q11", include_str!("../../../../sql/nexmark/q11.sql")),
    ("q12", include_str!("../../../../sql/nexmark/q12.sql")),
    ("q15", include_str!("../../../../sql/nexmark/q15.sql")),
    ("q16", include_str!("../../../../sql/nexmark/q16.sql")),
    ("q17", include_str!("../../../../sql/nexmark/q17.sql")),
    ("q18", include_str!("../../../../sql/nexmark/q18.sql")),
    ("q19", include_str!("../../../../sql/nexmark/q19.sql")),
    ("q20", include_str!("../../../../sql/nexmark/q20.sql")),
    ("q21", include_str!("../../../../sql/nexmark/q21.sql")),
    ("q22", include_str!("../../../../sql/nexmark/q22.sql")),
];

/// The seed of both jobs' events (`--seed`; the DDL sets none, so the script's source takes
/// the run's).
const SEED: u64 = 0;

/// The ratio SQL / Rust the SQL runtime aims at.
const TARGET: f64 = 0.80;

/// `ddl.sql` with `events` events at `rate` events/s: its `'events.num'`,
/// `'first-event.rate'` and `'next-event.rate'` options rewritten, each found exactly once.
fn ddl(events: u64, rate: u64) -> Result<String> {
    let mut text = DDL.to_string();
    for (option, written, value) in [
        ("events.num", "1000000", events),
        ("first-event.rate", "10000", rate),
        ("next-event.rate", "10000", rate),
    ] {
        let from = format!("'{option}' = '{written}'");
        if text.matches(&from).count() != 1 {
            bail!(
                "the embedded sql/nexmark/ddl.sql does not say {from} once: cannot set {option} to {value}"
            );
        }
        text = text.replace(&from, &format!("'{option}' = '{value}'"));
    }
    Ok(text)
}

pub(super) fn run(args: &BenchArgs, exe: &Path, scratch: &Path) -> Result<()> {
    use cairn::jobs::nexmark::QUERIES;
    let events = args.events.unwrap_or(NEXMARK_EVENTS_DEFAULT);
    let rate = cairn::connectors::DEFAULT_RATE;
    let ddl = ddl(events, rate)?;
    let repeat = args.repeat.max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    println!(
        "nexmark queries as SQL scripts (sql/nexmark) vs the nexmark job: --events {events}, {rate} events/s of event time, --seed {SEED}, output discarded (SQL: the blackhole sink), exactly-once checkpoints every {NEXMARK_CHECKPOINT_INTERVAL} into a temporary directory, alternating, best of {repeat}; {cores} cores available"
    );
    println!(
        "events/s: the query's --events / the job's own run time; SQL/Rust: SQL's events/s / the nexmark job's (target: at least {TARGET:.2})"
    );
    let header = format!(
        "{:<5}  {:>3}  {:>8}  {:>13}  {:>12}  {:>8}  {:>13}  {:>12}",
        "query",
        "p",
        "events",
        "Rust events/s",
        "SQL events/s",
        "SQL/Rust",
        "Rust peak RSS",
        "SQL peak RSS"
    );
    println!("{header}");
    let mut rows: Vec<(NexmarkRow, NexmarkRow)> = Vec::new();
    let mut lines = Vec::new();
    for &(query, script) in SCRIPTS.iter().filter(|(q, _)| QUERIES.contains(q)) {
        let rust_job: Vec<String> = nexmark_job(query, events)
            .into_iter()
            .chain(["--rate".into(), rate.to_string()])
            .chain(["--seed".into(), SEED.to_string()])
            .collect();
        // One script, the DDL first, as `cairn sql ddl.sql QUERY.sql` joins the files.
        let sql_job: Vec<String> = vec![
            "run".into(),
            "sql".into(),
            format!("--execute={ddl}\n;\n{script}"),
            "--seed".into(),
            SEED.to_string(),
        ];
        for &p in &args.parallelism {
            let (mut rust, mut sql): (Option<NexmarkRow>, Option<NexmarkRow>) = (None, None);
            for r in 0..repeat {
                let tag = format!("sql-{query}-p{p}-{r}");
                nexmark_run(exe, scratch, &format!("{tag}-rust"), query, p, &rust_job)?
                    .keep_if_faster(&mut rust);
                nexmark_run(exe, scratch, &format!("{tag}-sql"), query, p, &sql_job)?
                    .keep_if_faster(&mut sql);
            }
            let (Some(mut rust), Some(mut sql)) = (rust, sql) else {
                continue;
            };
            // Both jobs run the query over the same `events`, but their sources may read
            // another number: the nexmark job generates only the kinds of events a query
            // reads, and a SQL plan reads the Nexmark table once per reference to it. Both
            // rates count the query's events.
            let (rust_read, sql_read) = (rust.events, sql.events);
            rust.events = events;
            sql.events = events;
            let ratio = sql.rate() / rust.rate();
            let rss = |row: &NexmarkRow| row.peak_rss.map_or("-".into(), bytes_token);
            println!(
                "{:<5}  {:>3}  {:>8}  {:>13}  {:>12}  {:>8.2}  {:>13}  {:>12}{}",
                query,
                p,
                human::count(sql.events as f64),
                human::count(rust.rate()),
                human::count(sql.rate()),
                ratio,
                rss(&rust),
                rss(&sql),
                if rust_read != sql_read {
                    format!(
                        "  (sources read {} events in Rust, {} in SQL)",
                        human::count(rust_read as f64),
                        human::count(sql_read as f64)
                    )
                } else {
                    String::new()
                },
            );
            lines.push(format!(
                "sql query={query} p={p} events={} rust_source_events={rust_read} sql_source_events={sql_read} rust_events_per_s={:.0} sql_events_per_s={:.0} ratio={ratio:.3} rust_elapsed_ms={} sql_elapsed_ms={} rust_checkpoints={} sql_checkpoints={} rust_peak_rss_bytes={} sql_peak_rss_bytes={} failed_checkpoints={} restarts={}",
                sql.events,
                rust.rate(),
                sql.rate(),
                rust.elapsed_ms,
                sql.elapsed_ms,
                rust.checkpoints,
                sql.checkpoints,
                rust.peak_rss.map_or("-".into(), |b| b.to_string()),
                sql.peak_rss.map_or("-".into(), |b| b.to_string()),
                rust.failed_checkpoints + sql.failed_checkpoints,
                rust.restarts + sql.restarts,
            ));
            rows.push((rust, sql));
        }
    }
    let below: Vec<String> = rows
        .iter()
        .filter(|(rust, sql)| sql.rate() / rust.rate() < TARGET)
        .map(|(rust, sql)| {
            format!(
                "{} p={} ({:.2})",
                sql.query,
                sql.parallelism,
                sql.rate() / rust.rate()
            )
        })
        .collect();
    if below.is_empty() {
        println!("every query at every parallelism reaches the target SQL/Rust of {TARGET:.2}");
    } else {
        println!(
            "below the target SQL/Rust of {TARGET:.2}: {}",
            below.join(", ")
        );
    }
    note_disturbed_runs(rows.iter().flat_map(|(rust, sql)| [rust, sql]));
    println!();
    for line in lines {
        println!("{line}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ddl_takes_the_events_and_the_rate() {
        let text = ddl(1234, 567).expect("the embedded DDL has its options");
        for option in [
            "'events.num' = '1234'",
            "'first-event.rate' = '567'",
            "'next-event.rate' = '567'",
        ] {
            assert!(text.contains(option), "{option} in:\n{text}");
        }
        assert!(
            !text.contains("'1000000'") && !text.contains("'10000'"),
            "{text}"
        );
    }

    #[test]
    fn every_embedded_script_is_a_blackhole_insert() {
        for (query, script) in SCRIPTS {
            assert!(
                script.contains("'connector' = 'blackhole'")
                    && script.contains(&format!("INSERT INTO nexmark_{query}")),
                "{query}:\n{script}"
            );
        }
    }
}
