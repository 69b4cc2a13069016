//! 4-bit weights: each block of [`BLOCK`] weights is `w = d * q + m` with `q` in `0..=15` and
//! an f16 scale `d` and offset `m` per block (GGUF's Q4_1; Q4_0 and Q4_K load into it too),
//! 20 bytes per 32 weights against the int8 format's 34. Single-stream decode reads every
//! weight once per token, so it goes as fast as the bytes it reads; this format reads 41%
//! fewer than the int8 one, and its weights are the file's own, not requantized.
//!
//! A panel's block is 5 cache lines: 4 of nibbles, in the int8 format's order (line `j`
//! holds weights `4j..4j+4` of each of the 16 rows in its low nibbles and weights
//! `16+4j..16+4j+4` in its high ones, as Q4_1 pairs them), then one line of the 16 scales and
//! 16 offsets. One stream per panel, so one prefetch distance serves it all.
//!
//! Per block, the kernels compute the exact integer sum `s = sum(q * a)` and then
//! `acc = fma(s, d * d_a, acc)` followed by `acc = fma(sum(a), m * d_a, acc)`: every kernel
//! the same f32 operations in the same order as `tile` here, so all agree bit for bit.

#[cfg(target_arch = "x86_64")]
mod x86;

use half::f16;

use crate::pages::Buffer;
use crate::panel::{Line, Tile};
use crate::{BLOCK, ColumnsMut, Int8Rows, Isa, PANEL, WeightArena};

/// Cache lines per block of a panel: 4 of nibbles, 1 of scales and offsets.
pub(crate) const LINES: usize = 5;
/// Lines of nibbles per block.
const NIBBLE_LINES: usize = 4;

/// An `n x k` weight matrix of 4-bit blocks (see the module docs), in panels of [`PANEL`]
/// rows. `k` is a multiple of [`BLOCK`]; rows past `n` in the last panel are zeros.
#[derive(Clone)]
pub struct Int4Matrix {
    n: usize,
    k: usize,
    lines: Buffer<Line>,
}

impl std::fmt::Debug for Int4Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Int4Matrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

impl Int4Matrix {
    /// An `n x k` matrix of zeros, to be filled with [`Int4Matrix::set_block`].
    ///
    /// # Panics
    /// When `k` is not a positive multiple of [`BLOCK`].
    pub fn zeros(n: usize, k: usize) -> Self {
        crate::panel::check_row_length(k);
        let lines = vec![Line([0; 4 * PANEL]); Self::line_count(n, k)];
        Self {
            n,
            k,
            lines: Buffer::from_vec(lines),
        }
    }

    /// [`Int4Matrix::zeros`] in `arena`'s memory (huge pages, next to the matrices made
    /// before it).
    ///
    /// # Panics
    /// When `k` is not a positive multiple of [`BLOCK`].
    pub fn zeros_in(arena: &mut WeightArena, n: usize, k: usize) -> Self {
        crate::panel::check_row_length(k);
        Self {
            n,
            k,
            lines: arena.take(Self::line_count(n, k)),
        }
    }

    fn line_count(n: usize, k: usize) -> usize {
        n.div_ceil(PANEL) * (k / BLOCK) * LINES
    }

    /// `values` (`n x k`, row-major) quantized per block as GGUF's Q4_1 does: `m` the block's
    /// minimum, `d = (max - m) / 15`, `q = round((w - m) / d)`.
    pub fn quantize(values: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(values.len(), n * k, "{} values for {n} x {k}", values.len());
        let mut matrix = Self::zeros(n, k);
        for (row, values) in values.chunks_exact(k).enumerate() {
            for (block, w) in values.chunks_exact(BLOCK).enumerate() {
                let min = w.iter().copied().fold(f32::INFINITY, f32::min);
                let max = w.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let d = (max - min) / 15.0;
                let inverse = if d > 0.0 { 1.0 / d } else { 0.0 };
                let q = std::array::from_fn(|i| {
                    ((w[i] - min) * inverse).round().clamp(0.0, 15.0) as u8
                });
                matrix.set_block(row, block, d, min, &q);
            }
        }
        matrix
    }

