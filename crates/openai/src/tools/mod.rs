//! Tool calling in OpenAI's shape: the request's `tools`, `tool_choice` and
//! `parallel_tool_calls`, how tools reach the prompt, the grammar that forces a call when the
//! request demands one, and (in `calls.rs`) the calls read back out of the generated text.
//!
//! Calls are written the way Hermes-style templates (Qwen2.5, Qwen3, SmolLM3, Hermes) ask
//! models to write them, `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, and
//! read back in that shape or as one bare JSON object (Llama 3.x writes
//! `{"name": ..., "parameters": {...}}`). A template that does not present tools (SmolLM2's,
//! Llama 2's) gets the list and the format in a system message instead.

mod calls;

use modelmux_llm::{ChatMessage, Constraint};
use modelmux_serve::ServeError;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::params::{check_name, invalid};

pub(crate) use calls::{CallSplitter, ToolCall};

/// The most calls one answer may make when `parallel_tool_calls` allows several.
const MAX_PARALLEL_CALLS: usize = 8;

/// One function a request offers.
#[derive(Clone, Debug)]
pub(crate) struct Function {
    pub(crate) name: String,
    /// Its arguments' JSON schema (an object with no properties when the request gave none).
    pub(crate) parameters: Value,
}

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum ToolChoice {
    /// No call: the tools are not shown and the answer is text.
    None,
    /// The model decides; calls in its answer are read back.
    Auto,
    /// At least one call, forced by a grammar.
    Required,
    /// A call of this function, forced by a grammar.
    Named(String),
}

/// The tools of one request.
#[derive(Clone, Debug)]
pub(crate) struct Tools {
    pub(crate) functions: Vec<Function>,
    pub(crate) choice: ToolChoice,
    pub(crate) parallel: bool,
    /// `tools` as the request wrote it: templates read OpenAI's shape as is.
    pub(crate) listed: Vec<Value>,
}

#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
enum ToolIn {
    Function { function: FunctionIn },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FunctionIn {
    name: String,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    parameters: Option<Value>,
    #[allow(dead_code)] // every forced call is enforced, strict or not
    #[serde(default)]
    strict: Option<bool>,
}

/// Parses `tools`, `tool_choice` and `parallel_tool_calls`; `None` when no tool is offered.
pub(crate) fn parse(
    tools: Option<Vec<Value>>,
    choice: Option<Value>,
    parallel: Option<bool>,
) -> Result<Option<Tools>, ServeError> {
    let listed = tools.unwrap_or_default();
    if listed.is_empty() {
        return match choice {
            None => Ok(None),
            Some(Value::String(s)) if s == "none" => Ok(None),
            Some(_) => Err(invalid(
                "tool_choice",
                "tool_choice needs a non-empty tools list",
            )),
        };
    }
    let mut functions: Vec<Function> = Vec::with_capacity(listed.len());
    for (i, tool) in listed.iter().enumerate() {
        let param = format!("tools[{i}]");
        let ToolIn::Function { function } = serde_json::from_value(tool.clone())
            .map_err(|e| invalid(&param, format!("{param}: {e}")))?;
        check_name(&format!("{param}.function.name"), &function.name)?;
        if functions.iter().any(|f| f.name == function.name) {
            return Err(invalid(
                &format!("{param}.function.name"),
                format!(
                    "{param}.function.name: '{}' is offered twice",
                    function.name
                ),
            ));
        }
        let _ = function.description;
        let parameters = match function.parameters {
            None => json!({"type": "object", "properties": {}}),
            Some(p @ Value::Object(_)) => p,
            Some(other) => {
                return Err(invalid(
                    &format!("{param}.function.parameters"),
                    format!(
                        "{param}.function.parameters must be a JSON schema object, got {other}"
                    ),
                ));
            }
        };
        functions.push(Function {
            name: function.name,
            parameters,
        });
    }
    let choice = match choice {
        None => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => ToolChoice::None,
            "auto" => ToolChoice::Auto,
            "required" => ToolChoice::Required,
            other => {
                return Err(invalid(
                    "tool_choice",
                    format!(
                        "tool_choice: '{other}' is not one of none, auto, required or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"
                    ),
                ));
            }
        },
        Some(named) => {
            let name = named
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .filter(|_| named.get("type").and_then(Value::as_str) == Some("function"))
                .ok_or_else(|| {
                    invalid(
                        "tool_choice",
                        format!("tool_choice: expected {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {named}"),
                    )
                })?;
            if !functions.iter().any(|f| f.name == name) {
                return Err(invalid(
                    "tool_choice.function.name",
                    format!("tool_choice.function.name: '{name}' is not in tools"),
                ));
            }
            ToolChoice::Named(name.to_owned())
        }
    };
    Ok(Some(Tools {
        functions,
        choice,
        parallel: parallel.unwrap_or(true),
        listed,
    }))
}

