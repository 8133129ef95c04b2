//! [`UpsertTableSink`]: the changes of a keyed result into an existing PostgreSQL table with a
//! primary key — the `jdbc` connector of SQL jobs.
//!
//! A record is a change of one row: its column values as text (`None`: NULL) and whether the
//! row is deleted. A writer keeps the latest change per key since its last write and writes
//! them in one transaction, sorted by key (two writers lock rows in one order and cannot
//! deadlock), whenever [`FLUSH_ROWS_MAX`] keys were buffered and at every barrier, so that
//! every change before barrier c is in the table before c can complete:
//!
//! ```sql
//! INSERT INTO t (k, a, b) VALUES (CAST($1::text AS bigint), CAST($2::text AS text), …)
//!     ON CONFLICT (k) DO UPDATE SET a = EXCLUDED.a, b = EXCLUDED.b;
//! DELETE FROM t WHERE k = CAST($1::text AS bigint);
//! ```
//!
//! Writes are at least once; the table's content is exactly once by idempotence: a replay
//! from the restored checkpoint writes the same latest row of every key again (the job must be
//! deterministic, and the key the query's key). Between a failure and the end of the replay
//! the table may hold rows newer than the restored state — the flaw of every upsert sink that
//! the seeds name (see the `upsert` mode of [`super::PostgresSink`]).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use tokio_postgres::types::ToSql;

use super::client::{Pg, Target};
use super::sink::FLUSH_ROWS_MAX;
use crate::error::{TaskError, TaskResult};
use crate::failpoint;
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkOwner, SinkWriter};

/// One change of a row: every column's value as text (`None`: NULL), deleted or not.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowChange {
    /// The row's columns, in the sink's column order.
    pub values: Vec<Option<String>>,
    /// Whether the row (its key) is deleted.
    pub delete: bool,
}

/// A column of the output table: its name and PostgreSQL type (`bigint`, `numeric(10, 2)`).
#[derive(Debug, Clone)]
pub struct TableColumn {
    pub name: String,
    pub sql_type: String,
}

/// Writes changes of type `T` into an existing table, upserting or deleting by primary key.
pub struct UpsertTableSink<T> {
    target: Arc<Target>,
    columns: Vec<TableColumn>,
    key: Vec<usize>,
    change_of: Arc<dyn Fn(&T) -> RowChange + Send + Sync>,
}

impl<T> UpsertTableSink<T> {
    /// A sink into `table` at `url` (`postgres://…`) of `columns`, keyed by the columns at
    /// `key`, each record turned into a change by `change_of`.
    pub fn new(
        url: &str,
        table: &str,
        columns: Vec<TableColumn>,
        key: Vec<usize>,
        change_of: Arc<dyn Fn(&T) -> RowChange + Send + Sync>,
    ) -> Result<Self, String> {
        if key.is_empty() || key.iter().any(|&k| k >= columns.len()) {
            return Err("an upsert table sink needs a key of its columns".into());
        }
        for c in &columns {
            let plain = c
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !plain {
                return Err(format!(
                    "column '{}' is not a plain identifier (letters, digits and _)",
                    c.name
                ));
            }
        }
        Ok(UpsertTableSink {
            target: Arc::new(Target::new(url, table)?),
            columns,
            key,
            change_of,
        })
    }

    /// `CAST($n::text AS type)` of column `i`, its parameter numbered `n`.
    fn param(&self, i: usize, n: usize) -> String {
        format!("CAST(${n}::text AS {})", self.columns[i].sql_type)
    }

