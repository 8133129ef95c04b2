//! `GET /metrics` scraped over HTTP and parsed: from `cairn run --rest` (a back-pressured
//! job's subtasks and the job itself), and from a cluster worker's `--metrics ADDR`. Checks
//! the names and labels, that counters move while the job runs, and that the back-pressured
//! vertex shows as back-pressured.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const DEADLINE: Duration = Duration::from_secs(30);

/// One sample of the exposition: metric name, labels, value.
#[derive(Debug, Clone)]
struct Sample {
    name: String,
    labels: BTreeMap<String, String>,
    value: f64,
}

/// Parses OpenMetrics text (what Prometheus reads): `# ...` lines are metadata; every other
/// line is `name{label="value",...} value` or `name value`.
fn parse(text: &str) -> Vec<Sample> {
    assert!(text.ends_with("# EOF\n"), "no # EOF at the end: {text}");
    let mut out = Vec::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (series, value) = line
            .rsplit_once(' ')
            .unwrap_or_else(|| panic!("no value in {line:?}"));
        let value: f64 = value
            .parse()
            .unwrap_or_else(|e| panic!("bad value in {line:?}: {e}"));
        let (name, labels) = match series.split_once('{') {
            None => (series.to_string(), BTreeMap::new()),
            Some((name, rest)) => {
                let body = rest
                    .strip_suffix('}')
                    .unwrap_or_else(|| panic!("unclosed labels in {line:?}"));
                (name.to_string(), parse_labels(body, line))
            }
        };
        assert!(
            name.chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':'),
            "bad metric name in {line:?}"
        );
        out.push(Sample {
            name,
            labels,
            value,
        });
    }
    out
}

/// `k="v",k2="v2"` (values may hold escaped quotes and commas).
fn parse_labels(body: &str, line: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (key, after) = rest
            .split_once("=\"")
            .unwrap_or_else(|| panic!("bad label in {line:?}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => {
                    if let Some((_, c)) = chars.next() {
                        value.push(match c {
                            'n' => '\n',
                            other => other,
                        });
                    }
                }
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated label value in {line:?}"),
            }
        };
        labels.insert(key.to_string(), value);
        rest = after[end + 1..].trim_start_matches(',');
    }
    labels
}

/// `GET http://addr/metrics`: its content type and samples.
fn scrape(addr: SocketAddr) -> (String, Vec<Sample>) {
    let mut resp = ureq::get(&format!("http://{addr}/metrics"))
        .call()
        .unwrap_or_else(|e| panic!("GET /metrics on {addr}: {e}"));
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let text = resp.body_mut().read_to_string().expect("a text body");
    (content_type, parse(&text))
}

fn find<'a>(samples: &'a [Sample], name: &str) -> Vec<&'a Sample> {
    samples.iter().filter(|s| s.name == name).collect()
}

/// The value of `name` for the subtask `subtask` of the vertex whose name starts with
/// `vertex`.
fn of(samples: &[Sample], name: &str, vertex: &str, subtask: u32) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == name
                && s.labels
                    .get("vertex")
                    .is_some_and(|v| v.starts_with(vertex))
                && s.labels.get("subtask") == Some(&subtask.to_string())
        })
        .map(|s| s.value)
}

