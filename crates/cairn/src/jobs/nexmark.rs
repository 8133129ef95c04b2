//! `nexmark`: the Nexmark benchmark's queries over the standard event generator
//! ([`NexmarkSource`]). Each query writes one row per line, its columns separated by tabs in
//! the order of the standard query (Flink's Nexmark SQL); timestamps as Flink prints a
//! `TIMESTAMP(3)`, `2015-07-15 00:00:00.000` (UTC).
//!
//! - `q0` passthrough: every bid — auction, bidder, price, channel, url, date_time, extra.
//! - `q1` currency conversion: every bid with its price in euros (`0.908 * price`, exact to
//!   three decimals) — auction, bidder, price, date_time, extra.
//! - `q2` selection: the bids on every 123rd auction (`auction % 123 == 0`) — auction, price.
//! - `q3` local item suggestion: the auctions of category 10 joined with their sellers from
//!   OR, ID or CA on `seller = id` — name, city, state, auction id. A keyed two-input join with
//!   state for both sides (Flink's regular inner join: every pair, whichever side came first);
//!   persons and auctions come from two sources that generate only their kind, the same
//!   events as in the single stream.
//!
//! - `q4` average price for a category: per category, the average final price of its closed
//!   auctions — category, avg. An auction closes at its `expires` (event time) with its highest
//!   bid between its date_time and expires as final price (none without such a bid); the
//!   average is an integer, truncated as Flink's `AVG` of a `BIGINT`. One line per category
//!   and distinct `expires` of its closed auctions: the average over those closed by then.
//! - `q5` hot items: per 10 s window sliding by 2 s, the auctions with the most bids — auction,
//!   num (bids counted per auction on shared panes, then the window's maximum).
//! - `q7` highest bid: per 10 s tumbling window, the bids at the window's highest price —
//!   auction, price, bidder, date_time, extra.
//! - `q8` monitor new users: persons who opened an auction in the 10 s tumbling window they
//!   joined in — id, name, starttime (a window join of persons and auctions).
//! - `q11` user sessions: each bidder's sessions of bids less than 10 s apart — bidder,
//!   bid_count, starttime, endtime.
//! - `q12` processing-time windows: each bidder's bids per 10 s tumbling window of processing
//!   time — bidder, bid_count, window_start, window_end (ms since the epoch). The only query
//!   whose lines differ from run to run (the windows follow the wall clock): what holds at
//!   every parallelism and through any failure is that each bidder's counts sum to its number
//!   of bids, in windows of 10 s that no bidder has twice. The windows still open when the
//!   input ends fire then.
//!
//! Event time is each event's `date_time`, with watermarks made per split at the source.

use std::sync::Arc;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::api::{Collector, Data, DataStream, JobGraph, KeyedCoProcessFunction, StreamEnv};
use crate::connectors::{
    Bid, DiscardSink, Encoder, EventKind, FileSink, NexmarkEvent, NexmarkGenerator, NexmarkSource,
    PrintSink,
};
use crate::error::TaskResult;
use crate::state::{KeyedContext, ListState};

use super::nexmark_time as time;
use super::wordcount::WordOutput;

/// The queries this job runs.
pub const QUERIES: &[&str] = &["q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q11", "q12"];

/// Queries of the standard suite (q0 to q22).
const STANDARD_QUERIES: u32 = 22;

/// Settings of the nexmark job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NexmarkArgs {
    /// The query, `q0` … (see [`QUERIES`]).
    pub query: String,
    /// Events to generate.
    pub events: u64,
    /// Seed of the events.
    pub seed: u64,
    /// Events per second of event time.
    pub rate: u64,
}

impl NexmarkArgs {
    fn generator(&self) -> NexmarkGenerator {
        NexmarkGenerator::new(self.seed, self.rate)
    }

