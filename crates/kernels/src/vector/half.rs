//! The LoRA loops over weights stored in IEEE binary16 (half the bytes of f32; the adapters'
//! matrices), converting as they read: with the hardware's conversion (`vcvtph2ps`, AVX-512F
//! or F16C) where the CPU has it, else with a branch-free conversion that vectorises
//! anywhere. Every path computes the same operations in the same order as the f32 loops on
//! the converted values, so the results are the same bit for bit (the tests check it).

use super::{LANES, Level, dot_of, level, madd, tree_sum};

/// Which hardware conversion the x86 paths may use.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, PartialEq, Eq)]
enum Convert {
    Avx512,
    Avx2F16c,
    Portable,
}

#[cfg(target_arch = "x86_64")]
fn convert() -> Convert {
    static CONVERT: std::sync::OnceLock<Convert> = std::sync::OnceLock::new();
    *CONVERT.get_or_init(|| match level() {
        Level::Avx512 => Convert::Avx512,
        Level::Avx2 if is_x86_feature_detected!("f16c") => Convert::Avx2F16c,
        _ => Convert::Portable,
    })
}

/// `out[j] = x · rows[j * stride..j * stride + x.len()]` for every `j < out.len()`, with
/// `rows` in IEEE binary16 (bits): finite values only (an infinite or NaN
/// one reads as another number). As [`dots`](super::dots) computes it on the converted values.
///
/// # Panics
/// When a row runs past the end of `rows`.
pub fn dots_f16(x: &[f32], rows: &[u16], stride: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    match convert() {
        // SAFETY: `convert` found AVX-512 F (with FMA: `level`'s AVX-512 copy's features).
        Convert::Avx512 => return unsafe { x86::dots_avx512(x, rows, stride, out) },
        // SAFETY: `convert` found AVX2, FMA and F16C.
        Convert::Avx2F16c => return unsafe { x86::dots_avx2(x, rows, stride, out) },
        Convert::Portable => {}
    }
    dots_f16_portable(x, rows, stride, out)
}

/// `y += Σ_j coefficients[j] * rows[j * stride..j * stride + y.len()]`, with `rows` in IEEE
/// binary16 (bits): finite values only. As [`axpys`](super::axpys) computes it on the
/// converted values.
///
/// # Panics
/// When a row runs past the end of `rows`.
pub fn axpys_f16(y: &mut [f32], coefficients: &[f32], rows: &[u16], stride: usize) {
    #[cfg(target_arch = "x86_64")]
    match convert() {
        // SAFETY: `convert` found AVX-512 F (with FMA).
        Convert::Avx512 => return unsafe { x86::axpys_avx512(y, coefficients, rows, stride) },
        // SAFETY: `convert` found AVX2, FMA and F16C.
        Convert::Avx2F16c => return unsafe { x86::axpys_avx2(y, coefficients, rows, stride) },
        Convert::Portable => {}
    }
    axpys_f16_portable(y, coefficients, rows, stride)
}

/// An IEEE binary16 value (its bits) as f32: exact for every finite value (a subnormal's
/// bits, shifted, are an f32 subnormal that the multiplication scales exactly: Rust code
/// never flushes subnormals to zero), not for infinities or NaNs, which neither the adapters'
/// weights nor a KV cache hold. Branch-free (the exponent is rebased by a multiplication by
/// 2^112), so loops over it vectorise on any CPU, F16C or not.
#[inline(always)]
pub(crate) fn half_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let magnitude = f32::from_bits((h & 0x7fff) << 13) * f32::from_bits(0x7780_0000);
    f32::from_bits(((h & 0x8000) << 16) | magnitude.to_bits())
}

#[inline(always)]
fn dots_f16_body<const FMA: bool>(x: &[f32], rows: &[u16], stride: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_of::<FMA, u16>(x, &rows[j * stride..j * stride + x.len()], half_to_f32);
    }
}

#[inline(always)]
fn axpys_f16_body<const FMA: bool>(
    y: &mut [f32],
    coefficients: &[f32],
    rows: &[u16],
    stride: usize,
) {
    for (j, c) in coefficients.iter().enumerate() {
        let row = &rows[j * stride..j * stride + y.len()];
        for (y, r) in y.iter_mut().zip(row) {
            *y = madd::<FMA>(*c, half_to_f32(*r), *y);
        }
    }
}

multiversion! {
    /// [`dots_f16`] without the hardware's conversion.
    pub(crate) fn dots_f16_portable(x: &[f32], rows: &[u16], stride: usize, out: &mut [f32]) => dots_f16_body
}

multiversion! {
    /// [`axpys_f16`] without the hardware's conversion.
    pub(crate) fn axpys_f16_portable(y: &mut [f32], coefficients: &[f32], rows: &[u16], stride: usize) => axpys_f16_body
}

