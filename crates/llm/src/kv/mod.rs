//! Key/value caches: one per sequence, with its own positions (`cache.rs`), stored as f32
//! or binary16 (`rows.rs`), and the byte budget they are reserved from (here). A sequence
//! reserves the most it can use (prompt + max tokens) when it is admitted, so a running
//! sequence can never run out of KV memory mid-generation; the memory itself is allocated as
//! the sequence grows, never beyond the reservation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

mod cache;
mod rows;

pub use cache::KvCache;
pub(crate) use cache::{KvHead, KvLayer, LayerRows};
pub use rows::KvDtype;

/// The KV memory of one engine: a byte budget that sequences reserve from.
#[derive(Clone, Debug)]
pub struct KvBudget {
    inner: Arc<BudgetInner>,
}

#[derive(Debug)]
struct BudgetInner {
    capacity: u64,
    reserved: AtomicU64,
}

impl KvBudget {
    /// A budget of `capacity` bytes.
    pub fn new(capacity: u64) -> Self {
        Self {
            inner: Arc::new(BudgetInner {
                capacity,
                reserved: AtomicU64::new(0),
            }),
        }
    }

    /// The budget in bytes.
    pub fn capacity(&self) -> u64 {
        self.inner.capacity
    }

    /// Bytes reserved by live sequences.
    pub fn reserved(&self) -> u64 {
        self.inner.reserved.load(Ordering::Acquire)
    }

    /// Reserves `bytes`, or returns `None` when they do not fit.
    pub fn try_reserve(&self, bytes: u64) -> Option<KvReservation> {
        let mut current = self.inner.reserved.load(Ordering::Acquire);
        loop {
            let next = current.checked_add(bytes)?;
            if next > self.inner.capacity {
                return None;
            }
            match self.inner.reserved.compare_exchange_weak(
                current,
                next,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => {
                    return Some(KvReservation {
                        budget: self.inner.clone(),
                        bytes,
                    });
                }
                Err(seen) => current = seen,
            }
        }
    }
}

/// Bytes reserved from a [`KvBudget`], given back when dropped.
#[derive(Debug)]
pub struct KvReservation {
    budget: Arc<BudgetInner>,
    bytes: u64,
}

impl KvReservation {
    /// The bytes reserved.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Moves `bytes` of this reservation into a new one (at most what it holds).
    pub(crate) fn split_off(&mut self, bytes: u64) -> KvReservation {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        KvReservation {
            budget: self.budget.clone(),
            bytes,
        }
    }
}

impl Drop for KvReservation {
    fn drop(&mut self) {
        self.budget.reserved.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_bounded_and_returned() {
        let budget = KvBudget::new(100);
        let a = budget.try_reserve(60).unwrap();
        assert!(budget.try_reserve(41).is_none());
        let b = budget.try_reserve(40).unwrap();
        assert_eq!(budget.reserved(), 100);
        drop(a);
        assert_eq!(budget.reserved(), 40);
        drop(b);
        assert_eq!(budget.reserved(), 0);
        assert!(budget.try_reserve(u64::MAX).is_none());
    }

    #[test]
    fn concurrent_reservations_never_exceed_the_budget() {
        let budget = KvBudget::new(1_000);
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let budget = budget.clone();
                std::thread::spawn(move || {
                    for _ in 0..10_000 {
                        if let Some(r) = budget.try_reserve(300) {
                            assert!(budget.reserved() <= 1_000);
                            drop(r);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(budget.reserved(), 0);
    }
}
