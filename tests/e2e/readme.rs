//! The README's quick start as a user runs it: its commands give the sample output it
//! shows (the parts that do not change from run to run).

use mmk_proto::v1;

use crate::harness::{Daemon, text, wait_for, wait_state};

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README")
}

#[tokio::test]
async fn the_quick_start_prints_what_the_readme_shows() {
    // The README's mmkd: the simulated A100-80GB, mmkd's default planner and kernel
    // scheduler (the harness's own defaults are first fit and no kernel scheduler).
    let d = Daemon::start_with(
        "a100-80gb:1",
        &["--planner", "mmk", "--kernel-policy", "mmk"],
    );
    let root = env!("CARGO_MANIFEST_DIR");
    let mut c = d.clients().await;
    // One command after another, as a user types them: each job runs before the next is
    // submitted (jobs that wait together are placed smallest first, which would change the
    // shares the sample shows).
    for (id, (flag, file)) in (1..).zip([
        ("--online", "examples/resnet50-serving.yaml"),
        ("--offline", "examples/bert-train.yaml"),
        ("--offline", "examples/hello.yaml"),
    ]) {
        let out = d.ctl(&["submit", flag, &format!("{root}/{file}")]);
        assert!(out.status.success(), "{file}: {}", text(&out.stderr));
        wait_state(&mut c, id, v1::JobState::Running).await;
    }
    let shown = text(&d.ctl(&["partitions", "show"]).stdout);
    let readme = readme();
    // Every line of the sample but the MPS daemon's pid, which changes.
    let start = readme
        .find("$ mmkctl partitions show\n")
        .expect("the README's sample");
    let sample: Vec<&str> = readme[start..]
        .lines()
        .skip(1)
        .take_while(|l| !l.starts_with("$ ") && !l.starts_with("```"))
        .filter(|l| !l.contains("MPS daemon pid"))
        .collect();
    assert!(sample.len() > 10, "{sample:?}");
    for line in sample {
        assert!(
            shown.lines().any(|l| l == line),
            "the README shows {line:?}; partitions show printed:\n{shown}"
        );
    }
    // The command job's output, as the README shows it.
    let logs = wait_for("the command job's first lines", || {
        let out = text(&d.ctl(&["jobs", "logs", "3"]).stdout);
        out.contains("step 2 ").then_some(out)
    });
    let first = readme
        .lines()
        .skip_while(|l| *l != "$ mmkctl jobs logs 3")
        .nth(1)
        .expect("the README's log sample");
    assert_eq!(logs.lines().next(), Some(first), "{logs}");
}
