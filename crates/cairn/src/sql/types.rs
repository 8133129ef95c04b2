//! SQL values, types and rows: what a compiled SQL job's records are made of.

use std::cmp::Ordering;
use std::fmt::{self, Write as _};
use std::hash::{Hash, Hasher};

use compact_str::CompactString;
use serde::{Deserialize, Serialize};

use crate::state::keygroup::{KeyEncoder, StableKey};

/// A column's type (Flink's logical types that cairn supports).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlType {
    /// `BOOLEAN`.
    Boolean,
    /// `INT` (a 32-bit integer; held as an `i64`, range-checked where it is produced).
    Int,
    /// `BIGINT`.
    BigInt,
    /// `DOUBLE` (also `FLOAT`).
    Double,
    /// `DECIMAL(precision, scale)`.
    Decimal(u8, u8),
    /// `VARCHAR`, `STRING`, `CHAR`.
    String,
    /// `TIMESTAMP(3)` (`ltz: false`) or `TIMESTAMP_LTZ(3)`: ms since the epoch.
    Timestamp { ltz: bool },
    /// `ROW<name type, …>`.
    Row(Vec<(String, SqlType)>),
    /// An interval literal (`INTERVAL '4' SECOND`), in ms: only an operand of time arithmetic.
    Interval,
    /// The type of a bare `NULL` literal.
    Null,
}

impl SqlType {
    /// Whether equal values of this type and `other` are equal keys (the same [`Value`]
    /// variant): integers with integers, otherwise the same type.
    pub fn comparable_key(&self, other: &SqlType) -> bool {
        use SqlType::*;
        match (self, other) {
            (Int | BigInt, Int | BigInt) => true,
            (Decimal(_, a), Decimal(_, b)) => a == b,
            (Timestamp { .. }, Timestamp { .. }) => true,
            (a, b) => a == b,
        }
    }

    /// Numeric types take part in arithmetic.
    pub fn is_numeric(&self) -> bool {
        matches!(
            self,
            SqlType::Int | SqlType::BigInt | SqlType::Double | SqlType::Decimal(..) | SqlType::Null
        )
    }

    /// The digits and scale of an exact number type: `INT` is `DECIMAL(10, 0)`, `BIGINT`
    /// `DECIMAL(19, 0)`.
    pub fn exact_digits(&self) -> Option<(u8, u8)> {
        match self {
            SqlType::Int => Some((10, 0)),
            SqlType::BigInt => Some((19, 0)),
            SqlType::Decimal(p, s) => Some(((*p).max(*s), *s)),
            _ => None,
        }
    }

    /// Whether a value of this type can be written where `target` is expected (a decimal's
    /// precision aside: a value beyond it is NULL).
    pub fn fits(&self, target: &SqlType) -> bool {
        use SqlType::*;
        match (self, target) {
            (Null, _) => true,
            (a, b) if a == b => true,
            (Int, BigInt | Double | Decimal(..)) => true,
            (BigInt, Double | Decimal(..)) => true,
            (Decimal(..), Decimal(..) | Double) => true,
            (Timestamp { .. }, Timestamp { .. }) => true,
            (Row(a), Row(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|((_, x), (_, y))| x.fits(y))
            }
            _ => false,
        }
    }
}

impl fmt::Display for SqlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SqlType::Boolean => f.write_str("BOOLEAN"),
            SqlType::Int => f.write_str("INT"),
            SqlType::BigInt => f.write_str("BIGINT"),
            SqlType::Double => f.write_str("DOUBLE"),
            SqlType::Decimal(p, s) => write!(f, "DECIMAL({p}, {s})"),
            SqlType::String => f.write_str("STRING"),
            SqlType::Timestamp { ltz: false } => f.write_str("TIMESTAMP(3)"),
            SqlType::Timestamp { ltz: true } => f.write_str("TIMESTAMP_LTZ(3)"),
            SqlType::Row(fields) => {
                f.write_str("ROW<")?;
                for (i, (name, ty)) in fields.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{name} {ty}")?;
                }
                f.write_str(">")
            }
            SqlType::Interval => f.write_str("INTERVAL"),
            SqlType::Null => f.write_str("NULL"),
        }
    }
}

