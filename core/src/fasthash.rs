//! A multiply-rotate hash (FxHash's) for maps whose keys come from this process: launch
//! shapes in the interposer, encoded features and partition states in the planner. The
//! standard SipHash resists hash flooding, which keys we make ourselves do not need, and
//! it costs several times more per key.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};

#[derive(Debug, Default, Clone, Copy)]
pub struct FastHasher(u64);

impl Hasher for FastHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.write_u64(u64::from_le_bytes(b));
        }
        for &b in words.remainder() {
            self.write_u64(u64::from(b));
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }
    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// A `HashMap` with [`FastHasher`].
pub type FastMap<K, V> = HashMap<K, V, BuildHasherDefault<FastHasher>>;

/// A `HashSet` with [`FastHasher`].
pub type FastSet<K> = HashSet<K, BuildHasherDefault<FastHasher>>;

#[cfg(test)]
mod tests {
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
        let h = |v: &[u8]| {
            let mut h = FastHasher::default();
            h.write(v);
            h.finish()
        };
        // Whole words and the bytes after them both count.
        assert_ne!(
            h(&[0, 0, 0, 0, 0, 0, 0, 1, 5]),
            h(&[0, 0, 0, 0, 0, 0, 0, 1, 6])
        );
        assert_ne!(h(&[0, 0, 0, 0, 0, 0, 0, 1]), h(&[0, 0, 0, 0, 0, 0, 0, 2]));
    }
}
