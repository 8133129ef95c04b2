//! A planned script made into a job graph: each relation becomes DataStream operators whose
//! uids derive from the plan (the sink's table, the operator's kind and a digest of it and
//! everything it reads), and `EXPLAIN` prints the same tree.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::api::{
    AggregateFunction, Collector, DataStream, JobGraph, KeyedCoProcessFunction,
    KeyedProcessFunction, ProcessFunction, StreamEnv, TimeWindow, WindowAssigner,
};
use crate::error::{TaskError, TaskResult};
use crate::state::keygroup::{KeyEncoder, StableKey};
use crate::state::{
    KeyedContext, MapState, OperatorStateStore, StateTtlConfig, TimeDomain, ValueState,
};

use super::agg::{Acc, AggCall};
use super::calc::Calc;
use super::connectors;
use super::expr::Expr;
use super::parse::{parse_script, Insert, Statement};
use super::plan::{
    self, coerce, plan_query, Catalog, JoinKind, Node, Rel, Time, TimeBounds, WindowKind,
};
use super::rank;
use super::types::{Row, RowKind, SqlType, Value};
use super::SqlError;

type Result<T> = std::result::Result<T, SqlError>;

/// The planner options (`SET 'table.…'`) cairn knows.
const TABLE_OPTIONS: &[&str] = &["table.exec.state.ttl"];

/// A compiled script: its job graph and the plan `EXPLAIN` prints.
pub struct Compiled {
    /// The job graph.
    pub graph: JobGraph,
    /// The plan as text.
    pub plan: String,
    /// Whether the script asked for `EXPLAIN` (print the plan, run nothing).
    pub explain: bool,
    /// How many records the sources read in all, if every source's count is known.
    pub source_records: Option<u64>,
}

/// Compiles a script into a job graph; `seed` seeds generated tables (`nexmark`, `datagen`).
pub fn compile(script: &str, seed: u64) -> Result<Compiled> {
    let statements = parse_script(script)?;
    let mut catalog = Catalog::default();
    let mut ttl = None;
    let mut job: Vec<Insert> = Vec::new();
    let mut print_query = None;
    let mut explain = false;
    let mut job_at = None;
    for s in statements {
        let s = match s {
            Statement::Explain(inner) => {
                explain = true;
                *inner
            }
            other => other,
        };
        match s {
            Statement::CreateTable(def) => catalog.add_table(*def)?,
            Statement::CreateView { name, query, at } => {
                if catalog.tables.contains_key(&name) || catalog.views.contains_key(&name) {
                    return Err(SqlError::at(at, format!("view '{name}' is defined twice")));
                }
                plan_query(&query, &catalog)?;
                catalog.views.insert(name, query);
            }
            Statement::Set { key, value, at } => {
                if key.starts_with("table.") {
                    if !TABLE_OPTIONS.contains(&key.as_str()) {
                        return Err(SqlError::at(
                            at,
                            format!(
                                "planner option '{key}' is not supported (supported: {})",
                                TABLE_OPTIONS.join(", ")
                            ),
                        ));
                    }
                    let d = crate::config::parse_duration(&value)
                        .map_err(|e| SqlError::at(at, format!("'{key}': {e}")))?;
                    ttl = (!d.is_zero()).then_some(d);
                }
            }
            Statement::Insert(insert) => {
                if let Some(prev) = job_at.replace(insert.at) {
                    return Err(several_jobs(prev));
                }
                job.push(insert);
            }
            Statement::StatementSet(inserts, at) => {
                if let Some(prev) = job_at.replace(at) {
                    return Err(several_jobs(prev));
                }
                job.extend(inserts);
            }
            Statement::Query(q, at) => {
                if let Some(prev) = job_at.replace(at) {
                    return Err(several_jobs(prev));
                }
                print_query = Some(q);
            }
            Statement::Explain(_) => {
                return Err(SqlError::msg("EXPLAIN EXPLAIN is not a statement"))
            }
        }
    }
    let env = StreamEnv::new();
    let mut builder = Builder {
        env: &env,
        seed,
        ttl,
        plan: String::new(),
        records: Some(0),
        uids: Default::default(),
        built: Default::default(),
    };
    if let Some(q) = print_query {
        let rel = plan_query(&q, &catalog)?;
        builder.print(rel)?;
    }
    for insert in &job {
        builder.insert(insert, &catalog)?;
    }
    if job.is_empty() && builder.plan.is_empty() {
        return Err(SqlError::msg(
            "the script has no INSERT INTO, statement set or query to run",
        ));
    }
    let (plan, source_records) = (builder.plan, builder.records);
    let graph = env.build("sql").map_err(SqlError::msg)?;
    Ok(Compiled {
        graph,
        plan,
        explain,
        source_records,
    })
}

/// The plan of a script, as `EXPLAIN` prints it.
pub fn explain(script: &str) -> Result<String> {
    compile(script, 0).map(|c| c.plan)
}

fn several_jobs(first: sqlparser::tokenizer::Location) -> SqlError {
    SqlError::msg(format!(
        "a script runs one job, and the job of line {} comes before this one: put several INSERT INTO statements in one statement set (BEGIN STATEMENT SET; …; END;)",
        first.line
    ))
}

struct Builder<'a> {
    env: &'a StreamEnv,
    seed: u64,
    ttl: Option<Duration>,
    plan: String,
    records: Option<u64>,
    /// How many operators took each uid so far: the same definition over the same inputs
    /// twice in plans that differ (a table read under two aliases, as in a self-join) is two
    /// operators, the second's uid numbered `-2`, in the order the plan is built.
    uids: std::collections::HashMap<String, u32>,
    /// Every relation built so far, by its whole plan: a sub-plan that occurs again (a table,
    /// a view or a subquery read twice, the same way) is built once and its stream feeds every
    /// reader, as Flink's `table.optimizer.reuse-sub-plan-enabled` (on by default) does.
    built: std::collections::HashMap<String, Reused>,
}

/// A relation built once and read again: its stream, digest and plan line.
struct Reused {
    stream: DataStream<Row>,
    digest: u32,
    line: String,
}

/// What a built relation is: its stream and the digest its uid carries.
struct Built {
    stream: DataStream<Row>,
    digest: u32,
}

fn digest(text: &str, inputs: &[u32]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(text.as_bytes());
    for i in inputs {
        h.update(&i.to_le_bytes());
    }
    h.finalize()
}

