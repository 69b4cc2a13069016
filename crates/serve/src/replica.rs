//! A replica: one instance of a deployment, its model caches, its routing slot, its counters.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use modelmux_cache::{BoxError, DurationHistogram};
use modelmux_context::{RequestContext, RequestId};
use tokio::sync::broadcast::error::RecvError;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::custom_metrics::MetricsSource;
use crate::deployment::{DeploymentSpec, DynDeployment, ReplicaContext};
use crate::handle::HandleDirectory;
use crate::model_cache::ModelCache;
use crate::placement::ReplicaLedger;
use crate::{Request, Response, ServeError};

/// Upper bounds (seconds) of the request-duration histogram: 100 µs to 60 s.
pub(crate) static REQUEST_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    10.0, 60.0,
];

/// Requests one replica served, by status class, and how long they took.
pub(crate) struct RequestMetrics {
    /// Index 0..5 = 1xx..5xx.
    pub(crate) by_class: [AtomicU64; 5],
    pub(crate) duration: DurationHistogram,
}

impl RequestMetrics {
    fn new() -> Self {
        Self {
            by_class: Default::default(),
            duration: DurationHistogram::new(&REQUEST_BUCKETS),
        }
    }

    pub(crate) fn record(&self, status: u16, took: Duration) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.by_class[class].fetch_add(1, Ordering::Relaxed);
        self.duration.observe(took);
    }
}

pub(crate) struct Replica {
    pub(crate) id: Arc<str>,
    pub(crate) deployment: Arc<str>,
    pub(crate) app: Arc<str>,
    /// The cluster node it runs on, if in a cluster.
    pub(crate) node: Option<Arc<str>>,
    instance: Arc<dyn DynDeployment>,
    pub(crate) slot: Arc<ReplicaLedger>,
    pub(crate) caches: Vec<Arc<dyn ModelCache>>,
    pub(crate) metrics: RequestMetrics,
    /// What the deployment adds to `/metrics`.
    pub(crate) metric_sources: Vec<Arc<dyn MetricsSource>>,
    span: tracing::Span,
    feeds: Vec<JoinHandle<()>>,
}

impl Replica {
    /// Builds one replica of `spec`: runs its constructor, then starts feeding its caches'
    /// events into its routing slot.
    pub(crate) async fn start(
        spec: &DeploymentSpec,
        app: &Arc<str>,
        node: Option<&str>,
        handles: HandleDirectory,
        wake: crate::dispatch::Waker,
    ) -> Result<Replica, BoxError> {
        let deployment: Arc<str> = spec.config.name.as_str().into();
        let generated = RequestId::generate();
        let tag = &generated.as_str()[..6];
        let id: Arc<str> = match node {
            Some(node) => format!("{deployment}#{tag}@{node}"),
            None => format!("{deployment}#{tag}"),
        }
        .into();
        let span =
            tracing::info_span!("replica", app = %app, deployment = %deployment, replica = %id);
        let ctx = ReplicaContext {
            app: app.clone(),
            deployment: deployment.clone(),
            replica_id: id.clone(),
            node: node.map(Arc::from),
            caches: Arc::default(),
            metrics: Arc::default(),
            handles,
        };
        // The constructor runs in the replica's span, so multiplexers built in it log there.
        let instance = (spec.factory)(ctx.clone()).instrument(span.clone()).await?;
        let caches = ctx.caches.lock().clone();
        let metric_sources = ctx.metrics.lock().clone();
        let capacity = caches
            .iter()
            .map(|c| c.max_models())
            .sum::<Option<usize>>()
            .filter(|_| !caches.is_empty());
        let bytes = caches
            .iter()
            .map(|c| c.max_bytes())
            .try_fold(0u64, |sum, cap| cap.map(|cap| sum.saturating_add(cap)))
            .filter(|_| !caches.is_empty());
        let slot = Arc::new(
            ReplicaLedger::new(
                id.clone(),
                spec.config.max_ongoing_requests,
                caches.len(),
                capacity,
            )
            .with_byte_capacity(bytes),
        );
        let feeds = caches
            .iter()
            .enumerate()
            .map(|(source, cache)| spawn_feed(source, cache.clone(), slot.clone(), wake.clone()))
            .collect();
        tracing::info!(parent: &span, "replica started");
        Ok(Replica {
            id,
            deployment,
            app: app.clone(),
            node: node.map(Arc::from),
            instance,
            slot,
            caches,
            metrics: RequestMetrics::new(),
            metric_sources,
            span,
            feeds,
        })
    }

