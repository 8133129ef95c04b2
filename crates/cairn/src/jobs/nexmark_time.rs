//! The Nexmark queries on event time: windows and joins in time over the generator's events,
//! whose event time is their `date_time` (monotonous per split: splits take event numbers by
//! stride and a reader emits its splits in event-number order).

use std::collections::BTreeMap;
use std::time::Duration;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::api::{
    AggregateFunction, Collector, DataStream, KeyedCoProcessFunction, KeyedProcessFunction,
    StreamEnv, TimeWindow, WatermarkStrategy, WindowAssigner,
};
use crate::connectors::{Bid, EventKind, NexmarkEvent, NexmarkSource};
use crate::error::{TaskError, TaskResult};
use crate::state::{KeyedContext, TimeDomain, ValueState};

/// 10 s: the window of q5 (size), q7, q8 and the session gap of q11.
const TEN_SECONDS: Duration = Duration::from_secs(10);
const TEN_SECONDS_MS: i64 = 10_000;

/// The events of `source` with their event time and watermarks.
pub(super) fn timed_events(
    env: &StreamEnv,
    source: NexmarkSource,
    uid: &str,
) -> DataStream<NexmarkEvent> {
    env.source_with_watermarks(
        source,
        WatermarkStrategy::monotonous(|e: &NexmarkEvent| e.timestamp_ms()),
    )
    .uid(uid)
    .name(uid)
}

/// The bids, keeping their event time.
pub(super) fn timed_bids(events: DataStream<NexmarkEvent>) -> DataStream<Bid> {
    events
        .flat_map(|e: NexmarkEvent, out: &mut Collector<Bid>| {
            if let NexmarkEvent::Bid(b) = e {
                out.collect(b);
            }
        })
        .uid("bids")
        .name("bids")
        .with_timestamps(|b: &Bid| b.date_time)
}

/// Counts records.
#[derive(Clone)]
struct Count;

impl<T> AggregateFunction<T, u64> for Count {
    type Acc = u64;
    fn create(&self) -> u64 {
        0
    }
    fn add(&self, acc: &mut u64, _: T) {
        *acc += 1;
    }
    fn merge(&self, acc: &mut u64, other: &u64) {
        *acc += other;
    }
    fn result(&self, acc: &u64) -> u64 {
        *acc
    }
}

/// An auction's bid count in one window of q5.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuctionCount {
    /// The auction.
    pub auction: i64,
    /// Its bids in the window.
    pub count: u64,
    /// The window's end.
    pub window_end: i64,
}

/// q5 hot items: per 10 s window sliding by 2 s, the auctions with the most bids — auction,
/// num. Two stages as in the standard query: bids counted per auction and window (shared
/// panes), then per window the counts that reach the window's maximum, emitted when event time
/// passes the window's end.
pub(super) fn q5(bids: DataStream<Bid>) -> DataStream<(i64, u64)> {
    bids.key_by(|b: &Bid| b.auction)
        .window(WindowAssigner::sliding(TEN_SECONDS, Duration::from_secs(2)))
        .aggregate_process(
            Count,
            |auction: &i64, w: TimeWindow, count: u64, out: &mut Collector<AuctionCount>| {
                out.collect(AuctionCount {
                    auction: *auction,
                    count,
                    window_end: w.end,
                })
            },
        )
        .uid("q5-count")
        .name("q5-count")
        .with_timestamps(|c: &AuctionCount| c.window_end - 1)
        .key_by(|c: &AuctionCount| c.window_end)
        .process(HottestOfWindow::default())
        .uid("q5-hottest")
        .name("q5-hottest")
}

/// Per window: the auctions whose count is the window's maximum.
#[derive(Clone, Default)]
struct HottestOfWindow {
    best: Option<ValueState<(u64, Vec<i64>)>>,
}

