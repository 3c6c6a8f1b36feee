//! The hybrid planner's tests.

use mmk_core::JobClass;

use super::partition::shape_of;
use super::*;
use crate::catalog;
use crate::layout::{Instance, Placement};
use crate::model::{AnalyticModel, CoRunner, JobProfile, PartitionShape};
use crate::plan::Slot;

thread_local! {
    /// Jobs this thread's planners skipped as of a refused kind (each test runs on a
    /// thread of its own).
    pub(super) static SKIPPED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Shares this thread's planners raised past a plateau (`plateau_gain`), partitions the
    /// last resort passed over as crowded (`crowd_max`), and starved jobs spread.
    pub(super) static CLIMBED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    pub(super) static CROWDED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    pub(super) static SPREAD: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Online jobs that joined online ones past the shares (`online_past_shares`), and
    /// checkpointable jobs lifted past spent shares (`lift_starved`).
    pub(super) static ONLINE_PAST: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    pub(super) static LIFTED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// GPU states the layout search did not ask again, as no layout of theirs places a
    /// waiting kind (`layout_search.rs`, `best_layout_for`).
    pub(super) static LAYOUTS_SKIPPED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Choices MPS-first made again from the memo (`mps_first.rs`, `choose_remembered`).
    pub(super) static CHOICES_RECALLED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// MPS-first's verdicts on a partition state read from the memo's lists
    /// (`mps_first.rs`, `choose`).
    pub(super) static VERDICTS_RECALLED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Online jobs not asked for an eviction as of a kind that found no room (`preempt.rs`).
    pub(super) static PREEMPT_SKIPPED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    /// Jobs that waited long not tried alone as of a kind that stayed waiting
    /// (`reserve.rs`).
    pub(super) static AGED_SKIPPED: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts one more on a thread's counter (the planner's code calls it under `cfg(test)`).
pub(super) fn count(c: &'static std::thread::LocalKey<std::cell::Cell<usize>>) {
    c.set(c.get() + 1);
}

fn gpu(key: &str, index: u32) -> GpuState {
    GpuState {
        index,
        uuid: format!("GPU-{index}"),
        model: catalog::model(key).expect("model"),
        mig_enabled: true,
        layout_fixed: false,
        instances: vec![],
    }
}

fn job(id: u64, class: JobClass, gib: u64, sm: f64, bw: f64) -> JobDemand {
    JobDemand {
        profile: JobProfile {
            class,
            sm_demand: sm,
            bw_demand: bw,
            solo_latency_ms: None,
        },
        ..JobDemand::waiting(id, class, gib * 1024)
    }
}

fn mmk() -> Hybrid {
    Hybrid::mmk(Arc::new(AnalyticModel::default()))
}

fn names(node: &NodeState, plan: &Plan) -> Vec<String> {
    let mut v: Vec<String> = plan
        .placements
        .iter()
        .map(|p| {
            let g = &node.gpus[p.slot.gpu as usize];
            p.slot
                .profile_id
                .and_then(|id| g.model.profile(id))
                .map_or("whole".into(), |q| q.name.clone())
        })
        .collect();
    v.sort();
    v
}

#[test]
fn an_empty_gpu_is_partitioned_for_its_jobs() {
    let node = NodeState::new(vec![gpu("a100-80gb", 0)]);
    let jobs = [
        job(1, JobClass::Offline, 30, 0.8, 0.5),
        job(2, JobClass::Offline, 10, 0.3, 0.3),
    ];
    let plan = mmk().plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    assert_eq!(plan.placements.len(), 2);
    assert!(plan.stp.is_some_and(|s| s > 1.0), "{:?}", plan.stp);
    // Each placed job's prediction, summing to the STP.
    let ids: Vec<u64> = plan.perf.iter().map(|(j, _)| *j).collect();
    assert_eq!(ids, [1, 2]);
    assert!(plan.perf.iter().all(|(_, p)| *p > 0.0 && *p <= 1.0));
    let sum: f64 = plan.perf.iter().map(|(_, p)| p).sum();
    assert!((sum - plan.stp.unwrap_or(0.0)).abs() < 1e-9);
    assert!(plan.steps.iter().all(|s| matches!(s, Step::Create { .. })));
    let shares: u32 = plan.placements.iter().map(|p| u32::from(p.mps_share)).sum();
    assert!(shares <= 200);
}

#[test]
fn mps_first_uses_room_in_the_current_layout() {
    let node = NodeState::new(vec![whole_instance_gpu(0, 1)]);
    let whole = Slot {
        gpu: 0,
        start: 0,
        profile_id: Some(0),
    };
    let mut running = job(1, JobClass::Offline, 20, 0.4, 0.3);
    running.placed = Some(whole);
    running.mps_share = 50;
    let plan = mmk().plan(&node, &[running, job(2, JobClass::Offline, 10, 0.3, 0.2)]);
    assert!(
        plan.steps.is_empty(),
        "no reconfiguration: {:?}",
        plan.steps
    );
    let new = plan.placements.iter().find(|p| p.job == 2).expect("placed");
    assert_eq!(new.slot, whole);
    assert!(
        new.mps_share <= 50,
        "within what the running job leaves: {}",
        new.mps_share
    );
}

#[test]
fn busy_instances_are_never_touched() {
    let mut g = gpu("a100-80gb", 0);
    g.instances.push(Instance {
        id: 4,
        profile_id: 14,
        placement: Placement { start: 2, size: 2 },
        uuid: "MIG-4".into(),
    });
    let node = NodeState::new(vec![g]);
    let slot = Slot {
        gpu: 0,
        start: 2,
        profile_id: Some(14),
    };
    let mut online = job(1, JobClass::Online, 15, 0.2, 0.2);
    online.placed = Some(slot);
    online.mps_share = 100;
    let plan = mmk().plan(&node, &[online, job(2, JobClass::Offline, 60, 0.9, 0.5)]);
    // 60 GiB needs a 7g, which would take the online job's slices: it waits.
    assert!(
        plan.steps
            .iter()
            .all(|s| !matches!(s, Step::Destroy { instance: 4, .. }))
    );
    assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);
    assert!(
        plan.queued[0].reason.contains("waiting for 60GiB"),
        "{}",
        plan.queued[0].reason
    );
}

#[test]
fn online_slos_are_kept_or_the_job_waits() {
    let node = NodeState::new(vec![gpu("h100-80gb", 0)]);
    let mut serving = job(1, JobClass::Online, 8, 0.5, 0.3);
    serving.profile.solo_latency_ms = Some(10.0);
    serving.slo_ms = Some(12);
    let plan = mmk().plan(&node, &[serving.clone()]);
    let p = plan.placements.first().expect("placed");
    let g = &node.gpus[0];
    let (shape, _) = shape_of(g, p.slot.profile_id);
    let perf = AnalyticModel::default().estimate(&serving.profile, &shape, p.mps_share, &[]);
    assert!(10.0 / perf <= 12.0, "predicted latency {} ms", 10.0 / perf);

    // An SLO no partition can meet: the job waits and says why.
    serving.slo_ms = Some(9);
    let plan = mmk().plan(&node, &[serving]);
    assert_eq!(plan.queued.len(), 1);
    assert!(
        plan.queued[0].reason.contains("SLO of 9ms"),
        "{}",
        plan.queued[0].reason
    );
}

#[test]
fn miso_gives_each_job_its_own_partition() {
    let node = NodeState::new(vec![gpu("a100-80gb", 0)]);
    let jobs: Vec<JobDemand> = (1..=4)
        .map(|i| job(i, JobClass::Offline, 5, 0.2, 0.2))
        .collect();
    let plan = Hybrid::miso(Arc::new(AnalyticModel::default())).plan(&node, &jobs);
    let mut slots: Vec<Slot> = plan.placements.iter().map(|p| p.slot).collect();
    slots.dedup();
    assert_eq!(
        slots.len(),
        plan.placements.len(),
        "no two jobs share: {:?}",
        plan.placements
    );
    assert!(plan.placements.iter().all(|p| p.mps_share == 100));
}

/// The MMK paper's observation 1: with ResNet152-, ResNet50- and VGG16-like jobs,
/// [4g.40gb, 3g.40gb] beats [3g.40gb, 2g.20gb, 2g.20gb]. A model that says so (small
/// jobs share well, the big job needs 4 compute slices) leads the planner there.
#[test]
fn observation_1_the_planner_follows_the_model_to_4g_3g() {
    #[derive(Debug)]
    struct Fig1;
    impl PerfModel for Fig1 {
        fn estimate(
            &self,
            job: &JobProfile,
            p: &PartitionShape,
            share: u8,
            co: &[CoRunner],
        ) -> f64 {
            let compute = f64::from(p.sm_count) / f64::from(p.gpu_sm_count);
            let got = compute * f64::from(share) / 100.0;
            let speed = (got / job.sm_demand).min(1.0);
            // Sharing costs little for the small jobs, much for the big one.
            let penalty = if job.sm_demand > 0.5 { 0.3 } else { 0.02 };
            speed * (1.0 - penalty * co.len() as f64).max(0.1)
        }
    }
    let node = NodeState::new(vec![gpu("a100-80gb", 0)]);
    let jobs = [
        job(1, JobClass::Offline, 30, 0.55, 0.4), // ResNet152-like
        // The small ones each need 16 of the A100's 108 SMs: two share a 3g (42)
        // at 60 / 40 at full speed, so a 4g and a 3g beat two 2g and a 3g by the
        // model, whatever the reconfiguration cost.
        job(2, JobClass::Offline, 15, 0.15, 0.3), // ResNet50-like
        job(3, JobClass::Offline, 15, 0.15, 0.3), // VGG16-like
    ];
    let planner = Hybrid::mmk(Arc::new(Fig1));
    let plan = planner.plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    let mut made: Vec<String> = plan
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::Create { slot } => slot.profile_id,
            Step::Destroy { .. } => None,
        })
        .filter_map(|id| node.gpus[0].model.profile(id).map(|p| p.name.clone()))
        .collect();
    made.sort();
    assert_eq!(
        made,
        ["3g.40gb", "4g.40gb"],
        "placements {:?}",
        names(&node, &plan)
    );
    let big = plan.placements.iter().find(|p| p.job == 1).expect("placed");
    assert_eq!(
        big.slot.profile_id,
        Some(5),
        "the ResNet152-like job gets the 4g"
    );
}

#[test]
fn several_gpus_share_the_work() {
    let node = NodeState::new((0..4).map(|i| gpu("h100-80gb", i)).collect());
    let jobs: Vec<JobDemand> = (1..=8)
        .map(|i| job(i, JobClass::Offline, 35, 0.9, 0.5))
        .collect();
    let plan = mmk().plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    let mut gpus: Vec<u32> = plan.placements.iter().map(|p| p.slot.gpu).collect();
    gpus.sort_unstable();
    gpus.dedup();
    assert_eq!(gpus, [0, 1, 2, 3]);
}

