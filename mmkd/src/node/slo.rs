//! The SLO control in the node: every tick, each partition with running online jobs gets
//! their requests' latencies from the sampler, its [`Control`] decides, and a change of
//! level is written into the partition's gate, recorded as an event of the online job
//! whose latency moved it, and counted in the metrics (docs/slo.md).

use std::collections::HashMap;
use std::time::Instant;

use mmk_core::{JobClass, JobState, now_ms};
use tracing::{info, warn};

use super::Node;
use crate::job::JobRecord;
use crate::slo::{Change, Control, Isolation, JobStatus, Objective, Observation, SloConfig};

/// What the node keeps for the SLO control.
#[derive(Debug, Default)]
pub(super) struct SloState {
    /// Running online jobs under control: their partition (gate key) and objective.
    jobs: HashMap<u64, (String, Objective)>,
    /// One control per partition with online jobs.
    controls: HashMap<String, Control>,
    /// Level changes per partition, for the metrics.
    changes: HashMap<String, Changes>,
    /// Running checkpointable offline jobs, and their partitions.
    movable: HashMap<u64, String>,
    /// Partitions at [`Isolation::Moved`]: the planner moves their checkpointable offline
    /// jobs elsewhere.
    leaving: std::collections::HashSet<String>,
}

/// How often a partition's level went up and down.
#[derive(Debug, Default, Clone, Copy)]
struct Changes {
    raised: u64,
    lowered: u64,
}

/// A partition's level now, for the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct PartitionIsolation {
    pub partition: String,
    pub level: Isolation,
    pub raised: u64,
    pub lowered: u64,
}

impl Node {
    fn slo_state(&self) -> std::sync::MutexGuard<'_, SloState> {
        self.inner
            .slo_state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Put a running online job under the SLO control (its run has started in the
    /// partition `key`). Nothing when the control is off or the job is offline.
    pub(super) fn control_slo(&self, job: &JobRecord, key: &str) {
        let Some(config) = self.inner.slo else {
            return;
        };
        if job.spec.class != JobClass::Online {
            if job.spec.checkpoint {
                self.slo_state().movable.insert(job.id, key.to_owned());
            }
            return;
        }
        let objective = Objective::of(
            job.spec.slo_ms,
            job.spec.slo_slowdown_pct,
            config.default_slowdown_pct,
        );
        self.slo_state()
            .jobs
            .insert(job.id, (key.to_owned(), objective));
    }

    /// A job's run ended: it leaves the SLO control's books.
    pub(super) fn slo_forget(&self, job: u64) {
        let mut state = self.slo_state();
        state.movable.remove(&job);
        state.jobs.remove(&job);
    }

    /// The partitions whose checkpointable offline jobs the planner is to move elsewhere.
    pub(super) fn leaving_partitions(&self) -> std::collections::HashSet<String> {
        self.slo_state().leaving.clone()
    }

    /// The SLO control's loop: one tick every [`crate::slo::Settings::tick`] until mmkd
    /// stops.
    pub(super) async fn keep_slos(self, config: SloConfig) {
        let mut every = tokio::time::interval(config.settings.tick);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let changes = self.slo_tick(&config);
            // Gate writes are file I/O: off the runtime, like the gates' making.
            let (node, changed) = (self.clone(), changes.clone());
            let _ = tokio::task::spawn_blocking(move || node.resync_isolation(&changed)).await;
            for (key, change) in changes {
                self.apply_isolation(&key, change).await;
            }
        }
    }

    /// Reads the latencies and asks each partition's control; returns the changes to make.
    fn slo_tick(&self, config: &SloConfig) -> Vec<(String, Change)> {
        let latencies = self.inner.sampler.latencies();
        let now = Instant::now();
        let device_wait = self.inner.runner.kernel_sched().device_wait_possible();
        let mut state = self.slo_state();
        // Jobs whose run ended (the sampler stopped watching them) leave the control.
        let SloState {
            jobs,
            controls,
            movable,
            ..
        } = &mut *state;
        jobs.retain(|id, _| latencies.contains_key(id));
        let mut by_partition: HashMap<&str, Vec<Observation<'_>>> = HashMap::new();
        for (id, (key, objective)) in jobs.iter() {
            let Some(l) = latencies.get(id) else { continue };
            by_partition.entry(key).or_default().push(Observation {
                job: *id,
                objective: *objective,
                hist: &l.hist,
                alone: &l.alone,
                offline_beside: l.offline_beside,
            });
        }
        let mut changes = Vec::new();
        // A partition without online jobs any more goes back to no isolation.
        controls.retain(|key, control| {
            let keep = by_partition.contains_key(key.as_str());
            if !keep && control.level() != Isolation::None {
                changes.push((
                    key.clone(),
                    Change {
                        from: control.level(),
                        to: Isolation::None,
                        job: None,
                        why: "no online job runs there any more".into(),
                    },
                ));
            }
            keep
        });
        for (key, observed) in by_partition {
            let control = controls
                .entry(key.to_owned())
                .or_insert_with(|| Control::new(config.settings, device_wait, now));
            control.set_movable(movable.values().any(|k| k == key));
            if let Some(change) = control.tick(now, &observed) {
                changes.push((key.to_owned(), change));
            }
        }
        // The partitions whose checkpointable offline jobs the planner moves elsewhere.
        state.leaving = state
            .controls
            .iter()
            .filter(|(_, c)| c.level() == Isolation::Moved)
            .map(|(k, _)| k.clone())
            .collect();
        changes
    }

