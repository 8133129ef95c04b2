//! The jobs the REST API serves.

use std::sync::{Arc, PoisonError, RwLock};

use cairn::runtime::JobStatus;

/// The jobs served, by job id. Cheap to clone: clones share one registry.
///
/// A job is found by the id its status carries *now*, not the one it had when it was
/// registered: a status is usually registered before the job master knows the job id (it
/// may adopt the id of the checkpoint it restores from) and fills it in later.
#[derive(Debug, Clone, Default)]
pub struct JobRegistry {
    jobs: Arc<RwLock<Vec<Arc<JobStatus>>>>,
}

impl JobRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a job; registering the same status twice has no effect.
    pub fn register(&self, status: Arc<JobStatus>) {
        let mut jobs = self.jobs.write().unwrap_or_else(PoisonError::into_inner);
        if !jobs.iter().any(|j| Arc::ptr_eq(j, &status)) {
            jobs.push(status);
        }
    }

    /// The job whose id is `jid` (the most recently registered one if several share it).
    pub fn get(&self, jid: &str) -> Option<Arc<JobStatus>> {
        let jobs = self.jobs.read().unwrap_or_else(PoisonError::into_inner);
        jobs.iter().rev().find(|j| j.view().jid == jid).cloned()
    }

    /// Every job, in registration order.
    pub fn list(&self) -> Vec<Arc<JobStatus>> {
        self.jobs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_jobs_by_their_current_id() {
        let reg = JobRegistry::new();
        let a = JobStatus::new(String::new(), "a".into(), Vec::new());
        reg.register(a.clone());
        reg.register(a.clone());
        assert_eq!(reg.list().len(), 1);
        assert!(reg.get("j1").is_none());
        a.update(|v| v.jid = "j1".into());
        assert!(reg.get("j1").is_some_and(|j| Arc::ptr_eq(&j, &a)));

        let b = JobStatus::new("j1".into(), "b".into(), Vec::new());
        reg.register(b.clone());
        assert!(reg.get("j1").is_some_and(|j| Arc::ptr_eq(&j, &b)));
        assert_eq!(reg.list().len(), 2);
    }
}
