//! The DataStream API's operators, run for real by the embedded runtime at parallelism > 1.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use cairn::api::{Collector, KeyedCoProcessFunction, StreamEnv};
use cairn::config::JobConfig;
use cairn::connectors::SequenceSource;
use cairn::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkWriter};
use cairn::runtime::{run_job, RunOptions};
use cairn::state::{KeyedContext, ListState, MapState};
use cairn::TaskResult;

/// Collects every record into a shared vector (a test sink).
struct Collect<T>(Arc<Mutex<Vec<T>>>);

impl<T: Send + 'static> Sink<T> for Collect<T> {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::None
    }
    fn create_writer(&self, _ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(Collect(self.0.clone())))
    }
}

impl<T: Send> SinkWriter<T> for Collect<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        self.0.lock().unwrap().append(batch);
        Ok(())
    }
    fn pre_commit(&mut self, _: u64) -> TaskResult<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }
    fn commit(&mut self, _: u64) -> TaskResult {
        Ok(())
    }
    fn finish(&mut self) -> TaskResult {
        Ok(())
    }
}

fn config(parallelism: u32) -> JobConfig {
    let mut c = JobConfig::default();
    c.set("parallelism.default", &parallelism.to_string())
        .unwrap();
    c.set("execution.checkpointing.interval", "10ms").unwrap();
    c
}

fn run(env: &StreamEnv, parallelism: u32) {
    let graph = env.build("test").unwrap();
    run_job(
        &graph,
        RunOptions {
            config: config(parallelism),
            ..RunOptions::default()
        },
    )
    .unwrap();
}

#[test]
fn map_filter_flat_map_union_rebalance_and_sum() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let env = StreamEnv::new();
    let evens = env
        .source(SequenceSource::new(10_000, 0, |i| i))
        .uid("evens")
        .filter(|i: &u64| i % 2 == 0)
        .map(|i: u64| (i % 10, 1u64));
    let odds = env
        .source(SequenceSource::new(10_000, 0, |i| i))
        .uid("odds")
        .rebalance()
        .flat_map(|i: u64, out: &mut Collector<(u64, u64)>| {
            if i % 2 == 1 {
                out.collect((i % 10, 1));
                out.collect((i % 10, 1));
            }
        })
        .parallelism(3);
    evens
        .union(vec![odds])
        .key_by(|t: &(u64, u64)| t.0)
        .sum(|t: &mut (u64, u64)| &mut t.1)
        .uid("sum")
        .sink(Collect(out.clone()))
        .uid("sink");
    run(&env, 4);
    let mut last: BTreeMap<u64, u64> = BTreeMap::new();
    for (k, n) in out.lock().unwrap().iter() {
        let e = last.entry(*k).or_insert(0);
        *e = (*e).max(*n);
    }
    // 1000 even numbers per even digit; odd digits get every odd number twice.
    for k in 0..10u64 {
        let expected = if k % 2 == 0 { 1_000 } else { 2_000 };
        assert_eq!(last.get(&k), Some(&expected), "key {k}");
    }
    assert_eq!(out.lock().unwrap().len(), 5_000 + 10_000);
}

#[test]
fn broadcast_reaches_every_subtask() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let env = StreamEnv::new();
    env.source(SequenceSource::new(100, 0, |i| i))
        .uid("src")
        .parallelism(1)
        .broadcast()
        .map(|i: u64| i)
        .parallelism(3)
        .sink(Collect(out.clone()))
        .parallelism(3);
    run(&env, 3);
    assert_eq!(out.lock().unwrap().len(), 300);
}

/// Joins orders with prices by key, holding whichever arrives first in keyed state.
#[derive(Clone, Default)]
struct Join {
    prices: Option<MapState<u8, u64>>,
    waiting: Option<ListState<u64>>,
}

