//! The CLI's error contract, tested on the real binary.
//!
//! Every user error gives exactly one clear line on stderr that starts with `error: ` and names
//! the thing at fault (file, flag, key), a non-zero exit code, and never a panic. Parse errors
//! are clap's, on one line too, with the `--help` to read (exit code 2). Unusable checkpoints are refused by
//! name when asked for explicitly, and skipped with a warning by `--from latest`.
//!
//! Every child process is waited for with `Command::output`; nothing sleeps.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// What one run of the binary produced.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    cmdline: String,
}

impl Run {
    fn from_output(out: Output, cmdline: String) -> Run {
        Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            cmdline,
        }
    }

    /// Context for assertion messages.
    fn describe(&self) -> String {
        format!(
            "command: {}\nexit code: {:?}\n--- stderr ---\n{}\n--- stdout ---\n{}",
            self.cmdline, self.code, self.stderr, self.stdout
        )
    }

    /// Non-empty stderr lines.
    fn stderr_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    fn assert_no_panic(&self) {
        assert_ne!(
            self.code,
            Some(101),
            "the CLI panicked\n{}",
            self.describe()
        );
        assert!(
            !self.stderr.contains("panicked"),
            "the CLI panicked\n{}",
            self.describe()
        );
    }

    /// Exit 0, no panic, no `error:` line.
    fn assert_success(&self) {
        self.assert_no_panic();
        assert_eq!(self.code, Some(0), "expected success\n{}", self.describe());
        assert!(
            !self.stderr_lines().iter().any(|l| l.starts_with("error:")),
            "a successful run printed an error line\n{}",
            self.describe()
        );
    }

    /// A user error: exit code 1 (not a panic, not a signal) and exactly one line on
    /// stderr, starting with `error: `, containing every one of `needles`. Returns that line.
    fn assert_user_error(&self, needles: &[&str]) -> String {
        self.assert_no_panic();
        // Every user error exits with 1 (ARCHITECTURE.md); any other code, or a signal, is not
        // the CLI reporting an error.
        assert_eq!(
            self.code,
            Some(1),
            "a user error must exit with code 1\n{}",
            self.describe()
        );
        let lines = self.stderr_lines();
        assert_eq!(
            lines.len(),
            1,
            "a user error must print exactly one line on stderr\n{}",
            self.describe()
        );
        let line = lines[0];
        assert!(
            line.starts_with("error: "),
            "the error line must start with 'error: '\n{}",
            self.describe()
        );
        for needle in needles {
            assert!(
                line.contains(needle),
                "the error line must name {needle:?}\n{}",
                self.describe()
            );
        }
        line.to_string()
    }

    /// A clap parse error: exit code 2, no panic, one line on stderr that starts with
    /// `error: ` and mentions every one of `needles`.
    fn assert_clap_error(&self, needles: &[&str]) {
        self.assert_no_panic();
        assert_eq!(
            self.code,
            Some(2),
            "a command-line parse error must exit with code 2\n{}",
            self.describe()
        );
        assert!(
            self.stderr.starts_with("error: "),
            "the parse error must start with 'error: '\n{}",
            self.describe()
        );
        assert_eq!(
            self.stderr_lines().len(),
            1,
            "a parse error must be one line on stderr\n{}",
            self.describe()
        );
        for needle in needles {
            assert!(
                self.stderr.contains(needle),
                "the parse error must mention {needle:?}\n{}",
                self.describe()
            );
        }
    }
}

/// Runs `cairn ARGS` in `cwd` with the default log filter, stdin closed, and waits for it.
fn cairn(cwd: &Path, args: &[&str]) -> Run {
    let exe = env!("CARGO_BIN_EXE_cairn");
    let out = Command::new(exe)
        .args(args)
        .current_dir(cwd)
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("cannot start the cairn binary");
    Run::from_output(out, format!("cairn {}", args.join(" ")))
}

