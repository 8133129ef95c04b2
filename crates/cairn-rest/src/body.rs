//! The JSON bodies, built from a [`JobStatusView`] in Flink's shapes.

use std::str::FromStr;

use cairn::checkpoint::CheckpointMetadata;
use cairn::config::{keys, parse_bool, parse_duration, CheckpointingMode};
use cairn::runtime::JobStatusView;
use serde_json::{json, Map, Value};

/// `GET /jobs`: one entry.
pub(crate) fn job_overview(view: &JobStatusView) -> Result<Value, serde_json::Error> {
    Ok(json!({ "id": view.jid, "status": serde_json::to_value(view.state)? }))
}

/// `GET /jobs/{jid}`. `now_ms` measures the duration of a job that has not ended.
pub(crate) fn job_details(view: &JobStatusView, now_ms: u64) -> Result<Value, serde_json::Error> {
    let end = view.end_time.unwrap_or(now_ms);
    Ok(json!({
        "jid": view.jid,
        "name": view.name,
        "state": serde_json::to_value(view.state)?,
        "start-time": view.start_time,
        // Flink's "not ended yet".
        "end-time": view.end_time.map_or(-1, |t| i64::try_from(t).unwrap_or(i64::MAX)),
        "duration": end.saturating_sub(view.start_time),
        "restarts": view.restarts,
        "failure-cause": view.failure_cause,
    }))
}

/// `GET /jobs/{jid}/checkpoints`: counts, the latest completed checkpoint, and the history
/// newest first.
pub(crate) fn checkpoints(view: &JobStatusView) -> Result<Value, serde_json::Error> {
    let history = view
        .checkpoint_history
        .iter()
        .rev()
        .map(checkpoint_entry)
        .collect::<Result<Vec<_>, _>>()?;
    let latest = history.first().cloned().unwrap_or(Value::Null);
    Ok(json!({
        "counts": serde_json::to_value(&view.checkpoint_counts)?,
        "latest": { "completed": latest },
        "history": history,
    }))
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

/// One completed checkpoint. Fields of [`CheckpointMetadata`] that have no Flink name are
/// passed through as serde serializes them, and the per-task statistics are serialized whole,
/// so fields added to either appear without a change here.
pub(crate) fn checkpoint_entry(meta: &CheckpointMetadata) -> Result<Value, serde_json::Error> {
    let mut entry = match serde_json::to_value(meta)? {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    for field in CONSUMED_FIELDS {
        entry.remove(*field);
    }
    entry.insert("id".into(), meta.checkpoint_id.into());
    entry.insert("status".into(), "COMPLETED".into());
    entry.insert("trigger_timestamp".into(), meta.trigger_timestamp_ms.into());
    entry.insert(
        "latest_ack_timestamp".into(),
        meta.completed_timestamp_ms.into(),
    );
    entry.insert("end_to_end_duration".into(), meta.duration_ms().into());
    entry.insert("state_size".into(), meta.state_size.into());
    entry.insert("tasks".into(), serde_json::to_value(&meta.tasks)?);
    Ok(Value::Object(entry))
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
        let value = view
            .config
            .iter()
            .find(|(k, _)| k == key)
            .map_or(Value::Null, |(_, v)| render(v, kind));
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
