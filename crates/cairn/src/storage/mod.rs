//! Checkpoint storage.
//!
//! Checkpoints are stored behind the [`CheckpointStorage`] trait, which offers
//! a tiny file-system-like API over relative, `/`-separated paths. The layout
//! (see [`layout`]) is:
//!
//! ```text
//! <dir>/<job-id>/chk-<n>/            one directory per checkpoint
//! <dir>/<job-id>/chk-<n>/<task ...>  task / channel state files
//! <dir>/<job-id>/chk-<n>/_metadata   written last and atomically: its
//!                                    presence marks a complete checkpoint
//! <dir>/<job-id>/shared/             state shared between checkpoints
//! ```
//!
//! Every file is framed by [`format`](mod@format) (magic, kind, version, length, CRC32),
//! so a torn or corrupt file is never read as state.
//!
//! Implementations: [`FsStorage`] (a local or mounted directory), `S3Storage` (an S3
//! bucket, `s3://bucket/prefix`; the `s3` feature, see [`open_s3`]) and [`MemoryStorage`] (in
//! memory, for tests).
//!
//! Paths are relative and `/`-separated. Absolute paths, empty components
//! (`a//b`, a trailing `/`), `.` and `..` components, and components holding
//! `\` or NUL are rejected with [`StorageError::InvalidPath`]. The empty path
//! `""` denotes the storage root and is accepted only by the read-only
//! directory queries [`CheckpointStorage::exists`],
//! [`CheckpointStorage::list`] and [`CheckpointStorage::size`].

use std::io;
use std::sync::Arc;

use thiserror::Error;

mod fenced;
pub mod format;
mod fs;
pub mod layout;
mod memory;
#[cfg(feature = "s3")]
mod s3;
mod s3_url;

pub use fenced::{Fence, FencedStorage};
pub use fs::FsStorage;
pub use memory::MemoryStorage;
#[cfg(feature = "s3")]
pub use s3::S3Storage;
pub use s3_url::{S3Settings, S3Url};

/// Opens the S3 checkpoint storage at `url`; in a build without the `s3` feature, an error
/// naming it.
pub fn open_s3(
    url: &S3Url,
    settings: &S3Settings,
) -> Result<Arc<dyn CheckpointStorage>, StorageError> {
    #[cfg(feature = "s3")]
    {
        Ok(Arc::new(S3Storage::open(url, settings)?))
    }
    #[cfg(not(feature = "s3"))]
    {
        let _ = settings;
        Err(StorageError::UnusableDirectory {
            path: url.to_string(),
            problem: "needs cairn built with the 's3' feature".into(),
        })
    }
}

/// Errors of checkpoint storage operations.
#[derive(Debug, Error)]
pub enum StorageError {
    /// The file does not exist. `path` is the full location (see
    /// [`CheckpointStorage::location`]).
    #[error("checkpoint file not found: {path}")]
    NotFound {
        /// Full location of the missing file.
        path: String,
    },
    /// The path is not a valid relative storage path.
    #[error(
        "invalid checkpoint storage path {path:?}: paths must be relative and '/'-separated, \
         without empty, '.' or '..' components"
    )]
    InvalidPath {
        /// The offending path, as given.
        path: String,
    },
    /// An I/O operation failed, e.g. "cannot write /tmp/ck/job/chk-3/_metadata:
    /// No space left on device".
    #[error("cannot {op} {path}: {}", describe_io(.source))]
    Io {
        /// The operation that failed ("write", "read", "sync", ...).
        op: &'static str,
        /// Full location of the file or directory concerned.
        path: String,
        /// The underlying error.
        source: io::Error,
    },
    /// The storage root directory cannot be used, e.g. "checkpoint directory
    /// /x is not writable: Permission denied".
    #[error("checkpoint directory {path} {problem}")]
    UnusableDirectory {
        /// The root directory.
        path: String,
        /// What is wrong with it.
        problem: String,
    },
    /// The writer is no longer the leader (see [`FencedStorage`]): nothing was changed, or
    /// what was written does not count.
    #[error("refused to {op} {path}: this coordinator is no longer the leader ({why})")]
    Fenced {
        /// What was refused.
        op: &'static str,
        /// Full location of the file or directory concerned.
        path: String,
        /// Why the writer no longer leads.
        why: String,
    },
}

