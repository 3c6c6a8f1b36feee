//! The sampler: one thread that reads the gate slots of every watched job at jittered
//! times and reports what it saw (see the module docs of [`crate::learn`]).
//!
//! A slot belongs to a job when its process's environment holds the job's `MMK_JOB_ID`
//! and the process runs as the user the job's processes run as; a slot of any other
//! process is not counted. The gate is shared with the job processes, which may write
//! anything in it: every value read is bounded before it is used (demand at most the
//! GPU's SMs, counters only forward).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mmk_core::JobClass;
use mmk_kernel_sched::Class;
use mmk_kernel_sched::gate::{GateFile, SlotStats, process_alive};
use mmk_kernel_sched::latency::BUCKETS;
use tokio::sync::mpsc;
use tracing::debug;

use super::{HIST_BINS, MIN_SAMPLES, Observed, SLOW_MIN_KERNELS, Seen};

/// What a watched job has seen is reported at least this often.
pub const FLUSH: Duration = Duration::from_secs(10);
/// Samples are this far apart on average (uniformly 1 to 3 ms).
const MEAN_PERIOD_US: u64 = 2000;
/// Slots of processes that died are dropped this often.
const REAP_EVERY: Duration = Duration::from_secs(1);
/// A learned job untracked this long is tracked again for a window (see
/// [`Sampler::sample`]): its GPU time per launch, its profile and the watch for slow runs
/// get fresh measurements.
pub const RETRACK_EVERY: Duration = Duration::from_secs(120);
/// A window of tracking lasts [`MIN_SAMPLES`] samples (about 3 s) and [`SLOW_MIN_KERNELS`]
/// completed kernels, or at most this long after its first completed kernel.
const WINDOW_MAX: Duration = Duration::from_secs(30);
/// GPU time per launch is taken from this run once it has tracked this many launches
/// (before, from the job's learned profile).
const MIN_TRACKED_LAUNCHES: u64 = 1000;

/// How often the sampler does its periodic work. mmkd runs on [`Periods::default`]; a test
/// shortens them instead of waiting seconds for a report or a reading of the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Periods {
    /// What a watched job has seen is reported at least this often.
    pub flush: Duration,
    /// Slots of processes that died are dropped this often.
    pub reap: Duration,
    /// The device (memory per process, bandwidth per partition) is read this often.
    pub device: Duration,
    /// A learned job untracked this long is tracked again ...
    pub retrack: Duration,
    /// ... for this many samples.
    pub retrack_samples: u64,
}

impl Default for Periods {
    fn default() -> Periods {
        Periods {
            flush: FLUSH,
            reap: REAP_EVERY,
            device: DEVICE_EVERY,
            retrack: RETRACK_EVERY,
            retrack_samples: MIN_SAMPLES,
        }
    }
}
/// A gap between two samples longer than this (the thread was not scheduled) counts as
/// this much time.
const MAX_STEP: Duration = Duration::from_millis(50);
/// The GPU time estimated for a process's counted launches may run this far ahead of the
/// wall time it has been counted only (launches queue work that runs later).
const ESTIMATE_AHEAD_NS: u64 = 50_000_000;

/// Counters of one process as last read, and when.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    launches: u64,
    completed: u64,
    busy_ns: u64,
    held_ns: u64,
    held: u64,
    /// Since when its launches are counted only, and the GPU time estimated for them since.
    counting: Option<(Instant, u64)>,
    /// Its busy periods by length, as last read (online processes).
    busy_hist: Option<[u32; BUCKETS]>,
}

/// What an online job's requests took on the GPU over its run, as its slots' busy-period
/// histograms counted them ([`mmk_kernel_sched::latency`]): all of them, and those seen
/// while no offline process was in its gate (the job alone in its partition). Counts only
/// grow; the SLO control takes differences.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Latency {
    /// Its partition's gate.
    pub gate: PathBuf,
    pub hist: Vec<u64>,
    pub alone: Vec<u64>,
    /// An offline process was in its gate at the last sample.
    pub offline_beside: bool,
}

impl Latency {
    fn new(gate: PathBuf) -> Latency {
        Latency {
            gate,
            hist: vec![0; BUCKETS],
            alone: vec![0; BUCKETS],
            offline_beside: false,
        }
    }
}

