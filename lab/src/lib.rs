//! mmk's lab tools, apart from the user's client (`mmkctl`):
//!
//! - [`measure`]: runs workloads on this machine's GPU under MPS shares, alone and in
//!   pairs, with NVML GPM metrics, for the predictor's dataset (docs/measure.md);
//! - [`profile`]: runs a command job alone under the interposer in record mode and writes
//!   its kernel profile for the `orion` and `fikit` kernel policies (`mmkctl profile`
//!   calls it: it is a user command);
//! - [`ksim`]: replays recorded kernel traces on the kernel-level simulator under each
//!   kernel policy (docs/kernel-sched.md).
//!
//! The `mmk-lab` program (`mmk-lab measure`, `mmk-lab ksim`) is [`main`]. None of it
//! needs mmkd.

#[macro_use]
extern crate mmk_cli;

pub mod ksim;
pub mod measure;
pub mod profile;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mmk_cli::{Failure, Format};

/// mmk-lab: measure workloads on a GPU for the predictor, and replay kernel traces.
#[derive(Debug, Parser)]
#[command(name = "mmk-lab", version, about, long_about = None)]
pub struct Lab {
    /// Output format: a table for people, or JSON for scripts.
    #[arg(long, global = true, value_enum, default_value_t = Format::Table)]
    pub output: Format,
    #[command(subcommand)]
    pub command: LabCommand,
}

#[derive(Debug, Subcommand)]
pub enum LabCommand {
    /// Measure workloads on this GPU under MPS shares, alone and in pairs, for the
    /// predictor's dataset (docs/measure.md).
    Measure(measure::MeasureArgs),
    /// Replay recorded kernel traces of several jobs on a simulated GPU under each kernel
    /// policy (no GPU needed; docs/kernel-sched.md).
    Ksim(ksim::KsimArgs),
}

fn run(lab: Lab) -> Result<(), Failure> {
    match lab.command {
        LabCommand::Measure(args) => measure::run(lab.output, args),
        LabCommand::Ksim(args) => ksim::run(lab.output, args),
    }
}

/// The whole `mmk-lab` program.
pub fn main() -> ExitCode {
    match run(Lab::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mmk-lab: {}", e.message);
            ExitCode::from(e.exit_code)
        }
    }
}
