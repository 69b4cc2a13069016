//! The one error type of the cache crate.

use std::sync::Arc;
use std::time::Duration;

use crate::{ErrorKind, Failure, InvalidModelId, ModelId};

/// A user error shared by every caller that waited on the same load.
pub type SharedError = Arc<dyn std::error::Error + Send + Sync + 'static>;

/// Why [`Multiplexer::get`](crate::Multiplexer::get) (or another operation) failed.
///
/// Errors are `Clone`: every caller waiting on one load receives the same error.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The model id was rejected before anything was loaded.
    #[error("invalid model id: {0}")]
    InvalidModelId(#[from] InvalidModelId),

    /// The loader returned an error.
    #[error("loading model '{id}' failed: {source}")]
    LoadFailed {
        /// The model.
        id: ModelId,
        /// The loader's error.
        source: SharedError,
    },

    /// The loader panicked. The panic was contained; nothing is left behind.
    #[error("loading model '{id}' panicked: {message}")]
    LoadPanicked {
        /// The model.
        id: ModelId,
        /// The panic's message, when it had one.
        message: String,
    },

    /// The loader did not finish within `load_timeout` and was cancelled.
    #[error(
        "loading model '{id}' timed out after {after:?} and was cancelled; raise load_timeout if the model needs longer"
    )]
    LoadTimeout {
        /// The model.
        id: ModelId,
        /// The timeout that expired.
        after: Duration,
    },

    /// The model failed to load recently and is not retried until its backoff expires, so a
    /// broken model cannot hammer storage.
    #[error(
        "model '{id}' failed to load recently and is not retried for another {retry_after:?}: {cause}"
    )]
    BackingOff {
        /// The model.
        id: ModelId,
        /// How long until the next load is attempted.
        retry_after: Duration,
        /// The failure being remembered.
        cause: Arc<Error>,
    },

    /// No room could be made for the model within `capacity_timeout`: every resident model was
    /// in use or pinned. Nothing was evicted that was in use, and nothing was overcommitted.
    #[error(
        "no capacity to load model '{id}' after waiting {waited:?}: {resident} models resident, \
         all in use or pinned, {loading} loading, {draining} still draining (max_models: {max_models}, \
         max_bytes: {max_bytes}); retry later or raise the caps"
    )]
    CapacityExhausted {
        /// The model that could not be loaded.
        id: ModelId,
        /// How long the load waited for room.
        waited: Duration,
        /// Models resident when it gave up.
        resident: usize,
        /// Other loads in progress when it gave up.
        loading: usize,
        /// Evicted models still waiting for their last user when it gave up.
        draining: usize,
        /// The count cap, as text (`unbounded` when none).
        max_models: String,
        /// The byte cap, as text (`unbounded` when none).
        max_bytes: String,
    },

    /// The model is larger than `max_bytes` on its own, so it can never be held.
    #[error("model '{id}' is {size} bytes, more than max_bytes ({max_bytes}) on its own")]
    ModelTooLarge {
        /// The model.
        id: ModelId,
        /// Its size (reported, or hinted by the loader).
        size: u64,
        /// The byte cap.
        max_bytes: u64,
    },

    /// The multiplexer is shutting down and takes no new work.
    #[error("the model multiplexer is shutting down")]
    ShuttingDown,

    /// The load's task ended without a result (its runtime is shutting down), or everyone
    /// waiting for it left before it started.
    #[error("loading model '{id}' was cancelled before it finished")]
    LoadCancelled {
        /// The model.
        id: ModelId,
    },

    /// Too many loads wait for one of the `max_concurrent_loads` turns: the queue of waiting
    /// loads was full, or this load waited `capacity_timeout` for its turn.
    #[error(
        "too many model loads in progress to load '{id}': {queued} loads wait for one of the \
         replica's {max_concurrent_loads} load turns; retry later"
    )]
    LoadsBusy {
        /// The model.
        id: ModelId,
        /// Loads waiting for a turn.
        queued: usize,
        /// Loads that run at once.
        max_concurrent_loads: usize,
    },
}

impl Error {
    /// What this error is about, for the layer that answers the client. A failed load is of
    /// its loader's kind (a [`Failure`](crate::Failure) it returned; else internal). While it
    /// is remembered in the backoff, a client's error (an unknown model, say) keeps its kind;
    /// any other is [`Overloaded`](ErrorKind::Overloaded): try again after the backoff.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::InvalidModelId(_) => ErrorKind::InvalidInput,
            // A loader may fail with a cache error of its own (a nested multiplexer's).
            Error::LoadFailed { source, .. } => match source.downcast_ref::<Error>() {
                Some(inner) => inner.kind(),
                None => Failure::kind_of(&**source),
            },
            Error::BackingOff { cause, .. } => match cause.kind() {
                kind if kind.is_client_error() => kind,
                _ => ErrorKind::Overloaded,
            },
            Error::LoadPanicked { .. } => ErrorKind::Internal,
            Error::LoadTimeout { .. } => ErrorKind::Timeout,
            Error::ModelTooLarge { .. } => ErrorKind::UnusableModel,
            Error::CapacityExhausted { .. }
            | Error::LoadCancelled { .. }
            | Error::LoadsBusy { .. } => ErrorKind::Overloaded,
            Error::ShuttingDown => ErrorKind::Unavailable,
        }
    }

    /// A short, stable name for the kind of error, for metric labels and logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Error::InvalidModelId(_) => "invalid_model_id",
            Error::LoadFailed { .. } => "load_failed",
            Error::LoadPanicked { .. } => "load_panicked",
            Error::LoadTimeout { .. } => "load_timeout",
            Error::BackingOff { .. } => "backing_off",
            Error::CapacityExhausted { .. } => "capacity_exhausted",
            Error::ModelTooLarge { .. } => "model_too_large",
            Error::ShuttingDown => "shutting_down",
            Error::LoadCancelled { .. } => "load_cancelled",
            Error::LoadsBusy { .. } => "loads_busy",
        }
    }

    /// When trying again later may succeed, how long to wait (for a `Retry-After` header).
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::BackingOff { retry_after, .. } => Some(*retry_after),
            Error::CapacityExhausted { .. }
            | Error::LoadCancelled { .. }
            | Error::LoadsBusy { .. } => Some(Duration::from_secs(1)),
            _ => None,
        }
    }

    /// Whether this failure is the model's own (remembered in the failure backoff), as opposed
    /// to a transient condition of the replica (capacity, shutdown).
    pub(crate) fn is_model_failure(&self) -> bool {
        matches!(
            self,
            Error::LoadFailed { .. }
                | Error::LoadPanicked { .. }
                | Error::LoadTimeout { .. }
                | Error::ModelTooLarge { .. }
        )
    }
}

/// Turns a caught panic's payload (from `catch_unwind`) into text.
///
/// ```
/// let payload = std::panic::catch_unwind(|| panic!("boom {}", 1)).unwrap_err();
/// assert_eq!(modelmux_cache::panic_message(&*payload), "boom 1");
/// ```
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}
