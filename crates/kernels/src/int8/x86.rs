//! The int8 matrix kernels for x86-64: AVX-512 VNNI and AVX2. Each computes, per block, the exact integer
//! dot product of every (weight row, activation row) pair and then the same f32 operations
//! as `portable::tile`, so the results are bit-identical to it.
//!
//! Unsafe code here is of two kinds only: calls into `#[target_feature]` functions after the
//! safe wrapper checked the CPU has the features, and vector loads and stores through raw
//! pointers whose bounds the wrapper checked against the slices they come from.
#![allow(unsafe_code)]

use std::arch::x86_64::*;

use crate::isa::{has_avx2, has_avx512_vnni};
use crate::panel::{GROUPS, Panel, Tile};
use crate::{BLOCK, PANEL};

/// How many blocks (of 512 bytes) ahead the kernels prefetch weights (the VNNI kernel for
/// tiles of 4 or more rows, both AVX2 kernels always).
const PREFETCH_BLOCKS: usize = 8;

/// Checks every length the kernels read through raw pointers; returns the block count.
fn checked_blocks(panel: Panel<'_>, x: Tile<'_>, rows: usize) -> usize {
    let blocks = panel.scales.len() / PANEL;
    assert!(
        blocks > 0
            && panel.scales.len() == blocks * PANEL
            && panel.lines.len() == blocks * GROUPS
            && x.q.len() == rows * blocks * BLOCK
            && x.scales.len() == rows * blocks
            && x.bias.len() == rows * blocks,
        "a panel of {blocks} blocks against a tile of {rows} rows of other sizes"
    );
    blocks
}

/// Calls `$kernel::<R>` for `R = $out.len()`, one of `1..=$max`.
macro_rules! dispatch_rows {
    ($kernel:ident, $panel:expr, $x:expr, $blocks:expr, $out:expr, [$($r:literal)*]) => {
        match $out.len() {
            $(
                // SAFETY: the caller checked the CPU features `$kernel` is compiled for, and
                // `checked_blocks` the lengths it reads.
                $r => unsafe { $kernel::<$r>($panel, $x, $blocks, $out.try_into().expect("R rows")) },
            )*
            n => panic!("{} kernel tiles hold 1 to 8 rows, not {n}", stringify!($kernel)),
        }
    };
}
pub(crate) use dispatch_rows;

/// One panel times `out.len()` rows (1 to 8) with AVX-512 VNNI.
pub(crate) fn tile_vnni(panel: Panel<'_>, x: Tile<'_>, out: &mut [[f32; PANEL]]) {
    assert!(has_avx512_vnni(), "the CPU has no AVX-512 VNNI");
    let blocks = checked_blocks(panel, x, out.len());
    dispatch_rows!(vnni, panel, x, blocks, out, [1 2 3 4 5 6 7 8]);
}

/// One panel times `out.len()` rows (1 to 8) with AVX2: 1 or 2 rows with `avx2_sign`, more
/// with `avx2_pairs`, whose shuffles of the weights pay off only when several rows share them
/// (measured on Zen 3, weights in cache: 1 row 74 GFLOP/s with `avx2_sign`, 48 with
/// `avx2_pairs`; 8 rows 94 against 100, and out of cache 68 against 88).
pub(crate) fn tile_avx2(panel: Panel<'_>, x: Tile<'_>, out: &mut [[f32; PANEL]]) {
    assert!(has_avx2(), "the CPU has no AVX2, FMA or F16C");
    let blocks = checked_blocks(panel, x, out.len());
    if out.len() <= 2 {
        dispatch_rows!(avx2_sign, panel, x, blocks, out, [1 2]);
    } else {
        assert_eq!(
            x.wide.len(),
            x.q.len(),
            "avx2_pairs reads the activations as i16"
        );
        dispatch_rows!(avx2_pairs, panel, x, blocks, out, [3 4 5 6 7 8]);
    }
}

