//! The path every intercepted launch takes: identify it, let the gate admit it (offline
//! launches may wait there), launch it, and hand its completion to the tracker.
//!
//! The outermost hook does the work: a runtime launch that reaches the driver through a
//! hooked `cuLaunchKernel` is counted and gated once, by the runtime hook.
//!
//! A launch into a stream under capture (a CUDA graph being recorded, as PyTorch's
//! `torch.cuda.graph` and serving engines do) runs nothing now: it passes straight through,
//! neither gated nor tracked, and is counted as captured. Its work runs inside a later
//! graph launch, which is gated and tracked as one unit. An event recorded behind it could
//! never be queried (that would invalidate the capture).

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::Ordering;

use mmk_kernel_sched::profile::Expect;
use mmk_kernel_sched::trace::TraceRecord;
use mmk_kernel_sched::{Charge, Class, Launch, sm_demand};

use crate::cuda::*;
use crate::kernel::{self, Target};
use crate::process::{self, Process};
use crate::stats::{Api, now_ns};
use crate::track::{Pending, Tracker};

thread_local! {
    /// Hooks of this thread under way; only the outermost one acts.
    static DEPTH: Cell<u32> = const { Cell::new(0) };
}

/// A launch's grid, block, dynamic shared memory and stream.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem: u32,
    pub stream: CUstream,
}

impl Shape {
    pub fn new(grid: Dim3, block: Dim3, shared_mem: usize, stream: CUstream) -> Shape {
        Shape {
            grid: [grid.x, grid.y, grid.z],
            block: [block.x, block.y, block.z],
            shared_mem: u32::try_from(shared_mem).unwrap_or(u32::MAX),
            stream,
        }
    }

    /// A graph launch: one unit, no grid of its own.
    pub fn graph(stream: CUstream) -> Shape {
        Shape {
            grid: [1, 1, 1],
            block: [1, 1, 1],
            shared_mem: 0,
            stream,
        }
    }
}

/// What `before` decided, for `after`.
struct Ticket {
    /// Tracked to completion (else only counted).
    track: bool,
    charge: Charge,
    held_ns: u64,
    ctx: CUcontext,
    record: Option<(CUevent, Box<TraceRecord>)>,
}

struct DepthGuard;

impl DepthGuard {
    fn enter() -> DepthGuard {
        DEPTH.set(DEPTH.get() + 1);
        DepthGuard
    }
}

impl Drop for DepthGuard {
    fn drop(&mut self) {
        DEPTH.set(DEPTH.get().saturating_sub(1));
    }
}

/// Run one intercepted launch. `call` makes the real launch, exactly once, whatever else
/// fails: the interposer never stands between a job and its kernel.
pub fn run(api: Api, target: Target, shape: Shape, call: impl FnOnce() -> CUresult) -> CUresult {
    if DEPTH.get() > 0 {
        return call();
    }
    let Some(p) = process::get() else {
        return call();
    };
    let _depth = DepthGuard::enter();
    let t0 = if p.timing { now_ns() } else { 0 };
    if crate::real::driver().is_some_and(|d| d.capturing(shape.stream)) {
        let rc = call();
        if rc == CUDA_SUCCESS {
            p.stats.captured.fetch_add(1, Ordering::Relaxed);
        } else {
            p.stats.failed.fetch_add(1, Ordering::Relaxed);
        }
        return rc;
    }
    let ticket = std::panic::catch_unwind(AssertUnwindSafe(|| before(p, api, target, &shape)))
        .ok()
        .flatten();
    let t1 = if p.timing { now_ns() } else { 0 };
    let rc = call();
    let t2 = if p.timing { now_ns() } else { 0 };
    let held_ns = ticket.as_ref().map_or(0, |t| t.held_ns);
    if let Some(ticket) = ticket {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| after(p, api, &shape, ticket, rc)));
    }
    if p.timing {
        let own = (t1 - t0).saturating_sub(held_ns) + (now_ns() - t2);
        p.stats.hook_time(own);
    }
    rc
}

