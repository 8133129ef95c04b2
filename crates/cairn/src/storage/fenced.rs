//! Checkpoint storage that only the current leader may change.
//!
//! A coordinator that stands in a leadership contest (see `cluster::leader`) writes through
//! [`FencedStorage`]: every write, rename and delete asks the [`Fence`] first and is refused
//! with [`StorageError::Fenced`] once the writer is no longer the leader. An atomic write —
//! a checkpoint's `_metadata`, which completes the checkpoint — asks again after it landed:
//! the write counts (and the caller goes on to commit) only if the writer still led when it
//! was done, so a leader paused between its first question and the write (GC, SIGSTOP) sees
//! its completion refused. Reads are never fenced.

use std::sync::Arc;

use super::{CheckpointStorage, StorageError};

/// Answers whether the holder may still change shared state: Ok while it leads, else why not.
pub trait Fence: Send + Sync + std::fmt::Debug {
    /// Ok while the holder leads; otherwise a line saying why it no longer does.
    fn check(&self) -> Result<(), String>;
}

/// [`CheckpointStorage`] whose changes are fenced by a [`Fence`].
#[derive(Debug)]
pub struct FencedStorage {
    inner: Arc<dyn CheckpointStorage>,
    fence: Arc<dyn Fence>,
}

impl FencedStorage {
    /// `inner`, changed only while `fence` allows it.
    pub fn new(inner: Arc<dyn CheckpointStorage>, fence: Arc<dyn Fence>) -> FencedStorage {
        FencedStorage { inner, fence }
    }

    fn allowed(&self, op: &'static str, path: &str) -> Result<(), StorageError> {
        self.fence.check().map_err(|why| StorageError::Fenced {
            op,
            path: self.inner.location(path),
            why,
        })
    }
}

impl CheckpointStorage for FencedStorage {
    fn write(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        self.allowed("write", path)?;
        self.inner.write(path, bytes)
    }
    fn write_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        self.allowed("write", path)?;
        self.inner.write_atomic(path, bytes)?;
        // Landed, but does it count? Only if the writer still led when it was done.
        self.allowed("complete the write of", path)
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
        self.allowed("delete", path)?;
        self.inner.delete(path)
    }
    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        self.allowed("rename", from)?;
        self.inner.rename(from, to)
    }
    fn location(&self, path: &str) -> String {
        self.inner.location(path)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::storage::MemoryStorage;

    /// Leads for the first `leads` questions, then is deposed.
    #[derive(Debug)]
    struct Deposed {
        asked: AtomicUsize,
        leads: usize,
    }

    impl Fence for Deposed {
        fn check(&self) -> Result<(), String> {
            let n = self.asked.fetch_add(1, Ordering::SeqCst);
            if n < self.leads {
                Ok(())
            } else {
                Err("epoch 2 was claimed by another coordinator".into())
            }
        }
    }

    fn fenced(leads: usize) -> (Arc<MemoryStorage>, FencedStorage) {
        let inner = Arc::new(MemoryStorage::new());
        let fence = Arc::new(Deposed {
            asked: AtomicUsize::new(0),
            leads,
        });
        (inner.clone(), FencedStorage::new(inner, fence))
    }

    #[test]
    fn a_deposed_writer_changes_nothing_and_is_told_why() {
        let (inner, s) = fenced(0);
        for err in [
            s.write("job/chk-1/a", b"x").unwrap_err(),
            s.delete("job/chk-1").unwrap_err(),
            s.rename("job/a", "job/b").unwrap_err(),
            s.write_atomic("job/chk-1/_metadata", b"m").unwrap_err(),
        ] {
            let text = err.to_string();
            assert!(
                text.contains("no longer the leader")
                    && text.contains("epoch 2 was claimed by another coordinator"),
                "{text}"
            );
        }
        assert!(!inner.exists("job").unwrap());
    }

    #[test]
    fn an_atomic_write_done_after_the_writer_was_deposed_does_not_count() {
        // Leads when it starts the write, not any more when the write is done: the caller
        // is told the write failed, so it does not go on to commit.
        let (_, s) = fenced(1);
        let err = s.write_atomic("job/chk-1/_metadata", b"m").unwrap_err();
        assert!(matches!(err, StorageError::Fenced { .. }), "{err}");
        // A leader that still leads after the write: it counts.
        let (inner, s) = fenced(2);
        s.write_atomic("job/chk-1/_metadata", b"m").unwrap();
        assert_eq!(inner.read("job/chk-1/_metadata").unwrap(), b"m");
        // Reads are never fenced.
        assert_eq!(s.read("job/chk-1/_metadata").unwrap(), b"m");
    }
}
