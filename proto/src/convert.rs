//! Conversions between `mmk.v1` messages and domain types. Specs coming in are checked
//! with [`JobSpec::validate`], so the gRPC API refuses exactly what `job.yaml` refuses.

use mmk_core::spec::{AttachedSpec, CommandSpec, RestartPolicy, Task, WorkloadSpec};
use mmk_core::{FieldError, JobClass, JobSpec, JobState};

use crate::v1;

pub fn class_to_proto(c: JobClass) -> v1::JobClass {
    match c {
        JobClass::Online => v1::JobClass::Online,
        JobClass::Offline => v1::JobClass::Offline,
    }
}

/// `None` for UNSPECIFIED or a value this version does not know.
pub fn class_from_proto(c: i32) -> Option<JobClass> {
    match v1::JobClass::try_from(c).ok()? {
        v1::JobClass::Online => Some(JobClass::Online),
        v1::JobClass::Offline => Some(JobClass::Offline),
        v1::JobClass::Unspecified => None,
    }
}

pub fn state_to_proto(s: JobState) -> v1::JobState {
    match s {
        JobState::Queued => v1::JobState::Queued,
        JobState::Starting => v1::JobState::Starting,
        JobState::Running => v1::JobState::Running,
        JobState::Succeeded => v1::JobState::Succeeded,
        JobState::Failed => v1::JobState::Failed,
        JobState::Cancelled => v1::JobState::Cancelled,
    }
}

pub fn state_from_proto(s: i32) -> Option<JobState> {
    Some(match v1::JobState::try_from(s).ok()? {
        v1::JobState::Queued => JobState::Queued,
        v1::JobState::Starting => JobState::Starting,
        v1::JobState::Running => JobState::Running,
        v1::JobState::Succeeded => JobState::Succeeded,
        v1::JobState::Failed => JobState::Failed,
        v1::JobState::Cancelled => JobState::Cancelled,
        v1::JobState::Unspecified => return None,
    })
}

pub fn spec_to_proto(s: &JobSpec) -> v1::JobSpec {
    v1::JobSpec {
        name: s.name.clone(),
        class: class_to_proto(s.class) as i32,
        gpu_memory_mib: s.gpu_memory_mib,
        slo_ms: s.slo_ms.unwrap_or(0),
        slo_slowdown_pct: s.slo_slowdown_pct.unwrap_or(0),
        priority: s.priority,
        task: Some(match &s.task {
            Task::Command(c) => v1::job_spec::Task::Command(v1::CommandTask {
                args: c.args.clone(),
                env: c.env.clone().into_iter().collect(),
                workdir: c.workdir.clone().unwrap_or_default(),
                profile: c.profile.clone().unwrap_or_default(),
                kernel_profile: c.kernel_profile.clone().unwrap_or_default(),
                kernel_policy: c.kernel_policy.clone().unwrap_or_default(),
            }),
            Task::Workload(w) => v1::job_spec::Task::Workload(v1::WorkloadTask {
                name: w.name.clone(),
                batch_size: w.batch_size.unwrap_or(0),
                duration_ms: w.duration_ms.unwrap_or(0),
            }),
            Task::Attached(a) => v1::job_spec::Task::Attached(v1::AttachedTask {
                profile: a.profile.clone().unwrap_or_default(),
                pid: a.pid.unwrap_or(0),
                lease_ms: a.lease_ms.unwrap_or(0),
                kernel_policy: a.kernel_policy.clone().unwrap_or_default(),
            }),
        }),
        checkpoint: s.checkpoint,
        exclusive: s.exclusive,
        profile_key: s.profile_key.clone().unwrap_or_default(),
        restart_policy: match s.restart_policy {
            RestartPolicy::Never => v1::RestartPolicy::Never,
            RestartPolicy::OnFailure => v1::RestartPolicy::OnFailure,
        } as i32,
        max_restarts: s.max_restarts,
    }
}

