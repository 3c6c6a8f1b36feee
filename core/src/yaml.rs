//! `job.yaml`: parsing with errors that name the field and the line.
//!
//! The file is read into a raw form that remembers where each field stood, converted to a
//! [`JobSpec`], and checked by [`JobSpec::validate`]; a refused field gets its line back from
//! the raw form. The format is documented in docs/job-spec.md.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_saphyr::Spanned;

use crate::job::JobClass;
use crate::spec::{CommandSpec, FieldError, JobSpec, RestartPolicy, Task, WorkloadSpec};
use crate::units;

/// The largest `job.yaml` accepted (1 MiB): a job spec is a few hundred bytes.
pub const MAX_JOB_FILE_BYTES: usize = 1024 * 1024;

/// A scalar written either as a number or as a string (`gpu_memory: 10GiB` or `4096`).
#[derive(Debug, Clone)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_owned()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    name: Spanned<String>,
    #[serde(default)]
    class: Option<Spanned<String>>,
    gpu_memory: Spanned<Scalar>,
    #[serde(default)]
    slo: Option<Spanned<Scalar>>,
    #[serde(default)]
    priority: Option<Spanned<i64>>,
    #[serde(default)]
    command: Option<Spanned<RawCommand>>,
    #[serde(default)]
    workload: Option<Spanned<RawWorkload>>,
    #[serde(default)]
    checkpoint: Option<Spanned<bool>>,
    exclusive: Option<Spanned<bool>>,
    #[serde(default)]
    profile_key: Option<Spanned<String>>,
    #[serde(default)]
    restart_policy: Option<Spanned<String>>,
    #[serde(default)]
    max_restarts: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCommand {
    args: Spanned<Vec<String>>,
    #[serde(default)]
    env: Option<Spanned<BTreeMap<String, Scalar>>>,
    #[serde(default)]
    workdir: Option<Spanned<String>>,
    #[serde(default)]
    profile: Option<Spanned<String>>,
    #[serde(default)]
    kernel_profile: Option<Spanned<String>>,
    #[serde(default)]
    kernel_policy: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawWorkload {
    name: Spanned<String>,
    #[serde(default)]
    batch_size: Option<Spanned<i64>>,
    #[serde(default)]
    duration: Option<Spanned<Scalar>>,
}

/// Where each field stood, so that a validation error can name the line.
#[derive(Default)]
struct Lines(BTreeMap<String, u64>);

impl Lines {
    fn note<T>(&mut self, field: &str, s: &Spanned<T>) {
        self.0.insert(field.to_owned(), s.referenced.line());
    }

    /// The line of `field`, or of its closest parent (`command.env.X` -> `command.env`).
    fn of(&self, field: &str) -> Option<u64> {
        let mut f = field;
        loop {
            if let Some(l) = self.0.get(f) {
                return Some(*l);
            }
            let cut = f.rfind(['.', '['])?;
            f = &f[..cut];
        }
    }
}

/// Parses and validates a `job.yaml`. `class` comes from `--online`/`--offline`; when both
/// the file and the flag give a class they must agree.
pub fn parse_job_yaml(text: &str, class: Option<JobClass>) -> Result<JobSpec, FieldError> {
    if text.len() > MAX_JOB_FILE_BYTES {
        return Err(FieldError::new(
            "file",
            format!(
                "is {} bytes; a job file is at most {MAX_JOB_FILE_BYTES} bytes",
                text.len()
            ),
        ));
    }
    let raw: RawSpec = serde_saphyr::from_str(text).map_err(|e| {
        let plain = e.without_snippet();
        FieldError {
            field: String::new(),
            message: first_line(&plain.to_string()),
            line: plain.location().map(|l| l.line()),
        }
    })?;
    let mut lines = Lines::default();
    let spec = convert(raw, class, &mut lines).map_err(|mut e| {
        e.line = e.line.or_else(|| lines.of(&e.field));
        e
    })?;
    spec.validate().map_err(|mut e| {
        e.line = lines.of(&e.field);
        e
    })?;
    Ok(spec)
}

fn first_line(s: &str) -> String {
    s.lines().next().unwrap_or_default().trim().to_owned()
}

fn at<T>(field: &str, s: &Spanned<T>, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_owned(),
        message: message.into(),
        line: Some(s.referenced.line()),
    }
}

