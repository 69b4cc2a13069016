//! What the router knows about each replica: its load, and which models it holds.
//!
//! Each replica has a [`ReplicaLedger`]. Its model set is replaced (copy on write) whenever one
//! of the replica's caches publishes an event, the moment it publishes it, so reading it on the
//! request path takes no lock. The router adds *pending* entries when it places a cold model on
//! a replica, before that replica has even started the load: requests for the same model that
//! arrive in between follow the first one instead of scattering (Ray's first-request burst).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use modelmux_cache::{ExpiringMap, ModelEvent, ModelEventKind, ModelId, ModelStatus};
use tokio::time::Instant;

/// How long a placement the router made stays valid without word from the replica.
pub(crate) const PENDING_TTL: Duration = Duration::from_secs(5);
/// How long a fresh placement counts as "loading" for the wait-for-the-loading-holder rule:
/// long enough for the replica to report `Loading`, short enough that a placement never
/// confirmed (the request failed before asking its cache) cannot hold requests back.
pub(crate) const PENDING_LOADING_GRACE: Duration = Duration::from_secs(1);
/// The source of the entries the router itself adds (pending placements).
const ROUTER: usize = usize::MAX;

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
    /// Evicted copies whose unload has not run yet (still in use, or unloading), per cache and
    /// id: how many, and their bytes. They hold capacity a new load cannot have.
    draining: parking_lot::Mutex<HashMap<(usize, ModelId), (usize, u64)>>,
    models: ArcSwap<HashMap<ModelId, Entry>>,
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

/// A model in a replica's set: how it is held, who reported it, when it was last routed here.
#[derive(Debug, Clone)]
struct Entry {
    holding: Holding,
    /// Which of the replica's caches reported it (`ROUTER` for a pending placement).
    source: usize,
    /// Coarse monotonic ticks of the last routing here (shared across copies of the map).
    routed: Arc<AtomicU64>,
    /// How long the load took, once loaded.
    load_time: Option<Duration>,
    /// When this router learned it was loaded.
    loaded_at: Option<Instant>,
    /// Its size, once loaded (if it reports one).
    size_bytes: Option<u64>,
}

impl Entry {
    fn new(holding: Holding, source: usize) -> Self {
        Self {
            holding,
            source,
            routed: Arc::new(AtomicU64::new(coarse_now())),
            load_time: None,
            loaded_at: None,
            size_bytes: None,
        }
    }
}

fn coarse_now() -> u64 {
    modelmux_cache::coarse_clock::ticks()
}

/// Sets how `id` is held and by which cache, keeping its routing time.
fn set(m: &mut HashMap<ModelId, Entry>, id: &ModelId, holding: Holding, source: usize) {
    m.entry(id.clone())
        .and_modify(|e| {
            e.holding = holding;
            e.source = source;
        })
        .or_insert_with(|| Entry::new(holding, source));
}

