//! A test sink that keeps every record as it is written (no guarantee: nothing to commit).

use std::sync::{Arc, Mutex};

use cairn::runtime::operators::{Sink, SinkContext, SinkGuarantee, SinkWriter};
use cairn::TaskResult;

/// Collects every record written, in the shared vector.
#[derive(Clone)]
pub struct Collect<T>(pub Arc<Mutex<Vec<T>>>);

impl<T> Default for Collect<T> {
    fn default() -> Self {
        Collect(Arc::new(Mutex::new(Vec::new())))
    }
}

struct CollectWriter<T>(Arc<Mutex<Vec<T>>>);

impl<T: Send + 'static> Sink<T> for Collect<T> {
    fn guarantee(&self) -> SinkGuarantee {
        SinkGuarantee::None
    }
    fn create_writer(&self, _ctx: SinkContext) -> TaskResult<Box<dyn SinkWriter<T>>> {
        Ok(Box::new(CollectWriter(self.0.clone())))
    }
}

impl<T: Send> SinkWriter<T> for CollectWriter<T> {
    fn write(&mut self, batch: &mut Vec<T>) -> TaskResult {
        self.0.lock().unwrap().append(batch);
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
