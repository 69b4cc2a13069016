//! The shared state of one multiplexer: the index readers use, the accounting writers keep.
//!
//! Two halves with different rules:
//! - **The index** ([`Index`], shards of `ArcSwap<HashMap>`) maps ids to loaded models.
//!   Readers (the hit path) never lock: they load the id's shard, look up, pin. Writers replace
//!   that shard (copy on write), which is cheap because it changes only when a load finishes
//!   or a model is evicted, and a shard holds a sixteenth of the models.
//! - **The state** (`Mutex<State>`) holds everything else: loads in progress, remembered
//!   failures, capacity accounting, the event sequence. It is only locked for short, non-async
//!   sections and never across an `.await` or a user callback, so it never serialises loads.
//!
//! Capacity invariant: `used_slots` / `used_bytes` count every model that occupies memory:
//! loaded (in the index), reserved by a load in progress, and evicted-but-draining. A load
//! reserves before it calls the loader, so the caps are never overcommitted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::sync::{Semaphore, broadcast};
use tokio::time::Instant;

use crate::events::{EvictReason, ModelEvent, ModelEventKind, ModelStatus, Subscription};
use crate::guard::{ModelGuard, Resident, RoomSignal, WaiterCount};
use crate::index::{Index, Snapshot};
use crate::load::{Failure, LoadSlot};
use crate::metrics::{Gauges, Metrics};
use crate::model::DynLoader;
use crate::{Config, Error, EvictionPolicy, Model, ModelId, ModelInfo};

/// The caps, changeable while the cache runs ([`Multiplexer::set_caps`](crate::Multiplexer::set_caps)).
pub(crate) struct Caps {
    /// `max_models`; `usize::MAX`: none.
    models: std::sync::atomic::AtomicUsize,
    /// `max_bytes`; `u64::MAX`: none.
    bytes: AtomicU64,
}

impl Caps {
    fn new(models: Option<usize>, bytes: Option<u64>) -> Self {
        Self {
            models: std::sync::atomic::AtomicUsize::new(models.unwrap_or(usize::MAX)),
            bytes: AtomicU64::new(bytes.unwrap_or(u64::MAX)),
        }
    }

    pub(crate) fn models(&self) -> Option<usize> {
        Some(self.models.load(Ordering::Relaxed)).filter(|m| *m != usize::MAX)
    }

    pub(crate) fn bytes(&self) -> Option<u64> {
        Some(self.bytes.load(Ordering::Relaxed)).filter(|b| *b != u64::MAX)
    }

