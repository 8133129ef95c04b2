use serde::{Deserialize, Serialize};

use crate::error::{TaskError, TaskResult};
use crate::runtime::chain::{Source, SourceReader, SourceStatus};

/// A word: short strings are stored inline, so most words cost no allocation.
pub type Word = compact_str::CompactString;

/// Generates `count` words: record `i` is `w` followed by the decimal of `(i * 7919) mod keys`.
/// Deterministic, so a replay after a failure yields the same records. As fast as it goes:
/// [`super::RateLimited`] paces it.
#[derive(Debug, Clone)]
pub struct GeneratorSource {
    count: u64,
    keys: u64,
}

impl GeneratorSource {
    /// `count` records over `keys` distinct words.
    pub fn new(count: u64, keys: u64) -> Self {
        GeneratorSource {
            count,
            keys: keys.max(1),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Split {
    next: u64,
    end: u64,
}

impl Source<Word> for GeneratorSource {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        let p = u64::from(parallelism.max(1));
        (0..p)
            .map(|i| {
                let split = Split {
                    next: self.count * i / p,
                    end: self.count * (i + 1) / p,
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
    ) -> TaskResult<Box<dyn SourceReader<Word>>> {
        let splits: Vec<Split> = super::decode_splits("generator", &splits)?;
        Ok(Box::new(GeneratorReader {
            keys: self.keys,
            splits,
            current: 0,
        }))
    }
}

struct GeneratorReader {
    keys: u64,
    splits: Vec<Split>,
    current: usize,
}

impl SourceReader<Word> for GeneratorReader {
    fn poll(&mut self, out: &mut Vec<Word>, max: usize) -> TaskResult<SourceStatus> {
        while let Some(split) = self.splits.get_mut(self.current) {
            if split.next >= split.end {
                self.current += 1;
                continue;
            }
            let stop = split.end.min(split.next + max as u64);
            let mut digits = itoa::Buffer::new();
            let mut word = [0u8; 24];
            word[0] = b'w';
            for i in split.next..stop {
                let n = digits.format((i.wrapping_mul(7919)) % self.keys).as_bytes();
                word[1..1 + n.len()].copy_from_slice(n);
                let s = std::str::from_utf8(&word[..1 + n.len()]).map_err(TaskError::msg)?;
                out.push(Word::new(s));
            }
            split.next = stop;
            return Ok(SourceStatus::More);
        }
        Ok(SourceStatus::Exhausted)
    }

    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        super::encode_splits(&self.splits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_follow_the_formula_and_resume_from_a_snapshot() {
        let src = GeneratorSource::new(10, 3);
        let splits = src.create_splits(1).unwrap();
        let mut r = src.create_reader(0, 1, splits).unwrap();
        let mut out = Vec::new();
        r.poll(&mut out, 4).unwrap();
        let expected: Vec<String> = (0..10u64).map(|i| format!("w{}", (i * 7919) % 3)).collect();
        assert_eq!(out, expected[..4]);
        let mut r2 = src.create_reader(0, 1, r.snapshot().unwrap()).unwrap();
        let mut rest = Vec::new();
        while r2.poll(&mut rest, 4).unwrap() == SourceStatus::More {}
        assert_eq!(rest, expected[4..]);
    }
}
