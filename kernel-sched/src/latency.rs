//! What an online process's requests take on the GPU: a histogram of its busy periods.
//!
//! A busy period runs from the launch that finds none of the process's kernels in flight to
//! the completion that leaves none: for a service that replays one CUDA graph per request,
//! each request's time on the GPU (its queueing behind its own earlier requests included);
//! for an eager service, each stretch in which its kernels kept the GPU busy. The gate
//! counts them per slot in [`BUCKETS`] buckets, four to an octave (each bucket's upper edge
//! is 19 % above its lower one), from 8 us to about 7 s; mmkd reads the counts, diffs them
//! and takes quantiles over a window ([`quantile`]).

/// Buckets of a latency histogram.
pub const BUCKETS: usize = 80;
/// Buckets per doubling of the latency.
const PER_OCTAVE: usize = 4;
/// The upper edge of bucket 0, in ns.
const FIRST_NS: u64 = 8_000;

/// The bucket a busy period of `ns` falls in (the last one for anything longer).
#[inline]
pub fn bucket_of(ns: u64) -> usize {
    if ns <= FIRST_NS {
        return 0;
    }
    // log2(ns / FIRST_NS) in quarter octaves, rounded up: the upper edge is the first one
    // at or above `ns`.
    let ratio = ns as f64 / FIRST_NS as f64;
    let quarters = (ratio.log2() * PER_OCTAVE as f64).ceil();
    if quarters.is_finite() && quarters < (BUCKETS - 1) as f64 {
        quarters.max(0.0) as usize
    } else {
        BUCKETS - 1
    }
}

/// The upper edge of bucket `i`, in ns: every period it counts is at most this long.
pub fn upper_ns(i: usize) -> u64 {
    let i = i.min(BUCKETS - 1);
    (FIRST_NS as f64 * 2f64.powf(i as f64 / PER_OCTAVE as f64)).round() as u64
}

/// Periods counted in `hist`.
pub fn count(hist: &[u64]) -> u64 {
    hist.iter().fold(0u64, |a, b| a.saturating_add(*b))
}

/// The `q` quantile (0 to 1) of the periods in `hist`, as the upper edge of the bucket it
/// falls in (so at most 19 % above the true value); `None` when `hist` is empty.
pub fn quantile(hist: &[u64], q: f64) -> Option<u64> {
    let total = count(hist);
    if total == 0 {
        return None;
    }
    // The rank of the quantile, 1-based: the smallest bucket whose running count reaches it.
    let rank = ((q.clamp(0.0, 1.0) * total as f64).ceil() as u64).max(1);
    let mut seen = 0u64;
    for (i, n) in hist.iter().enumerate() {
        seen = seen.saturating_add(*n);
        if seen >= rank {
            return Some(upper_ns(i));
        }
    }
    Some(upper_ns(hist.len().saturating_sub(1)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_period_falls_at_or_below_its_buckets_upper_edge_and_above_the_one_before() {
        for ns in [
            1,
            8_000,
            8_001,
            9_500,
            50_000,
            1_000_000,
            5_300_000,
            123_456_789,
        ] {
            let b = bucket_of(ns);
            assert!(
                ns <= upper_ns(b),
                "{ns} in bucket {b} of edge {}",
                upper_ns(b)
            );
            if b > 0 {
                assert!(ns > upper_ns(b - 1), "{ns} belongs below bucket {b}");
            }
        }
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        assert!(upper_ns(BUCKETS - 1) > 6_000_000_000);
    }

    #[test]
    fn the_p99_of_a_hundred_periods_is_the_slowest_ones_bucket() {
        let mut hist = vec![0u64; BUCKETS];
        for _ in 0..99 {
            hist[bucket_of(2_000_000)] += 1;
        }
        hist[bucket_of(40_000_000)] += 1;
        let p99 = quantile(&hist, 0.99).unwrap();
        assert!((2_000_000..2_400_000).contains(&p99), "{p99}");
        let max = quantile(&hist, 1.0).unwrap();
        assert!((40_000_000..48_000_000).contains(&max), "{max}");
        assert_eq!(quantile(&vec![0; BUCKETS], 0.99), None);
        assert_eq!(count(&hist), 100);
    }
}
