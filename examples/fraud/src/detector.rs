//! The fraud rule: a small transaction immediately followed, within a minute, by a large one
//! on the same account — a thief testing a stolen card before emptying it.

use serde::{Deserialize, Serialize};

use cairn::api::{Collector, DataStream, KeyedProcessFunction};
use cairn::state::{KeyedContext, TimeDomain, ValueState};
use cairn::{TaskError, TaskResult};

use crate::Transaction;

/// A transaction below this many cents ($1.00) is small.
pub const SMALL_CENTS: u64 = 100;
/// How soon after a small transaction a large one is suspicious: one minute of event time.
pub const ONE_MINUTE_MS: i64 = 60_000;

/// A suspicious pair of transactions on one account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Alert {
    /// The small transaction.
    pub small: Transaction,
    /// The large one right after it.
    pub large: Transaction,
}

/// Flink's `FraudDetector`, on event time. Per account (the key) it remembers the last
/// transaction if it was small — the flag — with an event-time timer that clears it a minute
/// later. The account's next transaction ends the pattern: if it is large and less than a
/// minute later, that is an alert. Either way the flag goes, and the transaction sets it again
/// if it is small itself.
///
/// "Next" is in the order the account's transactions arrive, which must be their event-time
/// order: [`TransactionSource`](crate::TransactionSource) reads each account from one split.
#[derive(Clone)]
pub struct FraudDetector {
    /// A transaction above this many cents is large.
    threshold_cents: u64,
    small: Option<ValueState<Transaction>>,
}

impl FraudDetector {
    /// A detector for which transactions above `threshold_cents` are large.
    pub fn new(threshold_cents: u64) -> Self {
        FraudDetector {
            threshold_cents,
            small: None,
        }
    }

    fn flag(&self) -> TaskResult<&ValueState<Transaction>> {
        self.small
            .as_ref()
            .ok_or_else(|| TaskError::msg("fraud detector state used before open"))
    }
}

impl KeyedProcessFunction<u64, Transaction, Alert> for FraudDetector {
    fn open(&mut self, ctx: &mut KeyedContext<u64>) -> TaskResult {
        self.small = Some(ctx.value_state("small-transaction")?);
        Ok(())
    }

    fn process(
        &mut self,
        t: Transaction,
        ctx: &mut KeyedContext<u64>,
        out: &mut Collector<Alert>,
    ) -> TaskResult {
        let flag = self.flag()?;
        if let Some(small) = flag.value(ctx)?.copied() {
            // The time is checked here rather than left to the timer: the watermark is the
            // minimum over every input and is sent periodically, so it may not have passed
            // the minute yet when this account's next transaction comes.
            if t.amount_cents > self.threshold_cents
                && t.timestamp_ms.saturating_sub(small.timestamp_ms) < ONE_MINUTE_MS
            {
                out.collect(Alert { small, large: t });
            }
            flag.clear(ctx)?;
            ctx.delete_event_time_timer(minute_after(&small))?;
        }
        if t.amount_cents < SMALL_CENTS {
            flag.update(ctx, t)?;
            ctx.register_event_time_timer(minute_after(&t))?;
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<u64>,
        _out: &mut Collector<Alert>,
    ) -> TaskResult {
        let flag = self.flag()?;
        // The small transaction's minute is over: clear the flag, so that an account that
        // stays quiet keeps no state.
        if flag
            .value(ctx)?
            .is_some_and(|small| minute_after(small) <= time)
        {
            flag.clear(ctx)?;
        }
        Ok(())
    }
}

/// When the flag a small transaction `t` set is cleared.
fn minute_after(t: &Transaction) -> i64 {
    t.timestamp_ms.saturating_add(ONE_MINUTE_MS)
}

/// The alerts of `transactions` (with watermarks: the timers are on event time), keyed by
/// account and checked by a [`FraudDetector`] with uid `fraud-detector`.
pub fn detect(transactions: DataStream<Transaction>, threshold_cents: u64) -> DataStream<Alert> {
    transactions
        .key_by(|t: &Transaction| t.account)
        .process(FraudDetector::new(threshold_cents))
        .uid("fraud-detector")
        .name("fraud-detector")
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use cairn::api::{StreamEnv, WatermarkStrategy};
    use cairn::config::JobConfig;
    use cairn::connectors::{RateLimited, SequenceSource};
    use cairn::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkWriter};
    use cairn::runtime::{run_job, RunOptions};

    use super::*;
    use crate::BASE_TIME_MS;

    const fn tx(id: u64, at_ms: i64, account: u64, amount_cents: u64) -> Transaction {
        Transaction {
            id,
            account,
            amount_cents,
            timestamp_ms: BASE_TIME_MS + at_ms,
        }
    }

