//! Completion tracking without blocking the caller: events are recorded behind tracked
//! launches, and one poller thread per process records and queries them, tells the gate
//! what completed and writes record-mode trace lines.
//!
//! A tracked launch costs its thread no driver call but reading its current context (a
//! thread-local read in the driver): it is queued for its stream's tail, the launches that
//! no event covers yet, under a lock that the poller never holds across a driver call (a
//! launch that waited for the poller's event records and capture queries cost an eager
//! service its tail). On each pass the poller records an event behind the
//! tail of every stream that has no event outstanding. Work on one stream completes in
//! order, so that event covers the whole tail: when it completes, every launch in it counts
//! as complete. A stream being captured gets no event; its tail counts as complete at once
//! (`early` in the stats). A stream that is destroyed or starts a capture first gets an
//! event behind its tail on the caller's thread. While launches keep coming the poller
//! does not wait on its condition variable, so that a launch need not wake it. A launch
//! on a thread's per-thread default stream gets an event of its own, recorded by that
//! thread: the poller cannot name another thread's per-thread stream, and an event on the
//! legacy stream in its place would hold back every blocking stream.
//!
//! With `MMK_KSCHED_EVENTS=launch` (for measuring what it costs) each launch gets an event
//! of its own, recorded by the launching thread. Record mode keeps an event pair per
//! launch, for its per-kernel times.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mmk_kernel_sched::trace::TraceRecord;
use mmk_kernel_sched::{Charge, SlotId};

use crate::cuda::*;
use crate::process::Process;
use crate::real::Driver;
use crate::stats::now_ns;

/// The poller's shortest and longest sleep while events are pending. It backs off while
/// nothing completes and starts again from the shortest after a completion.
const POLL_MIN: Duration = Duration::from_micros(10);
const POLL_MAX: Duration = Duration::from_micros(100);

/// How long the poller keeps passing at [`POLL_MAX`] with nothing to track before it waits
/// to be woken: a service's next request usually comes sooner, and then its launches need
/// not wake the poller.
const LINGER_NS: u64 = 50_000_000;

/// The poller's shortest and longest sleep: [`POLL_MIN`] and [`POLL_MAX`], or the
/// shortest from `MMK_KSCHED_POLL_US` (for measuring what polling costs).
fn poll_interval() -> (Duration, Duration) {
    let shortest = std::env::var(mmk_kernel_sched::env::POLL_US)
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&us| (1..=10_000).contains(&us))
        .map_or(POLL_MIN, Duration::from_micros);
    (shortest, POLL_MAX.max(shortest))
}

/// `MMK_KSCHED_EVENTS=launch`: each tracked launch gets an event of its own, recorded by
/// the launching thread (see the module docs).
fn events_per_launch() -> bool {
    std::env::var(mmk_kernel_sched::env::EVENTS).is_ok_and(|v| v == "launch")
}

/// Launches that no event can cover count as complete now (`early` in the stats).
fn complete_early(process: &Process, charges: Vec<Charge>) {
    process
        .stats
        .early
        .fetch_add(charges.len() as u64, Ordering::Relaxed);
    let slot = process.gate.as_ref().map(|(_, slot)| *slot);
    for charge in charges {
        process.end_in_gate(slot.map(|slot| (slot, charge)));
    }
}

/// Launches whose completion someone waits for: one event behind the last of them.
#[derive(Debug)]
pub struct Pending {
    /// Recorded behind the launches; complete once they are.
    pub done: CUevent,
    pub ctx: CUcontext,
    /// Work on one stream completes in order: once one of its events is not ready, the
    /// later ones are not queried in that pass.
    pub stream: CUstream,
    /// The gate slot, what `begin` counted for the launch the event is behind, and for
    /// the launches before it that the event covers too, to give back on completion.
    pub gate: Option<(SlotId, Charge, Vec<Charge>)>,
    /// Record mode: the event recorded before the launch, and the line to finish.
    pub record: Option<(CUevent, Box<TraceRecord>)>,
}

/// A stream's tracked launches, as the launching threads and the poller share them.
#[derive(Debug, Default)]
struct StreamTrack {
    /// Tracking events recorded on the stream and not yet seen complete.
    outstanding: u32,
    /// Launches after the newest event, which no event covers yet.
    tail: Vec<Charge>,
}

// SAFETY: the raw CUDA handles are plain ids that any thread may pass to the driver.
unsafe impl Send for Pending {}