impl Builder<'_> {
    fn insert(&mut self, insert: &Insert, catalog: &Catalog) -> Result<()> {
        let Some(table) = catalog.tables.get(&insert.table) else {
            let names = catalog.tables.keys().map(String::as_str);
            return Err(SqlError::at(
                insert.at,
                format!(
                    "table '{}' not found{}",
                    insert.table,
                    super::did_you_mean(&insert.table, names)
                ),
            ));
        };
        let rel = plan_query(&insert.query, catalog)?;
        let target = &table.columns[..table.physical];
        if table.physical != table.columns.len() {
            return Err(SqlError::at(
                insert.at,
                format!(
                    "table '{}' has computed columns: it can only be read",
                    table.def.name
                ),
            ));
        }
        if rel.columns.len() != target.len() {
            return Err(SqlError::at(
                insert.at,
                format!(
                    "the query gives {} column(s), table '{}' has {}",
                    rel.columns.len(),
                    table.def.name,
                    target.len()
                ),
            ));
        }
        let mut project = Vec::new();
        let mut cast = false;
        for (i, (c, t)) in rel.columns.iter().zip(target).enumerate() {
            if !c.ty.fits(&t.ty) {
                return Err(SqlError::at(
                    insert.at,
                    format!(
                        "column {} ('{}') of the query is {}, column '{}' of table '{}' is {}",
                        i + 1,
                        c.name,
                        c.ty,
                        t.name,
                        table.def.name,
                        t.ty
                    ),
                ));
            }
            let e = if c.ty == t.ty {
                Expr::Col(i)
            } else {
                coerce(Expr::Cast(Box::new(Expr::Col(i)), t.ty.clone()), &t.ty)
            };
            cast |= e.as_col().is_none();
            project.push(e);
        }
        let mut rel = rel;
        if cast {
            rel = plan::calc(rel, None, project, target.to_vec());
        }
        let updating = rel.updating;
        let name = table.def.name.clone();
        let mark = self.plan.len();
        let built = self.build(&rel, &name, 1)?;
        let uid = self.unique(format!(
            "{name}.sink-{:08x}",
            digest(&format!("sink {:?}", table.def.options), &[built.digest])
        ));
        let line = format!(
            "sink: {name} ({}, {}) uid={uid}\n",
            table
                .def
                .options
                .get("connector")
                .map_or("", String::as_str),
            if updating { "changelog" } else { "append-only" }
        );
        self.plan.insert_str(mark, &line);
        connectors::sink(built.stream, table, updating, &uid)?;
        Ok(())
    }

    fn print(&mut self, rel: Rel) -> Result<()> {
        let mark = self.plan.len();
        let built = self.build(&rel, "query", 1)?;
        let uid = self.unique(format!("query.print-{:08x}", built.digest));
        self.plan
            .insert_str(mark, &format!("print to standard output uid={uid}\n"));
        let encoder = Arc::new(|row: &Row, out: &mut Vec<u8>| connectors::print_row("", row, out));
        built
            .stream
            .sink(crate::connectors::PrintSink::new(encoder))
            .uid(&uid);
        Ok(())
    }

    /// `uid`, numbered if an operator took it already.
    fn unique(&mut self, uid: String) -> String {
        let n = self.uids.entry(uid.clone()).or_insert(0);
        *n += 1;
        match *n {
            1 => uid,
            n => format!("{uid}-{n}"),
        }
    }

    /// The source of `table`; `calc`, the filter and projection over it, may narrow what it
    /// reads (the calc over the narrowed rows is returned then).
    fn scan(
        &mut self,
        table: &Arc<super::plan::Table>,
        prefix: &str,
        calc: Option<connectors::ScanCalc<'_>>,
    ) -> Result<(Built, String, bool)> {
        let d = digest(
            &format!("scan {} {:?}", table.def.name, table.def.options),
            &[],
        );
        let uid = self.unique(format!("{prefix}.source-{}-{d:08x}", table.def.name));
        let connectors::Scanned {
            stream,
            note,
            calc_in_source,
        } = connectors::source(self.env, table, &uid, self.seed, calc)?;
        self.records = self
            .records
            .zip(connectors::source_rows(table))
            .map(|(a, b)| a + b);
        let wm = match table.rowtime {
            Some((c, delay)) => {
                format!(", watermark {} - {delay} ms", table.columns[c].name)
            }
            None => String::new(),
        };
        let line = format!(
            "source: {} ({}{}{wm}) uid={uid}",
            table.def.name,
            table
                .def
                .options
                .get("connector")
                .map_or("", String::as_str),
            note.map(|n| format!(", {n}")).unwrap_or_default(),
        );
        Ok((Built { stream, digest: d }, line, calc_in_source))
    }

    /// Builds `rel` (and its inputs, printed indented by `depth` into the plan), or reuses
    /// what an equal relation built before.
    fn build(&mut self, rel: &Rel, prefix: &str, depth: usize) -> Result<Built> {
        let whole = format!("{rel:?}");
        if let Some(r) = self.built.get(&whole) {
            let _ = writeln!(self.plan, "{}reused: {}", "  ".repeat(depth), r.line);
            return Ok(Built {
                stream: r.stream.clone(),
                digest: r.digest,
            });
        }
        let mark = self.plan.len();
        let built = self.build_new(rel, prefix, depth)?;
        let line = self.plan[mark..].lines().next().unwrap_or("").trim_start();
        let reused = Reused {
            stream: built.stream.clone(),
            digest: built.digest,
            line: line.to_string(),
        };
        self.built.insert(whole, reused);
        Ok(built)
    }

    /// Builds `rel` anew.
    fn build_new(&mut self, rel: &Rel, prefix: &str, depth: usize) -> Result<Built> {
        let (built, line) = match &rel.node {
            Node::Scan(table) => {
                let (built, line, _) = self.scan(table, prefix, None)?;
                (built, line)
            }
            Node::Calc {
                input,
                filter,
                project,
            } => {
                let mark = self.plan.len();
                let rowtime = rel.columns.iter().position(|c| c.time == Time::Rowtime);
                let (inner, in_source) = match &input.node {
                    // The source may skip rows the filter rejects, or run the calc itself
                    // over only what it uses.
                    Node::Scan(table) => {
                        let calc = connectors::ScanCalc {
                            filter: filter.as_ref(),
                            project,
                            rowtime,
                        };
                        let (built, line, in_source) = self.scan(table, prefix, Some(calc))?;
                        let _ = writeln!(self.plan, "{}{line}", "  ".repeat(depth + 1));
                        (built, in_source)
                    }
                    _ => (self.build(input, prefix, depth + 1)?, false),
                };
                // The uid is the calc's as planned, however its source reads (and taken even
                // when the source runs the calc, so that the uids of the others stay).
                let text = format!("calc filter={filter:?} project={project:?}");
                let d = digest(&text, &[inner.digest]);
                let uid = self.unique(format!("{prefix}.calc-{d:08x}"));
                let cols: Vec<&str> = rel.columns.iter().map(|c| c.name.as_str()).collect();
                let condition = if filter.is_some() { " where …" } else { "" };
                let (mut stream, line) = if in_source {
                    let line = format!("calc: [{}]{condition}, run by the source", cols.join(", "));
                    (inner.stream, line)
                } else {
                    let f = CalcFn {
                        calc: Arc::new(Calc::new(filter.clone(), project.clone())),
                        scratch: Vec::new(),
                    };
                    let stream = inner.stream.process(f).uid(&uid).name("calc");
                    (
                        stream,
                        format!("calc: [{}]{condition} uid={uid}", cols.join(", ")),
                    )
                };
                if let Some(t) = rowtime {
                    stream = stream.with_timestamps(move |r: &Row| {
                        r.values.get(t).and_then(Value::as_i64).unwrap_or(i64::MIN)
                    });
                }
                self.plan
                    .insert_str(mark, &format!("{}{line}\n", "  ".repeat(depth)));
                return Ok(Built { stream, digest: d });
            }
            Node::Union(inputs) => {
                let mark = self.plan.len();
                let mut built = Vec::new();
                for i in inputs {
                    built.push(self.build(i, prefix, depth + 1)?);
                }
                let d = digest("union", &built.iter().map(|b| b.digest).collect::<Vec<_>>());
                let mut it = built.into_iter();
                let first = it.next().ok_or_else(|| SqlError::msg("an empty UNION"))?;
                let stream = first.stream.union(it.map(|b| b.stream).collect());
                self.plan
                    .insert_str(mark, &format!("{}union all\n", "  ".repeat(depth)));
                return Ok(Built { stream, digest: d });
            }
            Node::WindowAgg {
                input,
                window,
                proctime,
                keys,
                aggs,
            } => {
                let mark = self.plan.len();
                let inner = self.build(input, prefix, depth + 1)?;
                let text = format!("window {window:?} {proctime} {keys} {aggs:?}");
                let d = digest(&text, &[inner.digest]);
                let uid = self.unique(format!("{prefix}.window-{d:08x}"));
                let time_col = input.columns.len() - 1;
                let mut stream = inner.stream;
                if !proctime {
                    stream = stream.with_timestamps(move |r: &Row| {
                        r.values
                            .get(time_col)
                            .and_then(Value::as_i64)
                            .unwrap_or(i64::MIN)
                    });
                }
                let assigner = assigner(window, *proctime)?;
                let k = *keys;
                let agg = SqlAggregate {
                    aggs: Arc::new(aggs.clone()),
                };
                let out = if k == 1 && integer(&input.columns[0]) {
                    window_aggregate::<IntKey>(stream, k, assigner, agg, &uid)
                } else {
                    window_aggregate::<Vec<Value>>(stream, k, assigner, agg, &uid)
                };
                let window_time = k + 2;
                let out = if *proctime {
                    out
                } else {
                    out.with_timestamps(move |r: &Row| {
                        r.values
                            .get(window_time)
                            .and_then(Value::as_i64)
                            .unwrap_or(i64::MIN)
                    })
                };
                let key_names: Vec<&str> =
                    input.columns[..k].iter().map(|c| c.name.as_str()).collect();
                let line = format!(
                    "window aggregate: {} key=[{}] aggregates={} state=accumulators per key and window, timers uid={uid}",
                    window_text(window, *proctime),
                    key_names.join(", "),
                    aggs_text(aggs)
                );
                self.plan
                    .insert_str(mark, &format!("{}{line}\n", "  ".repeat(depth)));
                return Ok(Built {
                    stream: out,
                    digest: d,
                });
            }
            Node::Join {
                left,
                right,
                keys,
                kind,
                condition,
                bounds,
            } => {
                if keys.is_empty() {
                    return Err(SqlError::msg(
                        "a join needs an equality of a column of each side (ON a.k = b.k): a cross join is not supported",
                    ));
                }
                let mark = self.plan.len();
                let l = self.build(left, prefix, depth + 1)?;
                let r = self.build(right, prefix, depth + 1)?;
                let mut text = format!("join {keys:?} {:?}", self.ttl);
                if *kind != JoinKind::Inner {
                    let _ = write!(text, " {kind:?} {condition:?}");
                }
                if let Some(b) = bounds {
                    let _ = write!(text, " {b:?}");
                }
                let d = digest(&text, &[l.digest, r.digest]);
                let uid = self.unique(format!("{prefix}.join-{d:08x}"));
                let lk: Arc<[usize]> = keys.iter().map(|k| k.0).collect();
                let rk: Arc<[usize]> = keys.iter().map(|k| k.1).collect();
                let expire = keys.iter().position(|&(a, b)| {
                    left.columns[a].time == Time::WindowEnd
                        && right.columns[b].time == Time::WindowEnd
                });
                let f = JoinFn {
                    keys: [lk.clone(), rk.clone()],
                    expire,
                    preserves: kind.preserves(),
                    bounds: *bounds,
                    condition: condition.clone().map(Arc::new),
                    widths: [left.columns.len(), right.columns.len()],
                    ttl: self.ttl,
                    rows: None,
                    matched: [None, None],
                };
                let one_int = lk.len() == 1
                    && integer(&left.columns[lk[0]])
                    && integer(&right.columns[rk[0]]);
                let stream = if one_int {
                    join::<IntKey>(l.stream, r.stream, lk, rk, f, &uid)
                } else {
                    join::<Vec<Value>>(l.stream, r.stream, lk, rk, f, &uid)
                };
                let on: Vec<String> = keys
                    .iter()
                    .map(|(a, b)| {
                        format!(
                            "{} = {}",
                            column_text(&left.columns[*a]),
                            column_text(&right.columns[*b])
                        )
                    })
                    .collect();
                let ttl = self
                    .ttl
                    .map(|t| format!(", ttl {} ms", t.as_millis()))
                    .unwrap_or_default();
                let freed = match (expire, bounds) {
                    (Some(_), _) => ", freed at the window's end".to_string(),
                    (None, Some(b)) => format!(
                        ", each kept while it can join ({} - {} within {} to {} ms)",
                        column_text(&left.columns[b.left]),
                        column_text(&right.columns[b.right]),
                        b.lower,
                        b.upper
                    ),
                    (None, None) => String::new(),
                };
                let kind_text = match kind {
                    JoinKind::Inner => "inner",
                    JoinKind::Left => "left outer",
                    JoinKind::Right => "right outer",
                    JoinKind::Full => "full outer",
                };
                let line = format!(
                    "join ({kind_text}{}): key=[{}]{} state=rows of both inputs per key{}{freed}{ttl} uid={uid}",
                    if left.updating || right.updating {
                        ", changelog"
                    } else {
                        ""
                    },
                    on.join(", "),
                    if condition.is_some() { " on …" } else { "" },
                    if *kind == JoinKind::Inner {
                        ""
                    } else {
                        " and the matches of each kept row"
                    },
                );
                self.plan
                    .insert_str(mark, &format!("{}{line}\n", "  ".repeat(depth)));
                return Ok(Built { stream, digest: d });
            }
            Node::Rank {
                input,
                kind,
                partition,
                order,
                range,
                at,
            } => {
                let range = range.ok_or_else(|| rank::unbounded_error(*kind, *at))?;
                let mark = self.plan.len();
                let inner = self.build(input, prefix, depth + 1)?;
                // ROW_NUMBER's text (and so its uid) is what it was before RANK() existed.
                let function = match kind {
                    rank::RankKind::RowNumber => String::new(),
                    other => format!(" {}", other.name()),
                };
                let text = format!(
                    "rank{function} {partition:?} {order:?} {range:?} {:?}",
                    self.ttl
                );
                let d = digest(&text, &[inner.digest]);
                let uid = self.unique(format!("{prefix}.rank-{d:08x}"));
                let dedup = rank::dedup(rel);
                let expire = partition
                    .iter()
                    .copied()
                    .find(|&c| input.columns[c].time == Time::WindowEnd);
                let f = rank::RankFn {
                    kind: *kind,
                    expire,
                    order: order.iter().copied().collect(),
                    range,
                    newest_first: dedup == Some(true),
                    keep_all: input.updating,
                    ttl: self.ttl,
                    state: None,
                };
                let keys: Arc<[usize]> = partition.iter().copied().collect();
                let stream = inner
                    .stream
                    .key_by(move |r: &Row| keys.iter().map(|&i| r.values[i].clone()).collect())
                    .process(f)
                    .uid(&uid)
                    .name("rank");
                let names =
                    |cols: &mut dyn Iterator<Item = String>| cols.collect::<Vec<_>>().join(", ");
                let by = names(&mut partition.iter().map(|&i| column_text(&input.columns[i])));
                let order_text = names(&mut order.iter().map(|&(i, desc)| {
                    format!(
                        "{}{}",
                        column_text(&input.columns[i]),
                        if desc { " DESC" } else { "" }
                    )
                }));
                let what = match dedup {
                    Some(true) => "deduplicate, last row".to_string(),
                    Some(false) => "deduplicate, first row".to_string(),
                    None => format!(
                        "top-n{}, ranks {}..{}",
                        function.to_lowercase().replace(' ', " by "),
                        range.0,
                        range.1
                    ),
                };
                let ttl = self
                    .ttl
                    .map(|t| format!(", ttl {} ms", t.as_millis()))
                    .unwrap_or_default();
                let line = format!(
                    "rank ({what}{}): partition=[{by}] order=[{order_text}] state={} rows per partition{}{ttl} uid={uid}",
                    if rel.updating { ", changelog" } else { "" },
                    if input.updating { "all" } else { "the kept" },
                    if expire.is_some() { ", freed at the window's end" } else { "" },
                );
                self.plan
                    .insert_str(mark, &format!("{}{line}\n", "  ".repeat(depth)));
                return Ok(Built { stream, digest: d });
            }
            Node::GroupAgg { input, keys, aggs } => {
                let mark = self.plan.len();
                let inner = self.build(input, prefix, depth + 1)?;
                let text = format!("group {keys} {aggs:?} {:?}", self.ttl);
                let d = digest(&text, &[inner.digest]);
                let uid = self.unique(format!("{prefix}.group-{d:08x}"));
                let k = *keys;
                let expire = plan::window_end_key(input, k);
                let at_end = plan::final_at_window_end(input, k).is_some();
                let f = GroupAggFn {
                    aggs: Arc::new(aggs.clone()),
                    keys: k,
                    expire,
                    at_end,
                    retracting: input.updating,
                    ttl: self.ttl,
                    state: None,
                };
                let stream = inner
                    .stream
                    .key_by(move |r: &Row| r.values[..k].to_vec())
                    .process(f)
                    .uid(&uid)
                    .name("group aggregate");
                let key_names: Vec<&str> =
                    input.columns[..k].iter().map(|c| c.name.as_str()).collect();
                let ttl = self
                    .ttl
                    .map(|t| format!(", ttl {} ms", t.as_millis()))
                    .unwrap_or_default();
                let line = if at_end {
                    format!(
                        "group aggregate (append-only, one row per group at its window's end): key=[{}] aggregates={} state=accumulators per key{ttl} uid={uid}",
                        key_names.join(", "),
                        aggs_text(aggs),
                    )
                } else {
                    format!(
                        "group aggregate (changelog): key=[{}] aggregates={} state=accumulators and last result per key{}{ttl} uid={uid}",
                        key_names.join(", "),
                        aggs_text(aggs),
                        if expire.is_some() { ", freed at the window's end" } else { "" },
                    )
                };
                self.plan
                    .insert_str(mark, &format!("{}{line}\n", "  ".repeat(depth)));
                return Ok(Built { stream, digest: d });
            }
        };
        let _ = writeln!(self.plan, "{}{line}", "  ".repeat(depth));
        Ok(built)
    }
}

