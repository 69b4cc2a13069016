//! Attention's scores and weighted sums with AVX-512 F: `avx2`'s loops at twice the
//! width, for CPUs that have it. A key of 64 values is four vectors instead of eight, so a
//! score costs half the conversions, loads and multiply-adds, and the weighted sums keep a
//! head's 64 outputs in four registers across all positions instead of going over the
//! positions once per band of 16. The operations per score and per output are the same as
//! `avx2`'s, in the same order (so, as those, bit-identical to the portable loops):
//! `dot_fixed`'s 64 accumulators are four vectors' lanes, its halving tree the same sums.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::avx2::{PositionDot, scores_with, sums_fit};
use crate::vector::KvValue;

/// Whether this CPU runs these loops (AVX-512 F with AVX2, FMA and F16C).
pub(crate) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && crate::isa::has_avx2()
}

/// `avx2::scores` with AVX-512: for every head `h < G` and every position `j` below
/// `len` rounded down to a multiple of eight, `scores[h * len + j]` is `q[h]` dotted with
/// `keys[j * stride..][..D]`, times `scale`; returns that count (the caller does the rest).
///
/// # Safety
/// The CPU has AVX-512 F, AVX2, FMA and F16C ([`available`]).
///
/// # Panics
/// When `keys` holds fewer than the positions it scores or `scores` fewer than `G * len`
/// values.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn scores<const D: usize, const G: usize, T: KvValue>(
    q: &[&[f32; D]; G],
    keys: &[T],
    values: &[T],
    stride: usize,
    scale: f32,
    len: usize,
    scores: &mut [f32],
) -> usize {
    // SAFETY: the CPU has AVX2, FMA, F16C and what `Avx512Dot` needs (the caller's).
    unsafe { scores_with::<Avx512Dot, D, G, T>(q, keys, values, stride, scale, len, scores) }
}

/// The AVX-512 dot product.
struct Avx512Dot;

impl PositionDot for Avx512Dot {
    /// `dot_fixed`'s accumulators for one position summed down to eight lanes. Its 64 lanes are
    /// four vectors here (`m` holds lanes `16m..16m + 16`), and its halving tree's widths 32, 16
    /// and 8 are the same sums: vector 0 + 2 and 1 + 3, then the two, then the halves.
    ///
    /// # Safety
    /// The CPU has AVX-512 F, AVX2, FMA and F16C; `k` points at `D` readable values.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    unsafe fn dot<const D: usize, T: KvValue>(q: &[f32; D], k: *const T) -> __m256 {
        let mut acc = [_mm512_setzero_ps(); 4];
        for c in 0..D / 64 {
            for (m, acc) in acc.iter_mut().enumerate() {
                let at = c * 64 + 16 * m;
                // SAFETY: `at + 16 <= D`: within `q`, and within `k`'s `D` values (the caller's).
                let (a, b) = unsafe { (_mm512_loadu_ps(q.as_ptr().add(at)), load16(k.add(at))) };
                *acc = _mm512_fmadd_ps(a, b, *acc);
            }
        }
        let wide = _mm512_add_ps(_mm512_add_ps(acc[0], acc[2]), _mm512_add_ps(acc[1], acc[3]));
        let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(wide)));
        _mm256_add_ps(_mm512_castps512_ps256(wide), high)
    }
}

/// `avx2::weighted_sums` with AVX-512: `out[h * D + d] = Σ_j scores[h * len + j] *
/// values[j * stride + d]` for every head `h < G`, one fused multiply-add per position in
/// position order.
///
/// # Safety
/// The CPU has AVX-512 F, AVX2, FMA and F16C ([`available`]).
///
/// # Panics
/// When `values` holds fewer than `len` positions, `scores` fewer than `G * len` values or
/// `out` fewer than `G * D`.
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
pub(crate) unsafe fn weighted_sums<const D: usize, const G: usize, T: KvValue>(
    scores: &[f32],
    len: usize,
    values: &[T],
    stride: usize,
    out: &mut [f32],
) {
    const {
        assert!(
            D.is_multiple_of(64) && G <= 4,
            "bands of four vectors, 16 sums"
        )
    };
    sums_fit::<D, G, T>(scores, len, values, stride, out);
    // Bands of 64 values: four accumulators per head, at most 16 in all, beside the four
    // vectors of values and a broadcast score (AVX-512 has 32 registers).
    for band in (0..D).step_by(64) {
        let mut acc = [[_mm512_setzero_ps(); 4]; G];
        for j in 0..len {
            // SAFETY: `j * stride + band + 64 <= (len - 1) * stride + D <= values.len()`
            // (asserted above).
            let v: [__m512; 4] = std::array::from_fn(|m| unsafe {
                load16(values.as_ptr().add(j * stride + band + 16 * m))
            });
            for (h, acc) in acc.iter_mut().enumerate() {
                let p = _mm512_set1_ps(scores[h * len + j]);
                for (acc, v) in acc.iter_mut().zip(v) {
                    *acc = _mm512_fmadd_ps(p, v, *acc);
                }
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            for (m, acc) in acc.iter().enumerate() {
                // SAFETY: `h * D + band + 16 * m + 16 <= G * D <= out.len()` (asserted above).
                unsafe { _mm512_storeu_ps(out.as_mut_ptr().add(h * D + band + 16 * m), *acc) };
            }
        }
    }
}

/// Sixteen values from `k` as f32: loaded, or converted from binary16 (exactly).
///
/// # Safety
/// The CPU has AVX-512 F; `k` points at sixteen readable values.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn load16<T: KvValue>(k: *const T) -> __m512 {
    // SAFETY: sixteen values at `k` (the caller's), 32 or 64 bytes.
    unsafe {
        if T::HALF {
            _mm512_cvtph_ps(_mm256_loadu_si256(k.cast()))
        } else {
            _mm512_loadu_ps(k.cast())
        }
    }
}
