//! The one place where the LLM runtime's errors become HTTP answers.

use http::StatusCode;
use modelmux_llm::{ErrorKind, LlmError};
use modelmux_serve::ServeError;

use crate::params::invalid;

/// `error` as the serve layer answers it: 400 for a request to change (naming the parameter
/// when one is at fault), 404 for an adapter that does not exist (naming the repository
/// searched), 422 for an adapter that exists but cannot be used, 502 when the adapter storage
/// fails, 503 with `Retry-After` when the engine has no room, 500 for the rest.
pub(crate) fn serve_error(error: &LlmError) -> ServeError {
    let message = error.to_string();
    match (error.kind(), error) {
        (_, LlmError::ContextOverflow { .. }) => invalid("max_tokens", message),
        (ErrorKind::InvalidRequest, _) => ServeError::BadRequest { message },
        (ErrorKind::NotFound, _) => ServeError::NotFound { what: message },
        (ErrorKind::InvalidModel, _) => {
            ServeError::status(StatusCode::UNPROCESSABLE_ENTITY, message)
        }
        (ErrorKind::Storage, _) => ServeError::status(StatusCode::BAD_GATEWAY, message),
        (ErrorKind::Overloaded, LlmError::Overloaded { retry_after, .. }) => ServeError::Busy {
            message,
            retry_after: *retry_after,
        },
        (ErrorKind::Overloaded | ErrorKind::Unavailable, _) => ServeError::Busy {
            message,
            retry_after: std::time::Duration::from_secs(1),
        },
        (ErrorKind::Internal, _) => ServeError::status(StatusCode::INTERNAL_SERVER_ERROR, message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_has_its_status() {
        let cases = [
            (LlmError::InvalidRequest("x".into()), 400),
            (
                LlmError::ContextOverflow {
                    prompt_tokens: 10,
                    max_tokens: 5000,
                    context: 2048,
                },
                400,
            ),
            (
                LlmError::AdapterNotFound {
                    adapter: "a".into(),
                    repository: "s3://b/p".into(),
                },
                404,
            ),
            (
                LlmError::InvalidAdapter {
                    adapter: "a".into(),
                    message: "use_dora".into(),
                },
                422,
            ),
            (
                LlmError::Storage {
                    adapter: "a".into(),
                    message: "503 from S3".into(),
                },
                502,
            ),
            (
                LlmError::Overloaded {
                    reason: "KV full".into(),
                    retry_after: std::time::Duration::from_secs(2),
                },
                503,
            ),
            (LlmError::EngineStopped("gone".into()), 503),
            (LlmError::Internal("bug".into()), 500),
        ];
        for (error, status) in cases {
            let e = serve_error(&error);
            assert_eq!(e.http_status().as_u16(), status, "{error}");
        }
        let e = serve_error(&LlmError::AdapterNotFound {
            adapter: "a".into(),
            repository: "s3://b/p".into(),
        });
        assert!(e.to_string().contains("s3://b/p"), "{e}");
        let e = serve_error(&LlmError::Overloaded {
            reason: "KV full".into(),
            retry_after: std::time::Duration::from_secs(2),
        });
        assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(2)));
    }
}
