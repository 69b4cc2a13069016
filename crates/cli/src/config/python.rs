//! Python applications in the configuration (Ray's `import_path` and `runtime_env`): checked
//! while parsing, inspected (their module imported by the interpreter the workers will run on)
//! while building, and served as deployments whose settings come from their decorators,
//! overridden by the file's `deployments` entries.

use modelmux_serve::Application;

use super::{AppConfig, ConfigError};
#[cfg(feature = "python")]
use super::{DeploymentConfig, ModelCap, cache_settings};

/// Checks what parsing can: a Python application's entries only override settings, and only a
/// Python application takes Python's keys.
pub(super) fn validate(i: usize, app: &AppConfig) -> Result<(), ConfigError> {
    let at =
        |what: String| ConfigError::Invalid(format!("applications[{i}] ('{}'): {what}", app.name));
    if let Some(path) = &app.import_path {
        if !cfg!(feature = "python") {
            return Err(at(format!(
                "import_path: {}",
                super::not_built("python", "a Python application")
            )));
        }
        if path.trim().is_empty() {
            return Err(at("import_path: must name `module:attribute`".into()));
        }
        if let Some((j, _)) = app
            .deployments
            .iter()
            .enumerate()
            .find(|(_, d)| d.model.is_some())
        {
            return Err(at(format!(
                "deployments[{j}].model: a Python application's deployments are its code's; these entries only override their settings"
            )));
        }
        return Ok(());
    }
    if app.runtime_env.working_dir.is_some() {
        return Err(at(
            "runtime_env: only a Python application (with import_path) takes it".into(),
        ));
    }
    if app.python.is_some() {
        return Err(at(
            "python: only a Python application (with import_path) takes it".into(),
        ));
    }
    for (j, d) in app.deployments.iter().enumerate() {
        if d.model.is_none() {
            return Err(at(format!(
                "deployments[{j}].model: missing (each deployment names its model kind, or the application an import_path)"
            )));
        }
        if d.user_config.is_some() {
            return Err(at(format!(
                "deployments[{j}].user_config: only a Python deployment takes it"
            )));
        }
    }
    Ok(())
}

/// A Python application, in a modelmux built without the `python` feature: [`validate`]
/// refuses it before it gets here.
#[cfg(not(feature = "python"))]
pub(super) async fn build(i: usize, app: &AppConfig) -> Result<Application, ConfigError> {
    Err(ConfigError::Invalid(format!(
        "applications[{i}] ('{}'): import_path: {}",
        app.name,
        super::not_built("python", "a Python application")
    )))
}

/// Imports application `app` (the `i`th) and builds its deployments.
#[cfg(feature = "python")]
pub(super) async fn build(i: usize, app: &AppConfig) -> Result<Application, ConfigError> {
    use modelmux_python::{PythonApp, default_python};
    let at =
        |what: String| ConfigError::Invalid(format!("applications[{i}] ('{}'): {what}", app.name));
    let import_path = app.import_path.as_deref().expect("a Python application");
    let python = app.python.clone().unwrap_or_else(default_python);
    let inspected =
        PythonApp::inspect(&python, import_path, app.runtime_env.working_dir.as_deref())
            .await
            .map_err(|e| at(format!("import_path '{import_path}': {e}")))?;
    for (j, d) in app.deployments.iter().enumerate() {
        if !inspected.deployments().iter().any(|p| p.name == d.name) {
            let names: Vec<&str> = inspected
                .deployments()
                .iter()
                .map(|p| p.name.as_str())
                .collect();
            return Err(at(format!(
                "deployments[{j}].name: the application has no deployment '{}' (it has: {})",
                d.name,
                names.join(", ")
            )));
        }
    }
    let ingress = app.ingress.as_deref().unwrap_or(inspected.ingress());
    if !inspected.deployments().iter().any(|p| p.name == ingress) {
        return Err(at(format!(
            "ingress: the application has no deployment '{ingress}'"
        )));
    }
    let mut application = Application::new(&app.name).route_prefix(&app.route_prefix);
    for deployment in inspected.deployments() {
        let overrides = app.deployments.iter().find(|d| d.name == deployment.name);
        let code_cap = deployment.multiplexed.as_ref().map(|m| {
            ModelCap(match m.max_num_models_per_replica {
                Some(n) if n > 0 => Some(n as usize),
                Some(_) => None,
                None => Some(3),
            })
        });
        let cache = overrides.map_or_else(
            || {
                cache_settings(
                    &DeploymentConfig::python_default(&deployment.name),
                    code_cap,
                )
            },
            |d| cache_settings(d, code_cap),
        );
        let bytes = overrides.and_then(|d| d.max_bytes_per_replica).or_else(|| {
            deployment
                .multiplexed
                .as_ref()
                .and_then(|m| m.max_bytes_per_replica)
        });
        let cache = match bytes {
            Some(bytes) => cache.max_bytes(bytes),
            None => cache,
        };
        let user_config = overrides.and_then(|d| d.user_config.clone());
        let mut spec =
            inspected.deployment_spec(deployment, &app.route_prefix, Some(cache), user_config);
        // The decorator's scaling, unless the YAML gives its own.
        let yaml_scales =
            overrides.is_some_and(|d| d.num_replicas.is_some() || d.autoscaling_config.is_some());
        if !yaml_scales
            && let Some(autoscaling) =
                super::autoscaling::from_python(&deployment.options).map_err(at)?
        {
            spec = spec.autoscaling(autoscaling);
        }
        if let Some(d) = overrides {
            if let Some(n) = d.num_replicas.and_then(super::ReplicaCount::fixed) {
                spec = spec.num_replicas(n);
            }
            if let Ok(Some(autoscaling)) = d.autoscaling() {
                spec = spec.autoscaling(autoscaling);
            }
            if let Some(n) = d.max_ongoing_requests {
                spec = spec.max_ongoing_requests(n.get());
            }
            if let Some(n) = d.max_queued_requests {
                spec = spec.max_queued_requests(n);
            }
            spec = spec
                .queue_timeout(d.queue_timeout_s.0)
                .idempotent(d.idempotent);
        }
        application = if deployment.name == ingress {
            application.ingress(spec)
        } else {
            application.deployment(spec)
        };
    }
    Ok(application)
}

#[cfg(feature = "python")]
impl DeploymentConfig {
    /// The settings of a Python deployment the file does not mention.
    fn python_default(name: &str) -> Self {
        let yaml = format!("name: {}\n", serde_json::Value::from(name));
        serde_yaml_ng::from_str(&yaml).expect("a name alone is a valid deployment entry")
    }
}
