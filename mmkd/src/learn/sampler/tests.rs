use super::*;
use mmk_kernel_sched::{Charge, Class, Gate, GateConfig, PolicyKind};

#[test]
fn periods_are_one_to_three_ms() {
    let mut j = Jitter::new();
    let p: Vec<u64> = (0..10_000).map(|_| j.period_us()).collect();
    assert!(p.iter().all(|v| (1000..3000).contains(v)));
    let mean = p.iter().sum::<u64>() as f64 / p.len() as f64;
    assert!((mean - 2000.0).abs() < 50.0, "{mean}");
}

const JOB: u64 = 7;

/// Job 7 of this test's user, in the gate at `gate` on a GPU of `gpu_sms` SMs.
fn test_watch(class: JobClass, gate: PathBuf, gpu_sms: u32) -> Watch {
    Watch {
        signature: "x".into(),
        owner_uid: None,
        name: "x".into(),
        class,
        gate,
        partition: (0, None),
        partition_mem_frac: 1.0,
        gpu_sms,
        uid: crate::os::uid(),
        learned: false,
        learned_ns_per_launch: None,
        keep_tracked: false,
    }
}

/// The device read every 100 ms instead of every second.
const FAST: Periods = Periods {
    flush: FLUSH,
    reap: REAP_EVERY,
    device: Duration::from_millis(100),
    retrack: RETRACK_EVERY,
    retrack_samples: MIN_SAMPLES,
};

/// Every process is job 7 of this test's user, except pid 1.
fn job_seven(pid: u32) -> Option<(u64, u32)> {
    (pid != 1).then(|| (JOB, crate::os::uid()))
}

/// A gate under the `mmk` policy with this hold budget (0: mmkd's default, holding
/// nothing), in `dir`.
fn mmk_gate(dir: &std::path::Path, budget: u32) -> (PathBuf, Gate) {
    let path = dir.join("g.gate");
    let config = GateConfig {
        hold_budget_pct: budget,
        ..GateConfig::new(98, PolicyKind::Mmk)
    };
    let gate = Gate::create(&path, &config).expect("gate");
    (path, gate)
}

/// One launch as the interposer makes it: counted only where mmkd asked for that,
/// else tracked, 27 SMs in flight for `busy`; then `gap`. How long it was in flight,
/// when tracked.
fn launch(
    gate: &Gate,
    slot: mmk_kernel_sched::SlotId,
    busy: Duration,
    gap: Duration,
) -> Option<Duration> {
    let tracked = (!gate.untracked(slot)).then(|| {
        let charge = Charge {
            sm: 27,
            ..Charge::default()
        };
        let began = Instant::now();
        gate.begin(slot, &charge);
        std::thread::sleep(busy);
        gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
        began.elapsed()
    });
    if tracked.is_none() {
        gate.count(slot);
    }
    std::thread::sleep(gap);
    tracked
}

