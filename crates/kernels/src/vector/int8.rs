//! The LoRA loops over weights stored as int8 (a quarter of the bytes of f32; the adapters'
//! matrices, each row with its own scale, which the caller applies: to the dot products, or
//! folded into the coefficients). Plain Rust in four-row groups, compiled three times and
//! vectorised by the compiler (`vpmovsxbd` + `vcvtdq2ps` + FMA): each group keeps one chain of
//! accumulators per row, so the FMAs do not wait on each other's latency, and loads `x` (or
//! stores `y`) once for all four rows. (Rows one at a time measured the same, within this
//! machine's noise: 3 alternating runs each of `bench_llm --scenario forward`.)
//!
//! Every loop computes the same operations in the same order as the f32 loops
//! ([`dots`](super::dots), [`axpys`](super::axpys)) on the values converted to f32 (exact for
//! every int8), so the results are the same bit for bit (the tests check it).

use super::{LANES, Level, level, madd, tree_sum};

/// Rows a group takes.
const GROUP: usize = 4;

/// `out[j] = x · rows[j * stride..j * stride + x.len()]` for every `j < out.len()`, with
/// `rows` as int8 (the scales left to the caller). As [`dots`](super::dots) computes it on the
/// converted values.
///
/// # Panics
/// When a row runs past the end of `rows`.
pub fn dots_i8(x: &[f32], rows: &[i8], stride: usize, out: &mut [f32]) {
    dots_i8_any(x, rows, stride, out)
}

/// `y += Σ_j coefficients[j] * rows[j * stride..j * stride + y.len()]`, with `rows` as int8
/// (scales folded into `coefficients` by the caller). As [`axpys`](super::axpys) computes it
/// on the converted values.
///
/// # Panics
/// When a row runs past the end of `rows`.
pub fn axpys_i8(y: &mut [f32], coefficients: &[f32], rows: &[i8], stride: usize) {
    axpys_i8_any(y, coefficients, rows, stride)
}

multiversion! {
    fn dots_i8_any(x: &[f32], rows: &[i8], stride: usize, out: &mut [f32]) => dots_i8_body
}

multiversion! {
    fn axpys_i8_any(y: &mut [f32], coefficients: &[f32], rows: &[i8], stride: usize) => axpys_i8_body
}

#[inline(always)]
fn dots_i8_body<const FMA: bool>(x: &[f32], rows: &[i8], stride: usize, out: &mut [f32]) {
    let len = x.len();
    let row = |j: usize| &rows[j * stride..j * stride + len];
    let mut j = 0;
    while j + GROUP <= out.len() {
        dots_rows::<FMA, GROUP>(x, std::array::from_fn(|r| row(j + r)), &mut out[j..]);
        j += GROUP;
    }
    for j in j..out.len() {
        dots_rows::<FMA, 1>(x, [row(j)], &mut out[j..]);
    }
}

/// `out[r] = x · group[r]` for the `N` rows of a group, each with its own accumulators.
#[inline(always)]
fn dots_rows<const FMA: bool, const N: usize>(x: &[f32], group: [&[i8]; N], out: &mut [f32]) {
    let whole = x.len() / LANES * LANES;
    let mut acc = [[0.0f32; LANES]; N];
    for c in (0..whole).step_by(LANES) {
        let x = &x[c..c + LANES];
        for (acc, row) in acc.iter_mut().zip(&group) {
            let w = &row[c..c + LANES];
            for i in 0..LANES {
                acc[i] = madd::<FMA>(x[i], f32::from(w[i]), acc[i]);
            }
        }
    }
    for (o, (acc, row)) in out.iter_mut().zip(acc.into_iter().zip(&group)) {
        *o = tail::<FMA>(tree_sum(acc), &x[whole..], &row[whole..]);
    }
}

/// `sum` plus the products of the values past the last whole chunk.
#[inline(always)]
fn tail<const FMA: bool>(mut sum: f32, x: &[f32], row: &[i8]) -> f32 {
    for (x, w) in x.iter().zip(row) {
        sum = madd::<FMA>(*x, f32::from(*w), sum);
    }
    sum
}

#[inline(always)]
fn axpys_i8_body<const FMA: bool>(y: &mut [f32], coefficients: &[f32], rows: &[i8], stride: usize) {
    let len = y.len();
    let row = |j: usize| &rows[j * stride..j * stride + len];
    // Each value of `y` takes a group's rows in order, as it takes every row in order one at
    // a time: the same sums, with one load and store of `y` per group.
    for (g, coefficients) in coefficients.chunks(GROUP).enumerate() {
        let first = g * GROUP;
        match *coefficients {
            [c0, c1, c2, c3] => {
                let (r0, r1, r2, r3) = (row(first), row(first + 1), row(first + 2), row(first + 3));
                for (i, y) in y.iter_mut().enumerate() {
                    let s = madd::<FMA>(c0, f32::from(r0[i]), *y);
                    let s = madd::<FMA>(c1, f32::from(r1[i]), s);
                    let s = madd::<FMA>(c2, f32::from(r2[i]), s);
                    *y = madd::<FMA>(c3, f32::from(r3[i]), s);
                }
            }
            _ => {
                for (r, c) in coefficients.iter().enumerate() {
                    let w = row(first + r);
                    for (y, w) in y.iter_mut().zip(w) {
                        *y = madd::<FMA>(*c, f32::from(*w), *y);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The int8 loops compute what the f32 ones do on the converted values, bit for bit, for
    /// every rank up to 9 (groups of four and the rest) and rows longer than they are read.
    #[test]
    fn the_int8_loops_equal_the_f32_ones_on_the_same_values() {
        for rank in 1..=9 {
            for (width, stride) in [(37 + 16 * 3, 37 + 16 * 3), (40, 45), (7, 7)] {
                let rows: Vec<i8> = (0..rank * stride)
                    .map(|i| ((i * 7919 % 255) as i32 - 127) as i8)
                    .collect();
                let floats: Vec<f32> = rows.iter().map(|v| f32::from(*v)).collect();
                let x: Vec<f32> = (0..width).map(|i| (i as f32 * 0.37).sin()).collect();
                let (mut a, mut b) = (vec![0.0; rank], vec![0.0; rank]);
                dots_i8(&x, &rows, stride, &mut a);
                super::super::dots(&x, &floats, stride, &mut b);
                assert_eq!(a, b, "dots, rank {rank}, width {width}");
                let coefficients: Vec<f32> = (0..rank).map(|j| j as f32 * 0.01 - 0.015).collect();
                let (mut y, mut z) = (x.clone(), x.clone());
                axpys_i8(&mut y, &coefficients, &rows, stride);
                super::super::axpys(&mut z, &coefficients, &floats, stride);
                assert_eq!(y, z, "axpys, rank {rank}, width {width}");
            }
        }
    }
}
