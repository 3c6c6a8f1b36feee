//! `mmkd --metrics ADDR`: the node, its partitions and its jobs in the Prometheus text
//! format, at `http://ADDR/metrics` (docs/metrics.md lists every series).
//!
//! Labels follow dcgm-exporter's where they mean the same (`gpu`, `UUID`, `GPU_I_ID`,
//! `GPU_I_PROFILE`), plus `partition` (mmkd's key of the partition, as in its gate's file
//! name); job series add `job`, `name`, `class` and `user`. Each scrape reads the node as
//! ListPartitions does; the latency histograms are kept from mmkd's start
//! (`node::NodeMetrics`).

use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, PoisonError};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tracing::{info, warn};

use mmk_core::JobState;

use crate::node::{JobSeries, Node};

/// A partition's labels.
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PartLabels {
    gpu: String,
    UUID: String,
    GPU_I_ID: String,
    GPU_I_PROFILE: String,
    partition: String,
}

/// A job's labels: its partition's and its own.
#[allow(non_snake_case)]
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct JobLabels {
    gpu: String,
    UUID: String,
    GPU_I_ID: String,
    GPU_I_PROFILE: String,
    partition: String,
    job: String,
    name: String,
    class: String,
    user: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InfoLabels {
    state: String,
    job: String,
    name: String,
    class: String,
    user: String,
    partition: String,
}

type FloatCounter = Counter<f64, AtomicU64>;

/// User names by uid, looked up once.
#[derive(Debug, Default)]
struct Users(Mutex<HashMap<u32, String>>);

/// What a metrics server keeps from one scrape to the next: user names, and the series
/// of the jobs that ended (they no longer change), made once for all the scrapes of
/// their five minutes.
#[derive(Debug, Default)]
struct Scrapes {
    users: Users,
    ended: Mutex<HashMap<u64, Arc<JobRow>>>,
    /// The length of the last scrape's text.
    last_len: std::sync::atomic::AtomicUsize,
}

impl Users {
    fn name(&self, uid: Option<u32>) -> String {
        let Some(uid) = uid else {
            return String::new();
        };
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(uid)
            .or_insert_with(|| {
                uzers::get_user_by_uid(uid).map_or_else(
                    || uid.to_string(),
                    |u| u.name().to_string_lossy().into_owned(),
                )
            })
            .clone()
    }
}

/// A job's labels: its partition's (empty before it is placed) and its own.
fn job_labels(j: &JobSeries, users: &Users) -> JobLabels {
    let a = j.assignment.as_ref();
    let mig = a.filter(|a| a.slot.profile_id.is_some());
    JobLabels {
        gpu: a.map_or_else(String::new, |a| a.slot.gpu.to_string()),
        UUID: a.map_or_else(String::new, |a| label(&a.gpu_uuid)),
        GPU_I_ID: mig.map_or_else(String::new, |a| a.instance_id.to_string()),
        GPU_I_PROFILE: mig.map_or_else(String::new, |a| label(&a.profile)),
        partition: a.map_or_else(String::new, |a| {
            crate::mps::partition_key(&a.slot, a.instance_id)
        }),
        job: j.id.to_string(),
        name: label(&j.name),
        class: j.class.as_str().to_owned(),
        user: label(&users.name(j.owner_uid)),
    }
}

/// A label value as the text exposition format writes it: backslash, double quote and
/// line feed escaped (prometheus-client writes label values as they are given). A user
/// named `a"b` gets `user="a\"b"`, not a scrape that no parser reads.
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// One job's series, as a scrape writes them.
#[derive(Debug)]
struct JobRow {
    labels: JobLabels,
    info: InfoLabels,
    /// While it runs: its MPS share, its GPU memory limit, its processes' CPU and memory.
    share: Option<i64>,
    memory_limit: Option<i64>,
    cpu_seconds: Option<f64>,
    memory: Option<i64>,
    /// Its gate's totals, over its runs (online jobs: also beside offline kernels).
    kernel_seconds: Option<f64>,
    launches: Option<u64>,
    held_seconds: Option<f64>,
    beside_offline_seconds: Option<f64>,
    queue_wait_seconds: Option<f64>,
    /// A running online job under the SLO control: its p99 over the window, the p99 its
    /// objective allows, and its p99 alone.
    slo_p99_seconds: Option<f64>,
    slo_target_seconds: Option<f64>,
    slo_alone_p99_seconds: Option<f64>,
}

impl JobRow {
    fn of(
        j: &JobSeries,
        node: &Node,
        totals: &HashMap<u64, crate::learn::sampler::JobTotals>,
        users: &Users,
    ) -> JobRow {
        let labels = job_labels(j, users);
        let running =
            matches!(j.state, JobState::Starting | JobState::Running) && j.assignment.is_some();
        let usage = running.then(|| node.runner().usage(j.id)).flatten();
        let t = totals.get(&j.id);
        let slo = running.then(|| node.slo_status(j.id)).flatten();
        let seconds = |ns: Option<u64>| ns.map(|ns| ns as f64 / 1e9);
        JobRow {
            slo_p99_seconds: seconds(slo.as_ref().and_then(|s| s.p99_ns)),
            slo_target_seconds: seconds(slo.as_ref().and_then(|s| s.target_ns)),
            slo_alone_p99_seconds: seconds(slo.as_ref().and_then(|s| s.alone_p99_ns)),
            info: InfoLabels {
                state: j.state.to_string(),
                job: labels.job.clone(),
                name: labels.name.clone(),
                class: labels.class.clone(),
                user: labels.user.clone(),
                partition: labels.partition.clone(),
            },
            share: running
                .then(|| j.assignment.as_ref().map(|a| i64::from(a.mps_share)))
                .flatten(),
            memory_limit: running.then(|| {
                i64::try_from(j.gpu_memory_mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX)
            }),
            cpu_seconds: usage.as_ref().map(|u| u.cpu_usec as f64 / 1e6),
            memory: usage
                .as_ref()
                .and_then(|u| u.memory_bytes)
                .map(|b| i64::try_from(b).unwrap_or(i64::MAX)),
            kernel_seconds: t.map(|t| t.kernel_ns as f64 / 1e9),
            launches: t.map(|t| t.launches),
            held_seconds: t.map(|t| t.held_ns as f64 / 1e9),
            beside_offline_seconds: t
                .filter(|_| j.class == mmk_core::JobClass::Online)
                .map(|t| t.beside_offline_ns as f64 / 1e9),
            queue_wait_seconds: j
                .started_at
                .map(|started| ((started - j.submitted_at).max(0)) as f64 / 1000.0),
            labels,
        }
    }
}

/// The jobs' series of one scrape, written family by family from [`JobRow`]s.
#[derive(Debug)]
struct JobSeriesCollector(Vec<Arc<JobRow>>);

impl JobSeriesCollector {
    /// One family: `value` of each row that has one.
    fn family<M: EncodeMetric>(
        &self,
        encoder: &mut DescriptorEncoder,
        name: &str,
        help: &str,
        metric_type: MetricType,
        value: impl Fn(&JobRow) -> Option<M>,
    ) -> Result<(), std::fmt::Error> {
        let mut family = encoder.encode_descriptor(name, help, None, metric_type)?;
        for row in &self.0 {
            if let Some(m) = value(row) {
                m.encode(family.encode_family(&row.labels)?)?;
            }
        }
        Ok(())
    }
}

impl Collector for JobSeriesCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let (gauge, counter) = (MetricType::Gauge, MetricType::Counter);
        self.family(
            &mut e,
            "job_mps_share_percent",
            "The job's MPS active thread percentage",
            gauge,
            |r| r.share.map(ConstGauge::new),
        )?;
        self.family(
            &mut e,
            "job_memory_limit_bytes",
            "The job's GPU memory limit",
            gauge,
            |r| r.memory_limit.map(ConstGauge::new),
        )?;
        self.family(
            &mut e,
            "job_gpu_kernel_seconds",
            "GPU time attributed to the job: time its processes had kernels in flight, over its runs",
            counter,
            |r| r.kernel_seconds.map(ConstCounter::new),
        )?;
        self.family(
            &mut e,
            "job_launches",
            "Kernel launches of the job's processes, over its runs",
            counter,
            |r| r.launches.map(ConstCounter::new),
        )?;
        self.family(
            &mut e,
            "job_held_seconds",
            "Time the job's launches spent held by the gate, over its runs",
            counter,
            |r| r.held_seconds.map(ConstCounter::new),
        )?;
        self.family(
            &mut e,
            "job_beside_offline_seconds",
            "Online jobs: time their kernels were in flight while offline kernels of the partition were too (sampled), over their runs",
            counter,
            |r| r.beside_offline_seconds.map(ConstCounter::new),
        )?;
        self.family(
            &mut e,
            "job_queue_wait_seconds",
            "Time the job waited between its submission and the start of this run",
            gauge,
            |r| r.queue_wait_seconds.map(ConstGauge::new),
        )?;
        self.family(
            &mut e,
            "job_slo_p99_seconds",
            "Running online jobs: the p99 of their requests on the GPU over the SLO control's window",
            gauge,
            |r| r.slo_p99_seconds.map(ConstGauge::new),
        )?;
        self.family(
            &mut e,
            "job_slo_target_seconds",
            "Running online jobs: the p99 their objective allows",
            gauge,
            |r| r.slo_target_seconds.map(ConstGauge::new),
        )?;
        self.family(
            &mut e,
            "job_slo_alone_p99_seconds",
            "Running online jobs: the p99 of their requests alone (the reference of a slowdown objective)",
            gauge,
            |r| r.slo_alone_p99_seconds.map(ConstGauge::new),
        )?;
        self.family(
            &mut e,
            "job_cpu_seconds",
            "CPU time of a running command job's processes (its cgroup)",
            counter,
            |r| r.cpu_seconds.map(ConstCounter::new),
        )?;
        self.family(
            &mut e,
            "job_memory_bytes",
            "Memory of a running command job's processes (its cgroup, with the memory controller)",
            gauge,
            |r| r.memory.map(ConstGauge::new),
        )?;
        let mut info = e.encode_descriptor(
            "job_info",
            "1 for each job running or ended in the last five minutes, with its state",
            None,
            gauge,
        )?;
        for row in &self.0 {
            ConstGauge::new(1i64).encode(info.encode_family(&row.info)?)?;
        }
        Ok(())
    }
}