/// A clock reference per context: an event known to have completed at `host_ns`.
#[derive(Debug, Clone, Copy)]
struct Reference {
    ctx: usize,
    event: usize,
    host_ns: u64,
}

#[derive(Debug, Default)]
pub struct Tracker {
    queue: Mutex<Vec<Pending>>,
    wake: Condvar,
    idle: AtomicBool,
    started: AtomicBool,
    /// Pushed and not completed yet, wherever they are (queue or the poller's batch).
    outstanding: AtomicUsize,
    /// Free events: (context, event, timing).
    pool: Mutex<Vec<(usize, usize, bool)>>,
    /// Per (context, stream) with tracked launches in flight. The poller holds it across
    /// driver calls (it records events behind the tails), so launches never take it.
    streams: Mutex<HashMap<(usize, usize), StreamTrack>>,
    /// Launches made since the poller last looked, per (context, stream): they join their
    /// stream's tail at its next pass ([`Tracker::absorb`]). A launch holds this lock for
    /// a push; nobody holds it across a driver call.
    incoming: Mutex<Vec<((usize, usize), Charge)>>,
    /// Launches in `incoming` and in the streams' tails, which no event covers yet.
    uncovered: AtomicUsize,
    /// [`events_per_launch`].
    per_launch: bool,
    refs: Mutex<Vec<Reference>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Tracker {
    /// A tracker that records events as `MMK_KSCHED_EVENTS` says.
    pub fn from_env() -> Tracker {
        Tracker {
            per_launch: events_per_launch(),
            ..Tracker::default()
        }
    }

    /// The current context, or null.
    pub fn current_ctx(d: &Driver) -> CUcontext {
        let mut ctx: CUcontext = std::ptr::null_mut();
        if let Some(get) = d.ctx_get_current {
            // SAFETY: the driver's cuCtxGetCurrent with a valid out pointer.
            unsafe { get(&mut ctx) };
        }
        ctx
    }

    /// An event of the current context (`timing` or not) recorded on `stream` now.
    pub fn record(
        &self,
        d: &Driver,
        ctx: CUcontext,
        stream: CUstream,
        timing: bool,
    ) -> Option<CUevent> {
        let (create, record) = (d.event_create?, d.event_record?);
        let pooled = {
            let mut pool = lock(&self.pool);
            pool.iter()
                .position(|&(c, _, t)| c == ctx as usize && t == timing)
                .map(|i| pool.swap_remove(i).1 as CUevent)
        };
        let event = match pooled {
            Some(e) => e,
            None => {
                let mut e: CUevent = std::ptr::null_mut();
                let flags = if timing {
                    CU_EVENT_DEFAULT
                } else {
                    CU_EVENT_DISABLE_TIMING
                };
                // SAFETY: the driver's cuEventCreate with a valid out pointer.
                if unsafe { create(&mut e, flags) } != CUDA_SUCCESS || e.is_null() {
                    return None;
                }
                e
            }
        };
        // SAFETY: a live event of this context and the caller's stream.
        if unsafe { record(event, stream) } != CUDA_SUCCESS {
            self.give_back(ctx, event, timing);
            return None;
        }
        Some(event)
    }

    /// Track a launch on `stream` that the gate counted as `charge` in `slot`: it joins the
    /// stream's tail for the poller to cover (or, with `MMK_KSCHED_EVENTS=launch`, gets an
    /// event of its own now). False when no event could be recorded: the caller gives the
    /// charge back at once.
    pub fn track(
        &self,
        process: &'static Process,
        d: &Driver,
        ctx: CUcontext,
        stream: CUstream,
        slot: SlotId,
        charge: Charge,
    ) -> bool {
        if self.per_launch || stream as usize == CU_STREAM_PER_THREAD {
            let Some(done) = self.record(d, ctx, stream, false) else {
                return false;
            };
            process.stats.events.fetch_add(1, Ordering::Relaxed);
            self.push(
                process,
                Pending {
                    done,
                    ctx,
                    stream,
                    gate: Some((slot, charge, Vec::new())),
                    record: None,
                },
            );
            return true;
        }
        {
            let mut incoming = lock(&self.incoming);
            incoming.push(((ctx as usize, stream as usize), charge));
            // Under the lock, so that the count never falls behind a tail someone takes.
            // SeqCst, as the poller's `idle` store and its read of this count: either it
            // sees this launch before it waits, or this side sees it waiting and wakes it.
            self.uncovered.fetch_add(1, Ordering::SeqCst);
        }
        self.run_poller(process);
        true
    }

    /// Move the launches made since the last look into their streams' tails (the caller
    /// holds the streams' lock; they stay uncovered). Drained in place, so that `incoming`
    /// keeps its capacity and a launch's push does not allocate.
    fn absorb(&self, streams: &mut HashMap<(usize, usize), StreamTrack>) {
        for (key, charge) in lock(&self.incoming).drain(..) {
            streams.entry(key).or_default().tail.push(charge);
        }
    }

    /// `st`'s tail, which the caller covers or counts as complete: no longer uncovered.
    fn take_tail(&self, st: &mut StreamTrack) -> Vec<Charge> {
        let tail = std::mem::take(&mut st.tail);
        self.uncovered.fetch_sub(tail.len(), Ordering::AcqRel);
        tail
    }

    /// An event `done` was just recorded on `stream` behind the tail `st`: it covers those
    /// launches now (it is behind the last of them). Counted in `outstanding` here, under
    /// the streams' lock, before the tail leaves `uncovered`.
    fn cover_tail(
        &self,
        process: &Process,
        st: &mut StreamTrack,
        done: CUevent,
        ctx: CUcontext,
        stream: CUstream,
    ) -> Pending {
        st.outstanding += 1;
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        process.stats.events.fetch_add(1, Ordering::Relaxed);
        let mut charges = self.take_tail(st);
        let last = charges.pop().unwrap_or_default();
        Pending {
            done,
            ctx,
            stream,
            gate: process
                .gate
                .as_ref()
                .map(|(_, slot)| (*slot, last, charges)),
            record: None,
        }
    }

    /// Record an event behind the tail of every stream that has none outstanding (from the
    /// poller, or from the exiting thread). Tails that cannot be covered (the stream is
    /// being captured, or the record failed) count as complete now. Returns the events
    /// recorded, already counted in `outstanding`, for the caller to query.
    fn cover_tails(&self, process: &Process, d: &Driver) -> Vec<Pending> {
        if self.uncovered.load(Ordering::Acquire) == 0 {
            return Vec::new();
        }
        let mut covered = Vec::new();
        let mut streams = lock(&self.streams);
        self.absorb(&mut streams);
        let mut current: CUcontext = std::ptr::null_mut();
        for (&(ctx, stream), st) in streams.iter_mut() {
            if st.outstanding > 0 || st.tail.is_empty() {
                continue;
            }
            let (ctx, stream) = (ctx as CUcontext, stream as CUstream);
            if ctx != current
                && let Some(set) = d.ctx_set_current
            {
                // SAFETY: the context the launches were made in; it is alive while they
                // are (a destroyed one fails the record below).
                unsafe { set(ctx) };
                current = ctx;
            }
            // The stream is neither destroyed nor starts a capture while the lock is held
            // (see `before_stream_change`); another stream's capture can take it in (an
            // event wait) at any time, so it is asked again after the record.
            let done = (!d.capturing(stream))
                .then(|| self.record(d, ctx, stream, false))
                .flatten();
            match done {
                Some(done) if !d.capturing(stream) => {
                    covered.push(self.cover_tail(process, st, done, ctx, stream));
                }
                // Taken into a capture between the look and the record: the event is the
                // graph's now, never to be reused.
                Some(_) | None => complete_early(process, self.take_tail(st)),
            }
        }
        streams.retain(|_, st| st.outstanding > 0 || !st.tail.is_empty());
        covered
    }

    /// A tracking event of a stream completed: one fewer outstanding there, so that the
    /// next pass covers what came after it.
    fn stream_done(&self, ctx: CUcontext, stream: CUstream) {
        if let Some(st) = lock(&self.streams).get_mut(&(ctx as usize, stream as usize)) {
            st.outstanding = st.outstanding.saturating_sub(1);
        }
    }

    /// Before `stream` is destroyed or starts a capture (`change`, run under the lock): the
    /// launches on it that no event covers get one now, on the caller's thread, while the
    /// stream can still take it; and the poller records nothing on the stream meanwhile.
    pub fn before_stream_change<R>(
        &self,
        process: &'static Process,
        stream: CUstream,
        change: impl FnOnce() -> R,
    ) -> R {
        let Some(d) = crate::real::driver().filter(|_| !self.per_launch) else {
            return change();
        };
        let mut streams = lock(&self.streams);
        self.absorb(&mut streams);
        let mut pending = Vec::new();
        let caller = Tracker::current_ctx(d);
        for (&(ctx, s), st) in streams.iter_mut() {
            if s != stream as usize || st.tail.is_empty() {
                continue;
            }
            let ctx = ctx as CUcontext;
            // The event is made in the stream's context, which need not be the caller's.
            if ctx != caller
                && let Some(set) = d.ctx_set_current
            {
                // SAFETY: the context the launches were made in, alive while they are.
                unsafe { set(ctx) };
            }
            match self.record(d, ctx, stream, false) {
                Some(done) => pending.push(self.cover_tail(process, st, done, ctx, stream)),
                None => complete_early(process, self.take_tail(st)),
            }
            if ctx != caller
                && let Some(set) = d.ctx_set_current
            {
                // SAFETY: the caller's own context, current when it called.
                unsafe { set(caller) };
            }
        }
        let result = change();
        drop(streams);
        if !pending.is_empty() {
            lock(&self.queue).append(&mut pending);
            self.run_poller(process);
        }
        result
    }

    pub fn give_back(&self, ctx: CUcontext, event: CUevent, timing: bool) {
        lock(&self.pool).push((ctx as usize, event as usize, timing));
    }

    /// Queue a pending launch and make sure the poller runs.
    pub fn push(&self, process: &'static Process, pending: Pending) {
        self.outstanding.fetch_add(1, Ordering::AcqRel);
        lock(&self.queue).push(pending);
        self.run_poller(process);
    }

    /// Start the poller, or wake it if it waits.
    fn run_poller(&self, process: &'static Process) {
        // A load first: this runs on every launch, and a swap would write the shared line.
        if !self.started.load(Ordering::Acquire) && !self.started.swap(true, Ordering::AcqRel) {
            let spawned = std::thread::Builder::new()
                .name("mmk-ksched-poll".into())
                .spawn(move || process.tracker.poll_forever(process));
            if spawned.is_err() {
                self.started.store(false, Ordering::Release);
            }
        }
        if self.idle.load(Ordering::SeqCst) {
            // Under the queue's lock, which the poller holds from its last look until it
            // waits: the wakeup cannot fall between the two.
            let _queue = lock(&self.queue);
            self.wake.notify_one();
        }
    }

    /// Make sure record mode has a clock reference for `ctx` (blocks once per context, on
    /// `stream`, which is not capturing: the null stream could be, in effect, while
    /// another stream captures).
    pub fn ensure_reference(&self, d: &Driver, ctx: CUcontext, stream: CUstream) {
        if lock(&self.refs).iter().any(|r| r.ctx == ctx as usize) {
            return;
        }
        let (Some(create), Some(record), Some(sync)) =
            (d.event_create, d.event_record, d.event_synchronize)
        else {
            return;
        };
        let mut e: CUevent = std::ptr::null_mut();
        // SAFETY: create, record on the caller's stream and wait for one timing event; in
        // relaxed mode, so that the wait does not disturb another thread's capture.
        let ok = d.relaxed(|| unsafe {
            create(&mut e, CU_EVENT_DEFAULT) == CUDA_SUCCESS
                && record(e, stream) == CUDA_SUCCESS
                && sync(e) == CUDA_SUCCESS
        });
        if ok {
            lock(&self.refs).push(Reference {
                ctx: ctx as usize,
                event: e as usize,
                host_ns: now_ns(),
            });
        }
    }

    fn poll_forever(&self, process: &'static Process) {
        // Sleep as asked: the default 50 us timer slack would stretch every poll.
        // SAFETY: prctl on the calling thread with a valid option.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000u64) };
        // The job may capture a graph in global mode while this thread queries events.
        let driver = crate::real::driver();
        if let Some(d) = driver {
            d.relax_capture_mode();
        }
        let (shortest, longest) = poll_interval();
        let mut interval = shortest;
        // Since when nothing has been left to track.
        let mut quiet_since: Option<u64> = None;
        loop {
            let batch = std::mem::take(&mut *lock(&self.queue));
            let before = batch.len();
            let mut left = self.poll_once(process, batch);
            if left.len() < before {
                interval = shortest;
            }
            if let Some(d) = driver {
                left.extend(self.cover_tails(process, d));
            }
            if !left.is_empty()
                && let Some((gate, _)) = &process.gate
            {
                process.device.check_starved(process, gate);
            }
            let busy = !left.is_empty() || self.uncovered.load(Ordering::Acquire) > 0;
            if !left.is_empty() {
                let mut queue = lock(&self.queue);
                left.append(&mut queue);
                *queue = left;
            }
            if busy {
                quiet_since = None;
                std::thread::sleep(interval);
                interval = (interval * 2).min(longest);
                continue;
            }
            let now = now_ns();
            if now.saturating_sub(*quiet_since.get_or_insert(now)) < LINGER_NS {
                std::thread::sleep(longest);
                continue;
            }
            // Quiet for a while: wait for a launch or a pending event to wake us.
            quiet_since = None;
            interval = shortest;
            let mut queue = lock(&self.queue);
            self.idle.store(true, Ordering::SeqCst);
            while queue.is_empty() && self.uncovered.load(Ordering::SeqCst) == 0 {
                queue = self
                    .wake
                    .wait(queue)
                    .unwrap_or_else(PoisonError::into_inner);
            }
            self.idle.store(false, Ordering::Release);
        }
    }

    /// Query each pending launch once; complete the finished ones, return the others.
    fn poll_once(&self, process: &Process, batch: Vec<Pending>) -> Vec<Pending> {
        let Some(d) = crate::real::driver() else {
            return batch;
        };
        let Some(query) = d.event_query else {
            return batch;
        };
        let mut current: CUcontext = std::ptr::null_mut();
        let mut left = Vec::new();
        // Streams seen busy in this pass (few: a linear scan beats hashing).
        let mut busy: Vec<CUstream> = Vec::new();
        for p in batch {
            if busy.contains(&p.stream) {
                left.push(p);
                continue;
            }
            if p.ctx != current
                && let Some(set) = d.ctx_set_current
            {
                // SAFETY: the context the event was made in; it is alive while its
                // launches are.
                unsafe { set(p.ctx) };
                current = p.ctx;
            }
            // SAFETY: a live event of that context.
            match unsafe { query(p.done) } {
                CUDA_ERROR_NOT_READY => {
                    busy.push(p.stream);
                    left.push(p);
                }
                // Done, or the event is broken: either way nobody should wait on it.
                _ => self.complete(process, d, p),
            }
        }
        left
    }

    fn complete(&self, process: &Process, d: &Driver, p: Pending) {
        self.finish_one(process, d, p);
        self.outstanding.fetch_sub(1, Ordering::AcqRel);
    }

    fn finish_one(&self, process: &Process, d: &Driver, p: Pending) {
        if let Some((slot, last, before)) = p.gate {
            for charge in before.into_iter().chain([last]) {
                process.end_in_gate(Some((slot, charge)));
            }
            if !self.per_launch && p.record.is_none() {
                self.stream_done(p.ctx, p.stream);
            }
        }
        match p.record {
            Some((start, mut line)) => {
                if let Some(r) = self.reference(p.ctx) {
                    let at = |event: CUevent| -> Option<u64> {
                        let elapsed = d.event_elapsed?;
                        let mut ms = 0f32;
                        // SAFETY: two completed timing events of the same context.
                        let rc = unsafe { elapsed(&mut ms, r.event as CUevent, event) };
                        (rc == CUDA_SUCCESS && ms.is_finite() && ms >= 0.0)
                            .then(|| r.host_ns + (f64::from(ms) * 1e6) as u64)
                    };
                    line.start_ns = at(start);
                    line.end_ns = at(p.done);
                }
                if let Some(recorder) = process.record.as_ref() {
                    recorder.write(&line);
                }
                self.give_back(p.ctx, start, true);
                self.give_back(p.ctx, p.done, true);
            }
            None => self.give_back(p.ctx, p.done, false),
        }
    }

    fn reference(&self, ctx: CUcontext) -> Option<Reference> {
        lock(&self.refs)
            .iter()
            .find(|r| r.ctx == ctx as usize)
            .copied()
    }

    /// At exit: wait up to `limit` for what is pending (in the queue or in the poller's
    /// hands), so the trace and the gate are complete.
    pub fn drain(&self, process: &Process, limit: Duration) {
        let deadline = now_ns() + limit.as_nanos() as u64;
        while (self.outstanding.load(Ordering::Acquire) > 0
            || self.uncovered.load(Ordering::Acquire) > 0)
            && now_ns() < deadline
        {
            // A tail behind an event still outstanding is covered once that completes.
            let batch = std::mem::take(&mut *lock(&self.queue));
            let mut left = match crate::real::driver() {
                Some(d) => d.relaxed(|| {
                    let mut left = self.poll_once(process, batch);
                    left.extend(self.cover_tails(process, d));
                    left
                }),
                None => self.poll_once(process, batch),
            };
            if !left.is_empty() {
                lock(&self.queue).append(&mut left);
            }
            std::thread::sleep(POLL_MIN);
        }
    }
}
