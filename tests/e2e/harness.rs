//! Starting mmkd, running mmkctl, and waiting for job states through WatchJobs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use mmk_proto::v1;
use mmkctl::client::{Clients, Target, connect};
use tokio_stream::StreamExt;

/// How long any wait in these tests may take before the test fails.
pub const PATIENCE: Duration = Duration::from_secs(30);

pub struct Daemon {
    dir: Option<DataDir>,
    pub child: Child,
    /// mmkd's stderr lines, as they come.
    pub log: mpsc::Receiver<String>,
    /// What mmkd logged up to "listening".
    pub startup: Vec<String>,
    pub sim_gpus: String,
}

impl Daemon {
    /// Starts mmkd with the simulated node, 100x faster than real time.
    pub fn start(sim_gpus: &str) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        Daemon::start_in(dir, sim_gpus)
    }

    /// Starts mmkd with extra flags (`--planner mmk`).
    pub fn start_with(sim_gpus: &str, extra: &[&str]) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        Daemon::launch(dir, sim_gpus, extra, &[])
    }

    /// Starts mmkd with extra flags and environment variables.
    pub fn start_with_env(sim_gpus: &str, extra: &[&str], env: &[(&str, &str)]) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        Daemon::launch(dir, sim_gpus, extra, env)
    }

    /// Starts mmkd on an existing data dir (a restart) and waits until it listens.
    pub fn start_in(dir: impl Into<DataDir>, sim_gpus: &str) -> Daemon {
        Daemon::launch(dir, sim_gpus, &[], &[])
    }

    /// A restart with extra flags.
    pub fn start_in_with(dir: impl Into<DataDir>, sim_gpus: &str, extra: &[&str]) -> Daemon {
        Daemon::launch(dir, sim_gpus, extra, &[])
    }

    /// A restart with extra flags and environment variables (a backend other than the
    /// simulated node, say).
    pub fn restart_with_env(
        dir: impl Into<DataDir>,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        Daemon::launch(dir, "", extra, env)
    }

    /// Starts mmkd (with extra flags) where its data dir is a small disk of `size` (`64m`)
    /// that only mmkd and its jobs see ([`SmallDisk`]); a restart on the returned daemon's
    /// folder sees the same disk. `None` (and why, printed) where no such disk can be
    /// made; under CI that fails.
    pub fn start_on_small_disk(sim_gpus: &str, extra: &[&str], size: &str) -> Option<Daemon> {
        let dir = tempfile::tempdir().expect("tempdir");
        let disk = SmallDisk::mount(&dir.path().join("data"), size)?;
        let dir = DataDir {
            dir,
            disk: Some(disk),
        };
        Some(Daemon::launch(dir, sim_gpus, extra, &[]))
    }

    /// Starts mmkd on `dir` (inside its small disk's namespace where it has one).
    fn launch(
        dir: impl Into<DataDir>,
        sim_gpus: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Daemon {
        let dir: DataDir = dir.into();
        let mmkd = env!("CARGO_BIN_EXE_mmkd").to_owned();
        let wrap = match &dir.disk {
            Some(disk) => disk.enter(&[&mmkd]),
            None => vec![mmkd],
        };
        // The simulated node, unless the test names a backend.
        let backend: &[&str] = if extra.contains(&"--backend") {
            &[]
        } else {
            &["--backend", "sim", "--sim-gpus", sim_gpus]
        };
        let mut child = Command::new(&wrap[0])
            .args(&wrap[1..])
            .envs(env.iter().copied())
            .args(extra)
            .args(backend)
            .args(["--stop-grace", "2s"])
            // 100 times real time, unless the test says otherwise.
            .args(if extra.contains(&"--sim-speed") {
                &[][..]
            } else {
                &["--sim-speed", "100"][..]
            })
            // No kernel scheduler (whatever target/ holds), unless the test names one.
            .args(
                if extra.contains(&"--interposer") || extra.contains(&"--kernel-policy") {
                    &[][..]
                } else {
                    &["--kernel-policy", "off"][..]
                },
            )
            // No metrics server (tests run side by side), unless the test names an address.
            .args(if extra.contains(&"--metrics") {
                &[][..]
            } else {
                &["--metrics", "off"][..]
            })
            // First fit, whose layouts the tests can state, unless the test names a planner.
            .args(if extra.contains(&"--planner") {
                &[][..]
            } else {
                &["--planner", "first-fit"][..]
            })
            .arg("--socket")
            .arg(dir.path().join("mmkd.sock"))
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("RUST_LOG", "info")
            .env_remove("MMK_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("mmkd starts");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, log) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut d = Daemon {
            dir: Some(dir),
            child,
            log,
            startup: Vec::new(),
            sim_gpus: sim_gpus.to_owned(),
        };
        d.startup = d.wait_log("listening");
        d
    }

    /// Waits for a log line containing `needle`; returns every line read until then.
    pub fn wait_log(&self, needle: &str) -> Vec<String> {
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + PATIENCE;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match self.log.recv_timeout(left) {
                Ok(line) => {
                    let hit = line.contains(needle);
                    seen.push(line);
                    if hit {
                        return seen;
                    }
                }
                Err(_) => break,
            }
        }
        panic!(
            "mmkd never logged {needle:?}; it logged:\n{}",
            seen.join("\n")
        );
    }

    /// The test's temporary directory (socket, data dir, job files).
    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("the daemon owns its dir").path()
    }

    pub fn socket(&self) -> PathBuf {
        self.path().join("mmkd.sock")
    }

    /// The small disk the data dir is on, where it is on one.
    pub fn disk(&self) -> Option<&SmallDisk> {
        self.dir.as_ref().and_then(DataDir::disk)
    }

    pub fn data_dir(&self) -> PathBuf {
        self.path().join("data")
    }

    /// Runs mmkctl against this daemon.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_mmkctl"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .env_remove("MMK_SOCKET")
            .current_dir(self.path())
            .output()
            .expect("mmkctl runs")
    }

    /// Runs mmkctl with `--output json` and parses what it printed.
    pub fn ctl_json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = vec!["--output", "json"];
        all.extend_from_slice(args);
        let out = self.ctl(&all);
        assert!(
            out.status.success(),
            "mmkctl {args:?} failed: {}",
            text(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("mmkctl prints JSON")
    }

    /// Writes a job file into the test's directory.
    pub fn job_file(&self, name: &str, yaml: &str) -> String {
        let p = self.path().join(name);
        std::fs::write(&p, yaml).expect("write job file");
        p.display().to_string()
    }

    /// Submits a job file with mmkctl; returns the new job's ID.
    pub fn submit(&self, flag: &str, yaml: &str) -> u64 {
        let file = self.job_file(&format!("job-{}.yaml", rand_suffix()), yaml);
        let v = self.ctl_json(&["submit", flag, &file]);
        v["id"].as_u64().expect("job id")
    }

    pub async fn clients(&self) -> Clients {
        connect(&Target::Socket(self.socket()))
            .await
            .unwrap_or_else(|e| panic!("connect: {}", e.message))
    }

    /// Waits for mmkd to exit by itself (an injected crash); returns its directory.
    pub fn wait_exit(mut self) -> (std::process::ExitStatus, DataDir) {
        let status = self.child.wait().expect("mmkd exits");
        (status, self.dir.take().expect("the daemon owns its dir"))
    }

    /// SIGKILL: the crash case.
    pub fn kill_9(mut self) -> DataDir {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.dir.take().expect("the daemon owns its dir")
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(mut self) -> (std::process::ExitStatus, DataDir) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        let status = self.child.wait().expect("mmkd exits");
        (status, self.dir.take().expect("the daemon owns its dir"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let lines: Vec<String> = self.log.try_iter().collect();
            eprintln!(
                "--- mmkd's log ---\n{}\n--- end of mmkd's log ---",
                lines.join("\n")
            );
        }
    }
}

/// A daemon's folder (socket, data dir), and the small disk its data dir is on where it
/// has one. Dropped, it stops what a killed mmkd left running there (its fake MPS control
/// daemons, which live on by design, and a job's processes outside its group) before the
/// folder goes.
#[derive(Debug)]
pub struct DataDir {
    dir: tempfile::TempDir,
    disk: Option<SmallDisk>,
}

impl DataDir {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The small disk the data dir is on, where it is on one.
    pub fn disk(&self) -> Option<&SmallDisk> {
        self.disk.as_ref()
    }
}

impl From<tempfile::TempDir> for DataDir {
    fn from(dir: tempfile::TempDir) -> DataDir {
        DataDir { dir, disk: None }
    }
}

impl Drop for DataDir {
    fn drop(&mut self) {
        kill_processes_of(self.dir.path());
        // The jobs' cgroups of an mmkd killed with SIGKILL (the data dir is `data`).
        mmkd::cgroup::remove_left_by(&self.dir.path().join("data"));
    }
}

/// A tmpfs of a given size at a data dir, in a mount namespace of its own that a holder
/// process keeps for as long as this lives: what runs through [`SmallDisk::enter`] (each
/// mmkd started on it, restarts included, and their jobs) sees the same small disk; the
/// rest of the machine sees an empty folder.
#[derive(Debug)]
pub struct SmallDisk {
    holder: Child,
    at: PathBuf,
}

impl SmallDisk {
    /// Mounts it at `at` (made here). `None` (and why, printed) where no private mount
    /// namespace with a tmpfs can be made; under CI that fails.
    pub fn mount(at: &Path, size: &str) -> Option<SmallDisk> {
        std::fs::create_dir_all(at).expect("the small disk's folder");
        let fail = |why: String| {
            assert!(
                std::env::var_os("CI").is_none(),
                "no private mount namespace with a tmpfs: {why}"
            );
            eprintln!("skipped: no private mount namespace with a tmpfs here ({why})");
        };
        let mut holder = match Command::new("unshare")
            .args(["-m", "--propagation", "private", "--", "sh", "-c"])
            .arg("mount -t tmpfs -o size=\"$1\",mode=755 tmpfs \"$0\" && echo mounted && exec sleep 100000")
            .arg(at)
            .arg(size)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(c) => c,
            Err(e) => {
                fail(format!("unshare: {e}"));
                return None;
            }
        };
        let mut line = String::new();
        let _ = BufReader::new(holder.stdout.take().expect("piped stdout")).read_line(&mut line);
        if line.trim() != "mounted" {
            let _ = holder.kill();
            let out = holder.wait_with_output().expect("unshare ends");
            fail(text(&out.stderr));
            return None;
        }
        Some(SmallDisk {
            holder,
            at: at.to_owned(),
        })
    }

    /// `command` run inside the disk's namespace.
    pub fn enter(&self, command: &[&str]) -> Vec<String> {
        let mut v: Vec<String> = ["nsenter", "-t", &self.holder.id().to_string(), "-m", "--"]
            .iter()
            .map(|s| (*s).to_owned())
            .collect();
        v.extend(command.iter().map(|s| (*s).to_owned()));
        v
    }

    /// Runs the shell script `script` inside the disk's namespace, with `$0` the disk's
    /// folder (`dd ... of="$0/fill"`).
    pub fn sh(&self, script: &str) -> Output {
        let at = self.at.display().to_string();
        let argv = self.enter(&["sh", "-c", script, &at]);
        Command::new(&argv[0])
            .args(&argv[1..])
            .output()
            .expect("nsenter runs")
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// Kills every process whose environment names a folder under `dir` as its MPS pipe
/// directory or its job's log directory.
pub fn kill_processes_of(dir: &Path) {
    let markers = [
        format!("CUDA_MPS_PIPE_DIRECTORY={}/", dir.display()),
        format!("MMK_LOG_DIR={}/", dir.display()),
    ];
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return;
    };
    let me = std::process::id();
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(p.path().join("environ")) else {
            continue;
        };
        let ours = env
            .split(|b| *b == 0)
            .any(|var| markers.iter().any(|m| var.starts_with(m.as_bytes())));
        if ours {
            // SAFETY: kill(2) with a pid read from /proc and a signal number.
            unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        }
    }
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Polls `f` until it gives a value; fails the test after [`PATIENCE`].
pub fn wait_for<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits, through WatchJobs, until job `id` is in `state`; returns the job then.
pub async fn wait_state(c: &mut Clients, id: u64, state: v1::JobState) -> v1::Job {
    let fut = async {
        let mut stream = c
            .jobs
            .watch_jobs(v1::WatchJobsRequest {
                job_id: id,
                include_current: true,
            })
            .await
            .expect("watch")
            .into_inner();
        let mut seen = Vec::new();
        while let Some(ev) = stream.next().await {
            let job = ev.expect("event").job.expect("job in event");
            if job.state == state as i32 {
                return job;
            }
            seen.push((job.state, job.reason.clone()));
            let st = v1::JobState::try_from(job.state).unwrap_or(v1::JobState::Unspecified);
            assert!(
                !matches!(
                    st,
                    v1::JobState::Succeeded | v1::JobState::Failed | v1::JobState::Cancelled
                ),
                "job {id} ended as {st:?} ({}) while waiting for {state:?}",
                job.reason
            );
        }
        panic!("watch ended before job {id} became {state:?}; saw {seen:?}");
    };
    tokio::time::timeout(PATIENCE, fut)
        .await
        .unwrap_or_else(|_| panic!("job {id} did not become {state:?} in time"))
}

/// (launch_ns, start_ns, end_ns) of each kernel in a fake driver's log.
pub fn kernels_in(log: &Path) -> Vec<(u64, u64, u64)> {
    let text = std::fs::read_to_string(log)
        .unwrap_or_else(|e| panic!("the fake driver's log {}: {e}", log.display()));
    text.lines()
        .map(|line| {
            let f: Vec<u64> = line
                .split(',')
                .skip(3)
                .take(3)
                .map(|v| v.parse().unwrap_or_else(|_| panic!("{line:?}")))
                .collect();
            (f[0], f[1], f[2])
        })
        .collect()
}
