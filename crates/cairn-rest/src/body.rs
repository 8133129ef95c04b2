//! The JSON bodies, built from a [`JobStatusView`] in Flink's shapes.
//!
//! Flink's own client parses these with every constructor property required (a missing field
//! fails the whole answer) and unknown fields ignored, so every body carries all of Flink's
//! fields, with cairn's own ones added beside them. Where cairn does not track what Flink
//! reports (the state of each subtask, a subtask's host), the field is there with a neutral
//! value; per-vertex I/O metrics come from the subtasks' metrics (`false` for "complete" while
//! some subtask has none yet); see each function.

use std::collections::BTreeMap;
use std::str::FromStr;

use cairn::checkpoint::{CheckpointMetadata, TaskCheckpointStats};
use cairn::config::{keys, parse_bool, parse_duration, CheckpointingMode};
use cairn::metrics::SubtaskSnapshot;
use cairn::runtime::{JobState, JobStatusView, SavepointState};
use serde_json::{json, Map, Value};

use crate::resources::Resources;

/// The Flink release whose REST API (field names and types) these bodies follow; reported as
/// `flink-version`, which Flink's tools read to pick what they may ask for.
const FLINK_VERSION: &str = "2.3.0";

/// What `flink-revision` / `flink-commit` report: this build of cairn.
const REVISION: &str = concat!("cairn ", env!("CARGO_PKG_VERSION"));

/// Flink's execution (subtask) states, as its REST API spells them.
const EXECUTION_STATES: [&str; 10] = [
    "CREATED",
    "SCHEDULED",
    "DEPLOYING",
    "RUNNING",
    "FINISHED",
    "CANCELING",
    "CANCELED",
    "FAILED",
    "RECONCILING",
    "INITIALIZING",
];

/// Flink's job states, the keys of `timestamps`.
const JOB_STATES: [&str; 11] = [
    "INITIALIZING",
    "CREATED",
    "RUNNING",
    "FAILING",
    "FAILED",
    "CANCELLING",
    "CANCELED",
    "FINISHED",
    "RESTARTING",
    "SUSPENDED",
    "RECONCILING",
];

fn state_name(state: JobState) -> Result<String, serde_json::Error> {
    match serde_json::to_value(state)? {
        Value::String(s) => Ok(s),
        other => Ok(other.to_string()),
    }
}

/// The state cairn's subtasks are in while the job is in `state`: cairn tracks the job, not
/// each subtask, so all of them are counted under this one.
fn subtask_state(state: JobState) -> &'static str {
    match state {
        JobState::Created => "CREATED",
        JobState::Running => "RUNNING",
        // Being cancelled after a failure, or cancelled and about to be deployed again.
        JobState::Failing | JobState::Cancelling => "CANCELING",
        JobState::Restarting => "SCHEDULED",
        JobState::Finished => "FINISHED",
        JobState::Failed => "FAILED",
        JobState::Canceled | JobState::Suspended => "CANCELED",
    }
}

/// A count per execution state: `n` in `state`, 0 in every other; keys as `spell` makes them.
fn per_state(state: &str, n: u64, spell: impl Fn(&str) -> String) -> Map<String, Value> {
    EXECUTION_STATES
        .iter()
        .map(|s| (spell(s), Value::from(if *s == state { n } else { 0 })))
        .collect()
}

/// `-1` until the job ended, as Flink says "not ended yet".
fn end_time(view: &JobStatusView) -> i64 {
    view.end_time
        .map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX))
}

fn duration(view: &JobStatusView, now_ms: u64) -> u64 {
    view.end_time
        .unwrap_or(now_ms)
        .saturating_sub(view.start_time)
}

fn total_subtasks(view: &JobStatusView) -> u64 {
    view.vertices.iter().map(|v| u64::from(v.parallelism)).sum()
}

