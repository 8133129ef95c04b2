//! Event time: watermark strategies at the sources and the combination of watermarks over a
//! task's input channels.
//!
//! A watermark `t` on a channel promises that no record with a timestamp `<= t` follows on it.
//! Watermarks travel in band (`Element::Watermark`), so they never overtake the records before
//! them, and are parked with them while a channel is blocked for alignment. A task's watermark
//! is the minimum over its input channels that are not idle ([`WatermarkValve`]); it only ever
//! grows. A source subtask derives its watermark from the timestamps of the records of each of
//! its splits ([`SourceWatermarks`]): the minimum over its splits, emitted periodically
//! (`pipeline.auto-watermark-interval`) and in front of every checkpoint barrier (so that the
//! watermark a checkpoint records covers every record read before it), and `i64::MAX` once
//! every split is read to its end.
//!
//! Watermarks are not persisted with in-flight data: after a restore a source emits the
//! watermark it had reached at the checkpoint (the smallest one of the subtasks restored into
//! it), after any channel state is replayed, and a timer that had fired is gone from the
//! restored state, so nothing fires twice and nothing is skipped.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// The smallest watermark: nothing is known about event time yet.
pub const WATERMARK_MIN: i64 = i64::MIN;
/// The watermark of an input that ended: every timer fires.
pub const WATERMARK_MAX: i64 = i64::MAX;

/// A record's event time in milliseconds since the epoch.
pub type TimestampFn<T> = Arc<dyn Fn(&T) -> i64 + Send + Sync>;

/// How watermarks follow the timestamps a source split produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkGenerator {
    /// Timestamps only grow: the watermark is the largest timestamp seen, minus 1 ms.
    Monotonous,
    /// Records may arrive up to this much later than a larger timestamp: the watermark is the
    /// largest timestamp seen minus the bound minus 1 ms.
    BoundedOutOfOrderness(Duration),
}

/// Timestamps and watermarks of a stream (Flink's `WatermarkStrategy`).
pub struct WatermarkStrategy<T> {
    /// The event time of a record.
    pub timestamp: TimestampFn<T>,
    /// How watermarks follow the timestamps.
    pub generator: WatermarkGenerator,
    /// A split that produced nothing for this long does not hold back the watermark.
    pub idleness: Option<Duration>,
}

impl<T> Clone for WatermarkStrategy<T> {
    fn clone(&self) -> Self {
        WatermarkStrategy {
            timestamp: self.timestamp.clone(),
            generator: self.generator,
            idleness: self.idleness,
        }
    }
}

impl<T> WatermarkStrategy<T> {
    /// Timestamps that only grow.
    pub fn monotonous(timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static) -> Self {
        WatermarkStrategy {
            timestamp: Arc::new(timestamp),
            generator: WatermarkGenerator::Monotonous,
            idleness: None,
        }
    }

    /// Timestamps out of order by at most `bound`.
    pub fn bounded_out_of_orderness(
        bound: Duration,
        timestamp: impl Fn(&T) -> i64 + Send + Sync + 'static,
    ) -> Self {
        WatermarkStrategy {
            timestamp: Arc::new(timestamp),
            generator: WatermarkGenerator::BoundedOutOfOrderness(bound),
            idleness: None,
        }
    }

    /// A split without records for `timeout` is idle: it does not hold back the watermark.
    pub fn with_idleness(mut self, timeout: Duration) -> Self {
        self.idleness = Some(timeout);
        self
    }
}

impl WatermarkGenerator {
    /// The watermark after the largest timestamp `max_ts` (None: nothing seen).
    fn watermark(self, max_ts: Option<i64>) -> i64 {
        let Some(ts) = max_ts else {
            return WATERMARK_MIN;
        };
        let lag = match self {
            WatermarkGenerator::Monotonous => 0,
            WatermarkGenerator::BoundedOutOfOrderness(d) => {
                i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
            }
        };
        ts.saturating_sub(lag).saturating_sub(1)
    }
}

/// What a source subtask should emit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WatermarkOutput {
    /// A new watermark.
    Watermark(i64),
    /// Every split is idle.
    Idle,
}

