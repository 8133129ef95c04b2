//! De-duplication: the seeds' "at-least-once plus de-duplication" (R17).
//!
//! [`KeyedStream::deduplicate`] keys a stream by each record's id and drops a record whose id
//! was seen within a bounded horizon before it. The seen-set is keyed state — per id, the time
//! until which the id is remembered — so it is in every checkpoint, is split by key group when
//! a job is rescaled, and is restored with the rest of the job (a record replayed from a
//! restored checkpoint is compared against the seen-set *of that checkpoint*, as it must be:
//! its first delivery was rolled back with everything else).
//!
//! # Why a horizon in time, with timers
//!
//! Remembering every id forever grows without bound; the horizon bounds it. A count of ids
//! ("the last N ids") would need one global order of ids across all subtasks, which keyed
//! state does not have: every subtask sees only its key groups, and a rescale regroups them.
//! A time horizon needs nothing global: when an id is first seen at time t, it is remembered
//! until `t + horizon` and a timer for that time forgets it, so state holds only the ids of
//! the last `horizon` and cleans itself up. A record whose id was remembered at its time is
//! dropped; otherwise it passes and its id is remembered from its own time on (a duplicate
//! later than `horizon` after the first is kept — that is the bound).
//!
//! The time is the records' event time ([`DedupHorizon::EventTime`]: deterministic, a replay
//! decides the same way; an id is forgotten when the watermark passes its time) or the wall
//! clock ([`DedupHorizon::ProcessingTime`]: for streams without timestamps; a replay after a
//! long outage may find ids forgotten that the first run still knew). Choose a horizon longer
//! than the distance at which duplicates arrive (for a source that redelivers after a
//! failure: its restart time plus a checkpoint interval).

use std::time::Duration;

use super::{Collector, Data, DataStream, KeyedProcessFunction, KeyedStream};
use crate::error::{TaskError, TaskResult};
use crate::state::{Key, KeyedContext, TimeDomain, ValueState};

/// How long [`KeyedStream::deduplicate`] remembers an id after it first saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DedupHorizon {
    /// In event time: the stream must carry timestamps.
    EventTime(Duration),
    /// In processing time (the wall clock).
    ProcessingTime(Duration),
}

impl DedupHorizon {
    fn domain(self) -> TimeDomain {
        match self {
            DedupHorizon::EventTime(_) => TimeDomain::EventTime,
            DedupHorizon::ProcessingTime(_) => TimeDomain::ProcessingTime,
        }
    }

    fn millis(self) -> i64 {
        let (DedupHorizon::EventTime(d) | DedupHorizon::ProcessingTime(d)) = self;
        i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
    }
}

/// Name of the keyed value state holding, per id, the time until which it is remembered.
pub const DEDUP_STATE: &str = "dedup-seen-until";

/// The keyed process function behind [`KeyedStream::deduplicate`] (see the module docs).
#[derive(Clone)]
pub struct Deduplicate {
    horizon: DedupHorizon,
    seen_until: Option<ValueState<i64>>,
}

impl Deduplicate {
    /// Drops records whose key was seen within `horizon`.
    pub fn new(horizon: DedupHorizon) -> Self {
        Deduplicate {
            horizon,
            seen_until: None,
        }
    }

    fn state(&self) -> TaskResult<&ValueState<i64>> {
        self.seen_until
            .as_ref()
            .ok_or_else(|| TaskError::msg("deduplicate used before it was opened"))
    }
}

