//! Answers in OpenAI's shapes: a whole completion, or Server-Sent Events streaming it (text
//! coalesced every `stream_batching_interval_ms`, ending with `data: [DONE]`).

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, header};
use modelmux_llm::{FinishReason, GenerationEvent, GenerationStream, Usage};
use modelmux_serve::{Body, BodySender, Response};
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::errors::serve_error;
use crate::logprobs::Logprobs;
use crate::metrics::LlmMetrics;
use crate::params::Endpoint;
use crate::protocol::{UsageBody, unix_now};
use crate::tools::{CallSplitter, Function, ToolCall};

/// OpenAI's finish reason: `tool_calls` when the answer ended after making calls (an answer
/// cut at `max_tokens` says `length`, with the calls it completed).
fn finish_reason(reason: FinishReason, calls: &[ToolCall]) -> &'static str {
    if calls.is_empty() || reason == FinishReason::Length {
        reason.as_str()
    } else {
        "tool_calls"
    }
}

/// What every answer of one request repeats.
pub(crate) struct Answer {
    pub(crate) endpoint: Endpoint,
    /// `chatcmpl-<request id>` or `cmpl-<request id>`.
    pub(crate) id: String,
    /// The request id, for an error event after the stream began.
    request_id: String,
    /// `model` as the client wrote it.
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) include_usage: bool,
    /// The functions the answer may call (chat requests with active tools).
    pub(crate) functions: Option<Vec<Function>>,
    /// The tokenizer, when the request asked for log probabilities.
    pub(crate) logprobs: Option<Arc<modelmux_llm::TextTokenizer>>,
}

impl Answer {
    pub(crate) fn new(
        endpoint: Endpoint,
        request_id: &str,
        model: String,
        include_usage: bool,
    ) -> Self {
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Completion => "cmpl",
        };
        Self {
            endpoint,
            id: format!("{prefix}-{request_id}"),
            request_id: request_id.to_string(),
            model,
            created: unix_now(),
            include_usage,
            functions: None,
            logprobs: None,
        }
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// The whole answer; a chat answer's calls (if tools are on) read out of `text`.
    pub(crate) fn complete(
        &self,
        text: String,
        reason: FinishReason,
        usage: Usage,
        logprobs: Option<&mut Logprobs>,
    ) -> Value {
        let logprobs = logprobs.map_or(Value::Null, |l| l.take(self.endpoint));
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let (content, calls) = match &self.functions {
                    Some(functions) => {
                        let mut splitter = CallSplitter::new(functions);
                        let mut content = splitter.push(&text);
                        let (rest, calls) = splitter.finish();
                        content.push_str(&rest);
                        (content, calls)
                    }
                    None => (text, Vec::new()),
                };
                let mut message = json!({"role": "assistant", "content": content});
                if !calls.is_empty() {
                    if content.trim().is_empty() {
                        message["content"] = Value::Null;
                    }
                    message["tool_calls"] = self.tool_calls(&calls);
                }
                json!({
                    "index": 0,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(reason, &calls),
                })
            }
            Endpoint::Completion => json!({
                "index": 0,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": reason.as_str(),
            }),
        };
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": UsageBody::from(usage),
        })
    }

    fn tool_calls(&self, calls: &[ToolCall]) -> Value {
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| c.to_json(i, &self.request_id))
            .collect()
    }

    /// The chunk that streams an answer's calls: each call whole, with its index.
    fn calls_chunk(&self, calls: &[ToolCall], first: bool) -> Value {
        let mut chunk = self.chunk(None, first, None);
        let deltas: Vec<Value> = calls
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut delta = c.to_json(i, &self.request_id);
                delta["index"] = i.into();
                delta
            })
            .collect();
        chunk["choices"][0]["delta"]["tool_calls"] = deltas.into();
        chunk
    }

    /// One streamed chunk: `text` (and the assistant's role on a chat's first chunk), or the
    /// finish reason.
    fn chunk(&self, text: Option<&str>, first: bool, reason: Option<&str>) -> Value {
        let choice = match self.endpoint {
            Endpoint::Chat => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if let Some(t) = text {
                    delta.insert("content".into(), t.into());
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
            }
            Endpoint::Completion => {
                json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": reason})
            }
        };
        let mut chunk = json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        });
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk
    }

    fn usage_chunk(&self, usage: Usage) -> Value {
        json!({
            "id": self.id,
            "object": self.object(true),
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": UsageBody::from(usage),
        })
    }
}

/// Timing of one sequence for the latency metrics.
pub(crate) struct Timing {
    pub(crate) started: Instant,
    pub(crate) first: Option<Instant>,
    pub(crate) metrics: Arc<LlmMetrics>,
}

impl Timing {
    fn token(&mut self) {
        if self.first.is_none() {
            let now = Instant::now();
            self.first = Some(now);
            self.metrics.first_token(now - self.started);
        }
    }

    fn finished(&self, reason: FinishReason, usage: Usage) {
        let decoding = self.first.map_or(Duration::ZERO, |f| f.elapsed());
        self.metrics.finished(
            reason,
            usage.completion_tokens,
            decoding,
            self.started.elapsed(),
        );
    }
}

/// Waits for the whole generation and answers it as one JSON document.
pub(crate) async fn whole(
    answer: Answer,
    mut stream: GenerationStream,
    mut timing: Timing,
) -> Result<Response, modelmux_serve::ServeError> {
    let mut text = String::new();
    let mut logprobs = answer.logprobs.clone().map(Logprobs::new);
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token {
                id,
                text: t,
                logprob,
            } => {
                timing.token();
                text.push_str(&t);
                if let (Some(l), Some(lp)) = (&mut logprobs, logprob) {
                    l.push(id, lp);
                }
            }
            GenerationEvent::Finished {
                reason,
                rest,
                usage,
            } => {
                text.push_str(&rest);
                timing.finished(reason, usage);
                return Ok(modelmux_serve::json_response(&answer.complete(
                    text,
                    reason,
                    usage,
                    logprobs.as_mut(),
                )));
            }
            GenerationEvent::Error(e) => return Err(serve_error(&e)),
        }
    }
    Err(serve_error(&modelmux_llm::LlmError::EngineStopped(
        "the engine ended the sequence without finishing it".into(),
    )))
}

