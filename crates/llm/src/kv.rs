//! Key/value caches: one per sequence, with its own positions, and the byte budget they are
//! reserved from. A sequence reserves the most it can use (prompt + max tokens) when it is
//! admitted, so a running sequence can never run out of KV memory mid-generation; the memory
//! itself is allocated as the sequence grows, never beyond the reservation.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::gguf::LlamaConfig;

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

/// One sequence's keys and values in every layer, `len` tokens long.
pub struct KvCache {
    layers: Vec<LayerKv>,
    len: usize,
    max_tokens: usize,
    kv_dim: usize,
    _reservation: Option<KvReservation>,
}

struct LayerKv {
    keys: Vec<f32>,
    values: Vec<f32>,
}

impl KvCache {
    /// An empty cache for at most `max_tokens` tokens of a model shaped `config`, holding
    /// `reservation` (if any) for as long as it lives.
    pub fn new(
        config: &LlamaConfig,
        max_tokens: usize,
        reservation: Option<KvReservation>,
    ) -> Self {
        Self::with_shape(config.n_layer, config.kv_dim(), max_tokens, reservation)
    }

    /// An empty cache of `n_layer` layers of `kv_dim` values per token.
    pub(crate) fn with_shape(
        n_layer: usize,
        kv_dim: usize,
        max_tokens: usize,
        reservation: Option<KvReservation>,
    ) -> Self {
        Self {
            layers: (0..n_layer)
                .map(|_| LayerKv {
                    keys: Vec::new(),
                    values: Vec::new(),
                })
                .collect(),
            len: 0,
            max_tokens,
            kv_dim,
            _reservation: reservation,
        }
    }

    /// A copy of this cache's tokens for another sequence (a choice of an `n > 1` request,
    /// which starts from the prompt computed once), holding `reservation_bytes` moved out of
    /// this cache's reservation.
    pub(crate) fn fork(&mut self, reservation_bytes: u64) -> KvCache {
        let reservation = self
            ._reservation
            .as_mut()
            .map(|r| r.split_off(reservation_bytes));
        KvCache {
            layers: self
                .layers
                .iter()
                .map(|l| LayerKv {
                    keys: l.keys.clone(),
                    values: l.values.clone(),
                })
                .collect(),
            len: self.len,
            max_tokens: self.max_tokens,
            kv_dim: self.kv_dim,
            _reservation: reservation,
        }
    }

    /// Layers.
    pub(crate) fn layer_count(&self) -> usize {
        self.layers.len()
    }

    /// Values per token in one layer's keys (and values).
    pub(crate) fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// Tokens cached.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing is cached yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The most tokens this cache may hold.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Bytes allocated now (never more than the reservation).
    pub fn allocated_bytes(&self) -> u64 {
        self.layers
            .iter()
            .map(|l| (l.keys.capacity() + l.values.capacity()) * std::mem::size_of::<f32>())
            .sum::<usize>() as u64
    }

    /// Appends `keys` and `values` (`n x kv_dim` each) of the tokens at positions
    /// `len..len + n` to `layer`. Every layer gets the same tokens in one step, then
    /// [`advance`](Self::advance) moves `len`.
    pub(crate) fn append(&mut self, layer: usize, keys: &[f32], values: &[f32]) {
        let max = self.max_tokens * self.kv_dim;
        let l = &mut self.layers[layer];
        debug_assert_eq!(l.keys.len(), self.len * self.kv_dim);
        let needed = l.keys.len() + keys.len();
        assert!(needed <= max, "KV cache grown past its reservation");
        if needed > l.keys.capacity() {
            // Double, within the reservation: amortised appends, bounded memory.
            let target = (l.keys.capacity() * 2)
                .max(needed)
                .max(64 * self.kv_dim)
                .min(max);
            l.keys.reserve_exact(target - l.keys.len());
            l.values.reserve_exact(target - l.values.len());
        }
        l.keys.extend_from_slice(keys);
        l.values.extend_from_slice(values);
    }

    /// Marks `n` more tokens as cached, after every layer got them.
    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// The keys and values of `layer` (after this step's append).
    pub(crate) fn layer(&self, layer: usize) -> (&[f32], &[f32]) {
        let l = &self.layers[layer];
        (&l.keys, &l.values)
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
