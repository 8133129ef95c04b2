//! `cairn coordinator` and `cairn worker`: cluster mode processes.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use cairn::cluster::coordinator::{Coordinator, CoordinatorOptions};
use cairn::cluster::leader::{Candidate, Leadership};
use cairn::cluster::worker::{run_worker, Leave, WorkerOptions};
use cairn::cluster::{InjectRequest, JobSubmission};
use cairn::config::{parse_duration, JobConfig};
use cairn_rest::{ClusterResources, JobRegistry, JobSubmitter, Resources, SubmitRequest};
use clap::{Args, FromArgMatches};
use nix::sys::signal::{SigSet, Signal};
use serde_json::Value;

use crate::job::Jobs;
use crate::run::JobOptions;

/// How long a worker that was told to leave (SIGTERM) waits for its coordinator to close
/// the connection before it exits anyway.
const LEAVE_GRACE: Duration = Duration::from_secs(5);

/// Default cluster secret: fine on one machine; set `--secret` (or CAIRN_SECRET) elsewhere.
const DEFAULT_SECRET: &str = "cairn";

#[derive(Args, Debug)]
pub struct CoordinatorArgs {
    /// Address workers connect to: HOST:PORT, or PORT on 127.0.0.1.
    #[arg(long, default_value = "127.0.0.1:6123")]
    bind: String,
    /// Address of the REST API: HOST:PORT, or PORT on 127.0.0.1.
    #[arg(long, default_value = "127.0.0.1:8081")]
    rest: String,
    /// Require `Authorization: Bearer TOKEN` on every REST request.
    #[arg(long, value_name = "TOKEN")]
    rest_token: Option<String>,
    /// Checkpoint directory shared by all processes (jobs are resumed from it after a restart).
    #[arg(long, value_name = "DIR")]
    checkpoint_dir: PathBuf,
    /// Cluster secret workers must present (also CAIRN_SECRET).
    #[arg(long, env = "CAIRN_SECRET", default_value = DEFAULT_SECRET, hide_env_values = true)]
    secret: String,
    /// A worker whose heartbeats stop for this long is declared dead.
    #[arg(long, default_value = "2s")]
    heartbeat_timeout: String,
    /// How long a (re)deployment waits for enough free task slots.
    #[arg(long, default_value = "30s")]
    slot_wait: String,
    /// How many ended jobs are kept and listed, with their state and cause (Flink's jobstore.max-capacity); older ones are forgotten, their records stay in --checkpoint-dir.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    jobstore_max_capacity: usize,
    /// The leader's lease: coordinators sharing --checkpoint-dir elect one leader; the others
    /// stand by and take over once the leader has not renewed its lease for this long. Must
    /// exceed --heartbeat-timeout.
    #[arg(long, default_value = "3s")]
    leader_lease: String,
}

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// Coordinator address: HOST:PORT, or PORT on 127.0.0.1; several, comma-separated, for a
    /// leader and its standbys (the worker registers with whichever leads).
    #[arg(long, default_value = "127.0.0.1:6123")]
    coordinator: String,
    /// Task slots (one subtask of every operator per slot).
    #[arg(long, default_value_t = 2)]
    slots: u32,
    /// Cluster secret (also CAIRN_SECRET).
    #[arg(long, env = "CAIRN_SECRET", default_value = DEFAULT_SECRET, hide_env_values = true)]
    secret: String,
    /// Address to listen on for data from other workers: HOST:PORT, or PORT on 127.0.0.1.
    #[arg(long, default_value = "127.0.0.1:0")]
    data_bind: String,
    /// The address other workers dial for this worker's data, if not the bound one (a proxy,
    /// a NAT, another interface).
    #[arg(long, value_name = "HOST:PORT")]
    data_advertise: Option<String>,
    /// Time between heartbeats.
    #[arg(long, default_value = "500ms")]
    heartbeat_interval: String,
    /// Serve this worker's subtask metrics at http://ADDR/metrics (Prometheus text): HOST:PORT,
    /// or PORT on 127.0.0.1.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

fn duration(flag: &str, value: &str) -> Result<Duration> {
    parse_duration(value).map_err(|e| anyhow!("invalid value '{value}' for {flag}: {e}"))
}

