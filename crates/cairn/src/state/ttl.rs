//! State time-to-live (Flink's `StateTtlConfig`) for keyed value, reducing, map and list state on
//! both backends: an entry expires `ttl` after it was last written (or read, with
//! [`TtlUpdate::OnReadAndWrite`]); an expired entry is never returned (unless
//! [`TtlVisibility::ReturnExpiredIfNotCleanedUp`]), is left out of every snapshot, and is dropped
//! from the live table once a snapshot found it expired, so that its memory is reclaimed; on
//! RocksDB a compaction filter also drops it from disk.
//!
//! Time to live is processing time (the wall clock), as in Flink. Each entry carries the time
//! of its last access; the entries of a map state and the elements of a list state
//! ([`TtlList`]) carry one each. A state's values are stored
//! as [`Ttl`] with the serializer id [`SERDE_POSTCARD_TTL`], so a restore refuses to read a state
//! with TTL that was written without it, or the other way round (the formats differ).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The serializer id of the values of a state with time-to-live: [`Ttl`] in postcard.
pub const SERDE_POSTCARD_TTL: &str = "cairn.serde-postcard+ttl";

/// When an entry's time-to-live starts again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlUpdate {
    /// On creation and on every write (Flink's default).
    OnCreateAndWrite,
    /// Also on every read.
    OnReadAndWrite,
}

/// Whether an expired entry that was not cleaned up yet can still be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TtlVisibility {
    /// An expired entry reads as absent (Flink's default).
    NeverReturnExpired,
    /// An expired entry reads as present until a snapshot drops it.
    ReturnExpiredIfNotCleanedUp,
}

/// The time-to-live of a keyed state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateTtlConfig {
    ttl_ms: i64,
    update: TtlUpdate,
    visibility: TtlVisibility,
}

impl StateTtlConfig {
    /// Entries expire `ttl` after their creation or last write, and expired ones read as absent.
    pub fn new(ttl: Duration) -> Self {
        StateTtlConfig {
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
            update: TtlUpdate::OnCreateAndWrite,
            visibility: TtlVisibility::NeverReturnExpired,
        }
    }

    /// When the time-to-live starts again.
    pub fn update(mut self, update: TtlUpdate) -> Self {
        self.update = update;
        self
    }

    /// Whether expired entries that were not cleaned up yet can be read.
    pub fn visibility(mut self, visibility: TtlVisibility) -> Self {
        self.visibility = visibility;
        self
    }

    /// The time to live (ms).
    pub fn ttl_ms(&self) -> i64 {
        self.ttl_ms
    }

    /// Whether a read restarts the time-to-live (a read then changes the entry, so it goes
    /// through the backends' write path: copy-on-write, dirty in the disk cache).
    pub(crate) fn refreshes_on_read(&self) -> bool {
        self.update == TtlUpdate::OnReadAndWrite
    }

    /// Whether an entry last accessed at `stamp` has expired at `now` (ms).
    pub fn expired(&self, stamp: i64, now: i64) -> bool {
        now.saturating_sub(stamp) >= self.ttl_ms
    }

    /// The value of `entry` as a read at `now` sees it (restarting its time-to-live when
    /// reads do).
    pub(crate) fn read<'a, V>(&self, entry: &'a Ttl<V>, now: i64) -> Option<&'a V> {
        if self.visibility == TtlVisibility::NeverReturnExpired && self.expired(entry.stamp(), now)
        {
            return None;
        }
        if self.update == TtlUpdate::OnReadAndWrite {
            entry.touch(now);
        }
        Some(&entry.value)
    }
}

/// A value with the time (ms) it was last accessed, as a state with time-to-live stores it.
#[derive(Debug, Serialize, Deserialize)]
pub struct Ttl<V> {
    pub(crate) value: V,
    /// Atomic (relaxed: one thread writes it), so that a read can restart the time-to-live
    /// through a shared reference and a frozen snapshot can still be shared across threads.
    /// Serialized as an `i64`.
    stamp: AtomicI64,
}

impl<V: Clone> Clone for Ttl<V> {
    fn clone(&self) -> Self {
        Ttl::new(self.value.clone(), self.stamp())
    }
}

impl<V> Ttl<V> {
    /// `value`, accessed at `now`.
    pub(crate) fn new(value: V, now: i64) -> Self {
        Ttl {
            value,
            stamp: AtomicI64::new(now),
        }
    }

    /// When it was last accessed.
    pub(crate) fn stamp(&self) -> i64 {
        self.stamp.load(Ordering::Relaxed)
    }

    /// It was written at `now`.
    pub(crate) fn touch(&self, now: i64) {
        self.stamp.store(now, Ordering::Relaxed);
    }
}

/// The list of a list state with time-to-live: its elements and, for each, the time it was
/// last accessed (parallel vectors, so that the live elements read as one slice). Each
/// element expires on its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TtlList<V> {
    pub(crate) values: Vec<V>,
    stamps: Vec<i64>,
}

impl<V> Default for TtlList<V> {
    fn default() -> Self {
        TtlList {
            values: Vec::new(),
            stamps: Vec::new(),
        }
    }
}

impl<V> TtlList<V> {
    /// `values`, each written at `now`.
    pub(crate) fn new(values: Vec<V>, now: i64) -> Self {
        let stamps = vec![now; values.len()];
        TtlList { values, stamps }
    }

    /// Appends `value`, written at `now`.
    pub(crate) fn push(&mut self, value: V, now: i64) {
        self.values.push(value);
        self.stamps.push(now);
    }

    /// Drops the elements expired at `now`; whether any is left.
    pub(crate) fn prune(&mut self, ttl: &StateTtlConfig, now: i64) -> bool {
        if self.any_expired(ttl, now) {
            let mut stamps = self.stamps.iter();
            self.values
                .retain(|_| stamps.next().is_some_and(|s| !ttl.expired(*s, now)));
            self.stamps.retain(|s| !ttl.expired(*s, now));
        }
        !self.values.is_empty()
    }

    /// Whether an element has expired at `now`.
    pub(crate) fn any_expired(&self, ttl: &StateTtlConfig, now: i64) -> bool {
        self.stamps.iter().any(|s| ttl.expired(*s, now))
    }

    /// The newest access time of its elements (0 when empty).
    pub(crate) fn stamp(&self) -> i64 {
        self.stamps.iter().copied().max().unwrap_or(0)
    }

    /// A read at `now`: drops what expired (unless expired elements stay visible until cleaned
    /// up) and restarts the time-to-live of the rest when reads do.
    pub(crate) fn read(&mut self, ttl: &StateTtlConfig, now: i64) {
        if ttl.visibility == TtlVisibility::NeverReturnExpired {
            self.prune(ttl, now);
        }
        if ttl.update == TtlUpdate::OnReadAndWrite {
            self.stamps.iter_mut().for_each(|s| *s = now);
        }
    }
}
