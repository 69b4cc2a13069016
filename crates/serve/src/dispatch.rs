//! Sending one request to one replica of a deployment: choose (router.rs), reserve a slot on
//! the replica, queue (bounded, with a timeout) when nothing has room, call, count, log.
//!
//! The request path takes no lock: the replica list and each replica's model set are read
//! through `ArcSwap`, and a replica slot is reserved with one compare-and-swap. Only a request
//! that has to wait registers with the `Notify` that finishing requests and model events wake.

use std::cell::Cell;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use modelmux_cache::{BoxError, ModelId};
use modelmux_context::RequestContext;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::deployment::DeploymentConfig;
use crate::placement::ReplicaView;
use crate::replica::Replica;
use crate::router::{Choice, Reason, Rng, choose};
use crate::{Body, Request, Response, ServeError};

/// How often a queued request looks again even without a wake-up.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// One deployment's replicas and the queue in front of them.
pub(crate) struct DeploymentRouter {
    pub(crate) app: Arc<str>,
    pub(crate) config: DeploymentConfig,
    replicas: ArcSwap<Vec<Arc<Replica>>>,
    /// Woken when a request finishes while others wait, when a model event arrives, and when
    /// the replica set changes.
    pub(crate) wake: Arc<Notify>,
    queued: AtomicUsize,
    shutting_down: AtomicBool,
    /// Held while a request places a model (loads it somewhere new): the decision is made
    /// again under it, and its pending mark is complete before the next placement looks. Without
    /// it, two first requests racing could see a torn view (one replica's model count already
    /// raised by the other's mark, its holding not yet) and place the model twice. Requests to
    /// replicas that hold their model never take it.
    placing: parking_lot::Mutex<()>,
}

impl ReplicaView for Replica {
    fn id(&self) -> &str {
        self.slot.id()
    }
    fn ongoing(&self) -> usize {
        self.slot.ongoing()
    }
    fn max_ongoing(&self) -> usize {
        self.slot.max_ongoing()
    }
    fn is_available(&self) -> bool {
        self.slot.is_available()
    }
    fn holds(&self, id: &ModelId, now: Instant) -> bool {
        self.slot.holds(id, now)
    }
    fn holds_loaded(&self, id: &ModelId) -> bool {
        self.slot.holds_loaded(id)
    }
    fn holds_loading(&self, id: &ModelId, now: Instant) -> bool {
        self.slot.holds_loading(id, now)
    }
    fn model_count(&self, now: Instant) -> usize {
        self.slot.model_count(now)
    }
    fn has_free_slot(&self, now: Instant) -> bool {
        self.slot.has_free_slot(now)
    }
    fn oldest_use(&self) -> u64 {
        self.slot.oldest_use()
    }
}

fn with_rng<T>(f: impl FnOnce(&mut Rng) -> T) -> T {
    thread_local! {
        static STATE: Cell<u64> = Cell::new({
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(0);
            h.finish()
        });
    }
    STATE.with(|s| {
        let mut rng = Rng::new(s.get());
        let out = f(&mut rng);
        s.set(rng.next_u64());
        out
    })
}

impl DeploymentRouter {
    pub(crate) fn new(app: Arc<str>, config: DeploymentConfig) -> Self {
        Self {
            app,
            config,
            replicas: ArcSwap::default(),
            wake: Arc::new(Notify::new()),
            queued: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
            placing: parking_lot::Mutex::new(()),
        }
    }

    pub(crate) fn name(&self) -> &str {
        &self.config.name
    }

    pub(crate) fn replicas(&self) -> Arc<Vec<Arc<Replica>>> {
        self.replicas.load_full()
    }

