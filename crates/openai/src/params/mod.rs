//! From a request body to what the engine runs, checking every field and naming the one at
//! fault (OpenAI's `param`). The ingress runs these checks before routing, so a bad request
//! never makes a replica load an adapter; the replica gets the parsed call (`call.rs`) and
//! parses again only a request that arrives without one.

use bytes::Bytes;
use modelmux_llm::{ChatMessage, Constraint, SamplingParams};
use modelmux_serve::ServeError;
use serde::de::DeserializeOwned;

use crate::limits::TemplateBytes;
use crate::messages::messages;
use crate::protocol::{
    CHAT_ONLY, COMPLETION_ONLY, DetokenizeRequest, EmbeddingRequest, GenerateBody, Message,
    PromptInput, StreamOptions, TokenizeRequest,
};
use crate::tools::Tools;

/// Which generation endpoint a request came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completion,
}

/// The prompt, before tokenizing.
#[derive(Debug)]
pub(crate) enum Prompt {
    Chat(Vec<ChatMessage>),
    Text(String),
    Tokens(Vec<u32>),
    /// Completions' batch (`prompt` a list of texts or of token lists, two or more): each
    /// a `Text` or `Tokens`, generated side by side, their choices in order (OpenAI's and
    /// vLLM's: prompt `p`'s choice `i` is choice `p * n + i`).
    Batch(Vec<Prompt>),
}

/// Prompts one completion request may batch.
pub(crate) const MAX_BATCH_PROMPTS: usize = 256;

/// A checked generation request.
#[derive(Debug)]
pub(crate) struct Job {
    /// `model` as the client wrote it (echoed in answers).
    pub(crate) model: String,
    pub(crate) prompt: Prompt,
    /// Sampling; `max_tokens` is filled in once the prompt's length is known if the request
    /// left it out.
    pub(crate) params: SamplingParams,
    pub(crate) max_tokens: Option<usize>,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// What the output must match, and the request field that asked for it.
    pub(crate) constraint: Option<(Constraint, &'static str)>,
    /// The tools offered (chat only).
    pub(crate) tools: Option<Tools>,
    /// What a chat hands its template, counted (zero for completions).
    pub(crate) template_bytes: TemplateBytes,
    /// Choices to generate (OpenAI's `n`).
    pub(crate) n: usize,
    /// Completions' `echo`: the answer starts with the prompt (and, with `logprobs`, its
    /// tokens' log probabilities).
    pub(crate) echo: bool,
}

/// A 400 naming `param`.
pub(crate) fn invalid(param: &str, message: impl Into<String>) -> ServeError {
    ServeError::InvalidParameter {
        param: param.to_owned(),
        message: message.into(),
    }
}

/// Checks a function or schema name as OpenAI does: 1 to 64 letters, digits, `_` or `-`.
pub(crate) fn check_name(param: &str, name: &str) -> Result<(), ServeError> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
    {
        return Err(invalid(
            param,
            format!("{param} must be 1 to 64 letters, digits, '_' or '-', got {name:?}"),
        ));
    }
    Ok(())
}

/// Parses JSON into `T`, naming the path of a bad value.
pub(crate) fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, ServeError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let parsed: T = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() || path == "." {
            ServeError::BadRequest {
                message: format!("the body is not a valid JSON request: {inner}"),
            }
        } else {
            invalid(&path, format!("{path}: {inner}"))
        }
    })?;
    de.end().map_err(|e| ServeError::BadRequest {
        message: format!("the body is not a valid JSON request: {e}"),
    })?;
    Ok(parsed)
}

fn whole(param: &str, n: &serde_json::Number, min: i64) -> Result<usize, ServeError> {
    match n.as_i64() {
        Some(v) if v >= min => usize::try_from(v).map_err(|_| invalid(param, "too large")),
        _ => Err(invalid(
            param,
            format!("{param} must be a whole number of at least {min}, got {n}"),
        )),
    }
}

fn token_ids(param: &str, ids: &[i64]) -> Result<Vec<u32>, ServeError> {
    ids.iter()
        .map(|&t| {
            u32::try_from(t).map_err(|_| invalid(param, format!("{param}: {t} is not a token id")))
        })
        .collect()
}

fn unsupported(param: &str, what: &str) -> ServeError {
    invalid(
        param,
        format!("{param}: {what} is not supported by this server"),
    )
}

/// A batch of two or more prompts, at most [`MAX_BATCH_PROMPTS`].
fn batch(
    prompts: impl Iterator<Item = Result<Prompt, ServeError>>,
) -> Result<Vec<Prompt>, ServeError> {
    let prompts: Vec<Prompt> = prompts.collect::<Result<_, _>>()?;
    if prompts.is_empty() {
        return Err(invalid("prompt", "prompt is an empty list"));
    }
    if prompts.len() > MAX_BATCH_PROMPTS {
        return Err(invalid(
            "prompt",
            format!(
                "a batch of {} prompts: at most {MAX_BATCH_PROMPTS} in one request",
                prompts.len()
            ),
        ));
    }
    Ok(prompts)
}