/// `vpdpbusd` multiplies the weights (`q + 128`, unsigned) by 4 activation bytes (signed)
/// broadcast to all 16 lanes (rows); each block's sum starts at `-128 * sum(a)` (`bias`), so
/// it ends as the exact `sum(q * a)`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
fn vnni<const R: usize>(panel: Panel<'_>, x: Tile<'_>, blocks: usize, out: &mut [[f32; PANEL]; R]) {
    let k = blocks * BLOCK;
    let lines = panel.lines.as_ptr().cast::<__m512i>();
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        // SAFETY: `checked_blocks` made `scales` hold `blocks * PANEL` f16s and `lines`
        // `blocks * GROUPS` lines of 64 bytes, aligned to 64 by `Line`'s type.
        let ws = _mm512_cvtph_ps(unsafe {
            _mm256_loadu_si256(panel.scales.as_ptr().add(b * PANEL).cast())
        });
        let mut w = [_mm512_setzero_si512(); GROUPS];
        for (g, w) in w.iter_mut().enumerate() {
            // SAFETY: as above, `b * GROUPS + g < blocks * GROUPS`.
            *w = unsafe { _mm512_load_si512(lines.add(b * GROUPS + g)) };
            // Ask for the weights a few blocks ahead (past the panel's end, the next panel's,
            // which the caller usually takes next). A prefetch never faults, and
            // `wrapping_add` claims nothing about the address. Several rows read slower than
            // the hardware prefetcher expects; on an Intel Xeon with AMX (one thread, a
            // 113 MB matrix) one row streamed at 12-16 GB/s without it and 17-28 with it.
            let ahead = lines.wrapping_add((b + PREFETCH_BLOCKS) * GROUPS + g);
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
        }
        for (r, acc) in acc.iter_mut().enumerate() {
            let a = x.q[r * k + b * BLOCK..][..BLOCK].as_ptr();
            let mut sum = _mm512_set1_epi32(x.bias[r * blocks + b]);
            if R >= 4 {
                // Enough rows interleave to hide `vpdpbusd`'s latency: one chain per row.
                for (g, w) in w.iter().enumerate() {
                    // SAFETY: `a` points at a block of BLOCK bytes (the slice above), and
                    // `4 * g + 4 <= BLOCK`.
                    let a = unsafe { a.add(4 * g).cast::<i32>().read_unaligned() };
                    sum = _mm512_dpbusd_epi32(sum, *w, _mm512_set1_epi32(a));
                }
            } else {
                // Few rows: two chains per row halve the latency each block waits for.
                let mut odd = _mm512_setzero_si512();
                for g in (0..GROUPS).step_by(2) {
                    // SAFETY: `a` points at a block of BLOCK bytes (the slice above), and
                    // `4 * (g + 1) + 4 <= BLOCK`.
                    let (a0, a1) = unsafe {
                        (
                            a.add(4 * g).cast::<i32>().read_unaligned(),
                            a.add(4 * g + 4).cast::<i32>().read_unaligned(),
                        )
                    };
                    sum = _mm512_dpbusd_epi32(sum, w[g], _mm512_set1_epi32(a0));
                    odd = _mm512_dpbusd_epi32(odd, w[g + 1], _mm512_set1_epi32(a1));
                }
                sum = _mm512_add_epi32(sum, odd);
            }
            let sum = _mm512_cvtepi32_ps(sum);
            let scale = _mm512_mul_ps(ws, _mm512_set1_ps(x.scales[r * blocks + b]));
            *acc = _mm512_fmadd_ps(sum, scale, *acc);
        }
    }
    for (out, acc) in out.iter_mut().zip(acc) {
        // SAFETY: `out` is PANEL = 16 f32s, one unaligned 512-bit store.
        unsafe { _mm512_storeu_ps(out.as_mut_ptr(), acc) };
    }
}

