//! Windows: tumbling, sliding, cumulative and session windows on event or processing time,
//! evaluated by a keyed operator whose window contents and timers are system state in the
//! checkpoint.
//!
//! A window operator is a [`KeyedProcessFunction`] ([`WindowFunction`]) run by the ordinary
//! keyed operator, so its state is keyed state (per key group: restored, rescaled) and its
//! firings are timers. Per key it keeps *slots*: for a sliding window with the default trigger
//! a slot is a pane (the greatest common divisor of size and slide), shared by every window that
//! covers it, so a record costs one accumulator update whatever size/slide is; a window is
//! evaluated by merging the accumulators of its panes when its timer fires. Cumulative windows
//! (Flink's `CUMULATE`: in each period of `max_size`, the windows `[start, start + step)`,
//! `[start, start + 2 step)`, …, `[start, start + max_size)`) share panes of `step` the same way:
//! a record updates its one pane, a window merges the panes from its period's start to its end,
//! and the period's panes go when its last (full) window is dropped. Otherwise a slot is a
//! window. Session windows keep a sorted list of windows per key and merge them.
//!
//! Firing follows Flink's defaults: event-time windows fire when the watermark passes their
//! end (`max_timestamp = end - 1`); with allowed lateness a record that arrives after that but
//! within the lateness updates the window and fires it again (a late firing); the window is
//! dropped when the watermark passes `max_timestamp + lateness`; a record for a dropped window is
//! late and goes to the side output, if one was asked for. A count trigger fires every n records
//! of a window (not on time); a purging trigger clears a window's contents when it fires.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

pub mod join;

use crate::error::{TaskError, TaskResult};
use crate::runtime::functions::{Collector, KeyedProcessFunction};
use crate::state::{Key, KeyedContext, StateValue, TimeDomain, ValueState};

/// A window: the half-open interval `[start, end)` of ms since the epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TimeWindow {
    /// First instant in the window.
    pub start: i64,
    /// First instant after it.
    pub end: i64,
}

impl TimeWindow {
    /// The largest timestamp in the window: its timer's time.
    pub fn max_timestamp(&self) -> i64 {
        self.end - 1
    }

    fn intersects(&self, other: &TimeWindow) -> bool {
        self.start <= other.end && other.start <= self.end
    }

    fn cover(&self, other: &TimeWindow) -> TimeWindow {
        TimeWindow {
            start: self.start.min(other.start),
            end: self.end.max(other.end),
        }
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// How records are assigned to windows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WindowAssigner {
    shape: Shape,
    domain: TimeDomain,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// Windows of `size` every `slide` (tumbling: slide == size), starting at `offset` mod slide.
    Aligned { size: i64, slide: i64, offset: i64 },
    /// Per period of `size` (starting at `offset` mod size), the windows from its start to
    /// every multiple of `step` in it.
    Cumulate { step: i64, size: i64, offset: i64 },
    /// A window per burst of records less than `gap` apart.
    Session { gap: i64 },
}

impl WindowAssigner {
    /// Tumbling event-time windows of `size`.
    pub fn tumbling(size: Duration) -> Self {
        Self::sliding(size, size)
    }

    /// Sliding event-time windows of `size`, one starting every `slide`.
    pub fn sliding(size: Duration, slide: Duration) -> Self {
        WindowAssigner {
            shape: Shape::Aligned {
                size: ms(size),
                slide: ms(slide),
                offset: 0,
            },
            domain: TimeDomain::EventTime,
        }
    }

    /// Cumulative event-time windows (Flink's `CUMULATE`): periods of `max_size` and, in each,
    /// the windows from the period's start growing by `step` up to the whole period. A record
    /// belongs to every window of its period that ends after it. `max_size` must be a multiple
    /// of `step` ([`validate`](Self::validate)).
    pub fn cumulative(step: Duration, max_size: Duration) -> Self {
        WindowAssigner {
            shape: Shape::Cumulate {
                step: ms(step),
                size: ms(max_size),
                offset: 0,
            },
            domain: TimeDomain::EventTime,
        }
    }

    /// Event-time session windows closed by a `gap` without records of the key.
    pub fn session(gap: Duration) -> Self {
        WindowAssigner {
            shape: Shape::Session { gap: ms(gap) },
            domain: TimeDomain::EventTime,
        }
    }

    /// Aligned windows start at `offset` past multiples of their slide (time zones);
    /// cumulative windows' periods at `offset` past multiples of their max size.
    pub fn with_offset(mut self, offset: Duration) -> Self {
        match &mut self.shape {
            Shape::Aligned {
                offset: o, slide, ..
            } => *o = ms(offset).rem_euclid((*slide).max(1)),
            Shape::Cumulate {
                offset: o, size, ..
            } => *o = ms(offset).rem_euclid((*size).max(1)),
            Shape::Session { .. } => {}
        }
        self
    }

    /// The same windows on processing time (the subtask's wall clock) instead of event time.
    pub fn on_processing_time(mut self) -> Self {
        self.domain = TimeDomain::ProcessingTime;
        self
    }

    /// The clock the windows follow.
    pub fn domain(&self) -> TimeDomain {
        self.domain
    }

    /// Size, slide and offset in ms of tumbling and sliding windows (None: cumulative and
    /// session windows).
    pub fn aligned_geometry(&self) -> Option<(i64, i64, i64)> {
        match self.shape {
            Shape::Aligned {
                size,
                slide,
                offset,
            } => Some((size, slide, offset)),
            Shape::Cumulate { .. } | Shape::Session { .. } => None,
        }
    }

    /// Step, max size and offset in ms of cumulative windows (None: other windows).
    pub fn cumulative_geometry(&self) -> Option<(i64, i64, i64)> {
        match self.shape {
            Shape::Cumulate { step, size, offset } => Some((step, size, offset)),
            Shape::Aligned { .. } | Shape::Session { .. } => None,
        }
    }

