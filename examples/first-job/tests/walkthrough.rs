//! docs/your-own-job.md, run as written.
//!
//! - Its code blocks are this package's files: the dependency lines are `Cargo.toml`'s
//!   `[dependencies]` (with this repository's path instead of a clone beside the reader's
//!   project), the first Rust block is `src/main.rs`, and `src/bin/myapp-v2.rs` is that file with
//!   `build` replaced by the second Rust block. So the page's code is code that compiles.
//! - Every shell command of the page runs, in the page's order, in one bash process (so `cd`,
//!   `export`, `JOB=$(…)`, `&` and `kill -9 %1` mean what they mean to a reader), in a
//!   temporary directory with a `cairn` beside it that is this repository. The test knows each
//!   command by its text (a command it does not know, or one missing from the page, fails it),
//!   and checks what the page says of it: an output the page shows after a block is compared,
//!   line by line, where it does not vary from run to run; otherwise what the page claims
//!   (restored, RUNNING, the counts continue, exactly once) is checked here. Where the page
//!   says to wait, the test repeats the command, or watches the process's log, until the
//!   condition holds, with a deadline.
//! - What is mapped: `/tmp/myapp-…` is under the temporary directory; the coordinator binds
//!   port 0 and the later commands get the ports it printed; and `cargo build --release`, a
//!   cold build of the whole engine (over 4 minutes on two cores), becomes `cargo tree
//!   --offline`, which resolves the project's manifest and shows that no dependency builds C
//!   or C++ (as the page says), and a link to the binary cargo built from the same files for
//!   this test (`myapp`, then `myapp-v2` once the page changed the job).

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::symlink;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

const PAGE: &str = include_str!("../../../docs/your-own-job.md");
const MANIFEST: &str = include_str!("../Cargo.toml");
const MAIN_RS: &str = include_str!("../src/main.rs");
const V2_RS: &str = include_str!("../src/bin/myapp-v2.rs");

/// How long one command may take (the longest is a resumed run of 100,000 clicks).
const COMMAND_DEADLINE: Duration = Duration::from_secs(120);
/// How long a condition the page waits for may take to hold.
const WAIT_DEADLINE: Duration = Duration::from_secs(60);
/// How often a waited-for condition is looked at again.
const POLL: Duration = Duration::from_millis(100);

/// Clicks per user in the page's runs: 100,000 clicks over 5 users.
const PER_USER: u64 = 20_000;

/// A fenced code block of the page.
#[derive(Debug)]
struct Block {
    lang: String,
    text: String,
    /// Its line in the page (for messages).
    line: usize,
}

fn blocks(page: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in page.lines().enumerate() {
        match (open.take(), line.strip_prefix("```")) {
            (None, Some(lang)) => {
                open = Some(Block {
                    lang: lang.trim().to_string(),
                    text: String::new(),
                    line: i + 1,
                })
            }
            (None, None) => {}
            (Some(block), Some(_)) => blocks.push(block),
            (Some(mut block), None) => {
                block.text.push_str(line);
                block.text.push('\n');
                open = Some(block);
            }
        }
    }
    assert!(open.is_none(), "the page has an unclosed code block");
    blocks
}

fn blocks_of<'a>(all: &'a [Block], lang: &str) -> Vec<&'a Block> {
    all.iter().filter(|b| b.lang == lang).collect()
}

/// The commands of a `sh` block: one per line, `\` continuing a line, comments skipped.
fn commands(block: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in block.lines() {
        let line = line.trim_end();
        if current.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => current.push_str(head),
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current).trim().to_string());
            }
        }
    }
    assert!(current.is_empty(), "a sh block ends in a continued line");
    out
}

