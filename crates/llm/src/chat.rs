//! Chat templates: the Jinja template a GGUF file carries (`tokenizer.chat_template`),
//! rendered with minijinja and its Python-compatibility methods (`.strip()`,
//! `.startswith()`, ...), as Hugging Face's `apply_chat_template` renders it.

use minijinja::{Environment, Error as JinjaError, ErrorKind as JinjaErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{LlmError, Result};

/// One message of a conversation, with the fields templates that present tools read.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message's text.
    pub content: String,
    /// An assistant's tool calls, as Hugging Face templates expect them:
    /// `{"type": "function", "function": {"name": ..., "arguments": {...}}, "id": ...}`
    /// (arguments as an object). Left out of the template's view when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<serde_json::Value>,
    /// On a `tool` message: the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// On a `tool` message: the function that answered (templates such as Llama 3's and
    /// Qwen's ignore it; others print it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message from `role`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    bos: String,
    eos: String,
    presents_tools: bool,
}

const NAME: &str = "chat";

impl ChatTemplate {
    /// Compiles `source`; `bos` and `eos` are the texts of the model's special tokens, which
    /// templates may use as `bos_token` / `eos_token`.
    pub fn new(source: &str, bos: &str, eos: &str) -> Result<Self> {
        let mut env = Environment::new();
        minijinja_contrib::add_to_environment(&mut env);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function(
            "raise_exception",
            |message: String| -> std::result::Result<Value, JinjaError> {
                Err(JinjaError::new(JinjaErrorKind::InvalidOperation, message))
            },
        );
        env.add_template_owned(NAME, source.to_owned())
            .map_err(|e| {
                LlmError::Text(format!("the model's chat template does not compile: {e}"))
            })?;
        Ok(Self {
            env,
            bos: bos.to_owned(),
            eos: eos.to_owned(),
            presents_tools: source.contains("tools"),
        })
    }

    /// Whether the template itself presents a `tools` list to the model (Llama 3.1+, Qwen2.5+,
    /// Mistral's and Hermes' templates do; SmolLM2's and Llama 2's do not).
    pub fn presents_tools(&self) -> bool {
        self.presents_tools
    }

    /// Renders `messages`; with `add_generation_prompt`, ends with the header of the
    /// assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with_tools(messages, None, add_generation_prompt)
    }

    /// Renders `messages` with `tools` (OpenAI's `tools` list, which Hugging Face templates
    /// read as is) in the template's `tools` variable; `None` leaves it undefined.
    pub fn render_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String> {
        if messages.is_empty() {
            return Err(LlmError::InvalidRequest(
                "messages must not be empty".into(),
            ));
        }
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| LlmError::Internal(e.to_string()))?;
        template
            .render(minijinja::context! {
                messages => messages,
                tools => tools.map_or(Value::UNDEFINED, Value::from_serialize),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos,
                eos_token => self.eos,
            })
            .map_err(|e| {
                let detail = e.detail().unwrap_or_default().to_owned();
                if e.kind() == JinjaErrorKind::InvalidOperation && !detail.is_empty() {
                    // raise_exception: the template rejected the conversation.
                    LlmError::InvalidRequest(detail)
                } else {
                    LlmError::Text(format!("rendering the chat template failed: {e}"))
                }
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn renders_chatml_with_a_default_system_prompt() {
        let t = ChatTemplate::new(CHATML, "<s>", "</s>").unwrap();
        let out = t.render(&[ChatMessage::new("user", "Hi")], true).unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_and_raise_exception_work() {
        let src = "{% if messages[0].role != 'user' %}{{ raise_exception('first message must be from the user') }}{% endif %}{{ bos_token }}{{ messages[0].content.strip().upper() }}";
        let t = ChatTemplate::new(src, "<s>", "</s>").unwrap();
        assert_eq!(
            t.render(&[ChatMessage::new("user", "  hi ")], false)
                .unwrap(),
            "<s>HI"
        );
        let err = t
            .render(&[ChatMessage::new("assistant", "x")], false)
            .unwrap_err();
        assert!(
            err.to_string()
                .contains("first message must be from the user"),
            "{err}"
        );
        assert!(ChatTemplate::new("{% for %}", "", "").is_err());
    }
}
