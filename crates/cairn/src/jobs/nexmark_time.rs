//! The Nexmark queries on time: windows, joins in time and closing auctions over the
//! generator's events, whose event time is their `date_time` (monotonous per split: splits take
//! event numbers by stride and a reader emits its splits in event-number order); and q12's
//! windows of processing time.

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

/// 10 s: the window of q5 (size), q7, q8, q12 and the session gap of q11.
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

/// What q4's first stage reads: the auctions and the bids, keyed by auction id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AuctionOrBid {
    /// An auction opens.
    Auction {
        /// Auction id.
        id: i64,
        /// Its category.
        category: i64,
        /// When it opens (its event time).
        date_time: i64,
        /// When it closes.
        expires: i64,
    },
    /// A bid.
    Bid {
        /// The auction it is for.
        auction: i64,
        /// Price, in cents.
        price: i64,
        /// Its event time.
        date_time: i64,
    },
}

impl AuctionOrBid {
    fn auction_id(&self) -> i64 {
        match self {
            AuctionOrBid::Auction { id, .. } => *id,
            AuctionOrBid::Bid { auction, .. } => *auction,
        }
    }

    fn date_time(&self) -> i64 {
        match self {
            AuctionOrBid::Auction { date_time, .. } | AuctionOrBid::Bid { date_time, .. } => {
                *date_time
            }
        }
    }
}

/// An auction that closed with at least one bid: its category and final (highest) price.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClosedAuction {
    /// The auction's category.
    pub category: i64,
    /// Its highest bid in cents.
    pub price: i64,
    /// When it closed: its event time.
    pub expires: i64,
}

/// A row of q4: a category and the average final price of its closed auctions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Q4Row {
    /// The category.
    pub category: i64,
    /// The average final price in cents, truncated to an integer (Flink's `AVG` of a `BIGINT`).
    pub avg: i64,
}

/// q4 average price for a category: per category, the average final price of its closed
/// auctions — category, avg. As in the standard query, an auction's bids are those on it
/// whose date_time lies between the auction's date_time and its expires (both included), its
/// final price is the highest of them, and an auction without such a bid has none. An auction
/// closes at its `expires` in event time; the average is an integer, the sum of the final
/// prices divided by their count and truncated, as Flink's `AVG` of a `BIGINT` column is.
///
/// Two stages, so that the lines are the same at every parallelism and through any failure:
/// [`ClosingAuctions`] (keyed by auction id) emits each auction's final price when the
/// watermark reaches its `expires`, with `expires` as its event time; [`CategoryAverages`]
/// (keyed by category) folds a closed auction into its category's running average only when
/// the watermark reaches its `expires` too — by then every closed auction with `expires <= t`
/// has arrived from every upstream subtask — and emits one line per category and distinct
/// `expires`: the average over the category's auctions closed by then.
pub(super) fn q4(events: DataStream<NexmarkEvent>) -> DataStream<Q4Row> {
    events
        .flat_map(
            |e: NexmarkEvent, out: &mut Collector<AuctionOrBid>| match e {
                NexmarkEvent::Auction(a) => out.collect(AuctionOrBid::Auction {
                    id: a.id,
                    category: a.category,
                    date_time: a.date_time,
                    expires: a.expires,
                }),
                NexmarkEvent::Bid(b) => out.collect(AuctionOrBid::Bid {
                    auction: b.auction,
                    price: b.price,
                    date_time: b.date_time,
                }),
                NexmarkEvent::Person(_) => {}
            },
        )
        .uid("q4-auctions-and-bids")
        .name("q4-auctions-and-bids")
        .with_timestamps(AuctionOrBid::date_time)
        .key_by(AuctionOrBid::auction_id)
        .process(ClosingAuctions::default())
        .uid("q4-close")
        .name("q4-close")
        .with_timestamps(|c: &ClosedAuction| c.expires)
        .key_by(|c: &ClosedAuction| c.category)
        .process(CategoryAverages::default())
        .uid("q4-average")
        .name("q4-average")
}

/// An auction of q4 until it closes: its category, its bounds and its highest bid so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct OpenAuction {
    category: i64,
    date_time: i64,
    expires: i64,
    best: Option<i64>,
}

