use std::marker::PhantomData;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::{TaskError, TaskResult};
use crate::runtime::chain::{Source, SourceReader, SourceStatus};

/// Emits `make(i)` for `i` in `0..count`, split over the subtasks, at most `rate_per_sec`
/// records per second in total (0: as fast as possible). Deterministic, so replayable.
pub struct SequenceSource<T> {
    count: u64,
    rate_per_sec: u64,
    make: fn(u64) -> T,
    _t: PhantomData<fn() -> T>,
}

impl<T> SequenceSource<T> {
    /// A source of `count` records made by `make`, throttled to `rate_per_sec` (0: unthrottled).
    pub fn new(count: u64, rate_per_sec: u64, make: fn(u64) -> T) -> Self {
        SequenceSource {
            count,
            rate_per_sec,
            make,
            _t: PhantomData,
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
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<T>>> {
        let splits: Vec<Split> = super::decode_splits("sequence", &splits)?;
        // The rate is for the whole source; each reader gets its splits' share.
        let share: f64 = splits.iter().map(|s| 1.0 / s.of.max(1) as f64).sum();
        Ok(Box::new(SequenceReader {
            splits,
            make: self.make,
            rate: self.rate_per_sec as f64 * share,
            started: Instant::now(),
            emitted: 0,
            last: 0,
        }))
    }
}

struct SequenceReader<T> {
    splits: Vec<Split>,
    make: fn(u64) -> T,
    /// Records per second for this reader (0: unthrottled).
    rate: f64,
    started: Instant,
    emitted: u64,
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
        let mut n = (max as u64).min(split.end - split.next);
        if self.rate > 0.0 {
            let rate = self.rate.max(1.0);
            let allowed = (self.started.elapsed().as_secs_f64() * rate) as u64;
            let budget = allowed.saturating_sub(self.emitted);
            if budget == 0 {
                let next_due = Duration::from_secs_f64((self.emitted + 1) as f64 / rate);
                return Ok(SourceStatus::IdleUntil(self.started + next_due));
            }
            n = n.min(budget);
        }
        for i in split.next..split.next + n {
            out.push((self.make)(i));
        }
        split.next += n;
        self.emitted += n;
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
