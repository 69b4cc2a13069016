//! `POST /v1/messages` and `POST /v1/messages/count_tokens`, parsed: Anthropic's shapes
//! (`system`, `messages` of text, `tool_use` and `tool_result` blocks, `tools` with an
//! `input_schema`, `tool_choice` of `auto` / `any` / `tool` / `none`), checked naming the field
//! at fault, and the chat request they are.

use modelmux_serve::ServeError;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::params::{Job, body_of, chat_request, invalid, parse_body};
use crate::protocol::{
    Content, FunctionCallIn, GenerateBody, Message, OneOrMany, StreamOptions, TokenizeRequest,
    ToolCallIn,
};
use crate::responses::renamed;

/// The body of `POST /v1/messages` (and, without `max_tokens`, of `count_tokens`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct MessagesBody {
    pub(crate) model: String,
    pub(crate) messages: Vec<Value>,
    pub(crate) max_tokens: Option<serde_json::Number>,
    pub(crate) system: Option<Value>,
    pub(crate) stop_sequences: Option<Vec<String>>,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f64>,
    pub(crate) top_k: Option<i64>,
    pub(crate) stream: Option<bool>,
    pub(crate) tools: Option<Vec<Value>>,
    pub(crate) tool_choice: Option<Value>,
    /// Accepted: `user_id` for the caller's own accounting.
    #[allow(dead_code)]
    pub(crate) metadata: Option<Value>,
    /// Advisory in Anthropic's API: accepted, not used.
    #[allow(dead_code)]
    pub(crate) service_tier: Option<String>,
    /// Extended thinking: only `{"type": "disabled"}`.
    pub(crate) thinking: Option<Value>,
    /// The answer's format (`{"format": {"type": "json_schema", "schema"}}`, enforced with
    /// the grammar as a chat's `response_format` is) and `effort`, advice a sampler cannot
    /// follow (accepted).
    pub(crate) output_config: Option<OutputConfig>,
}

/// `output_config`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct OutputConfig {
    #[allow(dead_code)]
    pub(crate) effort: Option<String>,
    pub(crate) format: Option<Value>,
}

