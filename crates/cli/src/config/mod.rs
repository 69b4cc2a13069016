//! The YAML configuration, shaped like Ray Serve's config file: `http_options`, then
//! `applications`, each with `route_prefix` and `deployments`. Every field is checked while
//! parsing, so an error names the field and the line.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::time::Duration;

use modelmux_cache::{EvictionPolicy, Multiplexer, MultiplexerBuilder};

mod autoscaling;
/// The `cluster` section and joining a cluster: the `cluster` feature's, or its stand-in.
#[cfg_attr(not(feature = "cluster"), path = "no_cluster.rs")]
pub mod cluster;
mod explain;
mod http;
mod kinds;
mod paths;
pub mod plan;
mod python;
mod reload;
#[cfg(test)]
mod tests;
mod trace_export;
mod values;

pub use autoscaling::{AutoscalingYaml, ReplicaCount};
pub use cluster::ClusterConfig;
pub use http::HttpOptions;
use kinds::BuildContext;
pub use kinds::{FEATURES, ModelSpec, NotBuilt, not_built};
use modelmux_front::ServerBuilder;
use modelmux_serve::{Application, DeploymentSpec};
use modelmux_store::DiskCache;
pub use reload::Reloader;
use serde::Deserialize;
pub use trace_export::TracingConfig;
pub use values::*;

/// The configuration `modelmux serve` runs with no argument: the demo ONNX repository (eight
/// per-customer classifiers, compiled into the binary) on two replicas of three models each, so
/// a newcomer sees routing, loading, caching and eviction without writing anything.
pub const DEMO: &str = include_str!("../demo.yaml");

/// What the command line says about the cluster.
#[derive(Debug, Default, Clone)]
pub struct ClusterFlags {
    /// `--cluster`.
    pub etcd: Option<String>,
    /// `--node-id`.
    pub node_id: Option<String>,
    /// `--advertise`.
    pub advertise: Option<String>,
    /// `--role`.
    pub role: Option<cluster::Role>,
}

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
    /// The cluster this server is part of (none: a single process).
    #[serde(default)]
    pub cluster: ClusterConfig,
    /// Traces of requests, exported to an OpenTelemetry collector (off without it).
    #[serde(default)]
    pub tracing: Option<TracingConfig>,
    /// The applications to serve.
    pub applications: Vec<AppConfig>,
}

/// `disk_cache`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiskCacheConfig {
    /// Its directory: empty, or a cache directory of an earlier run, whose files are used again
    /// when their source is unchanged and their checksum verifies (the rest deleted). Default:
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

/// `logging`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Logging {
    /// `text` (default) or `json`.
    #[serde(default)]
    pub format: LogFormat,
    /// A `tracing` filter, such as `info` or `info,modelmux::access=warn` (default `info`).
    #[serde(default)]
    pub level: Option<String>,
    /// Bytes of log lines that may wait for the log's writer (default 8 MiB); past them, lines
    /// are dropped and counted (`modelmux_log_lines_dropped_total`) rather than making
    /// requests wait for stderr.
    #[serde(default = "default_buffered_bytes")]
    pub max_buffered_bytes: usize,
}

impl Default for Logging {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            level: None,
            max_buffered_bytes: default_buffered_bytes(),
        }
    }
}

fn default_buffered_bytes() -> usize {
    crate::logging::DEFAULT_BUFFERED_BYTES
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
    /// The deployment receiving its HTTP requests (default: the first; for a Python
    /// application, the one it binds last).
    #[serde(default)]
    pub ingress: Option<String>,
    /// A Python application (Ray's `import_path`): `module:attr`, a bound deployment, whose
    /// deployments this application serves. `deployments` then only overrides their settings.
    #[serde(default)]
    pub import_path: Option<String>,
    /// Where a Python application's module is found (Ray's `runtime_env`).
    #[serde(default)]
    pub runtime_env: RuntimeEnv,
    /// The interpreter a Python application's workers run on (default `$MODELMUX_PYTHON`,
    /// else `python3`).
    #[serde(default)]
    pub python: Option<std::path::PathBuf>,
    /// Its deployments (for a Python application: settings overriding its decorators').
    #[serde(default)]
    pub deployments: Vec<DeploymentConfig>,
}

