//! What the router knows about each replica: its load, and which models it holds.
//!
//! Each replica has a [`ReplicaLedger`]. Its model set ([`model_set::ModelSet`]) changes in
//! place whenever one of the replica's caches publishes an event, the moment it publishes it,
//! under a write lock held for that one change; the routing rules read it under a read lock,
//! and the counts they ask for (models held, bytes, copies draining) are kept up to date with
//! each change, so no routing decision scans a replica's models. The router adds *pending* entries when it places a cold model on
//! a replica, before that replica has even started the load: requests for the same model that
//! arrive in between follow the first one instead of scattering (Ray's first-request burst).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use model_set::{ModelSet, live};
use modelmux_cache::{ExpiringMap, ModelEvent, ModelEventKind, ModelId, ModelStatus};
use tokio::time::Instant;

/// How long a placement the router made stays valid without word from the replica.
pub(crate) const PENDING_TTL: Duration = Duration::from_secs(5);
/// How long a fresh placement counts as "loading" for the wait-for-the-loading-holder rule
/// once the request that placed it has ended (while that request is in flight it counts as
/// loading: it cannot be answered before the load, and a remote replica's report can take
/// longer than this to arrive on a busy cluster): long enough for the replica to report
/// `Loading`, short enough that a placement never confirmed (the request failed before asking
/// its cache) cannot hold requests back.
pub(crate) const PENDING_LOADING_GRACE: Duration = Duration::from_secs(1);

/// How a replica holds a model, as far as routing is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Holding {
    /// The router sent a request for it there; the replica has not reported yet.
    Pending(Instant),
    /// Loading.
    Loading,
    /// Loaded.
    Loaded,
}

/// One replica's routing state, shared by the router (reads) and the replica's event feeds
/// (writes).
pub(crate) struct ReplicaLedger {
    id: Arc<str>,
    ongoing: AtomicUsize,
    max_ongoing: usize,
    available: AtomicBool,
    /// Whether the replica has model caches at all: if not, model ids do not steer routing.
    tracks_models: bool,
    /// `max_models` of the replica's caches (summed), `usize::MAX` if unbounded or unknown;
    /// changed when the caches' caps are (a live reconfiguration).
    model_capacity: AtomicUsize,
    /// `max_bytes` of the replica's caches (summed), `u64::MAX` if unbounded or unknown.
    byte_capacity: AtomicU64,
    /// Its models, and the copies of them still draining.
    models: parking_lot::RwLock<ModelSet>,
    /// Requests inside the replica: with a slot, or waiting for a load without one. A drain
    /// waits for it to reach 0. Changed only when a request enters or leaves.
    inside: AtomicUsize,
    /// Requests inside the replica waiting for their model's load, their slot given back.
    loading_waiters: AtomicUsize,
    /// Of those, how many per model (the request's own): they take their slots back first
    /// once the load is done, so the router counts them against the model's holder. Touched
    /// only when a request waits for a load.
    waiting_per_model: parking_lot::Mutex<HashMap<ModelId, usize>>,
    /// Of those, the ones whose load is done and that wait to take a slot back: newcomers
    /// get no slot while any does.
    resuming: AtomicUsize,
    /// Signalled when a slot frees while some request is resuming.
    freed: tokio::sync::Notify,
    /// Recent service time, an exponentially weighted mean in microseconds (0: none yet).
    service_micros: AtomicU64,
    /// When its last slot was taken (nanoseconds after `born`): while it stays saturated, how
    /// long nothing has freed. Read only by the copy rule, written only when a take fills it.
    filled_at: AtomicU64,
    born: Instant,
    /// Models whose load failed here: until when to place them elsewhere, and failures in a
    /// row (the avoidance doubles with each, as the cache's backoff does).
    /// Bounded, for the ids are the clients' choice: a flood of unknown ids leaves at most
    /// [`MAX_FAILED`] behind.
    failed: parking_lot::Mutex<ExpiringMap<ModelId, (Instant, u32)>>,
}

/// Failed models a replica remembers at most (the oldest are forgotten first).
const MAX_FAILED: usize = 4096;

/// How long a replica is avoided for a model after its first failed load there; doubles per
/// consecutive failure up to [`MAX_AVOID`].
const FIRST_AVOID: Duration = Duration::from_secs(1);
const MAX_AVOID: Duration = Duration::from_secs(60);

