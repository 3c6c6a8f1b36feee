//! The MIG catalog: each GPU model's profiles, their sizes and their placements.
//!
//! Placements count memory slices: a profile of `memory_slices` slices may start at any of
//! its `starts`. Profile IDs are the `nvidia-smi mig -lgip` IDs. On real hardware the
//! profiles come from NVML; this catalog is what the simulated node uses, and what a test
//! checks the NVML reading against.
//!
//! Sources (see docs/reference.md): profile names, slices, instance limits and start
//! slots from NVIDIA's MIG documentation; SM counts and memory of the H200 read with
//! `nvidia-smi` on that GPU. The memory of the other models' profiles is the size their
//! `nvidia-smi mig -lgip` lists as far as we know it; the [`GpuModel::memory_source`] field
//! says which numbers were read on hardware.

use serde::Serialize;

/// One GPU instance profile.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Profile {
    /// `nvidia-smi mig -lgip` ID (19 = 1g, 0 = 7g on 7-slice GPUs).
    pub id: u32,
    /// e.g. `3g.40gb`, `1g.10gb+me`.
    pub name: String,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub memory_mib: u64,
    pub sm_count: u32,
    /// How many instances of this profile one GPU can hold.
    pub max_count: u8,
    /// Memory slices this profile may start at.
    pub starts: Vec<u8>,
    /// A `+me` profile owns the GPU's media engines; one per GPU.
    pub media_extensions: bool,
}

/// A GPU model and its MIG profiles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuModel {
    /// The catalog key, as in `--sim-gpus a100-80gb:2`.
    pub key: String,
    /// The product name NVML reports.
    pub product_name: String,
    pub memory_mib: u64,
    /// SMs of the whole GPU with MIG off.
    pub sm_count: u32,
    pub compute_slices: u8,
    pub memory_slices: u8,
    pub profiles: Vec<Profile>,
    /// Where the profile memory sizes come from.
    pub memory_source: String,
}

impl GpuModel {
    pub fn profile(&self, id: u32) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.id == id)
    }

    pub fn profile_by_name(&self, name: &str) -> Option<&Profile> {
        self.profiles.iter().find(|p| p.name == name)
    }

    /// The largest memory any single instance of this model can have.
    pub fn largest_instance_mib(&self) -> u64 {
        self.profiles
            .iter()
            .map(|p| p.memory_mib)
            .max()
            .unwrap_or(self.memory_mib)
    }
}

/// `(id, name suffix, compute, memory slices, max, starts, +me)` of a 7-compute-slice GPU.
type Shape = (u32, u8, u8, u8, &'static [u8], bool);

/// The profile shapes of the 7-slice GPUs (A100, H100, H200): ID, compute slices, memory
/// slices, max count, start slots, media extensions. The order is the table's order in
/// docs/reference.md.
const SEVEN_SLICE: [Shape; 7] = [
    (19, 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6], false),
    (20, 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6], true),
    (15, 1, 2, 4, &[0, 2, 4, 6], false),
    (14, 2, 2, 3, &[0, 2, 4], false),
    (9, 3, 4, 2, &[0, 4], false),
    (5, 4, 4, 1, &[0], false),
    (0, 7, 8, 1, &[0], false),
];

/// Builds the seven profiles of a 7-slice model from its per-profile names' memory part
/// (`10gb`), memory in MiB and SM counts, in [`SEVEN_SLICE`] order.
fn seven_slice(names: [&str; 7], memory_mib: [u64; 7], sms: [u32; 7]) -> Vec<Profile> {
    SEVEN_SLICE
        .iter()
        .zip(names)
        .zip(memory_mib)
        .zip(sms)
        .map(
            |((((id, c, m, max, starts, me), mem_name), mem), sm)| Profile {
                id: *id,
                name: format!("{c}g.{mem_name}{}", if *me { "+me" } else { "" }),
                compute_slices: *c,
                memory_slices: *m,
                memory_mib: mem,
                sm_count: sm,
                max_count: *max,
                starts: starts.to_vec(),
                media_extensions: *me,
            },
        )
        .collect()
}

const HOPPER_SMS: [u32; 7] = [16, 16, 26, 32, 60, 64, 132];
const AMPERE_SMS: [u32; 7] = [14, 14, 14, 28, 42, 56, 98];

const fn gib(x: f64) -> u64 {
    (x * 1024.0) as u64
}

