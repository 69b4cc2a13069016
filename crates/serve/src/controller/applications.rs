//! The applications of a process as the controller holds them: each one's route prefix, its
//! deployments' routers and current specs, and the handles its replicas call each other
//! through. [`Applications`] is built once, when the controller is; its set of applications
//! and deployments never changes after (a reload that changes it restarts the server), while
//! each deployment's replicas and spec do.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::Notify;

use crate::deployment::DeploymentSpec;
use crate::deployment_router::{CallToken, DeploymentRouter};
use crate::error::{ServeError, StartError};
use crate::handle::{AppDirectory, HandleDirectory};

/// A set of deployments served under one route prefix; requests under the prefix go to its
/// ingress deployment, which may call the others through handles.
#[derive(Clone)]
pub struct Application {
    pub(crate) name: String,
    pub(crate) route_prefix: String,
    pub(crate) deployments: Vec<DeploymentSpec>,
    pub(crate) ingress: Option<String>,
}

impl Application {
    /// An application named `name`, served at `/` until [`route_prefix`](Self::route_prefix)
    /// says otherwise.
    pub fn new(name: &str) -> Self {
        Self {
            name: name.to_string(),
            route_prefix: "/".to_string(),
            deployments: Vec::new(),
            ingress: None,
        }
    }

    /// The path prefix it serves (`/` by default). Requests go to the application with the
    /// longest matching prefix.
    pub fn route_prefix(mut self, prefix: &str) -> Self {
        self.route_prefix = prefix.to_string();
        self
    }

    /// Adds a deployment that other deployments call through handles.
    pub fn deployment(mut self, spec: DeploymentSpec) -> Self {
        self.deployments.push(spec);
        self
    }

    /// The application's deployments, in the order they were added (to roll them one by one
    /// into a running application of the same name).
    pub fn into_deployments(self) -> Vec<DeploymentSpec> {
        self.deployments
    }

    /// Adds the deployment that receives the application's HTTP requests. Without one, the
    /// first deployment added is the ingress.
    pub fn ingress(mut self, spec: DeploymentSpec) -> Self {
        self.ingress = Some(spec.config.name.clone());
        self.deployments.push(spec);
        self
    }

    /// Its ingress deployment's name.
    fn ingress_name(&self) -> String {
        self.ingress
            .clone()
            .unwrap_or_else(|| self.deployments[0].config.name.clone())
    }
}

/// One running application.
pub struct AppState {
    pub(crate) name: Arc<str>,
    pub(crate) route_prefix: String,
    pub(crate) ingress: Arc<DeploymentRouter>,
    /// Each deployment's router and spec (swapped when a reconfiguration rolls it).
    pub(crate) deployments: Vec<(Arc<DeploymentRouter>, SpecCell)>,
    pub(crate) handles: HandleDirectory,
}

/// A deployment's current spec: what new replicas (scaling up, replacing a sick one) are
/// built from.
pub(crate) type SpecCell = Arc<parking_lot::RwLock<DeploymentSpec>>;

impl AppState {
    /// Its name.
    pub fn name(&self) -> &Arc<str> {
        &self.name
    }

    /// Sends `request` to its ingress deployment: what [`Dispatch::dispatch`](crate::Dispatch)
    /// on that deployment does, without boxing the call's future or cloning the
    /// port (the HTTP front's path, once per request). The response does not carry the
    /// request's model as a [`ServedModel`](crate::ServedModel): the caller named it.
    pub fn dispatch(
        &self,
        request: crate::Request,
        context: modelmux_context::RequestContext,
        route: crate::Route,
    ) -> impl Future<Output = crate::Dispatched> + Send + '_ {
        self.ingress.run(request, context, route, false)
    }
}

/// Every running application, in the order they were declared.
pub(crate) struct Applications {
    apps: Vec<AppState>,
}

impl Applications {
    /// The applications with their routers and handles, no replica started; with the
    /// deployments (`app/deployment`) that will start replicas, each router marked starting
    /// (requests wait for it) when `run_replicas`.
    pub(crate) fn build(
        apps: Vec<Application>,
        run_replicas: bool,
        changes: &Arc<Notify>,
        call_token: &Arc<CallToken>,
    ) -> Result<(Self, Vec<String>), StartError> {
        validate(&apps)?;
        // Every application's routers first: a replica may hold handles to any of them.
        let routers: Vec<HashMap<String, Arc<DeploymentRouter>>> = apps
            .iter()
            .map(|app| {
                let name: Arc<str> = app.name.as_str().into();
                app.deployments
                    .iter()
                    .map(|d| {
                        let router = DeploymentRouter::new(
                            name.clone(),
                            d.config.clone(),
                            changes.clone(),
                            call_token.clone(),
                        );
                        (d.config.name.clone(), Arc::new(router))
                    })
                    .collect()
            })
            .collect();
        let directory: Arc<HashMap<String, AppDirectory>> = Arc::new(
            apps.iter()
                .zip(&routers)
                .map(|(app, routers)| {
                    let deployments = routers
                        .iter()
                        .map(|(name, r)| (name.clone(), r.clone() as Arc<dyn crate::Dispatch>))
                        .collect();
                    let app_directory = AppDirectory {
                        ingress: app.ingress_name(),
                        deployments: Arc::new(deployments),
                    };
                    (app.name.clone(), app_directory)
                })
                .collect(),
        );
        let mut starting = Vec::new();
        let mut states = Vec::new();
        for (app, routers) in apps.into_iter().zip(routers) {
            let name: Arc<str> = app.name.as_str().into();
            let handles = HandleDirectory::new(&app.name, directory.clone());
            let ingress = routers[&app.ingress_name()].clone();
            let mut deployments = Vec::new();
            for spec in app.deployments {
                let router = routers[&spec.config.name].clone();
                if run_replicas && spec.config.num_replicas > 0 {
                    starting.push(format!("{name}/{}", spec.config.name));
                    router.set_starting(true);
                }
                deployments.push((router, Arc::new(parking_lot::RwLock::new(spec))));
            }
            states.push(AppState {
                ingress,
                name,
                route_prefix: app.route_prefix,
                deployments,
                handles,
            });
        }
        Ok((Self { apps: states }, starting))
    }

