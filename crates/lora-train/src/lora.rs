//! The adapters being trained: one pair of candle `Var`s (A, B) per layer and target module,
//! initialised as PEFT does, and saved as PEFT saves them (`adapter_config.json` and
//! `adapter_model.safetensors`), so the engine, vLLM or PEFT itself can load the result.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor, Var};
use modelmux_llm::{ADAPTER_CONFIG_FILE, ADAPTER_WEIGHTS_FILE, LlamaConfig};
use rand::{Rng, SeedableRng};

use crate::{Error, Result};

pub use modelmux_llm::Target;

/// The target named `name` in PEFT's terms (`q_proj`, ...), or an error listing the names.
pub fn target_named(name: &str) -> Result<Target> {
    Target::from_peft_name(name).ok_or_else(|| {
        let known: Vec<&str> = Target::ALL.iter().map(|t| t.peft_name()).collect();
        Error::Invalid(format!(
            "unknown target module `{name}`; known: {}",
            known.join(", ")
        ))
    })
}

/// `(in, out)` of `target`'s projection in `c`.
fn projection_shape(target: Target, c: &LlamaConfig) -> (usize, usize) {
    match target {
        Target::Q => (c.d_model, c.q_dim()),
        Target::K | Target::V => (c.d_model, c.kv_dim()),
        Target::O => (c.q_dim(), c.d_model),
        Target::Gate | Target::Up => (c.d_model, c.ffn_dim),
        Target::Down => (c.ffn_dim, c.d_model),
    }
}

/// The shape of the adapters: rank, alpha and targets.
#[derive(Clone, Debug)]
pub struct LoraShape {
    /// The rank r.
    pub rank: usize,
    /// `lora_alpha`: the delta is scaled by `alpha / r`.
    pub alpha: f64,
    /// The projections adapted, in every layer.
    pub targets: Vec<Target>,
}

/// A trainable adapter for every layer and target.
pub struct LoraSet {
    shape: LoraShape,
    /// `(layer, target)` → (A `[r, in]`, B `[out, r]`).
    pairs: HashMap<(usize, Target), (Var, Var)>,
}

impl LoraSet {
    /// An adapter that adds nothing: no targets.
    pub fn none() -> Self {
        Self {
            shape: LoraShape {
                rank: 1,
                alpha: 1.0,
                targets: Vec::new(),
            },
            pairs: HashMap::new(),
        }
    }

    /// New adapters as PEFT initialises them: A uniform in ±1/√in (Kaiming-uniform with
    /// a = √5), B zero, so training starts from the base model exactly.
    pub fn new(shape: LoraShape, config: &LlamaConfig, seed: u64) -> Result<Self> {
        if shape.rank == 0 || shape.targets.is_empty() {
            return Err(Error::Invalid(
                "an adapter needs a rank of at least 1 and a target".into(),
            ));
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut pairs = HashMap::new();
        for layer in 0..config.n_layer {
            for &target in &shape.targets {
                let (input, out) = projection_shape(target, config);
                let bound = 1.0 / (input as f32).sqrt();
                let a: Vec<f32> = (0..shape.rank * input)
                    .map(|_| rng.random_range(-bound..bound))
                    .collect();
                let a = Var::from_tensor(&Tensor::from_vec(a, (shape.rank, input), &Device::Cpu)?)?;
                let b = Var::zeros((out, shape.rank), DType::F32, &Device::Cpu)?;
                pairs.insert((layer, target), (a, b));
            }
        }
        Ok(Self { shape, pairs })
    }

    /// The trainable variables, in a fixed order.
    pub fn vars(&self) -> Vec<&Var> {
        let mut keys: Vec<_> = self.pairs.keys().copied().collect();
        keys.sort();
        keys.iter()
            .flat_map(|k| {
                let (a, b) = &self.pairs[k];
                [a, b]
            })
            .collect()
    }

    /// `scale · (x Aᵀ) Bᵀ` for `x` `[.., in]`, or `None` where `(layer, target)` is not adapted.
    pub fn delta(&self, layer: usize, target: Target, x: &Tensor) -> Result<Option<Tensor>> {
        let Some((a, b)) = self.pairs.get(&(layer, target)) else {
            return Ok(None);
        };
        let low = x.broadcast_matmul(&a.as_tensor().t()?)?;
        let delta = low.broadcast_matmul(&b.as_tensor().t()?)?;
        Ok(Some((delta * self.scale())?))
    }

    fn scale(&self) -> f64 {
        self.shape.alpha / self.shape.rank as f64
    }

    /// Writes `dir/adapter_config.json` and `dir/adapter_model.safetensors` (f16, as PEFT
    /// saves a half-precision adapter), B's q and k rows in Hugging Face's order.
    /// `base_model` is PEFT's `base_model_name_or_path`.
    pub fn save_peft(&self, dir: &Path, config: &LlamaConfig, base_model: &str) -> Result<()> {
        std::fs::create_dir_all(dir)?;
        let mut tensors = HashMap::new();
        for (&(layer, target), (a, b)) in &self.pairs {
            let prefix = format!(
                "base_model.model.model.layers.{layer}.{}.{}",
                target.peft_parent(),
                target.peft_name()
            );
            let b = match target {
                Target::Q => to_hf_rows(b.as_tensor(), config.n_head)?,
                Target::K => to_hf_rows(b.as_tensor(), config.n_kv_head)?,
                _ => b.as_tensor().clone(),
            };
            tensors.insert(
                format!("{prefix}.lora_A.weight"),
                a.as_tensor().to_dtype(DType::F16)?,
            );
            tensors.insert(format!("{prefix}.lora_B.weight"), b.to_dtype(DType::F16)?);
        }
        candle_core::safetensors::save(&tensors, dir.join(ADAPTER_WEIGHTS_FILE))?;
        let peft = serde_json::json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": base_model,
            "r": self.shape.rank,
            "lora_alpha": self.shape.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "use_rslora": false,
            "target_modules": self.shape.targets.iter().map(|t| t.peft_name()).collect::<Vec<_>>(),
        });
        std::fs::write(
            dir.join(ADAPTER_CONFIG_FILE),
            serde_json::to_vec_pretty(&peft)?,
        )?;
        Ok(())
    }
}

/// B `[out, r]` from GGUF's interleaved row order back to Hugging Face's: within each head,
/// GGUF row `2j + t` is Hugging Face row `t · half + j` (the inverse of llama.cpp's
/// converter, which the engine applies again when it loads the adapter).
fn to_hf_rows(b: &Tensor, heads: usize) -> Result<Tensor> {
    let (out, rank) = b.dims2()?;
    let head_dim = out / heads;
    Ok(b.reshape((heads, head_dim / 2, 2, rank))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape((out, rank))?)
}
