//! Binding and planning: a query's names resolved against the catalog, its expressions typed
//! and compiled, and the query turned into a tree of relations ([`Rel`]) that
//! [`build`](super::build) makes into operators.

use std::collections::BTreeMap;
use std::sync::Arc;

use sqlparser::ast::{self, Spanned};
use sqlparser::tokenizer::Location;

use super::agg::{result_type, AggCall, AggKind};
use super::expr::{BinOp, Expr, Func, LikePattern, TimeUnit};
use super::parse::{parse_type_text, ColumnDef, TableDef, TABLE_ARG};
use super::rank;
use super::types::{parse_decimal, SqlType, Value};
use super::{did_you_mean, SqlError};

/// Whether a column is a time attribute.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Time {
    /// A plain column.
    None,
    /// The event time (`WATERMARK FOR` it, or a window's `window_time`).
    Rowtime,
    /// Processing time (`PROCTIME()`).
    Proctime,
    /// The end of an event-time window (a window aggregation's `window_end`, and the columns
    /// and keys that carry it on): every row with a value `v` here arrives before the watermark
    /// passes `v - 1`, so state kept for `v` can go then. Otherwise a plain column.
    WindowEnd,
}

/// A column of a relation.
#[derive(Debug, Clone)]
pub struct Column {
    /// Its name.
    pub name: String,
    /// The table or alias it can be qualified with.
    pub qualifier: Option<String>,
    /// Its type.
    pub ty: SqlType,
    /// Whether it is a time attribute.
    pub time: Time,
}

/// A table of the catalog: its definition and what binding it made of it.
#[derive(Debug)]
pub struct Table {
    /// The `CREATE TABLE` statement.
    pub def: TableDef,
    /// Physical then computed columns.
    pub columns: Vec<Column>,
    /// How many of the columns are physical (the connector produces those).
    pub physical: usize,
    /// The computed columns' expressions over the physical columns, in order.
    pub computed: Vec<Expr>,
    /// The event-time column and the watermark's delay in ms.
    pub rowtime: Option<(usize, i64)>,
}

/// A window table-valued function.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WindowKind {
    /// `TUMBLE(…, size[, offset])`.
    Tumble { size: i64, offset: i64 },
    /// `HOP(…, slide, size[, offset])`.
    Hop { slide: i64, size: i64, offset: i64 },
    /// `CUMULATE(…, step, max size[, offset])`.
    Cumulate { step: i64, size: i64, offset: i64 },
    /// `SESSION(… PARTITION BY keys, …, gap)`.
    Session { gap: i64 },
}

/// A relation: an operator tree, its columns, and whether its rows are a changelog.
#[derive(Debug, Clone)]
pub struct Rel {
    /// The operator.
    pub node: Node,
    /// Its output columns.
    pub columns: Vec<Column>,
    /// Whether its rows update earlier ones (-U/+U/-D) rather than only append.
    pub updating: bool,
}

/// The operators of a plan.
#[derive(Debug, Clone)]
pub enum Node {
    /// Reads a table through its connector.
    Scan(Arc<Table>),
    /// Filters and projects row by row.
    Calc {
        input: Box<Rel>,
        filter: Option<Expr>,
        project: Vec<Expr>,
    },
    /// `UNION ALL`.
    Union(Vec<Rel>),
    /// A window aggregation. Its input's columns are the keys, then the aggregates'
    /// arguments, then (event-time windows) the time column last.
    WindowAgg {
        input: Box<Rel>,
        window: WindowKind,
        proctime: bool,
        keys: usize,
        aggs: Vec<AggCall>,
    },
    /// An aggregation by `GROUP BY` without a window TVF: input columns are the keys, then
    /// the aggregates' arguments. Its results update (a changelog), except over an
    /// append-only input grouped by a window's end (an aggregation of a window
    /// aggregation's results, as Flink cascades them): one final row per group once the
    /// watermark passes the window, see [`final_at_window_end`].
    GroupAgg {
        input: Box<Rel>,
        keys: usize,
        aggs: Vec<AggCall>,
    },
    /// A regular join on equal columns (`keys`: a column of the left input and one of the
    /// right): its columns are the left's, then the right's. Empty keys (no equality between
    /// the two sides found yet) is a cross join, which is not built. An outer join's
    /// `condition` is the rest of its `ON` (over the joined columns): rows that meet the keys
    /// but not it do not join.
    Join {
        left: Box<Rel>,
        right: Box<Rel>,
        keys: Vec<(usize, usize)>,
        kind: JoinKind,
        condition: Option<Expr>,
        /// The bounds its conditions put on the two sides' event times, if they do (an
        /// interval join): rows are kept only while they can still join.
        bounds: Option<TimeBounds>,
    },
    /// `ROW_NUMBER()` (or `RANK()`, `DENSE_RANK()`: `kind`) `OVER (PARTITION BY partition
    /// ORDER BY order)` kept to the ranks `range` (1-based, inclusive; `None` until a filter
    /// of the enclosing query bounds it): its columns are the input's, then the rank.
    Rank {
        input: Box<Rel>,
        kind: super::rank::RankKind,
        partition: Vec<usize>,
        /// Sort columns, each with whether it is descending.
        order: Vec<(usize, bool)>,
        range: Option<(u64, u64)>,
        at: Location,
    },
}

/// An interval join's bounds: a left row with event time `l` (column `left` of the left
/// input) joins only right rows whose event time `r` (column `right`) has `l - r` within
/// `lower..=upper` ms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeBounds {
    pub left: usize,
    pub right: usize,
    pub lower: i64,
    pub upper: i64,
}

/// The bounds conditions over a join's columns (`parts`, conjuncts) put on the event times of
/// its `left` and `right` inputs: comparisons of a left and a right time attribute, each plus
/// or minus an interval, that bound the difference from below and from above.
fn time_bounds(parts: &[Expr], left: &Rel, right: &Rel) -> Option<TimeBounds> {
    let split = left.columns.len();
    // A time column plus a constant (ms).
    let shifted = |e: &Expr| -> Option<(usize, i64)> {
        let lit = |e: &Expr| match e {
            Expr::Lit(Value::Int(k)) => Some(*k),
            _ => None,
        };
        match e {
            Expr::Col(i) => Some((*i, 0)),
            Expr::Bin(BinOp::Add, a, b, _) => match (a.as_col(), b.as_col()) {
                (Some(i), None) => Some((i, lit(b)?)),
                (None, Some(i)) => Some((i, lit(a)?)),
                _ => None,
            },
            Expr::Bin(BinOp::Sub, a, b, _) => Some((a.as_col()?, lit(b)?.checked_neg()?)),
            _ => None,
        }
    };
    let is_time = |i: usize| {
        let c = if i < split {
            &left.columns[i]
        } else {
            &right.columns[i - split]
        };
        // A window's end bounds its rows as event time does (they all come before the
        // watermark passes it), a little later, which only keeps rows a little longer.
        matches!(c.time, Time::Rowtime | Time::WindowEnd)
    };
    let (mut columns, mut lower, mut upper) = (None, None::<i64>, None::<i64>);
    for c in parts {
        let Expr::Bin(op, x, y, _) = c else { continue };
        let (Some((a, da)), Some((b, db))) = (shifted(x), shifted(y)) else {
            continue;
        };
        if !is_time(a) || !is_time(b) {
            continue;
        }
        // As a bound on `left - right`: `l + da op r + db` is `l - r op db - da`.
        let (pair, op, k) = match (a < split, b < split) {
            (true, false) => ((a, b - split), *op, db - da),
            (false, true) => {
                let flipped = match op {
                    BinOp::Lt => BinOp::Gt,
                    BinOp::Le => BinOp::Ge,
                    BinOp::Gt => BinOp::Lt,
                    BinOp::Ge => BinOp::Le,
                    other => *other,
                };
                ((b, a - split), flipped, da - db)
            }
            _ => continue,
        };
        if columns.is_some_and(|c| c != pair) {
            continue;
        }
        let (low, high) = match op {
            BinOp::Ge => (Some(k), None),
            BinOp::Gt => (Some(k + 1), None),
            BinOp::Le => (None, Some(k)),
            BinOp::Lt => (None, Some(k - 1)),
            BinOp::Eq => (Some(k), Some(k)),
            _ => continue,
        };
        columns = Some(pair);
        lower = low.map_or(lower, |v| Some(lower.map_or(v, |l| l.max(v))));
        upper = high.map_or(upper, |v| Some(upper.map_or(v, |u| u.min(v))));
    }
    let (left, right) = columns?;
    Some(TimeBounds {
        left,
        right,
        lower: lower?,
        upper: upper?,
    })
}

/// Which rows of a join's inputs appear without a match (padded with NULLs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinKind {
    /// Only matched rows.
    Inner,
    /// Every left row.
    Left,
    /// Every right row.
    Right,
    /// Every row of both.
    Full,
}

impl JoinKind {
    /// Whether the unmatched rows of the left (0) and the right (1) input appear.
    pub fn preserves(self) -> [bool; 2] {
        match self {
            JoinKind::Inner => [false, false],
            JoinKind::Left => [true, false],
            JoinKind::Right => [false, true],
            JoinKind::Full => [true, true],
        }
    }
}

/// Tables and views by name.
#[derive(Default, Clone)]
pub struct Catalog {
    /// The tables.
    pub tables: BTreeMap<String, Arc<Table>>,
    /// The views' queries.
    pub views: BTreeMap<String, Box<ast::Query>>,
    /// The queries of the `WITH` clauses around the query being planned, planned where they
    /// stand; they hide tables and views of the same names.
    with: BTreeMap<String, Rel>,
}

type Result<T> = std::result::Result<T, SqlError>;

fn err<T>(at: Location, message: impl Into<String>) -> Result<T> {
    Err(SqlError::at(at, message))
}

fn unsupported<T>(at: Location, what: &str) -> Result<T> {
    err(at, format!("{what} is not supported"))
}

impl Catalog {
    /// Adds a table, checking its columns, computed columns and watermark.
    pub fn add_table(&mut self, def: TableDef) -> Result<()> {
        if self.tables.contains_key(&def.name) || self.views.contains_key(&def.name) {
            return err(def.at, format!("table '{}' is defined twice", def.name));
        }
        let mut columns: Vec<Column> = Vec::new();
        for c in &def.columns {
            if columns.iter().any(|x| x.name == c.name()) {
                return err(
                    def.at,
                    format!(
                        "column '{}' is defined twice in table '{}'",
                        c.name(),
                        def.name
                    ),
                );
            }
            if let ColumnDef::Physical(name, ty) = c {
                columns.push(Column {
                    name: name.clone(),
                    qualifier: Some(def.name.clone()),
                    ty: ty.clone(),
                    time: Time::None,
                });
            }
        }
        let physical = columns.len();
        let mut computed = Vec::new();
        for c in &def.columns {
            if let ColumnDef::Computed(name, e) = c {
                // A computed column sees the physical columns.
                let scope = Scope::new(&columns[..physical]);
                let (expr, ty) = bind_expr(e, &scope)?;
                let time = if matches!(expr, Expr::Call(Func::Now, _)) {
                    Time::Proctime
                } else {
                    Time::None
                };
                computed.push(expr);
                columns.push(Column {
                    name: name.clone(),
                    qualifier: Some(def.name.clone()),
                    ty,
                    time,
                });
            }
        }
        let mut rowtime = None;
        if let Some((col, e)) = &def.watermark {
            let Some(i) = columns.iter().position(|c| &c.name == col) else {
                let names = columns.iter().map(|c| c.name.as_str());
                return err(
                    def.at,
                    format!(
                        "the watermark's column '{col}' is not a column of '{}'{}",
                        def.name,
                        did_you_mean(col, names)
                    ),
                );
            };
            if !matches!(columns[i].ty, SqlType::Timestamp { .. }) {
                return err(def.at, format!("the watermark's column '{col}' must be a TIMESTAMP(3) or TIMESTAMP_LTZ(3), not {}", columns[i].ty));
            }
            let delay = watermark_delay(e, col).ok_or_else(|| {
                SqlError::at(e.span().start, format!("the watermark must be '{col}' or '{col} - INTERVAL …' (a bounded out-of-orderness)"))
            })?;
            columns[i].time = Time::Rowtime;
            rowtime = Some((i, delay));
        }
        let name = def.name.clone();
        self.tables.insert(
            name,
            Arc::new(Table {
                def,
                columns,
                physical,
                computed,
                rowtime,
            }),
        );
        Ok(())
    }
}

