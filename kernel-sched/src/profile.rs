//! Kernel profiles: what a job's kernels did when the job ran alone.
//!
//! `mmk-lab profile job.yaml` runs a job under the interposer in record mode and turns the
//! trace into a [`Profile`]: per kernel identity (name, grid, block, dynamic shared memory,
//! as docs/architecture.md defines it) the number of launches, the run time (mean and p95), the
//! GPU idle gap after it, its SM demand and, where `ncu` data is available, whether it is
//! compute- or memory-bound. The job's processes load it (`MMK_KSCHED_PROFILE`) so the
//! policies can look up each launch ([`Expect`]).
//!
//! Requests: an online job's kernels come in bursts, one per request. A gap longer than
//! [`REQUEST_GAP`] between one kernel's end and the next one's start ends a request; the
//! profile keeps the median request length (`request_ns`, whose 2.5 % is Orion's
//! DUR_THRESHOLD) and marks kernels that usually end a request, whose gap is the time to
//! the next request and says nothing about when the job comes back.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::policy::Class;
use crate::trace::TraceRecord;

/// A GPU idle gap longer than this ends a request (1 ms).
pub const REQUEST_GAP: u64 = 1_000_000;
/// The format version this build writes and reads.
pub const PROFILE_VERSION: u32 = 1;

/// Whether a kernel is bound by compute or by memory bandwidth (Orion §5.2: the roofline,
/// or over 60 % of peak compute or memory throughput); `Unknown` when not measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Intensity {
    Compute,
    Memory,
    #[default]
    Unknown,
}

impl Intensity {
    pub fn as_str(self) -> &'static str {
        match self {
            Intensity::Compute => "compute",
            Intensity::Memory => "memory",
            Intensity::Unknown => "unknown",
        }
    }

    /// Orion's classification from `ncu` throughputs (percent of peak): over 60 % of compute
    /// is compute-bound, else over 60 % of memory is memory-bound, else unknown.
    pub fn from_throughput(compute_pct: f64, memory_pct: f64) -> Intensity {
        if compute_pct >= 60.0 && compute_pct >= memory_pct {
            Intensity::Compute
        } else if memory_pct >= 60.0 {
            Intensity::Memory
        } else {
            Intensity::Unknown
        }
    }
}

impl fmt::Display for Intensity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Intensity {
    type Err = crate::UnknownName;
    fn from_str(s: &str) -> Result<Intensity, crate::UnknownName> {
        match s {
            "compute" => Ok(Intensity::Compute),
            "memory" => Ok(Intensity::Memory),
            "unknown" => Ok(Intensity::Unknown),
            other => Err(crate::UnknownName::new(
                "intensity",
                other,
                "compute, memory or unknown",
            )),
        }
    }
}

/// A kernel's identity: name, grid, block and dynamic shared memory.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct KernelKey {
    pub name: String,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
}

impl KernelKey {
    pub fn of(r: &TraceRecord) -> KernelKey {
        KernelKey {
            name: r.kernel.clone(),
            grid: r.grid,
            block: r.block,
            shared_mem: r.shared_mem,
        }
    }
}

/// One kernel identity's statistics.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KernelStats {
    #[serde(flatten)]
    pub key: KernelKey,
    pub launches: u64,
    pub mean_ns: u64,
    pub p95_ns: u64,
    /// Mean GPU idle gap after the kernel inside a request (0 when the next kernel was
    /// already queued).
    pub gap_after_ns: u64,
    /// Share of its launches that ended a request.
    pub ends_request: f64,
    pub sm_demand: u32,
    #[serde(default)]
    pub intensity: Intensity,
}

/// A job's kernel profile.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Profile {
    pub version: u32,
    /// The job's name, for people reading the file.
    pub job: String,
    pub class: String,
    /// Launches the profile was built from (measured ones).
    pub launches: u64,
    /// Requests (bursts of kernels) seen, and their median length from the first kernel's
    /// start to the last one's end.
    pub requests: u64,
    pub request_ns: u64,
    /// Kernels, most launched first.
    pub kernels: Vec<KernelStats>,
}

