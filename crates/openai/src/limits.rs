//! How big a request may be before the replica spends work on it.
//!
//! Parsing counts the text a chat request hands the chat template ([`TemplateBytes`]: every
//! message's role, content, name, tool calls and tool call id, and the tools offered); the
//! replica compares that count with what its context can hold ([`PromptLimit`]) before it
//! compiles a grammar, renders the template or tokenizes, and refuses a longer request with a
//! 400 naming `messages` or `tools`. `/detokenize` takes at most the context's length of ids.

use modelmux_llm::ChatMessage;
use modelmux_serve::ServeError;

use crate::params::invalid;
use crate::tools::Tools;

/// The bytes of text one chat request hands the chat template, counted when it is parsed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TemplateBytes {
    /// Every message's role, content (all parts), name and tool call id, and its tool calls
    /// (id, function name and arguments) as the template reads them (JSON).
    pub(crate) messages: usize,
    /// The tools offered (name, description, parameters: each tool as JSON), when they are
    /// shown (not with `tool_choice: "none"`).
    pub(crate) tools: usize,
}

impl TemplateBytes {
    /// The count for `messages` and the tools shown with them.
    pub(crate) fn of(messages: &[ChatMessage], tools: Option<&Tools>) -> Self {
        Self {
            messages: messages.iter().map(message_bytes).sum(),
            tools: tools.map_or(0, |t| t.listed.iter().map(json_bytes).sum()),
        }
    }
}

fn message_bytes(m: &ChatMessage) -> usize {
    m.role.len()
        + m.content.len()
        + m.name.as_ref().map_or(0, String::len)
        + m.tool_call_id.as_ref().map_or(0, String::len)
        + m.tool_calls.iter().map(json_bytes).sum::<usize>()
}

/// The length of `value` written as JSON, counted without writing it.
fn json_bytes(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    // Writing to a counter cannot fail, nor can a `Value` refuse to be written.
    let _ = serde_json::to_writer(&mut count, value);
    count.0
}

/// What one replica's context holds.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PromptLimit {
    /// The longest text that can still fit: `max_model_len` tokens of the vocabulary's
    /// longest token.
    pub(crate) max_bytes: usize,
    /// `max_model_len`: the most tokens of one sequence, prompt and output together.
    pub(crate) context: usize,
}

impl PromptLimit {
    /// Refuses a prompt of `bytes` that cannot fit, naming `param`.
    pub(crate) fn bytes(&self, param: &str, bytes: usize) -> Result<(), ServeError> {
        if bytes > self.max_bytes {
            return Err(invalid(
                param,
                format!(
                    "the prompt ({bytes} bytes) cannot fit in the context of {} tokens",
                    self.context
                ),
            ));
        }
        Ok(())
    }

    /// Refuses a chat whose messages, or messages and tools, cannot fit: naming `messages`,
    /// or `tools` when the messages alone would.
    pub(crate) fn chat(&self, bytes: TemplateBytes) -> Result<(), ServeError> {
        self.bytes("messages", bytes.messages)?;
        self.bytes("tools", bytes.messages.saturating_add(bytes.tools))
    }

    /// Refuses a prompt of `tokens`, naming `param`, that leaves no room for output.
    pub(crate) fn tokens(&self, param: &str, tokens: usize) -> Result<(), ServeError> {
        if tokens >= self.context {
            return Err(invalid(
                param,
                format!(
                    "the prompt has {tokens} tokens, but the context holds {} (prompt and output together)",
                    self.context
                ),
            ));
        }
        Ok(())
    }

