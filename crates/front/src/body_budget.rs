//! The server-wide budget of request-body bytes (`max_inflight_body_bytes`) and each client
//! address's share of it (`max_inflight_body_bytes_per_client`).
//!
//! A body's bytes are reserved as they arrive, never from its declared `Content-Length`: a
//! client that sends headers announcing 16 MiB and then nothing holds nothing. One address
//! may hold at most its share, so a single host sending large bodies slowly cannot spend the
//! budget every other client needs. The shares' map has an entry only for an address that
//! holds bytes now: at most one per open connection.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use parking_lot::Mutex;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use modelmux_serve::ServeError;

/// The address a request came from, put in its extensions by its connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ClientAddr(pub(crate) IpAddr);

/// Request bodies held, in KiB permits, and who holds them.
pub(crate) struct BodyBudget {
    permits: Arc<Semaphore>,
    total_bytes: usize,
    per_client_kib: u32,
    per_client_bytes: usize,
    /// KiB held per client address, only while more than zero.
    held: Mutex<HashMap<IpAddr, u32>>,
}

impl BodyBudget {
    pub(crate) fn new(total_bytes: usize, per_client_bytes: usize) -> Arc<Self> {
        let kib = total_bytes.div_ceil(1024).min(Semaphore::MAX_PERMITS);
        Arc::new(Self {
            permits: Arc::new(Semaphore::new(kib)),
            total_bytes,
            per_client_kib: u32::try_from(per_client_bytes.div_ceil(1024)).unwrap_or(u32::MAX),
            per_client_bytes,
            held: Mutex::new(HashMap::new()),
        })
    }

    /// KiB held by `client` now (0 when it holds none).
    #[cfg(test)]
    fn held_by(&self, client: IpAddr) -> u32 {
        let held = self.held.lock();
        held.get(&client).copied().unwrap_or(0)
    }

    /// Takes `kib` more for `client`, or says why not.
    fn take(&self, client: IpAddr, kib: u32) -> Result<OwnedSemaphorePermit, ServeError> {
        {
            let mut held = self.held.lock();
            let mine = held.entry(client).or_insert(0);
            if mine.saturating_add(kib) > self.per_client_kib {
                if *mine == 0 {
                    held.remove(&client);
                }
                return Err(ServeError::ServerOverloaded {
                    message: format!(
                        "request bodies from this client already hold its share of the \
                         server's body budget ({} bytes); try again shortly",
                        self.per_client_bytes
                    ),
                });
            }
            *mine += kib;
        }
        self.permits
            .clone()
            .try_acquire_many_owned(kib)
            .map_err(|_| {
                self.give_back(client, kib);
                ServeError::ServerOverloaded {
                    message: format!(
                        "request bodies in progress already hold the server's budget of {} \
                         bytes; try again shortly",
                        self.total_bytes
                    ),
                }
            })
    }

    fn give_back(&self, client: IpAddr, kib: u32) {
        let mut held = self.held.lock();
        if let Some(mine) = held.get_mut(&client) {
            *mine = mine.saturating_sub(kib);
            if *mine == 0 {
                held.remove(&client);
            }
        }
    }
}

/// The bytes of one body taken from the budget, given back when it drops.
pub(crate) struct BodyReservation {
    budget: Arc<BodyBudget>,
    client: IpAddr,
    held: Option<OwnedSemaphorePermit>,
}

impl BodyReservation {
    pub(crate) fn new(budget: &Arc<BodyBudget>, client: IpAddr) -> Self {
        Self {
            budget: budget.clone(),
            client,
            held: None,
        }
    }

    /// Grows the reservation to cover `bytes`, or refuses: the budget, or this client's share
    /// of it, is spent.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<(), ServeError> {
        let want = u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX);
        let have = self.held.as_ref().map_or(0, |p| p.num_permits() as u32);
        if want <= have {
            return Ok(());
        }
        let more = self.budget.take(self.client, want - have)?;
        match &mut self.held {
            Some(held) => held.merge(more),
            None => self.held = Some(more),
        }
        Ok(())
    }
}

impl Drop for BodyReservation {
    fn drop(&mut self) {
        if let Some(held) = self.held.take() {
            self.budget
                .give_back(self.client, held.num_permits() as u32);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));
    const B: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 2));

    #[test]
    fn one_client_holds_at_most_its_share_and_gives_it_back() {
        let budget = BodyBudget::new(64 << 10, 32 << 10);
        let mut a = BodyReservation::new(&budget, A);
        a.reserve(20 << 10).unwrap();
        let mut a2 = BodyReservation::new(&budget, A);
        let refused = a2.reserve(20 << 10).unwrap_err();
        assert!(refused.to_string().contains("share"), "{refused}");
        assert_eq!(budget.held_by(A), 20, "a refusal takes nothing");
        // Another client still gets the rest of the budget.
        let mut b = BodyReservation::new(&budget, B);
        b.reserve(32 << 10).unwrap();
        drop(a);
        assert_eq!(budget.held_by(A), 0);
        assert!(budget.held.lock().get(&A).is_none(), "no entry left");
        a2.reserve(20 << 10).unwrap();
        drop((a2, b));
        assert!(budget.held.lock().is_empty());
        assert_eq!(budget.permits.available_permits(), 64);
    }

    #[test]
    fn the_whole_budget_refuses_past_it_whoever_asks() {
        let budget = BodyBudget::new(64 << 10, 64 << 10);
        let mut a = BodyReservation::new(&budget, A);
        a.reserve(40 << 10).unwrap();
        let mut b = BodyReservation::new(&budget, B);
        let refused = b.reserve(40 << 10).unwrap_err();
        assert!(refused.to_string().contains("server's budget"), "{refused}");
        assert_eq!(budget.held_by(B), 0, "the refused share is given back");
        // Growing in steps counts only the growth.
        a.reserve(50 << 10).unwrap();
        assert_eq!(budget.held_by(A), 50);
    }
}