/// A stable 32-hex-digit id (the shape of Flink's vertex and group ids) for `name`: cairn's
/// task vertices have names, not ids, and every process plans the same names.
fn derived_id(name: &str) -> String {
    // FNV-1a, 64 bits, twice with different offsets: stable across builds and platforms.
    let fnv = |offset: u64| {
        name.bytes().fold(offset, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        })
    };
    format!(
        "{:016x}{:016x}",
        fnv(0xcbf2_9ce4_8422_2325),
        fnv(0x6c62_272e_07bb_0142)
    )
}

/// The id of the `ordinal`-th vertex named `name` (0 for the first with that name).
fn vertex_id(name: &str, ordinal: usize) -> String {
    if ordinal == 0 {
        derived_id(name)
    } else {
        derived_id(&format!("{name}#{ordinal}"))
    }
}

/// `GET /jobs`: one entry (Flink's `JobIdWithStatus`).
pub(crate) fn job_id_with_status(view: &JobStatusView) -> Result<Value, serde_json::Error> {
    Ok(json!({ "id": view.jid, "status": state_name(view.state)? }))
}

/// `GET /jobs/overview`: one entry, Flink's `JobDetails`, plus cairn's `restarts` and
/// `failure-cause`. `now_ms` measures the duration of a job that has not ended.
pub(crate) fn job_overview(view: &JobStatusView, now_ms: u64) -> Result<Value, serde_json::Error> {
    let state = subtask_state(view.state);
    let mut tasks = per_state(state, total_subtasks(view), |s| s.to_ascii_lowercase());
    tasks.insert("total".into(), total_subtasks(view).into());
    Ok(json!({
        "jid": view.jid,
        "name": view.name,
        "state": state_name(view.state)?,
        "start-time": view.start_time,
        "end-time": end_time(view),
        "duration": duration(view, now_ms),
        "last-modification": view
            .lifecycle
            .transitions()
            .last()
            .map_or(view.start_time, |t| t.at_ms),
        "tasks": tasks,
        "jobType": "STREAMING",
        "schedulerType": "Default",
        "pending-operators": 0,
        "restarts": view.restarts,
        "restart-causes": view.restart_causes.iter().cloned().collect::<BTreeMap<_, _>>(),
        "failure-cause": view.failure_cause,
    }))
}

/// The ids of the job's vertices, in graph order (as `GET /jobs/{jid}` lists them).
pub(crate) fn vertex_ids(view: &JobStatusView) -> Vec<String> {
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    view.vertices
        .iter()
        .map(|v| {
            let ordinal = seen.entry(v.name.as_str()).or_insert(0);
            let id = vertex_id(&v.name, *ordinal);
            *ordinal += 1;
            id
        })
        .collect()
}

/// Flink's `IOMetricsInfo` of some subtasks (summed; times in ms); `complete` when every
/// subtask's metrics are there.
fn io_metrics(subtasks: &[&SubtaskSnapshot], complete: bool) -> Value {
    let sum = |f: fn(&SubtaskSnapshot) -> u64| subtasks.iter().map(|s| f(s)).sum::<u64>();
    json!({
        "read-bytes": sum(|s| s.bytes_in),
        "read-bytes-complete": complete,
        "write-bytes": sum(|s| s.bytes_out),
        "write-bytes-complete": complete,
        "read-records": sum(|s| s.records_in),
        "read-records-complete": complete,
        "write-records": sum(|s| s.records_out),
        "write-records-complete": complete,
        "accumulated-backpressured-time": sum(|s| s.backpressured_ms),
        "accumulated-idle-time": sum(|s| s.idle_ms),
        "accumulated-busy-time": sum(|s| s.busy_ms) as f64,
        // cairn's: the last second's rates, summed over the subtasks.
        "records-in-per-second": subtasks.iter().map(|s| s.rates[0]).sum::<f64>(),
        "records-out-per-second": subtasks.iter().map(|s| s.rates[1]).sum::<f64>(),
    })
}

/// The snapshots of vertex `vi`'s subtasks.
fn of_vertex(snapshots: &[SubtaskSnapshot], vi: usize) -> Vec<&SubtaskSnapshot> {
    snapshots
        .iter()
        .filter(|s| s.vertex_index as usize == vi)
        .collect()
}

