//! A launch through the gate: its accounting (begin, end, count), what is in flight, and the admission decision.

use std::sync::atomic::fence;
use std::time::Instant;

use super::*;
use crate::policy::{Clock, Decision, InFlight, Launch};

impl Gate {
    /// A launch is about to go (lock-free; this slot, and for an online launch the device
    /// word when the device wait is on).
    #[inline]
    pub fn begin(&self, slot: SlotId, charge: &Charge) {
        let s = &self.seg().slots[slot.0];
        s.launches.fetch_add(1, Ordering::Relaxed);
        if charge.expected_ns > 0 {
            s.inflight_expected_ns
                .fetch_add(charge.expected_ns, Ordering::AcqRel);
        }
        match charge.intensity {
            Intensity::Compute => {
                s.inflight_compute.fetch_add(1, Ordering::AcqRel);
            }
            Intensity::Memory => {
                s.inflight_memory.fetch_add(1, Ordering::AcqRel);
            }
            Intensity::Unknown => {}
        }
        s.inflight_sm.fetch_add(charge.sm, Ordering::AcqRel);
        if charge.ask > 0 {
            s.inflight_ask.fetch_add(charge.ask, Ordering::AcqRel);
        }
        if s.inflight.fetch_add(1, Ordering::AcqRel) == 0 {
            // A busy period starts; its end (in `end`, after this kernel's launch returned)
            // adds it to `busy_ns`.
            s.busy_since_ns.store(monotonic_ns(), Ordering::Release);
        }
        // After the slot's count, so that a recount never finds the word above the slots
        // for a launch still on its way. Without the device wait nothing reads the word.
        if s.class.load(Ordering::Acquire) == Class::Online.code() && self.device_wait() {
            self.device_online_begin();
        }
    }

