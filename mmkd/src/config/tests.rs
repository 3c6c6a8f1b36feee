use super::*;

fn args(extra: &[&str]) -> Args {
    let mut v = vec!["mmkd"];
    v.extend_from_slice(extra);
    Args::try_parse_from(v).expect("flags parse")
}

#[test]
fn flags_override_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("mmkd.yaml");
    std::fs::write(
        &f,
        "backend: sim\nsim_gpus: h100-80gb:2\nsim_speed: 10\nstop_grace: 3s\n\
         kernel_offline_depth: 8\nkernel_base: 1500us\nkernel_gemm_slice: 8000\n\
         kernel_hold_budget: 25\n",
    )
    .expect("write");
    let c = Config::resolve(args(&[
        "--config",
        f.to_str().expect("utf-8"),
        "--sim-speed",
        "50",
    ]))
    .expect("valid");
    assert_eq!(c.backend, BackendChoice::Sim);
    assert_eq!(c.sim_gpus.len(), 2);
    assert_eq!(c.sim_speed, 50.0);
    assert_eq!(c.stop_grace, Duration::from_secs(3));
    assert_eq!(c.kernel_offline_depth, 8);
    assert_eq!(c.kernel_gemm_slice, 8000);
    assert_eq!(c.kernel_hold_budget, 25);
    assert_eq!(c.kernel_base, Some(Duration::from_micros(1500)));
    let c = Config::resolve(args(&[
        "--config",
        f.to_str().expect("utf-8"),
        "--kernel-offline-depth",
        "0",
        "--kernel-base",
        "3ms",
        "--kernel-gemm-slice",
        "2000",
    ]))
    .expect("valid");
    assert_eq!(c.kernel_offline_depth, 0, "the flag is over the file");
    assert_eq!(c.kernel_gemm_slice, 2000);
    assert_eq!(c.kernel_base, Some(Duration::from_millis(3)));
    let defaults = Config::resolve(args(&[])).expect("defaults");
    assert_eq!(
        (
            defaults.kernel_offline_depth,
            defaults.kernel_base,
            defaults.kernel_gemm_slice,
            defaults.kernel_hold_budget
        ),
        (0, None, 0, 0),
        "the gate holds nothing unless asked"
    );
    assert!(
        Args::try_parse_from(["mmkd", "--kernel-hold-budget", "101"]).is_err(),
        "not a percentage"
    );
    assert_eq!(defaults.offline_share_max, 100, "no cap unless asked");
    let c = Config::resolve(args(&["--offline-share-max", "80"])).expect("valid");
    assert_eq!(c.offline_share_max, 80);
    for bad in ["85", "0", "110"] {
        let err = Config::resolve(args(&["--offline-share-max", bad]))
            .expect_err("not a share mmk gives");
        assert!(
            err.to_string()
                .starts_with(&format!("offline_share_max: {bad}")),
            "{err}"
        );
    }
    std::fs::write(&f, "kernel_hold_budget: 150\n").expect("write");
    let err = Config::resolve(args(&["--config", f.to_str().expect("utf-8")]))
        .expect_err("not a percentage");
    assert!(
        err.to_string().starts_with("kernel_hold_budget: 150"),
        "{err}"
    );
}

#[test]
fn mig_gpus_are_all_by_default_or_the_listed_ones() {
    let c = Config::resolve(args(&[])).expect("defaults");
    assert_eq!(c.mig_gpus, MigGpus::All);
    assert!(!c.mig_take_over);
    let c = Config::resolve(args(&["--mig-gpus", "0,2", "--mig-take-over"])).expect("valid");
    assert!(c.mig_gpus.contains(2) && !c.mig_gpus.contains(1));
    assert!(c.mig_take_over);
    let none = Config::resolve(args(&["--mig-gpus", "none"])).expect("valid");
    assert!(!none.mig_gpus.contains(0));
    let err = Config::resolve(args(&["--mig-gpus", "0,x"])).expect_err("not an index");
    assert!(err.to_string().starts_with("mig_gpus: \"x\""), "{err}");
}

