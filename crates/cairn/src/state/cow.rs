//! Copy-on-write tables: the heap backend's snapshots without copying the state.
//!
//! A [`CowMap`] is a hash map whose snapshot ([`CowMap::freeze`]) takes O(1) in the number of
//! entries on the task thread: the live entries are moved, not copied, into an immutable
//! [`Layer`] that the snapshot's asynchronous part reads while the task goes on. Until the
//! asynchronous part lets go of it, writes land in a fresh live map: an entry is copied out of
//! the frozen layer the first time it is written (copy on write, so the work is O(changed
//! entries)), a removal leaves a tombstone. Once every snapshot is done with the frozen layers,
//! settling folds the changes back into the oldest layer, which becomes the live map again.
//!
//! The map is split into [`SHARDS`] shards by hash, each frozen and settled on its own: a
//! shard settles when one of its keys is accessed ([`CowMap::settle_for`]) or at the next
//! freeze, so folding back costs one shard's changes at a time, never all of them at once.
//!
//! A snapshot taken while an older one still reads its layers freezes the changes since as a
//! layer of their own: a view is the oldest layer with the newer ones applied in order (their
//! removals, then their entries). Within a layer and in the live map, a key is either an entry
//! or a tombstone, never both.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash};
use std::sync::{Arc, Mutex};

use hashbrown::hash_map::RawEntryMut;
use hashbrown::{DefaultHashBuilder, HashMap, HashSet};

/// An immutable part of a frozen view: what changed since the layer before it (all entries,
/// for the oldest one).
pub(crate) struct Layer<K, S> {
    entries: HashMap<K, S>,
    removed: HashSet<K>,
    /// Keys a snapshot found expired (time-to-live), for the task thread to clean up when it
    /// settles.
    expired: Mutex<Vec<K>>,
}

/// A frozen, consistent view of a [`CowMap`] at one snapshot, readable from any thread.
struct FrozenShard<K, S> {
    layers: Vec<Arc<Layer<K, S>>>,
}

/// Another handle on the same frozen view (it keeps the layers frozen while it lives).
impl<K, S> Clone for FrozenShard<K, S> {
    fn clone(&self) -> Self {
        FrozenShard {
            layers: self.layers.clone(),
        }
    }
}

impl<K, S> std::fmt::Debug for FrozenShard<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Frozen({} layers)", self.layers.len())
    }
}

impl<K: Hash + Eq, S> FrozenShard<K, S> {
    /// Every entry of the view, each once (newest layer wins), in no particular order.
    pub(crate) fn for_each<'a>(&'a self, mut f: impl FnMut(&'a K, &'a S)) {
        for (i, layer) in self.layers.iter().enumerate() {
            let newer = &self.layers[i + 1..];
            for (k, v) in &layer.entries {
                let shadowed = newer
                    .iter()
                    .any(|l| l.entries.contains_key(k) || l.removed.contains(k));
                if !shadowed {
                    f(k, v);
                }
            }
        }
    }

    /// Number of entries in the view.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        let mut n = 0;
        self.for_each(|_, _| n += 1);
        n
    }

    /// Reports keys found expired in this view; the live map drops them when it settles (if
    /// they are still expired then).
    pub(crate) fn report_expired(&self, keys: Vec<K>) {
        if keys.is_empty() {
            return;
        }
        if let Some(newest) = self.layers.last() {
            if let Ok(mut e) = newest.expired.lock() {
                e.extend(keys);
            }
        }
    }
}

/// One shard of a [`CowMap`].
struct Shard<K, S> {
    /// The entries written since the newest freeze; every entry when nothing is frozen.
    live: HashMap<K, S>,
    /// Keys removed since the newest freeze (empty when nothing is frozen).
    removed: HashSet<K>,
    /// Frozen layers, oldest first.
    frozen: Vec<Arc<Layer<K, S>>>,
    /// While frozen: the number of entries in the view.
    frozen_len: usize,
}

impl<K, S> Shard<K, S> {
    /// An empty shard whose live maps hash with `hasher` (the [`CowMap`]'s, so that the hash
    /// it computes once per access serves the shard's table too).
    fn new(hasher: DefaultHashBuilder) -> Self {
        Shard {
            live: HashMap::with_hasher(hasher),
            removed: HashSet::default(),
            frozen: Vec::new(),
            frozen_len: 0,
        }
    }
}

