//! A GGUF file's metadata read as a [`LlamaConfig`]: the family, the shape, rotary scaling,
//! sliding windows and soft caps, each checked (bounded, consistent with the tensors, no key
//! this engine does not implement) before anything is sized by it.

use candle_core::quantized::gguf_file::Value;

use super::GgufFile;
use super::limits::{
    self, MAX_CONTEXT, MAX_EMBEDDING, MAX_FFN, MAX_HEAD_DIM, MAX_HEADS, MAX_LAYERS,
};
use crate::error::Result;
use crate::family::Family;

/// The shape of a Llama-family model, from its GGUF metadata.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// Transformer blocks (`llama.block_count`).
    pub n_layer: usize,
    /// Hidden size (`llama.embedding_length`).
    pub d_model: usize,
    /// Query heads (`llama.attention.head_count`).
    pub n_head: usize,
    /// Key/value heads (`llama.attention.head_count_kv`); fewer than `n_head` is grouped-query
    /// attention.
    pub n_kv_head: usize,
    /// Size of one head (`d_model / n_head`).
    pub head_dim: usize,
    /// Inner size of the MLP (`llama.feed_forward_length`).
    pub ffn_dim: usize,
    /// Tokens in the vocabulary.
    pub vocab_size: usize,
    /// Rotary base frequency (`llama.rope.freq_base`).
    pub rope_base: f32,
    /// RMSNorm epsilon (`llama.attention.layer_norm_rms_epsilon`).
    pub rms_eps: f32,
    /// The context the model was trained for (`llama.context_length`).
    pub context_length: usize,
    /// The family (`general.architecture`) and what sets it apart.
    pub family: Family,
    /// What queries are multiplied by before their dot products with keys:
    /// `1 / sqrt(head_dim)`, or Gemma's `1 / sqrt(query_pre_attn_scalar)`.
    pub attention_scale: f32,
    /// Attention scores pass through `cap * tanh(s / cap)` (`attn_logit_softcapping`: Gemma 2).
    pub attention_softcap: Option<f32>,
    /// Logits pass through `cap * tanh(l / cap)` (`final_logit_softcapping`: Gemma 2).
    pub final_softcap: Option<f32>,
    /// Token embeddings are multiplied by this (`sqrt(d_model)` for Gemma, else 1).
    pub embedding_scale: f32,
    /// The positions a sliding-window layer attends to, itself included
    /// (`attention.sliding_window`).
    pub sliding_window: Option<usize>,
    /// Which layers attend through the window (all `false` without one).
    pub window_layers: Vec<bool>,
    /// The rotary base of the sliding-window layers (`rope.freq_base_swa`, or the family's).
    pub rope_base_window: f32,
    /// RoPE scaling (`rope.scaling.*`) of the layers without a window.
    pub rope_scaling: RopeScaling,
    /// RoPE scaling of the sliding-window layers (none where the family keeps them unscaled).
    pub rope_scaling_window: RopeScaling,
    /// Llama 4's attention temperature (`attention.temperature_scale`: Mistral 3): queries at
    /// position `p` are multiplied by `1 + scale * ln(1 + floor(p / floor))`.
    pub attention_temperature: Option<AttentionTemperature>,
}

/// How rotary frequencies are stretched for contexts longer than the model was trained on.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum RopeScaling {
    /// Positions divided by the factor (`rope.scaling.type = linear`; 1 is none).
    Linear(f32),
    /// YaRN (`rope.scaling.type = yarn`): frequencies above the `beta_fast` rotations in the
    /// original context are kept, those below `beta_slow` divided by `factor`, a ramp
    /// between; cos and sin multiplied by `attention_factor`.
    Yarn {
        /// `rope.scaling.factor`.
        factor: f32,
        /// `rope.scaling.original_context_length`.
        original_context: usize,
        /// `rope.scaling.yarn_beta_fast` (32 when absent).
        beta_fast: f32,
        /// `rope.scaling.yarn_beta_slow` (1 when absent).
        beta_slow: f32,
        /// Hugging Face's `attention_factor`: `mscale(factor, 1) / mscale(factor, m)` with
        /// `m = rope.scaling.yarn_log_multiplier` when given, else `mscale(factor, 1)`, where
        /// `mscale(s, m) = 0.1 m ln(s) + 1`.
        attention_factor: f32,
    },
}

/// See [`LlamaConfig::attention_temperature`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionTemperature {
    /// `attention.temperature_scale` (Hugging Face's `llama_4_scaling_beta`).
    pub scale: f32,
    /// Positions per step (`rope.scaling.original_context_length`).
    pub floor: usize,
}

