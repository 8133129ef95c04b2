//! `cairn`: the command-line interface.
//!
//! Every user error ends with one line on stderr and a non-zero exit code; nothing panics on
//! input.

mod bench;
mod checkpoints;
mod client;
mod cluster;
mod human;
mod remote;
mod run;
mod savepoint;

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
    /// Measure, in one run: wordcount throughput, checkpoint modes, the cluster, the Nexmark
    /// queries, or checkpoints vs savepoints (--suite).
    Bench(bench::BenchArgs),
    /// Submit a built-in job to a coordinator's REST API; prints the new job id.
    Submit(remote::SubmitArgs),
    /// List the jobs of a REST API (coordinator or `run --rest`): id, state, name.
    List(remote::ListArgs),
    /// Show a job's state, restarts, times, failure cause and checkpoint counts.
    Status(remote::JobArgs),
    /// Cancel a job through the REST API.
    Cancel(remote::JobArgs),
    /// Take a savepoint of a running job (REST API); or `info PATH` / `dispose PATH` one.
    Savepoint(savepoint::SavepointArgs),
    /// Stop a job with a savepoint: sources stop, the savepoint is taken, sinks commit, the job
    /// ends FINISHED; prints the savepoint's path.
    Stop(savepoint::StopArgs),
    /// Run the cluster coordinator: job manager, checkpoint coordinator, REST API.
    Coordinator(cluster::CoordinatorArgs),
    /// Run a cluster worker offering task slots.
    Worker(cluster::WorkerArgs),
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
    if let Err(e) = cairn::failpoint::validate_env() {
        eprintln!("error: {e}");
        return ExitCode::FAILURE;
    }
    let result = match cli.command {
        Command::Run(args) => run::run(*args),
        Command::Checkpoints(args) => checkpoints::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Coordinator(args) => cluster::coordinator(args),
        Command::Worker(args) => cluster::worker(args),
        Command::Submit(args) => remote::submit(args),
        Command::List(args) => remote::list(args),
        Command::Status(args) => remote::status(args),
        Command::Cancel(args) => remote::cancel(args),
        Command::Savepoint(args) => savepoint::savepoint(args),
        Command::Stop(args) => savepoint::stop(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}
