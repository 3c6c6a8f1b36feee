//! `mmkd`: the mmk node daemon. Everything lives in the `mmkd` library.

/// The planner allocates many small keys and vectors in every pass; mimalloc serves them
/// faster than the system allocator (docs/planner.md, "Planning latency").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The kernel scheduler's interposer, built with mmkd (build.rs).
static INTERPOSER: &[u8] = mmk_carry::carried_interposer!();

fn main() -> std::process::ExitCode {
    mmkd::main_with(mmkd::Carried {
        interposer: (!INTERPOSER.is_empty()).then_some(INTERPOSER),
    })
}
