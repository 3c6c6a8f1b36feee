//! `mmkctl top`: a live view of each GPU's partitions and the jobs in them, redrawn every
//! second like `nvidia-smi -l` and `htop`: class, share, memory, the GPU time each job's
//! kernels take (the time its processes have kernels in flight, per second of wall time)
//! and the time its launches spend held by the kernel gate. `q` or Ctrl-C quits; `--once`
//! prints one frame (two reads a second apart) for scripts. Everything comes from
//! ListPartitions.

use std::collections::HashMap;
use std::io::Read as _;
use std::os::fd::AsFd as _;
use std::time::{Duration, Instant};

use clap::Args;
use mmk_core::units::format_mib;
use mmk_proto::v1;
use serde::Serialize;
use tokio::signal::unix::SignalKind;

use crate::cli::{Failure, Format};
use crate::client::{Target, connect};
use crate::output::{class_name, state_name};

#[derive(Debug, Args)]
pub struct TopArgs {
    /// Print one frame and exit: rates over one interval, then the frame.
    #[arg(long)]
    pub once: bool,
    /// Time between frames.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,
}

fn parse_interval(s: &str) -> Result<Duration, String> {
    let d = mmk_core::units::parse_duration(s).map_err(|e| e.to_string())?;
    if d < Duration::from_millis(100) {
        return Err(format!("{s} is shorter than 100ms"));
    }
    Ok(d)
}

/// One job in a frame.
#[derive(Debug, Serialize)]
struct JobRow {
    id: u64,
    name: String,
    class: String,
    state: String,
    /// The owner's uid.
    user: Option<u32>,
    /// The owner's name on this host (the uid when it has none).
    user_name: Option<String>,
    mps_share: u32,
    memory_mib: u64,
    /// GPU time its kernels took per second of wall time, in percent (over the last
    /// interval); `None` on the first frame.
    gpu_pct: Option<f64>,
    /// Time its launches spent held by the gate per second, in percent.
    held_pct: Option<f64>,
    kernel_us: u64,
    launches: u64,
}

#[derive(Debug, Serialize)]
struct PartitionRow {
    gpu: u32,
    profile: String,
    start_slice: u32,
    instance_id: u32,
    sm_count: u32,
    memory_mib: u64,
    used_memory_mib: u64,
    jobs: Vec<JobRow>,
}

/// What the previous read said of each job: (kernel us, held us).
type Previous = HashMap<u64, (u64, u64)>;

fn frame(r: &v1::ListPartitionsResponse, prev: Option<(&Previous, Duration)>) -> Vec<PartitionRow> {
    let rate = |id: u64, now: u64, pick: fn(&(u64, u64)) -> u64| -> Option<f64> {
        let (p, dt) = prev?;
        let before = p.get(&id).map_or(0, pick);
        let us = dt.as_micros() as f64;
        (us > 0.0).then(|| (now.saturating_sub(before) as f64 * 100.0 / us).min(999.0))
    };
    r.gpus
        .iter()
        .flat_map(|g| {
            g.partitions.iter().map(move |p| PartitionRow {
                gpu: g.gpu_index,
                profile: p.profile.clone(),
                start_slice: p.start_slice,
                instance_id: p.instance_id,
                sm_count: p.sm_count,
                memory_mib: p.memory_mib,
                used_memory_mib: p.used_memory_mib,
                jobs: p
                    .jobs
                    .iter()
                    .map(|j| JobRow {
                        id: j.job_id,
                        name: j.name.clone(),
                        class: class_name(j.class),
                        state: state_name(j.state),
                        user: j.owner_uid,
                        user_name: j.owner_uid.map(user_name),
                        mps_share: j.mps_share,
                        memory_mib: j.gpu_memory_mib,
                        gpu_pct: rate(j.job_id, j.kernel_us, |p| p.0),
                        held_pct: rate(j.job_id, j.held_us, |p| p.1),
                        kernel_us: j.kernel_us,
                        launches: j.launches,
                    })
                    .collect(),
            })
        })
        .collect()
}

/// The name of user `uid` on this host, or the uid where it has none.
fn user_name(uid: u32) -> String {
    uzers::get_user_by_uid(uid).map_or_else(
        || uid.to_string(),
        |u| u.name().to_string_lossy().into_owned(),
    )
}

