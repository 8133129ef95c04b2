//! `cairn bench --suite failover`: how long a job stands still when its coordinator goes. Two
//! coordinators share a checkpoint directory on 127.0.0.1 (one leads, one stands by), two
//! workers know both, and one long `backpressure` job runs. Each round waits for a checkpoint
//! of the current leader, then faults it — SIGKILL (reaped at once: the standby sees that the
//! leader's process on this host is gone) or SIGSTOP (the standby has to wait out the lease;
//! resumed afterwards, the deposed leader exits 1) — and measures from the signal until the job
//! is RUNNING on the new leader, and until the new leader completed its first checkpoint
//! triggered after the signal. The faulted coordinator is started again as the next standby.
//! Every process it starts is killed on every path; the coordinators' logs are kept (outside
//! the scratch directory) only when the run fails.

use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use cairn_app::client::{Client, Method};

use super::{BenchArgs, Spawned};

/// The coordinators' `--heartbeat-timeout`: the workers let a silent leader go after it.
const HEARTBEAT_TIMEOUT: &str = "500ms";
/// The coordinators' `--leader-lease`.
const LEADER_LEASE: &str = "1s";
/// A standby takes over a lease whose renewal it saw unchanged this long (the lease + 10 % +
/// 50 ms), for the note under the table.
const LEASE_LAPSE_MS: u64 = 1150;
/// The job's checkpoint interval.
const CHECKPOINT_INTERVAL: &str = "100ms";
/// Rounds per fault without `--repeat`.
const ROUNDS_DEFAULT: u32 = 3;
/// How long anything the benchmark waits for may take before it gives up.
const DEADLINE: Duration = Duration::from_secs(60);
/// How often the benchmark asks the REST API.
const POLL: Duration = Duration::from_millis(10);
/// Lines of a log shown when the run fails.
const TAIL_LINES: usize = 20;
/// The target and goal: jobs RUNNING again this soon after the leader is SIGKILLed.
const TARGET_MS: u64 = 5000;
const GOAL_MS: u64 = 2000;

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    Kill,
    Stop,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Kill => "SIGKILL",
            Fault::Stop => "SIGSTOP",
        }
    }
}

/// One coordinator: its fixed ports (a standby's must be known to the workers before it
/// listens), its log, its process while it runs.
struct Member {
    name: &'static str,
    bind: u16,
    rest: u16,
    log: PathBuf,
    /// The log's length when it was last started: what it said since follows.
    log_from: u64,
    proc: Option<Spawned>,
    client: Client,
}

impl Member {
    fn new(name: &'static str, logs: &Path) -> Result<Member> {
        let rest = free_port()?;
        Ok(Member {
            name,
            bind: free_port()?,
            rest,
            log: logs.join(format!("coordinator-{name}.log")),
            log_from: 0,
            proc: None,
            client: Client::new(&format!("http://127.0.0.1:{rest}"), None)?
                .with_timeout(Duration::from_secs(5)),
        })
    }

    /// Starts it on its ports, its stderr appended to its log; it leads or stands by.
    fn start(&mut self, exe: &Path, checkpoint_dir: &Path) -> Result<()> {
        self.log_from = std::fs::metadata(&self.log).map_or(0, |m| m.len());
        let mut cmd = Command::new(exe);
        cmd.arg("coordinator")
            .args(["--bind", &format!("127.0.0.1:{}", self.bind)])
            .args(["--rest", &format!("127.0.0.1:{}", self.rest)])
            .arg("--checkpoint-dir")
            .arg(checkpoint_dir)
            .args(["--heartbeat-timeout", HEARTBEAT_TIMEOUT])
            .args(["--leader-lease", LEADER_LEASE]);
        self.proc = Some(spawn_logged(cmd, &self.log)?);
        // A fresh client: the old one's pooled connections went with the old process.
        self.client = Client::new(&format!("http://127.0.0.1:{}", self.rest), None)?
            .with_timeout(Duration::from_secs(5));
        Ok(())
    }

    fn pid(&self) -> Result<u32> {
        self.proc
            .as_ref()
            .map(|p| p.0.id())
            .ok_or_else(|| anyhow!("coordinator {} is not running", self.name))
    }

    /// Whether its log has a line starting with `prefix` since it was last started.
    fn said(&self, prefix: &str) -> bool {
        let text = std::fs::read(&self.log).unwrap_or_default();
        let since = text.get(self.log_from as usize..).unwrap_or_default();
        String::from_utf8_lossy(since)
            .lines()
            .any(|l| l.starts_with(prefix))
    }

    /// Its exit status, once its process ended.
    fn exited(&mut self) -> Result<Option<ExitStatus>> {
        match &mut self.proc {
            Some(p) => {
                p.0.try_wait()
                    .with_context(|| format!("cannot wait for coordinator {}", self.name))
            }
            None => Ok(None),
        }
    }

