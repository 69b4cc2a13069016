//! Streamed answers: Server-Sent Events, one task per choice writing its chunks (text
//! coalesced every `stream_batching_interval_ms`, the first text at once), then the usage (when
//! asked for, summed over the choices) and `data: [DONE]`.

use std::sync::Arc;
use std::time::Duration;

use http::{HeaderValue, header};
use modelmux_llm::{FinishReason, GenerationEvent, GenerationStream, TokenLogprob, Usage};
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
    timing: Option<Timing>,
    interval: Duration,
) -> Result<Usage, BoxError> {
    let mut choice = Choice::new(tx, answer, index, timing, interval);
    if answer.endpoint == Endpoint::Chat {
        choice.send(answer.chunk(Some(""), true, None)).await?;
        choice.first = false;
    }
    loop {
        let next = match choice.deadline {
            Some(at) => match tokio::time::timeout_at(at, stream.next()).await {
                Ok(next) => next,
                Err(_) => {
                    choice.flush().await?;
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
            }) => choice.token(id, &text, logprob, prompt_logprobs).await?,
            Some(GenerationEvent::Finished {
                reason,
                rest,
                usage,
                prompt_logprobs,
            }) => return choice.finish(reason, &rest, usage, prompt_logprobs).await,
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

/// One choice's stream as [`feed`] writes it: the text gathered and not sent yet, and what
/// went out so far.
struct Choice<'a> {
    tx: &'a BodySender,
    answer: &'a Answer,
    index: usize,
    /// How long text is gathered before it goes out (zero: each token's at once).
    interval: Duration,
    timing: Option<Timing>,
    /// Whether the next chunk is the choice's first.
    first: bool,
    /// Whether any text went out yet: the first goes at once, however it was split into tokens
    /// (a first token that decodes to no text, half a character say, does not make the next
    /// text wait for the interval).
    text_sent: bool,
    pending: String,
    /// When the text gathered so far must go out; none while nothing waits.
    deadline: Option<Instant>,
    /// With tools on, text goes through the splitter, which holds back calls.
    splitter: Option<CallSplitter>,
    logprobs: Option<Logprobs>,
    /// Whether the prompt went out (`echo`).
    echoed: bool,
}

impl<'a> Choice<'a> {
    fn new(
        tx: &'a BodySender,
        answer: &'a Answer,
        index: usize,
        timing: Option<Timing>,
        interval: Duration,
    ) -> Self {
        Self {
            tx,
            answer,
            index,
            interval,
            timing,
            first: true,
            text_sent: false,
            pending: String::new(),
            deadline: None,
            splitter: answer.functions.as_deref().map(CallSplitter::new),
            logprobs: answer.logprobs.clone().map(Logprobs::new),
            echoed: false,
        }
    }

    /// Sends `value` as an event of this choice.
    async fn send(&self, value: Value) -> Result<(), BoxError> {
        self.tx.send(event_at(value, self.index)).await
    }

    /// Sends the text gathered so far (the interval is up).
    async fn flush(&mut self) -> Result<(), BoxError> {
        self.send_pending().await?;
        self.pending.clear();
        self.first = false;
        self.deadline = None;
        Ok(())
    }

    /// The gathered text as a chunk, with the log probabilities of its tokens.
    async fn send_pending(&mut self) -> Result<(), BoxError> {
        let chunk = text_chunk(self.answer, &self.pending, self.first, &mut self.logprobs);
        self.send(chunk).await
    }

    /// A token: its text (and log probability) gathered, sent at once if it is the first text
    /// or nothing is coalesced, else by the deadline it sets if none is set.
    async fn token(
        &mut self,
        id: u32,
        text: &str,
        logprob: Option<TokenLogprob>,
        prompt_logprobs: Option<Vec<TokenLogprob>>,
    ) -> Result<(), BoxError> {
        if let Some(t) = &mut self.timing {
            t.token();
        }
        // `echo`: the prompt goes out with the first token, in the same chunk.
        if let Some(echo) = self.answer.echo.as_deref()
            && !self.echoed
        {
            self.echoed = true;
            echo.start(&mut self.pending, self.logprobs.as_mut(), prompt_logprobs);
        }
        if let (Some(l), Some(lp)) = (&mut self.logprobs, logprob) {
            l.push(id, lp);
        }
        match &mut self.splitter {
            Some(s) => self.pending.push_str(&s.push(text)),
            None => self.pending.push_str(text),
        }
        if self.pending.is_empty() {
            return Ok(());
        }
        // The first text goes out at once (time to first token is not coalesced).
        if !self.text_sent || self.interval.is_zero() {
            self.send_pending().await?;
            self.pending.clear();
            self.first = false;
            self.text_sent = true;
        } else if self.deadline.is_none() {
            self.deadline = Some(Instant::now() + self.interval);
        }
        Ok(())
    }

    /// The end: the text held back (and the prompt, if no token brought it), the tool calls,
    /// and the last chunk with the finish reason; the choice's usage.
    async fn finish(
        mut self,
        reason: FinishReason,
        rest: &str,
        usage: Usage,
        prompt_logprobs: Option<Vec<TokenLogprob>>,
    ) -> Result<Usage, BoxError> {
        // `max_tokens: 0`: the prompt alone, scored, goes out with the end.
        if let Some(echo) = self.answer.echo.as_deref()
            && !self.echoed
        {
            echo.start(&mut self.pending, self.logprobs.as_mut(), prompt_logprobs);
        }
        let calls = match self.splitter.take() {
            Some(mut s) => {
                self.pending.push_str(&s.push(rest));
                let (held, calls) = s.finish();
                self.pending.push_str(&held);
                calls
            }
            None => {
                self.pending.push_str(rest);
                Vec::new()
            }
        };
        if let Some(t) = &mut self.timing {
            t.finished(reason, usage);
        }
        if !self.pending.is_empty() {
            self.send_pending().await?;
            self.first = false;
        }
        if !calls.is_empty() {
            self.send(self.answer.calls_chunk(&calls, self.first))
                .await?;
            self.first = false;
        }
        let reason = finish_reason(reason, &calls);
        let mut last = self.answer.chunk(None, self.first, Some(reason));
        // Tokens whose text was held back to the end (a final stop token, say).
        if let Some(l) = self.logprobs.as_mut().filter(|l| !l.is_empty()) {
            last["choices"][0]["logprobs"] = l.take(self.answer.endpoint);
        }
        self.send(last).await?;
        Ok(usage)
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