/// One value of a row. `Decimal` is an unscaled integer and its scale.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub enum Value {
    /// SQL `NULL`.
    #[default]
    Null,
    /// `BOOLEAN`.
    Bool(bool),
    /// `INT` and `BIGINT`.
    Int(i64),
    /// `DOUBLE`.
    Double(f64),
    /// `DECIMAL`: `unscaled / 10^scale`.
    Decimal(i128, u8),
    /// `STRING`.
    Str(CompactString),
    /// `TIMESTAMP(3)`, `TIMESTAMP_LTZ(3)`: ms since the epoch.
    Ts(i64),
    /// `ROW`.
    Row(Box<[Value]>),
}

impl Value {
    /// Whether it is `NULL`.
    pub fn is_null(&self) -> bool {
        matches!(self, Value::Null)
    }

    /// The value as an integer, if it is one.
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            Value::Int(v) | Value::Ts(v) => Some(*v),
            _ => None,
        }
    }

    /// The value as a double (integers and decimals converted).
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            Value::Int(v) => Some(*v as f64),
            Value::Double(v) => Some(*v),
            Value::Decimal(u, s) => Some(*u as f64 / 10f64.powi(i32::from(*s))),
            _ => None,
        }
    }

    /// The value as a string slice, if it is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    fn rank(&self) -> u8 {
        match self {
            Value::Null => 0,
            Value::Bool(_) => 1,
            Value::Int(_) | Value::Double(_) | Value::Decimal(..) => 2,
            Value::Str(_) => 3,
            Value::Ts(_) => 4,
            Value::Row(_) => 5,
        }
    }

    /// SQL comparison (`NULL` sorts first; numbers compare across their types).
    pub fn compare(&self, other: &Value) -> Ordering {
        use Value::*;
        match (self, other) {
            (Int(a), Int(b)) | (Ts(a), Ts(b)) => a.cmp(b),
            (Decimal(a, s), Decimal(b, t)) if s == t => a.cmp(b),
            (Decimal(a, s), Decimal(b, t)) => {
                let scale = (*s).max(*t);
                rescale(*a, *s, scale).cmp(&rescale(*b, *t, scale))
            }
            (Int(a), Decimal(b, t)) => rescale(i128::from(*a), 0, *t).cmp(b),
            (Decimal(a, s), Int(b)) => a.cmp(&rescale(i128::from(*b), 0, *s)),
            (Bool(a), Bool(b)) => a.cmp(b),
            (Str(a), Str(b)) => a.cmp(b),
            (Row(a), Row(b)) => {
                for (x, y) in a.iter().zip(b.iter()) {
                    let o = x.compare(y);
                    if o != Ordering::Equal {
                        return o;
                    }
                }
                a.len().cmp(&b.len())
            }
            (a, b) if a.rank() == 2 && b.rank() == 2 => {
                let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
                x.total_cmp(&y)
            }
            (a, b) => a.rank().cmp(&b.rank()),
        }
    }

    /// Writes the value as Flink prints it (`print` connector, CSV): timestamps as
    /// `2015-07-15 00:00:00.000`, decimals with their scale, `NULL` as `null`… except that
    /// `null_text` is what a `NULL` becomes.
    pub fn write_text(&self, out: &mut String, null_text: &str) {
        match self {
            Value::Null => out.push_str(null_text),
            Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
            Value::Int(v) => {
                let _ = write!(out, "{v}");
            }
            Value::Double(v) => write_double(out, *v),
            Value::Decimal(u, s) => write_decimal(out, *u, *s),
            Value::Str(s) => out.push_str(s),
            Value::Ts(ms) => write_timestamp(out, *ms),
            Value::Row(fields) => {
                out.push('(');
                for (i, v) in fields.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    v.write_text(out, null_text);
                }
                out.push(')');
            }
        }
    }
}

impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Value::Double(a), Value::Double(b)) => a.to_bits() == b.to_bits() || a == b,
            // Same variant only, so that equal values hash alike (`compare` orders across them).
            _ => {
                std::mem::discriminant(self) == std::mem::discriminant(other)
                    && self.compare(other) == Ordering::Equal
            }
        }
    }
}

impl Eq for Value {}

impl PartialOrd for Value {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Value {
    fn cmp(&self, other: &Self) -> Ordering {
        self.compare(other)
    }
}

impl Hash for Value {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match self {
            Value::Null => 0u8.hash(state),
            Value::Bool(b) => b.hash(state),
            Value::Int(v) | Value::Ts(v) => v.hash(state),
            Value::Double(v) => v.to_bits().hash(state),
            Value::Decimal(u, s) => {
                // Equal decimals of different scales hash alike.
                let (mut u, mut s) = (*u, *s);
                while s > 0 && u % 10 == 0 {
                    u /= 10;
                    s -= 1;
                }
                (u, s).hash(state)
            }
            Value::Str(s) => s.hash(state),
            Value::Row(f) => f.hash(state),
        }
    }
}

/// The documented byte encoding of a grouping key: a tag byte, then the value.
impl StableKey for Value {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        match self {
            Value::Null => out.write(&[0]),
            Value::Bool(b) => out.write(&[1, u8::from(*b)]),
            Value::Int(v) => {
                out.write(&[2]);
                v.encode(out);
            }
            Value::Double(v) => {
                out.write(&[3]);
                v.to_bits().encode(out);
            }
            Value::Decimal(u, s) => {
                out.write(&[4, *s]);
                u.encode(out);
            }
            Value::Str(s) => {
                out.write(&[5]);
                s.as_str().encode(out);
            }
            Value::Ts(v) => {
                out.write(&[6]);
                v.encode(out);
            }
            Value::Row(f) => {
                out.write(&[7]);
                f.as_ref().encode(out);
            }
        }
    }
}

/// `u` at scale `from` as an unscaled value at scale `to` (`to >= from`; saturating).
pub fn rescale(u: i128, from: u8, to: u8) -> i128 {
    if to >= from {
        u.saturating_mul(10i128.saturating_pow(u32::from(to - from)))
    } else {
        u / 10i128.pow(u32::from(from - to))
    }
}

fn write_double(out: &mut String, v: f64) {
    if v.is_finite() && v == v.trunc() && v.abs() < 1e15 {
        let _ = write!(out, "{v:.1}");
    } else {
        let _ = write!(out, "{v}");
    }
}

fn write_decimal(out: &mut String, u: i128, scale: u8) {
    if scale == 0 {
        let _ = write!(out, "{u}");
        return;
    }
    let p = 10i128.pow(u32::from(scale));
    let sign = if u < 0 { "-" } else { "" };
    let (int, frac) = ((u / p).abs(), (u % p).abs());
    let _ = write!(
        out,
        "{sign}{int}.{frac:0width$}",
        width = usize::from(scale)
    );
}

/// Days since 1970-01-01 as (year, month, day), proleptic Gregorian.
pub fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) as days since 1970-01-01.
pub fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The parts of a timestamp: year, month, day, hour, minute, second, millisecond (UTC).
pub fn timestamp_parts(ms: i64) -> (i64, u32, u32, u32, u32, u32, u32) {
    let days = ms.div_euclid(86_400_000);
    let rest = ms.rem_euclid(86_400_000);
    let (y, mo, d) = civil_from_days(days);
    let secs = (rest / 1000) as u32;
    (
        y,
        mo,
        d,
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        (rest % 1000) as u32,
    )
}

/// `2015-07-15 00:00:00.000`.
pub fn write_timestamp(out: &mut String, ms: i64) {
    let (y, mo, d, h, mi, s, milli) = timestamp_parts(ms);
    let _ = write!(
        out,
        "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02}.{milli:03}"
    );
}

