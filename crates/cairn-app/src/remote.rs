//! Client commands against a running REST API: `submit`, `list`, `status`, `cancel`, and
//! `checkpoints ID --rest URL`.

use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cairn::config::keys;
use cairn_rest::SubmitRequest;
use clap::Args;
use serde_json::Value;

use crate::client::{segment, Method, RestArgs};
use crate::human;
use crate::job::{AnyJob, JobContext};
use crate::run::JobOptions;

/// How long `submit` waits for the coordinator to accept a job (it may plan and deploy it
/// before answering); other requests use [`crate::client::TIMEOUT`].
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    rest: RestArgs,
}

#[derive(Args, Debug)]
pub struct JobArgs {
    /// The job id (see `list`).
    id: String,
    #[command(flatten)]
    rest: RestArgs,
}

/// `submit JOB [PARAMS] [OPTIONS]`: the job's parameters (parsed and typed here, by the job's
/// own flags) and its options go to the coordinator as JSON, which validates and starts it;
/// prints the new job's id (the last line of stdout).
///
/// Relative paths are made absolute here, against this process's current directory: the
/// job's own ([`Job::paths`](crate::Job::paths)), `--from`, and the directories `-D` sets, so
/// that they name what the user sees and not what the coordinator or a worker would resolve
/// in its own directory. A job that would print its output (on some worker's stdout) is
/// refused.
pub(crate) fn submit(
    rest: &RestArgs,
    job: &dyn AnyJob,
    params: Value,
    options: &JobOptions,
) -> Result<()> {
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    let params = job
        .absolute_paths(&params, &cwd)
        .map_err(anyhow::Error::msg)?;
    refuse_stdout_sinks(job, &params, options)?;
    let client = rest.client()?.with_timeout(SUBMIT_TIMEOUT);
    let config_yaml = match &options.config {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .with_context(|| format!("cannot read configuration file {}", path.display()))?,
        ),
        None => None,
    };
    let config = options
        .config_pairs()?
        .into_iter()
        .map(|(key, value)| {
            let value = if PATH_KEYS.contains(&key.as_str()) {
                absolute(&value, &cwd)
            } else {
                value
            };
            (key, value)
        })
        .collect();
    let from = options.from.as_deref().map(|from| match from {
        "latest" => from.to_string(),
        path => absolute(path, &cwd),
    });
    let request = SubmitRequest {
        job: job.name().to_string(),
        params: Some(params),
        args: None,
        config,
        config_yaml,
        from,
        from_job: options.from_job.clone(),
        inject_failures: options.inject_failures,
        inject_uid: options.inject_uid.clone(),
        seed: Some(options.seed),
    };
    let body = serde_json::to_value(&request)?;
    let answer = client.request(Method::Post, "/jobs", Some(&body))?;
    let Some(jid) = answer.get("jobid").and_then(Value::as_str) else {
        bail!(
            "unexpected answer from coordinator at {}: no job id in {answer}",
            client.url()
        );
    };
    println!("{jid}");
    Ok(())
}

/// The configuration keys whose values are directories: `submit` sends them absolute.
const PATH_KEYS: [&str; 2] = [keys::CHECKPOINTS_DIR, keys::SAVEPOINTS_DIR];

/// `path` made absolute against `cwd`, unless it is absolute already or a URL (`s3://…`,
/// `file:///…`).
fn absolute(path: &str, cwd: &Path) -> String {
    if path.contains("://") || Path::new(path).is_absolute() || path.is_empty() {
        return path.to_string();
    }
    cwd.join(path).display().to_string()
}

/// Refuses a job whose graph has a sink printing to stdout: on a cluster that is the stdout
/// of whichever worker runs it. A job the client cannot build (its input exists only where
/// the workers run, say) is left to the coordinator to judge.
fn refuse_stdout_sinks(job: &dyn AnyJob, params: &Value, options: &JobOptions) -> Result<()> {
    let ctx = JobContext { seed: options.seed };
    let Ok(graph) = job.build(params, &ctx) else {
        return Ok(());
    };
    let printing = graph.stdout_sinks();
    if printing.is_empty() {
        return Ok(());
    }
    bail!(
        "{} without an output would print on a worker's stdout (its print sink '{}'); pass one, e.g. --output DIR",
        job.name(),
        printing.join("', '")
    )
}

/// `cairn list`: one line per job: id, state, name.
pub fn list(args: ListArgs) -> Result<()> {
    let client = args.rest.client()?;
    let answer = client.get("/jobs/overview")?;
    let Some(jobs) = answer.get("jobs").and_then(Value::as_array) else {
        bail!(
            "unexpected answer from coordinator at {}: no job list",
            client.url()
        );
    };
    if jobs.is_empty() {
        eprintln!("no jobs at {}", client.url());
    }
    for job in jobs {
        println!(
            "{}  {:<10}  {}",
            text(&job["jid"]),
            text(&job["state"]),
            text(&job["name"])
        );
    }
    Ok(())
}

