//! Finding, validating and loading the checkpoint to restore from.
//!
//! A checkpoint is usable only if its `_metadata` and every state file it names decode with a
//! matching format version and checksum; restoring never reads garbage. A checkpoint that never
//! completed (no `_metadata`) is skipped with a warning; a *completed* one that fails validation
//! stops the restore, because an older checkpoint would repeat output that sinks committed.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::warn;

use super::CheckpointMetadata;
use crate::config::MAX_MAX_PARALLELISM;
use crate::state::keygroup::KeyGroupRange;
use crate::state::rocks::DiskFileLocation;
use crate::state::{
    DiskStateData, KeyedTableData, OperatorListData, OperatorStateData, RestoredState, StateKind,
};
use crate::storage::format::{decode, FileKind, HEADER_LEN};
use crate::storage::layout::{checkpoint_dir, metadata_path, parse_checkpoint_dir, METADATA_FILE};
use crate::storage::{validate_path, CheckpointStorage, FsStorage};

/// The content of one subtask's state file: the state of every operator of its chain.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct TaskStateFile {
    /// One entry per stateful operator.
    pub operators: Vec<OperatorStateData>,
    /// The disk state (RocksDB checkpoints) of its operators whose keyed state is on disk.
    /// Added in format version 3; last, so that a version 2 file reads with it empty.
    pub disk: Vec<crate::state::DiskStateData>,
}

/// A validated checkpoint, loaded into memory.
#[derive(Debug, Clone)]
pub struct LoadedCheckpoint {
    /// Its metadata.
    pub metadata: CheckpointMetadata,
    /// Where it lives (for log lines).
    pub location: String,
    /// Storage root and job id it was loaded from (a savepoint: its own directory).
    pub storage_root: Option<PathBuf>,
    /// A self-contained savepoint directory, not `<root>/<job-id>/chk-<n>`.
    pub self_contained: bool,
    /// Operator uid → (old subtask, state), by old subtask index.
    states: HashMap<String, Vec<(u32, OperatorStateData)>>,
    /// Operator uid → its disk state (RocksDB checkpoints), one per old subtask.
    disk: HashMap<String, Vec<DiskStateData>>,
}

impl LoadedCheckpoint {
    /// The checkpoint id.
    pub fn id(&self) -> u64 {
        self.metadata.checkpoint_id
    }

    /// Per old subtask of operator `uid`: its states as `kind 'name' (bytes)`, for people.
    pub fn describe_operator(&self, uid: &str) -> Vec<(u32, String)> {
        let Some(subtasks) = self.states.get(uid) else {
            return Vec::new();
        };
        subtasks
            .iter()
            .map(|(subtask, data)| {
                let mut parts: Vec<String> = data
                    .keyed
                    .iter()
                    .map(|t| {
                        let bytes: usize = t.groups.iter().map(|(_, b)| b.len()).sum();
                        format!(
                            "{} state '{}' of {} ({} key groups, {bytes} B)",
                            t.kind,
                            t.name,
                            t.serializer.type_name,
                            t.groups.len()
                        )
                    })
                    .collect();
                parts.extend(data.operator.iter().map(|l| {
                    let bytes: usize = l.entries.iter().map(Vec::len).sum();
                    format!(
                        "{} state '{}' of {} ({} entries, {bytes} B)",
                        l.kind,
                        l.name,
                        l.serializer.type_name,
                        l.entries.len()
                    )
                }));
                if let Some(ch) = &data.channel {
                    let bytes: usize = ch
                        .channels
                        .iter()
                        .flat_map(|(_, b)| b.iter().map(Vec::len))
                        .sum();
                    parts.push(format!("in-flight data ({bytes} B)"));
                }
                if parts.is_empty() {
                    parts.push("empty".into());
                }
                (*subtask, parts.join(", "))
            })
            .collect()
    }

    /// The local directory holding it: the savepoint's own, or `<root>/<job-id>/chk-<n>`.
    pub fn snapshot_dir(&self) -> Option<PathBuf> {
        let root = self.storage_root.as_ref()?;
        Some(if self.self_contained {
            root.clone()
        } else {
            root.join(checkpoint_dir(&self.metadata.job_id, self.id()))
        })
    }

    /// Uids of the operators with state.
    pub fn uids(&self) -> impl Iterator<Item = &str> {
        self.states.keys().map(|s| s.as_str())
    }

    /// Uids of the operators whose state holds anything (a stateless operator's entry, or
    /// one whose states are all empty, holds nothing a job could lose by not having it).
    pub fn uids_holding_state(&self) -> impl Iterator<Item = &str> {
        self.states
            .iter()
            .filter(|(uid, subtasks)| {
                self.disk.get(*uid).is_some_and(|d| !d.is_empty())
                    || subtasks.iter().any(|(_, data)| {
                        data.keyed.iter().any(|t| !t.groups.is_empty())
                            || data.operator.iter().any(|l| !l.entries.is_empty())
                            || data.channel.is_some()
                    })
            })
            .map(|(uid, _)| uid.as_str())
    }