impl<K: Hash + Eq + Clone, S: Clone> Shard<K, S> {
    /// Whether a snapshot may still read frozen layers (the slow path is on).
    #[inline]
    pub(crate) fn is_frozen(&self) -> bool {
        !self.frozen.is_empty()
    }

    /// The entry of `key` in the frozen layers, newest first, unless removed since.
    fn frozen_get(&self, key: &K) -> Option<&S> {
        if self.removed.contains(key) {
            return None;
        }
        for layer in self.frozen.iter().rev() {
            if let Some(v) = layer.entries.get(key) {
                return Some(v);
            }
            if layer.removed.contains(key) {
                return None;
            }
        }
        None
    }

    /// The entry of `key` (`hash`: its hash).
    #[inline]
    fn get(&self, hash: u64, key: &K) -> Option<&S> {
        match self.live.raw_entry().from_key_hashed_nocheck(hash, key) {
            Some((_, v)) => Some(v),
            None if self.frozen.is_empty() => None,
            None => self.frozen_get(key),
        }
    }

    /// Copies the entry of `key` out of the frozen layers into the live map (copy on write),
    /// so that the live map holds it if the view does.
    #[inline]
    fn make_live(&mut self, hash: u64, key: &K) {
        if self.frozen.is_empty() {
            return;
        }
        let RawEntryMut::Vacant(vacant) =
            self.live.raw_entry_mut().from_key_hashed_nocheck(hash, key)
        else {
            return;
        };
        if self.removed.contains(key) {
            return;
        }
        let frozen = self.frozen.iter().rev().find_map(|l| {
            l.entries
                .get(key)
                .map(Some)
                .or_else(|| l.removed.contains(key).then_some(None))
        });
        if let Some(Some(v)) = frozen {
            vacant.insert_hashed_nocheck(hash, key.clone(), v.clone());
        }
    }

    /// The entry of `key`, to change in place.
    #[inline]
    fn get_mut(&mut self, hash: u64, key: &K) -> Option<&mut S> {
        self.make_live(hash, key);
        match self.live.raw_entry_mut().from_key_hashed_nocheck(hash, key) {
            RawEntryMut::Occupied(o) => Some(o.into_mut()),
            RawEntryMut::Vacant(_) => None,
        }
    }

    /// The entry of `key`, inserting `default()` first if there is none; whether it did.
    #[inline]
    fn get_or_insert_with(
        &mut self,
        hash: u64,
        key: &K,
        default: impl FnOnce() -> S,
    ) -> (&mut S, bool) {
        self.make_live(hash, key);
        match self.live.raw_entry_mut().from_key_hashed_nocheck(hash, key) {
            RawEntryMut::Occupied(o) => (o.into_mut(), false),
            RawEntryMut::Vacant(v) => {
                if !self.frozen.is_empty() {
                    self.removed.remove(key);
                    self.frozen_len += 1;
                }
                (
                    v.insert_hashed_nocheck(hash, key.clone(), default()).1,
                    true,
                )
            }
        }
    }

    /// Sets the entry of `key`.
    #[inline]
    fn put(&mut self, hash: u64, key: &K, value: S) {
        let frozen = !self.frozen.is_empty();
        let in_frozen = frozen && self.frozen_get(key).is_some();
        match self.live.raw_entry_mut().from_key_hashed_nocheck(hash, key) {
            RawEntryMut::Occupied(mut o) => *o.get_mut() = value,
            RawEntryMut::Vacant(v) => {
                if frozen {
                    if !in_frozen {
                        self.frozen_len += 1;
                    }
                    self.removed.remove(key);
                }
                v.insert_hashed_nocheck(hash, key.clone(), value);
            }
        }
    }

    /// Removes the entry of `key`; whether there was one.
    #[inline]
    fn remove(&mut self, hash: u64, key: &K) -> bool {
        let was_live = match self.live.raw_entry_mut().from_key_hashed_nocheck(hash, key) {
            RawEntryMut::Occupied(o) => {
                o.remove();
                true
            }
            RawEntryMut::Vacant(_) => false,
        };
        if self.frozen.is_empty() {
            return was_live;
        }
        let was_frozen = self.frozen_get(key).is_some();
        if was_frozen {
            self.removed.insert(key.clone());
        }
        let was = was_live || was_frozen;
        if was {
            self.frozen_len -= 1;
        }
        was
    }