impl AttentionTemperature {
    /// The factor of queries at `position`.
    pub fn at(&self, position: usize) -> f32 {
        1.0 + self.scale * ((position / self.floor) as f32 + 1.0).ln()
    }
}

impl LlamaConfig {
    /// Rows of the query projection: `n_head * head_dim` (`d_model` unless the file gives
    /// another head size, as Qwen3 does).
    pub fn q_dim(&self) -> usize {
        self.n_head * self.head_dim
    }

    /// Rows of the key (and value) projection: `n_kv_head * head_dim`.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_head * self.head_dim
    }

    /// Whether layer `layer` attends through the sliding window.
    pub fn is_window_layer(&self, layer: usize) -> bool {
        self.window_layers.get(layer).copied().unwrap_or(false)
    }

    /// Bytes of KV cache one token takes in every layer (keys and values, stored as `dtype`).
    pub fn kv_bytes_per_token(&self, dtype: crate::KvDtype) -> u64 {
        (self.n_layer * 2 * self.kv_dim() * dtype.bytes()) as u64
    }
}

impl GgufFile {
    /// The model's shape, checked: a family this engine runs, with consistent head counts.
    pub fn llama_config(&self) -> Result<LlamaConfig> {
        let arch = self.string("general.architecture").unwrap_or("");
        // Mistral, SmolLM, TinyLlama... are written with architecture "llama".
        let family = Family::of(arch).ok_or_else(|| {
            self.error(format!(
                "architecture '{arch}' is not supported (this engine runs: {})",
                Family::names()
            ))
        })?;
        let key = |name: &str| format!("{arch}.{name}");
        let n_layer = self.u64(&key("block_count"))? as usize;
        let d_model = self.u64(&key("embedding_length"))? as usize;
        let n_head = self.u64(&key("attention.head_count"))? as usize;
        let n_kv_head = match self.get(&key("attention.head_count_kv")) {
            Some(_) => self.u64(&key("attention.head_count_kv"))? as usize,
            None => n_head,
        };
        let ffn_dim = self.u64(&key("feed_forward_length"))? as usize;
        let context_length = self.u64(&key("context_length"))? as usize;
        let rope_base = self.f32_or(&key("rope.freq_base"), 10_000.0)?;
        let rms_eps = self.f32_or(&key("attention.layer_norm_rms_epsilon"), 1e-5)?;
        if n_layer == 0 || d_model == 0 || n_head == 0 || n_kv_head == 0 || ffn_dim == 0 {
            return Err(self.error("a dimension in the metadata is zero"));
        }
        let head_dim = match self.get(&key("attention.key_length")) {
            Some(_) => self.u64(&key("attention.key_length"))? as usize,
            None if d_model.is_multiple_of(n_head) => d_model / n_head,
            None => 0,
        };
        // Bounded, and the blocks there, before anything is sized by them.
        self.check_shape(
            arch,
            &[
                ("block_count", n_layer, MAX_LAYERS),
                ("embedding_length", d_model, MAX_EMBEDDING),
                ("attention.head_count", n_head, MAX_HEADS),
                ("attention.head_count_kv", n_kv_head, MAX_HEADS),
                ("attention.key_length", head_dim, MAX_HEAD_DIM),
                ("feed_forward_length", ffn_dim, MAX_FFN),
                ("context_length", context_length, MAX_CONTEXT),
            ],
        )?;
        self.check_blocks(arch, n_layer)?;
        if head_dim == 0 || !n_head.is_multiple_of(n_kv_head) || !head_dim.is_multiple_of(2) {
            return Err(self.error(format!(
                "inconsistent heads: d_model {d_model}, {n_head} heads of {head_dim}, {n_kv_head} KV heads"
            )));
        }
        if let Some(rot) = self.get(&key("rope.dimension_count")) {
            let rot = rot.to_u32().unwrap_or(0) as usize;
            if rot != head_dim {
                return Err(self.error(format!(
                    "partial rotary embeddings (rope.dimension_count {rot} < head size {head_dim}) are not supported"
                )));
            }
        }
        self.refuse_unknown_keys(family, head_dim)?;
        let rope_scaling = self.rope_scaling(arch)?;
        let attention_temperature = self.attention_temperature(arch, rope_scaling)?;
        if self.get(&key("expert_count")).is_some() {
            return Err(self.error("mixture-of-experts models are not supported"));
        }
        let vocab_size = self.vocab_size(arch, d_model)?;
        let cap = |name: &str| -> Result<Option<f32>> {
            let value = self.f32_or(&key(name), 0.0)?;
            Ok((value > 0.0).then_some(value))
        };
        let attention_softcap = cap("attn_logit_softcapping")?;
        let final_softcap = cap("final_logit_softcapping")?;
        let (sliding_window, window_layers) = self.window_layers(family, n_layer)?;
        let query_scalar = match family.wide_query_scale_layers {
            Some(layers) if layers == n_layer => d_model / n_head,
            _ => head_dim,
        };
        let rope_base_window = match self.get(&key("rope.freq_base_swa")) {
            Some(_) => self.f32_or(&key("rope.freq_base_swa"), rope_base)?,
            None => family.window_rope_base.unwrap_or(rope_base),
        };
        Ok(LlamaConfig {
            n_layer,
            d_model,
            n_head,
            n_kv_head,
            head_dim,
            ffn_dim,
            vocab_size,
            rope_base,
            rms_eps,
            context_length,
            family,
            attention_scale: 1.0 / (query_scalar as f32).sqrt(),
            attention_softcap,
            final_softcap,
            embedding_scale: if family.scaled_embeddings {
                (d_model as f32).sqrt()
            } else {
                1.0
            },
            sliding_window,
            window_layers,
            rope_base_window,
            rope_scaling,
            rope_scaling_window: if family.window_rope_base.is_some() {
                RopeScaling::Linear(1.0)
            } else {
                rope_scaling
            },
            attention_temperature,
        })
    }

