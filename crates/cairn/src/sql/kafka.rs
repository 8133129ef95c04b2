//! Flink's `kafka` and `upsert-kafka` table connectors over cairn's Kafka source and sink
//! ([`crate::connectors::kafka`]; feature `kafka`).
//!
//! A `kafka` table is a topic whose record values are rows in one format (`csv` or `json`,
//! one row per record, no key). Read, it is a [`KafkaSource`]: every partition is a split, so
//! its offsets are in the checkpoints and, when the table declares a `WATERMARK`, every
//! partition has a watermark of its own (through [`attach`], as any source's splits do).
//! Written, it is a [`KafkaSink`] with Flink's delivery guarantees; it only appends, so an
//! updating result (a changelog) is refused, as Flink refuses it.
//!
//! An `upsert-kafka` table is a topic keyed by the table's PRIMARY KEY, for updating results:
//! +I and +U are written as the row under its key, -D as a tombstone (the key and a null
//! value), and -U is dropped (the +U after it replaces the row). Reading one is refused: an
//! upsert topic is a changelog, and the planner reads every table as append-only.
//!
//! A table's options are read all at once ([`KafkaTable::of`]) whichever way the table is
//! used, so they are checked alike for a source and a sink; the other direction's options
//! (`scan.*`, `sink.*`) are checked and ignored, as in Flink.

use std::sync::Arc;
use std::time::Duration;

use crate::api::{DataStream, StreamEnv};
use crate::connectors::kafka::{
    KafkaEncoder, KafkaGuarantee, KafkaMessage, KafkaSink, KafkaSinkConfig, KafkaSource,
    KafkaSourceConfig, OffsetReset, StartFrom,
};
use crate::error::{TaskError, TaskResult};

use super::connectors::{attach, table_err, Format, MapSource, Options};
use super::plan::Table;
use super::types::{Row, RowKind, SqlType, Value};
use super::SqlError;

type Result<T> = std::result::Result<T, SqlError>;

/// The options of the `kafka` connector (`properties.*`: any librdkafka consumer setting).
const KAFKA_OPTIONS: &[&str] = &[
    "topic",
    "properties.bootstrap.servers",
    "properties.group.id",
    "properties.*",
    "scan.startup.mode",
    "scan.startup.timestamp-millis",
    "scan.bounded.mode",
    "scan.topic-partition-discovery.interval",
    "format",
    "csv.field-delimiter",
    "value.format",
    "value.csv.field-delimiter",
    "sink.delivery-guarantee",
    "sink.transactional-id-prefix",
];

/// The options of the `upsert-kafka` connector.
const UPSERT_KAFKA_OPTIONS: &[&str] = &[
    "topic",
    "properties.bootstrap.servers",
    "properties.*",
    "key.format",
    "key.csv.field-delimiter",
    "value.format",
    "value.csv.field-delimiter",
    "value.fields-include",
    "sink.delivery-guarantee",
    "sink.transactional-id-prefix",
];

/// The one producer property the sinks take (`properties.transaction.timeout.ms`).
const TRANSACTION_TIMEOUT: &str = "transaction.timeout.ms";

/// An upsert-kafka table's key: its format and columns (the PRIMARY KEY's).
type KeyFormat = (Format, Vec<usize>);

/// A kafka or upsert-kafka table's options, checked.
struct KafkaTable {
    brokers: String,
    topics: Vec<String>,
    group_id: Option<String>,
    /// The other `properties.*`, for the consumer.
    properties: Vec<(String, String)>,
    start: StartFrom,
    bounded: bool,
    discovery_interval: Option<Duration>,
    /// upsert-kafka: the key's format and columns.
    key: Option<KeyFormat>,
    value: Format,
    /// The columns a record's value holds, in order.
    value_columns: Vec<usize>,
    guarantee: KafkaGuarantee,
    transactional_id_prefix: Option<String>,
    transaction_timeout: Option<Duration>,
}

