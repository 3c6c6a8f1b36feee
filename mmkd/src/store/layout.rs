//! The GPU instance layout: the instances mmkd knows, and each layout step, recorded
//! before and after the driver call that makes or destroys an instance.

use mmk_partitioner::{Instance, Placement};
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, SqliteConnection};

use crate::job::{InstanceRecord, StepRecord};

use super::{Result, Store};

impl Store {
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

    /// Removes the layout steps that no longer tell anything, from before `before_ms`:
    /// failed and interrupted ones, creates that a later destroy undid, and destroys with
    /// no earlier create left at their GPU and slice. Returns how many.
    pub async fn prune_steps(&self, before_ms: i64) -> Result<u64> {
        let mut tx = self.write().await?;
        let mut removed = sqlx::query(
            "DELETE FROM layout_steps WHERE state IN ('failed', 'interrupted') AND finished_at < ?",
        )
        .bind(before_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        removed += sqlx::query(
            "DELETE FROM layout_steps AS c WHERE c.kind = 'create' AND c.state = 'done' \
             AND EXISTS (SELECT 1 FROM layout_steps d WHERE d.kind = 'destroy' \
               AND d.state = 'done' AND d.gpu_uuid = c.gpu_uuid \
               AND d.start_slice = c.start_slice AND d.id > c.id AND d.finished_at < ?)",
        )
        .bind(before_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        removed += sqlx::query(
            "DELETE FROM layout_steps AS d WHERE d.kind = 'destroy' AND d.state = 'done' \
             AND d.finished_at < ? \
             AND NOT EXISTS (SELECT 1 FROM layout_steps c WHERE c.kind = 'create' \
               AND c.gpu_uuid = d.gpu_uuid AND c.start_slice = d.start_slice AND c.id < d.id)",
        )
        .bind(before_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok(removed)
    }

    pub async fn remove_instance(&self, gpu_uuid: &str, start: u8) -> Result<()> {
        let mut conn = self.pool.acquire().await?;
        delete_instance(&mut conn, gpu_uuid, start).await
    }
}

/// Records an instance (replacing the record of its GPU and start slice).
pub(super) async fn upsert_instance(
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
pub(super) fn step_of(r: &SqliteRow) -> Result<StepRecord> {
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

pub(super) async fn delete_instance(
    conn: &mut SqliteConnection,
    gpu_uuid: &str,
    start: u8,
) -> Result<()> {
    sqlx::query("DELETE FROM gpu_instances WHERE gpu_uuid = ? AND start_slice = ?")
        .bind(gpu_uuid)
        .bind(start)
        .execute(conn)
        .await?;
    Ok(())
}
