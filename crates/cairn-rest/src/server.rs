//! The HTTP server: routes, errors, the bearer token check, and the background thread.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, PathRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, OriginalUri, Path, Query, Request, State};
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cairn::runtime::{JobStatus, SavepointKind, SavepointState};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::watch;
use tracing::{debug, error, info};

use crate::body;
use crate::registry::JobRegistry;
use crate::submit::SubmitRequest;

/// How long [`RestServer::shutdown`] lets requests in flight finish before dropping them.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// The largest request body accepted (a job submission), in bytes: 1 MiB.
pub const SUBMIT_BODY_MAX: usize = 1 << 20;

/// The answer to a submission on a server without a [`JobSubmitter`](crate::JobSubmitter).
const NO_SUBMITTER: &str =
    "this server does not accept job submissions (embedded mode); use 'cairn coordinator'";

/// What `POST /jobs` expects, for error messages.
const SUBMIT_SHAPE: &str = r#"expected {"job": NAME, "params": {..}} or {"job": NAME, "args": [FLAG, ...]}, with optional "config", "config_yaml", "from", "inject_failures", "inject_uid", "seed""#;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    /// The address cannot be bound (in use, not local, no permission).
    #[error("cannot listen on {addr} for the REST API: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What the OS said.
        source: io::Error,
    },
    /// The runtime or thread of the server could not be created.
    #[error("cannot start the REST API server on {addr}: {source}")]
    Start {
        /// The address asked for.
        addr: SocketAddr,
        /// What failed.
        source: io::Error,
    },
    /// A bearer token was given but is empty (it would let everyone in).
    #[error("the REST API bearer token is empty")]
    EmptyToken,
}

/// A running server. Dropping it shuts it down, as [`RestServer::shutdown`] does.
#[derive(Debug)]
pub struct RestServer {
    local_addr: SocketAddr,
    stop: Option<watch::Sender<bool>>,
    thread: Option<JoinHandle<()>>,
}

impl RestServer {
    /// The address the server listens on (with the actual port if port 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting, lets requests in flight finish (up to a short grace period), and
    /// waits for the server thread to end.
    pub fn shutdown(mut self) {
        self.stop_and_join();
    }

    fn stop_and_join(&mut self) {
        if let Some(stop) = self.stop.take() {
            // An error means the server already ended.
            let _ = stop.send(true);
        }
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                error!("REST API server thread panicked");
            }
        }
    }
}

impl Drop for RestServer {
    fn drop(&mut self) {
        self.stop_and_join();
    }
}

/// Binds `addr` now (so a bad or busy address is an `Err` here) and serves the jobs of
/// `registry` on a background thread with its own tokio runtime until the returned handle is
/// shut down or dropped. With `token`, every request needs `Authorization: Bearer <token>`.
pub fn serve(
    addr: SocketAddr,
    registry: JobRegistry,
    token: Option<String>,
) -> Result<RestServer, RestError> {
    if token.as_deref().is_some_and(str::is_empty) {
        return Err(RestError::EmptyToken);
    }
    serve_app(addr, router(registry, token))
}

/// Whether a process is ready for work: Ok, or why not. `GET /readyz` answers 200 or 503
/// with it (Kubernetes' readiness probe); `GET /healthz` answers 200 while the process serves
/// (its liveness probe). Neither needs the bearer token.
pub type Readiness = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// `GET /healthz` and `GET /readyz` by `ready`.
fn health(ready: Readiness) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(move || {
                let answer = ready();
                async move {
                    match answer {
                        Ok(()) => (StatusCode::OK, "ready\n".to_string()),
                        Err(why) => (
                            StatusCode::SERVICE_UNAVAILABLE,
                            format!("not ready: {why}\n"),
                        ),
                    }
                }
            }),
        )
}

