//! Streams, events, host memory and stream waits.

use super::*;

// ---- streams and events ----

/// The device's stream priorities, as an H100/H200 reports them: 0 is the least (and the
/// default), -5 the greatest.
pub(crate) const LEAST_PRIORITY: c_int = 0;
pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 1;
pub(crate) const GREATEST_PRIORITY: c_int = -5;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(stream: *mut Handle, flags: c_uint) -> CUresult {
    // SAFETY: the caller's arguments, passed on.
    unsafe { cuStreamCreateWithPriority(stream, flags, LEAST_PRIORITY) }
}

/// A stream is a unique address holding its priority. A priority outside the range is
/// clamped to it, as the real driver does.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    stream: *mut Handle,
    flags: c_uint,
    priority: c_int,
) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if stream.is_null() {
        return INVALID_VALUE;
    }
    let priority = priority.clamp(GREATEST_PRIORITY, LEAST_PRIORITY);
    let s: Handle = Box::into_raw(Box::new(i64::from(priority))).cast();
    if flags & CU_STREAM_NON_BLOCKING != 0 {
        gpu().non_blocking.insert(s as usize);
    }
    // SAFETY: checked non-null.
    unsafe { *stream = s };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxGetStreamPriorityRange(
    least: *mut c_int,
    greatest: *mut c_int,
) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    // SAFETY: each pointer is written only when non-null, as the driver allows.
    unsafe {
        if !least.is_null() {
            *least = LEAST_PRIORITY;
        }
        if !greatest.is_null() {
            *greatest = GREATEST_PRIORITY;
        }
    }
    SUCCESS
}

/// The priority of a stream this library made; the default streams (null, legacy,
/// per-thread) have the least.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamGetPriority(stream: Handle, priority: *mut c_int) -> CUresult {
    if priority.is_null() {
        return INVALID_VALUE;
    }
    let p = if (stream as usize) <= 2 {
        LEAST_PRIORITY
    } else {
        // SAFETY: a stream this library made points to its priority.
        unsafe { *stream.cast::<i64>() as c_int }
    };
    // SAFETY: checked non-null.
    unsafe { *priority = p };
    SUCCESS
}

/// Destroys a stream this library made: the call returns at once, and the work queued on
/// it still runs, as with the real driver. The default streams cannot be destroyed.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamDestroy_v2(stream: Handle) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if is_legacy(stream) || stream as usize == 2 {
        return INVALID_HANDLE;
    }
    let mut g = gpu();
    if g.captures.contains_key(&(stream as usize)) {
        return ILLEGAL_STATE;
    }
    g.non_blocking.remove(&(stream as usize));
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamSynchronize(stream: Handle) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    let until = {
        let mut g = gpu();
        if let Err(rc) = g
            .unsafe_call()
            .and_then(|()| g.touch_capturing(stream as usize))
        {
            return rc;
        }
        if is_legacy(stream) && g.legacy_blocked() {
            g.invalidate_blocking();
            return STREAM_CAPTURE_IMPLICIT;
        }
        g.tails.get(&(stream as usize)).copied().unwrap_or(0)
    };
    sleep_until(until);
    wait_deferred(Some(stream as usize));
    let until = gpu().tails.get(&(stream as usize)).copied().unwrap_or(0);
    sleep_until(until);
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(event: *mut Handle, _flags: c_uint) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if event.is_null() {
        return INVALID_VALUE;
    }
    let e = Box::into_raw(Box::new(0u8)).cast::<c_void>();
    gpu().events.insert(
        e as usize,
        Event {
            at: 0,
            captured: None,
        },
    );
    // SAFETY: checked non-null.
    unsafe { *event = e };
    SUCCESS
}