/// The most busy periods one bucket of a slot may add between two samples: a job writes
/// its own slot, and a count that jumps further is not a measurement.
const MAX_PERIODS_PER_SAMPLE: u64 = 100_000;

/// What a job's processes did in its gate over its run, as sampled: GPU time attributed to
/// it (time with kernels in flight), launches, and launches the gate held and for how long.
/// A process that ends between two samples loses what it did since the last one (at most
/// 3 ms). While a job's launches are counted only (untracked), its GPU time grows by its
/// GPU time per launch (`Watched::ns_per_launch`) for each.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct JobTotals {
    pub kernel_ns: u64,
    pub launches: u64,
    pub held: u64,
    pub held_ns: u64,
    /// Online jobs: time (sampled) their kernels were in flight while offline kernels of
    /// their partition were too.
    pub beside_offline_ns: u64,
}

/// How long the totals of a run that ended stay readable (for a scrape after its end).
pub const ENDED_KEPT: Duration = Duration::from_secs(300);

/// What to sample for a running job.
#[derive(Debug, Clone)]
pub struct Watch {
    pub signature: String,
    pub owner_uid: Option<u32>,
    pub name: String,
    pub class: JobClass,
    /// Its partition's gate.
    pub gate: PathBuf,
    /// Its partition: the GPU, and the GPU instance with MIG on (as
    /// [`Readings::bandwidth`] names them), and the partition's share of the GPU's memory
    /// slices (and so of its DRAM bandwidth).
    pub partition: (u32, Option<u32>),
    pub partition_mem_frac: f64,
    pub gpu_sms: u32,
    /// The uid its processes run as.
    pub uid: u32,
    /// Its signature had a confident learned profile when this run started.
    pub learned: bool,
    /// That profile's GPU time per launch, in ns (`Observed::kernel_us`).
    pub learned_ns_per_launch: Option<f64>,
    /// Never untracked: its requests' latency is measured for the SLO control.
    pub keep_tracked: bool,
}

#[derive(Debug)]
struct Watched {
    watch: Watch,
    observed: Observed,
    /// Last counters seen per process.
    counters: HashMap<u32, Counters>,
    /// The job's processes in its gate at the last sample.
    in_gate: Vec<u32>,
    /// What the job's processes did over its runs (`mmkd --metrics`, `mmkctl top`).
    totals: JobTotals,
    last_sample: Option<Instant>,
    last_flush: Instant,
    /// The job's first report of this run counts the run.
    counted_run: bool,
    /// Since the last reading of the device: whether its processes were alone in its gate
    /// at every sample that found them there (`None`: no sample did).
    alone: Option<bool>,
    /// This run's launches were counted, and whether any was seen to end: a gate that
    /// tracks nothing (`passthrough`) counts launches but never their ends, and a job
    /// sampled there would look as if it asked for no SMs.
    launched: bool,
    tracked: bool,
    /// Samples of this run that went into its profile.
    run_samples: u64,
    /// Asked to stop tracking its launches (see [`Sampler::sample`]): its profile is
    /// learned, and its gate holds nothing.
    untracked: bool,
    /// It was untracked over the time since the last sample.
    counted_only: bool,
    /// Since when it is untracked.
    untracked_since: Option<Instant>,
    /// A window in which it is tracked though learned, open since then.
    window: Option<Window>,
    /// Completions of this run seen while tracked.
    run_completed: u64,
    /// This run's GPU time and launches while tracked.
    tracked_busy_ns: u64,
    tracked_launches: u64,
    /// Online jobs: its requests' time on the GPU over this run.
    latency: Option<Latency>,
}

/// Where a window of tracking began: this run's samples and completions then, and when
/// it first saw a kernel complete.
#[derive(Debug, Clone, Copy)]
struct Window {
    samples: u64,
    completed: u64,
    first_kernel: Option<Instant>,
}

