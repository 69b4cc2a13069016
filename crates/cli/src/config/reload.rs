//! Changing a running server's configuration (`modelmux deploy`, `POST /-/deploy`, `SIGHUP`)
//! without losing what did not change. The new configuration is compared with the running
//! one deployment by deployment, as YAML values:
//!
//! - the same: kept (its replicas and their warm models stay);
//! - only `num_replicas` differs: scaled in place (`Controller::scale`: up starts replicas;
//!   down drains the replicas cheapest to lose, after loading their recently used models
//!   elsewhere);
//! - only the caps differ (`max_models_per_replica`, `max_bytes_per_replica`, and maybe
//!   `num_replicas`): set in place (`Controller::set_caps`: a lower cap evicts idle models in
//!   policy order, models in use when they are done; the other models stay warm);
//! - anything else differs (model source, kind, caps, limits): rolled (`Controller::roll`:
//!   new replicas start and take traffic before the old ones drain).
//!
//! A configuration that does not parse or validate, whose models cannot be opened, or that
//! changes what needs a restart (the listener, logging, the cluster, the disk cache, the set
//! of applications and deployments) is refused whole: nothing changes. A Python application
//! whose code or settings changed is imported again and its deployments replaced (`Replace`):
//! the deploy answers once the old replicas have shut down, their models unloaded.
//! Deploys are applied one at a time.

use std::path::PathBuf;
use std::sync::{Arc, OnceLock};

use modelmux_front::Deployer;
use modelmux_serve::{AdminAccess, Controller, DeploymentSpec, Reconfiguration, ServeError};
use modelmux_store::DiskCache;
use serde_json::{Value as Json, json};
use serde_yaml_ng::Value;
use tokio::time::Instant;

use super::kinds::BuildContext;
use super::{Config, build_deployment};

/// What a deploy does to one deployment.
enum Change {
    Keep,
    Scale(usize),
    /// New caps (and replica count), in place; the new spec for replicas started later.
    Caps(Box<DeploymentSpec>, Option<usize>, Option<u64>, usize),
    /// The served deployment and the kind's front deployment, if it has one.
    Roll(Box<(DeploymentSpec, Option<DeploymentSpec>)>),
    /// A deployment of a Python application whose code (or settings) changed: rolled, and
    /// done once its old replicas have shut down (their models' `__del__` run), as Ray's
    /// `serve.run` of a running application is.
    Replace(Box<DeploymentSpec>),
}

/// The configuration a server runs, and how to change it.
pub struct Reloader {
    /// The running configuration's text; the lock makes deploys one at a time.
    running: tokio::sync::Mutex<String>,
    /// Relative paths in a new configuration are resolved against this directory (the
    /// started configuration's).
    base_dir: PathBuf,
    disk_cache: Option<DiskCache>,
    admin: AdminAccess,
    controller: OnceLock<Arc<Controller>>,
}

impl Reloader {
    /// A reloader for a server started from `text` (paths relative to `base_dir`), with the
    /// disk cache it opened.
    pub fn new(
        text: String,
        base_dir: PathBuf,
        disk_cache: Option<DiskCache>,
        admin: AdminAccess,
    ) -> Self {
        Self {
            running: tokio::sync::Mutex::new(text),
            base_dir,
            disk_cache,
            admin,
            controller: OnceLock::new(),
        }
    }

    /// The server's controller, once it has started.
    pub fn attach(&self, controller: Arc<Controller>) {
        let _ = self.controller.set(controller);
    }

