use super::*;
use crate::policy::{Launch, Mmk};
use std::sync::Arc;
use std::time::Instant;

fn gate(dir: &tempfile::TempDir, policy: PolicyKind) -> Gate {
    let mut config = GateConfig::new(132, policy);
    config.max_hold = MAX_HOLD_CEILING;
    Gate::create(&dir.path().join("g0.gate"), &config).unwrap()
}

/// An `mmk` gate with the device wait on.
fn device_gate(dir: &tempfile::TempDir) -> Gate {
    let g = gate(dir, PolicyKind::Mmk);
    g.configure(&GateConfig {
        device_wait: true,
        ..g.config()
    });
    g
}

fn offline(sm: u32) -> Launch {
    Launch {
        class: Class::Offline,
        sm_demand: sm,
        mps_fraction: 1.0,
        expect: Default::default(),
    }
}

fn sm(sm: u32) -> Charge {
    Charge {
        sm,
        ..Charge::default()
    }
}

#[test]
fn a_job_process_sees_what_mmkd_configured() {
    let dir = tempfile::tempdir().unwrap();
    let created = gate(&dir, PolicyKind::Mmk);
    let opened = Gate::open(created.path()).unwrap();
    assert_eq!(opened.config().sm_count, 132);
    assert_eq!(opened.config().policy, PolicyKind::Mmk);
    assert_eq!(opened.config().offline_depth, 0);
    assert_eq!(opened.gemm_slice_mflop(), 0);
    created.configure(&GateConfig {
        offline_depth: 8,
        base: Duration::from_micros(1500),
        gemm_slice_mflop: 8000,
        ..GateConfig::new(66, PolicyKind::Passthrough)
    });
    assert_eq!(opened.config().sm_count, 66, "the mapping is shared");
    assert_eq!(opened.gemm_slice_mflop(), 8000);
    assert_eq!(opened.config().gemm_slice_mflop, 8000);
    assert_eq!(opened.config().policy, PolicyKind::Passthrough);
    assert_eq!(opened.config().policy_params().offline_depth, 8);
    assert_eq!(opened.config().base, Duration::from_micros(1500));
}

#[test]
fn mmkd_asks_one_process_to_stop_tracking_until_it_joins_again() {
    let dir = tempfile::tempdir().unwrap();
    let created = gate(&dir, PolicyKind::Mmk);
    let opened = Gate::open(created.path()).unwrap();
    let on = opened.join(41, Class::Online, 1.0).unwrap();
    let off = opened.join(42, Class::Offline, 1.0).unwrap();
    assert!(!opened.untracked(on));
    assert!(created.set_untracked(41, true), "pid 41 holds a slot");
    assert!(!created.set_untracked(43, true), "pid 43 holds none");
    assert!(!created.set_untracked(0, true), "a free slot is nobody's");
    assert!(opened.untracked(on) && !opened.untracked(off));
    let flags: Vec<(u32, bool)> = created
        .slots()
        .iter()
        .map(|s| (s.pid, s.untracked))
        .collect();
    assert_eq!(flags, [(41, true), (42, false)]);
    // A process that joins again starts tracked; mmkd may ask again.
    let again = opened.join(41, Class::Online, 1.0).unwrap();
    assert_eq!(again, on);
    assert!(!opened.untracked(on));
    assert!(created.set_untracked(41, true) && opened.untracked(on));
    assert!(created.set_untracked(41, false) && !opened.untracked(on));
}

#[test]
fn online_work_in_flight_is_summed_per_class() {
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Mmk);
    let on = g.join(1, Class::Online, 1.0).unwrap();
    let off = g.join(std::process::id(), Class::Offline, 0.5).unwrap();
    g.begin(on, &sm(40));
    g.begin(on, &sm(20));
    g.begin(off, &sm(100));
    let state = g.in_flight();
    assert_eq!((state.online_kernels, state.online_sm), (2, 60));
    assert_eq!((state.offline_kernels, state.offline_sm), (1, 100));
    g.end(on, &sm(40), monotonic_ns());
    g.end(on, &sm(20), monotonic_ns());
    g.end(on, &sm(20), monotonic_ns());
    let state = g.in_flight();
    assert_eq!(
        (state.online_kernels, state.online_sm),
        (0, 0),
        "never below zero"
    );
}

