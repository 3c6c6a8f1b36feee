//! Launch policies: whether one launch goes now or waits.
//!
//! A policy is a pure state machine over (launch, what is in flight, how long the launch has
//! waited). It does no I/O and reads no clock, so it is tested on made-up states and on
//! recorded traces. The gate calls it again whenever in-flight work completes or the
//! `recheck` it asked for has passed.
//!
//! Rules every policy keeps (docs/architecture.md, decisions 1-4):
//! - online launches never wait;
//! - an offline launch waits only while it would get in the way of online work in flight
//!   (each policy has its own idea of that);
//! - no launch waits longer than the gate's hard bound ([`crate::GateConfig::max_hold`]).
//!   `mmk` has its own, shorter anti-starvation bound, `Thres = base / mps_fraction`
//!   (decision 3); `orion` and `fikit` have none in their papers and keep to that.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::UnknownName;
use crate::profile::{Expect, Intensity};

/// A job's class, as the job spec declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    Online,
    Offline,
}

impl Class {
    /// The class code stored in a gate slot.
    pub(crate) fn code(self) -> u32 {
        match self {
            Class::Online => 1,
            Class::Offline => 2,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<Class> {
        match code {
            1 => Some(Class::Online),
            2 => Some(Class::Offline),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Class::Online => "online",
            Class::Offline => "offline",
        }
    }
}

impl FromStr for Class {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Class, UnknownName> {
        match s {
            "online" => Ok(Class::Online),
            "offline" => Ok(Class::Offline),
            other => Err(UnknownName::new("job class", other, "online or offline")),
        }
    }
}

/// One launch, as the policy sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Launch {
    pub class: Class,
    /// SMs the launch occupies (see [`crate::sm_demand`]).
    pub sm_demand: u32,
    /// The job's MPS share in (0, 1]; a smaller share waits longer before it is let in.
    pub mps_fraction: f64,
    /// What the job's kernel profile says about this kernel (all unknown without one).
    pub expect: Expect,
}

/// What is in flight in the partition, summed over the live job processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    /// SMs of the partition.
    pub sm_count: u32,
    /// Live online job processes, busy or not.
    pub online_jobs: u32,
    pub online_kernels: u32,
    pub online_sm: u32,
    /// Online kernels in flight that their profile calls compute- or memory-bound.
    pub online_compute: u32,
    pub online_memory: u32,
    /// Where every online process is idle: the end of the GPU gap their profiles predict
    /// (`CLOCK_MONOTONIC` ns, the earliest over the online processes); `None` when no
    /// online process predicted one (no profile, or between requests).
    pub online_gap_until_ns: Option<u64>,
    pub offline_kernels: u32,
    pub offline_sm: u32,
    /// Expected run time of the offline kernels in flight (unknown ones count 0).
    pub offline_expected_ns: u64,
}

/// The time, for a policy that reads none itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Clock {
    /// `CLOCK_MONOTONIC` nanoseconds.
    pub now_ns: u64,
    /// How long this launch has been held so far.
    pub waited: Duration,
    /// The part of `waited` spent in [`Decision::Hold`] (not [`Decision::Queued`]): what an
    /// anti-starvation bound measures.
    pub starving: Duration,
}

/// A policy's answer for one launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Launch now.
    Launch,
    /// Launch now because the launch waited as long as it may (anti-starvation).
    LaunchStarved,
    /// Wait; ask again when in-flight work completes, or after `recheck` at the latest.
    Hold { recheck: Duration },
    /// Wait, as `Hold`, for offline work already in flight, which completes by itself: the
    /// wait does not count as starving ([`Clock::starving`]).
    Queued { recheck: Duration },
}

/// A launch policy. See the module docs for the rules every policy keeps.
pub trait Policy: Send + fmt::Debug {
    fn kind(&self) -> PolicyKind;

    /// Whether the gate must track completions (record an event behind each launch) for
    /// this policy to see what is in flight. `passthrough` needs none.
    fn needs_completions(&self) -> bool;

    fn decide(&mut self, launch: &Launch, state: &InFlight, clock: Clock) -> Decision;
}

