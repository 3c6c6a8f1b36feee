//! The node store: jobs, their state transitions and the GPU instance layout, in SQLite
//! through sqlx. Every query of the daemon lives here.
//!
//! A state change and its event row are written in one transaction, so a crash never
//! leaves a job in a state without the event that explains it.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use mmk_core::{JobClass, JobSpec, JobState, ServiceError};
use mmk_partitioner::{Instance, Placement, Slot};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteRow, SqliteSynchronous,
};
use sqlx::{Connection, Row, SqliteConnection, SqlitePool};
use thiserror::Error;

use crate::job::{Assignment, Change, EventRecord, InstanceRecord, JobRecord, Owner, StepRecord};
use crate::learn::{Learned, Observed};

#[derive(Debug, Error)]
pub enum StoreError {
    #[error("cannot open the node store at {path}")]
    Open {
        path: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("the node store {path} is empty (0 bytes); move it away to start with a new store")]
    Empty { path: String },
    #[error("node store file {path}: {op}")]
    File {
        path: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot apply the node store's migrations")]
    Migrate(#[source] sqlx::migrate::MigrateError),
    #[error("node store query failed")]
    Query(#[from] sqlx::Error),
    #[error("job {id} in the store is unreadable: {what}")]
    Corrupt { id: i64, what: String },
    #[error("job {0} not found")]
    NotFound(u64),
    #[error("job {id} is {from}; it cannot become {to}")]
    BadTransition {
        id: u64,
        from: JobState,
        to: JobState,
    },
}

impl StoreError {
    /// Whether the store failed for lack of space (SQLITE_FULL, or ENOSPC underneath):
    /// nothing was stored, and the same request can succeed once space returns.
    pub fn is_full(&self) -> bool {
        match self {
            StoreError::Query(sqlx::Error::Database(db)) => {
                // SQLite's primary result code is the low byte of an extended one.
                db.code()
                    .and_then(|c| c.parse::<i32>().ok())
                    .is_some_and(|c| c & 0xff == 13)
            }
            StoreError::Query(sqlx::Error::Io(e)) | StoreError::File { source: e, .. } => {
                e.kind() == std::io::ErrorKind::StorageFull
            }
            _ => false,
        }
    }
}

/// A store error as a client sees it: the one place where it is mapped, logging internals
/// here (and only here) so that the client's message holds none.
impl From<StoreError> for ServiceError {
    fn from(e: StoreError) -> ServiceError {
        match e {
            StoreError::NotFound(id) => ServiceError::NotFound {
                what: "job",
                id: id.to_string(),
            },
            StoreError::BadTransition { id, from, to } => ServiceError::FailedPrecondition(
                format!("job {id} is {from}; it cannot become {to}"),
            ),
            full if full.is_full() => {
                tracing::error!(error = %full, source = ?std::error::Error::source(&full), "node store: no space left");
                ServiceError::ResourceExhausted(
                    "the node's disk is full: nothing was stored; try again once space is freed"
                        .into(),
                )
            }
            other => {
                tracing::error!(error = %other, source = ?std::error::Error::source(&other), "node store error");
                ServiceError::Internal("the node store failed; see mmkd's log".into())
            }
        }
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

#[derive(Debug, Clone)]
pub struct Store {
    pool: SqlitePool,
}

/// The columns a [`JobRecord`] is read from.
macro_rules! job_columns {
    () => {
        "id, spec, state, reason, submitted_at, started_at, finished_at, updated_at, \
         gpu_index, gpu_uuid, slot_start, slot_profile, profile, instance_id, device_uuid, \
         mps_share, exit_code, restarts, moves, pid, owner_uid, owner_gid, ended_by_uid"
    };
}

/// Connections of the store's pool.
const MAX_CONNECTIONS: u32 = 4;

/// The store file, its `-wal` and its `-shm` are for root only (SQLite gives the last two
/// the mode of the first).
const FILE_MODE: u32 = 0o600;

impl Store {
    /// Opens (creating if needed) the store file and applies the migrations. An empty store
    /// file is refused: it is not a store that was never written (mmkd never leaves one),
    /// but one that lost its contents.
    pub async fn open(path: &Path) -> Result<Store> {
        Store::open_with(path, pool_options()).await
    }

    async fn open_with(path: &Path, pool: SqlitePoolOptions) -> Result<Store> {
        prepare_file(path).await?;
        let pool = pool
            .connect_with(connect_options(path))
            .await
            .map_err(|source| StoreError::Open {
                path: path.display().to_string(),
                source,
            })?;
        sqlx::migrate!("../migrations")
            .run(&pool)
            .await
            .map_err(StoreError::Migrate)?;
        Ok(Store { pool })
    }

    /// A write transaction. `BEGIN IMMEDIATE` takes the write lock up front: a deferred
    /// transaction that reads and then writes gets SQLITE_BUSY at once (no busy wait) when
    /// another connection wrote in between.
    async fn write(&self) -> Result<sqlx::Transaction<'static, sqlx::Sqlite>> {
        Ok(self.pool.begin_with("BEGIN IMMEDIATE").await?)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }

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

    pub async fn instances(&self) -> Result<Vec<InstanceRecord>> {
        let rows = sqlx::query(
            "SELECT gpu_uuid, gpu_index, start_slice, profile_id, size_slices, instance_id, device_uuid \
             FROM gpu_instances ORDER BY gpu_index, start_slice",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok(InstanceRecord {
                    gpu_uuid: r.try_get("gpu_uuid")?,
                    gpu_index: r.try_get("gpu_index")?,
                    instance: Instance {
                        id: r.try_get("instance_id")?,
                        profile_id: r.try_get("profile_id")?,
                        placement: Placement {
                            start: r.try_get("start_slice")?,
                            size: r.try_get("size_slices")?,
                        },
                        uuid: r.try_get("device_uuid")?,
                    },
                })
            })
            .collect()
    }

    pub async fn add_instance(&self, rec: &InstanceRecord, now: i64) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        upsert_instance(&mut conn, rec, now).await
    }

    /// Records a layout step before it is applied; returns its ID.
    pub async fn begin_step(&self, step: &StepRecord, now: i64) -> Result<i64> {
        let id: i64 = sqlx::query_scalar(
            "INSERT INTO layout_steps (gpu_uuid, gpu_index, kind, profile_id, start_slice, instance_id, state, started_at) \
             VALUES (?, ?, ?, ?, ?, ?, 'pending', ?) RETURNING id",
        )
        .bind(&step.gpu_uuid)
        .bind(step.gpu_index)
        .bind(&step.kind)
        .bind(step.profile_id)
        .bind(step.start)
        .bind(step.instance_id)
        .bind(now)
        .fetch_one(&self.pool)
        .await?;
        Ok(id)
    }

    /// A create step succeeded: the instance and the step's end, in one transaction.
    pub async fn finish_create(&self, step: i64, rec: &InstanceRecord, now: i64) -> Result<()> {
        let mut tx = self.write().await?;
        upsert_instance(&mut tx, rec, now).await?;
        sqlx::query(
            "UPDATE layout_steps SET state = 'done', instance_id = ?, finished_at = ? WHERE id = ?",
        )
        .bind(rec.instance.id)
        .bind(now)
        .bind(step)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(())
    }

    /// A destroy step succeeded: the instance's record goes with the step's end.
    pub async fn finish_destroy(
        &self,
        step: i64,
        gpu_uuid: &str,
        start: u8,
        now: i64,
    ) -> Result<()> {
        let mut tx = self.write().await?;
        delete_instance(&mut tx, gpu_uuid, start).await?;
        sqlx::query("UPDATE layout_steps SET state = 'done', finished_at = ? WHERE id = ?")
            .bind(now)
            .bind(step)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    pub async fn fail_step(&self, step: i64, error: &str, now: i64) -> Result<()> {
        sqlx::query(
            "UPDATE layout_steps SET state = 'failed', error = ?, finished_at = ? WHERE id = ?",
        )
        .bind(error)
        .bind(now)
        .bind(step)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Steps that were under way when mmkd stopped: marked interrupted and returned.
    pub async fn interrupt_pending_steps(&self, now: i64) -> Result<Vec<StepRecord>> {
        let mut tx = self.write().await?;
        let rows = sqlx::query(
            "SELECT id, gpu_uuid, gpu_index, kind, profile_id, start_slice, instance_id FROM layout_steps \
             WHERE state = 'pending' ORDER BY id",
        )
        .fetch_all(&mut *tx)
        .await?;
        sqlx::query("UPDATE layout_steps SET state = 'interrupted', finished_at = ? WHERE state = 'pending'")
            .bind(now)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(step_of).collect()
    }

    /// The instances mmkd created by its journal and has not destroyed since: each completed
    /// create step (with the instance ID the driver gave) that no later completed destroy at
    /// the same GPU and slice undid, oldest first.
    pub async fn created_instances(&self) -> Result<Vec<StepRecord>> {
        let rows = sqlx::query(
            "SELECT c.id, c.gpu_uuid, c.gpu_index, c.kind, c.profile_id, c.start_slice, c.instance_id \
             FROM layout_steps c \
             WHERE c.kind = 'create' AND c.state = 'done' AND c.instance_id IS NOT NULL \
             AND NOT EXISTS (SELECT 1 FROM layout_steps d WHERE d.kind = 'destroy' \
               AND d.state = 'done' AND d.gpu_uuid = c.gpu_uuid \
               AND d.start_slice = c.start_slice AND d.id > c.id) \
             ORDER BY c.id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(step_of).collect()
    }

    pub async fn remove_instance(&self, gpu_uuid: &str, start: u8) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        delete_instance(&mut conn, gpu_uuid, start).await
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

    /// Stores a learned profile as it is now (replacing the row of its signature).
    pub async fn put_profile(&self, p: &Learned) -> Result<()> {
        let observed = serde_json::to_string(&p.observed).map_err(|e| StoreError::Corrupt {
            id: 0,
            what: format!("learned profile {}: {e}", p.signature),
        })?;
        sqlx::query(
            "INSERT INTO learned_profiles \
             (signature, owner_uid, name, class, observed, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (signature) DO UPDATE SET owner_uid = excluded.owner_uid, \
             name = excluded.name, class = excluded.class, observed = excluded.observed, \
             updated_at = excluded.updated_at",
        )
        .bind(&p.signature)
        .bind(p.owner_uid.map(i64::from))
        .bind(&p.name)
        .bind(p.class.as_str())
        .bind(observed)
        .bind(p.created_at)
        .bind(p.updated_at)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Every learned profile; a row that cannot be read comes back as its signature and
    /// what is wrong with it, and the others are still read.
    pub async fn profiles(&self) -> Result<Vec<std::result::Result<Learned, (String, String)>>> {
        let rows = sqlx::query(
            "SELECT signature, owner_uid, name, class, observed, created_at, updated_at \
             FROM learned_profiles ORDER BY signature",
        )
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.iter().map(profile_from_row).collect())
    }
}

fn profile_from_row(row: &SqliteRow) -> std::result::Result<Learned, (String, String)> {
    let signature: String = row
        .try_get("signature")
        .unwrap_or_else(|_| "(unreadable signature)".into());
    let read = || -> std::result::Result<Learned, String> {
        let text = |c: &str| row.try_get::<String, _>(c).map_err(|e| format!("{c}: {e}"));
        let int = |c: &str| row.try_get::<i64, _>(c).map_err(|e| format!("{c}: {e}"));
        let owner_uid = row
            .try_get::<Option<i64>, _>("owner_uid")
            .map_err(|e| format!("owner_uid: {e}"))?
            .map(|u| u32::try_from(u).map_err(|_| format!("owner_uid: {u} is not a uid")))
            .transpose()?;
        let class = text("class")?;
        let class = JobClass::from_str(&class).map_err(|e| format!("class: {e}"))?;
        let observed: Observed =
            serde_json::from_str(&text("observed")?).map_err(|e| format!("observed: {e}"))?;
        observed.check().map_err(|e| format!("observed: {e}"))?;
        Ok(Learned {
            signature: signature.clone(),
            owner_uid,
            name: text("name")?,
            class,
            observed,
            created_at: int("created_at")?,
            updated_at: int("updated_at")?,
        })
    };
    read().map_err(|why| (signature.clone(), why))
}

/// How the store connects to its file (which [`prepare_file`] made).
fn connect_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(5))
}

/// The store's pool. A connection goes back to it only once no transaction is open on it:
/// a write that fails on a full disk can make SQLite roll the whole transaction back by
/// itself, after which sqlx's own ROLLBACK fails and sqlx would count the connection as
/// still in a transaction, refusing every later `BEGIN` on it. Such a connection is closed
/// (SQLite rolls back whatever is left) and the pool opens a new one when it needs one.
fn pool_options() -> SqlitePoolOptions {
    SqlitePoolOptions::new()
        .max_connections(MAX_CONNECTIONS)
        .after_release(|conn, _| {
            Box::pin(async move {
                // The rollback of a dropped transaction is queued on the connection's
                // worker; a ping returns once it has run.
                conn.ping().await?;
                let ended = !conn.is_in_transaction();
                if !ended {
                    tracing::warn!("closing a node store connection whose transaction did not end");
                }
                Ok(ended)
            })
        })
}

/// Makes sure the store file exists, is not empty, and is for root only, as are its `-wal`
/// and `-shm` when they are there.
async fn prepare_file(path: &Path) -> Result<()> {
    match std::fs::metadata(path) {
        Ok(meta) if meta.len() == 0 => Err(StoreError::Empty {
            path: path.display().to_string(),
        }),
        Ok(_) => {
            for file in [
                path.to_owned(),
                sibling(path, "-wal"),
                sibling(path, "-shm"),
            ] {
                restrict(&file)?;
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_file(path).await,
        Err(e) => Err(file_error(path, "stat", e)),
    }
}

/// `path` with `suffix` added to its file name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn file_error(path: &Path, op: &'static str, source: std::io::Error) -> StoreError {
    StoreError::File {
        path: path.display().to_string(),
        op,
        source,
    }
}

/// Takes group and other access away from `path`, when it exists.
fn restrict(path: &Path) -> Result<()> {
    let mode = match std::fs::metadata(path) {
        Ok(meta) => meta.permissions().mode(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(file_error(path, "stat", e)),
    };
    if mode & 0o777 == FILE_MODE {
        return Ok(());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(FILE_MODE))
        .map_err(|e| file_error(path, "make it readable by root only", e))
}

/// Makes a new, empty WAL-mode database for root only under another name, then renames it
/// to `path`: a crash or a full disk on the way leaves no empty store file behind.
async fn create_file(path: &Path) -> Result<()> {
    let tmp = sibling(path, ".new");
    let leftovers = || {
        for file in [tmp.clone(), sibling(&tmp, "-wal"), sibling(&tmp, "-shm")] {
            // Best effort: nothing else uses these names.
            let _ = std::fs::remove_file(file);
        }
    };
    leftovers();
    let made = async {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(FILE_MODE)
            .open(&tmp)
            .map_err(|e| file_error(&tmp, "create", e))?;
        // Setting the journal mode writes the database header.
        let open_error = |source| StoreError::Open {
            path: tmp.display().to_string(),
            source,
        };
        let opts = SqliteConnectOptions::new()
            .filename(&tmp)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full);
        SqliteConnection::connect_with(&opts)
            .await
            .map_err(open_error)?
            .close()
            .await
            .map_err(open_error)?;
        std::fs::File::open(&tmp)
            .and_then(|file| file.sync_all())
            .map_err(|e| file_error(&tmp, "sync", e))?;
        std::fs::rename(&tmp, path).map_err(|e| file_error(path, "rename a new store to", e))?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::File::open(dir)
                .and_then(|dir| dir.sync_all())
                .map_err(|e| file_error(dir, "sync", e))?;
        }
        Ok(())
    }
    .await;
    if made.is_err() {
        leftovers();
    }
    made
}

/// Records an instance (replacing the record of its GPU and start slice).
async fn upsert_instance(
    conn: &mut SqliteConnection,
    rec: &InstanceRecord,
    now: i64,
) -> Result<()> {
    sqlx::query(
        "INSERT OR REPLACE INTO gpu_instances (gpu_uuid, gpu_index, start_slice, profile_id, size_slices, instance_id, device_uuid, created_at) \
         VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
    )
    .bind(&rec.gpu_uuid)
    .bind(rec.gpu_index)
    .bind(rec.instance.placement.start)
    .bind(rec.instance.profile_id)
    .bind(rec.instance.placement.size)
    .bind(rec.instance.id)
    .bind(&rec.instance.uuid)
    .bind(now)
    .execute(conn)
    .await?;
    Ok(())
}

/// A `layout_steps` row (its id, GPU, kind, profile, start slice and instance ID).
fn step_of(r: &SqliteRow) -> Result<StepRecord> {
    Ok(StepRecord {
        id: r.try_get("id")?,
        gpu_uuid: r.try_get("gpu_uuid")?,
        gpu_index: r.try_get("gpu_index")?,
        kind: r.try_get("kind")?,
        profile_id: r.try_get("profile_id")?,
        start: r.try_get("start_slice")?,
        instance_id: r.try_get("instance_id")?,
    })
}

async fn delete_instance(conn: &mut SqliteConnection, gpu_uuid: &str, start: u8) -> Result<()> {
    sqlx::query("DELETE FROM gpu_instances WHERE gpu_uuid = ? AND start_slice = ?")
        .bind(gpu_uuid)
        .bind(start)
        .execute(conn)
        .await?;
    Ok(())
}

async fn insert_event(
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

fn parse_state(id: i64, s: &str) -> Result<JobState> {
    JobState::from_str(s).map_err(|what| StoreError::Corrupt { id, what })
}

fn job_from_row(r: &SqliteRow) -> Result<JobRecord> {
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
fn states_filter(states: &[JobState]) -> String {
    if states.is_empty() {
        return String::new();
    }
    let list: Vec<String> = states
        .iter()
        .map(|s| format!("\"{}\"", s.as_str()))
        .collect();
    format!("[{}]", list.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mmk_core::spec::{RestartPolicy, Task, WorkloadSpec};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn spec(name: &str) -> JobSpec {
        JobSpec {
            name: name.into(),
            class: JobClass::Offline,
            gpu_memory_mib: 1024,
            slo_ms: None,
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
        }
    }

    async fn store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().expect("tempdir");
        let s = Store::open(&dir.path().join("mmk.db")).await.expect("open");
        (dir, s)
    }

    #[tokio::test]
    async fn migrations_apply_to_an_empty_database_and_reopen() {
        let (dir, s) = store().await;
        s.insert_job(&spec("a"), None, 1).await.expect("insert");
        s.close().await;
        let s = Store::open(&dir.path().join("mmk.db"))
            .await
            .expect("reopen");
        assert_eq!(s.list_jobs(&[], None).await.expect("list").len(), 1);
    }

    #[tokio::test]
    async fn a_wait_reason_does_not_overwrite_a_job_that_left_the_queue() {
        let (_dir, s) = store().await;
        let (a, _) = s.insert_job(&spec("a"), None, 10).await.expect("insert");
        let (b, _) = s.insert_job(&spec("b"), None, 10).await.expect("insert");
        // A cancel comes in between a pass's read and its write of the reasons.
        s.transition(
            a.id,
            JobState::Cancelled,
            "cancelled: no",
            Change::default(),
            11,
        )
        .await
        .expect("cancel");
        s.set_reasons(&[(a.id, "waiting".into()), (b.id, "waiting".into())], 12)
            .await
            .expect("reasons");
        s.set_reason(a.id, "waiting again", 13)
            .await
            .expect("reason");
        let get = |id| s.get_job(id);
        assert_eq!(get(a.id).await.expect("a").reason, "cancelled: no");
        assert_eq!(get(b.id).await.expect("b").reason, "waiting");
    }

    #[tokio::test]
    async fn transitions_follow_the_state_machine_and_leave_events() {
        let (_dir, s) = store().await;
        let (job, ev) = s.insert_job(&spec("a"), None, 10).await.expect("insert");
        assert_eq!((job.state, ev.state), (JobState::Queued, JobState::Queued));
        let err = s
            .transition(job.id, JobState::Succeeded, "x", Change::default(), 11)
            .await
            .expect_err("QUEUED cannot become SUCCEEDED");
        assert!(matches!(err, StoreError::BadTransition { .. }));
        let a = Assignment {
            slot: Slot {
                gpu: 0,
                start: 4,
                profile_id: Some(9),
            },
            gpu_uuid: "GPU-x".into(),
            instance_id: 2,
            device_uuid: "MIG-y".into(),
            profile: "3g.40gb".into(),
            mps_share: 100,
        };
        s.transition(
            job.id,
            JobState::Starting,
            "placed",
            Change {
                assignment: Some(a.clone()),
                ..Change::default()
            },
            12,
        )
        .await
        .expect("start");
        s.transition(job.id, JobState::Running, "running", Change::default(), 13)
            .await
            .expect("run");
        let (done, _) = s
            .transition(
                job.id,
                JobState::Failed,
                "exited with code 3",
                Change {
                    exit_code: Some(3),
                    ..Change::default()
                },
                14,
            )
            .await
            .expect("fail");
        assert_eq!(done.assignment, Some(a));
        assert_eq!(
            (done.started_at, done.finished_at, done.exit_code),
            (Some(13), Some(14), Some(3))
        );
        let states: Vec<_> = s
            .job_events(job.id)
            .await
            .expect("events")
            .iter()
            .map(|e| e.state)
            .collect();
        assert_eq!(
            states,
            [
                JobState::Queued,
                JobState::Starting,
                JobState::Running,
                JobState::Failed
            ]
        );
    }

    #[tokio::test]
    async fn list_filters_by_state_and_class() {
        let (_dir, s) = store().await;
        let (a, _) = s.insert_job(&spec("a"), None, 1).await.expect("insert");
        let mut on = spec("b");
        on.class = JobClass::Online;
        s.insert_job(&on, None, 2).await.expect("insert");
        s.transition(a.id, JobState::Cancelled, "user", Change::default(), 3)
            .await
            .expect("cancel");
        let q = s.list_jobs(&[JobState::Queued], None).await.expect("list");
        assert_eq!(
            q.iter().map(|j| j.spec.name.as_str()).collect::<Vec<_>>(),
            ["b"]
        );
        let off = s
            .list_jobs(&[], Some(JobClass::Offline))
            .await
            .expect("list");
        assert_eq!(
            off.iter().map(|j| j.spec.name.as_str()).collect::<Vec<_>>(),
            ["a"]
        );
    }

    #[tokio::test]
    async fn moves_count_apart_from_failure_restarts() {
        let (_dir, s) = store().await;
        let (job, _) = s.insert_job(&spec("a"), None, 1).await.expect("insert");
        s.transition(job.id, JobState::Starting, "placed", Change::default(), 2)
            .await
            .expect("start");
        s.transition(job.id, JobState::Running, "running", Change::default(), 3)
            .await
            .expect("run");
        let moved = Change {
            moved: true,
            ..Change::default()
        };
        let (j, _) = s
            .transition(job.id, JobState::Queued, "moved", moved, 4)
            .await
            .expect("move");
        assert_eq!((j.restarts, j.moves, j.failure_restarts()), (1, 1, 0));
        s.transition(job.id, JobState::Starting, "placed", Change::default(), 5)
            .await
            .expect("start");
        let failed = Change {
            restart: true,
            ..Change::default()
        };
        let (j, _) = s
            .transition(job.id, JobState::Queued, "failed", failed, 6)
            .await
            .expect("requeue");
        assert_eq!((j.restarts, j.moves, j.failure_restarts()), (2, 1, 1));
    }

    #[tokio::test]
    async fn a_missing_job_is_not_found() {
        let (_dir, s) = store().await;
        assert!(matches!(s.get_job(42).await, Err(StoreError::NotFound(42))));
    }

    #[tokio::test]
    async fn steps_are_recorded_before_and_after() {
        let (_dir, s) = store().await;
        let step = StepRecord {
            id: 0,
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            kind: "create".into(),
            profile_id: 9,
            start: 4,
            instance_id: None,
        };
        let done = s.begin_step(&step, 1).await.expect("begin");
        let rec = InstanceRecord {
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            instance: Instance {
                id: 3,
                profile_id: 9,
                placement: Placement { start: 4, size: 4 },
                uuid: "MIG-z".into(),
            },
        };
        s.finish_create(done, &rec, 2).await.expect("finish");
        assert_eq!(s.instances().await.expect("list"), vec![rec]);
        let cut = s
            .begin_step(
                &StepRecord {
                    kind: "destroy".into(),
                    instance_id: Some(3),
                    ..step
                },
                3,
            )
            .await
            .expect("begin");
        let interrupted = s.interrupt_pending_steps(4).await.expect("interrupt");
        assert_eq!(interrupted.iter().map(|x| x.id).collect::<Vec<_>>(), [cut]);
        assert!(
            s.interrupt_pending_steps(5)
                .await
                .expect("again")
                .is_empty()
        );
    }

    #[tokio::test]
    async fn instances_round_trip() {
        let (_dir, s) = store().await;
        let rec = InstanceRecord {
            gpu_uuid: "GPU-1".into(),
            gpu_index: 0,
            instance: Instance {
                id: 3,
                profile_id: 9,
                placement: Placement { start: 4, size: 4 },
                uuid: "MIG-z".into(),
            },
        };
        s.add_instance(&rec, 1).await.expect("add");
        assert_eq!(s.instances().await.expect("list"), vec![rec]);
        s.remove_instance("GPU-1", 4).await.expect("remove");
        assert!(s.instances().await.expect("list").is_empty());
    }

    fn mode(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o777
    }

    #[tokio::test]
    async fn the_store_files_are_for_root_only() {
        let (dir, s) = store().await;
        s.insert_job(&spec("a"), None, 1).await.expect("insert");
        let db = dir.path().join("mmk.db");
        let files = [db.clone(), sibling(&db, "-wal"), sibling(&db, "-shm")];
        for file in &files {
            assert_eq!(mode(file), 0o600, "{}", file.display());
        }
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .expect("list")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        assert!(
            names
                .iter()
                .all(|n| n.starts_with("mmk.db") && !n.contains(".new")),
            "{names:?}"
        );
        // Files an older mmkd left readable by all are made root's alone.
        for file in &files {
            std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        let again = Store::open(&db).await.expect("reopen");
        for file in &files {
            assert_eq!(mode(file), 0o600, "{}", file.display());
        }
        assert_eq!(again.list_jobs(&[], None).await.expect("list").len(), 1);
    }

    #[tokio::test]
    async fn an_empty_store_file_is_refused_with_the_reason() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("mmk.db");
        std::fs::write(&db, b"").expect("write");
        let err = Store::open(&db).await.expect_err("an empty store");
        let text = err.to_string();
        assert!(matches!(err, StoreError::Empty { .. }), "{err:?}");
        assert!(text.contains(&db.display().to_string()), "{text}");
        assert!(
            text.contains("is empty") && text.contains("move it away"),
            "{text}"
        );
        assert_eq!(
            std::fs::metadata(&db).expect("stat").len(),
            0,
            "left as it was"
        );
    }

    /// The most pages every connection of `s` lets the database file grow to: a nonzero
    /// limit stands for a full disk (SQLITE_FULL), as far as the file has reached it.
    async fn set_page_limit(s: &Store, limit: &AtomicU32, pages: u32) {
        limit.store(pages, Ordering::SeqCst);
        // Holding every connection of the pool at once reaches the idle ones too; a new one
        // gets the limit from `after_connect`.
        let mut held = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            held.push(s.pool.acquire().await.expect("acquire"));
        }
        for conn in &mut held {
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "PRAGMA max_page_count = {pages}"
            )))
            .execute(&mut **conn)
            .await
            .expect("pragma");
        }
    }

    fn is_full(err: &StoreError) -> bool {
        // The message as SQLite words it, and the code mmkd maps to RESOURCE_EXHAUSTED.
        matches!(err, StoreError::Query(sqlx::Error::Database(e)) if e.message().contains("full"))
            && err.is_full()
    }

    #[tokio::test]
    async fn writes_fail_on_a_full_disk_and_succeed_again_once_space_returns() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("mmk.db");
        let limit = Arc::new(AtomicU32::new(0));
        let on_connect = limit.clone();
        let pool = pool_options().after_connect(move |conn, _| {
            let pages = on_connect.load(Ordering::SeqCst);
            Box::pin(async move {
                if pages > 0 {
                    sqlx::query(sqlx::AssertSqlSafe(format!(
                        "PRAGMA max_page_count = {pages}"
                    )))
                    .execute(conn)
                    .await?;
                }
                Ok(())
            })
        });
        let s = Store::open_with(&db, pool).await.expect("open");
        let mut acked = 0;
        s.insert_job(&spec("first"), None, 1).await.expect("insert");
        acked += 1;
        let pages: i64 = sqlx::query_scalar("PRAGMA page_count")
            .fetch_one(&s.pool)
            .await
            .expect("page count");
        set_page_limit(&s, &limit, u32::try_from(pages).expect("pages")).await;
        // Fill the "disk".
        let mut err = None;
        for n in 0..1000 {
            match s.insert_job(&spec(&format!("fill{n}")), None, 2).await {
                Ok(_) => acked += 1,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        let err = err.expect("the database fills up");
        assert!(is_full(&err), "{err:?}");
        // While it is full, every write says so, whichever connection it gets.
        let job = s.get_job(1).await.expect("a read still works");
        for n in 0..2 * MAX_CONNECTIONS {
            let err = s
                .insert_job(&spec(&format!("full{n}")), None, 3)
                .await
                .expect_err("still full");
            assert!(is_full(&err), "write {n} while full: {err:?}");
            let err = s
                .note(job.id, &"x".repeat(5000), 3)
                .await
                .expect_err("still full");
            assert!(is_full(&err), "note {n} while full: {err:?}");
        }
        // Space returns: writes succeed again, on every connection, without a restart.
        set_page_limit(&s, &limit, 1_000_000_000).await;
        for n in 0..2 * MAX_CONNECTIONS {
            s.insert_job(&spec(&format!("after{n}")), None, 4)
                .await
                .unwrap_or_else(|e| panic!("write {n} after space returned: {e:?}"));
            acked += 1;
        }
        s.close().await;
        let s = Store::open(&db).await.expect("reopen");
        assert_eq!(
            s.list_jobs(&[], None).await.expect("list").len(),
            acked,
            "every acknowledged job is kept, and only those"
        );
    }

    #[tokio::test]
    async fn learned_profiles_are_kept_and_a_bad_row_is_named_not_fatal() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("mmk.db");
        let store = Store::open(&path).await.expect("open");
        let mut observed = Observed::default();
        observed.sample(40, true);
        observed.sample(0, false);
        observed.seconds = 0.004;
        let p = Learned {
            signature: "1000/name/train/cmd/00ff".into(),
            owner_uid: Some(1000),
            name: "train".into(),
            class: JobClass::Offline,
            observed,
            created_at: 5,
            updated_at: 7,
        };
        store.put_profile(&p).await.expect("put");
        let mut later = p.clone();
        later.observed.sample(40, true);
        later.updated_at = 9;
        store.put_profile(&later).await.expect("replace");
        sqlx::query(
            "INSERT INTO learned_profiles VALUES ('1000/key/bad', 1000, 'bad', 'offline', '{\"version\":1}', 1, 1)",
        )
        .execute(&store.pool)
        .await
        .expect("a corrupt row");
        store.close().await;
        let store = Store::open(&path).await.expect("reopen");
        let rows = store.profiles().await.expect("profiles");
        assert_eq!(rows.len(), 2);
        let (bad, why) = rows[0].clone().expect_err("the corrupt row");
        assert_eq!(bad, "1000/key/bad");
        assert!(why.starts_with("observed:"), "{why}");
        assert_eq!(rows[1], Ok(later), "the newer write replaced the first");
    }
}
