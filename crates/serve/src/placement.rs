//! What the router knows about each replica: its load, and which models it holds.
//!
//! Each replica has a [`ReplicaSlot`]. Its model set is replaced (copy on write) whenever one
//! of the replica's caches publishes an event, the moment it publishes it, so reading it on the
//! request path takes no lock. The router adds *pending* entries when it places a cold model on
//! a replica, before that replica has even started the load: requests for the same model that
//! arrive in between follow the first one instead of scattering (Ray's first-request burst).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use arc_swap::ArcSwap;
use modelmux_cache::{ModelEvent, ModelEventKind, ModelId, ModelStatus};
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

/// The router's view of one replica.
pub trait ReplicaView {
    /// The replica's id (used for rendezvous hashing).
    fn id(&self) -> &str;
    /// Requests in progress on it.
    fn ongoing(&self) -> usize;
    /// Its `max_ongoing_requests`.
    fn max_ongoing(&self) -> usize;
    /// Whether it takes requests at all (healthy, not draining).
    fn is_available(&self) -> bool;
    /// Whether it holds (or is about to load) `id`.
    fn holds(&self, id: &ModelId, now: Instant) -> bool;
    /// Whether it has `id` loaded (servable now, not pending or loading).
    fn holds_loaded(&self, id: &ModelId) -> bool;
    /// Whether it is loading `id`, or was sent it to load within the last second.
    fn holds_loading(&self, id: &ModelId, now: Instant) -> bool;
    /// Models it holds, loading ones included.
    fn model_count(&self, now: Instant) -> usize;
    /// Whether it can load another model without evicting one.
    fn has_free_slot(&self, now: Instant) -> bool;
    /// When its least recently used loaded model was last used (any monotonic unit; smaller
    /// is older; `u64::MAX` when it has none). A full replica with an older model is the
    /// better place for a new one: that model is the one a global LRU would evict.
    fn oldest_use(&self) -> u64;
    /// How long its requests take lately (their service time, not counting queueing), if
    /// known: the router weighs waiting for a busy holder against loading another copy.
    fn service_time(&self) -> Option<Duration> {
        None
    }
    /// How long loading `id` took here, if it holds it loaded and the load was timed.
    fn load_time(&self, _id: &ModelId) -> Option<Duration> {
        None
    }
    /// Whether a load of `id` failed here recently: placing it here again would only be
    /// refused while the replica backs off.
    fn backing_off(&self, _id: &ModelId, _now: Instant) -> bool {
        false
    }

    /// At `max_ongoing_requests`.
    fn is_saturated(&self) -> bool {
        self.ongoing() >= self.max_ongoing()
    }
}

/// One replica's routing state, shared by the router (reads) and the replica's event feeds
/// (writes).
pub struct ReplicaSlot {
    id: Arc<str>,
    ongoing: AtomicUsize,
    max_ongoing: usize,
    available: AtomicBool,
    /// Whether the replica has model caches at all: if not, model ids do not steer routing.
    tracks_models: bool,
    /// `max_models` of the replica's caches (summed), `None` if unbounded or unknown.
    model_capacity: Option<usize>,
    models: ArcSwap<HashMap<ModelId, Entry>>,
    /// Recent service time, an exponentially weighted mean in microseconds (0: none yet).
    service_micros: AtomicU64,
    /// Models whose load failed here: until when to place them elsewhere, and failures in a
    /// row (the avoidance doubles with each, as the cache's backoff does).
    failed: parking_lot::Mutex<HashMap<ModelId, (Instant, u32)>>,
}

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
}

impl Entry {
    fn new(holding: Holding, source: usize) -> Self {
        Self {
            holding,
            source,
            routed: Arc::new(AtomicU64::new(coarse_now())),
            load_time: None,
        }
    }
}

