//! The simulated node: GPUs from the MIG catalog that behave like the driver.
//!
//! Like real MIG instances, which outlive the daemon that made them (not a reboot), the
//! simulated node keeps its instances in a state file of its own (`sim-node.json` in the
//! data dir), written after every change. mmkd's store is only mmkd's record of them: a
//! crash between a change and its record leaves the two apart, and mmkd reconciles them
//! at start, as it must with real hardware.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use mmk_partitioner::{GpuModel, GpuState, Instance, Placement, catalog, layout};
use serde::{Deserialize, Serialize};

use super::{BackendError, GpuBackend, Result};

/// How long the simulated driver takes to create and destroy an instance, before
/// `--sim-speed` scaling. Real MIG reconfiguration takes a fraction of a second to seconds.
pub const CREATE_LATENCY: Duration = Duration::from_millis(400);
pub const DESTROY_LATENCY: Duration = Duration::from_millis(200);

#[derive(Debug)]
struct SimGpu {
    index: u32,
    uuid: String,
    model: GpuModel,
    mig_enabled: bool,
    instances: BTreeMap<u32, Instance>,
    /// Processes per instance.
    users: BTreeMap<u32, u32>,
    next_id: u32,
}

#[derive(Debug)]
pub struct SimBackend {
    gpus: Mutex<Vec<SimGpu>>,
    create_latency: Duration,
    destroy_latency: Duration,
    /// Where the node's instances are kept between runs; `None`: in memory only.
    state_file: Option<PathBuf>,
    /// Creations left before the injected crash ([`ABORT_AFTER_CREATES_ENV`]).
    abort_after: Mutex<Option<u32>>,
}

/// The state file's format.
#[derive(Debug, Serialize, Deserialize)]
struct SavedNode {
    version: u32,
    gpus: Vec<SavedGpu>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedGpu {
    model: String,
    next_id: u32,
    instances: Vec<SavedInstance>,
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedInstance {
    id: u32,
    profile_id: u32,
    start: u8,
    size: u8,
    uuid: String,
}

const STATE_VERSION: u32 = 1;

/// Fault injection for crash tests: with `MMK_SIM_ABORT_AFTER_CREATES=N` the simulated
/// driver aborts the whole process right after its N-th instance creation is saved, the
/// way a crash lands between a change on the GPU and mmkd's record of it.
pub const ABORT_AFTER_CREATES_ENV: &str = "MMK_SIM_ABORT_AFTER_CREATES";

/// A `--sim-gpus` value mmkd cannot use.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SimGpusError {
    #[error("{part:?}: the count must be 1..=64")]
    Count { part: String },
    #[error("unknown GPU model {key:?}; known: {known}")]
    Model { key: String, known: String },
    #[error("no GPUs given; write MODEL:N like a100-80gb:1")]
    Empty,
    #[error("{0} GPUs; a node has at most 64")]
    TooMany(usize),
}

/// Parses `--sim-gpus`: `MODEL:N[,MODEL:N]` (`a100-80gb:2,h100-80gb:1`); `:N` may be left
/// out for one GPU.
pub fn parse_sim_gpus(text: &str) -> std::result::Result<Vec<GpuModel>, SimGpusError> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, count) = match part.split_once(':') {
            Some((k, n)) => (
                k,
                n.parse::<u32>()
                    .ok()
                    .filter(|n| (1..=64).contains(n))
                    .ok_or_else(|| SimGpusError::Count {
                        part: part.to_owned(),
                    })?,
            ),
            None => (part, 1),
        };
        let model = catalog::model(key).ok_or_else(|| SimGpusError::Model {
            key: key.to_owned(),
            known: catalog::keys().join(", "),
        })?;
        out.extend(std::iter::repeat_n(model, count as usize));
    }
    if out.is_empty() {
        return Err(SimGpusError::Empty);
    }
    if out.len() > 64 {
        return Err(SimGpusError::TooMany(out.len()));
    }
    Ok(out)
}

/// The stable UUID of simulated GPU `index` (the same across restarts, so that the
/// recorded layout maps back onto it).
pub fn sim_gpu_uuid(index: u32) -> String {
    format!("GPU-5e1a0000-0000-4000-8000-{index:012x}")
}

fn sim_instance_uuid(gpu: u32, start: u8, id: u32) -> String {
    format!("MIG-5e1a{gpu:04x}-{start:04x}-4000-8000-{id:012x}")
}