/// A manifest's `[dependencies]` table: its header and lines up to the next table.
fn dependencies(manifest: &str) -> String {
    let mut out = String::new();
    let mut inside = false;
    for line in manifest.lines() {
        if line.starts_with('[') {
            inside = line == "[dependencies]";
        }
        if inside {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.trim_end().to_string()
}

/// `main_rs` with its `build` function replaced by `build` (written at column 0 in the page).
fn with_build(main_rs: &str, build: &str) -> String {
    let lines: Vec<&str> = main_rs.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.starts_with("    fn build("))
        .expect("main.rs has a `fn build`");
    let end = start
        + lines[start..]
            .iter()
            .position(|l| *l == "    }")
            .expect("`fn build` ends");
    let mut out: Vec<String> = lines[..start].iter().map(|l| l.to_string()).collect();
    out.extend(build.lines().map(|l| {
        if l.is_empty() {
            String::new()
        } else {
            format!("    {l}")
        }
    }));
    out.extend(lines[end + 1..].iter().map(|l| l.to_string()));
    out.join("\n") + "\n"
}

#[test]
fn the_page_shows_this_package() {
    let all = blocks(PAGE);
    let toml = blocks_of(&all, "toml");
    assert_eq!(toml.len(), 1, "one block of dependency lines");
    assert_eq!(
        toml[0].text.trim_end().replace("\"../cairn/", "\"../../"),
        dependencies(MANIFEST),
        "the page's dependency lines (line {}) and examples/first-job/Cargo.toml's differ",
        toml[0].line
    );
    let rust = blocks_of(&all, "rust");
    assert_eq!(
        rust.len(),
        2,
        "the page shows main.rs, then version 2's build"
    );
    assert!(
        rust[0].text == MAIN_RS,
        "the page's main.rs (line {}) is not examples/first-job/src/main.rs",
        rust[0].line
    );
    assert!(
        with_build(MAIN_RS, &rust[1].text) == V2_RS,
        "examples/first-job/src/bin/myapp-v2.rs is not src/main.rs with the page's second block (line {}) as its build",
        rust[1].line
    );
    for b in &all {
        assert!(
            ["sh", "toml", "rust", "text"].contains(&b.lang.as_str()),
            "block of line {} is '{}': sh, toml, rust or text",
            b.line,
            b.lang
        );
    }
}

/// What a command printed and how it ended.
#[derive(Debug, Default, Clone)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
    /// The file its stderr went to (a background process goes on writing into it).
    stderr_path: PathBuf,
}

/// One bash process the page's commands run in, one after another; each command's output goes
/// to files, and bash says on its stdout when the command ended and with what status.
struct Shell {
    child: Child,
    stdin: ChildStdin,
    done: Receiver<String>,
    logs: PathBuf,
    n: usize,
}

