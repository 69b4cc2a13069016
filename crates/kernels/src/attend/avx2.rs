//! Attention's scores and weighted sums with AVX2 intrinsics, eight positions at a time,
//! and the scores loop `avx512` shares ([`scores_with`], over a [`PositionDot`]).
//! Written by hand because the compiler kept `dot_fixed`'s 64 accumulators and their halving
//! tree on the stack (a store, a reload that missed store forwarding, and a scalar add per
//! lane: 80% of attention's time). The operations per score are `dot_fixed`'s, in its order,
//! so the scores are bit-identical to it; only the last three steps of eight positions'
//! trees run side by side in the lanes of shared vectors.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::vector::KvValue;

/// Positions per pass: one vector of results.
pub(crate) const POSITIONS: usize = 8;
/// How many positions ahead keys and values are prefetched.
pub(crate) const AHEAD: usize = 16;

/// `scores[h * len + j] = (q[h] · keys[j * stride..][..D]) * scale` for every head `h < G`
/// and every position `j` below `len` rounded down to a multiple of eight; returns that
/// count (the caller does the rest). Keys in binary16 are converted exactly as they are
/// read. Asks for `values` (laid out as `keys`) to be brought into cache as it goes.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
///
/// # Panics
/// When `keys` holds fewer than the positions it scores or `scores` fewer than `G * len`
/// values.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn scores<const D: usize, const G: usize, T: KvValue>(
    q: &[&[f32; D]; G],
    keys: &[T],
    values: &[T],
    stride: usize,
    scale: f32,
    len: usize,
    scores: &mut [f32],
) -> usize {
    // SAFETY: the CPU has what `Avx2Dot` needs (the caller's).
    unsafe { scores_with::<Avx2Dot, D, G, T>(q, keys, values, stride, scale, len, scores) }
}

/// A position's dot product summed down to eight lanes as `dot_fixed` sums it: what the
/// AVX2 and AVX-512 scores differ in ([`scores_with`] is the rest).
pub(crate) trait PositionDot {
    /// `q · k`'s accumulators summed down to eight lanes.
    ///
    /// # Safety
    /// The CPU has the features the implementation is written for; `k` points at `D`
    /// readable values.
    unsafe fn dot<const D: usize, T: KvValue>(q: &[f32; D], k: *const T) -> __m256;
}

/// The AVX2 dot product.
struct Avx2Dot;

