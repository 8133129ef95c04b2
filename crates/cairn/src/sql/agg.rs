//! SQL aggregate functions: `COUNT`, `SUM`, `MIN`, `MAX`, `AVG`, `COUNT(DISTINCT …)`, each
//! with an optional `FILTER (WHERE …)`, as accumulators that add, retract (for updating
//! input) and merge (window panes and sessions).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::expr::arithmetic;
use super::expr::BinOp;
use super::types::{SqlType, Value};

/// The aggregate functions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AggKind {
    /// `COUNT(*)`.
    CountStar,
    /// `COUNT(x)`: non-null values.
    Count,
    /// `SUM(x)`.
    Sum,
    /// `MIN(x)`.
    Min,
    /// `MAX(x)`.
    Max,
    /// `AVG(x)`.
    Avg,
}

/// One aggregate of an aggregation: its function, the input column of its argument and of
/// its filter, and its result type.
#[derive(Debug, Clone)]
pub struct AggCall {
    /// The function.
    pub kind: AggKind,
    /// `DISTINCT`.
    pub distinct: bool,
    /// The argument's column in the aggregation's input (none for `COUNT(*)`).
    pub arg: Option<usize>,
    /// The column of the `FILTER (WHERE …)` condition.
    pub filter: Option<usize>,
    /// The result's type.
    pub ty: SqlType,
}

/// An accumulator's state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Acc {
    /// Rows or values counted.
    Count(i64),
    /// A sum and how many values are in it (`AVG`, and `SUM` is `NULL` over none).
    Sum(Value, i64),
    /// The values with their multiplicities (`MIN`, `MAX` under retraction; `DISTINCT`).
    Multiset(BTreeMap<Value, i64>),
    /// The smallest or largest value so far (append-only input).
    Extreme(Value),
}

impl AggCall {
    fn multiset(&self, retracting: bool) -> bool {
        self.distinct || (retracting && matches!(self.kind, AggKind::Min | AggKind::Max))
    }

    /// An empty accumulator; `retracting`: the input is a changelog.
    pub fn create(&self, retracting: bool) -> Acc {
        if self.multiset(retracting) {
            return Acc::Multiset(BTreeMap::new());
        }
        match self.kind {
            AggKind::CountStar | AggKind::Count => Acc::Count(0),
            AggKind::Sum | AggKind::Avg => Acc::Sum(Value::Null, 0),
            AggKind::Min | AggKind::Max => Acc::Extreme(Value::Null),
        }
    }

    /// Adds (`sign` 1) or retracts (`sign` -1) a row.
    pub fn accumulate(&self, acc: &mut Acc, row: &[Value], sign: i64) -> Result<(), String> {
        if let Some(f) = self.filter {
            if !matches!(row.get(f), Some(Value::Bool(true))) {
                return Ok(());
            }
        }
        let value = match self.arg {
            Some(i) => match row.get(i) {
                Some(v) if !v.is_null() => v,
                _ => return Ok(()),
            },
            None => &Value::Null,
        };
        match acc {
            Acc::Count(n) => *n += sign,
            Acc::Sum(sum, n) => {
                let v = if sign > 0 {
                    value.clone()
                } else {
                    arithmetic(BinOp::Sub, Value::Int(0), value.clone(), &self.sum_type())?
                };
                *sum = if sum.is_null() {
                    v
                } else {
                    arithmetic(BinOp::Add, std::mem::take(sum), v, &self.sum_type())?
                };
                *n += sign;
            }
            Acc::Multiset(values) => {
                let count = values.entry(value.clone()).or_insert(0);
                *count += sign;
                if *count == 0 {
                    values.remove(value);
                }
            }
            Acc::Extreme(best) => {
                let better = best.is_null()
                    || match self.kind {
                        AggKind::Min => value < best,
                        _ => value > best,
                    };
                if better {
                    *best = value.clone();
                }
            }
        }
        Ok(())
    }

    /// Folds `other` into `acc`.
    pub fn merge(&self, acc: &mut Acc, other: &Acc) -> Result<(), String> {
        match (acc, other) {
            (Acc::Count(a), Acc::Count(b)) => *a += b,
            (Acc::Sum(a, n), Acc::Sum(b, m)) => {
                if !b.is_null() {
                    *a = if a.is_null() {
                        b.clone()
                    } else {
                        arithmetic(BinOp::Add, std::mem::take(a), b.clone(), &self.sum_type())?
                    };
                }
                *n += m;
            }
            (Acc::Multiset(a), Acc::Multiset(b)) => {
                for (v, c) in b {
                    let count = a.entry(v.clone()).or_insert(0);
                    *count += c;
                    if *count == 0 {
                        a.remove(v);
                    }
                }
            }
            (Acc::Extreme(a), Acc::Extreme(b)) => {
                let better = !b.is_null()
                    && (a.is_null()
                        || match self.kind {
                            AggKind::Min => b < a,
                            _ => b > a,
                        });
                if better {
                    *a = b.clone();
                }
            }
            _ => return Err("accumulators of different kinds cannot merge".into()),
        }
        Ok(())
    }

