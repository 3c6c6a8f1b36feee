//! What the interposer counted in this process, and its own cost per launch; written as
//! JSON at exit when `MMK_KSCHED_STATS` names a file.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The entry points a launch can come through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    CuLaunchKernel,
    CuLaunchKernelEx,
    CuLaunchCooperativeKernel,
    CuGraphLaunch,
    CudaLaunchKernel,
    CudaLaunchKernelInternal,
    CudaLaunchKernelExC,
    CudaLaunchCooperativeKernel,
    CudaGraphLaunch,
}

impl Api {
    pub const ALL: [Api; 9] = [
        Api::CuLaunchKernel,
        Api::CuLaunchKernelEx,
        Api::CuLaunchCooperativeKernel,
        Api::CuGraphLaunch,
        Api::CudaLaunchKernel,
        Api::CudaLaunchKernelInternal,
        Api::CudaLaunchKernelExC,
        Api::CudaLaunchCooperativeKernel,
        Api::CudaGraphLaunch,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Api::CuLaunchKernel => "cuLaunchKernel",
            Api::CuLaunchKernelEx => "cuLaunchKernelEx",
            Api::CuLaunchCooperativeKernel => "cuLaunchCooperativeKernel",
            Api::CuGraphLaunch => "cuGraphLaunch",
            Api::CudaLaunchKernel => "cudaLaunchKernel",
            Api::CudaLaunchKernelInternal => "__cudaLaunchKernel",
            Api::CudaLaunchKernelExC => "cudaLaunchKernelExC",
            Api::CudaLaunchCooperativeKernel => "cudaLaunchCooperativeKernel",
            Api::CudaGraphLaunch => "cudaGraphLaunch",
        }
    }

    pub fn is_graph(self) -> bool {
        matches!(self, Api::CuGraphLaunch | Api::CudaGraphLaunch)
    }
}

/// The cuBLAS entry points the interposer exports (`blas`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Blas {
    Sgemm,
    GemmEx,
    LtMatmul,
}

impl Blas {
    pub const ALL: [Blas; 3] = [Blas::Sgemm, Blas::GemmEx, Blas::LtMatmul];

    pub fn name(self) -> &'static str {
        match self {
            Blas::Sgemm => "cublasSgemm_v2",
            Blas::GemmEx => "cublasGemmEx",
            Blas::LtMatmul => "cublasLtMatmul",
        }
    }
}

/// Histogram buckets: 10 ns wide up to 100 us; the last one holds the rest.
const BUCKET_NS: u64 = 10;
const BUCKETS: usize = 10_000;

#[derive(Debug)]
pub struct Stats {
    by_api: [AtomicU64; Api::ALL.len()],
    /// Launches that failed in the driver (not counted as launched).
    pub failed: AtomicU64,
    pub held: AtomicU64,
    pub held_ns: AtomicU64,
    pub forced: AtomicU64,
    /// Hooks that could not be installed because a table was full.
    pub overflow: AtomicU64,
    /// Launches whose completion could not be tracked (no event).
    pub untracked: AtomicU64,
    /// Events recorded to track completions (a launch shortly after another on its stream
    /// shares the next one: `crate::track`), and launches counted complete when their
    /// stream's last event completed, no event behind them.
    pub events: AtomicU64,
    pub early: AtomicU64,
    /// Launches recorded into a graph under stream capture (not counted as launched: they
    /// run inside a later graph launch).
    pub captured: AtomicU64,
    /// Streams the process created through the interposer, and how many of them got the
    /// greatest priority (which `stream_priority` holds).
    pub streams_created: AtomicU64,
    pub streams_raised: AtomicU64,
    pub stream_priority: AtomicI64,
    /// GEMM calls by entry point; calls cut into pieces, the pieces, and calls over the
    /// limit that could not be cut.
    gemm_calls: [AtomicU64; Blas::ALL.len()],
    gemm_cut: AtomicU64,
    gemm_pieces: AtomicU64,
    gemm_uncut: AtomicU64,
    /// Launches preceded by a device wait, waits the driver refused, and times this
    /// process opened the device word by force (`device`).
    pub device_waits: AtomicU64,
    pub device_wait_failed: AtomicU64,
    pub device_forced: AtomicU64,
    hook_ns: Box<[AtomicU64]>,
    hook_ns_sum: AtomicU64,
    hook_ns_max: AtomicU64,
}

impl Stats {
    pub fn new() -> Stats {
        Stats {
            by_api: std::array::from_fn(|_| AtomicU64::new(0)),
            failed: AtomicU64::new(0),
            held: AtomicU64::new(0),
            held_ns: AtomicU64::new(0),
            forced: AtomicU64::new(0),
            overflow: AtomicU64::new(0),
            untracked: AtomicU64::new(0),
            events: AtomicU64::new(0),
            early: AtomicU64::new(0),
            captured: AtomicU64::new(0),
            streams_created: AtomicU64::new(0),
            streams_raised: AtomicU64::new(0),
            stream_priority: AtomicI64::new(0),
            gemm_calls: std::array::from_fn(|_| AtomicU64::new(0)),
            gemm_cut: AtomicU64::new(0),
            gemm_pieces: AtomicU64::new(0),
            gemm_uncut: AtomicU64::new(0),
            device_waits: AtomicU64::new(0),
            device_wait_failed: AtomicU64::new(0),
            device_forced: AtomicU64::new(0),
            hook_ns: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
            hook_ns_sum: AtomicU64::new(0),
            hook_ns_max: AtomicU64::new(0),
        }
    }

