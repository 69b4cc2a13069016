//! What an error is about, said once by whoever raises it: the layers above map an
//! [`ErrorKind`] to a protocol (an HTTP status, a metric label) in one place, so a runtime
//! (a model kind, a store, an LLM engine) never chooses a status itself.

use std::time::Duration;

/// What went wrong, as whoever answers the client needs to know it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The model (or adapter, or file) asked for does not exist.
    NotFound,
    /// The request is wrong (a malformed input, a parameter out of range): the client must
    /// change it.
    InvalidInput,
    /// The request asks for something the server's configuration does not allow it (an
    /// adapter from a source outside the allowed ones): the client must change it.
    Forbidden,
    /// The model asked for exists but cannot be served (corrupt, an unsupported format, made
    /// for another base model, larger than the replica may hold).
    UnusableModel,
    /// No room now (memory, slots, a queue): trying again later may succeed.
    Overloaded,
    /// Stopped or stopping (shutting down, an engine that died): another replica may serve it.
    Unavailable,
    /// The storage the model comes from failed or refused the server.
    Upstream,
    /// The work did not finish in the time it was given.
    Timeout,
    /// A bug or an unexpected failure.
    Internal,
}

impl ErrorKind {
    /// A short, stable name, for metric labels and error bodies.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::NotFound => "not_found",
            ErrorKind::InvalidInput => "invalid_input",
            ErrorKind::Forbidden => "forbidden",
            ErrorKind::UnusableModel => "unusable_model",
            ErrorKind::Overloaded => "overloaded",
            ErrorKind::Unavailable => "unavailable",
            ErrorKind::Upstream => "upstream_failed",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Internal => "internal",
        }
    }

    /// Whether the client's request is at fault (it should not retry it unchanged).
    pub fn is_client_error(self) -> bool {
        matches!(
            self,
            ErrorKind::NotFound
                | ErrorKind::InvalidInput
                | ErrorKind::Forbidden
                | ErrorKind::UnusableModel
        )
    }
}

/// An error with its [`ErrorKind`]: what runtimes return (boxed, as a `BoxError`) when the
/// kind is not "internal", and what the serving layer looks for in any error it is handed,
/// also inside a failed load.
///
/// ```
/// use modelmux_types::{ErrorKind, Failure};
///
/// type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// let error: BoxError = Failure::not_found("model 'acme' is not in the repository").into();
/// assert_eq!(Failure::kind_of(&*error), ErrorKind::NotFound);
/// let plain: BoxError = "the GPU caught fire".into();
/// assert_eq!(Failure::kind_of(&*plain), ErrorKind::Internal);
/// ```
#[derive(Debug, Clone, thiserror::Error)]
#[error("{message}")]
pub struct Failure {
    kind: ErrorKind,
    message: String,
    retry_after: Option<Duration>,
}

impl Failure {
    /// A failure of this kind, saying what went wrong.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            retry_after: None,
        }
    }

    /// [`ErrorKind::NotFound`].
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }

    /// [`ErrorKind::InvalidInput`].
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidInput, message)
    }

    /// [`ErrorKind::Internal`].
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }

    /// [`ErrorKind::Overloaded`], to be tried again after `retry_after`.
    pub fn overloaded(message: impl Into<String>, retry_after: Duration) -> Self {
        Self::new(ErrorKind::Overloaded, message).with_retry_after(retry_after)
    }

    /// Says when trying again may succeed.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// What kind of failure this is.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// What went wrong.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// When trying again may succeed, if the failure said.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// The kind of any error: a [`Failure`]'s own, else [`ErrorKind::Internal`]. (The cache's
    /// `Error::kind` also reads its own errors, whose failed loads carry their loader's.)
    pub fn kind_of(error: &(dyn std::error::Error + 'static)) -> ErrorKind {
        match error.downcast_ref::<Failure>() {
            Some(f) => f.kind,
            None => ErrorKind::Internal,
        }
    }
}
