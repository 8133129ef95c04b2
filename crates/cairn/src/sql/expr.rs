//! Compiled scalar expressions: a tree the binder builds once from the SQL text, with every
//! name resolved to a column index and every type checked, evaluated on each row.

use std::cmp::Ordering;
use std::sync::Arc;

use compact_str::{CompactString, ToCompactString};

use super::types::{parse_decimal, parse_timestamp, rescale, timestamp_parts, SqlType, Value};

/// A binary operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `+`
    Add,
    /// `-`
    Sub,
    /// `*`
    Mul,
    /// `/`
    Div,
    /// `%`, `MOD`
    Mod,
    /// `=`
    Eq,
    /// `<>`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
    /// `AND`
    And,
    /// `OR`
    Or,
    /// `||`
    Concat,
}

/// A built-in function.
#[derive(Debug, Clone)]
pub enum Func {
    Abs,
    Floor,
    Ceil,
    Round,
    Power,
    Sqrt,
    Upper,
    Lower,
    CharLength,
    /// `SUBSTRING(s, start[, length])`, 1-based.
    Substring,
    /// `TRIM(s)` (both sides, spaces).
    Trim,
    /// `CONCAT(a, b, …)`: `NULL` if any is.
    Concat,
    Replace,
    /// `POSITION(needle IN haystack)`, 1-based, 0 if absent.
    Position,
    /// `SPLIT_INDEX(s, separator, index)`, 0-based.
    SplitIndex,
    /// `REGEXP_EXTRACT(s, regex[, group])`.
    RegexpExtract(Arc<regex::Regex>),
    /// `REGEXP(s, regex)`: whether it matches.
    Regexp(Arc<regex::Regex>),
    /// `DATE_FORMAT(ts, pattern)` with Java's pattern letters `yyyy MM dd HH mm ss SSS`.
    DateFormat,
    /// `EXTRACT(unit FROM ts)`, `YEAR(ts)`, …
    Extract(TimeUnit),
    /// `TO_TIMESTAMP(string)`.
    ToTimestamp,
    /// `TO_TIMESTAMP_LTZ(ms, 3)`.
    ToTimestampLtz,
    /// `PROCTIME()`, `CURRENT_TIMESTAMP`, `NOW()`: the wall clock.
    Now,
    Coalesce,
    NullIf,
    /// `IF(condition, then, else)`.
    If,
    Greatest,
    Least,
}

/// A part of a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimeUnit {
    Year,
    Month,
    Day,
    Hour,
    Minute,
    Second,
}

/// A compiled expression.
#[derive(Debug, Clone)]
pub enum Expr {
    /// The value of column `i`.
    Col(usize),
    /// Field `i` of a `ROW` value.
    Field(Box<Expr>, usize),
    /// A constant.
    Lit(Value),
    /// `NOT e`.
    Not(Box<Expr>),
    /// `-e`.
    Neg(Box<Expr>),
    /// `a op b`, with the result's type.
    Bin(BinOp, Box<Expr>, Box<Expr>, SqlType),
    /// `e IS NULL` (`true`) or `e IS NOT NULL` (`false`).
    IsNull(Box<Expr>, bool),
    /// `CASE WHEN c THEN v … ELSE e END`.
    Case(Vec<(Expr, Expr)>, Box<Expr>),
    /// `CAST(e AS type)`.
    Cast(Box<Expr>, SqlType),
    /// `e [NOT] IN (list)`.
    InList(Box<Expr>, Vec<Expr>, bool),
    /// `e [NOT] LIKE pattern`.
    Like(Box<Expr>, Arc<LikePattern>, bool),
    /// A function call.
    Call(Func, Vec<Expr>),
}

/// An error while evaluating a row (division by zero, a cast that cannot convert).
pub type EvalResult = Result<Value, String>;

impl Expr {
    /// The column it reads, if it is a plain column reference.
    pub fn as_col(&self) -> Option<usize> {
        match self {
            Expr::Col(i) => Some(*i),
            _ => None,
        }
    }

    /// Whether it is cheap enough to evaluate more than once: a column, a field of one, or a
    /// constant.
    pub fn is_simple(&self) -> bool {
        match self {
            Expr::Col(_) | Expr::Lit(_) => true,
            Expr::Field(e, _) => e.is_simple(),
            _ => false,
        }
    }

    /// The expression with column `col` replaced by `with`.
    pub fn replacing_col(&self, col: usize, with: &Expr) -> Expr {
        let last = self.columns().into_iter().max().unwrap_or(0).max(col);
        let mut all: Vec<Expr> = (0..=last).map(Expr::Col).collect();
        all[col] = with.clone();
        self.substitute(&all)
    }

    /// The expression with its parts that read no row (constants, and operators, casts and
    /// conditions over them) evaluated once. Function calls are kept: some read the clock.
    pub fn folded(self) -> Expr {
        let fold = |e: Box<Expr>| Box::new(e.folded());
        let e = match self {
            Expr::Not(e) => Expr::Not(fold(e)),
            Expr::Neg(e) => Expr::Neg(fold(e)),
            Expr::Bin(op, a, b, t) => Expr::Bin(op, fold(a), fold(b), t),
            Expr::IsNull(e, is) => Expr::IsNull(fold(e), is),
            Expr::Cast(e, t) => Expr::Cast(fold(e), t),
            Expr::Case(whens, otherwise) => {
                let mut kept = Vec::new();
                for (c, v) in whens {
                    match c.folded() {
                        // A branch that can never be taken goes.
                        Expr::Lit(Value::Bool(false) | Value::Null) => {}
                        // The first that is always taken ends the CASE.
                        Expr::Lit(Value::Bool(true)) if kept.is_empty() => return v.folded(),
                        c => kept.push((c, v.folded())),
                    }
                }
                if kept.is_empty() {
                    return otherwise.folded();
                }
                Expr::Case(kept, fold(otherwise))
            }
            other => other,
        };
        let constant = match &e {
            Expr::Not(a) | Expr::Neg(a) | Expr::IsNull(a, _) | Expr::Cast(a, _) => {
                matches!(**a, Expr::Lit(_))
            }
            Expr::Bin(_, a, b, _) => matches!((&**a, &**b), (Expr::Lit(_), Expr::Lit(_))),
            _ => false,
        };
        match constant {
            // An error (a division by zero) is left for the row to raise.
            true => e.eval(&[]).map(Expr::Lit).unwrap_or(e),
            false => e,
        }
    }