/// `vpmaddwd` multiplies 16-bit pairs and adds each pair into one 32-bit lane, exactly. The
/// weights go in as `q + 128` (the stored byte, zero-extended; at most 255) and the activations
/// sign-extended to `i16` (`Tile::wide`), so a lane's pair sum stays within `2 * 255 * 127`
/// and each block's sum starts at `bias` (`-128 * sum(a)`), as in VNNI. One `vpshufb` per 32
/// weight bytes puts rows `8h..8h+8` one per lane: `pairs[0]` holds each row's weights
/// `4g, 4g+1`, `pairs[1]` its `4g+2, 4g+3`, each as two zero-extended bytes. Against the two
/// activation pairs broadcast to every lane, a row's four products land in its own lane:
/// no horizontal sums, and the two shuffles are shared by the tile's `R` rows. The kernel
/// runs the panel's two halves of 8 rows one after the other, so each activation row keeps
/// one integer sum and one f32 accumulator in registers (with the `vpmaddubsw` sign trick
/// instead, as `avx2_sign`, each row pays a `vpsignb`, a `vpmaddubsw` and a `vpmaddwd` per
/// 32 products; here two `vpmaddwd`, and the shuffles are shared).
#[target_feature(enable = "avx2,fma,f16c")]
fn avx2_pairs<const R: usize>(
    panel: Panel<'_>,
    x: Tile<'_>,
    blocks: usize,
    out: &mut [[f32; PANEL]; R],
) {
    let k = blocks * BLOCK;
    let lines = panel.lines.as_ptr().cast::<__m256i>();
    let wide = x.wide.as_ptr();
    // Per 128-bit lane (4 rows of 4 bytes): bytes 0-1 of each row, then bytes 2-3, each
    // followed by a zero byte (index with the top bit set).
    const Z: i8 = -128;
    let low = _mm256_setr_epi8(
        0, Z, 1, Z, 4, Z, 5, Z, 8, Z, 9, Z, 12, Z, 13, Z, 0, Z, 1, Z, 4, Z, 5, Z, 8, Z, 9, Z, 12,
        Z, 13, Z,
    );
    let high = _mm256_setr_epi8(
        2, Z, 3, Z, 6, Z, 7, Z, 10, Z, 11, Z, 14, Z, 15, Z, 2, Z, 3, Z, 6, Z, 7, Z, 10, Z, 11, Z,
        14, Z, 15, Z,
    );
    for h in 0..2 {
        let mut acc = [_mm256_setzero_ps(); R];
        for b in 0..blocks {
            // SAFETY: `checked_blocks` made `scales` hold `blocks * PANEL` f16s; this reads
            // 8 of them at `b * PANEL + 8 * h`, `h < 2`.
            let ws = _mm256_cvtph_ps(unsafe {
                _mm_loadu_si128(panel.scales.as_ptr().add(b * PANEL + 8 * h).cast())
            });
            let mut sums: [__m256i; R] =
                std::array::from_fn(|r| _mm256_set1_epi32(x.bias[r * blocks + b]));
            for g in 0..GROUPS {
                // SAFETY: line `b * GROUPS + g` exists (`checked_blocks`); each 64-byte,
                // 64-aligned line is two aligned 32-byte halves.
                let w = unsafe { _mm256_load_si256(lines.add(2 * (b * GROUPS + g) + h)) };
                if h == 0 {
                    // As in the VNNI kernel, several rows read weights slower than the
                    // hardware prefetcher expects (measured on Zen 3: 8 rows of a 28 MiB
                    // matrix 13% faster with it). The first half's pass brings whole lines
                    // in; the second half finds them in L1.
                    let ahead = lines.wrapping_add(2 * ((b + PREFETCH_BLOCKS) * GROUPS + g));
                    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                }
                let pairs = [_mm256_shuffle_epi8(w, low), _mm256_shuffle_epi8(w, high)];
                for (r, sum) in sums.iter_mut().enumerate() {
                    for (p, pair) in pairs.iter().enumerate() {
                        // SAFETY: `tile_avx2` checked `wide` is as long as `q`, which
                        // `checked_blocks` made `R * k`; this reads 2 values at
                        // `r * k + b * BLOCK + 4 * g + 2 * p`, within row `r < R`'s block
                        // `b < blocks` (`4 * g + 2 * p + 2 <= BLOCK`).
                        let a = unsafe {
                            wide.add(r * k + b * BLOCK + 4 * g + 2 * p)
                                .cast::<i32>()
                                .read_unaligned()
                        };
                        let products = _mm256_madd_epi16(*pair, _mm256_set1_epi32(a));
                        *sum = _mm256_add_epi32(*sum, products);
                    }
                }
            }
            for (r, (acc, sum)) in acc.iter_mut().zip(sums).enumerate() {
                let scale = _mm256_mul_ps(ws, _mm256_set1_ps(x.scales[r * blocks + b]));
                *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), scale, *acc);
            }
        }
        for (out, acc) in out.iter_mut().zip(acc) {
            // SAFETY: `out` is 16 f32s; this stores 8 of them at `8 * h`, `h < 2`.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr().add(8 * h), acc) };
        }
    }
}

