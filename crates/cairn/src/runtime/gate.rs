//! The input gate: the one place that knows the barrier protocol on the receiving side.
//!
//! **Aligned (exactly-once).** When barrier n arrives on a channel, that channel is blocked —
//! its later elements are parked, unread, and because parked batches keep their credits the
//! sender stalls after `CHANNEL_CREDITS_MAX` batches — until barrier n has arrived on every
//! channel that has not ended. Then the task snapshots (nothing after barrier n on any channel
//! has been processed), forwards the barrier, and the parked elements are processed first.
//!
//! **At-least-once (tracking).** Channels are never blocked; the snapshot is taken when barrier
//! n has arrived on every channel. Records after a barrier may be in the snapshot and are then
//! replayed after a failure: duplicates, never loss.
//!
//! **Unaligned (Chandy–Lamport channel state).** On the first barrier n the task snapshots at
//! once and forwards an unaligned barrier. Barriers travel as priority mail carrying the number
//! of batches their sender had sent on the channel before them; every batch the task processes
//! after its snapshot that was sent before the barrier of its channel is in flight at the cut:
//! the task records it (serialized) as channel state of checkpoint n. When every live channel's
//! barrier arrived and its pre-barrier batches were all processed, the channel state is complete.
//! On recovery it is replayed before any new input.
//!
//! **Aligned with timeout.** A checkpoint starts aligned; if its alignment is still incomplete
//! `timeout` after the trigger, the task switches: it snapshots at once, unblocks the channels
//! that delivered the barrier (their parked data is after the cut) and records the batches of
//! the others until their barrier arrives. An unaligned barrier from upstream switches at once.
//!
//! A barrier with a higher id than the pending one cancels it (the older checkpoint is
//! declined); barriers older than the newest seen are stale and ignored.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::channel::{Barrier, Element};

/// How the gate treats barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignmentMode {
    /// Exactly-once: block channels until the barrier arrived on all of them. Checkpoints may
    /// still arrive unaligned (configured, or switched by a timeout upstream).
    Aligned,
    /// At-least-once: never block; snapshot when the barrier arrived on all channels.
    Tracking,
}

/// What the task must do after the gate saw something.
#[derive(Debug, PartialEq, Eq)]
pub enum GateAction {
    /// Snapshot now and forward the barrier (unaligned: as a priority barrier).
    Snapshot {
        /// The checkpoint.
        barrier: Barrier,
        /// Time from the first barrier to the snapshot.
        alignment: Duration,
        /// Whether the checkpoint is unaligned at this task (channel state follows).
        unaligned: bool,
    },
    /// The channel state of unaligned checkpoint `id` is complete.
    ChannelState {
        /// Checkpoint id.
        id: u64,
        /// Per input channel, the recorded in-flight batches (serialized), in order.
        channels: Vec<(usize, Vec<Vec<u8>>)>,
        /// Their total size.
        bytes: u64,
    },
    /// An alignment was cancelled by a newer barrier: decline checkpoint `id`.
    Decline { id: u64 },
}

struct Pending {
    barrier: Barrier,
    started: Instant,
    /// Switch to unaligned at this instant (aligned-with-timeout).
    deadline: Option<Instant>,
    seen: Vec<bool>,
    /// The snapshot was taken unaligned; waiting for the channel state.
    unaligned: bool,
    /// Per channel: number of batches sent before the barrier, once known.
    batches_before: Vec<Option<u64>>,
    recorded: Vec<Vec<Vec<u8>>>,
    recorded_bytes: u64,
    /// Per channel: batches up to this sequence number were recorded while still queued.
    captured: Vec<u64>,
}

/// Barrier handling over the input channels of one subtask.
pub struct InputGate {
    mode: AlignmentMode,
    ended: Vec<bool>,
    ended_count: usize,
    blocked: Vec<bool>,
    parked: Vec<VecDeque<Element>>,
    parked_total: usize,
    processed: Vec<u64>,
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
            processed: vec![0; channels],
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

    /// A batch of `channel` is about to be processed: whether it is in flight at an unaligned
    /// cut and must be recorded (serialized) and passed to [`InputGate::after_batch`].
    pub fn before_batch(&mut self, channel: usize) -> bool {
        self.processed[channel] += 1;
        let seq = self.processed[channel];
        self.in_flight(channel, seq)
    }

    /// Whether batch number `seq` of `channel` is in flight at the pending unaligned cut and
    /// not recorded yet.
    fn in_flight(&self, channel: usize, seq: u64) -> bool {
        match &self.pending {
            Some(p) if p.unaligned && seq > p.captured[channel] => {
                match p.batches_before[channel] {
                    Some(before) => seq <= before,
                    None => !p.seen[channel],
                }
            }
            _ => false,
        }
    }

