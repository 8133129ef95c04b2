//! The exactly-once file sink (two-phase commit, R16).
//!
//! A subtask writes into an in-progress file `.<base>.inprogress`. At the barrier of checkpoint
//! c (pre-commit) the file is flushed, fsynced and renamed to `.<base>.pending`, and it is
//! remembered in the sink's state. When c completes (commit) pending files up to c are renamed
//! to `<base>`. Only committed files have names without a leading `.`.
//!
//! `<base>` is `part-<run>-<job>-<uid>-<subtask>-<n>`: a random number per writer (per
//! attempt), the job id, the sink's uid, the subtask and a sequence number. Job id and uid are escaped
//! (every byte outside `[A-Za-z0-9_.]` as `%XX`), so they never contain `-` and a name tells
//! unambiguously which job's which sink wrote it.
//!
//! Before an attempt starts, [`FileSink::initialize`] commits the pending files of the restored
//! checkpoint (idempotently: a file already renamed is fine) and deletes the other in-progress
//! and pending files *of the same job and uid*: what a failed attempt of this very sink wrote
//! after the restored checkpoint, which no completed checkpoint covers and the replay writes
//! again. As with Flink's `FileSink`, files of other jobs and other sinks are never touched, so
//! several sinks and jobs can share one output directory. Leftovers whose job never resumes
//! (it was restored under a new job id, or abandoned) stay behind as hidden files.
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::info;

use super::Encoder;
use crate::error::{TaskError, TaskResult};
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkOwner, SinkWriter};

/// Writes records as lines into files under a directory, exactly once.
pub struct FileSink<T> {
    dir: PathBuf,
    encoder: Encoder<T>,
}

impl<T> FileSink<T> {
    /// A sink into `dir`, encoding each record with `encoder`.
    pub fn new(dir: impl Into<PathBuf>, encoder: Encoder<T>) -> Self {
        FileSink {
            dir: dir.into(),
            encoder,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct PendingFile {
    checkpoint_id: u64,
    base: String,
}

fn pending_name(base: &str) -> String {
    format!(".{base}.pending")
}

fn in_progress_name(base: &str) -> String {
    format!(".{base}.inprogress")
}

/// Escapes a job id or uid for a file name: no `-` (the separator of the name's fields), no
/// `/`, nothing a filesystem might refuse.
pub(super) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b == b'_' || b == b'.' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The escaped job id and uid that every base name `owner` writes carries.
struct OwnerTag {
    job: String,
    uid: String,
}

impl OwnerTag {
    fn new(owner: &SinkOwner) -> Self {
        OwnerTag {
            job: escape(&owner.job_id),
            uid: escape(&owner.uid),
        }
    }

    /// The base name of file `n` of the writer `run` of `subtask`. The writer's run comes
    /// first, where tools and tests that count writer instances find it.
    fn base(&self, run: u32, subtask: u32, n: u64) -> String {
        format!("part-{run:08x}-{}-{}-{subtask}-{n}", self.job, self.uid)
    }

    /// Whether `base` was written by this owner: `part-<run>-<job>-<uid>-<subtask>-<n>`.
    fn owns(&self, base: &str) -> bool {
        let hex = |f: &str| !f.is_empty() && f.bytes().all(|b| b.is_ascii_hexdigit());
        let digits = |f: &str| !f.is_empty() && f.bytes().all(|b| b.is_ascii_digit());
        match base.split('-').collect::<Vec<_>>()[..] {
            ["part", run, job, uid, subtask, n] => {
                hex(run) && job == self.job && uid == self.uid && digits(subtask) && digits(n)
            }
            _ => false,
        }
    }

    /// Whether `name` is an in-progress or pending file of this owner.
    fn owns_uncommitted(&self, name: &str) -> bool {
        name.strip_prefix('.')
            .and_then(|h| {
                h.strip_suffix(".inprogress")
                    .or_else(|| h.strip_suffix(".pending"))
            })
            .is_some_and(|base| self.owns(base))
    }
}

fn io_err(what: &str, path: &Path, e: std::io::Error) -> TaskError {
    TaskError::msg(format!("file sink cannot {what} {}: {e}", path.display()))
}

fn sync_dir(dir: &Path) -> TaskResult {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err("sync directory", dir, e))
}

/// Renames `.base.pending` to `base`; fine if that happened already.
fn commit_file(dir: &Path, base: &str) -> TaskResult<bool> {
    let from = dir.join(pending_name(base));
    let to = dir.join(base);
    match std::fs::rename(&from, &to) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if to.exists() {
                Ok(false)
            } else {
                Err(TaskError::msg(format!(
                    "file sink: pending file {} is missing and was never committed; its records would be lost",
                    from.display()
                )))
            }
        }
        Err(e) => Err(io_err("commit", &from, e)),
    }
}

