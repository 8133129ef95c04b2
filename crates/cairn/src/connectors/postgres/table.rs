//! The sinks of the `jdbc` connector of SQL jobs, into an existing PostgreSQL table:
//! [`UpsertTableSink`] (the changes of a keyed result, upserted and deleted by primary key) and
//! [`TwoPhaseTableSink`] (rows appended by two-phase commit, no key needed).
//!
//! # Upsert
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
//!
//! # Two-phase commit
//!
//! A record is a row to insert. A writer buffers rows column by column and sends them into a
//! transaction of its own as [`FLUSH_ROWS_MAX`] fill and at every barrier, where it prepares
//! the transaction; it commits when the checkpoint completes, and a restore commits the
//! restored checkpoint's transactions and rolls back the others — all of it the machinery of
//! [`super::two_phase`], which the built-in jobs' `--pg-mode 2pc` uses too. One statement
//! carries up to [`STATEMENT_ROWS_MAX`] rows as one text array per column:
//!
//! ```sql
//! INSERT INTO t (a, b) SELECT CAST(c1 AS bigint), CAST(c2 AS text) FROM unnest($1::text[], $2::text[]) AS u(c1, c2);
//! ```
//!
//! It only inserts: a prepared transaction keeps the rows it wrote locked until its checkpoint
//! completes and the writer commits it, so a change of such a row in the next transaction
//! would wait for a commit that the same writer has yet to run.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use tokio_postgres::types::ToSql;

use super::client::{Pg, Target, STATEMENT_ROWS_MAX};
use super::sink::FLUSH_ROWS_MAX;
use super::two_phase::{self, Rows, TwoPhaseWriter};
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

/// Turns a record into the change of a row.
type ChangeOf<T> = Arc<dyn Fn(&T) -> RowChange + Send + Sync>;

/// What both table sinks know: the table, its columns, and how a record becomes a row.
struct TableSpec<T> {
    target: Arc<Target>,
    columns: Vec<TableColumn>,
    change_of: ChangeOf<T>,
}

impl<T> TableSpec<T> {
    fn new(
        url: &str,
        table: &str,
        columns: Vec<TableColumn>,
        change_of: ChangeOf<T>,
    ) -> Result<Self, String> {
        if columns.is_empty() {
            return Err("a table sink needs at least one column".into());
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
        Ok(TableSpec {
            target: Arc::new(Target::new(url, table)?),
            columns,
            change_of,
        })
    }

    /// The columns' names, quoted.
    fn names(&self) -> Vec<String> {
        self.columns.iter().map(|c| quote(&c.name)).collect()
    }

    /// `CAST(${n}::text AS type)` of column `i`, its parameter numbered `n`.
    fn param(&self, i: usize, n: usize) -> String {
        format!("CAST(${n}::text AS {})", self.columns[i].sql_type)
    }

    /// The two-phase sink's insert (see the module docs).
    fn insert_sql(&self) -> String {
        let n = self.columns.len();
        let casts: Vec<String> = self
            .columns
            .iter()
            .enumerate()
            .map(|(i, c)| format!("CAST(u.c{} AS {})", i + 1, c.sql_type))
            .collect();
        let arrays: Vec<String> = (1..=n).map(|i| format!("${i}::text[]")).collect();
        let aliases: Vec<String> = (1..=n).map(|i| format!("c{i}")).collect();
        format!(
            "INSERT INTO {} ({}) SELECT {} FROM unnest({}) AS u({})",
            self.target.table_sql,
            self.names().join(", "),
            casts.join(", "),
            arrays.join(", "),
            aliases.join(", ")
        )
    }
}

/// Writes changes of type `T` into an existing table, upserting or deleting by primary key.
pub struct UpsertTableSink<T> {
    spec: TableSpec<T>,
    key: Vec<usize>,
}

impl<T> UpsertTableSink<T> {
    /// A sink into `table` at `url` (`postgres://…`) of `columns`, keyed by the columns at
    /// `key`, each record turned into a change by `change_of`.
    pub fn new(
        url: &str,
        table: &str,
        columns: Vec<TableColumn>,
        key: Vec<usize>,
        change_of: ChangeOf<T>,
    ) -> Result<Self, String> {
        if key.is_empty() || key.iter().any(|&k| k >= columns.len()) {
            return Err("an upsert table sink needs a key of its columns".into());
        }
        Ok(UpsertTableSink {
            spec: TableSpec::new(url, table, columns, change_of)?,
            key,
        })
    }

