//! Channels between subtasks: batches of records and in-band events, with credit-based flow
//! control.
//!
//! Every subtask has one mailbox (an MPSC queue) that all its input channels and the job master
//! write into, so a subtask is a single thread taking one mail at a time. A channel may only
//! have `credits_max` batches queued at its receiver: the sender takes a credit per batch and the
//! receiver returns it when it dequeues the batch for processing. A channel that is blocked for
//! barrier alignment therefore holds at most `credits_max` batches at the receiver and then
//! back-pressures its sender — buffering is bounded. Events (barriers, end of stream) take no
//! credit: at most one end of stream and `max-concurrent-checkpoints` barriers per channel are in
//! flight.

use std::any::Any;
use std::sync::{Arc, Condvar, Mutex};

use crossbeam_channel::Sender;

use crate::error::{TaskError, TaskResult};

/// Number of records a batch holds at most.
pub const BATCH_RECORDS_MAX: usize = 1024;
/// Number of batches a channel may have queued at its receiver.
pub const CHANNEL_CREDITS_MAX: usize = 8;

/// A checkpoint barrier: marks the point in a stream where checkpoint `id` was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Barrier {
    /// Checkpoint id; ids only grow.
    pub id: u64,
    /// When the coordinator triggered the checkpoint (ms since the Unix epoch).
    pub timestamp_ms: u64,
    /// Never switch this checkpoint to unaligned. Set on the final checkpoint: everything
    /// before it must be processed — and committed by sinks — before the job ends.
    pub aligned_only: bool,
}

/// How tasks treat barriers of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BarrierKind {
    /// In-band, aligned (or tracked in at-least-once mode).
    Aligned,
    /// In-band, aligned, but switch to unaligned once `timeout_ms` passed since the trigger.
    AlignedWithTimeout { timeout_ms: u64 },
    /// Unaligned: overtakes in-flight data, which becomes channel state.
    Unaligned,
}

/// What travels on a channel.
pub enum Element {
    /// A `Vec<T>` of records, type-erased at the channel.
    Batch(Box<dyn Any + Send>),
    /// A checkpoint barrier.
    Barrier(Barrier),
    /// The sender has no more records.
    EndOfStream,
}

impl std::fmt::Debug for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Element::Batch(_) => f.write_str("Batch"),
            Element::Barrier(b) => write!(f, "Barrier({})", b.id),
            Element::EndOfStream => f.write_str("EndOfStream"),
        }
    }
}

/// What a subtask's mailbox receives.
#[derive(Debug)]
pub enum Mail {
    /// An element from input channel `channel`.
    Data { channel: usize, element: Element },
    /// Sources only: take checkpoint `barrier.id` now and emit the barrier.
    TriggerCheckpoint(Barrier, BarrierKind),
    /// An unaligned barrier from input channel `channel` that overtook the data queued before
    /// it: the sender had sent `batches_before` batches on that channel before the barrier.
    /// Delivered through the priority mailbox.
    PriorityBarrier {
        channel: usize,
        barrier: Barrier,
        batches_before: u64,
    },
    /// Checkpoint `id` is complete (all tasks acknowledged; metadata written).
    CheckpointComplete(u64),
    /// Checkpoint `id` was aborted.
    CheckpointAborted(u64),
    /// Sources only: the final checkpoint completed; emit end of stream and finish.
    EndOfInput,
    /// Stop now: the attempt is cancelled.
    Cancel,
}

#[derive(Debug)]
struct CreditState {
    /// May go below zero by an overdraft (see [`ChannelSender::send_batch_overdraft`]).
    available: isize,
    closed: bool,
}

/// The credits of one channel.
#[derive(Debug)]
pub struct Credit {
    state: Mutex<CreditState>,
    changed: Condvar,
}

impl Credit {
    /// A channel with `credits` batches of room.
    pub fn new(credits: usize) -> Arc<Self> {
        Arc::new(Credit {
            state: Mutex::new(CreditState {
                available: credits as isize,
                closed: false,
            }),
            changed: Condvar::new(),
        })
    }

