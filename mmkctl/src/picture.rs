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

use crate::output::{GpuPartitionsOut, KernelGateOut};

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
        if let Some(k) = &p.gate {
            gate_lines(&mut out, k);
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

/// A time in microseconds, in the unit that reads best.
fn duration_us(us: u64) -> String {
    // Bounds where the rounded value would spill into the next unit ("1000.0 ms").
    match us {
        0..1_000 => format!("{us} us"),
        1_000..999_950 => format!("{:.1} ms", us as f64 / 1e3),
        _ => format!("{:.1} s", us as f64 / 1e6),
    }
}

/// The gate's counters, then one line per process attached to it.
fn gate_lines(out: &mut String, k: &KernelGateOut) {
    if let Some(e) = &k.error {
        let _ = writeln!(out, "      kernel gate unreadable: {e}");
        return;
    }
    let wait = match (k.device_wait, k.policy.as_str()) {
        (false, _) => "",
        // Passthrough tracks no completions: its partitions have no device wait.
        (true, "passthrough") => ", device wait (no effect under passthrough)",
        (true, _) => ", device wait",
    };
    // The budget limits holds; `passthrough` holds nothing.
    let budget = match k.hold_budget_pct {
        // The budget bounds holds on the CPU; a device wait still holds on the GPU.
        Some(0) if k.policy != "passthrough" && !k.device_wait => {
            ", hold budget 0 % (tracks, holds nothing)".into()
        }
        Some(pct) if pct < 100 && k.policy != "passthrough" => format!(", hold budget {pct} %"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "      kernel gate {}{wait}{budget}: {} launches, {} held ({}), {} forced",
        k.policy,
        k.launches,
        k.held,
        duration_us(k.held_us),
        k.forced
    );
    for p in &k.processes {
        let _ = writeln!(
            out,
            "        pid {:<8} {:<7} {} launches, {} held (longest {}), {} forced, {} in flight",
            p.pid,
            p.class.as_deref().unwrap_or("-"),
            p.launches,
            p.held,
            duration_us(p.max_held_us),
            p.forced,
            p.in_flight
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::{GateProcessOut, MpsDaemonOut, PartitionJobOut, PartitionOut};

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
            gate: None,
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
    fn a_budget_of_zero_says_the_gate_holds_nothing_unless_it_waits_on_the_gpu() {
        let mut k = KernelGateOut {
            path: "/dev/shm/mmk/g0.gate".into(),
            error: None,
            policy: "mmk".into(),
            device_wait: false,
            hold_budget_pct: Some(0),
            launches: 25,
            held: 0,
            held_us: 0,
            forced: 0,
            processes: vec![],
        };
        let mut out = String::new();
        gate_lines(&mut out, &k);
        assert_eq!(
            out,
            "      kernel gate mmk, hold budget 0 % (tracks, holds nothing): 25 launches, 0 held (0 us), 0 forced\n"
        );
        k.device_wait = true;
        let mut out = String::new();
        gate_lines(&mut out, &k);
        assert_eq!(
            out,
            "      kernel gate mmk, device wait, hold budget 0 %: 25 launches, 0 held (0 us), 0 forced\n"
        );
    }

    #[test]
    fn a_partitions_gate_shows_its_counters_and_processes() {
        let mut p = part(0, "whole", 0, 8, &["serve", "train"]);
        p.gate = Some(KernelGateOut {
            path: "/dev/shm/mmk/g0.gate".into(),
            error: None,
            policy: "mmk".into(),
            device_wait: true,
            hold_budget_pct: Some(10),
            launches: 465_405,
            held: 774,
            held_us: 901_607,
            forced: 20,
            processes: vec![
                GateProcessOut {
                    pid: 825,
                    class: Some("offline".into()),
                    in_flight: 3,
                    launches: 465_000,
                    held: 774,
                    held_us: 901_607,
                    forced: 20,
                    max_held_us: 4_900,
                },
                GateProcessOut {
                    pid: 830,
                    class: None,
                    in_flight: 0,
                    launches: 0,
                    held: 0,
                    held_us: 0,
                    forced: 0,
                    max_held_us: 0,
                },
            ],
        });
        let g = GpuPartitionsOut {
            gpu: 0,
            uuid: "GPU-0".into(),
            model: "NVIDIA H200".into(),
            mig_enabled: false,
            memory_slices: 8,
            partitions: vec![p],
        };
        let pic = gpu(&g);
        assert!(
            pic.contains(
                "\n      kernel gate mmk, device wait, hold budget 10 %: 465405 launches, 774 held (901.6 ms), 20 forced\n\
                 \x20       pid 825      offline 465000 launches, 774 held (longest 4.9 ms), 20 forced, 3 in flight\n\
                 \x20       pid 830      -       0 launches, 0 held (longest 0 us), 0 forced, 0 in flight\n"
            ),
            "{pic}"
        );

        let mut p = part(0, "whole", 0, 8, &[]);
        p.gate = Some(KernelGateOut {
            path: "/x/g0.gate".into(),
            error: Some("gate /x/g0.gate is not an mmk gate (bad magic or size 10 bytes)".into()),
            policy: String::new(),
            device_wait: false,
            hold_budget_pct: None,
            launches: 0,
            held: 0,
            held_us: 0,
            forced: 0,
            processes: vec![],
        });
        let pic = gpu(&GpuPartitionsOut {
            partitions: vec![p],
            ..g
        });
        assert!(
            pic.contains(
                "\n      kernel gate unreadable: gate /x/g0.gate is not an mmk gate (bad magic or size 10 bytes)\n"
            ),
            "{pic}"
        );
    }

    #[test]
    fn durations_take_the_unit_their_rounded_value_fits() {
        assert_eq!(duration_us(999), "999 us");
        assert_eq!(duration_us(1_000), "1.0 ms");
        assert_eq!(duration_us(999_949), "999.9 ms");
        assert_eq!(duration_us(999_950), "1.0 s");
        assert_eq!(duration_us(61_250_000), "61.2 s");
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
