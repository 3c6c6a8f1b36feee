//! `mmk-gate`: make or inspect a partition's gate by hand (mmkd makes them for the jobs it
//! runs; this is for running jobs under the kernel scheduler without mmkd, and for looking).
//!
//! ```text
//! mmk-gate create PATH [--sms N] [--policy passthrough|mmk|orion|fikit] [--base-us U] [--max-hold-ms M] [--offline-depth K] [--gemm-slice-mflop F] [--device-wait on|off] [--device-wait-grain-us G] [--hold-budget-pct P]
//! mmk-gate show PATH
//! ```
//!
//! `--gemm-slice-mflop F`: offline jobs' cuBLAS GEMMs of more than F million
//! floating-point operations are cut into pieces of at most F (`mmk_kernel_sched::slice`).
//!
//! `--device-wait on`: offline launches also wait on the GPU for online work to finish
//! (`GateConfig::device_wait`); PATH must then be on a memory file system (`/dev/shm`).
//! `--device-wait-grain-us G`: a wait only once G us of expected offline work have been
//! launched since the last one (`GateConfig::device_wait_grain_us`; 0, the default: before
//! every launch).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use mmk_kernel_sched::{Gate, GateConfig, PolicyKind};

const USAGE: &str = "usage: mmk-gate create PATH [--sms N] [--policy passthrough|mmk|orion|fikit] [--base-us U] [--max-hold-ms M] [--offline-depth K] [--gemm-slice-mflop F] [--device-wait on|off] [--device-wait-grain-us G] [--hold-budget-pct P]\n       mmk-gate show PATH";

fn run() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (Some(verb), Some(path)) = (args.next(), args.next()) else {
        return Err(USAGE.into());
    };
    let path = PathBuf::from(path);
    match verb.as_str() {
        "create" => {
            let mut config = GateConfig::new(132, PolicyKind::Mmk);
            while let Some(flag) = args.next() {
                let value = args.next().ok_or_else(|| format!("{flag} needs a value"))?;
                let num = || {
                    value
                        .parse::<u64>()
                        .map_err(|_| format!("{flag}: not a number: {value:?}"))
                };
                match flag.as_str() {
                    "--sms" => {
                        config.sm_count =
                            u32::try_from(num()?).map_err(|_| "--sms: too large".to_owned())?
                    }
                    "--policy" => {
                        config.policy = value.parse().map_err(|e| format!("--policy: {e}"))?
                    }
                    "--base-us" => config.base = Duration::from_micros(num()?),
                    "--max-hold-ms" => config.max_hold = Duration::from_millis(num()?),
                    "--offline-depth" => {
                        config.offline_depth = u32::try_from(num()?)
                            .map_err(|_| "--offline-depth: too large".to_owned())?
                    }
                    "--gemm-slice-mflop" => {
                        config.gemm_slice_mflop = u32::try_from(num()?)
                            .map_err(|_| "--gemm-slice-mflop: too large".to_owned())?
                    }
                    "--device-wait" => {
                        config.device_wait = match value.as_str() {
                            "on" => true,
                            "off" => false,
                            _ => {
                                return Err(format!("--device-wait: on or off, not {value:?}"));
                            }
                        }
                    }
                    "--device-wait-grain-us" => {
                        config.device_wait_grain_us = u32::try_from(num()?)
                            .map_err(|_| "--device-wait-grain-us: too large".to_owned())?
                    }
                    "--hold-budget-pct" => {
                        config.hold_budget_pct = u32::try_from(num()?)
                            .ok()
                            .filter(|p| *p <= 100)
                            .ok_or_else(|| "--hold-budget-pct: 0 to 100".to_owned())?
                    }
                    other => return Err(format!("unknown flag {other}\n{USAGE}")),
                }
            }
            Gate::create(&path, &config).map_err(|e| e.to_string())?;
            Ok(())
        }
        "show" => {
            let gate = Gate::open(&path).map_err(|e| e.to_string())?;
            let c = gate.config();
            let t = gate.totals();
            println!(
                "{{\"sm_count\":{},\"policy\":\"{}\",\"base_us\":{},\"max_hold_ms\":{},\"offline_depth\":{},\"gemm_slice_mflop\":{},\"device_wait\":{},\"device_wait_grain_us\":{},\"hold_budget_pct\":{},\"device_word\":{{\"online\":{},\"passes\":{}}},\"launches\":{},\"held\":{},\"held_ns\":{},\"forced\":{},\"processes\":{}}}",
                c.sm_count,
                c.policy,
                c.base.as_micros(),
                c.max_hold.as_millis(),
                c.offline_depth,
                c.gemm_slice_mflop,
                c.device_wait,
                c.device_wait_grain_us,
                c.hold_budget_pct,
                gate.device_word().online(),
                gate.device_word().passes(),
                t.launches,
                t.held,
                t.held_ns,
                t.forced,
                gate.slots().len()
            );
            Ok(())
        }
        _ => Err(USAGE.into()),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mmk-gate: {e}");
            ExitCode::from(2)
        }
    }
}
