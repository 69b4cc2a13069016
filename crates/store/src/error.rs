//! What can go wrong reading a model repository.

use std::path::PathBuf;

use modelmux_cache::{ErrorKind, Failure};

/// An error from a [`ModelRepository`](crate::ModelRepository) or a
/// [`DiskCache`](crate::DiskCache). Every message names the model and the repository, so it can
/// be shown to the client as it is.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The repository has no such object. Not retried.
    #[error("model '{id}' not found in {repository} (no object '{file}' at {key})")]
    NotFound {
        /// The model id asked for.
        id: String,
        /// The file of the model that is missing.
        file: String,
        /// The repository, as configured (`s3://bucket/prefix`, a directory, ...).
        repository: String,
        /// The object key or path that was looked up.
        key: String,
    },

    /// The store refused access (403, or no valid credentials). Not retried.
    #[error("access to model '{id}' in {repository} was denied: {message}")]
    PermissionDenied {
        /// The model id asked for.
        id: String,
        /// The repository.
        repository: String,
        /// What the store said.
        message: String,
    },

    /// The model id cannot name an object inside the repository (`..`, an absolute path, ...).
    #[error("model id '{id}' cannot be used inside a model repository: {reason}")]
    InvalidId {
        /// The rejected id.
        id: String,
        /// What is wrong with it.
        reason: String,
    },

    /// Every attempt to download the model failed (timeouts, 5xx, resets, truncated or corrupt
    /// transfers); nothing was left in the disk cache.
    #[error(
        "downloading model '{id}' from {repository} failed after {attempts} attempt(s); last error: {last}"
    )]
    Transfer {
        /// The model id.
        id: String,
        /// The repository.
        repository: String,
        /// Attempts made.
        attempts: u32,
        /// The last attempt's error.
        last: String,
    },

    /// The model is larger than the whole disk cache, or the disk cache had no room for it
    /// within its capacity timeout because every file in it was being read.
    #[error("the disk cache cannot hold model '{id}': {message}")]
    CacheFull {
        /// The model id.
        id: String,
        /// Why.
        message: String,
    },

    /// The repository or disk cache configuration is wrong (a malformed URL, an unknown
    /// option, a scheme this build does not include).
    #[error("{0}")]
    Config(String),

    /// A local file or directory could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },

    /// Any other error from the object store.
    #[error("reading model '{id}' from {repository} failed: {message}")]
    Store {
        /// The model id.
        id: String,
        /// The repository.
        repository: String,
        /// What the store said.
        message: String,
    },
}

impl StoreError {
    /// Whether the model does not exist in the repository (an HTTP 404 for the client).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// What this error is about: an unknown model, an id that cannot be a path (the
    /// client's); storage that failed or refused the server (its upstream's); a disk cache
    /// without room (try later); a configuration or local file problem (the server's own).
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::NotFound { .. } => ErrorKind::NotFound,
            Self::InvalidId { .. } => ErrorKind::InvalidInput,
            Self::PermissionDenied { .. } | Self::Transfer { .. } | Self::Store { .. } => {
                ErrorKind::Upstream
            }
            Self::CacheFull { .. } => ErrorKind::Overloaded,
            Self::Config(_) | Self::Io { .. } => ErrorKind::Internal,
        }
    }

    /// A copy, for errors shared by every waiter of a load (`std::io::Error` is not `Clone`).
    pub(crate) fn duplicate(&self) -> Self {
        match self {
            Self::NotFound {
                id,
                file,
                repository,
                key,
            } => Self::NotFound {
                id: id.clone(),
                file: file.clone(),
                repository: repository.clone(),
                key: key.clone(),
            },
            Self::PermissionDenied {
                id,
                repository,
                message,
            } => Self::PermissionDenied {
                id: id.clone(),
                repository: repository.clone(),
                message: message.clone(),
            },
            Self::InvalidId { id, reason } => Self::InvalidId {
                id: id.clone(),
                reason: reason.clone(),
            },
            Self::Transfer {
                id,
                repository,
                attempts,
                last,
            } => Self::Transfer {
                id: id.clone(),
                repository: repository.clone(),
                attempts: *attempts,
                last: last.clone(),
            },
            Self::CacheFull { id, message } => Self::CacheFull {
                id: id.clone(),
                message: message.clone(),
            },
            Self::Config(message) => Self::Config(message.clone()),
            Self::Io { path, source } => Self::Io {
                path: path.clone(),
                source: std::io::Error::new(source.kind(), source.to_string()),
            },
            Self::Store {
                id,
                repository,
                message,
            } => Self::Store {
                id: id.clone(),
                repository: repository.clone(),
                message: message.clone(),
            },
        }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
}

/// A store error as the serving layer answers it: its [`kind`](StoreError::kind) and message.
impl From<StoreError> for Failure {
    fn from(error: StoreError) -> Self {
        Failure::new(error.kind(), error.to_string())
    }
}