    /// Checks the settings: a known query, at least one event, a rate of at least 1.
    pub fn validate(&self) -> Result<(), String> {
        query_of(&self.query)?;
        if self.events == 0 {
            return Err("nexmark needs at least 1 event".into());
        }
        if self.rate == 0 {
            return Err("the nexmark event rate must be at least 1 event per second".into());
        }
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Query {
    Q0,
    Q1,
    Q2,
    Q3,
    Q4,
    Q5,
    Q7,
    Q8,
    Q11,
    Q12,
}

fn query_of(name: &str) -> Result<Query, String> {
    let available = QUERIES.join(", ");
    Ok(match name {
        "q0" => Query::Q0,
        "q1" => Query::Q1,
        "q2" => Query::Q2,
        "q3" => Query::Q3,
        "q4" => Query::Q4,
        "q5" => Query::Q5,
        "q7" => Query::Q7,
        "q8" => Query::Q8,
        "q11" => Query::Q11,
        "q12" => Query::Q12,
        other => {
            let standard = other
                .strip_prefix('q')
                .and_then(|n| n.parse::<u32>().ok())
                .is_some_and(|n| n <= STANDARD_QUERIES);
            return Err(if standard {
                format!(
                    "nexmark query '{other}' is not available yet; available queries: {available}"
                )
            } else {
                format!("unknown nexmark query '{other}'; available queries: {available}")
            });
        }
    })
}

/// How many records the job's sources emit in all (the progress that failures are planned in).
pub fn source_records(args: &NexmarkArgs) -> Result<u64, String> {
    let source = NexmarkSource::new(args.events, args.generator());
    Ok(match query_of(&args.query)? {
        Query::Q0
        | Query::Q1
        | Query::Q2
        | Query::Q4
        | Query::Q5
        | Query::Q7
        | Query::Q11
        | Query::Q12 => source.records(),
        Query::Q3 | Query::Q8 => {
            source.clone().only(EventKind::Person).records()
                + source.only(EventKind::Auction).records()
        }
    })
}

/// Builds the query's job graph.
pub fn build(args: &NexmarkArgs, output: &WordOutput) -> Result<JobGraph, String> {
    args.validate()?;
    if matches!(output, WordOutput::Postgres { .. } | WordOutput::Kafka(_)) {
        return Err(
            "nexmark writes to files, prints or discards: --pg-output and --kafka-output are flags of wordcount"
                .into(),
        );
    }
    let env = StreamEnv::new();
    let source = NexmarkSource::new(args.events, args.generator());
    let events = || {
        env.source(source.clone())
            .uid("nexmark-source")
            .name("nexmark")
    };
    match query_of(&args.query)? {
        Query::Q0 => sink(bids(events()), output, encode_q0),
        Query::Q1 => {
            let rows = bids(events())
                .map(|b: Bid| Q1Row {
                    auction: b.auction,
                    bidder: b.bidder,
                    price_thousandths: b.price.saturating_mul(908),
                    date_time: b.date_time,
                    extra: b.extra,
                })
                .uid("q1-convert")
                .name("q1-convert");
            sink(rows, output, encode_q1)
        }
        Query::Q2 => {
            let rows = events()
                .flat_map(|e: NexmarkEvent, out: &mut Collector<(i64, i64)>| {
                    if let NexmarkEvent::Bid(b) = e {
                        if b.auction % 123 == 0 {
                            out.collect((b.auction, b.price));
                        }
                    }
                })
                .uid("q2-select")
                .name("q2-select");
            sink(rows, output, encode_q2)
        }
        Query::Q3 => {
            let persons = env
                .source(source.clone().only(EventKind::Person))
                .uid("nexmark-persons")
                .name("nexmark-persons")
                .flat_map(|e: NexmarkEvent, out: &mut Collector<Seller>| {
                    if let NexmarkEvent::Person(p) = e {
                        if matches!(p.state.as_str(), "OR" | "ID" | "CA") {
                            out.collect(Seller {
                                id: p.id,
                                name: p.name,
                                city: p.city,
                                state: p.state,
                            });
                        }
                    }
                })
                .uid("q3-persons")
                .name("q3-persons");
            let auctions = env
                .source(source.only(EventKind::Auction))
                .uid("nexmark-auctions")
                .name("nexmark-auctions")
                .flat_map(|e: NexmarkEvent, out: &mut Collector<SellerAuction>| {
                    if let NexmarkEvent::Auction(a) = e {
                        if a.category == 10 {
                            out.collect(SellerAuction {
                                seller: a.seller,
                                id: a.id,
                            });
                        }
                    }
                })
                .uid("q3-auctions")
                .name("q3-auctions");
            let rows = persons
                .key_by(|p: &Seller| p.id)
                .connect(auctions.key_by(|a: &SellerAuction| a.seller))
                .process(LocalItemJoin::default())
                .uid("q3-join")
                .name("q3-join");
            sink(rows, output, encode_q3)
        }
        Query::Q4 => {
            let events = time::timed_events(&env, source, "nexmark-source");
            sink(time::q4(events), output, encode_q4)
        }
        Query::Q5 => {
            let bids = time::timed_bids(time::timed_events(&env, source, "nexmark-source"));
            sink(time::q5(bids), output, encode_q2_shape)
        }
        Query::Q7 => {
            let bids = time::timed_bids(time::timed_events(&env, source, "nexmark-source"));
            sink(time::q7(bids), output, encode_q7)
        }
        Query::Q8 => sink(time::q8(&env, &source), output, encode_q8),
        Query::Q11 => {
            let bids = time::timed_bids(time::timed_events(&env, source, "nexmark-source"));
            sink(time::q11(bids), output, encode_q11)
        }
        Query::Q12 => sink(time::q12(events()), output, encode_q12),
    }
    env.build(&format!("nexmark-{}", args.query))
}

/// The bids of the events.
fn bids(events: DataStream<NexmarkEvent>) -> DataStream<Bid> {
    events
        .flat_map(|e: NexmarkEvent, out: &mut Collector<Bid>| {
            if let NexmarkEvent::Bid(b) = e {
                out.collect(b);
            }
        })
        .uid("bids")
        .name("bids")
}

fn sink<T: Data>(rows: DataStream<T>, output: &WordOutput, encode: fn(&T, &mut Vec<u8>)) {
    let encoder: Encoder<T> = Arc::new(encode);
    let sink = match output {
        WordOutput::Dir(dir) => rows.sink(FileSink::new(dir, encoder)).name("file-sink"),
        // `build` refuses PostgreSQL and Kafka outputs before any query is built.
        WordOutput::Discard | WordOutput::Postgres { .. } | WordOutput::Kafka(_) => {
            rows.sink(DiscardSink).name("discard")
        }
        WordOutput::Print => rows.sink(PrintSink::new(encoder)).name("print"),
    };
    sink.uid("sink");
}

/// A row of q1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Q1Row {
    /// The auction's id.
    pub auction: i64,
    /// The bidder's id.
    pub bidder: i64,
    /// Price in thousandths of a euro cent (`908 * price`: `0.908 * price` to three decimals).
    pub price_thousandths: i64,
    /// Event time, ms since the epoch.
    pub date_time: i64,
    /// Padding.
    pub extra: CompactString,
}

/// A person who may sell locally (q3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Seller {
    /// Person id.
    pub id: i64,
    /// Name.
    pub name: CompactString,
    /// City.
    pub city: CompactString,
    /// State.
    pub state: CompactString,
}