    /// A hand-made sequence in event-time order; the comments say what the rule makes of it
    /// with the threshold at $500.00.
    const CASES: [Transaction; 22] = [
        tx(0, 0, 1, 50),               // small
        tx(1, 10_000, 1, 60_000),      // large 10 s later: alert (0, 1)
        tx(2, 20_000, 2, 99),          // small (the largest small amount)
        tx(3, 30_000, 2, 50_000),      // exactly the threshold: not large; ends the pattern
        tx(4, 40_000, 2, 90_000),      // large, but not right after a small one
        tx(5, 50_000, 3, 100),         // $1.00 is not small
        tx(6, 55_000, 3, 70_000),      // large after no small one
        tx(7, 60_000, 4, 10),          // small
        tx(8, 90_000, 5, 20),          // small, on another account
        tx(9, 100_000, 4, 200),        // everyday: ends account 4's pattern
        tx(10, 110_000, 4, 80_000),    // large, not right after the small one
        tx(11, 120_000, 5, 500_000),   // large 30 s after 8 on account 5: alert (8, 11)
        tx(12, 130_000, 6, 30),        // small
        tx(13, 190_000, 6, 99_900),    // large exactly a minute later: too late
        tx(14, 200_000, 7, 40),        // small
        tx(15, 210_000, 7, 45),        // small again: the flag is renewed
        tx(16, 269_999, 7, 50_100),    // large 59.999 s after 15: alert (15, 16)
        tx(17, 400_000, 8, 5),         // small
        tx(18, 500_000, 9, 100),       // event time passes 17's minute: its timer is due
        tx(19, 520_000, 8, 1_000_000), // large, 120 s after the small one: none
        tx(20, 530_000, 1, 1),         // small
        tx(21, 535_000, 1, 50_001),    // a cent above the threshold: alert (20, 21)
    ];

    fn case(i: u64) -> Transaction {
        CASES[i as usize]
    }

    /// Keeps the alerts written.
    #[derive(Clone, Default)]
    struct Collect(Arc<Mutex<Vec<Alert>>>);

    struct CollectWriter(Arc<Mutex<Vec<Alert>>>);

    impl Sink<Alert> for Collect {
        fn guarantee(&self) -> SinkGuarantee {
            SinkGuarantee::None
        }
        fn create_writer(&self, _: SinkContext) -> TaskResult<Box<dyn SinkWriter<Alert>>> {
            Ok(Box::new(CollectWriter(self.0.clone())))
        }
    }

    impl SinkWriter<Alert> for CollectWriter {
        fn write(&mut self, batch: &mut Vec<Alert>) -> TaskResult {
            self.0
                .lock()
                .map_err(|_| TaskError::msg("poisoned"))?
                .append(batch);
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

    /// The (small, large) ids of the alerts on `CASES`, read by one source subtask and checked
    /// by two detector subtasks. `paced`: the source reads 200 transactions per second and
    /// sends a watermark every millisecond, so that timers fire between the transactions;
    /// otherwise it reads them at once and the timers fire at the end.
    fn alerts(threshold_cents: u64, paced: bool) -> Vec<(u64, u64)> {
        let env = StreamEnv::new();
        let transactions = env
            .source_with_watermarks(
                RateLimited::new(
                    SequenceSource::new(CASES.len() as u64, 0, case),
                    if paced { 200 } else { 0 },
                ),
                WatermarkStrategy::monotonous(|t: &Transaction| t.timestamp_ms),
            )
            .uid("cases")
            .parallelism(1);
        let collect = Collect::default();
        detect(transactions, threshold_cents)
            .sink(collect.clone())
            .uid("collect");
        let graph = env.build("cases").unwrap();
        let mut config = JobConfig::default();
        config.set("parallelism.default", "2").unwrap();
        if paced {
            config
                .set("pipeline.auto-watermark-interval", "1ms")
                .unwrap();
        }
        run_job(
            &graph,
            RunOptions {
                config,
                ..RunOptions::default()
            },
        )
        .unwrap();
        let mut got: Vec<(u64, u64)> = collect
            .0
            .lock()
            .unwrap()
            .iter()
            .map(|a| {
                assert_eq!(a.small.account, a.large.account, "{a:?}");
                (a.small.id, a.large.id)
            })
            .collect();
        got.sort_unstable();
        got
    }

    #[test]
    fn alerts_exactly_when_a_small_transaction_is_followed_within_a_minute_by_a_large_one() {
        // Whenever the watermark fires the timers, the alerts are the same.
        for paced in [false, true] {
            let got = alerts(50_000, paced);
            assert_eq!(got, [(0, 1), (8, 11), (15, 16), (20, 21)], "paced: {paced}");
        }
    }

    #[test]
    fn the_threshold_decides_what_is_large() {
        // At $499.99, transaction 3 ($500.00) is large too. At $5,000.00 none is an alert: 11
        // ($5,000.00) is not above it, and 19's small transaction is two minutes old.
        let got = alerts(49_999, false);
        assert_eq!(got, [(0, 1), (2, 3), (8, 11), (15, 16), (20, 21)]);
        assert_eq!(alerts(500_000, false), []);
    }
}