impl Shell {
    fn start(cwd: &Path, logs: &Path) -> Shell {
        std::fs::create_dir_all(logs).unwrap();
        let mut child = Command::new("bash")
            .current_dir(cwd)
            // The reader's defaults, not whatever the test runner was given.
            .env_remove("RUST_LOG")
            .env_remove("CAIRN_SECRET")
            .env_remove("CAIRN_FAILPOINTS")
            .env_remove("CAIRN_FAILPOINT_MARKER")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(logs.join("bash.err")).unwrap())
            // Its own process group, which everything it starts stays in: killed whole at
            // the end, however the test ends.
            .process_group(0)
            .spawn()
            .expect("bash starts");
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, done) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Shell {
            child,
            stdin,
            done,
            logs: logs.to_path_buf(),
            n: 0,
        }
    }

    /// Runs `cmd` (as bash text) and waits for it to end.
    fn run(&mut self, cmd: &str) -> Out {
        self.n += 1;
        let n = self.n;
        let out = self.logs.join(format!("{n}.out"));
        let err = self.logs.join(format!("{n}.err"));
        write!(
            self.stdin,
            "{{ {cmd}\n}} </dev/null >'{}' 2>'{}'\necho \"done {n} $?\"\n",
            out.display(),
            err.display()
        )
        .expect("bash reads commands");
        self.stdin.flush().unwrap();
        let deadline = Instant::now() + COMMAND_DEADLINE;
        let prefix = format!("done {n} ");
        let code = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.done.recv_timeout(left) {
                Ok(line) => {
                    if let Some(code) = line.strip_prefix(&prefix) {
                        break code.trim().parse().unwrap_or(-1);
                    }
                }
                Err(RecvTimeoutError::Timeout) => panic!(
                    "`{cmd}` did not end within {COMMAND_DEADLINE:?}; stderr so far:\n{}",
                    std::fs::read_to_string(&err).unwrap_or_default()
                ),
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "bash ended while running `{cmd}`: {}",
                    std::fs::read_to_string(self.logs.join("bash.err")).unwrap_or_default()
                ),
            }
        };
        Out {
            code,
            stdout: std::fs::read_to_string(&out).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err).unwrap_or_default(),
            stderr_path: err,
        }
    }

    /// A value of the shell (a variable, `$!`): not a command of the page, a look inside.
    fn eval(&mut self, expr: &str) -> String {
        let out = self.run(&format!("printf '%s' \"{expr}\""));
        out.stdout
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

/// The state of the walk: the shell, where things are, what earlier steps found out.
struct World {
    shell: Shell,
    tmp: PathBuf,
    /// The page's addresses and what they stand for here.
    addresses: Vec<(&'static str, String)>,
    /// Whether the page changed the job to version 2 yet.
    version_2: bool,
    /// Each background command's text and pid.
    pids: Vec<(String, u32)>,
    /// Each command's output, by its text (the last run of it).
    outs: HashMap<String, Out>,
    job: String,
}

impl World {
    /// `cmd` as it runs here: temporary directories and the coordinator's real addresses.
    fn map(&self, cmd: &str) -> String {
        let mut cmd = cmd.replace("/tmp/myapp-", &format!("{}/myapp-", self.tmp.display()));
        for (page, here) in &self.addresses {
            cmd = cmd.replace(page, here);
        }
        cmd
    }

    fn project(&self) -> PathBuf {
        self.tmp.join("myapp")
    }

    fn out_of(&self, cmd_prefix: &str) -> &Out {
        self.outs
            .iter()
            .find(|(c, _)| c.starts_with(cmd_prefix))
            .map(|(_, o)| o)
            .unwrap_or_else(|| panic!("no command `{cmd_prefix}…` ran"))
    }
}

/// Waits until `cond` holds, or fails naming `what`.
fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT_DEADLINE;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "waited {WAIT_DEADLINE:?} for {what}"
        );
        std::thread::sleep(POLL);
    }
}

fn process_gone(pid: u32) -> bool {
    // A killed child of bash is a zombie only until bash reaps it.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
    }
}

type Then = fn(&mut World, &Out);

enum Check {
    /// Exits 0.
    Ok,
    /// Exits 0; its stdout is part of what the text block after its `sh` block shows.
    Shown,
    /// Ends with `&`: the process stays; `Then` may wait for it to be ready.
    Background,
    /// The page waits for its output to say something: repeated until it does.
    Until(fn(&World, &str) -> bool),
    /// `cargo build --release`.
    Build,
}

struct Step {
    cmd: &'static str,
    check: Check,
    then: Option<Then>,
}

fn step(cmd: &'static str, check: Check) -> Step {
    Step {
        cmd,
        check,
        then: None,
    }
}

fn step_then(cmd: &'static str, check: Check, then: Then) -> Step {
    Step {
        cmd,
        check,
        then: Some(then),
    }
}