#[test]
fn profiles_in_flight_and_the_online_gap_are_published() {
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Fikit);
    let on = g.join(1, Class::Online, 1.0).unwrap();
    let off = g.join(std::process::id(), Class::Offline, 0.5).unwrap();
    let conv = Charge {
        sm: 100,
        ask: 150,
        expected_ns: 80_000,
        intensity: Intensity::Compute,
        gap_after_ns: Some(300_000),
    };
    let norm = Charge {
        intensity: Intensity::Memory,
        gap_after_ns: None,
        ..conv
    };
    g.begin(on, &conv);
    g.begin(off, &norm);
    g.begin(off, &norm);
    let state = g.in_flight();
    assert_eq!(
        (state.online_jobs, state.online_compute, state.online_memory),
        (1, 1, 0)
    );
    assert_eq!(state.offline_expected_ns, 160_000);
    assert_eq!(state.online_gap_until_ns, None, "online is busy");
    let offline = g.slot(off).expect("the offline slot");
    assert_eq!(
        (offline.inflight_sm, offline.inflight_ask),
        (200, 300),
        "what the kernels fill and what they ask for"
    );
    g.end(off, &norm, 5);
    assert_eq!(g.in_flight().offline_expected_ns, 80_000);
    assert_eq!(g.slot(off).expect("slot").inflight_ask, 150);
    assert_eq!(g.slot(off).expect("slot").busy_ns, 0, "still busy");
    g.end(on, &conv, 1_000_000);
    let state = g.in_flight();
    assert_eq!(state.online_compute, 0);
    assert_eq!(
        state.online_gap_until_ns,
        Some(1_300_000),
        "the last online kernel completed at 1 ms and expects a 300 us gap"
    );
    g.begin(on, &norm);
    g.end(on, &norm, 2_000_000);
    assert_eq!(
        g.in_flight().online_gap_until_ns,
        None,
        "no prediction after it"
    );
}

#[test]
fn an_offline_launch_waits_for_online_work_then_goes() {
    let dir = tempfile::tempdir().unwrap();
    let g = Arc::new(gate(&dir, PolicyKind::Mmk));
    let me = std::process::id();
    let on = g.join(me, Class::Online, 1.0).unwrap();
    g.begin(on, &sm(132));
    // A second "process" of the same test: its own mapping, its own slot.
    let other = Gate::open(g.path()).unwrap();
    let off = other.join(1, Class::Offline, 1.0).unwrap();
    // pid 1 is alive (init), so the slot is not reaped while it waits.
    let waiter = std::thread::spawn(move || {
        let mut policy = Mmk {
            base: Duration::from_secs(10),
            offline_depth: 0,
            offline_paused: false,
        };
        let outcome = other.admit(off, &mut policy, &mut HoldBudget::new(), &offline(100));
        (outcome, other.slot(off).unwrap())
    });
    // The waiter is held until the online kernel completes.
    while g.seg().header.waiters.load(Ordering::Acquire) == 0 {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(20));
    g.end(on, &sm(132), monotonic_ns());
    let (outcome, stats) = waiter.join().unwrap();
    assert!(!outcome.forced);
    assert!(outcome.waited >= Duration::from_millis(20), "{outcome:?}");
    assert_eq!(stats.held, 1);
    assert_eq!(stats.forced, 0);
}

