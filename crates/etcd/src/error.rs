//! What can go wrong talking to etcd: one error type for every call, keeping the gRPC status
//! etcd (or the connection to it) answered with, so callers test codes, not message text.

use tonic::Code;

/// An etcd call that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An endpoint could not be used: it is not an `http://host:port` URL, or not an
    /// `https://host:port` one with [TLS options](crate::ConnectOptions::with_tls) (which refuse
    /// `http://`).
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
    /// A CA certificate, client certificate or client key given for TLS could not be read or
    /// holds nothing usable.
    #[error("etcd TLS{}: {reason}", .file.as_ref().map(|f| format!(" ({})", f.display())).unwrap_or_default())]
    InvalidTls {
        /// The file, if it was read from one.
        file: Option<std::path::PathBuf>,
        /// What is wrong with it.
        reason: String,
    },
    /// etcd refused to issue a token for the client's user: a wrong user or password, or
    /// authentication is not enabled on that etcd.
    #[error("etcd refused to authenticate user {user:?}: {} (gRPC {:?})", describe(.status), .status.code())]
    Authentication {
        /// The user.
        user: String,
        /// etcd's answer.
        status: tonic::Status,
    },
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

    /// Whether etcd refused to authenticate the client's user (a wrong user or password).
    pub fn is_authentication_failed(&self) -> bool {
        matches!(self, Self::Authentication { .. })
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
pub(crate) fn describe(status: &tonic::Status) -> String {
    let mut text = status.message().to_owned();
    append_causes(&mut text, std::error::Error::source(status));
    if let Some(hint) = tls_hint(&text) {
        text = format!("{text} ({hint})");
    }
    text
}

/// What a TLS failure's message (rustls's alert or verdict) means for whoever configured it.
fn tls_hint(text: &str) -> Option<&'static str> {
    if [
        "BadCertificate",
        "CertificateRequired",
        "UnknownCA",
        "CertificateUnknown",
    ]
    .iter()
    .any(|alert| text.contains(&format!("fatal alert: {alert}")))
    {
        Some(
            "etcd refused this client's TLS certificate: it asks for a client certificate \
             signed by its --trusted-ca-file CA (give the client certificate and key)",
        )
    } else if text.contains("invalid peer certificate") {
        Some(
            "this client does not trust etcd's certificate: it must be signed by the CA given \
             and name the endpoint's host",
        )
    } else {
        None
    }
}

/// An error's message followed by its causes', where they add something.
pub(crate) fn describe_error(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    append_causes(&mut text, error.source());
    text
}

fn append_causes(text: &mut String, mut cause: Option<&(dyn std::error::Error + 'static)>) {
    while let Some(e) = cause {
        let more = e.to_string();
        if !text.contains(&more) {
            *text = format!("{text}: {more}");
        }
        cause = e.source();
    }
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
    fn tls_refusals_say_which_side_refused() {
        let refused = Error::from(tonic::Status::unknown(
            "transport error: connection error: received fatal alert: BadCertificate",
        ));
        assert!(
            refused
                .to_string()
                .contains("etcd refused this client's TLS certificate"),
            "{refused}"
        );
        let untrusted = Error::from(tonic::Status::unavailable(
            "invalid peer certificate: UnknownIssuer",
        ));
        assert!(
            untrusted
                .to_string()
                .contains("does not trust etcd's certificate"),
            "{untrusted}"
        );
        let plain = Error::from(tonic::Status::unavailable("tcp connect error"));
        assert_eq!(plain.to_string(), "tcp connect error (gRPC Unavailable)");
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