fn window_text(w: &WindowKind, proctime: bool) -> String {
    let clock = if proctime {
        "processing time"
    } else {
        "event time"
    };
    match w {
        WindowKind::Tumble { size, offset } => {
            format!("TUMBLE({size} ms, offset {offset} ms, {clock})")
        }
        WindowKind::Hop {
            slide,
            size,
            offset,
        } => format!("HOP(slide {slide} ms, size {size} ms, offset {offset} ms, {clock})"),
        WindowKind::Cumulate { step, size, offset } => {
            format!("CUMULATE(step {step} ms, max size {size} ms, offset {offset} ms, {clock})")
        }
        WindowKind::Session { gap } => format!("SESSION(gap {gap} ms, {clock})"),
    }
}

fn aggs_text(aggs: &[AggCall]) -> String {
    let parts: Vec<String> = aggs
        .iter()
        .map(|a| {
            let arg = a.arg.map_or("*".to_string(), |i| format!("${i}"));
            let distinct = if a.distinct { "DISTINCT " } else { "" };
            let filter = a
                .filter
                .map(|f| format!(" FILTER ${f}"))
                .unwrap_or_default();
            format!("{:?}({distinct}{arg}){filter}", a.kind).to_uppercase()
        })
        .collect();
    format!("[{}]", parts.join(", "))
}