    fn upsert_sql(&self) -> String {
        let spec = &self.spec;
        let names = spec.names();
        let values: Vec<String> = (0..names.len()).map(|i| spec.param(i, i + 1)).collect();
        let keys: Vec<&str> = self.key.iter().map(|&k| names[k].as_str()).collect();
        let mut sql = format!(
            "INSERT INTO {} ({}) VALUES ({}) ON CONFLICT ({}) DO ",
            spec.target.table_sql,
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
                    quote(&self.spec.columns[k].name),
                    self.spec.param(k, n + 1)
                )
            })
            .collect();
        format!(
            "DELETE FROM {} WHERE {}",
            self.spec.target.table_sql,
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
        let pg = Pg::connect(&self.spec.target)?;
        pg.prepare("the table's upsert", &self.upsert_sql())?;
        pg.prepare("the table's delete", &self.delete_sql())?;
        Ok(())
    }

    fn create_writer(&self, _ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        let pg = Pg::connect(&self.spec.target)?;
        let upsert = pg.prepare("the table's upsert", &self.upsert_sql())?;
        let delete = pg.prepare("the table's delete", &self.delete_sql())?;
        Ok(Box::new(TableWriter {
            pg,
            upsert,
            delete,
            key: self.key.clone(),
            change_of: self.spec.change_of.clone(),
            pending: BTreeMap::new(),
            last_barrier: 0,
        }))
    }
}

/// Appends records of type `T` as rows of an existing table by two-phase commit (see the
/// module docs): exactly once, no key needed.
pub struct TwoPhaseTableSink<T> {
    spec: TableSpec<T>,
}

impl<T> TwoPhaseTableSink<T> {
    /// A sink into `table` at `url` (`postgres://…`) of `columns`, each record turned into a
    /// row by `row_of` (a deletion is refused when it comes).
    pub fn new(
        url: &str,
        table: &str,
        columns: Vec<TableColumn>,
        row_of: ChangeOf<T>,
    ) -> Result<Self, String> {
        Ok(TwoPhaseTableSink {
            spec: TableSpec::new(url, table, columns, row_of)?,
        })
    }
}

impl<T: Send + 'static> Sink<T> for TwoPhaseTableSink<T> {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::ExactlyOnce
    }

    fn initialize(&self, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
        let pg = Pg::connect(&self.spec.target)?;
        two_phase::check_server(&pg, owner)?;
        // The table must be there with these columns, writable: an insert of no rows checks it.
        let mut rows = TableRows::new(&pg, &self.spec)?;
        rows.send(&pg)?;
        two_phase::restore(&pg, owner, restored)
    }

    fn create_writer(&self, ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        let writer =
            TwoPhaseWriter::new(&self.spec.target, &ctx, |pg| TableRows::new(pg, &self.spec))?;
        Ok(Box::new(writer))
    }
}

/// The buffered rows of a [`TwoPhaseTableSink`] writer, column by column.
struct TableRows<T> {
    insert: tokio_postgres::Statement,
    row_of: ChangeOf<T>,
    /// Every column's values as text, one entry per row.
    columns: Vec<Vec<Option<String>>>,
}