#[test]
fn a_checkpointable_job_makes_room_by_moving() {
    let (node, whole) = whole_instance_node();
    let mut trainer = job(1, JobClass::Offline, 30, 0.85, 0.45);
    trainer.placed = Some(whole);
    trainer.mps_share = 100;
    let mut serving = job(2, JobClass::Online, 4, 0.25, 0.35);
    serving.profile.solo_latency_ms = Some(3.0);
    serving.slo_ms = Some(50);

    // Online work first: the service runs beside the trainer at once, with the whole
    // online budget (as under plain MPS), and nothing moves.
    let plan = mmk().plan(&node, &[trainer.clone(), serving.clone()]);
    assert!(plan.moves.is_empty() && plan.queued.is_empty(), "{plan:?}");
    let s = plan
        .placements
        .iter()
        .find(|p| p.job == 2)
        .expect("serving");
    assert_eq!((s.slot, s.mps_share), (whole, 100));

    // Another offline job shares the trainer's budget, which is spent; the trainer cannot
    // move and the 7g covers every slice. Rather than wait while memory is free, the
    // newcomer joins as plain MPS would take it (no online job runs there)...
    let other = job(2, JobClass::Offline, 4, 0.25, 0.35);
    let plan = mmk().plan(&node, &[trainer.clone(), other.clone()]);
    assert!(plan.moves.is_empty() && plan.queued.is_empty(), "{plan:?}");
    // ... or, with sharing before waiting off, it waits.
    let strict = Hybrid::new(
        "strict",
        Arc::new(AnalyticModel::default()),
        HybridOptions {
            share_before_waiting: false,
            ..mmk().options
        },
    );
    let plan = strict.plan(&node, &[trainer.clone(), other.clone()]);
    assert!(plan.moves.is_empty());
    assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);

    // The trainer declared checkpointing: it restarts with a smaller share, and both run
    // within the partition's 100 %.
    trainer.movable = true;
    let plan = strict.plan(&node, &[trainer, other]);
    assert_eq!(plan.moves, [1]);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    let t = plan
        .placements
        .iter()
        .find(|p| p.job == 1)
        .expect("trainer");
    let o = plan
        .placements
        .iter()
        .find(|p| p.job == 2)
        .expect("the other");
    assert_eq!((t.slot, o.slot), (whole, whole));
    assert!(t.mps_share < 100 && u32::from(t.mps_share) + u32::from(o.mps_share) <= 100);
    assert!(plan.steps.is_empty(), "a move needs no MIG change here");
}

#[test]
fn a_checkpointable_job_left_with_room_restarts_with_a_larger_share() {
    let (node, whole) = whole_instance_node();
    // A trainer that got 30 % next to a co-runner that has since finished.
    let mut trainer = job(1, JobClass::Offline, 30, 0.85, 0.45);
    trainer.placed = Some(whole);
    trainer.mps_share = 30;
    let share_of = |plan: &Plan, id: u64| {
        plan.placements
            .iter()
            .find(|p| p.job == id)
            .map(|p| (p.slot, p.mps_share))
    };

    // It cannot restart: it keeps its share.
    let plan = mmk().plan(&node, std::slice::from_ref(&trainer));
    assert!(plan.moves.is_empty());
    assert_eq!(share_of(&plan, 1), Some((whole, 30)));

    // It can: it restarts with the partition's room.
    trainer.movable = true;
    let plan = mmk().plan(&node, std::slice::from_ref(&trainer));
    assert_eq!(plan.moves, [1]);
    assert_eq!(share_of(&plan, 1), Some((whole, 100)));
    assert!(plan.steps.is_empty());
    // With offline shares capped, it grows only to the cap.
    let capped = mmk().with_offline_share_max(70);
    let plan = capped.plan(&node, std::slice::from_ref(&trainer));
    assert_eq!(plan.moves, [1]);
    assert_eq!(share_of(&plan, 1), Some((whole, 70)));

    // Next to an online job that cannot move, it takes only what is left.
    let mut serving = job(2, JobClass::Online, 4, 0.25, 0.35);
    serving.profile.solo_latency_ms = Some(3.0);
    serving.slo_ms = Some(50);
    serving.placed = Some(whole);
    serving.mps_share = 40;
    let plan = mmk().plan(&node, &[trainer.clone(), serving.clone()]);
    assert_eq!(plan.moves, [1]);
    assert_eq!(share_of(&plan, 1), Some((whole, 60)));
    assert_eq!(share_of(&plan, 2), Some((whole, 40)));

    // Planning again after the move moves nothing: the shares are where they grow to.
    let (node2, jobs2) = crate::plan::apply(&node, &[trainer.clone(), serving.clone()], &plan);
    assert!(mmk().plan(&node2, &jobs2).moves.is_empty());

    // A trainer that would gain nothing from the room left stays where it is, and
    // one never shrinks: alone at 90 %, the analytic model's trainer (85 % of the
    // SMs) runs at full speed already.
    let mut alone = trainer.clone();
    alone.mps_share = 90;
    let plan = mmk().plan(&node, std::slice::from_ref(&alone));
    assert!(plan.moves.is_empty(), "{:?}", plan.moves);
    assert_eq!(share_of(&plan, 1), Some((whole, 90)));

    // MIGER, which tunes shares as jobs come and go, grows it too; one that cannot
    // checkpoint it leaves as it is.
    trainer.mps_share = 30;
    let miger = Hybrid::miger(Arc::new(AnalyticModel::default()));
    let plan = miger.plan(&node, &[trainer.clone(), serving.clone()]);
    assert_eq!(plan.moves, [1]);
    assert_eq!(share_of(&plan, 1), Some((whole, 60)));
    trainer.movable = false;
    let plan = miger.plan(&node, &[trainer, serving]);
    assert!(plan.moves.is_empty());
    assert_eq!(share_of(&plan, 1), Some((whole, 30)));
}

/// Speed grows as the square root of the job's fraction of the GPU's SMs (small
/// instances are efficient), and every co-runner multiplies it by `corunner`.
#[derive(Debug)]
struct Concave {
    corunner: f64,
}

impl PerfModel for Concave {
    fn estimate(
        &self,
        _job: &JobProfile,
        part: &PartitionShape,
        share: u8,
        co: &[CoRunner],
    ) -> f64 {
        let frac =
            f64::from(share) / 100.0 * f64::from(part.sm_count) / f64::from(part.gpu_sm_count);
        frac.sqrt() * self.corunner.powi(co.len() as i32)
    }
}

/// An A100-80GB with one 7g instance (driver ID `id`) covering it.
fn whole_instance_gpu(index: u32, id: u32) -> GpuState {
    let mut g = gpu("a100-80gb", index);
    g.instances.push(Instance {
        id,
        profile_id: 0,
        placement: Placement { start: 0, size: 8 },
        uuid: format!("MIG-{id}"),
    });
    g
}

fn whole_instance_node() -> (NodeState, Slot) {
    let g = whole_instance_gpu(0, 1);
    let slot = Slot {
        gpu: 0,
        start: 0,
        profile_id: Some(0),
    };
    (NodeState::new(vec![g]), slot)
}

#[test]
fn mps_first_shares_a_partition_when_that_adds_throughput_or_the_job_would_wait() {
    let (node, whole) = whole_instance_node();
    let mut running = job(1, JobClass::Offline, 20, 0.5, 0.3);
    running.placed = Some(whole);
    running.mps_share = 50;
    let jobs = [running, job(2, JobClass::Offline, 10, 0.5, 0.3)];

    // Co-runners cost each other 40 %: the newcomer would mostly take what the running
    // job loses. Where it has a place of its own (a second GPU), it goes there.
    let zero_sum = Hybrid::mmk(Arc::new(Concave { corunner: 0.6 }));
    let two = NodeState::new(vec![node.gpus[0].clone(), gpu("a100-80gb", 1)]);
    let plan = zero_sum.plan(&two, &jobs);
    let new = plan.placements.iter().find(|p| p.job == 2).expect("placed");
    assert_eq!(new.slot.gpu, 1, "{plan:?}");
    // Where it has none (the 7g covers every slice), it shares rather than wait...
    let plan = zero_sum.plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    // ... unless sharing before waiting is off: then it waits.
    let strict = Hybrid::new(
        "strict",
        Arc::new(Concave { corunner: 0.6 }),
        HybridOptions {
            share_before_waiting: false,
            ..zero_sum.options
        },
    );
    let plan = strict.plan(&node, &jobs);
    assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);

    // Without interference the idle half of the partition is pure gain: it joins.
    let free = Hybrid::mmk(Arc::new(Concave { corunner: 1.0 }));
    let plan = free.plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    let new = plan.placements.iter().find(|p| p.job == 2).expect("placed");
    assert_eq!(new.slot, whole);
    assert!(new.mps_share <= 50, "{}", new.mps_share);

    // The plain greedy (MIGER's option) takes any gain.
    let greedy = Hybrid::new(
        "greedy",
        Arc::new(Concave { corunner: 0.6 }),
        HybridOptions {
            min_colocation_gain: 0.0,
            ..zero_sum.options
        },
    );
    assert!(greedy.plan(&node, &jobs).queued.is_empty());
}

/// Past its shares a partition's SMs go to its jobs in proportion to their shares: a
/// newcomer's share only takes from the others (a zero-sum crowd).
#[derive(Debug)]
struct Proportional;

impl PerfModel for Proportional {
    fn estimate(&self, _: &JobProfile, _: &PartitionShape, share: u8, co: &[CoRunner]) -> f64 {
        let total: u32 = u32::from(share) + co.iter().map(|c| u32::from(c.mps_share)).sum::<u32>();
        f64::from(share) / f64::from(total.max(100))
    }
}

#[test]
fn of_jobs_that_wait_together_the_smallest_gets_the_room_unless_one_has_waited_long() {
    // A training holds 40 GiB of the only partition, which covers the GPU; two services
    // wait, 30 and 20 GiB, and only one fits beside it.
    let (node, whole) = whole_instance_node();
    let mut running = job(1, JobClass::Offline, 40, 0.5, 0.3);
    running.placed = Some(whole);
    running.mps_share = 50;
    let large = job(2, JobClass::Online, 30, 0.3, 0.2);
    let small = job(3, JobClass::Online, 20, 0.3, 0.2);
    let started = |planner: &Hybrid, large: &JobDemand| {
        let plan = planner.plan(&node, &[running.clone(), large.clone(), small.clone()]);
        let queued: Vec<u64> = plan.queued.iter().map(|q| q.job).collect();
        let placed: Vec<u64> = plan
            .placements
            .iter()
            .map(|p| p.job)
            .filter(|&j| j != 1)
            .collect();
        assert_eq!(placed.len(), 1, "{plan:?}");
        assert_eq!(queued.len(), 1, "{plan:?}");
        placed[0]
    };
    // MMK serves the smaller first...
    assert!(mmk().options.smallest_first);
    assert_eq!(started(&mmk(), &large), 3);
    // ... but a job that has waited past `reserve_after` goes first, whatever its size...
    let mut aged = large.clone();
    aged.age_s = RESERVE_AFTER + 60.0;
    assert_eq!(started(&mmk(), &aged), 2);
    // ... and without the option the larger goes first, as first-fit decreasing packs.
    let largest_first = Hybrid::new(
        "largest-first",
        Arc::new(AnalyticModel::default()),
        HybridOptions {
            smallest_first: false,
            ..mmk().options
        },
    );
    assert_eq!(started(&largest_first, &large), 2);
}