    /// Refuses more ids to decode (`/detokenize`'s `tokens`) than one sequence can hold.
    pub(crate) fn detokenize(&self, ids: usize) -> Result<(), ServeError> {
        if ids > self.context {
            return Err(invalid(
                "tokens",
                format!(
                    "tokens: at most {} ids (the model's context, max_model_len), got {ids}",
                    self.context
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::params::{Endpoint, parse_job};

    fn param(e: ServeError) -> String {
        match e {
            ServeError::InvalidParameter { param, .. } => param,
            other => panic!("not a 400 naming a parameter: {other}"),
        }
    }

    /// Every text the template reads is counted: a field left out would reach the template
    /// and the tokenizer however long it is.
    #[test]
    fn every_text_the_template_reads_is_counted() {
        let body = |messages: &str, extra: &str| {
            format!(r#"{{"model": "m", "messages": [{messages}]{extra}}}"#)
        };
        let bytes = |body: String| {
            parse_job(Endpoint::Chat, body.as_bytes())
                .unwrap()
                .template_bytes
        };
        let base = bytes(body(r#"{"role": "user", "content": "hi"}"#, "")).messages;
        assert_eq!(base, "user".len() + "hi".len());
        let long = "x".repeat(1000);
        for messages in [
            format!(r#"{{"role": "user", "content": "hi", "name": "{long}"}}"#),
            format!(
                r#"{{"role": "user", "content": [{{"type": "text", "text": "hi"}}, {{"type": "text", "text": "{long}"}}]}}"#
            ),
            format!(
                r#"{{"role": "user", "content": "hi"}}, {{"role": "assistant", "tool_calls": [{{"id": "{long}", "type": "function", "function": {{"name": "f", "arguments": "{{}}"}}}}]}}"#
            ),
            format!(
                r#"{{"role": "user", "content": "hi"}}, {{"role": "assistant", "tool_calls": [{{"id": "1", "type": "function", "function": {{"name": "{}", "arguments": "{{}}"}}}}]}}"#,
                &long[..60]
            ),
            format!(
                r#"{{"role": "user", "content": "hi"}}, {{"role": "assistant", "tool_calls": [{{"id": "1", "type": "function", "function": {{"name": "f", "arguments": "{{\"a\": \"{long}\"}}"}}}}]}}"#
            ),
            format!(
                r#"{{"role": "user", "content": "hi"}}, {{"role": "tool", "tool_call_id": "{long}", "content": "r"}}"#
            ),
        ] {
            let counted = bytes(body(&messages, ""));
            let least = if messages.contains(&long) {
                base + 1000
            } else {
                base + 60
            };
            assert!(counted.messages >= least, "{counted:?}: {messages}");
            assert_eq!(counted.tools, 0);
        }
        let tools = |choice: &str| {
            format!(
                r#", "tools": [{{"type": "function", "function": {{"name": "f", "description": "{long}", "parameters": {{"type": "object", "properties": {{"{long}": {{"type": "string"}}}}}}}}}}]{choice}"#
            )
        };
        let user = r#"{"role": "user", "content": "hi"}"#;
        let shown = bytes(body(user, &tools("")));
        assert_eq!(shown.messages, base);
        assert!(shown.tools >= 2000, "{shown:?}");
        // Tools not shown are not counted.
        let hidden = bytes(body(user, &tools(r#", "tool_choice": "none""#)));
        assert_eq!(hidden.tools, 0, "{hidden:?}");
    }

    #[test]
    fn each_limit_names_its_field() {
        let limit = PromptLimit {
            max_bytes: 100,
            context: 10,
        };
        let chat = |messages, tools| limit.chat(TemplateBytes { messages, tools });
        chat(60, 40).unwrap();
        assert_eq!(param(chat(101, 0).unwrap_err()), "messages");
        assert_eq!(param(chat(60, 41).unwrap_err()), "tools");
        assert_eq!(param(chat(usize::MAX, usize::MAX).unwrap_err()), "messages");
        limit.tokens("messages", 9).unwrap();
        assert_eq!(param(limit.tokens("messages", 10).unwrap_err()), "messages");
        limit.detokenize(10).unwrap();
        assert_eq!(param(limit.detokenize(11).unwrap_err()), "tokens");
    }
}