/// `vpmaddubsw` takes unsigned times signed bytes and saturates pairs at `i16`, so the
/// weights go in as `|q|` (at most 127) and their signs move onto the activations
/// (`vpsignb`): pairs stay within `2 * 127 * 127`, and the sums are exact. 8 rows per
/// 256-bit vector, two vectors per panel.
#[target_feature(enable = "avx2,fma,f16c")]
fn avx2_sign<const R: usize>(
    panel: Panel<'_>,
    x: Tile<'_>,
    blocks: usize,
    out: &mut [[f32; PANEL]; R],
) {
    let k = blocks * BLOCK;
    let lines = panel.lines.as_ptr().cast::<__m256i>();
    let flip = _mm256_set1_epi8(0x80u8 as i8);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let mut ws = [_mm256_setzero_ps(); 2];
        for (h, ws) in ws.iter_mut().enumerate() {
            // SAFETY: `checked_blocks` made `scales` hold `blocks * PANEL` f16s; this reads
            // 8 of them at `b * PANEL + 8 * h`, `h < 2`.
            *ws = _mm256_cvtph_ps(unsafe {
                _mm_loadu_si128(panel.scales.as_ptr().add(b * PANEL + 8 * h).cast())
            });
        }
        let mut sums = [[_mm256_setzero_si256(); 2]; R];
        for g in 0..GROUPS {
            for h in 0..2 {
                // SAFETY: line `b * GROUPS + g` exists (`checked_blocks`); each 64-byte,
                // 64-aligned line is two aligned 32-byte halves.
                let w = unsafe { _mm256_load_si256(lines.add(2 * (b * GROUPS + g) + h)) };
                if h == 0 {
                    // Unlike the VNNI kernel's one-row case, Zen 3's hardware prefetcher
                    // alone leaves this stream at 7-9 GB/s on one thread; asking for each
                    // line 8 blocks ahead gives 9.5-11 (a 28 MiB matrix), and single-stream
                    // decode 60 -> 80 tok/s (distances 4 to 32 and the NTA/T1 hints all
                    // measured alike). Matrices that fit in cache lose a little.
                    let ahead = lines.wrapping_add(2 * ((b + PREFETCH_BLOCKS) * GROUPS + g));
                    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                }
                let w = _mm256_xor_si256(w, flip);
                let magnitude = _mm256_abs_epi8(w);
                for (r, sums) in sums.iter_mut().enumerate() {
                    let a = x.q[r * k + b * BLOCK + 4 * g..][..4].as_ptr();
                    // SAFETY: `a` points at 4 bytes of the slice just indexed.
                    let a = _mm256_set1_epi32(unsafe { a.cast::<i32>().read_unaligned() });
                    let products = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(a, w));
                    sums[h] = _mm256_add_epi32(sums[h], _mm256_madd_epi16(products, ones));
                }
            }
        }
        for (r, (acc, sums)) in acc.iter_mut().zip(&sums).enumerate() {
            let da = _mm256_set1_ps(x.scales[r * blocks + b]);
            for h in 0..2 {
                let scale = _mm256_mul_ps(ws[h], da);
                acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[h]), scale, acc[h]);
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
