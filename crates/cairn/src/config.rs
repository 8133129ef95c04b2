//! Job configuration.
//!
//! A job is configured from a YAML file whose keys are Apache Flink's where the
//! meaning is the same (`execution.checkpointing.interval`, `state.backend.type`,
//! `restart-strategy.type`, ...), overlaid by command-line flags (`--set key=value`).
//!
//! The YAML may be flat (`execution.checkpointing.interval: 10s`), nested
//! (`execution: {checkpointing: {interval: 10s}}`) or a mixture of both; nested
//! mappings are flattened into dotted keys. Every scalar is converted to its string
//! form and parsed exactly like a command-line value, so both paths share one set of
//! validation rules. Unknown keys are rejected (with a "did you mean" hint for typos)
//! rather than silently ignored, because a misspelt checkpointing option would
//! otherwise quietly weaken the job's fault-tolerance guarantees.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_norway::Value;

/// The configuration keys understood by [`JobConfig`], as string constants so callers
/// (CLI, REST, tests) do not have to repeat the literals.
pub mod keys {
    /// `execution.checkpointing.interval`: time between checkpoint triggers; 0 disables checkpointing.
    pub const CHECKPOINT_INTERVAL: &str = "execution.checkpointing.interval";
    /// `execution.checkpointing.mode`: `EXACTLY_ONCE` or `AT_LEAST_ONCE`.
    pub const CHECKPOINTING_MODE: &str = "execution.checkpointing.mode";
    /// `execution.checkpointing.timeout`: a checkpoint not completed within this time is aborted.
    pub const CHECKPOINT_TIMEOUT: &str = "execution.checkpointing.timeout";
    /// `execution.checkpointing.min-pause`: minimum time between the end of one checkpoint and the start of the next.
    pub const MIN_PAUSE: &str = "execution.checkpointing.min-pause";
    /// `execution.checkpointing.max-concurrent-checkpoints`: how many checkpoints may be in flight at once.
    pub const MAX_CONCURRENT_CHECKPOINTS: &str =
        "execution.checkpointing.max-concurrent-checkpoints";
    /// `execution.checkpointing.tolerable-failed-checkpoints`: consecutive checkpoint failures tolerated before the job fails.
    pub const TOLERABLE_FAILED_CHECKPOINTS: &str =
        "execution.checkpointing.tolerable-failed-checkpoints";
    /// `execution.checkpointing.unaligned.enabled`: use unaligned checkpoints (barriers overtake in-flight data).
    pub const UNALIGNED_ENABLED: &str = "execution.checkpointing.unaligned.enabled";
    /// `execution.checkpointing.unaligned`: legacy alias of [`UNALIGNED_ENABLED`].
    pub const UNALIGNED_ALIAS: &str = "execution.checkpointing.unaligned";
    /// `execution.checkpointing.aligned-checkpoint-timeout`: switch an aligned checkpoint to unaligned after this time (0 = never).
    pub const ALIGNED_CHECKPOINT_TIMEOUT: &str =
        "execution.checkpointing.aligned-checkpoint-timeout";
    /// `state.backend.type`: `hashmap` or `rocksdb`.
    pub const STATE_BACKEND: &str = "state.backend.type";
    /// `state.checkpoints.dir`: where completed checkpoints are stored (local path, `file://`
    /// URI or `s3://bucket/prefix`).
    pub const CHECKPOINTS_DIR: &str = "state.checkpoints.dir";
    /// `s3.endpoint`: the S3 service of `s3://` checkpoint storage (default: AWS, or
    /// `AWS_ENDPOINT_URL`).
    pub const S3_ENDPOINT: &str = "s3.endpoint";
    /// `s3.region` (default `us-east-1`, or `AWS_REGION`).
    pub const S3_REGION: &str = "s3.region";
    /// `s3.access-key` (default `AWS_ACCESS_KEY_ID`).
    pub const S3_ACCESS_KEY: &str = "s3.access-key";
    /// `s3.secret-key` (default `AWS_SECRET_ACCESS_KEY`).
    pub const S3_SECRET_KEY: &str = "s3.secret-key";
    /// `s3.path.style.access`: address buckets by path (default: true with an endpoint).
    pub const S3_PATH_STYLE: &str = "s3.path.style.access";
    /// Default target directory of savepoints.
    pub const SAVEPOINTS_DIR: &str = "state.savepoints.dir";
    /// `state.checkpoints.num-retained`: how many completed checkpoints are kept.
    pub const NUM_RETAINED: &str = "state.checkpoints.num-retained";
    /// `state.backend.incremental`: write incremental checkpoints where the backend supports it.
    pub const INCREMENTAL: &str = "state.backend.incremental";
    /// `state.backend.heap.copy-on-write`: the heap backend's snapshots freeze the tables and
    /// copy entries as they change (true, the default) instead of copying every table in the
    /// synchronous part (false: for comparing the two).
    pub const HEAP_COPY_ON_WRITE: &str = "state.backend.heap.copy-on-write";
    /// `metrics.enabled`: count the subtasks' records, bytes, idle and back-pressured time for
    /// `/metrics` and the REST API (true, the default; false: for measuring what it costs).
    pub const METRICS_ENABLED: &str = "metrics.enabled";
    /// `state.backend.rocksdb.localdir`: where RocksDB instances keep their working files.
    pub const ROCKSDB_LOCAL_DIR: &str = "state.backend.rocksdb.localdir";
    /// `state.backend.rocksdb.memory.fixed-per-slot`: the memory budget of one subtask's
    /// RocksDB instance: block cache, write buffers and cached objects together.
    pub const ROCKSDB_MEMORY: &str = "state.backend.rocksdb.memory.fixed-per-slot";
    /// Restore although the checkpoint holds state of operators the job no longer has (that
    /// state is dropped); `--allow-non-restored-state`.
    pub const IGNORE_UNCLAIMED_STATE: &str = "execution.state-recovery.ignore-unclaimed-state";
    /// Who owns the snapshot a job is started from with `--from PATH`: `NO_CLAIM` (default: it
    /// is never modified or deleted, and the job's first checkpoint is a full one) or `CLAIM`
    /// (it becomes the job's first retained checkpoint and is deleted once subsumed).
    pub const CLAIM_MODE: &str = "execution.state-recovery.claim-mode";
    /// Whether cancelling a job keeps its retained checkpoints: `DELETE_ON_CANCELLATION`
    /// (default) or `RETAIN_ON_CANCELLATION`. A failed job always keeps them.
    pub const CHECKPOINT_RETENTION: &str =
        "execution.checkpointing.externalized-checkpoint-retention";
    /// `restart-strategy.type`: `none`/`off`/`disable`, `fixed-delay`, `failure-rate` or `exponential-delay`.
    pub const RESTART_STRATEGY: &str = "restart-strategy.type";
    /// `restart-strategy.fixed-delay.attempts`.
    pub const FIXED_DELAY_ATTEMPTS: &str = "restart-strategy.fixed-delay.attempts";
    /// `restart-strategy.fixed-delay.delay`.
    pub const FIXED_DELAY_DELAY: &str = "restart-strategy.fixed-delay.delay";
    /// `restart-strategy.failure-rate.max-failures-per-interval`.
    pub const FAILURE_RATE_MAX_FAILURES: &str =
        "restart-strategy.failure-rate.max-failures-per-interval";
    /// `restart-strategy.failure-rate.failure-rate-interval`.
    pub const FAILURE_RATE_INTERVAL: &str = "restart-strategy.failure-rate.failure-rate-interval";
    /// `restart-strategy.failure-rate.delay`.
    pub const FAILURE_RATE_DELAY: &str = "restart-strategy.failure-rate.delay";
    /// `restart-strategy.exponential-delay.initial-backoff`.
    pub const EXP_INITIAL_BACKOFF: &str = "restart-strategy.exponential-delay.initial-backoff";
    /// `restart-strategy.exponential-delay.max-backoff`.
    pub const EXP_MAX_BACKOFF: &str = "restart-strategy.exponential-delay.max-backoff";
    /// `restart-strategy.exponential-delay.backoff-multiplier`.
    pub const EXP_BACKOFF_MULTIPLIER: &str =
        "restart-strategy.exponential-delay.backoff-multiplier";
    /// `restart-strategy.exponential-delay.reset-backoff-threshold`.
    pub const EXP_RESET_BACKOFF_THRESHOLD: &str =
        "restart-strategy.exponential-delay.reset-backoff-threshold";
    /// `restart-strategy.exponential-delay.jitter-factor`.
    pub const EXP_JITTER_FACTOR: &str = "restart-strategy.exponential-delay.jitter-factor";
    /// `restart-strategy.exponential-delay.attempts-before-reset-backoff`.
    pub const EXP_ATTEMPTS_BEFORE_RESET: &str =
        "restart-strategy.exponential-delay.attempts-before-reset-backoff";
    /// `jobmanager.execution.failover-strategy`: `full` or `region`.
    pub const FAILOVER_STRATEGY: &str = "jobmanager.execution.failover-strategy";
    /// `parallelism.default`: parallelism of operators that do not set their own.
    pub const PARALLELISM: &str = "parallelism.default";
    /// `pipeline.max-parallelism`: upper bound for rescaling; the number of key groups.
    pub const MAX_PARALLELISM: &str = "pipeline.max-parallelism";
    /// `pipeline.auto-watermark-interval`: how often sources emit their watermark (0: only
    /// the final one, at the end of their input).
    pub const AUTO_WATERMARK_INTERVAL: &str = "pipeline.auto-watermark-interval";
}

/// Every configuration key accepted by [`JobConfig::set`] and the YAML loader, in the
/// order [`JobConfig::describe`] reports them.
pub const KNOWN_KEYS: &[&str] = &[
    keys::CHECKPOINT_INTERVAL,
    keys::CHECKPOINTING_MODE,
    keys::CHECKPOINT_TIMEOUT,
    keys::MIN_PAUSE,
    keys::MAX_CONCURRENT_CHECKPOINTS,
    keys::TOLERABLE_FAILED_CHECKPOINTS,
    keys::UNALIGNED_ENABLED,
    keys::UNALIGNED_ALIAS,
    keys::ALIGNED_CHECKPOINT_TIMEOUT,
    keys::STATE_BACKEND,
    keys::CHECKPOINTS_DIR,
    keys::S3_ENDPOINT,
    keys::S3_REGION,
    keys::S3_ACCESS_KEY,
    keys::S3_SECRET_KEY,
    keys::S3_PATH_STYLE,
    keys::SAVEPOINTS_DIR,
    keys::NUM_RETAINED,
    keys::INCREMENTAL,
    keys::HEAP_COPY_ON_WRITE,
    keys::METRICS_ENABLED,
    keys::ROCKSDB_LOCAL_DIR,
    keys::ROCKSDB_MEMORY,
    keys::IGNORE_UNCLAIMED_STATE,
    keys::CLAIM_MODE,
    keys::CHECKPOINT_RETENTION,
    keys::RESTART_STRATEGY,
    keys::FIXED_DELAY_ATTEMPTS,
    keys::FIXED_DELAY_DELAY,
    keys::FAILURE_RATE_MAX_FAILURES,
    keys::FAILURE_RATE_INTERVAL,
    keys::FAILURE_RATE_DELAY,
    keys::EXP_INITIAL_BACKOFF,
    keys::EXP_MAX_BACKOFF,
    keys::EXP_BACKOFF_MULTIPLIER,
    keys::EXP_RESET_BACKOFF_THRESHOLD,
    keys::EXP_JITTER_FACTOR,
    keys::EXP_ATTEMPTS_BEFORE_RESET,
    keys::FAILOVER_STRATEGY,
    keys::PARALLELISM,
    keys::MAX_PARALLELISM,
    keys::AUTO_WATERMARK_INTERVAL,
];

/// Largest accepted `pipeline.max-parallelism` (Flink's upper bound, 2^15).
pub const MAX_MAX_PARALLELISM: u32 = 32_768;

const EXPECT_DURATION: &str = "a duration such as 500ms, 10s or 1min";

