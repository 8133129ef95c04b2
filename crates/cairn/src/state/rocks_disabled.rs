//! The RocksDB state backend in a build without the `rocksdb` feature: the names the keyed
//! state uses (`RocksInstance`, `DeferredDisk`, `DiskTimerQueue`, `Batch`) with the
//! signatures of the real ones, but none can be made. `RocksInstance` is uninhabited and
//! `RocksInstance::open` fails with an error naming the feature; the others hold a reference to
//! an instance, so the code that would use any of them is never reached, and every method here
//! is an empty `match` on the instance.
//!
//! What checkpoints carry and the settings are the real ones (`disk_state`), so this build
//! still reads checkpoints that hold disk state.

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use super::disk_state::{
    shared_file_checkpoint, DiskFile, DiskFileLocation, DiskStateData, RocksDbSettings,
    UploadTarget, DEFAULT_MEMORY_BYTES,
};
use super::keygroup::KeyGroupRange;
use super::{KeyedTableData, StateDescriptor};
use crate::error::{needs_feature, TaskError, TaskResult};

/// An opened RocksDB instance: none in this build.
pub(crate) enum RocksInstance {}

/// What the other stand-ins hold: a reference to an instance, so none of them can be made
/// either. (Not uninhabited themselves: the compiler deems a reference inhabited, and so
/// type-checks the keyed state's code that handles them by value without calling it
/// unreachable.)
type NoInstance = &'static RocksInstance;

impl RocksInstance {
    /// Fails: this build has no RocksDB.
    pub(crate) fn open(
        _settings: &RocksDbSettings,
        _uid: &str,
        _subtask: u32,
        _range: KeyGroupRange,
        _restored: Vec<DiskStateData>,
    ) -> TaskResult<Self> {
        Err(TaskError::Unrecoverable(needs_feature(
            "state.backend.type: rocksdb",
            "rocksdb",
        )))
    }

    pub(crate) fn state(&self, _name: &str) -> Option<&StateDescriptor> {
        match *self {}
    }

    pub(crate) fn ensure_cf(&mut self, _desc: &StateDescriptor) -> TaskResult {
        match *self {}
    }

    pub(crate) fn set_ttl(&mut self, _name: &str, _ttl_ms: i64) {
        match *self {}
    }

    pub(crate) fn get(&self, _cf: &str, _key: &[u8]) -> TaskResult<Option<Vec<u8>>> {
        match *self {}
    }

    pub(crate) fn merge(&self, _cf: &str, _key: &[u8], _value: &[u8]) -> TaskResult {
        match *self {}
    }

    pub(crate) fn batch(&self, _cf: &str) -> TaskResult<Batch> {
        match *self {}
    }

    pub(crate) fn write(&self, _batch: Batch) -> TaskResult {
        match *self {}
    }

    pub(crate) fn checkpoint(&mut self, _id: u64, _canonical: bool) -> TaskResult<DeferredDisk> {
        match *self {}
    }

    pub(crate) fn settings_object_cache_bytes(&self) -> u64 {
        match *self {}
    }

    pub(crate) fn notify_complete(&mut self, _id: u64) {
        match *self {}
    }

    pub(crate) fn notify_aborted(&mut self, _id: u64) {
        match *self {}
    }
}

/// Writes to a column family: none in this build.
pub(crate) struct Batch(NoInstance);

impl Batch {
    pub(crate) fn put(&mut self, _key: &[u8], _value: &[u8]) {
        match *self.0 {}
    }

    pub(crate) fn merge(&mut self, _key: &[u8], _value: &[u8]) {
        match *self.0 {}
    }

    pub(crate) fn delete(&mut self, _key: &[u8]) {
        match *self.0 {}
    }

    pub(crate) fn size_in_bytes(&self) -> usize {
        match *self.0 {}
    }
}

/// The asynchronous part of a disk snapshot: none in this build.
pub(crate) struct DeferredDisk(NoInstance);

impl DeferredDisk {
    pub(crate) fn finish(
        self,
        _target: &UploadTarget<'_>,
        _keyed: &mut Vec<KeyedTableData>,
    ) -> TaskResult<Option<DiskStateData>> {
        match *self.0 {}
    }
}

/// Timers in a column family: none in this build.
pub(crate) struct DiskTimerQueue(NoInstance);

impl DiskTimerQueue {
    pub(crate) fn open(
        _cf: &'static str,
        rocks: &RocksInstance,
        _range: KeyGroupRange,
    ) -> TaskResult<Self> {
        match *rocks {}
    }

    pub(crate) fn register<K: Serialize>(
        &mut self,
        _rocks: &RocksInstance,
        _kg: u16,
        _key: &K,
        _time: i64,
    ) -> TaskResult {
        match *self.0 {}
    }

    pub(crate) fn delete<K: Serialize>(
        &mut self,
        _rocks: &RocksInstance,
        _kg: u16,
        _key: &K,
        _time: i64,
    ) -> TaskResult {
        match *self.0 {}
    }

    pub(crate) fn peek(&self) -> Option<i64> {
        match *self.0 {}
    }

    pub(crate) fn is_empty(&self) -> bool {
        match *self.0 {}
    }

    pub(crate) fn pop_due<K: DeserializeOwned>(
        &mut self,
        _rocks: &RocksInstance,
        _upto: i64,
    ) -> TaskResult<Option<(i64, K)>> {
        match *self.0 {}
    }
}
