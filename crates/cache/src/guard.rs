//! A resident model and the guards that pin it while in use.
//!
//! Why unload is exactly-once by construction: a [`Resident`] is created once per successful
//! load and its model is handed to the unload hook from `Resident::drop`, which Rust runs once,
//! when the last `Arc` to it goes away. The index holds one `Arc` while the model is servable;
//! every [`ModelGuard`] holds another. So eviction (dropping the index's `Arc`) can never unload
//! a model someone is still using, and no bookkeeping can get the count wrong.

use std::fmt;
use std::ops::Deref;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use futures_util::FutureExt;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::core::Core;
use crate::error::panic_message;
use crate::events::EvictReason;
use crate::{Model, ModelId};

/// Wakes loads waiting for room. `waiters` lets the hot path skip the wake-up when nobody waits.
#[derive(Default)]
pub(crate) struct RoomSignal {
    pub(crate) waiters: AtomicUsize,
    pub(crate) notify: Notify,
}

impl RoomSignal {
    /// Wakes every waiting load so it looks for room again.
    pub(crate) fn wake(&self) {
        self.notify.notify_waiters();
    }

    /// Wakes waiters if there are any. `SeqCst` pairs with [`WaiterCount::new`]: either the
    /// waiter's check sees the change that freed room, or this sees the waiter.
    fn wake_if_waiting(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.wake();
        }
    }
}

/// Counts a load as waiting for room for as long as it lives.
pub(crate) struct WaiterCount<'a>(&'a RoomSignal);

impl<'a> WaiterCount<'a> {
    pub(crate) fn new(signal: &'a RoomSignal) -> Self {
        signal.waiters.fetch_add(1, Ordering::SeqCst);
        Self(signal)
    }
}

impl Drop for WaiterCount<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A loaded model and what the cache knows about it.
///
/// `repr(C)` keeps the fields every hit writes first, next to the `Arc`'s own counts, so a hit
/// moves as few cache lines between cores as it can; the model, which may be large, comes last.
#[repr(C)]
pub(crate) struct Resident<M: Model> {
    /// Guards alive on this model.
    pub(crate) in_use: AtomicUsize,
    /// When the last guard was dropped, as a coarse monotonic timestamp in ticks of
    /// the [coarse clock](crate::coarse_clock) (for people; the LRU order uses the logical tick).
    idle_since: AtomicU64,
    /// Logical LRU clock value of the last use (exact order, no ties).
    pub(crate) last_used_tick: AtomicU64,
    /// Pinned by an operator: never evicted for capacity.
    pub(crate) pinned: AtomicBool,
    /// Why it left the index ([`EvictReason::code`]), for the unload's log line; 0 while it
    /// never was evicted (a copy refused after its load is unloaded with 0).
    pub(crate) evicted_for: AtomicU8,
    /// Gets served while resident (GDSF's frequency), counting the load.
    pub(crate) hits: AtomicU64,
    /// GDSF: the inflation value `L` at the last access, as f64 bits.
    pub(crate) aged_at: AtomicU64,
    /// GDSF: what reloading it would cost per byte (load seconds per MiB, at least 1 ms / MiB).
    pub(crate) cost_per_mib: f64,
    /// How long its load took.
    pub(crate) load_time: std::time::Duration,
    pub(crate) id: ModelId,
    pub(crate) size: Option<u64>,
    /// Bytes counted against `max_bytes`: the reported size, or, for a model that reports
    /// none, what its load reserved.
    pub(crate) charged: u64,
    /// Tells this copy from any other of the same id (a draining copy and a fresh one).
    pub(crate) serial: u64,
    room: Arc<RoomSignal>,
    core: Weak<Core<M>>,
    runtime: Handle,
    span: tracing::Span,
    /// `Some` until `drop` hands it to the unload hook.
    model: Option<M>,
}

impl<M: Model> Resident<M> {
    pub(crate) fn new(
        id: ModelId,
        model: M,
        (size, charged): (Option<u64>, u64),
        load_time: std::time::Duration,
        tick: u64,
        core: &Core<M>,
    ) -> Self {
        // A model of unknown size weighs one MiB; a load of no measurable time costs 1 ms.
        let mib = size.map_or(1.0, |s| (s as f64 / (1u64 << 20) as f64).max(1.0 / 1024.0));
        Self {
            hits: AtomicU64::new(1),
            aged_at: AtomicU64::new(core.inflation().to_bits()),
            cost_per_mib: load_time.as_secs_f64().max(0.001) / mib,
            load_time,
            id,
            size,
            charged,
            serial: core.next_serial(),
            model: Some(model),
            in_use: AtomicUsize::new(0),
            last_used_tick: AtomicU64::new(tick),
            idle_since: AtomicU64::new(crate::coarse_clock::ticks()),
            pinned: AtomicBool::new(false),
            evicted_for: AtomicU8::new(0),
            room: core.room.clone(),
            core: core.weak_self.clone(),
            runtime: core.runtime.clone(),
            span: core.span.clone(),
        }
    }

    /// Neither in use nor pinned: a candidate for eviction.
    pub(crate) fn is_idle(&self) -> bool {
        self.in_use.load(Ordering::SeqCst) == 0 && !self.pinned.load(Ordering::Relaxed)
    }

    /// GDSF priority: `L` at the last access plus frequency times reload cost per byte. The
    /// lowest is evicted first.
    pub(crate) fn gdsf_priority(&self) -> f64 {
        f64::from_bits(self.aged_at.load(Ordering::Relaxed))
            + self.hits.load(Ordering::Relaxed) as f64 * self.cost_per_mib
    }

