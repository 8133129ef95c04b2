//! Task slots reserved by jobs: a job holds its slots from its first deployment until it ends,
//! so two jobs never count on the same slot. Pure bookkeeping, no I/O.

use std::collections::{BTreeMap, HashMap};

/// Not enough free slots for a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shortage {
    /// Slots the job needs.
    pub(crate) needed: u32,
    /// Slots it could have: those it holds on live workers and the free ones.
    pub(crate) available: u32,
    /// Slots the live workers offer in all.
    pub(crate) total: u32,
}

impl std::fmt::Display for Shortage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "not enough task slots: the job needs {}, {} of the live workers' {} are free",
            self.needed, self.available, self.total
        )
    }
}

/// Which worker holds each reserved slot of each job.
#[derive(Debug, Default)]
pub(crate) struct SlotTable {
    /// Job id → slot index → the worker the slot is on.
    held: HashMap<String, Vec<u32>>,
}

impl SlotTable {
    /// Reserves `needed` slots for `job` on the live `workers` (id → slots offered): the slots
    /// it already holds on live workers stay where they are (subtasks that still run keep
    /// their place), the others are taken from the free slots of the workers in id order.
    /// Returns, per slot index, its worker; with too few free slots nothing changes.
    pub(crate) fn reserve(
        &mut self,
        job: &str,
        needed: u32,
        workers: &BTreeMap<u32, u32>,
    ) -> Result<Vec<u32>, Shortage> {
        let mut used: BTreeMap<u32, u32> = BTreeMap::new();
        for (j, slots) in &self.held {
            for w in slots.iter().filter(|w| workers.contains_key(w)) {
                if j != job {
                    *used.entry(*w).or_default() += 1;
                }
            }
        }
        let mut mine: Vec<Option<u32>> = self
            .held
            .get(job)
            .map(|s| {
                s.iter()
                    .map(|w| workers.contains_key(w).then_some(*w))
                    .collect()
            })
            .unwrap_or_default();
        mine.resize(needed as usize, None);
        for w in mine.iter().flatten() {
            *used.entry(*w).or_default() += 1;
        }
        let mut free = workers.iter().flat_map(|(&w, &offered)| {
            let taken = used.get(&w).copied().unwrap_or(0);
            std::iter::repeat_n(w, offered.saturating_sub(taken) as usize)
        });
        let holes = mine.iter().filter(|s| s.is_none()).count();
        let mut filled = Vec::with_capacity(mine.len());
        for slot in &mine {
            match slot {
                Some(w) => filled.push(*w),
                None => match free.next() {
                    Some(w) => filled.push(w),
                    None => {
                        let total: u32 = workers.values().sum();
                        let free_now = total
                            .saturating_sub(used.values().sum::<u32>())
                            .min(holes as u32);
                        return Err(Shortage {
                            needed,
                            available: (needed - holes as u32) + free_now,
                            total,
                        });
                    }
                },
            }
        }
        self.held.insert(job.to_string(), filled.clone());
        Ok(filled)
    }

    /// The job ended: its slots are free.
    pub(crate) fn release(&mut self, job: &str) -> bool {
        self.held.remove(job).is_some()
    }

    /// Slots held on the live `workers` by jobs other than `ended` ones.
    pub(crate) fn reserved(&self, workers: &BTreeMap<u32, u32>, ended: &[String]) -> u32 {
        let held = self.held.iter().filter(|(job, _)| !ended.contains(job));
        let on_live = held
            .flat_map(|(_, slots)| slots)
            .filter(|w| workers.contains_key(w));
        on_live.count() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn workers(list: &[(u32, u32)]) -> BTreeMap<u32, u32> {
        list.iter().copied().collect()
    }

    #[test]
    fn two_jobs_never_share_a_slot() {
        let mut t = SlotTable::default();
        let w = workers(&[(1, 2), (2, 2)]);
        assert_eq!(t.reserve("a", 2, &w).unwrap(), [1, 1]);
        assert_eq!(t.reserve("b", 2, &w).unwrap(), [2, 2]);
        assert_eq!(t.reserved(&w, &[]), 4);
        assert_eq!(t.reserved(&w, &["b".to_string()]), 2);
        let e = t.reserve("c", 1, &w).unwrap_err();
        assert_eq!(
            e,
            Shortage {
                needed: 1,
                available: 0,
                total: 4
            }
        );
        assert!(e.to_string().starts_with("not enough task slots"));
        assert!(t.release("a"));
        assert_eq!(t.reserve("c", 1, &w).unwrap(), [1]);
    }

    #[test]
    fn a_job_keeps_its_slots_on_live_workers_and_replaces_lost_ones() {
        let mut t = SlotTable::default();
        let w = workers(&[(1, 1), (2, 1)]);
        assert_eq!(t.reserve("a", 2, &w).unwrap(), [1, 2]);
        // Again (a restart): the same slots.
        assert_eq!(t.reserve("a", 2, &w).unwrap(), [1, 2]);
        // Worker 1 is lost, worker 3 joins: slot 1 stays on worker 2.
        let w = workers(&[(2, 1), (3, 1)]);
        assert_eq!(t.reserve("a", 2, &w).unwrap(), [3, 2]);
    }

    #[test]
    fn a_shortage_changes_nothing() {
        let mut t = SlotTable::default();
        let w = workers(&[(1, 3)]);
        assert_eq!(t.reserve("a", 2, &w).unwrap(), [1, 1]);
        let e = t.reserve("b", 2, &w).unwrap_err();
        assert_eq!(e.available, 1);
        assert_eq!(t.reserved(&w, &[]), 2);
        assert!(!t.release("b"));
    }
}