/// `MMK_FAKE_CUDA_RECORD_DELAY_US`: how long each `cuEventRecord` takes before it does
/// anything (0 by default), outside the fake's own lock: a driver that is slow to record an
/// event, as under load, without holding up the fake's other entry points.
pub(crate) fn record_delay() -> std::time::Duration {
    static DELAY: OnceLock<std::time::Duration> = OnceLock::new();
    *DELAY.get_or_init(|| {
        std::env::var("MMK_FAKE_CUDA_RECORD_DELAY_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(std::time::Duration::ZERO, std::time::Duration::from_micros)
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventRecord(event: Handle, stream: Handle) -> CUresult {
    let delay = record_delay();
    if !delay.is_zero() {
        std::thread::sleep(delay);
    }
    let mut g = gpu();
    let captured = g.captures.contains_key(&(stream as usize));
    if !captured && is_legacy(stream) && g.legacy_blocked() {
        g.invalidate_blocking();
        return STREAM_CAPTURE_IMPLICIT;
    }
    let at = g
        .tails
        .get(&(stream as usize))
        .copied()
        .unwrap_or(0)
        .max(now_ns());
    if !g.events.contains_key(&(event as usize)) {
        return INVALID_HANDLE;
    }
    let deferred = !captured
        && match g.deferred.get_mut(&(stream as usize)) {
            Some(queue) => {
                queue.push_back(Deferred::Record {
                    event: event as usize,
                });
                true
            }
            None => false,
        };
    if let Some(e) = g.events.get_mut(&(event as usize)) {
        // Behind a wait: not ready until the releaser schedules what is ahead of it.
        e.at = if deferred { u64::MAX } else { at };
        e.captured = captured.then_some(stream as usize);
    }
    SUCCESS
}

pub(crate) fn event_at(event: Handle) -> Result<u64, CUresult> {
    gpu()
        .events
        .get(&(event as usize))
        .map(|e| e.at)
        .ok_or(INVALID_HANDLE)
}

/// When `event` completes, for a query or a synchronization (potentially unsafe calls).
pub(crate) fn event_wait_at(event: Handle) -> Result<u64, CUresult> {
    let mut g = gpu();
    g.unsafe_call()?;
    let e = g.events.get(&(event as usize)).ok_or(INVALID_HANDLE)?;
    let (at, captured) = (e.at, e.captured);
    match captured {
        Some(stream) => g.touch_capturing(stream).map(|()| at),
        None => Ok(at),
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventQuery(event: Handle) -> CUresult {
    match event_wait_at(event) {
        Ok(at) if at <= now_ns() => SUCCESS,
        Ok(_) => NOT_READY,
        Err(rc) => rc,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventSynchronize(event: Handle) -> CUresult {
    loop {
        match event_wait_at(event) {
            // Behind a stream wait that has not passed.
            Ok(u64::MAX) => std::thread::sleep(std::time::Duration::from_micros(10)),
            Ok(at) => {
                sleep_until(at);
                return SUCCESS;
            }
            Err(rc) => return rc,
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(ms: *mut f32, start: Handle, end: Handle) -> CUresult {
    if ms.is_null() {
        return INVALID_VALUE;
    }
    let (a, b) = match (event_at(start), event_at(end)) {
        (Ok(a), Ok(b)) => (a, b),
        _ => return INVALID_HANDLE,
    };
    if a > now_ns() || b > now_ns() {
        return NOT_READY;
    }
    // SAFETY: checked non-null.
    unsafe { *ms = (b as f64 - a as f64) as f32 / 1e6 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuEventDestroy(event: Handle) -> CUresult {
    match gpu().events.remove(&(event as usize)) {
        Some(_) => SUCCESS,
        None => INVALID_HANDLE,
    }
}

// ---- host memory and stream waits ----

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, _flags: c_uint) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    if p.is_null() || bytes == 0 || std::env::var_os("MMK_FAKE_CUDA_NO_HOST_REGISTER").is_some() {
        return INVALID_VALUE;
    }
    let mut g = gpu();
    let start = p as usize;
    if g.registered
        .iter()
        .any(|&(s, n)| start < s + n && s < start + bytes)
    {
        // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED
        return 712;
    }
    g.registered.push((start, bytes));
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostRegister(p: *mut c_void, bytes: usize, flags: c_uint) -> CUresult {
    cuMemHostRegister_v2(p, bytes, flags)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    let mut g = gpu();
    match g.registered.iter().position(|&(s, _)| s == p as usize) {
        Some(i) => {
            g.registered.swap_remove(i);
            SUCCESS
        }
        // CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED
        None => 713,
    }
}

/// The device address of registered host memory: the host address itself.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut u64,
    p: *mut c_void,
    _flags: c_uint,
) -> CUresult {
    if dptr.is_null() {
        return INVALID_VALUE;
    }
    let at = p as usize;
    if !gpu().registered.iter().any(|&(s, n)| at >= s && at < s + n) {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null.
    unsafe { *dptr = at as u64 };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuMemHostGetDevicePointer(
    dptr: *mut u64,
    p: *mut c_void,
    flags: c_uint,
) -> CUresult {
    // SAFETY: the caller's arguments.
    unsafe { cuMemHostGetDevicePointer_v2(dptr, p, flags) }
}

/// Work queued on `stream` after this waits until the work before it has ended and the
/// 32-bit word at `addr` (registered host memory) meets the condition.
#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitValue32_v2(
    stream: Handle,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    if let Err(rc) = check_ctx() {
        return rc;
    }
    let at = addr as usize;
    let mut g = gpu();
    if !at.is_multiple_of(4)
        || !g
            .registered
            .iter()
            .any(|&(s, n)| at >= s && at + 4 <= s + n)
    {
        return INVALID_VALUE;
    }
    if g.captures.contains_key(&(stream as usize)) {
        // A wait node in a graph is not modelled.
        return STREAM_CAPTURE_UNSUPPORTED;
    }
    g.deferred
        .entry(stream as usize)
        .or_default()
        .push_back(Deferred::Wait {
            addr: at,
            value,
            flags,
        });
    g.release_deferred();
    drop(g);
    start_releaser();
    SUCCESS
}

#[unsafe(no_mangle)]
pub extern "C" fn cuStreamWaitValue32(
    stream: Handle,
    addr: u64,
    value: u32,
    flags: c_uint,
) -> CUresult {
    cuStreamWaitValue32_v2(stream, addr, value, flags)
}