/// `col` (delay 0) or `col - INTERVAL '…' unit`.
fn watermark_delay(e: &ast::Expr, col: &str) -> Option<i64> {
    match e {
        ast::Expr::Identifier(id) if id.value == col => Some(0),
        ast::Expr::Nested(inner) => watermark_delay(inner, col),
        ast::Expr::BinaryOp {
            left,
            op: ast::BinaryOperator::Minus,
            right,
        } => {
            let base = watermark_delay(left, col)?;
            match &**right {
                ast::Expr::Interval(i) => interval_ms(i).ok().map(|ms| base + ms),
                _ => None,
            }
        }
        _ => None,
    }
}

/// An interval literal in ms.
pub fn interval_ms(i: &ast::Interval) -> Result<i64> {
    let at = i.value.span().start;
    let text = match &*i.value {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::SingleQuotedString(s) | ast::Value::Number(s, _) => s.clone(),
            _ => return err(at, "an interval's value must be a quoted number"),
        },
        _ => return err(at, "an interval's value must be a quoted number"),
    };
    let n: f64 = text
        .trim()
        .parse()
        .map_err(|_| SqlError::at(at, format!("'{text}' is not an interval length")))?;
    use ast::DateTimeField as F;
    let unit = match &i.leading_field {
        Some(F::Millisecond | F::Milliseconds) => 1.0,
        Some(F::Second | F::Seconds) | None => 1000.0,
        Some(F::Minute | F::Minutes) => 60_000.0,
        Some(F::Hour | F::Hours) => 3_600_000.0,
        Some(F::Day | F::Days) => 86_400_000.0,
        Some(other) => {
            return err(
                at,
                format!(
                "interval unit {other} is not supported (MILLISECOND, SECOND, MINUTE, HOUR, DAY)"
            ),
            )
        }
    };
    Ok((n * unit).round() as i64)
}

/// The columns an expression may name.
pub struct Scope<'a> {
    columns: &'a [Column],
    /// In an aggregation's select list: group expressions and aggregates by their text, and
    /// the columns they became.
    grouped: Option<&'a Grouped>,
}

/// What an aggregation's select list may name.
#[derive(Default)]
pub struct Grouped {
    /// Group expressions (and window columns) by their text: output column.
    keys: Vec<(String, usize)>,
    /// Aggregate calls by their text: output column.
    aggs: Vec<(String, usize)>,
}

