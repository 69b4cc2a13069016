//! `POST /v1/responses`, parsed: the body's own fields, and the chat request it becomes (its
//! fields named as the Responses API names them when they are at fault).

use modelmux_serve::ServeError;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::params::{Job, chat_request, invalid, parse_body};
use crate::protocol::{GenerateBody, Message, StreamOptions};

/// The body of `POST /v1/responses`. Unknown fields are refused by name.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ResponsesBody {
    pub(crate) model: String,
    pub(crate) input: Option<Value>,
    pub(crate) instructions: Option<String>,
    pub(crate) tools: Option<Vec<Value>>,
    pub(crate) tool_choice: Option<Value>,
    pub(crate) parallel_tool_calls: Option<bool>,
    pub(crate) text: Option<TextOptions>,
    pub(crate) max_output_tokens: Option<serde_json::Number>,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f64>,
    pub(crate) stream: Option<bool>,
    pub(crate) store: Option<bool>,
    pub(crate) previous_response_id: Option<String>,
    pub(crate) metadata: Option<serde_json::Map<String, Value>>,
    /// Accepted: an end-user id for the caller's own accounting.
    pub(crate) user: Option<String>,
    /// Accepted: only `disabled` (a conversation longer than the context is refused, never
    /// cut).
    pub(crate) truncation: Option<String>,
    /// Advisory in OpenAI's API: accepted, not used.
    #[allow(dead_code)]
    pub(crate) service_tier: Option<String>,
    /// Extra output OpenAI can include: none is supported, so only an empty list.
    pub(crate) include: Option<Vec<String>>,
    /// Reasoning options: this engine does not reason apart from its answer; only `null`.
    pub(crate) reasoning: Option<Value>,
    /// Runs in the background: not supported (only `false`).
    pub(crate) background: Option<bool>,
}

/// `text`: the answer's format.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TextOptions {
    pub(crate) format: Option<Value>,
    /// Accepted: advice on length, which a sampler cannot follow.
    #[allow(dead_code)]
    pub(crate) verbosity: Option<String>,
}

/// Parses the body and refuses what this server does not do.
pub(crate) fn parse(body: &[u8]) -> Result<ResponsesBody, ServeError> {
    let b: ResponsesBody = parse_body(body)?;
    if b.background == Some(true) {
        return Err(invalid(
            "background",
            "background: running a response in the background is not supported by this server",
        ));
    }
    if b.reasoning.as_ref().is_some_and(|r| !r.is_null()) {
        return Err(invalid(
            "reasoning",
            "reasoning: this server's models answer without a separate reasoning phase",
        ));
    }
    if let Some(first) = b.include.as_ref().and_then(|i| i.first()) {
        return Err(invalid(
            "include",
            format!("include: '{first}' is not supported by this server"),
        ));
    }
    if let Some(t) = b.truncation.as_deref().filter(|t| *t != "disabled") {
        return Err(invalid(
            "truncation",
            format!("truncation: '{t}' is not supported (only 'disabled')"),
        ));
    }
    if b.input.is_none() && b.previous_response_id.is_none() {
        return Err(invalid("input", "input is required"));
    }
    Ok(b)
}

/// `tools` in the chat's shape: each `{"type": "function", "name", ...}` as
/// `{"type": "function", "function": {"name", ...}}`.
fn chat_tools(tools: &[Value]) -> Result<Vec<Value>, ServeError> {
    tools
        .iter()
        .enumerate()
        .map(|(i, tool)| {
            let at = format!("tools[{i}]");
            match tool.get("type").and_then(Value::as_str) {
                Some("function") => {}
                Some(other) => {
                    return Err(invalid(
                        &format!("{at}.type"),
                        format!(
                            "{at}.type: '{other}' tools are not supported (function tools are)"
                        ),
                    ));
                }
                None => {
                    return Err(invalid(
                        &format!("{at}.type"),
                        format!("{at}.type is required"),
                    ));
                }
            }
            let mut function = tool.as_object().cloned().unwrap_or_default();
            function.remove("type");
            Ok(json!({"type": "function", "function": function}))
        })
        .collect()
}

/// `tool_choice` in the chat's shape.
fn chat_tool_choice(choice: Value) -> Result<Value, ServeError> {
    match &choice {
        Value::String(_) => Ok(choice),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("tool_choice.name", "tool_choice.name is required"))?;
            Ok(json!({"type": "function", "function": {"name": name}}))
        }
        _ => Err(invalid(
            "tool_choice",
            "tool_choice must be 'auto', 'none', 'required' or {\"type\": \"function\", \"name\": ...}",
        )),
    }
}

/// `text.format` as the chat's `response_format`.
fn response_format(format: Value) -> Result<Value, ServeError> {
    let Value::Object(mut o) = format else {
        return Err(invalid("text.format", "text.format must be an object"));
    };
    match o.get("type").and_then(Value::as_str) {
        Some("json_schema") => {
            o.remove("type");
            Ok(json!({"type": "json_schema", "json_schema": o}))
        }
        _ => Ok(Value::Object(o)),
    }
}

