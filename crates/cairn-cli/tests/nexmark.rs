//! The `nexmark` job end to end: for each query, the committed output of `cairn run nexmark`
//! is the reference computed here from the generator (the same multiset of lines at every
//! parallelism), also through injected failures; bad flags are one-line errors. q12's windows
//! follow the wall clock, so its lines differ from run to run: there each bidder's counts must
//! sum to its bids, in well-formed windows that no bidder has twice.

mod common;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;
use std::process::Command;

use cairn::connectors::{EventKind, NexmarkEvent, NexmarkGenerator};
use cairn::jobs::nexmark::timestamp_text;
use common::*;

const EVENTS: u64 = 200_000;
const SEED: u64 = 42;
const RATE: u64 = 1_000;

/// The lines `query` must commit for events `0..events`, sorted.
fn reference(query: &str, events: u64, seed: u64) -> Vec<String> {
    let generator = NexmarkGenerator::new(seed, RATE);
    let mut lines = Vec::new();
    let of_kind = |kind| (0..events).filter(move |&n| EventKind::of(n) == kind);
    match query {
        "q0" | "q1" | "q2" => {
            for n in of_kind(EventKind::Bid) {
                let NexmarkEvent::Bid(b) = generator.event(n) else {
                    panic!("event {n} is not a bid");
                };
                let time = timestamp_text(b.date_time);
                lines.push(match query {
                    "q0" => format!(
                        "{}\t{}\t{}\t{}\t{}\t{time}\t{}",
                        b.auction, b.bidder, b.price, b.channel, b.url, b.extra
                    ),
                    "q1" => format!(
                        "{}\t{}\t{}.{:03}\t{time}\t{}",
                        b.auction,
                        b.bidder,
                        b.price * 908 / 1000,
                        b.price * 908 % 1000,
                        b.extra
                    ),
                    _ if b.auction % 123 == 0 => format!("{}\t{}", b.auction, b.price),
                    _ => continue,
                });
            }
        }
        "q3" => {
            let mut sellers: HashMap<i64, Vec<String>> = HashMap::new();
            for n in of_kind(EventKind::Person) {
                let NexmarkEvent::Person(p) = generator.event(n) else {
                    panic!("event {n} is not a person");
                };
                if ["OR", "ID", "CA"].contains(&p.state.as_str()) {
                    let seller = format!("{}\t{}\t{}", p.name, p.city, p.state);
                    sellers.entry(p.id).or_default().push(seller);
                }
            }
            for n in of_kind(EventKind::Auction) {
                let NexmarkEvent::Auction(a) = generator.event(n) else {
                    panic!("event {n} is not an auction");
                };
                if a.category == 10 {
                    for seller in sellers.get(&a.seller).into_iter().flatten() {
                        lines.push(format!("{seller}\t{}", a.id));
                    }
                }
            }
        }
        "q4" => lines = q4_reference(&generator, events),
        other => panic!("no reference for {other}"),
    }
    assert!(
        !lines.is_empty(),
        "{query} has no output: the test would prove nothing"
    );
    lines.sort_unstable();
    lines
}

/// `cairn run nexmark` of `events` events from `seed` (which also seeds --inject-failures).
fn nexmark(query: &str, events: u64, seed: u64, parallelism: u32, out: &Path) -> Command {
    let mut cmd = cairn();
    cmd.args(["run", "nexmark", "--query", query])
        .args(["--events", &events.to_string()])
        .args(["--seed", &seed.to_string(), "--rate", &RATE.to_string()])
        .args(["-p", &parallelism.to_string()])
        .arg("--output")
        .arg(out);
    cmd
}

/// Runs `query` at parallelism 1, 2 and 3 and compares each committed output with the
/// reference.
fn matches_the_reference_at_every_parallelism(query: &str) {
    let expected = reference(query, EVENTS, SEED);
    for p in [1, 2, 3] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let run = run_ok(&mut nexmark(query, EVENTS, SEED, p, &out));
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            stderr.contains(&format!("nexmark-{query} finished")),
            "{stderr}"
        );
        assert_no_leftovers(&out);
        let got = committed_sorted(&out);
        assert!(
            got == expected,
            "{query} at parallelism {p}: {} lines committed, {} expected; first difference: {:?}",
            got.len(),
            expected.len(),
            got.iter().zip(&expected).find(|(g, e)| g != e)
        );
    }
}

