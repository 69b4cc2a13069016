//! What every application request goes through before its route, outermost first: load
//! shedding (refuse at once when the concurrency cap is reached), the cap itself
//! (`max_inflight_requests`, shared by all connections), and the request timeout
//! (`request_timeout`, which drops, and so cancels, the request's work when it runs out).
//! The admin API and `/metrics` do not go through it: a probe must answer under overload.
//!
//! Written out rather than as tower's `LoadShed` over `GlobalConcurrencyLimit` over `Timeout`
//! (which it was, with the same behaviour): a tower service takes `&mut self` and holds the
//! permit its `poll_ready` acquired until `call`, so each request cloned the boxed stack (a
//! heap allocation, and another for the concurrency limit's `PollSemaphore`) and boxed its
//! response future again: three of the 19 allocations of a trivial request. Here the permit is
//! one `try_acquire_owned` on the shared semaphore, held by the request's future.

use std::sync::Arc;

use hyper::body::Incoming;
use modelmux_context::RequestId;
use modelmux_serve::ServeError;
use tokio::sync::Semaphore;

use crate::ingress::Routed;
use crate::state::FrontState;

/// The application requests' way in, shared by every connection.
pub(crate) struct Apps {
    state: Arc<FrontState>,
    /// `max_inflight_requests` permits.
    cap: Arc<Semaphore>,
}

impl Apps {
    pub(super) fn new(state: Arc<FrontState>) -> Arc<Self> {
        Arc::new(Self {
            cap: Arc::new(Semaphore::new(state.config.http.max_inflight_requests)),
            state,
        })
    }

    /// Routes the request ([`crate::ingress::route`]) under the cap and the timeout.
    pub(super) async fn call(
        &self,
        request_id: RequestId,
        request: http::Request<Incoming>,
    ) -> Result<Routed, ServeError> {
        let Ok(_permit) = self.cap.clone().try_acquire_owned() else {
            return Err(ServeError::ServerOverloaded {
                message: format!(
                    "the server is at its limit of {} requests in progress; try again shortly",
                    self.state.config.http.max_inflight_requests
                ),
            });
        };
        // The route's future (about 3 KB: the body read, then the dispatch) is boxed: held
        // inline, it would be copied into every future that awaits it.
        let routing = Box::pin(crate::ingress::route(&self.state, request_id, request));
        match self.state.config.http.request_timeout {
            None => Ok(routing.await),
            Some(limit) => tokio::time::timeout(limit, routing)
                .await
                .map_err(|_| ServeError::RequestTimeout { limit }),
        }
    }
}
