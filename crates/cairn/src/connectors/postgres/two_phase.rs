//! The two-phase-commit sinks: PostgreSQL's prepared transactions, for the built-in jobs'
//! `(word, count)` rows (`--pg-mode 2pc`, [`WordRows`]) and for the rows of a SQL `jdbc` table
//! with `'sink.delivery-guarantee' = 'exactly-once'` (`TableRows` of [`super::table`]).
//!
//! A writer (one per subtask) opens a transaction at the first rows after a barrier and
//! inserts into it as batches fill. At the barrier of checkpoint c it sends what is buffered
//! and runs `PREPARE TRANSACTION '<gid>'`: the transaction is now durable on the server but
//! invisible, detached from the session, and survives the writer's process. The gid is the
//! writer's pending state in the checkpoint. When c completes, the writer runs
//! `COMMIT PREPARED '<gid>'` (on a second connection: the first may already be inside the next
//! transaction, where `COMMIT PREPARED` is not allowed).
//!
//! # Global transaction ids
//!
//! `cairn:<job>:<uid>:<subtask>:<checkpoint>`: the job id and the sink's uid, each escaped as
//! the file sink escapes them (every byte outside `[A-Za-z0-9_.]` as `%XX`, so neither holds a
//! `:`), the subtask index and the checkpoint id in decimal. [`parse_gid`] reads it back. A
//! checkpoint id is used once per job (ids only grow, also across restores), so a gid is
//! unique per job and sink; `cairn:<job>:<uid>:` is the prefix of all gids one sink of one job
//! ever prepares, and of no other sink's or job's. PostgreSQL allows 199 bytes.
//!
//! # Restore
//!
//! [`restore`] (from `Sink::initialize`, before any writer of the attempt exists) commits the
//! gids of the restored checkpoint — idempotently: a gid no longer in `pg_prepared_xacts` was
//! committed by the writer before the failure (PostgreSQL keeps no record of finished gids; a
//! restored gid is only ever committed, never rolled back, by cairn) — and rolls back every
//! other prepared transaction whose gid has this job's and sink's prefix: those of
//! checkpoints that never completed. On a fresh start there is nothing to commit and every
//! leftover of the job and sink is rolled back. Other jobs' and sinks' prepared transactions
//! are never touched; old ones are named in a warning, since a prepared transaction holds its
//! locks and keeps VACUUM from cleaning up until someone finishes it.

use std::collections::HashSet;
use std::sync::Arc;

use tracing::{info, warn};

use super::client::{is_undefined_object, Pg, Target};
use super::sink::FLUSH_ROWS_MAX;
use crate::connectors::file_sink::escape;
use crate::connectors::Word;
use crate::error::{TaskError, TaskResult};
use crate::failpoint;
use crate::runtime::operators::{SinkContext, SinkOwner, SinkWriter};

/// The longest gid PostgreSQL accepts (GIDSIZE - 1).
const GID_BYTES_MAX: usize = 199;

/// Prepared transactions of other jobs older than this are named in a warning at start.
const LINGERING_WARN_AFTER: &str = "10 minutes";

/// The prefix of every gid that `owner` prepares: `cairn:<job>:<uid>:`.
pub(super) fn gid_prefix(owner: &SinkOwner) -> String {
    format!("cairn:{}:{}:", escape(&owner.job_id), escape(&owner.uid))
}

/// The gid of `subtask`'s transaction for checkpoint `checkpoint_id`.
fn gid(prefix: &str, subtask: u32, checkpoint_id: u64) -> String {
    format!("{prefix}{subtask}:{checkpoint_id}")
}

/// A gid read back: (escaped job, escaped uid, subtask, checkpoint).
#[derive(Debug, PartialEq, Eq)]
pub struct Gid<'a> {
    /// The job id, escaped.
    pub job: &'a str,
    /// The sink's uid, escaped.
    pub uid: &'a str,
    /// The subtask that prepared it.
    pub subtask: u32,
    /// The checkpoint it belongs to.
    pub checkpoint_id: u64,
}

/// Reads a gid of the format in the module docs; None if it is not one.
pub fn parse_gid(gid: &str) -> Option<Gid<'_>> {
    let mut parts = gid.split(':');
    let (Some("cairn"), Some(job), Some(uid), Some(subtask), Some(id), None) = (
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
        parts.next(),
    ) else {
        return None;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if job.is_empty() || uid.is_empty() || !digits(subtask) || !digits(id) {
        return None;
    }
    Some(Gid {
        job,
        uid,
        subtask: subtask.parse().ok()?,
        checkpoint_id: id.parse().ok()?,
    })
}

