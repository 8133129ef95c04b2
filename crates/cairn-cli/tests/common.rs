//! Shared helpers of the end-to-end tests: running the `cairn` binary and checking the
//! exactly-once property of wordcount's committed output (design.md §3).

#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

pub fn cairn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
}

/// Submits built-in `job` with its flags to the coordinator's REST API at `rest` (with the
/// bearer `token`, if any); returns the new job's id, the last line `cairn submit` prints.
pub fn submit(rest: SocketAddr, token: Option<&str>, job: &[&str]) -> String {
    let mut cmd = cairn();
    cmd.args(["submit", "--rest", &format!("http://{rest}")]);
    if let Some(token) = token {
        cmd.args(["--rest-token", token]);
    }
    let out = run_ok(cmd.args(job));
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout.lines().last().unwrap_or_default().trim().to_string()
}

pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("cairn starts");
    assert!(
        out.status.success(),
        "cairn failed ({:?}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// How often each word occurs in `--generate count --keys keys`.
pub fn generated_counts(count: u64, keys: u64) -> HashMap<String, u64> {
    let mut m = HashMap::new();
    for i in 0..count {
        *m.entry(format!("w{}", (i * 7919) % keys)).or_insert(0) += 1;
    }
    m
}

/// Flags for a restart strategy that retries at once, as often as a test's failures need.
pub const RESTART_FAST: [&str; 6] = [
    "-D",
    "restart-strategy.type=fixed-delay",
    "-D",
    "restart-strategy.fixed-delay.attempts=1000",
    "-D",
    "restart-strategy.fixed-delay.delay=0ms",
];

/// Every line of the committed files in `dir` (names not starting with '.' or '_'), sorted.
pub fn committed_sorted(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    for e in std::fs::read_dir(dir).expect("output dir exists") {
        let e = e.expect("dir entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).expect("committed file is UTF-8");
        lines.extend(text.lines().map(str::to_string));
    }
    lines.sort_unstable();
    lines
}

/// Every `WORD<TAB>COUNT` line of the committed files (names not starting with '.' or '_').
pub fn committed_lines(dir: &Path) -> HashMap<String, Vec<u64>> {
    let mut seen: HashMap<String, Vec<u64>> = HashMap::new();
    for e in std::fs::read_dir(dir).expect("output dir exists") {
        let e = e.expect("dir entry");
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name.starts_with('_') {
            continue;
        }
        let text = std::fs::read_to_string(e.path()).expect("committed file is UTF-8");
        for line in text.lines() {
            let (w, c) = line
                .split_once('\t')
                .unwrap_or_else(|| panic!("bad line {line:?} in {name}"));
            seen.entry(w.to_string())
                .or_default()
                .push(c.parse().expect("count"));
        }
    }
    seen
}

/// Summary of a check: total duplicates and losses.
#[derive(Debug, Default)]
pub struct Check {
    pub duplicates: u64,
    pub missing: u64,
}

/// Compares committed output with the expected word counts.
pub fn check_output(dir: &Path, expected: &HashMap<String, u64>) -> Check {
    let mut seen = committed_lines(dir);
    let mut check = Check::default();
    for (w, &n) in expected {
        let mut counts = seen.remove(w).unwrap_or_default();
        counts.sort_unstable();
        let mut present = vec![0u64; n as usize + 1];
        for c in counts {
            assert!(c >= 1, "word {w}: count {c}");
            if c > n {
                // A count past n: some record of w was counted twice (at-least-once).
                check.duplicates += 1;
            } else {
                present[c as usize] += 1;
            }
        }
        for &times in &present[1..] {
            match times {
                0 => check.missing += 1,
                1 => {}
                more => check.duplicates += more - 1,
            }
        }
    }
    assert!(
        seen.is_empty(),
        "unexpected words in output: {:?}",
        seen.keys().take(5).collect::<Vec<_>>()
    );
    check
}

/// Asserts exactly-once: every word's counts 1..n, each exactly once.
pub fn assert_exactly_once(dir: &Path, expected: &HashMap<String, u64>) {
    let c = check_output(dir, expected);
    assert_eq!(
        (c.duplicates, c.missing),
        (0, 0),
        "exactly-once violated in {}",
        dir.display()
    );
}

/// No hidden (uncommitted) files left behind by a finished job.
pub fn assert_no_leftovers(dir: &Path) {
    for e in std::fs::read_dir(dir).expect("output dir exists") {
        let name = e.expect("entry").file_name().to_string_lossy().into_owned();
        assert!(
            !name.starts_with(".part-"),
            "uncommitted file left behind: {name}"
        );
    }
}

/// The failpoints of `cairn::failpoint` a kill test can stop a process at.
pub const FAILPOINTS: [&str; 4] = [
    "checkpoint-completed",
    "upload",
    "sink-pre-committed",
    "sink-committing",
];

/// The `NAME ID` line a process wrote to its `CAIRN_FAILPOINT_MARKER` file when it reached a
/// failpoint; None until the whole line is there.
pub fn read_marker(path: &Path) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.strip_suffix('\n')?;
    let (name, id) = line.split_once(' ')?;
    Some((name.to_string(), id.parse().ok()?))
}

/// A small xorshift generator: tests choose their failpoints and offsets from a seed.
pub fn seeded(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// The failpoints in an order chosen by `next` (every point once).
pub fn shuffled_failpoints(next: &mut impl FnMut() -> u64) -> Vec<&'static str> {
    let mut points = FAILPOINTS.to_vec();
    for i in (1..points.len()).rev() {
        points.swap(i, (next() % (i as u64 + 1)) as usize);
    }
    points
}

/// A `cairn` child process whose stderr a thread reads line by line (so the pipe never
/// fills), killed if the test ends before it does.
pub struct Watched {
    child: Child,
    lines: Receiver<String>,
    stderr: String,
}

impl Drop for Watched {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Watched {
    /// Spawns `cmd` with stdin and stdout closed and stderr watched.
    pub fn spawn(cmd: &mut Command) -> Watched {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cairn starts");
        let err = child.stderr.take().expect("stderr is piped");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Watched {
            child,
            lines,
            stderr: String::new(),
        }
    }

    fn keep(&mut self, line: &str) {
        self.stderr.push_str(line);
        self.stderr.push('\n');
    }

    /// Waits for a stderr line starting with `prefix`; returns the rest of it. Panics with
    /// stderr so far if the process ends first or `deadline` passes.
    pub fn wait_for_line(&mut self, prefix: &str, deadline: Instant) -> String {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.keep(&line);
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.to_string();
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no line {prefix:?} in time; stderr:\n{}", self.stderr)
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "cairn ended ({:?}) without a line {prefix:?}; stderr:\n{}",
                    self.child.wait(),
                    self.stderr
                ),
            }
        }
    }

    /// Waits for a stderr line containing `needle` (log lines carry a time and level before
    /// the message); returns the whole line. Panics as [`Watched::wait_for_line`] does.
    pub fn wait_for_line_containing(&mut self, needle: &str, deadline: Instant) -> String {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    self.keep(&line);
                    if line.contains(needle) {
                        return line;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    panic!("no line with {needle:?} in time; stderr:\n{}", self.stderr)
                }
                Err(RecvTimeoutError::Disconnected) => panic!(
                    "the process ended ({:?}) without a line with {needle:?}; stderr:\n{}",
                    self.child.wait(),
                    self.stderr
                ),
            }
        }
    }

    /// The address of the REST API, read back from the line `cairn run --rest` prints once it
    /// listens; with `--rest 127.0.0.1:0` the system picks a free port, so no port is chosen
    /// beforehand that another process could take meanwhile.
    pub fn rest_addr(&mut self, deadline: Instant) -> SocketAddr {
        let addr = self.wait_for_line("REST API listening on http://", deadline);
        addr.parse()
            .unwrap_or_else(|e| panic!("bad REST address {addr:?}: {e}"))
    }

    /// Sends SIGINT (as Ctrl-C in a terminal would).
    pub fn interrupt(&self) {
        let ok = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -INT failed");
    }

    /// Sends SIGTERM (as `kill` or a service manager would).
    pub fn terminate(&self) {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill runs")
            .success();
        assert!(ok, "kill -TERM failed");
    }

    /// Waits, while the process runs, until `done` holds; fails the test naming `what` if
    /// `deadline` passes first.
    pub fn wait_until(&mut self, what: &str, deadline: Instant, mut done: impl FnMut() -> bool) {
        while !done() {
            self.assert_running();
            assert!(Instant::now() < deadline, "{what} did not happen in time");
            std::thread::park_timeout(std::time::Duration::from_millis(5));
        }
    }

    /// Waits, while the process runs, until a checkpoint of some job under `ck` completed.
    pub fn wait_for_a_checkpoint(&mut self, ck: &Path, deadline: Instant) {
        self.wait_until("a checkpoint", deadline, || a_checkpoint_completed(ck));
    }

    /// For a `cairn run … --savepoint-on-exit DIR` whose checkpoints go under `ck`: once a
    /// checkpoint completed, stops it with SIGTERM; returns the savepoint's path and the whole
    /// stderr once the run ended successfully.
    pub fn stop_with_savepoint_after_a_checkpoint(
        mut self,
        ck: &Path,
        deadline: Instant,
    ) -> (PathBuf, String) {
        self.wait_for_a_checkpoint(ck, deadline);
        self.terminate();
        let path = PathBuf::from(self.wait_for_line("savepoint stored in ", deadline));
        let (status, stderr) = self.wait(deadline);
        assert!(status.success(), "the stopped run must succeed: {stderr}");
        (path, stderr)
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The stderr lines read so far (without waiting for more).
    pub fn stderr_so_far(&mut self) -> String {
        while let Ok(line) = self.lines.try_recv() {
            self.keep(&line);
        }
        self.stderr.clone()
    }

    /// Fails the test with the child's stderr if it has exited.
    pub fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().expect("try_wait") {
            let (_, stderr) = self.drain(Instant::now() + std::time::Duration::from_secs(10));
            panic!("cairn exited early ({status}):\n{stderr}");
        }
    }

    /// Waits for the process to exit (its stderr to close) before `deadline`; returns its
    /// status and whole stderr.
    pub fn wait(mut self, deadline: Instant) -> (ExitStatus, String) {
        let (closed, stderr) = self.drain(deadline);
        assert!(closed, "cairn did not exit in time; stderr:\n{stderr}");
        (self.child.wait().expect("wait"), stderr)
    }

    /// Reads stderr until it closes (true) or `deadline` passes (false).
    fn drain(&mut self, deadline: Instant) -> (bool, String) {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.keep(&line),
                Err(RecvTimeoutError::Timeout) => return (false, self.stderr.clone()),
                Err(RecvTimeoutError::Disconnected) => return (true, self.stderr.clone()),
            }
        }
    }
}

