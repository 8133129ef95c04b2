//! State: keyed state (scoped to the current key, partitioned into key groups) held by the heap
//! or the RocksDB state backend, and the snapshot/restore data that checkpoints carry.
//!
//! The state layer knows nothing about channels, tasks or checkpoint storage: an operator asks
//! its [`KeyedContext`] for a snapshot ([`OperatorSnapshot`]) whose synchronous part freezes the
//! heap's tables copy-on-write (`cow`; or copies them, without copy-on-write) or takes a RocksDB
//! checkpoint, and whose asynchronous part ([`OperatorSnapshot::finish`]) serializes or uploads
//! them per key group, off the task thread.

pub(crate) mod cow;
mod disk_state;
#[cfg(feature = "rocksdb")]
mod disk_timers;
pub mod keygroup;

pub mod operator;
// The RocksDB backend; without the `rocksdb` feature, stand-ins of the same names of which none
// can be made (no instance can be opened: choosing the backend is an error naming the feature).
#[cfg_attr(not(feature = "rocksdb"), path = "rocks_disabled.rs")]
pub mod rocks;
pub mod timers;
pub mod ttl;

use std::any::Any;
use std::collections::{BTreeMap, HashMap as StdHashMap};
use std::fmt;
use std::hash::Hash;
use std::marker::PhantomData;
use std::sync::Arc;

use hashbrown::HashMap;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::error::{TaskError, TaskResult};
use keygroup::{key_group_of_hash, stable_hash, KeyGroupRange, StableKey};

use cow::{CowMap, Frozen};
#[cfg(feature = "rocksdb")]
use disk_timers::DiskTimerQueue;
pub use operator::{OperatorListState, OperatorStateStore};
#[cfg(not(feature = "rocksdb"))]
use rocks::DiskTimerQueue;
use rocks::{DeferredDisk, RocksInstance};
pub use rocks::{DiskStateData, RocksDbSettings, UploadTarget};
pub use timers::{TimeDomain, Timers};
pub use ttl::{StateTtlConfig, TtlUpdate, TtlVisibility};
use ttl::{Ttl, TtlList, SERDE_POSTCARD_TTL};

/// A type usable as a key of keyed state. Its key group comes from its [`StableKey`] encoding;
/// `Hash` and `Eq` serve the in-memory tables only. `Sync`: a copy-on-write snapshot shares
/// the frozen entries with the thread that serializes them.
pub trait Key:
    StableKey + Hash + Eq + Clone + Serialize + DeserializeOwned + Send + Sync + 'static
{
}
impl<T: StableKey + Hash + Eq + Clone + Serialize + DeserializeOwned + Send + Sync + 'static> Key
    for T
{
}

/// A type storable in state (`Sync`: see [`Key`]).
pub trait StateValue: Clone + Serialize + DeserializeOwned + Send + Sync + 'static {}
impl<T: Clone + Serialize + DeserializeOwned + Send + Sync + 'static> StateValue for T {}

/// Incremental aggregation (Flink's `AggregateFunction`): of a window's records, or of the
/// values added to an [`AggregatingState`].
pub trait AggregateFunction<T, R>: Clone + Send + Sync + 'static {
    /// The running state of the aggregation.
    type Acc: StateValue;
    /// An empty accumulator.
    fn create(&self) -> Self::Acc;
    /// Adds a record.
    fn add(&self, acc: &mut Self::Acc, value: T);
    /// Folds `other` into `acc` (panes into a window, sessions into one).
    fn merge(&self, acc: &mut Self::Acc, other: &Self::Acc);
    /// The result.
    fn result(&self, acc: &Self::Acc) -> R;
}

/// The kind of a registered state. A restore refuses a state registered as another kind than
/// the one it was written as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum StateKind {
    /// Keyed: one value per key.
    Value,
    /// Keyed: a list per key.
    List,
    /// Keyed: a map per key.
    Map,
    /// Keyed: a value per key that added values are folded into.
    Reducing,
    /// Operator state: a list split evenly over the subtasks when the parallelism changes.
    OperatorList,
    /// Operator state: a list every subtask gets whole on restore.
    UnionList,
    /// Keyed system state: the timers of a keyed operator.
    Timers,
    /// Keyed: an accumulator per key that added values are aggregated into.
    Aggregating,
}

impl StateKind {
    /// Its name for people.
    pub fn as_str(self) -> &'static str {
        match self {
            StateKind::Value => "value",
            StateKind::List => "list",
            StateKind::Map => "map",
            StateKind::Reducing => "reducing",
            StateKind::OperatorList => "operator list",
            StateKind::UnionList => "union list",
            StateKind::Timers => "timers",
            StateKind::Aggregating => "aggregating",
        }
    }
}

impl fmt::Display for StateKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The serializer of the values of the built-in state kinds: serde's data model in postcard.
pub const SERDE_POSTCARD: &str = "cairn.serde-postcard";
/// The version of [`SERDE_POSTCARD`] this build writes; it reads this version and older ones.
pub const SERDE_POSTCARD_VERSION: u32 = 1;

/// Which serializer wrote a state's values, and in which version; persisted with the values,
/// so that a later cairn knows how to read them — or refuses clearly.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SerializerId {
    /// Serializer id, e.g. [`SERDE_POSTCARD`].
    pub id: String,
    /// Serializer version.
    pub version: u32,
    /// The Rust type of the values when they were written, for people (shown by
    /// `cairn savepoint info` and in errors). Not compared: compilers may name a type differently.
    pub type_name: String,
}

impl SerializerId {
    /// The serializer of the built-in state kinds, for values of type `T`.
    pub fn postcard<T: ?Sized>() -> Self {
        SerializerId {
            id: SERDE_POSTCARD.to_string(),
            version: SERDE_POSTCARD_VERSION,
            type_name: std::any::type_name::<T>().to_string(),
        }
    }

    /// The serializer of a state with time-to-live, for values of type `T` (a [`Ttl`]).
    pub fn postcard_ttl<T: ?Sized>() -> Self {
        SerializerId {
            id: SERDE_POSTCARD_TTL.to_string(),
            ..Self::postcard::<T>()
        }
    }

    /// Whether this build reads what the serializer wrote.
    pub fn check_readable(&self, state: &str) -> Result<(), String> {
        if self.id != SERDE_POSTCARD && self.id != SERDE_POSTCARD_TTL {
            return Err(format!(
                "state '{state}' was written by serializer '{}', which this build does not have",
                self.id
            ));
        }
        if self.version > SERDE_POSTCARD_VERSION {
            return Err(format!(
                "state '{state}' was written by serializer '{}' version {}; this build reads versions up to {SERDE_POSTCARD_VERSION}",
                self.id, self.version
            ));
        }
        Ok(())
    }
}

/// One keyed state table as persisted: its entries serialized per key group.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct KeyedTableData {
    /// The name the state was registered with.
    pub name: String,
    /// The kind it was registered as.
    pub kind: StateKind,
    /// The serializer of its entries.
    pub serializer: SerializerId,
    /// `(key group, postcard bytes of Vec<(K, S)>)`, ascending by key group.
    pub groups: Vec<(u32, Vec<u8>)>,
}

/// One operator list state as persisted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct OperatorListData {
    /// The name the state was registered with.
    pub name: String,
    /// [`StateKind::OperatorList`] (split evenly on rescaling) or [`StateKind::UnionList`]
    /// (every new subtask gets all of it).
    pub kind: StateKind,
    /// The serializer of its entries.
    pub serializer: SerializerId,
    /// The entries, each serialized on its own so that they can be redistributed.
    pub entries: Vec<Vec<u8>>,
}

impl OperatorListData {
    /// A list split evenly when rescaled, whose entries a connector serialized itself: a
    /// source's splits or a sink's pending transactions, described as `what`.
    pub fn connector(name: impl Into<String>, what: &str, entries: Vec<Vec<u8>>) -> Self {
        OperatorListData {
            name: name.into(),
            kind: StateKind::OperatorList,
            serializer: SerializerId {
                id: SERDE_POSTCARD.to_string(),
                version: SERDE_POSTCARD_VERSION,
                type_name: what.to_string(),
            },
            entries,
        }
    }

    /// A connector's union list (every subtask gets all of it on restore).
    pub fn union_connector(name: impl Into<String>, what: &str, entries: Vec<Vec<u8>>) -> Self {
        OperatorListData {
            kind: StateKind::UnionList,
            ..Self::connector(name, what, entries)
        }
    }
}

/// What `_metadata` says about one state of an operator.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct StateDescriptor {
    /// Its name.
    pub name: String,
    /// Its kind.
    pub kind: StateKind,
    /// Its serializer.
    pub serializer: SerializerId,
}

/// All state of one operator of one subtask, as persisted in a checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct OperatorStateData {
    /// Stable uid of the operator.
    pub uid: String,
    /// Keyed state tables.
    pub keyed: Vec<KeyedTableData>,
    /// Operator list states (source splits, pending sink transactions, user lists, ...).
    pub operator: Vec<OperatorListData>,
    /// In-flight input data of an unaligned checkpoint (only on a task's head operator).
    pub channel: Option<ChannelStateData>,
}

impl OperatorStateData {
    /// Name, kind and serializer of each of its states.
    pub fn descriptors(&self) -> Vec<StateDescriptor> {
        let keyed = self.keyed.iter().map(|t| (&t.name, t.kind, &t.serializer));
        let lists = self
            .operator
            .iter()
            .map(|l| (&l.name, l.kind, &l.serializer));
        keyed
            .chain(lists)
            .map(|(name, kind, serializer)| StateDescriptor {
                name: name.clone(),
                kind,
                serializer: serializer.clone(),
            })
            .collect()
    }
}

/// The input channel state of one subtask in an unaligned checkpoint.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct ChannelStateData {
    /// How many input channels the subtask had (the layout must match on restore).
    pub channels_total: u32,
    /// Per input channel index, its in-flight batches (serialized), in order.
    pub channels: Vec<(u32, Vec<Vec<u8>>)>,
}

pub(crate) type DeferredTable = Box<dyn FnOnce() -> TaskResult<KeyedTableData> + Send>;

/// The synchronous part of an operator's snapshot; [`OperatorSnapshot::finish`] is the
/// asynchronous part and runs off the task thread.
pub struct OperatorSnapshot {
    uid: String,
    operator: Vec<OperatorListData>,
    keyed: Vec<DeferredTable>,
    channel: Option<ChannelStateData>,
    /// The disk state backend's checkpoint, when the operator's keyed state is on disk.
    disk: Option<DeferredDisk>,
}

impl OperatorSnapshot {
    /// An empty snapshot of the operator `uid`.
    pub fn new(uid: impl Into<String>) -> Self {
        OperatorSnapshot {
            uid: uid.into(),
            operator: Vec::new(),
            keyed: Vec::new(),
            channel: None,
            disk: None,
        }
    }

    /// The operator's uid.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// Attaches the in-flight input data of an unaligned checkpoint.
    pub fn set_channel_state(&mut self, channel: ChannelStateData) {
        self.channel = Some(channel);
    }

    /// Adds an operator list state.
    pub fn with_list(mut self, list: OperatorListData) -> Self {
        self.operator.push(list);
        self
    }

    /// Whether the snapshot holds nothing (stateless operator).
    pub fn is_empty(&self) -> bool {
        self.operator.is_empty()
            && self.keyed.is_empty()
            && self.channel.is_none()
            && self.disk.is_none()
    }

    /// Runs the asynchronous part of a snapshot without disk state: serializes the copied tables.
    pub fn finish(self) -> TaskResult<OperatorStateData> {
        if self.disk.is_some() {
            return Err(TaskError::msg(
                "a snapshot of disk state needs a place to upload to",
            ));
        }
        Ok(self.finish_heap()?.0)
    }

    fn finish_heap(self) -> TaskResult<(OperatorStateData, Option<DeferredDisk>)> {
        let mut keyed = Vec::with_capacity(self.keyed.len());
        for t in self.keyed {
            keyed.push(t()?);
        }
        let data = OperatorStateData {
            uid: self.uid,
            keyed,
            operator: self.operator,
            channel: self.channel,
        };
        Ok((data, self.disk))
    }

