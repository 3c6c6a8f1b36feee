//! How many streams (WatchJobs, WatchCapacity) may be open at once: per user and on the
//! whole node. A watch holds a task, a buffer of events and, while its snapshot is sent,
//! a page of jobs; a caller that opens many and reads none must not take mmkd's memory.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tonic::Status;

/// Streams one user may have open at once.
pub const PER_USER: usize = 32;
/// Streams open on the node at once.
pub const TOTAL: usize = 256;

/// The open streams, by uid.
#[derive(Debug)]
pub struct Watches {
    per_user: usize,
    total: usize,
    open: Mutex<HashMap<u32, usize>>,
}

impl Default for Watches {
    fn default() -> Watches {
        Watches::new(PER_USER, TOTAL)
    }
}

impl Watches {
    pub fn new(per_user: usize, total: usize) -> Watches {
        Watches {
            per_user,
            total,
            open: Mutex::default(),
        }
    }

    /// A place for one more stream of `uid`, held until the guard is dropped;
    /// RESOURCE_EXHAUSTED when the user or the node has as many open as they may.
    pub fn open(self: &Arc<Watches>, uid: u32) -> Result<WatchGuard, Status> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        let total: usize = open.values().sum();
        let mine = open.get(&uid).copied().unwrap_or(0);
        if mine >= self.per_user {
            return Err(Status::resource_exhausted(format!(
                "uid {uid} has {mine} watches open, the most one user may; close one first"
            )));
        }
        if total >= self.total {
            return Err(Status::resource_exhausted(format!(
                "the node has {total} watches open, the most it serves; try again later"
            )));
        }
        *open.entry(uid).or_default() += 1;
        Ok(WatchGuard {
            watches: Arc::clone(self),
            uid,
        })
    }

    /// Streams open now, of everyone.
    pub fn open_now(&self) -> usize {
        self.open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .sum()
    }
}

/// One open stream's place; dropped with the stream's task.
#[derive(Debug)]
pub struct WatchGuard {
    watches: Arc<Watches>,
    uid: u32,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let mut open = self
            .watches
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(n) = open.get_mut(&self.uid) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.remove(&self.uid);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watches_are_capped_per_user_and_in_all_and_given_back() {
        let w = Arc::new(Watches::new(2, 3));
        let a1 = w.open(1).unwrap();
        let _a2 = w.open(1).unwrap();
        let err = w.open(1).unwrap_err();
        assert_eq!(err.code(), tonic::Code::ResourceExhausted);
        assert!(
            err.message().contains("uid 1 has 2 watches open"),
            "{err:?}"
        );
        let _b1 = w.open(2).unwrap();
        let err = w.open(3).unwrap_err();
        assert!(err.message().contains("the node has 3"), "{err:?}");
        drop(a1);
        assert_eq!(w.open_now(), 2);
        let _c1 = w.open(3).unwrap();
    }
}
