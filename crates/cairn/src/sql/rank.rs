//! Top-N and deduplication: `ROW_NUMBER()`, `RANK()` or `DENSE_RANK()` `OVER (PARTITION BY …
//! ORDER BY …)` in a query, kept to some ranks by a filter on the rank in the enclosing query
//! (`WHERE rn <= N`, `rn = 1`), planned as one [`Node::Rank`] and run as a keyed operator whose
//! state is each partition's rows in rank order.
//!
//! The operator emits a changelog of ranked rows. With `ROW_NUMBER()` a row that enters a kept
//! rank is `+I` (or `+U` after the `-U` of the row that held the rank), a row that leaves the
//! kept ranks is `-D`. `RANK()` (ties share a rank, the next rank skips) and `DENSE_RANK()`
//! (ties share a rank, the next does not skip) may give several rows one rank, so their rows
//! are not updates of a rank: a kept (row, rank) that changes is `-D` of the old and `+I` of
//! the new. Over an append-only input only the rows ranked up to `N` are kept (a row below
//! them can never rise); over a changelog every row is kept, since a retraction lets the next
//! one rise.

use std::cmp::Ordering;
use std::sync::Arc;
use std::time::Duration;

use sqlparser::ast::{self, Spanned};
use sqlparser::tokenizer::Location;

use super::expr::{BinOp, Expr};
use super::plan::{and_all, bind_expr, Column, Node, Rel, Scope, Time};
use super::types::{Row, RowKind, SqlType, Value};
use super::SqlError;
use crate::api::{Collector, KeyedProcessFunction};
use crate::error::TaskResult;
use crate::state::{KeyedContext, TimeDomain, ValueState};

type Result<T> = std::result::Result<T, SqlError>;

/// The `OVER` call of a select item, if it has one.
pub(super) fn over_call(item: &ast::SelectItem) -> Option<&ast::Function> {
    match item {
        ast::SelectItem::UnnamedExpr(ast::Expr::Function(f))
        | ast::SelectItem::ExprWithAlias {
            expr: ast::Expr::Function(f),
            ..
        } if f.over.is_some() => Some(f),
        _ => None,
    }
}

/// How a rank numbers rows equal in the sort order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RankKind {
    /// `ROW_NUMBER()`: 1, 2, 3, … whatever the ties (in their order of arrival).
    RowNumber,
    /// `RANK()`: ties share a rank and the next rank skips (1, 1, 3).
    Rank,
    /// `DENSE_RANK()`: ties share a rank and the next does not skip (1, 1, 2).
    DenseRank,
}

impl RankKind {
    fn of(name: &str) -> Option<RankKind> {
        match name {
            "ROW_NUMBER" => Some(RankKind::RowNumber),
            "RANK" => Some(RankKind::Rank),
            "DENSE_RANK" => Some(RankKind::DenseRank),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RankKind::RowNumber => "ROW_NUMBER",
            RankKind::Rank => "RANK",
            RankKind::DenseRank => "DENSE_RANK",
        }
    }
}

/// `rel` ranked by the `ROW_NUMBER()`, `RANK()` or `DENSE_RANK()` `OVER (…)` call `f`: its
/// columns and then the rank. The ranks it keeps come later, from a filter of the enclosing
/// query ([`push_filter`]).
pub(super) fn plan_rank(rel: Rel, f: &ast::Function) -> Result<Rel> {
    let at = f.name.span().start;
    let name = f.name.to_string().to_uppercase();
    let Some(kind) = RankKind::of(&name) else {
        return Err(SqlError::at(
            at,
            format!("{name}() OVER (…) is not supported (only ROW_NUMBER(), RANK() and DENSE_RANK() for Top-N and deduplication; no OVER aggregations)"),
        ));
    };
    if !matches!(&f.args, ast::FunctionArguments::None)
        && !matches!(&f.args, ast::FunctionArguments::List(l) if l.args.is_empty())
    {
        return Err(SqlError::at(at, format!("{name}() takes no arguments")));
    }
    let Some(ast::WindowType::WindowSpec(spec)) = &f.over else {
        return Err(SqlError::at(
            at,
            "a named window (OVER w) is not supported: write OVER (PARTITION BY … ORDER BY …)",
        ));
    };
    if spec.window_frame.is_some() {
        return Err(SqlError::at(
            at,
            format!("{name}() OVER (…) takes no window frame (ROWS/RANGE)"),
        ));
    }
    let scope = Scope::new(&rel.columns);
    let column = |e: &ast::Expr| {
        named_column(&scope, e, |e| {
            format!("PARTITION BY and ORDER BY of {name}() must name columns, not '{e}' (compute it in a subquery)")
        })
    };
    let partition = spec
        .partition_by
        .iter()
        .map(column)
        .collect::<Result<Vec<_>>>()?;
    if spec.order_by.is_empty() {
        return Err(SqlError::at(
            at,
            format!("{name}() OVER (…) needs an ORDER BY"),
        ));
    }
    let order = spec
        .order_by
        .iter()
        .map(|o| sort_key(o, &column))
        .collect::<Result<Vec<_>>>()?;
    Ok(ranked_rel(rel, kind, partition, order, None, at))
}

