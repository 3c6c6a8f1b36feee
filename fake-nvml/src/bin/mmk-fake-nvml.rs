//! The fake NVML node's inspector: makes the state file and reads or changes it as an
//! operator with NVIDIA's tools would.
//!
//! ```text
//! mmk-fake-nvml init STATE MODEL:COUNT[,MODEL:COUNT...] [--mig on|off]
//! mmk-fake-nvml show STATE               # GPU instances, like `nvidia-smi mig -lgi`
//! mmk-fake-nvml json STATE               # the whole state
//! mmk-fake-nvml create STATE GPU PROFILE START   # a GPU and compute instance (by profile name)
//! mmk-fake-nvml destroy STATE GPU ID
//! mmk-fake-nvml busy STATE GPU ID on|off # a process runs on the instance (IN_USE) or not
//! mmk-fake-nvml mig STATE GPU on|off     # MIG mode (refused while instances exist)
//! mmk-fake-nvml proc STATE GPU PID MIB [ID] # a process holds MIB of GPU memory (0: none),
//!                                        # on the whole GPU or in GPU instance ID
//! mmk-fake-nvml gpm STATE GPU PCT|off    # GPM: the DRAM bandwidth use (percent) the GPU
//!                                        # and its instances report, or no GPM
//! ```

use std::path::Path;
use std::process::ExitCode;

use mmk_fake_nvml::state::{self, Locked, Node};

/// `show`: the GPU instances, like `nvidia-smi mig -lgi`.
fn show(path: &Path) -> Result<(), String> {
    let locked = Locked::open(path).map_err(|e| e.to_string())?;
    println!("GPU  GI  PROFILE          ID  PLACEMENT  CI  BUSY");
    for (g, gpu) in locked.node.gpus.iter().enumerate() {
        if !gpu.mig {
            println!("{g:<4} MIG off");
            continue;
        }
        for i in &gpu.instances {
            let name = gpu.profile_of(i).map(|p| p.name).unwrap_or_default();
            println!(
                "{g:<4} {:<3} {name:<16} {:<3} {}:{:<8} {:<3} {}",
                i.id,
                i.profile_id,
                i.start,
                i.size,
                i.compute.map_or("-".to_owned(), |c| c.to_string()),
                if i.busy { "yes" } else { "no" }
            );
        }
    }
    Ok(())
}