/// Serves `GET /metrics` (a worker's subtasks, `cairn worker --metrics ADDR`) and the health
/// endpoints with `ready`, like [`serve`] otherwise.
pub fn serve_metrics(addr: SocketAddr, ready: Readiness) -> Result<RestServer, RestError> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .with_state(JobRegistry::new())
        .merge(health(ready));
    serve_app(addr, app)
}

/// Serves a standby coordinator's REST port: `GET /healthz` answers 200, `GET /readyz` 503
/// with `standing_by()` (who leads), and every other request 503 with it, until the standby
/// leads and serves the whole API there instead.
pub fn serve_standby(
    addr: SocketAddr,
    standing_by: Arc<dyn Fn() -> String + Send + Sync>,
) -> Result<RestServer, RestError> {
    let why = standing_by.clone();
    let app = Router::new()
        .fallback(move || {
            let message = why();
            async move { ApiError::new(StatusCode::SERVICE_UNAVAILABLE, message) }
        })
        .merge(health(Arc::new(move || Err(standing_by()))));
    serve_app(addr, app)
}

fn serve_app(addr: SocketAddr, app: Router) -> Result<RestServer, RestError> {
    let start_err = |source| RestError::Start { addr, source };
    let std_listener =
        std::net::TcpListener::bind(addr).map_err(|source| RestError::Bind { addr, source })?;
    let local_addr = std_listener.local_addr().map_err(start_err)?;
    std_listener.set_nonblocking(true).map_err(start_err)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .thread_name("cairn-rest-worker")
        .enable_io()
        .enable_time()
        .build()
        .map_err(start_err)?;
    let listener = {
        let _guard = runtime.enter();
        tokio::net::TcpListener::from_std(std_listener).map_err(start_err)?
    };
    let (stop_tx, stop_rx) = watch::channel(false);
    let thread = std::thread::Builder::new()
        .name("cairn-rest".into())
        .spawn(move || {
            runtime.block_on(run(listener, app, stop_rx));
            runtime.shutdown_timeout(Duration::from_millis(100));
            debug!("REST API on {local_addr} stopped");
        })
        .map_err(start_err)?;
    debug!("REST API listening on {local_addr}");
    Ok(RestServer {
        local_addr,
        stop: Some(stop_tx),
        thread: Some(thread),
    })
}

/// Serves until told to stop; then stops accepting and gives requests in flight
/// [`SHUTDOWN_GRACE`] to finish.
async fn run(listener: tokio::net::TcpListener, app: Router, stop: watch::Receiver<bool>) {
    let mut graceful = stop.clone();
    let server = axum::serve(listener, app).with_graceful_shutdown(async move {
        // An error means the handle is gone: stop too.
        let _ = graceful.wait_for(|s| *s).await;
    });
    let mut hard = stop;
    let deadline = async move {
        let _ = hard.wait_for(|s| *s).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        result = server => {
            if let Err(e) = result {
                error!("REST API server failed: {e}");
            }
        }
        () = deadline => debug!("REST API: requests still in flight after {SHUTDOWN_GRACE:?} dropped"),
    }
}