impl<'a> Scope<'a> {
    /// A scope of `columns`.
    pub fn new(columns: &'a [Column]) -> Scope<'a> {
        Scope {
            columns,
            grouped: None,
        }
    }

    fn resolve(&self, parts: &[ast::Ident]) -> Result<(Expr, SqlType, Time)> {
        let at = parts[0].span.start;
        let names: Vec<&str> = parts.iter().map(|p| p.value.as_str()).collect();
        // `q.col`, or `col.field…`.
        let (col, rest) = if parts.len() >= 2 {
            match self
                .columns
                .iter()
                .position(|c| c.qualifier.as_deref() == Some(names[0]) && c.name == names[1])
            {
                Some(i) => (Some(i), &names[2..]),
                None => (self.find(names[0], at)?, &names[1..]),
            }
        } else {
            (self.find(names[0], at)?, &names[1..])
        };
        let Some(i) = col else {
            let candidates = self.columns.iter().map(|c| c.name.as_str());
            let full = names.join(".");
            return err(
                at,
                format!(
                    "column '{full}' not found{}",
                    did_you_mean(names[parts.len() - 1], candidates)
                ),
            );
        };
        let mut expr = Expr::Col(i);
        let mut ty = self.columns[i].ty.clone();
        let time = if rest.is_empty() {
            self.columns[i].time
        } else {
            Time::None
        };
        for field in rest {
            let SqlType::Row(fields) = &ty else {
                return err(
                    at,
                    format!(
                        "'{}' is not a ROW, it has no field '{field}'",
                        names.join(".")
                    ),
                );
            };
            let Some(k) = fields.iter().position(|(n, _)| n == field) else {
                let candidates = fields.iter().map(|(n, _)| n.as_str());
                return err(
                    at,
                    format!(
                        "field '{field}' not found{}",
                        did_you_mean(field, candidates)
                    ),
                );
            };
            let next = fields[k].1.clone();
            expr = Expr::Field(Box::new(expr), k);
            ty = next;
        }
        if let Some(g) = self.grouped {
            if let Expr::Col(i) = expr {
                if !g.keys.iter().any(|(_, c)| *c == i) {
                    return err(
                        at,
                        format!(
                            "column '{}' is neither grouped nor aggregated",
                            names.join(".")
                        ),
                    );
                }
            }
        }
        Ok((expr, ty, time))
    }

    fn find(&self, name: &str, at: Location) -> Result<Option<usize>> {
        let hits: Vec<usize> = (0..self.columns.len())
            .filter(|&i| self.columns[i].name == name)
            .collect();
        match hits.as_slice() {
            [] => Ok(None),
            [i] => Ok(Some(*i)),
            _ => err(
                at,
                format!("column '{name}' is ambiguous: qualify it with its table"),
            ),
        }
    }
}

/// Binds a scalar expression: its compiled form and type.
pub fn bind_expr(e: &ast::Expr, scope: &Scope) -> Result<(Expr, SqlType)> {
    bind(e, scope).map(|(e, t, _)| (e, t))
}

fn bind(e: &ast::Expr, scope: &Scope) -> Result<(Expr, SqlType, Time)> {
    use ast::Expr as A;
    let at = e.span().start;
    if let Some(g) = scope.grouped {
        let text = group_window_property(e).unwrap_or_else(|| e.to_string());
        if let Some((_, i)) = g.keys.iter().chain(&g.aggs).find(|(t, _)| *t == text) {
            let c = &scope.columns[*i];
            return Ok((Expr::Col(*i), c.ty.clone(), c.time));
        }
    }
    let plain = |(e, t): (Expr, SqlType)| Ok((e, t, Time::None));
    match e {
        A::Identifier(id) => scope.resolve(std::slice::from_ref(id)),
        A::CompoundIdentifier(parts) => scope.resolve(parts),
        A::Nested(inner) => bind(inner, scope),
        A::Value(v) => plain(literal(&v.value, at)?),
        A::Interval(i) => plain((Expr::Lit(Value::Int(interval_ms(i)?)), SqlType::Interval)),
        A::BinaryOp { left, op, right } => plain(binary(left, op, right, scope, at)?),
        A::UnaryOp { op, expr } => {
            let (x, t) = bind_expr(expr, scope)?;
            match op {
                ast::UnaryOperator::Not => {
                    expect_bool(&t, expr)?;
                    plain((Expr::Not(Box::new(x)), SqlType::Boolean))
                }
                ast::UnaryOperator::Minus if t.is_numeric() || t == SqlType::Interval => {
                    plain((Expr::Neg(Box::new(x)), t))
                }
                ast::UnaryOperator::Plus if t.is_numeric() => plain((x, t)),
                _ => err(at, format!("operator {op} does not apply to {t}")),
            }
        }
        A::IsNull(x) | A::IsNotNull(x) => {
            let (x2, _) = bind_expr(x, scope)?;
            plain((
                Expr::IsNull(Box::new(x2), matches!(e, A::IsNull(_))),
                SqlType::Boolean,
            ))
        }
        A::IsTrue(x) | A::IsFalse(x) => {
            let (x2, t) = bind_expr(x, scope)?;
            expect_bool(&t, x)?;
            let want = matches!(e, A::IsTrue(_));
            let cond = Expr::Bin(
                BinOp::Eq,
                Box::new(x2),
                Box::new(Expr::Lit(Value::Bool(want))),
                SqlType::Boolean,
            );
            plain((
                Expr::Call(Func::Coalesce, vec![cond, Expr::Lit(Value::Bool(false))]),
                SqlType::Boolean,
            ))
        }
        A::Between {
            expr,
            negated,
            low,
            high,
        } => {
            let ge = ast::Expr::BinaryOp {
                left: expr.clone(),
                op: ast::BinaryOperator::GtEq,
                right: low.clone(),
            };
            let le = ast::Expr::BinaryOp {
                left: expr.clone(),
                op: ast::BinaryOperator::LtEq,
                right: high.clone(),
            };
            let (a, _) = bind_expr(&ge, scope)?;
            let (b, _) = bind_expr(&le, scope)?;
            let both = Expr::Bin(BinOp::And, Box::new(a), Box::new(b), SqlType::Boolean);
            plain((
                if *negated {
                    Expr::Not(Box::new(both))
                } else {
                    both
                },
                SqlType::Boolean,
            ))
        }
        A::In {
            expr,
            target,
            negated,
            ..
        } => {
            let ast::InTarget::List(list) = target else {
                return unsupported(at, "IN with a subquery or UNNEST");
            };
            let (x, t) = bind_expr(expr, scope)?;
            let mut items = Vec::new();
            for item in list {
                let (y, u) = bind_expr(item, scope)?;
                comparable(&t, &u, item.span().start)?;
                items.push(y);
            }
            plain((Expr::InList(Box::new(x), items, *negated), SqlType::Boolean))
        }
        A::Like {
            negated,
            expr,
            pattern,
            escape_char,
            any,
        } => {
            if *any || escape_char.is_some() {
                return unsupported(at, "LIKE ANY and LIKE … ESCAPE");
            }
            let (x, t) = bind_expr(expr, scope)?;
            if t != SqlType::String {
                return err(at, format!("LIKE needs a STRING, not {t}"));
            }
            let pattern = match &**pattern {
                A::Value(v) => match &v.value {
                    ast::Value::SingleQuotedString(s) => s.clone(),
                    _ => return err(at, "the LIKE pattern must be a string literal"),
                },
                _ => return err(at, "the LIKE pattern must be a string literal"),
            };
            plain((
                Expr::Like(Box::new(x), Arc::new(LikePattern::new(&pattern)), *negated),
                SqlType::Boolean,
            ))
        }
        A::Case {
            operand,
            conditions,
            else_result,
            ..
        } => {
            let mut whens = Vec::new();
            let mut ty: Option<SqlType> = None;
            let mut results = Vec::new();
            for w in conditions {
                let cond = match operand {
                    Some(op) => ast::Expr::BinaryOp {
                        left: op.clone(),
                        op: ast::BinaryOperator::Eq,
                        right: Box::new(w.condition.clone()),
                    },
                    None => w.condition.clone(),
                };
                let (c, ct) = bind_expr(&cond, scope)?;
                expect_bool(&ct, &w.condition)?;
                let (r, rt) = bind_expr(&w.result, scope)?;
                ty = Some(unify(ty, &rt, w.result.span().start)?);
                whens.push(c);
                results.push(r);
            }
            let otherwise = match else_result {
                Some(x) => {
                    let (r, rt) = bind_expr(x, scope)?;
                    ty = Some(unify(ty, &rt, x.span().start)?);
                    r
                }
                None => Expr::Lit(Value::Null),
            };
            let ty = ty.unwrap_or(SqlType::Null);
            let whens = whens
                .into_iter()
                .zip(results)
                .map(|(c, r)| (c, coerce(r, &ty)))
                .collect();
            plain((Expr::Case(whens, Box::new(coerce(otherwise, &ty))), ty))
        }
        A::Cast {
            expr,
            data_type,
            kind,
            ..
        } => {
            if !matches!(kind, ast::CastKind::Cast) {
                return unsupported(at, "this form of CAST");
            }
            let ty = parse_type_text(&data_type.to_string()).map_err(|m| SqlError::at(at, m))?;
            let (x, _) = bind_expr(expr, scope)?;
            plain((Expr::Cast(Box::new(x), ty.clone()), ty))
        }
        A::Substring {
            expr,
            substring_from,
            substring_for,
            ..
        } => {
            let mut args = vec![bind_expr(expr, scope)?.0];
            args.push(match substring_from {
                Some(f) => bind_expr(f, scope)?.0,
                None => Expr::Lit(Value::Int(1)),
            });
            if let Some(f) = substring_for {
                args.push(bind_expr(f, scope)?.0);
            }
            plain((Expr::Call(Func::Substring, args), SqlType::String))
        }
        A::Trim {
            expr,
            trim_where,
            trim_what,
            trim_characters,
        } => {
            if trim_where.is_some() || trim_what.is_some() || trim_characters.is_some() {
                return unsupported(at, "TRIM with BOTH/LEADING/TRAILING or characters");
            }
            plain((
                Expr::Call(Func::Trim, vec![bind_expr(expr, scope)?.0]),
                SqlType::String,
            ))
        }
        A::Position { expr, r#in } => {
            let args = vec![bind_expr(expr, scope)?.0, bind_expr(r#in, scope)?.0];
            plain((Expr::Call(Func::Position, args), SqlType::Int))
        }
        A::Extract { field, expr, .. } => {
            let unit = time_unit(field).ok_or_else(|| SqlError::at(at, format!("EXTRACT({field} …) is not supported (YEAR, MONTH, DAY, HOUR, MINUTE, SECOND)")))?;
            let (x, t) = bind_expr(expr, scope)?;
            if !matches!(t, SqlType::Timestamp { .. }) {
                return err(at, format!("EXTRACT needs a TIMESTAMP, not {t}"));
            }
            plain((Expr::Call(Func::Extract(unit), vec![x]), SqlType::BigInt))
        }
        A::Function(f) => function(f, scope, at),
        other => err(at, format!("the expression '{other}' is not supported")),
    }
}

fn time_unit(field: &ast::DateTimeField) -> Option<TimeUnit> {
    use ast::DateTimeField as F;
    Some(match field {
        F::Year | F::Years => TimeUnit::Year,
        F::Month | F::Months => TimeUnit::Month,
        F::Day | F::Days => TimeUnit::Day,
        F::Hour | F::Hours => TimeUnit::Hour,
        F::Minute | F::Minutes => TimeUnit::Minute,
        F::Second | F::Seconds => TimeUnit::Second,
        _ => return None,
    })
}

fn literal(v: &ast::Value, at: Location) -> Result<(Expr, SqlType)> {
    Ok(match v {
        ast::Value::Number(n, _) => {
            if n.contains(['e', 'E']) {
                let d: f64 = n
                    .parse()
                    .map_err(|_| SqlError::at(at, format!("'{n}' is not a number")))?;
                (Expr::Lit(Value::Double(d)), SqlType::Double)
            } else if n.contains('.') {
                let (u, s) = parse_decimal(n)
                    .ok_or_else(|| SqlError::at(at, format!("'{n}' is not a number")))?;
                let digits = n.chars().filter(char::is_ascii_digit).count().max(1) as u8;
                (
                    Expr::Lit(Value::Decimal(u, s)),
                    SqlType::Decimal(digits.max(s), s),
                )
            } else {
                let i: i64 = n
                    .parse()
                    .map_err(|_| SqlError::at(at, format!("'{n}' is out of range of BIGINT")))?;
                let ty = if i32::try_from(i).is_ok() {
                    SqlType::Int
                } else {
                    SqlType::BigInt
                };
                (Expr::Lit(Value::Int(i)), ty)
            }
        }
        ast::Value::SingleQuotedString(s) => {
            (Expr::Lit(Value::Str(s.as_str().into())), SqlType::String)
        }
        ast::Value::Boolean(b) => (Expr::Lit(Value::Bool(*b)), SqlType::Boolean),
        ast::Value::Null => (Expr::Lit(Value::Null), SqlType::Null),
        other => return err(at, format!("the literal {other} is not supported")),
    })
}

fn expect_bool(t: &SqlType, e: &ast::Expr) -> Result<()> {
    if matches!(t, SqlType::Boolean | SqlType::Null) {
        Ok(())
    } else {
        err(
            e.span().start,
            format!("'{e}' must be a BOOLEAN condition, not {t}"),
        )
    }
}

fn comparable(a: &SqlType, b: &SqlType, at: Location) -> Result<()> {
    let ok = a == &SqlType::Null
        || b == &SqlType::Null
        || (a.is_numeric() && b.is_numeric())
        || (matches!(a, SqlType::Timestamp { .. }) && matches!(b, SqlType::Timestamp { .. }))
        || a == b;
    if ok {
        Ok(())
    } else {
        err(at, format!("cannot compare {a} with {b}"))
    }
}

/// The type both branches of a `CASE` (or a `UNION`) fit.
fn unify(acc: Option<SqlType>, t: &SqlType, at: Location) -> Result<SqlType> {
    let Some(a) = acc else { return Ok(t.clone()) };
    // Exact numbers, one a decimal: a decimal wide enough for both (a value beyond a
    // decimal's precision is NULL).
    if let (Some((p, s)), Some((q, u))) = (a.exact_digits(), t.exact_digits()) {
        if matches!(a, SqlType::Decimal(..)) || matches!(t, SqlType::Decimal(..)) {
            let scale = s.max(u);
            let int = (p - s).max(q - u);
            return Ok(SqlType::Decimal((int + scale).min(38), scale));
        }
    }
    if t.fits(&a) {
        return Ok(a);
    }
    if a.fits(t) {
        return Ok(t.clone());
    }
    if a.is_numeric() && t.is_numeric() {
        return Ok(arith_type(BinOp::Add, &a, t).unwrap_or(SqlType::Double));
    }
    err(at, format!("{t} and {a} have no common type"))
}

/// `e` as type `ty` where its type differs in representation (integers into decimals and
/// doubles).
pub fn coerce(e: Expr, ty: &SqlType) -> Expr {
    match ty {
        SqlType::Double | SqlType::Decimal(..) => Expr::Cast(Box::new(e), ty.clone()),
        _ => e,
    }
}

fn arith_type(op: BinOp, a: &SqlType, b: &SqlType) -> Option<SqlType> {
    use SqlType::*;
    Some(match (a, b) {
        (Null, t) | (t, Null) => t.clone(),
        (Double, _) | (_, Double) => Double,
        (Decimal(_, s), Decimal(_, t)) => Decimal(38, dec_scale(op, *s, *t)),
        (Decimal(_, s), Int | BigInt) => Decimal(38, dec_scale(op, *s, 0)),
        (Int | BigInt, Decimal(_, t)) => Decimal(38, dec_scale(op, 0, *t)),
        (BigInt, Int | BigInt) | (Int, BigInt) => BigInt,
        (Int, Int) => Int,
        _ => return None,
    })
}

fn dec_scale(op: BinOp, s: u8, t: u8) -> u8 {
    match op {
        BinOp::Mul => (s + t).min(18),
        BinOp::Div => s.max(6),
        _ => s.max(t),
    }
}

fn binary(
    left: &ast::Expr,
    op: &ast::BinaryOperator,
    right: &ast::Expr,
    scope: &Scope,
    at: Location,
) -> Result<(Expr, SqlType)> {
    use ast::BinaryOperator as O;
    let (l, lt) = bind_expr(left, scope)?;
    let (r, rt) = bind_expr(right, scope)?;
    let op = match op {
        O::Plus => BinOp::Add,
        O::Minus => BinOp::Sub,
        O::Multiply => BinOp::Mul,
        O::Divide => BinOp::Div,
        O::Modulo => BinOp::Mod,
        O::Eq => BinOp::Eq,
        O::NotEq => BinOp::Ne,
        O::Lt => BinOp::Lt,
        O::LtEq => BinOp::Le,
        O::Gt => BinOp::Gt,
        O::GtEq => BinOp::Ge,
        O::And => BinOp::And,
        O::Or => BinOp::Or,
        O::StringConcat => BinOp::Concat,
        other => return err(at, format!("operator {other} is not supported")),
    };
    let bin = |ty: SqlType| {
        Ok((
            Expr::Bin(op, Box::new(l.clone()), Box::new(r.clone()), ty.clone()),
            ty,
        ))
    };
    match op {
        BinOp::And | BinOp::Or => {
            expect_bool(&lt, left)?;
            expect_bool(&rt, right)?;
            bin(SqlType::Boolean)
        }
        BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => {
            comparable(&lt, &rt, at)?;
            bin(SqlType::Boolean)
        }
        BinOp::Concat => bin(SqlType::String),
        _ => {
            if let (SqlType::Timestamp { .. }, SqlType::Interval) = (&lt, &rt) {
                if matches!(op, BinOp::Add | BinOp::Sub) {
                    return bin(lt);
                }
            }
            if let (SqlType::Interval, SqlType::Timestamp { .. }) = (&lt, &rt) {
                if op == BinOp::Add {
                    return bin(rt);
                }
            }
            match arith_type(op, &lt, &rt) {
                Some(ty) if lt.is_numeric() && rt.is_numeric() => bin(ty),
                _ => err(at, format!("operator {op} does not apply to {lt} and {rt}")),
            }
        }
    }
}

fn function_args(f: &ast::Function) -> Result<(Vec<&ast::Expr>, bool, bool)> {
    let at = f.name.span().start;
    match &f.args {
        ast::FunctionArguments::None => Ok((Vec::new(), false, false)),
        ast::FunctionArguments::Subquery(_) => unsupported(at, "a subquery as a function argument"),
        ast::FunctionArguments::List(list) => {
            let distinct = matches!(
                list.duplicate_treatment,
                Some(ast::DuplicateTreatment::Distinct)
            );
            let mut args = Vec::new();
            let mut star = false;
            for a in &list.args {
                match a {
                    ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(e)) => args.push(e),
                    ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Wildcard) => star = true,
                    _ => return unsupported(at, "named or qualified-wildcard function arguments"),
                }
            }
            if !list.clauses.is_empty() {
                return unsupported(at, "clauses inside a function call's arguments");
            }
            Ok((args, distinct, star))
        }
    }
}

fn function_name(f: &ast::Function) -> String {
    f.name.to_string().to_ascii_uppercase()
}

/// Whether `name` is an aggregate function.
pub fn is_aggregate(name: &str) -> bool {
    matches!(name, "COUNT" | "SUM" | "MIN" | "MAX" | "AVG")
}

fn function(f: &ast::Function, scope: &Scope, at: Location) -> Result<(Expr, SqlType, Time)> {
    let name = function_name(f);
    if f.over.is_some() {
        return unsupported(
            at,
            &format!("{name}() OVER (…) here (ROW_NUMBER(), RANK() and DENSE_RANK() OVER (…) are select items of a query without GROUP BY, for Top-N and deduplication; OVER aggregations are not supported)"),
        );
    }
    if is_aggregate(&name) {
        return err(at, format!("aggregate {name} is not allowed here (only in a SELECT list or HAVING of a query that aggregates)"));
    }
    if f.filter.is_some() {
        return err(
            at,
            format!("FILTER applies only to aggregate functions, not {name}"),
        );
    }
    // The name first: an unknown function is named as such, not by an argument it cannot bind.
    if !KNOWN_FUNCTIONS.contains(&name.as_str()) && !OTHER_FUNCTIONS.contains(&name.as_str()) {
        return err(
            at,
            format!(
                "unknown function {name}{}",
                did_you_mean(&name, KNOWN_FUNCTIONS.iter().copied())
            ),
        );
    }
    let (args, _, _) = function_args(f)?;
    let mut bound = Vec::new();
    let mut types = Vec::new();
    for a in &args {
        let (e, t) = bind_expr(a, scope)?;
        bound.push(e);
        types.push(t);
    }
    let arity = |range: std::ops::RangeInclusive<usize>| {
        if range.contains(&args.len()) {
            Ok(())
        } else {
            err(
                at,
                format!(
                    "{name} takes {} arguments, got {}",
                    if range.start() == range.end() {
                        range.start().to_string()
                    } else {
                        format!("{} to {}", range.start(), range.end())
                    },
                    args.len()
                ),
            )
        }
    };
    let string_const = |i: usize| -> Result<String> {
        match &bound.get(i) {
            Some(Expr::Lit(Value::Str(s))) => Ok(s.to_string()),
            _ => err(
                at,
                format!("argument {} of {name} must be a string literal", i + 1),
            ),
        }
    };
    let call =
        |func: Func, ty: SqlType, bound: Vec<Expr>| Ok((Expr::Call(func, bound), ty, Time::None));
    match name.as_str() {
        "PROCTIME" => {
            arity(0..=0)?;
            Ok((Expr::Call(Func::Now, vec![]), SqlType::Timestamp { ltz: true }, Time::Proctime))
        }
        "CURRENT_TIMESTAMP" | "NOW" | "LOCALTIMESTAMP" => call(Func::Now, SqlType::Timestamp { ltz: true }, bound),
        "MOD" => {
            arity(2..=2)?;
            let ty = arith_type(BinOp::Mod, &types[0], &types[1]).filter(|_| types[0].is_numeric() && types[1].is_numeric()).ok_or_else(|| SqlError::at(at, format!("MOD does not apply to {} and {}", types[0], types[1])))?;
            let mut it = bound.into_iter();
            let (a, b) = (it.next().unwrap_or(Expr::Lit(Value::Null)), it.next().unwrap_or(Expr::Lit(Value::Null)));
            Ok((Expr::Bin(BinOp::Mod, Box::new(a), Box::new(b), ty.clone()), ty, Time::None))
        }
        "ABS" | "FLOOR" | "CEIL" | "CEILING" => {
            arity(1..=1)?;
            let func = match name.as_str() { "ABS" => Func::Abs, "FLOOR" => Func::Floor, _ => Func::Ceil };
            call(func, types[0].clone(), bound)
        }
        "ROUND" => {
            arity(1..=2)?;
            let ty = match &types[0] { SqlType::Decimal(p, _) => SqlType::Decimal(*p, match bound.get(1) { Some(Expr::Lit(Value::Int(d))) => (*d).clamp(0, 18) as u8, _ => 0 }), t => t.clone() };
            call(Func::Round, ty, bound)
        }
        "POWER" | "POW" => { arity(2..=2)?; call(Func::Power, SqlType::Double, bound) }
        "SQRT" => { arity(1..=1)?; call(Func::Sqrt, SqlType::Double, bound) }
        "UPPER" | "LOWER" => {
            arity(1..=1)?;
            call(if name == "UPPER" { Func::Upper } else { Func::Lower }, SqlType::String, bound)
        }
        "CHAR_LENGTH" | "CHARACTER_LENGTH" | "LENGTH" => { arity(1..=1)?; call(Func::CharLength, SqlType::Int, bound) }
        "SUBSTRING" | "SUBSTR" => { arity(2..=3)?; call(Func::Substring, SqlType::String, bound) }
        "TRIM" => { arity(1..=1)?; call(Func::Trim, SqlType::String, bound) }
        "CONCAT" => { arity(1..=64)?; call(Func::Concat, SqlType::String, bound) }
        "REPLACE" => { arity(3..=3)?; call(Func::Replace, SqlType::String, bound) }
        "SPLIT_INDEX" => { arity(3..=3)?; call(Func::SplitIndex, SqlType::String, bound) }
        "REGEXP_EXTRACT" | "REGEXP" => {
            arity(if name == "REGEXP" { 2..=2 } else { 2..=3 })?;
            let pattern = string_const(1)?;
            let re = regex::Regex::new(&pattern).map_err(|e| SqlError::at(at, format!("bad regular expression '{pattern}': {}", e.to_string().lines().last().unwrap_or_default())))?;
            if name == "REGEXP" {
                call(Func::Regexp(Arc::new(re)), SqlType::Boolean, bound)
            } else {
                call(Func::RegexpExtract(Arc::new(re)), SqlType::String, bound)
            }
        }
        "DATE_FORMAT" => {
            arity(2..=2)?;
            if !matches!(types[0], SqlType::Timestamp { .. } | SqlType::Null) {
                return err(at, format!("DATE_FORMAT needs a TIMESTAMP, not {}", types[0]));
            }
            call(Func::DateFormat, SqlType::String, bound)
        }
        "YEAR" | "MONTH" | "DAYOFMONTH" | "HOUR" | "MINUTE" | "SECOND" => {
            arity(1..=1)?;
            let unit = match name.as_str() { "YEAR" => TimeUnit::Year, "MONTH" => TimeUnit::Month, "DAYOFMONTH" => TimeUnit::Day, "HOUR" => TimeUnit::Hour, "MINUTE" => TimeUnit::Minute, _ => TimeUnit::Second };
            call(Func::Extract(unit), SqlType::BigInt, bound)
        }
        "TO_TIMESTAMP" => { arity(1..=1)?; call(Func::ToTimestamp, SqlType::Timestamp { ltz: false }, bound) }
        "TO_TIMESTAMP_LTZ" => { arity(1..=2)?; call(Func::ToTimestampLtz, SqlType::Timestamp { ltz: true }, bound) }
        "COALESCE" | "GREATEST" | "LEAST" => {
            arity(1..=64)?;
            let mut ty = None;
            for (t, a) in types.iter().zip(&args) {
                ty = Some(unify(ty, t, a.span().start)?);
            }
            let ty = ty.unwrap_or(SqlType::Null);
            let bound = bound.into_iter().map(|e| coerce(e, &ty)).collect();
            let func = match name.as_str() { "COALESCE" => Func::Coalesce, "GREATEST" => Func::Greatest, _ => Func::Least };
            call(func, ty, bound)
        }
        "NULLIF" => { arity(2..=2)?; call(Func::NullIf, types[0].clone(), bound) }
        "IF" => {
            arity(3..=3)?;
            expect_bool(&types[0], args[0])?;
            let ty = unify(Some(types[1].clone()), &types[2], at)?;
            let mut it = bound.into_iter();
            let c = it.next().unwrap_or(Expr::Lit(Value::Null));
            let rest: Vec<Expr> = it.map(|e| coerce(e, &ty)).collect();
            let mut all = vec![c];
            all.extend(rest);
            call(Func::If, ty, all)
        }
        "TUMBLE" | "HOP" | "SESSION" | "CUMULATE" => err(at, format!("{name} is a window table-valued function: use it in FROM as TABLE({name}(TABLE t, DESCRIPTOR(time_column), …))")),
        "TUMBLE_START" | "TUMBLE_END" | "HOP_START" | "HOP_END" | "SESSION_START" | "SESSION_END" | "TUMBLE_ROWTIME" | "HOP_ROWTIME" | "SESSION_ROWTIME" | "TUMBLE_PROCTIME" | "HOP_PROCTIME" | "SESSION_PROCTIME" => {
            let window = name.split('_').next().unwrap_or_default();
            err(at, format!("{name} needs GROUP BY {window}(…) with the same arguments"))
        }
        _ => err(at, format!("unknown function {name}{}", did_you_mean(&name, KNOWN_FUNCTIONS.iter().copied()))),
    }
}

/// Functions bound below besides [`KNOWN_FUNCTIONS`]: synonyms, and the window functions,
/// which are errors in an expression.
const OTHER_FUNCTIONS: &[&str] = &[
    "CEILING",
    "CHARACTER_LENGTH",
    "LENGTH",
    "LOCALTIMESTAMP",
    "POW",
    "SUBSTR",
    "TUMBLE",
    "HOP",
    "SESSION",
    "CUMULATE",
    "TUMBLE_START",
    "TUMBLE_END",
    "TUMBLE_ROWTIME",
    "TUMBLE_PROCTIME",
    "HOP_START",
    "HOP_END",
    "HOP_ROWTIME",
    "HOP_PROCTIME",
    "SESSION_START",
    "SESSION_END",
    "SESSION_ROWTIME",
    "SESSION_PROCTIME",
];

const KNOWN_FUNCTIONS: &[&str] = &[
    "PROCTIME",
    "CURRENT_TIMESTAMP",
    "NOW",
    "MOD",
    "ABS",
    "FLOOR",
    "CEIL",
    "ROUND",
    "POWER",
    "SQRT",
    "UPPER",
    "LOWER",
    "CHAR_LENGTH",
    "SUBSTRING",
    "TRIM",
    "CONCAT",
    "REPLACE",
    "SPLIT_INDEX",
    "REGEXP_EXTRACT",
    "REGEXP",
    "DATE_FORMAT",
    "YEAR",
    "MONTH",
    "DAYOFMONTH",
    "HOUR",
    "MINUTE",
    "SECOND",
    "TO_TIMESTAMP",
    "TO_TIMESTAMP_LTZ",
    "COALESCE",
    "GREATEST",
    "LEAST",
    "NULLIF",
    "IF",
    "COUNT",
    "SUM",
    "MIN",
    "MAX",
    "AVG",
];

// ---------------------------------------------------------------------------------------
// Queries

/// Plans a query.
pub fn plan_query(q: &ast::Query, catalog: &Catalog) -> Result<Rel> {
    let at = q.body.span().start;
    if let Some(with) = &q.with {
        let scoped = with_queries(with, catalog)?;
        let body = ast::Query {
            with: None,
            ..q.clone()
        };
        return plan_query(&body, &scoped);
    }
    if q.fetch.is_some() {
        return unsupported(at, "FETCH in a streaming query (write LIMIT)");
    }
    let limit = match &q.limit_clause {
        None => None,
        Some(ast::LimitClause::LimitOffset {
            limit,
            offset,
            limit_by,
        }) => {
            if !limit_by.is_empty() {
                return unsupported(at, "LIMIT … BY");
            }
            let Some(limit) = limit else {
                return unsupported(at, "LIMIT ALL");
            };
            let offset = match offset {
                Some(o) => count(&o.value, "OFFSET")?,
                None => 0,
            };
            Some((count(limit, "LIMIT")?, offset))
        }
        Some(ast::LimitClause::OffsetCommaLimit { offset, limit }) => {
            Some((count(limit, "LIMIT")?, count(offset, "OFFSET")?))
        }
    };
    let order_by = match &q.order_by {
        None => None,
        Some(o) => match &o.kind {
            ast::OrderByKind::Expressions(exprs) => Some(exprs),
            ast::OrderByKind::All(_) => return unsupported(at, "ORDER BY ALL"),
        },
    };
    match (order_by, limit) {
        (None, None) => plan_set_expr(&q.body, catalog),
        (order_by, Some((limit, offset))) => {
            let rel = plan_set_expr(&q.body, catalog)?;
            rank::order_limit(rel, order_by.map_or(&[][..], |o| o), limit, offset, at)
        }
        (Some(_), None) => unsupported(
            at,
            "ORDER BY without LIMIT in a streaming query (a sorted stream never ends; add LIMIT for a Top-N)",
        ),
    }
}

/// The row count a `LIMIT` or `OFFSET` gives: a non-negative integer constant.
fn count(e: &ast::Expr, what: &str) -> Result<u64> {
    match e {
        ast::Expr::Value(v) => match &v.value {
            ast::Value::Number(n, _) => n.parse().ok(),
            _ => None,
        },
        _ => None,
    }
    .ok_or_else(|| {
        SqlError::at(
            e.span().start,
            format!("{what} takes a whole number of rows, not '{e}'"),
        )
    })
}

/// `catalog` with the queries of a `WITH` clause as views, each seeing those before it; a
/// name there hides a table or view of the same name.
fn with_queries(with: &ast::With, catalog: &Catalog) -> Result<Catalog> {
    let at = with.with_token.0.span.start;
    if with.recursive {
        return unsupported(at, "WITH RECURSIVE");
    }
    let mut scoped = catalog.clone();
    for cte in &with.cte_tables {
        let name = cte.alias.name.value.clone();
        if !cte.alias.columns.is_empty() {
            return unsupported(
                cte.alias.name.span.start,
                &format!("a column list on WITH query '{name}' (name the columns in its SELECT)"),
            );
        }
        let mut rel = plan_query(&cte.query, &scoped)?;
        for c in &mut rel.columns {
            c.qualifier = Some(name.clone());
        }
        scoped.with.insert(name, rel);
    }
    Ok(scoped)
}

fn plan_set_expr(body: &ast::SetExpr, catalog: &Catalog) -> Result<Rel> {
    let at = body.span().start;
    match body {
        ast::SetExpr::Select(s) => plan_select(s, catalog),
        ast::SetExpr::Query(q) => plan_query(q, catalog),
        ast::SetExpr::SetOperation {
            left,
            op,
            set_quantifier,
            right,
        } => {
            if *op != ast::SetOperator::Union || *set_quantifier != ast::SetQuantifier::All {
                return unsupported(at, &format!("{op} {set_quantifier} (only UNION ALL)"));
            }
            let l = plan_set_expr(left, catalog)?;
            let r = plan_set_expr(right, catalog)?;
            union(l, r, right.span().start)
        }
        _ => unsupported(at, "this kind of query body"),
    }
}

fn union(l: Rel, r: Rel, at: Location) -> Result<Rel> {
    if l.columns.len() != r.columns.len() {
        return err(
            at,
            format!(
                "UNION ALL of {} and {} columns",
                l.columns.len(),
                r.columns.len()
            ),
        );
    }
    let mut columns = l.columns.clone();
    for (c, d) in columns.iter_mut().zip(&r.columns) {
        c.ty = unify(Some(c.ty.clone()), &d.ty, at)?;
        if c.time != d.time {
            c.time = Time::None;
        }
    }
    // Both sides in the union's types.
    let cast = |rel: Rel, columns: &[Column]| -> Rel {
        if rel.columns.iter().zip(columns).all(|(a, b)| a.ty == b.ty) {
            return rel;
        }
        let project = columns
            .iter()
            .enumerate()
            .map(|(i, c)| coerce(Expr::Col(i), &c.ty))
            .collect();
        let updating = rel.updating;
        Rel {
            node: Node::Calc {
                input: Box::new(rel),
                filter: None,
                project,
            },
            columns: columns.to_vec(),
            updating,
        }
    };
    let updating = l.updating || r.updating;
    let mut inputs = Vec::new();
    for side in [l, r] {
        let side = cast(side, &columns);
        match side.node {
            Node::Union(more) => inputs.extend(more),
            node => inputs.push(Rel { node, ..side }),
        }
    }
    Ok(Rel {
        node: Node::Union(inputs),
        columns,
        updating,
    })
}

/// What FROM gives a SELECT.
struct From {
    rel: Rel,
    /// A window table-valued function over `rel`, with the time column (`None`: processing
    /// time) and session partition keys.
    window: Option<(WindowKind, Option<usize>, Vec<usize>)>,
}

fn plan_from(from: &[ast::TableWithJoins], catalog: &Catalog, at: Location) -> Result<From> {
    let Some((first, rest)) = from.split_first() else {
        return unsupported(at, "SELECT without FROM");
    };
    let mut acc = plan_joined(first, catalog)?;
    // `FROM a, b WHERE a.k = b.k`: a join whose condition the WHERE gives.
    for item in rest {
        let right = plan_joined(item, catalog)?;
        acc = join(acc, right, None, at, JoinKind::Inner)?;
    }
    Ok(acc)
}

fn plan_joined(item: &ast::TableWithJoins, catalog: &Catalog) -> Result<From> {
    let mut acc = plan_factor(&item.relation, catalog)?;
    for j in &item.joins {
        let at = j.relation.span().start;
        let (constraint, kind) = match &j.join_operator {
            ast::JoinOperator::Join(c) | ast::JoinOperator::Inner(c) => (Some(c), JoinKind::Inner),
            ast::JoinOperator::CrossJoin(c) => (Some(c), JoinKind::Inner),
            ast::JoinOperator::Left(c) | ast::JoinOperator::LeftOuter(c) => {
                (Some(c), JoinKind::Left)
            }
            ast::JoinOperator::Right(c) | ast::JoinOperator::RightOuter(c) => {
                (Some(c), JoinKind::Right)
            }
            ast::JoinOperator::FullOuter(c) => (Some(c), JoinKind::Full),
            _ => (None, JoinKind::Inner),
        };
        if kind != JoinKind::Inner && !matches!(constraint, Some(ast::JoinConstraint::On(_))) {
            return unsupported(at, "an outer join without ON");
        }
        let on = match constraint {
            Some(ast::JoinConstraint::On(e)) => Some(e),
            Some(ast::JoinConstraint::None) => None,
            Some(_) => return unsupported(at, "JOIN … USING and NATURAL JOIN (write ON)"),
            None => return unsupported(at, "this kind of join (only inner joins)"),
        };
        let right = plan_factor(&j.relation, catalog)?;
        acc = join(acc, right, on, at, kind)?;
    }
    Ok(acc)
}

/// The join of `left` and `right` on `on` (None: a condition the WHERE gives).
fn join(
    left: From,
    right: From,
    on: Option<&ast::Expr>,
    at: Location,
    kind: JoinKind,
) -> Result<From> {
    if left.window.is_some() || right.window.is_some() {
        return unsupported(
            at,
            "a join of window table-valued functions (a window join)",
        );
    }
    let (left, right) = (left.rel, right.rel);
    // A regular join's output is not ordered in time: its time attributes are timestamps.
    let columns: Vec<Column> = left
        .columns
        .iter()
        .chain(&right.columns)
        .map(|c| Column {
            time: Time::None,
            ..c.clone()
        })
        .collect();
    // An outer join retracts a row padded with NULLs when its first match comes.
    let updating = left.updating || right.updating || kind != JoinKind::Inner;
    let mut rel = Rel {
        node: Node::Join {
            left: Box::new(left),
            right: Box::new(right),
            keys: Vec::new(),
            kind,
            condition: None,
            bounds: None,
        },
        columns,
        updating,
    };
    if let Some(on) = on {
        let (condition, ty) = bind_expr(on, &Scope::new(&rel.columns))?;
        expect_bool(&ty, on)?;
        rel = if kind == JoinKind::Inner {
            filtered(rel, condition)
        } else {
            outer_on(rel, condition)
        };
    }
    Ok(From { rel, window: None })
}

/// An outer join's `ON`: equalities of a left and a right column are its keys, a conjunct of
/// only the side whose rows need a match filters that side before the join, and the rest is
/// the condition a pair must meet to join. (Unlike an inner join's, none of it may filter the
/// joined rows: a row that fails it still appears, padded.)
fn outer_on(rel: Rel, on: Expr) -> Rel {
    let Node::Join {
        left,
        right,
        mut keys,
        kind,
        condition: _,
        bounds: _,
    } = rel.node
    else {
        unreachable!("outer_on of a join");
    };
    let split = left.columns.len();
    let [keep_left, keep_right] = kind.preserves();
    let ([on_left, on_right], rest) = place_conjuncts(
        on,
        &rel.columns,
        split,
        [!keep_left, !keep_right],
        &mut keys,
    );
    let (left, right) = (filter_side(*left, on_left), filter_side(*right, on_right));
    let bounds = time_bounds(&rest, &left, &right);
    Rel {
        node: Node::Join {
            left: Box::new(left),
            right: Box::new(right),
            keys,
            kind,
            condition: and_all(rest),
            bounds,
        },
        columns: rel.columns,
        updating: rel.updating,
    }
}

/// Where the conjuncts of a join's `condition` go: an equality of a left and a right column
/// into `keys`; a conjunct of one side's columns into that side's filter (over its own
/// columns), where `may_filter` allows it; the rest is returned.
fn place_conjuncts(
    condition: Expr,
    columns: &[Column],
    split: usize,
    may_filter: [bool; 2],
    keys: &mut Vec<(usize, usize)>,
) -> ([Option<Expr>; 2], Vec<Expr>) {
    let mut parts = Vec::new();
    conjuncts(condition, &mut parts);
    let (mut on_left, mut on_right, mut rest) = (Vec::new(), Vec::new(), Vec::new());
    for c in parts {
        if let Some(pair) = key_pair(&c, columns, split) {
            keys.push(pair);
            continue;
        }
        let cols = c.columns();
        if !cols.is_empty() && cols.iter().all(|&i| i < split) && may_filter[0] {
            on_left.push(c);
        } else if !cols.is_empty() && cols.iter().all(|&i| i >= split) && may_filter[1] {
            let shift: Vec<Expr> = (0..columns.len())
                .map(|i| Expr::Col(i.saturating_sub(split)))
                .collect();
            on_right.push(c.substitute(&shift));
        } else {
            rest.push(c);
        }
    }
    ([and_all(on_left), and_all(on_right)], rest)
}

/// A join's input, filtered by `filter` if there is one.
fn filter_side(rel: Rel, filter: Option<Expr>) -> Rel {
    match filter {
        Some(f) => filtered(rel, f),
        None => rel,
    }
}

/// `a AND b AND …` of `parts`, if there are any.
pub(super) fn and_all(parts: Vec<Expr>) -> Option<Expr> {
    parts
        .into_iter()
        .reduce(|a, b| Expr::Bin(BinOp::And, Box::new(a), Box::new(b), SqlType::Boolean))
}

/// The join key a conjunct is, if it is an equality of a left and a right column of types
/// that compare as keys: (left column, right column of the right input).
fn key_pair(c: &Expr, columns: &[Column], split: usize) -> Option<(usize, usize)> {
    let Expr::Bin(BinOp::Eq, a, b, _) = c else {
        return None;
    };
    let (a, b) = (a.as_col()?, b.as_col()?);
    if !columns[a].ty.comparable_key(&columns[b].ty) {
        return None;
    }
    match (a < split, b < split) {
        (true, false) => Some((a, b - split)),
        (false, true) => Some((b, a - split)),
        _ => None,
    }
}

/// The conjuncts of a condition (`a AND b AND …`).
pub(super) fn conjuncts(e: Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::Bin(BinOp::And, a, b, _) => {
            conjuncts(*a, out);
            conjuncts(*b, out);
        }
        other => out.push(other),
    }
}

