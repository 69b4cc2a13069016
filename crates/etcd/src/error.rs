//! What can go wrong talking to etcd: one error type for every call, keeping the gRPC status
//! etcd (or the connection to it) answered with, so callers test codes, not message text.

use tonic::Code;

/// An etcd call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An endpoint could not be used: it is not an `http://host:port` URL (this client speaks
    /// plaintext HTTP/2 only, so `https://` is refused too).
    #[error("etcd endpoint {endpoint:?}: {reason}")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
        /// What is wrong with it.
        reason: String,
    },
    /// [`Client::connect`](crate::Client::connect) was given no endpoints.
    #[error("no etcd endpoints given: pass at least one http://host:port")]
    NoEndpoints,
    /// etcd refused or failed the call, or could not be reached (then the code is
    /// `Unavailable`, or `Cancelled` when the call's timeout passed).
    #[error("{} (gRPC {:?})", describe(.0), .0.code())]
    Status(tonic::Status),
    /// A lease keep-alive found the lease gone: it expired or was revoked.
    #[error("lease {id:x} not found: it expired or was revoked")]
    LeaseNotFound {
        /// The lease.
        id: i64,
    },
    /// etcd refused to create a watch.
    #[error("etcd refused the watch: {reason}")]
    WatchRefused {
        /// etcd's reason.
        reason: String,
    },
    /// A stream to etcd (a watch or a lease keep-alive) ended: etcd closed it, or its
    /// connection broke. Open another.
    #[error("the {0} stream to etcd ended")]
    StreamEnded(&'static str),
}

/// etcd's message for a lease it does not know (`ErrGRPCLeaseNotFound`, code `NotFound`), sent
/// for a put on, or a revoke of, an expired or revoked lease.
const LEASE_NOT_FOUND: &str = "requested lease not found";

impl Error {
    /// The gRPC code etcd answered with, if the call got as far as an answer (or a transport
    /// failure mapped to one).
    pub fn code(&self) -> Option<Code> {
        match self {
            Self::Status(status) => Some(status.code()),
            _ => None,
        }
    }

    /// Whether the lease this call used is gone (expired or revoked): a keep-alive that found
    /// no lease, or etcd's `NotFound` "requested lease not found" for a put or a revoke.
    pub fn is_lease_not_found(&self) -> bool {
        match self {
            Self::LeaseNotFound { .. } => true,
            Self::Status(status) => {
                status.code() == Code::NotFound && status.message().contains(LEASE_NOT_FOUND)
            }
            _ => false,
        }
    }
}

/// The status's message followed by what caused it, where that adds something: a transport
/// failure's message alone says "tcp connect error", its cause says "Connection refused".
fn describe(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            text = format!("{text}: {more}");
        }
        cause = e.source();
    }
    text
}

impl From<tonic::Status> for Error {
    fn from(status: tonic::Status) -> Self {
        Self::Status(status)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_gone_only_when_etcd_says_so() {
        let gone = Error::from(tonic::Status::not_found(
            "etcdserver: requested lease not found",
        ));
        assert!(gone.is_lease_not_found());
        assert!(Error::LeaseNotFound { id: 7 }.is_lease_not_found());
        assert_eq!(gone.code(), Some(Code::NotFound));

        let unreachable = Error::from(tonic::Status::unavailable("tcp connect error"));
        assert!(!unreachable.is_lease_not_found());
        let other_not_found = Error::from(tonic::Status::not_found("etcdserver: key not found"));
        assert!(!other_not_found.is_lease_not_found());
        assert!(!Error::StreamEnded("lease keep-alive").is_lease_not_found());
    }

    #[test]
    fn messages_say_what_etcd_said() {
        let e = Error::from(tonic::Status::unavailable("etcdserver: no leader"));
        assert_eq!(e.to_string(), "etcdserver: no leader (gRPC Unavailable)");
        assert_eq!(
            Error::LeaseNotFound { id: 255 }.to_string(),
            "lease ff not found: it expired or was revoked"
        );
    }
}