/// An auction of category 10 (q3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SellerAuction {
    /// The seller's person id.
    pub seller: i64,
    /// Auction id.
    pub id: i64,
}

/// A row of q3: who sells locally in category 10, and which auction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Q3Row {
    /// The seller's name.
    pub name: CompactString,
    /// The seller's city.
    pub city: CompactString,
    /// The seller's state.
    pub state: CompactString,
    /// Auction id.
    pub id: i64,
}

/// q3's inner join by seller: each side kept in keyed state and joined with every record of
/// the other side, whichever arrives first.
#[derive(Clone, Default)]
struct LocalItemJoin {
    sellers: Option<ListState<Seller>>,
    auctions: Option<ListState<i64>>,
}

fn q3_row(seller: &Seller, auction: i64) -> Q3Row {
    Q3Row {
        name: seller.name.clone(),
        city: seller.city.clone(),
        state: seller.state.clone(),
        id: auction,
    }
}

impl KeyedCoProcessFunction<i64, Seller, SellerAuction, Q3Row> for LocalItemJoin {
    fn open(&mut self, ctx: &mut KeyedContext<i64>) -> TaskResult {
        self.sellers = Some(ctx.list_state("sellers")?);
        self.auctions = Some(ctx.list_state("auctions")?);
        Ok(())
    }

    fn process1(
        &mut self,
        seller: Seller,
        ctx: &mut KeyedContext<i64>,
        out: &mut Collector<Q3Row>,
    ) -> TaskResult {
        let (Some(sellers), Some(auctions)) = (&self.sellers, &self.auctions) else {
            return Ok(());
        };
        for &auction in auctions.get(ctx)? {
            out.collect(q3_row(&seller, auction));
        }
        sellers.add(ctx, seller)
    }

    fn process2(
        &mut self,
        auction: SellerAuction,
        ctx: &mut KeyedContext<i64>,
        out: &mut Collector<Q3Row>,
    ) -> TaskResult {
        let (Some(sellers), Some(auctions)) = (&self.sellers, &self.auctions) else {
            return Ok(());
        };
        for seller in sellers.get(ctx)? {
            out.collect(q3_row(seller, auction.id));
        }
        auctions.add(ctx, auction.id)
    }
}

