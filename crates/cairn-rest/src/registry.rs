//! The jobs the REST API serves.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, PoisonError, RwLock};

use cairn::runtime::JobStatus;

use crate::resources::{ClusterResources, Resources};
use crate::submit::JobSubmitter;

/// The jobs served, by job id, and what submits new ones (if anything). Cheap to clone: clones
/// share one registry.
///
/// A job is found by the id its status carries *now*, not the one it had when it was
/// registered: a status is usually registered before the job master knows the job id (it
/// may adopt the id of the checkpoint it restores from) and fills it in later.
#[derive(Clone, Default)]
pub struct JobRegistry {
    jobs: Arc<RwLock<Vec<Arc<JobStatus>>>>,
    submitter: Arc<RwLock<Option<Arc<dyn JobSubmitter>>>>,
    resources: Arc<RwLock<Option<Arc<dyn ClusterResources>>>>,
    /// Savepoint disposals by request id: None if it succeeded, else why not.
    disposals: Arc<RwLock<HashMap<String, Option<String>>>>,
}

impl fmt::Debug for JobRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("JobRegistry")
            .field("jobs", &self.list().len())
            .field("accepts_submissions", &self.submitter().is_some())
            .finish()
    }
}

impl JobRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records how disposal request `id` ended (`error`: why it failed).
    pub fn disposal_ended(&self, id: String, error: Option<String>) {
        let mut d = self
            .disposals
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        d.insert(id, error);
    }

    /// How disposal request `id` ended, if there is one.
    pub fn disposal(&self, id: &str) -> Option<Option<String>> {
        let d = self
            .disposals
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        d.get(id).cloned()
    }

    /// Adds a job; registering the same status twice has no effect.
    pub fn register(&self, status: Arc<JobStatus>) {
        let mut jobs = self.jobs.write().unwrap_or_else(PoisonError::into_inner);
        if !jobs.iter().any(|j| Arc::ptr_eq(j, &status)) {
            jobs.push(status);
        }
    }

    /// Forgets job `jid` (a coordinator's bounded history let it go).
    pub fn remove(&self, jid: &str) {
        let mut jobs = self.jobs.write().unwrap_or_else(PoisonError::into_inner);
        jobs.retain(|j| j.jid() != jid);
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

    /// Accepts job submissions (`POST /jobs`) from now on, handing them to `submitter`
    /// (replacing any earlier one). Without a submitter, submissions are refused.
    pub fn set_submitter(&self, submitter: Arc<dyn JobSubmitter>) {
        *self
            .submitter
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(submitter);
    }

    /// Reports workers and slots through `resources` from now on (replacing any earlier one).
    pub fn set_resources(&self, resources: Arc<dyn ClusterResources>) {
        *self
            .resources
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Some(resources);
    }

    /// The workers and slots the cluster offers now; none without a [`ClusterResources`].
    pub fn resources(&self) -> Resources {
        let source = self
            .resources
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        source.map(|r| r.resources()).unwrap_or_default()
    }

    /// What submits jobs, if this registry accepts submissions.
    pub fn submitter(&self) -> Option<Arc<dyn JobSubmitter>> {
        self.submitter
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

    struct Fixed;

    impl JobSubmitter for Fixed {
        fn submit(&self, request: crate::SubmitRequest) -> Result<String, String> {
            Ok(format!(
                "{}:{}",
                request.job,
                request.args.unwrap_or_default().len()
            ))
        }
    }

    #[test]
    fn clones_share_the_submitter() {
        let reg = JobRegistry::new();
        assert!(reg.submitter().is_none());
        let clone = reg.clone();
        reg.set_submitter(Arc::new(Fixed));
        let s = clone.submitter().expect("set through the other clone");
        assert_eq!(
            s.submit(crate::SubmitRequest {
                job: "wordcount".into(),
                args: Some(vec!["-x".into()]),
                ..Default::default()
            }),
            Ok("wordcount:1".into())
        );
        assert!(format!("{clone:?}").contains("accepts_submissions: true"));
    }
}
