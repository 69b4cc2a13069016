//! A model cache as the serve layer sees it, whatever its model type: what the replica, the
//! admin API and the metrics need of a `Multiplexer<M>`, behind one object-safe trait.

use std::time::Duration;

use futures_util::future::BoxFuture;
use modelmux_cache::{
    MetricsSnapshot, Model, ModelInfo, Multiplexer, ShutdownReport, Subscription,
};

/// A model cache as the serve layer sees it, whatever its model type.
pub(crate) trait ModelCache: Send + Sync + 'static {
    fn models(&self) -> Vec<ModelInfo>;
    fn draining(&self) -> Vec<String>;
    fn metrics(&self) -> MetricsSnapshot;
    fn max_models(&self) -> Option<usize>;
    fn max_bytes(&self) -> Option<u64>;
    /// Loads it runs at once (its load slots).
    fn max_concurrent_loads(&self) -> usize;
    fn set_caps(&self, max_models: Option<usize>, max_bytes: Option<u64>);
    fn subscribe(&self) -> Subscription;
    fn load(&self, id: &str, pin: bool) -> BoxFuture<'_, Result<(), modelmux_cache::Error>>;
    fn evict(&self, id: &str) -> bool;
    fn unpin(&self, id: &str) -> bool;
    fn shutdown(&self, timeout: Duration) -> BoxFuture<'_, ShutdownReport>;
}

impl<M: Model> ModelCache for Multiplexer<M> {
    fn models(&self) -> Vec<ModelInfo> {
        Multiplexer::models(self)
    }
    fn draining(&self) -> Vec<String> {
        Multiplexer::draining(self)
            .into_iter()
            .map(|(id, _, _)| id.to_string())
            .collect()
    }
    fn metrics(&self) -> MetricsSnapshot {
        Multiplexer::metrics(self)
    }
    fn max_models(&self) -> Option<usize> {
        self.caps().0
    }
    fn max_bytes(&self) -> Option<u64> {
        self.caps().1
    }
    fn max_concurrent_loads(&self) -> usize {
        self.config().max_concurrent_loads
    }
    fn set_caps(&self, max_models: Option<usize>, max_bytes: Option<u64>) {
        Multiplexer::set_caps(self, max_models, max_bytes);
    }
    fn subscribe(&self) -> Subscription {
        Multiplexer::subscribe(self)
    }
    fn load(&self, id: &str, pin: bool) -> BoxFuture<'_, Result<(), modelmux_cache::Error>> {
        let id = id.to_string();
        Box::pin(async move {
            if pin {
                self.pin(&id).await
            } else {
                self.preload(&id).await
            }
        })
    }
    fn evict(&self, id: &str) -> bool {
        Multiplexer::evict(self, id)
    }
    fn unpin(&self, id: &str) -> bool {
        Multiplexer::unpin(self, id)
    }
    fn shutdown(&self, timeout: Duration) -> BoxFuture<'_, ShutdownReport> {
        Box::pin(Multiplexer::shutdown(self, timeout))
    }
}
