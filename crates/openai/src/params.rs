//! From a request body to what the engine runs, checking every field and naming the one at
//! fault (OpenAI's `param`). The ingress runs these checks before routing, so a bad request
//! never makes a replica load an adapter; the replica gets the parsed call (`call.rs`) and
//! parses again only a request that arrives without one.

use modelmux_llm::{
    ChatMessage, Constraint, MAX_LOGIT_BIAS, MAX_STOP_BYTES, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS,
    SamplingParams,
};
use modelmux_serve::ServeError;
use serde::de::DeserializeOwned;

use crate::limits::TemplateBytes;
use crate::messages::messages;
use crate::protocol::{
    CHAT_ONLY, COMPLETION_ONLY, DetokenizeRequest, EmbeddingRequest, GenerateBody, OneOrMany,
    PromptInput, TokenizeRequest,
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

/// `logit_bias`: token ids (as JSON object keys) to numbers from -100 to 100. The ids are
/// checked against the vocabulary with the rest of the sampling parameters.
fn logit_bias(
    map: serde_json::Map<String, serde_json::Value>,
) -> Result<Vec<(u32, f32)>, ServeError> {
    if map.len() > MAX_LOGIT_BIAS {
        return Err(invalid(
            "logit_bias",
            format!(
                "logit_bias may bias at most {MAX_LOGIT_BIAS} tokens, got {}",
                map.len()
            ),
        ));
    }
    map.into_iter()
        .map(|(key, value)| {
            let token = key.parse::<u32>().map_err(|_| {
                invalid(
                    "logit_bias",
                    format!("logit_bias: '{key}' is not a token id"),
                )
            })?;
            let bias = value
                .as_f64()
                .filter(|b| (-100.0..=100.0).contains(b))
                .ok_or_else(|| {
                    invalid(
                        "logit_bias",
                        format!("logit_bias: the bias of token {key} must be a number from -100 to 100, got {value}"),
                    )
                })?;
            Ok((token, bias as f32))
        })
        .collect()
}

/// How many alternatives to report with each token's log probability, or `None`: chat's
/// `logprobs: true` with `top_logprobs: 0..=20`, completions' `logprobs: 0..=20`.
fn logprobs(
    endpoint: Endpoint,
    logprobs: Option<serde_json::Value>,
    top: Option<serde_json::Value>,
) -> Result<Option<usize>, ServeError> {
    let max = modelmux_llm::MAX_TOP_LOGPROBS;
    let count = |param: &str, v: &serde_json::Value| match v.as_u64() {
        Some(n) if n as usize <= max => Ok(n as usize),
        _ => Err(invalid(
            param,
            format!("{param} must be a whole number from 0 to {max}, got {v}"),
        )),
    };
    match endpoint {
        Endpoint::Chat => {
            let on = match &logprobs {
                None | Some(serde_json::Value::Null) => false,
                Some(serde_json::Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(invalid(
                        "logprobs",
                        format!("logprobs must be true or false on chat completions, got {other}"),
                    ));
                }
            };
            let top = match &top {
                None | Some(serde_json::Value::Null) => None,
                Some(v) => Some(count("top_logprobs", v)?),
            };
            if top.is_some() && !on {
                return Err(invalid("top_logprobs", "top_logprobs needs logprobs: true"));
            }
            Ok(on.then(|| top.unwrap_or(0)))
        }
        Endpoint::Completion => match &logprobs {
            None | Some(serde_json::Value::Null) => Ok(None),
            Some(v) => count("logprobs", v).map(Some),
        },
    }
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

/// Parses and checks a chat or completion request.
pub(crate) fn parse_job(endpoint: Endpoint, body: &[u8]) -> Result<Job, ServeError> {
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
    let b: GenerateBody = parse_body(body)?;
    let prompt = match endpoint {
        Endpoint::Chat => Prompt::Chat(messages(
            b.messages
                .ok_or_else(|| invalid("messages", "messages is required"))?,
        )?),
        Endpoint::Completion => {
            match b
                .prompt
                .ok_or_else(|| invalid("prompt", "prompt is required"))?
            {
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
    };
    if matches!(prompt, Prompt::Batch(_)) && b.echo == Some(true) {
        return Err(unsupported("echo", "echo with a batch of prompts"));
    }
    let no_tokens = |p: &Prompt| matches!(p, Prompt::Tokens(ids) if ids.is_empty());
    if let Prompt::Batch(many) = &prompt
        && many.iter().any(no_tokens)
    {
        return Err(invalid(
            "prompt",
            "each prompt must hold at least one token",
        ));
    }
    if let Prompt::Tokens(ids) = &prompt
        && ids.is_empty()
    {
        return Err(invalid("prompt", "prompt must hold at least one token"));
    }
    // Checked against the engine's `max_num_seqs` when it is submitted.
    let n = match &b.n {
        Some(n) => whole("n", n, 1)?,
        None => 1,
    };
    if let Some(n) = &b.best_of
        && whole("best_of", n, 1)? != 1
    {
        return Err(unsupported("best_of", "more than one candidate"));
    }
    let echo = b.echo == Some(true);
    if b.suffix.is_some() {
        return Err(unsupported("suffix", "a suffix (fill-in-the-middle)"));
    }
    let mut penalties = [0.0f32; 2];
    for (slot, (param, value)) in penalties.iter_mut().zip([
        ("presence_penalty", b.presence_penalty),
        ("frequency_penalty", b.frequency_penalty),
    ]) {
        let value = value.unwrap_or(0.0);
        if !(-2.0..=2.0).contains(&value) {
            return Err(invalid(
                param,
                format!("{param} must be between -2 and 2, got {value}"),
            ));
        }
        *slot = value as f32;
    }
    if b.store == Some(true) {
        return Err(unsupported("store", "storing completions"));
    }
    let logprobs = logprobs(endpoint, b.logprobs, b.top_logprobs)?;
    let logit_bias = logit_bias(b.logit_bias.unwrap_or_default())?;
    let tools = crate::tools::parse(b.tools, b.tool_choice, b.parallel_tool_calls)?;
    let format = crate::structured::response_format(b.response_format)?;
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
    // 0 only to score the prompt: `echo` with `logprobs` (what evaluation harnesses send).
    let least = i64::from(!(echo && logprobs.is_some()));
    let max_tokens = match (&b.max_completion_tokens, &b.max_tokens) {
        (Some(n), _) => Some(whole("max_completion_tokens", n, least)?),
        (None, Some(n)) => Some(whole("max_tokens", n, least)?),
        // OpenAI's default for completions; chat defaults to the rest of the context.
        (None, None) if endpoint == Endpoint::Completion => Some(16),
        (None, None) => None,
    };
    let temperature = b.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(invalid(
            "temperature",
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = b.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(invalid(
            "top_p",
            format!("top_p must be greater than 0 and at most 1, got {top_p}"),
        ));
    }
    let top_k = match b.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        k => {
            return Err(invalid(
                "top_k",
                format!("top_k must be -1 or 0 (all) or positive, got {k}"),
            ));
        }
    };
    let stop = match b.stop {
        None => Vec::new(),
        Some(OneOrMany::One(s)) => vec![s],
        Some(OneOrMany::Many(v)) => v,
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(invalid(
            "stop",
            format!(
                "at most {MAX_STOP_STRINGS} stop strings, got {}",
                stop.len()
            ),
        ));
    }
    if stop
        .iter()
        .any(|s| s.is_empty() || s.len() > MAX_STOP_BYTES)
    {
        return Err(invalid(
            "stop",
            format!("stop strings must be 1 to {MAX_STOP_BYTES} bytes long"),
        ));
    }
    let stop_token_ids = b.stop_token_ids.unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(invalid(
            "stop_token_ids",
            format!(
                "stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {}",
                stop_token_ids.len()
            ),
        ));
    }
    let stream = b.stream.unwrap_or(false);
    if b.stream_options.is_some() && !stream {
        return Err(invalid(
            "stream_options",
            "stream_options is only allowed when stream is true",
        ));
    }
    let tools = tools.filter(Tools::active);
    let template_bytes = match &prompt {
        Prompt::Chat(m) => TemplateBytes::of(m, tools.as_ref()),
        _ => TemplateBytes::default(),
    };
    Ok(Job {
        model: b.model,
        prompt,
        params: SamplingParams {
            temperature: temperature as f32,
            top_k,
            top_p: top_p as f32,
            // Negative seeds are accepted (Python clients send them) and reinterpreted.
            seed: b.seed.map(|s| s as u64),
            max_tokens: max_tokens.unwrap_or(1),
            stop,
            stop_token_ids: token_ids("stop_token_ids", &stop_token_ids)?,
            ignore_eos: b.ignore_eos.unwrap_or(false),
            logit_bias,
            presence_penalty: penalties[0],
            frequency_penalty: penalties[1],
            logprobs,
            prompt_logprobs: if echo { logprobs } else { None },
            cache_salt: cache_salt(b.cache_salt)?,
        },
        max_tokens,
        stream,
        include_usage: b.stream_options.is_some_and(|o| o.include_usage),
        constraint,
        tools,
        template_bytes,
        n,
        echo,
    })
}

/// What `/tokenize` tokenizes.
pub(crate) enum TokenizeInput {
    Text {
        text: String,
        add_special: bool,
    },
    /// A conversation, and what it hands the chat template (counted as a chat's is).
    Chat(Vec<ChatMessage>, TemplateBytes),
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
            let bytes = TemplateBytes::of(&messages, None);
            TokenizeInput::Chat(messages, bytes)
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

/// The longest `cache_salt` accepted (it is kept with every cached prefix).
const MAX_CACHE_SALT: usize = 256;

/// `cache_salt`: non-empty, at most [`MAX_CACHE_SALT`] bytes.
fn cache_salt(salt: Option<String>) -> Result<Option<String>, ServeError> {
    match salt {
        Some(s) if s.is_empty() || s.len() > MAX_CACHE_SALT => Err(invalid(
            "cache_salt",
            format!("cache_salt must be 1 to {MAX_CACHE_SALT} bytes"),
        )),
        salt => Ok(salt),
    }
}

mod keys;
#[cfg(test)]
mod tests;
