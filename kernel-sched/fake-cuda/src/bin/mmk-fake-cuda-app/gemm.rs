//! `mmk-fake-cuda-app gemm`: one GEMM through cuBLAS or cuBLASLt, as a program linked
//! against them calls it (the libraries loaded globally, the functions found by the
//! dynamic linker, so an interposer in `LD_PRELOAD` comes first), checked element by
//! element against the same product computed here.
//!
//! ```text
//! mmk-fake-cuda-app gemm --blas sgemm|gemmex|gemmex-f64|lt|lt-bias-relu
//!                        [--trans-b n|t] [--m M] [--n N] [--k K]
//! ```
//!
//! The matrices have leading dimensions larger than their rows (A: m + 1, B: its stored
//! rows + 2, C and D: m + 3); alpha is 1.5, beta 0.5. Prints one JSON line:
//! `{"pid","status","elements","mismatches","elapsed_ns"}`; exits 1 when the call failed
//! or any element differs.

use std::ffi::{CStr, c_int, c_void};
use std::process::ExitCode;
use std::time::Instant;

type Handle = *mut c_void;

const R_32F: c_int = 0;
const R_64F: c_int = 1;
const COMPUTE_32F: c_int = 68;
const COMPUTE_64F: c_int = 70;
const DESC_TRANSB: c_int = 4;
const DESC_EPILOGUE: c_int = 7;
const DESC_BIAS_POINTER: c_int = 8;
const EPILOGUE_RELU_BIAS: u32 = 6;

struct Args {
    blas: String,
    trans_b: bool,
    m: usize,
    n: usize,
    k: usize,
}

fn parse(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut a = Args {
        blas: "sgemm".into(),
        trans_b: false,
        m: 64,
        n: 256,
        k: 32,
    };
    while let Some(flag) = it.next() {
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let num = || {
            value
                .parse::<usize>()
                .map_err(|_| format!("{flag}: not a number: {value}"))
        };
        match flag.as_str() {
            "--blas" => a.blas = value.clone(),
            "--trans-b" => a.trans_b = value == "t",
            "--m" => a.m = num()?,
            "--n" => a.n = num()?,
            "--k" => a.k = num()?,
            other => return Err(format!("unknown flag {other}")),
        }
    }
    if !["sgemm", "gemmex", "gemmex-f64", "lt", "lt-bias-relu"].contains(&a.blas.as_str()) {
        return Err(format!("--blas: unknown {:?}", a.blas));
    }
    Ok(a)
}

trait Elem: Copy + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> + PartialOrd {
    const ZERO: Self;
    fn from_f64(v: f64) -> Self;
    fn bits(self) -> u64;
}
impl Elem for f32 {
    const ZERO: f32 = 0.0;
    fn from_f64(v: f64) -> f32 {
        v as f32
    }
    fn bits(self) -> u64 {
        u64::from(self.to_bits())
    }
}
impl Elem for f64 {
    const ZERO: f64 = 0.0;
    fn from_f64(v: f64) -> f64 {
        v
    }
    fn bits(self) -> u64 {
        self.to_bits()
    }
}

/// Deterministic values in [-1, 1) in steps of 1/64.
fn values<T: Elem>(len: usize, seed: u64) -> Vec<T> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..len)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            T::from_f64(((x >> 33) % 128) as f64 / 64.0 - 1.0)
        })
        .collect()
}

/// A symbol as a program linked against the library would get it.
unsafe fn symbol<T>(name: &CStr) -> Result<T, String> {
    // SAFETY: dlsym in the global scope with a NUL-terminated name.
    let p = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if p.is_null() {
        return Err(format!("{name:?} not found"));
    }
    // SAFETY: the caller names the right type.
    Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
}

fn check(what: &str, rc: c_int) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("{what} failed with {rc}"))
    }
}

struct Problem<T> {
    m: usize,
    n: usize,
    k: usize,
    trans_b: bool,
    lda: usize,
    ldb: usize,
    ldc: usize,
    a: Vec<T>,
    b: Vec<T>,
    c: Vec<T>,
    d: Vec<T>,
    bias: Vec<T>,
    alpha: T,
    beta: T,
}

impl<T: Elem> Problem<T> {
    fn new(a: &Args) -> Problem<T> {
        let (m, n, k) = (a.m, a.n, a.k);
        let (b_rows, b_cols) = if a.trans_b { (n, k) } else { (k, n) };
        let (lda, ldb, ldc) = (m + 1, b_rows + 2, m + 3);
        Problem {
            m,
            n,
            k,
            trans_b: a.trans_b,
            lda,
            ldb,
            ldc,
            a: values(lda * k, 1),
            b: values(ldb * b_cols, 2),
            c: values(ldc * n, 3),
            d: vec![T::ZERO; ldc * n],
            bias: values(m, 4),
            alpha: T::from_f64(1.5),
            beta: T::from_f64(0.5),
        }
    }

