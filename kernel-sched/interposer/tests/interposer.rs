//! The interposer in real job processes: the fake driver (`libcuda.so.1`) and runtime
//! (`libcudart.so.13`) on the library path, the test program launching through them the way
//! CUDA programs do, the interposer in `LD_PRELOAD`, and a gate made the way mmkd makes it.

#![allow(clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use mmk_kernel_sched::artifacts::{self, Built, FAKE_APP, FAKE_CUDA, INTERPOSER};
use mmk_kernel_sched::trace;
use mmk_kernel_sched::{Class, Gate, GateConfig, PolicyKind, SlotStats};
use serde_json::Value;

/// The built interposer, fake driver and test program (`cargo test --workspace` builds
/// them before any test runs).
fn built() -> &'static Built {
    static DIR: OnceLock<Built> = OnceLock::new();
    DIR.get_or_init(|| {
        artifacts::built_for_tests(&[INTERPOSER, FAKE_CUDA, FAKE_APP])
            .unwrap_or_else(|e| panic!("{e}"))
    })
}

struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    /// A library directory with the fake driver as `libcuda.so.1` and copies of it as
    /// `libcudart.so.13`, `libcublas.so.13` and `libcublasLt.so.13`.
    fn new() -> Node {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib");
        std::fs::create_dir(&lib).unwrap();
        std::fs::copy(built().join(FAKE_CUDA), lib.join("libcuda.so.1")).unwrap();
        for name in ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13"] {
            std::fs::copy(built().join(FAKE_CUDA), lib.join(name)).unwrap();
        }
        Node { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn gate(&self, policy: PolicyKind, base: Duration, max_hold: Duration) -> Gate {
        // No hold budget: these tests hold launches for as long as the policy says.
        self.gate_with(&GateConfig {
            base,
            max_hold,
            hold_budget_pct: 100,
            ..GateConfig::new(132, policy)
        })
    }

    fn gate_with(&self, config: &GateConfig) -> Gate {
        Gate::create(&self.path("g0.gate"), config).unwrap()
    }

    /// The test program as a job: `name` names its stats and trace files.
    fn job(&self, name: &str, class: Class, gate: bool, args: &[&str]) -> Command {
        let mut cmd = Command::new(built().join(FAKE_APP));
        cmd.args(args)
            .env("LD_LIBRARY_PATH", self.path("lib"))
            .env("LD_PRELOAD", built().join(INTERPOSER))
            .env("MMK_JOB_CLASS", class.as_str())
            .env("MMK_KSCHED_STATS", self.path(&format!("{name}.stats.json")))
            .env(
                "MMK_FAKE_CUDA_LOG",
                self.path(&format!("{name}.kernels.csv")),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if gate {
            cmd.env("MMK_GATE", self.path("g0.gate"));
        }
        cmd
    }

    fn stats(&self, name: &str) -> Value {
        let path = self.path(&format!("{name}.stats.json"));
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap()
    }

    /// (launch_ns, start_ns, end_ns) of every kernel the fake driver ran for job `name`.
    fn kernels(&self, name: &str) -> Vec<(u64, u64, u64)> {
        let text = std::fs::read_to_string(self.path(&format!("{name}.kernels.csv"))).unwrap();
        text.lines()
            .map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                (
                    f[3].parse().unwrap(),
                    f[4].parse().unwrap(),
                    f[5].parse().unwrap(),
                )
            })
            .collect()
    }

    /// For every kernel the fake driver ran for job `name`, when the last stream wait ahead
    /// of it on its stream was seen to pass: by a read of its word between the two times
    /// ((0, 0) without one).
    fn waits_passed(&self, name: &str) -> Vec<(u64, u64)> {
        let text = std::fs::read_to_string(self.path(&format!("{name}.kernels.csv"))).unwrap();
        text.lines()
            .map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                (f[7].parse().unwrap(), f[8].parse().unwrap())
            })
            .collect()
    }
}

fn finish(child: Child, what: &str) -> Value {
    let out: Output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{what}: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.trim()).unwrap()
}

#[test]
fn every_launch_entry_point_is_seen_once() {
    let node = Node::new();
    let trace_path = node.path("trace.csv");
    let started = Instant::now();
    let child = node
        .job(
            "all",
            Class::Offline,
            false,
            &[
                "--api",
                "all",
                "--kernels",
                "40",
                "--threads",
                "3",
                "--duration-us",
                "20",
            ],
        )
        .env("MMK_KSCHED_RECORD", &trace_path)
        .spawn()
        .unwrap();
    let summary = finish(child, "the job");
    let ran = started.elapsed();
    assert_eq!(summary["launched"], 120);
    let stats = node.stats("all");
    assert_eq!(stats["launches"], 120, "{stats}");
    assert_eq!(stats["gate"], false);
    // Ten entry points in turn over three threads: each is seen, none twice (a runtime launch
    // that goes on to the hooked driver counts once, under the runtime's name).
    let by_api = stats["by_api"].as_object().unwrap();
    for api in [
        "cuLaunchKernel",
        "cuLaunchKernelEx",
        "cuLaunchCooperativeKernel",
        "cuGraphLaunch",
        "cudaLaunchKernel",
        "__cudaLaunchKernel",
        "cudaLaunchKernelExC",
        "cudaLaunchCooperativeKernel",
        "cudaGraphLaunch",
    ] {
        assert!(by_api[api].as_u64().unwrap() >= 6, "{api} in {stats}");
    }
    assert_eq!(
        by_api.values().map(|v| v.as_u64().unwrap()).sum::<u64>(),
        120
    );
    // Record mode: one line a launch, with the kernel's identity and measured times.
    let records = trace::parse(&std::fs::read_to_string(&trace_path).unwrap()).unwrap();
    assert_eq!(records.len(), 120);
    for r in &records {
        assert!(r.kernel == "spin" || r.kernel == "graph", "{r:?}");
        // 132 blocks at one block an SM (the fake's occupancy), or a graph: the partition.
        assert_eq!(r.sm_demand, 132, "{r:?}");
        // Measured from an event before the launch to one after it: at least the kernel's
        // 20 us (the thread's time between the two, which a loaded machine stretches,
        // counts too), and within the job's own run.
        let took = r
            .duration_ns()
            .unwrap_or_else(|| panic!("unmeasured: {r:?}"));
        assert!(
            took >= 15_000 && u128::from(took) < ran.as_nanos(),
            "{r:?}: {took} ns in a run of {ran:?}"
        );
        assert!(r.start_ns.unwrap() + 1_000_000 >= r.launch_ns, "{r:?}");
    }
}