    /// For recording in-flight batches while they are still queued (so the channel state does
    /// not wait for them to be processed): the sequence number of the next batch of `channel`
    /// to be processed, counting parked ones, if the pending checkpoint is unaligned.
    pub fn capture_start(&self, channel: usize) -> Option<u64> {
        let p = self.pending.as_ref().filter(|p| p.unaligned)?;
        let parked = self.parked[channel]
            .iter()
            .filter(|e| matches!(e, Element::Batch(_) | Element::Encoded(_)))
            .count() as u64;
        let _ = p;
        Some(self.processed[channel] + parked)
    }

    /// The sequence number of the next batch of `channel` to be processed, counting parked ones.
    pub fn next_seq(&self, channel: usize) -> u64 {
        let parked = self.parked[channel]
            .iter()
            .filter(|e| matches!(e, Element::Batch(_) | Element::Encoded(_)))
            .count() as u64;
        self.processed[channel] + parked
    }

    /// Whether a barrier with this id would still be news (not stale).
    pub fn is_new_barrier(&self, channel: usize, id: u64) -> bool {
        match &self.pending {
            Some(p) if p.barrier.id == id => !p.seen[channel],
            Some(p) => id > p.barrier.id,
            None => id > self.newest_id,
        }
    }

    /// Whether the barrier of the pending checkpoint arrived on `channel`.
    pub fn barrier_seen(&self, channel: usize) -> bool {
        self.pending.as_ref().is_some_and(|p| p.seen[channel])
    }

    /// Whether queued batch number `seq` of `channel` must be captured.
    pub fn should_capture(&self, channel: usize, seq: u64) -> bool {
        self.in_flight(channel, seq)
    }

    /// Records queued batch number `seq` of `channel` (serialized) as channel state.
    pub fn capture(&mut self, channel: usize, seq: u64, bytes: Vec<u8>) {
        if let Some(p) = self.pending.as_mut() {
            p.recorded_bytes += bytes.len() as u64;
            p.recorded[channel].push(bytes);
            p.captured[channel] = p.captured[channel].max(seq);
        }
    }

    /// Re-checks whether the channel state is complete (after captures).
    pub fn check_channel_state(&mut self) -> Option<GateAction> {
        if self.pending.as_ref().is_some_and(|p| p.unaligned) {
            self.try_complete_channel_state()
        } else {
            None
        }
    }

    /// The id of the pending checkpoint, if unaligned.
    pub fn pending_unaligned(&self) -> Option<u64> {
        self.pending
            .as_ref()
            .filter(|p| p.unaligned)
            .map(|p| p.barrier.id)
    }

    /// A batch of `channel` was processed; `recorded` is its serialized form if
    /// [`InputGate::before_batch`] asked for it.
    pub fn after_batch(&mut self, channel: usize, recorded: Option<Vec<u8>>) -> Option<GateAction> {
        let p = self.pending.as_mut()?;
        if let Some(bytes) = recorded {
            p.recorded_bytes += bytes.len() as u64;
            p.recorded[channel].push(bytes);
        }
        if p.unaligned {
            self.try_complete_channel_state()
        } else {
            None
        }
    }

    /// When the gate needs [`InputGate::on_timer`] (aligned-with-timeout).
    pub fn deadline(&self) -> Option<Instant> {
        self.pending
            .as_ref()
            .filter(|p| !p.unaligned)
            .and_then(|p| p.deadline)
    }

    /// The alignment timeout may have expired: switch to unaligned.
    pub fn on_timer(&mut self, now: Instant) -> Vec<GateAction> {
        match &self.pending {
            Some(p) if !p.unaligned && p.deadline.is_some_and(|d| now >= d) => {
                self.switch_to_unaligned()
            }
            _ => Vec::new(),
        }
    }

    /// Starts tracking checkpoint `barrier`, declining an older pending one.
    /// Returns None if the barrier is stale.
    fn begin(
        &mut self,
        barrier: Barrier,
        timeout: Option<Duration>,
        actions: &mut Vec<GateAction>,
    ) -> Option<()> {
        match &self.pending {
            Some(p) if barrier.id < p.barrier.id => return None,
            Some(p) if barrier.id > p.barrier.id => {
                actions.push(GateAction::Decline { id: p.barrier.id });
                self.pending = None;
                self.unblock_all();
            }
            Some(_) => return Some(()),
            None if barrier.id <= self.newest_id => return None,
            None => {}
        }
        debug_assert!(barrier.id > self.newest_id, "barrier ids only grow");
        self.newest_id = barrier.id;
        let channels = self.ended.len();
        let now = Instant::now();
        let deadline = timeout.map(|t| {
            // Measured from the trigger, as Flink does: a barrier that arrives late switches at once.
            let age = Duration::from_millis(
                crate::checkpoint::now_ms().saturating_sub(barrier.timestamp_ms),
            );
            now + t.saturating_sub(age)
        });
        self.pending = Some(Pending {
            barrier,
            started: now,
            deadline,
            seen: vec![false; channels],
            unaligned: false,
            batches_before: vec![None; channels],
            recorded: vec![Vec::new(); channels],
            recorded_bytes: 0,
            captured: vec![0; channels],
        });
        Some(())
    }