    /// Checks the sizes; a one-line error names what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        match self.shape {
            Shape::Aligned { size, slide, .. } if size <= 0 || slide <= 0 => {
                Err("window size and slide must be at least 1 ms".into())
            }
            Shape::Aligned { size, slide, .. } if slide > size => Err(format!(
                "a sliding window's slide ({slide} ms) must not exceed its size ({size} ms)"
            )),
            Shape::Cumulate { step, size, .. } if step <= 0 || size <= 0 => {
                Err("a cumulate window's step and max size must be at least 1 ms".into())
            }
            Shape::Cumulate { step, size, .. } if size % step != 0 => Err(format!(
                "a cumulate window's max size ({size} ms) must be a multiple of its step ({step} ms)"
            )),
            Shape::Session { gap } if gap <= 0 => Err("session gap must be at least 1 ms".into()),
            _ => Ok(()),
        }
    }
}

/// When a window is evaluated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Trigger {
    /// Fire every this many records of the window instead of on time.
    count: Option<u64>,
    /// Clear the window's contents when it fires.
    purge: bool,
}

impl Trigger {
    /// The assigner's own: fire when time passes the window's end (and again per late record).
    pub fn default_for_time() -> Self {
        Trigger::default()
    }

    /// Fire every `n` records of a window.
    pub fn count(n: u64) -> Self {
        Trigger {
            count: Some(n.max(1)),
            purge: false,
        }
    }

    /// `inner`, clearing the window's contents after every firing.
    pub fn purging(inner: Trigger) -> Self {
        Trigger {
            purge: true,
            ..inner
        }
    }
}

pub use crate::state::AggregateFunction;

/// Evaluates a window with its key and bounds (Flink's `ProcessWindowFunction`); `input` is
/// the aggregate (or, for [`CollectAll`], every record of the window).
pub trait ProcessWindowFunction<K, R, O>: Clone + Send + Sync + 'static {
    /// Emits the window's results.
    fn process(&self, key: &K, window: TimeWindow, input: R, out: &mut Collector<O>);
}

impl<K, R, O, F> ProcessWindowFunction<K, R, O> for F
where
    F: Fn(&K, TimeWindow, R, &mut Collector<O>) + Clone + Send + Sync + 'static,
{
    fn process(&self, key: &K, window: TimeWindow, input: R, out: &mut Collector<O>) {
        self(key, window, input, out)
    }
}

/// Keeps every record of a window (a full-window `process`).
pub struct CollectAll<T>(PhantomData<fn() -> T>);

impl<T> Clone for CollectAll<T> {
    fn clone(&self) -> Self {
        CollectAll(PhantomData)
    }
}

impl<T> Default for CollectAll<T> {
    fn default() -> Self {
        CollectAll(PhantomData)
    }
}

impl<T: StateValue + Sync> AggregateFunction<T, Vec<T>> for CollectAll<T> {
    type Acc = Vec<T>;
    fn create(&self) -> Vec<T> {
        Vec::new()
    }
    fn add(&self, acc: &mut Vec<T>, value: T) {
        acc.push(value);
    }
    fn merge(&self, acc: &mut Vec<T>, other: &Vec<T>) {
        acc.extend(other.iter().cloned());
    }
    fn result(&self, acc: &Vec<T>) -> Vec<T> {
        acc.clone()
    }
}

type ReduceFn<T> = Arc<dyn Fn(&T, &T) -> T + Send + Sync>;

/// `reduce` as an aggregation.
pub struct Reduce<T> {
    f: ReduceFn<T>,
}

impl<T> Clone for Reduce<T> {
    fn clone(&self) -> Self {
        Reduce { f: self.f.clone() }
    }
}

impl<T> Reduce<T> {
    /// Folds records with `f`.
    pub fn new(f: impl Fn(&T, &T) -> T + Send + Sync + 'static) -> Self {
        Reduce { f: Arc::new(f) }
    }
}

impl<T: StateValue> AggregateFunction<T, T> for Reduce<T> {
    type Acc = Option<T>;
    fn create(&self) -> Option<T> {
        None
    }
    fn add(&self, acc: &mut Option<T>, value: T) {
        *acc = Some(match acc.take() {
            Some(a) => (self.f)(&a, &value),
            None => value,
        });
    }
    fn merge(&self, acc: &mut Option<T>, other: &Option<T>) {
        if let Some(o) = other {
            self.add(acc, o.clone());
        }
    }
    fn result(&self, acc: &Option<T>) -> T {
        // A slot exists only once a record was added to it.
        acc.clone().expect("a reduced window holds a record")
    }
}

/// The records of a window operator's output: results and, when asked for, late records.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub enum WindowOutput<O, T> {
    /// A window's result.
    Result(O),
    /// A record that came after its windows were dropped.
    Late(T),
}

/// What a window operator emits: its results only ([`ResultsOnly`]), or its results and the
/// records that came too late for their windows ([`WithLate`]).
pub trait Emit<O, T>: Send + Sync + 'static {
    /// The operator's output record.
    type Out: Send + 'static;
    /// A window's result.
    fn result(o: O) -> Self::Out;
    /// A late record (None: dropped).
    fn late(t: T) -> Option<Self::Out>;
}

/// Results only; late records are dropped (Flink's default).
pub struct ResultsOnly;

impl<O: Send + 'static, T> Emit<O, T> for ResultsOnly {
    type Out = O;
    fn result(o: O) -> O {
        o
    }
    fn late(_: T) -> Option<O> {
        None
    }
}

/// Results and late records, as [`WindowOutput`].
pub struct WithLate;

impl<O: Send + 'static, T: Send + 'static> Emit<O, T> for WithLate {
    type Out = WindowOutput<O, T>;
    fn result(o: O) -> Self::Out {
        WindowOutput::Result(o)
    }
    fn late(t: T) -> Option<Self::Out> {
        Some(WindowOutput::Late(t))
    }
}