    /// Llama 4's attention temperature (`attention.temperature_scale`), which needs the
    /// context the YaRN scaling stretched.
    fn attention_temperature(
        &self,
        arch: &str,
        rope_scaling: RopeScaling,
    ) -> Result<Option<AttentionTemperature>> {
        let key = format!("{arch}.attention.temperature_scale");
        if self.get(&key).is_none() {
            return Ok(None);
        }
        let scale = self.f32_or(&key, 0.0)?;
        let floor = match rope_scaling {
            RopeScaling::Yarn {
                original_context, ..
            } => original_context,
            RopeScaling::Linear(_) => 0,
        };
        if floor == 0 && scale != 0.0 {
            return Err(self
                .error("attention.temperature_scale needs rope.scaling.original_context_length"));
        }
        Ok((scale != 0.0).then_some(AttentionTemperature { scale, floor }))
    }

    /// The vocabulary's size, from the token embeddings' shape (which must be `d_model` wide),
    /// checked.
    fn vocab_size(&self, arch: &str, d_model: usize) -> Result<usize> {
        let info = self
            .content
            .tensor_infos
            .get("token_embd.weight")
            .ok_or_else(|| self.error("tensor token_embd.weight is missing"))?;
        let (vocab_size, embd) = info
            .shape
            .dims2()
            .map_err(|e| self.error(format!("token_embd.weight: {e}")))?;
        if embd != d_model {
            return Err(self.error(format!(
                "token_embd.weight has width {embd}, embedding_length is {d_model}"
            )));
        }
        self.check_vocab(arch, vocab_size)?;
        Ok(vocab_size)
    }