/// Flink's back-pressure level of a ratio (share of time back-pressured): ok up to 10 %,
/// low up to 50 %, high above.
fn backpressure_level(ratio: f64) -> &'static str {
    if ratio <= 0.10 {
        "ok"
    } else if ratio <= 0.50 {
        "low"
    } else {
        "high"
    }
}

/// `GET /jobs/{jid}/vertices/{vid}`: Flink's `JobVertexDetailsInfo`, a subtask's metrics
/// from this process or its worker's last report (about once a second).
pub(crate) fn vertex_details(
    view: &JobStatusView,
    vi: usize,
    id: &str,
    snapshots: &[SubtaskSnapshot],
    now_ms: u64,
) -> Value {
    let v = &view.vertices[vi];
    let mine = of_vertex(snapshots, vi);
    let vstate = subtask_state(view.state);
    let subtasks: Vec<Value> = (0..v.parallelism)
        .map(|i| {
            let s: Vec<&SubtaskSnapshot> = mine.iter().copied().filter(|s| s.subtask == i).collect();
            // In a coordinator: the worker whose report it is (Flink: the task manager).
            let worker = s.first().and_then(|s| s.worker.as_ref());
            json!({
                "subtask": i,
                "status": vstate,
                "attempt": view.restarts,
                "endpoint": worker.map_or("", |w| w.1.as_str()),
                "start-time": view.start_time,
                "end-time": end_time(view),
                "duration": duration(view, now_ms),
                "metrics": io_metrics(&s, !s.is_empty()),
                "taskmanager-id": worker.map(|w| format!("worker-{}", w.0)).unwrap_or_default(),
                "status-duration": {},
                "other-concurrent-attempts": [],
                "watermark": s.first().map(|s| s.watermark).filter(|w| *w != cairn::metrics::NO_WATERMARK),
                "backpressure-ratio": s.first().map_or(0.0, |s| s.rates[3] / 1000.0),
                "input-queue-fill": s.first().map_or(0.0, |s| s.queues[0]),
                "output-queue-fill": s.first().map_or(0.0, |s| s.queues[1]),
            })
        })
        .collect();
    json!({
        "id": id,
        "name": v.name,
        "parallelism": v.parallelism,
        "maxParallelism": view.max_parallelism,
        "now": now_ms,
        "subtasks": subtasks,
        "aggregated": io_metrics(&mine, mine.len() == v.parallelism as usize),
    })
}

/// `GET /jobs/{jid}/vertices/{vid}/backpressure`: Flink's `JobVertexBackPressureInfo` from the
/// subtasks' back-pressured, idle and busy milliseconds per second (Flink's own source since
/// 1.13); the vertex's level is its worst subtask's.
pub(crate) fn backpressure(
    view: &JobStatusView,
    vi: usize,
    snapshots: &[SubtaskSnapshot],
    now_ms: u64,
) -> Value {
    let v = &view.vertices[vi];
    let mine = of_vertex(snapshots, vi);
    let mut worst = 0.0f64;
    let subtasks: Vec<Value> = (0..v.parallelism)
        .map(|i| {
            let s = mine.iter().find(|s| s.subtask == i);
            let ratio = |k: usize| s.map_or(0.0, |s| (s.rates[k] / 1000.0).clamp(0.0, 1.0));
            let bp = ratio(3);
            worst = worst.max(bp);
            json!({
                "subtask": i,
                "attempt-number": view.restarts,
                "backpressureLevel": backpressure_level(bp),
                "ratio": bp,
                "idleRatio": ratio(2),
                "busyRatio": ratio(4),
                "other-concurrent-attempts": [],
            })
        })
        .collect();
    json!({
        "status": "ok",
        "backpressureLevel": backpressure_level(worst),
        "end-timestamp": now_ms,
        "subtasks": subtasks,
    })
}

