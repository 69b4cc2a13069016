//! The prefix cache: the KV of full blocks of prompt tokens, kept after a prompt is prefilled
//! and copied into later sequences whose prompts start with the same blocks, so their prefill
//! starts there.
//!
//! What a cached block may be reused for is its [`PrefixKey`]: the adapter's *content* (a
//! SHA-256 of its files, never its name: an adapter reloaded under the same name with other
//! weights shares nothing, where vLLM served stale blocks, vllm#42125) or the base model, and
//! the cache salt (the request's `cache_salt`, else the deployment's), so tenants with
//! different salts never share entries, whose hits could be timed (CVE-2025-46570). A lookup
//! checks the key and the tokens themselves, not only their hash.
//!
//! Blocks are stored once each, as a tree: a block's parent is the block before it, so prompts
//! that share a system prompt share its blocks and differ only in their own. Each block
//! reserves its bytes from the engine's KV budget, like sequences; when a sequence cannot be
//! admitted for lack of KV memory, blocks are evicted least recently used first, leaves before
//! the blocks they extend (a prefix is only reachable from its first block).

use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use crate::kv::{KvBudget, KvCache, KvReservation, LayerRows};

/// Tokens per block: prefixes are cached and matched in whole blocks.
pub(crate) const BLOCK: usize = 16;

/// What a prompt's KV depends on besides its tokens.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct PrefixKey {
    /// The adapter's content hash; `None` for the base model.
    pub(crate) adapter: Option<[u8; 32]>,
    /// The cache salt.
    pub(crate) salt: Option<String>,
}

struct Block {
    key: PrefixKey,
    /// The block before this one (`None`: the prompt's first).
    parent: Option<u64>,
    /// Its chained hash, its slot in the index.
    hash: u64,
    tokens: Vec<u32>,
    /// Per layer: the block's keys and values, as the caches store them.
    layers: Vec<LayerRows>,
    /// Blocks that extend it.
    children: usize,
    last_used: u64,
    _reservation: KvReservation,
}

/// One engine's prefix cache; owned by its loop.
pub(crate) struct PrefixCache {
    blocks: HashMap<u64, Block>,
    /// The chained hash of a prefix's first `k` blocks to the `k`th block's id.
    index: HashMap<u64, u64>,
    next_id: u64,
    tick: u64,
    bytes_per_token: u64,
}

/// The chained hashes of the first 1, 2, ... `blocks` blocks of `tokens` under `key`.
fn block_hashes(key: &PrefixKey, tokens: &[u32], blocks: usize) -> Vec<u64> {
    let mut hasher = std::hash::DefaultHasher::new();
    key.hash(&mut hasher);
    tokens
        .chunks_exact(BLOCK)
        .take(blocks)
        .map(|block| {
            block.hash(&mut hasher);
            hasher.finish()
        })
        .collect()
}

impl PrefixCache {
    /// An empty cache for a model whose KV takes `bytes_per_token` bytes per token.
    pub(crate) fn new(bytes_per_token: u64) -> Self {
        Self {
            blocks: HashMap::new(),
            index: HashMap::new(),
            next_id: 0,
            tick: 0,
            bytes_per_token,
        }
    }

    /// Bytes the blocks hold.
    pub(crate) fn bytes(&self) -> u64 {
        (self.blocks.len() * BLOCK) as u64 * self.bytes_per_token
    }

    /// The ids of the cached blocks that start `prompt` under `key`, at most `blocks` of them.
    /// The hash only finds candidates: the key, the parent and the tokens decide, so a chain
    /// matches exactly.
    fn chain(&self, key: &PrefixKey, prompt: &[u32], hashes: &[u64]) -> Vec<u64> {
        let mut chain: Vec<u64> = Vec::new();
        for (k, hash) in hashes.iter().enumerate() {
            let Some(&id) = self.index.get(hash) else {
                break;
            };
            let block = &self.blocks[&id];
            if block.parent != chain.last().copied()
                || block.key != *key
                || block.tokens != prompt[k * BLOCK..(k + 1) * BLOCK]
            {
                break;
            }
            chain.push(id);
        }
        chain
    }

