//! The request sequence `modelmux bench` sends (which model request `i` names, reproducibly)
//! and the loads offline caches would need for it: a global LRU and Belady's optimum.

/// Chooses model `k` for request `i`.
pub(super) struct Popularity {
    /// The cumulative distribution over models (empty: uniform).
    cdf: Vec<f64>,
    models: usize,
    seed: u64,
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

impl Popularity {
    pub(super) fn new(models: usize, zipf: f64, seed: u64) -> Self {
        // Uniform popularity needs no table: `--models 4000000000` must not allocate 32 GB.
        if zipf == 0.0 {
            return Self {
                cdf: Vec::new(),
                models,
                seed,
            };
        }
        let weights: Vec<f64> = (1..=models).map(|k| 1.0 / (k as f64).powf(zipf)).collect();
        let total: f64 = weights.iter().sum();
        let mut acc = 0.0;
        let cdf = weights
            .iter()
            .map(|w| {
                acc += w / total;
                acc
            })
            .collect();
        Self { cdf, models, seed }
    }

    pub(super) fn model_for(&self, i: u64) -> usize {
        let u = (mix(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ i) >> 11) as f64
            / (1u64 << 53) as f64;
        if self.cdf.is_empty() {
            return ((u * self.models as f64) as usize).min(self.models.saturating_sub(1));
        }
        self.cdf.partition_point(|&c| c < u).min(self.cdf.len() - 1)
    }
}

/// Loads a global LRU of `slots` would do on `sequence`.
pub fn lru_loads(sequence: impl IntoIterator<Item = usize>, slots: usize) -> u64 {
    let mut order: Vec<usize> = Vec::with_capacity(slots);
    let mut loads = 0;
    for m in sequence {
        if let Some(pos) = order.iter().position(|&x| x == m) {
            order.remove(pos);
        } else {
            loads += 1;
            if order.len() == slots {
                order.remove(0);
            }
        }
        order.push(m);
    }
    loads
}

/// Loads an omniscient cache of `slots` would do on `sequence` (Belady's MIN: on a miss with
/// no free slot, evict the model whose next request is furthest away): the fewest any cache
/// of that size can do, so `1 - loads / requests` bounds every eviction policy's hit ratio.
pub fn optimal_loads(sequence: &[usize], slots: usize) -> u64 {
    // next[i]: where sequence[i] is asked for again (usize::MAX: never).
    let mut next = vec![usize::MAX; sequence.len()];
    let mut seen = std::collections::HashMap::new();
    for (i, &m) in sequence.iter().enumerate().rev() {
        next[i] = seen.insert(m, i).unwrap_or(usize::MAX);
    }
    // (model, where it is next asked for) for each held model.
    let mut held: Vec<(usize, usize)> = Vec::with_capacity(slots);
    let mut loads = 0;
    for (i, &m) in sequence.iter().enumerate() {
        if let Some(entry) = held.iter_mut().find(|(x, _)| *x == m) {
            entry.1 = next[i];
            continue;
        }
        loads += 1;
        if held.len() == slots {
            let furthest = (0..held.len())
                .max_by_key(|&k| held[k].1)
                .expect("slots is at least 1");
            held.swap_remove(furthest);
        }
        held.push((m, next[i]));
    }
    loads
}
