//! The public face of the cache: [`Multiplexer`], its builder and what it reports.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::time::Instant;

use crate::core::Core;
use crate::events::{EvictReason, ModelStatus, Subscription};
use crate::metrics::{Gauges, MetricsSnapshot};
use crate::{Error, Loader, Model, ModelGuard, ModelId};

/// How a [`Multiplexer`] behaves. Built with [`Multiplexer::builder`].
#[derive(Debug, Clone)]
pub struct Config {
    /// Most models held at once (loaded + loading + draining); `None` = no limit.
    pub max_models: Option<usize>,
    /// Most bytes held at once, by the models' reported sizes; `None` = no limit.
    pub max_bytes: Option<u64>,
    /// Most loader calls running at once.
    pub max_concurrent_loads: usize,
    /// How long one loader call may take before it is cancelled; `None` = no limit.
    pub load_timeout: Option<Duration>,
    /// How long a load waits for room (for models in use to become idle) before failing with
    /// [`Error::CapacityExhausted`].
    pub capacity_timeout: Duration,
    /// How long a failed model is refused before the next load is tried; doubles with each
    /// consecutive failure. Zero disables the failure memory.
    pub failure_backoff: Duration,
    /// The longest the failure backoff grows to.
    pub max_failure_backoff: Duration,
    /// Events buffered per subscriber before a slow one is told it lagged.
    pub event_capacity: usize,
    /// Which idle model goes first when room is needed.
    pub eviction: EvictionPolicy,
    /// How long a model's unload hook may run; after it the hook is dropped (and the model
    /// with it) and its capacity released. `None` = no limit.
    pub unload_timeout: Option<Duration>,
    /// Most loads waiting for one of the `max_concurrent_loads` turns; a load past it fails at
    /// once with [`Error::LoadsBusy`].
    pub max_queued_loads: usize,
}

/// Which idle model is evicted first when a load needs room. Models in use or pinned are
/// never evicted, whatever the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Least recently used first (what Ray Serve does). Predictable; the default.
    #[default]
    Lru,
    /// Greedy-Dual-Size-Frequency: lowest `L + hits × load_time / size` first, where `L`
    /// rises to the priority of each model evicted, so popularity that stops ages out. It
    /// keeps models that are used often, were slow to load, or are small; on skewed
    /// (Zipf-like) traffic it needs markedly fewer loads than LRU for the same room. A load
    /// that would evict an idle model worth more than one in use waits (at most the dearer
    /// model's load time, and a second) for the cheaper one to become idle instead.
    Gdsf,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            max_models: Some(3),
            max_bytes: None,
            max_concurrent_loads: 4,
            load_timeout: Some(Duration::from_secs(120)),
            capacity_timeout: Duration::from_secs(30),
            failure_backoff: Duration::from_secs(1),
            max_failure_backoff: Duration::from_secs(60),
            event_capacity: 1024,
            eviction: EvictionPolicy::Lru,
            unload_timeout: Some(Duration::from_secs(60)),
            max_queued_loads: 256,
        }
    }
}

/// Builds a [`Multiplexer`]. Defaults follow Ray Serve where it has one (3 models per replica).
#[derive(Debug, Clone, Default)]
#[must_use]
pub struct MultiplexerBuilder {
    config: Config,
}

impl MultiplexerBuilder {
    /// Most models held at once (default 3). Loading and draining models count too.
    ///
    /// # Panics
    /// If `n` is 0: nothing could ever be loaded. Use [`unbounded_models`](Self::unbounded_models)
    /// for no limit.
    pub fn max_models(mut self, n: usize) -> Self {
        assert!(n > 0, "max_models must be at least 1");
        self.config.max_models = Some(n);
        self
    }

    /// No limit on the number of models (set a byte cap instead, or memory is the limit).
    pub fn unbounded_models(mut self) -> Self {
        self.config.max_models = None;
        self
    }

    /// Most bytes held at once, by the sizes models report through [`Model::size_bytes`].
    pub fn max_bytes(mut self, bytes: u64) -> Self {
        self.config.max_bytes = Some(bytes);
        self
    }

    /// Most loader calls running at once (default 4).
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn max_concurrent_loads(mut self, n: usize) -> Self {
        assert!(n > 0, "max_concurrent_loads must be at least 1");
        self.config.max_concurrent_loads = n;
        self
    }