/// An address flag's value: `HOST:PORT`, or a bare `PORT` (or `:PORT`) on 127.0.0.1, as the
/// client commands read `--rest PORT`.
fn host_port(value: &str) -> String {
    let t = value.trim();
    match t.strip_prefix(':').unwrap_or(t).parse::<u16>() {
        Ok(port) => format!("127.0.0.1:{port}"),
        Err(_) => t.to_string(),
    }
}

fn socket_addr(flag: &str, value: &str) -> Result<SocketAddr> {
    host_port(value)
        .to_socket_addrs()
        .with_context(|| format!("invalid address '{value}' for {flag}"))?
        .next()
        .ok_or_else(|| anyhow!("invalid address '{value}' for {flag}"))
}

struct Submitter {
    coordinator: Coordinator,
    registry: JobRegistry,
    jobs: Jobs,
}

impl JobSubmitter for Submitter {
    fn submit(&self, request: SubmitRequest) -> std::result::Result<String, String> {
        let submission = submission(&self.jobs, request)?;
        let status = self.coordinator.submit(submission, None)?;
        let jid = status.view().jid;
        self.registry.register(status);
        Ok(jid)
    }
}

/// A REST submission as the data every process of the cluster runs: the job's parameters
/// (given as JSON, or as the job's flags, parsed here by the job's own command line), its
/// configuration (the file's text, the flags' keys, then `config`), where it starts and the
/// failures to inject.
fn submission(jobs: &Jobs, request: SubmitRequest) -> std::result::Result<JobSubmission, String> {
    let job = jobs.find(&request.job)?;
    let (params, mut options) = match (request.params, request.args) {
        (Some(_), Some(_)) => return Err("give the job's params or its args, not both".into()),
        (Some(params), None) => (params, JobOptions::default()),
        (None, Some(args)) => {
            let cmd = crate::submit_job_command(job.as_ref()).no_binary_name(true);
            let matches = cmd
                .try_get_matches_from(&args)
                .map_err(|e| e.to_string().lines().next().unwrap_or_default().to_string())?;
            let options = JobOptions::from_arg_matches(&matches).map_err(|e| e.to_string())?;
            (job.params_from(&matches)?, options)
        }
        (None, None) => (Value::Object(Default::default()), JobOptions::default()),
    };
    options.set_first(job.config(&params)?);
    let yaml = match (&request.config_yaml, &options.config) {
        (Some(text), _) => Some(text.clone()),
        (None, Some(path)) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| format!("cannot read configuration file {}: {e}", path.display()))?,
        ),
        (None, None) => None,
    };
    let mut config = match yaml {
        Some(text) => JobConfig::from_yaml_str(&text).map_err(|e| e.to_string())?,
        None => JobConfig::default(),
    };
    let mut pairs = options.config_pairs().map_err(|e| e.to_string())?;
    pairs.extend(request.config);
    config.set_all(pairs).map_err(|e| e.to_string())?;
    config.validate().map_err(|e| e.to_string())?;
    let inject_uid = request.inject_uid.or(options.inject_uid);
    let inject = request
        .inject_failures
        .or(options.inject_failures)
        .map(|count| InjectRequest {
            count,
            uid_prefix: inject_uid.clone(),
        });
    if inject.is_none() && inject_uid.is_some() {
        return Err("inject_uid needs inject_failures".into());
    }
    Ok(JobSubmission {
        job: request.job,
        params,
        config,
        from_job: request.from_job.or(options.from_job),
        from: request.from.or(options.from),
        inject,
        seed: request.seed.unwrap_or(options.seed),
    })
}

/// One `--coordinator` address, `HOST:PORT` or a bare `PORT`: checked for its form, not
/// resolved — a coordinator's name may not resolve yet (a Kubernetes pod not yet started);
/// the worker resolves it at every attempt to connect.
fn coordinator_address(value: &str) -> Result<String> {
    let address = host_port(value);
    let valid = address
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0));
    if !valid {
        bail!("invalid address '{value}' for --coordinator: expected HOST:PORT or PORT");
    }
    Ok(address)
}

/// The coordinator's live workers and their slots, for `GET /overview`.
struct Workers(Coordinator);

