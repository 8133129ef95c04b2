//! The built-in jobs of the `cairn` binary, registered through the same public
//! [`cairn_app::Job`] interface as any application's: wordcount, backpressure, pipelines and
//! nexmark, each with its own typed parameters.

use std::io::Read;
use std::path::{Path, PathBuf};

use cairn::api::JobGraph;
use cairn::jobs::nexmark::{self, NexmarkArgs};
use cairn::jobs::wordcount::{self, WordInput, WordOutput};
use cairn::jobs::{backpressure, pipelines};
use cairn_app::{Job, JobContext};
use serde::{Deserialize, Serialize};

/// The default number of distinct generated words.
const DEFAULT_KEYS: u64 = 1000;

/// `--output DIR` or `--discard` (or neither: print).
fn word_output(output: &Option<PathBuf>, discard: bool) -> Result<WordOutput, String> {
    match (output, discard) {
        (Some(_), true) => Err("--output and --discard exclude each other".into()),
        (Some(dir), false) => Ok(WordOutput::Dir(dir.clone())),
        (None, true) => Ok(WordOutput::Discard),
        (None, false) => Ok(WordOutput::Print),
    }
}

/// `--keys K` (default 1000), which must be at least 1.
fn keys_of(keys: Option<u64>) -> Result<u64, String> {
    match keys.unwrap_or(DEFAULT_KEYS) {
        0 => Err("--keys must be at least 1".into()),
        k => Ok(k),
    }
}

fn count_lines(path: &Path) -> Result<u64, String> {
    let fail = |e: std::io::Error| format!("cannot read input file {}: {e}", path.display());
    let mut f = std::fs::File::open(path).map_err(fail)?;
    let mut buf = vec![0u8; 1 << 16];
    let mut lines = 0u64;
    loop {
        let n = f.read(&mut buf).map_err(fail)?;
        if n == 0 {
            return Ok(lines.max(1));
        }
        lines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
    }
}

