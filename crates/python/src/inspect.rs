//! What a Python application is made of, asked of Python itself: the worker's `--inspect` mode
//! imports the application and lists its deployments, the options their decorators set, and
//! their multiplexed loaders, so modelmux can plan replicas before starting any.

use std::path::{Path, PathBuf};
use std::time::Duration;

use modelmux_cache::MultiplexerBuilder;
use modelmux_serve::DeploymentSpec;
use serde::Deserialize;

use crate::replica::{self, ReplicaPlan};

/// Longest an application may take to import.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(120);

/// The interpreter workers run on when the configuration names none: `$MODELMUX_PYTHON`
/// (`python -m modelmux` sets it to its own interpreter); else a `python3` beside this
/// binary (the wheel installs `modelmux` into a virtualenv's `bin/`, beside the interpreter
/// that has the package, which `venv/bin/modelmux` run without activating the virtualenv
/// must still find); else `python3` on `PATH`.
pub fn default_python() -> PathBuf {
    if let Some(python) = std::env::var_os("MODELMUX_PYTHON") {
        return PathBuf::from(python);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.join("python3")));
    beside
        .filter(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from("python3"))
}

/// Why an application cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum PythonError {
    /// The interpreter could not be run.
    #[error(
        "cannot run {python}: {message} (name another with the application's `python`, or MODELMUX_PYTHON)"
    )]
    Interpreter {
        /// The interpreter.
        python: String,
        /// What failed.
        message: String,
    },
    /// The application failed to import, or is not a modelmux application.
    #[error("{0}")]
    App(String),
}

/// A Python application, inspected.
#[derive(Debug, Clone)]
pub struct PythonApp {
    python: PathBuf,
    source: String,
    working_dir: Option<PathBuf>,
    ingress: String,
    deployments: Vec<PythonDeployment>,
}

/// One deployment of a Python application, as its decorators declare it.
#[derive(Debug, Clone, Deserialize)]
pub struct PythonDeployment {
    /// Its name (the `name` option, or the class's name).
    pub name: String,
    /// The options its `@serve.deployment` (or `.options(...)`) set; the rest are unset.
    #[serde(default)]
    pub options: DeploymentOptions,
    /// Its `@serve.multiplexed` loader's caps, when it has one.
    #[serde(default)]
    pub multiplexed: Option<MultiplexedOptions>,
    /// The deployments it gets handles to through `bind`.
    #[serde(default)]
    pub handles: Vec<String>,
    /// Whether the class has `reconfigure`.
    #[serde(default)]
    pub has_reconfigure: bool,
}

/// Options of `@serve.deployment` (Ray's names).
#[derive(Debug, Clone, Default, Deserialize)]
#[allow(missing_docs)]
pub struct DeploymentOptions {
    /// A number, or Ray's `"auto"` (autoscaling): the server resolves it with
    /// `autoscaling_config`, as it resolves the YAML's.
    pub num_replicas: Option<serde_json::Value>,
    /// Ray's `autoscaling_config`, as the decorator was given it.
    pub autoscaling_config: Option<serde_json::Value>,
    pub max_ongoing_requests: Option<usize>,
    /// Ray's `-1` is "no limit".
    pub max_queued_requests: Option<i64>,
    pub user_config: Option<serde_json::Value>,
    pub health_check_period_s: Option<f64>,
    pub health_check_timeout_s: Option<f64>,
    pub graceful_shutdown_timeout_s: Option<f64>,
}

/// Options of `@serve.multiplexed`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct MultiplexedOptions {
    /// Models per replica (Ray's default 3; `-1` for no limit).
    pub max_num_models_per_replica: Option<i64>,
    /// Bytes of models per replica (modelmux's addition; the sizes come from `size_bytes`).
    pub max_bytes_per_replica: Option<u64>,
}

#[derive(Deserialize)]
struct Inspected {
    ok: bool,
    #[serde(default)]
    error: Option<String>,
    #[serde(default)]
    ingress: Option<String>,
    #[serde(default)]
    deployments: Vec<PythonDeployment>,
}

