//! Attention of one position's query heads over a sequence's cached keys and values, with
//! the cache in f32 or in IEEE binary16 (half the bytes: what decode steps of many sequences
//! read most after the weights). Both read the stored values converted exactly to f32 and
//! then do the same operations in the same order, so a binary16 cache gives the result the
//! f32 loops would give on the rounded keys and values.
//!
//! The portable loops are here (compiled three times, as [`crate::vector`]'s); `avx2.rs` and
//! `avx512.rs` hold the intrinsics copies. The only unsafe code in this file is the call into
//! those after checking the CPU has their features.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

use crate::vector::{
    LANES, Level, dot_of, half_to_f32, level, madd, multiversion, soft_cap, softmax_body, tree_sum,
};

/// A key or value as a KV cache stores it: `f32`, or IEEE binary16 bits (`u16`) written by
/// [`f16_bits`](super::f16_bits) (finite values only).
pub(crate) trait KvValue: Copy + Send + Sync + 'static {
    /// Whether this is binary16 (the x86 loops read it with `vcvtph2ps`).
    const HALF: bool;
    /// The value as f32, exactly.
    fn to_f32(self) -> f32;
}

impl KvValue for f32 {
    const HALF: bool = false;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
}

impl KvValue for u16 {
    const HALF: bool = true;
    #[inline(always)]
    fn to_f32(self) -> f32 {
        half_to_f32(self)
    }
}

/// `a · b` for a fixed length (a multiple of `4 * LANES`): element-wise products into four
/// vectors' worth of lanes, then a halving tree. Compiled for AVX2 the tree went through
/// the stack, so the x86 copies score attention with `avx2::scores`, which does these
/// operations in this order (and is tested against this function bit for bit).
#[inline(always)]
pub(crate) fn dot_fixed<const FMA: bool, const D: usize>(a: &[f32; D], b: &[f32; D]) -> f32 {
    const W: usize = 4 * LANES;
    let mut acc = [0.0f32; W];
    for c in 0..D / W {
        for i in 0..W {
            acc[i] = madd::<FMA>(a[c * W + i], b[c * W + i], acc[i]);
        }
    }
    tree_sum(acc)
}

/// Attention of a group of query heads sharing one key/value head, for head size `D`: the
/// heads go `G` at a time, so each key and value is loaded once for `G` heads.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_fixed<const FMA: bool, const D: usize, T: KvValue>(
    q: &[f32],
    keys: &[T],
    values: &[T],
    stride: usize,
    scale: f32,
    cap: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let len = scores.len() / (q.len() / D);
    let mut q = q.chunks_exact(4 * D);
    let mut scores = scores.chunks_exact_mut(4 * len);
    let mut out = out.chunks_exact_mut(4 * D);
    for ((q, s), o) in (&mut q).zip(&mut scores).zip(&mut out) {
        heads::<FMA, D, 4, T>(q, keys, values, stride, scale, cap, s, o);
    }
    let (q, s, o) = (q.remainder(), scores.into_remainder(), out.into_remainder());
    match q.len() / D {
        1 => heads::<FMA, D, 1, T>(q, keys, values, stride, scale, cap, s, o),
        2 => heads::<FMA, D, 2, T>(q, keys, values, stride, scale, cap, s, o),
        3 => heads::<FMA, D, 3, T>(q, keys, values, stride, scale, cap, s, o),
        _ => {}
    }
}

