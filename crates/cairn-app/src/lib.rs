//! cairn's whole command line as a library: an application registers its jobs and hands over,
//! and its binary has every verb of `cairn` for them — `run`, `coordinator`, `worker`,
//! `submit`, `list`, `status`, `cancel`, `stop`, `savepoint`, `checkpoints` — with the same
//! flags, configuration keys, REST API, metrics, dashboard, progress and summary lines. The
//! `cairn` binary is this app with the built-in jobs registered.
//!
//! ```no_run
//! # use cairn::api::{JobGraph, StreamEnv};
//! # use cairn::connectors::{DiscardSink, GeneratorSource};
//! use cairn_app::{App, Job, JobContext};
//!
//! #[derive(clap::Args, serde::Serialize, serde::Deserialize, Debug, Default)]
//! #[serde(default, deny_unknown_fields)]
//! struct Params {
//!     /// How many records to generate.
//!     #[arg(long, default_value_t = 1000)]
//!     records: u64,
//! }
//!
//! struct Generate;
//!
//! impl Job for Generate {
//!     type Params = Params;
//!     fn name(&self) -> &str {
//!         "generate"
//!     }
//!     fn build(&self, p: &Params, _: &JobContext) -> Result<JobGraph, String> {
//!         let env = StreamEnv::new();
//!         env.source(GeneratorSource::new(p.records, 10)).uid("source").sink(DiscardSink).uid("sink");
//!         env.build("generate")
//!     }
//! }
//!
//! fn main() -> std::process::ExitCode {
//!     App::new("myapp").job(Generate).run()
//! }
//! ```
//!
//! Every user error ends with one line on stderr and exit code 1 (a command-line parse error:
//! clap's message on one line and exit code 2); nothing panics on input.

mod checkpoints;
pub mod client;
mod cluster;
pub mod human;
mod job;
mod remote;
mod run;
mod savepoint;
#[cfg(feature = "sql")]
mod sql;

use std::ffi::OsString;
use std::process::ExitCode;

use clap::{Arg, ArgMatches, Args, Command, FromArgMatches, Subcommand};

pub use cairn;
pub use job::{Job, JobContext};
pub use run::{build_config, JobOptions, RunArgs};

use crate::job::{AnyJob, Jobs};

// The verbs whose arguments do not depend on the registered jobs (a doc comment here would
// become the about text of the whole command line).
#[derive(Subcommand, Debug)]
enum Verb {
    /// List the checkpoints retained in a checkpoint directory.
    Checkpoints(checkpoints::CheckpointsArgs),
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

/// A verb an application adds (the `cairn` binary's `bench`).
type Handler = Box<dyn Fn(&ArgMatches) -> anyhow::Result<()>>;

/// An application: its name, its jobs, and any verbs of its own.
pub struct App {
    name: String,
    about: Option<String>,
    version: Option<String>,
    jobs: Jobs,
    commands: Vec<(Command, Handler)>,
}

impl App {
    /// An application named `name` (its binary's name in `--help`), with no jobs yet.
    pub fn new(name: impl Into<String>) -> App {
        #[allow(unused_mut)]
        let mut jobs = Jobs::default();
        // Every app runs SQL scripts, so any of its workers can run any script.
        #[cfg(feature = "sql")]
        jobs.add(sql::SqlJob);
        App {
            name: name.into(),
            about: None,
            version: None,
            jobs,
            commands: Vec::new(),
        }
    }

    /// The line `--help` shows under the name.
    pub fn about(mut self, about: impl Into<String>) -> App {
        self.about = Some(about.into());
        self
    }

    /// The version `--version` prints.
    pub fn version(mut self, version: impl Into<String>) -> App {
        self.version = Some(version.into());
        self
    }

    /// Registers a job. Its parameters become the flags of `run NAME` and `submit NAME`.
    ///
    /// # Panics
    /// If a job of the same name is registered already, or a parameter's name is one of the
    /// options every run takes (`--parallelism`, `--from`, ...): both are programming errors
    /// found the first time the binary starts.
    pub fn job<J: Job>(mut self, job: J) -> App {
        self.jobs.add(job);
        if let Some(added) = self.jobs.all().last() {
            let taken = option_ids(RunArgs::augment_args(Command::new("run")));
            for id in option_ids(added.augment(Command::new("params"))) {
                assert!(
                    !taken.contains(&id),
                    "job '{}' has a parameter '{id}', which is already an option of every run; rename it",
                    added.name()
                );
            }
        }
        self
    }

    /// Adds a verb of the application's own, run by `handler` with its parsed arguments.
    pub fn command(
        mut self,
        command: Command,
        handler: impl Fn(&ArgMatches) -> anyhow::Result<()> + 'static,
    ) -> App {
        self.commands.push((command, Box::new(handler)));
        self
    }

    /// Parses the process's arguments and runs the verb they name; the exit code says how it
    /// went.
    pub fn run(self) -> ExitCode {
        self.run_from(std::env::args_os())
    }

