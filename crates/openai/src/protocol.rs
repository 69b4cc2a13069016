//! The shapes of OpenAI's API that modelmux serves, as serde types. Requests refuse fields
//! they do not know (a client asking for something we would silently ignore gets a 400 that
//! names it); fields OpenAI defines that change nothing here (`user`) are accepted.

/// The fields only chat requests have.
pub(crate) const CHAT_ONLY: &[&str] = &[
    "messages",
    "max_completion_tokens",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];
/// The fields only completion requests have.
pub(crate) const COMPLETION_ONLY: &[&str] = &["prompt", "echo", "suffix", "best_of"];

use serde::{Deserialize, Serialize};

/// A string or a list of strings (`stop`, `prompt`).
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum OneOrMany<T> {
    One(T),
    Many(Vec<T>),
}

/// `stream_options`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamOptions {
    #[serde(default)]
    pub(crate) include_usage: bool,
}

/// One part of a message's content.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub(crate) enum ContentPart {
    Text { text: String },
}

/// A message's content: text, or a list of parts.
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum Content {
    Text(String),
    Parts(Vec<serde_json::Value>),
}

/// One message of `messages`.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Message {
    pub(crate) role: String,
    pub(crate) content: Option<Content>,
    /// A participant's name; on a `tool` message, the function's (some templates print it).
    pub(crate) name: Option<String>,
    /// An assistant's earlier calls.
    pub(crate) tool_calls: Option<Vec<ToolCallIn>>,
    /// On a `tool` message: the call it answers.
    pub(crate) tool_call_id: Option<String>,
    /// Output-only fields of an answer's message, which clients send back as they got them
    /// when they replay a conversation: accepted, not used.
    #[allow(dead_code)]
    pub(crate) refusal: Option<serde_json::Value>,
    #[allow(dead_code)]
    pub(crate) annotations: Option<serde_json::Value>,
}

/// One of an assistant message's `tool_calls`.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ToolCallIn {
    pub(crate) id: String,
    #[serde(rename = "type")]
    pub(crate) kind: String,
    pub(crate) function: FunctionCallIn,
}

/// The function of a [`ToolCallIn`]: its name and arguments as JSON text.
#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct FunctionCallIn {
    pub(crate) name: String,
    pub(crate) arguments: String,
}

/// `prompt` of a completion: text, token ids, or a list of either.
#[derive(Debug, Deserialize, Serialize)]
#[serde(untagged)]
pub(crate) enum PromptInput {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<i64>),
    TokenLists(Vec<Vec<i64>>),
}

/// The body of `POST /v1/chat/completions` and `POST /v1/completions`: one type for both, so
/// serde refuses unknown fields and names the path of a bad value; `params.rs` refuses
/// the fields of the other endpoint.
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GenerateBody {
    pub(crate) model: String,
    // Chat.
    pub(crate) messages: Option<Vec<Message>>,
    pub(crate) max_completion_tokens: Option<serde_json::Number>,
    pub(crate) top_logprobs: Option<serde_json::Value>,
    pub(crate) response_format: Option<serde_json::Value>,
    pub(crate) tools: Option<Vec<serde_json::Value>>,
    pub(crate) tool_choice: Option<serde_json::Value>,
    pub(crate) parallel_tool_calls: Option<bool>,
    // Completion.
    pub(crate) prompt: Option<PromptInput>,
    pub(crate) echo: Option<bool>,
    pub(crate) suffix: Option<String>,
    pub(crate) best_of: Option<serde_json::Number>,
    // Both.
    pub(crate) max_tokens: Option<serde_json::Number>,
    pub(crate) temperature: Option<f64>,
    pub(crate) top_p: Option<f64>,
    /// vLLM's extension: keep the `top_k` most likely tokens (-1 or 0: all).
    pub(crate) top_k: Option<i64>,
    pub(crate) n: Option<serde_json::Number>,
    pub(crate) stop: Option<OneOrMany<String>>,
    /// vLLM's extension.
    pub(crate) stop_token_ids: Option<Vec<i64>>,
    /// vLLM's extension.
    pub(crate) ignore_eos: Option<bool>,
    /// vLLM's extension: only requests with the same salt share cached prompt prefixes.
    pub(crate) cache_salt: Option<String>,
    pub(crate) seed: Option<i64>,
    pub(crate) stream: Option<bool>,
    pub(crate) stream_options: Option<StreamOptions>,
    pub(crate) frequency_penalty: Option<f64>,
    pub(crate) presence_penalty: Option<f64>,
    pub(crate) logprobs: Option<serde_json::Value>,
    pub(crate) logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
    #[allow(dead_code)] // accepted: an end-user id for the caller's own accounting
    pub(crate) user: Option<String>,
    /// Advisory in OpenAI's API (tags for stored completions): accepted, not used.
    #[allow(dead_code)]
    pub(crate) metadata: Option<serde_json::Map<String, serde_json::Value>>,
    /// Advisory in OpenAI's API (a processing tier): accepted, not used.
    #[allow(dead_code)]
    pub(crate) service_tier: Option<String>,
    /// Whether OpenAI should keep the completion: `false` is accepted; nothing is kept here,
    /// so `true` is refused.
    pub(crate) store: Option<bool>,
}

