//! The web dashboard in a real browser: Debian's Chromium, driven headless by
//! `web/e2e/dashboard.mjs` (playwright-core), against a coordinator with two workers and a REST
//! token running the back-pressured `backpressure` job. The script sees the job listed, the
//! fast source back-pressured in the graph and the throttled vertex not, points in the
//! checkpoint charts, takes a savepoint and then stops the job with a savepoint from the
//! page's buttons, and sees it FINISHED; then it sees a second job's injected failure in its
//! exceptions and cancels a third job from the page. Screenshots of each page go to
//! `target/dashboard-screenshots/`. Needs `npm ci` in `web/` and `/usr/bin/chromium`, which
//! `scripts/test` installs; without them this test fails (it never skips).

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{cairn, submit, Cluster, Watched};

const DEADLINE: Duration = Duration::from_secs(60);
const TOKEN: &str = "dashboard-test-token";

fn web_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../web")
}

/// `target/dashboard-screenshots`, beside the target directory's `tmp`.
fn screenshot_dir() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("the target directory")
        .join("dashboard-screenshots")
}

fn get(addr: SocketAddr, path: &str, token: Option<&str>) -> (u16, String, String) {
    let mut request = ureq::get(&format!("http://{addr}{path}"))
        .config()
        .http_status_as_error(false)
        .build();
    if let Some(t) = token {
        request = request.header("Authorization", &format!("Bearer {t}"));
    }
    let mut resp = request.call().unwrap_or_else(|e| panic!("GET {path}: {e}"));
    let content_type = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let status = resp.status().as_u16();
    let body = resp.body_mut().read_to_string().expect("a text body");
    (status, content_type, body)
}

#[test]
fn an_embedded_run_serves_the_dashboard_without_the_token_and_its_api_with_it() {
    let tmp = tempfile::tempdir().unwrap();
    let mut run = Watched::spawn(
        cairn()
            .args(["run", "wordcount", "--generate", "1000000000", "--discard"])
            .args(["--rest", "127.0.0.1:0", "--rest-token", TOKEN])
            .arg("--checkpoint-dir")
            .arg(tmp.path().join("ck")),
    );
    let addr = run.rest_addr(Instant::now() + DEADLINE);

    let (status, content_type, page) = get(addr, "/", None);
    assert_eq!(status, 200, "{page}");
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(page.contains("./assets/app.js"), "{page}");
    let (status, content_type, script) = get(addr, "/assets/app.js", None);
    assert_eq!(status, 200);
    assert!(
        content_type.starts_with("text/javascript"),
        "{content_type}"
    );
    assert!(
        script.contains("jobs/overview"),
        "the built app asks for the job list"
    );
    let (status, content_type, _) = get(addr, "/assets/index.css", None);
    assert_eq!((status, content_type.starts_with("text/css")), (200, true));
    assert_eq!(get(addr, "/assets/nothing.js", None).0, 404);

    // The API stays behind the token; the page asks for it.
    let (status, _, body) = get(addr, "/jobs/overview", None);
    assert_eq!(status, 401, "{body}");
    let (status, _, body) = get(addr, "/jobs/overview", Some(TOKEN));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("wordcount"), "{body}");
    run.terminate();
}

