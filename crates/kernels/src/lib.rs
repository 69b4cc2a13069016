//! `modelmux-kernels`: the matrix products of modelmux's LLM runtime, over int8 and 4-bit
//! weights.
//!
//! `y = x W^T` for activations `x` (`rows x k`, f32) and a weight matrix `W` (`n x k`) stored
//! as int8 in blocks of 32 values with one f16 scale each (like GGUF's Q8_0, 34 bytes per 32
//! weights). Activations are quantized once per product, per block of 32 values, to int8
//! with an f32 scale ([`Int8Rows`]), so each block's dot product is exact integer arithmetic
//! and only the per-block sums are scaled and added in f32.
//!
//! The weights are repacked into panels of 16 output rows ([`Int8Matrix`]): for each block,
//! the 16 rows' 4-byte groups are interleaved, so one 64-byte vector holds 4 consecutive
//! weights of 16 rows, and an AVX-512 VNNI `vpdpbusd` against 4 activation bytes broadcast
//! to every lane adds 4 products to each of 16 output columns at once. The 16 columns stay
//! in the lanes: no horizontal sums, and each weight vector loaded serves up to 8 activation
//! rows (register blocking), so a step of 8 decode rows reads the weights once.
//!
//! The kernels compute identical results (the same integer sums, then the same f32
//! operations in the same order): AVX-512 VNNI, AVX2 (`vpmaddwd` on 16-bit pairs for tiles of
//! 3 to 8 rows, `vpmaddubsw` with the sign trick for 1 or 2), and portable scalar code;
//! [`Isa::detect`] picks the best the CPU has at run time.
//!
//! [`Int4Matrix`] holds 4-bit weights in the same panels (`w = d * q + m` per block of 32,
//! `q` in `0..=15`, GGUF's Q4_1: 20 bytes per 32 weights) and multiplies them by the same
//! quantized activations, for models whose files store 4-bit weights: it reads 41% fewer
//! bytes, which is what single-stream decode waits on.
//!
//! The weights' memory can come from a [`WeightArena`] (`Int4Matrix::zeros_in`,
//! `Int8Matrix::zeros_in`): mappings backed by transparent huge pages, the matrices one after
//! another in the order they are made, which is the order a decode step reads them.
//!
//! Threads are the caller's: [`ColumnChunks`] hands out disjoint column ranges of one output
//! buffer to any number of threads, each of which calls [`Int8Matrix::matmul`] on its chunk.
//!
//! ```
//! use modelmux_kernels::{ColumnsMut, Int8Matrix, Int8Rows};
//!
//! let (n, k) = (20, 64);
//! let w: Vec<f32> = (0..n * k).map(|i| ((i * 7 % 13) as f32 - 6.0) / 10.0).collect();
//! let matrix = Int8Matrix::quantize(&w, n, k);
//! let x: Vec<f32> = (0..2 * k).map(|i| (i % 5) as f32 - 2.0).collect();
//! let mut rows = Int8Rows::new();
//! rows.quantize(&x, k);
//! let mut y = vec![0.0; 2 * n];
//! matrix.matmul(&rows, ColumnsMut::new(&mut y, n));
//! let exact: f32 = w[..k].iter().zip(&x[..k]).map(|(a, b)| a * b).sum();
//! assert!((y[0] - exact).abs() < 0.05 * exact.abs().max(1.0));
//! ```

#![deny(unsafe_op_in_unsafe_fn)]

mod attend;
mod columns;
mod int4;
mod int8;
mod isa;
mod pages;
mod panel;
mod product;
mod quantize;
pub mod vector;

pub use columns::{ColumnChunks, ColumnsMut};
pub use int4::Int4Matrix;
pub use int8::Int8Matrix;
pub use isa::{Isa, KERNEL_ENV};
pub use pages::{WeightArena, release_free_heap};
pub use quantize::Int8Rows;

/// Values per quantization block (one scale each), for weights and activations.
pub const BLOCK: usize = 32;
/// Output rows per weight panel: the unit of work, and how column ranges are aligned.
pub const PANEL: usize = 16;
