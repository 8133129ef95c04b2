//! Joins in time of two keyed streams: the interval join (each left record with the right
//! records whose time is within `[left + lower, left + upper]`) and the window co-group / join
//! (both sides of each aligned window, evaluated when event time passes its end). Both keep
//! their buffers in keyed state and clean them up with event-time timers, so they are restored,
//! rescaled and exactly once like any keyed state.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use crate::error::{TaskError, TaskResult};
use crate::runtime::functions::{Collector, KeyedCoProcessFunction};
use crate::state::{Key, KeyedContext, StateValue, TimeDomain, ValueState};

use super::{TimeWindow, WindowAssigner};

/// Records by timestamp.
type Buffer<T> = BTreeMap<i64, Vec<T>>;
/// Both sides' records of a key, by window start.
type WindowSides<L, R> = BTreeMap<i64, (Vec<L>, Vec<R>)>;

/// What an interval join emits for a matching pair.
pub type JoinFn<L, R, O> = Arc<dyn Fn(&L, &R, &mut Collector<O>) + Send + Sync>;

fn timestamp<K: Key>(ctx: &KeyedContext<K>) -> TaskResult<i64> {
    ctx.timestamp().ok_or_else(|| {
        TaskError::Unrecoverable(
            "a join in time on a stream without timestamps: assign them at the source or with with_timestamps".into(),
        )
    })
}

/// The interval join of a keyed left and right stream (Flink's `intervalJoin`): every pair
/// with `left.ts + lower <= right.ts <= left.ts + upper`, emitted once, whichever came first.
/// Records behind the watermark are dropped, as in Flink.
pub struct IntervalJoin<L, R, O> {
    lower: i64,
    upper: i64,
    f: JoinFn<L, R, O>,
    left: Option<ValueState<Buffer<L>>>,
    right: Option<ValueState<Buffer<R>>>,
}

impl<L, R, O> Clone for IntervalJoin<L, R, O> {
    fn clone(&self) -> Self {
        IntervalJoin {
            lower: self.lower,
            upper: self.upper,
            f: self.f.clone(),
            left: self.left.clone(),
            right: self.right.clone(),
        }
    }
}

impl<L, R, O> IntervalJoin<L, R, O> {
    /// Joins pairs within `[lower, upper]` ms of the left record's time.
    pub fn new(lower: i64, upper: i64, f: JoinFn<L, R, O>) -> Result<Self, String> {
        if lower > upper {
            return Err(format!(
                "an interval join's lower bound ({lower} ms) must not exceed its upper bound ({upper} ms)"
            ));
        }
        Ok(IntervalJoin {
            lower,
            upper,
            f,
            left: None,
            right: None,
        })
    }
}

fn opened<V>(s: &Option<V>) -> TaskResult<&V> {
    s.as_ref()
        .ok_or_else(|| TaskError::msg("join state used before open"))
}

impl<K: Key, L: StateValue, R: StateValue, O: Send + 'static> KeyedCoProcessFunction<K, L, R, O>
    for IntervalJoin<L, R, O>
{
    fn open(&mut self, ctx: &mut KeyedContext<K>) -> TaskResult {
        self.left = Some(ctx.value_state("interval-join-left")?);
        self.right = Some(ctx.value_state("interval-join-right")?);
        Ok(())
    }

    fn process1(&mut self, l: L, ctx: &mut KeyedContext<K>, out: &mut Collector<O>) -> TaskResult {
        let ts = timestamp(ctx)?;
        if ts < ctx.current_watermark() {
            return Ok(());
        }
        if let Some(rights) = opened(&self.right)?.value(ctx)? {
            let (from, to) = (ts.saturating_add(self.lower), ts.saturating_add(self.upper));
            for (_, rs) in rights.range(from..=to) {
                for r in rs {
                    (self.f)(&l, r, out);
                }
            }
        }
        let left = opened(&self.left)?.clone();
        left.get_mut(ctx, BTreeMap::new)?
            .entry(ts)
            .or_default()
            .push(l);
        // A later right record is newer than the watermark: it can match only while
        // the watermark is below ts + upper.
        ctx.register_event_time_timer(ts.saturating_add(self.upper))
    }

    fn process2(&mut self, r: R, ctx: &mut KeyedContext<K>, out: &mut Collector<O>) -> TaskResult {
        let ts = timestamp(ctx)?;
        if ts < ctx.current_watermark() {
            return Ok(());
        }
        if let Some(lefts) = opened(&self.left)?.value(ctx)? {
            let (from, to) = (ts.saturating_sub(self.upper), ts.saturating_sub(self.lower));
            for (_, ls) in lefts.range(from..=to) {
                for l in ls {
                    (self.f)(l, &r, out);
                }
            }
        }
        let right = opened(&self.right)?.clone();
        right
            .get_mut(ctx, BTreeMap::new)?
            .entry(ts)
            .or_default()
            .push(r);
        ctx.register_event_time_timer(ts.saturating_sub(self.lower))
    }

    fn on_timer(
        &mut self,
        time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<K>,
        _out: &mut Collector<O>,
    ) -> TaskResult {
        let (left, right) = (opened(&self.left)?.clone(), opened(&self.right)?.clone());
        let upper = self.upper;
        let lower = self.lower;
        let lefts = left.get_mut(ctx, BTreeMap::new)?;
        lefts.retain(|ts, _| ts.saturating_add(upper) > time);
        let left_empty = lefts.is_empty();
        let rights = right.get_mut(ctx, BTreeMap::new)?;
        rights.retain(|ts, _| ts.saturating_sub(lower) > time);
        let right_empty = rights.is_empty();
        if left_empty {
            left.clear(ctx)?;
        }
        if right_empty {
            right.clear(ctx)?;
        }
        Ok(())
    }
}