/// q4's first stage, per auction id: the auction while it is open, with its highest bid in
/// bounds, emitted when the watermark reaches its `expires`.
///
/// A bid can arrive before its auction: the generator names auctions up to 10 ahead of the
/// newest one (and some of those never come, past the last event), and at parallelism > 1 a
/// bid from one split can overtake the auction from another. Such an early bid is kept
/// (`early`: (date_time, highest price) sorted by date_time) until the auction arrives, which
/// takes the ones in its bounds, or until the watermark reaches the bid's date_time: an auction
/// arriving after that has a later date_time than the bid, which is then out of its bounds. So
/// are the bids that come after their auction closed (the generator picks among the 100 newest
/// auctions, some of them closed): they too wait as early bids until the watermark passes them.
/// One event-time timer per auction id at a time: at `expires` while the auction is open,
/// otherwise at its earliest early bid.
#[derive(Clone, Default)]
struct ClosingAuctions {
    auctions: Option<ValueState<OpenAuction>>,
    early: Option<ValueState<Vec<(i64, i64)>>>,
}

impl KeyedProcessFunction<i64, AuctionOrBid, ClosedAuction> for ClosingAuctions {
    fn open(&mut self, ctx: &mut KeyedContext<i64>) -> TaskResult {
        self.auctions = Some(ctx.value_state("auction")?);
        self.early = Some(ctx.value_state("early-bids")?);
        Ok(())
    }

    fn process(
        &mut self,
        record: AuctionOrBid,
        ctx: &mut KeyedContext<i64>,
        _out: &mut Collector<ClosedAuction>,
    ) -> TaskResult {
        let (auctions, early) = (opened(&self.auctions)?, opened(&self.early)?);
        match record {
            AuctionOrBid::Auction {
                category,
                date_time,
                expires,
                ..
            } => {
                let mut best = None;
                if let Some(bids) = early.value(ctx)? {
                    let first = bids.first().map(|b| b.0);
                    best = bids
                        .iter()
                        .filter(|(t, _)| (date_time..=expires).contains(t))
                        .map(|b| b.1)
                        .max();
                    early.clear(ctx)?;
                    if let Some(first) = first {
                        ctx.delete_event_time_timer(first)?;
                    }
                }
                auctions.update(
                    ctx,
                    OpenAuction {
                        category,
                        date_time,
                        expires,
                        best,
                    },
                )?;
                ctx.register_event_time_timer(expires)
            }
            AuctionOrBid::Bid {
                price, date_time, ..
            } => {
                if let Some(open) = auctions.value(ctx)?.copied() {
                    let in_bounds = (open.date_time..=open.expires).contains(&date_time);
                    if in_bounds && open.best.is_none_or(|b| price > b) {
                        let best = Some(price);
                        auctions.update(ctx, OpenAuction { best, ..open })?;
                    }
                    return Ok(());
                }
                let bids = early.get_mut(ctx, Vec::new)?;
                let first = bids.first().map(|b| b.0);
                // Sorted by date_time, one entry per date_time; bids mostly come in order.
                match bids.last_mut() {
                    Some(last) if last.0 == date_time => last.1 = last.1.max(price),
                    Some(last) if last.0 < date_time => bids.push((date_time, price)),
                    None => bids.push((date_time, price)),
                    Some(_) => {
                        let i = bids.partition_point(|b| b.0 < date_time);
                        match bids.get_mut(i) {
                            Some(b) if b.0 == date_time => b.1 = b.1.max(price),
                            _ => bids.insert(i, (date_time, price)),
                        }
                    }
                }
                if first.is_none_or(|f| date_time < f) {
                    // The earlier timer, if any, fires and finds nothing to drop.
                    ctx.register_event_time_timer(date_time)?;
                }
                Ok(())
            }
        }
    }