/// Why a configuration could not be loaded or a key could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The configuration file could not be read.
    #[error("cannot read configuration file '{}': {source}", .path.display())]
    Io {
        /// The file that was being read.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid YAML; `message` is the parser's (with line and column).
    #[error("{}: {message}", yaml_origin(.path.as_deref()))]
    Yaml {
        /// The file being parsed, if the text came from a file.
        path: Option<PathBuf>,
        /// The YAML parser's message.
        message: String,
    },
    /// The YAML document's top level is not a mapping of keys to values.
    #[error("{} must be a mapping of configuration keys to values, found {found}", config_origin(.path.as_deref()))]
    NotAMapping {
        /// The file being parsed, if the text came from a file.
        path: Option<PathBuf>,
        /// What was found instead (e.g. "a sequence", "a string").
        found: String,
    },
    /// A key that is not in [`KNOWN_KEYS`]; Display adds a suggestion for near misses.
    #[error("unknown configuration key '{key}'{}", did_you_mean(.key))]
    UnknownKey {
        /// The key as given.
        key: String,
    },
    /// A known key with a value that cannot be parsed or is out of range.
    #[error("invalid value '{value}' for configuration key '{key}': expected {expected}")]
    InvalidValue {
        /// The key the value was given for.
        key: String,
        /// The value as given (null and sequences rendered in YAML-ish form).
        value: String,
        /// What an acceptable value looks like.
        expected: String,
    },
    /// A value that chooses what this build of cairn lacks (a Cargo feature of the `cairn`
    /// crate), such as `state.backend.type: rocksdb` without the `rocksdb` feature.
    #[error("{key}: {value} needs cairn built with the '{feature}' feature")]
    NeedsFeature {
        /// The key the value was given for.
        key: String,
        /// The value, as the error shows it.
        value: String,
        /// The Cargo feature it needs.
        feature: &'static str,
    },
    /// Individually valid settings that contradict each other (see [`JobConfig::validate`]).
    #[error("inconsistent configuration: {message}")]
    Inconsistent {
        /// What contradicts what.
        message: String,
    },
}

impl ConfigError {
    /// The configuration key the error is about, if it concerns a single key.
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::UnknownKey { key }
            | ConfigError::InvalidValue { key, .. }
            | ConfigError::NeedsFeature { key, .. } => Some(key),
            _ => None,
        }
    }
}

fn yaml_origin(path: Option<&Path>) -> String {
    match path {
        Some(p) => format!("invalid YAML in configuration file '{}'", p.display()),
        None => "invalid YAML configuration".to_string(),
    }
}

fn config_origin(path: Option<&Path>) -> String {
    match path {
        Some(p) => format!("configuration file '{}'", p.display()),
        None => "the configuration".to_string(),
    }
}

fn did_you_mean(key: &str) -> String {
    match suggest_key(key) {
        Some(k) => format!(" (did you mean '{k}'?)"),
        None => String::new(),
    }
}

/// The known key closest to `key` if it is within edit distance 2 (case-insensitive),
/// used to hint at typos in [`ConfigError::UnknownKey`].
pub fn suggest_key(key: &str) -> Option<&'static str> {
    let wanted: Vec<char> = key.trim().to_lowercase().chars().collect();
    let mut best: Option<(usize, &'static str)> = None;
    for &known in KNOWN_KEYS {
        let candidate: Vec<char> = known.chars().collect();
        let d = edit_distance(&wanted, &candidate);
        if d <= 2 && best.is_none_or(|(bd, _)| d < bd) {
            best = Some((d, known));
        }
    }
    best.map(|(_, k)| k)
}

/// Levenshtein distance between two char slices.
fn edit_distance(a: &[char], b: &[char]) -> usize {
    if a.len().abs_diff(b.len()) > 2 {
        // Cheap early exit: cannot be within the suggestion threshold.
        return a.len().abs_diff(b.len());
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    let mut cur = vec![0; b.len() + 1];
    for (i, ca) in a.iter().enumerate() {
        cur[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// Checkpointing guarantee (`execution.checkpointing.mode`): whether barriers are
/// aligned so that each record is reflected in state exactly once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CheckpointingMode {
    /// Aligned barriers: state reflects every record exactly once (Flink's default).
    #[default]
    ExactlyOnce,
    /// No alignment: lower latency, records may be reflected more than once after recovery.
    AtLeastOnce,
}

impl CheckpointingMode {
    /// Flink's spelling (`EXACTLY_ONCE` / `AT_LEAST_ONCE`).
    pub fn as_str(self) -> &'static str {
        match self {
            CheckpointingMode::ExactlyOnce => "EXACTLY_ONCE",
            CheckpointingMode::AtLeastOnce => "AT_LEAST_ONCE",
        }
    }
}

impl fmt::Display for CheckpointingMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for CheckpointingMode {
    type Err = String;
    /// Case-insensitive; `-` is accepted in place of `_`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_uppercase().replace('-', "_").as_str() {
            "EXACTLY_ONCE" => Ok(CheckpointingMode::ExactlyOnce),
            "AT_LEAST_ONCE" => Ok(CheckpointingMode::AtLeastOnce),
            _ => Err(format!("unknown checkpointing mode '{s}'")),
        }
    }
}

/// Where keyed state lives (`state.backend.type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StateBackendKind {
    /// In-memory hash maps, snapshotted in full (`hashmap`, the default).
    #[default]
    HashMap,
    /// An embedded LSM store, able to checkpoint incrementally (`rocksdb`).
    RocksDb,
}

impl StateBackendKind {
    /// Flink's spelling (`hashmap` / `rocksdb`).
    pub fn as_str(self) -> &'static str {
        match self {
            StateBackendKind::HashMap => "hashmap",
            StateBackendKind::RocksDb => "rocksdb",
        }
    }
}

impl fmt::Display for StateBackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for StateBackendKind {
    type Err = String;
    /// Case-insensitive `hashmap` or `rocksdb`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "hashmap" => Ok(StateBackendKind::HashMap),
            "rocksdb" => Ok(StateBackendKind::RocksDb),
            _ => Err(format!("unknown state backend '{s}'")),
        }
    }
}

/// Which tasks are restarted after a failure (`jobmanager.execution.failover-strategy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FailoverStrategy {
    /// Restart every task of the job.
    Full,
    /// Restart only the pipelined region containing the failed task (Flink's default).
    #[default]
    Region,
}

impl FailoverStrategy {
    /// Flink's spelling (`full` / `region`).
    pub fn as_str(self) -> &'static str {
        match self {
            FailoverStrategy::Full => "full",
            FailoverStrategy::Region => "region",
        }
    }
}

impl fmt::Display for FailoverStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for FailoverStrategy {
    type Err = String;
    /// Case-insensitive `full` or `region`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "full" => Ok(FailoverStrategy::Full),
            "region" => Ok(FailoverStrategy::Region),
            _ => Err(format!("unknown failover strategy '{s}'")),
        }
    }
}

/// How (and whether) a failed job is restarted (`restart-strategy.type` and its sub-keys).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum RestartStrategyConfig {
    /// Never restart: the first failure fails the job (`none`, `off`, `disable`).
    None,
    /// Restart up to `attempts` times, waiting `delay` before each restart.
    FixedDelay {
        /// `restart-strategy.fixed-delay.attempts` (default 1).
        attempts: u32,
        /// `restart-strategy.fixed-delay.delay` (default 1s).
        delay: Duration,
    },
    /// Restart as long as fewer than `max_failures_per_interval` failures happen within
    /// any `failure_rate_interval`, waiting `delay` before each restart.
    FailureRate {
        /// `restart-strategy.failure-rate.max-failures-per-interval` (default 1).
        max_failures_per_interval: u32,
        /// `restart-strategy.failure-rate.failure-rate-interval` (default 1min).
        failure_rate_interval: Duration,
        /// `restart-strategy.failure-rate.delay` (default 1s).
        delay: Duration,
    },
    /// Restart indefinitely with exponentially growing, jittered delays (Flink's default
    /// when checkpointing is enabled).
    ExponentialDelay {
        /// `restart-strategy.exponential-delay.initial-backoff` (default 1s).
        initial_backoff: Duration,
        /// `restart-strategy.exponential-delay.max-backoff` (default 1min).
        max_backoff: Duration,
        /// `restart-strategy.exponential-delay.backoff-multiplier` (default 1.5, >= 1.0).
        backoff_multiplier: f64,
        /// `restart-strategy.exponential-delay.reset-backoff-threshold` (default 1h): after
        /// this long without failure the backoff returns to the initial value.
        reset_backoff_threshold: Duration,
        /// `restart-strategy.exponential-delay.jitter-factor` (default 0.1, in 0..=1).
        jitter_factor: f64,
        /// `restart-strategy.exponential-delay.attempts-before-reset-backoff` (default u32::MAX).
        attempts_before_reset_backoff: u32,
    },
}

impl RestartStrategyConfig {
    /// Fixed-delay with Flink's defaults (1 attempt, 1s delay).
    pub fn fixed_delay_defaults() -> Self {
        RestartStrategyConfig::FixedDelay {
            attempts: 1,
            delay: Duration::from_secs(1),
        }
    }

    /// Failure-rate with Flink's defaults (1 failure per 1min, 1s delay).
    pub fn failure_rate_defaults() -> Self {
        RestartStrategyConfig::FailureRate {
            max_failures_per_interval: 1,
            failure_rate_interval: Duration::from_secs(60),
            delay: Duration::from_secs(1),
        }
    }

    /// Exponential-delay with Flink's defaults (1s..1min, x1.5, reset after 1h, jitter 0.1).
    pub fn exponential_delay_defaults() -> Self {
        RestartStrategyConfig::ExponentialDelay {
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            backoff_multiplier: 1.5,
            reset_backoff_threshold: Duration::from_secs(3600),
            jitter_factor: 0.1,
            attempts_before_reset_backoff: u32::MAX,
        }
    }

    /// The canonical `restart-strategy.type` value for this strategy.
    pub fn type_name(&self) -> &'static str {
        match self {
            RestartStrategyConfig::None => "none",
            RestartStrategyConfig::FixedDelay { .. } => "fixed-delay",
            RestartStrategyConfig::FailureRate { .. } => "failure-rate",
            RestartStrategyConfig::ExponentialDelay { .. } => "exponential-delay",
        }
    }

    /// Parses a `restart-strategy.type` value (case-insensitive) into the strategy with
    /// default parameters.
    fn from_type_name(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "none" | "off" | "disable" => Some(RestartStrategyConfig::None),
            "fixed-delay" | "fixeddelay" => Some(Self::fixed_delay_defaults()),
            "failure-rate" | "failurerate" => Some(Self::failure_rate_defaults()),
            "exponential-delay" | "exponentialdelay" => Some(Self::exponential_delay_defaults()),
            _ => None,
        }
    }
}

/// A parsed restart-strategy parameter value.
#[derive(Debug, Clone, Copy)]
enum Param {
    Count(u32),
    Time(Duration),
    Number(f64),
}

impl Param {
    fn render(self) -> String {
        match self {
            Param::Count(n) => n.to_string(),
            Param::Time(d) => format_duration(d),
            Param::Number(f) => f.to_string(),
        }
    }
}

