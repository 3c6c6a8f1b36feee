//! Why a job waits: the reason each waiting job of a plan is given, naming the jobs in its
//! way.

use mmk_core::JobClass;
use mmk_core::units::format_mib;

use crate::plan::JobDemand;

use super::SHARE_STEP;
use super::partition::{GpuPlan, Part};

/// Why waiting job `j` waits. `largest`: the largest partition the node can make;
/// `slo_blocked`: a partition refused it only for its SLO.
pub(super) fn waiting_reason(
    jobs: &[JobDemand],
    crowd: &Crowd,
    largest: u64,
    slo_blocked: bool,
    j: usize,
) -> String {
    let job = &jobs[j];
    if job.memory_mib > largest {
        format!(
            "needs {} of GPU memory; the largest partition this node can make has {}",
            format_mib(job.memory_mib),
            format_mib(largest)
        )
    } else if slo_blocked {
        match job.slo_ms {
            Some(ms) => format!("waiting: no partition can meet its SLO of {ms}ms now"),
            // An offline job refused only because it would break an online job's SLO.
            None => "waiting: where its memory fits, it would break the predicted SLO of an \
                     online job there"
                .to_owned(),
        }
    } else if let Some(why) = in_the_way(jobs, crowd, j) {
        format!(
            "waiting for {} of GPU memory: {why}",
            format_mib(job.memory_mib)
        )
    } else {
        format!(
            "waiting for {} of GPU memory and an SM share: no partition has room, and no layout that keeps the busy partitions holds it",
            format_mib(job.memory_mib)
        )
    }
}

/// At most this many jobs are named in a waiting job's reason; the rest are counted.
const NAMED_IN_REASON: usize = 8;

/// Job IDs for a reason: `1, 2, 3`, or `1, 2, ..., 8 and 5 more`.
fn name_jobs(jobs: &[JobDemand], it: &mut dyn Iterator<Item = usize>) -> String {
    let mut named: Vec<String> = Vec::new();
    let mut more = 0usize;
    for i in it {
        if named.len() < NAMED_IN_REASON {
            named.push(jobs[i].id.to_string());
        } else {
            more += 1;
        }
    }
    let mut out = named.join(", ");
    if more > 0 {
        out.push_str(&format!(" and {more} more"));
    }
    out
}

/// The busy partitions of a plan with their free memory, and its offline jobs: what
/// [`in_the_way`] looks through for each waiting job, gathered once.
pub(super) struct Crowd<'a> {
    busy: Vec<(&'a Part, u64)>,
    /// The offline jobs, named (`name_jobs`); `None` if there are none.
    offline: Option<String>,
    /// The planner's `crowd_max`.
    max: Option<usize>,
    /// Whether online jobs join online ones past the shares while the queue is short
    /// (`HybridOptions::online_past_shares`).
    online_past: bool,
}

impl<'a> Crowd<'a> {
    pub(super) fn of(
        jobs: &[JobDemand],
        plans: &'a [GpuPlan],
        max: Option<usize>,
        online_past: bool,
    ) -> Crowd<'a> {
        let parts = || plans.iter().flat_map(|gp| &gp.parts);
        Crowd {
            busy: parts()
                .filter(|p| !p.members.is_empty())
                .map(|p| (p, p.free_mib(jobs)))
                .collect(),
            offline: {
                let mut offline = parts()
                    .flat_map(|p| p.members.iter())
                    .filter(|m| jobs[m.job].class == JobClass::Offline)
                    .map(|m| m.job)
                    .peekable();
                offline
                    .peek()
                    .is_some()
                    .then(|| name_jobs(jobs, &mut offline))
            },
            max,
            online_past,
        }
    }
}

/// The jobs that keep waiting job `j` out, named, where a partition's memory would hold it:
/// a job that has its partition to itself, the online jobs beside which the shares are
/// spent, or for an offline job the jobs of partitions that run `crowd_max` jobs; for an
/// online job that no partition's memory holds, the offline jobs that hold the memory.
/// `None` when no job is in its way.
fn in_the_way(jobs: &[JobDemand], crowd: &Crowd, j: usize) -> Option<String> {
    let ids = |it: &mut dyn Iterator<Item = usize>| name_jobs(jobs, it);
    let fits: Vec<&Part> = crowd
        .busy
        .iter()
        .filter(|(_, free)| *free >= jobs[j].memory_mib)
        .map(|(p, _)| *p)
        .collect();
    if jobs[j].exclusive && !fits.is_empty() {
        let mut all = fits.iter().flat_map(|p| p.members.iter().map(|m| m.job));
        return Some(format!(
            "it asks for a partition of its own, and the partitions with room run jobs {}",
            ids(&mut all)
        ));
    }
    let mut others = fits
        .iter()
        .flat_map(|p| {
            p.members
                .iter()
                .filter(|m| jobs[m.job].user != jobs[j].user)
                .map(|m| m.job)
        })
        .peekable();
    if others.peek().is_some() {
        return Some(format!(
            "{} ({})",
            crate::plan::ANOTHER_USER,
            ids(&mut others)
        ));
    }
    let mut owners = fits
        .iter()
        .flat_map(|p| {
            p.members
                .iter()
                .filter(|m| jobs[m.job].exclusive)
                .map(|m| m.job)
        })
        .peekable();
    if owners.peek().is_some() {
        return Some(format!(
            "the partitions with room are held by jobs that asked for them alone: {}",
            ids(&mut owners)
        ));
    }
    let mut online = fits
        .iter()
        .filter(|p| p.share_left() < SHARE_STEP)
        .flat_map(|p| {
            p.members
                .iter()
                .filter(|m| jobs[m.job].class == JobClass::Online)
                .map(|m| m.job)
        })
        .peekable();
    if online.peek().is_some() {
        let past = if crowd.online_past && jobs[j].class == JobClass::Online {
            "an online job passes only while no more jobs wait than the node has GPUs"
        } else {
            "are not oversubscribed"
        };
        return Some(format!(
            "the MPS shares of the partitions with room are spent, and online jobs run there \
             ({}), whose shares {past}",
            ids(&mut online)
        ));
    }
    if jobs[j].class == JobClass::Offline
        && let Some(max) = crowd.max
    {
        let mut crowded = fits
            .iter()
            .filter(|p| p.members.len() >= max)
            .flat_map(|p| p.members.iter().map(|m| m.job))
            .peekable();
        if crowded.peek().is_some() {
            return Some(format!(
                "the partitions with room run {max} jobs or more, the most that an offline job \
                 joins when it would otherwise wait: {}",
                ids(&mut crowded)
            ));
        }
    }
    if fits.is_empty()
        && jobs[j].class == JobClass::Online
        && let Some(offline) = &crowd.offline
    {
        return Some(format!(
            "no partition has that much free; offline jobs hold the memory: {offline}"
        ));
    }
    None
}
