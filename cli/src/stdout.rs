//! A program's standard output. SIGPIPE stays ignored (as Rust leaves it: a gRPC connection
//! that closes under a write must be an error, not the end of the process), so `println!`
//! would panic when the reader of a pipe goes away. Every line goes through [`write`]
//! instead, which ends the program quietly then.

use std::io::Write;

/// The exit code of a tool that SIGPIPE ended, as a shell reports it.
pub const BROKEN_PIPE_EXIT: i32 = 128 + libc::SIGPIPE;

/// Writes to standard output (with a newline if `newline`). When the reader has gone away,
/// exits at once with [`BROKEN_PIPE_EXIT`] and no message; another write error is reported
/// and exits with 2.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let mut out = std::io::stdout().lock();
    let written = out.write_fmt(args).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    settle(written);
}

/// Writes bytes as they are (a job's log) and flushes them, as [`write`].
pub fn bytes(buf: &[u8]) {
    let mut out = std::io::stdout().lock();
    settle(out.write_all(buf).and_then(|()| out.flush()));
}

fn settle(written: std::io::Result<()>) {
    match written {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            std::process::exit(BROKEN_PIPE_EXIT)
        }
        Err(e) => {
            let program = std::env::args()
                .next()
                .and_then(|a| {
                    std::path::Path::new(&a)
                        .file_name()
                        .map(|n| n.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| "mmk".into());
            eprintln!("{program}: cannot write the output: {e}");
            std::process::exit(2)
        }
    }
}
