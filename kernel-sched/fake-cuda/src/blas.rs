//! A fake cuBLAS and cuBLASLt (tests install the library as `libcublas.so.13` and
//! `libcublasLt.so.13` too): enough to run GEMMs through the interposer's GEMM hooks and
//! check what they do to them.
//!
//! - "Device" pointers are host memory: a GEMM is computed on the CPU when it is called,
//!   column-major, each element summed over K in order, so the same column always gets the
//!   same bits however the call is cut.
//! - Each call also launches one kernel, `fake_gemm`, through the driver (reached like
//!   cudart reaches it: `dlopen("libcuda.so.1")` and `cuGetProcAddress`, so an interposer
//!   sees the launch) on the handle's stream, running 1 us per `MMK_FAKE_CUBLAS_MFLOP_PER_US`
//!   million floating-point operations (default 1: 1 TFLOP/s), with one block per 128 x 128
//!   tile of the result.
//! - Shapes are checked as the real library checks them (`CUBLAS_STATUS_INVALID_VALUE`):
//!   dimensions, leading dimensions, and for cuBLASLt that the layouts of A, B, C and D
//!   agree with m, n, k and the transposes.
//! - Supported: `cublasSgemm_v2`; `cublasGemmEx` and `cublasLtMatmul` in fp32 or fp64
//!   (`CUBLAS_STATUS_NOT_SUPPORTED` otherwise), host pointer mode; cuBLASLt epilogues
//!   DEFAULT, RELU, BIAS, RELU_BIAS (bias of D's type, one per row).

use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::OnceLock;

use crate::{CUresult, DriverLaunch, Handle, SUCCESS, runtime_driver};

type Status = c_int;
const OK: Status = 0;
const NOT_INITIALIZED: Status = 1;
const INVALID_VALUE: Status = 7;
const EXECUTION_FAILED: Status = 13;
const NOT_SUPPORTED: Status = 15;

const OP_N: c_int = 0;
const R_32F: c_int = 0;
const R_64F: c_int = 1;

const DESC_TRANSA: c_int = 3;
const DESC_TRANSB: c_int = 4;
const DESC_TRANSC: c_int = 5;
const DESC_EPILOGUE: c_int = 7;
const DESC_BIAS_POINTER: c_int = 8;
const LAYOUT_TYPE: c_int = 0;
const LAYOUT_ORDER: c_int = 1;
const LAYOUT_ROWS: c_int = 2;
const LAYOUT_COLS: c_int = 3;
const LAYOUT_LD: c_int = 4;
const LAYOUT_BATCH_COUNT: c_int = 5;

const EPILOGUE_DEFAULT: u32 = 1;
const EPILOGUE_RELU: u32 = 2;
const EPILOGUE_BIAS: u32 = 4;
const EPILOGUE_RELU_BIAS: u32 = 6;

// ---- the kernel each call launches ----

/// `fake_gemm`, loaded through the driver the runtime reaches (`runtime_driver`).
fn kernel() -> Option<Handle> {
    static KERNEL: OnceLock<Option<usize>> = OnceLock::new();
    KERNEL
        .get_or_init(|| {
            let d =
                runtime_driver().filter(|d| d.module_load != 0 && d.module_get_function != 0)?;
            type Load = unsafe extern "C" fn(*mut Handle, *const c_void) -> CUresult;
            type Get = unsafe extern "C" fn(*mut Handle, Handle, *const c_char) -> CUresult;
            let mut module: Handle = std::ptr::null_mut();
            let mut function: Handle = std::ptr::null_mut();
            // SAFETY: the driver's cuModuleLoadData and cuModuleGetFunction with valid out
            // pointers and NUL-terminated text.
            let ok = unsafe {
                std::mem::transmute::<usize, Load>(d.module_load)(
                    &mut module,
                    c"fake_gemm 2\n".as_ptr().cast(),
                ) == SUCCESS
                    && std::mem::transmute::<usize, Get>(d.module_get_function)(
                        &mut function,
                        module,
                        c"fake_gemm".as_ptr(),
                    ) == SUCCESS
            };
            ok.then_some(function as usize)
        })
        .map(|f| f as Handle)
}

