//! The kernel-level simulator: recorded kernel traces of two or more jobs replayed on a
//! simulated SM pool under a launch policy, so a policy change is tested without a GPU
//! (`mmk-lab ksim`, docs/kernel-sched.md).
//!
//! The model, and what it leaves out:
//! - Each job is one CPU thread and one in-order stream. Its trace (the job alone, record
//!   mode) is cut into requests as its profile is ([`crate::profile::requests`]);
//!   a request's kernels are launched with the CPU gaps measured between their launch calls,
//!   and the job waits for the GPU at the end of each request (the synchronisation a
//!   `loss.item()` or a response makes). Online requests arrive as a Poisson process and
//!   queue behind each other; an offline job starts its next request at once.
//! - The GPU is a pool of SMs shared by demand: a kernel needs `sm_demand` SMs, capped by its
//!   job's MPS share; while the running kernels need more SMs than there are, each runs
//!   slower by the ratio (the fake driver's model). Memory-bandwidth interference, stream
//!   priorities and the block scheduler's order are not modelled.
//! - The gate sees a launch when it is made and its completion `detect` later (the
//!   interposer's poller). An offline launch asks the policy, exactly as the interposer does
//!   ([`crate::Gate::admit`]); a held launch is asked again when a completion is seen, at
//!   its recheck time, or goes at the hard bound.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::time::Duration;

use crate::policy::{Class, Clock, Decision, InFlight, Launch, Policy};
use crate::profile::{Expect, KernelKey, Profile, requests};
use crate::trace::TraceRecord;

/// One kernel of a job's request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimKernel {
    /// Run time alone, with all the SMs it asks for.
    pub duration_ns: u64,
    pub sm_demand: u32,
    /// CPU time from the previous launch of the request to this one (0 for the first).
    pub cpu_gap_ns: u64,
    /// What the job's profile says about it (for `orion` and `fikit`).
    pub expect: Expect,
}

/// A job as the simulator replays it.
#[derive(Debug, Clone, PartialEq)]
pub struct SimJob {
    pub name: String,
    pub class: Class,
    /// MPS share in (0, 1].
    pub mps_fraction: f64,
    /// Online jobs: mean time between request arrivals (Poisson).
    pub interval_ns: u64,
    /// The requests (offline: iterations) to replay, in a loop.
    pub requests: Vec<Vec<SimKernel>>,
}

impl SimJob {
    /// A job from its record-mode trace (run alone). Its profile, built from the same
    /// trace, gives each kernel's expectation.
    pub fn from_trace(
        name: &str,
        class: Class,
        records: &[TraceRecord],
        mps_fraction: f64,
        interval_ns: u64,
    ) -> Result<SimJob, crate::profile::ProfileError> {
        let profile = Profile::from_trace(name, class, records)?;
        Ok(SimJob::with_profile(
            name,
            class,
            records,
            &profile,
            mps_fraction,
            interval_ns,
        ))
    }

    /// A job from its trace and the profile already built from it.
    pub fn with_profile(
        name: &str,
        class: Class,
        records: &[TraceRecord],
        profile: &Profile,
        mps_fraction: f64,
        interval_ns: u64,
    ) -> SimJob {
        let index = profile.index();
        let requests = requests(records)
            .into_iter()
            .map(|request| {
                let mut prev_launch = request[0].0.launch_ns;
                request
                    .into_iter()
                    .map(|(r, _)| {
                        let k = SimKernel {
                            duration_ns: r.duration_ns().unwrap_or(0).max(1),
                            sm_demand: r.sm_demand.max(1),
                            cpu_gap_ns: r.launch_ns.saturating_sub(prev_launch),
                            expect: index.get(&KernelKey::of(r)).copied().unwrap_or_default(),
                        };
                        prev_launch = r.launch_ns;
                        k
                    })
                    .collect()
            })
            .collect();
        SimJob {
            name: name.to_owned(),
            class,
            mps_fraction,
            interval_ns,
            requests,
        }
    }
}