fn previous(r: &v1::ListPartitionsResponse) -> Previous {
    r.gpus
        .iter()
        .flat_map(|g| g.partitions.iter())
        .flat_map(|p| p.jobs.iter())
        .map(|j| (j.job_id, (j.kernel_us, j.held_us)))
        .collect()
}

fn pct(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

/// The frame as text.
fn draw(rows: &[PartitionRow], live: bool) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(s, "mmk top{}", if live { "  (q quits)" } else { "" });
    if rows.is_empty() {
        let _ = writeln!(s, "no partitions");
    }
    let mut gpu = None;
    for p in rows {
        if gpu != Some(p.gpu) {
            let _ = writeln!(s, "\nGPU {}", p.gpu);
            gpu = Some(p.gpu);
        }
        let _ = writeln!(
            s,
            "  {}@{}  {} SMs  {} of {} used  {} job(s)",
            p.profile,
            p.start_slice,
            p.sm_count,
            format_mib(p.used_memory_mib),
            format_mib(p.memory_mib),
            p.jobs.len()
        );
        if p.jobs.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "    {:<6} {:<15} {:<7} {:<8} {:<8} {:>5} {:>7} {:>6} {:>6}",
            "JOB", "NAME", "CLASS", "STATE", "USER", "SHARE", "MEMORY", "GPU%", "HELD%"
        );
        let clip = |text: &str, width: usize| -> String {
            if text.chars().count() > width {
                text.chars().take(width - 1).chain(['~']).collect()
            } else {
                text.to_owned()
            }
        };
        for j in &p.jobs {
            let _ = writeln!(
                s,
                "    {:<6} {:<15} {:<7} {:<8} {:<8} {:>4}% {:>7} {:>6} {:>6}",
                j.id,
                clip(&j.name, 15),
                j.class,
                j.state,
                clip(j.user_name.as_deref().unwrap_or("-"), 8),
                j.mps_share,
                format_mib(j.memory_mib),
                pct(j.gpu_pct),
                pct(j.held_pct)
            );
        }
    }
    s
}

/// Standard input in a mode that hands over each key at once, without echo, restored when
/// dropped; `None` when standard input is not a terminal.
struct RawKeys {
    saved: rustix::termios::Termios,
}

impl RawKeys {
    fn new() -> Option<RawKeys> {
        let stdin = std::io::stdin();
        let fd = stdin.as_fd();
        if !rustix::termios::isatty(fd) {
            return None;
        }
        let saved = rustix::termios::tcgetattr(fd).ok()?;
        let mut raw = saved.clone();
        raw.local_modes
            .remove(rustix::termios::LocalModes::ICANON | rustix::termios::LocalModes::ECHO);
        rustix::termios::tcsetattr(fd, rustix::termios::OptionalActions::Now, &raw).ok()?;
        Some(RawKeys { saved })
    }
}

impl Drop for RawKeys {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin().as_fd(),
            rustix::termios::OptionalActions::Now,
            &self.saved,
        );
    }
}

/// The signals that end top, listened for from before the terminal's mode changes until
/// top returns, so that one that comes at any moment (a frame being read included) ends it
/// through the path that restores the terminal.
struct Stops {
    term: Option<tokio::signal::unix::Signal>,
    hup: Option<tokio::signal::unix::Signal>,
    int: Option<tokio::signal::unix::Signal>,
}

impl Stops {
    fn listen() -> Stops {
        let on = |kind| tokio::signal::unix::signal(kind).ok();
        Stops {
            term: on(SignalKind::terminate()),
            hup: on(SignalKind::hangup()),
            int: on(SignalKind::interrupt()),
        }
    }