    pub(crate) fn set_replicas(&self, replicas: Vec<Arc<Replica>>) {
        self.replicas.store(Arc::new(replicas));
        self.wake.notify_waiters();
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Refuses new requests (they get 503) and wakes queued ones so they leave.
    pub(crate) fn stop_accepting(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        self.wake.notify_waiters();
    }

    /// Routes `request` to a replica and runs it there. Returns the response (or the error)
    /// and the replica that served it, if one was reached.
    pub(crate) async fn dispatch(
        self: &Arc<Self>,
        request: Request,
        context: RequestContext,
    ) -> (Result<Response, ServeError>, Option<Arc<str>>) {
        let start = Instant::now();
        let model = context.multiplexed_model_id().cloned();
        let (result, replica) = match self.acquire(model.as_ref()).await {
            Err(e) => (Err(e), None),
            Ok((replica, reason)) => {
                let guard = Ongoing {
                    router: self.clone(),
                    replica: replica.clone(),
                };
                tracing::trace!(replica = %replica.id, ?reason, "routed");
                let result = replica.call(request, context.clone()).await;
                let status = result
                    .as_ref()
                    .map_or_else(|e| e.http_status(), |r| r.status());
                replica.metrics.record(status.as_u16(), start.elapsed());
                // A streamed body keeps its replica slot until the last chunk is sent.
                let result = result.map(|response| match response.body().as_full() {
                    Some(_) => response,
                    None => response.map(|body| {
                        Body::wrap(HoldSlot {
                            body,
                            _guard: guard,
                        })
                    }),
                });
                (result, Some(replica.id.clone()))
            }
        };
        let status = result
            .as_ref()
            .map_or_else(|e| e.http_status(), |r| r.status());
        tracing::info!(
            target: "modelmux::access",
            request_id = context.request_id().map_or("-", |r| r.as_str()),
            app = %self.app,
            deployment = %self.config.name,
            replica = replica.as_deref().unwrap_or("-"),
            model_id = model.as_ref().map_or("-", |m| m.as_str()),
            status = status.as_u16(),
            ms = format_args!("{:.2}", start.elapsed().as_secs_f64() * 1e3),
            error = result.as_ref().err().map(|e| e.error_type()),
        );
        (result, replica)
    }

    /// A replica with a reserved slot, waiting in the queue if there is none.
    async fn acquire(&self, model: Option<&ModelId>) -> Result<(Arc<Replica>, Reason), ServeError> {
        if let Some(found) = self.try_acquire(model) {
            return Ok(found);
        }
        let queued = QueueTicket::enter(&self.queued);
        if queued.position >= self.config.max_queued_requests {
            return Err(ServeError::Overloaded {
                deployment: self.config.name.clone(),
                queued: queued.position,
            });
        }
        let start = Instant::now();
        let deadline = start + self.config.queue_timeout;
        loop {
            let notified = self.wake.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.shutting_down.load(Ordering::SeqCst) {
                return Err(ServeError::ShuttingDown);
            }
            if let Some(found) = self.try_acquire(model) {
                return Ok(found);
            }
            // Wake-ups come from finishing requests and model events; the periodic look also
            // catches what no event announces (a placement that expired unconfirmed).
            let slice = deadline.min(Instant::now() + RECHECK);
            if tokio::time::timeout_at(slice, notified).await.is_err() && Instant::now() >= deadline
            {
                return Err(ServeError::QueueTimeout {
                    deployment: self.config.name.clone(),
                    waited: start.elapsed(),
                });
            }
        }
    }

    fn try_acquire(&self, model: Option<&ModelId>) -> Option<(Arc<Replica>, Reason)> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return None;
        }
        let replicas = self.replicas.load();
        // Without model caches, model ids say nothing about where to go.
        let model = model.filter(|_| replicas.iter().any(|r| r.slot.tracks_models()));
        // A lost race for the last slot on a replica just means choosing again.
        for _ in 0..4 {
            let mut choice = with_rng(|rng| choose(&replicas, model, Instant::now(), rng));
            // Placing a model: decide again, and mark, under the placement lock.
            let _placing = match choice {
                Choice::Replica(_, Reason::Placed | Reason::NewCopy) => {
                    let lock = self.placing.lock();
                    choice = with_rng(|rng| choose(&replicas, model, Instant::now(), rng));
                    Some(lock)
                }
                _ => None,
            };
            match choice {
                Choice::Replica(i, reason) => {
                    let replica = &replicas[i];
                    if replica.slot.try_begin() {
                        if let Some(model) = model {
                            if matches!(reason, Reason::Placed | Reason::NewCopy) {
                                replica.slot.mark_pending(model);
                            }
                            replica.slot.note_routed(model);
                        }
                        return Some((replica.clone(), reason));
                    }
                }
                Choice::Wait => return None,
            }
        }
        None
    }
}

/// Counts a request as queued for as long as it lives.
struct QueueTicket<'a> {
    queued: &'a AtomicUsize,
    position: usize,
}

impl<'a> QueueTicket<'a> {
    fn enter(queued: &'a AtomicUsize) -> Self {
        let position = queued.fetch_add(1, Ordering::SeqCst);
        Self { queued, position }
    }
}

impl Drop for QueueTicket<'_> {
    fn drop(&mut self) {
        self.queued.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A reserved slot on a replica, released on drop (waking queued requests).
struct Ongoing {
    router: Arc<DeploymentRouter>,
    replica: Arc<Replica>,
}

impl Drop for Ongoing {
    fn drop(&mut self) {
        self.replica.slot.end();
        // SeqCst pairs with the queued request's `enter` then `try_acquire`.
        if self.router.queued.load(Ordering::SeqCst) > 0 {
            self.router.wake.notify_waiters();
        }
    }
}

/// A streamed response body that holds its replica slot until it ends.
struct HoldSlot {
    body: Body,
    _guard: Ongoing,
}

impl http_body::Body for HoldSlot {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