#[test]
fn the_device_wait_needs_gates_on_a_memory_file_system() {
    // The source tree, unless it is checked out on tmpfs.
    let disk = Path::new(env!("CARGO_MANIFEST_DIR")).join("target-not-made/gates");
    if on_memory_fs(&disk).is_ok() {
        return;
    }
    let err = Config::resolve(args(&[
        "--kernel-device-wait",
        "--kernel-gate-dir",
        disk.to_str().expect("utf-8"),
    ]))
    .expect_err("a disk directory");
    let text = err.to_string();
    assert!(
        text.contains("kernel_gate_dir") && text.contains("/dev/shm"),
        "{text}"
    );
    assert!(!disk.exists(), "nothing made");
    let off = Config::resolve(args(&["--kernel-gate-dir", disk.to_str().expect("utf-8")]))
        .expect("without the device wait any directory does");
    assert_eq!(off.kernel_device_wait, None);
    assert_eq!(off.kernel_gate_dir, disk);
    if Path::new("/dev/shm").is_dir() && on_memory_fs(Path::new("/dev/shm")).is_ok() {
        let c = Config::resolve(args(&[
            "--kernel-device-wait",
            "--kernel-device-wait-grain",
            "200us",
            "--kernel-gate-dir",
            "/dev/shm/mmk-config-test",
        ]))
        .expect("tmpfs");
        assert_eq!(c.kernel_device_wait, Some(Duration::from_micros(200)));
    }
    let err = Config::resolve(args(&[
        "--kernel-device-wait",
        "--kernel-device-wait-grain",
        "1h",
    ]))
    .expect_err("too long");
    assert!(
        err.to_string().contains("kernel_device_wait_grain"),
        "{err}"
    );
    let err = Config::resolve(args(&["--kernel-device-wait-grain", "200us"]))
        .expect_err("a grain without the device wait");
    assert!(
        err.to_string().contains("kernel_device_wait_grain")
            && err.to_string().contains("kernel_device_wait on"),
        "{err}"
    );
}

#[test]
fn mmk_plans_unless_told_otherwise() {
    let c = Config::resolve(args(&[])).expect("defaults");
    assert_eq!(c.planner, "mmk");
    let c = Config::resolve(args(&["--planner", "first-fit"])).expect("valid");
    assert_eq!(c.planner, "first-fit");
}

#[test]
fn bad_values_name_the_setting() {
    let e = Config::resolve(args(&["--sim-gpus", "v100:1"])).expect_err("unknown model");
    assert!(e.to_string().starts_with("sim_gpus:"), "{e}");
    let e = Config::resolve(args(&["--listen", "0.0.0.0:7000"])).expect_err("not loopback");
    assert!(e.to_string().starts_with("listen:"), "{e}");
    let e = Config::resolve(args(&["--sim-speed=-1"])).expect_err("negative");
    assert!(e.to_string().starts_with("sim_speed:"), "{e}");
    let e = Config::resolve(args(&["--mps-check-interval", "1ms"])).expect_err("too short");
    assert!(e.to_string().starts_with("mps_check_interval:"), "{e}");
    let e = Config::resolve(args(&["--kernel-base", "1s"])).expect_err("over the bound");
    assert_eq!(
        e.to_string(),
        "kernel_base: 1s is over 100ms, the gate's hard bound"
    );
    assert!(Args::try_parse_from(["mmkd", "--kernel-base", "0s"]).is_err());
    assert!(Args::try_parse_from(["mmkd", "--kernel-offline-depth", "-1"]).is_err());
    assert!(Args::try_parse_from(["mmkd", "--kernel-gemm-slice", "8e3"]).is_err());
    let e = Config::resolve(args(&["--capacity-unit", "0"])).expect_err("zero");
    assert!(e.to_string().starts_with("capacity_unit:"), "{e}");
    let e = Config::resolve(args(&["--capacity-unit", "ten"])).expect_err("not a size");
    assert!(e.to_string().starts_with("capacity_unit:"), "{e}");
    let dir = tempfile::tempdir().expect("tempdir");
    let f = dir.path().join("mmkd.yaml");
    std::fs::write(&f, "backend: sim\nsim_gpu: a\n").expect("write");
    let e =
        Config::resolve(args(&["--config", f.to_str().expect("utf-8")])).expect_err("unknown key");
    assert!(e.to_string().contains("sim_gpu"), "{e}");
}