#[test]
fn the_anti_starvation_bound_lets_a_held_launch_go() {
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Mmk);
    let on = g.join(std::process::id(), Class::Online, 1.0).unwrap();
    let off = g.join(1, Class::Offline, 0.5).unwrap();
    g.begin(on, &sm(132));
    let mut policy = Mmk {
        base: Duration::from_millis(5),
        offline_depth: 0,
        offline_paused: false,
    };
    let half = Launch {
        mps_fraction: 0.5,
        ..offline(132)
    };
    let outcome = g.admit(off, &mut policy, &mut HoldBudget::new(), &half);
    assert!(outcome.forced);
    assert!(
        outcome.waited >= Duration::from_millis(10),
        "Thres = 5 ms / 0.5"
    );
    // Forced by the bound, not by the gate's hard limit (which forces a launch only once
    // it has waited that long), however late a loaded machine woke it.
    assert!(outcome.waited < g.config().max_hold, "{outcome:?}");
    assert_eq!(g.slot(off).unwrap().forced, 1);
}

#[test]
fn a_spent_hold_budget_lets_offline_launches_go() {
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Mmk);
    let on = g.join(std::process::id(), Class::Online, 1.0).unwrap();
    let off = g.join(1, Class::Offline, 1.0).unwrap();
    // Online work that never completes: without a budget, each launch would wait out
    // the anti-starvation bound of 20 ms.
    g.begin(on, &sm(132));
    let mut policy = Mmk {
        base: Duration::from_millis(20),
        offline_depth: 0,
        offline_paused: false,
    };
    let mut budget = HoldBudget::new();
    let t0 = Instant::now();
    let mut held = Duration::ZERO;
    for _ in 0..10 {
        let outcome = g.admit(off, &mut policy, &mut budget, &offline(132));
        assert!(outcome.forced, "{outcome:?}");
        held += outcome.waited;
    }
    let wall = t0.elapsed();
    // The full bucket (50 ms) plus 10 % of the time since: two holds of 20 ms, then
    // one of about 15 ms, then launches that go at once. A loaded machine wakes a sleeper
    // late, and the hold that empties the bucket keeps what it overran (each launch
    // after it may be held for a wakeup of its own too): the launches held past the
    // budget are bounded by count, 10 wakeups of up to 10 ms, not by how late each woke.
    let late = Duration::from_millis(100);
    assert!(
        held >= Duration::from_millis(50) && held <= Duration::from_millis(50) + wall / 10 + late,
        "held {held:?} in {wall:?}"
    );
    assert_eq!(g.slot(off).unwrap().forced, 10);
    // Time refills it at 10 %: after a pause of P, P / 10 may be held again (the
    // policy's bound, 20 ms, is longer than that unless the pause ran long). P is
    // measured up to the launch, so the bucket has at least P / 10.
    let paused = Instant::now();
    std::thread::sleep(Duration::from_millis(100));
    let refill = paused.elapsed() / 10;
    let outcome = g.admit(off, &mut policy, &mut budget, &offline(132));
    assert!(outcome.forced, "{outcome:?}");
    // At least the refill (or the bound); at most the policy's bound and one late
    // wakeup: never the gate's hard limit.
    assert!(
        outcome.waited + Duration::from_millis(1) >= refill.min(Duration::from_millis(20))
            && outcome.waited <= Duration::from_millis(20) + late,
        "{outcome:?} after a refill of {refill:?}"
    );
    // 100 %: no budget, the policy's bound alone.
    g.configure(&GateConfig {
        hold_budget_pct: 100,
        ..g.config()
    });
    let outcome = g.admit(off, &mut policy, &mut budget, &offline(132));
    assert!(outcome.waited >= Duration::from_millis(20), "{outcome:?}");
    // 0 %: nothing is held, from the first launch on, and nothing counted as held.
    g.configure(&GateConfig {
        hold_budget_pct: 0,
        ..g.config()
    });
    let before = g.totals();
    let outcome = g.admit(off, &mut policy, &mut HoldBudget::new(), &offline(132));
    assert!(!outcome.forced && outcome.waited.is_zero(), "{outcome:?}");
    let after = g.totals();
    assert_eq!(
        (after.held, after.forced),
        (before.held, before.forced),
        "a launch that went at once was not held"
    );
}

