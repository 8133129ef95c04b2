//! Key groups: the unit in which keyed state is partitioned, snapshotted and rescaled.
//!
//! A key belongs to key group `stable_hash(key) mod max_parallelism`; subtask `i` of `p` owns the
//! contiguous range computed as in Flink, so that a savepoint taken at one parallelism can be
//! restored at another by reassigning whole key groups.
//!
//! # The stable key encoding
//!
//! A key's key group must be the same on every machine, with every Rust compiler and in every
//! later cairn version, or restored state would be looked up in the wrong subtask. It therefore
//! depends neither on `std::hash::Hash` (whose byte feed is not a stable contract) nor on the
//! memory layout: every key type implements [`StableKey`], which writes a documented byte
//! encoding, and [`stable_hash`] hashes those bytes. The encoding (all integers little-endian):
//!
//! | type                                   | bytes                                             |
//! |----------------------------------------|---------------------------------------------------|
//! | `u8`..`u128`, `i8`..`i128`             | fixed width, two's complement                     |
//! | `usize`, `isize`                       | as `u64`, `i64` (8 bytes)                         |
//! | `bool`                                 | 1 byte, 0 or 1                                    |
//! | `char`                                 | its scalar value as `u32`                         |
//! | `str`, `String`, `CompactString`       | byte length as `u64`, then the UTF-8 bytes        |
//! | `[T]`, `Vec<T>`, `[T; N]`              | element count as `u64`, then each element         |
//! | `Option<T>`                            | `0`, or `1` then the value                        |
//! | `()`, tuples of up to 6 elements       | the elements' encodings, one after the other      |
//!
//! So a byte array `[1, 2]` is `02 00 00 00 00 00 00 00 01 02`, the string `"ab"` is
//! `02 00 00 00 00 00 00 00 61 62` — the same bytes as its UTF-8 byte array. Lengths make the
//! encoding of a tuple unambiguous. A user key type implements [`StableKey`] by encoding its
//! fields in a fixed order with these impls; changing that order or a field's type changes the
//! key groups, and state restored from an older savepoint is then looked up in the wrong place.
//!
//! The hash is 64-bit FNV-1a over the encoded bytes, finished with murmur3's `fmix64` so that the
//! low bits are well distributed. The golden vectors in this module's tests pin it: a change
//! that moves any of them breaks every savepoint ever taken.

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

/// Default number of key groups (Flink's `pipeline.max-parallelism` default for small jobs).
pub const DEFAULT_MAX_PARALLELISM: u32 = 128;

/// Where a [`StableKey`] writes its encoding: the hasher, or a byte buffer (to look at it).
pub trait KeyEncoder {
    /// Appends raw bytes to the encoding.
    fn write(&mut self, bytes: &[u8]);

    /// Appends a length or count (`u64`, little-endian).
    fn write_len(&mut self, len: usize) {
        self.write(&(len as u64).to_le_bytes());
    }
}

impl KeyEncoder for Vec<u8> {
    fn write(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// A key type with a stable byte encoding (see the module documentation): the encoding, not
/// `Hash`, decides a key's key group.
///
/// ```
/// use cairn::state::keygroup::{KeyEncoder, StableKey};
///
/// #[derive(Clone, PartialEq, Eq, Hash)]
/// struct Account { bank: u16, number: String }
///
/// impl StableKey for Account {
///     fn encode<E: KeyEncoder>(&self, out: &mut E) {
///         self.bank.encode(out);
///         self.number.encode(out);
///     }
/// }
/// ```
pub trait StableKey {
    /// Writes the key's encoding.
    fn encode<E: KeyEncoder>(&self, out: &mut E);
}

macro_rules! fixed_width {
    ($($t:ty),*) => {$(
        impl StableKey for $t {
            #[inline]
            fn encode<E: KeyEncoder>(&self, out: &mut E) {
                out.write(&self.to_le_bytes());
            }
        }
    )*};
}
fixed_width!(u8, u16, u32, u64, u128, i8, i16, i32, i64, i128);

impl StableKey for usize {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        (*self as u64).encode(out);
    }
}

impl StableKey for isize {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        (*self as i64).encode(out);
    }
}

impl StableKey for bool {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        out.write(&[u8::from(*self)]);
    }
}

impl StableKey for char {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        u32::from(*self).encode(out);
    }
}

impl StableKey for str {
    #[inline]
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        out.write_len(self.len());
        out.write(self.as_bytes());
    }
}

impl StableKey for String {
    #[inline]
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        self.as_str().encode(out);
    }
}

impl StableKey for CompactString {
    #[inline]
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        self.as_str().encode(out);
    }
}

impl<T: StableKey> StableKey for [T] {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        out.write_len(self.len());
        for x in self {
            x.encode(out);
        }
    }
}

impl<T: StableKey> StableKey for Vec<T> {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        self.as_slice().encode(out);
    }
}

impl<T: StableKey, const N: usize> StableKey for [T; N] {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        self.as_slice().encode(out);
    }
}

impl<T: StableKey> StableKey for Option<T> {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        match self {
            None => out.write(&[0]),
            Some(x) => {
                out.write(&[1]);
                x.encode(out);
            }
        }
    }
}

impl<T: StableKey + ?Sized> StableKey for &T {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        (**self).encode(out);
    }
}