/// Whether a checkpoint of some job under `ck` completed (its `_metadata` exists).
pub fn a_checkpoint_completed(ck: &Path) -> bool {
    let Ok(jobs) = std::fs::read_dir(ck) else {
        return false;
    };
    jobs.flatten().any(|job| {
        std::fs::read_dir(job.path())
            .is_ok_and(|dirs| dirs.flatten().any(|d| d.path().join("_metadata").is_file()))
    })
}

/// A coordinator on ports the system picks, with workers of two slots each, all killed when
/// dropped.
pub struct Cluster {
    pub coordinator: Watched,
    pub workers: Vec<Watched>,
    /// The address workers connect to.
    pub bind: String,
    /// The coordinator's REST API, read back from the line it prints once it listens.
    pub rest: SocketAddr,
}

/// The command of a worker connecting to the coordinator at `bind`, with `slots` task slots.
fn worker_command(bind: &str, slots: u32) -> Command {
    let mut cmd = cairn();
    cmd.args(["worker", "--coordinator", bind])
        .args(["--slots", &slots.to_string()]);
    cmd
}

impl Cluster {
    /// Starts a coordinator keeping checkpoints under `checkpoint_dir` and `workers` workers;
    /// panics if the coordinator does not listen before `deadline`.
    pub fn start(checkpoint_dir: &Path, workers: usize, deadline: Instant) -> Cluster {
        Cluster::start_with(checkpoint_dir, workers, &[], deadline)
    }