/// A mutable reference to one restart-strategy parameter.
enum Slot<'a> {
    Count(&'a mut u32),
    Time(&'a mut Duration),
    Number(&'a mut f64),
}

impl RestartStrategyConfig {
    /// The field behind sub-key `key`, if the key belongs to this strategy's type.
    fn slot(&mut self, key: &str) -> Option<Slot<'_>> {
        use RestartStrategyConfig as R;
        Some(match self {
            R::None => return None,
            R::FixedDelay { attempts, delay } => match key {
                keys::FIXED_DELAY_ATTEMPTS => Slot::Count(attempts),
                keys::FIXED_DELAY_DELAY => Slot::Time(delay),
                _ => return None,
            },
            R::FailureRate {
                max_failures_per_interval,
                failure_rate_interval,
                delay,
            } => match key {
                keys::FAILURE_RATE_MAX_FAILURES => Slot::Count(max_failures_per_interval),
                keys::FAILURE_RATE_INTERVAL => Slot::Time(failure_rate_interval),
                keys::FAILURE_RATE_DELAY => Slot::Time(delay),
                _ => return None,
            },
            R::ExponentialDelay {
                initial_backoff,
                max_backoff,
                backoff_multiplier,
                reset_backoff_threshold,
                jitter_factor,
                attempts_before_reset_backoff,
            } => match key {
                keys::EXP_INITIAL_BACKOFF => Slot::Time(initial_backoff),
                keys::EXP_MAX_BACKOFF => Slot::Time(max_backoff),
                keys::EXP_BACKOFF_MULTIPLIER => Slot::Number(backoff_multiplier),
                keys::EXP_RESET_BACKOFF_THRESHOLD => Slot::Time(reset_backoff_threshold),
                keys::EXP_JITTER_FACTOR => Slot::Number(jitter_factor),
                keys::EXP_ATTEMPTS_BEFORE_RESET => Slot::Count(attempts_before_reset_backoff),
                _ => return None,
            },
        })
    }

    /// The value of sub-key `key` if it belongs to this strategy's type.
    fn param(&self, key: &str) -> Option<Param> {
        let mut copy = *self;
        Some(match copy.slot(key)? {
            Slot::Count(n) => Param::Count(*n),
            Slot::Time(t) => Param::Time(*t),
            Slot::Number(f) => Param::Number(*f),
        })
    }

    /// Sets sub-key `key` if it belongs to this strategy's type; returns whether it did.
    fn apply_param(&mut self, key: &str, param: Param) -> bool {
        match (self.slot(key), param) {
            (Some(Slot::Count(slot)), Param::Count(n)) => *slot = n,
            (Some(Slot::Time(slot)), Param::Time(t)) => *slot = t,
            (Some(Slot::Number(slot)), Param::Number(f)) => *slot = f,
            _ => return false,
        }
        true
    }
}

/// The configuration of one job: checkpointing, state, recovery and parallelism.
///
/// Built with [`JobConfig::from_file`] / [`JobConfig::from_yaml_str`] and then overlaid
/// with [`JobConfig::set`] (or [`JobConfig::set_all`]) for command-line flags.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobConfig {
    /// `execution.checkpointing.interval`; `None` = checkpointing disabled (a value of 0 disables).
    pub checkpoint_interval: Option<Duration>,
    /// `execution.checkpointing.mode` (default `EXACTLY_ONCE`).
    pub checkpointing_mode: CheckpointingMode,
    /// `execution.checkpointing.timeout` (default 10min, > 0).
    pub checkpoint_timeout: Duration,
    /// `execution.checkpointing.min-pause` (default 0).
    pub min_pause: Duration,
    /// `execution.checkpointing.max-concurrent-checkpoints` (default 1, >= 1).
    pub max_concurrent_checkpoints: u32,
    /// `execution.checkpointing.tolerable-failed-checkpoints` (default 0).
    pub tolerable_failed_checkpoints: u32,
    /// `execution.checkpointing.unaligned.enabled` (alias `execution.checkpointing.unaligned`, default false).
    pub unaligned_enabled: bool,
    /// `execution.checkpointing.aligned-checkpoint-timeout` (default 0 = never switch to unaligned).
    pub aligned_checkpoint_timeout: Duration,
    /// `state.backend.type` (default `hashmap`).
    pub state_backend: StateBackendKind,
    /// `state.checkpoints.dir` when it is a local directory (plain path or `file://` URI;
    /// default unset).
    pub checkpoints_dir: Option<PathBuf>,
    /// `state.checkpoints.dir` when it is an S3 location (`s3://bucket/prefix`); then
    /// `checkpoints_dir` is unset.
    #[serde(default)]
    pub checkpoints_s3: Option<crate::storage::S3Url>,
    /// `s3.*`: how to reach the S3 service.
    #[serde(default)]
    pub s3: crate::storage::S3Settings,
    /// `state.savepoints.dir`: where savepoints go when a request names no directory.
    pub savepoints_dir: Option<PathBuf>,
    /// `state.checkpoints.num-retained` (default 1, >= 1).
    pub num_retained: u32,
    /// `state.backend.incremental` (default false).
    pub incremental: bool,
    /// `state.backend.heap.copy-on-write` (default true).
    pub heap_copy_on_write: bool,
    /// `metrics.enabled` (default true).
    pub metrics_enabled: bool,
    /// `state.backend.rocksdb.localdir` (default: `cairn-rocksdb` in the temporary directory).
    pub rocksdb_local_dir: Option<PathBuf>,
    /// `state.backend.rocksdb.memory.fixed-per-slot` in bytes (default 128 MiB, at least 8 MiB).
    pub rocksdb_memory: u64,
    /// `execution.state-recovery.ignore-unclaimed-state` (default false).
    pub ignore_unclaimed_state: bool,
    /// `execution.state-recovery.claim-mode: CLAIM` (default false: `NO_CLAIM`).
    pub claim_restored: bool,
    /// `execution.checkpointing.externalized-checkpoint-retention: RETAIN_ON_CANCELLATION`
    /// (default false: a cancelled job's checkpoints are deleted).
    pub retain_on_cancellation: bool,
    /// `restart-strategy.type` and sub-keys; `None` = not configured (see
    /// [`JobConfig::effective_restart_strategy`]).
    pub restart_strategy: Option<RestartStrategyConfig>,
    /// `jobmanager.execution.failover-strategy` (default `region`).
    pub failover_strategy: FailoverStrategy,
    /// `parallelism.default` (default 1, >= 1).
    pub parallelism: u32,
    /// `pipeline.max-parallelism` (default 128, in 1..=32768).
    pub max_parallelism: u32,
    /// `pipeline.auto-watermark-interval` (default 200ms; zero: no periodic watermarks).
    pub auto_watermark_interval: Duration,
}

impl Default for JobConfig {
    fn default() -> Self {
        JobConfig {
            checkpoint_interval: None,
            checkpointing_mode: CheckpointingMode::ExactlyOnce,
            checkpoint_timeout: Duration::from_secs(600),
            min_pause: Duration::ZERO,
            max_concurrent_checkpoints: 1,
            tolerable_failed_checkpoints: 0,
            unaligned_enabled: false,
            aligned_checkpoint_timeout: Duration::ZERO,
            state_backend: StateBackendKind::HashMap,
            checkpoints_dir: None,
            checkpoints_s3: None,
            s3: crate::storage::S3Settings::default(),
            savepoints_dir: None,
            num_retained: 1,
            incremental: false,
            heap_copy_on_write: true,
            metrics_enabled: true,
            rocksdb_local_dir: None,
            rocksdb_memory: crate::state::rocks::DEFAULT_MEMORY_BYTES,
            ignore_unclaimed_state: false,
            claim_restored: false,
            retain_on_cancellation: false,
            restart_strategy: None,
            failover_strategy: FailoverStrategy::Region,
            parallelism: 1,
            max_parallelism: 128,
            auto_watermark_interval: Duration::from_millis(200),
        }
    }
}

/// A flattened YAML entry: either a scalar rendered as a string, or something that can
/// never be a valid value (null, sequence, tagged value, empty mapping).
enum Leaf {
    Scalar(String),
    NotScalar(String),
}

impl JobConfig {
    /// Parses a YAML configuration: starts from the defaults and applies every key.
    ///
    /// Empty text (or only comments) is a valid empty configuration.
    pub fn from_yaml_str(text: &str) -> Result<JobConfig, ConfigError> {
        Self::from_yaml_impl(text, None)
    }