#[derive(Debug, Clone)]
struct SplitClock {
    max_ts: Option<i64>,
    last_record: Instant,
    finished: bool,
}

/// The watermark of one source subtask over its splits.
#[derive(Debug)]
pub struct SourceWatermarks {
    generator: WatermarkGenerator,
    idleness: Option<Duration>,
    interval: Duration,
    splits: Vec<SplitClock>,
    /// The last watermark emitted (or restored).
    emitted: i64,
    idle: bool,
    next_emit: Instant,
}

impl SourceWatermarks {
    /// Watermarks over `splits` splits, emitted every `interval`, starting at `restored`.
    pub fn new(
        generator: WatermarkGenerator,
        idleness: Option<Duration>,
        interval: Duration,
        splits: usize,
        restored: i64,
        now: Instant,
    ) -> Self {
        let clock = SplitClock {
            max_ts: None,
            last_record: now,
            finished: false,
        };
        SourceWatermarks {
            generator,
            idleness,
            interval,
            splits: vec![clock; splits],
            emitted: restored,
            idle: false,
            next_emit: now,
        }
    }

    /// The watermark emitted last (what a checkpoint records).
    pub fn current(&self) -> i64 {
        self.emitted
    }

    /// The source now has `count` splits (it found new ones): each new split holds back the
    /// watermark from `now` on until it produces records or turns idle. Never shrinks.
    pub fn ensure_splits(&mut self, count: usize, now: Instant) {
        if count > self.splits.len() {
            let clock = SplitClock {
                max_ts: None,
                last_record: now,
                finished: false,
            };
            self.splits.resize(count, clock);
        }
    }

    /// Split `split` produced a record with timestamp `ts`.
    #[inline]
    pub fn on_record(&mut self, split: usize, ts: i64) {
        if let Some(s) = self.splits.get_mut(split) {
            s.max_ts = Some(s.max_ts.map_or(ts, |m| m.max(ts)));
        }
    }

    /// Split `split` produced records at `now` (once per batch, not per record).
    pub fn on_batch(&mut self, split: usize, now: Instant) {
        if let Some(s) = self.splits.get_mut(split) {
            s.last_record = now;
        }
    }

    /// Split `split` is read to its end: it no longer holds back the watermark.
    pub fn on_split_finished(&mut self, split: usize) {
        if let Some(s) = self.splits.get_mut(split) {
            s.finished = true;
        }
    }

    /// Whether the periodic emission is due.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_emit
    }

    /// The periodic emission: a watermark if it advanced, idleness if every split is idle.
    pub fn emit(&mut self, now: Instant) -> Option<WatermarkOutput> {
        self.next_emit = now + self.interval;
        let mut min: Option<i64> = None;
        let mut all_idle = true;
        let mut any_open = false;
        for s in &self.splits {
            if s.finished {
                continue;
            }
            any_open = true;
            let idle = self
                .idleness
                .is_some_and(|t| now.saturating_duration_since(s.last_record) >= t);
            if idle {
                continue;
            }
            all_idle = false;
            let w = self.generator.watermark(s.max_ts);
            min = Some(min.map_or(w, |m: i64| m.min(w)));
        }
        if !any_open {
            return self.advance(WATERMARK_MAX);
        }
        if all_idle {
            if self.idle {
                return None;
            }
            self.idle = true;
            return Some(WatermarkOutput::Idle);
        }
        match min {
            Some(w) => self.advance(w),
            None => None,
        }
    }

    /// Every split ended: the maximum watermark (once).
    pub fn end(&mut self) -> Option<WatermarkOutput> {
        self.advance(WATERMARK_MAX)
    }

    fn advance(&mut self, w: i64) -> Option<WatermarkOutput> {
        if w > self.emitted || (self.idle && w >= self.emitted && w > WATERMARK_MIN) {
            self.idle = false;
            self.emitted = self.emitted.max(w);
            return Some(WatermarkOutput::Watermark(self.emitted));
        }
        None
    }
}

