//! A Python deployment's replica as the serve layer sees it: a [`Deployment`] whose requests go
//! to the replica's worker process, and whose `@serve.multiplexed` models are the replica's
//! cache entries (loaded on the cache's orders, never by the worker on its own).

use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{BoxError, Failure, Multiplexer, MultiplexerBuilder};
use modelmux_serve::{Deployment, DeploymentSpec, ReplicaContext, Request, Response};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::callbacks::ReplicaCallbacks;
use crate::conn::Callbacks;
use crate::model::{PyLoader, PyModel};
use crate::process::{self, Launch};
use crate::supervisor::{self, Worker, WorkerState};

/// Longest wait for a worker to start, and for a restarting one to come back.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(60);

/// What every replica of one Python deployment is started from.
#[derive(Clone)]
pub(crate) struct ReplicaPlan {
    /// The interpreter.
    pub(crate) python: std::path::PathBuf,
    /// The application's source (`import:module:attr` or `pickle:path`).
    pub(crate) app_source: String,
    /// Its working directory.
    pub(crate) working_dir: Option<std::path::PathBuf>,
    /// Its route prefix as ASGI's `root_path` (`""` for `/`).
    pub(crate) root_path: String,
    /// `reconfigure`'s argument.
    pub(crate) user_config: Option<serde_json::Value>,
    /// The replicas' model cache, when the deployment has a multiplexed loader.
    pub(crate) cache: Option<MultiplexerBuilder>,
}

/// The deployment `name`, its replicas started from `plan`.
pub(crate) fn spec(name: &str, plan: ReplicaPlan) -> DeploymentSpec {
    let plan = Arc::new(plan);
    DeploymentSpec::new(name, move |ctx| {
        let plan = plan.clone();
        async move {
            PythonReplica::start(&plan, ctx)
                .await
                .map_err(BoxError::from)
        }
    })
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One replica: its worker (through the supervisor's state) and its model cache.
pub(crate) struct PythonReplica {
    state: watch::Receiver<WorkerState>,
    models: Option<Multiplexer<PyModel>>,
    root_path: String,
    _supervisor: AbortOnDrop,
}

impl PythonReplica {
    async fn start(plan: &ReplicaPlan, ctx: ReplicaContext) -> Result<Self, Failure> {
        let mut spec = serde_json::Map::new();
        spec.insert("app_source".into(), plan.app_source.clone().into());
        spec.insert(
            "working_dir".into(),
            plan.working_dir
                .as_ref()
                .map(|d| d.to_string_lossy().into_owned())
                .into(),
        );
        spec.insert("app_name".into(), ctx.app().into());
        spec.insert("deployment".into(), ctx.deployment().into());
        spec.insert("replica_id".into(), ctx.replica_id().into());
        spec.insert(
            "user_config".into(),
            plan.user_config.clone().unwrap_or(serde_json::Value::Null),
        );
        let launch = Launch {
            python: plan.python.clone(),
            spec,
            replica_id: ctx.replica_id().to_string(),
            start_timeout: START_TIMEOUT,
        };
        let (state_tx, state) = watch::channel(WorkerState::Restarting);
        let models = plan.cache.clone().map(|cache| {
            ctx.multiplexer(
                cache,
                PyLoader {
                    state: state.clone(),
                    wait: START_TIMEOUT,
                },
            )
        });
        let callbacks: Arc<dyn Callbacks> = Arc::new(ReplicaCallbacks {
            ctx: ctx.clone(),
            models: models.clone(),
        });
        let started = process::start(&launch, callbacks.clone())
            .await
            .map_err(|e| Failure::internal(format!("replica {}: {e}", ctx.replica_id())))?;
        state_tx.send_replace(WorkerState::Ready(Arc::new(Worker {
            conn: started.conn.clone(),
        })));
        let supervisor = tokio::spawn(supervisor::supervise(
            started.child,
            started.conn,
            launch,
            callbacks,
            state_tx,
            models.clone(),
        ));
        Ok(Self {
            state,
            models,
            root_path: plan.root_path.clone(),
            _supervisor: AbortOnDrop(supervisor),
        })
    }

    async fn control(&self, op: serde_json::Value) -> Result<(), BoxError> {
        let worker = supervisor::ready(&self.state, Duration::ZERO).await?;
        match worker.conn.control(&op).await {
            Ok(reply) if reply.ok => Ok(()),
            Ok(reply) => Err(Failure::internal(
                reply
                    .error
                    .map_or_else(|| "failed".into(), |e| e.to_string()),
            )
            .into()),
            Err(reason) => Err(Failure::internal(reason).into()),
        }
    }
}

impl Deployment for PythonReplica {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        let model_id = modelmux_context::multiplexed_model_id();
        let response = match (&self.models, model_id) {
            (Some(models), Some(id)) => {
                let mut guard = modelmux_serve::waiting_for_load(models.get(&id)).await?;
                if guard.worker.conn.closed_reason().is_some() {
                    // Loaded by a worker that just died, before the supervisor evicted its
                    // models: evict it now and load it in the worker that replaces it.
                    drop(guard);
                    models.evict(&id);
                    guard = modelmux_serve::waiting_for_load(models.get(&id)).await?;
                }
                // The worker that loaded it (after a restart, the current one may be newer;
                // the old one's models are being evicted).
                let conn = guard.worker.conn.clone();
                crate::request::forward(&conn, request, &self.root_path, guard).await
            }
            _ => {
                // (A multiplexed request waits for its worker in the loader instead.)
                let worker = supervisor::ready(&self.state, START_TIMEOUT).await?;
                crate::request::forward(&worker.conn, request, &self.root_path, ()).await
            }
        };
        response.map_err(BoxError::from)
    }

    async fn check_health(&self) -> Result<(), BoxError> {
        self.control(serde_json::json!({"op": "health"})).await
    }

    async fn control(&self, name: &str, body: bytes::Bytes) -> Result<serde_json::Value, BoxError> {
        match name {
            // Ray's `user_config` update: the body is the new config.
            "reconfigure" => {
                let user_config: serde_json::Value =
                    serde_json::from_slice(&body).map_err(|e| {
                        Failure::invalid_input(format!(
                            "reconfigure's body must be the user_config as JSON: {e}"
                        ))
                    })?;
                PythonReplica::control(
                    self,
                    serde_json::json!({"op": "reconfigure", "user_config": user_config}),
                )
                .await?;
                Ok(serde_json::json!({"reconfigured": true}))
            }
            other => Err(modelmux_serve::ServeError::NotFound {
                what: format!("this deployment has no control '{other}' (it has: reconfigure)"),
            }
            .into()),
        }
    }
}