    /// The job's state on this coordinator's REST API, if it answers.
    fn job_state(&self, jid: &str) -> Option<String> {
        let v = self.client.get(&format!("/jobs/{jid}")).ok()?;
        v["state"].as_str().map(str::to_string)
    }

    /// The job's newest completed checkpoint on this coordinator, if it has one.
    fn latest_checkpoint(&self, jid: &str) -> Option<Checkpoint> {
        let v = self.client.get(&format!("/jobs/{jid}/checkpoints")).ok()?;
        let latest = &v["latest"]["completed"];
        Some(Checkpoint {
            id: latest["id"].as_u64()?,
            triggered_ms: latest["trigger_timestamp"].as_u64()?,
            duration_ms: latest["end_to_end_duration"].as_u64()?,
        })
    }

    /// A one-line error naming its log, whose last lines go to stderr.
    fn failure(&self, what: &str) -> anyhow::Error {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        eprintln!(
            "last lines of {}:\n{}",
            file_name(&self.log),
            lines[lines.len().saturating_sub(TAIL_LINES)..].join("\n")
        );
        anyhow!(
            "{what} (coordinator {}: see {})",
            self.name,
            file_name(&self.log)
        )
    }

    /// Polls `f` every [`POLL`] until it returns Some; fails at once if this coordinator's
    /// process ends or the job failed on it, and after [`DEADLINE`].
    fn wait_for<T>(
        &mut self,
        what: &str,
        mut f: impl FnMut(&mut Member) -> Result<Option<T>>,
    ) -> Result<T> {
        let end = Instant::now() + DEADLINE;
        loop {
            match f(self) {
                Ok(Some(v)) => return Ok(v),
                Ok(None) => {}
                Err(e) => return Err(self.failure(&format!("{e} while waiting for {what}"))),
            }
            if let Some(status) = self.exited()? {
                return Err(self.failure(&format!(
                    "coordinator {} exited ({status}) while the benchmark waited for {what}",
                    self.name
                )));
            }
            if Instant::now() > end {
                return Err(self.failure(&format!(
                    "timed out after {} s waiting for {what}",
                    DEADLINE.as_secs()
                )));
            }
            std::thread::sleep(POLL);
        }
    }

    /// Waits until it says it leads and answers on its REST port.
    fn wait_until_leading(&mut self) -> Result<()> {
        let what = format!("coordinator {} to lead", self.name);
        self.wait_for(&what, |m| {
            Ok(
                (m.said("leading the coordinators on ") && m.client.get("/jobs").is_ok())
                    .then_some(()),
            )
        })
    }

    /// Waits until it says it stands by.
    fn wait_until_standing_by(&mut self) -> Result<()> {
        let what = format!("coordinator {} to stand by", self.name);
        self.wait_for(&what, |m| Ok(m.said("standing by: ").then_some(())))
    }

    /// Waits until the job runs on it and it completed a checkpoint newer than `after`.
    fn wait_for_checkpoint(&mut self, jid: &str, after: u64) -> Result<Checkpoint> {
        let what = format!(
            "coordinator {} to complete a checkpoint of the running job",
            self.name
        );
        self.wait_for(&what, |m| {
            let Some(c) = m.latest_checkpoint(jid) else {
                return Ok(None);
            };
            Ok((running(m.job_state(jid))? && c.id > after).then_some(c))
        })
    }
}

/// A completed checkpoint as the REST API shows it.
struct Checkpoint {
    id: u64,
    /// When it was triggered, in ms since the Unix epoch.
    triggered_ms: u64,
    /// Trigger to completion.
    duration_ms: u64,
}

/// Whether the job's `state` is RUNNING; an error if it ended.
fn running(state: Option<String>) -> Result<bool> {
    match state.as_deref() {
        Some(s @ ("FAILED" | "CANCELED" | "FINISHED")) => bail!("the job is {s}"),
        Some(s) => Ok(s == "RUNNING"),
        None => Ok(false),
    }
}

/// A port that was free a moment ago.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")
        .context("cannot find a free port on 127.0.0.1")?
        .local_addr()?
        .port())
}

fn file_name(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    )
}

/// Starts `cmd`, its stdout discarded and its stderr appended to `log`.
fn spawn_logged(mut cmd: Command, log: &Path) -> Result<Spawned> {
    let stderr = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("cannot open {}", log.display()))?;
    Ok(Spawned(
        cmd.stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .context("cannot start a cluster process")?,
    ))
}