/// `GET /jobs/{jid}/exceptions`: Flink's `JobExceptionsInfoWithHistory`, newest first, with
/// cairn's `kind` and `restarted` beside Flink's fields.
pub(crate) fn exceptions(view: &JobStatusView) -> Value {
    let entries: Vec<Value> = view
        .exceptions
        .iter()
        .rev()
        .map(|e| {
            json!({
                "exceptionName": e.kind,
                "stacktrace": e.cause,
                "timestamp": e.timestamp,
                "taskName": Value::Null,
                "endpoint": Value::Null,
                "taskManagerId": Value::Null,
                "failureLabels": {},
                "concurrentExceptions": [],
                "kind": e.kind,
                "restarted": e.restarted,
            })
        })
        .collect();
    let newest = view.exceptions.last();
    json!({
        "root-exception": newest.map(|e| e.cause.clone()),
        "timestamp": newest.map(|e| e.timestamp),
        "all-exceptions": [],
        "truncated": false,
        "exceptionHistory": {
            "entries": entries,
            "truncated": view.restarts as usize + 1 > view.exceptions.len()
                && view.exceptions.len() >= cairn::runtime::status::EXCEPTIONS_MAX,
        },
    })
}

/// Flink's `JobPlanInfo.Plan`: the vertices with their inputs (ship strategies).
fn plan(view: &JobStatusView) -> Value {
    let ids = vertex_ids(view);
    let nodes: Vec<Value> = view
        .vertices
        .iter()
        .zip(&ids)
        .map(|(v, id)| {
            let inputs: Vec<Value> = v
                .inputs
                .iter()
                .enumerate()
                .map(|(num, i)| {
                    json!({
                        "num": num,
                        "id": ids.get(i.vertex).cloned().unwrap_or_default(),
                        "ship_strategy": i.ship_strategy,
                        "exchange": "pipelined_bounded",
                    })
                })
                .collect();
            json!({
                "id": id,
                "parallelism": v.parallelism,
                "operator": "",
                "operator_strategy": "",
                "description": v.name,
                "inputs": inputs,
                "optimizer_properties": {},
            })
        })
        .collect();
    json!({ "jid": view.jid, "name": view.name, "type": "STREAMING", "nodes": nodes })
}

/// `GET /jobs/{jid}/plan`: Flink's `JobPlanInfo`.
pub(crate) fn job_plan(view: &JobStatusView) -> Value {
    json!({ "plan": plan(view) })
}

/// `GET /jobs/{jid}`: Flink's `JobDetailsInfo`, plus cairn's `restarts` and `failure-cause`.
/// A vertex's I/O metrics are its subtasks' (marked incomplete while some subtask has none
/// yet).
pub(crate) fn job_details(
    view: &JobStatusView,
    snapshots: &[SubtaskSnapshot],
    now_ms: u64,
) -> Result<Value, serde_json::Error> {
    let state = state_name(view.state)?;
    let vstate = subtask_state(view.state);
    let group = derived_id(&format!("slot-sharing-group:{}", view.jid));
    let ids = vertex_ids(view);
    let vertices: Vec<Value> = view
        .vertices
        .iter()
        .zip(&ids)
        .enumerate()
        .map(|(vi, (v, id))| {
            let mine = of_vertex(snapshots, vi);
            json!({
                "id": id,
                "slotSharingGroupId": group,
                "name": v.name,
                "maxParallelism": view.max_parallelism,
                "parallelism": v.parallelism,
                "status": vstate,
                "start-time": view.start_time,
                "end-time": end_time(view),
                "duration": duration(view, now_ms),
                "tasks": per_state(vstate, u64::from(v.parallelism), str::to_string),
                "metrics": io_metrics(&mine, mine.len() == v.parallelism as usize),
            })
        })
        .collect();
    let mut timestamps = Map::new();
    // When the job last entered each state (0: never), from its lifecycle.
    let entered: BTreeMap<&str, u64> = view
        .lifecycle
        .transitions()
        .iter()
        .map(|t| (t.to.name(), t.at_ms))
        .collect();
    for s in JOB_STATES {
        let at = match s {
            "INITIALIZING" | "CREATED" => view.lifecycle.created_ms(),
            _ => entered.get(s).copied().unwrap_or(0),
        };
        timestamps.insert(s.into(), at.into());
    }
    Ok(json!({
        "jid": view.jid,
        "name": view.name,
        "isStoppable": false,
        "state": state,
        "job-type": "STREAMING",
        "schedulerType": "Default",
        "start-time": view.start_time,
        "end-time": end_time(view),
        "duration": duration(view, now_ms),
        "maxParallelism": view.max_parallelism,
        "now": now_ms,
        "timestamps": timestamps,
        "vertices": vertices,
        "status-counts": per_state(vstate, view.vertices.len() as u64, str::to_string),
        "plan": plan(view),
        "stream-graph": {},
        "pending-operators": 0,
        "restarts": view.restarts,
        "restart-causes": view.restart_causes.iter().cloned().collect::<BTreeMap<_, _>>(),
        "failure-cause": view.failure_cause,
        "state-transitions": view.lifecycle.transitions().iter().map(|t| json!({
            "from": t.from.name(),
            "to": t.to.name(),
            "timestamp": t.at_ms,
            "cause": t.cause,
        })).collect::<Vec<_>>(),
    }))
}

