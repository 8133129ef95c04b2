//! Event time, timers and windows run for real by the embedded runtime, each checked against a
//! reference computed here from the same records.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::api::{
    AggregateFunction, Collector, KeyedProcessFunction, StreamEnv, TimeWindow, WatermarkStrategy,
    WindowAssigner,
};
use cairn::config::JobConfig;
use cairn::connectors::SequenceSource;
use cairn::runtime::{run_job, RunOptions};
use cairn::state::{KeyedContext, TimeDomain, ValueState};
use cairn::window::Trigger;
use cairn::TaskResult;

#[path = "support/collect.rs"]
mod collect;
use collect::Collect;

/// A record: key, event time (ms), value.
type Rec = (u64, i64, u64);

const KEYS: u64 = 7;

/// Record i: key i mod 7, time 3i ms, value i. Monotonous within each split.
fn rec(i: u64) -> Rec {
    (i % KEYS, 3 * i as i64, i)
}

fn run<T: Send + Clone + Ord + std::fmt::Debug + 'static>(
    build: impl FnOnce(&StreamEnv, Collect<T>),
    parallelism: u32,
) -> Vec<T> {
    let env = StreamEnv::new();
    let out = Collect(Arc::new(Mutex::new(Vec::new())));
    build(&env, out.clone());
    let graph = env.build("windows").unwrap();
    let config = JobConfig {
        parallelism,
        auto_watermark_interval: Duration::from_millis(1),
        ..JobConfig::default()
    };
    run_job(
        &graph,
        RunOptions {
            config,
            ..RunOptions::default()
        },
    )
    .unwrap();
    let mut v = out.0.lock().unwrap().clone();
    v.sort();
    v
}

fn source(env: &StreamEnv, n: u64, make: fn(u64) -> Rec) -> cairn::api::DataStream<Rec> {
    env.source_with_watermarks(
        SequenceSource::new(n, 0, make),
        WatermarkStrategy::monotonous(|r: &Rec| r.1),
    )
    .uid("source")
}

#[derive(Clone)]
struct SumCount;

impl AggregateFunction<Rec, (u64, u64)> for SumCount {
    type Acc = (u64, u64);
    fn create(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, u64), r: Rec) {
        acc.0 += r.2;
        acc.1 += 1;
    }
    fn merge(&self, acc: &mut (u64, u64), o: &(u64, u64)) {
        acc.0 += o.0;
        acc.1 += o.1;
    }
    fn result(&self, acc: &(u64, u64)) -> (u64, u64) {
        *acc
    }
}

/// (key, window start, window end, sum, count)
type Row = (u64, i64, i64, u64, u64);

fn with_window(k: &u64, w: TimeWindow, r: (u64, u64), out: &mut Collector<Row>) {
    out.collect((*k, w.start, w.end, r.0, r.1));
}

/// The reference: every aligned window of `size`/`slide` per key.
fn aligned_reference(records: &[Rec], size: i64, slide: i64) -> Vec<Row> {
    let mut m: BTreeMap<(u64, i64), (u64, u64)> = BTreeMap::new();
    for r in records {
        let last = r.1 - r.1.rem_euclid(slide);
        let mut start = last;
        while start > r.1 - size {
            let e = m.entry((r.0, start)).or_default();
            e.0 += r.2;
            e.1 += 1;
            start -= slide;
        }
    }
    let mut v: Vec<Row> = m
        .into_iter()
        .map(|((k, s), (sum, n))| (k, s, s + size, sum, n))
        .collect();
    v.sort();
    v
}

const N: u64 = 20_000;

#[test]
fn tumbling_event_time_windows_match_the_reference() {
    let got = run(
        |env, out| {
            source(env, N, rec)
                .key_by(|r: &Rec| r.0)
                .window(WindowAssigner::tumbling(Duration::from_millis(100)))
                .aggregate_process(SumCount, with_window)
                .uid("window")
                .sink(out)
                .uid("sink");
        },
        2,
    );
    let records: Vec<Rec> = (0..N).map(rec).collect();
    assert_eq!(got, aligned_reference(&records, 100, 100));
}

