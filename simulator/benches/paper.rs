//! The paper's simulation setup on this machine: 800 online + 400 offline jobs on 8
//! A100-80GB GPUs, every policy, wall time per policy. `cargo bench -p mmk-simulator`.

fn main() {}
