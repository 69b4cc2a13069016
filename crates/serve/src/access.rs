//! What the admin API owns and who may use it: its paths (`/-/...`, `/metrics`, `/health`,
//! which no application's route prefix may take) and [`AdminAccess`] (a bearer token, or,
//! without one, loopback only, JSON for calls that change state, and a Host check against DNS
//! rebinding). A server holding a token proves it to a client that sends a nonce
//! ([`AdminAccess::prove`], `identity.rs`).

use http::header;

use crate::ServeError;
use crate::error::StartError;

/// Whether the admin API, not an application, answers `path`: `/-/...`, `/metrics` and
/// `/health`.
pub fn is_admin_path(path: &str) -> bool {
    path == "/metrics" || path == "/health" || path.starts_with("/-/")
}

/// Whether an application's route prefix would take paths of the admin API (`/-...`,
/// `/metrics`, `/health`), which answers them first.
pub fn is_reserved_route_prefix(prefix: &str) -> bool {
    prefix.starts_with("/-")
        || prefix == "/metrics"
        || prefix.starts_with("/metrics/")
        || prefix == "/health"
}

/// Who may use the admin API.
#[derive(Debug, Clone, Default)]
#[non_exhaustive]
pub struct AdminAccess {
    /// The bearer token the admin API requires, if any.
    pub token: Option<String>,
    /// Whether a server listening beyond loopback may run without a token.
    pub allow_open: bool,
    /// Host names the admin API answers to besides IP addresses and `localhost`.
    pub allowed_hosts: Vec<String>,
    /// Whether `token` was made for this server alone (`modelmux serve` without a configured
    /// token writes one to a file only its user can read), not configured: it guards the
    /// admin API, but handle calls to other nodes of a cluster never carry it, and the
    /// handle-call endpoint answers as a server without a token does.
    pub token_is_local: bool,
}

impl AdminAccess {
    /// Access with this bearer token required.
    pub fn with_token(token: impl Into<String>) -> Self {
        Self {
            token: Some(token.into()),
            ..Self::default()
        }
    }

    /// The token every node of a cluster shares: the configured one (never a local one).
    pub fn shared_token(&self) -> Option<&str> {
        self.token.as_deref().filter(|_| !self.token_is_local)
    }

    /// The value of [`PROOF_HEADER`](crate::PROOF_HEADER) answering the nonce a request
    /// carries in [`NONCE_HEADER`](crate::NONCE_HEADER): proves that this server holds the
    /// token without revealing it. None without a token or a valid nonce.
    pub fn prove(&self, headers: &http::HeaderMap) -> Option<http::HeaderValue> {
        let token = self.token.as_deref()?;
        let nonce = headers.get(crate::NONCE_HEADER)?;
        if !crate::identity::valid_nonce(nonce.as_bytes()) {
            return None;
        }
        let proof = crate::identity_proof(token, nonce.to_str().ok()?);
        http::HeaderValue::from_str(&proof).ok()
    }

    /// Refuses a tokenless admin API on a non-loopback address unless allowed (checked when
    /// a server starts).
    pub fn check_exposure(&self, bind: std::net::SocketAddr) -> Result<(), StartError> {
        if self.token.is_none() && !bind.ip().is_loopback() && !self.allow_open {
            return Err(StartError::OpenAdmin { addr: bind });
        }
        Ok(())
    }

    /// Checks a request to an admin endpoint by its headers; `changes_state` for loads,
    /// evictions and controls. Applications with admin endpoints of their own (the OpenAI
    /// ingress's adapter controls) call it too.
    pub fn authorize(
        &self,
        headers: &http::HeaderMap,
        changes_state: bool,
    ) -> Result<(), ServeError> {
        if let Some(token) = &self.token {
            return if crate::bearer_token_matches(headers, token) {
                Ok(())
            } else {
                Err(ServeError::Unauthorized)
            };
        }
        self.check_host(headers)?;
        if changes_state && !is_json(headers) {
            return Err(ServeError::UnsupportedMediaType {
                message: "admin calls that change state need 'Content-Type: application/json' \
                          (or the admin token): a plain cross-site POST must not reach them"
                    .into(),
            });
        }
        Ok(())
    }

    /// An IP literal, `localhost` (or a name under it), or an allowed host; a request with no
    /// `Host` (HTTP/1.0) passes, since browsers always send one.
    fn check_host(&self, headers: &http::HeaderMap) -> Result<(), ServeError> {
        let mut hosts = headers.get_all(header::HOST).iter();
        let Some(host) = hosts.next() else {
            return Ok(());
        };
        if hosts.next().is_some() {
            return Err(ServeError::BadRequest {
                message: "the request has more than one Host header".into(),
            });
        }
        let host = host.to_str().unwrap_or_default().to_ascii_lowercase();
        let name = strip_port(&host);
        let allowed = name.parse::<std::net::IpAddr>().is_ok()
            || name == "localhost"
            || name.ends_with(".localhost")
            || self
                .allowed_hosts
                .iter()
                .any(|a| a.eq_ignore_ascii_case(&host) || a.eq_ignore_ascii_case(name));
        if allowed {
            Ok(())
        } else {
            Err(ServeError::Forbidden {
                message: "the admin API does not answer to this Host; add it to \
                          http_options.allowed_hosts or use an IP address"
                    .into(),
            })
        }
    }
}

/// `example.com:8000` → `example.com`; `[::1]:8000` → `::1`.
fn strip_port(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|mime| {
            let mime = mime.trim();
            mime.eq_ignore_ascii_case("application/json")
                || (mime.len() > 5 && mime[mime.len() - 5..].eq_ignore_ascii_case("+json"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hosts_are_stripped_of_their_port() {
        assert_eq!(strip_port("example.com:8000"), "example.com");
        assert_eq!(strip_port("[::1]:8000"), "::1");
        assert_eq!(strip_port("127.0.0.1"), "127.0.0.1");
    }

    #[test]
    fn json_content_types() {
        let mut h = http::HeaderMap::new();
        assert!(!is_json(&h));
        for (value, json) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/merge-patch+json", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
            ("multipart/form-data; boundary=x", false),
        ] {
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
            assert_eq!(is_json(&h), json, "{value}");
        }
    }
}
