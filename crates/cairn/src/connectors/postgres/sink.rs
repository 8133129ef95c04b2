//! [`PostgresSink`]: the table, the checks before the first write, and a writer per mode.

use std::sync::Arc;

use tracing::info;

use super::client::{create_table, Pg, Target};
use super::{two_phase, upsert, wal, PgMode};
use crate::connectors::Word;
use crate::error::TaskResult;
use crate::failpoint;
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkOwner, SinkWriter};

/// Updates a 2pc or upsert writer buffers before it sends them (besides at every barrier).
pub(super) const FLUSH_ROWS_MAX: usize = 2048;

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
            PgMode::TwoPhase => Box::new(two_phase::TwoPhaseWriter::new(
                &self.target,
                &ctx,
                two_phase::WordRows::new,
            )?),
            PgMode::Upsert => Box::new(upsert::UpsertWriter::new(Pg::connect(&self.target)?)?),
            PgMode::Wal => Box::new(wal::WalWriter::new(&self.target, &ctx)),
        })
    }
}
