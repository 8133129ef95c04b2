//! Names of the files and directories of the checkpoint layout:
//! `<job-id>/chk-<n>/` (with `_metadata` written last) and `<job-id>/shared/`,
//! all relative to the storage root.

/// Name of the file that completes a checkpoint; written last, atomically.
pub const METADATA_FILE: &str = "_metadata";

/// Name of the per-job directory holding state shared between checkpoints.
pub const SHARED_DIR: &str = "shared";

/// Prefix of checkpoint directory names (`chk-<n>`).
pub const CHECKPOINT_DIR_PREFIX: &str = "chk-";

/// Path of the directory of checkpoint `checkpoint_id` of a job: `<job-id>/chk-<n>`.
pub fn checkpoint_dir(job_id: &str, checkpoint_id: u64) -> String {
    format!("{job_id}/{CHECKPOINT_DIR_PREFIX}{checkpoint_id}")
}

/// Path of the `_metadata` file of a checkpoint: `<job-id>/chk-<n>/_metadata`.
pub fn metadata_path(job_id: &str, checkpoint_id: u64) -> String {
    format!("{}/{METADATA_FILE}", checkpoint_dir(job_id, checkpoint_id))
}

/// Path of the shared-state directory of a job: `<job-id>/shared`.
pub fn shared_dir(job_id: &str) -> String {
    format!("{job_id}/{SHARED_DIR}")
}

/// The checkpoint id of a directory name like `chk-12`, if it is one.
pub fn parse_checkpoint_dir(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(CHECKPOINT_DIR_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Whether `name` is a temporary file left by an interrupted
/// [`write_atomic`](super::CheckpointStorage::write_atomic) (`.<name>....tmp`).
pub fn is_temp_file(name: &str) -> bool {
    name.len() > ".tmp".len() + 1 && name.starts_with('.') && name.ends_with(".tmp")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths() {
        assert_eq!(checkpoint_dir("job-1", 7), "job-1/chk-7");
        assert_eq!(metadata_path("job-1", 7), "job-1/chk-7/_metadata");
        assert_eq!(shared_dir("job-1"), "job-1/shared");
        super::super::validate_path(&metadata_path("job-1", 7)).unwrap();
    }

    #[test]
    fn parse_dirs() {
        assert_eq!(parse_checkpoint_dir("chk-0"), Some(0));
        assert_eq!(parse_checkpoint_dir("chk-123"), Some(123));
        assert_eq!(parse_checkpoint_dir("chk-"), None);
        assert_eq!(parse_checkpoint_dir("chk-+1"), None);
        assert_eq!(parse_checkpoint_dir("chk-1a"), None);
        assert_eq!(parse_checkpoint_dir("shared"), None);
        assert_eq!(parse_checkpoint_dir("chk-99999999999999999999999"), None);
    }

    #[test]
    fn temp_files() {
        assert!(is_temp_file("._metadata.123.0.tmp"));
        assert!(!is_temp_file("_metadata"));
        assert!(!is_temp_file(".tmp"));
        assert!(!is_temp_file("task.tmp"));
    }
}
