//! What a user asks for: the validated job specification.
//!
//! [`JobSpec::validate`] is the one place that decides whether a spec is acceptable; the
//! YAML front end ([`crate::yaml`]) and the gRPC layer both call it, so a field that
//! is refused in `job.yaml` is refused over gRPC too, with the same field name.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::job::JobClass;
use crate::workload;

/// The largest `gpu_memory` any job may ask for (16 TiB): a guard against typos, far
/// above any GPU that exists.
pub const MAX_GPU_MEMORY_MIB: u64 = 16 * 1024 * 1024;
pub const MAX_NAME_LEN: usize = 63;
pub const MAX_ARGS: usize = 1024;
pub const MAX_ARG_BYTES: usize = 64 * 1024;
pub const MAX_ENV: usize = 1024;
/// The longest environment variable name.
pub const MAX_ENV_KEY_BYTES: usize = 256;
/// The most a command's arguments and environment take together (Linux's own limit on
/// one argument is 128 KiB, on all of them 2 MiB).
pub const MAX_COMMAND_BYTES: usize = 256 * 1024;
/// The longest path a spec may name (`workdir`, `kernel_profile`): PATH_MAX.
pub const MAX_PATH_BYTES: usize = 4096;
/// The longest reason a caller may give (a cancel's, a release's).
pub const MAX_REASON_BYTES: usize = 1024;
/// The longest latency objective an online job may declare: an hour (a service's SLO is
/// milliseconds to seconds; more is a mistake, and would overflow what planners add up).
pub const MAX_SLO_MS: u64 = 3_600_000;
/// The slowdowns an SLO may give, in percent: 1.01x to 100x.
pub const SLO_SLOWDOWN_PCT: std::ops::RangeInclusive<u32> = 101..=10_000;
pub const PRIORITY_RANGE: std::ops::RangeInclusive<i32> = -1000..=1000;
pub const MAX_RESTARTS: u32 = 100;
pub const MAX_BATCH: u32 = 65_536;
/// The longest simulated workload: 30 days.
pub const MAX_WORKLOAD_MS: u64 = 30 * 24 * 3600 * 1000;

/// A validated job specification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub name: String,
    pub class: JobClass,
    /// GPU memory the job needs, in MiB.
    pub gpu_memory_mib: u64,
    /// Online jobs: the latency objective per request, in milliseconds (its p99).
    pub slo_ms: Option<u64>,
    /// Online jobs: the objective as a slowdown its p99 may have against the job alone,
    /// in percent (300: at most 3x); at most one of this and `slo_ms`. Neither: mmkd's
    /// default objective (docs/slo.md).
    #[serde(default)]
    pub slo_slowdown_pct: Option<u32>,
    /// Higher runs first among queued jobs; default 0.
    pub priority: i32,
    pub task: Task,
    /// The job can be stopped (SIGTERM) and resumed with `MMK_RESUME=1`.
    pub checkpoint: bool,
    pub restart_policy: RestartPolicy,
    /// How many times mmk restarts the job under its restart policy.
    pub max_restarts: u32,
    /// The job wants its partition to itself: the planner assumes it fills it and places
    /// no other job beside it (docs/planner.md, "What the planner knows of a job").
    #[serde(default)]
    pub exclusive: bool,
    /// The name under which mmkd keeps what it learns of the job's GPU use (its learned
    /// profile), shared by every job of the same owner that gives the same key; none: the
    /// owner, the job's name and its command (docs/planner.md, "Learned profiles").
    #[serde(default)]
    pub profile_key: Option<String>,
}

/// What the job runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Task {
    /// A managed process.
    Command(CommandSpec),
    /// A named workload profile, run by the simulated node.
    Workload(WorkloadSpec),
    /// An attached allocation: mmk reserves the partition and the share, and the caller
    /// (`mmkctl run`, Slurm, the Kubernetes device plugin) starts the process itself with
    /// the environment mmk returns.
    Attached(AttachedSpec),
}

