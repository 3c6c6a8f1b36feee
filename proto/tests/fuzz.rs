//! Fuzzing what mmkd does with a SubmitJob request's bytes: protobuf decoding, then the
//! conversion and validation of its spec. Any bytes give a spec or an error, never a panic
//! or a hang; an accepted spec survives a round trip (core/tests/support/fuzz.rs says how
//! inputs are made; `MMK_FUZZ_CASES` sets how many).

#[path = "../../core/tests/support/fuzz.rs"]
mod support;

use mmk_proto::v1;
use mmk_proto::{spec_from_proto, spec_to_proto};
use proptest::collection::vec;
use proptest::prelude::*;
use prost::Message;

fn request(spec: v1::JobSpec, request_id: &str) -> Vec<u8> {
    v1::SubmitJobRequest {
        spec: Some(spec),
        request_id: request_id.into(),
    }
    .encode_to_vec()
}

/// Valid requests: each kind of task, every field set somewhere.
fn seeds() -> Vec<Vec<u8>> {
    let base = v1::JobSpec {
        name: "bert-train".into(),
        class: v1::JobClass::Offline as i32,
        gpu_memory_mib: 30 * 1024,
        checkpoint: true,
        restart_policy: v1::RestartPolicy::OnFailure as i32,
        max_restarts: 3,
        task: Some(v1::job_spec::Task::Workload(v1::WorkloadTask {
            name: "bert-train".into(),
            batch_size: 8,
            duration_ms: 3_600_000,
        })),
        ..Default::default()
    };
    let command = v1::JobSpec {
        name: "serve".into(),
        class: v1::JobClass::Online as i32,
        gpu_memory_mib: 8192,
        slo_ms: 50,
        priority: -10,
        task: Some(v1::job_spec::Task::Command(v1::CommandTask {
            args: vec!["python3".into(), "serve.py".into(), "--port=8080".into()],
            env: [("PORT".into(), "8080".into()), ("A".into(), String::new())]
                .into_iter()
                .collect(),
            workdir: "/srv/model".into(),
            profile: "resnet50-inference".into(),
            kernel_profile: "/srv/model/k.json".into(),
            kernel_policy: "orion".into(),
        })),
        ..Default::default()
    };
    let attached = v1::JobSpec {
        name: "alloc".into(),
        class: v1::JobClass::Online as i32,
        gpu_memory_mib: 1024,
        task: Some(v1::job_spec::Task::Attached(v1::AttachedTask {
            profile: "resnet18-inference".into(),
            pid: 1,
            lease_ms: 60_000,
            kernel_policy: "mmk".into(),
        })),
        ..Default::default()
    };
    vec![
        request(base, ""),
        request(command, "retry-7f3a"),
        request(attached, "x"),
        Vec::new(),
    ]
}

/// Protobuf keys and lengths that the messages use, and edge values.
const DICT: &[&[u8]] = &[
    b"\x0a",                                         // SubmitJobRequest.spec, JobSpec.name
    b"\x12",                                         // request_id
    b"\x10\x01",                                     // class online
    b"\x10\x03",                                     // class unknown
    b"\x18\xff\xff\xff\xff\xff\xff\xff\xff\x01",     // gpu_memory_mib u64::MAX
    b"\x20\xff\xff\xff\xff\x0f",                     // slo_ms
    b"\x28\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01", // priority -1
    b"\x32\x00",                                     // command, empty
    b"\x3a\x00",                                     // workload, empty
    b"\x5a\x00",                                     // attached, empty
    b"\x48\x07",                                     // restart_policy unknown
    b"\x50\xff\xff\xff\xff\x0f",                     // max_restarts u32::MAX
    b"\x12\x04MMK_",                                 // env key
    b"\xff\xff\xff\xff\x0f",                         // a huge length
    b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", // an overlong varint
    b"\x0b",                                         // start group
    b"\x0c",                                         // end group
    b"\xc0\x80",                                     // bad UTF-8
];

/// Whether `spec` is accepted; one that is survives a round trip through the wire type.
fn round_trip(spec: v1::JobSpec) -> bool {
    let Ok(ok) = spec_from_proto(spec) else {
        return false;
    };
    let again = spec_from_proto(spec_to_proto(&ok));
    assert_eq!(again.as_ref(), Ok(&ok), "a round trip changed the spec");
    true
}

