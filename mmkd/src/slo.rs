//! SLO control: how much isolation from offline work each partition's online jobs need to
//! keep their latency objectives (docs/slo.md).
//!
//! An online job's objective is the p99 of its requests on the GPU: a latency (`slo:
//! 50ms`), a slowdown against the job alone (`slo: 3x`), or, when its spec gives none,
//! [`DEFAULT_SLOWDOWN_PCT`]. Its requests are its busy periods in its partition's gate
//! ([`mmk_kernel_sched::latency`]), which mmkd's sampler reads. A slowdown needs the job's
//! p99 alone: taken from its requests while no offline process was in its gate, or, when
//! it has had none, measured in a probe that pauses offline work while its requests run.
//!
//! Per partition, [`Control`] moves one level at a time up the ladder of [`Isolation`]
//! (the last, moving checkpointable offline jobs out, only where one runs)
//! while the objective is at risk (the window's p99 over [`Settings::risk`] of what it
//! allows), and down again when there is slack (under [`Settings::slack`]), with
//! hysteresis: a raise waits [`Settings::raise_after`] since the last change and a window
//! of [`Settings::min_samples`] requests under the current level; a lowering waits
//! [`Settings::lower_after`], which doubles each time a lowering had to be undone.
//! This module decides; `node` applies the level to the gate and says what it chose.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use mmk_kernel_sched::latency::{self, BUCKETS};
use mmk_kernel_sched::{GateConfig, PolicyKind};

/// A job that gives no objective may be this much slower than alone at p99, in percent.
/// 4x: on an H100, a ResNet-50 graph service at a quarter of its capacity beside BERT
/// training kept p99 at 0.6x plain MPS's with the control idle and 99 % of the training,
/// where 3x engaged the device wait for 0.5x at 82 % (docs/results.md, "Keeping a
/// service's objective"): the default acts against heavy interference only.
pub const DEFAULT_SLOWDOWN_PCT: u32 = 400;

/// What the gate of a partition does to protect its online jobs, lowest first. Each level
/// keeps what the ones below it do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub enum Isolation {
    /// The operator's settings (by default: launches tracked, none held).
    #[default]
    None,
    /// Offline launches also wait on the GPU while online work is in flight (the device
    /// wait), with an anti-starvation base of at least [`DEVICE_WAIT_BASE`]. Only where
    /// the gates are on a memory file system.
    DeviceWait,
    /// At most [`OFFLINE_CAP_DEPTH`] offline kernels in flight while an online job is
    /// present: the offline work a request can meet is bounded (MPS cannot change a
    /// running process's SM share; this bounds what the offline kernels hold instead).
    OfflineCap,
    /// Offline launches wait while any online kernel is in flight, up to the gate's hard
    /// bound: offline work pauses while online work runs.
    Paused,
    /// As `Paused`, and the planner moves the partition's checkpointable offline jobs to
    /// another GPU where they fit (`JobDemand::leave`). Only where one can checkpoint.
    Moved,
}

/// The device wait's anti-starvation base at [`Isolation::DeviceWait`] and above (the
/// setting that measured best on a graph service beside a training, docs/results.md).
pub const DEVICE_WAIT_BASE: Duration = Duration::from_micros(1500);
/// Offline kernels in flight at [`Isolation::OfflineCap`] and above.
pub const OFFLINE_CAP_DEPTH: u32 = 8;

impl Isolation {
    pub const ALL: [Isolation; 5] = [
        Isolation::None,
        Isolation::DeviceWait,
        Isolation::OfflineCap,
        Isolation::Paused,
        Isolation::Moved,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Isolation::None => "none",
            Isolation::DeviceWait => "device-wait",
            Isolation::OfflineCap => "offline-cap",
            Isolation::Paused => "paused",
            Isolation::Moved => "moved",
        }
    }

    /// 0 for none to 4 for moved (`mmk_partition_isolation_level`).
    pub fn level(self) -> u8 {
        match self {
            Isolation::None => 0,
            Isolation::DeviceWait => 1,
            Isolation::OfflineCap => 2,
            Isolation::Paused => 3,
            Isolation::Moved => 4,
        }
    }

    /// The gate's settings at this level, over the operator's `base`.
    pub fn apply(self, base: &GateConfig, device_wait_possible: bool) -> GateConfig {
        let mut c = *base;
        if self == Isolation::None {
            return c;
        }
        if c.policy == PolicyKind::Passthrough {
            c.policy = PolicyKind::Mmk;
        }
        if device_wait_possible {
            c.device_wait = true;
            c.base = c.base.max(DEVICE_WAIT_BASE);
        }
        if self >= Isolation::OfflineCap {
            c.policy = PolicyKind::Mmk;
            c.offline_depth = match c.offline_depth {
                0 => OFFLINE_CAP_DEPTH,
                d => d.min(OFFLINE_CAP_DEPTH),
            };
        }
        if self >= Isolation::Paused {
            c.offline_paused = true;
        }
        c
    }
}