    /// How long one loader call may take (default 120 s); `None` for no limit.
    pub fn load_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.load_timeout = timeout;
        self
    }

    /// How long a load waits for room when every model is in use (default 30 s).
    pub fn capacity_timeout(mut self, timeout: Duration) -> Self {
        self.config.capacity_timeout = timeout;
        self
    }

    /// How long a failed model is refused (default 1 s, doubling per consecutive failure up to
    /// `max`, default 60 s). `Duration::ZERO` retries every time.
    pub fn failure_backoff(mut self, base: Duration, max: Duration) -> Self {
        self.config.failure_backoff = base;
        self.config.max_failure_backoff = max;
        self
    }

    /// How long an unload hook may run (default 60 s); `None` for no limit.
    pub fn unload_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.config.unload_timeout = timeout;
        self
    }

    /// Most loads waiting for a load turn (default 256).
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn max_queued_loads(mut self, n: usize) -> Self {
        assert!(n > 0, "max_queued_loads must be at least 1");
        self.config.max_queued_loads = n;
        self
    }

    /// Events buffered per subscriber (default 1024).
    ///
    /// # Panics
    /// If `n` is 0.
    pub fn event_capacity(mut self, n: usize) -> Self {
        assert!(n > 0, "event_capacity must be at least 1");
        self.config.event_capacity = n;
        self
    }

    /// Which idle model goes first when room is needed (default [`EvictionPolicy::Lru`]).
    pub fn eviction_policy(mut self, policy: EvictionPolicy) -> Self {
        self.config.eviction = policy;
        self
    }

    /// The configuration as it stands.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Builds the multiplexer around `loader`.
    ///
    /// # Panics
    /// Outside a Tokio runtime: loads and unloads run as tasks on the runtime it is built in.
    pub fn build<M: Model, L: Loader<M>>(self, loader: L) -> Multiplexer<M> {
        let runtime = Handle::try_current().expect(
            "Multiplexer::build must be called inside a Tokio runtime; loads and unloads run on it",
        );
        Multiplexer {
            core: Core::new(self.config, Box::new(loader), runtime),
        }
    }
}

/// A per-replica cache of models loaded on demand.
///
/// - [`get`](Self::get) returns a [`ModelGuard`], loading the model first if needed. Concurrent
///   gets of one cold id share one load; different ids load in parallel.
/// - While a guard lives the model is never unloaded; eviction only stops new gets from
///   finding it. Its [`Model::unload`] runs exactly once, after the last guard drops.
/// - Capacity is bounded by count and optionally by bytes, counting loading and draining
///   models; when everything is in use, a load waits (bounded), it never overcommits.
/// - Failed loads reach every waiter, leave nothing behind, and are remembered for a backoff.
///
/// Cloning is cheap and shares the cache.
///
/// ```
/// use modelmux_cache::{Model, ModelId, Multiplexer};
///
/// struct Greeter(String);
/// impl Model for Greeter {}
///
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// # rt.block_on(async {
/// let models = Multiplexer::builder()
///     .max_models(2)
///     .build(|id: ModelId| async move { Ok::<_, std::io::Error>(Greeter(format!("hello from {id}"))) });
///
/// let a = models.get("a").await?;
/// assert_eq!(a.0, "hello from a");
/// assert_eq!(models.loaded_ids(), vec![ModelId::new("a")?]);
/// # Ok::<_, Box<dyn std::error::Error>>(())
/// # }).unwrap();
/// ```
pub struct Multiplexer<M: Model> {
    core: Arc<Core<M>>,
}

impl<M: Model> Clone for Multiplexer<M> {
    fn clone(&self) -> Self {
        Self {
            core: self.core.clone(),
        }
    }
}

impl Multiplexer<()> {
    /// Starts building a multiplexer.
    pub fn builder() -> MultiplexerBuilder {
        MultiplexerBuilder::default()
    }
}

impl Model for () {}

impl<M: Model> Multiplexer<M> {
    /// Returns the model `id`, loading it if it is not resident.
    ///
    /// On a hit this takes no lock and allocates nothing. On a miss it joins the load already
    /// in progress for `id`, or starts one; the load runs on its own task, so dropping this
    /// future does not cancel it.
    pub async fn get(&self, id: &str) -> Result<ModelGuard<M>, Error> {
        match self.core.hit(id) {
            Some(guard) => Ok(guard),
            None => self.core.get_slow(id).await,
        }
    }

    /// Returns the model `id` if it is loaded now, without loading or waiting.
    pub fn try_get(&self, id: &str) -> Option<ModelGuard<M>> {
        self.core.hit(id)
    }

    /// Loads `id` ahead of traffic (no-op if it is loaded).
    pub async fn preload(&self, id: &str) -> Result<(), Error> {
        self.get(id).await.map(drop)
    }

