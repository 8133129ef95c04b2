//! The barrier handler: every decision of the barrier protocol, as a synchronous state machine
//! without I/O and without a clock.
//!
//! The task thread (see `task.rs`) and the simulator (`crate::sim`) drive it the same way: they
//! feed it events — an element or a priority barrier arrived on channel c, a batch is about to be
//! processed and was processed, the timer fired (with the time as an argument, [`Now`]), a
//! checkpoint was triggered, completed or aborted, a channel ended — and perform the
//! [`GateAction`]s it returns (snapshot, forward the barrier, upload the held snapshot with its
//! channel state, decline, notify the chain). It never reads a clock, a queue or a file.
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
//! the task records it (serialized) as channel state of checkpoint n. Batches still queued in
//! the mailbox are recorded without waiting for them ([`InputGate::plan_capture`]). When every
//! live channel's barrier arrived and its pre-barrier batches were all recorded, the channel
//! state is complete and the held snapshot is uploaded with it. On recovery it is replayed
//! before any new input.
//!
//! **Aligned with timeout.** A checkpoint starts aligned; if its alignment is still incomplete
//! `timeout` after the trigger, the task switches: it snapshots at once, unblocks the channels
//! that delivered the barrier (their parked data is after the cut) and records the batches of
//! the others until their barrier arrives. An unaligned barrier from upstream switches at once,
//! and an in-band barrier still queued past the timeout overtakes its data
//! ([`InputGate::promotion`]). The final checkpoint of a bounded job ([`Barrier::aligned_only`])
//! never switches: everything before it must be processed, and committed, before the job ends.
//!
//! A barrier with a higher id than the pending one cancels it (the older checkpoint is
//! declined as [`DeclineCause::Subsumed`], which is not a failed checkpoint); barriers older than the newest seen are stale and
//! ignored.
//!
//! **End of input.** A task whose inputs all ended still holds the pre-committed transactions of
//! the snapshots it took; it may exit only when every such snapshot's checkpoint completed (or
//! was aborted while the task still had input).
//!
//! The sending side is [`Forwarding`]: what goes out in front of a forwarded barrier.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::channel::{Barrier, BarrierKind, Element};
use crate::checkpoint::DeclineCause;

/// The time, as an input: the monotonic instant (timers) and the wall clock in ms since the
/// Unix epoch (barrier timestamps).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Now {
    /// Monotonic time.
    pub at: Instant,
    /// Wall clock, ms since the Unix epoch.
    pub wall_ms: u64,
}

/// How the gate treats barriers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlignmentMode {
    /// Exactly-once: block channels until the barrier arrived on all of them. Checkpoints may
    /// still arrive unaligned (configured, or switched by a timeout upstream).
    Aligned,
    /// At-least-once: never block; snapshot when the barrier arrived on all channels.
    Tracking,
}

/// What the driver must do, in the order returned.
#[derive(Debug, PartialEq, Eq)]
pub enum GateAction {
    /// Take the synchronous snapshot now. If `unaligned`, hold its upload until the
    /// [`GateAction::ChannelState`] of the same checkpoint (or drop it on
    /// [`GateAction::Discard`] / [`GateAction::Decline`]).
    Snapshot {
        /// The checkpoint.
        barrier: Barrier,
        /// Time from the first barrier to the snapshot.
        alignment: Duration,
        /// Whether the checkpoint is unaligned at this task.
        unaligned: bool,
    },
    /// Forward the barrier on every output channel: in band, or (unaligned) as a priority
    /// barrier overtaking the queued data.
    Forward {
        /// The checkpoint.
        barrier: Barrier,
        /// Priority barrier.
        unaligned: bool,
    },
    /// The channel state of unaligned checkpoint `id` is complete: attach it to the held
    /// snapshot and upload.
    ChannelState {
        /// Checkpoint id.
        id: u64,
        /// Per input channel, the recorded in-flight batches (serialized), in order.
        channels: Vec<(usize, Vec<Vec<u8>>)>,
        /// Their total size.
        bytes: u64,
    },
    /// Drop the held snapshot of checkpoint `id` (aborted) and tell the chain.
    Discard {
        /// Checkpoint id.
        id: u64,
    },
    /// Decline checkpoint `id` (drops its held snapshot, if any).
    Decline {
        /// Checkpoint id.
        id: u64,
        /// Why: the gate declines only checkpoints a newer one subsumed.
        cause: DeclineCause,
    },
    /// Checkpoint `id` completed: tell the chain (sinks commit).
    NotifyComplete {
        /// Checkpoint id.
        id: u64,
    },
    /// Checkpoint `id` was aborted after the input ended: its pre-committed output can never be
    /// committed by this attempt, so the task must fail (the job restarts from the latest
    /// completed checkpoint).
    FailAbortedAtEnd {
        /// Checkpoint id.
        id: u64,
    },
}