impl<K: Key, T: Send + 'static> KeyedProcessFunction<K, T, T> for Deduplicate {
    fn open(&mut self, ctx: &mut KeyedContext<K>) -> TaskResult {
        self.seen_until = Some(ctx.value_state(DEDUP_STATE)?);
        Ok(())
    }

    fn process(
        &mut self,
        record: T,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<T>,
    ) -> TaskResult {
        let now = match self.horizon {
            DedupHorizon::EventTime(_) => ctx.timestamp().ok_or_else(|| {
                TaskError::Unrecoverable(
                    "deduplicate with an event-time horizon needs records with timestamps (assign_timestamps_and_watermarks or with_timestamps)".into(),
                )
            })?,
            DedupHorizon::ProcessingTime(_) => ctx.current_processing_time(),
        };
        let state = self.state()?.clone();
        if state.value(ctx)?.is_some_and(|&until| now < until) {
            return Ok(());
        }
        let until = now.saturating_add(self.horizon.millis());
        state.update(ctx, until)?;
        match self.horizon.domain() {
            TimeDomain::EventTime => ctx.register_event_time_timer(until)?,
            TimeDomain::ProcessingTime => ctx.register_processing_time_timer(until)?,
        }
        out.collect(record);
        Ok(())
    }

    fn on_timer(
        &mut self,
        time: i64,
        domain: TimeDomain,
        ctx: &mut KeyedContext<K>,
        _out: &mut Collector<T>,
    ) -> TaskResult {
        if domain != self.horizon.domain() {
            return Ok(());
        }
        let state = self.state()?.clone();
        // An id seen again after its horizon was remembered anew, with a later timer.
        if state.value(ctx)? == Some(&time) {
            state.clear(ctx)?;
        }
        Ok(())
    }
}