    /// Loads `id` if needed and pins it: it is never evicted to make room until
    /// [`unpin`](Self::unpin)ned. Pinned models count against the caps like any other.
    pub async fn pin(&self, id: &str) -> Result<(), Error> {
        let guard = self.get(id).await?;
        guard.resident().pinned.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Unpins `id`. Returns whether it was loaded and pinned.
    pub fn unpin(&self, id: &str) -> bool {
        let Some(resident) = self.core.loaded(id) else {
            return false;
        };
        let was_pinned = resident.pinned.swap(false, Ordering::Relaxed);
        if was_pinned {
            self.core.room.wake();
        }
        was_pinned
    }

    /// Evicts `id` now, pinned or not: new gets no longer find it, and it is unloaded as soon as
    /// its last guard drops. Returns whether it was loaded. A load in progress is not affected.
    pub fn evict(&self, id: &str) -> bool {
        let Some(resident) = self.core.loaded(id) else {
            return false;
        };
        let mut st = self.core.state.lock();
        self.core.evict_locked(
            &mut st,
            std::slice::from_ref(&resident.id),
            EvictReason::Requested,
        );
        true
    }

    /// Ids of the loaded models, in no particular order.
    pub fn loaded_ids(&self) -> Vec<ModelId> {
        self.core.loaded_ids()
    }

    /// Ids of the models being loaded.
    pub fn loading_ids(&self) -> Vec<ModelId> {
        self.core.state.lock().loading.keys().cloned().collect()
    }

    /// Every model held: loaded ones first, most recently used first, then loading ones (and
    /// those queued to load, which hold no capacity yet).
    pub fn models(&self) -> Vec<ModelInfo> {
        self.core.models()
    }

    /// The models evicted but not yet unloaded (their last requests still run, or their unload
    /// hook does): id, the bytes they still hold, and whether requests still use them. A model
    /// evicted and loaded again may be here and loaded at once.
    pub fn draining(&self) -> Vec<(ModelId, u64, bool)> {
        self.core.draining()
    }

    /// Subscribes to state changes, with a consistent snapshot to start from.
    pub fn subscribe(&self) -> Subscription {
        self.core.subscribe()
    }

    /// Counters, histograms and occupancy.
    pub fn metrics(&self) -> MetricsSnapshot {
        let gauges = self.gauges();
        self.core.metrics.snapshot(gauges)
    }

    /// Occupancy only (cheaper than [`metrics`](Self::metrics)).
    pub fn gauges(&self) -> Gauges {
        self.core.gauges(&self.core.state.lock())
    }

    /// The configuration it was built with (its caps as built: [`caps`](Self::caps) gives
    /// them as they are now).
    pub fn config(&self) -> &Config {
        &self.core.config
    }

    /// `(max_models, max_bytes)` now (`None`: no limit).
    pub fn caps(&self) -> (Option<usize>, Option<u64>) {
        (self.core.caps.models(), self.core.caps.bytes())
    }

    /// Changes the caps while the cache runs. Raising them makes room at once. Lowering them
    /// evicts idle models now, in the eviction policy's order; models in use finish first (each
    /// is evicted when its last request is done, if the cache is still over), and pinned
    /// models stay (counted, so new loads wait for room). Loads in progress keep the room they
    /// reserved.
    ///
    /// # Panics
    /// If `max_models` is `Some(0)`.
    pub fn set_caps(&self, max_models: Option<usize>, max_bytes: Option<u64>) {
        assert!(max_models != Some(0), "max_models must be at least 1");
        self.core.caps.set(max_models, max_bytes);
        let fits = {
            let mut st = self.core.state.lock();
            self.core.shrink_locked(&mut st)
        };
        self.core.room.wake();
        if fits {
            return;
        }
        // Over the new caps with models in use: evict each as it becomes idle.
        let core = Arc::downgrade(&self.core);
        self.core.runtime.spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(50)).await;
                let Some(core) = core.upgrade() else { return };
                let mut st = core.state.lock();
                // Done when it fits, or when only pinned models keep it over.
                if st.shutting_down || core.shrink_locked(&mut st) || !core.busy_unpinned() {
                    return;
                }
            }
        });
    }

    /// Stops taking work and unloads everything: loads in progress are cancelled, every model
    /// is evicted, and this waits up to `timeout` for models still in use to be released and
    /// unloaded. Models released after that are still unloaded, when their last guard drops.
    pub async fn shutdown(&self, timeout: Duration) -> ShutdownReport {
        let deadline = Instant::now() + timeout;
        let (evicted, cancelled) = {
            let mut st = self.core.state.lock();
            st.shutting_down = true;
            let ids = self.core.loaded_ids();
            self.core.evict_locked(&mut st, &ids, EvictReason::Shutdown);
            let tasks: Vec<_> = st
                .loading
                .values()
                .filter_map(|slot| slot.task.clone())
                .collect();
            (ids.len(), tasks)
        };
        let cancelled_loads = cancelled.len();
        for task in cancelled {
            task.abort();
        }
        self.core.room.wake();
        loop {
            let notified = self.core.room.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.core.state.lock();
                let still_draining = self.core.draining_ids(&st);
                if (still_draining.is_empty() && st.loading.is_empty())
                    || Instant::now() >= deadline
                {
                    return ShutdownReport {
                        evicted,
                        cancelled_loads,
                        still_draining,
                    };
                }
            }
            // Wakes on every unload and every finished load; the deadline bounds the wait.
            let _ = tokio::time::timeout_at(deadline, notified).await;
        }
    }
}

/// What [`Multiplexer::models`] reports about one model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelInfo {
    /// The model.
    pub id: ModelId,
    /// Loaded, loading, or queued to load.
    pub status: ModelStatus,
    /// Reported size, when loaded and known.
    pub size_bytes: Option<u64>,
    /// Guards alive on it.
    pub in_use: usize,
    /// Pinned against eviction.
    pub pinned: bool,
    /// How long since its last guard was dropped (zero while in use, or loading).
    pub idle_for: Duration,
}

/// What [`Multiplexer::shutdown`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Models evicted.
    pub evicted: usize,
    /// Loads cancelled.
    pub cancelled_loads: usize,
    /// Models still waiting for their last guard (or their unload hook) when the timeout hit.
    pub still_draining: Vec<ModelId>,
}