/// The loops with `vcvtph2ps`: 16 lanes of accumulators, as the portable loops keep them,
/// then the same reduction and tail.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{LANES, axpys_tail, dot_tail, tree_sum};

    /// Rows taken together by the AVX-512 dot loop: each has its own accumulators, so their
    /// multiply-adds do not wait on each other (one row alone waits 4 cycles, a multiply-add's
    /// latency, per 16 values), and each chunk of `x` is loaded once for all of them. A short
    /// last group repeats its last row, computed and not stored.
    const ROWS: usize = 4;

    /// # Safety
    /// The CPU has AVX-512 F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn dots_avx512(x: &[f32], rows: &[u16], stride: usize, out: &mut [f32]) {
        let whole = x.len() / LANES * LANES;
        let row = |j: usize| &rows[j * stride..j * stride + x.len()];
        let mut j = 0;
        while j < out.len() {
            let n = ROWS.min(out.len() - j);
            let group: [&[u16]; ROWS] = std::array::from_fn(|r| row(j + r.min(n - 1)));
            let mut acc = [_mm512_setzero_ps(); ROWS];
            for c in (0..whole).step_by(LANES) {
                // SAFETY: `c + LANES <= whole <= x.len()`, and each row holds `x.len()` values.
                unsafe {
                    let x = _mm512_loadu_ps(x.as_ptr().add(c));
                    for (acc, row) in acc.iter_mut().zip(&group) {
                        let w = _mm512_cvtph_ps(_mm256_loadu_si256(row.as_ptr().add(c).cast()));
                        *acc = _mm512_fmadd_ps(x, w, *acc);
                    }
                }
            }
            for (r, acc) in acc.iter().take(n).enumerate() {
                let mut lanes = [0.0f32; LANES];
                // SAFETY: `lanes` is 16 f32s.
                unsafe { _mm512_storeu_ps(lanes.as_mut_ptr(), *acc) };
                out[j + r] = dot_tail(tree_sum(lanes), &x[whole..], &group[r][whole..]);
            }
            j += n;
        }
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dots_avx2(x: &[f32], rows: &[u16], stride: usize, out: &mut [f32]) {
        // One row at a time, each a sequential stream: unlike the AVX-512 loop, whose rows
        // side by side were measured on a Xeon, this one runs on AVX2-only CPUs (Zen 3),
        // where several short streams read side by side stalled `axpys_avx2`.
        let whole = x.len() / LANES * LANES;
        for (j, o) in out.iter_mut().enumerate() {
            let row = &rows[j * stride..j * stride + x.len()];
            // Lanes 0..8 and 8..16 of the accumulators.
            let mut acc = [_mm256_setzero_ps(); 2];
            for c in (0..whole).step_by(LANES) {
                for (h, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `c + 8 * h + 8 <= whole <= x.len() == row.len()`.
                    unsafe {
                        let w =
                            _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(c + 8 * h).cast()));
                        *acc = _mm256_fmadd_ps(_mm256_loadu_ps(x.as_ptr().add(c + 8 * h)), w, *acc);
                    }
                }
            }
            let mut lanes = [0.0f32; LANES];
            // SAFETY: `lanes` is 16 f32s: two stores of 8.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[1]);
            }
            *o = dot_tail(tree_sum(lanes), &x[whole..], &row[whole..]);
        }
    }

    /// # Safety
    /// The CPU has AVX-512 F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn axpys_avx512(
        y: &mut [f32],
        coefficients: &[f32],
        rows: &[u16],
        stride: usize,
    ) {
        let whole = y.len() / LANES * LANES;
        let len = y.len();
        let row = |j: usize| &rows[j * stride..j * stride + len];
        // Each chunk of `y` stays in a register through every row (rows in order, as the
        // portable loop adds them).
        for c in (0..whole).step_by(LANES) {
            // SAFETY: `c + LANES <= whole <= y.len()`, and each row holds `y.len()` values.
            unsafe {
                let mut sum = _mm512_loadu_ps(y.as_ptr().add(c));
                for (j, coefficient) in coefficients.iter().enumerate() {
                    let w = _mm512_cvtph_ps(_mm256_loadu_si256(row(j).as_ptr().add(c).cast()));
                    sum = _mm512_fmadd_ps(_mm512_set1_ps(*coefficient), w, sum);
                }
                _mm512_storeu_ps(y.as_mut_ptr().add(c), sum);
            }
        }
        axpys_tail(y, whole, coefficients, rows, stride);
    }

    /// # Safety
    /// The CPU has AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn axpys_avx2(
        y: &mut [f32],
        coefficients: &[f32],
        rows: &[u16],
        stride: usize,
    ) {
        let whole = y.len() / 8 * 8;
        let len = y.len();
        // A row at a time (each value of `y` still gets the rows in order, so the sums are
        // the same): the rows, read once and usually from memory, are then one sequential
        // stream. Taking a chunk of `y` through every row instead (as the AVX-512 loop does)
        // read `rank` short streams side by side, and stalled on them (Zen 3: 70% of this
        // loop's time on the load of the rows).
        for (j, coefficient) in coefficients.iter().enumerate() {
            let row = &rows[j * stride..j * stride + len];
            let coefficient = _mm256_set1_ps(*coefficient);
            for c in (0..whole).step_by(8) {
                // SAFETY: `c + 8 <= whole <= y.len() == row.len()`.
                unsafe {
                    let w = _mm256_cvtph_ps(_mm_loadu_si128(row.as_ptr().add(c).cast()));
                    let at = y.as_mut_ptr().add(c);
                    _mm256_storeu_ps(at, _mm256_fmadd_ps(coefficient, w, _mm256_loadu_ps(at)));
                }
            }
        }
        axpys_tail(y, whole, coefficients, rows, stride);
    }
}