    /// As [`run`](App::run), with the arguments given (the first is the binary's name).
    pub fn run_from<I, T>(self, args: I) -> ExitCode
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        #[cfg(feature = "sql")]
        let args = match sql::rewrite(args) {
            Ok(Some(args)) => args,
            Ok(None) => return ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::FAILURE;
            }
        };
        let matches = match self.command_line().try_get_matches_from(&args) {
            Ok(m) => m,
            Err(e) => {
                use clap::error::ErrorKind;
                let code = ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
                match e.kind() {
                    ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                        let _ = e.print();
                    }
                    _ => eprintln!("{}", clap_error_line(&e.render().to_string())),
                }
                return code;
            }
        };
        init_logging(matches.get_one::<String>("log").map(String::as_str));
        if let Err(e) = cairn::failpoint::validate_env() {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
        match self.dispatch(&matches, &args) {
            Ok(code) => code,
            Err(e) => {
                eprintln!("error: {}", one_line(&e));
                ExitCode::FAILURE
            }
        }
    }

    /// The whole command line: the fixed verbs, `run` and `submit` with a subcommand per job,
    /// and the application's own verbs.
    fn command_line(&self) -> Command {
        let mut cmd = Command::new(self.name.clone())
            .about(
                self.about
                    .clone()
                    .unwrap_or_else(|| "A stream processor with exactly-once state and sinks (cairn).".into()),
            )
            .subcommand_required(true)
            .arg_required_else_help(true)
            .arg(
                Arg::new("log")
                    .long("log")
                    .global(true)
                    .value_name("FILTER")
                    .help("Log filter (tracing syntax), e.g. `info`, `cairn=debug`. Also read from RUST_LOG."),
            );
        if let Some(v) = &self.version {
            cmd = cmd.version(v.clone());
        }
        cmd = cmd.subcommand(self.run_command());
        cmd = Verb::augment_subcommands(cmd);
        cmd = cmd.subcommand(self.submit_command());
        #[cfg(feature = "sql")]
        {
            // Shown in --help; the command line is rewritten to `run sql -e …` before parsing.
            cmd = cmd.subcommand(
                Command::new("sql")
                    .about("Run a script of Flink SQL statements embedded: `sql FILE.sql` or `sql -e \"…\"`, with every option of `run` (see `run sql --help`).")
                    .arg(Arg::new("args").num_args(0..).trailing_var_arg(true).allow_hyphen_values(true)),
            );
        }
        for (c, _) in &self.commands {
            cmd = cmd.subcommand(c.clone());
        }
        cmd
    }

    fn jobs_command(&self, name: &'static str, about: &'static str) -> Command {
        Command::new(name)
            .about(about)
            .subcommand_required(true)
            .subcommand_value_name("JOB")
            .subcommand_help_heading("Jobs")
            // An unknown job is our one-line error naming the registered ones, not clap's.
            .allow_external_subcommands(true)
    }

    fn run_command(&self) -> Command {
        let mut cmd = self.jobs_command("run", "Run a job in this process (embedded mode).");
        for job in self.jobs.all() {
            let params = job.augment(job_command(job.as_ref()));
            let sub = RunArgs::augment_args(params.next_help_heading(RUN_OPTIONS));
            cmd = cmd.subcommand(with_about(sub, job.about()));
        }
        cmd
    }

    fn submit_command(&self) -> Command {
        let about = "Submit a job to a coordinator's REST API; prints the new job id.";
        let mut cmd = with_about(
            client::RestArgs::augment_args(self.jobs_command("submit", about)),
            about,
        );
        for id in ["rest", "rest_token"] {
            cmd = cmd.mut_arg(id, |a| a.global(true));
        }
        for job in self.jobs.all() {
            cmd = cmd.subcommand(submit_job_command(job.as_ref()));
        }
        cmd
    }

    fn dispatch(&self, matches: &ArgMatches, argv: &[OsString]) -> anyhow::Result<ExitCode> {
        let Some((verb, sub)) = matches.subcommand() else {
            anyhow::bail!("no command given; see --help");
        };
        match verb {
            "run" => {
                let (job, m) = self.job_of(sub)?;
                let args = RunArgs::from_arg_matches(m)?;
                run::run(
                    job.as_ref(),
                    &job.params_from(m).map_err(anyhow::Error::msg)?,
                    args,
                    argv,
                )
            }
            "submit" => {
                let rest = client::RestArgs::from_arg_matches(sub)?;
                let (job, m) = self.job_of(sub)?;
                let options = JobOptions::from_arg_matches(m)?;
                let params = job.params_from(m).map_err(anyhow::Error::msg)?;
                remote::submit(&rest, job.as_ref(), params, &options)?;
                Ok(ExitCode::SUCCESS)
            }
            _ => {
                if let Some((_, handler)) = self.commands.iter().find(|(c, _)| c.get_name() == verb)
                {
                    handler(sub)?;
                    return Ok(ExitCode::SUCCESS);
                }
                match Verb::from_arg_matches(matches)? {
                    Verb::Checkpoints(args) => checkpoints::run(args),
                    Verb::List(args) => remote::list(args),
                    Verb::Status(args) => remote::status(args),
                    Verb::Cancel(args) => remote::cancel(args),
                    Verb::Savepoint(args) => savepoint::savepoint(args),
                    Verb::Stop(args) => savepoint::stop(args),
                    Verb::Coordinator(args) => cluster::coordinator(args, self.jobs.clone()),
                    Verb::Worker(args) => cluster::worker(args, self.jobs.clone()),
                }?;
                Ok(ExitCode::SUCCESS)
            }
        }
    }

    /// The job `run JOB`/`submit JOB` names, with its arguments.
    fn job_of<'m>(
        &self,
        matches: &'m ArgMatches,
    ) -> anyhow::Result<(&std::sync::Arc<dyn AnyJob>, &'m ArgMatches)> {
        let Some((name, m)) = matches.subcommand() else {
            anyhow::bail!("name a job; jobs: {}", self.jobs.names());
        };
        Ok((self.jobs.find(name).map_err(anyhow::Error::msg)?, m))
    }
}

