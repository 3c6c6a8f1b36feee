//! A program's standard output. SIGPIPE stays ignored (as Rust leaves it: a gRPC connection
//! that closes under a write must be an error, not the end of the process), so `println!`
//! would panic when the reader of a pipe goes away. Every line goes through [`write`]
//! instead, which ends the program quietly then.
//!
//! What [`write`] prints is terminal-safe: a control character (other than a newline or a
//! tab) in what it is given, which could only come from a job's arguments, a reason or
//! another string a user chose, is written as `\u00XX`, never as itself, so that no
//! escape sequence of a job's reaches an operator's terminal (a title change, a screen
//! clear, a clipboard write). In JSON that is the same string (control characters appear
//! only inside JSON strings, where `\u00XX` is their escape).

use std::io::Write;

/// The exit code of a tool that SIGPIPE ended, as a shell reports it.
pub const BROKEN_PIPE_EXIT: i32 = 128 + libc::SIGPIPE;

/// Writes to standard output (with a newline if `newline`). When the reader has gone away,
/// exits at once with [`BROKEN_PIPE_EXIT`] and no message; another write error is reported
/// and exits with 2.
pub fn write(args: std::fmt::Arguments<'_>, newline: bool) {
    let formatted = std::fmt::format(args);
    let text = escape_controls(&formatted);
    let mut out = std::io::stdout().lock();
    let written = out.write_all(text.as_bytes()).and_then(|()| {
        if newline {
            out.write_all(b"\n")
        } else {
            Ok(())
        }
    });
    settle(written);
}

/// `text` with each control character but newline and tab written as `\u00XX`.
pub fn escape_controls(text: &str) -> std::borrow::Cow<'_, str> {
    use std::fmt::Write as _;
    let unsafe_char = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !text.chars().any(unsafe_char) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            let _ = write!(out, "\\u{:04x}", u32::from(c));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `text` on one line: every control character, newlines and tabs too, as `\\u00XX`
/// (a value in a `key: value` row that must not start a line of its own).
pub fn one_line(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.contains(['\n', '\t']) {
        return escape_controls(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\u000a"),
            '\t' => out.push_str("\\u0009"),
            c => out.push(c),
        }
    }
    std::borrow::Cow::Owned(escape_controls(&out).into_owned())
}

/// Writes a terminal's own control sequence (a screen clear) as it is.
pub fn control(sequence: &str) {
    let mut out = std::io::stdout().lock();
    settle(out.write_all(sequence.as_bytes()));
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_json_stays_json() {
        let hostile = "a\u{1b}]0;owned\u{7}b\u{1b}[2J\rc\u{9b}d\u{7f}\tend\n";
        let safe = escape_controls(hostile);
        assert_eq!(
            safe,
            "a\\u001b]0;owned\\u0007b\\u001b[2J\\u000dc\\u009bd\\u007f\tend\n"
        );
        assert!(
            !safe
                .chars()
                .any(|c| c.is_control() && c != '\t' && c != '\n')
        );
        // serde_json leaves DEL and C1 raw inside strings; escaped, the JSON means the same.
        let json = serde_json::to_string(&serde_json::json!({ "arg": "x\u{9b}y\u{7f}" })).unwrap();
        let back: serde_json::Value = serde_json::from_str(&escape_controls(&json)).unwrap();
        assert_eq!(back["arg"], "x\u{9b}y\u{7f}");
        assert!(matches!(
            escape_controls("plain"),
            std::borrow::Cow::Borrowed(_)
        ));
        assert_eq!(
            one_line("a\nstate: OK\tb\u{1b}"),
            "a\\u000astate: OK\\u0009b\\u001b"
        );
    }
}
