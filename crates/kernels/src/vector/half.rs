//! The LoRA loops over weights stored in IEEE binary16 (half the bytes of f32; the adapters'
//! matrices), converting as they read.

use super::{LANES, Level, level, madd};

/// An IEEE binary16 value (its bits) as f32: exact for zero and normal values, which is all
/// [`dots_f16`] and [`axpys_f16`] are given (no subnormals, infinities or NaNs). Branch-free
/// (the exponent is rebased by a multiplication by 2^112), so loops over it vectorise on any
/// CPU, F16C or not.
#[inline(always)]
fn half_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let magnitude = f32::from_bits((h & 0x7fff) << 13) * f32::from_bits(0x7780_0000);
    f32::from_bits(((h & 0x8000) << 16) | magnitude.to_bits())
}

#[inline(always)]
fn dot_half<const FMA: bool>(a: &[f32], b: &[u16]) -> f32 {
    let mut acc = [0.0f32; LANES];
    let whole = a.len() / LANES * LANES;
    for (x, y) in a[..whole]
        .chunks_exact(LANES)
        .zip(b[..whole].chunks_exact(LANES))
    {
        for i in 0..LANES {
            acc[i] = madd::<FMA>(x[i], half_to_f32(y[i]), acc[i]);
        }
    }
    let mut width = LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            acc[i] += acc[i + width];
        }
    }
    let mut sum = acc[0];
    for (x, y) in a[whole..].iter().zip(&b[whole..]) {
        sum = madd::<FMA>(*x, half_to_f32(*y), sum);
    }
    sum
}

#[inline(always)]
fn dots_f16_body<const FMA: bool>(x: &[f32], rows: &[u16], stride: usize, out: &mut [f32]) {
    for (j, o) in out.iter_mut().enumerate() {
        *o = dot_half::<FMA>(x, &rows[j * stride..j * stride + x.len()]);
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
    /// [`dots`](super::dots) with `rows` in IEEE binary16 (bits): zero or normal values only (a subnormal,
    /// infinite or NaN one reads as another number).
    ///
    /// # Panics
    /// When a row runs past the end of `rows`.
    pub fn dots_f16(x: &[f32], rows: &[u16], stride: usize, out: &mut [f32]) => dots_f16_body
}

multiversion! {
    /// [`axpys`](super::axpys) with `rows` in IEEE binary16 (bits): zero or normal values only.
    ///
    /// # Panics
    /// When a row runs past the end of `rows`.
    pub fn axpys_f16(y: &mut [f32], coefficients: &[f32], rows: &[u16], stride: usize) => axpys_f16_body
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every zero and normal binary16 value converts exactly (against the `half` crate).
    #[test]
    fn every_normal_half_converts_exactly() {
        for bits in 0..=u16::MAX {
            let h = ::half::f16::from_bits(bits);
            if h.is_normal() || h == ::half::f16::ZERO {
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
        let (rank, width) = (5, 37);
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
        let coefficients: Vec<f32> = (0..rank).map(|j| j as f32 - 1.5).collect();
        let (mut y, mut z) = (x.clone(), x.clone());
        axpys_f16(&mut y, &coefficients, &halves, width);
        super::super::axpys(&mut z, &coefficients, &floats, width);
        assert_eq!(y, z);
    }
}