    /// A launch that `begin` counted has completed; `now_ns` is when that was seen.
    #[inline]
    pub fn end(&self, slot: SlotId, charge: &Charge, now_ns: u64) {
        let s = &self.seg().slots[slot.0];
        // A slot that was reaped or re-joined meanwhile is at zero: never wrap below it.
        let sub = |counter: &AtomicU32, by: u32| {
            counter
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(by))
                })
                .unwrap_or(0)
                .saturating_sub(by)
        };
        sub(&s.inflight_sm, charge.sm);
        if charge.ask > 0 {
            sub(&s.inflight_ask, charge.ask);
        }
        match charge.intensity {
            Intensity::Compute => {
                sub(&s.inflight_compute, 1);
            }
            Intensity::Memory => {
                sub(&s.inflight_memory, 1);
            }
            Intensity::Unknown => {}
        }
        if charge.expected_ns > 0 {
            let _ = s
                .inflight_expected_ns
                .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                    Some(v.saturating_sub(charge.expected_ns))
                });
        }
        // The class is read first: a `leave` that clears the slot after this read and before
        // the decrement below takes nothing off the word for this kernel (its swap finds it
        // gone), so this side does.
        let online = s.class.load(Ordering::Acquire) == Class::Online.code();
        let before = s
            .inflight
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |v| {
                Some(v.saturating_sub(1))
            })
            .unwrap_or(0);
        if online && before > 0 && self.device_wait() {
            self.device_online_end(1);
        }
        if before == 1 {
            let since = s.busy_since_ns.load(Ordering::Acquire);
            if since > 0 && now_ns > since {
                s.busy_ns.fetch_add(now_ns - since, Ordering::Relaxed);
                if online {
                    s.busy_hist[crate::latency::bucket_of(now_ns - since)]
                        .fetch_add(1, Ordering::Relaxed);
                }
            }
        }
        if before <= 1 && online {
            let until = charge.gap_after_ns.map_or(0, |g| now_ns.saturating_add(g));
            s.gap_until_ns.store(until, Ordering::Release);
        }
        s.completed.fetch_add(1, Ordering::Relaxed);
        let h = &self.seg().header;
        // Pairs with the fence in `admit`: either the waiter sees this completion, or we
        // see the waiter.
        fence(Ordering::SeqCst);
        if h.waiters.load(Ordering::Relaxed) > 0 {
            self.wake_all();
        }
    }

    /// Whether mmkd asked this slot's process to count its launches without tracking
    /// them to completion ([`Gate::set_untracked`]).
    #[inline]
    pub fn untracked(&self, slot: SlotId) -> bool {
        self.seg().slots[slot.0].untracked.load(Ordering::Relaxed) != 0
    }

    /// Ask process `pid` to count its launches from now on without tracking them to
    /// completion (`on`), or to track them again. Its kernels then no longer show in
    /// flight: only for a process that no policy waits on (where
    /// [`GateConfig::waits_on_online`] is false; an offline process's interposer checks
    /// that at each launch). False when `pid` holds no slot.
    pub fn set_untracked(&self, pid: u32, on: bool) -> bool {
        match self
            .seg()
            .slots
            .iter()
            .find(|s| pid != 0 && s.pid.load(Ordering::Acquire) == pid)
        {
            Some(s) => {
                s.untracked.store(u32::from(on), Ordering::Relaxed);
                true
            }
            None => false,
        }
    }

    /// Count a launch that the gate does not track (passthrough).
    #[inline]
    pub fn count(&self, slot: SlotId) {
        self.seg().slots[slot.0]
            .launches
            .fetch_add(1, Ordering::Relaxed);
    }

    /// What is in flight now, summed over the live slots.
    pub fn in_flight(&self) -> InFlight {
        let mut state = InFlight {
            sm_count: self.seg().header.sm_count.load(Ordering::Relaxed),
            ..InFlight::default()
        };
        for s in &self.seg().slots {
            if s.pid.load(Ordering::Relaxed) == 0 {
                continue;
            }
            let (kernels, sm) = (
                s.inflight.load(Ordering::Acquire),
                s.inflight_sm.load(Ordering::Acquire),
            );
            match Class::from_code(s.class.load(Ordering::Relaxed)) {
                // Saturating, as every sum of what job processes write.
                Some(Class::Online) => {
                    state.online_jobs += 1;
                    state.online_kernels = state.online_kernels.saturating_add(kernels);
                    state.online_sm = state.online_sm.saturating_add(sm);
                    state.online_compute = state
                        .online_compute
                        .saturating_add(s.inflight_compute.load(Ordering::Acquire));
                    state.online_memory = state
                        .online_memory
                        .saturating_add(s.inflight_memory.load(Ordering::Acquire));
                    let until = s.gap_until_ns.load(Ordering::Acquire);
                    if kernels == 0 && until != 0 {
                        state.online_gap_until_ns =
                            Some(state.online_gap_until_ns.map_or(until, |u| u.min(until)));
                    }
                }
                Some(Class::Offline) => {
                    state.offline_kernels = state.offline_kernels.saturating_add(kernels);
                    state.offline_sm = state.offline_sm.saturating_add(sm);
                    state.offline_expected_ns = state
                        .offline_expected_ns
                        .saturating_add(s.inflight_expected_ns.load(Ordering::Acquire));
                }
                None => {}
            }
        }
        if state.online_kernels > 0 {
            state.online_gap_until_ns = None;
        }
        state
    }

    /// Ask `policy` about `launch` until it says go, sleeping on the gate in between, for at
    /// most the gate's hard bound and what is left of the process's hold `budget`. Records
    /// what happened in the slot.
    pub fn admit(
        &self,
        slot: SlotId,
        policy: &mut dyn Policy,
        budget: &mut HoldBudget,
        launch: &Launch,
    ) -> WaitOutcome {
        let h = &self.seg().header;
        // Whatever the header says, no launch is held past the ceiling.
        let max_hold =
            Duration::from_nanos(h.max_hold_ns.load(Ordering::Relaxed)).min(MAX_HOLD_CEILING);
        // What this process may still be held in `Hold` decisions; a wait at the depth cap
        // (`Queued`, for offline work already in flight) is bounded by the hard bound alone.
        let pct = h.hold_budget_pct.load(Ordering::Relaxed);
        let nothing_held = pct == 0;
        let allowed = budget
            .available(pct, monotonic_ns())
            .map_or(max_hold, |left| left.min(max_hold));
        let mut start: Option<Instant> = None;
        // Time spent in `Hold` (not `Queued`) decisions, and when the current one began.
        let mut starving = Duration::ZERO;
        let mut hold_began: Option<Instant> = None;
        let mut last_reap = Instant::now();
        // Whether we count in `waiters`. A launch that goes at once never does; one that is
        // held counts itself and then asks again before it sleeps, so that a completion after
        // that read always bumps the epoch (`end` checks `waiters` after its update; both
        // sides fence) and the futex wait cannot sleep through it.
        let mut registered = false;
        let outcome = loop {
            if registered {
                fence(Ordering::SeqCst);
            }
            let epoch = h.epoch.load(Ordering::Acquire);
            let now = Instant::now();
            if let Some(began) = hold_began.take() {
                starving += now - began;
            }
            let waited = start.map_or(Duration::ZERO, |t| now - t);
            let clock = Clock {
                now_ns: monotonic_ns(),
                waited,
                starving,
            };
            let decision = policy.decide(launch, &self.in_flight(), clock);
            let (recheck, starves) = match decision {
                Decision::Launch | Decision::LaunchStarved => {
                    break WaitOutcome {
                        waited,
                        forced: decision == Decision::LaunchStarved,
                    };
                }
                Decision::Hold { recheck } => (recheck, true),
                Decision::Queued { recheck } => (recheck, false),
            };
            if starves && nothing_held {
                // A budget of 0 % holds nothing: the launch goes as if the policy had let
                // it, and is neither held nor forced.
                break WaitOutcome {
                    waited,
                    forced: false,
                };
            }
            if waited >= max_hold || (starves && starving >= allowed) {
                break WaitOutcome {
                    waited,
                    forced: true,
                };
            }
            start.get_or_insert(now);
            if !registered {
                h.waiters.fetch_add(1, Ordering::SeqCst);
                registered = true;
                continue;
            }
            if starves {
                hold_began = Some(now);
            }
            let left = if starves {
                allowed.saturating_sub(starving)
            } else {
                max_hold
            };
            let sleep = recheck
                .min(left)
                .min(max_hold - waited)
                .min(LIVENESS_CHECK)
                .max(Duration::from_micros(1));
            let woken = futex_wait(&h.epoch, epoch, sleep);
            if !woken && last_reap.elapsed() >= LIVENESS_CHECK {
                // Nothing completed for a while: make sure no dead process is what we are
                // waiting for.
                self.reap_dead();
                last_reap = Instant::now();
            }
        };
        if registered {
            h.waiters.fetch_sub(1, Ordering::AcqRel);
        }
        // `starving` took in every hold at the top of the loop's last turn.
        budget.spend(starving);
        if !outcome.waited.is_zero() || outcome.forced {
            let s = &self.seg().slots[slot.0];
            let ns = nanos(outcome.waited);
            s.held.fetch_add(1, Ordering::Relaxed);
            s.held_ns.fetch_add(ns, Ordering::Relaxed);
            s.max_held_ns.fetch_max(ns, Ordering::Relaxed);
            if outcome.forced {
                s.forced.fetch_add(1, Ordering::Relaxed);
            }
        }
        outcome
    }

    pub(super) fn wake_all(&self) {
        let epoch = &self.seg().header.epoch;
        epoch.fetch_add(1, Ordering::AcqRel);
        futex_wake_all(epoch);
    }

    /// Every taken slot, for status and tests.
    pub fn slots(&self) -> Vec<SlotStats> {
        self.seg().slot_stats()
    }

    /// The slots whose process still runs. A dead process's slot stays until a launch or a
    /// join in the gate reaps it; this only reads.
    pub fn live_slots(&self) -> Vec<SlotStats> {
        live(self.slots())
    }

    /// One slot's counters; `None` when the slot is free.
    pub fn slot(&self, slot: SlotId) -> Option<SlotStats> {
        stats_of(&self.seg().slots[slot.0])
    }
}
