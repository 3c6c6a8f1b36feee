//! The dataset: one CSV row per measured configuration (docs/predictor.md has the columns
//! and their units). The loader refuses a bad row with its line number and column.

use std::fmt::Write as _;
use std::path::Path;

use mmk_core::JobClass;
use thiserror::Error;

use crate::features::{Features, KernelFeatures};

/// The header, in order. Units: `_pct` percent, `_frac` a fraction of the whole GPU (or a
/// rate, 0..1), `ipc` instructions per cycle per SM, `co_runners` a count;
/// `normalized_perf` is the target: offline, throughput / throughput alone on the whole
/// GPU; online, latency alone on the whole GPU / latency. An empty cell is a missing value
/// (allowed in the optional columns only).
pub const COLUMNS: [&str; 17] = [
    "workload",
    "class",
    "mps_share_pct",
    "partition_sm_frac",
    "partition_mem_frac",
    "job_sm_frac",
    "job_bw_frac",
    "job_l2_frac",
    "co_runners",
    "co_sm_frac",
    "co_bw_frac",
    "co_l2_frac",
    "occupancy_frac",
    "ipc",
    "l2_hit_frac",
    "dram_tput_frac",
    "normalized_perf",
];

#[derive(Debug, Error)]
pub enum DatasetError {
    #[error("cannot read {path}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("line {line}, column {column}: {message}")]
    Bad {
        line: usize,
        column: String,
        message: String,
    },
    #[error("the dataset has no rows")]
    Empty,
}

/// One measured configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Row {
    /// What ran (for per-workload errors); not a feature.
    pub workload: String,
    pub features: Features,
    pub normalized_perf: f64,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Dataset {
    pub rows: Vec<Row>,
}

impl Dataset {
    pub fn load(path: &Path) -> Result<Dataset, DatasetError> {
        let text = std::fs::read_to_string(path).map_err(|source| DatasetError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Dataset::parse(&text)
    }

    /// Parses CSV text: the header of [`COLUMNS`], then one row per line. Blank lines and
    /// lines starting with `#` are skipped.
    pub fn parse(text: &str) -> Result<Dataset, DatasetError> {
        let mut lines = text
            .lines()
            .enumerate()
            .map(|(i, l)| (i + 1, l.trim_end_matches('\r')))
            .filter(|(_, l)| !l.trim().is_empty() && !l.starts_with('#'));
        let Some((hline, header)) = lines.next() else {
            return Err(DatasetError::Empty);
        };
        let names: Vec<&str> = header.split(',').map(str::trim).collect();
        if names != COLUMNS {
            let at = names
                .iter()
                .zip(COLUMNS)
                .position(|(a, b)| *a != b)
                .unwrap_or(names.len().min(COLUMNS.len()));
            return Err(DatasetError::Bad {
                line: hline,
                column: COLUMNS.get(at).unwrap_or(&"(end)").to_string(),
                message: format!(
                    "the header must be {} (found {:?} here)",
                    COLUMNS.join(","),
                    names.get(at).copied().unwrap_or("nothing")
                ),
            });
        }
        let mut rows = Vec::new();
        for (line, l) in lines {
            rows.push(parse_row(line, l)?);
        }
        if rows.is_empty() {
            return Err(DatasetError::Empty);
        }
        Ok(Dataset { rows })
    }

    pub fn to_csv(&self) -> String {
        let mut s = COLUMNS.join(",");
        s.push('\n');
        let o = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:.6}"));
        for r in &self.rows {
            let f = &r.features;
            let _ = writeln!(
                s,
                "{},{},{},{:.6},{:.6},{:.6},{:.6},{},{},{:.6},{:.6},{},{},{},{},{},{:.6}",
                r.workload,
                f.class.as_str(),
                f.mps_share_pct,
                f.partition_sm_frac,
                f.partition_mem_frac,
                f.job_sm_frac,
                f.job_bw_frac,
                o(f.job_l2_frac),
                f.co_runners,
                f.co_sm_frac,
                f.co_bw_frac,
                o(f.co_l2_frac),
                o(f.kernel.occupancy_frac),
                o(f.kernel.ipc),
                o(f.kernel.l2_hit_frac),
                o(f.kernel.dram_tput_frac),
                r.normalized_perf
            );
        }
        s
    }

    /// The feature matrix and the targets.
    pub fn xy(&self) -> (Vec<Vec<f64>>, Vec<f64>) {
        (
            self.rows.iter().map(|r| r.features.to_vec()).collect(),
            self.rows.iter().map(|r| r.normalized_perf).collect(),
        )
    }
}

