//! The REST API over real HTTP on 127.0.0.1, against job statuses filled by hand.
//!
//! The client is hand-written HTTP/1.1 over `std::net::TcpStream` (`Connection: close`), so
//! these tests see exactly what goes over the wire.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use cairn::checkpoint::{CheckpointMetadata, TaskCheckpointStats};
use cairn::config::{keys, JobConfig};
use cairn::runtime::{JobState, JobStatus, SavepointKind, SavepointState, VertexView};
use cairn_rest::{serve, ClusterResources, JobRegistry, Resources, RestError, RestServer};
use serde_json::{json, Value};

// ---------------------------------------------------------------------------------------------
// A tiny HTTP client
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Value,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// Asserts a Flink-style error: the status and `{"errors":[msg]}` with msg containing `part`.
    fn assert_error(&self, status: u16, part: &str) {
        assert_eq!(self.status, status, "{self:?}");
        let errors = self.body["errors"].as_array().expect("errors array");
        assert_eq!(errors.len(), 1, "{self:?}");
        let msg = errors[0].as_str().expect("error message is a string");
        assert!(msg.contains(part), "error {msg:?} should contain {part:?}");
        assert_eq!(self.body.as_object().map(|o| o.len()), Some(1), "{self:?}");
    }
}

fn request(addr: SocketAddr, method: &str, path: &str, auth: Option<&str>) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let auth = auth.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).expect("read reply");
    parse_reply(&raw)
}

fn parse_reply(raw: &[u8]) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = std::str::from_utf8(&raw[..split]).expect("UTF-8 head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = raw[split + 4..].to_vec();
    let chunked = headers.iter().any(|(k, v)| {
        k.eq_ignore_ascii_case("transfer-encoding") && v.eq_ignore_ascii_case("chunked")
    });
    if chunked {
        body = dechunk(&body);
    }
    let body = if body.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&body)
            )
        })
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let eol = data
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size");
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..eol]).expect("hex").trim(), 16)
                .expect("chunk size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&data[eol + 2..eol + 2 + size]);
        data = &data[eol + 2 + size + 2..];
    }
}

fn get(addr: SocketAddr, path: &str) -> Reply {
    request(addr, "GET", path, None)
}

// ---------------------------------------------------------------------------------------------
// Fixtures
// ---------------------------------------------------------------------------------------------

const RUNNING: &str = "0123456789abcdef0123456789abcdef";
const FINISHED: &str = "fedcba9876543210fedcba9876543210";

fn metadata(id: u64, trigger: u64) -> CheckpointMetadata {
    CheckpointMetadata {
        job_id: RUNNING.into(),
        job_name: "wordcount".into(),
        checkpoint_id: id,
        trigger_timestamp_ms: trigger,
        completed_timestamp_ms: trigger + 40 + id,
        max_parallelism: 128,
        operators: Vec::new(),
        state_size: 1000 * id,
        tasks: vec![
            TaskCheckpointStats {
                task: "Source: words -> Map".into(),
                subtask: 0,
                sync_ms: 1,
                async_ms: 2,
                alignment_ms: 0,
                start_delay_ms: 3,
                state_size: 10 * id,
                ..TaskCheckpointStats::default()
            },
            TaskCheckpointStats {
                task: "counts -> Sink".into(),
                subtask: 1,
                sync_ms: 4,
                async_ms: 5,
                alignment_ms: 6,
                start_delay_ms: 7,
                state_size: 990 * id,
                ..TaskCheckpointStats::default()
            },
        ],
        shared_files: Vec::new(),
    }
}