#[test]
fn past_the_shares_an_offline_job_joins_at_the_most_it_may_take() {
    // A training that cannot move holds all of the only partition; another would wait.
    let (node, whole) = whole_instance_node();
    let mut running = job(1, JobClass::Offline, 20, 0.5, 0.3);
    running.placed = Some(whole);
    running.mps_share = 100;
    let jobs = [running, job(2, JobClass::Offline, 10, 0.5, 0.3)];
    let share = |planner: &Hybrid| {
        let plan = planner.plan(&node, &jobs);
        let p = plan.placements.iter().find(|p| p.job == 2).expect("placed");
        assert_eq!(p.slot, whole);
        p.mps_share
    };
    // No share adds throughput there, so none would be picked above the least: it joins
    // as plain MPS would take it, at 100 %, or at the cap on offline shares.
    assert_eq!(share(&Hybrid::mmk(Arc::new(Proportional))), 100);
    let capped = Hybrid::mmk(Arc::new(Proportional)).with_offline_share_max(60);
    assert_eq!(share(&capped), 60);
}

#[test]
fn an_online_job_joins_online_ones_past_the_shares_where_every_slo_keeps_room() {
    // A service holds the whole GPU at 100 %; another would wait for shares.
    let (node, whole) = whole_instance_node();
    let service = |id: u64| {
        let mut s = job(id, JobClass::Online, 4, 0.8, 0.3);
        s.profile.solo_latency_ms = Some(10.0);
        // Met at 1/3 of its speed alone; with MMK's room to spare, at 1.3/3.
        s.slo_ms = Some(30);
        s
    };
    let mut running = service(1);
    running.placed = Some(whole);
    running.mps_share = 100;
    let waiting = |plan: &Plan| plan.queued.iter().map(|q| q.job).collect::<Vec<_>>();
    // A co-runner leaves each 0.6 of its speed: 0.6 / 1.3 still meets the SLO, so the
    // newcomer joins at 100 %, as plain MPS would take it.
    let roomy = Hybrid::mmk(Arc::new(Concave { corunner: 0.6 }));
    let jobs = [running.clone(), service(2)];
    let plan = roomy.plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    let p = plan.placements.iter().find(|p| p.job == 2).expect("placed");
    assert_eq!((p.slot, p.mps_share), (whole, 100));
    // With more jobs waiting than the node has GPUs, no online job joins past the shares.
    let plan = roomy.plan(&node, &[running.clone(), service(2), service(3)]);
    assert_eq!(waiting(&plan), [2, 3]);
    assert!(
        plan.queued[0].reason.ends_with(
            "online jobs run there (1), whose shares an online job passes only while no more \
             jobs wait than the node has GPUs"
        ),
        "{}",
        plan.queued[0].reason
    );
    // Without the rule (the baselines' way) it waits.
    let without = Hybrid::new(
        "without",
        Arc::new(Concave { corunner: 0.6 }),
        HybridOptions {
            online_past_shares: None,
            ..roomy.options
        },
    );
    let plan = without.plan(&node, &jobs);
    assert_eq!(waiting(&plan), [2]);
    assert!(
        plan.queued[0]
            .reason
            .ends_with("whose shares are not oversubscribed"),
        "{}",
        plan.queued[0].reason
    );
    // At 0.4 each meets its SLO, but not with room to spare: it waits.
    let tight = Hybrid::mmk(Arc::new(Concave { corunner: 0.4 }));
    assert_eq!(waiting(&tight.plan(&node, &jobs)), [2]);
    // A service that gives no SLO is held to the node's default slowdown, with the same
    // room: 0.6 / 1.3 is within 3x, not within 2x. Where the node keeps no default, no
    // online job joins it past the shares.
    let mut quiet = running.clone();
    quiet.slo_ms = None;
    let jobs = [quiet, service(2)];
    let guarded = |slowdown: f64| {
        Hybrid::mmk(Arc::new(Concave { corunner: 0.6 })).with_slo_guard(Some(slowdown))
    };
    assert!(guarded(3.0).plan(&node, &jobs).queued.is_empty());
    assert_eq!(waiting(&guarded(2.0).plan(&node, &jobs)), [2]);
    assert_eq!(waiting(&roomy.plan(&node, &jobs)), [2]);
}

#[test]
fn a_starved_checkpointable_job_is_lifted_past_spent_shares() {
    // Two trainings share the whole GPU at 90 % and 10 %: its shares are spent, so step 4
    // has no room to grow the second into. MIG off: no instances for step 4b to split
    // the GPU into.
    let mut g = gpu("h100-80gb", 0);
    g.mig_enabled = false;
    let node = NodeState::new(vec![g]);
    let whole = Slot {
        gpu: 0,
        start: 0,
        profile_id: None,
    };
    let training = |id: u64, share: u8| {
        let mut t = job(id, JobClass::Offline, 20, 0.8, 0.3);
        t.placed = Some(whole);
        t.mps_share = share;
        t.movable = true;
        t
    };
    let jobs = [training(1, 90), training(2, 10)];
    let share_of = |plan: &Plan, id: u64| {
        plan.placements
            .iter()
            .find(|p| p.job == id)
            .map(|p| p.mps_share)
    };
    // Where 100 % adds throughput (speed grows as the square root of the share), the
    // starved one restarts at 100 %, as plain MPS would run it.
    let concave = Hybrid::mmk(Arc::new(Concave { corunner: 0.9 }));
    let plan = concave.plan(&node, &jobs);
    assert_eq!(plan.moves, [2]);
    assert_eq!(
        (share_of(&plan, 1), share_of(&plan, 2)),
        (Some(90), Some(100))
    );
    // Where it would only take from its co-runner (a zero-sum crowd), it stays.
    let plan = Hybrid::mmk(Arc::new(Proportional)).plan(&node, &jobs);
    assert!(plan.moves.is_empty(), "{:?}", plan.moves);
    // Nor does it move if it cannot checkpoint, or beside an online job.
    let mut fixed = jobs.clone();
    fixed[1].movable = false;
    assert!(concave.plan(&node, &fixed).moves.is_empty());
    let mut service = job(3, JobClass::Online, 4, 0.5, 0.3);
    service.placed = Some(whole);
    service.mps_share = 100;
    let beside = [training(1, 90), training(2, 10), service];
    assert!(concave.plan(&node, &beside).moves.is_empty());
    // Without the rule it stays too.
    let without = Hybrid::new(
        "without",
        Arc::new(Concave { corunner: 0.9 }),
        HybridOptions {
            lift_starved: false,
            ..concave.options
        },
    );
    assert!(without.plan(&node, &jobs).moves.is_empty());
}

#[test]
fn the_last_resort_adds_no_offline_job_to_a_crowded_partition() {
    // CROWD_MAX trainings run in the only partition (the 7g covers every slice) with
    // their shares spent, and nothing can move.
    let (node, whole) = whole_instance_node();
    let running = |n: u64| -> Vec<JobDemand> {
        (1..=n)
            .map(|i| {
                let mut t = job(i, JobClass::Offline, 4, 0.5, 0.3);
                t.placed = Some(whole);
                t.mps_share = 20;
                t
            })
            .collect()
    };
    let mut jobs = running(CROWD_MAX as u64);
    jobs.push(job(100, JobClass::Offline, 4, 0.5, 0.3));
    let plan = mmk().plan(&node, &jobs);
    // The offline newcomer waits, and says for whom.
    assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [100]);
    assert_eq!(
        *plan.queued[0].reason,
        format!(
            "waiting for 4GiB of GPU memory: the partitions with room run {CROWD_MAX} jobs or \
             more, the most that an offline job joins when it would otherwise wait: \
             1, 2, 3, 4, 5, 6"
        )
    );
    // An online newcomer is not kept out.
    let mut serving = job(200, JobClass::Online, 4, 0.25, 0.35);
    serving.profile.solo_latency_ms = Some(3.0);
    jobs[CROWD_MAX] = serving;
    let plan = mmk().plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    let s = plan
        .placements
        .iter()
        .find(|p| p.job == 200)
        .expect("online placed");
    assert_eq!(s.slot, whole);

    // One training fewer: it joins rather than wait.
    let mut jobs = running(CROWD_MAX as u64 - 1);
    jobs.push(job(100, JobClass::Offline, 4, 0.5, 0.3));
    let plan = mmk().plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);

    // Without the cap (`crowd_max: None`) the crowd takes it too.
    let uncapped = Hybrid::new(
        "uncapped",
        Arc::new(AnalyticModel::default()),
        HybridOptions {
            crowd_max: None,
            ..mmk().options
        },
    );
    let mut jobs = running(CROWD_MAX as u64);
    jobs.push(job(100, JobClass::Offline, 4, 0.5, 0.3));
    assert!(uncapped.plan(&node, &jobs).queued.is_empty());
}

#[test]
fn a_job_asked_to_leave_moves_to_another_gpu_if_it_can_checkpoint() {
    // A service and a light training share GPU 0's only instance; sharing there predicts
    // well, so no step would move the training, until the node asks it to leave (the SLO
    // control at its highest level). GPU 1 runs a training of its own.
    let (node, whole) = whole_instance_node();
    let two = NodeState::new(vec![node.gpus[0].clone(), gpu("a100-80gb", 1)]);
    let mut service = job(1, JobClass::Online, 10, 0.2, 0.1);
    service.placed = Some(whole);
    let mut training = job(2, JobClass::Offline, 10, 0.2, 0.1);
    training.placed = Some(whole);
    training.mps_share = 80;
    training.movable = true;
    let other = job(3, JobClass::Offline, 20, 0.5, 0.3);
    let jobs = vec![service, training, other];
    let planned = mmk().plan(&two, &jobs);
    assert!(planned.moves.is_empty(), "{planned:?}");
    let (two, mut jobs) = crate::plan::apply(&two, &jobs, &planned);
    assert_eq!(jobs[1].id, 2);
    jobs[1].leave = true;
    let plan = mmk().plan(&two, &jobs);
    assert_eq!(plan.moves, [2], "{plan:?}");
    let moved = plan.placements.iter().find(|p| p.job == 2).expect("placed");
    assert_eq!(moved.slot.gpu, 1, "{plan:?}");
    let service = plan.placements.iter().find(|p| p.job == 1).expect("kept");
    assert_eq!(service.slot, whole, "the service stays");
    // One that cannot checkpoint is never stopped for it.
    jobs[1].movable = false;
    assert!(mmk().plan(&two, &jobs).moves.is_empty());
}

