//! The embedded disk state backend: keyed state in RocksDB (`state.backend.type: rocksdb`).
//!
//! One RocksDB instance per keyed operator subtask, in a directory of its own under
//! `state.backend.rocksdb.localdir`; one column family per registered state. A key is stored
//! as `[key group: u16 big-endian][postcard(K)]`, so that a subtask's key-group range is one
//! contiguous key range, and a value as postcard of what the state stores for that key.
//!
//! The typed tables of [`KeyedContext`](super::KeyedContext) stay the access path: for a disk
//! state they are a bounded write-back cache in front of the column family (entries are loaded
//! on first access, written back in one `WriteBatch` when the cache is full and at every
//! snapshot). Memory is bounded by one budget (`state.backend.rocksdb.memory.fixed-per-slot`):
//! a quarter is the object cache, the rest RocksDB's block cache, which also holds the write
//! buffers (a `WriteBufferManager` charged to it).
//!
//! Checkpoints: the synchronous part writes the caches back, flushes the memtables and takes a
//! RocksDB checkpoint (a hard-linked set of SST files: immutable); the asynchronous part
//! uploads. With `state.backend.incremental: true` an SST file already uploaded by the last
//! checkpoint this subtask saw complete is referenced, not uploaded again; new ones go to
//! `<job>/shared/<checkpoint>-<instance>-<file>` and `_metadata` lists every shared file the
//! checkpoint references, so that the coordinator deletes a shared file once no retained
//! checkpoint needs it. Without incremental checkpoints the files go into the checkpoint's own
//! directory. Savepoints are written in the backend-independent format (the heap's
//! [`KeyedTableData`]), built from the key and value bytes without knowing their types.
//!
//! Restore: a subtask whose key-group range equals that of the one instance it restores from
//! downloads its files and opens them; otherwise (rescaling) it opens each instance whose range
//! overlaps its own and copies the keys of its key groups into a new instance.

use std::collections::{BTreeMap, HashMap as StdHashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, FlushOptions, IteratorMode, Options,
    WriteBatch, WriteBufferManager, WriteOptions, DB,
};
use tracing::{debug, warn};

pub use super::disk_state::{
    shared_file_checkpoint, DiskFile, DiskFileLocation, DiskStateData, RocksDbSettings,
    UploadTarget, DEFAULT_MEMORY_BYTES,
};
use super::keygroup::KeyGroupRange;
use super::{KeyedTableData, StateDescriptor, StateKind};
use crate::error::{TaskError, TaskResult};
use crate::storage::format::{encode_frame, FileKind};
use crate::storage::layout::{checkpoint_dir, shared_dir};

/// Where the SST files of an instance's snapshots are, so that an incremental checkpoint
/// references uploads of earlier checkpoints instead of uploading the files again.
///
/// A snapshot references a file's earlier upload only if the last checkpoint this instance saw
/// complete references it *and* every snapshot taken since (not known to have completed or
/// been aborted) references that same upload. Otherwise a snapshot taken before that
/// completion was known, which uploaded the file again under its own name, could complete
/// first and subsume the confirmed checkpoint, and the coordinator would delete the upload
/// this one references (the simulation finds that schedule with concurrent checkpoints).
#[derive(Debug, Default)]
struct Uploads {
    /// The SST files of the last checkpoint this instance saw complete: name → (path, size).
    confirmed: StdHashMap<String, (String, u64)>,
    /// Per snapshot taken since that is not known complete or aborted: name → (path, size).
    decided: BTreeMap<u64, StdHashMap<String, (String, u64)>>,
}

impl Uploads {
    /// The earlier upload the next snapshot's file `name` may reference, if any.
    fn reusable(&self, name: &str) -> Option<(String, u64)> {
        let (path, size) = self.confirmed.get(name)?;
        self.decided
            .values()
            .all(|m| m.get(name).is_some_and(|(p, _)| p == path))
            .then(|| (path.clone(), *size))
    }
}

/// What the asynchronous part does with one file of a local RocksDB checkpoint.
#[derive(Debug)]
enum Planned {
    /// Reference an earlier upload.
    Reference { path: String, size: u64 },
    /// Upload it to `path` (None: into the checkpoint's own directory, a full checkpoint).
    Upload { path: Option<String> },
    /// Small metadata file (`MANIFEST`, `CURRENT`, `OPTIONS`): inline in the state file.
    Inline,
}

/// RocksDB's merge of list appends (every column family has it; only list state merges): a
/// stored list and each appended part are postcard `Vec<V>`, a varint count and then the
/// elements; merged, the counts add up and the elements follow in order, never decoded.
fn list_append(
    _key: &[u8],
    existing: Option<&[u8]>,
    operands: &rocksdb::MergeOperands,
) -> Option<Vec<u8>> {
    let mut count: u64 = 0;
    let mut elements = Vec::new();
    for part in existing.into_iter().chain(operands) {
        let (n, rest) = postcard::take_from_bytes::<u64>(part).ok()?;
        count = count.checked_add(n)?;
        elements.extend_from_slice(rest);
    }
    let mut out = postcard::to_stdvec(&count).ok()?;
    out.extend_from_slice(&elements);
    Some(out)
}

/// The key group of an encoded key.
fn key_group_of(key: &[u8]) -> Option<u32> {
    Some(u16::from_be_bytes([*key.first()?, *key.get(1)?]) as u32)
}

/// The first encoded key of key group `kg`.
fn group_start(kg: u32) -> [u8; 2] {
    (kg as u16).to_be_bytes()
}

/// One opened RocksDB instance: the disk state of one keyed operator subtask.
pub(crate) struct RocksInstance {
    db: Option<DB>,
    /// Its working directory (`db/` and local checkpoints); removed when dropped.
    dir: PathBuf,
    id: String,
    uid: String,
    range: KeyGroupRange,
    settings: RocksDbSettings,
    cf_options: Options,
    write: WriteOptions,
    uploads: Uploads,
    /// Kind and serializer of every column family (restored and registered).
    states: BTreeMap<String, StateDescriptor>,
    /// Per column family, its state's time to live in ms (0: none), which its compaction
    /// filter reads: set when the state is registered.
    ttl: StdHashMap<String, Arc<AtomicI64>>,
    /// Options of the column families created after the database was opened: RocksDB keeps
    /// pointers into them (their compaction filters), and `create_cf` does not keep them.
    cf_options_alive: Vec<Options>,
    _cache: Cache,
    _buffers: WriteBufferManager,
}

