//! Fuzzing the kernel scheduler's files: a gate file of any bytes (every job process of a
//! partition maps its gate read-write, so mmkd and the other jobs must survive whatever is
//! in it), a kernel profile (a job's `kernel_profile`) and a kernel trace (`mmkctl
//! profile`). Any bytes give a value or an error, never a panic or a hang
//! (core/tests/support/fuzz.rs says how inputs are made; `MMK_FUZZ_CASES` sets how many).

#[path = "../../core/tests/support/fuzz.rs"]
mod support;

use std::path::Path;
use std::time::Duration;

use mmk_kernel_sched::gate::{GateDir, GateFile, GateOwner};
use mmk_kernel_sched::profile::KernelStats;
use mmk_kernel_sched::trace::{self, TraceRecord};
use mmk_kernel_sched::{
    Charge, Class, Clock, Expect, Gate, GateConfig, InFlight, Intensity, KernelKey, Launch,
    PolicyKind, Profile,
};

/// Tokens for overwriting a gate's fields: counters at their limits, slot classes, pids.
const GATE_DICT: &[&[u8]] = &[
    &[0xff; 4],
    &[0xff; 8],
    &[0xff, 0xff, 0xff, 0x7f],
    &[0, 0, 0, 0x80, 0, 0, 0, 0],
    &[0; 8],
    &[1, 0, 0, 0],
    &[2, 0, 0, 0],
    &[3, 0, 0, 0],
    &[4, 0, 0, 0],
    &[1, 0, 0, 0, 0, 0, 0, 0],
    b"MMKGATE1",
];

/// A fresh gate, and one with processes in it and work in flight.
fn gate_seeds(dir: &Path) -> Vec<Vec<u8>> {
    let mut config = GateConfig::new(98, PolicyKind::Mmk);
    let fresh = dir.join("fresh.gate");
    drop(Gate::create(&fresh, &config).expect("gate"));
    config.device_wait = true;
    config.offline_depth = 4;
    let busy = dir.join("busy.gate");
    let gate = Gate::create(&busy, &config).expect("gate");
    let me = std::process::id();
    let online = gate.join(me, Class::Online, 0.6).expect("slot");
    let offline = gate.join(1, Class::Offline, 0.4).expect("slot");
    let charge = Charge {
        sm: 40,
        ask: 80,
        expected_ns: 50_000,
        intensity: Intensity::Compute,
        gap_after_ns: Some(10_000),
    };
    gate.begin(online, &charge);
    gate.begin(offline, &charge);
    gate.begin(offline, &charge);
    gate.end(offline, &charge, 1);
    drop(gate);
    [fresh, busy]
        .iter()
        .map(|p| std::fs::read(p).expect("read gate"))
        .collect()
}

/// What mmkd and the interposer do with a gate they opened, except a wait (its bound is the
/// file's to say).
fn use_gate(gate: &Gate) {
    let config = gate.config();
    let _ = gate.totals();
    let _ = gate.slots();
    let _ = gate.live_slots();
    let _ = (
        gate.device_word(),
        gate.device_wait(),
        gate.device_wait_grain_ns(),
    );
    let _ = gate.gemm_slice_mflop();
    let state = gate.in_flight();
    for kind in PolicyKind::ALL {
        let mut policy = kind.build(&config.policy_params());
        for class in [Class::Online, Class::Offline] {
            let launch = Launch {
                class,
                sm_demand: 40,
                mps_fraction: 0.5,
                expect: Expect {
                    duration_ns: Some(20_000),
                    gap_after_ns: Some(5_000),
                    intensity: Intensity::Memory,
                },
            };
            let clock = Clock {
                now_ns: mmk_kernel_sched::monotonic_ns(),
                waited: Duration::from_micros(300),
                starving: Duration::from_micros(100),
            };
            let _ = policy.decide(&launch, &state, clock);
            let _ = policy.decide(&launch, &InFlight::default(), clock);
        }
    }
    let _ = gate.device_force_if_starved(mmk_kernel_sched::monotonic_ns(), 1);
    gate.device_unforce();
    if let Some(slot) = gate.join(std::process::id(), Class::Online, 0.5) {
        let charge = Charge {
            sm: 10,
            ask: 10,
            expected_ns: 1_000,
            intensity: Intensity::Memory,
            gap_after_ns: None,
        };
        gate.begin(slot, &charge);
        gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
        gate.count(slot);
        let _ = gate.slot(slot);
        gate.leave(slot);
    }
    let _ = gate.reap_dead();
}

#[test]
fn gate_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let seeds = gate_seeds(dir.path());
    let path = dir.path().join("fuzz.gate");
    let gates = GateDir::open(&dir.path().join("gates")).expect("gate folder");
    let me = GateOwner::current();
    support::fuzz("gate_file", seeds, GATE_DICT, |bytes| {
        std::fs::write(&path, bytes).expect("write gate");
        let opened = Gate::open(&path);
        let accepted = opened.is_ok();
        if let Ok(gate) = &opened {
            use_gate(gate);
        }
        drop(opened);
        // mmkd reads a copy of whatever a job wrote, through its file (never a mapping),
        // and takes over its user's gate in the gate folder or makes it anew.
        if let Ok(file) = GateFile::open(&path)
            && let Ok(snap) = file.snapshot()
        {
            let _ = (snap.config(), snap.totals(), snap.live_slots());
            let _ = file.set_untracked(std::process::id(), true);
        }
        std::fs::write(gates.gate_path("g0"), bytes).expect("write gate");
        if let Ok(file) = gates.prepare("g0", &GateConfig::new(42, PolicyKind::Mmk), me) {
            let snap = file
                .snapshot()
                .expect("a gate mmkd made or took over reads");
            let _ = (snap.config(), snap.totals(), snap.slots());
        }
        // A job may also shorten its gate under mmkd.
        let _ = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len((bytes.len() / 2) as u64));
        if let Ok(file) = GateFile::open(&path) {
            let _ = file.snapshot();
        }
        // mmkd takes over whatever a previous mmkd, or a job, left in the file.
        std::fs::write(&path, bytes).expect("write gate");
        let config = GateConfig::new(42, PolicyKind::Orion);
        if let Ok(gate) = Gate::create(&path, &config) {
            use_gate(&gate);
        }
        let _ = std::fs::remove_file(&path);
        accepted
    });
}