impl std::fmt::Display for Isolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An online job's latency objective: the p99 of its requests on the GPU.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Objective {
    pub goal: Goal,
    /// The job gave none; this is mmkd's default.
    pub default: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Goal {
    /// At most this long.
    P99(Duration),
    /// At most this many times its p99 alone.
    Slowdown(f64),
}

impl Objective {
    /// A job's objective from its spec's `slo` (a latency in ms or a slowdown in percent);
    /// neither: `default_pct`.
    pub fn of(slo_ms: Option<u64>, slowdown_pct: Option<u32>, default_pct: u32) -> Objective {
        match (slo_ms, slowdown_pct) {
            (Some(ms), _) => Objective {
                goal: Goal::P99(Duration::from_millis(ms)),
                default: false,
            },
            (None, Some(pct)) => Objective {
                goal: Goal::Slowdown(f64::from(pct) / 100.0),
                default: false,
            },
            (None, None) => Objective {
                goal: Goal::Slowdown(f64::from(default_pct) / 100.0),
                default: true,
            },
        }
    }

    /// "p99 <= 50ms", "p99 <= 4x alone (default)".
    pub fn describe(&self) -> String {
        let goal = match self.goal {
            Goal::P99(d) => format!("p99 <= {}ms", d.as_secs_f64() * 1e3),
            Goal::Slowdown(f) => format!("p99 <= {f}x alone"),
        };
        if self.default {
            format!("{goal} (default)")
        } else {
            goal
        }
    }

    /// The p99 it allows, in ns, given the job's p99 alone; `None` for a slowdown whose
    /// reference is not known.
    pub fn target_ns(&self, alone_ns: Option<u64>) -> Option<u64> {
        match self.goal {
            Goal::P99(d) => Some(nanos(d)),
            Goal::Slowdown(f) => alone_ns.map(|a| (a as f64 * f) as u64),
        }
    }

    fn needs_alone(&self) -> bool {
        matches!(self.goal, Goal::Slowdown(_))
    }
}

/// The SLO control as mmkd is configured (`--slo-default`, `--no-slo-control`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SloConfig {
    /// The slowdown an online job without an objective may have, in percent.
    pub default_slowdown_pct: u32,
    pub settings: Settings,
}

impl Default for SloConfig {
    fn default() -> SloConfig {
        SloConfig {
            default_slowdown_pct: DEFAULT_SLOWDOWN_PCT,
            settings: Settings::default(),
        }
    }
}

/// How the control moves. mmkd runs on [`Settings::default`]; tests shorten the times.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Settings {
    /// How often the node reads the latencies and asks [`Control::tick`].
    pub tick: Duration,
    /// A job's first requests, over this long from the first one the control sees, are
    /// not judged (a service warms up: compiles, captures its graphs).
    pub settle: Duration,
    /// A raise waits this long after the last change.
    pub raise_after: Duration,
    /// A lowering waits this long after the last change at first ...
    pub lower_after: Duration,
    /// ... twice as long each time a lowering was undone within twice that wait, up to
    /// this; the first wait again once a lowering held that long.
    pub lower_after_max: Duration,
    /// At risk: the window's p99 over this share of what the objective allows.
    pub risk: f64,
    /// Slack: under this share.
    pub slack: f64,
    /// Requests a window needs under the current level before it is judged.
    pub min_samples: u64,
    /// A window holds the requests of at most this long.
    pub window: Duration,
    /// Requests a p99 alone is taken from.
    pub alone_samples: u64,
    /// A probe counts no request of its first this long ...
    pub probe_skip: Duration,
    /// ... and gives up after this long (for [`Settings::lower_after_max`]).
    pub probe_max: Duration,
}

impl Default for Settings {
    fn default() -> Settings {
        Settings {
            tick: Duration::from_secs(1),
            settle: Duration::from_secs(5),
            raise_after: Duration::from_secs(1),
            lower_after: Duration::from_secs(30),
            lower_after_max: Duration::from_secs(600),
            risk: 0.9,
            slack: 0.5,
            min_samples: 50,
            window: Duration::from_secs(10),
            alone_samples: 500,
            probe_skip: Duration::from_secs(1),
            probe_max: Duration::from_secs(60),
        }
    }
}