impl ClusterResources for Workers {
    fn resources(&self) -> Resources {
        Resources {
            workers: u32::try_from(self.0.workers()).unwrap_or(u32::MAX),
            slots: self.0.slots(),
            reserved: self.0.slots_reserved().1,
        }
    }
}

/// Blocks SIGINT and SIGTERM in this thread (and the threads it starts from now on), for one
/// thread to take them with `SigSet::wait`.
fn block_stop_signals() -> Result<SigSet> {
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGINT);
    signals.add(Signal::SIGTERM);
    signals
        .thread_block()
        .context("cannot block SIGINT and SIGTERM for their handler")?;
    Ok(signals)
}

pub(crate) fn coordinator(args: CoordinatorArgs, jobs: Jobs) -> Result<()> {
    // Before any thread starts, so that every thread inherits the blocked signals and this
    // one takes them.
    let signals = block_stop_signals()?;
    let heartbeat_timeout = duration("--heartbeat-timeout", &args.heartbeat_timeout)?;
    let slot_wait = duration("--slot-wait", &args.slot_wait)?;
    let rest_addr = socket_addr("--rest", &args.rest)?;
    std::fs::create_dir_all(&args.checkpoint_dir).with_context(|| {
        format!(
            "cannot create checkpoint directory {}",
            args.checkpoint_dir.display()
        )
    })?;
    let checkpoint_dir = args.checkpoint_dir.canonicalize().with_context(|| {
        format!(
            "cannot open checkpoint directory {}",
            args.checkpoint_dir.display()
        )
    })?;
    let leadership = lead(&args, &checkpoint_dir, heartbeat_timeout, rest_addr)?;
    let coordinator = Coordinator::start(CoordinatorOptions {
        bind: host_port(&args.bind),
        checkpoint_dir,
        secret: args.secret.clone(),
        factory: Arc::new(jobs.clone()),
        heartbeat_timeout,
        slot_wait,
        history: args.jobstore_max_capacity,
        leadership: Some(leadership.clone()),
    })
    .map_err(|e| anyhow!(e))?;
    {
        let coordinator = coordinator.clone();
        let epoch = leadership.epoch();
        leadership
            .keep(move |why| {
                // Nothing it writes counts any more: its jobs are the new leader's to resume.
                let suspended = coordinator.suspend(&format!(
                    "this coordinator lost leadership ({why}); the leader resumes the job"
                ));
                tracing::error!("lost leadership of epoch {epoch}: {why}");
                eprintln!(
                    "coordinator lost leadership of epoch {epoch}: {why}; {suspended} job(s) suspended here; exiting"
                );
                std::process::exit(1);
            })
            .map_err(|e| anyhow!(e))?;
    }
    let registry = JobRegistry::new();
    let forget = registry.clone();
    coordinator.on_forget(move |jid| forget.remove(jid));
    registry.set_submitter(Arc::new(Submitter {
        coordinator: coordinator.clone(),
        registry: registry.clone(),
        jobs,
    }));
    registry.set_resources(Arc::new(Workers(coordinator.clone())));
    // The recorded jobs first, so that the REST API lists every one from its first answer.
    for status in coordinator.resume_recorded_jobs() {
        registry.register(status);
    }
    let server = cairn_rest::serve(rest_addr, registry.clone(), args.rest_token.clone())?;
    eprintln!(
        "coordinator listening for workers on {}, REST API on http://{}",
        coordinator.local_addr(),
        server.local_addr()
    );
    // SIGINT or SIGTERM: the jobs that have not ended are SUSPENDED (not recorded as ended),
    // so a coordinator started on the same checkpoint directory resumes them.
    let signal = signals.wait().context("cannot wait for signals")?;
    let suspended = coordinator.suspend(&format!(
        "the coordinator stopped on {signal}; a coordinator started on the same --checkpoint-dir resumes the job"
    ));
    // A standby takes over at once.
    leadership.release();
    eprintln!(
        "coordinator stopped on {signal}: {suspended} job(s) suspended; `cairn coordinator --checkpoint-dir {}` resumes them",
        args.checkpoint_dir.display()
    );
    Ok(())
}