/// The contents of one slot (pane or window) of a key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Slot<A> {
    acc: A,
    /// Records added since the last (count) firing.
    count: u64,
}

/// Everything a window operator needs to know, for [`WindowFunction`].
#[derive(Debug, Clone, Copy)]
pub struct WindowSpec {
    /// The assigner.
    pub assigner: WindowAssigner,
    /// The trigger.
    pub trigger: Trigger,
    /// How long after its end a window still takes late records (event time).
    pub allowed_lateness: i64,
}

/// The type parameters a window function is generic over, for `PhantomData`.
type Types<K, T, R, O, E> = fn(K, T, E) -> (R, O);

/// A key's slots of aligned windows, by start.
type Slots<A> = BTreeMap<i64, Slot<A>>;
/// A key's session windows, sorted by start.
type Sessions<A> = Vec<(TimeWindow, Slot<A>)>;

/// The window operator's function: assigns, accumulates, fires and cleans up.
pub struct WindowFunction<K, T, R, O, A: AggregateFunction<T, R>, P, E> {
    spec: WindowSpec,
    agg: A,
    process: P,
    /// Aligned windows: the slots of a key by start.
    slots: Option<ValueState<Slots<A::Acc>>>,
    /// Session windows: a key's windows, sorted by start.
    sessions: Option<ValueState<Sessions<A::Acc>>>,
    _p: PhantomData<Types<K, T, R, O, E>>,
}

impl<K, T, R, O, A: AggregateFunction<T, R>, P: Clone, E> Clone
    for WindowFunction<K, T, R, O, A, P, E>
{
    fn clone(&self) -> Self {
        WindowFunction {
            spec: self.spec,
            agg: self.agg.clone(),
            process: self.process.clone(),
            slots: self.slots.clone(),
            sessions: self.sessions.clone(),
            _p: PhantomData,
        }
    }
}

impl<K, T, R, O, A: AggregateFunction<T, R>, P, E> WindowFunction<K, T, R, O, A, P, E> {
    /// A window function aggregating with `agg` and evaluating with `process`.
    pub fn new(spec: WindowSpec, agg: A, process: P) -> Self {
        WindowFunction {
            spec,
            agg,
            process,
            slots: None,
            sessions: None,
            _p: PhantomData,
        }
    }
}

/// Aligned windows: the geometry of slots and windows.
#[derive(Debug, Clone, Copy)]
struct Aligned {
    /// Window size; cumulative windows: the max size, a period.
    size: i64,
    /// Window slide; cumulative windows: the step.
    slide: i64,
    offset: i64,
    /// Slot length: the pane (gcd of size and slide; cumulative windows: the step) when panes
    /// are shared, else the window itself (a slot per window start; cumulative: per end).
    pane: Option<i64>,
    /// Cumulative windows: each period's windows start at its start and end at every step.
    cumulative: bool,
}

fn gcd(a: i64, b: i64) -> i64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

impl Aligned {
    /// The start of the last window (aligned to `period`) at or before `ts`.
    fn floor(&self, ts: i64, period: i64) -> i64 {
        ts - (ts - self.offset).rem_euclid(period)
    }

    /// The windows containing `ts`: latest start first; cumulative windows: earliest end first.
    fn windows_of(&self, ts: i64) -> impl Iterator<Item = TimeWindow> + '_ {
        let last = self.floor(ts, self.slide);
        let period = self.floor(ts, self.size);
        (0..)
            .map(move |i| {
                if self.cumulative {
                    TimeWindow {
                        start: period,
                        end: last + (i + 1) * self.slide,
                    }
                } else {
                    let start = last - i * self.slide;
                    TimeWindow {
                        start,
                        end: start + self.size,
                    }
                }
            })
            .take_while(move |w| {
                if self.cumulative {
                    w.end <= period + self.size
                } else {
                    w.start > ts - self.size
                }
            })
    }

    /// Whether `end` is the end of a window.
    fn is_window_end(&self, end: i64) -> bool {
        if self.cumulative {
            (end - self.offset).rem_euclid(self.slide) == 0
        } else {
            (end - self.offset - self.size).rem_euclid(self.slide) == 0
        }
    }

    /// The window that ends at `end` (a window end).
    fn window_ending(&self, end: i64) -> TimeWindow {
        let start = if self.cumulative {
            self.floor(end - 1, self.size)
        } else {
            end - self.size
        };
        TimeWindow { start, end }
    }

    /// The slot of window `w` when slots are windows: its start; cumulative windows, which
    /// share their period's start: its end.
    fn slot_of(&self, w: &TimeWindow) -> i64 {
        if self.cumulative {
            w.end
        } else {
            w.start
        }
    }
}