    /// Elements of `out` (or of C, for the in-place calls) that differ from the product
    /// computed here, in bits.
    fn mismatches(&self, out: &[T], c_in: &[T], bias_relu: bool) -> usize {
        let mut bad = 0;
        for j in 0..self.n {
            for i in 0..self.m {
                let mut acc = T::ZERO;
                for l in 0..self.k {
                    let b = if self.trans_b {
                        self.b[j + l * self.ldb]
                    } else {
                        self.b[l + j * self.ldb]
                    };
                    acc = acc + self.a[i + l * self.lda] * b;
                }
                let mut v = self.alpha * acc + self.beta * c_in[i + j * self.ldc];
                if bias_relu {
                    v = v + self.bias[i];
                    if v < T::ZERO {
                        v = T::ZERO;
                    }
                }
                if v.bits() != out[i + j * self.ldc].bits() {
                    bad += 1;
                }
            }
        }
        bad
    }
}

type Create = unsafe extern "C" fn(*mut Handle) -> c_int;
type SetStream = unsafe extern "C" fn(Handle, Handle) -> c_int;
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
) -> c_int;
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
) -> c_int;
type DescCreate = unsafe extern "C" fn(*mut Handle, c_int, c_int) -> c_int;
type DescSet = unsafe extern "C" fn(Handle, c_int, *const c_void, usize) -> c_int;
type LayoutCreate = unsafe extern "C" fn(*mut Handle, c_int, u64, u64, i64) -> c_int;
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
) -> c_int;

/// Run the call on `stream`; returns the output and the C it read.
unsafe fn call<T: Elem>(
    args: &Args,
    p: &mut Problem<T>,
    stream: Handle,
    dtype: c_int,
) -> Result<Vec<T>, String> {
    let (m, n, k) = (p.m as c_int, p.n as c_int, p.k as c_int);
    let tb = c_int::from(p.trans_b);
    let (lda, ldb, ldc) = (p.lda as c_int, p.ldb as c_int, p.ldc as c_int);
    // SAFETY: the cuBLAS API's contracts, with buffers of the sizes the call reads.
    unsafe {
        match args.blas.as_str() {
            "sgemm" | "gemmex" | "gemmex-f64" => {
                let mut h: Handle = std::ptr::null_mut();
                check(
                    "cublasCreate_v2",
                    symbol::<Create>(c"cublasCreate_v2")?(&mut h),
                )?;
                check(
                    "cublasSetStream_v2",
                    symbol::<SetStream>(c"cublasSetStream_v2")?(h, stream),
                )?;
                let (alpha, beta) = (&p.alpha as *const T, &p.beta as *const T);
                let c = p.c.as_mut_ptr();
                if args.blas == "sgemm" {
                    check(
                        "cublasSgemm_v2",
                        symbol::<Sgemm>(c"cublasSgemm_v2")?(
                            h,
                            0,
                            tb,
                            m,
                            n,
                            k,
                            alpha.cast(),
                            p.a.as_ptr().cast(),
                            lda,
                            p.b.as_ptr().cast(),
                            ldb,
                            beta.cast(),
                            c.cast(),
                            ldc,
                        ),
                    )?;
                } else {
                    let compute = if dtype == R_64F {
                        COMPUTE_64F
                    } else {
                        COMPUTE_32F
                    };
                    check(
                        "cublasGemmEx",
                        symbol::<GemmEx>(c"cublasGemmEx")?(
                            h,
                            0,
                            tb,
                            m,
                            n,
                            k,
                            alpha.cast(),
                            p.a.as_ptr().cast(),
                            dtype,
                            lda,
                            p.b.as_ptr().cast(),
                            dtype,
                            ldb,
                            beta.cast(),
                            c.cast(),
                            dtype,
                            ldc,
                            compute,
                            -1,
                        ),
                    )?;
                }
                Ok(p.c.clone())
            }
            _ => call_lt(args, p, stream, dtype),
        }
    }
}

