//! Operator state: named lists of one operator subtask, not scoped to a key (Flink's
//! `OperatorStateStore`). On restore at another parallelism a list state is split evenly over
//! the new subtasks and a union list state is given whole to every one of them; at the same
//! parallelism each subtask gets back what it wrote.
//!
//! Values are serialized when the function updates a list, so a snapshot is a copy of bytes.
//! A union list state restored whole into every subtask is written back whole by every subtask
//! unless the function replaces it: as in Flink, a function that keeps its own part only
//! should `update` the list with that part.

use std::collections::HashMap;
use std::marker::PhantomData;

use super::{
    check_restorable, decode_exact, OperatorListData, OperatorSnapshot, SerializerId, StateKind,
};
use super::{StateValue, TaskError, TaskResult};

/// The operator list states of one operator subtask.
pub struct OperatorStateStore {
    subtask: u32,
    parallelism: u32,
    restored: HashMap<String, OperatorListData>,
    lists: Vec<OperatorListData>,
}

impl OperatorStateStore {
    /// The store of subtask `subtask` of `parallelism`, holding the lists restored for it.
    pub fn new(
        subtask: u32,
        parallelism: u32,
        restored: HashMap<String, OperatorListData>,
    ) -> Self {
        OperatorStateStore {
            subtask,
            parallelism,
            restored,
            lists: Vec::new(),
        }
    }

    /// This subtask's index.
    pub fn subtask(&self) -> u32 {
        self.subtask
    }

    /// The operator's parallelism.
    pub fn parallelism(&self) -> u32 {
        self.parallelism
    }

    /// Registers (or looks up) a list state, split evenly over the subtasks when rescaled.
    pub fn list_state<V: StateValue>(&mut self, name: &str) -> TaskResult<OperatorListState<V>> {
        self.register::<V>(name, StateKind::OperatorList)
    }

    /// Registers (or looks up) a union list state: on restore every subtask gets all of it.
    pub fn union_list_state<V: StateValue>(
        &mut self,
        name: &str,
    ) -> TaskResult<OperatorListState<V>> {
        self.register::<V>(name, StateKind::UnionList)
    }

    fn register<V: StateValue>(
        &mut self,
        name: &str,
        kind: StateKind,
    ) -> TaskResult<OperatorListState<V>> {
        let serializer = SerializerId::postcard::<V>();
        if let Some(idx) = self.lists.iter().position(|l| l.name == name) {
            let l = &self.lists[idx];
            if l.kind != kind || l.serializer != serializer {
                return Err(TaskError::msg(format!(
                    "operator state '{name}' is already registered with another kind or type"
                )));
            }
            return Ok(OperatorListState::new(idx));
        }
        let entries = match self.restored.remove(name) {
            Some(list) => {
                check_restorable(name, &list.serializer, list.kind, kind)?;
                // Decode now, so that a changed type fails the restore, not a later snapshot.
                for bytes in &list.entries {
                    decode_entry::<V>(name, bytes, &list.serializer.type_name)?;
                }
                list.entries
            }
            None => Vec::new(),
        };
        self.lists.push(OperatorListData {
            name: name.to_string(),
            kind,
            serializer,
            entries,
        });
        Ok(OperatorListState::new(self.lists.len() - 1))
    }

    fn list(&self, idx: usize) -> TaskResult<&OperatorListData> {
        self.lists
            .get(idx)
            .ok_or_else(|| TaskError::msg("operator state handle used with another store"))
    }

    fn list_mut(&mut self, idx: usize) -> TaskResult<&mut OperatorListData> {
        self.lists
            .get_mut(idx)
            .ok_or_else(|| TaskError::msg("operator state handle used with another store"))
    }

    /// The synchronous part of a snapshot: every registered list, plus restored lists never
    /// registered in this run (carried over unchanged, not dropped).
    pub fn snapshot(&self, uid: &str) -> OperatorSnapshot {
        let mut snap = OperatorSnapshot::new(uid);
        for l in self.lists.iter().chain(self.restored.values()) {
            snap = snap.with_list(l.clone());
        }
        snap
    }
}

fn decode_entry<V: StateValue>(name: &str, bytes: &[u8], was: &str) -> TaskResult<V> {
    decode_exact(bytes).map_err(|e| {
        TaskError::Unrecoverable(format!(
            "cannot restore operator state '{name}' as {}: {e}; it was written as {was}",
            std::any::type_name::<V>()
        ))
    })
}

