//! `POST /jobs` (job submission) and `GET /jobs/overview` over real HTTP on 127.0.0.1, with a
//! fake submitter that registers a job status the way a coordinator does.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cairn::runtime::{JobState, JobStatus};
use cairn_rest::{serve, JobRegistry, JobSubmitter, RestServer, SubmitRequest, SUBMIT_BODY_MAX};
use serde_json::{json, Value};

const JID: &str = "00112233445566778899aabbccddeeff";
const TOKEN: &str = "s3cret-token";

#[derive(Debug)]
struct Reply {
    status: u16,
    body: Value,
}

impl Reply {
    /// Asserts `{"errors":[msg]}` with `status` and msg containing `part`.
    fn assert_error(&self, status: u16, part: &str) {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(self.body.as_object().map(|o| o.len()), Some(1), "{self:?}");
        let errors = self.body["errors"].as_array().expect("errors array");
        assert_eq!(errors.len(), 1, "{self:?}");
        let msg = errors[0].as_str().expect("error message is a string");
        assert!(msg.contains(part), "error {msg:?} should contain {part:?}");
    }
}

/// One HTTP/1.1 request with `Connection: close`; the server must answer with a
/// `Content-Length` body (no chunking) of JSON.
fn request(addr: SocketAddr, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> Reply {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    stream.write_all(&raw).expect("send");
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).expect("read reply");
    let split = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("end of headers");
    let head = String::from_utf8_lossy(&answer[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("bad status line in {head:?}"));
    let body = serde_json::from_slice(&answer[split + 4..]).unwrap_or_else(|e| {
        panic!(
            "body is not JSON ({e}): {:?}",
            String::from_utf8_lossy(&answer[split + 4..])
        )
    });
    Reply { status, body }
}

fn post(addr: SocketAddr, body: &str) -> Reply {
    request(addr, "POST", "/jobs", None, body.as_bytes())
}

/// Starts `wordcount` only; records every call; registers the new job as a coordinator would.
struct FakeSubmitter {
    registry: JobRegistry,
    calls: Mutex<Vec<(String, Vec<String>)>>,
}

impl FakeSubmitter {
    fn calls(&self) -> Vec<(String, Vec<String>)> {
        self.calls.lock().expect("lock").clone()
    }
}

impl JobSubmitter for FakeSubmitter {
    fn submit(&self, request: SubmitRequest) -> Result<String, String> {
        let job = request.job.as_str();
        self.calls
            .lock()
            .map_err(|_| "poisoned".to_string())?
            .push((job.to_string(), request.args.clone().unwrap_or_default()));
        if job != "wordcount" {
            return Err(format!("unknown job '{job}'; built-in jobs: wordcount"));
        }
        let status = JobStatus::new(JID.into(), job.into(), Vec::new());
        status.set_state(JobState::Running);
        self.registry.register(status);
        Ok(JID.into())
    }
}

fn coordinator(token: Option<&str>) -> (RestServer, Arc<FakeSubmitter>) {
    let registry = JobRegistry::new();
    let fake = Arc::new(FakeSubmitter {
        registry: registry.clone(),
        calls: Mutex::new(Vec::new()),
    });
    registry.set_submitter(fake.clone());
    let srv = serve(
        "127.0.0.1:0".parse().expect("address"),
        registry,
        token.map(str::to_string),
    )
    .expect("server starts");
    (srv, fake)
}

#[test]
fn a_submission_returns_the_new_job_id_and_the_job_is_served() {
    let (srv, fake) = coordinator(None);
    let addr = srv.local_addr();
    let args = ["--generate", "1000", "--output", "/x y/ü", "-D", "a=b"];
    let body = json!({"job": "wordcount", "args": args}).to_string();
    let r = post(addr, &body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body, json!({"jobid": JID}));
    let expected: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    assert_eq!(fake.calls(), [("wordcount".to_string(), expected)]);

    let r = request(addr, "GET", &format!("/jobs/{JID}"), None, b"");
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["name"], "wordcount");
    assert_eq!(r.body["state"], "RUNNING");

    let r = request(addr, "GET", "/jobs/overview", None, b"");
    assert_eq!(r.status, 200, "{r:?}");
    let jobs = r.body["jobs"].as_array().expect("jobs");
    assert_eq!(jobs.len(), 1, "{r:?}");
    assert_eq!(jobs[0]["jid"], JID);
    assert_eq!(jobs[0]["name"], "wordcount");
    assert_eq!(jobs[0]["state"], "RUNNING");
    assert_eq!(jobs[0]["end-time"], -1);
}