fn assigner(w: &WindowKind, proctime: bool) -> Result<WindowAssigner> {
    let ms = |v: i64| Duration::from_millis(v.max(0) as u64);
    let offset = |o: i64| {
        if o < 0 {
            Err(SqlError::msg("a negative window offset is not supported"))
        } else {
            Ok(ms(o))
        }
    };
    let a = match w {
        WindowKind::Tumble { size, offset: o } => {
            WindowAssigner::tumbling(ms(*size)).with_offset(offset(*o)?)
        }
        WindowKind::Hop {
            slide,
            size,
            offset: o,
        } => WindowAssigner::sliding(ms(*size), ms(*slide)).with_offset(offset(*o)?),
        WindowKind::Cumulate {
            step,
            size,
            offset: o,
        } => WindowAssigner::cumulative(ms(*step), ms(*size)).with_offset(offset(*o)?),
        WindowKind::Session { gap } => WindowAssigner::session(ms(*gap)),
    };
    let a = if proctime { a.on_processing_time() } else { a };
    a.validate().map_err(SqlError::msg)?;
    Ok(a)
}

/// Filters and projects each row.
#[derive(Clone)]
struct CalcFn {
    calc: Arc<Calc>,
    /// The row being made, before it takes the place of the input's values (whose
    /// allocation it reuses).
    scratch: Vec<Value>,
}

