//! The subtask: one thread running one mailbox loop over its chain.
//!
//! A subtask takes one mail at a time — a batch, a barrier, an end of stream, or a message of
//! the job master — so operator state needs no locks. Parked elements of channels released by
//! the input gate go before new mail. Partial output batches are flushed when the mailbox runs
//! empty, so that batching never holds records back while the task would otherwise wait.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Select, Sender, TryRecvError};

use super::chain::{Event, SourceStatus, TaskBody};
use super::channel::{Barrier, BarrierKind, CreditReturn, Element, Mail};
use super::gate::{GateAction, InputGate, Now};
use super::inject::FailureInjector;
use super::watermark::{WatermarkOutput, WatermarkValve};
use crate::checkpoint::restore::TaskStateFile;
use crate::checkpoint::{now_ms, DeclineCause, OperatorStates, TaskAck, TaskCheckpointStats};
use crate::error::{TaskError, TaskResult};
use crate::state::{ChannelStateData, OperatorSnapshot, UploadTarget};
use crate::storage::format::{encode, FileKind};
use crate::storage::layout::checkpoint_dir;
use crate::storage::CheckpointStorage;

/// How often a task looks for timed-out barriers queued in its mailbox (aligned-with-timeout).
const PROMOTE_CHECK_INTERVAL: Duration = Duration::from_millis(5);