    #[inline]
    pub fn launched(&self, api: Api) {
        self.by_api[api as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn launches(&self) -> u64 {
        self.by_api.iter().map(|c| c.load(Ordering::Relaxed)).sum()
    }

    pub fn gemm_call(&self, api: Blas) {
        self.gemm_calls[api as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// A GEMM call ran as `pieces` pieces.
    pub fn gemm_cut(&self, pieces: u64) {
        self.gemm_cut.fetch_add(1, Ordering::Relaxed);
        self.gemm_pieces.fetch_add(pieces, Ordering::Relaxed);
    }

    /// A GEMM call over the limit ran whole: its shape, type or epilogue is not cut.
    pub fn gemm_uncut(&self) {
        self.gemm_uncut.fetch_add(1, Ordering::Relaxed);
    }

    /// Record the interposer's own time for one launch (not counting time held).
    #[inline]
    pub fn hook_time(&self, ns: u64) {
        let bucket = usize::try_from(ns / BUCKET_NS).map_or(BUCKETS - 1, |b| b.min(BUCKETS - 1));
        self.hook_ns[bucket].fetch_add(1, Ordering::Relaxed);
        self.hook_ns_sum.fetch_add(ns, Ordering::Relaxed);
        self.hook_ns_max.fetch_max(ns, Ordering::Relaxed);
    }

    /// The hook-time quantile `q` in ns (the upper edge of its bucket).
    fn quantile(&self, counts: &[u64], total: u64, q: f64) -> u64 {
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &c) in counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return (i as u64 + 1) * BUCKET_NS;
            }
        }
        BUCKETS as u64 * BUCKET_NS
    }

    /// The JSON document (one object). `streams` is the stream-priority mode;
    /// `device_error` why the device wait is off, when it was tried.
    #[allow(clippy::too_many_arguments)]
    pub fn to_json(
        &self,
        pid: u32,
        class: &str,
        policy: &str,
        gate: bool,
        kernels: u64,
        streams: &str,
        device_error: Option<&str>,
    ) -> String {
        let mut s = String::new();
        let _ = write!(
            s,
            "{{\"pid\":{pid},\"class\":\"{class}\",\"policy\":\"{policy}\",\"gate\":{gate},\"launches\":{},\"by_api\":{{",
            self.launches()
        );
        for (i, api) in Api::ALL.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            let _ = write!(
                s,
                "{sep}\"{}\":{}",
                api.name(),
                self.by_api[i].load(Ordering::Relaxed)
            );
        }
        let counts: Vec<u64> = self
            .hook_ns
            .iter()
            .map(|c| c.load(Ordering::Relaxed))
            .collect();
        let timed: u64 = counts.iter().sum();
        let (p50, p99) = if timed == 0 {
            (0, 0)
        } else {
            (
                self.quantile(&counts, timed, 0.50),
                self.quantile(&counts, timed, 0.99),
            )
        };
        let mean = self.hook_ns_sum.load(Ordering::Relaxed) / timed.max(1);
        let gemm: String = Blas::ALL
            .iter()
            .map(|api| {
                format!(
                    "\"{}\":{},",
                    api.name(),
                    self.gemm_calls[*api as usize].load(Ordering::Relaxed)
                )
            })
            .collect();
        let _ = write!(
            s,
            "}},\"kernels\":{kernels},\"failed\":{},\"held\":{},\"held_ns\":{},\"forced\":{},\"overflow\":{},\"untracked\":{},\"tracking\":{{\"events\":{},\"early\":{}}},\"captured\":{},\"streams\":{{\"mode\":\"{streams}\",\"created\":{},\"raised\":{},\"priority\":{}}},\"gemm\":{{{gemm}\"cut\":{},\"pieces\":{},\"uncut\":{}}},\"device\":{{\"waits\":{},\"failed\":{},\"forced\":{},\"error\":{}}},\"hook_ns\":{{\"timed\":{timed},\"mean\":{mean},\"p50\":{p50},\"p99\":{p99},\"max\":{}}}}}",
            self.failed.load(Ordering::Relaxed),
            self.held.load(Ordering::Relaxed),
            self.held_ns.load(Ordering::Relaxed),
            self.forced.load(Ordering::Relaxed),
            self.overflow.load(Ordering::Relaxed),
            self.untracked.load(Ordering::Relaxed),
            self.events.load(Ordering::Relaxed),
            self.early.load(Ordering::Relaxed),
            self.captured.load(Ordering::Relaxed),
            self.streams_created.load(Ordering::Relaxed),
            self.streams_raised.load(Ordering::Relaxed),
            self.stream_priority.load(Ordering::Relaxed),
            self.gemm_cut.load(Ordering::Relaxed),
            self.gemm_pieces.load(Ordering::Relaxed),
            self.gemm_uncut.load(Ordering::Relaxed),
            self.device_waits.load(Ordering::Relaxed),
            self.device_wait_failed.load(Ordering::Relaxed),
            self.device_forced.load(Ordering::Relaxed),
            device_error.map_or_else(
                || "null".to_owned(),
                |e| serde_json::to_string(e).unwrap_or_else(|_| "null".to_owned())
            ),
            self.hook_ns_max.load(Ordering::Relaxed),
        );
        s
    }
}

/// `CLOCK_MONOTONIC` in ns: the clock trace lines and the gate use, comparable across
/// processes.
pub use mmk_kernel_sched::monotonic_ns as now_ns;
