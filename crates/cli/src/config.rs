//! The YAML configuration, shaped like Ray Serve's config file: `http_options`, then
//! `applications`, each with `route_prefix` and `deployments`. Every field is checked while
//! parsing, so an error names the field and the line.

use std::net::SocketAddr;
use std::num::{NonZeroU32, NonZeroUsize};
use std::time::Duration;

use modelmux_cache::{EvictionPolicy, Multiplexer};
use modelmux_onnx::Onnx;
use modelmux_serve::{Application, ServerBuilder, model_deployment};
use modelmux_store::{DiskCache, ModelRepository, RepositoryOptions, RetryPolicy};
use modelmux_synthetic::{Synthetic, SyntheticConfig};
use serde::Deserialize;

/// The configuration `modelmux serve` runs with no argument: the demo ONNX repository (eight
/// per-customer classifiers, compiled into the binary) on two replicas of three models each, so
/// a newcomer sees routing, loading, caching and eviction without writing anything.
pub const DEMO: &str = include_str!("demo.yaml");

/// A whole configuration file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Where and how to serve HTTP.
    #[serde(default)]
    pub http_options: HttpOptions,
    /// Log settings.
    #[serde(default)]
    pub logging: Logging,
    /// The local disk cache for models from remote repositories (S3), shared by every
    /// deployment of the server.
    #[serde(default)]
    pub disk_cache: DiskCacheConfig,
    /// The applications to serve.
    pub applications: Vec<AppConfig>,
}

/// `disk_cache`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskCacheConfig {
    /// Its directory: empty, or a cache directory of an earlier run; emptied at start. Default:
    /// a new directory under the system's temporary directory, removed at exit.
    #[serde(default)]
    pub path: Option<std::path::PathBuf>,
    /// Bytes of files it may hold (default 10 GiB).
    #[serde(default = "default_disk_cache_bytes")]
    pub max_bytes: u64,
}

impl Default for DiskCacheConfig {
    fn default() -> Self {
        Self {
            path: None,
            max_bytes: default_disk_cache_bytes(),
        }
    }
}

fn default_disk_cache_bytes() -> u64 {
    10 << 30
}

/// `http_options`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpOptions {
    /// Address to listen on.
    #[serde(default = "default_host")]
    pub host: String,
    /// Port to listen on (0 picks a free one).
    #[serde(default = "default_port")]
    pub port: u16,
    /// Largest request body accepted (bytes).
    #[serde(default = "default_max_body_bytes")]
    pub max_body_bytes: usize,
    /// Bearer token required by the admin API.
    #[serde(default)]
    pub admin_token: Option<String>,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self {
            host: default_host(),
            port: default_port(),
            max_body_bytes: default_max_body_bytes(),
            admin_token: None,
        }
    }
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    8000
}
fn default_max_body_bytes() -> usize {
    16 << 20
}

/// `logging`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logging {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
    /// A `tracing` filter, such as `info` or `info,modelmux::access=warn` (default `info`).
    #[serde(default)]
    pub level: Option<String>,
}

/// Log line format.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// One application.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AppConfig {
    /// Its name.
    pub name: String,
    /// The path prefix it serves.
    #[serde(default = "default_route_prefix")]
    pub route_prefix: String,
    /// The deployment receiving its HTTP requests (default: the first).
    #[serde(default)]
    pub ingress: Option<String>,
    /// Its deployments.
    pub deployments: Vec<DeploymentConfig>,
}

fn default_route_prefix() -> String {
    "/".into()
}

/// One deployment serving a kind of model.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DeploymentConfig {
    /// Its name.
    pub name: String,
    /// Replicas.
    #[serde(default = "one")]
    pub num_replicas: NonZeroUsize,
    /// Requests one replica handles at once.
    #[serde(default = "five")]
    pub max_ongoing_requests: NonZeroUsize,
    /// Requests that may wait for a replica.
    #[serde(default = "default_max_queued")]
    pub max_queued_requests: usize,
    /// Longest wait in the queue, in seconds.
    #[serde(default = "default_queue_timeout")]
    pub queue_timeout_s: Seconds,
    /// Models per replica: a positive number, or -1 for no limit (Ray's convention).
    #[serde(default)]
    pub max_models_per_replica: ModelCap,
    /// Bytes of models per replica.
    #[serde(default)]
    pub max_bytes_per_replica: Option<u64>,
    /// Which idle model is evicted first: `lru` (default, as Ray) or `gdsf` (frequency, load
    /// cost and size aware; fewer loads on skewed traffic).
    #[serde(default)]
    pub eviction_policy: EvictionPolicyName,
    /// Loads running at once per replica.
    #[serde(default = "four")]
    pub max_concurrent_loads: NonZeroUsize,
    /// Longest a model load may take, in seconds.
    #[serde(default = "default_load_timeout")]
    pub model_load_timeout_s: Seconds,
    /// What kind of model it serves.
    pub model: ModelSpec,
}