fn s(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

fn tmp() -> TempDir {
    tempfile::tempdir().expect("cannot create a temporary directory")
}

/// Whether `text` mentions checkpoint `<job>/chk-<id>` (and not, say, `chk-<id>0`).
fn mentions_checkpoint(text: &str, job: &str, id: u64) -> bool {
    let needle = format!("{job}/chk-{id}");
    text.match_indices(&needle).any(|(at, _)| {
        !text[at + needle.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// The single job directory under a checkpoint root, and its checkpoint ids, ascending.
fn job_and_checkpoints(root: &Path) -> (String, Vec<u64>) {
    let jobs: Vec<String> = fs::read_dir(root)
        .expect("cannot list the checkpoint root")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        jobs.len(),
        1,
        "expected one job directory in {root:?}: {jobs:?}"
    );
    let job = jobs[0].clone();
    let mut ids: Vec<u64> = fs::read_dir(root.join(&job))
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().to_string_lossy().into_owned();
            let digits = name.strip_prefix("chk-")?;
            digits.parse().ok()
        })
        .collect();
    ids.sort_unstable();
    (job, ids)
}

fn metadata_file(root: &Path, job: &str, id: u64) -> PathBuf {
    root.join(job).join(format!("chk-{id}")).join("_metadata")
}

/// Arguments of the checkpointed wordcount run used by the checkpoint tests.
fn checkpointed_run_args(root: &Path) -> Vec<String> {
    [
        "run",
        "wordcount",
        "--generate",
        "200000",
        "--keys",
        "100",
        "--discard",
        "--checkpoint-dir",
        s(root),
        "--checkpoint-interval",
        "50ms",
        "-D",
        "state.checkpoints.num-retained=3",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect()
}

fn cairn_owned(cwd: &Path, args: &[String]) -> Run {
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    cairn(cwd, &refs)
}

/// Fills `root` with at least two complete checkpoints of one job: a first run (which always
/// ends with a final checkpoint), then a second run resuming it with `--from latest` (which
/// continues the same job and adds a newer checkpoint; three are retained). Returns the job id
/// and the checkpoint ids, ascending.
fn make_checkpoints(cwd: &Path, root: &Path) -> (String, Vec<u64>) {
    let args = checkpointed_run_args(root);
    cairn_owned(cwd, &args).assert_success();
    let mut resume = args.clone();
    resume.extend(["--from".to_string(), "latest".to_string()]);
    let r = cairn_owned(cwd, &resume);
    r.assert_success();
    assert!(r.stderr.contains("restored from"), "{}", r.describe());
    let (job, ids) = job_and_checkpoints(root);
    assert!(
        ids.len() >= 2,
        "expected at least two retained checkpoints, found {ids:?}"
    );
    for id in &ids {
        assert!(metadata_file(root, &job, *id).is_file());
    }
    (job, ids)
}

/// Flips one byte in the middle of a file.
fn flip_middle_byte(path: &Path) {
    let mut bytes = fs::read(path).unwrap();
    assert!(!bytes.is_empty());
    let i = bytes.len() / 2;
    bytes[i] ^= 0xff;
    fs::write(path, bytes).unwrap();
}

/// Truncates a file to half its length (a torn write).
fn truncate_to_half(path: &Path) {
    let bytes = fs::read(path).unwrap();
    assert!(bytes.len() >= 2);
    fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
}

/// Checks a `--from latest` run that had to skip unusable checkpoint `bad`: exit 0, a warning
/// line naming the skipped checkpoint, and a restore from an older one of the same job.
fn assert_skipped_and_restored_older(r: &Run, job: &str, bad: u64) {
    r.assert_success();
    let warned = r.stderr_lines().iter().any(|l| {
        let lower = l.to_lowercase();
        !l.starts_with("restored from")
            && mentions_checkpoint(l, job, bad)
            && ["skip", "unusable", "corrupt", "warn"]
                .iter()
                .any(|w| lower.contains(w))
    });
    assert!(
        warned,
        "--from latest must warn, naming the skipped checkpoint {job}/chk-{bad}\n{}",
        r.describe()
    );
    let restored = r
        .stderr_lines()
        .into_iter()
        .find(|l| l.starts_with("restored from"))
        .unwrap_or_else(|| panic!("no 'restored from' line\n{}", r.describe()));
    assert!(
        restored.contains(job),
        "restored from another job\n{}",
        r.describe()
    );
    let id: u64 = restored
        .rsplit("chk-")
        .next()
        .and_then(|d| d.trim().parse().ok())
        .unwrap_or_else(|| panic!("cannot parse the restored checkpoint\n{}", r.describe()));
    assert!(
        id < bad,
        "expected a restore from a checkpoint older than {bad}, got {id}\n{}",
        r.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// 1–2: input
// ---------------------------------------------------------------------------------------------

#[test]
fn missing_input_file_names_the_path() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--input",
            "/nonexistent/x.txt",
            "--discard",
        ],
    );
    r.assert_user_error(&["/nonexistent/x.txt"]);
}

#[test]
fn a_leader_lease_that_does_not_exceed_the_heartbeat_timeout_is_refused() {
    let d = tmp();
    let ck = d.path().join("ck");
    let r = cairn(
        d.path(),
        &[
            "coordinator",
            "--bind",
            "127.0.0.1:0",
            "--rest",
            "127.0.0.1:0",
            "--checkpoint-dir",
            s(&ck),
            "--heartbeat-timeout",
            "2s",
            "--leader-lease",
            "2s",
        ],
    );
    r.assert_user_error(&["--leader-lease 2s", "--heartbeat-timeout 2s"]);
    let r = cairn(
        d.path(),
        &[
            "coordinator",
            "--checkpoint-dir",
            s(&ck),
            "--leader-lease",
            "soon",
        ],
    );
    r.assert_user_error(&["--leader-lease", "soon"]);
}

#[test]
fn input_path_that_is_a_directory_names_it() {
    let d = tmp();
    let input = d.path().join("words");
    fs::create_dir(&input).unwrap();
    let r = cairn(
        d.path(),
        &["run", "wordcount", "--input", s(&input), "--discard"],
    );
    r.assert_user_error(&[s(&input)]);
}

// ---------------------------------------------------------------------------------------------
// 3–4: flags and job names
// ---------------------------------------------------------------------------------------------

#[test]
fn unknown_flag_is_a_clap_error() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--bogus",
        ],
    );
    r.assert_clap_error(&["--bogus", "see 'cairn run wordcount --help'"]);
}

