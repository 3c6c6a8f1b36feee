//! mmkd, the mmk node daemon: a gRPC control plane over a node store, a GPU backend
//! (NVML or the simulated node), a planner and a job runner.
//!
//! `main` parses flags and calls [`server::run`]; see docs/mmkd.md.

pub mod asuser;
pub mod auth;
pub mod backend;
pub mod cgroup;
pub mod config;
pub mod disk;
pub mod error;
pub mod grpc;
pub mod job;
pub mod joblog;
pub mod k8s;
pub mod ksched;
pub mod learn;
pub mod metrics;
pub mod mps;
pub mod node;
pub mod os;
pub mod runner;
pub mod server;
pub mod slo;
pub mod store;
pub mod tcp;

use std::process::ExitCode;

use clap::Parser;

/// The whole `mmkd` program: flags, logging, runtime, run until SIGINT/SIGTERM.
/// What the `mmkd` binary carries in itself.
#[derive(Debug, Clone, Copy, Default)]
pub struct Carried {
    /// The kernel scheduler's interposer (`libmmk_interposer.so`), built with mmkd: used
    /// when none is installed beside mmkd ([`ksched::carried_interposer`]).
    pub interposer: Option<&'static [u8]>,
}

pub fn main_with(carried: Carried) -> ExitCode {
    // `mmkd fake-mps-control ...` is the fake MPS control program (--mps fake): always at
    // hand, since it is mmkd itself.
    let mut argv = std::env::args_os();
    if argv.nth(1).is_some_and(|a| a == mps::FAKE_MPS_ARG) {
        return mmk_mps_control::fake::main(argv.collect(), &[mps::FAKE_MPS_ARG.into()]);
    }
    let args = config::Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = match config::Config::resolve(args) {
        Ok(c) => config::Config { carried, ..c },
        Err(e) => {
            eprintln!("mmkd: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mmkd: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async {
        let shutdown = shutdown_signal()
            .map_err(|e| anyhow::anyhow!("cannot install signal handlers: {e}"))?;
        server::run(config, shutdown).await
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mmkd: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Installs the SIGINT and SIGTERM handlers now (before mmkd says it listens), and returns
/// a future that resolves on either signal.
fn shutdown_signal() -> std::io::Result<impl std::future::Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut int = signal(SignalKind::interrupt())?;
    let mut term = signal(SignalKind::terminate())?;
    Ok(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
    })
}
