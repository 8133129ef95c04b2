//! Flink's own command-line client against cairn: `org.apache.flink.client.cli.CliFrontend`
//! from the flink-dist jar of the PyPI package `apache-flink-libraries` 2.3.0, run with Java,
//! lists and cancels a running job of a cairn coordinator and of `cairn run --rest`, takes,
//! disposes and stops with savepoints of both, and reports a savepoint that fails; and
//! Flink's REST response classes read every answer cairn gives to the endpoints they model
//! (`tests/java/RestSchema.java`).
//!
//! `CAIRN_FLINK_LIB` names pyflink's `lib` directory; `scripts/test` installs the package and
//! sets it. Without it these tests fail (they never skip). Every Java start costs a second or
//! two, so each test makes few calls. Nothing sleeps for synchronisation: waits poll with a
//! short backoff until a deadline.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::{Cluster, Watched};
use serde_json::Value;

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN: &str = "t0ken-for-flinks-client";

/// How to get Flink's client, for the failure message.
const INSTALL: &str = "run the tests with scripts/test (it installs apache-flink-libraries==2.3.0 and sets CAIRN_FLINK_LIB), or `pip install --target DIR apache-flink-libraries==2.3.0` and set CAIRN_FLINK_LIB=DIR/pyflink/lib";

/// pyflink's `lib` directory, with Flink's flink-dist jar in it.
fn flink_lib() -> PathBuf {
    let Some(dir) = std::env::var_os("CAIRN_FLINK_LIB") else {
        panic!("CAIRN_FLINK_LIB is not set; {INSTALL}");
    };
    let dir = PathBuf::from(dir);
    let has_dist = std::fs::read_dir(&dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with("flink-dist") && name.ends_with(".jar")
        })
    });
    assert!(
        has_dist,
        "CAIRN_FLINK_LIB={} holds no flink-dist jar; {INSTALL}",
        dir.display()
    );
    dir
}

/// Runs Java with pyflink's jars on the class path and a Flink configuration directory.
struct Flink {
    lib: PathBuf,
    conf: tempfile::TempDir,
    /// A bearer token Flink's client sends (through `FLINK_REST_CLIENT_HEADERS`).
    token: Option<&'static str>,
}

impl Flink {
    fn new(token: Option<&'static str>) -> Flink {
        let lib = flink_lib();
        let conf = tempfile::tempdir().expect("temp dir");
        // No retries: a refused request fails at once instead of after a minute of retrying.
        std::fs::write(
            conf.path().join("config.yaml"),
            "rest:\n  retry:\n    max-attempts: 0\nclient:\n  timeout: 30 s\n",
        )
        .expect("write config.yaml");
        Flink { lib, conf, token }
    }

    fn java(&self, args: &[&str]) -> Output {
        let classpath = format!("{}/*", self.lib.display());
        let mut java = Command::new("java");
        java.arg("-cp")
            .arg(classpath)
            .args(args)
            .env("FLINK_CONF_DIR", self.conf.path())
            .stdin(Stdio::null());
        if let Some(t) = self.token {
            java.env(
                "FLINK_REST_CLIENT_HEADERS",
                format!("Authorization:Bearer {t}"),
            );
        }
        java.output()
            .unwrap_or_else(|e| panic!("cannot start java (Java 17 is needed): {e}"))
    }

    /// `flink ACTION -m ADDR ARGS..` through Flink's CliFrontend.
    fn run_cli(&self, action: &str, addr: SocketAddr, args: &[&str]) -> Output {
        let addr = addr.to_string();
        let mut all = vec![
            "org.apache.flink.client.cli.CliFrontend",
            action,
            "-m",
            addr.as_str(),
        ];
        all.extend(args);
        self.java(&all)
    }

