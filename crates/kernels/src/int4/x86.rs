//! The x86-64 kernels of the 4-bit format (`int4`): AVX2 and AVX-512 VNNI. The nibbles are
//! unsigned, which is what both `vpmaddubsw` and `vpdpbusd` take as their first operand, so
//! unlike the int8 kernels there is no sign trick and no bias: two masks and a shift unpack a
//! line into the weights of 8 groups, shared by every activation row of the tile. Each
//! computes, per block, the exact integer `sum(q * a)` and then the same f32 operations as
//! `int4::tile`, so the results are bit-identical to it.
//!
//! Unsafe code here is of the same two kinds as in `x86`: calls into `#[target_feature]`
//! functions after the safe wrapper checked the CPU, and aligned loads through raw pointers
//! into the panel the wrapper checked.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use super::{LINES, activation_sum};
use crate::int8::x86::dispatch_rows;
use crate::isa::{has_avx2, has_avx512_vnni};
use crate::panel::{Line, Tile};
use crate::{BLOCK, PANEL};

/// How many blocks (of 320 bytes) ahead the kernels ask for weights.
const PREFETCH_BLOCKS: usize = 12;

/// Checks every length the kernels read through raw pointers; returns the block count.
fn checked_blocks(lines: &[Line], x: Tile<'_>, rows: usize) -> usize {
    let blocks = lines.len() / LINES;
    assert!(
        blocks > 0
            && lines.len() == blocks * LINES
            && x.q.len() == rows * blocks * BLOCK
            && x.scales.len() == rows * blocks
            && x.bias.len() == rows * blocks,
        "a panel of {} lines against a tile of {rows} rows of other sizes",
        lines.len()
    );
    blocks
}

/// One panel times `out.len()` rows (1 to 8) with AVX2: 1 or 2 rows in one pass over the
/// panel (`avx2_streaming`), more one half of the panel's rows at a time (`avx2`).
pub(crate) fn tile_avx2(lines: &[Line], x: Tile<'_>, out: &mut [[f32; PANEL]]) {
    assert!(has_avx2(), "the CPU has no AVX2, FMA or F16C");
    let blocks = checked_blocks(lines, x, out.len());
    if out.len() <= 2 {
        dispatch_rows!(avx2_streaming, lines, x, blocks, out, [1 2]);
    } else {
        dispatch_rows!(avx2, lines, x, blocks, out, [3 4 5 6 7 8]);
    }
}

/// One panel times `out.len()` rows (1 to 8) with AVX-512 VNNI.
pub(crate) fn tile_vnni(lines: &[Line], x: Tile<'_>, out: &mut [[f32; PANEL]]) {
    assert!(has_avx512_vnni(), "the CPU has no AVX-512 VNNI");
    let blocks = checked_blocks(lines, x, out.len());
    dispatch_rows!(vnni, lines, x, blocks, out, [1 2 3 4 5 6 7 8]);
}

/// Reads 4 activation bytes at `a + at` as one `i32`.
///
/// # Safety
/// `a + at .. a + at + 4` lies inside one slice.
#[inline(always)]
unsafe fn four(a: *const i8, at: usize) -> i32 {
    // SAFETY: the caller's promise.
    unsafe { a.add(at).cast::<i32>().read_unaligned() }
}