    fn upsert_sql(&self) -> String {
        let names: Vec<String> = self.columns.iter().map(|c| quote(&c.name)).collect();
        let values: Vec<String> = (0..self.columns.len())
            .map(|i| self.param(i, i + 1))
            .collect();
        let keys: Vec<&str> = self.key.iter().map(|&k| names[k].as_str()).collect();
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO ",
            self.target.table_sql,
            names.join(", "),
            values.join(", "),
            keys.join(", ")
        );
        let rest: Vec<String> = (0..names.len())
            .filter(|i| !self.key.contains(i))
            .map(|i| format!("{0} = EXCLUDED.{0}", names[i]))
            .collect();
        if rest.is_empty() {
            sql.push_str("NOTHING");
        } else {
            let _ = write!(sql, "UPDATE SET {}", rest.join(", "));
        }
        sql
    }

    fn delete_sql(&self) -> String {
        let conditions: Vec<String> = self
            .key
            .iter()
            .enumerate()
            .map(|(n, &k)| {
                format!(
                    "{} = {}",
                    quote(&self.columns[k].name),
                    self.param(k, n + 1)
                )
            })
            .collect();
        format!(
            "DELETE FROM {} WHERE {}",
            self.target.table_sql,
            conditions.join(" AND ")
        )
    }
}

fn quote(name: &str) -> String {
    format!("\"{name}\"")
}

impl<T: Send + 'static> Sink<T> for UpsertTableSink<T> {
    fn guarantee(&self) -> SinkGuarantee {
        // Writes at least once; the table's content exactly once by idempotence.
        SinkGuarantee::ExactlyOnce
    }

    fn initialize(&self, _owner: &SinkOwner, _restored: Option<Vec<Vec<u8>>>) -> TaskResult {
        // The table must be there, with these columns and the key as a unique constraint:
        // preparing the statements checks all of it before anything runs.
        let pg = Pg::connect(&self.target)?;
        pg.prepare("the table's upsert", &self.upsert_sql())?;
        pg.prepare("the table's delete", &self.delete_sql())?;
        Ok(())
    }

    fn create_writer(&self, _ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        let pg = Pg::connect(&self.target)?;
        let upsert = pg.prepare("the table's upsert", &self.upsert_sql())?;
        let delete = pg.prepare("the table's delete", &self.delete_sql())?;
        Ok(Box::new(TableWriter {
            pg,
            upsert,
            delete,
            key: self.key.clone(),
            change_of: self.change_of.clone(),
            pending: BTreeMap::new(),
            last_barrier: 0,
        }))
    }
}

/// The writing side for one subtask.
struct TableWriter<T> {
    pg: Pg,
    upsert: tokio_postgres::Statement,
    delete: tokio_postgres::Statement,
    key: Vec<usize>,
    change_of: Arc<dyn Fn(&T) -> RowChange + Send + Sync>,
    /// The latest change per key since the last write, in key order.
    pending: BTreeMap<Vec<Option<String>>, RowChange>,
    /// The last barrier seen (the writes after it belong to the next checkpoint).
    last_barrier: u64,
}

impl<T> TableWriter<T> {
    fn flush(&mut self) -> TaskResult {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.pg.batch("begin", "BEGIN")?;
        for (n, (key, change)) in std::mem::take(&mut self.pending).into_iter().enumerate() {
            if n == 1 {
                // Inside a transaction, one row written: a kill here loses the transaction.
                failpoint::hit("sink-writing", self.last_barrier + 1);
            }
            let (statement, params) = if change.delete {
                (&self.delete, key)
            } else {
                (&self.upsert, change.values)
            };
            let refs: Vec<&(dyn ToSql + Sync)> =
                params.iter().map(|p| p as &(dyn ToSql + Sync)).collect();
            self.pg.execute("write a row", statement, &refs)?;
        }
        self.pg.batch("commit", "COMMIT")
    }
}

impl<T: Send> SinkWriter<T> for TableWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        for record in batch.drain(..) {
            let change = (self.change_of)(&record);
            let key: Vec<Option<String>> = self
                .key
                .iter()
                .map(|&k| change.values.get(k).cloned().flatten())
                .collect();
            if key.iter().any(Option::is_none) {
                return Err(TaskError::Unrecoverable(
                    "a row with a NULL primary key cannot be written to the table".into(),
                ));
            }
            self.pending.insert(key, change);
        }
        if self.pending.len() >= FLUSH_ROWS_MAX {
            self.flush()?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        self.flush()?;
        self.last_barrier = checkpoint_id;
        Ok(Vec::new())
    }

    fn commit(&mut self, _checkpoint_id: u64) -> TaskResult {
        Ok(())
    }

    fn finish(&mut self) -> TaskResult {
        self.flush()
    }
}
