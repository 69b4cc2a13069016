//! One forward pass over a step's rows, read as the transformer it runs: the tokens'
//! embeddings, then in every layer an attention block and an MLP block, each adding to the
//! residual stream `x`, then the logits of the rows that want them (or the pooled embedding).

use std::ops::Range;

use super::project::{AdapterRun, StepBuffers};
use super::{LlamaModel, Segment};
use crate::error::{LlmError, Result};
use crate::matmul::ranges;
use crate::ops::{
    AttentionShape, AttentionSpan, add_assign, add_bias, attention, gated_stacked, rms_norm,
    rms_norm_in_place, rms_norm_into,
};
use crate::weights::{Block, Target};

/// Each stacked projection's targets and the columns of its output they fill.
struct Targets {
    qkv: [(Target, Range<usize>); 3],
    o: [(Target, Range<usize>); 1],
    gate_up: [(Target, Range<usize>); 2],
    down: [(Target, Range<usize>); 1],
}

/// What one pass keeps across its layers: the rows' positions and adapters, the attention
/// shapes, and buffers sized once for every row.
struct Pass<'m, 'a> {
    model: &'m LlamaModel,
    positions: Vec<usize>,
    /// Runs of rows with one adapter.
    runs: Vec<AdapterRun<'a>>,
    targets: Targets,
    global: AttentionShape,
    window: AttentionShape,
    buffers: StepBuffers,
    /// The normalised residual stream, input to a block's first projection.
    h: Vec<f32>,
    qkv: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    /// The output of the o and down projections.
    projected: Vec<f32>,
    gate_up: Vec<f32>,
    gated: Vec<f32>,
}