/// What the policies know about one launch, from its job's profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Expect {
    /// Expected run time; `None` for a kernel the profile does not know (the policies are
    /// optimistic about those, as Orion and FIKIT are).
    pub duration_ns: Option<u64>,
    /// Expected GPU idle gap after it; `None` when unknown or when the kernel usually ends
    /// a request.
    pub gap_after_ns: Option<u64>,
    pub intensity: Intensity,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProfileError {
    #[error("the trace has no measured kernels (record mode wrote no start and end times)")]
    Empty,
    #[error("kernel profile: {0}")]
    Parse(String),
    #[error("kernel profile has version {0}, this build reads {PROFILE_VERSION}")]
    Version(u32),
    #[error("kernel profile, kernel {index}: {message}")]
    Kernel { index: usize, message: String },
}

/// Why `ncu --csv --page raw` output could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NcuError {
    #[error("ncu output has no CSV header (was it run with --csv --page raw?)")]
    NoHeader,
    #[error("ncu output has no {0:?} column")]
    NoColumn(String),
    #[error("ncu CSV line {line}: {metric} is not a number: {value:?}")]
    NotANumber {
        line: usize,
        metric: String,
        value: String,
    },
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (p / 100.0 * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

/// The measured launches of a trace cut into requests: per process, in GPU start order, a
/// new request wherever the GPU idled longer than [`REQUEST_GAP`] (kernels of several
/// streams overlap, so the idle time runs from the latest end so far). Each launch comes
/// with the GPU gap after it inside its request; `None` for the last one of a request.
pub fn requests(records: &[TraceRecord]) -> Vec<Vec<(&TraceRecord, Option<u64>)>> {
    let mut by_pid: BTreeMap<u32, Vec<&TraceRecord>> = BTreeMap::new();
    for r in records.iter().filter(|r| r.duration_ns().is_some()) {
        by_pid.entry(r.pid).or_default().push(r);
    }
    let mut requests = Vec::new();
    for mut list in by_pid.into_values() {
        list.sort_by_key(|r| (r.start_ns, r.seq));
        let mut request = Vec::new();
        let mut busy_until = 0u64;
        for (i, r) in list.iter().enumerate() {
            busy_until = busy_until.max(r.end_ns.unwrap_or(0));
            let gap = list
                .get(i + 1)
                .and_then(|n| n.start_ns)
                .map(|next| next.saturating_sub(busy_until))
                .filter(|&gap| gap <= REQUEST_GAP);
            request.push((*r, gap));
            if gap.is_none() {
                requests.push(std::mem::take(&mut request));
            }
        }
    }
    requests
}

#[derive(Default)]
struct Acc {
    durations: Vec<u64>,
    gaps: Vec<u64>,
    ends: u64,
    sm_demand: u32,
}

impl Profile {
    /// Build a profile from record-mode traces of the job running alone (every process and
    /// run of it). Launches without start and end times are skipped.
    pub fn from_trace(
        job: &str,
        class: Class,
        records: &[TraceRecord],
    ) -> Result<Profile, ProfileError> {
        let requests = requests(records);
        if requests.is_empty() {
            return Err(ProfileError::Empty);
        }
        let mut acc: HashMap<KernelKey, Acc> = HashMap::new();
        let mut request_lengths = Vec::with_capacity(requests.len());
        let mut launches = 0;
        for request in &requests {
            let first = request[0].0.start_ns.unwrap_or(0);
            let mut busy_until = 0u64;
            for &(r, gap) in request {
                let (start, end) = (r.start_ns.unwrap_or(0), r.end_ns.unwrap_or(0));
                busy_until = busy_until.max(end);
                launches += 1;
                let a = acc.entry(KernelKey::of(r)).or_default();
                a.durations.push(end.saturating_sub(start));
                a.sm_demand = a.sm_demand.max(r.sm_demand);
                match gap {
                    Some(gap) => a.gaps.push(gap),
                    None => a.ends += 1,
                }
            }
            request_lengths.push(busy_until.saturating_sub(first));
        }
        request_lengths.sort_unstable();
        let mut kernels: Vec<KernelStats> = acc
            .into_iter()
            .map(|(key, mut a)| {
                a.durations.sort_unstable();
                let n = a.durations.len() as u64;
                let mean = |v: &[u64]| {
                    if v.is_empty() {
                        0
                    } else {
                        (v.iter().map(|&x| u128::from(x)).sum::<u128>() / v.len() as u128) as u64
                    }
                };
                KernelStats {
                    key,
                    launches: n,
                    mean_ns: mean(&a.durations),
                    p95_ns: percentile(&a.durations, 95.0),
                    gap_after_ns: mean(&a.gaps),
                    ends_request: a.ends as f64 / n as f64,
                    sm_demand: a.sm_demand,
                    intensity: Intensity::Unknown,
                }
            })
            .collect();
        kernels.sort_by(|a, b| b.launches.cmp(&a.launches).then(a.key.cmp(&b.key)));
        Ok(Profile {
            version: PROFILE_VERSION,
            job: job.to_owned(),
            class: class.as_str().to_owned(),
            launches,
            requests: request_lengths.len() as u64,
            request_ns: percentile(&request_lengths, 50.0),
            kernels,
        })
    }

    /// Read a profile file's text, checking what the policies rely on.
    pub fn parse(text: &str) -> Result<Profile, ProfileError> {
        let p: Profile =
            serde_json::from_str(text).map_err(|e| ProfileError::Parse(e.to_string()))?;
        if p.version != PROFILE_VERSION {
            return Err(ProfileError::Version(p.version));
        }
        p.class
            .parse::<Class>()
            .map_err(|e| ProfileError::Parse(format!("class: {e}")))?;
        for (index, k) in p.kernels.iter().enumerate() {
            let bad = |message: &str| ProfileError::Kernel {
                index,
                message: format!("{} ({})", message, k.key.name),
            };
            if k.key.name.is_empty() {
                return Err(bad("empty name"));
            }
            if !(0.0..=1.0).contains(&k.ends_request) {
                return Err(bad("ends_request must be within 0..=1"));
            }
        }
        Ok(p)
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("a profile always serializes")
    }

    /// The 2.5 % of the request length that Orion uses as DUR_THRESHOLD (docs/architecture.md,
    /// decision 3: the anti-starvation base); `None` without requests.
    pub fn dur_threshold_ns(&self) -> Option<u64> {
        (self.request_ns > 0).then(|| (self.request_ns / 40).max(1))
    }

    /// A lookup table from identity to what the policies need.
    pub fn index(&self) -> HashMap<KernelKey, Expect> {
        self.kernels
            .iter()
            .map(|k| {
                let expect = Expect {
                    duration_ns: Some(k.mean_ns),
                    gap_after_ns: (k.ends_request < 0.5).then_some(k.gap_after_ns),
                    intensity: k.intensity,
                };
                (k.key.clone(), expect)
            })
            .collect()
    }

    /// Set each kernel's intensity from `ncu` results by kernel name (the first launch of a
    /// name that ncu measured stands for every shape of it). Returns how many kernels got
    /// a known intensity.
    pub fn apply_intensity(&mut self, by_name: &HashMap<String, Intensity>) -> usize {
        let mut known = 0;
        for k in &mut self.kernels {
            if let Some(&i) = by_name.get(&k.key.name) {
                k.intensity = i;
                known += usize::from(i != Intensity::Unknown);
            }
        }
        known
    }
}

/// One kernel launch as `ncu --csv --page raw` reports it: the kernel's name and the
/// metrics asked for, by metric name.
#[derive(Debug, Clone, PartialEq)]
pub struct NcuRow {
    pub name: String,
    pub metrics: HashMap<String, f64>,
}

/// Reads `ncu --csv --page raw` output (ncu's own `==` messages, before the CSV header
/// or among its lines, are skipped), keeping the `Kernel Name` and the `metrics` columns of each
/// launch. A missing column or a value that is not a number is an error naming it; ncu's
/// `n/a` is left out of that launch's metrics.
pub fn parse_ncu_rows(text: &str, metrics: &[&str]) -> Result<Vec<NcuRow>, NcuError> {
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with('"'))
        .filter(|l| !l.trim().is_empty() && !l.starts_with("=="));
    let header = lines.next().ok_or(NcuError::NoHeader)?;
    let header = split_csv(header);
    let col = |name: &str| {
        header
            .iter()
            .position(|h| h == name)
            .ok_or_else(|| NcuError::NoColumn(name.to_owned()))
    };
    let name_col = col("Kernel Name")?;
    let cols = metrics
        .iter()
        .map(|m| Ok((*m, col(m)?)))
        .collect::<Result<Vec<_>, NcuError>>()?;
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let f = split_csv(line);
        let get = |c: usize| f.get(c).map(String::as_str).unwrap_or("");
        let name = get(name_col);
        // The units line under the header has an empty kernel name.
        if i == 0 && name.is_empty() {
            continue;
        }
        let mut row = NcuRow {
            name: name.to_owned(),
            metrics: HashMap::new(),
        };
        for &(metric, c) in &cols {
            let v = get(c).replace(',', "");
            if v == "n/a" {
                continue;
            }
            let v = v.parse::<f64>().map_err(|_| NcuError::NotANumber {
                line: i + 2,
                metric: metric.to_owned(),
                value: get(c).to_owned(),
            })?;
            row.metrics.insert(metric.to_owned(), v);
        }
        rows.push(row);
    }
    Ok(rows)
}

