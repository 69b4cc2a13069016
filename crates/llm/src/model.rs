//! The forward pass of a Llama-family model over a batch of sequences, each with its own KV
//! cache, positions and LoRA adapter (or none). One call runs one engine step: decode rows
//! and prefill chunks of any sequences, mixed, in one pass, so every weight matrix is read
//! once per step whatever the batch holds.

use crate::error::{LlmError, Result};
use crate::gguf::LlamaConfig;
use crate::kv::{KvCache, KvDtype};
use crate::lockstep::Lockstep;
use crate::lora::{AdapterLease, LoraAdapter};
use crate::matmul::ranges;
use crate::ops::{
    AttentionShape, AttentionSpan, Rope, add_assign, add_bias, attention, gated_stacked, rms_norm,
    rms_norm_in_place, rms_norm_into,
};
use crate::parallel;
use crate::weights::{LlamaWeights, Target, WeightFormat};
use project::{AdapterRun, StepBuffers};

mod project;

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
    /// Whether the logits after every token of the segment are wanted (prompt log
    /// probabilities): then its entry holds `tokens.len()` rows of logits, the last row last.
    pub all_logits: bool,
}

/// One sequence's part of a step, owned: what a [`Segment`] borrows, for an engine that
/// hands its step over to a pass shared with the other engines of the model
/// ([`LlamaModel::forward_shared`]).
pub(crate) struct OwnedSegment {
    pub(crate) tokens: Vec<u32>,
    pub(crate) cache: KvCache,
    pub(crate) adapter: Option<AdapterLease>,
    pub(crate) want_logits: bool,
    pub(crate) all_logits: bool,
}

impl OwnedSegment {
    fn borrowed(&mut self) -> Segment<'_> {
        Segment {
            tokens: &self.tokens,
            cache: &mut self.cache,
            adapter: self.adapter.as_deref(),
            want_logits: self.want_logits,
            all_logits: self.all_logits,
        }
    }
}

/// A step's segments given back after a shared pass, with their logits (as
/// [`LlamaModel::forward`] returns them) or why the pass failed.
pub(crate) type SharedStep = (
    Vec<OwnedSegment>,
    std::result::Result<Vec<Option<Vec<f32>>>, String>,
);

/// How long an engine leading a shared pass waits for the other engines of the previous pass
/// to hand their next steps over (`lockstep`). An engine hands its next step over as soon as
/// it has sampled from the last one, and says when it stops stepping; this only bounds the
/// wait for one that is held up (an embedding run between steps, a busy machine).
const STEP_WINDOW: std::time::Duration = std::time::Duration::from_millis(10);

/// A Llama-family model ready to run: its weights and rotary tables.
pub struct LlamaModel {
    weights: LlamaWeights,
    rope: Rope,
    /// The sliding-window layers' table, where their base or scaling differs (Gemma 3).
    window_rope: Option<Rope>,
    /// Where the engines sharing this model meet to run their steps as one pass.
    lockstep: Lockstep<Vec<OwnedSegment>, SharedStep>,
}

impl LlamaModel {
    /// A model that runs sequences of at most `max_positions` tokens.
    pub fn new(weights: LlamaWeights, max_positions: usize) -> Self {
        let config = &weights.config;
        let table = |base: f32, scaling| {
            Rope::new(
                config.head_dim,
                config.family.rope,
                base,
                weights.rope_factors.as_deref(),
                scaling,
                max_positions,
            )
        };
        let rope = table(config.rope_base, config.rope_scaling);
        let window_rope = (config.window_layers.iter().any(|w| *w)
            && (config.rope_base_window, config.rope_scaling_window)
                != (config.rope_base, config.rope_scaling))
            .then(|| table(config.rope_base_window, config.rope_scaling_window));
        Self {
            weights,
            rope,
            window_rope,
            lockstep: Lockstep::new(STEP_WINDOW),
        }
    }

    /// Forward passes run for engines so far, each holding the steps of every engine of this
    /// model that had one ready: fewer than the engines' steps together when they shared.
    pub fn passes(&self) -> u64 {
        self.lockstep.rounds()
    }

    /// A number for an engine that runs its steps through
    /// [`forward_shared`](Self::forward_shared).
    pub(crate) fn step_member(&self) -> u64 {
        self.lockstep.member()
    }

    /// Engine `member` runs no step until its next [`forward_shared`](Self::forward_shared):
    /// the others do not wait for it.
    pub(crate) fn step_leave(&self, member: u64) {
        self.lockstep.leave(member);
    }

