//! The Nexmark benchmark's events: persons, auctions and bids of an online auction site, from
//! the standard generator's model (the nexmark/nexmark benchmark, after Apache Beam's
//! generator), with every event a pure function of `(seed, event number)`.
//!
//! The model, per global event number `n` (0-based):
//!
//! - the kind, by `n mod 50`: 0 a person, 1–3 an auction, 4–49 a bid (1:3:46);
//! - ids derived from `n`: the person of `n` is number `n / 50`, the auction of `n` number
//!   `3 (n / 50) + (n mod 50) - 1`, both counted from 1000; the newest person and auction at
//!   `n` are those numbers, so bids and auctions refer to people and auctions that exist, a
//!   few of them (the "lead") not yet;
//! - hot sellers, auctions and bidders: an auction's seller is, with probability 3/4, the
//!   first person of the newest batch of 100; a bid's auction is, with probability 1/2, the
//!   first auction of the newest batch of 100, and its bidder, with probability 3/4, the second
//!   person of the newest batch of 100; otherwise one of the 1000 most recent people or 100
//!   most recent auctions (plus the lead of 10), uniformly;
//! - event time `BASE_TIME_MS + n * 1000 / rate` ms: `rate` events per second of event time.
//!   The source emits as fast as it can, so event time runs faster than the wall clock;
//! - an auction expires after a random length averaging the time until 100 more auctions
//!   (the in-flight auctions) have been generated;
//! - prices `round(100 * 10^(6u))` cents for a uniform `u`; half of the bids come from one
//!   of four hot channels, the others from one of 10,000 channels with their URLs;
//! - padding (`extra`) so that persons, auctions and bids average 200, 500 and 100 bytes.
//!
//! Strings are `CompactString`s that never allocate while generating: short ones are inline,
//! and the long random ones (descriptions, URLs, padding) are slices of tables built once per
//! process from a fixed seed. Their lengths follow the standard distributions; their letters
//! are the tables'.
//!
//! Splits take the event numbers by stride (split `j` of `p`: `j, j + p, j + 2p, …`), so the
//! event times of all subtasks advance together and every parallelism produces the same
//! events. A reader with several splits emits their events in event-number order.

use std::sync::OnceLock;

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::error::TaskResult;
use crate::runtime::chain::{Source, SourceReader, SourceStatus};

/// The event time of event 0: 2015-07-15T00:00:00Z, as in Beam's Nexmark.
pub const BASE_TIME_MS: i64 = 1_436_918_400_000;
/// Events per second of event time, unless configured (the standard generator's rate).
pub const DEFAULT_RATE: u64 = 10_000;

/// Persons, auctions and bids of every `TOTAL_PROPORTION` events.
const PERSON_PROPORTION: u64 = 1;
const AUCTION_PROPORTION: u64 = 3;
const TOTAL_PROPORTION: u64 = 50;

const FIRST_PERSON_ID: u64 = 1000;
const FIRST_AUCTION_ID: u64 = 1000;
const FIRST_CATEGORY_ID: u64 = 10;
const CATEGORIES: u64 = 5;
/// People a random seller or bidder is chosen from (the most recent ones).
const ACTIVE_PEOPLE: u64 = 1000;
/// Auctions a random bid is for (the most recent ones), and the average number open at once.
const IN_FLIGHT_AUCTIONS: u64 = 100;
/// Ids past the newest person or auction a random choice may name.
const PERSON_ID_LEAD: u64 = 10;
const AUCTION_ID_LEAD: u64 = 10;
/// 1 in `ratio` choices is not hot: a hot seller, auction or bidder is chosen with
/// probability 1 - 1/ratio.
const HOT_SELLERS_RATIO: u64 = 4;
const HOT_AUCTION_RATIO: u64 = 2;
const HOT_BIDDERS_RATIO: u64 = 4;
const HOT_CHANNELS_RATIO: u64 = 2;
/// The hot person or auction is the first (a bidder: the second) of each batch of this many.
const HOT_BATCH: u64 = 100;
const CHANNELS: usize = 10_000;
const HOT_CHANNELS: [&str; 4] = ["Google", "Facebook", "Baidu", "Apple"];

const AVG_PERSON_BYTES: usize = 200;
const AVG_AUCTION_BYTES: usize = 500;
const AVG_BID_BYTES: usize = 100;
const MIN_STRING_LEN: u64 = 3;

