//! Streamed answers: Server-Sent Events, one task per choice writing its chunks (text
//! coalesced every `stream_batching_interval_ms`, the first text at once), then the usage (when
//! asked for, summed over the choices) and `data: [DONE]`.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, header};
use modelmux_llm::{GenerationEvent, GenerationStream, Usage};
use modelmux_serve::{Body, BodySender, BoxError, Response};
use serde_json::Value;
use tokio::time::Instant;

use crate::errors::serve_error;
use crate::logprobs::Logprobs;
use crate::params::Endpoint;
use crate::respond::{Answer, Timing, finish_reason};
use crate::tools::CallSplitter;

fn event(value: &Value) -> String {
    format!("data: {value}\n\n")
}

/// An event of choice `index`.
fn event_at(mut value: Value, index: usize) -> String {
    if let Some(choice) = value["choices"].get_mut(0) {
        choice["index"] = index.into();
    }
    event(&value)
}

/// Streams the choices as Server-Sent Events. The body is fed by tasks that end (and drop
/// their streams, which cancels the sequences) when the client goes away.
pub(crate) fn streamed(
    answer: Answer,
    streams: Vec<GenerationStream>,
    timing: Timing,
    interval: Duration,
) -> Response {
    let (tx, body) = Body::channel(16);
    let span = tracing::Span::current();
    tokio::spawn(tracing::Instrument::instrument(
        async move {
            let answer = Arc::new(answer);
            let mut timing = Some(timing);
            let choices: Vec<_> = streams
                .into_iter()
                .enumerate()
                .map(|(index, stream)| {
                    let (tx, answer, timing) = (tx.clone(), answer.clone(), timing.take());
                    let span = tracing::Span::current();
                    tokio::spawn(tracing::Instrument::instrument(
                        async move { feed(&tx, &answer, index, stream, timing, interval).await },
                        span,
                    ))
                })
                .collect();
            let mut total = Usage::default();
            let mut complete = true;
            for (index, choice) in choices.into_iter().enumerate() {
                match choice.await {
                    Ok(Ok(usage)) => answer.add_usage(&mut total, index, &usage),
                    Ok(Err(gone)) => {
                        complete = false;
                        tracing::info!(id = %answer.id, "stream ended early: {gone}");
                    }
                    Err(panic) => {
                        complete = false;
                        tracing::error!(id = %answer.id, "a stream task failed: {panic}");
                    }
                }
            }
            if complete && answer.include_usage {
                let _ = tx.send(event(&answer.usage_chunk(total))).await;
            }
            let _ = tx.send("data: [DONE]\n\n").await;
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

/// Streams one choice (`index`): its chunks, its finish; its usage when done. Only the first
/// choice reports `timing` (one request, one time to first token).
async fn feed(
    tx: &BodySender,
    answer: &Answer,
    index: usize,
    mut stream: GenerationStream,
    mut timing: Option<Timing>,
    interval: Duration,
) -> Result<Usage, BoxError> {
    let event = |value: Value| event_at(value, index);
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
    let mut echoed = false;
    if answer.endpoint == Endpoint::Chat {
        tx.send(event(answer.chunk(Some(""), true, None))).await?;
        first = false;
    }
    loop {
        let next = match deadline {
            Some(at) => match tokio::time::timeout_at(at, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    tx.send(event(text_chunk(answer, &pending, first, &mut logprobs)))
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
            Some(GenerationEvent::Token {
                id,
                text,
                logprob,
                prompt_logprobs,
            }) => {
                if let Some(t) = &mut timing {
                    t.token();
                }
                // `echo`: the prompt goes out with the first token, in the same chunk.
                if let Some(echo) = answer.echo.as_deref()
                    && !echoed
                {
                    echoed = true;
                    echo.start(&mut pending, logprobs.as_mut(), prompt_logprobs);
                }
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
                    tx.send(event(text_chunk(answer, &pending, first, &mut logprobs)))
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
                prompt_logprobs,
            }) => {
                // `max_tokens: 0`: the prompt alone, scored, goes out with the end.
                if let Some(echo) = answer.echo.as_deref()
                    && !echoed
                {
                    echo.start(&mut pending, logprobs.as_mut(), prompt_logprobs);
                }
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
                if let Some(t) = &mut timing {
                    t.finished(reason, usage);
                }
                if !pending.is_empty() {
                    tx.send(event(text_chunk(answer, &pending, first, &mut logprobs)))
                        .await?;
                    first = false;
                }
                if !calls.is_empty() {
                    tx.send(event(answer.calls_chunk(&calls, first))).await?;
                    first = false;
                }
                let reason = finish_reason(reason, &calls);
                let mut last = answer.chunk(None, first, Some(reason));
                // Tokens whose text was held back to the end (a final stop token, say).
                if let Some(l) = logprobs.as_mut().filter(|l| !l.is_empty()) {
                    last["choices"][0]["logprobs"] = l.take(answer.endpoint);
                }
                tx.send(event(last)).await?;
                return Ok(usage);
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

/// An error after the stream began: one `error` event (the status cannot change any more);
/// `[DONE]` follows once every choice has ended.
async fn fail(
    tx: &BodySender,
    answer: &Answer,
    e: &modelmux_serve::ServeError,
) -> Result<Usage, BoxError> {
    tx.send(event(&e.body(Some(&answer.request_id)))).await?;
    Err(e.to_string().into())
}
