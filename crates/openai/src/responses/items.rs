//! The items of a conversation in the Responses API (`input`, and the `output` of stored
//! responses): checked, naming the field at fault, kept in one canonical shape, and turned
//! into the chat messages the engine's chat template reads.
//!
//! The shapes: a message (`{"role", "content"}`, `type: "message"` optional; content a text or
//! a list of `input_text` / `output_text` parts), a `function_call` (`call_id`, `name`,
//! `arguments`) and a `function_call_output` (`call_id`, `output`).

use modelmux_serve::ServeError;
use serde_json::{Value, json};

use crate::params::invalid;
use crate::protocol::{Content, FunctionCallIn, Message, ToolCallIn};

/// Items one conversation may hold (its input and every earlier turn's).
pub(crate) const MAX_ITEMS: usize = 4096;

/// `input`: a text (one user message) or a list of items, each checked and made canonical.
pub(crate) fn input_items(input: Value) -> Result<Vec<Value>, ServeError> {
    match input {
        Value::String(text) => Ok(vec![message("user", &text, "input_text", None)]),
        Value::Array(items) => {
            if items.len() > MAX_ITEMS {
                return Err(invalid(
                    "input",
                    format!("input holds {} items: at most {MAX_ITEMS}", items.len()),
                ));
            }
            items
                .into_iter()
                .enumerate()
                .map(|(i, item)| canonical(&format!("input[{i}]"), item))
                .collect()
        }
        _ => Err(invalid(
            "input",
            "input must be a string or a list of items",
        )),
    }
}

/// A message item in the canonical shape.
pub(crate) fn message(role: &str, text: &str, part: &str, id: Option<&str>) -> Value {
    let mut item = json!({
        "type": "message",
        "role": role,
        "content": [{"type": part, "text": text}],
    });
    if let Some(id) = id {
        item["id"] = id.into();
    }
    item
}

fn string_field<'a>(item: &'a Value, at: &str, key: &str) -> Result<&'a str, ServeError> {
    item.get(key).and_then(Value::as_str).ok_or_else(|| {
        let param = format!("{at}.{key}");
        invalid(&param, format!("{param} is required and must be a string"))
    })
}

/// One item, checked (`at` names it: `input[2]`), in the canonical shape.
fn canonical(at: &str, item: Value) -> Result<Value, ServeError> {
    let Value::Object(fields) = &item else {
        return Err(invalid(at, format!("{at} must be an object")));
    };
    let kind = match fields.get("type") {
        None => "message",
        Some(Value::String(t)) => t.as_str(),
        Some(_) => {
            let param = format!("{at}.type");
            return Err(invalid(&param, format!("{param} must be a string")));
        }
    };
    let allowed: &[&str] = match kind {
        "message" => &["type", "role", "content", "id", "status"],
        "function_call" => &["type", "call_id", "name", "arguments", "id", "status"],
        "function_call_output" => &["type", "call_id", "output", "id", "status"],
        other => {
            let param = format!("{at}.type");
            return Err(invalid(
                &param,
                format!(
                    "{param}: '{other}' items are not supported (message, function_call and function_call_output are)"
                ),
            ));
        }
    };
    if let Some(k) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
        let param = format!("{at}.{k}");
        return Err(invalid(
            &param,
            format!("{param} is not a field of {kind} items"),
        ));
    }
    let id = fields.get("id").and_then(Value::as_str);
    match kind {
        "message" => {
            let role = string_field(&item, at, "role")?;
            if !["user", "assistant", "system", "developer"].contains(&role) {
                let param = format!("{at}.role");
                return Err(invalid(
                    &param,
                    format!(
                        "{param}: '{role}' is not a role (user, assistant, system or developer)"
                    ),
                ));
            }
            let part = if role == "assistant" {
                "output_text"
            } else {
                "input_text"
            };
            let text = content_text(at, item.get("content"))?;
            Ok(message(role, &text, part, id))
        }
        "function_call" => {
            let mut call = json!({
                "type": "function_call",
                "call_id": string_field(&item, at, "call_id")?,
                "name": string_field(&item, at, "name")?,
                "arguments": string_field(&item, at, "arguments")?,
            });
            if let Some(id) = id {
                call["id"] = id.into();
            }
            Ok(call)
        }
        _ => {
            let output = match item.get("output") {
                Some(Value::String(s)) => s.clone(),
                Some(parts @ Value::Array(_)) => content_text(at, Some(parts))?,
                _ => {
                    let param = format!("{at}.output");
                    return Err(invalid(
                        &param,
                        format!("{param} is required: a string or a list of text parts"),
                    ));
                }
            };
            Ok(json!({
                "type": "function_call_output",
                "call_id": string_field(&item, at, "call_id")?,
                "output": output,
            }))
        }
    }
}