fn rocks_err(what: &str, e: rocksdb::Error) -> TaskError {
    TaskError::msg(format!("RocksDB: {what}: {e}"))
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> TaskError {
    TaskError::msg(format!(
        "{what} {}: {}",
        path.display(),
        crate::storage::describe_io(&e)
    ))
}

/// A fresh random instance id.
fn new_instance_id() -> String {
    format!("{:016x}", fastrand::u64(..))
}

impl RocksInstance {
    /// Opens the instance of operator `uid`, subtask `subtask`, restoring `restored` (the
    /// instances of the checkpoint whose key groups overlap `range`).
    pub(crate) fn open(
        settings: &RocksDbSettings,
        uid: &str,
        subtask: u32,
        range: KeyGroupRange,
        restored: Vec<DiskStateData>,
    ) -> TaskResult<Self> {
        let id = new_instance_id();
        let safe_uid: String = uid
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let dir = settings
            .local_dir
            .join(format!("{safe_uid}-{subtask}-{id}"));
        std::fs::create_dir_all(&dir)
            .map_err(|e| io_err("cannot create the RocksDB directory", &dir, e))?;
        let budget = settings
            .memory_bytes
            .saturating_sub(settings.object_cache_bytes());
        let cache = Cache::new_lru_cache(budget as usize);
        // Write buffers are charged to the block cache: one budget for both.
        let buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            budget as usize / 2,
            false,
            cache.clone(),
        );
        // Index and filter blocks are charged to the cache too, partitioned so that a state
        // far larger than the cache reads a small partition per lookup, not a whole filter;
        // the top level stays pinned.
        let mut table = BlockBasedOptions::default();
        table.set_block_cache(&cache);
        table.set_cache_index_and_filter_blocks(true);
        table.set_cache_index_and_filter_blocks_with_high_priority(true);
        table.set_index_type(rocksdb::BlockBasedIndexType::TwoLevelIndexSearch);
        table.set_partition_filters(true);
        table.set_pin_top_level_index_and_filter(true);
        table.set_pin_l0_filter_and_index_blocks_in_cache(true);
        table.set_bloom_filter(10.0, false);
        let mut cf_options = Options::default();
        cf_options.set_block_based_table_factory(&table);
        cf_options.set_compression_type(rocksdb::DBCompressionType::Lz4);
        cf_options.set_merge_operator_associative("cairn-list-append", list_append);
        cf_options.set_write_buffer_size((budget as usize / 8).clamp(1 << 20, 64 << 20));
        // Smaller files: an upload reads one file at a time into memory.
        cf_options.set_target_file_size_base((budget / 4).clamp(1 << 20, 64 << 20));
        let mut write = WriteOptions::default();
        // Never needed: a restore always starts from a checkpoint, never from the local files.
        write.disable_wal(true);
        let mut instance = RocksInstance {
            db: None,
            dir,
            id,
            uid: uid.to_string(),
            range,
            settings: settings.clone(),
            cf_options,
            write,
            uploads: Uploads::default(),
            states: BTreeMap::new(),
            ttl: StdHashMap::new(),
            cf_options_alive: Vec::new(),
            _cache: cache,
            _buffers: buffers,
        };
        instance.restore(restored)?;
        Ok(instance)
    }

    fn db_options(&self) -> Options {
        let mut opts = self.cf_options.clone();
        opts.create_if_missing(true);
        opts.create_missing_column_families(true);
        opts.set_write_buffer_manager(&self._buffers);
        opts.set_max_background_jobs(2);
        opts.set_max_open_files(256);
        opts
    }

    fn db_path(&self) -> PathBuf {
        self.dir.join("db")
    }

    pub(crate) fn db(&self) -> &DB {
        self.db.as_ref().expect("RocksDB instance is open")
    }

    /// The options of column family `name`: with a compaction filter that drops the entries
    /// of a state with time-to-live once expired (cleanup in background compaction). The
    /// stored value of such a state starts with its access time (i64 little-endian).
    fn cf_options_for(&mut self, name: &str) -> Options {
        let ttl = self.ttl.entry(name.to_string()).or_default().clone();
        let mut opts = self.cf_options.clone();
        opts.set_compaction_filter(
            "cairn-state-ttl",
            move |_level: u32, _key: &[u8], value: &[u8]| {
                let ttl_ms = ttl.load(Ordering::Relaxed);
                let stamp = value.get(..8).and_then(|b| <[u8; 8]>::try_from(b).ok());
                match stamp {
                    Some(stamp) if ttl_ms > 0 => {
                        let now = crate::checkpoint::now_ms() as i64;
                        if now.saturating_sub(i64::from_le_bytes(stamp)) >= ttl_ms {
                            rocksdb::compaction_filter::Decision::Remove
                        } else {
                            rocksdb::compaction_filter::Decision::Keep
                        }
                    }
                    _ => rocksdb::compaction_filter::Decision::Keep,
                }
            },
        );
        opts
    }

    /// Sets the time to live of state `name` (0: none), for its compaction filter.
    pub(crate) fn set_ttl(&mut self, name: &str, ttl_ms: i64) {
        self.ttl
            .entry(name.to_string())
            .or_default()
            .store(ttl_ms, Ordering::Relaxed);
    }

    /// Opens the database at `path` with these column families.
    fn open_db(&mut self, path: &Path, cfs: &[String]) -> TaskResult<DB> {
        let descriptors: Vec<ColumnFamilyDescriptor> = cfs
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(n, self.cf_options_for(n)))
            .collect();
        DB::open_cf_descriptors(&self.db_options(), path, descriptors)
            .map_err(|e| rocks_err(&format!("cannot open {}", path.display()), e))
    }

    fn restore(&mut self, restored: Vec<DiskStateData>) -> TaskResult {
        let path = self.db_path();
        let direct = restored.len() == 1 && restored[0].range() == self.range;
        if direct {
            let data = &restored[0];
            self.download(data, &path)?;
            let cfs: Vec<String> = data.states.iter().map(|s| s.name.clone()).collect();
            self.db = Some(self.open_db(&path, &cfs)?);
            let own = format!("{}/", shared_dir(&self.settings.job_id));
            for f in &data.files {
                // Files of this job's shared directory may be referenced again; another job's
                // (a savepoint's, a NO_CLAIM start's) are uploaded anew by the first checkpoint.
                if let DiskFileLocation::Stored { path, size } = &f.location {
                    if path.starts_with(&own) {
                        self.uploads
                            .confirmed
                            .insert(f.name.clone(), (path.clone(), *size));
                    }
                }
            }
            for s in &data.states {
                self.states.insert(s.name.clone(), s.clone());
            }
            return Ok(());
        }
        self.db = Some(self.open_db(&path, &[])?);
        for (i, data) in restored.iter().enumerate() {
            let overlap_first = self.range.start.max(data.first_key_group);
            let overlap_last = self.range.end.min(data.last_key_group);
            if overlap_first > overlap_last {
                continue;
            }
            let tmp = self.dir.join(format!("restore-{i}"));
            self.download(data, &tmp)?;
            {
                let cfs: Vec<String> = data.states.iter().map(|s| s.name.clone()).collect();
                let source = self.open_db(&tmp, &cfs)?;
                for s in &data.states {
                    self.ensure_cf(s)?;
                    self.copy_range(&source, &s.name, overlap_first, overlap_last)?;
                }
            }
            let _ = std::fs::remove_dir_all(&tmp);
        }
        Ok(())
    }

    /// Copies the keys of key groups `first..=last` of column family `cf` from `source`.
    fn copy_range(&self, source: &DB, cf: &str, first: u32, last: u32) -> TaskResult {
        let (Some(from), Some(to)) = (source.cf_handle(cf), self.db().cf_handle(cf)) else {
            return Err(TaskError::msg(format!(
                "RocksDB: column family '{cf}' missing while restoring"
            )));
        };
        let start = group_start(first);
        let mut batch = WriteBatch::default();
        for item in source.iterator_cf(
            from,
            IteratorMode::From(&start, rocksdb::Direction::Forward),
        ) {
            let (k, v) = item.map_err(|e| rocks_err("cannot read a restored instance", e))?;
            match key_group_of(&k) {
                Some(kg) if kg <= last => batch.put_cf(to, &k, &v),
                _ => break,
            }
            if batch.size_in_bytes() > 4 << 20 {
                self.db()
                    .write_opt(std::mem::take(&mut batch), &self.write)
                    .map_err(|e| rocks_err("cannot write restored state", e))?;
            }
        }
        self.db()
            .write_opt(batch, &self.write)
            .map_err(|e| rocks_err("cannot write restored state", e))
    }

    /// Downloads the files of a checkpointed instance into `path`.
    fn download(&self, data: &DiskStateData, path: &Path) -> TaskResult {
        std::fs::create_dir_all(path)
            .map_err(|e| io_err("cannot create the RocksDB directory", path, e))?;
        for f in &data.files {
            if f.name.contains('/') || f.name.starts_with('.') || f.name.is_empty() {
                return Err(TaskError::Unrecoverable(format!(
                    "disk state of '{}' names a bad file '{}'",
                    data.uid, f.name
                )));
            }
            let target = path.join(&f.name);
            let bytes;
            let content: &[u8] = match &f.location {
                DiskFileLocation::Inline(b) => b,
                DiskFileLocation::Stored { path: stored, size } => {
                    let framed = self.settings.storage.read(stored).map_err(|e| {
                        TaskError::msg(format!("cannot download state file {stored}: {e}"))
                    })?;
                    bytes = crate::storage::format::decode_frame(FileKind::SharedState, &framed)
                        .map(|p| p.to_vec())
                        .map_err(|e| {
                            TaskError::msg(format!(
                                "{}: {e}",
                                self.settings.storage.location(stored)
                            ))
                        })?;
                    if bytes.len() as u64 != *size {
                        return Err(TaskError::msg(format!(
                            "{}: {} bytes, expected {size}",
                            self.settings.storage.location(stored),
                            bytes.len()
                        )));
                    }
                    &bytes
                }
            };
            std::fs::write(&target, content)
                .map_err(|e| io_err("cannot write restored state file", &target, e))?;
        }
        Ok(())
    }

    /// Kind and serializer of state `name`, if it has a column family (restored or registered).
    pub(crate) fn state(&self, name: &str) -> Option<&StateDescriptor> {
        self.states.get(name)
    }

    /// Creates the column family of state `desc` if it does not exist yet.
    pub(crate) fn ensure_cf(&mut self, desc: &StateDescriptor) -> TaskResult {
        if self.db().cf_handle(&desc.name).is_none() {
            let opts = self.cf_options_for(&desc.name);
            self.db
                .as_mut()
                .expect("RocksDB instance is open")
                .create_cf(&desc.name, &opts)
                .map_err(|e| rocks_err(&format!("cannot create state '{}'", desc.name), e))?;
            self.cf_options_alive.push(opts);
        }
        self.states.insert(desc.name.clone(), desc.clone());
        Ok(())
    }

    /// The stored value of an encoded key in column family `cf`.
    pub(crate) fn get(
        &self,
        cf: &str,
        key: &[u8],
    ) -> TaskResult<Option<rocksdb::DBPinnableSlice<'_>>> {
        let db = self.db();
        let Some(handle) = db.cf_handle(cf) else {
            return Ok(None);
        };
        db.get_pinned_cf(handle, key)
            .map_err(|e| rocks_err(&format!("cannot read state '{cf}'"), e))
    }

    /// Writes one key of column family `cf`.
    pub(crate) fn put(&self, cf: &str, key: &[u8], value: &[u8]) -> TaskResult {
        self.db()
            .put_cf_opt(self.cf(cf)?, key, value, &self.write)
            .map_err(|e| rocks_err(&format!("cannot write state '{cf}'"), e))
    }

    /// Merges `value` into one key of column family `cf` (list state: appends).
    pub(crate) fn merge(&self, cf: &str, key: &[u8], value: &[u8]) -> TaskResult {
        self.db()
            .merge_cf_opt(self.cf(cf)?, key, value, &self.write)
            .map_err(|e| rocks_err(&format!("cannot write state '{cf}'"), e))
    }

    /// Deletes one key of column family `cf`.
    pub(crate) fn delete(&self, cf: &str, key: &[u8]) -> TaskResult {
        self.db()
            .delete_cf_opt(self.cf(cf)?, key, &self.write)
            .map_err(|e| rocks_err(&format!("cannot write state '{cf}'"), e))
    }

    /// The first key of column family `cf` at or after `from` and before `below`.
    pub(crate) fn first_key(
        &self,
        cf: &str,
        from: &[u8],
        below: &[u8],
    ) -> TaskResult<Option<Box<[u8]>>> {
        let mut read = rocksdb::ReadOptions::default();
        read.set_iterate_upper_bound(below.to_vec());
        let mut it = self.db().iterator_cf_opt(
            self.cf(cf)?,
            read,
            IteratorMode::From(from, rocksdb::Direction::Forward),
        );
        match it.next() {
            None => Ok(None),
            Some(Ok((k, _))) => Ok(Some(k)),
            Some(Err(e)) => Err(rocks_err(&format!("cannot read state '{cf}'"), e)),
        }
    }

    /// An empty batch of writes to column family `cf`.
    pub(crate) fn batch(&self, cf: &str) -> TaskResult<Batch<'_>> {
        Ok(Batch {
            cf: self.cf(cf)?,
            batch: WriteBatch::default(),
        })
    }

    /// Writes a batch (without the write-ahead log).
    pub(crate) fn write(&self, batch: Batch<'_>) -> TaskResult {
        self.db()
            .write_opt(batch.batch, &self.write)
            .map_err(|e| rocks_err("cannot write state", e))
    }

    /// The column family handle of `cf`.
    pub(crate) fn cf(&self, cf: &str) -> TaskResult<&rocksdb::ColumnFamily> {
        self.db()
            .cf_handle(cf)
            .ok_or_else(|| TaskError::msg(format!("RocksDB: no column family '{cf}'")))
    }

    /// The synchronous part of a snapshot (after the caches were written back): flushes the
    /// memtables and takes a RocksDB checkpoint into a local directory. The returned closure
    /// is the asynchronous part.
    pub(crate) fn checkpoint(
        &mut self,
        checkpoint_id: u64,
        canonical: bool,
    ) -> TaskResult<DeferredDisk> {
        let db = self.db();
        let handles: Vec<&rocksdb::ColumnFamily> =
            self.states.keys().filter_map(|n| db.cf_handle(n)).collect();
        let mut flush = FlushOptions::default();
        flush.set_wait(true);
        db.flush_cfs_opt(&handles, &flush)
            .map_err(|e| rocks_err("cannot flush", e))?;
        let local = self.dir.join(format!("chk-{checkpoint_id}"));
        if local.exists() {
            let _ = std::fs::remove_dir_all(&local);
        }
        rocksdb::checkpoint::Checkpoint::new(db)
            .and_then(|c| c.create_checkpoint(&local))
            .map_err(|e| rocks_err("cannot create a checkpoint", e))?;
        let plan = if canonical {
            Vec::new()
        } else {
            self.plan(checkpoint_id, &local)?
        };
        let snap = LocalCheckpoint {
            local,
            uid: self.uid.clone(),
            instance: self.id.clone(),
            range: self.range,
            states: self.states.values().cloned().collect(),
            plan,
            cf_options: self.cf_options.clone(),
        };
        Ok(if canonical {
            DeferredDisk::Canonical(snap)
        } else {
            DeferredDisk::Native(snap)
        })
    }

    /// The object cache bytes of this instance.
    pub(crate) fn settings_object_cache_bytes(&self) -> u64 {
        self.settings.object_cache_bytes()
    }

    /// Decides, on the task thread and in snapshot order, what snapshot `id` does with each
    /// file of its local checkpoint in `local`.
    fn plan(&mut self, id: u64, local: &Path) -> TaskResult<Vec<(String, Planned)>> {
        let mut names = Vec::new();
        let entries = std::fs::read_dir(local)
            .map_err(|e| io_err("cannot list the RocksDB checkpoint", local, e))?;
        for entry in entries {
            let entry =
                entry.map_err(|e| io_err("cannot list the RocksDB checkpoint", local, e))?;
            if let Some(name) = entry.file_name().to_str() {
                names.push(name.to_string());
            }
        }
        names.sort();
        let incremental = self.settings.incremental;
        let mut decided = StdHashMap::new();
        let mut plan = Vec::with_capacity(names.len());
        for name in names {
            if !name.ends_with(".sst") {
                plan.push((name, Planned::Inline));
                continue;
            }
            if !incremental {
                plan.push((name, Planned::Upload { path: None }));
                continue;
            }
            let (path, size, planned) = match self.uploads.reusable(&name) {
                Some((path, size)) => (path.clone(), size, Planned::Reference { path, size }),
                None => {
                    let path = format!(
                        "{}/{id}-{}-{name}",
                        shared_dir(&self.settings.job_id),
                        self.id
                    );
                    let size = std::fs::metadata(local.join(&name)).map_or(0, |m| m.len());
                    let planned = Planned::Upload {
                        path: Some(path.clone()),
                    };
                    (path, size, planned)
                }
            };
            decided.insert(name.clone(), (path, size));
            plan.push((name, planned));
        }
        if incremental {
            self.uploads.decided.insert(id, decided);
        }
        Ok(plan)
    }

    /// Checkpoint `id` completed: what it references may be referenced from now on; snapshots
    /// older than it will never complete.
    pub(crate) fn notify_complete(&mut self, id: u64) {
        let u = &mut self.uploads;
        if let Some(files) = u.decided.remove(&id) {
            u.confirmed = files;
        }
        u.decided.retain(|&k, _| k > id);
    }

    /// Checkpoint `id` was aborted: it will never complete.
    pub(crate) fn notify_aborted(&mut self, id: u64) {
        self.uploads.decided.remove(&id);
    }
}

