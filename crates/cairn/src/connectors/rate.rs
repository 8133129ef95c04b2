//! Pacing of sources: at most so many records per second.
//!
//! [`Pacer`] is the arithmetic (how many records a reader may emit now, or until when it must
//! wait), shared by the sources that pace themselves; [`RateLimited`] paces any source, as
//! Flink's `RateLimiterStrategy.perSecond` does: the rate is the whole source's, each of its
//! `parallelism` readers gets an equal share. A paced reader never sleeps: it answers
//! [`SourceStatus::IdleUntil`], so its task serves barriers and other mail meanwhile.

use std::time::{Duration, Instant};

use crate::error::TaskResult;
use crate::runtime::chain::{delegate_source_reader, PollRead, Source, SourceReader, SourceStatus};

/// Paces one reader at `rate` records per second from its start on. Time is an argument, so
/// tests need no clock.
#[derive(Debug, Clone)]
pub(crate) struct Pacer {
    /// Records per second (0: unpaced).
    rate: f64,
    started: Instant,
    emitted: u64,
}

impl Pacer {
    /// A pacer for `rate` records per second; 0 paces nothing, any other rate is at least one
    /// record per second.
    pub(crate) fn new(rate: f64, now: Instant) -> Self {
        Pacer {
            rate: if rate > 0.0 { rate.max(1.0) } else { 0.0 },
            started: now,
            emitted: 0,
        }
    }

    /// How many of `max` records the reader may emit at `now`, or the instant before which it
    /// may emit none.
    pub(crate) fn budget(&self, now: Instant, max: u64) -> Result<u64, Instant> {
        if self.rate == 0.0 {
            return Ok(max);
        }
        let elapsed = now.saturating_duration_since(self.started);
        let allowed = (elapsed.as_secs_f64() * self.rate) as u64;
        match allowed.saturating_sub(self.emitted) {
            0 => Err(self.started + Duration::from_secs_f64((self.emitted + 1) as f64 / self.rate)),
            budget => Ok(budget.min(max)),
        }
    }

    /// The reader emitted `n` records.
    pub(crate) fn emitted(&mut self, n: u64) {
        self.emitted += n;
    }
}

/// `inner`, read at most `rate_per_sec` records per second in all (0: as fast as it goes).
pub struct RateLimited<S> {
    inner: S,
    rate_per_sec: u64,
}

impl<S> RateLimited<S> {
    /// Paces `inner` to `rate_per_sec` records per second over all its subtasks.
    pub fn new(inner: S, rate_per_sec: u64) -> Self {
        RateLimited {
            inner,
            rate_per_sec,
        }
    }
}

impl<T: 'static, S: Source<T>> Source<T> for RateLimited<S> {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        self.inner.create_splits(parallelism)
    }

    fn create_reader(
        &self,
        subtask: u32,
        parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<T>>> {
        let inner = self.inner.create_reader(subtask, parallelism, splits)?;
        let share = self.rate_per_sec as f64 / f64::from(parallelism.max(1));
        Ok(Box::new(RateLimitedReader {
            inner,
            pacer: Pacer::new(share, Instant::now()),
        }))
    }
}

struct RateLimitedReader<T> {
    inner: Box<dyn SourceReader<T>>,
    pacer: Pacer,
}

impl<T> SourceReader<T> for RateLimitedReader<T> {
    fn poll(&mut self, out: &mut Vec<T>, max: usize) -> TaskResult<SourceStatus> {
        let max = match self.pacer.budget(Instant::now(), max as u64) {
            Ok(budget) => budget as usize,
            Err(until) => return Ok(SourceStatus::IdleUntil(until)),
        };
        let before = out.len();
        let status = self.inner.poll(out, max)?;
        self.pacer.emitted((out.len() - before) as u64);
        Ok(status)
    }

    fn last_read(&mut self) -> Option<PollRead> {
        self.inner.last_read()
    }

    delegate_source_reader!(inner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connectors::GeneratorSource;

    #[test]
    fn an_unpaced_pacer_allows_everything() {
        let now = Instant::now();
        assert_eq!(Pacer::new(0.0, now).budget(now, 1024), Ok(1024));
    }

    #[test]
    fn a_pacer_holds_back_what_is_not_due_yet() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut p = Pacer::new(10.0, t0);
        // At its start nothing is due; the first record is due a tenth of a second later.
        assert_eq!(p.budget(t0, 5), Err(ms(100)));
        assert_eq!(p.budget(ms(100), 5), Ok(1));
        // A second in, ten records are due, and at most `max` of them are given.
        assert_eq!(p.budget(ms(1000), 4), Ok(4));
        assert_eq!(p.budget(ms(1000), 100), Ok(10));
        p.emitted(10);
        assert_eq!(p.budget(ms(1050), 100), Err(ms(1100)));
        assert_eq!(p.budget(ms(1250), 100), Ok(2));
        // A rate below one record per second is one record per second.
        assert_eq!(Pacer::new(0.2, t0).budget(t0, 1), Err(ms(1000)));
    }

    #[test]
    fn a_paced_reader_idles_until_its_share_is_due_and_keeps_the_inner_position() {
        let source = RateLimited::new(GeneratorSource::new(1_000, 10), 20);
        let splits = source.create_splits(2).unwrap();
        let mut reader = source.create_reader(1, 2, vec![splits[1].clone()]).unwrap();
        let mut out = Vec::new();
        // Its share is 10 records per second: nothing at once.
        let status = reader.poll(&mut out, 512).unwrap();
        assert!(matches!(status, SourceStatus::IdleUntil(_)), "{status:?}");
        assert!(out.is_empty());
        // Its position is the inner reader's: a snapshot resumes an unpaced reader there.
        let resumed = GeneratorSource::new(1_000, 10)
            .create_reader(1, 2, reader.snapshot().unwrap())
            .unwrap();
        let mut all = Vec::new();
        let mut resumed = resumed;
        while !matches!(
            resumed.poll(&mut all, 512).unwrap(),
            SourceStatus::Exhausted
        ) {}
        assert_eq!(all.len(), 500);
    }
}