    pub(crate) fn set(&self, models: Option<usize>, bytes: Option<u64>) {
        self.models
            .store(models.unwrap_or(usize::MAX), Ordering::Relaxed);
        self.bytes
            .store(bytes.unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

pub(crate) struct Core<M: Model> {
    pub(crate) config: Config,
    /// `config`'s caps as they are now (set again while running).
    pub(crate) caps: Caps,
    pub(crate) loader: Box<dyn DynLoader<M>>,
    index: Index<M>,
    pub(crate) state: Mutex<State<M>>,
    /// Logical LRU clock: bumped when a model other than the most recent one is used.
    clock: AtomicU64,
    /// GDSF's inflation `L` (f64 bits): the priority of the last model evicted for room.
    inflation: AtomicU64,
    /// The next loaded copy's serial number.
    serials: AtomicU64,
    /// The largest charge of any model admitted so far (0: none yet): what a load of unknown
    /// size reserves under a byte cap.
    pub(crate) largest_charge: AtomicU64,
    /// Loads waiting for a load turn.
    pub(crate) queued_loads: std::sync::atomic::AtomicUsize,
    pub(crate) room: Arc<RoomSignal>,
    pub(crate) load_permits: Semaphore,
    events: broadcast::Sender<ModelEvent>,
    pub(crate) metrics: Metrics,
    pub(crate) runtime: Handle,
    pub(crate) weak_self: Weak<Core<M>>,
    /// The span current when the multiplexer was built (a replica's): unloads log inside it.
    pub(crate) span: tracing::Span,
}

pub(crate) struct State<M: Model> {
    pub(crate) loading: HashMap<ModelId, LoadSlot<M>>,
    pub(crate) failures: crate::ExpiringMap<ModelId, Failure, tokio::time::Instant>,
    pub(crate) used_slots: usize,
    pub(crate) used_bytes: u64,
    /// Evicted models whose unload has not finished.
    draining: Vec<Draining<M>>,
    seq: u64,
    pub(crate) shutting_down: bool,
}

/// An evicted model whose unload has not finished.
struct Draining<M: Model> {
    id: ModelId,
    /// Which copy: the same id may be draining twice (evicted in use, reloaded, evicted again).
    serial: u64,
    size: u64,
    /// Alive while guards hold the model; gone once its unload has started.
    resident: Weak<Resident<M>>,
}

impl<M: Model> Draining<M> {
    /// Its unload is running, so its capacity comes back soon (not when some request ends).
    fn unloading(&self) -> bool {
        self.resident.strong_count() == 0
    }
}

/// The longest a load waits for a cheaper model in use rather than evict a dearer idle one.
const MAX_PATIENCE: Duration = Duration::from_secs(1);

/// Whether a reservation fits.
#[derive(Debug, PartialEq, Eq)]
enum Room {
    /// It fits now.
    Now,
    /// It will fit once models already draining (possibly just evicted for it) are unloaded,
    /// or once a model in use becomes idle: wait and look again.
    Wait,
    /// It would fit by evicting idle models worth more than one in use (GDSF): wait for that
    /// one to become idle, but look again after this long at most even if it does not.
    WaitAtMost(Duration),
}

impl<M: Model> Core<M> {
    pub(crate) fn new(config: Config, loader: Box<dyn DynLoader<M>>, runtime: Handle) -> Arc<Self> {
        Arc::new_cyclic(|weak_self| Core {
            load_permits: Semaphore::new(config.max_concurrent_loads),
            events: broadcast::channel(config.event_capacity).0,
            caps: Caps::new(config.max_models, config.max_bytes),
            config,
            loader,
            index: Index::default(),
            state: Mutex::new(State {
                loading: HashMap::new(),
                failures: crate::ExpiringMap::new(crate::load::MAX_REMEMBERED_FAILURES),
                used_slots: 0,
                used_bytes: 0,
                draining: Vec::new(),
                seq: 0,
                shutting_down: false,
            }),
            clock: AtomicU64::new(0),
            inflation: AtomicU64::new(0f64.to_bits()),
            serials: AtomicU64::new(0),
            largest_charge: AtomicU64::new(0),
            queued_loads: std::sync::atomic::AtomicUsize::new(0),
            room: Arc::default(),
            metrics: Metrics::default(),
            runtime,
            weak_self: weak_self.clone(),
            span: tracing::Span::current(),
        })
    }

    /// The hit path: no lock, no allocation.
    pub(crate) fn hit(&self, id: &str) -> Option<ModelGuard<M>> {
        let guard = ModelGuard::pin(self.index.get(id)?);
        self.touch(guard.resident());
        self.metrics.hits.inc();
        Some(guard)
    }

    /// Marks `r` most recently used. The clock only moves when the most recent model changes,
    /// so a hot model's hits write nothing shared.
    pub(crate) fn touch(&self, r: &Resident<M>) {
        let now = self.clock.load(Ordering::Relaxed);
        if r.last_used_tick.load(Ordering::Relaxed) != now {
            let tick = self.clock.fetch_add(1, Ordering::Relaxed) + 1;
            r.last_used_tick.store(tick, Ordering::Relaxed);
        }
        if self.config.eviction == EvictionPolicy::Gdsf {
            // The resident's line is already being written (its pin count); `L` changes only
            // on evictions, so it is almost always a plain read.
            r.hits.fetch_add(1, Ordering::Relaxed);
            let l = self.inflation.load(Ordering::Relaxed);
            if r.aged_at.load(Ordering::Relaxed) != l {
                r.aged_at.store(l, Ordering::Relaxed);
            }
        }
    }

    /// GDSF's inflation value `L`.
    pub(crate) fn inflation(&self) -> f64 {
        f64::from_bits(self.inflation.load(Ordering::Relaxed))
    }

    pub(crate) fn next_serial(&self) -> u64 {
        self.serials.fetch_add(1, Ordering::Relaxed)
    }

    pub(crate) fn next_tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn loaded(&self, id: &str) -> Option<Arc<Resident<M>>> {
        self.index.get(id)
    }

    /// Adds a loaded model to the index. Taking `&mut State` proves the caller holds the
    /// state lock, which serialises writers.
    pub(crate) fn index_insert(&self, _st: &mut State<M>, id: ModelId, r: Arc<Resident<M>>) {
        self.index.insert(id, r);
    }

    /// Publishes an event. Called with the state lock held, so events are in state order.
    pub(crate) fn emit(&self, st: &mut State<M>, id: &ModelId, kind: ModelEventKind) {
        st.seq += 1;
        // No subscriber is not an error.
        let _ = self.events.send(ModelEvent {
            seq: st.seq,
            id: id.clone(),
            kind,
        });
    }

    pub(crate) fn fits(&self, slots: usize, bytes: u64) -> bool {
        self.caps.models().is_none_or(|max| slots <= max)
            && self.caps.bytes().is_none_or(|max| bytes <= max)
    }

    /// Decides whether `slots` more slots and `bytes` more bytes fit, evicting idle models
    /// (least recently used first) when that is what it takes. Evicts nothing unless the
    /// evictions are enough: a load that will have to wait anyway must not empty the cache.
    ///
    /// Under GDSF, a load that would evict an idle model worth more than a model in use waits
    /// for the cheaper one to become idle instead (a hot model is idle between its requests;
    /// a cold one just loaded is still serving the request it was loaded for), as long as it
    /// has waited (`waited`) less than reloading the dearer one took, and at most a second.
    fn make_room(&self, st: &mut State<M>, slots: usize, bytes: u64, waited: Duration) -> Room {
        if self.fits(st.used_slots + slots, st.used_bytes + bytes) {
            return Room::Now;
        }
        // What will be used once the models already unloading are gone. Models evicted while
        // in use are not counted as coming back: their requests may run for long, and an idle
        // model can make room now.
        let (soon_slots, soon_bytes) = st
            .draining
            .iter()
            .filter(|d| d.unloading())
            .fold((0, 0), |(n, b), d| (n + 1, b + d.size));
        let mut after_slots = st.used_slots - soon_slots + slots;
        let mut after_bytes = st.used_bytes - soon_bytes + bytes;
        if self.fits(after_slots, after_bytes) {
            return Room::Wait;
        }
        let index = self.index.snapshot();
        // The order is lazy: the next victim is asked for only while one is needed.
        let mut idle = crate::eviction::order(self.config.eviction, &index);
        let mut victims = Vec::new();
        let mut victims_priority = Vec::new();
        let mut dearest = None;
        while !self.fits(after_slots, after_bytes) {
            let Some(r) = idle.next() else { break };
            after_slots -= 1;
            after_bytes -= r.charged;
            victims.push(r.id.clone());
            victims_priority.push(r.gdsf_priority());
            dearest = Some(r);
        }
        if self.fits(after_slots, after_bytes) {
            if self.config.eviction == EvictionPolicy::Gdsf
                && let Some(dearest) = dearest
                && waited < dearest.load_time.min(MAX_PATIENCE)
                && self.cheapest_busy(&index) < dearest.gdsf_priority()
            {
                return Room::WaitAtMost(dearest.load_time.min(MAX_PATIENCE) - waited);
            }
            self.metrics
                .evictions
                .fetch_add(victims.len() as u64, Ordering::Relaxed);
            if self.config.eviction == EvictionPolicy::Gdsf {
                // Age everything: later models start where the evicted ones ended.
                let highest = victims_priority
                    .iter()
                    .copied()
                    .fold(self.inflation(), f64::max);
                self.inflation.store(highest.to_bits(), Ordering::Relaxed);
            }
            self.evict_locked(st, &victims, EvictReason::Capacity);
        }
        Room::Wait
    }

    /// The lowest GDSF priority of a model in use and not pinned (infinity if none is).
    fn cheapest_busy(&self, index: &Snapshot<M>) -> f64 {
        index
            .values()
            .filter(|r| !r.is_idle() && !r.pinned.load(Ordering::Relaxed))
            .map(|r| r.gdsf_priority())
            .fold(f64::INFINITY, f64::min)
    }

    /// Evicts idle models, in the policy's order, until what is held fits the caps (models
    /// already unloading counted as gone); models in use or pinned stay. Returns whether it
    /// fits now.
    pub(crate) fn shrink_locked(&self, st: &mut State<M>) -> bool {
        if self.fits(st.used_slots, st.used_bytes) {
            return true;
        }
        let (soon_slots, soon_bytes) = st
            .draining
            .iter()
            .filter(|d| d.unloading())
            .fold((0, 0), |(n, b), d| (n + 1, b + d.size));
        let mut after_slots = st.used_slots - soon_slots;
        let mut after_bytes = st.used_bytes - soon_bytes;
        let index = self.index.snapshot();
        let mut victims = Vec::new();
        let mut idle = crate::eviction::order(self.config.eviction, &index);
        while !self.fits(after_slots, after_bytes) {
            let Some(r) = idle.next() else { break };
            after_slots -= 1;
            after_bytes -= r.charged;
            victims.push(r.id.clone());
        }
        if !victims.is_empty() {
            self.metrics
                .evictions
                .fetch_add(victims.len() as u64, Ordering::Relaxed);
            self.evict_locked(st, &victims, EvictReason::Capacity);
        }
        self.fits(after_slots, after_bytes)
    }

    /// Whether a model that is neither pinned nor idle is loaded: one that [`shrink_locked`]
    /// may evict once its requests are done.
    pub(crate) fn busy_unpinned(&self) -> bool {
        (self.index.snapshot().values()).any(|r| !r.is_idle() && !r.pinned.load(Ordering::Relaxed))
    }

    /// Waits until `slots` and `bytes` fit, then reserves them. Gives up at `deadline` with
    /// [`Error::CapacityExhausted`].
    pub(crate) async fn reserve(
        &self,
        id: &ModelId,
        slots: usize,
        bytes: u64,
        deadline: Instant,
    ) -> Result<(), Error> {
        let started = Instant::now();
        let mut look_again = None;
        let _waiting = WaiterCount::new(&self.room);
        loop {
            let notified = self.room.notify.notified();
            tokio::pin!(notified);
            // Registered before looking, so a wake-up between the look and the wait is kept.
            notified.as_mut().enable();
            {
                let mut st = self.state.lock();
                if st.shutting_down {
                    return Err(Error::ShuttingDown);
                }
                match self.make_room(&mut st, slots, bytes, started.elapsed()) {
                    Room::Now => {
                        st.used_slots += slots;
                        st.used_bytes += bytes;
                        return Ok(());
                    }
                    Room::Wait => {}
                    Room::WaitAtMost(most) => look_again = Some(Instant::now() + most),
                }
            }
            if let Some(at) = look_again.take().filter(|at| *at < deadline) {
                let _ = tokio::time::timeout_at(at, notified).await;
                continue;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                let st = self.state.lock();
                return Err(self.capacity_error(&st, id, started.elapsed()));
            }
        }
    }

    fn capacity_error(&self, st: &State<M>, id: &ModelId, waited: Duration) -> Error {
        let show = |v: Option<u64>| v.map_or_else(|| "unbounded".to_string(), |v| v.to_string());
        Error::CapacityExhausted {
            id: id.clone(),
            waited,
            resident: self.index.snapshot().len(),
            loading: st.loading.len().saturating_sub(1),
            draining: st.draining.len(),
            max_models: show(self.caps.models().map(|m| m as u64)),
            max_bytes: show(self.caps.bytes()),
        }
    }

    /// Takes `ids` out of the index (new requests no longer find them) and counts them as
    /// draining until their unload finishes.
    pub(crate) fn evict_locked(&self, st: &mut State<M>, ids: &[ModelId], reason: EvictReason) {
        let mut evicted = Vec::with_capacity(ids.len());
        evicted.extend(ids.iter().filter_map(|id| self.index.remove(id)));
        for r in &evicted {
            r.pinned.store(false, Ordering::Relaxed);
            r.evicted_for.store(reason.code(), Ordering::Relaxed);
            self.drain_unadmitted(st, r);
            self.emit(st, &r.id, ModelEventKind::Evicting { reason });
            tracing::debug!(model_id = %r.id, ?reason, in_use = r.in_use.load(Ordering::Relaxed), "evicted");
        }
        // `evicted` drops here: an idle model's last reference goes and its unload starts.
    }

    /// Counts a model as draining: evicted, or loaded but refused admission.
    pub(crate) fn drain_unadmitted(&self, st: &mut State<M>, r: &Arc<Resident<M>>) {
        st.draining.push(Draining {
            id: r.id.clone(),
            serial: r.serial,
            size: r.charged,
            resident: Arc::downgrade(r),
        });
    }

    /// Called by the unload task when a model's unload hook has finished.
    pub(crate) fn finish_unload(
        &self,
        copy: crate::guard::CopyId,
        took: Duration,
        error: Option<String>,
    ) {
        let id = copy.id;
        Metrics::add(&self.metrics.unloads);
        if error.is_some() {
            Metrics::add(&self.metrics.unload_failures);
        }
        self.metrics.unload_duration.observe(took);
        {
            let mut st = self.state.lock();
            // By serial, not by id: another copy of the same model may still be draining, in
            // use, and must keep counting as not coming back soon.
            if let Some(pos) = st.draining.iter().position(|d| d.serial == copy.serial) {
                let d = st.draining.swap_remove(pos);
                st.used_slots -= 1;
                st.used_bytes -= d.size;
            } else {
                debug_assert!(false, "unloaded model '{id}' was not draining");
            }
            self.emit(
                &mut st,
                &id,
                ModelEventKind::Unloaded {
                    unload_time: took,
                    error,
                },
            );
        }
        self.room.wake();
    }

    pub(crate) fn gauges(&self, st: &State<M>) -> Gauges {
        let index = self.index.snapshot();
        Gauges {
            loaded: index.len(),
            loading: st.loading.len(),
            draining: st.draining.len(),
            used_slots: st.used_slots,
            used_bytes: st.used_bytes,
            pinned: index
                .values()
                .filter(|r| r.pinned.load(Ordering::Relaxed))
                .count(),
        }
    }

    /// Mean reported size of the loaded models (the reservation for a load of unknown size).
    pub(crate) fn mean_loaded_size(&self) -> u64 {
        let index = self.index.snapshot();
        let (n, sum) = index
            .values()
            .filter_map(|r| r.size)
            .fold((0u64, 0u64), |(n, sum), s| (n + 1, sum.saturating_add(s)));
        sum.checked_div(n).unwrap_or(0)
    }

    pub(crate) fn subscribe(&self) -> Subscription {
        let st = self.state.lock();
        let index = self.index.snapshot();
        let loaded = index.keys().map(|id| (id.clone(), ModelStatus::Loaded));
        let loading = st
            .loading
            .keys()
            .map(|id| (id.clone(), ModelStatus::Loading));
        Subscription {
            snapshot: loaded.chain(loading).collect(),
            seq: st.seq,
            events: self.events.subscribe(),
        }
    }

    pub(crate) fn models(&self) -> Vec<ModelInfo> {
        let st = self.state.lock();
        let index = self.index.snapshot();
        let mut loaded: Vec<&Arc<Resident<M>>> = index.values().collect();
        loaded
            .sort_unstable_by_key(|r| std::cmp::Reverse(r.last_used_tick.load(Ordering::Relaxed)));
        let loaded = loaded.into_iter().map(|r| ModelInfo {
            id: r.id.clone(),
            status: ModelStatus::Loaded,
            size_bytes: r.size,
            in_use: r.in_use.load(Ordering::Relaxed),
            pinned: r.pinned.load(Ordering::Relaxed),
            idle_for: r.idle_for(),
        });
        let loading = st.loading.iter().map(|(id, slot)| ModelInfo {
            id: id.clone(),
            status: if slot.started {
                ModelStatus::Loading
            } else {
                ModelStatus::Queued
            },
            size_bytes: None,
            in_use: 0,
            pinned: false,
            idle_for: Duration::ZERO,
        });
        loaded.chain(loading).collect()
    }

    /// The models evicted whose unload has not finished: id, bytes, and whether requests
    /// still use them (else their unload is running).
    pub(crate) fn draining(&self) -> Vec<(ModelId, u64, bool)> {
        let st = self.state.lock();
        st.draining
            .iter()
            .map(|d| (d.id.clone(), d.size, !d.unloading()))
            .collect()
    }

    /// Ids of the models draining, for the shutdown report.
    pub(crate) fn draining_ids(&self, st: &State<M>) -> Vec<ModelId> {
        st.draining.iter().map(|d| d.id.clone()).collect()
    }

    pub(crate) fn loaded_ids(&self) -> Vec<ModelId> {
        self.index.snapshot().keys().cloned().collect()
    }
}