fn live(h: &Holding, now: Instant) -> bool {
    match h {
        Holding::Pending(at) => now.duration_since(*at) <= PENDING_TTL,
        Holding::Loading | Holding::Loaded => true,
    }
}

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
            draining: parking_lot::Mutex::default(),
            models: ArcSwap::default(),
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

    /// Replaces the model set with `f` applied to a copy (retried if a concurrent update won).
    fn update(&self, f: impl Fn(&mut HashMap<ModelId, Entry>)) {
        self.models.rcu(|current| {
            let mut next = HashMap::clone(current);
            // Drop placements the replica never confirmed, before the change, so an expired
            // entry cannot stand in for a new one.
            let now = Instant::now();
            next.retain(|_, e| !matches!(e.holding, Holding::Pending(at) if now.duration_since(at) > PENDING_TTL));
            f(&mut next);
            next
        });
    }

    /// Records that the router sent `id` here to be loaded.
    pub(crate) fn mark_pending(&self, id: &ModelId) {
        let now = Instant::now();
        self.update(|m| {
            m.entry(id.clone())
                .or_insert_with(|| Entry::new(Holding::Pending(now), ROUTER));
        });
    }

    /// Records that a request for `id` was just routed here: the placement of cold models uses
    /// it to find the replica holding the least recently used model (a global LRU). Writes
    /// only when the coarse clock has moved, so hot models cost a read per request.
    pub(crate) fn note_routed(&self, id: &ModelId) {
        if let Some(e) = self.models.load().get(id) {
            let now = coarse_now();
            if e.routed.load(Ordering::Relaxed) != now {
                e.routed.store(now, Ordering::Relaxed);
            }
        }
    }

    /// Starts (or starts again, after lagging) from the snapshot of cache number `source`:
    /// what it reports replaces what that cache reported before; other caches' entries and the
    /// router's pending placements stay.
    pub(crate) fn apply_snapshot(&self, source: usize, snapshot: &[(ModelId, ModelStatus)]) {
        // Which of that cache's models still drain is unknown after a resync.
        self.draining.lock().retain(|(s, _), _| *s != source);
        self.update(|m| {
            m.retain(|_, e| e.source != source);
            for (id, status) in snapshot {
                let holding = match status {
                    ModelStatus::Queued | ModelStatus::Loading => Holding::Loading,
                    ModelStatus::Loaded => Holding::Loaded,
                };
                set(m, id, holding, source);
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
            ModelEventKind::Evicting { .. } => {
                let bytes = self
                    .models
                    .load()
                    .get(&event.id)
                    .filter(|e| e.source == source)
                    .and_then(|e| e.size_bytes)
                    .unwrap_or(0);
                let mut draining = self.draining.lock();
                let copies = draining.entry((source, event.id.clone())).or_default();
                *copies = (copies.0 + 1, copies.1.saturating_add(bytes));
            }
            ModelEventKind::Unloaded { .. } => {
                let mut draining = self.draining.lock();
                let key = (source, event.id.clone());
                if let Some(&(n, bytes)) = draining.get(&key) {
                    if n <= 1 {
                        draining.remove(&key);
                    } else {
                        // Copies of one id are about the same size: release an even share.
                        draining.insert(key, (n - 1, bytes - bytes / n as u64));
                    }
                }
            }
            _ => {}
        }
        self.update(|m| match event.kind {
            ModelEventKind::Loading => set(m, &event.id, Holding::Loading, source),
            ModelEventKind::Loaded {
                load_time,
                size_bytes,
            } => {
                set(m, &event.id, Holding::Loaded, source);
                if let Some(e) = m.get_mut(&event.id) {
                    e.load_time = Some(load_time);
                    e.size_bytes = size_bytes;
                    e.loaded_at.get_or_insert_with(Instant::now);
                }
            }
            // Failed retracts the Loading (and any pending placement); Evicting means new
            // requests can no longer be served from it. Unloaded changes nothing more. Another
            // cache's entry for the same id stays.
            ModelEventKind::Failed { .. } | ModelEventKind::Evicting { .. }
                if m.get(&event.id)
                    .is_some_and(|e| e.source == source || e.source == ROUTER) =>
            {
                m.remove(&event.id);
            }
            _ => {}
        });
    }

    /// The models held now (for admin views and tests).
    pub(crate) fn holdings(&self) -> HashMap<ModelId, Holding> {
        self.models
            .load()
            .iter()
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
            .load()
            .get(id)
            .is_some_and(|e| live(&e.holding, now))
    }

    fn holds_loaded(&self, id: &ModelId) -> bool {
        self.models
            .load()
            .get(id)
            .is_some_and(|e| e.holding == Holding::Loaded)
    }

    fn holds_loading(&self, id: &ModelId, now: Instant) -> bool {
        self.models.load().get(id).is_some_and(|e| match e.holding {
            Holding::Loading => true,
            Holding::Pending(at) => now.duration_since(at) <= PENDING_LOADING_GRACE,
            Holding::Loaded => false,
        })
    }

    fn model_count(&self, now: Instant) -> usize {
        self.models
            .load()
            .values()
            .filter(|e| live(&e.holding, now))
            .count()
    }

    /// Room for one more model without evicting: counting models that still drain, and, under
    /// a byte cap, their bytes and those of the held models (a model of unknown size, or the
    /// new one, counted at the mean known size).
    fn has_free_slot(&self, now: Instant) -> bool {
        let (model_capacity, byte_capacity) = (self.model_capacity(), self.byte_capacity());
        if model_capacity.is_none() && byte_capacity.is_none() {
            return true;
        }
        let (draining, draining_bytes) = self
            .draining
            .lock()
            .values()
            .fold((0, 0u64), |(n, b), &(dn, db)| {
                (n + dn, b.saturating_add(db))
            });
        let models = self.models.load();
        let held: Vec<&Entry> = models.values().filter(|e| live(&e.holding, now)).collect();
        if model_capacity.is_some_and(|cap| held.len() + draining >= cap) {
            return false;
        }
        let Some(cap) = byte_capacity else {
            return true;
        };
        let known: Vec<u64> = held.iter().filter_map(|e| e.size_bytes).collect();
        let known_bytes = known.iter().fold(0u64, |a, &b| a.saturating_add(b));
        let typical = known_bytes / (known.len() as u64).max(1);
        let used = known_bytes
            .saturating_add(((held.len() - known.len()) as u64).saturating_mul(typical))
            .saturating_add(draining_bytes);
        used.saturating_add(typical.max(1)) <= cap
    }

    fn oldest_use(&self) -> u64 {
        self.models
            .load()
            .values()
            .filter(|e| e.holding == Holding::Loaded)
            .map(|e| e.routed.load(Ordering::Relaxed))
            .min()
            .unwrap_or(u64::MAX)
    }

    fn service_time(&self) -> Option<Duration> {
        match self.service_micros.load(Ordering::Relaxed) {
            0 => None,
            micros => Some(Duration::from_micros(micros)),
        }
    }

    fn load_time(&self, id: &ModelId) -> Option<Duration> {
        self.models.load().get(id).and_then(|e| e.load_time)
    }

    fn waiting_for_load(&self, model: &ModelId) -> usize {
        self.waiting_for(model)
    }

    fn loaded_for(&self, id: &ModelId, now: Instant) -> Option<Duration> {
        let at = self.models.load().get(id)?.loaded_at?;
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

mod remote;
mod slots;
#[cfg(test)]
mod tests;
mod view;

pub use remote::CopyReport;
pub(crate) use view::ReplicaView;
