//! A replica's request slots: taking one (one CAS, no lock), giving it back, and giving it
//! back while a request waits for its model's load (and taking it back first once the load
//! is done). The router reads the counts through `ReplicaView`.

use std::sync::atomic::Ordering;

use modelmux_cache::ModelId;
use tokio::time::Instant;

use super::{ReplicaLedger, ReplicaView};

impl ReplicaLedger {
    /// Takes one request slot if the replica is available and below `max_ongoing` (one CAS,
    /// no lock), so concurrent dispatchers can never push a replica past its limit. Backs out
    /// if the replica was taken out of rotation meanwhile (a drain must not see 0 and then a
    /// request arrive).
    pub(crate) fn try_begin(&self) -> bool {
        if !self.is_available() || self.resuming.load(Ordering::SeqCst) > 0 {
            return false;
        }
        // Counted inside before the slot is taken, so a drain that saw the replica empty after
        // taking it out of rotation cannot miss a request that slips in: that one sees the
        // replica unavailable below and backs out.
        self.inside.fetch_add(1, Ordering::SeqCst);
        if !self.take() {
            self.inside.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        if !self.is_available() {
            self.finish();
            return false;
        }
        true
    }

    /// A request with a slot leaves the replica: its slot is released.
    pub(crate) fn finish(&self) {
        self.end();
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    fn take(&self) -> bool {
        let taken = self
            .ongoing
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max_ongoing).then_some(n + 1)
            });
        match taken {
            Ok(before) => {
                if before + 1 == self.max_ongoing && self.tracks_models {
                    // The clock is read only when a take fills the replica (and only where
                    // model ids steer routing, the one place it is asked).
                    let at = Instant::now().duration_since(self.born).as_nanos();
                    self.filled_at
                        .store(u64::try_from(at).unwrap_or(u64::MAX), Ordering::Relaxed);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Releases a slot; returns the number still in progress.
    fn end(&self) -> usize {
        let left = self.ongoing.fetch_sub(1, Ordering::SeqCst) - 1;
        if self.resuming.load(Ordering::SeqCst) > 0 {
            self.freed.notify_one();
        }
        left
    }

    /// Gives a request's slot back while it waits for its model's (`model`'s) load.
    pub(crate) fn suspend(&self, model: Option<&ModelId>) {
        if let Some(model) = model {
            *self
                .waiting_per_model
                .lock()
                .entry(model.clone())
                .or_default() += 1;
        }
        self.loading_waiters.fetch_add(1, Ordering::SeqCst);
        self.end();
    }

    /// A request for `model` stops waiting for its load (it resumed, or left).
    fn stop_waiting(&self, model: Option<&ModelId>) {
        if let Some(model) = model {
            let mut waiting = self.waiting_per_model.lock();
            if let Some(n) = waiting.get_mut(model) {
                *n -= 1;
                if *n == 0 {
                    waiting.remove(model);
                }
            }
        }
        self.loading_waiters.fetch_sub(1, Ordering::SeqCst);
    }

    /// Requests waiting for the load of `model` (their own) here.
    pub(crate) fn waiting_for(&self, model: &ModelId) -> usize {
        if self.loading_waiters.load(Ordering::SeqCst) == 0 {
            return 0;
        }
        self.waiting_per_model
            .lock()
            .get(model)
            .copied()
            .unwrap_or(0)
    }

    /// A request that gave its slot back for a load leaves the replica without taking it
    /// back.
    pub(crate) fn abandon_suspended(&self, model: Option<&ModelId>) {
        self.stop_waiting(model);
        self.inside.fetch_sub(1, Ordering::SeqCst);
    }

    /// Takes the slot back at once, even past `max_ongoing_requests` for a moment: for a
    /// request whose wait for a load was cancelled while the request itself goes on (or is
    /// being dropped, which releases the slot right after).
    pub(crate) fn force_resume(&self, model: Option<&ModelId>) {
        self.ongoing.fetch_add(1, Ordering::SeqCst);
        self.stop_waiting(model);
    }

    /// Takes a slot back for a request whose load is done, before any newcomer, waiting (on
    /// this replica, even one being drained: the request was admitted) until one frees.
    pub(crate) async fn resume(&self, model: Option<&ModelId>) {
        struct Resuming<'a>(&'a ReplicaLedger);
        impl Drop for Resuming<'_> {
            fn drop(&mut self) {
                self.0.resuming.fetch_sub(1, Ordering::SeqCst);
            }
        }
        self.resuming.fetch_add(1, Ordering::SeqCst);
        let _resuming = Resuming(self);
        loop {
            let freed = self.freed.notified();
            let mut freed = std::pin::pin!(freed);
            freed.as_mut().enable();
            if self.take() {
                self.stop_waiting(model);
                return;
            }
            freed.await;
        }
    }

    /// Requests inside the replica, with a slot or waiting for a load without one.
    pub(crate) fn inside(&self) -> usize {
        self.inside.load(Ordering::SeqCst)
    }

    /// Requests waiting for their model's load without a slot.
    pub(crate) fn loading_waiters(&self) -> usize {
        self.loading_waiters.load(Ordering::SeqCst)
    }
}