fn event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// Streams the generation as Server-Sent Events. The body is fed by a task that ends (and
/// drops the stream, which cancels the sequence) when the client goes away.
pub(crate) fn streamed(
    answer: Answer,
    stream: GenerationStream,
    timing: Timing,
    interval: Duration,
) -> Response {
    let (tx, body) = Body::channel(16);
    let span = tracing::Span::current();
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            if let Err(gone) = feed(&tx, &answer, stream, timing, interval).await {
                tracing::info!(id = %answer.id, "stream ended early: {gone}");
            }
        },
        span,
    ));
    let mut response = Response::new(body);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}

async fn feed(
    tx: &BodySender,
    answer: &Answer,
    mut stream: GenerationStream,
    mut timing: Timing,
    interval: Duration,
) -> Result<(), modelmux_serve::BoxError> {
    let mut first = true;
    // Whether any text went out yet: the first goes at once, however it was split into tokens
    // (a first token that decodes to no text, half a character say, does not make the next
    // text wait for the interval).
    let mut text_sent = false;
    let mut pending = String::new();
    // When the text gathered so far must go out; none while nothing waits.
    let mut deadline: Option<Instant> = None;
    // With tools on, text goes through the splitter, which holds back calls.
    let mut splitter = answer.functions.as_deref().map(CallSplitter::new);
    let mut logprobs = answer.logprobs.clone().map(Logprobs::new);
    if answer.endpoint == Endpoint::Chat {
        tx.send(event(&answer.chunk(Some(""), true, None))).await?;
        first = false;
    }
    loop {
        let next = match deadline {
            Some(at) => match tokio::time::timeout_at(at, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    tx.send(event(&text_chunk(answer, &pending, first, &mut logprobs)))
                        .await?;
                    pending.clear();
                    first = false;
                    deadline = None;
                    continue;
                }
            },
            None => stream.next().await,
        };
        match next {
            Some(GenerationEvent::Token { id, text, logprob }) => {
                timing.token();
                if let (Some(l), Some(lp)) = (&mut logprobs, logprob) {
                    l.push(id, lp);
                }
                match &mut splitter {
                    Some(s) => pending.push_str(&s.push(&text)),
                    None => pending.push_str(&text),
                }
                if pending.is_empty() {
                    continue;
                }
                // The first text goes out at once (time to first token is not coalesced).
                if !text_sent || interval.is_zero() {
                    tx.send(event(&text_chunk(answer, &pending, first, &mut logprobs)))
                        .await?;
                    pending.clear();
                    first = false;
                    text_sent = true;
                } else if deadline.is_none() {
                    deadline = Some(Instant::now() + interval);
                }
            }
            Some(GenerationEvent::Finished {
                reason,
                rest,
                usage,
            }) => {
                let calls = match splitter.take() {
                    Some(mut s) => {
                        pending.push_str(&s.push(&rest));
                        let (held, calls) = s.finish();
                        pending.push_str(&held);
                        calls
                    }
                    None => {
                        pending.push_str(&rest);
                        Vec::new()
                    }
                };
                timing.finished(reason, usage);
                if !pending.is_empty() {
                    tx.send(event(&text_chunk(answer, &pending, first, &mut logprobs)))
                        .await?;
                    first = false;
                }
                if !calls.is_empty() {
                    tx.send(event(&answer.calls_chunk(&calls, first))).await?;
                    first = false;
                }
                let reason = finish_reason(reason, &calls);
                let mut last = answer.chunk(None, first, Some(reason));
                // Tokens whose text was held back to the end (a final stop token, say).
                if let Some(l) = logprobs.as_mut().filter(|l| !l.is_empty()) {
                    last["choices"][0]["logprobs"] = l.take(answer.endpoint);
                }
                tx.send(event(&last)).await?;
                if answer.include_usage {
                    tx.send(event(&answer.usage_chunk(usage))).await?;
                }
                tx.send("data: [DONE]\n\n").await?;
                return Ok(());
            }
            Some(GenerationEvent::Error(e)) => {
                return fail(tx, answer, &serve_error(&e)).await;
            }
            None => {
                let e = serve_error(&modelmux_llm::LlmError::EngineStopped(
                    "the engine ended the sequence without finishing it".into(),
                ));
                return fail(tx, answer, &e).await;
            }
        }
    }
}

/// A streamed chunk of `text`, with the log probabilities of the tokens since the last one.
fn text_chunk(answer: &Answer, text: &str, first: bool, logprobs: &mut Option<Logprobs>) -> Value {
    let mut chunk = answer.chunk(Some(text), first, None);
    if let Some(l) = logprobs.as_mut().filter(|l| !l.is_empty()) {
        chunk["choices"][0]["logprobs"] = l.take(answer.endpoint);
    }
    chunk
}

/// An error after the stream began: one `error` event (the status cannot change any more),
/// then the end.
async fn fail(
    tx: &BodySender,
    answer: &Answer,
    e: &modelmux_serve::ServeError,
) -> Result<(), modelmux_serve::BoxError> {
    tx.send(event(&e.body(Some(&answer.request_id)))).await?;
    tx.send("data: [DONE]\n\n").await?;
    Err(e.to_string().into())
}
