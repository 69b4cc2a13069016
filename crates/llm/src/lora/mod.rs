//! LoRA adapters in PEFT's format (`adapter_config.json` + `adapter_model.safetensors`),
//! checked against the base model and kept unmerged, so that one forward pass can apply a
//! different adapter (or none) to each sequence's rows.
//!
//! Two details make or break correctness:
//! - GGUF files store the rows of the q and k projections permuted for llama.cpp's
//!   interleaved rotary layout. PEFT's `lora_B` for q and k is in Hugging Face's row order, so
//!   its rows are permuted the same way here; without it the outputs are silently wrong.
//! - The scale is `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`, per module
//!   when `rank_pattern` / `alpha_pattern` say so. It is folded into `B` once, at load.

use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use crate::error::Result;
use crate::gguf::LlamaConfig;
use crate::weights::Target;

mod config;
mod names;
mod pair;
mod peft;
mod source;

use config::parse_config;
pub use names::{AdapterNames, MAX_NAMES, TooManyNames};
pub use pair::AdapterPrecision;
pub(crate) use pair::LoraPair;
pub use source::{AdapterSources, AllowedSources, InvalidSourceEntry, SourceMatch};

/// The configuration file of an adapter directory.
pub const ADAPTER_CONFIG_FILE: &str = "adapter_config.json";
/// The weights file of an adapter directory.
pub const ADAPTER_WEIGHTS_FILE: &str = "adapter_model.safetensors";

/// An adapter held for as long as a sequence uses it: a cache guard (`ModelGuard`) or any
/// other owner of a [`LoraAdapter`].
/// Cloning shares the lease (the choices of an `n > 1` request hold one adapter together).
#[derive(Clone)]
pub struct AdapterLease(Arc<dyn Deref<Target = LoraAdapter> + Send + Sync>);

impl AdapterLease {
    /// Leases `adapter` through `owner`, which keeps it alive (and pinned in its cache) until
    /// the lease and its clones are dropped.
    pub fn new(owner: impl Deref<Target = LoraAdapter> + Send + Sync + 'static) -> Self {
        Self(Arc::new(owner))
    }
}

impl Deref for AdapterLease {
    type Target = LoraAdapter;
    fn deref(&self) -> &LoraAdapter {
        &self.0
    }
}

/// A LoRA adapter, ready to be applied to the base model it was checked against.
pub struct LoraAdapter {
    id: String,
    serial: u64,
    /// SHA-256 of its configuration and weights files.
    content: [u8; 32],
    /// `[layer][target]`
    layers: Vec<[Option<LoraPair>; 7]>,
    bytes: u64,
    max_rank: usize,
}

impl std::fmt::Debug for LoraAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoraAdapter")
            .field("id", &self.id)
            .field("max_rank", &self.max_rank)
            .field("bytes", &self.bytes)
            .finish()
    }
}

use sha2::Digest;

static SERIAL: AtomicU64 = AtomicU64::new(1);

impl LoraAdapter {
    /// Reads adapter `id` from its two files, checks it against the base model `base`, and
    /// prepares it for the engine, its matrices in binary16 ([`AdapterPrecision::Half`]).
    /// CPU-bound: call it on a blocking thread.
    pub fn from_peft(id: &str, config: &[u8], weights: &[u8], base: &LlamaConfig) -> Result<Self> {
        Self::from_peft_in(id, config, weights, base, AdapterPrecision::Half)
    }

    /// [`from_peft`](Self::from_peft), its matrices stored in `precision`.
    pub fn from_peft_in(
        id: &str,
        config: &[u8],
        weights: &[u8],
        base: &LlamaConfig,
        precision: AdapterPrecision,
    ) -> Result<Self> {
        // What the adapter computes depends on these two files only: their digest names its
        // content (the prefix cache's key), whatever the adapter is called. It is computed on
        // a thread of its own while the files are parsed: hashing a rank-16 adapter's 7 MB
        // took about 4 ms of its 13 ms parse on one core.
        std::thread::scope(|scope| {
            let digest = scope.spawn(|| {
                let content: [u8; 32] = sha2::Sha256::new()
                    .chain_update((config.len() as u64).to_le_bytes())
                    .chain_update(config)
                    .chain_update(weights)
                    .finalize()
                    .into();
                content
            });
            let parsed = Self::parse_peft(id, config, weights, base, precision);
            let content = digest.join().expect("hashing does not panic");
            parsed.map(|adapter| Self { content, ..adapter })
        })
    }

    /// The adapter's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// Bytes its weights occupy.
    pub fn size_bytes(&self) -> u64 {
        self.bytes
    }

    /// The largest rank of its modules.
    pub fn max_rank(&self) -> usize {
        self.max_rank
    }

    /// A number no other adapter loaded by this process has: identity for batching.
    pub fn serial(&self) -> u64 {
        self.serial
    }

    /// The SHA-256 of its files: the same for the same adapter loaded again, different for
    /// other weights under the same name.
    pub fn content_hash(&self) -> &[u8; 32] {
        &self.content
    }

    pub(crate) fn pair(&self, layer: usize, target: Target) -> Option<&LoraPair> {
        self.layers[layer][target.index()].as_ref()
    }
}
