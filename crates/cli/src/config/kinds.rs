//! `model: {kind: ...}`: the model kinds this binary knows and their settings.

use std::time::Duration;

use modelmux_store::RetryPolicy;
use serde::Deserialize;

use modelmux_synthetic::SyntheticConfig;

use super::values::{Attempts, Seconds};

/// The model kinds this binary knows.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelSpec {
    /// Synthetic models (see `modelmux-synthetic`).
    Synthetic(SyntheticConfig),
    /// ONNX models from a model repository (see `modelmux-onnx`).
    Onnx(OnnxConfig),
    /// An LLM and its LoRA adapters behind an OpenAI-compatible API (see `modelmux-openai`).
    Llm(Box<modelmux_openai::LlmConfig>),
}

impl ModelSpec {
    /// Whether it reads from a remote store (and so needs the disk cache).
    pub fn needs_disk_cache(&self) -> bool {
        match self {
            ModelSpec::Synthetic(_) => false,
            ModelSpec::Onnx(onnx) => is_remote(&onnx.repository),
            ModelSpec::Llm(llm) => llm.needs_disk_cache(),
        }
    }
}

/// The repository that means "the demo models compiled into this binary".
pub const BUILTIN_DEMO_REPOSITORY: &str = "builtin://demo";

/// `model: {kind: onnx, ...}`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OnnxConfig {
    /// Where the models are: a directory (`examples/models`), `file:///abs/dir`,
    /// `s3://bucket/prefix`, `https://host/path` (any web server), or `builtin://demo` (the
    /// demo models compiled into the binary).
    /// Each model is `<repository>/<model_id>/model.onnx`.
    pub repository: String,
    /// Store options, as `object_store` names them (for S3: `endpoint`, `region`,
    /// `access_key_id`, `secret_access_key`, `allow_http`, ...). Unset ones come from the
    /// `AWS_*` environment variables.
    #[serde(default)]
    pub options: std::collections::BTreeMap<String, OptionValue>,
    /// Retries and timeouts of downloads from a remote repository.
    #[serde(default)]
    pub download: DownloadConfig,
}

/// A store option's value: YAML strings, booleans and numbers are all accepted
/// (`allow_http: true` means `allow_http: "true"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OptionValue {
    /// A string.
    Text(String),
    /// A boolean.
    Flag(bool),
    /// A whole number.
    Whole(i64),
    /// A number.
    Number(f64),
}

impl std::fmt::Display for OptionValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Text(s) => f.write_str(s),
            Self::Flag(b) => write!(f, "{b}"),
            Self::Whole(n) => write!(f, "{n}"),
            Self::Number(n) => write!(f, "{n}"),
        }
    }
}

/// `download`: how remote model files are fetched.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DownloadConfig {
    /// Attempts in all (default 4).
    #[serde(default = "default_attempts")]
    pub attempts: Attempts,
    /// Longest one attempt may take, the whole transfer included (default 600).
    #[serde(default = "default_attempt_timeout")]
    pub attempt_timeout_s: Seconds,
    /// Backoff before the first retry, doubled each time, with full jitter (default 0.2).
    #[serde(default = "default_backoff_base")]
    pub backoff_base_s: Seconds,
    /// Longest backoff (default 10).
    #[serde(default = "default_backoff_max")]
    pub backoff_max_s: Seconds,
    /// Check each S3 download's MD5 against its ETag (default true; turn off for buckets
    /// encrypted with SSE-KMS or SSE-C, whose ETags are not MD5s).
    #[serde(default = "yes")]
    pub verify_md5: bool,
}

fn yes() -> bool {
    true
}

impl Default for DownloadConfig {
    fn default() -> Self {
        Self {
            attempts: default_attempts(),
            attempt_timeout_s: default_attempt_timeout(),
            backoff_base_s: default_backoff_base(),
            backoff_max_s: default_backoff_max(),
            verify_md5: true,
        }
    }
}

impl DownloadConfig {
    /// As the store's retry policy.
    pub fn policy(&self) -> RetryPolicy {
        RetryPolicy {
            attempts: self.attempts.0.get(),
            attempt_timeout: self.attempt_timeout_s.0,
            backoff_base: self.backoff_base_s.0,
            backoff_max: self.backoff_max_s.0,
        }
    }
}

fn default_attempts() -> Attempts {
    Attempts(std::num::NonZeroU32::new(4).expect("4 is not 0"))
}

fn default_attempt_timeout() -> Seconds {
    Seconds(Duration::from_secs(600))
}
fn default_backoff_base() -> Seconds {
    Seconds(Duration::from_millis(200))
}
fn default_backoff_max() -> Seconds {
    Seconds(Duration::from_secs(10))
}

/// Whether a repository location is remote (needs the disk cache).
fn is_remote(repository: &str) -> bool {
    repository
        .split_once("://")
        .is_some_and(|(scheme, _)| !matches!(scheme, "file" | "builtin"))
}
