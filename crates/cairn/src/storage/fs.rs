//! [`FsStorage`]: checkpoint storage in a local (or mounted) directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::{
    describe_io, split_parent, validate_dir_path, validate_path, CheckpointStorage, StorageError,
};

/// Distinguishes temp and probe files created concurrently by this process.
static UNIQUE: AtomicU64 = AtomicU64::new(0);

fn unique_suffix() -> String {
    format!(
        "{}.{}",
        std::process::id(),
        UNIQUE.fetch_add(1, Ordering::Relaxed)
    )
}

/// Whether an error means "nothing there" (the path or one of its parents
/// does not exist, or a parent is a file).
fn is_gone(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::NotADirectory
    )
}

/// Flushes a directory's entries (new, renamed files) to disk.
#[cfg(unix)]
fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Directories cannot be fsynced portably outside Unix; rely on the OS.
#[cfg(not(unix))]
fn sync_dir(_dir: &Path) -> io::Result<()> {
    Ok(())
}

/// Checkpoint storage in a directory of a (local or mounted) file system.
///
/// Files are written with fsync; [`write_atomic`](CheckpointStorage::write_atomic)
/// goes through a temp file (`.<name>.<pid>.<n>.tmp`) in the same directory,
/// renamed into place, and fsyncs the directory. Newly created directories
/// are fsynced into their parents.
#[derive(Debug, Clone)]
pub struct FsStorage {
    root: PathBuf,
}

impl FsStorage {
    /// Opens (creating it if missing) the checkpoint directory `root`, and
    /// checks that it is a writable directory by creating and removing a
    /// probe file.
    pub fn open(root: impl Into<PathBuf>) -> Result<FsStorage, StorageError> {
        let root = root.into();
        let unusable = |problem: String| StorageError::UnusableDirectory {
            path: root.display().to_string(),
            problem,
        };
        match fs::metadata(&root) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(unusable("is not a directory".to_string())),
            Err(e) if is_gone(&e) => {
                fs::create_dir_all(&root)
                    .map_err(|e| unusable(format!("cannot be created: {}", describe_io(&e))))?;
            }
            Err(e) => return Err(unusable(format!("is not accessible: {}", describe_io(&e)))),
        }
        // An absolute root makes locations in logs and errors unambiguous.
        let root = fs::canonicalize(&root)
            .or_else(|_| std::path::absolute(&root))
            .unwrap_or(root);
        let storage = FsStorage { root };
        storage.probe()?;
        Ok(storage)
    }

    /// Creates and removes a probe file to check the root is writable.
    fn probe(&self) -> Result<(), StorageError> {
        let unwritable = |e: io::Error| StorageError::UnusableDirectory {
            path: self.root.display().to_string(),
            problem: format!("is not writable: {}", describe_io(&e)),
        };
        let probe = self
            .root
            .join(format!(".cairn-probe.{}.tmp", unique_suffix()));
        let result = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&probe)
            .and_then(|mut file| file.write_all(b"probe"));
        match result {
            Ok(()) => fs::remove_file(&probe).map_err(unwritable),
            Err(e) => {
                let _ = fs::remove_file(&probe);
                Err(unwritable(e))
            }
        }
    }

    /// The absolute root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn full_path(&self, path: &str) -> PathBuf {
        if path.is_empty() {
            self.root.clone()
        } else {
            self.root.join(path)
        }
    }

    fn io_error(&self, op: &'static str, path: &str, source: io::Error) -> StorageError {
        StorageError::Io {
            op,
            path: self.location(path),
            source,
        }
    }

    /// Creates the directory `dir` (relative, `""` for the root) and its
    /// missing parents, fsyncing each new directory into its parent.
    fn create_dirs(&self, dir: &str) -> Result<(), StorageError> {
        if dir.is_empty() {
            return Ok(());
        }
        if fs::metadata(self.full_path(dir)).is_ok_and(|m| m.is_dir()) {
            return Ok(());
        }
        let mut end = 0;
        while end < dir.len() {
            end = dir[end..].find('/').map_or(dir.len(), |at| end + at);
            let current = &dir[..end];
            match fs::create_dir(self.full_path(current)) {
                Ok(()) => {
                    let (parent, _) = split_parent(current);
                    sync_dir(&self.full_path(parent))
                        .map_err(|e| self.io_error("sync directory", parent, e))?;
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(self.io_error("create directory", current, e)),
            }
            end += 1;
        }
        Ok(())
    }
}