#[test]
fn a_missing_required_flag_is_one_line_naming_it() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &["run", "wordcount", "--generate", "10", "--pg-table", "t"],
    );
    r.assert_clap_error(&["--pg-output <URL>"]);
}

#[test]
fn a_bad_mode_names_the_values_the_flag_takes() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--mode",
            "bogus",
        ],
    );
    r.assert_clap_error(&["'bogus'", "--mode", "exactly-once, at-least-once"]);
    assert!(!r.stderr.contains("EXACTLY_ONCE"), "{}", r.describe());
    // Flink's spelling of the key's values is still taken.
    cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--mode",
            "AT_LEAST_ONCE",
        ],
    )
    .assert_success();
}

#[test]
fn help_and_version_stay_as_clap_prints_them() {
    let d = tmp();
    let help = cairn(d.path(), &["run", "wordcount", "--help"]);
    help.assert_success();
    // wordcount's parameters and the run options, with their defaults; no other job's flags.
    for needle in [
        "Parameters of wordcount:",
        "Run options:",
        "[default: 1000]",
        "[default: exactly-once]",
        "[default: 1]",
    ] {
        assert!(
            help.stdout.contains(needle),
            "{needle:?}\n{}",
            help.describe()
        );
    }
    for other in ["--query", "--sink-rate", "--events"] {
        assert!(
            !help.stdout.contains(other),
            "{other:?}\n{}",
            help.describe()
        );
    }
    let version = cairn(d.path(), &["--version"]);
    version.assert_success();
    assert!(
        version.stdout.starts_with("cairn "),
        "{}",
        version.describe()
    );
}

