//! Sending one request to one replica of a deployment: choose (router.rs), reserve a slot on
//! the replica, queue (bounded, with a timeout) when nothing has room, call, count, log.
//!
//! The request path takes no lock while nobody waits: the replica list and each replica's
//! model set are read through `ArcSwap`, and a replica slot is reserved with one
//! compare-and-swap. Once requests wait, the queue is fair: a new request joins the end of it,
//! and whenever capacity may have freed (a request finished, a model loaded, the replica set
//! changed) one pass hands each free slot to the first waiter that can use it, so a finished
//! request wakes one waiter, not all of them, and nobody overtakes the queue.

use std::cell::Cell;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use modelmux_cache::{BoxError, ModelId};
use modelmux_context::{Hold, RequestContext};
use tokio::time::Instant;

use crate::deployment::DeploymentConfig;
use crate::placement::ReplicaView;
use crate::replica::Replica;
use crate::router::{Choice, Reason, Rng, choose_with};
use crate::{Body, Request, Response, ServeError};

/// How often a queued request looks again even without a wake-up.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// One deployment's replicas and the queue in front of them.
pub(crate) struct DeploymentRouter {
    pub(crate) app: Arc<str>,
    pub(crate) config: DeploymentConfig,
    replicas: ArcSwap<Vec<Arc<Replica>>>,
    /// Requests waiting for a replica, first come first served.
    waiting: parking_lot::Mutex<WaitQueue>,
    /// `waiting`'s length, read without its lock.
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
    fn service_time(&self) -> Option<std::time::Duration> {
        self.slot.service_time()
    }
    fn load_time(&self, id: &ModelId) -> Option<std::time::Duration> {
        self.slot.load_time(id)
    }
    fn backing_off(&self, id: &ModelId, now: Instant) -> bool {
        self.slot.backing_off(id, now)
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
            waiting: parking_lot::Mutex::default(),
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

    pub(crate) fn set_replicas(self: &Arc<Self>, replicas: Vec<Arc<Replica>>) {
        self.replicas.store(Arc::new(replicas));
        self.grant();
    }

    /// What replicas call when their models change (a load ended, a model was evicted): the
    /// queue may move.
    pub(crate) fn waker(self: &Arc<Self>) -> Waker {
        Waker(Arc::downgrade(self))
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Refuses new requests (they get 503) and sends queued ones away with the same answer.
    pub(crate) fn stop_accepting(&self) {
        self.shutting_down.store(true, Ordering::SeqCst);
        let mut waiting = self.waiting.lock();
        // Dropping their senders tells them.
        waiting.entries.clear();
        self.queued.store(0, Ordering::SeqCst);
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
            Ok((guard, reason)) => {
                let replica = guard.replica.clone();
                // The slot is held by the request and by any blocking work it starts
                // (`modelmux_context::spawn_blocking`), until both are done.
                let hold = Hold::new(guard);
                tracing::trace!(replica = %replica.id, ?reason, "routed");
                // Service time is measured on requests whose model was loaded when they were
                // routed: one that waited for a load would count the load as service.
                let timed = model.as_ref().is_none_or(|m| replica.slot.holds_loaded(m));
                let began = Instant::now();
                let result = replica
                    .call(request, context.clone().with_hold(hold.clone()))
                    .await;
                if timed {
                    replica.slot.observe_service(began.elapsed());
                }
                let status = result
                    .as_ref()
                    .map_or_else(|e| e.http_status(), |r| r.status());
                replica.metrics.record(status.as_u16(), start.elapsed());
                // A streamed body keeps its replica slot until the last chunk is sent.
                let result = result.map(|response| match response.body().as_full() {
                    Some(_) => response,
                    None => response.map(|body| Body::wrap(HoldSlot { body, _hold: hold })),
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

    /// A replica with a reserved slot, waiting in the queue if there is none (or if others
    /// already wait: they came first).
    async fn acquire(
        self: &Arc<Self>,
        model: Option<&ModelId>,
    ) -> Result<(Ongoing, Reason), ServeError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(ServeError::ShuttingDown);
        }
        if self.queued.load(Ordering::SeqCst) == 0 {
            if let Some(found) = self.try_acquire(model) {
                return Ok(found);
            }
        }
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let ticket = {
            let mut waiting = self.waiting.lock();
            if self.shutting_down.load(Ordering::SeqCst) {
                return Err(ServeError::ShuttingDown);
            }
            let queued = waiting.entries.len();
            if queued >= self.config.max_queued_requests {
                return Err(ServeError::Overloaded {
                    deployment: self.config.name.clone(),
                    queued,
                });
            }
            waiting.next_ticket += 1;
            let ticket = waiting.next_ticket;
            waiting.entries.push_back(Waiter {
                ticket,
                model: model.cloned(),
                grant: tx,
            });
            self.queued.store(waiting.entries.len(), Ordering::SeqCst);
            ticket
        };
        let _leave = LeaveQueue {
            router: self,
            ticket,
        };
        // What is free now goes to whoever is first in line and can use it; maybe this one.
        self.grant();
        let start = Instant::now();
        let deadline = start + self.config.queue_timeout;
        loop {
            // The periodic look catches what no event announces (a placement that expired
            // unconfirmed); only the first in line makes it, so it costs one pass per period.
            let slice = deadline.min(Instant::now() + RECHECK);
            match tokio::time::timeout_at(slice, &mut rx).await {
                Ok(Ok(granted)) => return Ok(granted),
                Ok(Err(_)) => return Err(ServeError::ShuttingDown),
                Err(_) if Instant::now() >= deadline => {
                    return Err(ServeError::QueueTimeout {
                        deployment: self.config.name.clone(),
                        waited: start.elapsed(),
                    });
                }
                Err(_) => {
                    let first = self.waiting.lock().entries.front().map(|w| w.ticket);
                    if first == Some(ticket) {
                        self.grant();
                    }
                }
            }
        }
    }

    /// Hands free capacity to waiters in order: each waiter, from the first, gets a slot if the
    /// routing rules find one for its model now; a waiter that cannot be served yet (its
    /// model's holders are busy) does not block those behind it from other replicas.
    pub(crate) fn grant(self: &Arc<Self>) {
        if self.queued.load(Ordering::SeqCst) == 0 {
            return;
        }
        // Reservations for waiters that left meanwhile are released after the lock is let go
        // (releasing one runs this again).
        let mut unclaimed = Vec::new();
        {
            let mut waiting = self.waiting.lock();
            let mut i = 0;
            while i < waiting.entries.len() {
                let Some(granted) = self.try_acquire(waiting.entries[i].model.as_ref()) else {
                    i += 1;
                    continue;
                };
                let waiter = waiting.entries.remove(i).expect("index checked");
                if let Err(granted) = waiter.grant.send(granted) {
                    unclaimed.push(granted);
                }
            }
            self.queued.store(waiting.entries.len(), Ordering::SeqCst);
        }
        drop(unclaimed);
    }

    fn try_acquire(self: &Arc<Self>, model: Option<&ModelId>) -> Option<(Ongoing, Reason)> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return None;
        }
        let replicas = self.replicas.load();
        // Without model caches, model ids say nothing about where to go.
        let model = model.filter(|_| replicas.iter().any(|r| r.slot.tracks_models()));
        // A lost race for the last slot on a replica just means choosing again.
        for _ in 0..4 {
            let waiting = self.queued.load(Ordering::Relaxed);
            let mut choice =
                with_rng(|rng| choose_with(&replicas, model, Instant::now(), rng, waiting));
            // Placing a model: decide again, and mark, under the placement lock.
            let _placing = match choice {
                Choice::Replica(_, Reason::Placed | Reason::NewCopy) => {
                    let lock = self.placing.lock();
                    choice =
                        with_rng(|rng| choose_with(&replicas, model, Instant::now(), rng, waiting));
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
                        let reserved = Ongoing {
                            router: self.clone(),
                            replica: replica.clone(),
                            suspended: AtomicBool::new(false),
                        };
                        return Some((reserved, reason));
                    }
                }
                Choice::Wait => return None,
            }
        }
        None
    }
}

/// The requests waiting for a replica, in arrival order.
#[derive(Default)]
struct WaitQueue {
    entries: VecDeque<Waiter>,
    next_ticket: u64,
}

struct Waiter {
    ticket: u64,
    model: Option<ModelId>,
    grant: tokio::sync::oneshot::Sender<(Ongoing, Reason)>,
}

/// Takes a waiter out of the queue when it stops waiting (served, timed out, or its client
/// went away).
struct LeaveQueue<'a> {
    router: &'a DeploymentRouter,
    ticket: u64,
}

