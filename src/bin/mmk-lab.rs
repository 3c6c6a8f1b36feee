//! `mmk-lab`: mmk's lab tools (measure, ksim). Everything lives in the `mmk-lab` library.

fn main() -> std::process::ExitCode {
    mmk_lab::main()
}
