use std::time::{Duration, Instant};

use crate::error::TaskResult;
use crate::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkOwner, SinkWriter};

/// Wraps a sink so that each subtask writes at most `rate_per_sec / parallelism` records per
/// second: a stand-in for a slow external system, to create backpressure on purpose.
pub struct ThrottledSink<S> {
    inner: S,
    rate_per_sec: u64,
}

impl<S> ThrottledSink<S> {
    /// Throttles `inner` to `rate_per_sec` records per second in total.
    pub fn new(inner: S, rate_per_sec: u64) -> Self {
        ThrottledSink {
            inner,
            rate_per_sec: rate_per_sec.max(1),
        }
    }
}

impl<T: Send + 'static, S: Sink<T>> Sink<T> for ThrottledSink<S> {
    fn guarantee(&self) -> SinkGuarantee {
        self.inner.guarantee()
    }
    fn initialize(&self, owner: &SinkOwner, restored: Option<Vec<Vec<u8>>>) -> TaskResult {
        self.inner.initialize(owner, restored)
    }
    fn create_writer(&self, ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        let per_subtask = (self.rate_per_sec as f64 / f64::from(ctx.parallelism.max(1))).max(1.0);
        Ok(Box::new(ThrottledWriter {
            inner: self.inner.create_writer(ctx)?,
            seconds_per_record: 1.0 / per_subtask,
            next_free: Instant::now(),
        }))
    }
}

struct ThrottledWriter<T> {
    inner: Box<dyn SinkWriter<T>>,
    seconds_per_record: f64,
    next_free: Instant,
}

impl<T: Send> SinkWriter<T> for ThrottledWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        let now = Instant::now();
        if self.next_free < now {
            self.next_free = now;
        }
        self.next_free += Duration::from_secs_f64(self.seconds_per_record * batch.len() as f64);
        self.inner.write(batch)?;
        // The wait stands for a blocking call into a slow external system — the very thing that
        // makes backpressure in the `backpressure` job; it is not part of the engine's data path.
        let wait = self.next_free.saturating_duration_since(Instant::now());
        if !wait.is_zero() {
            std::thread::sleep(wait);
        }
        Ok(())
    }
    fn pre_commit(&mut self, checkpoint_id: u64) -> TaskResult<Vec<Vec<u8>>> {
        self.inner.pre_commit(checkpoint_id)
    }
    fn commit(&mut self, checkpoint_id: u64) -> TaskResult {
        self.inner.commit(checkpoint_id)
    }
    fn finish(&mut self) -> TaskResult {
        self.inner.finish()
    }
}
