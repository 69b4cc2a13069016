//! Sending one request to one replica of a deployment: choose (router.rs), reserve a slot on
//! the replica, queue (bounded, with a timeout) when nothing has room, call, count, log.
//!
//! The request path takes no exclusive lock while nobody waits and no model is placed: the
//! replica list is read through `ArcSwap`, each replica's model set under a read lock (written
//! only when its caches report a change, or once per coarse tick for a model routed to), and a
//! replica slot is reserved with one compare-and-swap. Once requests wait, the queue is fair: a new request joins the end of it,
//! and whenever capacity may have freed (a request finished, a model loaded, the replica set
//! changed) one pass hands each free slot to the first waiter that can use it, so a finished
//! request wakes one waiter, not all of them, and nobody overtakes the queue.

use std::cell::Cell;
use std::collections::VecDeque;
use std::hash::{BuildHasher, Hasher};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use arc_swap::ArcSwap;
use modelmux_cache::ModelId;
use modelmux_context::{Hold, RequestContext};
use tokio::time::Instant;

use crate::deployment::DeploymentConfig;
use crate::dispatch::{Dispatch, Dispatched, Route, Waker};
use crate::placement::ReplicaView;
use crate::remote::{ForwardError, RemoteReplica};
use crate::replica::Replica;
use crate::router::{Choice, Reason, Rng, Triage, choose_with, triage};
use crate::{HandleCall, Request, Response, ServeError};

mod dispatch_impl;
mod handle_call;
mod load_wait;
mod retry;
mod run;
mod streamed_slot;
mod target;

pub(crate) use handle_call::CallToken;
pub use load_wait::waiting_for_load;
use retry::{Attempted, copy_request, replica_stopped};
use streamed_slot::hold_until_sent;
pub(crate) use target::Target;
use target::Targets;

/// How many replicas one request may be sent to when nodes cannot be reached or turn it away.
const MAX_ATTEMPTS: usize = 3;

/// How often a queued request looks again even without a wake-up.
const RECHECK: std::time::Duration = std::time::Duration::from_millis(250);