/// The policies mmk knows, chosen per partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Count and measure; never hold a launch.
    Passthrough,
    /// MMK's Listing 1 with the fixes of docs/architecture.md.
    Mmk,
    /// Orion's policy: opposite compute/memory profiles, SM_THRESHOLD, DUR_THRESHOLD.
    Orion,
    /// FIKIT: offline kernels fill the online job's predicted inter-kernel gaps.
    Fikit,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 4] = [
        PolicyKind::Passthrough,
        PolicyKind::Mmk,
        PolicyKind::Orion,
        PolicyKind::Fikit,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Passthrough => "passthrough",
            PolicyKind::Mmk => "mmk",
            PolicyKind::Orion => "orion",
            PolicyKind::Fikit => "fikit",
        }
    }

    /// The code stored in the gate's header.
    pub(crate) fn code(self) -> u32 {
        match self {
            PolicyKind::Passthrough => 0,
            PolicyKind::Mmk => 1,
            PolicyKind::Orion => 2,
            PolicyKind::Fikit => 3,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// A fresh policy of this kind, set up from its partition's gate.
    pub fn build(self, params: &PolicyParams) -> Box<dyn Policy> {
        let PolicyParams {
            base,
            sm_count,
            offline_depth,
            offline_paused,
        } = *params;
        match self {
            PolicyKind::Passthrough => Box::new(Passthrough),
            PolicyKind::Mmk => Box::new(Mmk {
                base,
                offline_depth,
                offline_paused,
            }),
            PolicyKind::Orion => Box::new(Orion::new(base, sm_count)),
            PolicyKind::Fikit => Box::new(Fikit::new(base)),
        }
    }
}

/// What a policy is built from: its partition's gate settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PolicyParams {
    /// The anti-starvation base, which is also Orion's DUR_THRESHOLD and FIKIT's bound on
    /// queued offline work (docs/architecture.md, decision 3).
    pub base: Duration,
    /// SMs of the partition.
    pub sm_count: u32,
    /// `mmk` only: while an online job is present, at most this many offline kernels in
    /// flight in the partition; 0 sets no cap (see [`Mmk`]).
    pub offline_depth: u32,
    /// `mmk` only: offline launches wait while online kernels are in flight (see [`Mmk`]).
    pub offline_paused: bool,
}

impl PolicyParams {
    /// No offline depth cap, offline work not paused.
    pub fn new(base: Duration, sm_count: u32) -> PolicyParams {
        PolicyParams {
            base,
            sm_count,
            offline_depth: 0,
            offline_paused: false,
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<PolicyKind, UnknownName> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = PolicyKind::ALL.iter().map(|k| k.as_str()).collect();
                UnknownName::new("kernel policy", s, format!("one of: {}", known.join(", ")))
            })
    }
}

/// Never holds anything: the interposer only counts and measures.
#[derive(Debug, Clone, Copy, Default)]
pub struct Passthrough;

impl Policy for Passthrough {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Passthrough
    }
    fn needs_completions(&self) -> bool {
        false
    }
    fn decide(&mut self, _: &Launch, _: &InFlight, _: Clock) -> Decision {
        Decision::Launch
    }
}

/// `Thres = base / mps_fraction`, the fraction clamped to [1 %, 100 %] (decision 3).
pub fn starvation_bound(base: Duration, mps_fraction: f64) -> Duration {
    let fraction = if mps_fraction.is_finite() {
        mps_fraction.clamp(0.01, 1.0)
    } else {
        1.0
    };
    // Whatever base a gate holds (its header is shared with the job's processes), never a
    // panic: a bound past what a Duration holds is the longest one.
    Duration::try_from_secs_f64(base.as_secs_f64() / fraction).unwrap_or(Duration::MAX)
}

/// How often a launch waiting at `mmk`'s depth cap asks again if no completion woke it.
pub const QUEUED_RECHECK: Duration = Duration::from_millis(1);

/// MMK's kernel scheduler (Listing 1), as fixed in docs/architecture.md:
/// - online kernels always launch (an online kernel that does not fit still launches; its
///   SMs count as in flight, which keeps offline kernels out);
/// - an offline kernel launches when it fits: no online kernel is in flight, or its SM demand
///   plus the online SMs in flight stays within the partition;
/// - with `offline_depth` > 0 and an online job present (busy or idle), an offline kernel
///   also waits while that many offline kernels are in flight in the partition. Listing 1
///   only looks at launches: a training job runs far ahead of its GPU (a whole step, tens of
///   ms, is queued by the time it syncs), and an online request that arrives meets all of
///   that queued work, which no hold can take back. The cap bounds what it meets. Such a
///   wait ([`Decision::Queued`]) is for offline work already in flight, which completes by
///   itself, so only the gate's hard bound applies to it, and it does not count towards
///   `Thres`;
/// - an offline kernel held for `Thres = base / mps_fraction` because it does not fit
///   ([`Clock::starving`]) launches anyway.
#[derive(Debug, Clone, Copy)]
pub struct Mmk {
    /// The anti-starvation base: 2.5 % of the online job's request latency (Orion's
    /// DUR_THRESHOLD) when it is known.
    pub base: Duration,
    /// At most this many offline kernels in flight while an online job is present; 0: no cap.
    pub offline_depth: u32,
    /// Offline kernels wait while online kernels are in flight.
    pub offline_paused: bool,
}

