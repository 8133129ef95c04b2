//! The exactly-once file sink (two-phase commit, R16).
//!
//! A subtask writes into an in-progress file `.part-<run>-<subtask>-<n>.inprogress`. At the
//! barrier of checkpoint c (pre-commit) the file is flushed, fsynced and renamed to
//! `.part-<run>-<subtask>-<n>.pending`, and it is remembered in the sink's state. When c
//! completes (commit) pending files up to c are renamed to `part-<run>-<subtask>-<n>`. Only
//! committed files have names without a leading `.`.
//!
//! Before an attempt starts, [`FileSink::initialize`] commits the pending files of the restored
//! checkpoint (idempotently: a file already renamed is fine) and deletes every other in-progress
//! or pending file — data that no completed checkpoint covers, and that the replay writes again.
//! The output directory therefore belongs to one job.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use tracing::info;

use super::Encoder;
use crate::error::{TaskError, TaskResult};
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkWriter};

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

    fn initialize(&self, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
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
        let mut removed = 0;
        let entries = std::fs::read_dir(&self.dir).map_err(|e| io_err("list", &self.dir, e))?;
        for e in entries {
            let e = e.map_err(|e| io_err("list", &self.dir, e))?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(".part-")
                && (name.ends_with(".inprogress") || name.ends_with(".pending"))
            {
                std::fs::remove_file(e.path()).map_err(|err| io_err("remove", &e.path(), err))?;
                removed += 1;
            }
        }
        sync_dir(&self.dir)?;
        if committed > 0 || removed > 0 {
            info!(
                "file sink {}: committed {committed} pending file(s) of the restored checkpoint, removed {removed} uncommitted file(s)",
                self.dir.display()
            );
        }
        Ok(())
    }

    fn create_writer(&self, ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(FileSinkWriter {
            dir: self.dir.clone(),
            encoder: self.encoder.clone(),
            prefix: format!("part-{:08x}-{}", fastrand::u32(..), ctx.subtask),
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
    prefix: String,
    seq: u64,
    current: Option<InProgress>,
    pending: Vec<PendingFile>,
    buf: Vec<u8>,
    checkpointing: bool,
}

impl<T> FileSinkWriter<T> {
    fn open(&mut self) -> TaskResult<&mut InProgress> {
        if self.current.is_none() {
            let base = format!("{}-{}", self.prefix, self.seq);
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
