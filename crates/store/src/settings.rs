//! A repository's settings as a configuration file holds them (`options`, `download`),
//! checked while it is parsed so an error names the field and its line, and whether a location
//! is remote (needs the disk cache).

use std::collections::BTreeMap;
use std::time::Duration;

use modelmux_types::{Attempts, Seconds};
use serde::Deserialize;

use crate::RetryPolicy;

/// Whether a repository location is remote: anything with a scheme but `file://` (a local
/// path) and `builtin://` (compiled into the binary). Remote repositories need the disk cache.
pub fn is_remote(location: &str) -> bool {
    location
        .split_once("://")
        .is_some_and(|(scheme, _)| !matches!(scheme, "file" | "builtin"))
}

/// Store options as `object_store` reads them: every value as a string.
pub fn option_strings(options: &BTreeMap<String, OptionValue>) -> Vec<(String, String)> {
    options
        .iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
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
    /// Checks the fields together (serde checks each alone).
    pub fn validate(&self) -> Result<(), String> {
        if self.backoff_base_s.0 > self.backoff_max_s.0 {
            return Err("backoff_base_s is larger than backoff_max_s".into());
        }
        Ok(())
    }

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