#[test]
fn offline_launches_wait_for_online_work_and_online_never_waits() {
    let node = Node::new();
    // No anti-starvation within the test's time: only online completions let offline in.
    let gate = node.gate(
        PolicyKind::Mmk,
        Duration::from_secs(30),
        mmk_kernel_sched::gate::MAX_HOLD_CEILING,
    );
    let online_args = [
        "--kernels",
        "10",
        "--duration-us",
        "20000",
        "--gap-us",
        "10000",
        "--blocks",
        "66",
    ];
    let offline_args = [
        "--kernels",
        "60",
        "--duration-us",
        "1000",
        "--blocks",
        "132",
        "--sync-every",
        "4",
    ];
    let spawned = mmk_kernel_sched::monotonic_ns();
    let jobs: Vec<(String, Child)> = [
        ("on1", Class::Online, &online_args[..]),
        ("on2", Class::Online, &online_args[..]),
        ("off1", Class::Offline, &offline_args[..]),
        ("off2", Class::Offline, &offline_args[..]),
    ]
    .into_iter()
    .map(|(name, class, args)| {
        (
            name.to_owned(),
            node.job(name, class, true, args).spawn().unwrap(),
        )
    })
    .collect();
    // Nothing deadlocked: every job ended, and no launch was forced (below) by the hard
    // bound of 10 s.
    for (name, child) in jobs {
        finish(child, &name);
    }

    for name in ["on1", "on2"] {
        let s = node.stats(name);
        assert_eq!(
            (s["launches"].as_u64(), s["held"].as_u64()),
            (Some(10), Some(0)),
            "{s}"
        );
        assert_eq!(s["policy"], "mmk");
    }
    let mut held = 0;
    for name in ["off1", "off2"] {
        let s = node.stats(name);
        assert_eq!(s["launches"], 60, "{s}");
        assert_eq!(s["forced"], 0, "{s}");
        held += s["held"].as_u64().unwrap();
    }
    assert!(
        held > 0,
        "offline launches were held while online kernels ran"
    );

    // What the gate saw, after every process left.
    let totals = gate.totals();
    assert_eq!(totals.launches, 2 * 10 + 2 * 60);
    assert_eq!(totals.held, held);
    assert!(gate.slots().is_empty(), "every process left its slot");

    // What the (fake) GPU did: no offline launch was let go while an online kernel was
    // on it.
    let online: Vec<(u64, u64, u64)> = ["on1", "on2"]
        .iter()
        .flat_map(|n| node.kernels(n))
        .collect();
    let busy = busy_stretches(&online);
    for name in ["off1", "off2"] {
        let launches: Vec<u64> = node.kernels(name).iter().map(|k| k.0).collect();
        let inside = decided_inside(&launches, &busy, spawned);
        assert!(
            inside.is_empty(),
            "{name} let go inside online stretches {inside:?}"
        );
    }
}

/// The stretches of time in which some of `kernels` were on the (fake) GPU, from a launch
/// to an end with nothing launched and not ended in between, in order.
fn busy_stretches(kernels: &[(u64, u64, u64)]) -> Vec<(u64, u64)> {
    let mut spans: Vec<(u64, u64)> = kernels.iter().map(|&(l, _, e)| (l, e)).collect();
    spans.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::new();
    for (from, to) in spans {
        match merged.last_mut() {
            Some(last) if from <= last.1 => last.1 = last.1.max(to),
            _ => merged.push((from, to)),
        }
    }
    merged
}

/// Launches of a job of one thread (`launches`, in order, as the fake driver logged them)
/// that its gate let go while one of `busy` (online kernels' stretches on the GPU) was
/// under way, with the stretch. The gate decides on a launch after the thread's previous
/// launch (or, for the first, after `since`): a launch whose predecessor was already
/// inside the stretch it lands in was decided inside it. A launch decided before a stretch
/// and made inside it (the thread ran late, as on a loaded machine) is not counted; the
/// gate cannot tell it from one made on time.
fn decided_inside(launches: &[u64], busy: &[(u64, u64)], since: u64) -> Vec<(u64, (u64, u64))> {
    let before = std::iter::once(since).chain(launches.iter().copied());
    launches
        .iter()
        .zip(before)
        .filter_map(|(&launch, before)| {
            busy.iter()
                .find(|&&(from, to)| from <= before && launch < to)
                .map(|&stretch| (launch, stretch))
        })
        .collect()
}

