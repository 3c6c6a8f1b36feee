//! mmkd's NVML backend on a real GPU with MIG off. Ignored elsewhere, since it needs the
//! GPU and its libnvidia-ml; lab/scripts/gpu/nvml-backend-check.sh runs it there:
//! `cargo test -p mmkd --release --test real_nvml --no-run` builds it, and the binary runs
//! with `--ignored`. It changes nothing: with MIG on it stops before any call that could.

use mmkd::backend::nvml::NvmlBackend;
use mmkd::backend::{BackendError, GpuBackend};
use mmkd::config::MigGpus;

#[test]
#[ignore = "needs a real GPU with MIG off: lab/scripts/gpu/nvml-backend-check.sh"]
fn on_a_gpu_with_mig_off_the_backend_reads_it_and_refuses_a_layout_change() {
    let backend = NvmlBackend::new(None, MigGpus::All, false).expect("NVML loads, with a GPU");
    let before = backend.gpus().expect("the GPUs read");
    assert!(!before.is_empty());
    for g in &before {
        assert!(
            !g.mig_enabled,
            "gpu {} has MIG on: this check is for MIG off, and stops here",
            g.index
        );
        let m = &g.model;
        assert!(m.sm_count > 0 && m.memory_mib > 0, "{g:?}");
        assert!(g.layout_fixed, "a GPU with MIG off never changes layout");
        // NVML lists the MIG profiles with MIG off too.
        assert!(!m.profiles.is_empty(), "{g:?}");
        println!(
            "gpu {} {:?} ({}, {} SMs, {} MiB, catalog key {:?}); profiles:",
            g.index, m.product_name, g.uuid, m.sm_count, m.memory_mib, m.key
        );
        for p in &m.profiles {
            println!(
                "  {:>2} {:<12} {} compute / {} memory slices, {} MiB, {} SMs, {} at most, starts {:?}",
                p.id,
                p.name,
                p.compute_slices,
                p.memory_slices,
                p.memory_mib,
                p.sm_count,
                p.max_count,
                p.starts
            );
        }
    }
    for g in &before {
        let smallest = g
            .model
            .profiles
            .iter()
            .min_by_key(|p| p.memory_slices)
            .expect("a profile");
        let start = smallest.starts.first().copied().unwrap_or(0);
        match backend.create_instance(g.index, smallest.id, start) {
            Err(e @ BackendError::MigDisabled { gpu }) if gpu == g.index => {
                println!("gpu {}: create {} at {start}: {e}", g.index, smallest.name);
            }
            other => panic!("gpu {}: create {}: {other:?}", g.index, smallest.name),
        }
        match backend.destroy_instance(g.index, 0) {
            Err(e @ BackendError::MigDisabled { gpu }) if gpu == g.index => {
                println!("gpu {}: destroy instance 0: {e}", g.index);
            }
            other => panic!("gpu {}: destroy: {other:?}", g.index),
        }
    }
    let after = backend.gpus().expect("the GPUs read again");
    assert_eq!(before, after, "nothing changed");
}
