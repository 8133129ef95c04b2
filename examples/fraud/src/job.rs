//! The `fraud` job: its parameters, its graph and its output lines.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use cairn::api::{
    AggregateFunction, Collector, DataStream, JobGraph, StreamEnv, TimeWindow, WatermarkStrategy,
    WindowAssigner,
};
use cairn::connectors::{Encoder, FileSink, PrintSink, RateLimited};
use cairn_app::{Job, JobContext};

use crate::{detect, Alert, Transaction, TransactionSource, SMALL_CENTS};

/// `--transactions` unless given.
pub const DEFAULT_TRANSACTIONS: u64 = 100_000;
/// `--accounts` unless given.
pub const DEFAULT_ACCOUNTS: u64 = 500;
/// `--threshold` unless given, in dollars.
pub const DEFAULT_THRESHOLD_DOLLARS: f64 = 500.0;
/// The largest `--threshold`, in dollars (its cents stay far inside a `u64`).
const THRESHOLD_DOLLARS_MAX: f64 = 1e12;
/// The per-account totals are over tumbling event-time windows of this size.
pub const TOTALS_WINDOW: Duration = Duration::from_secs(60);

/// The parameters of `fraud run fraud` and `fraud submit fraud` (and of a JSON submission:
/// the same names, `--flag-name` as `flag_name`). A flag not given takes its default in
/// [`FraudParams::settings`], so every way of submitting behaves the same.
#[derive(clap::Args, Serialize, Deserialize, Debug, Clone, Default, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FraudParams {
    /// How many card transactions to generate (one per 100 ms of event time) [default: 100000].
    #[arg(long, value_name = "N")]
    pub transactions: Option<u64>,
    /// How many card accounts they are spread over [default: 500].
    #[arg(long, value_name = "K")]
    pub accounts: Option<u64>,
    /// Alert when a transaction above this many dollars follows a small one (under $1.00) on
    /// the same account within a minute; at least 1.00 [default: 500].
    #[arg(long, value_name = "DOLLARS")]
    pub threshold: Option<f64>,
    /// Read at most R transactions per second in all (0: as fast as possible) [default: 0].
    #[arg(long, value_name = "R")]
    pub rate: Option<u64>,
    /// Write the alerts to DIR/alerts and the per-minute totals to DIR/totals, exactly once
    /// (committed files never start with '.' or '_'); a relative DIR is made absolute where the
    /// command runs [default: print both to stdout].
    #[arg(long, value_name = "DIR", value_parser = absolute_dir)]
    pub output: Option<PathBuf>,
}

fn absolute_dir(dir: &str) -> Result<PathBuf, String> {
    std::path::absolute(dir).map_err(|e| format!("cannot resolve directory '{dir}': {e}"))
}

/// The parameters with their defaults applied, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// Transactions `0..transactions` are read.
    pub transactions: u64,
    /// Over accounts `0..accounts`.
    pub accounts: u64,
    /// A transaction above this many cents is large.
    pub threshold_cents: u64,
    /// Transactions per second in all (0: unpaced).
    pub rate: u64,
    /// The output directory, or stdout.
    pub output: Option<PathBuf>,
}

impl FraudParams {
    /// The settings these parameters mean, or a one-line error naming the flag.
    pub fn settings(&self) -> Result<Settings, String> {
        let accounts = self.accounts.unwrap_or(DEFAULT_ACCOUNTS);
        if accounts == 0 {
            return Err("--accounts must be at least 1".into());
        }
        let dollars = self.threshold.unwrap_or(DEFAULT_THRESHOLD_DOLLARS);
        let smallest = SMALL_CENTS as f64 / 100.0;
        if !(smallest..=THRESHOLD_DOLLARS_MAX).contains(&dollars) {
            return Err(format!(
                "--threshold must be between {smallest:.2} (no transaction may be small and large at once) and {THRESHOLD_DOLLARS_MAX:.0} dollars, got {dollars}"
            ));
        }
        // The flag makes its value absolute; a JSON submission could still send a relative
        // one, which each process of a cluster would resolve in its own directory.
        if let Some(dir) = self.output.as_ref().filter(|d| !d.is_absolute()) {
            return Err(format!(
                "--output must be an absolute directory, got '{}'",
                dir.display()
            ));
        }
        Ok(Settings {
            transactions: self.transactions.unwrap_or(DEFAULT_TRANSACTIONS),
            accounts,
            threshold_cents: (dollars * 100.0).round() as u64,
            rate: self.rate.unwrap_or(0),
            output: self.output.clone(),
        })
    }
}