impl Watched {
    /// Adds what a slot of the job's counted since the last sample: launches, completions,
    /// GPU time (measured while tracked, estimated per launch while counted only) and
    /// holds.
    fn count(&mut self, slot: &SlotStats, now: Instant, offline_beside: bool) {
        let per_launch = self.ns_per_launch().unwrap_or(0.0);
        let last = self.counters.entry(slot.pid).or_default();
        if let Some(latency) = &mut self.latency {
            latency.offline_beside = offline_beside;
            let before = last.busy_hist.replace(slot.busy_hist);
            for (i, &n) in slot.busy_hist.iter().enumerate() {
                // Counts wrap; a slot taken anew starts from zero.
                let d = match before {
                    Some(b) if n >= b[i] => u64::from(n - b[i]),
                    Some(b) if b[i] - n > u32::MAX / 2 => u64::from(n.wrapping_sub(b[i])),
                    _ => u64::from(n),
                }
                .min(MAX_PERIODS_PER_SAMPLE);
                latency.hist[i] = latency.hist[i].saturating_add(d);
                if !offline_beside {
                    latency.alone[i] = latency.alone[i].saturating_add(d);
                }
            }
        }
        // Counters start again when a slot is taken anew: only forward.
        let forward = |last: &mut u64, now: u64| {
            let d = if now >= *last { now - *last } else { now };
            *last = now;
            d
        };
        let launches = forward(&mut last.launches, slot.launches);
        let completed = forward(&mut last.completed, slot.completed);
        if !self.counted_only {
            // A profile's launch interval and kernel time are over sampled time.
            self.observed.launches = self.observed.launches.saturating_add(launches);
            self.observed.completed = self.observed.completed.saturating_add(completed);
            self.run_completed = self.run_completed.saturating_add(completed);
        }
        self.launched |= launches > 0;
        self.tracked |= completed > 0;
        // A job writes its own slot: counters that jump add up saturating.
        self.totals.launches = self.totals.launches.saturating_add(launches);
        // Busy time comes from tracked launches only, also when it is credited
        // after the window closed (at the end of a busy stretch).
        let busy_ns = forward(&mut last.busy_ns, slot.busy_ns);
        self.totals.kernel_ns = self.totals.kernel_ns.saturating_add(busy_ns);
        self.tracked_busy_ns = self.tracked_busy_ns.saturating_add(busy_ns);
        if self.counted_only {
            // Counted, not tracked: each the GPU time a launch takes; all of them
            // together at most the time this process has been counted only (a
            // float cast saturates).
            let (since, so_far) = last.counting.get_or_insert((now, 0));
            let wall = u64::try_from(now.duration_since(*since).as_nanos())
                .unwrap_or(u64::MAX)
                .saturating_add(ESTIMATE_AHEAD_NS);
            let estimate =
                ((launches as f64 * per_launch) as u64).min(wall.saturating_sub(*so_far));
            *so_far = so_far.saturating_add(estimate);
            self.totals.kernel_ns = self.totals.kernel_ns.saturating_add(estimate);
        } else {
            last.counting = None;
            self.tracked_launches = self.tracked_launches.saturating_add(launches);
        }
        self.totals.held_ns = self
            .totals
            .held_ns
            .saturating_add(forward(&mut last.held_ns, slot.held_ns));
        self.totals.held = self
            .totals
            .held
            .saturating_add(forward(&mut last.held, slot.held));
    }

    fn window(&self) -> Window {
        Window {
            samples: self.run_samples,
            completed: self.run_completed,
            first_kernel: None,
        }
    }

    /// Whether its launches are to be counted only from now on: its profile is learned
    /// (confident when the run started, or [`MIN_SAMPLES`] of this run with
    /// [`SLOW_MIN_KERNELS`] kernels seen to complete, which give its GPU time per launch),
    /// nothing waits on its completions (`may`), and no window of tracking is open. A
    /// window opens at the start of an offline job's run (the watch for slow runs compares
    /// it with its profile) and whenever it has been untracked for `periods.retrack`; it
    /// lasts until it has taken `periods.retrack_samples` samples and seen
    /// [`SLOW_MIN_KERNELS`] kernels complete, or [`WINDOW_MAX`] after its first one (a job
    /// that launches nothing stays tracked, at no cost).
    fn untrack(&mut self, may: bool, now: Instant, periods: &Periods) -> bool {
        let learned = self.watch.learned
            || (self.run_samples >= MIN_SAMPLES && self.run_completed >= SLOW_MIN_KERNELS);
        if !may || !learned {
            self.untracked_since = None;
            return false;
        }
        if let Some(w) = &mut self.window {
            if w.first_kernel.is_none() && self.run_completed > w.completed {
                w.first_kernel = Some(now);
            }
            let measured = self.run_samples >= w.samples.saturating_add(periods.retrack_samples)
                && self.run_completed >= w.completed.saturating_add(SLOW_MIN_KERNELS);
            let long = w
                .first_kernel
                .is_some_and(|t| now.duration_since(t) >= WINDOW_MAX);
            if !measured && !long {
                return false;
            }
            self.window = None;
        }
        match self.untracked_since {
            Some(since) if now.duration_since(since) >= periods.retrack => {
                self.untracked_since = None;
                self.window = Some(self.window());
                false
            }
            Some(_) => true,
            None => {
                self.untracked_since = Some(now);
                true
            }
        }
    }

