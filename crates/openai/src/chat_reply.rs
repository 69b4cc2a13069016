//! A chat answer as the APIs that translate into a chat read it back: the Responses API and
//! Anthropic's Messages API send the LLM deployment a chat request (one engine path) and
//! reshape what it answers, whole ([`ChatReply`]) or streamed ([`ChatEvents`]).
//!
//! The answer is the LLM deployment's own chat completion, so every token of a translated
//! answer is the token the same chat would have had.

use bytes::{Buf, BytesMut};
use http_body_util::BodyExt;
use modelmux_cache::Failure;
use modelmux_serve::{Body, ServeError};
use serde_json::Value;

/// One call of a function the answer made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ReplyCall {
    /// `call_<index>_<request id>`.
    pub(crate) id: String,
    pub(crate) name: String,
    /// The arguments, as JSON text.
    pub(crate) arguments: String,
}

/// Why the answer ended, as the chat said it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Finish {
    /// The end of the sequence, a stop string or token, or the end of a constrained output.
    Stop,
    /// `max_tokens`.
    Length,
    /// It ended after making calls.
    ToolCalls,
}

impl Finish {
    fn of(reason: &str) -> Self {
        match reason {
            "length" => Self::Length,
            "tool_calls" => Self::ToolCalls,
            _ => Self::Stop,
        }
    }
}

/// Tokens in and out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Tokens {
    pub(crate) prompt: usize,
    pub(crate) completion: usize,
}

impl Tokens {
    fn of(usage: &Value) -> Self {
        let n = |k: &str| usage[k].as_u64().unwrap_or(0) as usize;
        Self {
            prompt: n("prompt_tokens"),
            completion: n("completion_tokens"),
        }
    }
}

/// A whole chat answer (its first choice: translated requests ask for one).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ChatReply {
    pub(crate) text: String,
    pub(crate) calls: Vec<ReplyCall>,
    pub(crate) finish: Finish,
    pub(crate) tokens: Tokens,
}

/// The LLM deployment answered something that is not a chat answer.
pub(crate) fn unexpected(what: impl std::fmt::Display) -> ServeError {
    ServeError::Failed(Failure::internal(format!(
        "the LLM deployment's chat answer could not be read: {what}"
    )))
}

fn calls_of(list: &Value) -> Vec<ReplyCall> {
    list.as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| ReplyCall {
                    id: c["id"].as_str().unwrap_or_default().to_owned(),
                    name: c["function"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    arguments: c["function"]["arguments"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                })
                .collect()
        })
        .unwrap_or_default()
}

impl ChatReply {
    /// Reads a chat completion's body.
    pub(crate) async fn read(body: Body) -> Result<Self, ServeError> {
        let bytes = body.to_bytes(usize::MAX).await.map_err(unexpected)?;
        let v: Value = serde_json::from_slice(&bytes).map_err(unexpected)?;
        let choice = &v["choices"][0];
        let message = &choice["message"];
        Ok(Self {
            text: message["content"].as_str().unwrap_or_default().to_owned(),
            calls: calls_of(&message["tool_calls"]),
            finish: Finish::of(choice["finish_reason"].as_str().unwrap_or("stop")),
            tokens: Tokens::of(&v["usage"]),
        })
    }
}

/// What a streamed chat answer says next.
#[derive(Debug, PartialEq)]
pub(crate) enum ChatEvent {
    /// Text of the answer.
    Text(String),
    /// The calls the answer made, each whole.
    Calls(Vec<ReplyCall>),
    /// Why it ended.
    Finish(Finish),
    /// Its tokens (the last event before the end; asked for with `include_usage`).
    Usage(Tokens),
    /// An error after the stream began: the chat's error body.
    Error(Value),
}

/// The events of a streamed chat answer (Server-Sent Events, `data: {...}` each, ending with
/// `data: [DONE]`), read as they arrive.
pub(crate) struct ChatEvents {
    body: Body,
    buffer: BytesMut,
    pending: std::collections::VecDeque<ChatEvent>,
    done: bool,
}

impl ChatEvents {
    pub(crate) fn new(body: Body) -> Self {
        Self {
            body,
            buffer: BytesMut::new(),
            pending: std::collections::VecDeque::new(),
            done: false,
        }
    }

    /// The next event; `None` once the answer ended (`[DONE]`, or the body's end).
    pub(crate) async fn next(&mut self) -> Option<Result<ChatEvent, ServeError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(Ok(event));
            }
            if self.done {
                return None;
            }
            if let Some(at) = find_blank_line(&self.buffer) {
                let event = self.buffer.split_to(at);
                self.buffer.advance(2);
                if let Err(e) = self.take(&event) {
                    self.done = true;
                    return Some(Err(e));
                }
                continue;
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(Err(unexpected(e)));
                }
                None => {
                    self.done = true;
                    return None;
                }
            }
        }
    }

    /// Reads one event's lines into `pending`.
    fn take(&mut self, event: &[u8]) -> Result<(), ServeError> {
        for line in event.split(|&b| b == b'\n') {
            let Some(data) = line.strip_prefix(b"data: ") else {
                continue;
            };
            if data == b"[DONE]" {
                self.done = true;
                return Ok(());
            }
            let chunk: Value = serde_json::from_slice(data).map_err(unexpected)?;
            if chunk.get("error").is_some() {
                self.pending.push_back(ChatEvent::Error(chunk));
                continue;
            }
            if let Some(usage) = chunk.get("usage").filter(|u| u.is_object()) {
                self.pending.push_back(ChatEvent::Usage(Tokens::of(usage)));
            }
            let Some(choice) = chunk["choices"].get(0) else {
                continue;
            };
            let delta = &choice["delta"];
            if let Some(text) = delta["content"].as_str().filter(|t| !t.is_empty()) {
                self.pending.push_back(ChatEvent::Text(text.to_owned()));
            }
            let calls = calls_of(&delta["tool_calls"]);
            if !calls.is_empty() {
                self.pending.push_back(ChatEvent::Calls(calls));
            }
            if let Some(reason) = choice["finish_reason"].as_str() {
                self.pending
                    .push_back(ChatEvent::Finish(Finish::of(reason)));
            }
        }
        Ok(())
    }
}

fn find_blank_line(buffer: &[u8]) -> Option<usize> {
    buffer.windows(2).position(|w| w == b"\n\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stream_split_anywhere_reads_as_its_events() {
        let stream = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hé\"},\"finish_reason\":null}],\"usage\":null}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_0_r\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}],\"usage\":null}\n\n",
            "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":2,\"total_tokens\":7}}\n\n",
            "data: [DONE]\n\n",
        )
        .as_bytes();
        let expected = vec![
            ChatEvent::Text("Hé".into()),
            ChatEvent::Calls(vec![ReplyCall {
                id: "call_0_r".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }]),
            ChatEvent::Finish(Finish::ToolCalls),
            ChatEvent::Usage(Tokens {
                prompt: 5,
                completion: 2,
            }),
        ];
        let runtime = crate::test_pool::runtime();
        for split in [1, 2, 3, 7, 50, stream.len()] {
            let (tx, body) = Body::channel(stream.len());
            let chunks: Vec<Vec<u8>> = stream.chunks(split).map(<[u8]>::to_vec).collect();
            let events = runtime.block_on(async move {
                for c in chunks {
                    tx.send(c).await.unwrap();
                }
                drop(tx);
                let mut events = ChatEvents::new(body);
                let mut seen = Vec::new();
                while let Some(e) = events.next().await {
                    seen.push(e.unwrap());
                }
                seen
            });
            assert_eq!(events, expected, "split every {split} bytes");
        }
    }
}
