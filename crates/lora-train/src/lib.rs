//! `modelmux-lora-train`: trains the demo LoRA adapters of modelmux on CPU.
//!
//! A small tool, not a training framework: it fine-tunes rank-r PEFT adapters for a plain
//! llama-family GGUF base model (SmolLM2 for the demo) on a few hundred examples, with
//! candle's autograd through a forward pass written to match the engine's, and saves them in
//! PEFT's format. The datasets are the base model's own answers rewritten in a style
//! ([`style`]), so an adapter learns the style and nothing else.
//!
//! - [`model::BaseModel`]: the frozen base, f32, and its differentiable forward pass.
//! - [`lora::LoraSet`]: the trainable adapters, PEFT's initialisation and file format.
//! - [`data`]: datasets, tokenized with the base model's chat template.
//! - [`train::train`]: the loop (AdamW, warm-up and cosine decay, a loss line per step).

pub mod data;
pub mod lora;
pub mod model;
pub mod style;
pub mod train;

/// What can go wrong while training.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor operation failed.
    #[error("tensor: {0}")]
    Tensor(#[from] candle_core::Error),
    /// The model, its tokenizer or an adapter could not be read or run.
    #[error("{0}")]
    Llm(#[from] modelmux_llm::LlmError),
    /// A file could not be read or written.
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
    /// A JSON document could not be read or written.
    #[error("json: {0}")]
    Json(#[from] serde_json::Error),
    /// An argument or a dataset is not usable; the message says why.
    #[error("{0}")]
    Invalid(String),
}

/// The result of this crate's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;