/// wordcount's parameters.
#[derive(clap::Args, Serialize, Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct WordcountParams {
    /// Input text file (whitespace-separated words).
    #[arg(long, value_name = "FILE", conflicts_with = "generate")]
    pub input: Option<PathBuf>,
    /// Generate N words instead of reading a file: record i is `w` + ((i * 7919) mod K).
    #[arg(long, value_name = "N")]
    pub generate: Option<u64>,
    /// Number of distinct generated words (K) [default: 1000].
    #[arg(long, value_name = "K", requires = "generate")]
    pub keys: Option<u64>,
    /// Read at most N records per second (generated words, or lines of --input or
    /// --kafka-input; 0: as fast as possible) [default: 0].
    #[arg(long, value_name = "N")]
    pub rate: Option<u64>,
    /// Output directory for the exactly-once file sink (committed files never start with '.' or '_').
    #[arg(long, value_name = "DIR", conflicts_with = "discard")]
    pub output: Option<PathBuf>,
    /// Discard the output (benchmarks).
    #[arg(long)]
    pub discard: bool,
    /// Write the counts into PostgreSQL instead, e.g.
    /// postgres://cairn:cairn@127.0.0.1:55432/cairn (plain TCP, no TLS); needs --pg-table.
    #[arg(long, value_name = "URL", conflicts_with_all = ["output", "discard"], requires = "pg_table")]
    pub pg_output: Option<String>,
    /// The table --pg-output writes: TABLE or SCHEMA.TABLE, created if it does not exist.
    #[arg(long, value_name = "NAME", requires = "pg_output")]
    pub pg_table: Option<String>,
    /// How --pg-output writes exactly once: 2pc (prepared transactions committed with the
    /// checkpoint; one row per update), upsert (one row per word with its latest count,
    /// idempotent) or wal (rows kept in state until their checkpoint completes, then written
    /// with a commit record; one row per update) [default: 2pc].
    #[arg(long, value_name = "MODE", requires = "pg_output")]
    pub pg_mode: Option<String>,
    /// Kafka bootstrap brokers of --kafka-input and --kafka-output, HOST:PORT[,HOST:PORT...]
    /// (bootstrap.servers, plain TCP).
    #[arg(long, value_name = "HOST:PORT")]
    pub kafka_brokers: Option<String>,
    /// Read lines of words from this Kafka topic (the record values); its partitions'
    /// offsets are the source's state.
    #[arg(long, value_name = "TOPIC", requires = "kafka_brokers", conflicts_with_all = ["input", "generate"])]
    pub kafka_input: Option<String>,
    /// --kafka-input: read up to the end offsets the partitions had when the job started
    /// fresh, then finish (a restored run stops at the same offsets).
    #[arg(long, requires = "kafka_input")]
    pub kafka_bounded: bool,
    /// --kafka-input: where a fresh start begins: earliest, latest, committed (the group's
    /// offsets, else earliest), committed-or-latest, or timestamp:MILLIS (ms since the epoch).
    /// A restore always resumes at the checkpoint's offsets [default: earliest].
    #[arg(long, value_name = "POSITION", requires = "kafka_input")]
    pub kafka_start: Option<String>,
    /// --kafka-input: consumer group that completed checkpoints' offsets are committed to (for
    /// lag monitoring only) and that `--kafka-start committed` reads [default: cairn-wordcount].
    #[arg(long, value_name = "GROUP", requires = "kafka_input")]
    pub kafka_group: Option<String>,
    /// --kafka-input: how often to look for new partitions of the topic, e.g. 30s; 0 never
    /// [default: 5min].
    #[arg(long, value_name = "DURATION", requires = "kafka_input")]
    pub kafka_discovery_interval: Option<String>,
    /// Write every update to this Kafka topic, key the word, value WORD<TAB>COUNT.
    #[arg(long, value_name = "TOPIC", requires = "kafka_brokers", conflicts_with_all = ["output", "discard", "pg_output"])]
    pub kafka_output: Option<String>,
    /// --kafka-output's guarantee: none, at-least-once, or exactly-once (Kafka transactions
    /// committed with the checkpoints) [default: exactly-once].
    #[arg(long, value_name = "GUARANTEE", requires = "kafka_output")]
    pub kafka_guarantee: Option<String>,
    /// Prefix of --kafka-output's transactional ids (exactly-once) [default: cairn-<job id>-<sink uid>].
    #[arg(long, value_name = "PREFIX", requires = "kafka_output")]
    pub kafka_transactional_id_prefix: Option<String>,
    /// --kafka-output's transaction.timeout.ms (exactly-once), e.g. 15min: the broker aborts
    /// transactions open longer [default: 15min].
    #[arg(long, value_name = "DURATION", requires = "kafka_output")]
    pub kafka_transaction_timeout: Option<String>,
}

impl WordcountParams {
    fn input(&self) -> Result<WordInput, String> {
        if self.kafka_input.is_some() {
            if self.input.is_some() || self.generate.is_some() {
                return Err("--kafka-input excludes --input and --generate".into());
            }
            return kafka::input(self);
        }
        match (&self.input, self.generate) {
            (Some(_), Some(_)) => Err("--input and --generate exclude each other".into()),
            (Some(path), None) => {
                std::fs::metadata(path)
                    .map_err(|e| format!("cannot read input file {}: {e}", path.display()))?;
                Ok(WordInput::File(path.clone()))
            }
            (None, Some(count)) => Ok(WordInput::Generate {
                count,
                keys: keys_of(self.keys)?,
            }),
            (None, None) => {
                Err("wordcount needs --input FILE, --generate N or --kafka-input TOPIC".into())
            }
        }
    }

    fn output(&self) -> Result<WordOutput, String> {
        let files = word_output(&self.output, self.discard)?;
        let exclusive = [
            self.output.is_some() || self.discard,
            self.pg_output.is_some(),
            self.kafka_output.is_some(),
        ];
        if exclusive.iter().filter(|&&x| x).count() > 1 {
            return Err(
                "write to one place: --output, --discard, --pg-output or --kafka-output".into(),
            );
        }
        if self.pg_output.is_none() {
            // The flags refuse these alone; parameters given as JSON must not be ignored.
            if self.pg_table.is_some() {
                return Err("--pg-table needs --pg-output URL".into());
            }
            if self.pg_mode.is_some() {
                return Err("--pg-mode needs --pg-output URL".into());
            }
        }
        if let Some(url) = &self.pg_output {
            let mode = self.pg_mode.as_deref().unwrap_or("2pc");
            return Ok(WordOutput::Postgres {
                url: url.clone(),
                table: self.pg_table.clone().unwrap_or_default(),
                mode: mode.parse()?,
            });
        }
        if self.kafka_brokers.is_some() && self.kafka_input.is_none() && self.kafka_output.is_none()
        {
            return Err("--kafka-brokers needs --kafka-input TOPIC or --kafka-output TOPIC".into());
        }
        match &self.kafka_output {
            Some(_) => kafka::output(self),
            None => Ok(files),
        }
    }
}

