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
use std::sync::atomic::{AtomicU64, Ordering};

use safetensors::{Dtype, SafeTensors};

use crate::error::{LlmError, Result};
use crate::gguf::LlamaConfig;
use crate::weights::Target;

mod config;
mod names;
mod pair;
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

/// A tensor read from the file: its shape and values.
type Tensor = (Vec<usize>, Vec<f32>);

/// `(layer, target, is_b)` of a PEFT tensor name.
fn parse_tensor_name(adapter: &str, name: &str) -> Result<(usize, &'static [Target], bool)> {
    let err = || {
        LlmError::adapter(
            adapter,
            format!(
                "{ADAPTER_WEIGHTS_FILE}: tensor '{name}' is not a LoRA weight of a Llama block projection (embedding, bias, DoRA and modules_to_save tensors are not supported)"
            ),
        )
    };
    let rest = name
        .strip_prefix("base_model.model.model.layers.")
        .ok_or_else(err)?;
    let (layer, rest) = rest.split_once('.').ok_or_else(err)?;
    let layer: usize = layer.parse().map_err(|_| err())?;
    let parts: Vec<&str> = rest.split('.').collect();
    let (parent, module, which) = match parts.as_slice() {
        [parent, module, which, "weight"] => (*parent, *module, *which),
        _ => return Err(err()),
    };
    let targets = Target::from_peft_module(module).ok_or_else(err)?;
    if targets[0].peft_parent() != parent {
        return Err(err());
    }
    let is_b = match which {
        "lora_A" => false,
        "lora_B" => true,
        _ => return Err(err()),
    };
    Ok((layer, targets, is_b))
}

fn to_f32(
    adapter: &str,
    name: &str,
    view: &safetensors::tensor::TensorView<'_>,
) -> Result<Vec<f32>> {
    let data = view.data();
    let values: Vec<f32> = match view.dtype() {
        Dtype::F32 => data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => data
            .chunks_exact(2)
            .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Dtype::BF16 => data
            .chunks_exact(2)
            .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(LlmError::adapter(
                adapter,
                format!(
                    "tensor '{name}' has dtype {other:?}; only F32, F16 and BF16 are supported"
                ),
            ));
        }
    };
    if let Some(bad) = values.iter().find(|v| !v.is_finite()) {
        return Err(LlmError::adapter(
            adapter,
            format!("tensor '{name}' holds a non-finite value ({bad})"),
        ));
    }
    Ok(values)
}

