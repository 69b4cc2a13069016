//! GGUF's 4-bit block types (Q4_0, Q4_1, Q4_K) read into `modelmux-kernels`' 4-bit format,
//! whose blocks are 32 weights `d * q + m` with an f16 `d` and `m`: the weights stay the
//! file's own, not requantized. Block layouts as llama.cpp's `ggml-common.h` defines them.

use candle_core::quantized::{GgmlDType, QTensor};
use half::f16;
use modelmux_kernels::{BLOCK, Int4Matrix};

use crate::error::Result;

/// Whether `dtype` is one of the types [`fill`] reads.
pub(crate) fn is_four_bit(dtype: GgmlDType) -> bool {
    matches!(dtype, GgmlDType::Q4_0 | GgmlDType::Q4_1 | GgmlDType::Q4K)
}

/// How far an f16 scale or offset may land from the f32 value a Q4_K block computes for it
/// (`d * sc`, `dmin * m`), relative. An f16 times a 6-bit integer has at most 17 significant
/// bits and f16 keeps 11, so it rounds within 2^-12, or is exact below f16's normal range;
/// only a product past f16's largest value (65504) misses, and then the matrix keeps the
/// int8 format instead.
const MAX_SCALE_ERROR: f32 = 1.0 / 2048.0;

/// Writes `tensor` (a 4-bit type, see [`is_four_bit`]) into rows `first..` of `matrix`.
/// `false` when a scale or offset does not fit an f16 within [`MAX_SCALE_ERROR`] (a Q4_K
/// product or a Q4_0 offset `-8 d` past f16's range; the matrix is then incomplete and must
/// not be used).
pub(crate) fn fill(matrix: &mut Int4Matrix, first: usize, tensor: &QTensor) -> Result<bool> {
    let (rows, columns) = tensor.shape().dims2()?;
    let data = tensor.data()?;
    let dtype = tensor.dtype();
    let row_bytes = columns / dtype.block_size() * dtype.type_size();
    for row in 0..rows {
        let bytes = &data[row * row_bytes..(row + 1) * row_bytes];
        let ok = match dtype {
            GgmlDType::Q4_0 => q4_0(bytes, |b, d, m, q| {
                matrix.set_block(first + row, b, d, m, q)
            }),
            GgmlDType::Q4_1 => q4_1(bytes, |b, d, m, q| {
                matrix.set_block(first + row, b, d, m, q)
            }),
            GgmlDType::Q4K => q4_k(bytes, |b, d, m, q| {
                matrix.set_block(first + row, b, d, m, q)
            }),
            other => {
                return Err(crate::error::LlmError::Internal(format!(
                    "{other:?} is not a 4-bit type"
                )));
            }
        };
        if !ok {
            return Ok(false);
        }
    }
    Ok(true)
}

/// `f16` at `bytes[at..at + 2]`, little-endian, as f32.
fn half(bytes: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([bytes[at], bytes[at + 1]]).to_f32()
}

/// The 32 nibbles of 16 bytes: byte `i` holds weight `i` low and weight `16 + i` high.
fn nibbles(qs: &[u8]) -> [u8; BLOCK] {
    std::array::from_fn(|i| if i < 16 { qs[i] & 0xF } else { qs[i - 16] >> 4 })
}

/// Q4_0, 18 bytes per 32 weights: `d`, 16 bytes of nibbles; `w = d * (q - 8)`.
fn q4_0(row: &[u8], mut set: impl FnMut(usize, f32, f32, &[u8; BLOCK])) -> bool {
    for (b, block) in row.chunks_exact(18).enumerate() {
        let d = half(block, 0);
        // `-8 d` is exact in f16 (a power of two times an f16) unless it overflows.
        if !fits_f16(-8.0 * d) {
            return false;
        }
        set(b, d, -8.0 * d, &nibbles(&block[2..]));
    }
    true
}

/// Q4_1, 20 bytes per 32 weights: `d`, `m`, 16 bytes of nibbles; `w = d * q + m`.
fn q4_1(row: &[u8], mut set: impl FnMut(usize, f32, f32, &[u8; BLOCK])) -> bool {
    for (b, block) in row.chunks_exact(20).enumerate() {
        set(b, half(block, 0), half(block, 2), &nibbles(&block[4..]));
    }
    true
}

