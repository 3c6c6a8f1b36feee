//! The disk guard: the jobs' folders under their cap, the store's reserve, and ended jobs'
//! folders removed after the retention (see [`crate::disk`] for the rules).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use mmk_core::spec::Task;
use mmk_core::{JobState, ServiceError, ServiceResult, now_ms};
use tracing::{error, info, warn};

use super::Node;
use crate::disk::{HIGH_WATER, LOW_WATER, Policy, Reserve, Usage, bytes_text};

/// How often the free space and the running jobs' folders are looked at.
const CHECK_EVERY: Duration = Duration::from_secs(2);
fn disk_retention(node: &Node) -> Duration {
    node.inner
        .disk
        .as_ref()
        .map_or(SWEEP_EVERY, |d| d.config.policy.retention)
}

/// How often ended jobs' folders are looked for (or the retention, when shorter).
const SWEEP_EVERY: Duration = Duration::from_secs(60);
/// A job that takes less is not the one that filled the disk.
const BLAME_AT_LEAST: u64 = 1 << 20;

/// Where the disk guard looks, and what it keeps.
#[derive(Debug, Clone)]
pub struct DiskConfig {
    pub data_dir: PathBuf,
    pub policy: Policy,
}

#[derive(Debug)]
pub(super) struct DiskState {
    config: DiskConfig,
    reserve: Reserve,
    /// Less than [`LOW_WATER`] was free at the last look, and not yet [`HIGH_WATER`] since.
    full: AtomicBool,
    /// Jobs the guard is stopping (so that it stops each once).
    stopping: Mutex<HashSet<u64>>,
}

impl DiskState {
    pub(super) fn new(config: DiskConfig) -> DiskState {
        let reserve = Reserve::new(&config.data_dir);
        // Started on a full disk: new jobs wait for room from the first request on, and the
        // reserve is taken once there is.
        let full = crate::disk::space(&config.data_dir).is_ok_and(|(free, _)| free < LOW_WATER);
        if !full && let Err(e) = reserve.take() {
            warn!(path = %reserve.path().display(), error = %e, "cannot take the disk reserve; taking it once there is room");
        }
        DiskState {
            config,
            reserve,
            full: AtomicBool::new(full),
            stopping: Mutex::default(),
        }
    }
}