const US_STATES: [&str; 6] = ["AZ", "CA", "ID", "OR", "WA", "WY"];
const US_CITIES: [&str; 10] = [
    "Phoenix",
    "Los Angeles",
    "San Francisco",
    "Boise",
    "Portland",
    "Bend",
    "Redmond",
    "Seattle",
    "Kent",
    "Cheyenne",
];
const FIRST_NAMES: [&str; 11] = [
    "Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie", "Sarah", "Deiter", "Walter",
];
const LAST_NAMES: [&str; 9] = [
    "Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones", "Noris",
];

/// A person: a seller or a bidder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Person {
    /// Person id (from 1000).
    pub id: i64,
    /// First and last name.
    pub name: CompactString,
    /// E-mail address.
    pub email_address: CompactString,
    /// Four groups of four digits.
    pub credit_card: CompactString,
    /// A US city.
    pub city: CompactString,
    /// A US state, two capital letters.
    pub state: CompactString,
    /// Event time, ms since the epoch.
    pub date_time: i64,
    /// Padding.
    pub extra: CompactString,
}

/// An item put up for auction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Auction {
    /// Auction id (from 1000).
    pub id: i64,
    /// Item name.
    pub item_name: CompactString,
    /// Item description.
    pub description: CompactString,
    /// Initial bid, in cents.
    pub initial_bid: i64,
    /// Reserve price, in cents (at least the initial bid).
    pub reserve: i64,
    /// Event time, ms since the epoch.
    pub date_time: i64,
    /// When the auction closes, ms since the epoch (after `date_time`).
    pub expires: i64,
    /// The selling person's id.
    pub seller: i64,
    /// Category id (10 to 14).
    pub category: i64,
    /// Padding.
    pub extra: CompactString,
}

/// A bid on an auction.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bid {
    /// The auction's id.
    pub auction: i64,
    /// The bidding person's id.
    pub bidder: i64,
    /// Price, in cents.
    pub price: i64,
    /// Where the bid came from.
    pub channel: CompactString,
    /// The URL the bid came from.
    pub url: CompactString,
    /// Event time, ms since the epoch.
    pub date_time: i64,
    /// Padding.
    pub extra: CompactString,
}

/// One Nexmark event.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NexmarkEvent {
    /// A new person.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

impl NexmarkEvent {
    /// Event time, ms since the epoch.
    pub fn timestamp_ms(&self) -> i64 {
        match self {
            NexmarkEvent::Person(p) => p.date_time,
            NexmarkEvent::Auction(a) => a.date_time,
            NexmarkEvent::Bid(b) => b.date_time,
        }
    }

    /// Its kind.
    pub fn kind(&self) -> EventKind {
        match self {
            NexmarkEvent::Person(_) => EventKind::Person,
            NexmarkEvent::Auction(_) => EventKind::Auction,
            NexmarkEvent::Bid(_) => EventKind::Bid,
        }
    }
}

/// The kinds of Nexmark events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EventKind {
    /// [`Person`].
    Person,
    /// [`Auction`].
    Auction,
    /// [`Bid`].
    Bid,
}

impl EventKind {
    /// The kind of event number `n`.
    pub fn of(n: u64) -> EventKind {
        match n % TOTAL_PROPORTION {
            r if r < PERSON_PROPORTION => EventKind::Person,
            r if r < PERSON_PROPORTION + AUCTION_PROPORTION => EventKind::Auction,
            _ => EventKind::Bid,
        }
    }

    /// The residues `lo..hi` of event numbers modulo `TOTAL_PROPORTION` of this kind.
    fn residues(self) -> (u64, u64) {
        match self {
            EventKind::Person => (0, PERSON_PROPORTION),
            EventKind::Auction => (PERSON_PROPORTION, PERSON_PROPORTION + AUCTION_PROPORTION),
            EventKind::Bid => (PERSON_PROPORTION + AUCTION_PROPORTION, TOTAL_PROPORTION),
        }
    }

    /// How many of the event numbers `0..events` are of this kind.
    pub fn count_below(self, events: u64) -> u64 {
        let (lo, hi) = self.residues();
        let rest = events % TOTAL_PROPORTION;
        events / TOTAL_PROPORTION * (hi - lo) + rest.clamp(lo, hi) - lo
    }
}

