//! PostgreSQL sinks for `(word, count)` updates, in the three ways the seeds compare (R16, R17):
//!
//! | mode | table | how | guarantee | its flaw |
//! |---|---|---|---|---|
//! | [`PgMode::TwoPhase`] (`2pc`) | one row per update | a transaction per subtask and checkpoint, `PREPARE TRANSACTION` at the barrier, `COMMIT PREPARED` when the checkpoint completes ([`two_phase`]) | exactly once | needs `max_prepared_transactions > 0`; output is visible a checkpoint late; a prepared transaction holds locks and holds back VACUUM until committed or rolled back, for as long as a failed job stays down |
//! | [`PgMode::Upsert`] (`upsert`) | one row per word, its latest count | `INSERT … ON CONFLICT (word) DO UPDATE` at least once: flushed at every barrier ([`upsert`]) | exactly-once *result* by idempotence | after a failure the table runs ahead of the restored state until the replay catches up; needs a key and a deterministic job |
//! | [`PgMode::Wal`] (`wal`) | one row per update | rows kept in the sink's state until their checkpoint completes, then written in one transaction with a row in a commit table that a replay checks ([`wal`]) | exactly once | every result sits in state and in checkpoints until its checkpoint completes; output arrives a checkpoint late, in bursts |
//!
//! Every sink creates its table if it does not exist (`word text, count bigint`; for upsert
//! `word` is the primary key; wal adds `<table>_cairn_commits`) and writes in batches: one
//! `INSERT … SELECT * FROM unnest($1::text[], $2::bigint[])` carries up to
//! [`client::STATEMENT_ROWS_MAX`] rows.
//!
//! With checkpointing off nothing is replayed (at most once): 2pc commits its one transaction
//! per subtask at the end of input, as the file sink does; upsert and wal write as batches fill.
//!
//! Connections are plain TCP (no TLS), one per writer (two for 2pc: `COMMIT PREPARED` cannot
//! run inside the next transaction), each driven by its own current-thread tokio runtime.
//! [`PostgresSink::initialize`] connects before any writer exists and checks what can be
//! checked up front — the server answers, the table can be created and written, and for 2pc
//! that `max_prepared_transactions` is not 0 — so that a misconfiguration stops the job at
//! once with one line naming it.

mod client;
mod two_phase;
mod upsert;
mod wal;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use tracing::info;

pub use client::Target;
pub use two_phase::{parse_gid, Gid};

use crate::connectors::Word;
use crate::error::TaskResult;
use crate::failpoint;
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkOwner, SinkWriter};
use client::{create_table, Pg};

/// Updates a 2pc or upsert writer buffers before it sends them (besides at every barrier).
const FLUSH_ROWS_MAX: usize = 2048;

/// How a PostgreSQL sink makes its output exactly once (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PgMode {
    /// Two-phase commit with prepared transactions.
    TwoPhase,
    /// Idempotent upsert, at-least-once writes.
    Upsert,
    /// Write-ahead log with a commit table.
    Wal,
}

impl FromStr for PgMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "2pc" => Ok(PgMode::TwoPhase),
            "upsert" => Ok(PgMode::Upsert),
            "wal" => Ok(PgMode::Wal),
            other => Err(format!("--pg-mode '{other}': expected 2pc, upsert or wal")),
        }
    }
}

impl fmt::Display for PgMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PgMode::TwoPhase => "2pc",
            PgMode::Upsert => "upsert",
            PgMode::Wal => "wal",
        })
    }
}

/// A sink of `(word, count)` updates into a PostgreSQL table.
#[derive(Debug, Clone)]
pub struct PostgresSink {
    target: Arc<Target>,
    mode: PgMode,
}

impl PostgresSink {
    /// A sink into `table` of the database at `url` (`postgres://USER:PASSWORD@HOST:PORT/DB`);
    /// checks the URL and the table name, does not connect yet.
    pub fn new(url: &str, table: &str, mode: PgMode) -> Result<Self, String> {
        Ok(PostgresSink {
            target: Arc::new(Target::new(url, table)?),
            mode,
        })
    }