/// `rel` filtered by `condition`. Over a join, each conjunct goes where it applies: an
/// equality of a left and a right column becomes a join key, a conjunct of one side's columns
/// filters that side before the join (its state holds only rows that can join), and the rest
/// filters the joined rows.
fn filtered(rel: Rel, condition: Expr) -> Rel {
    let Node::Join {
        left,
        right,
        mut keys,
        kind: JoinKind::Inner,
        condition: None,
        bounds,
    } = rel.node
    else {
        // Over anything else, an outer join too (its padded rows are not to be filtered
        // before it pads them), a filter of the rows.
        let project = (0..rel.columns.len()).map(Expr::Col).collect();
        let columns = rel.columns.clone();
        return calc(rel, Some(condition), project, columns);
    };
    let split = left.columns.len();
    let ([on_left, on_right], rest) =
        place_conjuncts(condition, &rel.columns, split, [true, true], &mut keys);
    let (left, right) = (filter_side(*left, on_left), filter_side(*right, on_right));
    // The filter after the join still checks the times; the bounds only let rows go.
    let bounds = bounds.or_else(|| time_bounds(&rest, &left, &right));
    let joined = Rel {
        node: Node::Join {
            left: Box::new(left),
            right: Box::new(right),
            keys,
            kind: JoinKind::Inner,
            condition: None,
            bounds,
        },
        columns: rel.columns,
        updating: rel.updating,
    };
    match and_all(rest) {
        Some(f) => {
            let project = (0..joined.columns.len()).map(Expr::Col).collect();
            let columns = joined.columns.clone();
            calc(joined, Some(f), project, columns)
        }
        None => joined,
    }
}