    /// The expression with each column `i` replaced by `with[i]` (fusing two calcs).
    pub fn substitute(&self, with: &[Expr]) -> Expr {
        self.rewrite(&mut |e| match e {
            Expr::Col(i) => Some(with.get(*i).cloned().unwrap_or(Expr::Lit(Value::Null))),
            _ => None,
        })
    }

    /// The expression with each part that `f` gives a replacement for replaced (and not looked
    /// into further), the rest rebuilt around its rewritten parts.
    pub fn rewrite(&self, f: &mut dyn FnMut(&Expr) -> Option<Expr>) -> Expr {
        if let Some(e) = f(self) {
            return e;
        }
        let mut sub = |e: &Expr| Box::new(e.rewrite(f));
        match self {
            Expr::Col(i) => Expr::Col(*i),
            Expr::Lit(v) => Expr::Lit(v.clone()),
            Expr::Field(e, i) => Expr::Field(sub(e), *i),
            Expr::Not(e) => Expr::Not(sub(e)),
            Expr::Neg(e) => Expr::Neg(sub(e)),
            Expr::Bin(op, a, b, t) => {
                let a = sub(a);
                Expr::Bin(*op, a, sub(b), t.clone())
            }
            Expr::IsNull(e, is) => Expr::IsNull(sub(e), *is),
            Expr::Case(whens, e) => {
                let whens = whens
                    .iter()
                    .map(|(c, v)| (c.rewrite(f), v.rewrite(f)))
                    .collect();
                Expr::Case(whens, Box::new(e.rewrite(f)))
            }
            Expr::Cast(e, t) => Expr::Cast(sub(e), t.clone()),
            Expr::InList(e, list, n) => {
                let e = Box::new(e.rewrite(f));
                Expr::InList(e, list.iter().map(|x| x.rewrite(f)).collect(), *n)
            }
            Expr::Like(e, p, n) => Expr::Like(sub(e), p.clone(), *n),
            Expr::Call(func, args) => {
                Expr::Call(func.clone(), args.iter().map(|x| x.rewrite(f)).collect())
            }
        }
    }

    /// Whether the result depends only on the row (not on the clock).
    pub fn deterministic(&self) -> bool {
        let mut yes = true;
        self.visit(&mut |e| {
            if matches!(e, Expr::Call(Func::Now, _)) {
                yes = false;
            }
        });
        yes
    }

    /// The columns it reads.
    pub fn columns(&self) -> Vec<usize> {
        let mut cols = Vec::new();
        self.visit(&mut |e| {
            if let Expr::Col(i) = e {
                cols.push(*i);
            }
        });
        cols
    }

    fn visit(&self, f: &mut dyn FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Col(_) | Expr::Lit(_) => {}
            Expr::Field(e, _)
            | Expr::Not(e)
            | Expr::Neg(e)
            | Expr::IsNull(e, _)
            | Expr::Cast(e, _)
            | Expr::Like(e, _, _) => e.visit(f),
            Expr::Bin(_, a, b, _) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Case(whens, e) => {
                for (c, v) in whens {
                    c.visit(f);
                    v.visit(f);
                }
                e.visit(f);
            }
            Expr::InList(e, list, _) => {
                e.visit(f);
                list.iter().for_each(|x| x.visit(f));
            }
            Expr::Call(_, args) => args.iter().for_each(|x| x.visit(f)),
        }
    }

    /// Evaluates on `row`.
    /// The value of a column, or of a field of one, in `row` without copying it (None: it is
    /// not such a path).
    pub fn place<'a>(&self, row: &'a [Value]) -> Option<&'a Value> {
        static NULL: Value = Value::Null;
        match self {
            Expr::Col(i) => Some(row.get(*i).unwrap_or(&NULL)),
            Expr::Field(e, i) => match e.place(row)? {
                Value::Row(fields) => Some(fields.get(*i).unwrap_or(&NULL)),
                _ => Some(&NULL),
            },
            _ => None,
        }
    }

    pub fn eval(&self, row: &[Value]) -> EvalResult {
        Ok(match self {
            Expr::Col(i) => row.get(*i).cloned().unwrap_or_default(),
            // A field is read in place: evaluating its row first would copy the whole row.
            Expr::Field(e, i) => match self.place(row) {
                Some(v) => v.clone(),
                None => match e.eval(row)? {
                    Value::Row(fields) => fields.get(*i).cloned().unwrap_or_default(),
                    _ => Value::Null,
                },
            },
            Expr::Lit(v) => v.clone(),
            Expr::Not(e) => match e.eval(row)? {
                Value::Bool(b) => Value::Bool(!b),
                _ => Value::Null,
            },
            Expr::Neg(e) => match e.eval(row)? {
                Value::Int(v) => Value::Int(v.wrapping_neg()),
                Value::Double(v) => Value::Double(-v),
                Value::Decimal(u, s) => Value::Decimal(-u, s),
                _ => Value::Null,
            },
            Expr::Bin(BinOp::And | BinOp::Or, ..) => match self.truth(row)? {
                Some(b) => Value::Bool(b),
                None => Value::Null,
            },
            Expr::Bin(op, a, b, ty) => match integral(*op, a, b, ty, row) {
                Some(v) => v,
                None => match decimal_operand(self, row) {
                    Some((u, s)) => Value::Decimal(u, s),
                    None => binary(*op, a, b, ty, row)?,
                },
            },
            Expr::IsNull(e, is) => Value::Bool(operand(e, row)?.is_null() == *is),
            Expr::Case(whens, otherwise) => {
                for (c, v) in whens {
                    if matches!(c.eval(row)?, Value::Bool(true)) {
                        return v.eval(row);
                    }
                }
                otherwise.eval(row)?
            }
            Expr::Cast(e, ty @ SqlType::Decimal(..)) => match decimal_operand(self, row) {
                Some((u, s)) => Value::Decimal(u, s),
                None => cast(e.eval(row)?, ty)?,
            },
            Expr::Cast(e, ty) => cast(e.eval(row)?, ty)?,
            Expr::InList(e, list, negated) => {
                let v = operand(e, row)?;
                if v.is_null() {
                    return Ok(Value::Null);
                }
                let mut found = false;
                for x in list {
                    if operand(x, row)?.compare(&v) == Ordering::Equal {
                        found = true;
                        break;
                    }
                }
                Value::Bool(found != *negated)
            }
            Expr::Like(e, pattern, negated) => match &*operand(e, row)? {
                Value::Str(s) => Value::Bool(pattern.matches(s) != *negated),
                _ => Value::Null,
            },
            Expr::Call(f, args) => call(f, args, row)?,
        })
    }

    /// Evaluates a condition: `NULL` is not true.
    pub fn test(&self, row: &[Value]) -> Result<bool, String> {
        Ok(self.truth(row)? == Some(true))
    }

    /// A condition's value in SQL's three-valued logic (None: `NULL`), without making a
    /// [`Value`] of it or of its parts where they are logic, integer or timestamp
    /// comparisons; the same result as [`Expr::eval`].
    pub fn truth(&self, row: &[Value]) -> Result<Option<bool>, String> {
        Ok(match self {
            Expr::Lit(Value::Bool(b)) => Some(*b),
            Expr::Not(e) => e.truth(row)?.map(|b| !b),
            Expr::Bin(BinOp::And, a, b, _) => match a.truth(row)? {
                Some(false) => Some(false),
                x => match (x, b.truth(row)?) {
                    (_, Some(false)) => Some(false),
                    (Some(true), Some(true)) => Some(true),
                    _ => None,
                },
            },
            Expr::Bin(BinOp::Or, a, b, _) => match a.truth(row)? {
                Some(true) => Some(true),
                x => match (x, b.truth(row)?) {
                    (_, Some(true)) => Some(true),
                    (Some(false), Some(false)) => Some(false),
                    _ => None,
                },
            },
            Expr::Bin(op, a, b, _) if is_comparison(*op) => {
                match (integral_operand(a, row), integral_operand(b, row)) {
                    (Some(x), Some(y)) if x.1 == y.1 => Some(compare(*op, x.0.cmp(&y.0))),
                    _ => as_truth(self.eval(row)?),
                }
            }
            _ => as_truth(self.eval(row)?),
        })
    }
}