impl<T: Send + 'static> Sink<T> for FileSink<T> {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::ExactlyOnce
    }

    fn initialize(&self, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
        std::fs::create_dir_all(&self.dir)
            .map_err(|e| io_err("create output directory", &self.dir, e))?;
        let mut committed = 0;
        for entry in restored.unwrap_or_default() {
            let p: PendingFile = postcard::from_bytes(&entry).map_err(|e| {
                TaskError::msg(format!("corrupt file sink state in checkpoint: {e}"))
            })?;
            if commit_file(&self.dir, &p.base)? {
                committed += 1;
            }
        }
        let tag = OwnerTag::new(owner);
        let mut removed = 0;
        let entries = std::fs::read_dir(&self.dir).map_err(|e| io_err("list", &self.dir, e))?;
        for e in entries {
            let e = e.map_err(|e| io_err("list", &self.dir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if tag.owns_uncommitted(&name) {
                std::fs::remove_file(e.path()).map_err(|err| io_err("remove", &e.path(), err))?;
                removed += 1;
            }
        }
        sync_dir(&self.dir)?;
        if committed > 0 || removed > 0 {
            info!(
                "file sink '{}' in {}: committed {committed} pending file(s) of the restored checkpoint, removed {removed} uncommitted file(s) of job {}",
                owner.uid,
                self.dir.display(),
                owner.job_id
            );
        }
        Ok(())
    }

    fn create_writer(&self, ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(FileSinkWriter {
            dir: self.dir.clone(),
            encoder: self.encoder.clone(),
            tag: OwnerTag::new(&ctx.owner),
            run: fastrand::u32(..),
            subtask: ctx.subtask,
            seq: 0,
            current: None,
            pending: Vec::new(),
            buf: Vec::with_capacity(64 * 1024),
            checkpointing: ctx.checkpointing,
        }))
    }
}

struct InProgress {
    base: String,
    file: BufWriter<File>,
    bytes: u64,
}

struct FileSinkWriter<T> {
    dir: PathBuf,
    encoder: Encoder<T>,
    tag: OwnerTag,
    run: u32,
    subtask: u32,
    seq: u64,
    current: Option<InProgress>,
    pending: Vec<PendingFile>,
    buf: Vec<u8>,
    checkpointing: bool,
}

impl<T> FileSinkWriter<T> {
    fn open(&mut self) -> TaskResult<&mut InProgress> {
        if self.current.is_none() {
            let base = self.tag.base(self.run, self.subtask, self.seq);
            self.seq += 1;
            let path = self.dir.join(in_progress_name(&base));
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
                .map_err(|e| io_err("create", &path, e))?;
            self.current = Some(InProgress {
                base,
                file: BufWriter::with_capacity(1 << 20, file),
                bytes: 0,
            });
        }
        self.current
            .as_mut()
            .ok_or_else(|| TaskError::msg("file sink has no open file"))
    }

    /// Flushes, fsyncs and closes the in-progress file; returns its base name.
    fn close_current(&mut self) -> TaskResult<Option<String>> {
        let Some(cur) = self.current.take() else {
            return Ok(None);
        };
        let path = self.dir.join(in_progress_name(&cur.base));
        let file = cur
            .file
            .into_inner()
            .map_err(|e| io_err("write", &path, e.into_error()))?;
        file.sync_all().map_err(|e| io_err("sync", &path, e))?;
        Ok(Some(cur.base))
    }
}