/// One deployment's replicas and the queue in front of them.
pub(crate) struct DeploymentRouter {
    pub(crate) app: Arc<str>,
    pub(crate) config: DeploymentConfig,
    replicas: ArcSwap<Vec<Arc<Replica>>>,
    /// Replicas of this deployment on other nodes (cluster mode).
    remotes: ArcSwap<Vec<Arc<RemoteReplica>>>,
    /// Both, as the router chooses among them.
    targets: ArcSwap<Targets>,
    /// Notified whenever a local replica's models change (the cluster layer publishes them).
    changes: Arc<tokio::sync::Notify>,
    /// The token handle calls carry to other nodes; without it they stay on this node.
    call_token: Arc<CallToken>,
    /// Requests waiting for a replica, first come first served.
    waiting: parking_lot::Mutex<WaitQueue>,
    /// `waiting`'s length, read without its lock.
    queued: AtomicUsize,
    shutting_down: AtomicBool,
    /// This node is starting the deployment's first replicas: a request for this node's
    /// replicas waits for them (in the queue, under its timeout) instead of being refused.
    starting: AtomicBool,
    /// Held while a request places a model (loads it somewhere new): the decision is made
    /// again under it, and its pending mark is complete before the next placement looks. Without
    /// it, two first requests racing could see a torn view (one replica's model count already
    /// raised by the other's mark, its holding not yet) and place the model twice. Requests to
    /// replicas that hold their model never take it.
    placing: parking_lot::Mutex<()>,
    /// The deployment may run no replica (autoscaling down to zero): a request then waits in
    /// the queue for the one its arrival starts, instead of being refused.
    wakes_from_zero: AtomicBool,
    /// Notified when a request queues with no replica on this node (the autoscaler starts one
    /// at once, not at its next tick).
    pub(crate) demand: tokio::sync::Notify,
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
    pub(crate) fn new(
        app: Arc<str>,
        config: DeploymentConfig,
        changes: Arc<tokio::sync::Notify>,
        call_token: Arc<CallToken>,
    ) -> Self {
        Self {
            app,
            config,
            replicas: ArcSwap::default(),
            remotes: ArcSwap::default(),
            targets: ArcSwap::default(),
            changes,
            call_token,
            waiting: parking_lot::Mutex::default(),
            queued: AtomicUsize::new(0),
            shutting_down: AtomicBool::new(false),
            starting: AtomicBool::new(false),
            placing: parking_lot::Mutex::new(()),
            wakes_from_zero: AtomicBool::new(false),
            demand: tokio::sync::Notify::new(),
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
        self.starting.store(false, Ordering::SeqCst);
        self.retarget();
        self.changes.notify_one();
    }

    /// Marks the deployment's first replicas on this node as starting (or, with `false`, as
    /// given up on: a start that failed). Requests for this node's replicas wait while they
    /// start; once none is starting and none runs, they are refused at once.
    pub(crate) fn set_starting(&self, starting: bool) {
        self.starting.store(starting, Ordering::SeqCst);
        if !starting && self.targets.load().local.is_empty() {
            // Whoever waited for them is told now, not at its timeout.
            let mut waiting = self.waiting.lock();
            waiting
                .entries
                .retain(|w| !matches!(w.route, Route::Local { .. }));
            self.queued.store(waiting.entries.len(), Ordering::SeqCst);
        }
    }

    /// Whether this node is still starting the deployment's first replicas.
    pub(crate) fn is_starting(&self) -> bool {
        self.starting.load(Ordering::SeqCst)
    }

    /// Sets whether a request that finds no replica waits for one to start (a deployment
    /// that autoscales from zero).
    pub(crate) fn set_wakes_from_zero(&self, wakes: bool) {
        self.wakes_from_zero.store(wakes, Ordering::SeqCst);
    }

    /// Replicas of this deployment on other nodes.
    pub(crate) fn remotes(&self) -> Arc<Vec<Arc<RemoteReplica>>> {
        self.remotes.load_full()
    }

    pub(crate) fn set_remotes(self: &Arc<Self>, remotes: Vec<Arc<RemoteReplica>>) {
        self.remotes.store(Arc::new(remotes));
        self.retarget();
    }

    fn retarget(self: &Arc<Self>) {
        let targets = Targets::new(&self.replicas.load(), &self.remotes.load());
        self.targets.store(Arc::new(targets));
        self.grant();
    }

    /// What replicas call when their models change (a load ended, a model was evicted): the
    /// queue may move.
    pub(crate) fn waker(self: &Arc<Self>) -> Waker {
        let port: Arc<dyn Dispatch> = self.clone();
        Waker::new(&port)
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

    /// A replica with a reserved slot, waiting in the queue if there is none (or if others
    /// already wait: they came first).
    async fn acquire(
        self: &Arc<Self>,
        model: Option<&ModelId>,
        route: &Route,
    ) -> Result<(Ongoing, Reason), ServeError> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return Err(match route {
                Route::Anywhere | Route::Node(_) => ServeError::ShuttingDown,
                Route::Local { .. } => ServeError::NotHere {
                    reason: "this node is shutting down".into(),
                },
            });
        }
        if let Route::Node(node) = route
            && !self
                .targets
                .load()
                .all
                .iter()
                .any(|t| t.node() == Some(node) && t.is_available())
        {
            return Err(ServeError::Failed(modelmux_cache::Failure::new(
                modelmux_cache::ErrorKind::Unavailable,
                format!(
                    "node '{node}' runs no replica of deployment '{}' that this node can reach",
                    self.config.name
                ),
            )));
        }
        if let Route::Local { preferred } = route
            && self.targets.load().local.is_empty()
        {
            // A request another node forwarded here goes back to it, to be sent elsewhere; one
            // of this node's own (a handle's) waits for replicas that are starting, and is
            // refused, as unavailable, when none will.
            if preferred.is_some() {
                return Err(ServeError::NotHere {
                    reason: format!("this node runs no replica of '{}'", self.config.name),
                });
            }
            if !self.is_starting() && !self.wakes_from_zero.load(Ordering::SeqCst) {
                return Err(self.none_here());
            }
        }
        if self.queued.load(Ordering::SeqCst) == 0
            && let Some(found) = self.try_acquire(model, route)
        {
            return Ok(found);
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
                route: route.clone(),
                grant: tx,
            });
            self.queued.store(waiting.entries.len(), Ordering::SeqCst);
            ticket
        };
        if self.targets.load().local.is_empty() {
            self.demand.notify_one();
        }
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
                Ok(Err(_)) => {
                    return Err(match route {
                        Route::Anywhere | Route::Node(_) => ServeError::ShuttingDown,
                        _ if !self.shutting_down.load(Ordering::SeqCst) => self.none_here(),
                        Route::Local { .. } => ServeError::NotHere {
                            reason: "this node is shutting down".into(),
                        },
                    });
                }
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

    /// A request for this node's replicas where none runs or starts.
    fn none_here(&self) -> ServeError {
        ServeError::Failed(modelmux_cache::Failure::new(
            modelmux_cache::ErrorKind::Unavailable,
            format!(
                "no replica of deployment '{}' is running on this node",
                self.config.name
            ),
        ))
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
            // Once no replica has a free slot, no waiter further back can get one: the scan
            // stops there (it was every waiter per freed slot, quadratic in a deep queue).
            let mut open = self.any_open();
            while open && i < waiting.entries.len() {
                let waiter = &waiting.entries[i];
                let Some(granted) = self.try_acquire(waiter.model.as_ref(), &waiter.route) else {
                    i += 1;
                    continue;
                };
                let waiter = waiting.entries.remove(i).expect("index checked");
                if let Err(granted) = waiter.grant.send(granted) {
                    unclaimed.push(granted);
                }
                open = self.any_open();
            }
            self.queued.store(waiting.entries.len(), Ordering::SeqCst);
        }
        drop(unclaimed);
    }

    /// Whether any replica could take a request now (available, a slot free).
    fn any_open(&self) -> bool {
        self.targets
            .load()
            .all
            .iter()
            .any(|t| t.is_available() && !t.is_saturated())
    }

    fn try_acquire(
        self: &Arc<Self>,
        model: Option<&ModelId>,
        route: &Route,
    ) -> Option<(Ongoing, Reason)> {
        if self.shutting_down.load(Ordering::SeqCst) {
            return None;
        }
        let targets = self.targets.load();
        let on_node: Vec<Target>;
        let replicas = match route {
            Route::Anywhere => &targets.all,
            Route::Local { .. } => &targets.local,
            Route::Node(node) => {
                on_node = targets
                    .all
                    .iter()
                    .filter(|t| t.node() == Some(node))
                    .cloned()
                    .collect();
                &on_node
            }
        };
        // Without model caches, model ids say nothing about where to go.
        let model = model.filter(|_| replicas.iter().any(|r| r.slot().tracks_models()));
        // The replica the forwarding node chose, if it is open: the rules agree with that
        // node's, so its choice stands (and the model is marked as placed there).
        if let Route::Local {
            preferred: Some(preferred),
        } = route
        {
            let found = replicas
                .iter()
                .find(|r| r.id() == &**preferred && r.is_available() && !r.is_saturated());
            if let Some(target) = found {
                let reason = match model {
                    Some(m) if !target.holds(m, Instant::now()) => Reason::Placed,
                    Some(_) => Reason::Holder,
                    None => Reason::LeastLoaded,
                };
                if let Some(found) = self.reserve(target, model, reason) {
                    return Some(found);
                }
            }
        }
        // A lost race for the last slot on a replica just means choosing again.
        for _ in 0..4 {
            let waiting = self.queued.load(Ordering::Relaxed);
            // Placing a model: decide (again, from the start), and mark, under the placement
            // lock, so that two requests for a cold model cannot place it on two replicas.
            let (choice, _placing) = match with_rng(|rng| {
                triage(replicas, model, Instant::now(), rng, waiting)
            }) {
                Triage::Decided(choice) => (choice, None),
                Triage::Place(_) => {
                    let lock = self.placing.lock();
                    let choice =
                        with_rng(|rng| choose_with(replicas, model, Instant::now(), rng, waiting));
                    (choice, Some(lock))
                }
            };
            match choice {
                Choice::Replica(i, reason) => {
                    if let Some(found) = self.reserve(&replicas[i], model, reason) {
                        return Some(found);
                    }
                }
                Choice::Wait => return None,
            }
        }
        None
    }

    /// Takes a slot on `target` for a request for `model`, marking a placement as pending.
    fn reserve(
        self: &Arc<Self>,
        target: &Target,
        model: Option<&ModelId>,
        reason: Reason,
    ) -> Option<(Ongoing, Reason)> {
        let slot = target.slot();
        if !slot.try_begin() {
            return None;
        }
        let mut placement = None;
        if let Some(model) = model {
            if matches!(reason, Reason::Placed | Reason::NewCopy) {
                placement = slot.mark_pending(model);
            }
            slot.note_routed(model);
        }
        let reserved = Ongoing {
            router: self.clone(),
            target: target.clone(),
            model: model.cloned(),
            suspended: AtomicBool::new(false),
            placement,
        };
        Some((reserved, reason))
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
    route: Route,
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

/// A reserved slot on a replica, released on drop (handing it to the queue).
pub(crate) struct Ongoing {
    router: Arc<DeploymentRouter>,
    target: Target,
    /// The request's model, for which it may wait for a load.
    model: Option<ModelId>,
    /// Whether the slot is given back while the request waits for its model's load.
    suspended: AtomicBool,
    /// The pending placement of its model this request made, if it made one.
    placement: Option<u64>,
}

impl Drop for Ongoing {
    fn drop(&mut self) {
        if let (Some(placement), Some(model)) = (self.placement, &self.model) {
            self.target.slot().placement_ended(model, placement);
        }
        if self.suspended.load(Ordering::SeqCst) {
            self.target.slot().abandon_suspended(self.model.as_ref());
        } else {
            self.target.slot().finish();
        }
        // SeqCst pairs with a new waiter's enqueue-then-grant.
        self.router.grant();
    }
}