/// `runtime_env` of a Python application: the part of Ray's that applies to one machine.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeEnv {
    /// A local directory: the workers' current directory, first on their import path.
    #[serde(default)]
    pub working_dir: Option<std::path::PathBuf>,
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
    /// Replicas (default 1, or what a Python deployment's decorator says), or `auto`
    /// (autoscaling with Ray's preset).
    #[serde(default)]
    pub num_replicas: Option<ReplicaCount>,
    /// Ray's `autoscaling_config`: the replica count follows the load.
    #[serde(default)]
    pub autoscaling_config: Option<AutoscalingYaml>,
    /// Requests one replica handles at once (default 5; for `kind: llm`, the engine's
    /// `max_num_seqs`, so a replica counts as saturated when its batch is full).
    #[serde(default)]
    pub max_ongoing_requests: Option<NonZeroUsize>,
    /// Requests that may wait for a replica (default 1024).
    #[serde(default)]
    pub max_queued_requests: Option<usize>,
    /// Longest wait in the queue, in seconds.
    #[serde(default = "default_queue_timeout")]
    pub queue_timeout_s: Seconds,
    /// Models per replica: a positive number, or -1 for no limit (Ray's convention); default 3
    /// (for a Python deployment, its `@serve.multiplexed` cap).
    #[serde(default)]
    pub max_models_per_replica: Option<ModelCap>,
    /// Bytes of models per replica.
    #[serde(default)]
    pub max_bytes_per_replica: Option<u64>,
    /// Which idle model is evicted first: `gdsf` (the default: frequency, load cost and size
    /// aware, so a model asked for once does not push out a popular one) or `lru` (as Ray).
    #[serde(default)]
    pub eviction_policy: EvictionPolicyName,
    /// Loads running at once per replica; by default half the model slots (rounded up), at
    /// most 4, so loads in flight never evict more than half of what a replica can serve.
    #[serde(default)]
    pub max_concurrent_loads: Option<NonZeroUsize>,
    /// Longest a model load may take, in seconds.
    #[serde(default = "default_load_timeout")]
    pub model_load_timeout_s: Seconds,
    /// Whether its calls may run twice: in a cluster, a request that fails in flight on
    /// another node is then retried on another replica (default false: the client gets a
    /// 502), and a request whose replica stopped under it (a Python worker that died) runs
    /// again (default: a 503). One that never reached its node is always sent elsewhere.
    #[serde(default)]
    pub idempotent: bool,
    /// What kind of model it serves (none for a Python application's deployments: their code
    /// says).
    #[serde(default)]
    pub model: Option<ModelSpec>,
    /// A Python deployment's `user_config`, given to its `reconfigure` (Ray's).
    #[serde(default)]
    pub user_config: Option<serde_json::Value>,
}