/// Checks that the server allows prepared transactions, and that `owner`'s gids fit.
pub(super) fn check_server(pg: &Pg, owner: &SinkOwner) -> TaskResult {
    let longest = gid(&gid_prefix(owner), u32::MAX, u64::MAX);
    if longest.len() > GID_BYTES_MAX {
        return Err(TaskError::Unrecoverable(format!(
            "PostgreSQL 2pc sink: the transaction ids of sink '{}' of job {} would be longer than PostgreSQL's {GID_BYTES_MAX} bytes; use a shorter uid",
            owner.uid, owner.job_id
        )));
    }
    let max = pg.query_i64(
        "cannot read max_prepared_transactions",
        "SELECT current_setting('max_prepared_transactions')::bigint",
    )?;
    if max == 0 {
        return Err(TaskError::Unrecoverable(format!(
            "PostgreSQL {}: max_prepared_transactions = 0 disables PREPARE TRANSACTION, which the 2pc sink needs; set max_prepared_transactions (e.g. 64: at least the sink's parallelism times one more than the checkpoints in flight) in postgresql.conf and restart the server, or use --pg-mode upsert or wal",
            pg.target.name
        )));
    }
    Ok(())
}

/// Decodes the restored pending state: one gid per entry.
fn restored_gids(restored: Option<Vec<Vec<u8>>>) -> TaskResult<Vec<String>> {
    let mut gids = Vec::new();
    for entry in restored.unwrap_or_default() {
        let gid = String::from_utf8(entry)
            .ok()
            .filter(|g| parse_gid(g).is_some())
            .ok_or_else(|| {
                TaskError::msg("corrupt PostgreSQL 2pc sink state in checkpoint: not a gid")
            })?;
        gids.push(gid);
    }
    gids.sort_by_key(|g| parse_gid(g).map(|p| (p.checkpoint_id, p.subtask)));
    gids.dedup();
    Ok(gids)
}

/// `COMMIT PREPARED` or `ROLLBACK PREPARED` (`verb`) of `gid`; false if no such prepared
/// transaction exists (any more).
fn finish_prepared(pg: &Pg, verb: &str, gid: &str) -> TaskResult<bool> {
    // The gid holds only [A-Za-z0-9_.%:] (see `escape`), never a quote.
    match pg.try_batch(&format!("{verb} PREPARED '{gid}'")) {
        Ok(()) => Ok(true),
        Err(e) if is_undefined_object(&e) => Ok(false),
        Err(e) => Err(pg
            .target
            .error(&format!("{verb} PREPARED '{gid}' failed"), &e)),
    }
}

/// Restores the sink for `owner` (see the module docs): commits the restored checkpoint's
/// gids, rolls back the job's and sink's other prepared transactions.
pub(super) fn restore(pg: &Pg, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
    let gids = restored_gids(restored)?;
    let prefix = gid_prefix(owner);
    let open: HashSet<String> = pg
        .query_strings(
            "cannot list prepared transactions",
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND (starts_with(gid, $1) OR gid = ANY($2))",
            &[&prefix, &gids],
        )?
        .into_iter()
        .collect();
    let (mut committed, mut already) = (0, 0);
    for (i, g) in gids.iter().enumerate() {
        if open.contains(g) && finish_prepared(pg, "COMMIT", g)? {
            committed += 1;
        } else {
            already += 1;
        }
        if i == 0 {
            let id = gids
                .iter()
                .filter_map(|g| parse_gid(g))
                .map(|g| g.checkpoint_id)
                .max()
                .unwrap_or(0);
            failpoint::hit("sink-restoring", id);
        }
    }
    let mut rolled_back = 0;
    let restored: HashSet<&String> = gids.iter().collect();
    let mut leftovers: Vec<&String> = open
        .iter()
        .filter(|g| g.starts_with(&prefix) && !restored.contains(g))
        .collect();
    leftovers.sort();
    for g in leftovers {
        if finish_prepared(pg, "ROLLBACK", g)? {
            rolled_back += 1;
        }
    }
    if committed + already + rolled_back > 0 {
        info!(
            "PostgreSQL 2pc sink '{}' of job {}: committed {committed} prepared transaction(s) of the restored checkpoint ({already} were committed before), rolled back {rolled_back} of checkpoints that never completed",
            owner.uid, owner.job_id
        );
    }
    warn_lingering(pg, &prefix)
}

/// Names the prepared transactions of other cairn jobs that have waited for a commit or
/// rollback for long: their job may be gone for good, and until someone finishes them they
/// hold locks and keep VACUUM from removing dead rows.
fn warn_lingering(pg: &Pg, own_prefix: &str) -> TaskResult {
    let old = pg.query_strings(
        "cannot list prepared transactions",
        &format!(
            "SELECT gid FROM pg_prepared_xacts WHERE database = current_database() AND starts_with(gid, 'cairn:') AND NOT starts_with(gid, $1) AND prepared < now() - interval '{LINGERING_WARN_AFTER}' ORDER BY prepared"
        ),
        &[&own_prefix],
    )?;
    for g in old.iter().take(10) {
        warn!(
            "PostgreSQL {}: prepared transaction '{g}' of another cairn job has waited over {LINGERING_WARN_AFTER}; if that job will not resume, run ROLLBACK PREPARED '{g}'",
            pg.target.name
        );
    }
    Ok(())
}