    /// `flink ACTION -m ADDR ARGS..`; asserts success, returns stdout.
    fn cli(&self, action: &str, addr: SocketAddr, args: &[&str]) -> String {
        let out = self.run_cli(action, addr, args);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "flink {action} failed ({}):\nstdout:\n{stdout}\nstderr:\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }

    /// `flink ACTION -m ADDR ARGS..`; asserts that it fails, returns stdout and stderr.
    fn cli_fails(&self, action: &str, addr: SocketAddr, args: &[&str]) -> String {
        let out = self.run_cli(action, addr, args);
        let all = format!(
            "stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            !out.status.success(),
            "flink {action} succeeded where it should fail:\n{all}"
        );
        all
    }

    /// Reads cairn's answers with Flink's REST response classes; returns what they read.
    fn read_schema(&self, addr: SocketAddr, jid: &str) -> String {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/java/RestSchema.java");
        let base = format!("http://{addr}");
        let out = self.java(&[&source.display().to_string(), &base, jid]);
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "Flink's classes cannot read cairn's REST answers ({}):\n{}\n{stdout}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    }
}

/// `GET path` over HTTP/1.1, with the bearer token if given: (status, JSON body), or None if
/// the server cannot be reached.
fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> Option<(u16, Value)> {
    let mut s = TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .ok()?;
    let mut raw = String::new();
    s.read_to_string(&mut raw).ok()?;
    let (head, body) = raw.split_once("\r\n\r\n")?;
    let status = head.split(' ').nth(1)?.parse().ok()?;
    Some((status, serde_json::from_str(body).ok()?))
}

/// Polls `GET /v1/jobs/overview` until a job is in `state`; returns its id.
fn wait_for_job(
    addr: SocketAddr,
    token: Option<&str>,
    state: &str,
    mut alive: impl FnMut(),
) -> String {
    let deadline = Instant::now() + DEADLINE;
    let mut pause = Duration::from_millis(5);
    loop {
        alive();
        let answer = get(addr, "/v1/jobs/overview", token);
        if let Some((200, body)) = &answer {
            let found = body["jobs"].as_array().and_then(|jobs| {
                jobs.iter()
                    .find(|j| j["state"] == state)
                    .and_then(|j| j["jid"].as_str())
                    .map(str::to_string)
            });
            if let Some(jid) = found {
                return jid;
            }
        }
        assert!(
            Instant::now() < deadline,
            "no {state} job within {DEADLINE:?}; last answer: {answer:?}"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Polls `GET /v1/jobs/JID` until the job is in `state`.
fn wait_for_state(addr: SocketAddr, jid: &str, state: &str) {
    let deadline = Instant::now() + DEADLINE;
    let mut pause = Duration::from_millis(5);
    loop {
        let answer = get(addr, &format!("/v1/jobs/{jid}"), None);
        if matches!(&answer, Some((200, b)) if b["state"] == state) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "job {jid} not {state} within {DEADLINE:?}; last answer: {answer:?}"
        );
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
}

/// Asserts that Flink's `list` shows job `jid` named wordcount as running, in its format
/// (`START : JID : NAME (STATE)` under "Running/Restarting Jobs").
fn assert_listed_running(list: &str, jid: &str) {
    assert!(
        list.contains("Running/Restarting Jobs"),
        "flink list:\n{list}"
    );
    let line = list
        .lines()
        .find(|l| l.contains(jid))
        .unwrap_or_else(|| panic!("job {jid} not in flink list:\n{list}"));
    assert!(
        line.ends_with(&format!(" : {jid} : wordcount (RUNNING)")),
        "flink list line {line:?}"
    );
}

/// Flink's `cancel` says so on its last line.
fn assert_cancelled_by_flink(out: &str, jid: &str) {
    assert!(
        out.lines().any(|l| l == format!("Cancelled job {jid}.")),
        "flink cancel:\n{out}"
    );
}

/// The arguments of a wordcount that runs far longer than the test.
const LONG_WORDCOUNT: [&str; 8] = [
    "wordcount",
    "--generate",
    "1000000000",
    "--keys",
    "1000",
    "--discard",
    "--checkpoint-interval",
    "100ms",
];

#[test]
fn flink_cli_lists_and_cancels_a_job_of_cairn_run_rest_with_a_token() {
    let flink = Flink::new(Some(TOKEN));
    let mut run = Watched::spawn(common::cairn().arg("run").args(LONG_WORDCOUNT).args([
        "--rest",
        "127.0.0.1:0",
        "--rest-token",
        TOKEN,
    ]));
    let addr = run.rest_addr(Instant::now() + DEADLINE);
    let jid = wait_for_job(addr, Some(TOKEN), "RUNNING", || run.assert_running());
    assert_eq!(jid.len(), 32, "Flink's job ids are 32 hex digits: {jid:?}");

    assert_listed_running(&flink.cli("list", addr, &[]), &jid);
    assert_cancelled_by_flink(&flink.cli("cancel", addr, &[&jid]), &jid);

    let (status, stderr) = run.wait(Instant::now() + DEADLINE);
    assert!(!status.success(), "a cancelled job must fail the run");
    let last = stderr.lines().rev().find(|l| !l.trim().is_empty());
    assert_eq!(last, Some("error: job cancelled"), "stderr:\n{stderr}");
}

/// Submits [`LONG_WORDCOUNT`] at parallelism 2 to `cluster`; returns its id once it runs.
fn submit_long_wordcount(cluster: &mut Cluster) -> String {
    let rest = cluster.rest;
    let submitted = common::run_ok(
        common::cairn()
            .args(["submit", "--rest", &rest.to_string()])
            .args(LONG_WORDCOUNT)
            .args(["-p", "2"]),
    );
    let submitted = String::from_utf8_lossy(&submitted.stdout).into_owned();
    let jid = wait_for_job(rest, None, "RUNNING", || cluster.assert_running());
    assert_eq!(
        submitted.trim(),
        jid,
        "the submitted job is the running one"
    );
    jid
}

#[test]
fn flink_cli_lists_and_cancels_a_job_of_a_coordinator() {
    let flink = Flink::new(None);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = Cluster::start(
        &dir.path().join("checkpoints"),
        1,
        Instant::now() + DEADLINE,
    );
    let rest = cluster.rest;
    let jid = submit_long_wordcount(&mut cluster);

    // Every answer Flink's REST client has a class for, read by that class.
    let read = flink.read_schema(rest, &jid);
    for expected in [
        format!("jobs {jid} RUNNING"),
        format!("overview {jid} wordcount RUNNING tasks="),
        format!("details {jid} wordcount RUNNING vertices="),
        "checkpoints completed=".to_string(),
        "config flink-version=2.3.0".to_string(),
        "cluster taskmanagers=1 slots=2 running=1".to_string(),
    ] {
        assert!(
            read.lines().any(|l| l.starts_with(&expected)),
            "no line {expected:?} in what Flink's classes read:\n{read}"
        );
    }

    assert_listed_running(&flink.cli("list", rest, &[]), &jid);
    assert_cancelled_by_flink(&flink.cli("cancel", rest, &[&jid]), &jid);
    wait_for_state(rest, &jid, "CANCELED");
}

/// The path Flink's client printed as `Savepoint completed. Path: PATH`.
fn savepoint_path(out: &str) -> PathBuf {
    let path = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("Savepoint completed. Path: "))
        .unwrap_or_else(|| panic!("no savepoint path in Flink's output:\n{out}"));
    PathBuf::from(path.strip_prefix("file:").unwrap_or(path))
}

/// Flink's `savepoint`, `savepoint -d` and `stop` drive savepoints of `cairn run --rest`.
#[test]
fn flink_cli_takes_disposes_and_stops_with_savepoints() {
    let flink = Flink::new(None);
    let dir = tempfile::tempdir().expect("temp dir");
    let ck = dir.path().join("checkpoints");
    let mut run = Watched::spawn(common::cairn().arg("run").args(LONG_WORDCOUNT).args([
        "--rest",
        "127.0.0.1:0",
        "--checkpoint-dir",
        &ck.display().to_string(),
    ]));
    let addr = run.rest_addr(Instant::now() + DEADLINE);
    let jid = wait_for_job(addr, None, "RUNNING", || run.assert_running());

    let target = dir.path().join("savepoints");
    let taken =
        savepoint_path(&flink.cli("savepoint", addr, &[&jid, &target.display().to_string()]));
    assert!(taken.join("_metadata").is_file(), "{}", taken.display());
    run.assert_running();
    let disposed = flink.cli("savepoint", addr, &["-d", &taken.display().to_string()]);
    assert!(disposed.contains("disposed"), "{disposed}");
    assert!(!taken.exists(), "the savepoint was deleted");

    let last = dir.path().join("final");
    let stopped =
        savepoint_path(&flink.cli("stop", addr, &["-p", &last.display().to_string(), &jid]));
    assert!(stopped.starts_with(&last), "{}", stopped.display());
    assert!(stopped.join("_metadata").is_file());
    let (status, stderr) = run.wait(Instant::now() + DEADLINE);
    assert!(status.success(), "a stopped job ends FINISHED: {stderr}");
}

/// Flink's `savepoint`, `savepoint -d` and `stop --drain` drive savepoints of a coordinator's
/// job, whose job master runs in the coordinator and whose subtasks run on a worker.
#[test]
fn flink_cli_takes_disposes_and_stops_with_savepoints_of_a_coordinator() {
    let flink = Flink::new(None);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = Cluster::start(
        &dir.path().join("checkpoints"),
        1,
        Instant::now() + DEADLINE,
    );
    let rest = cluster.rest;
    let jid = submit_long_wordcount(&mut cluster);

    let target = dir.path().join("savepoints");
    let taken =
        savepoint_path(&flink.cli("savepoint", rest, &[&jid, &target.display().to_string()]));
    assert!(taken.starts_with(&target), "{}", taken.display());
    assert!(taken.join("_metadata").is_file(), "{}", taken.display());
    wait_for_state(rest, &jid, "RUNNING");
    let disposed = flink.cli("savepoint", rest, &["-d", &taken.display().to_string()]);
    assert!(disposed.contains("disposed"), "{disposed}");
    assert!(!taken.exists(), "the savepoint was deleted");

    let last = dir.path().join("final");
    // With drain (`-d`): the sources on the worker send the maximum watermark first.
    let stopped = savepoint_path(&flink.cli(
        "stop",
        rest,
        &[
            "--drain",
            "--savepointPath",
            &last.display().to_string(),
            &jid,
        ],
    ));
    assert!(stopped.starts_with(&last), "{}", stopped.display());
    wait_for_state(rest, &jid, "FINISHED");
    let info = common::run_ok(common::cairn().args(["savepoint", "info"]).arg(&stopped));
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.starts_with("savepoint "), "{info}");
    cluster.assert_running();
}

/// A savepoint that fails (its directory cannot be created: the path runs through a regular
/// file) is a failure for Flink's `savepoint` and `stop`: non-zero exit, the cause in the
/// output; the job goes on running.
#[test]
fn flink_cli_reports_a_failed_savepoint_of_a_coordinator() {
    let flink = Flink::new(None);
    let dir = tempfile::tempdir().expect("temp dir");
    let mut cluster = Cluster::start(
        &dir.path().join("checkpoints"),
        1,
        Instant::now() + DEADLINE,
    );
    let rest = cluster.rest;
    let jid = submit_long_wordcount(&mut cluster);
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").expect("write a file");
    let target = file.join("savepoints").display().to_string();
    let cause = format!("cannot create savepoint directory {target}");

    let failed = flink.cli_fails("savepoint", rest, &[&jid, &target]);
    assert!(failed.contains(&cause), "no {cause:?} in:\n{failed}");
    assert!(!failed.contains("Savepoint completed"), "{failed}");
    wait_for_state(rest, &jid, "RUNNING");

    let failed = flink.cli_fails("stop", rest, &["--savepointPath", &target, &jid]);
    assert!(failed.contains(&cause), "no {cause:?} in:\n{failed}");
    wait_for_state(rest, &jid, "RUNNING");
    cluster.assert_running();
}