/// `GET /jobs/{jid}/config`: Flink's `JobConfigInfo`, the job's effective configuration as
/// its `user-config`.
pub(crate) fn job_config(view: &JobStatusView) -> Value {
    let config: BTreeMap<&str, &str> = view
        .config
        .iter()
        .filter(|(_, v)| v.as_str() != UNSET)
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    json!({
        "jid": view.jid,
        "name": view.name,
        "execution-config": {
            "execution-mode": "PIPELINED",
            "restart-strategy": config.get(keys::RESTART_STRATEGY).copied().unwrap_or("default"),
            "job-parallelism": view.vertices.iter().map(|v| v.parallelism).max().unwrap_or(1),
            "object-reuse-mode": false,
            "user-config": config,
        },
    })
}

/// The savepoints requested of the job while it ran here, newest first (cairn's own
/// `savepoints` beside Flink's checkpoint statistics).
fn savepoints(view: &JobStatusView) -> Vec<Value> {
    view.savepoints
        .iter()
        .rev()
        .map(|sp| {
            let (status, location, cause) = match &sp.state {
                SavepointState::InProgress => ("IN_PROGRESS", None, None),
                SavepointState::Completed { location } => ("COMPLETED", Some(location), None),
                SavepointState::Failed { cause } => ("FAILED", None, Some(cause)),
            };
            json!({
                "request-id": sp.request_id,
                "kind": if sp.stop { "stop" } else { "savepoint" },
                "status": status,
                "trigger_timestamp": sp.requested_ms,
                "location": location,
                "cause": cause,
            })
        })
        .collect()
}

/// `GET /jobs/{jid}/checkpoints`: Flink's `CheckpointingStatistics` (counts, a summary of the
/// history, the latest completed checkpoint, the history newest first), plus cairn's
/// `counts.triggered`. cairn keeps the completed checkpoints only (the last
/// [`HISTORY_MAX`](cairn::runtime::status::HISTORY_MAX)), so there is no latest failed one.
pub(crate) fn checkpoints(view: &JobStatusView) -> Result<Value, serde_json::Error> {
    let dir = config_value(view, keys::CHECKPOINTS_DIR).filter(|d| *d != UNSET && !d.is_empty());
    let history = view
        .checkpoint_history
        .iter()
        .rev()
        .map(|m| checkpoint_entry(m, view, dir))
        .collect::<Result<Vec<_>, _>>()?;
    let latest = history.first().cloned().unwrap_or(Value::Null);
    let counts = &view.checkpoint_counts;
    let metas = &view.checkpoint_history;
    let summary = json!({
        "checkpointed_size": stats(metas.iter().map(|m| m.state_size)),
        "state_size": stats(metas.iter().map(|m| m.state_size)),
        "end_to_end_duration": stats(metas.iter().map(CheckpointMetadata::duration_ms)),
        "alignment_buffered": stats(metas.iter().map(|_| 0)),
        "processed_data": stats(metas.iter().map(|_| 0)),
        "persisted_data": stats(metas.iter().map(persisted_data)),
    });
    Ok(json!({
        "counts": {
            "restored": 0,
            "total": counts.triggered,
            "triggered": counts.triggered,
            "in_progress": counts.in_progress,
            "completed": counts.completed,
            "failed": counts.failed,
        },
        "summary": summary,
        "latest": { "completed": latest, "savepoint": null, "failed": null, "restored": null },
        "history": history,
        "savepoints": savepoints(view),
    }))
}

