//! The seam to the MPS control program: start a daemon, send it commands.

use std::ffi::OsString;
use std::fmt;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use thiserror::Error;

use crate::PID_FILE;

#[derive(Debug, Error)]
pub enum MpsError {
    #[error("cannot run {program}")]
    Spawn {
        program: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{program} did not finish {what} within {after:?}")]
    Timeout {
        program: String,
        what: String,
        after: Duration,
    },
    #[error("{program} -d failed: {output}")]
    StartFailed { program: String, output: String },
    #[error("control command {command:?} failed: {output}")]
    Command { command: String, output: String },
    #[error("unexpected reply to {command:?}: {reply:?}")]
    Reply { command: String, reply: String },
    #[error("the control daemon for {pipe} wrote no pid file within {after:?}")]
    NoPid { pipe: PathBuf, after: Duration },
    #[error("cannot prepare {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T> = std::result::Result<T, MpsError>;

/// Where one control daemon keeps its pipes and its logs
/// (`CUDA_MPS_PIPE_DIRECTORY`, `CUDA_MPS_LOG_DIRECTORY`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dirs {
    pub pipe: PathBuf,
    pub log: PathBuf,
}

impl Dirs {
    /// `root/pipe` and `root/log`.
    pub fn under(root: &Path) -> Dirs {
        Dirs {
            pipe: root.join("pipe"),
            log: root.join("log"),
        }
    }

    /// The pid in the daemon's pid file, when there is one.
    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pipe.join(PID_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Creates both directories. The pipe directory is readable by everyone: a job runs
    /// as its submitter and must reach the daemon's pipes.
    pub fn create(&self) -> Result<()> {
        for d in [&self.pipe, &self.log] {
            std::fs::create_dir_all(d).map_err(|source| MpsError::Io {
                path: d.clone(),
                source,
            })?;
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).map_err(
                |source| MpsError::Io {
                    path: d.clone(),
                    source,
                },
            )?;
        }
        Ok(())
    }
}

/// What `get_server_status <pid>` says of a server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerStatus {
    /// Accepting clients.
    Active,
    /// Anything else, as the daemon wrote it (after a client's fatal fault a server
    /// refuses new clients until the faulting ones exit).
    NotReady(String),
}

impl ServerStatus {
    /// A status word (`ACTIVE`, ...); `None` for anything else, such as the real daemon's
    /// `Server 510 not found` for a server that exited meanwhile (its client exits 0).
    pub fn parse(reply: &str) -> Option<ServerStatus> {
        let word = reply.trim();
        if word.is_empty() || !word.chars().all(|c| c.is_ascii_uppercase() || c == '_') {
            return None;
        }
        Some(match word {
            "ACTIVE" => ServerStatus::Active,
            other => ServerStatus::NotReady(other.to_owned()),
        })
    }
}

/// A memory value as MPS takes and prints it (`4G`, `4096M`, `512MB`, `1024`): bytes.
pub fn parse_mem(v: &str) -> Option<u64> {
    let v = v.trim();
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &v[digits.len()..];
    let n: u64 = digits.parse().ok()?;
    let mult: u64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" => 1 << 10,
        "M" | "MB" => 1 << 20,
        "G" | "GB" => 1 << 30,
        "T" | "TB" => 1 << 40,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// Bytes as the real daemon prints a limit: whole units of the largest unit that fits,
/// rounded down. Seen on an H200: 4096M is read back as `4G`, 143771M as `140G`.
pub fn format_mem(bytes: u64) -> String {
    for (unit, size) in [("G", 1u64 << 30), ("M", 1 << 20), ("K", 1 << 10)] {
        if bytes >= size {
            return format!("{}{unit}", bytes / size);
        }
    }
    bytes.to_string()
}

/// The pids of a `get_server_list` or `get_client_list` reply, one per line.
pub fn parse_pids(command: &str, reply: &str) -> Result<Vec<u32>> {
    reply
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            l.parse().map_err(|_| MpsError::Reply {
                command: command.to_owned(),
                reply: reply.to_owned(),
            })
        })
        .collect()
}

/// A program that speaks the MPS control protocol.
pub trait MpsControl: Send + Sync + fmt::Debug {
    /// What runs, for logs and errors.
    fn name(&self) -> String;

    /// Starts a control daemon with these directories for `device` (what
    /// `CUDA_VISIBLE_DEVICES` names: a MIG device or a GPU UUID); returns once the
    /// program said it started. The daemon writes its pid file soon after.
    fn start_daemon(&self, dirs: &Dirs, device: &str) -> Result<()>;

    /// Sends one control command to the daemon of `dirs`; returns its reply.
    fn send(&self, dirs: &Dirs, command: &str) -> Result<String>;
}

/// Runs a control program: `nvidia-cuda-mps-control`, or the fake (possibly behind a
/// prefix of arguments, as in `mmkd fake-mps-control`).
#[derive(Debug, Clone)]
pub struct Program {
    path: PathBuf,
    prefix: Vec<OsString>,
    timeout: Duration,
}

/// How long one start or one command may take before the program is killed.
const PROGRAM_TIMEOUT: Duration = Duration::from_secs(10);