/// A condition's value as [`Expr::truth`] gives it.
fn as_truth(v: Value) -> Option<bool> {
    match v {
        Value::Bool(b) => Some(b),
        _ => None,
    }
}

fn is_comparison(op: BinOp) -> bool {
    matches!(
        op,
        BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge
    )
}

/// Whether comparison `op` holds for operands ordered `o`.
fn compare(op: BinOp, o: Ordering) -> bool {
    match op {
        BinOp::Eq => o == Ordering::Equal,
        BinOp::Ne => o != Ordering::Equal,
        BinOp::Lt => o == Ordering::Less,
        BinOp::Le => o != Ordering::Greater,
        BinOp::Gt => o == Ordering::Greater,
        _ => o != Ordering::Less,
    }
}

/// A `DECIMAL` sum, difference or product, or a cast to `DECIMAL` (or an operand of one: an
/// integer or decimal read in place, or a constant) as unscaled value and scale, computed without the general path's
/// copies; the same result as [`arithmetic`]. None for anything else (NULLs, a result beyond
/// `DECIMAL(38)`, other operators and types), which the general path then evaluates.
#[inline]
fn decimal_operand(e: &Expr, row: &[Value]) -> Option<(i128, u8)> {
    let of = |v: &Value| match v {
        Value::Int(i) => Some((i128::from(*i), 0)),
        Value::Decimal(u, s) => Some((*u, *s)),
        _ => None,
    };
    match e {
        Expr::Lit(v) => of(v),
        Expr::Col(_) | Expr::Field(..) => of(e.place(row)?),
        Expr::Bin(
            op @ (BinOp::Add | BinOp::Sub | BinOp::Mul),
            a,
            b,
            SqlType::Decimal(_, scale),
        ) => {
            let (x, y) = (decimal_operand(a, row)?, decimal_operand(b, row)?);
            let u = decimal_arithmetic(*op, x, y, *scale).filter(|u| fits(*u, 38))?;
            Some((u, *scale))
        }
        // A cast that keeps or adds digits (one that drops some rounds: the general path).
        Expr::Cast(inner, SqlType::Decimal(precision, scale)) => {
            let (u, s) = decimal_operand(inner, row)?;
            let u =
                checked_rescale(u, s, *scale).filter(|u| fits(*u, *precision) && s <= *scale)?;
            Some((u, *scale))
        }
        _ => None,
    }
}

/// `a op b` without the general path's copies and checks, when both sides are integers (or
/// both timestamps, compared) read in place, constants, or such arithmetic: the same result
/// as [`binary`]. None for anything else (NULLs, a division by zero, other types), which
/// [`binary`] then evaluates.
#[inline]
fn integral(op: BinOp, a: &Expr, b: &Expr, ty: &SqlType, row: &[Value]) -> Option<Value> {
    let compared = |holds: fn(&i64, &i64) -> bool| {
        let (x, y) = (integral_operand(a, row)?, integral_operand(b, row)?);
        (x.1 == y.1).then(|| Value::Bool(holds(&x.0, &y.0)))
    };
    match op {
        BinOp::Eq => compared(i64::eq),
        BinOp::Ne => compared(i64::ne),
        BinOp::Lt => compared(i64::lt),
        BinOp::Le => compared(i64::le),
        BinOp::Gt => compared(i64::gt),
        BinOp::Ge => compared(i64::ge),
        _ if matches!(ty, SqlType::Int | SqlType::BigInt) => {
            integer_arithmetic(op, a, b, row).map(Value::Int)
        }
        _ => None,
    }
}

