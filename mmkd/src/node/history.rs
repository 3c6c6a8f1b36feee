//! The node's history: what the store keeps of ended jobs. An ended job's record (its row
//! and its events: `mmkctl jobs get`, `jobs list`, `jobs events`) is removed once it ended
//! longer than `--job-history` ago, but for the newest `--job-history-keep` jobs of each
//! user; layout steps that tell nothing any more go with the same age; and the store's
//! write-ahead log is checkpointed and cut back, so that the store and a restart's work
//! stay flat however long mmkd runs. Job IDs are never reused.

use std::time::Duration;

use mmk_core::now_ms;
use tracing::{info, warn};

use super::Node;
use crate::store::StoreError;

/// What the history keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HistoryPolicy {
    /// How long after its end an ended job's record is kept.
    pub keep_for: Duration,
    /// Ended jobs of each user kept whatever their age.
    pub keep_per_user: u32,
}

/// Ended jobs' records are kept 30 days by default.
pub const DEFAULT_KEEP_FOR: Duration = Duration::from_secs(30 * 24 * 3600);
/// The newest 100 ended jobs of each user are kept by default.
pub const DEFAULT_KEEP_PER_USER: u32 = 100;

/// How often the history is pruned (or a fraction of its age, when that is shorter).
const PRUNE_EVERY: Duration = Duration::from_secs(600);

impl HistoryPolicy {
    fn period(&self) -> Duration {
        (self.keep_for / 4).clamp(Duration::from_secs(1), PRUNE_EVERY)
    }
}

impl Default for HistoryPolicy {
    fn default() -> HistoryPolicy {
        HistoryPolicy {
            keep_for: DEFAULT_KEEP_FOR,
            keep_per_user: DEFAULT_KEEP_PER_USER,
        }
    }
}

/// What one pruning removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub jobs: u64,
    pub steps: u64,
}

impl Node {
    /// Prunes the history now, then every period, until mmkd stops.
    pub(super) async fn keep_history(self) {
        let policy = self.inner.history;
        let mut tick = tokio::time::interval(policy.period());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            match self.prune_history().await {
                Ok(p) if p != Pruned::default() => info!(
                    jobs = p.jobs,
                    layout_steps = p.steps,
                    keep_for = ?policy.keep_for,
                    keep_per_user = policy.keep_per_user,
                    "removed ended jobs' records past the history"
                ),
                Ok(_) => {}
                // On a full disk too: a pruning that cannot write waits for the next turn.
                Err(e) => warn!(error = %e, "cannot prune the store's history"),
            }
        }
    }

    /// One pruning: ended jobs' records and old layout steps past the history, then the
    /// store's log checkpointed and cut back.
    pub async fn prune_history(&self) -> Result<Pruned, StoreError> {
        let policy = self.inner.history;
        let keep_ms = i64::try_from(policy.keep_for.as_millis()).unwrap_or(i64::MAX);
        let before = now_ms().saturating_sub(keep_ms);
        let store = &self.inner.store;
        let pruned = Pruned {
            jobs: store.prune_ended(before, policy.keep_per_user).await?,
            steps: store.prune_steps(before).await?,
        };
        store.checkpoint().await?;
        Ok(pruned)
    }
}