/// Parses and checks a chat or completion request. The fields are checked in a fixed order
/// (the first at fault is the one named): the endpoint's own fields, the body's shape, the
/// prompt, `n` and `best_of`, `suffix`, the penalties, `store`, the log probabilities,
/// `logit_bias`, the tools and the response format, the token limit, the sampling
/// distribution, the stop conditions, streaming, then the stop token ids' values and
/// `cache_salt`.
pub(crate) fn parse_job(endpoint: Endpoint, body: &[u8]) -> Result<Job, ServeError> {
    refuse_the_other_endpoints_fields(endpoint, body)?;
    job_of(endpoint, parse_body(body)?)
}

/// A chat request built by an API that translates into one (the Responses and Messages
/// APIs): checked as [`parse_job`] checks a body, with the body as JSON, which a replica
/// that gets the request without its parsed call (on another node) parses again.
pub(crate) fn chat_request(b: GenerateBody) -> Result<(Job, Bytes), ServeError> {
    let body = body_of(&b)?;
    Ok((job_of(Endpoint::Chat, b)?, body))
}

/// A request built by an API that translates into another, as the JSON body it would have
/// come with.
pub(crate) fn body_of(request: &impl serde::Serialize) -> Result<Bytes, ServeError> {
    let mut value = serde_json::to_value(request).map_err(|e| ServeError::BadRequest {
        message: format!("the request cannot be written as JSON: {e}"),
    })?;
    strip_nulls(&mut value);
    Ok(Bytes::from(value.to_string()))
}

/// Takes out the `null` fields a body leaves out: the body's and its messages' (not those
/// of schemas, where `null` means something).
fn strip_nulls(value: &mut serde_json::Value) {
    let Some(body) = value.as_object_mut() else {
        return;
    };
    body.retain(|_, v| !v.is_null());
    for message in body
        .get_mut("messages")
        .and_then(serde_json::Value::as_array_mut)
        .into_iter()
        .flatten()
    {
        if let Some(m) = message.as_object_mut() {
            m.retain(|_, v| !v.is_null());
        }
    }
}

/// Checks a parsed body as [`parse_job`] does.
fn job_of(endpoint: Endpoint, b: GenerateBody) -> Result<Job, ServeError> {
    let prompt = prompt(endpoint, b.messages, b.prompt)?;
    check_prompt(&prompt, b.echo)?;
    let n = choices(b.n.as_ref(), b.best_of.as_ref())?;
    let echo = b.echo == Some(true);
    if b.suffix.is_some() {
        return Err(unsupported("suffix", "a suffix (fill-in-the-middle)"));
    }
    let [presence_penalty, frequency_penalty] =
        sampling::penalties(b.presence_penalty, b.frequency_penalty)?;
    if b.store == Some(true) {
        return Err(unsupported("store", "storing completions"));
    }
    let logprobs = sampling::logprobs(endpoint, b.logprobs, b.top_logprobs)?;
    let logit_bias = sampling::logit_bias(b.logit_bias.unwrap_or_default())?;
    let (tools, constraint) = tools_and_constraint(
        b.tools,
        b.tool_choice,
        b.parallel_tool_calls,
        b.response_format,
    )?;
    // 0 only to score the prompt: `echo` with `logprobs` (what evaluation harnesses send).
    let max_tokens = sampling::max_tokens(
        endpoint,
        b.max_completion_tokens.as_ref(),
        b.max_tokens.as_ref(),
        echo && logprobs.is_some(),
    )?;
    let distribution = sampling::distribution(b.temperature, b.top_p, b.top_k)?;
    let (stop, stop_token_ids) = sampling::stops(b.stop, b.stop_token_ids)?;
    let (stream, include_usage) = streaming(b.stream, b.stream_options)?;
    let template_bytes = match &prompt {
        Prompt::Chat(m) => TemplateBytes::of(m, tools.as_ref()),
        _ => TemplateBytes::default(),
    };
    Ok(Job {
        model: b.model,
        prompt,
        params: SamplingParams {
            temperature: distribution.temperature,
            top_k: distribution.top_k,
            top_p: distribution.top_p,
            // Negative seeds are accepted (Python clients send them) and reinterpreted.
            seed: b.seed.map(|s| s as u64),
            max_tokens: max_tokens.unwrap_or(1),
            stop,
            stop_token_ids: token_ids("stop_token_ids", &stop_token_ids)?,
            ignore_eos: b.ignore_eos.unwrap_or(false),
            logit_bias,
            presence_penalty,
            frequency_penalty,
            logprobs,
            prompt_logprobs: if echo { logprobs } else { None },
            cache_salt: sampling::cache_salt(b.cache_salt)?,
        },
        max_tokens,
        stream,
        include_usage,
        constraint,
        tools,
        template_bytes,
        n,
        echo,
    })
}