/// The rows a [`TwoPhaseWriter`] buffers, and how they go into its open transaction.
pub(super) trait Rows<T>: Send {
    /// Buffers the records of `batch` (draining it).
    fn push(&mut self, batch: &mut Vec<T>) -> TaskResult;
    /// How many rows are buffered.
    fn len(&self) -> usize;
    /// Sends the buffered rows on `pg`, inside its open transaction, and forgets them.
    fn send(&mut self, pg: &Pg) -> TaskResult;
}

/// The `(word, count)` rows of the built-in jobs' 2pc sink.
pub(super) struct WordRows {
    insert: tokio_postgres::Statement,
    buffer: Vec<(Word, u64)>,
}

impl WordRows {
    /// Prepares the insert on `pg`, the writer's data connection.
    pub(super) fn new(pg: &Pg) -> TaskResult<Self> {
        let insert = pg.prepare(
            "cannot prepare the insert",
            &format!(
                "INSERT INTO {} (word, count) SELECT * FROM unnest($1::text[], $2::bigint[])",
                pg.target.table_sql
            ),
        )?;
        Ok(WordRows {
            insert,
            buffer: Vec::with_capacity(FLUSH_ROWS_MAX),
        })
    }
}

impl Rows<(Word, u64)> for WordRows {
    fn push(&mut self, batch: &mut Vec<(Word, u64)>) -> TaskResult {
        self.buffer.append(batch);
        Ok(())
    }

    fn len(&self) -> usize {
        self.buffer.len()
    }

    fn send(&mut self, pg: &Pg) -> TaskResult {
        pg.insert_rows("cannot insert rows", &self.insert, &self.buffer)?;
        self.buffer.clear();
        Ok(())
    }
}

/// The writing side of a 2pc sink for one subtask, its rows buffered and sent by `R`.
pub(super) struct TwoPhaseWriter<R> {
    target: Arc<Target>,
    /// The connection the transactions are written on.
    data: Pg,
    /// The connection `COMMIT PREPARED` runs on (opened at the first commit).
    control: Option<Pg>,
    /// Rows not yet sent.
    rows: R,
    gid_prefix: String,
    subtask: u32,
    checkpointing: bool,
    /// Whether a transaction is open on `data`, and how many rows were sent into it.
    open: bool,
    open_rows: u64,
    /// The last barrier's checkpoint id: rows now written belong to a later one.
    last_barrier: u64,
    /// Prepared and not yet committed: (checkpoint id, gid).
    pending: Vec<(u64, String)>,
}

impl<R> TwoPhaseWriter<R> {
    /// A writer into `target`, its rows made by `rows` on the data connection (which
    /// prepares their statements there).
    pub(super) fn new(
        target: &Arc<Target>,
        ctx: &SinkContext,
        rows: impl FnOnce(&Pg) -> TaskResult<R>,
    ) -> TaskResult<Self> {
        let data = Pg::connect(target)?;
        let rows = rows(&data)?;
        Ok(TwoPhaseWriter {
            target: target.clone(),
            data,
            control: None,
            rows,
            gid_prefix: gid_prefix(&ctx.owner),
            subtask: ctx.subtask,
            checkpointing: ctx.checkpointing,
            open: false,
            open_rows: 0,
            last_barrier: 0,
            pending: Vec::new(),
        })
    }

    /// Sends the buffered rows into the open transaction (opening one if needed).
    fn flush<T>(&mut self) -> TaskResult
    where
        R: Rows<T>,
    {
        let n = self.rows.len();
        if n == 0 {
            return Ok(());
        }
        if !self.open {
            self.data.batch("cannot begin a transaction", "BEGIN")?;
            self.open = true;
        }
        self.rows.send(&self.data)?;
        self.open_rows += n as u64;
        // Rows are in an open transaction, neither prepared nor committed.
        failpoint::hit("sink-writing", self.last_barrier + 1);
        Ok(())
    }
}