    fn on_timer(
        &mut self,
        time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<i64>,
        out: &mut Collector<ClosedAuction>,
    ) -> TaskResult {
        let (auctions, early) = (opened(&self.auctions)?, opened(&self.early)?);
        if let Some(open) = auctions.value(ctx)?.copied() {
            if time == open.expires {
                if let Some(price) = open.best {
                    out.collect(ClosedAuction {
                        category: open.category,
                        price,
                        expires: open.expires,
                    });
                }
                auctions.clear(ctx)?;
            }
            return Ok(());
        }
        let bids = early.get_mut(ctx, Vec::new)?;
        // The watermark reached `time`: an auction still to come opens after these bids.
        let passed = bids.partition_point(|b| b.0 <= time);
        bids.drain(..passed);
        match bids.first() {
            Some(&(next, _)) => ctx.register_event_time_timer(next),
            None => early.clear(ctx),
        }
    }
}

/// Per category: the running sum and count of final prices, and the closed auctions not
/// folded in yet, by `expires`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
struct CategoryPrices {
    sum: i128,
    count: u64,
    closing: BTreeMap<i64, (i128, u64)>,
}

/// q4's second stage, per category: folds closed auctions into the average when the watermark
/// reaches their `expires` (not when they arrive, which depends on the upstream subtasks'
/// progress), and emits the average then.
#[derive(Clone, Default)]
struct CategoryAverages {
    prices: Option<ValueState<CategoryPrices>>,
}

impl KeyedProcessFunction<i64, ClosedAuction, Q4Row> for CategoryAverages {
    fn open(&mut self, ctx: &mut KeyedContext<i64>) -> TaskResult {
        self.prices = Some(ctx.value_state("prices")?);
        Ok(())
    }

    fn process(
        &mut self,
        c: ClosedAuction,
        ctx: &mut KeyedContext<i64>,
        _out: &mut Collector<Q4Row>,
    ) -> TaskResult {
        let prices = opened(&self.prices)?.get_mut(ctx, CategoryPrices::default)?;
        let at = prices.closing.entry(c.expires).or_default();
        at.0 += i128::from(c.price);
        at.1 += 1;
        ctx.register_event_time_timer(c.expires)
    }

    fn on_timer(
        &mut self,
        time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<i64>,
        out: &mut Collector<Q4Row>,
    ) -> TaskResult {
        let category = ctx.current_key().copied().unwrap_or_default();
        let prices = opened(&self.prices)?.get_mut(ctx, CategoryPrices::default)?;
        let Some((sum, count)) = prices.closing.remove(&time) else {
            return Ok(());
        };
        prices.sum += sum;
        prices.count += count;
        // Prices are positive: truncating is flooring, as Flink's integer AVG does.
        let avg = prices.sum / i128::from(prices.count.max(1));
        out.collect(Q4Row {
            category,
            avg: i64::try_from(avg).unwrap_or(i64::MAX),
        });
        Ok(())
    }
}

/// A row of q12: a bidder's bids in one 10 s window of processing time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Q12Row {
    /// The bidder.
    pub bidder: i64,
    /// Bids in the window.
    pub bid_count: u64,
    /// The window's start, ms since the epoch (wall clock).
    pub start: i64,
    /// The window's end.
    pub end: i64,
}

/// q12 processing-time windows: each bidder's bids per 10 s tumbling window of processing time
/// (the wall clock of the subtask counting them) — bidder, bid_count, window_start,
/// window_end (ms since the epoch). The windows follow the wall clock, so the lines differ
/// from run to run; what holds at every parallelism and through any failure is that each
/// bidder's counts sum to its number of bids, and that no bidder has a window twice. The
/// windows pending when the input ends fire then (at the maximum watermark), so a run shorter
/// than 10 s still counts every bid.
pub(super) fn q12(events: DataStream<NexmarkEvent>) -> DataStream<Q12Row> {
    events
        .flat_map(|e: NexmarkEvent, out: &mut Collector<i64>| {
            if let NexmarkEvent::Bid(b) = e {
                out.collect(b.bidder);
            }
        })
        .uid("q12-bidders")
        .name("q12-bidders")
        .key_by(|bidder: &i64| *bidder)
        .window(WindowAssigner::tumbling(TEN_SECONDS).on_processing_time())
        .aggregate_process(
            Count,
            |bidder: &i64, w: TimeWindow, n: u64, out: &mut Collector<Q12Row>| {
                out.collect(Q12Row {
                    bidder: *bidder,
                    bid_count: n,
                    start: w.start,
                    end: w.end,
                })
            },
        )
        .uid("q12-windows")
        .name("q12-windows")
}
