//! The fake node's state: GPUs of the MIG catalog, each with its MIG mode and instances,
//! kept as JSON in one file that every process using the fake (mmkd through the library,
//! the `mmk-fake-nvml` inspector) reads and writes under an exclusive `flock`.
//!
//! The rules are the driver's, from the catalog: a GPU instance goes only at one of its
//! profile's start slots, on memory slices no other instance holds, within the GPU's
//! compute slices and its profile's count, one `+me` instance per GPU
//! (`mmk_partitioner::layout::validate`); a GPU instance with a compute instance or a
//! process on it cannot be destroyed, nor can a compute instance a process uses (`IN_USE`);
//! nothing changes while MIG mode is off.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::path::Path;

use mmk_partitioner::{GpuModel, Profile, catalog, layout};
use serde::{Deserialize, Serialize};

/// The environment variable naming the state file.
pub const STATE_ENV: &str = "MMK_FAKE_NVML_STATE";
/// The library aborts the process after this many GPU instance creations (for crash tests).
pub const ABORT_AFTER_CREATES_ENV: &str = "MMK_FAKE_NVML_ABORT_AFTER_CREATES";

/// Why the state file could not be made, read or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{path}: {op}")]
    Io {
        path: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: not a fake NVML state")]
    Parse {
        path: String,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "unknown GPU model {0:?} (models: a100-40gb, a100-80gb, h100-80gb, h100-94gb, h200-141gb, a30-24gb)"
    )]
    UnknownModel(String),
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> StateError + 'a {
    move |source| StateError::Io {
        path: path.display().to_string(),
        op,
        source,
    }
}

/// Why an operation was refused, as NVML would say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    InvalidArgument,
    NotSupported,
    NotFound,
    InUse,
    InsufficientResources,
    Unknown,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Node {
    pub gpus: Vec<Gpu>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Gpu {
    /// The catalog key (`a100-80gb`).
    pub model: String,
    pub uuid: String,
    pub mig: bool,
    /// Instances made so far: part of each MIG device's UUID, so a new one never reuses an
    /// old one's.
    pub serial: u32,
    pub instances: Vec<GpuInstance>,
    /// Processes with GPU memory (the inspector's `proc`).
    #[serde(default)]
    pub processes: Vec<GpuProcess>,
    /// GPM: the DRAM bandwidth use (percent) that the GPU and each of its GPU instances
    /// report between two samples (the inspector's `gpm`); `None`: no GPM on this GPU.
    #[serde(default)]
    pub gpm_dram_bw_pct: Option<f64>,
}

/// A process that holds GPU memory: on the whole GPU, or in GPU instance `instance`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuProcess {
    pub pid: u32,
    pub instance: Option<u32>,
    pub bytes: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct GpuInstance {
    pub id: u32,
    pub profile_id: u32,
    pub start: u8,
    pub size: u8,
    /// Its compute instance's ID (spanning the GPU instance), if one exists.
    pub compute: Option<u32>,
    /// A process runs on it (the inspector's `busy`): destroying it is `IN_USE`.
    pub busy: bool,
    pub uuid: String,
}

impl Gpu {
    pub fn model(&self) -> Result<GpuModel, Refused> {
        catalog::models()
            .into_iter()
            .find(|m| m.key == self.model)
            .ok_or(Refused::Unknown)
    }

    /// Creates a GPU instance of `profile_id` at memory slice `start`, with the lowest
    /// free ID (so an ID comes back once its instance is gone, as on the driver).
    pub fn create(&mut self, profile_id: u32, start: u32) -> Result<&GpuInstance, Refused> {
        if !self.mig {
            return Err(Refused::NotSupported);
        }
        let model = self.model()?;
        let profile = model.profile(profile_id).ok_or(Refused::InvalidArgument)?;
        let start = u8::try_from(start).map_err(|_| Refused::InvalidArgument)?;
        if !profile.starts.contains(&start) {
            return Err(Refused::InvalidArgument);
        }
        let mut placed: Vec<(u32, u8)> = self
            .instances
            .iter()
            .map(|i| (i.profile_id, i.start))
            .collect();
        placed.push((profile_id, start));
        layout::validate(&model, &placed).map_err(|_| Refused::InsufficientResources)?;
        let id = (1..)
            .find(|id| self.instances.iter().all(|i| i.id != *id))
            .unwrap_or(u32::MAX);
        self.serial += 1;
        let gpu_tag = &self.uuid[self.uuid.len().saturating_sub(8)..];
        self.instances.push(GpuInstance {
            id,
            profile_id,
            start,
            size: profile.memory_slices,
            compute: None,
            busy: false,
            uuid: format!("MIG-{gpu_tag}-{id:04x}-4000-8000-{:012x}", self.serial),
        });
        Ok(self.instances.last().expect("just pushed"))
    }

    pub fn instance(&self, id: u32) -> Result<&GpuInstance, Refused> {
        self.instances
            .iter()
            .find(|i| i.id == id)
            .ok_or(Refused::NotFound)
    }

    pub fn instance_mut(&mut self, id: u32) -> Result<&mut GpuInstance, Refused> {
        self.instances
            .iter_mut()
            .find(|i| i.id == id)
            .ok_or(Refused::NotFound)
    }

    /// Destroys a GPU instance: `IN_USE` while it has a compute instance or a process.
    pub fn destroy(&mut self, id: u32) -> Result<(), Refused> {
        let i = self.instance(id)?;
        if i.compute.is_some() || i.busy {
            return Err(Refused::InUse);
        }
        self.instances.retain(|i| i.id != id);
        Ok(())
    }

    /// The profile of an instance.
    pub fn profile_of(&self, i: &GpuInstance) -> Result<Profile, Refused> {
        self.model()?
            .profile(i.profile_id)
            .cloned()
            .ok_or(Refused::Unknown)
    }
}

impl Node {
    /// `count` GPUs of catalog model `key`, MIG mode `mig`, no instances.
    pub fn new(gpus: &[(String, u32)], mig: bool) -> Result<Node, StateError> {
        let mut out = Vec::new();
        for (key, count) in gpus {
            if !catalog::models().iter().any(|m| &m.key == key) {
                return Err(StateError::UnknownModel(key.clone()));
            }
            for _ in 0..*count {
                let index = out.len();
                out.push(Gpu {
                    model: key.clone(),
                    uuid: format!("GPU-f4ce0000-0000-4000-8000-{index:012x}"),
                    mig,
                    serial: 0,
                    instances: Vec::new(),
                    processes: Vec::new(),
                    gpm_dram_bw_pct: None,
                });
            }
        }
        Ok(Node { gpus: out })
    }
}

/// The state file, locked for as long as this value lives.
#[derive(Debug)]
pub struct Locked {
    file: File,
    path: std::path::PathBuf,
    pub node: Node,
}

impl Locked {
    /// Opens and locks the state file at `path` and reads it.
    pub fn open(path: &Path) -> Result<Locked, StateError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io(path, "open"))?;
        // SAFETY: flock on an open descriptor of ours.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io(path, "lock")(std::io::Error::last_os_error()));
        }
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(io(path, "read"))?;
        let node = serde_json::from_str(&text).map_err(|source| StateError::Parse {
            path: path.display().to_string(),
            source,
        })?;
        Ok(Locked {
            file,
            path: path.to_owned(),
            node,
        })
    }

    /// Writes the state back (the lock goes with the value).
    pub fn save(mut self) -> Result<(), StateError> {
        let text =
            serde_json::to_string_pretty(&self.node).map_err(|source| StateError::Parse {
                path: self.path.display().to_string(),
                source,
            })?;
        let path = self.path.clone();
        self.file
            .seek(SeekFrom::Start(0))
            .and_then(|_| self.file.set_len(0))
            .and_then(|()| self.file.write_all(text.as_bytes()))
            .and_then(|()| self.file.sync_data())
            .map_err(io(&path, "write"))
    }
}