/// Generates the Nexmark event of any event number; a pure function of the seed, the rate
/// and the event number.
///
/// ```
/// use cairn::connectors::{NexmarkEvent, NexmarkGenerator};
///
/// let generator = NexmarkGenerator::new(42, 10_000);
/// assert!(matches!(generator.event(0), NexmarkEvent::Person(_)));
/// assert_eq!(generator.event(7), generator.event(7));
/// assert_eq!(generator.event(10_000).timestamp_ms() - generator.event(0).timestamp_ms(), 1000);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NexmarkGenerator {
    seed: u64,
    rate: u64,
}

impl NexmarkGenerator {
    /// Events from `seed`, `rate_per_sec` events per second of event time (at least 1).
    pub fn new(seed: u64, rate_per_sec: u64) -> Self {
        NexmarkGenerator {
            seed,
            rate: rate_per_sec.max(1),
        }
    }

    /// Event time of event number `n`, ms since the epoch.
    pub fn timestamp_ms(&self, n: u64) -> i64 {
        let offset = u128::from(n) * 1000 / u128::from(self.rate);
        BASE_TIME_MS.saturating_add(i64::try_from(offset).unwrap_or(i64::MAX))
    }

    /// Event number `n`.
    pub fn event(&self, n: u64) -> NexmarkEvent {
        let tables = Tables::get();
        let mut rng = Rng::for_event(self.seed, n);
        let time = self.timestamp_ms(n);
        match EventKind::of(n) {
            EventKind::Person => NexmarkEvent::Person(person(n, time, &mut rng, tables)),
            EventKind::Auction => NexmarkEvent::Auction(self.auction(n, time, &mut rng, tables)),
            EventKind::Bid => NexmarkEvent::Bid(bid(n, time, &mut rng, tables)),
        }
    }

    fn auction(&self, n: u64, time: i64, rng: &mut Rng, tables: &'static Tables) -> Auction {
        let id = last_auction(n) + FIRST_AUCTION_ID;
        let seller = FIRST_PERSON_ID
            + if rng.below(HOT_SELLERS_RATIO) > 0 {
                last_person(n) / HOT_BATCH * HOT_BATCH
            } else {
                next_person(n, rng)
            };
        let category = FIRST_CATEGORY_ID + rng.below(CATEGORIES);
        let initial_bid = next_price(rng);
        let expires = time.saturating_add(self.auction_length_ms(n, time, rng));
        let item_name = tables.next_string(rng, 20);
        let description = tables.next_string(rng, 100);
        let reserve = initial_bid.saturating_add(next_price(rng));
        let size = 8 + item_name.len() + description.len() + 8 + 8 + 8 + 8 + 8;
        Auction {
            id: to_i64(id),
            item_name: CompactString::const_new(item_name),
            description: CompactString::const_new(description),
            initial_bid,
            reserve,
            date_time: time,
            expires,
            seller: to_i64(seller),
            category: to_i64(category),
            extra: tables.next_extra(rng, size, AVG_AUCTION_BYTES),
        }
    }

    /// A random length with the mean of the time until `IN_FLIGHT_AUCTIONS` more auctions.
    fn auction_length_ms(&self, n: u64, time: i64, rng: &mut Rng) -> i64 {
        let events_ahead = IN_FLIGHT_AUCTIONS * TOTAL_PROPORTION / AUCTION_PROPORTION;
        let horizon = self.timestamp_ms(n.saturating_add(events_ahead)) - time;
        let bound = u64::try_from(horizon.saturating_mul(2)).unwrap_or(0).max(1);
        1 + to_i64(rng.below(bound))
    }
}