#[test]
fn a_starved_job_spreads_to_an_idle_gpu() {
    // Three trainings in GPU 0's only instance (a 7g), their shares spent; the third, at
    // 10 %, is predicted far below a quarter of its speed alone. GPU 1 runs nothing.
    let (node, whole) = whole_instance_node();
    let two = NodeState::new(vec![node.gpus[0].clone(), gpu("a100-80gb", 1)]);
    let mut jobs: Vec<JobDemand> = [45, 45, 10]
        .into_iter()
        .zip(1..)
        .map(|(share, i)| {
            let mut t = job(i, JobClass::Offline, 10, 0.9, 0.3);
            t.placed = Some(whole);
            t.mps_share = share;
            t
        })
        .collect();
    jobs[2].movable = true;
    let plan = mmk().plan(&two, &jobs);
    // It checkpoints and restarts on GPU 1; the others stay.
    assert_eq!(plan.moves, [3], "{plan:?}");
    let moved = plan.placements.iter().find(|p| p.job == 3).expect("placed");
    assert_eq!(moved.slot.gpu, 1, "{plan:?}");
    for id in [1, 2] {
        let p = plan
            .placements
            .iter()
            .find(|p| p.job == id)
            .expect("placed");
        assert_eq!(p.slot, whole);
    }

    // A job that cannot checkpoint stays where it is.
    jobs[2].movable = false;
    assert!(mmk().plan(&two, &jobs).moves.is_empty());

    // Without the step (`spread_below: None`) it stays too.
    jobs[2].movable = true;
    let stay = Hybrid::new(
        "stay",
        Arc::new(AnalyticModel::default()),
        HybridOptions {
            spread_below: None,
            ..mmk().options
        },
    );
    assert!(stay.plan(&two, &jobs).moves.is_empty());
}

#[test]
fn an_empty_instance_is_reshaped_for_the_jobs_waiting() {
    // An empty 7g and three waiting jobs, on a model where small instances are
    // efficient: the 7g goes and smaller instances take all three, rather than
    // MPS-first handing the whole GPU to the first job.
    let (node, whole) = whole_instance_node();
    let jobs: Vec<JobDemand> = (1..=3)
        .map(|id| job(id, JobClass::Offline, 10, 0.5, 0.3))
        .collect();
    let plan = Hybrid::mmk(Arc::new(Concave { corunner: 0.6 })).plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{:?}", plan.queued);
    assert!(
        plan.steps
            .iter()
            .any(|s| matches!(s, Step::Destroy { slot, .. } if *slot == whole)),
        "{:?}",
        plan.steps
    );
    let slots: BTreeSet<Slot> = plan.placements.iter().map(|p| p.slot).collect();
    assert_eq!(slots.len(), 3, "one instance each: {:?}", plan.placements);

    // One waiting job still takes the empty 7g as it is.
    let plan = Hybrid::mmk(Arc::new(Concave { corunner: 0.6 })).plan(&node, &jobs[..1]);
    assert!(plan.steps.is_empty(), "{:?}", plan.steps);
    assert_eq!(plan.placements[0].slot, whole);
}

#[test]
fn an_idle_room_elsewhere_beats_sharing_a_busy_one() {
    // GPU 0's 7g runs a job at half its share; GPU 1 has room no job uses (no free
    // slices on either GPU): an empty 7g, a GPU with MIG off, or an empty 7g on a GPU
    // whose layout is fixed. Sharing GPU 0 would add throughput (co-runners cost
    // nothing here), but the newcomer does better alone on GPU 1, at 100 %, with no
    // reconfiguration.
    let mut mig_off = gpu("a100-80gb", 1);
    mig_off.mig_enabled = false;
    let mut fixed = whole_instance_gpu(1, 2);
    fixed.layout_fixed = true;
    for (idle, profile_id) in [
        (whole_instance_gpu(1, 2), Some(0)),
        (mig_off, None),
        (fixed, Some(0)),
    ] {
        let (mut node, busy) = whole_instance_node();
        node.gpus.push(idle);
        let mut running = job(1, JobClass::Offline, 20, 0.5, 0.3);
        running.placed = Some(busy);
        running.mps_share = 50;
        let jobs = [running, job(2, JobClass::Offline, 10, 0.9, 0.3)];
        let plan = Hybrid::mmk(Arc::new(Concave { corunner: 1.0 })).plan(&node, &jobs);
        assert!(plan.steps.is_empty(), "{:?}", plan.steps);
        let new = plan.placements.iter().find(|p| p.job == 2).expect("placed");
        assert_eq!(
            (new.slot, new.mps_share),
            (
                Slot {
                    gpu: 1,
                    start: 0,
                    profile_id
                },
                100
            ),
            "{profile_id:?}"
        );
    }
}

/// The kinds of job the shortcut tests draw from: class, GiB, SM and bandwidth demand,
/// (solo latency ms, SLO ms), checkpointable.
type Kind = (JobClass, u64, f64, f64, Option<(f64, u64)>, bool);

/// Plans 60 steps of random arrivals (fewer than `arrivals` a step, none in the last 20)
/// and completions on
/// `gpus` A100s (MIG on or off) with a planner that keeps its memo, a fresh one and one
/// without shortcuts, and requires the same plans of the three; returns the warm planner.
/// Each step the jobs there age by `step_s` seconds.
fn same_plans_with_and_without_shortcuts(
    make: fn(Arc<dyn PerfModel>) -> Hybrid,
    model: Arc<dyn PerfModel>,
    (gpus, mig): (u32, bool),
    kinds: &[Kind],
    (arrivals, step_s): (usize, f64),
) -> Hybrid {
    use crate::plan::apply;
    let warm = make(Arc::clone(&model));
    let mut rng = mmk_core::rng::Rng::new(7);
    let mut node = NodeState::new(
        (0..gpus)
            .map(|i| GpuState {
                mig_enabled: mig,
                ..gpu("a100-80gb", i)
            })
            .collect(),
    );
    let mut jobs: Vec<JobDemand> = Vec::new();
    let mut next = 1;
    for step in 0..60 {
        // The last 20 steps drain the node: GPUs empty around the jobs left.
        let arriving = if step < 40 { rng.below(arrivals) } else { 0 };
        for _ in 0..arriving {
            let (class, gib, sm, bw, lat, movable) = kinds[rng.below(kinds.len())];
            let mut j = job(next, class, gib, sm, bw);
            if let Some((solo, slo)) = lat {
                j.profile.solo_latency_ms = Some(solo);
                j.slo_ms = Some(slo);
            }
            j.movable = movable;
            jobs.push(j);
            next += 1;
        }
        let plan = warm.plan(&node, &jobs);
        let fresh = make(Arc::clone(&model)).plan(&node, &jobs);
        assert_eq!(plan, fresh, "{} at step {step}", warm.name());
        // The same state again, as when a job arrives that changes nothing.
        let again = warm.plan(&node, &jobs);
        assert_eq!(plan, again, "{} at step {step}, asked again", warm.name());
        let reference = make(Arc::clone(&model)).forgetful().plan(&node, &jobs);
        assert_eq!(
            plan,
            reference,
            "{} at step {step}, no shortcuts",
            warm.name()
        );
        (node, jobs) = apply(&node, &jobs, &plan);
        // Some placed jobs finish.
        jobs.retain(|j| j.placed.is_none() || rng.below(3) > 0);
        for j in &mut jobs {
            j.age_s += step_s;
        }
    }
    warm
}

/// The memo and the skipping of refused kinds only save work: a planner that has
/// answered many passes before plans exactly as a new one, and as one without either
/// shortcut, over jobs of repeated kinds (same profile, different SLOs, memory,
/// movability) arriving and finishing at random.
#[test]
fn remembered_answers_are_the_answers() {
    let kinds: [Kind; 8] = [
        (JobClass::Online, 10, 0.3, 0.2, Some((4.0, 12)), false),
        (JobClass::Online, 10, 0.3, 0.2, Some((4.0, 6)), false),
        (JobClass::Online, 10, 0.3, 0.2, None, false),
        (JobClass::Offline, 20, 0.6, 0.5, None, true),
        (JobClass::Offline, 20, 0.6, 0.5, None, false),
        (JobClass::Offline, 70, 0.6, 0.5, None, true),
        (JobClass::Offline, 40, 0.9, 0.3, None, true),
        (JobClass::Offline, 5, 0.2, 0.8, None, false),
    ];
    for make in [Hybrid::mmk, Hybrid::miger, Hybrid::miso] {
        SKIPPED.set(0);
        LAYOUTS_SKIPPED.set(0);
        CHOICES_RECALLED.set(0);
        VERDICTS_RECALLED.set(0);
        let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
        let warm = same_plans_with_and_without_shortcuts(make, model, (2, true), &kinds, (4, 0.0));
        assert!(
            warm.memo().config.len() > 10,
            "{}: the memo was used",
            warm.name()
        );
        // Answers by numbers: MPS-first's (MMK's alone) and the layout search's.
        let memo = warm.memo();
        assert!(
            (memo.answers.len() > 10 || warm.name() != "mmk") && memo.configs.len() > 10,
            "{}: answers by numbers were used ({} MPS-first, {} layout search)",
            warm.name(),
            memo.answers.len(),
            memo.configs.len()
        );
        drop(memo);
        assert!(
            SKIPPED.get() > 0,
            "{}: refused kinds were skipped",
            warm.name()
        );
        assert!(
            LAYOUTS_SKIPPED.get() > 0,
            "{}: GPU states that place no waiting kind were not asked again",
            warm.name()
        );
        assert!(
            CHOICES_RECALLED.get() > 0 || warm.name() != "mmk",
            "{}: MPS-first's choices were recalled",
            warm.name()
        );
        assert!(
            VERDICTS_RECALLED.get() > 0 || warm.name() != "mmk",
            "{}: MPS-first's verdicts were read from the memo",
            warm.name()
        );
    }
    // Step 7 under a queue: services wait behind trainings that fill a GPU, some of which
    // can checkpoint.
    let behind: [Kind; 3] = [
        (JobClass::Online, 10, 0.3, 0.2, None, false),
        (JobClass::Offline, 75, 0.6, 0.5, None, false),
        (JobClass::Offline, 75, 0.6, 0.5, None, true),
    ];
    PREEMPT_SKIPPED.set(0);
    let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
    same_plans_with_and_without_shortcuts(Hybrid::mmk, model, (1, false), &behind, (4, 0.0));
    assert!(
        PREEMPT_SKIPPED.get() > 0,
        "online jobs of a kind that found no eviction were skipped"
    );
    // MMK's later steps: a model with plateaus (shares climb past them), small
    // checkpointable trainings that crowd whole GPUs (MIG off) and starve there, and three
    // GPUs, so that one of them may be idle for a starved job to spread to.
    let small: [Kind; 3] = [
        (JobClass::Offline, 5, 0.9, 0.3, None, true),
        (JobClass::Offline, 5, 0.9, 0.3, None, true),
        (JobClass::Offline, 30, 0.9, 0.3, None, true),
    ];
    for c in [&CLIMBED, &CROWDED, &SPREAD] {
        c.set(0);
    }
    // Up to 10 arrivals a step: a load at which this seed's run reaches all three steps
    // (the counters below), with offline newcomers joining crowds at their cap.
    same_plans_with_and_without_shortcuts(
        Hybrid::mmk,
        Arc::new(Starving),
        (3, false),
        &small,
        (10, 0.0),
    );
    assert!(
        CLIMBED.get() > 0 && CROWDED.get() > 0 && SPREAD.get() > 0,
        "shares climbed ({}), the last resort passed crowds over ({}) and starved jobs spread ({})",
        CLIMBED.get(),
        CROWDED.get(),
        SPREAD.get()
    );
    // Past the shares: services that each fill a whole GPU (MIG off) join one another
    // while the queue is short, and trainings that stop growing at their SM demand leave
    // a newcomer a small share of a partition, which step 4 then lifts.
    let past: [Kind; 3] = [
        (JobClass::Online, 10, 1.0, 0.2, Some((4.0, 40)), false),
        (JobClass::Offline, 10, 0.6, 0.3, None, true),
        (JobClass::Offline, 10, 0.9, 0.3, None, true),
    ];
    ONLINE_PAST.set(0);
    LIFTED.set(0);
    // On one GPU (a short queue is one job) and on two with more arrivals: loads at which
    // this seed's runs reach the two rules.
    for (gpus, arrivals) in [(1, 2), (2, 3)] {
        same_plans_with_and_without_shortcuts(
            Hybrid::mmk,
            Arc::new(Saturating),
            (gpus, false),
            &past,
            (arrivals, 0.0),
        );
    }
    assert!(
        ONLINE_PAST.get() > 0 && LIFTED.get() > 0,
        "online jobs joined past the shares ({}) and starved jobs were lifted ({})",
        ONLINE_PAST.get(),
        LIFTED.get()
    );
    // Step 0 under a queue: jobs wait for hours (20 minutes a step), services that need a
    // whole GPU too, so GPUs are held for offline jobs, several of one kind; small
    // services with a tight SLO refuse some of them.
    let aged: [Kind; 5] = [
        (JobClass::Online, 70, 0.3, 0.2, Some((4.0, 6)), false),
        (JobClass::Online, 10, 0.3, 0.2, Some((4.0, 5)), false),
        (JobClass::Offline, 60, 0.6, 0.5, None, false),
        (JobClass::Offline, 60, 0.9, 0.3, None, true),
        (JobClass::Offline, 30, 0.9, 0.3, None, false),
    ];
    AGED_SKIPPED.set(0);
    let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
    same_plans_with_and_without_shortcuts(Hybrid::mmk, model, (4, false), &aged, (10, 1200.0));
    assert!(
        AGED_SKIPPED.get() > 0,
        "jobs that waited long of a kind that stayed waiting were not tried alone again"
    );
}