fn alias_columns(mut rel: Rel, alias: &Option<ast::TableAlias>) -> Rel {
    if let Some(a) = alias {
        for c in &mut rel.columns {
            c.qualifier = Some(a.name.value.clone());
        }
        for (c, name) in rel.columns.iter_mut().zip(&a.columns) {
            c.name = name.name.value.clone();
        }
    }
    rel
}

fn plan_factor(factor: &ast::TableFactor, catalog: &Catalog) -> Result<From> {
    let at = factor.span().start;
    match factor {
        ast::TableFactor::Table {
            name,
            alias,
            args: None,
            ..
        } => {
            let rel = plan_table_name(name, catalog)?;
            Ok(From {
                rel: alias_columns(rel, alias),
                window: None,
            })
        }
        ast::TableFactor::Derived {
            subquery,
            alias,
            lateral: false,
            ..
        } => {
            let rel = plan_query(subquery, catalog)?;
            Ok(From {
                rel: alias_columns(rel, alias),
                window: None,
            })
        }
        ast::TableFactor::TableFunction { expr, alias } => {
            let mut from = window_tvf(expr, catalog)?;
            from.rel = alias_columns(from.rel, alias);
            Ok(from)
        }
        _ => unsupported(at, "this kind of FROM item"),
    }
}

