//! Anthropic's Messages API over the same engine path: `POST /v1/messages` becomes the chat
//! request it is (one parse, in [`request`]), the LLM deployment answers it as a chat, and
//! the answer comes back in Anthropic's shape, whole or as its event stream ([`stream`]).
//! `POST /v1/messages/count_tokens` is the `/tokenize` of the same conversation and tools.
//! Errors are answered in Anthropic's shape (`{"type": "error", "error": {"type", "message"}}`)
//! with the status, `Retry-After` and error type the OpenAI shape would have had.

mod request;
mod stream;

use bytes::Bytes;
use http::StatusCode;
use modelmux_serve::{Body, Response, ServeError, json_response};
use serde_json::{Value, json};

use crate::call::{LlmCall, Op};
use crate::chat_reply::{ChatEvents, ChatReply, Finish, ReplyCall, Tokens};
use crate::ingress::OpenAiIngress;
use crate::params::{Endpoint, parse_tokenize};

/// Anthropic's name for an error of `status` (and, for 503, of `kind`).
fn error_type(status: StatusCode, kind: &str) -> &'static str {
    match status.as_u16() {
        400 | 405 | 415 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 if kind.contains("overloaded") || kind == "queue_timeout" => "overloaded_error",
        _ => "api_error",
    }
}

/// An OpenAI-shaped error body (`{"error": {"message", "type", ...}}`) in Anthropic's shape.
fn anthropic_body(status: StatusCode, openai: &Value) -> Value {
    let error = &openai["error"];
    let kind = error["type"].as_str().unwrap_or_default();
    json!({
        "type": "error",
        "error": {
            "type": error_type(status, kind),
            "message": error["message"].as_str().unwrap_or("the request failed"),
        },
        "request_id": error["request_id"],
    })
}

/// `error` answered in Anthropic's shape, keeping its status, headers and extensions.
pub(crate) fn error_response(error: ServeError) -> Response {
    let id = modelmux_context::request_id();
    let body = anthropic_body(
        error.http_status(),
        &error.body(id.as_ref().map(|i| i.as_str())),
    );
    let mut response = error.into_response(id.as_ref().map(|i| i.as_str()));
    response.headers_mut().remove(http::header::CONTENT_LENGTH);
    *response.body_mut() = Body::json(&body);
    response
}

/// An error answer from the LLM deployment (OpenAI-shaped) in Anthropic's shape.
async fn reshaped_error(answer: Response) -> Response {
    let (mut parts, body) = answer.into_parts();
    let bytes = http_body_util::BodyExt::collect(body)
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let openai: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    parts.headers.remove(http::header::CONTENT_LENGTH);
    let body = anthropic_body(parts.status, &openai);
    Response::from_parts(parts, Body::json(&body))
}

/// Anthropic's `stop_reason` for how the chat ended.
fn stop_reason(finish: Finish) -> &'static str {
    match finish {
        Finish::Stop => "end_turn",
        Finish::Length => "max_tokens",
        Finish::ToolCalls => "tool_use",
    }
}

fn usage(tokens: Tokens) -> Value {
    json!({"input_tokens": tokens.prompt, "output_tokens": tokens.completion})
}

fn tool_use(call: &ReplyCall) -> Value {
    let input: Value = serde_json::from_str(&call.arguments).unwrap_or_else(|_| json!({}));
    json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input})
}

/// The message of a whole answer.
fn message(id: &str, model: &str, reply: &ChatReply) -> Value {
    let mut content = Vec::new();
    // Whitespace before calls is no text block (a streamed answer sends none either).
    if !reply.text.is_empty() && (reply.calls.is_empty() || !reply.text.trim().is_empty()) {
        content.push(json!({"type": "text", "text": reply.text}));
    }
    content.extend(reply.calls.iter().map(tool_use));
    json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(reply.finish),
        "stop_sequence": null,
        "usage": usage(reply.tokens),
    })
}