fn coarse_now() -> u64 {
    coarsetime::Instant::now().as_ticks()
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

impl ReplicaSlot {
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
            model_capacity,
            models: ArcSwap::default(),
            service_micros: AtomicU64::new(0),
            failed: parking_lot::Mutex::default(),
        }
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

    /// Takes one request slot if the replica is available and below `max_ongoing` (one CAS,
    /// no lock), so concurrent dispatchers can never push a replica past its limit. Backs out
    /// if the replica was taken out of rotation meanwhile (a drain must not see 0 and then a
    /// request arrive).
    pub(crate) fn try_begin(&self) -> bool {
        if !self.is_available() {
            return false;
        }
        let taken = self
            .ongoing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max_ongoing).then_some(n + 1)
            })
            .is_ok();
        if taken && !self.is_available() {
            self.end();
            return false;
        }
        taken
    }

    /// Releases a slot; returns the number still in progress.
    pub(crate) fn end(&self) -> usize {
        self.ongoing.fetch_sub(1, Ordering::SeqCst) - 1
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
        self.update(|m| {
            m.retain(|_, e| e.source != source);
            for (id, status) in snapshot {
                let holding = match status {
                    ModelStatus::Loading => Holding::Loading,
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
                failed.insert(event.id.clone(), (Instant::now() + avoid, attempts));
            }
            _ => {}
        }
        self.update(|m| match event.kind {
            ModelEventKind::Loading => set(m, &event.id, Holding::Loading, source),
            ModelEventKind::Loaded { load_time, .. } => {
                set(m, &event.id, Holding::Loaded, source);
                if let Some(e) = m.get_mut(&event.id) {
                    e.load_time = Some(load_time);
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
    pub fn holdings(&self) -> HashMap<ModelId, Holding> {
        self.models
            .load()
            .iter()
            .map(|(id, e)| (id.clone(), e.holding))
            .collect()
    }
}

impl ReplicaView for ReplicaSlot {
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

    fn has_free_slot(&self, now: Instant) -> bool {
        self.model_capacity
            .is_none_or(|cap| self.model_count(now) < cap)
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

    fn backing_off(&self, id: &ModelId, now: Instant) -> bool {
        self.failed
            .lock()
            .get(id)
            .is_some_and(|(until, _)| now < *until)
    }
}

impl<T: ReplicaView> ReplicaView for Arc<T> {
    fn id(&self) -> &str {
        (**self).id()
    }
    fn service_time(&self) -> Option<Duration> {
        (**self).service_time()
    }
    fn load_time(&self, id: &ModelId) -> Option<Duration> {
        (**self).load_time(id)
    }
    fn backing_off(&self, id: &ModelId, now: Instant) -> bool {
        (**self).backing_off(id, now)
    }
    fn ongoing(&self) -> usize {
        (**self).ongoing()
    }
    fn max_ongoing(&self) -> usize {
        (**self).max_ongoing()
    }
    fn is_available(&self) -> bool {
        (**self).is_available()
    }
    fn holds(&self, id: &ModelId, now: Instant) -> bool {
        (**self).holds(id, now)
    }
    fn holds_loaded(&self, id: &ModelId) -> bool {
        (**self).holds_loaded(id)
    }
    fn holds_loading(&self, id: &ModelId, now: Instant) -> bool {
        (**self).holds_loading(id, now)
    }
    fn model_count(&self, now: Instant) -> usize {
        (**self).model_count(now)
    }
    fn has_free_slot(&self, now: Instant) -> bool {
        (**self).has_free_slot(now)
    }
    fn oldest_use(&self) -> u64 {
        (**self).oldest_use()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(id: &str, kind: ModelEventKind) -> ModelEvent {
        ModelEvent {
            seq: 0,
            id: ModelId::new(id).unwrap(),
            kind,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn events_drive_the_model_set() {
        let slot = ReplicaSlot::new("r".into(), 5, 1, Some(2));
        let m = ModelId::new("m").unwrap();
        let now = Instant::now();
        assert!(!slot.holds(&m, now));
        slot.apply(0, &event("m", ModelEventKind::Loading));
        assert!(slot.holds(&m, now));
        assert!(slot.has_free_slot(now));
        slot.apply(0, &event("n", ModelEventKind::Loading));
        assert!(!slot.has_free_slot(now));
        slot.apply(
            0,
            &event(
                "n",
                ModelEventKind::Failed {
                    error: modelmux_cache::Error::ShuttingDown,
                },
            ),
        );
        assert_eq!(slot.model_count(now), 1, "a failed load is retracted");
        slot.apply(
            0,
            &event(
                "m",
                ModelEventKind::Evicting {
                    reason: modelmux_cache::EvictReason::Capacity,
                },
            ),
        );
        assert!(!slot.holds(&m, now));
    }

    #[tokio::test(start_paused = true)]
    async fn pending_placements_expire() {
        let slot = ReplicaSlot::new("r".into(), 5, 1, None);
        let m = ModelId::new("m").unwrap();
        slot.mark_pending(&m);
        assert!(slot.holds(&m, Instant::now()));
        tokio::time::advance(PENDING_TTL + Duration::from_millis(1)).await;
        assert!(!slot.holds(&m, Instant::now()));
        assert_eq!(slot.model_count(Instant::now()), 0);
    }
}

#[cfg(test)]
mod review_tests {
    use super::*;

    fn ev(id: &str, kind: ModelEventKind) -> ModelEvent {
        ModelEvent {
            seq: 0,
            id: ModelId::new(id).unwrap(),
            kind,
        }
    }

    fn evicting() -> ModelEventKind {
        ModelEventKind::Evicting {
            reason: modelmux_cache::EvictReason::Capacity,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn two_caches_on_one_replica_keep_their_own_entries() {
        let slot = ReplicaSlot::new("r".into(), 5, 2, None);
        let (x, y) = (ModelId::new("x").unwrap(), ModelId::new("y").unwrap());
        slot.apply_snapshot(0, &[(x.clone(), ModelStatus::Loaded)]);
        slot.apply_snapshot(1, &[(y.clone(), ModelStatus::Loaded)]);
        let now = Instant::now();
        assert!(
            slot.holds(&x, now) && slot.holds(&y, now),
            "the second snapshot kept the first's"
        );
        slot.apply(1, &ev("x", evicting()));
        assert!(
            slot.holds(&x, now),
            "cache 1 evicting does not remove cache 0's model"
        );
        slot.apply(0, &ev("x", evicting()));
        assert!(!slot.holds(&x, now));
        slot.apply_snapshot(1, &[]);
        assert!(
            !slot.holds(&y, now),
            "a resync replaces that cache's entries"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_placement_replaces_an_expired_one() {
        let slot = ReplicaSlot::new("r".into(), 5, 1, None);
        let m = ModelId::new("m").unwrap();
        slot.mark_pending(&m);
        tokio::time::advance(PENDING_TTL + Duration::from_secs(1)).await;
        slot.mark_pending(&m);
        assert!(slot.holds(&m, Instant::now()));
        assert!(slot.holds_loading(&m, Instant::now()));
        tokio::time::advance(PENDING_LOADING_GRACE + Duration::from_millis(1)).await;
        assert!(
            !slot.holds_loading(&m, Instant::now()),
            "an unconfirmed placement stops holding requests back"
        );
    }

    #[test]
    fn a_drained_replica_takes_no_new_request() {
        let slot = ReplicaSlot::new("r".into(), 1, 0, None);
        assert!(slot.try_begin());
        assert!(!slot.try_begin(), "max_ongoing is 1");
        slot.end();
        slot.set_available(false);
        assert!(!slot.try_begin());
        assert_eq!(slot.ongoing(), 0, "a refused try leaves nothing taken");
    }
}
