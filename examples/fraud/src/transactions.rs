//! The card transactions: a pure function of their index, and the source that reads them.

use serde::{Deserialize, Serialize};

use cairn::runtime::chain::{Source, SourceReader, SourceStatus};
use cairn::{TaskError, TaskResult};

/// The event time of transaction 0: 2024-01-01T00:00:00Z.
pub const BASE_TIME_MS: i64 = 1_704_067_200_000;
/// Event time between two consecutive transactions (of any accounts): ten per second.
pub const SPACING_MS: i64 = 100;

/// A card payment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Transaction {
    /// Its index in the generated sequence (unique).
    pub id: u64,
    /// The card account it was charged to.
    pub account: u64,
    /// The amount in cents.
    pub amount_cents: u64,
    /// When it happened: event time, ms since the epoch.
    pub timestamp_ms: i64,
}

/// SplitMix64's finalizer: a well-mixed hash, the generator's only randomness.
fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Transaction `index` of a run over `accounts` accounts: every field a pure function of the
/// two, so any parallelism and any restore reads the same transactions.
///
/// It happens at `BASE_TIME_MS + index * SPACING_MS` on an account drawn from the index's hash;
/// 12 % of the amounts are small ($0.01 to $0.99), 5 % large ($100.00 to $2,000.00), the rest
/// everyday ($1.00 to $150.00).
///
/// ```
/// use cairn_example_fraud::{transaction, BASE_TIME_MS};
///
/// let t = transaction(3, 10);
/// assert_eq!((t.id, t.timestamp_ms), (3, BASE_TIME_MS + 300));
/// assert!(t.account < 10);
/// assert_eq!(t, transaction(3, 10));
/// ```
pub fn transaction(index: u64, accounts: u64) -> Transaction {
    let h = mix(index);
    let r = mix(h);
    let draw = r >> 8;
    let amount_cents = match r % 100 {
        0..12 => 1 + draw % 99,
        12..17 => 10_000 + draw % 190_001,
        _ => 100 + draw % 14_901,
    };
    let offset = i64::try_from(index)
        .unwrap_or(i64::MAX)
        .saturating_mul(SPACING_MS);
    Transaction {
        id: index,
        account: h % accounts.max(1),
        amount_cents,
        timestamp_ms: BASE_TIME_MS.saturating_add(offset),
    }
}

/// Transactions `0..count` over `accounts` accounts, split by account: split `j` of `p` holds
/// the accounts `a` with `a mod p == j`, as a topic partitioned by account would. So each
/// account's transactions come from one split, in order of index and of event time, and reach
/// the keyed operators downstream in that order (a channel keeps its order), after any restore
/// too: a split's position is the source's state.
///
/// Each reader scans the whole index range and keeps its splits' transactions, which costs a
/// hash per index and reader; the generator is cheap, and no split ever jumps ahead in event
/// time. Pace it with [`cairn::connectors::RateLimited`].
#[derive(Debug, Clone)]
pub struct TransactionSource {
    count: u64,
    accounts: u64,
}

impl TransactionSource {
    /// Transactions `0..count` over `accounts` accounts.
    pub fn new(count: u64, accounts: u64) -> Self {
        TransactionSource {
            count,
            accounts: accounts.max(1),
        }
    }
}

/// A split's accounts and its position in the index range.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Split {
    /// The split holds the accounts `a` with `a % modulus == residue`.
    residue: u64,
    modulus: u64,
    /// The next index to look at.
    next: u64,
    /// One past the last index.
    end: u64,
}

impl Split {
    fn is_done(&self) -> bool {
        self.next >= self.end
    }
}

/// Indices one poll looks at, at most: bounds the time of a poll of a split with few accounts.
const SCAN_INDICES_MAX: u64 = 4096;

impl Source<Transaction> for TransactionSource {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        let p = u64::from(parallelism.max(1));
        (0..p)
            .map(|j| {
                let split = Split {
                    residue: j,
                    modulus: p,
                    next: 0,
                    end: self.count,
                };
                postcard::to_stdvec(&split).map_err(TaskError::msg)
            })
            .collect()
    }

    fn create_reader(
        &self,
        _subtask: u32,
        _parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<Transaction>>> {
        let splits = splits
            .iter()
            .map(|bytes| {
                let split: Split = postcard::from_bytes(bytes).map_err(|e| {
                    TaskError::Unrecoverable(format!(
                        "corrupt transaction source position in checkpoint: {e}"
                    ))
                })?;
                if split.residue >= split.modulus {
                    return Err(TaskError::Unrecoverable(format!(
                        "corrupt transaction source position in checkpoint: residue {} of {}",
                        split.residue, split.modulus
                    )));
                }
                Ok(split)
            })
            .collect::<TaskResult<Vec<Split>>>()?;
        Ok(Box::new(TransactionReader {
            accounts: self.accounts,
            splits,
            last: 0,
        }))
    }
}