    /// Reads and parses a YAML configuration file; read and syntax errors name the file.
    pub fn from_file(path: &Path) -> Result<JobConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml_impl(&text, Some(path))
    }

    fn from_yaml_impl(text: &str, path: Option<&Path>) -> Result<JobConfig, ConfigError> {
        let doc: Value = serde_norway::from_str(text).map_err(|e| ConfigError::Yaml {
            path: path.map(Path::to_path_buf),
            message: e.to_string(),
        })?;
        let mut entries = Vec::new();
        match &doc {
            Value::Null => {}
            Value::Mapping(_) => flatten(None, &doc, &mut entries)?,
            other => {
                return Err(ConfigError::NotAMapping {
                    path: path.map(Path::to_path_buf),
                    found: value_kind(other).to_string(),
                })
            }
        }
        let mut config = JobConfig::default();
        // Unknown keys and non-scalar values are reported before anything is applied.
        let mut pairs = Vec::with_capacity(entries.len());
        for (key, leaf) in entries {
            if !KNOWN_KEYS.contains(&key.as_str()) {
                return Err(ConfigError::UnknownKey { key });
            }
            match leaf {
                Leaf::Scalar(v) => pairs.push((key, v)),
                Leaf::NotScalar(rendered) => {
                    let expected = expected_for(&key).to_string();
                    return Err(ConfigError::InvalidValue {
                        key,
                        value: rendered,
                        expected,
                    });
                }
            }
        }
        config.set_all(pairs)?;
        Ok(config)
    }

    /// Applies several key/value pairs (e.g. all `--set` flags) in order, except that
    /// `restart-strategy.type` is applied first so that restart sub-keys given in the
    /// same batch take effect regardless of their position.
    pub fn set_all<I, K, V>(&mut self, pairs: I) -> Result<(), ConfigError>
    where
        I: IntoIterator<Item = (K, V)>,
        K: AsRef<str>,
        V: AsRef<str>,
    {
        let mut types = Vec::new();
        let mut rest = Vec::new();
        for (k, v) in pairs {
            if k.as_ref().trim() == keys::RESTART_STRATEGY {
                types.push((k, v));
            } else {
                rest.push((k, v));
            }
        }
        for (k, v) in types.into_iter().chain(rest) {
            self.set(k.as_ref(), v.as_ref())?;
        }
        Ok(())
    }

    /// Applies one key given as a string (a command-line overlay), with the same
    /// validation as the YAML loader.
    ///
    /// Setting `restart-strategy.type` to the type already configured keeps its
    /// parameters; setting a different type starts from that type's defaults. A restart
    /// sub-key is validated, then applied only if the configured strategy is of its type
    /// (otherwise it is ignored), so set the type first — [`JobConfig::set_all`] does.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        let key = key.trim();
        let p = ValueParser { key, raw: value };
        match key {
            keys::CHECKPOINT_INTERVAL => {
                let d = p.duration()?;
                self.checkpoint_interval = if d.is_zero() { None } else { Some(d) };
            }
            keys::CHECKPOINTING_MODE => {
                self.checkpointing_mode = p.parse_enum("EXACTLY_ONCE or AT_LEAST_ONCE")?;
            }
            keys::CHECKPOINT_TIMEOUT => self.checkpoint_timeout = p.positive_duration()?,
            keys::MIN_PAUSE => self.min_pause = p.duration()?,
            keys::MAX_CONCURRENT_CHECKPOINTS => self.max_concurrent_checkpoints = p.u32_min(1)?,
            keys::TOLERABLE_FAILED_CHECKPOINTS => {
                self.tolerable_failed_checkpoints = p.u32_min(0)?
            }
            keys::UNALIGNED_ENABLED | keys::UNALIGNED_ALIAS => self.unaligned_enabled = p.bool()?,
            keys::ALIGNED_CHECKPOINT_TIMEOUT => self.aligned_checkpoint_timeout = p.duration()?,
            keys::STATE_BACKEND => {
                let kind: StateBackendKind = p.parse_enum("hashmap or rocksdb")?;
                if kind == StateBackendKind::RocksDb {
                    needs_feature(key, kind.as_str(), "rocksdb", cfg!(feature = "rocksdb"))?;
                }
                self.state_backend = kind;
            }
            keys::CHECKPOINTS_DIR => match p.s3_url()? {
                Some(url) => {
                    needs_feature(key, &url.to_string(), "s3", cfg!(feature = "s3"))?;
                    self.checkpoints_s3 = Some(url);
                    self.checkpoints_dir = None;
                }
                None => {
                    self.checkpoints_dir = Some(p.checkpoint_dir()?);
                    self.checkpoints_s3 = None;
                }
            },
            keys::S3_ENDPOINT => self.s3.endpoint = Some(p.non_empty()?),
            keys::S3_REGION => self.s3.region = Some(p.non_empty()?),
            keys::S3_ACCESS_KEY => self.s3.access_key = Some(p.non_empty()?),
            keys::S3_SECRET_KEY => self.s3.secret_key = Some(p.non_empty()?),
            keys::S3_PATH_STYLE => self.s3.path_style = Some(p.bool()?),
            keys::SAVEPOINTS_DIR => self.savepoints_dir = Some(p.checkpoint_dir()?),
            keys::NUM_RETAINED => self.num_retained = p.u32_min(1)?,
            keys::INCREMENTAL => self.incremental = p.bool()?,
            keys::HEAP_COPY_ON_WRITE => self.heap_copy_on_write = p.bool()?,
            keys::METRICS_ENABLED => self.metrics_enabled = p.bool()?,
            keys::ROCKSDB_LOCAL_DIR => self.rocksdb_local_dir = Some(p.checkpoint_dir()?),
            keys::ROCKSDB_MEMORY => self.rocksdb_memory = p.memory_size(8 << 20)?,
            keys::IGNORE_UNCLAIMED_STATE => self.ignore_unclaimed_state = p.bool()?,
            keys::CLAIM_MODE => {
                self.claim_restored = match value.trim().to_ascii_uppercase().as_str() {
                    "CLAIM" => true,
                    "NO_CLAIM" => false,
                    _ => return Err(p.invalid(expected_for(key))),
                }
            }
            keys::CHECKPOINT_RETENTION => {
                self.retain_on_cancellation = match value.trim().to_ascii_uppercase().as_str() {
                    "RETAIN_ON_CANCELLATION" => true,
                    "DELETE_ON_CANCELLATION" => false,
                    _ => return Err(p.invalid(expected_for(key))),
                }
            }
            keys::RESTART_STRATEGY => {
                let chosen = RestartStrategyConfig::from_type_name(value)
                    .ok_or_else(|| p.invalid(expected_for(key)))?;
                let same_type = self
                    .restart_strategy
                    .is_some_and(|cur| cur.type_name() == chosen.type_name());
                if !same_type {
                    self.restart_strategy = Some(chosen);
                }
            }
            keys::FAILOVER_STRATEGY => self.failover_strategy = p.parse_enum("full or region")?,
            keys::PARALLELISM => self.parallelism = p.u32_min(1)?,
            keys::MAX_PARALLELISM => {
                let n = p.u32_min(1)?;
                if n > MAX_MAX_PARALLELISM {
                    return Err(p.invalid(expected_for(key)));
                }
                self.max_parallelism = n;
            }
            keys::AUTO_WATERMARK_INTERVAL => self.auto_watermark_interval = p.duration()?,
            _ => return self.set_restart_sub_key(key, &p),
        }
        Ok(())
    }

    fn set_restart_sub_key(&mut self, key: &str, p: &ValueParser<'_>) -> Result<(), ConfigError> {
        // Validate first: sub-keys are checked whatever restart strategy is configured.
        let param = match key {
            keys::FIXED_DELAY_ATTEMPTS => Param::Count(p.u32_min(0)?),
            keys::FAILURE_RATE_MAX_FAILURES | keys::EXP_ATTEMPTS_BEFORE_RESET => {
                Param::Count(p.u32_min(1)?)
            }
            keys::FIXED_DELAY_DELAY | keys::FAILURE_RATE_DELAY => Param::Time(p.duration()?),
            keys::FAILURE_RATE_INTERVAL
            | keys::EXP_INITIAL_BACKOFF
            | keys::EXP_MAX_BACKOFF
            | keys::EXP_RESET_BACKOFF_THRESHOLD => Param::Time(p.positive_duration()?),
            keys::EXP_BACKOFF_MULTIPLIER => Param::Number(p.multiplier()?),
            keys::EXP_JITTER_FACTOR => Param::Number(p.jitter()?),
            _ => {
                return Err(ConfigError::UnknownKey {
                    key: key.to_string(),
                })
            }
        };
        let applied = self
            .restart_strategy
            .as_mut()
            .is_some_and(|r| r.apply_param(key, param));
        if !applied {
            tracing::debug!(
                key,
                configured = self.restart_strategy.map(|r| r.type_name()),
                "restart strategy option ignored: it does not belong to the configured restart-strategy.type"
            );
        }
        Ok(())
    }

    /// The restart strategy that applies: the configured one, else Flink's cluster
    /// default — exponential-delay with default parameters when checkpointing is
    /// enabled, no restarts when it is disabled.
    pub fn effective_restart_strategy(&self) -> RestartStrategyConfig {
        match (self.restart_strategy, self.checkpoint_interval) {
            (Some(configured), _) => configured,
            (None, Some(_)) => RestartStrategyConfig::exponential_delay_defaults(),
            (None, None) => RestartStrategyConfig::None,
        }
    }

    /// Whether periodic checkpoints are taken (`execution.checkpointing.interval` > 0).
    pub fn checkpointing_enabled(&self) -> bool {
        self.checkpoint_interval.is_some()
    }

    /// Cross-key consistency checks that cannot be done key by key (because overlays may
    /// fix them later): call once after all overlays are applied.
    ///
    /// Checks `parallelism.default <= pipeline.max-parallelism` and, for exponential-delay,
    /// `initial-backoff <= max-backoff`; and, as [`JobConfig::set`] does, that the state backend
    /// and the checkpoint storage are in this build (the `rocksdb` and `s3` features).
    pub fn validate(&self) -> Result<(), ConfigError> {
        // What `set` refuses, in a configuration built in code.
        if self.state_backend == StateBackendKind::RocksDb {
            needs_feature(
                keys::STATE_BACKEND,
                self.state_backend.as_str(),
                "rocksdb",
                cfg!(feature = "rocksdb"),
            )?;
        }
        if let Some(url) = &self.checkpoints_s3 {
            needs_feature(
                keys::CHECKPOINTS_DIR,
                &url.to_string(),
                "s3",
                cfg!(feature = "s3"),
            )?;
        }
        if self.parallelism > self.max_parallelism {
            return Err(ConfigError::Inconsistent {
                message: format!(
                    "{} ({}) is larger than {} ({})",
                    keys::PARALLELISM,
                    self.parallelism,
                    keys::MAX_PARALLELISM,
                    self.max_parallelism
                ),
            });
        }
        if let Some(RestartStrategyConfig::ExponentialDelay {
            initial_backoff,
            max_backoff,
            ..
        }) = self.restart_strategy
        {
            if initial_backoff > max_backoff {
                return Err(ConfigError::Inconsistent {
                    message: format!(
                        "{} ({}) is larger than {} ({})",
                        keys::EXP_INITIAL_BACKOFF,
                        format_duration(initial_backoff),
                        keys::EXP_MAX_BACKOFF,
                        format_duration(max_backoff)
                    ),
                });
            }
        }
        Ok(())
    }

    /// Every key of [`KNOWN_KEYS`] with its effective value rendered as a string, for
    /// logging and the REST API.
    ///
    /// Durations use [`format_duration`]; a disabled checkpoint interval is `0ms`; an unset
    /// checkpoint directory is `(not set)`; `restart-strategy.type` and its sub-keys show
    /// [`JobConfig::effective_restart_strategy`] — sub-keys of other strategy types show
    /// their defaults (they would apply if that type were chosen).
    pub fn describe(&self) -> Vec<(String, String)> {
        use RestartStrategyConfig as R;
        let not_set = || "(not set)".to_string();
        let restart = self.effective_restart_strategy();
        // Sub-keys of other strategy types show the defaults they would get.
        let others = [
            R::fixed_delay_defaults(),
            R::failure_rate_defaults(),
            R::exponential_delay_defaults(),
        ];
        let d = format_duration;
        KNOWN_KEYS
            .iter()
            .map(|&key| {
                let value = match key {
                    keys::CHECKPOINT_INTERVAL => d(self.checkpoint_interval.unwrap_or_default()),
                    keys::CHECKPOINTING_MODE => self.checkpointing_mode.to_string(),
                    keys::CHECKPOINT_TIMEOUT => d(self.checkpoint_timeout),
                    keys::MIN_PAUSE => d(self.min_pause),
                    keys::MAX_CONCURRENT_CHECKPOINTS => self.max_concurrent_checkpoints.to_string(),
                    keys::TOLERABLE_FAILED_CHECKPOINTS => {
                        self.tolerable_failed_checkpoints.to_string()
                    }
                    keys::UNALIGNED_ENABLED | keys::UNALIGNED_ALIAS => {
                        self.unaligned_enabled.to_string()
                    }
                    keys::ALIGNED_CHECKPOINT_TIMEOUT => d(self.aligned_checkpoint_timeout),
                    keys::STATE_BACKEND => self.state_backend.to_string(),
                    keys::CHECKPOINTS_DIR => match (&self.checkpoints_dir, &self.checkpoints_s3) {
                        (Some(p), _) => p.display().to_string(),
                        (None, Some(url)) => url.to_string(),
                        (None, None) => "(not set)".to_string(),
                    },
                    keys::S3_ENDPOINT => self.s3.endpoint.clone().unwrap_or_else(not_set),
                    keys::S3_REGION => self.s3.region.clone().unwrap_or_else(not_set),
                    keys::S3_ACCESS_KEY => self.s3.access_key.clone().unwrap_or_else(not_set),
                    // Never shown.
                    keys::S3_SECRET_KEY => match self.s3.secret_key {
                        Some(_) => "(set)".to_string(),
                        None => not_set(),
                    },
                    keys::S3_PATH_STYLE => match self.s3.path_style {
                        Some(b) => b.to_string(),
                        None => not_set(),
                    },
                    keys::SAVEPOINTS_DIR => match &self.savepoints_dir {
                        Some(p) => p.display().to_string(),
                        None => "(not set)".to_string(),
                    },
                    keys::NUM_RETAINED => self.num_retained.to_string(),
                    keys::INCREMENTAL => self.incremental.to_string(),
                    keys::HEAP_COPY_ON_WRITE => self.heap_copy_on_write.to_string(),
                    keys::METRICS_ENABLED => self.metrics_enabled.to_string(),
                    keys::ROCKSDB_LOCAL_DIR => match &self.rocksdb_local_dir {
                        Some(p) => p.display().to_string(),
                        None => "(not set)".to_string(),
                    },
                    keys::ROCKSDB_MEMORY => format!("{}mb", self.rocksdb_memory >> 20),
                    keys::IGNORE_UNCLAIMED_STATE => self.ignore_unclaimed_state.to_string(),
                    keys::CLAIM_MODE => if self.claim_restored {
                        "CLAIM"
                    } else {
                        "NO_CLAIM"
                    }
                    .to_string(),
                    keys::CHECKPOINT_RETENTION => if self.retain_on_cancellation {
                        "RETAIN_ON_CANCELLATION"
                    } else {
                        "DELETE_ON_CANCELLATION"
                    }
                    .to_string(),
                    keys::RESTART_STRATEGY => restart.type_name().to_string(),
                    keys::FAILOVER_STRATEGY => self.failover_strategy.to_string(),
                    keys::PARALLELISM => self.parallelism.to_string(),
                    keys::MAX_PARALLELISM => self.max_parallelism.to_string(),
                    keys::AUTO_WATERMARK_INTERVAL => d(self.auto_watermark_interval),
                    _ => restart
                        .param(key)
                        .or_else(|| others.iter().find_map(|r| r.param(key)))
                        .map(Param::render)
                        .unwrap_or_default(),
                };
                (key.to_string(), value)
            })
            .collect()
    }
}

/// What an acceptable value for `key` looks like (used when the value is not even a scalar).
fn expected_for(key: &str) -> &'static str {
    match key {
        keys::CHECKPOINT_INTERVAL
        | keys::MIN_PAUSE
        | keys::ALIGNED_CHECKPOINT_TIMEOUT
        | keys::FIXED_DELAY_DELAY
        | keys::FAILURE_RATE_DELAY
        | keys::CHECKPOINT_TIMEOUT
        | keys::FAILURE_RATE_INTERVAL
        | keys::EXP_INITIAL_BACKOFF
        | keys::EXP_MAX_BACKOFF
        | keys::EXP_RESET_BACKOFF_THRESHOLD
        | keys::AUTO_WATERMARK_INTERVAL => EXPECT_DURATION,
        keys::CHECKPOINTING_MODE => "EXACTLY_ONCE or AT_LEAST_ONCE",
        keys::MAX_CONCURRENT_CHECKPOINTS
        | keys::NUM_RETAINED
        | keys::PARALLELISM
        | keys::FAILURE_RATE_MAX_FAILURES
        | keys::EXP_ATTEMPTS_BEFORE_RESET => "an integer >= 1",
        keys::TOLERABLE_FAILED_CHECKPOINTS | keys::FIXED_DELAY_ATTEMPTS => "a non-negative integer",
        keys::UNALIGNED_ENABLED
        | keys::UNALIGNED_ALIAS
        | keys::INCREMENTAL
        | keys::HEAP_COPY_ON_WRITE
        | keys::METRICS_ENABLED
        | keys::S3_PATH_STYLE
        | keys::IGNORE_UNCLAIMED_STATE => "true or false",
        keys::S3_ENDPOINT | keys::S3_REGION | keys::S3_ACCESS_KEY | keys::S3_SECRET_KEY => {
            "a non-empty string"
        }
        keys::STATE_BACKEND => "hashmap or rocksdb",
        keys::CHECKPOINTS_DIR => "a local directory path, a file:// URI or s3://bucket/prefix",
        keys::SAVEPOINTS_DIR | keys::ROCKSDB_LOCAL_DIR => "a local directory path or a file:// URI",
        keys::ROCKSDB_MEMORY => EXPECT_MEMORY,
        keys::RESTART_STRATEGY => {
            "one of none, off, disable, fixed-delay, failure-rate, exponential-delay"
        }
        keys::FAILOVER_STRATEGY => "full or region",
        keys::CHECKPOINT_RETENTION => "DELETE_ON_CANCELLATION or RETAIN_ON_CANCELLATION",
        keys::CLAIM_MODE => "NO_CLAIM or CLAIM",
        keys::MAX_PARALLELISM => "an integer between 1 and 32768",
        keys::EXP_BACKOFF_MULTIPLIER => "a number >= 1.0",
        keys::EXP_JITTER_FACTOR => "a number between 0.0 and 1.0",
        _ => "a valid value",
    }
}

/// What a memory size looks like.
const EXPECT_MEMORY: &str = "a memory size of at least 8mb, such as 64mb, 512m or 1g";