    /// The table's definition in this mode.
    fn table_ddl(&self) -> String {
        let t = &self.target.table_sql;
        match self.mode {
            PgMode::Upsert => format!(
                "CREATE TABLE IF NOT EXISTS {t} (word text PRIMARY KEY, count bigint NOT NULL)"
            ),
            PgMode::TwoPhase | PgMode::Wal => format!(
                "CREATE TABLE IF NOT EXISTS {t} (word text NOT NULL, count bigint NOT NULL)"
            ),
        }
    }

    /// Creates the tables if needed and checks that this sink's statement runs on them (right
    /// columns, a unique key on `word` for upsert, the privilege to insert), with no rows.
    fn prepare_tables(&self, pg: &Pg) -> TaskResult {
        let t = &self.target;
        create_table(pg, &t.table, &self.table_ddl())?;
        let probe = match self.mode {
            PgMode::Upsert => upsert::upsert_sql(&t.table_sql),
            PgMode::TwoPhase | PgMode::Wal => format!(
                "INSERT INTO {} (word, count) SELECT * FROM unnest($1::text[], $2::bigint[])",
                t.table_sql
            ),
        };
        let what = format!("cannot write table {}", t.table);
        let statement = pg.prepare(&what, &probe)?;
        let (words, counts): (Vec<&str>, Vec<i64>) = (Vec::new(), Vec::new());
        pg.execute(&what, &statement, &[&words, &counts])
            .map_err(|e| match self.mode {
                PgMode::Upsert if e.to_string().contains("SQLSTATE 42P10") => e.context(format!(
                    "--pg-mode upsert needs a primary key or unique index on {}(word) (a table created by 2pc or wal has none)",
                    t.table
                )),
                _ => e,
            })?;
        if self.mode == PgMode::Wal {
            let commits = format!("{}_cairn_commits", t.table);
            create_table(pg, &commits, &wal::commits_ddl(t))?;
            wal::WalStatements::prepare(pg)?;
        }
        Ok(())
    }
}

impl Sink<(Word, u64)> for PostgresSink {
    fn guarantee(&self) -> SinkGuarantee {
        // Upsert's writes are at least once, its table's content exactly once (idempotence).
        SinkGuarantee::ExactlyOnce
    }

    fn initialize(&self, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
        let pg = Pg::connect(&self.target)?;
        if self.mode == PgMode::TwoPhase {
            two_phase::check_server(&pg, owner)?;
        }
        self.prepare_tables(&pg)?;
        match self.mode {
            PgMode::TwoPhase => two_phase::restore(&pg, owner, restored),
            PgMode::Wal => wal::restore(&pg, owner, restored),
            PgMode::Upsert => {
                if let Some(id) = upsert::restored_checkpoint(&restored)? {
                    info!(
                        "PostgreSQL upsert sink '{}' of job {}: restored at checkpoint {id}; the replay rewrites the rows written after it",
                        owner.uid, owner.job_id
                    );
                    failpoint::hit("sink-restoring", id);
                }
                Ok(())
            }
        }
    }

    fn create_writer(&self, ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<(Word, u64)>>> {
        Ok(match self.mode {
            PgMode::TwoPhase => Box::new(two_phase::TwoPhaseWriter::new(&self.target, &ctx)?),
            PgMode::Upsert => Box::new(upsert::UpsertWriter::new(Pg::connect(&self.target)?)?),
            PgMode::Wal => Box::new(wal::WalWriter::new(&self.target, &ctx)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_parse_and_print() {
        for m in ["2pc", "upsert", "wal"] {
            assert_eq!(m.parse::<PgMode>().unwrap().to_string(), m);
        }
        let e = "xa".parse::<PgMode>().unwrap_err();
        assert_eq!(e, "--pg-mode 'xa': expected 2pc, upsert or wal");
    }
}