/// Total size of the files under `path`; vanished entries count as 0.
fn tree_size(path: &Path) -> Result<u64, (PathBuf, io::Error)> {
    let meta = match fs::symlink_metadata(path) {
        Ok(meta) => meta,
        Err(e) if is_gone(&e) => return Ok(0),
        Err(e) => return Err((path.to_path_buf(), e)),
    };
    if !meta.is_dir() {
        return Ok(if meta.is_file() { meta.len() } else { 0 });
    }
    let entries = match fs::read_dir(path) {
        Ok(entries) => entries,
        Err(e) if is_gone(&e) => return Ok(0),
        Err(e) => return Err((path.to_path_buf(), e)),
    };
    let mut total = 0u64;
    for entry in entries {
        let entry = entry.map_err(|e| (path.to_path_buf(), e))?;
        total = total.saturating_add(tree_size(&entry.path())?);
    }
    Ok(total)
}

impl CheckpointStorage for FsStorage {
    fn write(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        validate_path(path)?;
        self.create_dirs(split_parent(path).0)?;
        let full = self.full_path(path);
        let mut file = File::create(&full).map_err(|e| self.io_error("write", path, e))?;
        let result = file
            .write_all(bytes)
            .map_err(|e| self.io_error("write", path, e))
            .and_then(|()| file.sync_all().map_err(|e| self.io_error("sync", path, e)));
        if let Err(error) = result {
            drop(file);
            // Do not leave a partial file behind (and free the space).
            if let Err(e) = fs::remove_file(&full) {
                tracing::warn!(path = %full.display(), error = %e, "cannot remove partially written checkpoint file");
            }
            return Err(error);
        }
        Ok(())
    }

