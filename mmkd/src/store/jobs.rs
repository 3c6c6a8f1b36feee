//! Jobs: admission, queries, state transitions with their events, wait reasons.

use std::str::FromStr;

use mmk_core::{JobClass, JobSpec, JobState};
use mmk_partitioner::Slot;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::job::{Assignment, Change, EventRecord, JobRecord, Owner};

use super::{Result, Store, StoreError};

/// Jobs removed in one transaction by [`Store::prune_ended`].
const PRUNE_BATCH: usize = 500;

impl Store {
    /// Stores a new QUEUED job and its first event.
    pub async fn insert_job(
        &self,
        spec: &JobSpec,
        owner: Option<Owner>,
        now: i64,
    ) -> Result<(JobRecord, EventRecord)> {
        let (job, ev) = self.insert_job_once(spec, owner, None, now).await?;
        let ev = ev.ok_or(StoreError::Corrupt {
            id: job.id as i64,
            what: "a job without a request id was found stored already".into(),
        })?;
        Ok((job, ev))
    }

    /// Stores a new QUEUED job and its first event; with a `request_id` that `owner`
    /// already stored a job under, returns that job and no event instead.
    pub async fn insert_job_once(
        &self,
        spec: &JobSpec,
        owner: Option<Owner>,
        request_id: Option<&str>,
        now: i64,
    ) -> Result<(JobRecord, Option<EventRecord>)> {
        let spec_json = serde_json::to_string(spec).map_err(|e| StoreError::Corrupt {
            id: 0,
            what: e.to_string(),
        })?;
        let mut tx = self.write().await?;
        if let Some(rid) = request_id {
            let earlier: Option<i64> =
                sqlx::query_scalar("SELECT id FROM jobs WHERE owner_uid IS ? AND request_id = ?")
                    .bind(owner.map(|o| o.uid))
                    .bind(rid)
                    .fetch_optional(&mut *tx)
                    .await?;
            if let Some(id) = earlier {
                drop(tx);
                return Ok((self.get_job(id as u64).await?, None));
            }
        }
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO jobs (name, class, spec, state, reason, priority, gpu_memory_mib, submitted_at, updated_at, owner_uid, owner_gid, request_id) \
             VALUES (?, ?, ?, 'QUEUED', 'submitted', ?, ?, ?, ?, ?, ?, ?) RETURNING id",
        )
        .bind(&spec.name)
        .bind(spec.class.as_str())
        .bind(spec_json)
        .bind(spec.priority)
        .bind(i64::try_from(spec.gpu_memory_mib).unwrap_or(i64::MAX))
        .bind(now)
        .bind(now)
        .bind(owner.map(|o| o.uid))
        .bind(owner.map(|o| o.gid))
        .bind(request_id)
        .fetch_one(&mut *tx)
        .await?;
        let seq = insert_event(&mut tx, id, JobState::Queued, "submitted", now).await?;
        tx.commit().await?;
        let id = id as u64;
        let job = self.get_job(id).await?;
        Ok((
            job,
            Some(EventRecord {
                seq,
                job_id: id,
                state: JobState::Queued,
                reason: "submitted".into(),
                at: now,
            }),
        ))
    }

    pub async fn get_job(&self, id: u64) -> Result<JobRecord> {
        let row = sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE id = ?"
        ))
        .bind(i64::try_from(id).unwrap_or(-1))
        .fetch_optional(&self.pool)
        .await?
        .ok_or(StoreError::NotFound(id))?;
        job_from_row(&row)
    }

    /// Jobs in submission order, optionally only those in `states` and of `class`.
    pub async fn list_jobs(
        &self,
        states: &[JobState],
        class: Option<JobClass>,
    ) -> Result<Vec<JobRecord>> {
        // ?1: a JSON array of states, or '' for every state; ?2: a class, or NULL.
        let states_json = states_filter(states);
        sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE (?1 = '' OR state IN (SELECT value FROM json_each(?1))) \
             AND (?2 IS NULL OR class = ?2) ORDER BY id"
        ))
        .bind(states_json)
        .bind(class.map(JobClass::as_str))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(job_from_row)
        .collect()
    }

    /// The jobs that ended at `since_ms` or later, in submission order.
    pub async fn list_jobs_ended_since(&self, since_ms: i64) -> Result<Vec<JobRecord>> {
        sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE finished_at >= ? ORDER BY id"
        ))
        .bind(since_ms)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(job_from_row)
        .collect()
    }

    /// Removes the ended jobs (their rows and events) that ended before `before_ms`, but
    /// for the `keep` newest of each user; returns how many. In transactions of
    /// [`PRUNE_BATCH`] jobs, so that submits and state changes wait for none long.
    pub async fn prune_ended(&self, before_ms: i64, keep: u32) -> Result<u64> {
        let ids: Vec<i64> = sqlx::query_scalar(
            "SELECT id FROM ( \
               SELECT id, COALESCE(finished_at, updated_at) AS ended, \
                 ROW_NUMBER() OVER (PARTITION BY owner_uid ORDER BY id DESC) AS newest \
               FROM jobs WHERE state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')) \
             WHERE newest > ? AND ended < ? ORDER BY id",
        )
        .bind(i64::from(keep))
        .bind(before_ms)
        .fetch_all(&self.pool)
        .await?;
        let mut removed = 0;
        for batch in ids.chunks(PRUNE_BATCH) {
            let list = serde_json::to_string(batch).unwrap_or_else(|_| "[]".into());
            let mut tx = self.write().await?;
            sqlx::query("DELETE FROM job_events WHERE job_id IN (SELECT value FROM json_each(?))")
                .bind(&list)
                .execute(&mut *tx)
                .await?;
            // Only jobs still ended (none can start again, but the check costs nothing).
            let done = sqlx::query(
                "DELETE FROM jobs WHERE id IN (SELECT value FROM json_each(?)) \
                 AND state IN ('SUCCEEDED', 'FAILED', 'CANCELLED')",
            )
            .bind(&list)
            .execute(&mut *tx)
            .await?;
            tx.commit().await?;
            removed += done.rows_affected();
        }
        Ok(removed)
    }

    /// At most `limit` jobs with ids above `after`, in submission order, optionally only
    /// those in `states` and of `class`.
    pub async fn list_jobs_page(
        &self,
        states: &[JobState],
        class: Option<JobClass>,
        after: u64,
        limit: u32,
    ) -> Result<Vec<JobRecord>> {
        sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE (?1 = '' OR state IN (SELECT value FROM json_each(?1))) \
             AND (?2 IS NULL OR class = ?2) AND id > ?3 ORDER BY id LIMIT ?4"
        ))
        .bind(states_filter(states))
        .bind(class.map(JobClass::as_str))
        .bind(i64::try_from(after).unwrap_or(i64::MAX))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(job_from_row)
        .collect()
    }

    /// [`Store::list_jobs_page`] of every state and class, each job with the sequence
    /// number of its latest event (0 for none): what a watch's snapshot is read from, so
    /// that it can skip the events the snapshot already holds.
    pub async fn list_jobs_page_with_seq(
        &self,
        after: u64,
        limit: u32,
    ) -> Result<Vec<(JobRecord, u64)>> {
        sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            ", (SELECT MAX(seq) FROM job_events WHERE job_events.job_id = jobs.id) AS last_seq \
             FROM jobs WHERE id > ?1 ORDER BY id LIMIT ?2"
        ))
        .bind(i64::try_from(after).unwrap_or(i64::MAX))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(|row| {
            let seq: Option<i64> = row.try_get("last_seq")?;
            Ok((
                job_from_row(row)?,
                seq.map_or(0, |s| u64::try_from(s).unwrap_or(0)),
            ))
        })
        .collect()
    }

    /// Moves a job to `to`, checking the state machine, and records the event.
    pub async fn transition(
        &self,
        id: u64,
        to: JobState,
        reason: &str,
        change: Change,
        now: i64,
    ) -> Result<(JobRecord, EventRecord)> {
        let mut tx = self.write().await?;
        let sid = i64::try_from(id).unwrap_or(-1);
        let state: Option<String> = sqlx::query_scalar("SELECT state FROM jobs WHERE id = ?")
            .bind(sid)
            .fetch_optional(&mut *tx)
            .await?;
        let from = state
            .ok_or(StoreError::NotFound(id))
            .and_then(|s| parse_state(sid, &s))?;
        if !from.can_become(to) {
            return Err(StoreError::BadTransition { id, from, to });
        }
        sqlx::query("UPDATE jobs SET state = ?, reason = ?, updated_at = ? WHERE id = ?")
            .bind(to.as_str())
            .bind(reason)
            .bind(now)
            .bind(sid)
            .execute(&mut *tx)
            .await?;
        if to == JobState::Starting {
            sqlx::query(
                "UPDATE jobs SET exit_code = NULL, pid = NULL, finished_at = NULL WHERE id = ?",
            )
            .bind(sid)
            .execute(&mut *tx)
            .await?;
        }
        if to == JobState::Running {
            sqlx::query("UPDATE jobs SET started_at = ? WHERE id = ?")
                .bind(now)
                .bind(sid)
                .execute(&mut *tx)
                .await?;
        }
        if to.is_terminal() {
            sqlx::query("UPDATE jobs SET finished_at = ? WHERE id = ?")
                .bind(now)
                .bind(sid)
                .execute(&mut *tx)
                .await?;
        }
        if let Some(a) = &change.assignment {
            sqlx::query(
                "UPDATE jobs SET gpu_index = ?, gpu_uuid = ?, slot_start = ?, slot_profile = ?, \
                 profile = ?, instance_id = ?, device_uuid = ?, mps_share = ? WHERE id = ?",
            )
            .bind(a.slot.gpu)
            .bind(&a.gpu_uuid)
            .bind(a.slot.start)
            .bind(a.slot.profile_id)
            .bind(&a.profile)
            .bind(a.instance_id)
            .bind(&a.device_uuid)
            .bind(a.mps_share)
            .bind(sid)
            .execute(&mut *tx)
            .await?;
        }
        if let Some(code) = change.exit_code {
            sqlx::query("UPDATE jobs SET exit_code = ? WHERE id = ?")
                .bind(code)
                .bind(sid)
                .execute(&mut *tx)
                .await?;
        }
        if let Some(uid) = change.ended_by {
            sqlx::query("UPDATE jobs SET ended_by_uid = ? WHERE id = ?")
                .bind(uid)
                .bind(sid)
                .execute(&mut *tx)
                .await?;
        }
        if let Some(pid) = change.pid {
            sqlx::query("UPDATE jobs SET pid = ? WHERE id = ?")
                .bind(pid)
                .bind(sid)
                .execute(&mut *tx)
                .await?;
        }
        if change.restart || change.moved {
            sqlx::query("UPDATE jobs SET restarts = restarts + 1 WHERE id = ?")
                .bind(sid)
                .execute(&mut *tx)
                .await?;
        }
        if change.moved {
            sqlx::query("UPDATE jobs SET moves = moves + 1 WHERE id = ?")
                .bind(sid)
                .execute(&mut *tx)
                .await?;
        }
        self.commit_event(tx, id, to, reason, now).await
    }

    /// Records something that happened to a job without changing its state (an MPS
    /// daemon of its partition died and was restarted, ...): the reason and an event.
    pub async fn note(&self, id: u64, reason: &str, now: i64) -> Result<(JobRecord, EventRecord)> {
        let mut tx = self.write().await?;
        let sid = i64::try_from(id).unwrap_or(-1);
        let state: Option<String> = sqlx::query_scalar("SELECT state FROM jobs WHERE id = ?")
            .bind(sid)
            .fetch_optional(&mut *tx)
            .await?;
        let state = state
            .ok_or(StoreError::NotFound(id))
            .and_then(|s| parse_state(sid, &s))?;
        sqlx::query("UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ?")
            .bind(reason)
            .bind(now)
            .bind(sid)
            .execute(&mut *tx)
            .await?;
        self.commit_event(tx, id, state, reason, now).await
    }

    /// Appends the event of a change made in `tx`, commits, and returns the job as it is
    /// now with its event.
    async fn commit_event(
        &self,
        mut tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        id: u64,
        state: JobState,
        reason: &str,
        now: i64,
    ) -> Result<(JobRecord, EventRecord)> {
        let sid = i64::try_from(id).unwrap_or(-1);
        let seq = insert_event(&mut tx, sid, state, reason, now).await?;
        tx.commit().await?;
        let job = self.get_job(id).await?;
        Ok((
            job,
            EventRecord {
                seq,
                job_id: id,
                state,
                reason: reason.to_owned(),
                at: now,
            },
        ))
    }

    /// Updates why a queued job waits (no event: the state did not change); a job that is no
    /// longer queued (a cancel came in since the pass read it) keeps its reason.
    pub async fn set_reason(&self, id: u64, reason: &str, now: i64) -> Result<()> {
        sqlx::query("UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ? AND reason <> ? AND state = 'QUEUED'")
            .bind(reason)
            .bind(now)
            .bind(i64::try_from(id).unwrap_or(-1))
            .bind(reason)
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    /// Sets the reasons of several jobs in one transaction (those whose reason changed).
    pub async fn set_reasons(&self, reasons: &[(u64, String)], now: i64) -> Result<()> {
        if reasons.is_empty() {
            return Ok(());
        }
        let mut tx = self.write().await?;
        for (id, reason) in reasons {
            sqlx::query("UPDATE jobs SET reason = ?, updated_at = ? WHERE id = ? AND reason <> ? AND state = 'QUEUED'")
                .bind(reason)
                .bind(now)
                .bind(i64::try_from(*id).unwrap_or(-1))
                .bind(reason)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// The events of one job, oldest first.
    pub async fn job_events(&self, id: u64) -> Result<Vec<EventRecord>> {
        let rows = sqlx::query(
            "SELECT seq, job_id, state, reason, at FROM job_events WHERE job_id = ? ORDER BY seq",
        )
        .bind(i64::try_from(id).unwrap_or(-1))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let job_id: i64 = r.try_get("job_id")?;
                Ok(EventRecord {
                    seq: r.try_get::<i64, _>("seq")? as u64,
                    job_id: job_id as u64,
                    state: parse_state(job_id, &r.try_get::<String, _>("state")?)?,
                    reason: r.try_get("reason")?,
                    at: r.try_get("at")?,
                })
            })
            .collect()
    }

    /// How many jobs are in each state (states without jobs are left out).
    pub async fn count_by_state(&self) -> Result<Vec<(JobState, u64)>> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                let state: String = r.try_get("state")?;
                let n: i64 = r.try_get("n")?;
                Ok((parse_state(0, &state)?, u64::try_from(n).unwrap_or(0)))
            })
            .collect()
    }
}

