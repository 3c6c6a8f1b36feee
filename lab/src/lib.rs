//! mmk's lab tools: what measures rather than serves, apart from the product (`mmkd`,
//! `mmkctl`), which depends on none of it (lab/README.md):
//!
//! - [`simulate`]: replays a job trace through mmk's planners and the baselines
//!   (docs/simulate.md);
//! - [`predictor`]: makes a dataset, trains, evaluates and explains performance models
//!   (docs/predictor.md);
//! - [`measure`]: runs workloads on this machine's GPU under MPS shares, alone and in
//!   pairs, with NVML GPM metrics, for the predictor's dataset (docs/measure.md);
//! - [`profile`]: runs a command job alone under the interposer in record mode and writes
//!   its kernel profile for the `orion` and `fikit` kernel policies;
//! - [`ksim`]: replays recorded kernel traces on the kernel-level simulator under each
//!   kernel policy (docs/kernel-sched.md).
//!
//! The `mmk-lab` program is [`main`]. None of it needs mmkd.

#[macro_use]
extern crate mmk_cli;

pub mod ksim;
pub mod measure;
pub mod predictor;
pub mod profile;
pub mod simulate;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use mmk_cli::{Failure, Format};

/// mmk-lab: simulate the planners, build performance models, measure workloads on a GPU,
/// profile and replay kernel traces.
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
    /// Replay a job trace through the planners and the baselines (docs/simulate.md).
    Simulate(simulate::SimulateArgs),
    /// Make, train, evaluate and explain performance models (docs/predictor.md).
    Predictor {
        #[command(subcommand)]
        command: predictor::PredictorCommand,
    },
    /// Run a command job alone under the interposer and write its kernel profile, for the
    /// orion and fikit kernel policies (docs/kernel-sched.md).
    Profile(profile::ProfileArgs),
    /// Measure workloads on this GPU under MPS shares, alone and in pairs, for the
    /// predictor's dataset (docs/measure.md).
    Measure(measure::MeasureArgs),
    /// Replay recorded kernel traces of several jobs on a simulated GPU under each kernel
    /// policy (no GPU needed; docs/kernel-sched.md).
    Ksim(ksim::KsimArgs),
}

fn run(lab: Lab) -> Result<(), Failure> {
    match lab.command {
        LabCommand::Simulate(args) => simulate::run(lab.output, args),
        LabCommand::Predictor { command } => predictor::run(lab.output, command),
        LabCommand::Profile(args) => profile::run(lab.output, args),
        LabCommand::Measure(args) => measure::run(lab.output, args),
        LabCommand::Ksim(args) => ksim::run(lab.output, args),
    }
}

/// Writes `v` as pretty JSON to standard output.
fn print_json<T: serde::Serialize>(v: &T) {
    match serde_json::to_string_pretty(v) {
        Ok(s) => outln!("{s}"),
        Err(e) => eprintln!("mmk-lab: cannot encode JSON: {e}"),
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