/// Converts and validates a spec that came over the wire.
pub fn spec_from_proto(s: v1::JobSpec) -> Result<JobSpec, FieldError> {
    let class = class_from_proto(s.class)
        .ok_or_else(|| FieldError::new("class", "must be online or offline"))?;
    let restart_policy = match v1::RestartPolicy::try_from(s.restart_policy) {
        Ok(v1::RestartPolicy::Unspecified | v1::RestartPolicy::Never) => RestartPolicy::Never,
        Ok(v1::RestartPolicy::OnFailure) => RestartPolicy::OnFailure,
        Err(_) => {
            return Err(FieldError::new(
                "restart_policy",
                format!("unknown value {}", s.restart_policy),
            ));
        }
    };
    let task = match s.task {
        Some(v1::job_spec::Task::Command(c)) => Task::Command(CommandSpec {
            args: c.args,
            env: c.env.into_iter().collect(),
            workdir: (!c.workdir.is_empty()).then_some(c.workdir),
            profile: (!c.profile.is_empty()).then_some(c.profile),
            kernel_profile: (!c.kernel_profile.is_empty()).then_some(c.kernel_profile),
            kernel_policy: (!c.kernel_policy.is_empty()).then_some(c.kernel_policy),
        }),
        Some(v1::job_spec::Task::Workload(w)) => Task::Workload(WorkloadSpec {
            name: w.name,
            batch_size: (w.batch_size != 0).then_some(w.batch_size),
            duration_ms: (w.duration_ms != 0).then_some(w.duration_ms),
        }),
        Some(v1::job_spec::Task::Attached(a)) => Task::Attached(AttachedSpec {
            profile: (!a.profile.is_empty()).then_some(a.profile),
            pid: (a.pid != 0).then_some(a.pid),
            lease_ms: (a.lease_ms != 0).then_some(a.lease_ms),
            kernel_policy: (!a.kernel_policy.is_empty()).then_some(a.kernel_policy),
        }),
        None => {
            return Err(FieldError::new(
                "command",
                "missing: give a command or a workload",
            ));
        }
    };
    let spec = JobSpec {
        name: s.name,
        class,
        gpu_memory_mib: s.gpu_memory_mib,
        slo_ms: (s.slo_ms != 0).then_some(s.slo_ms),
        slo_slowdown_pct: (s.slo_slowdown_pct != 0).then_some(s.slo_slowdown_pct),
        priority: s.priority,
        task,
        checkpoint: s.checkpoint,
        restart_policy,
        max_restarts: s.max_restarts,
        exclusive: s.exclusive,
        profile_key: (!s.profile_key.is_empty()).then_some(s.profile_key),
    };
    spec.validate()?;
    Ok(spec)
}

/// A protobuf timestamp from Unix milliseconds.
pub fn timestamp(unix_ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: unix_ms.div_euclid(1000),
        nanos: (unix_ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> JobSpec {
        JobSpec {
            name: "x".into(),
            class: JobClass::Online,
            gpu_memory_mib: 1024,
            slo_ms: Some(20),
            slo_slowdown_pct: None,
            priority: 3,
            task: Task::Command(CommandSpec {
                args: vec!["/bin/sleep".into(), "1".into()],
                env: [("A".to_string(), "b".to_string())].into(),
                workdir: Some("/tmp".into()),
                profile: Some("resnet50-inference".into()),
                kernel_profile: Some("/srv/models/resnet.kprofile.json".into()),
                kernel_policy: Some("orion".into()),
            }),
            checkpoint: false,
            restart_policy: RestartPolicy::OnFailure,
            max_restarts: 2,
            exclusive: false,
            profile_key: Some("team/resnet:v1".into()),
        }
    }

    #[test]
    fn specs_round_trip() {
        let s = spec();
        assert_eq!(spec_from_proto(spec_to_proto(&s)), Ok(s));
    }

    #[test]
    fn wire_specs_are_validated_with_field_names() {
        let mut p = spec_to_proto(&spec());
        p.class = 0;
        assert_eq!(spec_from_proto(p).unwrap_err().field, "class");
        let mut p = spec_to_proto(&spec());
        p.gpu_memory_mib = 0;
        assert_eq!(spec_from_proto(p).unwrap_err().field, "gpu_memory");
        let mut p = spec_to_proto(&spec());
        p.task = None;
        assert_eq!(spec_from_proto(p).unwrap_err().field, "command");
    }

    #[test]
    fn timestamps_handle_negative_and_positive_times() {
        assert_eq!(timestamp(1_500).seconds, 1);
        assert_eq!(timestamp(1_500).nanos, 500_000_000);
        assert_eq!(timestamp(-1).seconds, -1);
        assert_eq!(timestamp(-1).nanos, 999_000_000);
    }
}