/// What the simulated node is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SimConfig {
    pub sm_count: u32,
    /// Simulated time.
    pub duration: Duration,
    /// How late the gate sees a completion (the interposer's poller: 10-100 us).
    pub detect: Duration,
    /// The gate's hard bound on a held launch.
    pub max_hold: Duration,
    /// Each offline job is held at most this share of its time, in percent
    /// ([`crate::HoldBudget`]); 100: no budget.
    pub hold_budget_pct: u32,
    pub seed: u64,
}

impl SimConfig {
    pub fn new(sm_count: u32) -> SimConfig {
        SimConfig {
            sm_count,
            duration: Duration::from_secs(10),
            detect: Duration::from_micros(20),
            max_hold: Duration::from_millis(100),
            hold_budget_pct: crate::DEFAULT_HOLD_BUDGET_PCT,
            seed: 1,
        }
    }
}

/// What one job did in a run.
#[derive(Debug, Clone, PartialEq)]
pub struct JobResult {
    pub name: String,
    pub class: Class,
    pub requests: u64,
    /// Online: request latency from arrival to the last kernel's end, sorted (ns).
    pub latencies_ns: Vec<u64>,
    pub kernels: u64,
    /// Requests (offline: iterations) finished per simulated second.
    pub per_second: f64,
    pub held: u64,
    /// Time its launches spent held (ns).
    pub held_ns: u64,
    pub forced: u64,
}

impl JobResult {
    pub fn latency_percentile(&self, p: f64) -> Option<u64> {
        if self.latencies_ns.is_empty() {
            return None;
        }
        let rank = (p / 100.0 * (self.latencies_ns.len() - 1) as f64).round() as usize;
        self.latencies_ns.get(rank).copied()
    }

