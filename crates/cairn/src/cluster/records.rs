//! What a coordinator keeps of a job in `<checkpoint-dir>/<job-id>/`: how it was submitted
//! (`_job`, so a restarted coordinator can resume it) and, once it ended, how (`_end`, so a
//! restarted coordinator never resubmits it and still lists it). Both are JSON, written
//! atomically; a damaged one is refused with its path.

use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::JobSubmission;
use crate::runtime::status::{JobState, JobStatus, JobStatusView};

/// The file in `<checkpoint-dir>/<job-id>/` that records how a job was submitted.
pub const JOB_RECORD: &str = "_job";

/// What `<job-id>/_job` holds: the submission, and the plan fingerprint it had.
#[derive(Debug, Serialize, Deserialize)]
pub struct JobRecord {
    /// The job as submitted.
    pub submission: JobSubmission,
    /// The plan's fingerprint at submission.
    pub fingerprint: String,
    /// The leader epoch of the coordinator that wrote it (0: a coordinator without a
    /// leadership contest). A coordinator that resumes the job writes it again with its own.
    #[serde(default)]
    pub epoch: u64,
}

impl JobRecord {
    /// Writes `dir/_job` atomically: a temporary file, fsynced, renamed over it, the
    /// directory fsynced; a crash leaves the old record or the new one, never a torn one.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        write_json_atomic(dir, JOB_RECORD, self)
    }

    /// Reads `dir/_job`; an unreadable or damaged record is an error naming its path.
    pub fn read(dir: &Path) -> Result<JobRecord, String> {
        let path = dir.join(JOB_RECORD);
        let text =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        serde_json::from_slice(&text)
            .map_err(|e| format!("damaged job record {}: {e}", path.display()))
    }
}

/// The file in `<checkpoint-dir>/<job-id>/` that records how a job ended.
pub const END_RECORD: &str = "_end";

/// The marker of a job that ended, as coordinators before `_end` wrote it.
pub const LEGACY_FINISHED: &str = "_finished";

/// What `<job-id>/_end` holds: how the job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndRecord {
    /// The job's name.
    pub name: String,
    /// FINISHED, CANCELED or FAILED.
    pub state: JobState,
    /// Why it failed (or was cancelled).
    #[serde(default)]
    pub cause: Option<String>,
    /// When it was submitted and when it ended (ms since the Unix epoch).
    pub start_time: u64,
    /// When it ended.
    pub end_time: u64,
    /// Restarts it went through.
    #[serde(default)]
    pub restarts: u32,
    /// The leader epoch of the coordinator that wrote it. An end written under an epoch
    /// older than the job record's came from a deposed leader after a newer one resumed the
    /// job, and does not count.
    #[serde(default)]
    pub epoch: u64,
}

impl EndRecord {
    /// How the job whose status this is ended (None while it has not).
    pub fn of(status: &JobStatus) -> Option<EndRecord> {
        EndRecord::of_view(&status.view())
    }

    /// How the job this view shows ended (None while it has not).
    pub fn of_view(v: &JobStatusView) -> Option<EndRecord> {
        v.state.is_terminal().then(|| EndRecord {
            name: v.name.clone(),
            state: v.state,
            cause: v.failure_cause.clone(),
            start_time: v.start_time,
            end_time: v.end_time.unwrap_or(v.start_time),
            restarts: v.restarts,
            epoch: 0,
        })
    }

    /// Writes `dir/_end` atomically.
    pub fn write(&self, dir: &Path) -> Result<(), String> {
        write_json_atomic(dir, END_RECORD, self)
    }

    /// Reads `dir/_end`; a damaged record is an error naming its path.
    pub fn read(dir: &Path) -> Result<EndRecord, String> {
        let path = dir.join(END_RECORD);
        let text =
            std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let record: EndRecord = serde_json::from_slice(&text)
            .map_err(|e| format!("damaged job end record {}: {e}", path.display()))?;
        if !record.state.is_terminal() {
            return Err(format!(
                "damaged job end record {}: {} is not an end",
                path.display(),
                record.state
            ));
        }
        Ok(record)
    }