impl Tools {
    /// Whether calls may appear in the answer.
    pub(crate) fn active(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The grammar the answer must follow: a call (or several) for `required` and a named
    /// function; for `auto` with a `response_format`, calls or the format's JSON; `None`
    /// for `auto` alone (the model writes freely and calls are read back) and for `none`.
    pub(crate) fn constraint(&self, response_format: Option<&Constraint>) -> Option<Constraint> {
        let calls = |functions: &[&Function], parallel: bool| {
            let schemas: Vec<Value> = functions
                .iter()
                .map(|f| {
                    json!({
                        "type": "object",
                        "properties": {"name": {"const": f.name}, "arguments": f.parameters},
                        "required": ["name", "arguments"],
                        "additionalProperties": false,
                    })
                })
                .collect();
            let schema = if schemas.len() == 1 {
                schemas.into_iter().next().unwrap_or_default()
            } else {
                json!({"anyOf": schemas})
            };
            let call = format!(
                "call: {} {} {}",
                modelmux_grammar::lark_literal("<tool_call>\n"),
                modelmux_grammar::lark_json(&schema),
                modelmux_grammar::lark_literal("\n</tool_call>")
            );
            let calls = if parallel {
                format!("calls: call (\"\\n\" call){{0,{}}}", MAX_PARALLEL_CALLS - 1)
            } else {
                "calls: call".to_owned()
            };
            format!("{calls}\n{call}\n")
        };
        let all: Vec<&Function> = self.functions.iter().collect();
        match &self.choice {
            ToolChoice::None => None,
            ToolChoice::Required => Some(Constraint::Lark(format!(
                "start: calls\n{}",
                calls(&all, self.parallel)
            ))),
            ToolChoice::Named(name) => {
                let named: Vec<&Function> = all.into_iter().filter(|f| &f.name == name).collect();
                Some(Constraint::Lark(format!(
                    "start: calls\n{}",
                    calls(&named, false)
                )))
            }
            ToolChoice::Auto => {
                let format = match response_format? {
                    Constraint::JsonObject => json!({"type": "object"}),
                    Constraint::JsonSchema(schema) => schema.clone(),
                    Constraint::Lark(_) => return None,
                };
                Some(Constraint::Lark(format!(
                    "start: calls | answer\nanswer: {}\n{}",
                    modelmux_grammar::lark_json(&format),
                    calls(&all, self.parallel)
                )))
            }
        }
    }

    /// The messages as a template that does not present tools should see them: the tools
    /// and the call format in the system message, earlier calls written out in that format,
    /// and tool results as user turns (such templates may refuse unknown roles).
    pub(crate) fn for_plain_template(&self, messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        let mut out = Vec::with_capacity(messages.len() + 1);
        let mut messages = messages.into_iter().peekable();
        let mut system = self.instructions();
        if let Some(first) = messages.next_if(|m| m.role == "system") {
            system = format!("{}\n\n{system}", first.content);
        }
        out.push(ChatMessage::new("system", system));
        for m in messages {
            match m.role.as_str() {
                "assistant" if !m.tool_calls.is_empty() => {
                    let mut text = m.content.clone();
                    for call in &m.tool_calls {
                        let f = &call["function"];
                        let written = json!({"name": f["name"], "arguments": f["arguments"]});
                        if !text.is_empty() {
                            text.push('\n');
                        }
                        text.push_str(&format!("<tool_call>\n{written}\n</tool_call>"));
                    }
                    out.push(ChatMessage::new("assistant", text));
                }
                "tool" => out.push(ChatMessage::new(
                    "user",
                    format!("<tool_response>\n{}\n</tool_response>", m.content),
                )),
                _ => out.push(m),
            }
        }
        out
    }

    /// The system text that presents the tools, for templates that do not.
    fn instructions(&self) -> String {
        let signatures: Vec<String> = self
            .listed
            .iter()
            .map(|tool| tool["function"].to_string())
            .collect();
        let how_many = if self.parallel {
            "one or more function calls"
        } else {
            "one function call"
        };
        format!(
            "You may call functions to answer. The functions, as JSON schemas:\n<tools>\n{}\n</tools>\n\nTo call, answer with {how_many}, each written as\n<tool_call>\n{{\"name\": <function name>, \"arguments\": <arguments as a JSON object>}}\n</tool_call>",
            signatures.join("\n")
        )
    }
}

#[cfg(test)]
mod tests;