impl OpenAiIngress {
    /// `POST /v1/messages` and `POST /v1/messages/count_tokens`, answered in Anthropic's shape
    /// whatever happens.
    pub(crate) async fn anthropic(&self, op: Op, body: Bytes) -> Response {
        let answer = match op {
            Op::CountTokens => self.count_tokens(body).await,
            _ => self.messages(body).await,
        };
        match answer {
            Ok(a) if a.status().is_client_error() || a.status().is_server_error() => {
                reshaped_error(a).await
            }
            Ok(a) => a,
            Err(e) => error_response(e),
        }
    }

    async fn messages(&self, body: Bytes) -> Result<Response, ServeError> {
        let b = request::parse(&body, false)?;
        let (job, chat_body) = request::chat_job(&b)?;
        let adapter = self.adapter_for(&b.model)?;
        let stream = job.stream;
        let call = LlmCall::Generate(Endpoint::Chat, Box::new(job));
        let answer = self
            .forward(Op::Generate(Endpoint::Chat), chat_body, call, adapter)
            .await?;
        if !answer.status().is_success() {
            return Ok(answer);
        }
        let id = format!(
            "msg_{}",
            modelmux_context::request_id()
                .unwrap_or_else(modelmux_context::RequestId::generate)
                .as_str()
        );
        let (mut head, body) = crate::responses::split(answer);
        if stream {
            return Ok(stream::streamed(id, b.model, ChatEvents::new(body), head));
        }
        let reply = ChatReply::read(body).await?;
        *head.body_mut() = Body::json(&message(&id, &b.model, &reply));
        Ok(head)
    }

    async fn count_tokens(&self, body: Bytes) -> Result<Response, ServeError> {
        let b = request::parse(&body, true)?;
        // Checked as `/tokenize` checks it: the same conversation and tools.
        let tokenize = request::count_request(&b)?;
        self.adapter_for(&b.model)?;
        let (_, input) = parse_tokenize(&tokenize)?;
        let answer = self
            .forward(Op::Tokenize, tokenize, LlmCall::Tokenize(input), None)
            .await?;
        if !answer.status().is_success() {
            return Ok(answer);
        }
        let (_, body) = crate::responses::split(answer);
        let bytes = http_body_util::BodyExt::collect(body)
            .await
            .map_err(crate::chat_reply::unexpected)?
            .to_bytes();
        let counted: Value =
            serde_json::from_slice(&bytes).map_err(crate::chat_reply::unexpected)?;
        Ok(json_response(&json!({"input_tokens": counted["count"]})))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_take_anthropics_shape_and_names() {
        let e = ServeError::NotFound {
            what: "model 'x' is not served here".into(),
        };
        let body = anthropic_body(e.http_status(), &e.body(Some("r1")));
        assert_eq!(body["type"], "error");
        assert_eq!(body["error"]["type"], "not_found_error");
        assert_eq!(body["request_id"], "r1");
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("model 'x'")
        );
        assert_eq!(
            error_type(StatusCode::SERVICE_UNAVAILABLE, "server_overloaded"),
            "overloaded_error"
        );
        assert_eq!(
            error_type(StatusCode::BAD_REQUEST, "invalid_parameter"),
            "invalid_request_error"
        );
        let response = error_response(ServeError::ServerOverloaded {
            message: "busy".into(),
        });
        assert_eq!(response.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert!(response.headers().contains_key(http::header::RETRY_AFTER));
    }

    #[test]
    fn a_whole_answer_keeps_text_and_calls_in_order() {
        let reply = ChatReply {
            text: "\n".into(),
            calls: vec![ReplyCall {
                id: "call_0_r".into(),
                name: "weather".into(),
                arguments: r#"{"city":"Paris"}"#.into(),
            }],
            finish: Finish::ToolCalls,
            tokens: Tokens {
                prompt: 12,
                completion: 9,
            },
        };
        let m = message("msg_1", "base:pirate", &reply);
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["content"].as_array().unwrap().len(), 1, "{m}");
        assert_eq!(m["content"][0]["input"]["city"], "Paris");
        assert_eq!(m["usage"], json!({"input_tokens": 12, "output_tokens": 9}));
    }
}
