//! `mmkd`: the mmk node daemon. Everything lives in the `mmkd` library.

fn main() -> std::process::ExitCode {
    mmkd::main()
}
