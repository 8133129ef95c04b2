//! The fraud job end to end, as processes of the `fraud` binary.
//!
//! An undisturbed embedded run commits exactly the alerts and totals computed here, straight
//! from the generator ([`transaction`]) and the rule, without the job's operators. Then a cluster
//! — a coordinator and two workers of two slots — runs the job at parallelism 4 through two
//! crashes at chosen points of checkpoint progress: a worker SIGKILLed while it holds a sink
//! commit of a completed checkpoint (`sink-committing`), replaced by a new worker; then the
//! coordinator SIGKILLed right after writing a checkpoint's `_metadata`, before any task learnt
//! that it completed (`checkpoint-completed`), and restarted on the same checkpoint directory
//! and ports. The job must end FINISHED with committed output equal to the undisturbed run's,
//! line for line, and no in-progress or pending file left.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use cairn_example_fraud::{
    alert_line, total_line, transaction, AccountTotal, Alert, Transaction, ONE_MINUTE_MS,
    SMALL_CENTS,
};

const TRANSACTIONS: u64 = 60_000;
const ACCOUNTS: u64 = 500;
/// `--threshold` in dollars, and in cents.
const THRESHOLD: &str = "500";
const THRESHOLD_CENTS: u64 = 50_000;
/// Transactions per second of the cluster run: its input lasts 15 s, well past both kills
/// (each lands a few checkpoints of 200 ms in).
const RATE: u64 = 4_000;
/// The worker stops here, for a checkpoint at least `WORKER_AT`.
const WORKER_POINT: &str = "sink-committing";
const WORKER_AT: u64 = 3;
/// The coordinator stops here, for a checkpoint at least `COORDINATOR_AT`: after the worker's
/// kill, since no checkpoint completes while the stopped sink holds its task.
const COORDINATOR_POINT: &str = "checkpoint-completed";
const COORDINATOR_AT: u64 = 8;
/// How long any one phase may take.
const PHASE_MAX: Duration = Duration::from_secs(90);

fn fraud() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_fraud"));
    // Only the processes meant to stop are armed.
    cmd.env_remove("CAIRN_FAILPOINTS")
        .env_remove("CAIRN_FAILPOINT_MARKER");
    cmd
}

/// The job's own flags, writing under `out`.
fn job_flags(out: &Path) -> Vec<String> {
    [
        "--transactions",
        &TRANSACTIONS.to_string(),
        "--accounts",
        &ACCOUNTS.to_string(),
        "--threshold",
        THRESHOLD,
        "--output",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([out.display().to_string()])
    .collect()
}

/// The alert lines the rule gives, found without the job: an account's transaction is an alert
/// if it is large and the account's previous one was small and less than a minute before.
fn expected_alerts() -> Vec<String> {
    let mut previous: BTreeMap<u64, Transaction> = BTreeMap::new();
    let mut alerts = Vec::new();
    for i in 0..TRANSACTIONS {
        let t = transaction(i, ACCOUNTS);
        if let Some(p) = previous.insert(t.account, t) {
            if p.amount_cents < SMALL_CENTS
                && t.amount_cents > THRESHOLD_CENTS
                && t.timestamp_ms - p.timestamp_ms < ONE_MINUTE_MS
            {
                alerts.push(alert_line(&Alert { small: p, large: t }));
            }
        }
    }
    alerts.sort();
    alerts
}

/// The total lines: every account's count and sum per minute of event time.
fn expected_totals() -> Vec<String> {
    let mut totals: BTreeMap<(i64, u64), (u64, u64)> = BTreeMap::new();
    for i in 0..TRANSACTIONS {
        let t = transaction(i, ACCOUNTS);
        let minute = t.timestamp_ms - t.timestamp_ms.rem_euclid(60_000);
        let e = totals.entry((minute, t.account)).or_default();
        e.0 += 1;
        e.1 += t.amount_cents;
    }
    let mut lines: Vec<String> = totals
        .into_iter()
        .map(|((window_start, account), (transactions, total_cents))| {
            total_line(&AccountTotal {
                account,
                window_start,
                transactions,
                total_cents,
            })
        })
        .collect();
    lines.sort();
    lines
}

/// The lines of the committed files in `dir`, sorted; fails if an in-progress or pending file
/// (a name starting with '.' or '_') is left.
fn committed(dir: &Path) -> Vec<String> {
    let mut lines = Vec::new();
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        assert!(
            !name.starts_with('.') && !name.starts_with('_'),
            "uncommitted file left in {}: {name}",
            dir.display()
        );
        let text = std::fs::read_to_string(e.path()).unwrap();
        lines.extend(text.lines().map(str::to_string));
    }
    lines.sort();
    lines
}

fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().expect("fraud starts");
    assert!(
        out.status.success(),
        "fraud failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// An undisturbed embedded run at parallelism 1 writing under `out`.
fn embedded_run(out: &Path) {
    run_ok(
        fraud()
            .args(["run", "fraud", "-p", "1"])
            .args(job_flags(out)),
    );
}

#[test]
fn an_undisturbed_run_commits_exactly_the_alerts_and_totals_of_the_rule() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("out");
    embedded_run(&out);
    let alerts = committed(&out.join("alerts"));
    assert!(
        alerts.len() > 100,
        "too few alerts to tell: {}",
        alerts.len()
    );
    assert_eq!(alerts, expected_alerts());
    assert_eq!(committed(&out.join("totals")), expected_totals());
}

/// A process of the `fraud` binary, its stderr in a log file; SIGKILLed when dropped.
struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` as `name`, its stderr in `logs/<name>.log`; `armed`: the failpoint it stops
    /// at and the marker file it records it in.
    fn spawn(
        name: &str,
        cmd: &mut Command,
        logs: &Path,
        armed: Option<(&str, u64, &Path)>,
    ) -> Proc {
        let log = logs.join(format!("{name}.log"));
        if let Some((point, at, marker)) = armed {
            cmd.env("CAIRN_FAILPOINTS", format!("{point}={at}"))
                .env("CAIRN_FAILPOINT_MARKER", marker);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("fraud starts");
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails the test with the process's log if it has exited.
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{} exited ({status}):\n{}", self.name, self.log_text());
        }
    }

    /// SIGKILL, and wait until it is gone.
    fn kill(mut self) {
        self.assert_running();
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every log under `logs`, for a failure's message.
fn all_logs(logs: &Path) -> String {
    let mut names: Vec<PathBuf> = std::fs::read_dir(logs)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .map(|p| {
            let text = std::fs::read_to_string(p).unwrap_or_default();
            format!("--- {}\n{text}", p.display())
        })
        .collect()
}

/// Polls `f` until it returns Some; fails with every log if `PHASE_MAX` passes first.
fn wait_for<T>(what: &str, logs: &Path, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PHASE_MAX;
    let mut pause = Duration::from_millis(5);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; logs:\n{}",
            all_logs(logs)
        );
        std::thread::park_timeout(pause);
        pause = (pause * 2).min(Duration::from_millis(100));
    }
}

/// The `POINT ID` line a process wrote to its marker file at its failpoint; None until the
/// whole line is there.
fn read_marker(path: &Path) -> Option<(String, u64)> {
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.strip_suffix('\n')?;
    let (name, id) = line.split_once(' ')?;
    Some((name.to_string(), id.parse().ok()?))
}

/// A coordinator and where it listens: for workers, and its REST API (`HOST:PORT` both).
struct Coordinator {
    proc: Proc,
    bind: String,
    rest: String,
}

/// Starts a coordinator on `bind` and `rest` (port 0: the system picks one) keeping
/// checkpoints in `ck`; returns once it says where it listens.
fn coordinator(
    name: &str,
    bind: &str,
    rest: &str,
    ck: &Path,
    logs: &Path,
    armed: Option<(&str, u64, &Path)>,
) -> Coordinator {
    let mut proc = Proc::spawn(
        name,
        fraud()
            .args(["coordinator", "--bind", bind, "--rest", rest])
            .arg("--checkpoint-dir")
            .arg(ck),
        logs,
        armed,
    );
    let (bind, rest) = wait_for(&format!("{name} to listen"), logs, || {
        proc.assert_running();
        let text = proc.log_text();
        let line = text.lines().find_map(|l| {
            l.split_once("coordinator listening for workers on ")
                .map(|(_, r)| r)
        })?;
        let (bind, rest) = line.split_once(", REST API on http://")?;
        Some((bind.trim().to_string(), rest.trim().to_string()))
    });
    Coordinator { proc, bind, rest }
}

fn worker(name: &str, bind: &str, logs: &Path, armed: Option<(&str, u64, &Path)>) -> Proc {
    Proc::spawn(
        name,
        fraud().args(["worker", "--coordinator", bind, "--slots", "2"]),
        logs,
        armed,
    )
}

/// The JSON body of `GET path` from the REST API at `rest`, if it answers.
fn get_json(rest: &str, path: &str) -> Option<serde_json::Value> {
    let mut s = TcpStream::connect(rest).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {rest}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut response = String::new();
    s.read_to_string(&mut response).ok()?;
    let (_, body) = response.split_once("\r\n\r\n")?;
    serde_json::from_str(body).ok()
}

/// The job's state (`RUNNING`, `FINISHED`, ...), if the REST API answers.
fn job_state(rest: &str, jid: &str) -> Option<String> {
    get_json(rest, &format!("/jobs/{jid}"))?["state"]
        .as_str()
        .map(str::to_string)
}

/// The id of the job's newest completed checkpoint (0: none yet).
fn latest_completed(rest: &str, jid: &str) -> Option<u64> {
    let v = get_json(rest, &format!("/jobs/{jid}/checkpoints"))?;
    Some(v["latest"]["completed"]["id"].as_u64().unwrap_or(0))
}

/// Fails if the job ended (it must still run where a kill is meant to land).
fn assert_still_running(rest: &str, jid: &str, before: &str, logs: &Path) {
    let state = job_state(rest, jid);
    assert!(
        !matches!(state.as_deref(), Some("FINISHED" | "FAILED" | "CANCELED")),
        "the job is {state:?} before {before}; logs:\n{}",
        all_logs(logs)
    );
}

#[test]
fn a_cluster_killed_at_a_worker_and_at_the_coordinator_commits_what_an_undisturbed_run_does() {
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let logs = tmp.path().join("logs");
    std::fs::create_dir(&logs).unwrap();
    let reference = tmp.path().join("reference");
    embedded_run(&reference);

    let ck = tmp.path().join("ck");
    let coordinator_marker = tmp.path().join("coordinator.marker");
    let worker_marker = tmp.path().join("worker.marker");
    let mut coord = coordinator(
        "coordinator-1",
        "127.0.0.1:0",
        "127.0.0.1:0",
        &ck,
        &logs,
        Some((COORDINATOR_POINT, COORDINATOR_AT, &coordinator_marker)),
    );
    let mut armed = worker(
        "worker-a",
        &coord.bind,
        &logs,
        Some((WORKER_POINT, WORKER_AT, &worker_marker)),
    );
    let mut steady = worker("worker-b", &coord.bind, &logs, None);

    let out = tmp.path().join("out");
    let submitted = run_ok(
        fraud()
            .args([
                "submit",
                "--rest",
                &format!("http://{}", coord.rest),
                "fraud",
            ])
            .args(job_flags(&out))
            .args(["--rate", &RATE.to_string()])
            .args(["-p", "4", "--checkpoint-interval", "200ms"])
            .args(["-D", "restart-strategy.type=fixed-delay"])
            .args(["-D", "restart-strategy.fixed-delay.attempts=50"])
            .args(["-D", "restart-strategy.fixed-delay.delay=100ms"]),
    );
    let stdout = String::from_utf8_lossy(&submitted.stdout);
    let jid = stdout.lines().last().unwrap_or_default().trim().to_string();
    assert_eq!(jid.len(), 32, "job id: {stdout:?}");

    // 1. A worker stops while committing its sinks' files of a completed checkpoint.
    let (point, worker_id) = wait_for(&format!("{WORKER_POINT}={WORKER_AT}"), &logs, || {
        coord.proc.assert_running();
        steady.assert_running();
        armed.assert_running();
        assert_still_running(&coord.rest, &jid, "the worker's failpoint", &logs);
        assert!(
            read_marker(&coordinator_marker).is_none(),
            "the coordinator stopped before the worker"
        );
        read_marker(&worker_marker)
    });
    assert_eq!(point, WORKER_POINT);
    assert!(
        worker_id >= WORKER_AT,
        "{point} at {worker_id}, armed for {WORKER_AT}"
    );
    assert!(
        worker_id < COORDINATOR_AT,
        "{point} at {worker_id}: the coordinator, armed for {COORDINATOR_AT}, may already be stopped"
    );
    // Its sinks were notified: the checkpoint completed.
    wait_for(
        &format!("checkpoint {worker_id} to show as completed"),
        &logs,
        || (latest_completed(&coord.rest, &jid)? >= worker_id).then_some(()),
    );
    armed.kill();
    let mut replacement = worker("worker-c", &coord.bind, &logs, None);

    // 2. The coordinator stops after writing a checkpoint's _metadata, before notifying.
    let (point, coordinator_id) = wait_for(
        &format!("{COORDINATOR_POINT}={COORDINATOR_AT}"),
        &logs,
        || {
            coord.proc.assert_running();
            steady.assert_running();
            replacement.assert_running();
            assert_still_running(&coord.rest, &jid, "the coordinator's failpoint", &logs);
            read_marker(&coordinator_marker)
        },
    );
    assert_eq!(point, COORDINATOR_POINT);
    assert!(
        coordinator_id >= COORDINATOR_AT,
        "{point} at {coordinator_id}, armed for {COORDINATOR_AT}"
    );
    let metadata = ck
        .join(&jid)
        .join(format!("chk-{coordinator_id}"))
        .join("_metadata");
    assert!(metadata.is_file(), "no {}", metadata.display());
    let (bind, rest) = (coord.bind.clone(), coord.rest.clone());
    coord.proc.kill();
    // The workers reconnect to the same address by themselves.
    coord = coordinator("coordinator-2", &bind, &rest, &ck, &logs, None);

    let state = wait_for("the resumed job to finish", &logs, || {
        coord.proc.assert_running();
        let state = job_state(&coord.rest, &jid)?;
        matches!(state.as_str(), "FINISHED" | "FAILED" | "CANCELED").then_some(state)
    });
    assert_eq!(state, "FINISHED", "logs:\n{}", all_logs(&logs));
    let resumed = coord.proc.log_text();
    assert!(
        resumed.contains(&format!("restoring job from checkpoint {coordinator_id} (")),
        "the job did not resume from checkpoint {coordinator_id}:\n{resumed}"
    );
    let status = run_ok(fraud().args(["status", &jid, "--rest", &coord.rest]));
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status
            .lines()
            .any(|l| l.starts_with("state:") && l.trim_end().ends_with("FINISHED")),
        "{status}"
    );
    drop((steady, replacement, coord));

    let alerts = committed(&out.join("alerts"));
    assert_eq!(alerts, committed(&reference.join("alerts")));
    assert_eq!(alerts, expected_alerts());
    let totals = committed(&out.join("totals"));
    assert_eq!(totals, committed(&reference.join("totals")));
    assert_eq!(totals, expected_totals());
    eprintln!(
        "worker SIGKILLed at {WORKER_POINT} {worker_id}, coordinator at {COORDINATOR_POINT} \
         {coordinator_id}; {} alerts and {} totals committed exactly once in {:.1} s",
        alerts.len(),
        totals.len(),
        started.elapsed().as_secs_f64()
    );
}