/// Where a waiting job could have an instance of its own, an instance on a slice that busy
/// instances take is ruled out before the layout check (`alone.rs`): on every GPU model,
/// beside every valid set of busy instances, the check refuses each such instance.
#[test]
fn an_instance_on_taken_slices_never_fits() {
    use super::alone::{slices, taken};
    for model in catalog::models() {
        let mut ruled_out = 0;
        for mut busy in crate::layout::enumerate(&model) {
            let taken = taken(&model, &busy);
            for p in model.profiles.iter().filter(|p| !p.media_extensions) {
                for &start in &p.starts {
                    if taken & slices(start, p.memory_slices) == 0 {
                        continue;
                    }
                    busy.push((p.id, start));
                    assert!(
                        !crate::layout::fits(&model, &busy),
                        "{}: {busy:?}",
                        model.key
                    );
                    busy.pop();
                    ruled_out += 1;
                }
            }
        }
        assert!(ruled_out > 0, "{}", model.key);
    }
}

#[test]
fn a_job_whose_partition_vanished_is_not_lost() {
    let node = NodeState::new(vec![gpu("a100-80gb", 0)]);
    let mut gone = job(1, JobClass::Offline, 10, 0.5, 0.3);
    gone.placed = Some(Slot {
        gpu: 0,
        start: 4,
        profile_id: Some(9),
    });
    gone.mps_share = 60;
    let plan = mmk().plan(&node, &[gone]);
    assert_eq!(plan.placements.len(), 1);
    assert_eq!(plan.placements[0].mps_share, 60);
}

#[test]
fn the_candidate_layouts_are_maximal() {
    let m = catalog::model("a100-80gb").expect("model");
    let layouts = maximal_layouts(&m);
    assert!(!layouts.is_empty());
    assert!(layouts.iter().any(|l| l == &vec![(0, 0)]), "the 7g alone");
    for l in &layouts {
        assert!(
            l.iter()
                .all(|(id, _)| !m.profile(*id).is_some_and(|p| p.media_extensions))
        );
        let slices: u8 = l
            .iter()
            .filter_map(|(id, _)| m.profile(*id))
            .map(|p| p.memory_slices)
            .sum();
        assert!(slices >= 7, "{l:?} leaves room");
    }
}

#[test]
fn an_exclusive_job_has_its_partition_to_itself() {
    let (node, whole) = whole_instance_node();
    let mut alone = job(1, JobClass::Offline, 10, 0.5, 0.3);
    alone.exclusive = true;
    alone.placed = Some(whole);
    alone.mps_share = 100;
    let other = job(2, JobClass::Offline, 10, 0.5, 0.3);
    let plan = mmk().plan(&node, &[alone, other]);
    assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);
    // Nor does an exclusive newcomer join a busy partition...
    let mut busy = job(1, JobClass::Offline, 10, 0.5, 0.3);
    busy.placed = Some(whole);
    busy.mps_share = 50;
    let mut wants = job(2, JobClass::Offline, 10, 0.5, 0.3);
    wants.exclusive = true;
    let plan = mmk().plan(&node, &[busy.clone(), wants.clone()]);
    assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [2]);
    // ... which it would join without the flag.
    wants.exclusive = false;
    assert!(mmk().plan(&node, &[busy, wants]).queued.is_empty());
}

#[test]
fn jobs_nobody_profiled_share_an_a100_while_memory_lasts() {
    // Three 10 GiB jobs with the prior, arriving one after another: none waits while
    // memory is free.
    let planner = mmk();
    let mut node = NodeState::new(vec![gpu("a100-80gb", 0)]);
    let mut jobs: Vec<JobDemand> = Vec::new();
    for id in 1..=3 {
        jobs.push(JobDemand::waiting(id, JobClass::Offline, 10 * 1024));
        let plan = planner.plan(&node, &jobs);
        assert!(plan.queued.is_empty(), "job {id}: {:?}", plan.queued);
        (node, jobs) = crate::plan::apply(&node, &jobs, &plan);
    }
}

#[test]
fn a_waiting_job_is_told_which_jobs_are_in_its_way() {
    let (node, whole) = whole_instance_node();
    let placed = |id, class, gib, share| {
        let mut j = job(id, class, gib, 0.5, 0.3);
        j.placed = Some(whole);
        j.mps_share = share;
        j
    };
    let reason = |plan: &Plan, id: u64| {
        plan.queued
            .iter()
            .find(|q| q.job == id)
            .map(|q| q.reason.to_string())
            .unwrap_or_else(|| panic!("{plan:?}"))
    };
    // Memory: an online job that no partition holds hears which offline jobs hold it.
    let jobs = [
        placed(1, JobClass::Offline, 40, 50),
        placed(2, JobClass::Offline, 35, 50),
        job(3, JobClass::Online, 10, 0.3, 0.3),
    ];
    let plan = mmk().plan(&node, &jobs);
    assert_eq!(
        reason(&plan, 3),
        "waiting for 10GiB of GPU memory: no partition has that much free; offline jobs hold \
         the memory: 1, 2"
    );
    // Shares: the offline budget is spent beside an online job, whose partition is never
    // oversubscribed.
    let jobs = [
        placed(1, JobClass::Online, 10, 100),
        placed(3, JobClass::Offline, 10, 100),
        job(2, JobClass::Offline, 10, 0.3, 0.3),
    ];
    let plan = mmk().plan(&node, &jobs);
    assert!(
        reason(&plan, 2)
            .ends_with("online jobs run there (1), whose shares are not oversubscribed"),
        "{}",
        reason(&plan, 2)
    );
    // Where the node keeps online jobs' objectives at run time (mmkd's SLO control), the
    // same job joins beside them, past the offline shares, as plain MPS would take it ...
    let guarded = mmk().with_slo_guard(Some(4.0));
    let plan = guarded.plan(&node, &jobs);
    assert!(plan.queued.is_empty(), "{plan:?}");
    let p = plan.placements.iter().find(|p| p.job == 2).expect("placed");
    let online = plan.placements.iter().find(|p| p.job == 1).expect("kept");
    assert_eq!(p.slot, online.slot, "beside the online job");
    // ... but not where it would break the online job's predicted SLO.
    let mut strict_online = placed(1, JobClass::Online, 10, 100);
    strict_online.slo_ms = Some(1);
    strict_online.profile.solo_latency_ms = Some(0.99);
    let tight = [strict_online, jobs[1].clone(), jobs[2].clone()];
    let plan = guarded.plan(&node, &tight);
    assert!(
        reason(&plan, 2).contains("would break the predicted SLO of an online job"),
        "{}",
        reason(&plan, 2)
    );
    // ... nor where the service, which gives no objective, would run slower than the
    // node's default allows (here: any slowdown at all).
    let plan = mmk().with_slo_guard(Some(1.0)).plan(&node, &jobs);
    assert!(
        reason(&plan, 2).contains("would break the predicted SLO of an online job"),
        "{}",
        reason(&plan, 2)
    );
    // A partition of its own.
    let mut alone = job(2, JobClass::Offline, 10, 0.3, 0.3);
    alone.exclusive = true;
    let plan = mmk().plan(&node, &[placed(1, JobClass::Offline, 10, 50), alone]);
    assert!(
        reason(&plan, 2).ends_with(
            "it asks for a partition of its own, and the partitions with room run jobs 1"
        ),
        "{}",
        reason(&plan, 2)
    );
}