impl<T> TableRows<T> {
    /// Prepares the insert of `spec` on `pg`.
    fn new(pg: &Pg, spec: &TableSpec<T>) -> TaskResult<Self> {
        let insert = pg.prepare("the table's insert", &spec.insert_sql())?;
        Ok(TableRows {
            insert,
            row_of: spec.change_of.clone(),
            columns: vec![Vec::new(); spec.columns.len()],
        })
    }
}

impl<T: Send> Rows<T> for TableRows<T> {
    fn push(&mut self, batch: &mut Vec<T>) -> TaskResult {
        for record in batch.drain(..) {
            let row = (self.row_of)(&record);
            if row.delete {
                return Err(TaskError::Unrecoverable(
                    "a two-phase table sink only appends rows: it cannot delete one".into(),
                ));
            }
            if row.values.len() != self.columns.len() {
                return Err(TaskError::Unrecoverable(format!(
                    "a row of {} values for a table sink of {} columns",
                    row.values.len(),
                    self.columns.len()
                )));
            }
            for (column, value) in self.columns.iter_mut().zip(row.values) {
                column.push(value);
            }
        }
        Ok(())
    }

    fn len(&self) -> usize {
        self.columns[0].len()
    }

    /// With no rows buffered, one statement of no rows: it checks the table (see
    /// `TwoPhaseTableSink::initialize`).
    fn send(&mut self, pg: &Pg) -> TaskResult {
        let rows = self.len();
        let mut start = 0;
        loop {
            let end = rows.min(start + STATEMENT_ROWS_MAX);
            let arrays: Vec<&[Option<String>]> =
                self.columns.iter().map(|c| &c[start..end]).collect();
            let params: Vec<&(dyn ToSql + Sync)> =
                arrays.iter().map(|a| a as &(dyn ToSql + Sync)).collect();
            pg.execute("cannot insert rows", &self.insert, &params)?;
            start = end;
            if start == rows {
                break;
            }
        }
        self.columns.iter_mut().for_each(Vec::clear);
        Ok(())
    }
}

/// The writing side for one subtask.
struct TableWriter<T> {
    pg: Pg,
    upsert: tokio_postgres::Statement,
    delete: tokio_postgres::Statement,
    key: Vec<usize>,
    change_of: ChangeOf<T>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(columns: &[(&str, &str)]) -> TableSpec<()> {
        let columns = columns
            .iter()
            .map(|(name, sql_type)| TableColumn {
                name: name.to_string(),
                sql_type: sql_type.to_string(),
            })
            .collect();
        let change_of: ChangeOf<()> = Arc::new(|_| RowChange {
            values: Vec::new(),
            delete: false,
        });
        TableSpec::new("postgres://u:p@h:1/db", "s.t", columns, change_of).unwrap()
    }

    #[test]
    fn the_two_phase_insert_casts_one_text_array_per_column() {
        let spec = spec(&[("id", "bigint"), ("price", "numeric(10, 2)")]);
        assert_eq!(
            spec.insert_sql(),
            "INSERT INTO \"s\".\"t\" (\"id\", \"price\") SELECT CAST(u.c1 AS bigint), CAST(u.c2 AS numeric(10, 2)) FROM unnest($1::text[], $2::text[]) AS u(c1, c2)"
        );
    }

    #[test]
    fn columns_must_be_plain_identifiers_and_there_must_be_some() {
        let change_of: ChangeOf<()> = Arc::new(|_| RowChange {
            values: Vec::new(),
            delete: false,
        });
        let column = |name: &str| TableColumn {
            name: name.into(),
            sql_type: "text".into(),
        };
        let e = TableSpec::new(
            "postgres://h/db",
            "t",
            vec![column("a b")],
            change_of.clone(),
        )
        .err()
        .unwrap();
        assert!(e.contains("'a b' is not a plain identifier"), "{e}");
        let e = TableSpec::new("postgres://h/db", "t", Vec::new(), change_of)
            .err()
            .unwrap();
        assert!(e.contains("at least one column"), "{e}");
    }
}