    /// How long ago the model was last used: zero while it is in use.
    pub(crate) fn idle_for(&self) -> std::time::Duration {
        if self.in_use.load(Ordering::Relaxed) > 0 {
            return std::time::Duration::ZERO;
        }
        crate::coarse_clock::since(self.idle_since.load(Ordering::Relaxed))
    }

    /// Records when the model became idle, by the [coarse clock](crate::coarse_clock): precise
    /// enough to tell people how long a model sat idle.
    fn mark_idle(&self) {
        self.idle_since
            .store(crate::coarse_clock::ticks(), Ordering::Relaxed);
    }
}

impl<M: Model> Drop for Resident<M> {
    fn drop(&mut self) {
        let Some(model) = self.model.take() else {
            return;
        };
        let copy = CopyId {
            id: self.id.clone(),
            serial: self.serial,
            why: EvictReason::from_code(self.evicted_for.load(Ordering::Relaxed)),
        };
        // If the runtime is already shut down the task is dropped unrun, and so is the model:
        // its `Drop` is the fallback.
        let unload = unload(self.core.clone(), copy, model).instrument(self.span.clone());
        drop(self.runtime.spawn(unload));
    }
}

/// Which copy of a model an unload is for.
pub(crate) struct CopyId {
    pub(crate) id: ModelId,
    pub(crate) serial: u64,
    /// Why it is unloaded (`None`: it was loaded but refused, never served).
    pub(crate) why: Option<EvictReason>,
}

async fn unload<M: Model>(core: Weak<Core<M>>, copy: CopyId, model: M) {
    let id = copy.id.clone();
    let reason = copy
        .why
        .map_or("refused after loading", EvictReason::as_str);
    tracing::info!(model_id = %id, reason, "Unloading model '{id}'.");
    let start = Instant::now();
    let limit = core.upgrade().and_then(|c| c.config.unload_timeout);
    // The hook is called inside the guarded future, so a panic while building it is caught too.
    // Formatting the error is user code too (its `Display`), so it happens inside the guard.
    let hook = AssertUnwindSafe(async move { model.unload().await.map_err(|e| e.to_string()) })
        .catch_unwind();
    // A hook that hangs must not hold the model's capacity forever: past the limit it is
    // dropped (and the model with it) and the capacity is released.
    let outcome = match limit {
        Some(limit) => tokio::time::timeout(limit, hook).await.map_err(|_| limit),
        None => Ok(hook.await),
    };
    let elapsed = start.elapsed();
    let error = match outcome {
        Ok(Ok(Ok(()))) => None,
        Ok(Ok(Err(e))) => Some(e),
        Ok(Err(panic)) => Some(format!("unload hook panicked: {}", panic_message(&*panic))),
        Err(limit) => Some(format!(
            "unload hook did not finish within {limit:?}; it was dropped and the model's \
             capacity released"
        )),
    };
    match &error {
        None => tracing::info!(
            model_id = %id,
            duration_ms = crate::metrics::rounded_ms(elapsed),
            "Unloaded model '{id}' in {:.1}ms.",
            elapsed.as_secs_f64() * 1e3
        ),
        Some(e) => tracing::warn!(model_id = %id, error = %e, "Unloading model '{id}' failed: {e}"),
    }
    if let Some(core) = core.upgrade() {
        core.finish_unload(copy, elapsed, error);
    }
}

/// A loaded model, pinned against unloading for as long as this guard (or a clone) lives.
///
/// Dereferences to the model. Eviction can take the model out of the cache while a guard is
/// alive (new requests then load a fresh copy), but the model's unload hook runs only after
/// the last guard is dropped.
pub struct ModelGuard<M: Model> {
    resident: Arc<Resident<M>>,
}

impl<M: Model> ModelGuard<M> {
    /// Pins `resident` (the caller must hold it through the index or another guard).
    pub(crate) fn pin(resident: Arc<Resident<M>>) -> Self {
        resident.in_use.fetch_add(1, Ordering::SeqCst);
        Self { resident }
    }

    /// The model's id.
    pub fn id(&self) -> &ModelId {
        &self.resident.id
    }

    /// The model's reported size in bytes, if it reports one.
    pub fn size_bytes(&self) -> Option<u64> {
        self.resident.size
    }

    pub(crate) fn resident(&self) -> &Arc<Resident<M>> {
        &self.resident
    }
}

impl<M: Model> Deref for ModelGuard<M> {
    type Target = M;
    fn deref(&self) -> &M {
        self.resident
            .model
            .as_ref()
            .expect("a resident keeps its model until its last reference is dropped")
    }
}

impl<M: Model> Clone for ModelGuard<M> {
    fn clone(&self) -> Self {
        Self::pin(self.resident.clone())
    }
}

impl<M: Model> Drop for ModelGuard<M> {
    fn drop(&mut self) {
        if self.resident.in_use.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.resident.mark_idle();
            // The model just became idle: a load waiting for room may now evict it.
            self.resident.room.wake_if_waiting();
        }
    }
}

/// Shows the id and size, not the model (models are rarely `Debug`, and weights are long).
impl<M: Model> fmt::Debug for ModelGuard<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelGuard")
            .field("id", &self.resident.id)
            .field("size_bytes", &self.resident.size)
            .finish_non_exhaustive()
    }
}