fn one() -> NonZeroUsize {
    NonZeroUsize::MIN
}
fn four() -> NonZeroUsize {
    NonZeroUsize::new(4).expect("4 is not 0")
}
fn five() -> NonZeroUsize {
    NonZeroUsize::new(5).expect("5 is not 0")
}
fn default_max_queued() -> usize {
    1024
}
fn default_queue_timeout() -> Seconds {
    Seconds(Duration::from_secs(30))
}
fn default_load_timeout() -> Seconds {
    Seconds(Duration::from_secs(120))
}

/// `eviction_policy`.
#[derive(Debug, Clone, Copy, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvictionPolicyName {
    /// Least recently used first.
    #[default]
    Lru,
    /// Greedy-Dual-Size-Frequency.
    Gdsf,
}

/// `max_models_per_replica`: at least 1, or -1 for no limit.
#[derive(Debug, Clone, Copy)]
pub struct ModelCap(pub Option<usize>);

impl Default for ModelCap {
    fn default() -> Self {
        Self(Some(3))
    }
}

/// Checks numbers inside the scalar's own deserialization, so errors carry its line.
struct Checked<F>(&'static str, F);

impl<'de, T, F: FnOnce(f64) -> Option<T>> serde::de::Visitor<'de> for Checked<F> {
    type Value = T;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0)
    }

    fn visit_i64<E: serde::de::Error>(self, n: i64) -> Result<T, E> {
        (self.1)(n as f64)
            .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Signed(n), &self.0))
    }

    fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<T, E> {
        (self.1)(n as f64)
            .ok_or_else(|| E::invalid_value(serde::de::Unexpected::Unsigned(n), &self.0))
    }

    fn visit_f64<E: serde::de::Error>(self, n: f64) -> Result<T, E> {
        (self.1)(n).ok_or_else(|| E::invalid_value(serde::de::Unexpected::Float(n), &self.0))
    }
}

impl<'de> Deserialize<'de> for ModelCap {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked(
            "a whole number of at least 1, or -1 for no limit",
            |n: f64| match n {
                -1.0 => Some(ModelCap(None)),
                n if n >= 1.0 && n.fract() == 0.0 && n < 1e12 => Some(ModelCap(Some(n as usize))),
                _ => None,
            },
        ))
    }
}

/// A positive number of seconds.
#[derive(Debug, Clone, Copy)]
pub struct Seconds(pub Duration);

impl<'de> Deserialize<'de> for Seconds {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked("a positive number of seconds", |s: f64| {
            (s.is_finite() && (0.001..1e9).contains(&s))
                .then(|| Seconds(Duration::from_secs_f64(s)))
        }))
    }
}

/// The model kinds this binary knows.
#[derive(Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase", deny_unknown_fields)]
pub enum ModelSpec {
    /// Synthetic models (see `modelmux-synthetic`).
    Synthetic(SyntheticConfig),
    /// ONNX models from a model repository (see `modelmux-onnx`).
    Onnx(OnnxConfig),
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
    Attempts(NonZeroU32::new(4).expect("4 is not 0"))
}

/// `download.attempts`: at least 1.
#[derive(Debug, Clone, Copy)]
pub struct Attempts(pub NonZeroU32);