fn router(registry: JobRegistry, token: Option<String>) -> Router {
    // Flink's clients put the API version first (`/v1/jobs/overview`); both spellings answer.
    let api = Router::new()
        .route("/overview", get(cluster_overview))
        .route("/config", get(dashboard_config))
        .route("/jobs", get(list_jobs).post(submit_job))
        .route("/jobs/overview", get(jobs_overview))
        .route("/jobs/{jid}", get(job_details).patch(patch_job))
        .route("/jobs/{jid}/checkpoints", get(checkpoints))
        .route("/jobs/{jid}/vertices/{vid}", get(vertex_details))
        .route(
            "/jobs/{jid}/vertices/{vid}/backpressure",
            get(vertex_backpressure),
        )
        .route("/jobs/{jid}/exceptions", get(job_exceptions))
        .route("/jobs/{jid}/plan", get(job_plan))
        .route("/jobs/{jid}/config", get(job_config))
        .route("/jobs/{jid}/checkpoints/config", get(checkpoint_config))
        .route("/jobs/{jid}/savepoints", post(trigger_savepoint))
        .route("/jobs/{jid}/savepoints/{rid}", get(savepoint_status))
        .route("/jobs/{jid}/stop", post(stop_job))
        .route("/savepoint-disposal", post(dispose_savepoint))
        .route("/savepoint-disposal/{rid}", get(disposal_status))
        .method_not_allowed_fallback(method_not_allowed);
    let router = Router::new()
        .nest("/v1", api.clone())
        .merge(api)
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(SUBMIT_BODY_MAX))
        .with_state(registry);
    let router = match token {
        Some(token) => router.layer(middleware::from_fn_with_state(
            Arc::<str>::from(token),
            require_token,
        )),
        None => router,
    };
    // After the token layer: a browser loads the page without one, then asks for it; a
    // probe asks for its health without one.
    crate::dashboard::router()
        .merge(router)
        .merge(health(Arc::new(|| Ok(()))))
}

/// `GET /metrics`: this process's subtasks and the registry's jobs, in Prometheus
/// (OpenMetrics) text.
async fn metrics(State(registry): State<JobRegistry>) -> Response {
    let jobs: Vec<_> = registry.list().iter().map(|s| s.view()).collect();
    let now_ms = cairn::checkpoint::now_ms() as i64;
    let text = crate::prometheus::render(&cairn::metrics::registry().subtasks(), &jobs, now_ms);
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static(crate::prometheus::CONTENT_TYPE),
        )],
        text,
    )
        .into_response()
}

/// An error answer: `{"errors":[message]}` with a status, as Flink's.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(json!({ "errors": [self.message] }))).into_response()
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> Self {
        error!("REST API: cannot encode a response: {e}");
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot encode the response: {e}"),
        )
    }
}

impl From<PathRejection> for ApiError {
    fn from(e: PathRejection) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, e.body_text())
    }
}

impl From<QueryRejection> for ApiError {
    fn from(e: QueryRejection) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, e.body_text())
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> Self {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            return ApiError::new(
                status,
                format!("the request body is larger than {SUBMIT_BODY_MAX} bytes (1 MiB)"),
            );
        }
        ApiError::new(status, e.body_text())
    }
}

type ApiResult = Result<Json<Value>, ApiError>;

fn lookup(registry: &JobRegistry, jid: &str) -> Result<Arc<JobStatus>, ApiError> {
    registry
        .get(jid)
        .ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("job {jid} not found")))
}

async fn cluster_overview(State(registry): State<JobRegistry>) -> Json<Value> {
    let views: Vec<_> = registry.list().iter().map(|s| s.view()).collect();
    Json(body::cluster_overview(&views, registry.resources()))
}

async fn dashboard_config() -> Json<Value> {
    Json(body::dashboard_config())
}

async fn list_jobs(State(registry): State<JobRegistry>) -> ApiResult {
    let jobs = registry
        .list()
        .iter()
        .map(|s| body::job_id_with_status(&s.view()))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(json!({ "jobs": jobs })))
}

async fn jobs_overview(State(registry): State<JobRegistry>) -> ApiResult {
    let now = cairn::checkpoint::now_ms();
    let jobs = registry
        .list()
        .iter()
        .map(|s| body::job_overview(&s.view(), now))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Json(json!({ "jobs": jobs })))
}

