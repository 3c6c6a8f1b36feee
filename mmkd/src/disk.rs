//! The data dir's disk, which the node store shares with the jobs' folders
//! (`jobs/<id>/work` and the logs): what keeps a job from taking the store's space.
//!
//! - **A cap per job** ([`Policy::job_disk_max`]): a running command job whose `work/` and
//!   logs take more fails, saying so.
//! - **A reserve** ([`Reserve`]): a file of [`RESERVE_BYTES`] whose blocks mmkd holds while
//!   the disk has room. When the free space falls under [`LOW_WATER`], mmkd lets the reserve
//!   go, so that the store's writes (a job's end, a cancel) keep working; refuses new jobs
//!   until [`HIGH_WATER`] is free again; and stops the running job that takes the most of
//!   the data dir, removing its `work/` (the job's reason says so).
//! - **Retention** ([`Policy::retention`]): an ended job's folder is removed that long after
//!   it ended. What a job writes to a folder of its user's (`command.workdir`, an absolute
//!   path) is never touched.
//!
//! Sizes are read without following links (each folder is opened with `O_NOFOLLOW`
//! relative to its parent) and stop counting after [`MAX_ENTRIES`] entries.

use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

/// What the disk guard keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// The most a running job's folder (`work/` and logs) may take, in bytes.
    pub job_disk_max: u64,
    /// How long an ended job's folder is kept.
    pub retention: Duration,
}

/// At mmkd's start: where the data dir's disk has less than [`LOW_WATER`] free, lets the
/// reserve go so that the store can open, and says so; the disk guard keeps new jobs out
/// until [`HIGH_WATER`] is free. Returns whether it did.
pub fn release_reserve_if_full(data_dir: &Path) -> bool {
    let Ok((free, _)) = space(data_dir) else {
        return false;
    };
    let reserve = Reserve::new(data_dir);
    if free >= LOW_WATER || !reserve.held() {
        return false;
    }
    match reserve.release() {
        Ok(()) => {
            tracing::error!(
                free = %bytes_text(free),
                dir = %data_dir.display(),
                "the data dir's disk is full: the reserve is let go for the store; mmkd serves reads and refuses new jobs until there is room"
            );
            true
        }
        Err(e) => {
            tracing::warn!(error = %e, path = %reserve.path().display(), "cannot let the disk reserve go");
            false
        }
    }
}

/// The reserve's size.
pub const RESERVE_BYTES: u64 = 64 << 20;
/// Free space under which the reserve is let go and the node counts as full.
pub const LOW_WATER: u64 = RESERVE_BYTES;
/// Free space from which the reserve is taken again and new jobs come in.
pub const HIGH_WATER: u64 = 4 * RESERVE_BYTES;
/// A job's cap unless the operator sets one: 16 GiB, and at most a quarter of the data
/// dir's file system.
pub const DEFAULT_JOB_DISK_MAX: u64 = 16 << 30;
/// How long an ended job's folder is kept unless the operator says otherwise.
pub const DEFAULT_RETENTION: Duration = Duration::from_secs(24 * 3600);
/// Entries a size count reads at most (a job's folder of millions of files is counted in
/// part, and its size is then at least what was counted).
pub const MAX_ENTRIES: u64 = 200_000;

/// The default cap for a data dir on a file system of `fs_bytes`.
pub fn default_job_disk_max(fs_bytes: u64) -> u64 {
    DEFAULT_JOB_DISK_MAX.min(fs_bytes / 4).max(1 << 20)
}

/// The free space (for an unprivileged user, as `df` shows it) and the size of the file
/// system holding `dir`.
pub fn space(dir: &Path) -> io::Result<(u64, u64)> {
    let st = rustix::fs::statvfs(dir)?;
    let unit = st.f_frsize.max(1);
    Ok((
        st.f_bavail.saturating_mul(unit),
        st.f_blocks.saturating_mul(unit),
    ))
}

/// What a folder takes on disk.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    /// Bytes of blocks allocated (what `du` counts).
    pub bytes: u64,
    pub entries: u64,
    /// False when the count stopped at [`MAX_ENTRIES`].
    pub complete: bool,
}