/// Q4_K, 144 bytes per 256 weights: `d`, `dmin`, 12 bytes packing 8 six-bit scales and mins,
/// 128 bytes of nibbles (each 32 bytes hold sub-block `2i` low and `2i + 1` high);
/// sub-block `j` is `w = d * sc_j * q - dmin * m_j`.
fn q4_k(row: &[u8], mut set: impl FnMut(usize, f32, f32, &[u8; BLOCK])) -> bool {
    for (s, block) in row.chunks_exact(144).enumerate() {
        let (d, dmin) = (half(block, 0), half(block, 2));
        let packed = &block[4..16];
        let qs = &block[16..];
        for j in 0..8 {
            let (sc, m) = scale_min_k4(j, packed);
            let (scale, offset) = (d * sc as f32, -dmin * m as f32);
            if !fits_f16(scale) || !fits_f16(offset) {
                return false;
            }
            let chunk = &qs[32 * (j / 2)..32 * (j / 2) + 32];
            let q = std::array::from_fn(|l| {
                if j % 2 == 0 {
                    chunk[l] & 0xF
                } else {
                    chunk[l] >> 4
                }
            });
            set(8 * s + j, scale, offset, &q);
        }
    }
    true
}

/// Scale and min of sub-block `j` from Q4_K's 12 packed bytes: the first four pairs in the
/// low 6 bits of bytes `j` and `j + 4`, the last four from a nibble of bytes `j + 4` and the
/// top 2 bits of bytes `j - 4` and `j`.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

fn fits_f16(v: f32) -> bool {
    let back = f16::from_f32(v).to_f32();
    (back - v).abs() <= v.abs() * MAX_SCALE_ERROR
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Tensor};

    /// Each type's blocks, written by candle's quantizer, read back through the 4-bit matrix
    /// equal candle's own dequantization (llama.cpp's definition; `tests/quantized.rs` checks
    /// candle's against the `gguf` package's): to f16 rounding of Q4_K's products.
    #[test]
    fn every_four_bit_type_reads_back_as_candle_dequantizes_it() {
        let (n, k) = (21, 512);
        let values: Vec<f32> = (0..n * k)
            .map(|i| {
                ((i * 7919 % 1013) as f32 - 506.0) / 5060.0 * if i % 700 < 40 { 0.01 } else { 1.0 }
            })
            .collect();
        let t = Tensor::from_vec(values, (n, k), &Device::Cpu).unwrap();
        for dtype in [GgmlDType::Q4_0, GgmlDType::Q4_1, GgmlDType::Q4K] {
            let q = QTensor::quantize(&t, dtype).unwrap();
            let want: Vec<f32> = q
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap();
            let mut m = Int4Matrix::zeros(n + 3, k);
            assert!(fill(&mut m, 3, &q).unwrap(), "{dtype:?}");
            let mut row = vec![0.0; k];
            for r in 0..n {
                m.dequantize_row(r + 3, &mut row);
                for (c, (got, expected)) in row.iter().zip(&want[r * k..]).enumerate() {
                    // Q4_K's `d * sc` and `dmin * m` rounded to f16, each within 2^-12 of itself:
                    // measured up to 8e-4 of the block's largest magnitude; a nibble or scale
                    // out of place moves a weight by a whole step, over 1/15 of the block's
                    // range.
                    let block = &want[r * k + c / BLOCK * BLOCK..][..BLOCK];
                    let largest = block.iter().fold(0.0f32, |a, v| a.max(v.abs()));
                    // The others: `d * q + m` fused here, rounded twice in candle.
                    let bound = largest
                        * if dtype == GgmlDType::Q4K {
                            4e-3
                        } else {
                            2.4e-7
                        };
                    assert!(
                        (got - expected).abs() <= bound,
                        "{dtype:?} row {r} weight {c}: {got} vs {expected}"
                    );
                }
            }
        }
    }

    #[test]
    fn a_q4_0_offset_past_f16_range_is_refused() {
        let mut block = vec![0u8; 18];
        block[0..2].copy_from_slice(&f16::from_f32(10000.0).to_le_bytes());
        assert!(!q4_0(&block, |_, _, _, _| {}));
        block[0..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        assert!(q4_0(&block, |_, _, _, _| {}));
    }

    #[test]
    fn a_q4_k_scale_past_f16_range_is_refused() {
        // d = 60000 times a 6-bit scale of 63 is past f16's range.
        let mut block = vec![0u8; 144];
        block[0..2].copy_from_slice(&f16::from_f32(60000.0).to_le_bytes());
        block[4] = 63;
        assert!(!q4_k(&block, |_, _, _, _| {}));
        block[0..2].copy_from_slice(&f16::from_f32(0.01).to_le_bytes());
        assert!(q4_k(&block, |_, _, _, _| {}));
    }
}