/// Parses `yyyy-MM-dd[ HH:mm[:ss[.SSS]]]` (or with a `T`) as ms since the epoch.
pub fn parse_timestamp(text: &str) -> Option<i64> {
    let text = text.trim();
    let (date, time) = match text.find([' ', 'T']) {
        Some(i) => (&text[..i], text[i + 1..].trim_end_matches('Z')),
        None => (text, ""),
    };
    let mut dp = date.splitn(3, '-');
    let y: i64 = dp.next()?.parse().ok()?;
    let m: u32 = dp.next()?.parse().ok()?;
    let d: u32 = dp.next()?.parse().ok()?;
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    let mut ms = days_from_civil(y, m, d) * 86_400_000;
    if !time.is_empty() {
        let (hms, frac) = match time.split_once('.') {
            Some((a, b)) => (a, b),
            None => (time, ""),
        };
        let mut tp = hms.split(':');
        let h: i64 = tp.next()?.parse().ok()?;
        let mi: i64 = tp.next().unwrap_or("0").parse().ok()?;
        let s: i64 = tp.next().unwrap_or("0").parse().ok()?;
        if h > 23 || mi > 59 || s > 60 || tp.next().is_some() {
            return None;
        }
        let mut milli = 0i64;
        for (i, c) in frac.chars().take(3).enumerate() {
            milli += i64::from(c.to_digit(10)?) * 10i64.pow(2 - i as u32);
        }
        ms += ((h * 60 + mi) * 60 + s) * 1000 + milli;
    }
    Some(ms)
}

/// Parses a decimal literal (`12.50`, `-3`) as an unscaled value and its scale.
pub fn parse_decimal(text: &str) -> Option<(i128, u8)> {
    let text = text.trim();
    let (int, frac) = match text.split_once('.') {
        Some((a, b)) => (a, b),
        None => (text, ""),
    };
    if frac.len() > 38 || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let digits = format!("{int}{frac}");
    let u: i128 = digits.parse().ok()?;
    Some((u, frac.len() as u8))
}

/// How a row changes a table (Flink's `RowKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
pub enum RowKind {
    /// `+I`: a new row.
    #[default]
    Insert,
    /// `-U`: the old version of an updated row.
    UpdateBefore,
    /// `+U`: the new version of an updated row.
    UpdateAfter,
    /// `-D`: a deleted row.
    Delete,
}

impl RowKind {
    /// `+I`, `-U`, `+U`, `-D`.
    pub fn short(self) -> &'static str {
        match self {
            RowKind::Insert => "+I",
            RowKind::UpdateBefore => "-U",
            RowKind::UpdateAfter => "+U",
            RowKind::Delete => "-D",
        }
    }

    /// Whether the row adds to the table (+I, +U) rather than takes away (-U, -D).
    pub fn is_addition(self) -> bool {
        matches!(self, RowKind::Insert | RowKind::UpdateAfter)
    }
}

/// A record of a SQL job: its change kind and its values in column order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Row {
    /// How this row changes its table.
    pub kind: RowKind,
    /// The values.
    pub values: Vec<Value>,
}

impl Row {
    /// An insertion.
    pub fn insert(values: Vec<Value>) -> Row {
        Row {
            kind: RowKind::Insert,
            values,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_round_trip_through_text() {
        for ms in [0, 1_436_918_400_000, -86_400_001, 951_782_400_123] {
            let mut s = String::new();
            write_timestamp(&mut s, ms);
            assert_eq!(parse_timestamp(&s), Some(ms), "{s}");
        }
        let mut s = String::new();
        write_timestamp(&mut s, 1_436_918_400_000);
        assert_eq!(s, "2015-07-15 00:00:00.000");
        assert_eq!(parse_timestamp("2015-13-01"), None);
    }

    #[test]
    fn decimals_print_with_their_scale_and_compare_across_scales() {
        let mut s = String::new();
        Value::Decimal(-12_050, 3).write_text(&mut s, "null");
        assert_eq!(s, "-12.050");
        assert_eq!(Value::Decimal(120, 1), Value::Decimal(12_000, 3));
        assert_eq!(
            Value::Int(12).compare(&Value::Decimal(120, 1)),
            Ordering::Equal
        );
        assert_eq!(parse_decimal("0.908"), Some((908, 3)));
    }
}