    /// Runs the asynchronous part: serializes the copied tables, and uploads the disk state's
    /// files to `target` (or, for a savepoint, adds its tables in the backend-independent
    /// format).
    pub fn finish_to(
        self,
        target: &UploadTarget<'_>,
    ) -> TaskResult<(OperatorStateData, Option<DiskStateData>)> {
        let (mut data, disk) = self.finish_heap()?;
        let Some(disk) = disk else {
            return Ok((data, None));
        };
        let handle = disk.finish(target, &mut data.keyed)?;
        Ok((data, handle))
    }
}

/// State an operator subtask gets back on restore: only its own key groups, and the operator
/// list states assigned to it.
#[derive(Debug, Clone, Default)]
pub struct RestoredState {
    /// Keyed tables by name, holding only key groups in this subtask's range.
    pub keyed: StdHashMap<String, KeyedTableData>,
    /// Operator list states by name, holding the entries assigned to this subtask.
    pub operator: StdHashMap<String, OperatorListData>,
    /// In-flight input data to replay before any new input (unaligned checkpoints).
    pub channel: Option<ChannelStateData>,
    /// Disk state (RocksDB checkpoints) whose key groups overlap this subtask's.
    pub disk: Vec<DiskStateData>,
    /// The storage root the restored checkpoint was loaded from (its disk state's files are
    /// there); None: the job's own checkpoint storage.
    pub disk_root: Option<std::path::PathBuf>,
}

impl RestoredState {
    /// Takes an operator list state out (empty if none was restored).
    pub fn take_list(&mut self, name: &str) -> Vec<Vec<u8>> {
        self.operator
            .remove(name)
            .map(|l| l.entries)
            .unwrap_or_default()
    }
}

trait ErasedTable<K>: Send {
    fn name(&self) -> &str;
    fn kind(&self) -> StateKind;
    fn as_any(&self) -> &dyn Any;
    fn as_any_mut(&mut self) -> &mut dyn Any;
    /// The synchronous part of a snapshot at `now` (ms): expired entries of a state with
    /// time-to-live are dropped first, from the live table too. A disk state writes its cache
    /// back instead (its entries are in the disk backend's checkpoint): None.
    fn snapshot(
        &mut self,
        max_parallelism: u32,
        now: i64,
        rocks: Option<&RocksInstance>,
    ) -> TaskResult<Option<DeferredTable>>;
    fn len(&self) -> usize;
    /// Disk state: the object cache bytes this table may use.
    fn set_cache_budget(&mut self, bytes: usize);
}

/// Keeps what has not expired of an entry at `now`; false: the entry goes.
type Prune<S> = Arc<dyn Fn(&mut S, i64) -> bool + Send + Sync>;
/// Whether anything of an entry has expired at `now`.
type Stale<S> = Arc<dyn Fn(&S, i64) -> bool + Send + Sync>;

/// What a state with time-to-live adds to its table: dropping expired entries (cleanup in
/// snapshots), and on disk the time an entry was last accessed (the newest of a map's),
/// stored in front of its value so that RocksDB's compaction drops it once expired.
struct TtlHooks<S> {
    prune: Prune<S>,
    stale: Stale<S>,
    stamp: fn(&S) -> i64,
    ttl_ms: i64,
}

impl<V: StateValue> TtlHooks<Ttl<V>> {
    /// The hooks of a state holding one value per key (value and reducing state).
    fn single(ttl: StateTtlConfig) -> Self {
        TtlHooks {
            prune: Arc::new(move |e: &mut Ttl<V>, now| !ttl.expired(e.stamp(), now)),
            stale: Arc::new(move |e: &Ttl<V>, now| ttl.expired(e.stamp(), now)),
            stamp: Ttl::<V>::stamp,
            ttl_ms: ttl.ttl_ms(),
        }
    }
}

struct Table<K, S> {
    name: String,
    kind: StateKind,
    /// Every entry (heap backend), or the cached ones (disk backend).
    map: CowMap<K, S>,
    /// Heap backend: a snapshot freezes the table instead of copying it (copy-on-write).
    copy_on_write: bool,
    /// A state with time-to-live: what drops its expired entries.
    ttl: Option<TtlHooks<S>>,
    /// Disk backend: the map is a write-back cache of the column family `name`.
    disk: Option<DiskCache<K>>,
}

/// The write-back cache of a disk state: which keys changed since they were last written to
/// the column family (a changed key missing from the map was removed), and how many entries
/// the cache may hold.
struct DiskCache<K> {
    dirty: hashbrown::HashSet<K>,
    capacity: usize,
    /// The object cache bytes this table may use.
    budget: usize,
    /// Reads change entries (time-to-live restarted by reads): every access dirties.
    dirty_on_read: bool,
    /// List state: values appended to lists that are not cached, per key as their count and
    /// postcard bytes; written as RocksDB merges, so an append never reads the stored list.
    appends: hashbrown::HashMap<K, (u64, Vec<u8>)>,
    append_bytes: usize,
    key_buf: Vec<u8>,
    value_buf: Vec<u8>,
}

impl<K: Key, S: StateValue> Table<K, S> {
    /// Disk state: makes sure the entry of `key` is cached, loading it on a miss, and marks
    /// it changed when `write`.
    fn load(
        &mut self,
        key: &K,
        write: bool,
        rocks: Option<&RocksInstance>,
        max_parallelism: u32,
    ) -> TaskResult {
        let Some(disk) = &mut self.disk else {
            return Ok(());
        };
        let missing = !self.map.contains_key(key) && !disk.dirty.contains(key);
        if missing {
            let rocks = rocks.ok_or_else(|| TaskError::msg("the RocksDB instance is not open"))?;
            if self.map.len() >= disk.capacity {
                self.evict(rocks, max_parallelism)?;
            }
            let Some(disk) = &mut self.disk else {
                return Ok(());
            };
            let kg = key_group_of_hash(stable_hash(key), max_parallelism);
            disk_state::encode_key(&mut disk.key_buf, kg, key)?;
            if let Some((count, values)) = disk.appends.remove(key) {
                disk.append_bytes -= values.len();
                rocks.merge(&self.name, &disk.key_buf, &list_bytes(count, &values))?;
            }
            if let Some(bytes) = rocks.get(&self.name, &disk.key_buf)? {
                let stored = match &self.ttl {
                    Some(_) => bytes.get(8..).unwrap_or_default(),
                    None => &bytes[..],
                };
                let value: S = decode_exact(stored).map_err(|e| {
                    TaskError::Unrecoverable(format!(
                        "cannot read state '{}' as {}: {e}",
                        self.name,
                        std::any::type_name::<S>()
                    ))
                })?;
                self.map.put(key, value);
            }
        }
        let Some(disk) = &mut self.disk else {
            return Ok(());
        };
        if (write || disk.dirty_on_read) && !disk.dirty.contains(key) {
            disk.dirty.insert(key.clone());
        }
        Ok(())
    }

    /// Disk state: writes every changed entry to the column family (one batch).
    fn write_back(&mut self, rocks: &RocksInstance, max_parallelism: u32) -> TaskResult {
        let Some(disk) = &mut self.disk else {
            return Ok(());
        };
        if disk.dirty.is_empty() && disk.appends.is_empty() {
            return Ok(());
        }
        let mut batch = rocks.batch(&self.name)?;
        for (key, (n, values)) in disk.appends.drain() {
            let kg = key_group_of_hash(stable_hash(&key), max_parallelism);
            disk_state::encode_key(&mut disk.key_buf, kg, &key)?;
            batch.merge(&disk.key_buf, &list_bytes(n, &values));
        }
        disk.append_bytes = 0;
        let (mut bytes, mut count) = (0usize, 0usize);
        for key in disk.dirty.drain() {
            let kg = key_group_of_hash(stable_hash(&key), max_parallelism);
            disk_state::encode_key(&mut disk.key_buf, kg, &key)?;
            match self.map.get(&key) {
                Some(value) => {
                    disk.value_buf.clear();
                    if let Some(ttl) = &self.ttl {
                        disk.value_buf
                            .extend_from_slice(&(ttl.stamp)(value).to_le_bytes());
                    }
                    disk.value_buf = postcard::to_extend(
                        value,
                        std::mem::take(&mut disk.value_buf),
                    )
                    .map_err(|e| {
                        TaskError::msg(format!("cannot serialize keyed state '{}': {e}", self.name))
                    })?;
                    bytes += disk.key_buf.len() + disk.value_buf.len();
                    count += 1;
                    batch.put(&disk.key_buf, &disk.value_buf);
                }
                None => batch.delete(&disk.key_buf),
            }
        }
        rocks.write(batch)?;
        if let Some(encoded) = bytes.checked_div(count) {
            // Size the cache by what an entry takes: its inline size, the table's overhead,
            // and its encoded size standing in for what it holds on the heap.
            let per_entry = std::mem::size_of::<(K, S)>() + 16 + encoded;
            disk.capacity = (disk.budget / per_entry).max(64);
        }
        Ok(())
    }

    /// Disk state: the cache is full; written back, about half of it is dropped.
    fn evict(&mut self, rocks: &RocksInstance, max_parallelism: u32) -> TaskResult {
        self.write_back(rocks, max_parallelism)?;
        let keep = self.disk.as_ref().map_or(0, |d| d.capacity / 2);
        let mut left = self.map.len();
        self.map.retain_live(|_, _| {
            let stay = left <= keep || fastrand::bool();
            left -= usize::from(!stay);
            stay
        });
        Ok(())
    }
}

impl<K: Key, S: StateValue> Table<K, S> {
    /// Heap state: drops the entries the snapshots found expired, if they still are at
    /// `now()` (cleanup in snapshots, on the task thread, once the shard they are in settled).
    fn drop_expired(&mut self, expired: Vec<K>, now: impl FnOnce() -> i64) {
        let Some(ttl) = &self.ttl else {
            return;
        };
        if expired.is_empty() {
            return;
        }
        let now = now();
        for k in expired {
            let gone = self.map.get_mut(&k).is_some_and(|v| !(ttl.prune)(v, now));
            if gone {
                self.map.remove(&k);
            }
        }
    }
}