/// Kafka input and output of wordcount.
mod kafka {
    use cairn::connectors::kafka::{KafkaSinkConfig, KafkaSourceConfig};
    use cairn::jobs::wordcount::{WordInput, WordOutput};

    use super::WordcountParams;

    /// `--kafka-input` and its flags.
    pub(super) fn input(p: &WordcountParams) -> Result<WordInput, String> {
        let topic = p.kafka_input.as_deref().unwrap_or_default();
        let brokers = p.kafka_brokers.clone().unwrap_or_default();
        if brokers.trim().is_empty() {
            return Err("--kafka-brokers needs HOST:PORT".into());
        }
        if topic.trim().is_empty() {
            return Err("--kafka-input needs a topic name".into());
        }
        let mut config = KafkaSourceConfig::new(brokers, vec![topic.to_string()]);
        if let Some(start) = &p.kafka_start {
            config.start = start
                .parse()
                .map_err(|e: String| format!("--kafka-start: {e}"))?;
        }
        let group = p.kafka_group.as_deref().unwrap_or("cairn-wordcount");
        if group.trim().is_empty() {
            return Err("--kafka-group must not be empty".into());
        }
        config.group_id = Some(group.to_string());
        if let Some(interval) = &p.kafka_discovery_interval {
            let d = cairn::config::parse_duration(interval)
                .map_err(|e| format!("--kafka-discovery-interval: {e}"))?;
            config.discovery_interval = (!d.is_zero()).then_some(d);
        }
        config.bounded = p.kafka_bounded;
        Ok(WordInput::Kafka(config))
    }

    /// `--kafka-output` and its flags.
    pub(super) fn output(p: &WordcountParams) -> Result<WordOutput, String> {
        let (Some(brokers), Some(topic)) = (&p.kafka_brokers, &p.kafka_output) else {
            return Err("--kafka-output needs --kafka-brokers HOST:PORT".into());
        };
        let mut config = KafkaSinkConfig::new(brokers, topic);
        if let Some(g) = &p.kafka_guarantee {
            config.guarantee = g
                .parse()
                .map_err(|e| format!("invalid value '{g}' for --kafka-guarantee: {e}"))?;
        }
        config.transactional_id_prefix = p.kafka_transactional_id_prefix.clone();
        if let Some(t) = &p.kafka_transaction_timeout {
            config.transaction_timeout = cairn::config::parse_duration(t)
                .map_err(|e| format!("invalid value '{t}' for --kafka-transaction-timeout: {e}"))?;
        }
        Ok(WordOutput::Kafka(config))
    }
}

/// `wordcount`: a running count per word, every update written as `WORD<TAB>COUNT`.
pub struct Wordcount;

impl Job for Wordcount {
    type Params = WordcountParams;

    fn name(&self) -> &str {
        "wordcount"
    }

    fn about(&self) -> &str {
        "Count words: a running count per word in keyed state, every update written as WORD<TAB>COUNT"
    }

    fn build(&self, p: &WordcountParams, _: &JobContext) -> Result<JobGraph, String> {
        let input = p.input()?;
        let output = p.output()?;
        wordcount::build(&input, p.rate.unwrap_or(0), &output)
    }

    fn source_records(&self, p: &WordcountParams, _: &JobContext) -> Result<Option<u64>, String> {
        Ok(match p.input()? {
            WordInput::Generate { count, .. } => Some(count),
            // Failures are planned within the smallest record count any task sees: the lines.
            WordInput::File(path) => Some(count_lines(&path)?),
            WordInput::Kafka(_) => None,
        })
    }

    fn paths(p: &mut WordcountParams) -> Vec<&mut PathBuf> {
        p.input.iter_mut().chain(p.output.as_mut()).collect()
    }
}