async fn submit_job(
    State(registry): State<JobRegistry>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult {
    let Some(submitter) = registry.submitter() else {
        return Err(ApiError::new(StatusCode::NOT_IMPLEMENTED, NO_SUBMITTER));
    };
    let body = body?;
    let invalid = |problem: &dyn std::fmt::Display| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("invalid job submission: {problem}; {SUBMIT_SHAPE}"),
        )
    };
    // Through `Value` so that only an object is accepted (serde would take `[job, args]`).
    let value: Value = serde_json::from_slice(&body).map_err(|e| invalid(&e))?;
    if !value.is_object() {
        return Err(invalid(&"the body is not a JSON object"));
    }
    let request: SubmitRequest = serde_json::from_value(value).map_err(|e| invalid(&e))?;
    if request.job.trim().is_empty() {
        return Err(invalid(&"the job name is empty"));
    }
    if request.params.is_some() && request.args.is_some() {
        return Err(invalid(
            &"give the job's \"params\" or its \"args\", not both",
        ));
    }
    let job = request.job.clone();
    // The submitter may block (plan, deploy): keep it off the thread that serves requests.
    let submitted = tokio::task::spawn_blocking(move || submitter.submit(request)).await;
    match submitted {
        Ok(Ok(jid)) => {
            info!("job {jid} ({job}) submitted through the REST API");
            Ok(Json(json!({ "jobid": jid })))
        }
        Ok(Err(message)) => {
            debug!("submission of job {job} refused: {message}");
            Err(ApiError::new(StatusCode::BAD_REQUEST, message))
        }
        Err(e) => {
            error!("REST API: the submission of job {job} failed: {e}");
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the submission of job {job} failed unexpectedly"),
            ))
        }
    }
}

async fn job_details(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(jid) = jid?;
    let view = lookup(&registry, &jid)?.view();
    let snapshots = cairn::metrics::snapshots_of_job(&view.jid);
    Ok(Json(body::job_details(
        &view,
        &snapshots,
        cairn::checkpoint::now_ms(),
    )?))
}

/// The job's view and the index of its vertex `vid`; 404 for an unknown one.
fn lookup_vertex(
    registry: &JobRegistry,
    jid: &str,
    vid: &str,
) -> Result<(cairn::runtime::JobStatusView, usize), ApiError> {
    let view = lookup(registry, jid)?.view();
    let vi = body::vertex_ids(&view)
        .iter()
        .position(|id| id == vid)
        .ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                format!("job {jid} has no vertex {vid}"),
            )
        })?;
    Ok((view, vi))
}

async fn vertex_details(
    State(registry): State<JobRegistry>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult {
    let Path((jid, vid)) = ids?;
    let (view, vi) = lookup_vertex(&registry, &jid, &vid)?;
    let snapshots = cairn::metrics::snapshots_of_job(&view.jid);
    Ok(Json(body::vertex_details(
        &view,
        vi,
        &vid,
        &snapshots,
        cairn::checkpoint::now_ms(),
    )))
}

async fn vertex_backpressure(
    State(registry): State<JobRegistry>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> ApiResult {
    let Path((jid, vid)) = ids?;
    let (view, vi) = lookup_vertex(&registry, &jid, &vid)?;
    let snapshots = cairn::metrics::snapshots_of_job(&view.jid);
    Ok(Json(body::backpressure(
        &view,
        vi,
        &snapshots,
        cairn::checkpoint::now_ms(),
    )))
}

async fn job_exceptions(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(jid) = jid?;
    let view = lookup(&registry, &jid)?.view();
    Ok(Json(body::exceptions(&view)))
}

async fn job_plan(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(jid) = jid?;
    let view = lookup(&registry, &jid)?.view();
    Ok(Json(body::job_plan(&view)))
}

async fn job_config(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(jid) = jid?;
    let view = lookup(&registry, &jid)?.view();
    Ok(Json(body::job_config(&view)))
}

async fn checkpoints(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(jid) = jid?;
    let view = lookup(&registry, &jid)?.view();
    Ok(Json(body::checkpoints(&view)?))
}

async fn checkpoint_config(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
) -> ApiResult {
    let Path(jid) = jid?;
    let view = lookup(&registry, &jid)?.view();
    Ok(Json(body::checkpoint_config(&view)))
}

#[derive(Debug, Deserialize)]
struct TerminationQuery {
    /// Flink's termination mode; `cancel` (the default) is the only one.
    mode: Option<String>,
}

async fn patch_job(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
    query: Result<Query<TerminationQuery>, QueryRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Path(jid) = jid?;
    let Query(query) = query?;
    match query.mode.as_deref() {
        None | Some("cancel") => {}
        Some(other) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                format!("unsupported termination mode '{other}'; only 'cancel' is supported"),
            ))
        }
    }
    let status = lookup(&registry, &jid)?;
    let state = status.view().state;
    if state.is_ended() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("job {jid} is already {state} and cannot be cancelled"),
        ));
    }
    status.request_cancel();
    info!("cancel of job {jid} requested through the REST API");
    Ok((StatusCode::ACCEPTED, Json(json!({}))))
}