#[test]
fn sliding_windows_share_panes_and_match_the_reference() {
    for p in [1, 3] {
        let got = run(
            |env, out| {
                source(env, N, rec)
                    .key_by(|r: &Rec| r.0)
                    .window(WindowAssigner::sliding(
                        Duration::from_millis(100),
                        Duration::from_millis(40),
                    ))
                    .aggregate_process(SumCount, with_window)
                    .uid("window")
                    .sink(out)
                    .uid("sink");
            },
            p,
        );
        let records: Vec<Rec> = (0..N).map(rec).collect();
        assert_eq!(got, aligned_reference(&records, 100, 40), "parallelism {p}");
    }
}

#[test]
fn full_window_process_and_reduce_agree_with_the_aggregate() {
    let all = run(
        |env, out| {
            source(env, N, rec)
                .key_by(|r: &Rec| r.0)
                .window(WindowAssigner::tumbling(Duration::from_millis(250)))
                .process(
                    |k: &u64, w: TimeWindow, v: Vec<Rec>, out: &mut Collector<Row>| {
                        let sum = v.iter().map(|r| r.2).sum();
                        out.collect((*k, w.start, w.end, sum, v.len() as u64));
                    },
                )
                .uid("window")
                .sink(out)
                .uid("sink");
        },
        2,
    );
    let records: Vec<Rec> = (0..N).map(rec).collect();
    assert_eq!(all, aligned_reference(&records, 250, 250));
    let reduced = run(
        |env, out| {
            source(env, N, rec)
                .key_by(|r: &Rec| r.0)
                .window(WindowAssigner::tumbling(Duration::from_millis(250)))
                .reduce(|a: &Rec, b: &Rec| (a.0, a.1.max(b.1), a.2 + b.2))
                .uid("window")
                .map(|r: Rec| (r.0, r.2))
                .sink(out)
                .uid("sink");
        },
        2,
    );
    let expected: Vec<(u64, u64)> = {
        let mut v: Vec<_> = aligned_reference(&records, 250, 250)
            .into_iter()
            .map(|r| (r.0, r.3))
            .collect();
        v.sort();
        v
    };
    assert_eq!(reduced, expected);
}

/// Record i of key i mod 7: bursts of 30 records 10 ms apart, then a pause of 500 ms.
fn bursty(i: u64) -> Rec {
    let burst = i / 30;
    (
        i % KEYS,
        burst as i64 * (30 * 10 + 500) + (i % 30) as i64 * 10,
        1,
    )
}

#[test]
fn session_windows_merge_and_match_the_reference() {
    let n = 3_000;
    let got = run(
        |env, out| {
            source(env, n, bursty)
                .key_by(|r: &Rec| r.0)
                .window(WindowAssigner::session(Duration::from_millis(100)))
                .aggregate_process(SumCount, with_window)
                .uid("window")
                .sink(out)
                .uid("sink");
        },
        2,
    );
    // Reference: per key, sort times and cut where the gap reaches 100 ms.
    let mut per_key: BTreeMap<u64, Vec<i64>> = BTreeMap::new();
    for r in (0..n).map(bursty) {
        per_key.entry(r.0).or_default().push(r.1);
    }
    let mut expected = Vec::new();
    for (k, mut ts) in per_key {
        ts.sort();
        let (mut start, mut last, mut count) = (ts[0], ts[0], 0u64);
        for &t in &ts {
            if t >= last + 100 {
                expected.push((k, start, last + 100, count, count));
                start = t;
                count = 0;
            }
            last = t;
            count += 1;
        }
        expected.push((k, start, last + 100, count, count));
    }
    expected.sort();
    assert_eq!(got, expected);
    assert!(expected.len() > KEYS as usize * 10, "sessions were cut");
}

#[test]
fn count_triggers_fire_every_n_records_and_purging_clears() {
    let got = run(
        |env, out| {
            source(env, 700, |i| (i % KEYS, 0, 1))
                .key_by(|r: &Rec| r.0)
                .window(WindowAssigner::tumbling(Duration::from_secs(3600)))
                .trigger(Trigger::purging(Trigger::count(30)))
                .aggregate_process(SumCount, with_window)
                .uid("window")
                .map(|r: Row| r.4)
                .sink(out)
                .uid("sink");
        },
        1,
    );
    // 100 records per key: three firings of 30 each; the last 10 never fire.
    assert_eq!(got, vec![30; 3 * KEYS as usize]);
}