#[test]
fn q0_passes_every_bid_through_at_parallelism_1_2_3() {
    matches_the_reference_at_every_parallelism("q0");
}

#[test]
fn q1_converts_every_price_at_parallelism_1_2_3() {
    matches_the_reference_at_every_parallelism("q1");
}

#[test]
fn q2_selects_the_bids_of_every_123rd_auction_at_parallelism_1_2_3() {
    matches_the_reference_at_every_parallelism("q2");
}

#[test]
fn q3_joins_local_sellers_with_their_auctions_at_parallelism_1_2_3() {
    matches_the_reference_at_every_parallelism("q3");
}

#[test]
fn q3_with_injected_failures_commits_exactly_the_output_of_an_undisturbed_run() {
    // Long enough for several checkpoints before, between and after the failures (q3's
    // sources read the persons and auctions only: 8 % of the events).
    let events = 12_000_000;
    let mut restored = 0;
    for (p, seed) in [(2, 1), (3, 6)] {
        let expected = reference("q3", events, seed);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let run = run_ok(
            nexmark("q3", events, seed, p, &out)
                .arg("--checkpoint-dir")
                .arg(tmp.path().join("ck"))
                // Often, so that a checkpoint completes before the first failure: the whole
                // run takes well under a second here.
                .args(["--checkpoint-interval", "10ms"])
                .args(["--inject-failures", "3"])
                .args(RESTART_FAST),
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            stderr.contains(", 3 restarts, 3/3 injected failures"),
            "p={p} seed {seed}: {stderr}"
        );
        restored += stderr
            .lines()
            .filter(|l| l.contains("restoring regions") && l.contains(" from checkpoint "))
            .count();
        assert_no_leftovers(&out);
        let got = committed_sorted(&out);
        assert!(
            got == expected,
            "p={p} seed {seed}: {} lines committed, {} expected",
            got.len(),
            expected.len()
        );
    }
    assert!(
        restored > 0,
        "no failure restored from a checkpoint: they all came before the first one"
    );
}

/// Runs `cairn run nexmark ARGS`; asserts one `error:` line and exit code 1; returns it.
fn refused(args: &[&str]) -> String {
    let out = cairn().args(args).output().expect("cairn starts");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(out.status.code(), Some(1), "{args:?}: {stderr}");
    assert_eq!(lines.len(), 1, "{args:?}: {stderr}");
    assert!(lines[0].starts_with("error: "), "{args:?}: {stderr}");
    lines[0].to_string()
}

#[test]
fn bad_nexmark_flags_are_one_line_errors() {
    let available = "available queries: q0, q1, q2, q3, q4, q5, q7, q8, q11, q12";
    let e = refused(&["run", "nexmark", "--events", "10", "--discard"]);
    assert!(
        e.contains("nexmark needs --query") && e.contains(available),
        "{e}"
    );
    let e = refused(&["run", "nexmark", "--query", "q42", "--events", "10"]);
    assert_eq!(
        e,
        format!("error: unknown nexmark query 'q42'; {available}")
    );
    let e = refused(&["run", "nexmark", "--query", "q6", "--events", "10"]);
    assert_eq!(
        e,
        format!("error: nexmark query 'q6' is not available yet; {available}")
    );
    let e = refused(&["run", "nexmark", "--query", "q0"]);
    assert_eq!(e, "error: nexmark needs --events N");
    let e = refused(&["run", "nexmark", "--query", "q0", "--events", "0"]);
    assert_eq!(e, "error: --events must be at least 1");
    let e = refused(&[
        "run", "nexmark", "--query", "q0", "--events", "9", "--rate", "0",
    ]);
    assert_eq!(
        e,
        "error: --rate must be at least 1 event per second for nexmark"
    );
    // Each job has its own flags: another job's are clap's parse errors (exit 2) naming them.
    for (args, flag) in [
        (
            &[
                "run", "nexmark", "--query", "q0", "--events", "10", "--input", "w.txt",
            ][..],
            "--input",
        ),
        (
            &[
                "run",
                "nexmark",
                "--query",
                "q0",
                "--events",
                "10",
                "--generate",
                "100",
            ][..],
            "--generate",
        ),
        (
            &["run", "wordcount", "--generate", "10", "--query", "q0"][..],
            "--query",
        ),
        (
            &["run", "backpressure", "--generate", "10", "--rate", "10"][..],
            "--rate",
        ),
    ] {
        let out = cairn().args(args).output().expect("cairn starts");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("error: unexpected argument '{flag}'")),
            "{args:?}: {stderr}"
        );
    }
}

