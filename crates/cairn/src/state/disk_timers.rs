//! Timers on the RocksDB backend (Flink's `ROCKSDB` timer service): a keyed operator's timers
//! live in a column family of their own per clock (`_timers.event`, `_timers.processing`),
//! so that their memory is bounded like the rest of the disk state.
//!
//! A timer is stored as the key `[key group: u16 BE][time: i64 with its sign bit flipped, BE]
//! [postcard(K)]` with an empty value: within a key group the timers are in time order, and a
//! subtask's key groups stay one contiguous key range (restore and rescaling copy them like any
//! state). Registering a timer twice writes the same key, so it fires once. In memory there is
//! only the earliest time of each key group that has timers ([`DiskTimerQueue::heads`], at most
//! one entry per key group), kept exact: a firing or a deletion at a key group's earliest time
//! looks up the next one (a seek from that time, so the tombstones of fired timers before it
//! are never scanned).
//!
//! They are checkpointed with the instance (its RocksDB checkpoint); a savepoint writes them in
//! the backend-independent format of the heap's timers, and timers restored in that format are
//! written into the column family when the backend opens.

use std::collections::BTreeSet;

use hashbrown::HashMap;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::keygroup::KeyGroupRange;
use super::rocks::RocksInstance;
use crate::error::{TaskError, TaskResult};

/// The stored bytes of a time: ordered like the times.
fn time_bytes(t: i64) -> [u8; 8] {
    ((t as u64) ^ (1 << 63)).to_be_bytes()
}

/// A time from its stored bytes.
pub(crate) fn time_from(bytes: &[u8]) -> Option<i64> {
    let b: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    Some((u64::from_be_bytes(b) ^ (1 << 63)) as i64)
}

/// The length of a stored timer key before the key's bytes.
pub(crate) const TIMER_PREFIX: usize = 10;

/// The timers of one clock of a keyed operator subtask, in a RocksDB column family.
pub(crate) struct DiskTimerQueue {
    cf: &'static str,
    /// The earliest time of every key group that has timers, as (time, key group).
    heads: BTreeSet<(i64, u16)>,
    /// The same, by key group.
    head_of: HashMap<u16, i64>,
    buf: Vec<u8>,
}

impl DiskTimerQueue {
    /// The queue in column family `cf` (which exists), with the heads of the key groups in
    /// `range` read from it (timers restored with the instance).
    pub(crate) fn open(
        cf: &'static str,
        rocks: &RocksInstance,
        range: KeyGroupRange,
    ) -> TaskResult<Self> {
        let mut q = DiskTimerQueue {
            cf,
            heads: BTreeSet::new(),
            head_of: HashMap::new(),
            buf: Vec::with_capacity(64),
        };
        let lowest = (range.start as u16).to_be_bytes();
        let above = (range.end as u16 + 1).to_be_bytes();
        if rocks.first_key(cf, &lowest, &above)?.is_none() {
            return Ok(q);
        }
        for kg in range.start..=range.end {
            q.refresh(rocks, kg as u16, i64::MIN)?;
        }
        Ok(q)
    }

    fn encode<K: Serialize>(&mut self, kg: u16, time: i64, key: &K) -> TaskResult {
        self.buf.clear();
        self.buf.extend_from_slice(&kg.to_be_bytes());
        self.buf.extend_from_slice(&time_bytes(time));
        let out = postcard::to_extend(key, std::mem::take(&mut self.buf))
            .map_err(|e| TaskError::msg(format!("cannot encode a timer's key: {e}")))?;
        self.buf = out;
        Ok(())
    }

    /// Looks up the earliest timer of key group `kg` at or after `from`.
    fn refresh(&mut self, rocks: &RocksInstance, kg: u16, from: i64) -> TaskResult {
        if let Some(t) = self.head_of.remove(&kg) {
            self.heads.remove(&(t, kg));
        }
        let mut start = kg.to_be_bytes().to_vec();
        start.extend_from_slice(&time_bytes(from));
        let above = (kg + 1).to_be_bytes();
        if let Some(k) = rocks.first_key(self.cf, &start, &above)? {
            let t = time_from(&k[2..]).ok_or_else(|| self.corrupt())?;
            self.heads.insert((t, kg));
            self.head_of.insert(kg, t);
        }
        Ok(())
    }

    fn corrupt(&self) -> TaskError {
        TaskError::msg(format!(
            "RocksDB: a stored timer of '{}' is malformed",
            self.cf
        ))
    }

    /// Registers the timer of `key` (in key group `kg`) at `time`.
    pub(crate) fn register<K: Serialize>(
        &mut self,
        rocks: &RocksInstance,
        kg: u16,
        key: &K,
        time: i64,
    ) -> TaskResult {
        self.encode(kg, time, key)?;
        rocks.put(self.cf, &self.buf, &[])?;
        match self.head_of.get(&kg) {
            Some(&head) if head <= time => {}
            head => {
                if let Some(&h) = head {
                    self.heads.remove(&(h, kg));
                }
                self.heads.insert((time, kg));
                self.head_of.insert(kg, time);
            }
        }
        Ok(())
    }

    /// Deletes the timer of `key` at `time`, if registered.
    pub(crate) fn delete<K: Serialize>(
        &mut self,
        rocks: &RocksInstance,
        kg: u16,
        key: &K,
        time: i64,
    ) -> TaskResult {
        self.encode(kg, time, key)?;
        rocks.delete(self.cf, &self.buf)?;
        if self.head_of.get(&kg) == Some(&time) {
            self.refresh(rocks, kg, time)?;
        }
        Ok(())
    }

    /// The earliest registered time.
    pub(crate) fn peek(&self) -> Option<i64> {
        self.heads.first().map(|(t, _)| *t)
    }

    /// Whether no timer is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.heads.is_empty()
    }

    /// Removes and returns a timer at or before `upto`, earliest first.
    pub(crate) fn pop_due<K: DeserializeOwned>(
        &mut self,
        rocks: &RocksInstance,
        upto: i64,
    ) -> TaskResult<Option<(i64, K)>> {
        let Some(&(time, kg)) = self.heads.first() else {
            return Ok(None);
        };
        if time > upto {
            return Ok(None);
        }
        let mut start = kg.to_be_bytes().to_vec();
        start.extend_from_slice(&time_bytes(time));
        let above = (kg + 1).to_be_bytes();
        let Some(stored) = rocks.first_key(self.cf, &start, &above)? else {
            return Err(self.corrupt());
        };
        if time_from(&stored[2..]) != Some(time) {
            return Err(self.corrupt());
        }
        let key: K = super::decode_exact(&stored[TIMER_PREFIX..]).map_err(|e| {
            TaskError::Unrecoverable(format!(
                "cannot read a timer's key of '{}': {e}; the key type changed",
                self.cf
            ))
        })?;
        rocks.delete(self.cf, &stored)?;
        self.refresh(rocks, kg, time)?;
        Ok(Some((time, key)))
    }
}