    /// The state subtask `subtask` of `parallelism` of operator `uid` gets: keyed state of the
    /// key groups it owns (from whichever old subtasks held them — rescaling); of an operator
    /// list state its own entries when the parallelism is unchanged, else an even share of all
    /// entries (contiguous, in old subtask order); of a union list state all entries.
    pub fn restored_for(&self, uid: &str, subtask: u32, parallelism: u32) -> RestoredState {
        let mut out = RestoredState::default();
        let Some(old) = self.states.get(uid) else {
            return out;
        };
        let range = KeyGroupRange::for_subtask(self.metadata.max_parallelism, parallelism, subtask);
        out.disk = self
            .disk
            .get(uid)
            .into_iter()
            .flatten()
            .filter(|d| d.range().intersects(&range))
            .cloned()
            .collect();
        out.disk_root = self.storage_root.clone();
        for (_, data) in old {
            for t in &data.keyed {
                let table = out
                    .keyed
                    .entry(t.name.clone())
                    .or_insert_with(|| KeyedTableData {
                        name: t.name.clone(),
                        kind: t.kind,
                        serializer: t.serializer.clone(),
                        groups: Vec::new(),
                    });
                table.groups.extend(
                    t.groups
                        .iter()
                        .filter(|(kg, _)| range.contains(*kg))
                        .cloned(),
                );
            }
        }
        let unchanged = self.parallelism_of(uid) == Some(parallelism);
        if unchanged {
            if let Some((_, data)) = old.iter().find(|(s, _)| *s == subtask) {
                out.channel = data.channel.clone();
            }
        }
        // Each list's entries in old subtask order: a union list's all, an operator list's own
        // (same parallelism) or all, to be split below (another parallelism).
        for (s, data) in old {
            for l in &data.operator {
                let list = out
                    .operator
                    .entry(l.name.clone())
                    .or_insert_with(|| OperatorListData {
                        name: l.name.clone(),
                        kind: l.kind,
                        serializer: l.serializer.clone(),
                        entries: Vec::new(),
                    });
                if l.kind == StateKind::UnionList || !unchanged || *s == subtask {
                    list.entries.extend(l.entries.iter().cloned());
                }
            }
        }
        if !unchanged {
            for list in out.operator.values_mut() {
                if list.kind == StateKind::OperatorList {
                    let all = std::mem::take(&mut list.entries);
                    list.entries = even_share(all, subtask, parallelism);
                }
            }
        }
        out
    }

    /// Whether operator `uid` has in-flight data (unaligned checkpoint) in this checkpoint.
    pub fn has_channel_state(&self, uid: &str) -> bool {
        self.states.get(uid).is_some_and(|old| {
            old.iter()
                .any(|(_, d)| d.channel.as_ref().is_some_and(|c| !c.channels.is_empty()))
        })
    }

    /// The parallelism operator `uid` had in this checkpoint.
    pub fn parallelism_of(&self, uid: &str) -> Option<u32> {
        self.metadata
            .operators
            .iter()
            .find(|o| o.uid == uid)
            .map(|o| o.parallelism)
    }

    /// Every entry of operator list state `name` of `uid`, over all old subtasks (a sink's
    /// pre-committed transactions are committed by one global step).
    pub fn all_list_entries(&self, uid: &str, name: &str) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if let Some(old) = self.states.get(uid) {
            for (_, data) in old {
                for l in data.operator.iter().filter(|l| l.name == name) {
                    out.extend(l.entries.iter().cloned());
                }
            }
        }
        out
    }
}

/// Subtask `subtask`'s share of `entries` split evenly over `parallelism` subtasks: contiguous
/// runs, the first `len % parallelism` of them one entry longer.
fn even_share(mut entries: Vec<Vec<u8>>, subtask: u32, parallelism: u32) -> Vec<Vec<u8>> {
    let (n, p, i) = (entries.len(), parallelism.max(1) as usize, subtask as usize);
    let (base, extra) = (n / p, n % p);
    let start = i * base + i.min(extra);
    let len = base + usize::from(i < extra);
    if start >= n {
        return Vec::new();
    }
    entries.truncate(start + len);
    entries.drain(..start);
    entries
}

/// Loads and validates checkpoint `id` of job `job_id`.
pub fn load_checkpoint(
    storage: &dyn CheckpointStorage,
    job_id: &str,
    id: u64,
) -> Result<LoadedCheckpoint, String> {
    load_dir(storage, &checkpoint_dir(job_id, id), Some((job_id, id)))
}