/// Writes to one column family of an instance, applied together by [`RocksInstance::write`].
pub(crate) struct Batch<'a> {
    cf: &'a rocksdb::ColumnFamily,
    batch: WriteBatch,
}

impl Batch<'_> {
    /// Sets `key` to `value`.
    pub(crate) fn put(&mut self, key: &[u8], value: &[u8]) {
        self.batch.put_cf(self.cf, key, value);
    }

    /// Merges `value` into `key` (list state: appends).
    pub(crate) fn merge(&mut self, key: &[u8], value: &[u8]) {
        self.batch.merge_cf(self.cf, key, value);
    }

    /// Deletes `key`.
    pub(crate) fn delete(&mut self, key: &[u8]) {
        self.batch.delete_cf(self.cf, key);
    }

    /// The bytes of the writes so far.
    pub(crate) fn size_in_bytes(&self) -> usize {
        self.batch.size_in_bytes()
    }
}

impl Drop for RocksInstance {
    fn drop(&mut self) {
        self.db = None;
        if let Err(e) = std::fs::remove_dir_all(&self.dir) {
            if e.kind() != std::io::ErrorKind::NotFound {
                warn!(
                    "cannot remove the RocksDB directory {}: {e}",
                    self.dir.display()
                );
            }
        }
    }
}