/// A running job with 3 completed checkpoints, and a finished one with none.
fn registry() -> (JobRegistry, Arc<JobStatus>, Arc<JobStatus>) {
    let mut config = JobConfig::default();
    config
        .set_all([
            (keys::CHECKPOINT_INTERVAL, "100ms"),
            (keys::CHECKPOINTING_MODE, "at-least-once"),
            (keys::CHECKPOINT_TIMEOUT, "1min"),
            (keys::MIN_PAUSE, "20ms"),
            (keys::MAX_CONCURRENT_CHECKPOINTS, "2"),
            (keys::TOLERABLE_FAILED_CHECKPOINTS, "3"),
            (keys::NUM_RETAINED, "4"),
            (keys::CHECKPOINTS_DIR, "/tmp/cairn-ckpt"),
        ])
        .expect("valid configuration");
    let running = JobStatus::new(RUNNING.into(), "wordcount".into(), config.describe());
    running.set_state(JobState::Running);
    running.update(|v| {
        v.restarts = 2;
        v.failure_cause = Some("injected failure".into());
        v.checkpoint_counts.triggered = 5;
        v.checkpoint_counts.in_progress = 1;
        v.checkpoint_counts.completed = 3;
        v.checkpoint_counts.failed = 1;
    });
    for id in 1..=3 {
        running.checkpoint_completed(metadata(id, 1_700_000_000_000 + 100 * id));
    }
    let finished = JobStatus::new(
        FINISHED.into(),
        "other".into(),
        JobConfig::default().describe(),
    );
    finished.set_state(JobState::Running);
    finished.set_state(JobState::Finished);
    let reg = JobRegistry::new();
    reg.register(running.clone());
    reg.register(finished.clone());
    (reg, running, finished)
}

fn server(reg: JobRegistry, token: Option<&str>) -> RestServer {
    serve(
        "127.0.0.1:0".parse().expect("address"),
        reg,
        token.map(str::to_string),
    )
    .expect("server starts")
}

// ---------------------------------------------------------------------------------------------
// Endpoints
// ---------------------------------------------------------------------------------------------

#[test]
fn jobs_overview_lists_every_job_with_its_state() {
    let (reg, _, _) = registry();
    let srv = server(reg, None);
    let r = get(srv.local_addr(), "/jobs");
    assert_eq!(r.status, 200, "{r:?}");
    assert!(r
        .header("content-type")
        .is_some_and(|c| c.starts_with("application/json")));
    assert_eq!(
        r.body,
        json!({"jobs": [
            {"id": RUNNING, "status": "RUNNING"},
            {"id": FINISHED, "status": "FINISHED"},
        ]})
    );
}

#[test]
fn job_details_of_running_and_finished_jobs() {
    let (reg, running, finished) = registry();
    let srv = server(reg, None);

    let r = get(srv.local_addr(), &format!("/jobs/{RUNNING}"));
    assert_eq!(r.status, 200, "{r:?}");
    let b = &r.body;
    // Flink's JobDetailsInfo: every field its client requires, with cairn's beside them.
    for field in [
        "jid",
        "name",
        "isStoppable",
        "state",
        "job-type",
        "schedulerType",
        "start-time",
        "end-time",
        "duration",
        "maxParallelism",
        "now",
        "timestamps",
        "vertices",
        "status-counts",
        "plan",
        "stream-graph",
        "pending-operators",
        "restarts",
        "failure-cause",
    ] {
        assert!(b.get(field).is_some(), "no {field} in {b}");
    }
    assert_eq!(b["isStoppable"], false);
    assert_eq!(b["job-type"], "STREAMING");
    assert_eq!(b["timestamps"]["RUNNING"], running.view().start_time);
    assert_eq!(b["timestamps"]["FINISHED"], 0);
    assert_eq!(b["jid"], RUNNING);
    assert_eq!(b["name"], "wordcount");
    assert_eq!(b["state"], "RUNNING");
    assert_eq!(b["start-time"], running.view().start_time);
    assert_eq!(b["end-time"], -1);
    assert!(b["duration"].as_u64().is_some());
    assert_eq!(b["restarts"], 2);
    assert_eq!(b["failure-cause"], "injected failure");

    let r = get(srv.local_addr(), &format!("/jobs/{FINISHED}"));
    assert_eq!(r.status, 200, "{r:?}");
    let v = finished.view();
    let end = v.end_time.expect("a finished job has an end time");
    assert_eq!(r.body["state"], "FINISHED");
    assert_eq!(r.body["end-time"], end);
    assert_eq!(r.body["duration"], end - v.start_time);
    assert_eq!(r.body["failure-cause"], Value::Null);
}