    /// Takes one credit, waiting for the receiver to return one; fails once the channel is closed.
    fn acquire(&self) -> TaskResult {
        let mut s = self.state.lock().map_err(|_| TaskError::Cancelled)?;
        loop {
            if s.closed {
                return Err(TaskError::Cancelled);
            }
            if s.available > 0 {
                s.available -= 1;
                return Ok(());
            }
            s = self.changed.wait(s).map_err(|_| TaskError::Cancelled)?;
        }
    }

    /// Takes one credit without waiting, possibly going into debt.
    fn overdraw(&self) -> TaskResult {
        let mut s = self.state.lock().map_err(|_| TaskError::Cancelled)?;
        if s.closed {
            return Err(TaskError::Cancelled);
        }
        s.available -= 1;
        Ok(())
    }

    /// Returns one credit (the receiver dequeued a batch).
    pub fn release(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.available += 1;
            self.changed.notify_one();
        }
    }

    /// Closes the channel: senders waiting for credit fail with `Cancelled`.
    pub fn close(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.closed = true;
            self.changed.notify_all();
        }
    }
}

/// The sending end of one channel.
#[derive(Clone)]
pub struct ChannelSender {
    channel: usize,
    mailbox: Sender<Mail>,
    priority: Sender<Mail>,
    credit: Arc<Credit>,
}

impl ChannelSender {
    /// The sender of channel `channel` into a subtask's `mailbox` (and its `priority` mailbox,
    /// for unaligned barriers).
    pub fn new(
        channel: usize,
        mailbox: Sender<Mail>,
        priority: Sender<Mail>,
        credit: Arc<Credit>,
    ) -> Self {
        ChannelSender {
            channel,
            mailbox,
            priority,
            credit,
        }
    }

    /// Sends an unaligned barrier ahead of the queued data; `batches_before` batches were sent
    /// on this channel before it.
    pub fn send_priority_barrier(&self, barrier: Barrier, batches_before: u64) -> TaskResult {
        self.priority
            .send(Mail::PriorityBarrier {
                channel: self.channel,
                barrier,
                batches_before,
            })
            .map_err(|_| TaskError::Cancelled)
    }

    /// Sends a batch, waiting for credit (backpressure).
    pub fn send_batch(&self, batch: Box<dyn Any + Send>) -> TaskResult {
        self.credit.acquire()?;
        self.send(Element::Batch(batch))
    }

    /// Sends a batch without waiting for credit. Used only to flush the partial batch in front
    /// of an unaligned barrier, so that the barrier is not held back by backpressure: at most
    /// one batch per channel per checkpoint beyond the credits.
    pub fn send_batch_overdraft(&self, batch: Box<dyn Any + Send>) -> TaskResult {
        self.credit.overdraw()?;
        self.send(Element::Batch(batch))
    }

    /// Sends an event (barrier, end of stream); takes no credit.
    pub fn send_event(&self, element: Element) -> TaskResult {
        self.send(element)
    }

    fn send(&self, element: Element) -> TaskResult {
        self.mailbox
            .send(Mail::Data {
                channel: self.channel,
                element,
            })
            .map_err(|_| TaskError::Cancelled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sender_without_credit_waits_until_one_is_returned_or_closed() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let credit = Credit::new(2);
        let s = ChannelSender::new(0, tx.clone(), tx, credit.clone());
        s.send_batch(Box::new(vec![1u32])).unwrap();
        s.send_batch(Box::new(vec![2u32])).unwrap();
        let (done_tx, done_rx) = crossbeam_channel::bounded(1);
        let s2 = s.clone();
        let t = std::thread::spawn(move || {
            let r = s2.send_batch(Box::new(vec![3u32]));
            done_tx.send(r.is_ok()).unwrap();
        });
        // The third send is blocked: nothing arrives until a credit is returned.
        assert!(done_rx
            .recv_timeout(std::time::Duration::from_millis(50))
            .is_err());
        assert_eq!(rx.len(), 2);
        credit.release();
        assert!(done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap());
        t.join().unwrap();
        credit.close();
        assert!(matches!(
            s.send_batch(Box::new(vec![4u32])),
            Err(TaskError::Cancelled)
        ));
    }
}