/// The column `e` names in `scope`; an expression that is not a column is the error `refusal`
/// words.
fn named_column(
    scope: &Scope,
    e: &ast::Expr,
    refusal: impl Fn(&ast::Expr) -> String,
) -> Result<usize> {
    let (x, _) = bind_expr(e, scope)?;
    x.as_col()
        .ok_or_else(|| SqlError::at(e.span().start, refusal(e)))
}

/// One `ORDER BY` item: the column it names (`column`) and whether it is descending.
fn sort_key(
    o: &ast::OrderByExpr,
    column: &dyn Fn(&ast::Expr) -> Result<usize>,
) -> Result<(usize, bool)> {
    let desc = match &o.options.sort {
        None | Some(ast::OrderBySort::Asc) => false,
        Some(ast::OrderBySort::Desc) => true,
        Some(ast::OrderBySort::Using(_)) => {
            return Err(SqlError::at(
                o.expr.span().start,
                "ORDER BY … USING is not supported",
            ))
        }
    };
    // Flink sorts NULL first ascending and last descending; only that order is built.
    if o.options.nulls_first.is_some_and(|first| first == desc) {
        return Err(SqlError::at(
            o.expr.span().start,
            format!(
                "NULLS {} is not supported here (NULL sorts first ascending, last descending)",
                if desc { "FIRST" } else { "LAST" }
            ),
        ));
    }
    Ok((column(&o.expr)?, desc))
}

/// `rel` ranked: its columns (no longer time attributes), then the rank.
fn ranked_rel(
    rel: Rel,
    kind: RankKind,
    partition: Vec<usize>,
    order: Vec<(usize, bool)>,
    range: Option<(u64, u64)>,
    at: Location,
) -> Rel {
    let mut columns: Vec<Column> = rel
        .columns
        .iter()
        .map(|c| Column {
            time: Time::None,
            ..c.clone()
        })
        .collect();
    columns.push(Column {
        name: "$row_number".into(),
        qualifier: None,
        ty: SqlType::BigInt,
        time: Time::None,
    });
    Rel {
        columns,
        updating: true,
        node: Node::Rank {
            input: Box::new(rel),
            kind,
            partition,
            order,
            range,
            at,
        },
    }
}

/// A query's `[ORDER BY …] LIMIT n [OFFSET m]` over `rel`: a Top-N of all its rows (one
/// partition, so one subtask keeps it, as in Flink), ranks `m + 1 ..= m + n`, a changelog.
/// Without `ORDER BY` every row ties, so rows rank in their order of arrival: over an
/// append-only input the first `m + n` rows are kept and the result only appends.
pub(super) fn order_limit(
    rel: Rel,
    order_by: &[ast::OrderByExpr],
    limit: u64,
    offset: u64,
    at: Location,
) -> Result<Rel> {
    let scope = Scope::new(&rel.columns);
    let column = |e: &ast::Expr| {
        named_column(&scope, e, |e| {
            format!("ORDER BY … LIMIT must name columns of the query, not '{e}' (select it)")
        })
    };
    let order = order_by
        .iter()
        .map(|o| sort_key(o, &column))
        .collect::<Result<Vec<_>>>()?;
    if limit == 0 {
        return Err(SqlError::at(at, "LIMIT 0 keeps no row"));
    }
    let width = rel.columns.len();
    let range = Some((offset + 1, offset.saturating_add(limit)));
    let appends = order.is_empty() && !rel.updating;
    let mut ranked = ranked_rel(rel, RankKind::RowNumber, Vec::new(), order, range, at);
    ranked.updating = !appends;
    // The row number is not a column of the query.
    let columns = ranked.columns[..width].to_vec();
    let project = (0..width).map(Expr::Col).collect();
    Ok(super::plan::calc(ranked, None, project, columns))
}