fn before(p: &'static Process, api: Api, target: Target, shape: &Shape) -> Option<Ticket> {
    let threads = shape.block.iter().map(|&b| u64::from(b)).product::<u64>();
    let blocks = shape.grid.iter().map(|&g| u64::from(g)).product::<u64>();
    let sm_count = p.sm_count();
    let info = kernel::identify(
        target,
        u32::try_from(threads).unwrap_or(u32::MAX),
        shape.shared_mem,
    );
    let sm = if api.is_graph() {
        sm_count
    } else {
        sm_demand(blocks, info.blocks_per_sm, sm_count)
    };
    // mmkd may ask a process whose completions nothing waits on to stop tracking (a job
    // whose profile it has learned, in a gate that holds nothing): its launches are
    // counted only. An offline process honours that only while its gate's policy holds
    // no offline launch (`GateConfig::waits_on_online`), read at each launch: a gate
    // whose settings change never lets untracked offline work pass it.
    let track = p.track
        && !p.gate.as_ref().is_some_and(|(gate, slot)| {
            gate.untracked(*slot) && (p.class != Class::Offline || !gate.waits_on_online())
        });
    let expect = match &p.profile {
        Some(profile) if track => kernel::expect(
            profile,
            &info.name,
            shape.grid,
            shape.block,
            shape.shared_mem,
        ),
        _ => Expect::default(),
    };
    // What the kernel asks for, whatever the partition has: mmkd learns the job's demand
    // from it.
    let ask = if api.is_graph() {
        sm_count
    } else {
        u32::try_from(
            blocks
                .div_ceil(u64::from(info.blocks_per_sm.max(1)))
                .min(65_535),
        )
        .unwrap_or(65_535)
    };
    let charge = Charge {
        sm,
        ask,
        expected_ns: expect.duration_ns.unwrap_or(0),
        intensity: expect.intensity,
        gap_after_ns: expect.gap_after_ns,
    };
    let mut held_ns = 0;
    if let Some((gate, slot)) = &p.gate {
        if track && p.class == Class::Offline {
            let launch = Launch {
                class: p.class,
                sm_demand: sm,
                mps_fraction: p.mps_fraction,
                expect,
            };
            // `begin` under the same lock: two threads of this process cannot both see
            // room for one more kernel and both take it.
            let outcome = {
                let mut guard = p.policy.lock().unwrap_or_else(|e| e.into_inner());
                let (policy, budget, built) = &mut *guard;
                // mmkd changed the gate's settings (its SLO control raised or lowered the
                // partition's isolation): the policy follows them from this launch on.
                let generation = gate.generation();
                if *built != generation {
                    let config = gate.config();
                    *policy = config.policy.build(&config.policy_params());
                    *built = generation;
                }
                let outcome = gate.admit(*slot, &mut **policy, budget, &launch);
                gate.begin(*slot, &charge);
                outcome
            };
            held_ns = u64::try_from(outcome.waited.as_nanos()).unwrap_or(u64::MAX);
            if held_ns > 0 || outcome.forced {
                p.stats.held.fetch_add(1, Ordering::Relaxed);
                p.stats.held_ns.fetch_add(held_ns, Ordering::Relaxed);
            }
            if outcome.forced {
                p.stats.forced.fetch_add(1, Ordering::Relaxed);
            }
        }
        if !track {
            gate.count(*slot);
        } else if p.class != Class::Offline {
            gate.begin(*slot, &charge);
        } else if gate.device_wait()
            && crate::device::due(
                shape.stream,
                expect.duration_ns,
                gate.device_wait_grain_ns(),
            )
            && let Some(d) = crate::real::driver()
        {
            p.device.before_launch(p, gate, d, shape.stream);
        }
    }
    let needs_events = track || p.record.is_some();
    let d = crate::real::driver();
    let ctx = match d {
        Some(d) if needs_events => Tracker::current_ctx(d),
        _ => std::ptr::null_mut(),
    };
    let record = match (d, &p.record) {
        (Some(d), Some(_)) => {
            p.tracker.ensure_reference(d, ctx, shape.stream);
            let launch_ns = now_ns();
            p.tracker.record(d, ctx, shape.stream, true).map(|start| {
                let line = TraceRecord {
                    seq: p.seq.fetch_add(1, Ordering::Relaxed),
                    pid: p.pid,
                    class: p.class,
                    api: api.name().to_owned(),
                    kernel: info.name.to_string(),
                    grid: shape.grid,
                    block: shape.block,
                    shared_mem: shape.shared_mem,
                    blocks_per_sm: info.blocks_per_sm,
                    sm_demand: sm,
                    stream: shape.stream as u64,
                    launch_ns,
                    held_ns,
                    start_ns: None,
                    end_ns: None,
                };
                (start, Box::new(line))
            })
        }
        _ => None,
    };
    Some(Ticket {
        track,
        charge,
        held_ns,
        ctx,
        record,
    })
}

fn after(p: &'static Process, api: Api, shape: &Shape, ticket: Ticket, rc: CUresult) {
    let gate = if ticket.track {
        p.gate.as_ref().map(|(_, slot)| (*slot, ticket.charge))
    } else {
        None
    };
    let d = crate::real::driver();
    if rc != CUDA_SUCCESS {
        p.stats.failed.fetch_add(1, Ordering::Relaxed);
        p.end_in_gate(gate);
        if let Some((start, _)) = ticket.record {
            p.tracker.give_back(ticket.ctx, start, true);
        }
        return;
    }
    p.stats.launched(api);
    if gate.is_none() && ticket.record.is_none() {
        return;
    }
    if ticket.record.is_none() {
        // Tracked for the gate alone: an event, or the next one on the stream, covers it.
        if let (Some(d), Some((slot, charge))) = (d, gate)
            && p.tracker
                .track(p, d, ticket.ctx, shape.stream, slot, charge)
        {
            return;
        }
        p.stats.untracked.fetch_add(1, Ordering::Relaxed);
        p.end_in_gate(gate);
        return;
    }
    let done = d.and_then(|d| p.tracker.record(d, ticket.ctx, shape.stream, true));
    match done {
        Some(done) => p.tracker.push(
            p,
            Pending {
                done,
                ctx: ticket.ctx,
                stream: shape.stream,
                gate: gate.map(|(slot, charge)| (slot, charge, Vec::new())),
                record: ticket.record,
            },
        ),
        None => {
            // No event: nobody can see it complete, so it no longer counts as in flight.
            p.stats.untracked.fetch_add(1, Ordering::Relaxed);
            p.end_in_gate(gate);
            if let Some((start, line)) = ticket.record {
                p.tracker.give_back(ticket.ctx, start, true);
                if let Some(r) = &p.record {
                    r.write(&line);
                }
            }
        }
    }
}