impl KeyedProcessFunction<i64, AuctionCount, (i64, u64)> for HottestOfWindow {
    fn open(&mut self, ctx: &mut KeyedContext<i64>) -> TaskResult {
        self.best = Some(ctx.value_state("hottest")?);
        Ok(())
    }
    fn process(
        &mut self,
        c: AuctionCount,
        ctx: &mut KeyedContext<i64>,
        _out: &mut Collector<(i64, u64)>,
    ) -> TaskResult {
        let state = opened(&self.best)?;
        let best = state.get_mut(ctx, || (0, Vec::new()))?;
        if c.count > best.0 {
            *best = (c.count, vec![c.auction]);
        } else if c.count == best.0 {
            best.1.push(c.auction);
        }
        ctx.register_event_time_timer(c.window_end - 1)
    }
    fn on_timer(
        &mut self,
        _time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<i64>,
        out: &mut Collector<(i64, u64)>,
    ) -> TaskResult {
        let state = opened(&self.best)?;
        if let Some((n, auctions)) = state.value(ctx)? {
            for a in auctions {
                out.collect((*a, *n));
            }
        }
        state.clear(ctx)
    }
}

fn opened<V>(s: &Option<V>) -> TaskResult<&V> {
    s.as_ref()
        .ok_or_else(|| TaskError::msg("state used before open"))
}

/// The highest price of a window and its bids at that price (q7).
#[derive(Clone)]
struct HighestBids;

impl AggregateFunction<Bid, Vec<Bid>> for HighestBids {
    type Acc = Vec<Bid>;
    fn create(&self) -> Vec<Bid> {
        Vec::new()
    }
    fn add(&self, acc: &mut Vec<Bid>, b: Bid) {
        match acc.first().map(|x| x.price) {
            Some(p) if b.price < p => {}
            Some(p) if b.price == p => acc.push(b),
            _ => *acc = vec![b],
        }
    }
    fn merge(&self, acc: &mut Vec<Bid>, other: &Vec<Bid>) {
        for b in other {
            self.add(acc, b.clone());
        }
    }
    fn result(&self, acc: &Vec<Bid>) -> Vec<Bid> {
        acc.clone()
    }
}

/// q7 highest bid: per 10 s tumbling window, the bids with the window's highest price —
/// auction, price, bidder, date_time, extra. Evaluated incrementally by one subtask (a global
/// aggregate, as in the standard query).
pub(super) fn q7(bids: DataStream<Bid>) -> DataStream<Bid> {
    bids.window_all(WindowAssigner::tumbling(TEN_SECONDS))
        .aggregate_process(
            HighestBids,
            |_: &u8, _: TimeWindow, best: Vec<Bid>, out: &mut Collector<Bid>| {
                for b in best {
                    out.collect(b);
                }
            },
        )
        .uid("q7-highest")
        .name("q7-highest")
}

/// A person of q8.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NewPerson {
    /// Person id.
    pub id: i64,
    /// Name.
    pub name: CompactString,
    /// Event time.
    pub date_time: i64,
}

/// An auction's seller and time (q8).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SellerAt {
    /// The seller's person id.
    pub seller: i64,
    /// Event time.
    pub date_time: i64,
}

/// A row of q8: a person who opened an auction in the 10 s window they joined in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Q8Row {
    /// Person id.
    pub id: i64,
    /// Name.
    pub name: CompactString,
    /// The window's start.
    pub start: i64,
}

/// q8 monitor new users: persons joined with the auctions they opened in the same 10 s tumbling
/// window — id, name, starttime. A window join: both sides kept per key and window, joined when
/// event time passes the window's end.
pub(super) fn q8(env: &StreamEnv, source: &NexmarkSource) -> DataStream<Q8Row> {
    let persons = timed_events(
        env,
        source.clone().only(EventKind::Person),
        "nexmark-persons",
    )
    .flat_map(|e: NexmarkEvent, out: &mut Collector<NewPerson>| {
        if let NexmarkEvent::Person(p) = e {
            out.collect(NewPerson {
                id: p.id,
                name: p.name,
                date_time: p.date_time,
            });
        }
    })
    .uid("q8-persons")
    .name("q8-persons")
    .with_timestamps(|p: &NewPerson| p.date_time);
    let sellers = timed_events(
        env,
        source.clone().only(EventKind::Auction),
        "nexmark-auctions",
    )
    .flat_map(|e: NexmarkEvent, out: &mut Collector<SellerAt>| {
        if let NexmarkEvent::Auction(a) = e {
            out.collect(SellerAt {
                seller: a.seller,
                date_time: a.date_time,
            });
        }
    })
    .uid("q8-auctions")
    .name("q8-auctions")
    .with_timestamps(|a: &SellerAt| a.date_time);
    persons
        .key_by(|p: &NewPerson| p.id)
        .connect(sellers.key_by(|a: &SellerAt| a.seller))
        .process(WindowJoin::default())
        .uid("q8-join")
        .name("q8-join")
}