/// How long a test waits for the sampler to see something that takes it milliseconds:
/// only a test that fails waits this long.
const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `done` holds of job 7's totals.
fn until_totals(sampler: &Sampler, what: &str, done: impl Fn(&JobTotals) -> bool) {
    let began = Instant::now();
    while !sampler.totals().get(&JOB).is_some_and(&done) {
        assert!(began.elapsed() < PATIENCE, "{what}: {:?}", sampler.totals());
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until the sampler has read `launches` launches of job 7.
fn until_read(sampler: &Sampler, launches: u64) {
    until_totals(sampler, &format!("{launches} launches read"), |t| {
        t.launches == launches
    });
}

/// A slot counts for a job only in the gate of the job's partition, and only where
/// that gate belongs to the job's user: a gate elsewhere that names the job's process
/// (a forged slot) adds nothing to it.
#[test]
fn a_slot_counts_only_in_its_jobs_gate_and_for_the_gates_owner() {
    let dir = tempfile::tempdir().expect("tmp");
    let (mine, other) = (dir.path().join("a.gate"), dir.path().join("b.gate"));
    let config = GateConfig::new(98, PolicyKind::Passthrough);
    let a = Gate::create(&mine, &config).expect("gate");
    let b = Gate::create(&other, &config).expect("gate");
    let in_a = a
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    // Another partition's gate names this job's process.
    let forged = b
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    let (sampler, _rx, handle) = Sampler::start_with(job_seven, None, Periods::default());
    sampler.watch(JOB, test_watch(JobClass::Offline, mine.clone(), 108));
    sampler.watch(8, test_watch(JobClass::Offline, other.clone(), 108));
    for _ in 0..50 {
        b.count(forged);
    }
    for _ in 0..10 {
        a.count(in_a);
    }
    until_read(&sampler, 10);
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(
        sampler.totals()[&JOB].launches,
        10,
        "the forged slot's 50 are not job 7's"
    );
    if crate::os::running_as_root() {
        // The partition's gate made anew for another user (as mmkd does when the
        // partition passes to them): the job's process there no longer counts.
        let theirs_path = dir.path().join("c.gate");
        let theirs = Gate::create(&theirs_path, &config).expect("gate");
        std::os::unix::fs::chown(&theirs_path, Some(65534), None).expect("chown");
        let slot = theirs
            .join(std::process::id(), Class::Offline, 1.0)
            .expect("slot");
        std::fs::rename(&theirs_path, &mine).expect("rename");
        for _ in 0..10 {
            theirs.count(slot);
        }
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            sampler.totals()[&JOB].launches,
            10,
            "{:?}",
            sampler.totals()
        );
    }
    sampler.stop();
    handle.join().expect("sampler");
}

/// This process plays a job: it joins a gate and keeps 27 SMs of a 108-SM GPU in
/// flight half of the time; a process of another user is in the gate too.
#[tokio::test]
async fn a_jobs_slots_become_its_observed_profile() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(98, PolicyKind::Passthrough)).expect("gate");
    let slot = gate
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    // pid 1 (another user's, as far as the sampler knows) keeps 98 SMs in flight.
    let stranger = gate.join(1, Class::Offline, 1.0).expect("slot");
    let big = Charge {
        sm: 98,
        ..Charge::default()
    };
    gate.begin(stranger, &big);
    let (sampler, mut rx, handle) = Sampler::start_with(job_seven, None, Periods::default());
    let watched_from = Instant::now();
    sampler.watch(JOB, test_watch(JobClass::Offline, path, 108));
    let charge = Charge {
        sm: 27,
        ..Charge::default()
    };
    // The time each kernel was in flight as this test measures it: from before its
    // `begin` to after its `end`, so never less than the gate's own measure. Sleeps
    // run long on a loaded machine: the expectations are taken from what they took.
    let mut in_flight = Duration::ZERO;
    let started = Instant::now();
    for _ in 0..200 {
        let began = Instant::now();
        gate.begin(slot, &charge);
        std::thread::sleep(Duration::from_millis(5));
        gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
        in_flight += began.elapsed();
        std::thread::sleep(Duration::from_millis(5));
    }
    let ran = started.elapsed();
    // What unwatch does not read is lost: wait for the last kernel's GPU time.
    until_totals(&sampler, "a second of GPU time read", |t| {
        t.launches == 200 && t.kernel_ns >= 1_000_000_000
    });
    sampler.unwatch(JOB, true);
    let watched = watched_from.elapsed();
    let totals = sampler.totals()[&JOB];
    assert_eq!(totals.launches, 200);
    // 200 kernels of at least 5 ms each: a second of GPU time or more, and no more
    // than the time they were in flight.
    assert!(
        totals.kernel_ns >= 1_000_000_000 && u128::from(totals.kernel_ns) <= in_flight.as_nanos(),
        "{} ns, {in_flight:?} in flight",
        totals.kernel_ns
    );
    sampler.stop();
    handle.join().expect("sampler");
    let seen = rx.recv().await.expect("a report");
    assert_eq!(seen.job, JOB);
    let o = seen.observed;
    assert_eq!(o.runs, 1);
    // Busy the share of the time watched that its kernels were in flight (about
    // half), as sampled.
    let busy = in_flight.as_secs_f64() / watched.as_secs_f64();
    assert!(
        (o.busy_frac() - busy).abs() < 0.1,
        "{} sampled, {busy} in flight",
        o.busy_frac()
    );
    // 27 of 108 SMs while busy; the stranger's 98 SMs are not the job's.
    assert!(
        (o.sm_mean() - 0.25 * o.busy_frac()).abs() < 0.025,
        "{} with {} busy",
        o.sm_mean(),
        o.busy_frac()
    );
    assert_eq!(o.sm_p95(), 0.25);
    assert_eq!(o.launches, 200);
    // The time it was watched, as sampled: a gap between two samples counts 50 ms at
    // most, so a little less where the sampler ran late, never more.
    assert!(
        o.seconds <= watched.as_secs_f64() && o.seconds >= 0.75 * ran.as_secs_f64(),
        "{} s sampled, {ran:?} of kernels, {watched:?} watched",
        o.seconds
    );
}

