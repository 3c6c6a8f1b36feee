//! Kinds of job, and the kinds refused within a pass: the next job of a refused kind
//! would be refused too (one of the planner's shortcuts, `Hybrid::shortcuts`).

use mmk_core::fasthash::FastMap;

use crate::plan::JobDemand;

use super::memo::{Memo, job_words};

/// Each job's kind, as a small number: jobs of one kind have the same [`job_words`] and
/// memory, which is all a waiting job's placement depends on besides the partitions, so
/// they get the same answer from the same partitions.
#[derive(Debug)]
pub(super) struct Kinds {
    of: Vec<usize>,
    count: usize,
    /// Each kind's number in the memo's `kind_ids`, the same from pass to pass.
    numbers: Vec<u32>,
    /// The memo's generation the numbers were given in.
    pub(super) generation: u64,
}

impl Kinds {
    /// The kinds of `jobs`, numbered in the memo's `kind_ids` too.
    pub(super) fn new(jobs: &[JobDemand], memo: &mut Memo) -> Kinds {
        let kind_ids = &mut memo.kind_ids;
        let mut ids: FastMap<Vec<u64>, usize> = FastMap::default();
        let mut numbers = Vec::new();
        let mut key = Vec::with_capacity(8);
        let of = (0..jobs.len())
            .map(|j| {
                key.clear();
                job_words(jobs, j, 0, &mut key);
                key.push(jobs[j].memory_mib);
                if let Some(&kind) = ids.get(key.as_slice()) {
                    return kind;
                }
                let kind = ids.len();
                numbers.push(Memo::number(kind_ids, &key));
                ids.insert(key.clone(), kind);
                kind
            })
            .collect();
        Kinds {
            of,
            count: ids.len(),
            numbers,
            generation: memo.generation,
        }
    }

    /// Job `j`'s kind, within this pass.
    pub(super) fn kind(&self, j: usize) -> usize {
        self.of[j]
    }

    /// Job `j`'s kind's number in the memo's `kind_ids`.
    pub(super) fn number(&self, j: usize) -> u32 {
        self.numbers[self.of[j]]
    }

    /// The kinds of `jobs`, each once, in the order they first come.
    pub(super) fn distinct(&self, jobs: &[usize]) -> Vec<usize> {
        let mut seen = vec![false; self.count];
        jobs.iter()
            .map(|&j| self.of[j])
            .filter(|&k| !std::mem::replace(&mut seen[k], true))
            .collect()
    }

    /// How many kinds the pass has.
    pub(super) fn count(&self) -> usize {
        self.count
    }

    /// Kind `k`'s number in the memo's `kind_ids`.
    pub(super) fn kind_number(&self, k: usize) -> u32 {
        self.numbers[k]
    }

    /// Nothing refused yet; `enabled: false` never skips a job.
    pub(super) fn none_refused(&self, enabled: bool) -> Refused<'_> {
        Refused {
            kinds: self,
            slo: vec![None; self.count],
            enabled,
        }
    }
}

/// The kinds of job refused since the last placement of a pass, each with whether an SLO
/// refused it: the next job of such a kind would be refused too.
pub(super) struct Refused<'k> {
    kinds: &'k Kinds,
    slo: Vec<Option<bool>>,
    enabled: bool,
}

impl Refused<'_> {
    /// Whether job `j`'s kind was refused; if so, `j` gets the same SLO mark.
    pub(super) fn skip(&self, j: usize, slo_blocked: &mut [bool]) -> bool {
        if !self.enabled {
            return false;
        }
        match self.slo[self.kinds.of[j]] {
            Some(slo) => {
                slo_blocked[j] |= slo;
                #[cfg(test)]
                super::tests::SKIPPED.set(super::tests::SKIPPED.get() + 1);
                true
            }
            None => false,
        }
    }

    pub(super) fn refuse(&mut self, j: usize, slo: bool) {
        self.slo[self.kinds.of[j]] = Some(slo);
    }

    /// A job was placed: the partitions changed, so any kind may fit again.
    pub(super) fn placed(&mut self) {
        self.slo.fill(None);
    }

    /// Per kind, whether it was refused since the last placement, and if so whether for
    /// an SLO.
    pub(super) fn marks(&self) -> &[Option<bool>] {
        &self.slo
    }
}