#[test]
fn a_wait_at_the_depth_cap_spends_no_budget() {
    let dir = tempfile::tempdir().unwrap();
    let g = Arc::new(gate(&dir, PolicyKind::Mmk));
    // A hard bound far beyond the wait, however late this thread wakes.
    g.configure(&GateConfig {
        max_hold: MAX_HOLD_CEILING,
        ..g.config()
    });
    let me = std::process::id();
    let on = g.join(me, Class::Online, 1.0).unwrap();
    let off = g.join(1, Class::Offline, 1.0).unwrap();
    // An online job is present, idle; one offline kernel in flight is the cap.
    let _ = on;
    g.begin(off, &sm(10));
    let waiter = {
        let other = Gate::open(g.path()).unwrap();
        std::thread::spawn(move || {
            let mut policy = Mmk {
                base: Duration::from_millis(1),
                offline_depth: 1,
                offline_paused: false,
            };
            let mut budget = HoldBudget::new();
            let outcome = other.admit(off, &mut policy, &mut budget, &offline(10));
            (outcome, budget.available(10, monotonic_ns()))
        })
    };
    // Once the launch is held (its wait began before it registered as a waiter), 80 ms
    // at the cap: more than the whole bucket (50 ms), yet not forced by it.
    while g.seg().header.waiters.load(Ordering::SeqCst) == 0 {
        std::thread::yield_now();
    }
    std::thread::sleep(Duration::from_millis(80));
    g.end(off, &sm(10), monotonic_ns());
    let (outcome, left) = waiter.join().unwrap();
    assert!(!outcome.forced, "{outcome:?}");
    assert!(outcome.waited >= Duration::from_millis(80), "{outcome:?}");
    assert_eq!(left, Some(HoldBudget::BURST), "the bucket is still full");
}

#[test]
fn the_device_word_is_closed_while_online_work_is_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let g = device_gate(&dir);
    assert!(g.device_word().passes(), "a new gate is open");
    let on = g.join(1, Class::Online, 1.0).unwrap();
    let on2 = g.join(2, Class::Online, 1.0).unwrap();
    let off = g.join(std::process::id(), Class::Offline, 1.0).unwrap();
    g.begin(off, &sm(132));
    assert!(g.device_word().passes(), "offline work does not close it");
    g.begin(on, &sm(10));
    g.begin(on2, &sm(10));
    assert_eq!(g.device_word().online(), 2);
    assert!(!g.device_word().passes());
    g.end(on, &sm(10), monotonic_ns());
    assert!(
        !g.device_word().passes(),
        "one online launch is still in flight"
    );
    g.end(on2, &sm(10), monotonic_ns());
    assert!(g.device_word().passes());
    // A completion seen twice (the slot was cleared meanwhile) does not wrap the count.
    g.end(on2, &sm(10), monotonic_ns());
    assert_eq!(g.device_word(), DeviceWord(DeviceWord::OPEN));
    // An online process that leaves with work in flight opens it.
    g.begin(on, &sm(10));
    g.begin(on, &sm(10));
    assert!(!g.device_word().passes());
    g.leave(on);
    assert_eq!(g.device_word(), DeviceWord(DeviceWord::OPEN));
}

#[test]
fn without_the_device_wait_online_launches_leave_the_word_open() {
    let dir = tempfile::tempdir().unwrap();
    let g = device_gate(&dir);
    let on = g.join(1, Class::Online, 1.0).unwrap();
    g.begin(on, &sm(10));
    assert!(!g.device_word().passes());
    // Turned off with a launch in flight: open at once, and later launches do not close it.
    g.configure(&GateConfig {
        device_wait: false,
        ..g.config()
    });
    assert_eq!(g.device_word(), DeviceWord(DeviceWord::OPEN));
    g.begin(on, &sm(10));
    assert_eq!(g.device_word(), DeviceWord(DeviceWord::OPEN));
    g.end(on, &sm(10), monotonic_ns());
    g.end(on, &sm(10), monotonic_ns());
    assert_eq!(g.device_word(), DeviceWord(DeviceWord::OPEN));
}