/// backpressure's parameters.
#[derive(clap::Args, Serialize, Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct BackpressureParams {
    /// Records of the fast source (the slow one sends a tenth as many).
    #[arg(long, value_name = "N")]
    pub generate: Option<u64>,
    /// Number of distinct keys [default: 1000].
    #[arg(long, value_name = "K")]
    pub keys: Option<u64>,
    /// Records per second the throttled sink accepts [default: 100000].
    #[arg(long, value_name = "N")]
    pub sink_rate: Option<u64>,
    /// Output directory for the exactly-once file sink.
    #[arg(long, value_name = "DIR", conflicts_with = "discard")]
    pub output: Option<PathBuf>,
    /// Discard the output.
    #[arg(long)]
    pub discard: bool,
}

/// `backpressure`: fast and slow sources into a keyed two-input operator and a throttled sink.
pub struct Backpressure;

impl Job for Backpressure {
    type Params = BackpressureParams;

    fn name(&self) -> &str {
        "backpressure"
    }

    fn about(&self) -> &str {
        "Fast and slow generated sources into a keyed two-input operator and a throttled sink"
    }

    fn build(&self, p: &BackpressureParams, _: &JobContext) -> Result<JobGraph, String> {
        let Some(records) = p.generate else {
            return Err("backpressure generates its input: use --generate N".into());
        };
        backpressure::build(&backpressure::BackpressureArgs {
            records,
            keys: keys_of(p.keys)?,
            sink_rate: p.sink_rate.unwrap_or(100_000),
            output: word_output(&p.output, p.discard)?,
        })
    }

    fn source_records(
        &self,
        p: &BackpressureParams,
        _: &JobContext,
    ) -> Result<Option<u64>, String> {
        Ok(p.generate.map(|count| count + count / 10))
    }

    fn paths(p: &mut BackpressureParams) -> Vec<&mut PathBuf> {
        p.output.iter_mut().collect()
    }
}

/// pipelines' parameters.
#[derive(clap::Args, Serialize, Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct PipelinesParams {
    /// Words each pipeline generates.
    #[arg(long, value_name = "N")]
    pub generate: Option<u64>,
    /// Number of distinct generated words [default: 1000].
    #[arg(long, value_name = "K")]
    pub keys: Option<u64>,
    /// Words per second in each pipeline (0: as fast as possible) [default: 0].
    #[arg(long, value_name = "N")]
    pub rate: Option<u64>,
    /// Output directory for the exactly-once file sink.
    #[arg(long, value_name = "DIR", conflicts_with = "discard")]
    pub output: Option<PathBuf>,
    /// Discard the output.
    #[arg(long)]
    pub discard: bool,
}

/// `pipelines`: two independent wordcounts (two pipelined regions).
pub struct Pipelines;

impl Job for Pipelines {
    type Params = PipelinesParams;

    fn name(&self) -> &str {
        "pipelines"
    }

    fn about(&self) -> &str {
        "Two independent wordcounts in one job: two pipelined regions"
    }

    fn build(&self, p: &PipelinesParams, _: &JobContext) -> Result<JobGraph, String> {
        let Some(count) = p.generate else {
            return Err("pipelines generates its input: use --generate N".into());
        };
        pipelines::build(
            count,
            keys_of(p.keys)?,
            p.rate.unwrap_or(0),
            &word_output(&p.output, p.discard)?,
        )
    }

    fn source_records(&self, p: &PipelinesParams, _: &JobContext) -> Result<Option<u64>, String> {
        Ok(p.generate.map(|count| count * 2))
    }

    fn paths(p: &mut PipelinesParams) -> Vec<&mut PathBuf> {
        p.output.iter_mut().collect()
    }
}

/// nexmark's parameters.
#[derive(clap::Args, Serialize, Deserialize, Debug, Clone, Default)]
#[serde(default, deny_unknown_fields)]
pub struct NexmarkParams {
    /// The query to run (q0, q1, q2, q3, q4, q5, q7, q8, q11, q12).
    #[arg(long, value_name = "QUERY")]
    pub query: Option<String>,
    /// Generate N events (persons, auctions and bids, 1:3:46).
    #[arg(long, value_name = "N")]
    pub events: Option<u64>,
    /// N events per second of event time (their timestamps are 1/N s apart; they are emitted
    /// as fast as possible) [default: 10000].
    #[arg(long, value_name = "N")]
    pub rate: Option<u64>,
    /// Output directory for the exactly-once file sink.
    #[arg(long, value_name = "DIR", conflicts_with = "discard")]
    pub output: Option<PathBuf>,
    /// Discard the output.
    #[arg(long)]
    pub discard: bool,
}