#[test]
fn checkpoints_show_counts_latest_and_history_newest_first() {
    let (reg, _, _) = registry();
    let srv = server(reg, None);
    let r = get(srv.local_addr(), &format!("/jobs/{RUNNING}/checkpoints"));
    assert_eq!(r.status, 200, "{r:?}");
    let b = &r.body;
    assert_eq!(
        b["counts"],
        json!({"restored": 0, "total": 5, "triggered": 5, "in_progress": 1, "completed": 3, "failed": 1})
    );
    // Flink's summary over the history: state sizes 1000, 2000, 3000; durations 41, 42, 43.
    assert_eq!(
        b["summary"]["state_size"],
        json!({"min": 1000, "max": 3000, "avg": 2000, "p50": 2000.0, "p90": 3000.0, "p95": 3000.0, "p99": 3000.0, "p999": 3000.0})
    );
    assert_eq!(b["summary"]["end_to_end_duration"]["min"], 41);
    assert_eq!(
        b["latest"],
        json!({"completed": b["history"][0], "savepoint": null, "failed": null, "restored": null})
    );
    let history = b["history"].as_array().expect("history");
    let ids: Vec<u64> = history.iter().filter_map(|h| h["id"].as_u64()).collect();
    assert_eq!(ids, [3, 2, 1]);
    assert_eq!(b["latest"]["completed"], history[0]);

    let newest = &history[0];
    let meta = metadata(3, 1_700_000_000_300);
    assert_eq!(newest["status"], "COMPLETED");
    assert_eq!(newest["trigger_timestamp"], meta.trigger_timestamp_ms);
    assert_eq!(newest["latest_ack_timestamp"], meta.completed_timestamp_ms);
    assert_eq!(newest["end_to_end_duration"], 43);
    assert_eq!(newest["state_size"], 3000);
    assert_eq!(newest["className"], "completed");
    assert_eq!(newest["is_savepoint"], false);
    assert_eq!(newest["checkpoint_type"], "CHECKPOINT");
    assert_eq!(newest["num_subtasks"], 2);
    assert_eq!(
        newest["external_path"],
        format!("/tmp/cairn-ckpt/{RUNNING}/chk-3")
    );
    // cairn's per-subtask statistics are the struct as serde serializes it, whatever fields
    // it has.
    assert_eq!(
        newest["subtasks"],
        serde_json::to_value(&meta.tasks).expect("stats serialize")
    );
    assert_eq!(newest["subtasks"][1]["task"], "counts -> Sink");
    assert_eq!(newest["subtasks"][1]["subtask"], 1);
    assert_eq!(newest["subtasks"][1]["alignment_ms"], 6);
    assert_eq!(newest["subtasks"][1]["start_delay_ms"], 7);
    // Flink's per-vertex statistics, keyed by 32-hex-digit vertex ids.
    let tasks = newest["tasks"].as_object().expect("tasks per vertex");
    assert_eq!(tasks.len(), 2, "{tasks:?}");
    for (id, t) in tasks {
        assert!(
            id.len() == 32 && id.chars().all(|c| c.is_ascii_hexdigit()),
            "{id}"
        );
        assert_eq!(t["num_acknowledged_subtasks"], 1, "{t}");
        assert_eq!(t["status"], "COMPLETED", "{t}");
    }
    let sink = tasks
        .values()
        .find(|t| t["state_size"] == 2970)
        .expect("the sink task's statistics");
    assert_eq!(sink["end_to_end_duration"], 7 + 6 + 4 + 5);
    // Storage layout and identity are not repeated per checkpoint.
    for hidden in ["operators", "job_id", "job_name", "checkpoint_id"] {
        assert!(newest.get(hidden).is_none(), "{hidden} in {newest}");
    }
}

