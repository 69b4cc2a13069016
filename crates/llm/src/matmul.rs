//! The weight matrices of the forward pass and how a product by one runs: the 4-bit or int8
//! kernel of `modelmux-kernels` with its columns split over the thread pool (`parallel`),
//! or, for the reference formats, candle's `QMatMul`. Slices in, slices out; no allocation
//! per product on the kernels' path (the quantized activations live in a buffer the caller
//! reuses).

use std::ops::Range;
use std::sync::Arc;

use candle_core::quantized::{QMatMul, QTensor, ggml_file::qtensor_from_ggml};
use candle_core::{Device, Module, Tensor};
use modelmux_kernels::{BLOCK, ColumnsMut, Int4Matrix, Int8Matrix, Int8Rows, PANEL, WeightArena};

use crate::error::Result;
use crate::parallel;

/// Products smaller than this (multiply-adds) run on the calling thread: waking the pool
/// costs more than it saves.
const PARALLEL_MIN_WORK: usize = 1 << 16;
/// Rows dequantized at a time when converting a matrix, so a large one (the vocabulary head)
/// never exists in f32 all at once.
const CONVERT_ROWS: usize = 1024;

/// A weight matrix `[out, in]`, possibly several stored ones stacked (q, k and v; gate and
/// up), so one product computes all of them from one quantization of the input.
pub(crate) struct Matrix {
    out_dim: usize,
    in_dim: usize,
    kernel: Kernel,
}

enum Kernel {
    /// `modelmux-kernels`' int8 kernel.
    Int8(Int8Matrix),
    /// `modelmux-kernels`' 4-bit kernel (the file's 4-bit weights as they are).
    Int4(Int4Matrix),
    /// candle's kernel for the format held, one per stacked part, with its output rows.
    Candle(Vec<(QMatMul, usize)>),
}

impl Matrix {
    /// `parts` stacked in the 4-bit kernel's format, each block as the file stores it. `None`
    /// when a part is not a 4-bit type (`q4`), a row's length is not a multiple of the
    /// kernel's block, or a Q4_K scale does not fit an f16 (found while filling: the
    /// matrix's share of `arena`, where its memory comes from, is then left unused).
    pub(crate) fn int4(parts: &[&QTensor], arena: &mut WeightArena) -> Result<Option<Self>> {
        let (out_dim, in_dim) = stacked_dims(parts)?;
        if !in_dim.is_multiple_of(BLOCK)
            || !parts
                .iter()
                .all(|p| crate::gguf::int4::is_four_bit(p.dtype()))
        {
            return Ok(None);
        }
        let mut matrix = Int4Matrix::zeros_in(arena, out_dim, in_dim);
        let mut first = 0;
        for part in parts {
            if !crate::gguf::int4::fill(&mut matrix, first, part)? {
                return Ok(None);
            }
            first += part.shape().dims2()?.0;
        }
        Ok(Some(Self {
            out_dim,
            in_dim,
            kernel: Kernel::Int4(matrix),
        }))
    }

    /// `parts` stacked (their rows one after another) in the int8 kernel's format: each
    /// dequantized a slice of rows at a time and quantized to int8 blocks. `None` when a
    /// row's length is not a multiple of the kernel's block. The memory comes from `arena`.
    pub(crate) fn int8(parts: &[&QTensor], arena: &mut WeightArena) -> Result<Option<Self>> {
        let (out_dim, in_dim) = stacked_dims(parts)?;
        if !in_dim.is_multiple_of(BLOCK) {
            return Ok(None);
        }
        let mut matrix = Int8Matrix::zeros_in(arena, out_dim, in_dim);
        let mut first = 0;
        for part in parts {
            let (rows, _) = part.shape().dims2()?;
            let dtype = part.dtype();
            let data = part.data()?;
            let row_bytes = in_dim / dtype.block_size() * dtype.type_size();
            for start in (0..rows).step_by(CONVERT_ROWS) {
                let n = CONVERT_ROWS.min(rows - start);
                let raw = &data[start * row_bytes..(start + n) * row_bytes];
                let slice = qtensor_from_ggml(dtype, raw, vec![n, in_dim], &Device::Cpu)?;
                let values = slice.dequantize(&Device::Cpu)?.flatten_all()?.to_vec1()?;
                matrix.set_rows(first + start, &values);
            }
            first += rows;
        }
        Ok(Some(Self {
            out_dim,
            in_dim,
            kernel: Kernel::Int8(matrix),
        }))
    }

    /// `parts` stacked, each run by candle's kernel for its format (f32 and f16 as f32).
    pub(crate) fn candle(parts: Vec<Arc<QTensor>>) -> Result<Self> {
        let (out_dim, in_dim) = stacked_dims(&parts.iter().map(|p| &**p).collect::<Vec<_>>())?;
        let mut kernels = Vec::with_capacity(parts.len());
        for part in parts {
            let rows = part.shape().dims2()?.0;
            kernels.push((QMatMul::from_arc(part)?, rows));
        }
        Ok(Self {
            out_dim,
            in_dim,
            kernel: Kernel::Candle(kernels),
        })
    }

