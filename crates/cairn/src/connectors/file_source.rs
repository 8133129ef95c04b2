use std::fs::File;
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::{TaskError, TaskResult};
use crate::runtime::chain::{Source, SourceReader, SourceStatus};

/// Reads a text file line by line, in `parallelism` splits cut at byte offsets; a line belongs
/// to the split its first byte is in. The byte offset of the next line is the state.
///
/// Lines are decoded as UTF-8; invalid bytes become U+FFFD (the line is kept, not dropped).
/// A trailing `\r` is removed.
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
}

impl FileSource {
    /// A source over `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileSource { path: path.into() }
    }
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct Split {
    start: u64,
    end: u64,
    /// Offset of the next line to read, once `aligned`.
    next: u64,
    /// Whether `next` is known to be a line start.
    aligned: bool,
}

impl Source<String> for FileSource {
    fn create_splits(&self, parallelism: u32) -> TaskResult<Vec<Vec<u8>>> {
        let meta = std::fs::metadata(&self.path).map_err(|e| {
            TaskError::msg(format!(
                "cannot read input file {}: {e}",
                self.path.display()
            ))
        })?;
        if !meta.is_file() {
            return Err(TaskError::msg(format!(
                "input {} is not a regular file",
                self.path.display()
            )));
        }
        File::open(&self.path).map_err(|e| {
            TaskError::msg(format!(
                "cannot read input file {}: {e}",
                self.path.display()
            ))
        })?;
        let len = meta.len();
        let p = u64::from(parallelism.max(1));
        (0..p)
            .map(|i| {
                let start = len * i / p;
                postcard::to_stdvec(&Split {
                    start,
                    end: len * (i + 1) / p,
                    next: start,
                    aligned: start == 0,
                })
                .map_err(TaskError::msg)
            })
            .collect()
    }

    fn create_reader(
        &self,
        _subtask: u32,
        _parallelism: u32,
        splits: Vec<Vec<u8>>,
    ) -> TaskResult<Box<dyn SourceReader<String>>> {
        let splits: Vec<Split> = super::decode_splits("file source", &splits)?;
        Ok(Box::new(FileReader {
            path: self.path.clone(),
            splits,
            current: 0,
            reader: None,
            line: Vec::new(),
        }))
    }
}

struct FileReader {
    path: PathBuf,
    splits: Vec<Split>,
    current: usize,
    reader: Option<BufReader<File>>,
    line: Vec<u8>,
}

impl FileReader {
    fn io(&self, e: std::io::Error) -> TaskError {
        TaskError::msg(format!(
            "cannot read input file {}: {e}",
            self.path.display()
        ))
    }

    /// Opens the reader at the current split's next line.
    fn open(&mut self) -> TaskResult<()> {
        let Some(split) = self.splits.get(self.current).copied() else {
            return Ok(());
        };
        let mut f = File::open(&self.path).map_err(|e| self.io(e))?;
        let mut next = split.next;
        if !split.aligned {
            // Skip the tail of a line that started in the previous split.
            let mut prev = [0u8; 1];
            f.seek(SeekFrom::Start(split.start - 1))
                .map_err(|e| self.io(e))?;
            f.read_exact(&mut prev).map_err(|e| self.io(e))?;
            let mut r = BufReader::with_capacity(1 << 20, f);
            if prev[0] != b'\n' {
                self.line.clear();
                next += r
                    .read_until(b'\n', &mut self.line)
                    .map_err(|e| self.io(e))? as u64;
            }
            let s = &mut self.splits[self.current];
            s.next = next;
            s.aligned = true;
            self.reader = Some(r);
            return Ok(());
        }
        f.seek(SeekFrom::Start(next)).map_err(|e| self.io(e))?;
        self.reader = Some(BufReader::with_capacity(1 << 20, f));
        Ok(())
    }
}

impl SourceReader<String> for FileReader {
    fn poll(&mut self, out: &mut Vec<String>, max: usize) -> TaskResult<SourceStatus> {
        let mut produced = 0;
        while produced < max {
            if self.current >= self.splits.len() {
                return Ok(SourceStatus::Exhausted);
            }
            if self.reader.is_none() {
                self.open()?;
            }
            let split = self.splits[self.current];
            let Some(reader) = self.reader.as_mut() else {
                return Ok(SourceStatus::Exhausted);
            };
            if split.next >= split.end {
                self.current += 1;
                self.reader = None;
                continue;
            }
            self.line.clear();
            let n = reader.read_until(b'\n', &mut self.line).map_err(|e| {
                TaskError::msg(format!(
                    "cannot read input file {}: {e}",
                    self.path.display()
                ))
            })?;
            if n == 0 {
                // The file shrank below the split's end: nothing more to read here.
                self.splits[self.current].next = split.end;
                continue;
            }
            self.splits[self.current].next += n as u64;
            let mut bytes = &self.line[..];
            if bytes.last() == Some(&b'\n') {
                bytes = &bytes[..bytes.len() - 1];
            }
            if bytes.last() == Some(&b'\r') {
                bytes = &bytes[..bytes.len() - 1];
            }
            out.push(String::from_utf8_lossy(bytes).into_owned());
            produced += 1;
        }
        Ok(SourceStatus::More)
    }

    fn snapshot(&self) -> TaskResult<Vec<Vec<u8>>> {
        super::encode_splits(&self.splits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(src: &FileSource, p: u32) -> Vec<String> {
        let mut all = Vec::new();
        let splits = src.create_splits(p).unwrap();
        for i in 0..p {
            let mine: Vec<_> = splits
                .iter()
                .enumerate()
                .filter(|(j, _)| *j as u32 % p == i)
                .map(|(_, s)| s.clone())
                .collect();
            let mut r = src.create_reader(i, p, mine).unwrap();
            // Read in small polls with a snapshot/restore in between, as a restart would.
            loop {
                let status = r.poll(&mut all, 3).unwrap();
                let snap = r.snapshot().unwrap();
                r = src.create_reader(i, p, snap).unwrap();
                if status == SourceStatus::Exhausted {
                    break;
                }
            }
        }
        all
    }

    #[test]
    fn every_line_is_read_once_at_any_parallelism() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        let lines: Vec<String> = (0..200)
            .map(|i| format!("line {i} {}", "x".repeat(i % 13)))
            .collect();
        std::fs::write(&path, lines.join("\n") + "\n").unwrap();
        let src = FileSource::new(&path);
        for p in [1, 2, 3, 7, 16] {
            let mut got = read_all(&src, p);
            got.sort();
            let mut want = lines.clone();
            want.sort();
            assert_eq!(got, want, "parallelism {p}");
        }
    }

    #[test]
    fn invalid_utf8_and_crlf_are_handled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("in.txt");
        std::fs::write(&path, b"ok\r\nbad \xff\xfe bytes\nlast").unwrap();
        let got = read_all(&FileSource::new(&path), 1);
        assert_eq!(got, vec!["ok", "bad \u{fffd}\u{fffd} bytes", "last"]);
    }

    #[test]
    fn a_missing_file_is_a_clear_error() {
        let err = FileSource::new("/nonexistent/in.txt")
            .create_splits(1)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("cannot read input file /nonexistent/in.txt"),
            "{err}"
        );
    }
}