    /// [`Cluster::start`] with more flags for the coordinator (e.g. `--rest-token T`).
    pub fn start_with(
        checkpoint_dir: &Path,
        workers: usize,
        coordinator_flags: &[&str],
        deadline: Instant,
    ) -> Cluster {
        let mut coordinator = Watched::spawn(
            cairn()
                .args([
                    "coordinator",
                    "--bind",
                    "127.0.0.1:0",
                    "--rest",
                    "127.0.0.1:0",
                ])
                .args(coordinator_flags)
                .arg("--checkpoint-dir")
                .arg(checkpoint_dir),
        );
        let line = coordinator.wait_for_line("coordinator listening for workers on ", deadline);
        let (bind, rest) = line
            .split_once(", REST API on http://")
            .unwrap_or_else(|| panic!("unexpected line {line:?}"));
        let rest = rest
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("bad REST address in {line:?}: {e}"));
        let bind = bind.trim();
        let workers = (0..workers)
            .map(|_| Watched::spawn(&mut worker_command(bind, 2)))
            .collect();
        Cluster {
            coordinator,
            workers,
            bind: bind.to_string(),
            rest,
        }
    }

    /// The command of one more worker of this cluster, with `slots` task slots.
    pub fn worker(&self, slots: u32) -> Command {
        worker_command(&self.bind, slots)
    }

    /// Fails the test with its stderr if the coordinator or a worker has exited.
    pub fn assert_running(&mut self) {
        self.coordinator.assert_running();
        for w in &mut self.workers {
            w.assert_running();
        }
    }
}