impl Settings {
    /// Its waits (the tick, the settling, a raise's, a lowering's, a probe's) `n` times
    /// shorter, `n` at most 1000 and the tick at least 1 ms; the window and the sample
    /// counts stay (`mmkd --slo-speed`, for tests).
    pub fn faster(self, n: u32) -> Settings {
        let n = n.clamp(1, 1000);
        Settings {
            tick: (self.tick / n).max(Duration::from_millis(1)),
            settle: self.settle / n,
            raise_after: self.raise_after / n,
            lower_after: self.lower_after / n,
            lower_after_max: self.lower_after_max / n,
            probe_skip: self.probe_skip / n,
            probe_max: self.probe_max / n,
            ..self
        }
    }
}

/// One online job of a partition at a tick: its objective and its requests so far
/// (cumulative histograms, as the sampler keeps them).
#[derive(Debug, Clone, Copy)]
pub struct Observation<'a> {
    pub job: u64,
    pub objective: Objective,
    pub hist: &'a [u64],
    /// Its requests while no offline process was in its gate.
    pub alone: &'a [u64],
    /// An offline process is in its gate now.
    pub offline_beside: bool,
}

/// A change of a partition's level, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub from: Isolation,
    pub to: Isolation,
    /// The job whose latency moved it (`None`: no job's, say a probe's job ended).
    pub job: Option<u64>,
    pub why: String,
}

/// What the control sees of one job, for `mmkctl jobs get` and the metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct JobStatus {
    pub objective: String,
    pub target_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub alone_p99_ns: Option<u64>,
    pub samples: u64,
    pub isolation: Isolation,
    pub why: String,
}

#[derive(Debug)]
struct Tracked {
    objective: Objective,
    /// When the control first saw a request of it (its settling starts then).
    first_request: Option<Instant>,
    /// The cumulative counts at the last tick.
    last_hist: Vec<u64>,
    last_alone: Vec<u64>,
    /// Requests per tick since the last change (at most [`Settings::window`] of them).
    window: VecDeque<(Instant, Vec<u64>)>,
    /// The requests its reference alone is taken from: those with no offline process in
    /// its gate, and those of a probe.
    reference: Vec<u64>,
    /// No probe for it before this (its last one ended without enough requests).
    no_probe_until: Option<Instant>,
}

impl Tracked {
    fn window_hist(&self) -> Vec<u64> {
        let mut sum = vec![0u64; BUCKETS];
        for (_, h) in &self.window {
            add(&mut sum, h);
        }
        sum
    }

    fn alone_p99(&self, settings: &Settings) -> Option<u64> {
        (latency::count(&self.reference) >= settings.alone_samples)
            .then(|| latency::quantile(&self.reference, 0.99))
            .flatten()
    }
}

/// A probe: offline work paused until a job's p99 alone is measured.
#[derive(Debug, Clone, Copy)]
struct Probe {
    job: u64,
    /// The level to go back to.
    back_to: Isolation,
    /// Requests before this are not counted: a service that fell behind beside offline
    /// work first works off its backlog, whose busy periods are not its alone.
    counts_from: Instant,
    /// When it gives up (too few requests to take a reference from).
    ends_by: Instant,
}

/// The SLO control of one partition.
#[derive(Debug)]
pub struct Control {
    settings: Settings,
    /// Whether [`Isolation::DeviceWait`] can act here (its gate on a memory file system);
    /// where it cannot, the ladder skips it.
    device_wait_possible: bool,
    /// Whether an offline job here can checkpoint ([`Isolation::Moved`] can act); the node
    /// says so before each tick ([`Control::set_movable`]).
    movable: bool,
    level: Isolation,
    changed_at: Instant,
    /// When the last tick came.
    last_tick: Option<Instant>,
    lowered_at: Option<Instant>,
    lower_after: Duration,
    probe: Option<Probe>,
    jobs: HashMap<u64, Tracked>,
    why: String,
}

impl Control {
    pub fn new(settings: Settings, device_wait_possible: bool, now: Instant) -> Control {
        Control {
            settings,
            device_wait_possible,
            movable: false,
            level: Isolation::None,
            changed_at: now,
            last_tick: None,
            lowered_at: None,
            lower_after: settings.lower_after,
            probe: None,
            jobs: HashMap::new(),
            why: "no request measured yet".into(),
        }
    }

    pub fn level(&self) -> Isolation {
        self.level
    }