impl PositionDot for Avx2Dot {
    /// `dot_fixed`'s accumulators for one position (lanes `8m..8m + 8` of its 64 in vector `m`)
    /// summed down to eight lanes: its halving tree's widths 32, 16 and 8.
    ///
    /// # Safety
    /// The CPU has AVX2, FMA and F16C; `k` points at `D` readable values.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot<const D: usize, T: KvValue>(q: &[f32; D], k: *const T) -> __m256 {
        let mut acc = [_mm256_setzero_ps(); 8];
        for c in 0..D / 64 {
            for (m, acc) in acc.iter_mut().enumerate() {
                let at = c * 64 + 8 * m;
                // SAFETY: `at + 8 <= D`: within `q`, and within `k`'s `D` values (the caller's).
                let (a, b) = unsafe { (_mm256_loadu_ps(q.as_ptr().add(at)), load8(k.add(at))) };
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
}

/// The scores loop of [`scores`], with `P` computing each position's dot product: eight
/// positions at a time, each head's eight dots reduced side by side, keys and values
/// prefetched [`AHEAD`] positions on.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and what `P` needs. Inlined into a function compiled for
/// them, as both callers are.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scores_with<P: PositionDot, const D: usize, const G: usize, T: KvValue>(
    q: &[&[f32; D]; G],
    keys: &[T],
    values: &[T],
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
    // SAFETY: the CPU has SSE, AVX2 and FMA (the caller's).
    unsafe {
        let scale = _mm256_set1_ps(scale);
        let prefetch = |positions| prefetch_positions::<D, T>(keys, values, stride, positions, len);
        prefetch(0..AHEAD);
        for first in (0..full).step_by(POSITIONS) {
            prefetch(first + AHEAD..first + AHEAD + POSITIONS);
            for (h, q) in q.iter().enumerate() {
                // Position `first + p < full` starts at most `(full - 1) * stride`, and its
                // `D` values lie within `keys` (asserted above).
                let dots: [__m256; POSITIONS] =
                    std::array::from_fn(|p| P::dot(q, keys.as_ptr().add((first + p) * stride)));
                let result = _mm256_mul_ps(reduce(dots), scale);
                // `h * len + first + 8 <= G * len <= scores.len()` (asserted above).
                _mm256_storeu_ps(scores.as_mut_ptr().add(h * len + first), result);
            }
        }
    }
    full
}

/// Asks for the keys and values of `positions` (those below `len`) to be brought into cache,
/// a line (64 bytes) at a time: they are usually in memory (a decode step's weights have
/// pushed them out of cache). The values are read after every score is known; by then they
/// are in cache. A prefetch never faults, so positions past the slices' ends are harmless.
#[inline]
#[target_feature(enable = "sse")]
pub(crate) fn prefetch_positions<const D: usize, T>(
    keys: &[T],
    values: &[T],
    stride: usize,
    positions: std::ops::Range<usize>,
    len: usize,
) {
    let positions = positions.start..positions.end.min(len);
    let line = 64 / std::mem::size_of::<T>();
    for at in positions.flat_map(|p| (0..D).step_by(line).map(move |l| p * stride + l)) {
        _mm_prefetch::<_MM_HINT_T0>(keys.as_ptr().wrapping_add(at).cast());
        _mm_prefetch::<_MM_HINT_T0>(values.as_ptr().wrapping_add(at).cast());
    }
}

/// `out[h * D + d] = Σ_j scores[h * len + j] * values[j * stride + d]` for every head
/// `h < G`, one fused multiply-add per position in position order (as the portable loop in
/// `vector::attend` does, so the results are the same bit for bit); values in binary16 are
/// converted exactly as they are read.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C.
///
/// # Panics
/// When `values` holds fewer than `len` positions, `scores` fewer than `G * len` values or
/// `out` fewer than `G * D`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn weighted_sums<const D: usize, const G: usize, T: KvValue>(
    scores: &[f32],
    len: usize,
    values: &[T],
    stride: usize,
    out: &mut [f32],
) {
    const { assert!(D.is_multiple_of(16), "bands of two vectors") };
    sums_fit::<D, G, T>(scores, len, values, stride, out);
    // Bands of 16 values: two accumulators per head, at most 8 in all, beside the two
    // vectors of values and a broadcast score (AVX2 has 16 registers).
    for band in (0..D).step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; G];
        for j in 0..len {
            // SAFETY: `j * stride + band + 16 <= (len - 1) * stride + D <= values.len()`
            // (asserted above).
            let (v0, v1) = unsafe {
                let at = values.as_ptr().add(j * stride + band);
                (load8(at), load8(at.add(8)))
            };
            for (h, acc) in acc.iter_mut().enumerate() {
                let p = _mm256_set1_ps(scores[h * len + j]);
                acc[0] = _mm256_fmadd_ps(p, v0, acc[0]);
                acc[1] = _mm256_fmadd_ps(p, v1, acc[1]);
            }
        }
        for (h, acc) in acc.iter().enumerate() {
            // SAFETY: `h * D + band + 16 <= G * D <= out.len()` (asserted above).
            unsafe {
                let at = out.as_mut_ptr().add(h * D + band);
                _mm256_storeu_ps(at, acc[0]);
                _mm256_storeu_ps(at.add(8), acc[1]);
            }
        }
    }
}

/// Checks that the slices a weighted sum reads and writes hold what it touches: `len > 0`
/// positions of `values`, `G * len` scores, `G * D` outputs.
///
/// # Panics
/// When one does not, naming the sizes.
pub(crate) fn sums_fit<const D: usize, const G: usize, T>(
    scores: &[f32],
    len: usize,
    values: &[T],
    stride: usize,
    out: &[f32],
) {
    assert!(
        len > 0
            && values.len() >= (len - 1) * stride + D
            && scores.len() >= G * len
            && out.len() >= G * D,
        "{len} positions of {D} values (stride {stride}) in {} values, {} scores, {} outputs \
         for {G} heads",
        values.len(),
        scores.len(),
        out.len()
    );
}

/// Eight keys from `k` as f32: loaded, or converted from binary16 (exactly).
///
/// # Safety
/// The CPU has AVX2 and F16C; `k` points at eight readable values.
#[inline]
#[target_feature(enable = "avx2,f16c")]
unsafe fn load8<T: KvValue>(k: *const T) -> __m256 {
    // SAFETY: eight values at `k` (the caller's), 16 or 32 bytes.
    unsafe {
        if T::HALF {
            _mm256_cvtph_ps(_mm_loadu_si128(k.cast()))
        } else {
            _mm256_loadu_ps(k.cast())
        }
    }
}