/// Planted protocol bugs, switched on only by the simulator's tests to show that it finds them.
#[cfg(test)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flaw {
    /// Aligned mode does not block a channel that delivered the barrier.
    NoBlock,
    /// An aligned barrier is forwarded as soon as it arrives on one channel, before the snapshot.
    ForwardEarly,
    /// An in-flight batch is not recorded as channel state.
    SkipInFlight,
    /// The alignment timeout also switches the final (aligned-only) checkpoint (defect 3.1).
    FinalMayUnalign,
    /// A task whose inputs ended exits without waiting for its snapshots' outcome (defect 3.2).
    ExitBeforeCommit,
    /// A writer sends the barrier before the partial batch buffered in front of it.
    BarrierBeforeFlush,
}

/// The outcomes a subtask still waits for: the checkpoints it snapshotted (so its sinks hold
/// pre-committed transactions of them) that neither completed nor were aborted yet.
#[derive(Debug, Default)]
struct Outcomes {
    /// Ascending; at most max-concurrent-checkpoints long.
    open: VecDeque<u64>,
    ended: bool,
    #[cfg(test)]
    pub(crate) flaw: Option<Flaw>,
}

impl Outcomes {
    /// The subtask snapshotted checkpoint `id`.
    fn snapshotted(&mut self, id: u64) {
        if self.open.back().is_none_or(|&last| last < id) {
            self.open.push_back(id);
        }
    }

    /// The input ended (every channel, or a source's end of input).
    fn end_input(&mut self) {
        self.ended = true;
    }

    /// Checkpoint `id` completed: it subsumes every older one.
    fn on_complete(&mut self, id: u64) -> GateAction {
        while self.open.front().is_some_and(|&o| o <= id) {
            self.open.pop_front();
        }
        GateAction::NotifyComplete { id }
    }

    /// Checkpoint `id` was aborted. Fails the task if nothing can commit its output any more.
    fn on_abort(&mut self, id: u64, out: &mut Vec<GateAction>) {
        let newest = self.open.back() == Some(&id);
        self.open.retain(|&o| o != id);
        out.push(GateAction::Discard { id });
        // A newer snapshot would commit this one's transactions; after the end of input
        // there is none, and a restart must replay.
        if self.ended && newest {
            out.push(GateAction::FailAbortedAtEnd { id });
        }
    }

    /// Whether the subtask may exit: its input ended and no snapshot's outcome is pending.
    fn may_exit(&self) -> bool {
        #[cfg(test)]
        if self.flaw == Some(Flaw::ExitBeforeCommit) {
            return self.ended;
        }
        self.ended && self.open.is_empty()
    }
}

/// How a writer sends the partial batches buffered in front of a barrier it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlushCredit {
    /// Wait for credit, as any batch: the barrier follows the data in band.
    Wait,
    /// Overdraw the credit (at most one batch per channel per checkpoint beyond the credits): a
    /// priority barrier must not be held back by backpressure, and it counts the batch as sent
    /// before it.
    Overdraw,
}

/// One step of forwarding a barrier on an output channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardStep {
    /// Send the channel's partial batch, if it has one.
    FlushPartial(FlushCredit),
    /// Send the barrier: in band, or (unaligned) as a priority barrier that carries the number
    /// of batches sent on the channel before it.
    Barrier,
}

/// The sending side of the protocol: what goes out on each output channel, in order, when a
/// barrier is forwarded. Records a subtask emitted before its snapshot are in its state's past,
/// so they go out before the barrier (and an unaligned barrier counts them), or they would be
/// in neither the snapshot nor the replay.
#[derive(Debug, Clone, Copy, Default)]
pub struct Forwarding {
    #[cfg(test)]
    flaw: Option<Flaw>,
}

impl Forwarding {
    /// The rule as production runs it.
    pub fn new() -> Self {
        Forwarding::default()
    }

    /// The rule with a planted bug (simulator tests only).
    #[cfg(test)]
    pub(crate) fn with_flaw(flaw: Option<Flaw>) -> Self {
        Forwarding { flaw }
    }