fn person(n: u64, time: i64, rng: &mut Rng, tables: &'static Tables) -> Person {
    let id = last_person(n) + FIRST_PERSON_ID;
    let mut name = CompactString::const_new(FIRST_NAMES[rng.index(FIRST_NAMES.len())]);
    name.push(' ');
    name.push_str(LAST_NAMES[rng.index(LAST_NAMES.len())]);
    let mut email = CompactString::const_new(tables.next_string(rng, 7));
    email.push('@');
    email.push_str(tables.next_string(rng, 5));
    email.push_str(".com");
    let mut card = [b' '; 19];
    for group in 0..4 {
        let mut digits = rng.below(10_000);
        for i in (0..4).rev() {
            card[group * 5 + i] = b'0' + (digits % 10) as u8;
            digits /= 10;
        }
    }
    let credit_card = CompactString::from_utf8(card).unwrap_or_default();
    let city = US_CITIES[rng.index(US_CITIES.len())];
    let state = US_STATES[rng.index(US_STATES.len())];
    let size = 8 + name.len() + email.len() + credit_card.len() + city.len() + state.len();
    Person {
        id: to_i64(id),
        name,
        email_address: email,
        credit_card,
        city: CompactString::const_new(city),
        state: CompactString::const_new(state),
        date_time: time,
        extra: tables.next_extra(rng, size, AVG_PERSON_BYTES),
    }
}

fn bid(n: u64, time: i64, rng: &mut Rng, tables: &'static Tables) -> Bid {
    let auction = FIRST_AUCTION_ID
        + if rng.below(HOT_AUCTION_RATIO) > 0 {
            last_auction(n) / HOT_BATCH * HOT_BATCH
        } else {
            next_auction(n, rng)
        };
    let bidder = FIRST_PERSON_ID
        + if rng.below(HOT_BIDDERS_RATIO) > 0 {
            last_person(n) / HOT_BATCH * HOT_BATCH + 1
        } else {
            next_person(n, rng)
        };
    let price = next_price(rng);
    let (channel, url) = if rng.below(HOT_CHANNELS_RATIO) > 0 {
        let i = rng.index(HOT_CHANNELS.len());
        (HOT_CHANNELS[i], tables.hot_urls[i].as_str())
    } else {
        let (channel, url) = &tables.channels[rng.index(tables.channels.len())];
        (channel.as_str(), url.as_str())
    };
    Bid {
        auction: to_i64(auction),
        bidder: to_i64(bidder),
        price,
        channel: CompactString::const_new(channel),
        url: CompactString::const_new(url),
        date_time: time,
        extra: tables.next_extra(rng, 8 + 8 + 8 + 8, AVG_BID_BYTES),
    }
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The newest person at event `n` (0-based; the current one if `n` is a person): with one
/// person per `TOTAL_PROPORTION` events, the person of `n`'s group.
fn last_person(n: u64) -> u64 {
    const _: () = assert!(PERSON_PROPORTION == 1);
    n / TOTAL_PROPORTION
}

/// The newest auction at event `n` (0-based; the current one if `n` is an auction). Only
/// asked for auctions and bids, which always have one.
fn last_auction(n: u64) -> u64 {
    let (epoch, offset) = (n / TOTAL_PROPORTION, n % TOTAL_PROPORTION);
    if offset < PERSON_PROPORTION {
        (epoch * AUCTION_PROPORTION).saturating_sub(1)
    } else if offset >= PERSON_PROPORTION + AUCTION_PROPORTION {
        epoch * AUCTION_PROPORTION + AUCTION_PROPORTION - 1
    } else {
        epoch * AUCTION_PROPORTION + offset - PERSON_PROPORTION
    }
}

/// A random one of the active people, or a few not yet created.
fn next_person(n: u64, rng: &mut Rng) -> u64 {
    let people = last_person(n) + 1;
    let active = people.min(ACTIVE_PEOPLE);
    people - active + rng.below(active + PERSON_ID_LEAD)
}

/// A random one of the auctions likely to be in flight, or a few not yet created.
fn next_auction(n: u64, rng: &mut Rng) -> u64 {
    let max = last_auction(n);
    let min = max.saturating_sub(IN_FLIGHT_AUCTIONS);
    min + rng.below(max - min + 1 + AUCTION_ID_LEAD)
}

/// Cents: `round(100 * 10^(6u))`, from 1 dollar to 1 million.
fn next_price(rng: &mut Rng) -> i64 {
    (10f64.powf(rng.unit() * 6.0) * 100.0).round() as i64
}

/// splitmix64: a fast generator whose every output is a strong mix of its counter, so one
/// seeded from `(seed, n)` gives independent streams for neighbouring event numbers.
#[derive(Debug, Clone, Copy)]
struct Rng(u64);

const GOLDEN_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl Rng {
    fn for_event(seed: u64, n: u64) -> Rng {
        Rng(mix(mix(seed.wrapping_add(GOLDEN_GAMMA)) ^ n))
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(GOLDEN_GAMMA);
        mix(self.0)
    }

    /// Uniform in `0..bound` (0 if `bound` is 0).
    fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Bytes of each random text table.
const TABLE_BYTES: usize = 1 << 16;

/// Built once per process from fixed seeds: random text to slice strings from, and the
/// channels with their URLs.
struct Tables {
    /// Lower-case letters and, 1 in 13, spaces (names and descriptions).
    text: String,
    /// Lower-case letters (padding).
    letters: String,
    hot_urls: [String; 4],
    channels: Vec<(String, String)>,
}

impl Tables {
    fn get() -> &'static Tables {
        static TABLES: OnceLock<Tables> = OnceLock::new();
        TABLES.get_or_init(Tables::build)
    }

    fn build() -> Tables {
        let mut rng = Rng::for_event(0x6e65_786d_6172_6b00, 0);
        let text = random_text(&mut rng, TABLE_BYTES, true);
        let letters = random_text(&mut rng, TABLE_BYTES, false);
        let hot_urls = std::array::from_fn(|_| base_url(&mut rng));
        let channels = (0..CHANNELS)
            .map(|i| {
                let mut url = base_url(&mut rng);
                if rng.below(10) > 0 {
                    url.push_str("&channel_id=");
                    // The standard's `Math.abs(Integer.reverse(i))`.
                    let id = (i as i32).reverse_bits().wrapping_abs();
                    url.push_str(itoa::Buffer::new().format(id));
                }
                (format!("channel-{i}"), url)
            })
            .collect();
        Tables {
            text,
            letters,
            hot_urls,
            channels,
        }
    }

    /// A random string of 3 to `max - 1` characters with spaces, trimmed.
    fn next_string(&'static self, rng: &mut Rng, max: u64) -> &'static str {
        let len = (MIN_STRING_LEN + rng.below(max - MIN_STRING_LEN)) as usize;
        slice(&self.text, rng, len).trim()
    }

    /// Padding that brings an event of `size` bytes to `average` bytes on average (±20 %).
    fn next_extra(&'static self, rng: &mut Rng, size: usize, average: usize) -> CompactString {
        let Some(wanted) = average.checked_sub(size) else {
            return CompactString::const_new("");
        };
        let delta = (wanted as f64 * 0.2).round() as usize;
        let len = wanted - delta + rng.index(2 * delta);
        CompactString::const_new(slice(&self.letters, rng, len))
    }
}

/// `len` bytes of `table` (ASCII) from a random offset.
fn slice<'a>(table: &'a str, rng: &mut Rng, len: usize) -> &'a str {
    let len = len.min(table.len());
    let start = rng.index(table.len() - len + 1);
    table.get(start..start + len).unwrap_or("")
}

