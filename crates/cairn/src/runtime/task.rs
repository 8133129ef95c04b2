//! The subtask: one thread running one mailbox loop over its chain.
//!
//! A subtask takes one mail at a time — a batch, a barrier, an end of stream, or a message of
//! the job master — so operator state needs no locks. Parked elements of channels released by
//! the input gate go before new mail. Partial output batches are flushed when the mailbox runs
//! empty, so that batching never holds records back while the task would otherwise wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, TryRecvError};

use super::chain::{Event, SourceStatus, TaskBody};
use super::channel::{Barrier, Credit, Element, Mail};
use super::gate::{GateAction, InputGate};
use super::inject::FailureInjector;
use crate::checkpoint::restore::TaskStateFile;
use crate::checkpoint::{now_ms, TaskAck, TaskCheckpointStats};
use crate::error::{TaskError, TaskResult};
use crate::state::OperatorSnapshot;
use crate::storage::format::{encode, FileKind};
use crate::storage::layout::checkpoint_dir;
use crate::storage::CheckpointStorage;

/// What tasks and the uploader report to the job master.
#[derive(Debug)]
pub enum JobEvent {
    /// A subtask's state for a checkpoint is persisted.
    Ack(TaskAck),
    /// A subtask could not take part in a checkpoint.
    Decline {
        checkpoint_id: u64,
        attempt: u32,
        reason: String,
    },
    /// A source subtask read all its splits.
    SourceExhausted { attempt: u32, task: usize },
    /// A subtask's thread ended.
    Exited {
        attempt: u32,
        task: usize,
        result: TaskResult,
    },
}

/// Counters the progress line and the summary read.
#[derive(Debug, Default)]
pub struct JobMetrics {
    /// Records read by sources (including replays).
    pub records: AtomicU64,
}

/// A snapshot whose asynchronous part is waiting for the uploader.
pub struct UploadJob {
    checkpoint_id: u64,
    task_index: usize,
    attempt: u32,
    file: String,
    snapshots: Vec<OperatorSnapshot>,
    stats: TaskCheckpointStats,
}

/// Runs asynchronous snapshot parts (serialization, write) off the task threads.
pub fn run_uploader(
    jobs: Receiver<UploadJob>,
    events: Sender<JobEvent>,
    storage: Arc<dyn CheckpointStorage>,
    job_id: String,
) {
    for job in jobs {
        let t0 = Instant::now();
        let id = job.checkpoint_id;
        let path = format!("{}/{}", checkpoint_dir(&job_id, id), job.file);
        let result = (|| -> TaskResult<(Vec<String>, u64)> {
            let mut operators = Vec::with_capacity(job.snapshots.len());
            for s in job.snapshots {
                operators.push(s.finish()?);
            }
            let uids = operators.iter().map(|o| o.uid.clone()).collect();
            let bytes = encode(FileKind::TaskState, &TaskStateFile { operators })?;
            storage.write(&path, &bytes)?;
            Ok((uids, bytes.len() as u64))
        })();
        let event = match result {
            Ok((uids, size)) => {
                let mut stats = job.stats;
                stats.async_ms = t0.elapsed().as_millis() as u64;
                stats.state_size = size;
                JobEvent::Ack(TaskAck {
                    checkpoint_id: id,
                    task_index: job.task_index,
                    attempt: job.attempt,
                    file: Some(job.file),
                    uids,
                    stats,
                })
            }
            Err(e) => JobEvent::Decline {
                checkpoint_id: id,
                attempt: job.attempt,
                reason: format!(
                    "subtask '{}' could not persist its state: {e}",
                    job.stats.task
                ),
            },
        };
        if events.send(event).is_err() {
            return;
        }
    }
}

/// Everything one subtask runs with.
pub struct TaskRuntime {
    /// Index among all subtasks of the job.
    pub index: usize,
    /// Task vertex index (for failure injection and file names).
    pub vertex: usize,
    /// Task name.
    pub name: String,
    /// Uid of the head operator.
    pub head_uid: String,
    /// Subtask index.
    pub subtask: u32,
    /// Attempt number.
    pub attempt: u32,
    /// The chain.
    pub body: Box<dyn TaskBody>,
    /// Mailbox.
    pub mailbox: Receiver<Mail>,
    /// Barrier alignment over the input channels (None for sources).
    pub gate: Option<InputGate>,
    /// Input port of each channel.
    pub channel_ports: Vec<usize>,
    /// Credits of each input channel.
    pub credits: Vec<Arc<Credit>>,
    /// Reports to the job master.
    pub events: Sender<JobEvent>,
    /// Asynchronous snapshot parts.
    pub uploader: Sender<UploadJob>,
    /// Planned failures.
    pub injector: Option<Arc<FailureInjector>>,
    /// Shared counters.
    pub metrics: Arc<JobMetrics>,
    /// Whether checkpointing is on.
    pub checkpointing: bool,
}

impl TaskRuntime {
    /// Runs the subtask to its end.
    pub fn run(mut self) -> TaskResult {
        if self.gate.is_some() {
            self.run_operator()
        } else {
            self.run_source()
        }
    }

    fn inject(&self, records: usize) -> TaskResult {
        match &self.injector {
            Some(i) => i.check(self.attempt, self.vertex, &self.head_uid, records),
            None => Ok(()),
        }
    }