#[test]
fn an_online_job_takes_memory_from_checkpointable_offline_work() {
    let (node, whole) = whole_instance_node();
    let placed = |id, gib, priority, movable| {
        let mut j = job(id, JobClass::Offline, gib, 0.5, 0.3);
        j.placed = Some(whole);
        j.mps_share = 50;
        j.priority = priority;
        j.movable = movable;
        j
    };
    let online = job(9, JobClass::Online, 20, 0.3, 0.3);
    // 75 GiB of 80 held: the online job's 20 GiB fit once one offline job leaves. Of the
    // two checkpointable ones, the one of lower priority stops, though it is the smaller.
    let jobs = [
        placed(1, 40, 5, true),
        placed(2, 35, 0, true),
        online.clone(),
    ];
    let plan = mmk().plan(&node, &jobs);
    assert_eq!(
        plan.preempted,
        [Preemption { job: 2, for_job: 9 }],
        "{plan:?}"
    );
    assert!(plan.queued.is_empty(), "{plan:?}");
    let at = |id| plan.placements.iter().find(|p| p.job == id).copied();
    let online_at = at(9).expect("the online job runs");
    assert_eq!((online_at.slot, online_at.mps_share), (whole, 100));
    assert_eq!(
        at(1).map(|p| p.mps_share),
        Some(50),
        "the other stays as it was"
    );
    assert_eq!(at(2), None, "the preempted job is not placed");
    // Applied, the node holds the online job and job 1; job 2 waits to be placed again.
    let (_, after) = crate::plan::apply(&node, &jobs, &plan);
    assert_eq!(
        after.iter().find(|j| j.id == 2).and_then(|j| j.placed),
        None
    );

    // Nothing that may stop: the job waits, told who holds the memory.
    let jobs = [
        placed(1, 40, 0, false),
        placed(2, 35, 0, false),
        online.clone(),
    ];
    let plan = mmk().plan(&node, &jobs);
    assert!(plan.preempted.is_empty());
    assert!(
        plan.queued
            .iter()
            .any(|q| q.job == 9 && q.reason.ends_with("offline jobs hold the memory: 1, 2")),
        "{plan:?}"
    );
    // Where many hold it, the reason names eight and counts the rest.
    let mut many: Vec<JobDemand> = (1..=10).map(|id| placed(id, 7, 0, false)).collect();
    for j in &mut many {
        j.mps_share = 10;
    }
    let mut late = online.clone();
    late.id = 11;
    many.push(late);
    let plan = mmk().plan(&node, &many);
    assert!(
        plan.queued.iter().any(|q| q.job == 11
            && q.reason
                .ends_with("offline jobs hold the memory: 1, 2, 3, 4, 5, 6, 7, 8 and 2 more")),
        "{plan:?}"
    );
    // Nor is offline work of higher priority stopped for it.
    let jobs = [
        placed(1, 40, 5, true),
        placed(2, 35, 5, true),
        online.clone(),
    ];
    assert!(mmk().plan(&node, &jobs).preempted.is_empty());
    // MIGER and MISO never preempt.
    let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
    let jobs = [placed(1, 40, 0, true), placed(2, 35, 0, true), online];
    assert!(
        Hybrid::miger(Arc::clone(&model))
            .plan(&node, &jobs)
            .preempted
            .is_empty()
    );
    assert!(Hybrid::miso(model).plan(&node, &jobs).preempted.is_empty());
}

/// A model whose prediction for a job alone stays flat from 50 to 70 % of the SMs and
/// rises again above, as the forest's do (mps_config::Raise).
#[derive(Debug)]
struct Plateau;

impl PerfModel for Plateau {
    fn estimate(&self, _: &JobProfile, _: &PartitionShape, share: u8, co: &[CoRunner]) -> f64 {
        let alone = match share {
            0..=50 => f64::from(share) / 100.0,
            51..=70 => 0.5,
            _ => f64::from(share) / 100.0,
        };
        alone * 0.7_f64.powi(co.len() as i32)
    }
}

/// A job's speed grows with its share up to its SM demand and no further; each co-runner
/// takes a tenth, whatever the shares add up to.
#[derive(Debug)]
struct Saturating;

impl PerfModel for Saturating {
    fn estimate(&self, job: &JobProfile, _: &PartitionShape, share: u8, co: &[CoRunner]) -> f64 {
        (f64::from(share) / 100.0).min(job.sm_demand) / job.sm_demand
            * 0.9_f64.powi(co.len() as i32)
    }
}

/// `Plateau`'s speeds alone, each co-runner halving them: jobs starve in crowds.
#[derive(Debug)]
struct Starving;

impl PerfModel for Starving {
    fn estimate(&self, job: &JobProfile, part: &PartitionShape, share: u8, co: &[CoRunner]) -> f64 {
        Plateau.estimate(job, part, share, &[]) * 0.5_f64.powi(co.len() as i32)
    }
}

#[test]
fn on_a_calm_node_a_newcomer_takes_the_share_the_model_likes_best() {
    let mut g = gpu("h100-80gb", 0);
    g.mig_enabled = false;
    let mut node = NodeState::new(vec![g]);
    // Checkpointable: no share that lasts sets its least share (`lasting_share`, below).
    let mut trainer = job(1, JobClass::Offline, 30, 0.9, 0.3);
    trainer.movable = true;
    let share = |planner: &Hybrid, node: &NodeState, jobs: &[JobDemand]| {
        let plan = planner.plan(node, jobs);
        plan.placements
            .iter()
            .find(|p| p.job == 1)
            .map(|p| p.mps_share)
    };
    let mmk = Hybrid::mmk(Arc::new(Plateau));
    // Nothing known of the node's history: the share grows while a step adds throughput,
    // and stops on the plateau.
    assert_eq!(share(&mmk, &node, std::slice::from_ref(&trainer)), Some(50));
    // Calm: past the plateau, to the best prediction.
    node.calm_arrivals = CALM_ARRIVALS;
    assert_eq!(
        share(&mmk, &node, std::slice::from_ref(&trainer)),
        Some(100)
    );
    // A node that was calm for fewer arrivals, and the baselines, raise greedily.
    node.calm_arrivals = CALM_ARRIVALS - 1;
    assert_eq!(share(&mmk, &node, std::slice::from_ref(&trainer)), Some(50));
    node.calm_arrivals = u64::MAX;
    let miger = Hybrid::miger(Arc::new(Plateau));
    assert_eq!(
        share(&miger, &node, std::slice::from_ref(&trainer)),
        Some(50)
    );
    // With offline shares capped at 80 %, the best share is the best up to the cap, and
    // an online job that joins later still takes the whole online share.
    let capped = Hybrid::mmk(Arc::new(Plateau)).with_offline_share_max(80);
    assert_eq!(
        share(&capped, &node, std::slice::from_ref(&trainer)),
        Some(80)
    );
    let first = capped.plan(&node, std::slice::from_ref(&trainer));
    let (node, jobs) = crate::plan::apply(&node, std::slice::from_ref(&trainer), &first);
    assert_eq!(jobs[0].mps_share, 80);
    let mut serving = job(2, JobClass::Online, 8, 0.3, 0.2);
    serving.profile.solo_latency_ms = Some(5.0);
    serving.slo_ms = Some(50);
    let plan = capped.plan(&node, &[jobs[0].clone(), serving]);
    let online = plan.placements.iter().find(|p| p.job == 2).expect("placed");
    assert_eq!(
        (online.slot, online.mps_share),
        (jobs[0].placed.expect("placed"), 100)
    );
}

/// Step 4b: a checkpointable training left alone in a 3g.40gb on an otherwise idle GPU
/// restarts in a larger instance when nothing waits; one that cannot checkpoint, or a
/// node with a job waiting, keeps it.
#[test]
fn a_checkpointable_job_alone_on_its_gpu_restarts_in_a_larger_instance() {
    let mut g = gpu("a100-80gb", 0);
    let p3 = g.model.profile_by_name("3g.40gb").expect("3g.40gb");
    let (p3_id, p3_slices) = (p3.id, p3.memory_slices);
    g.instances.push(Instance {
        id: 5,
        profile_id: p3_id,
        placement: Placement {
            start: 4,
            size: p3_slices,
        },
        uuid: "MIG-5".into(),
    });
    let node = NodeState::new(vec![g]);
    let small = Slot {
        gpu: 0,
        start: 4,
        profile_id: Some(p3_id),
    };
    let mut trainer = job(1, JobClass::Offline, 20, 0.85, 0.45);
    trainer.placed = Some(small);
    let sm = |plan: &Plan| {
        let slot = plan
            .placements
            .iter()
            .find(|p| p.job == 1)
            .expect("placed")
            .slot;
        let m = &node.gpus[0].model;
        slot.profile_id
            .and_then(|id| m.profile(id))
            .map_or(m.sm_count, |p| p.sm_count)
    };
    let plan = mmk().plan(&node, std::slice::from_ref(&trainer));
    assert!(plan.moves.is_empty(), "it cannot checkpoint: {plan:?}");

    trainer.movable = true;
    let plan = mmk().plan(&node, std::slice::from_ref(&trainer));
    assert_eq!(plan.moves, [1], "{plan:?}");
    let three_g = node.gpus[0].model.profile(p3_id).expect("3g").sm_count;
    assert!(sm(&plan) > three_g, "{plan:?}");
    // The engine's and mmkd's apply give the job its new place, and the next pass keeps it.
    let (node2, jobs2) = crate::plan::apply(&node, std::slice::from_ref(&trainer), &plan);
    assert!(mmk().plan(&node2, &jobs2).moves.is_empty());

    // A job waits (no room for 79 GiB beside the trainer): the idle slices may be its.
    let big = job(2, JobClass::Offline, 79, 0.5, 0.3);
    let plan = mmk().plan(&node, &[trainer.clone(), big]);
    assert!(plan.moves.is_empty(), "{plan:?}");
    // MIGER and MISO lay the GPU out again for it too, the move paying for itself.
    for baseline in [
        Hybrid::miger(Arc::new(AnalyticModel::default())),
        Hybrid::miso(Arc::new(AnalyticModel::default())),
    ] {
        let plan = baseline.plan(&node, std::slice::from_ref(&trainer));
        assert_eq!(plan.moves, [1], "{}: {plan:?}", baseline.name());
        assert!(sm(&plan) > three_g, "{}: {plan:?}", baseline.name());
        let (node2, jobs2) = crate::plan::apply(&node, std::slice::from_ref(&trainer), &plan);
        assert!(baseline.plan(&node2, &jobs2).moves.is_empty());
    }
}