#[test]
fn checkpoints_of_a_job_without_any() {
    let (reg, _, _) = registry();
    let srv = server(reg, None);
    let r = get(srv.local_addr(), &format!("/jobs/{FINISHED}/checkpoints"));
    assert_eq!(r.status, 200, "{r:?}");
    let zero = json!({"min": 0, "max": 0, "avg": 0, "p50": 0.0, "p90": 0.0, "p95": 0.0, "p99": 0.0, "p999": 0.0});
    assert_eq!(
        r.body,
        json!({
            "counts": {"restored": 0, "total": 0, "triggered": 0, "in_progress": 0, "completed": 0, "failed": 0},
            "summary": {
                "checkpointed_size": zero,
                "state_size": zero,
                "end_to_end_duration": zero,
                "alignment_buffered": zero,
                "processed_data": zero,
                "persisted_data": zero,
            },
            "latest": {"completed": null, "savepoint": null, "failed": null, "restored": null},
            "history": [],
            "savepoints": [],
        })
    );
}

#[test]
fn checkpoint_config_is_typed_like_flink() {
    let (reg, _, _) = registry();
    let srv = server(reg, None);
    let r = get(
        srv.local_addr(),
        &format!("/jobs/{RUNNING}/checkpoints/config"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(
        r.body,
        json!({
            "mode": "at_least_once",
            "interval": 100,
            "timeout": 60_000,
            "min_pause": 20,
            "max_concurrent": 2,
            "tolerable_failed": 3,
            "unaligned": false,
            "aligned_checkpoint_timeout": 0,
            "num_retained": 4,
            "checkpoint_dir": "/tmp/cairn-ckpt",
        })
    );
    let r = get(
        srv.local_addr(),
        &format!("/jobs/{FINISHED}/checkpoints/config"),
    );
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["mode"], "exactly_once");
    assert_eq!(r.body["checkpoint_dir"], Value::Null);
}

#[test]
fn unknown_jobs_paths_and_methods_are_flink_errors() {
    let (reg, _, _) = registry();
    let srv = server(reg, None);
    let addr = srv.local_addr();
    for path in [
        "/jobs/nope",
        "/jobs/nope/checkpoints",
        "/jobs/nope/checkpoints/config",
    ] {
        get(addr, path).assert_error(404, "job nope not found");
    }
    request(addr, "PATCH", "/jobs/nope?mode=cancel", None).assert_error(404, "job nope not found");
    get(addr, "/taskmanagers").assert_error(404, "not found: /taskmanagers");
    get(addr, "/v1/taskmanagers").assert_error(404, "not found: /v1/taskmanagers");
    get(addr, "/v2/jobs").assert_error(404, "not found: /v2/jobs");
    get(addr, &format!("/jobs/{RUNNING}/vertices")).assert_error(404, "not found");
    get(addr, "/v1/jobs/nope").assert_error(404, "job nope not found");
    request(addr, "DELETE", "/jobs", None).assert_error(405, "DELETE");
    request(addr, "DELETE", "/v1/jobs", None)
        .assert_error(405, "method DELETE is not allowed on /v1/jobs");
}

#[test]
fn cancel_sets_the_flag_and_answers_202() {
    let (reg, running, _) = registry();
    let srv = server(reg, None);
    let addr = srv.local_addr();

    let r = request(addr, "PATCH", &format!("/jobs/{RUNNING}?mode=stop"), None);
    r.assert_error(400, "unsupported termination mode 'stop'");
    assert!(!running.cancel_requested());

    let r = request(addr, "PATCH", &format!("/jobs/{RUNNING}?mode=cancel"), None);
    assert_eq!(r.status, 202, "{r:?}");
    assert_eq!(r.body, json!({}));
    assert!(running.cancel_requested());
    // Asking again while the job winds down is fine; `mode` defaults to cancel as in Flink.
    let r = request(addr, "PATCH", &format!("/jobs/{RUNNING}"), None);
    assert_eq!(r.status, 202, "{r:?}");
}

#[test]
fn cancelling_an_ended_job_is_a_conflict() {
    let (reg, _, finished) = registry();
    let srv = server(reg, None);
    let r = request(
        srv.local_addr(),
        "PATCH",
        &format!("/jobs/{FINISHED}?mode=cancel"),
        None,
    );
    r.assert_error(409, "already FINISHED");
    assert!(!finished.cancel_requested());
}

#[test]
fn a_status_registered_before_its_job_id_is_known_is_found_by_the_new_id() {
    let reg = JobRegistry::new();
    let status = JobStatus::new(String::new(), "wordcount".into(), Vec::new());
    reg.register(status.clone());
    let srv = server(reg, None);
    status.update(|v| v.jid = RUNNING.into());
    status.set_state(JobState::Running);
    let r = get(srv.local_addr(), &format!("/jobs/{RUNNING}"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["state"], "RUNNING");
}

#[test]
fn every_path_answers_the_same_under_v1() {
    let (reg, running, _) = registry();
    let srv = server(reg, None);
    let addr = srv.local_addr();
    for path in [
        "/jobs".to_string(),
        format!("/jobs/{FINISHED}"),
        format!("/jobs/{RUNNING}/checkpoints"),
        format!("/jobs/{RUNNING}/checkpoints/config"),
        "/config".into(),
    ] {
        let mut plain = get(addr, &path);
        let mut versioned = get(addr, &format!("/v1{path}"));
        assert_eq!(plain.status, 200, "{path}: {plain:?}");
        // The time of the answer differs, of course.
        for body in [&mut plain.body, &mut versioned.body] {
            if let Some(b) = body.as_object_mut() {
                b.remove("now");
            }
        }
        assert_eq!(plain.body, versioned.body, "{path}");
    }
    let r = request(
        addr,
        "PATCH",
        &format!("/v1/jobs/{RUNNING}?mode=cancel"),
        None,
    );
    assert_eq!(r.status, 202, "{r:?}");
    assert!(running.cancel_requested());
}

#[test]
fn jobs_overview_entries_are_flink_job_details() {
    let (reg, running, _) = registry();
    running.update(|v| {
        v.vertices = vec![
            VertexView {
                name: "Source: words -> Map".into(),
                parallelism: 2,
                inputs: Vec::new(),
            },
            VertexView {
                name: "counts -> Sink".into(),
                parallelism: 3,
                inputs: vec![cairn::runtime::VertexInput {
                    vertex: 0,
                    ship_strategy: "HASH".into(),
                }],
            },
        ];
        v.max_parallelism = 128;
    });
    let srv = server(reg, None);
    let r = get(srv.local_addr(), "/v1/jobs/overview");
    assert_eq!(r.status, 200, "{r:?}");
    let jobs = r.body["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 2);
    let job = &jobs[0];
    assert_eq!(job["jid"], RUNNING);
    assert_eq!(job["state"], "RUNNING");
    assert_eq!(job["last-modification"], running.view().start_time);
    assert_eq!(job["pending-operators"], 0);
    // Every subtask is counted under the state matching the job's.
    assert_eq!(job["tasks"]["total"], 5);
    assert_eq!(job["tasks"]["running"], 5);
    assert_eq!(job["tasks"]["canceled"], 0);
    assert_eq!(job["tasks"].as_object().map(|t| t.len()), Some(11));
    assert_eq!(jobs[1]["state"], "FINISHED");
    assert_eq!(jobs[1]["tasks"]["total"], 0);

    let r = get(srv.local_addr(), &format!("/jobs/{RUNNING}"));
    let vertices = r.body["vertices"].as_array().expect("vertices");
    assert_eq!(vertices.len(), 2);
    assert_eq!(vertices[1]["name"], "counts -> Sink");
    assert_eq!(vertices[1]["parallelism"], 3);
    assert_eq!(vertices[1]["maxParallelism"], 128);
    assert_eq!(vertices[1]["tasks"]["RUNNING"], 3);
    assert_eq!(r.body["status-counts"]["RUNNING"], 2);
    assert_eq!(r.body["plan"]["nodes"].as_array().map(Vec::len), Some(2));
    // The checkpoint statistics name the same vertex ids.
    let c = get(srv.local_addr(), &format!("/jobs/{RUNNING}/checkpoints"));
    let tasks = c.body["history"][0]["tasks"].as_object().expect("tasks");
    for v in vertices {
        let id = v["id"].as_str().expect("vertex id");
        assert!(tasks.contains_key(id), "{id} not in {tasks:?}");
    }
    assert_eq!(
        tasks[vertices[1]["id"].as_str().expect("id")]["num_subtasks"],
        3
    );
}

struct TwoWorkers;

impl ClusterResources for TwoWorkers {
    fn resources(&self) -> Resources {
        Resources {
            workers: 2,
            slots: 4,
            reserved: 3,
        }
    }
}

#[test]
fn overview_and_config_are_flink_shaped() {
    let (reg, running, _) = registry();
    running.update(|v| {
        v.vertices = vec![VertexView {
            name: "all".into(),
            parallelism: 3,
            inputs: Vec::new(),
        }]
    });
    let srv = server(reg.clone(), None);
    let r = get(srv.local_addr(), "/v1/overview");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["taskmanagers"], 0);
    assert_eq!(r.body["slots-total"], 0);
    assert_eq!(r.body["jobs-running"], 1);
    assert_eq!(r.body["jobs-finished"], 1);
    assert_eq!(r.body["jobs-cancelled"], 0);
    assert_eq!(r.body["jobs-failed"], 0);
    assert_eq!(r.body["flink-version"], "2.3.0");
    reg.set_resources(Arc::new(TwoWorkers));
    let r = get(srv.local_addr(), "/overview");
    assert_eq!(r.body["taskmanagers"], 2);
    assert_eq!(r.body["slots-total"], 4);
    assert_eq!(r.body["slots-available"], 1);

    let r = get(srv.local_addr(), "/v1/config");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["flink-version"], "2.3.0");
    assert_eq!(r.body["timezone-offset"], 0);
    assert!(r.body["refresh-interval"].as_u64().is_some(), "{r:?}");
    assert_eq!(r.body["features"]["web-cancel"], true);
    assert_eq!(r.body["features"]["web-submit"], false);
}

// ---------------------------------------------------------------------------------------------
// Bearer token
// ---------------------------------------------------------------------------------------------

#[test]
fn token_is_required_on_every_path_and_checked() {
    let (reg, running, _) = registry();
    let srv = server(reg, Some("s3cret-token"));
    let addr = srv.local_addr();

    for (auth, path) in [
        (None, "/jobs"),
        (Some("Bearer wrong"), "/jobs"),
        (Some("Bearer s3cret-toke"), "/jobs"),
        (Some("Bearer s3cret-token2"), "/jobs"),
        (Some("Basic s3cret-token"), "/jobs"),
        (Some("s3cret-token"), "/jobs"),
        (None, "/no/such/path"),
        (None, "/jobs/nope"),
        (None, "/v1/jobs"),
        (None, "/metrics"),
        (None, "/jobs/0123456789abcdef0123456789abcdef/config"),
    ] {
        let r = request(addr, "GET", path, auth);
        r.assert_error(401, "missing or wrong bearer token");
        assert_eq!(r.body, json!({"errors": ["missing or wrong bearer token"]}));
        assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    }
    let r = request(
        addr,
        "PATCH",
        &format!("/jobs/{RUNNING}?mode=cancel"),
        Some("Bearer nope"),
    );
    assert_eq!(r.status, 401);
    assert!(
        !running.cancel_requested(),
        "a rejected request must not cancel"
    );

    let r = request(addr, "GET", "/jobs", Some("Bearer s3cret-token"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["jobs"].as_array().map(Vec::len), Some(2));
    let r = request(addr, "GET", "/jobs/nope", Some("bearer s3cret-token"));
    r.assert_error(404, "job nope not found");
    let r = request(
        addr,
        "PATCH",
        &format!("/jobs/{RUNNING}?mode=cancel"),
        Some("Bearer s3cret-token"),
    );
    assert_eq!(r.status, 202, "{r:?}");
    assert!(running.cancel_requested());
}

#[test]
fn the_job_config_and_the_savepoints_requested_are_served() {
    let (reg, running, _) = registry();
    let srv = server(reg, None);
    let addr = srv.local_addr();
    let r = get(addr, &format!("/jobs/{RUNNING}/config"));
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["jid"], RUNNING);
    let user = &r.body["execution-config"]["user-config"];
    assert_eq!(user["execution.checkpointing.interval"], "100ms", "{user}");
    assert_eq!(user["state.checkpoints.dir"], "/tmp/cairn-ckpt", "{user}");
    // Keys not set are left out, not shown as "(not set)".
    assert!(user.get("state.savepoints.dir").is_none(), "{user}");
    get(addr, "/jobs/nope/config").assert_error(404, "job nope not found");

    let r = get(addr, &format!("/jobs/{RUNNING}/checkpoints"));
    assert_eq!(r.body["savepoints"], json!([]));
    let first = running.request_savepoint("/tmp/sp".into(), SavepointKind::Intermediate, true);
    let stop = running.request_savepoint("/tmp/sp".into(), SavepointKind::Stop, true);
    running.update(|v| {
        v.savepoints[0].state = SavepointState::Completed {
            location: "/tmp/sp/savepoint-1".into(),
        }
    });
    let r = get(addr, &format!("/jobs/{RUNNING}/checkpoints"));
    let sps = r.body["savepoints"].as_array().expect("savepoints");
    assert_eq!(sps.len(), 2, "{sps:?}");
    assert_eq!(sps[0]["request-id"], stop.as_str());
    assert_eq!(sps[0]["kind"], "stop");
    assert_eq!(sps[0]["status"], "IN_PROGRESS");
    assert_eq!(sps[1]["request-id"], first.as_str());
    assert_eq!(sps[1]["kind"], "savepoint");
    assert_eq!(sps[1]["status"], "COMPLETED");
    assert_eq!(sps[1]["location"], "/tmp/sp/savepoint-1");
    assert!(sps[1]["trigger_timestamp"].as_u64() > Some(1_700_000_000_000));
}

#[test]
fn an_empty_token_is_refused() {
    let err = serve(
        "127.0.0.1:0".parse().expect("address"),
        JobRegistry::new(),
        Some(String::new()),
    )
    .expect_err("an empty token must not start a server");
    assert!(matches!(err, RestError::EmptyToken), "{err}");
}

// ---------------------------------------------------------------------------------------------
// Lifecycle
// ---------------------------------------------------------------------------------------------

#[test]
fn binding_an_address_in_use_is_an_error_naming_it() {
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr");
    let err = serve(addr, JobRegistry::new(), None).expect_err("the address is in use");
    assert!(matches!(err, RestError::Bind { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains(&addr.to_string()), "{msg}");
    assert!(!msg.contains('\n'), "{msg}");
}

#[test]
fn binding_an_address_not_on_this_machine_is_an_error() {
    // TEST-NET-1 (RFC 5737): never assigned to a local interface; nothing is sent.
    let addr: SocketAddr = "192.0.2.1:0".parse().expect("address");
    let err = serve(addr, JobRegistry::new(), None).expect_err("not a local address");
    assert!(err.to_string().contains("192.0.2.1:0"), "{err}");
}

#[test]
fn shutdown_and_drop_close_the_port() {
    // Refused, not just any error: a timeout or a reset would not mean the port is closed.
    let refused = |addr: SocketAddr| TcpStream::connect(addr).map(drop).map_err(|e| e.kind());
    let srv = server(JobRegistry::new(), None);
    let addr = srv.local_addr();
    assert_eq!(get(addr, "/jobs").body, json!({"jobs": []}));
    srv.shutdown();
    assert_eq!(
        refused(addr),
        Err(std::io::ErrorKind::ConnectionRefused),
        "still listening after shutdown"
    );

    let srv = server(JobRegistry::new(), None);
    let addr = srv.local_addr();
    assert_eq!(get(addr, "/jobs").body, json!({"jobs": []}));
    drop(srv);
    assert_eq!(
        refused(addr),
        Err(std::io::ErrorKind::ConnectionRefused),
        "still listening after drop"
    );
}
