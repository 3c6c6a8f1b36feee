//! Gates as mmkd keeps them on a node that many users share.
//!
//! - **The folder** ([`GateDir`]) is made by mmkd at its start and checked: it and every
//!   folder above it belong to root (or to mmkd's user), and no other user may write them
//!   (a sticky folder such as `/dev/shm` is allowed above it, never as the gate folder
//!   itself). A folder another user made first is refused, not used. Mode 0711: users reach
//!   the gate they are given by name but cannot list the others.
//! - **A gate** belongs to the one user whose jobs run in its partition (a partition serves
//!   one user at a time), mode 0600: that user's job processes and mmkd open it, nobody else.
//!   It is made under an unpredictable temporary name with `O_CREAT | O_EXCL | O_NOFOLLOW`
//!   relative to the folder's descriptor, its space reserved, stamped, given to the user,
//!   then renamed into place; nothing in the folder is ever followed as a link.
//! - **mmkd never maps a gate** ([`GateFile`]): it reads a copy of the segment with `pread`
//!   ([`GateSnapshot`]) and writes single fields with `pwrite`. A job may write anything
//!   into its gate, or truncate it: mmkd reads bounded values or a short file, never faults.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use rustix::fs::{AtFlags, Mode, OFlags};

use super::{
    DeviceWord, GateConfig, GateError, Header, MAGIC, Result, SEGMENT_BYTES, SLOTS, Segment, Slot,
    SlotStats, Totals, VERSION, io_err, live, nanos, reserve,
};

/// Who a gate belongs to: the user (and primary group) whose jobs run in its partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GateOwner {
    pub uid: u32,
    pub gid: u32,
}

impl GateOwner {
    /// The user this process runs as.
    pub fn current() -> GateOwner {
        GateOwner {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
        }
    }
}

/// The folder of a node's gates, open and checked (see the module's notes).
#[derive(Debug)]
pub struct GateDir {
    fd: OwnedFd,
    path: PathBuf,
}

/// The longest partition key a gate is named after (`g12i13`, `g3`).
const MAX_KEY: usize = 64;