#[test]
fn a_refused_submission_is_a_400_with_the_submitters_message() {
    let (srv, fake) = coordinator(None);
    let r = post(srv.local_addr(), r#"{"job": "nope", "args": []}"#);
    r.assert_error(400, "unknown job 'nope'; built-in jobs: wordcount");
    assert_eq!(fake.calls().len(), 1);
    let r = request(srv.local_addr(), "GET", "/jobs", None, b"");
    assert_eq!(r.body, json!({"jobs": []}));
}

#[test]
fn a_server_without_a_submitter_refuses_submissions() {
    let srv = serve(
        "127.0.0.1:0".parse().expect("address"),
        JobRegistry::new(),
        None,
    )
    .expect("server starts");
    let r = post(srv.local_addr(), r#"{"job": "wordcount", "args": []}"#);
    assert_eq!(r.status, 501, "{r:?}");
    assert_eq!(
        r.body,
        json!({"errors": ["this server does not accept job submissions (embedded mode); use 'cairn coordinator'"]})
    );
}

#[test]
fn malformed_submissions_are_400s_naming_the_problem() {
    let (srv, fake) = coordinator(None);
    let addr = srv.local_addr();
    for (body, part) in [
        ("", "invalid job submission: EOF while parsing"),
        (
            "wordcount --generate 10",
            "invalid job submission: expected value",
        ),
        (
            r#"{"job": "wordcount", "args": [}"#,
            "invalid job submission",
        ),
        ("{}", "missing field `job`"),
        (
            r#"{"job": "wordcount", "params": {}, "args": []}"#,
            "not both",
        ),
        (
            r#"{"job": "wordcount", "parms": {}}"#,
            "unknown field `parms`",
        ),
        (r#"{"args": []}"#, "missing field `job`"),
        (
            r#"{"job": 7, "args": []}"#,
            "invalid type: integer `7`, expected a string",
        ),
        (
            r#"{"job": "wordcount", "args": "--generate 10"}"#,
            "invalid type: string",
        ),
        (
            r#"{"job": "wordcount", "args": [1]}"#,
            "invalid type: integer `1`",
        ),
        (r#"["wordcount", []]"#, "the body is not a JSON object"),
        (r#"{"job": " ", "args": []}"#, "the job name is empty"),
    ] {
        let r = post(addr, body);
        r.assert_error(400, part);
        r.assert_error(
            400,
            r#"expected {"job": NAME, "params": {..}} or {"job": NAME, "args": [FLAG, ...]}"#,
        );
    }
    assert!(fake.calls().is_empty(), "{:?}", fake.calls());
}

#[test]
fn bodies_are_limited_to_one_mib() {
    let (srv, fake) = coordinator(None);
    let addr = srv.local_addr();
    let envelope = r#"{"job":"wordcount","args":[""]}"#.len();
    let fits = format!(
        r#"{{"job":"wordcount","args":["{}"]}}"#,
        "x".repeat(SUBMIT_BODY_MAX - envelope)
    );
    assert_eq!(fits.len(), SUBMIT_BODY_MAX);
    let r = post(addr, &fits);
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(fake.calls().len(), 1);

    let too_big = format!(
        r#"{{"job":"wordcount","args":["{}"]}}"#,
        "x".repeat(SUBMIT_BODY_MAX - envelope + 1)
    );
    post(addr, &too_big).assert_error(413, "larger than 1048576 bytes (1 MiB)");
    assert_eq!(fake.calls().len(), 1);
}

#[test]
fn submissions_need_the_token_too() {
    let (srv, fake) = coordinator(Some(TOKEN));
    let addr = srv.local_addr();
    let body = br#"{"job": "wordcount", "args": ["--generate", "10"]}"#;
    for token in [None, Some("wrong")] {
        let r = request(addr, "POST", "/jobs", token, body);
        r.assert_error(401, "missing or wrong bearer token");
    }
    assert!(
        fake.calls().is_empty(),
        "a rejected request must not submit"
    );
    let r = request(addr, "POST", "/jobs", Some(TOKEN), body);
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.body["jobid"], JID);
}

#[test]
fn other_methods_on_jobs_are_still_405() {
    let (srv, _) = coordinator(None);
    let r = request(srv.local_addr(), "PUT", "/jobs", None, b"{}");
    r.assert_error(405, "method PUT is not allowed on /jobs");
    let r = request(srv.local_addr(), "POST", "/jobs/overview", None, b"{}");
    r.assert_error(405, "method POST is not allowed on /jobs/overview");
}