    /// Runs the request in `context`, containing a panic.
    pub(crate) async fn call(
        &self,
        request: Request,
        context: RequestContext,
    ) -> Result<Response, ServeError> {
        // A span per request costs an allocation and formatting on every request; the access
        // log line already carries the request id. At debug level each request gets its own
        // span (so a `Loading model` line names the request that triggered it); otherwise the
        // replica's span is reused.
        let request_span = tracing::debug_span!(parent: &self.span, "request", request_id = context.request_id().map_or("-", |r| r.as_str()));
        // Building the future is user code too (a hand-written `fn call` may panic before it
        // returns one), so it happens inside the guarded future.
        let instance = self.instance.clone();
        let call = context.scope(async move { instance.call_boxed(request).await });
        let call = AssertUnwindSafe(call).catch_unwind();
        let result = if request_span.is_disabled() {
            // In the replica's span, entered by reference on each poll: a clone of it per
            // request (what `instrument` needs) costs the subscriber a clone and a close.
            let mut call = std::pin::pin!(call);
            std::future::poll_fn(|cx| {
                let _entered = self.span.enter();
                call.as_mut().poll(cx)
            })
            .await
        } else {
            call.instrument(request_span).await
        };
        match result {
            Ok(Ok(response)) => Ok(response),
            Ok(Err(error)) => Err(ServeError::from_deployment(&self.deployment, error)),
            Err(panic) => {
                let message = modelmux_cache::panic_message(&*panic);
                tracing::error!(parent: &self.span, "deployment panicked: {message}");
                Err(ServeError::Panicked {
                    deployment: self.deployment.to_string(),
                    message,
                })
            }
        }
    }

    /// Runs an operator's control on this replica, containing a panic.
    pub(crate) async fn control(
        &self,
        name: &str,
        body: bytes::Bytes,
    ) -> Result<serde_json::Value, ServeError> {
        let instance = self.instance.clone();
        let run = AssertUnwindSafe(async move { instance.control_boxed(name, body).await })
            .catch_unwind();
        match run.await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(e)) => Err(ServeError::from_deployment(&self.deployment, e)),
            Err(panic) => Err(ServeError::Panicked {
                deployment: self.deployment.to_string(),
                message: modelmux_cache::panic_message(&*panic),
            }),
        }
    }

    /// Runs the deployment's health check with a timeout, containing a panic.
    pub(crate) async fn check_health(&self, timeout: Duration) -> Result<(), String> {
        let instance = self.instance.clone();
        let check =
            AssertUnwindSafe(async move { instance.check_health_boxed().await }).catch_unwind();
        match tokio::time::timeout(timeout, check)
            .instrument(self.span.clone())
            .await
        {
            Ok(Ok(Ok(()))) => Ok(()),
            Ok(Ok(Err(e))) => Err(e.to_string()),
            Ok(Err(_)) => Err("the health check panicked".into()),
            Err(_) => Err(format!("the health check took longer than {timeout:?}")),
        }
    }

    /// Sets the caps of each of its model caches (a lower one evicts idle models now and
    /// models in use when they are done), and what placement counts against.
    pub(crate) fn set_caps(&self, max_models: Option<usize>, max_bytes: Option<u64>) {
        for cache in &self.caches {
            cache.set_caps(max_models, max_bytes);
        }
        let n = self.caches.len();
        let total_models = max_models.map(|m| m.saturating_mul(n));
        let total_bytes = max_bytes.map(|b| b.saturating_mul(n as u64));
        self.slot.set_capacity(total_models, total_bytes);
    }

    /// Unloads every model (after in-flight requests are done: the caller drains first).
    pub(crate) async fn shutdown(&self, timeout: Duration) {
        self.slot.set_available(false);
        for cache in &self.caches {
            let report = cache.shutdown(timeout).instrument(self.span.clone()).await;
            if !report.still_draining.is_empty() {
                tracing::warn!(parent: &self.span, still_draining = ?report.still_draining, "models still in use at shutdown");
            }
        }
        for feed in &self.feeds {
            feed.abort();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        for feed in &self.feeds {
            feed.abort();
        }
    }
}

