//! Belady's optimum: the most hits any cache of `capacity` slots could have on a sequence,
//! knowing the future (on a miss, keep the model and evict the one used again furthest ahead;
//! Belady 1966, optimal for demand paging by Mattson et al. 1970).
//!
//! The replicas' slots pooled into one cache bound what any placement over them could do, so
//! the figure is an upper bound for a deployment: how far its setting is from perfect.

use std::collections::BinaryHeap;

/// Hits of the optimal cache of `capacity` slots on `seq` (model indices), in O(n log n).
pub fn belady_hits(seq: &[u32], capacity: usize) -> u64 {
    if capacity == 0 || seq.is_empty() {
        return 0;
    }
    let models = seq.iter().max().map_or(0, |&m| m as usize + 1);
    // next[i]: where seq[i]'s model is asked for again (usize::MAX: never).
    let mut next = vec![usize::MAX; seq.len()];
    let mut last = vec![usize::MAX; models];
    for (i, &m) in seq.iter().enumerate().rev() {
        next[i] = last[m as usize];
        last[m as usize] = i;
    }
    // For each held model, its next use; the heap holds (next use, model), stale entries
    // skipped when popped.
    let mut held: Vec<Option<usize>> = vec![None; models];
    let mut heap: BinaryHeap<(usize, u32)> = BinaryHeap::new();
    let (mut hits, mut size) = (0u64, 0usize);
    for (i, &m) in seq.iter().enumerate() {
        let slot = &mut held[m as usize];
        if slot.is_some() {
            hits += 1;
        } else if size == capacity {
            while let Some((when, victim)) = heap.pop() {
                if held[victim as usize] == Some(when) {
                    held[victim as usize] = None;
                    break;
                }
            }
        } else {
            size += 1;
        }
        held[m as usize] = Some(next[i]);
        heap.push((next[i], m));
    }
    hits
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The most hits of any eviction choice, by trying them all.
    fn brute_force(seq: &[u32], capacity: usize) -> u64 {
        fn go(seq: &[u32], capacity: usize, held: &mut Vec<u32>) -> u64 {
            let Some((&m, rest)) = seq.split_first() else {
                return 0;
            };
            if held.contains(&m) {
                return 1 + go(rest, capacity, held);
            }
            if held.len() < capacity {
                held.push(m);
                let best = go(rest, capacity, held);
                held.pop();
                return best;
            }
            let mut best = 0;
            for i in 0..held.len() {
                let victim = std::mem::replace(&mut held[i], m);
                best = best.max(go(rest, capacity, held));
                held[i] = victim;
            }
            best
        }
        if capacity == 0 {
            return 0;
        }
        go(seq, capacity, &mut Vec::new())
    }

    #[test]
    fn a_worked_example() {
        // Capacity 2: a b | a hit | c evicts b (a is next at 4, b at 5 after it) | a hit |
        // b evicts c (never again) or a (never again) | b hit.
        assert_eq!(belady_hits(&[0, 1, 0, 2, 0, 1, 1], 2), 3);
        assert_eq!(belady_hits(&[0, 1, 2, 0, 1, 2], 1), 0);
        assert_eq!(belady_hits(&[0, 0, 0], 0), 0);
        assert_eq!(belady_hits(&[0, 1, 2, 0, 1, 2], 3), 3);
    }

    proptest! {
        #[test]
        fn matches_the_brute_force_optimum_on_tiny_traces(
            seq in proptest::collection::vec(0u32..5, 0..11),
            capacity in 0usize..4,
        ) {
            prop_assert_eq!(belady_hits(&seq, capacity), brute_force(&seq, capacity));
        }
    }
}