/// A handle to one operator list state of an [`OperatorStateStore`].
pub struct OperatorListState<V> {
    idx: usize,
    _v: PhantomData<fn() -> V>,
}

impl<V> Clone for OperatorListState<V> {
    fn clone(&self) -> Self {
        OperatorListState::new(self.idx)
    }
}

impl<V> OperatorListState<V> {
    fn new(idx: usize) -> Self {
        OperatorListState {
            idx,
            _v: PhantomData,
        }
    }
}

impl<V: StateValue> OperatorListState<V> {
    /// The list's values.
    pub fn get(&self, store: &OperatorStateStore) -> TaskResult<Vec<V>> {
        let l = store.list(self.idx)?;
        l.entries
            .iter()
            .map(|b| decode_entry::<V>(&l.name, b, &l.serializer.type_name))
            .collect()
    }

    /// Replaces the list's values.
    pub fn update(&self, store: &mut OperatorStateStore, values: &[V]) -> TaskResult {
        let l = store.list_mut(self.idx)?;
        l.entries.clear();
        for v in values {
            l.entries.push(encode_entry(&l.name, v)?);
        }
        Ok(())
    }

    /// Appends a value.
    pub fn add(&self, store: &mut OperatorStateStore, value: &V) -> TaskResult {
        let l = store.list_mut(self.idx)?;
        let bytes = encode_entry(&l.name, value)?;
        l.entries.push(bytes);
        Ok(())
    }

    /// Empties the list.
    pub fn clear(&self, store: &mut OperatorStateStore) -> TaskResult {
        store.list_mut(self.idx)?.entries.clear();
        Ok(())
    }
}

fn encode_entry<V: StateValue>(name: &str, value: &V) -> TaskResult<Vec<u8>> {
    postcard::to_stdvec(value)
        .map_err(|e| TaskError::msg(format!("cannot serialize operator state '{name}': {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn restored(snap: OperatorSnapshot) -> HashMap<String, OperatorListData> {
        let data = snap.finish().unwrap();
        data.operator
            .into_iter()
            .map(|l| (l.name.clone(), l))
            .collect()
    }

    #[test]
    fn lists_round_trip_and_unregistered_ones_are_carried_over() {
        let mut store = OperatorStateStore::new(0, 1, HashMap::new());
        let split = store.list_state::<u64>("offsets").unwrap();
        let union = store.union_list_state::<String>("names").unwrap();
        split.update(&mut store, &[1, 2, 3]).unwrap();
        union.add(&mut store, &"a".to_string()).unwrap();
        let back_data = restored(store.snapshot("op"));
        assert_eq!(back_data["offsets"].kind, StateKind::OperatorList);
        assert_eq!(back_data["names"].kind, StateKind::UnionList);

        let mut back = OperatorStateStore::new(0, 1, back_data);
        let split = back.list_state::<u64>("offsets").unwrap();
        assert_eq!(split.get(&back).unwrap(), vec![1, 2, 3]);
        // "names" is not registered in this run: the next snapshot still has it.
        let again = restored(back.snapshot("op"));
        assert_eq!(again["names"].entries.len(), 1);
    }

    #[test]
    fn a_changed_kind_or_type_is_refused() {
        let mut store = OperatorStateStore::new(0, 1, HashMap::new());
        let l = store.list_state::<String>("l").unwrap();
        l.add(&mut store, &"a long string".to_string()).unwrap();
        let data = restored(store.snapshot("op"));

        let mut as_union = OperatorStateStore::new(0, 1, data.clone());
        let err = as_union.union_list_state::<String>("l").err().unwrap();
        assert!(matches!(err, TaskError::Unrecoverable(_)), "{err}");
        assert!(
            err.to_string().contains(
                "'l' was written as operator list state and is now registered as union list state"
            ),
            "{err}"
        );

        let mut as_u8 = OperatorStateStore::new(0, 1, data);
        let err = as_u8.list_state::<u8>("l").err().unwrap();
        assert!(matches!(err, TaskError::Unrecoverable(_)), "{err}");
        assert!(err.to_string().contains("alloc::string::String"), "{err}");
    }
}
