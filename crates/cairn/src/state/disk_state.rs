//! What the disk state backend (RocksDB, [`rocks`](super::rocks)) is configured with and what
//! its checkpoints carry. Compiled with or without the `rocksdb` feature: a build without it
//! still reads, validates, rescales and garbage-collects checkpoints that hold disk state, and
//! its configuration keeps every key (choosing RocksDB is then an error naming the feature).

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::keygroup::KeyGroupRange;
use super::StateDescriptor;
use crate::error::{TaskError, TaskResult};
use crate::storage::CheckpointStorage;

/// Default memory budget of one subtask's RocksDB instance and its caches.
pub const DEFAULT_MEMORY_BYTES: u64 = 128 << 20;

/// Where and how a job's RocksDB instances live.
#[derive(Clone)]
pub struct RocksDbSettings {
    /// `state.backend.rocksdb.localdir`: the parent of the instances' working directories.
    pub local_dir: PathBuf,
    /// `state.backend.rocksdb.memory.fixed-per-slot`: the memory budget of one instance,
    /// its block cache, write buffers and object cache together (bytes).
    pub memory_bytes: u64,
    /// `state.backend.incremental`: upload only SST files not uploaded before.
    pub incremental: bool,
    /// The checkpoint storage restored files are downloaded from.
    pub storage: Arc<dyn CheckpointStorage>,
    /// This job's id: shared files under `<job>/shared/` may be referenced again.
    pub job_id: String,
}

impl std::fmt::Debug for RocksDbSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RocksDbSettings")
            .field("local_dir", &self.local_dir)
            .field("memory_bytes", &self.memory_bytes)
            .field("incremental", &self.incremental)
            .finish()
    }
}

impl RocksDbSettings {
    /// The bytes of the object cache (the typed write-back caches of all tables).
    pub fn object_cache_bytes(&self) -> u64 {
        self.memory_bytes / 4
    }
}

/// One file of a RocksDB checkpoint as persisted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiskFile {
    /// Its name in the instance directory (`000012.sst`, `MANIFEST-000005`, ...).
    pub name: String,
    /// Where it is: a path in the checkpoint storage (framed as a shared state file), or
    /// its bytes inline (small metadata files).
    pub location: DiskFileLocation,
}

/// Where a [`DiskFile`] is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum DiskFileLocation {
    /// A framed file in the checkpoint storage (relative to its root), of this many payload bytes.
    Stored { path: String, size: u64 },
    /// The file's bytes.
    Inline(Vec<u8>),
}

/// The disk state of one operator subtask in a checkpoint: a RocksDB checkpoint's files.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct DiskStateData {
    /// Uid of the operator.
    pub uid: String,
    /// The instance that wrote it (unique per opened instance).
    pub instance: String,
    /// First key group of the instance's range.
    pub first_key_group: u32,
    /// Last key group of the instance's range (inclusive).
    pub last_key_group: u32,
    /// Its states (one column family each).
    pub states: Vec<StateDescriptor>,
    /// The files of the RocksDB checkpoint.
    pub files: Vec<DiskFile>,
}

impl DiskStateData {
    /// Its key-group range.
    pub fn range(&self) -> KeyGroupRange {
        KeyGroupRange {
            start: self.first_key_group,
            end: self.last_key_group,
        }
    }

    /// The shared files (`<job>/shared/...`) it references.
    pub fn shared_files(&self) -> impl Iterator<Item = &str> {
        self.files.iter().filter_map(|f| match &f.location {
            DiskFileLocation::Stored { path, .. } if is_shared_path(path) => Some(path.as_str()),
            _ => None,
        })
    }

    /// Bytes of its files.
    pub fn size(&self) -> u64 {
        self.files
            .iter()
            .map(|f| match &f.location {
                DiskFileLocation::Stored { size, .. } => *size,
                DiskFileLocation::Inline(b) => b.len() as u64,
            })
            .sum()
    }
}

/// Whether a storage path is in a job's shared directory.
fn is_shared_path(path: &str) -> bool {
    path.split('/').nth(1) == Some(crate::storage::layout::SHARED_DIR)
}

/// The checkpoint id a shared file was uploaded for (its name starts with it).
pub fn shared_file_checkpoint(name: &str) -> Option<u64> {
    name.split('-').next()?.parse().ok()
}

/// Where the asynchronous part of a snapshot writes.
pub struct UploadTarget<'a> {
    /// The checkpoint storage.
    pub storage: &'a dyn CheckpointStorage,
    /// The job's id.
    pub job_id: &'a str,
    /// The checkpoint's id.
    pub checkpoint_id: u64,
    /// The task's state file name (private files are named after it).
    pub file: &'a str,
}

/// An encoded key: `[key group u16 BE][postcard(K)]`.
pub(crate) fn encode_key<K: Serialize>(
    buf: &mut Vec<u8>,
    key_group: u32,
    key: &K,
) -> TaskResult<()> {
    buf.clear();
    buf.extend_from_slice(&(key_group as u16).to_be_bytes());
    let out = postcard::to_extend(key, std::mem::take(buf))
        .map_err(|e| TaskError::msg(format!("cannot encode a state key: {e}")))?;
    *buf = out;
    Ok(())
}