/// `G` heads of size `D` over all positions.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn heads<const FMA: bool, const D: usize, const G: usize, T: KvValue>(
    q: &[f32],
    keys: &[T],
    values: &[T],
    stride: usize,
    scale: f32,
    cap: f32,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let len = scores.len() / G;
    let q: [&[f32; D]; G] =
        std::array::from_fn(|h| q[h * D..(h + 1) * D].try_into().expect("D values"));
    // `FMA` is true only in the copies `multiversion!` runs after `level` found AVX2 and FMA
    // on this CPU; `has_avx2` finds F16C too.
    #[cfg(target_arch = "x86_64")]
    let x86 = FMA && crate::isa::has_avx2();
    // The AVX-512 loops where the loops run at that width (`level`, which the kernel cap
    // limits) and the CPU has F16C too.
    #[cfg(target_arch = "x86_64")]
    let wide = x86 && level() == Level::Avx512 && avx512::available();
    #[allow(unused_mut)]
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: the CPU has AVX-512 F, AVX2, FMA and F16C (above).
        done = unsafe { avx512::scores(&q, keys, values, stride, scale, len, scores) };
    } else if x86 {
        // SAFETY: the CPU has AVX2, FMA and F16C (above).
        done = unsafe { avx2::scores(&q, keys, values, stride, scale, len, scores) };
    }
    for j in done..len {
        let k: [f32; D] = std::array::from_fn(|i| keys[j * stride + i].to_f32());
        for h in 0..G {
            scores[h * len + j] = dot_fixed::<FMA, D>(q[h], &k) * scale;
        }
    }
    for s in scores.chunks_exact_mut(len) {
        soft_cap::<FMA>(s, cap);
        softmax_body::<FMA>(s);
    }
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: the CPU has AVX-512 F, AVX2, FMA and F16C (above).
        unsafe { avx512::weighted_sums::<D, G, T>(scores, len, values, stride, out) };
        return;
    } else if x86 {
        // SAFETY: the CPU has AVX2, FMA and F16C (above).
        unsafe { avx2::weighted_sums::<D, G, T>(scores, len, values, stride, out) };
        return;
    }
    // The heads' outputs in column bands of `BAND` values, each band's `G` accumulators in
    // registers across all positions (all of `D` for `G` heads would not fit: AVX2 has 16
    // vector registers, and spilling them cost a load and a store per multiply-add).
    const BAND: usize = 2 * LANES;
    for band in 0..D / BAND {
        let mut acc = [[0.0f32; BAND]; G];
        for j in 0..len {
            let v: &[T; BAND] = values[j * stride + band * BAND..][..BAND]
                .try_into()
                .expect("BAND values");
            for h in 0..G {
                let p = scores[h * len + j];
                for i in 0..BAND {
                    acc[h][i] = madd::<FMA>(p, v[i].to_f32(), acc[h][i]);
                }
            }
        }
        for (o, acc) in out.chunks_exact_mut(D).zip(&acc) {
            o[band * BAND..(band + 1) * BAND].copy_from_slice(acc);
        }
    }
}

#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn attend_body<const FMA: bool, T: KvValue>(
    q: &[f32],
    keys: &[T],
    values: &[T],
    stride: usize,
    head_dim: usize,
    scale: f32,
    cap: f32,
    scores: &mut Vec<f32>,
    out: &mut [f32],
) {
    let heads = q.len() / head_dim;
    let len = if keys.len() < head_dim {
        0
    } else {
        (keys.len() - head_dim) / stride + 1
    };
    assert!(
        heads > 0
            && q.len() == heads * head_dim
            && out.len() == q.len()
            && len > 0
            && values.len() >= (len - 1) * stride + head_dim,
        "attention of {} query values ({head_dim} per head) over {} key and {} value values",
        q.len(),
        keys.len(),
        values.len()
    );
    scores.resize(heads * len, 0.0);
    match head_dim {
        64 => attend_fixed::<FMA, 64, T>(q, keys, values, stride, scale, cap, scores, out),
        128 => attend_fixed::<FMA, 128, T>(q, keys, values, stride, scale, cap, scores, out),
        256 => attend_fixed::<FMA, 256, T>(q, keys, values, stride, scale, cap, scores, out),
        _ => {
            for (qh, s) in q.chunks_exact(head_dim).zip(scores.chunks_exact_mut(len)) {
                for (j, s) in s.iter_mut().enumerate() {
                    let k = &keys[j * stride..j * stride + head_dim];
                    *s = dot_of::<FMA, T>(qh, k, T::to_f32) * scale;
                }
                soft_cap::<FMA>(s, cap);
                softmax_body::<FMA>(s);
            }
            for (o, s) in out.chunks_exact_mut(head_dim).zip(scores.chunks_exact(len)) {
                o.fill(0.0);
                for (j, p) in s.iter().enumerate() {
                    let v = &values[j * stride..j * stride + head_dim];
                    for (o, v) in o.iter_mut().zip(v) {
                        *o = madd::<FMA>(*p, v.to_f32(), *o);
                    }
                }
            }
        }
    }
}

multiversion! {
    /// Causal attention of one position's query heads that share a key/value head:
    /// `q` holds the heads one after another (`head_dim` values each), `keys` and `values`
    /// the positions to attend to, position `j` at `j * stride..j * stride + head_dim` (so
    /// `keys.len()` says how many there are: `(keys.len() - head_dim) / stride + 1`). Writes
    /// `softmax(c(q_h · k_j * scale)) · v` for each head into `out` (laid out as `q`), where
    /// `c(s) = cap * tanh(s / cap)` when `cap > 0` (Gemma 2's soft-capping) and `s`
    /// otherwise. `scores` is scratch.
    ///
    /// # Panics
    /// When the shapes disagree or there is no position.
    #[allow(clippy::too_many_arguments)]
    pub fn attend(
        q: &[f32],
        keys: &[f32],
        values: &[f32],
        stride: usize,
        head_dim: usize,
        scale: f32,
        cap: f32,
        scores: &mut Vec<f32>,
        out: &mut [f32]
    ) => attend_body<f32>
}