/// The longest lease an attached allocation may ask for: one day.
pub const MAX_LEASE_MS: u64 = 24 * 3600 * 1000;
/// The shortest: one second (a renewer needs a few turns inside it).
pub const MIN_LEASE_MS: u64 = 1000;

/// An attached allocation. It ends when its watched process ends, when its lease is not
/// renewed in time, or when the caller releases it; at least one of `pid` and `lease_ms`
/// is set, so that an allocation whose caller died is always freed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct AttachedSpec {
    /// The workload (by name) whose demands the planner assumes, as for a command job.
    #[serde(default)]
    pub profile: Option<String>,
    /// A process on the node whose end releases the allocation.
    #[serde(default)]
    pub pid: Option<u32>,
    /// The lease: the allocation is released when it is not renewed for this long.
    #[serde(default)]
    pub lease_ms: Option<u64>,
    /// Online allocations: the kernel policy of the partition while it runs.
    #[serde(default)]
    pub kernel_policy: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct CommandSpec {
    /// The program and its arguments (`args[0]` is the program).
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    /// Absolute working directory; `mmkctl` fills in its own when the file names none.
    pub workdir: Option<String>,
    /// The workload (by name) whose demands the planner assumes for this process, until
    /// it is profiled; none: the planner assumes it fills its partition.
    #[serde(default)]
    pub profile: Option<String>,
    /// The job's kernel profile (`mmk-lab profile`), an absolute path; the `orion` and
    /// `fikit` kernel policies look its launches up there.
    #[serde(default)]
    pub kernel_profile: Option<String>,
    /// Online jobs: the kernel policy of the job's partition while it runs (one of
    /// [`KERNEL_POLICIES`]); none: mmkd's `--kernel-policy`.
    #[serde(default)]
    pub kernel_policy: Option<String>,
}

/// The kernel policies a job spec may name (`mmk_kernel_sched::PolicyKind`, whose tests
/// check that the two lists agree).
pub const KERNEL_POLICIES: [&str; 4] = ["passthrough", "mmk", "orion", "fikit"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkloadSpec {
    pub name: String,
    pub batch_size: Option<u32>,
    /// Overrides the workload's nominal solo duration (simulated milliseconds).
    pub duration_ms: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// A job that fails, or that was running when mmkd died, stays FAILED.
    #[default]
    Never,
    /// A job that fails, or that was running when mmkd died, goes back to the queue, up to
    /// `max_restarts` times.
    OnFailure,
}

impl RestartPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            RestartPolicy::Never => "never",
            RestartPolicy::OnFailure => "on-failure",
        }
    }

    pub fn parse(s: &str) -> Result<Self, UnknownValue> {
        match s {
            "never" => Ok(RestartPolicy::Never),
            "on-failure" => Ok(RestartPolicy::OnFailure),
            other => Err(UnknownValue {
                what: "restart policy",
                value: other.to_owned(),
                expected: "never or on-failure",
            }),
        }
    }
}

/// A value that is not one of those a field takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {value:?} (expected {expected})")]
pub struct UnknownValue {
    pub what: &'static str,
    pub value: String,
    pub expected: &'static str,
}

/// A refused field: `field` is the path as written in `job.yaml` (`command.args`), and
/// `line` is filled in when the spec came from a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub message: String,
    pub line: Option<u64>,
}

/// The longest field name an error carries (a field may hold a caller's map key).
pub const MAX_ERROR_FIELD: usize = 80;
/// The longest message an error carries (a message may quote the caller's input).
pub const MAX_ERROR_MESSAGE: usize = 400;

impl FieldError {
    /// A refused field. Both parts are bounded and printable whatever the caller sent:
    /// control characters are escaped and a long text is cut ([`short`]).
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: short(&field.into(), MAX_ERROR_FIELD),
            message: short(&message.into(), MAX_ERROR_MESSAGE),
            line: None,
        }
    }
}