/// MISO's and MIGER's repartitioning (`HybridOptions::repartition_busy`): a job that
/// waits because one training holds the whole GPU gets an instance when the training can
/// checkpoint and restart in a smaller one; a training that cannot checkpoint is never
/// moved, and the newcomer waits. MMK keeps busy instances (it shares them instead).
#[test]
fn the_baselines_repartition_a_busy_gpu_by_moving_checkpointable_jobs() {
    let (node, slot) = whole_instance_node();
    let mut trainer = job(1, JobClass::Offline, 20, 0.4, 0.3);
    trainer.placed = Some(slot);
    let newcomer = job(2, JobClass::Offline, 20, 0.4, 0.3);
    for baseline in [
        Hybrid::miso(Arc::new(AnalyticModel::default())),
        Hybrid::miger(Arc::new(AnalyticModel::default())),
    ] {
        let name = baseline.name();
        let plan = baseline.plan(&node, &[trainer.clone(), newcomer.clone()]);
        assert!(plan.moves.is_empty(), "{name}: {plan:?}");
        assert!(
            plan.queued.iter().any(|q| q.job == 2),
            "{name}: a training that cannot checkpoint keeps its GPU: {plan:?}"
        );

        let mut movable = trainer.clone();
        movable.movable = true;
        let jobs = [movable, newcomer.clone()];
        let plan = baseline.plan(&node, &jobs);
        assert_eq!(plan.moves, [1], "{name}: {plan:?}");
        assert!(plan.queued.is_empty(), "{name}: {plan:?}");
        let slots: Vec<Slot> = plan.placements.iter().map(|p| p.slot).collect();
        assert_eq!(slots.len(), 2, "{name}: {plan:?}");
        if name == "miso" {
            // A job per instance: the whole-GPU one goes.
            assert_ne!(slots[0], slots[1], "{name}: {plan:?}");
            assert!(
                plan.steps
                    .iter()
                    .any(|s| matches!(s, Step::Destroy { instance: 1, .. })),
                "{name}: {plan:?}"
            );
        }
        // Applied, the next pass moves nothing.
        let (node2, jobs2) = crate::plan::apply(&node, &jobs, &plan);
        assert!(baseline.plan(&node2, &jobs2).moves.is_empty(), "{name}");
    }
}

/// Shares climb past the model's plateaus: a checkpointable job left at 50 % restarts at
/// the share where the model has it fastest (step 4), and where more jobs wait than GPUs
/// run nothing a newcomer's share does not stop at the plateau either
/// (`HybridOptions::plateau_gain`, `Raise::Climb`).
#[test]
fn shares_climb_past_the_models_plateaus() {
    // MIG off: no larger instance for step 4b to restart the job in.
    let mut g = gpu("h100-80gb", 0);
    g.mig_enabled = false;
    let one = NodeState::new(vec![g.clone()]);
    let whole = Slot {
        gpu: 0,
        start: 0,
        profile_id: None,
    };
    let mmk = Hybrid::mmk(Arc::new(Plateau));
    let share_of = |plan: &Plan, id: u64| {
        plan.placements
            .iter()
            .find(|p| p.job == id)
            .map(|p| p.mps_share)
    };
    // Left at 50 %, on the plateau: one step more adds nothing, three add 0.3.
    let mut trainer = job(1, JobClass::Offline, 30, 0.9, 0.3);
    trainer.placed = Some(whole);
    trainer.mps_share = 50;
    trainer.movable = true;
    let plan = mmk.plan(&one, std::slice::from_ref(&trainer));
    assert_eq!(plan.moves, [1], "{plan:?}");
    assert_eq!(share_of(&plan, 1), Some(100));
    // Without the climb (MMK's other options), it stays on the plateau.
    let flat = Hybrid::new(
        "flat",
        Arc::new(Plateau),
        HybridOptions {
            plateau_gain: None,
            ..mmk.options
        },
    );
    let plan = flat.plan(&one, std::slice::from_ref(&trainer));
    assert!(plan.moves.is_empty(), "{plan:?}");
    // A climb that adds less than `plateau_gain` a step is not made.
    let steep = Hybrid::new(
        "steep",
        Arc::new(Plateau),
        HybridOptions {
            plateau_gain: Some(0.2),
            ..mmk.options
        },
    );
    assert!(
        steep
            .plan(&one, std::slice::from_ref(&trainer))
            .moves
            .is_empty()
    );

    // Placing: one GPU and two jobs waiting for it. The newcomer climbs past the
    // plateau; with a GPU for each waiting job it stops on it, as MIGER's does (both
    // checkpointable: no share that lasts sets their least).
    let mut newcomer = job(1, JobClass::Offline, 30, 0.9, 0.3);
    newcomer.movable = true;
    let mut other = job(2, JobClass::Offline, 50, 0.9, 0.3);
    other.movable = true;
    let plan = mmk.plan(&one, &[newcomer.clone(), other.clone()]);
    assert_eq!(share_of(&plan, 1), Some(100), "{plan:?}");
    let two = NodeState::new(vec![g.clone(), GpuState { index: 1, ..g }]);
    let plan = mmk.plan(&two, &[newcomer.clone(), other.clone()]);
    assert_eq!(share_of(&plan, 1), Some(50), "{plan:?}");
    let miger = Hybrid::miger(Arc::new(Plateau));
    assert_eq!(share_of(&miger.plan(&one, &[newcomer, other]), 1), Some(50));
}

/// A job that cannot checkpoint keeps its share for life (`HybridOptions::lasting_share`):
/// it does not take the 10 % of offline share left beside a service and a training, where a
/// checkpointable one, which can grow later, does; beside offline work alone it still joins
/// past the shares rather than wait, with a share that serves it once it runs alone.
#[test]
fn a_job_that_cannot_checkpoint_starts_with_a_share_that_lasts() {
    let (node, whole) = whole_instance_node();
    let mut serving = job(1, JobClass::Online, 4, 0.25, 0.35);
    serving.placed = Some(whole);
    serving.mps_share = 100;
    let mut trainer = job(2, JobClass::Offline, 20, 0.5, 0.3);
    trainer.placed = Some(whole);
    trainer.mps_share = 90;
    let newcomer = job(3, JobClass::Offline, 20, 0.85, 0.45);
    let share_of = |plan: &Plan| {
        plan.placements
            .iter()
            .find(|p| p.job == 3)
            .map(|p| p.mps_share)
    };

    let plan = mmk().plan(&node, &[serving.clone(), trainer.clone(), newcomer.clone()]);
    assert_eq!(share_of(&plan), None, "{plan:?}");
    assert_eq!(plan.queued.iter().map(|q| q.job).collect::<Vec<_>>(), [3]);

    let mut movable = newcomer.clone();
    movable.movable = true;
    let plan = mmk().plan(&node, &[serving, trainer.clone(), movable]);
    assert_eq!(share_of(&plan), Some(10), "{plan:?}");

    // Beside the training alone, past the shares, at least `LASTING` of its speed alone
    // there.
    let plan = mmk().plan(&node, &[trainer, newcomer.clone()]);
    let share = share_of(&plan).expect("placed");
    let model = AnalyticModel::default();
    let shape = shape_of(&node.gpus[0], Some(0)).0;
    let alone = |s: u8| model.estimate(&newcomer.profile, &shape, s, &[]);
    assert!(
        alone(share) >= LASTING * alone(100) - 1e-9,
        "{share}: {plan:?}"
    );
    assert!(share > 10, "{plan:?}");
}

/// Step 0 (`HybridOptions::reserve_after`): an offline job that has waited past the limit
/// and fits nowhere gets a GPU held for it (the one whose jobs hold the least memory): a
/// service that arrives goes to the other GPU, and the waiting job is told why. Below the
/// limit, or on a node of one GPU, nothing is held.
#[test]
fn a_gpu_is_held_for_an_offline_job_that_has_waited_long() {
    let node = NodeState::new(vec![whole_instance_gpu(0, 1), whole_instance_gpu(1, 2)]);
    let on = |gpu: u32| Slot {
        gpu,
        start: 0,
        profile_id: Some(0),
    };
    let mut a = job(1, JobClass::Offline, 50, 0.5, 0.3);
    a.placed = Some(on(0));
    a.mps_share = 100;
    let mut b = job(2, JobClass::Offline, 55, 0.5, 0.3);
    b.placed = Some(on(1));
    b.mps_share = 100;
    let mut aged = job(3, JobClass::Offline, 40, 0.5, 0.3);
    aged.age_s = RESERVE_AFTER + 60.0;
    let service = job(4, JobClass::Online, 10, 0.25, 0.35);
    let jobs = [a.clone(), b.clone(), aged.clone(), service.clone()];

    let plan = mmk().plan(&node, &jobs);
    let placed =
        |plan: &Plan, id: u64| plan.placements.iter().find(|p| p.job == id).map(|p| p.slot);
    // GPU 0's job holds 50 GiB, GPU 1's 55: GPU 0 is held, the service goes to GPU 1.
    assert_eq!(placed(&plan, 4), Some(on(1)), "{plan:?}");
    let why = &plan
        .queued
        .iter()
        .find(|q| q.job == 3)
        .expect("job 3 waits")
        .reason;
    assert!(
        why.ends_with(
            "gpu 0 is held for offline job 3, submitted 3.0 h ago, until its memory is free there"
        ),
        "{why}"
    );

    // Younger, nothing is held: the service may go anywhere, and the reason says nothing of it.
    let mut young = aged.clone();
    young.age_s = RESERVE_AFTER - 60.0;
    let plan = mmk().plan(&node, &[a.clone(), b.clone(), young, service.clone()]);
    assert!(placed(&plan, 4).is_some());
    assert!(
        plan.queued.iter().all(|q| !q.reason.contains("is held")),
        "{plan:?}"
    );

    // On a node of one GPU the service is never kept out.
    let one = NodeState::new(vec![whole_instance_gpu(0, 1)]);
    let plan = mmk().plan(&one, &[a, aged, service]);
    assert_eq!(placed(&plan, 4), Some(on(0)), "{plan:?}");
}

