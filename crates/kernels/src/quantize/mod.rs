//! Activations quantized to int8 per block of 32 values, once per matrix product.

#[cfg(target_arch = "x86_64")]
mod x86;

use crate::{BLOCK, Isa};

/// `rows x k` activations as int8, one f32 scale per block of [`BLOCK`] values: value `c` of
/// row `r` is about `scale(r, c / BLOCK) * q[r * k + c]`, `q` in `-127..=127`. Reused across
/// products: [`Int8Rows::quantize`] keeps the buffers' capacity.
#[derive(Clone, Debug, Default)]
pub struct Int8Rows {
    rows: usize,
    k: usize,
    pub(crate) q: Vec<i8>,
    pub(crate) scales: Vec<f32>,
    /// `-128 * sum(q)` of each block: VNNI multiplies unsigned by signed bytes, so the
    /// kernel feeds it `w + 128` and starts each block's sum here to take the 128s back.
    pub(crate) bias: Vec<i32>,
    /// `q` sign-extended to `i16`, filled when quantized for the AVX2 kernel (which multiplies
    /// 16-bit pairs), empty otherwise.
    pub(crate) wide: Vec<i16>,
}

impl Int8Rows {
    /// No rows; buffers grow on the first [`Int8Rows::quantize`].
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the contents with `x`, rows of `k` values.
    ///
    /// # Panics
    /// When `k` is not a positive multiple of [`BLOCK`] or does not divide `x.len()`.
    pub fn quantize(&mut self, x: &[f32], k: usize) {
        self.quantize_with(Isa::detect(), x, k);
    }

    /// [`Int8Rows::quantize`] with the code for `isa` (for tests; the result is the same).
    ///
    /// # Panics
    /// As `quantize`, and when this CPU cannot run `isa`.
    pub fn quantize_with(&mut self, isa: Isa, x: &[f32], k: usize) {
        assert!(isa.is_available(), "this CPU cannot run {isa:?} code");
        assert!(
            k > 0 && k.is_multiple_of(BLOCK) && x.len().is_multiple_of(k),
            "{} values are not rows of {k}, a multiple of {BLOCK}",
            x.len()
        );
        let blocks = x.len() / BLOCK;
        self.rows = x.len() / k;
        self.k = k;
        self.q.resize(x.len(), 0);
        self.scales.resize(blocks, 0.0);
        self.bias.resize(blocks, 0);
        self.wide.clear();
        #[cfg(target_arch = "x86_64")]
        match isa {
            Isa::Avx512Vnni => {
                let (q, scales, bias) = (&mut self.q, &mut self.scales, &mut self.bias);
                x86::quantize_avx512(x, q, scales, bias);
                return;
            }
            Isa::Avx2 => {
                self.wide.resize(x.len(), 0);
                let (q, scales, bias) = (&mut self.q, &mut self.scales, &mut self.bias);
                x86::quantize_avx2(x, q, scales, bias, &mut self.wide);
                return;
            }
            Isa::Scalar => {}
        }
        for (((x, q), scale), bias) in x
            .chunks_exact(BLOCK)
            .zip(self.q.chunks_exact_mut(BLOCK))
            .zip(&mut self.scales)
            .zip(&mut self.bias)
        {
            let (d, sum) = quantize_block(x, q.try_into().expect("a block"));
            *scale = d;
            *bias = -128 * sum;
        }
    }

    /// `q` as `i16`: the copy `quantize` made for the AVX2 kernel, or one made now when the
    /// rows were quantized for another kernel (tests comparing kernels on one quantization).
    pub(crate) fn wide(&self) -> std::borrow::Cow<'_, [i16]> {
        if self.wide.len() == self.q.len() {
            std::borrow::Cow::Borrowed(&self.wide)
        } else {
            self.q.iter().map(|&q| i16::from(q)).collect()
        }
    }

    /// Rows held.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Values per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The scale of block `block` of row `row`.
    pub fn scale(&self, row: usize, block: usize) -> f32 {
        self.scales[row * (self.k / BLOCK) + block]
    }

    /// Row `row`'s quantized values.
    pub fn quantized(&self, row: usize) -> &[i8] {
        &self.q[row * self.k..(row + 1) * self.k]
    }
}

/// Quantizes 32 values symmetrically (`d = max|x| / 127`, `q = round(x / d)`), returning
/// `d` and the sum of the `q`. Plain loops the compiler vectorises.
fn quantize_block(x: &[f32], q: &mut [i8; BLOCK]) -> (f32, i32) {
    let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0;
    for (q, v) in q.iter_mut().zip(x) {
        let r = round_to_i8(v * inverse);
        *q = r;
        sum += r as i32;
    }
    (d, sum)
}

