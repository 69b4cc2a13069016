//! A ready-made deployment that serves a kind of model: each request names a model (header
//! `serve_multiplexed_model_id`), the replica's cache provides it, and the kind runs inference.
//! Model kinds (synthetic, ONNX, ...) implement [`ModelKind`] in their own crates.

use std::future::Future;
use std::sync::Arc;

use modelmux_cache::{BoxError, Failure, Loader, Model, ModelId, Multiplexer, MultiplexerBuilder};

use crate::{Deployment, DeploymentSpec, Request, Response};

/// A kind of model: how to load one by id, and how to answer a request with it.
pub trait ModelKind: Send + Sync + 'static {
    /// The loaded model.
    type Model: Model;

    /// Loads model `id` (see [`Loader::load`]).
    fn load(&self, id: &ModelId) -> impl Future<Output = Result<Self::Model, BoxError>> + Send;

    /// Checks `id` before room is made for it, and tells its size if known (see
    /// [`Loader::probe`]). The default knows nothing.
    fn probe(&self, id: &ModelId) -> impl Future<Output = Result<Option<u64>, BoxError>> + Send {
        let _ = id;
        async { Ok(None) }
    }

    /// Answers `request` with `model`. Heavy computation belongs on a blocking thread started
    /// with [`modelmux_context::spawn_blocking`] (not on the async workers that route
    /// requests): the replica then counts it until it ends, even if the client leaves first.
    /// Failures say their kind with a [`Failure`](modelmux_cache::Failure) (an input that
    /// does not fit the model is [`ErrorKind::InvalidInput`](modelmux_cache::ErrorKind)).
    fn infer(
        &self,
        model: &Self::Model,
        id: &ModelId,
        request: Request,
    ) -> impl Future<Output = Result<Response, BoxError>> + Send;
}

struct KindLoader<K>(Arc<K>);

impl<K: ModelKind> Loader<K::Model> for KindLoader<K> {
    async fn load(&self, id: &ModelId) -> Result<K::Model, BoxError> {
        self.0.load(id).await
    }

    async fn probe(&self, id: &ModelId) -> Result<Option<u64>, BoxError> {
        self.0.probe(id).await
    }
}

struct ModelDeployment<K: ModelKind> {
    kind: Arc<K>,
    models: Multiplexer<K::Model>,
}

impl<K: ModelKind> Deployment for ModelDeployment<K> {
    async fn call(&self, request: Request) -> Result<Response, BoxError> {
        let id = modelmux_context::multiplexed_model_id().ok_or_else(|| {
            Failure::invalid_input(
                "this deployment serves many models: name one in the serve_multiplexed_model_id header",
            )
        })?;
        let model = crate::deployment_router::waiting_for_load(self.models.get(&id)).await?;
        self.kind.infer(&model, &id, request).await
    }
}

/// A deployment named `name` serving models of `kind`, each replica caching them as `cache`
/// says (its `max_models`, `max_bytes`, timeouts).
pub fn model_deployment<K: ModelKind>(
    name: &str,
    kind: K,
    cache: MultiplexerBuilder,
) -> DeploymentSpec {
    let kind = Arc::new(kind);
    DeploymentSpec::new(name, move |ctx| {
        let kind = kind.clone();
        let cache = cache.clone();
        async move {
            let models = ctx.multiplexer(cache, KindLoader(kind.clone()));
            Ok(ModelDeployment { kind, models })
        }
    })
}