/// Sends `signal` (`STOP`, `CONT`) to `pid` with kill(1).
fn signal(signal: &str, pid: u32) -> Result<()> {
    let status = Command::new("kill")
        .args([&format!("-{signal}"), &pid.to_string()])
        .status()
        .context("cannot run kill")?;
    if !status.success() {
        bail!("kill -{signal} {pid} failed ({status})");
    }
    Ok(())
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// One fault's figures, in ms from the signal.
struct Round {
    running_ms: u64,
    checkpoint_ms: u64,
}

/// (median, max) of `values`.
/// A fault's rounds and the (median, max) ms to RUNNING and to the first checkpoint.
type Summary = (Fault, usize, (u64, u64), (u64, u64));

fn median_max(values: impl Iterator<Item = u64>) -> (u64, u64) {
    let mut v: Vec<u64> = values.collect();
    v.sort_unstable();
    (
        v.get(v.len() / 2).copied().unwrap_or(0),
        v.last().copied().unwrap_or(0),
    )
}

pub(super) fn run(args: &BenchArgs, exe: &Path, scratch: &Path) -> Result<()> {
    let logs = scratch.join("failover-logs");
    std::fs::create_dir_all(&logs).with_context(|| format!("cannot create {}", logs.display()))?;
    // Every process is gone when `measure` returns (its cluster is dropped), so the logs are
    // complete; the caller removes the scratch directory, so keep them elsewhere on failure.
    measure(args, exe, scratch, &logs).map_err(|e| {
        let kept =
            std::env::temp_dir().join(format!("cairn-bench-failover-logs-{}", std::process::id()));
        match std::fs::rename(&logs, &kept) {
            Ok(()) => anyhow!("{e:#}; the logs are in {}", kept.display()),
            Err(_) => e,
        }
    })
}

/// Every process the benchmark started; dropping it kills them (SIGKILL, even when stopped)
/// and reaps them.
struct Cluster {
    members: [Member; 2],
    _workers: Vec<Spawned>,
}

fn measure(args: &BenchArgs, exe: &Path, scratch: &Path, logs: &Path) -> Result<()> {
    let rounds = args.repeat_flag.unwrap_or(ROUNDS_DEFAULT).max(1);
    let ck = scratch.join("failover-ck");
    let mut cluster = Cluster {
        members: [Member::new("a", logs)?, Member::new("b", logs)?],
        _workers: Vec::new(),
    };
    let members = &mut cluster.members;
    members[0].start(exe, &ck)?;
    members[0].wait_until_leading()?;
    members[1].start(exe, &ck)?;
    members[1].wait_until_standing_by()?;
    let list = members
        .iter()
        .map(|m| format!("127.0.0.1:{}", m.bind))
        .collect::<Vec<_>>()
        .join(",");
    let workers_log = logs.join("workers.log");
    for _ in 0..2 {
        let mut cmd = Command::new(exe);
        cmd.args(["worker", "--coordinator", &list, "--slots", "2"]);
        cluster._workers.push(spawn_logged(cmd, &workers_log)?);
    }
    let members = &mut cluster.members;
    let job: Vec<String> = [
        "-p",
        "4",
        "--keys",
        "1000",
        "--sink-rate",
        "100000",
        "--generate",
        "1000000000000",
        "--discard",
        "--checkpoint-interval",
        CHECKPOINT_INTERVAL,
        "-D",
        "restart-strategy.type=fixed-delay",
        "-D",
        "restart-strategy.fixed-delay.attempts=1000",
        "-D",
        "restart-strategy.fixed-delay.delay=0ms",
    ]
    .map(String::from)
    .to_vec();
    println!(
        "leader failover: 2 coordinators on one --checkpoint-dir (--leader-lease {LEADER_LEASE}, --heartbeat-timeout {HEARTBEAT_TIMEOUT}), 2 workers x 2 slots, backpressure {}; {rounds} round{} per fault",
        job.join(" "),
        if rounds == 1 { "" } else { "s" }
    );
    let answer = members[0]
        .client
        .clone()
        .with_timeout(DEADLINE)
        .request(
            Method::Post,
            "/jobs",
            Some(&serde_json::json!({"job": "backpressure", "args": job})),
        )
        .map_err(|e| members[0].failure(&format!("cannot submit the job: {e:#}")))?;
    let jid = answer["jobid"]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| anyhow!("no job id in the coordinator's answer {answer}"))?;
    println!("ms from the signal to the job RUNNING on the new leader, and to the new leader's first completed checkpoint triggered after the signal:");
    let mut leader = 0;
    let mut latest = 0;
    // Trigger to completion of the checkpoint each round waited for before its fault.
    let mut steady_ms = Vec::new();
    let mut results: Vec<(Fault, Vec<Round>)> = Vec::new();
    for fault in [Fault::Kill, Fault::Stop] {
        let mut figures = Vec::new();
        for round in 1..=rounds {
            let standby = 1 - leader;
            let before = members[leader].wait_for_checkpoint(&jid, latest)?;
            latest = before.id;
            steady_ms.push(before.duration_ms);
            let (t0, fault_ms) = match fault {
                Fault::Kill => {
                    let mut proc = members[leader]
                        .proc
                        .take()
                        .ok_or_else(|| anyhow!("the leader is not running"))?;
                    let fault_ms = epoch_ms();
                    proc.0.kill().context("cannot SIGKILL the leader")?;
                    let t0 = Instant::now();
                    // Reaped at once: its pid no longer names a process of this host.
                    let _ = proc.0.wait();
                    (t0, fault_ms)
                }
                Fault::Stop => {
                    let fault_ms = epoch_ms();
                    signal("STOP", members[leader].pid()?)?;
                    (Instant::now(), fault_ms)
                }
            };
            let running_ms = members[standby]
                .wait_for("the job to run on the new leader", |m| {
                    Ok(running(m.job_state(&jid))?.then(|| t0.elapsed().as_millis() as u64))
                })?;
            let (checkpoint_ms, first) =
                members[standby].wait_for("the new leader's first checkpoint", |m| {
                    let done = m
                        .latest_checkpoint(&jid)
                        .filter(|c| c.id > latest && c.triggered_ms > fault_ms);
                    Ok(done.map(|c| (t0.elapsed().as_millis() as u64, c)))
                })?;
            latest = first.id;
            println!(
                "  {} round {round}: RUNNING after {running_ms} ms, first checkpoint after {checkpoint_ms} ms (triggered {} ms after the signal, took {} ms)",
                fault.name(),
                first.triggered_ms.saturating_sub(fault_ms),
                first.duration_ms
            );
            figures.push(Round {
                running_ms,
                checkpoint_ms,
            });
            if fault == Fault::Stop {
                // Resumed, the deposed leader finds its lease taken and exits 1.
                signal("CONT", members[leader].pid()?)?;
                let name = members[leader].name;
                let status = members[leader].wait_for(
                    &format!("the deposed coordinator {name} to exit after SIGCONT"),
                    |m| Ok(m.proc.as_mut().and_then(|p| p.0.try_wait().ok().flatten())),
                )?;
                if status.code() != Some(1) {
                    return Err(members[leader].failure(&format!(
                        "the deposed coordinator {name} exited ({status}), not with code 1"
                    )));
                }
                members[leader].proc = None;
            }
            members[leader].start(exe, &ck)?;
            members[leader].wait_until_standing_by()?;
            leader = standby;
        }
        results.push((fault, figures));
    }
    println!(
        "{:<8}  {:>6}  {:>16}  {:>13}  {:>23}  {:>20}",
        "fault",
        "rounds",
        "->RUNNING median",
        "->RUNNING max",
        "->1st checkpoint median",
        "->1st checkpoint max"
    );
    let summaries: Vec<Summary> = results
        .iter()
        .map(|(fault, figures)| {
            (
                *fault,
                figures.len(),
                median_max(figures.iter().map(|r| r.running_ms)),
                median_max(figures.iter().map(|r| r.checkpoint_ms)),
            )
        })
        .collect();
    for (fault, rounds, running, checkpoint) in &summaries {
        println!(
            "{:<8}  {:>6}  {:>16}  {:>13}  {:>23}  {:>20}",
            fault.name(),
            rounds,
            running.0,
            running.1,
            checkpoint.0,
            checkpoint.1
        );
    }
    let kill_max = summaries
        .iter()
        .find(|s| s.0 == Fault::Kill)
        .map_or(0, |s| s.2 .1);
    let verdict = if kill_max <= GOAL_MS {
        "within the goal"
    } else if kill_max <= TARGET_MS {
        "within the target, over the goal"
    } else {
        "over the target"
    };
    println!(
        "target: jobs RUNNING again <= {} s after the leader is SIGKILLed (goal <= {} s); here at most {kill_max} ms: {verdict}",
        TARGET_MS / 1000,
        GOAL_MS / 1000
    );
    let steady = median_max(steady_ms.into_iter());
    println!(
        "the leader's checkpoints before the faults took {} ms median, {} ms max (trigger to completion, every {CHECKPOINT_INTERVAL})",
        steady.0, steady.1
    );
    println!(
        "SIGSTOP: the standby takes over only once the lease lapsed ({LEASE_LAPSE_MS} ms without a renewal: the lease + 10 % + 50 ms)"
    );
    for (fault, rounds, running, checkpoint) in &summaries {
        println!(
            "failover fault={} rounds={} running_ms_median={} running_ms_max={} checkpoint_ms_median={} checkpoint_ms_max={}",
            fault.name(),
            rounds,
            running.0,
            running.1,
            checkpoint.0,
            checkpoint.1
        );
    }
    drop(cluster);
    Ok(())
}
