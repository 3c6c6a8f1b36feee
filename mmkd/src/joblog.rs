//! A command job's directory under the data dir, and its capped logs.
//!
//! mmkd runs as root; a job runs as its owner and is hostile input. The layout keeps every
//! path that mmkd (as root) opens or changes out of the job's reach:
//!
//! ```text
//! DATA_DIR/jobs/            root, 0711
//! DATA_DIR/jobs/<id>/       root, 0711: only mmkd creates, renames or removes entries here
//!   stdout.log, stderr.log  the owner's, 0600: written by mmkd from the job's pipes
//!   stdout.log.1, ...       the previous part of each, once the live file reached its cap
//!   work/                   the owner's, 0700: the default working directory, the
//!                           interposer's stats (ksched-<pid>.json); mmkd never opens
//!                           anything inside it
//! ```
//!
//! Every file is opened relative to the job directory's descriptor with `O_NOFOLLOW`, and a
//! log that is not a plain file with one link is refused: even a directory left by an
//! older mmkd, which gave the job's user the job directory, cannot point mmkd elsewhere.
//! Ownership changes go through the opened descriptor (`fchown`), never through a path.
//!
//! The job writes its output into pipes; one thread per stream copies it into the log and
//! keeps the log under its cap: when the live file reaches its share of the cap it becomes
//! `<name>.1` (the part before that is dropped) and the new file starts with a note.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, FileType, Gid, Mode, OFlags, Uid};

use crate::job::Owner;

/// The most a job's logs take on disk when no setting says: 256 MiB, shared by stdout and
/// stderr, each with its live file and its previous part.
pub const DEFAULT_JOB_LOG_MAX: u64 = 256 * 1024 * 1024;
/// The least `job_log_max` may be: 1 MiB.
pub const MIN_JOB_LOG_MAX: u64 = 1024 * 1024;

/// The job directory's subdirectory that belongs to the job's user.
pub const WORK_DIR: &str = "work";

/// Why a job directory or log could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum JobDirError {
    #[error("cannot {what} {path}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} is not a plain file with one link; mmkd does not write it")]
    NotPlain { path: PathBuf },
    #[error("{path} is not a directory; mmkd does not use it")]
    NotDir { path: PathBuf },
}

type Result<T> = std::result::Result<T, JobDirError>;

fn io<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(rustix::io::Errno) -> JobDirError + 'a {
    move |e| JobDirError::Io {
        what,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// An open job directory. Everything inside it is reached through its descriptor.
#[derive(Debug)]
pub struct JobDir {
    fd: OwnedFd,
    path: PathBuf,
    /// Who the job runs as, when mmkd runs as root; `None`: the job runs as mmkd.
    owner: Option<Owner>,
}

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Opens `name` under `parent` as a directory, making it with `mode` first if it is not
/// there; never through a link.
fn open_dir(parent: &OwnedFd, parent_path: &Path, name: &str, mode: Mode) -> Result<OwnedFd> {
    let path = parent_path.join(name);
    match rustix::fs::mkdirat(parent, name, mode) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(e) => return Err(io("create", &path)(e)),
    }
    match rustix::fs::openat(parent, name, DIR_FLAGS, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            Err(JobDirError::NotDir { path })
        }
        Err(e) => Err(io("open", &path)(e)),
    }
}