/// Refuses a field of the other generation endpoint (a chat's `messages` sent to
/// completions, say), naming the endpoint it belongs to.
fn refuse_the_other_endpoints_fields(endpoint: Endpoint, body: &[u8]) -> Result<(), ServeError> {
    let other = match endpoint {
        Endpoint::Chat => COMPLETION_ONLY,
        Endpoint::Completion => CHAT_ONLY,
    };
    if let Some(k) = keys::first_key_in(body, other)? {
        let (this, that) = match endpoint {
            Endpoint::Chat => ("chat completions", "/v1/completions"),
            Endpoint::Completion => ("completions", "/v1/chat/completions"),
        };
        return Err(invalid(
            k,
            format!("{k} is not a field of {this} requests (it belongs to {that})"),
        ));
    }
    Ok(())
}

/// The prompt: a chat's `messages`, or a completion's `prompt` (a text, token ids, or a batch
/// of either; a list of one is that one).
fn prompt(
    endpoint: Endpoint,
    messages: Option<Vec<Message>>,
    prompt: Option<PromptInput>,
) -> Result<Prompt, ServeError> {
    Ok(match endpoint {
        Endpoint::Chat => Prompt::Chat(crate::messages::messages(
            messages.ok_or_else(|| invalid("messages", "messages is required"))?,
        )?),
        Endpoint::Completion => {
            match prompt.ok_or_else(|| invalid("prompt", "prompt is required"))? {
                PromptInput::Text(t) => Prompt::Text(t),
                PromptInput::Tokens(ids) => Prompt::Tokens(token_ids("prompt", &ids)?),
                PromptInput::Texts(mut many) if many.len() == 1 => {
                    Prompt::Text(many.pop().unwrap_or_default())
                }
                PromptInput::TokenLists(mut many) if many.len() == 1 => {
                    Prompt::Tokens(token_ids("prompt", &many.pop().unwrap_or_default())?)
                }
                PromptInput::Texts(many) => {
                    Prompt::Batch(batch(many.into_iter().map(|t| Ok(Prompt::Text(t))))?)
                }
                PromptInput::TokenLists(many) => Prompt::Batch(batch(
                    many.iter()
                        .map(|ids| token_ids("prompt", ids).map(Prompt::Tokens)),
                )?),
            }
        }
    })
}

/// What a prompt must be besides well-formed: no `echo` with a batch, and no empty list of
/// token ids, alone or in a batch.
fn check_prompt(prompt: &Prompt, echo: Option<bool>) -> Result<(), ServeError> {
    if matches!(prompt, Prompt::Batch(_)) && echo == Some(true) {
        return Err(unsupported("echo", "echo with a batch of prompts"));
    }
    let no_tokens = |p: &Prompt| matches!(p, Prompt::Tokens(ids) if ids.is_empty());
    if let Prompt::Batch(many) = prompt
        && many.iter().any(no_tokens)
    {
        return Err(invalid(
            "prompt",
            "each prompt must hold at least one token",
        ));
    }
    if let Prompt::Tokens(ids) = prompt
        && ids.is_empty()
    {
        return Err(invalid("prompt", "prompt must hold at least one token"));
    }
    Ok(())
}

/// How many choices to generate: `n` (default 1; checked against the engine's
/// `max_num_seqs` when it is submitted), with `best_of` at most 1.
fn choices(
    n: Option<&serde_json::Number>,
    best_of: Option<&serde_json::Number>,
) -> Result<usize, ServeError> {
    let n = match n {
        Some(n) => whole("n", n, 1)?,
        None => 1,
    };
    if let Some(n) = best_of
        && whole("best_of", n, 1)? != 1
    {
        return Err(unsupported("best_of", "more than one candidate"));
    }
    Ok(n)
}

