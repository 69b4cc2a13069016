//! `modelmux-llm`: the LLM runtime of modelmux.
//!
//! A Llama-family model read from GGUF (with candle) runs on the CPU on `modelmux-kernels`'
//! int8 matrix product, one engine loop per replica. Each sequence has its own KV cache and
//! positions, so prompts being prefilled and sequences being decoded share every step, and so
//! do sequences with different LoRA adapters: adapters stay unmerged and are applied to their
//! own rows.
//!
//! - [`LlamaWeights`] / [`LlamaModel`]: the model and its batched forward pass.
//! - [`TextTokenizer`] and [`ChatTemplate`]: text in and out, from the GGUF file itself.
//! - [`LoraAdapter`]: a PEFT adapter checked against the base model; [`AllowedSources`]: the
//!   rule for adapters a request names by their source (a path or URL).
//! - [`Engine`]: continuous batching on one thread, a KV byte budget, cancellation.
//! - [`LlmRuntime`]: all of it from one GGUF file, and adapters from a model repository
//!   through a [`modelmux_cache::Multiplexer`].

mod chat;
mod engine;
mod error;
mod family;
mod gguf;
mod kv;
mod loaded;
mod lockstep;
mod logprobs;
mod lora;
mod matmul;
mod model;
mod ops;
mod parallel;
mod runtime;
mod sampling;
mod tokenizer;
mod weights;

pub use chat::{ChatMessage, ChatTemplate};
pub use engine::{
    AdaptersInUse, Constraint, Engine, EngineConfig, EngineSnapshot, FinishReason, Generation,
    GenerationEvent, GenerationRequest, GenerationStream, ModelReloader, TokenConstraint, Usage,
    WeightsState,
};
pub use error::{ErrorKind, LlmError, Result};
pub use family::{Activation, Family, RopeStyle};
pub use gguf::{AttentionTemperature, GgufFile, LlamaConfig, RopeScaling};
pub use kv::{KvBudget, KvCache, KvDtype, KvReservation};
pub use logprobs::{MAX_TOP_LOGPROBS, TokenLogprob, token_logprob};
pub use lora::{
    ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, AdapterLease, AdapterNames, AdapterPrecision,
    AdapterSources, AllowedSources, InvalidSourceEntry, LoraAdapter, MAX_NAMES, SourceMatch,
    TooManyNames,
};
pub use model::{LlamaModel, Segment};
pub use runtime::{AdapterLoader, LlmRuntime, RuntimeOptions};
pub use sampling::{
    MAX_LOGIT_BIAS, MAX_STOP_BYTES, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS, Sampler, SamplingParams,
    argmax,
};
pub use tokenizer::{TextStream, TextTokenizer, check_token_ids};
pub use weights::{LlamaWeights, Target, WeightFormat};
