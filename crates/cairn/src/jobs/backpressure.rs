//! `backpressure`: makes backpressure on purpose, so that alignment under backpressure can be
//! seen and measured. A fast source and a slow source (a tenth of the records, throttled) are
//! connected by key into a two-input operator that counts per key across both inputs, into a
//! sink throttled to a fixed rate. The backlog fills every channel up to its credits, so an
//! aligned barrier waits behind it while an unaligned one overtakes it.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::api::{Collector, JobGraph, KeyedCoProcessFunction, StreamEnv};
use crate::connectors::{DiscardSink, Encoder, FileSink, SequenceSource, ThrottledSink};
use crate::error::TaskResult;
use crate::state::{KeyedContext, ValueState};

use super::wordcount::WordOutput;

/// One event: a key and its position in its source.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Event {
    /// Key.
    pub key: u64,
    /// Sequence number in its source.
    pub seq: u64,
}

/// Settings of the backpressure job.
#[derive(Debug, Clone)]
pub struct BackpressureArgs {
    /// Records of the fast source (the slow one has a tenth).
    pub records: u64,
    /// Distinct keys.
    pub keys: u64,
    /// Records per second the sink accepts.
    pub sink_rate: u64,
    /// Where the output goes.
    pub output: WordOutput,
}

#[derive(Clone, Default)]
struct CountBoth {
    count: Option<ValueState<u64>>,
}

impl CountBoth {
    fn add(
        &self,
        ctx: &mut KeyedContext<u64>,
        e: Event,
        out: &mut Collector<(u64, u64)>,
    ) -> TaskResult {
        if let Some(state) = &self.count {
            let n = state.get_mut(ctx, || 0)?;
            *n += 1;
            out.collect((e.key, *n));
        }
        Ok(())
    }
}

impl KeyedCoProcessFunction<u64, Event, Event, (u64, u64)> for CountBoth {
    fn open(&mut self, ctx: &mut KeyedContext<u64>) -> TaskResult {
        self.count = Some(ctx.value_state("count")?);
        Ok(())
    }
    fn process1(
        &mut self,
        e: Event,
        ctx: &mut KeyedContext<u64>,
        out: &mut Collector<(u64, u64)>,
    ) -> TaskResult {
        self.add(ctx, e, out)
    }
    fn process2(
        &mut self,
        e: Event,
        ctx: &mut KeyedContext<u64>,
        out: &mut Collector<(u64, u64)>,
    ) -> TaskResult {
        self.add(ctx, e, out)
    }
}

fn fast_event(i: u64) -> Event {
    Event {
        key: i.wrapping_mul(7919),
        seq: i,
    }
}

fn slow_event(i: u64) -> Event {
    Event {
        key: i.wrapping_mul(104_729),
        seq: i,
    }
}

fn encode(r: &(u64, u64), out: &mut Vec<u8>) {
    out.push(b'k');
    out.extend_from_slice(itoa::Buffer::new().format(r.0).as_bytes());
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(r.1).as_bytes());
    out.push(b'\n');
}

/// Builds the backpressure job graph.
pub fn build(args: &BackpressureArgs) -> Result<JobGraph, String> {
    let keys = args.keys.max(1);
    let env = StreamEnv::new();
    let fast = env
        .source(SequenceSource::new(args.records, 0, fast_event))
        .uid("fast-source")
        .name("fast-source")
        .map(move |e: Event| Event {
            key: e.key % keys,
            ..e
        })
        .uid("fast-key")
        .name("fast-key");
    let slow_rate = (args.sink_rate / 10).max(1);
    let slow = env
        .source(SequenceSource::new(
            args.records / 10,
            slow_rate,
            slow_event,
        ))
        .uid("slow-source")
        .name("slow-source")
        .map(move |e: Event| Event {
            key: e.key % keys,
            ..e
        })
        .uid("slow-key")
        .name("slow-key");
    let counts = fast
        .key_by(|e: &Event| e.key)
        .connect(slow.key_by(|e: &Event| e.key))
        .process(CountBoth::default())
        .uid("count-both")
        .name("count-both");
    let encoder: Encoder<(u64, u64)> = Arc::new(encode);
    let sink = match &args.output {
        WordOutput::Dir(dir) => counts.sink(ThrottledSink::new(
            FileSink::new(dir, encoder),
            args.sink_rate,
        )),
        WordOutput::Discard | WordOutput::Print => {
            counts.sink(ThrottledSink::new(DiscardSink, args.sink_rate))
        }
        WordOutput::Postgres { .. } => {
            return Err(
                "backpressure writes to files or discards: --pg-output is a flag of wordcount"
                    .into(),
            )
        }
        WordOutput::Kafka(_) => return Err("backpressure writes to --output DIR, not Kafka".into()),
    };
    sink.uid("sink").name("throttled-sink");
    env.build("backpressure")
}
