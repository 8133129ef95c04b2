//! Fraud detection on card transactions, after Flink's tutorial "Fraud Detection with the
//! DataStream API", as a cairn application (the `fraud` binary).
//!
//! ```text
//!                                  ┌─ key_by(account) ─▶ fraud-detector ─▶ alerts-sink  (DIR/alerts)
//! transactions (generated, ────────┤                     (flag + timer)
//!   event time, watermarks)        └─ key_by(account) ─▶ minute-totals ──▶ totals-sink  (DIR/totals)
//!                                                        (tumbling 1 min)
//! ```
//!
//! - [`transaction`]: transaction `i` is a pure function of `i` (and the number of accounts);
//!   [`TransactionSource`] reads them split by account, so each account's transactions arrive
//!   in event-time order, whatever the parallelism and after any restore.
//! - [`FraudDetector`]: keyed state and an event-time timer per account; an [`Alert`] when a
//!   small transaction (under $1.00) is followed, as the account's next transaction and less
//!   than a minute later, by one above the threshold.
//! - [`minute_totals`]: each account's count and sum per tumbling minute of event time.
//! - [`build`]: the job graph, with exactly-once file sinks and a stable uid on every operator.
//!
//! The binary registers [`FraudDetection`] with [`cairn_app::App`], which gives it every verb of
//! `cairn`: `fraud run fraud …`, `fraud coordinator`, `fraud worker`, `fraud submit fraud …`.

mod detector;
mod job;
mod transactions;

pub use detector::{detect, Alert, FraudDetector, ONE_MINUTE_MS, SMALL_CENTS};
pub use job::{
    alert_line, build, dollars, minute_totals, total_line, utc, AccountTotal, FraudDetection,
    FraudParams, Settings, DEFAULT_ACCOUNTS, DEFAULT_THRESHOLD_DOLLARS, DEFAULT_TRANSACTIONS,
    TOTALS_WINDOW,
};
pub use transactions::{transaction, Transaction, TransactionSource, BASE_TIME_MS, SPACING_MS};