fn profile_seed() -> Vec<u8> {
    let key = |name: &str| KernelKey {
        name: name.into(),
        grid: [128, 1, 1],
        block: [256, 1, 1],
        shared_mem: 4096,
    };
    Profile {
        version: 1,
        job: "resnet".into(),
        class: "online".into(),
        launches: 4,
        requests: 2,
        request_ns: 174_000,
        kernels: vec![
            KernelStats {
                key: key("conv"),
                launches: 2,
                mean_ns: 100_000,
                p95_ns: 100_000,
                gap_after_ns: 50_000,
                ends_request: 0.0,
                sm_demand: 100,
                intensity: Intensity::Compute,
            },
            KernelStats {
                key: key("relu"),
                launches: 2,
                mean_ns: 22_000,
                p95_ns: 24_000,
                gap_after_ns: 0,
                ends_request: 1.0,
                sm_demand: 20,
                intensity: Intensity::Unknown,
            },
        ],
    }
    .to_json()
    .into_bytes()
}

const JSON_DICT: &[&[u8]] = &[
    b"\"",
    b",",
    b":",
    b"{",
    b"}",
    b"[",
    b"]",
    b"null",
    b"0",
    b"-1",
    b"1e309",
    b"18446744073709551615",
    b"18446744073709551616",
    b"\"online\"",
    b"\"offline\"",
    b"\"memory\"",
    b"\\u0000",
];

#[test]
fn kernel_profile() {
    support::fuzz("kernel_profile", vec![profile_seed()], JSON_DICT, |bytes| {
        let Ok(p) = Profile::parse(&String::from_utf8_lossy(bytes)) else {
            return false;
        };
        // What mmkd and the interposer do with a job's profile.
        let _ = p.index();
        let _ = p.dur_threshold_ns();
        true
    });
}

fn trace_seed() -> Vec<u8> {
    let rec = |seq: u64, kernel: &str, start: u64, end: Option<u64>| TraceRecord {
        seq,
        pid: 4242,
        class: Class::Online,
        api: "cuLaunchKernel".into(),
        kernel: kernel.into(),
        grid: [64, 2, 1],
        block: [128, 1, 1],
        shared_mem: 0,
        blocks_per_sm: 4,
        sm_demand: 32,
        stream: 0x5555_0000,
        launch_ns: start.saturating_sub(500),
        held_ns: 0,
        start_ns: Some(start),
        end_ns: end,
    };
    let records = [
        rec(0, "conv", 1_000, Some(101_000)),
        rec(1, "a,\"b\"", 150_000, Some(170_000)),
        rec(2, "conv", 5_000_000, Some(5_100_000)),
        rec(3, "relu", 5_150_000, None),
    ];
    let mut text = format!("{}\n", trace::HEADER);
    for r in &records {
        text.push_str(&r.to_line());
        text.push('\n');
    }
    text.into_bytes()
}

#[test]
fn kernel_trace() {
    let dict: &[&[u8]] = &[
        b",",
        b"\"",
        b"\n",
        b"0x",
        b"18446744073709551615",
        b"4294967296",
        b"offline",
        b"",
    ];
    support::fuzz("kernel_trace", vec![trace_seed()], dict, |bytes| {
        let Ok(records) = trace::parse(&String::from_utf8_lossy(bytes)) else {
            return false;
        };
        // What `mmk-lab profile` does with a trace.
        if let Ok(p) = Profile::from_trace("fuzz", Class::Online, &records) {
            let _ = p.index();
            let _ = Profile::parse(&p.to_json());
        }
        true
    });
}

/// Found by `gate_file`: counters that job processes wrote near their limits overflowed
/// the sums mmkd reads (`totals`, `in_flight`), a panic in a debug build.
#[test]
fn counters_at_their_limits_do_not_overflow() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(98, PolicyKind::Mmk)).expect("gate");
    let a = gate
        .join(std::process::id(), Class::Online, 0.5)
        .expect("slot");
    let b = gate.join(1, Class::Online, 0.5).expect("slot");
    drop(gate);
    // The layout of gate.rs: a 128-byte header, then 128-byte slots; in a slot, `inflight`
    // at 12 and `launches` at 32.
    let mut bytes = std::fs::read(&path).expect("read");
    for slot in [0, 1] {
        let at = 128 + slot * 128;
        bytes[at + 12..at + 16].copy_from_slice(&u32::MAX.to_ne_bytes());
        bytes[at + 32..at + 40].copy_from_slice(&u64::MAX.to_ne_bytes());
    }
    std::fs::write(&path, &bytes).expect("write");
    let gate = Gate::open(&path).expect("open");
    assert_eq!(gate.totals().launches, u64::MAX);
    assert_eq!(gate.in_flight().online_kernels, u32::MAX);
    assert!(!gate.device_force_if_starved(0, 1), "the word is open");
    gate.leave(a);
    gate.leave(b);
}
