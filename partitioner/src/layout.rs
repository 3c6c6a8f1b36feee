//! GPU instances on memory slices, and the rules a layout must keep.

use serde::Serialize;
use thiserror::Error;

use crate::catalog::{GpuModel, Profile};

/// Where an instance sits: `size` memory slices from `start`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Placement {
    pub start: u8,
    pub size: u8,
}

impl Placement {
    pub fn end(self) -> u16 {
        u16::from(self.start) + u16::from(self.size)
    }

    pub fn overlaps(self, other: Placement) -> bool {
        u16::from(self.start) < other.end() && u16::from(other.start) < self.end()
    }
}

/// A GPU instance as it exists on a GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Instance {
    /// The GPU instance ID the driver assigned.
    pub id: u32,
    pub profile_id: u32,
    pub placement: Placement,
    /// The instance's device UUID (`MIG-...`), what `CUDA_VISIBLE_DEVICES` names.
    pub uuid: String,
}

/// One GPU as the planner sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct GpuState {
    pub index: u32,
    pub uuid: String,
    pub model: GpuModel,
    /// With MIG off the whole GPU is one partition and the layout never changes.
    pub mig_enabled: bool,
    /// The backend cannot create or destroy instances on this GPU (read-only NVML): the
    /// planner uses the instances that exist and nothing else.
    pub layout_fixed: bool,
    pub instances: Vec<Instance>,
}

/// Why a layout is not valid for its GPU model.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LayoutError {
    #[error("gpu model {model} has no profile {profile}")]
    UnknownProfile { model: String, profile: u32 },
    #[error("profile {profile} cannot start at memory slice {start}")]
    BadStart { profile: String, start: u8 },
    #[error("profile {profile} at slice {start} overlaps {other} at slice {other_start}")]
    Overlap {
        profile: String,
        start: u8,
        other: String,
        other_start: u8,
    },
    #[error("profile {profile} is allowed {max} times per gpu")]
    TooMany { profile: String, max: u8 },
    #[error("only one +me profile fits on a gpu")]
    MediaExtensionsTaken,
    #[error("the layout uses {used} compute slices of {available}")]
    ComputeExhausted { used: u32, available: u8 },
}

/// Checks that instances `(profile id, start slice)` can coexist on a GPU of `model`.
pub fn validate(model: &GpuModel, instances: &[(u32, u8)]) -> Result<(), LayoutError> {
    check(model, instances).map_err(|broken| broken.error(model))
}

/// Whether instances `(profile id, start slice)` can coexist on a GPU of `model`: as
/// [`validate`], without writing the error (the planner asks this of many layouts).
pub fn fits(model: &GpuModel, instances: &[(u32, u8)]) -> bool {
    check(model, instances).is_ok()
}

/// What [`check`] found wrong, by reference; [`Broken::error`] writes it out.
enum Broken<'m> {
    UnknownProfile(u32),
    BadStart(&'m Profile, u8),
    Overlap(&'m Profile, u8, &'m Profile, u8),
    TooMany(&'m Profile),
    MediaExtensionsTaken,
    ComputeExhausted(u32),
}

impl Broken<'_> {
    fn error(self, model: &GpuModel) -> LayoutError {
        match self {
            Broken::UnknownProfile(profile) => LayoutError::UnknownProfile {
                model: model.key.clone(),
                profile,
            },
            Broken::BadStart(p, start) => LayoutError::BadStart {
                profile: p.name.clone(),
                start,
            },
            Broken::Overlap(p, start, q, other_start) => LayoutError::Overlap {
                profile: p.name.clone(),
                start,
                other: q.name.clone(),
                other_start,
            },
            Broken::TooMany(p) => LayoutError::TooMany {
                profile: p.name.clone(),
                max: p.max_count,
            },
            Broken::MediaExtensionsTaken => LayoutError::MediaExtensionsTaken,
            Broken::ComputeExhausted(used) => LayoutError::ComputeExhausted {
                used,
                available: model.compute_slices,
            },
        }
    }
}

