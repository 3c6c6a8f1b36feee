//! cuBLAS GEMMs of offline jobs, cut into pieces the gate can hold
//! ([`mmk_kernel_sched::slice`]).
//!
//! The interposer exports `cublasSgemm_v2`, `cublasGemmEx` and `cublasLtMatmul`; a program
//! linked against cuBLAS (PyTorch's `libtorch_cuda.so`) reaches them first. Each counts
//! the call and, in an offline job whose gate sets [`GateConfig::gemm_slice_mflop`]
//! (`mmk-gate create --gemm-slice-mflop`), cuts a GEMM over the limit along N into
//! pieces, each an ordinary call of the real function on sub-matrices (pointer offsets, the
//! same leading dimensions). Everything else goes to the real function unchanged.
//!
//! What is not cut (counted as `uncut` when over the limit): data types other than real
//! fp16/bf16/fp32/fp64, cuBLASLt epilogues other than the per-row ones (bias, ReLU, GELU,
//! without auxiliary output), a transposed C, and a call whose first piece the library
//! refuses (it then runs whole). Batched or non-column-major cuBLASLt layouts run whole
//! uncounted. Descriptor attributes other than the transposes and the epilogue are not
//! read (atomic-sync counters, for one, would be wrong for a piece). A piece of `cublasLtMatmul` is
//! first tried with the caller's algorithm and, if the library refuses it for the
//! narrower shape, with none (the library's own heuristic); a `cublasGemmEx` piece the same
//! way with `CUBLAS_GEMM_DEFAULT`. Every piece's offsets and layouts are made before any
//! runs, and the narrowest piece runs first, so a refusal leaves nothing half done; a
//! failure of a later piece is returned to the caller.
//!
//! Calls made while one of these hooks runs on the same thread (cuBLAS calling cuBLASLt
//! inside) go straight through, uncounted.
//!
//! [`GateConfig::gemm_slice_mflop`]: mmk_kernel_sched::GateConfig::gemm_slice_mflop

#![allow(non_snake_case)]

use std::cell::Cell;
use std::ffi::{c_int, c_void};
use std::ops::Range;
use std::sync::atomic::AtomicUsize;

use mmk_kernel_sched::Class;
use mmk_kernel_sched::slice::{column_slices, element_bytes};

use crate::exports::resolve;
use crate::real::Lib;
use crate::stats::Blas;

type Handle = *mut c_void;
/// `cublasStatus_t`.
type Status = c_int;

const CUBLAS_STATUS_SUCCESS: Status = 0;
const CUBLAS_STATUS_NOT_INITIALIZED: Status = 1;
/// `cublasOperation_t`: not transposed.
const CUBLAS_OP_N: c_int = 0;
const CUDA_R_32F: c_int = 0;
/// `cublasGemmAlgo_t`: the library's own choice.
const CUBLAS_GEMM_DEFAULT: c_int = -1;

// cublasLtMatmulDescAttributes_t and cublasLtMatrixLayoutAttribute_t (cublasLt.h).
const DESC_TRANSB: c_int = 4;
const DESC_TRANSC: c_int = 5;
const DESC_EPILOGUE: c_int = 7;
const LAYOUT_TYPE: c_int = 0;
const LAYOUT_ORDER: c_int = 1;
const LAYOUT_ROWS: c_int = 2;
const LAYOUT_COLS: c_int = 3;
const LAYOUT_LD: c_int = 4;
const LAYOUT_BATCH_COUNT: c_int = 5;
/// `CUBLASLT_ORDER_COL`.
const ORDER_COL: i32 = 0;
/// cublasLtEpilogue_t values that act on each element (with a per-row bias): DEFAULT,
/// RELU, BIAS, RELU_BIAS, GELU, GELU_BIAS.
const PER_ROW_EPILOGUES: [u32; 6] = [1, 2, 4, 6, 32, 36];