impl<K: Key, T: Data> KeyedStream<K, T> {
    /// Drops every record whose key — its id — was seen within `horizon` before it, with the
    /// seen-set in keyed state (checkpointed, rescalable); see [`Deduplicate`] and the
    /// module docs. Records keep their timestamps.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cairn::api::{DedupHorizon, StreamEnv};
    /// use cairn::connectors::{DiscardSink, GeneratorSource};
    ///
    /// let env = StreamEnv::new();
    /// env.source(GeneratorSource::new(1_000, 10))
    ///     .key_by(|w| w.clone())
    ///     .deduplicate(DedupHorizon::ProcessingTime(Duration::from_secs(60)))
    ///     .uid("dedup")
    ///     .sink(DiscardSink);
    /// env.build("dedup").unwrap();
    /// ```
    pub fn deduplicate(self, horizon: DedupHorizon) -> DataStream<T> {
        let timestamps = self.stream.timestamps.clone();
        self.process(Deduplicate::new(horizon))
            .name("deduplicate")
            .timed(timestamps)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::checkpoint::Barrier;
    use crate::runtime::chain::Operator;
    use crate::runtime::operators::KeyedProcessOp;
    use crate::state::keygroup::{key_group_of_hash, stable_hash, subtask_for_key_group};
    use crate::state::{KeyedTableData, OperatorSnapshot};

    type Rec = (u32, i64); // (id, event time)
    type Op = KeyedProcessOp<u32, Rec, Rec, fn(&Rec) -> u32, Deduplicate>;

    const HORIZON_MS: i64 = 100;

    fn key(r: &Rec) -> u32 {
        r.0
    }

    fn ts(r: &Rec) -> i64 {
        r.1
    }

    /// Subtask `index` of `parallelism` of an event-time deduplicator, restored from `tables`.
    fn op(index: u32, parallelism: u32, tables: HashMap<String, KeyedTableData>) -> Op {
        let ctx = KeyedContext::new(index, parallelism, 128, tables);
        let horizon = DedupHorizon::EventTime(Duration::from_millis(HORIZON_MS as u64));
        KeyedProcessOp::new(
            "dedup".into(),
            key as fn(&Rec) -> u32,
            Deduplicate::new(horizon),
            ctx,
        )
        .unwrap()
        .with_timestamps(Some(std::sync::Arc::new(ts)))
    }

    fn run(op: &mut Op, records: &[Rec]) -> Vec<Rec> {
        let mut out = Vec::new();
        op.process(&mut records.to_vec(), &mut out).unwrap();
        out
    }

    fn watermark(op: &mut Op, w: i64) {
        op.on_watermark(w, &mut Vec::new()).unwrap();
    }

    fn tables(snap: OperatorSnapshot) -> HashMap<String, KeyedTableData> {
        let data = snap.finish().unwrap();
        data.keyed
            .into_iter()
            .map(|t| (t.name.clone(), t))
            .collect()
    }

    fn snapshot(op: &mut Op, id: u64) -> HashMap<String, KeyedTableData> {
        let barrier = Barrier {
            id,
            timestamp_ms: 0,
            aligned_only: false,
            savepoint: false,
        };
        tables(op.snapshot(barrier).unwrap().unwrap())
    }

    /// Records `(id, t)` for ids `0..n` at time `t`.
    fn burst(n: u32, t: i64) -> Vec<Rec> {
        (0..n).map(|id| (id, t)).collect()
    }

    #[test]
    fn a_replayed_prefix_is_dropped() {
        let mut op = op(0, 1, HashMap::new());
        let first: Vec<Rec> = (0..50).map(|i| (i, i64::from(i))).collect();
        assert_eq!(run(&mut op, &first), first);
        // The same records again (an at-least-once source replaying), then new ones.
        let mut again = first[..30].to_vec();
        again.extend((50..60).map(|i| (i, 60)));
        assert_eq!(run(&mut op, &again), again[30..].to_vec());
        // Within one batch as well.
        assert_eq!(
            run(&mut op, &[(70, 61), (70, 62), (71, 61)]),
            vec![(70, 61), (71, 61)]
        );
    }

    #[test]
    fn beyond_the_horizon_an_id_passes_again_and_is_forgotten_by_its_timer() {
        let mut op = op(0, 1, HashMap::new());
        assert_eq!(run(&mut op, &[(1, 0), (2, 50)]), vec![(1, 0), (2, 50)]);
        // Within the horizon of its first sight (by the record's own time): dropped, even
        // before the watermark moved.
        assert_eq!(run(&mut op, &[(1, HORIZON_MS - 1)]), vec![]);
        // At the horizon: passes, and is remembered from then on.
        assert_eq!(run(&mut op, &[(1, HORIZON_MS)]), vec![(1, HORIZON_MS)]);
        assert_eq!(run(&mut op, &[(1, HORIZON_MS + 5)]), vec![]);
        // The watermark passing an id's horizon forgets it: a late duplicate passes then.
        watermark(&mut op, 150);
        assert_eq!(
            run(&mut op, &[(2, 60)]),
            vec![(2, 60)],
            "id 2 was forgotten at 150"
        );
        assert_eq!(
            run(&mut op, &[(1, 110)]),
            vec![],
            "id 1 is remembered until 200"
        );
        watermark(&mut op, 200);
        assert_eq!(run(&mut op, &[(1, 110)]), vec![(1, 110)]);
    }

    /// Ids in the seen-set of `tables` (restored into a fresh context).
    fn seen_ids(tables: HashMap<String, KeyedTableData>) -> usize {
        let mut ctx: KeyedContext<u32> = KeyedContext::new(0, 1, 128, tables);
        ctx.value_state::<i64>(DEDUP_STATE).unwrap();
        ctx.entries()
    }

    #[test]
    fn the_seen_set_is_bounded_by_the_horizon() {
        let mut op = op(0, 1, HashMap::new());
        for round in 0..10 {
            let t = round * HORIZON_MS;
            let out = run(&mut op, &burst(1000, t));
            assert_eq!(out.len(), 1000, "round {round}: every id is new again");
            if round == 0 {
                assert_eq!(seen_ids(snapshot(&mut op, 1)), 1000);
            }
            watermark(&mut op, t + HORIZON_MS);
        }
        assert_eq!(
            seen_ids(snapshot(&mut op, 2)),
            0,
            "every id's horizon passed"
        );
    }

    #[test]
    fn the_seen_set_survives_a_snapshot_and_restore() {
        let mut op1 = op(0, 1, HashMap::new());
        run(&mut op1, &burst(100, 0));
        let restored = snapshot(&mut op1, 1);
        // After the snapshot the first operator goes on; the restored one knows only what the
        // snapshot had.
        run(&mut op1, &[(500, 1)]);
        let mut op2 = op(0, 1, restored);
        assert_eq!(
            run(&mut op2, &burst(100, 10)),
            vec![],
            "all seen before the snapshot"
        );
        assert_eq!(run(&mut op2, &[(500, 1)]), vec![(500, 1)]);
        // Its timers came along: the horizon still ends.
        watermark(&mut op2, HORIZON_MS);
        assert_eq!(run(&mut op2, &burst(3, 10)), burst(3, 10));
    }

    /// The subtask of `parallelism` that owns `id`'s key group.
    fn owner(id: u32, parallelism: u32) -> usize {
        let kg = key_group_of_hash(stable_hash(&id), 128);
        subtask_for_key_group(kg, 128, parallelism) as usize
    }

    #[test]
    fn rescaling_gives_every_id_to_the_subtask_that_owns_it() {
        let mut old: Vec<Op> = (0..2).map(|i| op(i, 2, HashMap::new())).collect();
        let ids = burst(400, 0);
        for r in &ids {
            assert_eq!(run(&mut old[owner(r.0, 2)], &[*r]), vec![*r]);
        }
        // Restore at parallelism 3 from both old subtasks' snapshots: each new subtask takes
        // the seen-set (and timers) of its key groups.
        let mut merged: HashMap<String, KeyedTableData> = HashMap::new();
        for o in &mut old {
            for (name, t) in snapshot(o, 1) {
                match merged.get_mut(&name) {
                    Some(m) => m.groups.extend(t.groups),
                    None => {
                        merged.insert(name, t);
                    }
                }
            }
        }
        for t in merged.values_mut() {
            t.groups.sort_by_key(|g| g.0);
        }
        let mut new: Vec<Op> = (0..3).map(|i| op(i, 3, merged.clone())).collect();
        for r in &ids {
            assert_eq!(
                run(&mut new[owner(r.0, 3)], &[(r.0, 20)]),
                vec![],
                "id {} was seen before the rescale",
                r.0
            );
        }
        for o in &mut new {
            watermark(o, HORIZON_MS);
        }
        for r in &ids {
            assert_eq!(
                run(&mut new[owner(r.0, 3)], &[(r.0, 120)]),
                vec![(r.0, 120)],
                "id {}: its horizon passed",
                r.0
            );
        }
    }

    #[test]
    fn an_event_time_horizon_needs_timestamps() {
        let ctx = KeyedContext::new(0, 1, 128, HashMap::new());
        let horizon = DedupHorizon::EventTime(Duration::from_millis(5));
        let mut op: Op = KeyedProcessOp::new(
            "dedup".into(),
            key as fn(&Rec) -> u32,
            Deduplicate::new(horizon),
            ctx,
        )
        .unwrap();
        let e = op.process(&mut vec![(1, 0)], &mut Vec::new()).unwrap_err();
        assert!(
            e.to_string().contains("needs records with timestamps"),
            "{e}"
        );
    }

    #[test]
    fn a_processing_time_horizon_forgets_when_its_timer_fires() {
        let ctx = KeyedContext::new(0, 1, 128, HashMap::new());
        let horizon = DedupHorizon::ProcessingTime(Duration::from_secs(3600));
        let mut op: Op = KeyedProcessOp::new(
            "dedup".into(),
            key as fn(&Rec) -> u32,
            Deduplicate::new(horizon),
            ctx,
        )
        .unwrap();
        let now = crate::checkpoint::now_ms() as i64;
        assert_eq!(
            run(&mut op, &[(1, 0), (1, 0), (2, 0)]),
            vec![(1, 0), (2, 0)]
        );
        assert_eq!(run(&mut op, &[(2, 0)]), vec![]);
        op.on_processing_time(now + 3_600_000 + 60_000, &mut Vec::new())
            .unwrap();
        assert_eq!(run(&mut op, &[(1, 0), (2, 0)]), vec![(1, 0), (2, 0)]);
    }
}
