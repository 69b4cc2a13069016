//! A projection of the forward pass: the base product and each adapter's delta beside it
//! ([`LlamaModel::project`]), and the adapters' matrices of the next projection asked for
//! while the serial work before it runs ([`LlamaModel::prefetch_next`]).

use std::ops::Range;

use modelmux_kernels::Int8Rows;
use modelmux_kernels::vector::Prefetches;

use super::LlamaModel;
use crate::error::Result;
use crate::lora::LoraAdapter;
use crate::matmul::Matrix;
use crate::ops::add_assign;
use crate::parallel;
use crate::weights::{Target, WeightFormat};

/// Buffers of one step that every projection reuses.
#[derive(Default)]
pub(super) struct StepBuffers {
    /// The activations quantized for the matrix kernels.
    pub(super) quantized: Int8Rows,
    /// The adapters' deltas before they are added to a projection's output.
    pub(super) delta: Vec<f32>,
}

/// Rows `start..end` of the batch, all with `adapter`.
pub(super) struct AdapterRun<'a> {
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) adapter: &'a LoraAdapter,
}

impl LlamaModel {
    /// `out = x W^T` for `matrix`, plus each adapter's delta on its rows, for each of the
    /// stacked `targets` in its columns of `out`.
    ///
    /// The adapters' deltas are computed beside the product, in `buffers.delta`, and added
    /// after it: the product is bound by arithmetic and the deltas by memory (every adapter's
    /// matrices come from RAM, the base weights having pushed them out of the caches since the
    /// last step), so a thread reading adapters while the other multiplies uses both.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn project(
        &self,
        matrix: &Matrix,
        layer: usize,
        targets: &[(Target, Range<usize>)],
        x: &[f32],
        out: &mut [f32],
        runs: &[AdapterRun<'_>],
        buffers: &mut StepBuffers,
    ) -> Result<()> {
        let rows = out.len() / matrix.out_dim();
        let (in_dim, width) = (x.len() / rows, matrix.out_dim());
        // Each adapter's rows of the delta, apart, so the adapters run on all threads at once;
        // only the adapters that adapt one of these targets (none of them: no split at all).
        // An adapter with more rows than the threads' fair share is split too, so one adapter
        // on every row does not leave the other threads idle.
        let adapts = |run: &&AdapterRun<'_>| {
            (targets.iter()).any(|(target, _)| run.adapter.pair(layer, *target).is_some())
        };
        let adapted: usize = runs.iter().filter(adapts).map(|r| r.end - r.start).sum();
        if adapted == 0 {
            return matrix.forward(x, out, &mut buffers.quantized);
        }
        let share = adapted.div_ceil(parallel::threads()).max(1);
        if buffers.delta.len() < out.len() {
            buffers.delta.resize(out.len(), 0.0);
        }
        let mut pieces: Vec<(&AdapterRun<'_>, Range<usize>, &mut [f32])> =
            Vec::with_capacity(runs.len());
        let (mut rest, mut offset) = (&mut buffers.delta[..out.len()], 0);
        for run in runs.iter().filter(adapts) {
            let mut start = run.start;
            while start < run.end {
                let end = run.end.min(start.saturating_add(share));
                let (_, tail) = rest.split_at_mut((start - offset) * width);
                let (rows, tail) = tail.split_at_mut((end - start) * width);
                pieces.push((run, start..end, rows));
                (rest, offset, start) = (tail, end, end);
            }
        }
        let quantized = &mut buffers.quantized;
        let mut lora = || {
            parallel::for_each(&mut pieces, |(run, rows, y)| {
                let pairs = || {
                    (targets.iter()).filter_map(|(target, columns)| {
                        Some((run.adapter.pair(layer, *target)?, columns))
                    })
                };
                // Every matrix this adapter needs here is asked for before the first is
                // read, so they arrive together instead of one short stream after another.
                pairs().for_each(|(pair, _)| pair.prefetch());
                y.fill(0.0);
                let x = &x[rows.start * in_dim..rows.end * in_dim];
                for (pair, columns) in pairs() {
                    pair.apply(x, in_dim, y, width, columns.clone());
                }
            })
        };
        let (product, ()) = if matrix.in_kernel_format() {
            parallel::join(|| matrix.forward(x, out, quantized), lora)
        } else {
            // candle's product splits on its own pool: one product at a time there.
            (matrix.forward(x, out, quantized), lora())
        };
        product?;
        for (_, rows, delta) in &pieces {
            add_assign(&mut out[rows.start * width..rows.end * width], delta);
        }
        Ok(())
    }

    /// Asks for the adapters' matrices of the projection that comes next (`targets` of
    /// `layer`), from a task on the pool, while this thread goes on with the serial work
    /// before it. The pool's other threads, kept awake through the step and idle during that
    /// work, take the task, so the lines arrive on time instead of one short stream after
    /// another when the LoRA loops read them. On the kernels' path only (candle's products
    /// run on another pool), with adapters in the step, and on more than one thread.
    ///
    /// Measured on the Xeon (`bench_llm --scenario forward`, 3 alternating triples): 8 rows
    /// on 8 adapters over the base step 0.862-0.886 without, 0.883-0.906 with the o
    /// projection's matrices asked for after the q/k/v product, 0.920-0.936 with the next
    /// layer's q/k/v ones asked for after the down product too.
    pub(super) fn prefetch_next(
        &self,
        runs: &[AdapterRun<'_>],
        layer: usize,
        targets: &[(Target, Range<usize>)],
    ) {
        if runs.is_empty() || self.weights.format != WeightFormat::Auto || parallel::threads() == 1
        {
            return;
        }
        let mut list = Prefetches::new();
        for run in runs {
            for (target, _) in targets {
                if let Some(pair) = run.adapter.pair(layer, *target) {
                    pair.prefetch_later(&mut list);
                }
            }
        }
        if !list.is_empty() {
            // The task outlives this borrow of the adapters: it holds addresses only, and a
            // prefetch of memory freed since is a hint that changes nothing.
            parallel::spawn(move || list.issue());
        }
    }
}