/// An account's transactions in one window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct AccountTotal {
    /// The account.
    pub account: u64,
    /// The window's start (event time, ms since the epoch); it ends a minute later.
    pub window_start: i64,
    /// How many transactions.
    pub transactions: u64,
    /// Their sum in cents.
    pub total_cents: u64,
}

/// Counts and sums transactions: (count, cents).
#[derive(Clone)]
struct SumAmounts;

impl AggregateFunction<Transaction, (u64, u64)> for SumAmounts {
    type Acc = (u64, u64);
    fn create(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, acc: &mut (u64, u64), t: Transaction) {
        acc.0 += 1;
        acc.1 += t.amount_cents;
    }
    fn merge(&self, acc: &mut (u64, u64), other: &(u64, u64)) {
        acc.0 += other.0;
        acc.1 += other.1;
    }
    fn result(&self, acc: &(u64, u64)) -> (u64, u64) {
        *acc
    }
}

/// Each account's transactions per tumbling minute of event time, emitted when the watermark
/// passes the minute's end (window operator uid `minute-totals`).
pub fn minute_totals(transactions: DataStream<Transaction>) -> DataStream<AccountTotal> {
    transactions
        .key_by(|t: &Transaction| t.account)
        .window(WindowAssigner::tumbling(TOTALS_WINDOW))
        .aggregate_process(
            SumAmounts,
            |account: &u64, w: TimeWindow, sum: (u64, u64), out: &mut Collector<AccountTotal>| {
                out.collect(AccountTotal {
                    account: *account,
                    window_start: w.start,
                    transactions: sum.0,
                    total_cents: sum.1,
                })
            },
        )
        .uid("minute-totals")
        .name("minute-totals")
}

/// The job graph:
/// `transactions` → by account → `fraud-detector` → `alerts-sink`, and
/// `transactions` → by account → `minute-totals` → `totals-sink`.
pub fn build(s: &Settings) -> Result<JobGraph, String> {
    let env = StreamEnv::new();
    let transactions = env
        .source_with_watermarks(
            RateLimited::new(TransactionSource::new(s.transactions, s.accounts), s.rate),
            WatermarkStrategy::monotonous(|t: &Transaction| t.timestamp_ms),
        )
        .uid("transactions")
        .name("transactions");
    let alerts = detect(transactions.clone(), s.threshold_cents);
    let totals = minute_totals(transactions);
    match &s.output {
        Some(dir) => {
            alerts
                .sink(FileSink::new(dir.join("alerts"), line_encoder(alert_line)))
                .uid("alerts-sink")
                .name("alerts-sink");
            totals
                .sink(FileSink::new(dir.join("totals"), line_encoder(total_line)))
                .uid("totals-sink")
                .name("totals-sink");
        }
        None => {
            alerts
                .sink(PrintSink::new(tagged_encoder("alert", alert_line)))
                .uid("alerts-sink")
                .name("alerts-print");
            totals
                .sink(PrintSink::new(tagged_encoder("total", total_line)))
                .uid("totals-sink")
                .name("totals-print");
        }
    }
    env.build("fraud")
}

/// The `fraud` job of the `fraud` binary.
pub struct FraudDetection;

impl Job for FraudDetection {
    type Params = FraudParams;

    fn name(&self) -> &str {
        "fraud"
    }

    fn about(&self) -> &str {
        "Flag card fraud (a small transaction followed within a minute by a large one on the same account) and total each account's transactions per minute, over generated transactions"
    }

    fn build(&self, params: &FraudParams, _: &JobContext) -> Result<JobGraph, String> {
        build(&params.settings()?)
    }

    fn source_records(&self, params: &FraudParams, _: &JobContext) -> Result<Option<u64>, String> {
        Ok(Some(params.settings()?.transactions))
    }

    fn paths(params: &mut FraudParams) -> Vec<&mut PathBuf> {
        params.output.iter_mut().collect()
    }
}

/// `ACCOUNT  SMALL_ID  SMALL_TIME  SMALL_AMOUNT  LARGE_ID  LARGE_TIME  LARGE_AMOUNT`,
/// tab-separated; times in UTC, amounts in dollars.
pub fn alert_line(a: &Alert) -> String {
    format!(
        "{}\t{}\t{}\t{}\t{}\t{}\t{}",
        a.small.account,
        a.small.id,
        utc(a.small.timestamp_ms),
        dollars(a.small.amount_cents),
        a.large.id,
        utc(a.large.timestamp_ms),
        dollars(a.large.amount_cents),
    )
}

