//! The `sql` job every app has (with the `sql` feature): a script of Flink SQL statements as
//! its one parameter, so that any worker builds it from the submission alone. `cairn sql FILE`
//! and `cairn submit --sql FILE` read the file on the command line's side.

use std::ffi::OsString;
use std::path::Path;

use cairn::api::JobGraph;

use crate::job::{Job, JobContext};

/// The `sql` job's parameters: the script's text.
#[derive(clap::Args, serde::Serialize, serde::Deserialize, Debug, Default)]
#[serde(default, deny_unknown_fields)]
pub struct SqlParams {
    /// The SQL statements to run (`cairn sql FILE.sql` reads them from a file).
    #[arg(short = 'e', long = "execute", value_name = "STATEMENTS")]
    pub execute: String,
}

/// Runs a SQL script.
pub struct SqlJob;

impl Job for SqlJob {
    type Params = SqlParams;

    fn name(&self) -> &str {
        "sql"
    }

    fn about(&self) -> &str {
        "A script of Flink SQL statements (CREATE TABLE, CREATE VIEW, SET, INSERT INTO, statement sets)"
    }

    fn build(&self, p: &SqlParams, ctx: &JobContext) -> Result<JobGraph, String> {
        let compiled = cairn::sql::compile(&p.execute, ctx.seed).map_err(|e| e.to_string())?;
        if compiled.explain {
            return Err("EXPLAIN prints a plan and runs nothing: give it to `sql` (cairn sql -e \"EXPLAIN …\")".into());
        }
        Ok(compiled.graph)
    }

    fn source_records(&self, p: &SqlParams, ctx: &JobContext) -> Result<Option<u64>, String> {
        let compiled = cairn::sql::compile(&p.execute, ctx.seed).map_err(|e| e.to_string())?;
        Ok(compiled.source_records)
    }

    fn config(&self, p: &SqlParams) -> Result<Vec<(String, String)>, String> {
        cairn::sql::config_of(&p.execute).map_err(|e| e.to_string())
    }
}

/// `cairn sql [FILE…] [-e STATEMENTS] [run options]` as `cairn run sql -e STATEMENTS [run
/// options]`, and `cairn submit … --sql FILE …` as `cairn submit … sql -e STATEMENTS …`;
/// other command lines unchanged. `Ok(None)`: `sql` was asked for its help or to EXPLAIN (the
/// plan is printed here).
pub(crate) fn rewrite(args: Vec<OsString>) -> Result<Option<Vec<OsString>>, String> {
    let verb = args.get(1).and_then(|a| a.to_str());
    match verb {
        Some("sql") => sql_verb(&args),
        Some("submit") => submit_sql(args).map(Some),
        _ => Ok(Some(args)),
    }
}

fn read_script(path: &str) -> Result<String, String> {
    std::fs::read_to_string(Path::new(path))
        .map_err(|e| format!("cannot read SQL file {path}: {e}"))
}

fn sql_verb(args: &[OsString]) -> Result<Option<Vec<OsString>>, String> {
    let mut rest: Vec<OsString> = Vec::new();
    let mut script: Option<String> = None;
    let mut i = 2;
    while i < args.len() {
        let a = &args[i];
        match a.to_str() {
            Some("-e" | "--execute") => {
                let text = args
                    .get(i + 1)
                    .and_then(|t| t.to_str())
                    .ok_or("-e needs the statements to run")?;
                if script.replace(text.to_string()).is_some() {
                    return Err("give the script as FILEs or as -e STATEMENTS, not both".into());
                }
                i += 2;
                continue;
            }
            // Several files are one script, in order (the Nexmark DDL, then a query).
            Some(s) if !s.starts_with('-') && (rest.is_empty() || !takes_value(rest.last())) => {
                let text = read_script(s)?;
                script = Some(match script.take() {
                    Some(before) => format!("{before}\n;\n{text}"),
                    None => text,
                });
            }
            _ => rest.push(a.clone()),
        }
        i += 1;
    }
    let mut out: Vec<OsString> = vec![args[0].clone(), "run".into(), "sql".into()];
    if rest.iter().any(|a| a == "--help" || a == "-h") || script.is_none() && rest.is_empty() {
        out.push("--help".into());
        return Ok(Some(out));
    }
    let script = script.ok_or("name a SQL file or give -e STATEMENTS")?;
    let compiled = cairn::sql::compile(&script, 0).map_err(|e| e.to_string())?;
    if compiled.explain {
        let parallelism = explained_parallelism(&rest, &script)?;
        print!(
            "job graph at parallelism {parallelism} (every vertex)\n{}",
            compiled.plan
        );
        return Ok(None);
    }
    // One `--execute=…` argument: a script may start with `--` (a comment).
    out.push(execute_arg(&script));
    out.extend(rest);
    Ok(Some(out))
}