impl<K, T, R, O, A, P, E> WindowFunction<K, T, R, O, A, P, E>
where
    K: Key,
    T: StateValue,
    A: AggregateFunction<T, R>,
    P: ProcessWindowFunction<K, R, O>,
    E: Emit<O, T>,
{
    fn aligned(&self) -> Option<Aligned> {
        match self.spec.assigner.shape {
            Shape::Aligned {
                size,
                slide,
                offset,
            } => {
                let shared = self.spec.trigger.count.is_none();
                Some(Aligned {
                    size,
                    slide,
                    offset,
                    pane: shared.then(|| gcd(size, slide)),
                    cumulative: false,
                })
            }
            Shape::Cumulate { step, size, offset } => {
                // A purge clears one window, but a period's windows share its panes.
                let shared = self.spec.trigger.count.is_none() && !self.spec.trigger.purge;
                Some(Aligned {
                    size,
                    slide: step,
                    offset,
                    pane: shared.then_some(step),
                    cumulative: true,
                })
            }
            Shape::Session { .. } => None,
        }
    }

    fn event_time(&self) -> bool {
        self.spec.assigner.domain == TimeDomain::EventTime
    }

    fn lateness(&self) -> i64 {
        if self.event_time() {
            self.spec.allowed_lateness
        } else {
            0
        }
    }

    /// Whether window `w` was dropped already (its records are late).
    fn is_late(&self, w: &TimeWindow, ctx: &KeyedContext<K>) -> bool {
        self.is_late_at(w, ctx.current_watermark())
    }

    /// Whether window `w` was dropped already at `watermark`.
    fn is_late_at(&self, w: &TimeWindow, watermark: i64) -> bool {
        self.event_time() && w.max_timestamp().saturating_add(self.lateness()) <= watermark
    }

    fn register(&self, ctx: &mut KeyedContext<K>, time: i64) -> TaskResult {
        match self.spec.assigner.domain {
            TimeDomain::EventTime => ctx.register_event_time_timer(time),
            TimeDomain::ProcessingTime => ctx.register_processing_time_timer(time),
        }
    }

    fn delete(&self, ctx: &mut KeyedContext<K>, time: i64) -> TaskResult {
        match self.spec.assigner.domain {
            TimeDomain::EventTime => ctx.delete_event_time_timer(time),
            TimeDomain::ProcessingTime => ctx.delete_processing_time_timer(time),
        }
    }

    /// The timers a new window needs: its firing (time triggers) and its cleanup.
    /// A window the watermark passed already fires at once (a late firing), not by a timer.
    fn window_timers(&self, w: &TimeWindow, ctx: &mut KeyedContext<K>) -> TaskResult {
        let passed = self.event_time() && w.max_timestamp() <= ctx.current_watermark();
        let timed = self.spec.trigger.count.is_none();
        if timed && !passed {
            self.register(ctx, w.max_timestamp())?;
        }
        let cleanup = w.max_timestamp().saturating_add(self.lateness());
        if cleanup != w.max_timestamp() || !timed || passed {
            self.register(ctx, cleanup)?;
        }
        Ok(())
    }

    fn emit(
        &self,
        ctx: &KeyedContext<K>,
        w: TimeWindow,
        acc: &A::Acc,
        out: &mut Collector<E::Out>,
    ) -> TaskResult {
        let key = ctx
            .current_key()
            .ok_or_else(|| TaskError::msg("a window fired without a key"))?;
        let mut results = Vec::new();
        self.process.process(
            key,
            w,
            self.agg.result(acc),
            &mut Collector::new(&mut results),
        );
        for r in results {
            out.collect(E::result(r));
        }
        Ok(())
    }

    fn slots(&self) -> TaskResult<&ValueState<Slots<A::Acc>>> {
        self.slots
            .as_ref()
            .ok_or_else(|| TaskError::msg("window state not opened"))
    }

    fn sessions(&self) -> TaskResult<&ValueState<Sessions<A::Acc>>> {
        self.sessions
            .as_ref()
            .ok_or_else(|| TaskError::msg("window state not opened"))
    }

    /// The accumulator of window `w` from the key's slots (panes merged), if it has any.
    fn window_acc(
        &self,
        g: &Aligned,
        slots: &BTreeMap<i64, Slot<A::Acc>>,
        w: &TimeWindow,
    ) -> Option<A::Acc> {
        match g.pane {
            None => slots.get(&g.slot_of(w)).map(|s| s.acc.clone()),
            Some(_) => {
                let mut merged: Option<A::Acc> = None;
                for (_, s) in slots.range(w.start..w.end) {
                    match &mut merged {
                        Some(m) => self.agg.merge(m, &s.acc),
                        None => merged = Some(s.acc.clone()),
                    }
                }
                merged
            }
        }
    }

    fn on_aligned_record(
        &mut self,
        g: Aligned,
        ts: i64,
        value: T,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<E::Out>,
    ) -> TaskResult {
        // The record's windows that were not dropped yet, recomputed where they are needed
        // rather than collected: nothing is allocated per record.
        let watermark = ctx.current_watermark();
        let this = &*self;
        let live = || {
            g.windows_of(ts)
                .filter(move |w| !this.is_late_at(w, watermark))
        };
        if live().next().is_none() {
            if let Some(late) = E::late(value) {
                out.collect(late);
            }
            return Ok(());
        }
        let state = self.slots()?.clone();
        // Taken out and put back: no copy of the key's windows per record.
        let mut slots = std::mem::take(state.get_mut(ctx, BTreeMap::new)?);
        match g.pane {
            Some(pane) => {
                let start = g.floor(ts, pane);
                // A cumulative period's windows over a pane cover every later pane of the
                // period too: with an earlier pane there, their timers are registered.
                let registered =
                    g.cumulative && slots.range(g.floor(ts, g.size)..start).next().is_some();
                if !registered && !slots.contains_key(&start) {
                    // A new pane: the timers of every window over it.
                    for w in live() {
                        self.window_timers(&w, ctx)?;
                    }
                }
                let slot = slots.entry(start).or_insert_with(|| Slot {
                    acc: self.agg.create(),
                    count: 0,
                });
                self.agg.add(&mut slot.acc, value);
            }
            None => {
                for w in live() {
                    let at = g.slot_of(&w);
                    if !slots.contains_key(&at) {
                        self.window_timers(&w, ctx)?;
                    }
                    let slot = slots.entry(at).or_insert_with(|| Slot {
                        acc: self.agg.create(),
                        count: 0,
                    });
                    self.agg.add(&mut slot.acc, value.clone());
                    slot.count += 1;
                    if self.spec.trigger.count.is_some_and(|n| slot.count >= n) {
                        slot.count = 0;
                        let acc = slot.acc.clone();
                        if self.spec.trigger.purge {
                            slot.acc = self.agg.create();
                        }
                        self.emit(ctx, w, &acc, out)?;
                    }
                }
            }
        }
        // Late firing: a window the watermark passed already, but within the lateness.
        if self.event_time() && self.spec.trigger.count.is_none() {
            for w in live().filter(|w| w.max_timestamp() <= watermark) {
                if let Some(acc) = self.window_acc(&g, &slots, &w) {
                    self.emit(ctx, w, &acc, out)?;
                }
                if self.spec.trigger.purge {
                    Self::drop_window(&g, &mut slots, &w);
                }
            }
        }
        state.update(ctx, slots)
    }

    /// Removes the slots only window `w` (and earlier ones) needed.
    fn drop_window(g: &Aligned, slots: &mut BTreeMap<i64, Slot<A::Acc>>, w: &TimeWindow) {
        match g.pane {
            None => {
                slots.remove(&g.slot_of(w));
            }
            Some(_) if g.cumulative => {
                // Every window of a period covers its first pane: the panes go with the
                // period's last window, the whole period (and with them any earlier ones).
                if w.end - w.start == g.size {
                    let keep = slots.split_off(&w.end);
                    *slots = keep;
                }
            }
            Some(_) => {
                // Panes before the next window's start belong to no later window.
                let keep = slots.split_off(&(w.start + g.slide));
                *slots = keep;
            }
        }
    }

    fn on_aligned_timer(
        &mut self,
        g: Aligned,
        time: i64,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<E::Out>,
    ) -> TaskResult {
        let state = self.slots()?.clone();
        if state.value(ctx)?.is_none() {
            return Ok(());
        }
        let mut slots = std::mem::take(state.get_mut(ctx, BTreeMap::new)?);
        let lateness = self.lateness();
        let fire_end = time + 1;
        if self.spec.trigger.count.is_none() && g.is_window_end(fire_end) {
            let w = g.window_ending(fire_end);
            if let Some(acc) = self.window_acc(&g, &slots, &w) {
                self.emit(ctx, w, &acc, out)?;
            }
            if self.spec.trigger.purge {
                // Purged contents are not fired again; later late records start afresh.
                Self::drop_window(&g, &mut slots, &w);
            } else if lateness == 0 {
                Self::drop_window(&g, &mut slots, &w);
            }
        }
        let cleanup_end = time.saturating_sub(lateness) + 1;
        if (lateness > 0 || self.spec.trigger.count.is_some()) && g.is_window_end(cleanup_end) {
            let w = g.window_ending(cleanup_end);
            Self::drop_window(&g, &mut slots, &w);
        }
        if slots.is_empty() {
            state.clear(ctx)
        } else {
            state.update(ctx, slots)
        }
    }

    fn on_session_record(
        &mut self,
        gap: i64,
        ts: i64,
        value: T,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<E::Out>,
    ) -> TaskResult {
        let state = self.sessions()?.clone();
        let mut sessions = std::mem::take(state.get_mut(ctx, Vec::new)?);
        let mut merged = TimeWindow {
            start: ts,
            end: ts.saturating_add(gap),
        };
        // Sessions never overlap, so one pass in start order finds every one the new record's
        // window reaches, also through the ones it absorbed.
        let mut acc: Option<A::Acc> = None;
        let mut count = 0;
        let mut kept = Vec::with_capacity(sessions.len() + 1);
        let mut absorbed = Vec::new();
        for (w, slot) in sessions.drain(..) {
            if w.intersects(&merged) {
                merged = merged.cover(&w);
                absorbed.push(w);
                match &mut acc {
                    Some(a) => self.agg.merge(a, &slot.acc),
                    None => acc = Some(slot.acc),
                }
                count += slot.count;
            } else {
                kept.push((w, slot));
            }
        }
        // A session still in state is not late, so the merge is late only when it absorbed
        // nothing: the record alone would open a window that was dropped already.
        if absorbed.is_empty() && self.is_late(&merged, ctx) {
            if let Some(late) = E::late(value) {
                out.collect(late);
            }
            return state.update(ctx, kept);
        }
        let mut acc = acc.unwrap_or_else(|| self.agg.create());
        for w in &absorbed {
            if self.spec.trigger.count.is_none() {
                self.delete(ctx, w.max_timestamp())?;
            }
            let cleanup = w.max_timestamp().saturating_add(self.lateness());
            self.delete(ctx, cleanup)?;
        }
        self.agg.add(&mut acc, value);
        count += 1;
        self.window_timers(&merged, ctx)?;
        let mut slot = Slot { acc, count };
        let mut fired = false;
        if self.spec.trigger.count.is_some_and(|n| slot.count >= n) {
            slot.count = 0;
            self.emit(ctx, merged, &slot.acc, out)?;
            fired = true;
        } else if self.event_time()
            && self.spec.trigger.count.is_none()
            && merged.max_timestamp() <= ctx.current_watermark()
        {
            self.emit(ctx, merged, &slot.acc, out)?;
            fired = true;
        }
        if fired && self.spec.trigger.purge {
            slot.acc = self.agg.create();
        }
        kept.push((merged, slot));
        kept.sort_by_key(|(w, _)| *w);
        state.update(ctx, kept)
    }

    fn on_session_timer(
        &mut self,
        time: i64,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<E::Out>,
    ) -> TaskResult {
        let state = self.sessions()?.clone();
        if state.value(ctx)?.is_none() {
            return Ok(());
        }
        let mut sessions = std::mem::take(state.get_mut(ctx, Vec::new)?);
        let lateness = self.lateness();
        let time_trigger = self.spec.trigger.count.is_none();
        let mut kept = Vec::with_capacity(sessions.len());
        for (w, mut slot) in sessions.drain(..) {
            if time_trigger && w.max_timestamp() == time {
                self.emit(ctx, w, &slot.acc, out)?;
                if self.spec.trigger.purge {
                    slot.acc = self.agg.create();
                }
            }
            if w.max_timestamp().saturating_add(lateness) <= time {
                continue;
            }
            kept.push((w, slot));
        }
        if kept.is_empty() {
            state.clear(ctx)
        } else {
            state.update(ctx, kept)
        }
    }
}