#[test]
fn a_checkpoint_dir_without_an_interval_is_warned_about() {
    let d = tmp();
    let ck = d.path().join("ck");
    let define = format!("state.checkpoints.dir={}", s(&ck));
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "-D",
            &define,
        ],
    );
    r.assert_success();
    let warning = r
        .stderr_lines()
        .into_iter()
        .find(|l| l.starts_with("warning: "))
        .unwrap_or_else(|| panic!("no warning\n{}", r.describe()));
    assert!(
        warning.contains("state.checkpoints.dir")
            && warning.contains("execution.checkpointing.interval"),
        "{}",
        r.describe()
    );
    // With an interval, or with --checkpoint-dir (1s checkpoints), there is nothing to warn of.
    for args in [
        &["-D", &define, "--checkpoint-interval", "1s"][..],
        &["--checkpoint-dir", s(&ck)],
    ] {
        let mut all = vec!["run", "wordcount", "--generate", "10", "--discard"];
        all.extend_from_slice(args);
        let r = cairn(d.path(), &all);
        r.assert_success();
        assert!(!r.stderr.contains("warning: "), "{}", r.describe());
    }
}

#[test]
fn submitting_a_job_that_prints_is_refused_before_anything_is_sent() {
    let d = tmp();
    // Nothing listens on port 1: the refusal comes before any connection.
    let r = cairn(
        d.path(),
        &[
            "submit",
            "--rest",
            "127.0.0.1:1",
            "wordcount",
            "--generate",
            "10",
        ],
    );
    let line = r.assert_user_error(&["wordcount", "worker's stdout", "--output DIR"]);
    assert!(!line.contains("127.0.0.1:1"), "{}", r.describe());
}

#[test]
fn unknown_job_names_it() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &["run", "nosuchjob", "--generate", "10", "--discard"],
    );
    r.assert_user_error(&["'nosuchjob'"]);
}

// ---------------------------------------------------------------------------------------------
// 5–9: configuration
// ---------------------------------------------------------------------------------------------

fn run_with_config(dir: &Path, yaml: &[u8]) -> (PathBuf, Run) {
    let path = dir.join("cairn.yaml");
    fs::write(&path, yaml).unwrap();
    let r = cairn(
        dir,
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--config",
            s(&path),
        ],
    );
    (path, r)
}

#[test]
fn misspelt_config_key_is_named_with_a_suggestion() {
    let d = tmp();
    let (_, r) = run_with_config(d.path(), b"execution.checkpointing.intervall: 1s\n");
    let line = r.assert_user_error(&["execution.checkpointing.intervall"]);
    assert!(
        line.replace("execution.checkpointing.intervall", "")
            .contains("execution.checkpointing.interval"),
        "the error must suggest execution.checkpointing.interval\n{}",
        r.describe()
    );
}

#[test]
fn bad_config_value_names_the_key() {
    let d = tmp();
    let (_, r) = run_with_config(d.path(), b"execution.checkpointing.timeout: abc\n");
    r.assert_user_error(&["execution.checkpointing.timeout", "abc"]);
}

#[test]
fn missing_config_file_names_it_once() {
    let d = tmp();
    let path = d.path().join("no-such-config.yaml");
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--config",
            s(&path),
        ],
    );
    let line = r.assert_user_error(&[s(&path)]);
    // One clear statement of the cause, not the same OS error twice.
    assert!(
        line.matches("os error").count() <= 1,
        "the cause is repeated\n{}",
        r.describe()
    );
}

#[test]
fn invalid_yaml_config_names_the_file() {
    let d = tmp();
    let (path, r) = run_with_config(d.path(), b"a: [1, 2\n  b: :\n");
    r.assert_user_error(&[s(&path)]);
}

#[test]
fn bad_define_value_names_the_key() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "-D",
            "parallelism.default=zero",
        ],
    );
    r.assert_user_error(&["parallelism.default", "zero"]);
}

#[test]
fn define_without_equals_is_named() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "-D",
            "parallelism.default",
        ],
    );
    r.assert_user_error(&["-D", "parallelism.default"]);
}

#[test]
fn bad_checkpoint_interval_is_named() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--checkpoint-interval",
            "10parsecs",
        ],
    );
    let line = r.assert_user_error(&["10parsecs"]);
    assert_eq!(
        line,
        "error: invalid value '10parsecs' for configuration key 'execution.checkpointing.interval': expected a duration such as 500ms, 10s or 1min",
        "the error must name the key and what it expects\n{}",
        r.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// 10–12: checkpoint directory and --from
// ---------------------------------------------------------------------------------------------

#[test]
fn checkpoint_dir_that_is_a_regular_file_names_it() {
    let d = tmp();
    let file = d.path().join("not-a-dir");
    fs::write(&file, b"x").unwrap();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--checkpoint-dir",
            s(&file),
        ],
    );
    r.assert_user_error(&[s(&file)]);
    assert_eq!(fs::read(&file).unwrap(), b"x", "the file was modified");
}