impl<T: Send, R: Rows<T>> SinkWriter<T> for TwoPhaseWriter<R> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        self.rows.push(batch)?;
        if self.rows.len() >= FLUSH_ROWS_MAX {
            self.flush::<T>()?;
        }
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        self.flush::<T>()?;
        if self.open {
            if self.open_rows > 0 {
                let gid = gid(&self.gid_prefix, self.subtask, checkpoint_id);
                self.data.batch(
                    "cannot prepare the transaction",
                    &format!("PREPARE TRANSACTION '{gid}'"),
                )?;
                self.pending.push((checkpoint_id, gid));
            } else {
                self.data.batch("cannot roll back", "ROLLBACK")?;
            }
            self.open = false;
            self.open_rows = 0;
        }
        self.last_barrier = checkpoint_id;
        Ok(self
            .pending
            .iter()
            .map(|(_, g)| g.as_bytes().to_vec())
            .collect())
    }

    fn commit(&mut self, checkpoint_id: u64) -> TaskResult {
        if !self.pending.iter().any(|(id, _)| *id <= checkpoint_id) {
            return Ok(());
        }
        if self.control.is_none() {
            self.control = Some(Pg::connect(&self.target)?);
        }
        let Some(control) = &self.control else {
            return Ok(());
        };
        // A gid leaves `pending` once committed, so a failure keeps the rest for the restore.
        let mut i = 0;
        while i < self.pending.len() {
            let (id, g) = &self.pending[i];
            if *id > checkpoint_id {
                i += 1;
                continue;
            }
            if !finish_prepared(control, "COMMIT", g)? {
                // Only this writer commits its gids while it runs: someone else finished it.
                warn!(
                    "PostgreSQL {}: prepared transaction '{g}' was gone at its commit; another session committed or rolled it back",
                    self.target.name
                );
            }
            self.pending.remove(i);
        }
        Ok(())
    }

    fn finish(&mut self) -> TaskResult {
        if self.checkpointing {
            // Everything was prepared at the final checkpoint's barrier and committed when it
            // completed: nothing may be left.
            let rows = self.open_rows + self.rows.len() as u64;
            if rows > 0 {
                return Err(TaskError::msg(format!(
                    "PostgreSQL 2pc sink: {rows} rows were written after the final checkpoint"
                )));
            }
            if self.open {
                self.data.batch("cannot roll back", "ROLLBACK")?;
                self.open = false;
            }
            return Ok(());
        }
        // Without checkpoints the end of input is the only commit point.
        self.flush::<T>()?;
        if self.open {
            self.data.batch("cannot commit the transaction", "COMMIT")?;
            self.open = false;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(job: &str, uid: &str) -> SinkOwner {
        SinkOwner {
            job_id: job.into(),
            uid: uid.into(),
        }
    }

    #[test]
    fn gids_name_job_sink_subtask_and_checkpoint_and_parse_back() {
        let job = format!("{:032x}", 0xabcu128);
        let g = gid(&gid_prefix(&owner(&job, "sink")), 3, 17);
        assert_eq!(g, format!("cairn:{job}:sink:3:17"));
        assert_eq!(
            parse_gid(&g),
            Some(Gid {
                job: &job,
                uid: "sink",
                subtask: 3,
                checkpoint_id: 17
            })
        );
        // A uid with the separator is escaped, so the fields stay unambiguous.
        let g = gid(&gid_prefix(&owner("j", "a:b-c")), 0, 1);
        assert_eq!(g, "cairn:j:a%3Ab%2Dc:0:1");
        assert_eq!(parse_gid(&g).map(|p| p.uid), Some("a%3Ab%2Dc"));
        for bad in [
            "",
            "cairn:j:u:0",
            "cairn:j:u:0:1:2",
            "other:j:u:0:1",
            "cairn::u:0:1",
            "cairn:j:u:x:1",
            "cairn:j:u:0:",
        ] {
            assert_eq!(parse_gid(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn one_sinks_prefix_never_covers_another_sinks_or_jobs_gids() {
        let a = gid_prefix(&owner("job", "sink"));
        for other in [
            owner("job", "sink-2"),
            owner("job", "sin"),
            owner("job2", "sink"),
            owner("jo", "b:sink"),
        ] {
            let g = gid(&gid_prefix(&other), 0, 1);
            assert!(!g.starts_with(&a), "{g} has the prefix {a}");
        }
    }

    #[test]
    fn restored_state_is_decoded_in_checkpoint_order_and_corruption_is_refused() {
        let p = gid_prefix(&owner("j", "s"));
        let entries = vec![
            gid(&p, 1, 9).into_bytes(),
            gid(&p, 0, 7).into_bytes(),
            gid(&p, 0, 9).into_bytes(),
        ];
        let gids = restored_gids(Some(entries)).unwrap();
        assert_eq!(gids, vec![gid(&p, 0, 7), gid(&p, 0, 9), gid(&p, 1, 9)]);
        assert!(restored_gids(None).unwrap().is_empty());
        let e = restored_gids(Some(vec![b"nonsense".to_vec()])).unwrap_err();
        assert!(e.to_string().contains("corrupt PostgreSQL 2pc sink state"));
    }
}