/// What a window co-group emits for one key and window: both sides' records (either may be
/// empty, but not both).
pub type CoGroupFn<K, L, R, O> =
    Arc<dyn Fn(&K, TimeWindow, &[L], &[R], &mut Collector<O>) + Send + Sync>;

/// The window co-group of two keyed streams on tumbling or sliding event-time windows
/// (Flink's `coGroup(...).where(...).equalTo(...).window(...)`); a window join is the co-group
/// that emits every pair.
pub struct WindowCoGroup<K, L, R, O> {
    assigner: WindowAssigner,
    f: CoGroupFn<K, L, R, O>,
    windows: Option<ValueState<WindowSides<L, R>>>,
    _k: PhantomData<fn() -> K>,
}

impl<K, L, R, O> Clone for WindowCoGroup<K, L, R, O> {
    fn clone(&self) -> Self {
        WindowCoGroup {
            assigner: self.assigner,
            f: self.f.clone(),
            windows: self.windows.clone(),
            _k: PhantomData,
        }
    }
}

impl<K, L, R, O> WindowCoGroup<K, L, R, O> {
    /// Co-groups both sides per window of `assigner` (tumbling or sliding, event time).
    pub fn new(assigner: WindowAssigner, f: CoGroupFn<K, L, R, O>) -> Result<Self, String> {
        assigner.validate()?;
        if assigner.aligned_geometry().is_none() || assigner.domain() != TimeDomain::EventTime {
            return Err("a window join needs tumbling or sliding event-time windows".into());
        }
        Ok(WindowCoGroup {
            assigner,
            f,
            windows: None,
            _k: PhantomData,
        })
    }

    fn add<Kk: Key>(
        &self,
        ctx: &mut KeyedContext<Kk>,
        put: impl Fn(&mut (Vec<L>, Vec<R>)),
    ) -> TaskResult
    where
        L: StateValue,
        R: StateValue,
    {
        let ts = timestamp(ctx)?;
        let (size, slide, offset) = self
            .assigner
            .aligned_geometry()
            .ok_or_else(|| TaskError::msg("window join without aligned windows"))?;
        let last = ts - (ts - offset).rem_euclid(slide);
        let wm = ctx.current_watermark();
        let state = opened(&self.windows)?.clone();
        let mut start = last;
        while start > ts - size {
            let end = start + size;
            // Windows the watermark passed already are complete: the record is late there.
            if end - 1 > wm {
                put(state.get_mut(ctx, BTreeMap::new)?.entry(start).or_default());
                ctx.register_event_time_timer(end - 1)?;
            }
            start -= slide;
        }
        Ok(())
    }
}

impl<K: Key, L: StateValue, R: StateValue, O: Send + 'static> KeyedCoProcessFunction<K, L, R, O>
    for WindowCoGroup<K, L, R, O>
{
    fn open(&mut self, ctx: &mut KeyedContext<K>) -> TaskResult {
        self.windows = Some(ctx.value_state("window-join")?);
        Ok(())
    }

    fn process1(&mut self, l: L, ctx: &mut KeyedContext<K>, _out: &mut Collector<O>) -> TaskResult {
        self.add(ctx, |w| w.0.push(l.clone()))
    }

    fn process2(&mut self, r: R, ctx: &mut KeyedContext<K>, _out: &mut Collector<O>) -> TaskResult {
        self.add(ctx, |w| w.1.push(r.clone()))
    }

    fn on_timer(
        &mut self,
        time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<O>,
    ) -> TaskResult {
        let Some((size, _, _)) = self.assigner.aligned_geometry() else {
            return Ok(());
        };
        let start = time + 1 - size;
        let state = opened(&self.windows)?.clone();
        let key = ctx
            .current_key()
            .cloned()
            .ok_or_else(|| TaskError::msg("a window join fired without a key"))?;
        let windows = state.get_mut(ctx, BTreeMap::new)?;
        let sides = windows.remove(&start);
        let empty = windows.is_empty();
        if let Some((ls, rs)) = sides {
            let w = TimeWindow {
                start,
                end: time + 1,
            };
            (self.f)(&key, w, &ls, &rs, out);
        }
        if empty {
            state.clear(ctx)?;
        }
        Ok(())
    }
}
