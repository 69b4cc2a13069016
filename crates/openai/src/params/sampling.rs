//! The fields of a generation request that become its [`SamplingParams`]: the penalties, the
//! log probabilities, `logit_bias`, the token limit, the sampling distribution, the stop
//! conditions and `cache_salt`. [`parse_job`](super::parse_job) calls them in its order of
//! checks.
//!
//! [`SamplingParams`]: modelmux_llm::SamplingParams

use modelmux_llm::{MAX_LOGIT_BIAS, MAX_STOP_BYTES, MAX_STOP_STRINGS, MAX_STOP_TOKEN_IDS};
use modelmux_serve::ServeError;

use super::{Endpoint, invalid, whole};
use crate::protocol::OneOrMany;

/// `presence_penalty` and `frequency_penalty`, in that order: each from -2 to 2, default 0.
pub(super) fn penalties(
    presence: Option<f64>,
    frequency: Option<f64>,
) -> Result<[f32; 2], ServeError> {
    let mut penalties = [0.0f32; 2];
    for (slot, (param, value)) in penalties.iter_mut().zip([
        ("presence_penalty", presence),
        ("frequency_penalty", frequency),
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
    Ok(penalties)
}

/// How many alternatives to report with each token's log probability, or `None`: chat's
/// `logprobs: true` with `top_logprobs: 0..=20`, completions' `logprobs: 0..=20`.
pub(super) fn logprobs(
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

/// `logit_bias`: token ids (as JSON object keys) to numbers from -100 to 100. The ids are
/// checked against the vocabulary with the rest of the sampling parameters.
pub(super) fn logit_bias(
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

/// The most tokens to generate: `max_completion_tokens`, else `max_tokens` (at least 1, or 0
/// when only the prompt is scored: `scoring`), else 16 for completions (OpenAI's default) and
/// none for chat (the rest of the context).
pub(super) fn max_tokens(
    endpoint: Endpoint,
    max_completion_tokens: Option<&serde_json::Number>,
    max_tokens: Option<&serde_json::Number>,
    scoring: bool,
) -> Result<Option<usize>, ServeError> {
    let least = i64::from(!scoring);
    Ok(match (max_completion_tokens, max_tokens) {
        (Some(n), _) => Some(whole("max_completion_tokens", n, least)?),
        (None, Some(n)) => Some(whole("max_tokens", n, least)?),
        // OpenAI's default for completions; chat defaults to the rest of the context.
        (None, None) if endpoint == Endpoint::Completion => Some(16),
        (None, None) => None,
    })
}

/// The distribution tokens are drawn from.
pub(super) struct Distribution {
    pub(super) temperature: f32,
    pub(super) top_p: f32,
    /// 0: all tokens.
    pub(super) top_k: usize,
}

/// `temperature` (0 to 2, default 1), `top_p` (above 0, at most 1, default 1) and `top_k`
/// (-1 or 0 for all, default all), checked in that order.
pub(super) fn distribution(
    temperature: Option<f64>,
    top_p: Option<f64>,
    top_k: Option<i64>,
) -> Result<Distribution, ServeError> {
    let temperature = temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(invalid(
            "temperature",
            format!("temperature must be between 0 and 2, got {temperature}"),
        ));
    }
    let top_p = top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(invalid(
            "top_p",
            format!("top_p must be greater than 0 and at most 1, got {top_p}"),
        ));
    }
    let top_k = match top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        k => {
            return Err(invalid(
                "top_k",
                format!("top_k must be -1 or 0 (all) or positive, got {k}"),
            ));
        }
    };
    Ok(Distribution {
        temperature: temperature as f32,
        top_p: top_p as f32,
        top_k,
    })
}

/// The stop strings (`stop`: one or a list, at most [`MAX_STOP_STRINGS`], each 1 to
/// [`MAX_STOP_BYTES`] bytes) and the stop token ids (`stop_token_ids`, at most
/// [`MAX_STOP_TOKEN_IDS`]; their values are checked last of all the request's fields).
pub(super) fn stops(
    stop: Option<OneOrMany<String>>,
    stop_token_ids: Option<Vec<i64>>,
) -> Result<(Vec<String>, Vec<i64>), ServeError> {
    let stop = match stop {
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
    let stop_token_ids = stop_token_ids.unwrap_or_default();
    if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
        return Err(invalid(
            "stop_token_ids",
            format!(
                "stop_token_ids may hold at most {MAX_STOP_TOKEN_IDS} ids, got {}",
                stop_token_ids.len()
            ),
        ));
    }
    Ok((stop, stop_token_ids))
}

/// The longest `cache_salt` accepted (it is kept with every cached prefix).
const MAX_CACHE_SALT: usize = 256;

/// `cache_salt`: non-empty, at most [`MAX_CACHE_SALT`] bytes.
pub(super) fn cache_salt(salt: Option<String>) -> Result<Option<String>, ServeError> {
    match salt {
        Some(s) if s.is_empty() || s.len() > MAX_CACHE_SALT => Err(invalid(
            "cache_salt",
            format!("cache_salt must be 1 to {MAX_CACHE_SALT} bytes"),
        )),
        salt => Ok(salt),
    }
}
