//! A map that forgets: each entry until a time of its own, and the oldest first once it holds
//! its cap. For what clients can grow with ids of their choosing (the failures remembered per
//! model id): a flood of distinct unknown ids leaves at most `cap` entries behind, and the
//! pruning costs O(1) amortised per insert, never a scan of the whole map under a lock.

use std::collections::{HashMap, VecDeque};
use std::hash::Hash;
use tokio::time::Instant;

/// A map of at most `cap` entries, each forgotten at its own time (`T`: an instant of
/// `std` or of tokio, whose time tests can pause).
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// use modelmux_cache::ExpiringMap;
///
/// let now = Instant::now();
/// let mut m = ExpiringMap::new(2);
/// m.insert("a", 1, now + Duration::from_secs(60), now);
/// m.insert("b", 2, now + Duration::from_secs(60), now);
/// m.insert("c", 3, now + Duration::from_secs(60), now);
/// assert_eq!(m.len(), 2);
/// assert_eq!(m.get(&"a"), None, "the oldest went first");
/// assert_eq!(m.get(&"c"), Some(&3));
/// ```
#[derive(Debug)]
pub struct ExpiringMap<K, V, T = Instant> {
    entries: HashMap<K, (V, T, u64)>,
    /// Keys in the order they were inserted, each with the insertion's number: an entry whose
    /// key was inserted again since is stale, and skipped when it comes up.
    order: VecDeque<(K, u64)>,
    inserted: u64,
    cap: usize,
}

impl<K: Eq + Hash + Clone, V, T: Ord + Copy> ExpiringMap<K, V, T> {
    /// An empty map that holds at most `cap` entries (at least one).
    pub fn new(cap: usize) -> Self {
        Self {
            entries: HashMap::new(),
            order: VecDeque::new(),
            inserted: 0,
            cap: cap.max(1),
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key`, if held (forgotten or not yet pruned: see [`prune`](Self::prune)).
    pub fn get(&self, key: &K) -> Option<&V> {
        self.entries.get(key).map(|(v, _, _)| v)
    }

    /// Holds `value` for `key` until `forget_at`, replacing what `key` held; forgets what is
    /// due at `now` and, past the cap, the oldest entries.
    pub fn insert(&mut self, key: K, value: V, forget_at: T, now: T) {
        self.inserted += 1;
        self.order.push_back((key.clone(), self.inserted));
        self.entries.insert(key, (value, forget_at, self.inserted));
        self.prune(now);
    }

    /// Forgets `key`.
    pub fn remove(&mut self, key: &K) -> Option<V> {
        // Its place in the order is stale now, and skipped when it comes up.
        self.entries.remove(key).map(|(v, _, _)| v)
    }

    /// Forgets the entries due at `now`, oldest first, stopping at the first that is not;
    /// and the oldest, due or not, while more than the cap are held. An entry inserted after
    /// one that lives longer is forgotten when that one is: late, never early, and bounded
    /// by the cap either way.
    pub fn prune(&mut self, now: T) {
        while let Some((key, number)) = self.order.front() {
            let live = self
                .entries
                .get(key)
                .filter(|(_, _, n)| n == number)
                .map(|(_, forget_at, _)| *forget_at);
            match live {
                // Stale: the key was removed or inserted again since.
                None => {}
                Some(forget_at) if forget_at > now && self.entries.len() <= self.cap => break,
                Some(_) => {
                    self.entries.remove(key);
                }
            }
            self.order.pop_front();
        }
        // Stale places cannot pile up: one key inserted again and again leaves one each.
        if self.order.len() > 2 * self.cap {
            let entries = &self.entries;
            self.order
                .retain(|(key, number)| entries.get(key).is_some_and(|(_, _, n)| n == number));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn secs(n: u64) -> Duration {
        Duration::from_secs(n)
    }

    #[test]
    fn entries_are_forgotten_at_their_time() {
        let t0 = Instant::now();
        let mut m = ExpiringMap::new(100);
        m.insert(1, "a", t0 + secs(1), t0);
        m.insert(2, "b", t0 + secs(5), t0);
        m.prune(t0 + secs(2));
        assert_eq!((m.get(&1), m.get(&2)), (None, Some(&"b")));
        m.prune(t0 + secs(5));
        assert!(m.is_empty());
    }

    #[test]
    fn inserting_a_key_again_gives_it_the_new_time() {
        let t0 = Instant::now();
        let mut m = ExpiringMap::new(100);
        m.insert(1, "a", t0 + secs(1), t0);
        m.insert(1, "b", t0 + secs(10), t0);
        m.prune(t0 + secs(2));
        assert_eq!(
            m.get(&1),
            Some(&"b"),
            "the first insertion's time is not its own now"
        );
        m.remove(&1);
        m.insert(2, "c", t0 + secs(1), t0);
        m.prune(t0 + secs(3));
        assert!(m.is_empty());
    }

    #[test]
    fn a_flood_of_new_keys_stays_within_the_cap_and_the_order_within_twice() {
        let t0 = Instant::now();
        let mut m = ExpiringMap::new(64);
        for i in 0..100_000u32 {
            m.insert(i, (), t0 + secs(3600), t0);
            // One key inserted again and again, too.
            m.insert(u32::MAX, (), t0 + secs(3600), t0);
            assert!(m.len() <= 64);
            assert!(m.order.len() <= 2 * 64 + 1);
        }
        assert!(m.get(&99_999).is_some(), "the newest is kept");
    }

    proptest! {
        /// Against a model that forgets only by time: what the map holds is the model's
        /// newest entries, never more than the cap, never an entry the model has forgotten.
        #[test]
        fn holds_only_live_entries_and_at_most_the_cap(
            ops in proptest::collection::vec((0u8..16, 0u64..20, any::<bool>()), 1..300),
            cap in 1usize..8,
        ) {
            let t0 = Instant::now();
            let mut m = ExpiringMap::new(cap);
            let mut model: HashMap<u8, u64> = HashMap::new();
            for (step, (key, ttl, remove)) in ops.into_iter().enumerate() {
                let now = t0 + secs(step as u64);
                if remove {
                    m.remove(&key);
                    model.remove(&key);
                } else {
                    m.insert(key, step as u64, now + secs(ttl), now);
                    model.insert(key, step as u64 + ttl);
                }
                m.prune(now);
                prop_assert!(m.len() <= cap);
                for (k, (_, forget_at, _)) in &m.entries {
                    prop_assert!(model.contains_key(k), "{k} was removed");
                    let due = t0 + secs(model[k]);
                    prop_assert_eq!(*forget_at, due);
                }
            }
        }
    }
}
