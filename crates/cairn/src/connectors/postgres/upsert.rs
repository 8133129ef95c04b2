//! The idempotent upsert sink (`--pg-mode upsert`): one row per word with its latest count,
//! written at least once.
//!
//! A writer keeps the latest count per word since its last write (a later update of a word
//! replaces an earlier one before anything is sent) and writes them in one statement, sorted
//! by word, whenever [`FLUSH_ROWS_MAX`] updates were buffered and at every barrier, so that
//! everything before barrier c is in the table before c can complete: at-least-once delivery.
//! Only the barrier needs durability: the writes between barriers commit with
//! `synchronous_commit = off` (no WAL flush each), and at the barrier one commit with
//! `synchronous_commit = on` flushes the server's WAL past all of them. A server crash can
//! lose only writes after the last barrier, which the replay from that checkpoint repeats.
//!
//! ```sql
//! INSERT INTO t AS t (word, count) SELECT * FROM unnest($1::text[], $2::bigint[])
//! ON CONFLICT (word) DO UPDATE SET count = EXCLUDED.count WHERE t.count < EXCLUDED.count
//! ```
//!
//! Replaying what was written since the restored checkpoint writes the same rows again, so the
//! table ends as if every update had been written once — if the replay computes the same
//! values (a deterministic job; the key must be the table's key). The guard
//! `WHERE t.count < EXCLUDED.count` matters during the replay: the table already holds counts
//! newer than the restored state, and the replay emits the older counts again on its way back
//! up; without the guard a reader would see a word's count go back and climb again (the
//! table, for a while, describing no moment of the stream at all). With it a row only moves
//! forward. This relies on a word's count only growing; a sink for values that may shrink
//! needs a version column to compare instead.
//!
//! The flaw the seeds name remains: between a failure and the end of the replay, the table
//! holds results newer than the state the job restarted from (they were written, and will be
//! written again), so readers see effects of records the job will process once more.
//! Sorting the rows of a statement by word makes concurrent writers lock rows in one order,
//! so two of them cannot deadlock.

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;
use rustc_hash::FxBuildHasher;
use serde::{Deserialize, Serialize};

use super::client::Pg;
use super::sink::FLUSH_ROWS_MAX;
use crate::connectors::Word;
use crate::error::{TaskError, TaskResult};
use crate::failpoint;
use crate::runtime::operators::SinkWriter;

/// The upsert statement for `table_sql` (see the module docs).
pub(super) fn upsert_sql(table_sql: &str) -> String {
    format!(
        "INSERT INTO {table_sql} AS t (word, count) SELECT * FROM unnest($1::text[], $2::bigint[]) ON CONFLICT (word) DO UPDATE SET count = EXCLUDED.count WHERE t.count < EXCLUDED.count"
    )
}

/// The upsert sink's state in a checkpoint: only the barrier it was taken at, so that a
/// restore can say from which checkpoint the replay rewrites the table.
#[derive(Debug, Serialize, Deserialize)]
struct Barrier {
    checkpoint_id: u64,
}

/// The checkpoint the restored state was taken at (None on a fresh start).
pub(super) fn restored_checkpoint(restored: &Option<Vec<Vec<u8>>>) -> TaskResult<Option<u64>> {
    let Some(entries) = restored else {
        return Ok(None);
    };
    let mut id = None;
    for e in entries {
        let b: Barrier = postcard::from_bytes(e).map_err(|e| {
            TaskError::msg(format!(
                "corrupt PostgreSQL upsert sink state in checkpoint: {e}"
            ))
        })?;
        id = id.max(Some(b.checkpoint_id));
    }
    Ok(id)
}

/// The writing side of the upsert sink for one subtask.
pub(super) struct UpsertWriter {
    pg: Pg,
    upsert: tokio_postgres::Statement,
    /// The latest count per word since the last write.
    latest: HashMap<Word, u64, FxBuildHasher>,
    /// Updates buffered since the last write (before merging per word).
    buffered: usize,
    /// Sorted rows of the write in progress (kept to reuse their allocation).
    rows: Vec<(Word, u64)>,
    /// Whether a write since the last barrier was committed without waiting for the server's
    /// WAL flush.
    unsynced: bool,
    last_barrier: u64,
}

impl UpsertWriter {
    pub(super) fn new(pg: Pg) -> TaskResult<Self> {
        let upsert = pg.prepare(
            "cannot prepare the upsert",
            &upsert_sql(&pg.target.table_sql),
        )?;
        // Writes between barriers need not be durable on their own (see `pre_commit`).
        pg.batch(
            "cannot set synchronous_commit",
            "SET synchronous_commit = off",
        )?;
        Ok(UpsertWriter {
            pg,
            upsert,
            latest: HashMap::with_hasher(FxBuildHasher),
            buffered: 0,
            rows: Vec::new(),
            unsynced: false,
            last_barrier: 0,
        })
    }

    /// Sends the buffered updates, sorted by word, as one statement (per
    /// `STATEMENT_ROWS_MAX`), each committed on its own.
    fn flush(&mut self) -> TaskResult {
        if self.latest.is_empty() {
            return Ok(());
        }
        self.rows.clear();
        self.rows.extend(self.latest.drain());
        self.rows.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        self.pg
            .insert_rows("cannot upsert rows", &self.upsert, &self.rows)?;
        self.rows.clear();
        self.buffered = 0;
        self.unsynced = true;
        Ok(())
    }

    /// Makes every write of this session durable: a transaction that commits with
    /// `synchronous_commit = on` waits until the server's WAL is flushed up to its commit
    /// record, which the commits before it (made with `synchronous_commit = off`) precede.
    /// `txid_current()` gives it a transaction id, so that it writes a commit record at all.
    fn sync(&mut self) -> TaskResult {
        if self.unsynced {
            self.pg.batch(
                "cannot make the upserts durable",
                "BEGIN; SET LOCAL synchronous_commit = on; SELECT txid_current(); COMMIT",
            )?;
            self.unsynced = false;
        }
        Ok(())
    }
}

impl SinkWriter<(Word, u64)> for UpsertWriter {
    fn write(&mut self, batch: &mut Vec<(Word, u64)>) -> TaskResult {
        self.buffered += batch.len();
        for (word, count) in batch.drain(..) {
            match self.latest.entry(word) {
                Entry::Occupied(mut e) => {
                    if count > *e.get() {
                        e.insert(count);
                    }
                }
                Entry::Vacant(e) => {
                    e.insert(count);
                }
            }
        }
        if self.buffered >= FLUSH_ROWS_MAX {
            self.flush()?;
            // Updates of the current checkpoint interval are in the table, its barrier not yet.
            failpoint::hit("sink-writing", self.last_barrier + 1);
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        self.flush()?;
        self.sync()?;
        self.last_barrier = checkpoint_id;
        let state = postcard::to_stdvec(&Barrier { checkpoint_id }).map_err(TaskError::msg)?;
        Ok(vec![state])
    }

    fn commit(&mut self, _checkpoint_id: u64) -> TaskResult {
        // Written at the barrier already.
        Ok(())
    }

    fn finish(&mut self) -> TaskResult {
        self.flush()?;
        self.sync()
    }
}