/// The asynchronous part of a heap table's snapshot: its frozen view serialized per key group,
/// `(key group, postcard bytes of Vec<(K, S)>)` ascending. A state with time-to-live leaves out
/// what expired by `now` and reports those keys back to the table.
fn serialize_view<K: Key, S: StateValue>(
    view: &Frozen<K, S>,
    name: &str,
    max_parallelism: u32,
    ttl: Option<(Prune<S>, Stale<S>)>,
    now: i64,
) -> TaskResult<Vec<(u32, Vec<u8>)>> {
    let mut groups: BTreeMap<u32, Vec<(&K, std::borrow::Cow<'_, S>)>> = BTreeMap::new();
    let mut expired = Vec::new();
    view.for_each(|k, v| {
        let value = match &ttl {
            Some((prune, stale)) if stale(v, now) => {
                expired.push(k.clone());
                let mut left = v.clone();
                if !prune(&mut left, now) {
                    return;
                }
                std::borrow::Cow::Owned(left)
            }
            _ => std::borrow::Cow::Borrowed(v),
        };
        let kg = key_group_of_hash(stable_hash(k), max_parallelism);
        groups.entry(kg).or_default().push((k, value));
    });
    let mut out = Vec::with_capacity(groups.len());
    for (kg, entries) in groups {
        let bytes = postcard::to_stdvec(&entries)
            .map_err(|e| TaskError::msg(format!("cannot serialize keyed state '{name}': {e}")))?;
        out.push((kg, bytes));
    }
    view.report_expired(expired);
    Ok(out)
}

impl<K: Key, S: StateValue> ErasedTable<K> for Table<K, S> {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> StateKind {
        self.kind
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
    fn snapshot(
        &mut self,
        max_parallelism: u32,
        now: i64,
        rocks: Option<&RocksInstance>,
    ) -> TaskResult<Option<DeferredTable>> {
        let serializer = match &self.ttl {
            Some(_) => SerializerId::postcard_ttl::<S>(),
            None => SerializerId::postcard::<S>(),
        };
        if self.disk.is_some() {
            // Cleanup in snapshots: expired cached entries are dropped (and deleted on disk).
            if let (Some(ttl), Some(disk)) = (&self.ttl, &mut self.disk) {
                self.map.retain_live(|k, v| {
                    let keep = (ttl.prune)(v, now);
                    if !keep {
                        disk.dirty.insert(k.clone());
                    }
                    keep
                });
            }
            let rocks = rocks.ok_or_else(|| TaskError::msg("the RocksDB instance is not open"))?;
            self.write_back(rocks, max_parallelism)?;
            return Ok(None);
        }
        let view = if self.copy_on_write {
            // Synchronous part: the table is frozen, not copied; the task copies what it
            // changes while the asynchronous part reads the frozen view.
            let expired = self.map.settle_small();
            self.drop_expired(expired, || now);
            self.map.freeze()
        } else {
            // Without copy-on-write: expired entries leave the live table, then it is copied.
            if let Some(ttl) = &self.ttl {
                self.map.retain_live(|_, v| (ttl.prune)(v, now));
            }
            self.map.copy()
        };
        let ttl = self
            .ttl
            .as_ref()
            .map(|t| (t.prune.clone(), t.stale.clone()));
        let name = self.name.clone();
        let kind = self.kind;
        Ok(Some(Box::new(move || {
            let groups = serialize_view(&view, &name, max_parallelism, ttl, now)?;
            Ok(KeyedTableData {
                name,
                kind,
                serializer,
                groups,
            })
        })))
    }
    fn len(&self) -> usize {
        self.map.len()
    }
    fn set_cache_budget(&mut self, bytes: usize) {
        if let Some(d) = &mut self.disk {
            d.budget = bytes;
            let per_entry = std::mem::size_of::<(K, S)>() + 48;
            d.capacity = d.capacity.min((bytes / per_entry).max(64));
        }
    }
}

/// The keyed state of one operator subtask (heap state backend) and the key of the record
/// being processed. User functions receive it to read and write their registered states.
pub struct KeyedContext<K> {
    current: Option<K>,
    /// The event time of the record being processed, when the stream has one.
    timestamp: Option<i64>,
    /// The operator's event time (its input watermark).
    watermark: i64,
    /// The operator's timers (system state).
    timers: Timers<K>,
    tables: Vec<Box<dyn ErasedTable<K>>>,
    /// Restored tables not registered (yet): a snapshot carries them over unchanged, shared
    /// with its asynchronous part rather than copied.
    restored: StdHashMap<String, Arc<KeyedTableData>>,
    range: KeyGroupRange,
    max_parallelism: u32,
    subtask: u32,
    parallelism: u32,
    timer_error: Option<TaskError>,
    /// The processing time state time-to-live uses, when set (tests); else the wall clock.
    ttl_clock: Option<i64>,
    /// The disk state backend (RocksDB), when keyed state lives there.
    rocks: Option<RocksInstance>,
    /// Heap backend: snapshots freeze the tables (copy-on-write) rather than copy them.
    copy_on_write: bool,
    /// RocksDB backend: the timers (event time, processing time) in column families; the
    /// heap's `timers` stay empty then.
    disk_timers: Option<Box<[DiskTimerQueue; 2]>>,
}

impl<K: Key> KeyedContext<K> {
    /// A backend for one subtask, holding the restored (not yet registered) tables.
    pub fn new(
        subtask: u32,
        parallelism: u32,
        max_parallelism: u32,
        mut restored: StdHashMap<String, KeyedTableData>,
    ) -> Self {
        let range = KeyGroupRange::for_subtask(max_parallelism, parallelism, subtask);
        let mut timers = Timers::new();
        let mut timer_error = None;
        for (name, domain) in [
            (timers::EVENT_TIMERS, TimeDomain::EventTime),
            (timers::PROCESSING_TIMERS, TimeDomain::ProcessingTime),
        ] {
            if let Some(table) = restored.remove(name) {
                if let Err(e) = timers.queue(domain).restore(table, range) {
                    timer_error = Some(e);
                }
            }
        }
        KeyedContext {
            current: None,
            timestamp: None,
            watermark: i64::MIN,
            timers,
            tables: Vec::new(),
            restored: restored
                .into_iter()
                .map(|(n, t)| (n, Arc::new(t)))
                .collect(),
            range,
            max_parallelism,
            subtask,
            parallelism,
            timer_error,
            ttl_clock: None,
            rocks: None,
            copy_on_write: true,
            disk_timers: None,
        }
    }

    /// A backend for one subtask of operator `uid` whose keyed state lives in RocksDB,
    /// holding the restored tables (backend-independent format) and restoring the restored
    /// RocksDB instances. An instance that cannot be opened fails [`check_restored`](Self::check_restored).
    pub fn on_disk(
        uid: &str,
        subtask: u32,
        parallelism: u32,
        max_parallelism: u32,
        restored: StdHashMap<String, KeyedTableData>,
        disk: Vec<DiskStateData>,
        settings: &RocksDbSettings,
    ) -> Self {
        let mut ctx = Self::new(subtask, parallelism, max_parallelism, restored);
        match RocksInstance::open(settings, uid, subtask, ctx.range, disk) {
            Ok(r) => ctx.rocks = Some(r),
            Err(e) => ctx.timer_error = Some(e),
        }
        if let Err(e) = ctx.open_disk_timers() {
            ctx.timer_error = Some(e);
        }
        ctx
    }

    /// RocksDB backend: opens the timers' column families (restored with the instance) and
    /// moves the timers restored in the backend-independent format into them.
    fn open_disk_timers(&mut self) -> TaskResult {
        let Some(rocks) = &mut self.rocks else {
            return Ok(());
        };
        let mut queues = Vec::with_capacity(2);
        for name in [timers::EVENT_TIMERS, timers::PROCESSING_TIMERS] {
            if let Some(was) = rocks.state(name) {
                check_restorable(name, &was.serializer, was.kind, StateKind::Timers)?;
            }
            rocks.ensure_cf(&StateDescriptor {
                name: name.to_string(),
                kind: StateKind::Timers,
                serializer: SerializerId::postcard::<(K, i64)>(),
            })?;
            queues.push(DiskTimerQueue::open(name, rocks, self.range)?);
        }
        let processing = queues.pop().expect("two queues");
        let event = queues.pop().expect("two queues");
        let mut disk = Box::new([event, processing]);
        for (i, domain) in [TimeDomain::EventTime, TimeDomain::ProcessingTime]
            .into_iter()
            .enumerate()
        {
            for (t, k) in self.timers.queue(domain).drain_all() {
                let kg = key_group_of_hash(stable_hash(&k), self.max_parallelism) as u16;
                disk[i].register(rocks, kg, &k, t)?;
            }
        }
        self.disk_timers = Some(disk);
        Ok(())
    }

    /// Heap backend: whether a snapshot's synchronous part freezes the tables in O(1) and
    /// copies entries only as they change (`true`, the default), or copies every table
    /// (`state.backend.heap.copy-on-write: false`). Applies to the states registered after.
    pub fn with_copy_on_write(mut self, on: bool) -> Self {
        self.copy_on_write = on;
        self
    }

    /// This backend fails [`check_restored`](Self::check_restored) with `error`.
    pub fn failed(mut self, error: TaskError) -> Self {
        self.timer_error = Some(error);
        self
    }

    /// Checkpoint `id` completed (the disk backend may reference its files from now on).
    pub fn notify_complete(&mut self, id: u64) {
        if let Some(r) = &mut self.rocks {
            r.notify_complete(id);
        }
    }

    /// Checkpoint `id` was aborted.
    pub fn notify_aborted(&mut self, id: u64) {
        if let Some(r) = &mut self.rocks {
            r.notify_aborted(id);
        }
    }

    /// Processing time as state time-to-live sees it (ms).
    fn ttl_now(&self) -> i64 {
        self.ttl_clock
            .unwrap_or_else(|| crate::checkpoint::now_ms() as i64)
    }

    /// Sets the processing time state time-to-live sees (tests).
    #[cfg(test)]
    pub(crate) fn set_ttl_clock(&mut self, now_ms: i64) {
        self.ttl_clock = Some(now_ms);
    }

    /// Fails if the restored timers could not be read or the disk backend could not be opened
    /// (checked when the operator opens).
    pub fn check_restored(&mut self) -> TaskResult {
        match self.timer_error.take() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// The event time of the record being processed (None: the stream has no timestamps).
    pub fn timestamp(&self) -> Option<i64> {
        self.timestamp
    }

    /// Sets the event time of the record being processed.
    #[inline]
    pub fn set_timestamp(&mut self, timestamp: Option<i64>) {
        self.timestamp = timestamp;
    }

    /// The operator's current watermark.
    pub fn current_watermark(&self) -> i64 {
        self.watermark
    }

    /// Sets the operator's watermark (the runtime does, before firing timers).
    pub fn set_watermark(&mut self, watermark: i64) {
        self.watermark = self.watermark.max(watermark);
    }

    /// Processing time: the wall clock in ms since the epoch.
    pub fn current_processing_time(&self) -> i64 {
        crate::checkpoint::now_ms() as i64
    }

    /// Registers an event-time timer for the current key at `time`: `on_timer` runs once the
    /// watermark reaches it. Registering the same (key, time) twice fires once.
    pub fn register_event_time_timer(&mut self, time: i64) -> TaskResult {
        self.change_timer(TimeDomain::EventTime, time, true)
    }

    /// Registers (`add`) or deletes the current key's timer at `time` in `domain`.
    fn change_timer(&mut self, domain: TimeDomain, time: i64, add: bool) -> TaskResult {
        let key = self
            .current
            .as_ref()
            .ok_or_else(|| TaskError::msg("timers used outside of a keyed record"))?;
        if let (Some(rocks), Some(disk)) = (&self.rocks, &mut self.disk_timers) {
            let kg = key_group_of_hash(stable_hash(key), self.max_parallelism) as u16;
            let q = &mut disk[domain_index(domain)];
            return if add {
                q.register(rocks, kg, key, time)
            } else {
                q.delete(rocks, kg, key, time)
            };
        }
        let q = self.timers.queue(domain);
        if add {
            q.register(key, time);
        } else {
            q.delete(key, time);
        }
        Ok(())
    }

    /// Registers a processing-time timer for the current key at `time` (ms since the epoch):
    /// `on_timer` runs once the wall clock has passed it, or when a bounded input ends (the
    /// maximum watermark), whichever comes first.
    pub fn register_processing_time_timer(&mut self, time: i64) -> TaskResult {
        self.change_timer(TimeDomain::ProcessingTime, time, true)
    }

    /// Deletes the current key's event-time timer at `time`, if any.
    pub fn delete_event_time_timer(&mut self, time: i64) -> TaskResult {
        self.change_timer(TimeDomain::EventTime, time, false)
    }

    /// Deletes the current key's processing-time timer at `time`, if any.
    pub fn delete_processing_time_timer(&mut self, time: i64) -> TaskResult {
        self.change_timer(TimeDomain::ProcessingTime, time, false)
    }

    /// The earliest processing-time timer.
    pub fn next_processing_timer(&self) -> Option<i64> {
        match &self.disk_timers {
            Some(disk) => disk[1].peek(),
            None => self.timers.processing.peek(),
        }
    }

    /// Whether a processing-time timer is pending.
    pub fn has_processing_timers(&self) -> bool {
        match &self.disk_timers {
            Some(disk) => !disk[1].is_empty(),
            None => !self.timers.processing.is_empty(),
        }
    }

    /// The operator's timers on the heap (the RocksDB backend keeps them on disk; tests).
    #[cfg(test)]
    pub(crate) fn timers(&mut self) -> &mut Timers<K> {
        &mut self.timers
    }

    /// Fires the next timer of `domain` due at `upto`: sets its key as the current one and
    /// returns its time.
    pub fn next_due_timer(&mut self, domain: TimeDomain, upto: i64) -> TaskResult<Option<i64>> {
        let due = match (&self.rocks, &mut self.disk_timers) {
            (Some(rocks), Some(disk)) => disk[domain_index(domain)].pop_due(rocks, upto)?,
            _ => self.timers.queue(domain).pop_due(upto),
        };
        let Some((t, k)) = due else {
            return Ok(None);
        };
        self.current = Some(k);
        self.timestamp = Some(t);
        Ok(Some(t))
    }

    /// Takes every pending processing-time timer, earliest first (end of input fires them
    /// all, and only them).
    pub fn drain_processing_timers(&mut self) -> TaskResult<Vec<(i64, K)>> {
        let (Some(rocks), Some(disk)) = (&self.rocks, &mut self.disk_timers) else {
            return Ok(self.timers.processing.drain_all());
        };
        let mut all = Vec::new();
        while let Some(timer) = disk[1].pop_due(rocks, i64::MAX)? {
            all.push(timer);
        }
        Ok(all)
    }

    /// The key of the record being processed.
    pub fn current_key(&self) -> Option<&K> {
        self.current.as_ref()
    }

    /// Sets the key subsequent state accesses are scoped to.
    pub fn set_current_key(&mut self, key: K) {
        self.current = Some(key);
    }

    /// This subtask's index.
    pub fn subtask(&self) -> u32 {
        self.subtask
    }

    /// The operator's parallelism.
    pub fn parallelism(&self) -> u32 {
        self.parallelism
    }

    /// The key groups this subtask owns.
    pub fn key_group_range(&self) -> KeyGroupRange {
        self.range
    }

    /// Number of keys in all tables (RocksDB backend: the cached ones), for statistics.
    pub fn entries(&self) -> usize {
        self.tables.iter().map(|t| t.len()).sum()
    }

    fn register<S: StateValue>(&mut self, name: &str, kind: StateKind) -> TaskResult<usize> {
        self.register_with::<S>(name, kind, None)
    }

    /// Registers a table; `ttl`: a state with time-to-live, whose expired entries it drops.
    fn register_with<S: StateValue>(
        &mut self,
        name: &str,
        kind: StateKind,
        ttl: Option<TtlHooks<S>>,
    ) -> TaskResult<usize> {
        if let Some(idx) = self.tables.iter().position(|t| t.name() == name) {
            if self.tables[idx].as_any().is::<Table<K, S>>() && self.tables[idx].kind() == kind {
                return Ok(idx);
            }
            return Err(TaskError::msg(format!(
                "state '{name}' is already registered with another kind or type"
            )));
        }
        let mut map: CowMap<K, S> = CowMap::default();
        let serializer = match ttl {
            Some(_) => SerializerId::postcard_ttl::<S>(),
            None => SerializerId::postcard::<S>(),
        };
        if let Some(was) = self.rocks.as_ref().and_then(|r| r.state(name)) {
            check_restorable(name, &was.serializer, was.kind, kind)?;
            check_ttl_unchanged(name, &was.serializer, ttl.is_some())?;
        }
        let mut restored_entries: Vec<(K, S)> = Vec::new();
        if let Some(table) = self.restored.remove(name) {
            let table = Arc::try_unwrap(table).unwrap_or_else(|t| (*t).clone());
            check_restorable(name, &table.serializer, table.kind, kind)?;
            check_ttl_unchanged(name, &table.serializer, ttl.is_some())?;
            let was = table.serializer.type_name;
            for (kg, bytes) in table.groups {
                if !self.range.contains(kg) {
                    continue;
                }
                let entries: Vec<(K, S)> = decode_exact(&bytes).map_err(|e| {
                    TaskError::Unrecoverable(format!(
                        "cannot restore state '{name}' (key group {kg}) as {}: {e}; it was written as {was}",
                        std::any::type_name::<S>()
                    ))
                })?;
                restored_entries.extend(entries);
            }
        }
        let disk = match &mut self.rocks {
            None => {
                for (k, v) in restored_entries {
                    map.put(&k, v);
                }
                None
            }
            Some(rocks) => {
                rocks.ensure_cf(&StateDescriptor {
                    name: name.to_string(),
                    kind,
                    serializer,
                })?;
                rocks.set_ttl(name, ttl.as_ref().map_or(0, |t| t.ttl_ms));
                let stamp = ttl.as_ref().map(|t| t.stamp);
                write_entries(rocks, name, self.max_parallelism, restored_entries, stamp)?;
                Some(DiskCache {
                    dirty: hashbrown::HashSet::new(),
                    capacity: usize::MAX,
                    budget: usize::MAX,
                    dirty_on_read: ttl.is_some(),
                    appends: hashbrown::HashMap::new(),
                    append_bytes: 0,
                    key_buf: Vec::with_capacity(64),
                    value_buf: Vec::with_capacity(64),
                })
            }
        };
        self.tables.push(Box::new(Table {
            name: name.to_string(),
            kind,
            map,
            copy_on_write: self.copy_on_write,
            ttl,
            disk,
        }));
        if let Some(rocks) = &self.rocks {
            let on_disk = self.tables.len().max(1);
            let share = (rocks.settings_object_cache_bytes() / on_disk as u64) as usize;
            for t in &mut self.tables {
                t.set_cache_budget(share);
            }
        }
        Ok(self.tables.len() - 1)
    }

    /// The table `idx` and the current key, with the key's entry cached (disk state) and,
    /// for a `write`, marked changed.
    #[inline]
    fn slot<S: StateValue>(
        &mut self,
        idx: usize,
        write: bool,
    ) -> TaskResult<(&mut CowMap<K, S>, &K)> {
        let (key, table) = keyed_table::<K, S>(&self.current, &mut self.tables, idx)?;
        if table.disk.is_some() {
            table.load(key, write, self.rocks.as_ref(), self.max_parallelism)?;
        } else if table.map.is_frozen() {
            let expired = table.map.settle_for(key);
            let clock = self.ttl_clock;
            table.drop_expired(expired, || {
                clock.unwrap_or_else(|| crate::checkpoint::now_ms() as i64)
            });
        }
        Ok((&mut table.map, key))
    }

    fn table_and_key<S: StateValue>(&mut self, idx: usize) -> TaskResult<(&mut CowMap<K, S>, &K)> {
        self.slot(idx, true)
    }

    fn get<S: StateValue>(&mut self, idx: usize) -> TaskResult<Option<&S>> {
        let (map, key) = self.slot::<S>(idx, false)?;
        Ok(map.get(key))
    }

    /// The current key's entry, for a read that changes it when `write` (time-to-live
    /// restarted by reads): then it is copied out of a frozen snapshot first.
    fn get_for<S: StateValue>(&mut self, idx: usize, write: bool) -> TaskResult<Option<&S>> {
        if !write {
            return self.get(idx);
        }
        let (map, key) = self.slot::<S>(idx, true)?;
        Ok(map.get_mut(key).map(|v| &*v))
    }

    fn put<S: StateValue>(&mut self, idx: usize, value: S) -> TaskResult {
        let (map, key) = self.table_and_key::<S>(idx)?;
        map.put(key, value);
        Ok(())
    }

    /// Appends `value` to the current key's list (a list state without time-to-live). On
    /// disk, a list that is not cached is not read: the value waits to be merged into it.
    fn append<V: StateValue>(&mut self, idx: usize, value: V) -> TaskResult {
        let (key, table) = keyed_table::<K, Vec<V>>(&self.current, &mut self.tables, idx)?;
        if let (Some(disk), Some(rocks)) = (&mut table.disk, &self.rocks) {
            if !table.map.contains_key(key) && !disk.dirty.contains(key) {
                if !disk.appends.contains_key(key) {
                    disk.appends.insert(key.clone(), (0, Vec::new()));
                }
                let (n, values) = disk
                    .appends
                    .get_mut(key)
                    .ok_or_else(|| TaskError::msg("list append vanished"))?;
                let before = values.len();
                *values = postcard::to_extend(&value, std::mem::take(values)).map_err(|e| {
                    TaskError::msg(format!(
                        "cannot serialize keyed state '{}': {e}",
                        table.name
                    ))
                })?;
                *n += 1;
                disk.append_bytes += values.len() - before;
                if disk.append_bytes > disk.budget / 2 {
                    table.write_back(rocks, self.max_parallelism)?;
                }
                return Ok(());
            }
        }
        self.get_or_insert::<Vec<V>>(idx, Vec::new)?.push(value);
        Ok(())
    }

    fn get_or_insert<S: StateValue>(
        &mut self,
        idx: usize,
        default: impl FnOnce() -> S,
    ) -> TaskResult<&mut S> {
        let (map, key) = self.table_and_key::<S>(idx)?;
        Ok(map.get_or_insert_with(key, default))
    }

    fn remove<S: StateValue>(&mut self, idx: usize) -> TaskResult {
        let (map, key) = self.table_and_key::<S>(idx)?;
        map.remove(key);
        Ok(())
    }

    /// Registers (or looks up) a [`ValueState`] named `name`.
    pub fn value_state<V: StateValue>(&mut self, name: &str) -> TaskResult<ValueState<V>> {
        Ok(ValueState {
            idx: self.register::<V>(name, StateKind::Value)?,
            ttl: None,
            _v: PhantomData,
        })
    }

    /// Registers (or looks up) a [`ValueState`] named `name` whose entries expire as `ttl` says.
    pub fn value_state_with_ttl<V: StateValue>(
        &mut self,
        name: &str,
        ttl: StateTtlConfig,
    ) -> TaskResult<ValueState<V>> {
        let hooks = TtlHooks::single(ttl);
        Ok(ValueState {
            idx: self.register_with::<Ttl<V>>(name, StateKind::Value, Some(hooks))?,
            ttl: Some(ttl),
            _v: PhantomData,
        })
    }

    /// Registers (or looks up) a [`MapState`] named `name` whose entries (each on its own)
    /// expire as `ttl` says.
    pub fn map_state_with_ttl<UK: Key, UV: StateValue>(
        &mut self,
        name: &str,
        ttl: StateTtlConfig,
    ) -> TaskResult<MapState<UK, UV>> {
        let hooks = TtlHooks {
            prune: Arc::new(move |m: &mut HashMap<UK, Ttl<UV>>, now| {
                m.retain(|_, e| !ttl.expired(e.stamp(), now));
                !m.is_empty()
            }),
            stale: Arc::new(move |m: &HashMap<UK, Ttl<UV>>, now| {
                m.values().any(|e| ttl.expired(e.stamp(), now))
            }),
            stamp: |m: &HashMap<UK, Ttl<UV>>| m.values().map(Ttl::stamp).max().unwrap_or(0),
            ttl_ms: ttl.ttl_ms(),
        };
        Ok(MapState {
            idx: self.register_with::<HashMap<UK, Ttl<UV>>>(name, StateKind::Map, Some(hooks))?,
            ttl: Some(ttl),
            _v: PhantomData,
        })
    }

    /// Registers (or looks up) a [`ReducingState`] named `name` whose value expires as `ttl`
    /// says (an expired value is folded into as if there were none).
    pub fn reducing_state_with_ttl<V: StateValue>(
        &mut self,
        name: &str,
        ttl: StateTtlConfig,
        reduce: impl Fn(&V, &V) -> V + Send + Sync + 'static,
    ) -> TaskResult<ReducingState<V>> {
        let hooks = TtlHooks::single(ttl);
        Ok(ReducingState {
            idx: self.register_with::<Ttl<V>>(name, StateKind::Reducing, Some(hooks))?,
            reduce: Arc::new(reduce),
            ttl: Some(ttl),
        })
    }

    /// Registers (or looks up) a [`ListState`] named `name`.
    pub fn list_state<V: StateValue>(&mut self, name: &str) -> TaskResult<ListState<V>> {
        Ok(ListState {
            idx: self.register::<Vec<V>>(name, StateKind::List)?,
            ttl: None,
            _v: PhantomData,
        })
    }

    /// Registers (or looks up) a [`ListState`] named `name` whose elements (each on its own)
    /// expire as `ttl` says.
    pub fn list_state_with_ttl<V: StateValue>(
        &mut self,
        name: &str,
        ttl: StateTtlConfig,
    ) -> TaskResult<ListState<V>> {
        let hooks = TtlHooks {
            prune: Arc::new(move |l: &mut TtlList<V>, now| l.prune(&ttl, now)),
            stale: Arc::new(move |l: &TtlList<V>, now| l.any_expired(&ttl, now)),
            stamp: TtlList::<V>::stamp,
            ttl_ms: ttl.ttl_ms(),
        };
        Ok(ListState {
            idx: self.register_with::<TtlList<V>>(name, StateKind::List, Some(hooks))?,
            ttl: Some(ttl),
            _v: PhantomData,
        })
    }

    /// Registers (or looks up) a [`MapState`] named `name`.
    pub fn map_state<UK: Key, UV: StateValue>(
        &mut self,
        name: &str,
    ) -> TaskResult<MapState<UK, UV>> {
        Ok(MapState {
            idx: self.register::<HashMap<UK, UV>>(name, StateKind::Map)?,
            ttl: None,
            _v: PhantomData,
        })
    }

    /// Registers (or looks up) a [`ReducingState`] named `name` that folds added values with `reduce`.
    pub fn reducing_state<V: StateValue>(
        &mut self,
        name: &str,
        reduce: impl Fn(&V, &V) -> V + Send + Sync + 'static,
    ) -> TaskResult<ReducingState<V>> {
        Ok(ReducingState {
            idx: self.register::<V>(name, StateKind::Reducing)?,
            reduce: Arc::new(reduce),
            ttl: None,
        })
    }

    /// Registers (or looks up) an [`AggregatingState`] named `name` that aggregates added
    /// values with `agg` (its accumulator is what is stored).
    pub fn aggregating_state<T, R, A: AggregateFunction<T, R>>(
        &mut self,
        name: &str,
        agg: A,
    ) -> TaskResult<AggregatingState<T, R, A>> {
        Ok(AggregatingState {
            idx: self.register::<A::Acc>(name, StateKind::Aggregating)?,
            agg,
            ttl: None,
            _v: PhantomData,
        })
    }

    /// Registers (or looks up) an [`AggregatingState`] named `name` whose accumulator
    /// expires as `ttl` says (an expired one is aggregated into as if there were none).
    pub fn aggregating_state_with_ttl<T, R, A: AggregateFunction<T, R>>(
        &mut self,
        name: &str,
        agg: A,
        ttl: StateTtlConfig,
    ) -> TaskResult<AggregatingState<T, R, A>> {
        let hooks = TtlHooks::single(ttl);
        Ok(AggregatingState {
            idx: self.register_with::<Ttl<A::Acc>>(name, StateKind::Aggregating, Some(hooks))?,
            agg,
            ttl: Some(ttl),
            _v: PhantomData,
        })
    }

    /// The synchronous part of a checkpoint of every registered table, plus restored tables
    /// that were never registered in this run (they are carried over unchanged, not dropped).
    pub fn snapshot(&mut self, uid: &str) -> TaskResult<OperatorSnapshot> {
        self.snapshot_for(uid, 0, false)
    }

    /// The synchronous part of snapshot `checkpoint_id`; `canonical`: a savepoint, whose keyed
    /// state is written in the backend-independent format whatever the backend.
    pub fn snapshot_for(
        &mut self,
        uid: &str,
        checkpoint_id: u64,
        canonical: bool,
    ) -> TaskResult<OperatorSnapshot> {
        let mut snap = OperatorSnapshot::new(uid);
        let now = self.ttl_now();
        for t in &mut self.tables {
            if let Some(d) = t.snapshot(self.max_parallelism, now, self.rocks.as_ref())? {
                snap.keyed.push(d);
            }
        }
        if let Some(rocks) = &mut self.rocks {
            snap.disk = Some(rocks.checkpoint(checkpoint_id, canonical)?);
        }
        for q in [&mut self.timers.event, &mut self.timers.processing] {
            if let Some(t) = q.snapshot(self.max_parallelism, self.copy_on_write) {
                snap.keyed.push(t);
            }
        }
        for table in self.restored.values() {
            let data = Arc::clone(table);
            snap.keyed.push(Box::new(move || {
                Ok(Arc::try_unwrap(data).unwrap_or_else(|t| (*t).clone()))
            }));
        }
        Ok(snap)
    }
}

/// The key of the record being processed and the registered table `idx` as a `Table<K, S>`.
fn keyed_table<'a, K: Key, S: StateValue>(
    current: &'a Option<K>,
    tables: &'a mut [Box<dyn ErasedTable<K>>],
    idx: usize,
) -> TaskResult<(&'a K, &'a mut Table<K, S>)> {
    let key = current
        .as_ref()
        .ok_or_else(|| TaskError::msg("keyed state accessed outside of a keyed record"))?;
    let table = tables
        .get_mut(idx)
        .and_then(|t| t.as_any_mut().downcast_mut::<Table<K, S>>())
        .ok_or_else(|| TaskError::msg("state handle used with another operator's context"))?;
    Ok((key, table))
}

/// The index of a clock's timers in [`KeyedContext::disk_timers`].
fn domain_index(domain: TimeDomain) -> usize {
    match domain {
        TimeDomain::EventTime => 0,
        TimeDomain::ProcessingTime => 1,
    }
}

/// Restored entries (backend-independent format) of state `name` into its column family;
/// `stamp`: a state with time-to-live, whose stored values start with their access time.
fn write_entries<K: Key, S: StateValue>(
    rocks: &RocksInstance,
    name: &str,
    max_parallelism: u32,
    entries: Vec<(K, S)>,
    stamp: Option<fn(&S) -> i64>,
) -> TaskResult {
    if entries.is_empty() {
        return Ok(());
    }
    let mut batch = rocks.batch(name)?;
    let mut key = Vec::new();
    for (k, v) in entries {
        disk_state::encode_key(
            &mut key,
            key_group_of_hash(stable_hash(&k), max_parallelism),
            &k,
        )?;
        let mut value = stamp
            .map(|f| f(&v).to_le_bytes().to_vec())
            .unwrap_or_default();
        value = postcard::to_extend(&v, value)
            .map_err(|e| TaskError::msg(format!("cannot serialize keyed state '{name}': {e}")))?;
        batch.put(&key, &value);
        if batch.size_in_bytes() > 4 << 20 {
            rocks.write(std::mem::replace(&mut batch, rocks.batch(name)?))?;
        }
    }
    rocks.write(batch)
}

/// A list's stored bytes from its elements' postcard bytes: postcard's `Vec<V>`, the count
/// and then the elements (what RocksDB's list merge operator concatenates).
fn list_bytes(count: u64, values: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() + 10);
    out = postcard::to_extend(&count, out).unwrap_or_default();
    out.extend_from_slice(values);
    out
}

/// A restored state written with time-to-live must be registered with it, and the other way
/// round: the formats differ.
fn check_ttl_unchanged(name: &str, serializer: &SerializerId, ttl_now: bool) -> TaskResult {
    let was_ttl = serializer.id == SERDE_POSTCARD_TTL;
    if was_ttl == ttl_now {
        return Ok(());
    }
    let (was, now) = if was_ttl {
        ("with", "without")
    } else {
        ("without", "with")
    };
    Err(TaskError::Unrecoverable(format!(
        "state '{name}' was written {was} time-to-live and is now registered {now} it; turning time-to-live on or off changes a state's format"
    )))
}

/// Decodes a restored value as `T`, using every byte: bytes left over mean it was written as
/// another type, which must be an error, not garbage.
pub(crate) fn decode_exact<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    let (v, rest) = postcard::take_from_bytes::<T>(bytes).map_err(|e| e.to_string())?;
    if !rest.is_empty() {
        return Err(format!("{} bytes left over", rest.len()));
    }
    Ok(v)
}