multiversion! {
    /// [`attend`] over keys and values stored in IEEE binary16 (bits, as
    /// [`f16_bits`](crate::vector::f16_bits) writes them): the same operations on the values
    /// converted exactly to f32, so the same result as [`attend`] on those values.
    ///
    /// # Panics
    /// When the shapes disagree or there is no position.
    #[allow(clippy::too_many_arguments)]
    pub fn attend_f16(
        q: &[f32],
        keys: &[u16],
        values: &[u16],
        stride: usize,
        head_dim: usize,
        scale: f32,
        cap: f32,
        scores: &mut Vec<f32>,
        out: &mut [f32]
    ) => attend_body<u16>
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vector::f16_bits;

    /// Query, keys and values of `positions` positions (the head at offset `head_dim` of
    /// each, the last position whole), of many magnitudes.
    fn case(head_dim: usize, heads: usize, positions: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let stride = 2 * head_dim + 8;
        let v = |n: usize, seed: usize| -> Vec<f32> {
            (0..n)
                .map(|i| (((i + seed) * 7919 % 211) as f32 - 105.0) / 60.0)
                .collect()
        };
        let q = v(heads * head_dim, 1);
        let (keys, values) = (v(positions * stride, 2), v(positions * stride, 3));
        let end = (positions - 1) * stride + 2 * head_dim;
        (
            q,
            keys[head_dim..end].to_vec(),
            values[head_dim..end].to_vec(),
        )
    }

    #[test]
    fn attention_of_a_head_group_matches_plain_f64() {
        // Without a cap and with Gemma 2's (50, and 0.5 so that it bends every score).
        for (head_dim, cap) in [
            (64, 0.0),
            (128, 0.0),
            (24, 0.0),
            (256, 50.0),
            (64, 0.5),
            (24, 0.5),
        ] {
            let (heads, positions, stride) = (3, 37, 2 * head_dim + 8);
            let (q, keys, values) = case(head_dim, heads, positions);
            let scale = 1.0 / (head_dim as f32).sqrt();
            let mut out = vec![0.0; heads * head_dim];
            attend(
                &q,
                &keys,
                &values,
                stride,
                head_dim,
                scale,
                cap,
                &mut Vec::new(),
                &mut out,
            );
            for h in 0..heads {
                let qh = &q[h * head_dim..(h + 1) * head_dim];
                let w: Vec<f64> = (0..positions)
                    .map(|j| {
                        let k = &keys[j * stride..j * stride + head_dim];
                        qh.iter()
                            .zip(k)
                            .map(|(a, b)| *a as f64 * *b as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .map(|s| {
                        if cap > 0.0 {
                            cap as f64 * (s / cap as f64).tanh()
                        } else {
                            s
                        }
                    })
                    .collect();
                let m = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = w.iter().map(|x| (x - m).exp()).sum();
                for d in 0..head_dim {
                    let want: f64 = (0..positions)
                        .map(|j| (w[j] - m).exp() / z * values[j * stride + d] as f64)
                        .sum();
                    let got = out[h * head_dim + d] as f64;
                    assert!(
                        (got - want).abs() < 1e-5,
                        "{head_dim} {h} {d}: {got} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn binary16_attention_is_f32_attention_of_the_rounded_values() {
        // Every head size path (the hand-written scores for 64/128/256, the loops for 24),
        // lengths with and without a tail of fewer than eight positions, 1-4 heads a group.
        for (head_dim, heads, positions, cap) in [
            (64, 3, 37, 0.0),
            (64, 4, 8, 0.0),
            (128, 2, 70, 0.5),
            (256, 1, 13, 50.0),
            (24, 3, 37, 0.0),
        ] {
            let stride = 2 * head_dim + 8;
            let (q, keys, values) = case(head_dim, heads, positions);
            // Values of many magnitudes, subnormal binary16 ones among them.
            let spread = |x: &[f32]| -> Vec<f32> {
                x.iter()
                    .enumerate()
                    .map(|(i, v)| v * [1.0, 3e-5, 700.0, 1e-7][i % 4])
                    .collect()
            };
            let (keys, values) = (spread(&keys), spread(&values));
            let (mut k16, mut v16) = (vec![0u16; keys.len()], vec![0u16; values.len()]);
            f16_bits(&keys, &mut k16);
            f16_bits(&values, &mut v16);
            let rounded = |bits: &[u16]| -> Vec<f32> {
                bits.iter()
                    .map(|b| half::f16::from_bits(*b).to_f32())
                    .collect()
            };
            let (kr, vr) = (rounded(&k16), rounded(&v16));
            let scale = 1.0 / (head_dim as f32).sqrt();
            let mut want = vec![0.0; heads * head_dim];
            attend(
                &q,
                &kr,
                &vr,
                stride,
                head_dim,
                scale,
                cap,
                &mut Vec::new(),
                &mut want,
            );
            let mut got = vec![f32::NAN; heads * head_dim];
            attend_f16(
                &q,
                &k16,
                &v16,
                stride,
                head_dim,
                scale,
                cap,
                &mut Vec::new(),
                &mut got,
            );
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{head_dim}x{heads} at {i}: {g} vs {w}"
                );
            }
        }
    }
}
