//! Streaming SQL: scripts of Flink SQL statements compiled onto the DataStream API, so a SQL
//! job has the same state, checkpoints, restarts and sinks as a hand-written one.
//!
//! A script is parsed ([`parse`]: Flink's DDL, `SET`, statement sets, and queries through
//! sqlparser), its names and types are bound and its queries planned ([`plan`]: relations of
//! scans, calcs, unions, window aggregations and updating group aggregations, each with its
//! columns and whether it is append-only or a changelog), and the plan is built into a job
//! graph ([`build`]) with records of type [`Row`]. Operator uids derive from the plan, so a
//! savepoint of a script restores into the same script at any parallelism, and a changed
//! statement's state is named as unmapped on restore.

pub mod agg;
pub mod build;
pub mod calc;
pub mod connectors;
pub mod expr;
#[cfg(feature = "kafka")]
mod kafka;
pub mod parse;
pub mod plan;
pub mod rank;
pub mod types;

use std::fmt;

pub use build::{compile, explain, Compiled};
pub use types::{Row, RowKind, SqlType, Value};

/// A script's problem: what is wrong and, when known, where (line and column, 1-based).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqlError {
    /// Line and column.
    pub at: Option<(u64, u64)>,
    /// What is wrong.
    pub message: String,
}

impl SqlError {
    /// An error without a position.
    pub fn msg(message: impl Into<String>) -> SqlError {
        SqlError {
            at: None,
            message: message.into(),
        }
    }

    /// An error at a position (a position of 0 is unknown).
    pub fn at(at: sqlparser::tokenizer::Location, message: impl Into<String>) -> SqlError {
        SqlError {
            at: (at.line > 0).then_some((at.line, at.column)),
            message: message.into(),
        }
    }

    fn syntax(text: String) -> SqlError {
        // sqlparser ends its messages with "at Line: L, Column: C".
        let text = text
            .trim_start_matches("sql parser error: ")
            .trim_start_matches("sql tokenizer error: ")
            .to_string();
        if let Some(i) = text.rfind(" at Line: ") {
            let place = &text[i + " at Line: ".len()..];
            if let Some((line, col)) = place.split_once(", Column: ") {
                if let (Ok(line), Ok(col)) = (line.trim().parse(), col.trim().parse()) {
                    return SqlError {
                        at: Some((line, col)),
                        message: text[..i].to_string(),
                    };
                }
            }
        }
        SqlError::msg(text)
    }

    fn from_parser(e: sqlparser::parser::ParserError) -> SqlError {
        SqlError::syntax(e.to_string())
    }
}

impl fmt::Display for SqlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some((line, col)) => write!(
                f,
                "SQL error at line {line}, column {col}: {}",
                self.message
            ),
            None => write!(f, "SQL error: {}", self.message),
        }
    }
}

impl std::error::Error for SqlError {}

/// The configuration a script sets with `SET 'key' = 'value'`, in order, except the planner's
/// own `table.*` keys.
pub fn config_of(script: &str) -> Result<Vec<(String, String)>, SqlError> {
    let statements = parse::parse_script(script)?;
    Ok(statements
        .iter()
        .filter_map(|s| match s {
            parse::Statement::Set { key, value, .. } if !key.starts_with("table.") => {
                Some((key.clone(), value.clone()))
            }
            _ => None,
        })
        .collect())
}

/// The relative local paths a script names — a filesystem table's `'path'`, a `SET` of a
/// directory key — described for an error: a script submitted to a cluster runs where its
/// paths mean something else, so they must be absolute there.
pub fn relative_paths(script: &str) -> Result<Vec<String>, SqlError> {
    let relative = |p: &str| !p.contains("://") && !std::path::Path::new(p).is_absolute();
    let mut found = Vec::new();
    for s in parse::parse_script(script)? {
        match s {
            parse::Statement::CreateTable(t) => {
                let filesystem =
                    t.options.get("connector").map(String::as_str) == Some("filesystem");
                if let Some(p) = t.options.get("path").filter(|p| filesystem && relative(p)) {
                    found.push(format!("table '{}': 'path' = '{p}'", t.name));
                }
            }
            parse::Statement::Set { key, value, .. }
                if key.ends_with("dir") && relative(&value) =>
            {
                found.push(format!("SET '{key}' = '{value}'"));
            }
            _ => {}
        }
    }
    Ok(found)
}

/// The closest of `candidates` to `name`, if one is close enough to be a likely typo.
pub(crate) fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> String {
    let lower = name.to_lowercase();
    let best = candidates
        .into_iter()
        .map(|c| (edit_distance(&lower, &c.to_lowercase()), c))
        .min_by_key(|(d, _)| *d);
    match best {
        Some((d, c)) if d <= 2.max(name.len() / 3) => format!("; did you mean '{c}'?"),
        _ => String::new(),
    }
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}