#[test]
fn a_starved_offline_process_forces_the_device_word_open_until_progress() {
    let dir = tempfile::tempdir().unwrap();
    let g = device_gate(&dir);
    // A live pid for the online slot (a recount must not drop it).
    let on = g.join(std::process::id(), Class::Online, 1.0).unwrap();
    g.begin(on, &sm(132));
    let bound = 10_000_000_000; // 10 s: synthetic times, no sleeping
    let closed = monotonic_ns();
    assert!(
        !g.device_force_if_starved(closed, bound),
        "not past the bound yet"
    );
    assert!(!g.device_word().passes());
    let later = closed + 2 * bound;
    assert!(g.device_force_if_starved(later, bound));
    assert!(g.device_word().passes(), "forced open");
    assert_eq!(g.device_word().online(), 1, "the online count is kept");
    assert!(!g.device_force_if_starved(later, bound), "already open");
    g.device_unforce();
    assert!(!g.device_word().passes(), "closed again after progress");
    assert!(
        !g.device_force_if_starved(monotonic_ns(), bound),
        "the bound starts over"
    );
    assert!(g.device_force_if_starved(monotonic_ns() + 2 * bound, bound));
    g.end(on, &sm(132), monotonic_ns());
    assert_eq!(
        g.device_word(),
        DeviceWord(DeviceWord::OPEN),
        "the last online completion opens it and drops the force"
    );
    assert!(
        !g.device_force_if_starved(monotonic_ns() + 2 * bound, bound),
        "an open word is never marked forced"
    );
    assert_eq!(g.device_word(), DeviceWord(DeviceWord::OPEN));
}

#[test]
fn a_count_no_live_online_slot_accounts_for_is_set_right_before_forcing() {
    let dir = tempfile::tempdir().unwrap();
    let g = device_gate(&dir);
    let on = g.join(std::process::id(), Class::Online, 1.0).unwrap();
    g.begin(on, &sm(10));
    // A completion neither `end` nor `clear_in_flight` took off the word (the race with
    // a leaving process): the slot has nothing in flight, the word still counts one.
    g.seg().slots[on.0].inflight.store(0, Ordering::Release);
    assert_eq!(g.device_word().online(), 1);
    let bound = 10_000_000_000;
    assert!(
        !g.device_force_if_starved(monotonic_ns() + 2 * bound, bound),
        "set right, not forced"
    );
    assert_eq!(g.device_word(), DeviceWord(DeviceWord::OPEN));
}

#[test]
fn the_device_word_lies_inside_the_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let g = device_gate(&dir);
    let at = g.device_word_location();
    assert_eq!(at.len, SEGMENT_BYTES);
    assert!(at.offset + 4 <= at.len && at.offset.is_multiple_of(4));
    // SAFETY: inside the mapping, aligned, an AtomicU32 of the header.
    let word = unsafe { &*at.base.cast::<u8>().add(at.offset).cast::<AtomicU32>() };
    assert_eq!(word.load(Ordering::Acquire), g.device_word().0);
    let on = g.join(1, Class::Online, 1.0).unwrap();
    g.begin(on, &sm(1));
    assert_eq!(word.load(Ordering::Acquire), g.device_word().0);
    assert!(!DeviceWord(word.load(Ordering::Acquire)).passes());
}

#[test]
fn a_dead_process_in_flight_does_not_hold_others() {
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Mmk);
    // A child that exits at once and is not reaped yet: a zombie holds nothing.
    let mut child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    while std::fs::read_to_string(format!("/proc/{dead}/stat")).is_ok_and(|s| !s.contains(") Z")) {
        std::thread::yield_now();
    }
    let on = g.join(dead, Class::Online, 1.0).unwrap();
    g.begin(on, &sm(132));
    let off = g.join(std::process::id(), Class::Offline, 1.0).unwrap();
    // A bound (and the gate's hard limit) far beyond the liveness check (20 ms), however
    // late a loaded machine runs it: a launch not forced went because the slot was dropped.
    let mut policy = Mmk {
        base: MAX_HOLD_CEILING,
        offline_depth: 0,
        offline_paused: false,
    };
    let outcome = g.admit(off, &mut policy, &mut HoldBudget::new(), &offline(132));
    assert!(
        !outcome.forced,
        "the dead slot is dropped, then the launch fits: {outcome:?}"
    );
    assert!(g.slots().iter().all(|s| s.pid != dead));
    child.wait().unwrap();
}