/// Combines the watermarks of a task's input channels: the minimum over the channels that are
/// not idle, never going back.
#[derive(Debug, Clone)]
pub struct WatermarkValve {
    channels: Vec<ChannelClock>,
    /// The combined watermark output last.
    current: i64,
    /// Whether the task told its outputs it is idle.
    idle: bool,
}

#[derive(Debug, Clone, Copy)]
struct ChannelClock {
    watermark: i64,
    idle: bool,
}

impl WatermarkValve {
    /// A valve over `channels` input channels, none heard from.
    pub fn new(channels: usize) -> Self {
        WatermarkValve {
            channels: vec![
                ChannelClock {
                    watermark: WATERMARK_MIN,
                    idle: false,
                };
                channels
            ],
            current: WATERMARK_MIN,
            idle: false,
        }
    }

    /// The task's watermark.
    pub fn current(&self) -> i64 {
        self.current
    }

    /// Channel `ch` delivered watermark `w`: the task's new watermark if it advanced.
    pub fn on_watermark(&mut self, ch: usize, w: i64) -> Option<WatermarkOutput> {
        let c = self.channels.get_mut(ch)?;
        c.idle = false;
        c.watermark = c.watermark.max(w);
        self.combine()
    }

    /// Channel `ch` went idle: the watermark may advance without it, or the task is idle.
    pub fn on_idle(&mut self, ch: usize) -> Option<WatermarkOutput> {
        self.channels.get_mut(ch)?.idle = true;
        self.combine()
    }

    /// Channel `ch` delivered records: it is active again (its watermark counts once it
    /// catches up, since the task's watermark never goes back).
    #[inline]
    pub fn on_records(&mut self, ch: usize) {
        if let Some(c) = self.channels.get_mut(ch) {
            c.idle = false;
        }
    }