/// `submit JOB`'s arguments: the job's parameters and the job options (the coordinator
/// parses a REST submission's `args` with it too).
pub(crate) fn submit_job_command(job: &dyn AnyJob) -> Command {
    let params = job.augment(job_command(job));
    let cmd = JobOptions::augment_args(params.next_help_heading(RUN_OPTIONS));
    with_about(cmd, job.about())
}

/// The help heading of the options every job takes.
const RUN_OPTIONS: &str = "Run options";

/// A job's subcommand, its parameters under their own help heading.
fn job_command(job: &dyn AnyJob) -> Command {
    Command::new(job.name().to_string()).next_help_heading(format!("Parameters of {}", job.name()))
}

/// `cmd` with `about` as its help text: the derived argument groups it was built from set
/// their doc comments as the text.
fn with_about(cmd: Command, about: &str) -> Command {
    use clap::builder::{Resettable, StyledStr};
    let about = match about {
        "" => Resettable::Reset,
        text => Resettable::Value(StyledStr::from(text.to_string())),
    };
    cmd.about(about).long_about(Resettable::Reset)
}

/// The ids of a command's arguments (clap's `--help` and `--version` aside).
fn option_ids(cmd: Command) -> Vec<String> {
    cmd.get_arguments()
        .map(|a| a.get_id().to_string())
        .filter(|id| id != "help" && id != "version")
        .collect()
}

fn init_logging(filter: Option<&str>) {
    let filter = filter
        .map(str::to_string)
        .or_else(|| std::env::var("RUST_LOG").ok())
        .unwrap_or_else(|| "warn,cairn=info".to_string());
    let env_filter = tracing_subscriber::EnvFilter::try_new(&filter)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .compact()
        .try_init();
}

/// A command-line parse error as clap renders it (the error, tips, usage, a pointer to
/// `--help`, over several lines) on one line: `error: …`, its tips, and the `--help` to read.
fn clap_error_line(rendered: &str) -> String {
    let mut line = String::new();
    let mut help = None;
    for text in rendered.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(usage) = text.strip_prefix("Usage: ") {
            // `cairn run wordcount [OPTIONS]`: the command's words, without the placeholders.
            let words: Vec<&str> = usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect();
            help = Some(format!("see '{} --help'", words.join(" ")));
        } else if text.starts_with("For more information") {
            continue;
        } else {
            // A list continues its line (`…not provided: --x`, `… [possible values: …]`).
            let sep = match () {
                _ if line.is_empty() => "",
                _ if line.ends_with(':') || text.starts_with('[') => " ",
                _ => "; ",
            };
            line.push_str(sep);
            line.push_str(text);
        }
    }
    if let Some(help) = help {
        line.push_str("; ");
        line.push_str(&help);
    }
    line
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

#[cfg(test)]
mod tests {
    use super::clap_error_line;

    #[test]
    fn a_clap_error_becomes_one_line_with_its_tips_and_the_help_to_read() {
        let rendered = "error: unexpected argument '--generat' found\n\n  tip: a similar argument exists: '--generate'\n\nUsage: cairn run wordcount --generate <N> [OPTIONS]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_error_line(rendered),
            "error: unexpected argument '--generat' found; tip: a similar argument exists: '--generate'; see 'cairn run wordcount --help'"
        );
        let missing = "error: the following required arguments were not provided:\n  --pg-output <URL>\n\nUsage: cairn run wordcount --pg-table <NAME> --pg-output <URL>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            clap_error_line(missing),
            "error: the following required arguments were not provided: --pg-output <URL>; see 'cairn run wordcount --help'"
        );
    }
}
