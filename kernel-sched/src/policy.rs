//! Launch policies: whether one launch goes now or waits.
//!
//! A policy is a pure state machine over (launch, what is in flight, how long the launch has
//! waited). It does no I/O and reads no clock, so it is tested on made-up states and on
//! recorded traces. The gate calls it again whenever in-flight work completes or the
//! `recheck` it asked for has passed.
//!
//! Rules every policy keeps (shared/DESIGN.md, decisions 1-4):
//! - online launches never wait;
//! - an offline launch goes when it fits next to the online work in flight;
//! - an offline launch held longer than its bound goes anyway (anti-starvation).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

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
    type Err = String;
    fn from_str(s: &str) -> Result<Class, String> {
        match s {
            "online" => Ok(Class::Online),
            "offline" => Ok(Class::Offline),
            other => Err(format!("unknown job class {other:?} (online or offline)")),
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
}

/// What is in flight in the partition, summed over the live job processes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    /// SMs of the partition.
    pub sm_count: u32,
    pub online_kernels: u32,
    pub online_sm: u32,
    pub offline_kernels: u32,
    pub offline_sm: u32,
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
}

/// A launch policy. See the module docs for the rules every policy keeps.
pub trait Policy: Send + fmt::Debug {
    fn kind(&self) -> PolicyKind;

    /// Whether the gate must track completions (record an event behind each launch) for
    /// this policy to see what is in flight. `passthrough` needs none.
    fn needs_completions(&self) -> bool;

    fn decide(&mut self, launch: &Launch, state: &InFlight, waited: Duration) -> Decision;
}

/// The policies mmk knows, chosen per partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PolicyKind {
    /// Count and measure; never hold a launch.
    Passthrough,
    /// MMK's Listing 1 with the fixes of shared/DESIGN.md.
    Mmk,
}

impl PolicyKind {
    pub const ALL: [PolicyKind; 2] = [PolicyKind::Passthrough, PolicyKind::Mmk];

