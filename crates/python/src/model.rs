//! A Python model as the replica's cache holds it: the object lives in the worker; the cache
//! holds a token for it, and its unload tells the worker to drop the object.

use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{BoxError, ErrorKind, Failure, Loader, Model, ModelId};
use tokio::sync::watch;

use crate::supervisor::{self, Worker, WorkerState};

/// A model loaded in a worker.
pub(crate) struct PyModel {
    /// The worker holding it (a model outlives neither its worker's process nor the
    /// connection: after a restart, the old worker's models are evicted).
    pub(crate) worker: Arc<Worker>,
    id: ModelId,
    size: Option<u64>,
}

impl Model for PyModel {
    fn size_bytes(&self) -> Option<u64> {
        self.size
    }

    async fn unload(self) -> Result<(), BoxError> {
        let op = serde_json::json!({"op": "unload", "model_id": self.id.as_str()});
        match self.worker.conn.control(&op).await {
            Ok(reply) if reply.ok => Ok(()),
            Ok(reply) => Err(Failure::internal(match reply.error {
                Some(e) => format!("unloading '{}' failed: {e}", self.id),
                None => format!("unloading '{}' failed", self.id),
            })
            .into()),
            // The worker is gone, and its objects with it.
            Err(_) if self.worker.conn.closed_reason().is_some() => Ok(()),
            Err(reason) => Err(Failure::internal(reason).into()),
        }
    }
}

/// Loads models by running the deployment's `@serve.multiplexed` loader in the worker.
pub(crate) struct PyLoader {
    pub(crate) state: watch::Receiver<WorkerState>,
    /// Longest wait for a worker that is restarting.
    pub(crate) wait: Duration,
}

impl Loader<PyModel> for PyLoader {
    async fn load(&self, id: &ModelId) -> Result<PyModel, BoxError> {
        let worker = supervisor::ready(&self.state, self.wait).await?;
        let op = serde_json::json!({"op": "load", "model_id": id.as_str()});
        match worker.conn.control(&op).await {
            Ok(reply) if reply.ok => Ok(PyModel {
                worker,
                id: id.clone(),
                size: reply.size_bytes,
            }),
            // The loader raised: the client sees the exception's type and message (its
            // traceback is in the log, from the worker's stderr).
            Ok(reply) => Err(Failure::internal(match reply.error {
                Some(e) => e.to_string(),
                None => "the loader failed".into(),
            })
            .into()),
            Err(reason) => Err(Failure::new(ErrorKind::Unavailable, reason).into()),
        }
    }
}