/// What tasks and the uploader report to the job master.
#[derive(Debug)]
pub enum JobEvent {
    /// A subtask's state for a checkpoint is persisted.
    Ack(TaskAck),
    /// A subtask could not take part in a checkpoint.
    Decline {
        checkpoint_id: u64,
        attempt: u32,
        cause: DeclineCause,
    },
    /// A source subtask read all its splits.
    SourceExhausted { attempt: u32, task: usize },
    /// A subtask's thread ended.
    Exited {
        attempt: u32,
        task: usize,
        result: TaskResult,
    },
    /// Subtasks of these attempts were lost (their worker died, or left): one failure,
    /// however many attempts (regions) it takes down. `planned`: the worker left on purpose
    /// (drained), and the restart spends none of the restart strategy's budget.
    Lost {
        attempts: Vec<u32>,
        reason: String,
        planned: bool,
    },
    /// The job master's storage work finalized a checkpoint (wrote its `_metadata`), or
    /// could not.
    Finalized(crate::checkpoint::Finalized),
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
        let result = (|| -> TaskResult<(Vec<OperatorStates>, u64, Vec<String>)> {
            let target = UploadTarget {
                storage: storage.as_ref(),
                job_id: &job_id,
                checkpoint_id: id,
                file: &job.file,
            };
            let mut operators = Vec::with_capacity(job.snapshots.len());
            let mut disk = Vec::new();
            for s in job.snapshots {
                let (data, handle) = s.finish_to(&target)?;
                operators.push(data);
                disk.extend(handle);
            }
            let uids = operators
                .iter()
                .map(|o| {
                    let mut states = o.descriptors();
                    if let Some(d) = disk.iter().find(|d| d.uid == o.uid) {
                        states.extend(d.states.iter().cloned());
                    }
                    OperatorStates {
                        uid: o.uid.clone(),
                        states,
                    }
                })
                .collect();
            let shared: Vec<String> = disk
                .iter()
                .flat_map(|d| d.shared_files().map(str::to_string))
                .collect();
            let disk_bytes: u64 = disk.iter().map(|d| d.size()).sum();
            let bytes = encode(FileKind::TaskState, &TaskStateFile { operators, disk })?;
            storage.write(&path, &bytes)?;
            crate::failpoint::hit("upload", id);
            Ok((uids, bytes.len() as u64 + disk_bytes, shared))
        })();
        let event = match result {
            Ok((uids, size, shared_files)) => {
                let mut stats = job.stats;
                stats.async_ms = t0.elapsed().as_millis() as u64;
                stats.state_size = size;
                JobEvent::Ack(TaskAck {
                    checkpoint_id: id,
                    task_index: job.task_index,
                    attempt: job.attempt,
                    file: Some(job.file),
                    operators: uids,
                    stats,
                    shared_files,
                })
            }
            Err(e) => JobEvent::Decline {
                checkpoint_id: id,
                attempt: job.attempt,
                cause: DeclineCause::Failed(format!(
                    "subtask '{}' could not persist its state: {e}",
                    job.stats.task
                )),
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
    /// Priority mailbox: unaligned barriers, taken before anything else.
    pub priority: Receiver<Mail>,
    /// Aligned-checkpoint timeout (switch to unaligned after it), if configured.
    pub aligned_timeout: Option<Duration>,
    /// In-flight data restored from an unaligned checkpoint, replayed before new input.
    pub restored_channels: Option<ChannelStateData>,
    /// An unaligned snapshot waiting for its channel state.
    pub held: Option<UploadJob>,
    /// Mail taken out of the mailbox early (to record in-flight data at an unaligned cut);
    /// processed before the mailbox.
    pub inbox: std::collections::VecDeque<Mail>,
    /// Barrier alignment over the input channels (None for sources).
    pub gate: Option<InputGate>,
    /// Input port of each channel.
    pub channel_ports: Vec<usize>,
    /// Credits of each input channel (returned locally or over the network).
    pub credits: Vec<Arc<dyn CreditReturn>>,
    /// Reports to the job master.
    pub events: Sender<JobEvent>,
    /// Asynchronous snapshot parts.
    pub uploader: Sender<UploadJob>,
    /// Planned failures.
    pub injector: Option<Arc<FailureInjector>>,
    /// Shared counters.
    pub metrics: Arc<JobMetrics>,
    /// This subtask's metrics (None: `metrics.enabled: false`).
    pub io: Option<Arc<crate::metrics::SubtaskMetrics>>,
    /// Whether checkpointing is on.
    pub checkpointing: bool,
    /// A source starts stopped: it reads nothing and waits for end of input.
    pub stopped: bool,
}

impl TaskRuntime {
    /// Runs the subtask to its end.
    pub fn run(&mut self) -> TaskResult {
        let metrics = crate::metrics::enter(self.io.clone());
        let result = if self.gate.is_some() {
            self.run_operator()
        } else {
            self.run_source()
        };
        if result.is_ok() {
            metrics.finished();
        }
        result
    }

    fn inject(&self) -> TaskResult {
        match &self.injector {
            Some(i) => i.check(
                self.attempt,
                self.vertex,
                &self.head_uid,
                self.metrics.records.load(Ordering::Relaxed),
            ),
            None => Ok(()),
        }
    }

    /// Takes the synchronous snapshot of checkpoint `barrier`; an unaligned one is held until
    /// its channel state is complete (the gate says when, [`GateAction::ChannelState`]).
    fn snapshot(&mut self, barrier: Barrier, alignment: Duration, unaligned: bool) -> TaskResult {
        let t0 = Instant::now();
        let mut snapshots = Vec::new();
        self.body.snapshot(barrier, &mut snapshots)?;
        snapshots.retain(|s| !s.is_empty());
        let stats = TaskCheckpointStats {
            task: self.name.clone(),
            subtask: self.subtask,
            sync_ms: t0.elapsed().as_millis() as u64,
            async_ms: 0,
            alignment_ms: alignment.as_millis() as u64,
            start_delay_ms: now_ms().saturating_sub(barrier.timestamp_ms),
            state_size: 0,
            channel_state_size: 0,
            unaligned,
        };
        let job = UploadJob {
            checkpoint_id: barrier.id,
            task_index: self.index,
            attempt: self.attempt,
            file: format!("task-{}-{}", self.vertex, self.subtask),
            snapshots,
            stats,
        };
        if unaligned {
            self.held = Some(job);
            return Ok(());
        }
        self.submit(job)
    }

    /// Attaches the channel state of an unaligned checkpoint to its held snapshot and uploads it.
    fn channel_state_done(
        &mut self,
        id: u64,
        channels: Vec<(usize, Vec<Vec<u8>>)>,
        bytes: u64,
    ) -> TaskResult {
        let Some(mut job) = self.held.take_if(|j| j.checkpoint_id == id) else {
            return Ok(());
        };
        if !channels.is_empty() {
            let data = ChannelStateData {
                channels_total: self.channel_ports.len() as u32,
                channels: channels.into_iter().map(|(c, b)| (c as u32, b)).collect(),
            };
            match job.snapshots.iter_mut().find(|s| s.uid() == self.head_uid) {
                Some(s) => s.set_channel_state(data),
                None => {
                    let mut s = OperatorSnapshot::new(self.head_uid.clone());
                    s.set_channel_state(data);
                    job.snapshots.insert(0, s);
                }
            }
        }
        job.stats.channel_state_size = bytes;
        self.submit(job)
    }

    fn submit(&mut self, job: UploadJob) -> TaskResult {
        let UploadJob {
            checkpoint_id,
            snapshots,
            stats,
            ..
        } = &job;
        if snapshots.is_empty() {
            let _ = self.events.send(JobEvent::Ack(TaskAck {
                checkpoint_id: *checkpoint_id,
                task_index: self.index,
                attempt: self.attempt,
                file: None,
                operators: Vec::new(),
                stats: stats.clone(),
                shared_files: Vec::new(),
            }));
            return Ok(());
        }
        self.uploader.send(job).map_err(|_| TaskError::Cancelled)
    }

    /// Performs what the barrier handler decided.
    fn act(&mut self, action: GateAction) -> TaskResult {
        match action {
            GateAction::Snapshot {
                barrier,
                alignment,
                unaligned,
            } => self.snapshot(barrier, alignment, unaligned),
            GateAction::Forward { barrier, unaligned } => self.body.emit(if unaligned {
                Event::UnalignedBarrier(barrier)
            } else {
                Event::Barrier(barrier)
            }),
            GateAction::ChannelState {
                id,
                channels,
                bytes,
            } => self.channel_state_done(id, channels, bytes),
            GateAction::Discard { id } => {
                if self.held.as_ref().is_some_and(|j| j.checkpoint_id == id) {
                    self.held = None;
                }
                self.body.notify_aborted(id)
            }
            GateAction::Decline { id, cause } => {
                if self.held.as_ref().is_some_and(|j| j.checkpoint_id == id) {
                    self.held = None;
                }
                let _ = self.events.send(JobEvent::Decline {
                    checkpoint_id: id,
                    attempt: self.attempt,
                    cause,
                });
                Ok(())
            }
            GateAction::NotifyComplete { id } => self.body.notify_complete(id),
            GateAction::FailAbortedAtEnd { id } => Err(TaskError::msg(format!(
                "checkpoint {id} was aborted after the input of subtask '{}' #{} ended; its \
                 pre-committed output must be replayed",
                self.name, self.subtask
            ))),
        }
    }

    fn act_all(&mut self, actions: impl IntoIterator<Item = GateAction>) -> TaskResult {
        for a in actions {
            self.act(a)?;
        }
        Ok(())
    }

    /// Control mail (not data); returns true once a source's input ended.
    fn control(&mut self, gate: &mut InputGate, mail: Mail) -> TaskResult<bool> {
        match mail {
            Mail::CheckpointComplete(id) => {
                let a = gate.on_complete(id);
                self.act(a)?;
            }
            Mail::CheckpointAborted(id) => {
                let actions = gate.on_abort(id);
                self.act_all(actions)?;
            }
            Mail::Cancel => return Err(TaskError::Cancelled),
            Mail::TriggerCheckpoint(b, kind) => {
                let actions = gate.on_trigger(b, kind);
                self.act_all(actions)?;
            }
            Mail::PriorityBarrier {
                channel,
                barrier,
                batches_before,
            } => self.on_priority_barrier(gate, channel, barrier, batches_before)?,
            Mail::EndOfInput => {
                gate.end_input();
                self.body.end_input(0)?;
                self.body.emit(Event::EndOfStream)?;
                return Ok(true);
            }
            Mail::Data { .. } => {}
        }
        Ok(false)
    }

    /// The input ended: serve the mailbox until every snapshot taken has an outcome, so that
    /// no pre-committed output is left uncommitted when the task finishes (in cluster mode the
    /// completion travels on another connection than the end of stream).
    fn finish(&mut self, gate: &mut InputGate) -> TaskResult {
        while !gate.may_exit() {
            let mail = match self.inbox.pop_front() {
                Some(m) => m,
                None => self.mailbox.recv().map_err(|_| TaskError::Cancelled)?,
            };
            self.control(gate, mail)?;
        }
        Ok(())
    }

    fn run_source(&mut self) -> TaskResult {
        // A source has no input channel; the handler still decides its barriers and outcomes.
        let mut gate = InputGate::new(0, super::gate::AlignmentMode::Aligned);
        let mut exhausted = false;
        // Restored at a completed stop-with-savepoint: no checkpoint id resumes it.
        let mut stopped: Option<u64> = self.stopped.then_some(0);
        // The stop it waits at sent the maximum watermark.
        let mut drained = false;
        let mut idle_until: Option<Instant> = None;
        loop {
            let timer = self.body.next_processing_timer();
            if timer.is_some_and(|t| wall_ms() >= t) {
                self.body.processing_time(wall_ms())?;
                continue;
            }
            let mail = if exhausted || stopped.is_some() {
                self.body.flush()?;
                let since = Instant::now();
                let mail = match timer {
                    None => Some(self.mailbox.recv().map_err(|_| TaskError::Cancelled)?),
                    Some(t) => match self.mailbox.recv_deadline(instant_of(t)) {
                        Ok(m) => Some(m),
                        Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                        Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                            return Err(TaskError::Cancelled)
                        }
                    },
                };
                crate::metrics::idle(since.elapsed());
                mail
            } else if let Some(until) = idle_until.take() {
                // A throttled source has nothing yet: wait for mail, at most until it has.
                self.body.flush()?;
                let until = earlier(Some(until), timer.map(instant_of)).unwrap_or(until);
                let since = Instant::now();
                let mail = match self.mailbox.recv_deadline(until) {
                    Ok(m) => Some(m),
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => None,
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                        return Err(TaskError::Cancelled)
                    }
                };
                crate::metrics::idle(since.elapsed());
                mail
            } else {
                match self.mailbox.try_recv() {
                    Ok(m) => Some(m),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => return Err(TaskError::Cancelled),
                }
            };
            if let Some(mail) = mail {
                // Stop-with-savepoint: after its barrier the source reads nothing more, unless
                // the savepoint fails.
                let stop_at = match &mail {
                    Mail::TriggerCheckpoint(b, BarrierKind::Stop { drain }) => {
                        if *drain {
                            // In front of the barrier: every event-time result is in the
                            // savepoint.
                            self.body.end_event_time()?;
                            drained = true;
                        }
                        Some(b.id)
                    }
                    _ => None,
                };
                let resumed = matches!(&mail, Mail::CheckpointAborted(id) if stopped == Some(*id));
                if resumed && drained {
                    // Event time has ended and cannot go back: the job must not go on from
                    // here. A restart restores the last checkpoint, from before the drain.
                    return Err(TaskError::msg(format!(
                        "stop-with-savepoint {} failed after the sources drained event time; \
                         restarting from the last checkpoint",
                        stopped.unwrap_or_default()
                    )));
                }
                if self.control(&mut gate, mail)? {
                    return self.finish(&mut gate);
                }
                if stop_at.is_some() {
                    stopped = stop_at;
                }
                if resumed {
                    stopped = None;
                }
                continue;
            }
            if exhausted || stopped.is_some() {
                continue;
            }
            let (n, status) = self.body.poll_source()?;
            self.metrics.records.fetch_add(n as u64, Ordering::Relaxed);
            if let Some(io) = &self.io {
                io.records_read.fetch_add(n as u64, Ordering::Relaxed);
            }
            self.inject()?;
            if let SourceStatus::IdleUntil(until) = status {
                idle_until = Some(until);
            }
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

    /// Waits for priority or regular mail, until `deadline` (None: timer expired).
    /// Only the mailbox disconnecting cancels the task: the priority mailbox's senders may all
    /// be gone while regular mail (the upstream tasks' ends of stream) is still queued.
    fn wait(&self, deadline: Option<Instant>) -> TaskResult<Option<Mail>> {
        let mut sel = Select::new();
        let p = sel.recv(&self.priority);
        sel.recv(&self.mailbox);
        loop {
            let oper = match deadline {
                Some(d) => match sel.select_deadline(d) {
                    Ok(o) => o,
                    Err(_) => return Ok(None),
                },
                None => sel.select(),
            };
            if oper.index() != p {
                let mail = oper.recv(&self.mailbox);
                return mail.map(Some).map_err(|_| TaskError::Cancelled);
            }
            match oper.recv(&self.priority) {
                Ok(mail) => return Ok(Some(mail)),
                Err(_) => {
                    sel.remove(p);
                }
            }
        }
    }

    /// Takes everything queued in the mailbox into the inbox, so the handler can look at it.
    fn take_mailbox(&mut self) {
        while let Ok(m) = self.mailbox.try_recv() {
            self.inbox.push_back(m);
        }
    }

    /// Records, without waiting to process them, the queued batches that are in flight at the
    /// pending unaligned cut (the handler picks them). Bounded by the channels' credits.
    fn capture_in_flight(&mut self, gate: &mut InputGate) -> TaskResult {
        if gate.pending_unaligned().is_none() {
            return Ok(());
        }
        self.take_mailbox();
        // A batch taken from the mailbox may have been sent after its channel's priority
        // barrier; that barrier is in the priority mailbox by now, so take it first.
        self.drain_priority(gate)?;
        let (body, ports) = (&mut self.body, &self.channel_ports);
        gate.capture_parked(|c, element| match element {
            Element::Batch(batch) => body.encode_batch(ports[c], &**batch).map(Some),
            Element::Encoded(bytes) => Ok(Some(bytes.clone())),
            _ => Ok(None),
        })?;
        let mut plan = Vec::new();
        gate.plan_capture(self.inbox.iter().map(data_of), &mut plan);
        for (i, c, seq) in plan {
            if let Some(Mail::Data {
                element: Element::Batch(batch),
                ..
            }) = self.inbox.get(i)
            {
                let bytes = self.body.encode_batch(self.channel_ports[c], &**batch)?;
                gate.capture(c, seq, bytes);
            } else if let Some(Mail::Data {
                element: Element::Encoded(bytes),
                ..
            }) = self.inbox.get(i)
            {
                gate.capture(c, seq, bytes.clone());
            }
        }
        if let Some(a) = gate.check_channel_state() {
            self.act(a)?;
        }
        Ok(())
    }

    /// Applies every priority barrier already sent (without capturing).
    fn drain_priority(&mut self, gate: &mut InputGate) -> TaskResult {
        while let Ok(m) = self.priority.try_recv() {
            match m {
                Mail::PriorityBarrier {
                    channel,
                    barrier,
                    batches_before,
                } => {
                    let actions = gate.on_priority_barrier(channel, barrier, batches_before, now());
                    self.act_all(actions)?;
                }
                other => {
                    self.control(gate, other)?;
                }
            }
        }
        Ok(())
    }

    fn on_priority_barrier(
        &mut self,
        gate: &mut InputGate,
        channel: usize,
        barrier: Barrier,
        before: u64,
    ) -> TaskResult {
        let actions = gate.on_priority_barrier(channel, barrier, before, now());
        self.act_all(actions)?;
        self.capture_in_flight(gate)
    }

    /// Aligned-with-timeout: lets the handler pick an in-band barrier queued past the timeout to
    /// overtake the data before it.
    fn promote_timed_out_barriers(&mut self, gate: &mut InputGate) -> TaskResult {
        self.take_mailbox();
        if let Some((i, channel, barrier, before)) =
            gate.promotion(self.inbox.iter().map(data_of), now())
        {
            self.inbox.remove(i);
            self.on_priority_barrier(gate, channel, barrier, before)?;
        }
        Ok(())
    }

    fn replay_channel_state(&mut self) -> TaskResult {
        let Some(state) = self.restored_channels.take() else {
            return Ok(());
        };
        if state.channels_total as usize != self.channel_ports.len() {
            return Err(TaskError::msg(format!(
                "task '{}' #{}: the checkpoint holds in-flight data for {} input channels, the task has {}; \
                 an unaligned checkpoint cannot be restored with changed parallelism",
                self.name,
                self.subtask,
                state.channels_total,
                self.channel_ports.len()
            )));
        }
        for (ch, batches) in state.channels {
            let port = self.channel_ports[ch as usize];
            for bytes in batches {
                let batch = self.body.decode_batch(port, &bytes)?;
                self.body.process(port, batch)?;
            }
        }
        Ok(())
    }

    fn run_operator(&mut self) -> TaskResult {
        let Some(gate) = self.gate.take() else {
            return Err(TaskError::msg("operator task without input gate"));
        };
        let mut gate = gate.with_aligned_timeout(self.aligned_timeout);
        // In-flight data of the restored checkpoint goes before any new input.
        self.replay_channel_state()?;
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
        let mut valve = WatermarkValve::new(self.channel_ports.len());
        let mut next_promote_check = Instant::now();
        let mut timer = self.body.next_processing_timer();
        loop {
            if let Some(t) = timer {
                if wall_ms() >= t {
                    self.body.processing_time(wall_ms())?;
                    timer = self.body.next_processing_timer();
                }
            }
            if gate.promotes() && Instant::now() >= next_promote_check {
                next_promote_check = Instant::now() + PROMOTE_CHECK_INTERVAL;
                self.promote_timed_out_barriers(&mut gate)?;
            }
            if let Some(d) = gate.deadline() {
                let t = now();
                if t.at >= d {
                    let actions = gate.on_timer(t);
                    self.act_all(actions)?;
                    self.capture_in_flight(&mut gate)?;
                }
            }
            // Unaligned barriers overtake everything queued.
            if let Ok(mail) = self.priority.try_recv() {
                self.control(&mut gate, mail)?;
                continue;
            }
            let (ch, element) = match gate.next_parked() {
                Some(x) => x,
                None => {
                    let mail = match self.inbox.pop_front() {
                        Some(m) => m,
                        None => match self.mailbox.try_recv() {
                            Ok(m) => m,
                            Err(TryRecvError::Empty) => {
                                self.body.flush()?;
                                let deadline = earlier(gate.deadline(), timer.map(instant_of));
                                let since = Instant::now();
                                let mail = self.wait(deadline)?;
                                crate::metrics::idle(since.elapsed());
                                match mail {
                                    Some(m) => m,
                                    None => continue,
                                }
                            }
                            Err(TryRecvError::Disconnected) => return Err(TaskError::Cancelled),
                        },
                    };
                    match mail {
                        Mail::Data { channel, element } => match gate.accept(channel, element) {
                            Some(e) => (channel, e),
                            None => continue,
                        },
                        other => {
                            self.control(&mut gate, other)?;
                            continue;
                        }
                    }
                }
            };
            let port = self.channel_ports[ch];
            let (batch, encoded) = match element {
                Element::Encoded(bytes) => {
                    if let Some(io) = &self.io {
                        io.bytes_in.fetch_add(bytes.len() as u64, Ordering::Relaxed);
                    }
                    (self.body.decode_batch(port, &bytes)?, Some(bytes))
                }
                Element::Batch(batch) => (batch, None),
                other => {
                    self.handle_event(&mut gate, &mut valve, ch, port, other, &mut open_per_port)?;
                    timer = self.body.next_processing_timer();
                    if gate.all_ended() {
                        return self.finish(&mut gate);
                    }
                    continue;
                }
            };
            self.credits[ch].release();
            valve.on_records(ch);
            if !self.priority.is_empty() {
                // A priority barrier sent before this batch is in the priority mailbox by now
                // (it may have arrived after the loop last looked): it goes first, or a batch
                // after the cut would be processed as if it were before it.
                self.drain_priority(&mut gate)?;
            }
            let recorded = if gate.before_batch(ch) {
                match encoded {
                    Some(bytes) => Some(bytes),
                    None => Some(self.body.encode_batch(port, &*batch)?),
                }
            } else {
                None
            };
            let n = self.body.process(port, batch)?;
            if let Some(io) = &self.io {
                io.records_in.fetch_add(n as u64, Ordering::Relaxed);
                io.inputs_queued
                    .store(self.mailbox.len() as u64, Ordering::Relaxed);
            }
            timer = self.body.next_processing_timer();
            self.inject()?;
            if let Some(a) = gate.after_batch(ch, recorded) {
                self.act(a)?;
            }
        }
    }

    fn handle_event(
        &mut self,
        gate: &mut InputGate,
        valve: &mut WatermarkValve,
        ch: usize,
        port: usize,
        element: Element,
        open_per_port: &mut [usize],
    ) -> TaskResult {
        match element {
            Element::Barrier(b) => {
                let was_unaligned = gate.pending_unaligned().is_some();
                let actions = gate.on_barrier(ch, b, now());
                self.act_all(actions)?;
                if !was_unaligned {
                    self.capture_in_flight(gate)?;
                }
            }
            Element::Watermark(w) => self.watermark_out(valve.on_watermark(ch, w))?,
            Element::Idle => self.watermark_out(valve.on_idle(ch))?,
            Element::EndOfStream => {
                // End of stream moves no event time: a source read to its end sent the maximum
                // watermark before its final checkpoint already, and after a stop-with-savepoint
                // (without drain) windows must not fire past the savepoint.
                let actions = gate.on_end_of_stream(ch, now());
                self.act_all(actions)?;
                open_per_port[port] -= 1;
                if open_per_port[port] == 0 {
                    self.body.end_input(port)?;
                }
                if gate.all_ended() {
                    self.body.emit(Event::EndOfStream)?;
                }
            }
            Element::Batch(_) | Element::Encoded(_) => {}
        }
        Ok(())
    }
}

impl TaskRuntime {
    /// Passes what the input watermarks decided to the chain.
    fn watermark_out(&mut self, out: Option<WatermarkOutput>) -> TaskResult {
        match out {
            Some(WatermarkOutput::Watermark(w)) => {
                crate::metrics::watermark(w);
                self.body.watermark(w)
            }
            Some(WatermarkOutput::Idle) => self.body.emit(Event::Idle),
            None => Ok(()),
        }
    }
}

/// Wall-clock time in ms since the epoch (processing time).
fn wall_ms() -> i64 {
    crate::checkpoint::now_ms() as i64
}

/// The instant at which wall-clock time reaches `ms`.
fn instant_of(ms: i64) -> Instant {
    let ahead = ms.saturating_sub(wall_ms()).max(0) as u64;
    Instant::now() + Duration::from_millis(ahead)
}

/// The earlier of two optional deadlines.
fn earlier(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The time now, as the barrier handler takes it.
fn now() -> Now {
    Now {
        at: Instant::now(),
        wall_ms: now_ms(),
    }
}

/// Data mail as the barrier handler looks at the mailbox.
fn data_of(mail: &Mail) -> Option<(usize, &Element)> {
    match mail {
        Mail::Data { channel, element } => Some((*channel, element)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::runtime::chain::{Chain, Link, NullChain, OneInputBody, Operator};

    struct Record(Arc<Mutex<Vec<u32>>>);

    impl Operator<u32, ()> for Record {
        fn process(&mut self, input: &mut Vec<u32>, _out: &mut Vec<()>) -> TaskResult {
            self.0.lock().unwrap().extend(input.drain(..));
            Ok(())
        }
    }

    /// A one-input subtask over `channels` input channels of port 0, with the senders of its
    /// mailbox and priority mailbox (kept alive by the caller).
    fn operator_task(
        chain: Box<dyn Chain<u32>>,
        channels: usize,
        restored: ChannelStateData,
    ) -> (TaskRuntime, Sender<Mail>, Sender<Mail>) {
        let (mail_tx, mailbox) = crossbeam_channel::unbounded();
        let (prio_tx, priority) = crossbeam_channel::unbounded();
        // The receiving ends are dropped: reports of these tests go nowhere.
        let (events, _) = crossbeam_channel::unbounded();
        let (uploader, _) = crossbeam_channel::unbounded();
        let rt = TaskRuntime {
            index: 0,
            vertex: 0,
            name: "test".into(),
            head_uid: "op".into(),
            subtask: 0,
            attempt: 0,
            body: Box::new(OneInputBody::new(chain)),
            mailbox,
            priority,
            aligned_timeout: None,
            restored_channels: Some(restored),
            held: None,
            inbox: Default::default(),
            gate: Some(InputGate::new(
                channels,
                crate::runtime::gate::AlignmentMode::Aligned,
            )),
            channel_ports: vec![0; channels],
            credits: (0..channels)
                .map(|_| crate::runtime::channel::Credit::new(8) as Arc<dyn CreditReturn>)
                .collect(),
            events,
            uploader,
            injector: None,
            metrics: Arc::default(),
            io: None,
            checkpointing: true,
            stopped: false,
        };
        (rt, mail_tx, prio_tx)
    }

    /// Every sender of priority mail gone (the upstream tasks ended) is no cancellation: the
    /// wait goes on to the mail still queued and then to the end of the input.
    #[test]
    fn a_wait_takes_queued_mail_after_the_priority_channel_disconnected() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let chain: Box<dyn Chain<u32>> =
            Box::new(Link::new(Record(seen.clone()), Box::new(NullChain)));
        let restored = ChannelStateData {
            channels_total: 1,
            channels: Vec::new(),
        };
        let (mut rt, mail_tx, prio_tx) = operator_task(chain, 1, restored);
        drop(prio_tx);
        let runner = std::thread::spawn(move || rt.run());
        // Sent apart, so the task waits with the priority mailbox disconnected in between.
        for element in [7u32, 8, 9]
            .map(|r| Element::Batch(Box::new(vec![r])))
            .into_iter()
            .chain([Element::EndOfStream])
        {
            std::thread::park_timeout(Duration::from_millis(20));
            // A task that ended dropped its mailbox: the join below says why.
            let _ = mail_tx.send(Mail::Data {
                channel: 0,
                element,
            });
        }
        runner.join().unwrap().expect("the task finishes its input");
        assert_eq!(*seen.lock().unwrap(), vec![7, 8, 9]);
    }

    #[test]
    fn restored_channel_state_is_replayed_before_new_input() {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let chain: Box<dyn Chain<u32>> =
            Box::new(Link::new(Record(seen.clone()), Box::new(NullChain)));
        let enc = |v: Vec<u32>| postcard::to_stdvec(&v).unwrap();
        let restored = ChannelStateData {
            channels_total: 2,
            channels: vec![
                (0, vec![enc(vec![1, 2]), enc(vec![3])]),
                (1, vec![enc(vec![4])]),
            ],
        };
        let (mut rt, mail_tx, _prio_tx) = operator_task(chain, 2, restored);
        // New input is already waiting when the task starts.
        mail_tx
            .send(Mail::Data {
                channel: 1,
                element: Element::Batch(Box::new(vec![100u32])),
            })
            .unwrap();
        for channel in 0..2 {
            mail_tx
                .send(Mail::Data {
                    channel,
                    element: Element::EndOfStream,
                })
                .unwrap();
        }
        rt.run().unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![1, 2, 3, 4, 100]);
    }

    /// Commits of a sink: which checkpoints it was told completed.
    struct Committer(Arc<Mutex<Vec<u64>>>);

    impl Operator<u32, ()> for Committer {
        fn process(&mut self, input: &mut Vec<u32>, _out: &mut Vec<()>) -> TaskResult {
            input.clear();
            Ok(())
        }
        fn notify_complete(&mut self, id: u64) -> TaskResult {
            self.0.lock().unwrap().push(id);
            Ok(())
        }
    }

    fn barrier(id: u64) -> Barrier {
        Barrier {
            id,
            timestamp_ms: now_ms(),
            aligned_only: true,
            savepoint: false,
        }
    }

    /// Delivers barrier `id` and then end of stream on input channel 0.
    fn send_barrier_then_end(mail_tx: &Sender<Mail>, id: u64) {
        for element in [Element::Barrier(barrier(id)), Element::EndOfStream] {
            mail_tx
                .send(Mail::Data {
                    channel: 0,
                    element,
                })
                .unwrap();
        }
    }

    /// Defect 3.2: end of stream may arrive before the completion of the final checkpoint (in
    /// cluster mode they travel on different connections); the task finishes only after it.
    #[test]
    fn a_task_whose_input_ended_finishes_only_after_its_last_checkpoint_completed() {
        let commits = Arc::new(Mutex::new(Vec::new()));
        let chain: Box<dyn Chain<u32>> =
            Box::new(Link::new(Committer(commits.clone()), Box::new(NullChain)));
        let empty = ChannelStateData {
            channels_total: 1,
            channels: vec![],
        };
        let (mut rt, mail_tx, _prio_tx) = operator_task(chain, 1, empty);
        send_barrier_then_end(&mail_tx, 7);
        mail_tx.send(Mail::CheckpointComplete(7)).unwrap();
        rt.run().unwrap();
        assert_eq!(*commits.lock().unwrap(), vec![7]);
    }

    #[test]
    fn a_task_whose_input_ended_fails_if_its_last_checkpoint_is_aborted() {
        let empty = ChannelStateData {
            channels_total: 1,
            channels: vec![],
        };
        let (mut rt, mail_tx, _prio_tx) = operator_task(Box::new(NullChain), 1, empty);
        send_barrier_then_end(&mail_tx, 7);
        mail_tx.send(Mail::CheckpointAborted(7)).unwrap();
        let err = rt.run().unwrap_err().to_string();
        assert!(
            err.contains("checkpoint 7 was aborted after the input"),
            "{err}"
        );
    }

    #[test]
    fn channel_state_of_another_layout_is_refused() {
        let restored = ChannelStateData {
            channels_total: 3,
            channels: vec![],
        };
        let (mut rt, _mail_tx, _prio_tx) = operator_task(Box::new(NullChain), 1, restored);
        let err = rt.run().unwrap_err().to_string();
        assert!(err.contains("changed parallelism"), "{err}");
    }
}