fn check<'m>(model: &'m GpuModel, instances: &[(u32, u8)]) -> Result<(), Broken<'m>> {
    let mut placed: Vec<(&Profile, Placement)> = Vec::with_capacity(instances.len());
    for &(pid, start) in instances {
        let p = model.profile(pid).ok_or(Broken::UnknownProfile(pid))?;
        if !p.starts.contains(&start) {
            return Err(Broken::BadStart(p, start));
        }
        let here = Placement {
            start,
            size: p.memory_slices,
        };
        if let Some((q, there)) = placed.iter().find(|(_, there)| there.overlaps(here)) {
            return Err(Broken::Overlap(p, start, q, there.start));
        }
        let same = placed.iter().filter(|(q, _)| q.id == p.id).count();
        if same >= usize::from(p.max_count) {
            return Err(Broken::TooMany(p));
        }
        if p.media_extensions && placed.iter().any(|(q, _)| q.media_extensions) {
            return Err(Broken::MediaExtensionsTaken);
        }
        placed.push((p, here));
    }
    let used: u32 = placed
        .iter()
        .map(|(p, _)| u32::from(p.compute_slices))
        .sum();
    if used > u32::from(model.compute_slices) {
        return Err(Broken::ComputeExhausted(used));
    }
    Ok(())
}

/// Every valid layout of a model, each as a sorted list of `(profile id, start)`: a brute
/// force over placements, used by tests and by tools that list what a GPU can hold.
pub fn enumerate(model: &GpuModel) -> Vec<Vec<(u32, u8)>> {
    let options: Vec<(u32, u8, u8)> = model
        .profiles
        .iter()
        .flat_map(|p| p.starts.iter().map(move |&s| (p.id, s, p.memory_slices)))
        .collect();
    let mut out = Vec::new();
    let mut current = Vec::new();
    extend(model, &options, 0, &mut current, &mut out);
    out
}