impl GateDir {
    /// Open the gate folder at `path`, making it (mode 0711) and the folders above it when
    /// missing. Refused: a link, a folder that another user owns or that others may write,
    /// or one under a folder that another user owns or others may write (unless sticky).
    /// Leftover temporary files of a gate that was being made are removed.
    pub fn open(path: &Path) -> Result<GateDir> {
        let unsafe_dir = |why: String| GateError::UnsafeDir {
            path: path.to_owned(),
            why,
        };
        if !path.is_absolute() {
            return Err(unsafe_dir("not an absolute path".into()));
        }
        match std::fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                std::fs::create_dir_all(path).map_err(io_err(path, "create the folder"))?;
            }
            Err(e) => return Err(io_err(path, "look for the folder")(e)),
        }
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                unsafe_dir("a link or not a folder".into())
            }
            e => io_err(path, "open the folder")(e.into()),
        })?;
        let me = rustix::process::geteuid().as_raw();
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(path, "stat the folder")(e.into()))?;
        if st.st_uid != me && st.st_uid != 0 {
            return Err(unsafe_dir(format!(
                "belongs to uid {}, not to mmkd's user (uid {me}); another user may have made \
                 it to take the gates' place: remove it or choose another folder",
                st.st_uid
            )));
        }
        if st.st_mode & 0o022 != 0 {
            return Err(unsafe_dir(format!(
                "other users may write it (mode {:o})",
                st.st_mode & 0o7777
            )));
        }
        // Through the descriptor: users reach their gate by name and list nothing.
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(0o711))
            .map_err(|e| io_err(path, "set the folder's mode")(e.into()))?;
        let canonical = std::fs::canonicalize(path).map_err(io_err(path, "resolve the folder"))?;
        for up in canonical.ancestors().skip(1) {
            let meta = std::fs::metadata(up).map_err(io_err(up, "stat a folder above"))?;
            use std::os::unix::fs::MetadataExt;
            if meta.uid() != me && meta.uid() != 0 {
                return Err(unsafe_dir(format!(
                    "{} above it belongs to uid {}",
                    up.display(),
                    meta.uid()
                )));
            }
            if meta.mode() & 0o022 != 0 && meta.mode() & 0o1000 == 0 {
                return Err(unsafe_dir(format!(
                    "other users may write {} above it (mode {:o})",
                    up.display(),
                    meta.mode() & 0o7777
                )));
            }
        }
        let dir = GateDir {
            fd,
            path: path.to_owned(),
        };
        dir.remove_leftovers();
        Ok(dir)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Where the gate of partition `key` is (what a job's `MMK_GATE` names).
    pub fn gate_path(&self, key: &str) -> PathBuf {
        self.path.join(gate_name(key))
    }

    /// Make the gate of partition `key` for `owner`'s jobs, or take over the one there when
    /// it is a gate of this build that belongs to `owner` (its slots and counters stay, so
    /// running processes keep their places); either way it gets `config`. Anything else at
    /// that name (another user's gate, a link, a file of another kind) is replaced.
    pub fn prepare(&self, key: &str, config: &GateConfig, owner: GateOwner) -> Result<GateFile> {
        check_key(key)?;
        config.check()?;
        let path = self.gate_path(key);
        if let Some(gate) = self.take_over(key, &path, owner)? {
            gate.configure(config)?;
            return Ok(gate);
        }
        self.make(key, &path, config, owner)
    }

    /// The gate of `key` that is there now, if any (opened without following a link).
    pub fn open_gate(&self, key: &str) -> Result<Option<GateFile>> {
        check_key(key)?;
        let path = self.gate_path(key);
        match rustix::fs::openat(&self.fd, gate_name(key), gate_flags(), Mode::empty()) {
            Ok(fd) => GateFile::from_fd(fd, path).map(Some),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(io_err(&path, "open")(e.into())),
        }
    }

    /// Remove the gate of `key` (its partition is going away); a gate already gone is fine.
    pub fn remove(&self, key: &str) -> Result<()> {
        check_key(key)?;
        match rustix::fs::unlinkat(&self.fd, gate_name(key), AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(io_err(&self.gate_path(key), "remove")(e.into())),
        }
    }

    /// The gate at `key` when it can be taken over as it is; `None` when a new one must be
    /// made.
    fn take_over(&self, key: &str, path: &Path, owner: GateOwner) -> Result<Option<GateFile>> {
        let fd = match rustix::fs::openat(&self.fd, gate_name(key), gate_flags(), Mode::empty()) {
            Ok(fd) => fd,
            // Nothing there, or a link (ELOOP), a FIFO or a folder: made anew.
            Err(
                rustix::io::Errno::NOENT
                | rustix::io::Errno::LOOP
                | rustix::io::Errno::NXIO
                | rustix::io::Errno::ISDIR,
            ) => return Ok(None),
            Err(e) => return Err(io_err(path, "open")(e.into())),
        };
        let Ok(gate) = GateFile::from_fd(fd, path.to_owned()) else {
            return Ok(None);
        };
        let st =
            rustix::fs::fstat(gate.file.as_fd()).map_err(|e| io_err(path, "stat")(e.into()))?;
        let ours = st.st_uid == owner.uid && st.st_nlink == 1 && st.st_mode & 0o077 == 0;
        if !ours || gate.snapshot().is_err() {
            return Ok(None);
        }
        // A gate made by an older mmk may have no blocks reserved.
        reserve(&gate.file, path)?;
        Ok(Some(gate))
    }

    /// A new gate, renamed over whatever was at `key`.
    fn make(
        &self,
        key: &str,
        path: &Path,
        config: &GateConfig,
        owner: GateOwner,
    ) -> Result<GateFile> {
        let tmp = format!(".{key}.{:016x}{LEFTOVER}", random_u64());
        let tmp_path = self.path.join(&tmp);
        let fd = rustix::fs::openat(
            &self.fd,
            &tmp,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| io_err(&tmp_path, "create")(e.into()))?;
        let made = (|| {
            let file = File::from(fd);
            // The space a gate needs is what the operator must free: name the gate.
            reserve(&file, path)?;
            file.write_all_at(&stamped(config), 0)
                .map_err(io_err(path, "write"))?;
            if owner != GateOwner::current() {
                rustix::fs::fchown(
                    &file,
                    Some(rustix::fs::Uid::from_raw(owner.uid)),
                    Some(rustix::fs::Gid::from_raw(owner.gid)),
                )
                .map_err(|e| io_err(path, "give it to the job's user")(e.into()))?;
            }
            rustix::fs::fchmod(&file, Mode::from_raw_mode(0o600))
                .map_err(|e| io_err(path, "set its mode")(e.into()))?;
            rustix::fs::renameat(&self.fd, &tmp, &self.fd, gate_name(key))
                .map_err(|e| io_err(path, "rename")(e.into()))?;
            Ok(GateFile {
                file,
                path: path.to_owned(),
                uid: owner.uid,
            })
        })();
        if made.is_err() {
            // Best effort: the error to report is the one that stopped the gate.
            let _ = rustix::fs::unlinkat(&self.fd, &tmp, AtFlags::empty());
        }
        made
    }

    /// Remove the temporary files of gates whose making was cut short (a crash).
    fn remove_leftovers(&self) {
        let Ok(entries) = std::fs::read_dir(&self.path) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with('.') && name.ends_with(LEFTOVER) {
                let _ = rustix::fs::unlinkat(&self.fd, name.as_ref(), AtFlags::empty());
            }
        }
    }
}