impl ReplicaLedger {
    pub(crate) fn new(
        id: Arc<str>,
        max_ongoing: usize,
        caches: usize,
        model_capacity: Option<usize>,
    ) -> Self {
        Self {
            id,
            ongoing: AtomicUsize::new(0),
            max_ongoing,
            available: AtomicBool::new(true),
            tracks_models: caches > 0,
            model_capacity: AtomicUsize::new(model_capacity.unwrap_or(usize::MAX)),
            byte_capacity: AtomicU64::new(u64::MAX),
            models: parking_lot::RwLock::default(),
            inside: AtomicUsize::new(0),
            loading_waiters: AtomicUsize::new(0),
            waiting_per_model: parking_lot::Mutex::default(),
            resuming: AtomicUsize::new(0),
            freed: tokio::sync::Notify::new(),
            service_micros: AtomicU64::new(0),
            filled_at: AtomicU64::new(0),
            born: Instant::now(),
            failed: parking_lot::Mutex::new(ExpiringMap::new(MAX_FAILED)),
        }
    }

    /// Sets the byte capacity (the caches' `max_bytes`, summed) placement counts against.
    pub(crate) fn with_byte_capacity(self, bytes: Option<u64>) -> Self {
        self.byte_capacity
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
        self
    }

    /// Sets both capacities (the caches' caps changed).
    pub(crate) fn set_capacity(&self, models: Option<usize>, bytes: Option<u64>) {
        self.model_capacity
            .store(models.unwrap_or(usize::MAX), Ordering::Relaxed);
        self.byte_capacity
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    fn model_capacity(&self) -> Option<usize> {
        Some(self.model_capacity.load(Ordering::Relaxed)).filter(|c| *c != usize::MAX)
    }

    fn byte_capacity(&self) -> Option<u64> {
        Some(self.byte_capacity.load(Ordering::Relaxed)).filter(|c| *c != u64::MAX)
    }

    /// Folds one request's service time into the recent mean (weight 1/8).
    pub(crate) fn observe_service(&self, took: Duration) {
        let sample = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        let old = self.service_micros.load(Ordering::Relaxed);
        let new = if old == 0 {
            sample
        } else {
            old - old / 8 + sample / 8
        };
        self.service_micros.store(new.max(1), Ordering::Relaxed);
    }

    pub(crate) fn set_available(&self, available: bool) {
        self.available.store(available, Ordering::SeqCst);
    }

    /// Whether model ids steer routing to this replica (it has a model cache).
    pub(crate) fn tracks_models(&self) -> bool {
        self.tracks_models
    }

    /// Changes the model set with `f`, after dropping the placements the replica never
    /// confirmed (so an expired entry cannot stand in for a new one).
    fn update(&self, f: impl FnOnce(&mut ModelSet)) {
        let mut models = self.models.write();
        models.expire(Instant::now());
        f(&mut models);
    }

    /// Records that the router sent `id` here to be loaded: the placement's number, for
    /// [`Self::placement_ended`] when the request that made it ends, if it made one.
    pub(crate) fn mark_pending(&self, id: &ModelId) -> Option<u64> {
        // The time is taken under the lock: the set's placements stay in time order.
        let mut placed = None;
        self.update(|m| placed = m.place(id, Instant::now()));
        placed
    }

    /// The request that made placement number `placement` of `id` here has ended.
    pub(crate) fn placement_ended(&self, id: &ModelId, placement: u64) {
        self.models.write().placement_ended(id, placement);
    }

    /// Records that a request for `id` was just routed here: the placement of cold models uses
    /// it to find the replica holding the least recently used model (a global LRU). Writes
    /// only when the coarse clock has moved, so hot models cost a read per request.
    pub(crate) fn note_routed(&self, id: &ModelId) {
        let now = modelmux_cache::coarse_clock::ticks();
        if (self.models.read().get(id)).is_some_and(|e| e.routed != now) {
            self.models.write().routed(id, now);
        }
    }

    /// Starts (or starts again, after lagging) from the snapshot of cache number `source`:
    /// what it reports replaces what that cache reported before (and which of its models
    /// still drain is unknown after a resync); other caches' entries and the router's pending
    /// placements stay.
    pub(crate) fn apply_snapshot(&self, source: usize, snapshot: &[(ModelId, ModelStatus)]) {
        self.update(|m| {
            m.forget_source(source);
            for (id, status) in snapshot {
                let holding = match status {
                    ModelStatus::Queued | ModelStatus::Loading => Holding::Loading,
                    ModelStatus::Loaded => Holding::Loaded,
                };
                m.set(id, holding, source);
            }
        });
    }

    /// Folds in one event from cache number `source` of the replica.
    pub(crate) fn apply(&self, source: usize, event: &ModelEvent) {
        match &event.kind {
            ModelEventKind::Loaded { .. } => {
                self.failed.lock().remove(&event.id);
            }
            ModelEventKind::Failed { error }
                if matches!(
                    error.error_type(),
                    "load_failed" | "load_panicked" | "load_timeout" | "model_too_large"
                ) =>
            {
                let mut failed = self.failed.lock();
                let attempts = failed
                    .get(&event.id)
                    .map_or(1, |(_, n)| n.saturating_add(1));
                let avoid = FIRST_AVOID
                    .saturating_mul(2u32.saturating_pow(attempts - 1))
                    .min(MAX_AVOID);
                // Remembered a longest avoidance past its own, for the doubling.
                let now = Instant::now();
                failed.insert(
                    event.id.clone(),
                    (now + avoid, attempts),
                    now + avoid + MAX_AVOID,
                    now,
                );
            }
            _ => {}
        }
        let id = &event.id;
        match event.kind {
            ModelEventKind::Loading => self.update(|m| m.set(id, Holding::Loading, source)),
            ModelEventKind::Loaded {
                load_time,
                size_bytes,
            } => self.update(|m| m.loaded(id, source, load_time, size_bytes)),
            // Failed retracts the Loading (and any pending placement); Evicting means new
            // requests can no longer be served from it, and its room drains until Unloaded.
            ModelEventKind::Failed { .. } => self.update(|m| m.retract(id, source)),
            ModelEventKind::Evicting { .. } => self.update(|m| {
                m.evicting(id, source);
                m.retract(id, source);
            }),
            ModelEventKind::Unloaded { .. } => self.update(|m| m.unloaded(id, source)),
            _ => {}
        }
    }

    /// The models held now (for admin views and tests).
    pub(crate) fn holdings(&self) -> HashMap<ModelId, Holding> {
        (self.models.read().entries())
            .map(|(id, e)| (id.clone(), e.holding))
            .collect()
    }
}

impl ReplicaView for ReplicaLedger {
    fn id(&self) -> &str {
        &self.id
    }