    /// In-band barrier `barrier` arrived on `channel` (to be called for processable elements
    /// only). `timeout` is the aligned-checkpoint timeout of the checkpoint, if any.
    pub fn on_barrier(
        &mut self,
        channel: usize,
        barrier: Barrier,
        timeout: Option<Duration>,
    ) -> Vec<GateAction> {
        let mut actions = Vec::new();
        if self.begin(barrier, timeout, &mut actions).is_none() {
            return actions;
        }
        let processed = self.processed[channel];
        let Some(p) = self.pending.as_mut() else {
            return actions;
        };
        if !p.seen[channel] {
            p.seen[channel] = true;
            // In band: every batch before the barrier was processed already.
            p.batches_before[channel] = Some(processed);
            if self.mode == AlignmentMode::Aligned && !p.unaligned {
                self.blocked[channel] = true;
            }
        }
        if self.pending.as_ref().is_some_and(|p| p.unaligned) {
            actions.extend(self.try_complete_channel_state());
        } else if let Some(deadline) = timeout.and(self.deadline()) {
            if Instant::now() >= deadline {
                actions.extend(self.switch_to_unaligned());
                return actions;
            }
            actions.extend(self.try_complete_aligned());
        } else {
            actions.extend(self.try_complete_aligned());
        }
        actions
    }

    /// Unaligned barrier `barrier` arrived ahead of the data on `channel`; its sender had sent
    /// `batches_before` batches on the channel before it.
    pub fn on_priority_barrier(
        &mut self,
        channel: usize,
        barrier: Barrier,
        batches_before: u64,
    ) -> Vec<GateAction> {
        let mut actions = Vec::new();
        if self.begin(barrier, None, &mut actions).is_none() {
            return actions;
        }
        if let Some(p) = self.pending.as_mut() {
            if !p.seen[channel] {
                p.seen[channel] = true;
                p.batches_before[channel] = Some(batches_before);
            }
        }
        if self.pending.as_ref().is_some_and(|p| !p.unaligned) {
            actions.extend(self.switch_to_unaligned());
        } else {
            actions.extend(self.try_complete_channel_state());
        }
        actions
    }

    /// `channel` delivered end of stream.
    pub fn on_end_of_stream(&mut self, channel: usize) -> Vec<GateAction> {
        if !self.ended[channel] {
            self.ended[channel] = true;
            self.ended_count += 1;
        }
        match &self.pending {
            Some(p) if p.unaligned => self.try_complete_channel_state().into_iter().collect(),
            Some(_) => self.try_complete_aligned().into_iter().collect(),
            None => Vec::new(),
        }
    }

    /// Checkpoint `id` was aborted: forget it.
    pub fn abort(&mut self, id: u64) {
        if self.pending.as_ref().is_some_and(|p| p.barrier.id == id) {
            self.pending = None;
            self.unblock_all();
        }
    }

    fn switch_to_unaligned(&mut self) -> Vec<GateAction> {
        let mut actions = Vec::new();
        let Some(p) = self.pending.as_mut() else {
            return actions;
        };
        p.unaligned = true;
        actions.push(GateAction::Snapshot {
            barrier: p.barrier,
            alignment: p.started.elapsed(),
            unaligned: true,
        });
        // Parked data of blocked channels came after their barrier: it is not in flight at the cut.
        self.unblock_all();
        actions.extend(self.try_complete_channel_state());
        actions
    }

    fn try_complete_aligned(&mut self) -> Option<GateAction> {
        let p = self.pending.as_ref()?;
        let live_unseen = (0..self.ended.len())
            .filter(|&c| !self.ended[c] && !p.seen[c])
            .count();
        if live_unseen > 0 {
            return None;
        }
        let action = GateAction::Snapshot {
            barrier: p.barrier,
            alignment: p.started.elapsed(),
            unaligned: false,
        };
        self.pending = None;
        self.unblock_all();
        Some(action)
    }