/// Runs `cmd` armed to stop at failpoint `point` from checkpoint `at` on, and kills it with
/// SIGKILL there (while the thread at the failpoint is parked); returns the point and checkpoint
/// it stopped at. The process's stderr goes to `log`.
pub fn kill_at_failpoint(
    mut cmd: Command,
    point: &str,
    at: u64,
    marker: &Path,
    log: &Path,
) -> Result<(String, u64), String> {
    let mut child = cmd
        .env("CAIRN_FAILPOINTS", format!("{point}={at}"))
        .env("CAIRN_FAILPOINT_MARKER", marker)
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let hit = loop {
        if let Some(hit) = read_marker(marker) {
            break Ok(hit);
        }
        if let Some(status) = child.try_wait().unwrap() {
            break Err(format!(
                "ended ({status}) before failpoint {point}={at}: {}",
                std::fs::read_to_string(log).unwrap_or_default()
            ));
        }
        if Instant::now() >= deadline {
            break Err(format!("never reached failpoint {point}={at}"));
        }
        std::thread::park_timeout(Duration::from_millis(2));
    };
    let _ = child.kill();
    child.wait().unwrap();
    hit
}

/// The newest completed checkpoint under checkpoint directory `ck` and the highest checkpoint
/// directory of its job (of the job with the newest, if there are several); None before any
/// checkpoint completed.
pub fn checkpoint_progress(ck: &Path) -> Option<(u64, u64)> {
    let mut best: Option<(u64, u64)> = None;
    for job in std::fs::read_dir(ck).ok()? {
        let job = job.ok()?.path();
        let (mut completed, mut highest) = (None, 0u64);
        for e in std::fs::read_dir(&job).ok()? {
            let e = e.ok()?;
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(id) = name
                .strip_prefix("chk-")
                .and_then(|n| n.parse::<u64>().ok())
            else {
                continue;
            };
            highest = highest.max(id);
            if e.path().join("_metadata").exists() {
                completed = completed.max(Some(id));
            }
        }
        if let Some(id) = completed {
            if best.is_none_or(|(b, _)| id > b) {
                best = Some((id, highest));
            }
        }
    }
    best
}

