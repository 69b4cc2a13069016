//! The miss path: single-flight loads, failure memory, admission into the index.
//!
//! Every load runs on its own task, so a caller that gives up (a client disconnects) does not
//! cancel a load that has started: the others waiting on the same id still get the result, and
//! the model stays warm. A load that has not started yet (it waits for a load turn) is dropped
//! once nobody waits for it any more, so abandoned requests cost no loads; and the queue of
//! loads waiting for a turn is bounded, in length (`max_queued_loads`) and in time
//! (`capacity_timeout`).
//! Whatever way a load ends (success, error, panic, timeout, abort), a [`LoadTicket`] makes
//! sure its reservation is released and its `Loading` advertisement is retracted.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::FutureExt;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio::time::Instant;
use tracing::Instrument;

use crate::core::{Core, State};
use crate::error::panic_message;
use crate::events::ModelEventKind;
use crate::guard::{ModelGuard, Resident};
use crate::metrics::Metrics;
use crate::model::BoxFuture;
use crate::{BoxError, Error, Model, ModelId};

type Outcome<M> = Result<ModelGuard<M>, Error>;
type LoadSender<M> = watch::Sender<Option<Outcome<M>>>;
type LoadReceiver<M> = watch::Receiver<Option<Outcome<M>>>;

/// A load in progress, shared by everyone asking for its id.
pub(crate) struct LoadSlot<M: Model> {
    /// Its result, when there is one; every waiter holds one receiver, so the receiver count
    /// says whether anyone still waits.
    tx: Arc<LoadSender<M>>,
    /// Set just after the task is spawned (outside the lock); `None` for that instant.
    pub(crate) task: Option<AbortHandle>,
    /// It has its turn and its room: it counts against the caps (until then it is queued).
    pub(crate) started: bool,
    /// Tells this load from a later one for the same id.
    generation: u64,
}

/// A remembered load failure (the negative cache).
pub(crate) struct Failure {
    error: Arc<Error>,
    /// Consecutive failures; the backoff doubles with each.
    attempts: u32,
    until: Instant,
}

/// Failures remembered at most (the oldest are forgotten first): ids are the client's choice.
pub(crate) const MAX_REMEMBERED_FAILURES: usize = 4096;

impl<M: Model> Core<M> {
    /// A get that missed the index: join the load in progress, or start one.
    pub(crate) async fn get_slow(self: &Arc<Self>, id: &str) -> Result<ModelGuard<M>, Error> {
        let id = ModelId::new(id)?;
        let (mut rx, start) = {
            let mut st = self.state.lock();
            // A load may have finished since the lock-free look.
            if let Some(guard) = self.hit(&id) {
                return Ok(guard);
            }
            if st.shutting_down {
                return Err(Error::ShuttingDown);
            }
            self.metrics.misses.inc();
            match st.loading.get(&id) {
                Some(slot) => (slot.tx.subscribe(), None),
                None => {
                    if let Some(err) = self.backing_off(&st, &id) {
                        Metrics::add(&self.metrics.backoff_rejections);
                        return Err(err);
                    }
                    let (rx, tx, generation) = self.register_load(&mut st, &id);
                    (rx, Some((tx, generation)))
                }
            }
        };
        if let Some((tx, generation)) = start {
            self.spawn_load(id.clone(), tx, generation);
        }
        let outcome = match rx.wait_for(Option::is_some).await {
            Ok(value) => value.clone().expect("waited for Some"),
            // The load task ended without a word: it was aborted.
            Err(_) if self.state.lock().shutting_down => Err(Error::ShuttingDown),
            Err(_) => Err(Error::LoadCancelled { id }),
        };
        if let Ok(guard) = &outcome {
            self.touch(guard.resident());
        }
        outcome
    }

    fn backing_off(&self, st: &State<M>, id: &ModelId) -> Option<Error> {
        let failure = st.failures.get(id)?;
        let retry_after = failure.until.checked_duration_since(Instant::now())?;
        if retry_after.is_zero() {
            return None;
        }
        Some(Error::BackingOff {
            id: id.clone(),
            retry_after,
            cause: failure.error.clone(),
        })
    }

    /// Advertises a new load and makes its slot; the caller spawns it after unlocking.
    fn register_load(
        &self,
        st: &mut State<M>,
        id: &ModelId,
    ) -> (LoadReceiver<M>, Arc<LoadSender<M>>, u64) {
        let (tx, rx) = watch::channel(None);
        let tx = Arc::new(tx);
        self.emit(st, id, ModelEventKind::Loading);
        let generation = self.next_tick();
        let slot = LoadSlot {
            tx: tx.clone(),
            task: None,
            started: false,
            generation,
        };
        st.loading.insert(id.clone(), slot);
        (rx, tx, generation)
    }