impl<'de> Deserialize<'de> for Attempts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Checked(
            "a whole number of download attempts, at least 1",
            |n: f64| {
                (n.fract() == 0.0 && (1.0..=1000.0).contains(&n))
                    .then(|| Attempts(NonZeroU32::new(n as u32).expect("n >= 1")))
            },
        ))
    }
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

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not valid YAML, or a field is wrong; the message names it and its line.
    #[error("{0}")]
    Parse(String),
    /// The fields are fine one by one but not together.
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Parses and checks a configuration.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let config: Config =
            serde_yaml_ng::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        if config.applications.is_empty() {
            return Err(ConfigError::Invalid(
                "applications: at least one application is needed".into(),
            ));
        }
        for (i, app) in config.applications.iter().enumerate() {
            if app.deployments.is_empty() {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}] ('{}'): at least one deployment is needed",
                    app.name
                )));
            }
            if let Some(ingress) = &app.ingress
                && !app.deployments.iter().any(|d| &d.name == ingress)
            {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}].ingress: no deployment named '{ingress}' in application '{}'",
                    app.name
                )));
            }
            for (j, d) in app.deployments.iter().enumerate() {
                if d.name.is_empty() || d.name.contains('/') {
                    return Err(ConfigError::Invalid(format!(
                        "applications[{i}].deployments[{j}].name: '{}' must be non-empty and have no '/'",
                        d.name
                    )));
                }
                if let ModelSpec::Onnx(onnx) = &d.model
                    && onnx.download.backoff_base_s.0 > onnx.download.backoff_max_s.0
                {
                    return Err(ConfigError::Invalid(format!(
                        "applications[{i}].deployments[{j}].model.download: backoff_base_s is \
                         larger than backoff_max_s"
                    )));
                }
                if app.deployments[..j]
                    .iter()
                    .any(|other| other.name == d.name)
                {
                    return Err(ConfigError::Invalid(format!(
                        "applications[{i}].deployments[{j}].name: '{}' is used twice in application '{}'",
                        d.name, app.name
                    )));
                }
            }
            let p = &app.route_prefix;
            if !p.starts_with('/') || (p.len() > 1 && p.ends_with('/')) {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}].route_prefix: '{p}' must start with '/' and not end with one"
                )));
            }
            if p.starts_with("/-") || p == "/metrics" || p.starts_with("/metrics/") {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}].route_prefix: '{p}' is reserved for the admin API (/-/...) and /metrics"
                )));
            }
            let earlier = &config.applications[..i];
            if earlier.iter().any(|a| a.name == app.name) {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}].name: '{}' is used twice",
                    app.name
                )));
            }
            if earlier.iter().any(|a| &a.route_prefix == p) {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}].route_prefix: '{p}' is used by another application"
                )));
            }
        }
        if config.disk_cache.max_bytes == 0 {
            return Err(ConfigError::Invalid(
                "disk_cache.max_bytes: must be at least 1".into(),
            ));
        }
        if let Some(level) = &config.logging.level {
            tracing_subscriber::EnvFilter::try_new(level).map_err(|e| {
                ConfigError::Invalid(format!("logging.level: '{level}' is not a log filter such as 'info' or 'info,modelmux::access=warn': {e}"))
            })?;
        }
        config.bind_address()?;
        Ok(config)
    }

    /// The address `http_options` names.
    pub fn bind_address(&self) -> Result<SocketAddr, ConfigError> {
        let host = &self.http_options.host;
        let ip: std::net::IpAddr = host.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "http_options.host: '{host}' is not an IP address (use 127.0.0.1 or 0.0.0.0)"
            ))
        })?;
        Ok(SocketAddr::new(ip, self.http_options.port))
    }

    /// A server builder for this configuration. Opens the model repositories (so a missing
    /// directory or a malformed S3 option is an error now, not at the first request) and, if
    /// any is remote, the disk cache.
    pub async fn server(&self) -> Result<ServerBuilder, ConfigError> {
        self.build(false).await
    }

    /// Checks everything [`server`](Self::server) checks, without taking the disk cache's
    /// directory (a running server may hold it).
    pub async fn check(&self) -> Result<(), ConfigError> {
        self.build(true).await.map(drop)
    }

    async fn build(&self, check_only: bool) -> Result<ServerBuilder, ConfigError> {
        let remote = self
            .applications
            .iter()
            .flat_map(|a| &a.deployments)
            .any(|d| matches!(&d.model, ModelSpec::Onnx(onnx) if is_remote(&onnx.repository)));
        let disk_cache = if remote {
            // A check must not take (or empty) the directory a running server may hold.
            let opened = match &self.disk_cache.path {
                Some(path) if check_only => DiskCache::check(path)
                    .and_then(|()| DiskCache::temporary(self.disk_cache.max_bytes)),
                Some(path) => DiskCache::open(path, self.disk_cache.max_bytes),
                None => DiskCache::temporary(self.disk_cache.max_bytes),
            };
            Some(opened.map_err(|e| ConfigError::Invalid(format!("disk_cache: {e}")))?)
        } else {
            None
        };
        let mut builder = modelmux_serve::Server::builder()
            .bind(self.bind_address()?)
            .max_body_bytes(self.http_options.max_body_bytes);
        if let Some(token) = &self.http_options.admin_token {
            builder = builder.admin_token(token.clone());
        }
        for (i, app) in self.applications.iter().enumerate() {
            let mut application = Application::new(&app.name).route_prefix(&app.route_prefix);
            let ingress = app.ingress.as_deref().unwrap_or(&app.deployments[0].name);
            for (j, d) in app.deployments.iter().enumerate() {
                let spec = deployment(d, disk_cache.as_ref()).await.map_err(|e| {
                    ConfigError::Invalid(format!("applications[{i}].deployments[{j}].model: {e}"))
                })?;
                application = if d.name == ingress {
                    application.ingress(spec)
                } else {
                    application.deployment(spec)
                };
            }
            builder = builder.application(application);
        }
        Ok(builder)
    }
}

