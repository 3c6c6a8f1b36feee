//! `mmkctl`: the mmk command-line client. Everything lives in the `mmkctl` library.

fn main() -> std::process::ExitCode {
    mmkctl::main()
}
