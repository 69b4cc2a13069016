//! Answers in OpenAI's shapes: the whole completion with every choice, and the chunks a
//! streamed answer is made of (`stream.rs` sends them).

use std::sync::Arc;
use std::time::Duration;

use modelmux_llm::{FinishReason, GenerationEvent, GenerationStream, Usage};
use modelmux_serve::Response;
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
pub(crate) fn finish_reason(reason: FinishReason, calls: &[ToolCall]) -> &'static str {
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
    pub(crate) request_id: String,
    /// `model` as the client wrote it.
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) include_usage: bool,
    /// The functions the answer may call (chat requests with active tools).
    pub(crate) functions: Option<Vec<Function>>,
    /// The tokenizer, when the request asked for log probabilities.
    pub(crate) logprobs: Option<Arc<modelmux_llm::TextTokenizer>>,
    /// Completions' `echo`: the prompt each choice starts with.
    pub(crate) echo: Option<Arc<Echo>>,
    /// Choices per prompt (`n`): of a batch's choices, each run of this many shares a
    /// prompt, whose tokens the usage counts once.
    pub(crate) choices_per_prompt: usize,
}

/// The prompt an `echo` answer starts with: its text and its tokens.
pub(crate) struct Echo {
    pub(crate) text: String,
    pub(crate) ids: Vec<u32>,
}