async fn deployment(
    d: &DeploymentConfig,
    disk_cache: Option<&DiskCache>,
) -> Result<modelmux_serve::DeploymentSpec, modelmux_store::StoreError> {
    let mut cache = Multiplexer::builder()
        .max_concurrent_loads(d.max_concurrent_loads.get())
        .load_timeout(Some(d.model_load_timeout_s.0))
        .eviction_policy(match d.eviction_policy {
            EvictionPolicyName::Lru => EvictionPolicy::Lru,
            EvictionPolicyName::Gdsf => EvictionPolicy::Gdsf,
        });
    cache = match d.max_models_per_replica.0 {
        Some(n) => cache.max_models(n),
        None => cache.unbounded_models(),
    };
    if let Some(bytes) = d.max_bytes_per_replica {
        cache = cache.max_bytes(bytes);
    }
    let spec = match &d.model {
        ModelSpec::Synthetic(config) => {
            model_deployment(&d.name, Synthetic::new(config.clone()), cache)
        }
        ModelSpec::Onnx(onnx) => {
            let repository = if onnx.repository == BUILTIN_DEMO_REPOSITORY {
                if !onnx.options.is_empty() {
                    return Err(modelmux_store::StoreError::Config(format!(
                        "{BUILTIN_DEMO_REPOSITORY} takes no options"
                    )));
                }
                crate::demo_models::repository().await?
            } else {
                ModelRepository::open(
                    &onnx.repository,
                    RepositoryOptions {
                        options: onnx
                            .options
                            .iter()
                            .map(|(k, v)| (k.clone(), v.to_string()))
                            .collect(),
                        disk_cache: disk_cache.cloned(),
                        retry: onnx.download.policy(),
                        verify_md5: onnx.download.verify_md5,
                    },
                )?
            };
            model_deployment(&d.name, Onnx::new(repository), cache)
        }
    };
    Ok(spec
        .num_replicas(d.num_replicas.get())
        .max_ongoing_requests(d.max_ongoing_requests.get())
        .max_queued_requests(d.max_queued_requests)
        .queue_timeout(d.queue_timeout_s.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_demo_and_the_examples_parse() {
        let c = Config::parse(DEMO).unwrap();
        assert_eq!(c.applications[0].deployments[0].num_replicas.get(), 2);
        assert!(c.server().await.is_ok());
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../../");
        for example in ["synthetic.yaml", "onnx-local.yaml", "onnx-s3.yaml"] {
            let text = std::fs::read_to_string(format!("{root}examples/{example}")).unwrap();
            Config::parse(&text).unwrap_or_else(|e| panic!("{example}: {e}"));
        }
    }

    #[tokio::test]
    async fn repositories_are_opened_when_the_server_is_built() {
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: /no/such/dir}\n";
        let err = Config::parse(yaml)
            .unwrap()
            .server()
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("deployments[0].model") && err.contains("/no/such/dir"),
            "{err}"
        );
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: 's3://b/p', options: {colour: red}}\n";
        let err = Config::parse(yaml)
            .unwrap()
            .server()
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("unknown S3 option 'colour'"), "{err}");
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: 'ftp://x/y'}\n";
        let err = Config::parse(yaml)
            .unwrap()
            .server()
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("unsupported repository scheme 'ftp://'"),
            "{err}"
        );
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: x, download: {attempts: 0}}\n";
        let err = Config::parse(yaml).unwrap_err().to_string();
        assert!(err.contains("attempts"), "{err}");
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: x, download: {backoff_base_s: 20}}\n";
        let err = Config::parse(yaml).unwrap_err().to_string();
        assert!(err.contains("backoff_base_s is larger"), "{err}");
        // Option values may be YAML booleans and numbers.
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: onnx, repository: 's3://b/p', options: {allow_http: true, region: us-east-1}}\n";
        assert!(Config::parse(yaml).unwrap().server().await.is_ok());
        // A check looks at the disk cache's directory without taking or emptying it.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("precious"), b"x").unwrap();
        let yaml = format!(
            "disk_cache: {{path: '{}'}}\napplications:\n  - name: a\n    deployments:\n      - name: d\n        model: {{kind: onnx, repository: 's3://b/p'}}\n",
            dir.path().display()
        );
        let config = Config::parse(&yaml).unwrap();
        let err = config.check().await.unwrap_err().to_string();
        assert!(err.contains("not empty"), "{err}");
        assert!(dir.path().join("precious").exists());
        let cache = dir.path().join("cache");
        let yaml = yaml.replace(
            &dir.path().display().to_string(),
            &cache.display().to_string(),
        );
        let config = Config::parse(&yaml).unwrap();
        let _running = config.server().await.unwrap();
        config.check().await.unwrap_err(); // in use by the "running server" above
        drop(_running);
    }

    #[test]
    fn errors_name_the_field_and_the_line() {
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        num_replicas: 0\n        model: {kind: synthetic}\n";
        let err = Config::parse(yaml).unwrap_err().to_string();
        assert!(
            err.contains("num_replicas") && err.contains("line 5"),
            "{err}"
        );

        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: synthetic, size_gb: 1}\n";
        let err = Config::parse(yaml).unwrap_err().to_string();
        // Inside `model` (a tagged enum, buffered by serde) the line is the deployment's.
        assert!(
            err.contains("deployments[0]") && err.contains("size_gb") && err.contains("line 4"),
            "{err}"
        );

        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: pytorch}\n";
        let err = Config::parse(yaml).unwrap_err().to_string();
        assert!(
            err.contains("pytorch") && err.contains("synthetic"),
            "{err}"
        );

        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        max_models_per_replica: 0\n        model: {kind: synthetic}\n";
        let err = Config::parse(yaml).unwrap_err().to_string();
        assert!(
            err.contains("-1 for no limit") && err.contains("line 5"),
            "{err}"
        );
    }

    #[test]
    fn cross_field_errors_name_the_path() {
        let yaml = "applications:\n  - name: a\n    ingress: nope\n    deployments:\n      - name: d\n        model: {kind: synthetic}\n";
        let err = Config::parse(yaml).unwrap_err().to_string();
        assert!(err.contains("applications[0].ingress"), "{err}");
        let yaml = "http_options: {host: localhost}\napplications: []\n";
        assert!(Config::parse(yaml).is_err());
    }

    #[test]
    fn eviction_policies_are_named() {
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        eviction_policy: gdsf\n        model: {kind: synthetic}\n";
        let c = Config::parse(yaml).unwrap();
        assert!(matches!(
            c.applications[0].deployments[0].eviction_policy,
            EvictionPolicyName::Gdsf
        ));
        let err = Config::parse(&yaml.replace("gdsf", "fifo"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("fifo") && err.contains("lru") && err.contains("line 5"),
            "{err}"
        );
    }

    #[test]
    fn what_the_server_would_refuse_is_refused_when_parsing() {
        let app = |prefix: &str| {
            format!(
                "  - name: a{}\n    route_prefix: '{prefix}'\n    deployments:\n      - name: d\n        model: {{kind: synthetic}}\n",
                prefix.len()
            )
        };
        for (prefix, expect) in [
            ("api", "must start with '/'"),
            ("/api/", "must start with '/'"),
            ("/-/x", "reserved"),
            ("/metrics", "reserved"),
        ] {
            let err = Config::parse(&format!("applications:\n{}", app(prefix)))
                .unwrap_err()
                .to_string();
            assert!(
                err.contains("route_prefix") && err.contains(expect),
                "{prefix}: {err}"
            );
        }
        let twice = format!(
            "applications:\n{}{}",
            app("/a"),
            app("/a").replace("name: a2", "name: b2")
        );
        assert!(
            Config::parse(&twice)
                .unwrap_err()
                .to_string()
                .contains("used by another application")
        );
        let yaml = "logging: {level: 'info,[['}\napplications:\n  - name: a\n    deployments:\n      - name: d\n        model: {kind: synthetic}\n";
        assert!(
            Config::parse(yaml)
                .unwrap_err()
                .to_string()
                .contains("logging.level")
        );
    }

    #[test]
    fn minus_one_means_unbounded() {
        let yaml = "applications:\n  - name: a\n    deployments:\n      - name: d\n        max_models_per_replica: -1\n        model: {kind: synthetic}\n";
        let c = Config::parse(yaml).unwrap();
        assert!(
            c.applications[0].deployments[0]
                .max_models_per_replica
                .0
                .is_none()
        );
    }
}
