//! The input gate: the one place that knows the barrier protocol on the receiving side.
//!
//! Exactly-once (aligned): when barrier n arrives on a channel, that channel is blocked — its
//! later elements are parked, unread, and because parked batches keep their credits the sender
//! stalls after `CHANNEL_CREDITS_MAX` batches — until barrier n has arrived on every channel that
//! has not ended. Then the task snapshots (nothing after barrier n on any channel has been
//! processed), forwards the barrier, and the parked elements are processed first, in channel
//! order, before anything newer from the same channel.
//!
//! At-least-once: channels are never blocked; the snapshot is taken when barrier n has arrived
//! on every channel. Records after a barrier may be in the snapshot, so they may be replayed.
//!
//! A barrier with a higher id than the one being aligned cancels that alignment (the older
//! checkpoint is declined); barriers older than the newest seen are stale and ignored.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::channel::{Barrier, Element};

/// How the gate treats barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignmentMode {
    /// Block channels until the barrier arrived on all of them (exactly-once).
    Aligned,
    /// Never block; snapshot when the barrier arrived on all channels (at-least-once).
    Tracking,
}

/// What the task must do after the gate saw a barrier or an end of stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateAction {
    /// Nothing yet.
    None,
    /// Barrier seen on every live channel: snapshot now; `alignment` is how long it took.
    Snapshot {
        barrier: Barrier,
        alignment: Duration,
    },
    /// An alignment was cancelled by a newer barrier: decline checkpoint `id`.
    Decline { id: u64 },
}

struct Pending {
    barrier: Barrier,
    seen: Vec<bool>,
    seen_count: usize,
    started: Instant,
}

/// Barrier alignment over the input channels of one subtask.
pub struct InputGate {
    mode: AlignmentMode,
    ended: Vec<bool>,
    ended_count: usize,
    blocked: Vec<bool>,
    parked: Vec<VecDeque<Element>>,
    parked_total: usize,
    pending: Option<Pending>,
    newest_id: u64,
}

impl InputGate {
    /// A gate over `channels` input channels.
    pub fn new(channels: usize, mode: AlignmentMode) -> Self {
        InputGate {
            mode,
            ended: vec![false; channels],
            ended_count: 0,
            blocked: vec![false; channels],
            parked: (0..channels).map(|_| VecDeque::new()).collect(),
            parked_total: 0,
            pending: None,
            newest_id: 0,
        }
    }

    /// Number of input channels.
    pub fn channels(&self) -> usize {
        self.ended.len()
    }

    /// Whether every channel has ended.
    pub fn all_ended(&self) -> bool {
        self.ended_count == self.ended.len()
    }

    /// Takes an element that arrived from the mailbox: returns it if it may be processed now, or
    /// parks it (blocked channel, or older parked elements of the same channel still queued).
    pub fn accept(&mut self, channel: usize, element: Element) -> Option<Element> {
        if self.blocked[channel] || !self.parked[channel].is_empty() {
            self.parked[channel].push_back(element);
            self.parked_total += 1;
            None
        } else {
            Some(element)
        }
    }

    /// A parked element of an unblocked channel, to be processed before new mail.
    pub fn next_parked(&mut self) -> Option<(usize, Element)> {
        if self.parked_total == 0 {
            return None;
        }
        for ch in 0..self.parked.len() {
            if !self.blocked[ch] {
                if let Some(e) = self.parked[ch].pop_front() {
                    self.parked_total -= 1;
                    return Some((ch, e));
                }
            }
        }
        None
    }

    /// Number of parked elements (bounded by credits per blocked channel).
    pub fn parked(&self) -> usize {
        self.parked_total
    }

    /// Whether `channel` is blocked for alignment.
    pub fn is_blocked(&self, channel: usize) -> bool {
        self.blocked[channel]
    }

    /// Barrier `barrier` arrived on `channel` (to be called for processable elements only).
    pub fn on_barrier(&mut self, channel: usize, barrier: Barrier) -> GateAction {
        let mut action = GateAction::None;
        match &self.pending {
            Some(p) if barrier.id < p.barrier.id => return GateAction::None,
            Some(p) if barrier.id > p.barrier.id => {
                action = GateAction::Decline { id: p.barrier.id };
                self.unblock_all();
                self.pending = None;
            }
            Some(_) => {}
            None if barrier.id <= self.newest_id => return GateAction::None,
            None => {}
        }
        debug_assert!(barrier.id >= self.newest_id, "barrier ids only grow");
        self.newest_id = barrier.id;
        let channels = self.ended.len();
        let p = self.pending.get_or_insert_with(|| Pending {
            barrier,
            seen: vec![false; channels],
            seen_count: 0,
            started: Instant::now(),
        });
        if !p.seen[channel] {
            p.seen[channel] = true;
            p.seen_count += 1;
            if self.mode == AlignmentMode::Aligned {
                self.blocked[channel] = true;
            }
        }
        match self.try_complete() {
            GateAction::None => action,
            done => {
                // A decline and a snapshot at once cannot happen: the newer barrier was seen on
                // one channel only, and a subtask with one live channel never declines.
                done
            }
        }
    }

