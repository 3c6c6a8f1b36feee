//! Reading a file a user names, whatever it is: a regular file, a device (`/dev/zero`), a
//! pipe or FIFO, or standard input (`-`). At most the cap plus one byte is read, and a pipe
//! or FIFO that sends nothing for a while is given up on, so that no input makes mmkctl
//! grow without bound or hang.

use std::fs::File;
use std::io::Read;
use std::os::fd::AsFd;
use std::path::Path;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fs::{FileType, Mode, OFlags};

/// The most mmkctl reads of a trace, a dataset, a plan or a profile: 256 MiB.
pub const MAX_DATA_BYTES: usize = 256 * 1024 * 1024;

/// How long a pipe or FIFO may stay silent before mmkctl gives up on it.
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
    #[error("it is larger than {cap} bytes, the most mmkctl reads of it")]
    TooLarge { path: String, cap: usize },
    #[error("nothing arrived within {}s; mmkctl gave up on it", .quiet.as_secs())]
    Quiet { path: String, quiet: Duration },
}

/// Reads at most `cap` bytes of `path` (`-`: standard input); more is an error, and so is
/// a pipe or FIFO silent for [`QUIET_LIMIT`].
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
    let st = rustix::fs::fstat(&file).map_err(|e| io(e.into()))?;
    let kind = FileType::from_raw_mode(st.st_mode);
    if kind == FileType::RegularFile && st.st_size > 0 && st.st_size as u64 > cap as u64 {
        return Err(InputError::TooLarge { path: shown, cap });
    }
    let waits = matches!(kind, FileType::Fifo | FileType::Socket);
    if waits {
        // A pipe on standard input blocks; read it without blocking so that silence can
        // be timed.
        let flags = rustix::fs::fcntl_getfl(&file).map_err(|e| io(e.into()))?;
        rustix::fs::fcntl_setfl(&file, flags | OFlags::NONBLOCK).map_err(|e| io(e.into()))?;
    }
    let mut out = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut file = file;
    let mut last = Instant::now();
    loop {
        match file.read(&mut buf) {
            Ok(0) if !(waits && out.is_empty() && !had_writer(&file)) => break,
            Ok(0) => {}
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                if out.len() > cap {
                    return Err(InputError::TooLarge { path: shown, cap });
                }
                last = Instant::now();
                continue;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(io(e)),
        }
        // Nothing to read now: wait for the writer, up to the silence limit.
        let left = quiet.saturating_sub(last.elapsed());
        if left.is_zero() {
            return Err(InputError::Quiet { path: shown, quiet });
        }
        let mut fds = [PollFd::new(&file, PollFlags::IN)];
        let t = Timespec::try_from(left.min(Duration::from_millis(100))).ok();
        match rustix::event::poll(&mut fds, t.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(io(e.into())),
        }
    }
    Ok(out)
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
        assert!(t.elapsed() < Duration::from_secs(5));
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