/// A RocksDB checkpoint in a local directory, waiting for its asynchronous part.
pub(crate) struct LocalCheckpoint {
    local: PathBuf,
    uid: String,
    instance: String,
    range: KeyGroupRange,
    states: Vec<StateDescriptor>,
    /// What to do with each file (empty for a savepoint).
    plan: Vec<(String, Planned)>,
    cf_options: Options,
}

/// The asynchronous part of a disk snapshot.
pub(crate) enum DeferredDisk {
    /// Upload the checkpoint's files (a checkpoint).
    Native(LocalCheckpoint),
    /// Write the state in the backend-independent format (a savepoint).
    Canonical(LocalCheckpoint),
}

impl DeferredDisk {
    /// Runs the asynchronous part: a checkpoint uploads the files and returns their handle; a
    /// savepoint adds its tables in the backend-independent format to `keyed` (None). The
    /// local checkpoint directory is removed afterwards.
    pub(crate) fn finish(
        self,
        target: &UploadTarget<'_>,
        keyed: &mut Vec<KeyedTableData>,
    ) -> TaskResult<Option<DiskStateData>> {
        let (snap, canonical) = match self {
            DeferredDisk::Native(s) => (s, false),
            DeferredDisk::Canonical(s) => (s, true),
        };
        let result = if canonical {
            snap.canonical().map(|tables| {
                keyed.extend(tables);
                None
            })
        } else {
            snap.upload(target).map(Some)
        };
        if let Err(e) = std::fs::remove_dir_all(&snap.local) {
            warn!("cannot remove {}: {e}", snap.local.display());
        }
        result
    }
}

impl LocalCheckpoint {
    fn upload(&self, target: &UploadTarget<'_>) -> TaskResult<DiskStateData> {
        let id = target.checkpoint_id;
        let mut files = Vec::with_capacity(self.plan.len());
        let (mut uploaded, mut referenced) = (0u64, 0u64);
        for (name, planned) in &self.plan {
            let local = self.local.join(name);
            let read = || {
                std::fs::read(&local).map_err(|e| io_err("cannot read the RocksDB file", &local, e))
            };
            let location = match planned {
                Planned::Reference { path, size } => {
                    referenced += 1;
                    DiskFileLocation::Stored {
                        path: path.clone(),
                        size: *size,
                    }
                }
                Planned::Upload { path } => {
                    let bytes = read()?;
                    let path = path.clone().unwrap_or_else(|| {
                        format!(
                            "{}/{}.{name}",
                            checkpoint_dir(target.job_id, id),
                            target.file
                        )
                    });
                    target
                        .storage
                        .write(&path, &encode_frame(FileKind::SharedState, &bytes))?;
                    uploaded += 1;
                    DiskFileLocation::Stored {
                        path,
                        size: bytes.len() as u64,
                    }
                }
                Planned::Inline => DiskFileLocation::Inline(read()?),
            };
            files.push(DiskFile {
                name: name.clone(),
                location,
            });
        }
        debug!(
            checkpoint = id,
            uploaded, referenced, "RocksDB checkpoint of '{}' uploaded", self.uid
        );
        crate::failpoint::hit("disk-uploaded", id);
        Ok(DiskStateData {
            uid: self.uid.clone(),
            instance: self.instance.clone(),
            first_key_group: self.range.start,
            last_key_group: self.range.end,
            states: self.states.clone(),
            files,
        })
    }

    /// The state in the backend-independent format: per column family, per key group, the
    /// postcard bytes of `Vec<(K, S)>` — a length, then each key's and value's bytes, which
    /// is exactly what the stored keys (after their key-group prefix) and values are.
    fn canonical(&self) -> TaskResult<Vec<KeyedTableData>> {
        let names: Vec<String> = self.states.iter().map(|s| s.name.clone()).collect();
        let mut opts = self.cf_options.clone();
        opts.create_if_missing(false);
        // Every column family with the instance's options: list state needs the merge
        // operator to read appends not yet merged.
        let descriptors = names
            .iter()
            .map(|n| ColumnFamilyDescriptor::new(n, self.cf_options.clone()));
        let db = DB::open_cf_descriptors_read_only(&opts, &self.local, descriptors, false)
            .map_err(|e| rocks_err("cannot open the local checkpoint", e))?;
        let mut tables = Vec::with_capacity(self.states.len());
        for s in &self.states {
            let Some(handle) = db.cf_handle(&s.name) else {
                continue;
            };
            // A state with time-to-live stores its access time in front of each value.
            let skip = if s.serializer.id == super::ttl::SERDE_POSTCARD_TTL {
                8
            } else {
                0
            };
            let mut groups: Vec<(u32, Vec<u8>)> = Vec::new();
            let mut current: Option<(u32, u64, Vec<u8>)> = None;
            for item in db.iterator_cf(handle, IteratorMode::Start) {
                let (k, v) = item.map_err(|e| rocks_err("cannot read state", e))?;
                let Some(kg) = key_group_of(&k) else {
                    return Err(TaskError::msg(format!(
                        "RocksDB: a key of state '{}' has no key group",
                        s.name
                    )));
                };
                if current.as_ref().is_some_and(|(g, _, _)| *g != kg) {
                    if let Some(done) = current.take() {
                        groups.push(close_group(done));
                    }
                }
                let entry = current.get_or_insert_with(|| (kg, 0, Vec::new()));
                entry.1 += 1;
                if s.kind == StateKind::Timers {
                    // Stored as [kg][time][K], persisted as (K, time).
                    let time = super::disk_timers::time_from(&k[2..]).ok_or_else(|| {
                        TaskError::msg(format!("RocksDB: a timer of '{}' is malformed", s.name))
                    })?;
                    entry
                        .2
                        .extend_from_slice(&k[super::disk_timers::TIMER_PREFIX..]);
                    entry.2 = postcard::to_extend(&time, std::mem::take(&mut entry.2))
                        .map_err(|e| TaskError::msg(format!("cannot encode a timer: {e}")))?;
                    continue;
                }
                entry.2.extend_from_slice(&k[2..]);
                entry.2.extend_from_slice(v.get(skip..).unwrap_or_default());
            }
            if let Some(done) = current.take() {
                groups.push(close_group(done));
            }
            tables.push(KeyedTableData {
                name: s.name.clone(),
                kind: s.kind,
                serializer: s.serializer.clone(),
                groups,
            });
        }
        Ok(tables)
    }
}

/// A key group's entries as postcard bytes of a sequence: the varint count, then the entries.
fn close_group((kg, count, entries): (u32, u64, Vec<u8>)) -> (u32, Vec<u8>) {
    let mut bytes = postcard::to_stdvec(&count).unwrap_or_default();
    bytes.extend_from_slice(&entries);
    (kg, bytes)
}

