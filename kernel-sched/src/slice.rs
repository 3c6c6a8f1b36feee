//! Slicing an offline job's long GEMMs at the library call.
//!
//! A launch gate decides when a kernel starts; it cannot stop one that runs. A 1 ms GEMM
//! of a training step that is already on the GPU when an online request arrives shares the
//! SMs with that request until it ends (docs/kernel-sched.md, "Cutting long GEMMs").
//! The interposer therefore cuts an offline job's large cuBLAS GEMMs into
//! several smaller ones before they reach the driver; each piece is an ordinary launch,
//! which the gate may hold while online work is in flight.
//!
//! The cut is along N, the columns of the result (cuBLAS is column-major): columns of
//! `C = alpha op(A) op(B) + beta C` depend only on the same columns of `op(B)` and `C`, so
//! each piece is a GEMM of its own on sub-matrices that need no copy (a pointer offset and
//! the same leading dimensions). The library may pick another kernel for the narrower
//! shape, so results can differ in rounding. A per-row epilogue (bias, ReLU, GELU) and a
//! per-row alpha apply to every piece alike.

use std::ops::Range;

/// Piece widths are multiples of this many columns, so that a piece's pointers keep the
/// 16-byte (or better) alignment that vectorized GEMM kernels want for any element size up
/// to 8 bytes (16 x 1 element along a transposed B).
pub const COLUMN_ALIGN: u64 = 16;

/// A GEMM is cut into at most this many pieces, whatever the limit: each piece costs a
/// library call and a launch.
pub const MAX_PIECES: u64 = 64;

/// Floating-point operations of an `m x n x k` GEMM (a multiply and an add each).
pub fn gemm_flop(m: u64, n: u64, k: u64) -> u128 {
    (2 * u128::from(m))
        .saturating_mul(u128::from(n))
        .saturating_mul(u128::from(k))
}

/// The column ranges an `m x n x k` GEMM is cut into so that no piece does more than
/// `max_mflop` million floating-point operations (0: never cut). The pieces are as even as
/// [`COLUMN_ALIGN`] allows, in order, and cover `0..n` exactly; a GEMM that is small
/// enough, or too narrow to cut, is one piece. A piece does more than the limit only when
/// [`COLUMN_ALIGN`] columns already do, or when [`MAX_PIECES`] pieces are not enough.
pub fn column_slices(m: u64, n: u64, k: u64, max_mflop: u64) -> Vec<Range<u64>> {
    #[allow(clippy::single_range_in_vec_init)] // one piece: the whole range
    let whole = vec![0..n];
    if max_mflop == 0 || n < 2 * COLUMN_ALIGN {
        return whole;
    }
    let max = u128::from(max_mflop) * 1_000_000;
    let flop = gemm_flop(m, n, k);
    if flop <= max {
        return whole;
    }
    // The widest aligned piece within the limit, then as many pieces as that needs,
    // evened out (rounding a width up to the alignment never passes the widest).
    let within = u64::try_from(u128::from(n) * max / flop).unwrap_or(n);
    let widest = (within / COLUMN_ALIGN * COLUMN_ALIGN).max(COLUMN_ALIGN);
    let pieces = n.div_ceil(widest).min(MAX_PIECES);
    let width = n.div_ceil(pieces).div_ceil(COLUMN_ALIGN) * COLUMN_ALIGN;
    if width >= n {
        return whole;
    }
    let mut out = Vec::with_capacity(usize::try_from(n.div_ceil(width)).unwrap_or(0));
    let mut start = 0;
    while start < n {
        let end = start.saturating_add(width).min(n);
        out.push(start..end);
        start = end;
    }
    out
}

/// Bytes of one element of a `cudaDataType` the slicer handles (real 16-, 32- and 64-bit
/// floating point); `None` for the rest (integers, complex, FP8), which are not cut.
pub fn element_bytes(cuda_data_type: i32) -> Option<u64> {
    match cuda_data_type {
        0 => Some(4),      // CUDA_R_32F
        1 => Some(8),      // CUDA_R_64F
        2 | 14 => Some(2), // CUDA_R_16F, CUDA_R_16BF
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covers(slices: &[Range<u64>], n: u64) -> bool {
        slices.first().map(|r| r.start) == Some(0)
            && slices.last().map(|r| r.end) == Some(n)
            && slices.windows(2).all(|w| w[0].end == w[1].start)
            && slices.iter().all(|r| r.start < r.end)
    }

    #[test]
    fn bert_vocabulary_projection_is_cut_into_pieces_under_the_limit() {
        // The forward GEMM of BERT-base's masked-LM head at batch 8 x 128 (column-major:
        // m = 30522 words, n = 1024 tokens, k = 768): 48 GFLOP, about 1 ms in fp32 on an
        // H200.
        let (m, n, k) = (30_522, 1024, 768);
        let s = column_slices(m, n, k, 8_000);
        assert!(covers(&s, n), "{s:?}");
        assert_eq!(s.len(), 7, "{s:?}");
        for r in &s {
            assert_eq!(r.start % COLUMN_ALIGN, 0, "{s:?}");
            assert!(
                gemm_flop(m, r.end - r.start, k) <= 8_000 * 1_000_000,
                "{r:?}"
            );
        }
    }

    #[test]
    fn small_narrow_or_unlimited_gemms_stay_whole() {
        assert_eq!(column_slices(4096, 4096, 4096, 0), vec![0..4096]);
        assert_eq!(
            column_slices(768, 1024, 768, 8_000),
            vec![0..1024],
            "1.2 GFLOP"
        );
        assert_eq!(
            column_slices(1 << 20, 31, 1 << 20, 1),
            vec![0..31],
            "too narrow"
        );
    }

    #[test]
    fn pieces_are_aligned_and_even_and_the_last_takes_the_rest() {
        // 2 GFLOP at 0.5 GFLOP a piece: 250 columns fit, 240 aligned, so 5 pieces.
        let s = column_slices(1000, 1000, 1000, 500);
        assert_eq!(s, vec![0..208, 208..416, 416..624, 624..832, 832..1000]);
        // A limit below one aligned column group gives pieces of COLUMN_ALIGN columns.
        let s = column_slices(1000, 64, 1000, 1);
        assert_eq!(s, vec![0..16, 16..32, 32..48, 48..64]);
        assert!(covers(&s, 64));
    }

    #[test]
    fn huge_shapes_do_not_overflow_and_stop_at_the_piece_cap() {
        let n = u64::from(u32::MAX);
        let s = column_slices(u64::from(u32::MAX), n, u64::from(u32::MAX), 1);
        assert!(covers(&s, n));
        assert_eq!(s.len() as u64, MAX_PIECES);
        let s = column_slices(u64::MAX, u64::MAX, u64::MAX, 1);
        assert!(covers(&s, u64::MAX));
        assert_eq!(s.len() as u64, MAX_PIECES);
    }

    #[test]
    fn element_sizes_of_the_types_that_are_cut() {
        assert_eq!(element_bytes(0), Some(4));
        assert_eq!(element_bytes(1), Some(8));
        assert_eq!(element_bytes(2), Some(2));
        assert_eq!(element_bytes(14), Some(2));
        for other in [3, 4, 10, 28] {
            assert_eq!(element_bytes(other), None, "{other}");
        }
    }
}