fn parse_row(line: usize, l: &str) -> Result<Row, DatasetError> {
    let cells: Vec<&str> = l.split(',').map(str::trim).collect();
    let bad = |col: usize, message: String| DatasetError::Bad {
        line,
        column: COLUMNS[col.min(COLUMNS.len() - 1)].to_owned(),
        message,
    };
    if cells.len() != COLUMNS.len() {
        return Err(bad(
            cells.len().min(COLUMNS.len() - 1),
            format!("{} cells; the header has {}", cells.len(), COLUMNS.len()),
        ));
    }
    let num = |col: usize, lo: f64, hi: f64| -> Result<Option<f64>, DatasetError> {
        let c = cells[col];
        if c.is_empty() {
            return Ok(None);
        }
        let v: f64 = c
            .parse()
            .map_err(|_| bad(col, format!("{c:?} is not a number")))?;
        if !v.is_finite() || v < lo || v > hi {
            return Err(bad(col, format!("{c} is outside {lo}..={hi}")));
        }
        Ok(Some(v))
    };
    let req = |col: usize, lo: f64, hi: f64| -> Result<f64, DatasetError> {
        num(col, lo, hi)?.ok_or_else(|| bad(col, "is required".into()))
    };
    if cells[0].is_empty() {
        return Err(bad(0, "is required".into()));
    }
    let class = match cells[1] {
        "online" => JobClass::Online,
        "offline" => JobClass::Offline,
        other => return Err(bad(1, format!("{other:?} must be online or offline"))),
    };
    let co_runners = req(8, 0.0, 64.0)?;
    if co_runners.fract() != 0.0 {
        return Err(bad(8, format!("{co_runners} is not a whole number")));
    }
    let perf = req(16, 0.0, 1.5)?;
    if perf <= 0.0 {
        return Err(bad(16, "must be greater than zero".into()));
    }
    let partition_mem_frac = req(4, 0.0, 1.0)?;
    if partition_mem_frac <= 0.0 {
        return Err(bad(4, "must be greater than zero".into()));
    }
    Ok(Row {
        workload: cells[0].to_owned(),
        features: Features {
            class,
            mps_share_pct: req(2, 1.0, 100.0)?,
            partition_sm_frac: req(3, 0.0, 1.0)?,
            partition_mem_frac,
            job_sm_frac: req(5, 0.0, 1.0)?,
            job_bw_frac: req(6, 0.0, 1.0)?,
            job_l2_frac: num(7, 0.0, 1.0)?,
            co_runners: co_runners as u32,
            co_sm_frac: req(9, 0.0, 64.0)?,
            co_bw_frac: req(10, 0.0, 64.0)?,
            co_l2_frac: num(11, 0.0, 64.0)?,
            kernel: KernelFeatures {
                occupancy_frac: num(12, 0.0, 1.0)?,
                ipc: num(13, 0.0, 16.0)?,
                l2_hit_frac: num(14, 0.0, 1.0)?,
                dram_tput_frac: num(15, 0.0, 1.0)?,
            },
        },
        normalized_perf: perf,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEADER: &str = "workload,class,mps_share_pct,partition_sm_frac,partition_mem_frac,job_sm_frac,job_bw_frac,job_l2_frac,co_runners,co_sm_frac,co_bw_frac,co_l2_frac,occupancy_frac,ipc,l2_hit_frac,dram_tput_frac,normalized_perf";

    #[test]
    fn rows_round_trip_with_missing_values_kept_missing() {
        let text = format!(
            "{HEADER}\nresnet50-inference,online,40,0.4286,0.5,0.4,0.35,,1,0.3,0.2,,0.61,1.7,,,0.83\n"
        );
        let d = Dataset::parse(&text).unwrap();
        let f = &d.rows[0].features;
        assert_eq!(f.class, JobClass::Online);
        assert_eq!(f.job_l2_frac, None);
        assert_eq!(f.kernel.occupancy_frac, Some(0.61));
        assert_eq!(f.kernel.l2_hit_frac, None);
        assert_eq!(Dataset::parse(&d.to_csv()).unwrap(), d);
    }

    #[test]
    fn a_bad_value_names_its_line_and_column() {
        let row = "bert-train,offline,40,0.4286,0.5,0.8,0.55,,0,0,0,,,,,,0.5";
        let e = Dataset::parse(&format!(
            "{HEADER}\n{row}\n{}\n",
            row.replace(",40,", ",140,")
        ))
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3, column mps_share_pct: 140 is outside 1..=100"
        );
        let e = Dataset::parse(&format!("{HEADER}\n{}\n", row.replace("offline", "batch")))
            .unwrap_err();
        assert!(e.to_string().starts_with("line 2, column class:"), "{e}");
        let e = Dataset::parse(&format!(
            "{HEADER}\n{}\n",
            row.replace(",0.4286,0.5,", ",0.4286,x,")
        ))
        .unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 2, column partition_mem_frac: \"x\""),
            "{e}"
        );
        let e = Dataset::parse(&format!("{HEADER}\n{}\n", &row[..row.len() - 4])).unwrap_err();
        assert!(e.to_string().contains("16 cells; the header has 17"), "{e}");
        let e = Dataset::parse("workload,klass\n").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("line 1, column class: the header must be"),
            "{e}"
        );
        assert!(matches!(
            Dataset::parse(&format!("{HEADER}\n")),
            Err(DatasetError::Empty)
        ));
        let e = Dataset::parse(&format!(
            "{HEADER}\n{}\n",
            row.replace(",,0,0,0,", ",,0,,0,")
        ))
        .unwrap_err();
        assert_eq!(e.to_string(), "line 2, column co_sm_frac: is required");
    }
}