impl Mmk {
    /// `Thres` for a job with this MPS share.
    pub fn threshold(&self, mps_fraction: f64) -> Duration {
        starvation_bound(self.base, mps_fraction)
    }

    /// Listing 1's check, named for what it returns (decision 1): true when the launch fits.
    pub fn fits(launch: &Launch, state: &InFlight) -> bool {
        state.online_kernels == 0
            || launch.sm_demand.saturating_add(state.online_sm) <= state.sm_count
    }

    /// Whether the offline work queued in the partition is at the cap.
    pub fn queue_full(&self, state: &InFlight) -> bool {
        self.offline_depth > 0
            && state.online_jobs > 0
            && state.offline_kernels >= self.offline_depth
    }
}

impl Policy for Mmk {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Mmk
    }
    fn needs_completions(&self) -> bool {
        true
    }
    fn decide(&mut self, launch: &Launch, state: &InFlight, clock: Clock) -> Decision {
        if launch.class == Class::Online {
            return Decision::Launch;
        }
        if self.queue_full(state) || (self.offline_paused && state.online_kernels > 0) {
            // Offline work already queued completes by itself, so this wait needs no
            // anti-starvation bound but the gate's hard one; a completion wakes it.
            return Decision::Queued {
                recheck: QUEUED_RECHECK,
            };
        }
        if Mmk::fits(launch, state) {
            return Decision::Launch;
        }
        let thres = self.threshold(launch.mps_fraction);
        if clock.starving >= thres {
            Decision::LaunchStarved
        } else {
            Decision::Hold {
                recheck: thres - clock.starving,
            }
        }
    }
}

/// Orion's best-effort scheduling (orion.txt §5.1.1, Listing 1), over several processes:
/// - online kernels always launch;
/// - while an online job is present and the offline kernels in flight are expected to run
///   longer than `dur_threshold` (2.5 % of the online request latency), offline kernels
///   wait: once queued they cannot be preempted (DUR_THRESHOLD);
/// - with no online kernel in flight an offline kernel launches;
/// - otherwise it launches when it needs fewer than `sm_threshold` SMs and its profile is
///   the opposite of the online kernels in flight (a compute-bound kernel next to
///   memory-bound ones and the reverse). Kernels of unknown profile go next to anything, as
///   Orion allows (they are mostly small);
/// - there is no anti-starvation bound but the gate's hard one; a held launch asks again
///   when work completes, or after `dur_threshold` at the latest.
#[derive(Debug, Clone, Copy)]
pub struct Orion {
    pub dur_threshold: Duration,
    /// Orion's default: the partition's SM count.
    pub sm_threshold: u32,
}

impl Orion {
    pub fn new(dur_threshold: Duration, sm_count: u32) -> Orion {
        Orion {
            dur_threshold,
            sm_threshold: sm_count,
        }
    }

    /// `have_different_profiles`, with unknown profiles compatible with anything.
    pub fn opposite(launch: &Launch, state: &InFlight) -> bool {
        match launch.expect.intensity {
            Intensity::Compute => state.online_compute == 0,
            Intensity::Memory => state.online_memory == 0,
            Intensity::Unknown => true,
        }
    }
}

impl Policy for Orion {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Orion
    }
    fn needs_completions(&self) -> bool {
        true
    }
    fn decide(&mut self, launch: &Launch, state: &InFlight, _: Clock) -> Decision {
        if launch.class == Class::Online {
            return Decision::Launch;
        }
        let throttled = state.online_jobs > 0
            && state.offline_kernels > 0
            && u128::from(state.offline_expected_ns) > self.dur_threshold.as_nanos();
        let go = !throttled
            && (state.online_kernels == 0
                || (launch.sm_demand < self.sm_threshold && Orion::opposite(launch, state)));
        if go {
            Decision::Launch
        } else {
            Decision::Hold {
                recheck: self.dur_threshold,
            }
        }
    }
}

