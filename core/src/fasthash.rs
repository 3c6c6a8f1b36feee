//! Hash maps for keys this process makes itself (launch shapes in the interposer, encoded
//! features and partition states in the planner), with foldhash's fast hasher under a
//! fixed seed, so that runs repeat. The standard SipHash resists hash flooding, which keys
//! we make ourselves do not need, and costs several times more per key.

use std::collections::{HashMap, HashSet};

/// The hasher's builder: foldhash's fast hasher with a fixed seed.
pub type FastState = foldhash::fast::FixedState;

/// A `HashMap` with [`FastState`].
pub type FastMap<K, V> = HashMap<K, V, FastState>;

/// A `HashSet` with [`FastState`].
pub type FastSet<K> = HashSet<K, FastState>;

#[cfg(test)]
mod tests {
    use std::hash::BuildHasher;

    use super::*;

    #[test]
    fn equal_keys_hash_equal_and_close_keys_apart() {
        let mut m: FastMap<Vec<u64>, u32> = FastMap::default();
        m.insert(vec![1, 2, 3], 1);
        m.insert(vec![1, 2, 4], 2);
        m.insert(vec![3, 2, 1], 3);
        assert_eq!(m.get(&vec![1, 2, 3]), Some(&1));
        assert_eq!(m.get(&vec![1, 2, 4]), Some(&2));
        assert_eq!(m.get(&vec![3, 2, 1]), Some(&3));
        // The same key hashes the same in every map (runs repeat), close keys apart.
        let h = |k: &(u32, u32, u32)| FastState::default().hash_one(k);
        assert_eq!(h(&(1, 2, 3)), h(&(1, 2, 3)));
        assert_ne!(h(&(1, 2, 3)), h(&(1, 2, 4)));
        assert_ne!(h(&(1, 2, 3)), h(&(3, 2, 1)));
    }
}