impl Node {
    /// RESOURCE_EXHAUSTED while the data dir's disk is full: a new job would write the
    /// space the store keeps for the jobs already there to end.
    pub(super) fn check_room(&self) -> ServiceResult<()> {
        match &self.inner.disk {
            Some(d) if d.full.load(Ordering::Acquire) => {
                Err(ServiceError::ResourceExhausted(format!(
                    "the node's disk is full (under {} free where mmkd keeps its store and the \
                     jobs' folders): no new jobs until {} is free",
                    bytes_text(LOW_WATER),
                    bytes_text(HIGH_WATER)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Runs the disk guard until mmkd stops.
    pub(super) async fn guard_disk(self) {
        if self.inner.disk.is_none() {
            return;
        }
        let mut tick = tokio::time::interval(CHECK_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut swept: Option<Instant> = None;
        loop {
            tick.tick().await;
            if let Err(e) = self.check_disk().await {
                warn!(error = %e, "disk guard: cannot look at the jobs");
            }
            let sweep_every = disk_retention(&self).clamp(CHECK_EVERY, SWEEP_EVERY);
            if swept.is_none_or(|t| t.elapsed() >= sweep_every) {
                if let Err(e) = self.sweep_ended().await {
                    warn!(error = %e, "disk guard: cannot look for ended jobs' folders");
                }
                swept = Some(Instant::now());
            }
        }
    }

    /// One look: each running command job's folder against its cap; the free space against
    /// the water marks.
    async fn check_disk(&self) -> ServiceResult<()> {
        let Some(disk) = &self.inner.disk else {
            return Ok(());
        };
        let running: Vec<u64> = self
            .list(&[JobState::Running], None)
            .await?
            .into_iter()
            .filter(|j| matches!(j.spec.task, Task::Command(_)))
            .map(|j| j.id)
            .collect();
        let dirs: Vec<(u64, PathBuf)> = running
            .iter()
            .map(|&id| (id, self.inner.runner.log_dir(id)))
            .collect();
        let data_dir = disk.config.data_dir.clone();
        let (free, sizes) = tokio::task::spawn_blocking(move || {
            let sizes: Vec<(u64, Usage)> = dirs
                .iter()
                .filter_map(|(id, dir)| crate::disk::usage(dir).ok().map(|u| (*id, u)))
                .collect();
            (crate::disk::space(&data_dir).map(|(free, _)| free), sizes)
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("disk guard: {e}")))?;
        let cap = disk.config.policy.job_disk_max;
        for (id, u) in &sizes {
            if u.bytes > cap {
                let more = if u.complete { "" } else { " or more" };
                self.stop_for_disk(
                    *id,
                    format!(
                        "its folder (work/ and logs) took {}{more} of disk, over the cap of {} \
                         (mmkd --job-disk-max)",
                        bytes_text(u.bytes),
                        bytes_text(cap)
                    ),
                    false,
                );
            }
        }
        let free = match free {
            Ok(f) => f,
            Err(e) => {
                warn!(error = %e, dir = %disk.config.data_dir.display(), "disk guard: cannot read the free space");
                return Ok(());
            }
        };
        if free < LOW_WATER {
            if !disk.full.swap(true, Ordering::AcqRel) {
                error!(
                    free = %bytes_text(free),
                    dir = %disk.config.data_dir.display(),
                    "the data dir's disk is full: the reserve is let go for the store, new jobs are refused, and the job that takes the most is stopped"
                );
            }
            if let Err(e) = disk.reserve.release() {
                warn!(error = %e, "cannot let the disk reserve go");
            }
            let biggest = sizes
                .iter()
                .filter(|(_, u)| u.bytes >= BLAME_AT_LEAST)
                .max_by_key(|(_, u)| u.bytes);
            match biggest {
                Some((id, u)) => self.stop_for_disk(
                    *id,
                    format!(
                        "the disk where mmkd keeps its store and the jobs' folders was full, and \
                         this job's folder took the most of it ({}): it was stopped and its work/ \
                         removed",
                        bytes_text(u.bytes)
                    ),
                    true,
                ),
                // What fills the disk is an ended job's: its retention ends early.
                None => self.free_an_ended_job(&running).await,
            }
        } else if free >= HIGH_WATER {
            if disk.full.swap(false, Ordering::AcqRel) {
                info!(free = %bytes_text(free), "the data dir's disk has room again: new jobs come in");
            }
            if !disk.reserve.held()
                && let Err(e) = disk.reserve.take()
            {
                warn!(error = %e, "cannot take the disk reserve");
            }
        }
        Ok(())
    }

    /// Stops job `id` (once), recording it FAILED with `reason`; `remove_work`: its work/
    /// is removed once its processes are gone (what filled the disk).
    fn stop_for_disk(&self, id: u64, reason: String, remove_work: bool) {
        let Some(disk) = &self.inner.disk else {
            return;
        };
        if !disk
            .stopping
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id)
        {
            return;
        }
        warn!(job = id, reason, "stopping a job for its disk use");
        let node = self.clone();
        tokio::spawn(async move {
            if let Err(e) = node.fail_job(id, reason).await {
                warn!(job = id, error = %e, "cannot stop a job for its disk use");
            }
            if remove_work {
                let work = node.inner.runner.log_dir(id).join(crate::joblog::WORK_DIR);
                // std's remove_dir_all never follows a link inside the folder.
                let removed =
                    tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&work)).await;
                if let Ok(Err(e)) = removed
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    warn!(job = id, error = %e, "cannot remove a job's work folder");
                }
            }
            if let Some(disk) = &node.inner.disk {
                disk.stopping
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&id);
            }
        });
    }

    /// On a full disk that no running job fills: removes the work/ of the job (none of
    /// `running`) whose folder takes the most, and notes it in the job's reason.
    async fn free_an_ended_job(&self, running: &[u64]) {
        let jobs_dir = self.inner.runner.jobs_dir().to_owned();
        let running: HashSet<u64> = running.iter().copied().collect();
        let found = tokio::task::spawn_blocking(move || {
            let entries = std::fs::read_dir(&jobs_dir).ok()?;
            entries
                .flatten()
                .filter_map(|e| e.file_name().to_str()?.parse::<u64>().ok())
                .filter(|id| !running.contains(id))
                .filter_map(|id| {
                    let work = jobs_dir.join(id.to_string()).join(crate::joblog::WORK_DIR);
                    let u = crate::disk::usage(&work).ok()?;
                    (u.bytes >= BLAME_AT_LEAST).then_some((id, work, u.bytes))
                })
                .max_by_key(|(_, _, bytes)| *bytes)
        })
        .await
        .ok()
        .flatten();
        let Some((id, work, bytes)) = found else {
            return;
        };
        let before = match self.get(id).await {
            Ok(j) if j.state.is_terminal() => j.reason,
            _ => return, // started meanwhile, or gone
        };
        let removed = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&work)).await;
        if !matches!(removed, Ok(Ok(()))) {
            warn!(job = id, "cannot remove an ended job's work folder");
            return;
        }
        let reason = format!(
            "{before}; its work/ ({}) was removed before its retention ended: the disk where \
             mmkd keeps its store and the jobs' folders was full",
            bytes_text(bytes)
        );
        warn!(job = id, %reason, "removed an ended job's work folder");
        let _emit = self.inner.emit.lock().await;
        match self.inner.store.note(id, &reason, now_ms()).await {
            Ok((j, ev)) => self.emit(ev.seq, ev.at, j),
            Err(e) => warn!(job = id, error = %e, "cannot record a removed work folder"),
        }
    }