    /// Resolves when one of the signals comes (never, where none can be listened for).
    async fn any(&mut self) {
        async fn one(s: &mut Option<tokio::signal::unix::Signal>) {
            match s {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = one(&mut self.term) => {}
            () = one(&mut self.hup) => {}
            () = one(&mut self.int) => {}
        }
    }
}

pub async fn run(target: &Target, fmt: Format, args: TopArgs) -> Result<(), Failure> {
    let mut c = connect(target).await?;
    let mut read = async || -> Result<v1::ListPartitionsResponse, Failure> {
        Ok(c.partitions
            .list_partitions(v1::ListPartitionsRequest {})
            .await?
            .into_inner())
    };
    if args.once {
        let first = read().await?;
        let t0 = Instant::now();
        tokio::time::sleep(args.interval).await;
        let second = read().await?;
        let rows = frame(&second, Some((&previous(&first), t0.elapsed())));
        match fmt {
            Format::Json => crate::output::print_json(&rows),
            Format::Table => out!("{}", draw(&rows, false)),
        }
        return Ok(());
    }
    let on_terminal = rustix::termios::isatty(std::io::stdout());
    let mut stops = Stops::listen();
    let _keys = RawKeys::new();
    let (key_tx, mut keys) = tokio::sync::mpsc::unbounded_channel();
    if _keys.is_some() {
        std::thread::spawn(move || {
            let mut b = [0u8; 1];
            while std::io::stdin().read(&mut b).is_ok_and(|n| n == 1) {
                if key_tx.send(b[0]).is_err() {
                    break;
                }
            }
        });
    }
    let mut prev: Option<(Previous, Instant)> = None;
    loop {
        let now = tokio::select! {
            now = read() => now?,
            () = stops.any() => return Ok(()),
        };
        let rows = frame(&now, prev.as_ref().map(|(p, t)| (p, t.elapsed())));
        prev = Some((previous(&now), Instant::now()));
        match fmt {
            Format::Json => crate::output::print_json(&rows),
            // On a terminal: home and clear, then the frame. Elsewhere (a pipe, a log):
            // plain frames, one after the other.
            Format::Table if on_terminal => {
                mmk_cli::stdout::control("\x1b[H\x1b[2J");
                out!("{}", draw(&rows, true));
            }
            Format::Table => outln!("{}", draw(&rows, false)),
        }
        // Every way out returns, so that the terminal's mode is restored (`RawKeys`).
        tokio::select! {
            () = tokio::time::sleep(args.interval) => {}
            k = keys.recv() => if matches!(k, Some(b'q' | b'Q')) { return Ok(()) },
            () = stops.any() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(kernel_us: u64, held_us: u64) -> v1::ListPartitionsResponse {
        v1::ListPartitionsResponse {
            gpus: vec![v1::GpuPartitions {
                gpu_index: 0,
                partitions: vec![v1::Partition {
                    profile: "3g.40gb".into(),
                    start_slice: 4,
                    sm_count: 42,
                    memory_mib: 40 * 1024,
                    used_memory_mib: 10 * 1024,
                    jobs: vec![v1::PartitionJob {
                        job_id: 7,
                        name: "train".into(),
                        class: v1::JobClass::Offline as i32,
                        state: v1::JobState::Running as i32,
                        mps_share: 60,
                        gpu_memory_mib: 10 * 1024,
                        kernel_us,
                        held_us,
                        // A uid no user of a test machine has: shown as the number.
                        owner_uid: Some(4_000_000),
                        ..v1::PartitionJob::default()
                    }],
                    ..v1::Partition::default()
                }],
                ..v1::GpuPartitions::default()
            }],
        }
    }

    #[test]
    fn users_are_named() {
        assert_eq!(user_name(0), "root");
        assert_eq!(user_name(4_000_000), "4000000");
    }

    #[test]
    fn a_frame_shows_each_jobs_gpu_time_over_the_interval() {
        let before = view(1_000_000, 0);
        let after = view(1_500_000, 100_000);
        let rows = frame(&after, Some((&previous(&before), Duration::from_secs(1))));
        let j = &rows[0].jobs[0];
        assert_eq!(j.gpu_pct, Some(50.0));
        assert_eq!(j.held_pct, Some(10.0));
        let text = draw(&rows, false);
        assert!(
            text.contains("\nGPU 0\n  3g.40gb@4  42 SMs  10GiB of 40GiB used  1 job(s)\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "    7      train           offline RUNNING  4000000    60%   10GiB   50.0   10.0\n"
            ),
            "{text}"
        );
        // The first frame has no rates yet.
        assert_eq!(frame(&after, None)[0].jobs[0].gpu_pct, None);
    }
}