impl Drop for LeaveQueue<'_> {
    fn drop(&mut self) {
        let mut waiting = self.router.waiting.lock();
        if let Some(i) = waiting.entries.iter().position(|w| w.ticket == self.ticket) {
            waiting.entries.remove(i);
            self.router
                .queued
                .store(waiting.entries.len(), Ordering::SeqCst);
        }
    }
}

/// Tells a deployment's router that its replicas' models changed.
#[derive(Clone)]
pub(crate) struct Waker(std::sync::Weak<DeploymentRouter>);

impl Waker {
    pub(crate) fn wake(&self) {
        if let Some(router) = self.0.upgrade() {
            router.grant();
        }
    }
}

/// A reserved slot on a replica, released on drop (handing it to the queue).
pub(crate) struct Ongoing {
    router: Arc<DeploymentRouter>,
    replica: Arc<Replica>,
    /// Whether the slot is given back while the request waits for its model's load.
    suspended: AtomicBool,
}

impl Drop for Ongoing {
    fn drop(&mut self) {
        if self.suspended.load(Ordering::SeqCst) {
            self.replica.slot.abandon_suspended();
        } else {
            self.replica.slot.finish();
        }
        // SeqCst pairs with a new waiter's enqueue-then-grant.
        self.router.grant();
    }
}

