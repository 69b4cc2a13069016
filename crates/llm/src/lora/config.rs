//! `adapter_config.json`: PEFT's settings, checked. What changes inference is read (rank,
//! alpha, rslora, targets, rank and alpha patterns); what would change it but is not
//! supported is refused naming the key; what never matters is ignored.

use regex::Regex;
use serde_json::{Map, Value};

use super::ADAPTER_CONFIG_FILE;
use crate::error::{LlmError, Result};
use crate::weights::Target;

/// Settings of `adapter_config.json` that change nothing in inference when left at their
/// defaults, and unsafe to ignore otherwise.
const MUST_BE_UNSET: &[&str] = &[
    "use_dora",
    "modules_to_save",
    "layers_to_transform",
    "layers_pattern",
    "fan_in_fan_out",
    "megatron_config",
    "target_parameters",
    "trainable_token_indices",
    "lora_bias",
    "use_qalora",
    "exclude_modules",
    "alora_invocation_tokens",
];

/// Settings that never change inference (training-time or bookkeeping only).
const IGNORED: &[&str] = &[
    "peft_type",
    "task_type",
    "base_model_name_or_path",
    "revision",
    "inference_mode",
    "lora_dropout",
    "init_lora_weights",
    "auto_mapping",
    "loftq_config",
    "megatron_core",
    "runtime_config",
    "eva_config",
    "corda_config",
    "layer_replication",
    "qalora_group_size",
    "ensure_weight_tying",
    "arrow_config",
    "peft_version",
];

fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        Value::String(s) => s.is_empty(),
        Value::Number(_) => false,
    }
}

/// What `adapter_config.json` says, checked.
pub(super) struct AdapterConfig {
    pub(super) rank: usize,
    pub(super) alpha: f64,
    pub(super) rslora: bool,
    pub(super) targets: Vec<Target>,
    pub(super) rank_pattern: Vec<(Regex, usize)>,
    pub(super) alpha_pattern: Vec<(Regex, f64)>,
    /// `base_model_name_or_path`: the model the adapter was trained on, if it says.
    pub(super) base_model: Option<String>,
}

/// The lineage (see `Family::lineage`) a Hugging Face model name or path belongs to, when it names a family
/// (`Qwen/Qwen2.5-0.5B-Instruct` is `qwen2`, `HuggingFaceTB/SmolLM2-135M` is `llama`); `None`
/// when it names none this knows.
pub(super) fn architecture_named(name: &str) -> Option<&'static str> {
    let name = name.to_ascii_lowercase();
    const FAMILIES: &[(&[&str], &str)] = &[
        (&["qwen3"], "qwen3"),
        (&["qwen"], "qwen2"),
        (&["gemma-3", "gemma3"], "gemma3"),
        (&["gemma-2", "gemma2"], "gemma2"),
        (&["gemma"], "gemma"),
        (&["phi-3", "phi3", "phi-4", "phi4"], "phi3"),
        (&["llama", "smollm", "mistral", "mixtral"], "llama"),
    ];
    FAMILIES
        .iter()
        .find(|(words, _)| words.iter().any(|w| name.contains(w)))
        .map(|(_, arch)| *arch)
}

/// PEFT's pattern rule: `key` matches `pattern` when the module name ends with it on a
/// dot boundary (`(.*\.)?(pattern)$`).
fn pattern(adapter: &str, field: &str, key: &str) -> Result<Regex> {
    Regex::new(&format!(r"^(?:.*\.)?(?:{key})$")).map_err(|e| {
        LlmError::adapter(
            adapter,
            format!("{field}: '{key}' is not a valid pattern: {e}"),
        )
    })
}

pub(super) fn parse_config(adapter: &str, bytes: &[u8]) -> Result<AdapterConfig> {
    let err = |m: String| LlmError::adapter(adapter, m);
    let value: Value = serde_json::from_slice(bytes)
        .map_err(|e| err(format!("{ADAPTER_CONFIG_FILE} is not valid JSON: {e}")))?;
    let Value::Object(map) = value else {
        return Err(err(format!("{ADAPTER_CONFIG_FILE} is not a JSON object")));
    };
    for (key, value) in &map {
        let known = matches!(
            key.as_str(),
            "r" | "lora_alpha"
                | "target_modules"
                | "use_rslora"
                | "rank_pattern"
                | "alpha_pattern"
                | "bias"
        ) || IGNORED.contains(&key.as_str());
        if known {
            continue;
        }
        if !is_unset(value) {
            let what = if MUST_BE_UNSET.contains(&key.as_str()) {
                "is not supported"
            } else {
                "is not a setting this engine knows, and it is set"
            };
            return Err(err(format!(
                "{ADAPTER_CONFIG_FILE}: '{key}' = {value} {what}"
            )));
        }
    }
    if let Some(t) = map.get("peft_type").and_then(Value::as_str)
        && t != "LORA"
    {
        return Err(err(format!(
            "{ADAPTER_CONFIG_FILE}: peft_type '{t}' is not supported (only LORA)"
        )));
    }
    if let Some(bias) = map.get("bias").and_then(Value::as_str)
        && bias != "none"
    {
        return Err(err(format!(
            "{ADAPTER_CONFIG_FILE}: bias '{bias}' is not supported (only \"none\")"
        )));
    }
    let rank = map
        .get("r")
        .and_then(Value::as_u64)
        .filter(|r| (1..=4096).contains(r))
        .ok_or_else(|| {
            err(format!(
                "{ADAPTER_CONFIG_FILE}: 'r' must be an integer in 1..=4096"
            ))
        })? as usize;
    let alpha = match map.get("lora_alpha") {
        None => 8.0, // PEFT's default
        Some(v) => v.as_f64().filter(|a| a.is_finite()).ok_or_else(|| {
            err(format!(
                "{ADAPTER_CONFIG_FILE}: 'lora_alpha' must be a number"
            ))
        })?,
    };
    let rslora = map
        .get("use_rslora")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let targets = parse_targets(adapter, map.get("target_modules"))?;
    let rank_pattern = patterns(adapter, &map, "rank_pattern", |v| {
        v.as_u64()
            .filter(|r| (1..=4096).contains(r))
            .map(|r| r as usize)
    })?;
    let alpha_pattern = patterns(adapter, &map, "alpha_pattern", |v| {
        v.as_f64().filter(|a| a.is_finite())
    })?;
    let base_model = map
        .get("base_model_name_or_path")
        .and_then(Value::as_str)
        .map(str::to_owned);
    Ok(AdapterConfig {
        rank,
        alpha,
        rslora,
        targets,
        rank_pattern,
        alpha_pattern,
        base_model,
    })
}

