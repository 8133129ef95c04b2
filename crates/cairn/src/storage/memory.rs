//! [`MemoryStorage`]: in-memory checkpoint storage for tests.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{split_parent, validate_dir_path, validate_path, CheckpointStorage, StorageError};

type Files = BTreeMap<String, Vec<u8>>;

/// In-memory checkpoint storage, for tests.
///
/// Files live in a map from path to content; directories are implicit
/// prefixes: a directory exists while it has a file below it, so unlike on a
/// file system there are no empty directories. Clones share
/// the same files. Mimics [`FsStorage`](super::FsStorage): writing below a
/// file or over a directory fails, and [`set_fail_writes`](Self::set_fail_writes)
/// simulates a full disk.
#[derive(Clone, Default)]
pub struct MemoryStorage {
    files: Arc<Mutex<Files>>,
    fail_writes: Arc<AtomicBool>,
}

impl fmt::Debug for MemoryStorage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemoryStorage")
            .field("files", &self.lock().len())
            .field("fail_writes", &self.fail_writes.load(Ordering::Relaxed))
            .finish()
    }
}

/// `path/`, or `""` for the root: the prefix of every key below `path`.
fn dir_prefix(path: &str) -> String {
    if path.is_empty() {
        String::new()
    } else {
        format!("{path}/")
    }
}

/// The keys below directory `path` (all keys for the root).
fn below<'a>(files: &'a Files, path: &str) -> impl Iterator<Item = (&'a String, &'a Vec<u8>)> {
    let prefix = dir_prefix(path);
    files
        .range(prefix.clone()..)
        .take_while(move |(key, _)| key.starts_with(&prefix))
}

fn is_dir(files: &Files, path: &str) -> bool {
    below(files, path).next().is_some()
}

impl MemoryStorage {
    /// Creates an empty storage.
    pub fn new() -> MemoryStorage {
        MemoryStorage::default()
    }

    /// When set, every write, atomic write and rename fails as if the disk
    /// were full (and changes nothing).
    pub fn set_fail_writes(&self, fail: bool) {
        self.fail_writes.store(fail, Ordering::Relaxed);
    }

