//! A streamed response: the chat's stream as the Responses API's events (`event: <type>`,
//! `data: {...}`, each with its `sequence_number`), in the order the official clients
//! accumulate them: `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its content (`response.content_part.added`,
//! `response.output_text.delta`..., `response.output_text.done`, `response.content_part.done`;
//! or `response.function_call_arguments.delta` and `.done`), `response.output_item.done`, and
//! at the end `response.completed` (`response.incomplete` past `max_output_tokens`,
//! `response.failed` on an error), sent once the response is stored.

use http::{HeaderValue, header};
use modelmux_serve::{Body, BodySender, BoxError, Response};
use serde_json::{Value, json};

use crate::chat_reply::{ChatEvent, ChatEvents, Finish, ReplyCall, Tokens};
use crate::responses::Turn;
use crate::responses::output::{Shell, text_part};

/// Streams the answer `events` carry as response `shell`; `turn` stores it at the end.
pub(crate) fn streamed(
    shell: Shell,
    turn: Turn,
    events: ChatEvents,
    mut head: Response,
) -> Response {
    let (tx, body) = Body::channel(16);
    tokio::spawn(async move {
        let writer = Writer {
            tx,
            shell,
            seq: 0,
            output: Vec::new(),
            open: None,
            held: String::new(),
        };
        if let Err(gone) = writer.run(events, turn).await {
            tracing::info!("response stream ended early: {gone}");
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
    shell: Shell,
    seq: u64,
    /// The items done so far.
    output: Vec<Value>,
    /// The message being written: its text so far.
    open: Option<String>,
    /// Whitespace not sent yet: an answer that is only calls has no message (as a whole
    /// answer has none), so text that may come before its calls waits for a visible
    /// character.
    held: String,
}

impl Writer {
    async fn send(&mut self, kind: &str, mut data: Value) -> Result<(), BoxError> {
        data["type"] = kind.into();
        data["sequence_number"] = self.seq.into();
        self.seq += 1;
        self.tx
            .send(format!("event: {kind}\ndata: {data}\n\n"))
            .await
    }

    async fn run(mut self, mut events: ChatEvents, turn: Turn) -> Result<(), BoxError> {
        let running = json!({"response": self.shell.object("in_progress", &[], None)});
        self.send("response.created", running.clone()).await?;
        self.send("response.in_progress", running).await?;
        let (mut finish, mut tokens) = (Finish::Stop, Tokens::default());
        while let Some(event) = events.next().await {
            match event {
                Ok(ChatEvent::Text(text)) => self.text(text).await?,
                Ok(ChatEvent::Calls(calls)) => {
                    self.held.clear();
                    self.close_message().await?;
                    for call in calls {
                        self.call(&call).await?;
                    }
                }
                Ok(ChatEvent::Finish(f)) => finish = f,
                Ok(ChatEvent::Usage(t)) => tokens = t,
                Ok(ChatEvent::Error(body)) => return self.fail(&body["error"]).await,
                Err(e) => return self.fail(&e.body(None)["error"]).await,
            }
        }
        if !self.held.is_empty() || self.output.is_empty() && self.open.is_none() {
            let held = std::mem::take(&mut self.held);
            self.open_message().await?;
            if !held.is_empty() {
                self.delta(held).await?;
            }
        }
        self.close_message().await?;
        let response = self.shell.finished(&self.output, finish, tokens);
        if let Err(e) = turn.keep(&response).await {
            return self.fail(&e.body(None)["error"]).await;
        }
        let kind = match finish {
            Finish::Length => "response.incomplete",
            _ => "response.completed",
        };
        self.send(kind, json!({"response": response})).await
    }

    async fn text(&mut self, text: String) -> Result<(), BoxError> {
        if self.open.is_none() && text.trim().is_empty() {
            self.held.push_str(&text);
            return Ok(());
        }
        let mut text = text;
        if !self.held.is_empty() {
            text.insert_str(0, &std::mem::take(&mut self.held));
        }
        self.open_message().await?;
        self.delta(text).await
    }

    async fn open_message(&mut self) -> Result<(), BoxError> {
        if self.open.is_some() {
            return Ok(());
        }
        self.open = Some(String::new());
        let index = self.output.len();
        let item = self.shell.message(index, "", "in_progress");
        let item_id = item["id"].clone();
        self.send(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        )
        .await?;
        self.send(
            "response.content_part.added",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": text_part("")}),
        )
        .await
    }

    async fn delta(&mut self, text: String) -> Result<(), BoxError> {
        let index = self.output.len();
        let item_id = self.shell.item_id("msg", index);
        if let Some(open) = &mut self.open {
            open.push_str(&text);
        }
        self.send(
            "response.output_text.delta",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": text, "logprobs": []}),
        )
        .await
    }

    async fn close_message(&mut self) -> Result<(), BoxError> {
        let Some(text) = self.open.take() else {
            return Ok(());
        };
        let index = self.output.len();
        let item = self.shell.message(index, &text, "completed");
        let item_id = item["id"].clone();
        self.send(
            "response.output_text.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
        )
        .await?;
        self.send(
            "response.content_part.done",
            json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": text_part(&text)}),
        )
        .await?;
        self.send(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        )
        .await?;
        self.output.push(item);
        Ok(())
    }

    async fn call(&mut self, call: &ReplyCall) -> Result<(), BoxError> {
        let index = self.output.len();
        let started = self.shell.call(index, call, "in_progress");
        let item_id = started["id"].clone();
        self.send(
            "response.output_item.added",
            json!({"output_index": index, "item": started}),
        )
        .await?;
        self.send(
            "response.function_call_arguments.delta",
            json!({"item_id": item_id, "output_index": index, "delta": call.arguments}),
        )
        .await?;
        self.send(
            "response.function_call_arguments.done",
            json!({"item_id": item_id, "output_index": index, "name": call.name, "arguments": call.arguments}),
        )
        .await?;
        let done = self.shell.call(index, call, "completed");
        self.send(
            "response.output_item.done",
            json!({"output_index": index, "item": done}),
        )
        .await?;
        self.output.push(done);
        Ok(())
    }

    /// The error that ended the answer: `response.failed`, with what was done before it.
    async fn fail(&mut self, error: &Value) -> Result<(), BoxError> {
        let mut response = self.shell.object("failed", &self.output, None);
        response["error"] = json!({
            "code": error["type"].as_str().unwrap_or("server_error"),
            "message": error["message"].as_str().unwrap_or("the answer failed"),
        });
        self.send("response.failed", json!({"response": response}))
            .await
    }
}