/// Whether restored state written as `was` by `serializer` can be registered as `now`: a
/// mismatch is [`TaskError::Unrecoverable`], since restarting from the same state cannot help.
pub(crate) fn check_restorable(
    name: &str,
    serializer: &SerializerId,
    was: StateKind,
    now: StateKind,
) -> TaskResult {
    if was != now {
        return Err(TaskError::Unrecoverable(format!(
            "state '{name}' was written as {was} state and is now registered as {now} state; a state's kind cannot change"
        )));
    }
    serializer
        .check_readable(name)
        .map_err(TaskError::Unrecoverable)
}

/// A single value per key.
pub struct ValueState<V> {
    idx: usize,
    /// Stored as [`Ttl`] values that expire.
    ttl: Option<StateTtlConfig>,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for ValueState<V> {
    fn clone(&self) -> Self {
        ValueState {
            idx: self.idx,
            ttl: self.ttl,
            _v: PhantomData,
        }
    }
}

impl<V: StateValue> ValueState<V> {
    /// The current key's value.
    pub fn value<'a, K: Key>(&self, ctx: &'a mut KeyedContext<K>) -> TaskResult<Option<&'a V>> {
        match &self.ttl {
            None => ctx.get::<V>(self.idx),
            Some(ttl) => {
                let now = ctx.ttl_now();
                Ok(ctx
                    .get_for::<Ttl<V>>(self.idx, ttl.refreshes_on_read())?
                    .and_then(|e| ttl.read(e, now)))
            }
        }
    }
    /// Sets the current key's value.
    pub fn update<K: Key>(&self, ctx: &mut KeyedContext<K>, value: V) -> TaskResult {
        match &self.ttl {
            None => ctx.put(self.idx, value),
            Some(_) => {
                let now = ctx.ttl_now();
                ctx.put(self.idx, Ttl::new(value, now))
            }
        }
    }
    /// The current key's value, inserting `default()` first if there is none (or it
    /// expired). A write: its time-to-live starts again.
    pub fn get_mut<'a, K: Key>(
        &self,
        ctx: &'a mut KeyedContext<K>,
        default: impl FnOnce() -> V,
    ) -> TaskResult<&'a mut V> {
        match &self.ttl {
            None => ctx.get_or_insert(self.idx, default),
            Some(ttl) => ttl_entry(ctx, self.idx, ttl, default),
        }
    }
    /// Removes the current key's value.
    pub fn clear<K: Key>(&self, ctx: &mut KeyedContext<K>) -> TaskResult {
        match &self.ttl {
            None => ctx.remove::<V>(self.idx),
            Some(_) => ctx.remove::<Ttl<V>>(self.idx),
        }
    }
}

