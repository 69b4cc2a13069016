//! The one place where the LLM runtime's errors become the serve layer's: each keeps its
//! [`ErrorKind`](modelmux_llm::ErrorKind), which the serve layer maps to a status; a context
//! overflow also names the parameter at fault.

use modelmux_cache::Failure;
use modelmux_llm::LlmError;
use modelmux_serve::ServeError;

use crate::params::invalid;

/// `error` as the serve layer answers it: by its kind (a request to change is a 400, an
/// adapter source outside `lora_config.allowed_sources` a 403 naming the rule, an adapter that
/// does not exist a 404 naming the repository searched, one that cannot be used a
/// 422, failed adapter storage a 502, an engine without room a 503 with `Retry-After`), with
/// `max_tokens` named when the prompt and the tokens asked for overflow the context.
pub(crate) fn serve_error(error: &LlmError) -> ServeError {
    match error {
        LlmError::ContextOverflow { .. } => invalid("max_tokens", error.to_string()),
        _ => ServeError::Failed(Failure::from(error)),
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
                LlmError::SourceNotAllowed {
                    adapter: "s3://other/x".into(),
                    reason: "it is not below any of its entries ['s3://b/team-a']".into(),
                },
                403,
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
        let e = serve_error(&LlmError::SourceNotAllowed {
            adapter: "s3://other/x".into(),
            reason: "the list is empty".into(),
        });
        assert_eq!(e.error_type(), "forbidden");
        let body = e.body(None);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.contains("lora_config.allowed_sources"), "{body}");
        assert!(message.contains("s3://other/x"), "{body}");
        let e = serve_error(&LlmError::Overloaded {
            reason: "KV full".into(),
            retry_after: std::time::Duration::from_secs(2),
        });
        assert_eq!(e.retry_after(), Some(std::time::Duration::from_secs(2)));
    }
}