    /// `channel` delivered end of stream.
    pub fn on_end_of_stream(&mut self, channel: usize) -> GateAction {
        if !self.ended[channel] {
            self.ended[channel] = true;
            self.ended_count += 1;
        }
        self.try_complete()
    }

    fn try_complete(&mut self) -> GateAction {
        let Some(p) = &self.pending else {
            return GateAction::None;
        };
        let live_unseen = (0..self.ended.len())
            .filter(|&c| !self.ended[c] && !p.seen[c])
            .count();
        if live_unseen > 0 {
            return GateAction::None;
        }
        let action = GateAction::Snapshot {
            barrier: p.barrier,
            alignment: p.started.elapsed(),
        };
        self.pending = None;
        self.unblock_all();
        action
    }

    fn unblock_all(&mut self) {
        for b in &mut self.blocked {
            *b = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn barrier(id: u64) -> Element {
        Element::Barrier(Barrier {
            id,
            timestamp_ms: 0,
        })
    }

    fn rec(x: u32) -> Element {
        Element::Batch(Box::new(vec![x]))
    }

    /// Runs a tiny subtask over the gate: returns the records processed before each snapshot.
    fn run(
        mode: AlignmentMode,
        arrivals: Vec<(usize, Element)>,
    ) -> (Vec<(u64, Vec<u32>)>, Vec<u32>) {
        let mut gate = InputGate::new(2, mode);
        let mut processed = Vec::new();
        let mut snapshots = Vec::new();
        let mut mailbox: VecDeque<(usize, Element)> = arrivals.into();
        loop {
            let (ch, e) = match gate.next_parked() {
                Some(x) => x,
                None => match mailbox.pop_front() {
                    Some((ch, e)) => match gate.accept(ch, e) {
                        Some(e) => (ch, e),
                        None => continue,
                    },
                    None => break,
                },
            };
            match e {
                Element::Batch(b) => processed.extend(*b.downcast::<Vec<u32>>().unwrap()),
                Element::Barrier(b) => {
                    if let GateAction::Snapshot { barrier, .. } = gate.on_barrier(ch, b) {
                        snapshots.push((barrier.id, processed.clone()));
                    }
                }
                Element::EndOfStream => {
                    if let GateAction::Snapshot { barrier, .. } = gate.on_end_of_stream(ch) {
                        snapshots.push((barrier.id, processed.clone()));
                    }
                }
            }
        }
        (snapshots, processed)
    }

    #[test]
    fn a_record_behind_a_barrier_on_a_blocked_channel_is_not_in_the_snapshot() {
        // Channel 0 races ahead: its record 2 is behind barrier 1 and arrives before channel 1's barrier.
        let arrivals = vec![
            (0, rec(1)),
            (0, barrier(1)),
            (0, rec(2)),
            (1, rec(10)),
            (0, rec(3)),
            (1, barrier(1)),
            (1, rec(11)),
        ];
        let (snaps, all) = run(AlignmentMode::Aligned, arrivals);
        assert_eq!(snaps, vec![(1, vec![1, 10])]);
        assert_eq!(all, vec![1, 10, 2, 3, 11]);
    }

    #[test]
    fn at_least_once_keeps_reading_and_may_include_later_records() {
        let arrivals = vec![
            (0, rec(1)),
            (0, barrier(1)),
            (0, rec(2)),
            (1, rec(10)),
            (1, barrier(1)),
        ];
        let (snaps, _) = run(AlignmentMode::Tracking, arrivals);
        assert_eq!(snaps, vec![(1, vec![1, 2, 10])]);
    }

    #[test]
    fn concurrent_barriers_are_aligned_in_order() {
        let arrivals = vec![
            (0, barrier(1)),
            (0, rec(1)),
            (0, barrier(2)),
            (0, rec(2)),
            (1, rec(10)),
            (1, barrier(1)),
            (1, rec(11)),
            (1, barrier(2)),
        ];
        let (snaps, _) = run(AlignmentMode::Aligned, arrivals);
        assert_eq!(snaps, vec![(1, vec![10]), (2, vec![10, 1, 11])]);
    }

    #[test]
    fn an_ended_channel_does_not_hold_alignment() {
        let arrivals = vec![
            (1, Element::EndOfStream),
            (0, rec(1)),
            (0, barrier(3)),
            (0, rec(2)),
        ];
        let (snaps, _) = run(AlignmentMode::Aligned, arrivals);
        assert_eq!(snaps, vec![(3, vec![1])]);
    }

    #[test]
    fn a_newer_barrier_cancels_the_alignment_and_stale_ones_are_ignored() {
        let mut gate = InputGate::new(2, AlignmentMode::Aligned);
        let b = |id| Barrier {
            id,
            timestamp_ms: 0,
        };
        assert_eq!(gate.on_barrier(0, b(1)), GateAction::None);
        assert!(gate.is_blocked(0));
        assert_eq!(gate.on_barrier(1, b(2)), GateAction::Decline { id: 1 });
        assert!(!gate.is_blocked(0));
        assert_eq!(gate.on_barrier(1, b(1)), GateAction::None);
        assert!(matches!(
            gate.on_barrier(0, b(2)),
            GateAction::Snapshot { .. }
        ));
    }
}
