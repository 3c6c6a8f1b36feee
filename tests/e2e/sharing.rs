//! Sharing by default: jobs nobody profiled, on mmkd's default planner (MMK) and default
//! model (the built-in forest), share a GPU whenever memory fits, and online work never
//! waits behind offline work.

use std::process::{Child, Command, Stdio};

use mmk_proto::v1;

use crate::harness::{Daemon, text, wait_for, wait_state};

/// mmkd with its own defaults for the planner and the model (the harness picks first fit
/// unless a test names a planner).
fn daemon() -> Daemon {
    Daemon::start_with("a100-80gb:1", &["--planner", "mmk"])
}

/// `mmkctl run ARGS -- sleep 120` in the background, as a user would start it.
fn run(d: &Daemon, args: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mmkctl"))
        .arg("--socket")
        .arg(d.socket())
        .arg("run")
        .args(args)
        .args(["--", "sleep", "120"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("mmkctl runs")
}

fn stop(children: Vec<Child>) {
    for mut c in children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// A job as `mmkctl jobs get --output json` shows it; `None` while it does not exist.
fn job(d: &Daemon, id: u64) -> Option<serde_json::Value> {
    let out = d.ctl(&["--output", "json", "jobs", "get", &id.to_string()]);
    serde_json::from_slice(&out.stdout).ok()
}

#[tokio::test]
async fn the_default_model_is_the_built_in_forest() {
    let model = |d: &Daemon| {
        d.startup
            .iter()
            .find(|l| l.contains("performance model"))
            .cloned()
            .unwrap_or_else(|| panic!("{:?}", d.startup))
    };
    let line = model(&daemon());
    assert!(
        line.contains("random forest") && line.contains("h200-2026-11-21 (built in)"),
        "{line}"
    );
    let d = Daemon::start_with("a100-80gb:1", &["--planner", "mmk", "--model", "analytic"]);
    assert!(model(&d).contains("analytic"), "{}", model(&d));
}

#[tokio::test]
async fn allocations_nobody_profiled_share_an_a100_while_memory_lasts() {
    let d = daemon();
    let mut c = d.clients().await;
    let mut runs = Vec::new();
    for id in 1..=3u64 {
        runs.push(run(&d, &["--offline", "--memory", "10G"]));
        let job = wait_state(&mut c, id, v1::JobState::Running).await;
        assert!(job.assignment.is_some(), "job {id}: {}", job.reason);
    }
    // Three 10 GiB jobs on one GPU: all running at once.
    for id in 1..=3u64 {
        let j = job(&d, id).expect("the job");
        assert_eq!(j["state"], "RUNNING", "{j}");
    }
    // One that asks for its partition to itself waits for one (the three hold the GPU).
    runs.push(run(&d, &["--offline", "--memory", "10G", "--exclusive"]));
    let four = wait_for("job 4 to wait for a partition of its own", || {
        job(&d, 4).filter(|j| {
            j["state"] == "QUEUED"
                && j["reason"]
                    .as_str()
                    .is_some_and(|r| r.starts_with("waiting"))
        })
    });
    assert_eq!(four["exclusive"], true, "{four}");
    assert_eq!(four["planner_profile"], "exclusive", "{four}");
    assert_eq!(job(&d, 1).expect("job 1")["planner_profile"], "prior");
    let shown = d.ctl(&["jobs", "get", "1"]);
    assert!(
        text(&shown.stdout).contains("planned as:   prior"),
        "{}",
        text(&shown.stdout)
    );
    stop(runs);
}

#[tokio::test]
async fn online_work_never_waits_behind_offline_work() {
    let d = daemon();
    let mut c = d.clients().await;
    let train = run(&d, &["--offline", "--memory", "30G"]);
    let t = wait_state(&mut c, 1, v1::JobState::Running).await;
    let serve = run(&d, &["--online", "--memory", "10G"]);
    let s = wait_state(&mut c, 2, v1::JobState::Running).await;
    // It did not wait for the offline job (which runs for two minutes) to end, nor stop it
    // to make room: that one still runs.
    let train_now = job(&d, 1).expect("job 1");
    assert_eq!(
        train_now["state"], "RUNNING",
        "the online job started beside the offline one: {train_now}"
    );
    let (ta, sa) = (
        t.assignment.expect("trainer"),
        s.assignment.expect("service"),
    );
    // Beside the offline job (the only partition), with the whole online share, as under
    // plain MPS.
    assert_eq!(
        (ta.gpu_index, ta.start_slice, &ta.profile),
        (sa.gpu_index, sa.start_slice, &sa.profile)
    );
    assert_eq!(sa.mps_share, 100, "{sa:?}");
    let shown = d.ctl(&["jobs"]);
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    stop(vec![train, serve]);
}

/// A managed offline job of `gib` that runs until stopped.
fn offline_yaml(name: &str, gib: u32, checkpoint: bool) -> String {
    format!(
        "name: {name}\nclass: offline\ngpu_memory: {gib}GiB\ncheckpoint: {checkpoint}\ncommand:\n  args: [sleep, '600']\n"
    )
}

#[tokio::test]
async fn an_online_job_preempts_checkpointable_offline_work_or_says_who_is_in_the_way() {
    let d = daemon();
    let mut c = d.clients().await;
    // 75 of the GPU's 80 GiB held by two checkpointable trainings.
    let a = d.submit("--offline", &offline_yaml("train-a", 40, true));
    wait_state(&mut c, a, v1::JobState::Running).await;
    let b = d.submit("--offline", &offline_yaml("train-b", 35, true));
    wait_state(&mut c, b, v1::JobState::Running).await;
    let online =
        "name: serve\nclass: online\ngpu_memory: 30GiB\ncommand:\n  args: [sleep, '600']\n";
    let s = d.submit("--online", online);
    let served = wait_state(&mut c, s, v1::JobState::Running).await;
    assert!(served.assignment.is_some());
    // One training made room: it checkpointed and went back to the queue, and its event
    // (what `mmkctl jobs watch` shows) says for whom.
    let preempted: Vec<serde_json::Value> = [a, b]
        .iter()
        .filter_map(|&id| job(&d, id))
        .filter(|j| j["state"] == "QUEUED")
        .collect();
    assert_eq!(preempted.len(), 1, "{preempted:?}");
    assert_eq!(
        preempted[0]["restarts"], 1,
        "a preemption counts as a restart"
    );
    let line = d
        .wait_log(&format!("preempted for online job {s}"))
        .pop()
        .unwrap_or_default();
    assert!(
        line.contains(&format!("job={} state=QUEUED", preempted[0]["id"])),
        "{line}"
    );

    // Trainings that cannot checkpoint are not stopped: the online job waits and hears
    // which offline jobs hold the memory.
    let d = daemon();
    let mut c = d.clients().await;
    let a = d.submit("--offline", &offline_yaml("train-a", 40, false));
    wait_state(&mut c, a, v1::JobState::Running).await;
    let b = d.submit("--offline", &offline_yaml("train-b", 35, false));
    wait_state(&mut c, b, v1::JobState::Running).await;
    let s = d.submit("--online", online);
    let waiting = wait_for("the online job to say why it waits", || {
        job(&d, s).filter(|j| {
            j["state"] == "QUEUED"
                && j["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("offline jobs hold"))
        })
    });
    assert!(
        waiting["reason"]
            .as_str()
            .is_some_and(|r| r.ends_with(&format!("offline jobs hold the memory: {a}, {b}"))),
        "{waiting}"
    );
}

/// A third offline job does not wait beside a training and a service whose shares are
/// spent: the SLO control keeps the service's objective at run time, so the planner lets
/// the job join as plain MPS would take it; with the control off it waits, and says why.
/// (Where the training's share leaves room, with the control off the third job, which
/// cannot checkpoint, takes what is left only if that is the share that lasts for it, and
/// else waits the same way; the planner's tests pin both rules down.)
#[tokio::test]
async fn an_offline_job_joins_a_service_and_a_training_whose_shares_are_spent() {
    // Jobs by name: `mmkctl run` processes register in whatever order they start.
    let named = |d: &Daemon, name: &str| {
        let all = d.ctl_json(&["jobs"]);
        all.as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["name"] == name).cloned())
    };
    let placed = |d: &Daemon, name: &str| {
        wait_for(&format!("{name} placed or told why not"), || {
            let j = named(d, name)?;
            (j["state"] == "RUNNING" || j["reason"].as_str().is_some_and(|r| r.contains("waiting")))
                .then_some(j)
        })
    };
    // The kernel scheduler on, as mmkd runs by default: the SLO control measures through it.
    let interposer = crate::ksched::built()
        .join(mmk_kernel_sched::artifacts::INTERPOSER)
        .display()
        .to_string();
    for (flags, guarded) in [(&[][..], true), (&["--no-slo-control"][..], false)] {
        let base = ["--planner", "mmk", "--interposer", interposer.as_str()];
        let d = Daemon::start_with("a100-80gb:1", &[&base[..], flags].concat());
        // One after the other: jobs that wait in one pass may get instances of their own.
        let mut children = vec![run(
            &d,
            &["--offline", "--memory", "30G", "--name", "train"],
        )];
        assert_eq!(placed(&d, "train")["state"], "RUNNING", "{flags:?}");
        children.push(run(&d, &["--online", "--memory", "10G", "--name", "serve"]));
        assert_eq!(placed(&d, "serve")["state"], "RUNNING", "{flags:?}");
        let train = placed(&d, "train");
        assert_eq!(
            train["assignment"]["instance_id"],
            placed(&d, "serve")["assignment"]["instance_id"],
            "the service joins the training: {flags:?}"
        );
        let train_share = train["assignment"]["mps_share"].as_u64().expect("a share");
        children.push(run(
            &d,
            &["--offline", "--memory", "10G", "--name", "third"],
        ));
        let third = placed(&d, "third");
        let serve = placed(&d, "serve");
        if !guarded && third["state"] != "RUNNING" {
            assert!(
                third["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("whose shares are not oversubscribed")),
                "training at {train_share} %: {third}"
            );
        } else {
            assert_eq!(third["state"], "RUNNING", "{flags:?} {third}");
            assert_eq!(
                third["assignment"]["instance_id"], serve["assignment"]["instance_id"],
                "beside the service"
            );
            if !guarded {
                let share = third["assignment"]["mps_share"].as_u64().expect("a share");
                assert!(train_share + share <= 100, "{train_share} + {share}");
            }
        }
        stop(children);
    }
}