/// An integer (`false`) or timestamp (`true`) operand's value, without a copy.
#[inline]
fn integral_operand(e: &Expr, row: &[Value]) -> Option<(i64, bool)> {
    match e {
        Expr::Lit(Value::Int(v)) => Some((*v, false)),
        Expr::Lit(Value::Ts(v)) => Some((*v, true)),
        Expr::Col(_) | Expr::Field(..) => match e.place(row)? {
            Value::Int(v) => Some((*v, false)),
            Value::Ts(v) => Some((*v, true)),
            _ => None,
        },
        Expr::Bin(op, a, b, SqlType::Int | SqlType::BigInt) => {
            integer_arithmetic(*op, a, b, row).map(|v| (v, false))
        }
        _ => None,
    }
}

/// Integer `a op b` as [`arithmetic`] computes it (wrapping), when both sides are integers.
#[inline]
fn integer_arithmetic(op: BinOp, a: &Expr, b: &Expr, row: &[Value]) -> Option<i64> {
    let (x, y) = (integral_operand(a, row)?, integral_operand(b, row)?);
    if x.1 || y.1 {
        return None;
    }
    let (x, y) = (x.0, y.0);
    match op {
        BinOp::Add => Some(x.wrapping_add(y)),
        BinOp::Sub => Some(x.wrapping_sub(y)),
        BinOp::Mul => Some(x.wrapping_mul(y)),
        BinOp::Div if y != 0 => Some(x.wrapping_div(y)),
        BinOp::Mod if y != 0 => Some(x.wrapping_rem(y)),
        _ => None,
    }
}

fn binary(op: BinOp, a: &Expr, b: &Expr, ty: &SqlType, row: &[Value]) -> EvalResult {
    match op {
        BinOp::And => {
            let x = a.eval(row)?;
            if matches!(x, Value::Bool(false)) {
                return Ok(x);
            }
            let y = b.eval(row)?;
            return Ok(match (x, y) {
                (_, Value::Bool(false)) => Value::Bool(false),
                (Value::Bool(true), Value::Bool(true)) => Value::Bool(true),
                _ => Value::Null,
            });
        }
        BinOp::Or => {
            let x = a.eval(row)?;
            if matches!(x, Value::Bool(true)) {
                return Ok(x);
            }
            let y = b.eval(row)?;
            return Ok(match (x, y) {
                (_, Value::Bool(true)) => Value::Bool(true),
                (Value::Bool(false), Value::Bool(false)) => Value::Bool(false),
                _ => Value::Null,
            });
        }
        _ => {}
    }
    let holds: fn(Ordering) -> bool = match op {
        BinOp::Eq => |o| o == Ordering::Equal,
        BinOp::Ne => |o| o != Ordering::Equal,
        BinOp::Lt => |o| o == Ordering::Less,
        BinOp::Le => |o| o != Ordering::Greater,
        BinOp::Gt => |o| o == Ordering::Greater,
        BinOp::Ge => |o| o != Ordering::Less,
        _ => return computed(op, a, b, ty, row),
    };
    // A comparison reads columns and constants in place: no copy of a string per row.
    let (x, y) = (operand(a, row)?, operand(b, row)?);
    if x.is_null() || y.is_null() {
        return Ok(Value::Null);
    }
    Ok(Value::Bool(holds(x.compare(&y))))
}

/// `e`'s value: in place when it is a column, a field of one or a constant.
fn operand<'a>(e: &'a Expr, row: &'a [Value]) -> Result<std::borrow::Cow<'a, Value>, String> {
    use std::borrow::Cow;
    Ok(match e {
        Expr::Lit(v) => Cow::Borrowed(v),
        _ => match e.place(row) {
            Some(v) => Cow::Borrowed(v),
            None => Cow::Owned(e.eval(row)?),
        },
    })
}

/// `a op b` for an operator that is neither logical nor a comparison.
fn computed(op: BinOp, a: &Expr, b: &Expr, ty: &SqlType, row: &[Value]) -> EvalResult {
    let x = a.eval(row)?;
    let y = b.eval(row)?;
    if x.is_null() || y.is_null() {
        return Ok(Value::Null);
    }
    match op {
        BinOp::Concat => {
            let mut s = String::new();
            x.write_text(&mut s, "");
            y.write_text(&mut s, "");
            Ok(Value::Str(s.into()))
        }
        _ => arithmetic(op, x, y, ty),
    }
}

/// Arithmetic on non-null operands whose result has type `ty`.
pub fn arithmetic(op: BinOp, x: Value, y: Value, ty: &SqlType) -> EvalResult {
    use Value::*;
    Ok(match (ty, x, y) {
        // Time arithmetic: timestamp ± interval (ms).
        (SqlType::Timestamp { .. }, Ts(t), Int(ms))
        | (SqlType::Timestamp { .. }, Int(ms), Ts(t)) => match op {
            BinOp::Add => Ts(t + ms),
            _ => Ts(t - ms),
        },
        (SqlType::Double, x, y) => {
            let (a, b) = (x.as_f64().unwrap_or(0.0), y.as_f64().unwrap_or(0.0));
            Double(match op {
                BinOp::Add => a + b,
                BinOp::Sub => a - b,
                BinOp::Mul => a * b,
                BinOp::Div => a / b,
                _ => a % b,
            })
        }
        (SqlType::Decimal(_, scale), x, y) => {
            let (a, s) = as_decimal(&x);
            let (b, t) = as_decimal(&y);
            let scale = *scale;
            if matches!(op, BinOp::Div | BinOp::Mod) && b == 0 {
                return Err(match op {
                    BinOp::Mod => "division by zero (MOD)".into(),
                    _ => "division by zero".into(),
                });
            }
            // A result beyond DECIMAL(38) is NULL, as in Flink.
            decimal_arithmetic(op, (a, s), (b, t), scale)
                .filter(|u| fits(*u, 38))
                .map_or(Null, |u| Decimal(u, scale))
        }
        (_, Int(a), Int(b)) => Int(match op {
            BinOp::Add => a.wrapping_add(b),
            BinOp::Sub => a.wrapping_sub(b),
            BinOp::Mul => a.wrapping_mul(b),
            BinOp::Div if b == 0 => return Err("division by zero".into()),
            BinOp::Div => a.wrapping_div(b),
            _ if b == 0 => return Err("division by zero (MOD)".into()),
            _ => a.wrapping_rem(b),
        }),
        (_, x, y) => {
            return Err(format!("cannot apply {op:?} to {x:?} and {y:?}"));
        }
    })
}