/// Loads the checkpoint or savepoint in directory `dir` of `storage` (the empty string: its
/// root), reading and verifying every file it references before anything is restored.
/// `expect`: the job and checkpoint its `_metadata` must name (a savepoint may come from any).
pub fn load_dir(
    storage: &dyn CheckpointStorage,
    dir: &str,
    expect: Option<(&str, u64)>,
) -> Result<LoadedCheckpoint, String> {
    let join = |name: &str| {
        if dir.is_empty() {
            name.to_string()
        } else {
            format!("{dir}/{name}")
        }
    };
    let meta_path = join(METADATA_FILE);
    let bytes = storage.read(&meta_path).map_err(|e| e.to_string())?;
    let metadata: CheckpointMetadata = decode(FileKind::Metadata, &bytes)
        .map_err(|e| format!("{}: {e}", storage.location(&meta_path)))?;
    if let Some((job_id, id)) = expect {
        if metadata.checkpoint_id != id || metadata.job_id != job_id {
            return Err(format!(
                "{}: metadata names checkpoint {} of job {}",
                storage.location(&meta_path),
                metadata.checkpoint_id,
                metadata.job_id
            ));
        }
    }
    validate_metadata(&metadata).map_err(|e| format!("{}: {e}", storage.location(&meta_path)))?;
    let mut files: HashMap<String, TaskStateFile> = HashMap::new();
    let mut states: HashMap<String, Vec<(u32, OperatorStateData)>> = HashMap::new();
    for op in &metadata.operators {
        for h in &op.subtasks {
            if !files.contains_key(&h.file) {
                let path = join(&h.file);
                let bytes = storage.read(&path).map_err(|e| e.to_string())?;
                let f: TaskStateFile = decode(FileKind::TaskState, &bytes)
                    .map_err(|e| format!("{}: {e}", storage.location(&path)))?;
                validate_state_file(&f, metadata.max_parallelism)
                    .map_err(|e| format!("{}: {e}", storage.location(&path)))?;
                files.insert(h.file.clone(), f);
            }
            let data = files
                .get(&h.file)
                .and_then(|f| f.operators.iter().find(|o| o.uid == op.uid))
                .cloned()
                .ok_or_else(|| format!("state of operator '{}' missing from {}", op.uid, h.file))?;
            states
                .entry(op.uid.clone())
                .or_default()
                .push((h.subtask, data));
        }
    }
    for v in states.values_mut() {
        v.sort_by_key(|(s, _)| *s);
    }
    let mut disk: HashMap<String, Vec<DiskStateData>> = HashMap::new();
    for f in files.into_values() {
        for d in f.disk {
            check_disk_files(storage, &d)?;
            disk.entry(d.uid.clone()).or_default().push(d);
        }
    }
    Ok(LoadedCheckpoint {
        metadata,
        location: storage.location(dir),
        storage_root: None,
        self_contained: false,
        states,
        disk,
    })
}

/// Every file a disk state references is there, whole (its frame's length): a checkpoint whose
/// shared file was deleted or truncated is not restorable.
fn check_disk_files(storage: &dyn CheckpointStorage, d: &DiskStateData) -> Result<(), String> {
    for f in &d.files {
        if let DiskFileLocation::Stored { path, size } = &f.location {
            let expected = size + HEADER_LEN as u64;
            match storage.size(path) {
                Ok(actual) if actual == expected => {}
                Ok(actual) => {
                    return Err(format!(
                        "{}: {actual} bytes, expected {expected} (state of operator '{}')",
                        storage.location(path),
                        d.uid
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "{}: {e} (state of operator '{}')",
                        storage.location(path),
                        d.uid
                    ))
                }
            }
        }
    }
    Ok(())
}

/// Checks every index in `_metadata` that restoring computes with or compares against: the
/// file is checksummed, but it may come from another build or have been edited.
/// The `_metadata` of checkpoint `id` of job `job_id` (decoded, not validated).
pub fn read_metadata(
    storage: &dyn CheckpointStorage,
    job_id: &str,
    id: u64,
) -> Result<CheckpointMetadata, String> {
    let path = metadata_path(job_id, id);
    let bytes = storage.read(&path).map_err(|e| e.to_string())?;
    decode(FileKind::Metadata, &bytes).map_err(|e| format!("{}: {e}", storage.location(&path)))
}

fn validate_metadata(m: &CheckpointMetadata) -> Result<(), String> {
    if !(1..=MAX_MAX_PARALLELISM).contains(&m.max_parallelism) {
        return Err(format!(
            "max parallelism {} is outside 1..={MAX_MAX_PARALLELISM}",
            m.max_parallelism
        ));
    }
    for op in &m.operators {
        if op.parallelism == 0 {
            return Err(format!("operator '{}' has parallelism 0", op.uid));
        }
        let mut seen = HashSet::new();
        for h in &op.subtasks {
            if h.subtask >= op.parallelism {
                return Err(format!(
                    "operator '{}' has state for subtask {} but parallelism {}",
                    op.uid, h.subtask, op.parallelism
                ));
            }
            if !seen.insert(h.subtask) {
                return Err(format!(
                    "operator '{}' has two states for subtask {}",
                    op.uid, h.subtask
                ));
            }
            // A state file lies inside its checkpoint directory.
            if h.file.contains('/') || validate_path(&h.file).is_err() {
                return Err(format!(
                    "operator '{}' names state file '{}', which is not a file name",
                    op.uid, h.file
                ));
            }
        }
    }
    Ok(())
}