    /// Spawns the load. Called without the state lock: the ticket exists before the task, so
    /// if the task is dropped unpolled (aborted at once, or its runtime is gone) the ticket's
    /// `Drop` still cleans up, and that takes the lock.
    fn spawn_load(self: &Arc<Self>, id: ModelId, tx: Arc<LoadSender<M>>, generation: u64) {
        let ticket = LoadTicket {
            core: self.clone(),
            id: id.clone(),
            reserved: None,
            open: true,
        };
        // The load logs in the span of the request that started it (its replica, request id).
        let load = Self::run_load(ticket, tx).instrument(tracing::Span::current());
        let task = self.runtime.spawn(load);
        let mut st = self.state.lock();
        match st.loading.get_mut(&id) {
            Some(slot) if slot.generation == generation => slot.task = Some(task.abort_handle()),
            // Already finished (or shut down before we got here).
            _ => {}
        }
        if st.shutting_down {
            task.abort();
        }
    }

    async fn run_load(mut ticket: LoadTicket<M>, tx: Arc<LoadSender<M>>) {
        let core = ticket.core.clone();
        let id = ticket.id.clone();
        let outcome = core.load_and_admit(&mut ticket, &tx).await;
        let over_caps = matches!(outcome, Ok((_, true)));
        // Nobody may wait any more; the model stays warm regardless.
        tx.send_replace(Some(outcome.map(|(guard, _)| guard)));
        drop(tx);
        if over_caps {
            // The model turned out larger than its reservation: evict idle models to get back
            // under the caps, waiting for ones in use to become idle.
            let deadline = Instant::now() + core.config.capacity_timeout;
            if let Err(e) = core.reserve(&id, 0, 0, deadline).await {
                tracing::warn!(model_id = %id, error = %e, "model '{id}' is larger than its reservation and the caps stay exceeded");
            }
        }
    }

    /// Probes, reserves room, runs the loader, and admits the model. `Ok((guard, over_caps))`.
    async fn load_and_admit(
        &self,
        ticket: &mut LoadTicket<M>,
        tx: &LoadSender<M>,
    ) -> Result<(ModelGuard<M>, bool), Error> {
        let id = &ticket.id.clone();
        let size = match self
            .call_user(id, self.loader.probe_boxed(id.clone()))
            .await
        {
            Ok(size) => size,
            Err(e) => return Err(ticket.fail(e)),
        };
        if let (Some(size), Some(max_bytes)) = (size, self.caps.bytes())
            && size > max_bytes
        {
            return Err(ticket.fail(Error::ModelTooLarge {
                id: id.clone(),
                size,
                max_bytes,
            }));
        }
        let estimate = self.estimate(size);
        // The permit first, then the room: a load waiting its turn needs no memory yet, so it
        // must not hold a slot (or evict a model) while other loads run.
        let permit = self.load_turn(ticket, tx).await?;
        let deadline = Instant::now() + self.config.capacity_timeout;
        if let Err(e) = self.reserve(id, 1, estimate, deadline).await {
            return Err(ticket.fail(e));
        }
        ticket.reserved = Some(estimate);
        // Room may have taken a while: if everyone left meanwhile, load nothing.
        if let Some(e) = self.cancel_if_abandoned(ticket, tx) {
            return Err(e);
        }
        if let Some(slot) = self.state.lock().loading.get_mut(id) {
            slot.started = true;
        }
        Metrics::add(&self.metrics.loads);
        tracing::info!(model_id = %id, "Loading model '{id}'.");
        let start = Instant::now();
        let loaded = self.call_user(id, self.loader.load_boxed(id.clone())).await;
        drop(permit);
        match loaded {
            Ok(model) => self.admit(ticket, model, start.elapsed()),
            Err(e) => Err(ticket.fail(e)),
        }
    }

    /// What a load reserves: the probed size; else, under a byte cap, the largest charge of
    /// any model admitted so far, or the whole cap for the first (so loads of unknown size
    /// never overcommit it; the charge is settled when the model reports its size).
    fn estimate(&self, probed: Option<u64>) -> u64 {
        match (probed, self.caps.bytes()) {
            (Some(size), _) => size,
            (None, Some(max_bytes)) => match self.largest_charge.load(Ordering::Relaxed) {
                0 => max_bytes,
                largest => largest.min(max_bytes),
            },
            (None, None) => self.mean_loaded_size(),
        }
    }

