//! `cairn bench --suite kafka-source`: how fast wordcount reads a Kafka topic. A topic of
//! librdkafka's mock cluster (in this process, over loopback TCP) is filled first with one
//! word per record (`w` + (i * 7919) mod keys, so records/s is messages/s); then wordcount
//! runs embedded with `--kafka-input … --kafka-bounded --discard` at each parallelism, no
//! checkpoints, and its source records per second of job time are reported.

use anyhow::{anyhow, bail, Result};
use cairn::config::JobConfig;
use cairn::connectors::kafka::rdkafka::mocking::MockCluster;
use cairn::connectors::kafka::KafkaSourceConfig;
use cairn::jobs::wordcount::{self, WordInput, WordOutput};
use cairn::runtime::{run_job, RunOptions};

use super::BenchArgs;
use cairn_app::human;

const TOPIC: &str = "bench-lines";
/// Partitions of the topic: enough for every parallelism compared.
const PARTITIONS: i32 = 8;
/// Records when `--records` is not given (filling the mock cluster takes a while).
const DEFAULT_RECORDS: u64 = 2_000_000;

/// One parallelism's measurement.
#[derive(Debug, Clone)]
pub struct KafkaSourceRow {
    pub parallelism: u32,
    /// Records the sources read.
    pub records: u64,
    /// Job time (deployment to the end of the bounded input).
    pub seconds: f64,
}

impl KafkaSourceRow {
    pub fn records_per_second(&self) -> f64 {
        self.records as f64 / self.seconds.max(1e-9)
    }
}

/// Fills a mock-cluster topic with `records` one-word records over `keys` words, then runs
/// wordcount reading it to its end into `--discard` once per parallelism.
pub fn measure(records: u64, keys: u64, parallelisms: &[u32]) -> Result<Vec<KafkaSourceRow>> {
    let mock = MockCluster::new(1).map_err(|e| anyhow!("cannot start the mock cluster: {e}"))?;
    mock.create_topic(TOPIC, PARTITIONS, 1)
        .map_err(|e| anyhow!("cannot create the topic: {e}"))?;
    fill(&mock.bootstrap_servers(), records, keys)?;
    let mut rows = Vec::new();
    for &p in parallelisms {
        let mut source = KafkaSourceConfig::new(mock.bootstrap_servers(), vec![TOPIC.into()]);
        source.bounded = true;
        let graph = wordcount::build(&WordInput::Kafka(source), 0, &WordOutput::Discard)
            .map_err(|e| anyhow!(e))?;
        let opts = RunOptions {
            config: JobConfig {
                parallelism: p,
                ..JobConfig::default()
            },
            ..RunOptions::default()
        };
        let summary = run_job(&graph, opts).map_err(|e| anyhow!("wordcount at p={p}: {e}"))?;
        if summary.records != records {
            bail!(
                "wordcount at p={p} read {} records of {records}",
                summary.records
            );
        }
        rows.push(KafkaSourceRow {
            parallelism: p,
            records: summary.records,
            seconds: summary.elapsed.as_secs_f64(),
        });
    }
    Ok(rows)
}

/// Produces the records, round robin over the partitions.
fn fill(brokers: &str, records: u64, keys: u64) -> Result<()> {
    let words = (0..records).map(|i| {
        let word = format!("w{}", i.wrapping_mul(7919) % keys.max(1));
        ((i % PARTITIONS as u64) as i32, word)
    });
    cairn::connectors::kafka::produce(brokers, TOPIC, words).map_err(|e| anyhow!(e))
}

pub(super) fn run(args: &BenchArgs) -> Result<()> {
    let records = args.records.unwrap_or(DEFAULT_RECORDS);
    let keys = args.keys()?;
    if records == 0 {
        bail!("--records must be at least 1");
    }
    println!(
        "wordcount --kafka-input (librdkafka mock cluster in this process, {PARTITIONS} partitions, {records} one-word records over {keys} words) --kafka-bounded --discard, no checkpoints"
    );
    for row in measure(records, keys, &args.parallelism)? {
        println!(
            "p={}: {} records in {:.2}s, {} records/s",
            row.parallelism,
            row.records,
            row.seconds,
            human::count(row.records_per_second())
        );
    }
    Ok(())
}
