//! `cairn run` stopped by Ctrl-C (SIGINT) or SIGTERM: the job is cancelled, the run prints its
//! summary and, when a checkpoint completed and was kept, the command that resumes it (when
//! cancelling deleted the checkpoints, how to keep them); the exit code is 128 + the signal's
//! number, as a shell reports a process the signal ended.

mod common;

use std::time::{Duration, Instant};

use common::{cairn, Watched};

const DEADLINE: Duration = Duration::from_secs(120);

/// An endless wordcount with a REST API on a port the system picks, plus `extra` flags.
fn endless_run(extra: &[&str]) -> Watched {
    Watched::spawn(
        cairn()
            .args([
                "run",
                "wordcount",
                "--generate",
                "1000000000",
                "--rate",
                "100000",
                "--discard",
                "--rest",
                "127.0.0.1:0",
            ])
            .args(extra),
    )
}

#[test]
fn ctrl_c_prints_the_summary_and_the_command_that_resumes_the_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let deadline = Instant::now() + DEADLINE;
    let ck_text = ck.display().to_string();
    let retain = "execution.checkpointing.externalized-checkpoint-retention=RETAIN_ON_CANCELLATION";
    let mut run = endless_run(&[
        "--checkpoint-interval",
        "100ms",
        "--checkpoint-dir",
        &ck_text,
        "-D",
        retain,
    ]);
    let addr = run.rest_addr(deadline);
    // `run --rest` says which job it runs and where the REST API shows it.
    let job = run.wait_for_line("job ", deadline);
    let (jid, url) = job
        .split_once(" at ")
        .unwrap_or_else(|| panic!("unexpected line {job:?}"));
    assert_eq!(jid.len(), 32, "{job}");
    assert_eq!(url, format!("http://{addr}/jobs/{jid}"));
    run.wait_for_a_checkpoint(&ck, deadline);
    run.interrupt();
    let (status, stderr) = run.wait(deadline);
    assert_eq!(status.code(), Some(130), "{stderr}");
    let summary = stderr
        .lines()
        .find(|l| l.starts_with("wordcount canceled by SIGINT after "))
        .unwrap_or_else(|| panic!("no summary line:\n{stderr}"));
    assert!(summary.contains("records read by the sources"), "{summary}");
    assert!(
        summary.contains("checkpoints completed (last #"),
        "{summary}"
    );
    let resume = stderr
        .lines()
        .find_map(|l| l.strip_prefix("resume with: "))
        .unwrap_or_else(|| panic!("no resume line:\n{stderr}"));
    assert!(
        resume.contains(" run wordcount --generate 1000000000 "),
        "{resume}"
    );
    assert!(
        resume.contains(&format!("--checkpoint-dir {ck_text}")),
        "{resume}"
    );
    assert!(resume.ends_with(" --from latest"), "{resume}");
    assert!(!stderr.contains("error:"), "{stderr}");

    // The command resumes the job from its checkpoint.
    let words: Vec<&str> = resume.split_whitespace().collect();
    let mut resumed = Watched::spawn(std::process::Command::new(words[0]).args(&words[1..]));
    resumed.wait_for_line_containing("restoring job from checkpoint", deadline);
    resumed.interrupt();
    let (status, stderr) = resumed.wait(deadline);
    assert_eq!(status.code(), Some(130), "{stderr}");
}

#[test]
fn ctrl_c_says_when_cancelling_deleted_the_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let ck = tmp.path().join("ck");
    let deadline = Instant::now() + DEADLINE;
    let ck_text = ck.display().to_string();
    let mut run = endless_run(&[
        "--checkpoint-interval",
        "100ms",
        "--checkpoint-dir",
        &ck_text,
    ]);
    run.rest_addr(deadline);
    run.wait_for_a_checkpoint(&ck, deadline);
    run.interrupt();
    let (status, stderr) = run.wait(deadline);
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(!stderr.contains("resume with:"), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("the job's checkpoints were deleted")
                && l.contains("RETAIN_ON_CANCELLATION")
                && l.contains("--savepoint-on-exit")),
        "{stderr}"
    );
}

#[test]
fn sigterm_without_a_checkpoint_prints_the_summary_and_no_resume_command() {
    let deadline = Instant::now() + DEADLINE;
    let mut run = endless_run(&[]);
    run.rest_addr(deadline);
    // The job id is known once the job master started the job.
    run.wait_for_line("job ", deadline);
    run.terminate();
    let (status, stderr) = run.wait(deadline);
    assert_eq!(status.code(), Some(143), "{stderr}");
    assert!(
        stderr
            .lines()
            .any(|l| l.starts_with("wordcount canceled by SIGTERM after ")
                && l.contains(", 0 checkpoints completed")),
        "{stderr}"
    );
    assert!(!stderr.contains("resume with:"), "{stderr}");
}
