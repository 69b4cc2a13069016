//! PEFT's files read as a [`LoraAdapter`]: the tensors found by name, checked against the
//! base model's shape and family, each module's pair scaled (alpha over rank, or over its
//! square root with rsLoRA) and put in the base model's row order.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use safetensors::{Dtype, SafeTensors};

use super::config::{AdapterConfig, architecture_named};
use super::{ADAPTER_WEIGHTS_FILE, AdapterPrecision, LoraAdapter, LoraPair, SERIAL, parse_config};
use crate::error::{LlmError, Result};
use crate::gguf::LlamaConfig;
use crate::weights::Target;

/// Each (layer, target)'s A and B, as found in the file.
type Found = BTreeMap<(usize, Target), [Option<Tensor>; 2]>;

impl LoraAdapter {
    /// The adapter in `config` and `weights`, its content digest left zero.
    pub(super) fn parse_peft(
        id: &str,
        config: &[u8],
        weights: &[u8],
        base: &LlamaConfig,
        precision: AdapterPrecision,
    ) -> Result<Self> {
        let cfg = parse_config(id, config)?;
        check_lineage(id, &cfg, base)?;
        let found = read_tensors(id, &cfg, weights, base)?;
        let mut layers: Vec<[Option<LoraPair>; 7]> =
            (0..base.n_layer).map(|_| Default::default()).collect();
        let mut bytes = 0u64;
        let mut max_rank = 0;
        for ((layer, target), [a, b]) in found {
            let (pair, rank) = make_pair(id, &cfg, base, (layer, target), a, b, precision)?;
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
}

/// Refuses an adapter made for another family, even when the shapes happen to agree.
fn check_lineage(id: &str, cfg: &AdapterConfig, base: &LlamaConfig) -> Result<()> {
    if let Some(name) = &cfg.base_model
        && let Some(arch) = architecture_named(name)
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
    Ok(())
}

/// Every LoRA tensor of `weights`, by layer and target: a fused module's A is every part's,
/// its B cut into the parts' rows. Refuses names that are not LoRA weights of a block's
/// projections, layers the base model lacks, and targets the config does not list.
fn read_tensors(
    id: &str,
    cfg: &AdapterConfig,
    weights: &[u8],
    base: &LlamaConfig,
) -> Result<Found> {
    let tensors = SafeTensors::deserialize(weights).map_err(|e| {
        LlmError::adapter(
            id,
            format!("{ADAPTER_WEIGHTS_FILE} is not a valid safetensors file: {e}"),
        )
    })?;
    let mut found = Found::new();
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
    Ok(found)
}

/// One module's pair: both matrices there with the shapes its rank (from `rank_pattern` or
/// `r`) needs on the base model, B transposed and scaled by alpha (from `alpha_pattern` or
/// `lora_alpha`) over the rank, q and k rows in the base model's order; and its rank.
fn make_pair(
    id: &str,
    cfg: &AdapterConfig,
    base: &LlamaConfig,
    (layer, target): (usize, Target),
    a: Option<Tensor>,
    b: Option<Tensor>,
    precision: AdapterPrecision,
) -> Result<(LoraPair, usize)> {
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
    Ok((pair, rank))
}

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