fn eval_err(m: String) -> TaskError {
    TaskError::Unrecoverable(format!("SQL expression: {m}"))
}

impl ProcessFunction<Row, Row> for CalcFn {
    fn process(
        &mut self,
        mut row: Row,
        _: &mut OperatorStateStore,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        if !self.calc.passes(&row.values).map_err(eval_err)? {
            return Ok(());
        }
        let mut values = std::mem::take(&mut self.scratch);
        values.clear();
        self.calc
            .project_into(&mut row.values, &mut values)
            .map_err(eval_err)?;
        // The output row lives in the input's allocation; the scratch keeps its own.
        row.values.clear();
        row.values.append(&mut values);
        self.scratch = values;
        out.collect(row);
        Ok(())
    }
}

/// The aggregates of a window, accumulated incrementally (per pane for HOP).
#[derive(Clone)]
struct SqlAggregate {
    aggs: Arc<Vec<AggCall>>,
}

/// A window aggregation of `stream` keyed by its first `k` columns as a `K`: its rows are
/// the key, the window's start, end and time, and the aggregates' results.
fn window_aggregate<K: GroupKey>(
    stream: DataStream<Row>,
    k: usize,
    assigner: WindowAssigner,
    agg: SqlAggregate,
    uid: &str,
) -> DataStream<Row> {
    stream
        .key_by(move |r: &Row| K::of(r, k))
        .window(assigner)
        .aggregate_process(
            agg,
            |key: &K, w: TimeWindow, results: Vec<Value>, out: &mut Collector<Row>| {
                let mut values = Vec::with_capacity(key.len() + 3 + results.len());
                key.write(&mut values);
                values.extend([
                    Value::Ts(w.start),
                    Value::Ts(w.end),
                    Value::Ts(w.max_timestamp()),
                ]);
                values.extend(results);
                out.collect(Row::insert(values));
            },
        )
        .uid(uid)
        .name("window aggregate")
}

/// The key of a keyed SQL operator: the values of a row's first columns.
trait GroupKey: crate::state::Key {
    /// The key of `row`, its first `k` columns.
    fn of(row: &Row, k: usize) -> Self;
    /// The key of `row`, its columns `cols`.
    fn of_columns(row: &Row, cols: &[usize]) -> Self;
    /// How many columns it holds.
    fn len(&self) -> usize;
    /// Appends its columns to `out`.
    fn write(&self, out: &mut Vec<Value>);
}

impl GroupKey for Vec<Value> {
    fn of(row: &Row, k: usize) -> Self {
        row.values[..k].to_vec()
    }
    fn of_columns(row: &Row, cols: &[usize]) -> Self {
        cols.iter().map(|&i| row.values[i].clone()).collect()
    }
    fn len(&self) -> usize {
        Vec::len(self)
    }
    fn write(&self, out: &mut Vec<Value>) {
        out.extend(self.iter().cloned());
    }
}

/// Whether `c` is an `INT` or `BIGINT` column, whose values an [`IntKey`] holds.
fn integer(c: &plan::Column) -> bool {
    matches!(c.ty, SqlType::Int | SqlType::BigInt)
}

/// The join of `left` and `right` on the columns `lk` of the one equal to the columns `rk`
/// of the other, keyed by them as a `K`.
fn join<K: GroupKey>(
    left: DataStream<Row>,
    right: DataStream<Row>,
    lk: Arc<[usize]>,
    rk: Arc<[usize]>,
    f: JoinFn,
    uid: &str,
) -> DataStream<Row> {
    left.key_by(move |r: &Row| K::of_columns(r, &lk))
        .connect(right.key_by(move |r: &Row| K::of_columns(r, &rk)))
        .process(f)
        .uid(uid)
        .name("join")
}

/// A key of one `INT` or `BIGINT` column, without a vector per record. It is hashed to key
/// groups and serialized into state exactly as the one-value `Vec<Value>` it stands for, so
/// checkpoints and savepoints read the same either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct IntKey(Option<i64>);

impl IntKey {
    /// The key of column `i` of `row`, an integer column.
    fn at(row: &Row, i: usize) -> Self {
        match row.values[i] {
            Value::Int(x) => IntKey(Some(x)),
            ref v => {
                debug_assert!(v.is_null(), "an integer key column holds {v:?}");
                IntKey(None)
            }
        }
    }

    fn value(self) -> Value {
        self.0.map_or(Value::Null, Value::Int)
    }
}