fn execute_arg(script: &str) -> OsString {
    format!("--execute={script}").into()
}

/// The parallelism an EXPLAINed script would run at: `-p`/`--parallelism`, else
/// `-D parallelism.default=N`, else the script's `SET 'parallelism.default'`, else 1.
fn explained_parallelism(args: &[OsString], script: &str) -> Result<String, String> {
    let args: Vec<&str> = args.iter().filter_map(|a| a.to_str()).collect();
    let mut flag = None;
    let mut dynamic = None;
    for (i, a) in args.iter().enumerate() {
        let next = args.get(i + 1).copied();
        match *a {
            "-p" | "--parallelism" => flag = next,
            "-D" => {
                dynamic = next
                    .and_then(|d| d.strip_prefix("parallelism.default="))
                    .or(dynamic)
            }
            _ => {
                if let Some(p) = a
                    .strip_prefix("--parallelism=")
                    .or(a.strip_prefix("-p").filter(|p| !p.is_empty()))
                {
                    flag = Some(p);
                }
            }
        }
    }
    let set = cairn::sql::config_of(script)
        .map_err(|e| e.to_string())?
        .into_iter()
        .find(|(k, _)| k == "parallelism.default")
        .map(|(_, v)| v);
    let p = flag
        .or(dynamic)
        .map(str::to_string)
        .or(set)
        .unwrap_or_else(|| "1".into());
    match p.trim().parse::<u32>() {
        Ok(n) if n >= 1 => Ok(n.to_string()),
        _ => Err(format!(
            "invalid parallelism '{p}': a whole number of at least 1"
        )),
    }
}

/// Whether `arg` is a flag that takes a value (so the word after it is not the SQL file).
fn takes_value(arg: Option<&OsString>) -> bool {
    let Some(a) = arg.and_then(|a| a.to_str()) else {
        return false;
    };
    a.starts_with('-')
        && !a.contains('=')
        && !matches!(
            a,
            "--unaligned" | "--allow-non-restored-state" | "--discard"
        )
}

fn submit_sql(args: Vec<OsString>) -> Result<Vec<OsString>, String> {
    let Some(at) = args.iter().position(|a| a == "--sql") else {
        if let Some(a) = args
            .iter()
            .find_map(|a| a.to_str().and_then(|s| s.strip_prefix("--sql=")))
        {
            let path = a.to_string();
            let args: Vec<OsString> = args
                .into_iter()
                .filter(|x| x.to_str().is_none_or(|s| !s.starts_with("--sql=")))
                .collect();
            return splice_submit(args, &path);
        }
        return Ok(args);
    };
    let path = args
        .get(at + 1)
        .and_then(|p| p.to_str())
        .ok_or("--sql needs a FILE")?
        .to_string();
    let mut args = args;
    args.drain(at..at + 2);
    splice_submit(args, &path)
}

fn splice_submit(args: Vec<OsString>, path: &str) -> Result<Vec<OsString>, String> {
    let script = read_script(path)?;
    let relative = cairn::sql::relative_paths(&script).map_err(|e| e.to_string())?;
    if !relative.is_empty() {
        return Err(format!(
            "{path}: a script runs on the cluster's workers, where a relative path means another place; make it absolute: {}",
            relative.join(", ")
        ));
    }
    let mut out: Vec<OsString> = args[..2].to_vec();
    out.push("sql".into());
    out.push(execute_arg(&script));
    out.extend(args[2..].iter().cloned());
    Ok(out)
}
