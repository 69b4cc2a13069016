//! The engine loop's side of the prefix cache: a sequence starts from its prompt's cached
//! blocks when admitted, and leaves its prompt's blocks behind once prefilled.

use std::sync::atomic::Ordering;

use super::EngineLoop;
use crate::engine::prefix::{PrefixCache, PrefixKey};
use crate::engine::sequence::Sequence;

impl EngineLoop {
    /// Starts `s` (just admitted) from the longest cached prefix of its prompt. A request for
    /// the prompt's log probabilities computes it whole (a cached prefix has no logits).
    pub(super) fn restore_prefix(&mut self, s: &mut Sequence) {
        let Some(prefixes) = &mut self.prefixes else {
            return;
        };
        if s.params.prompt_logprobs.is_some() {
            return;
        }
        let key = prefix_key(s, self.config.prefix_cache_salt.as_deref());
        let cache = s.cache.as_mut().expect("admitted sequences have a cache");
        let hit = prefixes.restore(&key, &s.prompt, cache);
        self.stats
            .prefix_queries
            .fetch_add(s.prompt.len() as u64, Ordering::Relaxed);
        self.stats
            .prefix_hits
            .fetch_add(hit as u64, Ordering::Relaxed);
    }

    /// Keeps the prompt of running sequence `i`, just prefilled, for later prompts.
    pub(super) fn keep_prefix(&mut self, i: usize) {
        let Some(prefixes) = &mut self.prefixes else {
            return;
        };
        let s = &self.running[i];
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