    fn checkpoint(&mut self, barrier: Barrier, alignment: Duration) -> TaskResult {
        let t0 = Instant::now();
        let mut snapshots = Vec::new();
        self.body.snapshot(barrier.id, &mut snapshots)?;
        self.body.emit(Event::Barrier(barrier))?;
        snapshots.retain(|s| !s.is_empty());
        let stats = TaskCheckpointStats {
            task: self.name.clone(),
            subtask: self.subtask,
            sync_ms: t0.elapsed().as_millis() as u64,
            async_ms: 0,
            alignment_ms: alignment.as_millis() as u64,
            start_delay_ms: now_ms().saturating_sub(barrier.timestamp_ms),
            state_size: 0,
        };
        if snapshots.is_empty() {
            let _ = self.events.send(JobEvent::Ack(TaskAck {
                checkpoint_id: barrier.id,
                task_index: self.index,
                attempt: self.attempt,
                file: None,
                uids: Vec::new(),
                stats,
            }));
            return Ok(());
        }
        self.uploader
            .send(UploadJob {
                checkpoint_id: barrier.id,
                task_index: self.index,
                attempt: self.attempt,
                file: format!("task-{}-{}", self.vertex, self.subtask),
                snapshots,
                stats,
            })
            .map_err(|_| TaskError::Cancelled)
    }

    fn control(&mut self, mail: Mail) -> TaskResult<bool> {
        match mail {
            Mail::CheckpointComplete(id) => self.body.notify_complete(id)?,
            Mail::CheckpointAborted(id) => self.body.notify_aborted(id)?,
            Mail::Cancel => return Err(TaskError::Cancelled),
            Mail::TriggerCheckpoint(b) => self.checkpoint(b, Duration::ZERO)?,
            Mail::EndOfInput => {
                self.body.end_input(0)?;
                self.body.emit(Event::EndOfStream)?;
                return Ok(true);
            }
            Mail::Data { .. } => {}
        }
        Ok(false)
    }

    fn run_source(&mut self) -> TaskResult {
        let mut exhausted = false;
        loop {
            let mail = if exhausted {
                self.body.flush()?;
                Some(self.mailbox.recv().map_err(|_| TaskError::Cancelled)?)
            } else {
                match self.mailbox.try_recv() {
                    Ok(m) => Some(m),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return Err(TaskError::Cancelled),
                }
            };
            if let Some(mail) = mail {
                if self.control(mail)? {
                    return Ok(());
                }
                continue;
            }
            let (n, status) = self.body.poll_source()?;
            self.metrics.records.fetch_add(n as u64, Ordering::Relaxed);
            self.inject(n)?;
            if status == SourceStatus::Exhausted {
                exhausted = true;
                self.body.flush()?;
                if self.checkpointing {
                    // Wait for the final checkpoint: end of stream goes out only after it completed,
                    // so that everything read is committed exactly once.
                    let _ = self.events.send(JobEvent::SourceExhausted {
                        attempt: self.attempt,
                        task: self.index,
                    });
                } else {
                    self.body.end_input(0)?;
                    self.body.emit(Event::EndOfStream)?;
                    return Ok(());
                }
            }
        }
    }

    fn run_operator(&mut self) -> TaskResult {
        let Some(mut gate) = self.gate.take() else {
            return Err(TaskError::msg("operator task without input gate"));
        };
        let ports = self
            .channel_ports
            .iter()
            .copied()
            .max()
            .map_or(0, |m| m + 1);
        let mut open_per_port = vec![0usize; ports];
        for &p in &self.channel_ports {
            open_per_port[p] += 1;
        }
        loop {
            let (ch, element) = match gate.next_parked() {
                Some(x) => x,
                None => {
                    let mail = match self.mailbox.try_recv() {
                        Ok(m) => m,
                        Err(TryRecvError::Empty) => {
                            self.body.flush()?;
                            self.mailbox.recv().map_err(|_| TaskError::Cancelled)?
                        }
                        Err(TryRecvError::Disconnected) => return Err(TaskError::Cancelled),
                    };
                    match mail {
                        Mail::Data { channel, element } => match gate.accept(channel, element) {
                            Some(e) => (channel, e),
                            None => continue,
                        },
                        other => {
                            self.control(other)?;
                            continue;
                        }
                    }
                }
            };
            let port = self.channel_ports[ch];
            match element {
                Element::Batch(batch) => {
                    self.credits[ch].release();
                    let n = self.body.process(port, batch)?;
                    self.inject(n)?;
                }
                Element::Barrier(b) => match gate.on_barrier(ch, b) {
                    GateAction::Snapshot { barrier, alignment } => {
                        self.checkpoint(barrier, alignment)?
                    }
                    GateAction::Decline { id } => {
                        let _ = self.events.send(JobEvent::Decline {
                            checkpoint_id: id,
                            attempt: self.attempt,
                            reason: format!(
                                "subtask '{}' #{} saw a newer barrier while aligning",
                                self.name, self.subtask
                            ),
                        });
                    }
                    GateAction::None => {}
                },
                Element::EndOfStream => {
                    if let GateAction::Snapshot { barrier, alignment } = gate.on_end_of_stream(ch) {
                        self.checkpoint(barrier, alignment)?;
                    }
                    open_per_port[port] -= 1;
                    if open_per_port[port] == 0 {
                        self.body.end_input(port)?;
                    }
                    if gate.all_ended() {
                        self.body.emit(Event::EndOfStream)?;
                        return Ok(());
                    }
                }
            }
        }
    }
}