/// `vpmaddubsw` multiplies the nibbles (unsigned) by 4 activation bytes broadcast to each
/// row's lane and adds pairs into `i16`: each result is at most `2 * 15 * 127`, so the 8 of
/// a block add up in `i16` exactly (at most 30,480) before one `vpmaddwd` widens them. Runs a
/// panel's two halves of 8 rows one after the other, as `x86::avx2_pairs`; the second half
/// finds the panel in L1.
#[target_feature(enable = "avx2,fma,f16c")]
fn avx2<const R: usize>(lines: &[Line], x: Tile<'_>, blocks: usize, out: &mut [[f32; PANEL]; R]) {
    let k = blocks * BLOCK;
    let base = lines.as_ptr();
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            let block = base.wrapping_add(b * LINES);
            if h == 0 {
                for l in 0..LINES {
                    // A prefetch never faults; `wrapping_add` claims nothing of the address
                    // (past the panel's end, it is the next panel's, usually taken next).
                    let ahead = block.wrapping_add(PREFETCH_BLOCKS * LINES + l);
                    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                }
            }
            // SAFETY: `checked_blocks` made `lines` hold `blocks * LINES` lines; line
            // `b * LINES + 4` holds 16 scales then 16 offsets (f16); this reads 8 of each at
            // lane `8 * h`, `h < 2`, aligned to 16 bytes.
            let (d, m) = unsafe {
                let scales = block.add(LINES - 1).cast::<u8>();
                (
                    _mm256_cvtph_ps(_mm_load_si128(scales.add(16 * h).cast())),
                    _mm256_cvtph_ps(_mm_load_si128(scales.add(32 + 16 * h).cast())),
                )
            };
            let mut w = [_mm256_setzero_si256(); 8];
            for j in 0..LINES - 1 {
                // SAFETY: line `b * LINES + j` exists (`checked_blocks`); each 64-aligned
                // line is two aligned 32-byte halves.
                let v = unsafe { _mm256_load_si256(block.add(j).cast::<__m256i>().add(h)) };
                w[j] = _mm256_and_si256(v, low);
                w[j + 4] = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
            }
            for (r, acc) in acc.iter_mut().enumerate() {
                let a = x.q[r * k + b * BLOCK..][..BLOCK].as_ptr();
                // Two chains, so one row's sums do not wait on each other's latency.
                let (mut even, mut odd) = (_mm256_setzero_si256(), _mm256_setzero_si256());
                for j in (0..8).step_by(2) {
                    // SAFETY: `a` points at a block of BLOCK bytes (the slice above), and
                    // weights `4j..4j+4` of group `j < 8` lie inside it.
                    let (a0, a1) = unsafe { (four(a, 4 * j), four(a, 4 * j + 4)) };
                    let p0 = _mm256_maddubs_epi16(w[j], _mm256_set1_epi32(a0));
                    let p1 = _mm256_maddubs_epi16(w[j + 1], _mm256_set1_epi32(a1));
                    even = _mm256_add_epi16(even, p0);
                    odd = _mm256_add_epi16(odd, p1);
                }
                let sum = _mm256_madd_epi16(_mm256_add_epi16(even, odd), ones);
                let da = _mm256_set1_ps(x.scales[r * blocks + b]);
                let sum_a = _mm256_set1_ps(activation_sum(x.bias[r * blocks + b]));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(d, da), *acc);
                *acc = _mm256_fmadd_ps(sum_a, _mm256_mul_ps(m, da), *acc);
            }
        }
        for (out, acc) in out.iter_mut().zip(acc) {
            // SAFETY: `out` is 16 f32s; this stores 8 of them at `8 * h`, `h < 2`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), acc) };
        }
    }
}