impl DeploymentConfig {
    /// Its autoscaling, from `num_replicas` and `autoscaling_config` (`None`: a fixed
    /// count); the message says what is wrong.
    pub fn autoscaling(&self) -> Result<Option<modelmux_serve::AutoscalingConfig>, String> {
        autoscaling::resolve(self.num_replicas, self.autoscaling_config.as_ref())
    }
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
        let config: Config = serde_yaml_ng::from_str(text)
            .map_err(|e| ConfigError::Parse(explain::parse_error(text, &e)))?;
        if config.applications.is_empty() {
            return Err(ConfigError::Invalid(
                "applications: at least one application is needed".into(),
            ));
        }
        for (i, app) in config.applications.iter().enumerate() {
            python::validate(i, app)?;
            if app.deployments.is_empty() && app.import_path.is_none() {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}] ('{}'): at least one deployment (or an import_path) is needed",
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
                if let Err(e) = d.autoscaling() {
                    return Err(ConfigError::Invalid(format!(
                        "applications[{i}].deployments[{j}] ('{}'): {e}",
                        d.name
                    )));
                }
                if let Some(model) = &d.model
                    && let Err(e) = model.validate()
                {
                    return Err(ConfigError::Invalid(format!(
                        "applications[{i}].deployments[{j}].model.{e}"
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
            if modelmux_serve::is_reserved_route_prefix(p) {
                return Err(ConfigError::Invalid(format!(
                    "applications[{i}].route_prefix: '{p}' is reserved for the admin API (/-/..., /metrics, /health)"
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
        if config.logging.max_buffered_bytes == 0 {
            return Err(ConfigError::Invalid(
                "logging.max_buffered_bytes: must be at least 1".into(),
            ));
        }
        if let Some(level) = &config.logging.level {
            tracing_subscriber::EnvFilter::try_new(level).map_err(|e| {
                ConfigError::Invalid(format!("logging.level: '{level}' is not a log filter such as 'info' or 'info,modelmux::access=warn': {e}"))
            })?;
        }
        config.bind_address()?;
        config
            .http_options
            .limits()
            .validate()
            .map_err(|e| ConfigError::Invalid(format!("http_options: {e}")))?;
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
        self.build(false).await.map(|(builder, _)| builder)
    }

    /// [`server`](Self::server), and the disk cache it opened (which a reconfiguration of the
    /// running server builds its deployments with).
    pub async fn server_and_cache(
        &self,
    ) -> Result<(ServerBuilder, Option<DiskCache>), ConfigError> {
        self.build(false).await
    }

    /// Checks everything [`server`](Self::server) checks, without taking the disk cache's
    /// directory (a running server may hold it).
    pub async fn check(&self) -> Result<(), ConfigError> {
        self.build(true).await.map(drop)
    }

    async fn build(
        &self,
        check_only: bool,
    ) -> Result<(ServerBuilder, Option<DiskCache>), ConfigError> {
        let remote = self
            .applications
            .iter()
            .flat_map(|a| &a.deployments)
            .any(|d| d.model.as_ref().is_some_and(ModelSpec::needs_disk_cache));
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
        let admin = self.http_options.admin();
        let mut builder = modelmux_front::Server::builder()
            .bind(self.bind_address()?)
            .http_options(self.http_options.limits())
            .admin_access(admin.clone());
        if let Some(t) = &self.tracing {
            if !(0.0..=1.0).contains(&t.sample_ratio) {
                return Err(ConfigError::Invalid(format!(
                    "tracing.sample_ratio {} is not between 0 and 1",
                    t.sample_ratio
                )));
            }
            builder = builder.tracing(modelmux_front::TracingOptions {
                otlp_endpoint: t.otlp_endpoint.clone(),
                sample_ratio: t.sample_ratio,
                service_name: t.service_name.clone(),
                node: self.cluster.node_id.clone(),
            });
        }
        for (i, app) in self.applications.iter().enumerate() {
            if app.import_path.is_some() {
                builder = builder.application(python::build(i, app).await?);
                continue;
            }
            let mut application = Application::new(&app.name).route_prefix(&app.route_prefix);
            let ingress = app.ingress.as_deref().unwrap_or(&app.deployments[0].name);
            let context = BuildContext {
                disk_cache: disk_cache.as_ref(),
                admin: &admin,
                route_prefix: &app.route_prefix,
            };
            for (j, d) in app.deployments.iter().enumerate() {
                let (served, front) = build_deployment(i, j, d, &context).await?;
                // The deployment named as the application's ingress takes its HTTP requests:
                // through the kind's own front deployment when it has one.
                application = match (front, d.name == ingress) {
                    (Some(front), true) => application.ingress(front).deployment(served),
                    (Some(front), false) => application.deployment(front).deployment(served),
                    (None, true) => application.ingress(served),
                    (None, false) => application.deployment(served),
                };
            }
            builder = builder.application(application);
        }
        Ok((builder, disk_cache))
    }
}

/// The deployment `applications[i].deployments[j]` (`d`) as the serve layer runs it, and the
/// kind's own front deployment when it has one (an LLM's OpenAI ingress).
async fn build_deployment(
    i: usize,
    j: usize,
    d: &DeploymentConfig,
    context: &BuildContext<'_>,
) -> Result<(DeploymentSpec, Option<DeploymentSpec>), ConfigError> {
    let model = d
        .model
        .as_ref()
        .expect("validated: a deployment names its model");
    let built = model
        .build(&d.name, cache_settings(d, None), context)
        .await
        .map_err(|e| {
            ConfigError::Invalid(format!("applications[{i}].deployments[{j}].model: {e}"))
        })?;
    let served = settings(built.served, d, built.default_max_ongoing);
    Ok((served, built.front))
}

/// The replicas' model cache for `d`: its caps, eviction policy and load limits; `code_cap`
/// is the model cap its code declares (a Python deployment's `@serve.multiplexed`), which the
/// configuration's overrides.
fn cache_settings(d: &DeploymentConfig, code_cap: Option<ModelCap>) -> MultiplexerBuilder {
    let cap = d.max_models_per_replica.or(code_cap).unwrap_or_default();
    let concurrent_loads = concurrent_loads(d, cap);
    let mut cache = Multiplexer::builder()
        .max_concurrent_loads(concurrent_loads)
        .load_timeout(Some(d.model_load_timeout_s.0))
        .eviction_policy(match d.eviction_policy {
            EvictionPolicyName::Lru => EvictionPolicy::Lru,
            EvictionPolicyName::Gdsf => EvictionPolicy::Gdsf,
        });
    cache = match cap.0 {
        Some(n) => cache.max_models(n),
        None => cache.unbounded_models(),
    };
    if let Some(bytes) = d.max_bytes_per_replica {
        cache = cache.max_bytes(bytes);
    }
    cache
}

/// Loads running at once on a replica of `d` whose model cap is `cap`: the configuration's, or
/// half the slots (rounded up), from 1 to 4.
fn concurrent_loads(d: &DeploymentConfig, cap: ModelCap) -> usize {
    d.max_concurrent_loads.map_or_else(
        || cap.0.map_or(4, |models| models.div_ceil(2).clamp(1, 4)),
        NonZeroUsize::get,
    )
}

/// The deployment settings of `d` on `spec`; `max_ongoing_requests` falls back to `default`,
/// or to what `spec` has when `None`.
fn settings(
    spec: modelmux_serve::DeploymentSpec,
    d: &DeploymentConfig,
    default: Option<usize>,
) -> modelmux_serve::DeploymentSpec {
    let mut spec = spec.num_replicas(d.num_replicas.and_then(ReplicaCount::fixed).unwrap_or(1));
    if let Ok(Some(autoscaling)) = d.autoscaling() {
        spec = spec.autoscaling(autoscaling);
    }
    let mut spec = spec
        .max_queued_requests(d.max_queued_requests.unwrap_or_else(default_max_queued))
        .queue_timeout(d.queue_timeout_s.0)
        .idempotent(d.idempotent);
    if let Some(n) = d.max_ongoing_requests.map(NonZeroUsize::get).or(default) {
        spec = spec.max_ongoing_requests(n);
    }
    spec
}