/// Launch the kernel that stands for an `m x n x k` GEMM on `stream`.
fn launch(m: u64, n: u64, k: u64, stream: Handle) -> Status {
    let (Some(function), Some(d)) = (kernel(), runtime_driver().filter(|d| d.launch != 0)) else {
        return NOT_INITIALIZED;
    };
    let mflop_per_us = std::env::var("MMK_FAKE_CUBLAS_MFLOP_PER_US")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .filter(|&v| v > 0)
        .unwrap_or(1);
    let mut duration_us: u64 = (2 * m * n * k).div_ceil(1_000_000 * mflop_per_us).max(1);
    let tiles = m.div_ceil(128) * n.div_ceil(128);
    let grid = c_uint::try_from(tiles.max(1)).unwrap_or(c_uint::MAX);
    let mut params = [(&mut duration_us as *mut u64).cast::<c_void>()];
    // SAFETY: the driver's cuLaunchKernel (or an interposer's hook for it) with our
    // function and a parameter array that outlives the call.
    let rc = unsafe {
        std::mem::transmute::<usize, DriverLaunch>(d.launch)(
            function,
            grid,
            1,
            1,
            128,
            1,
            1,
            0,
            stream,
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if rc == SUCCESS { OK } else { EXECUTION_FAILED }
}

// ---- the arithmetic ----

trait Elem: Copy + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + PartialOrd {
    const ZERO: Self;
}
impl Elem for f32 {
    const ZERO: f32 = 0.0;
}
impl Elem for f64 {
    const ZERO: f64 = 0.0;
}

/// One column-major operand: base pointer, leading dimension, transposed or not.
#[derive(Clone, Copy)]
struct Operand {
    ptr: *const c_void,
    ld: usize,
    trans: bool,
}

impl Operand {
    /// Element (row i, column j) of op(X).
    ///
    /// # Safety
    /// The operand holds op(X)'s element (i, j) of type T.
    unsafe fn at<T: Copy>(&self, i: usize, j: usize) -> T {
        let index = if self.trans {
            j + i * self.ld
        } else {
            i + j * self.ld
        };
        // SAFETY: the caller's promise.
        unsafe { *self.ptr.cast::<T>().add(index) }
    }
}

/// What a call computes: `D = alpha op(A) op(B) + beta C`, then the epilogue. Scalars
/// and the bias are read as the element type the call runs in ([`Gemm::run`]).
struct Gemm {
    m: usize,
    n: usize,
    k: usize,
    /// Host scalars (host pointer mode); a null beta is 0.
    alpha: *const c_void,
    beta: *const c_void,
    a: Operand,
    b: Operand,
    c: Operand,
    d: *mut c_void,
    ldd: usize,
    /// One element per row, or null.
    bias: *const c_void,
    relu: bool,
}

impl Gemm {
    /// # Safety
    /// Every pointer holds what its shape and leading dimension say, in elements of T.
    unsafe fn run<T: Elem>(&self) {
        // SAFETY: host scalars of type T.
        let (alpha, beta) = unsafe {
            (
                *self.alpha.cast::<T>(),
                if self.beta.is_null() {
                    T::ZERO
                } else {
                    *self.beta.cast::<T>()
                },
            )
        };
        let bias = self.bias.cast::<T>();
        for j in 0..self.n {
            for i in 0..self.m {
                let mut acc = T::ZERO;
                for l in 0..self.k {
                    // SAFETY: within the shapes the caller checked.
                    acc = acc + unsafe { self.a.at::<T>(i, l) * self.b.at::<T>(l, j) };
                }
                let mut v = alpha * acc;
                if beta != T::ZERO {
                    // SAFETY: as above.
                    v = v + beta * unsafe { self.c.at::<T>(i, j) };
                }
                if !bias.is_null() {
                    // SAFETY: one bias element per row.
                    v = v + unsafe { *bias.add(i) };
                }
                if self.relu && v < T::ZERO {
                    v = T::ZERO;
                }
                // SAFETY: within D's shape.
                unsafe { *self.d.cast::<T>().add(i + j * self.ldd) = v };
            }
        }
    }
}

/// The classic BLAS argument checks: non-negative sizes, leading dimensions at least the
/// stored rows.
fn dense_args_ok(ta: c_int, tb: c_int, m: c_int, n: c_int, k: c_int, ld: [c_int; 3]) -> bool {
    let rows = |trans: c_int, r: c_int, c: c_int| if trans == OP_N { r } else { c };
    m >= 0
        && n >= 0
        && k >= 0
        && (0..=2).contains(&ta)
        && (0..=2).contains(&tb)
        && ld[0] >= rows(ta, m, k).max(1)
        && ld[1] >= rows(tb, k, n).max(1)
        && ld[2] >= m.max(1)
}

// ---- cuBLAS ----

/// A cuBLAS handle: the stream its calls go to.
struct BlasHandle {
    stream: Handle,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasCreate_v2(handle: *mut Handle) -> Status {
    if handle.is_null() {
        return INVALID_VALUE;
    }
    let h = Box::into_raw(Box::new(BlasHandle {
        stream: std::ptr::null_mut(),
    }));
    // SAFETY: checked non-null.
    unsafe { *handle = h.cast() };
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasSetStream_v2(handle: Handle, stream: Handle) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    // SAFETY: a handle this library made.
    unsafe { (*handle.cast::<BlasHandle>()).stream = stream };
    OK
}

/// # Safety
/// The caller's GEMM arguments, checked with [`dense_args_ok`].
#[allow(clippy::too_many_arguments)]
unsafe fn dense<T: Elem>(
    handle: Handle,
    ta: c_int,
    tb: c_int,
    [m, n, k]: [c_int; 3],
    alpha: *const T,
    a: *const c_void,
    lda: c_int,
    b: *const c_void,
    ldb: c_int,
    beta: *const T,
    c: *mut c_void,
    ldc: c_int,
) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    if !dense_args_ok(ta, tb, m, n, k, [lda, ldb, ldc]) || alpha.is_null() || beta.is_null() {
        return INVALID_VALUE;
    }
    let us = |x: c_int| x as usize;
    let gemm = Gemm {
        m: us(m),
        n: us(n),
        k: us(k),
        alpha: alpha.cast(),
        beta: beta.cast(),
        a: Operand {
            ptr: a,
            ld: us(lda),
            trans: ta != OP_N,
        },
        b: Operand {
            ptr: b,
            ld: us(ldb),
            trans: tb != OP_N,
        },
        c: Operand {
            ptr: c,
            ld: us(ldc),
            trans: false,
        },
        d: c,
        ldd: us(ldc),
        bias: std::ptr::null(),
        relu: false,
    };
    // SAFETY: the shapes were checked; the pointers are the caller's, holding T.
    unsafe { gemm.run::<T>() };
    // SAFETY: a handle this library made.
    let stream = unsafe { (*handle.cast::<BlasHandle>()).stream };
    launch(m as u64, n as u64, k as u64, stream)
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasSgemm_v2(
    handle: Handle,
    ta: c_int,
    tb: c_int,
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
    // SAFETY: the caller's arguments.
    unsafe {
        dense::<f32>(
            handle,
            ta,
            tb,
            [m, n, k],
            alpha,
            a.cast(),
            lda,
            b.cast(),
            ldb,
            beta,
            c.cast(),
            ldc,
        )
    }
}

#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn cublasGemmEx(
    handle: Handle,
    ta: c_int,
    tb: c_int,
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
    _compute: c_int,
    _algo: c_int,
) -> Status {
    let dims = [m, n, k];
    // SAFETY: the caller's arguments, of the type they name.
    unsafe {
        match (atype, btype, ctype) {
            (R_32F, R_32F, R_32F) => dense::<f32>(
                handle,
                ta,
                tb,
                dims,
                alpha.cast(),
                a,
                lda,
                b,
                ldb,
                beta.cast(),
                c,
                ldc,
            ),
            (R_64F, R_64F, R_64F) => dense::<f64>(
                handle,
                ta,
                tb,
                dims,
                alpha.cast(),
                a,
                lda,
                b,
                ldb,
                beta.cast(),
                c,
                ldc,
            ),
            _ => NOT_SUPPORTED,
        }
    }
}

// ---- cuBLASLt ----

#[derive(Debug, Default)]
struct MatmulDesc {
    transa: i32,
    transb: i32,
    transc: i32,
    epilogue: u32,
    bias: usize,
}

/// A layout as `cublasLtMatrixLayoutCreate` makes it: column-major, one matrix (this fake
/// has no way to change either).
#[derive(Debug)]
struct MatrixLayout {
    dtype: u32,
    rows: u64,
    cols: u64,
    ld: i64,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasLtCreate(handle: *mut Handle) -> Status {
    if handle.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: checked non-null; the handle is never looked into.
    unsafe { *handle = Box::into_raw(Box::new(0u64)).cast() };
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasLtMatmulDescCreate(
    desc: *mut Handle,
    _compute: c_int,
    _scale: c_int,
) -> Status {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    let d = MatmulDesc {
        epilogue: EPILOGUE_DEFAULT,
        ..MatmulDesc::default()
    };
    // SAFETY: checked non-null.
    unsafe { *desc = Box::into_raw(Box::new(d)).cast() };
    OK
}

/// Copy `value` out as the attribute's bytes (`size` must be exactly its size).
///
/// # Safety
/// `buf` holds `size` bytes; `written` is null or valid.
unsafe fn put<T: Copy>(value: T, buf: *mut c_void, size: usize, written: *mut usize) -> Status {
    if !written.is_null() {
        // SAFETY: the caller's pointer.
        unsafe { *written = std::mem::size_of::<T>() };
    }
    if buf.is_null() || size != std::mem::size_of::<T>() {
        return INVALID_VALUE;
    }
    // SAFETY: size checked.
    unsafe { buf.cast::<T>().write_unaligned(value) };
    OK
}

/// # Safety
/// `buf` holds `size` bytes.
unsafe fn take<T: Copy>(buf: *const c_void, size: usize) -> Option<T> {
    // SAFETY: size checked.
    (!buf.is_null() && size == std::mem::size_of::<T>())
        .then(|| unsafe { buf.cast::<T>().read_unaligned() })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasLtMatmulDescSetAttribute(
    desc: Handle,
    attr: c_int,
    buf: *const c_void,
    size: usize,
) -> Status {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a descriptor this library made; the caller's buffer.
    unsafe {
        let d = &mut *desc.cast::<MatmulDesc>();
        let set = match attr {
            DESC_TRANSA => take::<i32>(buf, size).map(|v| d.transa = v),
            DESC_TRANSB => take::<i32>(buf, size).map(|v| d.transb = v),
            DESC_TRANSC => take::<i32>(buf, size).map(|v| d.transc = v),
            DESC_EPILOGUE => take::<u32>(buf, size).map(|v| d.epilogue = v),
            DESC_BIAS_POINTER => take::<usize>(buf, size).map(|v| d.bias = v),
            _ => Some(()),
        };
        if set.is_some() { OK } else { INVALID_VALUE }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasLtMatmulDescGetAttribute(
    desc: Handle,
    attr: c_int,
    buf: *mut c_void,
    size: usize,
    written: *mut usize,
) -> Status {
    if desc.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a descriptor this library made; the caller's buffers.
    unsafe {
        let d = &*desc.cast::<MatmulDesc>();
        match attr {
            DESC_TRANSA => put(d.transa, buf, size, written),
            DESC_TRANSB => put(d.transb, buf, size, written),
            DESC_TRANSC => put(d.transc, buf, size, written),
            DESC_EPILOGUE => put(d.epilogue, buf, size, written),
            DESC_BIAS_POINTER => put(d.bias, buf, size, written),
            _ => INVALID_VALUE,
        }
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasLtMatrixLayoutCreate(
    layout: *mut Handle,
    dtype: c_int,
    rows: u64,
    cols: u64,
    ld: i64,
) -> Status {
    if layout.is_null() {
        return INVALID_VALUE;
    }
    let l = MatrixLayout {
        dtype: dtype as u32,
        rows,
        cols,
        ld,
    };
    // SAFETY: checked non-null.
    unsafe { *layout = Box::into_raw(Box::new(l)).cast() };
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasLtMatrixLayoutDestroy(layout: Handle) -> Status {
    if !layout.is_null() {
        // SAFETY: a layout this library made, destroyed once.
        drop(unsafe { Box::from_raw(layout.cast::<MatrixLayout>()) });
    }
    OK
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cublasLtMatrixLayoutGetAttribute(
    layout: Handle,
    attr: c_int,
    buf: *mut c_void,
    size: usize,
    written: *mut usize,
) -> Status {
    if layout.is_null() {
        return INVALID_VALUE;
    }
    // SAFETY: a layout this library made; the caller's buffers.
    unsafe {
        let l = &*layout.cast::<MatrixLayout>();
        match attr {
            LAYOUT_TYPE => put(l.dtype, buf, size, written),
            LAYOUT_ORDER => put(0i32, buf, size, written), // CUBLASLT_ORDER_COL
            LAYOUT_ROWS => put(l.rows, buf, size, written),
            LAYOUT_COLS => put(l.cols, buf, size, written),
            LAYOUT_LD => put(l.ld, buf, size, written),
            LAYOUT_BATCH_COUNT => put(1i32, buf, size, written),
            _ => INVALID_VALUE,
        }
    }
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
    _algo: *const c_void,
    _workspace: *mut c_void,
    _workspace_bytes: usize,
    stream: Handle,
) -> Status {
    if handle.is_null() {
        return NOT_INITIALIZED;
    }
    if [desc, adesc, bdesc, cdesc, ddesc]
        .iter()
        .any(|h| h.is_null())
        || alpha.is_null()
    {
        return INVALID_VALUE;
    }
    // SAFETY: descriptors and layouts this library made.
    let (op, [al, bl, cl, dl]) = unsafe {
        (
            &*desc.cast::<MatmulDesc>(),
            [adesc, bdesc, cdesc, ddesc].map(|h| &*h.cast::<MatrixLayout>()),
        )
    };
    let (m, n) = (dl.rows, dl.cols);
    let k = if op.transa == OP_N { al.cols } else { al.rows };
    let stored = |trans: i32, r: u64, c: u64| if trans == OP_N { (r, c) } else { (c, r) };
    let agree = (al.rows, al.cols) == stored(op.transa, m, k)
        && (bl.rows, bl.cols) == stored(op.transb, k, n)
        && (cl.rows, cl.cols) == (m, n)
        && [al, bl, cl, dl]
            .iter()
            .all(|l| l.ld >= l.rows.max(1) as i64);
    if !agree || op.transc != OP_N {
        return INVALID_VALUE;
    }
    let relu = matches!(op.epilogue, EPILOGUE_RELU | EPILOGUE_RELU_BIAS);
    let with_bias = matches!(op.epilogue, EPILOGUE_BIAS | EPILOGUE_RELU_BIAS);
    if !matches!(op.epilogue, EPILOGUE_DEFAULT) && !relu && !with_bias || with_bias && op.bias == 0
    {
        return NOT_SUPPORTED;
    }
    let (Ok(mu), Ok(nu), Ok(ku)) = (usize::try_from(m), usize::try_from(n), usize::try_from(k))
    else {
        return INVALID_VALUE;
    };
    let operand = |ptr: *const c_void, l: &MatrixLayout, trans: bool| Operand {
        ptr,
        ld: l.ld as usize,
        trans,
    };
    let gemm = Gemm {
        m: mu,
        n: nu,
        k: ku,
        alpha,
        beta,
        a: operand(a, al, op.transa != OP_N),
        b: operand(b, bl, op.transb != OP_N),
        c: operand(c, cl, false),
        d,
        ldd: dl.ld as usize,
        bias: if with_bias {
            op.bias as *const c_void
        } else {
            std::ptr::null()
        },
        relu,
    };
    // SAFETY: shapes checked; host pointer mode; the caller's matrices, of the type their
    // layouts name.
    unsafe {
        match [al, bl, cl, dl].map(|l| l.dtype as c_int) {
            [R_32F, R_32F, R_32F, R_32F] => gemm.run::<f32>(),
            [R_64F, R_64F, R_64F, R_64F] => gemm.run::<f64>(),
            _ => return NOT_SUPPORTED,
        }
    }
    launch(m, n, k, stream)
}