/// Checks the indices of a task state file: key groups against the checkpoint's max
/// parallelism, and input channels of in-flight data against the subtask's channel count (the
/// task indexes its channels by them when it replays the data).
fn validate_state_file(f: &TaskStateFile, max_parallelism: u32) -> Result<(), String> {
    for op in &f.operators {
        let keyed_kinds = [
            StateKind::Value,
            StateKind::List,
            StateKind::Map,
            StateKind::Reducing,
            StateKind::Aggregating,
            StateKind::Timers,
        ];
        if let Some(t) = op.keyed.iter().find(|t| !keyed_kinds.contains(&t.kind)) {
            return Err(format!(
                "keyed state '{}' of operator '{}' has kind {}, which is not a keyed kind",
                t.name, op.uid, t.kind
            ));
        }
        if let Some(l) = op.operator.iter().find(|l| keyed_kinds.contains(&l.kind)) {
            return Err(format!(
                "operator state '{}' of operator '{}' has kind {}, which is a keyed kind",
                l.name, op.uid, l.kind
            ));
        }
        for t in &op.keyed {
            if let Some((kg, _)) = t.groups.iter().find(|(kg, _)| *kg >= max_parallelism) {
                return Err(format!(
                    "keyed state '{}' of operator '{}' holds key group {kg}, but there are only {max_parallelism}",
                    t.name, op.uid
                ));
            }
        }
        if let Some(c) = &op.channel {
            let mut seen = HashSet::new();
            for (ch, _) in &c.channels {
                if *ch >= c.channels_total {
                    return Err(format!(
                        "in-flight data of operator '{}' names input channel {ch} of {}",
                        op.uid, c.channels_total
                    ));
                }
                if !seen.insert(*ch) {
                    return Err(format!(
                        "in-flight data of operator '{}' names input channel {ch} twice",
                        op.uid
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The ids of the checkpoint directories of job `job_id`, completed or not, ascending.
pub fn checkpoint_ids(storage: &dyn CheckpointStorage, job_id: &str) -> Vec<u64> {
    let mut ids: Vec<u64> = storage
        .list(job_id)
        .unwrap_or_default()
        .iter()
        .filter_map(|n| parse_checkpoint_dir(n))
        .collect();
    ids.sort_unstable();
    ids
}

/// The newest completed checkpoint under a checkpoint directory (all jobs).
///
/// Within a job checkpoints are ordered by id, and the newest is its completed checkpoint with
/// the highest id; among jobs, the one whose newest checkpoint completed last. A checkpoint
/// completed iff its `_metadata` exists (it is written last, atomically), and once it
/// completed, sinks may have committed the output before it. So only directories without
/// `_metadata` — checkpoints that never completed — are passed over (with a warning naming
/// each). If the newest completed checkpoint fails validation, the restore stops with an error:
/// falling back to an older one would emit again what the sinks already committed. An older
/// checkpoint is never read, so a damaged one never blocks a restore; the user can still pick
/// one explicitly, by path.
pub fn find_latest(storage: &dyn CheckpointStorage) -> Result<Option<LoadedCheckpoint>, String> {
    find_latest_of(storage, None)
}

/// The id of job `job`'s newest completed checkpoint (the highest id with `_metadata`),
/// warning about each newer one that never completed.
pub fn newest_completed(storage: &dyn CheckpointStorage, job: &str) -> Option<u64> {
    let ids = checkpoint_ids(storage, job);
    for &id in ids.iter().rev() {
        if storage.exists(&metadata_path(job, id)).unwrap_or(false) {
            return Some(id);
        }
        warn!(
            "skipping checkpoint {}: it never completed (no _metadata)",
            storage.location(&checkpoint_dir(job, id))
        );
    }
    None
}

/// [`find_latest`] among the checkpoints of job `only` (all jobs: None).
pub fn find_latest_of(
    storage: &dyn CheckpointStorage,
    only: Option<&str>,
) -> Result<Option<LoadedCheckpoint>, String> {
    let jobs = storage.list("").map_err(|e| e.to_string())?;
    // Per job, its newest completed checkpoint and when it completed. A metadata file that
    // does not decode sorts newest: its checkpoint completed, and when is unknown, so it must
    // not be passed over.
    let mut newest: Vec<(u64, u64, String)> = Vec::new();
    for job in jobs.into_iter().filter(|j| only.is_none_or(|o| o == j)) {
        if let Some(id) = newest_completed(storage, &job) {
            let ts =
                read_metadata(storage, &job, id).map_or(u64::MAX, |m| m.completed_timestamp_ms);
            newest.push((ts, id, job));
        }
    }
    newest.sort();
    let Some((_, id, job)) = newest.pop() else {
        return Ok(None);
    };
    load_checkpoint(storage, &job, id).map(Some).map_err(|e| {
        format!(
            "the newest completed checkpoint {} is unusable: {e}; restoring an older checkpoint \
             would repeat output its sinks already committed, so nothing was restored \
             (to resume from an older checkpoint anyway, pass it with --from PATH)",
            storage.location(&checkpoint_dir(&job, id))
        )
    })
}

/// The job to continue when `--from latest` finds no completed checkpoint: the one job whose
/// directory holds checkpoint directories (none completed). It starts fresh under its own id, so
/// that its sinks discard what it pre-committed: nothing of it was ever committed. With several
/// such jobs none is picked (which ran last is not recorded), and a warning names them.
pub fn unfinished_job(storage: &dyn CheckpointStorage) -> Result<Option<String>, String> {
    let jobs = storage.list("").map_err(|e| e.to_string())?;
    let mut unfinished: Vec<String> = jobs
        .into_iter()
        .filter(|j| !checkpoint_ids(storage, j).is_empty())
        .collect();
    unfinished.sort_unstable();
    match unfinished.len() {
        0 => Ok(None),
        1 => Ok(unfinished.pop()),
        _ => {
            warn!(
                "jobs {} under {} completed no checkpoint; starting a new job (their uncommitted output stays behind)",
                unfinished.join(", "),
                storage.location("")
            );
            Ok(None)
        }
    }
}

/// Loads the checkpoint at `path`: a `chk-<n>` directory or its `_metadata` file.
pub fn load_from_path(path: &Path) -> Result<(LoadedCheckpoint, Arc<FsStorage>), String> {
    let mut dir = path.to_path_buf();
    if dir.file_name().is_some_and(|n| n == METADATA_FILE) {
        dir.pop();
    }
    if !dir.is_dir() {
        return Err(format!("checkpoint {} does not exist", path.display()));
    }
    let dir = dir
        .canonicalize()
        .map_err(|e| format!("cannot open checkpoint {}: {e}", path.display()))?;
    let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if parse_checkpoint_dir(name).is_none() && dir.join(METADATA_FILE).is_file() {
        // A savepoint (or a checkpoint directory copied elsewhere): self-contained.
        let storage = Arc::new(FsStorage::open(&dir).map_err(|e| e.to_string())?);
        let mut c = load_dir(storage.as_ref(), "", None)
            .map_err(|e| format!("savepoint {} is unusable: {e}", path.display()))?;
        c.storage_root = Some(dir.clone());
        c.self_contained = true;
        return Ok((c, storage));
    }
    let id = parse_checkpoint_dir(name).ok_or_else(|| {
        format!(
            "{} is not a checkpoint directory (expected .../<job-id>/chk-<n>)",
            path.display()
        )
    })?;
    let job_dir = dir
        .parent()
        .ok_or_else(|| format!("{} has no job directory", path.display()))?;
    let job_id = job_dir
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| format!("{} has no job directory", path.display()))?
        .to_string();
    let root = job_dir
        .parent()
        .ok_or_else(|| format!("{} has no checkpoint root", path.display()))?;
    let storage = Arc::new(FsStorage::open(root).map_err(|e| e.to_string())?);
    let mut c = load_checkpoint(storage.as_ref(), &job_id, id)
        .map_err(|e| format!("checkpoint {} is unusable: {e}", path.display()))?;
    c.storage_root = Some(root.to_path_buf());
    Ok((c, storage))
}

/// One checkpoint directory, as `cairn checkpoints` shows it.
#[derive(Debug, Clone)]
pub struct CheckpointInfo {
    /// Job id.
    pub job_id: String,
    /// Checkpoint id.
    pub id: u64,
    /// Metadata, when the checkpoint is complete and valid.
    pub metadata: Option<CheckpointMetadata>,
    /// Bytes on disk.
    pub size: u64,
    /// Why it is not usable, if it is not.
    pub problem: Option<String>,
}

/// Every checkpoint directory under `storage` (a checkpoint root holding job directories).
pub fn list_checkpoints(storage: &dyn CheckpointStorage) -> Result<Vec<CheckpointInfo>, String> {
    let mut out = Vec::new();
    for job in storage.list("").map_err(|e| e.to_string())? {
        for id in checkpoint_ids(storage, &job) {
            let size = storage.size(&checkpoint_dir(&job, id)).unwrap_or(0);
            let (metadata, problem) = if storage.exists(&metadata_path(&job, id)).unwrap_or(false) {
                match load_checkpoint(storage, &job, id) {
                    Ok(c) => (Some(c.metadata), None),
                    Err(e) => (None, Some(e)),
                }
            } else {
                (None, Some("incomplete: no _metadata".to_string()))
            };
            out.push(CheckpointInfo {
                job_id: job.clone(),
                id,
                metadata,
                size,
                problem,
            });
        }
    }
    Ok(out)
}

/// Deletes the savepoint in directory `path`, after checking that it is one (a self-contained
/// directory whose `_metadata` reads; a checkpoint inside a job's directory is the job's, not
/// the user's, and is refused).
pub fn dispose_savepoint(path: &Path) -> Result<(), String> {
    let (c, _) = load_from_path(path)?;
    if !c.self_contained {
        return Err(format!(
            "{} is a checkpoint of job {}, not a savepoint; it is deleted by retention",
            path.display(),
            c.metadata.job_id
        ));
    }
    let dir = c.storage_root.unwrap_or_else(|| path.to_path_buf());
    std::fs::remove_dir_all(&dir).map_err(|e| format!("cannot delete {}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::{OperatorMetadata, SubtaskStateHandle};
    use crate::state::{ChannelStateData, SerializerId};
    use crate::storage::format::encode;
    use crate::storage::MemoryStorage;

    /// Writes a completed checkpoint `id` of job `job` with one state file, as the coordinator
    /// would: state first, `_metadata` last.
    fn write_completed(storage: &MemoryStorage, job: &str, id: u64) {
        let dir = checkpoint_dir(job, id);
        let state = TaskStateFile {
            operators: vec![OperatorStateData {
                uid: "src".into(),
                keyed: Vec::new(),
                operator: vec![OperatorListData::connector(
                    "splits",
                    "u64",
                    vec![id.to_le_bytes().to_vec()],
                )],
                channel: None,
            }],
            disk: Vec::new(),
        };
        let bytes = encode(FileKind::TaskState, &state).unwrap();
        storage.write(&format!("{dir}/task-0-0"), &bytes).unwrap();
        let meta = CheckpointMetadata {
            job_id: job.into(),
            job_name: "test".into(),
            checkpoint_id: id,
            trigger_timestamp_ms: id * 1000,
            completed_timestamp_ms: id * 1000 + 10,
            max_parallelism: 128,
            operators: vec![OperatorMetadata {
                uid: "src".into(),
                parallelism: 1,
                subtasks: vec![SubtaskStateHandle {
                    subtask: 0,
                    file: "task-0-0".into(),
                }],
                states: Vec::new(),
            }],
            state_size: bytes.len() as u64,
            tasks: Vec::new(),
            shared_files: Vec::new(),
        };
        let bytes = encode(FileKind::Metadata, &meta).unwrap();
        storage
            .write_atomic(&metadata_path(job, id), &bytes)
            .unwrap();
    }

    fn corrupt(storage: &MemoryStorage, path: &str) {
        let mut bytes = storage.read(path).unwrap();
        let i = bytes.len() / 2;
        bytes[i] ^= 0xff;
        storage.write(path, &bytes).unwrap();
    }

    #[test]
    fn the_newest_completed_checkpoint_is_restored() {
        let storage = MemoryStorage::new();
        write_completed(&storage, "job", 1);
        write_completed(&storage, "job", 2);
        let c = find_latest(&storage).unwrap().unwrap();
        assert_eq!(c.id(), 2);
    }

    #[test]
    fn a_checkpoint_that_never_completed_is_skipped() {
        let storage = MemoryStorage::new();
        write_completed(&storage, "job", 1);
        // Checkpoint 2 was being written when the process died: state, no `_metadata`.
        storage
            .write(
                &format!("{}/task-0-0", checkpoint_dir("job", 2)),
                b"partial",
            )
            .unwrap();
        let c = find_latest(&storage).unwrap().unwrap();
        assert_eq!(c.id(), 1);
    }

    #[test]
    fn only_a_sole_job_without_completed_checkpoints_is_continued() {
        let storage = MemoryStorage::new();
        assert_eq!(unfinished_job(&storage).unwrap(), None);
        let partial = |job: &str| {
            let path = format!("{}/task-0-0", checkpoint_dir(job, 1));
            storage.write(&path, b"partial").unwrap();
        };
        partial("a");
        assert_eq!(unfinished_job(&storage).unwrap().as_deref(), Some("a"));
        // Which of two ran last is not recorded: neither is guessed.
        partial("b");
        assert_eq!(unfinished_job(&storage).unwrap(), None);
    }

    #[test]
    fn a_completed_checkpoint_with_a_damaged_state_file_stops_the_restore() {
        let storage = MemoryStorage::new();
        write_completed(&storage, "job", 1);
        write_completed(&storage, "job", 2);
        let file = format!("{}/task-0-0", checkpoint_dir("job", 2));
        corrupt(&storage, &file);
        let err = find_latest(&storage)
            .map(|c| c.map(|c| c.id()))
            .unwrap_err();
        assert!(
            err.contains(&storage.location(&file)),
            "names the file: {err}"
        );
        assert!(err.contains("would repeat output"), "{err}");
        // The older checkpoint is still there, for a user who picks it knowingly.
        assert_eq!(load_checkpoint(&storage, "job", 1).unwrap().id(), 1);
    }

    #[test]
    fn a_completed_checkpoint_with_damaged_metadata_stops_the_restore() {
        let storage = MemoryStorage::new();
        write_completed(&storage, "job", 1);
        write_completed(&storage, "job", 2);
        corrupt(&storage, &metadata_path("job", 2));
        let err = find_latest(&storage)
            .map(|c| c.map(|c| c.id()))
            .unwrap_err();
        assert!(
            err.contains(&storage.location(&metadata_path("job", 2))),
            "names the file: {err}"
        );
        assert!(err.contains("would repeat output"), "{err}");
    }

    #[test]
    fn a_damaged_older_checkpoint_never_blocks_the_restore_of_the_newest() {
        let storage = MemoryStorage::new();
        for id in [1, 2, 9, 10] {
            write_completed(&storage, "job", id);
        }
        // Older ones damaged, both their metadata and their state: never read.
        corrupt(&storage, &metadata_path("job", 9));
        corrupt(&storage, &format!("{}/task-0-0", checkpoint_dir("job", 2)));
        // Ids order checkpoints within a job: 10 is newer than 9 and 2 (not by name).
        assert_eq!(find_latest(&storage).unwrap().unwrap().id(), 10);
        assert_eq!(
            find_latest_of(&storage, Some("job")).unwrap().unwrap().id(),
            10
        );
        assert_eq!(newest_completed(&storage, "job"), Some(10));
        // One that never completed, newer than all: skipped.
        storage
            .write(
                &format!("{}/task-0-0", checkpoint_dir("job", 11)),
                b"partial",
            )
            .unwrap();
        assert_eq!(find_latest(&storage).unwrap().unwrap().id(), 10);
    }

    #[test]
    fn the_latest_of_a_named_job_is_never_another_jobs() {
        let storage = MemoryStorage::new();
        write_completed(&storage, "a", 3);
        write_completed(&storage, "b", 7);
        assert_eq!(
            find_latest_of(&storage, Some("a")).unwrap().unwrap().id(),
            3
        );
        assert!(find_latest_of(&storage, Some("c")).unwrap().is_none());
        assert_eq!(newest_completed(&storage, "c"), None);
    }

    /// A checkpoint of one operator `op` at parallelism 2 whose subtask 1 has keyed state and
    /// in-flight data on two input channels; `edit` changes it before it is written.
    fn write_checkpoint(
        edit: impl FnOnce(&mut CheckpointMetadata, &mut TaskStateFile),
    ) -> MemoryStorage {
        let mut meta = CheckpointMetadata {
            job_id: "job".into(),
            job_name: "test".into(),
            checkpoint_id: 3,
            trigger_timestamp_ms: 1,
            completed_timestamp_ms: 2,
            max_parallelism: 4,
            operators: vec![OperatorMetadata {
                uid: "op".into(),
                parallelism: 2,
                subtasks: vec![SubtaskStateHandle {
                    subtask: 1,
                    file: "task-0-1".into(),
                }],
                states: Vec::new(),
            }],
            state_size: 0,
            tasks: Vec::new(),
            shared_files: Vec::new(),
        };
        let mut state = TaskStateFile {
            operators: vec![OperatorStateData {
                uid: "op".into(),
                keyed: vec![KeyedTableData {
                    name: "counts".into(),
                    kind: StateKind::Value,
                    serializer: SerializerId::postcard::<u64>(),
                    groups: vec![(2, vec![1]), (3, vec![2])],
                }],
                operator: Vec::new(),
                channel: Some(ChannelStateData {
                    channels_total: 2,
                    channels: vec![(0, vec![vec![7]]), (1, vec![vec![8], vec![9]])],
                }),
            }],
            disk: Vec::new(),
        };
        edit(&mut meta, &mut state);
        let storage = MemoryStorage::new();
        storage
            .write(
                "job/chk-3/task-0-1",
                &encode(FileKind::TaskState, &state).unwrap(),
            )
            .unwrap();
        storage
            .write_atomic(
                &metadata_path("job", 3),
                &encode(FileKind::Metadata, &meta).unwrap(),
            )
            .unwrap();
        storage
    }

    /// A checkpoint of operator "op" at parallelism 3 whose subtask i holds entries `i*10 ..
    /// i*10+i` (0, 1 and 2 entries) of list state "split" and one entry `100+i` of union list
    /// state "union".
    fn with_operator_lists() -> LoadedCheckpoint {
        let storage = MemoryStorage::new();
        let mut subtasks = Vec::new();
        for i in 0..3u8 {
            let file = format!("task-0-{i}");
            let list = |name: &str, kind, entries: Vec<Vec<u8>>| OperatorListData {
                name: name.into(),
                kind,
                serializer: SerializerId::postcard::<u8>(),
                entries,
            };
            let state = TaskStateFile {
                operators: vec![OperatorStateData {
                    uid: "op".into(),
                    keyed: Vec::new(),
                    operator: vec![
                        list(
                            "split",
                            StateKind::OperatorList,
                            (0..i).map(|j| vec![i * 10 + j]).collect(),
                        ),
                        list("union", StateKind::UnionList, vec![vec![100 + i]]),
                    ],
                    channel: None,
                }],
                disk: Vec::new(),
            };
            let path = format!("job/chk-3/{file}");
            storage
                .write(&path, &encode(FileKind::TaskState, &state).unwrap())
                .unwrap();
            subtasks.push(SubtaskStateHandle {
                subtask: u32::from(i),
                file,
            });
        }
        let meta = CheckpointMetadata {
            job_id: "job".into(),
            job_name: "test".into(),
            checkpoint_id: 3,
            trigger_timestamp_ms: 1,
            completed_timestamp_ms: 2,
            max_parallelism: 4,
            operators: vec![OperatorMetadata {
                uid: "op".into(),
                parallelism: 3,
                subtasks,
                states: Vec::new(),
            }],
            state_size: 0,
            tasks: Vec::new(),
            shared_files: Vec::new(),
        };
        storage
            .write_atomic(
                &metadata_path("job", 3),
                &encode(FileKind::Metadata, &meta).unwrap(),
            )
            .unwrap();
        load_checkpoint(&storage, "job", 3).unwrap()
    }

    fn lists_of(c: &LoadedCheckpoint, subtask: u32, parallelism: u32) -> (Vec<u8>, Vec<u8>) {
        let r = c.restored_for("op", subtask, parallelism);
        let flat = |name: &str| -> Vec<u8> { r.operator[name].entries.concat() };
        (flat("split"), flat("union"))
    }

    #[test]
    fn operator_lists_are_split_evenly_and_union_lists_go_whole_to_every_subtask() {
        let c = with_operator_lists();
        // Same parallelism: each subtask its own entries; the union list whole everywhere.
        assert_eq!(lists_of(&c, 1, 3), (vec![10], vec![100, 101, 102]));
        assert_eq!(lists_of(&c, 2, 3), (vec![20, 21], vec![100, 101, 102]));
        // 3 → 2: the 3 entries [10, 20, 21] split as [10, 20] and [21].
        assert_eq!(lists_of(&c, 0, 2), (vec![10, 20], vec![100, 101, 102]));
        assert_eq!(lists_of(&c, 1, 2), (vec![21], vec![100, 101, 102]));
        // 3 → 4: one entry each for three subtasks, none for the fourth.
        let split: Vec<Vec<u8>> = (0..4).map(|i| lists_of(&c, i, 4).0).collect();
        assert_eq!(split, vec![vec![10], vec![20], vec![21], vec![]]);
        assert_eq!(lists_of(&c, 3, 4).1, vec![100, 101, 102]);
        // 3 → 1: everything.
        assert_eq!(lists_of(&c, 0, 1), (vec![10, 20, 21], vec![100, 101, 102]));
    }

    #[test]
    fn only_operators_whose_state_holds_anything_count_as_holding_state() {
        let mut c = with_operator_lists();
        let empty = |uid: &str| OperatorStateData {
            uid: uid.into(),
            keyed: vec![KeyedTableData {
                name: "acc".into(),
                kind: StateKind::Value,
                serializer: SerializerId::postcard::<u8>(),
                groups: Vec::new(),
            }],
            operator: Vec::new(),
            channel: None,
        };
        c.states.insert("calc".into(), vec![(0, empty("calc"))]);
        let mut uids: Vec<&str> = c.uids().collect();
        uids.sort_unstable();
        assert_eq!(uids, ["calc", "op"]);
        assert_eq!(c.uids_holding_state().collect::<Vec<_>>(), ["op"]);
    }

    #[test]
    fn an_even_share_covers_every_entry_once() {
        for n in 0..20usize {
            for p in 1..8u32 {
                let entries: Vec<Vec<u8>> = (0..n).map(|i| vec![i as u8]).collect();
                let mut all = Vec::new();
                for i in 0..p {
                    let share = even_share(entries.clone(), i, p);
                    assert!(share.len() <= n.div_ceil(p as usize), "n={n} p={p}");
                    all.extend(share);
                }
                assert_eq!(all, entries, "n={n} p={p}");
            }
        }
    }

    fn load_error(edit: impl FnOnce(&mut CheckpointMetadata, &mut TaskStateFile)) -> String {
        match load_checkpoint(&write_checkpoint(edit), "job", 3) {
            Ok(_) => panic!("the checkpoint loaded"),
            Err(e) => e,
        }
    }

    #[test]
    fn a_valid_checkpoint_restores_its_channel_state_and_key_groups() {
        let c = load_checkpoint(&write_checkpoint(|_, _| {}), "job", 3).unwrap();
        let r = c.restored_for("op", 1, 2);
        assert_eq!(r.keyed["counts"].groups, vec![(2, vec![1]), (3, vec![2])]);
        let channel = r.channel.unwrap();
        assert_eq!(channel.channels_total, 2);
        assert_eq!(channel.channels[1], (1, vec![vec![8], vec![9]]));
    }

    #[test]
    fn channel_state_naming_a_channel_out_of_range_is_refused_naming_the_file() {
        let e = load_error(|_, s| {
            if let Some(c) = &mut s.operators[0].channel {
                c.channels[1].0 = 7;
            }
        });
        assert_eq!(
            e,
            "memory:/job/chk-3/task-0-1: in-flight data of operator 'op' names input channel 7 of 2"
        );
        let e = load_error(|_, s| {
            if let Some(c) = &mut s.operators[0].channel {
                c.channels[1].0 = 0;
            }
        });
        assert_eq!(
            e,
            "memory:/job/chk-3/task-0-1: in-flight data of operator 'op' names input channel 0 twice"
        );
    }

    #[test]
    fn key_groups_beyond_max_parallelism_are_refused_naming_the_file() {
        let e = load_error(|_, s| s.operators[0].keyed[0].groups[1].0 = 4);
        assert_eq!(
            e,
            "memory:/job/chk-3/task-0-1: keyed state 'counts' of operator 'op' holds key group 4, but there are only 4"
        );
    }

    #[test]
    fn metadata_with_bad_indices_is_refused_naming_the_file() {
        type Edit = fn(&mut CheckpointMetadata);
        let cases: [(Edit, &str); 5] = [
            (
                |m| m.max_parallelism = 0,
                "max parallelism 0 is outside 1..=32768",
            ),
            (
                |m| m.operators[0].subtasks[0].subtask = 2,
                "operator 'op' has state for subtask 2 but parallelism 2",
            ),
            (
                |m| m.operators[0].parallelism = 0,
                "operator 'op' has parallelism 0",
            ),
            (
                |m| {
                    let h = m.operators[0].subtasks[0].clone();
                    m.operators[0].subtasks.push(h);
                },
                "operator 'op' has two states for subtask 1",
            ),
            (
                |m| m.operators[0].subtasks[0].file = "../other".into(),
                "operator 'op' names state file '../other', which is not a file name",
            ),
        ];
        for (edit, message) in cases {
            let e = load_error(|m, _| edit(m));
            assert_eq!(e, format!("memory:/job/chk-3/_metadata: {message}"));
        }
    }
}