    /// Waits for one of the `max_concurrent_loads` turns: refused at once when
    /// `max_queued_loads` loads already wait, given up after `capacity_timeout`, and dropped as
    /// soon as nobody waits for the load any more.
    async fn load_turn<'a>(
        &'a self,
        ticket: &mut LoadTicket<M>,
        tx: &LoadSender<M>,
    ) -> Result<tokio::sync::SemaphorePermit<'a>, Error> {
        if let Ok(permit) = self.load_permits.try_acquire() {
            return Ok(permit);
        }
        let queued = QueuedLoad::enter(&self.queued_loads);
        let id = ticket.id.clone();
        let busy = |queued: usize| Error::LoadsBusy {
            id: id.clone(),
            queued,
            max_concurrent_loads: self.config.max_concurrent_loads,
        };
        if queued.position >= self.config.max_queued_loads {
            let error = busy(queued.position);
            return Err(ticket.fail(error));
        }
        let deadline = Instant::now() + self.config.capacity_timeout;
        loop {
            tokio::select! {
                permit = self.load_permits.acquire() => {
                    return Ok(permit.expect("the load semaphore is never closed"));
                }
                () = tx.closed() => {
                    if let Some(e) = self.cancel_if_abandoned(ticket, tx) {
                        return Err(e);
                    }
                    // Someone joined just then: keep waiting (for a while, so a join that
                    // keeps racing the check cannot spin).
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                () = tokio::time::sleep_until(deadline) => {
                    let error = busy(self.queued_loads.load(Ordering::Relaxed));
                    return Err(ticket.fail(error));
                }
            }
        }
    }

    /// Ends a load nobody waits for any more, before it calls the loader: its reservation is
    /// released and its `Loading` retracted, and no failure is remembered. `None` if someone
    /// still waits (checked under the state lock, which every joiner holds to join).
    fn cancel_if_abandoned(&self, ticket: &mut LoadTicket<M>, tx: &LoadSender<M>) -> Option<Error> {
        let error = {
            let mut st = self.state.lock();
            if tx.receiver_count() > 0 {
                return None;
            }
            ticket.open = false;
            if let Some(bytes) = ticket.reserved.take() {
                st.used_slots -= 1;
                st.used_bytes -= bytes;
            }
            st.loading.remove(&ticket.id);
            let error = Error::LoadCancelled {
                id: ticket.id.clone(),
            };
            self.emit(
                &mut st,
                &ticket.id,
                ModelEventKind::Failed {
                    error: error.clone(),
                },
            );
            error
        };
        Metrics::add(&self.metrics.loads_abandoned);
        self.room.wake();
        tracing::debug!(model_id = %ticket.id, "load dropped: nobody waits for it any more");
        Some(error)
    }

    /// Runs a user future (probe or load) with the load timeout, turning its error, panic or
    /// timeout into an [`Error`].
    async fn call_user<T>(
        &self,
        id: &ModelId,
        fut: BoxFuture<'_, Result<T, BoxError>>,
    ) -> Result<T, Error> {
        let fut = AssertUnwindSafe(fut).catch_unwind();
        let finished = match self.config.load_timeout {
            Some(limit) => tokio::time::timeout(limit, fut).await.ok(),
            None => Some(fut.await),
        };
        match finished {
            Some(Ok(Ok(value))) => Ok(value),
            Some(Ok(Err(source))) => Err(Error::LoadFailed {
                id: id.clone(),
                source: Arc::from(source),
            }),
            Some(Err(panic)) => Err(Error::LoadPanicked {
                id: id.clone(),
                message: panic_message(&*panic),
            }),
            None => Err(Error::LoadTimeout {
                id: id.clone(),
                after: self.config.load_timeout.unwrap_or_default(),
            }),
        }
    }

    /// Puts a freshly loaded model into the index (or refuses it, and drains it at once).
    fn admit(
        &self,
        ticket: &mut LoadTicket<M>,
        model: M,
        took: Duration,
    ) -> Result<(ModelGuard<M>, bool), Error> {
        let id = &ticket.id.clone();
        // User code: a panic here must not leave the reservation behind.
        let reported = std::panic::catch_unwind(AssertUnwindSafe(|| model.size_bytes()));
        let estimate = ticket.reserved.take().unwrap_or(0);
        ticket.open = false;
        let (reported_size, size_panic) = match reported {
            Ok(size) => (size, None),
            Err(panic) => (None, Some(panic_message(&*panic))),
        };
        if reported_size.is_none() && self.caps.bytes().is_some() {
            tracing::warn!(model_id = %id, charged = estimate, "model '{id}' reports no size (Model::size_bytes): it is charged its reservation of {estimate} bytes against max_bytes");
        }
        let charged = reported_size.unwrap_or(estimate);
        self.largest_charge.fetch_max(charged, Ordering::Relaxed);
        let resident = Arc::new(Resident::new(
            id.clone(),
            model,
            (reported_size, charged),
            took,
            self.next_tick(),
            self,
        ));
        let size = charged;

        let mut st = self.state.lock();
        st.loading.remove(id);
        st.used_bytes = st.used_bytes - estimate + size;
        let refusal = match self.caps.bytes() {
            _ if size_panic.is_some() => Some(Error::LoadPanicked {
                id: id.clone(),
                message: format!("size_bytes() panicked: {}", size_panic.unwrap_or_default()),
            }),
            _ if st.shutting_down => Some(Error::ShuttingDown),
            Some(max_bytes) if size > max_bytes => Some(Error::ModelTooLarge {
                id: id.clone(),
                size,
                max_bytes,
            }),
            _ => None,
        };
        if let Some(error) = refusal {
            // It was loaded, so it must be unloaded: count it as draining, then let it go.
            self.drain_unadmitted(&mut st, &resident);
            self.record_failure(&mut st, id, &error);
            drop(st);
            drop(resident);
            self.room.wake();
            return Err(error);
        }
        st.failures.remove(id);
        let guard = ModelGuard::pin(resident.clone());
        self.index_insert(&mut st, id.clone(), resident);
        self.emit(
            &mut st,
            id,
            ModelEventKind::Loaded {
                size_bytes: guard.size_bytes(),
                load_time: took,
            },
        );
        let over_caps = !self.fits(st.used_slots, st.used_bytes);
        drop(st);
        // The model may be smaller than its reservation: a waiting load may fit now.
        self.room.wake();
        self.metrics.load_duration.observe(took);
        tracing::info!(
            model_id = %id,
            duration_ms = crate::metrics::rounded_ms(took),
            size_bytes = guard.size_bytes(),
            "Loaded model '{id}' in {:.1}ms.",
            took.as_secs_f64() * 1e3
        );
        Ok((guard, over_caps))
    }

    /// Releases a failed load's reservation, retracts its advertisement, remembers the failure.
    fn fail_load(&self, id: &ModelId, reserved: Option<u64>, error: &Error) {
        {
            let mut st = self.state.lock();
            if let Some(bytes) = reserved {
                st.used_slots -= 1;
                st.used_bytes -= bytes;
            }
            st.loading.remove(id);
            self.record_failure(&mut st, id, error);
        }
        self.room.wake();
        tracing::warn!(model_id = %id, error_type = error.error_type(), "{error}");
    }

    /// Counts a failure, remembers it if it is the model's fault, and publishes it.
    fn record_failure(&self, st: &mut State<M>, id: &ModelId, error: &Error) {
        match error {
            Error::CapacityExhausted { .. } => Metrics::add(&self.metrics.capacity_exhausted),
            e if e.is_model_failure() => Metrics::add(&self.metrics.load_failures),
            _ => {}
        }
        let base = self.config.failure_backoff;
        if error.is_model_failure() && !base.is_zero() {
            let now = Instant::now();
            let attempts = st
                .failures
                .get(id)
                .map_or(1, |f| f.attempts.saturating_add(1));
            let longest = self.config.max_failure_backoff.max(base);
            let backoff = base
                .saturating_mul(2u32.saturating_pow(attempts - 1))
                .min(longest);
            // Remembered past its backoff, so that failing again soon after counts as in a
            // row; forgotten a longest backoff later, or sooner once many ids have failed.
            st.failures.insert(
                id.clone(),
                Failure {
                    error: Arc::new(error.clone()),
                    attempts,
                    until: now + backoff,
                },
                now + backoff + longest,
                now,
            );
        }
        self.emit(
            st,
            id,
            ModelEventKind::Failed {
                error: error.clone(),
            },
        );
    }
}