    /// Applies `text` as the new configuration; answers what changed per deployment.
    pub async fn apply(&self, text: &str) -> Result<Json, ServeError> {
        let started = Instant::now();
        let controller = self
            .controller
            .get()
            .ok_or(ServeError::ShuttingDown)?
            .clone();
        let mut running = self.running.lock().await;
        let refuse = |message: String| ServeError::BadRequest {
            message: format!("the new configuration is refused, nothing changed: {message}"),
        };
        let mut next = Config::parse(text).map_err(|e| refuse(e.to_string()))?;
        next.resolve_paths(&self.base_dir);
        let (old, new) = (yaml(&running)?, yaml(text)?);
        needs_no_restart(&old, &new).map_err(refuse)?;
        // Build every rolled deployment before changing anything: a model that cannot be
        // opened refuses the whole configuration.
        let mut plan = Vec::new();
        for (i, app) in next.applications.iter().enumerate() {
            if app.import_path.is_some() {
                if old["applications"][i] != new["applications"][i] {
                    for spec in self
                        .python_replacements(i, app, &controller)
                        .await
                        .map_err(refuse)?
                    {
                        let name = spec.config().name.clone();
                        plan.push((app.name.clone(), name, Change::Replace(Box::new(spec))));
                    }
                }
                continue;
            }
            let context = BuildContext {
                disk_cache: self.disk_cache.as_ref(),
                admin: &self.admin,
                route_prefix: &app.route_prefix,
            };
            for (j, d) in app.deployments.iter().enumerate() {
                let (before, after) = (
                    &old["applications"][i]["deployments"][j],
                    &new["applications"][i]["deployments"][j],
                );
                let replicas = d
                    .num_replicas
                    .and_then(super::ReplicaCount::fixed)
                    .unwrap_or(1);
                // An autoscaled deployment's count is its autoscaler's: a change of its
                // scaling settings rolls it (its autoscaler reads the new ones from the spec).
                let autoscaled = |v: &Value| {
                    v["num_replicas"].as_str() == Some("auto") || !v["autoscaling_config"].is_null()
                };
                let fixed = !autoscaled(before) && !autoscaled(after);
                let change = if before == after {
                    Change::Keep
                } else if fixed && without(before, SCALE) == without(after, SCALE) {
                    Change::Scale(replicas)
                } else if fixed && without(before, CAPS) == without(after, CAPS) {
                    let (served, _) = build_deployment(i, j, d, &context)
                        .await
                        .map_err(|e| refuse(e.to_string()))?;
                    let caps = super::cache_settings(d, None);
                    let (models, bytes) = (caps.config().max_models, caps.config().max_bytes);
                    Change::Caps(Box::new(served), models, bytes, replicas)
                } else {
                    if d.model
                        .as_ref()
                        .is_some_and(super::ModelSpec::needs_disk_cache)
                        && self.disk_cache.is_none()
                    {
                        return Err(refuse(format!(
                            "deployment '{}' now reads from a remote store, which needs the disk cache: restart the server",
                            d.name
                        )));
                    }
                    let (served, front) = build_deployment(i, j, d, &context)
                        .await
                        .map_err(|e| refuse(e.to_string()))?;
                    Change::Roll(Box::new((served, front)))
                };
                plan.push((app.name.clone(), d.name.clone(), change));
            }
        }
        let report = carry_out(controller.reconfiguration(), plan, &old, &new).await?;
        *running = text.to_owned();
        Ok(json!({
            "deployments": report,
            "took_ms": started.elapsed().as_secs_f64() * 1e3,
        }))
    }
}

impl Reloader {
    /// The deployments of Python application `app` (the `i`th), imported again, to replace
    /// its running ones: the same deployments by name (another set needs a restart).
    async fn python_replacements(
        &self,
        i: usize,
        app: &super::AppConfig,
        controller: &Controller,
    ) -> Result<Vec<DeploymentSpec>, String> {
        let specs = super::python::build(i, app)
            .await
            .map_err(|e| e.to_string())?
            .into_deployments();
        let mut running: Vec<String> = controller
            .node()
            .deployments()
            .into_iter()
            .filter(|(a, _)| *a == app.name)
            .map(|(_, d)| d)
            .collect();
        let mut built: Vec<String> = specs.iter().map(|s| s.config().name.clone()).collect();
        running.sort();
        built.sort();
        if running != built {
            return Err(format!(
                "application '{}': its deployments changed ({running:?} to {built:?}): that needs a restart",
                app.name
            ));
        }
        Ok(specs)
    }

