//! Step 1, **the order waiting jobs are served in** (`HybridOptions::smallest_first`), and
//! the order the layout search packs them in (first-fit decreasing, whatever step 1's).

use std::borrow::Cow;
use std::cmp::Reverse;

use crate::plan::JobDemand;

use super::Hybrid;

impl Hybrid {
    /// The jobs that wait (not placed), in the order the steps serve them: by priority,
    /// then by [`Hybrid::queue_place`], then by ID.
    pub(super) fn served_order(&self, jobs: &[JobDemand]) -> Vec<usize> {
        // By key, then position: the order a stable sort by key gives, each key built once.
        let mut by: Vec<_> = (0..jobs.len())
            .filter(|&i| jobs[i].placed.is_none())
            .map(|i| {
                let j = &jobs[i];
                ((Reverse(j.priority), self.queue_place(j), j.id), i)
            })
            .collect();
        by.sort_unstable();
        by.into_iter().map(|(_, i)| i).collect()
    }

    /// A waiting job's place in step 1's order among jobs of its priority, lowest first
    /// (`HybridOptions::smallest_first`): with it, the jobs that have waited past
    /// `reserve_after`, oldest first, then the others by memory, smallest first; else by
    /// memory, largest first.
    fn queue_place(&self, j: &JobDemand) -> (bool, Reverse<u64>, i128) {
        let memory = i128::from(j.memory_mib);
        if !self.options.smallest_first {
            return (true, Reverse(0), -memory);
        }
        match self.options.reserve_after {
            // Milliseconds, so that a float's order becomes an integer's (the guard keeps
            // out an undefined or negative age; a huge one saturates).
            Some(after) if j.age_s >= after => (false, Reverse((j.age_s * 1e3) as u64), 0),
            _ => (true, Reverse(0), memory),
        }
    }

    /// `waiting` in the order the layout search packs them: by priority, then by memory,
    /// largest first (first-fit decreasing), also where step 1 serves the smallest first.
    pub(super) fn packing_order<'w>(
        &self,
        jobs: &[JobDemand],
        waiting: &'w [usize],
    ) -> Cow<'w, [usize]> {
        if !self.options.smallest_first {
            return Cow::Borrowed(waiting);
        }
        let mut order = waiting.to_vec();
        order.sort_by_key(|&j| {
            (
                Reverse(jobs[j].priority),
                Reverse(jobs[j].memory_mib),
                jobs[j].id,
            )
        });
        Cow::Owned(order)
    }
}