    /// Keeps the live entries `keep` says yes to (nothing may be frozen).
    pub(crate) fn retain_live(&mut self, keep: impl FnMut(&K, &mut S) -> bool) {
        debug_assert!(self.frozen.is_empty());
        self.live.retain(keep);
    }

    /// Number of entries.
    pub(crate) fn len(&self) -> usize {
        if self.is_frozen() {
            self.frozen_len
        } else {
            self.live.len()
        }
    }

    /// Whether there is no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The synchronous part of a snapshot: the current view, frozen in O(1) (the live map
    /// and tombstones move into a new layer).
    pub(crate) fn freeze(&mut self) -> FrozenShard<K, S> {
        if !self.is_frozen() {
            self.frozen_len = self.live.len();
        }
        let hasher = *self.live.hasher();
        self.frozen.push(Arc::new(Layer {
            entries: std::mem::replace(&mut self.live, HashMap::with_hasher(hasher)),
            removed: std::mem::take(&mut self.removed),
            expired: Mutex::new(Vec::new()),
        }));
        FrozenShard {
            layers: self.frozen.clone(),
        }
    }

    /// A frozen copy of the current view that leaves this map as it is: the synchronous part
    /// of a snapshot without copy-on-write, O(entries) (nothing may be frozen).
    pub(crate) fn copy(&self) -> FrozenShard<K, S> {
        debug_assert!(self.frozen.is_empty());
        FrozenShard {
            layers: vec![Arc::new(Layer {
                entries: self.live.clone(),
                removed: HashSet::new(),
                expired: Mutex::new(Vec::new()),
            })],
        }
    }

    /// The current view, shared with the frozen layers where there are any (tests).
    #[cfg(test)]
    pub(crate) fn copy_view(&self) -> FrozenShard<K, S> {
        let mut layers = self.frozen.clone();
        layers.push(Arc::new(Layer {
            entries: self.live.clone(),
            removed: self.removed.clone(),
            expired: Mutex::new(Vec::new()),
        }));
        FrozenShard { layers }
    }

    /// What settling would fold back: the live changes and every layer but the oldest.
    fn changes(&self) -> usize {
        let layers: usize = self
            .frozen
            .iter()
            .skip(1)
            .map(|l| l.entries.len() + l.removed.len())
            .sum();
        self.live.len() + self.removed.len() + layers
    }

    /// Once no snapshot reads the frozen layers any more, folds them and the live changes
    /// into one live map again (O(changed entries)) and returns the keys the snapshots found
    /// expired. None while a snapshot still reads them.
    pub(crate) fn settle(&mut self) -> Option<Vec<K>> {
        if self.frozen.is_empty() {
            return Some(Vec::new());
        }
        if !self.frozen.iter_mut().all(|l| Arc::get_mut(l).is_some()) {
            return None;
        }
        let mut layers = std::mem::take(&mut self.frozen)
            .into_iter()
            .filter_map(|l| Arc::try_unwrap(l).ok());
        let oldest = layers.next()?;
        let mut base = oldest.entries;
        let mut expired = oldest.expired.into_inner().unwrap_or_default();
        for layer in layers {
            for k in &layer.removed {
                base.remove(k);
            }
            base.extend(layer.entries);
            expired.extend(layer.expired.into_inner().unwrap_or_default());
        }
        for k in self.removed.drain() {
            base.remove(&k);
        }
        base.extend(self.live.drain());
        self.live = base;
        Some(expired)
    }
}

/// How many shards a [`CowMap`] has: folding one back after a snapshot costs the changes
/// in that shard only, so the task never pauses for all the changes at once.
const SHARDS: usize = 128;

/// At most this many changes of a shard are folded back in a snapshot's synchronous part.
const SETTLE_AT_FREEZE: usize = 1024;

/// A hash map with O(1) snapshots, in shards (see the module documentation). A shard is
/// folded back (settled) when a key of it is accessed, or at the next freeze.
pub(crate) struct CowMap<K, S> {
    shards: Box<[Shard<K, S>]>,
    hasher: DefaultHashBuilder,
    /// Number of entries.
    len: usize,
    /// Number of frozen shards.
    frozen: usize,
}