    /// Writes again the level of each partition whose gate does not hold what its
    /// control decided (a write that failed, a gate made anew), and `none` where no
    /// control is left; no event, no count: the change was said when it was decided.
    fn resync_isolation(&self, changed: &[(String, Change)]) {
        let ksched = self.inner.runner.kernel_sched();
        let wanted: Vec<(String, Isolation)> = {
            let state = self.slo_state();
            let mut wanted: Vec<(String, Isolation)> = state
                .controls
                .iter()
                .map(|(k, c)| (k.clone(), c.level()))
                .collect();
            wanted.extend(
                ksched
                    .isolated()
                    .into_iter()
                    .filter(|(k, _)| !state.controls.contains_key(k))
                    .map(|(k, _)| (k, Isolation::None)),
            );
            wanted
        };
        for (key, level) in wanted {
            if changed.iter().any(|(k, _)| *k == key) || ksched.isolation(&key) == Some(level) {
                continue;
            }
            if let Err(e) = ksched.set_isolation(&key, level) {
                warn!(partition = key, error = %crate::error::chain(&e), "cannot write a partition's isolation");
            }
        }
    }

    /// Writes a partition's new level into its gate, and says so: an event of the job
    /// that moved it, a log line, the metrics.
    async fn apply_isolation(&self, key: &str, change: Change) {
        let (ksched, gate, level) = (
            self.inner.runner.kernel_sched().clone(),
            key.to_owned(),
            change.to,
        );
        let written = tokio::task::spawn_blocking(move || ksched.set_isolation(&gate, level))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| crate::error::chain(&e)));
        if let Err(e) = written {
            // The next tick writes it again.
            warn!(partition = key, error = %e, "cannot change a partition's isolation");
        }
        {
            let mut state = self.slo_state();
            let counts = state.changes.entry(key.to_owned()).or_default();
            if change.to > change.from {
                counts.raised += 1;
            } else {
                counts.lowered += 1;
            }
        }
        if change.to == Isolation::Moved {
            // The next pass moves the partition's checkpointable offline jobs elsewhere.
            self.inner.kick.notify_one();
        }
        let verb = if change.to > change.from {
            "raised"
        } else {
            "lowered"
        };
        info!(partition = key, from = %change.from, to = %change.to, why = %change.why, "isolation {verb}");
        let Some(job) = change.job else {
            return;
        };
        let reason = format!(
            "running; its partition's isolation {verb} to {}: {}",
            change.to, change.why
        );
        // Under the state lock, so that a run that ends meanwhile keeps its final reason.
        let _state = self.inner.state.lock().await;
        if !matches!(self.inner.store.get_job(job).await, Ok(j) if j.state == JobState::Running) {
            return;
        }
        let _emit = self.inner.emit.lock().await;
        match self.inner.store.note(job, &reason, now_ms()).await {
            Ok((j, ev)) => self.emit(ev.seq, ev.at, j),
            Err(e) => {
                warn!(job, error = %crate::error::chain(&e), "cannot record an isolation change")
            }
        }
    }

    /// What the SLO control sees of running online job `job`; `None` when it is not
    /// under control.
    pub fn slo_status(&self, job: u64) -> Option<JobStatus> {
        let state = self.slo_state();
        let (key, _) = state.jobs.get(&job)?;
        state.controls.get(key)?.status(job)
    }

    /// Every running online job's SLO status.
    pub fn slo_statuses(&self) -> Vec<(u64, JobStatus)> {
        let state = self.slo_state();
        state
            .jobs
            .iter()
            .filter_map(|(id, (key, _))| Some((*id, state.controls.get(key)?.status(*id)?)))
            .collect()
    }

    /// Each partition under control: its level and how often it changed.
    pub fn partition_isolation(&self) -> Vec<PartitionIsolation> {
        let state = self.slo_state();
        let mut keys: Vec<&String> = state.controls.keys().chain(state.changes.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.into_iter()
            .map(|key| {
                let counts = state.changes.get(key).copied().unwrap_or_default();
                PartitionIsolation {
                    partition: key.clone(),
                    level: state
                        .controls
                        .get(key)
                        .map_or(Isolation::None, Control::level),
                    raised: counts.raised,
                    lowered: counts.lowered,
                }
            })
            .collect()
    }
}