/// Every model the simulated node can be built from.
pub fn models() -> Vec<GpuModel> {
    vec![
        GpuModel {
            key: "a100-40gb".into(),
            product_name: "NVIDIA A100-SXM4-40GB".into(),
            memory_mib: 40 * 1024,
            sm_count: 108,
            compute_slices: 7,
            memory_slices: 8,
            profiles: seven_slice(
                ["5gb", "5gb", "10gb", "10gb", "20gb", "20gb", "40gb"],
                [4864, 4864, 9856, 9856, 19968, 19968, 40192],
                AMPERE_SMS,
            ),
            memory_source: "nvidia-smi mig -lgip as documented for A100-40GB (not read here)"
                .into(),
        },
        GpuModel {
            key: "a100-80gb".into(),
            product_name: "NVIDIA A100-SXM4-80GB".into(),
            memory_mib: 80 * 1024,
            sm_count: 108,
            compute_slices: 7,
            memory_slices: 8,
            profiles: seven_slice(
                ["10gb", "10gb", "20gb", "20gb", "40gb", "40gb", "80gb"],
                [9728, 9728, 19968, 19968, 40192, 40192, 80384],
                AMPERE_SMS,
            ),
            memory_source: "nvidia-smi mig -lgip as documented for A100-80GB (not read here)"
                .into(),
        },
        GpuModel {
            key: "h100-80gb".into(),
            product_name: "NVIDIA H100 80GB HBM3".into(),
            memory_mib: 80 * 1024,
            sm_count: 132,
            compute_slices: 7,
            memory_slices: 8,
            profiles: seven_slice(
                ["10gb", "10gb", "20gb", "20gb", "40gb", "40gb", "80gb"],
                [
                    gib(9.75),
                    gib(9.75),
                    gib(19.625),
                    gib(19.625),
                    gib(39.5),
                    gib(39.5),
                    gib(79.25),
                ],
                HOPPER_SMS,
            ),
            memory_source: "nvidia-smi mig -lgip read on an H100 80GB HBM3, driver 580.159.04"
                .into(),
        },
        GpuModel {
            key: "h100-94gb".into(),
            product_name: "NVIDIA H100 NVL".into(),
            memory_mib: 94 * 1024,
            sm_count: 132,
            compute_slices: 7,
            memory_slices: 8,
            profiles: seven_slice(
                ["12gb", "12gb", "24gb", "24gb", "47gb", "47gb", "94gb"],
                [
                    gib(11.0),
                    gib(11.0),
                    gib(22.5),
                    gib(22.5),
                    gib(46.0),
                    gib(46.0),
                    gib(93.0),
                ],
                HOPPER_SMS,
            ),
            memory_source: "estimated from the profile names (H100-94GB not read here)".into(),
        },
        GpuModel {
            key: "h200-141gb".into(),
            product_name: "NVIDIA H200".into(),
            // As NVML reports it on an H200 (driver 580.159).
            memory_mib: 143_771,
            sm_count: 132,
            compute_slices: 7,
            memory_slices: 8,
            profiles: seven_slice(
                ["18gb", "18gb", "35gb", "35gb", "71gb", "71gb", "141gb"],
                [
                    gib(16.0),
                    gib(16.0),
                    gib(32.5),
                    gib(32.5),
                    gib(69.75),
                    gib(69.75),
                    gib(140.0),
                ],
                HOPPER_SMS,
            ),
            memory_source: "read with nvidia-smi on an H200, driver 580 (docs/reference.md)".into(),
        },
        GpuModel {
            key: "a30-24gb".into(),
            product_name: "NVIDIA A30".into(),
            memory_mib: 24 * 1024,
            sm_count: 56,
            compute_slices: 4,
            memory_slices: 4,
            profiles: vec![
                a30(14, "1g.6gb", 1, 1, 5888, 14, 4, &[0, 1, 2, 3], false),
                a30(21, "1g.6gb+me", 1, 1, 5888, 14, 1, &[0, 1, 2, 3], true),
                a30(5, "2g.12gb", 2, 2, 12032, 28, 2, &[0, 2], false),
                a30(6, "2g.12gb+me", 2, 2, 12032, 28, 1, &[0, 2], true),
                a30(0, "4g.24gb", 4, 4, 24064, 56, 1, &[0], false),
            ],
            memory_source: "nvidia-smi mig -lgip as documented for A30 (not read here)".into(),
        },
    ]
}

#[allow(clippy::too_many_arguments)]
fn a30(
    id: u32,
    name: &str,
    compute_slices: u8,
    memory_slices: u8,
    memory_mib: u64,
    sm_count: u32,
    max_count: u8,
    starts: &[u8],
    media_extensions: bool,
) -> Profile {
    Profile {
        id,
        name: name.into(),
        compute_slices,
        memory_slices,
        memory_mib,
        sm_count,
        max_count,
        starts: starts.to_vec(),
        media_extensions,
    }
}

/// Looks a model up by its catalog key (`a100-80gb`).
pub fn model(key: &str) -> Option<GpuModel> {
    models().into_iter().find(|m| m.key == key)
}