fn plan_table_name(name: &ast::ObjectName, catalog: &Catalog) -> Result<Rel> {
    let at = name.span().start;
    let text = name.to_string().replace(['`', '"'], "");
    if let Some(rel) = catalog.with.get(&text) {
        return Ok(rel.clone());
    }
    if let Some(t) = catalog.tables.get(&text) {
        return Ok(Rel {
            node: Node::Scan(t.clone()),
            columns: t.columns.clone(),
            updating: false,
        });
    }
    if let Some(q) = catalog.views.get(&text) {
        // A view sees the script's tables and views, not the WITH queries around its use.
        let mut rel = if catalog.with.is_empty() {
            plan_query(q, catalog)?
        } else {
            let global = Catalog {
                with: BTreeMap::new(),
                ..catalog.clone()
            };
            plan_query(q, &global)?
        };
        for c in &mut rel.columns {
            c.qualifier = Some(text.clone());
        }
        return Ok(rel);
    }
    let names = catalog
        .tables
        .keys()
        .chain(catalog.views.keys())
        .chain(catalog.with.keys())
        .map(String::as_str);
    err(
        at,
        format!(
            "table or view '{text}' not found{}",
            did_you_mean(&text, names)
        ),
    )
}

fn window_tvf(expr: &ast::Expr, catalog: &Catalog) -> Result<From> {
    let at = expr.span().start;
    let ast::Expr::Function(f) = expr else {
        return unsupported(at, "this table function");
    };
    let name = function_name(f);
    let (args, _, _) = function_args(f)?;
    let (table, partition) = match args.first() {
        Some(ast::Expr::Function(t)) if function_name(t) == TABLE_ARG.to_ascii_uppercase() => {
            let (targs, _, _) = function_args(t)?;
            match targs.as_slice() {
                [ast::Expr::Identifier(id), rest @ ..] => {
                    (ast::ObjectName::from(vec![id.clone()]), rest.to_vec())
                }
                [ast::Expr::CompoundIdentifier(ids), rest @ ..] => {
                    (ast::ObjectName::from(ids.clone()), rest.to_vec())
                }
                _ => {
                    return err(
                        at,
                        format!("the first argument of {name} must be TABLE name"),
                    )
                }
            }
        }
        _ => {
            return err(
                at,
                format!("the first argument of {name} must be TABLE name"),
            )
        }
    };
    let rel = plan_table_name(&table, catalog)?;
    let time_col = match args.get(1) {
        Some(ast::Expr::Function(d)) if function_name(d) == "DESCRIPTOR" => {
            let (dargs, _, _) = function_args(d)?;
            match dargs.as_slice() {
                [ast::Expr::Identifier(id)] => {
                    let scope = Scope::new(&rel.columns);
                    let (e, _, time) = scope.resolve(std::slice::from_ref(id))?;
                    match (e, time) {
                        (Expr::Col(i), Time::Rowtime) => Some(i),
                        (Expr::Col(_), Time::Proctime) => None,
                        _ => return err(id.span.start, format!("'{}' is not a time attribute (a column with a WATERMARK, or PROCTIME())", id.value)),
                    }
                }
                _ => return err(at, "DESCRIPTOR takes one column"),
            }
        }
        _ => {
            return err(
                at,
                format!("the second argument of {name} must be DESCRIPTOR(time_column)"),
            )
        }
    };
    let intervals: Vec<i64> = args[2..]
        .iter()
        .map(|a| match a {
            ast::Expr::Interval(i) => interval_ms(i),
            other => err(
                other.span().start,
                format!("{name} takes INTERVAL arguments after the DESCRIPTOR"),
            ),
        })
        .collect::<Result<_>>()?;
    let window = window_kind(&name, &intervals, at)?;
    let mut keys = Vec::new();
    if !partition.is_empty() && !matches!(window, WindowKind::Session { .. }) {
        return err(at, format!("PARTITION BY applies to SESSION, not {name}"));
    }
    let scope = Scope::new(&rel.columns);
    for p in partition {
        let exprs: Vec<ast::Expr> = match p {
            ast::Expr::Tuple(items) => items.clone(),
            ast::Expr::Nested(inner) => vec![(**inner).clone()],
            other => vec![other.clone()],
        };
        for e in exprs {
            match bind_expr(&e, &scope)? {
                (Expr::Col(i), _) => keys.push(i),
                _ => return err(e.span().start, "SESSION's PARTITION BY takes columns"),
            }
        }
    }
    Ok(From {
        rel,
        window: Some((window, time_col, keys)),
    })
}

/// The window `name` (TUMBLE, HOP, SESSION, CUMULATE) with its `intervals` in ms, in the order
/// the window table-valued functions and the legacy group windows take them.
fn window_kind(name: &str, intervals: &[i64], at: Location) -> Result<WindowKind> {
    let positive = |ms: i64, what: &str| {
        if ms > 0 {
            Ok(ms)
        } else {
            err(at, format!("the {what} of {name} must be positive"))
        }
    };
    let window = match (name, intervals) {
        ("TUMBLE", [size]) => WindowKind::Tumble {
            size: positive(*size, "size")?,
            offset: 0,
        },
        ("TUMBLE", [size, offset]) => WindowKind::Tumble {
            size: positive(*size, "size")?,
            offset: *offset,
        },
        ("HOP", [slide, size]) => WindowKind::Hop {
            slide: positive(*slide, "slide")?,
            size: positive(*size, "size")?,
            offset: 0,
        },
        ("HOP", [slide, size, offset]) => WindowKind::Hop {
            slide: positive(*slide, "slide")?,
            size: positive(*size, "size")?,
            offset: *offset,
        },
        ("SESSION", [gap]) => WindowKind::Session {
            gap: positive(*gap, "gap")?,
        },
        ("CUMULATE", [step, size]) => WindowKind::Cumulate {
            step: positive(*step, "step")?,
            size: positive(*size, "max size")?,
            offset: 0,
        },
        ("CUMULATE", [step, size, offset]) => WindowKind::Cumulate {
            step: positive(*step, "step")?,
            size: positive(*size, "max size")?,
            offset: *offset,
        },
        ("TUMBLE" | "HOP" | "SESSION" | "CUMULATE", _) => {
            return err(at, format!("wrong number of interval arguments for {name}"))
        }
        _ => {
            return err(
                at,
                format!(
                    "unknown table function {name}; the window functions are TUMBLE, HOP, SESSION, CUMULATE"
                ),
            )
        }
    };
    if let WindowKind::Hop { slide, size, .. } = window {
        if size % slide != 0 {
            return err(at, "HOP's size must be a multiple of its slide");
        }
    }
    if let WindowKind::Cumulate { step, size, .. } = window {
        if size % step != 0 {
            return err(
                at,
                format!(
                    "CUMULATE's max size ({size} ms) must be a multiple of its step ({step} ms)"
                ),
            );
        }
    }
    Ok(window)
}

fn item_name(e: &ast::Expr, i: usize) -> String {
    match e {
        ast::Expr::Identifier(id) => id.value.clone(),
        ast::Expr::CompoundIdentifier(ids) => {
            ids.last().map(|id| id.value.clone()).unwrap_or_default()
        }
        _ => format!("EXPR${i}"),
    }
}

fn plan_select(s: &ast::Select, catalog: &Catalog) -> Result<Rel> {
    let at = s.select_token.0.span.start;
    match &s.distinct {
        Some(ast::Distinct::Distinct) => {
            let all = ast::Select {
                distinct: None,
                ..s.clone()
            };
            return Ok(distinct(plan_select(&all, catalog)?));
        }
        Some(ast::Distinct::On(_)) => return unsupported(at, "SELECT DISTINCT ON"),
        Some(ast::Distinct::All) | None => {}
    }
    if s.qualify.is_some()
        || !s.named_window.is_empty()
        || !s.sort_by.is_empty()
        || !s.lateral_views.is_empty()
    {
        return unsupported(at, "QUALIFY, WINDOW, SORT BY and LATERAL VIEW");
    }
    let from = plan_from(&s.from, catalog, at)?;
    let group_by: Vec<ast::Expr> = match &s.group_by {
        ast::GroupByExpr::Expressions(exprs, modifiers) => {
            if !modifiers.is_empty() {
                return unsupported(at, "GROUP BY modifiers (ROLLUP, CUBE, GROUPING SETS)");
            }
            exprs.clone()
        }
        ast::GroupByExpr::All(_) => return unsupported(at, "GROUP BY ALL"),
    };
    let mut aggs = Vec::new();
    for item in &s.projection {
        if let ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } =
            item
        {
            collect_aggregates(e, &mut aggs);
        }
    }
    if let Some(h) = &s.having {
        collect_aggregates(h, &mut aggs);
    }
    if group_by.is_empty() && aggs.is_empty() {
        if s.having.is_some() {
            return err(at, "HAVING without GROUP BY or aggregates");
        }
        if let Some((kind, ..)) = &from.window {
            return unsupported(at, &format!("a window table-valued function ({kind:?}) without GROUP BY window_start, window_end"));
        }
        let mut rel = from.rel;
        let scope = Scope::new(&rel.columns);
        let mut filter = match &s.selection {
            Some(w) => {
                let (f, t) = bind_expr(w, &scope)?;
                expect_bool(&t, w)?;
                Some(f)
            }
            None => None,
        };
        if matches!(rel.node, Node::Join { .. }) {
            if let Some(f) = filter.take() {
                rel = filtered(rel, f);
            }
        }
        if let Some(i) = s
            .projection
            .iter()
            .position(|i| rank::over_call(i).is_some())
        {
            // ROW_NUMBER() ranks the rows this query's FROM and WHERE give.
            let f = rank::over_call(&s.projection[i]).expect("found above");
            if let Some(f) = filter.take() {
                let project = (0..rel.columns.len()).map(Expr::Col).collect();
                let columns = rel.columns.clone();
                rel = calc(rel, Some(f), project, columns);
            }
            let ranked = rank::plan_rank(rel, f)?;
            let row_number = ranked.columns.len() - 1;
            let scope = Scope::new(&ranked.columns);
            let (project, columns) = projection(
                &s.projection,
                &scope,
                &ranked.columns,
                Some((i, row_number)),
            )?;
            return Ok(calc(ranked, None, project, columns));
        }
        // A filter on a rank's row number gives the ranks it keeps.
        if let Some(f) = filter.take() {
            (rel, filter) = rank::push_filter(rel, f)?;
        }
        let scope = Scope::new(&rel.columns);
        let (project, columns) = projection(&s.projection, &scope, &rel.columns, None)?;
        return Ok(calc(rel, filter, project, columns));
    }
    plan_aggregate(s, from, group_by, aggs)
}

