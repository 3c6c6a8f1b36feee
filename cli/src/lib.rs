//! What mmk's command-line programs (`mmkctl`, `mmk-lab`) share: a failed command and its
//! exit code ([`Failure`]), the output format (`--output`), standard output that ends the
//! program quietly when its reader goes away ([`stdout`], [`out!`], [`outln!`]), input
//! read with a cap whatever the path names ([`input`]), and job files ([`read_spec`]).
//!
//! Exit codes: 0 ok; 1 not found; 2 usage, input or server error; 141 when the output's
//! reader went away.

pub mod input;
pub mod stdout;

use clap::ValueEnum;
use mmk_core::JobClass;
use mmk_core::spec::Task;
use mmk_core::yaml::{MAX_JOB_FILE_BYTES, parse_job_yaml};
use tonic::Code;

/// `print!` for a program's output: see [`stdout::write`].
#[macro_export]
macro_rules! out {
    ($($arg:tt)*) => { $crate::stdout::write(format_args!($($arg)*), false) };
}

/// `println!` for a program's output: see [`stdout::write`].
#[macro_export]
macro_rules! outln {
    () => { $crate::stdout::write(format_args!(""), true) };
    ($($arg:tt)*) => { $crate::stdout::write(format_args!($($arg)*), true) };
}

/// `--output`: a table for people, or JSON for scripts (docs/mmkctl.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Json,
}

/// A failed command: what to print and the exit code.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub exit_code: u8,
}

impl Failure {
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            exit_code: 2,
        }
    }

    pub fn server(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            exit_code: 2,
        }
    }
}

impl From<tonic::Status> for Failure {
    fn from(s: tonic::Status) -> Failure {
        let exit_code = if s.code() == Code::NotFound { 1 } else { 2 };
        let message = match s.code() {
            Code::InvalidArgument | Code::NotFound | Code::FailedPrecondition => {
                s.message().to_owned()
            }
            Code::Unavailable => format!("mmkd is unavailable: {}", s.message()),
            code => format!("mmkd answered {code:?}: {}", s.message()),
        };
        Failure { message, exit_code }
    }
}

/// Reads and checks a job file; a command job without a workdir gets the current
/// directory, and a relative kernel profile is taken relative to the file.
pub fn read_spec(
    file: &std::path::Path,
    class: Option<JobClass>,
) -> Result<mmk_core::JobSpec, Failure> {
    let path = file.display().to_string();
    // Whatever the path names (a device, a FIFO, `-` for standard input), at most the
    // cap plus one byte is read.
    let text = input::read_capped_text(file, MAX_JOB_FILE_BYTES).map_err(|e| match e {
        input::InputError::TooLarge { .. } => Failure::usage(format!(
            "{path}: file: is larger than {MAX_JOB_FILE_BYTES} bytes; a job file is at most \
             {MAX_JOB_FILE_BYTES} bytes"
        )),
        e => Failure::usage(format!("cannot read {path}: {e}")),
    })?;
    let mut spec =
        parse_job_yaml(&text, class).map_err(|e| Failure::usage(format!("{path}: {e}")))?;
    if let Task::Command(c) = &mut spec.task
        && c.workdir.is_none()
    {
        let cwd = std::env::current_dir()
            .map_err(|e| Failure::usage(format!("cannot read the current directory: {e}")))?;
        c.workdir = Some(cwd.display().to_string());
    }
    // A relative kernel profile is relative to the job file.
    if let Task::Command(c) = &mut spec.task
        && let Some(p) = &c.kernel_profile
        && !p.starts_with('/')
    {
        let dir = file.parent().unwrap_or(std::path::Path::new("."));
        let full = std::path::absolute(dir.join(p))
            .map_err(|e| Failure::usage(format!("{path}: command.kernel_profile: {e}")))?;
        c.kernel_profile = Some(full.display().to_string());
    }
    Ok(spec)
}