/// The column of `rel` that holds an unbounded rank's row number, if `rel` is one (or a
/// projection of one without a filter).
fn row_number_column(rel: &Rel) -> Option<usize> {
    let unbounded = |r: &Rel| match &r.node {
        Node::Rank {
            input, range: None, ..
        } => Some(input.columns.len()),
        _ => None,
    };
    match &rel.node {
        Node::Calc {
            input,
            filter: None,
            project,
        } => {
            let rn = unbounded(input)?;
            project.iter().position(|e| e.as_col() == Some(rn))
        }
        _ => unbounded(rel),
    }
}

/// A filter of the query over a rank: its conditions on the row number (`rn <= N`, `rn < N`,
/// `rn = N`, `rn >= M`, `rn > M`, `rn BETWEEN M AND N`) become the ranks the rank keeps; the
/// rest is returned. A rank left without an upper bound is refused when it is built.
pub(super) fn push_filter(mut rel: Rel, filter: Expr) -> Result<(Rel, Option<Expr>)> {
    let Some(rn) = row_number_column(&rel) else {
        return Ok((rel, Some(filter)));
    };
    let mut parts = Vec::new();
    super::plan::conjuncts(filter, &mut parts);
    let (mut start, mut end): (i64, Option<i64>) = (1, None);
    let mut rest = Vec::new();
    for c in parts {
        match bound(&c, rn) {
            Some((op, k)) => match op {
                BinOp::Le => end = Some(end.map_or(k, |e| e.min(k))),
                BinOp::Lt => end = Some(end.map_or(k - 1, |e| e.min(k - 1))),
                BinOp::Ge => start = start.max(k),
                BinOp::Gt => start = start.max(k + 1),
                _ => {
                    start = start.max(k);
                    end = Some(end.map_or(k, |e| e.min(k)));
                }
            },
            None => rest.push(c),
        }
    }
    let Some(end) = end else {
        // No bound on the row number: the filter stays a filter, and the unbounded rank is
        // refused when it is built.
        return Ok((rel, and_all(rest)));
    };
    let ranked: &mut Rel = match &mut rel.node {
        Node::Calc { input, .. } => input,
        _ => &mut rel,
    };
    if let Node::Rank { range, at, .. } = &mut ranked.node {
        if start > end || end < 1 {
            return Err(SqlError::at(
                *at,
                format!("the filter on the row number keeps no rank ({start} to {end})"),
            ));
        }
        *range = Some((start.max(1) as u64, end as u64));
    }
    // Bounded to the first row by processing time, a rank may only append.
    let updating = !appends_only(ranked);
    ranked.updating = updating;
    rel.updating = updating;
    Ok((rel, and_all(rest)))
}

/// `rn op k` (or `k op rn`, turned around) with an integer `k`.
fn bound(c: &Expr, rn: usize) -> Option<(BinOp, i64)> {
    let Expr::Bin(op, a, b, _) = c else {
        return None;
    };
    let lit = |e: &Expr| match e {
        Expr::Lit(Value::Int(k)) => Some(*k),
        _ => None,
    };
    let flipped = |op: BinOp| match op {
        BinOp::Lt => BinOp::Gt,
        BinOp::Le => BinOp::Ge,
        BinOp::Gt => BinOp::Lt,
        BinOp::Ge => BinOp::Le,
        other => other,
    };
    if !matches!(
        op,
        BinOp::Le | BinOp::Lt | BinOp::Ge | BinOp::Gt | BinOp::Eq
    ) {
        return None;
    }
    match (a.as_col(), b.as_col()) {
        (Some(c), _) if c == rn => lit(b).map(|k| (*op, k)),
        (_, Some(c)) if c == rn => lit(a).map(|k| (flipped(*op), k)),
        _ => None,
    }
}

