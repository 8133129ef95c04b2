//! `cairn savepoint JOB_ID [DIR]`, `cairn stop JOB_ID`, `cairn savepoint info PATH` and
//! `cairn savepoint dispose PATH`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use crate::client::{segment, Client, Method, RestArgs};
use crate::human;

/// How long a savepoint may take before the command gives up waiting (the job goes on).
const SAVEPOINT_WAIT: Duration = Duration::from_secs(600);
/// How often the command asks how the savepoint stands.
const POLL: Duration = Duration::from_millis(100);

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct SavepointArgs {
    #[command(subcommand)]
    action: Option<SavepointAction>,
    /// The job id (see `list`).
    #[arg(required = true)]
    id: Option<String>,
    /// Where to write it (default: the job's state.savepoints.dir).
    target: Option<PathBuf>,
    #[command(flatten)]
    rest: RestArgs,
}

#[derive(Subcommand, Debug)]
enum SavepointAction {
    /// Show a savepoint's (or checkpoint's) job, operators, states and sizes.
    Info {
        /// The savepoint directory (or its _metadata).
        path: PathBuf,
    },
    /// Delete a savepoint (after checking that it is one).
    Dispose {
        /// The savepoint directory.
        path: PathBuf,
    },
}

#[derive(Args, Debug)]
pub struct StopArgs {
    /// The job id (see `list`).
    id: String,
    /// Where to write the final savepoint (default: the job's state.savepoints.dir).
    #[arg(long, value_name = "DIR")]
    savepoint_dir: Option<PathBuf>,
    /// Send the maximum watermark before the savepoint: every event-time timer and window
    /// fires and its results are committed. For ending a job for good: a job resumed from a
    /// drained savepoint treats every record as late.
    #[arg(long)]
    drain: bool,
    #[command(flatten)]
    rest: RestArgs,
}

/// `cairn savepoint ...`.
pub fn savepoint(args: SavepointArgs) -> Result<()> {
    match args.action {
        Some(SavepointAction::Info { path }) => info(&path),
        Some(SavepointAction::Dispose { path }) => {
            cairn::checkpoint::dispose_savepoint(&path).map_err(|e| anyhow!(e))?;
            println!("savepoint {} disposed", path.display());
            Ok(())
        }
        None => {
            let id = args.id.unwrap_or_default();
            let client = args.rest.client()?;
            let body = json!({ "target-directory": dir_text(args.target.as_deref()), "cancel-job": false });
            let location = trigger_and_wait(&client, &id, "savepoints", &body)?;
            println!("savepoint stored in {location}");
            Ok(())
        }
    }
}

/// `cairn stop JOB_ID`: stop-with-savepoint, then wait for the job to end.
pub fn stop(args: StopArgs) -> Result<()> {
    let client = args.rest.client()?;
    let body =
        json!({ "targetDirectory": dir_text(args.savepoint_dir.as_deref()), "drain": args.drain });
    // A stop-with-savepoint completes once the job finished.
    let location = trigger_and_wait(&client, &args.id, "stop", &body)?;
    println!("savepoint stored in {location}");
    println!("job {} finished", args.id);
    Ok(())
}

fn dir_text(dir: Option<&Path>) -> Value {
    dir.map_or(Value::Null, |d| {
        let abs = std::path::absolute(d).unwrap_or_else(|_| d.to_path_buf());
        Value::String(abs.display().to_string())
    })
}

/// Posts the trigger and polls until the savepoint is written; returns where.
fn trigger_and_wait(client: &Client, id: &str, what: &str, body: &Value) -> Result<String> {
    let jid = segment(id);
    let answer = client.request(Method::Post, &format!("/jobs/{jid}/{what}"), Some(body))?;
    let Some(request) = answer["request-id"].as_str() else {
        bail!(
            "unexpected answer from {}: no request id in {answer}",
            client.url()
        );
    };
    let until = Instant::now() + SAVEPOINT_WAIT;
    loop {
        let state = client.get(&format!("/jobs/{jid}/savepoints/{}", segment(request)))?;
        if state["status"]["id"] == "COMPLETED" {
            return state["operation"]["location"]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| {
                    anyhow!("savepoint of job {id} completed without a location: {state}")
                });
        }
        if Instant::now() > until {
            bail!("the savepoint of job {id} did not complete within {SAVEPOINT_WAIT:?}");
        }
        std::thread::sleep(POLL);
    }
}

/// `cairn savepoint info PATH`.
fn info(path: &Path) -> Result<()> {
    let (c, _) = cairn::checkpoint::load_from_path(path).map_err(|e| anyhow!(e))?;
    let m = &c.metadata;
    let kind = if c.self_contained {
        "savepoint"
    } else {
        "checkpoint"
    };
    println!(
        "{kind} {} of job {} ({})",
        m.checkpoint_id, m.job_name, m.job_id
    );
    println!("location: {}", c.location);
    println!("taken: {} UTC", human::utc(m.completed_timestamp_ms));
    println!("max parallelism: {}", m.max_parallelism);
    println!("state size: {}", human::bytes(m.state_size));
    for op in &m.operators {
        println!(
            "operator '{}': parallelism {}, {} subtask state(s)",
            op.uid,
            op.parallelism,
            op.subtasks.len()
        );
        for st in &op.states {
            println!(
                "  state '{}': {} state, serializer {} v{} of {}",
                st.name, st.kind, st.serializer.id, st.serializer.version, st.serializer.type_name
            );
        }
        for (subtask, states) in c.describe_operator(&op.uid) {
            println!("  subtask {subtask}: {states}");
        }
    }
    Ok(())
}