    /// Every application.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, AppState> {
        self.apps.iter()
    }

    /// The application named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<&AppState> {
        self.apps.iter().find(|a| &*a.name == name)
    }

    /// The application whose prefix is the longest one matching `path`.
    pub(crate) fn for_path(&self, path: &str) -> Option<&AppState> {
        self.apps
            .iter()
            .filter(|a| prefix_matches(&a.route_prefix, path))
            .max_by_key(|a| a.route_prefix.len())
    }

    /// Every deployment's router, of every application.
    pub(crate) fn routers(&self) -> impl Iterator<Item = &Arc<DeploymentRouter>> {
        self.apps
            .iter()
            .flat_map(|a| a.deployments.iter().map(|(r, _)| r))
    }

    /// `app`'s deployment `deployment`: its router and spec.
    pub(crate) fn deployment_of(
        &self,
        app: &str,
        deployment: &str,
    ) -> Result<&(Arc<DeploymentRouter>, SpecCell), ServeError> {
        self.get(app)
            .and_then(|a| a.deployments.iter().find(|(r, _)| r.name() == deployment))
            .ok_or_else(|| ServeError::NotFound {
                what: format!("no deployment '{deployment}' in application '{app}'"),
            })
    }

    /// The deployment named `name`, in whichever application has it (refused, saying so,
    /// when several have one so named).
    pub(crate) fn deployment_named(
        &self,
        name: &str,
    ) -> Result<&Arc<DeploymentRouter>, ServeError> {
        let found: Vec<_> = self.routers().filter(|r| r.name() == name).collect();
        match found.as_slice() {
            [router] => Ok(router),
            [] => Err(ServeError::NotFound {
                what: format!("no deployment named '{name}'"),
            }),
            several => Err(ServeError::BadRequest {
                message: format!(
                    "deployment '{name}' exists in applications {}; give deployments distinct names to manage them here",
                    several
                        .iter()
                        .map(|r| format!("'{}'", r.app))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
        }
    }

    /// Every deployment of every application: `(app, deployment)`.
    pub(crate) fn names(&self) -> Vec<(String, String)> {
        self.routers()
            .map(|r| (r.app.to_string(), r.name().to_string()))
            .collect()
    }
}

fn prefix_matches(prefix: &str, path: &str) -> bool {
    prefix == "/"
        || path == prefix
        || (path.starts_with(prefix) && path.as_bytes().get(prefix.len()) == Some(&b'/'))
}

/// Checks that `apps` can run together: distinct names and route prefixes (none of them the
/// admin API's), and each with deployments of distinct names.
pub(crate) fn validate(apps: &[Application]) -> Result<(), StartError> {
    let invalid = |app: &Application, message: String| StartError::InvalidApplication {
        app: app.name.clone(),
        message,
    };
    let mut names = HashSet::new();
    let mut prefixes = HashSet::new();
    for app in apps {
        if !names.insert(&app.name) {
            return Err(invalid(app, "two applications have this name".into()));
        }
        let p = &app.route_prefix;
        if !p.starts_with('/') || (p.len() > 1 && p.ends_with('/')) {
            return Err(invalid(
                app,
                format!("route_prefix '{p}' must start with '/' and not end with one"),
            ));
        }
        if crate::access::is_reserved_route_prefix(p) {
            return Err(invalid(
                app,
                format!(
                    "route_prefix '{p}' is reserved for the admin API (/-/..., /metrics, /health)"
                ),
            ));
        }
        if !prefixes.insert(p) {
            return Err(invalid(
                app,
                format!("route_prefix '{p}' is used by another application"),
            ));
        }
        if app.deployments.is_empty() {
            return Err(invalid(app, "it has no deployments".into()));
        }
        let mut deployment_names = HashSet::new();
        for d in &app.deployments {
            if !deployment_names.insert(&d.config.name) {
                return Err(invalid(
                    app,
                    format!("two deployments are named '{}'", d.config.name),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_match_whole_segments() {
        assert!(prefix_matches("/", "/anything"));
        assert!(prefix_matches("/api", "/api"));
        assert!(prefix_matches("/api", "/api/v1"));
        assert!(!prefix_matches("/api", "/apis"));
    }
}