    /// The steps per output channel when forwarding a barrier (`unaligned`: a priority one).
    pub fn steps(&self, unaligned: bool) -> [ForwardStep; 2] {
        let credit = if unaligned {
            FlushCredit::Overdraw
        } else {
            FlushCredit::Wait
        };
        #[cfg(test)]
        if self.flaw == Some(Flaw::BarrierBeforeFlush) {
            return [ForwardStep::Barrier, ForwardStep::FlushPartial(credit)];
        }
        [ForwardStep::FlushPartial(credit), ForwardStep::Barrier]
    }
}

/// Whether planted bug `$flaw` is switched on; always false outside the simulator's tests.
macro_rules! flawed {
    ($self:ident, $flaw:ident) => {{
        #[cfg(test)]
        {
            $self.flaw == Some(Flaw::$flaw)
        }
        #[cfg(not(test))]
        {
            false
        }
    }};
}

struct Pending {
    barrier: Barrier,
    started: Instant,
    /// Switch to unaligned at this instant (aligned-with-timeout; never for aligned-only).
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
    /// The barrier was already forwarded (only by [`Flaw::ForwardEarly`]).
    #[cfg(test)]
    forwarded: bool,
}

/// The barrier handler over the input channels of one subtask.
pub struct InputGate {
    mode: AlignmentMode,
    /// Aligned-checkpoint timeout (switch to unaligned after it), if configured.
    timeout: Option<Duration>,
    ended: Vec<bool>,
    ended_count: usize,
    blocked: Vec<bool>,
    parked: Vec<VecDeque<Element>>,
    parked_total: usize,
    processed: Vec<u64>,
    pending: Option<Pending>,
    newest_id: u64,
    outcomes: Outcomes,
    #[cfg(test)]
    pub(crate) flaw: Option<Flaw>,
}

fn is_batch(e: &Element) -> bool {
    matches!(e, Element::Batch(_) | Element::Encoded(_))
}

impl InputGate {
    /// A gate over `channels` input channels.
    pub fn new(channels: usize, mode: AlignmentMode) -> Self {
        InputGate {
            mode,
            timeout: None,
            ended: vec![false; channels],
            ended_count: 0,
            blocked: vec![false; channels],
            parked: (0..channels).map(|_| VecDeque::new()).collect(),
            parked_total: 0,
            processed: vec![0; channels],
            pending: None,
            newest_id: 0,
            outcomes: Outcomes::default(),
            #[cfg(test)]
            flaw: None,
        }
    }

    /// With an aligned-checkpoint timeout: in-band barriers switch to unaligned after it.
    pub fn with_aligned_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// Plants a protocol bug (simulator tests only).
    #[cfg(test)]
    pub(crate) fn with_flaw(mut self, flaw: Option<Flaw>) -> Self {
        self.flaw = flaw;
        self.outcomes.flaw = flaw;
        self
    }

    /// A source subtask's checkpoint trigger: snapshot, then forward. The barrier goes out
    /// unaligned only for unaligned checkpoints (a source has no input to align, so
    /// aligned-with-timeout is aligned here) and never for the final checkpoint.
    pub fn on_trigger(&mut self, barrier: Barrier, kind: BarrierKind) -> [GateAction; 2] {
        let unaligned = kind == BarrierKind::Unaligned && !barrier.aligned_only;
        self.outcomes.snapshotted(barrier.id);
        [
            GateAction::Snapshot {
                barrier,
                alignment: Duration::ZERO,
                unaligned: false,
            },
            GateAction::Forward { barrier, unaligned },
        ]
    }

    /// A source's input ended (its final checkpoint completed).
    pub fn end_input(&mut self) {
        self.outcomes.end_input();
    }

    /// Number of input channels.
    pub fn channels(&self) -> usize {
        self.ended.len()
    }

    /// Whether every channel has ended.
    pub fn all_ended(&self) -> bool {
        self.ended_count == self.ended.len()
    }

    /// Whether the task may exit: every channel ended and every snapshot it took has an outcome.
    pub fn may_exit(&self) -> bool {
        self.outcomes.may_exit()
    }

    /// Takes an element that arrived from the mailbox: returns it if it may be processed now, or
    /// parks it (blocked channel, or older parked elements of the same channel still queued).
    #[inline]
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
    #[inline]
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

    /// Whether a parked element could be processed now (its channel is not blocked): the
    /// simulator's view of what [`InputGate::next_parked`] would return.
    #[cfg(test)]
    pub(crate) fn ready_parked(&self) -> bool {
        self.parked_total > 0
            && (0..self.parked.len()).any(|c| !self.blocked[c] && !self.parked[c].is_empty())
    }