#[test]
fn a_full_gate_refuses_a_new_process_and_leave_frees_a_slot() {
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Passthrough);
    let me = std::process::id();
    let first = g.join(me, Class::Online, 1.0).unwrap();
    assert_eq!(
        g.join(me, Class::Offline, 1.0),
        Some(first),
        "same pid, same slot"
    );
    // Fill the other slots with init (pid 1), which is alive, so nothing can be reaped.
    for _ in 1..SLOTS {
        assert!(g.claim_free(1).is_some());
    }
    assert_eq!(g.join(2_000_000_000, Class::Offline, 1.0), None);
    g.count(first);
    g.count(first);
    g.leave(first);
    assert_eq!(g.totals().launches, 2, "counters outlive the slot");
    assert!(g.join(2_000_000_000, Class::Offline, 1.0).is_some());
}

#[test]
fn bad_files_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.gate");
    let err = Gate::open(&missing).unwrap_err();
    assert!(err.to_string().contains("none.gate: open"), "{err}");
    let junk = dir.path().join("junk.gate");
    std::fs::write(&junk, vec![7u8; SEGMENT_BYTES]).unwrap();
    let err = Gate::open(&junk).unwrap_err();
    assert!(err.to_string().contains("not an mmk gate"), "{err}");
    // mmkd replaces a file that is not a gate.
    let g = Gate::create(&junk, &GateConfig::new(14, PolicyKind::Mmk)).unwrap();
    assert_eq!(g.config().sm_count, 14);
    let err = Gate::create(&junk, &GateConfig::new(0, PolicyKind::Mmk)).unwrap_err();
    assert!(err.to_string().contains("sm_count"), "{err}");
    // A gate of layout version 1 (an older mmk) is refused by jobs and replaced by mmkd.
    drop(g);
    let mut bytes = std::fs::read(&junk).unwrap();
    bytes[8..12].copy_from_slice(&1u32.to_ne_bytes());
    std::fs::write(&junk, bytes).unwrap();
    let err = Gate::open(&junk).unwrap_err();
    assert!(err.to_string().contains("layout version 1"), "{err}");
    let g = Gate::create(&junk, &GateConfig::new(14, PolicyKind::Orion)).unwrap();
    assert_eq!(g.config().policy, PolicyKind::Orion);
}

#[test]
fn a_process_is_charged_the_time_it_has_kernels_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let g = Gate::create(
        &dir.path().join("busy.gate"),
        &GateConfig::new(132, PolicyKind::Mmk),
    )
    .unwrap();
    let slot = g.join(std::process::id(), Class::Offline, 1.0).unwrap();
    // The gate takes the start of a busy period at the first `begin`, between `before`
    // and `t0` (further apart where a loaded machine ran something else in between).
    let before = monotonic_ns();
    // Two kernels overlap: one busy period, from the first launch to the last end.
    g.begin(slot, &sm(10));
    g.begin(slot, &sm(10));
    let t0 = monotonic_ns();
    g.end(slot, &sm(10), t0 + 2_000_000);
    assert_eq!(
        g.slot(slot).unwrap().busy_ns,
        0,
        "a kernel is still in flight"
    );
    g.end(slot, &sm(10), t0 + 3_000_000);
    let busy = g.slot(slot).unwrap().busy_ns;
    assert!(
        (3_000_000..=3_000_000 + (t0 - before)).contains(&busy),
        "{busy} ns, begun {} ns before t0",
        t0 - before
    );
    // Idle time between periods is not charged.
    let before = monotonic_ns();
    g.begin(slot, &sm(10));
    let t1 = monotonic_ns();
    g.end(slot, &sm(10), t1 + 1_000_000);
    let busy2 = g.slot(slot).unwrap().busy_ns - busy;
    assert!(
        (1_000_000..=1_000_000 + (t1 - before)).contains(&busy2),
        "{busy2} ns, begun {} ns before t1",
        t1 - before
    );
}