fn required(table: &Table, options: &mut Options, key: &str) -> Result<String> {
    options.take(key).ok_or_else(|| {
        SqlError::at(
            table.def.at,
            format!("table '{}': option '{key}' is required", table.def.name),
        )
    })
}

impl KafkaTable {
    /// Reads every option of `table` (connector `kafka`, or `upsert-kafka` if `upsert`), to
    /// be read from if `reading`, refusing unknown ones.
    fn of(table: &Table, mut options: Options, upsert: bool, reading: bool) -> Result<KafkaTable> {
        let topic = required(table, &mut options, "topic")?;
        let topics: Vec<String> = topic.split(';').map(|t| t.trim().to_string()).collect();
        if topics.iter().any(String::is_empty) {
            return table_err(
                table,
                format!("option 'topic' = '{topic}' has an empty topic name"),
            );
        }
        let brokers = required(table, &mut options, "properties.bootstrap.servers")?;
        let mut group_id = None;
        let mut reset = OffsetReset::Earliest;
        let mut transaction_timeout = None;
        let mut properties = Vec::new();
        for (key, value) in options.take_prefixed("properties.") {
            match key.as_str() {
                "bootstrap.servers" => {}
                "group.id" => group_id = Some(value),
                // Taken, not passed on: the source's consumer falls back to the earliest
                // offset when records it was to read are gone (retention), whatever this says.
                "auto.offset.reset" => {
                    reset = match value.as_str() {
                        "earliest" | "smallest" => OffsetReset::Earliest,
                        "latest" | "largest" => OffsetReset::Latest,
                        other => {
                            return table_err(
                                table,
                                format!("option 'properties.auto.offset.reset' = '{other}' is not supported (earliest, latest)"),
                            )
                        }
                    }
                }
                TRANSACTION_TIMEOUT => {
                    let ms = value.trim().parse::<u64>().ok().filter(|&ms| ms > 0);
                    let Some(ms) = ms else {
                        return table_err(
                            table,
                            format!("option 'properties.{TRANSACTION_TIMEOUT}' must be a positive number of milliseconds, got '{value}'"),
                        );
                    };
                    transaction_timeout = Some(Duration::from_millis(ms));
                }
                _ => properties.push((key, value)),
            }
        }
        let (start, bounded, discovery_interval) = if upsert {
            (StartFrom::Earliest, false, None)
        } else {
            scan_options(table, &mut options, reading && group_id.is_none(), reset)?
        };
        let (key, value, value_columns) = if upsert {
            upsert_formats(table, &mut options)?
        } else {
            // Flink's two spellings: 'format' with 'csv.…', or 'value.format' with 'value.csv.…'.
            let prefix = if options.has("value.format") {
                "value."
            } else {
                ""
            };
            let value = value_format(table, &mut options, prefix)?;
            (None, value, (0..table.columns.len()).collect())
        };
        let guarantee = match options.take("sink.delivery-guarantee") {
            None => KafkaGuarantee::AtLeastOnce,
            Some(g) => g
                .parse()
                .or_else(|e| table_err(table, format!("option 'sink.delivery-guarantee': {e}")))?,
        };
        let transactional_id_prefix = options.take("sink.transactional-id-prefix");
        if guarantee == KafkaGuarantee::ExactlyOnce && transactional_id_prefix.is_none() {
            return table_err(
                table,
                "option 'sink.transactional-id-prefix' is required with 'sink.delivery-guarantee' = 'exactly-once' (a prefix no other job writing to the cluster uses)",
            );
        }
        let (connector, known) = if upsert {
            ("upsert-kafka", UPSERT_KAFKA_OPTIONS)
        } else {
            ("kafka", KAFKA_OPTIONS)
        };
        options.finish(connector, known)?;
        Ok(KafkaTable {
            brokers,
            topics,
            group_id,
            properties,
            start,
            bounded,
            discovery_interval,
            key,
            value,
            value_columns,
            guarantee,
            transactional_id_prefix,
            transaction_timeout,
        })
    }
}