/// What the output must match, and the request field that asked for it.
type Constrained = (Constraint, &'static str);

/// The tools offered, only if any are active, and what the output must match, with the field
/// that asked for it: a forced tool call (never with a `response_format`), a
/// `response_format` that an answer with tool calls allowed must also match, or a
/// `response_format` alone.
fn tools_and_constraint(
    tools: Option<Vec<serde_json::Value>>,
    tool_choice: Option<serde_json::Value>,
    parallel_tool_calls: Option<bool>,
    response_format: Option<serde_json::Value>,
) -> Result<(Option<Tools>, Option<Constrained>), ServeError> {
    let tools = crate::tools::parse(tools, tool_choice, parallel_tool_calls)?;
    let format = crate::structured::response_format(response_format)?;
    let constraint = match (&tools, format) {
        (Some(t), format) if t.active() && t.choice != crate::tools::ToolChoice::Auto => {
            if format.is_some() {
                return Err(invalid(
                    "response_format",
                    "response_format cannot apply when tool_choice forces a tool call",
                ));
            }
            t.constraint(None).map(|c| (c, "tools"))
        }
        (Some(t), Some(format)) if t.active() => {
            t.constraint(Some(&format)).map(|c| (c, "response_format"))
        }
        (_, format) => format.map(|c| (c, "response_format")),
    };
    Ok((tools.filter(Tools::active), constraint))
}

/// Whether to stream, and whether the stream ends with the usage (`stream_options`, allowed
/// only when streaming).
fn streaming(
    stream: Option<bool>,
    options: Option<StreamOptions>,
) -> Result<(bool, bool), ServeError> {
    let stream = stream.unwrap_or(false);
    if options.is_some() && !stream {
        return Err(invalid(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    Ok((stream, options.is_some_and(|o| o.include_usage)))
}

/// What `/tokenize` tokenizes.
pub(crate) enum TokenizeInput {
    Text {
        text: String,
        add_special: bool,
    },
    /// A conversation, and what it hands the chat template (counted as a chat's is), with
    /// the tools it is shown (Anthropic's `count_tokens` counts them).
    Chat(Vec<ChatMessage>, TemplateBytes, Option<Tools>),
}

/// Parses `/tokenize`.
pub(crate) fn parse_tokenize(body: &[u8]) -> Result<(String, TokenizeInput), ServeError> {
    let r: TokenizeRequest = parse_body(body)?;
    let input = match (r.prompt, r.messages) {
        (Some(text), None) => TokenizeInput::Text {
            text,
            add_special: r.add_special_tokens.unwrap_or(true),
        },
        (None, Some(m)) => {
            let messages = messages(m)?;
            let tools = crate::tools::parse(r.tools, None, None)?.filter(Tools::active);
            let bytes = TemplateBytes::of(&messages, tools.as_ref());
            TokenizeInput::Chat(messages, bytes, tools)
        }
        _ => {
            return Err(invalid(
                "prompt",
                "give either prompt or messages (one of them)",
            ));
        }
    };
    Ok((r.model, input))
}

/// The most inputs one `/v1/embeddings` request may hold.
pub(crate) const MAX_EMBEDDING_INPUTS: usize = 256;

/// A checked `/v1/embeddings` request.
pub(crate) struct EmbeddingJob {
    pub(crate) model: String,
    /// Texts or token ids, one embedding each.
    pub(crate) inputs: Vec<Prompt>,
    pub(crate) base64: bool,
}

/// Parses `/v1/embeddings`.
pub(crate) fn parse_embeddings(body: &[u8]) -> Result<EmbeddingJob, ServeError> {
    let r: EmbeddingRequest = parse_body(body)?;
    let inputs: Vec<Prompt> = match r.input {
        PromptInput::Text(t) => vec![Prompt::Text(t)],
        PromptInput::Texts(many) => many.into_iter().map(Prompt::Text).collect(),
        PromptInput::Tokens(ids) => vec![Prompt::Tokens(token_ids("input", &ids)?)],
        PromptInput::TokenLists(many) => many
            .iter()
            .map(|ids| token_ids("input", ids).map(Prompt::Tokens))
            .collect::<Result<_, _>>()?,
    };
    if inputs.is_empty() || inputs.len() > MAX_EMBEDDING_INPUTS {
        return Err(invalid(
            "input",
            format!(
                "input must hold 1 to {MAX_EMBEDDING_INPUTS} items, got {}",
                inputs.len()
            ),
        ));
    }
    if inputs.iter().any(|p| match p {
        Prompt::Text(t) => t.is_empty(),
        Prompt::Tokens(ids) => ids.is_empty(),
        Prompt::Chat(_) | Prompt::Batch(_) => false,
    }) {
        return Err(invalid("input", "an input is empty"));
    }
    if r.dimensions.is_some() {
        return Err(unsupported("dimensions", "shortening embeddings"));
    }
    let base64 = match r.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(invalid(
                "encoding_format",
                format!("encoding_format must be float or base64, got '{other}'"),
            ));
        }
    };
    Ok(EmbeddingJob {
        model: r.model,
        inputs,
        base64,
    })
}

/// Parses `/detokenize`.
pub(crate) fn parse_detokenize(body: &[u8]) -> Result<(String, Vec<u32>), ServeError> {
    let r: DetokenizeRequest = parse_body(body)?;
    Ok((r.model, token_ids("tokens", &r.tokens)?))
}

mod keys;
mod sampling;
#[cfg(test)]
mod tests;
