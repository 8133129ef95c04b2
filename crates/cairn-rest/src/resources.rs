//! What a server that runs jobs on workers (the coordinator) tells `GET /overview`.

/// Workers and task slots, as Flink's cluster overview counts task managers and slots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resources {
    /// Live workers (Flink's task managers).
    pub workers: u32,
    /// Task slots the live workers offer in total.
    pub slots: u32,
    /// Of those, the slots reserved by jobs that have not ended.
    pub reserved: u32,
}

/// Reports the live workers and their slots for `GET /overview`.
///
/// A server without one (an embedded `cairn run`, whose job runs in the serving process)
/// reports no workers and no slots.
pub trait ClusterResources: Send + Sync + 'static {
    /// What the cluster offers now.
    fn resources(&self) -> Resources;
}