/// A job whose profile is learned, online or offline, in a gate that holds nothing, is
/// asked to stop tracking its launches and is no longer sampled (an offline job after
/// a window at its start: 100 kernels for the watch for slow runs); where the gate may
/// hold offline launches, it stays tracked.
#[tokio::test]
async fn a_learned_job_is_asked_to_stop_tracking_where_nothing_waits_on_it() {
    for (class, budget, untracked) in [
        (JobClass::Online, 0, true),
        (JobClass::Online, 10, false),
        (JobClass::Offline, 0, true),
        (JobClass::Offline, 10, false),
    ] {
        let dir = tempfile::tempdir().expect("tmp");
        let (path, gate) = mmk_gate(dir.path(), budget);
        let slot_class = match class {
            JobClass::Online => Class::Online,
            JobClass::Offline => Class::Offline,
        };
        let slot = gate
            .join(std::process::id(), slot_class, 1.0)
            .expect("slot");
        let periods = Periods {
            retrack_samples: 10,
            ..Periods::default()
        };
        let (sampler, mut rx, handle) = Sampler::start_with(job_seven, None, periods);
        sampler.watch(
            JOB,
            Watch {
                learned: true,
                ..test_watch(class, path.clone(), 108)
            },
        );
        // 160 launches; one that is to be untracked goes on until it is (a loaded
        // machine may run the sampler late).
        let (mut launches, mut tracked) = (0u64, 0usize);
        let began = Instant::now();
        while launches < 160 || (untracked && !gate.untracked(slot)) {
            assert!(began.elapsed() < PATIENCE, "{class:?}: never untracked");
            let took = launch(
                &gate,
                slot,
                Duration::from_millis(2),
                Duration::from_millis(1),
            );
            tracked += usize::from(took.is_some());
            launches += 1;
        }
        // What unwatch does not read is lost.
        until_read(&sampler, launches);
        assert_eq!(
            gate.untracked(slot),
            untracked,
            "{class:?}, hold budget {budget}"
        );
        sampler.unwatch(JOB, true);
        sampler.stop();
        handle.join().expect("sampler");
        let reported = rx.try_recv();
        match (class, untracked) {
            // Asked at its first sample: nothing of this run went into its profile.
            (JobClass::Online, true) => assert!(reported.is_err(), "{reported:?}"),
            // Its first kernels were tracked, for the watch for slow runs: 100, and
            // those the sampler let by before its next sample (not another window's
            // worth, even on a loaded machine).
            (JobClass::Offline, true) => {
                assert!((100..200).contains(&tracked), "{tracked} tracked");
                let seen = reported.expect("a report from the start");
                assert!(seen.observed.completed >= 100, "{:?}", seen.observed);
            }
            (_, false) => {
                let seen = reported.expect("a report");
                assert!(seen.observed.samples > 0);
            }
        }
        if untracked {
            // Its next run, in a gate that has come to hold offline launches (mmkd
            // restarted with a budget, another job's policy): tracked again.
            let (sampler, _rx, handle) = Sampler::start_with(job_seven, None, Periods::default());
            sampler.watch(
                JOB,
                Watch {
                    learned: true,
                    ..test_watch(class, path.clone(), 108)
                },
            );
            gate.configure(&GateConfig {
                hold_budget_pct: 10,
                ..gate.config()
            });
            let began = Instant::now();
            while gate.untracked(slot) {
                assert!(began.elapsed() < PATIENCE, "still untracked");
                std::thread::sleep(Duration::from_millis(2));
            }
            sampler.stop();
            handle.join().expect("sampler");
        }
    }
}