/// `a op b` of two decimals (unscaled, scale) at `scale`; None when it overflows.
fn decimal_arithmetic(
    op: BinOp,
    (a, s): (i128, u8),
    (b, t): (i128, u8),
    scale: u8,
) -> Option<i128> {
    let at = |u: i128, from: u8| checked_rescale(u, from, scale);
    match op {
        BinOp::Add => at(a, s)?.checked_add(at(b, t)?),
        BinOp::Sub => at(a, s)?.checked_sub(at(b, t)?),
        BinOp::Mod => at(a, s)?.checked_rem(at(b, t)?),
        BinOp::Mul => checked_rescale(a.checked_mul(b)?, s + t, scale),
        _ => {
            // a/10^s ÷ b/10^t at `scale`, one digit more to round half up:
            // a·10^(scale+t-s+1) ÷ b.
            let exp = i32::from(scale) + i32::from(t) - i32::from(s) + 1;
            let num = if exp >= 0 {
                a.checked_mul(10i128.checked_pow(exp as u32)?)?
            } else {
                a / 10i128.checked_pow((-exp) as u32)?
            };
            let q = num / b;
            Some((q + q.signum() * 5) / 10)
        }
    }
}

/// `u` at scale `to` instead of `from` (truncating when it shrinks); None when it overflows.
fn checked_rescale(u: i128, from: u8, to: u8) -> Option<i128> {
    if to >= from {
        u.checked_mul(pow10(to - from)?)
    } else {
        Some(u / pow10(from - to)?)
    }
}

/// The powers of ten an `i128` holds: 10^0 to 10^38.
const POW10: [i128; 39] = {
    let mut t = [1i128; 39];
    let mut i = 1;
    while i < t.len() {
        t[i] = t[i - 1] * 10;
        i += 1;
    }
    t
};

/// 10^n, if an `i128` holds it (a table: no multiplications per value).
#[inline]
fn pow10(n: u8) -> Option<i128> {
    POW10.get(usize::from(n)).copied()
}

/// Whether unscaled `u` has at most `precision` digits.
fn fits(u: i128, precision: u8) -> bool {
    match pow10(precision) {
        Some(limit) => u.unsigned_abs() < limit.unsigned_abs(),
        None => match 10u128.checked_pow(u32::from(precision)) {
            Some(limit) => u.unsigned_abs() < limit,
            None => true,
        },
    }
}

fn as_decimal(v: &Value) -> (i128, u8) {
    match v {
        Value::Decimal(u, s) => (*u, *s),
        Value::Int(i) => (i128::from(*i), 0),
        Value::Double(d) => ((d * 1e6).round() as i128, 6),
        _ => (0, 0),
    }
}

/// Converts `v` to `ty` (Flink's `CAST`).
pub fn cast(v: Value, ty: &SqlType) -> EvalResult {
    use Value::*;
    if v.is_null() {
        return Ok(Null);
    }
    let fail = |v: &Value| Err(format!("cannot cast {v:?} to {ty}"));
    Ok(match ty {
        SqlType::String => match v {
            Str(_) => v,
            other => {
                let mut s = String::new();
                other.write_text(&mut s, "");
                Str(s.into())
            }
        },
        SqlType::Int | SqlType::BigInt => {
            let n = match &v {
                Int(i) | Ts(i) => *i,
                Double(d) => d.trunc() as i64,
                Decimal(u, s) => (rescale(*u, *s, 0)) as i64,
                Bool(b) => i64::from(*b),
                Str(s) => match s.trim().parse::<i64>() {
                    Ok(n) => n,
                    Err(_) => return Ok(Null),
                },
                _ => return fail(&v),
            };
            Int(if *ty == SqlType::Int {
                i64::from(n as i32)
            } else {
                n
            })
        }
        SqlType::Double => match &v {
            Str(s) => match s.trim().parse::<f64>() {
                Ok(d) => Double(d),
                Err(_) => Null,
            },
            other => match other.as_f64() {
                Some(d) => Double(d),
                None => return fail(&v),
            },
        },
        SqlType::Decimal(precision, scale) => {
            let unscaled = match &v {
                Decimal(u, s) => {
                    if s > scale {
                        let p = 10i128.pow(u32::from(s - scale));
                        let q = *u / p;
                        let r = *u % p;
                        Some(q + if r.abs() * 2 >= p { r.signum() } else { 0 })
                    } else {
                        checked_rescale(*u, *s, *scale)
                    }
                }
                Int(i) => checked_rescale(i128::from(*i), 0, *scale),
                Double(d) => {
                    let x = (d * 10f64.powi(i32::from(*scale))).round();
                    // Beyond i128 (or NaN): an overflow.
                    (x.is_finite() && x.abs() < 1e38).then_some(x as i128)
                }
                Str(s) => match parse_decimal(s) {
                    Some((u, s)) => return cast(Decimal(u, s), ty),
                    None => None,
                },
                _ => return fail(&v),
            };
            // A value with more digits than the type's precision is NULL, as in Flink.
            unscaled
                .filter(|u| fits(*u, *precision))
                .map_or(Null, |u| Decimal(u, *scale))
        }
        SqlType::Boolean => match &v {
            Bool(_) => v,
            Str(s) => match s.trim().to_ascii_lowercase().as_str() {
                "true" => Bool(true),
                "false" => Bool(false),
                _ => Null,
            },
            Int(i) => Bool(*i != 0),
            _ => return fail(&v),
        },
        SqlType::Timestamp { .. } => match &v {
            Ts(_) => v,
            Str(s) => parse_timestamp(s).map(Ts).unwrap_or(Null),
            _ => return fail(&v),
        },
        _ => v,
    })
}

