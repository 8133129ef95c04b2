//! `fraud`: the fraud detection job with every verb of cairn's command line — `fraud run
//! fraud …` embedded, or `fraud coordinator`, `fraud worker` and `fraud submit fraud …` as a
//! cluster.

use std::process::ExitCode;

fn main() -> ExitCode {
    cairn_app::App::new("fraud")
        .about("Fraud detection on card transactions, a cairn application (after Flink's DataStream tutorial).")
        .version(env!("CARGO_PKG_VERSION"))
        .job(cairn_example_fraud::FraudDetection)
        .run()
}