    /// GPU time per launch, in ns: this run's over its tracked time, once it has tracked
    /// [`MIN_TRACKED_LAUNCHES`], else its learned profile's kernel time, else this run's so
    /// far.
    fn ns_per_launch(&self) -> Option<f64> {
        let run = (self.tracked_launches > 0)
            .then(|| self.tracked_busy_ns as f64 / self.tracked_launches as f64);
        if self.tracked_launches >= MIN_TRACKED_LAUNCHES {
            run
        } else {
            self.watch.learned_ns_per_launch.or(run)
        }
    }
}

#[derive(Debug, Default)]
struct Shared {
    jobs: Mutex<HashMap<u64, Watched>>,
    /// Totals of jobs that ended, with when, for [`ENDED_KEPT`].
    ended: Mutex<HashMap<u64, (Instant, JobTotals)>>,
    /// Totals of jobs whose run ended and that wait to run again (requeued after a
    /// failure, a move or a preemption): their next run adds to them.
    carried: Mutex<HashMap<u64, JobTotals>>,
    wake: Condvar,
    stop: AtomicBool,
    /// The latest reading of the device, not yet applied: read on a thread of its own, so
    /// that a slow driver does not hold up the samples.
    readings: Mutex<Option<Readings>>,
}

/// The sampler thread and how to tell it which jobs run.
#[derive(Clone)]
pub struct Sampler {
    shared: Arc<Shared>,
    reports: mpsc::UnboundedSender<Seen>,
    identify: Identify,
    device: Option<ReadDevice>,
    periods: Periods,
}

impl std::fmt::Debug for Sampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampler")
            .field("device", &self.device.is_some())
            .field("periods", &self.periods)
            .finish_non_exhaustive()
    }
}

/// Who a process is: the job id its environment names and the uid it runs as.
pub type Identify = fn(pid: u32) -> Option<(u64, u32)>;

/// What the GPU backend says, read once a second.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Readings {
    /// GPU memory held per process, as (pid, bytes).
    pub memory: Vec<(u32, u64)>,
    /// The share of each partition's DRAM bandwidth used since the last reading, as (GPU,
    /// GPU instance with MIG on, fraction).
    pub bandwidth: Vec<(u32, Option<u32>, f64)>,
}

/// Reads the device: the GPU backend's `process_memory` and `dram_bandwidth`.
pub type ReadDevice = Arc<dyn Fn() -> Readings + Send + Sync>;

