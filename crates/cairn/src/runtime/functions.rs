//! User function traits for the operators that are more than a closure.

use crate::error::TaskResult;
use crate::state::{Key, KeyedContext, OperatorStateStore, TimeDomain};

/// Where a function puts its output records.
pub struct Collector<'a, O> {
    out: &'a mut Vec<O>,
}

impl<'a, O> Collector<'a, O> {
    pub(crate) fn new(out: &'a mut Vec<O>) -> Self {
        Collector { out }
    }

    /// Emits one record.
    #[inline]
    pub fn collect(&mut self, record: O) {
        self.out.push(record);
    }
}

/// Processes the records of a keyed stream one at a time, with keyed state scoped to the
/// record's key (Flink's `KeyedProcessFunction`). One instance runs per subtask, cloned from
/// the one given to the API.
///
/// ```
/// use cairn::api::{Collector, KeyedProcessFunction};
/// use cairn::state::{KeyedContext, ValueState};
/// use cairn::TaskResult;
///
/// #[derive(Clone, Default)]
/// struct Count { count: Option<ValueState<u64>> }
///
/// impl KeyedProcessFunction<String, String, (String, u64)> for Count {
///     fn open(&mut self, ctx: &mut KeyedContext<String>) -> TaskResult {
///         self.count = Some(ctx.value_state("count")?);
///         Ok(())
///     }
///     fn process(&mut self, word: String, ctx: &mut KeyedContext<String>,
///                out: &mut Collector<(String, u64)>) -> TaskResult {
///         let Some(state) = &self.count else { return Ok(()) };
///         let n = state.get_mut(ctx, || 0)?;
///         *n += 1;
///         out.collect((word, *n));
///         Ok(())
///     }
/// }
/// ```
pub trait KeyedProcessFunction<K: Key, I, O>: Clone + Send + 'static {
    /// Registers states; called once per subtask before the first record, after restore.
    fn open(&mut self, _ctx: &mut KeyedContext<K>) -> TaskResult {
        Ok(())
    }
    /// Processes one record; `ctx` is scoped to its key.
    fn process(
        &mut self,
        value: I,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<O>,
    ) -> TaskResult;
    /// A timer registered through `ctx` fired at `time`; `ctx` is scoped to its key.
    fn on_timer(
        &mut self,
        _time: i64,
        _domain: TimeDomain,
        _ctx: &mut KeyedContext<K>,
        _out: &mut Collector<O>,
    ) -> TaskResult {
        Ok(())
    }
}

/// Processes two keyed streams connected on the same key type, with shared keyed state.
pub trait KeyedCoProcessFunction<K: Key, I1, I2, O>: Clone + Send + 'static {
    /// Registers states.
    fn open(&mut self, _ctx: &mut KeyedContext<K>) -> TaskResult {
        Ok(())
    }
    /// A record of the first input.
    fn process1(
        &mut self,
        value: I1,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<O>,
    ) -> TaskResult;
    /// A record of the second input.
    fn process2(
        &mut self,
        value: I2,
        ctx: &mut KeyedContext<K>,
        out: &mut Collector<O>,
    ) -> TaskResult;
    /// A timer registered through `ctx` fired at `time`; `ctx` is scoped to its key.
    fn on_timer(
        &mut self,
        _time: i64,
        _domain: TimeDomain,
        _ctx: &mut KeyedContext<K>,
        _out: &mut Collector<O>,
    ) -> TaskResult {
        Ok(())
    }
}

/// Processes two connected (not keyed) streams.
pub trait CoProcessFunction<I1, I2, O>: Clone + Send + 'static {
    /// A record of the first input.
    fn process1(&mut self, value: I1, out: &mut Collector<O>) -> TaskResult;
    /// A record of the second input.
    fn process2(&mut self, value: I2, out: &mut Collector<O>) -> TaskResult;
}

/// Processes the records of a stream that is not keyed, with operator state: named lists of the
/// subtask (Flink's `ProcessFunction` with `CheckpointedFunction`). A list state is split evenly
/// over the subtasks when a job resumes at another parallelism; a union list state is given
/// whole to every subtask.
///
/// ```
/// use cairn::api::{Collector, ProcessFunction};
/// use cairn::state::{OperatorListState, OperatorStateStore};
/// use cairn::TaskResult;
///
/// /// Counts the records of its subtask; the counts survive restarts and rescaling.
/// #[derive(Clone, Default)]
/// struct Counter { seen: u64, state: Option<OperatorListState<u64>> }
///
/// impl ProcessFunction<String, String> for Counter {
///     fn open(&mut self, store: &mut OperatorStateStore) -> TaskResult {
///         let state = store.list_state::<u64>("seen")?;
///         self.seen = state.get(store)?.iter().sum();
///         self.state = Some(state);
///         Ok(())
///     }
///     fn process(&mut self, value: String, _store: &mut OperatorStateStore,
///                out: &mut Collector<String>) -> TaskResult {
///         self.seen += 1;
///         out.collect(value);
///         Ok(())
///     }
///     fn snapshot_state(&mut self, store: &mut OperatorStateStore) -> TaskResult {
///         match &self.state {
///             Some(state) => state.update(store, &[self.seen]),
///             None => Ok(()),
///         }
///     }
/// }
/// ```
pub trait ProcessFunction<I, O>: Clone + Send + 'static {
    /// Registers operator states and reads what was restored; called once per subtask before
    /// the first record.
    fn open(&mut self, _store: &mut OperatorStateStore) -> TaskResult {
        Ok(())
    }
    /// Processes one record.
    fn process(
        &mut self,
        value: I,
        store: &mut OperatorStateStore,
        out: &mut Collector<O>,
    ) -> TaskResult;
    /// A checkpoint is taken: write what must survive into the registered lists.
    fn snapshot_state(&mut self, _store: &mut OperatorStateStore) -> TaskResult {
        Ok(())
    }
}