/// Scrapes until `done` returns a value, while `process` runs.
fn scrape_until<T>(
    process: &mut Watched,
    addr: SocketAddr,
    what: &str,
    mut done: impl FnMut(&[Sample]) -> Option<T>,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        process.assert_running();
        let (_, samples) = scrape(addr);
        if let Some(v) = done(&samples) {
            return v;
        }
        assert!(Instant::now() < deadline, "no {what} within {DEADLINE:?}");
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

#[test]
fn an_embedded_jobs_metrics_are_named_labelled_moving_and_show_its_backpressure() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cairn = Watched::spawn(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["run", "backpressure", "-p", "2", "--discard"])
            .args(["--generate", "500000000", "--keys", "1000"])
            .args(["--sink-rate", "100000", "--checkpoint-interval", "200ms"])
            .arg("--checkpoint-dir")
            .arg(tmp.path().join("ck"))
            .args(["--rest", "127.0.0.1:0"]),
    );
    let addr = cairn.rest_addr(Instant::now() + DEADLINE);

    let first = scrape_until(&mut cairn, addr, "a completed checkpoint", |s| {
        let done = find(s, "cairn_job_checkpoints_completed_total")
            .first()
            .is_some_and(|c| c.value >= 1.0);
        done.then(|| s.to_vec())
    });
    let (content_type, _) = scrape(addr);
    assert!(
        content_type.starts_with("application/openmetrics-text"),
        "{content_type}"
    );

    // Every subtask series carries the job, vertex and subtask; both subtasks of each vertex.
    let records_in = find(&first, "cairn_subtask_records_in_total");
    assert!(!records_in.is_empty(), "no cairn_subtask_records_in_total");
    let jid = records_in[0].labels["job_id"].clone();
    assert_eq!(jid.len(), 32, "{jid}");
    for s in first
        .iter()
        .filter(|s| s.name.starts_with("cairn_subtask_"))
    {
        for label in ["job_id", "job_name", "vertex_id", "vertex", "subtask"] {
            assert!(s.labels.contains_key(label), "{} has no {label}", s.name);
        }
        assert_eq!(s.labels["job_name"], "backpressure", "{s:?}");
    }
    let mut subtasks: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &records_in {
        subtasks
            .entry(s.labels["vertex"].clone())
            .or_default()
            .push(s.labels["subtask"].clone());
    }
    assert!(subtasks.len() >= 3, "vertices: {subtasks:?}");
    for (v, mut ids) in subtasks {
        ids.sort();
        assert_eq!(ids, ["0", "1"], "subtasks of {v}");
    }
    for name in [
        "cairn_subtask_records_out_total",
        "cairn_source_records_read_total",
        "cairn_subtask_idle_seconds_total",
        "cairn_subtask_backpressured_seconds_total",
        "cairn_subtask_busy_seconds_total",
        "cairn_subtask_backpressured_ms_per_second",
        "cairn_subtask_input_queue_fill",
        "cairn_subtask_output_queue_fill",
        "cairn_subtask_records_in_per_second",
        "cairn_job_restarts_total",
        "cairn_job_uptime_seconds",
        "cairn_job_last_checkpoint_duration_seconds",
        "cairn_checkpoint_subtask_alignment_seconds",
        "cairn_checkpoint_subtask_state_bytes",
        "cairn_checkpoint_subtask_start_delay_seconds",
    ] {
        assert!(!find(&first, name).is_empty(), "no {name}");
    }
    let info = find(&first, "cairn_job_info");
    assert_eq!(info.len(), 1);
    assert_eq!(info[0].labels["state"], "RUNNING");
    assert_eq!(info[0].labels["job_id"], jid);
    // The keyed operator holds state: its checkpointed bytes are there per subtask.
    assert!(
        find(&first, "cairn_checkpoint_subtask_state_bytes")
            .iter()
            .any(|s| s.value > 0.0),
        "no subtask checkpointed any state"
    );

    // Counters move: the throttled sink's input and the source's reads grow between scrapes.
    let sink_before = of(&first, "cairn_subtask_records_in_total", "count", 0).expect("sink");
    let read_before =
        of(&first, "cairn_source_records_read_total", "fast-source", 0).expect("source");
    let checkpoints_before = find(&first, "cairn_job_checkpoints_completed_total")[0].value;
    scrape_until(&mut cairn, addr, "moving counters", |s| {
        let sink = of(s, "cairn_subtask_records_in_total", "count", 0)?;
        let read = of(s, "cairn_source_records_read_total", "fast-source", 0)?;
        let cps = find(s, "cairn_job_checkpoints_completed_total")
            .first()?
            .value;
        (sink > sink_before && read > read_before && cps > checkpoints_before).then_some(())
    });

    // The fast source feeds a sink throttled to 100k records/s: it waits for credit most of
    // the time, and the throttled vertex does not.
    let (bp, sink_bp) = scrape_until(&mut cairn, addr, "a back-pressured fast source", |s| {
        let bp = (0..2)
            .filter_map(|i| {
                of(
                    s,
                    "cairn_subtask_backpressured_ms_per_second",
                    "fast-source",
                    i,
                )
            })
            .fold(0f64, f64::max);
        let sink_bp = (0..2)
            .filter_map(|i| of(s, "cairn_subtask_backpressured_ms_per_second", "count", i))
            .fold(0f64, f64::max);
        (bp > 500.0).then_some((bp, sink_bp))
    });
    assert!(
        sink_bp < 100.0,
        "the throttled vertex itself shows back-pressure {sink_bp} (source: {bp})"
    );
    let (_, later) = scrape(addr);
    let fill = (0..2)
        .filter_map(|i| of(&later, "cairn_subtask_output_queue_fill", "fast-source", i))
        .fold(0f64, f64::max);
    assert!(
        fill > 0.5,
        "a back-pressured source's output queue is {fill} full"
    );

    // The same over REST, in Flink's shapes.
    let details = get_json(addr, &format!("/jobs/{jid}"));
    let vertices = details["vertices"].as_array().expect("vertices").clone();
    let vid_of = |prefix: &str| {
        vertices
            .iter()
            .find(|v| v["name"].as_str().is_some_and(|n| n.starts_with(prefix)))
            .and_then(|v| v["id"].as_str())
            .unwrap_or_else(|| panic!("no vertex {prefix}: {vertices:?}"))
            .to_string()
    };
    let (fast, count) = (vid_of("fast-source"), vid_of("count"));
    let bp = poll_json(
        &mut cairn,
        addr,
        &format!("/jobs/{jid}/vertices/{fast}/backpressure"),
        |b| (b["backpressureLevel"] == "high").then(|| b.clone()),
    );
    assert_eq!(bp["status"], "ok");
    let subtasks = bp["subtasks"].as_array().expect("subtasks");
    assert_eq!(subtasks.len(), 2, "{bp}");
    for st in subtasks {
        let ratio = st["ratio"].as_f64().expect("ratio");
        let sum = ratio + st["idleRatio"].as_f64().unwrap() + st["busyRatio"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&ratio), "{st}");
        assert!(sum <= 1.05, "ratios add up to {sum}: {st}");
    }
    let sink_bp = get_json(addr, &format!("/jobs/{jid}/vertices/{count}/backpressure"));
    assert_eq!(sink_bp["backpressureLevel"], "ok", "{sink_bp}");
    let v = get_json(addr, &format!("/jobs/{jid}/vertices/{count}"));
    assert_eq!(v["parallelism"], 2);
    let read: u64 = v["subtasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["metrics"]["read-records"].as_u64().unwrap())
        .sum();
    assert!(read > 0, "{v}");
    assert_eq!(v["aggregated"]["read-records-complete"], true, "{v}");
    let job = get_json(addr, &format!("/jobs/{jid}"));
    let count_vertex = job["vertices"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["id"] == count)
        .unwrap()
        .clone();
    assert!(
        count_vertex["metrics"]["read-records"].as_u64().unwrap() > 0,
        "{count_vertex}"
    );
    // The plan: the keyed operator reads both sources' chains by hash.
    let plan = get_json(addr, &format!("/jobs/{jid}/plan"));
    let node = plan["plan"]["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["id"] == count)
        .unwrap()
        .clone();
    let inputs = node["inputs"].as_array().expect("inputs");
    assert_eq!(inputs.len(), 2, "{node}");
    assert!(
        inputs.iter().all(|i| i["ship_strategy"] == "HASH"),
        "{node}"
    );
    assert!(inputs.iter().any(|i| i["id"] == fast), "{node}");
    let unknown = ureq::get(&format!("http://{addr}/jobs/{jid}/vertices/nope"))
        .call()
        .expect_err("404");
    assert!(unknown.to_string().contains("404"), "{unknown}");
    cairn.terminate();
}

fn get_json(addr: SocketAddr, path: &str) -> serde_json::Value {
    let mut resp = ureq::get(&format!("http://{addr}{path}"))
        .call()
        .unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let text = resp.body_mut().read_to_string().expect("a body");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {text}"))
}

fn poll_json<T>(
    process: &mut Watched,
    addr: SocketAddr,
    path: &str,
    mut done: impl FnMut(&serde_json::Value) -> Option<T>,
) -> T {
    let deadline = Instant::now() + DEADLINE;
    loop {
        process.assert_running();
        let body = get_json(addr, path);
        if let Some(v) = done(&body) {
            return v;
        }
        assert!(Instant::now() < deadline, "GET {path}: last answer {body}");
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

#[test]
fn failures_show_in_the_exception_history_and_the_restart_counts_by_cause() {
    let tmp = tempfile::tempdir().unwrap();
    let mut cairn = Watched::spawn(
        Command::new(env!("CARGO_BIN_EXE_cairn"))
            .args(["run", "wordcount", "-p", "2", "--discard"])
            .args(["--generate", "400000000", "--keys", "1000"])
            .args(["--checkpoint-interval", "100ms", "--inject-failures", "2"])
            .arg("--checkpoint-dir")
            .arg(tmp.path().join("ck"))
            .args(["--rest", "127.0.0.1:0"]),
    );
    let addr = cairn.rest_addr(Instant::now() + DEADLINE);
    let samples = scrape_until(&mut cairn, addr, "two restarts", |s| {
        let n = find(s, "cairn_job_restarts_total").first()?.value;
        (n >= 2.0).then(|| s.to_vec())
    });
    let by_cause = find(&samples, "cairn_job_restarts_by_cause_total");
    let jid = by_cause[0].labels["job_id"].clone();
    let ex = get_json(addr, &format!("/jobs/{jid}/exceptions"));
    assert_eq!(by_cause.len(), 1, "{by_cause:?}\n{ex}");
    assert_eq!(by_cause[0].labels["cause"], "injected");
    assert_eq!(by_cause[0].value, 2.0);
    let entries = ex["exceptionHistory"]["entries"]
        .as_array()
        .expect("entries");
    assert_eq!(entries.len(), 2, "{ex}");
    for e in entries {
        assert_eq!(e["exceptionName"], "injected", "{e}");
        assert_eq!(e["restarted"], true, "{e}");
        assert!(
            e["stacktrace"]
                .as_str()
                .is_some_and(|s| s.contains("injected failure")),
            "{e}"
        );
    }
    assert!(entries[0]["timestamp"].as_u64() >= entries[1]["timestamp"].as_u64());
    assert_eq!(ex["root-exception"], entries[0]["stacktrace"]);
    cairn.terminate();
}

#[test]
fn a_worker_serves_its_subtasks_metrics_and_the_coordinator_its_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + DEADLINE;
    let mut coordinator = Watched::spawn(
        cairn()
            .args([
                "coordinator",
                "--bind",
                "127.0.0.1:0",
                "--rest",
                "127.0.0.1:0",
            ])
            .arg("--checkpoint-dir")
            .arg(tmp.path().join("ck")),
    );
    let line = coordinator.wait_for_line("coordinator listening for workers on ", deadline);
    let (bind, rest) = line.split_once(", REST API on http://").expect("addresses");
    let rest: SocketAddr = rest.trim().parse().unwrap();
    let mut workers: Vec<(Watched, SocketAddr)> = (0..2)
        .map(|_| {
            let mut w = Watched::spawn(cairn().args([
                "worker",
                "--coordinator",
                bind.trim(),
                "--slots",
                "2",
                "--metrics",
                "127.0.0.1:0",
            ]));
            let addr = w.wait_for_line("worker metrics at http://", deadline);
            let addr = addr
                .trim()
                .strip_suffix("/metrics")
                .expect("a /metrics URL");
            (w, addr.parse().unwrap())
        })
        .collect();
    let jid = submit(
        rest,
        None,
        &[
            "wordcount",
            "-p",
            "4",
            "--generate",
            "1000000000",
            "--keys",
            "1000",
            "--discard",
        ],
    );
    // Both workers run subtasks of the job, exchanging records over the network: bytes move.
    for (w, addr) in &mut workers {
        let addr = *addr;
        scrape_until(w, addr, "network bytes on a worker", |s| {
            let of_job: Vec<&Sample> = s
                .iter()
                .filter(|x| x.labels.get("job_id") == Some(&jid))
                .collect();
            let bytes_in: f64 = of_job
                .iter()
                .filter(|x| x.name == "cairn_subtask_bytes_in_total")
                .map(|x| x.value)
                .sum();
            let bytes_out: f64 = of_job
                .iter()
                .filter(|x| x.name == "cairn_subtask_bytes_out_total")
                .map(|x| x.value)
                .sum();
            (bytes_in > 0.0 && bytes_out > 0.0).then_some(())
        });
        // A worker holds no job status.
        let (_, s) = scrape(addr);
        assert!(find(&s, "cairn_job_info").is_empty());
    }
    // The coordinator: the job's status, no subtasks.
    let s = scrape_until(&mut coordinator, rest, "the job at the coordinator", |s| {
        find(s, "cairn_job_info")
            .iter()
            .any(|x| x.labels["job_id"] == jid && x.labels["state"] == "RUNNING")
            .then(|| s.to_vec())
    });
    assert!(find(&s, "cairn_subtask_records_in_total").is_empty());
    // Its REST API has the subtasks' metrics from the workers' reports.
    let job = poll_json(&mut coordinator, rest, &format!("/jobs/{jid}"), |b| {
        let vertices = b["vertices"].as_array()?;
        let complete = vertices.len() >= 2
            && vertices.iter().all(|v| {
                v["metrics"]["read-records-complete"] == true
                    && (v["metrics"]["read-records"].as_u64() > Some(0)
                        || v["metrics"]["write-records"].as_u64() > Some(0))
            });
        complete.then(|| b.clone())
    });
    let vid = job["vertices"][1]["id"].as_str().unwrap().to_string();
    let bp = get_json(rest, &format!("/jobs/{jid}/vertices/{vid}/backpressure"));
    assert_eq!(bp["subtasks"].as_array().map(Vec::len), Some(4), "{bp}");
    // Each subtask names the worker it runs on (Flink: its task manager and endpoint); the four
    // are spread over both workers.
    let details = get_json(rest, &format!("/jobs/{jid}/vertices/{vid}"));
    let subtasks = details["subtasks"].as_array().expect("subtasks");
    let mut hosts = std::collections::BTreeSet::new();
    for s in subtasks {
        let tm = s["taskmanager-id"].as_str().unwrap_or_default();
        let endpoint = s["endpoint"].as_str().unwrap_or_default();
        assert!(tm.starts_with("worker-"), "{details}");
        assert!(endpoint.parse::<SocketAddr>().is_ok(), "{details}");
        hosts.insert((tm.to_string(), endpoint.to_string()));
    }
    assert_eq!(hosts.len(), 2, "{details}");
    coordinator.terminate();
    for (w, _) in &workers {
        w.terminate();
    }
}

/// A job that ended leaves no series on the worker that ran it (a finished source's watermark
/// at i64::MAX, 9.22e18, would otherwise stay scraped).
#[test]
fn a_worker_forgets_the_series_of_a_finished_job() {
    let tmp = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + DEADLINE;
    let mut c = Cluster::start(&tmp.path().join("ck"), 0, deadline);
    let mut worker = Watched::spawn(c.worker(2).args(["--metrics", "127.0.0.1:0"]));
    let addr = worker.wait_for_line("worker metrics at http://", deadline);
    let addr: SocketAddr = addr
        .trim()
        .strip_suffix("/metrics")
        .expect("a /metrics URL")
        .parse()
        .unwrap();
    let jid = submit(
        c.rest,
        None,
        &[
            "wordcount",
            "-p",
            "2",
            "--generate",
            "300000",
            "--rate",
            "100000",
            "--keys",
            "100",
            "--discard",
        ],
    );
    let of_job = |s: &[Sample]| s.iter().any(|x| x.labels.get("job_id") == Some(&jid));
    scrape_until(&mut worker, addr, "the job's series", |s| {
        of_job(s).then_some(())
    });
    poll_json(&mut c.coordinator, c.rest, &format!("/jobs/{jid}"), |b| {
        (b["state"] == "FINISHED").then_some(())
    });
    scrape_until(&mut worker, addr, "the finished job's series gone", |s| {
        (!of_job(s)).then_some(())
    });
}
