//! `cairn`: the cairn app (`cairn_app::App`) with the built-in jobs registered, through the
//! same public path as any application's, plus the `bench` verb.

mod bench;
mod builtin;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;

use clap::{Args, Command, FromArgMatches};

fn main() -> ExitCode {
    let bench = bench::BenchArgs::augment_args(Command::new("bench").about(
        "Measure, in one run: wordcount throughput, checkpoint modes, the cluster, the Nexmark queries, or checkpoints vs savepoints (--suite).",
    ));
    cairn_app::App::new("cairn")
        .version(env!("CARGO_PKG_VERSION"))
        .about("cairn — a stream processor with exactly-once state and sinks.")
        .job(builtin::Wordcount)
        .job(builtin::Backpressure)
        .job(builtin::Pipelines)
        .job(builtin::Nexmark)
        .command(bench, |m| {
            bench::run(bench::BenchArgs::from_arg_matches(m)?)
        })
        .run()
}
