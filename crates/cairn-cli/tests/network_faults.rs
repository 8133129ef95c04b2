//! Network faults between cluster processes, made by a TCP proxy the test controls (see
//! `common::Proxy`): a stalled link (open, silent), a reset one and a slow one, between a worker
//! and the coordinator and between two workers. A wordcount at parallelism 2 across the two
//! workers fails over where the fault must make it, and ends with exactly the output of an
//! undisturbed run; the workers stay registered and serve on. Also a worker pointed at the
//! coordinator's REST port, which answers in HTTP.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use common::*;

/// Words of the job and distinct words.
const WORDS: u64 = 30_000;
const KEYS: u64 = 50;

/// Where the proxy sits.
#[derive(Debug, Clone, Copy)]
enum Link {
    /// Between the first worker and the coordinator.
    Control,
    /// In front of the first worker's data port: what the second worker sends it.
    Data,
}

/// What the test does to the proxied link once the job checkpointed.
#[derive(Debug, Clone, Copy)]
enum Trouble {
    Stall,
    Reset,
    Slow,
}

/// A coordinator and two workers of one slot each, the first one's `path` through a proxy.
struct FaultyCluster {
    cluster: Cluster,
    proxy: Proxy,
}

fn faulty_cluster(ck: &Path, path: Link, deadline: Instant) -> FaultyCluster {
    let mut cluster = Cluster::start_with(ck, 0, &["--heartbeat-timeout", "1s"], deadline);
    let proxy = Proxy::unaimed();
    let mut first = match path {
        Link::Control => {
            proxy.aim(&cluster.bind);
            let mut cmd = cairn();
            cmd.args(["worker", "--slots", "1", "--coordinator"])
                .arg(proxy.addr().to_string());
            Watched::spawn(&mut cmd)
        }
        Link::Data => {
            let mut cmd = cluster.worker(1);
            cmd.args(["--data-advertise", &proxy.addr().to_string()]);
            Watched::spawn(&mut cmd)
        }
    };
    if let Link::Data = path {
        let line = first.wait_for_line_containing("listening for data on ", deadline);
        let (_, rest) = line.split_once("listening for data on ").unwrap();
        let bound = rest.split_once(',').unwrap().0;
        proxy.aim(bound);
    }
    first.wait_for_line_containing("registered with the coordinator", deadline);
    let mut second = Watched::spawn(&mut cluster.worker(1));
    second.wait_for_line_containing("registered with the coordinator", deadline);
    cluster.workers = vec![first, second];
    FaultyCluster { cluster, proxy }
}

/// Submits the wordcount: parallelism 2, its source throttled so that it runs for seconds,
/// frequent checkpoints that time out after `checkpoint_timeout`, restarts without end or
/// delay.
fn submit_job(cluster: &Cluster, out: &Path, checkpoint_timeout: &str) -> String {
    let out = out.display().to_string();
    let checkpoint_timeout = format!("execution.checkpointing.timeout={checkpoint_timeout}");
    let words = WORDS.to_string();
    let keys = KEYS.to_string();
    let job = [
        "wordcount",
        "-p",
        "2",
        "--generate",
        &words,
        "--keys",
        &keys,
        "--rate",
        "5000",
        "--output",
        &out,
        "--checkpoint-interval",
        "200ms",
        "-D",
        &checkpoint_timeout,
        "-D",
        "restart-strategy.type=fixed-delay",
        "-D",
        "restart-strategy.fixed-delay.attempts=1000",
        "-D",
        "restart-strategy.fixed-delay.delay=100ms",
    ];
    submit(cluster.rest, None, &job)
}

/// Live workers, as `GET /overview` of the REST API at `rest` says.
fn live_workers(rest: std::net::SocketAddr) -> Option<u64> {
    rest_json(rest, "/overview")?["taskmanagers"].as_u64()
}

