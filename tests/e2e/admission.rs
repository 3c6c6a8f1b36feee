//! Admission and cancel under callers that go away: a retried submit stores one job, a
//! submit whose caller went away is still announced and planned, and a cancel whose caller
//! went away still ends the job.

use std::time::Duration;

use mmk_proto::v1;
use tokio_stream::StreamExt;

use crate::harness::{Daemon, PATIENCE, wait_state};

fn workload(name: &str) -> v1::JobSpec {
    v1::JobSpec {
        name: name.into(),
        class: v1::JobClass::Offline as i32,
        gpu_memory_mib: 1024,
        task: Some(v1::job_spec::Task::Workload(v1::WorkloadTask {
            name: "bert-train".into(),
            duration_ms: 1000,
            ..Default::default()
        })),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_retry_with_the_same_request_id_returns_the_first_job() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let submit = |rid: &str| v1::SubmitJobRequest {
        spec: Some(workload("once")),
        request_id: rid.into(),
    };
    let first = c.jobs.submit_job(submit("req-42")).await.expect("submit");
    let again = c.jobs.submit_job(submit("req-42")).await.expect("retry");
    let other = c.jobs.submit_job(submit("req-43")).await.expect("another");
    let id = |r: tonic::Response<v1::SubmitJobResponse>| r.into_inner().job.expect("job").id;
    let (a, b, o) = (id(first), id(again), id(other));
    assert_eq!(a, b, "the retry is the same job");
    assert_ne!(a, o);
    let all = c
        .jobs
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("list")
        .into_inner();
    assert_eq!(all.jobs.len(), 2, "{:?}", all.jobs);
    // The same id with another job is a mistake of the caller, not a retry.
    let mut changed = submit("req-42");
    changed.spec.as_mut().expect("spec").gpu_memory_mib = 2048;
    let err = c.jobs.submit_job(changed).await.expect_err("another spec");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with(&format!(
            "request_id: was first used for job {a} with a different spec"
        )),
        "{}",
        err.message()
    );
    let err = c
        .jobs
        .submit_job(submit(&"r".repeat(200)))
        .await
        .expect_err("too long");
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(
        err.message().starts_with("request_id:"),
        "{}",
        err.message()
    );
}

#[tokio::test]
async fn a_submit_whose_caller_went_away_is_announced_and_planned() {
    let d = Daemon::start("a100-80gb:1");
    let mut watcher = d.clients().await;
    let mut events = watcher
        .jobs
        .watch_jobs(v1::WatchJobsRequest::default())
        .await
        .expect("watch")
        .into_inner();
    // Callers that give up at every point of the call, from at once to after the answer.
    for i in 0..40u64 {
        let mut c = d.clients().await;
        let call = c.jobs.submit_job(v1::SubmitJobRequest {
            spec: Some(workload(&format!("impatient-{i}"))),
            ..Default::default()
        });
        let _ = tokio::time::timeout(Duration::from_micros(50 * i), call).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut c = d.clients().await;
    let stored = c
        .jobs
        .list_jobs(v1::ListJobsRequest::default())
        .await
        .expect("list")
        .into_inner()
        .jobs;
    assert!(!stored.is_empty(), "some submits got through");
    // Every stored job was announced QUEUED and then placed.
    let mut queued = std::collections::HashSet::new();
    let mut placed = std::collections::HashSet::new();
    let all: std::collections::HashSet<u64> = stored.iter().map(|j| j.id).collect();
    tokio::time::timeout(PATIENCE, async {
        while !(all.is_subset(&queued) && all.is_subset(&placed)) {
            let ev = events.next().await.expect("stream").expect("event");
            let job = ev.job.expect("job");
            match v1::JobState::try_from(job.state) {
                Ok(v1::JobState::Queued) => {
                    queued.insert(job.id);
                }
                Ok(v1::JobState::Starting | v1::JobState::Running) => {
                    placed.insert(job.id);
                }
                _ => {}
            }
        }
    })
    .await
    .unwrap_or_else(|_| {
        panic!("stored {all:?}, announced {queued:?}, placed {placed:?}");
    });
}

/// Submits a command job running `script` under `sh -c` and waits until it runs.
async fn running_script(c: &mut mmkctl::client::Clients, name: &str, script: &str) -> u64 {
    let id = c
        .jobs
        .submit_job(v1::SubmitJobRequest {
            spec: Some(v1::JobSpec {
                name: name.into(),
                class: v1::JobClass::Offline as i32,
                gpu_memory_mib: 1024,
                task: Some(v1::job_spec::Task::Command(v1::CommandTask {
                    args: ["sh", "-c", script].map(String::from).to_vec(),
                    ..Default::default()
                })),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner()
        .job
        .expect("job")
        .id;
    wait_state(c, id, v1::JobState::Running).await;
    id
}

#[tokio::test]
async fn a_cancel_whose_caller_went_away_still_ends_the_job() {
    // The job ignores SIGTERM, so the stop takes the whole grace period (the harness's is
    // 2 s); the caller gives up long before.
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let id = running_script(&mut c, "stubborn", "trap '' TERM; sleep 600").await;
    let mut quitter = d.clients().await;
    let call = quitter.jobs.cancel_job(v1::CancelJobRequest {
        id,
        reason: "changed my mind".into(),
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), call)
            .await
            .is_err(),
        "the stop takes the grace period"
    );
    drop(quitter);
    let job = wait_state(&mut c, id, v1::JobState::Cancelled).await;
    assert_eq!(job.reason, "cancelled: changed my mind");
}

#[tokio::test]
async fn a_cancelled_job_that_exits_cleanly_on_sigterm_is_cancelled() {
    let d = Daemon::start("a100-80gb:1");
    let mut c = d.clients().await;
    let id = running_script(
        &mut c,
        "graceful",
        "trap 'exit 0' TERM; while true; do sleep 0.1; done",
    )
    .await;
    let job = c
        .jobs
        .cancel_job(v1::CancelJobRequest {
            id,
            reason: "done with it".into(),
        })
        .await
        .expect("cancel")
        .into_inner();
    assert_eq!(
        v1::JobState::try_from(job.state),
        Ok(v1::JobState::Cancelled),
        "{}",
        job.reason
    );
}