fn convert(
    raw: RawSpec,
    flag_class: Option<JobClass>,
    lines: &mut Lines,
) -> Result<JobSpec, FieldError> {
    lines.note("name", &raw.name);
    lines.note("gpu_memory", &raw.gpu_memory);

    let file_class = match &raw.class {
        Some(c) => {
            lines.note("class", c);
            Some(c.value.parse::<JobClass>().map_err(|m| at("class", c, m))?)
        }
        None => None,
    };
    let class = match (file_class, flag_class) {
        (Some(f), Some(g)) if f != g => {
            return Err(FieldError {
                field: "class".into(),
                message: format!("the file says {f} but --{g} was given"),
                line: lines.of("class"),
            });
        }
        (Some(c), _) | (None, Some(c)) => c,
        (None, None) => {
            return Err(FieldError::new(
                "class",
                "missing: write `class: online` or `class: offline`, or pass --online/--offline",
            ));
        }
    };

    let gpu_memory_mib = units::parse_memory_mib(&raw.gpu_memory.value.0)
        .map_err(|e| at("gpu_memory", &raw.gpu_memory, e.to_string()))?;
    let (slo_ms, slo_slowdown_pct) = match &raw.slo {
        Some(s) => {
            lines.note("slo", s);
            match units::parse_objective(&s.value.0).map_err(|e| at("slo", s, e.to_string()))? {
                units::Objective::LatencyMs(ms) => (Some(ms), None),
                units::Objective::SlowdownPct(pct) => (None, Some(pct)),
            }
        }
        None => (None, None),
    };
    let priority = match &raw.priority {
        Some(p) => {
            lines.note("priority", p);
            i32::try_from(p.value).map_err(|_| at("priority", p, "is outside -1000..=1000"))?
        }
        None => 0,
    };
    let checkpoint = raw.checkpoint.as_ref().is_some_and(|c| {
        lines.note("checkpoint", c);
        c.value
    });
    let exclusive = raw.exclusive.as_ref().is_some_and(|c| {
        lines.note("exclusive", c);
        c.value
    });
    let profile_key = match raw.profile_key {
        Some(k) => {
            lines.note("profile_key", &k);
            crate::spec::validate_profile_key(&k.value)
                .map_err(|e| at("profile_key", &k, e.message))?;
            Some(k.value)
        }
        None => None,
    };
    let restart_policy = match &raw.restart_policy {
        Some(r) => {
            lines.note("restart_policy", r);
            RestartPolicy::parse(&r.value).map_err(|e| at("restart_policy", r, e.to_string()))?
        }
        None => RestartPolicy::Never,
    };
    let max_restarts = match &raw.max_restarts {
        Some(m) => {
            lines.note("max_restarts", m);
            u32::try_from(m.value).map_err(|_| at("max_restarts", m, "must be 0 or more"))?
        }
        None if restart_policy == RestartPolicy::OnFailure => 3,
        None => 0,
    };

    let task = match (raw.command, raw.workload) {
        (Some(c), None) => Task::Command(convert_command(c, lines)?),
        (None, Some(w)) => Task::Workload(convert_workload(w, lines)?),
        (Some(c), Some(_)) => {
            return Err(at(
                "workload",
                &c,
                "give either command or workload, not both",
            ));
        }
        (None, None) => {
            return Err(FieldError::new(
                "command",
                "missing: give `command:` (a process to run) or `workload:` (a named profile)",
            ));
        }
    };

    Ok(JobSpec {
        name: raw.name.value,
        class,
        gpu_memory_mib,
        slo_ms,
        slo_slowdown_pct,
        priority,
        task,
        checkpoint,
        restart_policy,
        max_restarts,
        exclusive,
        profile_key,
    })
}