fn run(path: Link, trouble: Trouble) {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let start = Instant::now();
    let FaultyCluster { mut cluster, proxy } =
        faulty_cluster(&ck, path, start + Duration::from_secs(30));
    let out = tmp.path().join("out");
    // A data link's faults must be noticed by the link itself (its keepalives and read
    // timeouts), not by a checkpoint that times out: that one takes ten minutes here.
    let checkpoint_timeout = match path {
        Link::Control => "2s",
        Link::Data => "10min",
    };
    let jid = submit_job(&cluster, &out, checkpoint_timeout);
    let rest = cluster.rest;
    cluster
        .coordinator
        .wait_for_a_checkpoint(&ck, start + Duration::from_secs(40));
    let restarts = || rest_job_restarts(rest, &jid).unwrap_or(0);
    let must_restart = !matches!(trouble, Trouble::Slow);
    let stats = proxy.stats();
    let before = stats.forwarded.load(Relaxed);
    assert!(before > 0, "nothing went through the proxy");
    match trouble {
        Trouble::Stall => {
            proxy.set(Fault::Stall);
            cluster.coordinator.wait_until(
                "a restart while the link stalls",
                start + Duration::from_secs(60),
                || restarts() >= 1,
            );
            assert!(
                stats.held.load(Relaxed) > 0,
                "the stalled proxy held nothing"
            );
            if let Link::Data = path {
                // The first end to give the silent link up says why (the other may then see
                // it closed).
                let silent = "closed: no data or keepalive for 1s";
                let workers = &mut cluster.workers;
                cluster.coordinator.wait_until(
                    "a worker to give the silent data link up",
                    start + Duration::from_secs(60),
                    || {
                        workers
                            .iter_mut()
                            .any(|w| w.stderr_so_far().contains(silent))
                    },
                );
            }
            proxy.set(Fault::Pass);
        }
        Trouble::Reset => {
            proxy.reset();
            assert!(stats.reset.load(Relaxed) > 0, "no connection to reset");
            cluster.coordinator.wait_until(
                "a restart after the reset",
                start + Duration::from_secs(60),
                || restarts() >= 1,
            );
        }
        Trouble::Slow => proxy.set(Fault::Slow {
            chunk: 512,
            delay: Duration::from_millis(1),
        }),
    }
    let deadline = start + Duration::from_secs(120);
    cluster
        .coordinator
        .wait_until("the job to finish", deadline, || {
            let state = rest_job_state(rest, &jid);
            assert_ne!(state.as_deref(), Some("FAILED"), "the job failed");
            state.as_deref() == Some("FINISHED")
        });
    if matches!(trouble, Trouble::Slow) {
        assert!(
            stats.slowed.load(Relaxed) > 0,
            "nothing crossed the slow link"
        );
    }
    // No worker froze: both are (again) registered and heartbeating.
    cluster
        .coordinator
        .wait_until("both workers to be live", deadline, || {
            live_workers(rest) == Some(2)
        });
    cluster.assert_running();
    let restarted = restarts();
    eprintln!(
        "{path:?} {trouble:?}: {restarted} restarts, {:?}",
        start.elapsed()
    );
    if must_restart {
        assert!(restarted >= 1, "the fault did not make the job fail over");
    }
    assert_exactly_once(&out, &generated_counts(WORDS, KEYS));
    assert_no_leftovers(&out);
}

#[test]
fn a_stalled_control_link_fails_the_worker_over_and_it_comes_back() {
    run(Link::Control, Trouble::Stall);
}

#[test]
fn a_reset_control_link_fails_the_worker_over_and_it_comes_back() {
    run(Link::Control, Trouble::Reset);
}

#[test]
fn a_slow_control_link_still_gives_exact_output() {
    run(Link::Control, Trouble::Slow);
}

#[test]
fn a_stalled_data_link_fails_the_job_over() {
    run(Link::Data, Trouble::Stall);
}

#[test]
fn a_reset_data_link_fails_the_job_over() {
    run(Link::Data, Trouble::Reset);
}

#[test]
fn a_slow_data_link_still_gives_exact_output() {
    run(Link::Data, Trouble::Slow);
}