fn run(args: &[String]) -> Result<(), String> {
    let usage = || {
        "usage: mmk-fake-nvml init|show|json|create|destroy|busy|mig|proc|gpm STATE ...".to_owned()
    };
    let (verb, path) = match args {
        [verb, path, ..] => (verb.as_str(), Path::new(path)),
        _ => return Err(usage()),
    };
    let rest = &args[2..];
    let num = |s: &String, what: &str| {
        s.parse::<u32>()
            .map_err(|_| format!("{what}: not a number: {s:?}"))
    };
    let on_off = |s: &String| match s.as_str() {
        "on" => Ok(true),
        "off" => Ok(false),
        other => Err(format!("on or off, not {other:?}")),
    };
    match verb {
        "init" => {
            let spec = rest.first().ok_or_else(usage)?;
            let mut gpus = Vec::new();
            for part in spec.split(',') {
                let (model, count) = part.split_once(':').unwrap_or((part, "1"));
                gpus.push((model.to_owned(), num(&count.to_owned(), "count")?));
            }
            let mig = match rest.get(1..) {
                Some([flag, v]) if flag == "--mig" => on_off(v)?,
                Some([]) | None => true,
                _ => return Err(usage()),
            };
            let node = Node::new(&gpus, mig).map_err(|e| e.to_string())?;
            state::create(path, &node).map_err(|e| e.to_string())
        }
        "show" => show(path),
        "json" => {
            let locked = Locked::open(path).map_err(|e| e.to_string())?;
            println!(
                "{}",
                serde_json::to_string(&locked.node).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        "create" => {
            let [g, profile, start] = rest else {
                return Err(usage());
            };
            let start = num(start, "start")?;
            let id = change_gpu(path, num(g, "gpu")?, |gpu| {
                let model = gpu.model().map_err(|e| format!("{e:?}"))?;
                let p = model
                    .profiles
                    .iter()
                    .find(|p| &p.name == profile)
                    .ok_or_else(|| format!("{} has no profile {profile:?}", model.key))?;
                let id = gpu
                    .create(p.id, start)
                    .map_err(|e| format!("create {profile} at {start}: {e:?}"))?
                    .id;
                gpu.instance_mut(id).map_err(|e| format!("{e:?}"))?.compute = Some(0);
                Ok(id)
            })?;
            println!("{id}");
            Ok(())
        }
        "destroy" => {
            let [g, id] = rest else {
                return Err(usage());
            };
            let id = num(id, "id")?;
            change_gpu(path, num(g, "gpu")?, |gpu| {
                let i = gpu
                    .instance_mut(id)
                    .map_err(|e| format!("instance {id}: {e:?}"))?;
                if i.busy {
                    return Err(format!("instance {id}: InUse"));
                }
                i.compute = None;
                gpu.destroy(id).map_err(|e| format!("instance {id}: {e:?}"))
            })
        }
        "busy" => {
            let [g, id, v] = rest else {
                return Err(usage());
            };
            let (id, busy) = (num(id, "id")?, on_off(v)?);
            change_gpu(path, num(g, "gpu")?, |gpu| {
                gpu.instance_mut(id)
                    .map_err(|e| format!("instance {id}: {e:?}"))?
                    .busy = busy;
                Ok(())
            })
        }
        "mig" => {
            let [g, v] = rest else {
                return Err(usage());
            };
            let on = on_off(v)?;
            change_gpu(path, num(g, "gpu")?, |gpu| {
                if !gpu.instances.is_empty() {
                    return Err(format!(
                        "gpu {g} has instances: MIG mode changes on an idle GPU only"
                    ));
                }
                gpu.mig = on;
                Ok(())
            })
        }
        "gpm" => {
            let [g, v] = rest else {
                return Err(usage());
            };
            let pct = match v.as_str() {
                "off" => None,
                v => Some(
                    v.parse::<f64>()
                        .ok()
                        .filter(|p| (0.0..=100.0).contains(p))
                        .ok_or_else(|| format!("a percentage or off, not {v:?}"))?,
                ),
            };
            change_gpu(path, num(g, "gpu")?, |gpu| {
                gpu.gpm_dram_bw_pct = pct;
                Ok(())
            })
        }
        "proc" => {
            let (g, pid, mib, instance) = match rest {
                [g, pid, mib] => (g, pid, mib, None),
                [g, pid, mib, id] => (g, pid, mib, Some(num(id, "id")?)),
                _ => return Err(usage()),
            };
            let pid = num(pid, "pid")?;
            let bytes = u64::from(num(mib, "MiB")?) * 1024 * 1024;
            change_gpu(path, num(g, "gpu")?, |gpu| {
                gpu.processes.retain(|p| p.pid != pid);
                if bytes > 0 {
                    gpu.processes.push(state::GpuProcess {
                        pid,
                        instance,
                        bytes,
                    });
                }
                Ok(())
            })
        }
        _ => Err(usage()),
    }
}

/// Changes GPU `g` of the state at `path` with `f`, and writes the state back when `f`
/// succeeds.
fn change_gpu<T>(
    path: &Path,
    g: u32,
    f: impl FnOnce(&mut state::Gpu) -> Result<T, String>,
) -> Result<T, String> {
    let mut locked = Locked::open(path).map_err(|e| e.to_string())?;
    let gpu = locked
        .node
        .gpus
        .get_mut(g as usize)
        .ok_or_else(|| format!("no gpu {g}"))?;
    let out = f(gpu)?;
    locked.save().map_err(|e| e.to_string())?;
    Ok(out)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mmk-fake-nvml: {e}");
            ExitCode::from(2)
        }
    }
}