    fn ongoing(&self) -> usize {
        self.ongoing.load(Ordering::SeqCst)
    }

    fn max_ongoing(&self) -> usize {
        self.max_ongoing
    }

    fn is_available(&self) -> bool {
        self.available.load(Ordering::SeqCst)
    }

    fn holds(&self, id: &ModelId, now: Instant) -> bool {
        self.models
            .read()
            .get(id)
            .is_some_and(|e| live(&e.holding, now))
    }

    fn holds_loaded(&self, id: &ModelId) -> bool {
        self.models
            .read()
            .get(id)
            .is_some_and(|e| e.holding == Holding::Loaded)
    }

    fn holds_loading(&self, id: &ModelId, now: Instant) -> bool {
        self.models.read().get(id).is_some_and(|e| match e.holding {
            Holding::Loading => true,
            Holding::Pending(at) => e.placing || now.duration_since(at) <= PENDING_LOADING_GRACE,
            Holding::Loaded => false,
        })
    }

    fn model_count(&self, now: Instant) -> usize {
        self.models.read().held(now)
    }

    /// Room for one more model without evicting: counting models that still drain, and, under
    /// a byte cap, their bytes and those of the held models (a model of unknown size, or the
    /// new one, counted at the mean known size).
    fn has_free_slot(&self, now: Instant) -> bool {
        let (model_capacity, byte_capacity) = (self.model_capacity(), self.byte_capacity());
        if model_capacity.is_none() && byte_capacity.is_none() {
            return true;
        }
        let models = self.models.read();
        let held = models.held(now);
        let (draining, draining_bytes) = models.draining();
        if model_capacity.is_some_and(|cap| held + draining >= cap) {
            return false;
        }
        let Some(cap) = byte_capacity else {
            return true;
        };
        let (known, known_bytes) = models.known();
        let typical = known_bytes / (known as u64).max(1);
        let used = known_bytes
            .saturating_add(((held.saturating_sub(known)) as u64).saturating_mul(typical))
            .saturating_add(draining_bytes);
        used.saturating_add(typical.max(1)) <= cap
    }

    fn oldest_use(&self) -> u64 {
        self.models.read().oldest_use()
    }

    fn service_time(&self) -> Option<Duration> {
        match self.service_micros.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    fn load_time(&self, id: &ModelId) -> Option<Duration> {
        self.models.read().get(id).and_then(|e| e.load_time)
    }

    fn waiting_for_load(&self, model: &ModelId) -> usize {
        self.waiting_for(model)
    }

    fn loaded_for(&self, id: &ModelId, now: Instant) -> Option<Duration> {
        let at = self.models.read().get(id)?.loaded_at?;
        Some(now.saturating_duration_since(at))
    }

    fn full_for(&self, now: Instant) -> Option<Duration> {
        if !self.is_saturated() {
            return None;
        }
        let filled = self.born + Duration::from_nanos(self.filled_at.load(Ordering::Relaxed));
        Some(now.saturating_duration_since(filled))
    }

    fn backing_off(&self, id: &ModelId, now: Instant) -> bool {
        self.failed
            .lock()
            .get(id)
            .is_some_and(|(until, _)| now < *until)
    }
}

mod model_set;
mod remote;
mod slots;
#[cfg(test)]
mod tests;
mod view;

pub use remote::CopyReport;
pub(crate) use view::ReplicaView;