/// A message's content as one text: a string, or text parts joined.
fn content_text(at: &str, content: Option<&Value>) -> Result<String, ServeError> {
    let param = format!("{at}.content");
    match content {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                let at = format!("{param}[{j}]");
                match part.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {}
                    Some(other) => {
                        return Err(invalid(
                            &format!("{at}.type"),
                            format!(
                                "{at}.type: '{other}' parts are not supported (this server reads text: input_text, output_text)"
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
                text.push_str(string_field(part, &at, "text")?);
            }
            Ok(text)
        }
        _ => Err(invalid(
            &param,
            format!("{param} is required: a string or a list of text parts"),
        )),
    }
}

/// The text of a canonical message item.
fn text_of(item: &Value) -> String {
    item["content"]
        .as_array()
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p["text"].as_str())
                .collect::<String>()
        })
        .unwrap_or_default()
}

/// The chat messages of a conversation: `instructions` first (a system message), then each
/// canonical item. Calls join the assistant message before them (a chat's assistant turn
/// holds its text and its calls); an output answers its call as a `tool` message.
pub(crate) fn chat_messages(instructions: Option<&str>, items: &[&Value]) -> Vec<Message> {
    let mut messages: Vec<Message> = Vec::with_capacity(items.len() + 1);
    if let Some(text) = instructions {
        messages.push(Message {
            role: "system".into(),
            content: Some(Content::Text(text.to_owned())),
            ..Message::default()
        });
    }
    for item in items {
        match item["type"].as_str() {
            Some("function_call") => {
                let call = ToolCallIn {
                    id: item["call_id"].as_str().unwrap_or_default().to_owned(),
                    kind: "function".into(),
                    function: FunctionCallIn {
                        name: item["name"].as_str().unwrap_or_default().to_owned(),
                        arguments: item["arguments"].as_str().unwrap_or_default().to_owned(),
                    },
                };
                match messages.last_mut() {
                    Some(last) if last.role == "assistant" => {
                        last.tool_calls.get_or_insert_with(Vec::new).push(call);
                    }
                    _ => messages.push(Message {
                        role: "assistant".into(),
                        tool_calls: Some(vec![call]),
                        ..Message::default()
                    }),
                }
            }
            Some("function_call_output") => messages.push(Message {
                role: "tool".into(),
                content: Some(Content::Text(
                    item["output"].as_str().unwrap_or_default().to_owned(),
                )),
                tool_call_id: item["call_id"].as_str().map(str::to_owned),
                ..Message::default()
            }),
            _ => messages.push(Message {
                role: item["role"].as_str().unwrap_or("user").to_owned(),
                content: Some(Content::Text(text_of(item))),
                ..Message::default()
            }),
        }
    }
    messages
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param_of(r: Result<Vec<Value>, ServeError>) -> String {
        match r {
            Err(ServeError::InvalidParameter { param, .. }) => param,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn items_are_checked_naming_the_field() {
        for (input, param) in [
            (json!(3), "input"),
            (json!([1]), "input[0]"),
            (json!([{"role": "robot", "content": "x"}]), "input[0].role"),
            (json!([{"role": "user"}]), "input[0].content"),
            (
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]),
                "input[1].content[0].type",
            ),
            (
                json!([{"type": "function_call", "call_id": "c", "name": "f"}]),
                "input[0].arguments",
            ),
            (
                json!([{"type": "function_call_output", "call_id": "c"}]),
                "input[0].output",
            ),
            (
                json!([{"type": "item_reference", "id": "x"}]),
                "input[0].type",
            ),
            (
                json!([{"role": "user", "content": "x", "colour": 1}]),
                "input[0].colour",
            ),
        ] {
            assert_eq!(param_of(input_items(input.clone())), param, "{input}");
        }
    }

    #[test]
    fn a_conversation_becomes_the_chat_it_is() {
        let items = input_items(json!([
            {"role": "user", "content": "What is the weather in Paris?"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Let me look."}]},
            {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ]))
        .unwrap();
        let refs: Vec<&Value> = items.iter().collect();
        let messages = chat_messages(Some("Be brief."), &refs);
        let roles: Vec<&str> = messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool"]);
        let calls = messages[2].tool_calls.as_ref().unwrap();
        assert_eq!(calls.len(), 1);
        assert_eq!(calls[0].function.name, "weather");
        assert!(matches!(&messages[2].content, Some(Content::Text(t)) if t == "Let me look."));
        assert_eq!(messages[3].tool_call_id.as_deref(), Some("call_1"));
        // A string input is one user message.
        let one = input_items(json!("Hi")).unwrap();
        assert_eq!(one, vec![message("user", "Hi", "input_text", None)]);
    }
}