/// Step 0 with several jobs past the limit: one GPU held while services are served
/// promptly; while a service has waited past the limit too, oldest first, each job that
/// fits nowhere gets a GPU held (after the first, only one that fits in half a GPU), one
/// GPU is never held, and a job that no GPU may be held for keeps younger ones from
/// getting one.
#[test]
fn gpus_are_held_oldest_first_and_one_is_never_held() {
    let gpus: Vec<GpuState> = (0..4).map(|i| whole_instance_gpu(i, i + 1)).collect();
    let node = NodeState::new(gpus);
    let on = |gpu: u32| Slot {
        gpu,
        start: 0,
        profile_id: Some(0),
    };
    // Running trainings of 50, 55, 60 and 65 GiB, one per GPU.
    let jobs: Vec<JobDemand> = (0..4)
        .map(|i| {
            let mut j = job(
                u64::from(i) + 1,
                JobClass::Offline,
                50 + 5 * u64::from(i),
                0.5,
                0.3,
            );
            j.placed = Some(on(i));
            j.mps_share = 100;
            j
        })
        .collect();
    // Four aged jobs that fit beside none of them, oldest first: ids 10 to 13.
    let aged = |id: u64, gib: u64, hours: f64| {
        let mut j = job(id, JobClass::Offline, gib, 0.5, 0.3);
        j.age_s = RESERVE_AFTER + hours * 3600.0;
        j
    };
    let service = job(20, JobClass::Online, 10, 0.25, 0.35);
    // A service of 70 GiB that has waited past the limit too (it fits nowhere either).
    let mut long_waiting = job(21, JobClass::Online, 70, 0.25, 0.35);
    long_waiting.age_s = RESERVE_AFTER + 60.0;
    let placed =
        |plan: &Plan, id: u64| plan.placements.iter().find(|p| p.job == id).map(|p| p.slot);
    let held = |plan: &Plan| -> Vec<String> {
        let why = &plan
            .queued
            .iter()
            .find(|q| q.job == 10)
            .expect("job 10 waits")
            .reason;
        why.split("; ")
            .filter(|s| s.contains("is held for"))
            .map(|s| {
                s.split(", submitted")
                    .next()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect()
    };

    let mut all = jobs.clone();
    all.extend([
        aged(10, 40, 3.0),
        aged(11, 35, 2.0),
        aged(12, 32, 1.0),
        aged(13, 31, 0.5),
        service.clone(),
    ]);
    // Services served promptly: one GPU held, for the oldest.
    let plan = mmk().plan(&node, &all);
    assert_eq!(
        held(&plan),
        ["gpu 0 is held for offline job 10"],
        "{plan:?}"
    );
    all.push(long_waiting.clone());
    let plan = mmk().plan(&node, &all);
    assert_eq!(
        held(&plan),
        [
            "gpu 0 is held for offline job 10",
            "gpu 1 is held for offline job 11",
            "gpu 2 is held for offline job 12",
        ],
        "{plan:?}"
    );
    // The fourth waits unheld: the last GPU stays open, and the service runs there.
    assert_eq!(placed(&plan, 20), Some(on(3)), "{plan:?}");
    assert_eq!(placed(&plan, 13), None, "{plan:?}");

    // A second job of more than half a GPU gets none held, nor do those younger than it;
    // so for a size no GPU holds (a hostile one, too large to double).
    let mut huge = aged(11, 1, 2.0);
    huge.memory_mib = u64::MAX;
    for second in [aged(11, 45, 2.0), huge] {
        let mut all = jobs.clone();
        all.extend([
            aged(10, 40, 3.0),
            second,
            aged(12, 32, 1.0),
            service.clone(),
            long_waiting.clone(),
        ]);
        let plan = mmk().plan(&node, &all);
        assert_eq!(
            held(&plan),
            ["gpu 0 is held for offline job 10"],
            "{plan:?}"
        );
        assert!(placed(&plan, 20).is_some_and(|s| s.gpu != 0), "{plan:?}");
    }
}

/// Step 0's shortcut tries a job of a kind that stayed waiting alone again when an SLO
/// refused the one before: the GPU held for that one may be where the SLO was, and then
/// the next job waits for another reason. The plan, reasons included, is the plan of a
/// planner without the shortcuts.
#[test]
fn a_job_like_one_an_slo_refused_tries_alone_again() {
    let gpus: Vec<GpuState> = (0..4).map(|i| whole_instance_gpu(i, i + 1)).collect();
    let node = NodeState::new(gpus);
    let on = |gpu: u32| Slot {
        gpu,
        start: 0,
        profile_id: Some(0),
    };
    // GPU 0 runs a small service with a tight SLO at half the GPU; GPUs 1-3 a training of
    // 60 GiB each.
    let mut service = job(1, JobClass::Online, 10, 0.3, 0.2);
    service.profile.solo_latency_ms = Some(3.8);
    service.slo_ms = Some(4);
    service.placed = Some(on(0));
    service.mps_share = 50;
    let mut jobs = vec![service];
    for gpu in 1..4 {
        let mut t = job(u64::from(gpu) + 1, JobClass::Offline, 60, 0.5, 0.3);
        t.placed = Some(on(gpu));
        t.mps_share = 100;
        jobs.push(t);
    }
    // Two trainings of one kind past the limit, which fit only beside the service; a
    // service of 75 GiB past the limit too, which fits nowhere.
    for (id, hours) in [(10, 2.0), (11, 1.0)] {
        let mut j = job(id, JobClass::Offline, 30, 0.9, 0.3);
        j.age_s = RESERVE_AFTER + hours * 3600.0;
        jobs.push(j);
    }
    let mut long_waiting = job(20, JobClass::Online, 75, 0.25, 0.35);
    long_waiting.age_s = RESERVE_AFTER + 60.0;
    jobs.push(long_waiting);

    let plan = mmk().plan(&node, &jobs);
    let reason = |id: u64| {
        plan.queued
            .iter()
            .find(|q| q.job == id)
            .map(|q| q.reason.to_string())
            .unwrap_or_default()
    };
    let slo = "it would break the predicted SLO of an online job there";
    assert!(reason(10).contains(slo), "{plan:?}");
    assert!(
        reason(10).contains("gpu 0 is held for offline job 10"),
        "{plan:?}"
    );
    assert!(!reason(11).contains(slo), "{plan:?}");
    assert!(
        reason(11).contains("is held for offline job 11"),
        "{plan:?}"
    );
    assert_eq!(plan, mmk().forgetful().plan(&node, &jobs));
}

/// Passes may run at once on one planner (mmkd's reconciler, dry runs, capacity views):
/// once another pass has started the numbered maps over, a pass that numbered its kinds
/// before neither reads nor writes the numbered answers, whose numbers now mean other
/// states.
#[test]
fn numbered_answers_of_an_older_generation_are_neither_read_nor_written() {
    let refused: mps_config::Config = Err(mps_config::Refusal::Room);
    let mut memo = Memo::default();
    memo.remember_answer(0, (1, 2, 3), (refused, None));
    assert!(memo.answer(0, &(1, 2, 3)).is_some());
    memo.generation += 1;
    assert!(memo.answer(0, &(1, 2, 3)).is_none());
    memo.remember_answer(0, (4, 5, 6), (refused, None));
    assert!(!memo.answers.contains_key(&(4, 5, 6)));

    let planner = Hybrid::mmk(Arc::new(AnalyticModel::default()));
    let asked = std::cell::Cell::new(0);
    let ask = || {
        asked.set(asked.get() + 1);
        Ok((30, 1.0, 0.5))
    };
    assert_eq!(
        planner.config_by_number(0, (1, 1, 0), ask),
        Ok((30, 1.0, 0.5))
    );
    assert_eq!(
        planner.config_by_number(0, (1, 1, 0), ask),
        Ok((30, 1.0, 0.5))
    );
    assert_eq!(asked.get(), 1, "remembered within its generation");
    planner.memo().generation += 1;
    planner.config_by_number(0, (1, 1, 0), ask).ok();
    planner.config_by_number(0, (1, 1, 0), ask).ok();
    assert_eq!(
        asked.get(),
        3,
        "asked again, and not remembered, for an older generation"
    );
}

/// The layout search remembers GPU states where no layout places any of the kinds of job waiting
/// (`best_layout_for`): a later pass over a GPU in such a state plans as a new planner
/// does, SLO marks included, and a GPU whose jobs have the same profiles but hold less
/// memory is asked again. MIGER places jobs through the layout search alone.
#[test]
fn a_gpu_state_that_placed_nothing_is_not_asked_again() {
    use crate::plan::apply;
    let model: Arc<dyn PerfModel> = Arc::new(AnalyticModel::default());
    let warm = Hybrid::miger(Arc::clone(&model));
    let fresh = || Hybrid::miger(Arc::clone(&model));
    let empty = NodeState::new(vec![GpuState {
        mig_enabled: false,
        ..gpu("a100-80gb", 0)
    }]);
    // A training that cannot move, holding `gib` of the GPU at 90 %.
    let running = |gib: u64| {
        let mut t = job(1, JobClass::Offline, gib, 0.6, 0.5);
        t.movable = false;
        let plan = fresh().plan(&empty, std::slice::from_ref(&t));
        let (node, mut jobs) = apply(&empty, &[t], &plan);
        jobs[0].mps_share = 90;
        (node, jobs)
    };
    let service = |id: u64| {
        let mut s = job(id, JobClass::Online, 5, 0.3, 0.2);
        s.profile.solo_latency_ms = Some(4.0);
        s.slo_ms = Some(4);
        s
    };
    let plan_both = |(node, mut jobs): (NodeState, Vec<JobDemand>), waiting: &[JobDemand]| {
        jobs.extend_from_slice(waiting);
        let plan = warm.plan(&node, &jobs);
        assert_eq!(plan, fresh().plan(&node, &jobs));
        plan
    };

    // 70 GiB held: a 20 GiB job does not fit, and the service's SLO cannot hold at 10 %.
    LAYOUTS_SKIPPED.set(0);
    let waiting = [job(2, JobClass::Offline, 20, 0.3, 0.3), service(3)];
    let plan = plan_both(running(70), &waiting);
    assert_eq!(plan.queued.len(), 2, "{:?}", plan.queued);
    assert_eq!(LAYOUTS_SKIPPED.get(), 0);
    // The same state again, other jobs of the same kinds: not asked, the same reasons.
    let waiting = [job(4, JobClass::Offline, 20, 0.3, 0.3), service(5)];
    let plan = plan_both(running(70), &waiting);
    assert_eq!(LAYOUTS_SKIPPED.get(), 1);
    let reasons: Vec<&str> = plan.queued.iter().map(|q| &*q.reason).collect();
    assert!(reasons[1].contains("SLO of 4ms"), "{reasons:?}");
    // The same profiles holding 20 GiB: asked again, and the 20 GiB job starts.
    let waiting = [job(6, JobClass::Offline, 20, 0.3, 0.3)];
    let plan = plan_both(running(20), &waiting);
    assert!(plan.placements.iter().any(|p| p.job == 6), "{plan:?}");
}

/// MPS-first's verdict lists stay within their room: a list that would grow past it is not
/// grown, nothing more is remembered in the pass, and the numbered maps start over before
/// the next one.
#[test]
fn the_verdict_lists_stay_within_their_room() {
    use super::memo::{Memo, VERDICTS_MAX};
    use super::mps_first::Verdict;
    let mut memo = Memo::default();
    let g = memo.generation;
    let room = |m: &Memo| m.verdicts.values().map(Vec::capacity).sum::<usize>();
    memo.remember_verdicts(g, (0, 0), &[(9, Verdict::default())]);
    assert_eq!(memo.verdicts[&(0, 0)].len(), 10);
    assert_eq!(memo.verdict_slots, room(&memo));
    // A state numbered past the room: not remembered, and the lists are full.
    memo.remember_verdicts(g, (1, 0), &[(VERDICTS_MAX as u32, Verdict::default())]);
    assert!(memo.verdicts.get(&(1, 0)).is_none_or(Vec::is_empty));
    assert!(room(&memo) <= VERDICTS_MAX);
    memo.remember_verdicts(g, (0, 0), &[(20, Verdict::default())]);
    assert_eq!(memo.verdicts[&(0, 0)].len(), 10, "nothing more this pass");
    memo.between_passes();
    assert_eq!(memo.generation, g + 1);
    assert!(memo.verdicts.is_empty());
    assert_eq!(memo.verdict_slots, 0);
}
