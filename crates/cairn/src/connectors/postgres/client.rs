//! One connection to PostgreSQL, driven synchronously, and the SQL the sinks share.
//!
//! Sink writers run on task threads, which are not async: each [`Pg`] owns a current-thread
//! tokio runtime and blocks on it for every call. The connection's background future is
//! spawned on that runtime and makes progress only while a call blocks on it, which is all a
//! synchronous caller needs. Dropping a `Pg` closes the connection: the server rolls back a
//! transaction left open on it (a prepared one survives, by design).

use std::fmt::Write as _;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{Client, NoTls, Statement};

use crate::connectors::Word;
use crate::error::{TaskError, TaskResult};

/// How long connecting may take when the URL does not say (`connect_timeout`).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Rows per INSERT statement at most: one statement carries a whole batch as two arrays
/// (`unnest($1::text[], $2::bigint[])`), so a round trip costs per batch, not per row.
pub(super) const STATEMENT_ROWS_MAX: usize = 4096;

/// Where a sink writes: the server, and the output table. Shared by the sink and its writers.
#[derive(Debug)]
pub struct Target {
    config: tokio_postgres::Config,
    /// `host:port/database` for messages (never the password).
    pub(super) name: String,
    /// The output table, as given.
    pub(super) table: String,
    /// The output table, quoted for SQL.
    pub(super) table_sql: String,
    /// The write-ahead-log sink's commit table (`<table>_cairn_commits`), quoted for SQL.
    pub(super) commits_sql: String,
}

/// The longest identifier PostgreSQL keeps (NAMEDATALEN - 1).
const IDENTIFIER_BYTES_MAX: usize = 63;
/// Suffix of the write-ahead-log sink's commit table.
const COMMITS_SUFFIX: &str = "_cairn_commits";

/// Quotes `[schema.]table` for SQL, after checking it is a plain identifier: letters, digits,
/// `_` and `$`, not starting with a digit, at most 63 bytes per part (with room for the commit
/// table's suffix). Quoting keeps the name exactly as given (upper case included).
fn quote_table(table: &str, suffix: &str) -> Result<String, String> {
    let parts: Vec<&str> = table.split('.').collect();
    if parts.len() > 2 {
        return Err(format!(
            "--pg-table '{table}': expected TABLE or SCHEMA.TABLE"
        ));
    }
    let mut quoted = String::new();
    for (i, part) in parts.iter().enumerate() {
        let last = i + 1 == parts.len();
        let name = if last {
            format!("{part}{suffix}")
        } else {
            part.to_string()
        };
        let plain = part
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'$');
        let starts_well = part
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
        if !plain || !starts_well {
            return Err(format!(
                "--pg-table '{table}': '{part}' is not a plain identifier (letters, digits, _ and $, not starting with a digit)"
            ));
        }
        if name.len() > IDENTIFIER_BYTES_MAX {
            return Err(format!(
                "--pg-table '{table}': '{name}' is longer than PostgreSQL's {IDENTIFIER_BYTES_MAX} bytes"
            ));
        }
        if i > 0 {
            quoted.push('.');
        }
        let _ = write!(quoted, "\"{name}\"");
    }
    Ok(quoted)
}

impl Target {
    /// Parses a connection URL (`postgres://user:password@host:port/database`, or libpq's
    /// `key=value` form) and checks the table name. TLS is not built in: a URL that requires it
    /// is refused.
    pub fn new(url: &str, table: &str) -> Result<Target, String> {
        let mut config = tokio_postgres::Config::from_str(url).map_err(|e| {
            format!("--pg-output: not a PostgreSQL URL (postgres://USER:PASSWORD@HOST:PORT/DATABASE): {}", describe(&e))
        })?;
        if config.get_ssl_mode() == SslMode::Require {
            return Err(
                "--pg-output: sslmode=require is not supported (cairn connects without TLS); use sslmode=disable or prefer"
                    .into(),
            );
        }
        if config.get_hosts().is_empty() {
            return Err(format!("--pg-output '{}': no host", redact(url)));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name("cairn");
        }
        let host = match &config.get_hosts()[0] {
            Host::Tcp(h) => h.clone(),
            Host::Unix(p) => p.display().to_string(),
        };
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let db = config
            .get_dbname()
            .or(config.get_user())
            .unwrap_or("postgres");
        Ok(Target {
            name: format!("{host}:{port}/{db}"),
            table: table.to_string(),
            table_sql: quote_table(table, "")?,
            commits_sql: quote_table(table, COMMITS_SUFFIX)?,
            config,
        })
    }

    /// An error of this target: `PostgreSQL host:port/db: WHAT: CAUSE`.
    pub(super) fn error(&self, what: &str, e: &tokio_postgres::Error) -> TaskError {
        TaskError::msg(format!("PostgreSQL {}: {what}: {}", self.name, describe(e)))
    }
}

/// The URL with its password replaced, for messages.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

/// An error on one line: the server's message and SQLSTATE, or the client's error and its
/// causes.
fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if let Some(hint) = db.hint() {
            let _ = write!(s, "; hint: {hint}");
        }
        return s;
    }
    let mut s = e.to_string();
    let mut cause = std::error::Error::source(e);
    while let Some(c) = cause {
        let _ = write!(s, ": {c}");
        cause = c.source();
    }
    s.replace('\n', " ")
}

/// Whether `e` says that a prepared transaction (or other object) does not exist.
pub(super) fn is_undefined_object(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNDEFINED_OBJECT)
}

/// One connection, used synchronously (see the module docs).
pub(super) struct Pg {
    // Dropped first: its tasks, the connection among them, go with it.
    rt: tokio::runtime::Runtime,
    client: Client,
    pub(super) target: Arc<Target>,
}