    /// The type sums are kept in: the result's, except that `AVG` sums exactly.
    fn sum_type(&self) -> SqlType {
        match (&self.kind, &self.ty) {
            (AggKind::Avg, SqlType::Int) => SqlType::BigInt,
            (AggKind::Avg, SqlType::Decimal(_, _)) => SqlType::Decimal(38, 18),
            (_, ty) => ty.clone(),
        }
    }

    /// The aggregate's value.
    pub fn result(&self, acc: &Acc) -> Result<Value, String> {
        Ok(match acc {
            Acc::Count(n) => Value::Int(*n),
            Acc::Sum(sum, n) => match self.kind {
                AggKind::Avg if *n == 0 || sum.is_null() => Value::Null,
                AggKind::Avg => arithmetic(BinOp::Div, sum.clone(), Value::Int(*n), &self.ty)?,
                _ if *n == 0 => Value::Null,
                _ => sum.clone(),
            },
            Acc::Multiset(values) => match self.kind {
                AggKind::Count | AggKind::CountStar => Value::Int(values.len() as i64),
                AggKind::Min => values.keys().next().cloned().unwrap_or_default(),
                AggKind::Max => values.keys().next_back().cloned().unwrap_or_default(),
                AggKind::Sum | AggKind::Avg => {
                    let mut sum = Value::Null;
                    for v in values.keys() {
                        sum = if sum.is_null() {
                            v.clone()
                        } else {
                            arithmetic(BinOp::Add, sum, v.clone(), &self.sum_type())?
                        };
                    }
                    if self.kind == AggKind::Avg && !values.is_empty() {
                        arithmetic(BinOp::Div, sum, Value::Int(values.len() as i64), &self.ty)?
                    } else {
                        sum
                    }
                }
            },
            Acc::Extreme(v) => v.clone(),
        })
    }
}

/// The result type of `kind` over an argument of type `arg`, or why it does not apply.
pub fn result_type(kind: AggKind, arg: Option<&SqlType>) -> Result<SqlType, String> {
    Ok(match (kind, arg) {
        (AggKind::CountStar | AggKind::Count, _) => SqlType::BigInt,
        (AggKind::Min | AggKind::Max, Some(t)) => t.clone(),
        (AggKind::Sum, Some(SqlType::Int)) => SqlType::Int,
        (AggKind::Sum, Some(SqlType::BigInt)) => SqlType::BigInt,
        (AggKind::Sum | AggKind::Avg, Some(SqlType::Double)) => SqlType::Double,
        (AggKind::Sum, Some(SqlType::Decimal(_, s))) => SqlType::Decimal(38, *s),
        (AggKind::Avg, Some(SqlType::Int)) => SqlType::Int,
        (AggKind::Avg, Some(SqlType::BigInt)) => SqlType::BigInt,
        (AggKind::Avg, Some(SqlType::Decimal(_, s))) => SqlType::Decimal(38, (*s).max(6)),
        (k, Some(t)) => {
            return Err(format!("{k:?} does not apply to a value of type {t}").to_uppercase())
        }
        (k, None) => return Err(format!("{k:?} needs an argument").to_uppercase()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(kind: AggKind, ty: SqlType) -> AggCall {
        AggCall {
            kind,
            distinct: false,
            arg: Some(0),
            filter: None,
            ty,
        }
    }

    #[test]
    fn retracting_min_falls_back_to_the_next_value() {
        let min = call(AggKind::Min, SqlType::BigInt);
        let mut acc = min.create(true);
        for v in [5, 3, 9] {
            min.accumulate(&mut acc, &[Value::Int(v)], 1).unwrap();
        }
        assert_eq!(min.result(&acc).unwrap(), Value::Int(3));
        min.accumulate(&mut acc, &[Value::Int(3)], -1).unwrap();
        assert_eq!(min.result(&acc).unwrap(), Value::Int(5));
    }

    #[test]
    fn avg_of_integers_truncates_and_of_nothing_is_null() {
        let avg = call(AggKind::Avg, SqlType::BigInt);
        let mut acc = avg.create(false);
        assert_eq!(avg.result(&acc).unwrap(), Value::Null);
        for v in [1, 2] {
            avg.accumulate(&mut acc, &[Value::Int(v)], 1).unwrap();
        }
        assert_eq!(avg.result(&acc).unwrap(), Value::Int(1));
        let mut other = avg.create(false);
        avg.accumulate(&mut other, &[Value::Int(6)], 1).unwrap();
        avg.merge(&mut acc, &other).unwrap();
        assert_eq!(avg.result(&acc).unwrap(), Value::Int(3));
    }

    #[test]
    fn count_distinct_counts_values_once_and_nulls_never() {
        let mut c = call(AggKind::Count, SqlType::BigInt);
        c.distinct = true;
        let mut acc = c.create(false);
        for v in [Value::Int(1), Value::Int(1), Value::Null, Value::Int(2)] {
            c.accumulate(&mut acc, &[v], 1).unwrap();
        }
        assert_eq!(c.result(&acc).unwrap(), Value::Int(2));
    }
}
