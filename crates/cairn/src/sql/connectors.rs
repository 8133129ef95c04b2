//! SQL tables over cairn's connectors, with Flink's option names: sources (`nexmark`,
//! `datagen`, `filesystem`, `kafka`) that make [`Row`]s, and sinks (`filesystem`, `print`,
//! `blackhole`, `jdbc`, `kafka`, `upsert-kafka`) that take them. The Kafka ones live in
//! [`super::kafka`].

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::api::{DataStream, StreamEnv, WatermarkStrategy};
use crate::connectors::{
    DiscardSink, EventKind, FileSink, FileSource, NexmarkEvent, NexmarkGenerator, NexmarkSource,
    PrintSink, SequenceSource,
};
use crate::error::{TaskError, TaskResult};
use crate::runtime::chain::{delegate_source_reader, PollRead, Source, SourceReader, SourceStatus};

use super::calc::Calc;
use super::expr::{BinOp, Expr};
use super::plan::Table;
use super::types::{parse_timestamp, write_timestamp, Row, RowKind, SqlType, Value};
use super::SqlError;

/// The connectors SQL tables can use.
pub const CONNECTORS: &[&str] = &[
    "nexmark",
    "datagen",
    "filesystem",
    "print",
    "blackhole",
    "jdbc",
    "kafka",
    "upsert-kafka",
];

type Result<T> = std::result::Result<T, SqlError>;

pub(super) fn table_err<T>(table: &Table, message: impl std::fmt::Display) -> Result<T> {
    Err(SqlError::at(
        table.def.at,
        format!("table '{}': {message}", table.def.name),
    ))
}

/// The table's options, each read at most once, so that unknown ones are refused.
pub(super) struct Options<'a> {
    table: &'a Table,
    left: BTreeMap<String, String>,
}

impl<'a> Options<'a> {
    fn new(table: &'a Table) -> Options<'a> {
        let mut left = table.def.options.clone();
        left.remove("connector");
        Options { table, left }
    }

    pub(super) fn take(&mut self, key: &str) -> Option<String> {
        self.left.remove(key)
    }

    #[cfg(feature = "kafka")]
    /// Whether the option is there (and not read yet).
    pub(super) fn has(&self, key: &str) -> bool {
        self.left.contains_key(key)
    }

    #[cfg(feature = "kafka")]
    /// Takes every option whose key starts with `prefix`, as (the rest of the key, value).
    pub(super) fn take_prefixed(&mut self, prefix: &str) -> Vec<(String, String)> {
        let keys: Vec<String> = self
            .left
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect();
        keys.into_iter()
            .filter_map(|k| {
                let v = self.left.remove(&k)?;
                Some((k[prefix.len()..].to_string(), v))
            })
            .collect()
    }

    fn number(&mut self, key: &str, default: u64) -> Result<u64> {
        match self.take(key) {
            None => Ok(default),
            Some(v) => v.trim().parse().or_else(|_| {
                table_err(
                    self.table,
                    format!("option '{key}' must be a whole number, got '{v}'"),
                )
            }),
        }
    }

    /// Refuses the options nobody read.
    pub(super) fn finish(self, connector: &str, known: &[&str]) -> Result<()> {
        match self.left.keys().next() {
            None => Ok(()),
            Some(k) => table_err(
                self.table,
                format!(
                    "unsupported option '{k}' for connector '{connector}' (supported: {}){}",
                    known.join(", "),
                    super::did_you_mean(k, known.iter().copied())
                ),
            ),
        }
    }
}

fn connector(table: &Table) -> Result<String> {
    match table.def.options.get("connector") {
        Some(c) if CONNECTORS.contains(&c.as_str()) => Ok(c.clone()),
        Some(c) => table_err(
            table,
            format!(
                "unknown connector '{c}' (available: {}){}",
                CONNECTORS.join(", "),
                super::did_you_mean(c, CONNECTORS.iter().copied())
            ),
        ),
        None => table_err(table, "the WITH options name no 'connector'"),
    }
}

/// How many rows a table's source reads, if that is known before it runs (`nexmark`'s
/// `events.num`, `datagen`'s `number-of-rows`).
pub fn source_rows(table: &Table) -> Option<u64> {
    let option = match table.def.options.get("connector")?.as_str() {
        "nexmark" => "events.num",
        "datagen" => "number-of-rows",
        _ => return None,
    };
    table.def.options.get(option)?.trim().parse().ok()
}

/// A table's rows as a scan gives them to the plan.
pub struct Scanned {
    /// The rows, with timestamps and watermarks when the table declares a `WATERMARK`.
    pub stream: DataStream<Row>,
    /// What EXPLAIN says of what the source skips.
    pub note: Option<String>,
    /// Whether the source ran the calc over it (it read only what the calc uses): its rows
    /// are then the calc's output, with the calc's event-time column as their timestamps.
    pub calc_in_source: bool,
}

/// The calc a scan's rows meet next (over the table's columns), which a source may run.
#[derive(Clone, Copy)]
pub struct ScanCalc<'a> {
    /// Rows it rejects are dropped (None: every row passes).
    pub filter: Option<&'a Expr>,
    /// The calc's output.
    pub project: &'a [Expr],
    /// The event-time column of its output, if it has one.
    pub rowtime: Option<usize>,
}