/// The last three steps of the halving tree (widths 4, 2, 1) for eight positions at once:
/// lane `p` of the result is `dots[p]`'s lanes summed as `tree_sum` sums them.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn reduce(dots: [__m256; POSITIONS]) -> __m256 {
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

    /// The cases to test, `(half, wide)`: f32 and binary16 keys and values, each through the
    /// AVX2 loops and (`wide`) `avx512`'s where the CPU runs them; empty, with a line
    /// saying so, on a CPU without AVX2, FMA and F16C.
    fn cases() -> Vec<(bool, bool)> {
        if !crate::isa::has_avx2() {
            eprintln!("NOT RUN: this CPU has no AVX2, FMA and F16C");
            return Vec::new();
        }
        let widths = if crate::attend::avx512::available() {
            vec![false, true]
        } else {
            eprintln!("NOT RUN: the AVX-512 attention loops (this CPU has no AVX-512 F)");
            vec![false]
        };
        [false, true]
            .into_iter()
            .flat_map(|half| widths.iter().map(move |&wide| (half, wide)))
            .collect()
    }

    /// The scores of `keys` (f32, or binary16 with `half`) against `dot_fixed` of the keys
    /// as f32 (converted exactly), by the AVX2 loop or (`wide`) the AVX-512 one.
    fn check<const D: usize, const G: usize>(half: bool, wide: bool) {
        use crate::attend::avx512::scores as scores512;
        let stride = 3 * D + 8;
        for len in [1, 8, 37, 64] {
            let (keys, vals) = (values(len * stride, D + G), values(len * stride, 7));
            let q = values(G * D, len);
            let q: [&[f32; D]; G] =
                std::array::from_fn(|h| q[h * D..][..D].try_into().expect("D values"));
            let mut got = vec![f32::NAN; G * len];
            let (mut k16, mut v16) = (vec![0u16; keys.len()], vec![0u16; vals.len()]);
            crate::vector::f16_bits(&keys, &mut k16);
            crate::vector::f16_bits(&vals, &mut v16);
            // SAFETY: the caller checked the CPU has AVX2, FMA and F16C, and AVX-512 F for
            // `wide`.
            let done = unsafe {
                match (half, wide) {
                    (true, false) => scores(&q, &k16, &v16, stride, 0.125, len, &mut got),
                    (false, false) => scores(&q, &keys, &vals, stride, 0.125, len, &mut got),
                    (true, true) => scores512(&q, &k16, &v16, stride, 0.125, len, &mut got),
                    (false, true) => scores512(&q, &keys, &vals, stride, 0.125, len, &mut got),
                }
            };
            let keys: Vec<f32> = if half {
                k16.iter()
                    .map(|b| ::half::f16::from_bits(*b).to_f32())
                    .collect()
            } else {
                keys
            };
            assert_eq!(done, len / 8 * 8);
            for h in 0..G {
                for j in 0..done {
                    let k = keys[j * stride..][..D].try_into().expect("D values");
                    let want = dot_fixed::<true, D>(q[h], k) * 0.125;
                    let got = got[h * len + j];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "D {D} G {G} half {half} wide {wide} head {h} at {j}"
                    );
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

    /// `weighted_sums` (or, `wide`, the AVX-512 one) against the portable loop's arithmetic:
    /// one `mul_add` per position, in position order, for f32 and binary16 values.
    fn check_sums<const D: usize, const G: usize>(half: bool, wide: bool) {
        use crate::attend::avx512::weighted_sums as sums512;
        let stride = 2 * D + 8;
        for len in [1, 7, 37] {
            let vals = values(len * stride, D * G + len);
            let scores = values(G * len, 3);
            let mut v16 = vec![0u16; vals.len()];
            crate::vector::f16_bits(&vals, &mut v16);
            let mut got = vec![f32::NAN; G * D];
            // SAFETY: the caller checked the CPU has AVX2, FMA and F16C, and AVX-512 F for
            // `wide`.
            unsafe {
                match (half, wide) {
                    (true, false) => {
                        weighted_sums::<D, G, u16>(&scores, len, &v16, stride, &mut got)
                    }
                    (false, false) => {
                        weighted_sums::<D, G, f32>(&scores, len, &vals, stride, &mut got)
                    }
                    (true, true) => sums512::<D, G, u16>(&scores, len, &v16, stride, &mut got),
                    (false, true) => sums512::<D, G, f32>(&scores, len, &vals, stride, &mut got),
                }
            }
            let vals: Vec<f32> = if half {
                v16.iter()
                    .map(|b| ::half::f16::from_bits(*b).to_f32())
                    .collect()
            } else {
                vals
            };
            for h in 0..G {
                for d in 0..D {
                    let want = (0..len).fold(0.0f32, |acc, j| {
                        scores[h * len + j].mul_add(vals[j * stride + d], acc)
                    });
                    let got = got[h * D + d];
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "D {D} G {G} half {half} wide {wide} head {h} value {d}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn weighted_sums_are_the_portable_loops_bit_for_bit() {
        for (half, wide) in cases() {
            check_sums::<64, 1>(half, wide);
            check_sums::<64, 3>(half, wide);
            check_sums::<64, 4>(half, wide);
            check_sums::<128, 4>(half, wide);
            check_sums::<256, 2>(half, wide);
        }
    }

    #[test]
    fn scores_are_dot_fixed_bit_for_bit() {
        for (half, wide) in cases() {
            check::<64, 1>(half, wide);
            check::<64, 3>(half, wide);
            check::<64, 4>(half, wide);
            check::<128, 2>(half, wide);
            check::<256, 1>(half, wide);
            check::<256, 4>(half, wide);
        }
    }
}
