//! The job master's storage thread: every piece of storage I/O of the job master runs here, in
//! the order queued, so the master's loop never waits on a disk or an object store — the
//! checkpoint coordinator's work (`_metadata` writes, savepoint copies, deletions), and a
//! redeployment's read-back of its checkpoint and initialization of its sinks (committing the
//! restored checkpoint's transactions, which may talk to a database or a broker).

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};

use super::super::graph::{JobGraph, SinkInitFn};
use super::super::job::JobError;
use super::super::operators::{sink_pending, SinkOwner};
use super::super::task::JobEvent;
use crate::checkpoint::{load_checkpoint, LoadedCheckpoint, StorageTask};
use crate::storage::CheckpointStorage;

/// Work for the storage thread.
pub(super) enum StorageJob {
    /// The checkpoint coordinator's; a finalization's result becomes a
    /// [`JobEvent::Finalized`].
    Coordinator(StorageTask),
    /// Reads checkpoint `id` of `job_id` back, as a new process would.
    Load {
        seq: u64,
        storage: Arc<dyn CheckpointStorage>,
        job_id: String,
        id: u64,
    },
    /// Initializes sinks (see [`sink_inits`]).
    InitSinks { seq: u64, sinks: Vec<SinkInit> },
}

/// What a redeployment's storage work gave, by its sequence number.
pub(super) enum StorageDone {
    Loaded {
        seq: u64,
        id: u64,
        result: Result<Box<LoadedCheckpoint>, String>,
    },
    SinksReady {
        seq: u64,
        result: Result<(), String>,
    },
}

/// A sink to initialize: its owner, its initialization and the restored pending
/// transactions (None: nothing restored).
pub(super) struct SinkInit {
    owner: SinkOwner,
    init: SinkInitFn,
    pending: Option<Vec<Vec<u8>>>,
}

/// The sinks of `graph` that `select` picks, with what `restored` holds for them.
pub(super) fn sink_inits(
    graph: &JobGraph,
    job_id: &str,
    restored: Option<&LoadedCheckpoint>,
    select: impl Fn(usize) -> bool,
) -> Vec<SinkInit> {
    graph
        .nodes()
        .iter()
        .filter(|node| select(node.id))
        .filter_map(|node| {
            let init = node.sink_init.clone()?;
            Some(SinkInit {
                owner: SinkOwner {
                    job_id: job_id.to_string(),
                    uid: node.uid.clone(),
                },
                init,
                pending: restored.map(|c| sink_pending(c, &node.uid)),
            })
        })
        .collect()
}

/// Runs the once-per-attempt initialization of sinks: commit the restored checkpoint's
/// pre-committed transactions, discard the rest.
pub(super) fn run_sink_inits(sinks: Vec<SinkInit>) -> Result<(), String> {
    for s in sinks {
        (s.init)(&s.owner, s.pending).map_err(|e| format!("sink '{}': {e}", s.owner.uid))?;
    }
    Ok(())
}

/// The thread and its queues.
pub(super) struct StorageThread {
    jobs: Option<Sender<StorageJob>>,
    /// Results of the redeployment work.
    pub(super) done: Receiver<StorageDone>,
    thread: Option<JoinHandle<()>>,
}

impl StorageThread {
    pub(super) fn start(events: Sender<JobEvent>) -> Result<Self, JobError> {
        let (tx, rx) = crossbeam_channel::unbounded::<StorageJob>();
        let (done_tx, done) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("checkpoint-storage".into())
            .spawn(move || {
                for job in rx {
                    run(job, &events, &done_tx);
                }
            })
            .map_err(|e| JobError::Setup(format!("cannot start a thread: {e}")))?;
        Ok(StorageThread {
            jobs: Some(tx),
            done,
            thread: Some(thread),
        })
    }

    pub(super) fn send(&self, job: StorageJob) {
        if let Some(tx) = &self.jobs {
            let _ = tx.send(job);
        }
    }

    pub(super) fn run(&self, tasks: Vec<StorageTask>) {
        for task in tasks {
            self.send(StorageJob::Coordinator(task));
        }
    }

    /// Waits until the work queued so far is done.
    pub(super) fn finish(&mut self) {
        drop(self.jobs.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for StorageThread {
    fn drop(&mut self) {
        self.finish();
    }
}

fn run(job: StorageJob, events: &Sender<JobEvent>, done: &Sender<StorageDone>) {
    match job {
        StorageJob::Coordinator(task) => {
            if let Some(finalized) = task.run() {
                let _ = events.send(JobEvent::Finalized(finalized));
            }
        }
        StorageJob::Load {
            seq,
            storage,
            job_id,
            id,
        } => {
            let result = load_checkpoint(storage.as_ref(), &job_id, id)
                .map(Box::new)
                .map_err(|e| e.to_string());
            let _ = done.send(StorageDone::Loaded { seq, id, result });
        }
        StorageJob::InitSinks { seq, sinks } => {
            let result = run_sink_inits(sinks);
            let _ = done.send(StorageDone::SinksReady { seq, result });
        }
    }
}
