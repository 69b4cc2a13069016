//! Keeping a replica's worker alive: when it dies (a crash, `os._exit`, killed for memory) its
//! requests in flight fail with 503, its models leave the cache (and so the router's view) at
//! once, and a new worker is started, with a backoff that doubles from 0.5 s to 30 s while
//! restarts keep failing.

use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::{ErrorKind, Failure, Multiplexer};
use tokio::process::Child;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::conn::{Callbacks, Conn};
use crate::model::PyModel;
use crate::process::{self, Launch};

/// A worker that is serving.
pub(crate) struct Worker {
    /// Its connection.
    pub(crate) conn: Arc<Conn>,
}

/// Where a replica's worker is.
#[derive(Clone)]
pub(crate) enum WorkerState {
    /// Serving.
    Ready(Arc<Worker>),
    /// Gone; a new one is being started.
    Restarting,
}

/// Waits (at most `timeout`) for a serving worker.
pub(crate) async fn ready(
    state: &watch::Receiver<WorkerState>,
    timeout: Duration,
) -> Result<Arc<Worker>, Failure> {
    let mut state = state.clone();
    // A worker whose connection just closed is still `Ready` until the supervisor notices:
    // wait for its successor.
    let serving =
        |s: &WorkerState| matches!(s, WorkerState::Ready(w) if w.conn.closed_reason().is_none());
    let waited = tokio::time::timeout(timeout, state.wait_for(serving)).await;
    match waited {
        Ok(Ok(guard)) => match &*guard {
            WorkerState::Ready(worker) => Ok(worker.clone()),
            WorkerState::Restarting => unreachable!("waited for a ready worker"),
        },
        Ok(Err(_)) => Err(Failure::new(
            ErrorKind::Unavailable,
            "the replica has stopped",
        )),
        Err(_) => Err(Failure::new(
            ErrorKind::Unavailable,
            format!("the replica's Python worker has not come back within {timeout:?}"),
        )),
    }
}

/// A restart after a worker that served this long starts again from the shortest backoff.
const STABLE: Duration = Duration::from_secs(60);
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Watches the worker `child` on `conn` and restarts it whenever it goes; runs until the
/// replica drops its task.
pub(crate) async fn supervise(
    mut child: Child,
    mut conn: Arc<Conn>,
    launch: Launch,
    callbacks: Arc<dyn Callbacks>,
    state: watch::Sender<WorkerState>,
    models: Option<Multiplexer<PyModel>>,
) {
    let mut backoff = FIRST_BACKOFF;
    loop {
        if let Some(models) = &models {
            // The hook holds the cache, whose models hold this connection: the cycle ends with
            // the connection, which ends with the worker (killed when this task is dropped).
            let models = models.clone();
            conn.on_end(move || {
                for id in models.loaded_ids() {
                    models.evict(&id);
                }
            });
        }
        let served_since = Instant::now();
        let pid = child.id().unwrap_or_default();
        let why = tokio::select! {
            status = child.wait() => match status {
                Ok(status) => format!("exited ({status})"),
                Err(e) => format!("could not be watched: {e}"),
            },
            () = conn.closed() => {
                let reason = conn.closed_reason().unwrap_or_default();
                let _ = child.start_kill();
                let _ = child.wait().await;
                format!("was stopped: {reason}")
            }
        };
        state.send_replace(WorkerState::Restarting);
        let message = format!(
            "the Python worker (pid {pid}) of replica {} {why}",
            launch.replica_id
        );
        // Evicts the worker's models first (the `on_end` above), unless the connection's
        // reader got there first.
        conn.fail_all(&message);
        if served_since.elapsed() > STABLE {
            backoff = FIRST_BACKOFF;
        }
        tracing::warn!(replica = %launch.replica_id, "{message}; starting a new one in {backoff:?}");
        loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(MAX_BACKOFF);
            match process::start(&launch, callbacks.clone()).await {
                Ok(started) => {
                    tracing::info!(replica = %launch.replica_id, pid = started.pid, "Python worker restarted");
                    child = started.child;
                    conn = started.conn;
                    state.send_replace(WorkerState::Ready(Arc::new(Worker { conn: conn.clone() })));
                    break;
                }
                Err(e) => tracing::error!(
                    replica = %launch.replica_id,
                    "the Python worker did not restart: {e}; trying again in {backoff:?}"
                ),
            }
        }
    }
}
