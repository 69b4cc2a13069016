//! The limits of one engine, and their checks (alone, together, and against a model's shape).

use std::time::Duration;

use crate::error::{LlmError, Result};
use crate::kv::KvDtype;
use crate::weights::WeightFormat;

/// Limits of one engine.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Sequences running at once (vLLM's and Ray's `max_num_seqs`).
    pub max_num_seqs: usize,
    /// Longest sequence, prompt and output (`max_model_len`); at most the model's context.
    pub max_model_len: usize,
    /// Bytes of KV cache all sequences together may reserve.
    pub kv_cache_bytes: u64,
    /// Rows (tokens) in one step: decode rows plus prompt chunks.
    pub max_batch_tokens: usize,
    /// Requests waiting for admission beyond which new ones are refused at once.
    pub max_waiting: usize,
    /// How long a request may wait for admission before it is refused as overloaded.
    pub queue_timeout: Duration,
    /// Most sequences of one adapter (the base model counting as one) running at once;
    /// `None`: no cap beyond `max_num_seqs`.
    pub max_running_per_adapter: Option<usize>,
    /// Keep the KV of prompts' whole blocks for later prompts with the same prefix (vLLM's
    /// `enable_prefix_caching`), inside `kv_cache_bytes`.
    pub enable_prefix_caching: bool,
    /// The cache salt of requests that give none: prefixes are shared only between requests
    /// with the same salt (and the same adapter content).
    pub prefix_cache_salt: Option<String>,
    /// How the KV cache stores keys and values (vLLM's `kv_cache_dtype`); `None` chooses with
    /// the weights' format ([`KvDtype::for_weights`]).
    pub kv_cache_dtype: Option<KvDtype>,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            max_num_seqs: 16,
            max_model_len: 2048,
            kv_cache_bytes: 1 << 30,
            max_batch_tokens: 256,
            max_waiting: 256,
            queue_timeout: Duration::from_secs(30),
            max_running_per_adapter: None,
            enable_prefix_caching: true,
            prefix_cache_salt: None,
            kv_cache_dtype: None,
        }
    }
}

impl EngineConfig {
    /// Checks the limits alone and together (the one place they are checked: the YAML
    /// configuration's check and an engine's start both call this); errors name the setting as
    /// `engine_kwargs` spells it.
    pub fn validate(&self) -> Result<()> {
        let invalid = |setting, message: String| Err(LlmError::InvalidConfig { setting, message });
        for (setting, value) in [
            ("engine_kwargs.max_num_seqs", self.max_num_seqs),
            ("engine_kwargs.max_model_len", self.max_model_len),
            (
                "engine_kwargs.max_num_batched_tokens",
                self.max_batch_tokens,
            ),
            ("engine_kwargs.max_waiting_seqs", self.max_waiting),
        ] {
            if value == 0 {
                return invalid(setting, "must be at least 1".into());
            }
        }
        if self.max_batch_tokens < self.max_num_seqs {
            return invalid(
                "engine_kwargs.max_num_batched_tokens",
                format!(
                    "{} must be at least max_num_seqs ({})",
                    self.max_batch_tokens, self.max_num_seqs
                ),
            );
        }
        if self.kv_cache_bytes == 0 {
            return invalid("engine_kwargs.kv_cache_bytes", "must be at least 1".into());
        }
        if self.max_running_per_adapter == Some(0) {
            return invalid(
                "engine_kwargs.max_num_seqs_per_adapter",
                "must be at least 1".into(),
            );
        }
        Ok(())
    }

    /// How the KV cache stores keys and values with weights held as `weights`.
    pub fn kv_dtype(&self, weights: WeightFormat) -> KvDtype {
        self.kv_cache_dtype
            .unwrap_or_else(|| KvDtype::for_weights(weights))
    }

    /// Checks these limits against a model's shape, its weights held as `weights`: the KV
    /// budget must hold at least one sequence of `max_model_len` tokens, or every long
    /// request would be refused as if the client had asked too much.
    pub fn check_fits(&self, model: &crate::LlamaConfig, weights: WeightFormat) -> Result<()> {
        let per_token = model.kv_bytes_per_token(self.kv_dtype(weights));
        let needed = per_token.saturating_mul(self.max_model_len as u64);
        if self.kv_cache_bytes < needed {
            return Err(LlmError::InvalidConfig {
                setting: "engine_kwargs.kv_cache_bytes",
                message: format!(
                    "{} bytes cannot hold one sequence of max_model_len ({} tokens): this \
                     model's KV cache takes {per_token} bytes per token, so at least {needed} \
                     bytes ({:.1} MiB) are needed; raise kv_cache_bytes or lower max_model_len",
                    self.kv_cache_bytes,
                    self.max_model_len,
                    needed as f64 / (1u64 << 20) as f64
                ),
            });
        }
        Ok(())
    }
}