impl StorageError {
    /// Whether this is [`StorageError::NotFound`].
    pub fn is_not_found(&self) -> bool {
        matches!(self, StorageError::NotFound { .. })
    }
}

/// Formats an I/O error without the trailing " (os error N)" that the
/// standard library appends, for readable messages.
pub(crate) fn describe_io(error: &io::Error) -> String {
    let text = error.to_string();
    match text.rfind(" (os error ") {
        Some(at) if text.ends_with(')') => text[..at].to_string(),
        _ => text,
    }
}

/// Checks that `path` is a valid relative storage path naming a file or
/// directory (not the root); see the module docs for the rules.
pub fn validate_path(path: &str) -> Result<(), StorageError> {
    let valid = !path.is_empty()
        && !path.starts_with('/')
        && path.split('/').all(|c| {
            !c.is_empty() && c != "." && c != ".." && !c.contains('\\') && !c.contains('\0')
        });
    if valid {
        Ok(())
    } else {
        Err(StorageError::InvalidPath {
            path: path.to_string(),
        })
    }
}

/// Like [`validate_path`], but also accepts `""` for the storage root.
pub(crate) fn validate_dir_path(path: &str) -> Result<(), StorageError> {
    if path.is_empty() {
        Ok(())
    } else {
        validate_path(path)
    }
}

/// Splits a valid path into its parent directory (`""` for the root) and its
/// last component.
pub(crate) fn split_parent(path: &str) -> (&str, &str) {
    match path.rfind('/') {
        Some(at) => (&path[..at], &path[at + 1..]),
        None => ("", path),
    }
}