/// Reads a table: its rows, computed columns included, with timestamps and watermarks when
/// it declares a `WATERMARK`. `calc`, the filter and projection the rows meet next, lets a
/// connector skip rows it knows fail the filter (the filter still runs after), or run the
/// calc itself over rows of only the columns and fields it uses ([`Scanned::calc_in_source`]).
pub fn source(
    env: &StreamEnv,
    table: &Arc<Table>,
    uid: &str,
    seed: u64,
    calc: Option<ScanCalc<'_>>,
) -> Result<Scanned> {
    let filter = calc.and_then(|c| c.filter);
    let name = connector(table)?;
    let mut options = Options::new(table);
    let stream = match name.as_str() {
        "nexmark" => {
            let only = filter.and_then(nexmark_kind);
            let source = nexmark(table, &mut options, seed, only)?;
            options.finish("nexmark", NEXMARK_OPTIONS)?;
            let mut note = only.map(|kind| match kind {
                EventKind::Person => "only persons".to_string(),
                EventKind::Auction => "only auctions".to_string(),
                EventKind::Bid => "only bids".to_string(),
            });
            // The event type is then a constant (the table's `dateTime` picks the kind's own
            // time), and the other kinds' rows NULL.
            let known = |col: usize, field: Option<usize>| match (only, col, field) {
                (Some(kind), 0, None) => Some(Expr::Lit(Value::Int(kind_code(kind)))),
                (Some(kind), 1..=3, _) if col != 1 + kind_code(kind) as usize => {
                    Some(Expr::Lit(Value::Null))
                }
                _ => None,
            };
            if let Some((c, p)) =
                calc.and_then(|c| Some((c, prune(table, c.filter, c.project, &known)?)))
            {
                let fields = p.leaves.len();
                note = Some(match note {
                    Some(n) => format!("{n}, {fields} fields read"),
                    None => format!("{fields} fields read"),
                });
                let delay = p.rowtime.map(|(_, delay)| delay);
                let source = NarrowSource {
                    inner: source.inner,
                    narrowing: Arc::new(Narrowing {
                        leaves: p.leaves,
                        computed: p.computed,
                        rowtime: p.rowtime.map(|(col, _)| col),
                        calc: Calc::new(p.filter, p.project),
                    }),
                };
                let time = delay.map(|delay| (c.rowtime, delay));
                return Ok(Scanned {
                    stream: timed(env, source, time, table, uid),
                    note,
                    calc_in_source: true,
                });
            }
            let computed = table
                .computed
                .iter()
                .map(|e| {
                    e.rewrite(&mut |x| x.as_col().and_then(|c| known(c, None)))
                        .folded()
                })
                .collect();
            let stream = attach_computed(env, source, table, uid, table.rowtime, computed);
            return Ok(Scanned {
                stream,
                note,
                calc_in_source: false,
            });
        }
        "datagen" => {
            let source = datagen(table, &mut options)?;
            options.finish("datagen", DATAGEN_OPTIONS)?;
            Ok(attach(env, source, table, uid))
        }
        "filesystem" => {
            let path = options.take("path").ok_or_else(|| {
                SqlError::at(
                    table.def.at,
                    format!("table '{}': option 'path' is required", table.def.name),
                )
            })?;
            let format = Format::of(table, &mut options)?;
            options.finish("filesystem", FILESYSTEM_OPTIONS)?;
            let types: Vec<SqlType> = table.columns[..table.physical]
                .iter()
                .map(|c| c.ty.clone())
                .collect();
            let names: Vec<String> = table.columns[..table.physical]
                .iter()
                .map(|c| c.name.clone())
                .collect();
            let parse = Arc::new(move |line: String| format.parse(&line, &names, &types));
            Ok(attach(
                env,
                MapSource {
                    inner: FileSource::new(path),
                    map: parse,
                },
                table,
                uid,
            ))
        }
        "kafka" | "upsert-kafka" => kafka_source(env, table, options, uid, name == "upsert-kafka"),
        _ => table_err(table, format!("connector '{name}' can only be written to")),
    }?;
    Ok(Scanned {
        stream,
        note: None,
        calc_in_source: false,
    })
}

/// A value a narrowed row holds: physical column `col` of the table, or field `field` of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Leaf {
    col: usize,
    field: Option<usize>,
}

/// How a source reads only what the calc over it uses: its rows are the leaves, then the
/// table's computed columns over them.
struct Pruned {
    leaves: Vec<Leaf>,
    /// The computed columns, over the leaves.
    computed: Vec<Expr>,
    /// The event-time column in the narrowed rows, and the watermark's delay.
    rowtime: Option<(usize, i64)>,
    /// The calc's filter (None if it always holds) and projection, over the narrowed rows.
    filter: Option<Expr>,
    project: Vec<Expr>,
}

/// What `filter` and `project` (over `table`'s columns) read, as [`Pruned`]; `known` gives
/// the leaves the source makes constant. None when a whole ROW column is read.
fn prune(
    table: &Table,
    filter: Option<&Expr>,
    project: &[Expr],
    known: &dyn Fn(usize, Option<usize>) -> Option<Expr>,
) -> Option<Pruned> {
    let physical = table.physical;
    let mut leaves: Vec<Leaf> = Vec::new();
    let mut whole_row = false;
    // Each physical read becomes the column of its leaf; computed columns follow the
    // leaves, so they are numbered once every leaf is known.
    const COMPUTED: usize = usize::MAX / 2;
    let mut narrow = |e: &Expr| -> Expr {
        e.rewrite(&mut |x| {
            let leaf = match x {
                // A field of a computed ROW is read from the computed column.
                Expr::Field(inner, i) => Leaf {
                    col: inner.as_col().filter(|c| *c < physical)?,
                    field: Some(*i),
                },
                Expr::Col(c) if *c >= physical => return Some(Expr::Col(COMPUTED + c - physical)),
                Expr::Col(c) => Leaf {
                    col: *c,
                    field: None,
                },
                _ => return None,
            };
            if let Some(k) = known(leaf.col, leaf.field) {
                return Some(k);
            }
            whole_row |=
                leaf.field.is_none() && matches!(table.columns[leaf.col].ty, SqlType::Row(_));
            let i = leaves.iter().position(|l| *l == leaf).unwrap_or_else(|| {
                leaves.push(leaf);
                leaves.len() - 1
            });
            Some(Expr::Col(i))
        })
    };
    let computed: Vec<Expr> = table.computed.iter().map(|e| narrow(e).folded()).collect();
    let filter = filter.map(|f| narrow(f).folded());
    let project: Vec<Expr> = project.iter().map(|e| narrow(e).folded()).collect();
    let rowtime = match table.rowtime {
        Some((c, delay)) if c >= physical => Some((c - physical, delay)),
        Some(_) => return None,
        None => None,
    };
    if whole_row {
        return None;
    }
    let n = leaves.len();
    let renumber = |e: Expr| {
        e.rewrite(&mut |x| match x {
            Expr::Col(c) if *c >= COMPUTED => Some(Expr::Col(n + c - COMPUTED)),
            _ => None,
        })
    };
    let filter = filter
        .map(renumber)
        .filter(|f| !matches!(f, Expr::Lit(Value::Bool(true))));
    let project: Vec<Expr> = project.into_iter().map(renumber).collect();
    Some(Pruned {
        computed: computed.into_iter().map(renumber).collect(),
        rowtime: rowtime.map(|(c, d)| (n + c, d)),
        leaves,
        filter,
        project,
    })
}

#[cfg(feature = "kafka")]
use super::kafka::{sink as kafka_sink, source as kafka_source};

#[cfg(not(feature = "kafka"))]
fn kafka_source(
    _: &StreamEnv,
    table: &Arc<Table>,
    _: Options,
    _: &str,
    _: bool,
) -> Result<DataStream<Row>> {
    kafka_missing(table)
}

