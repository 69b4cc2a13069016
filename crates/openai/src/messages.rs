//! `messages` of a chat request: roles checked, content parts joined, and the tool-calling
//! fields (an assistant's `tool_calls`, a tool's `tool_call_id`) in the shape chat templates
//! read.

use modelmux_llm::ChatMessage;
use modelmux_serve::ServeError;

use crate::params::invalid;
use crate::protocol::{Content, ContentPart, Message};

/// Checks and converts `messages`, naming the field at fault.
pub(crate) fn messages(list: Vec<Message>) -> Result<Vec<ChatMessage>, ServeError> {
    if list.is_empty() {
        return Err(invalid(
            "messages",
            "messages must hold at least one message",
        ));
    }
    list.into_iter()
        .enumerate()
        .map(|(i, m)| {
            let role = match m.role.as_str() {
                "system" | "user" | "assistant" | "tool" => m.role,
                // OpenAI's newer name for system instructions.
                "developer" => "system".to_owned(),
                other => {
                    return Err(invalid(
                        &format!("messages[{i}].role"),
                        format!(
                            "messages[{i}].role: '{other}' is not supported (use system, developer, user, assistant or tool)"
                        ),
                    ));
                }
            };
            let tool_calls = match m.tool_calls {
                Some(calls) if role == "assistant" => tool_calls(i, calls)?,
                Some(_) => {
                    return Err(invalid(
                        &format!("messages[{i}].tool_calls"),
                        format!("messages[{i}].tool_calls: only assistant messages make tool calls"),
                    ));
                }
                None => Vec::new(),
            };
            if role == "tool" && m.tool_call_id.is_none() {
                return Err(invalid(
                    &format!("messages[{i}].tool_call_id"),
                    format!("messages[{i}].tool_call_id is required on tool messages"),
                ));
            }
            let content = match m.content {
                None => String::new(),
                Some(Content::Text(t)) => t,
                Some(Content::Parts(parts)) => {
                    let mut text = String::new();
                    for (j, part) in parts.into_iter().enumerate() {
                        let param = format!("messages[{i}].content[{j}]");
                        match serde_json::from_value::<ContentPart>(part) {
                            Ok(ContentPart::Text { text: t }) => text.push_str(&t),
                            Err(e) => {
                                return Err(invalid(
                                    &param,
                                    format!("{param}: only text parts are supported: {e}"),
                                ));
                            }
                        }
                    }
                    text
                }
            };
            Ok(ChatMessage {
                tool_calls,
                tool_call_id: m.tool_call_id,
                name: m.name,
                ..ChatMessage::new(role, content)
            })
        })
        .collect()
}

/// An assistant's earlier calls as templates read them: arguments as an object when they
/// are a JSON object (Hugging Face templates print them with `tojson`), else as sent.
fn tool_calls(
    i: usize,
    calls: Vec<crate::protocol::ToolCallIn>,
) -> Result<Vec<serde_json::Value>, ServeError> {
    calls
        .into_iter()
        .enumerate()
        .map(|(j, call)| {
            if call.kind != "function" {
                let param = format!("messages[{i}].tool_calls[{j}].type");
                return Err(invalid(
                    &param,
                    format!("{param}: only 'function' calls exist, got '{}'", call.kind),
                ));
            }
            let arguments = serde_json::from_str::<serde_json::Value>(&call.function.arguments)
                .ok()
                .filter(serde_json::Value::is_object)
                .unwrap_or(serde_json::Value::String(call.function.arguments));
            Ok(serde_json::json!({
                "id": call.id,
                "type": "function",
                "function": {"name": call.function.name, "arguments": arguments},
            }))
        })
        .collect()
}
