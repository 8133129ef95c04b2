//! Timers of a keyed operator: system state, persisted per key group like keyed state.
//!
//! A timer is a (key, time) pair, registered at most once (registering it again changes
//! nothing), fired once with its key in scope: an event-time timer when the watermark reaches
//! it, a processing-time timer when the wall clock has passed it, or at the latest when a
//! bounded input ends (the maximum watermark fires every pending one); the keyed operator that
//! holds them decides when. Timers are snapshotted with the keyed state, in key groups, so a
//! restored or rescaled subtask gets exactly the timers of its keys; a timer that fired before
//! a checkpoint is not in it and cannot fire again after a restore.

use std::collections::BTreeMap;

use super::cow::{CowMap, Frozen};

use super::keygroup::{key_group_of_hash, stable_hash, KeyGroupRange};
use super::{
    check_restorable, decode_exact, DeferredTable, Key, KeyedTableData, SerializerId, StateKind,
};
use crate::error::{TaskError, TaskResult};

/// Which clock a timer follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeDomain {
    /// The watermark.
    EventTime,
    /// The wall clock of the subtask.
    ProcessingTime,
}

/// The name under which event-time timers are persisted.
pub const EVENT_TIMERS: &str = "_timers.event";
/// The name under which processing-time timers are persisted.
pub const PROCESSING_TIMERS: &str = "_timers.processing";

/// The timers of one clock, ordered by time.
pub struct TimerQueue<K> {
    name: &'static str,
    /// The registered timers: the truth. Copy-on-write, so that a snapshot freezes it in O(1).
    set: CowMap<(K, i64), ()>,
    /// Keys by time, for firing in time order; may hold entries deleted since (they are
    /// skipped when not in `set`).
    by_time: BTreeMap<i64, Vec<K>>,
}

impl<K: Key> TimerQueue<K> {
    fn new(name: &'static str) -> Self {
        TimerQueue {
            name,
            set: CowMap::default(),
            by_time: BTreeMap::new(),
        }
    }

    /// Registers a timer; false if it was registered already.
    pub fn register(&mut self, key: &K, time: i64) -> bool {
        let timer = (key.clone(), time);
        self.settle(&timer);
        if self.set.contains_key(&timer) {
            return false;
        }
        self.set.put(&timer, ());
        self.by_time.entry(time).or_default().push(timer.0);
        true
    }

    /// Deletes a timer, if registered.
    pub fn delete(&mut self, key: &K, time: i64) {
        let timer = (key.clone(), time);
        self.settle(&timer);
        self.set.remove(&timer);
    }

    /// Once no snapshot reads the frozen shard of `timer` any more, folds it back.
    #[inline]
    fn settle(&mut self, timer: &(K, i64)) {
        if self.set.is_frozen() {
            self.set.settle_for(timer);
        }
    }

    /// Every registered timer (key, time), in no particular order (the simulation's snapshots).
    #[cfg(test)]
    pub(crate) fn entries(&self) -> Vec<(K, i64)> {
        let mut all = Vec::new();
        self.set.copy_view().for_each(|t, _| all.push(t.clone()));
        all
    }

    /// Number of registered timers.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether no timer is registered.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// The earliest registered time.
    pub fn earliest(&mut self) -> Option<i64> {
        loop {
            let mut first = self.by_time.first_entry()?;
            let t = *first.key();
            let keys = first.get_mut();
            while let Some(k) = keys.last() {
                if self.set.contains_key(&(k.clone(), t)) {
                    return Some(t);
                }
                keys.pop();
            }
            first.remove();
        }
    }

    /// The earliest registered time, without dropping deleted entries.
    pub fn peek(&self) -> Option<i64> {
        self.by_time
            .iter()
            .find(|(t, keys)| {
                keys.iter()
                    .any(|k| self.set.contains_key(&(k.clone(), **t)))
            })
            .map(|(t, _)| *t)
    }

    /// Removes and returns a timer at or before `upto`, earliest first.
    pub fn pop_due(&mut self, upto: i64) -> Option<(i64, K)> {
        loop {
            let mut first = self.by_time.first_entry()?;
            let t = *first.key();
            if t > upto {
                return None;
            }
            let keys = first.get_mut();
            match keys.pop() {
                Some(k) => {
                    if keys.is_empty() {
                        first.remove();
                    }
                    let timer = (k, t);
                    if self.set.is_frozen() {
                        self.set.settle_for(&timer);
                    }
                    if self.set.remove(&timer) {
                        return Some((t, timer.0));
                    }
                }
                None => {
                    first.remove();
                }
            }
        }
    }

    /// Removes and returns every registered timer, earliest first (end of input fires them
    /// all, and only them: those registered while they fire stay).
    pub fn drain_all(&mut self) -> Vec<(i64, K)> {
        let mut all = Vec::with_capacity(self.set.len());
        while let Some(timer) = self.pop_due(i64::MAX) {
            all.push(timer);
        }
        all
    }