/// The latency histograms mmkd keeps from its start.
fn register_latencies(reg: &mut Registry, m: &crate::node::NodeMetrics) {
    reg.register(
        "planning_seconds",
        "Time of one planning run",
        m.planning.clone(),
    );
    reg.register(
        "reconfiguration_seconds",
        "Time of one MIG step (creating or destroying an instance)",
        m.reconfiguration.clone(),
    );
    reg.register(
        "store_write_seconds",
        "Time of one job state change written to the node store",
        m.store_write.clone(),
    );
    reg.register(
        "job_exit_record_seconds",
        "Time from a job's end to its end recorded in the node store",
        m.exit_record.clone(),
    );
}

/// The metrics text of the node as it is now.
/// Each partition's series: its size, jobs, MPS daemon, gate and SLO control.
fn register_partitions(
    reg: &mut Registry,
    view: &[crate::node::GpuView],
    isolation_now: Vec<crate::node::PartitionIsolation>,
) {
    let part_gauge = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<PartLabels, Gauge>::default();
        reg.register(name, help, f.clone());
        f
    };
    let part_counter = |reg: &mut Registry, name: &str, help: &str| {
        let f = Family::<PartLabels, Counter>::default();
        reg.register(name, help, f.clone());
        f
    };
    let sms = part_gauge(reg, "partition_sms", "SMs of the partition");
    let memory = part_gauge(reg, "partition_memory_bytes", "GPU memory of the partition");
    let jobs = part_gauge(reg, "partition_jobs", "Jobs placed in the partition");
    let mps_up = part_gauge(
        reg,
        "partition_mps_up",
        "1 while the partition's MPS control daemon runs",
    );
    let mps_restarts = part_counter(
        reg,
        "partition_mps_restarts",
        "Restarts of the partition's MPS control daemon after it died",
    );
    let launches = part_counter(
        reg,
        "partition_gate_launches",
        "Kernel launches through the partition's gate",
    );
    let held = part_counter(
        reg,
        "partition_gate_held",
        "Launches the partition's gate held",
    );
    let forced = part_counter(
        reg,
        "partition_gate_forced",
        "Holds that the anti-starvation bound ended",
    );
    let isolation = part_gauge(
        reg,
        "partition_isolation_level",
        "The SLO control's isolation of the partition: 0 none, 1 device wait, 2 offline cap, 3 offline paused, 4 checkpointable offline jobs moved out",
    );
    let raised = part_counter(
        reg,
        "partition_isolation_raised",
        "Times the SLO control raised the partition's isolation",
    );
    let lowered = part_counter(
        reg,
        "partition_isolation_lowered",
        "Times the SLO control lowered the partition's isolation",
    );
    let levels: HashMap<String, crate::node::PartitionIsolation> = isolation_now
        .into_iter()
        .map(|p| (p.partition.clone(), p))
        .collect();
    let held_seconds = Family::<PartLabels, FloatCounter>::default();
    reg.register(
        "partition_gate_held_seconds",
        "Time launches spent held in the partition's gate",
        held_seconds.clone(),
    );

    for g in view {
        for p in &g.partitions {
            let l = PartLabels {
                gpu: g.gpu.index.to_string(),
                UUID: label(&g.gpu.uuid),
                GPU_I_ID: p.instance.map(|i| i.to_string()).unwrap_or_default(),
                GPU_I_PROFILE: if p.instance.is_some() {
                    label(&p.profile)
                } else {
                    String::new()
                },
                partition: p.key.clone(),
            };
            sms.get_or_create(&l).set(i64::from(p.sm_count));
            let iso = levels.get(&p.key);
            isolation
                .get_or_create(&l)
                .set(iso.map_or(0, |i| i64::from(i.level.level())));
            raised.get_or_create(&l).inc_by(iso.map_or(0, |i| i.raised));
            lowered
                .get_or_create(&l)
                .inc_by(iso.map_or(0, |i| i.lowered));
            memory
                .get_or_create(&l)
                .set(i64::try_from(p.memory_mib.saturating_mul(1 << 20)).unwrap_or(i64::MAX));
            jobs.get_or_create(&l)
                .set(i64::try_from(p.jobs.len()).unwrap_or(i64::MAX));
            if let Some(m) = &p.mps {
                mps_up
                    .get_or_create(&l)
                    .set(i64::from(m.pid.is_some_and(|p| p != 0)));
                mps_restarts.get_or_create(&l).inc_by(u64::from(m.restarts));
            }
            if let Some(Ok(gate)) = p.gate.as_ref().map(|g| g.state.as_ref()) {
                let t = &gate.totals;
                launches.get_or_create(&l).inc_by(t.launches);
                held.get_or_create(&l).inc_by(t.held);
                forced.get_or_create(&l).inc_by(t.forced);
                held_seconds
                    .get_or_create(&l)
                    .inc_by((t.held_ns / 1_000) as f64 / 1e6);
            }
        }
    }
}