    /// Block `block` of row `row`: `w[i] = d * q[i] + m`, `d` and `m` stored as f16
    /// (rounded to nearest).
    ///
    /// # Panics
    /// When the row or block is out of range or a `q` is over 15.
    pub fn set_block(&mut self, row: usize, block: usize, d: f32, m: f32, q: &[u8; BLOCK]) {
        let blocks = self.k / BLOCK;
        assert!(
            row < self.n && block < blocks,
            "block {block} of row {row} in a {} x {} matrix",
            self.n,
            self.k
        );
        assert!(q.iter().all(|&q| q < 16), "4-bit values above 15: {q:?}");
        let (panel, lane) = (row / PANEL, row % PANEL);
        let first = (panel * blocks + block) * LINES;
        for j in 0..NIBBLE_LINES {
            for t in 0..4 {
                self.lines[first + j].0[lane * 4 + t] = q[4 * j + t] | q[16 + 4 * j + t] << 4;
            }
        }
        let scales = &mut self.lines[first + NIBBLE_LINES].0;
        scales[2 * lane..2 * lane + 2].copy_from_slice(&f16::from_f32(d).to_le_bytes());
        scales[32 + 2 * lane..34 + 2 * lane].copy_from_slice(&f16::from_f32(m).to_le_bytes());
    }

    /// Output rows.
    pub fn out_dim(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// Bytes held (20 per 32 weights, plus the last panel's padding).
    pub fn size_bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>()
    }

    /// Row `row`, dequantized (`d * q + m`), into `out` (`k` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.n && out.len() == self.k,
            "row {row} into {}",
            out.len()
        );
        let blocks = self.k / BLOCK;
        let (panel, lane) = (row / PANEL, row % PANEL);
        for (b, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let block = &self.lines[(panel * blocks + b) * LINES..][..LINES];
            let (d, m) = scale_and_offset(&block[NIBBLE_LINES], lane);
            for (c, o) in out.iter_mut().enumerate() {
                *o = d.mul_add(nibble(block, lane, c) as f32, m);
            }
        }
    }

    /// `out = x W^T` for the columns `out` covers, with the fastest kernel this CPU has;
    /// as [`crate::Int8Matrix::matmul`], which says how threads split one product.
    ///
    /// # Panics
    /// When the shapes disagree, or `out` starts at a column that is not a multiple of
    /// [`PANEL`] or ends past `n` or inside a panel before `n`.
    pub fn matmul(&self, x: &Int8Rows, out: ColumnsMut<'_>) {
        self.matmul_with(Isa::detect(), x, out);
    }

    /// [`Int4Matrix::matmul`] with kernel `isa` (for tests and benchmarks).
    ///
    /// # Panics
    /// As `matmul`, and when this CPU cannot run `isa`.
    pub fn matmul_with(&self, isa: Isa, x: &Int8Rows, out: ColumnsMut<'_>) {
        let per_panel = self.k / BLOCK * LINES;
        crate::product::product((self.n, self.k), isa, false, x, out, |panel, t, out| {
            let lines = &self.lines[panel * per_panel..(panel + 1) * per_panel];
            match isa {
                Isa::Scalar => tile(lines, t, out),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx2 => x86::tile_avx2(lines, t, out),
                #[cfg(target_arch = "x86_64")]
                Isa::Avx512Vnni => x86::tile_vnni(lines, t, out),
                #[cfg(not(target_arch = "x86_64"))]
                _ => unreachable!("checked by is_available"),
            }
        });
    }
}

/// Weight `c` (of the block's 32) of row `lane` of a panel's block.
fn nibble(block: &[Line], lane: usize, c: usize) -> u8 {
    let byte = block[(c % 16) / 4].0[lane * 4 + c % 4];
    if c < 16 { byte & 0xF } else { byte >> 4 }
}

/// Row `lane`'s scale and offset from a block's last line.
fn scale_and_offset(line: &Line, lane: usize) -> (f32, f32) {
    let read = |at: usize| f16::from_le_bytes([line.0[at], line.0[at + 1]]).to_f32();
    (read(2 * lane), read(32 + 2 * lane))
}

/// The sum of a block's quantized activations, from the bias the int8 kernels use
/// (`-128 * sum`): exact.
pub(crate) fn activation_sum(bias: i32) -> f32 {
    (-bias / 128) as f32
}

/// The portable kernel, and the reference the SIMD ones equal bit for bit.
fn tile(lines: &[Line], x: Tile<'_>, out: &mut [[f32; PANEL]]) {
    let blocks = lines.len() / LINES;
    let k = blocks * BLOCK;
    for (r, out) in out.iter_mut().enumerate() {
        *out = [0.0; PANEL];
        for b in 0..blocks {
            let block = &lines[b * LINES..][..LINES];
            let a = &x.q[r * k + b * BLOCK..][..BLOCK];
            let da = x.scales[r * blocks + b];
            let sum_a = activation_sum(x.bias[r * blocks + b]);
            for (lane, acc) in out.iter_mut().enumerate() {
                let sum: i32 = (0..BLOCK)
                    .map(|c| nibble(block, lane, c) as i32 * a[c] as i32)
                    .sum();
                let (d, m) = scale_and_offset(&block[NIBBLE_LINES], lane);
                *acc = (sum as f32).mul_add(d * da, *acc);
                *acc = sum_a.mul_add(m * da, *acc);
            }
        }
    }
}
