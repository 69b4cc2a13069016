//! Tool calls read back out of generated text, the same way whether the answer streams or
//! not: [`CallSplitter`] lets text through until a call begins, then holds the rest and
//! parses it at the end. A streamed answer's content and calls are therefore exactly the
//! non-streamed answer's.

use serde_json::{Value, json};

use super::Function;

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// One call of a function.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ToolCall {
    pub(crate) name: String,
    /// The arguments as JSON text (OpenAI's `arguments` is a string).
    pub(crate) arguments: String,
}

impl ToolCall {
    /// OpenAI's shape, with id `call_<index>_<request id>`.
    pub(crate) fn to_json(&self, index: usize, request_id: &str) -> Value {
        json!({
            "id": format!("call_{index}_{request_id}"),
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Only whitespace so far: it may still open with a call or a JSON object.
    Start,
    /// Text: let through, but for a tail that may begin `<tool_call>`.
    Text,
    /// A `<tool_call>` began: everything from it on is held.
    Calls,
    /// The answer opened with `{` or `[`: it may be a bare JSON call; held to the end.
    Json,
}

/// Splits an answer into content and calls, as it streams.
#[derive(Debug)]
pub(crate) struct CallSplitter {
    functions: Vec<Function>,
    mode: Mode,
    /// Text not let through yet.
    held: String,
}

impl CallSplitter {
    /// For an answer that may call `functions`.
    pub(crate) fn new(functions: &[Function]) -> Self {
        Self {
            functions: functions.to_vec(),
            mode: Mode::Start,
            held: String::new(),
        }
    }

    /// Takes the next piece of text; returns the content that can go out now.
    pub(crate) fn push(&mut self, text: &str) -> String {
        self.held.push_str(text);
        if self.mode == Mode::Start {
            let trimmed = self.held.trim_start();
            if trimmed.is_empty() {
                return String::new();
            }
            if trimmed.starts_with('{') || trimmed.starts_with('[') {
                self.mode = Mode::Json;
            } else if trimmed.starts_with(OPEN) {
                self.mode = Mode::Calls;
            } else if OPEN.starts_with(trimmed) {
                return String::new();
            } else {
                self.mode = Mode::Text;
            }
        }
        match self.mode {
            Mode::Text => {
                if let Some(at) = self.held.find(OPEN) {
                    self.mode = Mode::Calls;
                    let rest = self.held.split_off(at);
                    return std::mem::replace(&mut self.held, rest);
                }
                let keep = longest_tail_opening(&self.held);
                let rest = self.held.split_off(self.held.len() - keep);
                std::mem::replace(&mut self.held, rest)
            }
            _ => String::new(),
        }
    }

    /// The end of the answer: the content still held, and the calls.
    pub(crate) fn finish(self) -> (String, Vec<ToolCall>) {
        let parsed = match self.mode {
            Mode::Calls => self.tagged_calls(),
            Mode::Json => self.bare_calls(),
            Mode::Start | Mode::Text => None,
        };
        match parsed {
            Some(calls) if !calls.is_empty() => (String::new(), calls),
            // Not calls after all (or cut short): it was text.
            _ => (self.held, Vec::new()),
        }
    }

    /// `<tool_call>{...}</tool_call>` blocks with only whitespace around them. The last
    /// one's closing tag may be missing (generation ended on it); after complete calls, a
    /// last block cut short by `max_tokens` is dropped.
    fn tagged_calls(&self) -> Option<Vec<ToolCall>> {
        let mut calls = Vec::new();
        let mut rest = self.held.trim();
        while !rest.is_empty() {
            rest = rest.strip_prefix(OPEN)?;
            let (body, after, closed) = match rest.find(CLOSE) {
                Some(at) => (&rest[..at], &rest[at + CLOSE.len()..], true),
                None => (rest, "", false),
            };
            let call = serde_json::from_str(body.trim())
                .ok()
                .and_then(|v| self.call(&v));
            match call {
                Some(call) => calls.push(call),
                None if !closed && !calls.is_empty() => break,
                None => return None,
            }
            rest = after.trim_start();
        }
        Some(calls)
    }

    /// A whole answer that is one call object, or a list of them.
    fn bare_calls(&self) -> Option<Vec<ToolCall>> {
        match serde_json::from_str::<Value>(self.held.trim()).ok()? {
            Value::Array(items) => items.iter().map(|v| self.call(v)).collect(),
            object => Some(vec![self.call(&object)?]),
        }
    }

    /// `{"name": ..., "arguments": {...}}` (or `"parameters"`, or arguments as JSON text) of
    /// an offered function.
    fn call(&self, value: &Value) -> Option<ToolCall> {
        let object = value.as_object()?;
        let name = object.get("name")?.as_str()?;
        self.functions.iter().find(|f| f.name == name)?;
        let arguments = match object.get("arguments").or_else(|| object.get("parameters")) {
            Some(Value::String(text)) => {
                serde_json::from_str::<Value>(text).ok()?.as_object()?;
                text.clone()
            }
            Some(args @ Value::Object(_)) => args.to_string(),
            None => "{}".to_owned(),
            Some(_) => return None,
        };
        Some(ToolCall {
            name: name.to_owned(),
            arguments,
        })
    }
}

/// The length of the longest tail of `text` that is a proper beginning of `<tool_call>`.
fn longest_tail_opening(text: &str) -> usize {
    (1..OPEN.len().min(text.len() + 1))
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && OPEN.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}
