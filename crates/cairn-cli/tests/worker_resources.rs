//! A worker releases what a job's attempts used when they end: after a hundred jobs its
//! threads and open file descriptors are back to what they were after the first one. And it
//! forgets a job (its failure injector, its counters, its metric series) once the coordinator
//! tells it the job ended.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// Jobs run in all.
const JOBS: usize = 100;
/// Jobs running at the same time.
const AT_ONCE: usize = 5;

/// Submits a small wordcount at parallelism 2 (one subtask of every operator on each worker, so
/// its data crosses the network) writing into `out`; returns its job id.
fn small_job(cluster: &Cluster, out: &std::path::Path) -> String {
    let out = out.display().to_string();
    let job = [
        "wordcount",
        "-p",
        "2",
        "--generate",
        "300",
        "--keys",
        "10",
        "--output",
        &out,
    ];
    submit(cluster.rest, None, &job)
}

/// Waits until every job of `jids` finished (the test fails if one failed).
fn wait_finished(cluster: &mut Cluster, jids: &[String], deadline: Instant) {
    let rest = cluster.rest;
    for jid in jids {
        cluster
            .coordinator
            .wait_until(&format!("job {jid} to finish"), deadline, || {
                let state = rest_job_state(rest, jid);
                assert_ne!(state.as_deref(), Some("FAILED"), "job {jid} failed");
                state.as_deref() == Some("FINISHED")
            });
    }
}

/// Waits until each worker's threads and file descriptors are at most `idle`; returns what
/// they are then.
fn wait_idle(
    cluster: &mut Cluster,
    idle: &[(usize, usize)],
    deadline: Instant,
) -> Vec<(usize, usize)> {
    let mut now = Vec::new();
    for (w, &(threads, fds)) in cluster.workers.iter_mut().zip(idle) {
        let pid = w.pid();
        loop {
            let held = threads_and_fds(pid);
            if held.0 <= threads && held.1 <= fds {
                now.push(held);
                break;
            }
            w.assert_running();
            assert!(
                Instant::now() < deadline,
                "worker {pid} keeps {} threads and {} file descriptors, {threads} and {fds} when idle",
                held.0,
                held.1
            );
            std::thread::park_timeout(Duration::from_millis(10));
        }
    }
    now
}

#[test]
fn a_worker_is_back_to_its_idle_threads_and_sockets_after_a_hundred_jobs() {
    let tmp = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let mut cluster = Cluster::start(&tmp.path().join("ck"), 0, start + Duration::from_secs(20));
    for _ in 0..2 {
        let mut cmd = cluster.worker(1);
        cluster.workers.push(Watched::spawn(&mut cmd));
    }
    for w in &mut cluster.workers {
        w.wait_for_line_containing(
            "registered with the coordinator",
            start + Duration::from_secs(20),
        );
    }

    // The first job starts what a worker keeps for good (a metrics thread, for one); once both
    // workers released its attempt, what they hold is their idle state.
    let first = small_job(&cluster, &tmp.path().join("out-0"));
    wait_finished(
        &mut cluster,
        std::slice::from_ref(&first),
        start + Duration::from_secs(60),
    );
    let released = format!("of job {first}");
    let mut idle = Vec::new();
    for w in &mut cluster.workers {
        while !w
            .wait_for_line_containing(&released, start + Duration::from_secs(60))
            .contains("released attempt")
        {}
        idle.push(threads_and_fds(w.pid()));
    }

    let mut done = 1;
    while done < JOBS {
        let batch: Vec<String> = (done..(done + AT_ONCE).min(JOBS))
            .map(|k| small_job(&cluster, &tmp.path().join(format!("out-{k}"))))
            .collect();
        wait_finished(
            &mut cluster,
            &batch,
            Instant::now() + Duration::from_secs(60),
        );
        done += batch.len();
    }
    // Each job's attempt used a data connection each way, a thread reading each, its subtasks'
    // threads and an events thread on every worker: a job's worth of leak is several of each.
    let after = wait_idle(
        &mut cluster,
        &idle,
        Instant::now() + Duration::from_secs(20),
    );
    eprintln!(
        "{JOBS} jobs in {:?}; (threads, fds) per worker idle {idle:?}, after them {after:?}",
        start.elapsed()
    );
    for k in 0..JOBS {
        let expected = generated_counts(300, 10);
        assert_exactly_once(&tmp.path().join(format!("out-{k}")), &expected);
    }
}

/// Every worker that ran a job forgets it when the job ends — finished, or cancelled while
/// it runs — because the coordinator tells every live worker (`ToWorker::JobEnded`).
#[test]
fn a_worker_forgets_a_job_once_it_ended() {
    let tmp = tempfile::tempdir().unwrap();
    let start = Instant::now();
    let deadline = start + Duration::from_secs(60);
    let mut cluster = Cluster::start(&tmp.path().join("ck"), 0, deadline);
    for _ in 0..2 {
        let mut cmd = cluster.worker(1);
        cluster.workers.push(Watched::spawn(&mut cmd));
    }
    for w in &mut cluster.workers {
        w.wait_for_line_containing("registered with the coordinator", deadline);
    }

    let finished = small_job(&cluster, &tmp.path().join("out-finished"));
    wait_finished(&mut cluster, std::slice::from_ref(&finished), deadline);
    for w in &mut cluster.workers {
        w.wait_for_line_containing(&format!("forgot job {finished}"), deadline);
    }

    // A job throttled to run for minutes, cancelled once it runs on both workers.
    let out = tmp.path().join("out-cancelled").display().to_string();
    let job = [
        "wordcount",
        "-p",
        "2",
        "--generate",
        "1000000",
        "--rate",
        "1000",
        "--output",
        &out,
    ];
    let cancelled = submit(cluster.rest, None, &job);
    for w in &mut cluster.workers {
        w.wait_for_line_containing(&format!("attempt 0 of job {cancelled}"), deadline);
    }
    run_ok(cairn().args([
        "cancel",
        "--rest",
        &format!("http://{}", cluster.rest),
        &cancelled,
    ]));
    let rest = cluster.rest;
    cluster
        .coordinator
        .wait_until("the job to be cancelled", deadline, || {
            rest_job_state(rest, &cancelled).as_deref() == Some("CANCELED")
        });
    for w in &mut cluster.workers {
        w.wait_for_line_containing(&format!("forgot job {cancelled}"), deadline);
    }
    cluster.assert_running();
}
