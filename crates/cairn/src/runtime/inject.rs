//! Deliberate failures (`--inject-failures N --seed S`): N failures in tasks chosen from the
//! seed, each at the first batch its task processes once the job's sources have read a number
//! of records chosen from the seed (so every planned failure has a point to fire at, whatever
//! the share of records the chosen task sees). Each fires once per job run, whatever the number of
//! restarts, and at most one fires per attempt, so the run exercises recovery exactly N times.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::error::{TaskError, TaskResult};

struct Planned {
    vertex: usize,
    record: u64,
    fired: AtomicBool,
}

/// The failures planned for a run.
pub struct FailureInjector {
    planned: Vec<Planned>,
    vertices: usize,
    /// Attempt number + 1 of the attempt that already had its failure (0: none yet).
    failed_attempt: AtomicU32,
}

impl FailureInjector {
    /// Plans `count` failures over `vertices` task vertices, at source progress in the first
    /// 90 % of `1..=expected_records` (records read by all sources, replays included).
    pub fn new(count: usize, seed: u64, vertices: usize, expected_records: u64) -> Self {
        Self::among(
            (0..vertices.max(1)).collect(),
            count,
            seed,
            expected_records,
        )
    }

    /// Like [`FailureInjector::new`], choosing only among the `candidates` vertices.
    pub fn among(candidates: Vec<usize>, count: usize, seed: u64, expected_records: u64) -> Self {
        let mut rng = fastrand::Rng::with_seed(seed);
        let candidates = if candidates.is_empty() {
            vec![0]
        } else {
            candidates
        };
        let vertices = candidates.iter().max().map_or(1, |m| m + 1);
        let planned = (0..count)
            .map(|_| Planned {
                vertex: candidates[rng.usize(0..candidates.len())],
                record: rng.u64(1..=(expected_records / 10 * 9).max(1)),
                fired: AtomicBool::new(false),
            })
            .collect();
        FailureInjector {
            planned,
            vertices,
            failed_attempt: AtomicU32::new(0),
        }
    }

    /// `vertex` processed a batch while the sources' progress is `progress` records; fails if a
    /// planned failure of this vertex is due.
    pub fn check(&self, attempt: u32, vertex: usize, uid: &str, progress: u64) -> TaskResult {
        if vertex >= self.vertices {
            return Ok(());
        }
        if self.failed_attempt.load(Ordering::Acquire) == attempt + 1 {
            return Ok(());
        }
        let after = progress;
        for (index, p) in self.planned.iter().enumerate() {
            // `<= after`, not a window: two failures planned within one batch fire in turn.
            if p.vertex == vertex
                && p.record <= after
                && p.fired
                    .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
            {
                self.failed_attempt.store(attempt + 1, Ordering::Release);
                return Err(TaskError::Injected {
                    index: index + 1,
                    record: p.record,
                    uid: uid.to_string(),
                });
            }
        }
        Ok(())
    }

    /// How many planned failures fired so far.
    pub fn fired(&self) -> usize {
        self.planned
            .iter()
            .filter(|p| p.fired.load(Ordering::Acquire))
            .count()
    }

    /// How many failures were planned.
    pub fn planned(&self) -> usize {
        self.planned.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_planned_failure_fires_once() {
        let inj = FailureInjector::new(5, 42, 2, 1000);
        let mut failures = 0;
        let mut progress = 0;
        for attempt in 0..10 {
            for _ in 0..100 {
                progress += 10;
                for v in 0..2 {
                    if inj.check(attempt, v, "op", progress).is_err() {
                        failures += 1;
                    }
                }
            }
        }
        assert_eq!(failures, 5);
        assert_eq!(inj.fired(), 5);
    }
}