impl NexmarkParams {
    /// The generator's settings; the events' seed is the run's `--seed`.
    fn args(&self, ctx: &JobContext) -> Result<NexmarkArgs, String> {
        let Some(query) = &self.query else {
            return Err(format!(
                "nexmark needs --query QUERY; available queries: {}",
                nexmark::QUERIES.join(", ")
            ));
        };
        let Some(events) = self.events else {
            return Err("nexmark needs --events N".into());
        };
        if events == 0 {
            return Err("--events must be at least 1".into());
        }
        let rate = self.rate.unwrap_or(cairn::connectors::DEFAULT_RATE);
        if rate == 0 {
            return Err("--rate must be at least 1 event per second for nexmark".into());
        }
        Ok(NexmarkArgs {
            query: query.clone(),
            events,
            seed: ctx.seed,
            rate,
        })
    }
}

/// `nexmark`: the Nexmark benchmark's queries over generated persons, auctions and bids.
pub struct Nexmark;

impl Job for Nexmark {
    type Params = NexmarkParams;

    fn name(&self) -> &str {
        "nexmark"
    }

    fn about(&self) -> &str {
        "Nexmark queries over generated persons, auctions and bids (events seeded by --seed)"
    }

    fn build(&self, p: &NexmarkParams, ctx: &JobContext) -> Result<JobGraph, String> {
        nexmark::build(&p.args(ctx)?, &word_output(&p.output, p.discard)?)
    }

    fn source_records(&self, p: &NexmarkParams, ctx: &JobContext) -> Result<Option<u64>, String> {
        nexmark::source_records(&p.args(ctx)?).map(Some)
    }

    fn paths(p: &mut NexmarkParams) -> Vec<&mut PathBuf> {
        p.output.iter_mut().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nexmark(query: &str, events: u64) -> NexmarkParams {
        NexmarkParams {
            query: Some(query.into()),
            events: Some(events),
            discard: true,
            ..NexmarkParams::default()
        }
    }

    #[test]
    fn a_nexmark_job_plans_failures_among_its_source_records() {
        let ctx = JobContext { seed: 7 };
        // q3 reads the 20 persons and 60 auctions of 1000 events.
        assert_eq!(
            Nexmark.source_records(&nexmark("q3", 1000), &ctx),
            Ok(Some(80))
        );
        assert_eq!(
            Nexmark.source_records(&nexmark("q0", 1000), &ctx),
            Ok(Some(1000))
        );
        let graph = Nexmark
            .build(&nexmark("q3", 1000), &ctx)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(graph.name(), "nexmark-q3");
    }

    #[test]
    fn a_nexmark_job_with_bad_parameters_is_refused() {
        let ctx = JobContext::default();
        let refused = |p: NexmarkParams| Nexmark.build(&p, &ctx).err().unwrap_or_default();
        assert_eq!(
            refused(nexmark("q9", 5)),
            "nexmark query 'q9' is not available yet; available queries: q0, q1, q2, q3, q4, q5, q7, q8, q11, q12"
        );
        let no_events = NexmarkParams {
            query: Some("q1".into()),
            ..NexmarkParams::default()
        };
        assert_eq!(refused(no_events), "nexmark needs --events N");
    }

    #[test]
    fn wordcount_parameters_from_json_are_checked_like_flags() {
        let ctx = JobContext::default();
        let both: WordcountParams = serde_json::from_value(serde_json::json!({
            "input": "/x", "generate": 10
        }))
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Wordcount.build(&both, &ctx).err().as_deref(),
            Some("--input and --generate exclude each other")
        );
        let misspelt = serde_json::from_value::<WordcountParams>(serde_json::json!({
            "generat": 10
        }));
        assert!(misspelt.is_err());
        let table_alone: WordcountParams =
            serde_json::from_value(serde_json::json!({"generate": 10, "pg_table": "counts"}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Wordcount.build(&table_alone, &ctx).err().as_deref(),
            Some("--pg-table needs --pg-output URL")
        );
        let zero_keys: WordcountParams =
            serde_json::from_value(serde_json::json!({"generate": 10, "keys": 0}))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            Wordcount.build(&zero_keys, &ctx).err().as_deref(),
            Some("--keys must be at least 1")
        );
    }
}
