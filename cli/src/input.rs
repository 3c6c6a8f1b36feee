//! Reading a file a user names, whatever it is: a regular file, a device (`/dev/zero`), a
//! pipe or FIFO, or standard input (`-`). At most the cap plus one byte is read, and a named
//! FIFO that no writer opens is given up on, so that no input makes a program grow without
//! bound or hang for ever.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{FileType, Mode, OFlags};

/// The most a program reads of a trace, a dataset, a plan or a profile: 256 MiB.
pub const MAX_DATA_BYTES: usize = 256 * 1024 * 1024;

/// How long a program waits for a writer to open a named FIFO before it gives up on it. A pipe
/// whose writer is there is waited for as long as it takes.
pub const QUIET_LIMIT: Duration = Duration::from_secs(10);

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum InputError {
    #[error("{source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("it is larger than {cap} bytes, the most that is read of it")]
    TooLarge { path: String, cap: usize },
    #[error("no writer opened it within {}s; it was given up on", .quiet.as_secs())]
    Quiet { path: String, quiet: Duration },
}

/// Reads at most `cap` bytes of `path` (`-`: standard input); more is an error, and so is
/// a named FIFO that no writer opens within [`QUIET_LIMIT`].
pub fn read_capped(path: &Path, cap: usize) -> Result<Vec<u8>, InputError> {
    read_capped_within(path, cap, QUIET_LIMIT)
}

/// [`read_capped`] as text.
pub fn read_capped_text(path: &Path, cap: usize) -> Result<String, InputError> {
    let bytes = read_capped(path, cap)?;
    String::from_utf8(bytes).map_err(|_| InputError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidData, "not UTF-8 text"),
    })
}

/// [`read_capped`] with the silence limit given.
pub fn read_capped_within(path: &Path, cap: usize, quiet: Duration) -> Result<Vec<u8>, InputError> {
    let shown = path.display().to_string();
    let io = |source: std::io::Error| InputError::Io {
        path: shown.clone(),
        source,
    };
    // Opened without blocking: opening a FIFO nobody writes to would wait for ever.
    let file: File = if path == Path::new("-") {
        let fd = rustix::io::dup(std::io::stdin().as_fd()).map_err(|e| io(e.into()))?;
        File::from(fd)
    } else {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io(e.into()))?;
        File::from(fd)
    };
    read_open(file, shown, cap, quiet, path == Path::new("-"))
}

/// [`read_capped_within`] of a file already open. `shared`: standard input, whose open
/// file the shell and other processes share: it is read as it is, blocking, and its
/// flags are left alone (a pipe or FIFO there always had a writer; the user can end
/// mmkctl while it waits).
fn read_open(
    file: File,
    shown: String,
    cap: usize,
    quiet: Duration,
    shared: bool,
) -> Result<Vec<u8>, InputError> {
    let io = |source: std::io::Error| InputError::Io {
        path: shown.clone(),
        source,
    };
    let st = rustix::fs::fstat(&file).map_err(|e| io(e.into()))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind == FileType::RegularFile && st.st_size > 0 && st.st_size as u64 > cap as u64 {
        return Err(InputError::TooLarge { path: shown, cap });
    }
    // A named FIFO or socket was opened without blocking (above), so that one without a
    // writer can be timed.
    let waits = matches!(kind, FileType::Fifo | FileType::Socket) && !shared;
    read_to_cap(file, cap, quiet, waits).map_err(|e| e.named(shown))
}

/// Reads `file` to its end, or fails past `cap` bytes. A pipe (`waits`) with a writer is
/// waited for as long as it takes (the user may end mmkctl); a named FIFO that no writer
/// has opened is waited for up to `quiet`.
fn read_to_cap(
    mut file: File,
    cap: usize,
    quiet: Duration,
    waits: bool,
) -> Result<Vec<u8>, InputError> {
    let io = |source: std::io::Error| InputError::Io {
        path: String::new(),
        source,
    };
    let started = Instant::now();
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let wait = match file.read(&mut buf) {
            Ok(0) if !(waits && out.is_empty() && !had_writer(&file)) => break,
            Ok(0) => {
                // A named FIFO that no writer has opened yet.
                let left = quiet.saturating_sub(started.elapsed());
                if left.is_zero() {
                    return Err(InputError::Quiet {
                        path: String::new(),
                        quiet,
                    });
                }
                Timespec::try_from(left.min(Duration::from_millis(100))).ok()
            }
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > cap {
                    return Err(InputError::TooLarge {
                        path: String::new(),
                        cap,
                    });
                }
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // A writer that has not written yet: wait until it writes or closes.
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => return Err(io(e)),
        };
        let mut fds = [PollFd::new(&file, PollFlags::IN)];
        match rustix::event::poll(&mut fds, wait.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io(e.into())),
        }
    }
    Ok(out)
}

