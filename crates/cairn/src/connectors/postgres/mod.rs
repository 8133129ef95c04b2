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
//!
//! The SQL `jdbc` connector writes rows of any columns into an existing table with the same
//! machinery: upserted by the table's primary key ([`UpsertTableSink`]), or appended by
//! two-phase commit ([`TwoPhaseTableSink`], `'sink.delivery-guarantee' = 'exactly-once'`).
//!
//! The sinks need the `postgres` feature; [`PgMode`] is there in every build, so that a job can
//! name a PostgreSQL output and fail with an error naming the feature.

#[cfg(feature = "postgres")]
mod client;
#[cfg(feature = "postgres")]
mod sink;
#[cfg(feature = "postgres")]
mod table;
#[cfg(feature = "postgres")]
mod two_phase;
#[cfg(feature = "postgres")]
mod upsert;
#[cfg(feature = "postgres")]
mod wal;

use std::fmt;
use std::str::FromStr;

#[cfg(feature = "postgres")]
pub use client::Target;
#[cfg(feature = "postgres")]
pub use sink::PostgresSink;
#[cfg(feature = "postgres")]
pub use table::{RowChange, TableColumn, TwoPhaseTableSink, UpsertTableSink};
#[cfg(feature = "postgres")]
pub use two_phase::{parse_gid, Gid};

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