type Sgemm = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const f32,
    *const f32,
    c_int,
    *const f32,
    c_int,
    *const f32,
    *mut f32,
    c_int,
) -> Status;
type GemmEx = unsafe extern "C" fn(
    Handle,
    c_int,
    c_int,
    c_int,
    c_int,
    c_int,
    *const c_void,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    c_int,
    c_int,
    *const c_void,
    *mut c_void,
    c_int,
    c_int,
    c_int,
    c_int,
) -> Status;
type LtMatmul = unsafe extern "C" fn(
    Handle,
    Handle,
    *const c_void,
    *const c_void,
    Handle,
    *const c_void,
    Handle,
    *const c_void,
    *const c_void,
    Handle,
    *mut c_void,
    Handle,
    *const c_void,
    *mut c_void,
    usize,
    Handle,
) -> Status;
type LtGetAttribute = unsafe extern "C" fn(Handle, c_int, *mut c_void, usize, *mut usize) -> Status;
type LtLayoutCreate = unsafe extern "C" fn(*mut Handle, c_int, u64, u64, i64) -> Status;
type LtLayoutDestroy = unsafe extern "C" fn(Handle) -> Status;

thread_local! {
    static INSIDE: Cell<bool> = const { Cell::new(false) };
}

/// Marks the thread as inside a GEMM hook while it lives.
struct Inside;

impl Inside {
    /// `None` when the thread already is (a nested call).
    fn enter() -> Option<Inside> {
        INSIDE.with(|c| (!c.replace(true)).then_some(Inside))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        INSIDE.with(|c| c.set(false));
    }
}

/// The piece limit for a call counted as `api`, or `None` when this call is not cut: the
/// interposer is off, the process is not an offline job in a gate that cuts GEMMs.
fn limit(api: Blas) -> Option<u64> {
    let p = crate::process::get()?;
    p.stats.gemm_call(api);
    if p.class != Class::Offline {
        return None;
    }
    let (gate, _) = p.gate.as_ref()?;
    let mflop = gate.gemm_slice_mflop();
    (mflop > 0).then_some(u64::from(mflop))
}

fn count(f: impl FnOnce(&crate::stats::Stats)) {
    if let Some(p) = crate::process::get() {
        f(&p.stats);
    }
}

/// Run the pieces of a cut GEMM, each prepared beforehand (offsets, layouts), so that
/// nothing can fail between pieces but the library itself. The last piece, the narrowest
/// and so the likeliest to be refused, runs first. `None` when that first one is refused
/// (nothing has run: the caller runs the call whole); otherwise the first failure of a
/// later piece, or success.
fn run_pieces<P>(prepared: &[P], mut run: impl FnMut(&P) -> Status) -> Option<Status> {
    let (last, rest) = prepared.split_last()?;
    if run(last) != CUBLAS_STATUS_SUCCESS {
        count(|s| s.gemm_uncut());
        return None;
    }
    for piece in rest {
        let rc = run(piece);
        if rc != CUBLAS_STATUS_SUCCESS {
            return Some(rc);
        }
    }
    count(|s| s.gemm_cut(prepared.len() as u64));
    Some(CUBLAS_STATUS_SUCCESS)
}

/// Byte offset of column `j` of a column-major matrix with leading dimension `ld`, or of
/// row `j` when the matrix is stored transposed (`op` not N).
fn offset(j: u64, ld: u64, op: c_int, bytes: u64) -> Option<usize> {
    let elements = if op == CUBLAS_OP_N {
        j.checked_mul(ld)?
    } else {
        j
    };
    usize::try_from(elements.checked_mul(bytes)?).ok()
}

/// The pieces of a dense GEMM call (`cublasSgemm_v2`, `cublasGemmEx`), or `None` when it
/// runs whole: not cut, small, or shaped in a way the slicer does not handle.
fn dense_pieces(
    api: Blas,
    dims: [c_int; 3],
    transb: c_int,
    lds: [c_int; 2],
    types: [c_int; 2],
) -> Option<(Vec<Range<u64>>, [u64; 2])> {
    let max = limit(api)?;
    let [m, n, k] = dims.map(|d| u64::try_from(d).unwrap_or(0));
    let pieces = column_slices(m, n, k, max);
    if pieces.len() < 2 {
        return None;
    }
    let bytes = match (element_bytes(types[0]), element_bytes(types[1])) {
        (Some(b), Some(c)) if (0..=2).contains(&transb) => [b, c],
        _ => {
            count(|s| s.gemm_uncut());
            return None;
        }
    };
    if lds.iter().any(|&ld| ld <= 0) {
        return None; // the library refuses the call whole
    }
    Some((pieces, bytes))
}

