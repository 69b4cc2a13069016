//! A streamed message: the chat's stream as Anthropic's events (`event: <type>`, `data:
//! {...}`), in the order its clients accumulate them: `message_start`, per content block
//! `content_block_start`, its deltas (`text_delta`, or `input_json_delta` for a `tool_use`)
//! and `content_block_stop`, then `message_delta` (the stop reason and the usage) and
//! `message_stop`. An error after the stream began is an `error` event.
//!
//! The prompt's token count is known only at the end of the chat's stream: `message_start`
//! says 0 input tokens and `message_delta` the count (the clients take both from there).

use http::{HeaderValue, header};
use modelmux_serve::{Body, BodySender, BoxError, Response};
use serde_json::{Value, json};

use super::{stop_reason, tool_use};
use crate::chat_reply::{ChatEvent, ChatEvents, Finish, Tokens};

/// Streams the answer `events` carry as message `id` of `model`.
pub(crate) fn streamed(
    id: String,
    model: String,
    events: ChatEvents,
    mut head: Response,
) -> Response {
    let (tx, body) = Body::channel(16);
    tokio::spawn(async move {
        let writer = Writer {
            tx,
            blocks: 0,
            text_open: false,
            held: String::new(),
        };
        if let Err(gone) = writer.run(&id, &model, events).await {
            tracing::info!("message stream ended early: {gone}");
        }
    });
    *head.body_mut() = body;
    let headers = head.headers_mut();
    headers.remove(header::CONTENT_LENGTH);
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    head
}

struct Writer {
    tx: BodySender,
    /// Content blocks started so far.
    blocks: usize,
    /// Whether the last block started is a text block still open.
    text_open: bool,
    /// Whitespace not sent yet: whitespace before calls is no text block (as in a whole
    /// answer).
    held: String,
}

impl Writer {
    async fn send(&mut self, kind: &str, mut data: Value) -> Result<(), BoxError> {
        data["type"] = kind.into();
        self.tx
            .send(format!("event: {kind}\ndata: {data}\n\n"))
            .await
    }

    async fn run(mut self, id: &str, model: &str, mut events: ChatEvents) -> Result<(), BoxError> {
        let start = json!({
            "id": id, "type": "message", "role": "assistant", "model": model, "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0},
        });
        self.send("message_start", json!({"message": start}))
            .await?;
        let (mut finish, mut tokens) = (Finish::Stop, Tokens::default());
        while let Some(event) = events.next().await {
            match event {
                Ok(ChatEvent::Text(text)) => self.text(text).await?,
                Ok(ChatEvent::Calls(calls)) => {
                    self.held.clear();
                    self.close_text().await?;
                    for call in calls {
                        let index = self.blocks;
                        self.blocks += 1;
                        let mut block = tool_use(&call);
                        block["input"] = json!({});
                        self.send(
                            "content_block_start",
                            json!({"index": index, "content_block": block}),
                        )
                        .await?;
                        self.send(
                            "content_block_delta",
                            json!({"index": index, "delta": {"type": "input_json_delta", "partial_json": call.arguments}}),
                        )
                        .await?;
                        self.send("content_block_stop", json!({"index": index}))
                            .await?;
                    }
                }
                Ok(ChatEvent::Finish(f)) => finish = f,
                Ok(ChatEvent::Usage(t)) => tokens = t,
                Ok(ChatEvent::Error(body)) => return self.fail(&body).await,
                Err(e) => return self.fail(&e.body(None)).await,
            }
        }
        if !self.held.is_empty() {
            let held = std::mem::take(&mut self.held);
            self.open_text().await?;
            self.delta(held).await?;
        }
        self.close_text().await?;
        self.send(
            "message_delta",
            json!({
                "delta": {"stop_reason": stop_reason(finish), "stop_sequence": null},
                "usage": super::usage(tokens),
            }),
        )
        .await?;
        self.send("message_stop", json!({})).await
    }

    async fn text(&mut self, text: String) -> Result<(), BoxError> {
        if !self.text_open && text.trim().is_empty() {
            self.held.push_str(&text);
            return Ok(());
        }
        let mut text = text;
        if !self.held.is_empty() {
            text.insert_str(0, &std::mem::take(&mut self.held));
        }
        self.open_text().await?;
        self.delta(text).await
    }

    async fn open_text(&mut self) -> Result<(), BoxError> {
        if self.text_open {
            return Ok(());
        }
        self.text_open = true;
        let index = self.blocks;
        self.blocks += 1;
        self.send(
            "content_block_start",
            json!({"index": index, "content_block": {"type": "text", "text": ""}}),
        )
        .await
    }

    async fn delta(&mut self, text: String) -> Result<(), BoxError> {
        let index = self.blocks - 1;
        self.send(
            "content_block_delta",
            json!({"index": index, "delta": {"type": "text_delta", "text": text}}),
        )
        .await
    }

    async fn close_text(&mut self) -> Result<(), BoxError> {
        if !self.text_open {
            return Ok(());
        }
        self.text_open = false;
        let index = self.blocks - 1;
        self.send("content_block_stop", json!({"index": index}))
            .await
    }

    /// The error that ended the answer (the chat's OpenAI-shaped body), as Anthropic's
    /// `error` event.
    async fn fail(&mut self, openai: &Value) -> Result<(), BoxError> {
        let status = openai["error"]["code"]
            .as_u64()
            .and_then(|c| http::StatusCode::from_u16(c as u16).ok())
            .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        let body = super::anthropic_body(status, openai);
        self.send("error", json!({"error": body["error"]})).await
    }
}