/// What `dir` and everything under it takes, never following a link; a folder that
/// cannot be read counts as what was read of it.
pub fn usage(dir: &Path) -> io::Result<Usage> {
    let fd = rustix::fs::open(dir, dir_flags(), Mode::empty())?;
    let mut u = Usage {
        complete: true,
        ..Usage::default()
    };
    let st = rustix::fs::fstat(&fd)?;
    u.bytes = blocks(&st);
    walk(fd, &mut u, 0);
    Ok(u)
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

fn blocks(st: &rustix::fs::Stat) -> u64 {
    u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512)
}

/// Folders deeper than this are counted as themselves only.
const MAX_DEPTH: u32 = 64;

fn walk(dir: OwnedFd, u: &mut Usage, depth: u32) {
    let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
        return;
    };
    for entry in entries {
        let Ok(entry) = entry else { return };
        let name = entry.file_name();
        if name.to_bytes() == b"." || name.to_bytes() == b".." {
            continue;
        }
        if u.entries >= MAX_ENTRIES {
            u.complete = false;
            return;
        }
        u.entries += 1;
        let Ok(st) = rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
            continue;
        };
        u.bytes = u.bytes.saturating_add(blocks(&st));
        if FileType::from_raw_mode(st.st_mode) == FileType::Directory
            && depth < MAX_DEPTH
            && let Ok(sub) = rustix::fs::openat(&dir, name, dir_flags(), Mode::empty())
        {
            walk(sub, u, depth + 1);
        }
        if !u.complete {
            return;
        }
    }
}

/// The reserve file in the data dir (mmkd's own folder; no job reaches it).
#[derive(Debug)]
pub struct Reserve {
    path: PathBuf,
}

impl Reserve {
    pub fn new(data_dir: &Path) -> Reserve {
        Reserve {
            path: data_dir.join("reserve"),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether its blocks are held.
    pub fn held(&self) -> bool {
        std::fs::symlink_metadata(&self.path).is_ok_and(|m| m.is_file() && m.len() >= RESERVE_BYTES)
    }

    /// Takes the reserve's blocks (a no-op when held); on a full disk, an error and no file.
    pub fn take(&self) -> io::Result<()> {
        if self.held() {
            return Ok(());
        }
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&self.path)?;
        let taken =
            rustix::fs::fallocate(&file, rustix::fs::FallocateFlags::empty(), 0, RESERVE_BYTES);
        if let Err(e) = taken {
            drop(file);
            let _ = std::fs::remove_file(&self.path);
            return Err(e.into());
        }
        Ok(())
    }

    /// Lets the reserve's blocks go.
    pub fn release(&self) -> io::Result<()> {
        match std::fs::remove_file(&self.path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// A byte count for a reason: `1.5GiB`, `300MiB`.
pub fn bytes_text(b: u64) -> String {
    mmk_core::units::format_mib(b / (1 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_is_counted_without_following_links() {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(work.join("a/b")).unwrap();
        std::fs::write(work.join("a/b/data"), vec![1u8; 3 << 20]).unwrap();
        std::fs::write(work.join("small"), b"x").unwrap();
        // A link to something big outside is not followed.
        let outside = dir.path().join("outside");
        std::fs::write(&outside, vec![1u8; 8 << 20]).unwrap();
        std::os::unix::fs::symlink(&outside, work.join("link")).unwrap();
        std::os::unix::fs::symlink(dir.path(), work.join("dirlink")).unwrap();
        let u = usage(&work).unwrap();
        assert!(u.complete);
        assert_eq!(u.entries, 6, "a, a/b, a/b/data, small, link, dirlink");
        assert!((3 << 20..5 << 20).contains(&u.bytes), "{u:?}");
        // A link given as the folder itself is refused.
        std::os::unix::fs::symlink(&work, dir.path().join("w")).unwrap();
        assert!(usage(&dir.path().join("w")).is_err());
    }

    #[test]
    fn the_reserve_is_taken_and_let_go() {
        let dir = tempfile::tempdir().unwrap();
        let r = Reserve::new(dir.path());
        assert!(!r.held());
        r.take().unwrap();
        assert!(r.held());
        assert!(usage(dir.path()).unwrap().bytes >= RESERVE_BYTES);
        r.take().unwrap();
        r.release().unwrap();
        assert!(!r.held());
        r.release().unwrap();
    }

    #[test]
    fn the_default_cap_is_a_quarter_of_a_small_disk() {
        assert_eq!(default_job_disk_max(1 << 40), DEFAULT_JOB_DISK_MAX);
        assert_eq!(default_job_disk_max(8 << 30), 2 << 30);
        assert_eq!(default_job_disk_max(0), 1 << 20);
    }
}