/// A worker pointed at the REST port says once that it answers in HTTP, and retries with a
/// growing pause instead of logging five times a second.
#[test]
fn a_worker_dialling_the_rest_port_names_http_once() {
    let tmp = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let cluster = Cluster::start(&tmp.path().join("ck"), 0, deadline);
    // The proxy counts the worker's attempts to connect.
    let proxy = Proxy::start(&cluster.rest.to_string());
    let mut cmd = cairn();
    cmd.args(["worker", "--coordinator"])
        .arg(proxy.addr().to_string());
    let mut worker = Watched::spawn(&mut cmd);
    let line = worker.wait_for_line_containing("answered in HTTP", deadline);
    assert!(
        line.contains(&format!(
            "coordinator at {} answered in HTTP: is this the REST port? workers connect to the coordinator's --bind port",
            proxy.addr()
        )),
        "{line}"
    );
    // Pauses of 0.2, 0.4, 0.8 and 1.6 s: five attempts take about three seconds.
    worker.wait_until("five attempts to connect", deadline, || {
        proxy.stats().connections.load(Relaxed) >= 5
    });
    let stderr = worker.stderr_so_far();
    assert_eq!(
        stderr.matches("answered in HTTP").count(),
        1,
        "HTTP named more than once:\n{stderr}"
    );
    assert!(!stderr.contains("exceeds the limit"), "{stderr}");
}

/// Heartbeats both ways: with the link between a worker and the coordinator stalled (open,
/// silent), the coordinator declares the worker dead and the worker gives the coordinator up
/// — neither waits for the operating system — and once the link passes again the worker is
/// back.
#[test]
fn a_stalled_coordinator_link_is_noticed_on_both_sides() {
    let tmp = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let FaultyCluster { mut cluster, proxy } =
        faulty_cluster(&tmp.path().join("ck"), Link::Control, deadline);
    proxy.set(Fault::Stall);
    cluster.workers[0].wait_for_line_containing(
        "lost the coordinator (no heartbeat from the coordinator for 1s)",
        deadline,
    );
    cluster
        .coordinator
        .wait_for_line_containing("missed its heartbeats", deadline);
    proxy.set(Fault::Pass);
    let rest = cluster.rest;
    cluster
        .coordinator
        .wait_until("both workers to be live", deadline, || {
            live_workers(rest) == Some(2)
        });
}

/// A listener whose accept queue is full: a connect to it gets no answer at all (its SYNs are
/// dropped), as with a host that vanished from the network.
fn unanswering_address() -> (
    socket2::Socket,
    Vec<std::net::TcpStream>,
    std::net::SocketAddr,
) {
    use socket2::{Domain, Socket, Type};
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
    socket
        .bind(
            &"127.0.0.1:0"
                .parse::<std::net::SocketAddr>()
                .unwrap()
                .into(),
        )
        .unwrap();
    socket.listen(0).unwrap();
    let addr = socket.local_addr().unwrap().as_socket().unwrap();
    let mut queued = Vec::new();
    loop {
        match std::net::TcpStream::connect_timeout(&addr, Duration::from_millis(500)) {
            Ok(s) => queued.push(s),
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
                break;
            }
        }
        assert!(queued.len() < 16, "the accept queue does not fill");
    }
    (socket, queued, addr)
}

/// A coordinator and two workers; the first advertises `nowhere` (see [`unanswering_address`])
/// as its data address, the second has `second_slots` slots.
fn cluster_with_an_unanswering_peer(
    ck: &Path,
    nowhere: std::net::SocketAddr,
    second_slots: u32,
    deadline: Instant,
) -> (Cluster, Watched, Watched) {
    let cluster = Cluster::start_with(ck, 0, &["--heartbeat-timeout", "1s"], deadline);
    let mut cmd = cluster.worker(1);
    cmd.args(["--data-advertise", &nowhere.to_string()]);
    let mut first = Watched::spawn(&mut cmd);
    first.wait_for_line_containing("registered with the coordinator", deadline);
    let mut second = Watched::spawn(&mut cluster.worker(second_slots));
    second.wait_for_line_containing("registered with the coordinator", deadline);
    (cluster, first, second)
}