macro_rules! tuple {
    ($($n:tt $t:ident),*) => {
        impl<$($t: StableKey),*> StableKey for ($($t,)*) {
            #[allow(unused_variables)]
            fn encode<E: KeyEncoder>(&self, out: &mut E) {
                $(self.$n.encode(out);)*
            }
        }
    };
}
tuple!();
tuple!(0 A);
tuple!(0 A, 1 B);
tuple!(0 A, 1 B, 2 C);
tuple!(0 A, 1 B, 2 C, 3 D);
tuple!(0 A, 1 B, 2 C, 3 D, 4 F);
tuple!(0 A, 1 B, 2 C, 3 D, 4 F, 5 G);

/// 64-bit FNV-1a over a key's encoding, finished with `fmix64`: fixed forever for the same key.
#[derive(Debug, Clone, Copy)]
pub struct StableHasher(u64);

impl Default for StableHasher {
    fn default() -> Self {
        StableHasher(0xcbf2_9ce4_8422_2325)
    }
}

impl StableHasher {
    /// The hash of everything written so far.
    pub fn finish(&self) -> u64 {
        fmix64(self.0)
    }
}

impl KeyEncoder for StableHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
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

/// The stable hash of a key: of its [`StableKey`] encoding.
#[inline]
pub fn stable_hash<K: StableKey + ?Sized>(key: &K) -> u64 {
    let mut h = StableHasher::default();
    key.encode(&mut h);
    h.finish()
}

/// The bytes of a key's stable encoding.
pub fn encoded<K: StableKey + ?Sized>(key: &K) -> Vec<u8> {
    let mut out = Vec::new();
    key.encode(&mut out);
    out
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
    fn the_encoding_is_the_documented_one() {
        let len = |n: u64| n.to_le_bytes().to_vec();
        assert_eq!(encoded("ab"), [len(2), b"ab".to_vec()].concat());
        assert_eq!(encoded(&vec![1u8, 2]), [len(2), vec![1, 2]].concat());
        assert_eq!(encoded("ab"), encoded(&b"ab".to_vec()));
        assert_eq!(encoded(&CompactString::from("ab")), encoded("ab"));
        assert_eq!(encoded(&-2i16), vec![0xfe, 0xff]);
        assert_eq!(encoded(&7usize), encoded(&7u64));
        assert_eq!(encoded(&'é'), 0xe9u32.to_le_bytes().to_vec());
        assert_eq!(encoded(&(true, Some(3u8), None::<u8>)), vec![1, 1, 3, 0]);
        assert_eq!(encoded(&[5u16; 2]), [len(2), vec![5, 0, 5, 0]].concat());
        // Lengths keep tuples apart that plain concatenation would confuse.
        assert_ne!(encoded(&("a", "bc")), encoded(&("ab", "c")));
    }

    /// Golden vectors: (encoding of the key, its hash, its key group of 128). Changing any of
    /// them breaks every savepoint ever taken, so they are pinned forever.
    #[test]
    fn golden_vectors_pin_the_hash_and_key_groups() {
        let cases: Vec<(&str, u64, u64)> = vec![
            // The empty string and 0u64 are both eight zero bytes: keys of one stream share a type.
            ("\"\"", stable_hash(""), GOLDEN[0]),
            ("\"w1\"", stable_hash("w1"), GOLDEN[1]),
            ("\"hello world\"", stable_hash("hello world"), GOLDEN[2]),
            ("0u64", stable_hash(&0u64), GOLDEN[3]),
            ("7u64", stable_hash(&7u64), GOLDEN[4]),
            ("-1i32", stable_hash(&-1i32), GOLDEN[5]),
            ("u128::MAX", stable_hash(&u128::MAX), GOLDEN[6]),
            (
                "(\"user\", 42u32)",
                stable_hash(&("user", 42u32)),
                GOLDEN[7],
            ),
            ("[1u8, 2, 3]", stable_hash(&[1u8, 2, 3]), GOLDEN[8]),
            ("Some('x')", stable_hash(&Some('x')), GOLDEN[9]),
        ];
        let mut failed = Vec::new();
        for (name, got, want) in &cases {
            if got != want {
                failed.push(format!("{name}: {got:#018x}, pinned {want:#018x}"));
            }
        }
        assert!(
            failed.is_empty(),
            "the stable hash changed:\n{}",
            failed.join("\n")
        );
        let groups: Vec<u32> = cases
            .iter()
            .map(|(_, h, _)| key_group_of_hash(*h, 128))
            .collect();
        assert_eq!(groups, GOLDEN_GROUPS_128);
        assert_eq!(stable_hash("w1"), stable_hash(&String::from("w1")));
        let spread: std::collections::HashSet<u32> = (0..10_000)
            .map(|i| key_group_of_hash(stable_hash(&format!("w{i}")), 128))
            .collect();
        assert_eq!(spread.len(), 128);
    }

    const GOLDEN: [u64; 10] = [
        0x7bd3_144f_29c0_cc9e,
        0xbf05_0a2c_f87d_7aa6,
        0xf0d3_1986_0c02_7754,
        0x7bd3_144f_29c0_cc9e,
        0xc211_2d51_b876_518d,
        0x5dbe_b358_e39c_496d,
        0xb985_182d_97d9_d96f,
        0xf7f9_4f4b_3506_014a,
        0xc61f_a591_0076_2920,
        0xcb4d_c172_30ef_5dc5,
    ];
    const GOLDEN_GROUPS_128: [u32; 10] = [30, 38, 84, 30, 13, 109, 111, 74, 32, 69];
}