    /// A status of the ended job, for listing it.
    pub fn status(&self, jid: String) -> std::sync::Arc<JobStatus> {
        JobStatus::ended(
            jid,
            self.name.clone(),
            self.state,
            self.cause.clone(),
            (self.start_time, self.end_time),
            self.restarts,
        )
    }
}

/// Writes `dir/name` as JSON atomically: a temporary file, fsynced, renamed over it, the
/// directory fsynced; a crash leaves the old file or the new one, never a torn one.
fn write_json_atomic<T: Serialize>(dir: &Path, name: &str, value: &T) -> Result<(), String> {
    let path = dir.join(name);
    let fail = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    std::fs::create_dir_all(dir).map_err(fail)?;
    let text = serde_json::to_vec_pretty(value).map_err(|e| e.to_string())?;
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut file = std::fs::File::create(&tmp).map_err(fail)?;
        file.write_all(&text).map_err(fail)?;
        file.sync_all().map_err(fail)?;
    }
    std::fs::rename(&tmp, &path).map_err(fail)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> JobRecord {
        JobRecord {
            submission: JobSubmission {
                job: "fraud".into(),
                params: serde_json::json!({"threshold": 500, "output": "/out"}),
                config: crate::config::JobConfig::default(),
                from: Some("latest".into()),
                from_job: None,
                inject: Some(super::super::InjectRequest {
                    count: 2,
                    uid_prefix: None,
                }),
                seed: 7,
            },
            fingerprint: "0123456789abcdef".into(),
            epoch: 3,
        }
    }

    #[test]
    fn a_job_record_is_written_whole_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let job_dir = dir.path().join("job-1");
        record().write(&job_dir).unwrap();
        let back = JobRecord::read(&job_dir).unwrap();
        assert_eq!(back.submission.params["threshold"], 500);
        assert_eq!(back.submission.seed, 7);
        assert_eq!(
            (back.fingerprint.as_str(), back.epoch),
            ("0123456789abcdef", 3)
        );
        assert_eq!(back.submission.config, crate::config::JobConfig::default());
        // Nothing but the record is left: the temporary file was renamed over it.
        let names: Vec<String> = std::fs::read_dir(&job_dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, [JOB_RECORD]);
    }

    #[test]
    fn an_end_record_is_read_back_and_a_damaged_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let end = EndRecord {
            name: "wordcount".into(),
            state: JobState::Failed,
            cause: Some("checkpoint /x does not exist".into()),
            start_time: 1,
            end_time: 2,
            restarts: 0,
            epoch: 2,
        };
        end.write(dir.path()).unwrap();
        assert_eq!(EndRecord::read(dir.path()).unwrap(), end);
        let status = end.status("j1".into()).view();
        assert_eq!(status.state, JobState::Failed);
        assert_eq!(status.failure_cause, end.cause);
        assert_eq!(status.end_time, Some(2));
        let path = dir.path().join(END_RECORD);
        std::fs::write(
            &path,
            br#"{"name":"x","state":"RUNNING","start_time":1,"end_time":2}"#,
        )
        .unwrap();
        let e = EndRecord::read(dir.path()).unwrap_err();
        assert!(e.contains(&path.display().to_string()), "{e}");
        std::fs::write(&path, b"{").unwrap();
        assert!(EndRecord::read(dir.path())
            .unwrap_err()
            .starts_with("damaged job end record"));
    }

    #[test]
    fn a_damaged_or_missing_job_record_is_refused_naming_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let job_dir = dir.path().join("job-1");
        record().write(&job_dir).unwrap();
        let path = job_dir.join(JOB_RECORD);
        let whole = std::fs::read(&path).unwrap();
        for damaged in [
            &whole[..whole.len() / 2],
            b"wordcount\n--generate\n10\n",
            b"",
        ] {
            std::fs::write(&path, damaged).unwrap();
            let e = JobRecord::read(&job_dir).unwrap_err();
            assert!(
                e.starts_with(&format!("damaged job record {}", path.display())),
                "{e}"
            );
        }
        std::fs::remove_file(&path).unwrap();
        let e = JobRecord::read(&job_dir).unwrap_err();
        assert!(e.contains(&path.display().to_string()), "{e}");
    }
}