/// The end of a gate's temporary name.
const LEFTOVER: &str = ".new";

fn gate_name(key: &str) -> String {
    format!("{key}.gate")
}

fn gate_flags() -> OFlags {
    // Non-blocking, so that a FIFO cannot hold mmkd in open(2).
    OFlags::RDWR | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC
}

fn check_key(key: &str) -> Result<()> {
    let ok = !key.is_empty()
        && key.len() <= MAX_KEY
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(GateError::Config(format!(
            "a partition key is 1 to {MAX_KEY} letters, digits, '-' or '_', not {key:?}"
        )))
    }
}

pub(super) fn random_u64() -> u64 {
    let mut buf = [0u8; 8];
    let mut filled = 0;
    while filled < buf.len() {
        match rustix::rand::getrandom(&mut buf[filled..], rustix::rand::GetRandomFlags::empty()) {
            Ok(n) => filled += n,
            Err(rustix::io::Errno::INTR) => {}
            // getrandom(2) fails only before the kernel's pool is ready at boot: mix the
            // clock and the pid rather than fail a job.
            Err(_) => {
                return super::monotonic_ns() ^ (u64::from(std::process::id()) << 32);
            }
        }
    }
    u64::from_ne_bytes(buf)
}

/// The bytes of a new gate with `config`.
fn stamped(config: &GateConfig) -> Vec<u8> {
    use std::mem::offset_of;
    let mut bytes = vec![0u8; SEGMENT_BYTES];
    let header = offset_of!(Segment, header);
    let mut put = |field: usize, value: Field| {
        let at = header + field;
        match value {
            Field::U32(v) => bytes[at..at + 4].copy_from_slice(&v.to_ne_bytes()),
            Field::U64(v) => bytes[at..at + 8].copy_from_slice(&v.to_ne_bytes()),
        }
    };
    put(offset_of!(Header, magic), Field::U64(MAGIC));
    put(offset_of!(Header, version), Field::U32(VERSION));
    put(offset_of!(Header, slots), Field::U32(SLOTS as u32));
    put(
        offset_of!(Header, device_word),
        Field::U32(DeviceWord::OPEN),
    );
    for (field, value) in config_fields(config) {
        put(field, value);
    }
    bytes
}

fn zeroed() -> Box<Segment> {
    // SAFETY: a Segment is atomics only, for which all-zero bytes are a valid value.
    unsafe { Box::<Segment>::new_zeroed().assume_init() }
}

/// A gate as mmkd holds it: an open file, never mapped.
#[derive(Debug)]
pub struct GateFile {
    file: File,
    path: PathBuf,
    /// Who owns the file.
    uid: u32,
}

impl GateFile {
    /// Open the gate at `path` without following a link; what is not a regular file is
    /// refused.
    pub fn open(path: &Path) -> Result<GateFile> {
        let fd = rustix::fs::open(path, gate_flags(), Mode::empty())
            .map_err(|e| io_err(path, "open")(e.into()))?;
        GateFile::from_fd(fd, path.to_owned())
    }

    fn from_fd(fd: OwnedFd, path: PathBuf) -> Result<GateFile> {
        let st = rustix::fs::fstat(&fd).map_err(|e| io_err(&path, "stat")(e.into()))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(GateError::NotAGate {
                path,
                size: st.st_size.try_into().unwrap_or(0),
            });
        }
        Ok(GateFile {
            file: File::from(fd),
            path,
            uid: st.st_uid,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether `path` still names this file (not one made since in its place).
    pub fn is_at(&self, path: &Path) -> bool {
        use std::os::unix::fs::MetadataExt;
        match (std::fs::symlink_metadata(path), self.file.metadata()) {
            (Ok(there), Ok(mine)) => there.dev() == mine.dev() && there.ino() == mine.ino(),
            _ => false,
        }
    }

    /// The uid the gate belongs to: whose job processes may use it.
    pub fn owner_uid(&self) -> u32 {
        self.uid
    }

    /// A copy of the gate as it is now, checked to be a gate of this build.
    pub fn snapshot(&self) -> Result<GateSnapshot> {
        let mut seg = zeroed();
        // SAFETY: `seg` is ours alone; any bytes are valid atomics.
        let buf = unsafe {
            std::slice::from_raw_parts_mut(
                std::ptr::from_mut(&mut *seg).cast::<u8>(),
                SEGMENT_BYTES,
            )
        };
        let mut read = 0;
        while read < buf.len() {
            match self.file.read_at(&mut buf[read..], read as u64) {
                Ok(0) => {
                    return Err(GateError::NotAGate {
                        path: self.path.clone(),
                        size: read as u64,
                    });
                }
                Ok(n) => read += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&self.path, "read")(e)),
            }
        }
        seg.check(&self.path, read as u64)?;
        Ok(GateSnapshot { seg })
    }