/// The committed output of an undisturbed run (parallelism 1, no checkpoints) of `query`.
fn undisturbed(query: &str, events: u64, seed: u64) -> Vec<String> {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_ok(&mut nexmark(query, events, seed, 1, &out));
    let lines = committed_sorted(&out);
    assert!(!lines.is_empty(), "{query} produced nothing");
    lines
}

/// Events of the event-time queries' failure tests: long enough for several checkpoints.
const TIMED_EVENTS: u64 = 2_000_000;

#[test]
fn event_time_queries_give_the_same_lines_at_every_parallelism() {
    for query in ["q5", "q7", "q8", "q11"] {
        let expected = undisturbed(query, 300_000, SEED);
        for p in [2, 3] {
            let tmp = tempfile::tempdir().unwrap();
            let out = tmp.path().join("out");
            run_ok(&mut nexmark(query, 300_000, SEED, p, &out));
            assert!(committed_sorted(&out) == expected, "{query} at p={p}");
        }
    }
}

#[test]
fn event_time_queries_with_injected_failures_commit_exactly_the_output_of_an_undisturbed_run() {
    for (query, p, seed) in [("q5", 2, 3), ("q8", 3, 4), ("q11", 2, 5)] {
        let expected = undisturbed(query, TIMED_EVENTS, seed);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        let run = run_ok(
            nexmark(query, TIMED_EVENTS, seed, p, &out)
                .arg("--checkpoint-dir")
                .arg(tmp.path().join("ck"))
                .args(["--checkpoint-interval", "50ms"])
                .args(["--inject-failures", "2"])
                .args(RESTART_FAST),
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            stderr.contains(", 2 restarts, 2/2 injected failures"),
            "{query}: {stderr}"
        );
        assert_no_leftovers(&out);
        let got = committed_sorted(&out);
        assert!(
            got == expected,
            "{query} p={p}: {} lines committed, {} expected",
            got.len(),
            expected.len()
        );
    }
}

/// The 10 s window of a q7 line: its date_time (`YYYY-MM-DD HH:MM:SS.mmm`) to tens of seconds.
fn q7_window(line: &str) -> String {
    let date_time = line.split('\t').nth(3).expect("q7 lines have a date_time");
    date_time[..18].to_string()
}