/// A learned offline job stays tracked while an online process beside it is (being
/// learned, or in a window), and is untracked once that one is.
#[tokio::test]
async fn an_offline_job_is_untracked_only_while_no_online_process_is_tracked() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, gate) = mmk_gate(dir.path(), 0);
    let slot = gate
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    // Another job's service (pid 1: not job 7), tracked.
    gate.join(1, Class::Online, 1.0).expect("slot");
    let periods = Periods {
        retrack_samples: 10,
        ..Periods::default()
    };
    let (sampler, _rx, handle) = Sampler::start_with(job_seven, None, periods);
    sampler.watch(
        JOB,
        Watch {
            learned: true,
            ..test_watch(JobClass::Offline, path, 108)
        },
    );
    let run = |kernels: u32| {
        for _ in 0..kernels {
            launch(
                &gate,
                slot,
                Duration::from_millis(1),
                Duration::from_millis(1),
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    // Past its start window (100 kernels), still tracked beside the tracked service.
    run(200);
    assert!(!gate.untracked(slot), "untracked beside a tracked service");
    // The service is learned and untracked: the training follows, at the sampler's
    // next look (later on a loaded machine).
    assert!(gate.set_untracked(1, true));
    let began = Instant::now();
    while !gate.untracked(slot) {
        assert!(
            began.elapsed() < PATIENCE,
            "still tracked beside an untracked service"
        );
        run(20);
    }
    sampler.unwatch(JOB, true);
    sampler.stop();
    handle.join().expect("sampler");
}

/// A learned job counted only is tracked again for a window every `retrack`; its GPU
/// time goes on growing meanwhile, by its GPU time per launch.
#[tokio::test]
async fn an_untracked_job_is_tracked_again_now_and_then_and_its_gpu_time_estimated() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, gate) = mmk_gate(dir.path(), 0);
    let slot = gate
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    let periods = Periods {
        retrack: Duration::from_millis(200),
        retrack_samples: 40,
        ..Periods::default()
    };
    let (sampler, mut rx, handle) = Sampler::start_with(job_seven, None, periods);
    sampler.watch(
        JOB,
        Watch {
            learned: true,
            learned_ns_per_launch: Some(2_000_000.0),
            ..test_watch(JobClass::Offline, path, 108)
        },
    );
    // Tracked launches 2 ms in flight, as the profile says; windows of 100 kernels
    // (about 0.4 s) with 0.2 s between them. For 2.5 s, and on (a loaded machine runs
    // the windows longer) until it was tracked again twice.
    let (mut counted, mut tracked, mut windows) = (0u64, 0u64, 0);
    let mut busy = Duration::ZERO;
    let mut was_untracked = false;
    let began = Instant::now();
    let until = began + Duration::from_millis(2500);
    while Instant::now() < until || windows < 2 || tracked < 100 || counted <= 50 {
        assert!(
            began.elapsed() < PATIENCE,
            "{counted} counted, {tracked} tracked, tracked again {windows} times"
        );
        let took = launch(
            &gate,
            slot,
            Duration::from_millis(2),
            Duration::from_millis(2),
        );
        match took {
            None => counted += 1,
            Some(t) => {
                windows += usize::from(was_untracked);
                tracked += 1;
                busy += t;
            }
        }
        was_untracked = took.is_none();
    }
    until_read(&sampler, counted + tracked);
    sampler.unwatch(JOB, true);
    let totals = sampler.totals()[&JOB];
    sampler.stop();
    handle.join().expect("sampler");
    assert!(
        counted > 50 && tracked > 0,
        "{counted} counted, {tracked} tracked"
    );
    assert!(windows >= 2, "tracked again {windows} times");
    assert!(tracked >= 100, "{tracked} tracked");
    assert_eq!(totals.launches, counted + tracked);
    // The tracked launches' time in flight, and 2 ms (the profile's) for each counted
    // one.
    let want = busy.as_nanos() as f64 + counted as f64 * 2e6;
    let got = totals.kernel_ns as f64;
    assert!(
        (got / want - 1.0).abs() < 0.1,
        "{got} ns of GPU time, {want} expected: {totals:?}"
    );
    // The windows' samples went into its profile.
    let seen = rx.try_recv().expect("a report from the windows");
    assert!(seen.observed.samples >= 40, "{:?}", seen.observed);
}