/// The catalog keys, for error messages.
pub fn keys() -> Vec<String> {
    models().into_iter().map(|m| m.key).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(key: &str) -> Vec<String> {
        model(key)
            .expect("known model")
            .profiles
            .iter()
            .map(|p| p.name.clone())
            .collect()
    }

    /// The profile names of every model, as in docs/reference.md's table.
    #[test]
    fn profile_names_match_the_reference_table() {
        assert_eq!(
            names("a100-40gb"),
            [
                "1g.5gb",
                "1g.5gb+me",
                "1g.10gb",
                "2g.10gb",
                "3g.20gb",
                "4g.20gb",
                "7g.40gb"
            ]
        );
        assert_eq!(
            names("a100-80gb"),
            [
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb"
            ]
        );
        assert_eq!(
            names("h100-80gb"),
            [
                "1g.10gb",
                "1g.10gb+me",
                "1g.20gb",
                "2g.20gb",
                "3g.40gb",
                "4g.40gb",
                "7g.80gb"
            ]
        );
        assert_eq!(
            names("h100-94gb"),
            [
                "1g.12gb",
                "1g.12gb+me",
                "1g.24gb",
                "2g.24gb",
                "3g.47gb",
                "4g.47gb",
                "7g.94gb"
            ]
        );
        assert_eq!(
            names("h200-141gb"),
            [
                "1g.18gb",
                "1g.18gb+me",
                "1g.35gb",
                "2g.35gb",
                "3g.71gb",
                "4g.71gb",
                "7g.141gb"
            ]
        );
        assert_eq!(
            names("a30-24gb"),
            ["1g.6gb", "1g.6gb+me", "2g.12gb", "2g.12gb+me", "4g.24gb"]
        );
    }

    /// IDs, slices, limits and start slots of the 7-slice models (REFERENCE.md table).
    #[test]
    fn seven_slice_shapes_match_the_reference_table() {
        let expect: [(u32, u8, u8, u8, &[u8]); 7] = [
            (19, 1, 1, 7, &[0, 1, 2, 3, 4, 5, 6]),
            (20, 1, 1, 1, &[0, 1, 2, 3, 4, 5, 6]),
            (15, 1, 2, 4, &[0, 2, 4, 6]),
            (14, 2, 2, 3, &[0, 2, 4]),
            (9, 3, 4, 2, &[0, 4]),
            (5, 4, 4, 1, &[0]),
            (0, 7, 8, 1, &[0]),
        ];
        for key in [
            "a100-40gb",
            "a100-80gb",
            "h100-80gb",
            "h100-94gb",
            "h200-141gb",
        ] {
            let m = model(key).expect("known model");
            assert_eq!((m.compute_slices, m.memory_slices), (7, 8), "{key}");
            let got: Vec<_> = m
                .profiles
                .iter()
                .map(|p| {
                    (
                        p.id,
                        p.compute_slices,
                        p.memory_slices,
                        p.max_count,
                        p.starts.as_slice(),
                    )
                })
                .collect();
            assert_eq!(got, expect, "{key}");
        }
    }

    #[test]
    fn a30_shapes_match_the_reference() {
        let m = model("a30-24gb").expect("known model");
        assert_eq!((m.compute_slices, m.memory_slices), (4, 4));
        let got: Vec<_> = m
            .profiles
            .iter()
            .map(|p| {
                (
                    p.name.as_str(),
                    p.max_count,
                    p.starts.as_slice(),
                    p.media_extensions,
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                ("1g.6gb", 4, &[0u8, 1, 2, 3][..], false),
                ("1g.6gb+me", 1, &[0, 1, 2, 3][..], true),
                ("2g.12gb", 2, &[0, 2][..], false),
                ("2g.12gb+me", 1, &[0, 2][..], true),
                ("4g.24gb", 1, &[0][..], false),
            ]
        );
    }

    /// SM counts and memory of the H200 as read on hardware; the H100 has the same SMs.
    #[test]
    fn hopper_sizes_match_the_h200_reading() {
        let h200 = model("h200-141gb").expect("known model");
        let sms: Vec<u32> = h200.profiles.iter().map(|p| p.sm_count).collect();
        assert_eq!(sms, [16, 16, 26, 32, 60, 64, 132]);
        let gib: Vec<f64> = h200
            .profiles
            .iter()
            .map(|p| p.memory_mib as f64 / 1024.0)
            .collect();
        assert_eq!(gib, [16.0, 16.0, 32.5, 32.5, 69.75, 69.75, 140.0]);
        let h100 = model("h100-80gb").expect("known model");
        assert_eq!(
            h100.profiles.iter().map(|p| p.sm_count).collect::<Vec<_>>(),
            sms
        );
    }

    /// Sizes grow with slices, and no instance is larger than its GPU.
    #[test]
    fn sizes_are_consistent_within_each_model() {
        for m in models() {
            for p in &m.profiles {
                assert!(p.memory_mib <= m.memory_mib, "{} {}", m.key, p.name);
                assert!(p.sm_count <= m.sm_count, "{} {}", m.key, p.name);
                let last = p.starts.iter().max().copied().unwrap_or(0);
                assert!(
                    last + p.memory_slices <= m.memory_slices,
                    "{} {}",
                    m.key,
                    p.name
                );
                assert!(p.compute_slices <= m.compute_slices);
            }
            for a in &m.profiles {
                for b in &m.profiles {
                    if a.memory_slices < b.memory_slices {
                        assert!(
                            a.memory_mib < b.memory_mib,
                            "{} {} {}",
                            m.key,
                            a.name,
                            b.name
                        );
                    }
                }
            }
        }
    }
}
