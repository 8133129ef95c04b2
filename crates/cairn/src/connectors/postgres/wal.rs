//! The write-ahead-log sink (`--pg-mode wal`): results wait in the sink's state until their
//! checkpoint completes, then go to the table in one transaction together with a row in a
//! commit table that names them.
//!
//! Between barriers a writer only collects rows in memory. At the barrier of checkpoint c they
//! become a *batch* — (job, subtask, c, rows) — which joins the writer's pending state (the
//! checkpoint holds every batch not yet committed). When c completes, each pending batch up
//! to c is written in one transaction: first
//! `INSERT INTO <table>_cairn_commits (job, operator, subtask, checkpoint) … ON CONFLICT DO
//! NOTHING`, then, only if that inserted the row, the batch's rows; then `COMMIT`. The
//! commit row and the rows become visible together or not at all, so the commit table says
//! exactly which batches are in the table.
//!
//! After a failure, `Sink::initialize` is given the restored checkpoint's pending batches and
//! offers each to the same transaction again: a batch whose commit row exists was written
//! before the failure and is skipped, the others are written now. Nothing is written for a
//! checkpoint that never completed (its batch is in no restored state; the replay produces
//! its rows again). Flink's write-ahead sink records its commits separately from the data, so
//! a crash between the two writes duplicates a batch; here both are one transaction.
//!
//! The cost, as the seeds say: every result is held in state (and in every checkpoint) until
//! its checkpoint completes, so checkpoints grow with the output and results reach the table
//! a checkpoint later, in bursts. The commit table keeps one small row per subtask and
//! checkpoint with output; rows of jobs that will not resume can be deleted.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tracing::info;

use super::client::{Pg, Target};
use super::sink::FLUSH_ROWS_MAX;
use crate::connectors::Word;
use crate::error::{TaskError, TaskResult};
use crate::failpoint;
use crate::runtime::operators::{SinkContext, SinkOwner, SinkWriter};

/// One subtask's rows of one checkpoint: the unit written (or skipped) at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(super) struct WalBatch {
    /// The job that produced it (a job restored under a new id still commits the old job's
    /// batches under the old id, so that a replay is recognised).
    job: String,
    subtask: u32,
    checkpoint_id: u64,
    rows: Vec<(Word, u64)>,
}

/// The statements a batch's transaction runs.
pub(super) struct WalStatements {
    record: tokio_postgres::Statement,
    insert: tokio_postgres::Statement,
}

impl WalStatements {
    pub(super) fn prepare(pg: &Pg) -> TaskResult<Self> {
        let t = &pg.target;
        Ok(WalStatements {
            record: pg.prepare(
                "cannot prepare the commit record",
                &format!(
                    "INSERT INTO {} (job, operator, subtask, checkpoint, rows) VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING",
                    t.commits_sql
                ),
            )?,
            insert: pg.prepare(
                "cannot prepare the insert",
                &format!(
                    "INSERT INTO {} (word, count) SELECT * FROM unnest($1::text[], $2::bigint[])",
                    t.table_sql
                ),
            )?,
        })
    }
}

/// The commit table's definition.
pub(super) fn commits_ddl(target: &Target) -> String {
    format!(
        "CREATE TABLE IF NOT EXISTS {} (job text NOT NULL, operator text NOT NULL, subtask integer NOT NULL, checkpoint bigint NOT NULL, rows bigint NOT NULL, committed_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (job, operator, subtask, checkpoint))",
        target.commits_sql
    )
}

/// Writes `batch` of sink `uid` unless the commit table says it was; returns whether it wrote.
fn commit_batch(pg: &Pg, st: &WalStatements, uid: &str, batch: &WalBatch) -> TaskResult<bool> {
    pg.batch("cannot begin a transaction", "BEGIN")?;
    let result = (|| {
        let subtask = i32::try_from(batch.subtask).map_err(TaskError::msg)?;
        let checkpoint = i64::try_from(batch.checkpoint_id).map_err(TaskError::msg)?;
        let rows = batch.rows.len() as i64;
        let recorded = pg.execute(
            "cannot record the commit",
            &st.record,
            &[&batch.job, &uid, &subtask, &checkpoint, &rows],
        )?;
        if recorded == 0 {
            return Ok(false);
        }
        pg.insert_rows("cannot insert rows", &st.insert, &batch.rows)?;
        // The rows and their commit record are written, in a transaction not yet committed.
        failpoint::hit("sink-writing", batch.checkpoint_id);
        Ok(true)
    })();
    match result {
        Ok(true) => {
            pg.batch("cannot commit", "COMMIT")?;
            Ok(true)
        }
        Ok(false) => {
            pg.batch("cannot roll back", "ROLLBACK")?;
            Ok(false)
        }
        Err(e) => {
            let _ = pg.try_batch("ROLLBACK");
            Err(e)
        }
    }
}

fn decode(entry: &[u8]) -> TaskResult<WalBatch> {
    postcard::from_bytes(entry).map_err(|e| {
        TaskError::msg(format!(
            "corrupt PostgreSQL wal sink state in checkpoint: {e}"
        ))
    })
}