    /// [`forward`](Self::forward) of `segments`, engine `member`'s step, in one pass with the
    /// steps the other engines of this model hand over meanwhile (`lockstep`): N replicas
    /// of one model in a process read the weights once per step, as one replica does. Blocks
    /// until the pass is done; gives the segments back.
    pub(crate) fn forward_shared(&self, member: u64, segments: Vec<OwnedSegment>) -> SharedStep {
        self.lockstep
            .meet(member, segments, |steps| self.forward_steps(steps))
    }

    /// One pass over several engines' steps; each step's segments and logits back.
    fn forward_steps(&self, mut steps: Vec<Vec<OwnedSegment>>) -> Vec<SharedStep> {
        // A step that cannot run fails alone, before the pass: one engine's fault never
        // fails another's sequences.
        let faults: Vec<Option<String>> = steps
            .iter_mut()
            .map(|step| {
                step.iter_mut()
                    .find_map(|s| self.check(&s.borrowed()).err())
                    .map(|e| e.to_string())
            })
            .collect();
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut segments: Vec<Segment<'_>> = steps
                .iter_mut()
                .zip(&faults)
                .filter(|(_, fault)| fault.is_none())
                .flat_map(|(step, _)| step.iter_mut().map(OwnedSegment::borrowed))
                .collect();
            self.forward(&mut segments)
        }));
        let mut logits = match result {
            Ok(Ok(logits)) => Ok(logits.into_iter()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(panic) => Err(format!(
                "the forward pass panicked: {}",
                modelmux_cache::panic_message(&*panic)
            )),
        };
        steps
            .into_iter()
            .zip(faults)
            .map(|(step, fault)| {
                let answer = match (fault, &mut logits) {
                    (Some(fault), _) => Err(fault),
                    (None, Ok(all)) => Ok(all.by_ref().take(step.len()).collect()),
                    (None, Err(message)) => Err(message.clone()),
                };
                (step, answer)
            })
            .collect()
    }

    /// The model's shape.
    pub fn config(&self) -> &LlamaConfig {
        &self.weights.config
    }

    /// The weights.
    pub fn weights(&self) -> &LlamaWeights {
        &self.weights
    }

    /// How a KV cache of this model stores keys and values unless told otherwise: f32 with
    /// f32 weights, binary16 with quantized ones ([`KvDtype::for_weights`]).
    pub fn kv_dtype(&self) -> KvDtype {
        KvDtype::for_weights(self.weights.format)
    }

    /// The longest sequence this model runs.
    pub fn max_positions(&self) -> usize {
        self.rope.max_positions()
    }

    /// Runs one step. Returns, for each segment, the logits after its last token when it
    /// asked for them.
    pub fn forward(&self, segments: &mut [Segment<'_>]) -> Result<Vec<Option<Vec<f32>>>> {
        if self.weights.format == WeightFormat::Auto {
            parallel::run(|| self.step(segments, false))
        } else {
            // candle's kernels split their work on their own pools: a step inside rayon's
            // would leave two pools' threads spinning against each other.
            self.step(segments, false)
        }
    }

    /// Embeddings: for each segment, the mean over its tokens of the last hidden states (after
    /// the final norm), scaled to length 1. The tokens are appended to the caches as by
    /// [`forward`](Self::forward); `want_logits` is ignored.
    pub fn embed(&self, segments: &mut [Segment<'_>]) -> Result<Vec<Vec<f32>>> {
        let pooled = if self.weights.format == WeightFormat::Auto {
            parallel::run(|| self.step(segments, true))?
        } else {
            self.step(segments, true)?
        };
        Ok(pooled.into_iter().map(Option::unwrap_or_default).collect())
    }

    /// Whether `s` can run: tokens in the vocabulary, fitting its cache and the positions.
    fn check(&self, s: &Segment<'_>) -> Result<()> {
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

    fn step(&self, segments: &mut [Segment<'_>], embed: bool) -> Result<Vec<Option<Vec<f32>>>> {
        let config = &self.weights.config;
        let (d, kv_dim, vocab) = (config.d_model, config.kv_dim(), config.vocab_size);
        let q_dim = config.q_dim();
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut runs: Vec<AdapterRun<'_>> = Vec::new();
        for s in segments.iter() {
            self.check(s)?;
            let start = s.cache.len();
            let end = start + s.tokens.len();
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
        let global_shape = AttentionShape {
            n_head: config.n_head,
            n_kv_head: config.n_kv_head,
            head_dim: config.head_dim,
            scale: config.attention_scale,
            softcap: config.attention_softcap,
            window: None,
        };
        let window_shape = AttentionShape {
            window: config.sliding_window,
            ..global_shape
        };
        let ffn = config.ffn_dim;
        let [q_columns, k_columns, v_columns] = ranges([q_dim, kv_dim, kv_dim]);
        let qkv_targets = [
            (Target::Q, q_columns.clone()),
            (Target::K, k_columns.clone()),
            (Target::V, v_columns.clone()),
        ];
        let [gate_columns, up_columns] = ranges([ffn, ffn]);
        let gate_up_targets = [(Target::Gate, gate_columns), (Target::Up, up_columns)];
        let o_targets = [(Target::O, 0..d)];
        let down_targets = [(Target::Down, 0..d)];
        // Buffers for the whole step, reused by every layer.
        let mut buffers = StepBuffers::default();
        let mut h = vec![0.0; rows * d];
        let mut qkv = vec![0.0; rows * (q_dim + 2 * kv_dim)];
        let (mut q, mut k, mut v) = (
            vec![0.0; rows * q_dim],
            vec![0.0; rows * kv_dim],
            vec![0.0; rows * kv_dim],
        );
        let mut projected = vec![0.0; rows * d];
        let mut gate_up = vec![0.0; rows * 2 * ffn];
        let mut gated = vec![0.0; rows * ffn];
        self.prefetch_next(&runs, 0, &qkv_targets);
        let mut x = self.weights.embed(&tokens)?;
        if config.embedding_scale != 1.0 {
            x.iter_mut().for_each(|v| *v *= config.embedding_scale);
        }
        let activation = config.family.activation;
        for (layer, block) in self.weights.blocks.iter().enumerate() {
            let windowed = config.is_window_layer(layer);
            let (shape, rope) = match (windowed, &self.window_rope) {
                (true, Some(rope)) => (window_shape, rope),
                (true, None) => (window_shape, &self.rope),
                (false, _) => (global_shape, &self.rope),
            };
            rms_norm_into(&x, &block.attn_norm, config.rms_eps, &mut h);
            self.project(
                &block.qkv,
                layer,
                &qkv_targets,
                &h,
                &mut qkv,
                &runs,
                &mut buffers,
            )?;
            self.prefetch_next(&runs, layer, &o_targets);
            if let Some(bias) = &block.qkv_bias {
                add_bias(&mut qkv, bias);
            }
            let width = q_dim + 2 * kv_dim;
            for (r, row) in qkv.chunks_exact(width).enumerate() {
                q[r * q_dim..(r + 1) * q_dim].copy_from_slice(&row[q_columns.clone()]);
                k[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&row[k_columns.clone()]);
                v[r * kv_dim..(r + 1) * kv_dim].copy_from_slice(&row[v_columns.clone()]);
            }
            if let Some((q_norm, k_norm)) = &block.qk_norm {
                rms_norm_in_place(&mut q, q_norm, config.rms_eps);
                rms_norm_in_place(&mut k, k_norm, config.rms_eps);
            }
            rope.apply(&mut q, &positions, q_dim);
            rope.apply(&mut k, &positions, kv_dim);
            if let Some(temperature) = &config.attention_temperature {
                for (row, &p) in q.chunks_exact_mut(q_dim).zip(&positions) {
                    let t = temperature.at(p);
                    row.iter_mut().for_each(|v| *v *= t);
                }
            }
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
            let attended = attention(&q, &spans, shape);
            drop(spans);
            let o = &mut projected;
            self.project(
                &block.o,
                layer,
                &o_targets,
                &attended,
                o,
                &runs,
                &mut buffers,
            )?;
            self.prefetch_next(&runs, layer, &gate_up_targets);
            if let Some((attn_post, _)) = &block.post_norms {
                rms_norm_in_place(o, attn_post, config.rms_eps);
            }
            add_assign(&mut x, o);
            rms_norm_into(&x, &block.ffn_norm, config.rms_eps, &mut h);
            let gu = &mut gate_up;
            self.project(
                &block.gate_up,
                layer,
                &gate_up_targets,
                &h,
                gu,
                &runs,
                &mut buffers,
            )?;
            self.prefetch_next(&runs, layer, &down_targets);
            gated_stacked(activation, gu, ffn, &mut gated);
            let down = &mut projected;
            self.project(
                &block.down,
                layer,
                &down_targets,
                &gated,
                down,
                &runs,
                &mut buffers,
            )?;
            if let Some((_, ffn_post)) = &block.post_norms {
                rms_norm_in_place(down, ffn_post, config.rms_eps);
            }
            if layer + 1 < self.weights.blocks.len() {
                self.prefetch_next(&runs, layer + 1, &qkv_targets);
            }
            add_assign(&mut x, down);
        }
        if embed {
            return Ok(self.pool(segments, &x));
        }
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