/// FIKIT (fikit.txt, Algorithms 1 and 2) over several processes: offline kernels fill the
/// GPU idle gaps between an online job's kernels.
/// - online kernels always launch, and an online kernel in flight stops any filling (the
///   early stop of the paper: the gap is over);
/// - when every online process is idle and its profile predicts the gap, an offline kernel
///   goes if its expected run time fits in what is left of the gap after the offline work
///   already in flight; gaps under `min_gap` (0.1 ms) are not filled;
/// - with no online job offline kernels go; kernels the profile does not know go too
///   (optimistic);
/// - between requests (the last kernel's gap says nothing) or without a prediction,
///   offline kernels go while the offline work in flight stays within `base`, and always
///   one at a time: the paper's scheduler keeps low-priority kernels in its own queue, so
///   an online request that arrives finds at most that much queued on the GPU;
/// - once the predicted gap is over, offline kernels wait for the online job's next
///   kernel, but no longer than `base` past the gap's end: an online job that did not come
///   back is between requests after all (the paper's scheduler sees the next launch come
///   or not; ours sees only the prediction);
/// - each process offers its one pending launch, so "best fit" is first fit across
///   processes; there is no anti-starvation bound but the gate's hard one; a held launch
///   asks again when work completes, when the predicted gap ends, or after `base`.
#[derive(Debug, Clone, Copy)]
pub struct Fikit {
    pub base: Duration,
    pub min_gap: Duration,
}

impl Fikit {
    pub fn new(base: Duration) -> Fikit {
        Fikit {
            base,
            min_gap: Duration::from_micros(100),
        }
    }

    /// What is left of the predicted gap for one more kernel, if a gap is predicted.
    pub fn room(&self, state: &InFlight, now_ns: u64) -> Option<u64> {
        let until = state.online_gap_until_ns?;
        Some(
            until
                .saturating_sub(now_ns)
                .saturating_sub(state.offline_expected_ns),
        )
    }
}