/// The checkpoint a run said (on its standard error) it restores from.
pub fn restored_checkpoint(stderr: &str) -> Option<u64> {
    let (_, rest) = stderr.split_once("restoring job from checkpoint ")?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Fills Kafka topic `topic` (which must exist) at `brokers` with `lines` lines of
/// `words_per_line` words, spread round-robin over `partitions` partitions; word number i
/// (counted over all lines) is `w` + ((i * 7919) mod `keys`), as `--generate` makes them, so
/// the expected counts are `generated_counts(lines * words_per_line, keys)`; then seals every
/// partition ([`seal_partitions`]).
pub fn fill_topic(
    brokers: &str,
    topic: &str,
    partitions: i32,
    lines: u64,
    words_per_line: u64,
    keys: u64,
) {
    let records = word_lines(lines, words_per_line, keys)
        .enumerate()
        .map(|(i, line)| ((i as u64 % partitions as u64) as i32, line));
    cairn::connectors::kafka::produce(brokers, topic, records).unwrap_or_else(|e| panic!("{e}"));
    seal_partitions(brokers, topic, partitions);
}

/// `lines` lines of `words_per_line` words; word number i (counted over all lines) is `w` +
/// ((i * 7919) mod `keys`), as `--generate` makes them.
pub fn word_lines(lines: u64, words_per_line: u64, keys: u64) -> impl Iterator<Item = String> {
    (0..lines).map(move |i| {
        let words: Vec<String> = (0..words_per_line)
            .map(|j| format!("w{}", (i * words_per_line + j).wrapping_mul(7919) % keys))
            .collect();
        words.join(" ")
    })
}

/// Ends every partition of `topic` with an empty line (no words) in a record batch of its own.
/// Tansu reports a partition's end offset as one past the first offset of its last record
/// batch, so a bounded read there stops before the rest of that batch; sealed, what it misses
/// is the empty line. (A real broker reports the true end; the empty lines count no word.)
pub fn seal_partitions(brokers: &str, topic: &str, partitions: i32) {
    for p in 0..partitions {
        cairn::connectors::kafka::produce(brokers, topic, [(p, "")])
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// The Kafka broker of the tests that need transactions: Tansu from `scripts/service-kafka`
/// on 127.0.0.1:59092, or `CAIRN_TEST_KAFKA_BROKERS`.
pub fn kafka_brokers() -> String {
    std::env::var("CAIRN_TEST_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:59092".into())
}

/// A topic name starting with `what`, unique to this run.
pub fn unique_topic(what: &str) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("{what}-{}-{nanos}", std::process::id())
}

/// What a [`Proxy`] does to the bytes of its connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Forwards every byte at once.
    Pass,
    /// Forwards nothing and keeps every connection open: the peers see a silent link.
    Stall,
    /// Forwards `chunk` bytes at a time, `delay` apart (a slow link).
    Slow { chunk: usize, delay: Duration },
}

/// Byte counts of a [`Proxy`], to check that a fault landed.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Connections accepted.
    pub connections: std::sync::atomic::AtomicU64,
    /// Bytes forwarded (both directions).
    pub forwarded: std::sync::atomic::AtomicU64,
    /// Bytes read while the proxy stalled (held back until it passes again).
    pub held: std::sync::atomic::AtomicU64,
    /// Bytes forwarded while the link was slow.
    pub slowed: std::sync::atomic::AtomicU64,
    /// Connections closed by [`Proxy::reset`].
    pub reset: std::sync::atomic::AtomicU64,
}

struct ProxyShared {
    /// Where connections go; until it is set they are closed.
    target: std::sync::Mutex<Option<String>>,
    fault: std::sync::Mutex<Fault>,
    changed: std::sync::Condvar,
    /// Both sockets of every connection, to reset them.
    open: std::sync::Mutex<Vec<(std::net::TcpStream, std::net::TcpStream)>>,
    stats: ProxyStats,
}

/// A TCP proxy on 127.0.0.1 between cluster processes, whose faults the test switches: every
/// accepted connection is forwarded to `target` in both directions by two threads.
pub struct Proxy {
    addr: SocketAddr,
    shared: std::sync::Arc<ProxyShared>,
}

impl Proxy {
    /// Listens on a port the system picks and forwards to `target` (host:port).
    pub fn start(target: &str) -> Proxy {
        let proxy = Proxy::unaimed();
        proxy.aim(target);
        proxy
    }