/// Waits until this coordinator leads the coordinators sharing `checkpoint_dir`, saying who
/// leads meanwhile.
/// A standby serves `/healthz`, `/readyz` (503) and a 503 naming the leader on its REST
/// port meanwhile.
fn lead(
    args: &CoordinatorArgs,
    checkpoint_dir: &std::path::Path,
    heartbeat_timeout: Duration,
    rest_addr: SocketAddr,
) -> Result<Arc<Leadership>> {
    let lease = duration("--leader-lease", &args.leader_lease)?;
    if lease <= heartbeat_timeout {
        bail!(
            "--leader-lease {} must exceed --heartbeat-timeout {}: a standby takes over only after the workers have let a paused leader go",
            args.leader_lease,
            args.heartbeat_timeout
        );
    }
    let candidate = Candidate {
        checkpoint_dir: checkpoint_dir.to_path_buf(),
        bind: host_port(&args.bind),
        rest: host_port(&args.rest),
        lease,
        same_host_takeover: true,
    };
    let leader = Arc::new(std::sync::Mutex::new(String::from(
        "standing by: looking for the leader",
    )));
    let standing_by = {
        let leader = leader.clone();
        Arc::new(move || leader.lock().map(|l| l.clone()).unwrap_or_default())
    };
    let standby_server = cairn_rest::serve_standby(rest_addr, standing_by)?;
    let leadership = Leadership::acquire(&candidate, |claim| {
        let line = format!(
            "standing by: the coordinator at {} (pid {}) leads as epoch {}; taking over when its lease of {} ms lapses",
            claim.bind, claim.pid, claim.epoch, claim.lease_ms
        );
        eprintln!("{line}");
        if let Ok(mut l) = leader.lock() {
            *l = format!("{line} (its REST API: http://{})", claim.rest);
        }
    })
    .map_err(|e| anyhow!(e))?;
    // The port is the leader's REST API from now on.
    standby_server.shutdown();
    eprintln!(
        "leading the coordinators on {} as epoch {}",
        checkpoint_dir.display(),
        leadership.epoch()
    );
    Ok(leadership)
}

pub(crate) fn worker(args: WorkerArgs, jobs: Jobs) -> Result<()> {
    if args.slots == 0 {
        bail!("--slots must be at least 1");
    }
    // Before any thread starts, so that every thread inherits the blocked signals and the
    // leaving thread takes them.
    let signals = block_stop_signals()?;
    let leave = Arc::new(Leave::default());
    {
        let leave = leave.clone();
        std::thread::Builder::new()
            .name("leave-on-signal".into())
            .spawn(move || {
                let Ok(signal) = signals.wait() else {
                    return;
                };
                // Its subtasks fail over without spending the jobs' restart budgets; the
                // worker ends once the coordinator closed the connection.
                if leave.request() {
                    eprintln!("worker leaving on {signal}: the coordinator fails its subtasks over");
                    std::thread::sleep(LEAVE_GRACE);
                    eprintln!("worker left on {signal} without an answer from the coordinator within {LEAVE_GRACE:?}");
                } else {
                    eprintln!("worker stopped on {signal} (not registered with a coordinator)");
                }
                std::process::exit(0);
            })
            .context("cannot start the signal handler")?;
    }
    let heartbeat_interval = duration("--heartbeat-interval", &args.heartbeat_interval)?;
    let coordinators: Vec<String> = args
        .coordinator
        .split(',')
        .map(|a| coordinator_address(a.trim()))
        .collect::<Result<_>>()?;
    let registered = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let ready = {
        let registered = registered.clone();
        Arc::new(move || {
            if registered.load(std::sync::atomic::Ordering::Acquire) {
                Ok(())
            } else {
                Err("not registered with a coordinator".to_string())
            }
        })
    };
    let _metrics = match &args.metrics {
        Some(addr) => {
            let server = cairn_rest::serve_metrics(socket_addr("--metrics", addr)?, ready)?;
            eprintln!("worker metrics at http://{}/metrics", server.local_addr());
            Some(server)
        }
        None => None,
    };
    run_worker(WorkerOptions {
        coordinators,
        slots: args.slots,
        secret: args.secret,
        data_bind: host_port(&args.data_bind),
        data_advertise: args.data_advertise,
        factory: Arc::new(jobs),
        heartbeat_interval,
        registered,
        leave,
    })
    .map_err(|e| anyhow!(e))
}