/// One record per ms of event time; every 1000th record (after the first 5000) is stamped at
/// time 0: its window was dropped long before it arrives.
fn with_stragglers(i: u64) -> Rec {
    let late = i >= 5_000 && i % 1_000 == 0;
    (i % KEYS, if late { 0 } else { i as i64 }, i)
}

#[test]
fn late_records_go_to_the_side_output_and_windows_fire_once() {
    let late_out = Collect(Arc::new(Mutex::new(Vec::new())));
    let late2 = late_out.clone();
    let got = run(
        move |env, out| {
            let (results, late) = env
                .source_with_watermarks(
                    // Throttled, so watermarks go out while it runs.
                    SequenceSource::new(10_000, 10_000, with_stragglers),
                    WatermarkStrategy::monotonous(|r: &Rec| r.1),
                )
                .uid("source")
                .key_by(|r: &Rec| r.0)
                .window(WindowAssigner::tumbling(Duration::from_millis(100)))
                .allowed_lateness(Duration::from_millis(10))
                .aggregate_process_with_late(SumCount, with_window)
                .uid("window")
                .split_late();
            results.sink(out).uid("sink");
            late.sink(late2).uid("late-sink");
        },
        1,
    );
    let mut late: Vec<Rec> = late_out.0.lock().unwrap().clone();
    late.sort();
    let mut expected_late: Vec<Rec> = (5..10).map(|k| with_stragglers(k * 1_000)).collect();
    expected_late.sort();
    assert_eq!(
        late, expected_late,
        "the stragglers, and only them, are late"
    );
    // Every window fired once with all of its on-time records.
    let on_time: Vec<Rec> = (0..10_000)
        .map(with_stragglers)
        .filter(|r| !(r.1 == 0 && r.2 >= 5_000))
        .collect();
    assert_eq!(got, aligned_reference(&on_time, 100, 100));
}

/// Counts a key's records per second of event time and emits the count when the event-time
/// timer at the end of that second fires (registered for every record: deduplicated).
#[derive(Clone, Default)]
struct CountUntilTimer {
    count: Option<ValueState<BTreeMap<i64, u64>>>,
}

impl KeyedProcessFunction<u64, Rec, (u64, i64, u64)> for CountUntilTimer {
    fn open(&mut self, ctx: &mut KeyedContext<u64>) -> TaskResult {
        self.count = Some(ctx.value_state("count")?);
        Ok(())
    }
    fn process(
        &mut self,
        _r: Rec,
        ctx: &mut KeyedContext<u64>,
        _out: &mut Collector<(u64, i64, u64)>,
    ) -> TaskResult {
        let state = self.count.clone().unwrap();
        let ts = ctx.timestamp().expect("timestamps");
        let end = ts - ts.rem_euclid(1000) + 999;
        *state.get_mut(ctx, BTreeMap::new)?.entry(end).or_default() += 1;
        ctx.register_event_time_timer(end)?;
        Ok(())
    }
    fn on_timer(
        &mut self,
        time: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<u64>,
        out: &mut Collector<(u64, i64, u64)>,
    ) -> TaskResult {
        assert_eq!(domain, TimeDomain::EventTime);
        let state = self.count.clone().unwrap();
        let key = *ctx.current_key().unwrap();
        let n = state.get_mut(ctx, BTreeMap::new)?.remove(&time);
        out.collect((
            key,
            time,
            n.expect("a timer fires once, for a second that had records"),
        ));
        Ok(())
    }
}

#[test]
fn event_time_timers_fire_once_per_key_and_time_with_the_key_in_scope() {
    let got = run(
        |env, out| {
            source(env, N, rec)
                .key_by(|r: &Rec| r.0)
                .process(CountUntilTimer::default())
                .uid("timers")
                .sink(out)
                .uid("sink");
        },
        2,
    );
    let records: Vec<Rec> = (0..N).map(rec).collect();
    let expected: Vec<(u64, i64, u64)> = aligned_reference(&records, 1000, 1000)
        .into_iter()
        .map(|r| (r.0, r.2 - 1, r.4))
        .collect();
    assert_eq!(got, expected);
}