/// `POST /v1/embeddings`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct EmbeddingRequest {
    pub(crate) model: String,
    pub(crate) input: PromptInput,
    /// `float` (default) or `base64` (little-endian f32, what the official Python client asks
    /// for).
    pub(crate) encoding_format: Option<String>,
    pub(crate) dimensions: Option<serde_json::Number>,
    #[allow(dead_code)] // accepted: an end-user id for the caller's own accounting
    pub(crate) user: Option<String>,
}

/// `POST /tokenize` (vLLM's shape): a prompt or a conversation (with the tools it is shown).
#[derive(Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct TokenizeRequest {
    pub(crate) model: String,
    pub(crate) prompt: Option<String>,
    pub(crate) messages: Option<Vec<Message>>,
    /// The tools a conversation is shown, counted as a chat counts them (as vLLM's are).
    pub(crate) tools: Option<Vec<serde_json::Value>>,
    /// For `prompt`: add the beginning-of-sequence token as a completion would (default true).
    pub(crate) add_special_tokens: Option<bool>,
}

/// `POST /detokenize` (vLLM's shape).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DetokenizeRequest {
    pub(crate) model: String,
    pub(crate) tokens: Vec<i64>,
}

/// `usage` of every final answer.
#[derive(Clone, Copy, Debug, Serialize)]
pub(crate) struct UsageBody {
    pub(crate) prompt_tokens: usize,
    pub(crate) completion_tokens: usize,
    pub(crate) total_tokens: usize,
}

impl From<modelmux_llm::Usage> for UsageBody {
    fn from(u: modelmux_llm::Usage) -> Self {
        Self {
            prompt_tokens: u.prompt_tokens,
            completion_tokens: u.completion_tokens,
            total_tokens: u.prompt_tokens + u.completion_tokens,
        }
    }
}

/// One entry of `GET /v1/models`.
#[derive(Debug, Serialize)]
pub(crate) struct ModelCard {
    pub(crate) id: String,
    pub(crate) object: &'static str,
    pub(crate) created: u64,
    pub(crate) owned_by: &'static str,
    /// What it was loaded from (vLLM's field): the base model's name, an adapter's id, or the
    /// path an adapter's name was registered for.
    pub(crate) root: String,
    /// The base model an adapter applies to (`null` for the base model).
    pub(crate) parent: Option<String>,
    /// The longest sequence, in tokens (the base model's card only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) max_model_len: Option<usize>,
    /// The replicas holding it now (an extension: which adapters are warm where).
    pub(crate) loaded_on: Vec<String>,
}

/// Seconds since the Unix epoch, for `created`.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