/// GGUF's row order for q (`heads` = query heads) or k (`heads` = KV heads): within each
/// head, Hugging Face row `t * half + j` becomes GGUF row `2 * j + t`.
fn permute_rows(bt: &mut [f32], rank: usize, heads: usize, out_dim: usize) {
    let head_dim = out_dim / heads;
    let half = head_dim / 2;
    let mut row = vec![0.0f32; out_dim];
    for r in 0..rank {
        let b = &mut bt[r * out_dim..(r + 1) * out_dim];
        for h in 0..heads {
            for t in 0..2 {
                for j in 0..half {
                    row[h * head_dim + 2 * j + t] = b[h * head_dim + t * half + j];
                }
            }
        }
        b.copy_from_slice(&row);
    }
}

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

    /// The adapter in `config` and `weights`, its content digest left zero.
    fn parse_peft(
        id: &str,
        config: &[u8],
        weights: &[u8],
        base: &LlamaConfig,
        precision: AdapterPrecision,
    ) -> Result<Self> {
        let cfg = parse_config(id, config)?;
        // Made for another family: refused even when the shapes happen to agree.
        if let Some(name) = &cfg.base_model
            && let Some(arch) = config::architecture_named(name)
            && arch != base.family.lineage
        {
            return Err(LlmError::adapter(
                id,
                format!(
                    "the adapter was trained on {name} (a {arch} model), but the base model is a {} model",
                    base.family.name
                ),
            ));
        }
        let tensors = SafeTensors::deserialize(weights).map_err(|e| {
            LlmError::adapter(
                id,
                format!("{ADAPTER_WEIGHTS_FILE} is not a valid safetensors file: {e}"),
            )
        })?;
        // (layer, target) -> (A, B)
        let mut found: std::collections::BTreeMap<(usize, Target), [Option<Tensor>; 2]> =
            Default::default();
        for (name, view) in tensors.tensors() {
            let (layer, targets, is_b) = parse_tensor_name(id, &name)?;
            if layer >= base.n_layer {
                return Err(LlmError::adapter(
                    id,
                    format!(
                        "tensor '{name}' is for layer {layer}, but the base model has {} layers: the adapter was made for another base model",
                        base.n_layer
                    ),
                ));
            }
            if let Some(target) = targets.iter().find(|t| !cfg.targets.contains(t)) {
                return Err(LlmError::adapter(
                    id,
                    format!(
                        "tensor '{name}' adapts {}, which target_modules does not list",
                        target.peft_name()
                    ),
                ));
            }
            let values = to_f32(id, &name, &view)?;
            let shape = view.shape().to_vec();
            if targets.len() == 1 || !is_b {
                // One target, or the A of a fused module: every part reads the same input
                // (copied for all but the last).
                let (last, rest) = targets.split_last().expect("a tensor adapts a target");
                for &target in rest {
                    found.entry((layer, target)).or_default()[is_b as usize] =
                        Some((shape.clone(), values.clone()));
                }
                found.entry((layer, *last)).or_default()[is_b as usize] = Some((shape, values));
                continue;
            }
            // The B of a fused module: its rows are the parts' rows, stacked.
            let rank = shape.get(1).copied().unwrap_or(0);
            let rows: Vec<usize> = targets.iter().map(|t| t.dims(base).0).collect();
            if shape.len() != 2 || shape[0] != rows.iter().sum::<usize>() {
                return Err(LlmError::adapter(
                    id,
                    format!(
                        "tensor '{name}' is {shape:?}, but the fused projection has {} rows on this base model: the adapter was made for another base model",
                        rows.iter().sum::<usize>()
                    ),
                ));
            }
            let mut offset = 0;
            for (&target, n) in targets.iter().zip(rows) {
                let part = values[offset * rank..(offset + n) * rank].to_vec();
                found.entry((layer, target)).or_default()[1] = Some((vec![n, rank], part));
                offset += n;
            }
        }
        if found.is_empty() {
            return Err(LlmError::adapter(
                id,
                format!("{ADAPTER_WEIGHTS_FILE} holds no LoRA tensors"),
            ));
        }
        let mut layers: Vec<[Option<LoraPair>; 7]> =
            (0..base.n_layer).map(|_| Default::default()).collect();
        let mut bytes = 0u64;
        let mut max_rank = 0;
        for ((layer, target), [a, b]) in found {
            let module = format!(
                "model.layers.{layer}.{}.{}",
                target.peft_parent(),
                target.peft_name()
            );
            let (Some((a_shape, a)), Some((b_shape, b))) = (a, b) else {
                return Err(LlmError::adapter(
                    id,
                    format!("{module} has only one of lora_A and lora_B"),
                ));
            };
            let rank = cfg
                .rank_pattern
                .iter()
                .find(|(re, _)| re.is_match(&module))
                .map_or(cfg.rank, |(_, r)| *r);
            let alpha = cfg
                .alpha_pattern
                .iter()
                .find(|(re, _)| re.is_match(&module))
                .map_or(cfg.alpha, |(_, a)| *a);
            let (out_dim, in_dim) = target.dims(base);
            if a_shape != [rank, in_dim] || b_shape != [out_dim, rank] {
                return Err(LlmError::adapter(
                    id,
                    format!(
                        "{module}: lora_A is {a_shape:?} and lora_B {b_shape:?}, but rank {rank} on this base model needs [{rank}, {in_dim}] and [{out_dim}, {rank}]: the adapter was made for another base model or its config does not match its weights"
                    ),
                ));
            }
            let scale = if cfg.rslora {
                alpha / (rank as f64).sqrt()
            } else {
                alpha / rank as f64
            } as f32;
            // B^T, scaled: rank x out.
            let mut bt = vec![0.0f32; rank * out_dim];
            for o in 0..out_dim {
                for r in 0..rank {
                    bt[r * out_dim + o] = b[o * rank + r] * scale;
                }
            }
            // Only families whose q/k rows the converter permuted (NeoX ones keep PEFT's order).
            if base.family.rope == crate::family::RopeStyle::Interleaved {
                match target {
                    Target::Q => permute_rows(&mut bt, rank, base.n_head, out_dim),
                    Target::K => permute_rows(&mut bt, rank, base.n_kv_head, out_dim),
                    _ => {}
                }
            }
            let pair = LoraPair::new(rank, a, bt, precision)
                .map_err(|e| LlmError::adapter(id, format!("{module}: {e}")))?;
            bytes += pair.size_bytes();
            max_rank = max_rank.max(rank);
            layers[layer][target.index()] = Some(pair);
        }
        Ok(Self {
            id: id.to_owned(),
            serial: SERIAL.fetch_add(1, Ordering::Relaxed),
            content: [0; 32],
            layers,
            bytes,
            max_rank,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_matches_the_gguf_converter() {
        // The converter: w.reshape(heads, 2, hd/2, ...).swapaxes(1, 2).reshape(w.shape),
        // i.e. new row h*hd + j*2 + t = old row h*hd + t*hd/2 + j.
        let (heads, head_dim) = (3, 8);
        let out = heads * head_dim;
        let mut bt: Vec<f32> = (0..out).map(|i| i as f32).collect();
        permute_rows(&mut bt, 1, heads, out);
        let mut want = Vec::new();
        for h in 0..heads {
            for j in 0..head_dim / 2 {
                for t in 0..2 {
                    want.push((h * head_dim + t * head_dim / 2 + j) as f32);
                }
            }
        }
        assert_eq!(bt, want);
    }

    #[test]
    fn config_refuses_what_it_cannot_honour_naming_the_key() {
        let cases = [
            (
                r#"{"r": 8, "target_modules": ["q_proj"], "use_dora": true}"#,
                "use_dora",
            ),
            (
                r#"{"r": 8, "target_modules": ["q_proj"], "modules_to_save": ["lm_head"]}"#,
                "modules_to_save",
            ),
            (
                r#"{"r": 8, "target_modules": ["embed_tokens"]}"#,
                "embed_tokens",
            ),
            (
                r#"{"r": 8, "target_modules": ["q_proj"], "some_future_thing": 3}"#,
                "some_future_thing",
            ),
            (r#"{"r": 0, "target_modules": ["q_proj"]}"#, "'r'"),
            (r#"{"r": 8}"#, "target_modules"),
            (
                r#"{"r": 8, "target_modules": ["q_proj"], "bias": "all"}"#,
                "bias",
            ),
            (r#"[1]"#, "not a JSON object"),
            (
                r#"{"r": 8, "target_modules": ["q_proj"], "rank_pattern": {"(": 4}}"#,
                "rank_pattern",
            ),
        ];
        for (json, key) in cases {
            let Err(e) = parse_config("x", json.as_bytes()) else {
                panic!("{json} was accepted");
            };
            assert!(e.to_string().contains(key), "{e} should name {key}");
        }
        let ok = parse_config(
            "x",
            br#"{"r": 8, "lora_alpha": 16, "target_modules": ["q_proj", "model.layers.0.mlp.down_proj"], "use_dora": false, "modules_to_save": null, "lora_dropout": 0.1, "peft_type": "LORA"}"#,
        )
        .unwrap();
        assert_eq!(ok.targets, vec![Target::Q, Target::Down]);
        assert_eq!(
            parse_config("x", br#"{"r": 8, "target_modules": "all-linear"}"#)
                .unwrap()
                .targets
                .len(),
            7
        );
        assert_eq!(
            parse_config(
                "x",
                br#"{"r": 8, "target_modules": ".*\\.(q_proj|v_proj)"}"#
            )
            .unwrap()
            .targets,
            vec![Target::Q, Target::V]
        );
    }
}