    /// The synchronous part of a snapshot (None when there is no timer).
    /// `copy_on_write`: the set is frozen in O(1) rather than copied.
    pub(crate) fn snapshot(
        &mut self,
        max_parallelism: u32,
        copy_on_write: bool,
    ) -> Option<DeferredTable> {
        if self.set.is_empty() {
            return None;
        }
        let view: Frozen<(K, i64), ()> = if copy_on_write {
            self.set.freeze()
        } else {
            self.set.copy()
        };
        let name = self.name;
        Some(Box::new(move || {
            let mut groups: BTreeMap<u32, Vec<&(K, i64)>> = BTreeMap::new();
            view.for_each(|e, _| {
                let kg = key_group_of_hash(stable_hash(&e.0), max_parallelism);
                groups.entry(kg).or_default().push(e);
            });
            let mut out = Vec::with_capacity(groups.len());
            for (kg, entries) in groups {
                let bytes = postcard::to_stdvec(&entries).map_err(|e| {
                    TaskError::msg(format!("cannot serialize timers '{name}': {e}"))
                })?;
                out.push((kg, bytes));
            }
            Ok(KeyedTableData {
                name: name.to_string(),
                kind: StateKind::Timers,
                serializer: SerializerId::postcard::<(K, i64)>(),
                groups: out,
            })
        }))
    }

    /// Adds the restored timers of the key groups in `range`.
    pub(crate) fn restore(&mut self, table: KeyedTableData, range: KeyGroupRange) -> TaskResult {
        check_restorable(self.name, &table.serializer, table.kind, StateKind::Timers)?;
        for (kg, bytes) in table.groups {
            if !range.contains(kg) {
                continue;
            }
            let entries: Vec<(K, i64)> = decode_exact(&bytes).map_err(|e| {
                TaskError::Unrecoverable(format!(
                    "cannot restore timers '{}' (key group {kg}): {e}; the key type changed",
                    self.name
                ))
            })?;
            for (k, t) in entries {
                self.register(&k, t);
            }
        }
        Ok(())
    }
}

/// The event-time and processing-time timers of a keyed operator subtask.
pub struct Timers<K> {
    /// Fired by the watermark.
    pub event: TimerQueue<K>,
    /// Fired by the wall clock.
    pub processing: TimerQueue<K>,
}

impl<K: Key> Timers<K> {
    pub(crate) fn new() -> Self {
        Timers {
            event: TimerQueue::new(EVENT_TIMERS),
            processing: TimerQueue::new(PROCESSING_TIMERS),
        }
    }

    /// The queue of `domain`.
    pub fn queue(&mut self, domain: TimeDomain) -> &mut TimerQueue<K> {
        match domain {
            TimeDomain::EventTime => &mut self.event,
            TimeDomain::ProcessingTime => &mut self.processing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timers_fire_in_time_order_once_and_deleted_ones_never() {
        let mut q: TimerQueue<u32> = TimerQueue::new(EVENT_TIMERS);
        assert!(q.register(&1, 20));
        assert!(q.register(&2, 10));
        assert!(!q.register(&1, 20), "deduplicated per key and time");
        assert!(q.register(&3, 10));
        q.delete(&3, 10);
        assert_eq!(q.len(), 2);
        assert_eq!(q.earliest(), Some(10));
        assert_eq!(q.pop_due(5), None);
        assert_eq!(q.pop_due(15), Some((10, 2)));
        assert_eq!(q.pop_due(15), None);
        // Registered again after a delete: fires once.
        q.register(&3, 10);
        assert_eq!(q.pop_due(30), Some((10, 3)));
        assert_eq!(q.pop_due(30), Some((20, 1)));
        assert_eq!(q.pop_due(30), None);
        assert!(q.is_empty());
    }

    #[test]
    fn draining_takes_every_timer_in_time_order_and_nothing_registered_after() {
        let mut q: TimerQueue<u32> = TimerQueue::new(PROCESSING_TIMERS);
        q.register(&1, 30);
        q.register(&2, 10);
        q.register(&3, 20);
        q.delete(&3, 20);
        assert_eq!(q.drain_all(), vec![(10, 2), (30, 1)]);
        assert!(q.is_empty());
        q.register(&4, 5);
        assert_eq!(q.pop_due(i64::MAX), Some((5, 4)));
    }

    #[test]
    fn timers_are_restored_per_key_group() {
        let mut q: TimerQueue<u64> = TimerQueue::new(EVENT_TIMERS);
        for k in 0..100u64 {
            q.register(&k, 1_000 + k as i64);
        }
        let table = (q.snapshot(128, true).unwrap())().unwrap();
        let halves = [
            KeyGroupRange::for_subtask(128, 2, 0),
            KeyGroupRange::for_subtask(128, 2, 1),
        ];
        let mut total = 0;
        for range in halves {
            let mut r: TimerQueue<u64> = TimerQueue::new(EVENT_TIMERS);
            r.restore(table.clone(), range).unwrap();
            while let Some((t, k)) = r.pop_due(i64::MAX) {
                assert_eq!(t, 1_000 + k as i64);
                assert!(range.contains(key_group_of_hash(stable_hash(&k), 128)));
                total += 1;
            }
        }
        assert_eq!(total, 100, "every timer lands in exactly one half");
    }
}