/// A worker whose peer's data address does not answer gives up connecting after its connect
/// timeout (the deployment fails and the job is restarted) instead of hanging in the connect
/// for the minutes the operating system would wait.
#[test]
fn a_connect_to_an_unanswering_peer_times_out() {
    let tmp = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (_listener, _queued, nowhere) = unanswering_address();
    let (mut cluster, first, mut second) =
        cluster_with_an_unanswering_peer(&tmp.path().join("ck"), nowhere, 1, deadline);
    let out = tmp.path().join("out").display().to_string();
    let job = [
        "wordcount",
        "-p",
        "2",
        "--generate",
        "1000",
        "--output",
        &out,
    ];
    let started = Instant::now();
    submit(cluster.rest, None, &job);
    // The connect timeout is 5 s; the operating system's own, some two minutes.
    let line = second.wait_for_line_containing(
        &format!("at {nowhere}: connection timed out"),
        started + Duration::from_secs(75),
    );
    assert!(line.contains("cannot connect to worker"), "{line}");
    cluster.workers = vec![first, second];
    cluster.assert_running();
}

/// While a deployment hangs in a connect to a peer that does not answer, the worker's control
/// thread goes on: the worker stays live (heartbeats flow) and it checks, deploys and runs
/// another job meanwhile — before the hanging connect gives up.
#[test]
fn a_hanging_connect_does_not_hold_the_worker_control_thread() {
    let tmp = tempfile::tempdir().unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    let (_listener, _queued, nowhere) = unanswering_address();
    // The second worker has two slots: one for the job that hangs, one for the job it must
    // still serve.
    let (mut cluster, first, second) =
        cluster_with_an_unanswering_peer(&tmp.path().join("ck"), nowhere, 2, deadline);
    cluster.workers = vec![first, second];

    let out = tmp.path().join("out-hanging").display().to_string();
    let hanging = submit(
        cluster.rest,
        None,
        &[
            "wordcount",
            "-p",
            "2",
            "--generate",
            "1000",
            "--output",
            &out,
        ],
    );
    // The deployment is on its way to the second worker, ahead of anything sent to it later.
    cluster.coordinator.wait_for_line_containing(
        &format!("job {hanging}: attempt 0 deployed on workers [1, 2]"),
        deadline,
    );
    let out = tmp.path().join("out-served");
    let served = submit(
        cluster.rest,
        None,
        &[
            "wordcount",
            "-p",
            "1",
            "--generate",
            "300",
            "--keys",
            "10",
            "--output",
            &out.display().to_string(),
        ],
    );
    let rest = cluster.rest;
    cluster
        .coordinator
        .wait_until("the second job to finish", deadline, || {
            let state = rest_job_state(rest, &served);
            assert_ne!(state.as_deref(), Some("FAILED"), "the second job failed");
            state.as_deref() == Some("FINISHED")
        });
    assert_eq!(live_workers(rest), Some(2));
    // The second worker ran the second job before the first job's connect gave up (its connect
    // timeout is 5 s), as its own log's times say.
    let second = &mut cluster.workers[1];
    let logged_at = |stderr: &str, needle: &str| {
        let line = stderr.lines().find(|l| l.contains(needle))?;
        line.split_whitespace().next().map(str::to_string)
    };
    let (ran, gave_up) = loop {
        let stderr = second.stderr_so_far();
        let ran = logged_at(&stderr, &format!("running attempt 0 of job {served}"));
        let gave_up = logged_at(&stderr, &format!("at {nowhere}: connection timed out"));
        if let (Some(ran), Some(gave_up)) = (ran, gave_up) {
            break (ran, gave_up);
        }
        second.assert_running();
        assert!(
            Instant::now() < deadline,
            "no end of both deployments:\n{stderr}"
        );
        std::thread::park_timeout(Duration::from_millis(5));
    };
    assert!(
        ran < gave_up,
        "the second job ran at {ran}, only after the hanging connect gave up at {gave_up}:\n{}",
        second.stderr_so_far()
    );
    let coordinator = cluster.coordinator.stderr_so_far();
    assert!(
        !coordinator.contains("missed its heartbeats"),
        "{coordinator}"
    );
    cluster.assert_running();
    assert_exactly_once(&out, &generated_counts(300, 10));
}