/// Where checkpoints are stored: a minimal file-system-like API over
/// relative, `/`-separated paths (see the module docs).
pub trait CheckpointStorage: Send + Sync + std::fmt::Debug {
    /// Writes a whole file durably (data fsynced). Parent "directories" are created. Overwrites.
    fn write(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError>;
    /// Writes a file so that readers see either nothing or the whole content: temp file in the same dir, write, fsync, rename, fsync the directory.
    fn write_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError>;
    /// Reads a whole file; a missing file is [`StorageError::NotFound`].
    fn read(&self, path: &str) -> Result<Vec<u8>, StorageError>;
    /// Whether a file or directory exists at `path` (`""`: the root, always).
    fn exists(&self, path: &str) -> Result<bool, StorageError>;
    /// Names (not paths) of the direct children of a directory, sorted; empty if the directory does not exist.
    fn list(&self, path: &str) -> Result<Vec<String>, StorageError>;
    /// Total size in bytes of all files under a directory (recursively); 0 if missing.
    fn size(&self, path: &str) -> Result<u64, StorageError>;
    /// Removes a file or a directory recursively; missing is Ok.
    fn delete(&self, path: &str) -> Result<(), StorageError>;
    /// Renames a file (used nowhere critical yet; atomic on the filesystem).
    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError>;
    /// A human-readable location, e.g. the absolute root directory, for log lines and errors.
    fn location(&self, path: &str) -> String;
}

impl<T: CheckpointStorage + ?Sized> CheckpointStorage for Arc<T> {
    fn write(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        (**self).write(path, bytes)
    }
    fn write_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        (**self).write_atomic(path, bytes)
    }
    fn read(&self, path: &str) -> Result<Vec<u8>, StorageError> {
        (**self).read(path)
    }
    fn exists(&self, path: &str) -> Result<bool, StorageError> {
        (**self).exists(path)
    }
    fn list(&self, path: &str) -> Result<Vec<String>, StorageError> {
        (**self).list(path)
    }
    fn size(&self, path: &str) -> Result<u64, StorageError> {
        (**self).size(path)
    }
    fn delete(&self, path: &str) -> Result<(), StorageError> {
        (**self).delete(path)
    }
    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        (**self).rename(from, to)
    }
    fn location(&self, path: &str) -> String {
        (**self).location(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Exercises the whole trait; run against every implementation.
    pub(crate) fn exercise(storage: &dyn CheckpointStorage) {
        // Empty storage.
        assert_eq!(storage.list("").unwrap(), Vec::<String>::new());
        assert_eq!(storage.size("").unwrap(), 0);
        assert!(storage.exists("").unwrap());
        assert!(!storage.exists("job").unwrap());
        assert_eq!(storage.list("job").unwrap(), Vec::<String>::new());
        assert_eq!(storage.size("job").unwrap(), 0);

        // Writes create parents.
        storage.write("job/chk-1/task-0", b"hello").unwrap();
        storage.write("job/chk-1/task-1", b"world!").unwrap();
        storage
            .write_atomic("job/chk-1/_metadata", b"meta")
            .unwrap();
        storage.write("job/shared/a", b"0123456789").unwrap();
        storage.write("job/chk-10/task-0", b"x").unwrap();
        assert_eq!(storage.read("job/chk-1/task-0").unwrap(), b"hello");
        assert_eq!(storage.read("job/chk-1/_metadata").unwrap(), b"meta");

        // Listing: names only, sorted, direct children only.
        assert_eq!(storage.list("").unwrap(), vec!["job"]);
        assert_eq!(
            storage.list("job").unwrap(),
            vec!["chk-1", "chk-10", "shared"]
        );
        assert_eq!(
            storage.list("job/chk-1").unwrap(),
            vec!["_metadata", "task-0", "task-1"]
        );
        assert_eq!(
            storage.list("job/chk-1/task-0").unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(storage.list("nope").unwrap(), Vec::<String>::new());

        // Sizes: recursive sums, a file's own size, 0 if missing.
        assert_eq!(storage.size("job/chk-1").unwrap(), 5 + 6 + 4);
        assert_eq!(storage.size("job").unwrap(), 5 + 6 + 4 + 10 + 1);
        assert_eq!(storage.size("").unwrap(), 5 + 6 + 4 + 10 + 1);
        assert_eq!(storage.size("job/shared/a").unwrap(), 10);
        assert_eq!(storage.size("job/chk-2").unwrap(), 0);

        // Exists: files and directories.
        assert!(storage.exists("job").unwrap());
        assert!(storage.exists("job/chk-1").unwrap());
        assert!(storage.exists("job/chk-1/task-1").unwrap());
        assert!(!storage.exists("job/chk-1/task-2").unwrap());
        assert!(!storage.exists("job/chk").unwrap());
        assert!(!storage.exists("job/chk-1/task-0/below-a-file").unwrap());

        // Overwrite.
        storage.write("job/chk-1/task-0", b"hi").unwrap();
        assert_eq!(storage.read("job/chk-1/task-0").unwrap(), b"hi");
        storage
            .write_atomic("job/chk-1/_metadata", b"meta-2")
            .unwrap();
        assert_eq!(storage.read("job/chk-1/_metadata").unwrap(), b"meta-2");

        // Missing files.
        let err = storage.read("job/chk-1/task-9").unwrap_err();
        assert!(err.is_not_found(), "{err:?}");
        assert!(err.to_string().contains("task-9"), "{err}");
        assert!(storage.read("job/chk-5/task-0").unwrap_err().is_not_found());

        // Rename, including into a new directory and over an existing file.
        storage
            .rename("job/chk-1/task-1", "job/chk-1/task-1b")
            .unwrap();
        assert!(!storage.exists("job/chk-1/task-1").unwrap());
        assert_eq!(storage.read("job/chk-1/task-1b").unwrap(), b"world!");
        storage.rename("job/chk-1/task-1b", "job/moved/t").unwrap();
        assert_eq!(storage.read("job/moved/t").unwrap(), b"world!");
        storage.rename("job/moved/t", "job/shared/a").unwrap();
        assert_eq!(storage.read("job/shared/a").unwrap(), b"world!");
        let err = storage.rename("job/none", "job/other").unwrap_err();
        assert!(err.is_not_found(), "{err:?}");

        // Delete a file, a directory recursively, and something missing.
        storage.delete("job/chk-1/task-0").unwrap();
        assert!(!storage.exists("job/chk-1/task-0").unwrap());
        assert!(storage.exists("job/chk-1/_metadata").unwrap());
        storage.delete("job/chk-1").unwrap();
        assert!(!storage.exists("job/chk-1").unwrap());
        // (A file system keeps the now empty directory; memory storage does not.)
        storage.delete("job/moved").unwrap();
        assert_eq!(storage.list("job").unwrap(), vec!["chk-10", "shared"]);
        storage.delete("job/chk-1").unwrap();
        storage.delete("does/not/exist").unwrap();
        storage.delete("job").unwrap();
        assert_eq!(storage.list("").unwrap(), Vec::<String>::new());
        assert_eq!(storage.size("").unwrap(), 0);

        // Location mentions the path.
        assert!(storage
            .location("job/chk-3/_metadata")
            .ends_with("job/chk-3/_metadata"));
    }

    pub(crate) const INVALID_PATHS: &[&str] = &[
        "",
        "/",
        "/abs",
        "/abs/file",
        "a//b",
        "a/",
        "//a",
        "..",
        "../x",
        "a/../b",
        "a/..",
        ".",
        "./a",
        "a/./b",
        "a\\b",
        "a/b\0",
    ];

    /// Checks that every operation rejects every invalid path.
    pub(crate) fn rejects_invalid_paths(storage: &dyn CheckpointStorage) {
        storage.write("ok/file", b"x").unwrap();
        for &path in INVALID_PATHS {
            let check = |result: Result<(), StorageError>, op: &str| match result {
                Err(StorageError::InvalidPath { path: p }) => assert_eq!(p, path),
                other => panic!("{op}({path:?}) gave {other:?}"),
            };
            check(storage.write(path, b"x"), "write");
            check(storage.write_atomic(path, b"x"), "write_atomic");
            check(storage.read(path).map(drop), "read");
            check(storage.delete(path), "delete");
            check(storage.rename(path, "ok/other"), "rename from");
            check(storage.rename("ok/file", path), "rename to");
            if !path.is_empty() {
                check(storage.exists(path).map(drop), "exists");
                check(storage.list(path).map(drop), "list");
                check(storage.size(path).map(drop), "size");
            }
        }
        // Nothing was touched.
        assert_eq!(storage.list("").unwrap(), vec!["ok"]);
        assert_eq!(storage.list("ok").unwrap(), vec!["file"]);
        assert_eq!(storage.read("ok/file").unwrap(), b"x");
    }

    #[test]
    fn validate_path_rules() {
        for path in [
            "a",
            "a/b",
            "job-1/chk-3/_metadata",
            ".hidden",
            "a/.b.tmp",
            "..a",
            "a..",
        ] {
            validate_path(path).unwrap();
        }
        for &path in INVALID_PATHS {
            assert!(validate_path(path).is_err(), "{path:?} accepted");
        }
        validate_dir_path("").unwrap();
        let err = validate_path("../etc/passwd").unwrap_err();
        assert!(err.to_string().contains("\"../etc/passwd\""), "{err}");
    }

    #[test]
    fn split_parent_works() {
        assert_eq!(split_parent("a"), ("", "a"));
        assert_eq!(split_parent("a/b"), ("a", "b"));
        assert_eq!(split_parent("a/b/c"), ("a/b", "c"));
    }

    #[test]
    fn io_errors_read_well() {
        let err = StorageError::Io {
            op: "write",
            path: "/tmp/ck/job/chk-3/_metadata".to_string(),
            source: io::Error::from_raw_os_error(28),
        };
        let text = err.to_string();
        assert!(
            text.starts_with("cannot write /tmp/ck/job/chk-3/_metadata: "),
            "{text}"
        );
        assert!(!text.contains("os error"), "{text}");
        #[cfg(target_os = "linux")]
        assert_eq!(
            text,
            "cannot write /tmp/ck/job/chk-3/_metadata: No space left on device"
        );
        // Non-OS errors are shown as they are.
        let custom = io::Error::other("boom (not an os error)");
        assert_eq!(describe_io(&custom), "boom (not an os error)");
    }

    #[test]
    fn arc_storage_delegates() {
        let storage: Arc<dyn CheckpointStorage> = Arc::new(MemoryStorage::new());
        exercise(&storage);
    }

    #[test]
    #[cfg(not(feature = "s3"))]
    fn s3_storage_needs_its_feature() {
        let url = S3Url::parse("s3://bucket/prefix").unwrap();
        let err = open_s3(&url, &S3Settings::default()).err().unwrap();
        assert_eq!(
            err.to_string(),
            "checkpoint directory s3://bucket/prefix needs cairn built with the 's3' feature"
        );
    }
}