fn patterns<T>(
    adapter: &str,
    map: &Map<String, Value>,
    field: &str,
    value: impl Fn(&Value) -> Option<T>,
) -> Result<Vec<(Regex, T)>> {
    let Some(Value::Object(entries)) = map.get(field) else {
        return Ok(Vec::new());
    };
    entries
        .iter()
        .map(|(key, v)| {
            let parsed = value(v).ok_or_else(|| {
                LlmError::adapter(
                    adapter,
                    format!("{field}: '{key}' has an invalid value {v}"),
                )
            })?;
            Ok((pattern(adapter, field, key)?, parsed))
        })
        .collect()
}

fn parse_targets(adapter: &str, value: Option<&Value>) -> Result<Vec<Target>> {
    let err = |m: String| LlmError::adapter(adapter, m);
    let names: Vec<String> = match value {
        None | Some(Value::Null) => {
            return Err(err(format!(
                "{ADAPTER_CONFIG_FILE}: 'target_modules' is missing"
            )));
        }
        Some(Value::String(s)) if s == "all-linear" => {
            return Ok(Target::ALL.to_vec());
        }
        Some(Value::String(s)) => {
            // A regular expression over module names, matched whole.
            let re = Regex::new(&format!("^(?:{s})$"))
                .map_err(|e| err(format!("target_modules: not a valid pattern: {e}")))?;
            let targets: Vec<Target> = Target::ALL
                .into_iter()
                .filter(|t| {
                    re.is_match(&format!(
                        "model.layers.0.{}.{}",
                        t.peft_parent(),
                        t.peft_name()
                    ))
                })
                .collect();
            if targets.is_empty() {
                return Err(err(format!(
                    "target_modules: '{s}' matches none of q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"
                )));
            }
            return Ok(targets);
        }
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| err(format!("target_modules: {v} is not a string")))
            })
            .collect::<Result<_>>()?,
        Some(other) => return Err(err(format!("target_modules: {other} is not a list"))),
    };
    let mut targets = Vec::new();
    for name in names {
        let last = name.rsplit('.').next().unwrap_or(&name);
        match Target::from_peft_module(last) {
            Some(parts) => targets.extend_from_slice(parts),
            None if matches!(last, "embed_tokens" | "lm_head" | "wte" | "wpe") => {
                return Err(err(format!(
                    "target_modules: '{name}' is an embedding target, which is not supported"
                )));
            }
            None => {
                return Err(err(format!(
                    "target_modules: '{name}' is not a projection of a transformer block (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, qkv_proj, gate_up_proj)"
                )));
            }
        }
    }
    targets.sort();
    targets.dedup();
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names_map_to_their_architecture() {
        for (name, arch) in [
            ("Qwen/Qwen2.5-0.5B-Instruct", Some("qwen2")),
            ("Qwen/Qwen3-0.6B", Some("qwen3")),
            ("HuggingFaceTB/SmolLM2-135M-Instruct", Some("llama")),
            ("meta-llama/Llama-3.2-1B", Some("llama")),
            ("mistralai/Mistral-7B-v0.3", Some("llama")),
            ("google/gemma-2-2b", Some("gemma2")),
            ("google/gemma-3-1b-it", Some("gemma3")),
            ("google/gemma-7b", Some("gemma")),
            ("microsoft/Phi-3-mini-4k-instruct", Some("phi3")),
            ("/data/models/my-base", None),
        ] {
            assert_eq!(architecture_named(name), arch, "{name}");
        }
    }

    #[test]
    fn peft_patterns_match_on_dot_boundaries() {
        let re = pattern("a", "rank_pattern", "layers.3.self_attn.q_proj").unwrap();
        assert!(re.is_match("model.layers.3.self_attn.q_proj"));
        assert!(!re.is_match("model.layers.13.self_attn.q_proj"));
        let re = pattern("a", "rank_pattern", "q_proj").unwrap();
        assert!(re.is_match("model.layers.13.self_attn.q_proj"));
    }
}
