//! The int8 weight matrix in panels of 16 output rows. The product's loop over panels and row
//! tiles is `product`'s (shared with the 4-bit format); the kernels for one (panel, row tile)
//! are in `scalar` and `x86`.

mod portable;
#[cfg(target_arch = "x86_64")]
pub(crate) mod x86;

use half::f16;

use crate::pages::Buffer;
use crate::panel::{GROUPS, Line, Panel, Tile};
use crate::quantize::round_to_i8;
use crate::{BLOCK, ColumnsMut, Int8Rows, Isa, PANEL, WeightArena};

/// Zero weights: bytes `q ^ 0x80` of `q = 0`.
const ZERO_LINE: Line = Line([0x80; 4 * PANEL]);

/// An `n x k` weight matrix as int8 blocks of [`BLOCK`] values with an f16 scale each,
/// repacked into panels of [`PANEL`] rows (see the crate docs). `k` is a multiple of
/// [`BLOCK`]; rows past `n` in the last panel are zeros.
#[derive(Clone)]
pub struct Int8Matrix {
    n: usize,
    k: usize,
    lines: Buffer<Line>,
    scales: Buffer<u16>,
}

impl std::fmt::Debug for Int8Matrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Int8Matrix")
            .field("n", &self.n)
            .field("k", &self.k)
            .finish()
    }
}

impl Int8Matrix {
    /// An `n x k` matrix of zeros, to be filled with [`Int8Matrix::set_rows`].
    ///
    /// # Panics
    /// When `k` is not a positive multiple of [`BLOCK`].
    pub fn zeros(n: usize, k: usize) -> Self {
        crate::panel::check_row_length(k);
        let (lines, scales) = Self::counts(n, k);
        Self {
            n,
            k,
            lines: Buffer::from_vec(vec![ZERO_LINE; lines]),
            scales: Buffer::from_vec(vec![0; scales]),
        }
    }

    /// [`Int8Matrix::zeros`] in `arena`'s memory (huge pages, next to the matrices made
    /// before it).
    ///
    /// # Panics
    /// When `k` is not a positive multiple of [`BLOCK`].
    pub fn zeros_in(arena: &mut WeightArena, n: usize, k: usize) -> Self {
        crate::panel::check_row_length(k);
        let (lines, scales) = Self::counts(n, k);
        let mut lines = arena.take(lines);
        lines.fill(ZERO_LINE);
        Self {
            n,
            k,
            lines,
            scales: arena.take(scales),
        }
    }

    /// Lines and scales of an `n x k` matrix.
    fn counts(n: usize, k: usize) -> (usize, usize) {
        let (panels, blocks) = (n.div_ceil(PANEL), k / BLOCK);
        (panels * blocks * GROUPS, panels * blocks * PANEL)
    }

    /// `values` (`n x k`, row-major) quantized.
    pub fn quantize(values: &[f32], n: usize, k: usize) -> Self {
        let mut m = Self::zeros(n, k);
        m.set_rows(0, values);
        m
    }

    /// Quantizes `values` (whole rows) into rows `first..`: per block, `d = max|w| / 127`
    /// rounded to f16, `q = round(w / d)`.
    ///
    /// # Panics
    /// When `values` is not whole rows or they run past row `n`.
    pub fn set_rows(&mut self, first: usize, values: &[f32]) {
        assert!(
            values.len().is_multiple_of(self.k) && first + values.len() / self.k <= self.n,
            "{} values are not whole rows {first}.. of a {} x {} matrix",
            values.len(),
            self.n,
            self.k
        );
        let blocks = self.k / BLOCK;
        for (i, row) in values.chunks_exact(self.k).enumerate() {
            let (panel, lane) = ((first + i) / PANEL, (first + i) % PANEL);
            for (b, w) in row.chunks_exact(BLOCK).enumerate() {
                let amax = w.iter().fold(0.0f32, |m, v| m.max(v.abs()));
                let d = f16::from_f32(amax / 127.0);
                let inverse = if d.to_f32() > 0.0 {
                    1.0 / d.to_f32()
                } else {
                    0.0
                };
                let pb = panel * blocks + b;
                self.scales[pb * PANEL + lane] = d.to_bits();
                for (c, v) in w.iter().enumerate() {
                    let q = round_to_i8(v * inverse);
                    let line = &mut self.lines[pb * GROUPS + c / 4];
                    line.0[lane * 4 + c % 4] = q as u8 ^ 0x80;
                }
            }
        }
    }

    /// Output rows.
    pub fn out_dim(&self) -> usize {
        self.n
    }

    /// Input columns.
    pub fn in_dim(&self) -> usize {
        self.k
    }

    /// Bytes held (34 per 32 weights, plus the last panel's padding).
    pub fn size_bytes(&self) -> usize {
        self.lines.len() * std::mem::size_of::<Line>() + self.scales.len() * 2
    }

    /// Row `row`, dequantized (`d * q`), into `out` (`k` values).
    pub fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        assert!(
            row < self.n && out.len() == self.k,
            "row {row} into {}",
            out.len()
        );
        let blocks = self.k / BLOCK;
        let (panel, lane) = (row / PANEL, row % PANEL);
        for (b, out) in out.chunks_exact_mut(BLOCK).enumerate() {
            let pb = panel * blocks + b;
            let d = f16::from_bits(self.scales[pb * PANEL + lane]).to_f32();
            for (c, o) in out.iter_mut().enumerate() {
                let q = (self.lines[pb * GROUPS + c / 4].0[lane * 4 + c % 4] ^ 0x80) as i8;
                *o = d * q as f32;
            }
        }
    }

    /// `out = x W^T` for the columns `out` covers, with the fastest kernel this CPU has.
    /// `out` may be any column range of a `x.rows() x stride` buffer whose columns are this
    /// matrix's output rows; threads split one product with [`crate::ColumnChunks`].
    ///
    /// # Panics
    /// When the shapes disagree, or `out` starts at a column that is not a multiple of
    /// [`PANEL`] or ends past `n` or inside a panel before `n`.
    pub fn matmul(&self, x: &Int8Rows, out: ColumnsMut<'_>) {
        self.matmul_with(Isa::detect(), x, out);
    }

    /// [`Int8Matrix::matmul`] with kernel `isa` (for tests and benchmarks).
    ///
    /// # Panics
    /// As `matmul`, and when this CPU cannot run `isa`.
    pub fn matmul_with(&self, isa: Isa, x: &Int8Rows, out: ColumnsMut<'_>) {
        let blocks = self.k / BLOCK;
        let wide = isa == Isa::Avx2;
        crate::product::product((self.n, self.k), isa, wide, x, out, |panel, t, out| {
            let weights = Panel {
                lines: &self.lines[panel * blocks * GROUPS..(panel + 1) * blocks * GROUPS],
                scales: &self.scales[panel * blocks * PANEL..(panel + 1) * blocks * PANEL],
            };
            run_tile(isa, weights, t, out);
        });
    }
}

/// One panel times `out.len()` activation rows (at most the kernel's tile).
fn run_tile(isa: Isa, panel: Panel<'_>, x: Tile<'_>, out: &mut [[f32; PANEL]]) {
    match isa {
        Isa::Scalar => portable::tile(panel, x, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => x86::tile_avx2(panel, x, out),
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512Vnni => x86::tile_vnni(panel, x, out),
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("checked by is_available"),
    }
}