    /// Whether a checkpointable offline job runs in the partition now.
    pub fn set_movable(&mut self, movable: bool) {
        self.movable = movable;
    }

    /// The ladder's next level up or down from the current one.
    fn step(&self, up: bool) -> Option<Isolation> {
        let ladder: Vec<Isolation> = Isolation::ALL
            .into_iter()
            .filter(|l| *l != Isolation::DeviceWait || self.device_wait_possible)
            .filter(|l| *l != Isolation::Moved || self.movable || self.level == Isolation::Moved)
            .collect();
        let i = ladder.iter().position(|l| *l == self.level)?;
        if up {
            ladder.get(i + 1).copied()
        } else {
            i.checked_sub(1).map(|j| ladder[j])
        }
    }

    fn change(&mut self, now: Instant, to: Isolation, job: Option<u64>, why: String) -> Change {
        let from = self.level;
        self.level = to;
        self.changed_at = now;
        self.why.clone_from(&why);
        for t in self.jobs.values_mut() {
            t.window.clear();
        }
        Change { from, to, job, why }
    }

    /// Adds what each observed job did since the last tick to its window (and to its
    /// reference alone where that is being measured); a job's first requests, while it
    /// settles, are left out.
    fn take_in(&mut self, now: Instant, observed: &[Observation<'_>]) {
        let s = self.settings;
        for o in observed {
            let t = self.jobs.entry(o.job).or_insert_with(|| Tracked {
                objective: o.objective,
                first_request: None,
                last_hist: vec![0; BUCKETS],
                last_alone: vec![0; BUCKETS],
                window: VecDeque::new(),
                reference: vec![0; BUCKETS],
                no_probe_until: None,
            });
            t.objective = o.objective;
            let delta = difference(o.hist, &mut t.last_hist);
            let alone = difference(o.alone, &mut t.last_alone);
            if latency::count(&delta) > 0 && t.first_request.is_none() {
                t.first_request = Some(now);
            }
            if t.first_request
                .is_none_or(|at| now.duration_since(at) < s.settle)
            {
                // Still warming up: its requests so far are not the service's.
                continue;
            }
            // With offline work paused (a probe, or the top of the ladder) a job whose
            // reference is not known yet takes it from all it did since the last tick, a
            // probe's first requests left out (the tick before must be past them); else
            // from its requests alone.
            if self.level >= Isolation::Paused
                && o.objective.needs_alone()
                && t.alone_p99(&s).is_none()
            {
                if self
                    .probe
                    .is_none_or(|p| self.last_tick.is_some_and(|at| at >= p.counts_from))
                {
                    add(&mut t.reference, &delta);
                }
            } else {
                add(&mut t.reference, &alone);
            }
            t.window.push_back((now, delta));
            while t
                .window
                .front()
                .is_some_and(|(at, _)| now.duration_since(*at) > s.window)
            {
                t.window.pop_front();
            }
        }
    }

    /// One tick: take in what the partition's online jobs did since the last one, and
    /// say whether the level changes. Jobs not observed are forgotten.
    pub fn tick(&mut self, now: Instant, observed: &[Observation<'_>]) -> Option<Change> {
        let s = self.settings;
        self.jobs
            .retain(|job, _| observed.iter().any(|o| o.job == *job));
        self.take_in(now, observed);
        self.last_tick = Some(now);
        if let Some(p) = self.probe
            && now >= p.ends_by
            && let Some(t) = self.jobs.get_mut(&p.job)
            && t.alone_p99(&s).is_none()
        {
            self.probe = None;
            t.no_probe_until = Some(now + s.lower_after_max);
            let why = format!(
                "no reference alone for job {}: too few of its requests in {:?} with offline \
                 work paused; measured again in {:?}",
                p.job, s.probe_max, s.lower_after_max
            );
            return Some(self.change(now, p.back_to, Some(p.job), why));
        }
        if let Some(p) = self.probe {
            let done = self.jobs.get(&p.job).and_then(|t| t.alone_p99(&s));
            return match (done, self.jobs.contains_key(&p.job)) {
                (Some(alone), _) => {
                    self.probe = None;
                    let why = format!(
                        "job {}'s p99 with offline work paused is {}: its reference alone",
                        p.job,
                        ms_text(alone)
                    );
                    Some(self.change(now, p.back_to, Some(p.job), why))
                }
                (None, false) => {
                    self.probe = None;
                    let why = "the job being measured ended".to_owned();
                    Some(self.change(now, p.back_to, None, why))
                }
                (None, true) => None,
            };
        }
        if self
            .lowered_at
            .is_some_and(|at| now.duration_since(at) >= self.lower_after * 2)
        {
            // The last lowering held: the next one waits the first wait again.
            self.lower_after = s.lower_after;
            self.lowered_at = None;
        }
        // Nothing beside the online jobs to isolate them from: no probe, no raise (a
        // lowering may still come).
        let beside = observed.iter().any(|o| o.offline_beside);
        // Only jobs past their warm-up are judged.
        let observed: Vec<&Observation<'_>> = observed
            .iter()
            .filter(|o| {
                self.jobs[&o.job]
                    .first_request
                    .is_some_and(|at| now.duration_since(at) >= s.settle)
            })
            .collect();
        // A slowdown without its reference: measure it, where offline work is beside.
        if let Some(o) = observed.iter().find(|o| {
            let t = &self.jobs[&o.job];
            o.offline_beside
                && o.objective.needs_alone()
                && t.alone_p99(&s).is_none()
                && t.no_probe_until.is_none_or(|until| now >= until)
        }) && self.level < Isolation::Paused
        {
            self.probe = Some(Probe {
                job: o.job,
                back_to: self.level,
                counts_from: now + s.probe_skip,
                ends_by: now + s.probe_max,
            });
            let why = format!(
                "measuring job {}'s p99 alone for its objective ({}): offline work paused \
                 while its requests run",
                o.job,
                o.objective.describe()
            );
            return Some(self.change(now, Isolation::Paused, Some(o.job), why));
        }
        // The job furthest from its objective, among those with a full window.
        let worst = observed
            .iter()
            .filter_map(|o| {
                let t = &self.jobs[&o.job];
                let hist = t.window_hist();
                if latency::count(&hist) < s.min_samples {
                    return None;
                }
                let target = o.objective.target_ns(t.alone_p99(&s))?;
                let p99 = latency::quantile(&hist, 0.99)?;
                Some((p99 as f64 / target.max(1) as f64, o, p99, target))
            })
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let (ratio, o, p99, target) = worst?;
        let allowed = format!("the {} {} allows", ms_text(target), o.objective.describe());
        let since = now.duration_since(self.changed_at);
        if ratio > s.risk && beside {
            let Some(to) = self.step(true) else {
                self.why = format!(
                    "at the highest level, job {}'s p99 {} is over {:.0} % of {allowed}",
                    o.job,
                    ms_text(p99),
                    s.risk * 100.0
                );
                return None;
            };
            if since < s.raise_after {
                return None;
            }
            if self.lowered_at.take().is_some() {
                // The last lowering did not hold: wait longer before the next.
                self.lower_after = (self.lower_after * 2).min(s.lower_after_max);
            }
            let why = format!(
                "job {}'s p99 {} is over {:.0} % of {allowed}",
                o.job,
                ms_text(p99),
                s.risk * 100.0
            );
            return Some(self.change(now, to, Some(o.job), why));
        }
        if ratio < s.slack
            && since >= self.lower_after
            && let Some(to) = self.step(false)
        {
            self.lowered_at = Some(now);
            let why = format!(
                "job {}'s p99 {} is under {:.0} % of {allowed}",
                o.job,
                ms_text(p99),
                s.slack * 100.0
            );
            return Some(self.change(now, to, Some(o.job), why));
        }
        None
    }

    /// What the control sees of job `job` now.
    pub fn status(&self, job: u64) -> Option<JobStatus> {
        let t = self.jobs.get(&job)?;
        let hist = t.window_hist();
        let alone = t.alone_p99(&self.settings);
        Some(JobStatus {
            objective: t.objective.describe(),
            target_ns: t.objective.target_ns(alone),
            p99_ns: latency::quantile(&hist, 0.99),
            alone_p99_ns: alone,
            samples: latency::count(&hist),
            isolation: self.level,
            why: self.why.clone(),
        })
    }
}

/// What `now` counts over `last` (saturating: a histogram that went back counts nothing);
/// `last` becomes `now`.
fn difference(now: &[u64], last: &mut [u64]) -> Vec<u64> {
    let mut d = vec![0u64; BUCKETS];
    for (i, (n, l)) in now.iter().zip(last.iter_mut()).enumerate() {
        d[i] = n.saturating_sub(*l);
        *l = *n;
    }
    d
}

fn add(sum: &mut [u64], h: &[u64]) {
    for (s, n) in sum.iter_mut().zip(h) {
        *s = s.saturating_add(*n);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// `3.47ms`.
pub fn ms_text(ns: u64) -> String {
    format!("{:.2}ms", ns as f64 / 1e6)
}

#[cfg(test)]
mod tests;