impl Policy for Fikit {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Fikit
    }
    fn needs_completions(&self) -> bool {
        true
    }
    fn decide(&mut self, launch: &Launch, state: &InFlight, clock: Clock) -> Decision {
        if launch.class == Class::Online || state.online_jobs == 0 {
            return Decision::Launch;
        }
        let hold = Decision::Hold { recheck: self.base };
        if state.online_kernels > 0 {
            return hold;
        }
        let overdue = state.online_gap_until_ns.is_some_and(|until| {
            u128::from(clock.now_ns.saturating_sub(until)) > self.base.as_nanos()
        });
        let open = |need: u64| {
            state.offline_kernels == 0
                || u128::from(state.offline_expected_ns.saturating_add(need))
                    <= self.base.as_nanos()
        };
        let go = match (self.room(state, clock.now_ns), launch.expect.duration_ns) {
            (_, None) => true,
            (None, Some(need)) => open(need),
            (Some(_), Some(need)) if overdue => open(need),
            (Some(room), Some(need)) => {
                let gap = state
                    .online_gap_until_ns
                    .unwrap_or(0)
                    .saturating_sub(clock.now_ns);
                u128::from(gap) >= self.min_gap.as_nanos() && need <= room
            }
        };
        if go { Decision::Launch } else { hold }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    fn busy(online_kernels: u32, online_sm: u32) -> InFlight {
        InFlight {
            sm_count: 132,
            online_jobs: 1,
            online_kernels,
            online_sm,
            ..InFlight::default()
        }
    }

    fn launch(class: Class, sm_demand: u32, mps_fraction: f64) -> Launch {
        Launch {
            class,
            sm_demand,
            mps_fraction,
            expect: Expect::default(),
        }
    }

    fn expecting(mut l: Launch, us: u64, intensity: Intensity) -> Launch {
        l.expect = Expect {
            duration_ns: Some(us * 1_000),
            gap_after_ns: None,
            intensity,
        };
        l
    }

    /// Held for `d`, all of it starving.
    fn waited(d: Duration) -> Clock {
        Clock {
            now_ns: 1_000_000_000,
            waited: d,
            starving: d,
        }
    }

    const NOW: Clock = Clock {
        now_ns: 1_000_000_000,
        waited: Duration::ZERO,
        starving: Duration::ZERO,
    };

    fn all_policies() -> Vec<Box<dyn Policy>> {
        PolicyKind::ALL
            .into_iter()
            .map(|k| k.build(&PolicyParams::new(250 * US, 132)))
            .collect()
    }

    #[test]
    fn online_never_waits_under_any_policy() {
        let mut full = busy(10, 132);
        full.online_compute = 10;
        full.offline_kernels = 4;
        full.offline_expected_ns = 1_000_000_000;
        full.online_gap_until_ns = Some(0);
        for mut p in all_policies() {
            let online = expecting(launch(Class::Online, 132, 1.0), 900, Intensity::Compute);
            assert_eq!(
                p.decide(&online, &full, NOW),
                Decision::Launch,
                "{:?}",
                p.kind()
            );
        }
    }

    #[test]
    fn mmk_lets_a_starved_launch_go_after_thres_and_the_others_keep_holding() {
        let mut state = busy(3, 132);
        state.online_compute = 3;
        state.offline_kernels = 2;
        state.offline_expected_ns = 10_000_000;
        let off = expecting(launch(Class::Offline, 132, 0.25), 500, Intensity::Compute);
        let mut mmk = PolicyKind::Mmk.build(&PolicyParams::new(250 * US, 132));
        assert_eq!(
            mmk.decide(&off, &state, waited(999 * US)),
            Decision::Hold { recheck: US },
            "Thres = 250 us / 0.25"
        );
        assert_eq!(
            mmk.decide(&off, &state, waited(1000 * US)),
            Decision::LaunchStarved
        );
        for kind in [PolicyKind::Orion, PolicyKind::Fikit] {
            let mut p = kind.build(&PolicyParams::new(250 * US, 132));
            assert_eq!(
                p.decide(&off, &state, waited(Duration::from_secs(1))),
                Decision::Hold { recheck: 250 * US },
                "{kind}: only the gate's hard bound lets it go"
            );
        }
    }

    #[test]
    fn mmk_lets_offline_go_when_idle_or_when_it_fits() {
        let mut p = Mmk {
            base: 250 * US,
            offline_depth: 0,
            offline_paused: false,
        };
        let off = launch(Class::Offline, 100, 0.5);
        assert_eq!(p.decide(&off, &busy(0, 0), NOW), Decision::Launch);
        assert_eq!(p.decide(&off, &busy(1, 32), NOW), Decision::Launch);
        assert_eq!(
            p.decide(&off, &busy(1, 33), NOW),
            Decision::Hold { recheck: 500 * US },
            "100 + 33 SMs do not fit in 132; Thres = 250 us / 0.5"
        );
    }

    #[test]
    fn mmk_caps_queued_offline_work_while_an_online_job_is_present() {
        let mut p = PolicyKind::Mmk.build(&PolicyParams {
            offline_depth: 4,
            ..PolicyParams::new(250 * US, 132)
        });
        let off = launch(Class::Offline, 8, 1.0);
        let mut idle = busy(0, 0);
        idle.offline_kernels = 3;
        assert_eq!(p.decide(&off, &idle, NOW), Decision::Launch, "3 < 4 queued");
        idle.offline_kernels = 4;
        let queued = Decision::Queued {
            recheck: QUEUED_RECHECK,
        };
        assert_eq!(
            p.decide(&off, &idle, NOW),
            queued,
            "the online job is idle, but 4 offline kernels are queued"
        );
        assert_eq!(
            p.decide(&off, &idle, waited(Duration::from_millis(50))),
            queued,
            "waiting on queued work is not starving: only the gate's hard bound ends it"
        );
        // 50 ms at the cap, then room in the queue but an online kernel filling the SMs:
        // the fit test holds it for a full Thres, which the time at the cap did not use up.
        let mut full = busy(1, 132);
        full.offline_kernels = 3;
        let after_queue = Clock {
            waited: Duration::from_millis(50),
            ..NOW
        };
        assert_eq!(
            p.decide(&off, &full, after_queue),
            Decision::Hold { recheck: 250 * US }
        );
        let starved = Clock {
            starving: 250 * US,
            ..after_queue
        };
        assert_eq!(p.decide(&off, &full, starved), Decision::LaunchStarved);
        let mut no_online = idle;
        no_online.online_jobs = 0;
        no_online.offline_kernels = 1000;
        assert_eq!(
            p.decide(&off, &no_online, NOW),
            Decision::Launch,
            "no online job: no cap"
        );
        let mut busy_room = busy(1, 100);
        busy_room.offline_kernels = 2;
        assert_eq!(
            p.decide(&off, &busy_room, NOW),
            Decision::Launch,
            "fits, under the cap"
        );
        let mut uncapped = PolicyKind::Mmk.build(&PolicyParams::new(250 * US, 132));
        assert_eq!(
            uncapped.decide(&off, &idle, NOW),
            Decision::Launch,
            "depth 0 sets no cap"
        );
        let online = launch(Class::Online, 132, 1.0);
        assert_eq!(p.decide(&online, &idle, NOW), Decision::Launch);
    }

    #[test]
    fn mmk_with_offline_paused_keeps_even_a_fitting_offline_kernel_out_while_online_work_runs() {
        let mut p = PolicyKind::Mmk.build(&PolicyParams {
            offline_paused: true,
            ..PolicyParams::new(250 * US, 132)
        });
        let small = launch(Class::Offline, 8, 1.0);
        let queued = Decision::Queued {
            recheck: QUEUED_RECHECK,
        };
        assert_eq!(
            p.decide(&small, &busy(1, 8), waited(Duration::from_secs(1))),
            queued,
            "8 + 8 SMs fit in 132, yet it waits, past Thres: only the hard bound lets it go"
        );
        assert_eq!(p.decide(&small, &busy(0, 0), NOW), Decision::Launch);
        let online = launch(Class::Online, 132, 1.0);
        assert_eq!(p.decide(&online, &busy(3, 132), NOW), Decision::Launch);
    }

    #[test]
    fn threshold_clamps_odd_shares() {
        let p = Mmk {
            base: 100 * US,
            offline_depth: 0,
            offline_paused: false,
        };
        assert_eq!(p.threshold(1.0), 100 * US);
        assert_eq!(p.threshold(0.0), 10_000 * US, "0 % is treated as 1 %");
        assert_eq!(p.threshold(7.0), 100 * US);
        assert_eq!(p.threshold(f64::NAN), 100 * US);
    }

    #[test]
    fn passthrough_never_holds() {
        let mut p = PolicyKind::Passthrough.build(&PolicyParams::new(US, 132));
        assert!(!p.needs_completions());
        assert_eq!(
            p.decide(&launch(Class::Offline, 132, 0.1), &busy(5, 132), NOW),
            Decision::Launch
        );
    }

    #[test]
    fn orion_pairs_opposite_profiles_and_keeps_big_kernels_out() {
        let mut p = Orion::new(250 * US, 132);
        let mut state = busy(2, 60);
        state.online_compute = 2;
        let memory = expecting(launch(Class::Offline, 40, 1.0), 50, Intensity::Memory);
        let compute = expecting(launch(Class::Offline, 40, 1.0), 50, Intensity::Compute);
        let unknown = expecting(launch(Class::Offline, 40, 1.0), 50, Intensity::Unknown);
        assert_eq!(p.decide(&memory, &state, NOW), Decision::Launch);
        assert!(matches!(
            p.decide(&compute, &state, NOW),
            Decision::Hold { .. }
        ));
        assert_eq!(
            p.decide(&unknown, &state, NOW),
            Decision::Launch,
            "optimistic"
        );
        let whole = expecting(launch(Class::Offline, 132, 1.0), 50, Intensity::Memory);
        assert!(
            matches!(p.decide(&whole, &state, NOW), Decision::Hold { .. }),
            "needs SM_THRESHOLD (132) or more"
        );
        assert_eq!(
            p.decide(&compute, &busy(0, 0), NOW),
            Decision::Launch,
            "no online kernel in flight"
        );
    }

    #[test]
    fn orion_dur_threshold_throttles_queued_offline_work() {
        let mut p = Orion::new(250 * US, 132);
        let off = expecting(launch(Class::Offline, 10, 1.0), 100, Intensity::Unknown);
        let mut state = busy(0, 0);
        state.offline_kernels = 3;
        state.offline_expected_ns = 300_000;
        assert_eq!(
            p.decide(&off, &state, NOW),
            Decision::Hold { recheck: 250 * US },
            "300 us of offline work queued is over DUR_THRESHOLD, even with online idle"
        );
        state.offline_expected_ns = 200_000;
        assert_eq!(p.decide(&off, &state, NOW), Decision::Launch);
        state.online_jobs = 0;
        state.offline_expected_ns = 10_000_000;
        assert_eq!(
            p.decide(&off, &state, NOW),
            Decision::Launch,
            "no online job: nothing to protect"
        );
    }

    #[test]
    fn fikit_fills_a_predicted_gap_and_never_overruns_it_by_more_than_one_kernel() {
        let mut p = Fikit::new(250 * US);
        let gap_start = NOW.now_ns;
        let mut state = busy(0, 0);
        state.online_gap_until_ns = Some(gap_start + 1_000_000);
        // Offline kernels of 300, 300, 300, 200 and 100 us offered one after another while
        // the gap lasts; those let in stay in flight.
        let mut filled = 0u64;
        let mut admitted = Vec::new();
        for us in [300, 300, 300, 200, 100, 50] {
            let off = expecting(launch(Class::Offline, 20, 1.0), us, Intensity::Unknown);
            state.offline_expected_ns = filled;
            if p.decide(&off, &state, NOW) == Decision::Launch {
                filled += us * 1_000;
                admitted.push(us);
            }
        }
        assert_eq!(
            admitted,
            [300, 300, 300, 100],
            "200 us no longer fits in 100 us"
        );
        assert!(filled <= 1_000_000, "filled {filled} ns of a 1 ms gap");
        // Early stop: the online job launched again.
        let mut back = state;
        back.online_kernels = 1;
        back.offline_expected_ns = 0;
        let small = expecting(launch(Class::Offline, 1, 1.0), 1, Intensity::Unknown);
        assert!(matches!(
            p.decide(&small, &back, NOW),
            Decision::Hold { .. }
        ));
        // A gap under 0.1 ms is not filled.
        let mut short = busy(0, 0);
        short.online_gap_until_ns = Some(gap_start + 90_000);
        assert!(matches!(
            p.decide(&small, &short, NOW),
            Decision::Hold { .. }
        ));
        // The predicted gap is over and the online job has not come back: wait for it, for
        // `base` at most.
        let mut late = busy(0, 0);
        late.online_gap_until_ns = Some(gap_start - 1);
        assert!(matches!(
            p.decide(&small, &late, NOW),
            Decision::Hold { .. }
        ));
        late.online_gap_until_ns = Some(gap_start - 251_000);
        assert_eq!(
            p.decide(&small, &late, NOW),
            Decision::Launch,
            "250 us overdue: between requests"
        );
    }

    #[test]
    fn fikit_is_optimistic_without_a_prediction() {
        let mut p = Fikit::new(250 * US);
        let mut idle = busy(0, 0);
        let big = expecting(launch(Class::Offline, 132, 1.0), 50_000, Intensity::Unknown);
        assert_eq!(
            p.decide(&big, &idle, NOW),
            Decision::Launch,
            "between requests"
        );
        idle.offline_kernels = 1;
        idle.offline_expected_ns = 50_000_000;
        assert!(
            matches!(p.decide(&big, &idle, NOW), Decision::Hold { .. }),
            "one long kernel at a time between requests"
        );
        let small = expecting(launch(Class::Offline, 132, 1.0), 100, Intensity::Unknown);
        idle.offline_expected_ns = 100_000;
        assert_eq!(
            p.decide(&small, &idle, NOW),
            Decision::Launch,
            "within base"
        );
        idle.offline_expected_ns = 0;
        let mut gap = idle;
        gap.online_gap_until_ns = Some(NOW.now_ns + 500_000);
        let unknown = launch(Class::Offline, 132, 1.0);
        assert_eq!(
            p.decide(&unknown, &gap, NOW),
            Decision::Launch,
            "unprofiled kernel"
        );
        let mut nobody = InFlight {
            sm_count: 132,
            ..InFlight::default()
        };
        nobody.offline_kernels = 9;
        assert_eq!(
            p.decide(&big, &nobody, NOW),
            Decision::Launch,
            "no online job"
        );
    }

    #[test]
    fn kinds_parse_and_round_trip_through_their_codes() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.as_str().parse::<PolicyKind>(), Ok(kind));
            assert_eq!(PolicyKind::from_code(kind.code()), Some(kind));
            assert_eq!(kind.build(&PolicyParams::new(US, 132)).kind(), kind);
        }
        let err = "fifo".parse::<PolicyKind>().unwrap_err().to_string();
        assert!(err.contains("passthrough, mmk, orion, fikit"), "{err}");
        assert_eq!(PolicyKind::from_code(99), None);
    }
}