/// `cairn stop --drain` on a running q7 (10 s tumbling windows): the maximum watermark goes in
/// front of the stop barrier, so the window still open at the stop fires too, and every
/// window before it holds exactly an undisturbed run's lines; the job ends FINISHED. Resumed
/// from the drained savepoint, the job has no event time left: it reads nothing and ends.
#[test]
fn stop_with_drain_fires_the_open_window_and_ends_event_time() {
    let tmp = tempfile::tempdir().unwrap();
    let (out, ck, sp) = (
        tmp.path().join("out"),
        tmp.path().join("ck"),
        tmp.path().join("sp"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let mut run = Watched::spawn(
        nexmark("q7", 400_000_000, SEED, 1, &out)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .args(["--checkpoint-interval", "100ms", "--rest", "127.0.0.1:0"]),
    );
    let rest = run.rest_addr(deadline).to_string();
    run.wait_for_a_checkpoint(&ck, deadline);
    let list = run_ok(cairn().args(["list", "--rest", &rest]));
    let jid = String::from_utf8_lossy(&list.stdout)
        .split_whitespace()
        .next()
        .expect("the job is listed")
        .to_string();
    let stopped = run_ok(
        cairn()
            .args(["stop", &jid, "--drain", "--savepoint-dir"])
            .arg(&sp)
            .args(["--rest", &rest]),
    );
    let stdout = String::from_utf8_lossy(&stopped.stdout);
    assert!(stdout.contains(&format!("job {jid} finished")), "{stdout}");
    let (status, stderr) = run.wait(deadline);
    assert!(status.success(), "{stderr}");
    assert_no_leftovers(&out);

    let drained = committed_sorted(&out);
    let windows: std::collections::BTreeSet<String> =
        drained.iter().map(|l| q7_window(l)).collect();
    let open = windows
        .last()
        .expect("the drained run committed windows")
        .clone();
    // An undisturbed run long enough to complete the open window: at RATE events per second
    // of event time, a window holds 10 * RATE events.
    let events = (windows.len() as u64 + 2) * 10 * RATE;
    assert!(events < 400_000_000, "the stop landed mid-run");
    let reference = undisturbed("q7", events, SEED);
    let before = |lines: &[String]| -> Vec<String> {
        lines
            .iter()
            .filter(|l| q7_window(l) < open)
            .cloned()
            .collect()
    };
    assert!(
        before(&drained) == before(&reference),
        "the windows before the stop differ"
    );
    assert!(
        reference.iter().any(|l| q7_window(l) == open),
        "the open window {open} is one of the job's"
    );

    // Resumed from the drained savepoint: nothing more is read, nothing fires again.
    let savepoint = String::from_utf8_lossy(&stopped.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("savepoint stored in ").map(str::to_string))
        .expect("cairn stop names the savepoint");
    let resumed = run_ok(
        nexmark("q7", 400_000_000, SEED, 2, &out)
            .arg("--checkpoint-dir")
            .arg(tmp.path().join("ck2"))
            .arg("--from")
            .arg(&savepoint),
    );
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(stderr.contains("event time ended"), "{stderr}");
    assert!(
        committed_sorted(&out) == drained,
        "the resumed drained job wrote more"
    );
}

/// SIGKILLs `query` at two chosen points of checkpoint progress (a sink's pre-commit, then the
/// coordinator right after a checkpoint completed), resumes `--from latest` each time, and
/// compares the committed lines with an undisturbed run's: windows and timers are restored,
/// nothing fires twice and nothing is lost.
fn killed_and_resumed(query: &str, parallelism: u32, seed: u64) {
    killed_and_resumed_with(query, parallelism, seed, &[]);
}

/// [`killed_and_resumed`] with more flags for every run (say, unaligned checkpoints).
fn killed_and_resumed_with(query: &str, parallelism: u32, seed: u64, flags: &[&str]) {
    // q8's sources generate only persons and auctions (8 % of the events), and q4 runs at
    // over 2M events/s: they need more events for a run to last past several checkpoints.
    let events = match query {
        "q8" => 10 * TIMED_EVENTS,
        "q4" => 4 * TIMED_EVENTS,
        _ => TIMED_EVENTS,
    };
    let expected = undisturbed(query, events, seed);
    let tmp = tempfile::tempdir().unwrap();
    let (out, ck) = (tmp.path().join("out"), tmp.path().join("ck"));
    let run = || {
        let mut cmd = nexmark(query, events, seed, parallelism, &out);
        cmd.arg("--checkpoint-dir").arg(&ck).args([
            "--checkpoint-interval",
            "30ms",
            "--from",
            "latest",
        ]);
        cmd.args(flags);
        cmd
    };
    for (i, (point, at)) in [("sink-pre-committed", 3), ("checkpoint-completed", 6)]
        .into_iter()
        .enumerate()
    {
        let marker = tmp.path().join(format!("marker-{i}"));
        let log = tmp.path().join(format!("run-{i}.log"));
        let (name, id) = kill_at_failpoint(run(), point, at, &marker, &log)
            .unwrap_or_else(|e| panic!("{query}: run {i}: {e}"));
        assert_eq!(name, point, "{query}: run {i}");
        assert!(id >= at, "{query}: {point} fired at {id}, armed for {at}");
    }
    let last = run_ok(run().stderr(std::process::Stdio::piped()));
    let stderr = String::from_utf8_lossy(&last.stderr);
    assert!(stderr.contains("restored from "), "{query}: {stderr}");
    assert_no_leftovers(&out);
    let got = committed_sorted(&out);
    assert!(
        got == expected,
        "{query}: {} lines committed, {} expected",
        got.len(),
        expected.len()
    );
}

/// Unaligned checkpoints persist in-flight records but never watermarks: a restored task
/// takes its event time from the restored sources again, so windows neither fire twice nor
/// lose records that were in flight.
#[test]
fn q11_with_unaligned_checkpoints_sigkilled_and_resumed_commits_exactly_the_output_of_an_undisturbed_run(
) {
    killed_and_resumed_with("q11", 2, 17, &["--unaligned"]);
}

#[test]
fn q5_sigkilled_and_resumed_commits_exactly_the_output_of_an_undisturbed_run() {
    killed_and_resumed("q5", 2, 7);
}

#[test]
fn q8_sigkilled_and_resumed_commits_exactly_the_output_of_an_undisturbed_run() {
    killed_and_resumed("q8", 2, 8);
}

#[test]
fn q11_sigkilled_and_resumed_commits_exactly_the_output_of_an_undisturbed_run() {
    killed_and_resumed("q11", 3, 9);
}

/// Stops `query` at `from_p` with a savepoint once a checkpoint completed, resumes it from the
/// savepoint at `to_p` into the same output, and compares with an undisturbed run: window
/// contents and timers are redistributed by key group, nothing fires twice, nothing is lost.
fn rescaled_through_a_savepoint(query: &str, from_p: u32, to_p: u32, seed: u64) {
    rescaled_through_a_savepoint_with(query, from_p, to_p, seed, &[]);
}

/// [`rescaled_through_a_savepoint`] with more flags for both runs (say, the state backend).
fn rescaled_through_a_savepoint_with(
    query: &str,
    from_p: u32,
    to_p: u32,
    seed: u64,
    flags: &[String],
) {
    let events = 4_000_000;
    let expected = undisturbed(query, events, seed);
    let tmp = tempfile::tempdir().unwrap();
    let (out, ck, sp) = (
        tmp.path().join("out"),
        tmp.path().join("ck"),
        tmp.path().join("sp"),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    let first = Watched::spawn(
        nexmark(query, events, seed, from_p, &out)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .args(["--checkpoint-interval", "30ms"])
            .arg("--savepoint-on-exit")
            .arg(&sp)
            .args(flags),
    );
    let (savepoint, _) = first.stop_with_savepoint_after_a_checkpoint(&ck, deadline);
    let partial = committed_sorted(&out).len();
    assert!(
        partial < expected.len(),
        "{query}: the run ended before it was stopped"
    );
    run_ok(
        nexmark(query, events, seed, to_p, &out)
            .arg("--checkpoint-dir")
            .arg(&ck)
            .args(["--checkpoint-interval", "200ms"])
            .arg("--from")
            .arg(&savepoint)
            .args(flags),
    );
    assert_no_leftovers(&out);
    let got = committed_sorted(&out);
    assert!(
        got == expected,
        "{query} {from_p} -> {to_p}: {} lines committed ({partial} before the savepoint), {} expected",
        got.len(),
        expected.len()
    );
}

/// The flags of the RocksDB backend with incremental checkpoints, its instances under `dir`.
fn rocksdb_flags(dir: &Path) -> Vec<String> {
    vec![
        "-D".into(),
        "state.backend.type=rocksdb".into(),
        "-D".into(),
        "state.backend.incremental=true".into(),
        "-D".into(),
        format!("state.backend.rocksdb.localdir={}", dir.display()),
    ]
}

/// Windows and their timers on RocksDB (the timers in column families of their own), through
/// SIGKILLs at chosen points of checkpoint progress: nothing fires twice, nothing is lost.
#[test]
fn q5_on_rocksdb_sigkilled_and_resumed_commits_exactly_the_output_of_an_undisturbed_run() {
    let local = tempfile::tempdir().unwrap();
    let flags = rocksdb_flags(local.path());
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    killed_and_resumed_with("q5", 2, 21, &flags);
}

/// Session windows and timers on RocksDB, stopped with a savepoint at parallelism 2 and
/// resumed at 3 on RocksDB again: timers move with their key groups.
#[test]
fn q11_on_rocksdb_rescaled_from_2_to_3_through_a_savepoint_stays_exactly_once() {
    let local = tempfile::tempdir().unwrap();
    rescaled_through_a_savepoint_with("q11", 2, 3, 22, &rocksdb_flags(local.path()));
}

#[test]
fn q11_sessions_rescaled_from_2_to_3_through_a_savepoint_stay_exactly_once() {
    rescaled_through_a_savepoint("q11", 2, 3, 11);
}

#[test]
fn q5_hot_items_rescaled_from_3_to_2_through_a_savepoint_stay_exactly_once() {
    rescaled_through_a_savepoint("q5", 3, 2, 12);
}

/// q4's lines for events `0..events`: per category and distinct `expires` of its closed
/// auctions, the truncated average of the final prices of those closed by then. An auction's
/// final price is its highest bid with a date_time between the auction's and its expires; an
/// auction without one has none.
fn q4_reference(generator: &NexmarkGenerator, events: u64) -> Vec<String> {
    // Auction id → (category, date_time, expires, highest bid in bounds).
    let mut auctions: HashMap<i64, (i64, i64, i64, Option<i64>)> = HashMap::new();
    let mut bids = Vec::new();
    for n in 0..events {
        match generator.event(n) {
            NexmarkEvent::Auction(a) => {
                auctions.insert(a.id, (a.category, a.date_time, a.expires, None));
            }
            NexmarkEvent::Bid(b) => bids.push(b),
            NexmarkEvent::Person(_) => {}
        }
    }
    let mut early_or_late = 0;
    for b in bids {
        match auctions.get_mut(&b.auction) {
            Some((_, opens, closes, best)) if (*opens..=*closes).contains(&b.date_time) => {
                *best = Some(best.map_or(b.price, |p| p.max(b.price)));
            }
            _ => early_or_late += 1,
        }
    }
    assert!(
        early_or_late > 0,
        "every bid is in bounds: the test would prove less"
    );
    // Category → expires → (sum, count) of the final prices of the auctions closing then.
    let mut closing: BTreeMap<i64, BTreeMap<i64, (i128, i128)>> = BTreeMap::new();
    for (category, _, expires, best) in auctions.into_values() {
        if let Some(price) = best {
            let at = closing
                .entry(category)
                .or_default()
                .entry(expires)
                .or_default();
            at.0 += i128::from(price);
            at.1 += 1;
        }
    }
    let mut lines = Vec::new();
    for (category, by_expires) in closing {
        let (mut sum, mut count) = (0, 0);
        for (s, c) in by_expires.into_values() {
            sum += s;
            count += c;
            lines.push(format!("{category}\t{}", sum / count));
        }
    }
    lines
}

#[test]
fn q4_averages_the_closed_auctions_of_each_category_at_parallelism_1_2_3() {
    matches_the_reference_at_every_parallelism("q4");
}

/// The most runs of [`run_with_three_injected_failures`] before it gives up on a failure
/// landing after a completed checkpoint.
const INJECTED_RUNS_MAX: usize = 4;

/// Runs `query` with 3 injected failures and 20 ms checkpoints into `out`, and checks that
/// every failure was recovered, at least one from a checkpoint, and nothing was left behind.
/// The failures fire at source progress, so on a fast or a loaded machine all three may come
/// before the first checkpoint completes: such a run is done again from nothing (same seed,
/// same events, empty output and checkpoint directories), up to [`INJECTED_RUNS_MAX`] times.
fn run_with_three_injected_failures(query: &str, p: u32, seed: u64, out: &Path) {
    let ck = out.with_file_name("ck");
    for attempt in 1..=INJECTED_RUNS_MAX {
        let _ = std::fs::remove_dir_all(out);
        let _ = std::fs::remove_dir_all(&ck);
        let run = run_ok(
            nexmark(query, TIMED_EVENTS, seed, p, out)
                .arg("--checkpoint-dir")
                .arg(&ck)
                .args(["--checkpoint-interval", "20ms"])
                .args(["--inject-failures", "3"])
                .args(RESTART_FAST),
        );
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(
            stderr.contains(", 3 restarts, 3/3 injected failures"),
            "{query}: {stderr}"
        );
        let from_checkpoint = stderr
            .lines()
            .any(|l| l.contains("restoring regions") && l.contains(" from checkpoint "));
        if !from_checkpoint {
            assert!(
                attempt < INJECTED_RUNS_MAX,
                "{query}: in {attempt} runs no failure restored from a checkpoint: they all came before the first one\n{stderr}"
            );
            continue;
        }
        assert_no_leftovers(out);
        return;
    }
}

#[test]
fn q4_with_injected_failures_commits_exactly_the_reference() {
    let (p, seed) = (2, 13);
    let expected = reference("q4", TIMED_EVENTS, seed);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_with_three_injected_failures("q4", p, seed, &out);
    let got = committed_sorted(&out);
    assert!(
        got == expected,
        "q4 p={p}: {} lines committed, {} expected",
        got.len(),
        expected.len()
    );
}

#[test]
fn q4_sigkilled_and_resumed_commits_exactly_the_output_of_an_undisturbed_run() {
    killed_and_resumed("q4", 2, 14);
}

/// Each bidder's number of bids among events `0..events`.
fn bids_per_bidder(events: u64, seed: u64) -> HashMap<i64, u64> {
    let generator = NexmarkGenerator::new(seed, RATE);
    let mut counts = HashMap::new();
    for n in (0..events).filter(|&n| EventKind::of(n) == EventKind::Bid) {
        if let NexmarkEvent::Bid(b) = generator.event(n) {
            *counts.entry(b.bidder).or_default() += 1;
        }
    }
    counts
}

/// q12's committed lines depend on the wall clock; what must hold: every line is a 10 s
/// window aligned to 10 s, no bidder has a window twice, and each bidder's counts sum to its
/// bids.
fn assert_q12_counts_every_bid_once(out: &Path, events: u64, seed: u64, what: &str) {
    let mut per_bidder: HashMap<i64, u64> = HashMap::new();
    let mut windows = HashSet::new();
    let lines = committed_sorted(out);
    for line in &lines {
        let fields: Vec<i64> = line
            .split('\t')
            .map(|f| {
                f.parse()
                    .unwrap_or_else(|e| panic!("{what}: {line:?}: {e}"))
            })
            .collect();
        let [bidder, count, start, end] = fields[..] else {
            panic!("{what}: not 4 columns: {line:?}");
        };
        assert_eq!(end - start, 10_000, "{what}: {line:?}");
        assert_eq!(start % 10_000, 0, "{what}: {line:?}");
        assert!(count > 0, "{what}: {line:?}");
        assert!(
            windows.insert((bidder, start)),
            "{what}: bidder {bidder} has the window at {start} twice"
        );
        *per_bidder.entry(bidder).or_default() += count as u64;
    }
    let expected = bids_per_bidder(events, seed);
    assert_eq!(per_bidder.len(), expected.len(), "{what}: bidders");
    for (bidder, n) in &expected {
        assert_eq!(per_bidder.get(bidder), Some(n), "{what}: bidder {bidder}");
    }
}

#[test]
fn q12_counts_every_bid_of_every_bidder_once_at_parallelism_1_and_3() {
    for p in [1, 3] {
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("out");
        run_ok(&mut nexmark("q12", EVENTS, SEED, p, &out));
        assert_no_leftovers(&out);
        assert_q12_counts_every_bid_once(&out, EVENTS, SEED, &format!("p={p}"));
    }
}

#[test]
fn q12_with_injected_failures_counts_every_bid_of_every_bidder_once() {
    let (p, seed) = (2, 15);
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    run_with_three_injected_failures("q12", p, seed, &out);
    assert_q12_counts_every_bid_once(&out, TIMED_EVENTS, seed, "with failures");
}