/// `y[whole..]` of [`axpys_f16`], fused, rows in order.
#[inline(always)]
fn axpys_tail(y: &mut [f32], whole: usize, coefficients: &[f32], rows: &[u16], stride: usize) {
    for (i, y) in y.iter_mut().enumerate().skip(whole) {
        for (j, coefficient) in coefficients.iter().enumerate() {
            *y = coefficient.mul_add(half_to_f32(rows[j * stride + i]), *y);
        }
    }
}

/// `sum` plus the products of the values past the last whole chunk, fused.
#[inline(always)]
fn dot_tail(mut sum: f32, x: &[f32], row: &[u16]) -> f32 {
    for (x, y) in x.iter().zip(row) {
        sum = x.mul_add(half_to_f32(*y), sum);
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite binary16 value converts exactly (against the `half` crate).
    #[test]
    fn every_finite_half_converts_exactly() {
        // Normal, subnormal and zero, both signs (a KV cache in binary16 holds subnormals).
        for bits in 0..=u16::MAX {
            let h = ::half::f16::from_bits(bits);
            if h.is_finite() {
                assert_eq!(
                    half_to_f32(bits).to_bits(),
                    h.to_f32().to_bits(),
                    "{bits:#06x}"
                );
            }
        }
    }

    /// The f16 loops compute what the f32 ones do on the converted values, bit for bit.
    #[test]
    fn the_f16_loops_equal_the_f32_ones_on_the_same_values() {
        for rank in 1..=9 {
            the_f16_loops_equal_the_f32_ones_at(rank);
        }
    }

    fn the_f16_loops_equal_the_f32_ones_at(rank: usize) {
        let width = 37 + 16 * 3;
        let halves: Vec<u16> = (0..rank * width)
            .map(|i| ::half::f16::from_f32(((i * 7919 % 211) as f32 - 105.0) / 64.0).to_bits())
            .collect();
        let floats: Vec<f32> = halves
            .iter()
            .map(|h| ::half::f16::from_bits(*h).to_f32())
            .collect();
        let x: Vec<f32> = (0..width).map(|i| (i as f32 * 0.37).sin()).collect();
        let (mut a, mut b) = (vec![0.0; rank], vec![0.0; rank]);
        dots_f16(&x, &halves, width, &mut a);
        super::super::dots(&x, &floats, width, &mut b);
        assert_eq!(a, b);
        dots_f16_portable(&x, &halves, width, &mut a);
        assert_eq!(a, b, "the portable loop");
        let coefficients: Vec<f32> = (0..rank).map(|j| j as f32 - 1.5).collect();
        let (mut y, mut z) = (x.clone(), x.clone());
        axpys_f16(&mut y, &coefficients, &halves, width);
        super::super::axpys(&mut z, &coefficients, &floats, width);
        assert_eq!(y, z);
        let mut portable = x.clone();
        axpys_f16_portable(&mut portable, &coefficients, &halves, width);
        assert_eq!(portable, z, "the portable loop");

        // Every hardware path this CPU has, whichever `convert` picks.
        #[cfg(target_arch = "x86_64")]
        {
            let has = |f: &[bool]| f.iter().all(|x| *x);
            let avx2 = has(&[
                is_x86_feature_detected!("avx2"),
                is_x86_feature_detected!("fma"),
                is_x86_feature_detected!("f16c"),
            ]);
            let avx512 = has(&[
                is_x86_feature_detected!("avx512f"),
                is_x86_feature_detected!("fma"),
            ]);
            if avx2 {
                let mut y = x.clone();
                // SAFETY: the CPU has AVX2, FMA and F16C (checked above).
                unsafe {
                    x86::dots_avx2(&x, &halves, width, &mut a);
                    x86::axpys_avx2(&mut y, &coefficients, &halves, width);
                }
                assert_eq!((&a, &y), (&b, &z), "the AVX2 + F16C loops");
            }
            if avx512 {
                let mut y = x.clone();
                // SAFETY: the CPU has AVX-512 F and FMA (checked above).
                unsafe {
                    x86::dots_avx512(&x, &halves, width, &mut a);
                    x86::axpys_avx512(&mut y, &coefficients, &halves, width);
                }
                assert_eq!((&a, &y), (&b, &z), "the AVX-512 loops");
            }
        }
    }
}