/// Every command of the page, in its order, and what the page says of it.
fn steps() -> Vec<Step> {
    vec![
        step("cargo new myapp", Check::Ok),
        step("cd myapp", Check::Ok),
        step("cp ../cairn/Cargo.lock .", Check::Ok),
        step("cargo build --release", Check::Build),
        step("export PATH=\"$PWD/target/release:$PATH\"", Check::Ok),
        step("myapp run click-count --clicks 10", Check::Shown),
        step(
            "myapp run click-count --clicks 100000 --rate 5000 --output /tmp/myapp-out --checkpoint-dir /tmp/myapp-ck &",
            Check::Background,
        ),
        step(
            "myapp checkpoints /tmp/myapp-ck",
            Check::Until(|_, out| out.lines().any(|l| l.ends_with("  complete"))),
        ),
        step_then("kill -9 %1", Check::Ok, killed_while_running),
        step_then("ls -a /tmp/myapp-out", Check::Ok, only_part_files),
        step_then(
            "myapp run click-count --clicks 100000 --output /tmp/myapp-out --checkpoint-dir /tmp/myapp-ck --from latest",
            Check::Ok,
            restored_from_a_checkpoint,
        ),
        step("cat /tmp/myapp-out/part-* | wc -l", Check::Shown),
        step("cat /tmp/myapp-out/part-* | sort | uniq -d", Check::Shown),
        step_then(
            "sort -k2,2n /tmp/myapp-out/part-* | tail -n 5",
            Check::Shown,
            |w, _| {
                exactly_once(&w.tmp.join("myapp-out"));
            },
        ),
        step_then(
            "myapp coordinator --bind 127.0.0.1:6123 --rest 127.0.0.1:8081 --checkpoint-dir /tmp/myapp-cluster-ck &",
            Check::Background,
            coordinator_up,
        ),
        step_then(
            "myapp worker --coordinator 127.0.0.1:6123 --slots 1 &",
            Check::Background,
            worker_up,
        ),
        step_then(
            "myapp worker --coordinator 127.0.0.1:6123 --slots 1 &",
            Check::Background,
            worker_up,
        ),
        step_then(
            "JOB=$(myapp submit --rest 127.0.0.1:8081 click-count -p 2 --clicks 100000 --rate 2000 --output /tmp/myapp-cluster-out)",
            Check::Ok,
            |w, _| {
                w.job = w.shell.eval("$JOB");
                assert!(
                    w.job.len() == 32 && w.job.bytes().all(|b| b.is_ascii_hexdigit()),
                    "submit printed no job id: '{}'",
                    w.job
                );
            },
        ),
        step(
            "myapp list --rest 127.0.0.1:8081",
            Check::Until(|w, out| {
                out.lines().any(|l| {
                    l.split_whitespace().collect::<Vec<_>>() == [&w.job, "RUNNING", "click-count"]
                })
            }),
        ),
        step(
            "myapp status $JOB --rest 127.0.0.1:8081",
            Check::Until(|w, out| {
                let completed = field(out, "checkpoints");
                let completed = completed.split_whitespace().next().unwrap_or_default();
                field(out, "job") == w.job
                    && field(out, "name") == "click-count"
                    && field(out, "state") == "RUNNING"
                    && completed.parse::<u64>().is_ok_and(|n| n > 0)
            }),
        ),
        step_then(
            "myapp stop $JOB --savepoint-dir /tmp/myapp-sp --rest 127.0.0.1:8081",
            Check::Ok,
            |w, out| {
                let sp = format!(
                    "savepoint stored in {}/myapp-sp/savepoint-",
                    w.tmp.display()
                );
                assert!(out.stdout.starts_with(&sp), "{}", out.stdout);
                let finished = format!("job {} finished", w.job);
                assert!(out.stdout.lines().any(|l| l == finished), "{}", out.stdout);
            },
        ),
        step_then(
            "myapp savepoint info /tmp/myapp-sp/savepoint-*",
            Check::Ok,
            |_, out| {
                for line in [
                    "operator 'clicks': parallelism 2, 2 subtask state(s)",
                    "operator 'count': parallelism 2, 2 subtask state(s)",
                    "  state 'count': value state, serializer cairn.serde-postcard v1 of u64",
                    "operator 'sink': parallelism 2, 2 subtask state(s)",
                ] {
                    assert!(
                        out.stdout.lines().any(|l| l == line),
                        "no line '{line}' in:\n{}",
                        out.stdout
                    );
                }
            },
        ),
        step_then("kill $(jobs -p)", Check::Ok, |w, _| {
            let cluster: Vec<u32> = w
                .pids
                .iter()
                .filter(|(c, _)| c.contains(" coordinator ") || c.contains(" worker "))
                .map(|(_, pid)| *pid)
                .collect();
            assert_eq!(cluster.len(), 3, "a coordinator and two workers");
            wait_until("the coordinator and the workers to end", || {
                cluster.iter().all(|pid| process_gone(*pid))
            });
        }),
        step("cargo build --release", Check::Build),
        step_then(
            "myapp run click-count --clicks 100000 --output /tmp/myapp-cluster-out --checkpoint-dir /tmp/myapp-ck --from /tmp/myapp-sp/savepoint-*",
            Check::Ok,
            |w, out| {
                let from = format!("restored from {}/myapp-sp/savepoint-", w.tmp.display());
                assert!(
                    out.stderr.lines().any(|l| l.starts_with(&from)),
                    "{}",
                    out.stderr
                );
            },
        ),
        step_then(
            "grep -h '^user0' /tmp/myapp-cluster-out/part-* | sort -k2,2n | grep -B1 -m1 -E 'new|frequent'",
            Check::Ok,
            |_, out| {
                let lines: Vec<Vec<&str>> = out
                    .stdout
                    .lines()
                    .map(|l| l.split('\t').collect())
                    .collect();
                let n = |s: &str| s.parse::<u64>().unwrap_or(0);
                assert!(
                    lines.len() == 2
                        && lines[0].len() == 2
                        && lines[1].len() == 3
                        && lines[0][0] == "user0"
                        && lines[1][0] == "user0"
                        && n(lines[0][1]) > 0
                        && n(lines[1][1]) == n(lines[0][1]) + 1,
                    "user0's last count of version 1, then its first of version 2, expected:\n{}",
                    out.stdout
                );
            },
        ),
        step("cat /tmp/myapp-cluster-out/part-* | wc -l", Check::Shown),
        step_then(
            "cut -f1,2 /tmp/myapp-cluster-out/part-* | sort | uniq -d",
            Check::Shown,
            |w, _| {
                let lines = exactly_once(&w.tmp.join("myapp-cluster-out"));
                // Version 1 wrote USER<TAB>COUNT, version 2 USER<TAB>COUNT<TAB>TIER: for each
                // user, every count of version 2 follows every count of version 1.
                let mut last_v1: HashMap<&str, u64> = HashMap::new();
                let mut first_v2: HashMap<&str, u64> = HashMap::new();
                for f in &lines {
                    let count: u64 = f[1].parse().unwrap();
                    match f.len() {
                        2 => {
                            let e = last_v1.entry(&f[0]).or_insert(0);
                            *e = (*e).max(count);
                        }
                        3 => {
                            let tier = if count < 1000 { "new" } else { "frequent" };
                            assert_eq!(f[2], tier, "{f:?}");
                            let e = first_v2.entry(&f[0]).or_insert(u64::MAX);
                            *e = (*e).min(count);
                        }
                        _ => panic!("unexpected line {f:?}"),
                    }
                }
                for user in ["user0", "user1", "user2", "user3", "user4"] {
                    let v1 = last_v1.get(user).copied().unwrap_or(0);
                    assert!(v1 > 0, "{user}: version 1 committed nothing");
                    assert_eq!(first_v2.get(user), Some(&(v1 + 1)), "{user}");
                }
            },
        ),
    ]
}

