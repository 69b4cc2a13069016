//! The tower stack every application request goes through, outermost first: load shedding
//! (refuse at once when the concurrency cap is reached), the cap itself
//! (`max_inflight_requests`, shared by all connections), and the request timeout
//! (`request_timeout`, which drops, and so cancels, the request's work when it runs out).
//! The admin API and `/metrics` do not go through it: a probe must answer under overload.

use std::sync::Arc;

use hyper::body::Incoming;
use modelmux_cache::BoxError;
use modelmux_context::RequestId;
use tower::ServiceBuilder;
use tower::limit::GlobalConcurrencyLimitLayer;
use tower::util::BoxCloneSyncService;

use crate::ingress::Routed;
use crate::state::FrontState;

/// The application requests' service, cloned into every connection: a request with the id it
/// goes by in, its answer with what its access line says out.
pub(crate) type Apps = BoxCloneSyncService<(RequestId, http::Request<Incoming>), Routed, BoxError>;

/// Builds the stack over [`crate::ingress::route`].
pub(super) fn build(state: Arc<FrontState>) -> Apps {
    let options = &state.config.http;
    let cap = Arc::new(tokio::sync::Semaphore::new(options.max_inflight_requests));
    let timeout = options
        .request_timeout
        .map(tower::timeout::TimeoutLayer::new);
    let service =
        ServiceBuilder::new()
            .load_shed()
            .layer(GlobalConcurrencyLimitLayer::with_semaphore(cap))
            .option_layer(timeout)
            .service_fn(move |(id, request): (RequestId, http::Request<Incoming>)| {
                let state = state.clone();
                // The route's future (about 3 KB: the body read, then the dispatch) is boxed once
                // here. Each layer above wraps its inner future by value, and moving 3 KB through
                // all of them cost more, in copies, than this one allocation.
                async move {
                    Ok::<_, BoxError>(Box::pin(crate::ingress::route(&state, id, request)).await)
                }
            });
    BoxCloneSyncService::new(service)
}