    /// Applies the `applications` of `text` (a configuration deployed to the whole cluster)
    /// over the running configuration: this node keeps its own listener, cluster, cache and
    /// log settings. Nothing happens when they are what runs already.
    pub async fn apply_applications(&self, text: &str) -> Result<Json, ServeError> {
        let deployed = yaml(text)?;
        let merged = {
            let running = self.running.lock().await;
            let mut merged = yaml(&running)?;
            if merged["applications"] == deployed["applications"] {
                return Ok(json!({"deployments": [], "unchanged": true}));
            }
            if let Value::Mapping(m) = &mut merged {
                m.insert(
                    Value::String("applications".into()),
                    deployed["applications"].clone(),
                );
            }
            serde_yaml_ng::to_string(&merged).map_err(|e| ServeError::BadRequest {
                message: format!("the cluster's configuration: {e}"),
            })?
        };
        self.apply(&merged).await
    }
}

impl Deployer for Reloader {
    fn deploy(
        self: Arc<Self>,
        config: String,
    ) -> std::pin::Pin<Box<dyn Future<Output = Result<Json, ServeError>> + Send>> {
        Box::pin(async move { self.apply(&config).await })
    }
}

/// Carries out `plan`, a configuration's changes per deployment (`old` and `new` the running
/// and the new configuration), in order; answers what each did.
async fn carry_out(
    r: &Reconfiguration,
    plan: Vec<(String, String, Change)>,
    old: &Value,
    new: &Value,
) -> Result<Vec<Json>, ServeError> {
    let mut report = Vec::new();
    for (app, deployment, change) in plan {
        let what = match change {
            Change::Keep => json!("kept"),
            Change::Scale(n) => {
                r.scale(&app, &deployment, n).await?;
                json!(format!("scaled to {n}"))
            }
            Change::Caps(spec, models, bytes, n) => {
                r.set_caps(&app, *spec, models, bytes)?;
                let show = |c: Option<String>| c.unwrap_or_else(|| "unbounded".into());
                let mut what = format!(
                    "caps changed in place (max_models {}, max_bytes {})",
                    show(models.map(|m| m.to_string())),
                    show(bytes.map(|b| b.to_string()))
                );
                if replicas_differ(old, new, &app, &deployment) {
                    r.scale(&app, &deployment, n).await?;
                    what.push_str(&format!(", scaled to {n}"));
                }
                json!(what)
            }
            Change::Roll(specs) => {
                let (served, front) = *specs;
                r.roll(&app, served).await?;
                if let Some(front) = front {
                    r.roll(&app, front).await?;
                }
                json!("rolled")
            }
            Change::Replace(spec) => {
                r.roll_and_retire(&app, *spec).await?;
                json!("replaced")
            }
        };
        report.push(json!({"application": app, "deployment": deployment, "change": what}));
    }
    Ok(report)
}

fn yaml(text: &str) -> Result<Value, ServeError> {
    serde_yaml_ng::from_str(text).map_err(|e| ServeError::BadRequest {
        message: format!("the new configuration is refused, nothing changed: {e}"),
    })
}

/// What a Python application's code is: changing these replaces its deployments.
const PYTHON_CODE: &[&str] = &["import_path", "runtime_env", "python"];

/// The settings a change of only these is a scaling.
const SCALE: &[&str] = &["num_replicas"];
/// The settings a change of only these (and the replica count) is made in place.
const CAPS: &[&str] = &[
    "num_replicas",
    "max_models_per_replica",
    "max_bytes_per_replica",
];

/// A deployment's settings without `keys`.
fn without(deployment: &Value, keys: &[&str]) -> Value {
    let mut d = deployment.clone();
    if let Value::Mapping(m) = &mut d {
        for key in keys {
            m.remove(*key);
        }
    }
    d
}

/// Whether `app`'s `deployment` has another `num_replicas` in `new` than in `old`.
fn replicas_differ(old: &Value, new: &Value, app: &str, deployment: &str) -> bool {
    let find = |v: &Value| -> Option<Value> {
        v["applications"]
            .as_sequence()?
            .iter()
            .find(|a| a["name"].as_str() == Some(app))?["deployments"]
            .as_sequence()?
            .iter()
            .find(|d| d["name"].as_str() == Some(deployment))
            .map(|d| d["num_replicas"].clone())
    };
    find(old) != find(new)
}