    fn touch(&mut self, chain: &[u64]) {
        self.tick += 1;
        for id in chain {
            if let Some(block) = self.blocks.get_mut(id) {
                block.last_used = self.tick;
            }
        }
    }

    /// Copies the longest cached prefix of `prompt` under `key` into `cache` (empty), in
    /// whole blocks and leaving at least one prompt token to compute (its logits start the
    /// output); returns the tokens restored.
    pub(crate) fn restore(
        &mut self,
        key: &PrefixKey,
        prompt: &[u32],
        cache: &mut KvCache,
    ) -> usize {
        debug_assert!(cache.is_empty());
        let usable = prompt.len().saturating_sub(1) / BLOCK;
        let chain = self.chain(key, prompt, &block_hashes(key, prompt, usable));
        if chain.is_empty() {
            return 0;
        }
        self.touch(&chain);
        let n = chain.len() * BLOCK;
        for layer in 0..cache.layer_count() {
            let rows: Vec<_> = chain
                .iter()
                .map(|id| &self.blocks[id].layers[layer])
                .collect();
            cache.append_rows(layer, &rows);
        }
        cache.advance(n);
        n
    }

    /// Keeps the whole blocks of `prompt`, whose KV `cache` holds (its prompt prefilled), under
    /// `key`: the blocks not cached yet are added, each reserving its bytes from `budget`
    /// (older blocks are evicted to make room; when even that is not enough, the rest of the
    /// prompt is not kept).
    pub(crate) fn insert(
        &mut self,
        key: &PrefixKey,
        prompt: &[u32],
        cache: &KvCache,
        budget: &KvBudget,
    ) {
        let blocks = prompt.len().min(cache.len()) / BLOCK;
        let hashes = block_hashes(key, prompt, blocks);
        let mut chain = self.chain(key, prompt, &hashes);
        self.touch(&chain);
        let bytes = BLOCK as u64 * self.bytes_per_token;
        for (k, &hash) in hashes.iter().enumerate().skip(chain.len()) {
            if self.index.contains_key(&hash) {
                // Another prefix under the same hash (a collision): keep what is cached.
                return;
            }
            let reservation = loop {
                if let Some(r) = budget.try_reserve(bytes) {
                    break r;
                }
                if !self.evict_sparing(&chain) {
                    return;
                }
            };
            let tokens = k * BLOCK..(k + 1) * BLOCK;
            let layers = (0..cache.layer_count())
                .map(|layer| cache.rows(layer, tokens.clone()))
                .collect();
            let parent = chain.last().copied();
            if let Some(parent) = parent {
                self.blocks.get_mut(&parent).expect("chained").children += 1;
            }
            let id = self.next_id;
            self.next_id += 1;
            self.index.insert(hash, id);
            self.blocks.insert(
                id,
                Block {
                    key: key.clone(),
                    parent,
                    hash,
                    tokens: prompt[k * BLOCK..(k + 1) * BLOCK].to_vec(),
                    layers,
                    children: 0,
                    last_used: self.tick,
                    _reservation: reservation,
                },
            );
            chain.push(id);
        }
    }

    /// Evicts the least recently used block that no other extends (its bytes go back to the
    /// budget); false when there is none.
    pub(crate) fn evict_one(&mut self) -> bool {
        self.evict_sparing(&[])
    }

    /// [`evict_one`](Self::evict_one), never evicting a block of `spared`.
    fn evict_sparing(&mut self, spared: &[u64]) -> bool {
        let victim = self
            .blocks
            .iter()
            .filter(|(id, b)| b.children == 0 && !spared.contains(id))
            .min_by_key(|(_, b)| b.last_used)
            .map(|(&id, _)| id);
        let Some(id) = victim else {
            return false;
        };
        let block = self.blocks.remove(&id).expect("found");
        self.index.remove(&block.hash);
        if let Some(parent) = block.parent.and_then(|p| self.blocks.get_mut(&p)) {
            parent.children -= 1;
        }
        true
    }