/// Folds a cache's events into the slot as they happen (and wakes requests queued in the
/// router, whose choice may change); resynchronises after lagging.
fn spawn_feed(
    source: usize,
    cache: Arc<dyn ModelCache>,
    slot: Arc<ReplicaLedger>,
    wake: crate::dispatch::Waker,
) -> JoinHandle<()> {
    let mut sub = cache.subscribe();
    slot.apply_snapshot(source, &sub.snapshot);
    tokio::spawn(async move {
        loop {
            match sub.events.recv().await {
                Ok(event) => {
                    slot.apply(source, &event);
                    wake.wake();
                }
                Err(RecvError::Lagged(_)) => {
                    sub = cache.subscribe();
                    slot.apply_snapshot(source, &sub.snapshot);
                    wake.wake();
                }
                Err(RecvError::Closed) => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::ReplicaView;
    use modelmux_cache::{ModelId, Multiplexer};

    struct Nothing;

    impl modelmux_cache::Model for Nothing {}

    #[tokio::test]
    async fn the_ledger_catches_up_with_its_cache_after_the_feed_lagged() {
        // Two events of room per subscriber, and 12 loads registered in one poll (each sends
        // `Loading` at once): the feed lags past ten of them, and only a fresh snapshot tells
        // it those models are loading (placement must not put them elsewhere meanwhile).
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let g = gate.clone();
        let mux: Multiplexer<Nothing> = Multiplexer::builder()
            .max_models(12)
            .max_concurrent_loads(12)
            .event_capacity(2)
            .build(move |_id: ModelId| {
                let gate = g.clone();
                async move {
                    let _open = gate.acquire().await?;
                    Ok::<_, BoxError>(Nothing)
                }
            });
        let slot = Arc::new(ReplicaLedger::new("r".into(), 100, 1, Some(12)));
        let router = Arc::new(crate::deployment_router::DeploymentRouter::new(
            "a".into(),
            crate::deployment::DeploymentConfig::new("d"),
            Arc::default(),
            Arc::default(),
        ));
        let feed = spawn_feed(0, Arc::new(mux.clone()), slot.clone(), router.waker());
        let ids: Vec<ModelId> = (0..12)
            .map(|i| ModelId::new(format!("m{i}")).unwrap())
            .collect();
        let gets: Vec<_> = ids
            .iter()
            .map(|id| {
                let (mux, id) = (mux.clone(), id.clone());
                tokio::spawn(async move { mux.get(id.as_str()).await.map(drop) })
            })
            .collect();
        let agree = |when: &str| {
            let (loading, loaded) = (mux.loading_ids(), mux.loaded_ids());
            let now = tokio::time::Instant::now();
            for id in &ids {
                assert_eq!(
                    slot.holds(id, now),
                    loading.contains(id) || loaded.contains(id),
                    "{when}, {id}: the ledger disagrees with the cache \
                     (loading {loading:?}, loaded {loaded:?})"
                );
            }
        };
        // Every get registers its load (all on this thread, before the feed runs again).
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        assert_eq!(mux.loading_ids().len(), 12);
        agree("while loading");
        gate.add_permits(12);
        for g in gets {
            g.await.unwrap().expect("loads");
        }
        for _ in 0..100 {
            tokio::task::yield_now().await;
        }
        agree("once loaded");
        feed.abort();
    }
}
