//! The response object of the Responses API, and its output items, built from the chat's
//! answer.

use serde_json::{Value, json};

use crate::chat_reply::{ChatReply, Finish, ReplyCall, Tokens};
use crate::protocol::unix_now;
use crate::responses::request::ResponsesBody;

/// What every shape of one response repeats: its id, the request's settings as the response
/// echoes them.
pub(crate) struct Shell {
    pub(crate) id: String,
    /// The response object without `status`, `output` and `usage`.
    settings: Value,
}

impl Shell {
    pub(crate) fn new(id: String, b: &ResponsesBody) -> Self {
        let format = b
            .text
            .as_ref()
            .and_then(|t| t.format.clone())
            .unwrap_or_else(|| json!({"type": "text"}));
        let settings = json!({
            "id": id,
            "object": "response",
            "created_at": unix_now(),
            "error": null,
            "incomplete_details": null,
            "instructions": b.instructions,
            "max_output_tokens": b.max_output_tokens,
            "model": b.model,
            "parallel_tool_calls": b.parallel_tool_calls.unwrap_or(true),
            "previous_response_id": b.previous_response_id,
            "reasoning": null,
            "store": b.store.unwrap_or(true),
            "temperature": b.temperature.unwrap_or(1.0),
            "text": {"format": format},
            "tool_choice": b.tool_choice.clone().unwrap_or_else(|| json!("auto")),
            "tools": b.tools.clone().unwrap_or_default(),
            "top_p": b.top_p.unwrap_or(1.0),
            "truncation": "disabled",
            "user": b.user,
            "metadata": b.metadata.clone().unwrap_or_default(),
        });
        Self { id, settings }
    }

    /// The response with `status`, `output` and `usage` (none while it runs).
    pub(crate) fn object(&self, status: &str, output: &[Value], tokens: Option<Tokens>) -> Value {
        let mut v = self.settings.clone();
        v["status"] = status.into();
        v["output"] = output.into();
        v["usage"] = tokens.map_or(Value::Null, usage);
        v
    }

    /// The finished response: `completed`, or `incomplete` when it ran into
    /// `max_output_tokens`.
    pub(crate) fn finished(&self, output: &[Value], finish: Finish, tokens: Tokens) -> Value {
        let status = if finish == Finish::Length {
            "incomplete"
        } else {
            "completed"
        };
        let mut v = self.object(status, output, Some(tokens));
        if finish == Finish::Length {
            v["incomplete_details"] = json!({"reason": "max_output_tokens"});
        }
        v
    }

    /// The id of output item `index`.
    pub(crate) fn item_id(&self, kind: &str, index: usize) -> String {
        let suffix = self.id.strip_prefix("resp_").unwrap_or(&self.id);
        format!("{kind}_{suffix}_{index}")
    }

    /// The assistant's message item.
    pub(crate) fn message(&self, index: usize, text: &str, status: &str) -> Value {
        json!({
            "type": "message",
            "id": self.item_id("msg", index),
            "status": status,
            "role": "assistant",
            "content": if status == "in_progress" { json!([]) } else { json!([text_part(text)]) },
        })
    }

    /// A function call item.
    pub(crate) fn call(&self, index: usize, call: &ReplyCall, status: &str) -> Value {
        json!({
            "type": "function_call",
            "id": self.item_id("fc", index),
            "call_id": call.id,
            "name": call.name,
            "arguments": if status == "in_progress" { "" } else { call.arguments.as_str() },
            "status": status,
        })
    }

    /// The output of a whole answer: its text as a message (when there is text, or nothing
    /// else), then each call.
    pub(crate) fn output(&self, reply: &ChatReply) -> Vec<Value> {
        let mut output = Vec::with_capacity(1 + reply.calls.len());
        if !reply.text.is_empty() || reply.calls.is_empty() {
            output.push(self.message(0, &reply.text, "completed"));
        }
        for call in &reply.calls {
            let index = output.len();
            output.push(self.call(index, call, "completed"));
        }
        output
    }
}

/// An `output_text` content part.
pub(crate) fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// `usage` in the Responses API's shape.
fn usage(t: Tokens) -> Value {
    json!({
        "input_tokens": t.prompt,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": t.completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": t.prompt + t.completion,
    })
}