#[test]
fn window_all_sees_every_record() {
    let got = run(
        |env, out| {
            source(env, N, rec)
                .window_all(WindowAssigner::tumbling(Duration::from_millis(1000)))
                .aggregate_process(
                    SumCount,
                    |_: &u8, w: TimeWindow, r: (u64, u64), out: &mut Collector<Row>| {
                        out.collect((0, w.start, w.end, r.0, r.1))
                    },
                )
                .uid("window")
                .map(|r: Row| (r.1, r.3, r.4))
                .sink(out)
                .uid("sink");
        },
        3,
    );
    let records: Vec<Rec> = (0..N).map(|i| (0, rec(i).1, rec(i).2)).collect();
    let expected: Vec<(i64, u64, u64)> = aligned_reference(&records, 1000, 1000)
        .into_iter()
        .map(|r| (r.1, r.3, r.4))
        .collect();
    assert_eq!(got, expected);
}

/// Left record i: key i mod 7, time 5i ms; right record j: key j mod 7, time 3j ms.
fn left(i: u64) -> Rec {
    (i % KEYS, 5 * i as i64, i)
}

fn right(j: u64) -> Rec {
    (j % KEYS, 3 * j as i64, j)
}

fn two_sources(
    env: &StreamEnv,
    n: u64,
) -> (cairn::api::DataStream<Rec>, cairn::api::DataStream<Rec>) {
    let strategy = || WatermarkStrategy::monotonous(|r: &Rec| r.1);
    let l = env
        .source_with_watermarks(SequenceSource::new(n, 0, left), strategy())
        .uid("left");
    let r = env
        .source_with_watermarks(SequenceSource::new(n, 0, right), strategy())
        .uid("right");
    (l, r)
}

#[test]
fn interval_join_emits_every_pair_within_the_bounds_once() {
    let n = 5_000;
    for p in [1, 3] {
        let got = run(
            |env, out| {
                let (l, r) = two_sources(env, n);
                l.key_by(|r: &Rec| r.0)
                    .interval_join(
                        r.key_by(|r: &Rec| r.0),
                        -20,
                        35,
                        |a: &Rec, b: &Rec, out: &mut Collector<(u64, u64)>| out.collect((a.2, b.2)),
                    )
                    .uid("join")
                    .sink(out)
                    .uid("sink");
            },
            p,
        );
        let mut expected = Vec::new();
        for a in (0..n).map(left) {
            for b in (0..n).map(right) {
                if a.0 == b.0 && b.1 >= a.1 - 20 && b.1 <= a.1 + 35 {
                    expected.push((a.2, b.2));
                }
            }
        }
        expected.sort();
        assert!(!expected.is_empty());
        assert_eq!(got, expected, "parallelism {p}");
    }
}

#[test]
fn window_join_and_co_group_pair_the_records_of_each_window() {
    let n = 3_000;
    let got = run(
        |env, out| {
            let (l, r) = two_sources(env, n);
            l.key_by(|r: &Rec| r.0)
                .window_join(
                    r.key_by(|r: &Rec| r.0),
                    WindowAssigner::tumbling(Duration::from_millis(100)),
                    |a: &Rec, b: &Rec, out: &mut Collector<(u64, u64)>| out.collect((a.2, b.2)),
                )
                .uid("join")
                .sink(out)
                .uid("sink");
        },
        2,
    );
    let mut expected = Vec::new();
    for a in (0..n).map(left) {
        for b in (0..n).map(right) {
            if a.0 == b.0 && a.1.div_euclid(100) == b.1.div_euclid(100) {
                expected.push((a.2, b.2));
            }
        }
    }
    expected.sort();
    assert_eq!(got, expected);
    // Co-group: every key and window with records on either side, with both counts.
    let groups = run(
        |env, out| {
            let (l, r) = two_sources(env, n);
            l.key_by(|r: &Rec| r.0)
                .window_co_group(
                    r.key_by(|r: &Rec| r.0),
                    WindowAssigner::tumbling(Duration::from_millis(100)),
                    |k: &u64,
                     w: TimeWindow,
                     ls: &[Rec],
                     rs: &[Rec],
                     out: &mut Collector<(u64, i64, usize, usize)>| {
                        out.collect((*k, w.start, ls.len(), rs.len()))
                    },
                )
                .uid("co-group")
                .sink(out)
                .uid("sink");
        },
        2,
    );
    let mut counts: BTreeMap<(u64, i64), (usize, usize)> = BTreeMap::new();
    for a in (0..n).map(left) {
        counts
            .entry((a.0, a.1 - a.1.rem_euclid(100)))
            .or_default()
            .0 += 1;
    }
    for b in (0..n).map(right) {
        counts
            .entry((b.0, b.1 - b.1.rem_euclid(100)))
            .or_default()
            .1 += 1;
    }
    let expected: Vec<_> = counts
        .into_iter()
        .map(|((k, s), (l, r))| (k, s, l, r))
        .collect();
    assert_eq!(groups, expected);
}