#[test]
fn from_latest_without_checkpoint_dir_is_a_clear_error() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--from",
            "latest",
        ],
    );
    let line = r.assert_user_error(&["latest"]);
    assert_eq!(
        line,
        "error: --from latest needs a checkpoint directory (--checkpoint-dir or state.checkpoints.dir)",
        "the error must say a checkpoint directory is needed\n{}",
        r.describe()
    );
}

#[test]
fn from_missing_checkpoint_names_it() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--from",
            "/nonexistent/chk-3",
        ],
    );
    r.assert_user_error(&["/nonexistent/chk-3"]);
}

#[test]
fn from_a_directory_that_is_not_a_checkpoint_names_it() {
    let d = tmp();
    let dir = d.path().join("just-a-dir");
    fs::create_dir(&dir).unwrap();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--from",
            s(&dir),
        ],
    );
    r.assert_user_error(&[s(&dir), "chk-"]);
}

#[test]
fn from_latest_with_empty_checkpoint_dir_starts_fresh() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    fs::create_dir(&root).unwrap();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--discard",
            "--checkpoint-dir",
            s(&root),
            "--from",
            "latest",
        ],
    );
    r.assert_success();
    assert!(
        r.stderr.contains("started fresh"),
        "stderr must say the job started fresh\n{}",
        r.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// 13–14: corrupt and torn checkpoints
// ---------------------------------------------------------------------------------------------

/// Checks a `--from latest` run that met a damaged *completed* checkpoint `bad`: a user error
/// naming it and saying why no older one was taken.
fn assert_latest_refused(r: &Run, job: &str, bad: u64) {
    let line = r.assert_user_error(&[]);
    assert!(
        mentions_checkpoint(&line, job, bad),
        "the error must name the damaged checkpoint {job}/chk-{bad}\n{}",
        r.describe()
    );
    assert!(
        line.contains("would repeat output") && line.contains("--from PATH"),
        "the error must say why no older checkpoint was restored, and how to pick one\n{}",
        r.describe()
    );
    assert!(
        !r.stderr.contains("restored from"),
        "nothing may be restored\n{}",
        r.describe()
    );
}

#[test]
fn corrupt_checkpoint_metadata_is_refused_by_path_and_by_latest() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    let (job, ids) = make_checkpoints(d.path(), &root);
    let newest = *ids.last().unwrap();
    flip_middle_byte(&metadata_file(&root, &job, newest));

    // Asked for by path: refused, by name.
    let chk = root.join(&job).join(format!("chk-{newest}"));
    let mut args = checkpointed_run_args(&root);
    args.extend(["--from".to_string(), s(&chk).to_string()]);
    let r = cairn_owned(d.path(), &args);
    let line = r.assert_user_error(&[]);
    assert!(
        mentions_checkpoint(&line, &job, newest),
        "the error must name the checkpoint\n{}",
        r.describe()
    );
    let lower = line.to_lowercase();
    assert!(
        lower.contains("checksum") || lower.contains("corrupt"),
        "the error must say the checkpoint is corrupt\n{}",
        r.describe()
    );

    // `--from latest`: the checkpoint completed (its `_metadata` exists), so sinks may have
    // committed its output; an older one would repeat that output. Refused.
    let mut args = checkpointed_run_args(&root);
    args.extend(["--from".to_string(), "latest".to_string()]);
    let r = cairn_owned(d.path(), &args);
    assert_latest_refused(&r, &job, newest);
}