/// Run the pieces of a dense GEMM: `call(width, offset into B, offset into C)` for each
/// (bytes; see [`run_pieces`] for what is returned). `None` also when an offset does not
/// fit in memory (nothing has run).
fn run_dense(
    pieces: &[Range<u64>],
    transb: c_int,
    [ldb, ldc]: [c_int; 2],
    [bb, cb]: [u64; 2],
    call: impl FnMut(&(c_int, usize, usize)) -> Status,
) -> Option<Status> {
    // dense_pieces checked that the leading dimensions are positive.
    let (ldb, ldc) = (ldb.unsigned_abs().into(), ldc.unsigned_abs().into());
    let prepared: Option<Vec<(c_int, usize, usize)>> = pieces
        .iter()
        .map(|r| {
            Some((
                c_int::try_from(r.end - r.start).ok()?,
                offset(r.start, ldb, transb, bb)?,
                offset(r.start, ldc, CUBLAS_OP_N, cb)?,
            ))
        })
        .collect();
    run_pieces(&prepared?, call)
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasSgemm_v2(
    handle: Handle,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const f32,
    a: *const f32,
    lda: c_int,
    b: *const f32,
    ldb: c_int,
    beta: *const f32,
    c: *mut f32,
    ldc: c_int,
) -> Status {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: Sgemm is the type of cublasSgemm_v2.
    let Some(real) = (unsafe { resolve::<Sgemm>(&REAL, c"cublasSgemm_v2", Lib::Blas) }) else {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    };
    // SAFETY (all calls below): the caller's arguments, or sub-matrices of them.
    let whole = || unsafe {
        real(
            handle, transa, transb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
        )
    };
    let Some(_inside) = Inside::enter() else {
        return whole();
    };
    let plan = dense_pieces(
        Blas::Sgemm,
        [m, n, k],
        transb,
        [ldb, ldc],
        [CUDA_R_32F, CUDA_R_32F],
    );
    let Some((pieces, [bb, cb])) = plan else {
        return whole();
    };
    let done = run_dense(
        &pieces,
        transb,
        [ldb, ldc],
        [bb, cb],
        |&(width, ob, oc)| unsafe {
            real(
                handle,
                transa,
                transb,
                m,
                width,
                k,
                alpha,
                a,
                lda,
                b.cast::<u8>().wrapping_add(ob).cast(),
                ldb,
                beta,
                c.cast::<u8>().wrapping_add(oc).cast(),
                ldc,
            )
        },
    );
    done.unwrap_or_else(whole)
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmEx(
    handle: Handle,
    transa: c_int,
    transb: c_int,
    m: c_int,
    n: c_int,
    k: c_int,
    alpha: *const c_void,
    a: *const c_void,
    atype: c_int,
    lda: c_int,
    b: *const c_void,
    btype: c_int,
    ldb: c_int,
    beta: *const c_void,
    c: *mut c_void,
    ctype: c_int,
    ldc: c_int,
    compute: c_int,
    algo: c_int,
) -> Status {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: GemmEx is the type of cublasGemmEx.
    let Some(real) = (unsafe { resolve::<GemmEx>(&REAL, c"cublasGemmEx", Lib::Blas) }) else {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    };
    // SAFETY (all calls below): the caller's arguments, or sub-matrices of them.
    let whole = || unsafe {
        real(
            handle, transa, transb, m, n, k, alpha, a, atype, lda, b, btype, ldb, beta, c, ctype,
            ldc, compute, algo,
        )
    };
    let Some(_inside) = Inside::enter() else {
        return whole();
    };
    let Some((pieces, [bb, cb])) =
        dense_pieces(Blas::GemmEx, [m, n, k], transb, [ldb, ldc], [btype, ctype])
    else {
        return whole();
    };
    // SAFETY: the caller's arguments with sub-matrices of B and C.
    let piece = |width, ob, oc, algo| unsafe {
        real(
            handle,
            transa,
            transb,
            m,
            width,
            k,
            alpha,
            a,
            atype,
            lda,
            b.cast::<u8>().wrapping_add(ob).cast(),
            btype,
            ldb,
            beta,
            c.cast::<u8>().wrapping_add(oc).cast(),
            ctype,
            ldc,
            compute,
            algo,
        )
    };
    let done = run_dense(&pieces, transb, [ldb, ldc], [bb, cb], |&(width, ob, oc)| {
        let rc = piece(width, ob, oc, algo);
        if rc == CUBLAS_STATUS_SUCCESS || algo == CUBLAS_GEMM_DEFAULT {
            return rc;
        }
        // The caller's algorithm was chosen for the whole shape; let the library choose.
        piece(width, ob, oc, CUBLAS_GEMM_DEFAULT)
    });
    done.unwrap_or_else(whole)
}

/// What the slicer needs of a cuBLASLt matrix layout.
#[derive(Debug, Clone, Copy)]
struct Layout {
    dtype: c_int,
    rows: u64,
    cols: u64,
    ld: i64,
}

/// The cuBLASLt functions the slicer calls itself.
struct Lt {
    desc_get: LtGetAttribute,
    layout_get: LtGetAttribute,
    layout_create: LtLayoutCreate,
    layout_destroy: LtLayoutDestroy,
}

impl Lt {
    fn get() -> Option<Lt> {
        static DESC_GET: AtomicUsize = AtomicUsize::new(0);
        static LAYOUT_GET: AtomicUsize = AtomicUsize::new(0);
        static CREATE: AtomicUsize = AtomicUsize::new(0);
        static DESTROY: AtomicUsize = AtomicUsize::new(0);
        // SAFETY: the cuBLASLt functions of these names have these signatures.
        unsafe {
            Some(Lt {
                desc_get: resolve(&DESC_GET, c"cublasLtMatmulDescGetAttribute", Lib::BlasLt)?,
                layout_get: resolve(
                    &LAYOUT_GET,
                    c"cublasLtMatrixLayoutGetAttribute",
                    Lib::BlasLt,
                )?,
                layout_create: resolve(&CREATE, c"cublasLtMatrixLayoutCreate", Lib::BlasLt)?,
                layout_destroy: resolve(&DESTROY, c"cublasLtMatrixLayoutDestroy", Lib::BlasLt)?,
            })
        }
    }

    /// A fixed-size attribute of a descriptor or layout, read with `get`.
    fn attribute<T: Copy + Default>(get: LtGetAttribute, object: Handle, attr: c_int) -> Option<T> {
        let mut value = T::default();
        let mut written = 0usize;
        // SAFETY: the library writes at most size_of::<T>() bytes into value.
        let rc = unsafe {
            get(
                object,
                attr,
                (&mut value as *mut T).cast(),
                std::mem::size_of::<T>(),
                &mut written,
            )
        };
        (rc == CUBLAS_STATUS_SUCCESS && written == std::mem::size_of::<T>()).then_some(value)
    }

    /// A column-major, unbatched layout's shape; `None` for anything else.
    fn layout(&self, layout: Handle) -> Option<Layout> {
        if layout.is_null() {
            return None;
        }
        let order: i32 = Lt::attribute(self.layout_get, layout, LAYOUT_ORDER)?;
        let batch: i32 = Lt::attribute(self.layout_get, layout, LAYOUT_BATCH_COUNT)?;
        if order != ORDER_COL || batch > 1 {
            return None;
        }
        let dtype: u32 = Lt::attribute(self.layout_get, layout, LAYOUT_TYPE)?;
        Some(Layout {
            dtype: c_int::try_from(dtype).ok()?,
            rows: Lt::attribute(self.layout_get, layout, LAYOUT_ROWS)?,
            cols: Lt::attribute(self.layout_get, layout, LAYOUT_COLS)?,
            ld: Lt::attribute(self.layout_get, layout, LAYOUT_LD)?,
        })
    }

    /// A new layout like `l` with `rows` x `cols`; destroyed when the guard drops.
    fn make(&self, l: &Layout, rows: u64, cols: u64) -> Option<LayoutGuard<'_>> {
        let mut h: Handle = std::ptr::null_mut();
        // SAFETY: cublasLtMatrixLayoutCreate with a valid out pointer.
        let rc = unsafe { (self.layout_create)(&mut h, l.dtype, rows, cols, l.ld) };
        (rc == CUBLAS_STATUS_SUCCESS && !h.is_null()).then_some(LayoutGuard { lt: self, h })
    }
}

struct LayoutGuard<'a> {
    lt: &'a Lt,
    h: Handle,
}

