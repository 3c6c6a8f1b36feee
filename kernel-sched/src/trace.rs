//! The kernel trace: what record mode writes, one CSV line a launch.
//!
//! ```text
//! seq,pid,class,api,kernel,grid_x,grid_y,grid_z,block_x,block_y,block_z,shared_mem,blocks_per_sm,sm_demand,stream,launch_ns,held_ns,start_ns,end_ns
//! ```
//!
//! - `api` is the entry point that launched it (`cuLaunchKernel`, `cudaLaunchKernel`,
//!   `cuGraphLaunch`, ...); a graph launch is one line with kernel `graph`.
//! - Times are `CLOCK_MONOTONIC` nanoseconds, comparable across the processes of a node.
//!   `held_ns` is the time the gate held the launch. `start_ns` and `end_ns` are measured
//!   with events around the launch and are empty where they could not be measured.
//! - `kernel` is the mangled function name (`cuFuncGetName`), quoted when it holds a comma
//!   or a quote; `?` when the driver would not name it.

use std::fmt::Write as _;

use crate::policy::Class;

pub const HEADER: &str = "seq,pid,class,api,kernel,grid_x,grid_y,grid_z,block_x,block_y,block_z,shared_mem,blocks_per_sm,sm_demand,stream,launch_ns,held_ns,start_ns,end_ns";

/// One launch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceRecord {
    pub seq: u64,
    pub pid: u32,
    pub class: Class,
    pub api: String,
    pub kernel: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub blocks_per_sm: u32,
    pub sm_demand: u32,
    pub stream: u64,
    pub launch_ns: u64,
    pub held_ns: u64,
    pub start_ns: Option<u64>,
    pub end_ns: Option<u64>,
}

impl TraceRecord {
    /// The measured run time, where it was measured.
    pub fn duration_ns(&self) -> Option<u64> {
        Some(self.end_ns?.saturating_sub(self.start_ns?))
    }

    /// The line, without a newline.
    pub fn to_line(&self) -> String {
        let mut line = String::with_capacity(160);
        let opt = |v: Option<u64>| v.map(|v| v.to_string()).unwrap_or_default();
        let _ = write!(
            line,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:#x},{},{},{},{}",
            self.seq,
            self.pid,
            self.class.as_str(),
            self.api,
            quote(&self.kernel),
            self.grid[0],
            self.grid[1],
            self.grid[2],
            self.block[0],
            self.block[1],
            self.block[2],
            self.shared_mem,
            self.blocks_per_sm,
            self.sm_demand,
            self.stream,
            self.launch_ns,
            self.held_ns,
            opt(self.start_ns),
            opt(self.end_ns),
        );
        line
    }
}

fn quote(name: &str) -> String {
    if name.contains([',', '"', '\n']) {
        format!("\"{}\"", name.replace('"', "\"\"").replace('\n', " "))
    } else {
        name.to_owned()
    }
}

/// A line of a trace that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("trace line {line}: {message}")]
pub struct TraceError {
    pub line: usize,
    pub message: String,
}

/// Split one CSV line, honouring quotes.
fn split(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', false) if field.is_empty() => quoted = true,
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', true) => quoted = false,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    if quoted {
        return Err("unterminated quote".into());
    }
    fields.push(field);
    Ok(fields)
}

/// Read a whole trace (with its header line).
pub fn parse(text: &str) -> Result<Vec<TraceRecord>, TraceError> {
    let mut lines = text.lines().enumerate();
    match lines.next() {
        Some((_, header)) if header.trim_end() == HEADER => {}
        _ => {
            return Err(TraceError {
                line: 1,
                message: format!("expected the header {HEADER:?}"),
            });
        }
    }
    let mut records = Vec::new();
    for (index, line) in lines {
        if line.trim().is_empty() {
            continue;
        }
        let number = index + 1;
        records.push(parse_line(line).map_err(|message| TraceError {
            line: number,
            message,
        })?);
    }
    Ok(records)
}

fn parse_line(line: &str) -> Result<TraceRecord, String> {
    let f = split(line)?;
    let names: Vec<&str> = HEADER.split(',').collect();
    if f.len() != names.len() {
        return Err(format!("{} fields, expected {}", f.len(), names.len()));
    }
    let num = |i: usize| -> Result<u64, String> {
        let text = f[i].trim();
        let parsed = match text.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16),
            None => text.parse(),
        };
        parsed.map_err(|_| format!("{}: not a number: {:?}", names[i], f[i]))
    };
    let small = |i: usize| -> Result<u32, String> {
        u32::try_from(num(i)?).map_err(|_| format!("{}: {} is too large", names[i], f[i]))
    };
    let opt = |i: usize| -> Result<Option<u64>, String> {
        if f[i].trim().is_empty() {
            Ok(None)
        } else {
            num(i).map(Some)
        }
    };
    Ok(TraceRecord {
        seq: num(0)?,
        pid: small(1)?,
        class: f[2].parse().map_err(|e| format!("class: {e}"))?,
        api: f[3].clone(),
        kernel: f[4].clone(),
        grid: [small(5)?, small(6)?, small(7)?],
        block: [small(8)?, small(9)?, small(10)?],
        shared_mem: small(11)?,
        blocks_per_sm: small(12)?,
        sm_demand: small(13)?,
        stream: num(14)?,
        launch_ns: num(15)?,
        held_ns: num(16)?,
        start_ns: opt(17)?,
        end_ns: opt(18)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> TraceRecord {
        TraceRecord {
            seq: 3,
            pid: 42,
            class: Class::Offline,
            api: "cuLaunchKernel".into(),
            kernel: "_Z4gemmPfS_\"odd,name\"".into(),
            grid: [80, 2, 1],
            block: [256, 1, 1],
            shared_mem: 4096,
            blocks_per_sm: 4,
            sm_demand: 40,
            stream: 0x7f00_dead_beef,
            launch_ns: 1_000,
            held_ns: 50,
            start_ns: Some(1_200),
            end_ns: Some(9_200),
        }
    }

    #[test]
    fn a_line_reads_back_as_written() {
        let mut unmeasured = record();
        unmeasured.start_ns = None;
        unmeasured.end_ns = None;
        unmeasured.kernel = "plain".into();
        let text = format!(
            "{HEADER}\n{}\n{}\n",
            record().to_line(),
            unmeasured.to_line()
        );
        let back = parse(&text).unwrap();
        assert_eq!(back, vec![record(), unmeasured]);
        assert_eq!(back[0].duration_ns(), Some(8_000));
        assert_eq!(back[1].duration_ns(), None);
    }

    #[test]
    fn bad_lines_name_the_line_and_the_field() {
        let err = parse("seq,pid\n").unwrap_err();
        assert_eq!(err.line, 1);
        let line = record().to_line().replacen(",256,", ",lots,", 1);
        let err = parse(&format!("{HEADER}\n{line}\n")).unwrap_err();
        assert_eq!(err.line, 2);
        assert!(err.message.contains("block_x"), "{err}");
        let err = parse(&format!("{HEADER}\n1,2,3\n")).unwrap_err();
        assert!(err.message.contains("3 fields"), "{err}");
        let line = record().to_line().replacen("offline", "batch", 1);
        let err = parse(&format!("{HEADER}\n{line}\n")).unwrap_err();
        assert!(err.message.contains("class"), "{err}");
    }
}