    /// `rope.scaling.*`, as llama.cpp reads it: a missing type is linear, a factor of 0 or
    /// none is 1.
    fn rope_scaling(&self, arch: &str) -> Result<RopeScaling> {
        let key = |name: &str| format!("{arch}.rope.scaling.{name}");
        let factor = self.f32_or(&key("factor"), 1.0)?;
        let factor = if factor == 0.0 { 1.0 } else { factor };
        if !(factor.is_finite() && factor > 0.0) {
            return Err(self.error(format!("rope.scaling.factor {factor} is not positive")));
        }
        match self.string(&key("type")) {
            None | Some("linear") => Ok(RopeScaling::Linear(factor)),
            Some("none") if factor == 1.0 => Ok(RopeScaling::Linear(1.0)),
            Some("none") => Err(self.error(format!(
                "rope.scaling.type is none but rope.scaling.factor is {factor}"
            ))),
            Some("yarn") => {
                let original_context = match self.get(&key("original_context_length")) {
                    Some(_) => self.u64(&key("original_context_length"))? as usize,
                    None => self.u64(&format!("{arch}.context_length"))? as usize,
                };
                let mscale = |m: f32| {
                    if factor <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * factor.ln() + 1.0
                    }
                };
                let attention_factor = match self.get(&key("yarn_log_multiplier")) {
                    Some(_) => mscale(1.0) / mscale(self.f32_or(&key("yarn_log_multiplier"), 0.0)?),
                    None => mscale(1.0),
                };
                if original_context == 0 {
                    return Err(self.error("rope.scaling.original_context_length is 0"));
                }
                let name = key("original_context_length");
                limits::at_most(&name, original_context, MAX_CONTEXT).map_err(|m| self.error(m))?;
                Ok(RopeScaling::Yarn {
                    factor,
                    original_context,
                    beta_fast: self.f32_or(&key("yarn_beta_fast"), 32.0)?,
                    beta_slow: self.f32_or(&key("yarn_beta_slow"), 1.0)?,
                    attention_factor,
                })
            }
            Some(kind) => Err(self.error(format!("rope scaling '{kind}' is not supported yet"))),
        }
    }

    /// The sliding window and which layers use it: none unless the family has such layers
    /// and the file gives `attention.sliding_window`; then the family's pattern, or the
    /// file's `attention.sliding_window_pattern` (a period, or one flag per layer).
    fn window_layers(&self, family: Family, n_layer: usize) -> Result<(Option<usize>, Vec<bool>)> {
        let key = |name: &str| format!("{}.{name}", family.name);
        let none = Ok((None, vec![false; n_layer]));
        let Some(default_period) = family.window_pattern else {
            return none;
        };
        let window = match self.get(&key("attention.sliding_window")) {
            None => return none,
            Some(_) => self.u64(&key("attention.sliding_window"))? as usize,
        };
        if window == 0 {
            return none;
        }
        let name = key("attention.sliding_window");
        limits::at_most(&name, window, MAX_CONTEXT).map_err(|m| self.error(m))?;
        let layers = match self.get(&key("attention.sliding_window_pattern")) {
            Some(Value::Array(flags)) => {
                let flags: Vec<bool> = flags.iter().filter_map(|v| v.to_bool().ok()).collect();
                if flags.len() != n_layer {
                    return Err(self.error(format!(
                        "attention.sliding_window_pattern has {} flags for {n_layer} layers",
                        flags.len()
                    )));
                }
                flags
            }
            other => {
                let period = match other {
                    Some(_) => self.u64(&key("attention.sliding_window_pattern"))? as usize,
                    None => default_period,
                };
                // As llama.cpp's `set_swa_pattern`: period 0 makes every layer windowed.
                (0..n_layer)
                    .map(|l| period == 0 || l % period < period - 1)
                    .collect()
            }
        };
        Ok((Some(window), layers))
    }

    /// Refuses `{arch}.*` metadata this engine does not implement: such a key changes the
    /// computation (soft-capping, sliding windows, a scaled logit, experts...), and running
    /// the model without it gives wrong answers with no error. Keys that only restate a shape
    /// must agree with it.
    fn refuse_unknown_keys(&self, family: Family, head_dim: usize) -> Result<()> {
        let arch = family.name;
        const KNOWN: &[&str] = &[
            "block_count",
            "embedding_length",
            "attention.head_count",
            "attention.head_count_kv",
            "feed_forward_length",
            "context_length",
            "rope.freq_base",
            "rope.dimension_count",
            "attention.layer_norm_rms_epsilon",
            "vocab_size",
            // Checked where they are read: linear or YaRN scaling, no experts.
            "rope.scaling.type",
            "rope.scaling.factor",
            "rope.scaling.original_context_length",
            "rope.scaling.yarn_beta_fast",
            "rope.scaling.yarn_beta_slow",
            "rope.scaling.yarn_log_multiplier",
            "expert_count",
            "expert_used_count",
        ];
        let prefix = format!("{arch}.");
        let mut unknown = Vec::new();
        for (key, value) in &self.content.metadata {
            let Some(name) = key.strip_prefix(&prefix) else {
                continue;
            };
            match name {
                // The head size (read with the shape); values of another size than keys are
                // not supported.
                "attention.key_length" => {}
                "attention.value_length" => {
                    let n = value.to_u32().map(|v| v as usize).unwrap_or(0);
                    if n != head_dim {
                        return Err(self.error(format!(
                            "{key} is {n}, not the key size {head_dim}: value heads of another size are not supported"
                        )));
                    }
                }
                name if KNOWN.contains(&name) || family.keys.contains(&name) => {}
                _ => unknown.push(key.as_str()),
            }
        }
        if !unknown.is_empty() {
            unknown.sort_unstable();
            return Err(self.error(format!(
                "metadata this engine does not implement: {} (running the model without it would give wrong answers)",
                unknown.join(", ")
            )));
        }
        Ok(())
    }
}
