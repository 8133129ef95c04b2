//! `cairn`: the command-line interface.
//!
//! Every user error ends with one line on stderr and a non-zero exit code; nothing panics on
//! input.

mod bench;
mod checkpoints;
mod human;
mod run;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// cairn — a stream processor with exactly-once state and sinks.
#[derive(Parser, Debug)]
#[command(name = "cairn", version, about, long_about = None)]
struct Cli {
    /// Log filter (tracing syntax), e.g. `info`, `cairn=debug`. Also read from RUST_LOG.
    #[arg(long, global = true, value_name = "FILTER")]
    log: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a built-in job in this process (embedded mode).
    Run(Box<run::RunArgs>),
    /// List the checkpoints retained in a checkpoint directory.
    Checkpoints(checkpoints::CheckpointsArgs),
    /// Measure throughput of wordcount under several checkpoint settings, in one run.
    Bench(bench::BenchArgs),
}

fn init_logging(filter: Option<&str>) {
    let filter = filter
        .map(str::to_string)
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "warn,cairn=info".to_string());
    let env_filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .compact()
        .init();
}

/// The error and its causes on one line; a cause already spelled out by the message before it
/// (many library errors print their source) is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !msg.contains(&text) {
            if !msg.is_empty() {
                msg.push_str(": ");
            }
            msg.push_str(&text);
        }
    }
    msg.replace('\n', " ")
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log.as_deref());
    let result = match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Checkpoints(args) => checkpoints::run(args),
        Command::Bench(args) => bench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}