    /// Drops every block (`reset_prefix_cache`, or the weights released).
    pub(crate) fn clear(&mut self) {
        self.index.clear();
        self.blocks.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::KvDtype;

    const LAYERS: usize = 2;
    const KV_DIM: usize = 4;
    const KV_HEADS: usize = 2;

    fn empty(max_tokens: usize) -> KvCache {
        // Binary16, the engine's usual type: the tests' values (token ids + 1000 * layer) are
        // integers below 2048, which it holds exactly.
        KvCache::with_shape(
            LAYERS,
            KV_HEADS,
            KV_DIM / KV_HEADS,
            KvDtype::F16,
            max_tokens,
            None,
        )
    }

    /// A cache holding `tokens`, each token's KV in every layer its token id (so a copy
    /// can be checked).
    fn prefilled(tokens: &[u32]) -> KvCache {
        let mut cache = empty(tokens.len() + 8);
        for layer in 0..LAYERS {
            let rows: Vec<f32> = tokens
                .iter()
                .flat_map(|&t| std::iter::repeat_n(t as f32 + layer as f32 * 1000.0, KV_DIM))
                .collect();
            cache.append(layer, &rows, &rows);
        }
        cache.advance(tokens.len());
        cache
    }

    fn key(adapter: u8, salt: Option<&str>) -> PrefixKey {
        PrefixKey {
            adapter: (adapter > 0).then_some([adapter; 32]),
            salt: salt.map(str::to_owned),
        }
    }

    fn bytes_per_token() -> u64 {
        (LAYERS * 2 * KV_DIM * KvDtype::F16.bytes()) as u64
    }

    #[test]
    fn a_prompt_reuses_the_whole_blocks_it_shares_and_computes_the_rest() {
        let budget = KvBudget::new(1 << 30);
        let mut prefixes = PrefixCache::new(bytes_per_token());
        let first: Vec<u32> = (0..40).collect();
        prefixes.insert(&key(0, None), &first, &prefilled(&first), &budget);
        assert_eq!(
            prefixes.bytes(),
            32 * bytes_per_token(),
            "two whole blocks of 40 tokens"
        );

        // Shares 35 tokens: two blocks (32) are restored, the rest computed.
        let mut second: Vec<u32> = (0..35).collect();
        second.extend([900, 901, 902]);
        let mut cache = empty(64);
        assert_eq!(prefixes.restore(&key(0, None), &second, &mut cache), 32);
        assert_eq!(cache.len(), 32);
        let expected = prefilled(&second[..32]);
        for layer in 0..LAYERS {
            assert_eq!(cache.layer(layer), expected.layer(layer));
        }

        // A prompt of exactly the cached blocks keeps its last block to compute.
        let mut cache = empty(64);
        assert_eq!(
            prefixes.restore(&key(0, None), &first[..32], &mut cache),
            16
        );
        // A different first block shares nothing.
        let mut other = first.clone();
        other[3] = 7777;
        let mut cache = empty(64);
        assert_eq!(prefixes.restore(&key(0, None), &other, &mut cache), 0);
    }

    #[test]
    fn another_adapter_content_or_salt_never_shares_an_entry() {
        let budget = KvBudget::new(1 << 30);
        let mut prefixes = PrefixCache::new(bytes_per_token());
        let prompt: Vec<u32> = (0..50).collect();
        prefixes.insert(
            &key(1, Some("tenant-a")),
            &prompt,
            &prefilled(&prompt),
            &budget,
        );
        for other in [
            key(0, Some("tenant-a")),
            key(2, Some("tenant-a")),
            key(1, Some("tenant-b")),
            key(1, None),
        ] {
            let mut cache = empty(64);
            assert_eq!(
                prefixes.restore(&other, &prompt, &mut cache),
                0,
                "{other:?}"
            );
        }
        let mut cache = empty(64);
        assert_eq!(
            prefixes.restore(&key(1, Some("tenant-a")), &prompt, &mut cache),
            48
        );
    }

    #[test]
    fn entries_live_inside_the_kv_budget_and_go_least_recently_used_first() {
        let per_block = BLOCK as u64 * bytes_per_token();
        let budget = KvBudget::new(3 * per_block);
        let mut prefixes = PrefixCache::new(bytes_per_token());
        let prompts: Vec<Vec<u32>> = (0..3).map(|p| (p * 100..p * 100 + 17).collect()).collect();
        for p in &prompts {
            prefixes.insert(&key(0, None), p, &prefilled(p), &budget);
        }
        assert_eq!(budget.reserved(), 3 * per_block);
        // Prompt 0 is used again: prompt 1 is now the least recently used.
        let mut cache = empty(64);
        assert_eq!(prefixes.restore(&key(0, None), &prompts[0], &mut cache), 16);
        let fourth: Vec<u32> = (500..517).collect();
        prefixes.insert(&key(0, None), &fourth, &prefilled(&fourth), &budget);
        assert_eq!(budget.reserved(), 3 * per_block, "never past the budget");
        let restored = |prefixes: &mut PrefixCache, p: &[u32]| {
            let mut cache = empty(64);
            prefixes.restore(&key(0, None), p, &mut cache)
        };
        assert_eq!(
            restored(&mut prefixes, &prompts[1]),
            0,
            "the least recently used went"
        );
        assert_eq!(restored(&mut prefixes, &prompts[0]), 16);
        assert_eq!(restored(&mut prefixes, &fourth), 16);
        // Running sequences come first: the engine evicts entries until one fits.
        while budget.try_reserve(3 * per_block).is_none() {
            assert!(prefixes.evict_one());
        }
        assert_eq!(prefixes.bytes(), 0);
        prefixes.insert(&key(0, None), &fourth, &prefilled(&fourth), &budget);
        prefixes.clear();
        assert_eq!(budget.reserved(), 0);
    }

    #[test]
    fn prompts_that_share_blocks_store_them_once() {
        let budget = KvBudget::new(1 << 30);
        let mut prefixes = PrefixCache::new(bytes_per_token());
        let short: Vec<u32> = (0..20).collect();
        let long: Vec<u32> = (0..40).collect();
        prefixes.insert(&key(0, None), &short, &prefilled(&short), &budget);
        prefixes.insert(&key(0, None), &long, &prefilled(&long), &budget);
        assert_eq!(
            prefixes.blocks.len(),
            2,
            "the long prompt adds only its second block"
        );
        assert_eq!(budget.reserved(), 32 * bytes_per_token());
        // Inserting a prefix of what is cached adds nothing.
        prefixes.insert(&key(0, None), &short, &prefilled(&short), &budget);
        assert_eq!(prefixes.blocks.len(), 2);
        // Ten prompts with one system prompt (3 blocks) and their own last block: 3 + 10.
        let system: Vec<u32> = (1000..1048).collect();
        for user in 0..10u32 {
            let mut p = system.clone();
            p.extend((0..16).map(|i| 5000 + user * 16 + i));
            prefixes.insert(&key(0, None), &p, &prefilled(&p), &budget);
        }
        assert_eq!(prefixes.blocks.len(), 2 + 3 + 10);
        // Eviction takes the users' blocks before the system prompt they extend.
        for _ in 0..10 {
            assert!(prefixes.evict_one());
        }
        let mut p = system.clone();
        p.push(1);
        let mut cache = empty(64);
        assert_eq!(prefixes.restore(&key(0, None), &p, &mut cache), 48);
    }
}