/// Offers the restored checkpoint's batches again (see the module docs).
pub(super) fn restore(pg: &Pg, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
    let mut batches = restored
        .unwrap_or_default()
        .iter()
        .map(|e| decode(e))
        .collect::<TaskResult<Vec<_>>>()?;
    if batches.is_empty() {
        return Ok(());
    }
    batches.sort_by_key(|b| (b.checkpoint_id, b.subtask));
    let restored_id = batches.iter().map(|b| b.checkpoint_id).max().unwrap_or(0);
    let st = WalStatements::prepare(pg)?;
    let (mut written, mut skipped) = (0, 0);
    for (i, b) in batches.iter().enumerate() {
        if commit_batch(pg, &st, &owner.uid, b)? {
            written += 1;
        } else {
            skipped += 1;
        }
        if i == 0 {
            failpoint::hit("sink-restoring", restored_id);
        }
    }
    info!(
        "PostgreSQL wal sink '{}' of job {}: wrote {written} batch(es) of the restored checkpoint, skipped {skipped} the commit table has",
        owner.uid, owner.job_id
    );
    Ok(())
}

/// The writing side of the wal sink for one subtask.
pub(super) struct WalWriter {
    target: Arc<Target>,
    /// Connected at the first commit.
    pg: Option<(Pg, WalStatements)>,
    job: String,
    uid: String,
    subtask: u32,
    checkpointing: bool,
    /// Rows since the last barrier.
    rows: Vec<(Word, u64)>,
    /// Pre-committed batches, encoded as they are in the checkpoint: (checkpoint id, bytes).
    pending: Vec<(u64, Vec<u8>)>,
}

impl WalWriter {
    pub(super) fn new(target: &Arc<Target>, ctx: &SinkContext) -> Self {
        WalWriter {
            target: target.clone(),
            pg: None,
            job: ctx.owner.job_id.clone(),
            uid: ctx.owner.uid.clone(),
            subtask: ctx.subtask,
            checkpointing: ctx.checkpointing,
            rows: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Connects (once) and prepares the statements.
    fn connect(&mut self) -> TaskResult {
        if self.pg.is_none() {
            let pg = Pg::connect(&self.target)?;
            let st = WalStatements::prepare(&pg)?;
            self.pg = Some((pg, st));
        }
        Ok(())
    }

    /// Without checkpoints nothing is ever replayed, so there is nothing to log: the rows go
    /// to the table as they fill a batch, and at the end of input.
    fn write_unlogged(&mut self) -> TaskResult {
        if self.rows.is_empty() {
            return Ok(());
        }
        self.connect()?;
        let Some((pg, st)) = &self.pg else {
            return Ok(());
        };
        pg.insert_rows("cannot insert rows", &st.insert, &self.rows)?;
        self.rows.clear();
        Ok(())
    }
}

impl SinkWriter<(Word, u64)> for WalWriter {
    fn write(&mut self, batch: &mut Vec<(Word, u64)>) -> TaskResult {
        self.rows.append(batch);
        if !self.checkpointing && self.rows.len() >= FLUSH_ROWS_MAX {
            self.write_unlogged()?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        if !self.rows.is_empty() {
            let batch = WalBatch {
                job: self.job.clone(),
                subtask: self.subtask,
                checkpoint_id,
                rows: std::mem::take(&mut self.rows),
            };
            let bytes = postcard::to_stdvec(&batch).map_err(TaskError::msg)?;
            self.pending.push((checkpoint_id, bytes));
        }
        Ok(self.pending.iter().map(|(_, b)| b.clone()).collect())
    }

    fn commit(&mut self, checkpoint_id: u64) -> TaskResult {
        if !self.pending.iter().any(|(id, _)| *id <= checkpoint_id) {
            return Ok(());
        }
        self.connect()?;
        let Some((pg, st)) = &self.pg else {
            return Ok(());
        };
        // A batch leaves `pending` once written, so a failure keeps the rest for the restore.
        let mut i = 0;
        while i < self.pending.len() {
            if self.pending[i].0 > checkpoint_id {
                i += 1;
                continue;
            }
            commit_batch(pg, st, &self.uid, &decode(&self.pending[i].1)?)?;
            self.pending.remove(i);
        }
        Ok(())
    }

    fn finish(&mut self) -> TaskResult {
        if self.checkpointing {
            if !self.rows.is_empty() {
                return Err(TaskError::msg(format!(
                    "PostgreSQL wal sink: {} rows were written after the final checkpoint",
                    self.rows.len()
                )));
            }
            return Ok(());
        }
        self.write_unlogged()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_round_trips_through_its_state_entry() {
        let b = WalBatch {
            job: "j".into(),
            subtask: 1,
            checkpoint_id: 4,
            rows: vec![("w1".into(), 1), ("w2".into(), 7)],
        };
        let bytes = postcard::to_stdvec(&b).unwrap();
        assert_eq!(decode(&bytes).unwrap(), b);
        let e = decode(&[0xff, 0xff]).unwrap_err();
        assert!(e.to_string().contains("corrupt PostgreSQL wal sink state"));
    }
}
