//! Key groups: the unit in which keyed state is partitioned, snapshotted and rescaled.
//!
//! A key belongs to key group `stable_hash(key) mod max_parallelism`; subtask `i` of `p` owns the
//! contiguous range computed as in Flink, so that a savepoint taken at one parallelism can be
//! restored at another by reassigning whole key groups. The hash must never change between
//! versions: it is FNV-1a over the bytes `Hash` feeds it (little-endian integers), finished with
//! murmur3's 64-bit mixer so that the low bits are well distributed.

use std::hash::{Hash, Hasher};

use serde::{Deserialize, Serialize};

/// Default number of key groups (Flink's `pipeline.max-parallelism` default for small jobs).
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

/// A hasher whose output is fixed forever for the same input, unlike std's `DefaultHasher`.
#[derive(Debug, Clone, Copy)]
pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl Hasher for StableHasher {
    fn finish(&self) -> u64 {
        fmix64(self.0)
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }

    fn write_u8(&mut self, i: u8) {
        self.write(&[i]);
    }
    fn write_u16(&mut self, i: u16) {
        self.write(&i.to_le_bytes());
    }
    fn write_u32(&mut self, i: u32) {
        self.write(&i.to_le_bytes());
    }
    fn write_u64(&mut self, i: u64) {
        self.write(&i.to_le_bytes());
    }
    fn write_usize(&mut self, i: usize) {
        self.write(&(i as u64).to_le_bytes());
    }
}

fn fmix64(mut k: u64) -> u64 {
    k ^= k >> 33;
    k = k.wrapping_mul(0xff51_afd7_ed55_8ccd);
    k ^= k >> 33;
    k = k.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    k ^= k >> 33;
    k
}

/// The stable hash of a key.
pub fn stable_hash<K: Hash + ?Sized>(key: &K) -> u64 {
    let mut h = StableHasher::default();
    key.hash(&mut h);
    h.finish()
}

/// The key group of a key hash.
#[inline]
pub fn key_group_of_hash(hash: u64, max_parallelism: u32) -> u32 {
    (hash % u64::from(max_parallelism)) as u32
}

/// The subtask that owns a key group (Flink's `computeOperatorIndexForKeyGroup`).
#[inline]
pub fn subtask_for_key_group(key_group: u32, max_parallelism: u32, parallelism: u32) -> u32 {
    ((u64::from(key_group) * u64::from(parallelism)) / u64::from(max_parallelism)) as u32
}

/// An inclusive range of key groups owned by one subtask.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyGroupRange {
    /// First key group.
    pub start: u32,
    /// Last key group (inclusive); `end < start` is the empty range.
    pub end: u32,
}

impl KeyGroupRange {
    /// The range subtask `subtask` of `parallelism` owns (Flink's `computeKeyGroupRangeForOperatorIndex`).
    pub fn for_subtask(max_parallelism: u32, parallelism: u32, subtask: u32) -> Self {
        let (m, p, i) = (
            u64::from(max_parallelism),
            u64::from(parallelism),
            u64::from(subtask),
        );
        let start = (i * m).div_ceil(p);
        let end = ((i + 1) * m - 1) / p;
        KeyGroupRange {
            start: start as u32,
            end: end as u32,
        }
    }

    /// Whether `kg` is in the range.
    pub fn contains(&self, kg: u32) -> bool {
        kg >= self.start && kg <= self.end
    }

    /// Whether two ranges share a key group.
    pub fn intersects(&self, other: &KeyGroupRange) -> bool {
        self.start <= other.end && other.start <= self.end && !self.is_empty() && !other.is_empty()
    }

    /// Whether the range holds no key group.
    pub fn is_empty(&self) -> bool {
        self.end < self.start
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_all_key_groups_once() {
        for p in 1..=16u32 {
            let mut next = 0;
            for i in 0..p {
                let r = KeyGroupRange::for_subtask(128, p, i);
                assert_eq!(r.start, next, "p={p} i={i}");
                for kg in r.start..=r.end {
                    assert_eq!(subtask_for_key_group(kg, 128, p), i);
                }
                next = r.end + 1;
            }
            assert_eq!(next, 128);
        }
    }

    #[test]
    fn hash_is_stable() {
        // Pinned values: changing the hash would break every savepoint ever taken.
        assert_eq!(stable_hash("w1"), stable_hash(&String::from("w1")));
        assert_eq!(stable_hash(&7u64), 0xc211_2d51_b876_518d);
        let spread: std::collections::HashSet<u32> = (0..10_000)
            .map(|i| key_group_of_hash(stable_hash(&format!("w{i}")), 128))
            .collect();
        assert_eq!(spread.len(), 128);
    }
}