impl InputError {
    /// The error for the file the user named.
    fn named(self, shown: String) -> InputError {
        match self {
            InputError::Io { source, .. } => InputError::Io {
                path: shown,
                source,
            },
            InputError::TooLarge { cap, .. } => InputError::TooLarge { path: shown, cap },
            InputError::Quiet { quiet, .. } => InputError::Quiet { path: shown, quiet },
        }
    }
}

/// Whether a FIFO has had a writer: a FIFO opened before any writer reads as empty, which
/// is not yet its end.
fn had_writer(file: &File) -> bool {
    let mut fds = [PollFd::new(file, PollFlags::IN)];
    let zero = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // Linux sets POLLHUP once every writer that opened the FIFO has closed it.
    rustix::event::poll(&mut fds, Some(&zero)).is_ok() && fds[0].revents().contains(PollFlags::HUP)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_regular_file_over_the_cap_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("big.yaml");
        std::fs::write(&p, vec![b'a'; 2000]).expect("write");
        let err = read_capped(&p, 1000).expect_err("too large");
        assert!(
            matches!(err, InputError::TooLarge { cap: 1000, .. }),
            "{err}"
        );
        std::fs::write(&p, b"name: x\n").expect("write");
        assert_eq!(read_capped(&p, 1000).expect("read"), b"name: x\n");
    }

    #[test]
    fn dev_zero_stops_at_the_cap() {
        let err = read_capped(Path::new("/dev/zero"), 1 << 20).expect_err("endless");
        assert!(
            err.to_string().contains("larger than 1048576 bytes"),
            "{err}"
        );
    }

    fn fifo(dir: &Path) -> std::path::PathBuf {
        let p = dir.join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &p,
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .expect("mkfifo");
        p
    }

    #[test]
    fn a_silent_fifo_is_given_up_on() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = fifo(dir.path());
        let t = Instant::now();
        let err = read_capped_within(&p, 1000, Duration::from_millis(300)).expect_err("silent");
        assert!(matches!(err, InputError::Quiet { .. }), "{err}");
        // Given up on after the 300 ms it was given (later on a loaded machine), not after
        // the default's 10 s.
        assert!(
            t.elapsed() >= Duration::from_millis(300) && t.elapsed() < QUIET_LIMIT,
            "{:?}",
            t.elapsed()
        );
    }

    #[test]
    fn a_slow_writer_on_standard_input_is_waited_for_and_its_flags_left_alone() {
        let (r, w) = rustix::pipe::pipe().expect("pipe");
        let flags = rustix::fs::fcntl_getfl(&r).expect("flags");
        // As standard input: another descriptor of the same open pipe.
        let shared = File::from(rustix::io::dup(&r).expect("dup"));
        let writer = std::thread::spawn(move || {
            // Silent for longer than the reader's limit for a FIFO without a writer.
            std::thread::sleep(Duration::from_millis(600));
            let mut w = File::from(w);
            std::io::Write::write_all(&mut w, b"late\n").expect("write");
        });
        let got =
            read_open(shared, "-".into(), 1000, Duration::from_millis(200), true).expect("read");
        writer.join().expect("writer");
        assert_eq!(got, b"late\n");
        assert_eq!(rustix::fs::fcntl_getfl(&r).expect("flags"), flags);
    }

    #[test]
    fn a_fifo_is_read_to_its_end_and_a_long_one_stops_at_the_cap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = fifo(dir.path());
        let writer = {
            let p = p.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(100));
                std::fs::write(&p, b"name: piped\n").expect("write");
            })
        };
        let got = read_capped_within(&p, 1000, Duration::from_secs(5)).expect("read");
        writer.join().expect("writer");
        assert_eq!(got, b"name: piped\n");

        let writer = {
            let p = p.clone();
            std::thread::spawn(move || {
                // The reader gives up at the cap and closes: the write then fails.
                let _ = std::fs::write(&p, vec![b'x'; 1 << 20]);
            })
        };
        let err = read_capped_within(&p, 1000, Duration::from_secs(5)).expect_err("cap");
        assert!(matches!(err, InputError::TooLarge { .. }), "{err}");
        writer.join().expect("writer");
    }
}