/// Parses a memory size as Flink writes them: a number and an optional unit (`b`, `k`/`kb`,
/// `m`/`mb`, `g`/`gb`, case-insensitive; binary multiples), bytes without one.
pub fn parse_memory_size(raw: &str) -> Option<u64> {
    let s = raw.trim().to_ascii_lowercase();
    let digits = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (number, unit) = s.split_at(digits);
    let n: u64 = number.parse().ok()?;
    let shift = match unit.trim() {
        "" | "b" | "bytes" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// [`ConfigError::NeedsFeature`] for `key: value` unless cairn was `built` with `feature`.
fn needs_feature(
    key: &str,
    value: &str,
    feature: &'static str,
    built: bool,
) -> Result<(), ConfigError> {
    if built {
        return Ok(());
    }
    Err(ConfigError::NeedsFeature {
        key: key.to_string(),
        value: value.to_string(),
        feature,
    })
}

/// Parses one value for one key, producing [`ConfigError::InvalidValue`] on failure.
struct ValueParser<'a> {
    key: &'a str,
    raw: &'a str,
}

impl ValueParser<'_> {
    fn invalid(&self, expected: &str) -> ConfigError {
        ConfigError::InvalidValue {
            key: self.key.to_string(),
            value: self.raw.to_string(),
            expected: expected.to_string(),
        }
    }

    fn duration(&self) -> Result<Duration, ConfigError> {
        parse_duration(self.raw).map_err(|_| self.invalid(EXPECT_DURATION))
    }

    fn positive_duration(&self) -> Result<Duration, ConfigError> {
        let d = self.duration()?;
        if d.is_zero() {
            return Err(self.invalid("a duration greater than 0, such as 500ms, 10s or 1min"));
        }
        Ok(d)
    }

    fn u32_min(&self, min: u32) -> Result<u32, ConfigError> {
        let expected = if min == 0 {
            "a non-negative integer".to_string()
        } else {
            format!("an integer >= {min}")
        };
        match self.raw.trim().parse::<u32>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(self.invalid(&expected)),
        }
    }

    /// A memory size such as `64mb`, `1g`, `512kb` or bytes, at least `min` bytes.
    fn memory_size(&self, min: u64) -> Result<u64, ConfigError> {
        match parse_memory_size(self.raw) {
            Some(n) if n >= min => Ok(n),
            _ => Err(self.invalid(EXPECT_MEMORY)),
        }
    }

    fn bool(&self) -> Result<bool, ConfigError> {
        parse_bool(self.raw).map_err(|_| self.invalid("true or false"))
    }

    fn parse_enum<T: FromStr>(&self, expected: &str) -> Result<T, ConfigError> {
        self.raw.parse::<T>().map_err(|_| self.invalid(expected))
    }

    fn finite_f64(&self) -> Option<f64> {
        self.raw
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
    }

    fn multiplier(&self) -> Result<f64, ConfigError> {
        match self.finite_f64() {
            Some(f) if f >= 1.0 => Ok(f),
            _ => Err(self.invalid(expected_for(keys::EXP_BACKOFF_MULTIPLIER))),
        }
    }

    fn jitter(&self) -> Result<f64, ConfigError> {
        match self.finite_f64() {
            Some(f) if (0.0..=1.0).contains(&f) => Ok(f),
            _ => Err(self.invalid(expected_for(keys::EXP_JITTER_FACTOR))),
        }
    }

    /// An `s3://` (or `s3a://`, `s3p://`) location, or None for any other value.
    fn s3_url(&self) -> Result<Option<crate::storage::S3Url>, ConfigError> {
        let raw = self.raw.trim();
        let lower = raw.to_ascii_lowercase();
        if !["s3://", "s3a://", "s3p://"]
            .iter()
            .any(|s| lower.starts_with(s))
        {
            return Ok(None);
        }
        crate::storage::S3Url::parse(raw).map(Some).map_err(|why| {
            self.invalid(&format!(
                "a local directory, a file:// URI or s3://bucket/prefix ({why})"
            ))
        })
    }

    fn non_empty(&self) -> Result<String, ConfigError> {
        match self.raw.trim() {
            "" => Err(self.invalid("a non-empty string")),
            s => Ok(s.to_string()),
        }
    }

    fn checkpoint_dir(&self) -> Result<PathBuf, ConfigError> {
        parse_checkpoint_dir(self.raw).map_err(|why| {
            self.invalid(&format!("a local directory path or a file:// URI ({why})"))
        })
    }
}

/// Parses `state.checkpoints.dir`: a plain path, or a `file:` URI whose path is
/// percent-decoded. Remote schemes (`s3://`, `hdfs://`, ...) are rejected.
fn parse_checkpoint_dir(s: &str) -> Result<PathBuf, &'static str> {
    let s = s.trim();
    if s.is_empty() {
        return Err("the path is empty");
    }
    let scheme_end = s.find(':');
    let scheme = scheme_end.map(|i| &s[..i]);
    if let (Some(scheme), Some(i)) = (scheme, scheme_end) {
        if scheme.eq_ignore_ascii_case("file") {
            let rest = &s[i + 1..];
            let path = match rest.strip_prefix("//") {
                Some(after) => {
                    let (authority, path) = match after.find('/') {
                        Some(j) => after.split_at(j),
                        None => (after, ""),
                    };
                    if !(authority.is_empty() || authority.eq_ignore_ascii_case("localhost")) {
                        return Err("file URIs must not name a remote host");
                    }
                    path
                }
                None => rest,
            };
            if path.is_empty() {
                return Err("the URI has no path");
            }
            let decoded = percent_decode(path).ok_or("the URI has a bad %-escape")?;
            #[cfg(windows)]
            let decoded = {
                // file:///C:/dir -> C:/dir
                let b = decoded.as_bytes();
                if b.len() >= 3 && b[0] == b'/' && b[1].is_ascii_alphabetic() && b[2] == b':' {
                    decoded[1..].to_string()
                } else {
                    decoded
                }
            };
            return Ok(PathBuf::from(decoded));
        }
        // A URI scheme is at least two characters (one would be a Windows drive letter).
        let looks_like_scheme = scheme.len() >= 2
            && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            && s[i + 1..].starts_with('/');
        if looks_like_scheme {
            return Err("only local file systems are supported");
        }
    }
    Ok(PathBuf::from(s))
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Flattens nested YAML mappings into dotted keys, in document order.
fn flatten(
    prefix: Option<&str>,
    value: &Value,
    out: &mut Vec<(String, Leaf)>,
) -> Result<(), ConfigError> {
    let Value::Mapping(map) = value else {
        return Ok(());
    };
    for (k, v) in map {
        let part = match k {
            Value::String(s) => s.clone(),
            Value::Bool(b) => b.to_string(),
            Value::Number(n) => n.to_string(),
            other => {
                return Err(ConfigError::UnknownKey {
                    key: join_key(prefix, &render_value(other)),
                })
            }
        };
        let key = join_key(prefix, part.trim());
        match v {
            Value::Mapping(m) if m.is_empty() => {
                if KNOWN_KEYS.contains(&key.as_str()) {
                    out.push((key, Leaf::NotScalar("{}".to_string())));
                } else if !is_key_prefix(&key) {
                    return Err(ConfigError::UnknownKey { key });
                }
            }
            Value::Mapping(_) => flatten(Some(&key), v, out)?,
            Value::String(s) => out.push((key, Leaf::Scalar(s.clone()))),
            Value::Bool(b) => out.push((key, Leaf::Scalar(b.to_string()))),
            Value::Number(n) => out.push((key, Leaf::Scalar(n.to_string()))),
            other => out.push((key, Leaf::NotScalar(render_value(other)))),
        }
    }
    Ok(())
}

fn join_key(prefix: Option<&str>, part: &str) -> String {
    match prefix {
        Some(p) => format!("{p}.{part}"),
        None => part.to_string(),
    }
}

/// Whether some known key starts with `prefix` followed by a dot.
fn is_key_prefix(prefix: &str) -> bool {
    KNOWN_KEYS.iter().any(|k| {
        k.strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.'))
    })
}

fn value_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a sequence",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

/// A compact, single-line rendering of a YAML value for error messages.
fn render_value(v: &Value) -> String {
    match v {
        Value::Null => "null".to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Sequence(items) => {
            let parts: Vec<String> = items.iter().map(render_value).collect();
            format!("[{}]", parts.join(", "))
        }
        Value::Mapping(m) => {
            let parts: Vec<String> = m
                .iter()
                .map(|(k, v)| format!("{}: {}", render_value(k), render_value(v)))
                .collect();
            format!("{{{}}}", parts.join(", "))
        }
        Value::Tagged(t) => format!("{} {}", t.tag, render_value(&t.value)),
    }
}

/// Parses a duration in Flink's syntax: a non-negative integer, optional whitespace and
/// an optional case-insensitive unit — `ns`, `us`/`µs`, `ms`/`milli(s)`/`millisecond(s)`,
/// `s`/`sec(s)`/`second(s)`, `min`/`m`/`minute(s)`, `h`/`hour(s)`, `d`/`day(s)` (plus
/// Flink's `nano(s)`/`nanosecond(s)`, `micro(s)`/`microsecond(s)`). A bare integer is
/// milliseconds.
///
/// Rejects empty input, signs, fractions, unknown units and values that overflow.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let text = s.trim();
    if text.is_empty() {
        return Err("duration is empty".to_string());
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, rest) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!(
            "duration '{text}' does not start with a non-negative integer"
        ));
    }
    if rest.starts_with(['.', ',']) {
        return Err(format!(
            "duration '{text}' is fractional; use a smaller unit instead"
        ));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("duration '{text}' is too large"))?;
    let unit = rest.trim_start().to_lowercase();
    let overflow = || format!("duration '{text}' is too large");
    let secs = |mul: u64| {
        n.checked_mul(mul)
            .map(Duration::from_secs)
            .ok_or_else(overflow)
    };
    match unit.as_str() {
        "ns" | "nano" | "nanos" | "nanosecond" | "nanoseconds" => Ok(Duration::from_nanos(n)),
        "us" | "µs" | "μs" | "micro" | "micros" | "microsecond" | "microseconds" => {
            Ok(Duration::from_micros(n))
        }
        "" | "ms" | "milli" | "millis" | "millisecond" | "milliseconds" => {
            Ok(Duration::from_millis(n))
        }
        "s" | "sec" | "secs" | "second" | "seconds" => Ok(Duration::from_secs(n)),
        "m" | "min" | "mins" | "minute" | "minutes" => secs(60),
        "h" | "hour" | "hours" => secs(3_600),
        "d" | "day" | "days" => secs(86_400),
        _ => Err(format!(
            "unknown time unit '{}' in duration '{text}'",
            rest.trim_start()
        )),
    }
}

/// Renders a duration with the largest unit that represents it exactly (`1min`, `10s`,
/// `500ms`, `2h`, `3d`, `7us`, `5ns`; zero is `0ms`). The output is accepted by
/// [`parse_duration`].
pub fn format_duration(d: Duration) -> String {
    const UNITS: [(u128, &str); 7] = [
        (86_400_000_000_000, "d"),
        (3_600_000_000_000, "h"),
        (60_000_000_000, "min"),
        (1_000_000_000, "s"),
        (1_000_000, "ms"),
        (1_000, "us"),
        (1, "ns"),
    ];
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0ms".to_string();
    }
    for (per, unit) in UNITS {
        if nanos % per == 0 {
            return format!("{}{unit}", nanos / per);
        }
    }
    format!("{nanos}ns")
}

