//! Attention scores with AVX2 intrinsics, eight positions at a time. Written by hand
//! because the compiler kept `dot_fixed`'s 64 accumulators and their halving tree on the
//! stack (a store, a reload that missed store forwarding, and a scalar add per lane: 80%
//! of attention's time). The operations per score are `dot_fixed`'s, in its order, so the
//! scores are bit-identical to it; only the last three steps of eight positions' trees run
//! side by side in the lanes of shared vectors.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

/// Positions per pass: one vector of results.
const POSITIONS: usize = 8;
/// How many positions ahead keys and values are prefetched.
const AHEAD: usize = 16;

/// `scores[h * len + j] = (q[h] · keys[j * stride..][..D]) * scale` for every head `h < G`
/// and every position `j` below `len` rounded down to a multiple of eight; returns that
/// count (the caller does the rest). Asks for `values` (laid out as `keys`) to be brought
/// into cache as it goes.
///
/// # Safety
/// The CPU has AVX2 and FMA.
///
/// # Panics
/// When `keys` holds fewer than the positions it scores or `scores` fewer than `G * len`
/// values.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scores<const D: usize, const G: usize>(
    q: &[&[f32; D]; G],
    keys: &[f32],
    values: &[f32],
    stride: usize,
    scale: f32,
    len: usize,
    scores: &mut [f32],
) -> usize {
    const { assert!(D.is_multiple_of(64), "dot_fixed's 64 accumulators") };
    let full = len / POSITIONS * POSITIONS;
    if full == 0 {
        return 0;
    }
    assert!(
        keys.len() >= (full - 1) * stride + D && scores.len() >= G * len,
        "{len} positions of {D} values (stride {stride}) in {} keys, {} scores for {G} heads",
        keys.len(),
        scores.len()
    );
    let scale = _mm256_set1_ps(scale);
    // Keys and values of positions further on, a line (16 values) at a time: they are
    // usually in memory (a decode step's weights have pushed them out of cache), and rows
    // `stride` apart are not a stream the hardware prefetcher follows well. The values are
    // read after every score is known; by then they are in cache.
    let prefetch = |positions: std::ops::Range<usize>| {
        let positions = positions.start..positions.end.min(len);
        for at in positions.flat_map(|p| (0..D).step_by(16).map(move |l| p * stride + l)) {
            _mm_prefetch::<_MM_HINT_T0>(keys.as_ptr().wrapping_add(at).cast());
            _mm_prefetch::<_MM_HINT_T0>(values.as_ptr().wrapping_add(at).cast());
        }
    };
    prefetch(0..AHEAD);
    for first in (0..full).step_by(POSITIONS) {
        prefetch(first + AHEAD..first + AHEAD + POSITIONS);
        for (h, q) in q.iter().enumerate() {
            let dots: [__m256; POSITIONS] = std::array::from_fn(|p| {
                // SAFETY: position `first + p < full` starts at most `(full - 1) * stride`,
                // and its `D` values lie within `keys` (asserted above).
                unsafe { dot(q, keys.as_ptr().add((first + p) * stride)) }
            });
            let result = _mm256_mul_ps(reduce(dots), scale);
            // SAFETY: `h * len + first + 8 <= G * len <= scores.len()` (asserted above).
            unsafe { _mm256_storeu_ps(scores.as_mut_ptr().add(h * len + first), result) };
        }
    }
    full
}

/// `dot_fixed`'s accumulators for one position (lanes `8m..8m + 8` of its 64 in vector `m`)
/// summed down to eight lanes: its halving tree's widths 32, 16 and 8.
///
/// # Safety
/// The CPU has AVX2 and FMA; `k` points at `D` readable values.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot<const D: usize>(q: &[f32; D], k: *const f32) -> __m256 {
    let mut acc = [_mm256_setzero_ps(); 8];
    for c in 0..D / 64 {
        for (m, acc) in acc.iter_mut().enumerate() {
            let at = c * 64 + 8 * m;
            // SAFETY: `at + 8 <= D`: within `q`, and within `k`'s `D` values (the caller's).
            let (a, b) = unsafe {
                (
                    _mm256_loadu_ps(q.as_ptr().add(at)),
                    _mm256_loadu_ps(k.add(at)),
                )
            };
            *acc = _mm256_fmadd_ps(a, b, *acc);
        }
    }
    for m in 0..4 {
        acc[m] = _mm256_add_ps(acc[m], acc[m + 4]);
    }
    for m in 0..2 {
        acc[m] = _mm256_add_ps(acc[m], acc[m + 2]);
    }
    _mm256_add_ps(acc[0], acc[1])
}

