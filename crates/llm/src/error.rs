//! The one error type of the LLM runtime. It says what went wrong and what to do about it; it
//! never chooses an HTTP status: [`LlmError::kind`] is what the serving layer maps, in one place.

use std::time::Duration;

/// What an [`LlmError`] is about, for whoever maps errors to a protocol (HTTP statuses,
/// metric labels).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The request itself is wrong (a prompt longer than the context, `max_tokens` 0, a
    /// sampling parameter out of range): the client must change it.
    InvalidRequest,
    /// An adapter or model that does not exist.
    NotFound,
    /// A model or adapter file that cannot be used (corrupt, unsupported, made for another
    /// base model).
    InvalidModel,
    /// The engine has no room now (KV memory, sequence slots, queue): try again later.
    Overloaded,
    /// The storage an adapter comes from failed.
    Storage,
    /// The engine stopped (shut down, or its thread died).
    Unavailable,
    /// A bug or an unexpected failure of a kernel.
    Internal,
}

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
            Self::InvalidGguf { .. } | Self::InvalidAdapter { .. } => ErrorKind::InvalidModel,
            Self::AdapterNotFound { .. } => ErrorKind::NotFound,
            Self::Storage { .. } => ErrorKind::Storage,
            Self::ContextOverflow { .. } | Self::InvalidRequest(_) | Self::Text(_) => {
                ErrorKind::InvalidRequest
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

impl From<candle_core::Error> for LlmError {
    fn from(e: candle_core::Error) -> Self {
        Self::Internal(e.to_string())
    }
}

/// The result of the LLM runtime.
pub type Result<T, E = LlmError> = std::result::Result<T, E>;