impl SimBackend {
    /// A node of `models` with MIG on. With a `state_file`, the instances saved there
    /// come back (when the file describes the same GPUs; otherwise the node starts empty,
    /// as after a reboot) and every change is saved.
    pub fn new(models: Vec<GpuModel>, state_file: Option<PathBuf>, speed: f64) -> SimBackend {
        let mut gpus: Vec<SimGpu> = models
            .into_iter()
            .enumerate()
            .map(|(i, model)| SimGpu {
                index: i as u32,
                uuid: sim_gpu_uuid(i as u32),
                model,
                mig_enabled: true,
                instances: BTreeMap::new(),
                users: BTreeMap::new(),
                next_id: 1,
            })
            .collect();
        if let Some(saved) = state_file.as_ref().and_then(|p| load(p)) {
            let same = saved.gpus.len() == gpus.len()
                && saved
                    .gpus
                    .iter()
                    .zip(&gpus)
                    .all(|(s, g)| s.model == g.model.key);
            if same {
                for (s, g) in saved.gpus.into_iter().zip(gpus.iter_mut()) {
                    restore(g, s);
                }
            } else {
                tracing::warn!(
                    "the simulated node's saved state describes other gpus; starting empty"
                );
            }
        }
        let speed = if speed.is_finite() && speed > 0.0 {
            speed
        } else {
            1.0
        };
        SimBackend {
            gpus: Mutex::new(gpus),
            create_latency: CREATE_LATENCY.div_f64(speed),
            destroy_latency: DESTROY_LATENCY.div_f64(speed),
            state_file,
            abort_after: Mutex::new(
                std::env::var(ABORT_AFTER_CREATES_ENV)
                    .ok()
                    .and_then(|v| v.parse().ok()),
            ),
        }
    }

    fn with_gpu<T>(&self, gpu: u32, f: impl FnOnce(&mut SimGpu) -> Result<T>) -> Result<T> {
        let mut gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
        let g = gpus
            .get_mut(gpu as usize)
            .ok_or(BackendError::NoSuchGpu { gpu })?;
        let out = f(g)?;
        self.save(&gpus);
        Ok(out)
    }

    /// Writes the node's instances (a temporary file renamed over the old one).
    fn save(&self, gpus: &[SimGpu]) {
        let Some(path) = &self.state_file else {
            return;
        };
        let saved = SavedNode {
            version: STATE_VERSION,
            gpus: gpus
                .iter()
                .map(|g| SavedGpu {
                    model: g.model.key.clone(),
                    next_id: g.next_id,
                    instances: g
                        .instances
                        .values()
                        .map(|i| SavedInstance {
                            id: i.id,
                            profile_id: i.profile_id,
                            start: i.placement.start,
                            size: i.placement.size,
                            uuid: i.uuid.clone(),
                        })
                        .collect(),
                })
                .collect(),
        };
        let tmp = path.with_extension("json.tmp");
        let written = serde_json::to_vec_pretty(&saved)
            .map_err(std::io::Error::other)
            .and_then(|bytes| std::fs::write(&tmp, bytes))
            .and_then(|()| std::fs::rename(&tmp, path));
        if let Err(e) = written {
            tracing::warn!(path = %path.display(), error = %e, "cannot save the simulated node's state");
        }
    }
}

fn load(path: &std::path::Path) -> Option<SavedNode> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice::<SavedNode>(&bytes) {
        Ok(n) if n.version == STATE_VERSION => Some(n),
        Ok(n) => {
            tracing::warn!(
                version = n.version,
                "unknown simulated node state version; starting empty"
            );
            None
        }
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "unreadable simulated node state; starting empty");
            None
        }
    }
}

/// Puts saved instances back on a GPU, keeping only those that form a valid layout.
fn restore(g: &mut SimGpu, saved: SavedGpu) {
    for s in saved.instances {
        let mut l: Vec<(u32, u8)> = g
            .instances
            .values()
            .map(|i| (i.profile_id, i.placement.start))
            .collect();
        l.push((s.profile_id, s.start));
        if !layout::fits(&g.model, &l) {
            tracing::warn!(
                gpu = g.index,
                start = s.start,
                "saved instance does not fit the gpu; dropped"
            );
            continue;
        }
        g.next_id = g.next_id.max(s.id.saturating_add(1));
        g.instances.insert(
            s.id,
            Instance {
                id: s.id,
                profile_id: s.profile_id,
                placement: Placement {
                    start: s.start,
                    size: s.size,
                },
                uuid: s.uuid,
            },
        );
    }
    g.next_id = g.next_id.max(saved.next_id);
}