/// [`avx2`]'s arithmetic for 1 or 2 rows, both halves of the panel in one pass: reading one
/// row, the kernel streams weights from memory, and a second pass over a panel already in L1
/// would leave memory idle meanwhile (measured on Zen 3, single-stream decode: the two-pass
/// kernel read the 4-bit blocks 20% slower per byte than `x86::avx2_sign` the int8 head).
#[target_feature(enable = "avx2,fma,f16c")]
fn avx2_streaming<const R: usize>(
    lines: &[Line],
    x: Tile<'_>,
    blocks: usize,
    out: &mut [[f32; PANEL]; R],
) {
    let k = blocks * BLOCK;
    let base = lines.as_ptr();
    let low = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let block = base.wrapping_add(b * LINES);
        for l in 0..LINES {
            // As in `avx2`.
            let ahead = block.wrapping_add(PREFETCH_BLOCKS * LINES + l);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        }
        let mut sums = [[_mm256_setzero_si256(); 2]; R];
        for j in 0..LINES - 1 {
            for h in 0..2 {
                // SAFETY: as in `avx2`, line `b * LINES + j` and its half `h`.
                let v = unsafe { _mm256_load_si256(block.add(j).cast::<__m256i>().add(h)) };
                let w = [
                    _mm256_and_si256(v, low),
                    _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
                ];
                for (r, sums) in sums.iter_mut().enumerate() {
                    let a = x.q[r * k + b * BLOCK..][..BLOCK].as_ptr();
                    // SAFETY: `a` points at a block of BLOCK bytes (the slice just indexed);
                    // weights `4j..4j+4` and `16+4j..16+4j+4` lie inside it (`j < 4`).
                    let (a0, a1) = unsafe { (four(a, 4 * j), four(a, 16 + 4 * j)) };
                    let p0 = _mm256_maddubs_epi16(w[0], _mm256_set1_epi32(a0));
                    let p1 = _mm256_maddubs_epi16(w[1], _mm256_set1_epi32(a1));
                    sums[h] = _mm256_add_epi16(sums[h], _mm256_add_epi16(p0, p1));
                }
            }
        }
        // SAFETY: as in `avx2`: line `b * LINES + 4` holds 16 scales then 16 offsets.
        let (d, m) = unsafe {
            let scales = block.add(LINES - 1).cast::<__m128i>();
            (
                [0, 1].map(|h| _mm256_cvtph_ps(_mm_load_si128(scales.add(h)))),
                [2, 3].map(|h| _mm256_cvtph_ps(_mm_load_si128(scales.add(h)))),
            )
        };
        for (r, (acc, sums)) in acc.iter_mut().zip(sums).enumerate() {
            let da = _mm256_set1_ps(x.scales[r * blocks + b]);
            let sum_a = _mm256_set1_ps(activation_sum(x.bias[r * blocks + b]));
            for h in 0..2 {
                let sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(sums[h], ones));
                acc[h] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d[h], da), acc[h]);
                acc[h] = _mm256_fmadd_ps(sum_a, _mm256_mul_ps(m[h], da), acc[h]);
            }
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        for (h, acc) in acc.into_iter().enumerate() {
            // SAFETY: `out` is 16 f32s; this stores 8 of them at `8 * h`, `h < 2`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), acc) };
        }
    }
}

/// `vpdpbusd` multiplies the nibbles (unsigned) by 4 activation bytes (signed) broadcast to
/// all 16 rows and adds each row's 4 products into its lane: no bias, no `i16` step.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn vnni<const R: usize>(lines: &[Line], x: Tile<'_>, blocks: usize, out: &mut [[f32; PANEL]; R]) {
    let k = blocks * BLOCK;
    let base = lines.as_ptr();
    let low = _mm512_set1_epi8(0x0F);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let block = base.wrapping_add(b * LINES);
        // As the int8 VNNI kernel, for every tile size (one row of a 70 MB matrix on an Intel
        // Xeon with AMX: 10-25 GB/s without, 25-29 with).
        for l in 0..LINES {
            let ahead = block.wrapping_add(PREFETCH_BLOCKS * LINES + l);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        }
        // SAFETY: as in `avx2`: line `b * LINES + 4` holds 16 scales then 16 offsets.
        let (d, m) = unsafe {
            let scales = block.add(LINES - 1).cast::<__m256i>();
            (
                _mm512_cvtph_ps(_mm256_load_si256(scales)),
                _mm512_cvtph_ps(_mm256_load_si256(scales.add(1))),
            )
        };
        let mut w = [_mm512_setzero_si512(); 8];
        for j in 0..LINES - 1 {
            // SAFETY: line `b * LINES + j` exists and is 64-byte aligned (`Line`).
            let v = unsafe { _mm512_load_si512(block.add(j).cast()) };
            w[j] = _mm512_and_si512(v, low);
            w[j + 4] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = x.q[r * k + b * BLOCK..][..BLOCK].as_ptr();
            let (mut even, mut odd) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for j in (0..8).step_by(2) {
                // SAFETY: as in `avx2`, groups `j, j + 1 < 8` lie inside the block at `a`.
                let (a0, a1) = unsafe { (four(a, 4 * j), four(a, 4 * j + 4)) };
                even = _mm512_dpbusd_epi32(even, w[j], _mm512_set1_epi32(a0));
                odd = _mm512_dpbusd_epi32(odd, w[j + 1], _mm512_set1_epi32(a1));
            }
            let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(even, odd));
            let da = _mm512_set1_ps(x.scales[r * blocks + b]);
            let sum_a = _mm512_set1_ps(activation_sum(x.bias[r * blocks + b]));
            *acc = _mm512_fmadd_ps(sum, _mm512_mul_ps(d, da), *acc);
            *acc = _mm512_fmadd_ps(sum_a, _mm512_mul_ps(m, da), *acc);
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `out` is PANEL = 16 f32s, one unaligned 512-bit store.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}
