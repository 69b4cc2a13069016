//! The forward pass of a Llama-family model over a batch of sequences, each with its own KV
//! cache, positions and LoRA adapter (or none). One call runs one engine step: decode rows
//! and prefill chunks of any sequences, mixed, in one pass, so every weight matrix is read
//! once per step whatever the batch holds.

use crate::error::{LlmError, Result};
use crate::gguf::LlamaConfig;
use crate::kv::KvCache;
use crate::lora::LoraAdapter;
use crate::ops::{AttentionShape, AttentionSpan, Rope, add_assign, attention, rms_norm, silu_mul};
use crate::weights::{Block, LlamaWeights, Target};

/// One sequence's part of a step: the tokens it adds (one to decode, or a chunk of its
/// prompt), its cache (holding every token before them) and its adapter.
pub struct Segment<'a> {
    /// The tokens, at positions `cache.len()..cache.len() + tokens.len()`.
    pub tokens: &'a [u32],
    /// The sequence's KV cache; the tokens are appended to it.
    pub cache: &'a mut KvCache,
    /// The adapter applied to this sequence's rows, or `None` for the base model.
    pub adapter: Option<&'a LoraAdapter>,
    /// Whether the logits after the last token are wanted (the prompt's last chunk, or a
    /// decode step).
    pub want_logits: bool,
}

/// A Llama-family model ready to run: its weights and rotary tables.
pub struct LlamaModel {
    weights: LlamaWeights,
    rope: Rope,
}

/// Rows `start..end` of the batch, all with `adapter`.
struct AdapterRun<'a> {
    start: usize,
    end: usize,
    adapter: &'a LoraAdapter,
}

impl LlamaModel {
    /// A model that runs sequences of at most `max_positions` tokens.
    pub fn new(weights: LlamaWeights, max_positions: usize) -> Self {
        let rope = Rope::new(
            weights.config.head_dim,
            weights.config.rope_base,
            max_positions,
        );
        Self { weights, rope }
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.weights.config
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }

    /// The longest sequence this model runs.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    fn project(
        &self,
        block: &Block,
        layer: usize,
        target: Target,
        x: &[f32],
        rows: usize,
        runs: &[AdapterRun<'_>],
    ) -> Result<Vec<f32>> {
        let matrix = &block.projections[target.index()];
        let mut y = matrix.forward(x, rows)?;
        let (out_dim, in_dim) = target.dims(&self.weights.config);
        for run in runs {
            if let Some(pair) = run.adapter.pair(layer, target) {
                pair.apply(
                    &x[run.start * in_dim..run.end * in_dim],
                    &mut y[run.start * out_dim..run.end * out_dim],
                    in_dim,
                    out_dim,
                );
            }
        }
        Ok(y)
    }

    /// Runs one step. Returns, for each segment, the logits after its last token when it
    /// asked for them.
    pub fn forward(&self, segments: &mut [Segment<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        let config = &self.weights.config;
        let (d, kv_dim, vocab) = (config.d_model, config.kv_dim(), config.vocab_size);
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut runs: Vec<AdapterRun<'_>> = Vec::new();
        for s in segments.iter() {
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
            if let Some(&bad) = s.tokens.iter().find(|&&t| t as usize >= vocab) {
                return Err(LlmError::InvalidRequest(format!(
                    "token id {bad} is outside the vocabulary of {vocab} tokens"
                )));
            }
            let row = tokens.len();
            tokens.extend_from_slice(s.tokens);
            positions.extend(start..end);
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
        let rows = tokens.len();
        if rows == 0 {
            return Ok(Vec::new());
        }
        let shape = AttentionShape {
            n_head: config.n_head,
            n_kv_head: config.n_kv_head,
            head_dim: config.head_dim,
        };
        let mut x = self.weights.embed(&tokens)?;
        for (layer, block) in self.weights.blocks.iter().enumerate() {
            let h = rms_norm(&x, &block.attn_norm, config.rms_eps);
            let mut q = self.project(block, layer, Target::Q, &h, rows, &runs)?;
            let mut k = self.project(block, layer, Target::K, &h, rows, &runs)?;
            let v = self.project(block, layer, Target::V, &h, rows, &runs)?;
            self.rope.apply(&mut q, &positions, d);
            self.rope.apply(&mut k, &positions, kv_dim);
            let mut row = 0;
            for s in segments.iter_mut() {
                let n = s.tokens.len();
                s.cache.append(
                    layer,
                    &k[row * kv_dim..(row + n) * kv_dim],
                    &v[row * kv_dim..(row + n) * kv_dim],
                );
                row += n;
            }
            let mut first_row = 0;
            let spans: Vec<AttentionSpan<'_>> = segments
                .iter()
                .map(|s| {
                    let (keys, values) = s.cache.layer(layer);
                    let span = AttentionSpan {
                        first_row,
                        rows: s.tokens.len(),
                        start: s.cache.len(),
                        keys,
                        values,
                    };
                    first_row += s.tokens.len();
                    span
                })
                .collect();
            let attended = attention(&q, &spans, shape);
            drop(spans);
            let o = self.project(block, layer, Target::O, &attended, rows, &runs)?;
            add_assign(&mut x, &o);
            let h = rms_norm(&x, &block.ffn_norm, config.rms_eps);
            let mut gate = self.project(block, layer, Target::Gate, &h, rows, &runs)?;
            let up = self.project(block, layer, Target::Up, &h, rows, &runs)?;
            silu_mul(&mut gate, &up);
            let down = self.project(block, layer, Target::Down, &gate, rows, &runs)?;
            add_assign(&mut x, &down);
        }
        let mut last_rows = Vec::new();
        let mut row = 0;
        for s in segments.iter_mut() {
            row += s.tokens.len();
            s.cache.advance(s.tokens.len());
            if s.want_logits {
                last_rows.extend_from_slice(&x[(row - 1) * d..row * d]);
            }
        }
        let mut logits = if last_rows.is_empty() {
            Vec::new()
        } else {
            let h = rms_norm(&last_rows, &self.weights.final_norm, config.rms_eps);
            self.weights.lm_head.forward(&h, last_rows.len() / d)?
        };
        let mut out = Vec::with_capacity(segments.len());
        let mut taken = 0;
        for s in segments.iter() {
            if s.want_logits {
                out.push(Some(logits[taken * vocab..(taken + 1) * vocab].to_vec()));
                taken += 1;
            } else {
                out.push(None);
            }
        }
        logits.clear();
        Ok(out)
    }
}