impl GpuBackend for SimBackend {
    fn kind(&self) -> &'static str {
        "sim"
    }

    fn gpus(&self) -> Result<Vec<GpuState>> {
        let gpus = self.gpus.lock().unwrap_or_else(|p| p.into_inner());
        Ok(gpus
            .iter()
            .map(|g| GpuState {
                index: g.index,
                uuid: g.uuid.clone(),
                model: g.model.clone(),
                mig_enabled: g.mig_enabled,
                layout_fixed: false,
                instances: g.instances.values().cloned().collect(),
            })
            .collect())
    }

    fn create_instance(&self, gpu: u32, profile_id: u32, start: u8) -> Result<Instance> {
        std::thread::sleep(self.create_latency);
        let created = self.with_gpu(gpu, |g| {
            if !g.mig_enabled {
                return Err(BackendError::MigDisabled { gpu });
            }
            let mut layout: Vec<(u32, u8)> = g
                .instances
                .values()
                .map(|i| (i.profile_id, i.placement.start))
                .collect();
            layout.push((profile_id, start));
            layout::validate(&g.model, &layout).map_err(|e| BackendError::InvalidPlacement {
                gpu,
                profile: profile_id,
                start,
                why: e.to_string(),
            })?;
            let size = g.model.profile(profile_id).map_or(0, |p| p.memory_slices);
            let id = g.next_id;
            g.next_id += 1;
            let inst = Instance {
                id,
                profile_id,
                placement: Placement { start, size },
                uuid: sim_instance_uuid(gpu, start, id),
            };
            g.instances.insert(id, inst.clone());
            Ok(inst)
        })?;
        let mut left = self.abort_after.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = left.as_mut() {
            *n = n.saturating_sub(1);
            if *n == 0 {
                tracing::error!("{ABORT_AFTER_CREATES_ENV}: aborting after an instance creation");
                std::process::abort();
            }
        }
        Ok(created)
    }

    fn destroy_instance(&self, gpu: u32, instance: u32) -> Result<()> {
        std::thread::sleep(self.destroy_latency);
        self.with_gpu(gpu, |g| {
            if !g.instances.contains_key(&instance) {
                return Err(BackendError::NoSuchInstance { gpu, instance });
            }
            if g.users.get(&instance).copied().unwrap_or(0) > 0 {
                return Err(BackendError::InUse { gpu, instance });
            }
            g.instances.remove(&instance);
            Ok(())
        })
    }

    fn set_in_use(&self, gpu: u32, instance: u32, in_use: bool) {
        let _ = self.with_gpu(gpu, |g| {
            let n = g.users.entry(instance).or_insert(0);
            *n = if in_use { *n + 1 } else { n.saturating_sub(1) };
            Ok(())
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(spec: &str) -> SimBackend {
        SimBackend::new(parse_sim_gpus(spec).expect("valid"), None, 1e6)
    }

    #[test]
    fn parses_gpu_lists() {
        let m = parse_sim_gpus("a100-80gb:2, h100-80gb").expect("valid");
        let keys: Vec<_> = m.iter().map(|g| g.key.as_str()).collect();
        assert_eq!(keys, ["a100-80gb", "a100-80gb", "h100-80gb"]);
        assert!(matches!(
            parse_sim_gpus("v100:1"),
            Err(SimGpusError::Model { key, .. }) if key == "v100"
        ));
        assert_eq!(
            parse_sim_gpus("a100-80gb:0").unwrap_err().to_string(),
            "\"a100-80gb:0\": the count must be 1..=64"
        );
        assert_eq!(parse_sim_gpus(""), Err(SimGpusError::Empty));
        assert_eq!(
            parse_sim_gpus("a100-80gb:64,a30-24gb:1"),
            Err(SimGpusError::TooMany(65))
        );
    }

    #[test]
    fn creates_and_destroys_with_driver_rules() {
        let b = node("a100-80gb:1");
        let three = b.create_instance(0, 9, 4).expect("3g at 4");
        assert_eq!(three.placement, Placement { start: 4, size: 4 });
        assert!(three.uuid.starts_with("MIG-"));
        let err = b.create_instance(0, 0, 0).expect_err("7g overlaps");
        assert!(
            matches!(err, BackendError::InvalidPlacement { .. }),
            "{err}"
        );
        b.set_in_use(0, three.id, true);
        assert!(matches!(
            b.destroy_instance(0, three.id),
            Err(BackendError::InUse { .. })
        ));
        b.set_in_use(0, three.id, false);
        b.destroy_instance(0, three.id).expect("idle instance");
        assert!(matches!(
            b.destroy_instance(0, three.id),
            Err(BackendError::NoSuchInstance { .. })
        ));
        assert!(matches!(
            b.create_instance(5, 9, 0),
            Err(BackendError::NoSuchGpu { gpu: 5 })
        ));
    }

    #[test]
    fn the_node_keeps_its_instances_across_runs() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("sim-node.json");
        let models = parse_sim_gpus("a100-80gb").expect("valid");
        let b = SimBackend::new(models.clone(), Some(file.clone()), 1e6);
        let first = b.create_instance(0, 9, 0).expect("3g");
        drop(b);
        let b = SimBackend::new(models, Some(file.clone()), 1e6);
        assert_eq!(b.gpus().expect("gpus")[0].instances, vec![first.clone()]);
        let next = b.create_instance(0, 9, 4).expect("second 3g");
        assert!(next.id > first.id, "ids stay unique");
        // Other GPUs than the file describes: a fresh node.
        let b = SimBackend::new(
            parse_sim_gpus("h100-80gb").expect("valid"),
            Some(file.clone()),
            1e6,
        );
        assert!(b.gpus().expect("gpus")[0].instances.is_empty());
        // A damaged file: a fresh node, not a crash.
        std::fs::write(&file, "{not json").expect("write");
        let b = SimBackend::new(parse_sim_gpus("a100-80gb").expect("valid"), Some(file), 1e6);
        assert!(b.gpus().expect("gpus")[0].instances.is_empty());
    }
}