/// Whether a rank keeps only the first row of each partition by a time attribute (a
/// deduplication), and whether by its last (`DESC`: the newest row wins, also over an equal
/// time).
pub(super) fn dedup(rel: &Rel) -> Option<bool> {
    let Node::Rank {
        input,
        kind: RankKind::RowNumber,
        order,
        range: Some((1, 1)),
        ..
    } = &rel.node
    else {
        return None;
    };
    match order.as_slice() {
        [(c, desc)] if matches!(input.columns[*c].time, Time::Rowtime | Time::Proctime) => {
            Some(*desc)
        }
        _ => None,
    }
}

/// Whether a rank's output only appends: the first row by processing time of an append-only
/// input never changes.
pub(super) fn appends_only(rel: &Rel) -> bool {
    let Node::Rank { input, order, .. } = &rel.node else {
        return false;
    };
    dedup(rel) == Some(false) && !input.updating && input.columns[order[0].0].time == Time::Proctime
}

/// The keyed operator of a rank: per partition, its rows in rank order.
#[derive(Clone)]
pub(super) struct RankFn {
    pub kind: RankKind,
    /// The partition column that is a window's end, if one is: a partition is dropped when
    /// the watermark passes its window (a window Top-N).
    pub expire: Option<usize>,
    /// The sort columns, each descending or not.
    pub order: Arc<[(usize, bool)]>,
    /// The first and last rank kept (1-based, inclusive).
    pub range: (u64, u64),
    /// Whether a row equal in the sort order to kept ones goes before them (the newest of a
    /// deduplication by `DESC` time).
    pub newest_first: bool,
    /// Whether every row is kept, not only the top ones (the input is a changelog).
    pub keep_all: bool,
    pub ttl: Option<Duration>,
    pub state: Option<ValueState<Vec<Vec<Value>>>>,
}

pub(super) const RANK_STATE: &str = "sql.rank";

impl RankFn {
    fn compare(&self, a: &[Value], b: &[Value]) -> Ordering {
        for &(c, desc) in self.order.iter() {
            let o = a[c].compare(&b[c]);
            let o = if desc { o.reverse() } else { o };
            if o != Ordering::Equal {
                return o;
            }
        }
        Ordering::Equal
    }
}

/// `values` with its rank appended.
fn ranked(values: &[Value], rank: usize, kind: RowKind) -> Row {
    let mut v = Vec::with_capacity(values.len() + 1);
    v.extend_from_slice(values);
    v.push(Value::Int(rank as i64 + 1));
    Row { kind, values: v }
}

impl RankFn {
    /// The rank of each row of `rows` (in rank order), by this rank's kind.
    fn ranks(&self, rows: &[Vec<Value>]) -> Vec<u64> {
        let mut ranks: Vec<u64> = Vec::with_capacity(rows.len());
        for (i, r) in rows.iter().enumerate() {
            let tie = i > 0 && self.compare(&rows[i - 1], r) == Ordering::Equal;
            let rank = match (self.kind, ranks.last()) {
                (RankKind::RowNumber, _) | (_, None) => i as u64 + 1,
                (_, Some(&previous)) if tie => previous,
                (RankKind::Rank, _) => i as u64 + 1,
                (RankKind::DenseRank, Some(&previous)) => previous + 1,
            };
            ranks.push(rank);
        }
        ranks
    }

    /// The rows of `rows` in the kept ranks, with their ranks.
    fn kept(&self, rows: &[Vec<Value>]) -> Vec<(Vec<Value>, u64)> {
        let (first, last) = self.range;
        rows.iter()
            .zip(self.ranks(rows))
            .take_while(|(_, rank)| *rank <= last)
            .filter(|(_, rank)| *rank >= first)
            .map(|(r, rank)| (r.clone(), rank))
            .collect()
    }