/// The names the chat's checks use, and the Responses API's for the same fields.
const RENAMED: &[(&str, &str)] = &[
    ("response_format.json_schema", "text.format"),
    ("response_format", "text.format"),
    ("max_completion_tokens", "max_output_tokens"),
    ("max_tokens", "max_output_tokens"),
    ("messages", "input"),
    (".function.", "."),
];

/// `e` with the chat's field names replaced by the Responses API's.
pub(crate) fn renamed(e: ServeError, names: &[(&str, &str)]) -> ServeError {
    match e {
        ServeError::InvalidParameter {
            mut param,
            mut message,
        } => {
            for (chat, ours) in names {
                param = param.replace(chat, ours);
                message = message.replace(chat, ours);
            }
            ServeError::InvalidParameter { param, message }
        }
        other => other,
    }
}

/// The chat request a Responses request is: `messages` (the conversation so far), its
/// sampling, tools and format. One choice, usage at the end of a stream.
pub(crate) fn chat_job(
    b: &ResponsesBody,
    messages: Vec<Message>,
) -> Result<(Job, bytes::Bytes), ServeError> {
    let stream = b.stream.unwrap_or(false);
    let body = GenerateBody {
        model: b.model.clone(),
        messages: Some(messages),
        max_completion_tokens: b.max_output_tokens.clone(),
        tools: b.tools.as_deref().map(chat_tools).transpose()?,
        tool_choice: b.tool_choice.clone().map(chat_tool_choice).transpose()?,
        parallel_tool_calls: b.parallel_tool_calls,
        response_format: b
            .text
            .as_ref()
            .and_then(|t| t.format.clone())
            .map(response_format)
            .transpose()?,
        temperature: b.temperature,
        top_p: b.top_p,
        stream: Some(stream),
        stream_options: stream.then_some(StreamOptions {
            include_usage: true,
        }),
        ..GenerateBody::default()
    };
    chat_request(body).map_err(|e| renamed(e, RENAMED))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(body: Value) -> String {
        let parsed = parse(body.to_string().as_bytes()).and_then(|b| {
            let items = b
                .input
                .clone()
                .map(super::super::items::input_items)
                .transpose()?
                .unwrap_or_default();
            let refs: Vec<&Value> = items.iter().collect();
            let messages = super::super::items::chat_messages(None, &refs);
            chat_job(&b, messages).map(|_| ())
        });
        match parsed {
            Err(ServeError::InvalidParameter { param, .. }) => param,
            other => panic!("{body}: {other:?}"),
        }
    }

    #[test]
    fn bad_fields_are_named_as_the_responses_api_names_them() {
        let base = |extra: Value| {
            let mut b = json!({"model": "m", "input": "hi"});
            b.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            b
        };
        for (extra, expected) in [
            (json!({"max_output_tokens": -1}), "max_output_tokens"),
            (json!({"text": {"format": {"type": "yaml"}}}), "text.format"),
            (
                json!({"text": {"format": {"type": "json_schema", "name": "bad name", "schema": {}}}}),
                "text.format.name",
            ),
            (json!({"tools": [{"type": "web_search"}]}), "tools[0].type"),
            (
                json!({"tools": [{"type": "function", "name": "has space"}]}),
                "tools[0].name",
            ),
            (json!({"temperature": -1}), "temperature"),
            (json!({"background": true}), "background"),
            (json!({"truncation": "auto"}), "truncation"),
            (json!({"frobnicate": 1}), "frobnicate"),
        ] {
            assert_eq!(param(base(extra.clone())), expected, "{extra}");
        }
        assert_eq!(param(json!({"model": "m"})), "input");
    }

    #[test]
    fn a_request_becomes_its_chat() {
        let b = parse(
            json!({
                "model": "base:pirate",
                "input": "hi",
                "max_output_tokens": 7,
                "temperature": 0,
                "stream": true,
                "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
                "tool_choice": {"type": "function", "name": "f"},
            })
            .to_string()
            .as_bytes(),
        )
        .unwrap();
        let job = chat_job(&b, vec![]).err();
        // No messages: the chat's own check, named as input.
        assert!(
            matches!(job, Some(ServeError::InvalidParameter { param, .. }) if param == "input")
        );
        let messages = super::super::items::chat_messages(
            None,
            &[&super::super::items::message(
                "user",
                "hi",
                "input_text",
                None,
            )],
        );
        let (job, body) = chat_job(&b, messages).unwrap();
        // The body a replica elsewhere parses is the chat request itself.
        assert!(crate::params::parse_job(crate::params::Endpoint::Chat, &body).is_ok());
        assert_eq!(job.max_tokens, Some(7));
        assert!(job.stream && job.include_usage);
        assert!(job.tools.is_some() && job.constraint.is_some());
    }
}