/// A job that runs on is reported every flush period, not only at its end; only its
/// first report counts the run.
#[tokio::test]
async fn a_running_job_is_reported_every_flush_period() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(98, PolicyKind::Passthrough)).expect("gate");
    let slot = gate
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    let periods = Periods {
        flush: Duration::from_millis(150),
        ..Periods::default()
    };
    let (sampler, mut rx, handle) = Sampler::start_with(job_seven, None, periods);
    sampler.watch(JOB, test_watch(JobClass::Offline, path, 108));
    let charge = Charge {
        sm: 27,
        ..Charge::default()
    };
    // For 700 ms (four or five flush periods), and on until two reports came (a loaded
    // machine may run the sampler late).
    let began = Instant::now();
    let until = began + Duration::from_millis(700);
    let mut runs = Vec::new();
    while Instant::now() < until || runs.len() < 2 {
        assert!(began.elapsed() < PATIENCE, "reports while it ran: {runs:?}");
        gate.begin(slot, &charge);
        std::thread::sleep(Duration::from_millis(5));
        gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
        // Still running: what was reported so far came from the flush period alone.
        while let Ok(seen) = rx.try_recv() {
            runs.push(seen.observed.runs);
        }
    }
    assert_eq!(runs[0], 1, "{runs:?}");
    assert!(runs[1..].iter().all(|&r| r == 0), "{runs:?}");
    sampler.unwatch(JOB, true);
    sampler.stop();
    handle.join().expect("sampler");
}

/// Launches counted but never seen to end (a gate that tracks nothing) are no
/// measurement of the job's demand: no profile is reported, while its launches still
/// count in its totals.
#[tokio::test]
async fn launches_nobody_tracked_make_no_profile() {
    // (`rx` stays open while the sampler lives: ask, do not wait.)
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(98, PolicyKind::Passthrough)).expect("gate");
    let slot = gate
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    let (sampler, mut rx, handle) = Sampler::start_with(job_seven, None, Periods::default());
    sampler.watch(JOB, test_watch(JobClass::Offline, path, 108));
    for _ in 0..50 {
        gate.count(slot);
        std::thread::sleep(Duration::from_millis(5));
    }
    sampler.unwatch(JOB, true);
    assert_eq!(sampler.totals()[&JOB].launches, 50);
    sampler.stop();
    handle.join().expect("sampler");
    assert!(rx.try_recv().is_err(), "no profile from untracked launches");
}

/// The driver's memory per process, read once a second, gives the job's peak: its own
/// processes' sum, not a stranger's.
#[tokio::test]
async fn a_jobs_peak_gpu_memory_is_what_the_driver_reports_for_its_processes() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(132, PolicyKind::Passthrough)).expect("gate");
    let me = std::process::id();
    let slot = gate.join(me, Class::Offline, 1.0).expect("slot");
    let _stranger = gate.join(1, Class::Offline, 1.0).expect("slot");
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = Arc::clone(&calls);
    let memory: ReadDevice = Arc::new(move || {
        // 5 GiB at first (twice: a sampler that runs late on a loaded machine may see
        // only the later of two readings), 3 GiB from the third read on; pid 1 is not
        // the job's.
        let n = counted.fetch_add(1, Ordering::Relaxed);
        let gib = if n < 2 { 5 } else { 3 };
        Readings {
            memory: vec![(me, gib << 30), (1, 40 << 30)],
            bandwidth: Vec::new(),
        }
    });
    let (sampler, mut rx, handle) = Sampler::start_with(job_seven, Some(memory), FAST);
    sampler.watch(JOB, test_watch(JobClass::Offline, path, 132));
    let charge = Charge {
        sm: 10,
        ..Charge::default()
    };
    // Until the device was read a fourth time (about 300 ms; later where the reader
    // runs late).
    let began = Instant::now();
    while calls.load(Ordering::Relaxed) < 4 {
        assert!(began.elapsed() < PATIENCE, "read about once a period");
        gate.begin(slot, &charge);
        std::thread::sleep(Duration::from_millis(5));
        gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
    }
    sampler.unwatch(JOB, true);
    sampler.stop();
    handle.join().expect("sampler");
    let seen = rx.recv().await.expect("a report");
    // The peak, not the latest reading.
    assert_eq!(seen.observed.mem_peak_bytes, 5 << 30);
}

