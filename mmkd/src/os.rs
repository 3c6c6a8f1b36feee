//! The operating system calls of mmkd that no library wraps in a module of its own: who
//! mmkd runs as, signals, a thread's file-system identity, locks, file-system types and
//! what a job's first process does between fork and exec. rustix makes the call wherever
//! it has it; the rest (a thread's fs ids, signals by number) are raw calls, and this is
//! the only module of mmkd that makes one.

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;
use std::path::Path;

use rustix::process::Signal;

/// Whether mmkd runs as root: then a job runs as the user who submitted it.
pub fn running_as_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// mmkd's effective user ID.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// mmkd's effective group ID.
pub fn egid() -> u32 {
    rustix::process::getegid().as_raw()
}

/// mmkd's real user ID.
pub fn uid() -> u32 {
    rustix::process::getuid().as_raw()
}

/// Sends signal number `sig` to process `pid` (0 only checks that it could); whether it
/// was sent.
pub fn signal(pid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) with a pid and a signal number; no memory involved.
    pid > 0 && unsafe { libc::kill(pid, sig) } == 0
}

/// Sends signal number `sig` to every process of the group `pgid` (0 only checks that
/// one is left); whether it was sent.
pub fn signal_group(pgid: i32, sig: i32) -> bool {
    // SAFETY: kill(2) with a negative pid signals the process group; no memory involved.
    pgid > 1 && unsafe { libc::kill(-pgid, sig) } == 0
}

/// Gives the calling thread (alone) the file-system identity of `uid` and `gid`, with no
/// supplementary groups; whether it now has it.
pub fn become_fs_user(uid: u32, gid: u32) -> bool {
    // SAFETY: raw syscalls on this thread's credentials (glibc's setgroups would change
    // every thread's); no memory is passed but a null list of length 0.
    unsafe {
        if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0 {
            return false;
        }
        libc::syscall(libc::SYS_setfsgid, gid);
        libc::syscall(libc::SYS_setfsuid, uid);
        // setfsuid and setfsgid report no errors: read the identity back (an invalid id
        // leaves it unchanged and returns the current one).
        let now_uid = libc::syscall(libc::SYS_setfsuid, u32::MAX);
        let now_gid = libc::syscall(libc::SYS_setfsgid, u32::MAX);
        now_uid == i64::from(uid) && now_gid == i64::from(gid)
    }
}

/// Takes an exclusive lock on `f` without waiting; an error when another holds it.
pub fn lock_exclusive(f: &File) -> io::Result<()> {
    rustix::fs::flock(f, rustix::fs::FlockOperation::NonBlockingLockExclusive)?;
    Ok(())
}

/// The type (its magic number, statfs(2)) of the file system that holds `path`.
pub fn fs_type(path: &Path) -> io::Result<i64> {
    Ok(rustix::fs::statfs(path)?.f_type as i64)
}

/// Whether `dir` (or, when it does not exist yet, the nearest directory above it that does)
/// is on tmpfs or ramfs; the error says what it is on.
pub fn on_memory_fs(dir: &Path) -> Result<(), String> {
    let existing = dir
        .ancestors()
        .find(|d| d.exists())
        .unwrap_or(Path::new("/"));
    const TMPFS_MAGIC: i64 = 0x0102_1994;
    const RAMFS_MAGIC: i64 = 0x8584_58f6;
    let kind = fs_type(existing).map_err(|e| format!("cannot stat {}: {e}", existing.display()))?;
    if kind == TMPFS_MAGIC || kind == RAMFS_MAGIC {
        Ok(())
    } else {
        Err(format!(
            "{} is on a file system of type {kind:#x}, not tmpfs or ramfs",
            existing.display()
        ))
    }
}

/// What a job's first process does between fork and exec: dies with mmkd (SIGKILL when
/// the thread that forked it ends), leads a process group of its own, and writes itself
/// into its cgroup when `cgroup_procs` (its `cgroup.procs`, open) is given. Only
/// async-signal-safe calls.
pub fn job_pre_exec(cgroup_procs: Option<i32>) -> io::Result<()> {
    rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
    rustix::process::setpgid(None, None)?;
    if let Some(fd) = cgroup_procs {
        join_cgroup(fd)?;
    }
    Ok(())
}

/// Writes the calling process into the cgroup whose `cgroup.procs` is open as `fd`: for
/// `pre_exec`, async-signal-safe. The caller keeps `fd` open until the child is spawned.
pub fn join_cgroup(fd: i32) -> io::Result<()> {
    // SAFETY: the caller keeps the descriptor open across the call.
    let fd = unsafe { BorrowedFd::borrow_raw(fd) };
    rustix::io::write(fd, b"0\n")?;
    Ok(())
}