    /// Whether `channel` is blocked for alignment.
    pub fn is_blocked(&self, channel: usize) -> bool {
        self.blocked[channel]
    }

    /// A batch of `channel` is about to be processed: whether it is in flight at an unaligned
    /// cut and must be recorded (serialized) and passed to [`InputGate::after_batch`].
    #[inline]
    pub fn before_batch(&mut self, channel: usize) -> bool {
        self.processed[channel] += 1;
        if self.pending.is_none() {
            return false;
        }
        let seq = self.processed[channel];
        self.in_flight(channel, seq) && !flawed!(self, SkipInFlight)
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

    /// The sequence number of the last batch of `channel` taken from the mailbox (processed or
    /// parked).
    fn taken_seq(&self, channel: usize) -> u64 {
        self.processed[channel] + self.parked[channel].iter().filter(|e| is_batch(e)).count() as u64
    }

    /// Unaligned: which batches still queued in the mailbox are in flight at the cut, to be
    /// recorded now rather than when they are processed. `queued` is the mailbox in order: data
    /// mail as `Some((channel, element))`, other mail as `None`. Appends `(position in queued,
    /// channel, sequence number)` to `out`; the driver serializes those batches and passes them
    /// to [`InputGate::capture`].
    pub fn plan_capture<'a>(
        &self,
        queued: impl Iterator<Item = Option<(usize, &'a Element)>>,
        out: &mut Vec<(usize, usize, u64)>,
    ) {
        let Some(p) = self.pending.as_ref().filter(|p| p.unaligned) else {
            return;
        };
        let channels = self.channels();
        let mut next: Vec<u64> = (0..channels).map(|c| self.taken_seq(c)).collect();
        let mut stopped = vec![false; channels];
        for (i, mail) in queued.enumerate() {
            let Some((c, element)) = mail else {
                continue;
            };
            if c >= channels || stopped[c] {
                continue;
            }
            match element {
                Element::Batch(_) | Element::Encoded(_) => {
                    next[c] += 1;
                    if self.in_flight(c, next[c]) && !flawed!(self, SkipInFlight) {
                        out.push((i, c, next[c]));
                    }
                }
                // Whatever follows the barrier of this checkpoint is after the cut.
                Element::Barrier(b) if b.id >= p.barrier.id => stopped[c] = true,
                _ => {}
            }
        }
    }

    /// Unaligned: records the parked batches in flight at the cut (a newer barrier subsumed an
    /// alignment, so data parked behind the older barrier is before the newer one). Call it
    /// before capturing queued batches ([`InputGate::plan_capture`]): those come later on their
    /// channels, and a channel's captures go in order. `encode` serializes a parked element
    /// (None for one that is not a batch).
    pub fn capture_parked<E>(
        &mut self,
        mut encode: impl FnMut(usize, &Element) -> Result<Option<Vec<u8>>, E>,
    ) -> Result<(), E> {
        let Some(p) = self.pending.as_ref().filter(|p| p.unaligned) else {
            return Ok(());
        };
        let cut = p.barrier.id;
        let mut found = Vec::new();
        for (c, parked) in self.parked.iter().enumerate() {
            let mut seq = self.processed[c];
            for e in parked {
                match e {
                    Element::Batch(_) | Element::Encoded(_) => {
                        seq += 1;
                        if self.in_flight(c, seq) && !flawed!(self, SkipInFlight) {
                            if let Some(bytes) = encode(c, e)? {
                                found.push((c, seq, bytes));
                            }
                        }
                    }
                    // Whatever follows the barrier of this checkpoint is after the cut.
                    Element::Barrier(b) if b.id >= cut => break,
                    _ => {}
                }
            }
        }
        for (c, seq, bytes) in found {
            self.capture(c, seq, bytes);
        }
        Ok(())
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
    #[inline]
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

    /// Whether the driver should look for in-band barriers queued past the alignment timeout
    /// ([`InputGate::promotion`]).
    pub fn promotes(&self) -> bool {
        self.timeout.is_some()
    }

    /// Aligned-with-timeout: an in-band barrier still queued in the mailbox `timeout` after its
    /// trigger overtakes the data before it, as an unaligned barrier would. `queued` is the
    /// mailbox as for [`InputGate::plan_capture`]. Returns the barrier's position in `queued`,
    /// its channel, the barrier and the number of batches of the channel before it; the driver
    /// removes it from the mailbox and passes it to [`InputGate::on_priority_barrier`].
    pub fn promotion<'a>(
        &self,
        queued: impl Iterator<Item = Option<(usize, &'a Element)>>,
        now: Now,
    ) -> Option<(usize, usize, Barrier, u64)> {
        let timeout_ms = self.timeout?.as_millis() as u64;
        let mut pos: Vec<u64> = (0..self.channels()).map(|c| self.taken_seq(c)).collect();
        for (i, mail) in queued.enumerate() {
            let Some((c, element)) = mail else {
                continue;
            };
            if c >= pos.len() {
                continue;
            }
            match element {
                Element::Batch(_) | Element::Encoded(_) => pos[c] += 1,
                Element::Barrier(b)
                    if (!b.aligned_only || flawed!(self, FinalMayUnalign))
                        && now.wall_ms.saturating_sub(b.timestamp_ms) >= timeout_ms
                        && self.is_new_barrier(c, b.id) =>
                {
                    return Some((i, c, *b, pos[c]));
                }
                _ => {}
            }
        }
        None
    }

    /// Whether a barrier with this id would still be news (not stale).
    fn is_new_barrier(&self, channel: usize, id: u64) -> bool {
        match &self.pending {
            Some(p) if p.barrier.id == id => !p.seen[channel],
            Some(p) => id > p.barrier.id,
            None => id > self.newest_id,
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
    pub fn on_timer(&mut self, now: Now) -> Vec<GateAction> {
        match &self.pending {
            Some(p) if !p.unaligned && p.deadline.is_some_and(|d| now.at >= d) => {
                self.switch_to_unaligned(now)
            }
            _ => Vec::new(),
        }
    }

    /// Starts tracking checkpoint `barrier`, declining an older pending one.
    /// Returns None if the barrier is stale.
    fn begin(
        &mut self,
        barrier: Barrier,
        timed: bool,
        now: Now,
        actions: &mut Vec<GateAction>,
    ) -> Option<()> {
        match &self.pending {
            Some(p) if barrier.id < p.barrier.id => return None,
            Some(p) if barrier.id > p.barrier.id => {
                actions.push(GateAction::Decline {
                    id: p.barrier.id,
                    cause: DeclineCause::Subsumed,
                });
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
        let may_switch = !barrier.aligned_only || flawed!(self, FinalMayUnalign);
        let deadline = self.timeout.filter(|_| timed && may_switch).map(|t| {
            // Measured from the trigger, as Flink does: a barrier that arrives late switches at once.
            let age = Duration::from_millis(now.wall_ms.saturating_sub(barrier.timestamp_ms));
            now.at + t.saturating_sub(age)
        });
        self.pending = Some(Pending {
            barrier,
            started: now.at,
            deadline,
            seen: vec![false; channels],
            unaligned: false,
            batches_before: vec![None; channels],
            recorded: vec![Vec::new(); channels],
            recorded_bytes: 0,
            captured: vec![0; channels],
            #[cfg(test)]
            forwarded: false,
        });
        Some(())
    }

    /// In-band barrier `barrier` arrived on `channel` (to be called for processable elements
    /// only).
    pub fn on_barrier(&mut self, channel: usize, barrier: Barrier, now: Now) -> Vec<GateAction> {
        let mut actions = Vec::new();
        if self.begin(barrier, true, now, &mut actions).is_none() {
            return actions;
        }
        let processed = self.processed[channel];
        let block = self.mode == AlignmentMode::Aligned && !flawed!(self, NoBlock);
        #[cfg(test)]
        let forward_early = flawed!(self, ForwardEarly);
        let Some(p) = self.pending.as_mut() else {
            return actions;
        };
        if !p.seen[channel] {
            p.seen[channel] = true;
            // In band: every batch before the barrier was processed already.
            p.batches_before[channel] = Some(processed);
            if block && !p.unaligned {
                self.blocked[channel] = true;
            }
        }
        #[cfg(test)]
        if forward_early && !p.unaligned && !p.forwarded {
            p.forwarded = true;
            actions.push(GateAction::Forward {
                barrier,
                unaligned: false,
            });
        }
        if p.unaligned {
            actions.extend(self.try_complete_channel_state());
        } else if p.deadline.is_some_and(|d| now.at >= d) {
            actions.extend(self.switch_to_unaligned(now));
        } else {
            self.try_complete_aligned(now, &mut actions);
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
        now: Now,
    ) -> Vec<GateAction> {
        let mut actions = Vec::new();
        if self.begin(barrier, false, now, &mut actions).is_none() {
            return actions;
        }
        if let Some(p) = self.pending.as_mut() {
            if !p.seen[channel] {
                p.seen[channel] = true;
                p.batches_before[channel] = Some(batches_before);
            }
        }
        if self.pending.as_ref().is_some_and(|p| !p.unaligned) {
            actions.extend(self.switch_to_unaligned(now));
        } else {
            actions.extend(self.try_complete_channel_state());
        }
        actions
    }

    /// `channel` delivered end of stream.
    pub fn on_end_of_stream(&mut self, channel: usize, now: Now) -> Vec<GateAction> {
        if !self.ended[channel] {
            self.ended[channel] = true;
            self.ended_count += 1;
            if self.all_ended() {
                self.outcomes.end_input();
            }
        }
        let mut actions = Vec::new();
        match &self.pending {
            Some(p) if p.unaligned => actions.extend(self.try_complete_channel_state()),
            Some(_) => self.try_complete_aligned(now, &mut actions),
            None => {}
        }
        actions
    }

    /// Checkpoint `id` completed.
    pub fn on_complete(&mut self, id: u64) -> GateAction {
        self.outcomes.on_complete(id)
    }

    /// Checkpoint `id` was aborted: forget it.
    pub fn on_abort(&mut self, id: u64) -> Vec<GateAction> {
        if self.pending.as_ref().is_some_and(|p| p.barrier.id == id) {
            self.pending = None;
            self.unblock_all();
        }
        let mut actions = Vec::new();
        self.outcomes.on_abort(id, &mut actions);
        actions
    }

    fn snapshot(
        &mut self,
        barrier: Barrier,
        started: Instant,
        unaligned: bool,
        now: Now,
        actions: &mut Vec<GateAction>,
    ) {
        self.outcomes.snapshotted(barrier.id);
        actions.push(GateAction::Snapshot {
            barrier,
            alignment: now.at.saturating_duration_since(started),
            unaligned,
        });
        #[cfg(test)]
        if self.pending.as_ref().is_some_and(|p| p.forwarded) {
            return;
        }
        actions.push(GateAction::Forward { barrier, unaligned });
    }

    fn switch_to_unaligned(&mut self, now: Now) -> Vec<GateAction> {
        let mut actions = Vec::new();
        let Some(p) = self.pending.as_mut() else {
            return actions;
        };
        p.unaligned = true;
        let (barrier, started) = (p.barrier, p.started);
        self.snapshot(barrier, started, true, now, &mut actions);
        // Parked data of blocked channels came after their barrier: it is not in flight at the cut.
        self.unblock_all();
        actions.extend(self.try_complete_channel_state());
        actions
    }

    fn try_complete_aligned(&mut self, now: Now, actions: &mut Vec<GateAction>) {
        let Some(p) = self.pending.as_ref() else {
            return;
        };
        let live_unseen = (0..self.ended.len())
            .filter(|&c| !self.ended[c] && !p.seen[c])
            .count();
        if live_unseen > 0 {
            return;
        }
        let (barrier, started) = (p.barrier, p.started);
        self.snapshot(barrier, started, false, now, actions);
        self.pending = None;
        self.unblock_all();
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

    /// A fixed time: the gate has no clock of its own.
    fn t0() -> Now {
        Now {
            at: Instant::now(),
            wall_ms: 1_000_000,
        }
    }

    fn later(now: Now, ms: u64) -> Now {
        Now {
            at: now.at + Duration::from_millis(ms),
            wall_ms: now.wall_ms + ms,
        }
    }

    fn barrier(id: u64) -> Element {
        Element::Barrier(b(id))
    }

    fn b(id: u64) -> Barrier {
        Barrier {
            aligned_only: false,
            id,
            timestamp_ms: t0().wall_ms,
            savepoint: false,
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
                Element::Barrier(b) => gate.on_barrier(ch, b, t0()),
                Element::EndOfStream => gate.on_end_of_stream(ch, t0()),
                Element::Encoded(_) | Element::Watermark(_) | Element::Idle => Vec::new(),
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
        assert!(gate.on_barrier(0, b(1), t0()).is_empty());
        assert!(gate.is_blocked(0));
        assert_eq!(
            gate.on_barrier(1, b(2), t0()),
            vec![GateAction::Decline {
                id: 1,
                cause: DeclineCause::Subsumed
            }]
        );
        assert!(!gate.is_blocked(0));
        assert!(gate.on_barrier(1, b(1), t0()).is_empty());
        assert!(matches!(
            gate.on_barrier(0, b(2), t0())[..],
            [
                GateAction::Snapshot { .. },
                GateAction::Forward {
                    unaligned: false,
                    ..
                }
            ]
        ));
    }

    /// Feeds batches as (channel, sequence number) and records what the gate asks to record.
    #[test]
    fn unaligned_records_exactly_the_batches_in_flight_at_the_cut() {
        let mut gate = InputGate::new(2, AlignmentMode::Aligned);
        // Channel 0 has processed 1 batch; its sender sent 3 before the barrier.
        assert!(!gate.before_batch(0));
        assert_eq!(gate.after_batch(0, None), None);
        let actions = gate.on_priority_barrier(0, b(5), 3, t0());
        assert!(matches!(
            actions[..],
            [
                GateAction::Snapshot {
                    unaligned: true,
                    ..
                },
                GateAction::Forward {
                    unaligned: true,
                    ..
                }
            ]
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
        let actions = gate.on_priority_barrier(1, b(5), 2, t0());
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
        let now = t0();
        let mut gate = InputGate::new(2, AlignmentMode::Aligned)
            .with_aligned_timeout(Some(Duration::from_millis(50)));
        assert!(gate.on_barrier(0, b(1), now).is_empty());
        assert!(gate.is_blocked(0));
        assert_eq!(gate.deadline(), Some(later(now, 50).at));
        assert!(gate.on_timer(later(now, 49)).is_empty());
        let actions = gate.on_timer(later(now, 50));
        assert!(matches!(
            actions[..],
            [
                GateAction::Snapshot {
                    unaligned: true,
                    ..
                },
                GateAction::Forward {
                    unaligned: true,
                    ..
                }
            ]
        ));
        assert!(
            !gate.is_blocked(0),
            "parked data after the barrier is released"
        );
        // Channel 1 delivers data before its (in-band) barrier: recorded.
        assert!(gate.before_batch(1));
        assert_eq!(gate.after_batch(1, Some(vec![7])), None);
        let actions = gate.on_barrier(1, b(1), later(now, 51));
        assert_eq!(
            actions,
            vec![GateAction::ChannelState {
                id: 1,
                channels: vec![(1, vec![vec![7]])],
                bytes: 1
            }]
        );
    }

    /// Defect 3.1: the final checkpoint of a bounded job stays aligned whatever the timeout.
    #[test]
    fn the_final_checkpoint_never_switches_to_unaligned() {
        let now = t0();
        let mut gate = InputGate::new(2, AlignmentMode::Aligned)
            .with_aligned_timeout(Some(Duration::from_millis(1)));
        let fin = Barrier {
            aligned_only: true,
            ..b(4)
        };
        // Arrives long after its trigger: an ordinary barrier would switch at once.
        let late = later(now, 1_000);
        assert!(gate.on_barrier(0, fin, late).is_empty());
        assert_eq!(gate.deadline(), None);
        assert!(gate.on_timer(later(late, 1_000)).is_empty());
        // Nor is it promoted ahead of the data queued before it.
        let queued_final = [rec(1), Element::Barrier(fin)];
        assert!(gate
            .promotion(
                queued_final.iter().map(|e| Some((1, e))),
                later(late, 1_000)
            )
            .is_none());
        assert!(gate.is_blocked(0));
        assert!(matches!(
            gate.on_barrier(1, fin, later(late, 2_000))[..],
            [
                GateAction::Snapshot {
                    unaligned: false,
                    ..
                },
                GateAction::Forward {
                    unaligned: false,
                    ..
                }
            ]
        ));
    }

    #[test]
    fn a_barrier_queued_past_the_timeout_is_promoted_with_the_batches_before_it() {
        let now = t0();
        let gate = InputGate::new(2, AlignmentMode::Aligned)
            .with_aligned_timeout(Some(Duration::from_millis(10)));
        let queued = [rec(1), rec(2), barrier(1), rec(3)];
        let mail = || {
            queued
                .iter()
                .enumerate()
                .map(|(i, e)| (i != 1).then_some((1, e)))
        };
        assert_eq!(gate.promotion(mail(), later(now, 9)), None);
        // The second element is other mail (not of a channel): one batch before the barrier.
        assert_eq!(
            gate.promotion(mail(), later(now, 10)),
            Some((2, 1, b(1), 1))
        );
    }

    /// Defect 3.7: the subsumed checkpoint is declined as such.
    #[test]
    fn a_subsumed_alignment_is_declined_as_subsumed() {
        let mut gate = InputGate::new(2, AlignmentMode::Aligned);
        assert!(gate.on_barrier(0, b(1), t0()).is_empty());
        assert_eq!(
            gate.on_priority_barrier(1, b(2), 0, t0())[0],
            GateAction::Decline {
                id: 1,
                cause: DeclineCause::Subsumed
            }
        );
    }

    /// Defect 3.2: with every input ended, the task waits for its last snapshot's outcome.
    #[test]
    fn a_task_whose_inputs_ended_waits_for_the_outcome_of_its_snapshots() {
        let mut gate = InputGate::new(1, AlignmentMode::Aligned);
        assert_eq!(gate.on_barrier(0, b(3), t0()).len(), 2);
        gate.on_end_of_stream(0, t0());
        assert!(gate.all_ended());
        assert!(
            !gate.may_exit(),
            "checkpoint 3 is pre-committed, not committed"
        );
        assert_eq!(gate.on_complete(3), GateAction::NotifyComplete { id: 3 });
        assert!(gate.may_exit());

        let mut gate = InputGate::new(1, AlignmentMode::Aligned);
        gate.on_barrier(0, b(3), t0());
        gate.on_end_of_stream(0, t0());
        assert_eq!(
            gate.on_abort(3),
            vec![
                GateAction::Discard { id: 3 },
                GateAction::FailAbortedAtEnd { id: 3 }
            ]
        );
    }

    #[test]
    fn queued_in_flight_batches_are_planned_for_capture_up_to_the_barrier() {
        let mut gate = InputGate::new(2, AlignmentMode::Aligned);
        gate.on_priority_barrier(0, b(2), 2, t0());
        let queued = [rec(1), rec(2), rec(3), barrier(2), rec(4)];
        let mut plan = Vec::new();
        gate.plan_capture(
            queued.iter().enumerate().map(|(i, e)| Some((i % 2, e))),
            &mut plan,
        );
        // Channel 0 has queue positions 0, 2, 4: its batches 1 and 2 are in flight, 3 is after
        // the barrier. Channel 1's barrier has not come: its batch (position 1) is in flight;
        // position 3 is its barrier.
        assert_eq!(plan, vec![(0, 0, 1), (1, 1, 1), (2, 0, 2)]);
    }

    /// Found by the simulation: a newer barrier subsumes an alignment while the blocked
    /// channel holds parked batches; those are before the newer barrier, so they are in flight
    /// at its unaligned cut and recorded before the queued ones, in channel order.
    #[test]
    fn parked_batches_of_a_subsumed_alignment_are_in_the_newer_cut() {
        let mut gate = InputGate::new(2, AlignmentMode::Aligned);
        assert!(gate.on_barrier(0, b(1), t0()).is_empty());
        assert!(gate.is_blocked(0));
        assert!(gate.accept(0, rec(10)).is_none());
        assert!(gate.accept(0, rec(11)).is_none());
        // Barrier 2 overtakes on channel 0 after the two parked batches and one queued one.
        let actions = gate.on_priority_barrier(0, b(2), 3, t0());
        assert_eq!(
            actions[0],
            GateAction::Decline {
                id: 1,
                cause: DeclineCause::Subsumed
            }
        );
        gate.capture_parked(|_, e| match e {
            Element::Batch(batch) => {
                let v = batch.downcast_ref::<Vec<u32>>().map(|v| v[0] as u8);
                Ok::<_, ()>(v.map(|x| vec![x]))
            }
            _ => Ok(None),
        })
        .unwrap();
        let queued = [rec(12), rec(13)];
        let mut plan = Vec::new();
        gate.plan_capture(queued.iter().map(|e| Some((0, e))), &mut plan);
        assert_eq!(
            plan,
            vec![(0, 0, 3)],
            "only the third batch is before the barrier"
        );
        gate.capture(0, 3, vec![12]);
        // Channel 1 delivers barrier 2 in band: the cut is complete.
        let actions = gate.on_barrier(1, b(2), t0());
        assert_eq!(
            actions,
            vec![GateAction::ChannelState {
                id: 2,
                channels: vec![(0, vec![vec![10], vec![11], vec![12]])],
                bytes: 3
            }]
        );
        // The parked batches are processed later without being recorded twice.
        let (ch, e) = gate.next_parked().unwrap();
        assert_eq!(ch, 0);
        assert!(matches!(e, Element::Batch(_)));
        assert!(!gate.before_batch(0));
    }
}