pub(super) async fn insert_event(
    tx: &mut sqlx::Transaction<'_, sqlx::Sqlite>,
    job_id: i64,
    state: JobState,
    reason: &str,
    at: i64,
) -> Result<u64> {
    let seq: i64 = sqlx::query_scalar(
        "INSERT INTO job_events (job_id, state, reason, at) VALUES (?, ?, ?, ?) RETURNING seq",
    )
    .bind(job_id)
    .bind(state.as_str())
    .bind(reason)
    .bind(at)
    .fetch_one(&mut **tx)
    .await?;
    Ok(seq as u64)
}

pub(super) fn parse_state(id: i64, s: &str) -> Result<JobState> {
    JobState::from_str(s).map_err(|what| StoreError::Corrupt { id, what })
}

pub(super) fn job_from_row(r: &SqliteRow) -> Result<JobRecord> {
    let id: i64 = r.try_get("id")?;
    let spec_json: String = r.try_get("spec")?;
    let spec: JobSpec = serde_json::from_str(&spec_json).map_err(|e| StoreError::Corrupt {
        id,
        what: format!("spec: {e}"),
    })?;
    let state = parse_state(id, &r.try_get::<String, _>("state")?)?;
    let gpu_index: Option<u32> = r.try_get("gpu_index")?;
    let assignment = match gpu_index {
        Some(gpu) => Some(Assignment {
            slot: Slot {
                gpu,
                start: r.try_get::<Option<u8>, _>("slot_start")?.unwrap_or(0),
                profile_id: r.try_get("slot_profile")?,
            },
            gpu_uuid: r
                .try_get::<Option<String>, _>("gpu_uuid")?
                .unwrap_or_default(),
            instance_id: r.try_get::<Option<u32>, _>("instance_id")?.unwrap_or(0),
            device_uuid: r
                .try_get::<Option<String>, _>("device_uuid")?
                .unwrap_or_default(),
            profile: r
                .try_get::<Option<String>, _>("profile")?
                .unwrap_or_default(),
            mps_share: r.try_get::<Option<u8>, _>("mps_share")?.unwrap_or(100),
        }),
        None => None,
    };
    Ok(JobRecord {
        id: id as u64,
        spec,
        state,
        reason: r.try_get("reason")?,
        submitted_at: r.try_get("submitted_at")?,
        started_at: r.try_get("started_at")?,
        finished_at: r.try_get("finished_at")?,
        updated_at: r.try_get("updated_at")?,
        assignment,
        exit_code: r.try_get("exit_code")?,
        restarts: r.try_get::<i64, _>("restarts")? as u32,
        moves: r.try_get::<i64, _>("moves")? as u32,
        owner: match (
            r.try_get::<Option<u32>, _>("owner_uid")?,
            r.try_get::<Option<u32>, _>("owner_gid")?,
        ) {
            (Some(uid), Some(gid)) => Some(Owner { uid, gid }),
            _ => None,
        },
        pid: r.try_get("pid")?,
        ended_by: r.try_get("ended_by_uid")?,
    })
}

/// A JSON array of `states` for `json_each`, or '' for every state.
pub(super) fn states_filter(states: &[JobState]) -> String {
    if states.is_empty() {
        return String::new();
    }
    let list: Vec<String> = states
        .iter()
        .map(|s| format!("\"{}\"", s.as_str()))
        .collect();
    format!("[{}]", list.join(","))
}