/// One suite over both backends: every state kind through checkpoints (full and incremental),
/// restores at the same and other parallelisms, savepoints moving state between backends,
/// uploads of incremental checkpoints, the bounded cache, and time-to-live.
#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::state::{
        KeyedContext, OperatorStateData, RestoredState, StateTtlConfig, TimeDomain,
    };
    use crate::storage::{CheckpointStorage, MemoryStorage};

    const JOB: &str = "job";
    const MP: u32 = 128;

    #[derive(Clone, Copy, Debug, PartialEq)]
    enum Backend {
        Heap,
        Rocks { incremental: bool },
    }

    const BACKENDS: [Backend; 3] = [
        Backend::Heap,
        Backend::Rocks { incremental: false },
        Backend::Rocks { incremental: true },
    ];

    struct Env {
        dir: tempfile::TempDir,
        storage: Arc<MemoryStorage>,
    }

    impl Env {
        fn new() -> Self {
            Env {
                dir: tempfile::tempdir().unwrap(),
                storage: Arc::new(MemoryStorage::new()),
            }
        }

        fn settings(&self, incremental: bool, memory_bytes: u64) -> RocksDbSettings {
            RocksDbSettings {
                local_dir: self.dir.path().to_path_buf(),
                memory_bytes,
                incremental,
                storage: self.storage.clone(),
                job_id: JOB.into(),
            }
        }

        fn ctx(
            &self,
            b: Backend,
            subtask: u32,
            p: u32,
            restored: RestoredState,
        ) -> KeyedContext<u64> {
            let mut ctx = match b {
                Backend::Heap => KeyedContext::new(subtask, p, MP, restored.keyed),
                Backend::Rocks { incremental } => KeyedContext::on_disk(
                    "op",
                    subtask,
                    p,
                    MP,
                    restored.keyed,
                    restored.disk,
                    &self.settings(incremental, DEFAULT_MEMORY_BYTES),
                ),
            };
            ctx.check_restored().unwrap();
            ctx
        }

        /// A subtask of parallelism 1 with nothing restored.
        fn fresh(&self, b: Backend) -> KeyedContext<u64> {
            self.ctx(b, 0, 1, RestoredState::default())
        }

        /// Takes snapshot `id` (a savepoint: canonical) and completes it.
        fn snapshot(
            &self,
            ctx: &mut KeyedContext<u64>,
            id: u64,
            savepoint: bool,
        ) -> (OperatorStateData, Option<DiskStateData>) {
            let snap = ctx.snapshot_for("op", id, savepoint).unwrap();
            let file = format!("task-{}", ctx.subtask());
            let target = UploadTarget {
                storage: self.storage.as_ref(),
                job_id: JOB,
                checkpoint_id: id,
                file: &file,
            };
            let out = snap.finish_to(&target).unwrap();
            ctx.notify_complete(id);
            out
        }

        fn shared_files(&self) -> Vec<String> {
            self.storage.list(&shared_dir(JOB)).unwrap_or_default()
        }
    }

    /// What a subtask of `p` gets from the snapshots of all old subtasks.
    fn restored_for(
        parts: &[(OperatorStateData, Option<DiskStateData>)],
        subtask: u32,
        p: u32,
    ) -> RestoredState {
        let range = KeyGroupRange::for_subtask(MP, p, subtask);
        let mut out = RestoredState::default();
        for (data, disk) in parts {
            for t in &data.keyed {
                let table = out
                    .keyed
                    .entry(t.name.clone())
                    .or_insert_with(|| KeyedTableData {
                        groups: Vec::new(),
                        ..t.clone()
                    });
                table.groups.extend(
                    t.groups
                        .iter()
                        .filter(|(kg, _)| range.contains(*kg))
                        .cloned(),
                );
            }
            if let Some(d) = disk.as_ref().filter(|d| d.range().intersects(&range)) {
                out.disk.push(d.clone());
            }
        }
        out
    }

    const KEYS: u64 = 2000;

    /// The mean of the added values: an accumulator (sum, count) of another type than both.
    #[derive(Clone)]
    struct Mean;

    impl crate::state::AggregateFunction<u64, f64> for Mean {
        type Acc = (u64, u32);
        fn create(&self) -> (u64, u32) {
            (0, 0)
        }
        fn add(&self, acc: &mut (u64, u32), value: u64) {
            acc.0 += value;
            acc.1 += 1;
        }
        fn merge(&self, acc: &mut (u64, u32), other: &(u64, u32)) {
            acc.0 += other.0;
            acc.1 += other.1;
        }
        fn result(&self, acc: &(u64, u32)) -> f64 {
            acc.0 as f64 / f64::from(acc.1)
        }
    }

    /// Writes every state kind for every key; `round` changes the values.
    fn write_all(ctx: &mut KeyedContext<u64>, round: u64) {
        let v = ctx.value_state::<u64>("v").unwrap();
        let l = ctx.list_state::<String>("l").unwrap();
        let m = ctx.map_state::<u32, u64>("m").unwrap();
        let r = ctx.reducing_state::<u64>("r", |a, b| a + b).unwrap();
        let a = ctx.aggregating_state("a", Mean).unwrap();
        let range = ctx.key_group_range();
        for k in (0..KEYS).filter(|k| owns(range, *k)) {
            ctx.set_current_key(k);
            v.update(ctx, k * 10 + round).unwrap();
            l.add(ctx, format!("{k}:{round}")).unwrap();
            m.put(ctx, round as u32, k + round).unwrap();
            if round == 0 {
                m.put(ctx, 99, 1).unwrap();
            } else {
                m.remove(ctx, &99).unwrap();
            }
            r.add(ctx, k + round).unwrap();
            a.add(ctx, k + 2 * round).unwrap();
            if k % 7 == 0 {
                v.clear(ctx).unwrap();
            }
        }
    }

    fn owns(range: KeyGroupRange, k: u64) -> bool {
        use crate::state::keygroup::{key_group_of_hash, stable_hash};
        range.contains(key_group_of_hash(stable_hash(&k), MP))
    }

    /// Checks every key's state after rounds `0..=last`.
    fn check_all(ctx: &mut KeyedContext<u64>, last: u64) -> u64 {
        let v = ctx.value_state::<u64>("v").unwrap();
        let l = ctx.list_state::<String>("l").unwrap();
        let m = ctx.map_state::<u32, u64>("m").unwrap();
        let r = ctx.reducing_state::<u64>("r", |a, b| a + b).unwrap();
        let a = ctx.aggregating_state("a", Mean).unwrap();
        let range = ctx.key_group_range();
        let mut seen = 0;
        for k in 0..KEYS {
            ctx.set_current_key(k);
            if !owns(range, k) {
                assert_eq!(l.get(ctx).unwrap().len(), 0, "key {k} outside the range");
                continue;
            }
            seen += 1;
            let want = (k % 7 != 0).then_some(k * 10 + last);
            assert_eq!(v.value(ctx).unwrap().copied(), want, "value of {k}");
            let list: Vec<String> = (0..=last).map(|round| format!("{k}:{round}")).collect();
            assert_eq!(l.get(ctx).unwrap(), list.as_slice(), "list of {k}");
            let mut entries: Vec<(u32, u64)> = m
                .entries(ctx)
                .unwrap()
                .into_iter()
                .map(|(a, b)| (*a, *b))
                .collect();
            entries.sort_unstable();
            let mut want: Vec<(u32, u64)> =
                (0..=last).map(|round| (round as u32, k + round)).collect();
            if last == 0 {
                want.push((99, 1));
            }
            assert_eq!(entries, want, "map of {k}");
            let sum: u64 = (0..=last).map(|round| k + round).sum();
            assert_eq!(r.get(ctx).unwrap().copied(), Some(sum), "reduced {k}");
            let mean =
                (0..=last).map(|round| (k + 2 * round) as f64).sum::<f64>() / (last + 1) as f64;
            assert_eq!(a.get(ctx).unwrap(), Some(mean), "aggregated {k}");
        }
        seen
    }

    #[test]
    fn every_state_kind_survives_checkpoints_restores_and_rescaling_on_both_backends() {
        for b in BACKENDS {
            let env = Env::new();
            let mut ctx = env.fresh(b);
            write_all(&mut ctx, 0);
            let first = vec![env.snapshot(&mut ctx, 1, false)];
            // Changes after the synchronous part do not leak into the snapshot.
            write_all(&mut ctx, 1);
            drop(ctx);
            // Same parallelism.
            let mut back = env.ctx(b, 0, 1, restored_for(&first, 0, 1));
            assert_eq!(check_all(&mut back, 0), KEYS, "{b:?}");
            write_all(&mut back, 1);
            let second = vec![env.snapshot(&mut back, 2, false)];
            drop(back);
            // 1 → 3: every key in exactly one new subtask.
            let mut parts = Vec::new();
            let mut total = 0;
            for i in 0..3 {
                let mut part = env.ctx(b, i, 3, restored_for(&second, i, 3));
                total += check_all(&mut part, 1);
                write_all(&mut part, 2);
                parts.push(env.snapshot(&mut part, 3, false));
            }
            assert_eq!(total, KEYS, "{b:?}");
            // 3 → 2.
            let mut total = 0;
            for i in 0..2 {
                let mut part = env.ctx(b, i, 2, restored_for(&parts, i, 2));
                total += check_all(&mut part, 2);
            }
            assert_eq!(total, KEYS, "{b:?}");
        }
    }

    #[test]
    fn savepoints_move_state_between_the_heap_and_rocksdb() {
        let env = Env::new();
        let path = [
            Backend::Heap,
            Backend::Rocks { incremental: true },
            Backend::Rocks { incremental: false },
            Backend::Heap,
        ];
        let mut ctx = env.fresh(path[0]);
        write_all(&mut ctx, 0);
        let mut sp = vec![env.snapshot(&mut ctx, 1, true)];
        for (round, b) in path.iter().enumerate().skip(1) {
            // A savepoint is the backend-independent format: no disk handle, all tables.
            assert!(sp[0].1.is_none());
            let names: Vec<&str> = sp[0].0.keyed.iter().map(|t| t.name.as_str()).collect();
            for n in ["v", "l", "m", "r"] {
                assert!(names.contains(&n), "{names:?}");
            }
            let mut next = env.ctx(*b, 0, 1, restored_for(&sp, 0, 1));
            assert_eq!(check_all(&mut next, round as u64 - 1), KEYS, "{b:?}");
            write_all(&mut next, round as u64);
            sp = vec![env.snapshot(&mut next, round as u64 + 1, true)];
        }
        // And the savepoint of the last heap context restores on RocksDB at parallelism 2.
        let mut total = 0;
        for i in 0..2 {
            let mut part = env.ctx(
                Backend::Rocks { incremental: true },
                i,
                2,
                restored_for(&sp, i, 2),
            );
            total += check_all(&mut part, 3);
        }
        assert_eq!(total, KEYS);
    }

    #[test]
    fn incremental_checkpoints_upload_only_new_files() {
        let env = Env::new();
        let mut ctx = env.fresh(Backend::Rocks { incremental: true });
        let v = ctx.value_state::<u64>("v").unwrap();
        // A background compaction writes new files that hold unchanged entries too, and the
        // next checkpoint uploads them (as Flink's does). Whether one ran before a snapshot is
        // a race, so this test turns them off to measure what a checkpoint adds by itself.
        {
            let rocks = ctx.rocks.as_ref().unwrap();
            let cf = rocks.cf("v").unwrap();
            rocks
                .db()
                .set_options_cf(cf, &[("disable_auto_compactions", "true")])
                .unwrap();
        }
        for k in 0..50_000u64 {
            ctx.set_current_key(k);
            v.update(&mut ctx, k).unwrap();
        }
        let (_, first) = env.snapshot(&mut ctx, 1, false);
        let first = first.unwrap();
        let uploaded_first = env.shared_files();
        assert_eq!(uploaded_first.len(), first.shared_files().count());
        assert!(!uploaded_first.is_empty());
        let first_bytes = first.size();
        let mut previous = first;
        for id in 2..=6u64 {
            for k in 0..10u64 {
                ctx.set_current_key(k * 1000 + id);
                v.update(&mut ctx, id).unwrap();
            }
            let before: std::collections::HashSet<String> =
                env.shared_files().into_iter().collect();
            let (_, handle) = env.snapshot(&mut ctx, id, false);
            let handle = handle.unwrap();
            let new: Vec<String> = env
                .shared_files()
                .into_iter()
                .filter(|f| !before.contains(f))
                .collect();
            // Every new upload is named for this checkpoint, and every file it references
            // is either new or was referenced by the previous one.
            assert!(
                !new.is_empty() && new.len() <= 2,
                "checkpoint {id} uploaded {new:?}"
            );
            for f in &new {
                assert_eq!(shared_file_checkpoint(f), Some(id), "{f}");
            }
            let prev: std::collections::HashSet<&str> = previous.shared_files().collect();
            for path in handle.shared_files() {
                let name = path.rsplit('/').next().unwrap();
                assert!(
                    prev.contains(path) || new.iter().any(|n| n == name),
                    "checkpoint {id} references {path}, neither new nor reused"
                );
            }
            let uploaded: u64 = handle
                .files
                .iter()
                .filter_map(|f| match &f.location {
                    DiskFileLocation::Stored { path, size }
                        if new.iter().any(|n| path.ends_with(n.as_str())) =>
                    {
                        Some(*size)
                    }
                    _ => None,
                })
                .sum();
            assert!(
                uploaded * 20 < first_bytes,
                "checkpoint {id} uploaded {uploaded} B of {first_bytes} B for 10 changed keys"
            );
            previous = handle;
        }
    }

    /// Takes snapshot `id` without completing it.
    fn pending(env: &Env, ctx: &mut KeyedContext<u64>, id: u64) -> DiskStateData {
        let snap = ctx.snapshot_for("op", id, false).unwrap();
        let target = UploadTarget {
            storage: env.storage.as_ref(),
            job_id: JOB,
            checkpoint_id: id,
            file: "task-0",
        };
        snap.finish_to(&target).unwrap().1.unwrap()
    }

    fn sst_paths(d: &DiskStateData) -> StdHashMap<String, String> {
        d.files
            .iter()
            .filter_map(|f| match &f.location {
                DiskFileLocation::Stored { path, .. } => Some((f.name.clone(), path.clone())),
                _ => None,
            })
            .collect()
    }

    /// With checkpoints in flight, a snapshot references the confirmed checkpoint's upload of
    /// a file only if every snapshot taken since references that same upload; a snapshot taken
    /// before the completion was known uploads again, so the next one does too.
    #[test]
    fn snapshots_taken_before_a_completion_was_known_are_not_undercut() {
        let env = Env::new();
        let mut ctx = env.fresh(Backend::Rocks { incremental: true });
        let v = ctx.value_state::<u64>("v").unwrap();
        let write = |ctx: &mut KeyedContext<u64>, round: u64| {
            for k in 0..1000u64 {
                ctx.set_current_key(k * 10 + round);
                v.update(ctx, k).unwrap();
            }
        };
        write(&mut ctx, 0);
        let s1 = pending(&env, &mut ctx, 1);
        write(&mut ctx, 1);
        let s2 = pending(&env, &mut ctx, 2);
        // Checkpoint 1 completes after snapshot 2 was taken: snapshot 2 uploaded again what
        // snapshot 1 had (it could not know), under its own names.
        ctx.notify_complete(1);
        write(&mut ctx, 2);
        let s3 = pending(&env, &mut ctx, 3);
        let (p1, p2, p3) = (sst_paths(&s1), sst_paths(&s2), sst_paths(&s3));
        for (name, path) in &p3 {
            assert!(
                path.contains("/3-") || p2.get(name) == Some(path),
                "snapshot 3 references {path} for {name}, which snapshot 2 did not"
            );
            if let Some(first) = p1.get(name) {
                assert_ne!(path, first, "the upload snapshot 2 replaced is referenced");
            }
        }
        // Once 2 and 3 complete, unchanged files are referenced, not uploaded.
        ctx.notify_complete(2);
        ctx.notify_complete(3);
        let s4 = pending(&env, &mut ctx, 4);
        let p4 = sst_paths(&s4);
        let reused = p4.iter().filter(|(n, p)| p3.get(*n) == Some(p)).count();
        assert!(
            reused > 0 && reused == p4.len() - p4.values().filter(|p| p.contains("/4-")).count()
        );
    }

    #[test]
    fn full_checkpoints_keep_their_files_in_the_checkpoint_directory() {
        let env = Env::new();
        let mut ctx = env.ctx(
            Backend::Rocks { incremental: false },
            0,
            1,
            RestoredState::default(),
        );
        write_all(&mut ctx, 0);
        let (_, handle) = env.snapshot(&mut ctx, 4, false);
        let handle = handle.unwrap();
        assert_eq!(handle.shared_files().count(), 0);
        assert!(env.shared_files().is_empty());
        let stored: Vec<&str> = handle
            .files
            .iter()
            .filter_map(|f| match &f.location {
                DiskFileLocation::Stored { path, .. } => Some(path.as_str()),
                _ => None,
            })
            .collect();
        assert!(!stored.is_empty());
        assert!(
            stored.iter().all(|p| p.starts_with("job/chk-4/task-0.")),
            "{stored:?}"
        );
    }

    #[test]
    fn a_small_cache_evicts_and_reads_back_every_entry() {
        let env = Env::new();
        let settings = env.settings(true, 8 << 20);
        let mut ctx: KeyedContext<u64> =
            KeyedContext::on_disk("op", 0, 1, MP, Default::default(), Vec::new(), &settings);
        ctx.check_restored().unwrap();
        let v = ctx.value_state::<String>("v").unwrap();
        let keys = 200_000u64;
        for round in 0..2u64 {
            for k in 0..keys {
                ctx.set_current_key(k);
                let s = v.get_mut(&mut ctx, String::new).unwrap();
                s.push_str(&format!("{round};"));
            }
        }
        // 2 MiB of object cache cannot hold 200k entries.
        assert!(
            ctx.entries() < keys as usize / 2,
            "{} cached",
            ctx.entries()
        );
        for k in (0..keys).step_by(997) {
            ctx.set_current_key(k);
            assert_eq!(
                v.value(&mut ctx).unwrap().map(String::as_str),
                Some("0;1;"),
                "{k}"
            );
        }
        let (data, disk) = env.snapshot(&mut ctx, 1, false);
        drop(ctx);
        let parts = vec![(data, disk)];
        let mut back = env.ctx(
            Backend::Rocks { incremental: true },
            0,
            1,
            restored_for(&parts, 0, 1),
        );
        let v = back.value_state::<String>("v").unwrap();
        for k in (0..keys).step_by(101) {
            back.set_current_key(k);
            assert_eq!(
                v.value(&mut back).unwrap().map(String::as_str),
                Some("0;1;"),
                "{k}"
            );
        }
    }

    /// List appends to lists that are not cached read nothing: they are merged into the stored
    /// lists by RocksDB's merge operator (at write-back), and every read, checkpoint, savepoint
    /// and rescale sees the merged lists.
    #[test]
    fn list_appends_on_rocksdb_merge_without_reading_the_stored_list() {
        for incremental in [false, true] {
            let b = Backend::Rocks { incremental };
            let env = Env::new();
            let mut ctx = env.fresh(b);
            let l = ctx.list_state::<u64>("l").unwrap();
            for k in 0..1000u64 {
                ctx.set_current_key(k);
                l.add(&mut ctx, k).unwrap();
            }
            let parts = vec![env.snapshot(&mut ctx, 1, false)];
            drop(ctx);
            let mut ctx = env.ctx(b, 0, 1, restored_for(&parts, 0, 1));
            let l = ctx.list_state::<u64>("l").unwrap();
            for round in 1..=3u64 {
                for k in 0..1000u64 {
                    ctx.set_current_key(k);
                    l.add(&mut ctx, k + 1000 * round).unwrap();
                }
                assert_eq!(ctx.entries(), 0, "appends loaded no list into the cache");
                // Merged at the write-back of every snapshot.
                env.snapshot(&mut ctx, 1 + round, false);
            }
            ctx.set_current_key(5);
            l.add(&mut ctx, 9).unwrap(); // waits to be merged while the list is read
            assert_eq!(l.get(&mut ctx).unwrap(), &[5, 1005, 2005, 3005, 9]);
            l.add(&mut ctx, 10).unwrap(); // cached now: appended in memory
            assert_eq!(ctx.entries(), 1);
            let parts = vec![env.snapshot(&mut ctx, 9, false)];
            let savepoint = vec![env.snapshot(&mut ctx, 10, true)];
            drop(ctx);
            for (parts, to) in [(&parts, b), (&savepoint, Backend::Heap)] {
                for p in [1u32, 3] {
                    let mut seen = 0;
                    for i in 0..p {
                        let mut back = env.ctx(to, i, p, restored_for(parts, i, p));
                        let l = back.list_state::<u64>("l").unwrap();
                        let range = back.key_group_range();
                        for k in (0..1000u64).filter(|k| owns(range, *k)) {
                            back.set_current_key(k);
                            let mut want = vec![k, k + 1000, k + 2000, k + 3000];
                            if k == 5 {
                                want.extend([9, 10]);
                            }
                            assert_eq!(l.get(&mut back).unwrap(), &want[..], "{to:?} p={p} {k}");
                            seen += 1;
                        }
                    }
                    assert_eq!(seen, 1000);
                }
            }
        }
    }

    /// Registers event-time timers for every key (two each, one deleted again, one
    /// registered twice) and a processing-time timer for every third key.
    fn register_timers(ctx: &mut KeyedContext<u64>) {
        let range = ctx.key_group_range();
        for k in (0..KEYS).filter(|k| owns(range, *k)) {
            ctx.set_current_key(k);
            let t = (k % 50) as i64 - 25;
            ctx.register_event_time_timer(t).unwrap();
            ctx.register_event_time_timer(t).unwrap();
            ctx.register_event_time_timer(1_000 + t).unwrap();
            ctx.register_event_time_timer(5_000).unwrap();
            ctx.delete_event_time_timer(5_000).unwrap();
            if k % 3 == 0 {
                ctx.register_processing_time_timer(i64::MAX - 1 - k as i64)
                    .unwrap();
            }
        }
    }

    /// Timers (time, key) of event time and of processing time.
    type Fired = (Vec<(i64, u64)>, Vec<(i64, u64)>);

    /// Fires every timer: (time, key) in the order they fired, per clock.
    fn fire_all(ctx: &mut KeyedContext<u64>) -> Fired {
        let mut event = Vec::new();
        while let Some(t) = ctx.next_due_timer(TimeDomain::EventTime, 999).unwrap() {
            event.push((t, *ctx.current_key().unwrap()));
        }
        assert_eq!(
            ctx.next_due_timer(TimeDomain::EventTime, i64::MIN).unwrap(),
            None
        );
        // A timer registered after others fired fires too.
        if owns(ctx.key_group_range(), 1) {
            ctx.set_current_key(1);
            ctx.register_event_time_timer(2_000).unwrap();
        }
        while let Some(t) = ctx.next_due_timer(TimeDomain::EventTime, i64::MAX).unwrap() {
            event.push((t, *ctx.current_key().unwrap()));
        }
        assert_eq!(
            ctx.has_processing_timers(),
            ctx.next_processing_timer().is_some()
        );
        let processing = ctx.drain_processing_timers().unwrap();
        assert!(!ctx.has_processing_timers());
        (event, processing)
    }

    fn expected_timers(range: KeyGroupRange) -> Fired {
        let keys: Vec<u64> = (0..KEYS).filter(|k| owns(range, *k)).collect();
        let mut early: Vec<(i64, u64)> = keys.iter().map(|&k| ((k % 50) as i64 - 25, k)).collect();
        early.sort_unstable();
        let mut late: Vec<(i64, u64)> = keys
            .iter()
            .map(|&k| (1_000 + (k % 50) as i64 - 25, k))
            .collect();
        if owns(range, 1) {
            late.push((2_000, 1));
        }
        late.sort_unstable();
        let mut event = early;
        event.extend(late);
        let mut processing: Vec<(i64, u64)> = keys
            .iter()
            .filter(|k| *k % 3 == 0)
            .map(|&k| (i64::MAX - 1 - k as i64, k))
            .collect();
        processing.sort_unstable();
        (event, processing)
    }

    /// Fired timers in time order; the order among equal times is the backend's.
    fn sorted_by_time(mut v: Vec<(i64, u64)>) -> Vec<(i64, u64)> {
        assert!(
            v.windows(2).all(|w| w[0].0 <= w[1].0),
            "fired out of time order"
        );
        v.sort_unstable();
        v
    }

    /// Timers on every backend (on RocksDB in column families of their own): through a
    /// checkpoint, restored at the same parallelism and rescaled 1 -> 3, and moved between the
    /// backends by savepoints; every timer fires once, in time order, in the subtask owning its
    /// key, and none that was deleted or fired before the snapshot.
    #[test]
    fn timers_survive_checkpoints_rescaling_and_savepoints_on_every_backend() {
        for b in BACKENDS {
            for savepoint in [false, true] {
                for to in BACKENDS {
                    if !savepoint && to != b {
                        continue; // checkpoints restore on their own backend only
                    }
                    let env = Env::new();
                    let mut ctx = env.fresh(b);
                    register_timers(&mut ctx);
                    // One timer fires before the snapshot and must not fire again.
                    let first = ctx.next_due_timer(TimeDomain::EventTime, -25).unwrap();
                    assert_eq!(first, Some(-25), "{b:?}");
                    let fired_key = *ctx.current_key().unwrap();
                    let parts = vec![env.snapshot(&mut ctx, 1, savepoint)];
                    drop(ctx);
                    for p in [1u32, 3] {
                        let mut event = Vec::new();
                        let mut processing = Vec::new();
                        for i in 0..p {
                            let mut back = env.ctx(to, i, p, restored_for(&parts, i, p));
                            let range = back.key_group_range();
                            let (e, pr) = fire_all(&mut back);
                            let (mut want_e, want_p) = expected_timers(range);
                            want_e.retain(|x| *x != (-25, fired_key));
                            let what = format!("{b:?} -> {to:?}, savepoint {savepoint}, p={p}");
                            assert_eq!(
                                sorted_by_time(e.clone()),
                                {
                                    let mut w = want_e.clone();
                                    w.sort_unstable();
                                    w
                                },
                                "{what}"
                            );
                            assert_eq!(pr, want_p, "{what}");
                            event.extend(e);
                            processing.extend(pr);
                        }
                        assert!(!event.is_empty() && !processing.is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn time_to_live_expires_on_both_backends_and_across_restores() {
        for b in BACKENDS {
            let env = Env::new();
            let ttl = StateTtlConfig::new(Duration::from_millis(100));
            let mut ctx = env.fresh(b);
            ctx.set_ttl_clock(1_000);
            let v = ctx.value_state_with_ttl::<u64>("v", ttl).unwrap();
            let m = ctx.map_state_with_ttl::<u32, u64>("m", ttl).unwrap();
            let l = ctx.list_state_with_ttl::<u64>("l", ttl).unwrap();
            let a = ctx.aggregating_state_with_ttl("a", Mean, ttl).unwrap();
            for k in 0..100u64 {
                ctx.set_current_key(k);
                v.update(&mut ctx, k).unwrap();
                m.put(&mut ctx, 1, k).unwrap();
                l.add(&mut ctx, k).unwrap();
                a.add(&mut ctx, k).unwrap();
            }
            ctx.set_ttl_clock(1_050);
            for k in 0..50u64 {
                ctx.set_current_key(k);
                v.update(&mut ctx, k + 1).unwrap();
                l.add(&mut ctx, k + 1).unwrap();
            }
            ctx.set_ttl_clock(1_099);
            ctx.set_current_key(7);
            assert_eq!(l.get(&mut ctx).unwrap(), &[7, 8], "{b:?}");
            let parts = vec![env.snapshot(&mut ctx, 1, false)];
            drop(ctx);
            let mut back = env.ctx(b, 0, 1, restored_for(&parts, 0, 1));
            back.set_ttl_clock(1_120);
            let v = back.value_state_with_ttl::<u64>("v", ttl).unwrap();
            let m = back.map_state_with_ttl::<u32, u64>("m", ttl).unwrap();
            let l = back.list_state_with_ttl::<u64>("l", ttl).unwrap();
            let a = back.aggregating_state_with_ttl("a", Mean, ttl).unwrap();
            for k in 0..100u64 {
                back.set_current_key(k);
                let want = (k < 50).then_some(k + 1);
                assert_eq!(v.value(&mut back).unwrap().copied(), want, "{b:?} {k}");
                assert_eq!(m.get(&mut back, &1).unwrap(), None, "{b:?} {k}");
                assert_eq!(a.get(&mut back).unwrap(), None, "{b:?} {k}");
                // Each element expires on its own: the one added at 1 050 is left.
                let left: Vec<u64> = want.into_iter().collect();
                assert_eq!(l.get(&mut back).unwrap(), &left[..], "{b:?} {k}");
            }
            back.set_ttl_clock(1_150);
            back.set_current_key(7);
            assert!(l.get(&mut back).unwrap().is_empty(), "{b:?}");
            // Without time-to-live the same state is refused.
            let parts = vec![env.snapshot(&mut back, 2, false)];
            drop(back);
            let mut plain = env.ctx(b, 0, 1, restored_for(&parts, 0, 1));
            let err = plain.value_state::<u64>("v").err().expect("refused");
            assert!(matches!(err, TaskError::Unrecoverable(_)), "{b:?}: {err}");
        }
    }

    /// Cleanup in background compaction: entries of a state with time-to-live that expired
    /// on disk (never read or snapshotted since) are dropped when RocksDB compacts.
    #[test]
    fn compaction_drops_expired_entries_of_a_state_with_time_to_live() {
        let env = Env::new();
        let ttl = StateTtlConfig::new(Duration::from_secs(60));
        let mut ctx = env.fresh(Backend::Rocks { incremental: true });
        let v = ctx.value_state_with_ttl::<u64>("v", ttl).unwrap();
        let m = ctx.map_state_with_ttl::<u32, u64>("m", ttl).unwrap();
        let l = ctx.list_state_with_ttl::<u64>("l", ttl).unwrap();
        let now = crate::checkpoint::now_ms() as i64;
        // Written two minutes ago, and on disk since: expired by now.
        ctx.set_ttl_clock(now - 120_000);
        for k in 0..1000u64 {
            ctx.set_current_key(k);
            v.update(&mut ctx, k).unwrap();
            m.put(&mut ctx, 1, k).unwrap();
            l.add(&mut ctx, k).unwrap();
        }
        let parts = vec![env.snapshot(&mut ctx, 1, false)];
        drop(ctx);
        // Restored: the expired entries are on disk only, in no cache.
        let mut ctx = env.ctx(
            Backend::Rocks { incremental: true },
            0,
            1,
            restored_for(&parts, 0, 1),
        );
        let v = ctx.value_state_with_ttl::<u64>("v", ttl).unwrap();
        let m = ctx.map_state_with_ttl::<u32, u64>("m", ttl).unwrap();
        let l = ctx.list_state_with_ttl::<u64>("l", ttl).unwrap();
        ctx.set_ttl_clock(now);
        for k in 1000..1500u64 {
            ctx.set_current_key(k);
            v.update(&mut ctx, k).unwrap();
            m.put(&mut ctx, 1, k).unwrap();
            l.add(&mut ctx, k).unwrap();
        }
        env.snapshot(&mut ctx, 2, false);
        let rocks = ctx.rocks.as_ref().unwrap();
        let count = |name: &str| {
            let cf = rocks.cf(name).unwrap();
            rocks.db().iterator_cf(cf, IteratorMode::Start).count()
        };
        assert_eq!((count("v"), count("m"), count("l")), (1500, 1500, 1500));
        for name in ["v", "m", "l"] {
            rocks
                .db()
                .compact_range_cf(rocks.cf(name).unwrap(), None::<&[u8]>, None::<&[u8]>);
        }
        assert_eq!((count("v"), count("m"), count("l")), (500, 500, 500));
        // What is left reads back.
        ctx.set_current_key(1200);
        assert_eq!(v.value(&mut ctx).unwrap(), Some(&1200));
        assert_eq!(m.get(&mut ctx, &1).unwrap(), Some(&1200));
        assert_eq!(l.get(&mut ctx).unwrap(), &[1200]);
    }

    #[test]
    fn restored_state_registered_as_another_kind_is_refused_on_rocksdb() {
        let env = Env::new();
        let b = Backend::Rocks { incremental: true };
        let mut ctx = env.fresh(b);
        write_all(&mut ctx, 0);
        let parts = vec![env.snapshot(&mut ctx, 1, false)];
        drop(ctx);
        let mut back = env.ctx(b, 0, 1, restored_for(&parts, 0, 1));
        let err = back.list_state::<u64>("v").err().expect("refused");
        assert!(
            matches!(&err, TaskError::Unrecoverable(m) if m.contains("value state") && m.contains("list state")),
            "{err}"
        );
        // A missing shared file is found when the instance is opened.
        let d = parts[0].1.clone().unwrap();
        let path = d.shared_files().next().unwrap().to_string();
        env.storage.delete(&path).unwrap();
        let settings = env.settings(true, DEFAULT_MEMORY_BYTES);
        let mut broken: KeyedContext<u64> =
            KeyedContext::on_disk("op", 0, 1, MP, Default::default(), vec![d], &settings);
        let err = broken.check_restored().expect_err("refused");
        assert!(err.to_string().contains(&path), "{err}");
    }
}
