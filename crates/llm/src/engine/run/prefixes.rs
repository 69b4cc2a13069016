//! The engine loop's side of the prefix cache: a sequence starts from its prompt's cached
//! blocks when admitted, and leaves its prompt's blocks behind once prefilled.

use std::sync::atomic::Ordering;

use super::EngineLoop;
use super::weights::Weights;
use crate::engine::EngineStats;
use crate::engine::prefix::{PrefixCache, PrefixKey};
use crate::engine::scheduler::KvRoom;
use crate::engine::sequence::Sequence;
use crate::kv::{KvBudget, KvReservation};

/// Where admission finds memory: the engine's KV budget, cached prefixes giving theirs back
/// first; each admitted sequence starts from its prompt's longest cached prefix.
pub(super) struct Admission<'a> {
    pub(super) budget: &'a KvBudget,
    pub(super) prefixes: Option<&'a mut PrefixCache>,
    pub(super) weights: &'a Weights,
    pub(super) salt: Option<&'a str>,
    pub(super) stats: &'a EngineStats,
}

impl KvRoom<Sequence> for Admission<'_> {
    type Reservation = KvReservation;

    fn try_reserve(&mut self, bytes: u64) -> Option<KvReservation> {
        self.budget.try_reserve(bytes)
    }

    fn evict_prefix(&mut self) -> bool {
        self.prefixes
            .as_deref_mut()
            .is_some_and(PrefixCache::evict_one)
    }

    /// Makes `s`'s cache on `reservation` and starts it from the longest cached prefix of
    /// its prompt. A request for the prompt's log probabilities computes it whole (a cached
    /// prefix has no logits).
    fn start(&mut self, s: &mut Sequence, reservation: KvReservation) {
        s.admit(
            &self.weights.config,
            self.weights.kv_dtype,
            Some(reservation),
        );
        let Some(prefixes) = self.prefixes.as_deref_mut() else {
            return;
        };
        if s.params.prompt_logprobs.is_some() {
            return;
        }
        let key = prefix_key(s, self.salt);
        let cache = s.cache.as_mut().expect("admitted sequences have a cache");
        let hit = prefixes.restore(&key, &s.prompt, cache);
        self.stats
            .prefix_queries
            .fetch_add(s.prompt.len() as u64, Ordering::Relaxed);
        self.stats
            .prefix_hits
            .fetch_add(hit as u64, Ordering::Relaxed);
    }
}

impl EngineLoop {
    /// Keeps the prompt of running sequence `i`, just prefilled, for later prompts.
    pub(super) fn keep_prefix(&mut self, i: usize) {
        let Some(prefixes) = &mut self.prefixes else {
            return;
        };
        let s = &self.sched.running()[i];
        let key = prefix_key(s, self.config.prefix_cache_salt.as_deref());
        let cache = s.cache.as_ref().expect("admitted sequences have a cache");
        prefixes.insert(&key, &s.prompt, cache, &self.budget);
    }

    pub(super) fn reset_prefixes(&mut self) {
        if let Some(prefixes) = &mut self.prefixes {
            prefixes.clear();
        }
        self.publish_prefixes();
    }

    pub(super) fn publish_prefixes(&self) {
        let bytes = self.prefixes.as_ref().map_or(0, PrefixCache::bytes);
        self.stats.prefix_bytes.store(bytes, Ordering::Relaxed);
    }
}

/// What sequence `s`'s prompt KV depends on besides its tokens: its adapter's content and
/// its cache salt (`default_salt` when the request gave none).
pub(super) fn prefix_key(s: &Sequence, default_salt: Option<&str>) -> PrefixKey {
    PrefixKey {
        adapter: s.adapter.as_ref().map(|a| *a.content_hash()),
        salt: s
            .params
            .cache_salt
            .clone()
            .or_else(|| default_salt.map(str::to_owned)),
    }
}