/// One window of one person id: the person's name (if they joined in it) and whether they
/// opened an auction in it.
type JoinSides = (Option<CompactString>, bool);

/// Per person id, by window start: both sides of the window join.
#[derive(Clone, Default)]
struct WindowJoin {
    windows: Option<ValueState<BTreeMap<i64, JoinSides>>>,
}

fn window_start(ts: i64) -> i64 {
    ts - ts.rem_euclid(TEN_SECONDS_MS)
}

impl WindowJoin {
    fn note(
        &self,
        ctx: &mut KeyedContext<i64>,
        ts: i64,
        update: impl FnOnce(&mut JoinSides),
    ) -> TaskResult {
        let start = window_start(ts);
        let state = opened(&self.windows)?;
        let windows = state.get_mut(ctx, BTreeMap::new)?;
        update(windows.entry(start).or_insert((None, false)));
        ctx.register_event_time_timer(start + TEN_SECONDS_MS - 1)
    }
}

impl KeyedCoProcessFunction<i64, NewPerson, SellerAt, Q8Row> for WindowJoin {
    fn open(&mut self, ctx: &mut KeyedContext<i64>) -> TaskResult {
        self.windows = Some(ctx.value_state("windows")?);
        Ok(())
    }
    fn process1(
        &mut self,
        p: NewPerson,
        ctx: &mut KeyedContext<i64>,
        _out: &mut Collector<Q8Row>,
    ) -> TaskResult {
        self.note(ctx, p.date_time, |w| w.0 = Some(p.name))
    }
    fn process2(
        &mut self,
        a: SellerAt,
        ctx: &mut KeyedContext<i64>,
        _out: &mut Collector<Q8Row>,
    ) -> TaskResult {
        self.note(ctx, a.date_time, |w| w.1 = true)
    }
    fn on_timer(
        &mut self,
        time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<i64>,
        out: &mut Collector<Q8Row>,
    ) -> TaskResult {
        let start = time + 1 - TEN_SECONDS_MS;
        let id = ctx.current_key().copied().unwrap_or_default();
        let state = opened(&self.windows)?;
        let windows = state.get_mut(ctx, BTreeMap::new)?;
        if let Some((Some(name), true)) = windows.remove(&start) {
            out.collect(Q8Row { id, name, start });
        }
        if windows.is_empty() {
            state.clear(ctx)?;
        }
        Ok(())
    }
}

/// A row of q11: a bidder's session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Q11Row {
    /// The bidder.
    pub bidder: i64,
    /// Bids in the session.
    pub bid_count: u64,
    /// First bid's time.
    pub start: i64,
    /// Last bid's time plus the gap.
    pub end: i64,
}

/// q11 user sessions: each bidder's sessions of bids less than 10 s apart — bidder, bid_count,
/// starttime, endtime.
pub(super) fn q11(bids: DataStream<Bid>) -> DataStream<Q11Row> {
    bids.key_by(|b: &Bid| b.bidder)
        .window(WindowAssigner::session(TEN_SECONDS))
        .aggregate_process(
            Count,
            |bidder: &i64, w: TimeWindow, n: u64, out: &mut Collector<Q11Row>| {
                out.collect(Q11Row {
                    bidder: *bidder,
                    bid_count: n,
                    start: w.start,
                    end: w.end,
                })
            },
        )
        .uid("q11-sessions")
        .name("q11-sessions")
}