/// Read `ncu --csv --page raw` output with the metrics
/// `sm__throughput.avg.pct_of_peak_sustained_elapsed` and
/// `gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed` into an intensity per
/// kernel name (mangled, as `--print-kernel-base mangled` writes it). A name measured several
/// times gets the mean of its throughputs.
pub fn parse_ncu_csv(text: &str) -> Result<HashMap<String, Intensity>, NcuError> {
    const COMPUTE: &str = "sm__throughput.avg.pct_of_peak_sustained_elapsed";
    const MEMORY: &str = "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed";
    let mut sums: HashMap<String, (f64, f64, u32)> = HashMap::new();
    for row in parse_ncu_rows(text, &[COMPUTE, MEMORY])? {
        let (Some(compute), Some(memory)) = (row.metrics.get(COMPUTE), row.metrics.get(MEMORY))
        else {
            continue;
        };
        let e = sums.entry(row.name).or_default();
        e.0 += compute;
        e.1 += memory;
        e.2 += 1;
    }
    Ok(sums
        .into_iter()
        .map(|(name, (c, m, n))| {
            let n = f64::from(n);
            (name, Intensity::from_throughput(c / n, m / n))
        })
        .collect())
}

fn split_csv(line: &str) -> Vec<String> {
    let mut fields = Vec::new();
    let mut field = String::new();
    let mut quoted = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match (c, quoted) {
            ('"', true) if chars.peek() == Some(&'"') => {
                field.push('"');
                chars.next();
            }
            ('"', _) => quoted = !quoted,
            (',', false) => fields.push(std::mem::take(&mut field)),
            (c, _) => field.push(c),
        }
    }
    fields.push(field);
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: u64, kernel: &str, start: u64, end: u64, sm: u32) -> TraceRecord {
        TraceRecord {
            seq,
            pid: 7,
            class: Class::Online,
            api: "cuLaunchKernel".into(),
            kernel: kernel.into(),
            grid: [sm, 1, 1],
            block: [128, 1, 1],
            shared_mem: 0,
            blocks_per_sm: 1,
            sm_demand: sm,
            stream: 0,
            launch_ns: start.saturating_sub(5),
            held_ns: 0,
            start_ns: Some(start),
            end_ns: Some(end),
        }
    }

    /// Two requests of conv (100 us) -> gap 50 us -> relu (20 us), 5 ms apart.
    fn two_requests() -> Vec<TraceRecord> {
        let us = 1_000;
        vec![
            rec(0, "conv", 0, 100 * us, 100),
            rec(1, "relu", 150 * us, 170 * us, 20),
            rec(2, "conv", 5_000 * us, 5_100 * us, 100),
            rec(3, "relu", 5_150 * us, 5_174 * us, 20),
        ]
    }

    #[test]
    fn a_trace_becomes_per_kernel_statistics_and_requests() {
        let p = Profile::from_trace("resnet", Class::Online, &two_requests()).unwrap();
        assert_eq!((p.launches, p.requests), (4, 2));
        assert_eq!(p.request_ns, 174_000, "the median of 170 and 174 us, upper");
        assert_eq!(p.dur_threshold_ns(), Some(4_350));
        let conv = p.kernels.iter().find(|k| k.key.name == "conv").unwrap();
        assert_eq!(
            (conv.mean_ns, conv.gap_after_ns, conv.ends_request),
            (100_000, 50_000, 0.0)
        );
        assert_eq!(conv.sm_demand, 100);
        let relu = p.kernels.iter().find(|k| k.key.name == "relu").unwrap();
        assert_eq!((relu.mean_ns, relu.p95_ns), (22_000, 24_000));
        assert_eq!(relu.ends_request, 1.0);
        let index = p.index();
        let e = index[&conv.key];
        assert_eq!(e.duration_ns, Some(100_000));
        assert_eq!(e.gap_after_ns, Some(50_000));
        assert_eq!(
            index[&relu.key].gap_after_ns, None,
            "ends a request: gap unknown"
        );
    }

    #[test]
    fn the_file_round_trips_and_bad_files_say_what_is_wrong() {
        let p = Profile::from_trace("resnet", Class::Online, &two_requests()).unwrap();
        assert_eq!(Profile::parse(&p.to_json()).unwrap(), p);
        let err = Profile::parse("{").unwrap_err().to_string();
        assert!(err.starts_with("kernel profile:"), "{err}");
        let v2 = p.to_json().replacen("\"version\": 1", "\"version\": 2", 1);
        assert_eq!(Profile::parse(&v2).unwrap_err(), ProfileError::Version(2));
        let bad = p
            .to_json()
            .replacen("\"ends_request\": 1.0", "\"ends_request\": 3.0", 1);
        let err = Profile::parse(&bad).unwrap_err().to_string();
        assert!(
            err.contains("ends_request") && err.contains("relu"),
            "{err}"
        );
        let unmeasured: Vec<_> = two_requests()
            .into_iter()
            .map(|mut r| {
                r.end_ns = None;
                r
            })
            .collect();
        assert_eq!(
            Profile::from_trace("x", Class::Offline, &unmeasured),
            Err(ProfileError::Empty)
        );
    }

    #[test]
    fn ncu_csv_gives_each_kernel_its_intensity() {
        let csv = "==PROF== Connected to process 1\n\
            \"ID\",\"Kernel Name\",\"gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed\",\"sm__throughput.avg.pct_of_peak_sustained_elapsed\"\n\
            \"\",\"\",\"%\",\"%\"\n\
            \"0\",\"conv\",\"20.5\",\"88.1\"\n\
            \"1\",\"relu\",\"81.0\",\"12.0\"\n\
            \"2\",\"tiny\",\"3.0\",\"2.0\"\n\
            \"3\",\"conv\",\"22.5\",\"80.1\"\n";
        let m = parse_ncu_csv(csv).unwrap();
        assert_eq!(m["conv"], Intensity::Compute);
        assert_eq!(m["relu"], Intensity::Memory);
        assert_eq!(m["tiny"], Intensity::Unknown);
        let mut p = Profile::from_trace("resnet", Class::Online, &two_requests()).unwrap();
        assert_eq!(p.apply_intensity(&m), 2);
        let err = parse_ncu_csv("\"ID\",\"Kernel Name\"\n").unwrap_err();
        assert_eq!(
            err,
            NcuError::NoColumn("sm__throughput.avg.pct_of_peak_sustained_elapsed".into())
        );
        let bad = csv.replace("88.1", "lots");
        assert!(
            matches!(
                parse_ncu_csv(&bad).unwrap_err(),
                NcuError::NotANumber { line: 3, .. }
            ),
            "the CSV's own line"
        );
    }
}
