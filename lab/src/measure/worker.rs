//! The GPU monitor (NVML GPM) and the worker process that runs the measured jobs.

use super::*;

// ---------------------------------------------------------------------------------------
// The GPU's side: GPM metrics over a window, and a process's memory.

/// What mmk-lab reads from the GPU while workers run.
pub trait Monitor {
    fn gpu(&self) -> Option<GpuInfo>;
    /// Waits until `end_ns` (CLOCK_MONOTONIC) and returns the GPM metrics between
    /// `start_ns` and `end_ns`.
    fn window(&self, start_ns: u64, end_ns: u64) -> Result<Gpm, MeasureError>;
    /// GPU memory a process uses, if the driver tells.
    fn process_memory(&self, pid: u32) -> Option<u64>;
}

pub(crate) fn sleep_until(ns: u64) {
    let now = monotonic_ns();
    if ns > now {
        std::thread::sleep(Duration::from_nanos(ns - now));
    }
}

/// No GPU metrics (`--no-gpm`, or NVML could not start): windows only wait.
#[derive(Debug)]
pub struct NoMonitor {
    pub reason: String,
}

impl Monitor for NoMonitor {
    fn gpu(&self) -> Option<GpuInfo> {
        None
    }
    fn window(&self, _start_ns: u64, end_ns: u64) -> Result<Gpm, MeasureError> {
        sleep_until(end_ns);
        Err(MeasureError::NoGpm(self.reason.clone()))
    }
    fn process_memory(&self, _pid: u32) -> Option<u64> {
        None
    }
}

/// NVML: GPM samples at the window's two ends (Hopper and newer).
pub struct NvmlMonitor {
    pub(crate) nvml: nvml_wrapper::Nvml,
    pub(crate) index: u32,
}

impl std::fmt::Debug for NvmlMonitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlMonitor")
            .field("index", &self.index)
            .finish_non_exhaustive()
    }
}

impl NvmlMonitor {
    pub fn new(index: u32) -> Result<NvmlMonitor, MeasureError> {
        let nvml = nvml_wrapper::Nvml::init().map_err(nvml_error("init"))?;
        nvml.device_by_index(index)
            .map_err(nvml_error(format!("GPU {index}")))?;
        Ok(NvmlMonitor { nvml, index })
    }
}

impl Monitor for NvmlMonitor {
    fn gpu(&self) -> Option<GpuInfo> {
        let d = self.nvml.device_by_index(self.index).ok()?;
        Some(GpuInfo {
            index: self.index,
            name: d.name().unwrap_or_default(),
            driver: self.nvml.sys_driver_version().unwrap_or_default(),
            memory_bytes: d.memory_info().map(|m| m.total).unwrap_or(0),
            mig_enabled: d.mig_mode().ok().map(|m| m.current == 1),
        })
    }

    fn window(&self, start_ns: u64, end_ns: u64) -> Result<Gpm, MeasureError> {
        use nvml_wrapper::enums::gpm::GpmMetricId as M;
        let d = self
            .nvml
            .device_by_index(self.index)
            .map_err(nvml_error(format!("GPU {}", self.index)))?;
        sleep_until(start_ns);
        let first = d.gpm_sample();
        sleep_until(end_ns);
        let second = d.gpm_sample();
        let (first, second) = (
            first.map_err(nvml_error("GPM sample"))?,
            second.map_err(nvml_error("GPM sample"))?,
        );
        let ids = [
            M::SmUtil,
            M::SmOccupancy,
            M::DramBwUtil,
            M::AnyTensorUtil,
            M::Fp32Util,
            M::Fp16Util,
        ];
        let got = nvml_wrapper::gpm::gpm_metrics_get(&self.nvml, &first, &second, &ids)
            .map_err(nvml_error("GPM metrics"))?;
        let v = |i: usize| {
            got.get(i)
                .and_then(|r| r.as_ref().ok())
                .map(|m| m.value)
                .filter(|v| v.is_finite())
        };
        Ok(Gpm {
            sm_util_pct: v(0),
            sm_occupancy_pct: v(1),
            dram_bw_util_pct: v(2),
            any_tensor_util_pct: v(3),
            fp32_util_pct: v(4),
            fp16_util_pct: v(5),
        })
    }

    fn process_memory(&self, pid: u32) -> Option<u64> {
        use nvml_wrapper::enums::device::UsedGpuMemory;
        let d = self.nvml.device_by_index(self.index).ok()?;
        d.running_compute_processes()
            .ok()?
            .into_iter()
            .find(|p| p.pid == pid)
            .and_then(|p| match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => Some(b),
                UsedGpuMemory::Unavailable => None,
            })
    }
}

// ---------------------------------------------------------------------------------------
// Workers.

/// How long a worker may take to build and warm a workload, and past a window's end.
pub(crate) const PREPARE_TIMEOUT: Duration = Duration::from_secs(300);
pub(crate) const MEASURE_GRACE: Duration = Duration::from_secs(120);
/// A worker's start (importing its framework) and its answer to `info`.
pub(crate) const INFO_TIMEOUT: Duration = Duration::from_secs(120);

pub(crate) struct Worker {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) lines: Receiver<String>,
    pub(crate) share: u32,
}

/// How a worker is started beyond the plan's command: a program in front of it (ncu) and
/// its environment.
#[derive(Debug, Clone, Default)]
pub(crate) struct Launch {
    pub(crate) prefix: Vec<OsString>,
    pub(crate) env: Vec<(String, String)>,
    pub(crate) env_remove: Vec<String>,
}