fn random_text(rng: &mut Rng, len: usize, spaces: bool) -> String {
    (0..len)
        .map(|_| {
            if spaces && rng.below(13) == 0 {
                ' '
            } else {
                char::from(b'a' + rng.below(26) as u8)
            }
        })
        .collect()
}

/// `https://www.nexmark.com/<a>/<b>/<c>/item.htm?query=1` with three short random words.
fn base_url(rng: &mut Rng) -> String {
    let mut url = String::from("https://www.nexmark.com");
    for _ in 0..3 {
        url.push('/');
        let len = (MIN_STRING_LEN + rng.below(5 - MIN_STRING_LEN)) as usize;
        url.push_str(random_text(rng, len, true).trim());
    }
    url.push_str("/item.htm?query=1");
    url
}

/// `events` Nexmark events (or only those of one kind), split over the subtasks by stride.
#[derive(Debug, Clone)]
pub struct NexmarkSource {
    events: u64,
    generator: NexmarkGenerator,
    only: Option<EventKind>,
}

impl NexmarkSource {
    /// Events `0..events` of `generator`.
    pub fn new(events: u64, generator: NexmarkGenerator) -> Self {
        NexmarkSource {
            events,
            generator,
            only: None,
        }
    }

    /// Emits only the events of `kind` (the others are skipped, not generated).
    pub fn only(mut self, kind: EventKind) -> Self {
        self.only = Some(kind);
        self
    }

