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
use serde::{Deserialize, Serialize};

use crate::error::{TaskError, TaskResult};

/// Number of records a batch holds at most.
pub const BATCH_RECORDS_MAX: usize = 1024;
/// Number of batches a channel may have queued at its receiver.
pub const CHANNEL_CREDITS_MAX: usize = 8;

pub use crate::checkpoint::{Barrier, BarrierKind};

/// What travels on a channel.
pub enum Element {
    /// A `Vec<T>` of records, type-erased at the channel.
    Batch(Box<dyn Any + Send>),
    /// A batch that crossed the network, still serialized (decoded by the receiving task).
    Encoded(Vec<u8>),
    /// A checkpoint barrier.
    Barrier(Barrier),
    /// Event time: no record with a timestamp at or below this one follows on the channel.
    Watermark(i64),
    /// The sender is idle: until it sends a record or a watermark, the channel does not hold
    /// back the receiver's watermark.
    Idle,
    /// The sender has no more records.
    EndOfStream,
}

impl std::fmt::Debug for Element {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Element::Batch(_) => f.write_str("Batch"),
            Element::Encoded(b) => write!(f, "Encoded({} bytes)", b.len()),
            Element::Barrier(b) => write!(f, "Barrier({})", b.id),
            Element::Watermark(t) => write!(f, "Watermark({t})"),
            Element::Idle => f.write_str("Idle"),
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

/// The mail the job master sends to a subtask, in a form that can cross the network.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub enum ControlMail {
    /// [`Mail::TriggerCheckpoint`].
    Trigger(Barrier, BarrierKind),
    /// [`Mail::CheckpointComplete`].
    Complete(u64),
    /// [`Mail::CheckpointAborted`].
    Aborted(u64),
    /// [`Mail::EndOfInput`].
    EndOfInput,
    /// [`Mail::Cancel`].
    Cancel,
}

impl ControlMail {
    /// The control part of a mail, if it is one.
    pub fn from_mail(mail: &Mail) -> Option<ControlMail> {
        Some(match mail {
            Mail::TriggerCheckpoint(b, k) => ControlMail::Trigger(*b, *k),
            Mail::CheckpointComplete(id) => ControlMail::Complete(*id),
            Mail::CheckpointAborted(id) => ControlMail::Aborted(*id),
            Mail::EndOfInput => ControlMail::EndOfInput,
            Mail::Cancel => ControlMail::Cancel,
            Mail::Data { .. } | Mail::PriorityBarrier { .. } => return None,
        })
    }

    /// As a mail.
    pub fn into_mail(self) -> Mail {
        match self {
            ControlMail::Trigger(b, k) => Mail::TriggerCheckpoint(b, k),
            ControlMail::Complete(id) => Mail::CheckpointComplete(id),
            ControlMail::Aborted(id) => Mail::CheckpointAborted(id),
            ControlMail::EndOfInput => Mail::EndOfInput,
            ControlMail::Cancel => Mail::Cancel,
        }
    }
}

/// Delivers control mail to a subtask in another process.
pub trait RemoteMailbox: Send + Sync {
    /// Sends; false if the subtask is unreachable.
    fn send(&self, mail: ControlMail) -> bool;
}

/// How the job master reaches a subtask's mailbox.
#[derive(Clone)]
pub enum MailboxHandle {
    /// In this process.
    Local(Sender<Mail>),
    /// In a worker process.
    Remote(Arc<dyn RemoteMailbox>),
}

impl std::fmt::Debug for MailboxHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MailboxHandle::Local(_) => f.write_str("Local"),
            MailboxHandle::Remote(_) => f.write_str("Remote"),
        }
    }
}

impl MailboxHandle {
    /// Sends a control mail; false if the subtask is gone (its attempt is failing anyway).
    pub fn send(&self, mail: Mail) -> bool {
        match self {
            MailboxHandle::Local(s) => s.send(mail).is_ok(),
            MailboxHandle::Remote(r) => ControlMail::from_mail(&mail).is_some_and(|m| r.send(m)),
        }
    }
}

/// What crosses the network on one channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DataFrame {
    /// A serialized batch.
    Batch(Vec<u8>),
    /// An in-band barrier.
    Barrier(Barrier),
    /// An unaligned barrier and the number of batches before it.
    PriorityBarrier(Barrier, u64),
    /// End of stream.
    EndOfStream,
    /// A watermark.
    Watermark(i64),
    /// The sender is idle.
    Idle,
}

/// The sending side of a channel to a subtask in another process.
pub trait RemoteChannel: Send + Sync {
    /// Sends one frame of this channel.
    fn send(&self, frame: DataFrame) -> TaskResult;
}

/// Returns a credit to a channel's sender.
pub trait CreditReturn: Send + Sync {
    /// The receiver dequeued one batch.
    fn release(&self);
}

/// Batches sent and not yet taken by the receiver, and the channel's room.
impl crate::metrics::Queue for Credit {
    fn in_use(&self) -> (usize, usize) {
        let available = self.state.lock().map_or(0, |s| s.available);
        let used = (self.capacity as isize - available).max(0) as usize;
        (used, self.capacity)
    }
}