impl JobDir {
    /// Makes (or opens again, on a restart) `jobs_dir/<job>` for a job of `owner`: the
    /// job directory is mmkd's, its `work/` and its logs the owner's.
    pub fn prepare(jobs_dir: &Path, job: u64, owner: Option<Owner>) -> Result<JobDir> {
        std::fs::create_dir_all(jobs_dir).map_err(|source| JobDirError::Io {
            what: "create",
            path: jobs_dir.to_path_buf(),
            source,
        })?;
        let jobs =
            rustix::fs::open(jobs_dir, DIR_FLAGS, Mode::empty()).map_err(io("open", jobs_dir))?;
        rustix::fs::fchmod(&jobs, Mode::from_raw_mode(0o711)).map_err(io("chmod", jobs_dir))?;
        let name = job.to_string();
        let path = jobs_dir.join(&name);
        let fd = open_dir(&jobs, jobs_dir, &name, Mode::from_raw_mode(0o711))?;
        // A directory an older mmkd gave to the job's user becomes mmkd's again.
        let me = (rustix::process::geteuid(), rustix::process::getegid());
        let st = rustix::fs::fstat(&fd).map_err(io("read", &path))?;
        if st.st_uid != me.0.as_raw() {
            rustix::fs::fchown(&fd, Some(me.0), Some(me.1)).map_err(io("chown", &path))?;
        }
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o711)).map_err(io("chmod", &path))?;
        let dir = JobDir {
            fd,
            path,
            owner: owner.filter(|_| crate::os::running_as_root()),
        };
        let work = open_dir(&dir.fd, &dir.path, WORK_DIR, Mode::from_raw_mode(0o700))?;
        dir.give(&work, &dir.path.join(WORK_DIR))?;
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The job's own directory (`work/`).
    pub fn work_dir(&self) -> PathBuf {
        self.path.join(WORK_DIR)
    }

    /// Gives an open file or directory to the job's owner.
    fn give(&self, fd: &OwnedFd, path: &Path) -> Result<()> {
        if let Some(o) = self.owner {
            rustix::fs::fchown(fd, Some(Uid::from_raw(o.uid)), Some(Gid::from_raw(o.gid)))
                .map_err(io("chown", path))?;
        }
        Ok(())
    }

    /// Opens the log `name` for appending (creating it), the owner's and mode 0600.
    fn open_log(&self, name: &str) -> Result<File> {
        let path = self.path.join(name);
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY
                | OFlags::APPEND
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => JobDirError::NotPlain { path: path.clone() },
            e => io("open", &path)(e),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io("read", &path))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile || st.st_nlink != 1 {
            return Err(JobDirError::NotPlain { path });
        }
        // Opened non-blocking so that a FIFO planted there cannot hold mmkd; a plain file
        // ignores the flag, but clear it all the same.
        rustix::fs::fcntl_setfl(&fd, OFlags::APPEND).map_err(io("open", &path))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o600)).map_err(io("chmod", &path))?;
        self.give(&fd, &path)?;
        Ok(File::from(fd))
    }

    /// Moves the live log `name` to `name.1`, replacing the previous part; returns how
    /// many bytes that dropped.
    fn rotate(&self, name: &str) -> Result<u64> {
        let old = format!("{name}.1");
        let dropped = rustix::fs::statat(&self.fd, &old, AtFlags::SYMLINK_NOFOLLOW)
            .map(|st| st.st_size.max(0) as u64)
            .unwrap_or(0);
        rustix::fs::renameat(&self.fd, name, &self.fd, &old)
            .map_err(io("rotate", &self.path.join(name)))?;
        Ok(dropped)
    }
}

/// Creates a pipe for one of the job's streams: the read end for [`copy`], the write end
/// for the job (close-on-exec until it is given to the child as fd 1 or 2).
pub fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    pipe_pair()
}

fn pipe_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    Ok(rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?)
}

/// A running copier: `done` resolves once everything the job wrote is in the file;
/// dropping `stop` ends the copier early (a process that left the job's group and keeps
/// its output open must not keep a thread and the log file for ever).
#[derive(Debug)]
pub struct Copier {
    pub done: tokio::sync::oneshot::Receiver<()>,
    pub stop: OwnedFd,
}

/// The copier of one stream: reads the job's pipe until every writer closed it, or until
/// it is stopped, and keeps `name` under `cap` bytes (the live file's share). Runs on a
/// thread of its own.
pub fn copy(dir: Arc<JobDir>, name: &'static str, cap: u64, pipe: OwnedFd) -> Result<Copier> {
    let mut log = Log::open(dir, name, cap)?;
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let (stop_r, stop_w) = pipe_pair().map_err(|source| JobDirError::Io {
        what: "make the stop pipe of the log copier for",
        path: PathBuf::from(name),
        source,
    })?;
    let mut pipe = File::from(pipe);
    std::thread::Builder::new()
        .name(format!("mmk-log-{name}"))
        .spawn(move || {
            use rustix::event::{PollFd, PollFlags};
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let mut fds = [
                    PollFd::new(&pipe, PollFlags::IN),
                    PollFd::new(&stop_r, PollFlags::IN),
                ];
                match rustix::event::poll(&mut fds, None) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => {
                        tracing::warn!(log = %log.path().display(), error = %e, "cannot wait for a job's output");
                        break;
                    }
                }
                let (data, stopped) = (!fds[0].revents().is_empty(), !fds[1].revents().is_empty());
                if data {
                    match pipe.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => log.write(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => {
                            tracing::warn!(log = %log.path().display(), error = %e, "cannot read a job's output");
                            break;
                        }
                    }
                }
                // Stopped: at most the one read above, then the end, however much a
                // process outside the job's group still writes.
                if stopped {
                    log.write(
                        b"[mmk: the job ended; a process outside its group still holds its output, which is not kept]\n",
                    );
                    break;
                }
            }
            log.finish();
            let _ = done_tx.send(());
        })
        .map_err(|source| JobDirError::Io {
            what: "start the log copier for",
            path: PathBuf::from(name),
            source,
        })?;
    Ok(Copier {
        done: done_rx,
        stop: stop_w,
    })
}