    /// Removes the folders of jobs that ended longer than the retention ago.
    async fn sweep_ended(&self) -> ServiceResult<()> {
        let Some(disk) = &self.inner.disk else {
            return Ok(());
        };
        let jobs_dir = self.inner.runner.jobs_dir().to_owned();
        let ids: Vec<u64> = {
            let dir = jobs_dir.clone();
            tokio::task::spawn_blocking(move || {
                std::fs::read_dir(&dir)
                    .map(|entries| {
                        entries
                            .flatten()
                            .filter_map(|e| e.file_name().to_str()?.parse().ok())
                            .collect()
                    })
                    .unwrap_or_default()
            })
            .await
            .map_err(|e| ServiceError::Internal(format!("disk guard: {e}")))?
        };
        let keep_ms = i64::try_from(disk.config.policy.retention.as_millis()).unwrap_or(i64::MAX);
        let now = now_ms();
        let mut old = Vec::new();
        for id in ids {
            let ended = match self.get(id).await {
                Ok(j) if j.state.is_terminal() => j.finished_at.unwrap_or(j.updated_at),
                Ok(_) => continue,
                // No job of that number (a store made anew): nothing to keep it for.
                Err(ServiceError::NotFound { .. }) => i64::MIN,
                Err(e) => return Err(e),
            };
            if now.saturating_sub(ended) >= keep_ms {
                old.push(id);
            }
        }
        if old.is_empty() {
            return Ok(());
        }
        let removed = old.len();
        tokio::task::spawn_blocking(move || {
            for id in old {
                let dir = jobs_dir.join(id.to_string());
                if let Err(e) = std::fs::remove_dir_all(&dir)
                    && e.kind() != std::io::ErrorKind::NotFound
                {
                    warn!(job = id, error = %e, "cannot remove an ended job's folder");
                }
            }
        })
        .await
        .map_err(|e| ServiceError::Internal(format!("disk guard: {e}")))?;
        info!(
            jobs = removed,
            "removed ended jobs' folders past the retention"
        );
        Ok(())
    }
}