    fn write_atomic(&self, path: &str, bytes: &[u8]) -> Result<(), StorageError> {
        validate_path(path)?;
        let (dir, name) = split_parent(path);
        self.create_dirs(dir)?;
        let full = self.full_path(path);
        let dir_full = self.full_path(dir);
        let temp = dir_full.join(format!(".{name}.{}.tmp", unique_suffix()));

        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&temp)
            .map_err(|e| self.io_error("write", path, e))?;
        let result = file
            .write_all(bytes)
            .map_err(|e| self.io_error("write", path, e))
            .and_then(|()| file.sync_all().map_err(|e| self.io_error("sync", path, e)))
            .and_then(|()| {
                drop(file);
                fs::rename(&temp, &full).map_err(|e| self.io_error("write", path, e))
            });
        if let Err(error) = result {
            if let Err(e) = fs::remove_file(&temp) {
                tracing::warn!(path = %temp.display(), error = %e, "cannot remove temporary checkpoint file");
            }
            return Err(error);
        }
        sync_dir(&dir_full).map_err(|e| self.io_error("sync directory", dir, e))
    }

    fn read(&self, path: &str) -> Result<Vec<u8>, StorageError> {
        validate_path(path)?;
        fs::read(self.full_path(path)).map_err(|e| {
            if is_gone(&e) {
                StorageError::NotFound {
                    path: self.location(path),
                }
            } else {
                self.io_error("read", path, e)
            }
        })
    }

    fn exists(&self, path: &str) -> Result<bool, StorageError> {
        validate_dir_path(path)?;
        match fs::symlink_metadata(self.full_path(path)) {
            Ok(_) => Ok(true),
            Err(e) if is_gone(&e) => Ok(false),
            Err(e) => Err(self.io_error("access", path, e)),
        }
    }

    fn list(&self, path: &str) -> Result<Vec<String>, StorageError> {
        validate_dir_path(path)?;
        let entries = match fs::read_dir(self.full_path(path)) {
            Ok(entries) => entries,
            Err(e) if is_gone(&e) => return Ok(Vec::new()),
            Err(e) => return Err(self.io_error("list", path, e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| self.io_error("list", path, e))?;
            match entry.file_name().into_string() {
                Ok(name) => names.push(name),
                Err(name) => tracing::warn!(
                    dir = %self.location(path),
                    name = ?name,
                    "ignoring checkpoint storage entry with a non-UTF-8 name"
                ),
            }
        }
        names.sort();
        Ok(names)
    }

    fn size(&self, path: &str) -> Result<u64, StorageError> {
        validate_dir_path(path)?;
        tree_size(&self.full_path(path)).map_err(|(at, source)| StorageError::Io {
            op: "measure",
            path: at.display().to_string(),
            source,
        })
    }

    fn delete(&self, path: &str) -> Result<(), StorageError> {
        validate_path(path)?;
        let full = self.full_path(path);
        let result = match fs::symlink_metadata(&full) {
            Ok(meta) if meta.is_dir() => fs::remove_dir_all(&full),
            Ok(_) => fs::remove_file(&full),
            Err(e) => Err(e),
        };
        match result {
            Ok(()) => Ok(()),
            Err(e) if is_gone(&e) => Ok(()),
            Err(e) => Err(self.io_error("delete", path, e)),
        }
    }

    fn rename(&self, from: &str, to: &str) -> Result<(), StorageError> {
        validate_path(from)?;
        validate_path(to)?;
        let from_full = self.full_path(from);
        if let Err(e) = fs::symlink_metadata(&from_full) {
            return Err(if is_gone(&e) {
                StorageError::NotFound {
                    path: self.location(from),
                }
            } else {
                self.io_error("rename", from, e)
            });
        }
        let (to_dir, _) = split_parent(to);
        self.create_dirs(to_dir)?;
        fs::rename(&from_full, self.full_path(to)).map_err(|e| StorageError::Io {
            op: "rename",
            path: format!("{} to {}", self.location(from), self.location(to)),
            source: e,
        })?;
        sync_dir(&self.full_path(to_dir))
            .map_err(|e| self.io_error("sync directory", to_dir, e))?;
        let (from_dir, _) = split_parent(from);
        if from_dir != to_dir {
            sync_dir(&self.full_path(from_dir))
                .map_err(|e| self.io_error("sync directory", from_dir, e))?;
        }
        Ok(())
    }

    fn location(&self, path: &str) -> String {
        self.full_path(path).display().to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::super::layout::is_temp_file;
    use super::super::tests::{exercise, rejects_invalid_paths};
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    fn storage() -> (tempfile::TempDir, FsStorage) {
        let dir = tempfile::tempdir().unwrap();
        let storage = FsStorage::open(dir.path().join("checkpoints")).unwrap();
        (dir, storage)
    }

    /// Every file under `dir`, recursively, as paths relative to it.
    fn all_files(dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let name = entry.file_name().into_string().unwrap();
            if entry.file_type().unwrap().is_dir() {
                out.extend(
                    all_files(&entry.path())
                        .into_iter()
                        .map(|f| format!("{name}/{f}")),
                );
            } else {
                out.push(name);
            }
        }
        out.sort();
        out
    }

    #[test]
    fn round_trip() {
        let (_dir, storage) = storage();
        exercise(&storage);
    }

    #[test]
    fn invalid_paths_are_rejected() {
        let (_dir, storage) = storage();
        rejects_invalid_paths(&storage);
    }

    #[test]
    fn open_creates_root_and_is_absolute() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("a/b/c");
        let storage = FsStorage::open(&root).unwrap();
        assert!(root.is_dir());
        assert!(storage.root().is_absolute());
        // The probe file is gone.
        assert_eq!(fs::read_dir(&root).unwrap().count(), 0);
        // Opening an existing directory works too.
        FsStorage::open(&root).unwrap();
        assert_eq!(
            storage.location("job/chk-1/_metadata"),
            storage
                .root()
                .join("job/chk-1/_metadata")
                .display()
                .to_string()
        );
        assert_eq!(storage.location(""), storage.root().display().to_string());
    }

    #[test]
    fn open_on_a_file_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("not-a-dir");
        fs::write(&file, b"x").unwrap();
        let err = FsStorage::open(&file).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("checkpoint directory {} is not a directory", file.display())
        );
        let err = FsStorage::open(file.join("below")).unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with(&format!(
                "checkpoint directory {} cannot be created: ",
                file.join("below").display()
            )),
            "{text}"
        );
        assert!(!text.contains("os error"), "{text}");
    }

    #[cfg(unix)]
    #[test]
    fn open_on_a_read_only_directory_is_a_clear_error() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("ro");
        fs::create_dir(&root).unwrap();
        fs::set_permissions(&root, fs::Permissions::from_mode(0o555)).unwrap();
        // Root (e.g. in containers) can write anyway; only check when denied.
        if fs::write(root.join("x"), b"x").is_err() {
            let err = FsStorage::open(&root).unwrap_err();
            let canonical = fs::canonicalize(&root).unwrap();
            assert_eq!(
                err.to_string(),
                format!(
                    "checkpoint directory {} is not writable: Permission denied",
                    canonical.display()
                )
            );
        }
        fs::set_permissions(&root, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn read_missing_is_not_found() {
        let (_dir, storage) = storage();
        let err = storage.read("job/chk-1/_metadata").unwrap_err();
        match &err {
            StorageError::NotFound { path } => {
                assert_eq!(*path, storage.location("job/chk-1/_metadata"))
            }
            other => panic!("{other:?}"),
        }
        // A parent that is a file also means "not found".
        storage.write("job/file", b"x").unwrap();
        assert!(storage.read("job/file/below").unwrap_err().is_not_found());
    }

    #[test]
    fn reading_a_directory_is_an_io_error() {
        let (_dir, storage) = storage();
        storage.write("job/chk-1/a", b"x").unwrap();
        let err = storage.read("job/chk-1").unwrap_err();
        assert!(
            matches!(err, StorageError::Io { op: "read", .. }),
            "{err:?}"
        );
    }

    #[test]
    fn write_atomic_leaves_no_temp_files() {
        let (_dir, storage) = storage();
        for i in 0..5 {
            storage
                .write_atomic("job/chk-1/_metadata", format!("v{i}").as_bytes())
                .unwrap();
        }
        assert_eq!(storage.read("job/chk-1/_metadata").unwrap(), b"v4");
        assert_eq!(all_files(storage.root()), vec!["job/chk-1/_metadata"]);
        assert_eq!(storage.list("job/chk-1").unwrap(), vec!["_metadata"]);
    }

    #[test]
    fn failed_write_atomic_removes_its_temp_file() {
        let (_dir, storage) = storage();
        // The target is a non-empty directory: the final rename fails.
        storage.write("job/chk-1/_metadata/blocker", b"x").unwrap();
        let err = storage
            .write_atomic("job/chk-1/_metadata", b"meta")
            .unwrap_err();
        match &err {
            StorageError::Io { op, path, .. } => {
                assert_eq!(*op, "write");
                assert_eq!(*path, storage.location("job/chk-1/_metadata"));
            }
            other => panic!("{other:?}"),
        }
        let names = storage.list("job/chk-1").unwrap();
        assert_eq!(names, vec!["_metadata"]);
        assert!(!names.iter().any(|n| is_temp_file(n)));
        assert_eq!(
            all_files(storage.root()),
            vec!["job/chk-1/_metadata/blocker"]
        );
    }

    #[test]
    fn write_atomic_replaces_atomically() {
        let (_dir, storage) = storage();
        let storage = Arc::new(storage);
        let a = vec![b'a'; 64 * 1024];
        let b = vec![b'b'; 3 * 1024];
        storage.write_atomic("job/chk-1/_metadata", &a).unwrap();
        let done = Arc::new(AtomicBool::new(false));
        let reader = {
            let storage = Arc::clone(&storage);
            let done = Arc::clone(&done);
            let (a, b) = (a.clone(), b.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !done.load(Ordering::Relaxed) || reads == 0 {
                    let bytes = storage.read("job/chk-1/_metadata").unwrap();
                    assert!(
                        bytes == a || bytes == b,
                        "torn read of {} bytes",
                        bytes.len()
                    );
                    reads += 1;
                }
            })
        };
        for i in 0..100 {
            let bytes = if i % 2 == 0 { &b } else { &a };
            storage.write_atomic("job/chk-1/_metadata", bytes).unwrap();
        }
        done.store(true, Ordering::Relaxed);
        reader.join().unwrap();
        assert_eq!(all_files(storage.root()), vec!["job/chk-1/_metadata"]);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn full_disk_is_an_error_not_a_panic() {
        if !Path::new("/dev/full").exists() {
            return;
        }
        let (_dir, storage) = storage();
        std::os::unix::fs::symlink("/dev/full", storage.root().join("full")).unwrap();
        let err = storage.write("full", b"some state").unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "cannot write {}: No space left on device",
                storage.location("full")
            )
        );
        assert!(matches!(err, StorageError::Io { op: "write", .. }));
    }

    #[test]
    fn size_of_a_file_below_a_file_is_zero() {
        let (_dir, storage) = storage();
        storage.write("a", b"xyz").unwrap();
        assert_eq!(storage.size("a").unwrap(), 3);
        assert_eq!(storage.size("a/b").unwrap(), 0);
        assert!(!storage.exists("a/b").unwrap());
        assert_eq!(storage.list("a/b").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn writing_below_a_file_is_an_error() {
        let (_dir, storage) = storage();
        storage.write("a", b"xyz").unwrap();
        let err = storage.write("a/b", b"x").unwrap_err();
        assert!(matches!(err, StorageError::Io { .. }), "{err:?}");
        let err = storage.write_atomic("a/b/c", b"x").unwrap_err();
        assert!(matches!(err, StorageError::Io { .. }), "{err:?}");
        assert_eq!(storage.read("a").unwrap(), b"xyz");
    }

    #[test]
    fn rename_of_a_directory_works() {
        let (_dir, storage) = storage();
        storage.write("job/tmp-chk/a", b"1").unwrap();
        storage.write("job/tmp-chk/b", b"22").unwrap();
        storage.rename("job/tmp-chk", "job/chk-1").unwrap();
        assert_eq!(storage.list("job/chk-1").unwrap(), vec!["a", "b"]);
        assert!(!storage.exists("job/tmp-chk").unwrap());
    }
}