    pub fn mean_latency_ns(&self) -> Option<f64> {
        (!self.latencies_ns.is_empty()).then(|| {
            self.latencies_ns.iter().map(|&l| l as f64).sum::<f64>()
                / self.latencies_ns.len() as f64
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An online request arrives.
    Arrival(usize),
    /// The job's CPU thread is ready to launch its next kernel.
    Issue(usize),
    /// A held launch asks again.
    Recheck(usize, u64),
    /// The gate sees that a launch of this job completed.
    Seen(usize, u64),
}

#[derive(Debug, Clone, Copy)]
struct Running {
    job: usize,
    id: u64,
    /// Work left, in ns at full speed.
    left_ns: f64,
    /// SMs it gets from its share, and the slowdown that share costs.
    sms: f64,
    share_speed: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cpu {
    /// Online: no request to serve.
    Idle,
    /// Launching kernel `next` of the current request.
    Issuing,
    /// The policy holds kernel `next` since this time; the token tells stale rechecks
    /// apart.
    Held {
        since: u64,
        token: u64,
        /// Held in `Hold` decisions so far (ns), and when the current one began.
        starving: u64,
        hold_began: Option<u64>,
    },
    /// Every kernel is launched; waiting for the GPU.
    Syncing,
}

#[derive(Debug)]
struct JobState {
    request: usize,
    next: usize,
    cpu: Cpu,
    request_started: u64,
    arrivals: VecDeque<u64>,
    /// Launched, not started (in order), and whether one is running.
    queued: VecDeque<(u64, SimKernel)>,
    running: bool,
    /// Launched and not seen complete by the gate: (id, kernel).
    in_gate: HashMap<u64, SimKernel>,
    /// Launched and not complete on the GPU.
    on_gpu: u64,
    result: JobResult,
    gap_until_ns: u64,
    /// The job's hold budget, and what the admission in progress may be held (ns).
    budget: crate::HoldBudget,
    allowed: u64,
}

/// A deterministic generator for arrival times (SplitMix64).
#[derive(Debug)]
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }

    fn exponential(&mut self, mean: f64) -> u64 {
        (-mean * (1.0 - self.next_f64()).ln()).max(0.0) as u64
    }
}

struct Sim<'a> {
    config: SimConfig,
    jobs: &'a [SimJob],
    state: Vec<JobState>,
    policy: Box<dyn Policy>,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    running: Vec<Running>,
    now: u64,
    ids: u64,
    rng: Rng,
}

/// Replay `jobs` for `config.duration` under `policy`; one result per job, in order.
pub fn run(config: &SimConfig, jobs: &[SimJob], policy: Box<dyn Policy>) -> Vec<JobResult> {
    let state = jobs
        .iter()
        .map(|j| JobState {
            request: 0,
            next: 0,
            cpu: Cpu::Idle,
            request_started: 0,
            arrivals: VecDeque::new(),
            queued: VecDeque::new(),
            running: false,
            in_gate: HashMap::new(),
            on_gpu: 0,
            result: JobResult {
                name: j.name.clone(),
                class: j.class,
                requests: 0,
                latencies_ns: Vec::new(),
                kernels: 0,
                per_second: 0.0,
                held: 0,
                held_ns: 0,
                forced: 0,
            },
            gap_until_ns: 0,
            budget: crate::HoldBudget::new(),
            allowed: 0,
        })
        .collect();
    let mut sim = Sim {
        config: *config,
        jobs,
        state,
        policy,
        events: BinaryHeap::new(),
        seq: 0,
        running: Vec::new(),
        now: 0,
        ids: 0,
        rng: Rng(config.seed),
    };
    sim.go();
    let seconds = config.duration.as_secs_f64();
    sim.state
        .into_iter()
        .map(|mut s| {
            s.result.latencies_ns.sort_unstable();
            s.result.per_second = s.result.requests as f64 / seconds;
            s.result
        })
        .collect()
}

impl Sim<'_> {
    fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time, self.seq, event)));
    }

    fn go(&mut self) {
        let end = u64::try_from(self.config.duration.as_nanos()).unwrap_or(u64::MAX);
        for j in 0..self.jobs.len() {
            if self.jobs[j].requests.iter().all(Vec::is_empty) {
                continue;
            }
            match self.jobs[j].class {
                Class::Online => {
                    let first = self.rng.exponential(self.jobs[j].interval_ns as f64);
                    self.at(first, Event::Arrival(j));
                }
                Class::Offline => self.start_request(j),
            }
        }
        loop {
            let next_event = self.events.peek().map(|Reverse((t, _, _))| *t);
            let next_done = self.next_completion();
            let t = match (next_event, next_done) {
                (None, None) => break,
                (Some(e), None) => e,
                (None, Some((d, _))) => d,
                (Some(e), Some((d, _))) => e.min(d),
            };
            if t > end {
                break;
            }
            self.advance(t);
            if let Some((d, i)) = next_done
                && d <= t
            {
                self.complete(i);
                continue;
            }
            let Some(Reverse((_, _, event))) = self.events.pop() else {
                break;
            };
            match event {
                Event::Arrival(j) => self.arrive(j),
                Event::Issue(j) => self.issue(j),
                Event::Recheck(j, token) => {
                    if matches!(self.state[j].cpu, Cpu::Held { token: t, .. } if t == token) {
                        self.issue(j);
                    }
                }
                Event::Seen(j, id) => self.seen(j, id),
            }
        }
    }

    /// The speed of each running kernel: its share's cap, and the oversubscription of the
    /// pool.
    fn pool_speed(&self) -> f64 {
        let want: f64 = self.running.iter().map(|r| r.sms).sum();
        let sms = f64::from(self.config.sm_count);
        if want <= sms { 1.0 } else { sms / want }
    }

    fn next_completion(&self) -> Option<(u64, usize)> {
        let speed = self.pool_speed();
        self.running
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let dt = r.left_ns / (speed * r.share_speed);
                (self.now + dt.ceil().max(0.0) as u64, i)
            })
            .min()
    }

    fn advance(&mut self, t: u64) {
        let dt = t.saturating_sub(self.now) as f64;
        if dt > 0.0 {
            let speed = self.pool_speed();
            for r in &mut self.running {
                r.left_ns -= dt * speed * r.share_speed;
            }
        }
        self.now = t.max(self.now);
    }

    fn arrive(&mut self, j: usize) {
        let now = self.now;
        self.state[j].arrivals.push_back(now);
        let gap = self.rng.exponential(self.jobs[j].interval_ns as f64).max(1);
        self.at(now + gap, Event::Arrival(j));
        if self.state[j].cpu == Cpu::Idle {
            self.start_request(j);
        }
    }

    fn start_request(&mut self, j: usize) {
        let now = self.now;
        let s = &mut self.state[j];
        s.request_started = match self.jobs[j].class {
            Class::Online => match s.arrivals.pop_front() {
                Some(at) => at,
                None => {
                    s.cpu = Cpu::Idle;
                    return;
                }
            },
            Class::Offline => now,
        };
        s.next = 0;
        s.cpu = Cpu::Issuing;
        self.at(now, Event::Issue(j));
    }

    fn in_flight(&self) -> InFlight {
        let mut f = InFlight {
            sm_count: self.config.sm_count,
            ..InFlight::default()
        };
        for (j, s) in self.state.iter().enumerate() {
            let kernels = u32::try_from(s.in_gate.len()).unwrap_or(u32::MAX);
            let sm: u32 = s.in_gate.values().map(|k| k.sm_demand).sum();
            match self.jobs[j].class {
                Class::Online => {
                    f.online_jobs += 1;
                    f.online_kernels += kernels;
                    f.online_sm = f.online_sm.saturating_add(sm);
                    for k in s.in_gate.values() {
                        match k.expect.intensity {
                            crate::Intensity::Compute => f.online_compute += 1,
                            crate::Intensity::Memory => f.online_memory += 1,
                            crate::Intensity::Unknown => {}
                        }
                    }
                    if kernels == 0 && s.gap_until_ns != 0 {
                        let until = s.gap_until_ns;
                        f.online_gap_until_ns =
                            Some(f.online_gap_until_ns.map_or(until, |u| u.min(until)));
                    }
                }
                Class::Offline => {
                    f.offline_kernels += kernels;
                    f.offline_sm = f.offline_sm.saturating_add(sm);
                    f.offline_expected_ns += s
                        .in_gate
                        .values()
                        .map(|k| k.expect.duration_ns.unwrap_or(0))
                        .sum::<u64>();
                }
            }
        }
        if f.online_kernels > 0 {
            f.online_gap_until_ns = None;
        }
        f
    }

    fn issue(&mut self, j: usize) {
        let job = &self.jobs[j];
        let s = &self.state[j];
        let request = &job.requests[s.request % job.requests.len()];
        let Some(&kernel) = request.get(s.next) else {
            return;
        };
        let max_hold = u64::try_from(self.config.max_hold.as_nanos()).unwrap_or(u64::MAX);
        if job.class == Class::Offline {
            let (since, mut starving, hold_began) = match s.cpu {
                Cpu::Held {
                    since,
                    starving,
                    hold_began,
                    ..
                } => (since, starving, hold_began),
                _ => {
                    // A new admission: what the job's budget lets it be held.
                    let pct = self.config.hold_budget_pct;
                    let s = &mut self.state[j];
                    s.allowed = s.budget.available(pct, self.now).map_or(max_hold, |left| {
                        u64::try_from(left.as_nanos())
                            .unwrap_or(u64::MAX)
                            .min(max_hold)
                    });
                    (self.now, 0, None)
                }
            };
            let allowed = self.state[j].allowed;
            if let Some(began) = hold_began {
                starving += self.now - began;
            }
            let waited = self.now - since;
            let launch = Launch {
                class: job.class,
                sm_demand: kernel.sm_demand,
                mps_fraction: job.mps_fraction,
                expect: kernel.expect,
            };
            let clock = Clock {
                now_ns: self.now,
                waited: Duration::from_nanos(waited),
                starving: Duration::from_nanos(starving),
            };
            let decision = self.policy.decide(&launch, &self.in_flight(), clock);
            let forced = match decision {
                Decision::Launch => false,
                Decision::LaunchStarved => true,
                Decision::Hold { .. } if starving >= allowed => true,
                Decision::Hold { .. } | Decision::Queued { .. } if waited >= max_hold => true,
                Decision::Hold { recheck } | Decision::Queued { recheck } => {
                    self.ids += 1;
                    let token = self.ids;
                    let recheck = u64::try_from(recheck.as_nanos())
                        .unwrap_or(u64::MAX)
                        .min(max_hold - waited)
                        .min(if matches!(decision, Decision::Hold { .. }) {
                            allowed.saturating_sub(starving)
                        } else {
                            u64::MAX
                        })
                        .max(1);
                    let hold_began = matches!(decision, Decision::Hold { .. }).then_some(self.now);
                    self.state[j].cpu = Cpu::Held {
                        since,
                        token,
                        starving,
                        hold_began,
                    };
                    self.at(self.now + recheck, Event::Recheck(j, token));
                    return;
                }
            };
            self.state[j].budget.spend(Duration::from_nanos(starving));
            let r = &mut self.state[j].result;
            if waited > 0 || forced {
                r.held += 1;
                r.held_ns += waited;
            }
            if forced {
                r.forced += 1;
            }
        }
        self.launch(j, kernel);
    }

    fn launch(&mut self, j: usize, kernel: SimKernel) {
        self.ids += 1;
        let id = self.ids;
        let now = self.now;
        let s = &mut self.state[j];
        s.in_gate.insert(id, kernel);
        s.on_gpu += 1;
        s.queued.push_back((id, kernel));
        s.next += 1;
        let job = &self.jobs[j];
        let request = &job.requests[s.request % job.requests.len()];
        match request.get(s.next) {
            Some(next) => {
                s.cpu = Cpu::Issuing;
                let at = now + next.cpu_gap_ns;
                self.at(at, Event::Issue(j));
            }
            None => s.cpu = Cpu::Syncing,
        }
        self.start_next(j);
    }

    fn start_next(&mut self, j: usize) {
        let s = &mut self.state[j];
        if s.running {
            return;
        }
        let Some((id, k)) = s.queued.pop_front() else {
            return;
        };
        s.running = true;
        let cap =
            (self.jobs[j].mps_fraction.clamp(0.01, 1.0) * f64::from(self.config.sm_count)).max(1.0);
        let want = f64::from(k.sm_demand);
        let sms = want.min(cap);
        self.running.push(Running {
            job: j,
            id,
            left_ns: k.duration_ns as f64,
            sms,
            share_speed: sms / want,
        });
    }

    fn complete(&mut self, i: usize) {
        let r = self.running.swap_remove(i);
        let j = r.job;
        let now = self.now;
        let s = &mut self.state[j];
        s.running = false;
        s.on_gpu -= 1;
        s.result.kernels += 1;
        let detect = u64::try_from(self.config.detect.as_nanos()).unwrap_or(0);
        self.at(now + detect, Event::Seen(j, r.id));
        self.start_next(j);
        let s = &mut self.state[j];
        if s.cpu == Cpu::Syncing && s.on_gpu == 0 {
            s.result.requests += 1;
            if self.jobs[j].class == Class::Online {
                s.result.latencies_ns.push(now - s.request_started);
            }
            s.request += 1;
            self.start_request(j);
        }
    }

    fn seen(&mut self, j: usize, id: u64) {
        let now = self.now;
        let s = &mut self.state[j];
        if let Some(k) = s.in_gate.remove(&id)
            && s.in_gate.is_empty()
            && self.jobs[j].class == Class::Online
        {
            s.gap_until_ns = k.expect.gap_after_ns.map_or(0, |g| now + g);
        }
        // A completion wakes every held launch (the gate's futex).
        for h in 0..self.state.len() {
            if matches!(self.state[h].cpu, Cpu::Held { .. }) {
                self.issue(h);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PolicyKind, PolicyParams};

    const US: u64 = 1_000;

    /// An online service: 20 kernels of 100 us on 40 SMs a request, 10 us of CPU between
    /// launches, a request every 5 ms on average.
    fn online() -> SimJob {
        let k = SimKernel {
            duration_ns: 100 * US,
            sm_demand: 40,
            cpu_gap_ns: 10 * US,
            expect: Expect {
                duration_ns: Some(100 * US),
                gap_after_ns: Some(0),
                intensity: crate::Intensity::Compute,
            },
        };
        // The last kernel ends the request: its gap says nothing.
        let last = SimKernel {
            expect: Expect {
                gap_after_ns: None,
                ..k.expect
            },
            ..k
        };
        let mut request = vec![k; 19];
        request.push(last);
        SimJob {
            name: "serve".into(),
            class: Class::Online,
            mps_fraction: 1.0,
            interval_ns: 5_000 * US,
            requests: vec![request],
        }
    }

    /// Training: 50 kernels of 400 us on every SM an iteration.
    fn offline() -> SimJob {
        let k = SimKernel {
            duration_ns: 400 * US,
            sm_demand: 132,
            cpu_gap_ns: 5 * US,
            expect: Expect {
                duration_ns: Some(400 * US),
                gap_after_ns: None,
                intensity: crate::Intensity::Memory,
            },
        };
        SimJob {
            name: "train".into(),
            class: Class::Offline,
            mps_fraction: 1.0,
            interval_ns: 0,
            requests: vec![vec![k; 50]],
        }
    }

    fn config() -> SimConfig {
        SimConfig {
            duration: Duration::from_secs(2),
            ..SimConfig::new(132)
        }
    }

    fn policy(kind: PolicyKind) -> Box<dyn Policy> {
        kind.build(&PolicyParams::new(Duration::from_micros(250), 132))
    }

    #[test]
    fn a_job_alone_runs_at_its_solo_speed() {
        let r = run(&config(), &[online()], policy(PolicyKind::Passthrough));
        let p50 = r[0].latency_percentile(50.0).unwrap();
        // 20 x 100 us back to back (the CPU runs ahead): 2 ms.
        assert!((2_000 * US..2_050 * US).contains(&p50), "{p50}");
        let r = run(&config(), &[offline()], policy(PolicyKind::Passthrough));
        // 50 x 400 us = 20 ms an iteration: 50 a second, less the sync at each end.
        assert!(
            (48.0..=50.0).contains(&r[0].per_second),
            "{}",
            r[0].per_second
        );
    }

    #[test]
    fn the_same_seed_gives_the_same_run() {
        let jobs = [online(), offline()];
        let a = run(&config(), &jobs, policy(PolicyKind::Mmk));
        let b = run(&config(), &jobs, policy(PolicyKind::Mmk));
        assert_eq!(a, b);
    }

    #[test]
    fn holding_policies_protect_online_latency_at_some_offline_cost() {
        let jobs = [online(), offline()];
        let p50 = |r: &JobResult| r.latency_percentile(50.0).unwrap() as f64;
        // The policies as their papers have them: no hold budget.
        let config = || SimConfig {
            hold_budget_pct: 100,
            ..config()
        };
        let alone = p50(&run(&config(), &[online()], policy(PolicyKind::Passthrough))[0]);
        let train_alone =
            run(&config(), &[offline()], policy(PolicyKind::Passthrough))[0].per_second;
        let shared = p50(&run(&config(), &jobs, policy(PolicyKind::Passthrough))[0]);
        assert!(
            shared > 1.3 * alone,
            "plain sharing hurts: {shared} vs {alone}"
        );
        for (kind, within) in [
            // Thres (250 us) lets a 400 us kernel in several times in a 2 ms request.
            (PolicyKind::Mmk, 1.4),
            (PolicyKind::Orion, 1.1),
            (PolicyKind::Fikit, 1.1),
        ] {
            let r = run(&config(), &jobs, policy(kind));
            let p = p50(&r[0]);
            assert!(p <= shared, "{kind}: p50 {p} vs plain sharing {shared}");
            assert!(p <= within * alone, "{kind}: p50 {p} vs alone {alone}");
            assert!(r[1].held > 0, "{kind} held nothing");
            assert!(
                r[1].per_second > 0.5 * train_alone,
                "{kind}: training at {} of {train_alone}",
                r[1].per_second
            );
            assert_eq!(r[0].held, 0, "{kind}: online launches never wait");
        }
    }

    #[test]
    fn the_hold_budget_keeps_training_beside_a_busy_service_and_costs_a_light_one_nothing() {
        let p50 = |r: &JobResult| r.latency_percentile(50.0).unwrap() as f64;
        let budget = |pct| SimConfig {
            hold_budget_pct: pct,
            duration: Duration::from_secs(10),
            ..config()
        };
        // A service whose kernels fill the GPU, and an anti-starvation bound longer than
        // its requests: `mmk` holds the training for every request, whole. (The simulated
        // GPU shares SMs as a pool, so the training's speed does not show what holding it
        // costs on a GPU; its held time does.)
        let service = |interval_ms: u64| {
            let mut s = online();
            for k in s.requests.iter_mut().flatten() {
                k.sm_demand = 132;
            }
            s.interval_ns = interval_ms * 1_000 * US;
            s
        };
        let mmk = || PolicyKind::Mmk.build(&PolicyParams::new(Duration::from_millis(5), 132));
        // Busy: 2 ms of work every 5 ms on average. Without a budget the training's
        // launches are held whenever they meet a request (more than a tenth of its time);
        // with a budget of 5 %, at most a twentieth of its time, and one burst.
        let busy = [service(5), offline()];
        let unbounded = run(&budget(100), &busy, mmk());
        let bounded = run(&budget(5), &busy, mmk());
        let ten_s = 10_000_000 * US;
        assert!(
            unbounded[1].held_ns > ten_s / 10,
            "without a budget the training is held {} ms of 10 s",
            unbounded[1].held_ns / 1_000_000
        );
        assert!(
            bounded[1].held_ns <= ten_s / 20 + 50_000 * US,
            "a 5 % budget: held {} ms of 10 s",
            bounded[1].held_ns / 1_000_000
        );
        assert!(
            p50(&bounded[0]) > p50(&unbounded[0]),
            "the service pays for it"
        );
        // Light: a request every 100 ms. What it needs held fits the budget.
        let light = [service(100), offline()];
        let unbounded = run(&budget(100), &light, mmk());
        let bounded = run(&budget(5), &light, mmk());
        assert!(
            p50(&bounded[0]) <= 1.02 * p50(&unbounded[0]),
            "{} vs {}",
            p50(&bounded[0]),
            p50(&unbounded[0])
        );
        assert!(bounded[1].per_second >= 0.98 * unbounded[1].per_second);
    }

    #[test]
    fn a_trace_becomes_requests_with_their_cpu_gaps() {
        let rec = |seq: u64, launch: u64, start: u64, end: u64| TraceRecord {
            seq,
            pid: 1,
            class: Class::Online,
            api: "cuLaunchKernel".into(),
            kernel: "k".into(),
            grid: [8, 1, 1],
            block: [64, 1, 1],
            shared_mem: 0,
            blocks_per_sm: 2,
            sm_demand: 4,
            stream: 0,
            launch_ns: launch,
            held_ns: 0,
            start_ns: Some(start),
            end_ns: Some(end),
        };
        let trace = [
            rec(0, 0, 10 * US, 60 * US),
            rec(1, 5 * US, 60 * US, 110 * US),
            rec(2, 9_000 * US, 9_010 * US, 9_060 * US),
        ];
        let job = SimJob::from_trace("k", Class::Online, &trace, 1.0, 1_000 * US).unwrap();
        assert_eq!(job.requests.len(), 2);
        assert_eq!(job.requests[0].len(), 2);
        assert_eq!(job.requests[0][1].cpu_gap_ns, 5 * US);
        assert_eq!(job.requests[0][1].duration_ns, 50 * US);
        assert_eq!(job.requests[1][0].cpu_gap_ns, 0);
        assert_eq!(job.requests[0][0].expect.duration_ns, Some(50 * US));
    }
}