/// A `KEY: VALUE` line of `myapp status`.
fn field(out: &str, key: &str) -> String {
    let prefix = format!("{key}:");
    out.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The checkpointed run was killed, not finished.
fn killed_while_running(w: &mut World, _: &Out) {
    let cmd = "myapp run click-count --clicks 100000 --rate 5000";
    let pid = w
        .pids
        .iter()
        .find(|(c, _)| c.starts_with(cmd))
        .map(|(_, pid)| *pid)
        .expect("the run in the background");
    wait_until("the killed run to end", || process_gone(pid));
    let stderr = std::fs::read_to_string(&w.out_of(cmd).stderr_path).unwrap_or_default();
    assert!(
        !stderr.contains("finished in"),
        "the run finished before it was killed:\n{stderr}"
    );
}

/// A killed run leaves committed files and hidden ones of its sink, nothing else.
fn only_part_files(_: &mut World, out: &Out) {
    for name in out.stdout.lines().filter(|n| *n != "." && *n != "..") {
        let hidden = name.starts_with(".part-")
            && (name.ends_with(".inprogress") || name.ends_with(".pending"));
        assert!(name.starts_with("part-") || hidden, "{name}");
    }
}

fn restored_from_a_checkpoint(w: &mut World, out: &Out) {
    let from = format!("restored from {}/myapp-ck/", w.tmp.display());
    assert!(
        out.stderr.lines().any(|l| l.starts_with(&from)),
        "{}",
        out.stderr
    );
    assert!(
        out.stderr.contains("click-count finished in"),
        "{}",
        out.stderr
    );
}

/// Waits for the coordinator's line with its addresses; later commands use them.
fn coordinator_up(w: &mut World, out: &Out) {
    let mut addresses = None;
    wait_until("the coordinator to listen", || {
        let log = std::fs::read_to_string(&out.stderr_path).unwrap_or_default();
        addresses = log.lines().find_map(|l| {
            let rest = l.strip_prefix("coordinator listening for workers on ")?;
            let (bind, rest) = rest.split_once(", REST API on http://")?;
            Some((bind.to_string(), rest.trim().to_string()))
        });
        addresses.is_some()
    });
    let (bind, rest) = addresses.unwrap_or_default();
    w.addresses = vec![("127.0.0.1:6123", bind), ("127.0.0.1:8081", rest)];
}

fn worker_up(_: &mut World, out: &Out) {
    wait_until("the worker to register", || {
        std::fs::read_to_string(&out.stderr_path)
            .unwrap_or_default()
            .contains("registered with the coordinator")
    });
}

/// The committed lines of a `--output` directory (tab-separated fields); asserts that each
/// user's counts are 1..=PER_USER, each once.
fn exactly_once(dir: &Path) -> Vec<Vec<String>> {
    let mut lines = Vec::new();
    let mut counts: HashMap<String, Vec<u64>> = HashMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let fields: Vec<String> = line.split('\t').map(str::to_string).collect();
            let count = fields.get(1).and_then(|c| c.parse().ok());
            let Some(count) = count else {
                panic!("bad line {line:?} in {name}");
            };
            counts.entry(fields[0].clone()).or_default().push(count);
            lines.push(fields);
        }
    }
    assert_eq!(counts.len(), 5, "five users in {}", dir.display());
    for (user, mut c) in counts {
        c.sort_unstable();
        assert!(
            c.iter().copied().eq(1..=PER_USER),
            "{user}'s counts in {} are not 1..={PER_USER} once each ({} lines)",
            dir.display(),
            c.len()
        );
    }
    lines
}

