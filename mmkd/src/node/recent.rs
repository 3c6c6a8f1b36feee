//! The jobs that ended in the last few minutes, in memory: what a metrics scrape needs of
//! them (their labels, state and queue wait), so that a scrape costs the same however many
//! jobs just ended, and reads nothing from the store. Fed by every event of an ended job;
//! seeded from the store at start. Slim records (no spec), and at most [`MAX_KEPT`]: a
//! user who submits and cancels jobs as fast as mmkd takes them cannot grow it.

use std::collections::BTreeMap;
use std::time::Duration;

use mmk_core::{JobClass, JobState};

use crate::job::{Assignment, JobRecord};

/// How long an ended job stays (its final counters stay scrapeable that long).
pub const KEPT_FOR: Duration = crate::learn::sampler::ENDED_KEPT;
/// The most ended jobs kept; past it the oldest go first.
pub const MAX_KEPT: usize = 5000;

/// What a job's metric series are made of.
#[derive(Debug, Clone, PartialEq)]
pub struct JobSeries {
    pub id: u64,
    pub name: String,
    pub class: JobClass,
    pub state: JobState,
    pub owner_uid: Option<u32>,
    pub assignment: Option<Assignment>,
    pub gpu_memory_mib: u64,
    pub submitted_at: i64,
    pub started_at: Option<i64>,
    /// When it ended (Unix ms); `None` while it runs.
    pub finished_at: Option<i64>,
}

impl From<&JobRecord> for JobSeries {
    fn from(j: &JobRecord) -> JobSeries {
        JobSeries {
            id: j.id,
            name: j.spec.name.clone(),
            class: j.spec.class,
            state: j.state,
            owner_uid: j.owner.map(|o| o.uid),
            assignment: j.assignment.clone(),
            gpu_memory_mib: j.spec.gpu_memory_mib,
            submitted_at: j.submitted_at,
            started_at: j.started_at,
            finished_at: j
                .state
                .is_terminal()
                .then(|| j.finished_at.unwrap_or(j.updated_at)),
        }
    }
}

/// The recently ended jobs, by ID.
#[derive(Debug, Default)]
pub struct RecentlyEnded {
    jobs: BTreeMap<u64, JobSeries>,
}

impl RecentlyEnded {
    /// Takes in a job's latest record: kept when it has ended, else left alone.
    pub fn seen(&mut self, job: &JobRecord, now_ms: i64) {
        if !job.state.is_terminal() {
            // A job that runs again is not an ended one.
            self.jobs.remove(&job.id);
            return;
        }
        self.jobs.insert(job.id, JobSeries::from(job));
        self.forget_old(now_ms);
    }

    /// The ended jobs kept now, oldest ID first.
    pub fn iter(&mut self, now_ms: i64) -> impl Iterator<Item = &JobSeries> {
        self.forget_old(now_ms);
        self.jobs.values()
    }

    /// The ended jobs kept now, oldest ID first.
    pub fn list(&mut self, now_ms: i64) -> Vec<JobSeries> {
        self.iter(now_ms).cloned().collect()
    }

    fn forget_old(&mut self, now_ms: i64) {
        let kept_ms = i64::try_from(KEPT_FOR.as_millis()).unwrap_or(i64::MAX);
        let since = now_ms.saturating_sub(kept_ms);
        self.jobs
            .retain(|_, j| j.finished_at.is_none_or(|at| at >= since));
        while self.jobs.len() > MAX_KEPT {
            // IDs grow with submission; the oldest submitted goes first.
            self.jobs.pop_first();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmk_core::spec::{RestartPolicy, Task, WorkloadSpec};

    fn job(id: u64, state: JobState, finished_at: Option<i64>) -> JobRecord {
        JobRecord {
            id,
            spec: mmk_core::JobSpec {
                name: format!("j{id}"),
                class: JobClass::Offline,
                gpu_memory_mib: 1024,
                slo_ms: None,
                slo_slowdown_pct: None,
                priority: 0,
                task: Task::Workload(WorkloadSpec {
                    name: "resnet50-train".into(),
                    batch_size: None,
                    duration_ms: None,
                }),
                checkpoint: false,
                restart_policy: RestartPolicy::Never,
                max_restarts: 0,
                exclusive: false,
                profile_key: None,
            },
            state,
            reason: String::new(),
            submitted_at: 0,
            started_at: None,
            finished_at,
            updated_at: finished_at.unwrap_or(0),
            assignment: None,
            exit_code: None,
            restarts: 0,
            moves: 0,
            pid: None,
            owner: None,
            ended_by: None,
        }
    }

    #[test]
    fn ended_jobs_stay_for_a_while_and_no_more_than_the_cap() {
        let mut r = RecentlyEnded::default();
        let minute = 60_000;
        r.seen(&job(1, JobState::Succeeded, Some(0)), 0);
        r.seen(&job(2, JobState::Running, None), 0);
        r.seen(&job(3, JobState::Failed, Some(4 * minute)), 4 * minute);
        assert_eq!(
            r.list(4 * minute).iter().map(|j| j.id).collect::<Vec<_>>(),
            [1, 3]
        );
        // Five minutes after its end job 1 is gone; a restarted job is not an ended one.
        r.seen(&job(3, JobState::Queued, None), 5 * minute + 1);
        assert!(r.list(5 * minute + 1).is_empty());
        let now = 6 * minute;
        for id in 10..(10 + MAX_KEPT as u64 + 5) {
            r.seen(&job(id, JobState::Cancelled, Some(now)), now);
        }
        let kept = r.list(now);
        assert_eq!(kept.len(), MAX_KEPT);
        assert_eq!(kept[0].id, 15, "the oldest went first");
    }
}