impl Worker {
    pub(crate) fn spawn(plan: &Plan, share: u32, log: &Path) -> Result<Worker, MeasureError> {
        Worker::spawn_with(plan, share, log, &Launch::default())
    }

    pub(crate) fn spawn_with(
        plan: &Plan,
        share: u32,
        log: &Path,
        how: &Launch,
    ) -> Result<Worker, MeasureError> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| MeasureError::Io {
                op: "open",
                path: log.to_path_buf(),
                source,
            })?;
        let mut argv: Vec<OsString> = how.prefix.clone();
        argv.extend(plan.worker.iter().map(OsString::from));
        let mut cmd = Command::new(&argv[0]);
        cmd.args(&argv[1..]);
        for k in &how.env_remove {
            cmd.env_remove(k);
        }
        let mut child = cmd
            .envs(how.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&plan.dir)
            .env("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", share.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|e| {
                MeasureError::Worker(format!("cannot start the worker {:?}: {e}", argv[0]))
            })?;
        let (stdin, stdout) = match (child.stdin.take(), child.stdout.take()) {
            (Some(i), Some(o)) => (i, o),
            _ => {
                return Err(MeasureError::Worker(
                    "the worker's pipes were not made".into(),
                ));
            }
        };
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                // A profiler in front of the worker (ncu's `==PROF==`) speaks too.
                if line.starts_with("==") {
                    eprintln!("{line}");
                    continue;
                }
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Worker {
            child,
            stdin,
            lines,
            share,
        })
    }

    pub(crate) fn send(&mut self, req: &Value) -> Result<(), MeasureError> {
        writeln!(self.stdin, "{req}")
            .and_then(|()| self.stdin.flush())
            .map_err(|e| {
                MeasureError::Worker(format!("the worker at {} % is gone ({e})", self.share))
            })
    }

    pub(crate) fn reply(&mut self, timeout: Duration) -> Result<Map<String, Value>, MeasureError> {
        let line = match self.lines.recv_timeout(timeout) {
            Ok(l) => l,
            Err(RecvTimeoutError::Timeout) => {
                return Err(MeasureError::Worker(format!(
                    "the worker at {} % did not answer within {}",
                    self.share,
                    humantime::format_duration(timeout)
                )));
            }
            Err(RecvTimeoutError::Disconnected) => {
                let status = self.child.try_wait().ok().flatten();
                return Err(MeasureError::Worker(format!(
                    "the worker at {} % exited{} (its log says why)",
                    self.share,
                    status.map(|s| format!(" ({s})")).unwrap_or_default()
                )));
            }
        };
        let v: Value = serde_json::from_str(&line).map_err(|e| {
            MeasureError::Worker(format!(
                "the worker at {} % answered {:?}, not JSON ({e})",
                self.share,
                truncate(&line)
            ))
        })?;
        let Value::Object(m) = v else {
            return Err(MeasureError::Worker(format!(
                "the worker at {} % answered {}, not an object",
                self.share,
                truncate(&line)
            )));
        };
        if m.get("ok") == Some(&Value::Bool(true)) {
            Ok(m)
        } else {
            Err(MeasureError::Worker(
                m.get("error")
                    .and_then(Value::as_str)
                    .map(str::to_owned)
                    .unwrap_or_else(|| format!("the worker answered {}", truncate(&line))),
            ))
        }
    }

    pub(crate) fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = writeln!(self.stdin, "{}", json!({"op": "quit"}));
        let _ = self.stdin.flush();
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if !matches!(self.child.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn truncate(s: &str) -> String {
    s.chars().take(200).collect()
}

/// One worker's iterations ([end, seconds] each) as a job result.
pub(crate) fn job_result(
    job: JobRef,
    class: JobClass,
    reply: &Map<String, Value>,
) -> Result<JobResult, MeasureError> {
    let iters = reply
        .get("iters")
        .and_then(Value::as_array)
        .ok_or_else(|| MeasureError::Worker("the measure reply has no iters list".into()))?;
    let mut d: Vec<f64> = Vec::with_capacity(iters.len());
    for it in iters {
        let secs = it
            .as_array()
            .and_then(|a| a.get(1))
            .and_then(Value::as_f64)
            .filter(|s| s.is_finite() && *s > 0.0)
            .ok_or_else(|| {
                MeasureError::Worker(format!(
                    "iters: {} is not [END, SECONDS]",
                    truncate(&it.to_string())
                ))
            })?;
        d.push(secs);
    }
    d.sort_by(f64::total_cmp);
    let mean = if d.is_empty() {
        0.0
    } else {
        d.iter().sum::<f64>() / d.len() as f64
    };
    Ok(JobResult {
        job,
        class,
        iters: d.len() as u32,
        mean_s: mean,
        p50_s: quantile(&d, 0.5),
        p99_s: quantile(&d, 0.99),
        mem_bytes: None,
        process_mem_bytes: None,
    })
}

pub(crate) fn class_of(reply: &Map<String, Value>) -> Result<JobClass, MeasureError> {
    match reply.get("class").and_then(Value::as_str) {
        Some("online") => Ok(JobClass::Online),
        Some("offline") => Ok(JobClass::Offline),
        other => Err(MeasureError::Worker(format!(
            "the prepare reply's class is {other:?}, not online or offline"
        ))),
    }
}