impl GroupKey for IntKey {
    fn of(row: &Row, _k: usize) -> Self {
        IntKey::at(row, 0)
    }
    fn of_columns(row: &Row, cols: &[usize]) -> Self {
        IntKey::at(row, cols[0])
    }
    fn len(&self) -> usize {
        1
    }
    fn write(&self, out: &mut Vec<Value>) {
        out.push(self.value());
    }
}

impl StableKey for IntKey {
    fn encode<E: KeyEncoder>(&self, out: &mut E) {
        [self.value()].as_slice().encode(out);
    }
}

impl Serialize for IntKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> std::result::Result<S::Ok, S::Error> {
        s.collect_seq(std::iter::once(self.value()))
    }
}

impl<'de> Deserialize<'de> for IntKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        match Vec::<Value>::deserialize(d)?.as_slice() {
            [Value::Int(x)] => Ok(IntKey(Some(*x))),
            [Value::Null] => Ok(IntKey(None)),
            other => Err(serde::de::Error::custom(format!(
                "an integer key holds {other:?}"
            ))),
        }
    }
}

impl AggregateFunction<Row, Vec<Value>> for SqlAggregate {
    type Acc = Vec<Acc>;

    fn create(&self) -> Vec<Acc> {
        self.aggs.iter().map(|a| a.create(false)).collect()
    }

    fn add(&self, acc: &mut Vec<Acc>, row: Row) {
        for (a, x) in self.aggs.iter().zip(acc.iter_mut()) {
            // Types are checked by the planner: arithmetic on accumulators cannot fail.
            let _ = a.accumulate(x, &row.values, 1);
        }
    }

    fn merge(&self, acc: &mut Vec<Acc>, other: &Vec<Acc>) {
        for ((a, x), y) in self.aggs.iter().zip(acc.iter_mut()).zip(other) {
            let _ = a.merge(x, y);
        }
    }

    fn result(&self, acc: &Vec<Acc>) -> Vec<Value> {
        self.aggs
            .iter()
            .zip(acc)
            .map(|(a, x)| a.result(x).unwrap_or(Value::Null))
            .collect()
    }
}

/// A column as EXPLAIN names it: `qualifier.name`.
fn column_text(c: &super::plan::Column) -> String {
    match &c.qualifier {
        Some(q) => format!("{q}.{}", c.name),
        None => c.name.clone(),
    }
}

/// A regular join: per key, the rows of each input (with their multiplicity) in map state. A
/// row joins the other input's rows of its key that meet the condition, then is kept for the
/// rows to come; a retraction (-U/-D) joins the same rows as -D and takes the row back. Rows
/// with a NULL key never join.
///
/// An outer join also keeps, for each row of a side whose unmatched rows appear, how many
/// rows of the other side it matches: a row without a match appears padded with NULLs, and
/// that padded row is retracted (-D) when its first match comes and appears again (+I) when
/// its last match is retracted.
#[derive(Clone)]
struct JoinFn {
    /// The key columns of the left and the right input.
    keys: [Arc<[usize]>; 2],
    /// The key that is a window's end on both sides, if one is: a key's rows are dropped when
    /// the watermark passes its window (a window join).
    expire: Option<usize>,
    /// Whether the unmatched rows of the left and the right input appear.
    preserves: [bool; 2],
    /// What a pair must meet besides the keys, over the joined columns.
    condition: Option<Arc<Expr>>,
    /// The bounds of an interval join: each row is dropped once the watermark shows that no
    /// row it could join is still to come.
    bounds: Option<TimeBounds>,
    /// How many columns each input has (the NULLs of a padded row).
    widths: [usize; 2],
    ttl: Option<Duration>,
    /// The rows of the left and the right input.
    rows: Option<[MapState<Vec<Value>, i64>; 2]>,
    /// Per kept side, how many rows of the other side each of its rows matches.
    matched: [Option<MapState<Vec<Value>, i64>>; 2],
}

const JOIN_STATE: [&str; 2] = ["sql.join.left", "sql.join.right"];
const JOIN_MATCHED: [&str; 2] = ["sql.join.left.matched", "sql.join.right.matched"];

impl JoinFn {
    /// The joined row of `row` (on `side`) and `other`.
    fn joined(side: usize, row: &[Value], other: &[Value]) -> Vec<Value> {
        let (l, r) = if side == 0 {
            (row, other)
        } else {
            (other, row)
        };
        let mut values = Vec::with_capacity(l.len() + r.len());
        values.extend_from_slice(l);
        values.extend_from_slice(r);
        values
    }

    /// `row` of `side` padded with NULLs for the other side's columns.
    fn padded(&self, side: usize, row: &[Value], kind: RowKind) -> Row {
        let nulls = std::iter::repeat_n(Value::Null, self.widths[1 - side]);
        let values = if side == 0 {
            row.iter().cloned().chain(nulls).collect()
        } else {
            nulls.chain(row.iter().cloned()).collect()
        };
        Row { kind, values }
    }

    /// The watermark after which a row of `side` can join no row still to come (an interval
    /// join's): a left row at `l` joins right rows up to `l - lower`, a right row at `r` left
    /// rows up to `r + upper`.
    fn joinable_until(&self, side: usize, row: &[Value]) -> Option<i64> {
        let b = self.bounds?;
        if side == 0 {
            row[b.left].as_i64()?.checked_sub(b.lower)
        } else {
            row[b.right].as_i64()?.checked_add(b.upper)
        }
    }

