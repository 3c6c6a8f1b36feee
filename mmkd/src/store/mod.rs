//! The node store: jobs, their state transitions and the GPU instance layout, in SQLite
//! through sqlx. Every query of the daemon lives here.
//!
//! A state change and its event row are written in one transaction, so a crash never
//! leaves a job in a state without the event that explains it.
//!
//! By concern: `jobs` (jobs, their transitions and events), `layout` (GPU instances
//! and the layout steps that make and destroy them), `profiles` (learned profiles); this
//! file opens the store file and holds the errors.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use mmk_core::{JobState, ServiceError};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions, SqliteSynchronous};
use sqlx::{Connection, SqliteConnection, SqlitePool};
use thiserror::Error;

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

/// What the write-ahead log is cut back to after a checkpoint, in bytes.
const JOURNAL_SIZE_LIMIT: u64 = 16 << 20;

/// Connections of the store's pool.
const MAX_CONNECTIONS: u32 = 4;

/// The store file, its `-wal` and its `-shm` are for root only (SQLite gives the last two
/// the mode of the first).
const FILE_MODE: u32 = 0o600;

mod jobs;
mod layout;
mod profiles;
#[cfg(test)]
mod tests;

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

    /// Copies the write-ahead log into the store file and truncates it to nothing, so that
    /// the log holds only what came since (and a restart reads little).
    pub async fn checkpoint(&self) -> Result<()> {
        sqlx::query("PRAGMA wal_checkpoint(TRUNCATE)")
            .execute(&self.pool)
            .await?;
        Ok(())
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

/// How the store connects to its file (which [`prepare_file`] made).
pub(super) fn connect_options(path: &Path) -> SqliteConnectOptions {
    SqliteConnectOptions::new()
        .filename(path)
        .journal_mode(SqliteJournalMode::Wal)
        .synchronous(SqliteSynchronous::Full)
        .foreign_keys(true)
        .busy_timeout(Duration::from_secs(5))
        // After a checkpoint the log file is cut back to this much (it grows past it only
        // between checkpoints).
        .pragma("journal_size_limit", JOURNAL_SIZE_LIMIT.to_string())
}

/// The store's pool. A connection goes back to it only once no transaction is open on it:
/// a write that fails on a full disk can make SQLite roll the whole transaction back by
/// itself, after which sqlx's own ROLLBACK fails and sqlx would count the connection as
/// still in a transaction, refusing every later `BEGIN` on it. Such a connection is closed
/// (SQLite rolls back whatever is left) and the pool opens a new one when it needs one.
pub(super) fn pool_options() -> SqlitePoolOptions {
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
pub(super) async fn prepare_file(path: &Path) -> Result<()> {
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
pub(super) fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

pub(super) fn file_error(path: &Path, op: &'static str, source: std::io::Error) -> StoreError {
    StoreError::File {
        path: path.display().to_string(),
        op,
        source,
    }
}

/// Takes group and other access away from `path`, when it exists.
pub(super) fn restrict(path: &Path) -> Result<()> {
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
pub(super) async fn create_file(path: &Path) -> Result<()> {
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
