//! The one error type of the LLM runtime. It says what went wrong and what to do about it; it
//! never chooses an HTTP status: its [`ErrorKind`] (the one every runtime uses) is what the
//! serving layer maps, in one place.

use std::time::Duration;

pub use modelmux_cache::ErrorKind;
use modelmux_cache::Failure;

/// An error of the LLM runtime.
#[derive(Debug, thiserror::Error)]
pub enum LlmError {
    /// A GGUF file that cannot be read or is not a model this engine runs.
    #[error("model file {path}: {message}")]
    InvalidGguf {
        /// The file.
        path: String,
        /// What is wrong with it.
        message: String,
    },

    /// An adapter whose configuration or weights cannot be used.
    #[error("adapter '{adapter}': {message}")]
    InvalidAdapter {
        /// The adapter id.
        adapter: String,
        /// What is wrong, naming the key or tensor.
        message: String,
    },

    /// An adapter that is not in the repository.
    #[error("adapter '{adapter}' not found in {repository}")]
    AdapterNotFound {
        /// The adapter id.
        adapter: String,
        /// The repository searched.
        repository: String,
    },

    /// A request named an adapter by its source (a path or URL) that the configuration does
    /// not allow (`lora_config.allowed_sources`). Decided before anything is read.
    #[error("adapter source '{adapter}' is refused by lora_config.allowed_sources: {reason}")]
    SourceNotAllowed {
        /// The source, as the request named it.
        adapter: String,
        /// Why: the entries it is not below, or what in it is not a plain path.
        reason: String,
    },

    /// The adapter repository failed (after the store's retries).
    #[error("adapter '{adapter}': {message}")]
    Storage {
        /// The adapter id.
        adapter: String,
        /// The store's error.
        message: String,
    },

    /// The prompt and the tokens asked for do not fit in the model's context.
    #[error(
        "the prompt has {prompt_tokens} tokens and {max_tokens} more were asked for, but the context holds {context} tokens: shorten the prompt or lower max_tokens"
    )]
    ContextOverflow {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// Tokens asked for.
        max_tokens: usize,
        /// The context length (`max_model_len`).
        context: usize,
    },

    /// The engine's settings cannot work with this model (a KV budget that holds no sequence
    /// of `max_model_len`, say).
    #[error("{setting}: {message}")]
    InvalidConfig {
        /// The setting at fault, as the configuration names it.
        setting: &'static str,
        /// What is wrong and what would work.
        message: String,
    },

    /// A request parameter out of range.
    #[error("invalid request: {0}")]
    InvalidRequest(String),

    /// No room for the sequence within the wait allowed.
    #[error("overloaded: {reason}; retry after {retry_after:?}")]
    Overloaded {
        /// What is full.
        reason: String,
        /// A hint for when to try again.
        retry_after: Duration,
    },

    /// The engine is not running.
    #[error("the engine stopped: {0}")]
    EngineStopped(String),

    /// Tokenizing, detokenizing or rendering the chat template failed.
    #[error("{0}")]
    Text(String),

    /// A numeric kernel failed (a bug: shapes are checked at load).
    #[error("internal error in the model: {0}")]
    Internal(String),
}

impl LlmError {
    /// What the error is about.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InvalidGguf { .. } | Self::InvalidAdapter { .. } | Self::InvalidConfig { .. } => {
                ErrorKind::UnusableModel
            }
            Self::AdapterNotFound { .. } => ErrorKind::NotFound,
            Self::SourceNotAllowed { .. } => ErrorKind::Forbidden,
            Self::Storage { .. } => ErrorKind::Upstream,
            Self::ContextOverflow { .. } | Self::InvalidRequest(_) | Self::Text(_) => {
                ErrorKind::InvalidInput
            }
            Self::Overloaded { .. } => ErrorKind::Overloaded,
            Self::EngineStopped(_) => ErrorKind::Unavailable,
            Self::Internal(_) => ErrorKind::Internal,
        }
    }

    pub(crate) fn adapter(adapter: &str, message: impl Into<String>) -> Self {
        Self::InvalidAdapter {
            adapter: adapter.to_owned(),
            message: message.into(),
        }
    }
}

/// An LLM error as the serving layer answers it: its [`kind`](LlmError::kind), its message and,
/// when the engine is full, when to try again.
impl From<&LlmError> for Failure {
    fn from(error: &LlmError) -> Self {
        let failure = Failure::new(error.kind(), error.to_string());
        match error {
            LlmError::Overloaded { retry_after, .. } => failure.with_retry_after(*retry_after),
            _ => failure,
        }
    }
}

impl From<candle_core::Error> for LlmError {
    fn from(e: candle_core::Error) -> Self {
        Self::Internal(e.to_string())
    }
}

/// The result of the LLM runtime.
pub type Result<T, E = LlmError> = std::result::Result<T, E>;
