use std::io::Write;

use super::Encoder;
use crate::error::TaskResult;
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkWriter};

/// Drops every record (benchmarks).
#[derive(Debug, Clone, Copy, Default)]
pub struct DiscardSink;

impl<T: Send + 'static> Sink<T> for DiscardSink {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::None
    }
    fn create_writer(&self, _ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(DiscardSink))
    }
}

impl<T> SinkWriter<T> for DiscardSink {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        batch.clear();
        Ok(())
    }
    fn pre_commit(&mut self, _: u64) -> TaskResult<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }
    fn commit(&mut self, _: u64) -> TaskResult {
        Ok(())
    }
    fn finish(&mut self) -> TaskResult {
        Ok(())
    }
}

/// Writes every record to standard output as it arrives (no guarantee: a replay prints again).
pub struct PrintSink<T> {
    encoder: Encoder<T>,
}

impl<T> PrintSink<T> {
    /// Prints records encoded by `encoder`.
    pub fn new(encoder: Encoder<T>) -> Self {
        PrintSink { encoder }
    }
}

impl<T: Send + 'static> Sink<T> for PrintSink<T> {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::None
    }
    fn writes_to_stdout(&self) -> bool {
        true
    }
    fn create_writer(&self, _ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(PrintWriter {
            encoder: self.encoder.clone(),
            buf: Vec::new(),
        }))
    }
}

struct PrintWriter<T> {
    encoder: Encoder<T>,
    buf: Vec<u8>,
}

impl<T: Send> SinkWriter<T> for PrintWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        self.buf.clear();
        for r in batch.drain(..) {
            (self.encoder)(&r, &mut self.buf);
        }
        let mut out = std::io::stdout().lock();
        out.write_all(&self.buf)?;
        out.flush()?;
        Ok(())
    }
    fn pre_commit(&mut self, _: u64) -> TaskResult<Vec<Vec<u8>>> {
        Ok(Vec::new())
    }
    fn commit(&mut self, _: u64) -> TaskResult {
        Ok(())
    }
    fn finish(&mut self) -> TaskResult {
        Ok(())
    }
}