#[test]
fn the_layout_is_what_the_docs_say() {
    assert_eq!(std::mem::size_of::<Header>(), 128);
    assert_eq!(std::mem::size_of::<Slot>(), 512);
    assert_eq!(SEGMENT_BYTES, 128 + SLOTS * 512);
}

#[test]
fn an_online_processs_busy_periods_are_counted_by_length_and_an_offline_ones_are_not() {
    use crate::latency::{bucket_of, quantile};
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Mmk);
    let online = g.join(std::process::id(), Class::Online, 1.0).unwrap();
    let offline = g.join(1, Class::Offline, 1.0).unwrap();
    // Periods of 2 ms (99 of them) and one of 40 ms, as a service's requests would be.
    for length in std::iter::repeat_n(2_000_000, 99).chain([40_000_000]) {
        g.begin(online, &sm(132));
        let t = monotonic_ns();
        g.end(online, &sm(132), t + length);
        g.begin(offline, &sm(132));
        g.end(offline, &sm(132), monotonic_ns() + length);
    }
    let counts = |slot| -> Vec<u64> {
        g.slot(slot)
            .unwrap()
            .busy_hist
            .iter()
            .map(|&n| u64::from(n))
            .collect()
    };
    let hist = counts(online);
    assert_eq!(hist.iter().sum::<u64>(), 100);
    // Each period is from its begin (a little before `t`) to its end: at least its length.
    assert!(hist[..bucket_of(2_000_000)].iter().all(|&n| n == 0));
    let p99 = quantile(&hist, 0.99).unwrap();
    assert!((2_000_000..2_500_000).contains(&p99), "p99 {p99} ns");
    assert!(quantile(&hist, 1.0).unwrap() >= 40_000_000);
    assert_eq!(counts(offline).iter().sum::<u64>(), 0);
    // A process that joins the slot anew starts from nothing.
    let again = g.join(std::process::id(), Class::Online, 1.0).unwrap();
    assert_eq!(counts(again).iter().sum::<u64>(), 0);
}

#[test]
fn every_change_of_the_settings_is_a_new_generation_whoever_writes_it() {
    let dir = tempfile::tempdir().unwrap();
    let g = gate(&dir, PolicyKind::Mmk);
    let first = g.generation();
    g.configure(&GateConfig {
        offline_paused: true,
        ..g.config()
    });
    assert_ne!(g.generation(), first);
    assert!(g.config().offline_paused);
    assert!(g.config().policy_params().offline_paused);
    assert!(
        g.waits_on_online(),
        "paused offline work waits on online work, whatever the budget"
    );
    // mmkd's way: a write through the file, which job processes see in their mapping.
    let second = g.generation();
    let file = GateFile::open(g.path()).unwrap();
    file.configure(&GateConfig {
        offline_paused: false,
        ..g.config()
    })
    .unwrap();
    assert_ne!(g.generation(), second);
    assert!(!g.config().offline_paused);
}

/// Names, in the child process of `a_full_file_system_is_an_error_not_a_signal`, the
/// directory where a full tmpfs is mounted.
const FULL_DIR: &str = "MMK_TEST_FULL_GATE_DIR";