/// The current key's entry of a value or reducing state with time-to-live, for a write at
/// `now`: `default()` if there is none or it expired (unless expired ones stay visible).
fn ttl_entry<'a, K: Key, V: StateValue>(
    ctx: &'a mut KeyedContext<K>,
    idx: usize,
    ttl: &StateTtlConfig,
    default: impl FnOnce() -> V,
) -> TaskResult<&'a mut V> {
    let now = ctx.ttl_now();
    let (map, key) = ctx.table_and_key::<Ttl<V>>(idx)?;
    if !map.contains_key(key) {
        return Ok(&mut map
            .get_or_insert_with(key, || Ttl::new(default(), now))
            .value);
    }
    let e = map
        .get_mut(key)
        .ok_or_else(|| TaskError::msg("keyed state entry vanished"))?;
    if ttl.read(e, now).is_none() {
        e.value = default();
    }
    e.touch(now);
    Ok(&mut e.value)
}

/// A list of values per key.
pub struct ListState<V> {
    idx: usize,
    /// Stored as a [`TtlList`], each element expiring on its own.
    ttl: Option<StateTtlConfig>,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for ListState<V> {
    fn clone(&self) -> Self {
        ListState {
            idx: self.idx,
            ttl: self.ttl,
            _v: PhantomData,
        }
    }
}

impl<UK, UV> Clone for MapState<UK, UV> {
    fn clone(&self) -> Self {
        MapState {
            idx: self.idx,
            ttl: self.ttl,
            _v: PhantomData,
        }
    }
}

impl<V> Clone for ReducingState<V> {
    fn clone(&self) -> Self {
        ReducingState {
            idx: self.idx,
            reduce: self.reduce.clone(),
            ttl: self.ttl,
        }
    }
}

impl<V: StateValue> ListState<V> {
    /// The current key's list (empty if none). With time-to-live: the elements not expired
    /// (a read drops the expired ones, as Flink's cleanup on read does).
    pub fn get<'a, K: Key>(&self, ctx: &'a mut KeyedContext<K>) -> TaskResult<&'a [V]> {
        let Some(ttl) = &self.ttl else {
            return Ok(ctx
                .get::<Vec<V>>(self.idx)?
                .map(|v| v.as_slice())
                .unwrap_or(&[]));
        };
        let now = ctx.ttl_now();
        let (map, key) = ctx.table_and_key::<TtlList<V>>(self.idx)?;
        let emptied = match map.get_mut(key) {
            Some(list) => {
                list.read(ttl, now);
                list.values.is_empty()
            }
            None => false,
        };
        if emptied {
            map.remove(key);
        }
        Ok(map.get(key).map(|l| l.values.as_slice()).unwrap_or(&[]))
    }
    /// Appends to the current key's list.
    pub fn add<K: Key>(&self, ctx: &mut KeyedContext<K>, value: V) -> TaskResult {
        if self.ttl.is_some() {
            let now = ctx.ttl_now();
            ctx.get_or_insert::<TtlList<V>>(self.idx, TtlList::default)?
                .push(value, now);
            return Ok(());
        }
        ctx.append(self.idx, value)
    }
    /// Replaces the current key's list; an empty one clears it (as in Flink).
    pub fn update<K: Key>(&self, ctx: &mut KeyedContext<K>, values: Vec<V>) -> TaskResult {
        if values.is_empty() {
            return self.clear(ctx);
        }
        if self.ttl.is_some() {
            let now = ctx.ttl_now();
            return ctx.put(self.idx, TtlList::new(values, now));
        }
        ctx.put(self.idx, values)
    }
    /// Removes the current key's list.
    pub fn clear<K: Key>(&self, ctx: &mut KeyedContext<K>) -> TaskResult {
        match self.ttl {
            None => ctx.remove::<Vec<V>>(self.idx),
            Some(_) => ctx.remove::<TtlList<V>>(self.idx),
        }
    }
}