impl<K, S> Default for CowMap<K, S> {
    fn default() -> Self {
        let hasher = DefaultHashBuilder::default();
        CowMap {
            shards: (0..SHARDS).map(|_| Shard::new(hasher)).collect(),
            hasher,
            len: 0,
            frozen: 0,
        }
    }
}

/// A frozen, consistent view of a [`CowMap`] at one snapshot, readable from any thread: the
/// views of its non-empty shards.
pub(crate) struct Frozen<K, S> {
    shards: Vec<(usize, FrozenShard<K, S>)>,
    hasher: DefaultHashBuilder,
}

impl<K, S> Clone for Frozen<K, S> {
    fn clone(&self) -> Self {
        Frozen {
            shards: self.shards.clone(),
            hasher: self.hasher,
        }
    }
}

impl<K, S> std::fmt::Debug for Frozen<K, S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Frozen({} shards)", self.shards.len())
    }
}

/// The shard of a key's hash: bits the shards' own tables do not use (low bits: the bucket;
/// top seven: the tag).
#[inline]
fn shard_of_hash(hash: u64) -> usize {
    (hash >> 40) as usize % SHARDS
}

fn shard_of<K: Hash>(hasher: &DefaultHashBuilder, key: &K) -> usize {
    shard_of_hash(hasher.hash_one(key))
}

impl<K: Hash + Eq, S> Frozen<K, S> {
    /// Every entry of the view, each once, in no particular order.
    pub(crate) fn for_each<'a>(&'a self, mut f: impl FnMut(&'a K, &'a S)) {
        for (_, shard) in &self.shards {
            shard.for_each(&mut f);
        }
    }

    /// Number of entries in the view.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|(_, s)| s.len()).sum()
    }

    /// Reports keys found expired in this view; the live map drops them when it settles (if
    /// they are still expired then).
    pub(crate) fn report_expired(&self, keys: Vec<K>) {
        let mut by_shard: BTreeMap<usize, Vec<K>> = BTreeMap::new();
        for k in keys {
            by_shard
                .entry(shard_of(&self.hasher, &k))
                .or_default()
                .push(k);
        }
        for (i, keys) in by_shard {
            if let Ok(at) = self.shards.binary_search_by_key(&i, |(j, _)| *j) {
                self.shards[at].1.report_expired(keys);
            }
        }
    }
}

impl<K: Hash + Eq + Clone, S: Clone> CowMap<K, S> {
    /// The hash of `key` (computed once per access: it picks the shard and serves the
    /// shard's table) and its shard's index.
    #[inline]
    fn locate(&self, key: &K) -> (u64, usize) {
        let hash = self.hasher.hash_one(key);
        (hash, shard_of_hash(hash))
    }

    /// Applies `f` to the shard of `key` with the key's hash, keeping the count of entries.
    #[inline]
    fn with_shard<R>(&mut self, key: &K, f: impl FnOnce(&mut Shard<K, S>, u64) -> R) -> R {
        let (hash, i) = self.locate(key);
        let shard = &mut self.shards[i];
        let before = shard.len();
        let out = f(shard, hash);
        self.len = self.len + shard.len() - before;
        out
    }

    /// Whether a snapshot may still read frozen shards (the slow path is on).
    #[inline]
    pub(crate) fn is_frozen(&self) -> bool {
        self.frozen > 0
    }

    /// The entry of `key`.
    #[inline]
    pub(crate) fn get(&self, key: &K) -> Option<&S> {
        let (hash, i) = self.locate(key);
        self.shards[i].get(hash, key)
    }

    /// Whether `key` has an entry.
    #[inline]
    pub(crate) fn contains_key(&self, key: &K) -> bool {
        self.get(key).is_some()
    }