/// Flink's `StatsSummaryDto` of `values` (all zero without any).
fn stats(values: impl Iterator<Item = u64>) -> Value {
    let mut v: Vec<u64> = values.collect();
    if v.is_empty() {
        return json!({"min": 0, "max": 0, "avg": 0, "p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "p999": 0.0});
    }
    v.sort_unstable();
    let n = v.len();
    let sum: u128 = v.iter().map(|&x| u128::from(x)).sum();
    // Nearest rank: the smallest value with at least q of all values at or below it.
    let q = |q: f64| {
        let rank = (q * n as f64).ceil() as usize;
        v[rank.clamp(1, n) - 1] as f64
    };
    json!({
        "min": v[0],
        "max": v[n - 1],
        "avg": u64::try_from(sum / n as u128).unwrap_or(u64::MAX),
        "p50": q(0.5),
        "p90": q(0.9),
        "p95": q(0.95),
        "p99": q(0.99),
        "p999": q(0.999),
    })
}

/// Bytes of in-flight data persisted with the checkpoint (unaligned checkpoints).
fn persisted_data(meta: &CheckpointMetadata) -> u64 {
    meta.tasks.iter().map(|t| t.channel_state_size).sum()
}

/// Fields of [`CheckpointMetadata`] that an entry shows under Flink's names, or leaves out
/// (`operators` lists state files: storage layout, not statistics).
const CONSUMED_FIELDS: &[&str] = &[
    "job_id",
    "job_name",
    "checkpoint_id",
    "trigger_timestamp_ms",
    "completed_timestamp_ms",
    "state_size",
    "tasks",
    "operators",
];

/// One completed checkpoint: Flink's `CompletedCheckpointStatistics`, with `tasks` per task
/// vertex (keyed by the vertex id `GET /jobs/{jid}` shows), plus cairn's per-subtask
/// statistics as `subtasks`. Fields of [`CheckpointMetadata`] that have no Flink name are
/// passed through as serde serializes them, and the per-subtask statistics are serialized
/// whole, so fields added to either appear without a change here.
pub(crate) fn checkpoint_entry(
    meta: &CheckpointMetadata,
    view: &JobStatusView,
    checkpoint_dir: Option<&str>,
) -> Result<Value, serde_json::Error> {
    let mut entry = match serde_json::to_value(meta)? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    for field in CONSUMED_FIELDS {
        entry.remove(*field);
    }
    let subtasks = meta.tasks.len();
    let unaligned = meta.tasks.iter().any(|t| t.unaligned);
    let external_path = checkpoint_dir.map(|d| {
        format!(
            "{}/{}/chk-{}",
            d.trim_end_matches('/'),
            meta.job_id,
            meta.checkpoint_id
        )
    });
    let fields = json!({
        "className": "completed",
        "id": meta.checkpoint_id,
        "status": "COMPLETED",
        "is_savepoint": false,
        "savepointFormat": null,
        "trigger_timestamp": meta.trigger_timestamp_ms,
        "latest_ack_timestamp": meta.completed_timestamp_ms,
        "checkpointed_size": meta.state_size,
        "state_size": meta.state_size,
        "end_to_end_duration": meta.duration_ms(),
        "alignment_buffered": 0,
        "processed_data": 0,
        "persisted_data": persisted_data(meta),
        "num_subtasks": subtasks,
        "num_acknowledged_subtasks": subtasks,
        "checkpoint_type": if unaligned { "UNALIGNED_CHECKPOINT" } else { "CHECKPOINT" },
        "tasks": per_vertex(meta, view),
        "external_path": external_path,
        "discarded": false,
        "subtasks": serde_json::to_value(&meta.tasks)?,
    });
    if let Value::Object(fields) = fields {
        entry.extend(fields);
    }
    Ok(Value::Object(entry))
}

/// Flink's `TaskCheckpointStatistics` per task vertex, from the subtasks' statistics.
fn per_vertex(meta: &CheckpointMetadata, view: &JobStatusView) -> Map<String, Value> {
    let mut by_task: BTreeMap<&str, Vec<&TaskCheckpointStats>> = BTreeMap::new();
    for t in &meta.tasks {
        by_task.entry(t.task.as_str()).or_default().push(t);
    }
    by_task
        .into_iter()
        .map(|(name, stats)| {
            let subtasks = view
                .vertices
                .iter()
                .find(|v| v.name == name)
                .map_or(stats.len() as u64, |v| u64::from(v.parallelism));
            let state_size: u64 = stats.iter().map(|t| t.state_size).sum();
            let persisted: u64 = stats.iter().map(|t| t.channel_state_size).sum();
            // From the trigger to the slowest subtask's acknowledgement, as far as measured.
            let slowest = stats
                .iter()
                .map(|t| t.start_delay_ms + t.alignment_ms + t.sync_ms + t.async_ms)
                .max()
                .unwrap_or(0);
            let value = json!({
                "id": meta.checkpoint_id,
                "status": "COMPLETED",
                "latest_ack_timestamp": meta.completed_timestamp_ms,
                "checkpointed_size": state_size,
                "state_size": state_size,
                "end_to_end_duration": slowest,
                "alignment_buffered": 0,
                "processed_data": 0,
                "persisted_data": persisted,
                "num_subtasks": subtasks,
                "num_acknowledged_subtasks": stats.len(),
            });
            (vertex_id(name, 0), value)
        })
        .collect()
}

/// The value of configuration key `key` in the effective configuration.
fn config_value<'a>(view: &'a JobStatusView, key: &str) -> Option<&'a str> {
    view.config
        .iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| v.as_str())
}