    pub fn as_str(self) -> &'static str {
        match self {
            PolicyKind::Passthrough => "passthrough",
            PolicyKind::Mmk => "mmk",
        }
    }

    /// The code stored in the gate's header.
    pub(crate) fn code(self) -> u32 {
        match self {
            PolicyKind::Passthrough => 0,
            PolicyKind::Mmk => 1,
        }
    }

    pub(crate) fn from_code(code: u32) -> Option<PolicyKind> {
        PolicyKind::ALL.into_iter().find(|k| k.code() == code)
    }

    /// A fresh policy of this kind. `base` is the anti-starvation base (see [`Mmk`]).
    pub fn build(self, base: Duration) -> Box<dyn Policy> {
        match self {
            PolicyKind::Passthrough => Box::new(Passthrough),
            PolicyKind::Mmk => Box::new(Mmk { base }),
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<PolicyKind, String> {
        PolicyKind::ALL
            .into_iter()
            .find(|k| k.as_str() == s)
            .ok_or_else(|| {
                let known: Vec<_> = PolicyKind::ALL.iter().map(|k| k.as_str()).collect();
                format!("unknown kernel policy {s:?} (one of: {})", known.join(", "))
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
    fn decide(&mut self, _: &Launch, _: &InFlight, _: Duration) -> Decision {
        Decision::Launch
    }
}

/// MMK's kernel scheduler (Listing 1), as fixed in shared/DESIGN.md:
/// - online kernels always launch (an online kernel that does not fit still launches; its
///   SMs count as in flight, which keeps offline kernels out);
/// - an offline kernel launches when it fits: no online kernel is in flight, or its SM demand
///   plus the online SMs in flight stays within the partition;
/// - an offline kernel held for `Thres = base / mps_fraction` launches anyway.
#[derive(Debug, Clone, Copy)]
pub struct Mmk {
    /// The anti-starvation base: 2.5 % of the online job's request latency (Orion's
    /// DUR_THRESHOLD) when it is known.
    pub base: Duration,
}

impl Mmk {
    /// `Thres` for a job with this MPS share (clamped to [1 %, 100 %]).
    pub fn threshold(&self, mps_fraction: f64) -> Duration {
        let fraction = if mps_fraction.is_finite() {
            mps_fraction.clamp(0.01, 1.0)
        } else {
            1.0
        };
        self.base.div_f64(fraction)
    }

    /// Listing 1's check, named for what it returns (decision 1): true when the launch fits.
    pub fn fits(launch: &Launch, state: &InFlight) -> bool {
        state.online_kernels == 0
            || launch.sm_demand.saturating_add(state.online_sm) <= state.sm_count
    }
}

impl Policy for Mmk {
    fn kind(&self) -> PolicyKind {
        PolicyKind::Mmk
    }
    fn needs_completions(&self) -> bool {
        true
    }
    fn decide(&mut self, launch: &Launch, state: &InFlight, waited: Duration) -> Decision {
        if launch.class == Class::Online || Mmk::fits(launch, state) {
            return Decision::Launch;
        }
        let thres = self.threshold(launch.mps_fraction);
        if waited >= thres {
            Decision::LaunchStarved
        } else {
            Decision::Hold {
                recheck: thres - waited,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    fn busy(online_kernels: u32, online_sm: u32) -> InFlight {
        InFlight {
            sm_count: 132,
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
        }
    }

    #[test]
    fn online_never_waits() {
        let mut p = Mmk { base: 250 * US };
        let full = busy(10, 132);
        assert_eq!(
            p.decide(&launch(Class::Online, 132, 1.0), &full, Duration::ZERO),
            Decision::Launch
        );
    }

    #[test]
    fn offline_goes_when_idle_or_when_it_fits() {
        let mut p = Mmk { base: 250 * US };
        let off = launch(Class::Offline, 100, 0.5);
        assert_eq!(
            p.decide(&off, &busy(0, 0), Duration::ZERO),
            Decision::Launch
        );
        assert_eq!(
            p.decide(&off, &busy(1, 32), Duration::ZERO),
            Decision::Launch
        );
        assert_eq!(
            p.decide(&off, &busy(1, 33), Duration::ZERO),
            Decision::Hold { recheck: 500 * US },
            "100 + 33 SMs do not fit in 132; Thres = 250 us / 0.5"
        );
    }

    #[test]
    fn a_held_offline_launch_goes_after_thres() {
        let mut p = Mmk { base: 250 * US };
        let off = launch(Class::Offline, 132, 0.25);
        let state = busy(3, 132);
        assert_eq!(
            p.decide(&off, &state, 999 * US),
            Decision::Hold { recheck: US }
        );
        assert_eq!(p.decide(&off, &state, 1000 * US), Decision::LaunchStarved);
    }

    #[test]
    fn threshold_clamps_odd_shares() {
        let p = Mmk { base: 100 * US };
        assert_eq!(p.threshold(1.0), 100 * US);
        assert_eq!(p.threshold(0.0), 10_000 * US, "0 % is treated as 1 %");
        assert_eq!(p.threshold(7.0), 100 * US);
        assert_eq!(p.threshold(f64::NAN), 100 * US);
    }

    #[test]
    fn passthrough_never_holds() {
        let mut p = PolicyKind::Passthrough.build(US);
        assert!(!p.needs_completions());
        assert_eq!(
            p.decide(
                &launch(Class::Offline, 132, 0.1),
                &busy(5, 132),
                Duration::ZERO
            ),
            Decision::Launch
        );
    }

    #[test]
    fn kinds_parse_and_round_trip_through_their_codes() {
        for kind in PolicyKind::ALL {
            assert_eq!(kind.as_str().parse::<PolicyKind>(), Ok(kind));
            assert_eq!(PolicyKind::from_code(kind.code()), Some(kind));
        }
        let err = "fifo".parse::<PolicyKind>().unwrap_err();
        assert!(err.contains("passthrough, mmk"), "{err}");
        assert_eq!(PolicyKind::from_code(99), None);
    }
}
