//! Checkpoint storage that can die in the middle of a `_metadata` write.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::storage::{CheckpointStorage, Fence, MemoryStorage, StorageError};

/// The leadership of one simulated coordinator process (leader epoch `epoch`): deposed when
/// a standby takes over, after which it fences the process's checkpoint storage.
#[derive(Debug)]
pub(crate) struct SimLeadership {
    epoch: u64,
    deposed: AtomicBool,
}

impl SimLeadership {
    pub(crate) fn new(epoch: u64) -> SimLeadership {
        SimLeadership {
            epoch,
            deposed: AtomicBool::new(false),
        }
    }

    /// The epoch it leads.
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A standby claimed the next epoch.
    pub(crate) fn depose(&self) {
        self.deposed.store(true, Ordering::Relaxed);
    }
}

impl Fence for SimLeadership {
    fn check(&self) -> Result<(), String> {
        if self.deposed.load(Ordering::Relaxed) {
            Err(format!("epoch {} was claimed", self.epoch + 1))
        } else {
            Ok(())
        }
    }
}

/// [`MemoryStorage`] whose next `_metadata` write, once armed, fails as if the process died
/// during it: nothing is written, and [`FaultyStorage::crashed`] says so.
#[derive(Debug, Clone, Default)]
pub(crate) struct FaultyStorage {
    inner: MemoryStorage,
    crash_on_metadata: Arc<AtomicBool>,
    crashed: Arc<AtomicBool>,
}

impl FaultyStorage {
    /// The next `_metadata` write crashes.
    pub(crate) fn arm_metadata_crash(&self) {
        self.crash_on_metadata.store(true, Ordering::Relaxed);
    }

    /// Disarms, and tells whether a write crashed since the last call.
    pub(crate) fn crashed(&self) -> bool {
        self.crash_on_metadata.store(false, Ordering::Relaxed);
        self.crashed.swap(false, Ordering::Relaxed)
    }
}

impl CheckpointStorage for FaultyStorage {
    fn write(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        self.inner.write(path, bytes)
    }
    fn write_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        if path.ends_with("/_metadata") && self.crash_on_metadata.swap(false, Ordering::Relaxed) {
            self.crashed.store(true, Ordering::Relaxed);
            return Err(StorageError::Io {
                op: "write",
                path: path.to_string(),
                source: std::io::Error::other("the process died during the write"),
            });
        }
        self.inner.write_atomic(path, bytes)
    }
    fn read(&self, path: &str) -> Result<Vec<u8>, StorageError> {
        self.inner.read(path)
    }
    fn exists(&self, path: &str) -> Result<bool, StorageError> {
        self.inner.exists(path)
    }
    fn list(&self, path: &str) -> Result<Vec<String>, StorageError> {
        self.inner.list(path)
    }
    fn size(&self, path: &str) -> Result<u64, StorageError> {
        self.inner.size(path)
    }
    fn delete(&self, path: &str) -> Result<(), StorageError> {
        self.inner.delete(path)
    }
    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        self.inner.rename(from, to)
    }
    fn location(&self, path: &str) -> String {
        self.inner.location(path)
    }
}