    /// How many records the source emits in all.
    pub fn records(&self) -> u64 {
        match self.only {
            Some(kind) => kind.count_below(self.events),
            None => self.events,
        }
    }
}

/// Event numbers `next, next + step, …` below `end`: one split and its position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Split {
    next: u64,
    step: u64,
    end: u64,
}

impl Split {
    fn is_done(&self) -> bool {
        self.next >= self.end
    }

    /// Moves `next` on to an event number of `kind`, or to the end if there is none. Event
    /// numbers `next + k * step` repeat their kinds with a period dividing
    /// `TOTAL_PROPORTION`, so that many steps without one mean there is none.
    fn seek(&mut self, kind: Option<EventKind>) {
        let Some(kind) = kind else { return };
        for _ in 0..TOTAL_PROPORTION {
            if self.is_done() || EventKind::of(self.next) == kind {
                return;
            }
            self.next = self.next.saturating_add(self.step);
        }
        self.next = self.end;
    }
}

impl Source<NexmarkEvent> for NexmarkSource {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        let p = u64::from(parallelism.max(1));
        let splits: Vec<Split> = (0..p)
            .map(|j| Split {
                next: j,
                step: p,
                end: self.events,
            })
            .collect();
        super::encode_splits(&splits)
    }

    fn create_reader(
        &self,
        _subtask: u32,
        _parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<NexmarkEvent>>> {
        let mut splits: Vec<Split> = super::decode_splits("nexmark", &splits)?;
        for s in &mut splits {
            s.step = s.step.max(1);
            s.seek(self.only);
        }
        Ok(Box::new(NexmarkReader {
            generator: self.generator,
            only: self.only,
            splits,
        }))
    }
}

struct NexmarkReader {
    generator: NexmarkGenerator,
    only: Option<EventKind>,
    /// Each at an event number of the wanted kind, or done.
    splits: Vec<Split>,
}

impl NexmarkReader {
    /// The split with the smallest next event number, so that event time never goes back.
    fn earliest(&mut self) -> Option<&mut Split> {
        self.splits
            .iter_mut()
            .filter(|s| !s.is_done())
            .min_by_key(|s| s.next)
    }
}

