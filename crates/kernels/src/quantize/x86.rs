//! Activation rows quantized with AVX-512 or AVX2: the same `d`, `q` and sums as
//! `Int8Rows::quantize`'s scalar blocks (`vcvtps2dq` rounds to nearest even under the
//! default rounding mode, as the scalar code does), so every kernel sees the same rows.
//!
//! Unsafe code here: calls into `#[target_feature]` functions after the safe wrapper
//! checked the CPU, and unaligned loads and stores within slices whose lengths it checked.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::BLOCK;
use crate::isa::{has_avx2, has_avx512_vnni};

/// Checks the lengths both quantizers write through raw pointers.
fn check_lengths(x: &[f32], q: &[i8], scales: &[f32], bias: &[i32]) {
    let blocks = x.len() / BLOCK;
    assert!(
        x.len() == blocks * BLOCK
            && q.len() == x.len()
            && scales.len() == blocks
            && bias.len() == blocks,
        "{} values into {} bytes, {} scales and {} sums",
        x.len(),
        q.len(),
        scales.len(),
        bias.len()
    );
}

/// `Int8Rows::quantize`'s blocks with AVX-512.
pub(crate) fn quantize_avx512(x: &[f32], q: &mut [i8], scales: &mut [f32], bias: &mut [i32]) {
    assert!(has_avx512_vnni(), "the CPU has no AVX-512");
    check_lengths(x, q, scales, bias);
    // SAFETY: the CPU has AVX-512 F (checked above); the lengths are checked above.
    unsafe { quantize_blocks_avx512(x, q, scales, bias) }
}

#[target_feature(enable = "avx512f")]
fn quantize_blocks_avx512(x: &[f32], q: &mut [i8], scales: &mut [f32], bias: &mut [i32]) {
    let limit = _mm512_set1_epi32(127);
    for b in 0..scales.len() {
        let block = &x[b * BLOCK..(b + 1) * BLOCK];
        // SAFETY: `block` is 32 f32s: two unaligned 16-value loads.
        let (lo, hi) = unsafe {
            (
                _mm512_loadu_ps(block.as_ptr()),
                _mm512_loadu_ps(block.as_ptr().add(16)),
            )
        };
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
        let inverse = if amax > 0.0 { 127.0 / amax } else { 0.0 };
        let inverse = _mm512_set1_ps(inverse);
        let round = |v: __m512| {
            let r = _mm512_cvtps_epi32(_mm512_mul_ps(v, inverse));
            _mm512_max_epi32(
                _mm512_min_epi32(r, limit),
                _mm512_sub_epi32(_mm512_setzero_si512(), limit),
            )
        };
        let (lo, hi) = (round(lo), round(hi));
        scales[b] = amax / 127.0;
        bias[b] = -128 * _mm512_reduce_add_epi32(_mm512_add_epi32(lo, hi));
        let out = &mut q[b * BLOCK..(b + 1) * BLOCK];
        // SAFETY: `out` is 32 bytes: two 16-byte unaligned stores.
        unsafe {
            _mm_storeu_si128(out.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(lo));
            _mm_storeu_si128(out.as_mut_ptr().add(16).cast(), _mm512_cvtepi32_epi8(hi));
        }
    }
}

/// `Int8Rows::quantize`'s blocks with AVX2, and beside them the values widened to `i16`
/// that the AVX2 kernel for 3 to 8 rows reads (`wide`, as long as `q`): the widening is a
/// step of the packing from `i32` to `i8` anyway.
pub(crate) fn quantize_avx2(
    x: &[f32],
    q: &mut [i8],
    scales: &mut [f32],
    bias: &mut [i32],
    wide: &mut [i16],
) {
    assert!(has_avx2(), "the CPU has no AVX2");
    check_lengths(x, q, scales, bias);
    assert_eq!(wide.len(), q.len(), "the wide copy is as long as the bytes");
    // SAFETY: the CPU has AVX2 (checked above); the lengths are checked above.
    unsafe { quantize_blocks_avx2(x, q, scales, bias, wide) }
}

#[target_feature(enable = "avx2")]
fn quantize_blocks_avx2(
    x: &[f32],
    q: &mut [i8],
    scales: &mut [f32],
    bias: &mut [i32],
    wide: &mut [i16],
) {
    let magnitude = _mm256_set1_ps(f32::from_bits(0x7fff_ffff));
    let (high, low) = (_mm256_set1_epi32(127), _mm256_set1_epi32(-127));
    for b in 0..scales.len() {
        let block = &x[b * BLOCK..(b + 1) * BLOCK];
        // SAFETY: `block` is 32 f32s: four unaligned 8-value loads.
        let v: [__m256; 4] =
            std::array::from_fn(|i| unsafe { _mm256_loadu_ps(block.as_ptr().add(8 * i)) });
        let m = _mm256_max_ps(
            _mm256_max_ps(
                _mm256_and_ps(v[0], magnitude),
                _mm256_and_ps(v[1], magnitude),
            ),
            _mm256_max_ps(
                _mm256_and_ps(v[2], magnitude),
                _mm256_and_ps(v[3], magnitude),
            ),
        );
        let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
        let amax = _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m)));
        let inverse = _mm256_set1_ps(if amax > 0.0 { 127.0 / amax } else { 0.0 });
        // Rounding then clamping to the integers ±127 is clamping then rounding.
        let r: [__m256i; 4] = std::array::from_fn(|i| {
            let r = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
            _mm256_max_epi32(_mm256_min_epi32(r, high), low)
        });
        scales[b] = amax / 127.0;
        let sum = _mm256_add_epi32(_mm256_add_epi32(r[0], r[1]), _mm256_add_epi32(r[2], r[3]));
        let sum = _mm_add_epi32(
            _mm256_castsi256_si128(sum),
            _mm256_extracti128_si256::<1>(sum),
        );
        let sum = _mm_add_epi32(sum, _mm_unpackhi_epi64(sum, sum));
        let sum = _mm_add_epi32(sum, _mm_shuffle_epi32::<0b01>(sum));
        bias[b] = -128 * _mm_cvtsi128_si32(sum);
        // `packs` works within 128-bit lanes; the 64-bit permutes put values back in order.
        let w01 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[0], r[1]));
        let w23 = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(r[2], r[3]));
        let bytes = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi16(w01, w23));
        let (q, wide) = (
            &mut q[b * BLOCK..][..BLOCK],
            &mut wide[b * BLOCK..][..BLOCK],
        );
        // SAFETY: `q` is 32 bytes and `wide` 32 i16s: one and two unaligned 32-byte stores.
        unsafe {
            _mm256_storeu_si256(q.as_mut_ptr().cast(), bytes);
            _mm256_storeu_si256(wide.as_mut_ptr().cast(), w01);
            _mm256_storeu_si256(wide.as_mut_ptr().add(16).cast(), w23);
        }
    }
}