    fn on_row<K: crate::state::Key>(
        &self,
        side: usize,
        row: Row,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        let Some(rows) = &self.rows else {
            return Ok(());
        };
        if self.keys[side].iter().any(|&i| row.values[i].is_null()) {
            // A NULL key joins nothing; a kept side's row appears padded all the same.
            if self.preserves[side] {
                let kind = if row.kind.is_addition() {
                    RowKind::Insert
                } else {
                    RowKind::Delete
                };
                out.collect(self.padded(side, &row.values, kind));
            }
            return Ok(());
        }
        let addition = row.kind.is_addition();
        let kind = if addition {
            RowKind::Insert
        } else {
            RowKind::Delete
        };
        let other = 1 - side;
        // The other side's rows this one joins, with their multiplicity.
        let mut matches: Vec<(Vec<Value>, i64)> = Vec::new();
        let mut total = 0;
        for (o, n) in rows[other].entries(ctx)? {
            let values = Self::joined(side, &row.values, o);
            if let Some(c) = &self.condition {
                if c.eval(&values).map_err(eval_err)? != Value::Bool(true) {
                    continue;
                }
            }
            for _ in 1..*n {
                out.collect(Row {
                    kind,
                    values: values.clone(),
                });
            }
            out.collect(Row { kind, values });
            total += *n;
            if self.preserves[other] {
                matches.push((o.clone(), *n));
            }
        }
        // The other side's padded rows: gone at their first match, back after their last.
        if let Some(matched) = &self.matched[other] {
            for (o, n) in matches {
                let before = matched.get(ctx, &o)?.copied().unwrap_or(0);
                let after = before + if addition { 1 } else { -1 };
                let pad = match (before, after) {
                    (0, _) => Some(RowKind::Delete),
                    (_, 0) => Some(RowKind::Insert),
                    _ => None,
                };
                if let Some(pad) = pad {
                    for _ in 0..n {
                        out.collect(self.padded(other, &o, pad));
                    }
                }
                matched.put(ctx, o, after.max(0))?;
            }
        }
        if total == 0 && self.preserves[side] {
            out.collect(self.padded(side, &row.values, kind));
        }
        if let Some(k) = self.expire.filter(|_| addition) {
            expire_with_window(&row.values[self.keys[side][k]], ctx)?;
        } else if let Some(until) = self.joinable_until(side, &row.values).filter(|_| addition) {
            ctx.register_event_time_timer(until)?;
        }
        let mine = &rows[side];
        let count =
            mine.get(ctx, &row.values)?.copied().unwrap_or(0) + if addition { 1 } else { -1 };
        if count > 0 {
            if let Some(matched) = &self.matched[side] {
                matched.put(ctx, row.values.clone(), total)?;
            }
            mine.put(ctx, row.values, count)
        } else {
            if let Some(matched) = &self.matched[side] {
                matched.remove(ctx, &row.values)?;
            }
            mine.remove(ctx, &row.values)
        }
    }
}

impl<K: GroupKey> KeyedCoProcessFunction<K, Row, Row, Row> for JoinFn {
    fn open(&mut self, ctx: &mut KeyedContext<K>) -> TaskResult {
        let ttl = self.ttl;
        let mut state = |name: &str| match ttl {
            Some(t) => ctx.map_state_with_ttl(name, StateTtlConfig::new(t)),
            None => ctx.map_state(name),
        };
        let rows = [state(JOIN_STATE[0])?, state(JOIN_STATE[1])?];
        let mut matched = [None, None];
        for (side, m) in matched.iter_mut().enumerate() {
            if self.preserves[side] {
                *m = Some(state(JOIN_MATCHED[side])?);
            }
        }
        self.rows = Some(rows);
        self.matched = matched;
        Ok(())
    }

    fn process1(
        &mut self,
        row: Row,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        self.on_row(0, row, ctx, out)
    }

    fn process2(
        &mut self,
        row: Row,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        self.on_row(1, row, ctx, out)
    }

    fn on_timer(
        &mut self,
        time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<K>,
        _out: &mut Collector<Row>,
    ) -> TaskResult {
        let Some(rows) = &self.rows else {
            return Ok(());
        };
        if self.expire.is_some() {
            // The key's window has passed: all of its state goes.
            for state in rows.iter().chain(self.matched.iter().flatten()) {
                state.clear(ctx)?;
            }
            return Ok(());
        }
        // An interval join: the rows that can join nothing more go.
        for (side, kept) in rows.iter().enumerate() {
            if self.matched[side].is_none() {
                kept.retain(ctx, |r, _| {
                    self.joinable_until(side, r).is_none_or(|t| t > time)
                })?;
                continue;
            }
            let done: Vec<Vec<Value>> = kept
                .entries(ctx)?
                .into_iter()
                .filter(|(r, _)| self.joinable_until(side, r).is_some_and(|t| t <= time))
                .map(|(r, _)| r.clone())
                .collect();
            for r in done {
                if let Some(m) = &self.matched[side] {
                    m.remove(ctx, &r)?;
                }
                kept.remove(ctx, &r)?;
            }
        }
        Ok(())
    }
}

/// The value state `name`, expiring after `ttl` (`table.exec.state.ttl`) if there is one.
pub(super) fn value_state<K: crate::state::Key, T: crate::state::StateValue>(
    ctx: &mut KeyedContext<K>,
    name: &str,
    ttl: Option<Duration>,
) -> TaskResult<ValueState<T>> {
    match ttl {
        Some(t) => ctx.value_state_with_ttl(name, StateTtlConfig::new(t)),
        None => ctx.value_state(name),
    }
}

/// Registers the timer that drops the current key's state once the watermark has passed the
/// window that ends at `end` (a [`Time::WindowEnd`] value): no row of that window comes after.
pub(super) fn expire_with_window<K: crate::state::Key>(
    end: &Value,
    ctx: &mut KeyedContext<K>,
) -> TaskResult {
    match end.as_i64() {
        Some(end) => ctx.register_event_time_timer(end - 1),
        None => Ok(()),
    }
}

/// An updating aggregation's state per key: accumulators, the count of rows in the group,
/// and the result last emitted.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct GroupState {
    accs: Vec<Acc>,
    rows: i64,
    last: Option<Vec<Value>>,
}

/// `GROUP BY` without a window: emits +I for a new group, -U/+U when its result changes,
/// -D when its last row is retracted.
#[derive(Clone)]
struct GroupAggFn {
    aggs: Arc<Vec<AggCall>>,
    keys: usize,
    /// The key column that is a window's end, if one is: a group is dropped when the
    /// watermark passes its window.
    expire: Option<usize>,
    /// Whether a group's one final row is emitted then, rather than a changelog as rows come
    /// (an append-only input grouped by a window's end).
    at_end: bool,
    retracting: bool,
    ttl: Option<Duration>,
    state: Option<ValueState<GroupState>>,
}

const GROUP_STATE: &str = "sql.group";

impl KeyedProcessFunction<Vec<Value>, Row, Row> for GroupAggFn {
    fn open(&mut self, ctx: &mut KeyedContext<Vec<Value>>) -> TaskResult {
        self.state = Some(value_state(ctx, GROUP_STATE, self.ttl)?);
        Ok(())
    }