#[test]
fn a_damaged_state_file_of_the_newest_completed_checkpoint_is_refused_by_latest() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    let (job, ids) = make_checkpoints(d.path(), &root);
    let newest = *ids.last().unwrap();
    let chk = root.join(&job).join(format!("chk-{newest}"));
    let state = fs::read_dir(&chk)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.file_name().is_some_and(|n| n != "_metadata"))
        .expect("the checkpoint has a state file");
    flip_middle_byte(&state);

    let mut args = checkpointed_run_args(&root);
    args.extend(["--from".to_string(), "latest".to_string()]);
    let r = cairn_owned(d.path(), &args);
    assert_latest_refused(&r, &job, newest);
    let name = state.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        r.stderr.contains(&name),
        "the error must name the damaged file {name}\n{}",
        r.describe()
    );

    // The user may still pick the older checkpoint, knowingly, by path.
    let older = ids[ids.len() - 2];
    let mut args = checkpointed_run_args(&root);
    let chk = root.join(&job).join(format!("chk-{older}"));
    args.extend(["--from".to_string(), s(&chk).to_string()]);
    let r = cairn_owned(d.path(), &args);
    r.assert_success();
    assert!(
        r.stderr_lines()
            .iter()
            .any(|l| l.starts_with("restored from") && mentions_checkpoint(l, &job, older)),
        "expected a restore from {job}/chk-{older}\n{}",
        r.describe()
    );
}

#[test]
fn torn_checkpoint_metadata_is_refused_by_latest() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    let (job, ids) = make_checkpoints(d.path(), &root);
    let newest = *ids.last().unwrap();
    truncate_to_half(&metadata_file(&root, &job, newest));

    let mut args = checkpointed_run_args(&root);
    args.extend(["--from".to_string(), "latest".to_string()]);
    let r = cairn_owned(d.path(), &args);
    assert_latest_refused(&r, &job, newest);
}

#[test]
fn a_checkpoint_that_never_completed_is_skipped_by_latest() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    let (job, ids) = make_checkpoints(d.path(), &root);
    let newest = *ids.last().unwrap();
    // The process died before `_metadata` was written: the checkpoint never completed, and no
    // sink committed anything of it.
    fs::remove_file(metadata_file(&root, &job, newest)).unwrap();

    let mut args = checkpointed_run_args(&root);
    args.extend(["--from".to_string(), "latest".to_string()]);
    let r = cairn_owned(d.path(), &args);
    assert_skipped_and_restored_older(&r, &job, newest);
}

#[test]
fn torn_checkpoint_is_refused_by_path() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    let (job, ids) = make_checkpoints(d.path(), &root);
    let newest = *ids.last().unwrap();
    truncate_to_half(&metadata_file(&root, &job, newest));

    let meta = metadata_file(&root, &job, newest);
    let mut args = checkpointed_run_args(&root);
    args.extend(["--from".to_string(), s(&meta).to_string()]);
    let r = cairn_owned(d.path(), &args);
    let line = r.assert_user_error(&[]);
    assert!(
        mentions_checkpoint(&line, &job, newest),
        "the error must name the checkpoint\n{}",
        r.describe()
    );
}

// ---------------------------------------------------------------------------------------------
// 15: non-UTF-8 input
// ---------------------------------------------------------------------------------------------

/// Every committed file under `dir` (names never start with '.' or '_').
fn committed_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || name.starts_with('_') {
                continue;
            }
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                out.push(path);
            }
        }
    }
    out
}

