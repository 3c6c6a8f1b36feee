//! `mmkd`: the mmk node daemon. Everything lives in the `mmkd` library.

/// The planner allocates many small keys and vectors in every pass; mimalloc serves them
/// faster than the system allocator (docs/planner.md, "Planning latency").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mmkd::main()
}