impl PythonApp {
    /// Imports the application `source` (`module:attr`, or `pickle:path` as `serve.run`
    /// writes it) with `python`, `working_dir` first on its import path, and reads its
    /// deployments. A module that fails to import, an attribute that is not a bound
    /// deployment, or an option modelmux does not support is an error naming the file and line.
    pub async fn inspect(
        python: &Path,
        source: &str,
        working_dir: Option<&Path>,
    ) -> Result<Self, PythonError> {
        let source = if source.starts_with("pickle:") || source.starts_with("import:") {
            source.to_string()
        } else {
            format!("import:{source}")
        };
        let spec = serde_json::json!({
            "app_source": source,
            "working_dir": working_dir.map(|d| d.to_string_lossy().into_owned()),
        });
        let run = tokio::process::Command::new(python)
            .args([
                "-m",
                "modelmux._worker",
                "--inspect",
                "--spec",
                &spec.to_string(),
            ])
            // Importing runs user code, which never sees the admin token (nor do workers).
            .env_remove("MODELMUX_ADMIN_TOKEN")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true)
            .output();
        let interpreter = |message: String| PythonError::Interpreter {
            python: python.display().to_string(),
            message,
        };
        let output = tokio::time::timeout(INSPECT_TIMEOUT, run)
            .await
            .map_err(|_| {
                PythonError::App(format!(
                    "importing the application took over {INSPECT_TIMEOUT:?}"
                ))
            })?
            .map_err(|e| interpreter(e.to_string()))?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if stderr.contains("No module named modelmux")
            || stderr.contains("No module named 'modelmux'")
        {
            return Err(interpreter(
                "its Python has no `modelmux` package (pip install ./python from a checkout, or the modelmux wheel)".into(),
            ));
        }
        let inspected: Inspected = serde_json::from_slice(&output.stdout).map_err(|_| {
            PythonError::App(format!(
                "inspecting the application failed ({}): {}",
                output.status,
                stderr.trim()
            ))
        })?;
        if !inspected.ok {
            return Err(PythonError::App(
                inspected.error.unwrap_or_else(|| stderr.trim().to_string()),
            ));
        }
        let ingress = inspected
            .ingress
            .ok_or_else(|| PythonError::App("the application has no ingress deployment".into()))?;
        Ok(Self {
            python: python.to_path_buf(),
            source,
            working_dir: working_dir.map(Path::to_path_buf),
            ingress,
            deployments: inspected.deployments,
        })
    }

    /// The deployment taking the application's HTTP requests (the one bound last).
    pub fn ingress(&self) -> &str {
        &self.ingress
    }

    /// Its deployments, the ingress among them.
    pub fn deployments(&self) -> &[PythonDeployment] {
        &self.deployments
    }

    /// Deployment `d` of this application: its replicas run workers, with the settings its
    /// decorator gave (replicas, requests at once, queue, health checks) applied; `cache`
    /// is the replicas' model cache when it is multiplexed, `user_config` what
    /// `reconfigure` gets at start (the configuration's, else the decorator's).
    pub fn deployment_spec(
        &self,
        d: &PythonDeployment,
        route_prefix: &str,
        cache: Option<MultiplexerBuilder>,
        user_config: Option<serde_json::Value>,
    ) -> DeploymentSpec {
        let plan = ReplicaPlan {
            python: self.python.clone(),
            app_source: self.source.clone(),
            working_dir: self.working_dir.clone(),
            root_path: if route_prefix == "/" {
                String::new()
            } else {
                route_prefix.to_string()
            },
            user_config: user_config.or_else(|| d.options.user_config.clone()),
            cache: if d.multiplexed.is_some() { cache } else { None },
        };
        let o = &d.options;
        let mut spec = replica::spec(&d.name, plan);
        let fixed = (o.num_replicas.as_ref()).and_then(serde_json::Value::as_u64);
        if let Some(n) = fixed
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
        {
            spec = spec.num_replicas(n);
        }
        if let Some(n) = o.max_ongoing_requests.filter(|n| *n > 0) {
            spec = spec.max_ongoing_requests(n);
        }
        if let Some(n) = o.max_queued_requests {
            spec = spec.max_queued_requests(usize::try_from(n).unwrap_or(usize::MAX));
        }
        let secs = |s: Option<f64>| {
            s.filter(|s| s.is_finite() && *s > 0.0)
                .map(Duration::from_secs_f64)
        };
        let config = spec.config().clone();
        spec = spec.health_check(
            secs(o.health_check_period_s).unwrap_or(config.health_check_period),
            secs(o.health_check_timeout_s).unwrap_or(config.health_check_timeout),
        );
        if let Some(t) = secs(o.graceful_shutdown_timeout_s) {
            spec = spec.graceful_shutdown_timeout(t);
        }
        spec
    }
}