    fn combine(&mut self) -> Option<WatermarkOutput> {
        let active = self.channels.iter().filter(|c| !c.idle);
        let min = active.map(|c| c.watermark).min();
        match min {
            None => {
                if self.idle {
                    return None;
                }
                self.idle = true;
                Some(WatermarkOutput::Idle)
            }
            Some(w) if w > self.current => {
                self.idle = false;
                self.current = w;
                Some(WatermarkOutput::Watermark(w))
            }
            Some(_) if self.idle => {
                // Active again, but behind: tell the outputs so they stop treating us as idle.
                self.idle = false;
                (self.current > WATERMARK_MIN).then_some(WatermarkOutput::Watermark(self.current))
            }
            Some(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use WatermarkOutput::{Idle, Watermark};

    #[test]
    fn the_task_watermark_is_the_minimum_over_its_channels() {
        let mut v = WatermarkValve::new(3);
        assert_eq!(v.on_watermark(0, 10), None);
        assert_eq!(v.on_watermark(1, 5), None);
        assert_eq!(v.on_watermark(2, 7), Some(Watermark(5)));
        assert_eq!(v.on_watermark(1, 20), Some(Watermark(7)));
        // A watermark going back on one channel changes nothing.
        assert_eq!(v.on_watermark(2, 3), None);
        assert_eq!(v.on_watermark(2, 30), Some(Watermark(10)));
        assert_eq!(v.current(), 10);
    }

    #[test]
    fn an_idle_channel_does_not_hold_back_the_watermark() {
        let mut v = WatermarkValve::new(2);
        v.on_watermark(0, 100);
        assert_eq!(v.on_idle(1), Some(Watermark(100)));
        assert_eq!(v.on_watermark(0, 150), Some(Watermark(150)));
        // Channel 1 wakes up behind: the watermark does not go back; it counts once it catches up.
        assert_eq!(v.on_watermark(1, 120), None);
        assert_eq!(v.on_watermark(0, 200), None);
        assert_eq!(v.on_watermark(1, 180), Some(Watermark(180)));
    }

    #[test]
    fn all_channels_idle_makes_the_task_idle_once() {
        let mut v = WatermarkValve::new(2);
        v.on_watermark(0, 10);
        v.on_watermark(1, 10);
        assert_eq!(v.on_idle(0), None);
        assert_eq!(v.on_idle(1), Some(Idle));
        assert_eq!(v.on_idle(1), None);
        // Back, behind the watermark: the outputs hear the current one again.
        assert_eq!(v.on_watermark(0, 5), Some(Watermark(10)));
    }

    #[test]
    fn a_channel_read_to_its_end_releases_the_watermark_with_its_maximum() {
        let mut v = WatermarkValve::new(2);
        v.on_watermark(0, 10);
        assert_eq!(v.on_watermark(1, WATERMARK_MAX), Some(Watermark(10)));
        assert_eq!(
            v.on_watermark(0, WATERMARK_MAX),
            Some(Watermark(WATERMARK_MAX))
        );
    }

    fn gen(bound_ms: u64, splits: usize, t0: Instant) -> SourceWatermarks {
        SourceWatermarks::new(
            WatermarkGenerator::BoundedOutOfOrderness(Duration::from_millis(bound_ms)),
            Some(Duration::from_secs(1)),
            Duration::from_millis(200),
            splits,
            WATERMARK_MIN,
            t0,
        )
    }

    #[test]
    fn a_source_watermark_is_the_minimum_over_its_splits_minus_the_bound() {
        let t0 = Instant::now();
        let mut w = gen(100, 2, t0);
        w.on_record(0, 1_000);
        w.on_batch(0, t0);
        // Split 1 has produced nothing and is not idle yet: nothing is known.
        assert_eq!(w.emit(t0), None);
        w.on_record(1, 500);
        w.on_batch(1, t0);
        assert_eq!(w.emit(t0), Some(Watermark(399)));
        assert!(!w.due(t0 + Duration::from_millis(199)));
        assert!(w.due(t0 + Duration::from_millis(200)));
        // Split 1 stops producing: once idle it no longer holds back the watermark.
        let later = t0 + Duration::from_millis(1500);
        w.on_record(0, 2_000);
        w.on_batch(0, later);
        assert_eq!(w.emit(later), Some(Watermark(1899)));
        // Both idle: the source is idle, once.
        let much_later = later + Duration::from_secs(2);
        assert_eq!(w.emit(much_later), Some(Idle));
        assert_eq!(w.emit(much_later), None);
        // Finished splits release the watermark entirely.
        w.on_split_finished(0);
        w.on_split_finished(1);
        assert_eq!(w.emit(much_later), Some(Watermark(WATERMARK_MAX)));
        assert_eq!(w.end(), None);
    }

    #[test]
    fn a_split_found_later_holds_back_the_watermark_until_it_produces() {
        let t0 = Instant::now();
        let mut w = gen(0, 1, t0);
        w.on_record(0, 1_000);
        w.on_batch(0, t0);
        assert_eq!(w.emit(t0), Some(Watermark(999)));
        w.ensure_splits(2, t0);
        w.on_record(0, 2_000);
        w.on_batch(0, t0);
        // The new split has produced nothing and is not idle yet.
        assert_eq!(w.emit(t0 + Duration::from_millis(200)), None);
        w.on_record(1, 1_500);
        w.on_batch(1, t0);
        assert_eq!(
            w.emit(t0 + Duration::from_millis(400)),
            Some(Watermark(1_499))
        );
        // Never shrinks: split 1 still counts.
        w.ensure_splits(1, t0);
        w.on_record(0, 3_000);
        w.on_batch(0, t0);
        assert_eq!(w.emit(t0 + Duration::from_millis(600)), None);
    }

    #[test]
    fn a_restored_source_never_goes_back() {
        let t0 = Instant::now();
        let mut w = SourceWatermarks::new(
            WatermarkGenerator::Monotonous,
            None,
            Duration::from_millis(200),
            1,
            5_000,
            t0,
        );
        w.on_record(0, 4_000);
        assert_eq!(w.emit(t0), None);
        assert_eq!(w.current(), 5_000);
        w.on_record(0, 6_000);
        assert_eq!(w.emit(t0), Some(Watermark(5_999)));
        assert_eq!(w.end(), Some(Watermark(WATERMARK_MAX)));
    }
}