    fn try_complete_channel_state(&mut self) -> Option<GateAction> {
        let p = self.pending.as_ref()?;
        let done = (0..self.ended.len()).all(|c| {
            self.ended[c]
                || p.batches_before[c]
                    .is_some_and(|before| self.processed[c].max(p.captured[c]) >= before)
        });
        if !done {
            return None;
        }
        let p = self.pending.take()?;
        let channels = p
            .recorded
            .into_iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .collect();
        Some(GateAction::ChannelState {
            id: p.barrier.id,
            channels,
            bytes: p.recorded_bytes,
        })
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
            aligned_only: false,
            id,
            timestamp_ms: crate::checkpoint::now_ms(),
        })
    }

    fn b(id: u64) -> Barrier {
        Barrier {
            aligned_only: false,
            id,
            timestamp_ms: crate::checkpoint::now_ms(),
        }
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
            let actions = match e {
                Element::Batch(batch) => {
                    gate.before_batch(ch);
                    processed.extend(*batch.downcast::<Vec<u32>>().unwrap());
                    gate.after_batch(ch, None).into_iter().collect()
                }
                Element::Barrier(b) => gate.on_barrier(ch, b, None),
                Element::EndOfStream => gate.on_end_of_stream(ch),
                Element::Encoded(_) => Vec::new(),
            };
            for a in actions {
                if let GateAction::Snapshot { barrier, .. } = a {
                    snapshots.push((barrier.id, processed.clone()));
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
        assert!(gate.on_barrier(0, b(1), None).is_empty());
        assert!(gate.is_blocked(0));
        assert_eq!(
            gate.on_barrier(1, b(2), None),
            vec![GateAction::Decline { id: 1 }]
        );
        assert!(!gate.is_blocked(0));
        assert!(gate.on_barrier(1, b(1), None).is_empty());
        assert!(matches!(
            gate.on_barrier(0, b(2), None)[..],
            [GateAction::Snapshot { .. }]
        ));
    }

    /// Feeds batches as (channel, sequence number) and records what the gate asks to record.
    #[test]
    fn unaligned_records_exactly_the_batches_in_flight_at_the_cut() {
        let mut gate = InputGate::new(2, AlignmentMode::Aligned);
        // Channel 0 has processed 1 batch; its sender sent 3 before the barrier.
        assert!(!gate.before_batch(0));
        assert_eq!(gate.after_batch(0, None), None);
        let actions = gate.on_priority_barrier(0, b(5), 3);
        assert!(matches!(
            actions[..],
            [GateAction::Snapshot {
                unaligned: true,
                ..
            }]
        ));
        // Batches 2 and 3 of channel 0 are in flight; batch 4 is after the barrier.
        for (seq, expect) in [(2, true), (3, true), (4, false)] {
            assert_eq!(gate.before_batch(0), expect, "channel 0 batch {seq}");
            let rec = expect.then(|| vec![seq as u8]);
            assert_eq!(gate.after_batch(0, rec), None);
        }
        // Channel 1: its barrier has not come; everything it delivers is in flight until it does.
        assert!(gate.before_batch(1));
        assert_eq!(gate.after_batch(1, Some(vec![101])), None);
        let actions = gate.on_priority_barrier(1, b(5), 2);
        assert!(actions.is_empty(), "batch 2 of channel 1 is still queued");
        assert!(gate.before_batch(1));
        let done = gate.after_batch(1, Some(vec![102]));
        assert_eq!(
            done,
            Some(GateAction::ChannelState {
                id: 5,
                channels: vec![(0, vec![vec![2], vec![3]]), (1, vec![vec![101], vec![102]])],
                bytes: 4,
            })
        );
        assert!(!gate.before_batch(1));
    }

    #[test]
    fn an_alignment_timeout_switches_to_unaligned() {
        let mut gate = InputGate::new(2, AlignmentMode::Aligned);
        let timeout = Some(Duration::from_millis(50));
        assert!(gate.on_barrier(0, b(1), timeout).is_empty());
        assert!(gate.is_blocked(0));
        let deadline = gate.deadline().unwrap();
        assert!(gate
            .on_timer(deadline - Duration::from_millis(1))
            .is_empty());
        let actions = gate.on_timer(deadline);
        assert!(matches!(
            actions[..],
            [GateAction::Snapshot {
                unaligned: true,
                ..
            }]
        ));
        assert!(
            !gate.is_blocked(0),
            "parked data after the barrier is released"
        );
        // Channel 1 delivers data before its (in-band) barrier: recorded.
        assert!(gate.before_batch(1));
        assert_eq!(gate.after_batch(1, Some(vec![7])), None);
        let actions = gate.on_barrier(1, b(1), timeout);
        assert_eq!(
            actions,
            vec![GateAction::ChannelState {
                id: 1,
                channels: vec![(1, vec![vec![7]])],
                bytes: 1
            }]
        );
    }
}