/// The device's bandwidth reading of a job's partition counts for the job when its
/// processes were alone in the gate over the window, and not when another process was
/// there too; another partition's reading never counts.
#[tokio::test]
async fn a_jobs_bandwidth_is_its_partitions_while_it_runs_alone() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(132, PolicyKind::Passthrough)).expect("gate");
    let slot = gate
        .join(std::process::id(), Class::Offline, 1.0)
        .expect("slot");
    let calls = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counted = Arc::clone(&calls);
    let device: ReadDevice = Arc::new(move || {
        counted.fetch_add(1, Ordering::Relaxed);
        Readings {
            memory: Vec::new(),
            bandwidth: vec![(1, None, 0.9), (0, None, 0.4), (0, Some(3), 0.7)],
        }
    });
    let (sampler, mut rx, handle) = Sampler::start_with(job_seven, Some(device), FAST);
    let charge = Charge {
        sm: 10,
        ..Charge::default()
    };
    // Six periods of the device reader, and on until it has read the device eight
    // times (a loaded machine runs it late, and a reading that comes late is dropped).
    // How many times it read.
    let run = || {
        let (began, from) = (Instant::now(), calls.load(Ordering::Relaxed));
        while began.elapsed() < FAST.device * 6 || calls.load(Ordering::Relaxed) < from + 8 {
            assert!(
                began.elapsed() < PATIENCE,
                "the device is read once a period"
            );
            gate.begin(slot, &charge);
            std::thread::sleep(Duration::from_millis(5));
            gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
        }
        calls.load(Ordering::Relaxed) - from
    };
    sampler.watch(JOB, test_watch(JobClass::Offline, path.clone(), 132));
    let reads = run();
    sampler.unwatch(JOB, true);
    let alone = rx.recv().await.expect("a report").observed;
    // A window a reading (one that came on time), the first reading opening the first.
    assert!(
        (2..=reads).contains(&alone.bw_windows),
        "{reads} readings: {} windows",
        alone.bw_windows
    );
    assert!(
        (alone.bw_sum / alone.bw_windows as f64 - 0.4).abs() < 1e-9,
        "{alone:?}"
    );
    // pid 1, not the job's, joins the partition.
    let _stranger = gate.join(1, Class::Offline, 1.0).expect("slot");
    sampler.watch(JOB, test_watch(JobClass::Offline, path, 132));
    run();
    sampler.unwatch(JOB, true);
    sampler.stop();
    handle.join().expect("sampler");
    let shared = rx.recv().await.expect("a report").observed;
    assert!(shared.samples > 0);
    assert_eq!(shared.bw_windows, 0, "{shared:?}");
}

/// An online job beside an offline kernel that stays in flight: all its busy time is
/// time beside offline work; alone, none is.
#[tokio::test]
async fn an_online_jobs_time_beside_offline_work_is_counted() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(132, PolicyKind::Passthrough)).expect("gate");
    let slot = gate
        .join(std::process::id(), Class::Online, 1.0)
        .expect("slot");
    let offline = gate.join(1, Class::Offline, 1.0).expect("slot");
    let (sampler, _rx, handle) = Sampler::start_with(job_seven, None, Periods::default());
    sampler.watch(JOB, test_watch(JobClass::Online, path, 132));
    let charge = Charge {
        sm: 10,
        ..Charge::default()
    };
    // In flight for 300 ms (longer on a loaded machine): how long, as measured here
    // from before its `begin` to after its `end`.
    let run = |ms: u64| {
        let began = Instant::now();
        gate.begin(slot, &charge);
        std::thread::sleep(Duration::from_millis(ms));
        gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
        began.elapsed()
    };
    // Alone: busy, but nothing offline in flight.
    run(300);
    let alone = sampler.totals()[&JOB].beside_offline_ns;
    assert_eq!(alone, 0);
    gate.begin(offline, &charge);
    let in_flight = run(300);
    let beside = sampler.totals()[&JOB].beside_offline_ns;
    sampler.stop();
    handle.join().expect("sampler");
    // All of it, as sampled: a sample counts the time since the one before, at most
    // MAX_STEP (the first busy one some of it from before), and the time since the last
    // is not read yet.
    let (most, least) = (in_flight + MAX_STEP, in_flight.saturating_sub(2 * MAX_STEP));
    assert!(
        u128::from(beside) <= most.as_nanos() && u128::from(beside) >= least.as_nanos(),
        "{in_flight:?} beside an offline kernel: {beside} ns"
    );
}