/// One log file under its cap.
#[derive(Debug)]
struct Log {
    dir: Arc<JobDir>,
    name: &'static str,
    cap: u64,
    file: Option<File>,
    /// Bytes in the live file.
    size: u64,
    /// Output lost to write errors (a full disk) since the last note.
    lost: u64,
    lost_why: Option<String>,
    /// A warning about this log went to mmkd's log already.
    warned: bool,
}

impl Log {
    fn open(dir: Arc<JobDir>, name: &'static str, cap: u64) -> Result<Log> {
        let file = dir.open_log(name)?;
        let size = file.metadata().map_or(0, |m| m.len());
        Ok(Log {
            dir,
            name,
            cap,
            file: Some(file),
            size,
            lost: 0,
            lost_why: None,
            warned: false,
        })
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join(self.name)
    }

    fn write(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.size >= self.cap {
                self.rotate();
            }
            let room = usize::try_from(self.cap.saturating_sub(self.size))
                .unwrap_or(usize::MAX)
                .max(1);
            let (now, rest) = data.split_at(room.min(data.len()));
            if self.lost > 0 {
                let note = format!(
                    "[mmk: {} bytes of output were lost here: {}]\n",
                    self.lost,
                    self.lost_why.as_deref().unwrap_or("unknown error")
                );
                if self.put(note.as_bytes()) {
                    self.lost = 0;
                    self.lost_why = None;
                }
            }
            if !self.put(now) {
                self.lost += now.len() as u64;
            }
            data = rest;
        }
    }

    /// Appends to the live file; false (and the reason kept) when the write failed.
    fn put(&mut self, data: &[u8]) -> bool {
        let Some(f) = self.file.as_mut() else {
            return false;
        };
        match f.write_all(data) {
            Ok(()) => {
                self.size += data.len() as u64;
                true
            }
            Err(e) => {
                let size = f.metadata().map_or(self.size, |m| m.len());
                if self.lost_why.is_none() && !self.warned {
                    self.warned = true;
                    tracing::warn!(log = %self.path().display(), error = %e, "cannot write a job's log; its output is dropped until the write succeeds");
                }
                self.lost_why = Some(e.to_string());
                // A partial write moved the end of the file: read where it is now.
                self.size = size;
                false
            }
        }
    }

    fn rotate(&mut self) {
        self.file = None;
        let rotated = self.dir.rotate(self.name);
        let f = match self.dir.open_log(self.name) {
            Ok(f) => f,
            Err(e) => {
                // Output is dropped (and counted) until a later rotation reopens the log.
                self.warn_once("cannot reopen a job's log after rotating it", &e);
                return;
            }
        };
        let note = match rotated {
            Ok(0) => format!(
                "[mmk: the log reached its cap; the previous part is {}.1]\n",
                self.name
            ),
            Ok(dropped) => format!(
                "[mmk: the log reached its cap; the previous part is {n}.1 and {dropped} older bytes were dropped]\n",
                n = self.name
            ),
            Err(e) => {
                // Without the rename the live file stays full: it starts over, so that the
                // cap holds.
                self.warn_once("cannot rotate a job's log; it starts over", &e);
                if let Err(e) = f.set_len(0) {
                    self.warn_once(
                        "cannot empty a job's log at its cap; its output is dropped",
                        &e,
                    );
                    return;
                }
                format!(
                    "[mmk: the log reached its cap and could not be rotated ({}); its earlier output was dropped]\n",
                    crate::error::chain(&e)
                )
            }
        };
        self.size = f.metadata().map_or(0, |m| m.len());
        self.file = Some(f);
        self.put(note.as_bytes());
    }

    /// Warns of a log's trouble once in its life: a log that fails at every write must not
    /// flood mmkd's log.
    fn warn_once(&mut self, what: &str, e: &dyn std::error::Error) {
        if !self.warned {
            self.warned = true;
            tracing::warn!(log = %self.path().display(), error = %crate::error::chain(e), "{what}");
        }
    }

    fn finish(&mut self) {
        if self.lost > 0 {
            let note = format!(
                "[mmk: {} bytes of output were lost at the end: {}]\n",
                self.lost,
                self.lost_why.as_deref().unwrap_or("unknown error")
            );
            self.put(note.as_bytes());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p)
            .expect("stat")
            .permissions()
            .mode()
            & 0o7777
    }

    #[test]
    fn the_job_dir_is_mmkds_and_its_work_dir_the_jobs() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let jobs = tmp.path().join("jobs");
        let d = JobDir::prepare(&jobs, 7, None).expect("prepared");
        assert_eq!(d.path(), jobs.join("7"));
        assert_eq!(mode(&jobs), 0o711);
        assert_eq!(mode(&jobs.join("7")), 0o711);
        assert_eq!(mode(&jobs.join("7/work")), 0o700);
        let f = d.open_log("stdout.log").expect("log");
        drop(f);
        assert_eq!(mode(&jobs.join("7/stdout.log")), 0o600);
        // Again, as on a restart.
        JobDir::prepare(&jobs, 7, None).expect("prepared again");
    }

    #[test]
    fn a_log_that_is_a_link_is_refused_and_its_target_untouched() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let jobs = tmp.path().join("jobs");
        let d = JobDir::prepare(&jobs, 1, None).expect("prepared");
        let target = tmp.path().join("precious");
        std::fs::write(&target, "root's\n").expect("write");
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).expect("chmod");
        std::os::unix::fs::symlink(&target, jobs.join("1/stdout.log")).expect("symlink");
        let err = d.open_log("stdout.log").expect_err("a link");
        assert!(matches!(err, JobDirError::NotPlain { .. }), "{err}");
        // A hard link to someone else's file is refused too.
        std::fs::hard_link(&target, jobs.join("1/stderr.log")).expect("link");
        let err = d.open_log("stderr.log").expect_err("a hard link");
        assert!(matches!(err, JobDirError::NotPlain { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&target).expect("read"), "root's\n");
        assert_eq!(mode(&target), 0o640);
    }

    #[test]
    fn a_job_dir_that_is_a_link_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let jobs = tmp.path().join("jobs");
        std::fs::create_dir_all(&jobs).expect("mkdir");
        let elsewhere = tmp.path().join("etc");
        std::fs::create_dir(&elsewhere).expect("mkdir");
        std::os::unix::fs::symlink(&elsewhere, jobs.join("3")).expect("symlink");
        let err = JobDir::prepare(&jobs, 3, None).expect_err("a link");
        assert!(matches!(err, JobDirError::NotDir { .. }), "{err}");
        assert_eq!(mode(&elsewhere) & 0o777, mode(&elsewhere) & 0o777);
        assert!(!elsewhere.join("work").exists());
    }

    #[test]
    fn a_log_that_cannot_rotate_starts_over_and_keeps_its_cap() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = Arc::new(JobDir::prepare(&tmp.path().join("jobs"), 3, None).expect("prepared"));
        // A directory where the previous part would go: the rename fails.
        std::fs::create_dir_all(d.path().join("stdout.log.1/x")).expect("mkdir");
        let mut log = Log::open(Arc::clone(&d), "stdout.log", 1000).expect("log");
        for i in 0..500 {
            log.write(format!("line {i:04} of output, padded to some length\n").as_bytes());
        }
        log.finish();
        let live = d.path().join("stdout.log");
        let size = std::fs::metadata(&live).expect("live").size();
        assert!(size <= 1000 + 300, "{size}");
        let text = std::fs::read_to_string(&live).expect("read");
        assert!(
            text.starts_with("[mmk: the log reached its cap and could not be rotated ("),
            "{text}"
        );
        assert!(
            text.contains("line 0499"),
            "the newest output is kept: {text}"
        );
        assert_eq!(text.matches("[mmk:").count(), 1, "{text}");
    }

    #[test]
    fn a_log_over_its_cap_rotates_and_says_so() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = Arc::new(JobDir::prepare(&tmp.path().join("jobs"), 2, None).expect("prepared"));
        let mut log = Log::open(Arc::clone(&d), "stdout.log", 1000).expect("log");
        for i in 0..100 {
            log.write(format!("line {i:04} of output, padded to some length\n").as_bytes());
        }
        log.finish();
        let live = d.path().join("stdout.log");
        let prev = d.path().join("stdout.log.1");
        assert!(std::fs::metadata(&live).expect("live").size() <= 1000 + 200);
        assert!(std::fs::metadata(&prev).expect("prev").size() <= 1000 + 200);
        let text = std::fs::read_to_string(&live).expect("read");
        assert!(
            text.starts_with(
                "[mmk: the log reached its cap; the previous part is stdout.log.1 and "
            ),
            "{text}"
        );
        assert!(
            text.contains("line 0099"),
            "the newest output is kept: {text}"
        );
        let all = text + &std::fs::read_to_string(&prev).expect("read");
        assert!(!all.contains("line 0000"), "the oldest output is dropped");
    }
}
