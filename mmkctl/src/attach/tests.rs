use super::*;

#[test]
fn job_names_come_from_the_program() {
    assert_eq!(job_name("/usr/bin/python3"), "python3");
    assert_eq!(job_name("./train job.sh"), "train-job.sh");
    assert_eq!(job_name("_x"), "j_x");
    assert!(job_name(&"a".repeat(200)).len() <= mmk_core::spec::MAX_NAME_LEN);
}

/// An offline allocation of `memory` with no other flag.
fn offline(memory: &str) -> AllocSpecArgs {
    AllocSpecArgs {
        online: false,
        offline: true,
        memory: memory.into(),
        name: None,
        profile: None,
        exclusive: false,
        profile_key: None,
        slo: None,
        priority: 0,
        kernel_policy: None,
    }
}

#[test]
fn a_run_is_known_by_its_name_and_command_unless_given_a_key() {
    let args = AllocSpecArgs {
        online: true,
        offline: false,
        ..offline("1GiB")
    };
    let lease = AttachedSpec {
        lease_ms: Some(5000),
        ..AttachedSpec::default()
    };
    let spec = args
        .spec("python3", Some("python3:00ff".into()), lease.clone())
        .expect("valid");
    assert_eq!(spec.profile_key.as_deref(), Some("python3:00ff"));
    let keyed = AllocSpecArgs {
        profile_key: Some("team/bert".into()),
        ..args
    };
    let spec = keyed
        .spec("python3", Some("python3:00ff".into()), lease.clone())
        .expect("valid");
    assert_eq!(
        spec.profile_key.as_deref(),
        Some("team/bert"),
        "the flag wins"
    );
    let bad = AllocSpecArgs {
        profile_key: Some("no spaces".into()),
        ..keyed
    };
    let e = bad.spec("python3", None, lease).expect_err("bad key");
    assert!(e.message.starts_with("--profile-key:"), "{}", e.message);
}

#[test]
fn spec_errors_name_the_flag() {
    let args = offline("lots");
    let e = args
        .spec("x", None, AttachedSpec::default())
        .expect_err("bad memory");
    assert!(e.message.starts_with("--memory:"), "{}", e.message);
    let args = AllocSpecArgs {
        memory: "1GiB".into(),
        kernel_policy: Some("mmk".into()),
        ..args
    };
    let e = args
        .spec(
            "x",
            None,
            AttachedSpec {
                lease_ms: Some(5000),
                ..AttachedSpec::default()
            },
        )
        .expect_err("offline with a kernel policy");
    assert!(e.message.starts_with("--kernel-policy:"), "{}", e.message);
}