/// A gate made on a full file system (a full `/dev/shm` or data dir): an error that
/// names the gate, never a SIGBUS that kills mmkd. The child process that makes it
/// mounts a small tmpfs over a temporary directory in a mount namespace of its own
/// (as root, or in a user namespace of its own otherwise), so the tmpfs is gone with it.
#[test]
fn a_full_file_system_is_an_error_not_a_signal() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;

    if let Some(dir) = std::env::var_os(FULL_DIR) {
        return make_a_gate_on_a_full_file_system(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let target = std::ffi::CString::new(dir.path().as_os_str().as_bytes()).unwrap();
    // SAFETY: geteuid and getegid cannot fail.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let maps = (format!("{uid} {uid} 1"), format!("{gid} {gid} 1"));
    let name = format!(
        "{}::a_full_file_system_is_an_error_not_a_signal",
        module_path!().split_once("::").unwrap().1
    );
    let mut child = std::process::Command::new(std::env::current_exe().unwrap());
    child
        .args([name.as_str(), "--exact", "--test-threads=1"])
        .env(FULL_DIR, dir.path());
    // SAFETY: the closure makes only system calls (no allocation, no locks) in the
    // single-threaded child between fork and exec.
    unsafe {
        child.pre_exec(move || mount_private_tmpfs(&target, uid, &maps.0, &maps.1));
    }
    let out = match child.output() {
        Err(e)
            if matches!(
                e.raw_os_error(),
                Some(libc::EPERM | libc::EACCES | libc::ENOSYS | libc::EINVAL | libc::ENOSPC)
            ) =>
        {
            eprintln!("skipped: no private mount namespace with a tmpfs in this container ({e})");
            return;
        }
        out => out.unwrap(),
    };
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the child making a gate on a full tmpfs ended with {}:\n{stdout}{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("1 passed"),
        "the child ran no test:\n{stdout}"
    );
}

/// In the forked child: a mount namespace of its own (inside a user namespace of its
/// own when not root) with a 64 KiB tmpfs over `target` (room for one gate).
fn mount_private_tmpfs(
    target: &std::ffi::CStr,
    uid: libc::uid_t,
    uid_map: &str,
    gid_map: &str,
) -> io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    };
    // SAFETY: system calls with valid NUL-terminated strings and buffers.
    unsafe {
        if uid == 0 {
            check(libc::unshare(libc::CLONE_NEWNS))?;
        } else {
            check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS))?;
            for (file, line) in [
                (c"/proc/self/setgroups", "deny"),
                (c"/proc/self/gid_map", gid_map),
                (c"/proc/self/uid_map", uid_map),
            ] {
                let fd = libc::open(file.as_ptr(), libc::O_WRONLY);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let wrote = libc::write(fd, line.as_ptr().cast(), line.len());
                libc::close(fd);
                if wrote != line.len() as isize {
                    return Err(io::Error::last_os_error());
                }
            }
        }
        // Nothing mounted here reaches the parent's namespace.
        check(libc::mount(
            c"none".as_ptr(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
        check(libc::mount(
            c"tmpfs".as_ptr(),
            target.as_ptr(),
            c"tmpfs".as_ptr(),
            0,
            c"size=64k".as_ptr().cast(),
        ))
    }
}

/// The child's part: fill the tmpfs, fail to make a gate, free the space, make it.
fn make_a_gate_on_a_full_file_system(dir: &Path) {
    use std::io::Write;
    let filler = dir.join("filler");
    let mut file = File::create(&filler).unwrap();
    let full = (0..1024)
        .map(|_| file.write_all(&[0u8; 4096]))
        .find_map(io::Result::err)
        .expect("the tmpfs fills up");
    assert_eq!(full.kind(), io::ErrorKind::StorageFull, "{full}");
    drop(file);
    let path = dir.join("g0.gate");
    let config = GateConfig::new(14, PolicyKind::Mmk);
    let err = Gate::create(&path, &config).unwrap_err();
    let GateError::Io { source, .. } = &err else {
        panic!("not an io error: {err}");
    };
    assert_eq!(source.kind(), io::ErrorKind::StorageFull, "{source}");
    assert!(err.to_string().contains("g0.gate: reserve space"), "{err}");
    assert!(source.to_string().contains("No space left"), "{source}");
    let left: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["filler"], "the half-made gate is removed");
    std::fs::remove_file(&filler).unwrap();
    let g = Gate::create(&path, &config).unwrap();
    assert_eq!(g.config().sm_count, 14);
}