/// [`call`] through cuBLASLt (`lt`, `lt-bias-relu`).
unsafe fn call_lt<T: Elem>(
    args: &Args,
    p: &mut Problem<T>,
    stream: Handle,
    dtype: c_int,
) -> Result<Vec<T>, String> {
    let tb = c_int::from(p.trans_b);
    // SAFETY: the cuBLASLt API's contracts, with buffers of the sizes the call reads.
    unsafe {
        let mut h: Handle = std::ptr::null_mut();
        check(
            "cublasLtCreate",
            symbol::<Create>(c"cublasLtCreate")?(&mut h),
        )?;
        let mut desc: Handle = std::ptr::null_mut();
        check(
            "cublasLtMatmulDescCreate",
            symbol::<DescCreate>(c"cublasLtMatmulDescCreate")?(&mut desc, COMPUTE_32F, R_32F),
        )?;
        let set = symbol::<DescSet>(c"cublasLtMatmulDescSetAttribute")?;
        let tb32: i32 = tb;
        check(
            "set TRANSB",
            set(desc, DESC_TRANSB, (&tb32 as *const i32).cast(), 4),
        )?;
        if args.blas == "lt-bias-relu" {
            let epilogue = EPILOGUE_RELU_BIAS;
            check(
                "set EPILOGUE",
                set(desc, DESC_EPILOGUE, (&epilogue as *const u32).cast(), 4),
            )?;
            let bias = p.bias.as_ptr() as usize;
            check(
                "set BIAS_POINTER",
                set(desc, DESC_BIAS_POINTER, (&bias as *const usize).cast(), 8),
            )?;
        }
        let layout = symbol::<LayoutCreate>(c"cublasLtMatrixLayoutCreate")?;
        let mut l = [std::ptr::null_mut(); 4];
        let (b_rows, b_cols) = if p.trans_b { (p.n, p.k) } else { (p.k, p.n) };
        let shapes = [
            (p.m, p.k, p.lda),
            (b_rows, b_cols, p.ldb),
            (p.m, p.n, p.ldc),
            (p.m, p.n, p.ldc),
        ];
        for (slot, (r, c, ld)) in l.iter_mut().zip(shapes) {
            check(
                "cublasLtMatrixLayoutCreate",
                layout(slot, dtype, r as u64, c as u64, ld as i64),
            )?;
        }
        // The caller's algorithm: a real program passes one from the heuristic.
        let algo = [0u64; 8];
        check(
            "cublasLtMatmul",
            symbol::<LtMatmul>(c"cublasLtMatmul")?(
                h,
                desc,
                (&p.alpha as *const T).cast(),
                p.a.as_ptr().cast(),
                l[0],
                p.b.as_ptr().cast(),
                l[1],
                (&p.beta as *const T).cast(),
                p.c.as_ptr().cast(),
                l[2],
                p.d.as_mut_ptr().cast(),
                l[3],
                algo.as_ptr().cast(),
                std::ptr::null_mut(),
                0,
                stream,
            ),
        )?;
        Ok(p.d.clone())
    }
}

/// Run `gemm` mode: `sync` waits for `stream`.
///
/// # Safety
/// `stream` is a stream of the current context; `sync` is cuStreamSynchronize.
pub unsafe fn run(
    args: impl Iterator<Item = String>,
    stream: Handle,
    sync: impl Fn(Handle) -> c_int,
) -> ExitCode {
    let args = match parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("mmk-fake-cuda-app gemm: {e}");
            return ExitCode::from(2);
        }
    };
    for lib in [c"libcublas.so.13", c"libcublasLt.so.13"] {
        // SAFETY: dlopen with a constant name.
        if unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }.is_null() {
            eprintln!("mmk-fake-cuda-app gemm: dlopen({lib:?}) failed");
            return ExitCode::from(1);
        }
    }
    let started = Instant::now();
    let f64_mode = args.blas == "gemmex-f64";
    let bias_relu = args.blas == "lt-bias-relu";
    // SAFETY: the caller's stream; buffers live in the problem for the call.
    let result = unsafe {
        if f64_mode {
            let mut p = Problem::<f64>::new(&args);
            let c_in = p.c.clone();
            call(&args, &mut p, stream, R_64F).map(|out| {
                sync(stream);
                (p.mismatches(&out, &c_in, bias_relu), p.m * p.n)
            })
        } else {
            let mut p = Problem::<f32>::new(&args);
            let c_in = p.c.clone();
            call(&args, &mut p, stream, R_32F).map(|out| {
                sync(stream);
                (p.mismatches(&out, &c_in, bias_relu), p.m * p.n)
            })
        }
    };
    let (status, elements, mismatches) = match result {
        Ok((bad, n)) => ("ok".to_owned(), n, bad),
        Err(e) => (e, 0, 0),
    };
    println!(
        "{{\"pid\":{},\"status\":{status:?},\"elements\":{elements},\"mismatches\":{mismatches},\"elapsed_ns\":{}}}",
        std::process::id(),
        started.elapsed().as_nanos()
    );
    if status == "ok" && mismatches == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