#[test]
fn the_dashboard_in_chromium_shows_backpressure_and_checkpoints_and_stops_the_job_with_a_savepoint()
{
    let web = web_dir();
    assert!(
        web.join("node_modules/playwright-core").is_dir(),
        "web/node_modules is missing: run `npm ci` in web/ (scripts/test does)"
    );
    let tmp = tempfile::tempdir().unwrap();
    let savepoints = tmp.path().join("savepoints");
    let mut cluster = Cluster::start_with(
        &tmp.path().join("ck"),
        3,
        &["--rest-token", TOKEN],
        Instant::now() + DEADLINE,
    );
    let rest = cluster.rest;
    let savepoints_dir = format!("state.savepoints.dir={}", savepoints.display());
    let jid = submit(
        rest,
        Some(TOKEN),
        &[
            "backpressure",
            "-p",
            "2",
            "--discard",
            "--generate",
            "1000000000",
            "--keys",
            "1000",
            "--sink-rate",
            "100000",
            "--checkpoint-interval",
            "500ms",
            "-D",
            &savepoints_dir,
        ],
    );
    // A job that fails once, restarts and finishes; and one the page cancels.
    let failing = submit(
        rest,
        Some(TOKEN),
        &[
            "wordcount",
            "-p",
            "2",
            "--discard",
            "--generate",
            "3000000",
            "--keys",
            "1000",
            "--checkpoint-interval",
            "100ms",
            "--inject-failures",
            "1",
        ],
    );
    let cancelled = submit(
        rest,
        Some(TOKEN),
        &[
            "pipelines",
            "-p",
            "1",
            "--discard",
            "--generate",
            "1000000000",
            "--rate",
            "50000",
        ],
    );

    let shots = screenshot_dir();
    let _ = std::fs::remove_dir_all(&shots);
    let browser = Command::new("node")
        .current_dir(&web)
        .arg("e2e/dashboard.mjs")
        .args(["--url", &format!("http://{rest}/")])
        .args(["--token", TOKEN, "--job", "backpressure"])
        .args(["--slow-vertex", "fast-source -> fast-key"])
        .args(["--calm-vertex", "count-both -> throttled-sink"])
        .args(["--failed-job", "wordcount", "--cancel-job", "pipelines"])
        .arg("--out")
        .arg(&shots)
        .output()
        .expect("node runs (scripts/test installs Node.js's packages in web/)");
    let stdout = String::from_utf8_lossy(&browser.stdout);
    let stderr = String::from_utf8_lossy(&browser.stderr);
    cluster.assert_running();
    assert!(
        browser.status.success(),
        "the browser test failed ({}):\n{stderr}\n{stdout}\ncoordinator:",
        browser.status
    );
    let seen: serde_json::Value = serde_json::from_str(stdout.trim().lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("the browser test printed no summary ({e}): {stdout}"));
    assert_eq!(seen["jid"], jid.as_str(), "{seen}");
    let vertices = seen["vertices"].as_array().expect("vertices");
    let level = |name: &str| {
        vertices
            .iter()
            .find(|v| v["name"] == name)
            .map(|v| v["backpressure"].clone())
    };
    assert_eq!(
        level("fast-source -> fast-key"),
        Some("high".into()),
        "{seen}"
    );
    assert_eq!(
        level("count-both -> throttled-sink"),
        Some("ok".into()),
        "{seen}"
    );
    assert!(seen["chartPoints"].as_u64() >= Some(2), "{seen}");
    assert_eq!(seen["subtaskRows"].as_u64(), Some(6), "{seen}");

    // The stop-with-savepoint the page asked for wrote a savepoint and ended the job.
    let location = PathBuf::from(seen["stopLocation"].as_str().expect("a savepoint location"));
    assert!(location.starts_with(&savepoints), "{location:?}");
    assert!(location.join("_metadata").is_file(), "{location:?}");
    let (_, _, job) = get(rest, &format!("/jobs/{jid}"), Some(TOKEN));
    let job: serde_json::Value = serde_json::from_str(&job).unwrap();
    assert_eq!(job["state"], "FINISHED", "{job}");
    // The other jobs: the injected failure was on the page, and the page's cancel ended one.
    assert_eq!(seen["exceptionKinds"][0], "injected", "{seen}");
    let (_, _, job) = get(rest, &format!("/jobs/{failing}"), Some(TOKEN));
    let job: serde_json::Value = serde_json::from_str(&job).unwrap();
    assert_eq!(job["restart-causes"]["injected"], 1, "{job}");
    let (_, _, job) = get(rest, &format!("/jobs/{cancelled}"), Some(TOKEN));
    let job: serde_json::Value = serde_json::from_str(&job).unwrap();
    assert_eq!(job["state"], "CANCELED", "{job}");
    for name in [
        "0-token",
        "1-jobs",
        "2-graph",
        "3-checkpoints",
        "4-exceptions",
        "5-savepoint",
        "6-stopped",
        "7-finished",
        "8-exceptions",
        "9-canceled",
    ] {
        let shot = shots.join(format!("{name}.png"));
        let len = std::fs::metadata(&shot).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "screenshot {shot:?} missing or empty");
    }
}