    /// Paths of all files, sorted.
    pub fn files(&self) -> Vec<String> {
        self.lock().keys().cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, Files> {
        // The map is always consistent: no operation panics half-way.
        self.files.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn io_error(
        &self,
        op: &'static str,
        path: &str,
        kind: io::ErrorKind,
        msg: &str,
    ) -> StorageError {
        StorageError::Io {
            op,
            path: self.location(path),
            source: io::Error::new(kind, msg),
        }
    }

    fn check_fail(&self, op: &'static str, path: &str) -> Result<(), StorageError> {
        if self.fail_writes.load(Ordering::Relaxed) {
            Err(self.io_error(
                op,
                path,
                io::ErrorKind::StorageFull,
                "No space left on device (simulated)",
            ))
        } else {
            Ok(())
        }
    }

    /// Checks that a file can be created at `path`: no ancestor is a file
    /// and `path` is not a directory.
    fn check_writable(
        &self,
        files: &Files,
        op: &'static str,
        path: &str,
    ) -> Result<(), StorageError> {
        let mut dir = split_parent(path).0;
        while !dir.is_empty() {
            if files.contains_key(dir) {
                return Err(self.io_error(
                    op,
                    path,
                    io::ErrorKind::NotADirectory,
                    "Not a directory",
                ));
            }
            dir = split_parent(dir).0;
        }
        if is_dir(files, path) {
            return Err(self.io_error(op, path, io::ErrorKind::IsADirectory, "Is a directory"));
        }
        Ok(())
    }

    fn put(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        validate_path(path)?;
        self.check_fail("write", path)?;
        let mut files = self.lock();
        self.check_writable(&files, "write", path)?;
        files.insert(path.to_string(), bytes.to_vec());
        Ok(())
    }
}

impl CheckpointStorage for MemoryStorage {
    fn write(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        self.put(path, bytes)
    }

    fn write_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        // Atomic under the lock.
        self.put(path, bytes)
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, StorageError> {
        validate_path(path)?;
        let files = self.lock();
        match files.get(path) {
            Some(bytes) => Ok(bytes.clone()),
            None if is_dir(&files, path) => {
                Err(self.io_error("read", path, io::ErrorKind::IsADirectory, "Is a directory"))
            }
            None => Err(StorageError::NotFound {
                path: self.location(path),
            }),
        }
    }

    fn exists(&self, path: &str) -> Result<bool, StorageError> {
        validate_dir_path(path)?;
        if path.is_empty() {
            return Ok(true);
        }
        let files = self.lock();
        Ok(files.contains_key(path) || is_dir(&files, path))
    }

    fn list(&self, path: &str) -> Result<Vec<String>, StorageError> {
        validate_dir_path(path)?;
        let files = self.lock();
        let skip = dir_prefix(path).len();
        let names: BTreeSet<&str> = below(&files, path)
            .map(|(key, _)| {
                let rest = &key[skip..];
                rest.split('/').next().unwrap_or(rest)
            })
            .collect();
        Ok(names.into_iter().map(str::to_string).collect())
    }

    fn size(&self, path: &str) -> Result<u64, StorageError> {
        validate_dir_path(path)?;
        let files = self.lock();
        let own = if path.is_empty() {
            0
        } else {
            files.get(path).map_or(0, |bytes| bytes.len() as u64)
        };
        Ok(below(&files, path).fold(own, |total, (_, bytes)| {
            total.saturating_add(bytes.len() as u64)
        }))
    }

    fn delete(&self, path: &str) -> Result<(), StorageError> {
        validate_path(path)?;
        let mut files = self.lock();
        files.remove(path);
        let doomed: Vec<String> = below(&files, path).map(|(key, _)| key.clone()).collect();
        for key in doomed {
            files.remove(&key);
        }
        Ok(())
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        validate_path(from)?;
        validate_path(to)?;
        self.check_fail("rename", to)?;
        let mut files = self.lock();
        if files.contains_key(from) {
            if from != to {
                self.check_writable(&files, "rename", to)?;
                if let Some(bytes) = files.remove(from) {
                    files.insert(to.to_string(), bytes);
                }
            }
            return Ok(());
        }
        if !is_dir(&files, from) {
            return Err(StorageError::NotFound {
                path: self.location(from),
            });
        }
        // A directory: the target must not be inside it, a file or a
        // non-empty directory (as with rename(2)).
        if from == to {
            return Ok(());
        }
        if to.starts_with(&dir_prefix(from)) || files.contains_key(to) || is_dir(&files, to) {
            return Err(self.io_error(
                "rename",
                to,
                io::ErrorKind::InvalidInput,
                "target is inside the source, a file or a non-empty directory",
            ));
        }
        self.check_writable(&files, "rename", to)?;
        let skip = dir_prefix(from).len();
        let moved: Vec<String> = below(&files, from).map(|(key, _)| key.clone()).collect();
        for key in moved {
            if let Some(bytes) = files.remove(&key) {
                files.insert(format!("{to}/{}", &key[skip..]), bytes);
            }
        }
        Ok(())
    }

    fn location(&self, path: &str) -> String {
        format!("memory:/{path}")
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{exercise, rejects_invalid_paths};
    use super::*;

    #[test]
    fn round_trip() {
        exercise(&MemoryStorage::new());
    }

    #[test]
    fn invalid_paths_are_rejected() {
        rejects_invalid_paths(&MemoryStorage::new());
    }

    #[test]
    fn clones_share_files() {
        let a = MemoryStorage::new();
        let b = a.clone();
        a.write("job/chk-1/_metadata", b"m").unwrap();
        assert_eq!(b.read("job/chk-1/_metadata").unwrap(), b"m");
        b.delete("job").unwrap();
        assert!(!a.exists("job").unwrap());
        assert!(format!("{a:?}").contains("files: 0"));
    }

    #[test]
    fn write_atomic_replaces() {
        let storage = MemoryStorage::new();
        storage.write_atomic("job/chk-1/_metadata", b"one").unwrap();
        storage.write_atomic("job/chk-1/_metadata", b"two").unwrap();
        assert_eq!(storage.read("job/chk-1/_metadata").unwrap(), b"two");
        assert_eq!(storage.files(), vec!["job/chk-1/_metadata"]);
    }

    #[test]
    fn read_missing_is_not_found() {
        let storage = MemoryStorage::new();
        let err = storage.read("job/chk-1/_metadata").unwrap_err();
        assert!(err.is_not_found());
        assert_eq!(
            err.to_string(),
            "checkpoint file not found: memory:/job/chk-1/_metadata"
        );
    }

    #[test]
    fn files_and_directories_do_not_mix() {
        let storage = MemoryStorage::new();
        storage.write("a/b", b"x").unwrap();
        assert!(matches!(
            storage.write("a", b"y"),
            Err(StorageError::Io { .. })
        ));
        assert!(matches!(
            storage.write("a/b/c", b"y"),
            Err(StorageError::Io { .. })
        ));
        assert!(matches!(
            storage.read("a"),
            Err(StorageError::Io { op: "read", .. })
        ));
        assert_eq!(storage.files(), vec!["a/b"]);
        // Prefix names that are not path components are unrelated.
        storage.write("ab", b"z").unwrap();
        assert_eq!(storage.list("a").unwrap(), vec!["b"]);
        assert_eq!(storage.size("a").unwrap(), 1);
        storage.delete("a").unwrap();
        assert_eq!(storage.files(), vec!["ab"]);
    }

    #[test]
    fn simulated_full_disk() {
        let storage = MemoryStorage::new();
        storage.write("job/a", b"x").unwrap();
        storage.set_fail_writes(true);
        let err = storage
            .write_atomic("job/chk-3/_metadata", b"m")
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot write memory:/job/chk-3/_metadata: No space left on device (simulated)"
        );
        assert!(storage.write("job/b", b"x").is_err());
        assert!(storage.rename("job/a", "job/c").is_err());
        assert_eq!(storage.files(), vec!["job/a"]);
        storage.set_fail_writes(false);
        storage.write("job/b", b"x").unwrap();
    }

    #[test]
    fn rename_of_a_directory_works() {
        let storage = MemoryStorage::new();
        storage.write("job/tmp-chk/a", b"1").unwrap();
        storage.write("job/tmp-chk/b", b"22").unwrap();
        storage.rename("job/tmp-chk", "job/chk-1").unwrap();
        assert_eq!(storage.list("job/chk-1").unwrap(), vec!["a", "b"]);
        assert!(!storage.exists("job/tmp-chk").unwrap());
        assert!(storage.rename("job/chk-1", "job/chk-1/inner").is_err());
    }
}