    /// candle's f32 matmul over `values` (`out x in`).
    pub(crate) fn f32(values: Tensor) -> Result<Self> {
        let (out_dim, in_dim) = values.dims2()?;
        Ok(Self {
            out_dim,
            in_dim,
            kernel: Kernel::Candle(vec![(QMatMul::Tensor(values), out_dim)]),
        })
    }

    /// Whether the matrix is in one of the kernels' formats, not candle's: then
    /// [`Matrix::dequantize_row`] can read its rows back, and its product splits its work on
    /// the pool of `parallel` (candle's splits on candle's own).
    pub(crate) fn in_kernel_format(&self) -> bool {
        !matches!(self.kernel, Kernel::Candle(_))
    }

    /// Row `row` (`in` values) as the kernel multiplies by it.
    ///
    /// # Panics
    /// When the matrix is in candle's format (see [`Matrix::in_kernel_format`]).
    pub(crate) fn dequantize_row(&self, row: usize, out: &mut [f32]) {
        match &self.kernel {
            Kernel::Int8(m) => m.dequantize_row(row, out),
            Kernel::Int4(m) => m.dequantize_row(row, out),
            Kernel::Candle(_) => panic!("rows of candle's matrices are not read back"),
        }
    }

    pub(crate) fn out_dim(&self) -> usize {
        self.out_dim
    }

    /// Bytes the matrix holds.
    pub(crate) fn size_bytes(&self) -> u64 {
        match &self.kernel {
            Kernel::Int8(m) => m.size_bytes() as u64,
            Kernel::Int4(m) => m.size_bytes() as u64,
            Kernel::Candle(parts) => parts
                .iter()
                .map(|(m, _)| match m {
                    QMatMul::QTensor(t) => t.storage_size_in_bytes(),
                    QMatMul::Tensor(t) | QMatMul::TensorF16(t) => {
                        t.elem_count() * t.dtype().size_in_bytes()
                    }
                })
                .sum::<usize>() as u64,
        }
    }

    /// `out = x W^T`: `x` is `rows x in`, `out` is `rows x out`. `scratch` holds the
    /// quantized `x` (reused from call to call).
    pub(crate) fn forward(&self, x: &[f32], out: &mut [f32], scratch: &mut Int8Rows) -> Result<()> {
        let rows = x.len() / self.in_dim;
        debug_assert_eq!(x.len(), rows * self.in_dim);
        debug_assert_eq!(out.len(), rows * self.out_dim);
        match &self.kernel {
            Kernel::Int8(m) => {
                scratch.quantize(x, self.in_dim);
                parallel_matmul(self.out_dim, self.in_dim, scratch, out, |c| {
                    m.matmul(scratch, c)
                });
            }
            Kernel::Int4(m) => {
                scratch.quantize(x, self.in_dim);
                parallel_matmul(self.out_dim, self.in_dim, scratch, out, |c| {
                    m.matmul(scratch, c)
                });
            }
            Kernel::Candle(parts) => {
                let x = Tensor::from_slice(x, (rows, self.in_dim), &Device::Cpu)?;
                let mut first = 0;
                for (matmul, n) in parts {
                    let y = matmul.forward(&x)?.flatten_all()?.to_vec1::<f32>()?;
                    for (out, y) in out.chunks_exact_mut(self.out_dim).zip(y.chunks_exact(*n)) {
                        out[first..first + n].copy_from_slice(y);
                    }
                    first += n;
                }
            }
        }
        Ok(())
    }
}

fn stacked_dims(parts: &[&QTensor]) -> Result<(usize, usize)> {
    let mut out_dim = 0;
    let mut in_dim = None;
    for part in parts {
        let (rows, columns) = part.shape().dims2()?;
        if *in_dim.get_or_insert(columns) != columns {
            return Err(crate::error::LlmError::Internal(format!(
                "stacked matrices of {columns} and {in_dim:?} columns"
            )));
        }
        out_dim += rows;
    }
    Ok((out_dim, in_dim.unwrap_or(0)))
}

/// The product (`matmul` of a column range) with its output columns split in chunks of whole
/// panels that the pool's threads take in turn (`parallel`).
fn parallel_matmul(
    n: usize,
    in_dim: usize,
    x: &Int8Rows,
    out: &mut [f32],
    matmul: impl Fn(ColumnsMut<'_>) + Sync,
) {
    let threads = parallel::threads();
    let chunk = if x.rows() * n * in_dim < PARALLEL_MIN_WORK {
        n
    } else {
        n.div_ceil(PANEL).div_ceil(threads * 4).max(1) * PANEL
    };
    parallel::for_each_column_chunk(out, n, chunk, matmul);
}

/// Column ranges of a stacked output: `ranges(&[a, b, c])` is `[0..a, a..a+b, a+b..a+b+c]`.
pub(crate) fn ranges<const N: usize>(widths: [usize; N]) -> [Range<usize>; N] {
    let mut start = 0;
    widths.map(|w| {
        start += w;
        start - w..start
    })
}