fn convert_command(c: Spanned<RawCommand>, lines: &mut Lines) -> Result<CommandSpec, FieldError> {
    lines.note("command", &c);
    let c = c.value;
    lines.note("command.args", &c.args);
    let env = match c.env {
        Some(env) => {
            lines.note("command.env", &env);
            env.value.into_iter().map(|(k, v)| (k, v.0)).collect()
        }
        None => BTreeMap::new(),
    };
    let workdir = c.workdir.map(|w| {
        lines.note("command.workdir", &w);
        w.value
    });
    let profile = c.profile.map(|p| {
        lines.note("command.profile", &p);
        p.value
    });
    let kernel_profile = c.kernel_profile.map(|p| {
        lines.note("command.kernel_profile", &p);
        p.value
    });
    let kernel_policy = c.kernel_policy.map(|p| {
        lines.note("command.kernel_policy", &p);
        p.value
    });
    Ok(CommandSpec {
        args: c.args.value,
        env,
        workdir,
        profile,
        kernel_profile,
        kernel_policy,
    })
}

fn convert_workload(
    w: Spanned<RawWorkload>,
    lines: &mut Lines,
) -> Result<WorkloadSpec, FieldError> {
    lines.note("workload", &w);
    let w = w.value;
    lines.note("workload.name", &w.name);
    let batch_size = match &w.batch_size {
        Some(b) => {
            lines.note("workload.batch_size", b);
            Some(u32::try_from(b.value).map_err(|_| {
                at(
                    "workload.batch_size",
                    b,
                    format!("{} is not a batch size", b.value),
                )
            })?)
        }
        None => None,
    };
    let duration_ms = match &w.duration {
        Some(d) => {
            lines.note("workload.duration", d);
            let dur = units::parse_duration(&d.value.0)
                .map_err(|e| at("workload.duration", d, e.to_string()))?;
            Some(u64::try_from(dur.as_millis()).unwrap_or(u64::MAX).max(1))
        }
        None => None,
    };
    Ok(WorkloadSpec {
        name: w.name.value,
        batch_size,
        duration_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
name: resnet50-serving
class: online
gpu_memory: 8GiB
slo: 50ms
priority: 10
workload:
  name: resnet50-inference
  batch_size: 8
";

    #[test]
    fn parses_a_good_file() {
        let spec = parse_job_yaml(GOOD, None).expect("valid");
        assert_eq!(spec.name, "resnet50-serving");
        assert_eq!(spec.class, JobClass::Online);
        assert_eq!(spec.gpu_memory_mib, 8192);
        assert_eq!(spec.slo_ms, Some(50));
        assert_eq!(spec.priority, 10);
        assert_eq!(
            spec.task,
            Task::Workload(WorkloadSpec {
                name: "resnet50-inference".into(),
                batch_size: Some(8),
                duration_ms: None
            })
        );
    }

    #[test]
    fn an_slo_is_a_latency_or_a_slowdown_against_running_alone() {
        let spec = parse_job_yaml(&GOOD.replace("slo: 50ms", "slo: 2.5x"), None).unwrap();
        assert_eq!((spec.slo_ms, spec.slo_slowdown_pct), (None, Some(250)));
        let err = parse_job_yaml(&GOOD.replace("slo: 50ms", "slo: soon"), None).unwrap_err();
        assert!(err.to_string().contains("slo"), "{err}");
        assert!(err.to_string().contains("slowdown like 3x"), "{err}");
    }

    #[test]
    fn command_jobs_keep_args_env_and_workdir() {
        let yaml = "name: train\nclass: offline\ngpu_memory: 20GiB\ncheckpoint: true\n\
                    command:\n  args: [python3, train.py, --epochs, '3']\n  env:\n    PORT: 8080\n  workdir: /srv/train\n";
        let spec = parse_job_yaml(yaml, None).expect("valid");
        let Task::Command(c) = spec.task else {
            panic!("expected a command task")
        };
        assert_eq!(c.args, ["python3", "train.py", "--epochs", "3"]);
        assert_eq!(c.env.get("PORT").map(String::as_str), Some("8080"));
        assert_eq!(c.workdir.as_deref(), Some("/srv/train"));
        assert!(spec.checkpoint);
    }

    #[test]
    fn a_command_may_name_the_workload_it_resembles() {
        let yaml = "name: serve\nclass: online\ngpu_memory: 4GiB\n\
                    command:\n  args: [python3, serve.py]\n  profile: resnet50-inference\n";
        let spec = parse_job_yaml(yaml, None).expect("valid");
        let Task::Command(c) = spec.task else {
            panic!("expected a command task")
        };
        assert_eq!(c.profile.as_deref(), Some("resnet50-inference"));
        let e = err("name: serve\nclass: online\ngpu_memory: 4GiB\n\
                     command:\n  args: [python3, serve.py]\n  profile: resnet51\n");
        assert_eq!((e.field.as_str(), e.line), ("command.profile", Some(6)));
        assert!(e.message.contains("unknown workload \"resnet51\""), "{e}");
    }

    #[test]
    fn a_profile_key_is_kept_and_a_bad_one_named() {
        let yaml = "name: serve\nclass: online\ngpu_memory: 4GiB\nprofile_key: team/bert:v2\n\
                    command:\n  args: [python3, serve.py]\n";
        let spec = parse_job_yaml(yaml, None).expect("valid");
        assert_eq!(spec.profile_key.as_deref(), Some("team/bert:v2"));
        let e = err(
            "name: serve\nclass: online\ngpu_memory: 4GiB\nprofile_key: 'a b'\n\
                     command:\n  args: [python3, serve.py]\n",
        );
        assert_eq!((e.field.as_str(), e.line), ("profile_key", Some(4)));
        assert!(e.message.contains("may hold only"), "{e}");
    }

    fn err(yaml: &str) -> FieldError {
        parse_job_yaml(yaml, None).expect_err("must be refused")
    }

    #[test]
    fn negative_memory_names_field_and_line() {
        let e =
            err("name: a\nclass: offline\ngpu_memory: -5GiB\nworkload:\n  name: resnet50-train\n");
        assert_eq!((e.field.as_str(), e.line), ("gpu_memory", Some(3)));
        assert!(e.to_string().contains("line 3: gpu_memory"), "{e}");
    }

    #[test]
    fn empty_name_names_field_and_line() {
        let e =
            err("class: offline\nname: ''\ngpu_memory: 1GiB\nworkload:\n  name: resnet50-train\n");
        assert_eq!((e.field.as_str(), e.line), ("name", Some(2)));
    }

    #[test]
    fn unknown_workload_names_nested_field() {
        let e = err("name: a\nclass: offline\ngpu_memory: 1GiB\nworkload:\n  name: alexnet\n");
        assert_eq!((e.field.as_str(), e.line), ("workload.name", Some(5)));
    }

    #[test]
    fn unknown_field_is_refused_with_its_name_and_line() {
        let e = err(
            "name: a\nclass: offline\ngpu_memory: 1GiB\ngpu_mem: 3\nworkload:\n  name: resnet50-train\n",
        );
        assert!(e.message.contains("gpu_mem"), "{e}");
        assert_eq!(e.line, Some(4), "{e}");
    }

    #[test]
    fn malformed_yaml_is_refused() {
        let e = err("name: [unclosed\nclass: offline\n");
        assert!(e.line.is_some(), "{e}");
    }

    #[test]
    fn class_from_flag_and_conflicts() {
        let yaml = "name: a\ngpu_memory: 1GiB\nworkload:\n  name: resnet50-train\n";
        assert_eq!(
            parse_job_yaml(yaml, Some(JobClass::Offline)).map(|s| s.class),
            Ok(JobClass::Offline)
        );
        assert_eq!(parse_job_yaml(yaml, None).unwrap_err().field, "class");
        let e = parse_job_yaml(GOOD, Some(JobClass::Offline)).unwrap_err();
        assert_eq!((e.field.as_str(), e.line), ("class", Some(2)));
    }

    #[test]
    fn oversized_file_is_refused_before_parsing() {
        let big = format!("name: a\n#{}\n", "x".repeat(MAX_JOB_FILE_BYTES));
        assert_eq!(err(&big).field, "file");
    }
}