/// Awaits `load` (a deployment's wait for a model, such as `Multiplexer::get`), giving the
/// request's replica slot back while the model loads and taking it back, ahead of newcomers,
/// once it has: a request waiting for a load uses no inference capacity, so it must not keep
/// requests for the replica's loaded models waiting (Ray counts it against
/// `max_ongoing_requests`, which saturates replicas with loads under model churn). The replica
/// still counts it as inside (a drain waits for it). A `load` that is ready at once (the model
/// was loaded) gives nothing back. Outside a request dispatched by this server it is
/// `load.await`.
pub async fn waiting_for_load<F: std::future::Future>(load: F) -> F::Output {
    let mut load = std::pin::pin!(load);
    let first = std::future::poll_fn(|cx| Poll::Ready(load.as_mut().poll(cx))).await;
    if let Poll::Ready(out) = first {
        return out;
    }
    let hold = modelmux_context::current_hold();
    let Some(ongoing) = hold.as_ref().and_then(|h| h.claim::<Ongoing>()) else {
        return load.await;
    };
    if ongoing.suspended.swap(true, Ordering::SeqCst) {
        // Already given back by an outer wait.
        return load.await;
    }
    ongoing.replica.slot.suspend();
    ongoing.router.grant();
    let suspension = Suspension(ongoing);
    let out = load.await;
    ongoing.replica.slot.resume().await;
    ongoing.suspended.store(false, Ordering::SeqCst);
    drop(suspension);
    out
}

/// Ends a suspension: if the wait was cancelled before the slot was taken back (the request
/// goes on without its load, or is being dropped), the slot is taken back at once, so the
/// request never runs without one. Either way the queue is offered what may have freed (a
/// resumer blocks newcomers while it waits).
struct Suspension<'a>(&'a Ongoing);

impl Drop for Suspension<'_> {
    fn drop(&mut self) {
        if self.0.suspended.swap(false, Ordering::SeqCst) {
            self.0.replica.slot.force_resume();
        }
        self.0.router.grant();
    }
}

/// A streamed response body that holds its replica slot until it ends.
struct HoldSlot {
    body: Body,
    _hold: Hold,
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
