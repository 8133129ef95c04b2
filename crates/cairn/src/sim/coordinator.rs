//! The checkpoint coordinator as the simulation drives it: time is an argument and messages to
//! tasks are returned ([`Out`]), never sent. It follows `checkpoint::coordinator` rule for rule
//! (triggers at the interval with at most max-concurrent in flight, completion strictly in id
//! order once every task acknowledged, `_metadata` written last, abort on decline or timeout);
//! it stands in for it until that one takes time and returns its messages itself.

use std::collections::{BTreeMap, VecDeque};

use super::world::Snap;
use crate::runtime::channel::{Barrier, BarrierKind};

/// A message to the tasks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Out {
    /// To every source.
    Trigger(Barrier, BarrierKind),
    /// To every task.
    Aborted(u64),
}

struct Pending {
    barrier: Barrier,
    acks: Vec<Option<Snap>>,
    remaining: usize,
}

pub(crate) struct Coordinator {
    kind: BarrierKind,
    max_concurrent: usize,
    interval_ms: u64,
    timeout_ms: u64,
    /// Survives crashes: ids are never reused.
    next_id: u64,
    pending: BTreeMap<u64, Pending>,
    last_trigger_ms: u64,
    /// Checkpoints acknowledged by every task whose `_metadata` is being written.
    metadata: VecDeque<(u64, bool, Vec<Snap>)>,
}

impl Coordinator {
    pub(crate) fn new(
        kind: BarrierKind,
        max_concurrent: usize,
        interval_ms: u64,
        timeout_ms: u64,
    ) -> Self {
        Coordinator {
            kind,
            max_concurrent,
            interval_ms,
            timeout_ms,
            next_id: 1,
            pending: BTreeMap::new(),
            last_trigger_ms: 0,
            metadata: VecDeque::new(),
        }
    }

    pub(crate) fn kind(&self) -> BarrierKind {
        self.kind
    }

    /// A new attempt was deployed: the first checkpoint comes one interval later.
    pub(crate) fn deployed(&mut self, now_ms: u64) {
        self.last_trigger_ms = now_ms;
    }

    /// The process died: nothing in flight survives.
    pub(crate) fn crash(&mut self) {
        self.pending.clear();
        self.metadata.clear();
    }

    /// The tasks were replaced: in-flight checkpoints can never complete.
    pub(crate) fn abort_all(&mut self) {
        self.pending.clear();
    }

    pub(crate) fn has_metadata_pending(&self) -> bool {
        !self.metadata.is_empty()
    }

    /// The next `_metadata` write: (id, final, task snapshots).
    pub(crate) fn take_metadata(&mut self) -> Option<(u64, bool, Vec<Snap>)> {
        self.metadata.pop_front()
    }

    /// Triggers a checkpoint if one is due (or `force`d: the final one) and there is room.
    pub(crate) fn maybe_trigger(
        &mut self,
        now_ms: u64,
        force: bool,
        out: &mut Vec<Out>,
    ) -> Option<u64> {
        if self.pending.len() >= self.max_concurrent {
            return None;
        }
        if !force && now_ms < self.last_trigger_ms + self.interval_ms {
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let barrier = Barrier {
            id,
            timestamp_ms: now_ms,
            aligned_only: force,
        };
        let kind = if force {
            BarrierKind::Aligned
        } else {
            self.kind
        };
        self.pending.insert(
            id,
            Pending {
                barrier,
                acks: Vec::new(),
                remaining: usize::MAX,
            },
        );
        self.last_trigger_ms = now_ms;
        out.push(Out::Trigger(barrier, kind));
        Some(id)
    }

    pub(crate) fn on_ack(&mut self, id: u64, task: usize, snap: Snap, tasks: usize) {
        let Some(p) = self.pending.get_mut(&id) else {
            return;
        };
        if p.acks.is_empty() {
            p.acks = vec![None; tasks];
            p.remaining = tasks;
        }
        if p.acks[task].is_none() {
            p.acks[task] = Some(snap);
            p.remaining -= 1;
        }
        self.complete_ready();
    }

    pub(crate) fn on_decline(&mut self, id: u64, out: &mut Vec<Out>) {
        if self.pending.remove(&id).is_some() {
            out.push(Out::Aborted(id));
            self.complete_ready();
        }
    }

    pub(crate) fn check_timeouts(&mut self, now_ms: u64, out: &mut Vec<Out>) {
        let expired: Vec<u64> = self
            .pending
            .values()
            .filter(|p| now_ms.saturating_sub(p.barrier.timestamp_ms) > self.timeout_ms)
            .map(|p| p.barrier.id)
            .collect();
        for id in expired {
            self.on_decline(id, out);
        }
    }

    /// Completes checkpoints strictly in id order.
    fn complete_ready(&mut self) {
        while let Some(entry) = self.pending.first_entry() {
            if entry.get().remaining > 0 {
                break;
            }
            let p = entry.remove();
            let snaps = p.acks.into_iter().flatten().collect();
            self.metadata
                .push_back((p.barrier.id, p.barrier.aligned_only, snaps));
        }
    }
}
