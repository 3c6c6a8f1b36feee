//! Kernel identity and SM demand: the function name (`cuFuncGetName` or `cuKernelGetName`)
//! and blocks per SM from the occupancy API, cached per thread by (function, block size,
//! dynamic shared memory) so that a launch pays for them once.

use std::cell::RefCell;
use std::collections::HashMap;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

use mmk_kernel_sched::profile::{Expect, KernelKey};

use crate::cuda::*;
use crate::real;

/// What was launched.
#[derive(Debug, Clone, Copy)]
pub enum Target {
    /// A `CUfunction` (or a `CUkernel` cast to one, which the driver also accepts).
    Function(CUfunction),
    /// A runtime host stub (`cudaLaunchKernel`'s `func`).
    HostStub(*const c_void),
    /// A `cudaKernel_t` / `CUkernel` (`__cudaLaunchKernel`'s first argument).
    Kernel(CUkernel),
    /// An executable graph: one unit, which may take the whole partition.
    Graph(CUgraphExec),
}

impl Target {
    fn key(self) -> usize {
        match self {
            Target::Function(p) | Target::Kernel(p) | Target::Graph(p) => p as usize,
            Target::HostStub(p) => p as usize,
        }
    }
}

#[derive(Debug)]
pub struct KernelInfo {
    pub name: Rc<str>,
    /// 0 when the occupancy API could not tell.
    pub blocks_per_sm: u32,
}

/// Distinct kernels identified by any thread of this process.
pub static KERNELS_SEEN: AtomicU64 = AtomicU64::new(0);

// The keys are pointers and small integers from this process: SipHash's flood resistance
// buys nothing there and cost ~50 ns a launch.
use mmk_core::fasthash::FastMap;

/// A launch's shape as a profile key: name pointer (stable: names are cached for good),
/// grid, block, dynamic shared memory.
type ShapeKey = (usize, [u32; 3], [u32; 3], u32);

thread_local! {
    static EXPECT: RefCell<FastMap<ShapeKey, Expect>> = RefCell::new(FastMap::default());
    static CACHE: RefCell<FastMap<(usize, u32, u32), Rc<KernelInfo>>> =
        RefCell::new(FastMap::default());
    static NAMES: RefCell<FastMap<usize, Rc<str>>> = RefCell::new(FastMap::default());
}

/// The identity of a launch of `target` with `block_threads` threads a block and
/// `shared_mem` bytes of dynamic shared memory.
pub fn identify(target: Target, block_threads: u32, shared_mem: u32) -> Rc<KernelInfo> {
    let key = (target.key(), block_threads, shared_mem);
    if let Some(hit) = CACHE.with_borrow(|c| c.get(&key).cloned()) {
        return hit;
    }
    let info = Rc::new(resolve(target, block_threads, shared_mem));
    CACHE.with_borrow_mut(|c| c.insert(key, info.clone()));
    info
}

/// What `profile` says about a launch of `name` with this shape (cached per thread; a
/// kernel the profile does not know gets the all-unknown [`Expect`]).
pub fn expect(
    profile: &HashMap<KernelKey, Expect>,
    name: &Rc<str>,
    grid: [u32; 3],
    block: [u32; 3],
    shared_mem: u32,
) -> Expect {
    let key = (
        Rc::as_ptr(name).cast::<u8>() as usize,
        grid,
        block,
        shared_mem,
    );
    if let Some(hit) = EXPECT.with_borrow(|c| c.get(&key).copied()) {
        return hit;
    }
    let found = profile
        .get(&KernelKey {
            name: name.to_string(),
            grid,
            block,
            shared_mem,
        })
        .copied()
        .unwrap_or_default();
    EXPECT.with_borrow_mut(|c| c.insert(key, found));
    found
}

fn resolve(target: Target, block_threads: u32, shared_mem: u32) -> KernelInfo {
    let Some(d) = real::driver() else {
        return KernelInfo {
            name: "?".into(),
            blocks_per_sm: 0,
        };
    };
    let (function, kernel) = match target {
        Target::Graph(_) => {
            return KernelInfo {
                name: "graph".into(),
                blocks_per_sm: 0,
            };
        }
        Target::Function(f) => (f, None),
        Target::Kernel(k) => (std::ptr::null_mut(), Some(k)),
        Target::HostStub(stub) => {
            let mut f: CUfunction = std::ptr::null_mut();
            match real::func_by_symbol() {
                // SAFETY: cudart's cudaGetFuncBySymbol with a valid out pointer.
                Some(by_symbol) if unsafe { by_symbol(&mut f, stub) } == 0 && !f.is_null() => {
                    (f, None)
                }
                // Not a registered stub: the runtime also takes kernel handles here.
                _ => (std::ptr::null_mut(), Some(stub.cast_mut())),
            }
        }
    };
    // A CUkernel becomes a CUfunction of the current context for the occupancy API.
    let function = match kernel {
        Some(k) => d
            .kernel_get_function
            .and_then(|get| {
                let mut f: CUfunction = std::ptr::null_mut();
                // SAFETY: the driver's cuKernelGetFunction with a valid out pointer.
                (unsafe { get(&mut f, k) } == CUDA_SUCCESS && !f.is_null()).then_some(f)
            })
            .unwrap_or(k),
        None => function,
    };
    let name_key = kernel.unwrap_or(function) as usize;
    let name = NAMES.with_borrow(|n| n.get(&name_key).cloned());
    let name = name.unwrap_or_else(|| {
        let name: Rc<str> = name_of(d, function, kernel).into();
        KERNELS_SEEN.fetch_add(1, Ordering::Relaxed);
        NAMES.with_borrow_mut(|n| n.insert(name_key, name.clone()));
        name
    });
    let blocks_per_sm = d.occupancy.map_or(0, |occupancy| {
        let mut n: c_int = 0;
        let threads = c_int::try_from(block_threads).unwrap_or(c_int::MAX);
        // SAFETY: the driver's occupancy query with a valid out pointer.
        let rc = unsafe { occupancy(&mut n, function, threads, shared_mem as usize) };
        if rc == CUDA_SUCCESS {
            u32::try_from(n).unwrap_or(0)
        } else {
            0
        }
    });
    KernelInfo {
        name,
        blocks_per_sm,
    }
}

fn name_of(d: &real::Driver, function: CUfunction, kernel: Option<CUkernel>) -> String {
    let read = |p: *const c_char| {
        // SAFETY: the driver returns a NUL-terminated name it owns.
        (!p.is_null()).then(|| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
    };
    let mut p: *const c_char = std::ptr::null();
    if let (Some(k), Some(get)) = (kernel, d.kernel_get_name) {
        // SAFETY: the driver's cuKernelGetName with a valid out pointer.
        if unsafe { get(&mut p, k) } == CUDA_SUCCESS
            && let Some(name) = read(p)
        {
            return name;
        }
    }
    if let Some(get) = d.func_get_name {
        // SAFETY: the driver's cuFuncGetName with a valid out pointer.
        if unsafe { get(&mut p, function) } == CUDA_SUCCESS
            && let Some(name) = read(p)
        {
            return name;
        }
    }
    if let (None, Some(get)) = (kernel, d.kernel_get_name) {
        // A CUkernel passed where a CUfunction goes.
        // SAFETY: as above.
        if unsafe { get(&mut p, function) } == CUDA_SUCCESS
            && let Some(name) = read(p)
        {
            return name;
        }
    }
    "?".to_owned()
}