/// `output_config.format` as the chat's `response_format`.
fn response_format(format: &Value) -> Result<Value, ServeError> {
    match format.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            let schema = format.get("schema").ok_or_else(|| {
                invalid(
                    "output_config.format.schema",
                    "output_config.format.schema is required",
                )
            })?;
            Ok(json!({"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}))
        }
        _ => Err(invalid(
            "output_config.format.type",
            "output_config.format.type must be json_schema",
        )),
    }
}

/// Parses a Messages body; `count` for `count_tokens`, which has no `max_tokens`.
pub(crate) fn parse(body: &[u8], count: bool) -> Result<MessagesBody, ServeError> {
    let b: MessagesBody = parse_body(body)?;
    if !count && b.max_tokens.is_none() {
        return Err(invalid("max_tokens", "max_tokens is required"));
    }
    if let Some(t) = &b.thinking
        && t.get("type").and_then(Value::as_str) != Some("disabled")
    {
        return Err(invalid(
            "thinking",
            "thinking: this server's models answer without a separate thinking phase",
        ));
    }
    Ok(b)
}

fn text_blocks(at: &str, value: &Value) -> Result<String, ServeError> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => {
            let mut text = String::new();
            for (i, block) in blocks.iter().enumerate() {
                let at = format!("{at}[{i}]");
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(block["text"].as_str().ok_or_else(|| {
                        invalid(&format!("{at}.text"), format!("{at}.text must be a string"))
                    })?),
                    other => {
                        return Err(invalid(
                            &format!("{at}.type"),
                            format!(
                                "{at}.type: {} blocks are not supported here (text blocks are)",
                                other.map_or("untyped".to_owned(), |o| format!("'{o}'"))
                            ),
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(invalid(
            at,
            format!("{at} must be a string or a list of text blocks"),
        )),
    }
}

/// One message's blocks as chat messages: text joined; an assistant's `tool_use` blocks as
/// its calls; a user's `tool_result` blocks as `tool` messages (before the user's text).
fn message(i: usize, m: &Value, out: &mut Vec<Message>) -> Result<(), ServeError> {
    let at = format!("messages[{i}]");
    let role = match m.get("role").and_then(Value::as_str) {
        Some(r @ ("user" | "assistant")) => r,
        _ => {
            return Err(invalid(
                &format!("{at}.role"),
                format!("{at}.role must be user or assistant"),
            ));
        }
    };
    let content = m.get("content").ok_or_else(|| {
        invalid(
            &format!("{at}.content"),
            format!("{at}.content is required"),
        )
    })?;
    let blocks = match content {
        Value::String(s) => vec![json!({"type": "text", "text": s})],
        Value::Array(b) => b.clone(),
        _ => {
            return Err(invalid(
                &format!("{at}.content"),
                format!("{at}.content must be a string or a list of blocks"),
            ));
        }
    };
    let (mut text, mut calls) = (String::new(), Vec::new());
    for (j, block) in blocks.iter().enumerate() {
        let at = format!("{at}.content[{j}]");
        let field = |k: &str| format!("{at}.{k}");
        match (block.get("type").and_then(Value::as_str), role) {
            (Some("text"), _) => text.push_str(block["text"].as_str().ok_or_else(|| {
                invalid(
                    &field("text"),
                    format!("{} must be a string", field("text")),
                )
            })?),
            (Some("tool_use"), "assistant") => {
                let id = block["id"].as_str();
                let name = block["name"].as_str();
                let (Some(id), Some(name)) = (id, name) else {
                    return Err(invalid(
                        &field("id"),
                        format!("{at}: a tool_use block needs an id and a name"),
                    ));
                };
                calls.push(ToolCallIn {
                    id: id.to_owned(),
                    kind: "function".into(),
                    function: FunctionCallIn {
                        name: name.to_owned(),
                        arguments: block.get("input").unwrap_or(&json!({})).to_string(),
                    },
                });
            }
            (Some("tool_result"), "user") => {
                let id = block["tool_use_id"].as_str().ok_or_else(|| {
                    invalid(
                        &field("tool_use_id"),
                        format!("{} is required", field("tool_use_id")),
                    )
                })?;
                let result = match block.get("content") {
                    None => String::new(),
                    Some(c) => text_blocks(&field("content"), c)?,
                };
                out.push(Message {
                    role: "tool".into(),
                    content: Some(Content::Text(result)),
                    tool_call_id: Some(id.to_owned()),
                    ..Message::default()
                });
            }
            (kind, _) => {
                return Err(invalid(
                    &field("type"),
                    format!(
                        "{}: {} blocks are not supported in {role} messages",
                        field("type"),
                        kind.map_or("untyped".to_owned(), |k| format!("'{k}'"))
                    ),
                ));
            }
        }
    }
    if !text.is_empty() || !calls.is_empty() || blocks.is_empty() {
        // Only calls: no content, as a chat's assistant message that only calls has none.
        let content = (!text.is_empty() || calls.is_empty()).then_some(Content::Text(text));
        out.push(Message {
            role: role.into(),
            content,
            tool_calls: (!calls.is_empty()).then_some(calls),
            ..Message::default()
        });
    }
    Ok(())
}

/// The conversation as chat messages: `system` first, then each message.
pub(crate) fn chat_messages(b: &MessagesBody) -> Result<Vec<Message>, ServeError> {
    let mut out = Vec::with_capacity(b.messages.len() + 1);
    if let Some(system) = &b.system {
        out.push(Message {
            role: "system".into(),
            content: Some(Content::Text(text_blocks("system", system)?)),
            ..Message::default()
        });
    }
    for (i, m) in b.messages.iter().enumerate() {
        message(i, m, &mut out)?;
    }
    Ok(out)
}

/// `tools` in the chat's shape.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ServeError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let at = format!("tools[{i}]");
            if let Some(kind) = tool
                .get("type")
                .and_then(Value::as_str)
                .filter(|k| *k != "custom")
            {
                return Err(invalid(
                    &format!("{at}.type"),
                    format!("{at}.type: '{kind}' tools are not supported (client tools are)"),
                ));
            }
            if tool.get("input_schema").is_none() {
                return Err(invalid(
                    &format!("{at}.input_schema"),
                    format!("{at}.input_schema is required"),
                ));
            }
            // In the tool's own order: the template prints the function as it is.
            let function: serde_json::Map<String, Value> = tool
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(k, _)| !matches!(k.as_str(), "type" | "cache_control"))
                .map(|(k, v)| match k.as_str() {
                    "input_schema" => ("parameters".to_owned(), v.clone()),
                    _ => (k.clone(), v.clone()),
                })
                .collect();
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// `tool_choice` as the chat's `tool_choice` and `parallel_tool_calls`.
fn chat_tool_choice(choice: &Value) -> Result<(Value, Option<bool>), ServeError> {
    let parallel = choice
        .get("disable_parallel_tool_use")
        .and_then(Value::as_bool)
        .map(|d| !d);
    let chat = match choice.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = choice["name"]
                .as_str()
                .ok_or_else(|| invalid("tool_choice.name", "tool_choice.name is required"))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => {
            return Err(invalid(
                "tool_choice",
                "tool_choice.type must be auto, any, tool or none",
            ));
        }
    };
    Ok((chat, parallel))
}

/// The chat's names, and the Messages API's for the same fields.
const RENAMED: &[(&str, &str)] = &[
    ("max_completion_tokens", "max_tokens"),
    ("stop", "stop_sequences"),
    ("response_format.json_schema", "output_config.format"),
    ("response_format", "output_config.format"),
    (".function.parameters", ".input_schema"),
    (".function.", "."),
];

/// The chat request a Messages request is, parsed and as a body.
pub(crate) fn chat_job(b: &MessagesBody) -> Result<(Job, bytes::Bytes), ServeError> {
    let stream = b.stream.unwrap_or(false);
    let (tool_choice, parallel) = match &b.tool_choice {
        Some(c) => {
            let (choice, parallel) = chat_tool_choice(c)?;
            (Some(choice), parallel)
        }
        None => (None, None),
    };
    let body = GenerateBody {
        model: b.model.clone(),
        messages: Some(chat_messages(b)?),
        max_completion_tokens: b.max_tokens.clone(),
        tools: b.tools.as_deref().map(chat_tools).transpose()?,
        tool_choice,
        parallel_tool_calls: parallel,
        temperature: b.temperature,
        top_p: b.top_p,
        top_k: b.top_k,
        stop: b.stop_sequences.clone().map(OneOrMany::Many),
        response_format: b
            .output_config
            .as_ref()
            .and_then(|c| c.format.as_ref())
            .map(response_format)
            .transpose()?,
        stream: Some(stream),
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
        ..GenerateBody::default()
    };
    chat_request(body).map_err(|e| renamed(e, RENAMED))
}

/// The `/tokenize` request a `count_tokens` request is (the conversation with its tools), as
/// a body.
pub(crate) fn count_request(b: &MessagesBody) -> Result<bytes::Bytes, ServeError> {
    let request = TokenizeRequest {
        model: b.model.clone(),
        messages: Some(chat_messages(b)?),
        tools: b.tools.as_deref().map(chat_tools).transpose()?,
        ..TokenizeRequest::default()
    };
    body_of(&request)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: Value) -> String {
        let parsed = parse(body.to_string().as_bytes(), false).and_then(|b| chat_job(&b));
        match parsed {
            Err(ServeError::InvalidParameter { param, .. }) => param,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn bad_fields_are_named_as_anthropic_names_them() {
        let ok =
            json!({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
        let with = |k: &str, v: Value| {
            let mut b = ok.clone();
            b[k] = v;
            b
        };
        assert!(
            parse(ok.to_string().as_bytes(), false)
                .and_then(|b| chat_job(&b))
                .is_ok()
        );
        for (body, expected) in [
            (json!({"model": "m", "messages": []}), "max_tokens"),
            (with("max_tokens", json!(-2)), "max_tokens"),
            (
                with("messages", json!([{"role": "system", "content": "x"}])),
                "messages[0].role",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "image", "source": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                with(
                    "messages",
                    json!([{"role": "user", "content": [{"type": "tool_use", "id": "a", "name": "f", "input": {}}]}]),
                ),
                "messages[0].content[0].type",
            ),
            (
                with("tools", json!([{"name": "f"}])),
                "tools[0].input_schema",
            ),
            (
                with(
                    "tools",
                    json!([{"type": "web_search_20250305", "name": "w"}]),
                ),
                "tools[0].type",
            ),
            (with("tool_choice", json!({"type": "maybe"})), "tool_choice"),
            (with("temperature", json!(9)), "temperature"),
            (
                with(
                    "thinking",
                    json!({"type": "enabled", "budget_tokens": 1024}),
                ),
                "thinking",
            ),
            (with("colour", json!(1)), "colour"),
        ] {
            assert_eq!(param(body.clone()), expected, "{body}");
        }
    }

    #[test]
    fn tool_use_and_tool_result_become_calls_and_tool_messages() {
        let b = parse(
            json!({
                "model": "m",
                "max_tokens": 5,
                "system": [{"type": "text", "text": "Be brief."}],
                "messages": [
                    {"role": "user", "content": "Weather in Paris?"},
                    {"role": "assistant", "content": [
                        {"type": "text", "text": "Looking."},
                        {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                        {"type": "text", "text": "And so?"},
                    ]},
                ],
            })
            .to_string()
            .as_bytes(),
            false,
        )
        .unwrap();
        let m = chat_messages(&b).unwrap();
        let roles: Vec<&str> = m.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        let call = &m[2].tool_calls.as_ref().unwrap()[0];
        assert_eq!(call.function.arguments, r#"{"city":"Paris"}"#);
        assert_eq!(m[3].tool_call_id.as_deref(), Some("toolu_1"));
    }
}