#[test]
fn bad_window_and_join_bounds_are_refused_when_the_job_is_built() {
    let env = StreamEnv::new();
    source(&env, 10, rec)
        .key_by(|r: &Rec| r.0)
        .window(WindowAssigner::sliding(
            Duration::from_millis(10),
            Duration::from_millis(20),
        ))
        .reduce(|a: &Rec, _: &Rec| *a)
        .sink(Collect(Arc::new(Mutex::new(Vec::new()))));
    let e = env.build("bad").err().unwrap();
    assert!(
        e.contains("slide (20 ms) must not exceed its size (10 ms)"),
        "{e}"
    );
    let env = StreamEnv::new();
    let (l, r) = two_sources(&env, 10);
    l.key_by(|r: &Rec| r.0)
        .interval_join(
            r.key_by(|r: &Rec| r.0),
            10,
            5,
            |a: &Rec, _: &Rec, out: &mut Collector<u64>| out.collect(a.2),
        )
        .sink(Collect(Arc::new(Mutex::new(Vec::new()))));
    let e = env.build("bad").err().unwrap();
    assert!(
        e.contains("lower bound (10 ms) must not exceed its upper bound (5 ms)"),
        "{e}"
    );
}

/// One record per ms of event time; every 1000th record (from 2000 on) is stamped 600 ms early:
/// its window fired long before it arrives, but within the allowed lateness.
fn with_late_but_allowed(i: u64) -> Rec {
    let late = i >= 2_000 && i % 1_000 == 0;
    (i % KEYS, if late { i as i64 - 600 } else { i as i64 }, i)
}

#[test]
fn a_record_within_the_allowed_lateness_fires_its_window_again() {
    let got = run(
        |env, out| {
            env.source_with_watermarks(
                // Throttled, so watermarks go out while it runs.
                SequenceSource::new(10_000, 10_000, with_late_but_allowed),
                WatermarkStrategy::monotonous(|r: &Rec| r.1),
            )
            .uid("source")
            .key_by(|r: &Rec| r.0)
            .window(WindowAssigner::tumbling(Duration::from_millis(100)))
            .allowed_lateness(Duration::from_secs(5))
            .aggregate_process(SumCount, with_window)
            .uid("window")
            .sink(out)
            .uid("sink");
        },
        1,
    );
    let all: Vec<Rec> = (0..10_000).map(with_late_but_allowed).collect();
    let late: Vec<Rec> = all.iter().filter(|r| r.1 != r.2 as i64).copied().collect();
    let on_time: Vec<Rec> = all.iter().filter(|r| r.1 == r.2 as i64).copied().collect();
    // Every window fires on time; a window that gets a late record fires again with it.
    let mut expected = aligned_reference(&on_time, 100, 100);
    for l in &late {
        let start = l.1 - l.1.rem_euclid(100);
        let on = expected
            .iter()
            .find(|r| r.0 == l.0 && r.1 == start)
            .copied()
            .unwrap_or((l.0, start, start + 100, 0, 0));
        expected.push((l.0, start, start + 100, on.3 + l.2, on.4 + 1));
    }
    expected.sort();
    assert_eq!(got, expected);
}

/// A processing-time window's row: (key, window start, window end, records).
type Counted = (u64, i64, i64, u64);

/// Every record of `0..n` (made by `rec`) is in exactly one row, each row is a window of `size`
/// ms aligned to a multiple of it, and no key has a window twice.
fn counted_once(rows: &[Counted], n: u64, size: i64) {
    let mut per_key: BTreeMap<u64, u64> = BTreeMap::new();
    let mut windows = std::collections::BTreeSet::new();
    for &(k, start, end, count) in rows {
        assert_eq!(end - start, size, "{k}: [{start}, {end})");
        assert_eq!(start.rem_euclid(size), 0, "{k}: [{start}, {end})");
        assert!(
            windows.insert((k, start)),
            "key {k} has window {start} twice"
        );
        *per_key.entry(k).or_default() += count;
    }
    let mut expected: BTreeMap<u64, u64> = BTreeMap::new();
    for r in (0..n).map(rec) {
        *expected.entry(r.0).or_default() += 1;
    }
    assert_eq!(per_key, expected);
}