/// `text` with control characters escaped (`\n`, `\u{0}`), cut to about `max` bytes with
/// "..." and the full length when longer.
pub fn short(text: &str, max: usize) -> String {
    let clean = |s: &str| -> String {
        s.chars()
            .flat_map(|c| {
                let escaped: Vec<char> = if c.is_control() {
                    c.escape_debug().collect()
                } else {
                    vec![c]
                };
                escaped
            })
            .collect()
    };
    if text.len() <= max && !text.chars().any(char::is_control) {
        return text.to_owned();
    }
    let mut out = String::new();
    for c in text.chars() {
        let part = clean(c.encode_utf8(&mut [0u8; 4]));
        if out.len() + part.len() > max {
            return format!("{out}... ({} bytes)", text.len());
        }
        out.push_str(&part);
    }
    out
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.line {
            Some(line) => write!(f, "line {line}: {}: {}", self.field, self.message),
            None => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

impl std::error::Error for FieldError {}

impl JobSpec {
    /// Checks every field; the first problem found is returned.
    pub fn validate(&self) -> Result<(), FieldError> {
        validate_name(&self.name)?;
        if let Some(key) = &self.profile_key {
            validate_profile_key(key)?;
        }
        if self.gpu_memory_mib == 0 {
            return Err(FieldError::new("gpu_memory", "must be greater than zero"));
        }
        if self.gpu_memory_mib > MAX_GPU_MEMORY_MIB {
            return Err(FieldError::new(
                "gpu_memory",
                format!(
                    "{} MiB is larger than any GPU (at most 16TiB)",
                    self.gpu_memory_mib
                ),
            ));
        }
        match (self.class, self.slo_slowdown_pct, self.slo_ms) {
            (JobClass::Offline, Some(_), _) => {
                return Err(FieldError::new("slo", "only online jobs have an SLO"));
            }
            (_, Some(_), Some(_)) => {
                return Err(FieldError::new(
                    "slo",
                    "give a latency (50ms) or a slowdown (3x), not both",
                ));
            }
            (_, Some(pct), None) if !SLO_SLOWDOWN_PCT.contains(&pct) => {
                return Err(FieldError::new(
                    "slo",
                    format!(
                        "a slowdown of {:.2}x is outside 1.01x..=100x",
                        f64::from(pct) / 100.0
                    ),
                ));
            }
            _ => {}
        }
        match (self.class, self.slo_ms) {
            (JobClass::Offline, Some(_)) => {
                return Err(FieldError::new("slo", "only online jobs have an SLO"));
            }
            (_, Some(0)) => return Err(FieldError::new("slo", "must be greater than zero")),
            (_, Some(ms)) if ms > MAX_SLO_MS => {
                return Err(FieldError::new(
                    "slo",
                    format!("{ms} ms is longer than the longest SLO, {MAX_SLO_MS} ms (1h)"),
                ));
            }
            _ => {}
        }
        if !PRIORITY_RANGE.contains(&self.priority) {
            return Err(FieldError::new(
                "priority",
                format!("{} is outside -1000..=1000", self.priority),
            ));
        }
        if self.checkpoint && self.class == JobClass::Online {
            return Err(FieldError::new(
                "checkpoint",
                "only offline jobs are checkpointed and moved",
            ));
        }
        if self.max_restarts > MAX_RESTARTS {
            return Err(FieldError::new(
                "max_restarts",
                format!("{} is more than {MAX_RESTARTS}", self.max_restarts),
            ));
        }
        let (policy_field, policy) = match &self.task {
            Task::Command(c) => ("command.kernel_policy", c.kernel_policy.as_deref()),
            Task::Attached(a) => ("attached.kernel_policy", a.kernel_policy.as_deref()),
            Task::Workload(_) => ("", None),
        };
        if let Some(p) = policy {
            if self.class == JobClass::Offline {
                return Err(FieldError::new(
                    policy_field,
                    "only an online job chooses its partition's kernel policy",
                ));
            }
            check_kernel_policy(policy_field, p)?;
        }
        match &self.task {
            Task::Command(c) => validate_command(c),
            Task::Workload(w) => validate_workload(w),
            Task::Attached(a) => self.validate_attached(a),
        }
    }
}

impl JobSpec {
    fn validate_attached(&self, a: &AttachedSpec) -> Result<(), FieldError> {
        // The caller runs the process: mmk can neither restart nor move it.
        if self.checkpoint {
            return Err(FieldError::new(
                "checkpoint",
                "an attached allocation is not moved: its caller runs the process",
            ));
        }
        if self.restart_policy != RestartPolicy::Never {
            return Err(FieldError::new(
                "restart_policy",
                "an attached allocation is not restarted: its caller runs the process",
            ));
        }
        if a.pid.is_none() && a.lease_ms.is_none() {
            return Err(FieldError::new(
                "attached",
                "give a pid to watch or a lease (or both), so that the allocation ends when its caller does",
            ));
        }
        if a.pid == Some(0) {
            return Err(FieldError::new("attached.pid", "0 is not a process"));
        }
        if let Some(ms) = a.lease_ms
            && !(MIN_LEASE_MS..=MAX_LEASE_MS).contains(&ms)
        {
            return Err(FieldError::new(
                "attached.lease",
                format!("{ms} ms is outside {MIN_LEASE_MS} ms..=1 day"),
            ));
        }
        if let Some(p) = &a.profile {
            check_profile("attached.profile", p)?;
        }
        Ok(())
    }
}

fn check_kernel_policy(field: &str, p: &str) -> Result<(), FieldError> {
    if KERNEL_POLICIES.contains(&p) {
        return Ok(());
    }
    Err(FieldError::new(
        field,
        format!(
            "unknown kernel policy {p:?}; one of: {}",
            KERNEL_POLICIES.join(", ")
        ),
    ))
}

fn check_profile(field: &str, p: &str) -> Result<(), FieldError> {
    if workload::find(p).is_some() {
        return Ok(());
    }
    Err(FieldError::new(
        field,
        format!(
            "unknown workload {p:?}; known: {}",
            workload::names().join(", ")
        ),
    ))
}

/// A short, stable digest of a command's arguments (16 hex digits of their SHA-256, the
/// arguments separated by NUL): part of a job's learned-profile signature.
pub fn command_digest(args: &[String]) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for a in args {
        h.update(a.as_bytes());
        h.update([0u8]);
    }
    h.finalize()[..8]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The longest `profile_key`.
pub const MAX_PROFILE_KEY_LEN: usize = 128;

/// A profile key: like a name, with '/' and ':' allowed too (`team/model:v2`).
pub fn validate_profile_key(key: &str) -> Result<(), FieldError> {
    if key.is_empty() {
        return Err(FieldError::new("profile_key", "must not be empty"));
    }
    if key.len() > MAX_PROFILE_KEY_LEN {
        return Err(FieldError::new(
            "profile_key",
            format!("is {} characters; at most {MAX_PROFILE_KEY_LEN}", key.len()),
        ));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ':');
    if !key.starts_with(|c: char| c.is_ascii_alphanumeric()) || !key.chars().all(ok_char) {
        return Err(FieldError::new(
            "profile_key",
            format!(
                "{key:?} may hold only letters, digits, '-', '_', '.', '/' and ':', and starts with a letter or digit"
            ),
        ));
    }
    Ok(())
}

fn validate_name(name: &str) -> Result<(), FieldError> {
    if name.trim().is_empty() {
        return Err(FieldError::new("name", "must not be empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(FieldError::new(
            "name",
            format!("is {} characters; at most {MAX_NAME_LEN}", name.len()),
        ));
    }
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    if !name.starts_with(|c: char| c.is_ascii_alphanumeric()) || !name.chars().all(ok_char) {
        return Err(FieldError::new(
            "name",
            format!(
                "{name:?} may hold only letters, digits, '-', '_' and '.', and starts with a letter or digit"
            ),
        ));
    }
    Ok(())
}

fn validate_command(c: &CommandSpec) -> Result<(), FieldError> {
    let Some(program) = c.args.first() else {
        return Err(FieldError::new(
            "command.args",
            "must name the program to run",
        ));
    };
    if program.is_empty() {
        return Err(FieldError::new("command.args", "the program name is empty"));
    }
    if c.args.len() > MAX_ARGS {
        return Err(FieldError::new(
            "command.args",
            format!("{} arguments; at most {MAX_ARGS}", c.args.len()),
        ));
    }
    if let Some(i) = c
        .args
        .iter()
        .position(|a| a.len() > MAX_ARG_BYTES || a.contains('\0'))
    {
        return Err(FieldError::new(
            format!("command.args[{i}]"),
            "is longer than 64KiB or holds a NUL byte",
        ));
    }
    if c.env.len() > MAX_ENV {
        return Err(FieldError::new(
            "command.env",
            format!("{} variables; at most {MAX_ENV}", c.env.len()),
        ));
    }
    let total: usize = c.args.iter().map(|a| a.len() + 1).sum::<usize>()
        + c.env
            .iter()
            .map(|(k, v)| k.len() + v.len() + 2)
            .sum::<usize>();
    if total > MAX_COMMAND_BYTES {
        return Err(FieldError::new(
            "command",
            format!("its arguments and environment take {total} bytes; at most 256KiB"),
        ));
    }
    for (k, v) in &c.env {
        if k.len() > MAX_ENV_KEY_BYTES {
            return Err(FieldError::new(
                "command.env",
                format!(
                    "a variable name is {} bytes; at most {MAX_ENV_KEY_BYTES}",
                    k.len()
                ),
            ));
        }
        if k.is_empty() || k.contains('=') || k.contains('\0') {
            return Err(FieldError::new(
                format!("command.env.{k}"),
                "a variable name must be non-empty and hold no '=' or NUL",
            ));
        }
        if v.contains('\0') || v.len() > MAX_ARG_BYTES {
            return Err(FieldError::new(
                format!("command.env.{k}"),
                "is longer than 64KiB or holds a NUL byte",
            ));
        }
        if k.starts_with("MMK_") {
            return Err(FieldError::new(
                format!("command.env.{k}"),
                "MMK_ variables are set by mmk",
            ));
        }
    }
    for (field, path) in [
        ("command.workdir", &c.workdir),
        ("command.kernel_profile", &c.kernel_profile),
    ] {
        if let Some(p) = path
            && p.len() > MAX_PATH_BYTES
        {
            return Err(FieldError::new(
                field,
                format!("is {} bytes; a path is at most {MAX_PATH_BYTES}", p.len()),
            ));
        }
    }
    if let Some(dir) = &c.workdir
        && (!dir.starts_with('/') || dir.contains('\0'))
    {
        return Err(FieldError::new(
            "command.workdir",
            format!("{dir:?} must be an absolute path"),
        ));
    }
    if let Some(p) = &c.kernel_profile
        && (!p.starts_with('/') || p.contains('\0'))
    {
        return Err(FieldError::new(
            "command.kernel_profile",
            format!("{p:?} must be an absolute path"),
        ));
    }
    if let Some(p) = &c.profile {
        check_profile("command.profile", p)?;
    }
    Ok(())
}

fn validate_workload(w: &WorkloadSpec) -> Result<(), FieldError> {
    if workload::find(&w.name).is_none() {
        return Err(FieldError::new(
            "workload.name",
            format!(
                "unknown workload {:?}; known: {}",
                w.name,
                workload::names().join(", ")
            ),
        ));
    }
    if let Some(b) = w.batch_size
        && (b == 0 || b > MAX_BATCH)
    {
        return Err(FieldError::new(
            "workload.batch_size",
            format!("{b} is outside 1..={MAX_BATCH}"),
        ));
    }
    if w.duration_ms == Some(0) {
        return Err(FieldError::new(
            "workload.duration",
            "must be greater than zero",
        ));
    }
    if w.duration_ms.is_some_and(|d| d > MAX_WORKLOAD_MS) {
        return Err(FieldError::new(
            "workload.duration",
            "is longer than 30 days",
        ));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn sample() -> JobSpec {
        JobSpec {
            name: "resnet".into(),
            class: JobClass::Offline,
            gpu_memory_mib: 10 * 1024,
            slo_ms: None,
            slo_slowdown_pct: None,
            priority: 0,
            task: Task::Workload(WorkloadSpec {
                name: "resnet50-train".into(),
                batch_size: None,
                duration_ms: None,
            }),
            checkpoint: false,
            restart_policy: RestartPolicy::Never,
            max_restarts: 0,
            exclusive: false,
            profile_key: None,
        }
    }

    fn field_of(spec: &JobSpec) -> String {
        spec.validate().expect_err("must be refused").field
    }

    #[test]
    fn a_good_spec_passes() {
        assert_eq!(sample().validate(), Ok(()));
    }

    #[test]
    fn each_bad_field_is_named() {
        let mut s = sample();
        s.name = String::new();
        assert_eq!(field_of(&s), "name");

        let mut s = sample();
        s.name = "has space".into();
        assert_eq!(field_of(&s), "name");

        let mut s = sample();
        s.gpu_memory_mib = 0;
        assert_eq!(field_of(&s), "gpu_memory");

        let mut s = sample();
        s.slo_ms = Some(50);
        assert_eq!(field_of(&s), "slo");
        s.class = JobClass::Online;
        s.slo_ms = Some(u64::MAX);
        assert_eq!(field_of(&s), "slo");
        s.slo_ms = Some(MAX_SLO_MS);
        assert!(s.validate().is_ok());
        s.class = JobClass::Offline;
        s.slo_ms = Some(50);

        let mut s = sample();
        s.slo_slowdown_pct = Some(300);
        assert_eq!(field_of(&s), "slo", "offline");
        s.class = JobClass::Online;
        assert!(s.validate().is_ok());
        s.slo_ms = Some(50);
        assert_eq!(field_of(&s), "slo", "both");
        s.slo_ms = None;
        s.slo_slowdown_pct = Some(100);
        assert_eq!(field_of(&s), "slo", "1x: nothing may slow it");

        let mut s = sample();
        s.priority = 5000;
        assert_eq!(field_of(&s), "priority");

        let mut s = sample();
        s.task = Task::Workload(WorkloadSpec {
            name: "alexnet".into(),
            batch_size: None,
            duration_ms: None,
        });
        assert_eq!(field_of(&s), "workload.name");

        let mut s = sample();
        s.task = Task::Command(CommandSpec::default());
        assert_eq!(field_of(&s), "command.args");

        let mut s = sample();
        s.task = Task::Command(CommandSpec {
            args: vec!["/bin/true".into()],
            env: BTreeMap::new(),
            workdir: Some("relative/dir".into()),
            ..CommandSpec::default()
        });
        assert_eq!(field_of(&s), "command.workdir");

        let command = |kernel_profile: Option<&str>, kernel_policy: Option<&str>| {
            Task::Command(CommandSpec {
                args: vec!["/bin/true".into()],
                kernel_profile: kernel_profile.map(Into::into),
                kernel_policy: kernel_policy.map(Into::into),
                ..CommandSpec::default()
            })
        };
        let mut s = sample();
        s.task = command(Some("resnet.kprofile.json"), None);
        assert_eq!(field_of(&s), "command.kernel_profile");
        let mut s = sample();
        s.slo_ms = None;
        s.class = JobClass::Online;
        s.task = command(None, Some("lottery"));
        assert_eq!(field_of(&s), "command.kernel_policy");
        s.task = command(Some("/srv/r.json"), Some("orion"));
        assert_eq!(s.validate(), Ok(()));
        s.class = JobClass::Offline;
        assert_eq!(field_of(&s), "command.kernel_policy", "online jobs only");

        let mut s = sample();
        s.class = JobClass::Online;
        s.checkpoint = true;
        assert_eq!(field_of(&s), "checkpoint");
    }
}