/// `GET /config`: Flink's `DashboardConfiguration`. Times are reported in UTC.
pub(crate) fn dashboard_config() -> Value {
    json!({
        "refresh-interval": 3000,
        "timezone-name": "Coordinated Universal Time",
        "timezone-offset": 0,
        "flink-version": FLINK_VERSION,
        "flink-revision": REVISION,
        "features": {
            "web-submit": false,
            "web-cancel": true,
            "web-rescale": false,
            "web-history": false,
        },
    })
}

/// `GET /overview`: Flink's `ClusterOverviewWithVersion`. Free slots are those no job that
/// has not ended holds a reservation of (the coordinator's count); running jobs are those that
/// have not ended.
pub(crate) fn cluster_overview(views: &[JobStatusView], resources: Resources) -> Value {
    let count = |s: JobState| views.iter().filter(|v| v.state == s).count();
    json!({
        "taskmanagers": resources.workers,
        "slots-total": resources.slots,
        "slots-available": resources.slots.saturating_sub(resources.reserved),
        "taskmanagers-blocked": 0,
        "slots-free-and-blocked": 0,
        "jobs-running": views.iter().filter(|v| !v.state.is_ended()).count(),
        "jobs-finished": count(JobState::Finished),
        "jobs-cancelled": count(JobState::Canceled),
        "jobs-failed": count(JobState::Failed),
        "flink-version": FLINK_VERSION,
        "flink-commit": REVISION,
    })
}

/// How a configuration value is shown.
#[derive(Clone, Copy)]
enum Kind {
    /// Milliseconds, as Flink reports durations.
    Duration,
    /// A number.
    Count,
    /// true/false.
    Bool,
    /// Flink's `exactly_once` / `at_least_once`.
    Mode,
    /// A path, or null when unset.
    Path,
}