impl SourceReader<NexmarkEvent> for NexmarkReader {
    fn poll(&mut self, out: &mut Vec<NexmarkEvent>, max: usize) -> TaskResult<SourceStatus> {
        let (generator, only) = (self.generator, self.only);
        let mut emitted = 0;
        while emitted < max {
            let Some(split) = self.earliest() else { break };
            out.push(generator.event(split.next));
            split.next = split.next.saturating_add(split.step);
            split.seek(only);
            emitted += 1;
        }
        if emitted == 0 {
            return Ok(SourceStatus::Exhausted);
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        super::encode_splits(&self.splits)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn read_all(reader: &mut dyn SourceReader<NexmarkEvent>) -> Vec<NexmarkEvent> {
        let mut out = Vec::new();
        while reader.poll(&mut out, 100).unwrap() == SourceStatus::More {}
        out
    }

    /// Every event of every subtask at parallelism `p`, per subtask.
    fn run(source: &NexmarkSource, p: u32) -> Vec<Vec<NexmarkEvent>> {
        let splits = source.create_splits(p).unwrap();
        splits
            .into_iter()
            .enumerate()
            .map(|(j, split)| {
                let mut reader = source.create_reader(j as u32, p, vec![split]).unwrap();
                read_all(reader.as_mut())
            })
            .collect()
    }

    fn sorted(events: impl IntoIterator<Item = NexmarkEvent>) -> Vec<String> {
        let mut v: Vec<String> = events.into_iter().map(|e| format!("{e:?}")).collect();
        v.sort_unstable();
        v
    }

    #[test]
    fn kinds_come_in_the_ratio_1_3_46() {
        let g = NexmarkGenerator::new(1, DEFAULT_RATE);
        let mut counts: HashMap<EventKind, u64> = HashMap::new();
        for n in 0..50_000 {
            let e = g.event(n);
            assert_eq!(e.kind(), EventKind::of(n));
            *counts.entry(e.kind()).or_default() += 1;
        }
        assert_eq!(counts[&EventKind::Person], 1_000);
        assert_eq!(counts[&EventKind::Auction], 3_000);
        assert_eq!(counts[&EventKind::Bid], 46_000);
        for events in [0, 1, 2, 4, 5, 49, 50, 51, 53, 54, 12_345] {
            let by_kind: Vec<u64> = [EventKind::Person, EventKind::Auction, EventKind::Bid]
                .iter()
                .map(|k| (0..events).filter(|&n| EventKind::of(n) == *k).count() as u64)
                .collect();
            assert_eq!(
                by_kind,
                [
                    EventKind::Person.count_below(events),
                    EventKind::Auction.count_below(events),
                    EventKind::Bid.count_below(events)
                ],
                "{events} events"
            );
        }
    }

    #[test]
    fn ids_follow_the_event_numbers() {
        let g = NexmarkGenerator::new(3, DEFAULT_RATE);
        let mut persons = Vec::new();
        let mut auctions = Vec::new();
        for n in 0..5_000 {
            match g.event(n) {
                NexmarkEvent::Person(p) => persons.push(p.id),
                NexmarkEvent::Auction(a) => {
                    assert!(a.expires > a.date_time);
                    assert!(a.reserve >= a.initial_bid);
                    assert!((10..15).contains(&a.category));
                    auctions.push(a.id)
                }
                NexmarkEvent::Bid(b) => {
                    assert!(b.price >= 100 && b.price <= 100_000_000, "{b:?}");
                    assert!(!b.channel.is_empty() && b.url.starts_with("https://"));
                }
            }
        }
        assert_eq!(persons, (1000..1100).collect::<Vec<i64>>());
        assert_eq!(auctions, (1000..1300).collect::<Vec<i64>>());
    }

    #[test]
    fn the_same_events_at_every_parallelism() {
        let source = NexmarkSource::new(20_000, NexmarkGenerator::new(7, DEFAULT_RATE));
        let one = sorted(run(&source, 1).into_iter().flatten());
        assert_eq!(one.len(), 20_000);
        for p in [2, 3] {
            assert_eq!(sorted(run(&source, p).into_iter().flatten()), one, "p={p}");
        }
        let other_seed = NexmarkSource::new(20_000, NexmarkGenerator::new(8, DEFAULT_RATE));
        assert_ne!(sorted(run(&other_seed, 1).into_iter().flatten()), one);
    }

    #[test]
    fn one_kind_only_is_the_same_events_of_that_kind() {
        let g = NexmarkGenerator::new(9, DEFAULT_RATE);
        let all = NexmarkSource::new(10_007, g);
        for kind in [EventKind::Person, EventKind::Auction, EventKind::Bid] {
            let only = NexmarkSource::new(10_007, g).only(kind);
            let expected = sorted(
                run(&all, 1)
                    .into_iter()
                    .flatten()
                    .filter(|e| e.kind() == kind),
            );
            assert_eq!(expected.len() as u64, only.records());
            for p in [1, 2, 3, 5] {
                assert_eq!(sorted(run(&only, p).into_iter().flatten()), expected);
            }
        }
    }

    #[test]
    fn a_restored_reader_continues_with_exactly_the_remaining_events() {
        for only in [None, Some(EventKind::Auction)] {
            let mut source = NexmarkSource::new(5_000, NexmarkGenerator::new(11, 500));
            source.only = only;
            let splits = source.create_splits(3).unwrap();
            let uninterrupted = run(&source, 3);
            for (j, split) in splits.into_iter().enumerate() {
                let mut reader = source.create_reader(j as u32, 3, vec![split]).unwrap();
                let mut first = Vec::new();
                for _ in 0..4 {
                    reader.poll(&mut first, 37).unwrap();
                }
                let mut restored = source
                    .create_reader(j as u32, 3, reader.snapshot().unwrap())
                    .unwrap();
                first.extend(read_all(restored.as_mut()));
                assert_eq!(first, uninterrupted[j], "split {j} of {only:?}");
            }
        }
    }

    #[test]
    fn a_reader_of_several_splits_keeps_event_time_in_order() {
        let source = NexmarkSource::new(3_000, NexmarkGenerator::new(5, 1_000));
        let splits = source.create_splits(4).unwrap();
        let mut reader = source.create_reader(0, 1, splits[1..].to_vec()).unwrap();
        let events = read_all(reader.as_mut());
        let times: Vec<i64> = events.iter().map(NexmarkEvent::timestamp_ms).collect();
        assert!(times.windows(2).all(|w| w[0] <= w[1]));
        assert_eq!(events.len(), 3_000 - 750);
    }

    #[test]
    fn timestamps_advance_by_the_rate_within_a_split() {
        for rate in [1, 3, 1_000, DEFAULT_RATE, 1_000_000] {
            let g = NexmarkGenerator::new(2, rate);
            let source = NexmarkSource::new(6_000, g);
            for (j, events) in run(&source, 3).into_iter().enumerate() {
                for (k, e) in events.iter().enumerate() {
                    let n = (j + 3 * k) as u64;
                    let offset = (n as u128 * 1000 / rate as u128) as i64;
                    assert_eq!(e.timestamp_ms(), BASE_TIME_MS + offset, "rate {rate}");
                }
                let times: Vec<i64> = events.iter().map(NexmarkEvent::timestamp_ms).collect();
                assert!(times.windows(2).all(|w| w[0] <= w[1]));
            }
        }
        let g = NexmarkGenerator::new(2, DEFAULT_RATE);
        assert_eq!(
            g.timestamp_ms(DEFAULT_RATE * 60) - g.timestamp_ms(0),
            60_000
        );
    }

    #[test]
    fn hot_auctions_bidders_and_sellers_dominate() {
        let g = NexmarkGenerator::new(13, DEFAULT_RATE);
        let (mut bids, mut hot_auction, mut hot_bidder) = (0u64, 0u64, 0u64);
        let (mut auctions, mut hot_seller) = (0u64, 0u64);
        let mut per_auction: HashMap<i64, u64> = HashMap::new();
        for n in 0..200_000 {
            match g.event(n) {
                NexmarkEvent::Bid(b) => {
                    bids += 1;
                    *per_auction.entry(b.auction).or_default() += 1;
                    hot_auction += u64::from((b.auction - 1000) % 100 == 0);
                    hot_bidder += u64::from((b.bidder - 1000) % 100 == 1);
                }
                NexmarkEvent::Auction(a) => {
                    auctions += 1;
                    hot_seller += u64::from((a.seller - 1000) % 100 == 0);
                }
                NexmarkEvent::Person(_) => {}
            }
        }
        // Hot with probability 1/2 (auctions) and 3/4 (bidders, sellers), plus the random
        // choices that hit one.
        let share = |hot: u64, all: u64| hot as f64 / all as f64;
        assert!((0.49..0.53).contains(&share(hot_auction, bids)));
        assert!((0.74..0.78).contains(&share(hot_bidder, bids)));
        assert!((0.72..0.78).contains(&share(hot_seller, auctions)));
        // One auction in 100 is hot, and they get half of the bids.
        let mut counts: Vec<u64> = per_auction.values().copied().collect();
        counts.sort_unstable();
        let hot = (auctions / 100) as usize;
        let top: u64 = counts.iter().rev().take(hot).sum();
        assert!(
            share(top, bids) > 0.45,
            "top {hot} auctions: {top} of {bids} bids"
        );
    }

    #[test]
    fn strings_have_the_standard_shapes() {
        let g = NexmarkGenerator::new(17, DEFAULT_RATE);
        let (mut bid_bytes, mut bids) = (0usize, 0usize);
        for n in 0..20_000 {
            match g.event(n) {
                NexmarkEvent::Person(p) => {
                    assert_eq!(p.credit_card.len(), 19);
                    assert!(p.email_address.ends_with(".com") && p.email_address.contains('@'));
                    assert!(US_STATES.contains(&p.state.as_str()));
                    assert!(p.name.contains(' '));
                }
                NexmarkEvent::Auction(a) => {
                    assert!(a.item_name.len() < 20 && a.description.len() < 100);
                }
                NexmarkEvent::Bid(b) => {
                    bids += 1;
                    bid_bytes += 32 + b.extra.len();
                }
            }
        }
        let average = bid_bytes / bids;
        assert!((95..=105).contains(&average), "average bid {average} bytes");
    }

    #[test]
    fn corrupt_positions_are_an_error() {
        let source = NexmarkSource::new(10, NexmarkGenerator::new(0, 1));
        assert!(source.create_reader(0, 1, vec![vec![0xff; 3]]).is_err());
    }
}