/// `v` rounded to the nearest integer, ties to even, clamped to `-127..=127`.
/// `f32::round_ties_even` is a libm call on baseline x86-64 (no SSE4.1); adding and
/// subtracting 1.5 * 2^23 rounds the same way (the FPU's default mode) for `|v| < 2^22`
/// and vectorises. `as` saturates (and maps NaN to 0): odd inputs give odd numbers, not UB.
#[inline]
pub(crate) fn round_to_i8(v: f32) -> i8 {
    const MAGIC: f32 = 12_582_912.0;
    let v = v.clamp(-127.0, 127.0);
    ((v + MAGIC) - MAGIC) as i8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_is_to_nearest_with_ties_to_even() {
        for (v, want) in [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (0.49, 0),
            (126.6, 127),
            (300.0, 127),
            (-300.0, -127),
            (f32::NAN, 0),
        ] {
            assert_eq!(round_to_i8(v), want, "{v}");
        }
        for i in -1270..=1270 {
            let v = i as f32 / 10.0 + 0.013;
            assert_eq!(round_to_i8(v), v.round_ties_even() as i8, "{v}");
        }
    }

    #[test]
    fn every_isa_quantizes_alike() {
        // Blocks of small and large values, a zero row, blocks whose largest magnitude is
        // negative or alone, values at the edges of f32's normal range, and halves (ties).
        let x: Vec<f32> = (0..7 * 96)
            .map(|i| ((i * 7919 % 1009) as f32 - 504.0) * if i % 96 < 32 { 1e-3 } else { 0.37 })
            .chain([0.0; 96])
            .chain((0..96).map(|i| {
                if i % 32 == 5 {
                    -3.5
                } else {
                    (i % 7) as f32 * 0.25
                }
            }))
            .chain((0..96).map(|i| if i % 32 == 0 { 2.0 } else { 0.0 }))
            .chain((0..96).map(|i| (i as f32 - 48.0) * if i < 48 { 1e-36 } else { 1e36 }))
            .chain((0..96).map(|i| (i % 32) as f32 - 15.5))
            .collect();
        let mut want = Int8Rows::new();
        want.quantize_with(Isa::Scalar, &x, 96);
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut got = Int8Rows::new();
            got.quantize_with(isa, &x, 96);
            assert_eq!(
                (&got.q, &got.scales, &got.bias),
                (&want.q, &want.scales, &want.bias),
                "{isa:?}"
            );
            let widened: Vec<i16> = want.q.iter().map(|&q| i16::from(q)).collect();
            assert_eq!(&*got.wide(), &widened[..], "{isa:?}");
        }
    }

    #[test]
    fn the_wide_copy_is_the_quantized_values_for_every_isa() {
        let x: Vec<f32> = (0..3 * 64)
            .map(|i| ((i * 53 % 255) as f32 - 127.0) / 3.0)
            .collect();
        for isa in Isa::ALL.into_iter().filter(|i| i.is_available()) {
            let mut rows = Int8Rows::new();
            rows.quantize_with(isa, &x, 64);
            // Filled by the AVX2 quantization only; made on demand for the others.
            assert_eq!(rows.wide.is_empty(), isa != Isa::Avx2, "{isa:?}");
            let want: Vec<i16> = rows.q.iter().map(|&q| i16::from(q)).collect();
            assert_eq!(&*rows.wide(), &want[..], "{isa:?}");
        }
    }

    #[test]
    fn values_come_back_within_half_a_step() {
        let x: Vec<f32> = (0..2 * 64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let mut rows = Int8Rows::new();
        rows.quantize(&x, 64);
        assert_eq!((rows.rows(), rows.k()), (2, 64));
        for r in 0..2 {
            for c in 0..64 {
                let d = rows.scale(r, c / BLOCK);
                let back = d * rows.quantized(r)[c] as f32;
                assert!((back - x[r * 64 + c]).abs() <= d * 0.5001, "{r} {c}");
            }
        }
        let sum: i32 = rows.q[..32].iter().map(|&q| q as i32).sum();
        assert_eq!(rows.bias[0], -128 * sum);
        // A zero block quantizes to zeros with a zero scale; a second call reuses buffers.
        rows.quantize(&[0.0; 32], 32);
        assert_eq!((rows.rows(), rows.scale(0, 0)), (1, 0.0));
        assert!(rows.quantized(0).iter().all(|&q| q == 0));
    }
}
