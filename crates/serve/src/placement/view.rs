//! [`ReplicaView`]: what the routing rules ask of a replica, local or on another node.

use std::sync::Arc;
use std::time::Duration;

use modelmux_cache::ModelId;
use tokio::time::Instant;

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
    /// How long since this router learned it holds `id` loaded.
    fn loaded_for(&self, id: &ModelId, now: Instant) -> Option<Duration>;
    /// Requests for `model` inside it that wait for its load, their slots given back
    /// meanwhile (they take them back, before any newcomer, once the load is done).
    fn waiting_for_load(&self, model: &ModelId) -> usize;
    /// While it is saturated: how long since its last slot was taken, no slot having freed
    /// since (how long requests queued for it have had to wait at least). No default: a view
    /// that forwards to another must forward this too, or the copy rule goes blind.
    fn full_for(&self, now: Instant) -> Option<Duration>;
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
    fn full_for(&self, now: Instant) -> Option<Duration> {
        (**self).full_for(now)
    }
    fn waiting_for_load(&self, model: &ModelId) -> usize {
        (**self).waiting_for_load(model)
    }
    fn loaded_for(&self, id: &ModelId, now: Instant) -> Option<Duration> {
        (**self).loaded_for(id, now)
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