    /// Listens on a port the system picks; connections are closed until [`Proxy::aim`].
    pub fn unaimed() -> Proxy {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("proxy binds");
        let addr = listener.local_addr().expect("proxy address");
        let shared = std::sync::Arc::new(ProxyShared {
            target: std::sync::Mutex::new(None),
            fault: std::sync::Mutex::new(Fault::Pass),
            changed: std::sync::Condvar::new(),
            open: std::sync::Mutex::new(Vec::new()),
            stats: ProxyStats::default(),
        });
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                accepting.connect(client);
            }
        });
        Proxy { addr, shared }
    }

    /// Forwards new connections to `target` (host:port).
    pub fn aim(&self, target: &str) {
        *self.shared.target.lock().unwrap() = Some(target.to_string());
    }

    /// The address to dial instead of the target.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn set(&self, fault: Fault) {
        *self.shared.fault.lock().unwrap() = fault;
        self.shared.changed.notify_all();
    }

    pub fn stats(&self) -> &ProxyStats {
        &self.shared.stats
    }

    /// Resets every open connection (SO_LINGER 0: both peers get a RST); new ones pass.
    pub fn reset(&self) {
        let open = std::mem::take(&mut *self.shared.open.lock().unwrap());
        for (a, b) in open {
            for s in [a, b] {
                let _ = socket2::SockRef::from(&s).set_linger(Some(Duration::ZERO));
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            self.shared
                .stats
                .reset
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}

impl ProxyShared {
    fn connect(self: &std::sync::Arc<Self>, client: std::net::TcpStream) {
        use std::sync::atomic::Ordering::Relaxed;
        self.stats.connections.fetch_add(1, Relaxed);
        let target = self.target.lock().unwrap().clone();
        let Some(Ok(server)) = target.map(std::net::TcpStream::connect) else {
            return;
        };
        let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
            return;
        };
        if let (Ok(c3), Ok(s3)) = (client.try_clone(), server.try_clone()) {
            self.open.lock().unwrap().push((c3, s3));
        }
        for (from, to) in [(client, s2), (server, c2)] {
            let shared = self.clone();
            std::thread::spawn(move || shared.pump(from, to));
        }
    }

    /// Forwards `from` to `to` as the fault says, until either side closes.
    fn pump(&self, mut from: std::net::TcpStream, mut to: std::net::TcpStream) {
        use std::io::{Read, Write};
        use std::sync::atomic::Ordering::Relaxed;
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            // Stalled: the bytes read are held (and nothing more is read) until it passes.
            let mut fault = self.fault.lock().unwrap();
            if *fault == Fault::Stall {
                self.stats.held.fetch_add(n as u64, Relaxed);
                while *fault == Fault::Stall {
                    fault = self.changed.wait(fault).unwrap();
                }
            }
            let fault = *fault;
            let sent = match fault {
                Fault::Slow { chunk, delay } => buf[..n].chunks(chunk.max(1)).all(|c| {
                    // The delay is the fault itself (a slow link), not a wait for a condition.
                    std::thread::sleep(delay);
                    self.stats.slowed.fetch_add(c.len() as u64, Relaxed);
                    to.write_all(c).is_ok()
                }),
                _ => to.write_all(&buf[..n]).is_ok(),
            };
            if !sent {
                break;
            }
            self.stats.forwarded.fetch_add(n as u64, Relaxed);
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
        let _ = from.shutdown(std::net::Shutdown::Read);
    }
}

/// Threads and open file descriptors of process `pid` (Linux: /proc/PID/task and /proc/PID/fd).
pub fn threads_and_fds(pid: u32) -> (usize, usize) {
    let count = |dir: &str| {
        std::fs::read_dir(format!("/proc/{pid}/{dir}"))
            .map(|d| d.count())
            .unwrap_or_else(|e| panic!("cannot read /proc/{pid}/{dir}: {e}"))
    };
    (count("task"), count("fd"))
}

/// `GET path` of the REST API at `rest` as JSON, None if it does not answer (or not 2xx).
pub fn rest_json(rest: SocketAddr, path: &str) -> Option<serde_json::Value> {
    let url = format!("http://{rest}{path}");
    let body = ureq::get(&url)
        .call()
        .ok()?
        .body_mut()
        .read_to_string()
        .ok()?;
    serde_json::from_str(&body).ok()
}

/// The state of job `jid` as the REST API at `rest` says, None if it does not answer.
pub fn rest_job_state(rest: SocketAddr, jid: &str) -> Option<String> {
    let v = rest_json(rest, &format!("/jobs/{jid}"))?;
    v["state"].as_str().map(str::to_string)
}

/// The restarts of job `jid` as the REST API at `rest` says.
pub fn rest_job_restarts(rest: SocketAddr, jid: &str) -> Option<u64> {
    rest_json(rest, &format!("/jobs/{jid}"))?["restarts"].as_u64()
}