fn push_int(out: &mut Vec<u8>, v: i64) {
    out.extend_from_slice(itoa::Buffer::new().format(v).as_bytes());
}

fn push_field(out: &mut Vec<u8>, text: &str) {
    out.push(b'\t');
    out.extend_from_slice(text.as_bytes());
}

/// `v / 1000` with three decimals.
fn push_thousandths(out: &mut Vec<u8>, v: i64) {
    if v < 0 {
        out.push(b'-');
    }
    let v = v.unsigned_abs();
    out.extend_from_slice(itoa::Buffer::new().format(v / 1000).as_bytes());
    let frac = v % 1000;
    out.extend_from_slice(&[
        b'.',
        b'0' + (frac / 100) as u8,
        b'0' + (frac / 10 % 10) as u8,
        b'0' + (frac % 10) as u8,
    ]);
}

/// Appends `ms` (since the epoch) as Flink prints a `TIMESTAMP(3)`: `2015-07-15 00:00:00.000`,
/// in UTC.
pub fn push_timestamp(out: &mut Vec<u8>, ms: i64) {
    let (days, ms_of_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil from days (Howard Hinnant's algorithm), in the proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let two = |out: &mut Vec<u8>, v: i64| {
        out.extend_from_slice(&[b'0' + (v / 10) as u8, b'0' + (v % 10) as u8])
    };
    if (0..10_000).contains(&year) {
        out.extend_from_slice(&[
            b'0' + (year / 1000) as u8,
            b'0' + (year / 100 % 10) as u8,
            b'0' + (year / 10 % 10) as u8,
            b'0' + (year % 10) as u8,
        ]);
    } else {
        push_int(out, year);
    }
    out.push(b'-');
    two(out, month);
    out.push(b'-');
    two(out, day);
    out.push(b' ');
    let secs = ms_of_day / 1000;
    two(out, secs / 3600);
    out.push(b':');
    two(out, secs / 60 % 60);
    out.push(b':');
    two(out, secs % 60);
    out.push(b'.');
    let millis = ms_of_day % 1000;
    out.extend_from_slice(&[
        b'0' + (millis / 100) as u8,
        b'0' + (millis / 10 % 10) as u8,
        b'0' + (millis % 10) as u8,
    ]);
}

/// `ms` (since the epoch) as Flink prints a `TIMESTAMP(3)`: `2015-07-15 00:00:00.000`, UTC.
pub fn timestamp_text(ms: i64) -> String {
    let mut out = Vec::with_capacity(23);
    push_timestamp(&mut out, ms);
    String::from_utf8_lossy(&out).into_owned()
}

fn encode_q0(b: &Bid, out: &mut Vec<u8>) {
    push_int(out, b.auction);
    out.push(b'\t');
    push_int(out, b.bidder);
    out.push(b'\t');
    push_int(out, b.price);
    push_field(out, &b.channel);
    push_field(out, &b.url);
    out.push(b'\t');
    push_timestamp(out, b.date_time);
    push_field(out, &b.extra);
    out.push(b'\n');
}

fn encode_q1(r: &Q1Row, out: &mut Vec<u8>) {
    push_int(out, r.auction);
    out.push(b'\t');
    push_int(out, r.bidder);
    out.push(b'\t');
    push_thousandths(out, r.price_thousandths);
    out.push(b'\t');
    push_timestamp(out, r.date_time);
    push_field(out, &r.extra);
    out.push(b'\n');
}

fn encode_q2(r: &(i64, i64), out: &mut Vec<u8>) {
    push_int(out, r.0);
    out.push(b'\t');
    push_int(out, r.1);
    out.push(b'\n');
}

/// Two integer columns (q5: auction, num).
fn encode_q2_shape(r: &(i64, u64), out: &mut Vec<u8>) {
    push_int(out, r.0);
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(r.1).as_bytes());
    out.push(b'\n');
}

fn encode_q7(b: &Bid, out: &mut Vec<u8>) {
    push_int(out, b.auction);
    out.push(b'\t');
    push_int(out, b.price);
    out.push(b'\t');
    push_int(out, b.bidder);
    out.push(b'\t');
    push_timestamp(out, b.date_time);
    push_field(out, &b.extra);
    out.push(b'\n');
}