async fn render(node: &Node, scrapes: &Scrapes) -> Result<String, String> {
    let users = &scrapes.users;
    let active = node.active_jobs().await.map_err(|e| e.to_string())?;
    let view = node.partitions(&active).await.map_err(|e| e.to_string())?;
    let counts = node.count_by_state().await.map_err(|e| e.to_string())?;
    let totals = node.job_totals();
    let mut reg = Registry::with_prefix("mmk");

    register_partitions(&mut reg, &view, node.partition_isolation());
    // Jobs that run now, and those that ended in the last five minutes (so that a scrape
    // after a job's end still reads its final counters), these from memory; their series
    // are written straight from the rows, with no map of label sets to build.
    let known: std::collections::HashSet<u64> = active.iter().map(|j| j.id).collect();
    let mut rows: Vec<Arc<JobRow>> = active
        .iter()
        .map(|j| Arc::new(JobRow::of(&JobSeries::from(j), node, &totals, users)))
        .collect();
    {
        let mut cached = scrapes.ended.lock().unwrap_or_else(PoisonError::into_inner);
        let mut now = HashMap::with_capacity(cached.len());
        node.with_recently_ended(|ended| {
            for j in ended.filter(|j| !known.contains(&j.id)) {
                let row = cached
                    .remove(&j.id)
                    .filter(|r| r.info.state == j.state.as_str())
                    .unwrap_or_else(|| Arc::new(JobRow::of(j, node, &totals, users)));
                rows.push(Arc::clone(&row));
                now.insert(j.id, row);
            }
        });
        // Those no longer recent are forgotten.
        *cached = now;
    }
    reg.register_collector(Box::new(JobSeriesCollector(rows)));

    let by_state = Family::<StateLabels, Gauge>::default();
    reg.register("jobs", "Jobs in the node store by state", by_state.clone());
    for (state, n) in counts {
        by_state
            .get_or_create(&StateLabels {
                state: state.to_string(),
            })
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    register_latencies(&mut reg, node.metrics());
    // Room for the last scrape's text and some: grown from nothing, it is copied a dozen
    // times on the way.
    let last = scrapes.last_len.load(std::sync::atomic::Ordering::Relaxed);
    let mut text = String::with_capacity(last + last / 8);
    prometheus_client::encoding::text::encode(&mut text, &reg).map_err(|e| e.to_string())?;
    scrapes
        .last_len
        .store(text.len(), std::sync::atomic::Ordering::Relaxed);
    Ok(text)
}

/// The classic Prometheus text format (0.0.4) of OpenMetrics text, for clients that do
/// not ask for OpenMetrics (`promtool check metrics`, curl): a counter family `x` is
/// named `x_total` there, as its samples are, and there is no `# EOF`.
pub fn to_classic(openmetrics: &str) -> String {
    let counters: Vec<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(&name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The `/metrics` route: OpenMetrics to a client that accepts it (Prometheus), the
/// classic text format to others.
fn router(node: Node) -> axum::Router {
    let scrapes = Arc::new(Scrapes::default());
    axum::Router::new().route(
        "/metrics",
        axum::routing::get(move |headers: axum::http::HeaderMap| {
            let node = node.clone();
            let scrapes = Arc::clone(&scrapes);
            async move {
                let open = headers
                    .get(axum::http::header::ACCEPT)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.contains("application/openmetrics-text"));
                match render(&node, &scrapes).await {
                    Ok(text) if open => (
                        axum::http::StatusCode::OK,
                        [(axum::http::header::CONTENT_TYPE, OPENMETRICS)],
                        text,
                    ),
                    Ok(text) => (
                        axum::http::StatusCode::OK,
                        [(axum::http::header::CONTENT_TYPE, CLASSIC)],
                        to_classic(&text),
                    ),
                    Err(e) => {
                        warn!(error = %e, "metrics scrape failed");
                        (
                            axum::http::StatusCode::SERVICE_UNAVAILABLE,
                            [(
                                axum::http::header::CONTENT_TYPE,
                                "text/plain; charset=utf-8",
                            )],
                            e,
                        )
                    }
                }
            }
        }),
    )
}

/// Serves `/metrics` on `listener` until `shutdown` resolves: plain HTTP without `tls`
/// (loopback), else HTTPS that takes only clients with a certificate of the client CA,
/// as mmkd's TCP API does. Connections come through [`crate::tcp`] (a few per address, a
/// few dozen in all, dropped when silent) and serve one request each: a scraper that
/// keeps connections open and idle holds no descriptors.
pub async fn serve(
    listener: TcpListener,
    node: Node,
    tls: Option<crate::tcp::TlsFiles>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = router(node);
    let tls = match tls {
        Some(files) => Some(Arc::new(crate::tcp::server_config(&files, &[b"http/1.1"])?)),
        None => None,
    };
    match &tls {
        Some(_) => {
            info!(addr = %listener.local_addr()?, "metrics listening (TLS, client certificates)")
        }
        None => info!(addr = %listener.local_addr()?, "metrics listening"),
    }
    let mut conns = crate::tcp::incoming(
        listener,
        tls,
        crate::tcp::METRICS_LIMITS,
        crate::tcp::Opening::Any,
        "metrics",
    );
    tokio::pin!(shutdown);
    loop {
        let conn = tokio::select! {
            () = &mut shutdown => return Ok(()),
            conn = conns.recv() => match conn {
                Some(Ok(conn)) => conn,
                Some(Err(_)) => continue,
                None => return Ok(()),
            },
        };
        let app = app.clone();
        tokio::spawn(async move {
            let service = hyper_util::service::TowerToHyperService::new(app);
            let mut http =
                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
            http.http1().keep_alive(false);
            // A request that is slow to come whole is cut off with its connection.
            let _ = tokio::time::timeout(
                SCRAPE_CONNECTION,
                http.serve_connection(hyper_util::rt::TokioIo::new(conn), service),
            )
            .await;
        });
    }
}

/// The longest a metrics connection stays open (its one request and answer).
const SCRAPE_CONNECTION: std::time::Duration = std::time::Duration::from_secs(60);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_as_the_classic_format_names_them() {
        let open = "# HELP mmk_job_launches Kernel launches.\n# TYPE mmk_job_launches counter\nmmk_job_launches_total{job=\"1\"} 600\n# HELP mmk_jobs Jobs.\n# TYPE mmk_jobs gauge\nmmk_jobs{state=\"QUEUED\"} 2\n# EOF\n";
        assert_eq!(
            to_classic(open),
            "# HELP mmk_job_launches_total Kernel launches.\n# TYPE mmk_job_launches_total counter\nmmk_job_launches_total{job=\"1\"} 600\n# HELP mmk_jobs Jobs.\n# TYPE mmk_jobs gauge\nmmk_jobs{state=\"QUEUED\"} 2\n"
        );
    }

    #[test]
    fn label_values_are_escaped_as_the_exposition_format_requires() {
        assert_eq!(label("alice"), "alice");
        assert_eq!(label("a\"b"), "a\\\"b");
        assert_eq!(label("back\\slash\nline"), "back\\\\slash\\nline");
        let mut registry = prometheus_client::registry::Registry::default();
        let family = Family::<InfoLabels, Gauge>::default();
        registry.register("mmk_job_info", "Job.", family.clone());
        family
            .get_or_create(&InfoLabels {
                state: "RUNNING".into(),
                job: "1".into(),
                name: "n".into(),
                class: "online".into(),
                user: label("a\"b"),
                partition: String::new(),
            })
            .set(1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("user=\"a\\\"b\""), "{text}");
    }
}