#[test]
fn non_utf8_input_becomes_replacement_characters() {
    let d = tmp();
    let input = d.path().join("latin1.txt");
    fs::write(&input, b"caf\xe9 ok\n\xff\xfe\n").unwrap();
    let out = d.path().join("out");
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--input",
            s(&input),
            "--output",
            s(&out),
        ],
    );
    r.assert_success();

    let mut words: Vec<String> = Vec::new();
    let files = committed_files(&out);
    assert!(!files.is_empty(), "no committed output\n{}", r.describe());
    for f in files {
        let text = String::from_utf8(fs::read(&f).unwrap())
            .unwrap_or_else(|e| panic!("committed output {f:?} is not UTF-8: {e}"));
        for line in text.lines() {
            let word = line.split('\t').next().unwrap_or_default();
            words.push(word.to_string());
        }
    }
    assert!(words.iter().any(|w| w == "ok"), "no 'ok' in {words:?}");
    assert!(
        words.iter().any(|w| w == "caf\u{FFFD}"),
        "no 'caf\\u{{FFFD}}' in {words:?}"
    );
    assert!(
        words
            .iter()
            .any(|w| !w.is_empty() && w.chars().all(|c| c == '\u{FFFD}')),
        "no word made of replacement characters in {words:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// 16: `cairn checkpoints`
// ---------------------------------------------------------------------------------------------

#[test]
fn checkpoints_on_missing_dir_names_it() {
    let d = tmp();
    let missing = d.path().join("no-such-dir");
    let r = cairn(d.path(), &["checkpoints", s(&missing)]);
    r.assert_user_error(&[s(&missing)]);
}

#[test]
fn checkpoints_on_regular_file_says_it_is_not_a_directory() {
    let d = tmp();
    let file = d.path().join("a-file");
    fs::write(&file, b"x").unwrap();
    let r = cairn(d.path(), &["checkpoints", s(&file)]);
    let line = r.assert_user_error(&[s(&file)]);
    assert!(
        line.contains("not a directory"),
        "the path exists; the error must say it is not a directory\n{}",
        r.describe()
    );
}

/// The listing line of checkpoint `id` of `job`.
fn listing_line<'a>(stdout: &'a str, job: &str, id: u64) -> Option<&'a str> {
    stdout.lines().find(|l| {
        let mut cols = l.split_whitespace();
        cols.next() == Some(job) && cols.next() == Some(id.to_string().as_str())
    })
}

#[test]
fn checkpoints_lists_complete_checkpoints() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    let (job, ids) = make_checkpoints(d.path(), &root);
    // Both the checkpoint root and the job directory are accepted.
    for dir in [root.clone(), root.join(&job)] {
        let r = cairn(d.path(), &["checkpoints", s(&dir)]);
        r.assert_success();
        for &id in &ids {
            let line = listing_line(&r.stdout, &job, id)
                .unwrap_or_else(|| panic!("checkpoint {id} not listed\n{}", r.describe()));
            assert!(
                line.trim_end().ends_with("complete"),
                "checkpoint {id} is not shown complete\n{}",
                r.describe()
            );
        }
    }
}

#[test]
fn checkpoints_marks_corrupt_checkpoint_not_usable() {
    let d = tmp();
    let root = d.path().join("checkpoints");
    let (job, ids) = make_checkpoints(d.path(), &root);
    let newest = *ids.last().unwrap();
    flip_middle_byte(&metadata_file(&root, &job, newest));
    let r = cairn(d.path(), &["checkpoints", s(&root)]);
    r.assert_success();
    let bad = listing_line(&r.stdout, &job, newest)
        .unwrap_or_else(|| panic!("checkpoint {newest} not listed\n{}", r.describe()));
    assert!(bad.contains("NOT USABLE"), "{}", r.describe());
    for &id in &ids[..ids.len() - 1] {
        let line = listing_line(&r.stdout, &job, id)
            .unwrap_or_else(|| panic!("checkpoint {id} not listed\n{}", r.describe()));
        assert!(line.trim_end().ends_with("complete"), "{}", r.describe());
    }
}

// ---------------------------------------------------------------------------------------------
// 17–18: generator flags and output
// ---------------------------------------------------------------------------------------------

#[test]
fn zero_keys_is_a_clear_error() {
    let d = tmp();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--keys",
            "0",
            "--discard",
        ],
    );
    r.assert_user_error(&["--keys"]);
}

#[test]
fn generate_with_input_is_a_clap_conflict() {
    let d = tmp();
    let input = d.path().join("words.txt");
    fs::write(&input, b"a b c\n").unwrap();
    let r = cairn(
        d.path(),
        &[
            "run",
            "wordcount",
            "--generate",
            "10",
            "--input",
            s(&input),
            "--discard",
        ],
    );
    r.assert_clap_error(&["--generate", "--input"]);
}

#[test]
fn output_that_is_a_regular_file_names_it() {
    let d = tmp();
    let file = d.path().join("out.txt");
    fs::write(&file, b"keep me\n").unwrap();
    let r = cairn(
        d.path(),
        &["run", "wordcount", "--generate", "10", "--output", s(&file)],
    );
    r.assert_user_error(&[s(&file)]);
    assert_eq!(
        fs::read(&file).unwrap(),
        b"keep me\n",
        "the file was modified"
    );
}