/// `cairn status ID`: the job's details and checkpoint counts.
pub fn status(args: JobArgs) -> Result<()> {
    let client = args.rest.client()?;
    let id = segment(&args.id);
    let job = client.get(&format!("/jobs/{id}"))?;
    let checkpoints = client.get(&format!("/jobs/{id}/checkpoints"))?;

    let time = |v: &Value| match v.as_u64() {
        Some(ms) => format!("{} UTC", human::utc(ms)),
        None => "-".into(),
    };
    let mut lines = vec![
        ("job", text(&job["jid"])),
        ("name", text(&job["name"])),
        ("state", text(&job["state"])),
        ("started", time(&job["start-time"])),
        ("ended", time(&job["end-time"])),
        (
            "duration",
            job["duration"]
                .as_u64()
                .map_or("-".into(), human::duration_ms),
        ),
        ("restarts", text(&job["restarts"])),
        ("failure", text(&job["failure-cause"])),
    ];
    let counts = &checkpoints["counts"];
    let count = |k: &str| counts[k].as_u64().unwrap_or(0);
    lines.push((
        "checkpoints",
        format!(
            "{} completed, {} in progress, {} failed ({} triggered)",
            count("completed"),
            count("in_progress"),
            count("failed"),
            count("triggered")
        ),
    ));
    let latest = &checkpoints["latest"]["completed"];
    if latest.is_object() {
        lines.push((
            "latest",
            format!(
                "#{} at {}: {}, {}",
                text(&latest["id"]),
                time(&latest["latest_ack_timestamp"]),
                latest["end_to_end_duration"]
                    .as_u64()
                    .map_or("-".into(), human::duration_ms),
                latest["state_size"]
                    .as_u64()
                    .map_or("-".into(), human::bytes)
            ),
        ));
    }
    // The lifecycle's last transitions, with their causes.
    let transitions = job["state-transitions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    for t in transitions.iter().rev().take(STATUS_TRANSITIONS).rev() {
        let cause = t["cause"]
            .as_str()
            .map_or(String::new(), |c| format!(": {c}"));
        lines.push((
            "transition",
            format!(
                "{} {} -> {}{cause}",
                time(&t["timestamp"]),
                text(&t["from"]),
                text(&t["to"])
            ),
        ));
    }
    for (key, value) in lines {
        println!("{:<12} {value}", format!("{key}:"));
    }
    Ok(())
}

/// Transitions `cairn status` shows (the newest).
const STATUS_TRANSITIONS: usize = 8;

/// `cairn cancel ID`.
pub fn cancel(args: JobArgs) -> Result<()> {
    let client = args.rest.client()?;
    let path = format!("/jobs/{}?mode=cancel", segment(&args.id));
    client.request(Method::Patch, &path, None)?;
    println!("cancellation of job {} requested", args.id);
    Ok(())
}

/// `cairn checkpoints ID --rest URL`: the completed checkpoints the REST API remembers, oldest
/// first, with the per-subtask maxima of their timings.
pub fn checkpoints(id: &str, rest: &RestArgs) -> Result<()> {
    let client = rest.client()?;
    let answer = client.get(&format!("/jobs/{}/checkpoints", segment(id)))?;
    let counts = &answer["counts"];
    let count = |k: &str| counts[k].as_u64().unwrap_or(0);
    let history = answer["history"].as_array().cloned().unwrap_or_default();
    println!(
        "job {id}: {} completed, {} in progress, {} failed",
        count("completed"),
        count("in_progress"),
        count("failed")
    );
    if history.is_empty() {
        println!("no completed checkpoints");
        return Ok(());
    }
    println!(
        "{:>6}  {:<19}  {:>10}  {:>9}  {:>9}  {:>9}  {:>10}  {:>10}  {:>9}  STATUS",
        "ID",
        "TIME (UTC)",
        "SIZE",
        "DURATION",
        "SYNC MAX",
        "ASYNC MAX",
        "ALIGN MAX",
        "IN-FLIGHT",
        "UNALIGNED"
    );
    // The API answers newest first; list oldest first, as for a directory.
    for c in history.iter().rev() {
        let tasks = c["subtasks"]
            .as_array()
            .map(Vec::as_slice)
            .unwrap_or_default();
        let max_ms = |field: &str| {
            tasks
                .iter()
                .filter_map(|t| t[field].as_u64())
                .max()
                .map_or("-".to_string(), |ms| format!("{ms} ms"))
        };
        let inflight: Vec<u64> = tasks
            .iter()
            .filter_map(|t| t["channel_state_size"].as_u64())
            .collect();
        let inflight = if inflight.is_empty() {
            "-".to_string()
        } else {
            human::bytes(inflight.iter().sum())
        };
        let unaligned: Vec<bool> = tasks
            .iter()
            .filter_map(|t| t["unaligned"].as_bool())
            .collect();
        let unaligned = match (unaligned.is_empty(), unaligned.contains(&true)) {
            (true, _) => "-",
            (false, true) => "yes",
            (false, false) => "no",
        };
        println!(
            "{:>6}  {:<19}  {:>10}  {:>9}  {:>9}  {:>9}  {:>10}  {:>10}  {:>9}  {}",
            text(&c["id"]),
            c["latest_ack_timestamp"]
                .as_u64()
                .map_or("-".into(), human::utc),
            c["state_size"].as_u64().map_or("-".into(), human::bytes),
            c["end_to_end_duration"]
                .as_u64()
                .map_or("-".into(), |ms| format!("{ms} ms")),
            max_ms("sync_ms"),
            max_ms("async_ms"),
            max_ms("alignment_ms"),
            inflight,
            unaligned,
            text(&c["status"]),
        );
    }
    let shown = history.len() as u64;
    if count("completed") > shown {
        println!(
            "(the newest {shown} of {} completed checkpoints)",
            count("completed")
        );
    }
    Ok(())
}

/// A JSON value as text: strings without quotes, null and absent as `-`, control characters
/// (from a server) as spaces.
fn text(v: &Value) -> String {
    let s = match v {
        Value::Null => return "-".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}
