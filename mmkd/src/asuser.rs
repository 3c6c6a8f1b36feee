//! Reading a file that a job names (its `command.kernel_profile`) with the rights of the
//! job's user, never with root's.
//!
//! A root mmkd reads such a file on a thread of its own whose file-system identity is the
//! job's (`setfsuid`/`setfsgid` and an empty group list, all per thread in Linux: the
//! rest of mmkd keeps root's rights). Without root's `CAP_DAC_OVERRIDE` the kernel checks
//! the user's rights, so a file the user may not read is refused just as it would be to
//! the job, and a path inside a folder the user cannot search says so whether or not the
//! file exists. The file is opened non-blocking (a FIFO cannot hold the open), must be a
//! regular file, is read up to a bound, and the whole read has a deadline: a file system
//! that hangs costs one thread, never the scheduling loop.

use std::io::{self, Read as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::job::Owner;

/// How long reading a job's file may take.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// Why a job's file could not be read. The message says what the user would see; it never
/// holds the file's content.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}: not a regular file")]
    NotAFile { path: PathBuf },
    #[error("{path}: {size} bytes; at most {max}")]
    TooLarge { path: PathBuf, size: u64, max: u64 },
    #[error("{path}: not read in {READ_TIMEOUT:?} (a file system that does not answer?)")]
    TimedOut { path: PathBuf },
    #[error("{path}: cannot read it as uid {uid}")]
    Identity { path: PathBuf, uid: u32 },
}

/// Read `path` as the user `owner` would (mmkd's own rights when `owner` is `None`, root,
/// or mmkd is not root), at most `max` bytes, within [`READ_TIMEOUT`].
pub fn read_file(owner: Option<Owner>, path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    read_file_within(owner, path, max, READ_TIMEOUT)
}

fn read_file_within(
    owner: Option<Owner>,
    path: &Path,
    max: u64,
    timeout: Duration,
) -> Result<Vec<u8>, ReadError> {
    let switch = owner.filter(|o| o.uid != 0 && crate::os::running_as_root());
    let owned = path.to_owned();
    within(path, timeout, move || match switch {
        // This thread's identity changes for good: it ends after this one read.
        Some(o) => become_user(o, &owned).and_then(|()| read_bounded(&owned, max)),
        None => read_bounded(&owned, max),
    })
}

/// Run `read` on a thread of its own and wait at most `timeout` for it.
fn within(
    path: &Path,
    timeout: Duration,
    read: impl FnOnce() -> Result<Vec<u8>, ReadError> + Send + 'static,
) -> Result<Vec<u8>, ReadError> {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new()
        .name("mmk-read-as-user".into())
        .spawn(move || {
            let _ = tx.send(read());
        });
    if let Err(source) = spawned {
        return Err(ReadError::Io {
            path: path.to_owned(),
            source,
        });
    }
    match rx.recv_timeout(timeout) {
        Ok(read) => read,
        Err(_) => Err(ReadError::TimedOut {
            path: path.to_owned(),
        }),
    }
}

/// Give this thread (alone) the file-system identity of `o`: its uid and primary gid, no
/// supplementary groups (what the job's processes run with).
fn become_user(o: Owner, path: &Path) -> Result<(), ReadError> {
    let failed = || ReadError::Identity {
        path: path.to_owned(),
        uid: o.uid,
    };
    if crate::os::become_fs_user(o.uid, o.gid) {
        Ok(())
    } else {
        Err(failed())
    }
}

fn read_bounded(path: &Path, max: u64) -> Result<Vec<u8>, ReadError> {
    let io = |source| ReadError::Io {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(io)?;
    let meta = file.metadata().map_err(io)?;
    if !meta.is_file() {
        return Err(ReadError::NotAFile {
            path: path.to_owned(),
        });
    }
    if meta.len() > max {
        return Err(ReadError::TooLarge {
            path: path.to_owned(),
            size: meta.len(),
            max,
        });
    }
    let mut bytes = Vec::new();
    file.take(max.saturating_add(1))
        .read_to_end(&mut bytes)
        .map_err(io)?;
    if bytes.len() as u64 > max {
        return Err(ReadError::TooLarge {
            path: path.to_owned(),
            size: bytes.len() as u64,
            max,
        });
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const NOBODY: Owner = Owner {
        uid: 65534,
        gid: 65534,
    };

    #[test]
    fn a_file_is_read_with_its_bound_and_what_is_not_a_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("profile.json");
        std::fs::write(&p, b"{\"kernels\": []}").unwrap();
        assert_eq!(read_file(None, &p, 1024).unwrap(), b"{\"kernels\": []}");
        let why = read_file(None, &p, 4).unwrap_err().to_string();
        assert!(why.contains("15 bytes; at most 4"), "{why}");
        let why = read_file(None, Path::new("/dev/zero"), 4)
            .unwrap_err()
            .to_string();
        assert!(why.contains("not a regular file"), "{why}");
        // A FIFO nobody writes: refused at once, not waited on.
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let why = read_file(None, &fifo, 4).unwrap_err().to_string();
        assert!(why.contains("not a regular file"), "{why}");
    }

    #[test]
    fn a_read_that_does_not_end_times_out() {
        // A read that hangs (a file system that does not answer) is given up on.
        let (_keep, hang) = std::sync::mpsc::channel::<()>();
        let hang = std::sync::Mutex::new(hang);
        let why = within(
            Path::new("/nfs/stuck"),
            Duration::from_millis(50),
            move || {
                let _ = hang.lock().map(|h| h.recv());
                Ok(Vec::new())
            },
        )
        .unwrap_err()
        .to_string();
        assert!(why.contains("/nfs/stuck: not read in"), "{why}");
    }

    #[test]
    fn root_reads_a_jobs_file_with_the_jobs_rights() {
        if !crate::os::running_as_root() {
            eprintln!("skipped: not root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        // Root's secret: root reads it, the user does not, and its content never shows.
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"AKIA-root-only").unwrap();
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(read_file(None, &secret, 1024).is_ok());
        let why = read_file(Some(NOBODY), &secret, 1024)
            .unwrap_err()
            .to_string();
        assert!(why.contains("Permission denied"), "{why}");
        assert!(!why.contains("AKIA"), "{why}");

        // Inside a folder the user cannot search: the same answer, there or not.
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        std::fs::write(closed.join("there"), b"x").unwrap();
        std::fs::set_permissions(&closed, std::fs::Permissions::from_mode(0o700)).unwrap();
        let there = read_file(Some(NOBODY), &closed.join("there"), 1024)
            .unwrap_err()
            .to_string();
        let missing = read_file(Some(NOBODY), &closed.join("missing"), 1024)
            .unwrap_err()
            .to_string();
        assert_eq!(
            there.replace("there", "X"),
            missing.replace("missing", "X"),
            "existing and missing files look alike"
        );

        // The user's own file is read; the rest of mmkd keeps root's rights.
        let mine = dir.path().join("mine");
        std::fs::write(&mine, b"ok").unwrap();
        std::os::unix::fs::chown(&mine, Some(NOBODY.uid), Some(NOBODY.gid)).unwrap();
        std::fs::set_permissions(&mine, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        assert_eq!(read_file(Some(NOBODY), &mine, 1024).unwrap(), b"ok");
        assert!(std::fs::read(&secret).is_ok(), "this thread is still root");
    }
}