/// How often the device is read (by default).
const DEVICE_EVERY: Duration = Duration::from_secs(1);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Sampler {
    /// Starts the thread; what it sees comes out of the receiver.
    /// `device`: where the processes' GPU memory and the partitions' bandwidth are read
    /// from (the GPU backend), if anywhere.
    pub fn start(
        device: Option<ReadDevice>,
    ) -> (Sampler, mpsc::UnboundedReceiver<Seen>, JoinHandle<()>) {
        Sampler::start_with(identify, device, Periods::default())
    }

    fn start_with(
        identify: Identify,
        device: Option<ReadDevice>,
        periods: Periods,
    ) -> (Sampler, mpsc::UnboundedReceiver<Seen>, JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let sampler = Sampler {
            shared: Arc::default(),
            reports: tx,
            identify,
            device,
            periods,
        };
        let running = sampler.clone();
        let handle = std::thread::Builder::new()
            .name("mmk-sampler".into())
            .spawn(move || running.run())
            .expect("a thread can be started at mmkd's start");
        if let Some(read) = sampler.device.clone() {
            let shared = Arc::clone(&sampler.shared);
            // A reader that cannot start leaves profiles without memory and bandwidth,
            // nothing else.
            let _ = std::thread::Builder::new()
                .name("mmk-device".into())
                .spawn(move || read_device(&shared, &read, periods.device));
        }
        (sampler, rx, handle)
    }

    /// Sample job `job` from now on (its run has started).
    pub fn watch(&self, job: u64, watch: Watch) {
        let now = Instant::now();
        let totals = lock(&self.shared.carried).remove(&job).unwrap_or_default();
        lock(&self.shared.jobs).insert(
            job,
            Watched {
                observed: Observed::default(),
                launched: false,
                tracked: false,
                run_samples: 0,
                untracked: false,
                counted_only: false,
                untracked_since: None,
                // An offline run starts tracked, for the watch for slow runs.
                window: (watch.class == JobClass::Offline).then_some(Window {
                    samples: 0,
                    completed: 0,
                    first_kernel: None,
                }),
                run_completed: 0,
                tracked_busy_ns: 0,
                tracked_launches: 0,
                latency: (watch.class == JobClass::Online)
                    .then(|| Latency::new(watch.gate.clone())),
                counters: HashMap::new(),
                in_gate: Vec::new(),
                totals,
                last_sample: None,
                last_flush: now,
                counted_run: false,
                alone: None,
                watch,
            },
        );
        self.shared.wake.notify_one();
    }

    /// Stop sampling job `job` (its run has ended) and report what is left. A job that
    /// `ended` keeps its totals readable for [`ENDED_KEPT`]; one that will run again
    /// carries them into its next run.
    pub fn unwatch(&self, job: u64, ended: bool) {
        let gone = lock(&self.shared.jobs).remove(&job);
        if let Some(mut w) = gone {
            self.report(job, &mut w);
            if ended {
                let mut kept = lock(&self.shared.ended);
                kept.retain(|_, (at, _)| at.elapsed() < ENDED_KEPT);
                kept.insert(job, (Instant::now(), w.totals));
            } else {
                lock(&self.shared.carried).insert(job, w.totals);
            }
        } else if ended && let Some(t) = lock(&self.shared.carried).remove(&job) {
            // Ended while it waited to run again.
            lock(&self.shared.ended).insert(job, (Instant::now(), t));
        }
    }

    /// What each job's processes did over all its runs: jobs that run now, that wait to
    /// run again, and that ended within [`ENDED_KEPT`].
    pub fn totals(&self) -> HashMap<u64, JobTotals> {
        let mut all: HashMap<u64, JobTotals> = lock(&self.shared.ended)
            .iter()
            .filter(|(_, (at, _))| at.elapsed() < ENDED_KEPT)
            .map(|(id, (_, t))| (*id, *t))
            .collect();
        all.extend(lock(&self.shared.carried).iter().map(|(id, t)| (*id, *t)));
        all.extend(
            lock(&self.shared.jobs)
                .iter()
                .map(|(id, w)| (*id, w.totals)),
        );
        all
    }

    /// What each running online job's requests took on the GPU over its run (see
    /// [`Latency`]).
    pub fn latencies(&self) -> HashMap<u64, Latency> {
        lock(&self.shared.jobs)
            .iter()
            .filter_map(|(id, w)| Some((*id, w.latency.clone()?)))
            .collect()
    }

    /// Report and forget every watched job (mmkd is stopping).
    pub fn unwatch_all(&self) {
        let all: Vec<(u64, Watched)> = lock(&self.shared.jobs).drain().collect();
        for (job, mut w) in all {
            self.report(job, &mut w);
        }
        lock(&self.shared.carried).clear();
    }

    pub fn stop(&self) {
        // Under the jobs' lock, which the sampler holds from its look at `stop` until it
        // waits: the wakeup cannot fall between the two.
        let _jobs = lock(&self.shared.jobs);
        self.shared.stop.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }

    fn report(&self, job: u64, w: &mut Watched) {
        if w.observed.samples == 0 {
            return;
        }
        let mut observed = std::mem::take(&mut w.observed);
        if !w.counted_run {
            observed.runs = 1;
            w.counted_run = true;
        }
        w.last_flush = Instant::now();
        // The receiver goes away only at shutdown.
        let _ = self.reports.send(Seen {
            job,
            signature: w.watch.signature.clone(),
            owner_uid: w.watch.owner_uid,
            name: w.watch.name.clone(),
            class: w.watch.class,
            observed,
        });
    }

    fn run(self) {
        let mut gates: HashMap<PathBuf, GateFile> = HashMap::new();
        let mut owners: HashMap<u32, Option<(u64, u32)>> = HashMap::new();
        let mut rng = Jitter::new();
        let mut last_reap = Instant::now();
        loop {
            {
                let mut jobs = lock(&self.shared.jobs);
                while jobs.is_empty() && !self.shared.stop.load(Ordering::Acquire) {
                    gates.clear();
                    owners.clear();
                    jobs = self
                        .shared
                        .wake
                        .wait(jobs)
                        .unwrap_or_else(PoisonError::into_inner);
                }
            }
            if self.shared.stop.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(Duration::from_micros(rng.period_us()));
            let readings = lock(&self.shared.readings).take();
            let mut jobs = lock(&self.shared.jobs);
            self.sample(&mut jobs, &mut gates, &mut owners);
            if let Some(r) = readings {
                peak_memory(&mut jobs, &r.memory);
                bandwidth(&mut jobs, &r.bandwidth);
            }
            if last_reap.elapsed() >= self.periods.reap {
                // A process that died with kernels in flight would look busy while its
                // slot stays in the gate (mmkd never writes slots; the gate's own
                // processes drop it): it belongs to no job once it is gone.
                owners.retain(|pid, _| process_alive(*pid));
                last_reap = Instant::now();
            }
            let due: Vec<u64> = jobs
                .iter()
                .filter(|(_, w)| w.last_flush.elapsed() >= self.periods.flush)
                .map(|(id, _)| *id)
                .collect();
            for id in due {
                if let Some(w) = jobs.get_mut(&id) {
                    self.report(id, w);
                }
            }
        }
    }

    /// The watched job each slot of a gate belongs to (see inside).
    fn slot_owners(
        &self,
        slots: &[SlotStats],
        jobs: &HashMap<u64, Watched>,
        owners: &mut HashMap<u32, Option<(u64, u32)>>,
        (path, gate_uid): (&PathBuf, u32),
    ) -> Vec<Option<u64>> {
        // The watched job each slot belongs to: the job its process names, when that
        // job is placed in this gate's partition and the process runs as the job's
        // user, who owns the gate. A slot that names a process of another user, or of
        // a job elsewhere, counts for nobody. One job's processes alone in the gate
        // leave it alone in its partition.
        slots
            .iter()
            .map(|slot| {
                let (job, uid) = (*owners
                    .entry(slot.pid)
                    .or_insert_with(|| (self.identify)(slot.pid)))?;
                jobs.get(&job)
                    .filter(|w| w.watch.uid == uid && uid == gate_uid && w.watch.gate == *path)
                    .map(|_| job)
            })
            .collect()
    }

    /// One sample of every watched job.
    ///
    /// A job stops being tracked once its profile is learned (it was confident when the
    /// run started, or this run has sampled [`MIN_SAMPLES`]), where its gate holds no
    /// offline launch (`GateConfig::waits_on_online`): its processes are asked to count
    /// their launches only, and it is not sampled while so. Tracking launches to their
    /// ends cost an eager service a p99 above plain MPS's on the GPU, its own and a
    /// training's beside it (docs/kernel-sched.md); where nothing waits on them, they
    /// buy only the profile, which is known, and GPU time, which is then estimated: each
    /// counted launch adds the job's GPU time per launch ([`Watched::ns_per_launch`]).
    /// Every [`RETRACK_EVERY`] it is tracked again for a window ([`Watched::untrack`]),
    /// which measures that time per launch, its profile and its kernel time afresh. An
    /// offline job is untracked only while no online process of its gate is tracked.
    fn sample(
        &self,
        jobs: &mut HashMap<u64, Watched>,
        gates: &mut HashMap<PathBuf, GateFile>,
        owners: &mut HashMap<u32, Option<(u64, u32)>>,
    ) {
        let now = Instant::now();
        for w in jobs.values_mut() {
            w.in_gate.clear();
        }
        gates.retain(|path, _| jobs.values().any(|w| &w.watch.gate == path));
        let mut seen_pids = Vec::new();
        // Per job with a process in its gate: the SMs its kernels in flight ask for, and
        // whether it has any.
        let mut state: HashMap<u64, (u64, bool)> = HashMap::new();
        // Gates with offline kernels in flight now.
        let mut offline_busy: Vec<PathBuf> = Vec::new();
        // Each gate once, in order.
        let paths: std::collections::BTreeSet<PathBuf> =
            jobs.values().map(|w| w.watch.gate.clone()).collect();
        for path in paths {
            // A gate made anew at the same path (the partition's next user) is opened anew.
            if gates.get(&path).is_some_and(|g| !g.is_at(&path)) {
                gates.remove(&path);
            }
            if !gates.contains_key(&path) {
                match GateFile::open(&path) {
                    Ok(g) => {
                        gates.insert(path.clone(), g);
                    }
                    Err(e) => {
                        debug!(gate = %path.display(), error = %e, "gate not readable yet");
                        continue;
                    }
                }
            }
            let Some(gate) = gates.get(&path) else {
                continue;
            };
            // A copy: whatever the job's processes write into their gate, mmkd reads it
            // as bounded values (or an error), never through a mapping.
            let snap = match gate.snapshot() {
                Ok(snap) => snap,
                Err(e) => {
                    debug!(gate = %path.display(), error = %e, "gate unreadable");
                    gates.remove(&path);
                    continue;
                }
            };
            let slots = snap.slots();
            let untrack_ok = !snap.config().waits_on_online();
            // An offline job is untracked only while no online process of its gate is
            // tracked (one being learned, or in a window): a tracked service beside an
            // untracked training is the pairing that measured worst (docs/planner.md).
            let online_tracked = slots
                .iter()
                .any(|s| s.class == Some(Class::Online) && !s.untracked);
            let slot_owners = self.slot_owners(&slots, jobs, owners, (&path, gate.owner_uid()));
            // Offline work in flight: of a job here, or of another live process (a dead
            // one's slot stays until the gate's processes drop it).
            if slots.iter().zip(&slot_owners).any(|(s, o)| {
                s.class == Some(Class::Offline)
                    && s.inflight > 0
                    && (o.is_some() || process_alive(s.pid))
            }) {
                offline_busy.push(path.clone());
            }
            // An offline process in the gate: an online job's requests are not alone.
            let offline_beside = slots.iter().zip(&slot_owners).any(|(s, o)| {
                s.class == Some(Class::Offline) && (o.is_some() || process_alive(s.pid))
            });
            let only = match slot_owners.split_first() {
                Some((first, rest)) if rest.iter().all(|o| o == first) => *first,
                _ => None,
            };
            for (slot, owner) in slots.into_iter().zip(slot_owners) {
                seen_pids.push(slot.pid);
                let Some(job) = owner else { continue };
                let Some(w) = jobs.get_mut(&job) else {
                    continue;
                };
                if w.watch.gate != path {
                    continue;
                }
                if w.in_gate.is_empty() {
                    // Untracked once learned where nothing waits on it; tracked again as
                    // soon as something may (a new mmkd's settings, another job's
                    // policy), and for a window now and then. Decided once a sample; what
                    // its slots counted since the last one was under the state before.
                    w.counted_only = w.untracked;
                    let may = untrack_ok
                        && !w.watch.keep_tracked
                        && (w.watch.class == JobClass::Online || !online_tracked);
                    w.untracked = w.untrack(may, now, &self.periods);
                }
                if w.untracked != slot.untracked
                    && let Err(e) = gate.set_untracked(slot.pid, w.untracked)
                {
                    debug!(gate = %path.display(), error = %e, "cannot ask a process to (un)track");
                }
                if w.in_gate.is_empty() {
                    w.alone = Some(w.alone.unwrap_or(true) && only == Some(job));
                }
                w.in_gate.push(slot.pid);
                let e = state.entry(job).or_default();
                // What the kernels ask for; an interposer that does not say (0 with
                // kernels in flight) is taken at what they fill.
                let ask = if slot.inflight_ask > 0 {
                    slot.inflight_ask
                } else {
                    slot.inflight_sm
                };
                e.0 = e.0.saturating_add(u64::from(ask));
                e.1 |= slot.inflight > 0;
                w.count(&slot, now, offline_beside);
            }
        }
        owners.retain(|pid, _| seen_pids.contains(pid));
        for (id, w) in jobs.iter_mut() {
            let Some(&(sm, busy)) = state.get(id) else {
                // No process of the job in its gate yet (or any more): nothing to weigh,
                // and the bandwidth of this window is not the job's alone.
                w.last_sample = None;
                w.alone = Some(false);
                continue;
            };
            if (w.launched && !w.tracked) || w.untracked {
                // Launches counted, none seen to end: its demand is not measured here.
                w.last_sample = None;
                continue;
            }
            // What its kernels ask for (blocks over blocks per SM), not what its partition
            // lets them have: a job measured in a small partition is not taken for a small
            // job. Kernels queued behind each other add up, so at most the whole GPU.
            let gpu = u64::from(w.watch.gpu_sms.max(1));
            let pct = (sm.min(gpu) as f64 * 100.0 / gpu as f64).round();
            w.observed.sample((pct as usize).min(HIST_BINS - 1), busy);
            w.run_samples += 1;
            if let Some(last) = w.last_sample {
                let step = now.duration_since(last).min(MAX_STEP);
                w.observed.seconds += step.as_secs_f64();
                // An online job's kernels in flight while offline kernels of its partition
                // are too: the time they may wait behind offline work on the GPU.
                if busy && w.watch.class == JobClass::Online && offline_busy.contains(&w.watch.gate)
                {
                    w.totals.beside_offline_ns = w
                        .totals
                        .beside_offline_ns
                        .saturating_add(u64::try_from(step.as_nanos()).unwrap_or(u64::MAX));
                }
            }
            w.last_sample = Some(now);
        }
    }
}

