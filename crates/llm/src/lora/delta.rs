//! The adapters' deltas on one projection of one step, in Punica's two halves:
//! - *shrink*: `u = x A^T` for each adapter's rows (`rows x rank`, small), computed before
//!   the base product;
//! - *expand*: `y += u B^T` for a band of output columns, run by the thread that has just
//!   written that band of the base product (see `Matrix::forward_with`).
//!
//! So the adapters add no parallel section of their own to a step: with 8 sequences on 8
//! adapters a step used to wait, per projection and layer, for a second section of 8 one-row
//! pieces on a thread pool that had gone to sleep (measured: CPU time +3% over the base model,
//! wall time +19%). Each adapter's `B` band is read once per step, by the thread writing it.

use std::ops::Range;

use modelmux_kernels::{ColumnsMut, vector};

use super::LoraPair;
use crate::parallel;

/// Shrinks smaller than this (multiply-adds) run on the calling thread.
const PARALLEL_MIN_WORK: usize = 1 << 18;
/// Rows of one piece of a shrink split over threads.
const PIECE_ROWS: usize = 32;

/// One adapter's delta on one stacked part of a projection's output.
struct Part<'a> {
    /// The batch rows it applies to.
    rows: Range<usize>,
    /// The output columns of the stacked part (`B`'s rows).
    columns: Range<usize>,
    pair: &'a LoraPair,
    /// `x A^T` for `rows`: `rows.len() x rank`.
    u: Vec<f32>,
}

/// The deltas of every adapter in a step on one projection, shrunk and ready to expand.
pub(crate) struct Deltas<'a> {
    parts: Vec<Part<'a>>,
}

impl<'a> Deltas<'a> {
    /// Computes `x A^T` for every `(rows, columns, pair)`: `pair` applies to batch rows `rows`
    /// of `x` (rows of `in_dim` values) and writes output columns `columns`.
    pub(crate) fn shrink(
        deltas: impl IntoIterator<Item = (Range<usize>, Range<usize>, &'a LoraPair)>,
        x: &[f32],
        in_dim: usize,
    ) -> Self {
        let mut parts: Vec<Part<'a>> = deltas
            .into_iter()
            .map(|(rows, columns, pair)| Part {
                u: vec![0.0; rows.len() * pair.rank],
                rows,
                columns,
                pair,
            })
            .collect();
        let work: usize = parts.iter().map(|p| p.u.len() * in_dim).sum();
        // Pieces of at most `PIECE_ROWS` rows each: its pair, its rows of `x` and of `u`.
        let mut pieces: Vec<(&LoraPair, &[f32], &mut [f32])> = Vec::new();
        for part in &mut parts {
            let (rank, rows) = (part.pair.rank, &part.rows);
            let x = &x[rows.start * in_dim..rows.end * in_dim];
            let per_piece = if work < PARALLEL_MIN_WORK {
                rows.len()
            } else {
                PIECE_ROWS
            };
            for (x, u) in x
                .chunks(per_piece * in_dim)
                .zip(part.u.chunks_mut(per_piece * rank))
            {
                pieces.push((part.pair, x, u));
            }
        }
        let shrink = |(pair, x, u): &mut (&LoraPair, &[f32], &mut [f32])| {
            for (x, u) in x.chunks_exact(in_dim).zip(u.chunks_exact_mut(pair.rank)) {
                vector::dots(x, &pair.a, in_dim, u);
            }
        };
        if work < PARALLEL_MIN_WORK {
            pieces.iter_mut().for_each(shrink);
        } else {
            parallel::for_each(&mut pieces, shrink);
        }
        drop(pieces);
        Self { parts }
    }

    /// Whether there is nothing to add.
    pub(crate) fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    /// Adds `u B^T` to the columns `out` holds, for every part whose columns meet them.
    pub(crate) fn expand(&self, out: &mut ColumnsMut<'_>) {
        let band = out.columns();
        for part in &self.parts {
            let (start, end) = (
                band.start.max(part.columns.start),
                band.end.min(part.columns.end),
            );
            if start >= end {
                continue;
            }
            let rank = part.pair.rank;
            let width = part.columns.len();
            // `B^T`'s rows (`width` values each) from the first column of the band on.
            let bt = &part.pair.bt[start - part.columns.start..];
            let local = start - band.start..end - band.start;
            for (row, u) in part.rows.clone().zip(part.u.chunks_exact(rank)) {
                vector::axpys(&mut out.row_mut(row)[local.clone()], u, bt, width);
            }
        }
    }
}
