//! The index: which models are loaded, read on every request without a lock.
//!
//! The ids are spread over [`SHARDS`] maps, each behind an [`ArcSwap`]. A reader (the hit path)
//! loads one shard and looks up; a writer replaces one shard with a modified copy. So a load
//! or an eviction copies one shard, about 1/16 of the models, rather than them all: copying a
//! map clones each model's `Arc`, a cache miss per model, and with a whole index of hundreds
//! of adapters copied per load, that copy was the largest cost of a load after the load
//! itself. Writers must be serialised by the caller (the cache's state lock).

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::guard::Resident;
use crate::{Model, ModelId};

/// Shards of the index.
pub(crate) const SHARDS: usize = 16;

type Shard<M> = HashMap<ModelId, Arc<Resident<M>>, foldhash::fast::RandomState>;

/// The loaded models, by id.
pub(crate) struct Index<M: Model> {
    shards: [ArcSwap<Shard<M>>; SHARDS],
    /// Which shard an id is in: a hasher of its own (seeded apart from the shards' maps, so
    /// that the ids of one shard still spread over its buckets).
    route: foldhash::fast::RandomState,
}

impl<M: Model> Default for Index<M> {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| ArcSwap::default()),
            route: foldhash::fast::RandomState::default(),
        }
    }
}

impl<M: Model> Index<M> {
    fn shard(&self, id: &str) -> &ArcSwap<Shard<M>> {
        let h = self.route.hash_one(id);
        &self.shards[(h >> 60) as usize % SHARDS]
    }

    /// The model loaded as `id`, if any.
    pub(crate) fn get(&self, id: &str) -> Option<Arc<Resident<M>>> {
        self.shard(id).load().get(id).cloned()
    }

    /// Adds (or replaces) `id`. The caller serialises writers.
    pub(crate) fn insert(&self, id: ModelId, resident: Arc<Resident<M>>) {
        let shard = self.shard(&id);
        let mut next = Shard::clone(&shard.load());
        next.insert(id, resident);
        shard.store(Arc::new(next));
    }

    /// Takes `id` out. The caller serialises writers.
    pub(crate) fn remove(&self, id: &str) -> Option<Arc<Resident<M>>> {
        let shard = self.shard(id);
        let current = shard.load();
        current.get(id)?;
        let mut next = Shard::clone(&current);
        let removed = next.remove(id);
        shard.store(Arc::new(next));
        removed
    }

    /// Every shard as it is now: consistent as a whole where the caller holds off writers.
    pub(crate) fn snapshot(&self) -> Snapshot<M> {
        Snapshot {
            shards: std::array::from_fn(|i| self.shards[i].load_full()),
        }
    }
}

/// The index at one moment (see [`Index::snapshot`]).
pub(crate) struct Snapshot<M: Model> {
    shards: [Arc<Shard<M>>; SHARDS],
}

impl<M: Model> Snapshot<M> {
    /// The loaded models.
    pub(crate) fn values(&self) -> impl Iterator<Item = &Arc<Resident<M>>> {
        self.shards.iter().flat_map(|s| s.values())
    }

    /// Their ids.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &ModelId> {
        self.shards.iter().flat_map(|s| s.keys())
    }

    /// How many.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.len()).sum()
    }
}
