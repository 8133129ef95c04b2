//! Failpoints: named points of checkpoint progress where a test can freeze a process and
//! then kill it, so a crash lands at a chosen moment instead of a wall-clock one.
//!
//! They are compiled into every build and inert unless the environment variable
//! `CAIRN_FAILPOINTS` is set when the process starts. It holds a comma-separated list of
//! `NAME=ID`: the first time point `NAME` is reached for a checkpoint id `>= ID`, the process
//! writes the line `NAME ACTUAL_ID` to the file named by `CAIRN_FAILPOINT_MARKER` (created and
//! fsynced; also logged as a warning) and the thread that reached the point parks forever. Other
//! threads go on (or block behind it naturally), and later arrivals at a point that already
//! fired pass through. A test waits for the marker, kills the process with SIGKILL and knows
//! where the kill landed. "At least ID" rather than "exactly ID" because a checkpoint can be
//! aborted (declined, timed out), and the marker says which one it was.
//!
//! | point | where the thread stops |
//! |---|---|
//! | `checkpoint-completed` | the coordinator wrote checkpoint ID's `_metadata`; no task has been notified |
//! | `upload` | a subtask's state file of checkpoint ID is written; its acknowledgement is not sent |
//! | `disk-uploaded` | a subtask uploaded the RocksDB files of checkpoint ID; its state file is not written |
//! | `sink-pre-committed` | a sink subtask pre-committed for checkpoint ID; it has not acknowledged, so ID cannot complete |
//! | `sink-committing` | checkpoint ID completed and a sink subtask was notified; it has not committed (others may have) |
//! | `sink-writing` | a PostgreSQL sink subtask wrote rows of checkpoint ID that are not final: into a transaction still open (2pc: not prepared; wal: with its commit record, not committed), or an upsert between barriers; an exactly-once Kafka sink subtask handed records of checkpoint ID to its open transaction |
//! | `sink-restoring` | a PostgreSQL or exactly-once Kafka sink restores a checkpoint, before any writer of the attempt runs: 2pc, wal and Kafka committed the first of the restored transactions (batches), not the others (Kafka: nor aborted the later ones); ID is the newest checkpoint they (upsert: its restored state; Kafka: the restored checkpoint) belong to |
//!
//! ```sh
//! CAIRN_FAILPOINTS=sink-committing=5 CAIRN_FAILPOINT_MARKER=/tmp/hit cairn run wordcount ...
//! ```
//!
//! Failpoints sit on per-checkpoint paths only, never on per-record ones; when the variable is
//! unset, [`hit`] costs one load of an initialised `OnceLock`.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

/// Environment variable holding the armed failpoints (`NAME=ID,...`).
pub const ENV_POINTS: &str = "CAIRN_FAILPOINTS";
/// Environment variable naming the file a reached failpoint is recorded in.
pub const ENV_MARKER: &str = "CAIRN_FAILPOINT_MARKER";

/// Every failpoint compiled in.
pub const POINTS: [&str; 7] = [
    "checkpoint-completed",
    "upload",
    "disk-uploaded",
    "sink-pre-committed",
    "sink-committing",
    "sink-writing",
    "sink-restoring",
];

struct Armed {
    name: String,
    min_id: u64,
    fired: AtomicBool,
}

static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();

/// Parses a `CAIRN_FAILPOINTS` value.
fn parse(spec: &str) -> Result<Vec<Armed>, String> {
    let mut armed = Vec::new();
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (name, id) = item
            .split_once('=')
            .ok_or_else(|| format!("{ENV_POINTS}: '{item}' is not NAME=CHECKPOINT_ID"))?;
        if !POINTS.contains(&name) {
            return Err(format!(
                "{ENV_POINTS}: unknown failpoint '{name}' (known: {})",
                POINTS.join(", ")
            ));
        }
        let min_id = id
            .parse::<u64>()
            .map_err(|_| format!("{ENV_POINTS}: '{id}' in '{item}' is not a checkpoint id"))?;
        armed.push(Armed {
            name: name.to_string(),
            min_id,
            fired: AtomicBool::new(false),
        });
    }
    Ok(armed)
}

fn armed() -> &'static [Armed] {
    ARMED.get_or_init(|| match std::env::var(ENV_POINTS) {
        Ok(spec) => parse(&spec).unwrap_or_else(|e| {
            tracing::error!("{e}; no failpoint is armed");
            Vec::new()
        }),
        Err(_) => Vec::new(),
    })
}

/// Checks `CAIRN_FAILPOINTS` once at startup, so a typo is an error instead of a test that
/// silently never pauses.
pub fn validate_env() -> Result<(), String> {
    match std::env::var(ENV_POINTS) {
        Ok(spec) => parse(&spec).map(|_| ()),
        Err(_) => Ok(()),
    }
}

/// Failpoint `name` reached for checkpoint `id`: parks this thread forever if the point is
/// armed for it (see the module docs); returns at once otherwise.
pub fn hit(name: &'static str, id: u64) {
    let armed = armed();
    if armed.is_empty() {
        return;
    }
    debug_assert!(POINTS.contains(&name), "failpoint {name} is not in POINTS");
    // Only the first arrival at a matching point stops; `swap` makes that race-free.
    let fires = armed
        .iter()
        .any(|p| p.name == name && id >= p.min_id && !p.fired.swap(true, Ordering::AcqRel));
    if !fires {
        return;
    }
    tracing::warn!("failpoint {name} reached at checkpoint {id}: pausing this thread");
    if let Ok(path) = std::env::var(ENV_MARKER) {
        let written = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .and_then(|mut f| {
                f.write_all(format!("{name} {id}\n").as_bytes())?;
                f.sync_all()
            });
        if let Err(e) = written {
            tracing::error!("failpoint {name}: cannot write the marker {path}: {e}");
        }
    }
    loop {
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_arms_known_points_with_their_ids() {
        let armed = parse("upload=4, sink-committing=7").unwrap();
        let got: Vec<(&str, u64)> = armed.iter().map(|p| (p.name.as_str(), p.min_id)).collect();
        assert_eq!(got, vec![("upload", 4), ("sink-committing", 7)]);
        assert!(parse("").unwrap().is_empty());
    }

    #[test]
    fn a_bad_spec_names_what_is_wrong() {
        let e = parse("uplod=4").err().unwrap();
        assert!(e.contains("unknown failpoint 'uplod'"), "{e}");
        let e = parse("upload").err().unwrap();
        assert!(e.contains("'upload' is not NAME=CHECKPOINT_ID"), "{e}");
        let e = parse("upload=x").err().unwrap();
        assert!(
            e.contains("'x' in 'upload=x' is not a checkpoint id"),
            "{e}"
        );
    }
}