impl Drop for LayoutGuard<'_> {
    fn drop(&mut self) {
        // SAFETY: a layout we created and no longer use (the library reads it during the
        // call only).
        unsafe { (self.lt.layout_destroy)(self.h) };
    }
}

/// How a `cublasLtMatmul` call is cut: the pieces, B's transpose, and the shapes and
/// element sizes of B, C and D.
struct LtPlan {
    pieces: Vec<Range<u64>>,
    transb: i32,
    b: Layout,
    c: Layout,
    d: Layout,
    bytes: [u64; 3],
}

fn lt_plan(lt: &Lt, desc: Handle, b: Handle, c: Handle, d: Handle, max: u64) -> Option<LtPlan> {
    let dl = lt.layout(d)?;
    let (m, n) = (dl.rows, dl.cols);
    let transb: i32 = Lt::attribute(lt.desc_get, desc, DESC_TRANSB)?;
    let bl = lt.layout(b)?;
    let k = if transb == CUBLAS_OP_N {
        bl.rows
    } else {
        bl.cols
    };
    let pieces = column_slices(m, n, k, max);
    if pieces.len() < 2 {
        return None;
    }
    let uncut = || {
        count(|s| s.gemm_uncut());
        None
    };
    let epilogue: u32 = Lt::attribute(lt.desc_get, desc, DESC_EPILOGUE)?;
    let transc: i32 = Lt::attribute(lt.desc_get, desc, DESC_TRANSC)?;
    if !(0..=2).contains(&transb) || transc != CUBLAS_OP_N {
        return uncut();
    }
    let cl = match lt.layout(c) {
        Some(cl) => cl,
        None => return uncut(),
    };
    let b_n = if transb == CUBLAS_OP_N {
        bl.cols
    } else {
        bl.rows
    };
    let shapes_agree = b_n == n && cl.rows == m && cl.cols == n;
    let bytes = [bl.dtype, cl.dtype, dl.dtype].map(element_bytes);
    let ([Some(bb), Some(cb), Some(db)], true, true, true) = (
        bytes,
        shapes_agree,
        PER_ROW_EPILOGUES.contains(&epilogue),
        [bl.ld, cl.ld, dl.ld].iter().all(|&ld| ld > 0),
    ) else {
        return uncut();
    };
    Some(LtPlan {
        pieces,
        transb,
        b: bl,
        c: cl,
        d: dl,
        bytes: [bb, cb, db],
    })
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasLtMatmul(
    handle: Handle,
    desc: Handle,
    alpha: *const c_void,
    a: *const c_void,
    adesc: Handle,
    b: *const c_void,
    bdesc: Handle,
    beta: *const c_void,
    c: *const c_void,
    cdesc: Handle,
    d: *mut c_void,
    ddesc: Handle,
    algo: *const c_void,
    workspace: *mut c_void,
    workspace_bytes: usize,
    stream: Handle,
) -> Status {
    static REAL: AtomicUsize = AtomicUsize::new(0);
    // SAFETY: LtMatmul is the type of cublasLtMatmul.
    let Some(real) = (unsafe { resolve::<LtMatmul>(&REAL, c"cublasLtMatmul", Lib::BlasLt) }) else {
        return CUBLAS_STATUS_NOT_INITIALIZED;
    };
    // SAFETY (all calls below): the caller's arguments, or sub-matrices of them with
    // layouts made for them.
    let call = |b: *const c_void, bdesc, c: *const c_void, cdesc, d: *mut c_void, ddesc, algo| unsafe {
        real(
            handle,
            desc,
            alpha,
            a,
            adesc,
            b,
            bdesc,
            beta,
            c,
            cdesc,
            d,
            ddesc,
            algo,
            workspace,
            workspace_bytes,
            stream,
        )
    };
    let whole = || call(b, bdesc, c, cdesc, d, ddesc, algo);
    let Some(_inside) = Inside::enter() else {
        return whole();
    };
    let Some(max) = limit(Blas::LtMatmul) else {
        return whole();
    };
    let Some(lt) = Lt::get() else {
        return whole();
    };
    let Some(plan) = lt_plan(&lt, desc, bdesc, cdesc, ddesc, max) else {
        return whole();
    };
    let [bb, cb, db] = plan.bytes;
    // Every piece's pointers and layouts before any runs (see run_pieces).
    let prepare = |r: &Range<u64>| {
        let width = r.end - r.start;
        let (brows, bcols) = if plan.transb == CUBLAS_OP_N {
            (plan.b.rows, width)
        } else {
            (width, plan.b.cols)
        };
        let (ob, oc, od) = (
            offset(r.start, plan.b.ld.unsigned_abs(), plan.transb, bb)?,
            offset(r.start, plan.c.ld.unsigned_abs(), CUBLAS_OP_N, cb)?,
            offset(r.start, plan.d.ld.unsigned_abs(), CUBLAS_OP_N, db)?,
        );
        // A null C (beta 0) stays null.
        let pc = if c.is_null() {
            c
        } else {
            c.cast::<u8>().wrapping_add(oc).cast::<c_void>()
        };
        Some((
            b.cast::<u8>().wrapping_add(ob).cast::<c_void>(),
            lt.make(&plan.b, brows, bcols)?,
            pc,
            lt.make(&plan.c, plan.c.rows, width)?,
            d.cast::<u8>().wrapping_add(od).cast::<c_void>(),
            lt.make(&plan.d, plan.d.rows, width)?,
        ))
    };
    let Some(prepared) = plan.pieces.iter().map(prepare).collect::<Option<Vec<_>>>() else {
        count(|s| s.gemm_uncut());
        return whole();
    };
    let done = run_pieces(&prepared, |(pb, bl, pc, cl, pd, dl)| {
        let rc = call(*pb, bl.h, *pc, cl.h, *pd, dl.h, algo);
        if rc == CUBLAS_STATUS_SUCCESS || algo.is_null() {
            return rc;
        }
        // The caller's algorithm was chosen for the whole shape; let the library choose.
        call(*pb, bl.h, *pc, cl.h, *pd, dl.h, std::ptr::null())
    });
    done.unwrap_or_else(whole)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_follow_the_storage_of_b_and_c() {
        // B not transposed (k x n, ld 768): column 160 starts 160 * 768 elements in.
        assert_eq!(offset(160, 768, CUBLAS_OP_N, 4), Some(160 * 768 * 4));
        // B transposed (stored n x k): row 160 starts 160 elements in.
        assert_eq!(offset(160, 1024, 1, 4), Some(160 * 4));
        assert_eq!(offset(u64::MAX, 2, CUBLAS_OP_N, 4), None);
    }

    #[test]
    fn the_narrow_last_piece_runs_first_and_its_refusal_runs_nothing_else() {
        let pieces = [0..16, 16..32, 32..40];
        let mut ran = Vec::new();
        assert_eq!(
            run_pieces(&pieces, |r| {
                ran.push(r.start);
                7
            }),
            None
        );
        assert_eq!(ran, [32], "only the narrow piece was tried");
        ran.clear();
        let rc = run_pieces(&pieces, |r| {
            ran.push(r.start);
            if r.start == 16 { 13 } else { 0 }
        });
        assert_eq!(rc, Some(13));
        assert_eq!(ran, [32, 0, 16], "nothing runs after a failed piece");
        assert_eq!(run_pieces(&pieces, |_| 0), Some(0));
        assert_eq!(run_pieces::<u8>(&[], |_| 0), None);
    }
}