struct TransactionReader {
    accounts: u64,
    splits: Vec<Split>,
    /// The split the last poll read from.
    last: usize,
}

impl SourceReader<Transaction> for TransactionReader {
    fn poll(&mut self, out: &mut Vec<Transaction>, max: usize) -> TaskResult<SourceStatus> {
        // The split furthest behind goes first, so that the splits' watermarks advance together.
        let Some((index, split)) = self
            .splits
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| !s.is_done())
            .min_by_key(|(_, s)| s.next)
        else {
            return Ok(SourceStatus::Exhausted);
        };
        self.last = index;
        let stop = split.end.min(split.next.saturating_add(SCAN_INDICES_MAX));
        let mut emitted = 0;
        while split.next < stop && emitted < max {
            let t = transaction(split.next, self.accounts);
            split.next += 1;
            if t.account % split.modulus == split.residue {
                out.push(t);
                emitted += 1;
            }
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        self.splits
            .iter()
            .map(|s| postcard::to_stdvec(s).map_err(TaskError::msg))
            .collect()
    }

    fn last_split(&self) -> usize {
        self.last
    }

    fn split_count(&self) -> usize {
        self.splits.len()
    }

    fn split_finished(&self, index: usize) -> bool {
        self.splits.get(index).is_none_or(Split::is_done)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Reads `reader` to its end.
    fn drain(reader: &mut dyn SourceReader<Transaction>, max: usize) -> Vec<Transaction> {
        let mut out = Vec::new();
        while reader.poll(&mut out, max).unwrap() != SourceStatus::Exhausted {}
        out
    }

    #[test]
    fn every_parallelism_reads_every_transaction_once_each_account_in_order() {
        let (count, accounts) = (5_000, 7);
        for p in 1..=4u32 {
            let source = TransactionSource::new(count, accounts);
            let splits = source.create_splits(p).unwrap();
            let mut seen = Vec::new();
            for (j, split) in splits.into_iter().enumerate() {
                let mut reader = source.create_reader(j as u32, p, vec![split]).unwrap();
                let read = drain(reader.as_mut(), 100);
                // One split per reader: an account's transactions in increasing event time.
                let mut last: HashMap<u64, i64> = HashMap::new();
                for t in &read {
                    assert_eq!(t.account % u64::from(p), j as u64);
                    let before = last.insert(t.account, t.timestamp_ms);
                    assert!(before.is_none_or(|b| b < t.timestamp_ms), "{t:?}");
                }
                seen.extend(read);
            }
            seen.sort_by_key(|t| t.id);
            let expected: Vec<Transaction> = (0..count).map(|i| transaction(i, accounts)).collect();
            assert_eq!(seen, expected, "parallelism {p}");
        }
    }

    #[test]
    fn a_reader_resumes_from_its_snapshot() {
        let source = TransactionSource::new(3_000, 5);
        let splits = source.create_splits(2).unwrap();
        let mut reader = source.create_reader(0, 1, splits).unwrap();
        let mut first = Vec::new();
        for _ in 0..3 {
            reader.poll(&mut first, 64).unwrap();
        }
        let mut resumed = source
            .create_reader(0, 1, reader.snapshot().unwrap())
            .unwrap();
        let mut all = first;
        all.extend(drain(resumed.as_mut(), 64));
        all.sort_by_key(|t| t.id);
        let expected: Vec<Transaction> = (0..3_000).map(|i| transaction(i, 5)).collect();
        assert_eq!(all, expected);
    }

    #[test]
    fn a_corrupt_position_is_unrecoverable() {
        let source = TransactionSource::new(10, 1);
        let bad = postcard::to_stdvec(&Split {
            residue: 3,
            modulus: 2,
            next: 0,
            end: 10,
        })
        .unwrap();
        for splits in [vec![vec![0xff]], vec![bad]] {
            let err = source.create_reader(0, 1, splits).err().unwrap();
            assert!(matches!(err, TaskError::Unrecoverable(_)), "{err}");
        }
    }

    #[test]
    fn amounts_fall_in_their_bands() {
        let (mut small, mut large) = (0, 0);
        for i in 0..100_000 {
            let t = transaction(i, 100);
            assert!((1..=200_000).contains(&t.amount_cents), "{t:?}");
            small += u64::from(t.amount_cents < 100);
            large += u64::from(t.amount_cents > 15_000);
        }
        // 12 % small; above the everyday band, 185/190 of the 5 % large.
        assert!((11_000..13_000).contains(&small), "{small}");
        assert!((4_400..5_300).contains(&large), "{large}");
    }
}