/// The last three steps of the halving tree (widths 4, 2, 1) for eight positions at once:
/// lane `p` of the result is `dots[p]`'s lanes summed as `tree_sum` sums them.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn reduce(dots: [__m256; POSITIONS]) -> __m256 {
    // Width 4: lane i + lane i + 4, two positions per vector (low and high halves).
    let halves = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_permute2f128_ps::<0x20>(a, b),
            _mm256_permute2f128_ps::<0x31>(a, b),
        )
    };
    let m01 = halves(dots[0], dots[1]);
    let m23 = halves(dots[2], dots[3]);
    let m45 = halves(dots[4], dots[5]);
    let m67 = halves(dots[6], dots[7]);
    // Width 2: lanes (0, 1) + lanes (2, 3) of each position's four.
    let pairs = |a: __m256, b: __m256| {
        _mm256_add_ps(
            _mm256_shuffle_ps::<0b01_00_01_00>(a, b),
            _mm256_shuffle_ps::<0b11_10_11_10>(a, b),
        )
    };
    // Low halves hold positions 0 and 2 (4 and 6), high halves 1 and 3 (5 and 7).
    let n0213 = pairs(m01, m23);
    let n4657 = pairs(m45, m67);
    // Width 1: lane 0 + lane 1 of each position's two.
    let sums = _mm256_add_ps(
        _mm256_shuffle_ps::<0b10_00_10_00>(n0213, n4657),
        _mm256_shuffle_ps::<0b11_01_11_01>(n0213, n4657),
    );
    // Lanes hold positions 0 2 4 6 1 3 5 7.
    _mm256_permutevar8x32_ps(sums, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vector::dot_fixed;

    /// Values of many magnitudes and both signs, so that another order of additions would
    /// round differently.
    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let x = ((i * 7919 + seed * 104_729) % 2003) as f32 - 1001.0;
                x * [1e-3, 0.37, 11.0, 3e-5][(i + seed) % 4]
            })
            .collect()
    }

    fn check<const D: usize, const G: usize>() {
        let stride = 3 * D + 8;
        for len in [1, 8, 37, 64] {
            let (keys, vals) = (values(len * stride, D + G), values(len * stride, 7));
            let q = values(G * D, len);
            let q: [&[f32; D]; G] =
                std::array::from_fn(|h| q[h * D..][..D].try_into().expect("D values"));
            let mut got = vec![f32::NAN; G * len];
            // SAFETY: the caller checked the CPU has AVX2 and FMA.
            let done = unsafe { scores(&q, &keys, &vals, stride, 0.125, len, &mut got) };
            assert_eq!(done, len / 8 * 8);
            for h in 0..G {
                for j in 0..done {
                    let k = keys[j * stride..][..D].try_into().expect("D values");
                    let want = dot_fixed::<true, D>(q[h], k) * 0.125;
                    let got = got[h * len + j];
                    assert_eq!(got.to_bits(), want.to_bits(), "D {D} G {G} head {h} at {j}");
                }
            }
            // Positions past the last whole eight are the caller's: untouched.
            assert!(
                got.iter()
                    .enumerate()
                    .all(|(i, s)| (i % len < done) != s.is_nan())
            );
        }
    }

    #[test]
    fn scores_are_dot_fixed_bit_for_bit() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")) {
            eprintln!("NOT RUN: this CPU has no AVX2 and FMA");
            return;
        }
        check::<64, 1>();
        check::<64, 3>();
        check::<64, 4>();
        check::<128, 2>();
        check::<256, 1>();
        check::<256, 4>();
    }
}