/// `scan.startup.mode` (with `scan.startup.timestamp-millis`), `scan.bounded.mode` and
/// `scan.topic-partition-discovery.interval`: where a fresh start begins, whether the source
/// stops at the end offsets it started with, and how often it looks for new partitions.
/// `needs_group`: 'group-offsets' without 'properties.group.id' is refused (a sink needs none).
fn scan_options(
    table: &Table,
    options: &mut Options,
    needs_group: bool,
    reset: OffsetReset,
) -> Result<(StartFrom, bool, Option<Duration>)> {
    let timestamp = options.take("scan.startup.timestamp-millis");
    let mode = options.take("scan.startup.mode");
    let start = match mode.as_deref().unwrap_or("group-offsets") {
        "earliest-offset" => StartFrom::Earliest,
        "latest-offset" => StartFrom::Latest,
        "group-offsets" if needs_group => {
            return table_err(
                table,
                format!(
                    "option 'properties.group.id' is required with 'scan.startup.mode' = 'group-offsets'{} (or choose 'earliest-offset', 'latest-offset' or 'timestamp')",
                    if mode.is_none() { " (the default)" } else { "" }
                ),
            )
        }
        "group-offsets" => StartFrom::Committed(reset),
        "timestamp" => {
            let ms = timestamp.as_deref().and_then(|t| t.trim().parse::<i64>().ok());
            match ms {
                Some(ms) if ms >= 0 => StartFrom::Timestamp(ms),
                _ => {
                    return table_err(
                        table,
                        format!(
                            "option 'scan.startup.timestamp-millis' (milliseconds since the epoch) is required with 'scan.startup.mode' = 'timestamp'{}",
                            timestamp.as_deref().map(|t| format!(", got '{t}'")).unwrap_or_default()
                        ),
                    )
                }
            }
        }
        "specific-offsets" => {
            return table_err(
                table,
                "option 'scan.startup.mode' = 'specific-offsets' is not supported by cairn's Kafka source (earliest-offset, latest-offset, group-offsets, timestamp)",
            )
        }
        other => {
            return table_err(
                table,
                format!("unknown 'scan.startup.mode' = '{other}' (earliest-offset, latest-offset, group-offsets, timestamp)"),
            )
        }
    };
    if timestamp.is_some() && !matches!(start, StartFrom::Timestamp(_)) {
        return table_err(
            table,
            "option 'scan.startup.timestamp-millis' is only for 'scan.startup.mode' = 'timestamp'",
        );
    }
    let bounded = match options.take("scan.bounded.mode").as_deref() {
        None | Some("unbounded") => false,
        Some("latest-offset") => true,
        Some(other @ ("group-offsets" | "timestamp" | "specific-offsets")) => {
            return table_err(
                table,
                format!("option 'scan.bounded.mode' = '{other}' is not supported by cairn's Kafka source (unbounded, latest-offset)"),
            )
        }
        Some(other) => {
            return table_err(
                table,
                format!("unknown 'scan.bounded.mode' = '{other}' (unbounded, latest-offset)"),
            )
        }
    };
    let default_discovery = KafkaSourceConfig::new("", Vec::new()).discovery_interval;
    let discovery = match options.take("scan.topic-partition-discovery.interval") {
        None => default_discovery,
        Some(text) => {
            let d = crate::config::parse_duration(&text).or_else(|e| {
                table_err(
                    table,
                    format!("option 'scan.topic-partition-discovery.interval': {e}"),
                )
            })?;
            (!d.is_zero()).then_some(d)
        }
    };
    Ok((start, bounded, discovery))
}

/// The value's format: `PREFIXformat` with its own options; the error names both of Flink's
/// spellings when neither is there.
fn value_format(table: &Table, options: &mut Options, prefix: &str) -> Result<Format> {
    if prefix.is_empty() && !options.has("format") {
        return table_err(
            table,
            "option 'format' (or 'value.format') is required (csv, json)",
        );
    }
    Format::prefixed(table, options, prefix)
}

