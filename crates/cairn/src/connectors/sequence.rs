use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::error::{TaskError, TaskResult};
use crate::runtime::chain::{Source, SourceReader, SourceStatus};

use super::rate::Pacer;

/// Emits `make(i)` for `i` in `0..count`, split over the subtasks, at most `rate_per_sec`
/// records per second in total (0: as fast as possible). Deterministic, so replayable.
pub struct SequenceSource<T> {
    count: u64,
    rate_per_sec: u64,
    make: Make<T>,
}

/// Makes record `i`: a pure function of `i`, so that a restored reader makes the same records.
type Make<T> = Arc<dyn Fn(u64) -> T + Send + Sync>;

impl<T: 'static> SequenceSource<T> {
    /// A source of `count` records made by `make`, throttled to `rate_per_sec` (0: unthrottled).
    pub fn new(count: u64, rate_per_sec: u64, make: fn(u64) -> T) -> Self {
        Self::from_fn(count, rate_per_sec, make)
    }

    /// As [`SequenceSource::new`], with a closure that must be a pure function of the index.
    pub fn from_fn(
        count: u64,
        rate_per_sec: u64,
        make: impl Fn(u64) -> T + Send + Sync + 'static,
    ) -> Self {
        SequenceSource {
            count,
            rate_per_sec,
            make: Arc::new(make),
        }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Split {
    next: u64,
    end: u64,
    /// How many splits the source has in all (each split's share of the rate).
    of: u64,
}

impl<T: Send + 'static> Source<T> for SequenceSource<T> {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        let p = u64::from(parallelism.max(1));
        (0..p)
            .map(|i| {
                postcard::to_stdvec(&Split {
                    next: self.count * i / p,
                    end: self.count * (i + 1) / p,
                    of: p,
                })
                .map_err(TaskError::msg)
            })
            .collect()
    }

    fn create_reader(
        &self,
        _subtask: u32,
        _parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<T>>> {
        let splits: Vec<Split> = super::decode_splits("sequence", &splits)?;
        // The rate is for the whole source; each reader gets its splits' share.
        let share: f64 = splits.iter().map(|s| 1.0 / s.of.max(1) as f64).sum();
        Ok(Box::new(SequenceReader {
            splits,
            make: self.make.clone(),
            pacer: Pacer::new(self.rate_per_sec as f64 * share, Instant::now()),
            last: 0,
        }))
    }
}

struct SequenceReader<T> {
    splits: Vec<Split>,
    make: Make<T>,
    pacer: Pacer,
    /// The split the last poll read from.
    last: usize,
}

impl<T: Send> SourceReader<T> for SequenceReader<T> {
    fn poll(&mut self, out: &mut Vec<T>, max: usize) -> TaskResult<SourceStatus> {
        let Some(index) = self.splits.iter().position(|s| s.next < s.end) else {
            return Ok(SourceStatus::Exhausted);
        };
        self.last = index;
        let split = &mut self.splits[index];
        let n = match self.pacer.budget(Instant::now(), max as u64) {
            Ok(budget) => budget.min(split.end - split.next),
            Err(until) => return Ok(SourceStatus::IdleUntil(until)),
        };
        for i in split.next..split.next + n {
            out.push((self.make)(i));
        }
        split.next += n;
        self.pacer.emitted(n);
        Ok(SourceStatus::More)
    }

    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        super::encode_splits(&self.splits)
    }

    fn last_split(&self) -> usize {
        self.last
    }

    fn split_count(&self) -> usize {
        self.splits.len()
    }

    fn split_finished(&self, index: usize) -> bool {
        self.splits.get(index).is_none_or(|s| s.next >= s.end)
    }
}
