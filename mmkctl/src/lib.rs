//! mmkctl, the mmk command-line client. `main` parses flags and calls [`run`]; each
//! command is a gRPC call and a rendering of its answer (docs/mmkctl.md).
//!
//! Exit codes: 0 ok; 1 not found; 2 usage, input or server error. `run` exits with its
//! command's code; `fit` with 3 (would wait) or 4 (never fits). Output into a pipe that
//! closed early (`mmkctl jobs | head`) ends mmkctl quietly with 141, as a shell reports a
//! tool that SIGPIPE ended.

//!
//! What it shares with `mmk-lab`, the lab's program (the failure type, `--output`, standard
//! output, capped input, job files), is the `mmk-cli` crate; it links nothing of the lab.

#[macro_use]
extern crate mmk_cli;

mod attach;
mod cli;
pub mod client;
mod export;
mod output;
mod picture;
mod top;

use std::process::ExitCode;

use clap::Parser;

pub use cli::Cli;

/// The whole `mmkctl` program.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mmkctl: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(cli::run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("mmkctl: {}", e.message);
            ExitCode::from(e.exit_code)
        }
    }
}