impl<T: Send> SinkWriter<T> for FileSinkWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        if batch.is_empty() {
            return Ok(());
        }
        self.buf.clear();
        for r in batch.drain(..) {
            (self.encoder)(&r, &mut self.buf);
        }
        let buf = std::mem::take(&mut self.buf);
        let cur = self.open()?;
        let result = cur.file.write_all(&buf);
        cur.bytes += buf.len() as u64;
        if let Err(e) = result {
            let base = cur.base.clone();
            return Err(io_err("write", &self.dir.join(in_progress_name(&base)), e));
        }
        self.buf = buf;
        Ok(())
    }

    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        if let Some(base) = self.close_current()? {
            let from = self.dir.join(in_progress_name(&base));
            let to = self.dir.join(pending_name(&base));
            std::fs::rename(&from, &to).map_err(|e| io_err("pre-commit", &from, e))?;
            sync_dir(&self.dir)?;
            self.pending.push(PendingFile {
                checkpoint_id,
                base,
            });
        }
        self.pending
            .iter()
            .map(|p| postcard::to_stdvec(p).map_err(TaskError::msg))
            .collect()
    }

    fn commit(&mut self, checkpoint_id: u64) -> TaskResult {
        let mut any = false;
        let mut keep = Vec::with_capacity(self.pending.len());
        for p in std::mem::take(&mut self.pending) {
            if p.checkpoint_id <= checkpoint_id {
                commit_file(&self.dir, &p.base)?;
                any = true;
            } else {
                keep.push(p);
            }
        }
        self.pending = keep;
        if any {
            sync_dir(&self.dir)?;
        }
        Ok(())
    }

    fn finish(&mut self) -> TaskResult {
        if self.checkpointing {
            // Everything was pre-committed at the final checkpoint's barrier and committed
            // when it completed; an open file here must be empty.
            if let Some(cur) = &self.current {
                if cur.bytes > 0 {
                    return Err(TaskError::msg(format!(
                        "file sink: {} bytes were written after the final checkpoint",
                        cur.bytes
                    )));
                }
            }
            if let Some(base) = self.close_current()? {
                let path = self.dir.join(in_progress_name(&base));
                std::fs::remove_file(&path).map_err(|e| io_err("remove", &path, e))?;
            }
            return Ok(());
        }
        // Without checkpoints there is no commit point but the end of input.
        if let Some(base) = self.close_current()? {
            let from = self.dir.join(in_progress_name(&base));
            let to = self.dir.join(&base);
            std::fs::rename(&from, &to).map_err(|e| io_err("commit", &from, e))?;
            sync_dir(&self.dir)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;

    fn owner(job_id: &str, uid: &str) -> SinkOwner {
        SinkOwner {
            job_id: job_id.into(),
            uid: uid.into(),
        }
    }

    fn sink(dir: &Path) -> FileSink<u64> {
        FileSink::new(
            dir,
            Arc::new(|r: &u64, out: &mut Vec<u8>| {
                out.extend_from_slice(format!("{r}\n").as_bytes())
            }),
        )
    }

    fn writer(sink: &FileSink<u64>, owner: &SinkOwner) -> Box<dyn SinkWriter<u64>> {
        sink.create_writer(SinkContext {
            owner: owner.clone(),
            subtask: 0,
            parallelism: 1,
            checkpointing: true,
            restored: None,
        })
        .unwrap()
    }

    fn write(w: &mut dyn SinkWriter<u64>, records: std::ops::Range<u64>) {
        w.write(&mut records.collect()).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    /// The hidden files of `owner`, by suffix (`inprogress` / `pending`).
    fn uncommitted(dir: &Path, owner: &SinkOwner) -> BTreeMap<String, usize> {
        let tag = OwnerTag::new(owner);
        let mut m = BTreeMap::new();
        for n in names(dir).into_iter().filter(|n| tag.owns_uncommitted(n)) {
            let kind = n.rsplit('.').next().unwrap().to_string();
            *m.entry(kind).or_insert(0) += 1;
        }
        m
    }

    /// The records in `owner`'s committed files, sorted.
    fn committed(dir: &Path, owner: &SinkOwner) -> Vec<u64> {
        let tag = OwnerTag::new(owner);
        let mut v: Vec<u64> = names(dir)
            .into_iter()
            .filter(|n| tag.owns(n))
            .flat_map(|n| {
                std::fs::read_to_string(dir.join(n))
                    .unwrap()
                    .lines()
                    .map(|l| l.parse::<u64>().unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        v.sort_unstable();
        v
    }

    /// Two sinks share `dir`; `b` fails after its checkpoint 1 and restores from it while `a`
    /// has a pending and an in-progress file. `a`'s files survive, `b`'s own leftover (written
    /// after checkpoint 1) is removed, and both end with every record committed exactly once.
    fn shared_directory_restore(a: SinkOwner, b: SinkOwner) {
        let dir = tempfile::tempdir().unwrap();
        let (sa, sb) = (sink(dir.path()), sink(dir.path()));
        sa.initialize(&a, None).unwrap();
        sb.initialize(&b, None).unwrap();
        let mut wa = writer(&sa, &a);
        let mut wb = writer(&sb, &b);
        write(wa.as_mut(), 0..10);
        write(wb.as_mut(), 0..10);
        wa.pre_commit(1).unwrap();
        let b_state = wb.pre_commit(1).unwrap();
        write(wa.as_mut(), 10..20);
        write(wb.as_mut(), 10..20);
        let a_before = uncommitted(dir.path(), &a);
        assert_eq!(
            a_before,
            BTreeMap::from([("inprogress".into(), 1), ("pending".into(), 1)])
        );
        assert_eq!(a_before, uncommitted(dir.path(), &b));

        // `b` fails before checkpoint 1's completion reaches it; its next attempt restores
        // checkpoint 1 (complete) and replays the records after it.
        drop(wb);
        sb.initialize(&b, Some(b_state)).unwrap();
        assert_eq!(
            uncommitted(dir.path(), &a),
            a_before,
            "the other sink's files"
        );
        assert!(
            uncommitted(dir.path(), &b).is_empty(),
            "b's pending file of checkpoint 1 is committed, its later in-progress file removed: {:?}",
            names(dir.path())
        );
        assert_eq!(committed(dir.path(), &b), (0..10).collect::<Vec<_>>());
        let mut wb = writer(&sb, &b);
        write(wb.as_mut(), 10..20);
        wb.pre_commit(2).unwrap();
        wb.commit(2).unwrap();
        wb.finish().unwrap();

        wa.commit(1).unwrap();
        wa.pre_commit(2).unwrap();
        wa.commit(2).unwrap();
        wa.finish().unwrap();

        assert_eq!(committed(dir.path(), &a), (0..20).collect::<Vec<_>>());
        assert_eq!(committed(dir.path(), &b), (0..20).collect::<Vec<_>>());
        assert!(uncommitted(dir.path(), &a).is_empty());
        assert!(uncommitted(dir.path(), &b).is_empty());
    }

    #[test]
    fn restore_leaves_the_files_of_another_sink_of_the_job() {
        // "sink" is a prefix of "sink-2": the escaped names must still tell them apart.
        let job = format!("{:032x}", 7u128);
        shared_directory_restore(owner(&job, "sink"), owner(&job, "sink-2"));
        shared_directory_restore(owner(&job, "sink-2"), owner(&job, "sink"));
    }

    #[test]
    fn restore_leaves_the_files_of_another_job() {
        let (j1, j2) = (format!("{:032x}", 1u128), format!("{:032x}", 2u128));
        shared_directory_restore(owner(&j1, "file-sink"), owner(&j2, "file-sink"));
    }

    #[test]
    fn a_fresh_attempt_removes_its_own_uncommitted_files_only() {
        let dir = tempfile::tempdir().unwrap();
        let me = owner("job", "out");
        let other = owner("job", "out2");
        let s = sink(dir.path());
        s.initialize(&me, None).unwrap();
        s.initialize(&other, None).unwrap();
        let mut w = writer(&s, &me);
        write(w.as_mut(), 0..5);
        w.pre_commit(1).unwrap();
        write(w.as_mut(), 5..9);
        let mut wo = writer(&s, &other);
        write(wo.as_mut(), 0..3);
        // Checkpoint 1 never completed: the restart starts from nothing, and both of the
        // failed attempt's files (pending of 1, in-progress after it) are leftovers.
        drop(w);
        s.initialize(&me, None).unwrap();
        assert!(
            uncommitted(dir.path(), &me).is_empty(),
            "{:?}",
            names(dir.path())
        );
        assert!(committed(dir.path(), &me).is_empty());
        assert_eq!(
            uncommitted(dir.path(), &other),
            BTreeMap::from([("inprogress".into(), 1)])
        );
    }

    #[test]
    fn committed_names_are_visible_and_escaped() {
        let dir = tempfile::tempdir().unwrap();
        let s = sink(dir.path());
        let me = owner("a-b", ".x/y");
        s.initialize(&me, None).unwrap();
        let mut w = writer(&s, &me);
        write(w.as_mut(), 0..1);
        w.pre_commit(1).unwrap();
        w.commit(1).unwrap();
        let names = names(dir.path());
        assert_eq!(names.len(), 1);
        let fields: Vec<&str> = names[0].split('-').collect();
        assert_eq!(fields.len(), 6, "committed name {}", names[0]);
        assert_eq!(
            (fields[0], fields[2], fields[3], fields[4], fields[5]),
            ("part", "a%2Db", ".x%2Fy", "0", "0"),
            "committed name {}",
            names[0]
        );
    }

    #[test]
    fn ownership_is_unambiguous() {
        // Job "a" with uid "b-c" and job "a-b" with uid "c" must not claim each other's files.
        let t1 = OwnerTag::new(&owner("a", "b-c"));
        let t2 = OwnerTag::new(&owner("a-b", "c"));
        let f1 = format!(".{}.pending", t1.base(0xabcd, 0, 3));
        let f2 = format!(".{}.inprogress", t2.base(0xabcd, 0, 3));
        assert!(t1.owns_uncommitted(&f1));
        assert!(!t2.owns_uncommitted(&f1));
        assert!(t2.owns_uncommitted(&f2));
        assert!(!t1.owns_uncommitted(&f2));
        // Committed files, names of the earlier format and other suffixes are never leftovers.
        assert!(!t1.owns_uncommitted(&t1.base(0xabcd, 0, 3)));
        assert!(!t1.owns_uncommitted(".part-0000abcd-0-3.pending"));
        assert!(!t1.owns_uncommitted(&format!(".{}.tmp", t1.base(0xabcd, 0, 3))));
        assert!(!t1.owns_uncommitted(".part-xyz-a-b%2Dc-0-3.pending"));
    }
}