impl Echo {
    /// Starts a choice's text (and log probabilities) with the prompt, at its first token.
    pub(crate) fn start(
        &self,
        text: &mut String,
        logprobs: Option<&mut Logprobs>,
        prompt_logprobs: Option<Vec<modelmux_llm::TokenLogprob>>,
    ) {
        text.insert_str(0, &self.text);
        if let Some(l) = logprobs {
            l.push_prompt(&self.ids, prompt_logprobs.unwrap_or_default());
        }
    }
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
            echo: None,
            choices_per_prompt: 1,
        }
    }

    /// Adds choice `index`'s `usage` to `total`: its completion tokens, and its prompt's once
    /// (for the first choice of each prompt).
    pub(crate) fn add_usage(&self, total: &mut Usage, index: usize, usage: &Usage) {
        if index.is_multiple_of(self.choices_per_prompt.max(1)) {
            total.prompt_tokens += usage.prompt_tokens;
        }
        total.completion_tokens += usage.completion_tokens;
    }

    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// The whole answer: each choice's text (a chat answer's calls, if tools are on, read
    /// out of it), finish reason and log probabilities; `usage` counts all choices.
    pub(crate) fn complete(&self, choices: Vec<Finished>, usage: Usage) -> Value {
        let choices: Vec<Value> = choices
            .into_iter()
            .enumerate()
            .map(|(index, c)| self.choice(index, c))
            .collect();
        json!({
            "id": self.id,
            "object": self.object(false),
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": UsageBody::from(usage),
        })
    }

    fn choice(&self, index: usize, finished: Finished) -> Value {
        let Finished {
            text,
            reason,
            logprobs,
        } = finished;
        let logprobs = logprobs.map_or(Value::Null, |mut l| l.take(self.endpoint));
        match self.endpoint {
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
                    "index": index,
                    "message": message,
                    "logprobs": logprobs,
                    "finish_reason": finish_reason(reason, &calls),
                })
            }
            Endpoint::Completion => json!({
                "index": index,
                "text": text,
                "logprobs": logprobs,
                "finish_reason": reason.as_str(),
            }),
        }
    }

    pub(crate) fn tool_calls(&self, calls: &[ToolCall]) -> Value {
        calls
            .iter()
            .enumerate()
            .map(|(i, c)| c.to_json(i, &self.request_id))
            .collect()
    }

    /// The chunk that streams an answer's calls: each call whole, with its index.
    pub(crate) fn calls_chunk(&self, calls: &[ToolCall], first: bool) -> Value {
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
    pub(crate) fn chunk(&self, text: Option<&str>, first: bool, reason: Option<&str>) -> Value {
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

    pub(crate) fn usage_chunk(&self, usage: Usage) -> Value {
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

/// Timing of one sequence for the latency metrics, and, for a traced request, its `prefill`
/// (to the first token) and `decode` (the rest) spans.
pub(crate) struct Timing {
    pub(crate) started: Instant,
    pub(crate) first: Option<Instant>,
    pub(crate) metrics: Arc<LlmMetrics>,
    /// The request's trace (kept here: a streamed answer is read outside the request's task).
    pub(crate) trace: Option<modelmux_context::RequestTrace>,
    /// The span running now: `prefill`, then `decode`.
    pub(crate) span: Option<modelmux_context::Span>,
}

impl Timing {
    /// Timing of a request that started at `started`, in the current request's trace if it
    /// has one.
    pub(crate) fn new(started: Instant, metrics: Arc<LlmMetrics>) -> Self {
        let trace = modelmux_context::current_trace();
        Self {
            started,
            first: None,
            metrics,
            span: trace.as_ref().map(|t| t.start("prefill")),
            trace,
        }
    }

    pub(crate) fn token(&mut self) {
        if self.first.is_none() {
            let now = Instant::now();
            self.first = Some(now);
            self.metrics.first_token(now - self.started);
            if let Some(prefill) = self.span.take() {
                prefill.end(false);
                self.span = self.trace.as_ref().map(|t| t.start("decode"));
            }
        }
    }

    pub(crate) fn finished(&mut self, reason: FinishReason, usage: Usage) {
        if let Some(mut span) = self.span.take() {
            span.attribute("completion_tokens", usage.completion_tokens.to_string());
            span.end(false);
        }
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
/// One choice's end: its text, why it stopped, and its log probabilities if asked for.
pub(crate) struct Finished {
    pub(crate) text: String,
    pub(crate) reason: FinishReason,
    pub(crate) logprobs: Option<Logprobs>,
}

/// Waits for every choice and answers them as one JSON document. The choices generate side
/// by side in the engine; they are read one after the other here.
pub(crate) async fn whole(
    answer: Answer,
    streams: Vec<GenerationStream>,
    mut timing: Timing,
) -> Result<Response, modelmux_serve::ServeError> {
    let mut choices = Vec::with_capacity(streams.len());
    let mut total = Usage::default();
    for (index, stream) in streams.into_iter().enumerate() {
        let (finished, usage) = collect(&answer, stream, &mut timing).await?;
        answer.add_usage(&mut total, index, &usage);
        choices.push(finished);
    }
    if let Some(first) = choices.first() {
        timing.finished(first.reason, total);
    }
    Ok(modelmux_serve::json_response(
        &answer.complete(choices, total),
    ))
}

async fn collect(
    answer: &Answer,
    mut stream: GenerationStream,
    timing: &mut Timing,
) -> Result<(Finished, Usage), modelmux_serve::ServeError> {
    let mut text = String::new();
    let mut logprobs = answer.logprobs.clone().map(Logprobs::new);
    let mut echoed = false;
    while let Some(event) = stream.next().await {
        match event {
            GenerationEvent::Token {
                id,
                text: t,
                logprob,
                prompt_logprobs,
            } => {
                timing.token();
                if let Some(echo) = answer.echo.as_deref()
                    && !echoed
                {
                    echoed = true;
                    echo.start(&mut text, logprobs.as_mut(), prompt_logprobs);
                }
                text.push_str(&t);
                if let (Some(l), Some(lp)) = (&mut logprobs, logprob) {
                    l.push(id, lp);
                }
            }
            GenerationEvent::Finished {
                reason,
                rest,
                usage,
                prompt_logprobs,
            } => {
                // `max_tokens: 0`: the prompt alone, scored.
                if let Some(echo) = answer.echo.as_deref()
                    && !echoed
                {
                    echo.start(&mut text, logprobs.as_mut(), prompt_logprobs);
                }
                text.push_str(&rest);
                let finished = Finished {
                    text,
                    reason,
                    logprobs,
                };
                return Ok((finished, usage));
            }
            GenerationEvent::Error(e) => return Err(serve_error(&e)),
        }
    }
    Err(serve_error(&modelmux_llm::LlmError::EngineStopped(
        "the engine ended the sequence without finishing it".into(),
    )))
}
