//! `mmk-lab`: mmk's lab tools. Everything lives in the `mmk-lab` library.

/// The planner and the simulator allocate many small keys and vectors; mimalloc serves
/// them faster than the system allocator (docs/planner.md, "Planning latency").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    mmk_lab::main()
}