    /// Write `config` into the gate; job processes see it at their next launch, and held
    /// launches within their next recheck (at most 20 ms).
    pub fn configure(&self, config: &GateConfig) -> Result<()> {
        config.check()?;
        let header = std::mem::offset_of!(Segment, header);
        for (field, value) in config_fields(config) {
            let bytes = match value {
                Field::U32(v) => v.to_ne_bytes().to_vec(),
                Field::U64(v) => v.to_ne_bytes().to_vec(),
            };
            self.file
                .write_all_at(&bytes, (header + field) as u64)
                .map_err(io_err(&self.path, "write"))?;
        }
        // Last: a process that sees the new generation reads the settings above. Only mmkd
        // writes settings, one writer at a time (its kernel scheduler's lock).
        let at = (header + std::mem::offset_of!(Header, generation)) as u64;
        let mut bytes = [0u8; 4];
        self.file
            .read_exact_at(&mut bytes, at)
            .map_err(io_err(&self.path, "read"))?;
        let generation = u32::from_ne_bytes(bytes).wrapping_add(1);
        self.file
            .write_all_at(&generation.to_ne_bytes(), at)
            .map_err(io_err(&self.path, "write"))?;
        Ok(())
    }

    /// Ask process `pid` to count its launches without tracking them (`on`), or to track
    /// them again (see [`super::Gate::set_untracked`]). False when `pid` holds no slot.
    pub fn set_untracked(&self, pid: u32, on: bool) -> Result<bool> {
        if pid == 0 {
            return Ok(false);
        }
        let snap = self.snapshot()?;
        let Some(index) = snap
            .seg
            .slots
            .iter()
            .position(|s| s.pid.load(Ordering::Relaxed) == pid)
        else {
            return Ok(false);
        };
        let at = std::mem::offset_of!(Segment, slots)
            + index * std::mem::size_of::<Slot>()
            + std::mem::offset_of!(Slot, untracked);
        self.file
            .write_all_at(&u32::from(on).to_ne_bytes(), at as u64)
            .map_err(io_err(&self.path, "write"))?;
        Ok(true)
    }
}

enum Field {
    U32(u32),
    U64(u64),
}

/// The header fields `config` sets, by offset in the header.
fn config_fields(c: &GateConfig) -> Vec<(usize, Field)> {
    use std::mem::offset_of;
    let mut fields = vec![
        (offset_of!(Header, sm_count), Field::U32(c.sm_count)),
        (offset_of!(Header, policy), Field::U32(c.policy.code())),
        (offset_of!(Header, base_ns), Field::U64(nanos(c.base))),
        (
            offset_of!(Header, max_hold_ns),
            Field::U64(nanos(c.max_hold)),
        ),
        (
            offset_of!(Header, offline_depth),
            Field::U32(c.offline_depth),
        ),
        (
            offset_of!(Header, gemm_slice_mflop),
            Field::U32(c.gemm_slice_mflop),
        ),
        (
            offset_of!(Header, device_wait),
            Field::U32(u32::from(c.device_wait)),
        ),
        (
            offset_of!(Header, device_wait_grain_us),
            Field::U32(c.device_wait_grain_us),
        ),
        (
            offset_of!(Header, hold_budget_pct),
            Field::U32(c.hold_budget_pct.min(100)),
        ),
        (
            offset_of!(Header, offline_paused),
            Field::U32(u32::from(c.offline_paused)),
        ),
    ];
    if !c.device_wait {
        // As `Gate::configure`: the word is left open, not closed by launches whose
        // completions will not be taken off it.
        fields.push((
            offset_of!(Header, device_word),
            Field::U32(DeviceWord::OPEN),
        ));
    }
    fields
}

/// A copy of a gate, read at one moment (mmkd's view; see [`GateFile::snapshot`]).
pub struct GateSnapshot {
    seg: Box<Segment>,
}

impl std::fmt::Debug for GateSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GateSnapshot")
            .field("config", &self.config())
            .field("slots", &self.slots())
            .finish()
    }
}

impl GateSnapshot {
    pub fn config(&self) -> GateConfig {
        self.seg.config()
    }

    pub fn totals(&self) -> Totals {
        self.seg.totals()
    }

    /// Every taken slot.
    pub fn slots(&self) -> Vec<SlotStats> {
        self.seg.slot_stats()
    }

    /// The taken slots whose process still runs.
    pub fn live_slots(&self) -> Vec<SlotStats> {
        live(self.slots())
    }
}

#[cfg(test)]
mod tests;