fn str_arg(args: &[Expr], i: usize, row: &[Value]) -> Result<Option<CompactString>, String> {
    Ok(match args.get(i).map(|a| a.eval(row)).transpose()? {
        Some(Value::Str(s)) => Some(s),
        Some(Value::Null) | None => None,
        Some(other) => {
            let mut s = String::new();
            other.write_text(&mut s, "");
            Some(s.into())
        }
    })
}

fn int_arg(args: &[Expr], i: usize, row: &[Value]) -> Result<Option<i64>, String> {
    Ok(match args.get(i).map(|a| a.eval(row)).transpose()? {
        Some(v) => v.as_i64(),
        None => None,
    })
}

fn call(f: &Func, args: &[Expr], row: &[Value]) -> EvalResult {
    use Value::*;
    let arg = |i: usize| args[i].eval(row);
    Ok(match f {
        Func::Coalesce => {
            for a in args {
                let v = a.eval(row)?;
                if !v.is_null() {
                    return Ok(v);
                }
            }
            Null
        }
        Func::NullIf => {
            let a = arg(0)?;
            if a.compare(&arg(1)?) == Ordering::Equal {
                Null
            } else {
                a
            }
        }
        Func::If => {
            if args[0].test(row)? {
                arg(1)?
            } else {
                arg(2)?
            }
        }
        Func::Greatest | Func::Least => {
            let mut best: Option<Value> = None;
            for a in args {
                let v = a.eval(row)?;
                if v.is_null() {
                    return Ok(Null);
                }
                let better = match &best {
                    None => true,
                    Some(b) => {
                        let o = v.compare(b);
                        if matches!(f, Func::Greatest) {
                            o == Ordering::Greater
                        } else {
                            o == Ordering::Less
                        }
                    }
                };
                if better {
                    best = Some(v);
                }
            }
            best.unwrap_or(Null)
        }
        Func::Now => Ts(now_ms()),
        Func::Abs => match arg(0)? {
            Int(i) => Int(i.wrapping_abs()),
            Double(d) => Double(d.abs()),
            Decimal(u, s) => Decimal(u.abs(), s),
            _ => Null,
        },
        Func::Floor | Func::Ceil => match arg(0)? {
            Double(d) => Double(if matches!(f, Func::Floor) {
                d.floor()
            } else {
                d.ceil()
            }),
            Decimal(u, s) => {
                let p = 10i128.pow(u32::from(s));
                let q = if matches!(f, Func::Floor) {
                    u.div_euclid(p)
                } else {
                    -(-u).div_euclid(p)
                };
                Decimal(q * p, s)
            }
            other => other,
        },
        Func::Round => {
            let digits = int_arg(args, 1, row)?.unwrap_or(0).clamp(0, 18) as u8;
            match arg(0)? {
                Double(d) => {
                    let p = 10f64.powi(i32::from(digits));
                    Double((d * p).round() / p)
                }
                v @ Decimal(..) => cast(v, &SqlType::Decimal(38, digits))?,
                other => other,
            }
        }
        Func::Power => match (arg(0)?.as_f64(), arg(1)?.as_f64()) {
            (Some(a), Some(b)) => Double(a.powf(b)),
            _ => Null,
        },
        Func::Sqrt => match arg(0)?.as_f64() {
            Some(a) => Double(a.sqrt()),
            None => Null,
        },
        Func::Upper | Func::Lower | Func::Trim | Func::CharLength => {
            let Some(s) = str_arg(args, 0, row)? else {
                return Ok(Null);
            };
            match f {
                Func::Upper => Str(s.to_uppercase()),
                Func::Lower => Str(s.to_lowercase()),
                Func::Trim => Str(s.trim().into()),
                _ => Int(s.chars().count() as i64),
            }
        }
        Func::Substring => {
            let Some(s) = str_arg(args, 0, row)? else {
                return Ok(Null);
            };
            let Some(start) = int_arg(args, 1, row)? else {
                return Ok(Null);
            };
            let len = int_arg(args, 2, row)?;
            let chars: Vec<char> = s.chars().collect();
            // SQL positions are 1-based; a start below 1 eats into the length.
            let from = (start - 1).max(0) as usize;
            let end = match len {
                Some(l) => ((start - 1 + l).max(0) as usize).min(chars.len()),
                None => chars.len(),
            };
            Str(chars
                .get(from..end.max(from))
                .unwrap_or(&[])
                .iter()
                .collect::<String>()
                .into())
        }
        Func::Concat => {
            let mut out = String::new();
            for a in args {
                let v = a.eval(row)?;
                if v.is_null() {
                    return Ok(Null);
                }
                v.write_text(&mut out, "");
            }
            Str(out.into())
        }
        Func::Replace => {
            let (Some(s), Some(from), Some(to)) = (
                str_arg(args, 0, row)?,
                str_arg(args, 1, row)?,
                str_arg(args, 2, row)?,
            ) else {
                return Ok(Null);
            };
            Str(s.replace(from.as_str(), &to).into())
        }
        Func::Position => {
            let (Some(needle), Some(hay)) = (str_arg(args, 0, row)?, str_arg(args, 1, row)?) else {
                return Ok(Null);
            };
            Int(hay
                .find(needle.as_str())
                .map_or(0, |b| hay[..b].chars().count() as i64 + 1))
        }
        Func::SplitIndex => {
            let (Some(s), Some(sep), Some(i)) = (
                str_arg(args, 0, row)?,
                str_arg(args, 1, row)?,
                int_arg(args, 2, row)?,
            ) else {
                return Ok(Null);
            };
            if i < 0 || sep.is_empty() {
                return Ok(Null);
            }
            s.split(sep.as_str())
                .nth(i as usize)
                .map_or(Null, |p| Str(p.into()))
        }
        Func::RegexpExtract(re) => {
            let Some(s) = str_arg(args, 0, row)? else {
                return Ok(Null);
            };
            let group = int_arg(args, 2, row)?.unwrap_or(1).max(0) as usize;
            re.captures(&s)
                .and_then(|c| c.get(group))
                .map_or(Null, |m| Str(m.as_str().into()))
        }
        Func::Regexp(re) => match str_arg(args, 0, row)? {
            Some(s) => Bool(re.is_match(&s)),
            None => Null,
        },
        Func::DateFormat => {
            let (Some(ms), Some(pattern)) = (arg(0)?.as_i64(), str_arg(args, 1, row)?) else {
                return Ok(Null);
            };
            Str(date_format(ms, &pattern).into())
        }
        Func::Extract(unit) => match arg(0)?.as_i64() {
            Some(ms) => {
                let (y, mo, d, h, mi, s, _) = timestamp_parts(ms);
                Int(match unit {
                    TimeUnit::Year => y,
                    TimeUnit::Month => i64::from(mo),
                    TimeUnit::Day => i64::from(d),
                    TimeUnit::Hour => i64::from(h),
                    TimeUnit::Minute => i64::from(mi),
                    TimeUnit::Second => i64::from(s),
                })
            }
            None => Null,
        },
        Func::ToTimestamp => match str_arg(args, 0, row)? {
            Some(s) => parse_timestamp(&s).map_or(Null, Ts),
            None => Null,
        },
        Func::ToTimestampLtz => match arg(0)?.as_i64() {
            Some(n) => {
                let precision = int_arg(args, 1, row)?.unwrap_or(3);
                Ts(if precision == 0 { n * 1000 } else { n })
            }
            None => Null,
        },
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Formats `ms` with Java's date pattern letters (`yyyy-MM-dd HH:mm:ss.SSS`); other
/// characters are copied, text in single quotes literally.
pub fn date_format(ms: i64, pattern: &str) -> String {
    use std::fmt::Write as _;
    let (y, mo, d, h, mi, s, milli) = timestamp_parts(ms);
    let mut out = String::with_capacity(pattern.len() + 4);
    let chars: Vec<char> = pattern.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '\'' {
            i += 1;
            while i < chars.len() && chars[i] != '\'' {
                out.push(chars[i]);
                i += 1;
            }
            i += 1;
            continue;
        }
        let mut n = 1;
        while i + n < chars.len() && chars[i + n] == c {
            n += 1;
        }
        let value = match c {
            'y' => Some(if n == 2 { y.rem_euclid(100) } else { y }),
            'M' => Some(i64::from(mo)),
            'd' => Some(i64::from(d)),
            'H' => Some(i64::from(h)),
            'm' => Some(i64::from(mi)),
            's' => Some(i64::from(s)),
            'S' => Some(i64::from(milli)),
            _ => None,
        };
        match value {
            Some(v) => {
                let _ = write!(out, "{v:0n$}");
            }
            None => (0..n).for_each(|_| out.push(c)),
        }
        i += n;
    }
    out
}

/// A `LIKE` pattern: `%` any run, `_` one character.
#[derive(Debug)]
pub struct LikePattern(Vec<LikePart>);

#[derive(Debug)]
enum LikePart {
    Text(String),
    One,
    Any,
}

impl LikePattern {
    /// Compiles a pattern (`\` escapes the next character).
    pub fn new(pattern: &str) -> LikePattern {
        let mut parts = Vec::new();
        let mut text = String::new();
        let mut chars = pattern.chars();
        while let Some(c) = chars.next() {
            match c {
                '%' | '_' => {
                    if !text.is_empty() {
                        parts.push(LikePart::Text(std::mem::take(&mut text)));
                    }
                    parts.push(if c == '%' {
                        LikePart::Any
                    } else {
                        LikePart::One
                    });
                }
                '\\' => text.extend(chars.next()),
                c => text.push(c),
            }
        }
        if !text.is_empty() {
            parts.push(LikePart::Text(text));
        }
        LikePattern(parts)
    }

    /// Whether `s` matches.
    pub fn matches(&self, s: &str) -> bool {
        fn go(parts: &[LikePart], s: &str) -> bool {
            match parts.split_first() {
                None => s.is_empty(),
                Some((LikePart::Text(t), rest)) => {
                    s.strip_prefix(t.as_str()).is_some_and(|r| go(rest, r))
                }
                Some((LikePart::One, rest)) => {
                    let mut c = s.chars();
                    c.next().is_some() && go(rest, c.as_str())
                }
                Some((LikePart::Any, rest)) => s
                    .char_indices()
                    .map(|(i, _)| i)
                    .chain([s.len()])
                    .any(|i| go(rest, &s[i..])),
            }
        }
        go(&self.0, s)
    }
}

impl std::fmt::Display for BinOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Mod => "%",
            BinOp::Eq => "=",
            BinOp::Ne => "<>",
            BinOp::Lt => "<",
            BinOp::Le => "<=",
            BinOp::Gt => ">",
            BinOp::Ge => ">=",
            BinOp::And => "AND",
            BinOp::Or => "OR",
            BinOp::Concat => "||",
        })
    }
}