/// Parses a boolean option: `true` or `false`, case-insensitive (surrounding whitespace ignored).
pub fn parse_bool(s: &str) -> Result<bool, String> {
    let t = s.trim();
    if t.eq_ignore_ascii_case("true") {
        Ok(true)
    } else if t.eq_ignore_ascii_case("false") {
        Ok(false)
    } else {
        Err(format!("'{s}' is not a boolean (expected true or false)"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    /// Asserts `result` is an InvalidValue for `key` carrying `value`, and returns its Display.
    fn assert_invalid<T: fmt::Debug>(
        result: Result<T, ConfigError>,
        key: &str,
        value: &str,
    ) -> String {
        match result {
            Err(e @ ConfigError::InvalidValue { .. }) => {
                let ConfigError::InvalidValue {
                    key: k, value: v, ..
                } = &e
                else {
                    unreachable!()
                };
                assert_eq!(k, key);
                assert_eq!(v, value);
                let msg = e.to_string();
                assert!(msg.contains(&format!("'{key}'")), "{msg}");
                msg
            }
            other => panic!("expected InvalidValue for {key}={value}, got {other:?}"),
        }
    }

    // ---- durations -------------------------------------------------------------------

    #[test]
    fn duration_all_units() {
        let cases: &[(&str, Duration)] = &[
            ("7ns", Duration::from_nanos(7)),
            ("7nano", Duration::from_nanos(7)),
            ("7nanoseconds", Duration::from_nanos(7)),
            ("7us", Duration::from_micros(7)),
            ("7µs", Duration::from_micros(7)),
            ("7micros", Duration::from_micros(7)),
            ("7ms", ms(7)),
            ("7milli", ms(7)),
            ("7millis", ms(7)),
            ("7millisecond", ms(7)),
            ("7milliseconds", ms(7)),
            ("7s", secs(7)),
            ("7sec", secs(7)),
            ("7secs", secs(7)),
            ("7second", secs(7)),
            ("7seconds", secs(7)),
            ("7min", secs(420)),
            ("7m", secs(420)),
            ("7minute", secs(420)),
            ("7minutes", secs(420)),
            ("7h", secs(7 * 3600)),
            ("7hour", secs(7 * 3600)),
            ("7hours", secs(7 * 3600)),
            ("7d", secs(7 * 86400)),
            ("7day", secs(7 * 86400)),
            ("7days", secs(7 * 86400)),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(*expected), "{text}");
        }
    }

    #[test]
    fn duration_case_whitespace_and_bare_millis() {
        assert_eq!(parse_duration("10 s"), Ok(secs(10)));
        assert_eq!(parse_duration("  10S  "), Ok(secs(10)));
        assert_eq!(parse_duration("3 MIN"), Ok(secs(180)));
        assert_eq!(parse_duration("1 Hours"), Ok(secs(3600)));
        assert_eq!(parse_duration("500MS"), Ok(ms(500)));
        assert_eq!(parse_duration("500"), Ok(ms(500)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert_eq!(parse_duration("0ms"), Ok(Duration::ZERO));
    }

    #[test]
    fn duration_rejects_bad_input() {
        for bad in [
            "",
            "   ",
            "-1s",
            "+1s",
            "1.5s",
            "1,5s",
            "abc",
            "s",
            "10 parsecs",
            "1h30m",
            "10s10",
            "99999999999999999999999ms",
            "18446744073709551615d",
            "0x10s",
            "ten seconds",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(parse_duration("1.5s").unwrap_err().contains("fractional"));
        assert!(parse_duration("5 fortnights")
            .unwrap_err()
            .contains("unknown time unit"));
    }

    #[test]
    fn format_duration_picks_largest_exact_unit_and_round_trips() {
        assert_eq!(format_duration(Duration::ZERO), "0ms");
        assert_eq!(format_duration(ms(500)), "500ms");
        assert_eq!(format_duration(secs(10)), "10s");
        assert_eq!(format_duration(secs(60)), "1min");
        assert_eq!(format_duration(secs(90)), "90s");
        assert_eq!(format_duration(secs(5400)), "90min");
        assert_eq!(format_duration(secs(7200)), "2h");
        assert_eq!(format_duration(secs(86400)), "1d");
        assert_eq!(format_duration(ms(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_micros(7)), "7us");
        assert_eq!(
            format_duration(Duration::from_nanos(1_000_001)),
            "1000001ns"
        );
        for d in [
            ms(0),
            ms(1),
            ms(1500),
            secs(61),
            secs(3600),
            Duration::from_nanos(3),
        ] {
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
    }

    #[test]
    fn bools() {
        assert_eq!(parse_bool("true"), Ok(true));
        assert_eq!(parse_bool("TRUE"), Ok(true));
        assert_eq!(parse_bool(" False "), Ok(false));
        for bad in ["", "yes", "1", "0", "on", "truee"] {
            assert!(parse_bool(bad).is_err(), "{bad:?}");
        }
    }

    // ---- defaults and every key ---------------------------------------------------------

    #[test]
    fn defaults_match_flink() {
        let c = JobConfig::default();
        assert_eq!(c.checkpoint_interval, None);
        assert_eq!(c.checkpointing_mode, CheckpointingMode::ExactlyOnce);
        assert_eq!(c.checkpoint_timeout, secs(600));
        assert_eq!(c.min_pause, Duration::ZERO);
        assert_eq!(c.max_concurrent_checkpoints, 1);
        assert_eq!(c.tolerable_failed_checkpoints, 0);
        assert!(!c.unaligned_enabled);
        assert_eq!(c.aligned_checkpoint_timeout, Duration::ZERO);
        assert_eq!(c.state_backend, StateBackendKind::HashMap);
        assert_eq!(c.checkpoints_dir, None);
        assert_eq!(c.num_retained, 1);
        assert!(!c.incremental);
        assert_eq!(c.restart_strategy, None);
        assert_eq!(c.failover_strategy, FailoverStrategy::Region);
        assert_eq!(c.parallelism, 1);
        assert_eq!(c.max_parallelism, 128);
        assert!(!c.checkpointing_enabled());
        assert_eq!(JobConfig::from_yaml_str("").unwrap(), c);
    }

    #[test]
    #[cfg(feature = "rocksdb")]
    fn every_top_level_key_can_be_set() {
        let mut c = JobConfig::default();
        c.set(keys::CHECKPOINT_INTERVAL, "10s").unwrap();
        c.set(keys::CHECKPOINTING_MODE, "at-least-once").unwrap();
        c.set(keys::CHECKPOINT_TIMEOUT, "2min").unwrap();
        c.set(keys::MIN_PAUSE, "500ms").unwrap();
        c.set(keys::MAX_CONCURRENT_CHECKPOINTS, "3").unwrap();
        c.set(keys::TOLERABLE_FAILED_CHECKPOINTS, "4").unwrap();
        c.set(keys::UNALIGNED_ENABLED, "true").unwrap();
        c.set(keys::ALIGNED_CHECKPOINT_TIMEOUT, "30s").unwrap();
        c.set(keys::STATE_BACKEND, "RocksDB").unwrap();
        c.set(keys::CHECKPOINTS_DIR, "/var/cairn/ckpt").unwrap();
        c.set(keys::NUM_RETAINED, "5").unwrap();
        c.set(keys::INCREMENTAL, "TRUE").unwrap();
        c.set(keys::RESTART_STRATEGY, "fixed-delay").unwrap();
        c.set(keys::FAILOVER_STRATEGY, "Full").unwrap();
        c.set(keys::PARALLELISM, "8").unwrap();
        c.set(keys::MAX_PARALLELISM, "32768").unwrap();
        let expected = JobConfig {
            checkpoint_interval: Some(secs(10)),
            checkpointing_mode: CheckpointingMode::AtLeastOnce,
            checkpoint_timeout: secs(120),
            min_pause: ms(500),
            max_concurrent_checkpoints: 3,
            tolerable_failed_checkpoints: 4,
            unaligned_enabled: true,
            aligned_checkpoint_timeout: secs(30),
            state_backend: StateBackendKind::RocksDb,
            checkpoints_dir: Some(PathBuf::from("/var/cairn/ckpt")),
            checkpoints_s3: None,
            s3: crate::storage::S3Settings::default(),
            savepoints_dir: None,
            num_retained: 5,
            incremental: true,
            heap_copy_on_write: true,
            metrics_enabled: true,
            rocksdb_local_dir: None,
            rocksdb_memory: crate::state::rocks::DEFAULT_MEMORY_BYTES,
            ignore_unclaimed_state: false,
            claim_restored: false,
            retain_on_cancellation: false,
            restart_strategy: Some(RestartStrategyConfig::fixed_delay_defaults()),
            failover_strategy: FailoverStrategy::Full,
            parallelism: 8,
            max_parallelism: 32768,
            auto_watermark_interval: Duration::from_millis(200),
        };
        assert_eq!(c, expected);
        assert!(c.checkpointing_enabled());
    }

    #[test]
    #[cfg(feature = "rocksdb")]
    fn enum_spellings() {
        let mut c = JobConfig::default();
        for (text, mode) in [
            ("EXACTLY_ONCE", CheckpointingMode::ExactlyOnce),
            ("at_least_once", CheckpointingMode::AtLeastOnce),
            ("Exactly-Once", CheckpointingMode::ExactlyOnce),
        ] {
            c.set(keys::CHECKPOINTING_MODE, text).unwrap();
            assert_eq!(c.checkpointing_mode, mode);
        }
        c.set(keys::STATE_BACKEND, "rocksdb").unwrap();
        c.set(keys::STATE_BACKEND, "HashMap").unwrap();
        assert_eq!(c.state_backend, StateBackendKind::HashMap);
        c.set(keys::FAILOVER_STRATEGY, "full").unwrap();
        c.set(keys::FAILOVER_STRATEGY, "REGION").unwrap();
        assert_eq!(c.failover_strategy, FailoverStrategy::Region);
    }

    #[test]
    fn interval_zero_disables_checkpointing() {
        for zero in ["0", "0ms", "0 s"] {
            let mut c = JobConfig::default();
            c.set(keys::CHECKPOINT_INTERVAL, "5s").unwrap();
            c.set(keys::CHECKPOINT_INTERVAL, zero).unwrap();
            assert_eq!(c.checkpoint_interval, None, "{zero}");
        }
        let c = JobConfig::from_yaml_str("execution.checkpointing.interval: 0").unwrap();
        assert_eq!(c.checkpoint_interval, None);
        let c = JobConfig::from_yaml_str("execution.checkpointing.interval: 250").unwrap();
        assert_eq!(c.checkpoint_interval, Some(ms(250)));
    }

    #[test]
    fn unaligned_alias() {
        let c = JobConfig::from_yaml_str("execution.checkpointing.unaligned: true").unwrap();
        assert!(c.unaligned_enabled);
        let c = JobConfig::from_yaml_str(
            "execution:\n  checkpointing:\n    unaligned:\n      enabled: true\n",
        )
        .unwrap();
        assert!(c.unaligned_enabled);
    }

    #[test]
    fn checkpoint_dir_paths_and_uris() {
        let mut c = JobConfig::default();
        for (input, expected) in [
            ("/tmp/ckpt", "/tmp/ckpt"),
            ("relative/dir", "relative/dir"),
            ("file:///tmp/ckpt", "/tmp/ckpt"),
            ("FILE:///tmp/ckpt", "/tmp/ckpt"),
            ("file://localhost/tmp/ckpt", "/tmp/ckpt"),
            ("file:/tmp/ckpt", "/tmp/ckpt"),
            ("file:///tmp/my%20dir", "/tmp/my dir"),
        ] {
            c.set(keys::CHECKPOINTS_DIR, input).unwrap();
            assert_eq!(c.checkpoints_dir, Some(PathBuf::from(expected)), "{input}");
        }
        for bad in [
            "s3://",
            "hdfs://namenode:8020/ckpt",
            "hdfs:/ckpt",
            "file://otherhost/tmp",
            "file://",
            "file:///tmp/%zz",
            "file:///tmp/%+1",
            "file:///tmp/%4",
            "",
            "   ",
        ] {
            let msg = assert_invalid(
                c.set(keys::CHECKPOINTS_DIR, bad),
                keys::CHECKPOINTS_DIR,
                bad,
            );
            assert!(msg.contains("file://"), "{msg}");
        }
    }

    // ---- YAML ---------------------------------------------------------------------------

    #[test]
    #[cfg(feature = "rocksdb")]
    fn flat_yaml() {
        let c = JobConfig::from_yaml_str(
            "# job config\n\
             execution.checkpointing.interval: 10s\n\
             execution.checkpointing.mode: AT_LEAST_ONCE\n\
             state.backend.type: rocksdb\n\
             state.backend.incremental: true\n\
             parallelism.default: 4\n\
             restart-strategy.type: fixed-delay\n\
             restart-strategy.fixed-delay.attempts: 3\n",
        )
        .unwrap();
        assert_eq!(c.checkpoint_interval, Some(secs(10)));
        assert_eq!(c.checkpointing_mode, CheckpointingMode::AtLeastOnce);
        assert_eq!(c.state_backend, StateBackendKind::RocksDb);
        assert!(c.incremental);
        assert_eq!(c.parallelism, 4);
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::FixedDelay {
                attempts: 3,
                delay: secs(1)
            })
        );
    }

    #[test]
    #[cfg(feature = "rocksdb")]
    fn nested_and_mixed_yaml() {
        let nested = JobConfig::from_yaml_str(
            "execution:\n  checkpointing:\n    interval: 10s\n    timeout: 1min\n\
             state:\n  backend:\n    type: rocksdb\n  checkpoints:\n    dir: file:///data/ckpt\n\
             parallelism:\n  default: 2\n",
        )
        .unwrap();
        let flat = JobConfig::from_yaml_str(
            "execution.checkpointing.interval: 10s\nexecution.checkpointing.timeout: 1min\n\
             state.backend.type: rocksdb\nstate.checkpoints.dir: /data/ckpt\nparallelism.default: 2\n",
        )
        .unwrap();
        assert_eq!(nested, flat);
        assert_eq!(nested.checkpoint_timeout, secs(60));
        assert_eq!(nested.checkpoints_dir, Some(PathBuf::from("/data/ckpt")));

        let mixed = JobConfig::from_yaml_str(
            "execution:\n  checkpointing.interval: 10s\n  checkpointing:\n    timeout: 1min\n\
             state.backend: {type: rocksdb}\nstate.checkpoints.dir: /data/ckpt\nparallelism: {default: 2}\n",
        )
        .unwrap();
        assert_eq!(mixed, flat);
    }

    #[test]
    fn yaml_scalars_of_every_type() {
        let c = JobConfig::from_yaml_str(
            "parallelism.default: 4\n\
             state.backend.incremental: true\n\
             restart-strategy.type: exponential-delay\n\
             restart-strategy.exponential-delay.backoff-multiplier: 2.5\n\
             restart-strategy.exponential-delay.jitter-factor: 0\n\
             execution.checkpointing.timeout: \"30 s\"\n",
        )
        .unwrap();
        assert_eq!(c.parallelism, 4);
        assert!(c.incremental);
        assert_eq!(c.checkpoint_timeout, secs(30));
        match c.restart_strategy {
            Some(RestartStrategyConfig::ExponentialDelay {
                backoff_multiplier,
                jitter_factor,
                ..
            }) => {
                assert_eq!(backoff_multiplier, 2.5);
                assert_eq!(jitter_factor, 0.0);
            }
            other => panic!("{other:?}"),
        }
        // A float where an integer is required is rejected, naming the key.
        assert_invalid(
            JobConfig::from_yaml_str("parallelism.default: 4.0"),
            keys::PARALLELISM,
            "4.0",
        );
        // A bool where a duration is required.
        assert_invalid(
            JobConfig::from_yaml_str("execution.checkpointing.min-pause: true"),
            keys::MIN_PAUSE,
            "true",
        );
    }

    #[test]
    fn null_and_sequence_values_are_invalid() {
        let msg = assert_invalid(
            JobConfig::from_yaml_str("execution.checkpointing.interval:"),
            keys::CHECKPOINT_INTERVAL,
            "null",
        );
        assert!(msg.contains("expected a duration"), "{msg}");
        assert_invalid(
            JobConfig::from_yaml_str("parallelism.default: ~"),
            keys::PARALLELISM,
            "null",
        );
        assert_invalid(
            JobConfig::from_yaml_str("parallelism.default: [1, 2]"),
            keys::PARALLELISM,
            "[1, 2]",
        );
        assert_invalid(
            JobConfig::from_yaml_str("state:\n  backend:\n    type:\n      - rocksdb\n"),
            keys::STATE_BACKEND,
            "[rocksdb]",
        );
        assert_invalid(
            JobConfig::from_yaml_str("parallelism.default: {}"),
            keys::PARALLELISM,
            "{}",
        );
    }

    #[test]
    fn empty_and_comment_only_files_are_empty_configs() {
        for text in ["", "\n\n", "# nothing here\n# at all\n", "---\n", "{}"] {
            assert_eq!(
                JobConfig::from_yaml_str(text).unwrap(),
                JobConfig::default(),
                "{text:?}"
            );
        }
        // An empty mapping under a prefix of known keys is harmless.
        assert_eq!(
            JobConfig::from_yaml_str("execution: {}").unwrap(),
            JobConfig::default()
        );
    }

    #[test]
    fn non_mapping_top_level_is_rejected() {
        for (text, found) in [
            ("- a\n- b\n", "a sequence"),
            ("just a string", "a string"),
            ("42", "a number"),
        ] {
            match JobConfig::from_yaml_str(text) {
                Err(e @ ConfigError::NotAMapping { .. }) => {
                    assert!(e.to_string().contains(found), "{e}");
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn yaml_syntax_error_carries_parser_message() {
        match JobConfig::from_yaml_str("a: [unclosed\n") {
            Err(ConfigError::Yaml {
                path: None,
                message,
            }) => assert!(!message.is_empty()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn from_file_reads_and_names_file_on_errors() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("job.yaml");
        std::fs::write(
            &good,
            "parallelism.default: 3\nexecution.checkpointing.interval: 1min\n",
        )
        .unwrap();
        let c = JobConfig::from_file(&good).unwrap();
        assert_eq!(c.parallelism, 3);
        assert_eq!(c.checkpoint_interval, Some(secs(60)));

        let missing = dir.path().join("missing.yaml");
        match JobConfig::from_file(&missing) {
            Err(e @ ConfigError::Io { .. }) => {
                assert!(e.to_string().contains("missing.yaml"), "{e}");
            }
            other => panic!("{other:?}"),
        }

        let broken = dir.path().join("broken.yaml");
        std::fs::write(&broken, "parallelism.default: [1,\n").unwrap();
        match JobConfig::from_file(&broken) {
            Err(e @ ConfigError::Yaml { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("broken.yaml"), "{msg}");
                assert!(msg.contains("line"), "parser message missing: {msg}");
            }
            other => panic!("{other:?}"),
        }

        let empty = dir.path().join("empty.yaml");
        std::fs::write(&empty, "# only a comment\n").unwrap();
        assert_eq!(JobConfig::from_file(&empty).unwrap(), JobConfig::default());
    }

    // ---- unknown keys and bad values ------------------------------------------------------

    #[test]
    fn unknown_key_with_suggestion() {
        let err = JobConfig::from_yaml_str("execution.checkpointing.intervall: 10s").unwrap_err();
        assert!(
            matches!(&err, ConfigError::UnknownKey { key } if key == "execution.checkpointing.intervall")
        );
        assert_eq!(
            err.to_string(),
            "unknown configuration key 'execution.checkpointing.intervall' \
             (did you mean 'execution.checkpointing.interval'?)"
        );
        assert_eq!(err.key(), Some("execution.checkpointing.intervall"));

        // Nested typo is reported with the dotted key.
        let err = JobConfig::from_yaml_str("parallelism:\n  defualt: 2\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown configuration key 'parallelism.defualt' (did you mean 'parallelism.default'?)"
        );

        // Far from anything: no suggestion.
        let err = JobConfig::default()
            .set("taskmanager.memory.size", "1g")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown configuration key 'taskmanager.memory.size'"
        );
        // Unknown key with a non-scalar value is still an unknown key.
        assert!(matches!(
            JobConfig::from_yaml_str("bogus: [1]"),
            Err(ConfigError::UnknownKey { .. })
        ));
        assert!(matches!(
            JobConfig::from_yaml_str("bogus: {}"),
            Err(ConfigError::UnknownKey { .. })
        ));
        // Children of a leaf key are unknown.
        assert!(matches!(
            JobConfig::from_yaml_str("parallelism.default: {x: 1}"),
            Err(ConfigError::UnknownKey { key }) if key == "parallelism.default.x"
        ));
        assert_eq!(suggest_key("PARALLELISM.DEFAULT"), Some(keys::PARALLELISM));
        assert_eq!(suggest_key("xyz"), None);
    }

    #[test]
    fn invalid_value_display() {
        let err = JobConfig::default()
            .set(keys::CHECKPOINT_TIMEOUT, "abc")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid value 'abc' for configuration key 'execution.checkpointing.timeout': \
             expected a duration such as 500ms, 10s or 1min"
        );
    }

    #[test]
    fn every_kind_of_bad_value_names_the_key() {
        let cases: &[(&str, &str)] = &[
            (keys::CHECKPOINT_INTERVAL, "soon"),
            (keys::CHECKPOINT_INTERVAL, "-5s"),
            (keys::CHECKPOINTING_MODE, "ONCE"),
            (keys::CHECKPOINT_TIMEOUT, "0"),
            (keys::CHECKPOINT_TIMEOUT, "1.5min"),
            (keys::MIN_PAUSE, "x"),
            (keys::MAX_CONCURRENT_CHECKPOINTS, "0"),
            (keys::MAX_CONCURRENT_CHECKPOINTS, "-1"),
            (keys::TOLERABLE_FAILED_CHECKPOINTS, "-1"),
            (keys::TOLERABLE_FAILED_CHECKPOINTS, "4294967296"),
            (keys::UNALIGNED_ENABLED, "yes"),
            (keys::UNALIGNED_ALIAS, "1"),
            (keys::ALIGNED_CHECKPOINT_TIMEOUT, "5 years"),
            (keys::STATE_BACKEND, "filesystem"),
            (keys::CHECKPOINTS_DIR, "s3:///p"),
            (keys::SAVEPOINTS_DIR, "s3://b/p"),
            (keys::S3_PATH_STYLE, "sometimes"),
            (keys::S3_REGION, ""),
            (keys::NUM_RETAINED, "0"),
            (keys::INCREMENTAL, "maybe"),
            (keys::RESTART_STRATEGY, "sometimes"),
            (keys::FIXED_DELAY_ATTEMPTS, "many"),
            (keys::FIXED_DELAY_DELAY, "1.5s"),
            (keys::FAILURE_RATE_MAX_FAILURES, "0"),
            (keys::FAILURE_RATE_INTERVAL, "0s"),
            (keys::FAILURE_RATE_DELAY, "later"),
            (keys::EXP_INITIAL_BACKOFF, "0"),
            (keys::EXP_MAX_BACKOFF, "fast"),
            (keys::EXP_BACKOFF_MULTIPLIER, "0.5"),
            (keys::EXP_BACKOFF_MULTIPLIER, "NaN"),
            (keys::EXP_BACKOFF_MULTIPLIER, "inf"),
            (keys::EXP_RESET_BACKOFF_THRESHOLD, "0ms"),
            (keys::EXP_JITTER_FACTOR, "1.5"),
            (keys::EXP_JITTER_FACTOR, "-0.1"),
            (keys::EXP_ATTEMPTS_BEFORE_RESET, "0"),
            (keys::FAILOVER_STRATEGY, "partial"),
            (keys::PARALLELISM, "0"),
            (keys::PARALLELISM, "two"),
            (keys::MAX_PARALLELISM, "0"),
            (keys::MAX_PARALLELISM, "32769"),
        ];
        for (key, value) in cases {
            // Via set() ...
            let mut c = JobConfig::default();
            let before = c.clone();
            let msg = assert_invalid(c.set(key, value), key, value);
            assert!(msg.contains("expected "), "{msg}");
            assert_eq!(c, before, "a failed set must not change the config ({key})");
            // ... and via YAML (quoted so YAML keeps the text verbatim).
            let yaml = format!("{key}: '{value}'");
            assert_invalid(JobConfig::from_yaml_str(&yaml), key, value);
        }
    }

    #[test]
    fn set_trims_key_and_rejects_unknown() {
        let mut c = JobConfig::default();
        c.set("  parallelism.default ", " 6 ").unwrap();
        assert_eq!(c.parallelism, 6);
        assert!(matches!(
            c.set("parallelism", "6"),
            Err(ConfigError::UnknownKey { .. })
        ));
    }

    // ---- restart strategies ---------------------------------------------------------------

    #[test]
    fn restart_strategy_type_spellings() {
        for (text, name) in [
            ("none", "none"),
            ("OFF", "none"),
            ("disable", "none"),
            ("fixed-delay", "fixed-delay"),
            ("FixedDelay", "fixed-delay"),
            ("failure-rate", "failure-rate"),
            ("failurerate", "failure-rate"),
            ("exponential-delay", "exponential-delay"),
            ("ExponentialDelay", "exponential-delay"),
        ] {
            let mut c = JobConfig::default();
            c.set(keys::RESTART_STRATEGY, text).unwrap();
            assert_eq!(
                c.restart_strategy.map(|r| r.type_name()),
                Some(name),
                "{text}"
            );
        }
    }

    #[test]
    fn restart_strategy_defaults_per_type() {
        let c = JobConfig::from_yaml_str("restart-strategy.type: failure-rate").unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::FailureRate {
                max_failures_per_interval: 1,
                failure_rate_interval: secs(60),
                delay: secs(1),
            })
        );
        let c = JobConfig::from_yaml_str("restart-strategy.type: exponential-delay").unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::ExponentialDelay {
                initial_backoff: secs(1),
                max_backoff: secs(60),
                backoff_multiplier: 1.5,
                reset_backoff_threshold: secs(3600),
                jitter_factor: 0.1,
                attempts_before_reset_backoff: u32::MAX,
            })
        );
        let c = JobConfig::from_yaml_str("restart-strategy.type: none").unwrap();
        assert_eq!(c.restart_strategy, Some(RestartStrategyConfig::None));
    }

    #[test]
    fn restart_sub_keys_apply_regardless_of_order() {
        // Sub-keys before the type, nested form.
        let c = JobConfig::from_yaml_str(
            "restart-strategy:\n  failure-rate:\n    max-failures-per-interval: 3\n    \
             failure-rate-interval: 5min\n    delay: 10s\n  type: failure-rate\n",
        )
        .unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::FailureRate {
                max_failures_per_interval: 3,
                failure_rate_interval: secs(300),
                delay: secs(10),
            })
        );

        let c = JobConfig::from_yaml_str(
            "restart-strategy.exponential-delay.initial-backoff: 2s\n\
             restart-strategy.exponential-delay.max-backoff: 2min\n\
             restart-strategy.exponential-delay.backoff-multiplier: 2\n\
             restart-strategy.exponential-delay.reset-backoff-threshold: 30min\n\
             restart-strategy.exponential-delay.jitter-factor: 0.25\n\
             restart-strategy.exponential-delay.attempts-before-reset-backoff: 10\n\
             restart-strategy.type: exponential-delay\n",
        )
        .unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::ExponentialDelay {
                initial_backoff: secs(2),
                max_backoff: secs(120),
                backoff_multiplier: 2.0,
                reset_backoff_threshold: secs(1800),
                jitter_factor: 0.25,
                attempts_before_reset_backoff: 10,
            })
        );

        // set_all (CLI overlays) also applies the type first.
        let mut c = JobConfig::default();
        c.set_all([
            ("restart-strategy.fixed-delay.delay", "3s"),
            ("restart-strategy.type", "fixed-delay"),
        ])
        .unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::FixedDelay {
                attempts: 1,
                delay: secs(3)
            })
        );
    }

    #[test]
    fn restart_sub_keys_of_other_types_are_validated_but_ignored() {
        let c = JobConfig::from_yaml_str(
            "restart-strategy.type: fixed-delay\n\
             restart-strategy.fixed-delay.attempts: 7\n\
             restart-strategy.failure-rate.delay: 5s\n\
             restart-strategy.exponential-delay.jitter-factor: 0.5\n",
        )
        .unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::FixedDelay {
                attempts: 7,
                delay: secs(1)
            })
        );
        // Without a type: accepted, ignored.
        let c = JobConfig::from_yaml_str("restart-strategy.fixed-delay.attempts: 7").unwrap();
        assert_eq!(c.restart_strategy, None);
        // ... but still validated.
        assert_invalid(
            JobConfig::from_yaml_str("restart-strategy.fixed-delay.attempts: lots"),
            keys::FIXED_DELAY_ATTEMPTS,
            "lots",
        );
        assert_invalid(
            JobConfig::from_yaml_str(
                "restart-strategy.type: none\nrestart-strategy.exponential-delay.jitter-factor: 2",
            ),
            keys::EXP_JITTER_FACTOR,
            "2",
        );
    }

    #[test]
    fn overlay_of_restart_type_keeps_or_resets_parameters() {
        let mut c = JobConfig::from_yaml_str(
            "restart-strategy.type: fixed-delay\nrestart-strategy.fixed-delay.attempts: 5\n",
        )
        .unwrap();
        // Same type again keeps the parameters.
        c.set(keys::RESTART_STRATEGY, "FIXED-DELAY").unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::FixedDelay {
                attempts: 5,
                delay: secs(1)
            })
        );
        // Sub-key overlay on the configured type.
        c.set(keys::FIXED_DELAY_DELAY, "250ms").unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::FixedDelay {
                attempts: 5,
                delay: ms(250)
            })
        );
        // A different type starts from its defaults.
        c.set(keys::RESTART_STRATEGY, "failure-rate").unwrap();
        assert_eq!(
            c.restart_strategy,
            Some(RestartStrategyConfig::failure_rate_defaults())
        );
    }

    #[test]
    fn effective_restart_strategy() {
        let mut c = JobConfig::default();
        assert_eq!(c.effective_restart_strategy(), RestartStrategyConfig::None);
        c.set(keys::CHECKPOINT_INTERVAL, "10s").unwrap();
        assert_eq!(
            c.effective_restart_strategy(),
            RestartStrategyConfig::exponential_delay_defaults()
        );
        c.set(keys::RESTART_STRATEGY, "off").unwrap();
        assert_eq!(c.effective_restart_strategy(), RestartStrategyConfig::None);
        c.set(keys::RESTART_STRATEGY, "fixed-delay").unwrap();
        c.set(keys::CHECKPOINT_INTERVAL, "0").unwrap();
        assert_eq!(
            c.effective_restart_strategy(),
            RestartStrategyConfig::fixed_delay_defaults()
        );
    }

    // ---- describe / validate / misc -------------------------------------------------------

    #[test]
    #[cfg(feature = "s3")]
    fn s3_checkpoint_storage_and_its_keys() {
        let mut c = JobConfig::default();
        c.set_all([
            (keys::CHECKPOINTS_DIR, "s3://bucket/some/prefix/"),
            (keys::S3_ENDPOINT, "http://127.0.0.1:9000"),
            (keys::S3_ACCESS_KEY, "key"),
            (keys::S3_SECRET_KEY, "very-secret"),
            (keys::S3_PATH_STYLE, "true"),
        ])
        .unwrap();
        let url = c.checkpoints_s3.clone().unwrap();
        assert_eq!(
            (url.bucket.as_str(), url.prefix.as_str()),
            ("bucket", "some/prefix")
        );
        assert_eq!(c.checkpoints_dir, None);
        assert_eq!(c.s3.endpoint.as_deref(), Some("http://127.0.0.1:9000"));
        assert_eq!(c.s3.path_style, Some(true));
        let described: std::collections::HashMap<_, _> = c.describe().into_iter().collect();
        assert_eq!(described[keys::CHECKPOINTS_DIR], "s3://bucket/some/prefix");
        assert_eq!(described[keys::S3_SECRET_KEY], "(set)");
        assert!(!format!("{:?}", c.describe()).contains("very-secret"));
        // A local directory afterwards replaces it.
        c.set(keys::CHECKPOINTS_DIR, "/data/ckpt").unwrap();
        assert_eq!(c.checkpoints_s3, None);
        // Bad values name the key.
        for (k, v) in [
            (keys::CHECKPOINTS_DIR, "s3://"),
            (keys::CHECKPOINTS_DIR, "s3://b/../x"),
            (keys::S3_PATH_STYLE, "sometimes"),
            (keys::S3_ENDPOINT, " "),
        ] {
            let err = JobConfig::default().set(k, v).unwrap_err().to_string();
            assert!(err.contains(k), "{err}");
        }
    }

    #[test]
    fn describe_lists_every_key_with_rendered_values() {
        let mut c = JobConfig::default();
        c.set_all([
            (keys::CHECKPOINT_INTERVAL, "10s"),
            (keys::MIN_PAUSE, "500ms"),
            (keys::CHECKPOINTS_DIR, "file:///data/ckpt"),
            (keys::RESTART_STRATEGY, "fixed-delay"),
            (keys::FIXED_DELAY_ATTEMPTS, "3"),
        ])
        .unwrap();
        let described = c.describe();
        let keys_out: Vec<&str> = described.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys_out, KNOWN_KEYS);
        let get = |k: &str| {
            described
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap()
        };
        assert_eq!(get(keys::CHECKPOINT_INTERVAL), "10s");
        assert_eq!(get(keys::CHECKPOINT_TIMEOUT), "10min");
        assert_eq!(get(keys::MIN_PAUSE), "500ms");
        assert_eq!(get(keys::CHECKPOINTING_MODE), "EXACTLY_ONCE");
        assert_eq!(get(keys::STATE_BACKEND), "hashmap");
        assert_eq!(get(keys::CHECKPOINTS_DIR), "/data/ckpt");
        assert_eq!(get(keys::RESTART_STRATEGY), "fixed-delay");
        assert_eq!(get(keys::FIXED_DELAY_ATTEMPTS), "3");
        assert_eq!(get(keys::FIXED_DELAY_DELAY), "1s");
        assert_eq!(get(keys::EXP_BACKOFF_MULTIPLIER), "1.5");
        assert_eq!(get(keys::FAILOVER_STRATEGY), "region");
        assert_eq!(get(keys::MAX_PARALLELISM), "128");

        // Every rendered value (except the unset-dir placeholder) is accepted back by set().
        let defaults = JobConfig::default().describe();
        let mut again = JobConfig::default();
        for (k, v) in &described {
            if v == "(not set)" {
                continue;
            }
            again.set(k, v).unwrap();
        }
        assert_eq!(again, c);
        let d = JobConfig::default();
        assert_eq!(
            defaults
                .iter()
                .find(|(k, _)| k == keys::CHECKPOINT_INTERVAL)
                .map(|(_, v)| v.as_str()),
            Some("0ms")
        );
        assert_eq!(
            defaults
                .iter()
                .find(|(k, _)| k == keys::RESTART_STRATEGY)
                .map(|(_, v)| v.as_str()),
            Some("none")
        );
        assert!(d.describe().iter().all(|(_, v)| !v.is_empty()));
    }

    #[test]
    fn known_keys_are_unique_and_all_settable() {
        let mut seen = std::collections::HashSet::new();
        for key in KNOWN_KEYS {
            assert!(seen.insert(*key), "duplicate {key}");
            assert_ne!(
                expected_for(key),
                "a valid value",
                "{key} has no expectation"
            );
            // Every key is recognised by set(): a garbage value is InvalidValue, not UnknownKey.
            // (The s3.* strings take any non-empty value.)
            let garbage = if key.starts_with("s3.") && *key != keys::S3_PATH_STYLE {
                " "
            } else {
                "s3://"
            };
            let err = JobConfig::default().set(key, garbage).unwrap_err();
            assert!(
                matches!(err, ConfigError::InvalidValue { .. }),
                "{key}: {err}"
            );
        }
    }

    #[test]
    #[cfg(not(feature = "rocksdb"))]
    fn rocksdb_needs_its_feature() {
        let expected = "state.backend.type: rocksdb needs cairn built with the 'rocksdb' feature";
        let err = JobConfig::default()
            .set(keys::STATE_BACKEND, "RocksDB")
            .unwrap_err();
        assert_eq!(err.to_string(), expected);
        assert_eq!(err.key(), Some(keys::STATE_BACKEND));
        let err = JobConfig::from_yaml_str("state:\n  backend:\n    type: rocksdb\n").unwrap_err();
        assert_eq!(err.to_string(), expected);
        // A configuration built in code is refused by validate (as every job start does).
        let c = JobConfig {
            state_backend: StateBackendKind::RocksDb,
            ..JobConfig::default()
        };
        assert_eq!(c.validate().unwrap_err().to_string(), expected);
        // The other keys of the backend are still accepted (they do nothing on the heap).
        let mut c = JobConfig::default();
        c.set(keys::STATE_BACKEND, "hashmap").unwrap();
        c.set(keys::ROCKSDB_MEMORY, "64mb").unwrap();
        c.set(keys::ROCKSDB_LOCAL_DIR, "/tmp/r").unwrap();
        assert!(c.validate().is_ok());
    }

    #[test]
    #[cfg(not(feature = "s3"))]
    fn s3_checkpoints_need_their_feature() {
        let expected =
            "state.checkpoints.dir: s3://bucket/some/prefix needs cairn built with the 's3' feature";
        let mut c = JobConfig::default();
        let err = c
            .set(keys::CHECKPOINTS_DIR, "s3://bucket/some/prefix/")
            .unwrap_err();
        assert_eq!(err.to_string(), expected);
        assert_eq!(c.checkpoints_s3, None);
        let err = JobConfig::from_yaml_str("state.checkpoints.dir: s3://bucket/some/prefix\n")
            .unwrap_err();
        assert_eq!(err.to_string(), expected);
        // A malformed location is still a malformed value first.
        assert!(matches!(
            c.set(keys::CHECKPOINTS_DIR, "s3://"),
            Err(ConfigError::InvalidValue { .. })
        ));
        // The s3.* keys are accepted; a configuration built in code is refused by validate.
        c.set(keys::S3_ENDPOINT, "http://127.0.0.1:9000").unwrap();
        c.checkpoints_s3 = Some(crate::storage::S3Url::parse("s3://bucket/some/prefix").unwrap());
        assert_eq!(c.validate().unwrap_err().to_string(), expected);
    }

    #[test]
    fn validate_cross_key_consistency() {
        let mut c = JobConfig::default();
        assert!(c.validate().is_ok());
        c.set(keys::PARALLELISM, "200").unwrap();
        assert!(matches!(
            c.validate(),
            Err(ConfigError::Inconsistent { .. })
        ));
        c.set(keys::MAX_PARALLELISM, "256").unwrap();
        assert!(c.validate().is_ok());
        c.set_all([
            (keys::RESTART_STRATEGY, "exponential-delay"),
            (keys::EXP_INITIAL_BACKOFF, "5min"),
        ])
        .unwrap();
        let err = c.validate().unwrap_err();
        assert!(err.to_string().contains(keys::EXP_INITIAL_BACKOFF), "{err}");
    }

    #[test]
    fn serde_round_trip() {
        let mut c = JobConfig::default();
        c.set_all([
            (keys::CHECKPOINT_INTERVAL, "10s"),
            (keys::RESTART_STRATEGY, "exponential-delay"),
            (keys::CHECKPOINTS_DIR, "/tmp/x"),
        ])
        .unwrap();
        let text = serde_norway::to_string(&c).unwrap();
        let back: JobConfig = serde_norway::from_str(&text).unwrap();
        assert_eq!(back, c);
    }

    #[test]
    fn odd_yaml_is_rejected_naming_what_is_wrong() {
        // Keys that are not strings, tags, anchors and merge keys: each becomes an unknown
        // key named as written, never a silently accepted or dropped setting.
        for (text, key) in [
            ("? [a, b]\n: 1\n", "[a, b]"),
            ("1: 2\n", "1"),
            ("true: false\n", "true"),
            ("~: x\n", "null"),
            ("!tag parallelism.default: 2\n", "!tag parallelism.default"),
            ("a: &x 1\nb: *x\n", "a"),
            ("<<: {parallelism.default: 2}\n", "<<.parallelism.default"),
        ] {
            match JobConfig::from_yaml_str(text) {
                Err(ConfigError::UnknownKey { key: k }) => assert_eq!(k, key, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
        for (text, value) in [
            ("parallelism.default: !int 2\n", "!int 2"),
            ("parallelism.default: 1e3\n", "1000.0"),
        ] {
            match JobConfig::from_yaml_str(text) {
                Err(ConfigError::InvalidValue { key, value: v, .. }) => {
                    assert_eq!((key.as_str(), v.as_str()), (keys::PARALLELISM, value))
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        for (text, message) in [
            (
                "execution:\n  checkpointing:\n    interval: 99999999999999999999999999\n",
                "execution.checkpointing.interval: ",
            ),
            ("---\na: 1\n---\nb: 2\n", "more than one document"),
            ("\u{0}", "control characters"),
        ] {
            match JobConfig::from_yaml_str(text) {
                Err(ConfigError::Yaml { message: m, .. }) => {
                    assert!(m.contains(message), "{text:?}: {m}")
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }
}