impl KeyedCoProcessFunction<u64, (u64, u64), (u64, u64), (u64, u64)> for Join {
    fn open(&mut self, ctx: &mut KeyedContext<u64>) -> TaskResult {
        self.prices = Some(ctx.map_state("price")?);
        self.waiting = Some(ctx.list_state("waiting")?);
        Ok(())
    }
    fn process1(
        &mut self,
        order: (u64, u64),
        ctx: &mut KeyedContext<u64>,
        out: &mut Collector<(u64, u64)>,
    ) -> TaskResult {
        let (Some(prices), Some(waiting)) = (&self.prices, &self.waiting) else {
            return Ok(());
        };
        match prices.get(ctx, &0)?.copied() {
            Some(p) => out.collect((order.0, order.1 * p)),
            None => waiting.add(ctx, order.1)?,
        }
        Ok(())
    }
    fn process2(
        &mut self,
        price: (u64, u64),
        ctx: &mut KeyedContext<u64>,
        out: &mut Collector<(u64, u64)>,
    ) -> TaskResult {
        let (Some(prices), Some(waiting)) = (&self.prices, &self.waiting) else {
            return Ok(());
        };
        prices.put(ctx, 0, price.1)?;
        for qty in waiting.get(ctx)?.to_vec() {
            out.collect((price.0, qty * price.1));
        }
        waiting.clear(ctx)?;
        Ok(())
    }
}

#[test]
fn keyed_connect_joins_two_streams_with_shared_state() {
    let out = Arc::new(Mutex::new(Vec::new()));
    let env = StreamEnv::new();
    let orders = env
        .source(SequenceSource::new(2_000, 0, |i| (i % 50, 1 + i % 3)))
        .uid("orders");
    let prices = env
        .source(SequenceSource::new(50, 0, |i| (i, 10 + i)))
        .uid("prices");
    orders
        .key_by(|o: &(u64, u64)| o.0)
        .connect(prices.key_by(|p: &(u64, u64)| p.0))
        .process(Join::default())
        .uid("join")
        .sink(Collect(out.clone()));
    run(&env, 2);
    let got = out.lock().unwrap();
    assert_eq!(got.len(), 2_000);
    let total: u64 = got.iter().map(|(_, v)| v).sum();
    let expected: u64 = (0..2_000u64).map(|i| (1 + i % 3) * (10 + i % 50)).sum();
    assert_eq!(total, expected);
}

#[test]
fn a_graph_names_its_sinks_that_print_to_stdout() {
    use cairn::connectors::{DiscardSink, PrintSink};
    let env = StreamEnv::new();
    let numbers = env.source(SequenceSource::new(10, 0, |i| i)).uid("numbers");
    numbers
        .clone()
        .sink(PrintSink::new(Arc::new(|n: &u64, out: &mut Vec<u8>| {
            out.extend_from_slice(format!("{n}\n").as_bytes())
        })))
        .uid("print");
    numbers.clone().sink(DiscardSink).uid("discard");
    numbers
        .sink(Collect(Arc::new(Mutex::new(Vec::new()))))
        .uid("collect");
    let graph = env.build("prints").unwrap();
    assert_eq!(graph.stdout_sinks(), vec!["print".to_string()]);

    let quiet = StreamEnv::new();
    quiet
        .source(SequenceSource::new(10, 0, |i| i))
        .uid("numbers")
        .sink(DiscardSink)
        .uid("discard");
    assert!(quiet.build("quiet").unwrap().stdout_sinks().is_empty());
}

/// A job whose subtasks all finished leaves no series in the process's metrics registry (a
/// finished source's watermark at i64::MAX would otherwise be scraped for minutes).
#[test]
fn a_finished_job_leaves_no_subtask_metrics_in_the_process() {
    use cairn::connectors::DiscardSink;
    let env = StreamEnv::new();
    env.source(SequenceSource::new(1000, 0, |i| i))
        .uid("numbers")
        .rebalance()
        .sink(DiscardSink)
        .uid("discard");
    let graph = env.build("finishing").unwrap();
    let summary = run_job(
        &graph,
        RunOptions {
            config: config(2),
            ..RunOptions::default()
        },
    )
    .unwrap();
    assert_eq!(summary.records, 1000);
    assert!(
        cairn::metrics::registry()
            .of_job(&summary.job_id)
            .is_empty(),
        "{:?}",
        cairn::metrics::registry().of_job(&summary.job_id)
    );
}