/// A job's totals add up over its runs: a run that ends with the job requeued carries
/// them into the next.
#[tokio::test]
async fn totals_add_up_over_a_jobs_runs() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("g.gate");
    let gate = Gate::create(&path, &GateConfig::new(132, PolicyKind::Passthrough)).expect("gate");
    let (sampler, _rx, handle) = Sampler::start_with(job_seven, None, Periods::default());
    let watch = test_watch(JobClass::Offline, path, 132);
    let charge = Charge {
        sm: 10,
        ..Charge::default()
    };
    // `launches` launches, then wait until the job's totals (this run's and those
    // carried) read `total`.
    let run = |launches: u64, total: u64| {
        let slot = gate
            .join(std::process::id(), Class::Offline, 1.0)
            .expect("slot");
        for _ in 0..launches {
            gate.begin(slot, &charge);
            std::thread::sleep(Duration::from_millis(2));
            gate.end(slot, &charge, mmk_kernel_sched::monotonic_ns());
        }
        // The sampler reads the slot before the process leaves it.
        until_read(&sampler, total);
        gate.leave(slot);
    };
    sampler.watch(JOB, watch.clone());
    run(30, 30);
    sampler.unwatch(JOB, false);
    assert_eq!(sampler.totals()[&JOB].launches, 30, "kept while it waits");
    sampler.watch(JOB, watch);
    run(20, 50);
    sampler.unwatch(JOB, true);
    assert_eq!(sampler.totals()[&JOB].launches, 50, "both runs");
    sampler.stop();
    handle.join().expect("sampler");
}

/// Waits until job 7's latency passes `done`.
fn until_latency(sampler: &Sampler, what: &str, done: impl Fn(&Latency) -> bool) -> Latency {
    let began = Instant::now();
    loop {
        if let Some(l) = sampler.latencies().get(&JOB).filter(|l| done(l)) {
            return l.clone();
        }
        assert!(
            began.elapsed() < PATIENCE,
            "{what}: {:?}",
            sampler.latencies()
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn an_online_jobs_requests_are_its_busy_periods_and_alone_only_while_no_offline_process_is_there() {
    let dir = tempfile::tempdir().expect("tmp");
    let (path, gate) = mmk_gate(dir.path(), 0);
    let slot = gate
        .join(std::process::id(), Class::Online, 1.0)
        .expect("slot");
    let (sampler, _rx, handle) = Sampler::start_with(job_seven, None, Periods::default());
    sampler.watch(
        JOB,
        Watch {
            keep_tracked: true,
            ..test_watch(JobClass::Online, path, 108)
        },
    );
    let charge = Charge {
        sm: 98,
        ..Charge::default()
    };
    // 40 requests of 2 ms, each its own busy period.
    let request = || {
        gate.begin(slot, &charge);
        let t = mmk_kernel_sched::monotonic_ns();
        gate.end(slot, &charge, t + 2_000_000);
    };
    for _ in 0..40 {
        request();
    }
    let l = until_latency(&sampler, "40 requests read", |l| {
        mmk_kernel_sched::latency::count(&l.hist) == 40
    });
    assert_eq!(
        l.hist, l.alone,
        "nothing offline in the gate: every request alone"
    );
    assert!(!l.offline_beside);
    let p50 = mmk_kernel_sched::latency::quantile(&l.hist, 0.5).expect("a p50");
    assert!((2_000_000..2_400_000).contains(&p50), "{p50}");
    // Another process's offline slot (pid 1, alive): its requests are no longer alone.
    let beside = gate.join(1, Class::Offline, 1.0).expect("slot");
    until_latency(&sampler, "the offline process seen", |l| l.offline_beside);
    for _ in 0..10 {
        request();
    }
    let l = until_latency(&sampler, "10 more requests read", |l| {
        mmk_kernel_sched::latency::count(&l.hist) == 50
    });
    assert_eq!(mmk_kernel_sched::latency::count(&l.alone), 40);
    gate.leave(beside);
    // An online job under the SLO control stays tracked, learned or not.
    assert!(
        gate.slots()
            .iter()
            .any(|s| s.pid == std::process::id() && !s.untracked)
    );
    sampler.stop();
    handle.join().expect("sampler");
}