impl LlamaModel {
    /// One pass over `segments`: the logits each wants, or (`embed`) each one's pooled
    /// embedding; every segment's tokens are appended to its cache.
    pub(super) fn step(
        &self,
        segments: &mut [Segment<'_>],
        embed: bool,
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut runs: Vec<AdapterRun<'_>> = Vec::new();
        for s in segments.iter() {
            self.check(s)?;
            let start = s.cache.len();
            let row = tokens.len();
            tokens.extend_from_slice(s.tokens);
            positions.extend(start..start + s.tokens.len());
            if let Some(adapter) = s.adapter {
                match runs.last_mut() {
                    Some(run) if run.end == row && run.adapter.serial() == adapter.serial() => {
                        run.end = tokens.len();
                    }
                    _ => runs.push(AdapterRun {
                        start: row,
                        end: tokens.len(),
                        adapter,
                    }),
                }
            }
        }
        if tokens.is_empty() {
            return Ok(Vec::new());
        }
        let mut pass = Pass::new(self, positions, runs);
        pass.model.prefetch_next(&pass.runs, 0, &pass.targets.qkv);
        let config = &self.weights.config;
        let mut x = self.weights.embed(&tokens)?;
        if config.embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= config.embedding_scale);
        }
        for (layer, block) in self.weights.blocks.iter().enumerate() {
            pass.attention_block(layer, block, &mut x, segments)?;
            pass.mlp_block(layer, block, &mut x)?;
        }
        if embed {
            return Ok(self.pool(segments, &x));
        }
        self.logits(segments, &x, &mut pass.buffers)
    }

    /// Whether `s` can run: tokens in the vocabulary, fitting its cache and the positions.
    pub(super) fn check(&self, s: &Segment<'_>) -> Result<()> {
        let start = s.cache.len();
        let end = start + s.tokens.len();
        if s.tokens.is_empty() || end > s.cache.max_tokens() || end > self.max_positions() {
            return Err(LlmError::Internal(format!(
                "a segment of {} tokens at position {start} does not fit its cache of {} or the model's {} positions",
                s.tokens.len(),
                s.cache.max_tokens(),
                self.max_positions()
            )));
        }
        crate::check_token_ids("input", s.tokens, self.weights.config.vocab_size)
    }

    /// The logits of the rows that want them, after the final norm: each segment's entry
    /// holds its last row's (`want_logits`) or every row's (`all_logits`). The caches move
    /// past the step's tokens.
    fn logits(
        &self,
        segments: &mut [Segment<'_>],
        x: &[f32],
        buffers: &mut StepBuffers,
    ) -> Result<Vec<Option<Vec<f32>>>> {
        let config = &self.weights.config;
        let (d, vocab) = (config.d_model, config.vocab_size);
        let mut wanted_rows = Vec::new();
        let mut row = 0;
        for s in segments.iter_mut() {
            let n = s.tokens.len();
            row += n;
            s.cache.advance(n);
            if s.all_logits {
                wanted_rows.extend_from_slice(&x[(row - n) * d..row * d]);
            } else if s.want_logits {
                wanted_rows.extend_from_slice(&x[(row - 1) * d..row * d]);
            }
        }
        let mut logits = vec![0.0; wanted_rows.len() / d * vocab];
        if !wanted_rows.is_empty() {
            let h = rms_norm(&wanted_rows, &self.weights.final_norm, config.rms_eps);
            self.weights
                .lm_head
                .forward(&h, &mut logits, &mut buffers.quantized)?;
            if let Some(cap) = config.final_softcap {
                modelmux_kernels::vector::soft_cap_in_place(&mut logits, cap);
            }
        }
        // Each segment's rows cut off the end, last first, so the first keeps the buffer
        // itself: one stream's logits are never copied.
        let mut out: Vec<Option<Vec<f32>>> = vec![None; segments.len()];
        for (s, out) in segments.iter().zip(&mut out).rev() {
            let rows = if s.all_logits {
                s.tokens.len()
            } else {
                usize::from(s.want_logits)
            };
            if rows > 0 {
                let start = logits.len() - rows * vocab;
                *out = Some(if start == 0 {
                    std::mem::take(&mut logits)
                } else {
                    logits.split_off(start)
                });
            }
        }
        Ok(out)
    }

    /// Each segment's mean final hidden state, normalised (see [`embed`](Self::embed)).
    fn pool(&self, segments: &mut [Segment<'_>], x: &[f32]) -> Vec<Option<Vec<f32>>> {
        let config = &self.weights.config;
        let d = config.d_model;
        let mut row = 0;
        segments
            .iter_mut()
            .map(|s| {
                let n = s.tokens.len();
                s.cache.advance(n);
                let h = rms_norm(
                    &x[row * d..(row + n) * d],
                    &self.weights.final_norm,
                    config.rms_eps,
                );
                row += n;
                let mut mean = vec![0.0f64; d];
                for r in h.chunks_exact(d) {
                    for (m, v) in mean.iter_mut().zip(r) {
                        *m += f64::from(*v);
                    }
                }
                let norm = mean
                    .iter()
                    .map(|m| m * m)
                    .sum::<f64>()
                    .sqrt()
                    .max(f64::MIN_POSITIVE);
                Some(mean.iter().map(|m| (m / norm) as f32).collect())
            })
            .collect()
    }
}

impl<'m, 'a> Pass<'m, 'a> {
    fn new(model: &'m LlamaModel, positions: Vec<usize>, runs: Vec<AdapterRun<'a>>) -> Self {
        let config = &model.weights.config;
        let rows = positions.len();
        let (d, q_dim, kv_dim, ffn) = (
            config.d_model,
            config.q_dim(),
            config.kv_dim(),
            config.ffn_dim,
        );
        let global = AttentionShape {
            n_head: config.n_head,
            n_kv_head: config.n_kv_head,
            head_dim: config.head_dim,
            scale: config.attention_scale,
            softcap: config.attention_softcap,
            window: None,
        };
        let window = AttentionShape {
            window: config.sliding_window,
            ..global
        };
        let [q_columns, k_columns, v_columns] = ranges([q_dim, kv_dim, kv_dim]);
        let [gate_columns, up_columns] = ranges([ffn, ffn]);
        Self {
            model,
            positions,
            runs,
            targets: Targets {
                qkv: [
                    (Target::Q, q_columns),
                    (Target::K, k_columns),
                    (Target::V, v_columns),
                ],
                o: [(Target::O, 0..d)],
                gate_up: [(Target::Gate, gate_columns), (Target::Up, up_columns)],
                down: [(Target::Down, 0..d)],
            },
            global,
            window,
            buffers: StepBuffers::default(),
            h: vec![0.0; rows * d],
            qkv: vec![0.0; rows * (q_dim + 2 * kv_dim)],
            q: vec![0.0; rows * q_dim],
            k: vec![0.0; rows * kv_dim],
            v: vec![0.0; rows * kv_dim],
            projected: vec![0.0; rows * d],
            gate_up: vec![0.0; rows * 2 * ffn],
            gated: vec![0.0; rows * ffn],
        }
    }

    /// `x += o(attention(rope(q), rope(k), v))` over `norm(x)`: this layer's keys and values
    /// are appended to each segment's cache, and each segment's rows attend to its own cache.
    fn attention_block(
        &mut self,
        layer: usize,
        block: &Block,
        x: &mut [f32],
        segments: &mut [Segment<'_>],
    ) -> Result<()> {
        let model = self.model;
        let config = &model.weights.config;
        let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
        rms_norm_into(x, &block.attn_norm, config.rms_eps, &mut self.h);
        let targets = &self.targets;
        model.project(
            &block.qkv,
            layer,
            &targets.qkv,
            &self.h,
            &mut self.qkv,
            &self.runs,
            &mut self.buffers,
        )?;
        model.prefetch_next(&self.runs, layer, &targets.o);
        if let Some(bias) = &block.qkv_bias {
            add_bias(&mut self.qkv, bias);
        }
        let [(_, q_columns), (_, k_columns), (_, v_columns)] = &targets.qkv;
        for (r, row) in self.qkv.chunks_exact(q_dim + 2 * kv_dim).enumerate() {
            self.q[r * q_dim..(r + 1) * q_dim].copy_from_slice(&row[q_columns.clone()]);
            self.k[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&row[k_columns.clone()]);
            self.v[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&row[v_columns.clone()]);
        }
        if let Some((q_norm, k_norm)) = &block.qk_norm {
            rms_norm_in_place(&mut self.q, q_norm, config.rms_eps);
            rms_norm_in_place(&mut self.k, k_norm, config.rms_eps);
        }
        let windowed = config.is_window_layer(layer);
        let (shape, rope) = match (windowed, &model.window_rope) {
            (true, Some(rope)) => (self.window, rope),
            (true, None) => (self.window, &model.rope),
            (false, _) => (self.global, &model.rope),
        };
        rope.apply(&mut self.q, &self.positions, q_dim);
        rope.apply(&mut self.k, &self.positions, kv_dim);
        if let Some(temperature) = &config.attention_temperature {
            for (row, &p) in self.q.chunks_exact_mut(q_dim).zip(&self.positions) {
                let t = temperature.at(p);
                row.iter_mut().for_each(|v| *v *= t);
            }
        }
        let mut row = 0;
        for s in segments.iter_mut() {
            let n = s.tokens.len();
            let (k, v) = (
                &self.k[row * kv_dim..(row + n) * kv_dim],
                &self.v[row * kv_dim..(row + n) * kv_dim],
            );
            s.cache.append(layer, k, v);
            row += n;
        }
        let mut first_row = 0;
        let spans: Vec<AttentionSpan<'_>> = segments
            .iter()
            .map(|s| {
                let span = AttentionSpan {
                    first_row,
                    rows: s.tokens.len(),
                    start: s.cache.len(),
                    kv: s.cache.layer(layer),
                };
                first_row += s.tokens.len();
                span
            })
            .collect();
        let attended = attention(&self.q, &spans, shape);
        drop(spans);
        let o = &mut self.projected;
        model.project(
            &block.o,
            layer,
            &targets.o,
            &attended,
            o,
            &self.runs,
            &mut self.buffers,
        )?;
        model.prefetch_next(&self.runs, layer, &targets.gate_up);
        if let Some((attn_post, _)) = &block.post_norms {
            rms_norm_in_place(o, attn_post, config.rms_eps);
        }
        add_assign(x, o);
        Ok(())
    }

    /// `x += down(act(gate) * up)` over `norm(x)`; then the next layer's adapters are asked
    /// for.
    fn mlp_block(&mut self, layer: usize, block: &Block, x: &mut [f32]) -> Result<()> {
        let model = self.model;
        let config = &model.weights.config;
        let targets = &self.targets;
        rms_norm_into(x, &block.ffn_norm, config.rms_eps, &mut self.h);
        let gu = &mut self.gate_up;
        model.project(
            &block.gate_up,
            layer,
            &targets.gate_up,
            &self.h,
            gu,
            &self.runs,
            &mut self.buffers,
        )?;
        model.prefetch_next(&self.runs, layer, &targets.down);
        gated_stacked(
            config.family.activation,
            gu,
            config.ffn_dim,
            &mut self.gated,
        );
        let down = &mut self.projected;
        model.project(
            &block.down,
            layer,
            &targets.down,
            &self.gated,
            down,
            &self.runs,
            &mut self.buffers,
        )?;
        if let Some((_, ffn_post)) = &block.post_norms {
            rms_norm_in_place(down, ffn_post, config.rms_eps);
        }
        if layer + 1 < model.weights.blocks.len() {
            model.prefetch_next(&self.runs, layer + 1, &targets.qkv);
        }
        add_assign(x, down);
        Ok(())
    }
}