/// Counts a load as waiting for a load turn while it lives.
struct QueuedLoad<'a> {
    count: &'a std::sync::atomic::AtomicUsize,
    position: usize,
}

impl<'a> QueuedLoad<'a> {
    fn enter(count: &'a std::sync::atomic::AtomicUsize) -> Self {
        let position = count.fetch_add(1, Ordering::SeqCst);
        Self { count, position }
    }
}

impl Drop for QueuedLoad<'_> {
    fn drop(&mut self) {
        self.count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Owns a load's cleanup: dropped while still open (the task was aborted, or its runtime shut
/// down), it releases the reservation and retracts the `Loading` advertisement.
struct LoadTicket<M: Model> {
    core: Arc<Core<M>>,
    id: ModelId,
    /// Bytes reserved (with one slot), once the reservation succeeded.
    reserved: Option<u64>,
    open: bool,
}

impl<M: Model> LoadTicket<M> {
    fn fail(&mut self, error: Error) -> Error {
        self.open = false;
        self.core.fail_load(&self.id, self.reserved.take(), &error);
        error
    }
}

impl<M: Model> Drop for LoadTicket<M> {
    fn drop(&mut self) {
        if self.open {
            let error = if self.core.state.lock().shutting_down {
                Error::ShuttingDown
            } else {
                Error::LoadCancelled {
                    id: self.id.clone(),
                }
            };
            self.fail(error);
        }
    }
}
