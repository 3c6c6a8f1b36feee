//! Learned profiles, one row per job signature.

use std::str::FromStr;

use mmk_core::JobClass;
use sqlx::Row;
use sqlx::sqlite::SqliteRow;

use crate::learn::{Learned, Observed};

use super::{Result, Store, StoreError};

impl Store {
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

pub(super) fn profile_from_row(row: &SqliteRow) -> std::result::Result<Learned, (String, String)> {
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
