//! The picture of a GPU's memory slices, the instances placed on them and their jobs.
//!
//! ```text
//! GPU 0  NVIDIA A100-SXM4-80GB  MIG on  GPU-5e1a0000-0000-4000-8000-000000000000
//! slice   0       1       2       3       4       5       6       7
//!       +-------------------------------+---------------+-------+-------+
//!       |3g.40gb                        |2g.20gb        |free   |free   |
//!       |#1 2 jobs                      |#2 idle        |       |       |
//!       |resnet50,bert                  |               |       |       |
//!       +-------------------------------+---------------+-------+-------+
//! ```

use std::fmt::Write as _;

use mmk_core::units::format_mib;

use crate::output::GpuPartitionsOut;

/// Columns per memory slice: 8 slices fit an 80-column terminal.
const CELL: usize = 8;
const INDENT: &str = "      ";

struct Segment {
    start: u32,
    size: u32,
    lines: [String; 3],
}

fn fit(s: &str, width: usize) -> String {
    let mut out: String = s.chars().take(width).collect();
    let n = out.chars().count();
    out.extend(std::iter::repeat_n(' ', width - n));
    out
}

fn segments(g: &GpuPartitionsOut) -> Vec<Segment> {
    let mut segs: Vec<Segment> = g
        .partitions
        .iter()
        .map(|p| {
            let (label, id) = if g.mig_enabled {
                (p.profile.clone(), format!("#{}", p.instance_id))
            } else {
                ("whole GPU (MIG off)".to_owned(), "gpu".to_owned())
            };
            let count = match p.jobs.len() {
                0 => format!("{id} idle"),
                1 => id,
                n => format!("{id} {n} jobs"),
            };
            let names: Vec<&str> = p.jobs.iter().map(|j| j.name.as_str()).collect();
            Segment {
                start: p.start_slice,
                size: p.size_slices.max(1),
                lines: [label, count, names.join(",")],
            }
        })
        .collect();
    // Slices no instance holds are drawn one by one as free.
    let mut taken = vec![false; g.memory_slices as usize];
    for s in &segs {
        for i in s.start..(s.start + s.size).min(g.memory_slices) {
            taken[i as usize] = true;
        }
    }
    for (i, t) in taken.iter().enumerate() {
        if !t {
            segs.push(Segment {
                start: i as u32,
                size: 1,
                lines: ["free".into(), String::new(), String::new()],
            });
        }
    }
    segs.sort_by_key(|s| s.start);
    segs
}