/// A map per key.
pub struct MapState<UK, UV> {
    idx: usize,
    /// Stored as maps of [`Ttl`] values, each expiring on its own.
    ttl: Option<StateTtlConfig>,
    _v: PhantomData<fn() -> (UK, UV)>,
}

impl<UK: Key, UV: StateValue> MapState<UK, UV> {
    /// The value under `user_key` in the current key's map.
    pub fn get<'a, K: Key>(
        &self,
        ctx: &'a mut KeyedContext<K>,
        user_key: &UK,
    ) -> TaskResult<Option<&'a UV>> {
        match &self.ttl {
            None => Ok(ctx
                .get::<HashMap<UK, UV>>(self.idx)?
                .and_then(|m| m.get(user_key))),
            Some(ttl) => {
                let now = ctx.ttl_now();
                Ok(ctx
                    .get_for::<HashMap<UK, Ttl<UV>>>(self.idx, ttl.refreshes_on_read())?
                    .and_then(|m| m.get(user_key))
                    .and_then(|e| ttl.read(e, now)))
            }
        }
    }
    /// Puts `user_key → value` into the current key's map.
    pub fn put<K: Key>(&self, ctx: &mut KeyedContext<K>, user_key: UK, value: UV) -> TaskResult {
        match &self.ttl {
            None => {
                ctx.get_or_insert::<HashMap<UK, UV>>(self.idx, HashMap::new)?
                    .insert(user_key, value);
            }
            Some(_) => {
                let now = ctx.ttl_now();
                ctx.get_or_insert::<HashMap<UK, Ttl<UV>>>(self.idx, HashMap::new)?
                    .insert(user_key, Ttl::new(value, now));
            }
        }
        Ok(())
    }
    /// Removes `user_key` from the current key's map; the key's map goes with its last entry
    /// (an empty map per key ever seen would grow the state with the keys).
    pub fn remove<K: Key>(&self, ctx: &mut KeyedContext<K>, user_key: &UK) -> TaskResult {
        match &self.ttl {
            None => remove_entry::<K, UK, UV>(ctx, self.idx, user_key),
            Some(_) => remove_entry::<K, UK, Ttl<UV>>(ctx, self.idx, user_key),
        }
    }
    /// Keeps the current key's entries for which `keep` holds, in one pass (the key goes with
    /// its last entry).
    pub fn retain<K: Key>(
        &self,
        ctx: &mut KeyedContext<K>,
        mut keep: impl FnMut(&UK, &UV) -> bool,
    ) -> TaskResult {
        match &self.ttl {
            None => retain_entries::<K, UK, UV>(ctx, self.idx, &mut keep),
            Some(_) => {
                retain_entries::<K, UK, Ttl<UV>>(ctx, self.idx, &mut |k, e| keep(k, &e.value))
            }
        }
    }

    /// All entries of the current key's map (those not expired), in no particular order.
    pub fn entries<'a, K: Key>(
        &self,
        ctx: &'a mut KeyedContext<K>,
    ) -> TaskResult<Vec<(&'a UK, &'a UV)>> {
        match &self.ttl {
            None => Ok(ctx
                .get::<HashMap<UK, UV>>(self.idx)?
                .map(|m| m.iter().collect())
                .unwrap_or_default()),
            Some(ttl) => {
                let now = ctx.ttl_now();
                Ok(ctx
                    .get_for::<HashMap<UK, Ttl<UV>>>(self.idx, ttl.refreshes_on_read())?
                    .map(|m| {
                        m.iter()
                            .filter_map(|(k, e)| ttl.read(e, now).map(|v| (k, v)))
                            .collect()
                    })
                    .unwrap_or_default())
            }
        }
    }
    /// Removes the current key's whole map.
    pub fn clear<K: Key>(&self, ctx: &mut KeyedContext<K>) -> TaskResult {
        match &self.ttl {
            None => ctx.remove::<HashMap<UK, UV>>(self.idx),
            Some(_) => ctx.remove::<HashMap<UK, Ttl<UV>>>(self.idx),
        }
    }
}

/// Removes `user_key` from the current key's map of state `idx`, and the map if it is empty
/// then.
fn remove_entry<K: Key, UK: StateValue + Hash + Eq, V: StateValue>(
    ctx: &mut KeyedContext<K>,
    idx: usize,
    user_key: &UK,
) -> TaskResult {
    let (map, key) = ctx.table_and_key::<HashMap<UK, V>>(idx)?;
    let emptied = map.get_mut(key).is_some_and(|m| {
        m.remove(user_key);
        m.is_empty()
    });
    if emptied {
        map.remove(key);
    }
    Ok(())
}

/// Keeps the entries of the current key's map of state `idx` that `keep` holds for, and
/// removes the map if it is empty then.
fn retain_entries<K: Key, UK: StateValue + Hash + Eq, V: StateValue>(
    ctx: &mut KeyedContext<K>,
    idx: usize,
    keep: &mut dyn FnMut(&UK, &V) -> bool,
) -> TaskResult {
    let (map, key) = ctx.table_and_key::<HashMap<UK, V>>(idx)?;
    let emptied = map.get_mut(key).is_some_and(|m| {
        m.retain(|k, v| keep(k, v));
        m.is_empty()
    });
    if emptied {
        map.remove(key);
    }
    Ok(())
}

type ReduceArc<V> = Arc<dyn Fn(&V, &V) -> V + Send + Sync>;

/// A value per key that added values are folded into.
pub struct ReducingState<V> {
    idx: usize,
    reduce: ReduceArc<V>,
    /// Stored as a [`Ttl`] value that expires.
    ttl: Option<StateTtlConfig>,
}

impl<V: StateValue> ReducingState<V> {
    /// The current key's reduced value.
    pub fn get<'a, K: Key>(&self, ctx: &'a mut KeyedContext<K>) -> TaskResult<Option<&'a V>> {
        match &self.ttl {
            None => ctx.get::<V>(self.idx),
            Some(ttl) => {
                let now = ctx.ttl_now();
                Ok(ctx
                    .get_for::<Ttl<V>>(self.idx, ttl.refreshes_on_read())?
                    .and_then(|e| ttl.read(e, now)))
            }
        }
    }
    /// Folds `value` into the current key's value; returns the new value.
    pub fn add<K: Key>(&self, ctx: &mut KeyedContext<K>, value: V) -> TaskResult<V> {
        if let Some(ttl) = &self.ttl {
            let mut fresh = false;
            let slot = ttl_entry(ctx, self.idx, ttl, || {
                fresh = true;
                value.clone()
            })?;
            if !fresh {
                *slot = (self.reduce)(slot, &value);
            }
            return Ok(slot.clone());
        }
        let (map, key) = ctx.table_and_key::<V>(self.idx)?;
        match map.get_mut(key) {
            Some(slot) => {
                *slot = (self.reduce)(slot, &value);
                Ok(slot.clone())
            }
            None => {
                map.put(key, value.clone());
                Ok(value)
            }
        }
    }
    /// Removes the current key's value.
    pub fn clear<K: Key>(&self, ctx: &mut KeyedContext<K>) -> TaskResult {
        match &self.ttl {
            None => ctx.remove::<V>(self.idx),
            Some(_) => ctx.remove::<Ttl<V>>(self.idx),
        }
    }
}

/// An accumulator per key that added values are aggregated into (Flink's `AggregatingState`).
pub struct AggregatingState<T, R, A> {
    idx: usize,
    agg: A,
    /// Stored as a [`Ttl`] accumulator that expires.
    ttl: Option<StateTtlConfig>,
    _v: PhantomData<fn(T) -> R>,
}

impl<T, R, A: Clone> Clone for AggregatingState<T, R, A> {
    fn clone(&self) -> Self {
        AggregatingState {
            idx: self.idx,
            agg: self.agg.clone(),
            ttl: self.ttl,
            _v: PhantomData,
        }
    }
}