    /// The entry of `key`, to change in place.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut S> {
        let (hash, i) = self.locate(key);
        self.shards[i].get_mut(hash, key)
    }

    /// The entry of `key`, inserting `default()` first if there is none.
    #[inline]
    pub(crate) fn get_or_insert_with(&mut self, key: &K, default: impl FnOnce() -> S) -> &mut S {
        let (hash, i) = self.locate(key);
        let (entry, inserted) = self.shards[i].get_or_insert_with(hash, key, default);
        self.len += usize::from(inserted);
        entry
    }

    /// Sets the entry of `key`.
    #[inline]
    pub(crate) fn put(&mut self, key: &K, value: S) {
        self.with_shard(key, |s, hash| s.put(hash, key, value))
    }

    /// Removes the entry of `key`; whether there was one.
    #[inline]
    pub(crate) fn remove(&mut self, key: &K) -> bool {
        self.with_shard(key, |s, hash| s.remove(hash, key))
    }

    /// Keeps the entries `keep` says yes to (nothing may be frozen).
    pub(crate) fn retain_live(&mut self, mut keep: impl FnMut(&K, &mut S) -> bool) {
        debug_assert!(!self.is_frozen());
        for shard in self.shards.iter_mut() {
            shard.retain_live(&mut keep);
        }
        self.len = self.shards.iter().map(Shard::len).sum();
    }

    /// Number of entries.
    #[inline]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no entry.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Folds back the shard of `key` if no snapshot reads it any more (O(its changes)) and
    /// returns the keys of it that the snapshots found expired.
    #[inline]
    pub(crate) fn settle_for(&mut self, key: &K) -> Vec<K> {
        let i = shard_of(&self.hasher, key);
        self.settle_shard(i)
    }

    fn settle_shard(&mut self, i: usize) -> Vec<K> {
        let shard = &mut self.shards[i];
        if !shard.is_frozen() {
            return Vec::new();
        }
        match shard.settle() {
            Some(expired) => {
                self.frozen -= 1;
                expired
            }
            None => Vec::new(),
        }
    }

    /// Folds back the shards no snapshot reads any more and that changed little (at most
    /// [`SETTLE_AT_FREEZE`] entries each, so this stays short); the keys the snapshots found
    /// expired. The others settle at their next access.
    pub(crate) fn settle_small(&mut self) -> Vec<K> {
        let mut expired = Vec::new();
        if self.is_frozen() {
            for i in 0..SHARDS {
                if self.shards[i].changes() <= SETTLE_AT_FREEZE {
                    expired.extend(self.settle_shard(i));
                }
            }
        }
        expired
    }

    /// Folds back every shard no snapshot reads any more; the keys the snapshots found
    /// expired.
    #[cfg(test)]
    pub(crate) fn settle_all(&mut self) -> Vec<K> {
        let mut expired = Vec::new();
        if self.is_frozen() {
            for i in 0..SHARDS {
                expired.extend(self.settle_shard(i));
            }
        }
        expired
    }

    /// The synchronous part of a snapshot: the current view, frozen in O(shards) (each
    /// non-empty shard's live map and tombstones move into a new layer). Shards whose
    /// snapshots are done and that changed little are folded back first (settle them before,
    /// with [`settle_small`](Self::settle_small), to use the keys they found expired; a later
    /// snapshot finds those again); the others get a layer on top of their frozen ones, so
    /// that the synchronous part never pays for many changes.
    pub(crate) fn freeze(&mut self) -> Frozen<K, S> {
        self.settle_small();
        let mut shards = Vec::new();
        for (i, shard) in self.shards.iter_mut().enumerate() {
            if shard.is_empty() {
                continue;
            }
            if !shard.is_frozen() {
                self.frozen += 1;
            }
            shards.push((i, shard.freeze()));
        }
        Frozen {
            shards,
            hasher: self.hasher,
        }
    }

    /// A frozen copy of the current view that leaves this map as it is: the synchronous part
    /// of a snapshot without copy-on-write, O(entries) (nothing may be frozen).
    pub(crate) fn copy(&self) -> Frozen<K, S> {
        let shards = self
            .shards
            .iter()
            .enumerate()
            .filter(|(_, s)| !s.is_empty())
            .map(|(i, s)| (i, s.copy()))
            .collect();
        Frozen {
            shards,
            hasher: self.hasher,
        }
    }

    /// The current view, sharing the frozen layers (tests).
    #[cfg(test)]
    pub(crate) fn copy_view(&self) -> Frozen<K, S> {
        let shards = self
            .shards
            .iter()
            .enumerate()
            .map(|(i, s)| (i, s.copy_view()))
            .collect();
        Frozen {
            shards,
            hasher: self.hasher,
        }
    }

    /// Entries held by the live maps (tests: what copy-on-write copied).
    #[cfg(test)]
    pub(crate) fn live_len(&self) -> usize {
        self.shards.iter().map(|s| s.live.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(f: &Frozen<u32, u64>) -> BTreeMap<u32, u64> {
        let mut out = BTreeMap::new();
        f.for_each(|k, v| {
            assert!(out.insert(*k, *v).is_none(), "key {k} seen twice");
        });
        assert_eq!(f.len(), out.len());
        out
    }

    fn live(m: &CowMap<u32, u64>) -> BTreeMap<u32, u64> {
        let out: BTreeMap<u32, u64> = (0..1000)
            .filter_map(|k| m.get(&k).map(|v| (k, *v)))
            .collect();
        assert_eq!(m.len(), out.len());
        out
    }

    #[test]
    fn a_frozen_view_keeps_what_was_there_while_the_map_changes() {
        let mut m: CowMap<u32, u64> = CowMap::default();
        for k in 0..500 {
            m.put(&k, u64::from(k));
        }
        let before = live(&m);
        let f = m.freeze();
        assert_eq!(
            m.live_len(),
            0,
            "the freeze moved the entries, it copied none"
        );
        *m.get_mut(&1).unwrap() += 100;
        *m.get_or_insert_with(&2, || 0) += 200;
        *m.get_or_insert_with(&600, || 7) += 1;
        assert!(m.remove(&3));
        assert!(!m.remove(&3));
        assert!(!m.remove(&700));
        m.put(&4, 44);
        assert_eq!(m.live_len(), 4, "only the changed entries were copied");
        assert_eq!(view(&f), before);
        let mut expect = before.clone();
        expect.insert(1, 101);
        expect.insert(2, 202);
        expect.insert(600, 8);
        expect.remove(&3);
        expect.insert(4, 44);
        assert_eq!(live(&m), expect);
        m.settle_all();
        assert!(m.is_frozen(), "the snapshot still reads its layers");
        drop(f);
        assert_eq!(m.settle_all(), Vec::<u32>::new());
        assert!(!m.is_frozen());
        assert_eq!(live(&m), expect);
        assert_eq!(m.live_len(), expect.len());
    }

    #[test]
    fn concurrent_snapshots_each_see_their_own_view() {
        let mut m: CowMap<u32, u64> = CowMap::default();
        for k in 0..300 {
            m.put(&k, 1);
        }
        let first = m.freeze();
        let at_first = live(&m);
        m.put(&0, 2);
        assert!(m.remove(&1));
        m.put(&900, 2);
        let second = m.freeze();
        let at_second = live(&m);
        m.put(&1, 3); // back after its removal
        assert!(m.remove(&900));
        assert!(m.remove(&2));
        m.put(&0, 3);
        let third = m.freeze();
        let at_third = live(&m);
        m.put(&5, 4);
        assert_eq!(view(&first), at_first);
        assert_eq!(view(&second), at_second);
        assert_eq!(view(&third), at_third);
        drop((first, third));
        m.settle_all();
        assert!(m.is_frozen());
        second.report_expired(vec![6]);
        drop(second);
        assert_eq!(m.settle_all(), vec![6]);
        assert!(!m.is_frozen());
        let mut expect = at_third;
        expect.insert(5, 4);
        assert_eq!(live(&m), expect);
        assert_eq!(m.live_len(), expect.len());
    }

    /// A shard is folded back when one of its keys is accessed, the others stay frozen
    /// until theirs are: no access pays for every change at once.
    #[test]
    fn shards_settle_one_at_a_time() {
        let mut m: CowMap<u32, u64> = CowMap::default();
        for k in 0..5000 {
            m.put(&k, 0);
        }
        let f = m.freeze();
        for k in 0..5000 {
            *m.get_mut(&k).unwrap() += 1;
        }
        drop(f);
        let frozen = m.frozen;
        assert!(frozen > SHARDS / 2, "{frozen}");
        m.settle_for(&7);
        assert_eq!(m.frozen, frozen - 1);
        assert_eq!(m.get(&7), Some(&1));
        let f = m.freeze();
        assert_eq!(view(&f).values().sum::<u64>(), 5000);
    }

    #[test]
    fn a_copy_leaves_the_map_live() {
        let mut m: CowMap<u32, u64> = CowMap::default();
        m.put(&1, 1);
        let c = m.copy();
        m.put(&1, 2);
        assert!(!m.is_frozen());
        assert_eq!(view(&c), BTreeMap::from([(1, 1)]));
        assert_eq!(live(&m), BTreeMap::from([(1, 2)]));
    }
}