/// `GET /jobs/{jid}/checkpoints/config`: (JSON field, configuration key, how to show it).
const CONFIG_FIELDS: &[(&str, &str, Kind)] = &[
    ("mode", keys::CHECKPOINTING_MODE, Kind::Mode),
    ("interval", keys::CHECKPOINT_INTERVAL, Kind::Duration),
    ("timeout", keys::CHECKPOINT_TIMEOUT, Kind::Duration),
    ("min_pause", keys::MIN_PAUSE, Kind::Duration),
    (
        "max_concurrent",
        keys::MAX_CONCURRENT_CHECKPOINTS,
        Kind::Count,
    ),
    (
        "tolerable_failed",
        keys::TOLERABLE_FAILED_CHECKPOINTS,
        Kind::Count,
    ),
    ("unaligned", keys::UNALIGNED_ENABLED, Kind::Bool),
    (
        "aligned_checkpoint_timeout",
        keys::ALIGNED_CHECKPOINT_TIMEOUT,
        Kind::Duration,
    ),
    ("num_retained", keys::NUM_RETAINED, Kind::Count),
    ("checkpoint_dir", keys::CHECKPOINTS_DIR, Kind::Path),
];

/// What `JobConfig::describe` shows for an unset checkpoint directory.
const UNSET: &str = "(not set)";

/// `GET /jobs/{jid}/checkpoints/config`, from the effective configuration's (key, value)
/// pairs. A key that is missing is null; a value that does not parse is shown as its text.
pub(crate) fn checkpoint_config(view: &JobStatusView) -> Value {
    let mut out = Map::new();
    for &(field, key, kind) in CONFIG_FIELDS {
        let value = config_value(view, key).map_or(Value::Null, |v| render(v, kind));
        out.insert(field.into(), value);
    }
    Value::Object(out)
}

fn render(text: &str, kind: Kind) -> Value {
    let parsed = match kind {
        Kind::Duration => parse_duration(text)
            .ok()
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX).into()),
        Kind::Count => text.trim().parse::<u64>().ok().map(Value::from),
        Kind::Bool => parse_bool(text).ok().map(Value::from),
        Kind::Mode => CheckpointingMode::from_str(text)
            .ok()
            .map(|m| m.to_string().to_ascii_lowercase().into()),
        Kind::Path if text == UNSET || text.is_empty() => Some(Value::Null),
        Kind::Path => None,
    };
    parsed.unwrap_or_else(|| text.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_ids_are_stable_32_hex_digits() {
        let id = derived_id("Source: words -> Map");
        assert_eq!(id.len(), 32);
        assert!(id
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        // Fixed offsets, no per-process seed: every process and build derives the same id.
        assert_eq!(derived_id(""), "cbf29ce4842223256c62272e07bb0142");
        assert_eq!(id, derived_id("Source: words -> Map"));
        assert_ne!(derived_id("a"), derived_id("b"));
        assert_ne!(vertex_id("a", 0), vertex_id("a", 1));
    }

    #[test]
    fn stats_summarize_with_nearest_rank_percentiles() {
        let s = stats(1..=10);
        assert_eq!(
            s,
            json!({"min": 1, "max": 10, "avg": 5, "p50": 5.0, "p90": 9.0, "p95": 10.0, "p99": 10.0, "p999": 10.0})
        );
        assert_eq!(stats(std::iter::once(7))["p50"], 7.0);
        assert_eq!(stats(std::iter::empty())["max"], 0);
    }

    #[test]
    fn config_values_are_typed() {
        assert_eq!(render("10min", Kind::Duration), json!(600_000));
        assert_eq!(render("0ms", Kind::Duration), json!(0));
        assert_eq!(render("soon", Kind::Duration), json!("soon"));
        assert_eq!(render("3", Kind::Count), json!(3));
        assert_eq!(render("false", Kind::Bool), json!(false));
        assert_eq!(render("AT_LEAST_ONCE", Kind::Mode), json!("at_least_once"));
        assert_eq!(render(UNSET, Kind::Path), Value::Null);
        assert_eq!(render("/data/ckpt", Kind::Path), json!("/data/ckpt"));
    }
}