impl<K, T, R, O, A, P, E> KeyedProcessFunction<K, T, E::Out> for WindowFunction<K, T, R, O, A, P, E>
where
    K: Key,
    T: StateValue + Serialize + DeserializeOwned,
    R: 'static,
    O: Send + 'static,
    A: AggregateFunction<T, R>,
    P: ProcessWindowFunction<K, R, O>,
    E: Emit<O, T>,
{
    fn open(&mut self, ctx: &mut KeyedContext<K>) -> TaskResult {
        match self.spec.assigner.shape {
            Shape::Aligned { .. } | Shape::Cumulate { .. } => {
                self.slots = Some(ctx.value_state("window-slots")?)
            }
            Shape::Session { .. } => self.sessions = Some(ctx.value_state("window-sessions")?),
        }
        Ok(())
    }

    fn process(
        &mut self,
        value: T,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<E::Out>,
    ) -> TaskResult {
        let ts = match self.spec.assigner.domain {
            TimeDomain::EventTime => ctx.timestamp().ok_or_else(|| {
                TaskError::Unrecoverable(
                    "an event-time window on a stream without timestamps: assign them at the source (source_with_watermarks) or with assign_timestamps_and_watermarks / with_timestamps".into(),
                )
            })?,
            TimeDomain::ProcessingTime => ctx.current_processing_time(),
        };
        match (self.aligned(), self.spec.assigner.shape) {
            (Some(g), _) => self.on_aligned_record(g, ts, value, ctx, out),
            (None, Shape::Session { gap }) => self.on_session_record(gap, ts, value, ctx, out),
            (None, _) => Ok(()),
        }
    }

    fn on_timer(
        &mut self,
        time: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<E::Out>,
    ) -> TaskResult {
        if domain != self.spec.assigner.domain {
            return Ok(());
        }
        match self.aligned() {
            Some(g) => self.on_aligned_timer(g, time, ctx, out),
            None => self.on_session_timer(time, ctx, out),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap as StdHashMap;

    use super::*;
    use crate::state::KeyedTableData;

    fn aligned(size: i64, slide: i64) -> Aligned {
        Aligned {
            size,
            slide,
            offset: 0,
            pane: Some(gcd(size, slide)),
            cumulative: false,
        }
    }

    #[test]
    fn sliding_windows_of_a_timestamp() {
        let g = aligned(10, 2);
        let ws: Vec<_> = g.windows_of(7).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(6, 16), (4, 14), (2, 12), (0, 10), (-2, 8)]);
        assert!(g.is_window_end(10) && g.is_window_end(12) && !g.is_window_end(11));
        let t = aligned(5, 5);
        let ws: Vec<_> = t.windows_of(-1).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(-5, 0)]);
    }

    #[test]
    fn offsets_shift_windows() {
        let g = Aligned {
            size: 10,
            slide: 10,
            offset: 3,
            pane: Some(10),
            cumulative: false,
        };
        let ws: Vec<_> = g.windows_of(12).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(3, 13)]);
        assert!(g.is_window_end(13));
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(
            WindowAssigner::sliding(Duration::from_secs(1), Duration::from_secs(2))
                .validate()
                .is_err()
        );
        assert!(WindowAssigner::tumbling(Duration::ZERO).validate().is_err());
        assert!(WindowAssigner::session(Duration::ZERO).validate().is_err());
        assert!(WindowAssigner::tumbling(Duration::from_secs(1))
            .validate()
            .is_ok());
    }

    #[test]
    fn cumulative_windows_of_a_timestamp() {
        let a = WindowAssigner::cumulative(Duration::from_millis(2), Duration::from_millis(10));
        assert_eq!(a.cumulative_geometry(), Some((2, 10, 0)));
        assert_eq!(a.aligned_geometry(), None);
        let g = Aligned {
            size: 10,
            slide: 2,
            offset: 0,
            pane: Some(2),
            cumulative: true,
        };
        let ws: Vec<_> = g.windows_of(5).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(0, 6), (0, 8), (0, 10)]);
        let ws: Vec<_> = g.windows_of(0).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(0, 2), (0, 4), (0, 6), (0, 8), (0, 10)]);
        let ws: Vec<_> = g.windows_of(-1).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(-10, 0)]);
        assert!(g.is_window_end(2) && g.is_window_end(10) && !g.is_window_end(3));
        assert_eq!(g.window_ending(6), TimeWindow { start: 0, end: 6 });
        assert_eq!(g.window_ending(10), TimeWindow { start: 0, end: 10 });
        assert_eq!(g.window_ending(12), TimeWindow { start: 10, end: 12 });
        // Offsets shift the periods, modulo the max size.
        let shifted = a.with_offset(Duration::from_millis(13));
        assert_eq!(shifted.cumulative_geometry(), Some((2, 10, 3)));
        let g = Aligned { offset: 3, ..g };
        let ws: Vec<_> = g.windows_of(12).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(3, 13)]);
        let ws: Vec<_> = g.windows_of(2).map(|w| (w.start, w.end)).collect();
        assert_eq!(ws, vec![(-7, 3)]);
        assert!(g.is_window_end(5) && !g.is_window_end(4));
        assert_eq!(g.window_ending(13), TimeWindow { start: 3, end: 13 });
    }

    #[test]
    fn a_cumulative_max_size_that_is_no_multiple_of_the_step_is_refused() {
        let ms = Duration::from_millis;
        let e = WindowAssigner::cumulative(ms(3), ms(10))
            .validate()
            .unwrap_err();
        assert_eq!(
            e,
            "a cumulate window's max size (10 ms) must be a multiple of its step (3 ms)"
        );
        assert!(WindowAssigner::cumulative(ms(0), ms(10))
            .validate()
            .is_err());
        assert!(WindowAssigner::cumulative(ms(20), ms(10))
            .validate()
            .is_err());
        assert!(WindowAssigner::cumulative(ms(2), ms(10)).validate().is_ok());
        assert!(WindowAssigner::cumulative(ms(10), ms(10))
            .validate()
            .is_ok());
    }

    /// A record: key, event time (ms), value.
    type Rec = (u64, i64, u64);
    /// A result: key, window start, window end, sum and count of the values.
    type Row = (u64, i64, i64, u64, u64);
    /// Results and late records, each with the index of the event that made it, sorted.
    type Outcome = (Vec<(usize, Row)>, Vec<(usize, Rec)>);

    #[derive(Clone)]
    struct SumCount;

    impl AggregateFunction<Rec, (u64, u64)> for SumCount {
        type Acc = (u64, u64);
        fn create(&self) -> (u64, u64) {
            (0, 0)
        }
        fn add(&self, acc: &mut (u64, u64), r: Rec) {
            acc.0 += r.2;
            acc.1 += 1;
        }
        fn merge(&self, acc: &mut (u64, u64), o: &(u64, u64)) {
            acc.0 += o.0;
            acc.1 += o.1;
        }
        fn result(&self, acc: &(u64, u64)) -> (u64, u64) {
            *acc
        }
    }

    type ToRow = fn(&u64, TimeWindow, (u64, u64), &mut Collector<Row>);

    fn to_row(k: &u64, w: TimeWindow, r: (u64, u64), out: &mut Collector<Row>) {
        out.collect((*k, w.start, w.end, r.0, r.1));
    }

    /// What a test feeds the window function: a record or a watermark.
    #[derive(Debug, Clone, Copy)]
    enum Ev {
        Record(Rec),
        Watermark(i64),
    }

    /// A window function run as the keyed operator runs it, in one subtask, collecting its
    /// output with the index of the event that made it.
    struct Harness {
        spec: WindowSpec,
        f: WindowFunction<u64, Rec, (u64, u64), Row, SumCount, ToRow, WithLate>,
        ctx: KeyedContext<u64>,
        out: Vec<(usize, WindowOutput<Row, Rec>)>,
        /// The most panes (slots) a key held after a record.
        most_slots: usize,
    }

    impl Harness {
        fn new(spec: WindowSpec) -> Self {
            Self::restored(spec, StdHashMap::new())
        }

        fn restored(spec: WindowSpec, tables: StdHashMap<String, KeyedTableData>) -> Self {
            let mut ctx = KeyedContext::new(0, 1, 128, tables);
            ctx.check_restored().unwrap();
            let mut f = WindowFunction::new(spec, SumCount, to_row as ToRow);
            f.open(&mut ctx).unwrap();
            Harness {
                spec,
                f,
                ctx,
                out: Vec::new(),
                most_slots: 0,
            }
        }

        fn event(&mut self, i: usize, ev: Ev) {
            let mut out = Vec::new();
            let mut c = Collector::new(&mut out);
            match ev {
                Ev::Record(r) => {
                    self.ctx.set_current_key(r.0);
                    self.ctx.set_timestamp(Some(r.1));
                    self.f.process(r, &mut self.ctx, &mut c).unwrap();
                    let slots = self.f.slots().unwrap().clone();
                    let held = slots.value(&mut self.ctx).unwrap().map_or(0, |s| s.len());
                    self.most_slots = self.most_slots.max(held);
                }
                Ev::Watermark(wm) => {
                    self.ctx.set_watermark(wm);
                    while let Some(t) = self.ctx.next_due_timer(TimeDomain::EventTime, wm).unwrap()
                    {
                        self.f
                            .on_timer(t, TimeDomain::EventTime, &mut self.ctx, &mut c)
                            .unwrap();
                    }
                }
            }
            self.out.extend(out.into_iter().map(|o| (i, o)));
        }

        /// A checkpoint of the state and timers, restored into a new function and context
        /// (which then get the watermark again, as after a restart).
        fn snapshot_and_restore(self) -> Self {
            let Harness {
                spec,
                mut ctx,
                out,
                most_slots,
                ..
            } = self;
            let data = ctx.snapshot("window").unwrap().finish().unwrap();
            let tables = data
                .keyed
                .into_iter()
                .map(|t| (t.name.clone(), t))
                .collect();
            let mut again = Harness::restored(spec, tables);
            again.ctx.set_watermark(ctx.current_watermark());
            again.out = out;
            again.most_slots = most_slots;
            again
        }

        /// Results and late records, sorted.
        fn sorted(&self) -> Outcome {
            let mut results = Vec::new();
            let mut late = Vec::new();
            for (i, o) in &self.out {
                match o {
                    WindowOutput::Result(r) => results.push((*i, *r)),
                    WindowOutput::Late(r) => late.push((*i, *r)),
                }
            }
            results.sort_unstable();
            late.sort_unstable();
            (results, late)
        }

        /// Whether no state and no timer is left.
        fn empty(&mut self) -> bool {
            self.ctx.entries() == 0 && self.ctx.timers().queue(TimeDomain::EventTime).is_empty()
        }
    }

    /// The reference: each window of each key on its own, as the definition has them. A
    /// record goes to each window of its period that ends after it and is not dropped yet
    /// (the watermark did not pass its end - 1 + lateness); a window fires when the watermark
    /// passes its end - 1, and again per record that comes after that (within the lateness);
    /// a count trigger fires every `count` records of a window instead; a purge clears a
    /// window when it fires. A record without a window left is late.
    fn reference(
        events: &[Ev],
        (step, size, offset): (i64, i64, i64),
        lateness: i64,
        trigger: Trigger,
    ) -> Outcome {
        // (key, start, end) -> (sum, count, records since the last count firing)
        let mut windows: BTreeMap<(u64, i64, i64), (u64, u64, u64)> = BTreeMap::new();
        let mut results = Vec::new();
        let mut late = Vec::new();
        let mut wm = i64::MIN;
        for (i, ev) in events.iter().enumerate() {
            match *ev {
                Ev::Record((k, ts, v)) => {
                    let period = ts - (ts - offset).rem_euclid(size);
                    let mut any = false;
                    for n in 1..=size / step {
                        let end = period + n * step;
                        if end <= ts || end - 1 + lateness <= wm {
                            continue;
                        }
                        any = true;
                        let w = windows.entry((k, period, end)).or_default();
                        w.0 += v;
                        w.1 += 1;
                        w.2 += 1;
                        let fire = match trigger.count {
                            Some(c) => w.2 >= c,
                            None => end - 1 <= wm,
                        };
                        if fire {
                            w.2 = 0;
                            results.push((i, (k, period, end, w.0, w.1)));
                            if trigger.purge {
                                (w.0, w.1) = (0, 0);
                            }
                        }
                    }
                    if !any {
                        late.push((i, (k, ts, v)));
                    }
                }
                Ev::Watermark(next) if next > wm => {
                    for (&(k, start, end), w) in windows.iter_mut() {
                        let due = wm < end - 1 && end - 1 <= next;
                        if due && trigger.count.is_none() && w.1 > 0 {
                            results.push((i, (k, start, end, w.0, w.1)));
                            if trigger.purge {
                                (w.0, w.1) = (0, 0);
                            }
                        }
                    }
                    windows.retain(|&(_, _, end), _| end - 1 + lateness > next);
                    wm = next;
                }
                Ev::Watermark(_) => {}
            }
        }
        results.sort_unstable();
        late.sort_unstable();
        (results, late)
    }

    /// `n` records of 5 keys, about 3 ms apart, each up to `jitter` ms earlier than that;
    /// after each, the watermark `delay` behind the latest time so far.
    fn out_of_order(n: u64, jitter: u64, delay: i64) -> Vec<Ev> {
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut events = Vec::new();
        let mut latest = i64::MIN;
        for i in 0..n {
            let ts = 1_000 + 3 * i as i64 - (next() % jitter) as i64;
            events.push(Ev::Record((next() % 5, ts, i)));
            latest = latest.max(ts);
            events.push(Ev::Watermark(latest - delay));
        }
        events.push(Ev::Watermark(i64::MAX));
        events
    }

    fn spec(assigner: WindowAssigner, trigger: Trigger, lateness: i64) -> WindowSpec {
        WindowSpec {
            assigner,
            trigger,
            allowed_lateness: lateness,
        }
    }

    /// Runs `events` through a window function of `spec`, restored from a checkpoint every
    /// `restore_every` events (0: never); every key's state and timers must be gone at the end.
    fn run(spec: WindowSpec, events: &[Ev], restore_every: usize) -> Harness {
        let mut h = Harness::new(spec);
        for (i, ev) in events.iter().enumerate() {
            if restore_every > 0 && i > 0 && i % restore_every == 0 {
                h = h.snapshot_and_restore();
            }
            h.event(i, *ev);
        }
        assert!(h.empty(), "state or timers left after the last watermark");
        h
    }

    #[test]
    fn cumulative_windows_out_of_order_within_the_delay_match_the_reference() {
        let ms = Duration::from_millis;
        let events = out_of_order(4_000, 50, 60);
        for offset in [0, 30] {
            let assigner = WindowAssigner::cumulative(ms(20), ms(100)).with_offset(ms(offset));
            let geometry = assigner.cumulative_geometry().unwrap();
            let h = run(spec(assigner, Trigger::default_for_time(), 0), &events, 0);
            let expected = reference(&events, geometry, 0, Trigger::default_for_time());
            assert!(expected.1.is_empty(), "no record is later than the delay");
            assert!(expected.0.len() > 1_000);
            assert_eq!(h.sorted(), expected, "offset {offset}");
            // One pane per step of at most the two periods the delay spans, per key.
            assert!(
                h.most_slots > 1 && h.most_slots <= 10,
                "{} panes",
                h.most_slots
            );
        }
    }

    #[test]
    fn cumulative_windows_with_allowed_lateness_fire_late_and_drop_what_is_later() {
        let ms = Duration::from_millis;
        let events = out_of_order(4_000, 200, 50);
        let assigner = WindowAssigner::cumulative(ms(20), ms(100));
        let geometry = assigner.cumulative_geometry().unwrap();
        for lateness in [0, 60] {
            let h = run(
                spec(assigner, Trigger::default_for_time(), lateness),
                &events,
                0,
            );
            let expected = reference(&events, geometry, lateness, Trigger::default_for_time());
            assert!(!expected.1.is_empty(), "some records are too late");
            assert_eq!(h.sorted(), expected, "lateness {lateness}");
        }
        // With lateness, windows fire again: more results than windows.
        let (results, _) = reference(&events, geometry, 60, Trigger::default_for_time());
        let windows: std::collections::BTreeSet<_> =
            results.iter().map(|(_, r)| (r.0, r.1, r.2)).collect();
        assert!(results.len() > windows.len(), "no late firing");
    }

    #[test]
    fn cumulative_windows_restored_from_checkpoints_match_the_reference() {
        let ms = Duration::from_millis;
        let events = out_of_order(4_000, 200, 50);
        let assigner = WindowAssigner::cumulative(ms(20), ms(100)).with_offset(ms(7));
        let geometry = assigner.cumulative_geometry().unwrap();
        let trigger = Trigger::default_for_time();
        let h = run(spec(assigner, trigger, 60), &events, 997);
        assert_eq!(h.sorted(), reference(&events, geometry, 60, trigger));
    }

    #[test]
    fn cumulative_windows_with_count_and_purging_triggers_match_the_reference() {
        let ms = Duration::from_millis;
        let events = out_of_order(3_000, 200, 50);
        let assigner = WindowAssigner::cumulative(ms(20), ms(100));
        let geometry = assigner.cumulative_geometry().unwrap();
        for trigger in [
            Trigger::count(3),
            Trigger::purging(Trigger::count(3)),
            Trigger::purging(Trigger::default_for_time()),
        ] {
            let h = run(spec(assigner, trigger, 60), &events, 499);
            let expected = reference(&events, geometry, 60, trigger);
            assert!(!expected.0.is_empty());
            assert_eq!(h.sorted(), expected, "{trigger:?}");
        }
    }
}
