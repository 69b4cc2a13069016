//! The serve layer's one error type, and the one place errors become HTTP responses.

use std::net::SocketAddr;
use std::time::Duration;

use http::{HeaderValue, StatusCode, header};
use modelmux_cache::{BoxError, ErrorKind, Failure, InvalidModelId};

use crate::{Body, Response};

/// Everything that can go wrong between a request arriving and a response leaving.
///
/// Runtimes and deployments say what went wrong with a [`Failure`] of an [`ErrorKind`] (or
/// one of these, boxed); any other error from a deployment is a 500 that says what failed.
/// Errors from the model cache (`modelmux_cache::Error`) keep their meaning: a model that is
/// backing off or a replica without room is a 503 with `Retry-After`, a load that timed out a
/// 504, a failed load the kind its loader gave. Statuses are chosen here and nowhere else.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// No application serves this path.
    #[error("no application serves the path '{path}'")]
    NoRoute {
        /// The request's path.
        path: String,
    },
    /// An API has no endpoint at this path: 404 with the request's path and the endpoints the
    /// API has, both echoed as they are (neither is a server's file path).
    #[error("no endpoint {path}: {endpoints}")]
    UnknownEndpoint {
        /// The request's path.
        path: String,
        /// What the API serves instead.
        endpoints: String,
    },
    /// The request is malformed.
    #[error("{message}")]
    BadRequest {
        /// What is wrong with it.
        message: String,
    },
    /// One parameter of the request is wrong (OpenAI's `param`).
    #[error("{message}")]
    InvalidParameter {
        /// The parameter, as the request names it (`max_tokens`, `messages[2].content`).
        param: String,
        /// What is wrong with it.
        message: String,
    },
    /// The model id header is not a valid model id.
    #[error("invalid serve_multiplexed_model_id: {0}")]
    InvalidModelId(#[from] InvalidModelId),
    /// The body is longer than `max_body_bytes`.
    #[error("request body is larger than the limit of {limit} bytes")]
    PayloadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// The body did not arrive within `body_read_timeout`.
    #[error("the request body did not arrive within {limit:?}")]
    BodyReadTimeout {
        /// The limit.
        limit: Duration,
    },
    /// The request took longer than `request_timeout`; its work was cancelled.
    #[error("the request took longer than the server's request timeout of {limit:?}")]
    RequestTimeout {
        /// The limit.
        limit: Duration,
    },
    /// The front door is at one of its limits (requests or body bytes in progress).
    #[error("{message}")]
    ServerOverloaded {
        /// Which limit.
        message: String,
    },
    /// Every replica is busy and the queue is full.
    #[error(
        "deployment '{deployment}' is overloaded: all replicas are busy and {queued} requests are queued"
    )]
    Overloaded {
        /// The deployment.
        deployment: String,
        /// Requests waiting when this one was refused.
        queued: usize,
    },
    /// The request waited in the queue for longer than the queue timeout.
    #[error("deployment '{deployment}' had no free replica within {waited:?}")]
    QueueTimeout {
        /// The deployment.
        deployment: String,
        /// How long it waited.
        waited: Duration,
    },
    /// A handle named a deployment that does not exist.
    #[error("no deployment named '{name}'")]
    UnknownDeployment {
        /// The name asked for.
        name: String,
    },
    /// The admin API needs a bearer token and the request had none, or the wrong one.
    #[error(
        "this endpoint needs 'Authorization: Bearer <admin token>' (a server started without \
         http_options.admin_token made one for its account: `modelmux token` prints it)"
    )]
    Unauthorized,
    /// An admin or API resource does not exist.
    #[error("{what}")]
    NotFound {
        /// What was not found.
        what: String,
    },
    /// The model cache refused or failed.
    #[error(transparent)]
    Model(#[from] modelmux_cache::Error),
    /// The deployment returned an error.
    #[error("deployment '{deployment}' failed: {message}")]
    Deployment {
        /// The deployment.
        deployment: String,
        /// Its error.
        message: String,
    },
    /// The deployment panicked while handling the request. The replica keeps serving.
    #[error("deployment '{deployment}' panicked while handling the request: {message}")]
    Panicked {
        /// The deployment.
        deployment: String,
        /// The panic's message.
        message: String,
    },
    /// The server is shutting down.
    #[error("the server is shutting down")]
    ShuttingDown,
    /// A request another node forwarded here cannot be served here (no replica of its
    /// deployment, or shutting down): the forwarding node sends it elsewhere.
    #[error("not served here: {reason}")]
    NotHere {
        /// Why.
        reason: String,
    },
    /// Forwarding the request to the node that was to serve it failed.
    #[error(transparent)]
    Forward(#[from] crate::remote::ForwardError),
    /// The admin API does not answer to this request's `Host`.
    #[error("{message}")]
    Forbidden {
        /// Why.
        message: String,
    },
    /// The path exists but not with this method.
    #[error("{message}")]
    MethodNotAllowed {
        /// The methods the path takes.
        message: String,
    },
    /// The endpoint (or control) exists in the API this server follows, but this server does
    /// not implement it: 501, naming it.
    #[error("{what} is not implemented by this server")]
    NotImplemented {
        /// What was asked for.
        what: String,
    },
    /// The request's content type is not one this endpoint takes.
    #[error("{message}")]
    UnsupportedMediaType {
        /// The content type needed.
        message: String,
    },
    /// A runtime's (or a deployment's) failure of a known [`ErrorKind`]: an unknown model, a
    /// bad input, no room now, failed storage.
    #[error(transparent)]
    Failed(#[from] Failure),
}

/// The status a loader chose by failing with a [`ServeError`] itself (a deployment's own
/// loader may), also while that failure backs off.
fn loader_status(error: &modelmux_cache::Error) -> Option<StatusCode> {
    use modelmux_cache::Error as M;
    match error {
        M::LoadFailed { source, .. } => source
            .downcast_ref::<ServeError>()
            .map(ServeError::http_status),
        M::BackingOff { cause, .. } => loader_status(cause),
        _ => None,
    }
}

/// The status of each [`ErrorKind`]: the one place a kind becomes HTTP.
fn status_of(kind: ErrorKind) -> StatusCode {
    match kind {
        ErrorKind::NotFound => StatusCode::NOT_FOUND,
        ErrorKind::InvalidInput => StatusCode::BAD_REQUEST,
        ErrorKind::Forbidden => StatusCode::FORBIDDEN,
        ErrorKind::UnusableModel => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorKind::Overloaded | ErrorKind::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        ErrorKind::Upstream => StatusCode::BAD_GATEWAY,
        ErrorKind::Timeout => StatusCode::GATEWAY_TIMEOUT,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// An error response's [`ServeError::error_type`], kept on the response for the access line.
#[derive(Clone, Copy, Debug)]
pub struct ErrorType(pub &'static str);

impl ServeError {
    /// Turns a deployment's error into a `ServeError`, keeping a typed one as it is.
    pub fn from_deployment(deployment: &str, error: BoxError) -> Self {
        let error = match error.downcast::<ServeError>() {
            Ok(e) => return *e,
            Err(e) => e,
        };
        let error = match error.downcast::<Failure>() {
            Ok(f) => return Self::Failed(*f),
            Err(e) => e,
        };
        match error.downcast::<modelmux_cache::Error>() {
            Ok(e) => Self::Model(*e),
            Err(e) => Self::Deployment {
                deployment: deployment.to_string(),
                message: e.to_string(),
            },
        }
    }

    /// The HTTP status this error is answered with.
    pub fn http_status(&self) -> StatusCode {
        match self {
            Self::NoRoute { .. } | Self::NotFound { .. } | Self::UnknownEndpoint { .. } => {
                StatusCode::NOT_FOUND
            }
            Self::BadRequest { .. } | Self::InvalidParameter { .. } | Self::InvalidModelId(_) => {
                StatusCode::BAD_REQUEST
            }
            Self::PayloadTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Self::BodyReadTimeout { .. } => StatusCode::REQUEST_TIMEOUT,
            Self::RequestTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::ServerOverloaded { .. }
            | Self::Overloaded { .. }
            | Self::QueueTimeout { .. }
            | Self::ShuttingDown
            | Self::NotHere { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Forward(crate::remote::ForwardError::Failed { .. }) => StatusCode::BAD_GATEWAY,
            Self::Forward(_) => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => StatusCode::FORBIDDEN,
            Self::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotImplemented { .. } => StatusCode::NOT_IMPLEMENTED,
            Self::UnsupportedMediaType { .. } => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Self::UnknownDeployment { .. } | Self::Deployment { .. } | Self::Panicked { .. } => {
                StatusCode::INTERNAL_SERVER_ERROR
            }
            Self::Model(e) => loader_status(e).unwrap_or_else(|| status_of(e.kind())),
            Self::Failed(f) => status_of(f.kind()),
        }
    }

    /// A short, stable name for metrics labels and the JSON body's `type`.
    pub fn error_type(&self) -> &'static str {
        use modelmux_cache::Error as M;
        match self {
            Self::NoRoute { .. } => "no_route",
            Self::BadRequest { .. } => "bad_request",
            Self::InvalidParameter { .. } => "invalid_parameter",
            Self::InvalidModelId(_) => "invalid_model_id",
            Self::PayloadTooLarge { .. } => "payload_too_large",
            Self::Overloaded { .. } => "overloaded",
            Self::ServerOverloaded { .. } => "server_overloaded",
            Self::BodyReadTimeout { .. } => "body_read_timeout",
            Self::RequestTimeout { .. } => "request_timeout",
            Self::QueueTimeout { .. } => "queue_timeout",
            Self::UnknownDeployment { .. } => "unknown_deployment",
            Self::Unauthorized => "unauthorized",
            Self::NotFound { .. } | Self::UnknownEndpoint { .. } => "not_found",
            // A failed load says what its loader said (an unknown model, a broken one).
            Self::Model(e) => match (self.http_status(), e) {
                (StatusCode::NOT_FOUND, _) => "model_not_found",
                (status, M::LoadFailed { .. } | M::BackingOff { .. })
                    if status.is_client_error() =>
                {
                    "bad_model_request"
                }
                _ => e.error_type(),
            },
            Self::Failed(f) => f.kind().as_str(),
            Self::Forbidden { .. } => "forbidden",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::NotImplemented { .. } => "not_implemented",
            Self::UnsupportedMediaType { .. } => "unsupported_media_type",
            Self::Deployment { .. } => "deployment_error",
            Self::Panicked { .. } => "deployment_panicked",
            Self::ShuttingDown => "shutting_down",
            Self::NotHere { .. } => "not_here",
            Self::Forward(e) => match e {
                crate::remote::ForwardError::NotSent { .. } => "node_unreachable",
                crate::remote::ForwardError::NotHere { .. } => "node_refused",
                crate::remote::ForwardError::Failed { .. } => "forward_failed",
            },
        }
    }

    /// How long a client should wait before trying again, for `Retry-After`.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::Overloaded { .. }
            | Self::ServerOverloaded { .. }
            | Self::QueueTimeout { .. }
            | Self::ShuttingDown
            | Self::NotHere { .. } => Some(Duration::from_secs(1)),
            Self::Forward(e) if !matches!(e, crate::remote::ForwardError::Failed { .. }) => {
                Some(Duration::from_secs(1))
            }
            Self::Model(e) => e.retry_after().or_else(|| {
                (self.http_status() == StatusCode::SERVICE_UNAVAILABLE)
                    .then_some(Duration::from_secs(1))
            }),
            Self::Failed(f) => f.retry_after().or_else(|| {
                matches!(f.kind(), ErrorKind::Overloaded | ErrorKind::Unavailable)
                    .then_some(Duration::from_secs(1))
            }),
            _ => None,
        }
    }

    /// The parameter at fault, if one is.
    pub fn param(&self) -> Option<&str> {
        match self {
            Self::InvalidParameter { param, .. } => Some(param),
            Self::InvalidModelId(_) => Some("serve_multiplexed_model_id"),
            _ => None,
        }
    }

    /// The JSON body of this error, shaped as OpenAI's API shapes errors, plus the request id:
    /// `{"error": {"message", "type", "param", "code", "request_id"}}` (`code` is the status).
    pub fn body(&self, request_id: Option<&str>) -> serde_json::Value {
        // The request's own path is echoed as it came; everything else may carry a server's
        // paths or a URL's secrets (from a loader, a store, a runtime).
        let message = match self {
            Self::NoRoute { .. } | Self::UnknownEndpoint { .. } | Self::NotImplemented { .. } => {
                self.to_string()
            }
            _ => crate::redact::redact(&self.to_string()),
        };
        serde_json::json!({
            "error": {
                "message": message,
                "type": self.error_type(),
                "param": self.param(),
                "code": self.http_status().as_u16(),
                "request_id": request_id,
            }
        })
    }

    /// The response: the status, `Retry-After` when there is one, and [`body`](Self::body)
    /// (and the error's type as an extension, for the access line).
    pub fn into_response(self, request_id: Option<&str>) -> Response {
        let status = self.http_status();
        let body = self.body(request_id);
        let mut response = Response::new(Body::json(&body));
        *response.status_mut() = status;
        response
            .extensions_mut()
            .insert(ErrorType(self.error_type()));
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(after) = self.retry_after() {
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if matches!(self, Self::NotHere { .. }) {
            headers.insert(
                crate::remote::NOT_HERE_HEADER,
                HeaderValue::from_static("1"),
            );
        }
        response
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_errors_from_deployments_keep_their_status() {
        let e = ServeError::from_deployment("d", Box::new(Failure::not_found("no such model")));
        assert_eq!(e.http_status(), StatusCode::NOT_FOUND);
        let cache = modelmux_cache::Error::LoadTimeout {
            id: modelmux_cache::ModelId::new("m").unwrap(),
            after: Duration::from_secs(1),
        };
        let e = ServeError::from_deployment("d", Box::new(cache));
        assert_eq!(e.http_status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(e.error_type(), "load_timeout");
        let e = ServeError::from_deployment("d", "plain failure".into());
        assert_eq!(e.http_status(), StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(e.to_string(), "deployment 'd' failed: plain failure");
    }

    #[test]
    fn failed_loads_answer_with_their_loaders_kind_and_back_off_with_503() {
        use modelmux_cache::{Error as M, ModelId};
        use std::sync::Arc;
        let id = ModelId::new("m").unwrap();
        let failed = |source: BoxError| M::LoadFailed {
            id: id.clone(),
            source: Arc::from(source),
        };
        let backing_off = |cause: M| M::BackingOff {
            id: id.clone(),
            retry_after: Duration::from_secs(7),
            cause: Arc::new(cause),
        };
        let answer = |e: M| {
            let e = ServeError::Model(e);
            (e.http_status().as_u16(), e.error_type(), e.retry_after())
        };
        let missing = || failed(Box::new(Failure::not_found("no such model")));
        let plain = || failed("disk on fire".into());
        assert_eq!(answer(missing()), (404, "model_not_found", None));
        assert_eq!(
            answer(backing_off(missing())),
            (404, "model_not_found", Some(Duration::from_secs(7)))
        );
        assert_eq!(answer(plain()), (500, "load_failed", None));
        // A server-side failure being backed off is "try later", not a 500.
        assert_eq!(
            answer(backing_off(plain())),
            (503, "backing_off", Some(Duration::from_secs(7)))
        );
        // A loader that fails with a status of its own keeps it.
        let chosen = failed(Box::new(ServeError::NotFound {
            what: "no such model".into(),
        }));
        assert_eq!(answer(chosen), (404, "model_not_found", None));
        let full = failed(Box::new(Failure::overloaded(
            "disk cache full",
            Duration::ZERO,
        )));
        assert_eq!(
            answer(full),
            (503, "load_failed", Some(Duration::from_secs(1))),
            "a 503 always says when to retry"
        );
    }

    #[test]
    fn error_bodies_do_not_reveal_local_paths_or_url_secrets() {
        let e = ServeError::from_deployment(
            "d",
            "cannot read /home/alice/models/acme/model.onnx from https://k:s3cr3t@store.example/x?sig=abc"
                .into(),
        );
        let body = e.body(None).to_string();
        assert!(!body.contains("/home/alice"), "{body}");
        assert!(
            !body.contains("s3cr3t") && !body.contains("sig=abc"),
            "{body}"
        );
        assert!(body.contains("…/model.onnx"), "{body}");
        // The log keeps it all.
        assert!(e.to_string().contains("/home/alice/models/acme/model.onnx"));
        let route = ServeError::NoRoute {
            path: "/api/v1/x".into(),
        };
        assert!(route.body(None).to_string().contains("/api/v1/x"));
    }

    #[test]
    fn overload_answers_503_with_retry_after_and_a_json_body() {
        let r = ServeError::Overloaded {
            deployment: "d".into(),
            queued: 3,
        }
        .into_response(Some("req-1"));
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(r.headers()[header::RETRY_AFTER], "1");
        let body: serde_json::Value = serde_json::from_slice(r.body().as_full().unwrap()).unwrap();
        assert_eq!(body["error"]["type"], "overloaded");
        assert_eq!(body["error"]["request_id"], "req-1");
        assert_eq!(body["error"]["code"], 503);
        assert!(body["error"]["param"].is_null());
        let r = ServeError::InvalidParameter {
            param: "max_tokens".into(),
            message: "max_tokens must be at least 1".into(),
        }
        .into_response(None);
        assert_eq!(r.status(), StatusCode::BAD_REQUEST);
        let body: serde_json::Value = serde_json::from_slice(r.body().as_full().unwrap()).unwrap();
        assert_eq!(body["error"]["param"], "max_tokens");
        assert_eq!(body["error"]["type"], "invalid_parameter");
    }
}
/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StartError {
    /// The applications are not consistent (a name or prefix twice, no deployment, ...).
    #[error("invalid application '{app}': {message}")]
    InvalidApplication {
        /// The application.
        app: String,
        /// What is wrong.
        message: String,
    },
    /// A replica's constructor failed.
    #[error("replica of deployment '{deployment}' failed to start: {source}")]
    Replica {
        /// The deployment.
        deployment: String,
        /// The constructor's error.
        source: BoxError,
    },
    /// A server setting is out of range.
    #[error("invalid http options: {message}")]
    InvalidConfig {
        /// What is wrong.
        message: String,
    },
    /// The server would listen beyond this machine with an admin API anyone could use.
    #[error(
        "refusing to listen on {addr} without an admin token: anyone who can reach it could \
         load, pin and evict models. Set an admin token, or allow an open admin API explicitly \
         (http_options.allow_open_admin: true) if every client is trusted"
    )]
    OpenAdmin {
        /// The address.
        addr: SocketAddr,
    },
    /// The listening socket could not be opened.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}