#[cfg(not(feature = "kafka"))]
fn kafka_sink(
    _: DataStream<Row>,
    table: &Table,
    _: Options,
    _: bool,
    _: &str,
    _: bool,
) -> Result<()> {
    kafka_missing(table)
}

#[cfg(not(feature = "kafka"))]
fn kafka_missing<T>(table: &Table) -> Result<T> {
    table_err(
        table,
        "the kafka and upsert-kafka connectors need cairn built with the `kafka` feature",
    )
}

pub(super) type RowMap<T> = Arc<dyn Fn(T) -> TaskResult<Row> + Send + Sync>;

pub(super) fn attach(
    env: &StreamEnv,
    source: impl Source<Row>,
    table: &Arc<Table>,
    uid: &str,
) -> DataStream<Row> {
    attach_computed(
        env,
        source,
        table,
        uid,
        table.rowtime,
        table.computed.clone(),
    )
}

/// [`attach`] with the event-time column (and the watermark's delay) and the computed
/// columns' expressions given.
fn attach_computed(
    env: &StreamEnv,
    source: impl Source<Row>,
    table: &Arc<Table>,
    uid: &str,
    rowtime: Option<(usize, i64)>,
    computed: Vec<Expr>,
) -> DataStream<Row> {
    let computed = Arc::new(computed);
    let source = Computed {
        inner: source,
        computed,
    };
    timed(
        env,
        source,
        rowtime.map(|(col, delay)| (Some(col), delay)),
        table,
        uid,
    )
}

/// The stream of `source`'s rows; with `time` (the event-time column of the rows, and the
/// watermark's delay), their timestamps and the source's watermarks.
fn timed(
    env: &StreamEnv,
    source: impl Source<Row>,
    time: Option<(Option<usize>, i64)>,
    table: &Table,
    uid: &str,
) -> DataStream<Row> {
    let stream = match time {
        Some((col, delay)) => {
            let ts = move |r: &Row| {
                col.and_then(|c| r.values.get(c))
                    .and_then(Value::as_i64)
                    .unwrap_or(i64::MIN)
            };
            let strategy = WatermarkStrategy::bounded_out_of_orderness(
                std::time::Duration::from_millis(delay.max(0) as u64),
                ts,
            );
            env.source_with_watermarks(source, strategy)
        }
        None => env.source(source),
    };
    stream.uid(uid).name(&format!("source: {}", table.def.name))
}

/// A source whose records are mapped into rows, batch by batch.
pub(super) struct MapSource<S, T> {
    pub(super) inner: S,
    pub(super) map: RowMap<T>,
}

impl<S: Source<T>, T: Send + 'static> Source<Row> for MapSource<S, T> {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        self.inner.create_splits(parallelism)
    }

    fn create_reader(
        &self,
        subtask: u32,
        parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<Row>>> {
        Ok(Box::new(MapReader {
            inner: self.inner.create_reader(subtask, parallelism, splits)?,
            map: self.map.clone(),
            scratch: Vec::new(),
        }))
    }
}

struct MapReader<T> {
    inner: Box<dyn SourceReader<T>>,
    map: RowMap<T>,
    scratch: Vec<T>,
}

impl<T: Send> SourceReader<Row> for MapReader<T> {
    fn poll(&mut self, out: &mut Vec<Row>, max: usize) -> TaskResult<SourceStatus> {
        let status = self.inner.poll(&mut self.scratch, max)?;
        out.reserve(self.scratch.len());
        for record in self.scratch.drain(..) {
            out.push((self.map)(record)?);
        }
        Ok(status)
    }
    fn last_read(&mut self) -> Option<PollRead> {
        self.inner.last_read()
    }
    delegate_source_reader!(inner);
}

/// Appends the computed columns to every row a source reads (before timestamps are taken,
/// so that a computed column can be the event time).
struct Computed<S> {
    inner: S,
    computed: Arc<Vec<super::expr::Expr>>,
}

impl<S: Source<Row>> Source<Row> for Computed<S> {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        self.inner.create_splits(parallelism)
    }

    fn create_reader(
        &self,
        subtask: u32,
        parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<Row>>> {
        let inner = self.inner.create_reader(subtask, parallelism, splits)?;
        if self.computed.is_empty() {
            return Ok(inner);
        }
        let computed = self.computed.clone();
        let map: RowMap<Row> = Arc::new(move |mut row: Row| {
            let physical = row.values.len();
            for e in computed.iter() {
                let v = e
                    .eval(&row.values[..physical])
                    .map_err(|m| TaskError::Unrecoverable(format!("computed column: {m}")))?;
                row.values.push(v);
            }
            Ok(row)
        });
        Ok(Box::new(MapReader {
            inner,
            map,
            scratch: Vec::new(),
        }))
    }
}

// ---------------------------------------------------------------------------------------
// nexmark

const NEXMARK_OPTIONS: &[&str] = &[
    "events.num",
    "first-event.rate",
    "next-event.rate",
    "person.proportion",
    "auction.proportion",
    "bid.proportion",
    "seed",
];

fn ts() -> SqlType {
    SqlType::Timestamp { ltz: false }
}

/// The field types of the nexmark table's person, auction and bid rows.
fn nexmark_types() -> [Vec<SqlType>; 3] {
    use SqlType::{BigInt as B, String as S};
    [
        vec![B, S, S, S, S, S, ts(), S],
        vec![B, S, S, B, B, ts(), ts(), B, B, S],
        vec![B, B, B, S, S, ts(), S],
    ]
}