async fn not_found(OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, format!("not found: {}", uri.path()))
}

async fn method_not_allowed(method: Method, OriginalUri(uri): OriginalUri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

/// Lets a request through only with `Authorization: Bearer <token>`.
async fn require_token(State(token): State<Arc<str>>, request: Request, next: Next) -> Response {
    let given = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_token);
    if given.is_some_and(|g| constant_time_eq(token.as_bytes(), g.as_bytes())) {
        return next.run(request).await;
    }
    let mut response =
        ApiError::new(StatusCode::UNAUTHORIZED, "missing or wrong bearer token").into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The token of an `Authorization` value with the `Bearer` scheme (case-insensitive).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
}

/// Compares in time that depends on the length of `expected` only, not on where `given`
/// differs.
fn constant_time_eq(expected: &[u8], given: &[u8]) -> bool {
    let mut diff = u8::from(expected.len() != given.len());
    for (i, e) in expected.iter().enumerate() {
        diff |= e ^ given.get(i).copied().unwrap_or(!e);
    }
    std::hint::black_box(diff) == 0
}

/// The JSON object of a request body (`{}` when empty).
fn json_body(body: &Bytes) -> Result<Value, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    let v: Value = serde_json::from_slice(body)?;
    if !v.is_object() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "the request body must be a JSON object",
        ));
    }
    Ok(v)
}

/// The savepoint directory a request names, else the job's `state.savepoints.dir`.
fn savepoint_dir(status: &JobStatus, named: Option<&Value>) -> Result<PathBuf, ApiError> {
    match named {
        Some(Value::String(dir)) if !dir.is_empty() => {
            Ok(PathBuf::from(dir.strip_prefix("file://").unwrap_or(dir)))
        }
        Some(Value::String(_)) | Some(Value::Null) | None => status
            .view()
            .config
            .iter()
            .find(|(k, v)| k == cairn::config::keys::SAVEPOINTS_DIR && !v.starts_with('('))
            .map(|(_, v)| PathBuf::from(v))
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_REQUEST,
                    "no target directory given and state.savepoints.dir is not set",
                )
            }),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("the target directory must be a string, got {other}"),
        )),
    }
}

/// Requests a savepoint of a running job.
fn request_savepoint(
    registry: &JobRegistry,
    jid: &str,
    dir: Option<&Value>,
    kind: SavepointKind,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let status = lookup(registry, jid)?;
    if status.view().state.is_terminal() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("job {jid} has ended: no savepoint can be taken"),
        ));
    }
    let dir = savepoint_dir(&status, dir)?;
    let request_id = status.request_savepoint(dir, kind, true);
    info!("savepoint {request_id} of job {jid} requested through the REST API ({kind:?})");
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "request-id": request_id })),
    ))
}

/// `POST /jobs/:jid/savepoints` `{"target-directory": DIR, "cancel-job": BOOL}`; a savepoint
/// that cancels the job is a stop-with-savepoint.
async fn trigger_savepoint(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Path(jid) = jid?;
    let body = json_body(&body?)?;
    let kind = if flag(&body, "cancel-job")? {
        SavepointKind::Stop
    } else {
        SavepointKind::Intermediate
    };
    request_savepoint(&registry, &jid, body.get("target-directory"), kind)
}