fn processing_time_counts(n: u64, rate: u64, size: Duration, parallelism: u32) -> Vec<Counted> {
    run(
        |env, out| {
            env.source(SequenceSource::new(n, rate, rec))
                .uid("source")
                .key_by(|r: &Rec| r.0)
                .window(WindowAssigner::tumbling(size).on_processing_time())
                .aggregate_process(
                    SumCount,
                    |k: &u64, w: TimeWindow, r: (u64, u64), out: &mut Collector<Counted>| {
                        out.collect((*k, w.start, w.end, r.1))
                    },
                )
                .uid("window")
                .sink(out)
                .uid("sink");
        },
        parallelism,
    )
}

#[test]
fn processing_time_windows_count_every_record_once_and_the_open_ones_fire_at_end_of_input() {
    // Windows of an hour: the wall clock closes none of them while the job runs (but when
    // the run straddles the hour: then a key may have two), so they fire when the input ends.
    let hour = processing_time_counts(20_000, 0, Duration::from_secs(3600), 2);
    assert!(hour.len() as u64 >= KEYS, "{hour:?}");
    counted_once(&hour, 20_000, 3_600_000);
    // Windows of 50 ms over a run throttled to half a second: the wall clock fires most of
    // them while records keep coming, end of input the last ones.
    let short = processing_time_counts(10_000, 20_000, Duration::from_millis(50), 3);
    assert!(
        short.len() as u64 > 2 * KEYS,
        "the wall clock fired no window: {short:?}"
    );
    counted_once(&short, 10_000, 50);
}

/// A timer's row: (key, records counted, whether it was a processing-time timer).
type Fired = (u64, u64, bool);
const PROCESSING: bool = true;

/// Counts each key's records and, at its first one, registers a processing-time timer an hour
/// ahead, which only the end of the input fires: it emits the count and registers an
/// event-time timer at the watermark (the maximum by then), which emits the count again.
#[derive(Clone, Default)]
struct CountUntilEndOfInput {
    count: Option<ValueState<u64>>,
}

impl KeyedProcessFunction<u64, Rec, Fired> for CountUntilEndOfInput {
    fn open(&mut self, ctx: &mut KeyedContext<u64>) -> TaskResult {
        self.count = Some(ctx.value_state("count")?);
        Ok(())
    }
    fn process(
        &mut self,
        _r: Rec,
        ctx: &mut KeyedContext<u64>,
        _out: &mut Collector<Fired>,
    ) -> TaskResult {
        let now = ctx.current_processing_time();
        let count = self.count.as_ref().unwrap().get_mut(ctx, || 0)?;
        *count += 1;
        if *count == 1 {
            ctx.register_processing_time_timer(now + 3_600_000)?;
        }
        Ok(())
    }
    fn on_timer(
        &mut self,
        _time: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<u64>,
        out: &mut Collector<Fired>,
    ) -> TaskResult {
        let key = *ctx.current_key().unwrap();
        let count = *self.count.as_ref().unwrap().value(ctx)?.unwrap();
        match domain {
            TimeDomain::ProcessingTime => {
                out.collect((key, count, PROCESSING));
                let watermark = ctx.current_watermark();
                ctx.register_event_time_timer(watermark)
            }
            TimeDomain::EventTime => {
                out.collect((key, count, !PROCESSING));
                Ok(())
            }
        }
    }
}

#[test]
fn processing_time_timers_of_a_bounded_job_fire_at_end_of_input() {
    let n = 5_000;
    let got = run(
        |env, out| {
            env.source(SequenceSource::new(n, 0, rec))
                .uid("source")
                .key_by(|r: &Rec| r.0)
                .process(CountUntilEndOfInput::default())
                .uid("count")
                .sink(out)
                .uid("sink");
        },
        2,
    );
    let mut expected = Vec::new();
    for k in 0..KEYS {
        let count = (0..n).filter(|i| i % KEYS == k).count() as u64;
        expected.push((k, count, !PROCESSING));
        expected.push((k, count, PROCESSING));
    }
    assert_eq!(got, expected);
}