/// The kind of event a filter keeps, if one of its conjuncts is `event_type = K` (the
/// nexmark table's first column).
fn nexmark_kind(filter: &Expr) -> Option<EventKind> {
    match filter {
        Expr::Bin(BinOp::And, a, b, _) => nexmark_kind(a).or_else(|| nexmark_kind(b)),
        Expr::Bin(BinOp::Eq, a, b, _) => {
            let k = match (&**a, &**b) {
                (Expr::Col(0), Expr::Lit(Value::Int(k)))
                | (Expr::Lit(Value::Int(k)), Expr::Col(0)) => *k,
                _ => return None,
            };
            match k {
                0 => Some(EventKind::Person),
                1 => Some(EventKind::Auction),
                2 => Some(EventKind::Bid),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The nexmark table's source; with `only`, it generates the events of that kind alone (the
/// others would fail the filter that follows). Event times grow with the event number, so
/// the watermarks of the events it keeps let through what those of all events would.
fn nexmark(
    table: &Table,
    options: &mut Options,
    seed: u64,
    only: Option<EventKind>,
) -> Result<MapSource<NexmarkSource, NexmarkEvent>> {
    let expected = "event_type INT, person ROW<id BIGINT, name VARCHAR, emailAddress VARCHAR, creditCard VARCHAR, city VARCHAR, state VARCHAR, dateTime TIMESTAMP(3), extra VARCHAR>, auction ROW<id BIGINT, itemName VARCHAR, description VARCHAR, initialBid BIGINT, reserve BIGINT, dateTime TIMESTAMP(3), expires TIMESTAMP(3), seller BIGINT, category BIGINT, extra VARCHAR>, bid ROW<auction BIGINT, bidder BIGINT, price BIGINT, channel VARCHAR, url VARCHAR, dateTime TIMESTAMP(3), extra VARCHAR>";
    let physical = &table.columns[..table.physical];
    let types = nexmark_types();
    let matches = physical.len() == 4
        && physical[0].ty == SqlType::Int
        && physical[1..].iter().zip(&types).all(|(c, t)| matches!(&c.ty, SqlType::Row(f) if f.iter().map(|(_, ty)| ty.clone()).collect::<Vec<_>>() == *t));
    if !matches {
        return table_err(
            table,
            format!(
                "a nexmark table has the physical columns ({expected}), plus any computed columns"
            ),
        );
    }
    let events = options.number("events.num", 100_000_000)?;
    let first = options.number("first-event.rate", 10_000)?;
    let next = options.number("next-event.rate", first)?;
    if first != next {
        return table_err(
            table,
            "different 'first-event.rate' and 'next-event.rate' are not supported",
        );
    }
    let proportions = [
        options.number("person.proportion", 1)?,
        options.number("auction.proportion", 3)?,
        options.number("bid.proportion", 46)?,
    ];
    if proportions[0] * 3 != proportions[1] || proportions[0] * 46 != proportions[2] {
        return table_err(table, "only nexmark's standard proportions 1:3:46 of persons, auctions and bids are supported");
    }
    let seed = options.number("seed", seed)?;
    if events == 0 || next == 0 {
        return table_err(table, "'events.num' and the event rate must be at least 1");
    }
    let mut source = NexmarkSource::new(events, NexmarkGenerator::new(seed, next));
    if let Some(kind) = only {
        source = source.only(kind);
    }
    // Room for the computed columns, which follow the physical ones.
    let width = table.columns.len();
    Ok(MapSource {
        inner: source,
        map: Arc::new(move |e| Ok(nexmark_row(e, width))),
    })
}

fn s(v: compact_str::CompactString) -> Value {
    Value::Str(v)
}

fn kind_code(kind: EventKind) -> i64 {
    match kind {
        EventKind::Person => 0,
        EventKind::Auction => 1,
        EventKind::Bid => 2,
    }
}

/// What a nexmark source reads of each event when it runs the calc over it: the `leaves`
/// (no whole ROW column among them), then the table's `computed` columns over them, make
/// the narrowed row the calc reads.
struct Narrowing {
    leaves: Vec<Leaf>,
    computed: Vec<Expr>,
    /// The event-time column of the narrowed row.
    rowtime: Option<usize>,
    calc: Calc,
}

impl Narrowing {
    /// Makes `row` the narrowed row of `e`.
    fn narrow(&self, mut e: NexmarkEvent, row: &mut Vec<Value>) -> TaskResult {
        // The last event's row is overwritten in place (what it kept is dropped as its slot
        // is), not cleared and made again.
        row.truncate(self.leaves.len());
        while row.len() < self.leaves.len() {
            row.push(Value::Null);
        }
        for (leaf, slot) in self.leaves.iter().zip(row.iter_mut()) {
            match leaf.field {
                Some(f) => set_nexmark_field(&mut e, leaf.col, f, slot),
                None => *slot = Value::Int(kind_code(e.kind())),
            }
        }
        let n = row.len();
        for c in &self.computed {
            let v = c
                .eval(&row[..n])
                .map_err(|m| TaskError::Unrecoverable(format!("computed column: {m}")))?;
            row.push(v);
        }
        Ok(())
    }
}

/// The nexmark source running the calc over it.
struct NarrowSource {
    inner: NexmarkSource,
    narrowing: Arc<Narrowing>,
}

impl Source<Row> for NarrowSource {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        self.inner.create_splits(parallelism)
    }

    fn create_reader(
        &self,
        subtask: u32,
        parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<Row>>> {
        Ok(Box::new(NarrowReader {
            inner: self.inner.create_reader(subtask, parallelism, splits)?,
            narrowing: self.narrowing.clone(),
            events: Vec::new(),
            row: Vec::new(),
            read: None,
        }))
    }
}

/// Reads events, makes each one's narrowed row in one reused vector, and returns the calc's
/// output for those that pass its filter: a row is allocated only for what goes on.
struct NarrowReader {
    inner: Box<dyn SourceReader<NexmarkEvent>>,
    narrowing: Arc<Narrowing>,
    events: Vec<NexmarkEvent>,
    row: Vec<Value>,
    /// What the last poll read, filtered rows included.
    read: Option<PollRead>,
}

impl SourceReader<Row> for NarrowReader {
    fn poll(&mut self, out: &mut Vec<Row>, max: usize) -> TaskResult<SourceStatus> {
        let status = self.inner.poll(&mut self.events, max)?;
        let records = self.events.len();
        let n = &*self.narrowing;
        let calc_err = |m: String| TaskError::Unrecoverable(format!("SQL expression: {m}"));
        let mut latest: Option<i64> = None;
        for e in self.events.drain(..) {
            n.narrow(e, &mut self.row)?;
            if let Some(c) = n.rowtime {
                let t = self.row[c].as_i64().unwrap_or(i64::MIN);
                latest = Some(latest.map_or(t, |l| l.max(t)));
            }
            if !n.calc.passes(&self.row).map_err(calc_err)? {
                continue;
            }
            let mut values = Vec::with_capacity(n.calc.width());
            n.calc
                .project_into(&mut self.row, &mut values)
                .map_err(calc_err)?;
            out.push(Row::insert(values));
        }
        self.read = Some(PollRead {
            records,
            event_time: latest,
        });
        Ok(status)
    }
    fn last_read(&mut self) -> Option<PollRead> {
        self.read.take()
    }
    delegate_source_reader!(inner);
}

/// Field `field` of the nexmark table's ROW column `col` of `e` (NULL if `e` is another
/// kind), written into `slot` (each arm in place: a value made and then copied costs a stalled load); a string moves out of the event, which each field is read from once.
fn set_nexmark_field(e: &mut NexmarkEvent, col: usize, field: usize, slot: &mut Value) {
    use std::mem::take;
    match (e, col) {
        (NexmarkEvent::Person(p), 1) => match field {
            0 => *slot = Value::Int(p.id),
            1 => *slot = s(take(&mut p.name)),
            2 => *slot = s(take(&mut p.email_address)),
            3 => *slot = s(take(&mut p.credit_card)),
            4 => *slot = s(take(&mut p.city)),
            5 => *slot = s(take(&mut p.state)),
            6 => *slot = Value::Ts(p.date_time),
            7 => *slot = s(take(&mut p.extra)),
            _ => *slot = Value::Null,
        },
        (NexmarkEvent::Auction(a), 2) => match field {
            0 => *slot = Value::Int(a.id),
            1 => *slot = s(take(&mut a.item_name)),
            2 => *slot = s(take(&mut a.description)),
            3 => *slot = Value::Int(a.initial_bid),
            4 => *slot = Value::Int(a.reserve),
            5 => *slot = Value::Ts(a.date_time),
            6 => *slot = Value::Ts(a.expires),
            7 => *slot = Value::Int(a.seller),
            8 => *slot = Value::Int(a.category),
            9 => *slot = s(take(&mut a.extra)),
            _ => *slot = Value::Null,
        },
        (NexmarkEvent::Bid(b), 3) => match field {
            0 => *slot = Value::Int(b.auction),
            1 => *slot = Value::Int(b.bidder),
            2 => *slot = Value::Int(b.price),
            3 => *slot = s(take(&mut b.channel)),
            4 => *slot = s(take(&mut b.url)),
            5 => *slot = Value::Ts(b.date_time),
            6 => *slot = s(take(&mut b.extra)),
            _ => *slot = Value::Null,
        },
        _ => *slot = Value::Null,
    }
}

fn nexmark_row(e: NexmarkEvent, width: usize) -> Row {
    let mut values = Vec::with_capacity(width);
    values.resize(4, Value::Null);
    match e {
        NexmarkEvent::Person(p) => {
            values[0] = Value::Int(0);
            values[1] = Value::Row(Box::new([
                Value::Int(p.id),
                s(p.name),
                s(p.email_address),
                s(p.credit_card),
                s(p.city),
                s(p.state),
                Value::Ts(p.date_time),
                s(p.extra),
            ]));
        }
        NexmarkEvent::Auction(a) => {
            values[0] = Value::Int(1);
            values[2] = Value::Row(Box::new([
                Value::Int(a.id),
                s(a.item_name),
                s(a.description),
                Value::Int(a.initial_bid),
                Value::Int(a.reserve),
                Value::Ts(a.date_time),
                Value::Ts(a.expires),
                Value::Int(a.seller),
                Value::Int(a.category),
                s(a.extra),
            ]));
        }
        NexmarkEvent::Bid(b) => {
            values[0] = Value::Int(2);
            values[3] = Value::Row(Box::new([
                Value::Int(b.auction),
                Value::Int(b.bidder),
                Value::Int(b.price),
                s(b.channel),
                s(b.url),
                Value::Ts(b.date_time),
                s(b.extra),
            ]));
        }
    }
    Row::insert(values)
}

// ---------------------------------------------------------------------------------------
// datagen

const DATAGEN_OPTIONS: &[&str] = &[
    "number-of-rows",
    "rows-per-second",
    "fields.#.kind",
    "fields.#.min",
    "fields.#.max",
    "fields.#.start",
    "fields.#.end",
    "fields.#.length",
];

/// How datagen makes a field.
#[derive(Clone)]
enum FieldGen {
    Sequence(i64),
    Random { min: i64, max: i64, length: usize },
}

fn datagen(table: &Table, options: &mut Options) -> Result<SequenceSource<Row>> {
    let rows = options.number("number-of-rows", u64::MAX)?;
    let rate = options.number("rows-per-second", 10_000)?;
    if rows == u64::MAX && rate == 0 {
        return table_err(
            table,
            "an unbounded datagen table needs a 'rows-per-second' above 0",
        );
    }
    let mut gens = Vec::new();
    for c in &table.columns[..table.physical] {
        let key = |k: &str| format!("fields.{}.{k}", c.name);
        let kind = options
            .take(&key("kind"))
            .unwrap_or_else(|| "random".into());
        let gen = match kind.as_str() {
            "sequence" => {
                let start = options.number(&key("start"), 0)? as i64;
                let end = options.number(&key("end"), u64::MAX / 2)? as i64;
                if end < start || ((end - start) as u64).saturating_add(1) < rows {
                    return table_err(table, format!("field '{}': the sequence {start}..={end} is shorter than 'number-of-rows'", c.name));
                }
                FieldGen::Sequence(start)
            }
            "random" => {
                let min = options
                    .take(&key("min"))
                    .map(|v| v.parse::<i64>())
                    .transpose()
                    .map_err(|_| {
                        SqlError::at(
                            table.def.at,
                            format!("field '{}': 'min' must be a whole number", c.name),
                        )
                    })?
                    .unwrap_or(0);
                let max = options
                    .take(&key("max"))
                    .map(|v| v.parse::<i64>())
                    .transpose()
                    .map_err(|_| {
                        SqlError::at(
                            table.def.at,
                            format!("field '{}': 'max' must be a whole number", c.name),
                        )
                    })?
                    .unwrap_or(match c.ty {
                        // The largest whole part the type holds.
                        SqlType::Decimal(p, sc) if p.saturating_sub(sc) < 10 => {
                            10i64.pow(u32::from(p.saturating_sub(sc))) - 1
                        }
                        _ => i64::from(i32::MAX),
                    });
                let length = options.number(&key("length"), 10)? as usize;
                if max < min {
                    return table_err(table, format!("field '{}': 'max' is below 'min'", c.name));
                }
                FieldGen::Random { min, max, length }
            }
            other => {
                return table_err(
                    table,
                    format!(
                        "field '{}': unknown kind '{other}' (sequence, random)",
                        c.name
                    ),
                )
            }
        };
        if matches!(c.ty, SqlType::Row(_)) {
            return table_err(
                table,
                format!("datagen cannot make column '{}' of type {}", c.name, c.ty),
            );
        }
        gens.push((gen, c.ty.clone()));
    }
    let gens = Arc::new(gens);
    // Event time of generated timestamps: one row per 1/rate s from 2024-01-01.
    let step = 1000u64.checked_div(rate).map_or(1, |s| s.max(1)) as i64;
    let base = parse_timestamp("2024-01-01").unwrap_or(0);
    Ok(SequenceSource::from_fn(rows, rate, move |i| {
        let values = gens
            .iter()
            .enumerate()
            .map(|(f, (gen, ty))| {
                let n = match gen {
                    FieldGen::Sequence(start) => start.wrapping_add(i as i64),
                    FieldGen::Random { min, max, .. } => {
                        let span = (max - min) as u64 + 1;
                        min + (mix(i, f as u64) % span.max(1)) as i64
                    }
                };
                match ty {
                    SqlType::Decimal(_, scale) => {
                        let unit = 10i128.pow(u32::from(*scale));
                        // A random decimal has random digits after the point, within [min, max].
                        let fraction = match gen {
                            FieldGen::Random { max, .. } if n < *max => {
                                (mix(i, f as u64 + 7919) as i128).rem_euclid(unit)
                            }
                            _ => 0,
                        };
                        Value::Decimal(i128::from(n) * unit + fraction, *scale)
                    }
                    SqlType::Boolean => Value::Bool(n % 2 == 0),
                    SqlType::Int | SqlType::BigInt => Value::Int(n),
                    SqlType::Double => Value::Double(n as f64),
                    SqlType::String => match gen {
                        FieldGen::Sequence(_) => Value::Str(n.to_string().into()),
                        FieldGen::Random { length, .. } => {
                            Value::Str(random_text(i, f as u64, *length).into())
                        }
                    },
                    SqlType::Timestamp { .. } => Value::Ts(base + i as i64 * step),
                    _ => Value::Null,
                }
            })
            .collect();
        Row::insert(values)
    }))
}

/// A well-mixed hash of a row index and a field (splitmix64).
fn mix(i: u64, field: u64) -> u64 {
    let mut z = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ field.wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn random_text(i: u64, field: u64, length: usize) -> String {
    (0..length)
        .map(|k| (b'a' + (mix(i, field * 1000 + k as u64) % 26) as u8) as char)
        .collect()
}

/// Appends `row` as Flink's print connector shows it, after `prefix`: `+I[a, b, null]`.
pub fn print_row(prefix: &str, row: &Row, out: &mut Vec<u8>) {
    let mut line = String::from(prefix);
    line.push_str(row.kind.short());
    line.push('[');
    for (i, v) in row.values.iter().enumerate() {
        if i > 0 {
            line.push_str(", ");
        }
        v.write_text(&mut line, "null");
    }
    line.push_str("]\n");
    out.extend_from_slice(line.as_bytes());
}

// ---------------------------------------------------------------------------------------
// jdbc

/// The options of the `jdbc` connector.
#[cfg(feature = "postgres")]
const JDBC_OPTIONS: &[&str] = &[
    "url",
    "table-name",
    "username",
    "password",
    "sink.delivery-guarantee",
];

/// How a `jdbc` table is written: its `sink.delivery-guarantee`.
#[cfg(feature = "postgres")]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JdbcGuarantee {
    /// `at-least-once` (the default): each key's latest row upserted, `-D` deleted, by the
    /// PRIMARY KEY; a replay writes them again, so the table is exactly once by idempotence.
    AtLeastOnce,
    /// `exactly-once`: rows inserted in a transaction per subtask and checkpoint, prepared at
    /// the barrier and committed when the checkpoint completes (append-only input, no key
    /// needed).
    ExactlyOnce,
}

/// Writes `stream` (`updating`: a changelog) into an existing PostgreSQL table
/// (`'url' = 'jdbc:postgresql://…'`): upserting and deleting by the table's PRIMARY KEY, as
/// Flink's JDBC sink does in upsert mode, or with `'sink.delivery-guarantee' =
/// 'exactly-once'` appending by two-phase commit.
#[cfg(feature = "postgres")]
fn jdbc_sink(
    stream: DataStream<Row>,
    table: &Table,
    mut options: Options,
    updating: bool,
    uid: &str,
) -> Result<()> {
    use crate::connectors::postgres::{TwoPhaseTableSink, UpsertTableSink};
    let (url, name) = jdbc_target(table, &mut options)?;
    let guarantee = jdbc_guarantee(table, &mut options)?;
    options.finish("jdbc", JDBC_OPTIONS)?;
    let key = jdbc_key(table)?;
    let columns = jdbc_columns(table)?;
    let refused = |e: String| {
        let e = e
            .replace("--pg-output", "'url'")
            .replace("--pg-table", "'table-name'");
        SqlError::at(table.def.at, format!("table '{}': {e}", table.def.name))
    };
    match guarantee {
        JdbcGuarantee::AtLeastOnce => {
            if key.is_empty() {
                return table_err(
                    table,
                    "the jdbc sink needs a PRIMARY KEY (… NOT ENFORCED) to upsert by key, which makes its table exactly once, or 'sink.delivery-guarantee' = 'exactly-once' to append rows by two-phase commit; appending at least once would write rows again after a failure",
                );
            }
            let sink = UpsertTableSink::new(&url, &name, columns, key, Arc::new(row_change))
                .map_err(refused)?;
            // An upsert by key needs no -U: the +U after it replaces the row.
            stream
                .filter(|r: &Row| r.kind != RowKind::UpdateBefore)
                .uid(&format!("{uid}.upsert"))
                .sink(sink)
                .uid(uid);
        }
        JdbcGuarantee::ExactlyOnce => {
            if updating {
                return table_err(table, jdbc_changelog_refusal(!key.is_empty()));
            }
            let sink = TwoPhaseTableSink::new(&url, &name, columns, Arc::new(row_change))
                .map_err(refused)?;
            stream.sink(sink).uid(uid);
        }
    }
    Ok(())
}

/// Why `'sink.delivery-guarantee' = 'exactly-once'` cannot take a changelog (`keyed`: the
/// table has a PRIMARY KEY), and what to do instead.
#[cfg(feature = "postgres")]
fn jdbc_changelog_refusal(keyed: bool) -> &'static str {
    if keyed {
        "'sink.delivery-guarantee' = 'exactly-once' only appends rows (two-phase commit of inserts), and this query's result is a changelog: a prepared transaction keeps its rows locked until its checkpoint completes, so updating them in the next one would wait; leave the option out (or set 'at-least-once') to upsert by the PRIMARY KEY, which keeps the table exactly once by idempotence"
    } else {
        "'sink.delivery-guarantee' = 'exactly-once' only appends rows (two-phase commit of inserts), and this query's result is a changelog (updates and deletions need a key); declare a PRIMARY KEY (… NOT ENFORCED) and leave the option out to upsert by key"
    }
}

/// The required `url` (`jdbc:postgresql://…`, made a PostgreSQL URL with `username` and
/// `password`) and `table-name`.
#[cfg(feature = "postgres")]
fn jdbc_target(table: &Table, options: &mut Options) -> Result<(String, String)> {
    let mut required = |key: &str| {
        options.take(key).ok_or_else(|| {
            SqlError::at(
                table.def.at,
                format!("table '{}': option '{key}' is required", table.def.name),
            )
        })
    };
    let (url, name) = (required("url")?, required("table-name")?);
    let Some(rest) = url.strip_prefix("jdbc:postgresql://") else {
        return table_err(
            table,
            format!("'url' must be jdbc:postgresql://HOST:PORT/DATABASE (cairn's jdbc sink writes to PostgreSQL), got '{url}'"),
        );
    };
    let mut url = format!("postgres://{rest}");
    let params: Vec<String> = [("user", "username"), ("password", "password")]
        .into_iter()
        .filter_map(|(param, option)| Some(format!("{param}={}", options.take(option)?)))
        .collect();
    if !params.is_empty() {
        url.push(if url.contains('?') { '&' } else { '?' });
        url.push_str(&params.join("&"));
    }
    Ok((url, name))
}

/// `sink.delivery-guarantee`: `at-least-once` (the default) or `exactly-once`.
#[cfg(feature = "postgres")]
fn jdbc_guarantee(table: &Table, options: &mut Options) -> Result<JdbcGuarantee> {
    match options.take("sink.delivery-guarantee").as_deref() {
        None | Some("at-least-once") => Ok(JdbcGuarantee::AtLeastOnce),
        Some("exactly-once") => Ok(JdbcGuarantee::ExactlyOnce),
        Some(other) => table_err(
            table,
            format!("option 'sink.delivery-guarantee' must be 'at-least-once' (the default: upsert by PRIMARY KEY) or 'exactly-once' (append by two-phase commit), got '{other}'"),
        ),
    }
}

/// The PostgreSQL types of the table's columns.
#[cfg(feature = "postgres")]
fn jdbc_columns(table: &Table) -> Result<Vec<crate::connectors::postgres::TableColumn>> {
    let mut columns = Vec::new();
    for c in &table.columns {
        let sql_type = match &c.ty {
            SqlType::Boolean => "boolean".to_string(),
            SqlType::Int => "integer".to_string(),
            SqlType::BigInt => "bigint".to_string(),
            SqlType::Double => "double precision".to_string(),
            SqlType::Decimal(p, s) => format!("numeric({p}, {s})"),
            SqlType::String => "text".to_string(),
            SqlType::Timestamp { ltz: false } => "timestamp(3)".to_string(),
            SqlType::Timestamp { ltz: true } => "timestamptz".to_string(),
            other => {
                return table_err(
                    table,
                    format!("column '{}': the jdbc sink cannot write {other}", c.name),
                )
            }
        };
        columns.push(crate::connectors::postgres::TableColumn {
            name: c.name.clone(),
            sql_type,
        });
    }
    Ok(columns)
}

/// The positions of the PRIMARY KEY's columns (none without one).
#[cfg(feature = "postgres")]
fn jdbc_key(table: &Table) -> Result<Vec<usize>> {
    table
        .def
        .primary_key
        .iter()
        .map(|k| {
            table
                .columns
                .iter()
                .position(|c| &c.name == k)
                .ok_or_else(|| {
                    SqlError::at(
                        table.def.at,
                        format!(
                            "table '{}': PRIMARY KEY column '{k}' is not a column",
                            table.def.name
                        ),
                    )
                })
        })
        .collect()
}

/// A row as the change the PostgreSQL table sinks write: its values as text.
#[cfg(feature = "postgres")]
fn row_change(row: &Row) -> crate::connectors::postgres::RowChange {
    crate::connectors::postgres::RowChange {
        values: row
            .values
            .iter()
            .map(|v| {
                (!v.is_null()).then(|| {
                    let mut text = String::new();
                    v.write_text(&mut text, "");
                    text
                })
            })
            .collect(),
        delete: row.kind == RowKind::Delete,
    }
}

#[cfg(not(feature = "postgres"))]
fn jdbc_sink(_: DataStream<Row>, table: &Table, _: Options, _: bool, _: &str) -> Result<()> {
    table_err(
        table,
        "the jdbc connector needs cairn built with the `postgres` feature",
    )
}

// ---------------------------------------------------------------------------------------
// formats

/// The options of the `filesystem` connector.
const FILESYSTEM_OPTIONS: &[&str] = &["path", "format", "csv.field-delimiter"];

/// A line format of the filesystem connector.
#[derive(Debug, Clone, Copy)]
pub enum Format {
    /// Values separated by a delimiter (`csv.field-delimiter`, default `,`), `"` quoting.
    Csv(char),
    /// One JSON object per line.
    Json,
}

impl Format {
    /// The format a table's options name, taking its own options (`csv.field-delimiter`).
    fn of(table: &Table, options: &mut Options) -> Result<Format> {
        Format::prefixed(table, options, "")
    }

    /// The format option `PREFIXformat` names, taking its own options
    /// (`PREFIXcsv.field-delimiter`): Kafka's `key.` and `value.` formats.
    pub(super) fn prefixed(table: &Table, options: &mut Options, prefix: &str) -> Result<Format> {
        match options.take(&format!("{prefix}format")).as_deref() {
            Some("csv") => {
                let delimiter = match options.take(&format!("{prefix}csv.field-delimiter")).as_deref() {
                    None => ',',
                    Some("\\t") => '\t',
                    Some(d) if d.chars().count() == 1 && !matches!(d, "\"" | "\n" | "\r") => {
                        d.chars().next().unwrap_or(',')
                    }
                    Some(d) => {
                        return table_err(
                            table,
                            format!("option '{prefix}csv.field-delimiter' must be one character (or '\\t'), got '{d}'"),
                        )
                    }
                };
                Ok(Format::Csv(delimiter))
            }
            Some("json") => Ok(Format::Json),
            Some(other) => table_err(
                table,
                format!("unsupported {prefix}format '{other}' (csv, json)"),
            ),
            None => table_err(
                table,
                format!("option '{prefix}format' is required (csv, json)"),
            ),
        }
    }

    pub(super) fn parse(&self, line: &str, names: &[String], types: &[SqlType]) -> TaskResult<Row> {
        let bad = |m: String| {
            TaskError::Unrecoverable(format!(
                "cannot parse input line '{}': {m}",
                line.chars().take(200).collect::<String>()
            ))
        };
        let mut values = Vec::with_capacity(types.len());
        match self {
            Format::Csv(delimiter) => {
                let fields = split_csv(line, *delimiter);
                if fields.len() != types.len() {
                    return Err(bad(format!(
                        "{} fields, the table has {} columns",
                        fields.len(),
                        types.len()
                    )));
                }
                for (text, ty) in fields.iter().zip(types) {
                    values.push(if text.is_empty() && *ty != SqlType::String {
                        Value::Null
                    } else {
                        from_text(text, ty).map_err(&bad)?
                    });
                }
            }
            Format::Json => {
                let object: serde_json::Map<String, serde_json::Value> =
                    serde_json::from_str(line).map_err(|e| bad(e.to_string()))?;
                for (name, ty) in names.iter().zip(types) {
                    values.push(match object.get(name) {
                        None | Some(serde_json::Value::Null) => Value::Null,
                        Some(serde_json::Value::String(s)) => from_text(s, ty).map_err(&bad)?,
                        Some(serde_json::Value::Bool(b)) => Value::Bool(*b),
                        Some(other) => from_text(&other.to_string(), ty).map_err(&bad)?,
                    });
                }
            }
        }
        Ok(Row::insert(values))
    }

    /// Appends `row` as a line, ended by `\n`.
    pub fn write(&self, row: &Row, names: &[String], out: &mut Vec<u8>) {
        let mut line = String::new();
        match self {
            Format::Csv(delimiter) => {
                for (i, v) in row.values.iter().enumerate() {
                    if i > 0 {
                        line.push(*delimiter);
                    }
                    let mut text = String::new();
                    v.write_text(&mut text, "");
                    if text.contains([*delimiter, '"', '\n', '\r']) {
                        line.push('"');
                        line.push_str(&text.replace('"', "\"\""));
                        line.push('"');
                    } else {
                        line.push_str(&text);
                    }
                }
            }
            Format::Json => {
                let mut object = serde_json::Map::new();
                for (name, v) in names.iter().zip(&row.values) {
                    object.insert(name.clone(), json_value(v));
                }
                line = serde_json::Value::Object(object).to_string();
            }
        }
        out.extend_from_slice(line.as_bytes());
        out.push(b'\n');
    }
}

fn json_value(v: &Value) -> serde_json::Value {
    match v {
        Value::Null => serde_json::Value::Null,
        Value::Bool(b) => (*b).into(),
        Value::Int(i) => (*i).into(),
        Value::Double(d) => serde_json::Number::from_f64(*d)
            .map_or(serde_json::Value::Null, serde_json::Value::Number),
        Value::Decimal(..) => {
            let mut s = String::new();
            v.write_text(&mut s, "");
            serde_json::from_str(&s).unwrap_or(serde_json::Value::String(s))
        }
        Value::Str(s) => serde_json::Value::String(s.to_string()),
        Value::Ts(ms) => {
            let mut s = String::new();
            write_timestamp(&mut s, *ms);
            serde_json::Value::String(s)
        }
        Value::Row(f) => serde_json::Value::Array(f.iter().map(json_value).collect()),
    }
}

fn from_text(text: &str, ty: &SqlType) -> std::result::Result<Value, String> {
    let bad = || format!("'{text}' is not a {ty}");
    Ok(match ty {
        SqlType::String => Value::Str(text.into()),
        SqlType::Boolean => match text.trim().to_ascii_lowercase().as_str() {
            "true" => Value::Bool(true),
            "false" => Value::Bool(false),
            _ => return Err(bad()),
        },
        SqlType::Int | SqlType::BigInt => Value::Int(text.trim().parse().map_err(|_| bad())?),
        SqlType::Double => Value::Double(text.trim().parse().map_err(|_| bad())?),
        SqlType::Decimal(_, scale) => {
            let (u, s) = super::types::parse_decimal(text).ok_or_else(bad)?;
            super::expr::cast(Value::Decimal(u, s), &SqlType::Decimal(38, *scale))?
        }
        SqlType::Timestamp { .. } => Value::Ts(parse_timestamp(text).ok_or_else(bad)?),
        _ => return Err(format!("columns of type {ty} cannot be read from text")),
    })
}

fn split_csv(line: &str, delimiter: char) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (c, false) if c == delimiter => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

// ---------------------------------------------------------------------------------------
// sinks

/// Writes `stream` into `table`; `updating`: its rows are a changelog.
pub fn sink(stream: DataStream<Row>, table: &Table, updating: bool, uid: &str) -> Result<()> {
    let name = connector(table)?;
    let mut options = Options::new(table);
    let names: Vec<String> = table.columns.iter().map(|c| c.name.clone()).collect();
    let stream = stream.name(&format!("sink: {}", table.def.name));
    match name.as_str() {
        "blackhole" => {
            options.finish("blackhole", &[])?;
            stream.sink(DiscardSink).uid(uid);
        }
        "jdbc" => jdbc_sink(stream, table, options, updating, uid)?,
        "kafka" | "upsert-kafka" => kafka_sink(
            stream,
            table,
            options,
            updating,
            uid,
            name == "upsert-kafka",
        )?,
        "print" => {
            let prefix = options
                .take("print-identifier")
                .map(|p| format!("{p}> "))
                .unwrap_or_default();
            options.finish("print", &["print-identifier"])?;
            let encoder =
                Arc::new(move |row: &Row, out: &mut Vec<u8>| print_row(&prefix, row, out));
            stream.sink(PrintSink::new(encoder)).uid(uid);
        }
        "filesystem" => {
            if updating {
                return table_err(table, "the filesystem sink only appends: it cannot take the updates (a changelog) of this query");
            }
            let path = options.take("path").ok_or_else(|| {
                SqlError::at(
                    table.def.at,
                    format!("table '{}': option 'path' is required", table.def.name),
                )
            })?;
            let format = Format::of(table, &mut options)?;
            options.finish("filesystem", FILESYSTEM_OPTIONS)?;
            let encoder = Arc::new(move |row: &Row, out: &mut Vec<u8>| {
                debug_assert_eq!(row.kind, RowKind::Insert);
                format.write(row, &names, out)
            });
            stream.sink(FileSink::new(path, encoder)).uid(uid);
        }
        _ => return table_err(table, format!("connector '{name}' can only be read")),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn csv_fields_unquote() {
        assert_eq!(
            split_csv(r#"a,"b,c","d""e",,"#, ','),
            vec!["a", "b,c", "d\"e", "", ""]
        );
    }
}