impl Program {
    pub fn new(path: impl Into<PathBuf>) -> Program {
        Program::with_prefix(path, Vec::new())
    }

    pub fn with_prefix(path: impl Into<PathBuf>, prefix: Vec<OsString>) -> Program {
        Program {
            path: path.into(),
            prefix,
            timeout: PROGRAM_TIMEOUT,
        }
    }

    fn command(&self, dirs: &Dirs) -> Command {
        let mut c = Command::new(&self.path);
        c.args(&self.prefix)
            .env("CUDA_MPS_PIPE_DIRECTORY", &dirs.pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &dirs.log);
        c
    }

    /// Runs `cmd` with `input` on stdin; kills it after the timeout.
    fn run(&self, mut cmd: Command, input: &str, what: &str) -> Result<Output> {
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|source| MpsError::Spawn {
            program: self.name(),
            source,
        })?;
        if let Some(mut stdin) = child.stdin.take() {
            // A program that exits without reading gives EPIPE: its output says why.
            let _ = stdin.write_all(input.as_bytes());
        }
        let pid = child.id();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(child.wait_with_output());
        });
        match rx.recv_timeout(self.timeout) {
            Ok(out) => out.map_err(|source| MpsError::Spawn {
                program: self.name(),
                source,
            }),
            Err(_) => {
                // SAFETY: kill(2) of our own child, which is not reaped until the waiting
                // thread returns.
                unsafe { libc::kill(pid as i32, libc::SIGKILL) };
                let _ = rx.recv();
                Err(MpsError::Timeout {
                    program: self.name(),
                    what: what.to_owned(),
                    after: self.timeout,
                })
            }
        }
    }
}

fn text(out: &Output) -> String {
    let mut s = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let err = String::from_utf8_lossy(&out.stderr);
    if !err.trim().is_empty() {
        if !s.is_empty() {
            s.push_str("; ");
        }
        s.push_str(err.trim());
    }
    if s.is_empty() {
        s = format!("exit status {}", out.status);
    }
    s
}

impl MpsControl for Program {
    fn name(&self) -> String {
        let mut s = self.path.display().to_string();
        for a in &self.prefix {
            s.push(' ');
            s.push_str(&a.to_string_lossy());
        }
        s
    }

    fn start_daemon(&self, dirs: &Dirs, device: &str) -> Result<()> {
        dirs.create()?;
        let mut cmd = self.command(dirs);
        cmd.arg("-d").env("CUDA_VISIBLE_DEVICES", device);
        let out = self.run(cmd, "", "starting")?;
        if !out.status.success() {
            return Err(MpsError::StartFailed {
                program: self.name(),
                output: text(&out),
            });
        }
        Ok(())
    }

    fn send(&self, dirs: &Dirs, command: &str) -> Result<String> {
        let out = self.run(self.command(dirs), &format!("{command}\n"), command)?;
        let reply = String::from_utf8_lossy(&out.stdout).into_owned();
        // The real client exits 0 after an unknown command; its reply says so.
        if !out.status.success() || reply.starts_with("Unknown command") {
            return Err(MpsError::Command {
                command: command.to_owned(),
                output: text(&out),
            });
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_lists_and_statuses_parse() {
        assert_eq!(
            parse_pids("get_server_list", "12\n 34 \n\n").unwrap(),
            [12, 34]
        );
        assert_eq!(
            parse_pids("get_server_list", "").unwrap(),
            Vec::<u32>::new()
        );
        let err = parse_pids("get_server_list", "12\nboom\n").unwrap_err();
        assert!(err.to_string().contains("boom"), "{err}");
        assert_eq!(ServerStatus::parse("ACTIVE\n"), Some(ServerStatus::Active));
        assert_eq!(
            ServerStatus::parse("FAULT"),
            Some(ServerStatus::NotReady("FAULT".into()))
        );
        assert_eq!(ServerStatus::parse("Server 510 not found"), None);
        assert_eq!(ServerStatus::parse("A server PID is required"), None);
    }

    #[test]
    fn memory_values_read_and_print_like_mps() {
        assert_eq!(parse_mem("4G"), Some(4 << 30));
        assert_eq!(parse_mem("512M"), Some(512 << 20));
        assert_eq!(parse_mem("512MB\n"), Some(512 << 20));
        assert_eq!(parse_mem("1024"), Some(1024));
        assert_eq!(parse_mem("4Q"), None);
        assert_eq!(parse_mem("G"), None);
        // As seen on an H200: 4096M set, 4G read back; 143771M set, 140G read back.
        assert_eq!(format_mem(4096 << 20), "4G");
        assert_eq!(format_mem(143_771 << 20), "140G");
        assert_eq!(format_mem(512 << 20), "512M");
        assert_eq!(format_mem(1000), "1000");
    }

    #[test]
    fn a_missing_program_is_named() {
        let p = Program::new("/nonexistent/nvidia-cuda-mps-control");
        let dir = tempfile::tempdir().unwrap();
        let err = p
            .send(&Dirs::under(dir.path()), "get_server_list")
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("/nonexistent/nvidia-cuda-mps-control"),
            "{err}"
        );
    }
}
