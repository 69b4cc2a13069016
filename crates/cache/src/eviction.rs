//! The order idle models are evicted in: least recently used first (LRU), or lowest
//! priority first (GDSF).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::guard::Resident;
use crate::index::Snapshot;
use crate::{EvictionPolicy, Model};

/// The models that may be evicted (idle: unused and unpinned), first to go first; ties
/// (GDSF priorities are often equal) go to the older copy, so the order never depends on
/// the index's hashing. Lazy, for a load usually needs one victim: the first is found by one
/// pass over the index, without allocating; only a second one builds a heap of the rest.
pub(crate) fn order<M: Model>(
    policy: EvictionPolicy,
    index: &Snapshot<M>,
) -> impl Iterator<Item = &Arc<Resident<M>>> {
    let key = move |r: &Arc<Resident<M>>| {
        let rank = match policy {
            EvictionPolicy::Lru => r.last_used_tick.load(Ordering::Relaxed),
            EvictionPolicy::Gdsf => ordered_bits(r.gdsf_priority()),
        };
        (rank, r.serial)
    };
    let idle = move || index.values().filter(|r| r.is_idle());
    let mut first: Option<&Arc<Resident<M>>> = None;
    let mut rest: Option<BinaryHeap<Reverse<EvictionKey<'_, M>>>> = None;
    std::iter::from_fn(move || {
        let Some(first) = first else {
            let found = idle().min_by_key(|r| key(r))?;
            first = Some(found);
            return Some(found);
        };
        let heap = rest.get_or_insert_with(|| {
            let mut heap = BinaryHeap::with_capacity(index.len());
            heap.extend(idle().filter(|r| !Arc::ptr_eq(r, first)).map(|r| {
                Reverse(EvictionKey {
                    key: key(r),
                    resident: r,
                })
            }));
            heap
        });
        heap.pop().map(|Reverse(k)| k.resident)
    })
}

/// `x`'s bits, mapped so that integer order is [`f64::total_cmp`]'s order.
fn ordered_bits(x: f64) -> u64 {
    let bits = x.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// An idle model's place in the eviction order: its rank (lower goes first: the LRU tick, or
/// the GDSF priority's [ordered bits](ordered_bits)), then its serial (unique per copy).
struct EvictionKey<'a, M: Model> {
    key: (u64, u64),
    resident: &'a Arc<Resident<M>>,
}

impl<M: Model> PartialEq for EvictionKey<'_, M> {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl<M: Model> Eq for EvictionKey<'_, M> {}

impl<M: Model> PartialOrd for EvictionKey<'_, M> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl<M: Model> Ord for EvictionKey<'_, M> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

#[cfg(test)]
mod tests {
    use super::ordered_bits;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn ordered_bits_order_as_total_cmp(a in any::<f64>(), b in any::<f64>()) {
            prop_assert_eq!(ordered_bits(a).cmp(&ordered_bits(b)), a.total_cmp(&b));
        }
    }
}