/// `POST /jobs/:jid/stop` `{"targetDirectory": DIR, "drain": BOOL}`: stop-with-savepoint.
async fn stop_job(
    State(registry): State<JobRegistry>,
    jid: Result<Path<String>, PathRejection>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let Path(jid) = jid?;
    let body = json_body(&body?)?;
    let kind = if flag(&body, "drain")? {
        SavepointKind::StopAndDrain
    } else {
        SavepointKind::Stop
    };
    request_savepoint(&registry, &jid, body.get("targetDirectory"), kind)
}

/// A boolean field of a request body: absent or null is false.
fn flag(body: &Value, name: &str) -> Result<bool, ApiError> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{name} must be true or false, got {other}"),
        )),
    }
}

/// `GET /jobs/:jid/savepoints/:rid`: Flink's asynchronous operation result.
async fn savepoint_status(
    State(registry): State<JobRegistry>,
    ids: Result<Path<(String, String)>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path((jid, rid)) = ids?;
    let status = lookup(&registry, &jid)?;
    let view = status.view();
    let Some(sp) = view.savepoints.iter().find(|s| s.request_id == rid) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("job {jid} has no savepoint request {rid}"),
        ));
    };
    // A stop-with-savepoint completes when the job finished, not before.
    let finished = view.state == cairn::runtime::JobState::Finished;
    match &sp.state {
        SavepointState::Completed { .. } if sp.stop && !finished => Ok(in_progress()),
        SavepointState::InProgress => Ok(in_progress()),
        SavepointState::Completed { location } => {
            status.savepoint_reported(&rid);
            Ok(completed(json!({ "location": location })))
        }
        SavepointState::Failed { cause } => {
            status.savepoint_reported(&rid);
            Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("savepoint {rid} of job {jid} failed: {cause}"),
            ))
        }
    }
}

/// Flink's answer for an asynchronous operation still running.
fn in_progress() -> Json<Value> {
    Json(json!({"status": {"id": "IN_PROGRESS"}}))
}

/// Flink's answer for an asynchronous operation that completed with `operation`.
fn completed(operation: Value) -> Json<Value> {
    Json(json!({"status": {"id": "COMPLETED"}, "operation": operation}))
}

/// `POST /savepoint-disposal` `{"savepoint-path": PATH}`: deletes a savepoint.
async fn dispose_savepoint(
    State(registry): State<JobRegistry>,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    let body = json_body(&body?)?;
    let Some(Value::String(path)) = body.get("savepoint-path") else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            r#"expected {"savepoint-path": PATH}"#,
        ));
    };
    let path = PathBuf::from(path.strip_prefix("file://").unwrap_or(path));
    let request_id = cairn::runtime::status::new_request_id();
    let result = tokio::task::spawn_blocking(move || cairn::checkpoint::dispose_savepoint(&path))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    registry.disposal_ended(request_id.clone(), result.err());
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({ "request-id": request_id })),
    ))
}

/// `GET /savepoint-disposal/:rid`.
async fn disposal_status(
    State(registry): State<JobRegistry>,
    rid: Result<Path<String>, PathRejection>,
) -> Result<Json<Value>, ApiError> {
    let Path(rid) = rid?;
    match registry.disposal(&rid) {
        None => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            format!("no savepoint disposal {rid}"),
        )),
        Some(None) => Ok(completed(json!({}))),
        Some(Some(cause)) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("savepoint disposal failed: {cause}"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer_token("Bearer abc"), Some("abc"));
        assert_eq!(bearer_token("bearer  abc "), Some("abc"));
        assert_eq!(bearer_token("Basic abc"), None);
        assert_eq!(bearer_token("Bearer"), None);
    }

    #[test]
    fn token_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"secret", b"secre"));
        assert!(!constant_time_eq(b"secret", b""));
    }
}