/// An upsert-kafka table's key format and columns (its PRIMARY KEY), value format and value
/// columns (`value.fields-include`: ALL, the default, or EXCEPT_KEY).
fn upsert_formats(
    table: &Table,
    options: &mut Options,
) -> Result<(Option<KeyFormat>, Format, Vec<usize>)> {
    if table.def.primary_key.is_empty() {
        return table_err(
            table,
            "an upsert-kafka table needs a PRIMARY KEY (… NOT ENFORCED): its columns are the records' key",
        );
    }
    let key_columns: Vec<usize> = table
        .def
        .primary_key
        .iter()
        .map(|k| {
            table.columns.iter().position(|c| &c.name == k).map_or_else(
                || table_err(table, format!("PRIMARY KEY column '{k}' is not a column")),
                Ok,
            )
        })
        .collect::<Result<_>>()?;
    let key = Format::prefixed(table, options, "key.")?;
    let value = Format::prefixed(table, options, "value.")?;
    let all = (0..table.columns.len()).collect::<Vec<_>>();
    let value_columns = match options.take("value.fields-include").as_deref() {
        None | Some("ALL") => all,
        Some("EXCEPT_KEY") => all
            .into_iter()
            .filter(|i| !key_columns.contains(i))
            .collect(),
        Some(other) => {
            return table_err(
                table,
                format!("unknown 'value.fields-include' = '{other}' (ALL, EXCEPT_KEY)"),
            )
        }
    };
    Ok((Some((key, key_columns)), value, value_columns))
}

/// Reads a `kafka` table; an `upsert-kafka` one is refused.
pub(super) fn source(
    env: &StreamEnv,
    table: &Arc<Table>,
    options: Options,
    uid: &str,
    upsert: bool,
) -> Result<DataStream<Row>> {
    let t = KafkaTable::of(table, options, upsert, true)?;
    if upsert {
        return table_err(
            table,
            "reading an upsert-kafka table is not supported yet (its topic is a changelog, and cairn's planner reads tables as append-only); it can be written to, or read as a 'kafka' table of its values",
        );
    }
    let mut config = KafkaSourceConfig::new(t.brokers, t.topics);
    config.group_id = t.group_id;
    config.start = t.start;
    config.bounded = t.bounded;
    config.discovery_interval = t.discovery_interval;
    config.properties = t.properties;
    let physical = &table.columns[..table.physical];
    let names: Vec<String> = physical.iter().map(|c| c.name.clone()).collect();
    let types: Vec<SqlType> = physical.iter().map(|c| c.ty.clone()).collect();
    let format = t.value;
    let source = KafkaSource::new(config, move |m: &KafkaMessage<'_>| {
        // A tombstone is no row of an append-only table.
        let payload = m.payload?;
        Some(parse_value(m, payload, &format, &names, &types))
    });
    // The records are already parsed (or their error): the map only hands them on.
    let map: super::connectors::RowMap<TaskResult<Row>> = Arc::new(|r| r);
    Ok(attach(env, MapSource { inner: source, map }, table, uid))
}

/// A record's value as a row, a trailing line end dropped.
fn parse_value(
    m: &KafkaMessage<'_>,
    payload: &[u8],
    format: &Format,
    names: &[String],
    types: &[SqlType],
) -> TaskResult<Row> {
    let mut bytes = payload;
    if let Some(rest) = bytes.strip_suffix(b"\n") {
        bytes = rest.strip_suffix(b"\r").unwrap_or(rest);
    }
    let at = || {
        format!(
            "Kafka record {}/{} at offset {}",
            m.topic, m.partition, m.offset
        )
    };
    let text = std::str::from_utf8(bytes)
        .map_err(|e| TaskError::Unrecoverable(format!("{}: the value is not UTF-8: {e}", at())))?;
    format.parse(text, names, types).map_err(|e| match e {
        TaskError::Unrecoverable(m) => TaskError::Unrecoverable(format!("{}: {m}", at())),
        other => other,
    })
}