    fn process(
        &mut self,
        row: Row,
        ctx: &mut KeyedContext<Vec<Value>>,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        let Some(state) = &self.state else {
            return Ok(());
        };
        let sign = if row.kind.is_addition() { 1 } else { -1 };
        if sign < 0 && state.value(ctx)?.is_none() {
            return Ok(());
        }
        // The group's accumulators change in place: a clone per record would cost as much as
        // the accumulators hold (a COUNT(DISTINCT …) holds every distinct value).
        if let Some(k) = self.expire {
            if state.value(ctx)?.is_none() {
                expire_with_window(&row.values[k], ctx)?;
            }
        }
        let (aggs, retracting) = (&self.aggs, self.retracting);
        let group = state.get_mut(ctx, || GroupState {
            accs: aggs.iter().map(|a| a.create(retracting)).collect(),
            rows: 0,
            last: None,
        })?;
        for (a, acc) in aggs.iter().zip(group.accs.iter_mut()) {
            a.accumulate(acc, &row.values, sign).map_err(eval_err)?;
        }
        group.rows += sign;
        if self.at_end {
            return Ok(());
        }
        if group.rows <= 0 {
            if let Some(last) = group.last.take() {
                out.collect(Row {
                    kind: RowKind::Delete,
                    values: last,
                });
            }
            return state.clear(ctx);
        }
        let result = group_result(aggs, &group.accs, &row.values[..self.keys])?;
        if group.last.as_ref() == Some(&result) {
            return Ok(());
        }
        match group.last.replace(result.clone()) {
            None => out.collect(Row::insert(result)),
            Some(last) => {
                out.collect(Row {
                    kind: RowKind::UpdateBefore,
                    values: last,
                });
                out.collect(Row {
                    kind: RowKind::UpdateAfter,
                    values: result,
                });
            }
        }
        Ok(())
    }

    fn on_timer(
        &mut self,
        _time: i64,
        _domain: TimeDomain,
        ctx: &mut KeyedContext<Vec<Value>>,
        out: &mut Collector<Row>,
    ) -> TaskResult {
        let Some(state) = &self.state else {
            return Ok(());
        };
        if self.at_end {
            let keys = ctx.current_key().cloned().unwrap_or_default();
            if let Some(group) = state.value(ctx)? {
                out.collect(Row::insert(group_result(&self.aggs, &group.accs, &keys)?));
            }
        }
        state.clear(ctx)
    }
}

/// A group's result row: its keys, then its aggregates' results.
fn group_result(aggs: &[AggCall], accs: &[Acc], keys: &[Value]) -> TaskResult<Vec<Value>> {
    let mut result = keys.to_vec();
    for (a, acc) in aggs.iter().zip(accs) {
        result.push(a.result(acc).map_err(eval_err)?);
    }
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DDL: &str = include_str!("../../../../sql/nexmark/ddl.sql");

    fn lines_with<'a>(plan: &'a str, needle: &str) -> Vec<&'a str> {
        plan.lines().filter(|l| l.contains(needle)).collect()
    }

    /// q5 counts bids per auction and HOP window twice, the same way (once for the rows, once
    /// for the window's highest count): one window aggregate feeds both, over one source.
    #[test]
    fn a_sub_plan_read_twice_is_built_once() {
        let q5 = include_str!("../../../../sql/nexmark/q5.sql");
        let plan = explain(&format!("{DDL}\n{q5}")).unwrap();
        let windows = lines_with(&plan, "window aggregate: HOP");
        assert_eq!(windows.len(), 2, "{plan}");
        assert_eq!(
            lines_with(&plan, "reused: window aggregate").len(),
            1,
            "{plan}"
        );
        assert_eq!(lines_with(&plan, "source: datagen").len(), 1, "{plan}");
        let compiled = compile(&format!("{DDL}\n{q5}"), 0).unwrap();
        let windows = compiled
            .graph
            .nodes()
            .iter()
            .filter(|n| n.name == "window aggregate")
            .count();
        assert_eq!(windows, 1, "{plan}");
    }

    /// q3 reads four columns of a person and one of an auction after the join: each side of
    /// the join is narrowed to what the output, the keys and the condition read, down to the
    /// fields its source reads, so the join's state holds nothing else.
    #[test]
    fn a_join_keeps_only_the_columns_read_after_it() {
        let q3 = include_str!("../../../../sql/nexmark/q3.sql");
        let plan = explain(&format!("{DDL}\n{q3}")).unwrap();
        assert_eq!(
            lines_with(&plan, "calc: [id, seller] where").len(),
            1,
            "{plan}"
        );
        assert_eq!(
            lines_with(&plan, "calc: [id, name, city, state] where").len(),
            1,
            "{plan}"
        );
        assert_eq!(
            lines_with(&plan, "only auctions, 4 fields read").len(),
            1,
            "{plan}"
        );
    }

    /// An integer key is the one-value `Vec<Value>` key in every way state sees it: the same
    /// key group and the same bytes, so a checkpoint of either plan restores into the other.
    #[test]
    fn an_integer_key_hashes_and_serializes_as_the_vector_it_stands_for() {
        use crate::state::keygroup::stable_hash;
        for key in [Some(0), Some(-5), Some(7_919), Some(i64::MAX), None] {
            let int = IntKey(key);
            let vector = vec![int.value()];
            assert_eq!(stable_hash(&int), stable_hash(&vector), "{key:?}");
            let bytes = postcard::to_stdvec(&int).unwrap();
            assert_eq!(bytes, postcard::to_stdvec(&vector).unwrap(), "{key:?}");
            assert_eq!(postcard::from_bytes::<IntKey>(&bytes).unwrap(), int);
            let row = Row::insert(vec![int.value(), Value::Ts(1)]);
            assert_eq!(IntKey::of(&row, 1), int);
        }
        let two = postcard::to_stdvec(&vec![Value::Int(1), Value::Int(2)]).unwrap();
        assert!(postcard::from_bytes::<IntKey>(&two).is_err());
        let text = postcard::to_stdvec(&vec![Value::Str("1".into())]).unwrap();
        assert!(postcard::from_bytes::<IntKey>(&text).is_err());
    }

    /// A table read twice under different aliases plans two reads (their columns are named
    /// apart), each with its own uid.
    #[test]
    fn a_self_join_reads_its_table_once_per_side() {
        let script = "CREATE TABLE t (k STRING, v INT) WITH ('connector' = 'datagen', 'number-of-rows' = '10');
CREATE TABLE o (k STRING, v INT, w INT) WITH ('connector' = 'blackhole');
INSERT INTO o SELECT a.k, a.v, b.v FROM t a JOIN t b ON a.k = b.k;";
        let plan = explain(script).unwrap();
        assert_eq!(lines_with(&plan, "source: t").len(), 2, "{plan}");
        assert!(!plan.contains("reused"), "{plan}");
    }
}
