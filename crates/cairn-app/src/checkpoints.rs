//! `cairn checkpoints DIR`: the checkpoints retained in a checkpoint directory; with `--rest`,
//! `cairn checkpoints ID --rest URL`: a running job's checkpoint history from its REST API.

use std::path::PathBuf;

use anyhow::{bail, Result};
use cairn::checkpoint::list_checkpoints;
use cairn::storage::layout::parse_checkpoint_dir;
use cairn::storage::FsStorage;
use clap::Args;

use crate::client::RestArgs;
use crate::human;
use crate::remote;

#[derive(Args, Debug)]
pub struct CheckpointsArgs {
    /// A checkpoint directory (holding job directories), or one job's directory; with --rest, a job id.
    #[arg(value_name = "DIR|JOB_ID")]
    dir: PathBuf,
    /// Show the job's checkpoint history from this REST API instead (http://HOST:PORT, HOST:PORT or PORT).
    #[arg(long, value_name = "URL")]
    rest: Option<String>,
    /// Bearer token, if the REST API requires one.
    #[arg(long, value_name = "TOKEN", requires = "rest")]
    rest_token: Option<String>,
}

pub fn run(args: CheckpointsArgs) -> Result<()> {
    if let Some(rest) = args.rest {
        let Some(id) = args.dir.to_str() else {
            bail!("job id {} is not UTF-8", args.dir.display());
        };
        let rest = RestArgs {
            rest,
            rest_token: args.rest_token,
        };
        return remote::checkpoints(id, &rest);
    }
    if !args.dir.exists() {
        bail!("checkpoint directory {} does not exist", args.dir.display());
    }
    if !args.dir.is_dir() {
        bail!(
            "checkpoint directory {} is not a directory",
            args.dir.display()
        );
    }
    let entries = std::fs::read_dir(&args.dir).map_err(|e| {
        anyhow::anyhow!(
            "cannot read checkpoint directory {}: {e}",
            args.dir.display()
        )
    })?;
    let is_job_dir = entries
        .filter_map(|e| e.ok())
        .any(|e| parse_checkpoint_dir(&e.file_name().to_string_lossy()).is_some());
    let (root, only_job) = if is_job_dir {
        let canonical = args.dir.canonicalize()?;
        let job = canonical
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        let parent = canonical
            .parent()
            .map(PathBuf::from)
            .unwrap_or(canonical.clone());
        (parent, job)
    } else {
        (args.dir.clone(), None)
    };
    let storage = FsStorage::open(&root)?;
    let mut list = list_checkpoints(&storage).map_err(|e| anyhow::anyhow!(e))?;
    if let Some(job) = &only_job {
        list.retain(|c| &c.job_id == job);
    }
    if list.is_empty() {
        println!("no checkpoints in {}", args.dir.display());
        return Ok(());
    }
    println!(
        "{:<32}  {:>6}  {:<19}  {:>10}  {:>9}  {:>9}  {:>9}  {:>10}  {:>10}  {:>9}  STATUS",
        "JOB",
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
    for c in list {
        let (time, duration) = match &c.metadata {
            Some(m) => (
                human::utc(m.completed_timestamp_ms),
                format!("{} ms", m.duration_ms()),
            ),
            None => ("-".into(), "-".into()),
        };
        let max_of = |f: fn(&cairn::checkpoint::TaskCheckpointStats) -> u64| {
            c.metadata.as_ref().map_or("-".to_string(), |m| {
                format!("{} ms", m.tasks.iter().map(f).max().unwrap_or(0))
            })
        };
        let (sync, asyn, align) = (
            max_of(|t| t.sync_ms),
            max_of(|t| t.async_ms),
            max_of(|t| t.alignment_ms),
        );
        let (inflight, unaligned) = match &c.metadata {
            Some(m) => (
                human::bytes(m.tasks.iter().map(|t| t.channel_state_size).sum()),
                if m.tasks.iter().any(|t| t.unaligned) {
                    "yes"
                } else {
                    "no"
                }
                .to_string(),
            ),
            None => ("-".into(), "-".into()),
        };
        let status = match &c.problem {
            None => "complete".to_string(),
            Some(p) => format!("NOT USABLE: {p}"),
        };
        println!(
            "{:<32}  {:>6}  {:<19}  {:>10}  {:>9}  {:>9}  {:>9}  {:>10}  {:>10}  {:>9}  {status}",
            c.job_id,
            c.id,
            time,
            human::bytes(c.size),
            duration,
            sync,
            asyn,
            align,
            inflight,
            unaligned
        );
    }
    Ok(())
}