/// `SELECT DISTINCT`: a grouping by every column without aggregates. A row is emitted when
/// its group appears (and retracted when a changelog retracts the group's last row), so over
/// an append-only input the result only appends. Its event time is no longer a time
/// attribute, as in Flink.
fn distinct(rel: Rel) -> Rel {
    let keys = rel.columns.len();
    let columns: Vec<Column> = rel
        .columns
        .iter()
        .map(|c| Column {
            time: match c.time {
                Time::Rowtime => Time::None,
                t => t,
            },
            ..c.clone()
        })
        .collect();
    let updating = rel.updating;
    Rel {
        node: Node::GroupAgg {
            input: Box::new(rel),
            keys,
            aggs: Vec::new(),
        },
        columns,
        updating,
    }
}

/// The select list's expressions and columns; `row_number`: the item that is `ROW_NUMBER()
/// OVER (…)` and the input column that holds its value (which `*` does not include).
fn projection(
    items: &[ast::SelectItem],
    scope: &Scope,
    input: &[Column],
    row_number: Option<(usize, usize)>,
) -> Result<(Vec<Expr>, Vec<Column>)> {
    let mut project = Vec::new();
    let mut columns = Vec::new();
    for (i, item) in items.iter().enumerate() {
        if let Some((_, col)) = row_number.filter(|(item, _)| *item == i) {
            let name = match item {
                ast::SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                _ => format!("EXPR${i}"),
            };
            project.push(Expr::Col(col));
            columns.push(Column {
                name,
                ..input[col].clone()
            });
            continue;
        }
        match item {
            ast::SelectItem::Wildcard(_) => {
                for (k, c) in input.iter().enumerate() {
                    if row_number.is_some_and(|(_, col)| col == k) {
                        continue;
                    }
                    if scope
                        .grouped
                        .is_some_and(|g| !g.keys.iter().chain(&g.aggs).any(|(_, x)| *x == k))
                    {
                        continue;
                    }
                    project.push(Expr::Col(k));
                    columns.push(c.clone());
                }
            }
            ast::SelectItem::QualifiedWildcard(kind, _) => {
                let q = match kind {
                    ast::SelectItemQualifiedWildcardKind::ObjectName(name) => {
                        name.to_string().replace(['`', '"'], "")
                    }
                    ast::SelectItemQualifiedWildcardKind::Expr(e) => {
                        return unsupported(e.span().start, "'expression.*'")
                    }
                };
                let before = project.len();
                for (k, c) in input.iter().enumerate() {
                    if c.qualifier.as_deref() == Some(q.as_str()) {
                        project.push(Expr::Col(k));
                        columns.push(c.clone());
                    }
                }
                if project.len() == before {
                    return err(
                        item.span().start,
                        format!("'{q}.*' names no table of the query"),
                    );
                }
            }
            ast::SelectItem::UnnamedExpr(e) | ast::SelectItem::ExprWithAlias { expr: e, .. } => {
                let (x, ty, time) = bind(e, scope)?;
                let name = match item {
                    ast::SelectItem::ExprWithAlias { alias, .. } => alias.value.clone(),
                    _ => item_name(e, i),
                };
                // A column keeps its time attribute, and so does PROCTIME() (the operator's own
                // clock); other expressions of a time column are plain timestamps.
                let time = match (&x, time) {
                    (Expr::Col(_), t) | (_, t @ Time::Proctime) => t,
                    _ => Time::None,
                };
                columns.push(Column {
                    name,
                    qualifier: None,
                    ty,
                    time,
                });
                project.push(x);
            }
            ast::SelectItem::ExprWithAliases { .. } => {
                return unsupported(item.span().start, "several aliases for one expression")
            }
        }
    }
    Ok((project, columns))
}

pub(super) fn calc(
    input: Rel,
    filter: Option<Expr>,
    project: Vec<Expr>,
    columns: Vec<Column>,
) -> Rel {
    let updating = input.updating;
    let identity = filter.is_none()
        && project.len() == input.columns.len()
        && project
            .iter()
            .enumerate()
            .all(|(i, e)| e.as_col() == Some(i));
    if identity {
        let mut rel = input;
        for (c, d) in rel.columns.iter_mut().zip(columns) {
            c.name = d.name;
            c.qualifier = d.qualifier;
        }
        return rel;
    }
    // A calc over a calc is one calc: the outer expressions read the inner ones directly,
    // as long as no computed inner expression would then be evaluated twice per row.
    if let Node::Calc {
        input: inner,
        filter: inner_filter,
        project: inner_project,
    } = &input.node
    {
        if fusable(inner_project, filter.as_ref(), &project) {
            let filter = match (
                inner_filter.clone(),
                filter.map(|f| f.substitute(inner_project)),
            ) {
                (Some(a), Some(b)) => Some(Expr::Bin(
                    BinOp::And,
                    Box::new(a),
                    Box::new(b),
                    SqlType::Boolean,
                )),
                (a, b) => a.or(b),
            };
            let project = project
                .iter()
                .map(|e| e.substitute(inner_project))
                .collect();
            return calc((**inner).clone(), filter, project, columns);
        }
    }
    let (input, filter, project) = prune_join(input, filter, project);
    Rel {
        node: Node::Calc {
            input: Box::new(input),
            filter,
            project,
        },
        columns,
        updating,
    }
}

/// A calc (`filter`, `project`) over a join whose columns it does not all read: each side of
/// the join is narrowed to the columns the calc, the keys, the join's condition and its time
/// bounds read (a calc over each side, which fuses into the side's own), so the join's state
/// holds no column nobody reads, as Flink's project-join transposition does. Returns the join
/// and the calc over its new columns.
fn prune_join(
    input: Rel,
    filter: Option<Expr>,
    project: Vec<Expr>,
) -> (Rel, Option<Expr>, Vec<Expr>) {
    let read = match &input.node {
        Node::Join {
            left,
            keys,
            condition,
            bounds,
            ..
        } => {
            let split = left.columns.len();
            let mut read = vec![false; input.columns.len()];
            let exprs = filter.iter().chain(&project).chain(condition);
            for c in exprs.flat_map(Expr::columns) {
                read[c] = true;
            }
            for &(l, r) in keys {
                read[l] = true;
                read[split + r] = true;
            }
            if let Some(b) = bounds {
                read[b.left] = true;
                read[split + b.right] = true;
            }
            read
        }
        _ => return (input, filter, project),
    };
    if read.iter().all(|&r| r) {
        return (input, filter, project);
    }
    let Node::Join {
        left,
        right,
        keys,
        kind,
        condition,
        bounds,
    } = input.node
    else {
        unreachable!("a join, matched above")
    };
    let split = left.columns.len();
    let kept: Vec<usize> = (0..read.len()).filter(|&i| read[i]).collect();
    // Old column → its index among the new columns (kept ones only).
    let mut index = vec![usize::MAX; read.len()];
    for (new, &old) in kept.iter().enumerate() {
        index[old] = new;
    }
    let moved: Vec<Expr> = index
        .iter()
        .map(|&i| match i {
            usize::MAX => Expr::Lit(Value::Null),
            i => Expr::Col(i),
        })
        .collect();
    let new_split = kept.iter().filter(|&&i| i < split).count();
    let narrow = |side: Rel, from: usize, to: usize| {
        let cols: Vec<usize> = kept
            .iter()
            .filter(|&&i| (from..to).contains(&i))
            .map(|&i| i - from)
            .collect();
        let columns = cols.iter().map(|&i| side.columns[i].clone()).collect();
        calc(
            side,
            None,
            cols.into_iter().map(Expr::Col).collect(),
            columns,
        )
    };
    let width = read.len();
    let join = Rel {
        node: Node::Join {
            left: Box::new(narrow(*left, 0, split)),
            right: Box::new(narrow(*right, split, width)),
            keys: keys
                .iter()
                .map(|&(l, r)| (index[l], index[split + r] - new_split))
                .collect(),
            kind,
            condition: condition.map(|c| c.substitute(&moved)),
            bounds: bounds.map(|b| TimeBounds {
                left: index[b.left],
                right: index[split + b.right] - new_split,
                ..b
            }),
        },
        columns: kept.iter().map(|&i| input.columns[i].clone()).collect(),
        updating: input.updating,
    };
    let filter = filter.map(|f| f.substitute(&moved));
    let project = project.iter().map(|e| e.substitute(&moved)).collect();
    (join, filter, project)
}

/// The group key that is a window's end, if a `GROUP BY` of `input` (its first `keys`
/// columns) has one and `input` only appends: its groups are complete when the watermark
/// passes their window, since the rows of a window all come before that watermark.
pub(super) fn final_at_window_end(input: &Rel, keys: usize) -> Option<usize> {
    if input.updating {
        return None;
    }
    window_end_key(input, keys)
}

/// The group key that is a window's end, if one is.
pub(super) fn window_end_key(input: &Rel, keys: usize) -> Option<usize> {
    input.columns[..keys]
        .iter()
        .position(|c| c.time == Time::WindowEnd)
}

/// Whether a calc (`filter`, `project`) over one projecting `inner` can be one calc: each
/// inner expression that is not a plain column, field or constant is read at most once.
fn fusable(inner: &[Expr], filter: Option<&Expr>, project: &[Expr]) -> bool {
    let mut reads = vec![0usize; inner.len()];
    for e in filter.into_iter().chain(project) {
        for c in e.columns() {
            if let Some(n) = reads.get_mut(c) {
                *n += 1;
            }
        }
    }
    inner
        .iter()
        .zip(reads)
        .all(|(e, n)| e.is_simple() || n <= 1)
}

fn collect_aggregates<'a>(e: &'a ast::Expr, out: &mut Vec<&'a ast::Function>) {
    use ast::Expr as A;
    match e {
        A::Function(f)
            if is_aggregate(&function_name(f))
                && !out.iter().any(|g| g.to_string() == f.to_string()) =>
        {
            out.push(f)
        }
        A::Function(f) if is_aggregate(&function_name(f)) => {}
        A::Function(f) => {
            if let ast::FunctionArguments::List(list) = &f.args {
                for a in &list.args {
                    if let ast::FunctionArg::Unnamed(ast::FunctionArgExpr::Expr(x)) = a {
                        collect_aggregates(x, out);
                    }
                }
            }
        }
        A::BinaryOp { left, right, .. } => {
            collect_aggregates(left, out);
            collect_aggregates(right, out);
        }
        A::UnaryOp { expr, .. }
        | A::Nested(expr)
        | A::Cast { expr, .. }
        | A::IsNull(expr)
        | A::IsNotNull(expr) => collect_aggregates(expr, out),
        A::Case {
            operand,
            conditions,
            else_result,
            ..
        } => {
            operand.iter().for_each(|o| collect_aggregates(o, out));
            for w in conditions {
                collect_aggregates(&w.condition, out);
                collect_aggregates(&w.result, out);
            }
            else_result.iter().for_each(|o| collect_aggregates(o, out));
        }
        _ => {}
    }
}