/// A worker's report is every subtask it holds: one it no longer reports (of a job it
/// forgot) is forgotten by the coordinator too; `forget_job` forgets a job's reports.
#[test]
fn reports_of_subtasks_a_worker_forgot_are_forgotten() {
    use cairn::metrics::{remote, snapshots_of_job, SubtaskSnapshot, NO_WATERMARK};
    let snapshot = |job: &str, subtask: u32| SubtaskSnapshot {
        job_id: job.to_string(),
        vertex_index: 0,
        subtask,
        running: true,
        records_in: 1,
        records_out: 1,
        bytes_in: 0,
        bytes_out: 0,
        idle_ms: 0,
        backpressured_ms: 0,
        busy_ms: 0,
        rates: [0.0; 5],
        queues: [0.0; 2],
        watermark: NO_WATERMARK,
        worker: None,
    };
    let (ended, running) = ("reports-ended", "reports-running");
    remote().report(
        (7, "127.0.0.1:1"),
        vec![snapshot(ended, 0), snapshot(running, 0)],
    );
    remote().report((8, "127.0.0.1:2"), vec![snapshot(ended, 1)]);
    assert_eq!(snapshots_of_job(ended).len(), 2);
    // Worker 7 forgot the ended job; worker 8's report of it stays until it does too.
    remote().report((7, "127.0.0.1:1"), vec![snapshot(running, 0)]);
    let left: Vec<u32> = snapshots_of_job(ended).iter().map(|s| s.subtask).collect();
    assert_eq!(left, vec![1]);
    assert_eq!(snapshots_of_job(running).len(), 1);
    cairn::metrics::forget_job(ended);
    assert!(snapshots_of_job(ended).is_empty());
    assert_eq!(snapshots_of_job(running).len(), 1);
}

/// Counts, per key, the records of both inputs (a join's state without its output).
#[derive(Clone, Default)]
struct CountBoth;

impl KeyedCoProcessFunction<u64, u64, u64, u64> for CountBoth {
    fn process1(
        &mut self,
        v: u64,
        _: &mut KeyedContext<u64>,
        out: &mut Collector<u64>,
    ) -> TaskResult {
        out.collect(v);
        Ok(())
    }
    fn process2(
        &mut self,
        v: u64,
        _: &mut KeyedContext<u64>,
        out: &mut Collector<u64>,
    ) -> TaskResult {
        out.collect(v);
        Ok(())
    }
}

/// One stream feeding both inputs of a two-input operator (a self-join's diamond).
#[test]
fn one_stream_into_both_inputs_of_a_keyed_connect_delivers_every_record_twice() {
    for round in 0..20 {
        let out = Arc::new(Mutex::new(Vec::new()));
        let env = StreamEnv::new();
        let numbers = env
            .source_with_watermarks(
                SequenceSource::new(200_000, 0, |i| i),
                cairn::api::WatermarkStrategy::bounded_out_of_orderness(
                    std::time::Duration::from_millis(4),
                    |n: &u64| *n as i64,
                ),
            )
            .uid("numbers");
        let evens = numbers.clone().filter(|n: &u64| n % 2 == 0).uid("evens");
        let all = numbers.map(|n: u64| n).uid("all");
        evens
            .key_by(|n: &u64| *n % 97)
            .connect(all.key_by(|n: &u64| *n % 97))
            .process(CountBoth)
            .uid("both")
            .sink(Collect(out.clone()));
        run(&env, 2);
        assert_eq!(out.lock().unwrap().len(), 300_000, "round {round}");
    }
}