/// The most kernels of one job that were on the (fake) GPU at once, launched and not yet
/// finished, seen at each of its launches.
fn deepest_queue(kernels: &[(u64, u64, u64)]) -> usize {
    kernels
        .iter()
        .map(|&(at, _, _)| {
            kernels
                .iter()
                .filter(|&&(launch, _, end)| launch <= at && at < end)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn an_offline_job_queues_at_most_the_depth_cap_while_an_online_job_is_present() {
    let node = Node::new();
    // Thres (1 ms) is shorter than one offline kernel (2 ms): a launch waiting on its own
    // queue must not be let in by it.
    let gate = node.gate_with(&GateConfig {
        base: Duration::from_millis(1),
        max_hold: mmk_kernel_sched::gate::MAX_HOLD_CEILING,
        offline_depth: 3,
        hold_budget_pct: 100,
        ..GateConfig::new(132, PolicyKind::Mmk)
    });
    // 30 small offline kernels of 2 ms, never synchronised: without a cap the job queues
    // them all at once.
    let offline_args = ["--kernels", "30", "--duration-us", "2000", "--blocks", "8"];

    // No online job in the partition: no cap.
    let alone = node
        .job("alone", Class::Offline, true, &offline_args)
        .spawn()
        .unwrap();
    finish(alone, "the offline job alone");
    assert!(
        deepest_queue(&node.kernels("alone")) > 10,
        "alone, the job queues freely: {}",
        deepest_queue(&node.kernels("alone"))
    );
    assert_eq!(node.stats("alone")["held"], 0);

    // An online job present but idle most of the time (small kernels 500 ms apart).
    let online = node
        .job(
            "on",
            Class::Online,
            true,
            &[
                "--kernels",
                "5",
                "--duration-us",
                "100",
                "--gap-us",
                "500000",
                "--blocks",
                "8",
            ],
        )
        .spawn()
        .unwrap();
    wait_for_slot(&gate, "the online job joined", |s| {
        s.class == Some(Class::Online)
    });
    let offline = node
        .job("off", Class::Offline, true, &offline_args)
        .spawn()
        .unwrap();
    finish(offline, "the offline job");
    let still_there = gate.slots().iter().any(|s| s.class == Some(Class::Online));
    finish(online, "the online job");
    assert!(still_there, "the online job outlived the offline one");

    let off = node.kernels("off");
    assert_eq!(off.len(), 30);
    assert!(
        deepest_queue(&off) <= 3,
        "at most 3 offline kernels on the GPU at once, saw {}",
        deepest_queue(&off)
    );
    // After the first 3, a wait lets in at most 3 more (a tracking event can cover
    // several kernels, which then complete at once): 9 waits at least.
    let s = node.stats("off");
    assert!(s["held"].as_u64().unwrap() >= 9, "{s}");
    assert_eq!(
        s["forced"], 0,
        "waiting on queued work is not starving: {s}"
    );
}

/// How long a test waits for something that takes a job milliseconds: only a test that
/// fails waits this long.
const PATIENCE: Duration = Duration::from_secs(60);

/// Wait (up to [`PATIENCE`]) until some slot of `gate` is as `ready` says.
fn wait_for_slot(gate: &Gate, what: &str, ready: impl Fn(&SlotStats) -> bool) {
    let began = Instant::now();
    while !gate.slots().iter().any(&ready) {
        assert!(began.elapsed() < PATIENCE, "never: {what}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// (launch_ns, start_ns, end_ns) of a job's kernels, as `Node::kernels` reads them.
type Kernels = Vec<(u64, u64, u64)>;

/// Offline kernels that started while an online kernel ran.
fn started_beside(offline: &[(u64, u64, u64)], online: &[(u64, u64, u64)]) -> usize {
    offline
        .iter()
        .filter(|&&(_, start, _)| {
            online
                .iter()
                .any(|&(launch, _, end)| start >= launch && start < end)
        })
        .count()
}

/// Offline kernels let go by a device wait that passed while an online kernel was in
/// flight (the online process closes the word before it launches, so no wait passes from
/// an online launch to its kernel's end): one whose word was read, open, inside an online
/// kernel. (A read the machine's load delayed past the kernel's end, when the word was open
/// again, may be stamped inside it: the read's whole window must be.)
///
/// What a kernel's start cannot tell: a kernel launched after its wait passed starts when
/// it is launched, on the GPU as on the fake, and a launching thread that the machine's load
/// delays between the wait and the launch starts its kernel late.
fn passed_beside(passed: &[(u64, u64)], online: &[(u64, u64, u64)]) -> usize {
    passed
        .iter()
        .filter(|&&(from, by)| {
            from != 0
                && online
                    .iter()
                    .any(|&(launch, _, end)| from >= launch && by < end)
        })
        .count()
}

/// Queue 1,000 offline kernels of 1 ms at once, then run an online job (5 kernels of 2 ms,
/// 3 ms apart) beside them (its process starts once half of them are queued, while 500 ms
/// of them or more are still queued: its start may take a while on a loaded machine, as
/// may the offline job's launches); the gate's policy and `device_wait` as given. Returns
/// the offline and online kernels, when each offline kernel's device wait passed, and the
/// offline job's stats.
fn queued_offline_beside_online(
    node: &Node,
    policy: PolicyKind,
    device_wait: bool,
) -> (Kernels, Kernels, Vec<(u64, u64)>, Value) {
    let gate = node.gate_with(&GateConfig {
        base: Duration::from_millis(500),
        max_hold: mmk_kernel_sched::gate::MAX_HOLD_CEILING,
        device_wait,
        hold_budget_pct: 100,
        ..GateConfig::new(132, policy)
    });
    let offline = node
        .job(
            "off",
            Class::Offline,
            true,
            &[
                "--kernels",
                "1000",
                "--duration-us",
                "1000",
                "--blocks",
                "8",
            ],
        )
        .spawn()
        .unwrap();
    wait_for_slot(&gate, "the offline job queued its kernels", |s| {
        s.class == Some(Class::Offline) && s.inflight >= 500
    });
    let online = node
        .job(
            "on",
            Class::Online,
            true,
            &[
                "--kernels",
                "5",
                "--duration-us",
                "2000",
                "--gap-us",
                "3000",
                "--blocks",
                "8",
            ],
        )
        .spawn()
        .unwrap();
    finish(online, "the online job");
    let summary = finish(offline, "the offline job");
    assert_eq!(summary["launched"], 1000);
    (
        node.kernels("off"),
        node.kernels("on"),
        node.waits_passed("off"),
        node.stats("off"),
    )
}

#[test]
fn with_the_device_wait_queued_offline_kernels_do_not_start_beside_online_work() {
    // Without it (the CPU gate alone) kernels the offline job queued before the online
    // job came run beside its kernels: the gate sees launches, not what is queued.
    let node = Node::new();
    let (off, on, _, stats) = queued_offline_beside_online(&node, PolicyKind::Mmk, false);
    assert_eq!(on.len(), 5);
    assert_eq!(off.len(), 1000);
    assert!(
        started_beside(&off, &on) >= 3,
        "the CPU gate alone lets queued kernels start beside online ones: {}",
        started_beside(&off, &on)
    );
    assert_eq!(stats["device"]["waits"], 0);

    let node = Node::new();
    let (off, on, passed, stats) = queued_offline_beside_online(&node, PolicyKind::Mmk, true);
    assert_eq!(off.len(), 1000, "nothing is lost behind the waits");
    assert!(passed.iter().all(|&(at, _)| at != 0), "every kernel waited");
    assert_eq!(
        passed_beside(&passed, &on),
        0,
        "no offline kernel is let go while an online kernel runs"
    );
    assert_eq!(stats["device"]["waits"], 1000, "{stats}");
    assert_eq!(stats["device"]["error"], Value::Null);
    assert_eq!(stats["device"]["forced"], 0, "{stats}");
    // The offline kernels are still queued ahead: no gap between two of them (other than
    // where an online kernel ran) comes near the 500 ms bound a stuck word would leave
    // (half of it: a loaded machine may let the fake driver's releaser run late).
    let mut starts: Vec<(u64, u64)> = off.iter().map(|&(_, s, e)| (s, e)).collect();
    starts.sort_unstable();
    let on_span = |t: u64| {
        on.iter()
            .any(|&(l, _, e)| t + 1_000_000 >= l && t < e + 1_000_000)
    };
    let idle_gaps = starts
        .windows(2)
        .filter(|w| w[1].0 > w[0].1 + 250_000_000 && !on_span(w[0].1))
        .count();
    assert_eq!(
        idle_gaps, 0,
        "offline work flows when no online work is in flight"
    );
}

#[test]
fn the_device_wait_holds_queued_offline_kernels_under_orion_and_fikit_too() {
    // The word is closed by online launches, which every policy that tracks completions
    // counts; the policy decides only what the CPU gate does with new launches.
    for policy in [PolicyKind::Orion, PolicyKind::Fikit] {
        let node = Node::new();
        let (off, on, passed, stats) = queued_offline_beside_online(&node, policy, true);
        assert_eq!((off.len(), on.len()), (1000, 5), "{policy}");
        assert_eq!(
            passed_beside(&passed, &on),
            0,
            "{policy}: no offline kernel is let go while an online kernel runs"
        );
        assert_eq!(stats["device"]["waits"], 1000, "{policy}: {stats}");
        assert_eq!(stats["device"]["forced"], 0, "{policy}: {stats}");
    }
}

#[test]
fn a_device_wait_that_outlasts_the_bound_is_forced_open() {
    let node = Node::new();
    let gate = node.gate_with(&GateConfig {
        base: Duration::from_millis(2),
        max_hold: mmk_kernel_sched::gate::MAX_HOLD_CEILING,
        device_wait: true,
        hold_budget_pct: 100,
        ..GateConfig::new(132, PolicyKind::Mmk)
    });
    // One online kernel of 3 s: the offline kernels behind their waits would sit out all
    // of it without the bound. (Long beside the offline job's start and its ten waits of a
    // few ms, even on a loaded machine.)
    let online = node
        .job(
            "on",
            Class::Online,
            true,
            &[
                "--kernels",
                "1",
                "--duration-us",
                "3000000",
                "--blocks",
                "8",
            ],
        )
        .spawn()
        .unwrap();
    wait_for_slot(&gate, "an online kernel in flight", |s| {
        s.class == Some(Class::Online) && s.inflight > 0
    });
    let offline = node
        .job(
            "off",
            Class::Offline,
            true,
            &["--kernels", "10", "--duration-us", "1000", "--blocks", "8"],
        )
        .spawn()
        .unwrap();
    finish(offline, "the offline job");
    finish(online, "the online job");
    let (off, on) = (node.kernels("off"), node.kernels("on"));
    let online_end = on[0].2;
    let last = off.iter().map(|&(_, _, end)| end).max().unwrap();
    assert!(
        last < online_end,
        "the offline kernels ran within the online kernel's 3 s: {} ms before its end",
        (online_end.saturating_sub(last)) / 1_000_000
    );
    let stats = node.stats("off");
    assert!(stats["device"]["forced"].as_u64().unwrap() >= 1, "{stats}");
    assert_eq!(stats["device"]["waits"], 10);
}

#[test]
fn a_gate_the_driver_cannot_map_leaves_the_offline_job_on_the_cpu_gate() {
    let node = Node::new();
    node.gate_with(&GateConfig {
        device_wait: true,
        ..GateConfig::new(132, PolicyKind::Mmk)
    });
    let out = node
        .job("off", Class::Offline, true, &["--kernels", "5"])
        .env("MMK_FAKE_CUDA_NO_HOST_REGISTER", "1")
        .spawn()
        .unwrap()
        .wait_with_output()
        .unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("device wait off") && stderr.contains("/dev/shm"),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("device wait off").count(),
        1,
        "said once: {stderr}"
    );
    let stats = node.stats("off");
    assert_eq!(stats["launches"], 5);
    assert_eq!(stats["device"]["waits"], 0);
    assert!(
        stats["device"]["error"]
            .as_str()
            .is_some_and(|e| e.contains("cuMemHostRegister")),
        "{stats}"
    );
}

#[test]
fn a_dead_online_process_does_not_hold_offline_work() {
    let node = Node::new();
    let gate = node.gate(
        PolicyKind::Mmk,
        Duration::from_secs(30),
        mmk_kernel_sched::gate::MAX_HOLD_CEILING,
    );
    // The online job dies (SIGKILL) with 100 ms kernels in flight, before the poller
    // could see them complete.
    let online = node
        .job(
            "on",
            Class::Online,
            true,
            &[
                "--kernels",
                "50",
                "--duration-us",
                "100000",
                "--die-after",
                "3",
            ],
        )
        .spawn()
        .unwrap();
    let out = online.wait_with_output().unwrap();
    assert!(!out.status.success(), "the online job was killed");
    let offline = node
        .job(
            "off",
            Class::Offline,
            true,
            &["--kernels", "20", "--duration-us", "100"],
        )
        .spawn()
        .unwrap();
    let summary = finish(offline, "offline job");
    assert_eq!(summary["launched"], 20);
    let stats = node.stats("off");
    assert_eq!(
        stats["forced"], 0,
        "the dead slot was dropped, not waited out: {stats}"
    );
    // Dropped once, by the first launch's wait at most: no later launch waits on it.
    assert!(stats["held"].as_u64().unwrap() <= 1, "{stats}");
    assert!(gate.slots().is_empty());
}

/// The poller holds the tracker's streams while it records events behind their tails; a
/// launch must not wait for that. Here every event record takes 20 ms, so the poller spends
/// most of the run inside one: the launches (one every 0.2 ms, each tracked) still take
/// microseconds, far from the milliseconds a launch that waited would take even on a
/// loaded machine.
#[test]
fn a_tracked_launch_does_not_wait_for_the_pollers_event_records() {
    let node = Node::new();
    let _gate = node.gate(
        PolicyKind::Mmk,
        Duration::from_micros(1),
        Duration::from_secs(1),
    );
    let child = node
        .job(
            "on",
            Class::Online,
            true,
            &[
                "--kernels",
                "200",
                "--duration-us",
                "100",
                "--gap-us",
                "200",
            ],
        )
        .env("MMK_FAKE_CUDA_RECORD_DELAY_US", "20000")
        .spawn()
        .unwrap();
    let report = finish(child, "online");
    assert_eq!(report["failed"], 0, "{report}");
    let stats = node.stats("on");
    assert!(
        stats["tracking"]["events"].as_u64().unwrap() > 0,
        "tracked: {stats}"
    );
    let p50 = report["launch_ns"]["p50"].as_u64().unwrap();
    assert!(
        p50 < 5_000_000,
        "a launch took {p50} ns at p50 with 20 ms event records: {report}"
    );
}

/// A process of `class` that mmkd asks to stop tracking, in a gate that holds nothing,
/// counts its launches only; asked again (or, with `hold_budget_after`, once the gate
/// comes to hold offline launches), it tracks them again.
fn counts_only_once_asked(class: Class, hold_budget_after: Option<u32>) {
    let node = Node::new();
    // mmkd's default: the policy tracks every launch and holds none.
    let gate = node.gate_with(&GateConfig {
        base: Duration::from_micros(1),
        hold_budget_pct: 0,
        ..GateConfig::new(132, PolicyKind::Mmk)
    });
    assert!(!gate.config().waits_on_online(), "{:?}", gate.config());
    let name = match class {
        Class::Online => "on",
        Class::Offline => "off",
    };
    let child = node
        .job(
            name,
            class,
            true,
            // About 0.8 s of launches: time for every step below before it ends, even on
            // a loaded machine.
            &[
                "--kernels",
                "2000",
                "--duration-us",
                "100",
                "--gap-us",
                "300",
            ],
        )
        .spawn()
        .unwrap();
    let pid = child.id();
    let slot = |gate: &Gate| {
        gate.slots()
            .into_iter()
            .find(|s| s.pid == pid)
            .expect("the job's slot")
    };
    wait_for_slot(&gate, "tracked completions", |s| {
        s.pid == pid && s.completed >= 20
    });
    let at_ask = slot(&gate);
    assert!(gate.set_untracked(pid, true));
    // What was in flight when mmkd asked still completes; nothing launched after does.
    // Once two more launches were counted (the one under way when it asked, if any, went
    // first) and nothing is in flight, nothing more completes.
    wait_for_slot(&gate, "what was in flight completed", |s| {
        s.pid == pid && s.launches >= at_ask.launches + 2 && s.inflight == 0
    });
    let asked = slot(&gate);
    assert!(asked.untracked);
    wait_for_slot(&gate, "untracked launches", |s| {
        s.pid == pid && s.launches >= asked.launches + 100
    });
    let later = slot(&gate);
    assert_eq!(later.completed, asked.completed, "{asked:?} -> {later:?}");
    assert_eq!((later.inflight, later.inflight_sm), (0, 0), "{later:?}");
    match hold_budget_after {
        // The gate comes to hold offline launches (another job's policy, a new mmkd):
        // an offline process tracks its launches again at once, still flagged.
        Some(budget) => {
            gate.configure(&GateConfig {
                hold_budget_pct: budget,
                ..gate.config()
            });
            assert!(slot(&gate).untracked);
        }
        // Tracked again on request.
        None => assert!(gate.set_untracked(pid, false)),
    }
    wait_for_slot(&gate, "tracked again", |s| {
        s.pid == pid && s.completed > later.completed
    });
    let report = finish(child, name);
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(gate.totals().launches, 2000);
}

#[test]
fn a_process_mmkd_asks_to_stop_tracking_counts_its_launches_only() {
    counts_only_once_asked(Class::Online, None);
    counts_only_once_asked(Class::Offline, None);
}

#[test]
fn an_untracked_offline_process_tracks_again_when_its_gate_comes_to_hold() {
    counts_only_once_asked(Class::Offline, Some(10));
}

#[test]
fn passthrough_counts_without_holding() {
    let node = Node::new();
    let gate = node.gate(
        PolicyKind::Passthrough,
        Duration::from_micros(1),
        Duration::from_secs(1),
    );
    let online = node
        .job(
            "on",
            Class::Online,
            true,
            &["--kernels", "30", "--duration-us", "2000"],
        )
        .spawn()
        .unwrap();
    let offline = node
        .job(
            "off",
            Class::Offline,
            true,
            &["--kernels", "30", "--duration-us", "2000"],
        )
        .spawn()
        .unwrap();
    finish(online, "online");
    finish(offline, "offline");
    assert_eq!(node.stats("off")["held"], 0);
    assert_eq!(node.stats("off")["policy"], "passthrough");
    assert_eq!(gate.totals().launches, 60);
    assert_eq!(gate.totals().held, 0);
}

#[test]
fn a_job_runs_unchanged_without_a_usable_gate_or_with_the_interposer_off() {
    let node = Node::new();
    std::fs::write(node.path("g0.gate"), b"not a gate").unwrap();
    let child = node
        .job("broken", Class::Online, true, &["--kernels", "10"])
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("not an mmk gate") && stderr.contains("runs unscheduled"),
        "{stderr}"
    );
    assert_eq!(node.stats("broken")["launches"], 10, "still counted");

    let child = node
        .job("off", Class::Online, true, &["--kernels", "10"])
        .env("MMK_KSCHED_OFF", "1")
        .spawn()
        .unwrap();
    assert_eq!(finish(child, "interposer off")["launched"], 10);
    assert!(
        !node.path("off.stats.json").exists(),
        "the interposer did nothing"
    );
}

#[test]
fn online_streams_get_the_greatest_priority_and_offline_streams_keep_theirs() {
    let node = Node::new();
    let run = |name: &str, class: Class, extra: &[&str], mode: Option<&str>| {
        let mut args = vec!["--kernels", "4", "--threads", "2"];
        args.extend_from_slice(extra);
        let mut cmd = node.job(name, class, false, &args);
        if let Some(mode) = mode {
            cmd.env("MMK_KSCHED_STREAM_PRIORITY", mode);
        }
        let out = finish(cmd.spawn().unwrap(), name);
        (
            out["stream_priorities"].clone(),
            node.stats(name)["streams"].clone(),
        )
    };
    // The fake device's range is 0 (least, the default) to -5 (greatest).
    let (prios, streams) = run("on", Class::Online, &[], None);
    assert_eq!(prios, serde_json::json!([-5, -5]), "cuStreamCreate raised");
    assert_eq!(
        streams,
        serde_json::json!({"mode": "greatest", "created": 2, "raised": 2, "priority": -5})
    );
    let (prios, _) = run(
        "on-asked",
        Class::Online,
        &["--stream-priority", "-1"],
        None,
    );
    assert_eq!(
        prios,
        serde_json::json!([-5, -5]),
        "cuStreamCreateWithPriority raised"
    );

    let (prios, streams) = run("off", Class::Offline, &["--stream-priority", "-2"], None);
    assert_eq!(
        prios,
        serde_json::json!([-2, -2]),
        "offline keeps what it asked"
    );
    assert_eq!(
        streams,
        serde_json::json!({"mode": "keep", "created": 2, "raised": 0, "priority": 0})
    );
    let (prios, _) = run("on-keep", Class::Online, &[], Some("keep"));
    assert_eq!(
        prios,
        serde_json::json!([0, 0]),
        "turned off for an online job"
    );

    // A bad value is named and the class's default stands.
    let child = node
        .job("bad", Class::Offline, false, &["--kernels", "1"])
        .env("MMK_KSCHED_STREAM_PRIORITY", "high")
        .spawn()
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("MMK_KSCHED_STREAM_PRIORITY") && stderr.contains("\"high\""),
        "{stderr}"
    );
    assert_eq!(node.stats("bad")["streams"]["mode"], "keep");
}

#[test]
fn a_job_records_a_cuda_graph_by_stream_capture_under_the_kernel_scheduler() {
    // As `torch.cuda.graph` does: capture in global mode while earlier work is in flight.
    // The interposer must neither query anything that disturbs the capture (the driver would
    // invalidate it) nor track the captured launches, which run only inside the graph.
    let node = Node::new();
    let gate = node.gate(
        PolicyKind::Mmk,
        Duration::from_secs(30),
        mmk_kernel_sched::gate::MAX_HOLD_CEILING,
    );
    let args = [
        "--api",
        "runtime-graph",
        "--capture",
        "8",
        "--kernels",
        "5",
        "--duration-us",
        "1000",
    ];
    for (name, class) in [("on", Class::Online), ("off", Class::Offline)] {
        let out = finish(node.job(name, class, true, &args).spawn().unwrap(), name);
        assert_eq!(out["launched"], 5, "{out}");
        let s = node.stats(name);
        // The kernel before the capture and the five graph launches ran; the eight captured
        // launches ran nothing and were neither gated nor tracked.
        assert_eq!(
            (
                &s["launches"],
                &s["by_api"]["cudaGraphLaunch"],
                &s["captured"]
            ),
            (&Value::from(6), &Value::from(5), &Value::from(8)),
            "{s}"
        );
        assert_eq!(
            (&s["failed"], &s["untracked"]),
            (&Value::from(0), &Value::from(0))
        );
        // What the fake GPU ran: the kernel before the capture, then each graph launch as
        // one kernel of the eight captured ones' 8 ms (stretched by nothing: it runs alone).
        let log = std::fs::read_to_string(node.path(&format!("{name}.kernels.csv"))).unwrap();
        let ran: Vec<(&str, u64)> = log
            .lines()
            .map(|line| {
                let f: Vec<&str> = line.split(',').collect();
                let (start, end): (u64, u64) = (f[4].parse().unwrap(), f[5].parse().unwrap());
                (f[1], end - start)
            })
            .collect();
        assert_eq!(ran.len(), 6, "{ran:?}");
        assert_eq!(ran[0], ("spin", 20_000_000), "{ran:?}");
        assert!(
            ran[1..]
                .iter()
                .all(|&(k, ns)| k == "graph" && ns == 8_000_000),
            "{ran:?}"
        );
    }
    assert_eq!(gate.totals().launches, 12, "the gate saw what ran");
    assert!(gate.slots().is_empty());
}

/// The kernels the fake driver ran for job `name`, by kernel name.
fn kernel_names(node: &Node, name: &str) -> Vec<String> {
    let text =
        std::fs::read_to_string(node.path(&format!("{name}.kernels.csv"))).unwrap_or_default();
    text.lines()
        .map(|line| line.split(',').nth(1).unwrap_or_default().to_owned())
        .collect()
}

/// One `mmk-fake-cuda-app gemm` run of `blas` (64 x 256 x 128, 4.2 MFLOP) as job `name`.
fn gemm_job(node: &Node, name: &str, class: Class, blas: &str, trans_b: &str) -> (Value, Value) {
    let child = node
        .job(
            name,
            class,
            true,
            &[
                "gemm",
                "--blas",
                blas,
                "--trans-b",
                trans_b,
                "--m",
                "64",
                "--n",
                "256",
                "--k",
                "128",
            ],
        )
        .spawn()
        .unwrap();
    let out = finish(child, &format!("{name}: {blas} --trans-b {trans_b}"));
    (out, node.stats(name))
}

#[test]
fn an_offline_jobs_long_gemms_are_cut_into_gated_launches_that_compute_the_same() {
    let node = Node::new();
    // 1 MFLOP a piece: the 4.2 MFLOP GEMM goes in several pieces.
    node.gate_with(&GateConfig {
        gemm_slice_mflop: 1,
        ..GateConfig::new(132, PolicyKind::Passthrough)
    });
    let expected = mmk_kernel_sched::slice::column_slices(64, 256, 128, 1).len();
    assert!(expected > 2, "{expected}");
    for blas in ["sgemm", "gemmex", "gemmex-f64", "lt", "lt-bias-relu"] {
        for trans_b in ["n", "t"] {
            let name = format!("{blas}-{trans_b}");
            let (out, stats) = gemm_job(&node, &name, Class::Offline, blas, trans_b);
            // Every element as the whole call computes it (the app checks bit for bit).
            assert_eq!(out["mismatches"], 0, "{name}: {out}");
            assert_eq!(out["elements"], 64 * 256, "{name}: {out}");
            let api = match blas {
                "sgemm" => "cublasSgemm_v2",
                "gemmex" | "gemmex-f64" => "cublasGemmEx",
                _ => "cublasLtMatmul",
            };
            assert_eq!(stats["gemm"][api], 1, "{name}: {stats}");
            assert_eq!(stats["gemm"]["cut"], 1, "{name}: {stats}");
            assert_eq!(stats["gemm"]["pieces"], expected, "{name}: {stats}");
            assert_eq!(stats["gemm"]["uncut"], 0, "{name}: {stats}");
            // Each piece reached the driver as a launch of its own, through the gate.
            let kernels = kernel_names(&node, &name);
            assert_eq!(kernels.len(), expected, "{name}: {kernels:?}");
            assert!(kernels.iter().all(|k| k == "fake_gemm"), "{kernels:?}");
            assert_eq!(stats["launches"], expected, "{name}: {stats}");
        }
    }
}

#[test]
fn gemms_run_whole_online_without_a_limit_or_under_it() {
    let node = Node::new();
    let gate = node.gate_with(&GateConfig {
        gemm_slice_mflop: 1,
        ..GateConfig::new(132, PolicyKind::Passthrough)
    });
    let whole = |name: &str, stats: &Value| {
        assert_eq!(kernel_names(&node, name).len(), 1, "{name}");
        assert_eq!(stats["gemm"]["cut"], 0, "{name}: {stats}");
        assert_eq!(stats["gemm"]["uncut"], 0, "{name}: {stats}");
    };
    // An online job's GEMMs are never cut.
    let (out, stats) = gemm_job(&node, "online", Class::Online, "lt", "n");
    assert_eq!(out["mismatches"], 0, "{out}");
    assert_eq!(stats["gemm"]["cublasLtMatmul"], 1, "{stats}");
    whole("online", &stats);
    // Nor an offline job's when the gate sets no limit.
    gate.configure(&GateConfig::new(132, PolicyKind::Passthrough));
    let (out, stats) = gemm_job(&node, "unlimited", Class::Offline, "sgemm", "t");
    assert_eq!(out["mismatches"], 0, "{out}");
    whole("unlimited", &stats);
    // Nor a GEMM under the limit (4.2 MFLOP against 5).
    gate.configure(&GateConfig {
        gemm_slice_mflop: 5,
        ..GateConfig::new(132, PolicyKind::Passthrough)
    });
    let (out, stats) = gemm_job(&node, "small", Class::Offline, "gemmex", "n");
    assert_eq!(out["mismatches"], 0, "{out}");
    whole("small", &stats);
}

/// Launches share tracking events (the poller records one behind a stream's tail), and
/// the gate still sees the online job busy until its last kernel completes: the offline
/// job's kernels start after it. A stream destroyed with launches that no event covers yet
/// gets one first. With `MMK_KSCHED_EVENTS=launch`, every launch has an event of its own.
#[test]
fn launches_share_events_and_count_until_the_last_completes() {
    let node = Node::new();
    let gate = node.gate(
        PolicyKind::Mmk,
        Duration::from_secs(30),
        mmk_kernel_sched::gate::MAX_HOLD_CEILING,
    );
    // 40 kernels of 1 ms, launched within microseconds of each other: 40 ms of work.
    let online = node
        .job(
            "on",
            Class::Online,
            true,
            &[
                "--kernels",
                "40",
                "--duration-us",
                "1000",
                "--blocks",
                "132",
            ],
        )
        .spawn()
        .unwrap();
    wait_for_slot(&gate, "online kernels in flight", |s| {
        s.class == Some(Class::Online) && s.inflight > 0
    });
    // And on the (fake) GPU.
    let began = Instant::now();
    while std::fs::read_to_string(node.path("on.kernels.csv")).map_or(true, |t| t.is_empty()) {
        assert!(began.elapsed() < PATIENCE, "no online kernel ran");
        std::thread::sleep(Duration::from_micros(200));
    }
    let spawned = mmk_kernel_sched::monotonic_ns();
    let offline = node
        .job(
            "off",
            Class::Offline,
            true,
            &[
                "--kernels",
                "5",
                "--duration-us",
                "100",
                "--blocks",
                "132",
                "--destroy-stream",
            ],
        )
        .spawn()
        .unwrap();
    finish(online, "the online job");
    finish(offline, "the offline job");
    // The offline kernels go after the last online kernel ended: with the online
    // kernels launched within microseconds, one stretch on the GPU, that no offline launch
    // was let go inside. (A loaded machine that stops the online job's thread between
    // launches may leave the GPU idle in between: an offline launch may go there.)
    let busy = busy_stretches(&node.kernels("on"));
    let launches: Vec<u64> = node.kernels("off").iter().map(|k| k.0).collect();
    let inside = decided_inside(&launches, &busy, spawned);
    assert!(
        inside.is_empty(),
        "offline launches let go inside online stretches: {inside:?}"
    );
    let on = node.stats("on");
    let events = on["tracking"]["events"].as_u64().unwrap();
    // A stream has one event outstanding at a time, and each stays so for a kernel of
    // 1 ms at least: a few events for launches this close, one per ms of launching on a
    // loaded machine that spreads them out.
    let launched: Vec<u64> = node.kernels("on").iter().map(|k| k.0).collect();
    let span_us = (launched.iter().max().unwrap() - launched.iter().min().unwrap()) / 1_000;
    assert!(
        events >= 1 && events <= (span_us / 1_000 + 3).min(40),
        "40 launches over {span_us} us, {events} events: {on}"
    );
    assert_eq!(on["tracking"]["early"], 0, "{on}");
    assert_eq!(on["untracked"], 0, "{on}");
    let off = node.stats("off");
    assert_eq!(off["tracking"]["early"], 0, "{off}");
    assert_eq!(off["untracked"], 0, "{off}");
    assert_eq!(gate.totals().launches, 45);
    let each = node
        .job(
            "each",
            Class::Online,
            true,
            &["--kernels", "10", "--duration-us", "100"],
        )
        .env("MMK_KSCHED_EVENTS", "launch")
        .spawn()
        .unwrap();
    finish(each, "the job with an event per launch");
    assert_eq!(node.stats("each")["tracking"]["events"], 10);
}

/// A launch after a long quiet spell (the poller has gone to wait on its condition
/// variable) wakes the poller: the gate sees it complete while the job still runs.
#[test]
fn a_launch_after_a_quiet_spell_is_seen_to_complete() {
    let node = Node::new();
    let gate = node.gate(
        PolicyKind::Mmk,
        Duration::from_secs(30),
        mmk_kernel_sched::gate::MAX_HOLD_CEILING,
    );
    // 300 ms between launches: far beyond the poller's 50 ms of lingering.
    let job = node
        .job(
            "quiet",
            Class::Online,
            true,
            &[
                "--kernels",
                "3",
                "--duration-us",
                "100",
                "--gap-us",
                "300000",
            ],
        )
        .spawn()
        .unwrap();
    wait_for_slot(&gate, "the second launch seen complete", |s| {
        s.class == Some(Class::Online) && s.launches == 2 && s.completed == 2 && s.inflight == 0
    });
    finish(job, "the quiet job");
    let stats = node.stats("quiet");
    assert_eq!(stats["tracking"]["events"], 3, "{stats}");
    assert_eq!(stats["tracking"]["early"], 0, "{stats}");
}