/// Refuses changes a running server cannot make: anything outside `applications`, another
/// set or order of applications or deployments, an application's own settings, a Python
/// application.
fn needs_no_restart(old: &Value, new: &Value) -> Result<(), String> {
    let keys = |v: &Value| -> Vec<String> {
        match v {
            Value::Mapping(m) => m
                .keys()
                .filter_map(|k| k.as_str().map(str::to_owned))
                .filter(|k| k != "applications")
                .collect(),
            _ => Vec::new(),
        }
    };
    let mut top = keys(old);
    top.extend(keys(new));
    top.sort();
    top.dedup();
    for key in top {
        if old.get(&key) != new.get(&key) {
            return Err(format!("'{key}' changed: that needs a restart"));
        }
    }
    let apps = |v: &Value| v["applications"].as_sequence().cloned().unwrap_or_default();
    let (old_apps, new_apps) = (apps(old), apps(new));
    let names = |apps: &[Value], key: &str| -> Vec<String> {
        apps.iter()
            .map(|a| a[key].as_str().unwrap_or_default().to_owned())
            .collect()
    };
    if names(&old_apps, "name") != names(&new_apps, "name") {
        return Err(format!(
            "the applications changed ({:?} to {:?}): adding, removing or reordering them needs a restart",
            names(&old_apps, "name"),
            names(&new_apps, "name")
        ));
    }
    for (a, b) in old_apps.iter().zip(&new_apps) {
        let name = a["name"].as_str().unwrap_or_default();
        let settings = |app: &Value| {
            let mut app = app.clone();
            if let Value::Mapping(m) = &mut app {
                m.remove("deployments");
            }
            app
        };
        // A Python application may change its code (import path, working directory,
        // interpreter) and its deployments' settings: its deployments are replaced.
        let python = !a["import_path"].is_null() && !b["import_path"].is_null();
        let fixed = |app: &Value| {
            let mut app = settings(app);
            if let (Value::Mapping(m), true) = (&mut app, python) {
                for key in PYTHON_CODE {
                    m.remove(*key);
                }
            }
            app
        };
        if fixed(a) != fixed(b) {
            return Err(format!(
                "application '{name}': its own settings changed (route prefix, ingress, import path, ...): that needs a restart"
            ));
        }
        if python {
            // Its deployments are its code's: the entries only override settings.
            continue;
        }
        let deployments = |app: &Value| {
            app["deployments"]
                .as_sequence()
                .map(|d| names(d, "name"))
                .unwrap_or_default()
        };
        if deployments(a) != deployments(b) {
            return Err(format!(
                "application '{name}': its deployments changed ({:?} to {:?}): adding, removing or reordering them needs a restart",
                deployments(a),
                deployments(b)
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two applications of deployments and a Python application.
    const RUNNING: &str = "
http_options:
  port: 0
applications:
  - name: a
    route_prefix: /a
    deployments:
      - name: A
        num_replicas: 2
        model:
          kind: onnx
          repository: builtin://demo
  - name: b
    route_prefix: /b
    deployments:
      - name: B1
        model:
          kind: onnx
          repository: builtin://demo
      - name: B2
        model:
          kind: onnx
          repository: builtin://demo
  - name: p
    route_prefix: /p
    import_path: app:build
    runtime_env:
      working_dir: /srv/app
    deployments:
      - name: P
        num_replicas: 1
";

    /// `needs_no_restart` of the running configuration and `RUNNING` with `from` replaced
    /// by `to` (which must be in it).
    fn change(from: &str, to: &str) -> Result<(), String> {
        assert!(RUNNING.contains(from), "{from:?}");
        let next = RUNNING.replacen(from, to, 1);
        needs_no_restart(&yaml(RUNNING).unwrap(), &yaml(&next).unwrap())
    }

    fn refused(from: &str, to: &str) -> String {
        change(from, to).expect_err("the change was not refused")
    }

    #[test]
    fn deployment_settings_and_python_code_need_no_restart() {
        assert_eq!(change("", ""), Ok(()));
        assert_eq!(change("num_replicas: 2", "num_replicas: 3"), Ok(()));
        assert_eq!(
            change("repository: builtin://demo", "repository: /models/demo"),
            Ok(())
        );
        // A Python application's code, and its deployments' entries, are replaced in place.
        assert_eq!(change("app:build", "other:build"), Ok(()));
        assert_eq!(change("/srv/app", "/srv/other"), Ok(()));
        assert_eq!(change("- name: P\n", "- name: Q\n"), Ok(()));
    }

    #[test]
    fn outside_the_applications_needs_a_restart() {
        let why = refused("port: 0", "port: 1");
        assert!(why.contains("'http_options' changed"), "{why}");
        let why = refused("http_options:", "logging:\n  level: debug\nhttp_options:");
        assert!(why.contains("'logging' changed"), "{why}");
    }

    #[test]
    fn another_set_or_order_of_applications_needs_a_restart() {
        let added = RUNNING.to_owned() + "  - name: c\n    route_prefix: /c\n    deployments: []\n";
        let why = needs_no_restart(&yaml(RUNNING).unwrap(), &yaml(&added).unwrap()).unwrap_err();
        assert!(
            why.contains(r#"the applications changed (["a", "b", "p"] to ["a", "b", "p", "c"])"#),
            "{why}"
        );
        let why = refused("- name: b\n", "- name: c\n");
        assert!(
            why.contains(r#"the applications changed (["a", "b", "p"] to ["a", "c", "p"])"#),
            "{why}"
        );
        let (a, b) = RUNNING.split_at(RUNNING.find("  - name: b\n").unwrap());
        let (head, a) = a.split_at(a.find("  - name: a\n").unwrap());
        let reordered = format!("{head}{b}{a}");
        let why =
            needs_no_restart(&yaml(RUNNING).unwrap(), &yaml(&reordered).unwrap()).unwrap_err();
        assert!(
            why.contains(r#"the applications changed (["a", "b", "p"] to ["b", "p", "a"])"#),
            "{why}"
        );
    }

    #[test]
    fn an_applications_own_settings_need_a_restart() {
        let why = refused("route_prefix: /b", "route_prefix: /bee");
        assert!(
            why.contains("application 'b': its own settings changed"),
            "{why}"
        );
        // A Python application's settings other than its code are fixed too.
        let why = refused("route_prefix: /p", "route_prefix: /pea");
        assert!(
            why.contains("application 'p': its own settings changed"),
            "{why}"
        );
        // An application becoming a Python one (or no longer one) is another application.
        let why = refused(
            "route_prefix: /a\n",
            "route_prefix: /a\n    import_path: app:a\n",
        );
        assert!(
            why.contains("application 'a': its own settings changed"),
            "{why}"
        );
        let why = refused("    import_path: app:build\n", "");
        assert!(
            why.contains("application 'p': its own settings changed"),
            "{why}"
        );
    }

    #[test]
    fn another_set_or_order_of_deployments_needs_a_restart() {
        let why = refused("- name: B2\n", "- name: B3\n");
        assert!(
            why.contains(
                r#"application 'b': its deployments changed (["B1", "B2"] to ["B1", "B3"])"#
            ),
            "{why}"
        );
        let why = refused("- name: B1\n", "- name: B3\n");
        assert!(
            why.contains(
                r#"application 'b': its deployments changed (["B1", "B2"] to ["B3", "B2"])"#
            ),
            "{why}"
        );
        let why = refused(
            "      - name: A\n",
            "      - name: A0\n        model:\n          kind: onnx\n          repository: builtin://demo\n      - name: A\n",
        );
        assert!(
            why.contains(r#"application 'a': its deployments changed (["A"] to ["A0", "A"])"#),
            "{why}"
        );
    }
}