fn encode_q8(r: &time::Q8Row, out: &mut Vec<u8>) {
    push_int(out, r.id);
    push_field(out, &r.name);
    out.push(b'\t');
    push_timestamp(out, r.start);
    out.push(b'\n');
}

fn encode_q11(r: &time::Q11Row, out: &mut Vec<u8>) {
    push_int(out, r.bidder);
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(r.bid_count).as_bytes());
    out.push(b'\t');
    push_timestamp(out, r.start);
    out.push(b'\t');
    push_timestamp(out, r.end);
    out.push(b'\n');
}

fn encode_q4(r: &time::Q4Row, out: &mut Vec<u8>) {
    push_int(out, r.category);
    out.push(b'\t');
    push_int(out, r.avg);
    out.push(b'\n');
}

fn encode_q12(r: &time::Q12Row, out: &mut Vec<u8>) {
    push_int(out, r.bidder);
    out.push(b'\t');
    out.extend_from_slice(itoa::Buffer::new().format(r.bid_count).as_bytes());
    out.push(b'\t');
    push_int(out, r.start);
    out.push(b'\t');
    push_int(out, r.end);
    out.push(b'\n');
}

fn encode_q3(r: &Q3Row, out: &mut Vec<u8>) {
    out.extend_from_slice(r.name.as_bytes());
    push_field(out, &r.city);
    push_field(out, &r.state);
    out.push(b'\t');
    push_int(out, r.id);
    out.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(query: &str) -> NexmarkArgs {
        NexmarkArgs {
            query: query.into(),
            events: 1000,
            seed: 0,
            rate: 10_000,
        }
    }

    #[test]
    fn timestamps_print_as_flink_prints_a_timestamp_3() {
        assert_eq!(timestamp_text(1_436_918_400_000), "2015-07-15 00:00:00.000");
        assert_eq!(timestamp_text(0), "1970-01-01 00:00:00.000");
        assert_eq!(timestamp_text(-1), "1969-12-31 23:59:59.999");
        assert_eq!(timestamp_text(951_782_400_000), "2000-02-29 00:00:00.000");
        assert_eq!(timestamp_text(1_709_251_199_123), "2024-02-29 23:59:59.123");
        assert_eq!(timestamp_text(4_102_444_800_000), "2100-01-01 00:00:00.000");
        assert_eq!(timestamp_text(1_436_964_321_007), "2015-07-15 12:45:21.007");
    }

    #[test]
    fn prices_convert_exactly() {
        let mut out = Vec::new();
        push_thousandths(&mut out, 123 * 908);
        out.push(b' ');
        push_thousandths(&mut out, 100_000_000 * 908);
        out.push(b' ');
        push_thousandths(&mut out, 5);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "111.684 90800000.000 0.005"
        );
    }

    #[test]
    fn every_available_query_builds_with_stable_uids() {
        for q in QUERIES {
            let graph = build(&args(q), &WordOutput::Discard).unwrap();
            assert!(graph.nodes().iter().any(|n| n.uid == "sink"), "{q}");
            for n in graph.nodes() {
                // Not the uid the API makes up (`<kind>-<node id>`).
                assert!(!n.uid.ends_with(&format!("-{}", n.id)), "{q}: {}", n.uid);
            }
        }
    }

    #[test]
    fn unknown_and_unavailable_queries_are_errors_listing_the_available_ones() {
        let error = |a: &NexmarkArgs| build(a, &WordOutput::Discard).err().unwrap_or_default();
        let e = error(&args("q6"));
        assert_eq!(
            e,
            "nexmark query 'q6' is not available yet; available queries: q0, q1, q2, q3, q4, q5, q7, q8, q11, q12"
        );
        let e = error(&args("q99"));
        assert_eq!(
            e,
            "unknown nexmark query 'q99'; available queries: q0, q1, q2, q3, q4, q5, q7, q8, q11, q12"
        );
        let e = source_records(&args("x")).unwrap_err();
        assert!(e.starts_with("unknown nexmark query 'x'"), "{e}");
        let mut no_events = args("q0");
        no_events.events = 0;
        assert_eq!(error(&no_events), "nexmark needs at least 1 event");
    }

    #[test]
    fn sources_emit_all_events_or_those_q3_joins() {
        assert_eq!(source_records(&args("q0")), Ok(1000));
        assert_eq!(source_records(&args("q4")), Ok(1000));
        assert_eq!(source_records(&args("q12")), Ok(1000));
        assert_eq!(source_records(&args("q3")), Ok(20 + 60));
    }
}