impl CreditReturn for Credit {
    fn release(&self) {
        Credit::release(self);
    }
}

#[derive(Debug)]
struct CreditState {
    /// May go below zero by an overdraft (see [`ChannelSender::send_batch_overdraft`]).
    available: isize,
    closed: bool,
    /// Senders blocked in `acquire`.
    waiting: usize,
}

/// The credits of one channel.
#[derive(Debug)]
pub struct Credit {
    state: Mutex<CreditState>,
    changed: Condvar,
    /// The batches of room the channel has.
    capacity: usize,
}

impl Credit {
    /// A channel with `credits` batches of room.
    pub fn new(credits: usize) -> Arc<Self> {
        Arc::new(Credit {
            state: Mutex::new(CreditState {
                available: credits as isize,
                closed: false,
                waiting: 0,
            }),
            changed: Condvar::new(),
            capacity: credits,
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
            // Back-pressured: the time until a credit comes back is the task's.
            let since = std::time::Instant::now();
            s.waiting += 1;
            let woken = self.changed.wait(s);
            crate::metrics::backpressured(since.elapsed());
            s = woken.map_err(|_| TaskError::Cancelled)?;
            s.waiting -= 1;
        }
    }

    /// Senders waiting for a credit right now (tests observe backpressure through it).
    #[cfg(test)]
    fn waiting(&self) -> usize {
        self.state.lock().map_or(0, |s| s.waiting)
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

#[derive(Clone)]
enum Target {
    Local {
        mailbox: Sender<Mail>,
        priority: Sender<Mail>,
    },
    Remote(Arc<dyn RemoteChannel>),
}

/// The sending end of one channel.
#[derive(Clone)]
pub struct ChannelSender {
    channel: usize,
    target: Target,
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
            target: Target::Local { mailbox, priority },
            credit,
        }
    }

    /// The sender of a channel into a subtask in another process; `credit` is released when
    /// the receiver returns credits over the network.
    pub fn remote(link: Arc<dyn RemoteChannel>, credit: Arc<Credit>) -> Self {
        ChannelSender {
            channel: 0,
            target: Target::Remote(link),
            credit,
        }
    }

    /// Whether batches must be serialized for this channel.
    pub fn is_remote(&self) -> bool {
        matches!(self.target, Target::Remote(_))
    }

    /// Sends a serialized batch over the network, waiting for credit.
    pub fn send_encoded(&self, bytes: Vec<u8>, overdraft: bool) -> TaskResult {
        if overdraft {
            self.credit.overdraw()?;
        } else {
            self.credit.acquire()?;
        }
        match &self.target {
            Target::Remote(link) => link.send(DataFrame::Batch(bytes)),
            Target::Local { .. } => Err(TaskError::msg("a serialized batch on a local channel")),
        }
    }

    /// Sends an unaligned barrier ahead of the queued data; `batches_before` batches were sent
    /// on this channel before it.
    pub fn send_priority_barrier(&self, barrier: Barrier, batches_before: u64) -> TaskResult {
        match &self.target {
            Target::Local { priority, .. } => priority
                .send(Mail::PriorityBarrier {
                    channel: self.channel,
                    barrier,
                    batches_before,
                })
                .map_err(|_| TaskError::Cancelled),
            Target::Remote(link) => link.send(DataFrame::PriorityBarrier(barrier, batches_before)),
        }
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

    /// Sends an event (barrier, watermark, idleness, end of stream); takes no credit.
    pub fn send_event(&self, element: Element) -> TaskResult {
        self.send(element)
    }

    fn send(&self, element: Element) -> TaskResult {
        match &self.target {
            Target::Local { mailbox, .. } => mailbox
                .send(Mail::Data {
                    channel: self.channel,
                    element,
                })
                .map_err(|_| TaskError::Cancelled),
            Target::Remote(link) => match element {
                Element::Barrier(b) => link.send(DataFrame::Barrier(b)),
                Element::EndOfStream => link.send(DataFrame::EndOfStream),
                Element::Watermark(t) => link.send(DataFrame::Watermark(t)),
                Element::Idle => link.send(DataFrame::Idle),
                Element::Encoded(bytes) => link.send(DataFrame::Batch(bytes)),
                Element::Batch(_) => {
                    Err(TaskError::msg("an unserialized batch on a remote channel"))
                }
            },
        }
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
        // The third send waits for a credit, and has sent nothing while it waits.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while credit.waiting() == 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the third send never waited for a credit"
            );
            std::thread::yield_now();
        }
        assert_eq!(rx.len(), 2);
        assert!(done_rx.is_empty());
        credit.release();
        assert!(done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .unwrap());
        assert_eq!(rx.len(), 3);
        assert_eq!(credit.waiting(), 0);
        t.join().unwrap();
        credit.close();
        assert!(matches!(
            s.send_batch(Box::new(vec![4u32])),
            Err(TaskError::Cancelled)
        ));
    }
}