fn extend(
    model: &GpuModel,
    options: &[(u32, u8, u8)],
    from: usize,
    current: &mut Vec<(u32, u8)>,
    out: &mut Vec<Vec<(u32, u8)>>,
) {
    out.push(current.clone());
    for (i, &(pid, start, _)) in options.iter().enumerate().skip(from) {
        current.push((pid, start));
        if fits(model, current) {
            extend(model, options, i + 1, current, out);
        }
        current.pop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog;

    fn m(key: &str) -> GpuModel {
        catalog::model(key).expect("known model")
    }

    fn id(model: &GpuModel, name: &str) -> u32 {
        model.profile_by_name(name).expect("known profile").id
    }

    #[test]
    fn the_papers_layouts() {
        let a = m("a100-80gb");
        // [4g.40gb, 3g.40gb] fills the GPU.
        assert_eq!(
            validate(&a, &[(id(&a, "4g.40gb"), 0), (id(&a, "3g.40gb"), 4)]),
            Ok(())
        );
        // [3g.40gb, 2g.20gb, 2g.20gb].
        assert_eq!(
            validate(
                &a,
                &[
                    (id(&a, "3g.40gb"), 0),
                    (id(&a, "2g.20gb"), 4),
                    (id(&a, "2g.20gb"), 6)
                ]
            ),
            Err(LayoutError::BadStart {
                profile: "2g.20gb".into(),
                start: 6
            })
        );
        assert_eq!(
            validate(
                &a,
                &[
                    (id(&a, "3g.40gb"), 4),
                    (id(&a, "2g.20gb"), 0),
                    (id(&a, "2g.20gb"), 2)
                ]
            ),
            Ok(())
        );
    }

    #[test]
    fn rules_are_enforced() {
        let a = m("a100-80gb");
        let one = id(&a, "1g.10gb");
        let seven: Vec<_> = (0..7).map(|s| (one, s)).collect();
        assert_eq!(validate(&a, &seven), Ok(()));
        assert!(matches!(
            validate(&a, &[(id(&a, "4g.40gb"), 4)]),
            Err(LayoutError::BadStart { .. })
        ));
        assert!(matches!(
            validate(&a, &[(id(&a, "3g.40gb"), 0), (id(&a, "4g.40gb"), 0)]),
            Err(LayoutError::Overlap { .. })
        ));
        let me = id(&a, "1g.10gb+me");
        assert_eq!(
            validate(&a, &[(me, 0), (me, 1)]),
            Err(LayoutError::TooMany {
                profile: "1g.10gb+me".into(),
                max: 1
            })
        );
        let a30 = m("a30-24gb");
        assert_eq!(
            validate(
                &a30,
                &[(id(&a30, "1g.6gb+me"), 0), (id(&a30, "2g.12gb+me"), 2)]
            ),
            Err(LayoutError::MediaExtensionsTaken)
        );
        assert!(matches!(
            validate(&a, &[(999, 0)]),
            Err(LayoutError::UnknownProfile { .. })
        ));
    }

    /// A second enumerator that walks the memory slices left to right: at each slice,
    /// leave it or start any profile there. A different traversal from `enumerate`'s
    /// subset recursion, so the two agree only if both are complete.
    fn by_slices(
        model: &GpuModel,
        slice: u8,
        cur: &mut Vec<(u32, u8)>,
        out: &mut Vec<Vec<(u32, u8)>>,
    ) {
        if slice >= model.memory_slices {
            let mut l = cur.clone();
            l.sort_unstable();
            out.push(l);
            return;
        }
        by_slices(model, slice + 1, cur, out);
        for p in &model.profiles {
            if p.starts.contains(&slice) {
                cur.push((p.id, slice));
                if validate(model, cur).is_ok() {
                    // Two instances never start on the same slice, so move on.
                    by_slices(model, slice + 1, cur, out);
                }
                cur.pop();
            }
        }
    }

    #[test]
    fn enumeration_matches_a_slice_by_slice_walk() {
        for model in catalog::models() {
            let mut a: Vec<Vec<(u32, u8)>> = enumerate(&model)
                .into_iter()
                .map(|mut l| {
                    l.sort_unstable();
                    l
                })
                .collect();
            a.sort();
            let mut b = Vec::new();
            by_slices(&model, 0, &mut Vec::new(), &mut b);
            b.sort();
            b.dedup();
            assert_eq!(a.len(), b.len(), "{}", model.key);
            assert_eq!(a, b, "{}", model.key);
        }
    }

    /// Independent check of `enumerate`: each listed layout is valid, none repeats, and
    /// every valid set of up to three placements is listed (and `fits` says so too).
    #[test]
    fn enumeration_is_complete_and_valid() {
        for model in catalog::models() {
            let all = enumerate(&model);
            let mut seen = std::collections::BTreeSet::new();
            for layout in &all {
                let mut sorted = layout.clone();
                sorted.sort_unstable();
                assert!(seen.insert(sorted), "{} repeats {layout:?}", model.key);
                assert_eq!(validate(&model, layout), Ok(()));
            }
            let options: Vec<(u32, u8)> = model
                .profiles
                .iter()
                .flat_map(|p| p.starts.iter().map(move |&s| (p.id, s)))
                .collect();
            for a in 0..options.len() {
                for b in a + 1..options.len() {
                    for c in b + 1..options.len() {
                        let mut l = vec![options[a], options[b], options[c]];
                        assert_eq!(fits(&model, &l), validate(&model, &l).is_ok(), "{l:?}");
                        if validate(&model, &l).is_ok() {
                            l.sort_unstable();
                            assert!(seen.contains(&l), "{} misses {l:?}", model.key);
                        }
                    }
                }
            }
        }
    }
}