/// Reads the device every `every` (a second in mmkd) while mmkd runs and jobs are watched, leaving the
/// latest reading for the sampler. A bandwidth reading spans the time since the previous
/// one: after a pause (no job watched, a slow driver) it is dropped.
fn read_device(shared: &Shared, read: &ReadDevice, every: Duration) {
    let mut last: Option<Instant> = None;
    while !shared.stop.load(Ordering::Acquire) {
        if lock(&shared.jobs).is_empty() {
            last = None;
        } else {
            let mut now = read();
            let at = Instant::now();
            if last.is_none_or(|t| at.duration_since(t) > every * 3 / 2) {
                now.bandwidth.clear();
            }
            last = Some(at);
            *lock(&shared.readings) = Some(now);
        }
        std::thread::sleep(every);
    }
}

/// A reading of the partitions' bandwidth closes a window: each watched job that was
/// alone in its partition at every sample of the window gets what its partition used, as
/// a share of the GPU's bandwidth; every job's next window starts.
fn bandwidth(jobs: &mut HashMap<u64, Watched>, readings: &[(u32, Option<u32>, f64)]) {
    for w in jobs.values_mut() {
        if w.alone.take() == Some(true)
            && let Some(&(_, _, frac)) = readings
                .iter()
                .find(|(gpu, gi, _)| (*gpu, *gi) == w.watch.partition)
        {
            w.observed
                .bandwidth(frac * w.watch.partition_mem_frac.clamp(0.0, 1.0));
        }
    }
}