/// `WINDOW_START  ACCOUNT  TRANSACTIONS  TOTAL`, tab-separated; the time in UTC, the total in
/// dollars.
pub fn total_line(t: &AccountTotal) -> String {
    format!(
        "{}\t{}\t{}\t{}",
        utc(t.window_start),
        t.account,
        t.transactions,
        dollars(t.total_cents)
    )
}

fn line_encoder<T: 'static>(line: fn(&T) -> String) -> Encoder<T> {
    Arc::new(move |r: &T, out: &mut Vec<u8>| {
        out.extend_from_slice(line(r).as_bytes());
        out.push(b'\n');
    })
}

/// Lines on stdout start with what they are (`alert` or `total`), the two outputs being mixed.
fn tagged_encoder<T: 'static>(tag: &'static str, line: fn(&T) -> String) -> Encoder<T> {
    Arc::new(move |r: &T, out: &mut Vec<u8>| {
        out.extend_from_slice(tag.as_bytes());
        out.push(b'\t');
        out.extend_from_slice(line(r).as_bytes());
        out.push(b'\n');
    })
}

/// Cents as dollars: `1234` → `12.34`.
pub fn dollars(cents: u64) -> String {
    format!("{}.{:02}", cents / 100, cents % 100)
}

/// Milliseconds since the epoch as an ISO 8601 UTC time, e.g. `2024-01-01T00:01:30.500Z`.
pub fn utc(ms: i64) -> String {
    const DAY_MS: i64 = 86_400_000;
    let (days, in_day) = (ms.div_euclid(DAY_MS), ms.rem_euclid(DAY_MS));
    let (year, month, day) = cairn_app::human::civil_date(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_apply_and_bad_flags_are_named() {
        let s = FraudParams::default().settings().unwrap();
        assert_eq!(
            s,
            Settings {
                transactions: DEFAULT_TRANSACTIONS,
                accounts: DEFAULT_ACCOUNTS,
                threshold_cents: 50_000,
                rate: 0,
                output: None,
            }
        );
        let with = |p: FraudParams| p.settings();
        let threshold = |d: f64| FraudParams {
            threshold: Some(d),
            ..FraudParams::default()
        };
        assert_eq!(with(threshold(12.345)).unwrap().threshold_cents, 1_235);
        assert_eq!(with(threshold(1.0)).unwrap().threshold_cents, 100);
        for bad in [0.99, -5.0, f64::NAN, f64::INFINITY, 2e12] {
            let e = with(threshold(bad)).unwrap_err();
            assert!(e.starts_with("--threshold must be"), "{e}");
        }
        let e = with(FraudParams {
            accounts: Some(0),
            ..FraudParams::default()
        })
        .unwrap_err();
        assert_eq!(e, "--accounts must be at least 1");
        let e = with(FraudParams {
            output: Some(PathBuf::from("out")),
            ..FraudParams::default()
        })
        .unwrap_err();
        assert_eq!(e, "--output must be an absolute directory, got 'out'");
    }

    #[test]
    fn json_submissions_take_the_flags_names_and_refuse_others() {
        let p: FraudParams =
            serde_json::from_str(r#"{"transactions": 10, "threshold": 750.5}"#).unwrap();
        assert_eq!(
            (p.transactions, p.threshold, p.accounts),
            (Some(10), Some(750.5), None)
        );
        assert!(serde_json::from_str::<FraudParams>(r#"{"treshold": 1}"#).is_err());
    }

    #[test]
    fn lines_show_utc_times_and_dollars() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(
            utc(crate::BASE_TIME_MS + 90_500),
            "2024-01-01T00:01:30.500Z"
        );
        assert_eq!(utc(951_782_400_000 + 1), "2000-02-29T00:00:00.001Z");
        assert_eq!(utc(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(
            (dollars(5), dollars(123_456)),
            ("0.05".into(), "1234.56".into())
        );
        let t = AccountTotal {
            account: 7,
            window_start: crate::BASE_TIME_MS + 60_000,
            transactions: 3,
            total_cents: 1_001,
        };
        assert_eq!(total_line(&t), "2024-01-01T00:01:00.000Z\t7\t3\t10.01");
    }
}