impl<T, R, A: AggregateFunction<T, R>> AggregatingState<T, R, A> {
    /// The result of the current key's accumulator (None: nothing was added).
    pub fn get<K: Key>(&self, ctx: &mut KeyedContext<K>) -> TaskResult<Option<R>> {
        let acc = match &self.ttl {
            None => ctx.get::<A::Acc>(self.idx)?,
            Some(ttl) => {
                let now = ctx.ttl_now();
                ctx.get_for::<Ttl<A::Acc>>(self.idx, ttl.refreshes_on_read())?
                    .and_then(|e| ttl.read(e, now))
            }
        };
        Ok(acc.map(|a| self.agg.result(a)))
    }
    /// Aggregates `value` into the current key's accumulator.
    pub fn add<K: Key>(&self, ctx: &mut KeyedContext<K>, value: T) -> TaskResult {
        let acc = match &self.ttl {
            None => ctx.get_or_insert(self.idx, || self.agg.create())?,
            Some(ttl) => ttl_entry(ctx, self.idx, ttl, || self.agg.create())?,
        };
        self.agg.add(acc, value);
        Ok(())
    }
    /// Removes the current key's accumulator.
    pub fn clear<K: Key>(&self, ctx: &mut KeyedContext<K>) -> TaskResult {
        match &self.ttl {
            None => ctx.remove::<A::Acc>(self.idx),
            Some(_) => ctx.remove::<Ttl<A::Acc>>(self.idx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restored_from(snap: OperatorSnapshot) -> StdHashMap<String, KeyedTableData> {
        let data = snap.finish().unwrap();
        data.keyed
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect()
    }

    #[test]
    #[cfg(not(feature = "rocksdb"))]
    fn the_rocksdb_backend_needs_its_feature() {
        let settings = RocksDbSettings {
            local_dir: std::env::temp_dir(),
            memory_bytes: rocks::DEFAULT_MEMORY_BYTES,
            incremental: true,
            storage: Arc::new(crate::storage::MemoryStorage::new()),
            job_id: "job".into(),
        };
        let mut ctx: KeyedContext<String> = KeyedContext::on_disk(
            "count",
            0,
            1,
            128,
            Default::default(),
            Vec::new(),
            &settings,
        );
        let err = ctx.check_restored().unwrap_err();
        assert!(matches!(err, TaskError::Unrecoverable(_)), "{err:?}");
        assert_eq!(
            err.to_string(),
            "state.backend.type: rocksdb needs cairn built with the 'rocksdb' feature"
        );
    }

    /// A key whose map entries are all removed or not retained, or whose list is updated to
    /// nothing, has no state left (with and without time-to-live): an empty map or list per key
    /// ever seen would grow the state with the keys.
    #[test]
    fn a_map_state_key_goes_with_its_last_entry() {
        let mut ctx: KeyedContext<u64> = KeyedContext::new(0, 1, 128, Default::default());
        let m = ctx.map_state::<u32, i64>("m").unwrap();
        let t = ctx
            .map_state_with_ttl::<u32, i64>(
                "t",
                StateTtlConfig::new(std::time::Duration::from_secs(60)),
            )
            .unwrap();
        for key in 0..1000u64 {
            ctx.set_current_key(key);
            for state in [&m, &t] {
                state.put(&mut ctx, 1, 1).unwrap();
                state.put(&mut ctx, 2, 2).unwrap();
            }
        }
        assert_eq!(ctx.entries(), 2000);
        for key in 0..1000u64 {
            ctx.set_current_key(key);
            for state in [&m, &t] {
                state.remove(&mut ctx, &1).unwrap();
                if key % 2 == 0 {
                    state.remove(&mut ctx, &2).unwrap();
                }
            }
        }
        assert_eq!(
            ctx.entries(),
            1000,
            "the odd keys keep one entry in each map"
        );
        ctx.set_current_key(1);
        assert_eq!(m.entries(&mut ctx).unwrap(), vec![(&2, &2)]);
        // Retaining: what `keep` holds for stays, and a key left without entries goes.
        for key in (1..1000u64).step_by(2) {
            ctx.set_current_key(key);
            m.put(&mut ctx, 3, 3).unwrap();
            m.retain(&mut ctx, |k, _| key % 4 == 1 && *k == 3).unwrap();
            t.retain(&mut ctx, |_, v| *v == 2).unwrap();
        }
        assert_eq!(
            ctx.entries(),
            750,
            "m keeps one entry of every other odd key, t all"
        );
        // A list updated to nothing is no state either.
        let l = ctx.list_state::<u32>("l").unwrap();
        ctx.set_current_key(7);
        l.update(&mut ctx, vec![1, 2]).unwrap();
        assert_eq!(ctx.entries(), 751);
        l.update(&mut ctx, Vec::new()).unwrap();
        assert_eq!(ctx.entries(), 750);
        assert!(l.get(&mut ctx).unwrap().is_empty());
        ctx.set_current_key(1);
        assert_eq!(m.entries(&mut ctx).unwrap(), vec![(&3, &3)]);
        assert_eq!(t.entries(&mut ctx).unwrap(), vec![(&2, &2)]);
    }

    #[test]
    fn all_state_kinds_round_trip_through_a_snapshot() {
        let mut ctx: KeyedContext<String> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<u64>("v").unwrap();
        let l = ctx.list_state::<String>("l").unwrap();
        let m = ctx.map_state::<u32, i64>("m").unwrap();
        let r = ctx.reducing_state::<u64>("r", |a, b| a + b).unwrap();
        for i in 0..100u64 {
            ctx.set_current_key(format!("k{}", i % 10));
            v.update(&mut ctx, i).unwrap();
            l.add(&mut ctx, format!("x{i}")).unwrap();
            m.put(&mut ctx, (i % 3) as u32, i as i64).unwrap();
            r.add(&mut ctx, i).unwrap();
        }
        let snap = ctx.snapshot("op").unwrap();
        // Mutations after the synchronous part must not leak into the snapshot.
        ctx.set_current_key("k0".into());
        v.update(&mut ctx, 999).unwrap();

        let mut back: KeyedContext<String> = KeyedContext::new(0, 1, 128, restored_from(snap));
        let v2 = back.value_state::<u64>("v").unwrap();
        let l2 = back.list_state::<String>("l").unwrap();
        let m2 = back.map_state::<u32, i64>("m").unwrap();
        let r2 = back.reducing_state::<u64>("r", |a, b| a + b).unwrap();
        back.set_current_key("k0".into());
        assert_eq!(v2.value(&mut back).unwrap(), Some(&90));
        assert_eq!(l2.get(&mut back).unwrap().len(), 10);
        assert_eq!(m2.get(&mut back, &0).unwrap(), Some(&90));
        assert_eq!(
            r2.get(&mut back).unwrap(),
            Some(&(0..100).step_by(10).sum::<u64>())
        );
        assert_eq!(back.entries(), 40);
    }

    #[test]
    fn rescaling_keeps_each_key_in_exactly_one_subtask() {
        let mut ctx: KeyedContext<u64> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<u64>("v").unwrap();
        for k in 0..1000u64 {
            ctx.set_current_key(k);
            v.update(&mut ctx, k * 2).unwrap();
        }
        let restored = restored_from(ctx.snapshot("op").unwrap());
        let mut total = 0;
        for i in 0..3 {
            let mut part: KeyedContext<u64> = KeyedContext::new(i, 3, 128, restored.clone());
            let v = part.value_state::<u64>("v").unwrap();
            for k in 0..1000u64 {
                part.set_current_key(k);
                if let Some(x) = v.value(&mut part).unwrap() {
                    assert_eq!(*x, k * 2);
                    total += 1;
                }
            }
        }
        assert_eq!(total, 1000);
    }

    #[test]
    fn a_type_change_is_an_error_not_garbage() {
        let mut ctx: KeyedContext<u64> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<String>("v").unwrap();
        ctx.set_current_key(1);
        v.update(&mut ctx, "a fairly long string value".into())
            .unwrap();
        let err = ctx.value_state::<u64>("v").err().unwrap().to_string();
        assert!(err.contains("'v' is already registered"), "{err}");
        let mut back: KeyedContext<u64> =
            KeyedContext::new(0, 1, 128, restored_from(ctx.snapshot("op").unwrap()));
        let err = back.map_state::<u64, u64>("v").err().unwrap();
        assert!(matches!(err, TaskError::Unrecoverable(_)), "{err}");
        assert!(
            err.to_string()
                .contains("'v' was written as value state and is now registered as map state"),
            "{err}"
        );
        let mut back: KeyedContext<u64> =
            KeyedContext::new(0, 1, 128, restored_from(ctx.snapshot("op").unwrap()));
        let err = back.value_state::<u64>("v").err().unwrap();
        assert!(matches!(err, TaskError::Unrecoverable(_)), "{err}");
        assert!(err.to_string().contains("alloc::string::String"), "{err}");
        assert_eq!(back.entries(), 0);
    }

    #[test]
    fn a_changed_kind_with_the_same_type_is_refused() {
        // A value and a reducing state of u64 have the same bytes: only the kind tells them apart.
        let mut ctx: KeyedContext<u64> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<u64>("n").unwrap();
        ctx.set_current_key(1);
        v.update(&mut ctx, 5).unwrap();
        let mut back: KeyedContext<u64> =
            KeyedContext::new(0, 1, 128, restored_from(ctx.snapshot("op").unwrap()));
        let err = back.reducing_state::<u64>("n", |a, b| a + b).err().unwrap();
        assert!(
            err.to_string()
                .contains("'n' was written as value state and is now registered as reducing state"),
            "{err}"
        );
    }

    #[test]
    fn state_of_an_unknown_serializer_or_a_newer_version_is_refused() {
        let mut ctx: KeyedContext<u64> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<u64>("n").unwrap();
        ctx.set_current_key(1);
        v.update(&mut ctx, 5).unwrap();
        let tables = restored_from(ctx.snapshot("op").unwrap());
        assert_eq!(tables["n"].serializer.id, SERDE_POSTCARD);
        assert_eq!(tables["n"].serializer.version, SERDE_POSTCARD_VERSION);
        assert_eq!(tables["n"].serializer.type_name, "u64");
        let mut newer = tables.clone();
        newer.get_mut("n").unwrap().serializer.version = SERDE_POSTCARD_VERSION + 1;
        let mut back: KeyedContext<u64> = KeyedContext::new(0, 1, 128, newer);
        let err = back.value_state::<u64>("n").err().unwrap().to_string();
        assert!(
            err.contains("version 2; this build reads versions up to 1"),
            "{err}"
        );
        let mut other = tables;
        other.get_mut("n").unwrap().serializer.id = "avro".into();
        let mut back: KeyedContext<u64> = KeyedContext::new(0, 1, 128, other);
        let err = back.value_state::<u64>("n").err().unwrap().to_string();
        assert!(err.contains("serializer 'avro'"), "{err}");
    }

    #[test]
    fn a_restored_value_with_bytes_left_over_is_an_error() {
        // 300 is the varint [0xAC, 0x02]; read as a u8 it would be 172 with a byte to spare.
        let mut ctx: KeyedContext<u64> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<u64>("v").unwrap();
        ctx.set_current_key(1);
        v.update(&mut ctx, 300).unwrap();
        let mut back: KeyedContext<u64> =
            KeyedContext::new(0, 1, 128, restored_from(ctx.snapshot("op").unwrap()));
        let err = back.value_state::<u8>("v").err().unwrap().to_string();
        assert!(err.contains("cannot restore state 'v'"), "{err}");
    }

    #[test]
    fn unregistered_restored_state_is_carried_over() {
        let mut ctx: KeyedContext<u64> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<u64>("old").unwrap();
        ctx.set_current_key(5);
        v.update(&mut ctx, 7).unwrap();
        let mut back: KeyedContext<u64> =
            KeyedContext::new(0, 1, 128, restored_from(ctx.snapshot("op").unwrap()));
        let mut again: KeyedContext<u64> =
            KeyedContext::new(0, 1, 128, restored_from(back.snapshot("op").unwrap()));
        let v = again.value_state::<u64>("old").unwrap();
        again.set_current_key(5);
        assert_eq!(v.value(&mut again).unwrap(), Some(&7));
    }

    /// The whole state of a context as a model: value, list, map and reducing state and the
    /// event-time timers, per key.
    type Model = BTreeMap<
        u32,
        (
            Option<u64>,
            Vec<u64>,
            BTreeMap<u8, u64>,
            Option<u64>,
            Vec<i64>,
        ),
    >;

    /// What a finished snapshot holds, read back through a restored context.
    fn read_back(data: StdHashMap<String, KeyedTableData>, keys: u32) -> Model {
        let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, data);
        let (v, l, m, r) = handles(&mut ctx);
        let mut timers: BTreeMap<u32, Vec<i64>> = BTreeMap::new();
        while let Some((t, k)) = ctx.timers().event.pop_due(i64::MAX) {
            timers.entry(k).or_default().push(t);
        }
        let mut out = Model::new();
        for k in 0..keys {
            ctx.set_current_key(k);
            let mut ts = timers.remove(&k).unwrap_or_default();
            ts.sort_unstable();
            let e = (
                v.value(&mut ctx).unwrap().copied(),
                l.get(&mut ctx).unwrap().to_vec(),
                m.entries(&mut ctx)
                    .unwrap()
                    .into_iter()
                    .map(|(a, b)| (*a, *b))
                    .collect(),
                r.get(&mut ctx).unwrap().copied(),
                ts,
            );
            if e != Default::default() {
                out.insert(k, e);
            }
        }
        out
    }

    type Handles = (
        ValueState<u64>,
        ListState<u64>,
        MapState<u8, u64>,
        ReducingState<u64>,
    );

    fn handles(ctx: &mut KeyedContext<u32>) -> Handles {
        (
            ctx.value_state("v").unwrap(),
            ctx.list_state("l").unwrap(),
            ctx.map_state("m").unwrap(),
            ctx.reducing_state("r", |a, b| a + b).unwrap(),
        )
    }

    /// Random writes interleaved with snapshots that overlap (up to four in flight), finished
    /// in random order or dropped: every finished snapshot holds exactly the state at its
    /// synchronous part, and the live state is never disturbed by one.
    #[test]
    fn copy_on_write_snapshots_hold_the_state_at_their_synchronous_part() {
        const KEYS: u32 = 40;
        for seed in 0..60u64 {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
            let (v, l, m, r) = handles(&mut ctx);
            let mut model = Model::new();
            let mut pending: Vec<(OperatorSnapshot, Model)> = Vec::new();
            for step in 0..400u64 {
                let k = rng.u32(0..KEYS);
                ctx.set_current_key(k);
                let e = model.entry(k).or_default();
                match rng.u8(0..12) {
                    0 => {
                        v.update(&mut ctx, step).unwrap();
                        e.0 = Some(step);
                    }
                    1 => {
                        *v.get_mut(&mut ctx, || 0).unwrap() += 1;
                        e.0 = Some(e.0.unwrap_or(0) + 1);
                    }
                    2 => {
                        v.clear(&mut ctx).unwrap();
                        e.0 = None;
                    }
                    3 => {
                        l.add(&mut ctx, step).unwrap();
                        e.1.push(step);
                    }
                    4 => {
                        l.clear(&mut ctx).unwrap();
                        e.1.clear();
                    }
                    5 => {
                        let uk = rng.u8(0..4);
                        m.put(&mut ctx, uk, step).unwrap();
                        e.2.insert(uk, step);
                    }
                    6 => {
                        let uk = rng.u8(0..4);
                        m.remove(&mut ctx, &uk).unwrap();
                        e.2.remove(&uk);
                    }
                    7 => {
                        r.add(&mut ctx, step).unwrap();
                        e.3 = Some(e.3.unwrap_or(0) + step);
                    }
                    8 => {
                        let t = rng.i64(0..20);
                        ctx.register_event_time_timer(t).unwrap();
                        if !e.4.contains(&t) {
                            e.4.push(t);
                            e.4.sort_unstable();
                        }
                    }
                    9 => {
                        let t = rng.i64(0..20);
                        ctx.delete_event_time_timer(t).unwrap();
                        e.4.retain(|x| *x != t);
                    }
                    10 if pending.len() < 4 => {
                        let snap = ctx.snapshot("op").unwrap();
                        model.retain(|_, e| *e != Default::default());
                        pending.push((snap, model.clone()));
                    }
                    _ if !pending.is_empty() => {
                        let (snap, expect) = pending.swap_remove(rng.usize(0..pending.len()));
                        if rng.bool() {
                            let got = read_back(restored_from(snap), KEYS);
                            assert_eq!(got, expect, "seed {seed}, step {step}");
                        }
                    }
                    _ => {}
                }
                model.retain(|_, e| *e != Default::default());
            }
            for (snap, expect) in pending {
                assert_eq!(read_back(restored_from(snap), KEYS), expect, "seed {seed}");
            }
            let live = read_back(restored_from(ctx.snapshot("op").unwrap()), KEYS);
            assert_eq!(live, model, "seed {seed}: the live state");
        }
    }

    /// The synchronous part moves the table instead of copying it, and only what changes
    /// while the snapshot is in flight is copied; once it is done, the table is whole again.
    #[test]
    fn a_snapshot_freezes_the_table_and_copies_only_what_changes() {
        let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state::<u64>("v").unwrap();
        for k in 0..10_000 {
            ctx.set_current_key(k);
            v.update(&mut ctx, 1).unwrap();
        }
        let snap = ctx.snapshot("op").unwrap();
        let table = ctx.tables[0]
            .as_any()
            .downcast_ref::<Table<u32, u64>>()
            .unwrap();
        assert!(table.map.is_frozen());
        assert!(table.map.live_len() == 0, "nothing was copied");
        for k in 0..10 {
            ctx.set_current_key(k);
            *v.get_mut(&mut ctx, || 0).unwrap() += 1;
        }
        ctx.set_current_key(20);
        assert_eq!(
            v.value(&mut ctx).unwrap(),
            Some(&1),
            "read from the frozen table"
        );
        let table = ctx.tables[0]
            .as_any()
            .downcast_ref::<Table<u32, u64>>()
            .unwrap();
        assert_eq!(
            table.map.live_len(),
            10,
            "only the changed entries were copied"
        );
        assert_eq!(ctx.entries(), 10_000);
        let data = restored_from(snap);
        // Each shard settles at an access to one of its keys: all of them, here.
        for k in 0..10_000 {
            ctx.set_current_key(k);
            assert!(v.value(&mut ctx).unwrap().is_some());
        }
        ctx.set_current_key(20);
        assert_eq!(v.value(&mut ctx).unwrap(), Some(&1));
        let table = ctx.tables[0]
            .as_any()
            .downcast_ref::<Table<u32, u64>>()
            .unwrap();
        assert!(!table.map.is_frozen(), "settled once the snapshot was done");
        assert_eq!(table.map.live_len(), 10_000);
        let mut back: KeyedContext<u32> = KeyedContext::new(0, 1, 128, data);
        let v2 = back.value_state::<u64>("v").unwrap();
        back.set_current_key(0);
        assert_eq!(
            v2.value(&mut back).unwrap(),
            Some(&1),
            "the snapshot's value"
        );
        ctx.set_current_key(0);
        assert_eq!(v.value(&mut ctx).unwrap(), Some(&2), "the live value");
    }

    /// Without copy-on-write the synchronous part copies the table and leaves it live.
    #[test]
    fn without_copy_on_write_a_snapshot_copies_the_table() {
        let mut ctx: KeyedContext<u32> =
            KeyedContext::new(0, 1, 128, Default::default()).with_copy_on_write(false);
        let v = ctx.value_state::<u64>("v").unwrap();
        ctx.set_current_key(1);
        v.update(&mut ctx, 1).unwrap();
        let snap = ctx.snapshot("op").unwrap();
        v.update(&mut ctx, 2).unwrap();
        let table = ctx.tables[0]
            .as_any()
            .downcast_ref::<Table<u32, u64>>()
            .unwrap();
        assert!(!table.map.is_frozen());
        let mut back: KeyedContext<u32> = KeyedContext::new(0, 1, 128, restored_from(snap));
        let v2 = back.value_state::<u64>("v").unwrap();
        back.set_current_key(1);
        assert_eq!(v2.value(&mut back).unwrap(), Some(&1));
    }

    fn ttl(ms: u64) -> StateTtlConfig {
        StateTtlConfig::new(std::time::Duration::from_millis(ms))
    }

    /// A context at `now` restored from `snap`.
    fn restored_at(snap: OperatorSnapshot, now: i64) -> KeyedContext<u32> {
        let mut ctx = KeyedContext::new(0, 1, 128, restored_from(snap));
        ctx.set_ttl_clock(now);
        ctx
    }

    #[test]
    fn a_value_with_ttl_expires_after_its_last_write_and_leaves_the_snapshot_and_the_table() {
        let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
        let v = ctx.value_state_with_ttl::<u64>("v", ttl(100)).unwrap();
        ctx.set_ttl_clock(0);
        for k in 0..10 {
            ctx.set_current_key(k);
            v.update(&mut ctx, u64::from(k)).unwrap();
        }
        ctx.set_ttl_clock(50);
        ctx.set_current_key(3);
        v.update(&mut ctx, 33).unwrap(); // written again: lives until 150
        ctx.set_ttl_clock(99);
        ctx.set_current_key(1);
        assert_eq!(v.value(&mut ctx).unwrap(), Some(&1));
        ctx.set_ttl_clock(100);
        assert_eq!(v.value(&mut ctx).unwrap(), None, "expired at 100");
        // A read does not restart it (OnCreateAndWrite), so it stays expired.
        ctx.set_current_key(3);
        assert_eq!(v.value(&mut ctx).unwrap(), Some(&33));

        let snap = ctx.snapshot("op").unwrap();
        assert_eq!(ctx.tables[0].len(), 10, "frozen, not yet cleaned up");
        let data = restored_from(snap);
        // An access settles its key's shard: the entries the snapshot found expired go.
        for k in 0..10 {
            ctx.set_current_key(k);
            assert_eq!(v.value(&mut ctx).unwrap().is_some(), k == 3, "{k}");
        }
        assert_eq!(
            ctx.tables[0].len(),
            1,
            "the snapshot dropped the expired entries"
        );
        let mut again: KeyedContext<u32> = KeyedContext::new(0, 1, 128, data);
        again.set_ttl_clock(120);
        let v = again.value_state_with_ttl::<u64>("v", ttl(100)).unwrap();
        again.set_current_key(1);
        assert_eq!(v.value(&mut again).unwrap(), None, "not persisted");
        again.set_current_key(3);
        assert_eq!(
            v.value(&mut again).unwrap(),
            Some(&33),
            "its write time persisted"
        );
        again.set_ttl_clock(150);
        assert_eq!(v.value(&mut again).unwrap(), None);
        // A write to an expired entry starts from the default.
        assert_eq!(*v.get_mut(&mut again, || 7).unwrap(), 7);
        again.set_ttl_clock(249);
        assert_eq!(v.value(&mut again).unwrap(), Some(&7), "get_mut is a write");
    }

    #[test]
    fn reads_restart_the_ttl_on_read_and_write_and_expired_values_show_until_cleaned_up() {
        let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
        let read = ctx
            .value_state_with_ttl::<u64>("read", ttl(100).update(TtlUpdate::OnReadAndWrite))
            .unwrap();
        let shown = ctx
            .value_state_with_ttl::<u64>(
                "shown",
                ttl(100).visibility(TtlVisibility::ReturnExpiredIfNotCleanedUp),
            )
            .unwrap();
        ctx.set_current_key(1);
        ctx.set_ttl_clock(0);
        read.update(&mut ctx, 1).unwrap();
        shown.update(&mut ctx, 2).unwrap();
        for now in [90, 180, 270] {
            ctx.set_ttl_clock(now);
            assert_eq!(read.value(&mut ctx).unwrap(), Some(&1), "read at {now}");
        }
        assert_eq!(
            shown.value(&mut ctx).unwrap(),
            Some(&2),
            "expired, not cleaned up"
        );
        let _ = ctx.snapshot("op").unwrap().finish().unwrap();
        assert_eq!(
            shown.value(&mut ctx).unwrap(),
            None,
            "cleaned up by the snapshot"
        );
        assert_eq!(read.value(&mut ctx).unwrap(), Some(&1));
    }

    #[test]
    fn map_entries_with_ttl_expire_each_on_its_own() {
        let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
        let m = ctx
            .map_state_with_ttl::<u32, String>("m", ttl(100))
            .unwrap();
        ctx.set_current_key(7);
        ctx.set_ttl_clock(0);
        m.put(&mut ctx, 1, "a".into()).unwrap();
        ctx.set_ttl_clock(60);
        m.put(&mut ctx, 2, "b".into()).unwrap();
        ctx.set_ttl_clock(100);
        assert_eq!(m.get(&mut ctx, &1).unwrap(), None);
        assert_eq!(m.get(&mut ctx, &2).unwrap().map(String::as_str), Some("b"));
        let entries: Vec<(u32, String)> = m
            .entries(&mut ctx)
            .unwrap()
            .into_iter()
            .map(|(k, v)| (*k, v.clone()))
            .collect();
        assert_eq!(entries, vec![(2, "b".to_string())]);
        let mut again = restored_at(ctx.snapshot("op").unwrap(), 100);
        let m = again
            .map_state_with_ttl::<u32, String>("m", ttl(100))
            .unwrap();
        again.set_current_key(7);
        assert_eq!(m.entries(&mut again).unwrap().len(), 1);
        again.set_ttl_clock(160);
        assert!(m.entries(&mut again).unwrap().is_empty());
        let _ = again.snapshot("op").unwrap().finish().unwrap();
        assert!(m.entries(&mut again).unwrap().is_empty());
        assert_eq!(again.tables[0].len(), 0, "an emptied map leaves the table");
    }

    #[test]
    fn a_reducing_state_with_ttl_starts_over_once_expired() {
        let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
        let r = ctx
            .reducing_state_with_ttl::<u64>("r", ttl(100), |a, b| a + b)
            .unwrap();
        ctx.set_current_key(1);
        ctx.set_ttl_clock(0);
        assert_eq!(r.add(&mut ctx, 1).unwrap(), 1);
        ctx.set_ttl_clock(50);
        assert_eq!(r.add(&mut ctx, 2).unwrap(), 3);
        ctx.set_ttl_clock(149);
        assert_eq!(r.get(&mut ctx).unwrap(), Some(&3));
        ctx.set_ttl_clock(150);
        assert_eq!(r.get(&mut ctx).unwrap(), None);
        assert_eq!(r.add(&mut ctx, 5).unwrap(), 5);
    }

    #[test]
    fn turning_ttl_on_or_off_for_a_restored_state_is_refused() {
        let mut plain: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
        let v = plain.value_state::<u64>("v").unwrap();
        plain.set_current_key(1);
        v.update(&mut plain, 1).unwrap();
        let mut again = restored_at(plain.snapshot("op").unwrap(), 0);
        let Err(TaskError::Unrecoverable(e)) = again.value_state_with_ttl::<u64>("v", ttl(10))
        else {
            panic!("a state written without ttl was read with it");
        };
        assert!(e.contains("written without time-to-live"), "{e}");

        let mut with: KeyedContext<u32> = KeyedContext::new(0, 1, 128, Default::default());
        with.set_ttl_clock(0);
        let v = with.value_state_with_ttl::<u64>("v", ttl(10)).unwrap();
        with.set_current_key(1);
        v.update(&mut with, 1).unwrap();
        let data = restored_from(with.snapshot("op").unwrap());
        assert_eq!(data["v"].serializer.id, SERDE_POSTCARD_TTL);
        let mut again = KeyedContext::<u32>::new(0, 1, 128, data);
        let Err(TaskError::Unrecoverable(e)) = again.value_state::<u64>("v") else {
            panic!("a state written with ttl was read without it");
        };
        assert!(e.contains("written with time-to-live"), "{e}");
    }
}
