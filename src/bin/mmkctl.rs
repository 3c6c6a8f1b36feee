//! `mmkctl`: the mmk command-line client. Everything lives in the `mmkctl` library.

/// The planner and the simulator allocate many small keys and vectors; mimalloc serves
/// them faster than the system allocator (docs/planner.md, "Planning latency").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mmkctl::main()
}