/// `v` as text (for `CAST(… AS STRING)` of constants in messages).
pub fn text(v: &Value) -> CompactString {
    let mut s = String::new();
    v.write_text(&mut s, "NULL");
    s.to_compact_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn folding_evaluates_what_reads_no_row_and_keeps_the_rest() {
        let eq =
            |a: Expr, b: Expr| Expr::Bin(BinOp::Eq, Box::new(a), Box::new(b), SqlType::Boolean);
        let field = |k| Expr::Field(Box::new(Expr::Col(3)), k);
        // The nexmark table's dateTime with its event type known to be 2 (a bid).
        let time = Expr::Case(
            vec![
                (eq(Expr::Col(0), Expr::Lit(Value::Int(0))), field(1)),
                (eq(Expr::Col(0), Expr::Lit(Value::Int(1))), field(2)),
            ],
            Box::new(field(5)),
        );
        let bid = time.replacing_col(0, &Expr::Lit(Value::Int(2))).folded();
        assert!(
            matches!(&bid, Expr::Field(c, 5) if matches!(**c, Expr::Col(3))),
            "{bid:?}"
        );
        let person = time.replacing_col(0, &Expr::Lit(Value::Int(0))).folded();
        assert!(matches!(&person, Expr::Field(_, 1)), "{person:?}");
        // Unknown, it stays a CASE; a division by zero stays for the row to raise.
        assert!(matches!(time.clone().folded(), Expr::Case(..)));
        let div = Expr::Bin(
            BinOp::Div,
            Box::new(Expr::Lit(Value::Int(1))),
            Box::new(Expr::Lit(Value::Int(0))),
            SqlType::Int,
        );
        assert!(matches!(div.clone().folded(), Expr::Bin(..)));
        assert!(div.folded().eval(&[]).is_err());
    }

    #[test]
    fn like_patterns_match_as_sql_says() {
        let p = LikePattern::new("a%c_");
        assert!(p.matches("abcd"));
        assert!(p.matches("acx"));
        assert!(!p.matches("abc"));
        assert!(LikePattern::new("%").matches(""));
    }

    #[test]
    fn dates_format_with_java_letters() {
        assert_eq!(
            date_format(1_436_918_400_123, "yyyy-MM-dd HH:mm:ss.SSS"),
            "2015-07-15 00:00:00.123"
        );
        assert_eq!(
            date_format(1_436_918_400_000, "yyyy-MM-dd'T'HH"),
            "2015-07-15T00"
        );
    }

    #[test]
    fn a_decimal_beyond_its_precision_is_null() {
        let d = |p, s| SqlType::Decimal(p, s);
        assert_eq!(
            cast(Value::Decimal(123_456, 2), &d(4, 2)).unwrap(),
            Value::Null
        );
        assert_eq!(
            cast(Value::Decimal(123_456, 2), &d(6, 2)).unwrap(),
            Value::Decimal(123_456, 2)
        );
        assert_eq!(cast(Value::Int(100), &d(3, 1)).unwrap(), Value::Null);
        assert_eq!(
            cast(Value::Double(f64::NAN), &d(10, 2)).unwrap(),
            Value::Null
        );
        assert_eq!(cast(Value::Double(1e40), &d(38, 0)).unwrap(), Value::Null);
        let big = Value::Decimal(10i128.pow(37), 0);
        let ty = d(38, 0);
        assert_eq!(
            arithmetic(BinOp::Mul, big.clone(), big.clone(), &ty).unwrap(),
            Value::Null
        );
        assert_eq!(
            arithmetic(BinOp::Add, big.clone(), Value::Int(1), &ty).unwrap(),
            Value::Decimal(10i128.pow(37) + 1, 0)
        );
        assert_eq!(
            arithmetic(BinOp::Mul, big, Value::Int(10), &ty).unwrap(),
            Value::Null
        );
    }

    #[test]
    fn the_fast_paths_agree_with_the_general_one() {
        let values = [
            Value::Null,
            Value::Int(-7),
            Value::Int(123),
            Value::Int(i64::MAX),
            Value::Decimal(908, 3),
            Value::Decimal(-15, 1),
            Value::Decimal(i128::MAX / 10, 2),
            Value::Double(2.5),
            Value::Ts(123),
            Value::Bool(true),
            Value::Bool(false),
        ];
        let row: Vec<Value> = values.to_vec();
        let operands: Vec<Expr> = (0..row.len())
            .map(Expr::Col)
            .chain(values.iter().cloned().map(Expr::Lit))
            .collect();
        let types = [
            SqlType::Boolean,
            SqlType::BigInt,
            SqlType::Decimal(38, 3),
            SqlType::Decimal(10, 0),
        ];
        use BinOp::*;
        for op in [Add, Sub, Mul, Eq, Ne, Lt, Le, Gt, Ge, And, Or] {
            for a in &operands {
                for b in &operands {
                    for ty in &types {
                        let e = Expr::Bin(op, Box::new(a.clone()), Box::new(b.clone()), ty.clone());
                        let general = binary(op, a, b, ty, &row);
                        let fast = e.eval(&row);
                        match (&general, &fast) {
                            // A type the binder never lets through may fail either way.
                            (Err(_), Err(_)) => {}
                            _ => assert_eq!(fast, general, "{e:?}"),
                        }
                        if let Ok(v) = general {
                            if matches!(v, Value::Bool(_) | Value::Null) {
                                assert_eq!(e.truth(&row), Ok(as_truth(v)), "{e:?}");
                            }
                        }
                        let cast = Expr::Cast(Box::new(e.clone()), SqlType::Decimal(23, 3));
                        if let Ok(v) = e.eval(&row) {
                            assert_eq!(cast.eval(&row), super::cast(v, &SqlType::Decimal(23, 3)));
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn the_table_of_powers_of_ten_is_checked_pow() {
        for n in 0..=45u8 {
            assert_eq!(pow10(n), 10i128.checked_pow(u32::from(n)), "10^{n}");
        }
    }

    #[test]
    fn decimal_arithmetic_keeps_scale_and_rounds_half_up() {
        let ty = SqlType::Decimal(38, 3);
        let v = arithmetic(BinOp::Mul, Value::Decimal(908, 3), Value::Int(1234), &ty).unwrap();
        assert_eq!(v, Value::Decimal(1_120_472, 3));
        let ty = SqlType::Decimal(38, 6);
        let v = arithmetic(BinOp::Div, Value::Int(2), Value::Int(3), &ty).unwrap();
        assert_eq!(v, Value::Decimal(666_667, 6));
        assert!(arithmetic(BinOp::Div, Value::Int(2), Value::Int(0), &SqlType::BigInt).is_err());
    }
}