const WINDOW_COLUMNS: [&str; 3] = ["window_start", "window_end", "window_time"];

/// A legacy group window in GROUP BY — `TUMBLE(time, size)`, `HOP(time, slide, size)`,
/// `SESSION(time, gap)` — planned as the window table-valued function it stands for.
struct GroupWindow {
    /// TUMBLE, HOP or SESSION.
    name: String,
    /// Its arguments as written, which its `…_START`, `…_END`, `…_ROWTIME` and `…_PROCTIME`
    /// functions in SELECT repeat.
    args: String,
    window: WindowKind,
    /// The event-time column (None: processing time).
    time_col: Option<usize>,
}

fn group_window(g: &ast::Expr, scope: &Scope) -> Result<Option<GroupWindow>> {
    let ast::Expr::Function(f) = g else {
        return Ok(None);
    };
    let name = function_name(f);
    if !matches!(name.as_str(), "TUMBLE" | "HOP" | "SESSION" | "CUMULATE") {
        return Ok(None);
    }
    let at = f.name.span().start;
    if name == "CUMULATE" {
        // As in Flink: a window table-valued function only, no group window.
        return unsupported(at, "CUMULATE in GROUP BY (use TABLE(CUMULATE(TABLE t, DESCRIPTOR(time_column), step, max_size)) in FROM)");
    }
    let (args, _, _) = function_args(f)?;
    let Some((time, rest)) = args.split_first() else {
        return err(at, format!("{name} needs a time column and intervals"));
    };
    let time_col = match bind(time, scope)? {
        (Expr::Col(i), _, Time::Rowtime) => Some(i),
        (_, _, Time::Proctime) => None,
        _ => {
            return err(
                time.span().start,
                format!(
                    "'{time}' is not a time attribute (a column with a WATERMARK, or PROCTIME())"
                ),
            )
        }
    };
    let intervals = rest
        .iter()
        .map(|a| match a {
            ast::Expr::Interval(i) => interval_ms(i),
            other => err(
                other.span().start,
                format!("{name} takes INTERVAL arguments after the time column"),
            ),
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(Some(GroupWindow {
        window: window_kind(&name, &intervals, at)?,
        name,
        args: f.args.to_string(),
        time_col,
    }))
}

/// The name a legacy window property (`TUMBLE_START(time, size)`, …) has in a grouped scope,
/// whatever the case it is written in.
fn group_window_property(e: &ast::Expr) -> Option<String> {
    let ast::Expr::Function(f) = e else {
        return None;
    };
    let name = function_name(f);
    let (window, property) = name.split_once('_')?;
    let known = matches!(window, "TUMBLE" | "HOP" | "SESSION")
        && matches!(property, "START" | "END" | "ROWTIME" | "PROCTIME");
    known.then(|| format!("{name}{}", f.args))
}

fn plan_aggregate(
    s: &ast::Select,
    mut from: From,
    mut group_by: Vec<ast::Expr>,
    aggs: Vec<&ast::Function>,
) -> Result<Rel> {
    let at = s.select_token.0.span.start;
    let scope = Scope::new(&from.rel.columns);
    let mut legacy = None;
    for (i, g) in group_by.iter().enumerate() {
        if let Some(w) = group_window(g, &scope)? {
            if from.window.is_some() || legacy.is_some() {
                return err(g.span().start, "a query groups by one window");
            }
            legacy = Some((i, w));
        }
    }
    let mut window_keys = Vec::new();
    if let Some((i, w)) = &legacy {
        group_by.remove(*i);
        // A session is per key: the other group keys, which must be columns.
        let mut partition = Vec::new();
        if let WindowKind::Session { .. } = w.window {
            for g in &group_by {
                match bind_expr(g, &scope)? {
                    (Expr::Col(c), _) => partition.push(c),
                    _ => {
                        return err(
                            g.span().start,
                            "a SESSION group window groups by columns only",
                        )
                    }
                }
            }
        }
        from.window = Some((w.window.clone(), w.time_col, partition));
        window_keys = vec!["window_start".to_string(), "window_end".to_string()];
    }
    let rel = from.rel;
    let scope = Scope::new(&rel.columns);
    // The aggregation's input: keys, the aggregates' arguments and filters, the time column.
    let mut input_exprs: Vec<Expr> = Vec::new();
    let mut input_cols: Vec<Column> = Vec::new();
    let mut key_texts: Vec<String> = Vec::new();
    for g in &group_by {
        let name = match g {
            ast::Expr::Identifier(id) => Some(id.value.as_str()),
            _ => None,
        };
        if let (Some(n), Some(_)) = (name, &from.window) {
            // window_time is the window's too (a cascaded window aggregation groups by it).
            if WINDOW_COLUMNS.contains(&n) && scope.find(n, g.span().start)?.is_none() {
                window_keys.push(n.to_string());
                continue;
            }
        }
        let (e, ty, time) = bind(g, &scope)?;
        // A window's end stays one as a group key: the groups of a window end with it.
        let time = match (&e, time) {
            (Expr::Col(_), Time::WindowEnd) => Time::WindowEnd,
            _ => Time::None,
        };
        input_cols.push(Column {
            name: item_name(g, input_cols.len()),
            qualifier: None,
            ty,
            time,
        });
        input_exprs.push(e);
        key_texts.push(g.to_string());
    }
    if let Some((kind, _, partition)) = &from.window {
        let by = |name: &str| window_keys.iter().filter(|k| *k == name).count();
        if by("window_start") != 1 || by("window_end") != 1 || by("window_time") > 1 {
            return err(
                at,
                "a window aggregation must GROUP BY window_start, window_end",
            );
        }
        if let WindowKind::Session { .. } = kind {
            // The session's partition keys must be the group keys.
            let keys: Vec<usize> = input_exprs.iter().filter_map(Expr::as_col).collect();
            if keys.len() != input_exprs.len()
                || keys.iter().any(|k| !partition.contains(k))
                || partition.iter().any(|p| !keys.contains(p))
            {
                return err(at, "a SESSION window aggregation must GROUP BY its PARTITION BY columns (and window_start, window_end)");
            }
        }
    }
    let keys = input_exprs.len();
    let mut calls = Vec::new();
    for f in &aggs {
        let fat = f.name.span().start;
        let name = function_name(f);
        let (args, distinct, star) = function_args(f)?;
        let kind = match (name.as_str(), star, args.len()) {
            ("COUNT", true, 0) => AggKind::CountStar,
            ("COUNT", false, 1) => AggKind::Count,
            ("SUM", false, 1) => AggKind::Sum,
            ("MIN", false, 1) => AggKind::Min,
            ("MAX", false, 1) => AggKind::Max,
            ("AVG", false, 1) => AggKind::Avg,
            _ => return err(fat, format!("{name} takes one argument")),
        };
        if distinct && kind != AggKind::Count {
            return unsupported(fat, &format!("{name}(DISTINCT …)"));
        }
        if f.over.is_some() {
            return err(
                fat,
                format!("{name}() OVER (…) is not supported (OVER aggregations; ROW_NUMBER(), RANK() and DENSE_RANK() OVER (…) are, for Top-N and deduplication)"),
            );
        }
        let (arg, arg_ty) = match args.first() {
            Some(a) => {
                let (e, t) = bind_expr(a, &scope)?;
                input_cols.push(Column {
                    name: format!("$arg{}", input_exprs.len()),
                    qualifier: None,
                    ty: t.clone(),
                    time: Time::None,
                });
                input_exprs.push(e);
                (Some(input_exprs.len() - 1), Some(t))
            }
            None => (None, None),
        };
        let filter = match &f.filter {
            Some(c) => {
                let (e, t) = bind_expr(c, &scope)?;
                expect_bool(&t, c)?;
                input_cols.push(Column {
                    name: format!("$filter{}", input_exprs.len()),
                    qualifier: None,
                    ty: t,
                    time: Time::None,
                });
                input_exprs.push(e);
                Some(input_exprs.len() - 1)
            }
            None => None,
        };
        let ty = result_type(kind, arg_ty.as_ref()).map_err(|m| SqlError::at(fat, m))?;
        calls.push(AggCall {
            kind,
            distinct,
            arg,
            filter,
            ty,
        });
    }
    let filter = match &s.selection {
        Some(w) => {
            let (f, t) = bind_expr(w, &scope)?;
            expect_bool(&t, w)?;
            Some(f)
        }
        None => None,
    };
    // A WHERE over a join gives it its keys and filters its sides.
    let (rel, filter) = match filter {
        Some(f) if matches!(rel.node, Node::Join { .. }) => (filtered(rel, f), None),
        f => (rel, f),
    };
    let (node, mut columns, updating) = match &from.window {
        Some((kind, time_col, _)) => {
            if let Some(t) = time_col {
                input_exprs.push(Expr::Col(*t));
                input_cols.push(Column {
                    name: "$time".into(),
                    qualifier: None,
                    ty: rel.columns[*t].ty.clone(),
                    time: Time::Rowtime,
                });
            }
            let input = calc(rel, filter, input_exprs, input_cols.clone());
            let mut columns: Vec<Column> = input_cols[..keys].to_vec();
            for name in WINDOW_COLUMNS {
                columns.push(Column {
                    name: name.into(),
                    qualifier: None,
                    ty: SqlType::Timestamp {
                        ltz: time_col.is_none(),
                    },
                    time: match (name, time_col) {
                        ("window_time", Some(_)) => Time::Rowtime,
                        ("window_end", Some(_)) => Time::WindowEnd,
                        _ => Time::None,
                    },
                });
            }
            let node = Node::WindowAgg {
                input: Box::new(input),
                window: kind.clone(),
                proctime: time_col.is_none(),
                keys,
                aggs: calls.clone(),
            };
            (node, columns, false)
        }
        None => {
            let input = calc(rel, filter, input_exprs, input_cols.clone());
            let columns: Vec<Column> = input_cols[..keys].to_vec();
            let updating = final_at_window_end(&input, keys).is_none();
            (
                Node::GroupAgg {
                    input: Box::new(input),
                    keys,
                    aggs: calls.clone(),
                },
                columns,
                updating,
            )
        }
    };
    let mut grouped = Grouped::default();
    for (i, t) in key_texts.iter().enumerate() {
        grouped.keys.push((t.clone(), i));
    }
    // Group keys that are plain columns are nameable by their column name too.
    for (i, c) in columns.iter().enumerate().take(keys) {
        grouped.keys.push((c.name.clone(), i));
    }
    if from.window.is_some() {
        for (k, name) in WINDOW_COLUMNS.iter().enumerate() {
            grouped.keys.push((name.to_string(), keys + k));
        }
    }
    if let Some((_, w)) = &legacy {
        for (property, k) in [("START", 0), ("END", 1), ("ROWTIME", 2), ("PROCTIME", 2)] {
            grouped
                .keys
                .push((format!("{}_{property}{}", w.name, w.args), keys + k));
        }
    }
    let first_agg = columns.len();
    for (k, (f, call)) in aggs.iter().zip(&calls).enumerate() {
        grouped.aggs.push((f.to_string(), first_agg + k));
        columns.push(Column {
            name: format!("EXPR${k}"),
            qualifier: None,
            ty: call.ty.clone(),
            time: Time::None,
        });
    }
    let agg_rel = Rel {
        node,
        columns: columns.clone(),
        updating,
    };
    let scope = Scope {
        columns: &columns,
        grouped: Some(&grouped),
    };
    let having = match &s.having {
        Some(h) => {
            let (f, t) = bind_expr(h, &scope)?;
            expect_bool(&t, h)?;
            Some(f)
        }
        None => None,
    };
    let (project, out_columns) = projection(&s.projection, &scope, &columns, None)?;
    Ok(calc(agg_rel, having, project, out_columns))
}