    /// [`KeyedProcessFunction::process`] of `RANK()` and `DENSE_RANK()`, whose ranks ties
    /// share: the kept (row, rank) pairs before and after the row are compared, and each
    /// that went is `-D`, each that came `+I`.
    fn process_tied(
        &self,
        row: Row,
        state: &ValueState<Vec<Vec<Value>>>,
        ctx: &mut KeyedContext<Vec<Value>>,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        let rows = state.get_mut(ctx, Vec::new)?;
        let before = self.kept(rows);
        if row.kind.is_addition() {
            let at = rows.partition_point(|r| self.compare(r, &row.values) != Ordering::Greater);
            rows.insert(at, row.values);
            if !self.keep_all {
                // Over an append-only input a row ranked below the kept ranks never rises.
                let keep = self
                    .ranks(rows)
                    .iter()
                    .take_while(|&&r| r <= self.range.1)
                    .count();
                rows.truncate(keep);
            }
        } else if let Some(at) = rows.iter().position(|r| *r == row.values) {
            rows.remove(at);
        }
        let mut after = self.kept(rows);
        if rows.is_empty() {
            state.clear(ctx)?;
        }
        for (values, rank) in before {
            match after.iter().position(|a| a.0 == values && a.1 == rank) {
                Some(i) => {
                    after.swap_remove(i);
                }
                None => out.collect(ranked(&values, rank as usize - 1, RowKind::Delete)),
            }
        }
        for (values, rank) in after {
            out.collect(ranked(&values, rank as usize - 1, RowKind::Insert));
        }
        Ok(())
    }
}

impl KeyedProcessFunction<Vec<Value>, Row, Row> for RankFn {
    fn open(&mut self, ctx: &mut KeyedContext<Vec<Value>>) -> TaskResult {
        self.state = Some(super::build::value_state(ctx, RANK_STATE, self.ttl)?);
        Ok(())
    }

    fn process(
        &mut self,
        row: Row,
        ctx: &mut KeyedContext<Vec<Value>>,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        let Some(state) = self.state.clone() else {
            return Ok(());
        };
        if let Some(c) = self.expire {
            if state.value(ctx)?.is_none() {
                super::build::expire_with_window(&row.values[c], ctx)?;
            }
        }
        if self.kind != RankKind::RowNumber {
            return self.process_tied(row, &state, ctx, out);
        }
        let (first, last) = (self.range.0 as usize - 1, self.range.1 as usize);
        let rows = state.get_mut(ctx, Vec::new)?;
        // Where the row goes (an addition) or which row it takes back (a retraction).
        let at = if row.kind.is_addition() {
            let at = if self.newest_first {
                rows.partition_point(|r| self.compare(r, &row.values) == Ordering::Less)
            } else {
                rows.partition_point(|r| self.compare(r, &row.values) != Ordering::Greater)
            };
            if !self.keep_all && at >= last {
                return Ok(());
            }
            Some(at)
        } else {
            rows.iter().position(|r| *r == row.values)
        };
        let Some(at) = at else {
            // A retraction of a row never kept.
            if rows.is_empty() {
                state.clear(ctx)?;
            }
            return Ok(());
        };
        // The kept ranks from `at` on change; everything before stays.
        let from = at.max(first);
        let before: Vec<Vec<Value>> = rows
            .get(from..rows.len().min(last))
            .unwrap_or_default()
            .to_vec();
        if row.kind.is_addition() {
            rows.insert(at, row.values);
            if !self.keep_all {
                rows.truncate(last);
            }
        } else {
            rows.remove(at);
        }
        let after = rows.get(from..rows.len().min(last)).unwrap_or_default();
        for i in 0..before.len().max(after.len()) {
            let rank = from + i;
            match (before.get(i), after.get(i)) {
                (Some(a), Some(b)) if a == b => {}
                (Some(a), Some(b)) => {
                    out.collect(ranked(a, rank, RowKind::UpdateBefore));
                    out.collect(ranked(b, rank, RowKind::UpdateAfter));
                }
                (Some(a), None) => out.collect(ranked(a, rank, RowKind::Delete)),
                (None, Some(b)) => out.collect(ranked(b, rank, RowKind::Insert)),
                (None, None) => {}
            }
        }
        if rows.is_empty() {
            state.clear(ctx)?;
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        _time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<Vec<Value>>,
        _out: &mut Collector<Row>,
    ) -> TaskResult {
        match &self.state {
            Some(state) => state.clear(ctx),
            None => Ok(()),
        }
    }
}

/// The location of a rank, for its errors.
pub(super) fn unbounded_error(kind: RankKind, at: Location) -> SqlError {
    SqlError::at(
        at,
        format!("{}() needs a filter on its result in the enclosing query (WHERE rn <= N, or rn = 1 to deduplicate): a Top-N without a bound is not supported", kind.name()),
    )
}