/// Writes a new state file.
pub fn create(path: &Path, node: &Node) -> Result<(), StateError> {
    let text = serde_json::to_string_pretty(node).map_err(|source| StateError::Parse {
        path: path.display().to_string(),
        source,
    })?;
    std::fs::write(path, text).map_err(io(path, "write"))
}

/// NVML's enum of a profile (`NVML_GPU_INSTANCE_PROFILE_*`), from its shape: `+me` 1g and
/// 2g are REV1 (7, 8), a 1g with two memory slices REV2 (9), the others by compute slices.
pub fn profile_enum(p: &Profile) -> Option<u32> {
    Some(
        match (p.compute_slices, p.media_extensions, p.memory_slices) {
            (1, true, _) => 7,
            (2, true, _) => 8,
            (1, false, m) if m > 1 => 9,
            (1, false, _) => 0,
            (2, false, _) => 1,
            (3, false, _) => 2,
            (4, false, _) => 3,
            (7, false, _) => 4,
            (8, false, _) => 5,
            (6, false, _) => 6,
            _ => return None,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a100() -> Gpu {
        Node::new(&[("a100-80gb".into(), 1)], true)
            .unwrap()
            .gpus
            .remove(0)
    }

    #[test]
    fn the_drivers_rules_hold() {
        let mut g = a100();
        // 3g.40gb (9) at 0 and 4, then nothing fits; IDs are handed out in order.
        assert_eq!(g.create(9, 0).map(|i| i.id), Ok(1));
        assert_eq!(
            g.create(9, 2).err(),
            Some(Refused::InvalidArgument),
            "not a start slot"
        );
        assert_eq!(g.create(9, 4).map(|i| i.id), Ok(2));
        assert_eq!(g.create(19, 6).err(), Some(Refused::InsufficientResources));
        g.instance_mut(1).unwrap().compute = Some(0);
        assert_eq!(g.destroy(1), Err(Refused::InUse));
        g.instance_mut(2).unwrap().busy = true;
        assert_eq!(g.destroy(2), Err(Refused::InUse));
        g.instance_mut(2).unwrap().busy = false;
        assert_eq!(g.destroy(2), Ok(()));
        assert_eq!(g.destroy(2), Err(Refused::NotFound));
        let again = g.create(9, 4).unwrap();
        assert_eq!(again.id, 2, "the lowest free ID");
        assert_ne!(again.uuid, "", "a new MIG device UUID");
        g.mig = false;
        assert_eq!(g.create(19, 0).err(), Some(Refused::NotSupported));
    }

    #[test]
    fn every_catalog_profile_has_the_enum_the_reference_gives() {
        let m = catalog::models()
            .into_iter()
            .find(|m| m.key == "h100-80gb")
            .unwrap();
        let enums: Vec<(u32, u32)> = m
            .profiles
            .iter()
            .map(|p| (p.id, profile_enum(p).unwrap()))
            .collect();
        for want in [(19, 0), (20, 7), (15, 9), (14, 1), (9, 2), (5, 3), (0, 4)] {
            assert!(enums.contains(&want), "{want:?} in {enums:?}");
        }
        for m in catalog::models() {
            for p in &m.profiles {
                assert!(profile_enum(p).is_some(), "{} {}", m.key, p.name);
            }
        }
    }
}