/// Draws one GPU: the header, the slice picture and a list of instances with their jobs.
pub fn gpu(g: &GpuPartitionsOut) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "GPU {}  {}  MIG {}  {}",
        g.gpu,
        g.model,
        if g.mig_enabled { "on" } else { "off" },
        g.uuid
    );
    let mut header = String::from("slice  ");
    for i in 0..g.memory_slices {
        header.push_str(&fit(&i.to_string(), CELL));
    }
    let _ = writeln!(out, "{}", header.trim_end());
    let segs = segments(g);
    let width = |s: &Segment| s.size as usize * CELL - 1;
    let border: String = segs.iter().fold(String::from("+"), |mut acc, s| {
        acc.push_str(&"-".repeat(width(s)));
        acc.push('+');
        acc
    });
    let _ = writeln!(out, "{INDENT}{border}");
    for line in 0..3 {
        let row: String = segs.iter().fold(String::from("|"), |mut acc, s| {
            acc.push_str(&fit(&s.lines[line], width(s)));
            acc.push('|');
            acc
        });
        let _ = writeln!(out, "{INDENT}{row}");
    }
    let _ = writeln!(out, "{INDENT}{border}");
    for p in &g.partitions {
        let last = p.start_slice + p.size_slices.max(1) - 1;
        let name = if g.mig_enabled {
            format!("#{} {}", p.instance_id, p.profile)
        } else {
            "whole GPU".to_owned()
        };
        let _ = writeln!(
            out,
            "  {:<14} slices {}-{}  {} SMs  {} used of {}",
            name,
            p.start_slice,
            last,
            p.sm_count,
            format_mib(p.used_memory_mib),
            format_mib(p.memory_mib)
        );
        if let Some(m) = &p.mps {
            let state = match m.pid {
                0 => "down, restarting".to_owned(),
                pid => format!("pid {pid}"),
            };
            let restarts = match m.restarts {
                0 => String::new(),
                n => format!(", restarted {n}x"),
            };
            let _ = writeln!(out, "      MPS daemon {state}{restarts}");
        }
        for j in &p.jobs {
            let _ = writeln!(
                out,
                "      job {:<5} {:<18} {:<7} {:<9} MPS {:>3}%  {}",
                j.id,
                j.name.chars().take(18).collect::<String>(),
                j.class,
                j.state,
                j.mps_share,
                format_mib(j.gpu_memory_mib)
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{MpsDaemonOut, PartitionJobOut, PartitionOut};

    fn part(id: u32, profile: &str, start: u32, size: u32, jobs: &[&str]) -> PartitionOut {
        PartitionOut {
            instance_id: id,
            device_uuid: format!("MIG-{id}"),
            profile: profile.into(),
            start_slice: start,
            size_slices: size,
            memory_mib: 40 * 1024,
            used_memory_mib: 8 * 1024 * jobs.len() as u64,
            sm_count: 42,
            jobs: jobs
                .iter()
                .enumerate()
                .map(|(i, n)| PartitionJobOut {
                    id: i as u64 + 1,
                    name: (*n).into(),
                    class: "online".into(),
                    state: "RUNNING".into(),
                    mps_share: 100,
                    gpu_memory_mib: 8 * 1024,
                })
                .collect(),
            mps: (!jobs.is_empty()).then(|| MpsDaemonOut {
                pid: 4242,
                pipe_dir: "/var/lib/mmk/mps/g0i1/pipe".into(),
                restarts: 1,
                servers: vec![4243],
            }),
        }
    }

    #[test]
    fn draws_instances_on_their_slices() {
        let g = GpuPartitionsOut {
            gpu: 0,
            uuid: "GPU-0".into(),
            model: "NVIDIA A100-SXM4-80GB".into(),
            mig_enabled: true,
            memory_slices: 8,
            partitions: vec![
                part(1, "3g.40gb", 0, 4, &["resnet50", "bert"]),
                part(2, "2g.20gb", 4, 2, &[]),
            ],
        };
        let pic = gpu(&g);
        let lines: Vec<&str> = pic.lines().collect();
        assert_eq!(
            lines[1],
            "slice  0       1       2       3       4       5       6       7"
        );
        assert_eq!(
            lines[2],
            "      +-------------------------------+---------------+-------+-------+"
        );
        assert_eq!(
            lines[3],
            "      |3g.40gb                        |2g.20gb        |free   |free   |"
        );
        assert_eq!(
            lines[4],
            "      |#1 2 jobs                      |#2 idle        |       |       |"
        );
        assert_eq!(
            lines[5],
            "      |resnet50,bert                  |               |       |       |"
        );
        assert!(lines.iter().all(|l| l.chars().count() <= 80), "{pic}");
        // Slice 4 starts where its header number stands.
        assert_eq!(lines[1].find('4'), lines[3].find("2g.20gb"));
        assert!(
            pic.contains("\n      MPS daemon pid 4242, restarted 1x\n"),
            "{pic}"
        );
    }

    #[test]
    fn a_gpu_with_mig_off_is_one_box() {
        let g = GpuPartitionsOut {
            gpu: 1,
            uuid: "GPU-1".into(),
            model: "NVIDIA H100 80GB HBM3".into(),
            mig_enabled: false,
            memory_slices: 8,
            partitions: vec![part(0, "whole", 0, 8, &["train"])],
        };
        let pic = gpu(&g);
        assert!(pic.contains("|whole GPU (MIG off)"), "{pic}");
        assert!(!pic.contains("free"), "{pic}");
    }
}