/// Each watched job's GPU memory now, summed over its processes in its own gate (as the
/// last sample found them), raises its observed peak.
fn peak_memory(jobs: &mut HashMap<u64, Watched>, memory: &[(u32, u64)]) {
    for w in jobs.values_mut() {
        let now = memory
            .iter()
            .filter(|(pid, _)| w.in_gate.contains(pid))
            .fold(0u64, |a, (_, bytes)| a.saturating_add(*bytes));
        w.observed.mem_peak_bytes = w.observed.mem_peak_bytes.max(now);
    }
}

/// The job process `pid` says it belongs to (`MMK_JOB_ID` in its environment), and the
/// uid it runs as.
fn identify(pid: u32) -> Option<(u64, u32)> {
    let uid = std::fs::metadata(format!("/proc/{pid}")).ok()?.uid();
    let env = mmk_mps_control::procs::environ(i32::try_from(pid).ok()?)?;
    let id = std::str::from_utf8(env.value("MMK_JOB_ID")?)
        .ok()?
        .parse()
        .ok()?;
    Some((id, uid))
}

/// Sample periods, uniform in 1..3 ms (xorshift; nothing here needs more).
struct Jitter(u64);

impl Jitter {
    fn new() -> Jitter {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0x9E37_79B9_7F4A_7C15, |d| d.as_nanos() as u64)
            | 1;
        Jitter(seed)
    }

    fn period_us(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        MEAN_PERIOD_US / 2 + self.0 % MEAN_PERIOD_US
    }
}

#[cfg(test)]
mod tests;