/// A text block as lines of whitespace-separated words (tabs and spaces alike).
fn words(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Runs one step of the page.
fn run_step(w: &mut World, step: &Step) -> Out {
    let cmd = w.map(step.cmd);
    eprintln!("$ {cmd}");
    let out = match &step.check {
        Check::Until(cond) => {
            let mut last = Out::default();
            let mut cond_holds = false;
            let deadline = Instant::now() + WAIT_DEADLINE;
            while !cond_holds {
                assert!(
                    Instant::now() < deadline,
                    "waited {WAIT_DEADLINE:?} for `{}` to show what the page waits for; last output:\n{}{}",
                    step.cmd,
                    last.stdout,
                    last.stderr
                );
                if last.code != 0 || !last.stdout.is_empty() {
                    std::thread::sleep(POLL);
                }
                last = w.shell.run(&cmd);
                cond_holds = last.code == 0 && cond(w, &last.stdout);
            }
            last
        }
        Check::Build => {
            // The binary cargo built from the same files stands in for the reader's build.
            let (source, bin) = if w.version_2 {
                (V2_RS, env!("CARGO_BIN_EXE_myapp-v2"))
            } else {
                (MAIN_RS, env!("CARGO_BIN_EXE_myapp"))
            };
            let main_rs = std::fs::read_to_string(w.project().join("src/main.rs")).unwrap();
            assert!(
                main_rs == source,
                "the project the page built has another main.rs than the binary that stands in for it"
            );
            let out = w
                .shell
                .run("cargo tree --offline --edges normal,build --prefix none");
            assert_eq!(
                out.code, 0,
                "cargo does not accept the page's project: {}",
                out.stderr
            );
            let native: Vec<&str> = out
                .stdout
                .lines()
                .filter(|l| l.starts_with("cc ") || l.starts_with("cmake ") || l.contains("-sys "))
                .collect();
            assert!(
                native.is_empty(),
                "the page says its build compiles no C or C++, and it builds {native:?}"
            );
            let release = w.project().join("target/release");
            std::fs::create_dir_all(&release).unwrap();
            let link = release.join("myapp");
            let _ = std::fs::remove_file(&link);
            symlink(bin, &link).unwrap();
            out
        }
        _ => w.shell.run(&cmd),
    };
    assert_eq!(
        out.code, 0,
        "`{}` failed ({}):\n{}{}",
        step.cmd, out.code, out.stdout, out.stderr
    );
    if let Check::Background = step.check {
        let pid = w.shell.eval("$!");
        w.pids.push((
            step.cmd.to_string(),
            pid.parse()
                .unwrap_or_else(|_| panic!("no pid for `{}`", step.cmd)),
        ));
    }
    // A transcript, as the reader would see it (their build's output aside).
    if !matches!(step.check, Check::Build) {
        eprint!("{}", out.stdout);
    }
    if !matches!(step.check, Check::Background | Check::Build) {
        eprint!("{}", out.stderr);
    }
    w.outs.insert(step.cmd.to_string(), out.clone());
    if let Some(then) = step.then {
        then(w, &out);
    }
    out
}

#[test]
fn every_command_of_the_page_runs_as_the_page_says() {
    let tmp = tempfile::tempdir().unwrap();
    let tmp_path = tmp.path().canonicalize().unwrap();
    // The reader's clone of cairn, beside their project.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    symlink(repo.canonicalize().unwrap(), tmp_path.join("cairn")).unwrap();
    let mut w = World {
        shell: Shell::start(&tmp_path, &tmp_path.join("logs")),
        tmp: tmp_path.clone(),
        addresses: vec![
            ("127.0.0.1:6123", "127.0.0.1:0".into()),
            ("127.0.0.1:8081", "127.0.0.1:0".into()),
        ],
        version_2: false,
        pids: Vec::new(),
        outs: HashMap::new(),
        job: String::new(),
    };
    let all = blocks(PAGE);
    let mut steps = steps().into_iter();
    let mut rust_blocks = 0;
    let mut i = 0;
    while i < all.len() {
        let block = &all[i];
        match block.lang.as_str() {
            "toml" => {
                let manifest = w.project().join("Cargo.toml");
                let text = std::fs::read_to_string(&manifest).unwrap();
                let Some(head) = text.strip_suffix("[dependencies]\n") else {
                    panic!("`cargo new` made no empty [dependencies] at the end:\n{text}");
                };
                std::fs::write(&manifest, format!("{head}{}", block.text)).unwrap();
            }
            "rust" => {
                let main_rs = w.project().join("src/main.rs");
                if rust_blocks == 0 {
                    std::fs::write(&main_rs, &block.text).unwrap();
                } else {
                    let v1 = std::fs::read_to_string(&main_rs).unwrap();
                    std::fs::write(&main_rs, with_build(&v1, &block.text)).unwrap();
                    w.version_2 = true;
                }
                rust_blocks += 1;
            }
            "sh" => {
                let mut shown: Option<String> = None;
                for cmd in commands(&block.text) {
                    let step = steps.next().unwrap_or_else(|| {
                        panic!(
                            "the page's command `{cmd}` (block of line {}) is not in the test",
                            block.line
                        )
                    });
                    assert_eq!(
                        step.cmd, cmd,
                        "the page's command (block of line {}) is not the test's next",
                        block.line
                    );
                    let out = run_step(&mut w, &step);
                    if let Check::Shown = step.check {
                        shown.get_or_insert_with(String::new).push_str(&out.stdout);
                    }
                }
                if let Some(shown) = shown {
                    let page = all.get(i + 1).filter(|b| b.lang == "text");
                    let page = page.unwrap_or_else(|| {
                        panic!(
                            "the output of the block of line {} is not shown",
                            block.line
                        )
                    });
                    assert_eq!(
                        words(&shown),
                        words(&page.text),
                        "the block of line {} prints other than the page shows",
                        block.line
                    );
                    i += 1;
                }
            }
            // An example of an output that differs from run to run: what it shows is checked
            // by the step before it.
            _ => {}
        }
        i += 1;
    }
    let left: Vec<&str> = steps.map(|s| s.cmd).collect();
    assert!(left.is_empty(), "commands the page no longer has: {left:?}");
}
