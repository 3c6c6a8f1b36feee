//! The fake MPS control program; see `mmk_mps_control::fake`.

fn main() -> std::process::ExitCode {
    mmk_mps_control::fake::main(std::env::args_os().skip(1).collect(), &[])
}
