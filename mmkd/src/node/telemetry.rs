//! The latencies the node records as it works, which `mmkd --metrics` serves.

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// The latencies mmkd records as it works, from its start.
#[derive(Debug)]
pub struct NodeMetrics {
    /// One planning run (seconds).
    pub planning: Histogram,
    /// One MIG step: creating or destroying an instance (seconds).
    pub reconfiguration: Histogram,
    /// One job state change written to the node store (seconds).
    pub store_write: Histogram,
    /// From a job's end, as the runner saw it, to its state recorded (seconds).
    pub exit_record: Histogram,
}

impl Default for NodeMetrics {
    fn default() -> NodeMetrics {
        NodeMetrics {
            // 50 us to about 1.6 s.
            planning: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            // 1 ms to about 33 s.
            reconfiguration: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
            // 50 us to about 1.6 s.
            store_write: Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
            // 1 ms to about 33 s; 0.032 and 0.064 s on either side of 50 ms.
            exit_record: Histogram::new(exponential_buckets(0.001, 2.0, 16)),
        }
    }
}

impl NodeMetrics {
    /// Records the time since `started` in `h`.
    pub fn since(h: &Histogram, started: std::time::Instant) {
        h.observe(started.elapsed().as_secs_f64());
    }
}