impl Pg {
    /// Connects to `target`.
    pub(super) fn connect(target: &Arc<Target>) -> TaskResult<Pg> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| TaskError::msg(format!("cannot start a runtime for PostgreSQL: {e}")))?;
        let (client, connection) = rt
            .block_on(target.config.connect(NoTls))
            .map_err(|e| target.error("cannot connect", &e))?;
        let name = target.name.clone();
        rt.spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!("PostgreSQL {name}: connection ended: {}", describe(&e));
            }
        });
        Ok(Pg {
            rt,
            client,
            target: target.clone(),
        })
    }

    /// Runs statements without parameters (simple query protocol); `what` names the step in
    /// an error.
    pub(super) fn batch(&self, what: &str, sql: &str) -> TaskResult {
        self.rt
            .block_on(self.client.batch_execute(sql))
            .map_err(|e| self.target.error(what, &e))
    }

    /// Like [`Pg::batch`], but returns the error itself, for callers that handle some.
    pub(super) fn try_batch(&self, sql: &str) -> Result<(), tokio_postgres::Error> {
        self.rt.block_on(self.client.batch_execute(sql))
    }

    /// Prepares a statement.
    pub(super) fn prepare(&self, what: &str, sql: &str) -> TaskResult<Statement> {
        self.rt
            .block_on(self.client.prepare(sql))
            .map_err(|e| self.target.error(what, &e))
    }

    /// Executes a statement; returns the rows it affected.
    pub(super) fn execute(
        &self,
        what: &str,
        statement: &Statement,
        params: &[&(dyn ToSql + Sync)],
    ) -> TaskResult<u64> {
        self.rt
            .block_on(self.client.execute(statement, params))
            .map_err(|e| self.target.error(what, &e))
    }

    /// Runs a query whose first column is text; returns that column.
    pub(super) fn query_strings(
        &self,
        what: &str,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> TaskResult<Vec<String>> {
        let rows = self
            .rt
            .block_on(self.client.query(sql, params))
            .map_err(|e| self.target.error(what, &e))?;
        rows.iter()
            .map(|r| {
                r.try_get::<_, String>(0)
                    .map_err(|e| self.target.error(what, &e))
            })
            .collect()
    }

    /// Runs a query returning one bigint or integer-valued text.
    pub(super) fn query_i64(&self, what: &str, sql: &str) -> TaskResult<i64> {
        let row = self
            .rt
            .block_on(self.client.query_one(sql, &[]))
            .map_err(|e| self.target.error(what, &e))?;
        row.try_get::<_, i64>(0)
            .map_err(|e| self.target.error(what, &e))
    }

    /// Inserts `rows` with `statement` (two array parameters: words and counts), at most
    /// [`STATEMENT_ROWS_MAX`] per statement.
    pub(super) fn insert_rows(
        &self,
        what: &str,
        statement: &Statement,
        rows: &[(Word, u64)],
    ) -> TaskResult {
        let mut words: Vec<&str> = Vec::with_capacity(rows.len().min(STATEMENT_ROWS_MAX));
        let mut counts: Vec<i64> = Vec::with_capacity(words.capacity());
        for chunk in rows.chunks(STATEMENT_ROWS_MAX) {
            words.clear();
            counts.clear();
            for (w, c) in chunk {
                words.push(w.as_str());
                counts.push(i64::try_from(*c).unwrap_or(i64::MAX));
            }
            self.execute(what, statement, &[&words, &counts])?;
        }
        Ok(())
    }
}

/// Creates a table with `ddl` (`CREATE TABLE IF NOT EXISTS …`) under an advisory lock on its
/// name, since two sessions creating the same table at once can both fail on the catalog's
/// unique index; a missing privilege is named.
pub(super) fn create_table(pg: &Pg, table: &str, ddl: &str) -> TaskResult {
    let lock_key = format!("cairn table {table}");
    let sql = format!(
        "BEGIN; SELECT pg_advisory_xact_lock(hashtext('{}')); {ddl}; COMMIT",
        lock_key.replace('\'', "''")
    );
    if let Err(e) = pg.try_batch(&sql) {
        let _ = pg.try_batch("ROLLBACK");
        return Err(pg.target.error(&format!("cannot create table {table}"), &e));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_names_are_checked_and_quoted() {
        assert_eq!(quote_table("counts", "").unwrap(), "\"counts\"");
        assert_eq!(
            quote_table("s.Counts_2", COMMITS_SUFFIX).unwrap(),
            "\"s\".\"Counts_2_cairn_commits\""
        );
        for bad in ["", "a.b.c", "1abc", "a-b", "a\"b", "a;drop", "a b"] {
            assert!(quote_table(bad, "").is_err(), "{bad:?}");
        }
        let long = "x".repeat(60);
        assert!(quote_table(&long, "").is_ok());
        let e = quote_table(&long, COMMITS_SUFFIX).unwrap_err();
        assert!(e.contains("longer than PostgreSQL's 63 bytes"), "{e}");
    }

    #[test]
    fn urls_are_parsed_and_their_passwords_kept_out_of_messages() {
        let t = Target::new("postgres://u:secret@db.example:6543/sales", "t").unwrap();
        assert_eq!(t.name, "db.example:6543/sales");
        let e = Target::new("postgres://u:secret@h:notaport/db", "t").unwrap_err();
        assert!(e.starts_with("--pg-output: not a PostgreSQL URL"), "{e}");
        assert!(!e.contains("secret"), "{e}");
        let e = Target::new("postgres://u:secret@h/db?sslmode=require", "t").unwrap_err();
        assert!(e.contains("sslmode=require is not supported"), "{e}");
        assert_eq!(
            redact("postgres://u:secret@h:1/db"),
            "postgres://u:***@h:1/db"
        );
    }
}