/// Writes `stream` into a `kafka` table (appends only) or an `upsert-kafka` one.
pub(super) fn sink(
    stream: DataStream<Row>,
    table: &Table,
    options: Options,
    updating: bool,
    uid: &str,
    upsert: bool,
) -> Result<()> {
    let t = KafkaTable::of(table, options, upsert, false)?;
    if updating && !upsert {
        return table_err(
            table,
            "the kafka sink only appends: it doesn't support consuming update changes, and this query's result is a changelog (write it to an 'upsert-kafka' table with a PRIMARY KEY)",
        );
    }
    let [topic] = &t.topics[..] else {
        return table_err(
            table,
            format!(
                "a Kafka sink writes one topic; 'topic' names {}",
                t.topics.len()
            ),
        );
    };
    if let Some((k, _)) = t.properties.first() {
        return table_err(
            table,
            format!("option 'properties.{k}' is not supported by cairn's Kafka sink (it takes 'properties.bootstrap.servers' and 'properties.{TRANSACTION_TIMEOUT}'; the others are for reading)"),
        );
    }
    let mut config = KafkaSinkConfig::new(t.brokers, topic.clone());
    config.guarantee = t.guarantee;
    config.transactional_id_prefix = t.transactional_id_prefix;
    if let Some(timeout) = t.transaction_timeout {
        config.transaction_timeout = timeout;
    }
    let names: Vec<String> = table.columns.iter().map(|c| c.name.clone()).collect();
    let value = Columns::new(t.value, t.value_columns, &names);
    let sink = match t.key {
        None => {
            let encoder: KafkaEncoder<Row> = Arc::new(move |row: &Row, _, out: &mut Vec<u8>| {
                debug_assert_eq!(row.kind, RowKind::Insert);
                value.write(row, out)
            });
            KafkaSink::new(config, encoder)
        }
        Some((format, columns)) => {
            let key = Columns::new(format, columns, &names);
            let encoder: KafkaEncoder<Row> =
                Arc::new(move |row: &Row, k: &mut Vec<u8>, v: &mut Vec<u8>| {
                    key.write(row, k);
                    if row.kind != RowKind::Delete {
                        value.write(row, v);
                    }
                });
            KafkaSink::new(config, encoder)
                .map(|s| s.with_tombstones(|row: &Row| row.kind == RowKind::Delete))
        }
    }
    .or_else(|e| table_err(table, e))?;
    if upsert {
        // Keyed by the row: the +U after a -U replaces it.
        stream
            .filter(|r: &Row| r.kind != RowKind::UpdateBefore)
            .uid(&format!("{uid}.upsert"))
            .sink(sink)
            .uid(uid);
    } else {
        stream.sink(sink).uid(uid);
    }
    Ok(())
}

/// Some of a row's columns in a format: a record's key or value.
struct Columns {
    format: Format,
    columns: Vec<usize>,
    names: Vec<String>,
    /// The columns are the whole row, in order.
    whole: bool,
}

impl Columns {
    fn new(format: Format, columns: Vec<usize>, names: &[String]) -> Columns {
        let whole = columns.iter().copied().eq(0..names.len());
        Columns {
            format,
            names: columns.iter().map(|&i| names[i].clone()).collect(),
            columns,
            whole,
        }
    }

    /// Appends the columns of `row` in the format, without the line end.
    fn write(&self, row: &Row, out: &mut Vec<u8>) {
        if self.whole {
            self.format.write(row, &self.names, out);
        } else {
            let part = Row::insert(
                self.columns
                    .iter()
                    .map(|&i| row.values.get(i).cloned().unwrap_or(Value::Null))
                    .collect(),
            );
            self.format.write(&part, &self.names, out);
        }
        if out.last() == Some(&b'\n') {
            out.pop();
        }
    }
}