#[test]
fn submit_job_request() {
    support::fuzz("submit_job_request", seeds(), DICT, |bytes| {
        let Ok(req) = v1::SubmitJobRequest::decode(bytes) else {
            return false;
        };
        let Some(spec) = req.spec else {
            return false;
        };
        round_trip(spec)
    });
}

/// Mostly what the field takes, sometimes anything: a spec then has a fair chance to be
/// accepted, or to be refused for one field only.
fn field(valid: impl Strategy<Value = String> + 'static) -> BoxedStrategy<String> {
    prop_oneof![
        12 => valid,
        1 => any::<String>(),
        1 => (0usize..70_000).prop_map(|n| "a".repeat(n)),
    ]
    .boxed()
}

fn number<T: Arbitrary + Copy + 'static>(
    valid: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    prop_oneof![12 => valid, 1 => any::<T>()].boxed()
}

fn one_of(names: Vec<&'static str>) -> BoxedStrategy<String> {
    field(prop::sample::select(names).prop_map(str::to_owned))
}

fn workloads() -> Vec<&'static str> {
    mmk_core::workload::names()
}

fn task() -> impl Strategy<Value = Option<v1::job_spec::Task>> {
    use v1::job_spec::Task;
    let policies = || one_of(vec!["", "mmk", "orion", "fikit", "passthrough"]);
    let profiles = || {
        let mut names = workloads();
        names.push("");
        one_of(names)
    };
    let command = (
        vec(field("[a-z0-9./=-]{1,12}"), 0..4),
        vec((field("[A-Z_]{1,8}"), field("[ -~]{0,12}")), 0..3),
        field("(/[a-z]{1,8}){0,3}"),
        profiles(),
        field("(/[a-z]{1,8}){0,2}(/k.json)?"),
        policies(),
    )
        .prop_map(
            |(args, env, workdir, profile, kernel_profile, kernel_policy)| {
                Task::Command(v1::CommandTask {
                    args,
                    env: env.into_iter().collect(),
                    workdir,
                    profile,
                    kernel_profile,
                    kernel_policy,
                })
            },
        );
    let workload = (
        one_of(workloads()),
        number(0u32..=65_536),
        number(0u64..=30 * 86_400_000),
    )
        .prop_map(|(name, batch_size, duration_ms)| {
            Task::Workload(v1::WorkloadTask {
                name,
                batch_size,
                duration_ms,
            })
        });
    let attached = (
        profiles(),
        number(0u32..3),
        number(prop_oneof![Just(0u64), 1000u64..=86_400_000]),
        policies(),
    )
        .prop_map(|(profile, pid, lease_ms, kernel_policy)| {
            Task::Attached(v1::AttachedTask {
                profile,
                pid,
                lease_ms,
                kernel_policy,
            })
        });
    prop_oneof![
        1 => Just(None),
        4 => command.prop_map(Some),
        4 => workload.prop_map(Some),
        4 => attached.prop_map(Some),
    ]
}

fn spec() -> impl Strategy<Value = v1::JobSpec> {
    (
        field("[a-zA-Z0-9][a-zA-Z0-9._-]{0,62}"),
        number(1i32..=2),
        number(1u64..=81_920),
        number(prop_oneof![Just(0u64), 1u64..=10_000]),
        number(-1000i32..=1000),
        task(),
        any::<bool>(),
        number(0i32..=2),
        number(0u32..=100),
        any::<bool>(),
        prop_oneof![
            Just(String::new()),
            field("[a-zA-Z0-9][a-zA-Z0-9:/._-]{0,140}")
        ],
    )
        .prop_map(
            |(
                name,
                class,
                gpu_memory_mib,
                slo_ms,
                priority,
                task,
                checkpoint,
                restart,
                max,
                exclusive,
                profile_key,
            )| {
                v1::JobSpec {
                    name,
                    class,
                    gpu_memory_mib,
                    slo_ms,
                    priority,
                    task,
                    checkpoint,
                    restart_policy: restart,
                    max_restarts: max,
                    exclusive,
                    profile_key,
                    slo_slowdown_pct: 0,
                }
            },
        )
}

/// Specs with every field drawn at random (a byte-level mutation rarely keeps the
/// protobuf framing intact): validation refuses or accepts, and what it accepts survives a
/// round trip through the wire type.
#[test]
fn job_spec_fields() {
    support::fuzz_values(
        "job_spec_fields",
        spec(),
        |s| format!("{s:?}"),
        |s| round_trip(s.clone()),
    );
}
